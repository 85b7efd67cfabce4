"""Representation similarity between two networks: linear CKA (biased and debiased) and block cosine.

Linear CKA (Kornblith et al. 2019) of two networks' block outputs, biased and debiased (Nguyen, Raghu & Kornblith
2021); the estimators and their derivation are in :mod:`methods.cka`.

The estimators live in :mod:`methods.cka` (the one implementation, also used by :mod:`methods.nondeep`); this
module arranges a network's layers for them. Everything is computed in float64 (the terms above cancel heavily), on the device of the inputs.
Cost per pair O(n·d₁·d₂); per layer the centred features and self-HSICs are computed once.

Which features (used by :mod:`workbench.analysis.teacher_vs_students`): a *layer* is a block output — a ViT
block's residual stream ``(B, T, D)``, a Swin block's ``(B, H, W, C)``, a CNN stage's
``(B, C, H, W)``. :class:`LayerFeatures` puts each on its spatial grid ``(B, h, w, D)`` (ViT
prefix tokens — CLS, distillation, registers — held apart) and three poolings give the examples:

- ``"mean"``: token-averaged — the mean over the grid (global average pooling; prefix tokens
  excluded, so a ViT, a Swin and a CNN are pooled alike); n = samples;
- ``"token"``: tokens as examples — every grid position of every sample; two layers whose grids
  differ (a CNN stage at 28×28 against ViT patches at 7×7, Swin stages after patch merging) are
  first brought to the common grid (min(h₁, h₂), min(w₁, w₂)) by adaptive average pooling, so an
  example is the same image region in both; n = samples·h·w of that common grid (so n can differ
  between pairs);
- ``"cls"``: the class token (ViTs with one, both layers); n = samples.

Block cosine (where layers correspond one to one: same count and same output shapes, e.g. FAR
against its teacher) is the cosine between the two block outputs per token, averaged over tokens
(prefix tokens included), per sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange

from methods.cka import ESTIMATORS, Estimator, Prepared, cka_matrix, hsic, linear_cka, prepare, prepared_cka

__all__ = ["Estimator", "Pooling", "POOLINGS", "ESTIMATORS", "linear_cka", "hsic", "cka_matrix",
           "LayerFeatures", "layer_features", "pooled_examples", "common_grid", "layer_cka", "block_cosine"]

Pooling = Literal["mean", "token", "cls"]
POOLINGS: tuple[str, ...] = ("mean", "token", "cls")


# ------------------------------------------------------------------------------------ layer features
@dataclass(frozen=True)
class LayerFeatures:
    """One layer's output, arranged for CKA.

    Attributes:
        name: the hook point it came from, e.g. ``blocks.3.hook_resid_post``.
        grid: ``(B, h, w, D)`` the spatial tokens on their grid, or None when the token layout is
            unknown (then only ``"mean"`` over ``tokens`` applies).
        prefix: ``(B, P, D)`` prefix tokens (ViT CLS/dist/registers), ``P = 0`` if none.
        cls_index: position of the class token within ``prefix``, or None.
        tokens: ``(B, T, D)`` every token in the model's order (for block cosine).
    """

    name: str
    grid: torch.Tensor | None
    prefix: torch.Tensor
    cls_index: int | None
    tokens: torch.Tensor


def layer_features(name: str, value: torch.Tensor, *, layout: Literal["tokens", "channels_last", "channels_first"],
                   grid: tuple[int, int] | None = None, prefix_kinds: Sequence[str] = ()) -> LayerFeatures:
    """Arrange one hook value as :class:`LayerFeatures`.

    Args:
        name: hook point name.
        value: ``(B, T, D)`` (``layout="tokens"``, a ViT's ``[prefix…, patches…]`` sequence),
            ``(B, H, W, C)`` (``"channels_last"``, Swin) or ``(B, C, H, W)`` (``"channels_first"``, CNN stage).
        layout: how ``value`` is laid out.
        grid: the patch grid ``(gh, gw)`` of a token sequence (None: unknown).
        prefix_kinds: kinds of the prefix tokens of a token sequence, e.g. ``("cls",)``.
    """
    if layout == "channels_first":
        value = rearrange(value, "b c h w -> b h w c")
        layout = "channels_last"
    if layout == "channels_last":
        if value.ndim != 4:
            raise ValueError(f"{name}: expected (B, H, W, C), got {tuple(value.shape)}")
        b, h, w, d = value.shape
        return LayerFeatures(name, value, value.new_zeros(b, 0, d), None, rearrange(value, "b h w d -> b (h w) d"))
    if layout != "tokens" or value.ndim != 3:
        raise ValueError(f"{name}: expected a (B, T, D) token sequence for layout={layout!r}, got {tuple(value.shape)}")
    b, t, d = value.shape
    p = len(prefix_kinds)
    cls = list(prefix_kinds).index("cls") if "cls" in prefix_kinds else None
    if grid is None or p + grid[0] * grid[1] != t:
        return LayerFeatures(name, None, value.new_zeros(b, 0, d), None, value)
    patches = rearrange(value[:, p:], "b (h w) d -> b h w d", h=grid[0], w=grid[1])
    return LayerFeatures(name, patches, value[:, :p], cls, value)


def common_grid(a: LayerFeatures, b: LayerFeatures) -> tuple[int, int] | None:
    """The grid both layers are pooled to for per-token CKA: ``(min h, min w)``; None if a grid is unknown."""
    if a.grid is None or b.grid is None:
        return None
    return min(a.grid.shape[1], b.grid.shape[1]), min(a.grid.shape[2], b.grid.shape[2])


def pooled_examples(f: LayerFeatures, pooling: Pooling, grid: tuple[int, int] | None = None) -> torch.Tensor | None:
    """The ``(n, D)`` examples of one pooling (module docstring); None where it does not apply.

    Args:
        f: the layer.
        pooling: ``"mean"``, ``"token"`` (needs ``grid``) or ``"cls"``.
        grid: target grid ``(h, w)`` of ``"token"`` (see :func:`common_grid`).
    """
    if pooling == "mean":
        return (f.grid.mean((1, 2)) if f.grid is not None else f.tokens.mean(1))  # (B, D)
    if pooling == "cls":
        return None if f.cls_index is None else f.prefix[:, f.cls_index]
    if pooling != "token":
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    if f.grid is None or grid is None:
        return None
    g = f.grid
    if tuple(g.shape[1:3]) != tuple(grid):
        # (B, h, w, D) -> (B, D, h, w) -> area-average to the common grid -> back
        g = rearrange(F.adaptive_avg_pool2d(rearrange(g, "b h w d -> b d h w").double(), grid), "b d h w -> b h w d")
    return rearrange(g, "b h w d -> (b h w) d")


def layer_cka(teacher: Sequence[LayerFeatures], student: Sequence[LayerFeatures], pooling: Pooling, *,
              estimators: Sequence[str] = ESTIMATORS) -> np.ndarray:
    """CKA of every (teacher layer, student layer) pair under one pooling, ``(len(estimators), L_t, L_s)``.

    NaN where the pooling does not apply to the pair (no CLS token, unknown grid) and for the
    debiased estimator with fewer than 4 examples. Each layer's
    examples are pooled and centred once per target grid.
    """
    cache: dict[tuple[str, int, tuple[int, int] | None], Prepared | None] = {}

    def prepared(side: str, i: int, f: LayerFeatures, grid: tuple[int, int] | None) -> Prepared | None:
        key = (side, i, grid)
        if key not in cache:
            ex = pooled_examples(f, pooling, grid)
            cache[key] = None if ex is None else prepare(ex)
        return cache[key]

    out = np.full((len(estimators), len(teacher), len(student)), np.nan)
    for i, a in enumerate(teacher):
        for j, b in enumerate(student):
            grid = common_grid(a, b) if pooling == "token" else None
            pa, pb = prepared("t", i, a, grid), prepared("s", j, b, grid)
            if pa is None or pb is None:
                continue
            for e, est in enumerate(estimators):
                out[e, i, j] = prepared_cka(pa, pb, est)
    return out


def block_cosine(teacher: Sequence[LayerFeatures], student: Sequence[LayerFeatures]) -> np.ndarray | None:
    """Per-sample mean over tokens of the cosine between corresponding block outputs, ``(B, L)`` float64.

    Returns None unless the layers correspond one to one (same count, same output shapes).
    """
    if len(teacher) != len(student) or any(a.tokens.shape != b.tokens.shape for a, b in zip(teacher, student)):
        return None
    cols = [F.cosine_similarity(a.tokens.double(), b.tokens.double().to(a.tokens.device), dim=-1).mean(1)
            for a, b in zip(teacher, student)]  # each (B,)
    return torch.stack(cols, 1).cpu().numpy()
