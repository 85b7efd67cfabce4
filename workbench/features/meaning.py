"""What a crosscoder latent means: where it fires (its top-activating tokens, as patch crops with their image ids) and
on which classes (its mean activation per class).

A latent's code on a token needs both models' activations there (one encoder reads both), so everything here runs
the teacher and the student on the same images (:func:`~workbench.features.pairs.paired_tokens`) and encodes with the
crosscoder in eval mode (its threshold, so a token's code does not depend on its batch).

:func:`latent_activations` streams the images in batches and keeps, per latent, only

- ``image_mean(sample, latent)`` and ``image_max(sample, latent)``: the code's mean and largest value over the
  image's tokens (prefix tokens included);
- ``top_activation / top_sample / top_token(latent, rank)``: its ``top`` largest token codes over all images, with
  the image's dataset index (``sample`` coordinate) and the token index (coords ``top_kind``, ``top_y``, ``top_x``
  from the token layout: ``"cls"``/``"patch"``, grid row and column, -1 for prefix tokens);
- ``class_mean(latent, label)``: ``image_mean`` averaged over the images of each class (dim ``label``, as
  ``scale``'s per-class means).

:func:`patch_crops` cuts the pixels under those tokens out of the images the models saw.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn
import xarray as xr

from workbench.analysis.tokens import TokenLayout, token_arrays
from workbench.features.crosscoder import Crosscoder
from workbench.features.pairs import paired_tokens

__all__ = ["token_layout", "paired_codes", "latent_activations", "activations_from_rows", "hook_shape", "patch_crops"]


def token_layout(shape: Sequence[int], name: str, image_hw: tuple[int, int], model: nn.Module | None = None
                 ) -> TokenLayout:
    """The token layout of one image's hook value (``shape`` of the whole batch, as :func:`token_rows` reads it).

    A ``(B, T, D)`` sequence: the model's own prefix tokens and patch grid when it is a timm ViT whose layout has
    ``T`` tokens, else ``T − g²`` leading ``cls`` tokens before a ``g × g`` grid (at most two). A map
    (``(B, C, H, W)`` stage, ``(B, H, W, C)`` Swin): its ``H × W`` positions, no prefix.

    Raises:
        ValueError: a sequence whose length is no square plus at most two prefix tokens.
    """
    if len(shape) == 4:
        grid = tuple(shape[2:4]) if name.endswith(".hook_out") else tuple(shape[1:3])
        return TokenLayout((), (int(grid[0]), int(grid[1])))
    t = int(shape[1])
    if model is not None and getattr(model, "patch_embed", None) is not None:
        from workbench.analysis.tokens import vit_token_layout

        try:
            layout = vit_token_layout(model, image_hw)
            if layout.num_tokens == t:
                return layout
        except ValueError:
            pass
    for prefix in (0, 1, 2):
        g = math.isqrt(t - prefix)
        if g * g == t - prefix and g > 0:
            return TokenLayout(("cls",) * prefix, (g, g))
    raise ValueError(f"{name}: {t} tokens are no square patch grid plus at most two prefix tokens; pass the model "
                     "(a timm ViT) so its layout can be read")


@torch.no_grad()
def paired_codes(cc: Crosscoder, models: Mapping[str, nn.Module], hooks: Mapping[str, str], images: torch.Tensor,
                 device: torch.device | str = "cpu") -> tuple[list[torch.Tensor], torch.Tensor]:
    """``(rows, codes)`` of one batch: per model ``(B·T, d_m)`` activations and the ``(B·T, width)`` codes (eval)."""
    rows = paired_tokens(models, hooks, images, device)
    was = cc.training
    cc.eval()
    codes, _ = cc.encode([r.to(cc.b_enc.device) for r in rows])
    cc.train(was)
    return rows, codes


class _Top:
    """Running top-``k`` token codes per latent."""

    def __init__(self, width: int, k: int):
        self.value = torch.full((width, k), -1.0)
        self.where = torch.full((width, k, 2), -1, dtype=torch.long)  # (position of the image, token)

    def add(self, codes: torch.Tensor, first: int) -> None:
        b, t, width = codes.shape  # codes (B, T, width)
        flat = codes.permute(2, 0, 1).reshape(width, b * t).cpu()  # (width, B·T), index = image · T + token
        pos = torch.arange(b * t)
        where = torch.stack([first + pos // t, pos % t], -1).expand(width, -1, -1)  # (width, B·T, 2)
        value = torch.cat([self.value, flat], 1)
        kept = torch.topk(value, self.value.shape[1], dim=1)
        both = torch.cat([self.where, where], 1)
        self.value, self.where = kept.values, torch.gather(both, 1, kept.indices[..., None].expand(-1, -1, 2))


@torch.no_grad()
def latent_activations(cc: Crosscoder, models: Mapping[str, nn.Module], hooks: Mapping[str, str],
                       images: torch.Tensor, labels: Sequence[int], samples: Sequence[int] | None = None, *,
                       top: int = 8, batch_size: int = 64, device: torch.device | str = "cpu") -> xr.Dataset:
    """Per latent its image means, top tokens and class means on ``images`` (module docstring).

    Args:
        cc: the crosscoder over ``models`` (the teacher first) at ``hooks``.
        images: ``(N, C, H, W)``, normalised for the models.
        labels: ``(N,)`` class of each image (-1 where unknown: left out of ``class_mean``).
        samples: ``(N,)`` dataset index of each image (the ``sample`` coordinate); default ``0..N-1``.
        top: tokens kept per latent.
    """
    first = next(iter(models))
    shape = hook_shape(models[first], hooks[first], images[:1], device)
    layout = token_layout(shape, hooks[first], tuple(images.shape[-2:]), models[first])
    batches = (paired_tokens(models, hooks, images[lo:lo + batch_size], device)
               for lo in range(0, images.shape[0], batch_size))
    return activations_from_rows(cc, batches, images.shape[0], labels, samples, layout, top=top)


@torch.no_grad()
def activations_from_rows(cc: Crosscoder, batches: Iterable[list[torch.Tensor]], n: int, labels: Sequence[int],
                          samples: Sequence[int] | None, layout: TokenLayout, *, top: int = 8) -> xr.Dataset:
    """:func:`latent_activations` from per-model rows already read (batches of whole images, in image order)."""
    img_mean, img_max = torch.zeros(n, cc.width), torch.zeros(n, cc.width)
    best, lo = _Top(cc.width, top), 0
    was = cc.training
    cc.eval()
    for rows in batches:
        codes, _ = cc.encode([r.to(cc.b_enc.device) for r in rows])
        codes = codes.cpu().reshape(-1, layout.num_tokens, cc.width)  # (B·T, width) -> (B, T, width), image-major
        b = codes.shape[0]
        img_mean[lo:lo + b], img_max[lo:lo + b] = codes.mean(1), codes.amax(1)
        best.add(codes, lo)
        lo += b
    cc.train(was)
    if lo != n:
        raise ValueError(f"the batches held {lo} images, not {n}")
    return _activation_dataset(img_mean, img_max, best, layout, np.asarray(labels),
                               np.arange(n) if samples is None else np.asarray(samples))


def hook_shape(model: nn.Module, hook: str, x: torch.Tensor, device: torch.device | str = "cpu") -> tuple[int, ...]:
    """The shape of ``model``'s value at ``hook`` on the batch ``x`` (the forward stops there)."""
    from methods.hooks import run_with_cache

    _, cache = run_with_cache(model, x.to(device), names=[hook], stop_early=True)
    return tuple(cache[hook].shape)


def _activation_dataset(img_mean: torch.Tensor, img_max: torch.Tensor, best: _Top, layout: TokenLayout,
                        labels: np.ndarray, samples: np.ndarray) -> xr.Dataset:
    kind, ty, tx = token_arrays(layout.prefix_kinds, layout.grid)
    pos, tok = best.where[..., 0].cpu().numpy(), best.where[..., 1].cpu().numpy()  # (latent, rank)
    valid = pos >= 0
    mean = img_mean.double().cpu().numpy()
    classes = np.unique(labels[labels >= 0])
    class_mean = np.stack([mean[labels == c].mean(0) for c in classes], 1) if classes.size else \
        np.zeros((mean.shape[1], 0))
    ds = xr.Dataset(
        {"image_mean": (("sample", "latent"), mean), "image_max": (("sample", "latent"), img_max.double().cpu().numpy()),
         "top_activation": (("latent", "rank"), np.where(valid, best.value.double().cpu().numpy(), np.nan)),
         "top_position": (("latent", "rank"), pos), "top_sample": (("latent", "rank"), np.where(valid, samples[pos], -1)),
         "top_token": (("latent", "rank"), tok), "class_mean": (("latent", "label"), class_mean)},
        coords={"sample": samples, "latent": np.arange(mean.shape[1]), "rank": np.arange(pos.shape[1]),
                "label": classes, "sample_label": ("sample", labels),
                "top_kind": (("latent", "rank"), np.where(valid, kind[tok], "")),
                "top_y": (("latent", "rank"), np.where(valid, ty[tok], -1)),
                "top_x": (("latent", "rank"), np.where(valid, tx[tok], -1))})
    ds["image_mean"].attrs.update(units="code (scaled units)", long_name="mean code over the image's tokens")
    ds["class_mean"].attrs.update(units="code (scaled units)", long_name="image_mean averaged over the class's images")
    ds["top_position"].attrs.update(long_name="position of the image in the batch passed (-1: none)")
    return ds.assign_attrs(grid=list(layout.grid), prefix_kinds=list(layout.prefix_kinds))


def patch_crops(display: np.ndarray, positions: np.ndarray, ty: np.ndarray, tx: np.ndarray,
                grid: Sequence[int], context: int = 1) -> np.ndarray:
    """The pixels under tokens: ``(…, crop_y, crop_x[, rgb])`` float32, NaN outside the image or for no token.

    Args:
        display: ``(N, H, W)`` or ``(N, H, W, 3)`` images as the models saw them, in [0, 1].
        positions, ty, tx: equal-shape arrays (e.g. ``(latent, rank)``): the image's position in ``display``
            (-1: no token) and the token's grid row / column (-1: a prefix token, whose crop is the whole image
            resampled to the crop size — it reads every patch).
        grid: the token grid ``(gh, gw)`` over the image.
        context: grid cells of context on each side of the token's own cell.
    """
    n, h, w = display.shape[:3]
    gh, gw = int(grid[0]), int(grid[1])
    ch, cw = (2 * context + 1) * math.ceil(h / gh), (2 * context + 1) * math.ceil(w / gw)
    flat_p, flat_y, flat_x = (np.asarray(a).reshape(-1) for a in (positions, ty, tx))
    out = np.full((flat_p.size, ch, cw, *display.shape[3:]), np.nan, np.float32)
    for i, (p, y, x) in enumerate(zip(flat_p, flat_y, flat_x)):
        if p < 0:
            continue
        img = display[p]
        if y < 0:  # a prefix token: the whole image, nearest-neighbour resampled
            out[i] = img[np.linspace(0, h - 1, ch).round().astype(int)][:, np.linspace(0, w - 1, cw).round().astype(int)]
            continue
        y0, y1 = (y - context) * h // gh, (y + context + 1) * h // gh  # pixel rows of the cells y-c .. y+c
        x0, x1 = (x - context) * w // gw, (x + context + 1) * w // gw
        sy, sx = max(y0, 0), max(x0, 0)
        part = img[sy:min(y1, h), sx:min(x1, w)][:ch, :cw]
        out[i, sy - y0:sy - y0 + part.shape[0], sx - x0:sx - x0 + part.shape[1]] = part
    return out.reshape(*np.shape(positions), ch, cw, *display.shape[3:])
