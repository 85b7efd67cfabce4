"""AttentionLite's Tables 1 and 2, and the same reductions computed for our models at paper size.

Reductions are teacher / student: parameters (the pruned student's size: every weight its masks keep,
and every parameter they do not cover — BatchNorm, biases, relative embeddings — whatever its value;
:func:`~.introspect.count_params`' ``kept``) and FLOPs (the paper's "FLOPs"; we count MACs with
``methods.flops.count_macs`` — a ratio of MACs equals a ratio of FLOPs at 2 FLOPs per MAC). The teacher
is timm's ``resnet50`` with a 10 / 100-class head. For MACs at 32×32 the teacher needs the CIFAR stem
(3×3 stride 1, no max pool, as the students): timm's ImageNet stem would shrink a 32×32 image to 8×8
before the first stage (16× fewer MACs).

What :func:`reductions` gives beside the paper (CIFAR-10 head, hybrid; the others are alike):

==================  =====  ==========================  ==========================
SA-ResNet26         d      params ours / paper          FLOPs ours / paper
==================  =====  ==========================  ==========================
irregular           0.1    27.06× / 29.75× (KD)         12.54× (non-zero MACs) / 1.96×
column              0.5    5.64× / 5.81× (KD)           4.35× (shrunk) / 2.02×
dense student       1      2.83×                        1.91×
==================  =====  ==========================  ==========================

- The parameters counted are what the masks keep, not the non-zero values: at initialisation all
  BatchNorm shifts and timm's zero-initialised last BN scale of every block are 0 (22,464 parameters
  of SA-ResNet26), and a count of non-zeros would call them pruned (27.78× instead of 27.06× above).
- Column pruning's shrunk model has fewer parameters than the masked one keeps (3.64 M vs 4.17 M for
  SA-ResNet26 at d = 0.5: 6.46× instead of 5.64×): pruned attention inputs and conv3 columns free
  whole conv1 filters and value rows, which :func:`~.shrink.shrink` removes as well.
- The paper's FLOPs reductions (1.89–2.02× for SA-ResNet26, 1.45–1.61× for SA-ResNet38, irregular
  and column alike) match the *dense* students' (ours 1.91× / 1.48×): they count the student's
  FLOPs without its sparsity. Counting what a pruned model computes gives far more.
- The paper's parameter reductions are 0.5–12 % above ours at the same d (largest at d = 0.1: 29.75×
  / 30.26× against our 27.06× for SA-ResNet26, 20.15× / 20.34× against 18.52× for SA-ResNet38), and
  differ between KD and KD+AT at the same d: its realised densities vary around the target (Dettmers'
  code regrows approximately), ours are exact (irregular) or within one column (column pruning).
  29.75× at d = 0.1 implies 0.79 M kept parameters, a realised density ≈ 0.090 of our SA-ResNet26's
  8.26 M prunable conv / linear weights (8.31 M parameters in all; norms and relative embeddings stay
  dense, so our kept count is 0.1 · 8.26 M + 0.04 M = 0.87 M) — or a paper that does not count its
  dense parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import timm
import torch
import torch.nn as nn
from timm.models import register_model

from .config import SA_VARIANTS
from .introspect import count_macs_sparse, count_params
from .shrink import shrink
from .sparse import SparseMomentum

__all__ = ["PaperRow", "PAPER_TABLE1", "PAPER_TABLE2", "cifar_resnet50", "resnet50_cifar", "Reduction", "reductions"]


@dataclass(frozen=True)
class PaperRow:
    """One row of Table 1 (hybrid) or Table 2 (homogeneous, KD+AT)."""

    student: str  # "sa_resnet26" / "sa_resnet38"
    stem: str  # "conv" (hybrid, Table 1) / "attention" (homogeneous, Table 2)
    dataset: str  # "cifar10", "cifar100", "tiny-imagenet"
    distill: str  # "KD" or "KD+AT"
    pruning: str  # "irregular" / "column"
    density: float  # target d (captions)
    accuracy: Optional[float]  # % (None: the cell is empty in the paper)
    teacher_acc: float  # ResNet50 teacher, %
    student_acc: float  # unoptimised (dense, no KD) hybrid student, %
    param_reduction: float  # ×
    flops_reduction: float  # ×
    homogeneous_acc: Optional[float] = None  # Table 2: unoptimised homogeneous student, %


def _t1(student, dataset, teacher, base, rows):
    d_irr = 0.25 if dataset == "tiny-imagenet" else 0.1
    return [PaperRow(student, "conv", dataset, dist, pr, d_irr if pr == "irregular" else 0.5, acc, teacher, base, p, f)
            for dist, pr, acc, p, f in rows]


#: Table 1: hybrid students, d = 0.1 (irregular, CIFAR), 0.25 (irregular, Tiny-ImageNet), 0.5 (column).
PAPER_TABLE1: list[PaperRow] = [
    *_t1("sa_resnet26", "cifar10", 95.34, 92.77, [
        ("KD", "irregular", None, 29.75, 1.96), ("KD", "column", 93.74, 5.81, 2.02),
        ("KD+AT", "irregular", 94.7, 30.26, 1.91), ("KD+AT", "column", 94.88, 5.83, 2.02)]),
    *_t1("sa_resnet26", "cifar100", 79.04, 72.33, [
        ("KD", "irregular", 74.48, 28.20, 1.89), ("KD", "column", 74.68, 5.64, 2.02),
        ("KD+AT", "irregular", 76.31, 28.59, 1.89), ("KD+AT", "column", 77.01, 5.70, 2.02)]),
    *_t1("sa_resnet26", "tiny-imagenet", 67.10, 63.72, [
        ("KD", "irregular", None, 11.0, 1.97), ("KD", "column", 63.71, 5.58, 2.11),
        ("KD+AT", "irregular", 65.88, 11.0, 1.97), ("KD+AT", "column", 64.42, 5.50, 2.11)]),
    *_t1("sa_resnet38", "cifar10", 95.34, 92.72, [
        ("KD", "irregular", 93.82, 20.15, 1.61), ("KD", "column", 93.89, 3.97, 1.55),
        ("KD+AT", "irregular", 95.03, 20.34, 1.52), ("KD+AT", "column", 95.20, 3.97, 1.56)]),
    *_t1("sa_resnet38", "cifar100", 79.04, 72.49, [
        ("KD", "irregular", 74.97, 19.92, 1.50), ("KD", "column", 74.55, 3.93, 1.55),
        ("KD+AT", "irregular", 76.59, 19.75, 1.48), ("KD+AT", "column", 76.93, 3.89, 1.57)]),
]


def _t2(student, dataset, teacher, base, homog, rows):
    return [PaperRow(student, "attention", dataset, "KD+AT", pr, 0.25 if pr == "irregular" else 0.5, acc, teacher, base,
                     p, f, homog) for pr, acc, p, f in rows]


#: Table 2: homogeneous students with KD+AT, d = 0.25 (irregular), 0.5 (column).
PAPER_TABLE2: list[PaperRow] = [
    *_t2("sa_resnet26", "cifar10", 95.34, 92.77, 88.74, [("irregular", 93.34, 11.51, 1.87), ("column", 93.05, 5.75, 2.02)]),
    *_t2("sa_resnet26", "cifar100", 79.04, 72.33, 65.8, [("irregular", None, 11.51, 1.86), ("column", 72.98, 5.72, 2.01)]),
    *_t2("sa_resnet26", "tiny-imagenet", 67.1, 63.72, 61.1, [("irregular", None, 11.0, 1.97), ("column", 63.39, 5.50, 2.11)]),
    *_t2("sa_resnet38", "cifar10", 95.34, 92.72, 90.78, [("irregular", 93.93, 8.0, 1.46), ("column", 93.39, 4.01, 1.56)]),
    *_t2("sa_resnet38", "cifar100", 79.04, 72.49, 67.73, [("irregular", 74.53, 7.87, 1.45), ("column", 73.46, 3.95, 1.56)]),
]


def cifar_resnet50(num_classes: int = 10, in_chans: int = 3) -> nn.Module:
    """timm ``resnet50`` with the CIFAR stem (3×3 stride-1 convolution, no max pool): the 32×32 teacher for MAC counts.

    Its stage maps are 32/16/8/4 at 32×32, those of SA-ResNet26/38, so attention transfer pairs them pixel by pixel
    (timm's ImageNet stem would shrink a 32×32 image to 8×8 before the first stage). Registered with timm as
    ``resnet50_cifar`` (the teacher of the paper profile: train it on CIFAR with
    ``workbench train teacher --arch cnn --model resnet50_cifar --profile paper --data ROOT``).
    """
    model = timm.create_model("resnet50", num_classes=num_classes, in_chans=in_chans)
    model.conv1 = nn.Conv2d(in_chans, 64, 3, 1, 1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()
    model.pretrained_cfg = dict(architecture="resnet50_cifar", input_size=(in_chans, 32, 32), num_classes=num_classes,
                                crop_pct=1.0, interpolation="bilinear", first_conv="conv1", classifier="fc",
                                **({"mean": (0.4914, 0.4822, 0.4465), "std": (0.2470, 0.2435, 0.2616)} if in_chans == 3 else {}))
    model.default_cfg = model.pretrained_cfg
    return model


@register_model
def resnet50_cifar(pretrained: bool = False, **kwargs) -> nn.Module:
    """ResNet50 with a CIFAR stem (:func:`cifar_resnet50`): AttentionLite's teacher at 32×32 (§4.1)."""
    if pretrained:
        raise ValueError("resnet50_cifar has no published weights; train it (workbench train teacher --model resnet50_cifar) "
                         "or pass --checkpoint FILE")
    for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
        kwargs.pop(key, None)
    extra = sorted(set(kwargs) - {"num_classes", "in_chans"})
    if extra:
        raise ValueError(f"resnet50_cifar takes num_classes and in_chans only; got {extra}")
    return cifar_resnet50(**kwargs)


@dataclass(frozen=True)
class Reduction:
    """Our reductions for one (student, stem, classes, pruning, d) at paper size."""

    teacher_params: int  # timm resnet50 with this head
    student_params: int  # dense student
    prunable: int  # conv / linear weights the masks cover
    kept_params: int  # parameters the masks keep + every parameter they do not cover (count_params' "kept")
    realised_density: float  # kept prunable / prunable (masks at initialisation: uniform per layer)
    param_reduction: float  # teacher_params / kept_params
    param_reduction_all: float  # teacher_params / (d · student_params): d applied to every parameter
    teacher_macs: float  # CIFAR-stem ResNet50, per 32×32 image
    student_macs: float  # dense student
    pruned_macs: float  # irregular: non-zero-weight MACs + attention; column: the shrunk model
    flops_reduction: float  # teacher_macs / pruned_macs
    dense_flops_reduction: float  # teacher_macs / student_macs


@torch.no_grad()
def reductions(student: Literal["sa_resnet26", "sa_resnet38"], stem: str = "conv", num_classes: int = 10,
               pruning: str = "irregular", density: float = 0.1, seed: int = 0) -> Reduction:
    """Parameter and MAC reductions of a (randomly initialised) pruned student against ResNet50 at 32×32.

    The masks are sparse momentum's initial masks (uniform density per layer); a trained run moves
    budget between layers (momentum redistribution), which changes the MACs, not the parameter count.
    """
    torch.manual_seed(seed)
    model = SA_VARIANTS[student].build(stem, num_classes).eval()
    teacher = timm.create_model("resnet50", num_classes=num_classes)
    x = torch.zeros(1, 3, 32, 32)
    dense = count_params(model)
    dense_macs = count_macs_sparse(model, x)["dense"]
    hook = SparseMomentum(model, density, pruning, epochs=1, seed=seed)
    kept = count_params(model, masks=hook.weight_masks())["kept"]
    if pruning == "column":
        pruned_macs = count_macs_sparse(shrink(model, hook.weight_masks()), x)["dense"]
    else:
        pruned_macs = count_macs_sparse(model, x)["sparse"]
    t_params = sum(p.numel() for p in teacher.parameters())
    t_macs = count_macs_sparse(cifar_resnet50(num_classes), x)["dense"]
    return Reduction(
        teacher_params=t_params, student_params=dense["total"], prunable=dense["prunable"], kept_params=kept,
        realised_density=hook.realised_density(), param_reduction=t_params / kept,
        param_reduction_all=t_params / (density * dense["total"]), teacher_macs=t_macs, student_macs=dense_macs,
        pruned_macs=pruned_macs, flops_reduction=t_macs / pruned_macs, dense_flops_reduction=t_macs / dense_macs,
    )

