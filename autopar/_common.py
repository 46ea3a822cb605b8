"""What several commands share: resolving `--model`, `--topology` and `--strategy`, and output."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autopar.planner.errors import AutoparError
from autopar.planner.hardware import DeviceTopology

if TYPE_CHECKING:   # planner.ir imports torch: not at start-up of every command (`autopar operator run`)
    from autopar.planner.ir import OperatorGraph, Strategy

_FLOATS = ("float64", "float32", "float16", "bfloat16")


@dataclass
class Problem:
    """A model imported as an operator graph, a topology and a cost model bound to both."""

    spec: Any  # planner.zoo.ModelSpec
    graph: OperatorGraph
    topology: DeviceTopology
    cost: Any  # planner.cost.CostModel
    profile_path: Path | None


def add_model_args(p, *, topology: bool = True, dtype: bool | None = None) -> None:
    """--model, --model-opt, --topology (unless `topology` is False), --profile-cache, --json, and
    --dtype when `dtype` is true.  By default (None) only ``autopar plan`` and ``autopar simulate``
    get --dtype: ``train`` has its own (trainer.add_train_args) and ``profile`` measures the
    model's own dtype."""
    if dtype is None:
        dtype = str(getattr(p, "prog", "")).split()[-1:] in (["plan"], ["simulate"])
    p.add_argument("--model", "-m", required=True, metavar="M",
                   help="zoo model (lenet, alexnet, vgg16, inception_v3, resnet101, rnntc, rnnlm, nmt, "
                        "transformer) or module.path:factory returning a ModelSpec")
    p.add_argument("--model-opt", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="model size option, repeatable (e.g. -o batch=32 -o hidden=512); "
                        "`autopar models` lists each model's options")
    if topology:
        p.add_argument("--topology", "-t", required=True, metavar="T",
                       help="preset (p100-4x4, k80-16x4, p100-1x4, dgx-a100x2, dgx-h100, local:4, …; "
                            "`autopar topologies` lists them) or a topology YAML/JSON file")
    if dtype:
        p.add_argument("--dtype", choices=_FLOATS, default=None,
                       help="plan for the model converted to this float dtype, as `autopar train --dtype` trains "
                            "it (default: the model's own); a plan is only valid for the dtype it was made for")
    p.add_argument("--profile-cache", metavar="FILE", default=None,
                   help="measured op times (default: $AUTOPAR_CACHE_DIR or ~/.cache/autopar/profile.json); "
                        "ops not in it are estimated with the analytic roofline model")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def load_problem(args) -> Problem:
    from autopar.planner.cost import CostModel, ProfileCache, default_cache_path
    from autopar.planner.hardware import resolve_topology
    from autopar.planner.ir import import_spec
    from autopar.planner.zoo import parse_options, with_dtype

    spec = with_dtype(load_model_for_planning(args.model, **parse_options(args.model_opt)),
                      getattr(args, "dtype", None))
    graph = import_spec(spec)
    topo = resolve_topology(args.topology)
    path = Path(args.profile_cache) if args.profile_cache else default_cache_path()
    cache = ProfileCache.load(path)
    if cache.notice:
        print(f"autopar: {cache.notice}; run `autopar profile`", file=sys.stderr)
    return Problem(spec, graph, topo, CostModel(cache).bind(graph), path)


def load_model_for_planning(name: str, **options):
    """Build a model on the meta device: planning needs shapes, not weights, so a 134M-parameter
    NMT costs nothing to build (the importer propagates shapes with fake tensors)."""
    import torch

    from autopar.planner.zoo import load_model
    with torch.device("meta"):
        return load_model(name, **options)


def resolve_strategy(name_or_file: str, problem: Problem) -> Strategy:
    from autopar.planner.search import list_named, named_strategy

    if name_or_file in list_named():
        return named_strategy(name_or_file, problem.graph, problem.topology)
    path = Path(name_or_file)
    if not path.exists():
        raise AutoparError(f"--strategy {name_or_file!r} is neither a named strategy "
                           f"({', '.join(list_named())}) nor an existing plan file")
    from autopar.planner.plan_file import load_plan
    return load_plan(path, problem.graph, problem.topology, model_options=problem.spec.options)


def warn(message: str) -> None:
    """A warning line on stderr (the run goes on)."""
    print(f"autopar: warning: {message}", file=sys.stderr, flush=True)


def warn_notes(strategy: Strategy) -> None:
    """Print what a strategy records about itself that a user should know (`Strategy.notes`)."""
    for note in getattr(strategy, "notes", ()):
        warn(note)


def emit_json(doc: dict[str, Any]) -> None:
    json.dump(doc, sys.stdout, indent=2, sort_keys=False, default=_jsonable)
    sys.stdout.write("\n")


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, frozenset, tuple)):
        return list(x)
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "—"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"
