"""workbench.figures.schedule: figure data computed after what it needs, in parallel workers; failures surface."""

from __future__ import annotations

import json
import os
import time

import _figure_data  # noqa: F401  (registers the test.* data)
import pytest

from workbench.figures import DATA, DataSpec, closure
from workbench.figures.schedule import prepare

pytestmark = pytest.mark.integration


def _records(path):
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    """A WORKBENCH_HOME of the test's own: stored figure data of one test must not satisfy another's."""
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PREPARE_TEST_LOG", str(tmp_path / "steps.jsonl"))
    return tmp_path / "steps.jsonl"


def test_closure_has_dependencies_and_rejects_unknown(monkeypatch):
    assert closure(["test.d"]) == {"test.d": ("test.b", "test.c"), "test.b": ("test.a",), "test.c": (), "test.a": ()}
    with pytest.raises(KeyError, match="unknown figure data 'test.nope'"):
        closure(["test.nope"])
    monkeypatch.setitem(DATA, "test.x", DataSpec("test.x", print, ("test.y",)))
    monkeypatch.setitem(DATA, "test.y", DataSpec("test.y", print, ("test.x",)))
    import graphlib

    with pytest.raises(graphlib.CycleError):
        prepare(["test.x"], jobs=1, log=lambda s: None, profile="smoke", device="cpu")


def test_a_function_after_is_resolved_when_the_closure_is_asked_for(monkeypatch):
    """``after`` as a function sees registrations made after the data was registered (import order)."""
    from workbench import figures as F

    seen = []
    monkeypatch.setitem(DATA, "test.lazy", DataSpec("test.lazy", print, lambda: seen.append(1) or tuple(
        s.after[0] for s in F.STUDENTS.values() if s.method == "test")))
    assert closure(["test.lazy"]) == {"test.lazy": ()}
    monkeypatch.setitem(F.STUDENTS, "toy", F.StudentSpec("toy", "test", "vit", ("test.b",), print))  # registered later
    assert closure(["test.lazy"]) == {"test.lazy": ("test.b",), "test.b": ("test.a",), "test.a": ()}
    assert len(seen) == 2  # resolved anew each time, not at registration


@pytest.mark.parametrize("jobs", [1, 2])
def test_each_step_once_after_its_dependencies_then_exclusive_ones_alone(fresh_home, jobs):
    lines, done, before = [], [], []
    took = prepare(["test.d", "test.timing"], jobs=jobs, log=lines.append, profile="smoke", device="cpu",
                   on_done=lambda i, s: done.append(i), before_exclusive=lambda ex: before.append((ex, list(done))))
    rec = _records(fresh_home)
    # told of the timing steps once every other step is done, before they run (workbench figures starts drawing there)
    assert before == [(["test.timing"], [i for i in done if i != "test.timing"])] and done[-1] == "test.timing"
    assert set(rec) == set(took) == set(done) == {"test.a", "test.b", "test.c", "test.d", "test.timing"}
    assert len(fresh_home.read_text().splitlines()) == 5  # each step once
    assert rec["test.b"]["start"] >= rec["test.a"]["end"]
    assert rec["test.d"]["start"] >= max(rec["test.b"]["end"], rec["test.c"]["end"])
    assert rec["test.timing"]["start"] >= max(r["end"] for i, r in rec.items() if i != "test.timing")  # alone, last
    assert rec["test.timing"]["pid"] == os.getpid()  # in this process
    assert any("test.a ran on profile smoke" in line for line in lines)  # worker log lines reach the parent
    if jobs == 2:
        assert all(r["pid"] != os.getpid() for i, r in rec.items() if i != "test.timing")  # in worker processes
    # a second prepare reads every stored Dataset back: nothing runs again
    prepare(["test.d", "test.timing"], jobs=jobs, log=lambda s: None, profile="smoke", device="cpu")
    assert len(fresh_home.read_text().splitlines()) == 5


def test_independent_steps_run_at_the_same_time(fresh_home):
    """p1 and p2 each wait until the other has started: they pass only when two workers run them together."""
    prepare(["test.p1", "test.p2"], jobs=2, log=lambda s: None, profile="smoke", device="cpu")
    rec = _records(fresh_home)
    assert set(rec) == {"test.p1", "test.p2"} and rec["test.p1"]["pid"] != rec["test.p2"]["pid"]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failing_step_raises_its_error_and_what_waits_never_starts(fresh_home, jobs):
    with pytest.raises(ValueError, match="/nope does not exist"):
        prepare(["test.fails", "test.d"], jobs=jobs, log=lambda s: None, profile="smoke", device="cpu")
    assert "test.d" not in (_records(fresh_home) if fresh_home.exists() else {})


def test_a_failure_stops_the_other_workers_at_once(fresh_home):
    """test.slow would sleep 60 s; a failure next to it must not wait for it to end."""
    lines = []
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="/nope does not exist"):
        prepare(["test.fails_now", "test.slow"], jobs=2, log=lines.append, profile="smoke", device="cpu")
    assert time.perf_counter() - t0 < 40
    assert any("[test.fails_now] failed" in line for line in lines) and any("stopping the workers" in line for line in lines)
    assert not fresh_home.exists()  # test.slow never finished


def test_registered_figures_read_registered_data_in_a_graph():
    from workbench.figures import load_all

    specs = load_all()
    graph = closure(dict.fromkeys(d for spec in specs.values() for d in spec.data))
    assert {"teacher.vit", "teacher.swin", "teacher.cnn"} <= set(graph)
    for spec in specs.values():
        assert spec.data and all(d in DATA for d in spec.data), spec.id


def test_a_cold_start_schedules_by_the_shipped_estimates():
    """Before any step was timed, the shipped demo estimates make the longest chain go first (not the most steps)."""
    from workbench.figures import FIGURES, load_all
    from workbench.figures.schedule import _priorities
    from workbench.figures.step_estimates import DEFAULT_SECONDS, estimate, estimates

    load_all()
    ours = sorted({d for f in FIGURES.values() for d in f.data if DATA[d].module.startswith("workbench.")})
    shared = {i: tuple(a for a in after if not DATA[a].exclusive)  # the workbench's own (tests register toy steps)
              for i, after in closure(ours).items() if not DATA[i].exclusive}
    assert estimates("demo")["teacher.vit"] > 60  # shipped: recorded by a measuring run
    assert estimate("paper", "teacher.vit") == estimate("demo", "no.such.step") == DEFAULT_SECONDS  # never measured
    prio = _priorities(shared, {i: estimate("demo", i) for i in shared})
    # the ViT teacher heads the longest chain (FAR, Sparsifiner, Non-deep and the comparison wait for it)
    roots = [i for i, after in shared.items() if not after]
    assert max(roots, key=prio.get) == "teacher.vit"
    assert prio["far.table3"] > prio["nondeep.memory"]  # a long step beats a short one with as long a chain of steps


def test_measured_seconds_are_recorded_as_estimates(tmp_path, monkeypatch):
    """A measuring run's step_seconds.json becomes the shipped estimates (merged, whole seconds)."""
    import json

    from workbench.figures import step_estimates as se

    shipped = tmp_path / "step_seconds.json"
    shipped.write_text(json.dumps({"demo": {"a": 5, "b": 7}}))
    monkeypatch.setattr(se, "SHIPPED", shipped)
    measured = tmp_path / "home" / "stores" / "demo" / "step_seconds.json"
    measured.parent.mkdir(parents=True)
    measured.write_text(json.dumps({"b": 2.6, "c": 11.2}))
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    assert se.main(["--profile", "demo"]) == 0
    assert json.loads(shipped.read_text()) == {"demo": {"a": 5, "b": 3, "c": 11}}
    assert se.estimates("demo", shipped) == {"a": 5, "b": 3, "c": 11}


def test_sigterm_stops_the_workers_too(tmp_path):
    """A `kill` (SIGTERM) of `workbench figures` ends its worker processes, not only the parent (they would go on
    training, holding their runs' locks)."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    script = ("import sys; sys.path.insert(0, 'tests'); import _figure_data\n"
              "from workbench.figures.schedule import prepare\n"
              "prepare(['test.slow', 'test.a'], jobs=2, log=print, profile='smoke', device='cpu')\n")
    env = {**os.environ, "WORKBENCH_HOME": str(tmp_path / "home"), "PREPARE_TEST_LOG": str(tmp_path / "steps.jsonl")}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])

    def children() -> list[int]:
        kids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == proc.pid:  # the parent pid
                kids.append(int(stat.parent.name))
        return kids

    for line in proc.stdout:
        if "[test.slow] started" in line:
            break
    time.sleep(1.0)
    workers = children()
    assert workers, "the pool's workers should be running"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) != 0

    def running(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.time() + 15
    alive = workers
    while alive and time.time() < deadline:
        alive = [p for p in alive if running(p)]
        time.sleep(0.2)
    assert not alive, f"workers {alive} outlived the parent"


def test_spawned_workers_start_with_the_malloc_settings_and_ours_stay_as_they_were(monkeypatch):
    """The pool's interpreters get MALLOC_ENV (glibc reads it at start-up), a value the user set wins, and the
    parent's environment is left as it was."""
    from workbench.figures.schedule import MALLOC_ENV, spawn_pool

    for key in MALLOC_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MALLOC_TOP_PAD_", "12345")  # the user's own setting
    pool = spawn_pool(1)
    try:
        seen = {key: pool.apply(os.getenv, (key,)) for key in MALLOC_ENV}
    finally:
        pool.terminate()
        pool.join()
    assert seen == {**MALLOC_ENV, "MALLOC_TOP_PAD_": "12345"}
    assert [k for k in MALLOC_ENV if k in os.environ] == ["MALLOC_TOP_PAD_"]


def test_after_the_timing_steps_this_process_draws_beside_the_drawing_worker(fresh_home, monkeypatch):
    """`workbench figures --jobs 2` with a timing step: the timing step alone in this process, drawing beside it in
    one worker that is handed one figure at a time; once the timing step is done, the main process draws the timing
    figure and takes the figures still waiting, so both processes draw and every figure is drawn once, with one
    index listing them all. (Data steps in the pool's workers: the tests above, through ``prepare``.)"""
    import _figure_draws

    from workbench.cli import main
    from workbench.figures import FIGURES

    _figure_draws.register()  # (again, should an earlier test have removed them)
    ids = [*_figure_draws.EARLY, *_figure_draws.LATE]
    try:
        out = fresh_home.parent / "figs"
        assert main(["figures", *ids, "--profile", "smoke", "--device", "cpu", "--jobs", "2", "--out", str(out)]) == 0
    finally:
        for i in ids:
            FIGURES.pop(i, None)
    assert _records(fresh_home)["test.timing"]["pid"] == os.getpid()  # the timing step: alone, here
    draws = [json.loads(line) for line in (fresh_home.parent / "steps.jsonl.draws").read_text().splitlines()]
    assert sorted(d["id"] for d in draws) == sorted(ids)  # each once
    by = {d["id"]: d["pid"] for d in draws}
    assert by["test.fig_timed"] == os.getpid()  # the timing step's figure: here, after it
    assert {by[i] for i in _figure_draws.EARLY} == {os.getpid(), by["test.fig0"]} and by["test.fig0"] != os.getpid()
    index = (out / "index.md").read_text()
    assert all(f"`{i}`" in index or i in index for i in ids)
    assert all((out / f"{i}.md").exists() and (out / f"{i}.csv").exists() for i in ids)
