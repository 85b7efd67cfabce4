"""Benchmark: cost of attention extraction against a plain forward and timm's ``AttentionExtract``.

Random-init weights (no download), eval mode, no grad. Times, as the median over repeats after
warm-up:

- ``forward (fused)``: the untouched model, timm's default fused attention;
- ``run_with_cache``: our named hook points (``blocks.*.attn.hook_pattern``; unfused path while hooked) on a
  forward, no Dataset assembly;
- ``extract_attention``: the registered extractor, incl. the xarray Dataset;
- ``timm AttentionExtract (fx)`` / ``(hook)``: timm's tool (it needs the unfused path, so it runs on
  a copy with ``fused_attn=False``, built once outside the timing).

Also checks that AttentionExtract's maps equal ours. Run::

    PYTHONPATH=. python benchmarks/attention_extract.py [--batch 8] [--repeats 9] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Callable

import numpy as np
import timm
import torch
from timm.utils import AttentionExtract

from methods.hooks import run_with_cache
from workbench.analysis.attention import extract_attention


def median_times(
    cases: dict[str, Callable[[], object]], warmup: int, repeats: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Median and minimum wall time (s) of each case after ``warmup`` untimed rounds.

    Rounds are interleaved (every case once per round, in rotating order) so that a drifting
    machine load affects all cases alike.
    """
    names = list(cases)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + repeats):
        for n in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            cases[n]()
            if r >= warmup:
                times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}, {n: min(t) for n, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="deit_tiny_patch16_224")
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False, img_size=args.img_size).eval()
    for m in model.modules():  # the default, made explicit: the plain forward is the fused one
        if hasattr(m, "fused_attn"):
            m.fused_attn = True
    images = torch.randn(args.batch, 3, args.img_size, args.img_size)

    unfused = copy.deepcopy(model)
    for m in unfused.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    timm_fx = AttentionExtract(unfused, method="fx")  # default node names '*attn.softmax'
    timm_hook = AttentionExtract(unfused, method="hook")  # default module names '*attn_drop'

    def plain() -> object:
        with torch.no_grad():
            return model(images)

    def recorded() -> object:
        with torch.no_grad():
            return run_with_cache(model, images, names="blocks.*.attn.hook_pattern")

    def ours() -> object:
        return extract_attention(model, images)

    def theirs_fx() -> object:
        with torch.no_grad():
            return timm_fx(images)

    def theirs_hook() -> object:
        with torch.no_grad():
            return timm_hook(images)

    cases = {
        "forward (fused)": plain,
        "run_with_cache": recorded,
        "extract_attention": ours,
        "timm AttentionExtract (fx)": theirs_fx,
        "timm AttentionExtract (hook)": theirs_hook,
    }
    times, best = median_times(cases, args.warmup, args.repeats)

    print(
        f"{args.model} @ {args.img_size}px, batch {args.batch}, torch {torch.__version__}, timm {timm.__version__}, "
        f"{torch.get_num_threads()} threads; median of {args.repeats} interleaved rounds after {args.warmup} warm-up"
    )
    base, ext = times["forward (fused)"], times["extract_attention"]
    bbase = best["forward (fused)"]
    print(f"{'':30s} {'median ms':>10s} {'/ forward':>10s} {'/ extract':>10s} {'min ms':>9s} {'min / fwd':>10s}")
    for name, t in times.items():
        row = f"{t * 1e3:10.1f} {t / base:10.2f} {t / ext:10.2f} {best[name] * 1e3:9.1f} {best[name] / bbase:10.2f}"
        print(f"{name:30s} {row}")

    ds = extract_attention(model, images)
    for label, maps in (("fx", theirs_fx()), ("hook", theirs_hook())):
        stacked = np.stack([v.numpy() for v in maps.values()], axis=1)  # (B, layer, head, N, N)
        diff = float(np.abs(stacked - ds.attention.values).max())
        print(f"AttentionExtract ({label}) {len(maps)} maps, max |theirs - ours| = {diff:.2e}")
        assert stacked.shape == ds.attention.shape and diff <= 1e-6, "AttentionExtract disagrees with extract_attention"


if __name__ == "__main__":
    main()
