"""Test figures for tests/test_schedule.py's drawing test, in a module of their own so that spawned drawing workers
import them (``workbench.figures.render`` imports a figure's module in the worker). Each table reads a ``test.*`` data
of :mod:`_figure_data`, takes 0.1 s and logs which process drew it to ``$PREPARE_TEST_LOG.draws``.
"""

from __future__ import annotations

import json
import os
import time

import _figure_data  # noqa: F401  (registers the test.* data the tables read)
import pandas as pd
import xarray as xr

from workbench.figures import figure
from workbench.plots.table import Table

#: the figures drawn beside the timing step, then by whichever process is free; and one of the timing step
EARLY = tuple(f"test.fig{n}" for n in range(6))
LATE = ("test.fig_timed",)


def _drawn_by(ds: xr.Dataset, name: str) -> Table:
    time.sleep(0.1)
    with open(os.environ["PREPARE_TEST_LOG"] + ".draws", "a") as f:
        f.write(json.dumps({"id": name, "pid": os.getpid()}) + "\n")
    return Table(pd.DataFrame({"value": [int(ds["value"][0])]}), title=name)


def register() -> None:
    for name in EARLY:
        figure(name, paper="test", caption="a test table", data="test.c", kind="table",
               plot=lambda ds, name=name: _drawn_by(ds, name))
    figure(LATE[0], paper="test", caption="a table of the timing step", data="test.timing", kind="table",
           plot=lambda ds: _drawn_by(ds, LATE[0]))


register()
