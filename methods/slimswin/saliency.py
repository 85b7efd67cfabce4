"""Gradient saliency of window-head pairs and the distillation loss (SlimSwin §IV-C, Alg. 1 lines 5-10, §V-B).

* :func:`window_head_saliency` -- the gradient of the loss w.r.t. the all-ones window x head gate,
  averaged over a saliency subset ``d-hat``.
* :func:`kd_loss` -- §V-B: cross-entropy + Hinton distillation, alpha = 0.7, T = 2.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Literal

import torch
import torch.nn.functional as F
from torch import nn

from methods.devices import differentiable

from .config import SaliencyReduce
from .gates import gate_probes, gated_modules

__all__ = ["LossFn", "kd_loss", "window_head_saliency"]

LossFn = Callable[[torch.Tensor, Any], torch.Tensor]


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
            alpha: float = 0.7, T: float = 2.0, reduction: Literal["mean", "none"] = "mean") -> torch.Tensor:
    """Knowledge-distillation loss of §V-B (Hinton et al. 2015).

    ``(1 - alpha) * CE(student, y) + alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T))``.

    Args:
        student_logits: ``(B, K)``.
        teacher_logits: ``(B, K)``, from the unpruned model (detached here).
        targets: ``(B,)`` class indices.
        alpha: distillation weight (paper: 0.7).
        T: temperature (paper: 2).
        reduction: ``"mean"`` over the batch, or ``"none"`` for per-sample losses ``(B,)``.

    Raises:
        ValueError: shapes disagree, ``alpha`` outside [0, 1], ``T <= 0`` or unknown reduction.
    """
    if student_logits.shape != teacher_logits.shape or student_logits.ndim != 2:
        raise ValueError(f"student and teacher logits must both be (B, K), got {tuple(student_logits.shape)} "
                         f"and {tuple(teacher_logits.shape)}")
    if not 0.0 <= alpha <= 1.0 or T <= 0:
        raise ValueError(f"need 0 <= alpha <= 1 and T > 0, got alpha={alpha}, T={T}")
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    ce = F.cross_entropy(student_logits, targets, reduction="none")  # (B,)
    log_p_student = F.log_softmax(student_logits / T, dim=-1)  # (B, K)
    log_p_teacher = F.log_softmax(teacher_logits.detach() / T, dim=-1)  # (B, K)
    kl = F.kl_div(log_p_student, log_p_teacher, reduction="none", log_target=True).sum(-1)  # (B,)
    loss = (1.0 - alpha) * ce + alpha * T * T * kl
    return loss.mean() if reduction == "mean" else loss


def _per_sample_total(loss: torch.Tensor, batch: int) -> torch.Tensor:
    """Turn ``loss_fn``'s output into ``sum_b loss_b`` (scalar outputs are taken as batch means)."""
    if loss.ndim == 0:
        return loss * batch
    if tuple(loss.shape) == (batch,):
        return loss.sum()
    raise ValueError(f"loss_fn must return a scalar batch mean or per-sample losses of shape ({batch},), "
                     f"got shape {tuple(loss.shape)}")


def window_head_saliency(model: nn.Module, batches: Iterable[tuple[torch.Tensor, Any]], loss_fn: LossFn,
                         reduce: SaliencyReduce = "abs_of_mean", eval_mode: bool = True) -> list[torch.Tensor]:
    """Gate-gradient saliency of every window-head pair (SlimSwin §IV-C, Alg. 1 lines 5-10).

    For every sample ``x`` of the saliency subset, ``G[x, w, h] = d loss(x) / d gate[w, h]`` at the
    all-ones gate (pruned pairs have gradient 0). All per-sample gradients come from *one* backward
    per batch: each gate is multiplied by a per-sample all-ones probe ``(B, W, H)`` and, since
    samples do not interact in a Swin (LayerNorm only), ``d sum_b loss_b / d probe[b] = G[b]``.

    Reductions over the ``|d|`` samples:

    * ``"abs_of_mean"`` (default): ``|mean_x G[x, w, h]|``. Algorithm 1 line 8 averages the signed
      per-sample gradients, ``g[w,h] = 1/|d| sum_x G[x,w,h]``, and §IV-C calls ``g`` "the gradient
      magnitude" before sorting it ascending and pruning the smallest. Taking the magnitude of the
      average is the one reading that satisfies both statements, and the only one for which an
      ascending sort is sensible (see ``"signed"``), so it is the default.
    * ``"abs"``: ``mean_x |G[x, w, h]|`` -- Michel et al. (2019)'s head importance (magnitudes per
      sample, so gradients of opposite sign on different images do not cancel).
    * ``"signed"``: ``mean_x G[x, w, h]``, Algorithm 1 line 8 taken literally. Ranked ascending, it
      prunes the *most negative* gradients first, i.e. by a first-order Taylor expansion
      (``L(g=0) - L(g=1) ~ -G``) the pairs whose removal raises the loss most. For ablations only.

    Args:
        model: a gated timm Swin (:func:`.gates.add_gates`).
        batches: iterable of ``(inputs, targets)`` already on the model's device (the saliency subset).
        loss_fn: ``loss_fn(logits, targets)`` returning per-sample losses ``(B,)`` or their batch mean
            (a scalar is taken as a mean, e.g. ``F.cross_entropy``); ``targets`` is passed through, so
            it may carry teacher logits for :func:`kd_loss`.
        reduce: ``"abs_of_mean"``, ``"abs"`` or ``"signed"`` (above).
        eval_mode: run the model in eval mode (no dropout / drop-path); the mode is restored after.

    Returns:
        One float64 CPU tensor ``(num_windows, num_heads)`` per layer (all layers, the last stage too).

    Raises:
        ValueError: model not gated, unknown ``reduce``, no samples, bad ``loss_fn`` output.
    """
    if reduce not in ("abs_of_mean", "abs", "signed"):
        raise ValueError(f"reduce must be 'abs_of_mean', 'abs' or 'signed', got {reduce!r}")
    modules = gated_modules(model)
    sums = [torch.zeros(m.num_windows, m.num_heads, dtype=torch.float64) for m in modules]  # sum_x G
    abs_sums = [torch.zeros_like(s) for s in sums]  # sum_x |G|
    count = 0
    was_training = model.training
    model.train(not eval_mode)
    try:
        for inputs, targets in batches:
            batch = inputs.shape[0]
            with differentiable(model), gate_probes(model, batch) as probes:  # (methods.devices; a no-op for a Swin)
                total = _per_sample_total(loss_fn(model(inputs), targets), batch)
                grads = torch.autograd.grad(total, probes)  # each (B, W, H): per-sample G
            for s, a, g in zip(sums, abs_sums, grads):
                g = g.detach().to("cpu", torch.float64)
                s += g.sum(0)
                a += g.abs().sum(0)
            count += batch
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("window_head_saliency got no samples: `batches` was empty")
    if reduce == "abs":
        return [a / count for a in abs_sums]
    means = [s / count for s in sums]
    return [m.abs() for m in means] if reduce == "abs_of_mean" else means
