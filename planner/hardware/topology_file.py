"""Topology files: load and save `DeviceTopology` as YAML or JSON.

A topology file describes what FlexFlow's device topology holds (sec. 3, Figure 2): devices, and
connections labelled with bandwidth and latency.  It is the way to plan for a cluster that no
preset (`planner/hardware/presets.py`) describes.  Format (`examples/topologies/` has complete files):

    apiVersion: autopar.dev/v1alpha1
    kind: Topology
    metadata: {name: my-cluster, description: "..."}
    spec:
      nodes:
        - name: node0
          gpus: {product: A100-SXM4-80GB, count: 8}     # catalog devices node0/gpu0..7
        - name: node1
          devices:                                     # or explicit devices (full names)
            - {name: node1/gpu0, product: RTX-6000, peakFlops: 91TFLOP/s, memBandwidth: 960GB/s, memory: 48GiB}
      switches: [node0/nic0]                           # passive endpoints named by links
      fabric:                                          # optional generators, so 64x64 links need not be listed
        intraNode: {kind: nvswitch, bandwidth: 300GB/s, latency: 1us, shape: switch}   # or shape: mesh
        interNode: {kind: infiniband, bandwidth: 200Gb/s, latency: 0.6us, nicsPerNode: 8,
                    nicLink: {kind: pcie, bandwidth: 25GB/s, latency: 1us}}
      links:
        - {src: node0/gpu0, dst: node0/gpu1, kind: nvlink, bandwidth: 300GB/s, latency: 2us}

Generators use the presets' builders and names: `intraNode` joins the devices of each node (mesh:
a link per pair; switch: through `<node>/<kind>`); `interNode` (only with two or more nodes) gives
each node `<node>/nic` (or `nic0..`; device j uses NIC j*nics//count) and joins every NIC to
`ib-switch` (`<kind>-switch` for other kinds).  Explicit `links` are added after the generated
ones and replace generated links between the same endpoints.  `bidirectional` defaults to true
(cables are full duplex): the link is added in both directions.

Quantities are plain numbers in base units (bytes/s, seconds, bytes, FLOP/s) or strings with
units: bandwidth `100Gb/s`, `12.5GB/s`, `25GiB/s`, `400Gbps`; time `2us`, `1.5ms`, `800ns`;
size `80GiB`, `16000MiB`, `40GB` (decimal); compute `19.5TFLOP/s`, `156TFLOPS`.

Files are validated by frozen pydantic models; every error names the field path
(`spec.links[3].bandwidth: ...`) and is raised as `TopologyError`.  `save_topology` writes the
explicit form (every link listed, numbers with units only where they parse back exactly), so
load(save(t)) == t.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, get_args

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from ..errors import TopologyError
from ..fileio import atomic_write
from .catalog import known_products, lookup, make_device
from .presets import IB_SWITCH, Fabric, Network, duplex, get_preset, inter_node_links, intra_node_links, is_preset, \
    list_presets, PRESET_FORMS
from .topology import LINK_KINDS, Device, DeviceTopology, Link

API_VERSION = "autopar.dev/v1alpha1"

# -- units -------------------------------------------------------------------------------------
_QTY = re.compile(r"\s*((?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(\S*)\s*")
_SI = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
       "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_PREFIX = r"(Ki|Mi|Gi|Ti|[kKMGTP]?)"
_BW_UNIT = re.compile(_PREFIX + r"(B/s|Bps|b/s|bps|bit/s)")
_SIZE_UNIT = re.compile(_PREFIX + r"B?")
_FLOPS_UNIT = re.compile(r"([kKMGTP]?)(?i:flop/s|flops)")
# Division by an exact power of ten rounds once, so "1.5us" gives the same float as 1.5e-6.
_TIME_DIV = {"s": 1, "ms": 1e3, "us": 1e6, "µs": 1e6, "μs": 1e6, "ns": 1e9}


def _split(value: Any, example: str) -> tuple[float, str]:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected {example}, got {value!r}")
    m = _QTY.fullmatch(value) if isinstance(value, str) else None
    if isinstance(value, str) and not m:
        raise ValueError(f"expected {example}, got {value!r}")
    try:
        num = float(m[1]) if m else float(value)
    except OverflowError:
        num = math.inf
    if not math.isfinite(num):
        raise ValueError(f"expected {example}, got {value!r} (not a finite number)")
    return num, (m[2] if m else "")


def _finite(v: float, value: Any, example: str) -> float:
    if not math.isfinite(v):
        raise ValueError(f"expected {example}, got {value!r} (too large)")
    return v


def _bandwidth(value: Any) -> float:
    example = "a bandwidth such as '100Gb/s', '12.5GB/s' or a number of bytes/s"
    num, unit = _split(value, example)
    if not unit:
        return num
    m = _BW_UNIT.fullmatch(unit)
    if not m:
        raise ValueError(f"expected {example}, got {value!r} (unknown unit {unit!r})")
    v = num * _SI[m[1]]
    return _finite(v / 8 if m[2] in ("b/s", "bps", "bit/s") else v, value, example)


def _duration(value: Any) -> float:
    example = "a duration such as '2us', '1.5ms', '800ns' or a number of seconds"
    num, unit = _split(value, example)
    if unit and unit not in _TIME_DIV:
        raise ValueError(f"expected {example}, got {value!r} (unknown unit {unit!r})")
    return num / _TIME_DIV[unit] if unit else num


def _size(value: Any) -> int:
    example = "a size such as '80GiB', '16000MiB' or a number of bytes"
    if isinstance(value, int) and not isinstance(value, bool):
        return value  # exact, even beyond 2**53
    num, unit = _split(value, example)
    m = _SIZE_UNIT.fullmatch(unit)
    if not m:
        raise ValueError(f"expected {example}, got {value!r} (unknown unit {unit!r})")
    v = _finite(num * _SI[m[1]], value, example)
    if v != int(v):
        raise ValueError(f"expected a whole number of bytes, got {value!r} = {v} bytes")
    return int(v)


def _flops(value: Any) -> float:
    example = "a compute rate such as '19.5TFLOP/s', '156TFLOPS' or a number of FLOP/s"
    num, unit = _split(value, example)
    if not unit:
        return num
    m = _FLOPS_UNIT.fullmatch(unit)
    if not m:
        raise ValueError(f"expected {example}, got {value!r} (unknown unit {unit!r})")
    return _finite(num * _SI[m[1]], value, example)


def _public(parse):
    def wrapper(value: Any):
        try:
            return parse(value)
        except ValueError as e:
            raise TopologyError(str(e)) from e
    wrapper.__name__ = "parse" + parse.__name__
    wrapper.__doc__ = "Parse a quantity (a number in base units or a string with a unit); TopologyError if malformed."
    return wrapper


parse_bandwidth = _public(_bandwidth)
parse_duration = _public(_duration)
parse_size = _public(_size)
parse_flops = _public(_flops)


def _fmt(x: float, units: list[tuple[float, str]], parse) -> float | str:
    """`x` with the largest unit that reads >= 1 and parses back to exactly `x`, else `x`."""
    for mult, suffix in units:
        text = f"{x * mult:.12g}{suffix}"
        if x * mult >= 1 and parse(text) == x:
            return text
    return x


def _fmt_bandwidth(x: float) -> float | str:
    return _fmt(x, [(1e-12, "TB/s"), (1e-9, "GB/s"), (1e-6, "MB/s")], _bandwidth)


def _fmt_duration(x: float) -> float | str:
    return _fmt(x, [(1, "s"), (1e3, "ms"), (1e6, "us"), (1e9, "ns")], _duration) if x else 0


def _fmt_flops(x: float) -> float | str:
    return _fmt(x, [(1e-15, "PFLOP/s"), (1e-12, "TFLOP/s"), (1e-9, "GFLOP/s")], _flops) if x else 0


def _fmt_size(x: int) -> int | str:
    for scale, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB")):
        if x >= scale and x % scale == 0:
            return f"{x // scale}{suffix}"
    return x


Bandwidth = Annotated[float, BeforeValidator(_bandwidth), Field(gt=0)]
Duration = Annotated[float, BeforeValidator(_duration), Field(ge=0)]
Size = Annotated[int, BeforeValidator(_size), Field(gt=0)]
Flops = Annotated[float, BeforeValidator(_flops), Field(ge=0)]
LinkKind = Literal[LINK_KINDS]


# -- schema ------------------------------------------------------------------------------------
class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)


class GpuGroup(_Model):
    product: str = Field(min_length=1)
    count: int = Field(ge=1, le=4096)


class DeviceEntry(_Model):
    name: str = Field(min_length=1)
    product: str = Field(min_length=1)
    kind: str | None = None
    peak_flops: Annotated[Flops, Field(gt=0)] | None = None
    peak_flops_half: Flops | None = None
    mem_bandwidth: Bandwidth | None = None
    memory: Size | None = None


class NodeEntry(_Model):
    name: str = Field(min_length=1)
    gpus: GpuGroup | None = None
    devices: tuple[DeviceEntry, ...] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_kind_of_devices(self) -> "NodeEntry":
        if (self.gpus is None) == (self.devices is None):
            raise ValueError("give exactly one of gpus ({product, count}) or devices (a list)")
        return self


class LinkEntry(_Model):
    src: str = Field(min_length=1)
    dst: str = Field(min_length=1)
    kind: LinkKind
    bandwidth: Bandwidth
    latency: Duration = 0.0
    bidirectional: bool = True


class IntraNodeFabric(_Model):
    kind: LinkKind
    bandwidth: Bandwidth
    latency: Duration = 0.0
    shape: Literal["mesh", "switch"] | None = None  # default: switch for nvswitch, else mesh


class NicLink(_Model):
    kind: LinkKind = "pcie"
    bandwidth: Bandwidth
    latency: Duration = 0.0


class InterNodeNetwork(_Model):
    kind: LinkKind = "infiniband"
    bandwidth: Bandwidth
    latency: Duration = 0.0
    nics_per_node: int = Field(1, ge=1, le=64)
    nic_link: NicLink
    switch: str | None = Field(None, min_length=1)


class FabricSpec(_Model):
    intra_node: IntraNodeFabric | None = None
    inter_node: InterNodeNetwork | None = None


class TopologySpec(_Model):
    nodes: tuple[NodeEntry, ...] = Field(min_length=1)
    switches: tuple[str, ...] = ()
    fabric: FabricSpec | None = None
    links: tuple[LinkEntry, ...] = ()


class Metadata(_Model):
    name: str = Field(min_length=1)
    description: str = ""
    annotations: dict[str, str] = Field(default_factory=dict)


class TopologyFile(_Model):
    api_version: Literal["autopar.dev/v1alpha1"]
    kind: Literal["Topology"]
    metadata: Metadata
    spec: TopologySpec


# -- errors ------------------------------------------------------------------------------------
def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def _model_at(loc: tuple) -> type[BaseModel] | None:
    def inner(tp: Any) -> type[BaseModel] | None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return tp
        return next(filter(None, map(inner, get_args(tp))), None)

    model: type[BaseModel] | None = TopologyFile
    for part in loc:
        if isinstance(part, int):
            continue
        field = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        model = inner(field.annotation) if field else None
        if model is None:
            return None
    return model


def _from_validation(e: ValidationError, source: str) -> TopologyError:
    lines = []
    for err in e.errors(include_url=False):
        loc = tuple(err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            model = _model_at(loc[:-1])
            known = f"; known fields: {', '.join(f.alias or n for n, f in model.model_fields.items())}" if model else ""
            msg = f"unknown field {loc[-1]!r}{known}"
        lines.append(f"{_path(loc)}: {msg}")
    return TopologyError(f"{source}: invalid topology:\n  " + "\n  ".join(lines))


def _err(source: str, path: str, msg: str) -> TopologyError:
    return TopologyError(f"{source}: {path}: {msg}")


# -- file -> topology --------------------------------------------------------------------------
def _device(d: DeviceEntry, id: int, node: str, path: str, source: str) -> Device:
    try:
        base = lookup(d.product)
    except TopologyError as e:
        required = {"peakFlops": d.peak_flops, "memBandwidth": d.mem_bandwidth, "memory": d.memory}
        missing = [alias for alias, v in required.items() if v is None]
        if missing:
            raise _err(source, path, f"product {d.product!r} is not in the device catalog (known: "
                       f"{', '.join(known_products())}), so {', '.join(missing)} must be given") from e
        base = None
    fields = ("peak_flops", "peak_flops_half", "mem_bandwidth", "memory")
    from_catalog = base is not None and any(getattr(d, f) is None for f in fields)
    values = {f: getattr(d, f) if getattr(d, f) is not None else (getattr(base, f) if base else 0.0) for f in fields}
    try:
        return Device(id=id, name=d.name, node=node, product=base.product if from_catalog else d.product,
                      kind=d.kind or (base.kind if base else "gpu"), **values)
    except TopologyError as e:
        raise _err(source, path, str(e)) from e


def _build(doc: TopologyFile, source: str) -> DeviceTopology:
    spec = doc.spec
    where: dict[str, str] = {}  # endpoint name -> path that declared it

    def claim(name: str, path: str, reuse_switch: bool = False) -> None:
        if name in where:
            if reuse_switch and where[name].startswith("spec.switches"):
                return
            raise _err(source, path, f"name {name!r} is already used by {where[name]}")
        where[name] = path

    devices: list[Device] = []
    for i, node in enumerate(spec.nodes):
        path = f"spec.nodes[{i}]"
        if node.gpus is not None:
            for j in range(node.gpus.count):
                name = f"{node.name}/gpu{j}"
                claim(name, f"{path}.gpus")
                try:
                    devices.append(make_device(len(devices), name, node.name, node.gpus.product))
                except TopologyError as e:
                    raise _err(source, f"{path}.gpus.product", str(e)) from e
        else:
            for j, d in enumerate(node.devices or ()):
                claim(d.name, f"{path}.devices[{j}].name")
                devices.append(_device(d, len(devices), node.name, f"{path}.devices[{j}]", source))
    switches = list(spec.switches)
    for k, s in enumerate(switches):
        claim(s, f"spec.switches[{k}]")

    generated: list[Link] = []
    groups: dict[str, list[str]] = {}
    for d in devices:
        groups.setdefault(d.node, []).append(d.name)
    fabric = spec.fabric or FabricSpec()
    if fabric.intra_node is not None:
        f = fabric.intra_node
        shape = f.shape or ("switch" if f.kind == "nvswitch" else "mesh")
        for node, names in groups.items():
            if len(names) > 1:
                links, hubs = intra_node_links(node, names, Fabric(f.kind, f.bandwidth, f.latency, shape))
                generated += links
                for h in hubs:
                    claim(h, "spec.fabric.intraNode", reuse_switch=True)
                    switches += [h] if h not in switches else []
    if fabric.inter_node is not None and len(groups) > 1:
        n = fabric.inter_node
        net = Network(n.kind, n.bandwidth, n.latency, Fabric(n.nic_link.kind, n.nic_link.bandwidth, n.nic_link.latency),
                      nics=n.nics_per_node, switch=n.switch or (IB_SWITCH if n.kind == "infiniband" else f"{n.kind}-switch"))
        links, ends = inter_node_links(list(groups.items()), net)
        generated += links
        for s in ends:
            claim(s, "spec.fabric.interNode", reuse_switch=True)
            switches += [s] if s not in switches else []

    explicit: list[Link] = []
    for k, l in enumerate(spec.links):
        for end in ("src", "dst"):
            if getattr(l, end) not in where:
                raise _err(source, f"spec.links[{k}].{end}", f"unknown endpoint {getattr(l, end)!r}; declare it as a "
                           "device (spec.nodes) or under spec.switches")
        if l.src == l.dst:
            raise _err(source, f"spec.links[{k}]", f"src and dst are both {l.src!r}; a link joins two endpoints")
        explicit += duplex(l.src, l.dst, l.kind, l.bandwidth, l.latency) if l.bidirectional else \
            [Link(l.src, l.dst, l.kind, l.bandwidth, l.latency)]
    replaced = {(l.src, l.dst) for l in explicit}
    links = [l for l in generated if (l.src, l.dst) not in replaced] + explicit
    try:
        return DeviceTopology(name=doc.metadata.name, devices=tuple(devices), links=tuple(links),
                              switches=tuple(switches), description=doc.metadata.description,
                              meta=tuple(doc.metadata.annotations.items()))
    except TopologyError as e:
        raise _err(source, "spec", str(e)) from e


def parse_topology(doc: Any, source: str = "<topology>") -> DeviceTopology:
    """The topology a parsed file (dict) describes; `source` prefixes error messages."""
    if not isinstance(doc, Mapping):
        raise TopologyError(f"{source}: expected a mapping with apiVersion, kind, metadata and spec, "
                            f"got {type(doc).__name__}")
    try:
        model = TopologyFile.model_validate(doc)
    except ValidationError as e:
        raise _from_validation(e, source) from e
    return _build(model, source)


def load_topology(path: str | Path) -> DeviceTopology:
    """Read a YAML (.yaml, .yml) or JSON (.json) topology file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TopologyError(f"cannot read topology file {p}: {e.strerror or e}") from e
    try:
        doc = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as e:
        raise TopologyError(f"{p}: line {e.lineno} column {e.colno}: invalid JSON: {e.msg}") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        raise TopologyError(f"{p}: {where}invalid YAML: {getattr(e, 'problem', None) or e}") from e
    return parse_topology(doc, source=str(p))


# -- topology -> file --------------------------------------------------------------------------
def _node_entry(node: str, devs: list[Device]) -> dict[str, Any]:
    product = devs[0].product
    try:
        standard = all(d == make_device(d.id, f"{node}/gpu{j}", node, product) for j, d in enumerate(devs))
    except TopologyError:
        standard = False
    if standard:
        return {"name": node, "gpus": {"product": product, "count": len(devs)}}
    return {"name": node, "devices": [
        {"name": d.name, "product": d.product, "kind": d.kind, "peakFlops": _fmt_flops(d.peak_flops),
         "peakFlopsHalf": _fmt_flops(d.peak_flops_half), "memBandwidth": _fmt_bandwidth(d.mem_bandwidth),
         "memory": _fmt_size(d.memory)} for d in devs]}


def dump_topology(topo: DeviceTopology) -> dict[str, Any]:
    """The explicit file form of `topo` (a dict ready for YAML or JSON)."""
    nodes: list[dict[str, Any]] = []
    run: list[Device] = []
    for d in topo.devices + (None,):
        if run and (d is None or d.node != run[0].node):
            nodes.append(_node_entry(run[0].node, run))
            run = []
        if d is not None:
            run.append(d)
    links: list[dict[str, Any]] = []
    i = 0
    while i < len(topo.links):
        l = topo.links[i]
        nxt = topo.links[i + 1] if i + 1 < len(topo.links) else None
        # Merge only a reverse that follows directly, so reloading restores the same link order.
        both = nxt == Link(l.dst, l.src, l.kind, l.bandwidth, l.latency)
        links.append({"src": l.src, "dst": l.dst, "kind": l.kind, "bandwidth": _fmt_bandwidth(l.bandwidth),
                      "latency": _fmt_duration(l.latency), "bidirectional": both})
        i += 2 if both else 1
    metadata: dict[str, Any] = {"name": topo.name}
    if topo.description:
        metadata["description"] = topo.description
    if topo.meta:
        metadata["annotations"] = dict(topo.meta)
    spec: dict[str, Any] = {"nodes": nodes}
    if topo.switches:
        spec["switches"] = list(topo.switches)
    if links:
        spec["links"] = links
    return {"apiVersion": API_VERSION, "kind": "Topology", "metadata": metadata, "spec": spec}


def save_topology(topo: DeviceTopology, path: str | Path) -> Path:
    """Write `topo` as JSON (.json) or YAML (anything else); returns the path."""
    p = Path(path)
    doc = dump_topology(topo)
    text = json.dumps(doc, indent=2) + "\n" if p.suffix.lower() == ".json" else \
        yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120)
    try:
        atomic_write(p, lambda fh: fh.write(text))
    except OSError as e:
        raise TopologyError(f"cannot write topology file {p}: {e.strerror or e}") from e
    return p


def resolve_topology(spec: str) -> DeviceTopology:
    """A preset name (`p100-4x4`, `local:4`, ...) or the path of a topology file.

    A preset name wins over a file of the same name without a suffix; write `./local` for the file.
    """
    text = str(spec).strip()
    if is_preset(text):
        return get_preset(text)
    p = Path(text)
    if p.suffix.lower() in (".yaml", ".yml", ".json") or p.exists():
        return load_topology(p)
    raise TopologyError(f"unknown topology {spec!r}: not a preset ({', '.join(list_presets())}; parametric forms "
                        f"{', '.join(PRESET_FORMS)}) and not a topology file (.yaml, .yml or .json)")
