"""The Sparsifiner paper's reported numbers that our tables put beside our own.

Paper: Wei et al., "Sparsifiner: Learning Sparse Instance-Dependent Attention for Efficient Vision
Transformers", CVPR 2023. "MHSA (MFLOPs)" counts QKᵀ, AV and the connectivity predictor (not the
qkv / output projections); see :mod:`.flops` for the convention.
"""

from __future__ import annotations

from typing import NamedTuple


class Row(NamedTuple):
    """One row of a paper table."""

    keep_rate: float  # attention keep rate (1.0 = the dense model)
    budget: int  # attention budget B ("Att. num.", Table 2); 0 where the paper gives none
    mhsa_mflops: float  # MHSA "MFLOPs" as printed (= millions of multiply-accumulates)
    top1: float  # ImageNet top-1 (%)


#: Table 2: Sparsifiner-S (DeiT-S, 224², 197 tokens, depth 12, D = 384) over the attention keep rate.
PAPER_TABLE2: tuple[Row, ...] = (
    Row(1.0, 197, 357.7, 79.82), Row(0.9, 178, 396.8, 80.02), Row(0.8, 158, 360.6, 79.97),
    Row(0.7, 138, 324.6, 79.96), Row(0.6, 119, 290.3, 79.98), Row(0.5, 99, 254.2, 79.94),
    Row(0.4, 79, 218.0, 79.92), Row(0.3, 60, 183.6, 79.83), Row(0.2, 40, 147.5, 79.71),
    Row(0.1, 20, 111.4, 79.42), Row(0.05, 10, 93.3, 78.75), Row(0.01, 2, 78.9, 73.03),
)

#: Table 3: Sparsifiner-T (DeiT-T, 384², 577 tokens, D = 192); "Overall (GFLOPs)" beside each row.
PAPER_TABLE3: tuple[Row, ...] = (
    Row(1.0, 577, 1534.1, 75.45), Row(0.5, 289, 851.0, 75.45), Row(0.25, 145, 452.9, 75.35), Row(0.1, 58, 240.5, 74.58),
)
PAPER_TABLE3_OVERALL_GFLOPS: dict[float, float] = {1.0: 3.58, 0.5: 2.89, 0.25: 2.49, 0.1: 2.28}

#: Table 1, LV-ViT-S rows without token pruning (197 tokens, depth 16, D = 384).
PAPER_TABLE1_LVVIT: tuple[Row, ...] = (
    Row(1.0, 197, 476.9, 83.3), Row(0.5, 99, 339.7, 83.4), Row(0.25, 50, 221.7, 83.3), Row(0.1, 20, 149.5, 82.8),
)

#: Table 4: Linformer (reduced dimension = Sparsifiner-S's budget) vs Sparsifiner-S, MHSA MFLOPs and top-1.
PAPER_TABLE4: dict[str, tuple[float, float]] = {"Linformer": (246.73, 77.54), "Sparsifiner-S": (224.04, 79.79)}

#: §4: "we set the reduced dimension n_down to 32 and τ to 0.05 which ensures 87% sparsity ratio of
#: the basis coefficient"; "a threshold 1e-2 on basis W_up to ensure 90% sparsity".
PAPER_COEF_SPARSITY = 0.87
PAPER_BASIS_SPARSITY = 0.90
