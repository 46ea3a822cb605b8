"""The importer: any nn.Module becomes an OperatorGraph (torch.fx + fake tensors), ops are named after
fx nodes and point at the model's source lines, shared modules share parameters, and models that
cannot be traced fail with a message that names the node, the line and what to do."""

from __future__ import annotations

import json
import operator
import subprocess
import sys
import textwrap
from collections import Counter

import pytest
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from autopar.planner.errors import GraphImportError
from autopar.planner.ir.fx_import import import_model, import_spec
from autopar.planner.ir.graph import DimKind, TensorRef, TensorSpec
from autopar.planner.ir.kernels import run_graph
from autopar.planner.ir.opkinds import KINDS
from autopar.planner.ir.strategy import data_parallel
from autopar.planner.zoo import get_model, list_models

from ..zoo.test_zoo import TINY
from ._fx_models import ConvNet2d, example

torch.set_num_threads(1)
X = [("x", TensorSpec((4, 6), ("n", "c"), "float64"))]
Y = ("y", TensorSpec((4,), ("n",), "int64"))


@pytest.mark.parametrize("name", list_models())
def test_every_zoo_model_imports_ending_in_its_loss(name):
    spec = get_model(name, **TINY[name][0])
    graph = import_spec(spec)
    assert graph.ops[-1].kind == "cross_entropy" and graph.ops[-1].name == "loss"
    assert [op.name for op in graph.ops if op.kind == "input"] == [n for n, _ in spec.inputs] + [spec.target[0]]
    assert {op.kind for op in graph.ops} <= set(KINDS)
    assert "opaque" not in {op.kind for op in graph.ops}
    assert graph.batch_size == spec.batch_size
    assert graph.num_params == sum(p.numel() for p in spec.module.parameters())


def test_op_names_are_fx_node_names_and_stable():
    module, inputs, target, _, _ = example("attentions")
    first, second = (import_model(module, inputs, target) for _ in range(2))
    assert [op.name for op in first.ops] == [op.name for op in second.ops]
    fx_names = {n.name for n in torch.fx.symbolic_trace(module).graph.nodes}
    for op in first.ops:
        base = op.name.split(".")[0]       # derived ops: <node>.out_proj, <split node>.<k>
        assert base in fx_names or op.name in {"tokens", "pad", "labels", "loss"}, op.name


def test_targets_and_source_lines_point_at_the_model_code():
    module, inputs, target, _, _ = example("convnet2d")
    graph = import_model(module, inputs, target)
    conv = graph["c1"]
    assert conv.target == "nn.Conv2d c1"
    path, line = conv.source.rsplit(":", 1)
    assert path.endswith("_fx_models.py")
    assert "self.c1(x)" in open(path).read().splitlines()[int(line) - 1]
    assert graph["relu"].target == "F.relu"


def test_dim_names_follow_the_axes_they_come_from():
    module, inputs, target, _, _ = example("recurrent")
    graph = import_model(module, inputs, target)
    assert graph["emb"].output.dims == ("n", "l", "e")
    cell = next(op for op in graph.ops if op.kind == "lstm_cell")
    assert [o.dims for o in cell.outputs] == [("n", "h"), ("n", "h")]
    conv = import_model(ConvNet2d(), [("x", TensorSpec((2, 3, 24, 24), ("n", "c", "h", "w")))], loss=None)["c1"]
    assert conv.output.dims == ("n", "c", "h", "w") and conv.pardim("n").kind is DimKind.SAMPLE


def test_tuple_outputs_are_multi_output_ops_read_by_index():
    module, inputs, target, _, _ = example("recurrent")
    graph = import_model(module, inputs, target)
    cells = [op for op in graph.ops if op.kind == "lstm_cell"]
    assert all(len(op.outputs) == 2 for op in cells)
    # the next step reads h (output 0) and c (output 1) of the previous one
    assert set(cells[1].inputs[1:]) == {TensorRef(cells[0].name, 0), TensorRef(cells[0].name, 1)}


def test_metadata_and_identities_are_not_ops():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)
            self.drop = nn.Dropout(0.0)
            self.ident = nn.Identity()

        def forward(self, x):
            n = x.size(0)
            y = self.ident(x.contiguous().view(n, -1).double().to(x.device))
            y = F.dropout(self.drop(y), 0.3, training=False)
            return self.fc(y.clone()).view(x.shape[0], 3)

    graph = import_model(M(), X, Y)
    assert [op.kind for op in graph.ops] == ["input", "reshape", "linear", "reshape", "input", "cross_entropy"]


def test_calls_of_one_module_share_its_parameters():
    spec = get_model("rnnlm", **TINY["rnnlm"][0])
    graph = import_spec(spec)
    steps = TINY["rnnlm"][0]["steps"]
    assert graph.param_users["cells.0.weight_ih"] == tuple(op.name for op in graph.ops
                                                            if op.kind == "lstm_cell" and op.target.endswith("cells.0"))
    assert len(graph.param_users["cells.0.weight_ih"]) == steps
    assert len(graph.param_users["decoder.weight"]) == steps


def test_tied_weights_are_one_parameter():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 6)
            self.head = nn.Linear(6, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, tokens):
            return self.head(self.emb(tokens))

    graph = import_model(Tied(), [("tokens", TensorSpec((2, 3), ("n", "l"), "int64"))],
                         ("labels", TensorSpec((2, 3), ("n", "l"), "int64")))
    assert graph.param_users == {"emb.weight": ("emb", "head")}


@pytest.mark.slow
def test_paper_scale_models_import_from_meta_modules_without_real_memory():
    """Inception-v3 at batch 64, NMT with 40 steps, GPT-2 small at batch 64 x 1024: activations of
    gigabytes, none allocated."""
    script = textwrap.dedent("""
        import json, resource, torch
        from collections import Counter
        from autopar.planner.ir.fx_import import import_spec
        from autopar.planner.zoo import get_model
        out = {}
        for name in ("inception_v3", "nmt", "transformer"):
            with torch.device("meta"):
                spec = get_model(name)
            g = import_spec(spec)
            out[name] = {"kinds": Counter(op.kind for op in g.ops), "batch": g.batch_size,
                         "users": {k: len(v) for k, v in g.param_users.items()},
                         "act_bytes": sum(o.nbytes for op in g.ops for o in op.outputs)}
        out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(out))
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    inc, nmt, gpt = out["inception_v3"], out["nmt"], out["transformer"]
    assert inc["batch"] == 64
    assert (inc["kinds"]["conv2d"], inc["kinds"]["batch_norm"], inc["kinds"]["concat"]) == (94, 94, 15)
    assert nmt["kinds"]["lstm_cell"] == 4 * 40        # 2 encoder + 2 decoder layers, 40 steps each
    lstm_params = {k: v for k, v in nmt["users"].items() if k.startswith(("encoder.", "decoder."))}
    assert len(lstm_params) == 16 and set(lstm_params.values()) == {40}
    # per block: attention (+ its out_proj linear) and the two MLP linears; then the LM head
    assert gpt["batch"] == 64 and gpt["kinds"]["attention"] == 12 and gpt["kinds"]["linear"] == 12 * 3 + 1
    assert inc["act_bytes"] > 4 * 2**30 and gpt["act_bytes"] > 32 * 2**30    # what a real forward would hold
    assert out["maxrss_mb"] < 2048


def test_meta_device_models_import_like_real_ones():
    with torch.device("meta"):
        meta = get_model("lenet", **TINY["lenet"][0])
    real = get_model("lenet", **TINY["lenet"][0])
    assert import_spec(meta).fingerprint == import_spec(real).fingerprint


def test_loss_none_keeps_the_model_outputs():
    graph = import_model(nn.Sequential(nn.Linear(6, 3), nn.Tanh()), X, loss=None)
    assert dict(graph.meta)["outputs"] == ((graph.ops[-1].name, 0),)
    assert "cross_entropy" not in {op.kind for op in graph.ops}


# -- errors ----------------------------------------------------------------------------------------

class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        if x.sum() > 0:
            x = x * 2
        return self.fc(x)


class RowLoop(nn.Module):
    def forward(self, x):
        return torch.stack([row.flip(0) for row in x])


class WithRowLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.loop = RowLoop()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(self.loop(x))


def test_data_dependent_branch_names_node_line_and_advice():
    with pytest.raises(GraphImportError) as err:
        import_model(Branchy(), X, Y)
    msg = str(err.value)
    assert "traced tensor gt (operator.gt)" in msg
    assert "test_fx_import.py:" in msg and "if x.sum() > 0:" in msg
    assert "torch.where" in msg


def test_untraceable_submodule_suggests_leaf_modules_and_imports_as_opaque_when_marked():
    with pytest.raises(GraphImportError, match=r"leaf_modules=\(RowLoop,\)"):
        import_model(WithRowLoop(), X, Y)
    module = WithRowLoop().double()
    graph = import_model(module, X, Y, leaf_modules=(RowLoop,))
    loop = graph["loop"]
    assert loop.kind == "opaque" and loop.target == "RowLoop loop" and [p.name for p in loop.pardims] == ["n"]
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.randint(0, 3, (4,))
    got = run_graph(graph, module, [x], y, {"loop": (4,)})["loss"][0]
    assert abs(got - F.cross_entropy(module(x), y)).item() < 1e-12


def test_shape_errors_name_the_node_and_line():
    with pytest.raises(GraphImportError, match=r"shape propagation failed at node fc \(nn.Linear fc\) at .*test_fx_import"):
        import_model(WithRowLoop(), [("x", TensorSpec((4, 5), ("n", "c")))], Y, leaf_modules=(RowLoop,))


def test_reading_a_tensor_after_an_in_place_change_is_refused():
    class Mutate(nn.Module):
        def forward(self, x):
            y = x * 1
            z = y.mul_(2)
            return z + y[:, :1]

    with pytest.raises(GraphImportError, match="modifies mul in place"):
        import_model(Mutate(), X, loss=None)


def test_unknown_op_becomes_opaque_and_still_plans():
    class Cum(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, x):
            return self.fc(torch.cumsum(x, dim=1).sin())

    module = Cum().double()
    graph = import_model(module, X, Y)
    cum = graph["cumsum"]
    assert cum.kind == "opaque" and [p.name for p in cum.pardims] == ["n"]
    strategy = data_parallel(graph, 4)
    strategy.validate(graph, 4)
    assert strategy["cumsum"].degrees == (4,)
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.randint(0, 3, (4,))
    degrees = {name: cfg.degrees for name, cfg in strategy.items()}
    got = run_graph(graph, module, [x], y, degrees)["loss"][0]
    assert abs(got - F.cross_entropy(module(x), y)).item() < 1e-12


@pytest.mark.parametrize("bad, match", [
    (dict(inputs=[]), "no inputs"),
    (dict(target=None), "needs a target"),
    (dict(loss="mse"), "unknown loss"),
    (dict(inputs=[("x", TensorSpec((4, 6), ("n", "n")))]), "repeated dim names"),
    (dict(inputs=X + [("x2", TensorSpec((4, 6), ("n", "c")))]), "inputs given but"),
    (dict(inputs=X + X), "repeat"),
])
def test_bad_arguments_are_explained(bad, match):
    args = dict(module=nn.Linear(6, 3), inputs=X, target=Y, loss="cross_entropy") | bad
    with pytest.raises(GraphImportError, match=match):
        import_model(**args)


def test_model_returning_a_tuple_needs_loss_none():
    class Two(nn.Module):
        def forward(self, x):
            return x, x

    with pytest.raises(GraphImportError, match="loss=None"):
        import_model(Two(), X, Y)
    assert Counter(op.kind for op in import_model(Two(), X, loss=None).ops) == {"input": 1}


def test_in_place_calls_become_functional_ops_with_the_same_values_and_gradients():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)
            self.act = nn.ReLU(inplace=True)
            self.out = nn.Linear(6, 3)

        def forward(self, x):
            y = self.act(self.fc(x)) * 1.0  # module with inplace=True: the kernel works on a copy
            y = y.mul_(2.0)                # method: rewritten to Tensor.mul
            y += 1.0                       # fx records operator.add
            return self.out(F.relu(y, inplace=True))

    module = InPlace().double()
    graph = import_model(module, X, Y)
    kinds = {op.name: (op.kind, op.attr("mutates"), op.attr("fn")) for op in graph.ops}
    assert kinds["act"][:2] == ("elementwise", True)
    assert kinds["mul_"][2] == "mul" and kinds["add"][2] is operator.add and kinds["relu"][1] is False
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.randint(0, 3, (4,))
    ref = F.cross_entropy(module(x.clone()), y)
    want = torch.autograd.grad(ref, list(module.parameters()))
    loss = run_graph(graph, module, [x], y, {op.name: (2,) + (1,) * (len(op.pardims) - 1) for op in graph.ops})["loss"][0]
    got = torch.autograd.grad(loss, list(module.parameters()))
    assert abs(loss - ref).item() < 1e-12
    assert all((g - w).abs().max().item() < 1e-12 for g, w in zip(got, want))
