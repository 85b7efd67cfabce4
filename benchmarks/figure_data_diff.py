"""Compute every registered figure's data on a profile, and compare two such computations (issue 18).

A refactor must not move a figure's numbers. This script computes the data of every registered data
function (``@dataset``) exactly as ``workbench figures`` does (:func:`workbench.figures.schedule.prepare`
with a :class:`~workbench.figures.context.Context`), copies the stored Datasets to an output folder, and,
given two such folders, prints for every data id which variables differ and by how much::

    WORKBENCH_HOME=/tmp/before python benchmarks/figure_data_diff.py compute /tmp/figdata-before
    WORKBENCH_HOME=/tmp/after  python benchmarks/figure_data_diff.py compute /tmp/figdata-after
    python benchmarks/figure_data_diff.py diff /tmp/figdata-before /tmp/figdata-after

``compute`` runs one step at a time in this process on one torch thread (``--jobs 1``, the default), so two
computations on the same machine do the same float arithmetic; with more jobs, steps run in worker processes.
``--keep-going`` reports a failing step and computes the others (``diff`` then lists the missing ids).

``diff`` compares each numeric variable and coordinate at ``|a - b| <= atol + rtol * |b|`` (defaults
``rtol=1e-4``, ``atol=1e-6``: float32 noise of a reordered sum, not a changed computation); strings and other
values must be equal. It also compares each Dataset's ``config`` attribute. Variables that time models or runs
(named ``ms``, ``*_ms``, ``*_s``, or containing ``latency``, ``seconds``, ``time``, ``throughput``; every variable of
:data:`TIMING_IDS`, e.g. the latency ratios of ``compare.latency``) differ from one run to the next and are
reported separately as "timing". Exit status 1 when anything but timing differs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

TIMING_WORDS = ("latency", "seconds", "time", "throughput", "speedup")
TIMING_IDS = ("compare.latency",)  # data that is all measured time (milliseconds and their ratios)


def compute(out: Path, profile: str, jobs: int, device: str, keep_going: bool = False) -> None:
    """Compute (or confirm as stored) every registered data id on ``profile`` and copy the stores to ``out``.

    ``keep_going``: a failing step is reported (and left out of ``out``, with the steps that need it) instead of
    stopping the computation.
    """
    import torch

    from workbench.figures import DATA, load_all
    from workbench.figures.context import Context
    from workbench.figures.schedule import prepare

    if jobs <= 1:
        torch.set_num_threads(1)
    load_all()
    ids = sorted(DATA)
    t0 = time.perf_counter()
    failed: dict[str, str] = {}
    if keep_going:  # one step at a time here, as prepare(jobs=1) does, the timing (exclusive) steps last
        import graphlib

        from workbench.figures import closure

        ctx = Context(profile, device, log=lambda s: print(s, flush=True))
        order = list(graphlib.TopologicalSorter(closure(ids)).static_order())
        took = {}
        for i in [i for i in order if not DATA[i].exclusive] + [i for i in order if DATA[i].exclusive]:
            if any(a in failed for a in DATA[i].needs()):
                failed[i] = "needs a failed step"
                continue
            t1 = time.perf_counter()
            try:
                ctx.data(i)
                took[i] = time.perf_counter() - t1
            except Exception as e:  # noqa: BLE001 (reported, the others go on)
                failed[i] = f"{type(e).__name__}: {e}"
                print(f"[{i}] FAILED: {failed[i]}", flush=True)
    else:
        took = prepare(ids, jobs=jobs, profile=profile, device=device, log=lambda s: print(s, flush=True))
    wall = time.perf_counter() - t0
    ctx = Context(profile, device, log=lambda s: None)
    out.mkdir(parents=True, exist_ok=True)
    for i in ids:
        src = ctx.data_path(i)
        if i in failed:
            continue
        if not src.exists():
            raise SystemExit(f"{i}: no stored data at {src} after the computation")
        shutil.copyfile(src, out / f"{i}.nc")
    (out / "timings.json").write_text(json.dumps({"wall_seconds": wall, "steps": took, "profile": profile,
                                                   "jobs": jobs, "failed": failed}, indent=1, sort_keys=True))
    print(f"{len(ids) - len(failed)} of {len(ids)} data ids of profile {profile!r} in {wall:.0f} s -> {out}")
    for i, why in failed.items():
        print(f"  {i}: {why}")


def _is_timing(data_id: str, name: str) -> bool:
    n = name.lower()
    return (data_id in TIMING_IDS or n == "ms" or n.endswith(("_ms", "_s")) or n.startswith("ms_")
            or any(w in n for w in TIMING_WORDS))


def _compare_arrays(a, b, rtol: float, atol: float) -> str | None:
    """None when equal within tolerance, else a short description of the difference."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    if a.dtype.kind in "fciub" and b.dtype.kind in "fciub":
        a64, b64 = a.astype(np.complex128 if "c" in a.dtype.kind + b.dtype.kind else np.float64), b.astype(
            np.complex128 if "c" in a.dtype.kind + b.dtype.kind else np.float64)
        nan_a, nan_b = np.isnan(a64), np.isnan(b64)
        if (nan_a != nan_b).any():
            return f"NaN at different places ({int(nan_a.sum())} vs {int(nan_b.sum())} NaNs)"
        fin = ~nan_a
        if not fin.any():
            return None
        d = np.abs(a64[fin] - b64[fin])
        ok = d <= atol + rtol * np.abs(b64[fin])
        if ok.all():
            return None
        rel = d / np.maximum(np.abs(b64[fin]), 1e-30)
        return f"max abs diff {d.max():.3g}, max rel diff {rel.max():.3g}, {int((~ok).sum())}/{d.size} values off"
    if a.dtype.kind == "M" or b.dtype.kind == "M":
        return None if np.array_equal(a, b) else "datetimes differ"
    return None if (a == b).all() else f"{int((a != b).sum())}/{a.size} values differ"


def diff(before: Path, after: Path, rtol: float, atol: float) -> int:
    """Print the differences between two ``compute`` folders; 1 when anything but timing differs."""
    import xarray as xr

    ids_b = {p.stem for p in before.glob("*.nc")}
    ids_a = {p.stem for p in after.glob("*.nc")}
    bad = 0
    for i in sorted(ids_b - ids_a):
        print(f"{i}: only in {before}")
        bad += 1
    for i in sorted(ids_a - ids_b):
        print(f"{i}: only in {after}")
        bad += 1
    for i in sorted(ids_b & ids_a):
        with xr.open_dataset(before / f"{i}.nc") as db, xr.open_dataset(after / f"{i}.nc") as da:
            db, da = db.load(), da.load()
        lines, timing = [], []
        names_b = set(db.variables)
        names_a = set(da.variables)
        for n in sorted(names_b - names_a, key=str):
            lines.append(f"  {n}: only before")
        for n in sorted(names_a - names_b, key=str):
            lines.append(f"  {n}: only after")
        for n in sorted(names_b & names_a, key=str):
            msg = _compare_arrays(db[n].values, da[n].values, rtol, atol)
            if msg is not None:
                (timing if _is_timing(i, str(n)) else lines).append(f"  {n}: {msg}")
        if db.attrs.get("config") != da.attrs.get("config"):
            lines.append(f"  attrs.config: {db.attrs.get('config')} vs {da.attrs.get('config')}")
        if not lines and not timing:
            print(f"{i}: same")
            continue
        print(f"{i}: {'DIFFERS' if lines else 'timing only'}")
        for line in lines:
            print(line)
        for line in timing:
            print(f"{line} (timing)")
        bad += bool(lines)
    print(f"{bad} data id(s) differ beyond rtol={rtol:g}, atol={atol:g} (timing variables excluded)")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compute", help="compute every registered figure data id and copy the stores to OUT")
    c.add_argument("out", type=Path)
    c.add_argument("--profile", default="smoke")
    c.add_argument("--jobs", type=int, default=1)
    c.add_argument("--device", default="cpu")
    c.add_argument("--keep-going", action="store_true", help="report a failing step and go on with the others")
    d = sub.add_parser("diff", help="compare two compute folders")
    d.add_argument("before", type=Path)
    d.add_argument("after", type=Path)
    d.add_argument("--rtol", type=float, default=1e-4)
    d.add_argument("--atol", type=float, default=1e-6)
    args = p.parse_args(argv)
    if args.cmd == "compute":
        compute(args.out, args.profile, args.jobs, args.device, args.keep_going)
        return 0
    return diff(args.before, args.after, args.rtol, args.atol)


if __name__ == "__main__":
    sys.exit(main())
