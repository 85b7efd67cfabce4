"""The sparse-distillation objective of AttentionLite (Eq. 2).

    L_total = α · CE(y, z_S) + (1 − α) · ρ² · KL(σ(z_T / ρ) ‖ σ(z_S / ρ)) + β/2 · Σ_m L_AT^m

- **KD** (Hinton et al. 2015): KL divergence between the teacher's and the student's softened
  class distributions at temperature ρ, averaged over the batch and multiplied by ρ² (Hinton's
  gradient-scale correction, also in RepDistiller's ``DistillKL``, the code of [8] whose α and β the
  paper adopts). Eq. 2 prints no ρ²; ``kl_scale=False`` reads it literally.
- **AT** (Zagoruyko & Komodakis 2017): the attention map of an activation ``A ∈ R^{C×H×W}`` is
  ``F^p(A) = Σ_c |A_c|^p`` flattened to ``H·W`` (§3; we take the channel *mean*, which the
  normalisation makes identical) and L2-normalised, ``ψ = F / ‖F‖₂``, with ``p = 2``. The
  per-stage loss (``at_form="mean_squared"``, the default) is Zagoruyko's code:
  ``L_AT^m = mean_{b, j} (ψ_S − ψ_T)²``, with which β = 1000 is calibrated (§4.1 takes β = 1000 from
  Tian et al., whose AT term is this one). ``at_form="norm"`` is Eq. 2 printed:
  ``L_AT^m = mean_b ‖ψ_S − ψ_T‖₂``, which at β = 1000 outweighs the rest by orders of magnitude.
- Where: after every residual *stage* (``stages.{s}.hook_out``, the stage outputs of the CNN teacher
  and of the SA-ResNet student; §4.1 says "after every residual block", but ResNet50's 16 blocks
  and SA-ResNet26's 8 cannot be paired one to one, and Zagoruyko & Komodakis and Tian et al. transfer
  at stage (group) outputs). Stage maps must have the same spatial size; ``resize="pool"`` instead
  average-pools the larger map to the smaller (RepDistiller's AT), an explicit choice.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from methods.hooks import hook_points, hooks

__all__ = ["ATForm", "Resize", "at_map", "at_loss", "kd_loss", "stage_names", "SparseDistillationLoss"]

ATForm = Literal["mean_squared", "norm"]
Resize = Literal["none", "pool"]


def at_map(activation: torch.Tensor, p: float = 2.0) -> torch.Tensor:
    """Normalised spatial attention map ``ψ = F^p / ‖F^p‖₂``, ``F^p = mean_c |A_c|^p``: ``(B, C, H, W) -> (B, H·W)``."""
    return F.normalize(activation.abs().pow(p).mean(1).flatten(1), dim=1)


def _match(s: torch.Tensor, t: torch.Tensor, name: str, resize: Resize) -> tuple[torch.Tensor, torch.Tensor]:
    if s.shape[-2:] == t.shape[-2:]:
        return s, t
    if resize != "pool":
        raise ValueError(f"{name}: the student's map is {tuple(s.shape[-2:])} but the teacher's is {tuple(t.shape[-2:])}; "
                         "attention transfer compares maps pixel by pixel: use a teacher with the same stage "
                         "resolutions (e.g. a CIFAR stem for 32×32 images), or resize='pool' to average-pool the larger")
    size = (min(s.shape[-2], t.shape[-2]), min(s.shape[-1], t.shape[-1]))
    return F.adaptive_avg_pool2d(s, size), F.adaptive_avg_pool2d(t, size)


def at_loss(student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor], *, p: float = 2.0,
            form: ATForm = "mean_squared", resize: Resize = "none",
            names: Sequence[str] | None = None) -> torch.Tensor:
    """``Σ_m L_AT^m`` over paired stage activations ``(B, C_m, H_m, W_m)`` (without the β/2; module docstring)."""
    if len(student) != len(teacher):
        raise ValueError(f"{len(student)} student maps but {len(teacher)} teacher maps")
    total = student[0].new_zeros(())
    for i, (s, t) in enumerate(zip(student, teacher)):
        s, t = _match(s, t, names[i] if names else f"stage {i}", resize)
        d = at_map(s, p) - at_map(t, p)
        if form == "mean_squared":
            total = total + d.pow(2).mean()
        elif form == "norm":
            total = total + d.norm(dim=1).mean()
        else:
            raise ValueError(f"unknown AT form {form!r}; choose 'mean_squared' (Zagoruyko's code) or 'norm' (Eq. 2 as printed)")
    return total


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, rho: float, scale: bool = True) -> torch.Tensor:
    """``KL(σ(z_T/ρ) ‖ σ(z_S/ρ))`` averaged over the batch, times ``ρ²`` when ``scale``."""
    kl = F.kl_div(F.log_softmax(student_logits / rho, -1), F.log_softmax(teacher_logits / rho, -1),
                  reduction="batchmean", log_target=True)
    return kl * rho ** 2 if scale else kl


def stage_names(model: nn.Module) -> list[str]:
    """The model's ``stages.{s}.hook_out`` hook names, in stage order."""
    names = [n for n in hook_points(model) if n.startswith("stages.") and n.endswith(".hook_out")]
    return sorted(names, key=lambda n: int(n.split(".")[1]))


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


class SparseDistillationLoss:
    """Eq. 2 as a ``methods.train`` loss: ``(student, images, targets) -> (loss, parts)``.

    Args:
        teacher: the CNN teacher (kept in eval mode, never trained here).
        alpha: weight of the cross-entropy (§4.1: 0.1); the KL gets ``1 − alpha``.
        beta: AT weight (§4.1: 1000); 0 = KD only (no stage maps needed).
        rho: softmax temperature (the paper gives none; 4, Tian et al.'s and Hinton-style default).
        p: exponent of the AT map (2).
        stages: stage hook names to transfer at; None = every ``stages.{s}.hook_out`` of the student.
        at_form: "mean_squared" or "norm" (module docstring).
        resize: "none" (maps must agree) or "pool".
        kl_scale: multiply the KL by ρ².

    ``parts`` (per batch): ``ce``, ``kl``, ``at`` (Σ_m L_AT^m, before β/2).

    Raises:
        ValueError: (at construction) the teacher or the student lacks a stage the AT loss needs;
            (at the first batch) stage maps of different sizes with ``resize="none"``.
    """

    def __init__(self, teacher: nn.Module, *, alpha: float = 0.1, beta: float = 1000.0, rho: float = 4.0,
                 p: float = 2.0, stages: Sequence[str] | None = None, at_form: ATForm = "mean_squared",
                 resize: Resize = "none", kl_scale: bool = True, student: nn.Module | None = None):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if beta < 0 or rho <= 0 or p < 1:
            raise ValueError(f"need beta ≥ 0, rho > 0, p ≥ 1; got beta={beta}, rho={rho}, p={p}")
        if at_form not in ("mean_squared", "norm") or resize not in ("none", "pool"):
            raise ValueError(f"at_form must be 'mean_squared' or 'norm' and resize 'none' or 'pool'; got {at_form!r}, {resize!r}")
        self.teacher = teacher.eval()
        for q in self.teacher.parameters():
            q.requires_grad_(False)
        self.alpha, self.beta, self.rho, self.p = alpha, beta, rho, p
        self.at_form, self.resize, self.kl_scale = at_form, resize, kl_scale
        self.stages: list[str] = list(stages) if stages is not None else []
        if beta > 0 and stages is None and student is not None:
            self.stages = stage_names(student)
        if beta > 0:
            self._check(self.teacher, "teacher")
            if student is not None:
                self._check(student, "student")

    def _check(self, model: nn.Module, role: str) -> None:
        have = stage_names(_unwrap(model))
        if self.stages:
            missing = [s for s in self.stages if s not in have]
        else:
            missing = [] if have else ["stages.0.hook_out …"]
        if missing:
            raise ValueError(
                f"the {role} ({type(_unwrap(model)).__name__}) has no hook point {', '.join(missing)} "
                f"(it has {', '.join(have) or 'no stage outputs'}); the attention-transfer loss needs the stage "
                "outputs of a CNN / SA-ResNet (timm ResNet adapter or stages.{s}.hook_out hook points) in both "
                "models; pass beta=0 for logit distillation only")

    def _run(self, model: nn.Module, images: torch.Tensor, names: list[str]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        cache: dict[str, torch.Tensor] = {}

        def keep(value: torch.Tensor, name: str) -> None:
            cache[name] = value

        with hooks(_unwrap(model), {n: keep for n in names}):
            logits = model(images)
        return logits, [cache[n] for n in names]

    def __call__(self, student: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        use_at = self.beta > 0
        if use_at and not self.stages:
            self.stages = stage_names(_unwrap(student))
            self._check(student, "student")
            self._check(self.teacher, "teacher")
        names = self.stages if use_at else []
        first = next(self.teacher.parameters(), None)
        if first is not None and first.device != images.device:
            self.teacher.to(images.device)
        with torch.no_grad():
            self.teacher.eval()
            t_logits, t_maps = self._run(self.teacher, images, names)
        s_logits, s_maps = self._run(student, images, names)
        ce = F.cross_entropy(s_logits, targets)
        kl = kd_loss(s_logits, t_logits, self.rho, self.kl_scale)
        loss = self.alpha * ce + (1.0 - self.alpha) * kl
        parts = {"ce": ce.detach(), "kl": kl.detach()}
        if use_at:
            at = at_loss(s_maps, t_maps, p=self.p, form=self.at_form, resize=self.resize, names=names)
            loss = loss + self.beta / 2 * at
            parts["at"] = at.detach()
        return loss, parts
