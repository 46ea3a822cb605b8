"""Plan files: a strategy written down for a user to read, edit, validate and simulate.

    save_plan(result, "plan.yaml", graph, topology)      # a PlanResult or a Strategy
    strategy = load_plan("plan.yaml", graph, topology)   # refuses plans for another graph/topology

Format (YAML for ``.yaml``/``.yml``, JSON otherwise), validated with pydantic at the boundary::

    apiVersion: autopar.dev/v1alpha1
    kind: Strategy
    metadata: {name: plan}
    graph: {name: nmt, fingerprint: "sha256:…", ops: 652, dtype: float32, batchSize: 64, options: {batch: 64, …}}
    topology: {name: p100-4x4, fingerprint: "sha256:…", devices: 16}
    predicted: {stepSeconds: 0.0123, baselines: {data-parallel: 0.0201, …}, peakMemoryBytes: {0: …}}
    search: {seconds: 61.2, budgetSeconds: 60, seed: 0, starts: [data-parallel, …]}
    ops:
      - {op: encoder_0, degrees: {n: 4, h: 4}, devices: [0, 1, …, 15]}

Per op, ``degrees`` names the op's parallel dimensions (a dimension left out has degree 1) and
``devices`` lists one device id per task in row-major task order.  The fingerprints say which
graph (ops, shapes, dims, edges, parameters — not costs) and which topology (devices and links)
the plan was made for; a plan for anything else is refused with a message naming the one that
differs and, as far as the file tells, what differs (the dtype, the op count, the batch size, model
options; plan files written before ``dtype``/``batchSize``/``options`` were recorded still load),
because its per-op degrees and device ids would mean something else.  Everything under
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
    dtype: str | None = None                       # recorded since the dtype became part of plans
    batch_size: int | None = Field(default=None, alias="batchSize")
    options: dict[str, Any] | None = None          # the model options the graph was built with


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
                  search: dict[str, Any] | None = None, model_options: Any = None) -> dict[str, Any]:
    """The plan as a plain dict (what `save_plan` writes).  `model_options` (a mapping or the pairs
    of `ModelSpec.options`) are recorded so that a refusal can name an option that differs."""
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
        "graph": _graph_entry(graph, model_options),
        "topology": {"name": topology.name, "fingerprint": topology.fingerprint, "devices": topology.num_devices},
        "predicted": predicted,
        "search": search_info,
        "ops": ops,
    }


def save_plan(result_or_strategy, path: str | Path, graph: OperatorGraph, topology: DeviceTopology, *,
              predicted_step_s: float | None = None, baselines: dict[str, float | None] | None = None,
              search: dict[str, Any] | None = None, model_options: Any = None) -> Path:
    """Write a `PlanResult` (with its predictions and search settings) or a bare `Strategy`."""
    doc = plan_document(result_or_strategy, graph, topology, predicted_step_s=predicted_step_s,
                        baselines=baselines, search=search, model_options=model_options)
    path = Path(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)
    else:
        text = json.dumps(doc, indent=2) + "\n"
    atomic_write(path, lambda fh: fh.write(text))
    return path


def _graph_entry(graph: OperatorGraph, model_options: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": graph.name, "fingerprint": graph.fingerprint, "ops": len(graph.ops),
                             "dtype": graph.dtype, "batchSize": graph.batch_size}
    options = _options(model_options)
    if options is not None:
        entry["options"] = options
    return entry


def _options(model_options: Any) -> dict[str, Any] | None:
    """Model options as a plain mapping of scalars (what YAML and JSON can hold)."""
    if model_options is None:
        return None
    items = model_options.items() if isinstance(model_options, dict) else model_options
    return {str(k): (v if isinstance(v, (bool, int, float, str)) or v is None else str(v)) for k, v in items}


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

def read_plan(path: str | Path, graph: OperatorGraph | None = None,
              topology: DeviceTopology | None = None) -> PlanDocument:
    """Parse and schema-check a plan file (no graph or topology needed; given, a schema error of an
    op entry also lists the values its field allows)."""
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
        problems = "; ".join(_schema_problem(err, raw, graph, topology) for err in e.errors()[:5])
        more = len(e.errors()) - 5
        raise PlanFileError(f"plan file {path}: {problems}{f' (and {more} more)' if more > 0 else ''}") from e


_OP_FIELDS = "an op entry has op (the op's name), degrees (dimension name: degree) and devices (a list of device ids)"


def _schema_problem(err: dict, raw: dict, graph: OperatorGraph | None, topology: DeviceTopology | None) -> str:
    """One pydantic error as a sentence: which op (by its name in the file), which field, what is allowed."""
    loc = tuple(err.get("loc", ()))
    kind = err.get("type", "")
    value = err.get("input")
    if len(loc) >= 2 and loc[0] == "ops" and isinstance(loc[1], int):
        entries = raw.get("ops")
        entry = entries[loc[1]] if isinstance(entries, list) and loc[1] < len(entries) else None
        name = entry.get("op") if isinstance(entry, dict) else None
        where = (f"op {name!r} (entry {loc[1] + 1} of ops)" if isinstance(name, str)
                 else f"entry {loc[1] + 1} of ops")
        op = graph.by_name.get(name) if graph is not None and isinstance(name, str) else None
        rest = loc[2:]
        if not rest:
            return f"{where}: expected a mapping; {_OP_FIELDS}"
        field = rest[0]
        if kind == "extra_forbidden":
            return f"{where}: unknown field {field!r}; {_OP_FIELDS}"
        if kind == "missing":
            return f"{where}: field {field!r} is missing; {_OP_FIELDS}"
        if field == "degrees" and len(rest) >= 2:
            dim = rest[1]
            msg = f"{where}: degrees.{dim} is {value!r}, not a whole number; a degree is a positive integer"
            pd = op.pardim(str(dim)) if op is not None else None
            if pd is not None:
                limit = topology.num_devices if topology is not None else None
                msg += f" that divides dimension {dim} (size {pd.size}): allowed {_allowed(pd, limit)}"
            elif op is not None:
                msg += f"; {op.name} has dimensions {', '.join(p.name for p in op.pardims) or 'none (it runs whole)'}"
            return msg
        if field == "degrees":
            dims = f" ({', '.join(p.name for p in op.pardims) or 'none'})" if op is not None else ""
            return (f"{where}: degrees is {value!r}; it must map dimension names{dims} to degrees, "
                    "e.g. {n: 2}")
        if field == "devices" and len(rest) >= 2:
            ids = f" 0..{topology.num_devices - 1}" if topology is not None else ""
            return f"{where}: devices[{rest[1]}] is {value!r}; devices are integer device ids{ids}"
        if field == "devices":
            return f"{where}: devices is {value!r}; it must be a list of device ids, one per task, e.g. [0, 1]"
        if field == "op":
            return f"{where}: op is {value!r}; it must be the op's name (a string)"
        return f"{where}: {'.'.join(map(str, rest))}: {err.get('msg')}"
    path = ".".join(str(x) for x in loc) or "the document"
    if kind == "extra_forbidden":
        return f"{path}: unknown field (not part of a plan file)"
    if kind == "missing":
        return f"{path}: field is missing"
    return f"{path}: {err.get('msg')} (got {value!r})"


def _allowed(pd, limit: int | None) -> str:
    allowed = pd.allowed_degrees(limit)
    return ", ".join(map(str, allowed)) if allowed else "1"


def load_plan(path: str | Path, graph: OperatorGraph, topology: DeviceTopology, *,
              check_fingerprints: bool = True, model_options: Any = None) -> Strategy:
    """The strategy of a plan file, checked against `graph` and `topology`.

    Refuses a plan made for another graph or topology (the message names the fingerprint that
    differs), ops the graph does not have or lacks, unknown dimension names, degrees that do not
    divide, and device ids the topology does not have.  `model_options` (the options this run built
    the model with) let the refusal of a plan for another graph name an option that differs.
    """
    path = Path(path)
    doc = read_plan(path, graph, topology)
    if check_fingerprints:
        if doc.graph.fingerprint != graph.fingerprint:
            raise PlanFileError(_graph_mismatch(path, doc.graph, graph, model_options))
        if doc.topology.fingerprint != topology.fingerprint:
            devices = ""
            if doc.topology.devices is not None and doc.topology.devices != topology.num_devices:
                devices = (f" ({doc.topology.devices} devices in the plan, {topology.num_devices} in this run's "
                           "topology)")
            raise PlanFileError(
                f"plan file {path} was made for topology {doc.topology.name!r} (topology fingerprint "
                f"{doc.topology.fingerprint}), but the topology is {topology.name!r} (topology fingerprint "
                f"{topology.fingerprint}): the topology fingerprint differs{devices} — devices or links changed; "
                "plan again for this topology (autopar plan --topology), or run on the plan's (--topology "
                f"{doc.topology.name})")
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


def _graph_mismatch(path: Path, planned: PlanGraph, graph: OperatorGraph, model_options: Any) -> str:
    """Why a plan's graph fingerprint differs from `graph`'s, as far as the file tells."""
    if planned.dtype is not None and planned.dtype != graph.dtype:
        return (f"{path} was made for {planned.name} in {planned.dtype}; this run is {graph.dtype}: make the plan "
                f"with `autopar plan --dtype {graph.dtype}`, or run in {planned.dtype} (`--dtype {planned.dtype}`, "
                f"or without --dtype when {planned.dtype} is the model's own)")
    diffs = []
    if planned.name != graph.name:
        diffs.append(f"it is for model {planned.name!r}, this run's is {graph.name!r}")
    if planned.batch_size is not None and planned.batch_size != graph.batch_size:
        diffs.append(f"batch {planned.batch_size} in the plan, {graph.batch_size} in this run")
    now = _options(model_options)
    if planned.options is not None and now is not None:
        keys = sorted(set(planned.options) | set(now))
        if planned.batch_size is not None and planned.batch_size != graph.batch_size:
            keys = [k for k in keys if k != "batch"]          # said above
        changed = [f"{k}={planned.options.get(k, '(unset)')} in the plan, {now.get(k, '(unset)')} now"
                   for k in keys if planned.options.get(k) != now.get(k)]
        if changed:
            diffs.append("model options differ: " + "; ".join(changed))
    if planned.ops is not None and planned.ops != len(graph.ops):
        diffs.append(f"{planned.ops} ops in the plan, {len(graph.ops)} in this run's graph")
    same = [what for what, known in (("op count", planned.ops is not None), ("batch size", planned.batch_size),
                                     ("dtype", planned.dtype), ("model options", planned.options is not None
                                                                and now is not None)) if known]
    why = ("; ".join(diffs) if diffs else
           (f"the same {', '.join(same)}, but " if same else "") +
           "ops, shapes or parameters changed (the model's code or options?)")
    advice = "plan again for this model and options (`autopar plan --model ... -o KEY=VALUE`)"
    if planned.name == graph.name:
        return (f"plan file {path} was made for another {graph.name} graph: the graph fingerprint differs "
                f"({planned.fingerprint} in the plan, {graph.fingerprint} in this run) — {why}; {advice}")
    return (f"plan file {path} was made for graph {planned.name!r} (graph fingerprint {planned.fingerprint}), "
            f"but the graph is {graph.name!r} (graph fingerprint {graph.fingerprint}): the graph fingerprint "
            f"differs — {why}; {advice}")
