"""workbench.figures.prepare: steps run after what they need, in parallel worker processes, failures surface."""

from __future__ import annotations

import json
import os

import pytest

import _prepare_steps  # noqa: F401  (registers the test.* steps)
from workbench.figures.prepare import STEPS, closure, prepare


def _records(path):
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_closure_orders_dependencies_first_and_rejects_unknown_and_cycles(monkeypatch):
    order = closure(["test.d"])
    assert set(order) == {"test.a", "test.b", "test.c", "test.d"}
    assert order.index("test.a") < order.index("test.b") < order.index("test.d") and order.index("test.c") < order.index("test.d")
    with pytest.raises(KeyError, match="unknown preparation step 'test.nope'"):
        closure(["test.nope"])
    monkeypatch.setitem(STEPS, "test.x", STEPS["test.a"].__class__("test.x", ("test.y",), 1, print, __name__))
    monkeypatch.setitem(STEPS, "test.y", STEPS["test.a"].__class__("test.y", ("test.x",), 1, print, __name__))
    with pytest.raises(ValueError, match="cycle"):
        closure(["test.x"])


@pytest.mark.parametrize("jobs", [1, 2])
def test_prepare_runs_each_step_once_after_its_dependencies(tmp_path, monkeypatch, jobs):
    log_file = tmp_path / "steps.jsonl"
    monkeypatch.setenv("PREPARE_TEST_LOG", str(log_file))
    lines, done = [], []
    took = prepare(["test.d"], jobs=jobs, log=lines.append, profile="smoke", device="cpu",
                   on_done=lambda i, s: done.append(i))
    rec = _records(log_file)
    assert set(rec) == set(took) == set(done) == {"test.a", "test.b", "test.c", "test.d"}
    assert len(log_file.read_text().splitlines()) == 4  # each step once
    assert rec["test.b"]["start"] >= rec["test.a"]["end"]
    assert rec["test.d"]["start"] >= max(rec["test.b"]["end"], rec["test.c"]["end"])
    assert any("test.a ran on profile smoke" in line for line in lines)  # worker log lines reach the parent
    if jobs == 2:
        assert all(r["pid"] != os.getpid() for r in rec.values())  # in worker processes


def test_independent_steps_run_at_the_same_time(tmp_path, monkeypatch):
    """p1 and p2 each wait until the other has started: they pass only when two workers run them together."""
    monkeypatch.setenv("PREPARE_TEST_LOG", str(tmp_path / "steps.jsonl"))
    prepare(["test.p1", "test.p2"], jobs=2, log=lambda s: None, profile="smoke", device="cpu")
    rec = _records(tmp_path / "steps.jsonl")
    assert set(rec) == {"test.p1", "test.p2"} and rec["test.p1"]["pid"] != rec["test.p2"]["pid"]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failing_step_raises_its_error_and_cancels_what_waits(tmp_path, monkeypatch, jobs):
    log_file = tmp_path / "steps.jsonl"
    monkeypatch.setenv("PREPARE_TEST_LOG", str(log_file))
    with pytest.raises(ValueError, match="/nope does not exist"):
        prepare(["test.fails", "test.d"], jobs=jobs, log=lambda s: None, profile="smoke", device="cpu")
    assert "test.d" not in _records(log_file)  # never started: it comes after test.b, queued behind the failure


def test_a_failure_stops_the_other_workers_at_once(tmp_path, monkeypatch):
    """test.slow would sleep 60 s; a failure next to it must not wait for it to end."""
    import time

    monkeypatch.setenv("PREPARE_TEST_LOG", str(tmp_path / "steps.jsonl"))
    lines = []
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="/nope does not exist"):
        prepare(["test.fails_now", "test.slow"], jobs=2, log=lines.append, profile="smoke", device="cpu")
    assert time.perf_counter() - t0 < 40
    assert any("[test.fails_now] failed" in line for line in lines) and any("stopping test.slow" in line for line in lines)
    assert not (tmp_path / "steps.jsonl").exists()  # test.slow never finished


def test_registered_figure_steps_form_a_graph():
    from workbench.figures import load_all

    specs = load_all()
    order = closure(dict.fromkeys(s for spec in specs.values() for s in spec.steps))
    assert {"teacher-vit", "teacher-swin", "teacher-cnn", "far", "slimswin"} <= set(order)
    assert order.index("teacher-vit") < order.index("far") and order.index("teacher-swin") < order.index("slimswin")
    for spec in specs.values():  # every figure that trains or analyses names a step
        if spec.needs:
            assert spec.steps, spec.id
