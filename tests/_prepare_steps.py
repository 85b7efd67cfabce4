"""Preparation steps for tests/test_prepare.py, in a module of their own so that spawned workers import them.

Each step appends ``{"id", "start", "end", "pid"}`` to the JSON-lines file named by ``$PREPARE_TEST_LOG``.
"""

from __future__ import annotations

import json
import os
import time

from workbench.figures.prepare import step


def _record(ctx, step_id: str, seconds: float = 0.3) -> None:
    start = time.time()
    time.sleep(seconds)
    ctx.log(f"{step_id} ran on profile {ctx.profile.name}")
    with open(os.environ["PREPARE_TEST_LOG"], "a") as f:
        f.write(json.dumps({"id": step_id, "start": start, "end": time.time(), "pid": os.getpid()}) + "\n")


@step("test.a", cost=10)
def a(ctx):
    _record(ctx, "test.a")


@step("test.b", after=("test.a",), cost=5)
def b(ctx):
    _record(ctx, "test.b")


@step("test.c", cost=1)
def c(ctx):
    _record(ctx, "test.c")


@step("test.d", after=("test.b", "test.c"), cost=1)
def d(ctx):
    _record(ctx, "test.d", 0.0)


@step("test.fails", after=("test.a",), cost=1)
def fails(ctx):
    raise ValueError("step test.fails: the data path /nope does not exist")


def _rendezvous(ctx, me: str, other: str) -> None:
    """Mark ``me`` started and wait (<= 60 s) until ``other`` has started too: only passes if both run at once."""
    folder = os.path.dirname(os.environ["PREPARE_TEST_LOG"])
    open(os.path.join(folder, f"{me}.started"), "w").close()
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(folder, f"{other}.started")):
        if time.time() > deadline:
            raise TimeoutError(f"{other} never started while {me} was running")
        time.sleep(0.05)
    _record(ctx, me, 0.0)


@step("test.p1", cost=1)
def p1(ctx):
    _rendezvous(ctx, "test.p1", "test.p2")


@step("test.p2", cost=1)
def p2(ctx):
    _rendezvous(ctx, "test.p2", "test.p1")


@step("test.fails_now", cost=1)
def fails_now(ctx):
    time.sleep(1.0)  # let test.slow start on the other worker
    raise ValueError("step test.fails_now: the data path /nope does not exist")


@step("test.slow", cost=100)
def slow(ctx):
    time.sleep(60)
    _record(ctx, "test.slow", 0.0)
