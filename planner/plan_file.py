"""Plan files: a strategy written down for a user to read, edit, validate and simulate.

    save_plan(result, "plan.yaml", graph, topology)      # a PlanResult or a Strategy
    strategy = load_plan("plan.yaml", graph, topology)   # refuses plans for another graph/topology

Format (YAML for ``.yaml``/``.yml``, JSON otherwise), validated with pydantic at the boundary::

    apiVersion: autopar.dev/v1alpha1
    kind: Strategy
    metadata: {name: plan}
    graph: {name: nmt, fingerprint: "sha256:…", ops: 652}
    topology: {name: p100-4x4, fingerprint: "sha256:…", devices: 16}
    predicted: {stepSeconds: 0.0123, baselines: {data-parallel: 0.0201, …}, peakMemoryBytes: {0: …}}
    search: {seconds: 61.2, budgetSeconds: 60, seed: 0, starts: [data-parallel, …]}
    ops:
      - {op: encoder_0, degrees: {n: 4, h: 4}, devices: [0, 1, …, 15]}

Per op, ``degrees`` names the op's parallel dimensions (a dimension left out has degree 1) and
``devices`` lists one device id per task in row-major task order.  The fingerprints say which
graph (ops, shapes, dims, edges, parameters — not costs) and which topology (devices and links)
the plan was made for; a plan for anything else is refused with a message naming the one that
differs, because its per-op degrees and device ids would mean something else.  Everything under
``predicted`` and ``search`` is information for the reader, not checked on load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import PlanFileError, StrategyError
from .fileio import atomic_write
from .hardware.topology import DeviceTopology
from .ir.graph import OperatorGraph
from .ir.strategy import ParallelConfig, Strategy, check_config

API_VERSION = "autopar.dev/v1alpha1"
KIND = "Strategy"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PlanOp(_Strict):
    op: str
    degrees: dict[str, int] = Field(default_factory=dict)
    devices: list[int]


class PlanGraph(_Strict):
    name: str
    fingerprint: str
    ops: int | None = None


class PlanTopology(_Strict):
    name: str
    fingerprint: str
    devices: int | None = None


class PlanMetadata(_Strict):
    name: str = "plan"


class PlanDocument(_Strict):
    api_version: str = Field(alias="apiVersion")
    kind: str
    metadata: PlanMetadata = Field(default_factory=PlanMetadata)
    graph: PlanGraph
    topology: PlanTopology
    predicted: dict[str, Any] = Field(default_factory=dict)
    search: dict[str, Any] = Field(default_factory=dict)
    ops: list[PlanOp]


# -- writing -----------------------------------------------------------------------------------

def plan_document(result_or_strategy, graph: OperatorGraph, topology: DeviceTopology, *,
                  predicted_step_s: float | None = None, baselines: dict[str, float | None] | None = None,
                  search: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan as a plain dict (what `save_plan` writes)."""
    strategy, predicted, search_info = _unpack(result_or_strategy, predicted_step_s, baselines, search)
    strategy.validate(graph, topology.num_devices)
    ops = []
    for op in graph.ops:
        cfg = strategy[op.name]
        degrees = {p.name: d for p, d in zip(op.pardims, cfg.degrees) if d != 1}
        ops.append({"op": op.name, "degrees": degrees, "devices": list(cfg.devices)})
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": strategy.name},
        "graph": {"name": graph.name, "fingerprint": graph.fingerprint, "ops": len(graph.ops)},
        "topology": {"name": topology.name, "fingerprint": topology.fingerprint, "devices": topology.num_devices},
        "predicted": predicted,
        "search": search_info,
        "ops": ops,
    }


def save_plan(result_or_strategy, path: str | Path, graph: OperatorGraph, topology: DeviceTopology, *,
              predicted_step_s: float | None = None, baselines: dict[str, float | None] | None = None,
              search: dict[str, Any] | None = None) -> Path:
    """Write a `PlanResult` (with its predictions and search settings) or a bare `Strategy`."""
    doc = plan_document(result_or_strategy, graph, topology, predicted_step_s=predicted_step_s,
                        baselines=baselines, search=search)
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)
    else:
        text = json.dumps(doc, indent=2) + "\n"
    atomic_write(path, lambda fh: fh.write(text))
    return path


def _unpack(obj, predicted_step_s, baselines, search):
    if isinstance(obj, Strategy):
        predicted = {}
        if predicted_step_s is not None:
            predicted["stepSeconds"] = predicted_step_s
        if baselines:
            predicted["baselines"] = dict(baselines)
        return obj, predicted, dict(search or {})
    r = obj  # a planner.search.plan.PlanResult (duck-typed: the planner must not import the search here)
    predicted = {
        "stepSeconds": r.step_time,
        "source": r.source,
        "baselines": {k: c.step_time for k, c in r.candidates.items() if k != "mcmc"},
        "speedupOverDataParallel": r.speedup_over("data-parallel"),
        "peakMemoryBytes": {int(d): int(m) for d, m in (r.peak_memory or {}).items()},
    }
    if r.note:
        predicted["note"] = r.note
    info = {"seconds": round(r.search_seconds, 3),
            "searchSeconds": {k: round(c.seconds, 3) for k, c in r.candidates.items()}}
    info.update({_camel(k): v for k, v in r.settings.items()})
    if search:
        info.update(search)
    return r.strategy, predicted, info


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(w.title() for w in rest)


# -- reading -----------------------------------------------------------------------------------

def read_plan(path: str | Path) -> PlanDocument:
    """Parse and schema-check a plan file (no graph or topology needed)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise PlanFileError(f"plan file {path}: cannot read it ({e.strerror or e})") from e
    try:
        raw = yaml.safe_load(text) if path.suffix.lower() in (".yaml", ".yml") else json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        raise PlanFileError(f"plan file {path}: not valid {'YAML' if path.suffix.lower() in ('.yaml', '.yml') else 'JSON'}: {e}") from e
    if not isinstance(raw, dict):
        raise PlanFileError(f"plan file {path}: expected a mapping with apiVersion, kind, graph, topology and ops; "
                            f"got a {type(raw).__name__}")
    if raw.get("apiVersion") != API_VERSION or raw.get("kind") != KIND:
        raise PlanFileError(f"plan file {path}: apiVersion {raw.get('apiVersion')!r} and kind {raw.get('kind')!r}; "
                            f"expected apiVersion {API_VERSION!r} and kind {KIND!r}")
    try:
        return PlanDocument.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()[:5])
        raise PlanFileError(f"plan file {path}: {problems}") from e


def load_plan(path: str | Path, graph: OperatorGraph, topology: DeviceTopology, *,
              check_fingerprints: bool = True) -> Strategy:
    """The strategy of a plan file, checked against `graph` and `topology`.

    Refuses a plan made for another graph or topology (the message names the fingerprint that
    differs), ops the graph does not have or lacks, unknown dimension names, degrees that do not
    divide, and device ids the topology does not have.
    """
    path = Path(path)
    doc = read_plan(path)
    if check_fingerprints:
        if doc.graph.fingerprint != graph.fingerprint:
            raise PlanFileError(
                f"plan file {path} was made for graph {doc.graph.name!r} (graph fingerprint {doc.graph.fingerprint}), "
                f"but the graph is {graph.name!r} (graph fingerprint {graph.fingerprint}): the graph fingerprint "
                "differs — ops, shapes or parameters changed; plan again for this model")
        if doc.topology.fingerprint != topology.fingerprint:
            raise PlanFileError(
                f"plan file {path} was made for topology {doc.topology.name!r} (topology fingerprint "
                f"{doc.topology.fingerprint}), but the topology is {topology.name!r} (topology fingerprint "
                f"{topology.fingerprint}): the topology fingerprint differs — devices or links changed; plan again "
                "for this topology")
    seen: dict[str, PlanOp] = {}
    for entry in doc.ops:
        if entry.op in seen:
            raise PlanFileError(f"plan file {path}: op {entry.op!r} is listed twice")
        seen[entry.op] = entry
    unknown = [name for name in seen if name not in graph.by_name]
    if unknown:
        raise PlanFileError(f"plan file {path}: the graph {graph.name} has no op(s) {', '.join(unknown[:6])}"
                            f"{' …' if len(unknown) > 6 else ''}")
    missing = [op.name for op in graph.ops if op.name not in seen]
    if missing:
        raise PlanFileError(f"plan file {path}: no entry for {len(missing)} op(s) of {graph.name}: "
                            f"{', '.join(missing[:6])}{' …' if len(missing) > 6 else ''}")
    configs = {}
    for op in graph.ops:
        entry = seen[op.name]
        dims = [p.name for p in op.pardims]
        bad = [d for d in entry.degrees if d not in dims]
        if bad:
            raise PlanFileError(f"plan file {path}: op {op.name} has no parallel dimension {', '.join(map(repr, bad))}; "
                                f"its dimensions are {', '.join(dims) or 'none (it runs whole)'}")
        cfg = ParallelConfig(tuple(entry.degrees.get(d, 1) for d in dims), tuple(entry.devices))
        try:
            check_config(op, cfg, topology.num_devices)
        except StrategyError as e:
            raise PlanFileError(f"plan file {path}: {e}") from e
        configs[op.name] = cfg
    return Strategy.from_mapping(graph, configs, doc.metadata.name)
