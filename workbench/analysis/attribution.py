"""Per-image attributions of a model's class score on the input image grid, and their agreement.

Built on captum: :func:`integrated_gradients` and :func:`saliency` call ``captum.attr``'s
``IntegratedGradients`` and ``Saliency``; only the reduction to one map per image is ours.

- **Integrated Gradients** (Sundararajan et al. 2017): attributions of the target class's *logit*
  along the straight path from a baseline to the image. Baseline: the zero tensor in normalised
  space — every pixel at the dataset mean colour (the images are normalised with the dataset's
  mean and std), the customary "uninformative" input. Steps: captum's Gauss–Legendre rule with
  ``n_steps`` = 50 nodes (default), accurate enough that the completeness gap
  |Σ attributions − (f(x) − f(baseline))| is well under 1 % of f(x) − f(baseline) for the demo
  models (returned per image as ``delta``, the relative gap; on the trained demo ViT, 64 held-out
  digits: max gap 9 % with 8 nodes, 1.5 % with 16, 1e-4 with 32, 2e-6 with 50). Map: the attributions summed over
  channels (signed; completeness holds for the map's sum).
- **Saliency** (Simonyan et al. 2014): |∂ logit / ∂ x|, map = maximum over channels (as in the paper).

Both differentiate an eval-mode model inside :func:`methods.devices.differentiable`: for a model with LSTMs (FAR)
cuDNN is off there, since cuDNN refuses an RNN backward outside training mode; the gradients are the same.
- **Attention rollout** (Abnar & Zuidema 2020, ViTs only): with Ā_l the head-averaged attention
  probabilities of block l (``blocks.{l}.attn.hook_pattern``, read with
  :func:`methods.hooks.run_with_cache`), the residual connection is accounted for as
  Â_l = ½ Ā_l + ½ I, rows renormalised, and attention is rolled out from the input:
  R = Â_{L−1} ⋯ Â_1 Â_0. The map is the CLS token's row of R over the patch tokens (for a
  model without a CLS token, the mean over the patch tokens' rows, matching average pooling),
  on the patch grid, repeated over each patch's pixels (nearest upsampling) to the image grid.
  Rollout is class-agnostic: the same map for every target.
- **random**: a seeded uniform random map, the chance reference for agreement and faithfulness.

Agreement of two maps of one image (:func:`map_agreement`): Spearman rank correlation of all
pixels, top-k overlap (share of the k highest pixels in common, k = a fraction of the pixels),
and cosine similarity of the flattened maps.
"""

from __future__ import annotations

import re
from typing import Literal, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange
from scipy.stats import rankdata

from methods.devices import differentiable
from methods.hooks import hook_points, run_with_cache
from workbench.analysis.tokens import vit_token_layout

__all__ = ["Attribution", "ATTRIBUTIONS", "integrated_gradients", "saliency", "attention_rollout", "rollout_map",
           "rollout_supported", "random_map", "attribution_maps", "topk_overlap", "rank_correlation", "cosine",
           "map_agreement"]

Attribution = Literal["integrated_gradients", "saliency", "rollout", "random"]
ATTRIBUTIONS: tuple[str, ...] = ("integrated_gradients", "saliency", "rollout", "random")
_PATTERN = re.compile(r"^blocks\.(\d+)\.attn\.hook_pattern$")


def _batches(n: int, size: int):
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def _score(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The target logits ``(B,)`` in float64."""
    return model(x).double().gather(1, target.view(-1, 1))[:, 0]


def integrated_gradients(model: nn.Module, images: torch.Tensor, target: torch.Tensor, *, n_steps: int = 50,
                         batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Integrated Gradients of the target logits from the zero (dataset-mean) baseline, via captum.

    Args:
        model: eval-mode classifier returning logits ``(B, classes)``.
        images: ``(B, C, H, W)`` normalised images.
        target: ``(B,)`` class per image.
        n_steps: Gauss–Legendre nodes of the path integral.
        batch_size: images per captum call (captum's ``internal_batch_size`` is ``batch_size`` too).

    Returns:
        ``(attributions (B, C, H, W), map (B, H, W) = channel sum, delta (B,))`` where delta is the
        relative completeness gap ``|Σ attr − (f(x) − f(0))| / |f(x) − f(0)|`` (float64).
    """
    from captum.attr import IntegratedGradients

    ig = IntegratedGradients(model)
    attrs, deltas = [], []
    for sl in _batches(len(images), batch_size):
        x = images[sl]
        with differentiable(model):  # an eval-mode LSTM (FAR) differentiates with cuDNN off
            a, d = ig.attribute(x, baselines=torch.zeros_like(x), target=target[sl], n_steps=n_steps,
                                internal_batch_size=batch_size, return_convergence_delta=True)
        attrs.append(a.detach())
        deltas.append(d.detach().double())
    attr = torch.cat(attrs)
    with torch.no_grad():
        gap = torch.cat([_score(model, images[sl], target[sl]) - _score(model, torch.zeros_like(images[sl]), target[sl])
                         for sl in _batches(len(images), batch_size)])
    rel = torch.cat(deltas).abs() / gap.abs().clamp_min(1e-12)
    return attr, attr.sum(1), rel


def refined_integrated_gradients(model: nn.Module, images: torch.Tensor, target: torch.Tensor, *, n_steps: int = 50,
                                 tolerance: float | None = None, max_steps: int = 256, batch_size: int = 64
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`integrated_gradients`, with more Gauss–Legendre nodes where the completeness gap is large.

    A model whose logit changes steeply along the straight path (FAR's LSTM gates) leaves a large gap at
    a node count that suffices for a ViT. Images whose relative gap exceeds ``tolerance`` are recomputed
    with twice the nodes, again and again, up to ``max_steps`` (Sundararajan et al. 2017, §3: "the
    completeness gap … check that it is within 5 %, else increase the steps").

    Returns:
        ``(attributions, map, relative gap, nodes used)``; the last ``(B,)`` int64. Without a
        tolerance: one pass at ``n_steps`` (every image ``n_steps``).
    """
    attr, amap, rel = integrated_gradients(model, images, target, n_steps=n_steps, batch_size=batch_size)
    used = torch.full((len(images),), n_steps, dtype=torch.int64)
    steps = n_steps
    while tolerance is not None and steps < max_steps:
        todo = (rel > tolerance).nonzero().flatten().cpu()
        if todo.numel() == 0:
            break
        steps = min(2 * steps, max_steps)
        idx = todo.to(images.device)
        a, m, r = integrated_gradients(model, images[idx], target[idx], n_steps=steps, batch_size=batch_size)
        better = (r < rel[idx]).cpu()  # keep the better estimate (the gap of a jumpy path need not shrink)
        keep = todo[better]
        attr[keep.to(attr.device)], amap[keep.to(amap.device)] = a[better.to(a.device)], m[better.to(m.device)]
        rel[keep.to(rel.device)] = r[better.to(r.device)]
        used[keep] = steps
    return attr, amap, rel, used


def saliency(model: nn.Module, images: torch.Tensor, target: torch.Tensor, *, batch_size: int = 64
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """captum ``Saliency`` |∂ logit / ∂ x| of the target logits.

    Returns:
        ``(attributions (B, C, H, W), map (B, H, W) = max over channels)``.
    """
    from captum.attr import Saliency

    sal = Saliency(model)
    with differentiable(model):  # an eval-mode LSTM (FAR) differentiates with cuDNN off
        out = torch.cat([sal.attribute(images[sl].detach().requires_grad_(True), target=target[sl], abs=True).detach()
                         for sl in _batches(len(images), batch_size)])
    return out, out.amax(1)


def attention_rollout(patterns: Sequence[torch.Tensor], *, residual: bool = True) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020) of per-block attention probabilities.

    Args:
        patterns: per block, in forward order, ``(B, heads, T, T)`` probabilities (rows sum to 1).
        residual: add the identity for the residual connection, Â = ½ Ā + ½ I (the paper's rollout).

    Returns:
        ``(B, T, T)`` float64: R = Â_{L−1} ⋯ Â_0, row q = how much output token q draws on each input token.
    """
    if not patterns:
        raise ValueError("attention rollout needs at least one block's attention")
    out = None
    for p in patterns:
        a = p.double().mean(1)  # (B, T, T) head average
        if residual:
            a = 0.5 * a + 0.5 * torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        a = a / a.sum(-1, keepdim=True)
        out = a if out is None else a @ out
    return out


def rollout_supported(model: nn.Module) -> str | None:
    """None if :func:`rollout_map` applies to ``model``, else the reason it does not."""
    names = [n for n in hook_points(model) if _PATTERN.match(n)]
    blocks = getattr(model, "blocks", None)
    if getattr(model, "patch_embed", None) is None or blocks is None:
        return "attention rollout is defined for ViTs (a patch_embed and blocks.{i}.attn.hook_pattern)"
    if len(names) != len(blocks):
        return (f"attention rollout needs attention probabilities in every block; {len(names)} of {len(blocks)} "
                "blocks have blocks.{i}.attn.hook_pattern (attention-free blocks such as FAR's BiLSTM have none)")
    return None


@torch.no_grad()
def rollout_map(model: nn.Module, images: torch.Tensor, *, batch_size: int = 64) -> torch.Tensor:
    """Attention-rollout map on the image grid ``(B, H, W)`` (module docstring).

    Raises:
        ValueError: the model is not a ViT with attention in every block (see :func:`rollout_supported`).
    """
    why = rollout_supported(model)
    if why:
        raise ValueError(why)
    layout = vit_token_layout(model, tuple(images.shape[-2:]))
    gh, gw = layout.grid
    maps = []
    for sl in _batches(len(images), batch_size):
        _, cache = run_with_cache(model, images[sl], names="blocks.*.attn.hook_pattern", stop_early=True)
        pats = [cache[n] for n in sorted(cache, key=lambda n: int(_PATTERN.match(n).group(1)))]
        r = attention_rollout(pats)  # (b, T, T)
        if "cls" in layout.prefix_kinds:
            row = r[:, layout.prefix_kinds.index("cls"), layout.num_prefix:]  # (b, patches)
        else:
            row = r[:, layout.num_prefix:, layout.num_prefix:].mean(1)
        maps.append(rearrange(row, "b (y x) -> b y x", y=gh, x=gw))
    grid = torch.cat(maps).float()
    return F.interpolate(grid[:, None], size=tuple(images.shape[-2:]), mode="nearest")[:, 0]


def random_map(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A seeded uniform random map of ``shape`` (the chance reference)."""
    return torch.rand(shape, generator=torch.Generator().manual_seed(int(seed)), dtype=torch.float32)


def attribution_maps(model: nn.Module, images: torch.Tensor, target: torch.Tensor, *,
                     methods: Sequence[str] = ATTRIBUTIONS, n_steps: int = 50, batch_size: int = 64,
                     seed: int = 0, ig_tolerance: float | None = None, ig_max_steps: int = 256
                     ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, str]]:
    """The requested attribution maps of one model.

    ``ig_tolerance`` / ``ig_max_steps``: see :func:`refined_integrated_gradients` (None: ``n_steps`` nodes only).

    Returns:
        ``(maps, raw, skipped)``: method -> ``(B, H, W)`` map; method -> ``(B, C, H, W)``
        attributions as captum returned them (IG, Saliency), plus ``"ig_delta"`` -> ``(B,)`` and
        ``"ig_steps"`` -> ``(B,)`` (nodes used);
        method -> reason for methods that do not apply to this model (rollout on a non-ViT).
    """
    bad = [m for m in methods if m not in ATTRIBUTIONS]
    if bad:
        raise ValueError(f"unknown attribution methods {bad}; choose from {ATTRIBUTIONS}")
    maps: dict[str, torch.Tensor] = {}
    raw: dict[str, torch.Tensor] = {}
    skipped: dict[str, str] = {}
    for m in methods:
        if m == "integrated_gradients":
            raw[m], maps[m], raw["ig_delta"], raw["ig_steps"] = refined_integrated_gradients(
                model, images, target, n_steps=n_steps, tolerance=ig_tolerance, max_steps=ig_max_steps,
                batch_size=batch_size)
        elif m == "saliency":
            raw[m], maps[m] = saliency(model, images, target, batch_size=batch_size)
        elif m == "rollout":
            why = rollout_supported(model)
            if why:
                skipped[m] = why
            else:
                maps[m] = rollout_map(model, images, batch_size=batch_size)
        else:
            maps[m] = random_map((images.shape[0], *images.shape[-2:]), seed).to(images.device)
    return maps, raw, skipped


# ------------------------------------------------------------------------------------------ agreement
def _flat(a: np.ndarray | torch.Tensor) -> np.ndarray:
    a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    return a.reshape(a.shape[0], -1).astype(np.float64)


def topk_overlap(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor, k: int) -> np.ndarray:
    """Share of the ``k`` highest entries the two maps have in common, per row ``(B,)`` (ties: lower index first)."""
    fa, fb = _flat(a), _flat(b)
    if not 1 <= k <= fa.shape[1]:
        raise ValueError(f"k must be in 1..{fa.shape[1]}, got {k}")
    ta = np.argsort(-fa, axis=1, kind="stable")[:, :k]
    tb = np.argsort(-fb, axis=1, kind="stable")[:, :k]
    hit = np.zeros_like(fa, dtype=bool)
    np.put_along_axis(hit, ta, True, axis=1)
    return np.take_along_axis(hit, tb, axis=1).sum(1) / k


def _pearson_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (a * b).sum(-1) / np.where(den > 0, den, 1.0), np.nan)


def rank_correlation(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> np.ndarray:
    """Spearman rank correlation of two maps per row ``(B,)`` (average ranks for ties; NaN for a constant map)."""
    return _pearson_rows(rankdata(_flat(a), axis=1), rankdata(_flat(b), axis=1))


def cosine(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> np.ndarray:
    """Cosine similarity of two flattened maps per row ``(B,)``; NaN for an all-zero map."""
    fa, fb = _flat(a), _flat(b)
    den = np.linalg.norm(fa, axis=1) * np.linalg.norm(fb, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (fa * fb).sum(1) / np.where(den > 0, den, 1.0), np.nan)


def map_agreement(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor, *, topk: float = 0.1
                  ) -> dict[str, np.ndarray]:
    """Spearman, top-k overlap (k = ``topk`` × pixels, at least 1) and cosine of two ``(B, H, W)`` maps, each (B,)."""
    n = _flat(a).shape[1]
    k = max(1, int(round(topk * n)))
    return {"spearman": rank_correlation(a, b), "topk": topk_overlap(a, b, k), "cosine": cosine(a, b)}
