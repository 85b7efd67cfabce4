"""The iterative pruning loop of SlimSwin (§IV-B, §IV-D, Algorithm 1).

* :func:`global_ranking` -- §IV-B / Alg. 1 lines 11-13: one ranking of all window-head pairs of all
  prunable layers (the last stage, a single window, is excluded, §V-A), pruned pairs set to +inf.
* :func:`prune_step` -- Alg. 1 lines 14-16: prune exactly ``i`` currently active pairs.
* :func:`prune` -- Alg. 1: saliency -> prune ``i`` pairs -> fine-tune one epoch on a subset
  (callback), until the global ratio ``r`` is reached, then a final fine-tune (callback).

The loop knows nothing about data: the caller passes ``saliency_fn(model, iteration)`` (typically
:func:`.saliency.window_head_saliency` over a freshly sampled subset) and fine-tune callbacks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from .config import Exclude
from .gates import gated_modules, get_masks, set_mask
from .geometry import SwinConfig, SwinLayerGeometry, swin_layers, validate_layer_list

__all__ = ["PruneStep", "PruneHistory", "prunable_layers", "pairs_to_prune", "pruning_ratio", "global_ranking",
           "prune_step", "prune"]


@dataclass(frozen=True)
class PruneStep:
    """One iteration of Algorithm 1."""

    iteration: int  # 0-based iteration index
    pruned: torch.Tensor  # (i, 3) long: (layer, window, head) pruned this iteration, in ranking order
    scores: torch.Tensor  # (i,) float64: their saliency scores
    num_pruned: int  # pruned prunable pairs after this iteration (all iterations)
    ratio: float  # num_pruned / prunable pairs after this iteration


@dataclass
class PruneHistory:
    """What :func:`prune` did; ``steps`` grows by one :class:`PruneStep` per iteration."""

    target_ratio: float  # requested global ratio r
    step_pairs: int  # i
    prunable_layers: list[int]  # layers taking part in the ranking
    total_pairs: int  # window-head pairs of those layers
    steps: list[PruneStep] = field(default_factory=list)  # one per iteration

    @property
    def ratio(self) -> float:
        """Final ratio of pruned prunable pairs (0 before any step)."""
        return self.steps[-1].ratio if self.steps else 0.0


def prunable_layers(model_or_config: nn.Module | SwinConfig, exclude: Exclude = "last_stage") -> list[int]:
    """Layers that take part in the global ranking.

    Args:
        model_or_config: timm Swin or :class:`.geometry.SwinConfig`.
        exclude: ``"last_stage"`` (paper §V-A: its layers hold a single window at 224), ``"single_window"``
            (every layer with one window, e.g. also stage 1 of the 28x28 demo Swin), or ``"none"``.
    """
    layers = swin_layers(model_or_config)
    if exclude == "last_stage":
        last = layers[-1].stage
        return [g.layer for g in layers if g.stage != last]
    if exclude == "single_window":
        return [g.layer for g in layers if g.num_windows > 1]
    if exclude == "none":
        return [g.layer for g in layers]
    raise ValueError(f"exclude must be 'last_stage', 'single_window' or 'none', got {exclude!r}")


def pairs_to_prune(total: int, target_ratio: float, step_pairs: int, already: int = 0) -> int:
    """Pairs pruned once Algorithm 1 stops: the first ``already + k * step_pairs`` with ratio ``>= target_ratio``.

    Algorithm 1 prunes ``i`` pairs per iteration "while r_cur < r" (lines 2-18), so it stops at the first
    multiple of ``i`` (after the ``already`` pruned pairs) that reaches ``r * total``; that is why the paper's
    "exact pruning ratios differ slightly" from r (§VI). A ratio equal to an exact fraction of ``total``
    (e.g. 1/3 of 864) is reached without overshoot (a 1e-9 tolerance absorbs float rounding).

    Raises:
        ValueError: the count exceeds ``total`` (``step_pairs`` too large for the ratio).
    """
    needed = math.ceil(target_ratio * total - 1e-9)  # pairs needed so that ratio >= r
    pruned = already + max(0, math.ceil((needed - already) / step_pairs)) * step_pairs
    if pruned > total:
        raise ValueError(f"{(pruned - already) // step_pairs} iterations of step_pairs={step_pairs} would prune "
                         f"{pruned} pairs, more than the {total} prunable ones")
    return pruned


def _check_layers(layers: Sequence[int], n_layers: int) -> list[int]:
    layers = sorted(set(int(l) for l in layers))
    if not layers or layers[0] < 0 or layers[-1] >= n_layers:
        raise ValueError(f"prunable layers must be a non-empty subset of 0..{n_layers - 1}, got {layers}")
    return layers


def pruning_ratio(masks: Sequence[torch.Tensor], layers: Sequence[int]) -> float:
    """Share of pruned (False) pairs among the pairs of ``layers``."""
    layers = _check_layers(layers, len(masks))
    total = sum(masks[l].numel() for l in layers)
    return sum(int((~masks[l].bool()).sum()) for l in layers) / total


def global_ranking(saliency: Sequence[torch.Tensor], masks: Sequence[torch.Tensor],
                   layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank all window-head pairs of ``layers`` together, least salient first (§IV-B, Alg. 1 l. 11-13).

    Already pruned pairs get +inf (never pruned twice) and so come last. Ties are broken
    deterministically by the canonical order (layer, window, head) ascending (stable sort).

    Args:
        saliency: one ``(num_windows, num_heads)`` score tensor per layer (all layers).
        masks: one bool ``(num_windows, num_heads)`` mask per layer, True = active.
        layers: prunable layer indices.

    Returns:
        ``(pairs, scores)``: ``pairs`` long ``(P, 3)`` of (layer, window, head) over the ``P`` pairs of
        ``layers`` in ranking order; ``scores`` float64 ``(P,)`` (+inf for pruned pairs).

    Raises:
        ValueError: list lengths or shapes differ, NaN scores, bad layer indices.
    """
    if len(saliency) != len(masks):
        raise ValueError(f"expected one saliency tensor per layer ({len(masks)}), got {len(saliency)}")
    layers = _check_layers(layers, len(masks))
    index, scores = [], []
    for l in layers:
        mask, score = masks[l].bool().cpu(), saliency[l].detach().to("cpu", torch.float64)
        if score.shape != mask.shape:
            raise ValueError(f"saliency of layer {l}: expected shape {tuple(mask.shape)}, got {tuple(score.shape)}")
        if torch.isnan(score).any():
            raise ValueError(f"saliency of layer {l} contains NaN")
        w, h = torch.meshgrid(torch.arange(mask.shape[0]), torch.arange(mask.shape[1]), indexing="ij")
        index.append(torch.stack([torch.full_like(w, l), w, h], dim=-1).reshape(-1, 3))  # (W*H, 3) canonical order
        scores.append(score.masked_fill(~mask, math.inf).reshape(-1))  # (W*H,)
    pairs, values = torch.cat(index), torch.cat(scores)
    order = torch.sort(values, stable=True).indices
    return pairs[order], values[order]


def prune_step(masks: Sequence[torch.Tensor], saliency: Sequence[torch.Tensor], num_pairs: int,
               layers: Sequence[int]) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Prune exactly ``num_pairs`` active pairs, the least salient ones (Alg. 1 lines 11-16).

    The paper thresholds at the ``i``-th smallest value (``mask = g < t``), which prunes fewer than
    ``i`` pairs when scores tie at ``t``; here the ``i`` first pairs of :func:`global_ranking` are taken,
    so exactly ``i`` go, ties broken deterministically.

    Returns:
        ``(new_masks, pruned, scores)``: new bool masks (inputs untouched), ``pruned`` long
        ``(num_pairs, 3)`` of (layer, window, head), and their scores.

    Raises:
        ValueError: ``num_pairs < 1`` or more than the active prunable pairs.
    """
    if num_pairs < 1:
        raise ValueError(f"num_pairs must be >= 1, got {num_pairs}")
    pairs, scores = global_ranking(saliency, masks, layers)
    active = int(torch.isfinite(scores).sum())
    if num_pairs > active:
        raise ValueError(f"cannot prune {num_pairs} pairs: only {active} active prunable pairs remain")
    pruned, pruned_scores = pairs[:num_pairs], scores[:num_pairs]
    new_masks = [m.bool().cpu().clone() for m in masks]
    for l, w, h in pruned.tolist():
        new_masks[l][w, h] = False
    return new_masks, pruned, pruned_scores


def prune(model: nn.Module, target_ratio: float, step_pairs: int, *,
          saliency_fn: Callable[[nn.Module, int], Sequence[torch.Tensor]],
          finetune_fn: Callable[[nn.Module, int], None] | None = None,
          final_finetune_fn: Callable[[nn.Module], None] | None = None,
          exclude: Exclude = "last_stage",
          on_step: Callable[[PruneStep, nn.Module], None] | None = None) -> PruneHistory:
    """Algorithm 1: iterative global window-head pruning with fine-tuning, in place on ``model``.

    While the ratio of pruned prunable pairs is below ``target_ratio``: compute saliency
    (``saliency_fn``, recomputed every iteration on the current model), prune exactly ``step_pairs``
    active pairs (:func:`prune_step`), fine-tune (``finetune_fn``: one epoch on a sampled subset with
    :func:`kd_loss` in the paper). Then call ``final_finetune_fn`` (15 epochs on the full set).
    Like the paper's loop, the last iteration still prunes ``step_pairs``, so the final ratio is the
    first multiple of ``step_pairs / total`` reaching ``target_ratio`` ("divisibility constraints", §VI).
    Pairs pruned before the call (e.g. a resumed run) count towards the ratio.

    Args:
        model: gated timm Swin (:func:`.gates.add_gates`).
        target_ratio: global ratio r in (0, 1) of window-head pairs to prune among prunable layers.
        step_pairs: pairs pruned per iteration (``i``).
        saliency_fn: ``saliency_fn(model, iteration) -> per-layer (num_windows, num_heads) scores``,
            e.g. ``lambda m, it: window_head_saliency(m, sample_batches(it), loss_fn)``.
        finetune_fn: ``finetune_fn(model, iteration)`` after each pruning step, or None.
        final_finetune_fn: ``final_finetune_fn(model)`` once the ratio is reached, or None.
        exclude: which layers are never pruned (:func:`prunable_layers`).
        on_step: ``on_step(step, model)`` after each iteration's fine-tune (logging, checkpoints).

    Returns:
        :class:`PruneHistory` with one :class:`PruneStep` per iteration.

    Raises:
        ValueError: ratio outside (0, 1), ``step_pairs < 1``, model not gated, or iterations of
            ``step_pairs`` cannot reach the ratio without exceeding the prunable pairs.
    """
    if not isinstance(target_ratio, (int, float)) or not 0.0 < float(target_ratio) < 1.0:
        raise ValueError(f"target_ratio must be in the open interval (0, 1), got {target_ratio}")
    if not isinstance(step_pairs, int) or step_pairs < 1:
        raise ValueError(f"step_pairs must be a positive int, got {step_pairs!r}")
    gated_modules(model)
    layers = prunable_layers(model, exclude)
    geometry: list[SwinLayerGeometry] = swin_layers(model)
    total = sum(geometry[l].num_pairs for l in layers)
    pruned = round(pruning_ratio(get_masks(model), layers) * total)
    iterations = (pairs_to_prune(total, float(target_ratio), step_pairs, pruned) - pruned) // step_pairs
    history = PruneHistory(target_ratio=float(target_ratio), step_pairs=step_pairs, prunable_layers=layers,
                           total_pairs=total)
    for iteration in range(iterations):
        saliency = list(saliency_fn(model, iteration))
        validate_layer_list(saliency, geometry, "saliency tensors")
        masks, pairs, scores = prune_step(get_masks(model), saliency, step_pairs, layers)
        set_mask(model, masks)
        if finetune_fn is not None:
            finetune_fn(model, iteration)
        pruned += step_pairs
        step = PruneStep(iteration=iteration, pruned=pairs, scores=scores, num_pruned=pruned, ratio=pruned / total)
        history.steps.append(step)
        if on_step is not None:
            on_step(step, model)
    if final_finetune_fn is not None:
        final_finetune_fn(model)
    return history
