"""Configurations and size variants of Sparsifiner (Wei, Duke, Jiang, Aarabi, Taylor, Shkurti —
"Sparsifiner: Learning Sparse Instance-Dependent Attention for Efficient Vision Transformers", CVPR 2023).

- :class:`SparsifinerConfig`: the connectivity mask predictor and sparse attention of §3, with the
  paper's choices as defaults and every place where the authors' public code differs as a named
  option (:meth:`SparsifinerConfig.authors_code` sets them all).
- :class:`Phase1Config`, :class:`Phase2Config`: the two-phase training of §4 ("Implementation details").
- :data:`SPARSIFINER_VARIANTS`: the backbones of Tables 1–3 (DeiT-S, DeiT-T at 384², LV-ViT-S for
  FLOP counting only: timm has no LV-ViT), the demo ViT and a tiny variant for unit tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

#: Logit scale of the low-rank attention (Eq. 1): 1/√d with d the head width (paper), or
#: num_heads^-0.5 (the authors' code, ``MaskPredictor.scale``).
Scale = Literal["head_dim", "num_heads"]
#: How the sparse basis W_up is thresholded: keep signed entries with |w| > t (paper, t = 1e-2),
#: or keep |w| where |w| > t (the authors' code: ``nn.Threshold(t)(W_up.abs())``, t = 2e-2).
BasisSign = Literal["signed", "abs"]
#: What Eq. 10 compares with the teacher's attention: the raw low-rank product A_down·W_up (the
#: authors' code; trainable from initialisation) or the thresholded Ã_down·W̃_up (the equation read
#: literally: at initialisation every coefficient is below τ when n_down > 1/τ, so no gradient flows).
Recon = Literal["raw", "thresholded"]
#: Direction of the classification distillation (Eq. 9): KL(y_pred ‖ y_teach) as printed in the
#: paper, or KL(y_teach ‖ y_pred) (the authors' code: ``F.kl_div(log p_s, log p_t, log_target=True)``).
KLDirection = Literal["pred_teach", "teach_pred"]


def budget(keep_rate: float, tokens: int) -> int:
    """Attention budget B = ⌈keep_rate · n⌉ keys per query row (§4, "Implementation details").

    Raises:
        ValueError: ``keep_rate`` outside (0, 1] or not a number.
    """
    if not isinstance(keep_rate, (int, float)) or isinstance(keep_rate, bool) or not 0 < keep_rate <= 1:
        raise ValueError(f"keep_rate must be a number in (0, 1] (the share of keys each query keeps, §4), "
                         f"got {keep_rate!r}")
    # round away float noise first: 0.1 * 50 = 5.000000000000001 must give 5, not 6
    return max(1, math.ceil(round(keep_rate * tokens, 9)))


@dataclass(frozen=True)
class SparsifinerConfig:
    """The sparse attention module of §3 (one per block; the backbone's q, k, v are reused)."""

    keep_rate: float = 0.25  # attention keep rate in (0, 1]; budget B = ⌈keep_rate · n⌉ keys per patch query (Eq. 3)
    n_down: int = 32  # reduced token dimension of W_down / W_up (§4: 32 in all experiments)
    tau: float = 0.05  # threshold τ on the low-rank attention A_down (Eq. 2; §4: 0.05)
    basis_threshold: float = 1e-2  # threshold on W_up (§4: 1e-2; the authors' code: 2e-2)
    basis_sign: BasisSign = "signed"  # see BasisSign; "abs" = the authors' code
    renormalize: bool = False  # False: kept entries keep their full-softmax values (Eq. 4); True: softmax over the kept set (code)
    scale: Scale = "head_dim"  # logit scale of Eq. 1; "num_heads" = the authors' code
    predictor_dim: int | None = None  # None: the predictor uses the full q, k (Eq. 1); int: learned per-head
    #                                      projections of q and k to this width first (code: head_dim // 2)
    coef_topk: int | None = None  # None: coefficients thresholded by τ (Eq. 2); int: keep the k largest instead (code: 8)
    layers: tuple[int, ...] | None = None  # blocks to replace; None = all (§4: every layer)
    discard_zeros: bool = True  # §3 "we discard zero values": of the Top-k_B keys, those scoring <= 0 are not kept (a
    #                             row may keep fewer than B, or none); False: exactly B always (the authors' code)

    def __post_init__(self) -> None:
        budget(self.keep_rate, 1)  # validates keep_rate
        if self.n_down < 1:
            raise ValueError(f"n_down must be >= 1, got {self.n_down}")
        if not 0 <= self.tau < 1:
            raise ValueError(f"tau must be in [0, 1) (a threshold on softmax probabilities), got {self.tau}")
        if self.basis_threshold < 0:
            raise ValueError(f"basis_threshold must be >= 0, got {self.basis_threshold}")
        if self.basis_sign not in ("signed", "abs"):
            raise ValueError(f"basis_sign must be 'signed' (paper) or 'abs' (authors' code), got {self.basis_sign!r}")
        if self.scale not in ("head_dim", "num_heads"):
            raise ValueError(f"scale must be 'head_dim' (paper) or 'num_heads' (authors' code), got {self.scale!r}")
        if self.coef_topk is not None and not 1 <= self.coef_topk <= self.n_down:
            raise ValueError(f"coef_topk must be in [1, n_down={self.n_down}] or None, got {self.coef_topk}")
        if self.predictor_dim is not None and self.predictor_dim < 1:
            raise ValueError(f"predictor_dim must be >= 1 or None, got {self.predictor_dim}")

    @classmethod
    def authors_code(cls, keep_rate: float = 0.25, head_dim: int = 64, **overrides) -> SparsifinerConfig:
        """Every choice of the authors' public code (``src/models/sparsifiner.py`` and the default
        experiment config) where it differs from the paper: renormalised softmax over the kept set,
        logit scale num_heads^-0.5, |W_up| thresholded at 2e-2, q/k reduced to head_dim // 2 by learned
        projections, the 8 largest coefficients kept instead of τ, exactly B keys per row (zero scores included)."""
        kw = dict(keep_rate=keep_rate, renormalize=True, scale="num_heads", basis_sign="abs", basis_threshold=2e-2,
                  predictor_dim=head_dim // 2, coef_topk=8, discard_zeros=False)
        return cls(**{**kw, **overrides})

    def to_kwargs(self) -> dict:
        """JSON-serialisable kwargs of the registered forms (``layers`` as a list)."""
        out = {f: getattr(self, f) for f in self.__dataclass_fields__}
        if out["layers"] is not None:
            out["layers"] = list(out["layers"])
        return out


@dataclass(frozen=True)
class Phase1Config:
    """Phase 1 (§4): backbone frozen, only the connectivity predictor trains (Eq. 10 + Eq. 11)."""

    epochs: int = 5  # §4: "loss converges within 5 epochs"
    lr: float = 3e-4  # authors' default experiment config (ATTN_RECON.BASE_LR); the paper gives none
    weight_decay: float = 0.05  # §3.3: L_spa is applied as AdamW weight decay 0.05 (Eq. 12 remark)
    attn_weight: float = 1.0  # λ_attn (§4, phase 1)
    spa_weight: float = 0.0  # λ_spa of an explicit Σ W_up² term (Eq. 11); 0: the paper uses weight decay instead
    recon: Recon = "raw"  # see Recon
    batch_size: int = 256  # not given in the paper; the authors' config uses 168 per GPU


@dataclass(frozen=True)
class Phase2Config:
    """Phase 2 (§4): backbone and predictor trained jointly with CE + Eq. 8 + Eq. 9."""

    epochs: int = 40  # §4: "another 40 epochs"
    lr: float = 8e-5  # authors' default experiment config (CLS_DISTILL.BASE_LR); the paper gives none
    weight_decay: float = 0.05  # §3.3
    token_weight: float = 0.5  # λ_distill^token (§4, phase 2)
    cls_weight: float = 0.5  # λ_distill^cls (§4, phase 2)
    attn_weight: float = 0.0  # λ_distill^attn (§4, phase 2: 0; the predictor then gets no gradient, see losses)
    kl_direction: KLDirection = "pred_teach"  # see KLDirection
    batch_size: int = 256  # not given in the paper


@dataclass(frozen=True)
class SparsifinerVariant:
    """One backbone: its timm name and size, and the predictor sizes used with it."""

    base: str | None  # timm name of the dense teacher; None = FLOP counting only (no timm model)
    base_kwargs: dict = field(default_factory=dict)  # timm.create_model kwargs of the teacher
    tokens: int = 197  # n, including the CLS token
    dim: int = 384  # D
    depth: int = 12  # L
    num_heads: int = 6  # H
    n_down: int = 32  # reduced token dimension
    keep_rates: tuple[float, ...] = (0.5, 0.25, 0.1)  # the rates the paper (or the demo) reports
    source: str = ""  # where the numbers come from

    def config(self, keep_rate: float, **overrides) -> SparsifinerConfig:
        """The :class:`SparsifinerConfig` of this variant at ``keep_rate``."""
        return replace(SparsifinerConfig(keep_rate=keep_rate, n_down=self.n_down), **overrides)

    def build_teacher(self):
        """A randomly initialised teacher (``pretrained=False`` always; nothing is downloaded)."""
        if self.base is None:
            raise ValueError("this variant has no timm model (timm has no LV-ViT); it is for FLOP counting only")
        import timm

        from .. import teachers  # noqa: F401  (registers vit_demo)

        return timm.create_model(self.base, pretrained=False, **self.base_kwargs)


#: Size variants. deit_s: Tables 1–2 (DeiT-S, 224², 197 tokens); deit_t_384: Table 3 (DeiT-T at
#: 384², 577 tokens; timm's deit_tiny_patch16_224 at img_size=384); lvvit_s: Table 1 (LV-ViT-S,
#: depth 16; not in timm, FLOP counting only); demo: the workbench's 28×28 ViT (50 tokens;
#: n_down = 8 keeps the paper's n_down/n ≈ 16%); test: a 2-block toy for unit tests.
SPARSIFINER_VARIANTS: dict[str, SparsifinerVariant] = {
    "deit_s": SparsifinerVariant("deit_small_patch16_224", {}, 197, 384, 12, 6, 32,
                                 (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.01), "Tables 1-2"),
    "deit_t_384": SparsifinerVariant("deit_tiny_patch16_224", {"img_size": 384}, 577, 192, 12, 3, 32,
                                     (0.5, 0.25, 0.1), "Table 3"),
    "lvvit_s": SparsifinerVariant(None, {}, 197, 384, 16, 6, 32, (0.5, 0.25, 0.1), "Table 1"),
    "demo": SparsifinerVariant("vit_demo", {}, 50, 64, 6, 4, 8, (0.5, 0.25, 0.1), "demo"),
    "test": SparsifinerVariant("vit_demo", {"img_size": 16, "embed_dim": 32, "depth": 2, "num_heads": 2},
                               17, 32, 2, 2, 4, (0.5, 0.25), "tests"),
}


#: The demo recipe, measured on the demo set (teacher-vit-demo at 93.7% top-1, 50 tokens, n_down = 8,
#: batch 128, no warm-up, one thread). Phase 1 does not depend on the keep rate (dense forward, Eq. 10
#: only), so one phase-1 run serves every keep rate (the state dict is the same for all). Top-1 after
#: phase 1 / phase 2: keep 0.5 (B = 25) 93.5 / 92.8, 0.25 (B = 13) 92.5 / 93.3, 0.1 (B = 5) 90.3 / 92.2;
#: with an untrained predictor 86.9 / 78.1 / 73.9. Linformer at k = 13 (keep 0.25), the same two phases
#: (E, F alone, then everything, both with Phase2Loss): 73.1. CPU time: phase 1 5 s, each phase 2 ~19 s,
#: Linformer 18 s: 81 s of one core in all (measured on a loaded machine; CPU time, not wall).
DEMO_PHASES: tuple[Phase1Config, Phase2Config] = (
    Phase1Config(epochs=1, lr=1e-2, batch_size=128),
    Phase2Config(epochs=1, lr=3e-4, batch_size=128),
)
