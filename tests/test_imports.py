"""The import rules of the method contract (docs/adding-a-method.md), checked on the source tree.

Per import statement (lazy ones inside functions included):

- ``methods`` never imports ``workbench``;
- imports run down the layers: cli -> figures -> analyze, compare -> analysis, plots, pipelines -> models -> base
  (provenance, runs, store, data, profiles, xrutils, runtime) -> methods;
- ``workbench.plots`` imports neither torch nor ``methods`` nor any workbench module but itself and ``xrutils``;
- ``workbench`` reaches a method only through its public API (``methods.far``, never ``methods.far.hoyer``);
- no module imports a private name (``_x``) from another module.

On the module import graph (every ``import`` of a module, in function bodies too; ``if TYPE_CHECKING:`` imports
left out, they never run), followed transitively:

- ``workbench`` reaches ``methods`` only through its **doors** (:data:`DOORS`), never through a module that merely
  happens to import it (e.g. figures -> compare -> ``methods.train``). The doors:

  ========================================  ================================================================
  importer                                  the ``methods`` modules it may import
  ========================================  ================================================================
  ``workbench.runtime``                     ``methods.launch`` (device, threads, ranks), ``methods.train`` (the
                                            training loop) and ``methods.io`` (atomic writes) — their only door
  ``workbench.models``                      ``methods`` (``register_models``: the model registry), ``methods.teachers``
  ``workbench.pipelines.<m>.*``             ``methods.<m>`` (its own method's public package) and the shared tools
  ``workbench.pipelines`` (shared modules)  the shared tools
  ``workbench.analysis.*`` (extractors)     any method's public package and the shared tools
  ``workbench.explain.*`` (capability)      the shared tools only (methods reached through hook-point names)
  ``workbench.hf.native``                   the shared tools only (an HF model given the hook-point names)
  ========================================  ================================================================

  The shared tools are ``methods.hooks``, ``methods.devices``, ``methods.flops``, ``methods.cka`` and
  ``methods.teachers``. Every other workbench module — figures, the CLI, compare, analyze, the explorer, scale,
  store, data, runs — imports no ``methods`` module and reaches one only through a door; in particular figures
  never import ``methods`` (they read runs, analyses and the methods' registry entries through the figure
  context and the pipelines) and plots reach neither ``methods`` nor torch by any chain;
- no import cycle among workbench modules (:func:`_cycles` lists each strongly connected set with one cycle through
  it), including those that only close in a function body.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: workbench module prefix -> layer (a module may import its own layer or lower ones)
LAYERS = {
    "workbench.provenance": 1, "workbench.xrutils": 1, "workbench.runs": 1, "workbench.store": 1, "workbench.data": 1,
    "workbench.profiles": 1, "workbench.progress": 1, "workbench.runtime": 1, "workbench.checkpoints": 1,
    "workbench": 1,  # workbench/__init__ (the version)
    "workbench.models": 2, "workbench.hf": 2,  # hf: Hugging Face folders as timm models, beside the loader that resolves hf:DIR
    "workbench.analysis": 3, "workbench.explain": 3, "workbench.features": 3, "workbench.plots": 3, "workbench.pipelines": 3,
    "workbench.analyze": 4, "workbench.compare": 4, "workbench.explore": 4, "workbench.scale": 4, "workbench.scale.chunked": 1,
    "workbench.figures": 5,
    "workbench.cli": 6, "workbench.scale.cli": 6,
}


def _layer(module: str) -> int | None:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    return None if best is None else LAYERS[best]


def _imports(path: Path, root: Path = ROOT, typing_only: bool = True):
    """(line, imported module, imported names, relative level) of every import in the file, lazy ones included; relative imports
    resolved (``from .lstm import X`` in ``methods/far/replace.py`` is ``methods.far.lstm``). ``typing_only=False``
    leaves out the imports under ``if TYPE_CHECKING:`` (they never run)."""
    me = _module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]

    def visit(node):
        if isinstance(node, ast.If) and not typing_only and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                yield from visit(child)
            return
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, [], 0
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            mod = ".".join([*base, *([node.module] if node.module else [])])
            if mod:
                yield node.lineno, mod, [a.name for a in node.names], node.level
        for child in ast.iter_child_nodes(node):
            yield from visit(child)

    yield from visit(ast.parse(path.read_text()))


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _violations(root: Path = ROOT) -> list[str]:
    """Every broken rule in the ``methods`` and ``workbench`` packages under ``root``."""
    out = []
    for path in sorted([*root.glob("methods/**/*.py"), *root.glob("workbench/**/*.py")]):
        me = _module_name(path, root)
        for line, mod, names, level in _imports(path, root):
            if level:
                continue  # within a package: the rules below are about imports between packages
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


#: the shared tools of ``methods`` (not a method): hooks, devices, MAC counting, CKA, the demo teachers
SHARED = ("methods.hooks", "methods.devices", "methods.flops", "methods.cka", "methods.teachers")


def _is_door(me: str, target: str, methods_pkgs: set[str]) -> bool:
    """Whether workbench module ``me`` may import ``methods`` module ``target`` (the table in the docstring)."""
    if target in ("methods.train", "methods.launch", "methods.io"):
        return me == "workbench.runtime"
    if me == "workbench.models":
        return target in ("methods", "methods.teachers")
    if me.startswith(("workbench.explain.", "workbench.features.")) or me in ("workbench.explain", "workbench.features",
                                                                              "workbench.hf.native"):
        return target in SHARED  # capabilities across methods: the shared tools only, never a method by name
    if me.startswith("workbench.analysis.") or me == "workbench.analysis":
        return target in SHARED or target in methods_pkgs
    if me.startswith("workbench.pipelines."):
        own = "methods." + me.split(".")[2]
        return target in SHARED or (own in methods_pkgs and target == own)
    if me == "workbench.pipelines":
        return target in SHARED
    return False


#: a module -> {what it imports: where (file:line)}; workbench and methods modules by name, others by top package
Graph = dict[str, dict[str, str]]


def _graph(root: Path = ROOT) -> Graph:
    """The import graph of ``methods`` and ``workbench``: every import that can run (function bodies included,
    ``if TYPE_CHECKING:`` left out). ``from a import b`` is an edge to ``a.b`` when that is a workbench module, else
    to ``a``."""
    paths = {_module_name(p, root): p for p in sorted([*root.glob("methods/**/*.py"), *root.glob("workbench/**/*.py")])}
    graph: Graph = {}
    for me, path in paths.items():
        edges = graph.setdefault(me, {})
        for line, mod, names, _ in _imports(path, root, typing_only=False):
            # ``from methods.nondeep import collapse`` takes the package's public name, not the submodule
            subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in paths and mod.split(".")[0] == "workbench"]
            whole = not names or len(subs) < len(names)
            for target in [*subs, *([mod] if whole else [])]:
                target = target if target in paths or target.split(".")[0] in ("workbench", "methods") else target.split(".")[0]
                if target != me:
                    edges.setdefault(target, f"{path.relative_to(root)}:{line}")
    return graph


def _chain(graph: Graph, start: str, goal) -> list[str] | None:
    """The shortest import chain from ``start`` to a module for which ``goal(module)`` holds (through workbench
    modules only), or None."""
    parent: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for m in frontier:
            if goal(m) and m != start:
                out = [m]
                while parent[out[-1]] is not None:
                    out.append(parent[out[-1]])
                return out[::-1]
            if m == start or m.startswith("workbench"):
                for t in graph.get(m, {}):
                    if t not in parent:
                        parent[t] = m
                        nxt.append(t)
        frontier = nxt
    return None


def _reach_violations(root: Path = ROOT) -> list[str]:
    """``workbench`` reaching ``methods`` other than through a door; plots reaching torch or ``methods``."""
    graph = _graph(root)
    methods_pkgs = {m for m in graph if m.count(".") == 1 and m.startswith("methods.") and (root / m.replace(".", "/")).is_dir()}
    out = []
    for me, edges in graph.items():
        if not me.startswith("workbench"):
            continue
        for target, where in edges.items():
            if target.split(".")[0] != "methods" or _is_door(me, target, methods_pkgs):
                continue
            above = sorted((m for m in graph if m.startswith("workbench") and m != me and _chain(graph, m, me.__eq__)),
                           key=lambda m: (-(_layer(m) or 0), m))
            via = f"; reached by {len(above)} module(s), e.g. {' -> '.join(_chain(graph, above[0], me.__eq__))} -> {target}" if above else ""
            out.append(f"{where}: {me} imports {target} but is no door to it (go through workbench.runtime, the "
                       f"method's pipeline or an extractor){via}")
    for me in graph:
        if me.startswith("workbench.plots"):
            chain = _chain(graph, me, lambda m: m == "torch" or m.split(".")[0] == "methods")
            if chain:
                out.append(f"{me} reaches {chain[-1]}: {' -> '.join(chain)} (plots import neither torch nor methods)")
    return out


def _cycles(root: Path = ROOT) -> list[str]:
    """Import cycles among workbench modules: in each strongly connected set, the shortest cycle through each of its
    modules (each cycle once), with where each of its imports is."""
    graph = {m: {t: w for t, w in e.items() if t.startswith("workbench") and t in graph_keys}
             for graph_keys in [set(_graph(root))] for m, e in _graph(root).items() if m.startswith("workbench")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    sccs: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    out = []
    for comp in sorted(sccs):
        sub = {m: {t: w for t, w in graph[m].items() if t in comp} for m in comp}
        seen = set()
        for m in comp:  # the shortest cycle through each of its modules, each cycle once
            ring = min(([m] if t == m else [m, *_chain(sub, t, m.__eq__)[:-1]] for t in sub[m]), key=len)  # m -> ... (-> m)
            key = tuple(ring[ring.index(min(ring)):] + ring[:ring.index(min(ring))])
            if key in seen:
                continue
            seen.add(key)
            cycle = [*key, key[0]]
            wheres = ", ".join(sub[a][b] for a, b in zip(cycle, cycle[1:]))
            out.append(f"import cycle {' -> '.join(cycle)} ({wheres})")
    return out


def test_import_rules_hold():
    found = _violations()
    assert not found, "\n".join(found)


def test_workbench_reaches_methods_only_through_its_doors():
    found = _reach_violations()
    assert not found, "\n".join(found)


def test_no_import_cycles():
    """Lazy imports in function bodies count: a cycle that closes only at call time still ties the modules together."""
    found = _cycles()
    assert not found, "\n".join(found)


@pytest.mark.parametrize("source,expected,where", [
    ("from workbench.figures import figure\n", "imports run down", "analysis"),
    ("from methods.far.hoyer import shrink\n", "public API", "analysis"),
    ("from workbench.data import _split\n", "private name", "analysis"),
    ("def f():\n    from methods.far import shrink\n", "figures import methods.far", "figures"),
    # a figure reaching methods.train through a module that merely happens to import it
    ({"workbench/compare.py": "def f():\n    from methods.train import resolve_device\n",
      "workbench/figures/_import_rule_probe.py": "from workbench.compare import f\n"},
     "e.g. workbench.figures._import_rule_probe -> workbench.compare -> methods.train", None),
    # a door used for what is not its own: FAR's pipeline importing Sparsifiner
    ({"workbench/pipelines/far/run.py": "from methods.sparsifiner import replace_attention\n"},
     "workbench.pipelines.far.run imports methods.sparsifiner but is no door to it", None),
    # plots reaching torch through a helper
    ({"workbench/xrutils.py": "def f():\n    import torch\n", "workbench/plots/_import_rule_probe.py":
      "from workbench.xrutils import f\n"}, "workbench.plots._import_rule_probe reaches torch", None),
    # a cycle that closes only in a function body
    ({"workbench/pipelines/_a.py": "from workbench.pipelines._b import g\n",
      "workbench/pipelines/_b.py": "def g():\n    from workbench.pipelines._a import h\n"},
     "import cycle workbench.pipelines._a -> workbench.pipelines._b -> workbench.pipelines._a", None),
])
def test_the_check_catches_violations(tmp_path, source, expected, where):
    """Probe modules in a tree of their own (not in the repository, which other xdist workers scan meanwhile)."""
    files = source if isinstance(source, dict) else {f"workbench/{where}/_import_rule_probe.py": source}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = [*_violations(tmp_path), *_reach_violations(tmp_path), *_cycles(tmp_path)]
    assert any(expected in v for v in found), found


def test_a_type_checking_import_is_no_edge(tmp_path):
    """Imports under ``if TYPE_CHECKING:`` never run: no reach, no cycle."""
    (tmp_path / "workbench" / "figures").mkdir(parents=True)
    (tmp_path / "workbench" / "figures" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from methods.train import fit\n")
    (tmp_path / "workbench" / "figures" / "b.py").write_text("from workbench.figures.a import x\n")
    assert _graph(tmp_path)["workbench.figures.a"] == {"typing": "workbench/figures/a.py:1"}
    assert _reach_violations(tmp_path) == [] and _cycles(tmp_path) == []
