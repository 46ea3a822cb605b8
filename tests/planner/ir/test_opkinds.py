"""Op kinds: each torch call becomes the op kind of planner/README.md with FlexFlow's parallel dims
(sample / attribute / parameter) and axis maps that name exactly the data a task needs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.planner.ir.fx_import import import_model
from autopar.planner.ir.graph import WHOLE, AxisMap, DimKind, TensorSpec
from autopar.planner.ir.opkinds import KINDS

S, A, P = DimKind.SAMPLE, DimKind.ATTRIBUTE, DimKind.PARAMETER
IMG = TensorSpec((8, 4, 12, 12), ("n", "c", "h", "w"))
SEQ = TensorSpec((8, 6, 16), ("n", "l", "c"))
TOK = TensorSpec((8, 6), ("n", "l"), "int64")


class Call(nn.Module):
    """Wraps a function of the input(s) as a model."""

    def __init__(self, fn, **members) -> None:
        super().__init__()
        self.fn = fn
        for k, m in members.items():
            if isinstance(m, nn.Parameter):
                self.register_parameter(k, m)
            else:
                self.add_module(k, m)

    def forward(self, x):
        return self.fn(self, x)


def only_op(module, spec=IMG, kind=None):
    graph = import_model(module, [("x", spec)], loss=None)
    ops = [op for op in graph.ops if op.kind != "input"]
    if kind is not None:
        ops = [op for op in ops if op.kind == kind]
    assert len(ops) == 1, [(op.name, op.kind) for op in graph.ops]
    return ops[0]


def dims(op):
    return [(p.name, p.kind, p.size, p.granule) for p in op.pardims]


# (id, module, input spec, kind, parallel dims (name, kind, size, granule))
CASES = [
    ("linear", nn.Linear(16, 10), SEQ, "linear", [("n", S, 8, 1), ("l", A, 6, 1), ("c", P, 10, 1)]),
    ("conv2d", nn.Conv2d(4, 6, 3, padding=1), IMG, "conv2d", [("n", S, 8, 1), ("c", P, 6, 1), ("h", A, 12, 1), ("w", A, 12, 1)]),
    ("grouped conv: channels whole", nn.Conv2d(4, 6, 3, groups=2), IMG, "conv2d",
     [("n", S, 8, 1), ("h", A, 10, 1), ("w", A, 10, 1)]),
    ("reflect padding: spatial whole", nn.Conv2d(4, 6, 3, padding=1, padding_mode="reflect"), IMG, "conv2d",
     [("n", S, 8, 1), ("c", P, 6, 1)]),
    ("conv1d", nn.Conv1d(6, 4, 3), SEQ, "conv1d", [("n", S, 8, 1), ("l", P, 4, 1), ("c", A, 14, 1)]),
    ("max pool", nn.MaxPool2d(2), IMG, "pool", [("n", S, 8, 1), ("c", A, 4, 1), ("h", A, 6, 1), ("w", A, 6, 1)]),
    ("global avg pool", nn.AdaptiveAvgPool2d(1), IMG, "pool", [("n", S, 8, 1), ("c", A, 4, 1)]),
    ("adaptive pool not exact", nn.AdaptiveAvgPool2d(5), IMG, "pool", [("n", S, 8, 1), ("c", A, 4, 1)]),
    ("batch norm", nn.BatchNorm2d(4), IMG, "batch_norm", [("n", S, 8, 1), ("c", P, 4, 1), ("h", A, 12, 1), ("w", A, 12, 1)]),
    ("batch norm without affine", nn.BatchNorm2d(4, affine=False), IMG, "batch_norm",
     [("n", S, 8, 1), ("c", A, 4, 1), ("h", A, 12, 1), ("w", A, 12, 1)]),
    ("layer norm", nn.LayerNorm(16), SEQ, "layer_norm", [("n", S, 8, 1), ("l", A, 6, 1)]),
    ("embedding", nn.Embedding(50, 10), TOK, "embedding", [("n", S, 8, 1), ("l", A, 6, 1), ("e", P, 10, 1)]),
    ("softmax", nn.Softmax(dim=1), SEQ, "softmax", [("n", S, 8, 1), ("c", A, 16, 1)]),
    ("log softmax", Call(lambda s, x: F.log_softmax(x, -1)), SEQ, "log_softmax", [("n", S, 8, 1), ("l", A, 6, 1)]),
    ("gelu", nn.GELU(), SEQ, "elementwise", [("n", S, 8, 1), ("l", A, 6, 1), ("c", A, 16, 1)]),
    ("add a parameter: its axis is a parameter dim", Call(lambda s, x: x + s.b, b=nn.Parameter(torch.zeros(16))),
     SEQ, "elementwise", [("n", S, 8, 1), ("l", A, 6, 1), ("c", P, 16, 1)]),
    ("mean over l", Call(lambda s, x: x.mean(1)), SEQ, "reduce", [("n", S, 8, 1), ("c", A, 16, 1)]),
    ("bmm", Call(lambda s, x: torch.bmm(x, x.transpose(1, 2))), SEQ, "matmul",
     [("n", S, 8, 1), ("l", A, 6, 1), ("l2", A, 6, 1)]),
    ("transpose", Call(lambda s, x: x.transpose(1, 2)), SEQ, "permute", [("n", S, 8, 1), ("c", A, 16, 1), ("l", A, 6, 1)]),
    ("flatten", nn.Flatten(), SEQ, "reshape", [("n", S, 8, 1)]),
    ("split heads", Call(lambda s, x: x.view(8, 6, 4, 4)), SEQ, "reshape",
     [("n", S, 8, 1), ("l", A, 6, 1), ("c", A, 4, 1)]),
    ("slice", Call(lambda s, x: x[:, 1:5, ::2]), SEQ, "slice", [("n", S, 8, 1), ("l", A, 4, 1), ("c", A, 8, 1)]),
    ("select", Call(lambda s, x: x[:, -1]), SEQ, "slice", [("n", S, 8, 1), ("c", A, 16, 1)]),
    ("expand", Call(lambda s, x: x[:, None].expand(8, 3, 6, 16)), SEQ, "expand",
     [("n", S, 8, 1), ("u", A, 3, 1), ("l", A, 6, 1), ("c", A, 16, 1)]),
    ("cumsum: opaque, batch-first", Call(lambda s, x: torch.cumsum(x, 1)), SEQ, "opaque", [("n", S, 8, 1)]),
    ("opaque sized by the batch: whole", Call(lambda s, x: torch.roll(x, x.size(0) // 4, 2)), SEQ, "opaque", []),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_calls_become_their_kind_with_flexflow_dims(case):
    _, module, spec, kind, want = case
    assert dims(only_op(module, spec, kind)) == want


def test_conv_reads_halo_windows_and_weight_rows():
    op = only_op(nn.Conv2d(4, 6, (3, 5), stride=2, padding=(1, 2), dilation=(1, 2)))
    n, cin, h, w = op.input_maps[0]
    assert (n, cin) == (AxisMap(dim="n"), WHOLE)
    assert h == AxisMap(dim="h", kernel=3, stride=2, pad=1, dilation=1)
    assert w == AxisMap(dim="w", kernel=5, stride=2, pad=2, dilation=2)
    weight, bias = op.params
    assert weight.maps == (AxisMap(dim="c"), WHOLE, WHOLE, WHOLE) and bias.maps == (AxisMap(dim="c"),)


@pytest.mark.parametrize("cin,cout,groups,block", [(4, 4, 4, 1), (8, 4, 4, 2)])
def test_one_group_per_output_channel_reads_its_input_channel_block(cin, cout, groups, block):
    op = only_op(nn.Conv2d(cin, cout, 3, groups=groups, padding=1), TensorSpec((8, cin, 12, 12), ("n", "c", "h", "w")))
    assert op.input_maps[0][1] == AxisMap(dim="c", kernel=block, stride=block)
    assert op.pardim("c").kind is P


def test_lstm_cell_views_gates_and_reads_its_slice_of_c():
    cell = nn.LSTMCell(6, 8)
    model = Call(lambda s, x: s.cell(x, (x.new_zeros(8, 8), x.new_zeros(8, 8)))[1], cell=cell)
    op = only_op(model, TensorSpec((8, 6), ("n", "c")), kind="lstm_cell")
    assert dims(op) == [("n", S, 8, 1), ("h", P, 8, 1)]
    assert len(op.outputs) == 2
    x_map, h_map, c_map = op.input_maps
    assert x_map == h_map == (AxisMap(dim="n"), WHOLE) and c_map == (AxisMap(dim="n"), AxisMap(dim="h"))
    views = {p.name.split(".")[-1]: (p.view, p.maps) for p in op.params}
    assert views["weight_ih"] == ((4, 8, 6), (WHOLE, AxisMap(dim="h"), WHOLE))
    assert views["bias_hh"] == ((4, 8), (WHOLE, AxisMap(dim="h")))


def test_multihead_attention_is_an_attention_op_split_by_whole_heads_then_out_proj():
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    graph = import_model(Call(lambda s, x: s.mha(x, x, x, need_weights=False)[0], mha=mha), [("x", SEQ)], loss=None)
    attn, proj = graph.ops[1:]
    assert (attn.kind, proj.kind, proj.name) == ("attention", "linear", f"{attn.name}.out_proj")
    assert dims(attn) == [("n", S, 8, 1), ("l", A, 6, 1), ("c", P, 16, 4)]
    assert attn.pardim("c").allowed_degrees() == (1, 2, 4)
    q, k, v = attn.input_maps
    assert q == (AxisMap(dim="n"), AxisMap(dim="l"), WHOLE) and k == v == (AxisMap(dim="n"), WHOLE, WHOLE)
    w, b = attn.params
    assert (w.view, w.maps) == ((3, 16, 16), (WHOLE, AxisMap(dim="c"), WHOLE))
    assert (b.view, b.maps) == ((3, 16), (WHOLE, AxisMap(dim="c")))


def test_concat_shifts_each_input_to_its_offset():
    op = only_op(Call(lambda s, x: torch.cat([x, x[:, :2], x], dim=1)), SEQ, kind="concat")
    shifts = [maps[1] for maps in op.input_maps]
    assert shifts == [AxisMap(dim="l", shift=0), AxisMap(dim="l", shift=-6), AxisMap(dim="l", shift=-8)]
    assert op.input_box(1, {"l": (0, 7)}, (8, 2, 16))[1] == (0, 1)     # reads 1 row of the 2-row piece
    assert op.input_box(2, {"l": (0, 7)}, (8, 6, 16))[1] == (0, 0)     # does not read the third piece


def test_reshape_splits_read_blocks_and_merges_read_whole():
    split = only_op(Call(lambda s, x: x.view(8, 6, 4, 4)), SEQ)
    assert split.input_maps[0] == (AxisMap(dim="n"), AxisMap(dim="l"), AxisMap(dim="c", kernel=4, stride=4))
    merge = only_op(Call(lambda s, x: x.reshape(48, 16)), SEQ)
    assert merge.input_maps[0] == (WHOLE, WHOLE, AxisMap(dim="c")) and dims(merge) == [("c", A, 16, 1)]


def test_slices_read_fixed_and_strided_ranges():
    op = only_op(Call(lambda s, x: x[:, 2, 1::3]), SEQ)
    assert op.input_maps[0] == (AxisMap(dim="n"), AxisMap(lo=2, hi=3), AxisMap(dim="c", stride=3, shift=1))


def test_flops_count_macs_twice_and_backward_doubles_with_parameters():
    lin = only_op(nn.Linear(16, 10), SEQ)
    assert lin.flops_fwd == 2 * 8 * 6 * 16 * 10 + 8 * 6 * 10
    assert lin.flops_bwd == 2 * lin.flops_fwd
    conv = only_op(nn.Conv2d(4, 6, 3, padding=1, bias=False))
    assert conv.flops_fwd == 2 * (8 * 6 * 12 * 12) * 4 * 9
    relu = only_op(nn.ReLU())
    assert relu.flops_fwd == 8 * 4 * 12 * 12 and relu.flops_bwd == relu.flops_fwd
    assert relu.bytes_fwd == 2 * 8 * 4 * 12 * 12 * 4 and relu.bytes_bwd == 2 * relu.bytes_fwd


def test_every_kind_is_in_the_readme_table():
    readme = (Path(__file__).parents[3] / "planner" / "README.md").read_text()
    rows = set(re.findall(r"^\| `([a-z_0-9]+)`(?:, `([a-z_0-9]+)`)?", readme, re.M))
    documented = {k for row in rows for k in row if k}
    assert set(KINDS) == documented


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 40), kernel=st.integers(1, 7), stride=st.integers(1, 4), pad=st.integers(0, 4),
       dilation=st.integers(1, 3), data=st.data())
def test_window_map_is_the_clipped_hull_of_the_receptive_field(size, kernel, stride, pad, dilation, data):
    """The halo box holds every input the outputs [a, b) read; when windows have no gaps (no
    dilation, stride <= kernel) it holds nothing else.

    (With gaps — dilation, or stride > kernel — a clipped end may fall in a gap: the box is the
    clipped hull of the windows, a few elements more at a border.)
    """
    out_size = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    if out_size < 1:
        return
    a = data.draw(st.integers(0, out_size - 1))
    b = data.draw(st.integers(a + 1, out_size))
    m = AxisMap(dim="h", kernel=kernel, stride=stride, pad=pad, dilation=dilation)
    field = {o * stride - pad + j * dilation for o in range(a, b) for j in range(kernel)}
    inside = sorted(i for i in field if 0 <= i < size)
    lo, hi = m.map((a, b), size)
    assert all(lo <= i < hi for i in inside)
    clipped = (max(min(field), 0), min(max(field) + 1, size))
    assert (lo, hi) == clipped if clipped[1] > clipped[0] else lo == hi
    if dilation == 1 and (kernel >= stride or b - a == 1):      # no gaps between taps or windows
        assert (lo, hi) == ((inside[0], inside[-1] + 1) if inside else (lo, lo))


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5), data=st.data())
def test_concat_shift_maps_cover_a_range_exactly_once(sizes, data):
    total = sum(sizes)
    a = data.draw(st.integers(0, total - 1))
    b = data.draw(st.integers(a + 1, total))
    covered, off = 0, 0
    for s in sizes:
        lo, hi = AxisMap(dim="l", shift=-off).map((a, b), s)
        want = (max(a - off, 0), min(b - off, s))
        assert (lo, hi) == want if want[1] > want[0] else lo == hi
        covered += hi - lo
        off += s
    assert covered == b - a
