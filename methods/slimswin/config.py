"""SlimSwin's hyper-parameters (Eryilmaz & Akturk, "SlimSwin: Gradient-Based Window-Level Head Pruning", §V-B)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["SaliencyReduce", "Exclude", "SlimSwinConfig"]

#: how per-sample gate gradients become one score (see :func:`.saliency.window_head_saliency`)
SaliencyReduce = Literal["abs_of_mean", "abs", "signed"]
#: layers never pruned (paper §V-A: the last stage)
Exclude = Literal["last_stage", "single_window", "none"]


@dataclass(frozen=True)
class SlimSwinConfig:
    """Hyper-parameters of SlimSwin (§V-B); entries the paper does not state are marked ours."""

    gate_mode: Literal["qkv", "output"] = "qkv"  # gate Q, K, V (paper §IV-C) or the head output (Michel et al.)
    reduce: SaliencyReduce = "abs_of_mean"  # how per-sample gate gradients become one score (see window_head_saliency)
    exclude: Exclude = "last_stage"  # layers never pruned: the last stage (paper §V-A)
    target_ratio: float = 1 / 3  # global ratio r of pruned window-head pairs; paper: 1/3, 4/9, 5/9, 2/3 (macs.PAPER_RATIOS)
    step_pairs: int = 32  # pairs pruned per iteration i (ours: not stated; divides r*pairs at 1/3 ... 2/3 for Swin-T, 1/3 and 2/3 for Swin-B)
    saliency_samples: int = 256  # |d-hat|, images per saliency estimate (ours: not stated)
    finetune_fraction: float = 0.1  # |D-hat| / |D|, subset for the 1-epoch fine-tune per iteration (ours: not stated)
    iteration_epochs: int = 1  # fine-tuning epochs per iteration (paper: one)
    final_epochs: int = 15  # final fine-tuning epochs on the full training set (paper: 15)
    kd_alpha: float = 0.7  # distillation weight, teacher = unpruned model (paper)
    kd_temperature: float = 2.0  # distillation temperature T (paper)
    lr: float = 5e-5  # AdamW learning rate (paper)
    weight_decay: float = 1e-4  # AdamW weight decay (paper)
    warmup_fraction: float = 0.1  # final fine-tune: linear warm-up share of the schedule (paper)
    min_lr: float = 1e-6  # final fine-tune: warm-up start and cosine floor (paper)

    def __post_init__(self) -> None:
        if not 0.0 < self.target_ratio < 1.0:
            raise ValueError(f"target_ratio must be in (0, 1), got {self.target_ratio}")
        if self.step_pairs < 1:
            raise ValueError(f"step_pairs must be >= 1, got {self.step_pairs}")
