"""Size variants and hyperparameters of Non-deep ViT ("Non-deep Vision Transformers", anonymous ICLR submission).

- :data:`NONDEEP_VARIANTS`: the paper's DeiT-Tiny compressions (12 → 6 / 4 / 3 blocks, Tables 1, 2,
  5, 6, 10, 11), the demo profile's two students (issue 11) and a ``test`` variant small enough for
  unit tests on a CPU.
- :class:`JoinConfig`: the progressive-joining phase (§3.4, App. A.2, App. B), with the paper's
  values as defaults; :data:`DEMO_JOIN` the demo budget measured on this machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch.nn as nn

from .schedules import Schedule, check_schedule


@dataclass(frozen=True)
class NonDeepVariant:
    """One teacher and branch count: L blocks become L/n parallel blocks of n branches."""

    base: str  # timm name of the teacher (the base of nondeep_branched / nondeep_collapsed)
    branches: int  # n
    paper: str  # what the variant stands for in the paper
    base_kwargs: tuple[tuple[str, Any], ...] = ()  # extra creation kwargs of the teacher, as (key, value) pairs

    def kwargs(self, **overrides: Any) -> dict:
        """JSON-serialisable kwargs of ``timm.create_model("nondeep_branched", **kwargs)``."""
        return {"base": self.base, "base_kwargs": dict(self.base_kwargs), "branches": self.branches, **overrides}

    def build_teacher(self, **kwargs: Any) -> nn.Module:
        """A randomly initialised teacher (never downloads)."""
        import timm

        import methods.teachers  # noqa: F401  (registers vit_demo)

        return timm.create_model(self.base, pretrained=False, **{**dict(self.base_kwargs), **kwargs})


#: Size variants. deit6/4/3: DeiT-Tiny (12 blocks, 3 heads of 64, Table 1) with 2 / 3 / 4 branches
#: (the paper's D-MAE-6-R / 4-R / 3-R and DeiT-6-R / 4-R / 3-R); demo3/demo2: the 6-block demo ViT
#: with 2 / 3 branches (issue 11); test: a 4-block ViT of width 16 for unit tests.
NONDEEP_VARIANTS: dict[str, NonDeepVariant] = {
    "deit6": NonDeepVariant("deit_tiny_patch16_224", 2, "DeiT-6-R / D-MAE-6-R (Tables 1, 2, 5, 6)"),
    "deit4": NonDeepVariant("deit_tiny_patch16_224", 3, "DeiT-4-R / D-MAE-4-R (Tables 1, 2, 5, 6)"),
    "deit3": NonDeepVariant("deit_tiny_patch16_224", 4, "DeiT-3-R / D-MAE-3-R (Tables 1, 2, 5, 6)"),
    "demo3": NonDeepVariant("vit_demo", 2, "demo: 6-block teacher -> 3 blocks x 2 branches"),
    "demo2": NonDeepVariant("vit_demo", 3, "demo: 6-block teacher -> 2 blocks x 3 branches"),
    "test": NonDeepVariant("vit_demo", 2, "unit tests",
                           (("img_size", 16), ("embed_dim", 16), ("depth", 4), ("num_heads", 2))),
}


@dataclass(frozen=True)
class JoinConfig:
    """The progressive-joining phase: train the branched model while λ goes 0 → 1, then at λ = 1."""

    schedule: Schedule = "linear"  # λ(t) (App. B.2); linear is the paper's default (§3.3, App. A.2, Table 5)
    warmup_steps: int = 10_000  # Lambda Warmup Period in optimizer steps (App. B.1: 10k best)
    adjust_steps: int = 50_000  # Post-Joining Adjustment Phase at λ = 1 (App. B.1)
    rectify: bool = True  # variance rectification √(1+(n−1)λ²) of the joined scores (§3.3)
    diversity_weight: float = 0.05  # α of the diversity regulariser (§4)
    distill_weight: float = 0.0  # β of the attention-map MSE; the paper uses it for D-MAE but gives no weight
    kd_weight: float = 0.0  # soft-label distillation from the teacher's logits (not in the paper)
    kd_temperature: float = 1.0  # its temperature
    teacher_layer: Literal["last", "first"] = "last"  # teacher block matched to each student block for distillation
    lr: float = 1e-3  # AdamW peak learning rate (Table 7: joining "largely follows" pre-training, App. A.2)
    weight_decay: float = 0.05  # Table 7
    batch_size: int = 1024  # Table 7

    def __post_init__(self) -> None:
        check_schedule(self.schedule)
        if self.warmup_steps < 0 or self.adjust_steps < 0:
            raise ValueError("warmup_steps and adjust_steps must be ≥ 0")

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.adjust_steps


#: The demo profile's joining phase, measured on the 2-core machine (one torch thread, demo set of 4000
#: training images, batch 32 = 125 steps per epoch, AdamW, cosine learning rate without warm-up down to
#: lr/100): two epochs, λ linear over the first, logit distillation (T = 1) and α = 0.05. 28-32 s (3x2)
#: and 28-35 s (2x3) of one core; collapsed students 88.4% / 83.3-83.9% on the held-out 1000 (teacher
#: 93.7%; the teacher's first 3 / 2 blocks trained the same way: 82.9% / 72.2%).
DEMO_JOIN = JoinConfig(warmup_steps=125, adjust_steps=125, kd_weight=1.0, lr=5e-4, batch_size=32)
#: Table 5's ablation on the demo: one epoch of 2000 images per row (63 steps; warm-up over half of it), same loss.
DEMO_ABLATION = JoinConfig(warmup_steps=31, adjust_steps=32, kd_weight=1.0, lr=5e-4, batch_size=32)

__all__ = ["DEMO_ABLATION", "DEMO_JOIN", "NONDEEP_VARIANTS", "JoinConfig", "NonDeepVariant"]
