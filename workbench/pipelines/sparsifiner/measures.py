"""Sparsifiner counts the figures read: MHSA MACs of the real DeiT-S, DeiT-T@384 and LV-ViT-S beside Tables 1-3.

Wei et al., "Sparsifiner: Learning Sparse Instance-Dependent Attention for Efficient Vision Transformers"
(CVPR 2023, papers/001), on top of :mod:`methods.sparsifiner` (:func:`methods.sparsifiner.table`, the paper's
MAC convention, with the fitted and the stated up-projection density). Everything follows from the architectures;
the figure module (:mod:`workbench.figures.sparsifiner.items`) stores what this returns as figure data.
"""

from __future__ import annotations

import json

__all__ = ["flops_rows", "sparse_path_deploy"]


def flops_rows() -> tuple[list[dict], dict]:
    """One row per (table, model, keep rate) with our MHSA MMACs (fitted / stated / zero up-density, and what our
    sparse path executes) beside the paper's, and the attrs ``rho_fitted``, ``rho_stated``, ``dense_terms``."""
    import methods.sparsifiner as S
    from methods.sparsifiner import (
        PAPER_UP_DENSITY,
        SPARSIFINER_VARIANTS,
        STATED_UP_DENSITY,
        sparsifiner_mhsa_macs,
        table,
    )

    rows = []

    def executed(name: str, k: float) -> float:
        v = SPARSIFINER_VARIANTS[name]
        per_layer = sparsifiner_mhsa_macs(v.tokens, v.dim, v.num_heads, k, v.n_down, renormalize=False)["total"]
        return per_layer * v.depth / 1e6

    for fitted, stated in zip(table("deit_s", PAPER_UP_DENSITY), table("deit_s", STATED_UP_DENSITY)):
        k = fitted["keep_rate"]
        rows.append({"table": "table2", "model": "DeiT-S @224", "keep_rate": k, "budget": fitted["budget"],
                     "ours_fitted": fitted["mhsa_mmacs"], "ours_stated": stated["mhsa_mmacs"],
                     "ours_executed": None if k == 1.0 else executed("deit_s", k), "paper": fitted["paper_mmacs"],
                     "paper_top1": next(r.top1 for r in S.PAPER_TABLE2 if r.keep_rate == k)})
    for zero, fitted in zip(table("deit_t_384", 0.0), table("deit_t_384", PAPER_UP_DENSITY)):
        k = zero["keep_rate"]
        rows.append({"table": "table3", "model": "DeiT-T @384", "keep_rate": k, "budget": zero["budget"],
                     "ours_zero": zero["mhsa_mmacs"], "ours_fitted": fitted["mhsa_mmacs"], "paper": zero["paper_mmacs"],
                     "ours_overall_zero": zero["overall_gmacs"], "ours_overall_fitted": fitted["overall_gmacs"],
                     "paper_overall": zero["paper_overall"],
                     "paper_top1": next(r.top1 for r in S.PAPER_TABLE3 if r.keep_rate == k)})
    for fitted, stated in zip(table("lvvit_s", PAPER_UP_DENSITY), table("lvvit_s", STATED_UP_DENSITY)):
        k = fitted["keep_rate"]
        rows.append({"table": "table1", "model": "LV-ViT-S @224", "keep_rate": k, "budget": fitted["budget"],
                     "ours_fitted": fitted["mhsa_mmacs"], "ours_stated": stated["mhsa_mmacs"],
                     "paper": fitted["paper_mmacs"],
                     "paper_top1": next(r.top1 for r in S.PAPER_TABLE1_LVVIT if r.keep_rate == k)})
    deit = table("deit_s", PAPER_UP_DENSITY, keep_rates=[1.0, 0.25])
    for r in deit:
        rows.append({"table": "table1", "model": "DeiT-S @224", "keep_rate": r["keep_rate"], "budget": r["budget"],
                     "ours_fitted": r["mhsa_mmacs"], "paper": r["paper_mmacs"] if r["keep_rate"] == 1.0 else None,
                     "paper_top1": 79.8 if r["keep_rate"] == 1.0 else None})
    full = {name: table(name, PAPER_UP_DENSITY, keep_rates=[1.0])[0]["terms"] for name in ("deit_s", "deit_t_384")}
    return rows, {"rho_fitted": PAPER_UP_DENSITY, "rho_stated": STATED_UP_DENSITY,
                  "dense_terms": json.dumps({k: {t: int(v) for t, v in d.items()} for k, d in full.items()})}


def sparse_path_deploy(model):
    """The sparse path of a Sparsifiner student (a copy): attention computes only the kept query-key pairs, so its
    counted MACs are the ones executed (compare.table1's deploy form)."""
    import copy

    from methods.sparsifiner import to_sparse_path

    return to_sparse_path(copy.deepcopy(model))
