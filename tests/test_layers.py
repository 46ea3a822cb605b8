"""The architecture of docs/architecture.md, checked on the import statements of the source.

* Layers: planner → trainer → job → operator, each importing only those before it; nothing
  outside the operator talks to Kubernetes (the job's spec and pipeline serve both drivers).
* No import circle anywhere in autopar, counting imports inside functions (a lazy import that
  closes a circle is still a circle).
* Inside the planner, the parts depend in one order (`PLANNER_ORDER`), and no part reaches into
  another part's ``_private`` modules.
* The trainer, the job, the CLI and the operator use the planner through its public surfaces: a
  subpackage's ``__all__`` or a public top-level module, never a module inside a subpackage.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"autopar": "autopar", "planner": "autopar.planner", "trainer": "autopar.trainer",
            "job": "autopar.job", "operator": "autopar.operator"}
FORBIDDEN = {
    "planner": ("autopar.trainer", "autopar.job", "autopar.operator", "kopf", "kubernetes", "kmock"),
    "trainer": ("autopar.job", "autopar.operator", "kopf", "kubernetes", "kmock"),
    # The job's spec and pipeline are shared by the local driver and the operator: no kopf here.
    "job": ("autopar.operator", "autopar.cli", "kopf", "kubernetes", "kmock"),
}
#: The planner's parts, lowest first: each may import only the parts before it.
PLANNER_ORDER = ("errors", "fileio", "ir", "hardware", "zoo", "cost", "sim", "search", "plan_file", "plot")
#: Top-level modules of the planner that other layers may import directly.
PLANNER_PUBLIC_MODULES = ("errors", "fileio", "plan_file", "plot")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [*PACKAGES[rel.parts[0]].split("."), *rel.with_suffix("").parts[1:]]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    """Every module of autopar by its import name (packages by their own name)."""
    return {_module_name(p): p for top in PACKAGES for p in sorted((ROOT / top).rglob("*.py"))}


def _imports(path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, absolute module, names imported from it) of every import in `path`, wherever it is."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod, tuple(a.name for a in node.names)))
    return out


def _edges(path: Path) -> list[tuple[int, str]]:
    """(line, autopar module) for every autopar module `path` imports; ``from pkg import sub``
    counts as importing the submodule ``pkg.sub`` when there is one."""
    mods = _modules()
    out = []
    for line, mod, names in _imports(path):
        subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in mods]
        if subs:
            out += [(line, s) for s in subs]
        if mod in mods and len(subs) < len(names or (None,)):
            out.append((line, mod))
    return out


def _planner_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["autopar", "planner"] and len(parts) > 2 else None


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer):
    bad = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for line, mod, _ in _imports(path):
            if any(mod == f or mod.startswith(f + ".") for f in FORBIDDEN[layer]):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, "layer violations:\n" + "\n".join(bad)


def test_no_import_circle():
    g = nx.DiGraph()
    where = {}
    for mod, path in _modules().items():
        g.add_node(mod)
        for line, dep in _edges(path):
            if dep != mod:
                g.add_edge(mod, dep)
                where.setdefault((mod, dep), f"{path.relative_to(ROOT)}:{line}")
    circles = []
    for scc in nx.strongly_connected_components(g):
        if len(scc) > 1:
            cycle = nx.find_cycle(g.subgraph(scc))
            circles.append(" -> ".join(f"{a} ({where[a, b]})" for a, b in cycle) + f" -> {cycle[0][0]}")
    assert not circles, "import circles (make each module depend one way):\n" + "\n".join(circles)


def test_planner_parts_depend_in_one_order():
    bad = []
    for mod, path in _modules().items():
        me = _planner_part(mod)
        if me is None:
            continue
        assert me in PLANNER_ORDER, f"planner/{me}: add it to PLANNER_ORDER and to docs/architecture.md"
        for line, dep in _edges(path):
            it = _planner_part(dep)
            if it is not None and it != me and PLANNER_ORDER.index(it) > PLANNER_ORDER.index(me):
                bad.append(f"{path.relative_to(ROOT)}:{line}: planner/{me} imports {dep}, a part above it")
    assert not bad, "planner parts out of order (PLANNER_ORDER):\n" + "\n".join(bad)


def test_no_planner_part_reaches_into_another_parts_private_modules():
    bad = []
    for mod, path in _modules().items():
        me = _planner_part(mod) if mod.startswith("autopar.planner.") else None
        for line, dep, names in _imports(path):
            it = _planner_part(dep)
            if it is None or it == me:
                continue
            private = [p for p in dep.split(".")[3:] if p.startswith("_")]
            private += [n for n in names if n.startswith("_")]
            if private:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {dep} ({', '.join(private)})")
    assert not bad, "private modules or names of another part:\n" + "\n".join(bad)


@cache
def _surface(package: str) -> frozenset[str]:
    """The names in a package's literal ``__all__``."""
    tree = ast.parse(_modules()[package].read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return frozenset(ast.literal_eval(node.value))
    return frozenset()


def test_other_layers_use_the_planner_surfaces():
    subpackages = {m for m, p in _modules().items() if p.name == "__init__.py" and m.count(".") == 2
                   and m.startswith("autopar.planner.")}
    public = {f"autopar.planner.{m}" for m in PLANNER_PUBLIC_MODULES}
    bad = []
    for top in ("autopar", "trainer", "job", "operator"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for line, mod, names in _imports(path):
                if not mod.startswith("autopar.planner"):
                    continue
                where = f"{path.relative_to(ROOT)}:{line}"
                if mod in subpackages:
                    missing = sorted(set(names) - _surface(mod))
                    if missing:
                        bad.append(f"{where} imports {', '.join(missing)} from {mod}, not in its __all__")
                elif mod not in public:
                    bad.append(f"{where} imports {mod}: use the surface of {'.'.join(mod.split('.')[:3])}")
    assert not bad, "imports past the planner's surfaces:\n" + "\n".join(bad)


def test_every_subpackage_declares_its_surface():
    for mod, path in _modules().items():
        if mod.startswith("autopar.planner.") and path.name == "__init__.py" and mod.count(".") == 2:
            assert _surface(mod), f"{path.relative_to(ROOT)} has no literal __all__"


def test_tests_mirror_the_planner_tree():
    parts = {p.parent.name for p in (ROOT / "planner").glob("*/__init__.py")}
    tested = {p.parent.name for p in (ROOT / "tests" / "planner").glob("*/__init__.py")}
    assert parts == tested, f"planner parts without tests/planner/<part>/: {sorted(parts - tested)}; " \
                            f"test folders without a part: {sorted(tested - parts)}"
