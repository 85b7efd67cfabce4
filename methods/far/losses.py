"""FAR's block-wise distillation objective (§3.1, Eq. 3–4; Table 3; App. A.1).

Paper: Ren et al., "Is Attention Required for Transformer Inference? Explore Function-preserving
Attention Replacement".

    L_sim^(i) = 1 − cos(x_{i+1}, x'_{i+1})                                (Eq. 3)
    L         = λ · Σ_{i∈R} L_sim^(i) + L_cls                             (Eq. 4)

x_{i+1} / x'_{i+1} are the outputs of teacher / student block i (the whole block, not just the
attention). The cosine is taken per token embedding (over D) and averaged over tokens (cls and
dist tokens included) and the batch; the sum runs over the replaced blocks R.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import Schedule, SimInput
from .hoyer import hoyer_regularizer
from .replace import _unwrap, block_outputs, capture_block_outputs, embed_tokens, substitutes

SCHEDULES: tuple[str, ...] = ("scratch", "cls", "sim", "combined")


def similarity_loss(student_outs: Sequence[torch.Tensor], teacher_outs: Sequence[torch.Tensor]) -> torch.Tensor:
    """Σ_i mean_{batch, token} (1 − cos(x_{i+1}, x'_{i+1})) (Eq. 3, summed as in Eq. 4).

    Args:
        student_outs: replaced blocks' outputs, each ``(B, T, D)``.
        teacher_outs: the teacher's outputs of the same blocks, same shapes.

    Returns:
        A scalar tensor; 0 when the outputs are identical.
    """
    if len(student_outs) != len(teacher_outs):
        raise ValueError(f"{len(student_outs)} student vs {len(teacher_outs)} teacher block outputs")
    total = student_outs[0].new_zeros(())
    for s, t in zip(student_outs, teacher_outs):
        total = total + (1.0 - F.cosine_similarity(s, t, dim=-1)).mean()  # (B, T) -> ()
    return total


def _logits(out) -> torch.Tensor:
    """Class logits of a timm forward; a distilled DeiT in distilled-training mode gives a pair."""
    if isinstance(out, (tuple, list)):
        return sum(out) / len(out)
    return out


class FARLoss(nn.Module):
    """The per-batch FAR objective, ``(student, images, targets) -> (loss, parts)``.

    Fits ``methods.train``'s ``loss_fn`` contract. ``parts`` holds detached 0-dim tensors for logging: ``ce``,
    ``sim`` (when the schedule uses it) and ``hoyer`` (when ``hoyer_weight > 0``).

    Args:
        teacher: the frozen pretrained ViT; only needed by "sim" and "combined". Kept in eval
            mode with gradients off.
        schedule: Table 3 column — "scratch" (CE; pair with :func:`from_scratch`), "cls" (CE),
            "sim" (λ·sim), "combined" (λ·sim + CE, Eq. 4).
        lam: λ of Eq. 4.
        hoyer_weight: weight of the DeepHoyer regulariser Σ Eq. 6 (1e-4 during pruning, App. A.2).
        grouping: pruning groups for the regulariser (see :data:`methods.far.config.Grouping`).
        sim_input: "student": student blocks see the student's own previous outputs (one pass,
            DDP-safe); "teacher": each replaced student block is fed the teacher's block input
            x_i (teacher forcing; calls blocks directly, so not synchronised by DDP).
        label_smoothing: for the cross-entropy. Targets may be class indices or probabilities.
    """

    def __init__(
        self,
        teacher: Optional[nn.Module] = None,
        schedule: Schedule = "combined",
        lam: float = 1.0,
        hoyer_weight: float = 0.0,
        grouping: str = "full",
        sim_input: SimInput = "student",
        label_smoothing: float = 0.0,
    ):
        super().__init__()
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        if sim_input not in ("student", "teacher"):
            raise ValueError(f"sim_input must be 'student' or 'teacher', got {sim_input!r}")
        self.uses_sim = schedule in ("sim", "combined")
        if self.uses_sim and teacher is None:
            raise ValueError(f"schedule {schedule!r} needs a teacher")
        self.teacher = teacher.eval().requires_grad_(False) if teacher is not None and self.uses_sim else None
        self.schedule, self.lam, self.hoyer_weight = schedule, lam, hoyer_weight
        self.grouping, self.sim_input, self.label_smoothing = grouping, sim_input, label_smoothing

    def train(self, mode: bool = True) -> "FARLoss":
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()  # the teacher never trains (no drop-path, no dropout)
        return self

    def forward(self, student: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        layers = [i for i, _ in substitutes(student)]
        with capture_block_outputs(student) as outs:
            logits = _logits(student(images))
        ce = F.cross_entropy(logits, targets, label_smoothing=self.label_smoothing)
        parts: dict[str, torch.Tensor] = {"ce": ce.detach()}  # detached: fit reads them once per epoch
        loss = ce if self.schedule != "sim" else ce.new_zeros(())
        if self.uses_sim:
            if not layers:
                raise ValueError("the student has no FAR substitutes to distill")
            if self.teacher.training:
                self.teacher.eval()
            with torch.no_grad():
                t_outs = block_outputs(self.teacher, images)
            if self.sim_input == "student":
                s_outs = [outs[i] for i in layers]
            else:
                t_ins = [embed_tokens(self.teacher, images).detach()] + t_outs[:-1]
                blocks = _unwrap(student).blocks
                s_outs = [blocks[i](t_ins[i]) for i in layers]
            sim = similarity_loss(s_outs, [t_outs[i] for i in layers])
            parts["sim"] = sim.detach()
            loss = loss + self.lam * sim
        if self.hoyer_weight > 0:
            reg = hoyer_regularizer(student, grouping=self.grouping)
            parts["hoyer"] = reg.detach()
            loss = loss + self.hoyer_weight * reg
        return loss, parts
