"""The dependency direction of docs/architecture.md: planner imports neither trainer nor operator;
trainer does not import operator; nothing outside the operator talks to Kubernetes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "planner": ("autopar.trainer", "autopar.operator", "kopf", "kubernetes", "kmock"),
    "trainer": ("autopar.operator", "kopf", "kubernetes", "kmock"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level >= 2:
            # `from ..trainer import x` inside planner/ climbs into a sibling layer.
            out.append((node.lineno, "autopar." + (node.module or "")))
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer):
    bad = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for line, mod in _imports(path):
            if any(mod == f or mod.startswith(f + ".") for f in FORBIDDEN[layer]):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, "layer violations:\n" + "\n".join(bad)
