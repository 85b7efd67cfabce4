"""The FAR paper's reported numbers that our tables put beside our own (Tables 1 and 3; Table 2 is
:data:`methods.far.flops.PAPER_TABLE2`).

Paper: Ren et al., "Is Attention Required for Transformer Inference? Explore Function-preserving
Attention Replacement". "†" = after structured pruning.
"""

from __future__ import annotations

#: Table 1, ImageNet top-1 (%), DeiT teachers and FAR students.
PAPER_TABLE1_IMAGENET: dict[str, float] = {
    "DeiT-Tiny": 72.2, "FAR-Tiny": 74.2, "FAR-Tiny†": 72.5,
    "DeiT-Small": 79.8, "FAR-Small": 77.9, "FAR-Small†": 75.4,
    "DeiT-Base": 81.8, "FAR-Base": 79.5, "FAR-Base†": 77.3,
}

#: Table 3, ImageNet top-1 (%) by loss schedule: train from scratch (TFS), distill with CE only,
#: with the similarity loss only, with both (Eq. 4).
PAPER_TABLE3: dict[str, dict[str, float]] = {
    "FAR-Tiny": {"scratch": 70.4, "cls": 73.4, "sim": 64.3, "combined": 74.2},
    "FAR-Small": {"scratch": 63.6, "cls": 77.3, "sim": 72.8, "combined": 77.9},
}

#: Share of the 64 hidden units per LSTM that reproduces each pruned model's Table 2 FLOPs when
#: every LSTM keeps the same number (see :data:`methods.far.flops.CONVENTIONS`, "paper_gaps").
PAPER_UNIFORM_KEEP: dict[str, float] = {"tiny": 0.48, "small": 0.50, "base": 0.52}
