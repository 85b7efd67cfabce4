"""The import rules of the method contract (docs/adding-a-method.md), checked on the source tree.

- ``methods`` never imports ``workbench``;
- imports run down the layers: cli -> figures -> analyze, compare -> analysis, plots, pipelines -> models -> base
  (provenance, runs, store, data, profiles, xrutils) -> methods;
- ``workbench.plots`` imports neither torch nor ``methods`` nor any workbench module but itself and ``xrutils``;
- ``workbench.figures`` never imports ``methods``: figures read runs, analyses and the methods' registry entries
  (paper numbers) through the figure context and the pipelines;
- ``workbench`` reaches a method only through its public API (``methods.far``, never ``methods.far.hoyer``);
- no module imports a private name (``_x``) from another module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: workbench module prefix -> layer (a module may import its own layer or lower ones)
LAYERS = {
    "workbench.provenance": 1, "workbench.xrutils": 1, "workbench.runs": 1, "workbench.store": 1, "workbench.data": 1,
    "workbench.profiles": 1, "workbench.progress": 1, "workbench.runtime": 1,
    "workbench": 1,  # workbench/__init__ (the version)
    "workbench.models": 2,
    "workbench.analysis": 3, "workbench.features": 3, "workbench.plots": 3, "workbench.pipelines": 3,
    "workbench.analyze": 4, "workbench.compare": 4, "workbench.explore": 4, "workbench.scale": 4, "workbench.scale.chunked": 1,
    "workbench.figures": 5,
    "workbench.cli": 6, "workbench.scale.cli": 6,
}


def _layer(module: str) -> int | None:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    return None if best is None else LAYERS[best]


def _imports(path: Path):
    """(line, imported module, imported names) of every import in the file, lazy ones included."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, []
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module, [a.name for a in node.names]


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _violations(root: Path = ROOT) -> list[str]:
    """Every broken rule in the ``methods`` and ``workbench`` packages under ``root``."""
    out = []
    for path in sorted([*root.glob("methods/**/*.py"), *root.glob("workbench/**/*.py")]):
        me = _module_name(path, root)
        for line, mod, names in _imports(path):
            where = f"{path.relative_to(root)}:{line}"
            top = mod.split(".")[0]
            if me.startswith("methods") and top == "workbench":
                out.append(f"{where}: methods imports {mod}")
            if me.startswith("workbench.plots") and (top in ("torch", "methods") or (
                    top == "workbench" and not mod.startswith(("workbench.plots", "workbench.xrutils", "workbench.plots.slimswin_views")))):
                out.append(f"{where}: plots import {mod}")
            if me.startswith("workbench.figures") and top == "methods":
                out.append(f"{where}: figures import {mod} (go through the figure context and the pipelines)")
            if me.startswith("workbench") and top == "methods" and mod.count(".") >= 2:
                out.append(f"{where}: reaches into {mod} (use the method's public API)")
            if top in ("workbench", "methods") and mod != me and any(n.startswith("_") and not n.startswith("__") for n in names):
                out.append(f"{where}: imports a private name from {mod}")
            mine, theirs = _layer(me), _layer(mod)
            if mine is not None and theirs is not None and theirs > mine and not mod.startswith(me + "."):
                out.append(f"{where}: {me} (layer {mine}) imports {mod} (layer {theirs}): imports run down")
    return out


def test_import_rules_hold():
    assert _violations() == []


@pytest.mark.parametrize("source,expected,where", [
    ("from workbench.figures import figure\n", "imports run down", "analysis"),
    ("from methods.far.hoyer import shrink\n", "public API", "analysis"),
    ("from workbench.data import _split\n", "private name", "analysis"),
    ("def f():\n    from methods.far import shrink\n", "figures import methods.far", "figures"),
])
def test_the_check_catches_violations(tmp_path, source, expected, where):
    """A probe module in a tree of its own (not in the repository, which other xdist workers scan meanwhile)."""
    fake = tmp_path / "workbench" / where / "_import_rule_probe.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(source)
    assert any(expected in v for v in _violations(tmp_path))
