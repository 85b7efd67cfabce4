"""AttentionLite's extractors: the spatial maps attention transfer compares, and the students' local attention.

Paper: Kundu & Sundaresan, "AttentionLite: Towards Efficient Self-Attention Models for Vision" (papers/003).

- ``at_maps``: the normalised spatial attention map ψ = F / ‖F‖₂, F = mean_c |A_c|^p (§3, p = 2), of every residual
  stage output ``stages.{s}.hook_out`` — what Eq. 2's AT loss compares. The CNN teacher (timm ResNet adapter) and
  the SA-ResNet students have the same hook names and stage resolutions, so their maps line up sample by sample
  and stage by stage (``xr.concat([teacher, student], dim="model")``).
- ``local_attention``: each local self-attention layer's weights (``*.hook_pattern``, Eq. 1's softmax) for one
  query pixel: where the query looks inside its k × k window, per head.

**How stages of different size line up** (both extractors): a map of a stage (or attention layer) of ``H × W``
cells on an ``H_img × W_img`` input has the stride ``s = 2^round(log2(H_img / H))`` (1, 2, 4, 8 on the demo's
28 × 28: stage maps 28, 14, 7, 4); input pixel ``(y, x)`` belongs to cell ``(min(y // s, H − 1), min(x // s, W − 1))``
and carries that cell's value. So every map is stored on the common input-pixel grid ``(y, x)`` — overlays on the
image are direct — without interpolation: each cell is a constant ``s × s`` block (the last row and column are
narrower when ``H_img`` is not a multiple, e.g. 4 × 4 cells of 8 pixels over 28 pixels end with a 4-pixel block,
which is where the 7 → 4 pooling puts it). The cell values are the ones the loss compares: ψ has unit L2 norm over a
stage's *cells*, not over pixels; ``map.isel(y=slice(0, None, s), x=slice(0, None, s))`` gives the cells back.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import xarray as xr

from methods.attentionlite import at_map, stage_names
from methods.hooks import hook_points, run_with_cache
from workbench.analysis import Example, ExploreKind, examples, register
from workbench.provenance import config_json
from workbench.xrutils import layer_config, pad_stack

__all__ = ["stride_of", "expand_to_pixels", "extract_at_maps", "extract_local_attention", "attention_layer_points"]


def stride_of(size: int, cells: int) -> int:
    """Stride of a map of ``cells`` cells over ``size`` input pixels: ``2^round(log2(size / cells))``."""
    return 2 ** max(0, round(math.log2(size / cells)))


def _pixel_index(size: int, cells: int) -> np.ndarray:
    """For every input pixel, the index of the cell it belongs to (module docstring)."""
    return np.minimum(np.arange(size) // stride_of(size, cells), cells - 1)


def expand_to_pixels(maps: np.ndarray, height: int, width: int) -> np.ndarray:
    """``(..., H, W)`` cell values -> ``(..., height, width)`` pixel values, each cell a constant block."""
    iy, ix = _pixel_index(height, maps.shape[-2]), _pixel_index(width, maps.shape[-1])
    return maps[..., iy[:, None], ix[None, :]]


def _check(model: nn.Module, images: torch.Tensor) -> None:
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}")
    if model.training:
        raise ValueError("AttentionLite extraction needs an eval-mode model (call model.eval()): batch norm in training "
                         "mode would normalise with the batch's statistics and update its running ones")


def _select(n: int, layers: int | Sequence[int] | None, what: str) -> list[int]:
    if layers is None:
        return list(range(n))
    wanted = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
    out = []
    for i in wanted:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -n <= i < n:
            raise ValueError(f"layer index {i!r} out of range: the model has {n} {what} (0..{n - 1})")
        out.append(int(i) % n)
    if not out or len(set(out)) != len(out):
        raise ValueError(f"layers must select distinct {what}, got {wanted}")
    return sorted(out)


@register("at_maps", example=Example(examples.sa_resnet, (2, 1, 12, 12), (0, 1)),
          explore=ExploreKind("at_map", "attention-transfer map", ("stages.*.hook_out",), 50, layout="stages"))
@torch.no_grad()
def extract_at_maps(model: nn.Module, images: torch.Tensor, *, layers: int | Sequence[int] | None = None,
                    targets: torch.Tensor | None = None, p: float = 2.0) -> xr.Dataset:
    """Attention-transfer maps ψ of every residual stage (module docstring), on the input-pixel grid.

    Args:
        model: an eval-mode CNN (timm ResNet, e.g. the teacher) or SA-ResNet student, train or deploy form.
        images: ``(B, C, H, W)`` normalised for the model.
        layers: stage indices (``stage`` dim; negative allowed); None for all.
        p: exponent of F^p (2, as the loss).

    Returns:
        ``at_map(sample, stage, y, x)``: ψ of the cell covering pixel (y, x) (unit L2 norm over each stage's cells);
        coords ``stage``, ``layer`` (= stage, for layer selections), ``hook`` (hook name), ``height`` / ``width``
        (cells) and ``stride`` per stage, ``y`` / ``x`` (input pixels).

    Raises:
        ValueError: a model without ``stages.{s}.hook_out`` hook points, a training-mode model, bad ``layers``.
    """
    _check(model, images)
    names = stage_names(model)
    if not names:
        have = list(hook_points(model))
        raise ValueError(f"{type(model).__name__} has no stage outputs (stages.{{s}}.hook_out): the attention-transfer maps "
                         f"need a CNN / SA-ResNet (it has {len(have)} hook points{': ' + ', '.join(have[:3]) + ', ...' if have else ''})")
    sel = _select(len(names), layers, "stages")
    chosen = [names[i] for i in sel]
    _, cache = run_with_cache(model, images, names=chosen, stop_early=True)
    B, _, H, W = images.shape
    maps, heights, widths = [], [], []
    for n in chosen:
        act = cache[n].float()
        h, w = act.shape[-2:]
        psi = at_map(act, p).view(B, h, w).cpu().numpy()  # (B, h, w), unit L2 norm over the cells
        maps.append(expand_to_pixels(psi, H, W))
        heights.append(h)
        widths.append(w)
    ds = xr.Dataset(
        {"at_map": (("sample", "stage", "y", "x"), np.stack(maps, 1).astype(np.float32))},
        coords={"sample": np.arange(B), "stage": sel, "layer": ("stage", sel), "hook": ("stage", chosen),
                "height": ("stage", heights), "width": ("stage", widths),
                "stride": ("stage", [stride_of(H, h) for h in heights]), "y": np.arange(H), "x": np.arange(W)},
    )
    ds["at_map"].attrs.update(units="1 (unit L2 norm over the stage's cells)",
                              long_name=f"spatial attention map ψ = F/‖F‖₂, F = mean_c |A_c|^{p:g}")
    return ds.assign_attrs(analysis="at_maps", config=config_json(layers=layer_config(layers if layers is None else sel), p=p))


def attention_layer_points(model: nn.Module) -> list[str]:
    """The model's local-attention hook names (``…attn.hook_pattern``; ``conv1.hook_pattern`` for an attention stem),
    in forward order: the ``layer`` index of :func:`extract_local_attention`."""
    return [n for n in hook_points(model) if n.endswith("hook_pattern") and not n.startswith("blocks.")
            and not n.startswith("layers.")]


@register("local_attention", example=Example(examples.sa_resnet, (2, 1, 12, 12), (0, 2)))
@torch.no_grad()
def extract_local_attention(model: nn.Module, images: torch.Tensor, *, layers: int | Sequence[int] | None = None,
                            targets: torch.Tensor | None = None, query: Sequence[float] = (0.5, 0.5)) -> xr.Dataset:
    """Local self-attention weights of one query pixel in every attention layer of an SA-ResNet, on the input grid.

    Args:
        model: an eval-mode SA-ResNet (hybrid / homogeneous, train or deploy form).
        images: ``(B, C, H, W)``.
        layers: attention-layer indices (forward order: the stem's for a homogeneous model, then the blocks').
        query: ``(y, x)`` of the query pixel relative to the image (0 … 1; (0.5, 0.5) = centre); in a layer of
            stride s the query is the cell holding that pixel.

    Returns:
        ``attention(sample, layer, head, y, x)``: the weight of the key cell covering pixel (y, x) (0 outside the
        k × k window; the weights of the window's cells sum to 1), NaN for heads a layer does not have; coords
        ``layer_name`` (module), ``kernel_size``, ``height`` / ``width`` (cells), ``stride``, ``query_i`` /
        ``query_j`` (query cell) per layer; attrs ``query_y`` / ``query_x`` (query pixel).

    Raises:
        ValueError: a model without local attention, a training-mode model, bad ``layers`` or ``query``.
    """
    _check(model, images)
    qy, qx = (float(v) for v in query)
    if not (0.0 <= qy <= 1.0 and 0.0 <= qx <= 1.0):
        raise ValueError(f"query must be (y, x) relative to the image, each in [0, 1]; got {tuple(query)}")
    points = attention_layer_points(model)
    if not points:
        raise ValueError(f"{type(model).__name__} has no local self-attention (…attn.hook_pattern of shape (B, heads, H, W, k, k)): "
                         "the local_attention analysis reads an SA-ResNet student (AttentionLite)")
    sel = _select(len(points), layers, "attention layers")
    chosen = [points[i] for i in sel]
    _, cache = run_with_cache(model, images, names=chosen, stop_early=True)
    B, _, H, W = images.shape
    py, px = min(int(qy * H), H - 1), min(int(qx * W), W - 1)
    maps, info = [], []
    for n in chosen:
        pat = cache[n].float()
        if pat.ndim != 6:
            raise ValueError(f"{n} has shape {tuple(pat.shape)}, not (B, heads, H, W, k, k): not a local attention")
        _, heads, h, w, k, _ = pat.shape
        i, j = min(py // stride_of(H, h), h - 1), min(px // stride_of(W, w), w - 1)
        r = k // 2
        grid = pat.new_zeros(B, heads, h + 2 * r, w + 2 * r)  # padded cell grid: key (i + u − r, j + v − r)
        grid[:, :, i:i + k, j:j + k] = pat[:, :, i, j]
        cells = grid[:, :, r:r + h, r:r + w].cpu().numpy()  # (B, heads, h, w)
        maps.append(expand_to_pixels(cells, H, W).transpose(1, 0, 2, 3))  # (heads, B, H, W)
        info.append((n.removesuffix(".hook_pattern"), k, h, w, stride_of(H, h), i, j))
    arr = pad_stack(maps, axis=0).transpose(2, 0, 1, 3, 4)  # (B, L, heads, H, W)
    names, ks, hs, ws, strides, qi, qj = zip(*info)
    ds = xr.Dataset(
        {"attention": (("sample", "layer", "head", "y", "x"), arr)},
        coords={"sample": np.arange(B), "layer": sel, "head": np.arange(arr.shape[2]), "y": np.arange(H), "x": np.arange(W),
                "layer_name": ("layer", list(names)), "kernel_size": ("layer", list(ks)), "height": ("layer", list(hs)),
                "width": ("layer", list(ws)), "stride": ("layer", list(strides)), "query_i": ("layer", list(qi)),
                "query_j": ("layer", list(qj))},
    )
    ds["attention"].attrs.update(units="probability (per key cell)", long_name="local attention weight of the query")
    return ds.assign_attrs(analysis="local_attention", query_y=py, query_x=px,
                           config=config_json(layers=layer_config(layers if layers is None else sel), query=[qy, qx]))
