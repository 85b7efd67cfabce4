"""Which runs ``workbench figures`` asks for, and whether an existing home answers every request (issue 28).

A change to how run ids or run configs are made must leave an old home's runs reusable. This script computes the
data of every registered data function (as ``benchmarks/figure_data_diff.py compute`` does, one step at a time in
this process) in the home ``$WORKBENCH_HOME`` after moving its stored figure data aside (so every data function asks
for its runs again; analysis stores are read back), with :func:`workbench.runs.ensure_run` refusing to train: a run
that is missing, incomplete or of another config stops the step and is reported. It prints every requested run id,
and compares them with the home's run directories::

    cp -a /work/home-cold /tmp/home && WORKBENCH_HOME=/tmp/home python benchmarks/run_ids.py --profile demo

Exit status 1 when a request would train (or a step fails); the ids are written to ``--out`` (one per line).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="demo")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="run_ids.txt", help="where the requested run ids go, one per line")
    args = p.parse_args(argv)

    import graphlib

    import torch

    from workbench import runs
    from workbench.figures import DATA, closure, load_all
    from workbench.figures.context import Context

    torch.set_num_threads(1)
    requested: dict[str, str] = {}  # run id -> decision
    prepare = runs._prepare

    def refusing(run_id, run_dir, config, config_sha, force, log):
        run = runs.Run(run_dir)
        same = (run_dir / "manifest.json").exists() and run.status == "complete" and (
            run.manifest.get("config_sha256") == config_sha or runs.same_result_config(run.config, config))
        requested[run_id] = "reuse" if same else "TRAIN"
        if not same:
            raise RuntimeError(f"run {run_id!r} would be trained (missing, incomplete or another config)")
        return prepare(run_id, run_dir, config, config_sha, force, log)

    runs._prepare = refusing
    load_all()
    ctx = Context(args.profile, args.device, log=lambda s: None)
    figdata = ctx.store_dir / "figdata"
    if figdata.exists():
        aside = ctx.store_dir / f"figdata.aside-{int(time.time())}"
        shutil.move(str(figdata), str(aside))
        print(f"stored figure data moved to {aside}")
    failed: dict[str, str] = {}
    t0 = time.perf_counter()
    for i in graphlib.TopologicalSorter(closure(sorted(DATA))).static_order():
        if any(a in failed for a in DATA[i].needs()):
            failed[i] = "needs a failed step"
            continue
        try:
            ctx.data(i)
        except Exception as e:  # noqa: BLE001 (reported; the others go on)
            failed[i] = f"{type(e).__name__}: {e}"
        print(f"[{i}] {'FAILED: ' + failed[i] if i in failed else 'ok'} ({time.perf_counter() - t0:.0f} s)", flush=True)
    ids = sorted(requested)
    Path(args.out).write_text("".join(f"{i}\n" for i in ids))
    have = {d.name for d in runs.runs_root().iterdir() if (d / "manifest.json").exists()}
    print(f"{len(ids)} run ids requested ({sum(v == 'reuse' for v in requested.values())} reused, "
          f"{sum(v == 'TRAIN' for v in requested.values())} would train); the home holds {len(have)} runs")
    for i in ids:
        if requested[i] != "reuse":
            print(f"  would train: {i}")
    for i in sorted(have - set(ids)):
        print(f"  in the home, not requested: {i}")
    for i, why in failed.items():
        print(f"  step {i}: {why}")
    return 1 if failed or any(v != "reuse" for v in requested.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
