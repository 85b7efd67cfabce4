"""No function over 80 lines outside plotting code (the developers' guide: functions under ~60, never over 80).

One test per source file of ``methods/`` and ``workbench/``, so a failure names the file and its long functions
(``name:lines``). Plotting code is exempt: everything under ``workbench/plots/``, the ``plot_*`` functions of
``workbench/figures/``, and the drawing functions listed in :data:`PLOTTING` (an explicit list, drawing only).
A function's length counts from its ``def`` line to its last line (docstring and nested functions included,
decorators not).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 80
PLOTTING_DIRS = ("workbench/plots/",)  # every function here draws
#: drawing functions outside workbench/plots/ and not named plot_* (file -> names); nothing else may be listed here
PLOTTING = {
    "workbench/explore/snapshot.py": {"draw"},  # matplotlib figure of the explorer's current view
}
FILES = sorted(str(p.relative_to(ROOT)) for d in ("methods", "workbench") for p in (ROOT / d).rglob("*.py"))


def long_functions(source: str, limit: int = LIMIT) -> dict[str, int]:
    """Function name -> lines, for every (possibly nested) function of ``source`` longer than ``limit`` lines."""
    return {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit}


def is_plotting(path: str, name: str) -> bool:
    return (path.startswith(PLOTTING_DIRS) or (path.startswith("workbench/figures/") and name.startswith("plot_"))
            or name in PLOTTING.get(path, ()))


def test_the_measure_counts_def_to_last_line():
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT - 1))
    assert long_functions(f"def ok():\n{body}\n") == {}  # LIMIT lines: allowed
    assert long_functions(f"@deco\ndef long():\n{body}\n    return x0\n") == {"long": LIMIT + 1}
    nested = f"def outer():\n    def inner():\n{body.replace('    ', '        ')}\n        return 0\n    return inner\n"
    assert long_functions(nested) == {"outer": LIMIT + 3, "inner": LIMIT + 1}
    assert is_plotting("workbench/plots/attention.py", "plot_cls_maps")
    assert is_plotting("workbench/figures/far/items.py", "plot_order")
    assert not is_plotting("workbench/figures/compare/items.py", "_rows")


def test_the_plotting_list_names_existing_functions():
    for path, names in PLOTTING.items():
        tree = ast.parse((ROOT / path).read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert names <= defined, f"{path}: {sorted(names - defined)} no longer exist; remove them from PLOTTING"


@pytest.mark.parametrize("path", FILES)
def test_no_function_over_80_lines_outside_plotting(path):
    found = long_functions((ROOT / path).read_text())
    too_long = {name: n for name, n in found.items() if not is_plotting(path, name)}
    assert not too_long, (f"{path}: " + ", ".join(f"{name}:{n}" for name, n in sorted(too_long.items()))
                          + f" (over {LIMIT} lines; split into named steps)")
