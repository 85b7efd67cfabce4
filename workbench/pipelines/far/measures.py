"""FAR measurements the figures read: Table 2's params, MACs and single-thread CPU latency at real size.

Ren et al., "Is Attention Required for Transformer Inference? Explore Function-preserving Attention
Replacement" (papers/000), Table 2. Counts: :func:`methods.far.count_flops` (the shared counter
:func:`methods.flops.count_macs`, every attention kernel and the fused LSTM kernels; MACs = the paper's fvcore
"FLOPs"). Latency: :func:`methods.far.torch_latencies_ms`, one thread, batch 1, DeiT, FAR and FAR† of one size
timed round-robin after their MAC counts' forward passes. The figure module (:mod:`workbench.figures.far.tables`)
stores the rows as figure data; nothing here reads or writes a store.
"""

from __future__ import annotations

import statistics
from typing import Callable, Iterable

import torch.nn as nn

__all__ = ["table2_rows"]


def table2_rows(variants: Iterable[str], sizes: Iterable[int], repeats: int, warmup: int,
                demo_models: list[tuple[str, nn.Module]], log: Callable[[str], None]) -> list[dict]:
    """One row per model: real-size DeiT / FAR / FAR† of every variant and size (random weights; FAR† with the
    paper's uniform keep fraction), then the ``demo_models`` (label, model), with the paper's Table 2 beside.

    Everything runs on one CPU thread (building and counting too: a second thread only oversubscribes a shared
    2-core CPU).
    """
    from workbench.runtime import cpu_threads

    with cpu_threads(1):
        return _measure_all(variants, sizes, repeats, warmup, demo_models, log)


def _measure_all(variants, sizes, repeats, warmup, demo_models, log) -> list[dict]:
    import torch

    from methods.far import (
        FAR_VARIANTS,
        PAPER_TABLE2,
        PAPER_UNIFORM_KEEP,
        count_flops,
        replace_attention,
        shrink,
        torch_latency_ms,
        torch_latency_runs_ms,
        uniform_keep_masks,
    )

    rows = []
    for v in variants:
        for size in sizes:
            torch.manual_seed(0)
            teacher = FAR_VARIANTS[v].build_teacher(img_size=size).eval()
            far = replace_attention(teacher).eval()
            keep = PAPER_UNIFORM_KEEP[v]
            pruned = shrink(far, uniform_keep_masks(far, keep)).eval()
            family = {"DeiT": teacher, "FAR": far, "FAR†": pruned}
            counts = {}
            for kind, model in family.items():
                log(f"  table2: counting {kind} {v} at {size}px")
                counts[kind] = count_flops(model, size)["total"]
            log(f"  table2: timing DeiT, FAR, FAR† {v} at {size}px ({repeats} round-robin runs)")
            runs = torch_latency_runs_ms(family, size, repeats=repeats, warmup=warmup)  # kind -> per-run ms
            for kind in family:
                name = f"{kind.rstrip('†')}-{v.capitalize()}{'†' if kind.endswith('†') else ''}"
                c = counts[kind]
                paper = PAPER_TABLE2[name]
                rows.append({"model": name, "size": size, "params_m": c["params"] / 1e6, "gmacs": c["macs"] / 1e9,
                             "ms": statistics.median(runs[kind]),
                             # this model's time / DeiT's in each round-robin run: paired, an interval over runs
                             "ratio_runs": ",".join(f"{a / d:.5f}" for a, d in zip(runs[kind], runs["DeiT"])),
                             "paper_params_m": paper.params_m, "paper_gflops": paper.gflops_224 if size == 224 else paper.gflops_384,
                             "paper_ms": paper.cpu_ms_224 if size == 224 else paper.cpu_ms_384,
                             "keep": keep if kind == "FAR†" else None, "family": f"{v}-{size}"})
    for name, model in demo_models:
        size = model.patch_embed.img_size[0]
        c = count_flops(model, size)["total"]
        rows.append({"model": name, "size": size, "params_m": c["params"] / 1e6, "gmacs": c["macs"] / 1e9,
                     "ms": torch_latency_ms(model, size, repeats=max(repeats, 5) * 2, warmup=max(1, warmup)),
                     "paper_params_m": None, "paper_gflops": None, "paper_ms": None, "keep": None, "family": "demo",
                     "ratio_runs": ""})
    return rows
