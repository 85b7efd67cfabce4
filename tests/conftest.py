"""Shared test set-up: an isolated WORKBENCH_HOME, fixed seeds, quiet progress, one CPU thread, smoke teachers."""

from __future__ import annotations

import os

# One torch / OpenMP thread per process, for the subprocesses too (notebook kernels, CLI and torchrun launches): the
# suite's models are smoke-sized, ``-n auto`` already runs a worker per core, and extra threads only spin on a loaded
# CPU (an explanation step of the smoke gallery: 1-2 s on one thread, 3-5x that on two beside a busy neighbour).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ["WORKBENCH_PROGRESS"] = "0"


@pytest.fixture(scope="session", autouse=True)
def workbench_home(tmp_path_factory):
    """Every test session gets its own runs and stores directory; nothing touches ~/.cache.

    Under pytest-xdist (``-n auto``) the workers of one session share it, so a smoke run that several test files use
    is trained once (runs are locked per run id while trained; the other worker waits and reuses it)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        home = tmp_path_factory.getbasetemp().parent / "workbench_home"
        home.mkdir(exist_ok=True)
    else:
        home = tmp_path_factory.mktemp("workbench_home")
    old = os.environ.get("WORKBENCH_HOME")
    os.environ["WORKBENCH_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("WORKBENCH_HOME", None)
    else:
        os.environ["WORKBENCH_HOME"] = old


@pytest.fixture(scope="session", autouse=True)
def _one_cpu_thread():
    """torch on one CPU thread in this process (``OMP_NUM_THREADS`` above reaches it only if torch was not imported
    before this file); a test that needs another count sets it and restores it."""
    from methods.launch import cpu_threads

    with cpu_threads(1):
        yield


@pytest.fixture(scope="module")
def one_thread():
    """For modules of tiny models (``pytestmark = pytest.mark.usefixtures("one_thread")``): one thread is as fast
    alone and much faster on a shared, loaded 2-core CPU."""
    from methods.launch import cpu_threads

    with cpu_threads(1):
        yield


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="session")
def smoke_teacher():
    """Train (once per session) a smoke-profile demo teacher; returns its Run."""
    from workbench.pipelines.teacher import train_teacher

    cache = {}

    def get(arch: str):
        if arch not in cache:
            cache[arch] = train_teacher(arch, "smoke", device="cpu", log=lambda *_: None)
        return cache[arch]

    return get


@pytest.fixture
def private_runs(tmp_path, monkeypatch):
    """``private_runs(*runs) -> runs dir``: a WORKBENCH_HOME of this test's own holding only ``runs`` (linked) and the
    shared data cache, so "nothing was written" can be checked while other xdist workers write to the shared home."""
    from workbench.runs import home

    def make(*runs):
        shared = home()
        private = tmp_path / "private_home"
        (private / "runs").mkdir(parents=True)
        for run in runs:
            (private / "runs" / run.id).symlink_to(run.dir, target_is_directory=True)
        if (shared / "cache").exists():
            (private / "cache").symlink_to(shared / "cache", target_is_directory=True)
        monkeypatch.setenv("WORKBENCH_HOME", str(private))
        return private / "runs"

    return make
