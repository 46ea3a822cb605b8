"""Hand-built operator graphs for cost-model tests (no importer needed).

`resnet(batch, blocks)` builds a torchvision-style bottleneck ResNet (conv/bn/relu/add/pool/linear
with the FLOP counts an importer records: 2 × multiply-accumulates), so calibration tests can run
whether or not `planner.ir.fx_import` exists.
"""

from __future__ import annotations

from autopar.planner.ir.graph import (WHOLE, AxisMap, DimKind, Op, OperatorGraph, ParamSpec, ParDim,
                                      TensorRef, TensorSpec, same)

NCHW = ("n", "c", "h", "w")


def _pardims(shape, *, param_c: bool) -> tuple[ParDim, ...]:
    n, c, h, w = shape
    return (ParDim("n", DimKind.SAMPLE, n), ParDim("c", DimKind.PARAMETER if param_c else DimKind.ATTRIBUTE, c),
            ParDim("h", DimKind.ATTRIBUTE, h), ParDim("w", DimKind.ATTRIBUTE, w))


def conv(name, src, in_shape, cout, k, stride, pad, *, dtype="float32") -> Op:
    n, cin, h, w = in_shape
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    out = (n, cout, ho, wo)
    flops = 2.0 * n * cout * ho * wo * cin * k * k
    win = dict(kernel=k, stride=stride, pad=pad)
    return Op(name, "conv2d", (TensorRef(src),),
              ((same("n"), WHOLE, AxisMap(dim="h", **win), AxisMap(dim="w", **win)),),
              (TensorSpec(out, NCHW, dtype),), _pardims(out, param_c=True),
              (ParamSpec(f"{name}.weight", (cout, cin, k, k), (cout, cin, k, k), (same("c"), WHOLE, WHOLE, WHOLE), dtype),),
              flops_fwd=flops, flops_bwd=2 * flops,
              attrs=(("kernel", (k, k)), ("padding", (pad, pad)), ("stride", (stride, stride))))


def pointwise(name, kind, srcs, shape, *, params=False, flops_per=1.0, dtype="float32") -> Op:
    c = shape[1]
    ps = ()
    if params:
        ps = tuple(ParamSpec(f"{name}.{p}", (c,), (c,), (same("c"),), dtype) for p in ("weight", "bias"))
    n = 1
    for s in shape:
        n *= s
    return Op(name, kind, tuple(TensorRef(s) for s in srcs),
              tuple((same("n"), same("c"), same("h"), same("w")) for _ in srcs),
              (TensorSpec(shape, NCHW, dtype),), _pardims(shape, param_c=params), ps,
              flops_fwd=flops_per * n, flops_bwd=flops_per * n)


def pool(name, kind, src, in_shape, k, stride, pad) -> Op:
    n, c, h, w = in_shape
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    out = (n, c, ho, wo)
    win = dict(kernel=k, stride=stride, pad=pad)
    return Op(name, kind, (TensorRef(src),), ((same("n"), same("c"), AxisMap(dim="h", **win), AxisMap(dim="w", **win)),),
              (TensorSpec(out, NCHW),), _pardims(out, param_c=False),
              flops_fwd=float(n * c * ho * wo * k * k), attrs=(("kernel", k), ("stride", stride)))


def linear(name, src, batch, fin, fout, *, dtype="float32") -> Op:
    return Op(name, "linear", (TensorRef(src),), ((same("n"), WHOLE),), (TensorSpec((batch, fout), ("n", "f"), dtype),),
              (ParDim("n", DimKind.SAMPLE, batch), ParDim("f", DimKind.PARAMETER, fout)),
              (ParamSpec(f"{name}.weight", (fout, fin), (fout, fin), (same("f"), WHOLE), dtype),
               ParamSpec(f"{name}.bias", (fout,), (fout,), (same("f"),), dtype)),
              flops_fwd=2.0 * batch * fin * fout, flops_bwd=4.0 * batch * fin * fout)


def resnet(batch: int, blocks=(3, 4, 23, 3), image: int = 224, classes: int = 1000) -> OperatorGraph:
    """Bottleneck ResNet; (3, 4, 23, 3) is ResNet-101, (3, 4, 6, 3) is ResNet-50."""
    ops: list[Op] = [Op("x", "input", (), (), (TensorSpec((batch, 3, image, image), NCHW),),
                        (ParDim("n", DimKind.SAMPLE, batch),))]

    def cbr(prefix, src, shape, cout, k, stride, pad, relu=True):
        c = conv(f"{prefix}.conv", src, shape, cout, k, stride, pad)
        ops.append(c)
        s = c.output.shape
        ops.append(pointwise(f"{prefix}.bn", "batch_norm", [c.name], s, params=True, flops_per=5.0))
        last = f"{prefix}.bn"
        if relu:
            ops.append(pointwise(f"{prefix}.relu", "relu", [last], s))
            last = f"{prefix}.relu"
        return last, s

    cur, shape = cbr("stem", "x", (batch, 3, image, image), 64, 7, 2, 3)
    mp = pool("maxpool", "max_pool2d", cur, shape, 3, 2, 1)
    ops.append(mp)
    cur, shape = mp.name, mp.output.shape
    width = 64
    for stage, nblocks in enumerate(blocks):
        for b in range(nblocks):
            stride = 2 if (b == 0 and stage > 0) else 1
            p = f"layer{stage + 1}.{b}"
            a, s1 = cbr(f"{p}.a", cur, shape, width, 1, 1, 0)
            bb, s2 = cbr(f"{p}.b", a, s1, width, 3, stride, 1)
            c, s3 = cbr(f"{p}.c", bb, s2, width * 4, 1, 1, 0, relu=False)
            skip = cur
            if b == 0:
                skip, _ = cbr(f"{p}.down", cur, shape, width * 4, 1, stride, 0, relu=False)
            ops.append(pointwise(f"{p}.add", "add", [c, skip], s3))
            ops.append(pointwise(f"{p}.relu", "relu", [f"{p}.add"], s3))
            cur, shape = f"{p}.relu", s3
        width *= 2
    n, ch, h, w = shape
    ap = pool("avgpool", "adaptive_avg_pool2d", cur, shape, h, h, 0)
    ops.append(ap)
    ops.append(Op("flatten", "flatten", (TensorRef(ap.name),), ((same("n"), WHOLE, WHOLE, WHOLE),),
                  (TensorSpec((n, ch), ("n", "f")),), (ParDim("n", DimKind.SAMPLE, n),)))
    ops.append(linear("fc", "flatten", n, ch, classes))
    return OperatorGraph(f"resnet{sum(blocks) * 3 + 2}", tuple(ops), batch)
