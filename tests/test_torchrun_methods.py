"""Every method's run under a 2-process ``torchrun`` (gloo on the CPU), and the device / backend set-up of a rank.

The integration half launches ``workbench`` as a user would (``python -m torch.distributed.run --nproc_per_node 2``)
on the smoke profile with tiny budgets: the demo ViT teacher, then FAR (distilled -> pruned), Sparsifiner (phase 1
-> phase 2), Non-deep ViT (branched -> collapsed), AttentionLite and SlimSwin on the session's CNN and Swin teachers. Every launch must exit 0 (torchrun
fails when any rank does), every run must be complete, and every file under ``runs/`` must be written by rank 0 alone:
an audit hook (``sys.addaudithook``) in each rank records the files it opens for writing, renames, makes or removes.

The unit half stands in for a GPU host: ``init_distributed`` / ``resolve_device`` with CUDA availability, the device
count and the process-group calls monkeypatched (a cuda device joins NCCL, cpu joins gloo whatever the host has;
``LOCAL_RANK`` k gets ``cuda:k`` and is made current; more processes than GPUs is a clear error).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TINY = ["--images", "64", "--batch-size", "32", "--profile", "smoke", "--device", "cpu"]

#: Runs ``workbench.cli`` with an audit hook recording what this rank writes under $WORKBENCH_HOME/runs.
AUDITED = '''
import atexit, os, runpy, sys

RUNS = os.path.realpath(os.path.join(os.environ["WORKBENCH_HOME"], "runs"))
WRITES = []
EVENTS = {"os.rename": 1, "os.remove": 0, "os.mkdir": 0, "os.rmdir": 0, "shutil.rmtree": 0}  # event -> path arg


def inside(path):
    try:
        return os.path.realpath(os.fsdecode(path)).startswith(RUNS)
    except (TypeError, ValueError):
        return False


def hook(event, args):
    if event == "open":
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & (os.O_WRONLY | os.O_RDWR))
        if writes and inside(path):
            WRITES.append(f"open {os.fsdecode(path)}")
    elif event in EVENTS and inside(args[EVENTS[event]]):
        WRITES.append(f"{event} {os.fsdecode(args[EVENTS[event]])}")


@atexit.register
def dump():
    with open(os.path.join(os.environ["AUDIT_DIR"], f"rank{os.environ['RANK']}.json"), "w") as f:
        f.write(__import__("json").dumps(WRITES))


sys.addaudithook(hook)
sys.argv = ["workbench", *sys.argv[1:]]
runpy.run_module("workbench.cli", run_name="__main__")
'''


# ------------------------------------------------------------------------------------------ 2 ranks, every method
@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """``launch(*args) -> (run dir, writes by rank)``: one audited 2-process torchrun of ``workbench *args``."""
    tmp = tmp_path_factory.mktemp("torchrun")
    home, script = tmp / "home", tmp / "audited.py"
    script.write_text(AUDITED)
    count = iter(range(100))

    def run(*args: str) -> tuple[Path, dict[int, list[str]]]:
        audit = tmp / f"audit{next(count)}"
        audit.mkdir()
        env = {**os.environ, "WORKBENCH_HOME": str(home), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
               "WORKBENCH_PROGRESS": "0", "AUDIT_DIR": str(audit)}
        res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                              str(script), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
        lines = [line for line in res.stdout.splitlines() if line.startswith("run: ")]
        assert len(lines) == 1, res.stdout  # rank 0 alone reports
        writes = {r: json.loads((audit / f"rank{r}.json").read_text()) for r in (0, 1)}  # both ranks ended normally
        return Path(lines[0].removeprefix("run: ")), writes

    run.home = home
    return run


@pytest.fixture(scope="module")
def teachers(launch, smoke_teacher):
    """The demo teachers: arch -> run dir. The ViT teacher is trained by a 2-process torchrun (audited like the
    methods); the Swin and CNN teachers, trained by the same code path (each launch costs ~17 s of CPU, most of it
    three interpreters importing torch), are the session's one-process smoke teachers."""
    import shutil

    vit, writes = launch("train", "teacher", "--arch", "vit", "--epochs", "1", *TINY)
    _written_once(writes)
    out = {"vit": vit}
    for arch in ("swin", "cnn"):  # copied into the launches' home, where the students look their teacher up
        run = smoke_teacher(arch)
        out[arch] = Path(shutil.copytree(run.dir, launch.home / "runs" / run.dir.name))
    return out


def _written_once(writes: dict[int, list[str]]) -> None:
    assert any(w.endswith("/manifest.json") and w.startswith("os.rename") for w in writes[0]), writes[0]  # seen at all
    assert writes[1] == [], writes[1]


def _complete(home: Path, prefixes: tuple[str, ...]) -> None:
    runs = {p.name: json.loads((p / "manifest.json").read_text()) for p in (home / "runs").iterdir()
            if (p / "manifest.json").exists()}
    for prefix in prefixes:
        (hit,) = [m for name, m in runs.items() if name.startswith(prefix + "-")]
        assert hit["status"] == "complete", hit


CHAINS = {  # method -> (teacher arch, the CLI's options, the runs it makes: id prefixes)
    "far": ("vit", ["--epochs", "1"], ("far", "far_pruned")),
    "sparsifiner": ("vit", ["--keep-rate", "0.25", "--epochs", "1"], ("sparsifiner_phase1", "sparsifiner-k0.25")),
    "nondeep": ("vit", ["--branches", "2", "--steps", "2"], ("nondeep_branched-n2", "nondeep-n2")),
    "attentionlite": ("cnn", ["--epochs", "1"], ("attentionlite-irregular",)),
    "slimswin": ("swin", ["--ratio", "0.3", "--epochs", "1"], ("slimswin-r0.30",)),
}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("method", list(CHAINS))
def test_every_method_under_two_torchrun_ranks(launch, teachers, method):
    arch, options, made = CHAINS[method]
    run, writes = launch("run", method, "--teacher", str(teachers[arch]), *options, *TINY)
    _written_once(writes)
    _complete(launch.home, made)
    assert run.name.startswith(made[-1] + "-")


# ------------------------------------------------------------------------------------------ a rank's device and backend
@pytest.fixture
def host(monkeypatch):
    """A torchrun rank on a host with ``gpus`` GPUs (set ``host.gpus``), the process group's calls recorded."""
    import torch.distributed as dist

    calls: dict[str, list] = {"init": [], "set_device": []}
    state = {"on": False}

    class Host:
        gpus = 2

        def rank(self, rank: int, world: int = 2) -> None:
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", str(world))
            monkeypatch.setenv("LOCAL_RANK", str(rank))
            monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world))

    h = Host()
    h.calls = calls

    def init(backend, **kw):
        calls["init"].append((backend, kw.get("device_id")))
        state["on"] = True

    monkeypatch.setattr(torch.cuda, "is_available", lambda: h.gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: h.gpus)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls["set_device"].append(int(d)))
    monkeypatch.setattr(dist, "init_process_group", init)
    monkeypatch.setattr(dist, "is_initialized", lambda: state["on"])
    monkeypatch.setattr(dist, "get_rank", lambda: int(os.environ["RANK"]))
    monkeypatch.setattr(dist, "get_world_size", lambda: int(os.environ["WORLD_SIZE"]))
    return h


def test_cuda_device_joins_nccl_on_the_rank_gpu(host):
    from methods.launch import init_distributed, resolve_device

    host.rank(1)
    assert resolve_device("cuda") == torch.device("cuda", 1) == resolve_device("auto")
    assert init_distributed("cuda") == (1, 2)
    assert host.calls["init"] == [("nccl", torch.device("cuda", 1))]
    assert set(host.calls["set_device"]) == {1}


def test_cpu_device_joins_gloo_on_a_gpu_host(host):
    from methods.launch import init_distributed, resolve_device

    host.rank(1)
    assert resolve_device("cpu") == torch.device("cpu")
    assert init_distributed("cpu") == (1, 2)
    assert host.calls == {"init": [("gloo", None)], "set_device": []}


def test_more_ranks_than_gpus_is_a_clear_error(host):
    from methods.launch import init_distributed, resolve_device

    host.gpus = 1
    host.rank(1)
    with pytest.raises(RuntimeError, match=r"2 processes on this host, which has 1 GPU.*--nproc_per_node 1"):
        resolve_device("cuda")
    with pytest.raises(RuntimeError, match="--nproc_per_node 1"):
        init_distributed("cuda")
    assert host.calls == {"init": [], "set_device": []}
    host.rank(0, world=1)  # one process on the one GPU is fine
    assert resolve_device("cuda") == torch.device("cuda", 0)


def test_another_rank_gpu_is_refused_and_no_torchrun_keeps_cuda(host, monkeypatch):
    from methods.launch import resolve_device

    host.rank(1)
    with pytest.raises(RuntimeError, match=r"cuda:1 here.*give --device cuda"):
        resolve_device("cuda:0")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var)
    host.calls["set_device"].clear()
    assert resolve_device("cuda") == torch.device("cuda") and host.calls["set_device"] == []


def test_rank_is_known_before_the_group_exists(host, monkeypatch):
    """is_main before init_distributed reads the launch's RANK (writes before the group are made once), and
    main_decides refuses to guess without the group."""
    from methods.launch import is_main, main_decides

    host.rank(1)
    assert not is_main()
    with pytest.raises(RuntimeError, match="init_distributed"):
        main_decides("train")
    host.rank(0)
    assert is_main()
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var)
    assert is_main() and main_decides("train") == "train"
