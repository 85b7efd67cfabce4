"""Benchmark: analyses at dataset scale (streamed extraction into chunked zarr stores, lazy reductions).

Measured side by side in one run, on this machine, with random-init weights (no download), one torch
thread per process (``--threads``), and the load average printed before and after (the machine is
shared: ratios measured in the same run are what to read, not absolute times):

1. peak RSS of a streamed attention extraction (``vit_demo``, full maps, float32) over ``--big``
   demo images against ``--small`` (each in a fresh process; RSS includes the interpreter and torch);
2. images/s of the streamed extraction (DataLoader, extraction, zarr writes; model and template set-up
   included) against a plain forward with the same capture (the same hook points on preloaded batches,
   nothing stored), for three workloads: the demo ViT's full maps (tiny model, 240 kB of float32 maps
   per 0.4 ms of compute: writing dominates), DeiT-Tiny's full maps at 224 (5.6 MB per image) and
   DeiT-Tiny's CLS rows at 224 (compute dominates); for the full maps also the same streamed run with
   the store writes skipped, which separates the pipeline's own cost from zarr's compression and writes;
3. CLS rows only (computed beside timm's fused attention) against timm's plain fused forward;
4. full attention maps (``extract_attention``, Dataset included) against the plain fused forward;
5. one process against two (``torchrun --nproc_per_node 2``): the extraction's wall time measured in
   the ranks (barrier to barrier: start-up excluded, model loading and the template included) and the
   whole command's, for a write-bound workload (the demo ViT's full maps) and a compute-bound one
   (DeiT-Tiny's CLS rows);
6. a dask reduction of the big store (per-class mean) against loading it whole (time, peak RSS);
7. store sizes on disk;
8. a DeiT-S-sized model (``deit_small_patch16_224``, random weights) at 224 over ``--deit-images`` demo
   digits resized to 224 x 224 RGB, ``--queries cls --dtype float16``, then ``reduce --by label``.

Run::

    PYTHONPATH=. python benchmarks/extract_scale.py [--big 4000] [--small 500] [--deit-images 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_mb() -> float:
    """This process's peak RSS (MB): ``VmHWM``, its own address space's high-water mark. (``ru_maxrss`` is not used: on
    Linux it keeps the launching process's high-water mark across ``vfork`` + ``exec``, so a child started from this
    benchmark after its in-process measurements would report the parent's peak.)"""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) / 2**20


def env(threads: int) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads), "WORKBENCH_PROGRESS": "0",
            "PYTHONWARNINGS": "ignore"}


def child(args) -> None:
    """One measurement in a fresh process; prints a JSON line (reductions do not import torch)."""
    t0 = time.perf_counter()
    if args.child == "stream":
        import torch

        torch.set_num_threads(args.threads)
        from workbench.scale.stream import StreamOptions, stream_analysis

        torch.manual_seed(0)
        stream_analysis("attention", "vit_demo", args.images, args.out, device="cpu", progress=False,
                        opts=StreamOptions(batch_size=50, chunk=100, workers=0))
    elif args.child == "dist":  # one rank of a 1- or 2-process extraction: time from a barrier after start-up to one after
        import torch
        import torch.distributed as dist

        from methods.launch import init_distributed
        from workbench.scale.stream import StreamOptions, stream_analysis

        torch.set_num_threads(args.threads)
        rank, world = init_distributed("cpu")
        model, bs, chunk, queries = args.dist_model.split(",")
        import timm  # noqa: F401  (start-up: the imports the extraction would do lazily, and the demo split)

        from workbench.data import demo_split_indices

        demo_split_indices("train")
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        stream_analysis("attention", model, args.images, args.out, device="cpu", progress=False,
                        opts=StreamOptions(batch_size=int(bs), chunk=int(chunk), queries=queries, workers=0))
        if world > 1:
            dist.barrier()
        if rank == 0:
            print(json.dumps({"seconds": time.perf_counter() - t0, "rss_mb": rss_mb()}))
        return
    elif args.child == "reduce":
        from workbench.scale.reduce import reduce_store

        ds = reduce_store(args.out, by="label", stat="mean", progress=False)
        assert ds.sizes["label"] >= 1
    elif args.child == "load":
        import numpy as np

        from workbench.store import open_store

        ds = open_store(args.out).load()
        y = ds.label.values
        means = [ds.attention.values[y == c].mean(0) for c in np.unique(y)]
        assert len(means) == 10
    print(json.dumps({"seconds": time.perf_counter() - t0, "rss_mb": rss_mb()}))


def run_child(kind: str, images: str, out: Path, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--images", images, "--out", str(out), "--threads", str(threads)]
    res = subprocess.run(cmd, env=env(threads), capture_output=True, text=True, check=False)
    if res.returncode:
        raise RuntimeError(res.stderr[-2000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def timed(fn, repeats: int) -> float:
    """Best wall time of ``repeats`` calls (after one warm-up)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def in_process(args, tmp: Path) -> dict:
    """Measurements 2-4 in this process (best of ``--repeats`` after a warm-up, side by side)."""
    import timm
    import torch

    import workbench.scale.stream as stream
    from workbench.analysis.attention import attention_points, extract_attention, record
    from workbench.analysis.attention_rows import extract_attention_rows
    from workbench.data import load_images
    from workbench.models import create_model

    torch.set_num_threads(args.threads)
    out = {}
    runs = iter(range(10_000))
    write_chunk = stream.write_chunk

    def streamed(model_name: str, spec: str, bs: int, workers: int, queries: str = "all", write: bool = True):
        def fn():
            path = tmp / f"rate-{next(runs)}.zarr"
            torch.manual_seed(0)
            stream.write_chunk = write_chunk if write else (lambda *a, **k: None)  # diagnostic: the same run, no writes
            try:
                stream.stream_analysis("attention", model_name, spec, path, device="cpu", progress=False,
                                       opts=stream.StreamOptions(batch_size=bs, chunk=2 * bs, queries=queries, workers=workers))
            finally:
                stream.write_chunk = write_chunk
                shutil.rmtree(path, ignore_errors=True)
        return fn

    def captured(model, x, bs: int, rows: bool = False):
        names = [p.name for p in attention_points(model)]

        def fn():
            for i in range(0, len(x), bs):
                if rows:
                    extract_attention_rows(model, x[i:i + bs], queries=[0])
                else:
                    [c.numpy() for c in record(model, x[i:i + bs], names).values()]
        return fn

    # 2a. write-bound: the demo ViT's full maps (240 kB of float32 maps per image, 0.4 ms of compute)
    n, bs = args.rate_images, 50
    torch.manual_seed(0)
    demo = create_model("vit_demo").eval()
    spec = f"demo:train[:{n}]"
    x = load_images(spec, input_size=(1, 28, 28)).tensor
    t_cap = timed(captured(demo, x, bs), args.repeats)
    t_str = timed(streamed("vit_demo", spec, bs, 0), args.repeats)
    t_nw = timed(streamed("vit_demo", spec, bs, 0, write=False), args.repeats)
    out["demo"] = (n / t_cap, n / t_str, n / t_nw)
    # 2b, 2c. DeiT-Tiny at 224 (digits resized to 224 RGB by one DataLoader worker): full maps (5.6 MB per image), CLS rows
    n, bs = args.rate_deit_images, 16
    spec = f"demo:train[:{n}]"
    torch.manual_seed(0)
    tiny = timm.create_model("deit_tiny_patch16_224", pretrained=False).eval()
    x = load_images(spec, input_size=(3, 224, 224)).tensor
    t_cap = timed(captured(tiny, x, bs), 1)
    t_str = timed(streamed("deit_tiny_patch16_224", spec, bs, 1), 1)
    t_nw = timed(streamed("deit_tiny_patch16_224", spec, bs, 1, write=False), 1)
    out["deit_full"] = (n / t_cap, n / t_str, n / t_nw)
    t_cap = timed(captured(tiny, x, bs, rows=True), 1)
    t_str = timed(streamed("deit_tiny_patch16_224", spec, bs, 1, queries="cls"), 1)
    out["deit_rows"] = (n / t_cap, n / t_str)
    # 3, 4. DeiT-Tiny at 224, one batch: fused forward vs CLS rows vs full maps (Dataset included)
    xi = torch.randn(args.deit_batch, 3, 224, 224)

    def fused():
        with torch.no_grad():
            tiny(xi)

    t_fwd = timed(fused, args.repeats)
    t_rows = timed(lambda: extract_attention_rows(tiny, xi, queries=[0]), args.repeats)
    t_full = timed(lambda: extract_attention(tiny, xi), args.repeats)
    t_fwd = min(t_fwd, timed(fused, args.repeats))  # again, after the others: load drift
    out.update(fused_ms=1e3 * t_fwd, rows_ms=1e3 * t_rows, full_ms=1e3 * t_full)
    return out


def deit_s(args, tmp: Path) -> dict:
    """8. DeiT-S-sized, CLS rows in float16 over digits resized to 224, then a per-class mean."""
    store = tmp / "deits.zarr"
    cmd = [sys.executable, "-m", "workbench.cli", "analyze", "attention", "--model", "deit_small_patch16_224",
           "--images", f"demo:train[:{args.deit_images}]", "--queries", "cls", "--dtype", "float16", "--batch-size", "16",
           "--chunk", "128", "--workers", "1", "--device", "cpu", "--out", str(store)]
    t0 = time.perf_counter()
    res = subprocess.run(["/usr/bin/time", "-v", *cmd], env=env(args.threads), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode:
        raise RuntimeError(res.stderr[-2000:])
    rss = max(int(line.split(":")[-1]) for line in res.stderr.splitlines() if "Maximum resident" in line) / 1024
    means = tmp / "deits-means.nc"
    t1 = time.perf_counter()
    red = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "workbench.cli", "reduce", str(store), "--by", "label",
                          "--stat", "mean", "--out", str(means)], env=env(args.threads), capture_output=True, text=True)
    if red.returncode:
        raise RuntimeError(red.stderr[-2000:])
    red_rss = max(int(line.split(":")[-1]) for line in red.stderr.splitlines() if "Maximum resident" in line) / 1024
    return {"deit_wall_s": wall, "deit_rss_mb": rss, "deit_store_mb": du_mb(store), "deit_reduce_s": time.perf_counter() - t1,
            "deit_reduce_rss_mb": red_rss}


def processes(args, tmp: Path) -> dict:
    """5. one vs two processes (``torchrun --nproc_per_node 2``), images loaded in the ranks themselves (``--workers 0``:
    a DataLoader worker would take the second core in the 1-process run): the whole command's wall time, and the
    extraction's own (from a barrier after start-up -- interpreter, imports, the demo split, process group -- to one after the last
    chunk; model loading, the template and the last chunk's flush included), for a write-bound workload (the demo
    ViT's full maps) and a compute-bound one (DeiT-Tiny's CLS rows at 224)."""
    res = {}
    for key, n, cfg in [("demo", args.big, "vit_demo,50,100,all"),  # model, batch size, chunk, queries
                        ("rows", args.proc_deit_images, "deit_tiny_patch16_224,16,16,cls")]:
        for p in (1, 2):
            out = tmp / f"proc{p}-{key}.zarr"
            launch = [sys.executable] if p == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                       "--nproc_per_node", str(p)]
            cmd = launch + [__file__, "--child", "dist", "--dist-model", cfg, "--images", f"demo:train[:{n}]",
                            "--out", str(out), "--threads", "1"]
            t0 = time.perf_counter()
            done = subprocess.run(cmd, env=env(1), capture_output=True, text=True, check=False)
            res[f"{key}_whole_{p}p"] = time.perf_counter() - t0
            if done.returncode:
                raise RuntimeError(done.stderr[-2000:])
            res[f"{key}_extract_{p}p"] = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
            shutil.rmtree(out)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--big", type=int, default=4000)
    p.add_argument("--small", type=int, default=500)
    p.add_argument("--rate-images", type=int, default=4000)
    p.add_argument("--deit-images", type=int, default=2000)
    p.add_argument("--rate-deit-images", type=int, default=256)
    p.add_argument("--proc-deit-images", type=int, default=768)
    p.add_argument("--deit-batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--skip", default="", help="comma-separated parts to skip: rss, rate, procs, reduce, deit")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--images", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--dist-model", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    skip = set(args.skip.split(","))
    print(f"load average before: {os.getloadavg()}  ({os.cpu_count()} CPUs), {args.threads} torch thread(s) per process")
    tmp = Path(tempfile.mkdtemp(prefix="extract-scale-"))
    try:
        big, small = tmp / "big.zarr", tmp / "small.zarr"
        if "rss" not in skip:
            r_small = run_child("stream", f"demo:train[:{args.small}]", small, args.threads)
            r_big = run_child("stream", f"demo:train[:{args.big}]", big, args.threads)
            print(f"1. peak RSS, streamed attention maps: {args.small} images {r_small['rss_mb']:.0f} MB, {args.big} images "
                  f"{r_big['rss_mb']:.0f} MB: ratio {r_big['rss_mb'] / r_small['rss_mb']:.3f} (target <= 1.10); "
                  f"{args.big / r_big['seconds']:.0f} img/s")
            print(f"7. store size on disk: {args.small} images {du_mb(small):.0f} MB, {args.big} images {du_mb(big):.0f} MB "
                  f"(float32 full maps of vit_demo, blosc lz4 + bitshuffle; {du_mb(big) * 2**20 / args.big / 1e3:.0f} kB per image)")
        if "rate" not in skip:
            r = in_process(args, tmp)
            for key, what in [("demo", f"vit_demo full maps, {args.rate_images} images, no DataLoader worker"),
                              ("deit_full", f"DeiT-Tiny 224 full maps, {args.rate_deit_images} images, 1 worker")]:
                cap, st, nw = r[key]
                print(f"2. {what}: streamed {st:.1f} img/s vs plain forward with the same capture {cap:.1f} img/s: "
                      f"{st / cap:.2f}x (target >= 0.9x); the same streamed run with the store writes skipped "
                      f"{nw:.1f} img/s: {nw / cap:.2f}x")
            cap, st = r["deit_rows"]
            print(f"2. DeiT-Tiny 224 CLS rows, {args.rate_deit_images} images, 1 worker: streamed {st:.1f} img/s vs the same rows "
                  f"on preloaded batches {cap:.1f} img/s: {st / cap:.2f}x (target >= 0.9x)")
            print(f"3. DeiT-Tiny 224, batch {args.deit_batch}: CLS rows beside fused attention {r['rows_ms']:.0f} ms vs fused "
                  f"forward {r['fused_ms']:.0f} ms: throughput {r['fused_ms'] / r['rows_ms']:.2f}x (target >= 0.9x)")
            print(f"4. full maps, extract_attention incl. Dataset {r['full_ms']:.0f} ms: {r['full_ms'] / r['fused_ms']:.2f}x "
                  "the fused forward's time (target <= 1.10x)")
        if "procs" not in skip:
            r = processes(args, tmp)
            for key, n, what in [("demo", args.big, "vit_demo full maps (write-bound)"),
                                 ("rows", args.proc_deit_images, "DeiT-Tiny 224 CLS rows (compute-bound)")]:
                w1, w2, e1, e2 = (r[f"{key}_{k}"] for k in ("whole_1p", "whole_2p", "extract_1p", "extract_2p"))
                print(f"5. {what}, {n} images, no DataLoader worker: the extraction in 1 process {e1:.1f} s vs 2 processes "
                      f"{e2:.1f} s: {e1 / e2:.2f}x (target >= 1.7x); whole command (start-up included) {w1:.1f} s vs "
                      f"{w2:.1f} s: {w1 / w2:.2f}x")
        if "reduce" not in skip and big.exists():
            lazy, whole = run_child("reduce", "", big, args.threads), run_child("load", "", big, args.threads)
            lazy_small = run_child("reduce", "", small, args.threads) if small.exists() else None
            print(f"6. per-class mean of {args.big} images' maps ({du_mb(big):.0f} MB on disk): dask {lazy['seconds']:.1f} s, "
                  f"peak RSS {lazy['rss_mb']:.0f} MB vs loading whole {whole['seconds']:.1f} s, peak RSS {whole['rss_mb']:.0f} MB"
                  + (f"; the dask reduction of {args.small} images: peak RSS {lazy_small['rss_mb']:.0f} MB" if lazy_small else ""))
        if "deit" not in skip:
            r = deit_s(args, tmp)
            print(f"8. deit_small_patch16_224 (random weights) at 224, {args.deit_images} demo digits resized to 224 RGB, "
                  f"--queries cls --dtype float16: {r['deit_wall_s']:.0f} s ({args.deit_images / r['deit_wall_s']:.1f} img/s incl. "
                  f"start-up), peak RSS {r['deit_rss_mb']:.0f} MB, store {r['deit_store_mb']:.1f} MB; reduce --by label: "
                  f"{r['deit_reduce_s']:.1f} s, peak RSS {r['deit_reduce_rss_mb']:.0f} MB")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
