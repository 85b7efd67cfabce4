"""Benchmark: single-thread CPU latency and peak memory of collapsed Non-deep ViTs vs DeiT-Tiny (Tables 1, 10, 11).

Models at real size (224², DeiT-Tiny: 12 blocks, D = 192, 3 heads of 64) with random weights:
DeiT-Tiny-12; the DeiT-6 / 4 / 3 baselines (the teacher cut to 6 / 4 / 3 blocks); the exact
collapsed 6 / 4 / 3-block models (``methods.nondeep.collapse``, narrowest exact form: heads of
width 128 / 192 / 192) and, for training memory, the branched models 6x2 / 4x3 / 3x4.

Latency: PyTorch eager, ``torch.set_num_threads(1)``, batch 1, no grad. Models are timed
round-robin (one forward of each in turn, ``--repeat`` rounds after ``--warmup``) so that a load
change on a shared machine hits every model alike; the median per model and its ratio to
DeiT-Tiny are printed beside the paper's (Table 1, Intel i9-9900X single thread: 6-R 0.63,
4-R 0.51, 3-R 0.47; DeiT-6/4/3 0.62 / 0.49 / 0.43).

Latency and memory are measured by ``methods.nondeep.latencies`` / ``peak_memory`` (also behind the
figures ``nondeep.table1`` / ``table10`` / ``table11``). Peak memory (Tables 10 / 11): bytes of every live
tensor storage, tracked through a ``TorchDispatchMode`` (allocator- and device-independent; parameters,
input, activations, gradients and SGD momentum buffers), maximum over one training step (forward + backward +
SGD momentum 0.9 step, train mode) and over one inference forward (eval, no grad), at
``--mem-batch`` images (paper: batch 256 on an H100, FP32; the ratios do not depend on the batch
beyond the parameter share). The paper's training rows run the branched form, inference the
collapsed one; ratios to DeiT-Tiny are printed beside the paper's (training 1.09 / 1.09 / 1.10,
inference 0.99). timm's DeiT-Tiny trains with fused attention (no attention matrix kept for backward on
the CPU), the branched blocks keep theirs (the joining needs the scores), so DeiT-Tiny is also shown with
timm's explicit attention path.

Measured on the 2-core development VM, shared and loaded (load average 2.4-2.8 on 2 CPUs), two runs of
the script (latency ratio to DeiT-Tiny; paper in brackets):

  collapsed 6  0.69 / 0.71 (0.63)   collapsed 4  0.60 / 0.63 (0.51)   collapsed 3  0.46 / 0.51 (0.47)
  DeiT-6       0.52 / 0.47 (0.62)   DeiT-4       0.36 / 0.42 (0.49)   DeiT-3       0.28 / 0.29 (0.43)
  (DeiT-Tiny 41.2 / 73.1 ms; paper 66.1 ms). The exact collapsed models are wider than the paper's
  "R" models (methods.nondeep.flops), so they sit above its ratios at 6 and 4 blocks.

  peak memory, batch 32, ratio to DeiT-Tiny (fused / explicit attention): training branched 6x2 1.20 / 1.02,
  4x3 1.23 / 1.04, 3x4 1.27 / 1.08 (paper 1.09 / 1.09 / 1.10); inference collapsed 6 / 4 / 3: 0.93 / 1.10 /
  1.07 (paper 0.99). Memory counts are deterministic (no load dependence).

Usage: PYTHONPATH=. python benchmarks/nondeep_latency.py [--repeat 30] [--warmup 5] [--mem-batch 32] [--skip-memory]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its thread pool

import argparse  # noqa: E402

import timm  # noqa: E402
import torch  # noqa: E402

import methods.nondeep as nd  # noqa: E402

BASE = "deit_tiny_patch16_224"
PAPER_TRAIN = {"DeiT-Tiny": 1.0, "DeiT-Tiny (explicit attention)": 1.0, "branched 6x2": 14.43 / 13.16,
               "branched 4x3": 14.43 / 13.16, "branched 3x4": 14.54 / 13.16}  # Table 10


def build(n: int | None, form: str) -> torch.nn.Module:
    """DeiT-Tiny (n None), its L/n-block cut (form 'cut'), branched or collapsed (random weights)."""
    torch.manual_seed(0)
    if n is None:
        return timm.create_model(BASE)
    if form == "cut":
        return timm.create_model(BASE, depth=12 // n)
    if form == "branched":
        return timm.create_model("nondeep_branched", base=BASE, branches=n)
    return timm.create_model("nondeep_collapsed", base=BASE, branches=n, form="auto")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--mem-batch", type=int, default=32)
    ap.add_argument("--skip-memory", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, timm {timm.__version__}, 1 thread, batch 1, 224x224, median of {args.repeat} "
          f"round-robin runs after {args.warmup}; load average {load:.1f} on {os.cpu_count()} CPUs")
    models = {"DeiT-Tiny": build(None, "")}
    paper = {"DeiT-Tiny": "DeiT-Tiny"}
    for n, depth in ((2, 6), (3, 4), (4, 3)):
        models[f"DeiT-{depth}"] = build(n, "cut")
        paper[f"DeiT-{depth}"] = f"DeiT-{depth}"
        models[f"collapsed {depth}"] = build(n, "collapsed")
        paper[f"collapsed {depth}"] = f"D-MAE-{depth}-R"
    for m in models.values():
        m.eval()
    ms = nd.latencies(models, repeats=args.repeat, warmup=args.warmup)
    base = ms["DeiT-Tiny"]
    print(f"\n{'model':14s} {'params M':>8s} {'GMACs':>6s} {'GMACs*':>6s} {'ms':>7s} {'/DeiT':>6s}   paper ms (/DeiT)"
          "     * without QK^T and AV (the paper's convention)")
    for name, model in models.items():
        c = nd.cost(model)
        row = nd.PAPER_TABLE1[paper[name]]
        print(f"{name:14s} {c.params / 1e6:8.2f} {c.macs / 1e9:6.3f} {c.macs_paper / 1e9:6.3f} {ms[name]:7.1f} "
              f"{ms[name] / base:6.2f}   {row.cpu_ms:5.1f} ({row.cpu_ms / 66.1:.2f})")
    end_load = os.getloadavg()[0]
    print(f"load average at the end {end_load:.1f}")
    if args.skip_memory:
        return
    print(f"\npeak memory (live tensor bytes, batch {args.mem_batch}, FP32; paper: batch 256 on an H100)")
    explicit = build(None, "")
    for m in explicit.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False  # keeps the attention matrices for backward, as the branched blocks do
    train = {"DeiT-Tiny": nd.peak_memory(build(None, ""), args.mem_batch, "train"),
             "DeiT-Tiny (explicit attention)": nd.peak_memory(explicit, args.mem_batch, "train")}
    for n, depth in ((2, 6), (3, 4), (4, 3)):
        train[f"branched {depth}x{n}"] = nd.peak_memory(build(n, "branched"), args.mem_batch, "train")
    print(f"  training (forward + backward + SGD step)   {'MiB':>8s} {'/DeiT':>6s}  paper /DeiT")
    for name, b in train.items():
        print(f"    {name:38s} {b / 2**20:8.1f} {b / train['DeiT-Tiny']:6.2f}  {PAPER_TRAIN[name]:.2f}")
    infer = {name: nd.peak_memory(model, args.mem_batch, "infer") for name, model in models.items()
             if name == "DeiT-Tiny" or name.startswith("collapsed")}
    print(f"  inference (eval, no grad)                  {'MiB':>8s} {'/DeiT':>6s}  paper /DeiT")
    for name, b in infer.items():
        ref = 1.0 if name == "DeiT-Tiny" else 0.99
        print(f"    {name:38s} {b / 2**20:8.1f} {b / infer['DeiT-Tiny']:6.2f}  {ref:.2f}")


if __name__ == "__main__":
    main()
