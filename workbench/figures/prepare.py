"""Prepare what figures need (runs, analysis stores) in parallel worker processes, then draw.

Most of ``workbench figures --all`` is training: three demo teachers and the methods' runs, each a
small model that keeps one CPU thread busy. They form a dependency graph (FAR after the ViT teacher,
SlimSwin after the Swin teacher, ...), so a figure module registers *steps* with :func:`step`: a
named callable that trains or reuses runs, or computes analysis stores, through the same
:class:`~workbench.figures.Context` the builders use, and names the steps it comes after. A figure
lists the steps it needs (``FigureSpec.steps``). :func:`prepare` runs the closure of those steps in
up to ``jobs`` processes, always starting the ready step with the longest remaining chain
(its cost plus its longest chain of dependants), and stops at the first failure. The builders then
only read what is cached. Runs are checkpointed every epoch and locked per run, so an interrupted
prepare resumes where it stopped, and a step that is already done costs a cache lookup.

Worker processes are spawned (not forked: torch and fork do not mix), get ``cpu_count // jobs``
threads each, turn off tqdm bars (several bars from several processes garble a terminal) and send
their log lines and per-epoch metrics to the parent, which prints them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Iterable

__all__ = ["Step", "STEPS", "step", "closure", "prepare", "default_jobs"]


@dataclass(frozen=True)
class Step:
    """A prerequisite of figures: trains or reuses runs, or computes analysis stores."""

    id: str  # e.g. "teacher-vit", "far", "far.maps"
    after: tuple[str, ...]  # steps whose results this one uses
    cost: float  # rough seconds on one CPU thread in the demo profile; only orders the schedule
    make: Callable[..., object]  # make(ctx: Context): fills the caches the figures read
    module: str  # where it is registered (a spawned worker imports it to find the step)


STEPS: dict[str, Step] = {}


def step(id: str, *, after: tuple[str, ...] = (), cost: float = 1.0):
    """Decorator registering a preparation step (see the module docstring)."""

    def deco(fn: Callable[..., object]) -> Callable[..., object]:
        STEPS[id] = Step(id, tuple(after), float(cost), fn, fn.__module__)
        return fn

    return deco


def closure(ids: Iterable[str]) -> list[str]:
    """The steps ``ids`` need, dependencies first.

    Raises:
        KeyError: a step id nobody registered (a figure module's mistake).
    """
    order: list[str] = []

    def visit(i: str, path: tuple[str, ...]) -> None:
        if i not in STEPS:
            raise KeyError(f"unknown preparation step {i!r} (known: {', '.join(sorted(STEPS))})")
        if i in path:
            raise ValueError(f"preparation steps form a cycle: {' -> '.join(path + (i,))}")
        if i in order:
            return
        for a in STEPS[i].after:
            visit(a, path + (i,))
        order.append(i)

    for i in ids:
        visit(i, ())
    return order


def default_jobs(device: str) -> int:
    """Worker processes for ``--jobs auto``: one per CPU core on the CPU (each step uses one thread),
    one on a GPU (the steps then share the accelerator, not the cores)."""
    from methods.train import resolve_device

    if resolve_device(device).type != "cpu":
        return 1
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def _priorities(ids: list[str]) -> dict[str, float]:
    """Each step's cost plus the costliest chain of steps (among ``ids``) that wait for it."""
    prio: dict[str, float] = {}
    for i in reversed(ids):  # dependants come later in a topological order
        after_me = [prio[j] for j in ids if i in STEPS[j].after and j in prio]
        prio[i] = STEPS[i].cost + max(after_me, default=0.0)
    return prio


def prepare(ids: Iterable[str], *, jobs: int, profile: str = "demo", device: str = "auto", force: bool = False,
            log: Callable[[str], None] = print, on_done: Callable[[str, float], None] | None = None) -> dict[str, float]:
    """Run the steps ``ids`` need (dependencies first), in up to ``jobs`` processes.

    Args:
        ids: steps the selected figures list.
        jobs: worker processes; 1 runs every step here, in order, with the usual progress bars.
        profile, device, force: the :class:`~workbench.figures.Context` the steps get.
        log: where log lines (also the workers') go.
        on_done: called with (step id, seconds) when a step finishes.

    Returns:
        step id -> wall seconds it took.

    Raises:
        Whatever a step raised (the first failure); steps not yet started are cancelled.
    """
    order = closure(ids)
    took: dict[str, float] = {}
    if jobs <= 1 or len(order) <= 1:
        from workbench.figures import Context

        ctx = Context(profile, device, force, log=log)
        for i in order:
            t0 = time.perf_counter()
            STEPS[i].make(ctx)
            took[i] = time.perf_counter() - t0
            if on_done:
                on_done(i, took[i])
        return took

    prio = _priorities(order)
    spawn = mp.get_context("spawn")
    messages = spawn.Queue()
    threads = max(1, (os.cpu_count() or 1) // jobs)
    pending, running = set(order), {}  # running: Future -> step id
    with ProcessPoolExecutor(max_workers=jobs, mp_context=spawn, initializer=_init_worker,
                             initargs=(messages, threads)) as pool:
        try:
            while pending or running:
                ready = sorted((i for i in pending if all(a in took for a in STEPS[i].after)), key=lambda i: -prio[i])
                assert ready or running, f"steps {sorted(pending)} can never start"  # closure() includes every dependency
                for i in ready[: jobs - len(running)]:
                    pending.discard(i)
                    log(f"[{i}] started")
                    running[pool.submit(_run_step, i, STEPS[i].module, profile, device, force)] = i
                done = _wait_draining(running, messages, log)
                for fut in done:
                    i = running.pop(fut)
                    if fut.exception() is not None:
                        log(f"[{i}] failed: {fut.exception()}")
                        if running:
                            log(f"stopping {', '.join(running.values())}; the same command resumes from their last checkpoints")
                    took[i] = fut.result()  # re-raises the worker's exception
                    log(f"[{i}] done in {took[i]:.0f} s")
                    if on_done:
                        on_done(i, took[i])
        except BaseException:
            _stop_workers(pool)  # do not wait minutes for the other branch's epoch to end
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            _drain(messages, log)
    return took


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate the pool's worker processes (runs checkpoint every epoch and write atomically)."""
    terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if terminate is not None:
        terminate()
        return
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.terminate()


def _wait_draining(running: dict[Future, str], messages, log) -> set[Future]:
    while True:
        done, _ = wait(running, timeout=0.25, return_when=FIRST_COMPLETED)
        _drain(messages, log)
        if done:
            return done


def _drain(messages, log) -> None:
    while True:
        try:
            log(messages.get_nowait())
        except (queue_mod.Empty, OSError, ValueError):
            return


# --------------------------------------------------------------------------------- worker side
_MESSAGES = None


def _init_worker(messages, threads: int) -> None:
    global _MESSAGES
    _MESSAGES = messages
    os.environ["WORKBENCH_PROGRESS"] = "0"  # methods.train's epoch bars
    os.environ["TQDM_DISABLE"] = "1"  # any other tqdm bar (tqdm >= 4.66 reads defaults from TQDM_* variables)
    import torch

    torch.set_num_threads(threads)


def _send(line: str) -> None:
    _MESSAGES.put(line)


def _run_step(step_id: str, module: str, profile: str, device: str, force: bool) -> float:
    import importlib

    from workbench import runs
    from workbench.figures import Context

    importlib.import_module(module)  # a spawned process starts with empty registries

    def on_epoch(run, epoch: int, metrics: dict) -> None:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k in ("phase", "train_loss", "val_acc")
                          and isinstance(v, (int, float))) or ""
        phase = f" {metrics['phase']}" if isinstance(metrics.get("phase"), str) else ""
        _send(f"[{step_id}] {run.id}{phase} epoch {epoch}: {shown}")

    runs.EPOCH_LISTENERS.append(on_epoch)  # this worker may run more steps later: removed below
    try:
        t0 = time.perf_counter()
        STEPS[step_id].make(Context(profile, device, force, log=lambda s: _send(f"[{step_id}] {s}")))
        return time.perf_counter() - t0
    finally:
        runs.EPOCH_LISTENERS.remove(on_epoch)
