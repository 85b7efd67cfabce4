"""SlimSwin counts the figures read: Fig. 1's FLOPs breakdown and Table I's attention MACs at real size.

Eryilmaz & Akturk, "SlimSwin: Gradient-Based Window-Level Head Pruning" (papers/004), on top of
:mod:`methods.slimswin`: everything here follows from the architectures (Swin-T, Swin-B at 224², no weights) and
from Algorithm 1's pair counts. The figure module (:mod:`workbench.figures.slimswin.items`) stores what these return as
figure data; nothing here reads or writes a store.
"""

from __future__ import annotations

from typing import Callable

import torch.nn as nn

__all__ = ["flops_breakdown", "table1_real_size", "deploy_form"]


def flops_breakdown() -> dict[str, dict[str, float]]:
    """Component-wise FLOPs of Swin-T and Swin-B at 224: ``{model: {component: flops}}`` (``total`` included)."""
    from methods.slimswin import SWIN_BASE, SWIN_TINY, swin_flops_breakdown

    return {name: swin_flops_breakdown(cfg, unit="flops") for name, cfg in (("Swin-T", SWIN_TINY), ("Swin-B", SWIN_BASE))}


def table1_real_size(ratio_label: Callable[[float], str]) -> tuple[list[dict], dict]:
    """Table I at real size: attention MACs of Swin-B / Swin-T under the paper's ratios (Algorithm 1's pair counts at
    the paper's i = 32, spread over layers by pairs) beside the printed ones; and the facts the caption cites
    (``step``, prunable shares ``share_b`` / ``share_t``, dense attention MACs ``swin_b``, ``swin_t``,
    ``swin_t_c128``)."""
    from methods.slimswin import (
        PAPER_RATIOS,
        PAPER_TABLE_I,
        SWIN_BASE,
        SWIN_TINY,
        SlimSwinConfig,
        attention_macs,
        pairs_to_prune,
        prunable_layers,
        sum_macs,
        swin_layers,
        uniform_masks,
    )

    step = SlimSwinConfig().step_pairs  # i = 32
    rows, share = [], {}
    for key, name, cfg in (("swin_base", "Swin-B", SWIN_BASE), ("swin_tiny", "Swin-T", SWIN_TINY)):
        dense = sum_macs(attention_macs(cfg))
        total = sum(swin_layers(cfg)[l].num_pairs for l in prunable_layers(cfg))
        share[name] = sum_macs(attention_macs(cfg), layers=prunable_layers(cfg)) / dense
        printed = [row for row in PAPER_TABLE_I if row.model == key]  # unpruned, 0.33, 0.44, 0.55, 0.67
        for r, p in zip((None, *PAPER_RATIOS), printed):
            pairs = 0 if r is None else pairs_to_prune(total, r, step)
            macs = sum_macs(attention_macs(cfg, uniform_masks(cfg, pairs)))
            rows.append({"model": f"{name} @224", "r": "unpruned" if r is None else ratio_label(r),
                         "pruned pairs": f"{pairs}/{total}", "achieved ratio": round(pairs / total, 4),
                         "attention MACs": float(f"{macs:.4g}"),
                         "reduction (%)": None if r is None else round(100 * (1 - macs / dense), 2),
                         "r x prunable share (%)": None if r is None else round(100 * r * share[name], 2),
                         "paper MACs": p.macs, "paper reduction (%)": p.reduction_pct,
                         "masks": "none" if r is None else f"Algorithm 1 at i = {step}, spread over layers by pairs"})
    facts = {"step": step, "share_b": share["Swin-B"], "share_t": share["Swin-T"],
             "swin_b": sum_macs(attention_macs(SWIN_BASE)), "swin_t": sum_macs(attention_macs(SWIN_TINY)),
             "swin_t_c128": sum_macs(attention_macs(SWIN_TINY.replace(embed_dim=128, num_heads=(4, 8, 16, 32))))}
    return rows, facts


def deploy_form(model: nn.Module) -> nn.Module:
    """The deploy form of a gated SlimSwin model: attention computes only the kept window-head pairs
    (:func:`methods.slimswin.to_pruned`)."""
    from methods.slimswin import to_pruned

    return to_pruned(model)
