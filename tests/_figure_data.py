"""Figure data functions for tests/test_schedule.py, in a module of their own so that spawned workers import them.

Each appends ``{"id", "start", "end", "pid"}`` to the JSON-lines file named by ``$PREPARE_TEST_LOG`` and returns a
one-variable Dataset.
"""

from __future__ import annotations

import json
import os
import time

import xarray as xr

from workbench.figures import dataset


def _record(ctx, step_id: str, seconds: float = 0.3) -> xr.Dataset:
    start = time.time()
    time.sleep(seconds)
    ctx.log(f"{step_id} ran on profile {ctx.profile.name}")
    with open(os.environ["PREPARE_TEST_LOG"], "a") as f:
        f.write(json.dumps({"id": step_id, "start": start, "end": time.time(), "pid": os.getpid()}) + "\n")
    return xr.Dataset({"value": ("i", [len(step_id)])})


@dataset("test.a")
def a(ctx):
    return _record(ctx, "test.a")


@dataset("test.b", after=("test.a",))
def b(ctx):
    assert int(ctx.data("test.a")["value"][0]) == 6  # reads what its dependency stored
    return _record(ctx, "test.b")


@dataset("test.c")
def c(ctx):
    return _record(ctx, "test.c")


@dataset("test.d", after=("test.b", "test.c"))
def d(ctx):
    return _record(ctx, "test.d", 0.0)


@dataset("test.timing", after=("test.a",), exclusive=True)
def timing(ctx):
    return _record(ctx, "test.timing", 0.0)


@dataset("test.fails", after=("test.a",))
def fails(ctx):
    raise ValueError("step test.fails: the data path /nope does not exist")


def _rendezvous(ctx, me: str, other: str) -> xr.Dataset:
    """Mark ``me`` started and wait (<= 60 s) until ``other`` has started too: only passes if both run at once."""
    folder = os.path.dirname(os.environ["PREPARE_TEST_LOG"])
    open(os.path.join(folder, f"{me}.started"), "w").close()
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(folder, f"{other}.started")):
        if time.time() > deadline:
            raise TimeoutError(f"{other} never started while {me} was running")
        time.sleep(0.05)
    return _record(ctx, me, 0.0)


@dataset("test.p1")
def p1(ctx):
    return _rendezvous(ctx, "test.p1", "test.p2")


@dataset("test.p2")
def p2(ctx):
    return _rendezvous(ctx, "test.p2", "test.p1")


@dataset("test.fails_now")
def fails_now(ctx):
    time.sleep(1.0)  # let test.slow start on the other worker
    raise ValueError("step test.fails_now: the data path /nope does not exist")


@dataset("test.slow")
def slow(ctx):
    time.sleep(60)
    return _record(ctx, "test.slow", 0.0)

