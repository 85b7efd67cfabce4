"""The two grids an explanation lives on, and the moves between them.

- **patch grid** ``(y, x)``: a ViT's patch tokens (``patch_embed``'s grid, row-major token order after the prefix
  tokens); for a model without patches (a CNN) the feature map of its last stage (``stages.{last}.hook_out``).
- **pixel grid** ``(img_y, img_x)``: the input image (the dims of the ``image`` variable ``workbench analyze`` adds).

A map defined on patches is shown on pixels by nearest upsampling (each patch's value repeated over its pixels, as
attention rollout always did); a map defined on pixels is put on patches by summing each patch's pixels (so an
additive attribution such as Integrated Gradients keeps its total).
"""

from __future__ import annotations

import re

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from methods.hooks import hook_points, run_with_cache
from workbench.analysis.tokens import TokenLayout, vit_token_layout

__all__ = ["model_grid", "no_grid_reason", "token_layout", "token_row", "to_pixels", "to_patches", "last_stage"]

_STAGE = re.compile(r"^stages\.(\d+)\.hook_out$")


def last_stage(model: nn.Module) -> str | None:
    """Name of the last ``stages.{i}.hook_out`` hook point of a CNN, or None."""
    stages = sorted((int(m.group(1)), n) for n in hook_points(model) if (m := _STAGE.match(n)))
    return stages[-1][1] if stages else None


def token_layout(model: nn.Module, image_size: tuple[int, int]) -> TokenLayout:
    """Prefix tokens and patch grid of a ViT-like model (:func:`workbench.analysis.tokens.vit_token_layout`)."""
    return vit_token_layout(model, image_size)


def no_grid_reason(model: nn.Module) -> str | None:
    """None if ``model`` has a patch grid to put an explanation on (a ``patch_embed``, or ``stages.{i}.hook_out`` hook
    points), else why it has none."""
    if getattr(model, "patch_embed", None) is not None or last_stage(model) is not None:
        return None
    return (f"{type(model).__name__} has neither a patch_embed nor stages.{{i}}.hook_out hook points: no patch grid to "
            "put an explanation on")


@torch.no_grad()
def model_grid(model: nn.Module, images: torch.Tensor) -> tuple[int, int]:
    """The patch grid ``(gh, gw)`` of ``model`` for ``images`` (module docstring).

    Raises:
        ValueError: a model with neither a ``patch_embed`` nor ``stages.{i}.hook_out`` hook points.
    """
    if getattr(model, "patch_embed", None) is not None:
        return token_layout(model, tuple(images.shape[-2:])).grid
    why = no_grid_reason(model)
    if why is not None:
        raise ValueError(why)
    stage = last_stage(model)
    _, cache = run_with_cache(model, images[:1], names=stage, stop_early=True)
    gh, gw = cache[stage].shape[-2:]  # (1, C, gh, gw)
    return int(gh), int(gw)


def token_row(relevance: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """The classifier token's row of a token-to-token relevance ``(B, T, T)`` over the patch tokens, ``(B, gh, gw)``.

    The classifier token is CLS; a model without one (average pooling) reads the mean over the patch tokens' rows.
    """
    gh, gw = layout.grid
    if "cls" in layout.prefix_kinds:
        row = relevance[:, layout.prefix_kinds.index("cls"), layout.num_prefix:]  # (B, gh*gw)
    else:
        row = relevance[:, layout.num_prefix:, layout.num_prefix:].mean(1)
    return rearrange(row, "b (y x) -> b y x", y=gh, x=gw)


def to_pixels(patch: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``(B, gh, gw)`` -> ``(B, H, W)`` by nearest upsampling."""
    return F.interpolate(patch[:, None].float(), size=tuple(size), mode="nearest")[:, 0]


def to_patches(pixel: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """``(B, H, W)`` -> ``(B, gh, gw)``: the sum of each patch's pixels (mean × area where H, W are not multiples)."""
    b, h, w = pixel.shape
    gh, gw = grid
    if h % gh == 0 and w % gw == 0:
        return rearrange(pixel, "b (y ph) (x pw) -> b y x (ph pw)", y=gh, x=gw).sum(-1)
    return F.adaptive_avg_pool2d(pixel[:, None], (gh, gw))[:, 0] * (h * w / (gh * gw))
