"""The runnable examples of the public entry points' docstrings, run as doctests (as xarray runs its docs' examples).

Each entry point carries a short example (tiny random-weight models, scikit-image's bundled photos, temporary folders;
nothing downloaded) that prints shapes and values a reader can check. One test per module runs every example in it
with :mod:`doctest` and fails on any failure (the failing example and its output are printed); it also fails when an
entry point has no example. The session's ``WORKBENCH_HOME`` is a temporary folder (conftest), progress bars are off.
"""

from __future__ import annotations

import doctest
import importlib
import warnings

import pytest

from workbench.provenance import RandomInitWarning

#: module -> the public entry points it defines (each must carry an example)
ENTRY_POINTS = {
    "workbench.models": ("load_model",),
    "workbench.data": ("load_images",),
    "workbench.analysis": ("get_extractor",),
    "workbench.compare": ("compare",),
    "workbench.explore.widget": ("explore",),
    "workbench.scale.stream": ("stream_analysis",),
    "workbench.scale.reduce": ("reduce_store",),
    "workbench.pipelines": ("run_method",),
}


@pytest.mark.parametrize("module", sorted(ENTRY_POINTS))
def test_docstring_examples_run(module, capsys):
    mod = importlib.import_module(module)
    finder = doctest.DocTestFinder()
    without = [name for name in ENTRY_POINTS[module]
               if not any(t.examples for t in finder.find(getattr(mod, name), f"{module}.{name}"))]
    assert not without, f"{module}: no runnable example in the docstring of {without}"
    with warnings.catch_warnings():
        # timm names without a checkpoint: the examples' random weights are the point, the warning says so each time
        warnings.simplefilter("ignore", RandomInitWarning)
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=True)
    report = capsys.readouterr().out
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {module} failed:\n{report}"


def test_a_wrong_example_fails():
    """The check can fail: an example whose printed value is wrong is reported as a failure."""

    def wrong():
        """
        >>> 1 + 1
        3
        """

    test = doctest.DocTestFinder().find(wrong, "wrong", globs={})[0]
    runner = doctest.DocTestRunner()
    runner.run(test, out=lambda _: None)
    assert runner.summarize(verbose=False).failed == 1
