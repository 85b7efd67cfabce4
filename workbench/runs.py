"""Run records (shared DESIGN.md, "Runs").

A run directory holds one training's ``config.json``, its checkpoint ``model.safetensors``
(rewritten atomically every epoch), ``metrics.jsonl`` (one line per epoch) and
``manifest.json`` (status ``running``/``failed``/``complete``, versions, hashes, wall time, final metrics).

:func:`ensure_run` is the one entry point: a complete run with the same config is reused, never
retrained; a failed or interrupted one resumes from its last checkpoint when the same command comes
again, and is replaced when a command with another config asks for its id (nothing was built on an
unfinished run); ``force=True`` starts afresh, but never under runs that other commands built on it
(:func:`dependants`). The budget overrides and data a run was made with are part of its id
(:func:`suffixed_id`: ``far-vit-demo+e1.n12``), given by the caller (``RunRequest.run_id``).
Runs live under ``$WORKBENCH_HOME/runs`` (default ``~/.cache/vit-workbench/runs``), so the CLI,
notebooks and figures find the same runs whatever the working directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from workbench.provenance import now_iso, versions
from workbench.runtime import atomic_write_text

#: Callables told of every logged epoch, ``fn(run, epoch, metrics)`` (e.g. to forward progress from
#: the worker processes of ``workbench figures``). Empty unless somebody registers one.
EPOCH_LISTENERS: list[Callable[["Run", int, dict], None]] = []


class RunError(RuntimeError):
    """A run is missing, damaged, or its config conflicts with the request."""


def home() -> Path:
    """Root of runs and cached analysis stores (``$WORKBENCH_HOME`` or ``~/.cache/vit-workbench``)."""
    return Path(os.environ.get("WORKBENCH_HOME", Path.home() / ".cache" / "vit-workbench")).expanduser()


def runs_root() -> Path:
    return home() / "runs"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def _canonical(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=str)


#: Config keys (at any depth) that change only what a run logs, never its weights or results: how often the held-out
#: set is evaluated (evaluation draws no random numbers; results read the last epoch, which is always evaluated),
#: progress bars. A complete run whose config differs from the requested one only in these is reused.
RESULT_NEUTRAL_KEYS = frozenset({"eval_every", "eval_iterations", "progress"})


def _without_neutral(value):
    if isinstance(value, dict):
        return {k: _without_neutral(v) for k, v in value.items() if k not in RESULT_NEUTRAL_KEYS}
    if isinstance(value, (list, tuple)):
        return [_without_neutral(v) for v in value]
    return value


def same_result_config(stored: dict, requested: dict) -> bool:
    """Whether two run configs define the same result (they may differ in :data:`RESULT_NEUTRAL_KEYS`)."""
    return _canonical(_without_neutral(json.loads(_canonical(stored)))) == _canonical(
        _without_neutral(json.loads(_canonical(requested))))


@dataclass
class Run:
    """A run directory. ``config`` is what defines the result; ``manifest`` what happened."""

    dir: Path

    @property
    def id(self) -> str:
        return self.dir.name

    @property
    def config(self) -> dict:
        return self._read("config.json")

    @property
    def manifest(self) -> dict:
        return self._read("manifest.json")

    @property
    def status(self) -> str:
        return self.manifest.get("status", "unknown")

    @property
    def checkpoint(self) -> Path:
        return self.dir / "model.safetensors"

    def _read(self, name: str) -> dict:
        path = self.dir / name
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise RunError(f"run {self.id!r} has no {name}; it is damaged - delete {self.dir} or retrain with --force") from None
        except json.JSONDecodeError as err:
            raise RunError(f"run {self.id!r}: {name} is not valid JSON ({err}); delete {self.dir} or retrain with --force") from None

    def metrics(self) -> list[dict]:
        path = self.dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    def log_epoch(self, epoch: int, metrics: dict) -> None:
        """Record one epoch's metrics; an epoch logged again after a resume replaces the old line."""
        rows = [m for m in self.metrics() if m.get("epoch") != epoch] + [{"epoch": epoch, **metrics}]
        rows.sort(key=lambda m: m["epoch"])
        atomic_write_text(self.dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        self.update_manifest(last_epoch=epoch)
        for listener in EPOCH_LISTENERS:
            listener(self, epoch, metrics)

    def update_manifest(self, **fields: Any) -> None:
        manifest = {**self.manifest, **fields, "updated": now_iso()}
        atomic_write_text(self.dir / "manifest.json", json.dumps(manifest, indent=2, default=str))

    def phase_dir(self, name: str) -> Path:
        """A sub-directory for one phase of a multi-phase method (its own epoch checkpoints; made by rank 0 alone
        under torchrun, the others only read it)."""
        from workbench.runtime import is_main

        path = self.dir / name
        if is_main():
            path.mkdir(parents=True, exist_ok=True)
        return path


def find_run(ref: str | Path | Run) -> Run | None:
    """The run ``ref`` names (a Run, a directory path, or an id under :func:`runs_root`), or None when it names no
    run (e.g. a timm name): the one answer to "is this a run?"."""
    if isinstance(ref, Run):
        return ref
    path = Path(ref).expanduser()
    if (path / "manifest.json").exists():
        return Run(path)
    path = runs_root() / str(ref)
    return Run(path) if (path / "manifest.json").exists() else None


def suffixed_id(run_id: str, suffix: str) -> str:
    """``run_id`` with ``suffix`` (what else defines the run: its data, its budget overrides) after one ``+``:
    ``far-vit-demo`` -> ``far-vit-demo+e1.n12``, ``x+flowers_3fa2`` -> ``x+flowers_3fa2.e1`` (no change for "")."""
    if not suffix:
        return run_id
    return f"{run_id}{'.' if '+' in run_id.rsplit('-', 1)[-1] else '+'}{suffix}"  # one "+" part per id


def _mentions(value: Any, run_id: str) -> bool:
    if isinstance(value, dict):
        return any(_mentions(v, run_id) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_mentions(v, run_id) for v in value)
    return value == run_id


def dependants(run: "Run") -> list["Run"]:
    """Runs of other methods whose config names ``run`` (students of a teacher, ...): what ``--force`` would orphan."""
    own = run.config.get("method") if (run.dir / "config.json").exists() else None
    out = []
    for other in list_runs():
        if other.id == run.id or not (other.dir / "config.json").exists():
            continue
        try:
            cfg = other.config
        except RunError:
            continue
        if cfg.get("method") != own and _mentions(cfg, run.id):
            out.append(other)
    return out


def open_run(ref: str | Path) -> Run:
    """A run by id (under :func:`runs_root`) or by directory path.

    Raises:
        RunError: no such run, naming where it looked and how to create one.
    """
    run = find_run(ref)
    if run is None:
        known = sorted(p.name for p in runs_root().glob("*") if (p / "manifest.json").exists()) if runs_root().exists() else []
        hint = f"known runs: {', '.join(known)}" if known else "no runs yet"
        raise RunError(f"no run {str(ref)!r} (looked in {runs_root()}); {hint}. Train one with `workbench train teacher` or `workbench run METHOD`")
    return run


def list_runs() -> list[Run]:
    root = runs_root()
    return [Run(p) for p in sorted(root.glob("*")) if (p / "manifest.json").exists()] if root.exists() else []


def ensure_run(
    run_id: str,
    config: dict,
    body: Callable[[Run], dict],
    *,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> Run:
    """Reuse, resume or start the run ``run_id`` defined by ``config``.

    Args:
        run_id: directory name under :func:`runs_root`.
        config: JSON-able definition of the result (method, model, profile, hyperparameters).
        body: does the work given the run (resuming from ``run.dir`` checkpoints if present) and
            returns final metrics, stored in the manifest; a ``model`` entry ``{name, kwargs}`` (the timm
            name and JSON kwargs of the saved model, when only the run's end knows them, e.g. after
            pruning) is stored apart as the manifest's ``model``.
        force: delete any existing run of that id and start afresh (refused when other methods' runs were built
            on it: :func:`dependants`).
        log: where one-line status messages go.

    Raises:
        RunError: a complete run of that id has a different config (pass ``force=True``), or ``force`` would
            replace a run others were built on.
    """
    from workbench.runtime import barrier, is_main, main_decides

    run_dir = runs_root() / run_id
    config_sha = hashlib.sha256(_canonical(config).encode()).hexdigest()
    # Under torchrun rank 0 alone keeps the record: it decides (reuse, train, or refuse) and prepares the directory
    # while the other ranks wait, every rank then trains (fit keeps them in step), and no rank leaves before rank 0 has
    # marked the run complete: the next run, on any rank, may start from this one's result.
    main = is_main()
    with _run_lock(run_id, log) if main else contextlib.nullcontext():
        decision = None
        if main:
            try:
                decision = "reuse" if _prepare(run_id, run_dir, config, config_sha, force, log) else "train"
            except RunError as err:
                decision = err
        decision = main_decides(decision)
        if isinstance(decision, RunError):
            raise decision
        if decision == "reuse":
            return Run(run_dir)
        if main:
            _train(run_id, Run(run_dir), body, log)
        else:
            body(Run(run_dir))
    barrier()
    return Run(run_dir)


def _run_lock(run_id: str, log: Callable[[str], None]):
    """One process at a time per run: a second one waits (e.g. a notebook and the CLI at once)."""
    return waiting_lock(runs_root() / ".locks" / f"{run_id}.lock", f"run {run_id} is in use by another process; "
                        "waiting for it to finish", log)


@contextlib.contextmanager
def waiting_lock(path: Path, busy: str, log: Callable[[str], None]):
    """Hold the file lock ``path``, waiting (after logging ``busy``) while another process holds it. A portable file
    lock (``filelock``: POSIX and Windows), released when its holder ends, even if it was killed."""
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log(busy)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _prepare(run_id: str, run_dir: Path, config: dict, config_sha: str, force: bool, log) -> bool:
    """Under the run's lock: True to reuse the complete run, else the directory made ready to (re)start or resume."""
    if run_dir.exists() and force:
        if (run_dir / "manifest.json").exists():
            built = dependants(Run(run_dir))
            if built:
                raise RunError(
                    f"--force would replace run {run_id!r}, which {len(built)} other run(s) were built on: "
                    f"{', '.join(r.id for r in built)}; delete those first, or make a new run beside it (other "
                    "--epochs/--images/--checkpoint give it another id)")
        shutil.rmtree(run_dir)
    if (run_dir / "manifest.json").exists():
        run = Run(run_dir)
        same = run.manifest.get("config_sha256") == config_sha or (
            (run_dir / "config.json").exists() and same_result_config(run.config, config))
        if run.status == "complete" and same:
            log(f"reusing complete run {run_id} ({run.dir})")
            return True
        if not same and run.status == "complete":
            raise RunError(
                f"run {run_id!r} exists with a different config ({run.dir}); "
                "pass --force to retrain it, or delete the directory"
            )
        if same:
            log(f"resuming {run.status} run {run_id} from its last checkpoint")
        else:  # an unfinished run (failed, interrupted, or a crashed process: we hold its lock) of another config
            log(f"replacing {run.status} run {run_id} (it was started with another config and never finished)")
            shutil.rmtree(run_dir)
    if not (run_dir / "manifest.json").exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.json", json.dumps(config, indent=2, sort_keys=True, default=str))
        atomic_write_text(
            run_dir / "manifest.json",
            json.dumps({"id": run_id, "status": "running", "created": now_iso(), "config_sha256": config_sha,
                        "wall_time_s": 0.0, **{k: config.get(k) for k in ("method", "model_name", "profile")}}, indent=2),
        )
    return False


def _train(run_id: str, run: Run, body, log) -> None:
    """Run ``body`` on the prepared run and record how it ended (failed, interrupted or complete)."""
    t0 = time.perf_counter()
    previous = float(run.manifest.get("wall_time_s", 0.0))
    run.update_manifest(status="running", versions=versions(), error=None)
    try:
        results = body(run)
    except BaseException as err:
        # failed (an error) or interrupted (Ctrl-C, a kill): the same command resumes it, another config replaces it
        status = "interrupted" if isinstance(err, (KeyboardInterrupt, SystemExit)) else "failed"
        run.update_manifest(status=status, error=f"{type(err).__name__}: {err}"[:500],
                            wall_time_s=previous + time.perf_counter() - t0)
        raise
    run.update_manifest(wall_time_s=previous + time.perf_counter() - t0)
    ckpt = {"checkpoint_sha256": sha256_file(run.checkpoint)} if run.checkpoint.exists() else {}
    model = {"model": results.pop("model")} if "model" in results else {}
    run.update_manifest(status="complete", results=results, completed=now_iso(), **ckpt, **model)
    log(f"run {run_id} complete: " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in results.items()))
