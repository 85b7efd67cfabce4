"""Benchmark: gradient-saliency token dependency, batched (torch.func) vs loop vs captum.

One DeiT-Tiny-sized block (D = 192, N = 3 heads of D_h = 64, T = 197 tokens, random weights, eval
mode), as a teacher attention block and as a FAR block (multi-head BiLSTM), batch of 2. All
methods must give the same (B, N, T, T) map; prints wall times of one run and speed ratios.

Methods:
  batched       workbench.analysis.dependency.dependency  (vjp per head + vmap over queries)
  loop/head     dependency_loop with the per-head function (backward runs through one head)
  loop/all      dependency_loop with a plain all-heads function, as a per-output-token script does
  loop/generic  loop/head with oneDNN off (the LSTM's generic autograd path, as batched uses)
  captum        dependency_captum (Saliency, one forward + backward per (head, query))

Usage: PYTHONPATH=. python benchmarks/token_dependency.py [--threads 1] [--tokens 197] [--repeat 1]
       [--skip-captum]
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from timm.models.vision_transformer import Block

from methods.far import MultiHeadBiLSTM
from workbench.analysis.dependency import dependency, dependency_captum, dependency_loop, head_output_fn


REPEAT = 1


def _timed(fn):
    """Result and the best wall time of REPEAT runs."""
    best = float("inf")
    for _ in range(REPEAT):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return out, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--tokens", type=int, default=197, help="sequence length T")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--skip-captum", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="report the best of this many runs")
    args = ap.parse_args()
    global REPEAT
    REPEAT = args.repeat
    warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    teacher = Block(192, 3, mlp_ratio=4.0, qkv_bias=True).eval()
    far = Block(192, 3, mlp_ratio=4.0, qkv_bias=True).eval()
    far.attn = MultiHeadBiLSTM(192, 3, 64).eval()
    x = torch.randn(args.batch, args.tokens, 192)
    print(f"T={args.tokens} B={args.batch} D=192 N=3 threads={args.threads} torch={torch.__version__}")
    for name, block in (("attention", teacher), ("FAR", far)):
        fn = head_output_fn(block)
        ref, t_batched = _timed(lambda: dependency(fn, x))
        runs = {"batched": t_batched}
        checks = {}
        for label, call in (
            ("loop/head", lambda: dependency_loop(fn, x)),
            ("loop/all", lambda: dependency_loop(lambda inp: fn(inp), x)),
            ("loop/generic", lambda: _generic(lambda: dependency_loop(fn, x))),
            ("captum", None if args.skip_captum else lambda: dependency_captum(fn, x)),
        ):
            if call is None:
                continue
            out, runs[label] = _timed(call)
            checks[label] = (out - ref).abs().max().item()
        scale = ref.abs().max().item()
        print(f"\n{name}: dependency map {tuple(ref.shape)}, max |value| {scale:.3g}")
        for label, sec in runs.items():
            diff = "" if label == "batched" else f"  max|diff vs batched| {checks[label]:.2e}"
            print(f"  {label:13s} {sec:8.2f} s   batched speed-up x{sec / t_batched:6.2f}{diff}")
            assert label == "batched" or checks[label] <= 1e-4 * max(1.0, scale), f"{label} disagrees"


def _generic(call):
    with torch.backends.mkldnn.flags(enabled=False):
        return call()


if __name__ == "__main__":
    main()
