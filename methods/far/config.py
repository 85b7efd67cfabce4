"""Configurations and size variants of FAR (Ren et al., "Is Attention Required for Transformer
Inference? Explore Function-preserving Attention Replacement").

- :data:`FAR_VARIANTS`: the DeiT teachers of Table 2 (tiny / small / base, N heads of D_h = 64,
  §4.1) plus a ``test`` variant small enough for unit tests on a CPU.
- :class:`FARConfig`: the substitute architecture (§3.2).

The training hyperparameters of Appendix A.1/A.2 per profile are the FAR pipeline's budgets
(``workbench.pipelines.far.budgets``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import torch.nn as nn

#: Loss schedules of Table 3: train from scratch (CE), distill with CE only, with the block
#: similarity only, or with both (Eq. 4).
Schedule = Literal["scratch", "cls", "sim", "combined"]
#: Which input a student block sees for the similarity loss: its own previous block output
#: (one end-to-end pass, Fig. 1) or the teacher's (teacher forcing, Eq. 2 read literally).
SimInput = Literal["student", "teacher"]
#: Pruning groups of §3.3 / Fig. 3: "rows" = the unit's rows of W_ih and W_hh over the 4 gates
#: (what Fig. 3 draws); "full" = also its W_hh column and the output-projection column reading it.
Grouping = Literal["rows", "full"]
#: Size variants.
VariantName = Literal["tiny", "small", "base", "test"]


@dataclass(frozen=True)
class FARVariant:
    """One teacher size and the FAR-specific learning rates used with it."""

    teacher: Optional[str]  # timm model name of the teacher; None = a bare timm VisionTransformer
    img_size: int  # training / evaluation resolution
    patch_size: int  # patch size of the teacher
    embed_dim: int  # D
    depth: int  # L, number of blocks (all replaced)
    num_heads: int  # N, attention heads = LSTM heads
    head_dim: int  # D_h, per-head size = LSTM input and hidden size
    finetune_lr: float  # App. A.1 finetuning learning rate
    prune_lr: float  # App. A.2 pruning (and post-pruning finetuning) learning rate

    def build_teacher(self, **kwargs) -> nn.Module:
        """A randomly initialised teacher of this size (``pretrained=False`` always)."""
        import timm
        from timm.models.vision_transformer import VisionTransformer

        if self.teacher is not None:
            kw = {"img_size": self.img_size, **kwargs}
            return timm.create_model(self.teacher, pretrained=False, **kw)
        kw = dict(
            img_size=self.img_size, patch_size=self.patch_size, embed_dim=self.embed_dim, depth=self.depth,
            num_heads=self.num_heads, mlp_ratio=2.0, num_classes=10,
        )
        return VisionTransformer(**{**kw, **kwargs})


#: Size variants. tiny/small/base: the DeiT models of Table 2 (N = 3/6/12 heads of D_h = 64,
#: depth 12, §4.1) with the learning rates of App. A.1/A.2; test: a 2-block toy for unit tests.
FAR_VARIANTS: dict[str, FARVariant] = {
    "tiny": FARVariant("deit_tiny_patch16_224", 224, 16, 192, 12, 3, 64, 5e-5, 5e-5),
    "small": FARVariant("deit_small_patch16_224", 224, 16, 384, 12, 6, 64, 2e-5, 5e-6),
    "base": FARVariant("deit_base_patch16_224", 224, 16, 768, 12, 12, 64, 2e-5, 5e-6),
    "test": FARVariant(None, 32, 8, 32, 2, 2, 16, 5e-4, 5e-4),
}


@dataclass(frozen=True)
class FARConfig:
    """Architecture of the substitute (§3.2). N and D_h always come from the teacher's attention."""

    own_norm: bool = True  # the substitute applies its own LayerNorm (§3.2), after the block's norm1
    hidden_dim: Optional[int] = None  # LSTM hidden size U; None = the teacher's head_dim (§3.2)
    lstm_bias: bool = True  # nn.LSTM's bias_ih and bias_hh
    layers: Optional[tuple[int, ...]] = None  # block indices to replace; None = all (global replacement, §3.1)
    out_init: Literal["default", "zero"] = "default"  # output projection init; "zero": each block starts as the teacher block minus its attention
