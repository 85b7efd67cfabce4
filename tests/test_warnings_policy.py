"""Warnings our own code causes fail the tests (pyproject's ``filterwarnings``), and only ours.

xarray attributes a deprecation (e.g. ``xr.concat``'s ``join`` default, which becomes an error in a later xarray)
to the first frame outside xarray: the line of ours that called it. The filter's module field is a regex on that
module's name, so the probe below runs the same call from code whose ``__name__`` is ours, then someone else's.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr

SOURCE = "import xarray as xr\n\ndef combine(a, b):\n    return xr.concat([a, b], dim='run')  # join left to its default\n"
A = xr.Dataset({"v": ("x", [1.0, 2.0])}, coords={"x": [0, 1]})
B = xr.Dataset({"v": ("x", [3.0, 4.0])}, coords={"x": [1, 2]})  # other labels: the join matters


def _combine_as(module: str):
    namespace = {"__name__": module}  # warnings attribute a call to the module named here
    exec(compile(SOURCE, f"<{module}>", "exec"), namespace)
    return namespace["combine"]


def test_xarray_still_warns_elsewhere():
    """Someone else's call of the same deprecated default stays a warning (recorded, not raised) and runs."""
    with warnings.catch_warnings(record=True) as seen:
        out = _combine_as("someone_else")(A, B)
    joins = [w for w in seen if "join" in str(w.message)]
    if not joins:
        pytest.skip("this xarray no longer warns about concat's join default (nothing to turn into an error)")
    assert all(issubclass(w.category, FutureWarning) for w in joins)
    assert out.sizes == {"run": 2, "x": 3}  # the default (outer) join ran: both label sets kept
    assert np.isnan(out["v"].sel(run=0, x=2).item()) and out["v"].sel(run=1, x=2).item() == 4.0


@pytest.mark.parametrize("module", ["workbench", "workbench.figures.teacher", "methods.far.hoyer"])
def test_the_same_warning_from_our_code_is_an_error(module):
    with warnings.catch_warnings(record=True) as seen:
        _combine_as("someone_else")(A, B)
    if not seen:
        pytest.skip("this xarray no longer warns about concat's join default")
    with pytest.raises(FutureWarning, match="join"):
        _combine_as(module)(A, B)


def test_an_explicit_join_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = xr.concat([A, B], dim="run", join="outer", data_vars="all", coords="different", compat="no_conflicts")
    assert out.sizes == {"run": 2, "x": 3}
