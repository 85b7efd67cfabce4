"""Configurations and size variants of AttentionLite (Kundu & Sundaresan, "AttentionLite: Towards
Efficient Self-Attention Models for Vision").

- :data:`SA_VARIANTS`: the students — SA-ResNet26 / SA-ResNet38 (§2.1, Tables 1–2; Parmar et al. 2019's
  architectures), the demo student for 28×28 digits, and a ``test`` variant for unit tests.
- :class:`DistillConfig`: Eq. 2's weights and the §4.1 training recipe.
- :class:`SparseConfig`: Algorithm 1's target density, pruning kind and prune-rate schedule.
- :data:`PAPER_DENSITIES`: the densities of Tables 1 and 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .losses import ATForm, Resize
from .resnet import Stem
from .sparse import Decay, Pruning, UpdateAt

__all__ = ["SAVariant", "SA_VARIANTS", "DistillConfig", "SparseConfig", "PAPER_DENSITIES", "VariantName", "DemoRecipe",
           "DEMO_RECIPE"]

VariantName = Literal["sa_resnet26", "sa_resnet38", "demo", "test"]


@dataclass(frozen=True)
class SAVariant:
    """One student size: the timm name and the arguments that rebuild it."""

    model: str  # registered timm name
    layers: tuple[int, ...]  # bottleneck blocks per stage
    channels: tuple[int, ...]  # bottleneck width per stage (stage output = 4×)
    kernel_size: int  # spatial extent k of the local attention (Eq. 1)
    num_heads: int  # attention heads N (§4.1: 8)
    stem_width: int  # stem output channels
    stem_kernel: int  # stem convolution size / attention-stem extent
    in_chans: int  # image channels
    img_size: int  # training resolution
    num_classes: int  # classifier outputs (default head)
    source: str  # where the numbers come from

    def kwargs(self, stem: Stem = "conv", num_classes: int | None = None) -> dict:
        """JSON kwargs of ``timm.create_model(self.model, **kwargs)`` (named variants need only stem / classes)."""
        kw: dict = {"stem": stem, "num_classes": num_classes or self.num_classes}
        if self.model == "sa_resnet":
            kw.update(layers=list(self.layers), channels=list(self.channels), kernel_size=self.kernel_size,
                      num_heads=self.num_heads, stem_width=self.stem_width, stem_kernel=self.stem_kernel,
                      in_chans=self.in_chans)
        return kw

    def build(self, stem: Stem = "conv", num_classes: int | None = None, **overrides):
        import timm

        return timm.create_model(self.model, **{**self.kwargs(stem, num_classes), **overrides})


#: Student sizes. sa_resnet26/38: Parmar et al. (2019) as used in Tables 1–2 (bottlenecks (1,2,4,1) /
#: (2,3,5,2), widths 64–512, 8 heads §4.1, k = 7 as Ramachandran et al.; the paper states no k), with a
#: CIFAR stem. demo: 28×28×1 digits with the stage strides of the demo teacher ``cnn_demo`` (28/14/7/4,
#: so the AT maps line up), k = 3 (a 3×3 conv's footprint; k = 7 would cover the 7×7 and 4×4 stages
#: entirely and costs 5× the neighbour products), 2 heads; about 1/6 of the teacher's parameters,
#: like SA-ResNet26 is ~1/3 of ResNet50. test: a four-stage toy (timm's ResNet runs layer1–layer4).
SA_VARIANTS: dict[str, SAVariant] = {
    "sa_resnet26": SAVariant("sa_resnet26", (1, 2, 4, 1), (64, 128, 256, 512), 7, 8, 64, 3, 3, 32, 10,
                             "Tables 1–2 (SA ResNet26); Parmar et al. 2019"),
    "sa_resnet38": SAVariant("sa_resnet38", (2, 3, 5, 2), (64, 128, 256, 512), 7, 8, 64, 3, 3, 32, 10,
                             "Tables 1–2 (SA ResNet38); Parmar et al. 2019"),
    "demo": SAVariant("sa_resnet_demo", (1, 1, 1, 1), (8, 16, 32, 32), 3, 2, 16, 3, 1, 28, 10,
                      "demo student beside cnn_demo (methods.teachers)"),
    "test": SAVariant("sa_resnet", (1, 1, 1, 1), (4, 4, 8, 8), 3, 2, 8, 3, 1, 12, 10, "unit tests"),
}


@dataclass(frozen=True)
class DistillConfig:
    """Eq. 2 and the training recipe of §4.1 (CIFAR)."""

    alpha: float = 0.1  # weight of the cross-entropy; the KL gets 1 − α (§4.1, after Tian et al.)
    beta: float = 1000.0  # AT weight (§4.1); 0 = KD only
    rho: float = 4.0  # softmax temperature ρ (not stated; Tian et al.'s default)
    p: float = 2.0  # exponent of the AT map F^p (§3; Zagoruyko & Komodakis use 2)
    at_form: ATForm = "mean_squared"  # Zagoruyko's mean-squared AT (β = 1000 fits it) or Eq. 2's norm
    resize: Resize = "none"  # stage maps of different sizes: refuse, or average-pool the larger
    kl_scale: bool = True  # multiply the KL by ρ² (Hinton; RepDistiller) — Eq. 2 prints none
    epochs: int = 200  # §4.1 (CIFAR; Tiny-ImageNet: 100)
    batch_size: int = 100  # §4.1 (CIFAR; Tiny-ImageNet: 32)
    lr: float = 0.1  # initial learning rate (§4.1)
    weight_decay: float = 1e-4  # §4.1
    opt: str = "momentum"  # SGD with momentum 0.9 (timm "momentum"; the paper names no optimizer)
    milestones: tuple[int, ...] = (120, 160, 180)  # lr × 0.1 after these epochs (§4.1, CIFAR)
    lr_gamma: float = 0.1  # step factor (§4.1)


@dataclass(frozen=True)
class SparseConfig:
    """Algorithm 1: sparse momentum at a global target density."""

    density: float = 0.1  # target parameter density d (Table 1: 0.1 irregular CIFAR, 0.25 Tiny-ImageNet / Table 2, 0.5 column)
    pruning: Pruning = "irregular"  # "irregular" (weights) or "column" (columns of C_out × C_in·k·k, §3)
    prune_rate: float = 0.5  # p_0, fraction of each layer's active units pruned after epoch 0 (Dettmers' default)
    decay: Decay = "linear"  # p_e schedule: "linear" (Alg. 1 line 16) or "cosine" (Dettmers)
    exclude: tuple[str, ...] = field(default_factory=tuple)  # fnmatch patterns of layers left dense (none, as Dettmers)
    adam_normalize: bool = False  # Adam: regrow by exp_avg / √exp_avg_sq (Dettmers' code) instead of exp_avg
    seed: int = 0  # seeds the random initial masks
    update_at: UpdateAt = "next_step"  # run epoch e's update after epoch e+1's first step (evaluations see trained weights)


#: (table, student variant, pruning) -> target density d of the paper's runs (Table 1 / 2 captions).
PAPER_DENSITIES: dict[tuple[str, str, str], float] = {
    ("table1", "cifar", "irregular"): 0.1,
    ("table1", "tiny-imagenet", "irregular"): 0.25,
    ("table1", "any", "column"): 0.5,
    ("table2", "any", "irregular"): 0.25,
    ("table2", "any", "column"): 0.5,
}


@dataclass(frozen=True)
class DemoRecipe:
    """Budget of the demo profile (teacher ``teacher-cnn-demo``, student ``sa_resnet_demo``), measured for the pipeline.

    Four runs — {irregular d = 0.25, column d = 0.5} × {KD, KD+AT} — took 42–53 s of one CPU core each
    (process time on the loaded 2-core VM), ≈ 3 minutes together, with these settings.
    """

    epochs: int = 3  # sparse-momentum updates after epochs 0 and 1 (p = 0.5, 0.25)
    train_limit: int = 1600  # stratified training images per epoch (of 4000)
    batch_size: int = 32  # 50 steps per epoch
    opt: str = "adamw"  # converges in 3 epochs where SGD 0.1 (§4.1, 200 epochs) does not
    lr: float = 1e-2  # cosine to min_lr, no warm-up
    weight_decay: float = 0.01  # AdamW
    min_lr: float = 1e-5  # cosine floor
    warmup_epochs: int = 0  # no warm-up in a 3-epoch run
    beta: float = 20.0  # AT weight of the demo: β = 1000 (§4.1) swamps CE and KL in 3 epochs (val 39 % vs 88 % KD only)
    irregular_density: float = 0.25  # Fig. 2's d
    column_density: float = 0.5  # Fig. 3's d


DEMO_RECIPE = DemoRecipe()
