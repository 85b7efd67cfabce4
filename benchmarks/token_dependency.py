"""Benchmark: gradient-saliency token dependency — factored vs torch.func vmap vs loop vs captum.

One DeiT-Tiny-sized block (D = 192, N = 3 heads of D_h = 64, T = 197 tokens, random weights, eval
mode), as a teacher attention block and as a FAR block (multi-head BiLSTM), batch of 2. All
methods must give the same (B, N, T, T) map; prints wall times of one run and speed ratios to the
per-output-token loop.

Methods (workbench.analysis.dependency):
  factored      dependency_factored: per-token Jacobians (vmap(jacrev)) x the token mixer's input
                gradients for all queries at once (FAR: batched, causally truncated LSTM adjoint;
                attention: vmap over one query's row of torch.func.grad) — model_dependency's "auto"
  batched       dependency: vjp per head + vmap over the query cotangents (oneDNN off)
  loop/head     dependency_loop with the per-head function (backward runs through one head)
  loop/all      dependency_loop with a plain all-heads function, as a per-output-token script does
  captum        dependency_captum (Saliency, one forward + backward per (head, query))

Measured on the 2-core development VM (shared with other jobs, so noisy), one thread, float32,
T = 197, B = 2, one run (seconds; ratio = loop/head time / method time), ``--wrt residual``:

  attention: factored 0.018 (x54), loop/head 0.99, loop/all 2.9 (x0.34), batched 3.2 (x0.31), captum 5.0 (x0.20)
  FAR:       factored 0.55 (x5.8), loop/head 3.2, captum 3.8 (x0.85), batched 7.3 (x0.44), loop/all 12.8 (x0.25)

Re-measured with --skip-slow (load average ~3; best of 1–2 runs), factored vs loop/head:

  --wrt mixer_input: attention 0.018 s vs 1.24 (x70), FAR 1.45 vs 3.87 (x2.7)
  --wrt residual:    attention 0.015 s vs 0.80 (x53), FAR 0.76 vs 2.19 (x2.9; main before the wrt option: x2.7)
  --wrt lstm_input:  FAR 0.63 s vs 2.06 (x3.3); with --norm l1: 0.66 vs 2.24 (x3.4)

Why FAR stays at x3–6: the LSTM's input gradients for all (query, key) pairs need the reverse-mode
recurrence for every query — about T²/2 · 4H · (D_h + H) multiply-adds per sample and direction even
with causal truncation — which the factored form runs as one matmul per step at near-GEMM speed; the
per-query loop does ~4x those FLOPs (untruncated, with weight gradients) in small kernels. Attention
has a closed form (rank-one per (q, k) through the LayerNorm), hence x50.

Usage: PYTHONPATH=. python benchmarks/token_dependency.py [--threads 1] [--tokens 197] [--repeat 1]
       [--skip-captum] [--skip-slow] [--wrt mixer_input|residual|lstm_input] [--norm l2|l1]
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from timm.models.vision_transformer import Block

from methods.far import MultiHeadBiLSTM
from workbench.analysis.dependency import (
    dependency,
    dependency_captum,
    dependency_factored,
    dependency_loop,
    head_output_fn,
)

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
    ap.add_argument("--skip-slow", action="store_true", help="skip batched, loop/all and captum")
    ap.add_argument("--repeat", type=int, default=1, help="report the best of this many runs")
    ap.add_argument("--wrt", default="mixer_input", choices=["mixer_input", "residual", "lstm_input"],
                    help="input differentiated by (lstm_input: FAR block only)")
    ap.add_argument("--norm", default="l2", choices=["l2", "l1"])
    args = ap.parse_args()
    global REPEAT
    REPEAT = args.repeat
    warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    teacher = Block(192, 3, mlp_ratio=4.0, qkv_bias=True).eval()
    far = Block(192, 3, mlp_ratio=4.0, qkv_bias=True).eval()
    far.attn = MultiHeadBiLSTM(192, 3, 64).eval()
    x0 = torch.randn(args.batch, args.tokens, 192)
    print(f"T={args.tokens} B={args.batch} D=192 N=3 threads={args.threads} wrt={args.wrt} norm={args.norm} "
          f"torch={torch.__version__}")
    slow, norm = args.skip_slow, args.norm
    blocks = (("attention", teacher), ("FAR", far)) if args.wrt != "lstm_input" else (("FAR", far),)
    for name, block in blocks:
        fn = head_output_fn(block, args.wrt)
        with torch.no_grad():  # the benchmark's x is the residual input; derive the input wrt names
            x = {"residual": x0, "mixer_input": block.norm1(x0)}.get(args.wrt)
            x = block.attn.lstm_inputs(block.norm1(x0)) if x is None else x
        ref, t_loop = _timed(lambda: dependency_loop(fn, x, norm=norm))
        runs, checks = {"loop/head": t_loop}, {}
        for label, call in (
            ("factored", lambda: dependency_factored(fn, x, norm=norm)),
            ("batched", None if slow else lambda: dependency(fn, x, norm=norm)),
            ("loop/all", None if slow else lambda: dependency_loop(lambda inp: fn(inp), x, norm=norm)),
            ("captum", None if slow or args.skip_captum or norm != "l2" else lambda: dependency_captum(fn, x)),
        ):
            if call is None:
                continue
            out, runs[label] = _timed(call)
            checks[label] = (out - ref).abs().max().item()
        scale = ref.abs().max().item()
        print(f"\n{name}: dependency map {tuple(ref.shape)}, max |value| {scale:.3g}")
        for label, sec in sorted(runs.items(), key=lambda kv: kv[1]):
            diff = "" if label == "loop/head" else f"  max|diff vs loop| {checks[label]:.2e}"
            print(f"  {label:10s} {sec:8.3f} s   speed-up over loop/head x{t_loop / sec:7.2f}{diff}")
            assert label == "loop/head" or checks[label] <= 1e-4 * max(1.0, scale), f"{label} disagrees"


if __name__ == "__main__":
    main()
