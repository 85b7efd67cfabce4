"""Benchmark: Sparsifiner's sparse path against dense attention, single-thread CPU, one MHSA layer.

Random-init weights (nothing downloaded), batch 1 (one image), eval mode, no grad. For DeiT-S's
attention at 197 tokens (D = 384, 6 heads) and DeiT-T's at 577 tokens (384², D = 192, 3 heads),
n_down = 32, keep rates 0.5 / 0.25 / 0.1, it times side by side in one run (rounds interleaved,
median over repeats):

- ``dense``: timm ``Attention`` with fused SDPA (the teacher);
- ``sparse``: :class:`methods.sparsifiner.SparsifinerAttention`, deploy form (``to_sparse_path``),
  predictor included, with the renormalised softmax (the authors' code, and what the paper's FLOP
  counts assume) and with Eq. 4 literally (``renormalize=False``: dense QKᵀ for the normaliser);
- ``masked``: the train form (dense scores, masked), for reference.

It prints times relative to ``dense`` for the whole layer (qkv and output projections included)
and for the attention core (from q, k, v: predictor + kept pairs vs SDPA), the predictor's share,
and the MACs of each (``methods.sparsifiner.executed_mhsa_macs``). Run::

    PYTHONPATH=. python benchmarks/sparse_attention.py [--repeats 15] [--batch 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from timm.layers import Attention

from methods.sparsifiner import (
    SparsifinerAttention,
    SparsifinerConfig,
    connectivity_indices,
    dense_mhsa_macs,
    executed_mhsa_macs,
)

SETTINGS = ((197, 384, 6), (577, 192, 3))  # (tokens, dim, heads): DeiT-S at 224², DeiT-T at 384²


def median_times(cases: dict[str, Callable[[], object]], warmup: int, repeats: int,
                 clock: Callable[[], float] = time.thread_time) -> dict[str, float]:
    """Median time (s) of each case; rounds interleaved (rotating order) so load drifts hit all alike.

    The default clock is this thread's CPU time: on a shared, loaded machine wall time inflates
    long calls (preempted) more than short ones; CPU time of a single-threaded call does not.
    """
    names = list(cases)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + repeats):
        for n in names[r % len(names):] + names[: r % len(names)]:
            t0 = clock()
            cases[n]()
            if r >= warmup:
                times[n].append(clock() - t0)
    return {n: statistics.median(t) for n, t in times.items()}


def layer_cases(tokens: int, dim: int, heads: int, keep_rate: float, batch: int) -> tuple[dict, dict, int]:
    """Cases for one (tokens, keep rate): whole layers and the pieces of the core; MACs; budget."""
    torch.manual_seed(0)
    dense = Attention(dim, heads, qkv_bias=True).eval()
    x = torch.randn(batch, tokens, dim)
    layers = {"dense": dense}
    for name, renorm in (("sparse", True), ("sparse_eq4", False), ("masked", True)):
        cfg = SparsifinerConfig(keep_rate=keep_rate, n_down=32, renormalize=renorm)
        attn = SparsifinerAttention.from_attention(dense, tokens, 1, cfg, path="masked" if name == "masked" else "sparse")
        layers[name] = attn.eval()
    q, k, v = (torch.randn(batch, heads, tokens, dim // heads) for _ in range(3))
    sp, eq4, masked = layers["sparse"], layers["sparse_eq4"], layers["masked"]
    score = sp.predictor(q, k)[2]
    idx = connectivity_indices(score, sp.keep)
    cases = {f"layer/{n}": (lambda m=m: m(x)) for n, m in layers.items()}
    cases.update({
        "core/dense": lambda: F.scaled_dot_product_attention(q, k, v),
        "core/score": lambda: sp.predictor(q, k),  # Eq. 1-3 up to the score map
        "core/topk": lambda: connectivity_indices(score, sp.keep),  # Top-k_B of the score map
        "core/kept": lambda: sp._sparse(q, k, v, idx),  # attention at the kept pairs (renormalised)
        "core/kept_eq4": lambda: eq4._sparse(q, k, v, idx),  # Eq. 4: dense QKᵀ for the normaliser, sparse AV
        "core/masked": lambda: masked._masked(q, k, v, idx),  # train form's masked dense attention
    })
    macs = {n: executed_mhsa_macs(m) for n, m in layers.items() if n != "dense"}
    macs["dense"] = dense_mhsa_macs(tokens, dim)
    return cases, macs, sp.keep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--keep-rates", type=float, nargs="+", default=[0.5, 0.25, 0.1])
    parser.add_argument("--wall", action="store_true", help="time with the wall clock instead of thread CPU time")
    args = parser.parse_args()
    torch.set_num_threads(1)
    clock = time.perf_counter if args.wall else time.thread_time
    print(f"one thread, batch {args.batch}, median of {args.repeats} ({'wall' if args.wall else 'thread CPU'} time); "
          "every column is time / dense time (< 1 = faster)")
    print("layer = qkv + attention + output projection (timm Attention with fused SDPA as dense); core = from q, k, v")
    print(f"{'tokens':>6} {'keep':>5} {'B':>4} | {'dense ms':>8} | {'layer: sparse':>13} {'eq4':>5} {'masked':>6} | "
          f"{'core ms':>7} | {'core: sparse':>12} = {'score':>5} + {'topk':>5} + {'kept':>5} | {'eq4 kept':>8} "
          f"{'masked':>6} | {'MACs sparse/dense':>17}")
    with torch.no_grad():
        for tokens, dim, heads in SETTINGS:
            for keep in args.keep_rates:
                cases, macs, budget = layer_cases(tokens, dim, heads, keep, args.batch)
                t = median_times(cases, args.warmup, args.repeats, clock)
                ld, cd = t["layer/dense"], t["core/dense"]
                pieces = t["core/score"] + t["core/topk"] + t["core/kept"]
                print(f"{tokens:>6} {keep:>5} {budget:>4} | {1e3 * ld:>8.2f} | {t['layer/sparse'] / ld:>13.2f} "
                      f"{t['layer/sparse_eq4'] / ld:>5.2f} {t['layer/masked'] / ld:>6.2f} | {1e3 * cd:>7.2f} | "
                      f"{pieces / cd:>12.2f} = {t['core/score'] / cd:>5.2f} + {t['core/topk'] / cd:>5.2f} + "
                      f"{t['core/kept'] / cd:>5.2f} | {t['core/kept_eq4'] / cd:>8.2f} {t['core/masked'] / cd:>6.2f} | "
                      f"{macs['sparse'] / macs['dense']:>17.2f}", flush=True)


if __name__ == "__main__":
    main()
