"""Compute the figures' data in parallel worker processes (the preparation phase of ``workbench figures``).

Most of ``workbench figures --all`` is training: three demo teachers and the methods' runs, each a
small model that keeps one CPU thread busy. The data functions (:func:`workbench.figures.dataset`)
form a dependency graph (FAR's data after the ViT teacher's, SlimSwin's after the Swin teacher's...),
so :func:`prepare` walks it with :class:`graphlib.TopologicalSorter` in a ``multiprocessing`` pool
of ``jobs`` spawned workers (not forked: torch and fork do not mix), each on ``cores // jobs``
threads. Among the ready steps it starts the one with the longest remaining chain, measured in the
seconds each step took last time (remembered per profile; a step never timed here counts its estimate from
:mod:`workbench.figures.step_estimates`, or one second).
Workers log through :class:`logging.handlers.QueueHandler`; the parent prints their lines and
per-epoch metrics. The first failure terminates the pool (runs checkpoint every epoch, so the same
command resumes). Steps that time models (``exclusive=True``) run afterwards in this process, with no training
beside them; ``workbench figures`` draws the figures that do not need them meanwhile, in one process on the other
core (one single-threaded drawing process moved single-thread latencies by 2-5%, within the 4% spread between
two runs alone, and left the latency ratios unchanged: DeiT-S/FAR-S at 224², measured side by side).
"""

from __future__ import annotations

import graphlib
import json
import logging
import logging.handlers
import multiprocessing as mp
import os
import queue
import time
from typing import Callable, Iterable

from workbench.figures import DATA, closure

__all__ = ["prepare", "default_jobs", "spawn_pool"]

LOGGER = "workbench.figures"


def default_jobs(device: str) -> int:
    """One worker per CPU core on the CPU (each step uses one thread); one on a GPU (the steps share it)."""
    from workbench.runtime import resolve_device

    if resolve_device(device).type != "cpu":
        return 1
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


#: glibc malloc settings of the spawned workers (read by glibc when a process starts; other allocators ignore them).
#: By default glibc serves every block over 128 KiB-32 MiB with its own ``mmap`` and unmaps it on ``free``, so each
#: training step's activations and gradients are fresh pages again: 4x the page faults. Keeping them in the heap
#: leaves the arithmetic as it was (bit-identical checkpoints) and cut a SlimSwin demo run's faults from 1.02 M to
#: 0.28 M and its system time from 3.0 s to 1.3 s (``benchmarks/malloc.py`` measures it side by side).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(512 << 20),
              "MALLOC_TOP_PAD_": str(64 << 20)}


def spawn_pool(jobs: int, initializer: Callable | None = None, initargs: tuple = ()):
    """The workbench's one kind of worker pool (the preparation's steps, :class:`~workbench.figures.render.BackgroundDraw`'s
    figures): a ``multiprocessing`` pool of ``jobs`` spawned processes (torch and fork do not mix), whose
    ``terminate()`` stops every worker at once (a Ctrl-C or a `kill` must not leave one training). The workers start
    with :data:`MALLOC_ENV` (a value the user set wins)."""
    added = {k: v for k, v in MALLOC_ENV.items() if k not in os.environ}
    os.environ.update(added)  # inherited by the interpreters the pool spawns now, removed from ours after
    try:
        return mp.get_context("spawn").Pool(jobs, initializer=initializer, initargs=initargs)
    finally:
        for key in added:
            os.environ.pop(key, None)


def _priorities(graph: dict[str, tuple[str, ...]], seconds: dict[str, float]) -> dict[str, float]:
    """Each step's last measured time plus the longest chain of steps that wait for it."""
    dependants: dict[str, list[str]] = {i: [] for i in graph}
    for i, after in graph.items():
        for a in after:
            dependants[a].append(i)
    prio: dict[str, float] = {}
    for i in reversed(list(graphlib.TopologicalSorter(graph).static_order())):
        prio[i] = seconds.get(i, 1.0) + max((prio[j] for j in dependants[i]), default=0.0)
    return prio


def prepare(ids: Iterable[str], *, jobs: int, profile: str = "demo", device: str = "auto", force: bool = False,
            log: Callable[[str], None] = print, on_done: Callable[[str, float], None] | None = None,
            before_exclusive: Callable[[list[str]], None] | None = None, data: str | None = None,
            overrides=None) -> dict[str, float]:
    """Compute (or confirm as stored) the data ``ids`` and everything they need, dependencies first.

    Args:
        ids: data ids the selected figures read.
        jobs: worker processes; 1 computes every step here, in order, with the usual progress bars.
        profile, device, force, data, overrides: the :class:`~workbench.figures.context.Context` of the steps (also
            the workers': they get them as arguments).
        log: where log lines (also the workers') go.
        on_done: called with (step id, seconds) when a step finishes.
        before_exclusive: called with the exclusive steps still to run (possibly none) once every other step is done,
            before them (``workbench figures`` starts drawing there, in one process beside the timing steps).

    Returns:
        step id -> wall seconds it took.

    Raises:
        Whatever a step raised (the first failure); the other workers are terminated.
    """
    from workbench.figures.context import Context
    from workbench.figures.step_estimates import estimate
    from workbench.runs import home

    graph = closure(ids)
    times_file = home() / "stores" / profile / "step_seconds.json"
    recorded = json.loads(times_file.read_text()) if times_file.exists() else {}
    seconds = {**{i: estimate(profile, i) for i in graph}, **recorded}  # a step never timed here: the shipped estimate
    took: dict[str, float] = {}

    def finished(i: str, sec: float) -> None:
        took[i] = sec
        log(f"[{i}] done in {sec:.0f} s")
        if on_done:
            on_done(i, sec)

    ready = Context(profile, device, force, log=log, data=data, overrides=overrides)
    for i in [i for i in graphlib.TopologicalSorter(graph).static_order() if ready.is_fresh(i)]:
        graph = {j: tuple(a for a in after if a != i) for j, after in graph.items() if j != i}  # stored: nothing to do
        if on_done:
            on_done(i, 0.0)
    exclusive = [i for i in graphlib.TopologicalSorter(graph).static_order() if DATA[i].exclusive]
    shared = {i: tuple(a for a in after if not DATA[a].exclusive) for i, after in graph.items() if not DATA[i].exclusive}
    if any(DATA[a].exclusive for i in shared for a in graph[i]):
        raise ValueError("a step depends on an exclusive (timing) step; exclusive steps must come last")
    try:
        if jobs <= 1 or len(shared) <= 1:
            ctx = Context(profile, device, force, log=log, data=data, overrides=overrides)
            for i in graphlib.TopologicalSorter(shared).static_order():
                t0 = time.perf_counter()
                ctx.data(i)
                finished(i, time.perf_counter() - t0)
        else:
            _in_pool(shared, jobs, _priorities(shared, seconds), (profile, device, force, data, overrides), log, finished)
        if before_exclusive is not None:
            before_exclusive(exclusive)
        ctx = Context(profile, device, force, log=log, data=data, overrides=overrides)
        for i in exclusive:
            log(f"[{i}] started (alone: it times models)")
            t0 = time.perf_counter()
            ctx.data(i)
            finished(i, time.perf_counter() - t0)
    finally:
        if took:
            from workbench.runtime import atomic_write_text

            atomic_write_text(times_file, json.dumps({**recorded, **took}, indent=1, sort_keys=True))
    return took


def _in_pool(graph: dict[str, tuple[str, ...]], jobs: int, prio: dict[str, float], where: tuple,
             log: Callable[[str], None], finished: Callable[[str, float], None]) -> None:
    import signal
    import threading

    # SIGTERM (a `kill`, a job scheduler) must stop the workers too: the default handler ends this process at once
    # and leaves them training. Raising instead runs the cleanup below, as Ctrl-C does.
    previous = signal.signal(signal.SIGTERM, _terminated) if threading.current_thread() is threading.main_thread() else None
    try:
        _pool_loop(graph, jobs, prio, where, log, finished)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminated(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _pool_loop(graph: dict[str, tuple[str, ...]], jobs: int, prio: dict[str, float], where: tuple,
               log: Callable[[str], None], finished: Callable[[str, float], None]) -> None:
    """Runs the steps of ``graph`` in a pool of ``jobs`` workers, by priority; ``where``: the steps' Context
    arguments (profile, device, force, data, overrides)."""
    spawn = mp.get_context("spawn")
    records = spawn.Queue()
    listener = logging.handlers.QueueListener(records, _Forward(log))
    listener.start()
    done: queue.SimpleQueue = queue.SimpleQueue()  # (id, seconds, exception) from the pool's result thread
    threads = max(1, (os.cpu_count() or 1) // jobs)
    pool = spawn_pool(jobs, _init_worker, (records, threads))
    order = graphlib.TopologicalSorter(graph)
    order.prepare()
    ready: list[str] = []
    running = 0
    try:
        while order.is_active():
            ready += order.get_ready()
            ready.sort(key=lambda i: -prio[i])
            while ready and running < jobs:
                i = ready.pop(0)
                log(f"[{i}] started")
                pool.apply_async(_run_step, (i, DATA[i].module, *where),
                                 callback=lambda sec, i=i: done.put((i, sec, None)),
                                 error_callback=lambda err, i=i: done.put((i, None, err)))
                running += 1
            while True:
                try:
                    i, sec, err = done.get(timeout=0.5)  # a timeout keeps Ctrl-C responsive
                    break
                except queue.Empty:
                    continue
            running -= 1
            if err is not None:
                log(f"[{i}] failed: {err}")
                raise err
            finished(i, sec)
            order.done(i)
        pool.close()
        pool.join()
    except BaseException:
        log("stopping the workers; the same command resumes from the runs' last epoch checkpoints")
        pool.terminate()  # do not wait minutes for another branch's epoch to end
        pool.join()
        raise
    finally:
        listener.stop()


class _Forward(logging.Handler):
    """Hands every worker record's message to ``log`` (in the parent)."""

    def __init__(self, log: Callable[[str], None]):
        super().__init__()
        self.log_fn = log

    def emit(self, record: logging.LogRecord) -> None:
        self.log_fn(record.getMessage())


# --------------------------------------------------------------------------------- worker side
def _init_worker(records, threads: int) -> None:
    os.environ["WORKBENCH_PROGRESS"] = "0"  # methods.train's epoch bars
    os.environ["TQDM_DISABLE"] = "1"  # any other tqdm bar (bars from several processes garble a terminal)
    logger = logging.getLogger(LOGGER)
    logger.handlers[:] = [logging.handlers.QueueHandler(records)]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    import torch
    from threadpoolctl import threadpool_limits  # scikit-learn's dependency

    torch.set_num_threads(threads)
    threadpool_limits(threads)  # NumPy/SciPy's BLAS and OpenMP too: two workers on two cores, not four spinning pools


def _run_step(step_id: str, module: str, profile: str, device: str, force: bool, data: str | None = None,
              overrides=None) -> float:
    import importlib

    from workbench import runs
    from workbench.figures import load_all
    from workbench.figures.context import Context

    # A spawned process starts with empty registries. The workbench's own steps read each other's registrations
    # (compare's students are every method's), so every figure module is imported; a step registered elsewhere (a
    # user's module, a test's) gets its own module's imports, and Context.data loads the rest on an unknown id.
    importlib.import_module(module)
    if module.startswith(f"{__package__}."):
        load_all()
    logger = logging.getLogger(LOGGER)

    def on_epoch(run, epoch: int, metrics: dict) -> None:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k in ("train_loss", "val_acc")
                          and isinstance(v, (int, float)))
        phase = f" {metrics['phase']}" if isinstance(metrics.get("phase"), str) else ""
        logger.info(f"[{step_id}] {run.id}{phase} epoch {epoch}: {shown}")

    runs.EPOCH_LISTENERS.append(on_epoch)  # this worker may run more steps later: removed below
    try:
        t0 = time.perf_counter()
        Context(profile, device, force, log=lambda s: logger.info(f"[{step_id}] {s}"), data=data,
                overrides=overrides).data(step_id)
        return time.perf_counter() - t0
    finally:
        runs.EPOCH_LISTENERS.remove(on_epoch)
