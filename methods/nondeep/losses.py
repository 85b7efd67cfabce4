"""Training objectives of the branched model (Non-deep ViT §4 "Model setup", Table 5).

Paper: "Non-deep Vision Transformers" (anonymous ICLR submission).

- **Diversity regulariser** (§4, "Lambda Scheduling and Diversity Regularization")::

      L_div = 1/C(n,2) Σ_{i<j} E[cos(f_i, f_j)²]

  over the branch features f_b, "averaged across attention and FFN layers", weight α = 0.05.
  We take f_b to be branch b's attention output O_b and FFN output (``…attn.hook_out``,
  ``…mlp.hook_out``), the cosine over the width D of each token, E the mean over tokens and
  images, and the average over the 2·L/n (block, module) pairs. The paper fixes none of these
  choices beyond "branch features".
- **Attention-map distillation** (§4): "the mean squared error between the teacher's attention
  maps and the averaged maps across branches". Student block i (standing for teacher blocks
  n·i … n·i+n−1, see :func:`methods.nondeep.branch`) is matched by default to the last teacher
  block of its group (:func:`teacher_layers`); the maps are the softmax probabilities
  ``(B, H, T, T)``, the MSE a mean over all entries, averaged over blocks. The paper does not
  give the pairing nor the loss weight.
- :class:`NonDeepLoss` — cross-entropy + β·attention distillation + α·L_div (+ optional logit
  distillation), ``(model, images, targets) -> (loss, parts)`` for ``methods.train.fit``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from methods.hooks import run_with_cache

from .branched import parallel_blocks

#: Hook names the losses read from a branched model.
PATTERN = "blocks.*.branches.*.attn.hook_pattern"
ATTN_OUT = "blocks.*.branches.*.attn.hook_out"
FFN_OUT = "blocks.*.branches.*.mlp.hook_out"


def pairwise_cos2(features: torch.Tensor) -> torch.Tensor:
    """Mean over pairs i < j of E[cos(f_i, f_j)²] for ``features`` of shape ``(n, …, D)``; 0 for n = 1."""
    n = features.shape[0]
    if n < 2:
        return features.new_zeros(())
    unit = F.normalize(features, dim=-1, eps=1e-12)  # (n, …, D)
    i, j = torch.triu_indices(n, n, offset=1, device=features.device)
    cos = (unit[i] * unit[j]).sum(-1)  # (pairs, …)
    return (cos * cos).mean()


def diversity_loss(features: Sequence[torch.Tensor]) -> torch.Tensor:
    """L_div averaged over (block, module) entries (module docstring).

    Args:
        features: one tensor ``(n, B, T, D)`` per block and module (branches stacked first).

    Returns:
        A scalar in [0, 1]; 0 when every pair of branches is orthogonal token by token.
    """
    if not features:
        raise ValueError("diversity_loss needs at least one (n, B, T, D) feature tensor")
    return torch.stack([pairwise_cos2(f) for f in features]).mean()


def teacher_layers(depth: int, branches: int, which: Literal["last", "first"] = "last") -> list[int]:
    """Teacher block matched to each student block: the last (or first) of its group of n."""
    offset = branches - 1 if which == "last" else 0
    return [i * branches + offset for i in range(depth // branches)]


def attention_distillation_loss(student_maps: Sequence[torch.Tensor],
                                teacher_maps: Sequence[torch.Tensor]) -> torch.Tensor:
    """Mean over blocks of MSE(mean_b student map, teacher map) (§4).

    Args:
        student_maps: per student block, ``(n, B, H, T, T)`` (branches first) or an already
            averaged ``(B, H, T, T)``.
        teacher_maps: per student block, the matched teacher map ``(B, H, T, T)``.
    """
    if len(student_maps) != len(teacher_maps) or not student_maps:
        raise ValueError(f"{len(student_maps)} student vs {len(teacher_maps)} teacher attention maps")
    total = []
    for s, t in zip(student_maps, teacher_maps, strict=True):
        avg = s.mean(0) if s.dim() == t.dim() + 1 else s
        if avg.shape != t.shape:
            raise ValueError(f"branch-averaged student map {tuple(avg.shape)} vs teacher map {tuple(t.shape)}: "
                             "student and teacher need the same heads and tokens")
        total.append(F.mse_loss(avg, t))
    return torch.stack(total).mean()


def _stack_by_block(cache: dict[str, torch.Tensor], suffix: str, blocks: int, branches: int,
                    prefix: str = "") -> list[torch.Tensor]:
    return [torch.stack([cache[f"{prefix}blocks.{i}.branches.{b}.{suffix}"] for b in range(branches)])
            for i in range(blocks)]


class NonDeepLoss(nn.Module):
    """The per-batch objective ``(model, images, targets) -> (loss, parts)`` of a branched model.

    With ``distill_weight = diversity_weight = 0`` it also trains a plain ViT (CE + KD: the depth baseline,
    :func:`methods.nondeep.depth_baseline`, under the same loss as the students).

    ``loss = CE + distill_weight · L_attn + diversity_weight · L_div + kd_weight · KD``, each term
    only computed when its weight is > 0; ``parts`` logs ``ce``, ``attn``, ``div``, ``kd``.

    Args:
        teacher: the teacher ViT (timm; its ``blocks.{t}.attn.hook_pattern`` are read); needed for
            attention or logit distillation. Kept in eval mode without gradients.
        distill_weight: β of the attention-map MSE (the paper gives none).
        diversity_weight: α of L_div (0.05 in the paper).
        kd_weight: weight of soft-label distillation ``T² KL(teacher ‖ student)`` (not in the
            paper's loss; 0 by default).
        kd_temperature: T.
        layers: teacher block matched to each student block (default :func:`teacher_layers`).
        label_smoothing: of the cross-entropy.
    """

    def __init__(self, teacher: nn.Module | None = None, distill_weight: float = 0.0,
                 diversity_weight: float = 0.05, kd_weight: float = 0.0, kd_temperature: float = 1.0,
                 layers: Sequence[int] | None = None, label_smoothing: float = 0.0):
        super().__init__()
        weights = {"distill_weight": distill_weight, "diversity_weight": diversity_weight, "kd_weight": kd_weight}
        for name, w in weights.items():
            if w < 0:
                raise ValueError(f"{name} must be ≥ 0, got {w}")
        if (distill_weight > 0 or kd_weight > 0) and teacher is None:
            raise ValueError("attention or logit distillation needs a teacher")
        self.teacher = teacher.eval().requires_grad_(False) if teacher is not None else None
        self.distill_weight, self.diversity_weight = distill_weight, diversity_weight
        self.kd_weight, self.kd_temperature = kd_weight, kd_temperature
        self.layers = None if layers is None else list(layers)
        self.label_smoothing = label_smoothing

    def train(self, mode: bool = True) -> NonDeepLoss:
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()
        return self

    def forward(self, model: nn.Module, images: torch.Tensor,
                targets: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        blocks = parallel_blocks(model)
        if not blocks and (self.distill_weight > 0 or self.diversity_weight > 0):
            raise ValueError(f"{type(model).__name__} is not a branched model (methods.nondeep.branch): attention "
                             "distillation and the diversity regulariser need branches (set their weights to 0 for "
                             "a plain ViT such as the depth baseline)")
        n, depth = (blocks[0].num_branches, len(blocks)) if blocks else (1, 0)
        prefix = "module." if isinstance(model, nn.parallel.DistributedDataParallel) else ""  # hook names under DDP
        names = [prefix + PATTERN] if self.distill_weight > 0 else []
        names += [prefix + ATTN_OUT, prefix + FFN_OUT] if self.diversity_weight > 0 else []
        if names:
            logits, cache = run_with_cache(model, images, names=names, detach=False)
        else:
            logits, cache = model(images), {}
        ce = F.cross_entropy(logits, targets, label_smoothing=self.label_smoothing)
        loss, parts = ce, {"ce": ce.detach()}
        t_logits = None
        if self.distill_weight > 0:
            layers = self.layers or teacher_layers(depth * n, n)
            if len(layers) != depth:
                raise ValueError(f"{len(layers)} teacher layers given for {depth} student blocks")
            with torch.no_grad():
                t_names = [f"blocks.{t}.attn.hook_pattern" for t in layers]
                t_logits, t_cache = run_with_cache(self.teacher, images, names=t_names)
            attn = attention_distillation_loss(_stack_by_block(cache, "attn.hook_pattern", depth, n, prefix),
                                               [t_cache[f"blocks.{t}.attn.hook_pattern"] for t in layers])
            loss = loss + self.distill_weight * attn
            parts["attn"] = attn.detach()
        if self.diversity_weight > 0:
            feats = [*_stack_by_block(cache, "attn.hook_out", depth, n, prefix),
                     *_stack_by_block(cache, "mlp.hook_out", depth, n, prefix)]
            div = diversity_loss(feats)
            loss = loss + self.diversity_weight * div
            parts["div"] = div.detach()
        if self.kd_weight > 0:
            if t_logits is None:
                with torch.no_grad():
                    t_logits = self.teacher(images)
            tau = self.kd_temperature
            kd = F.kl_div(F.log_softmax(logits / tau, -1), F.log_softmax(t_logits / tau, -1), reduction="batchmean",
                          log_target=True) * tau * tau
            loss = loss + self.kd_weight * kd
            parts["kd"] = kd.detach()
        return loss, parts


__all__ = ["ATTN_OUT", "FFN_OUT", "PATTERN", "NonDeepLoss", "attention_distillation_loss", "diversity_loss",
           "pairwise_cos2", "teacher_layers"]
