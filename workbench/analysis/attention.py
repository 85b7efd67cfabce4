"""Attention-probability extractors: token-to-token (``"attention"``, ViTs) and Swin windows (``"window_attention"``).

Both read the hook point ``hook_pattern`` of every attention module (:mod:`methods.hooks`): the
probabilities the model actually multiplies into ``v``. For timm's own attention modules the
adapter switches the fused ``scaled_dot_product_attention`` path off while hooked (no
probabilities are materialised on it) and reads ``attn_drop``'s output; the two paths agree to
float rounding (the tests check it), so the maps describe the fused model too. Methods that write
their own attention (Sparsifiner's sparse attention, Non-deep's branches) name theirs the same way,
so the extractors find attention by name:

- ViT-like: ``blocks.{layer}.attn.hook_pattern``, or ``blocks.{layer}.branches.{branch}.attn.hook_pattern``
  for a model with parallel branches (then the Dataset has a ``branch`` dim);
- Swin: ``layers.{stage}.blocks.{j}.attn.hook_pattern`` (``layer`` counts blocks over all stages).

The model must be in eval mode: in training mode ``attn_drop`` would drop probabilities at random,
so the extractors refuse it. Heads (and for Swin windows and window tokens) may differ between the
extracted layers -- head-pruned students, Swin stages -- so arrays are NaN-padded to the largest size
over the *extracted* layers; per-layer coordinates say how much of each layer is real.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import xarray as xr
from einops import rearrange

from methods.hooks import hook_points, run_with_cache
from workbench.analysis import Example, ExploreKind, examples, register
from workbench.analysis.tokens import vit_token_layout, window_coords, window_grid, window_token_map_yx
from workbench.analysis.window_saliency import active_pairs, deploy_form_hint, gated_hooks
from workbench.provenance import config_json
from workbench.xrutils import layer_config, pad_stack

VIT_PATTERN = re.compile(r"blocks\.(?P<layer>\d+)(?:\.branches\.(?P<branch>\d+))?\.attn\.hook_pattern")
SWIN_PATTERN = re.compile(r"layers\.(?P<stage>\d+)\.blocks\.(?P<block>\d+)\.attn\.hook_pattern")


@dataclass(frozen=True)
class AttentionPoint:
    """One attention hook point of a model."""

    name: str  # hook name, e.g. "blocks.3.attn.hook_pattern"
    layer: int  # block index (Swin: counted over all stages)
    branch: int | None = None  # parallel branch, if the model has branches
    stage: int = 0  # Swin stage


def attention_points(model: nn.Module, kind: str = "vit") -> list[AttentionPoint]:
    """The model's attention hook points of ``kind`` (``"vit"`` or ``"swin"``), in block order.

    Raises:
        ValueError: the model has none (naming what it has instead).
    """
    names = list(hook_points(model))
    if kind == "vit":
        points = [AttentionPoint(n, int(m["layer"]), None if m["branch"] is None else int(m["branch"]))
                  for n in names if (m := VIT_PATTERN.fullmatch(n))]
    elif kind == "swin":
        points = [AttentionPoint(n, -1, stage=int(m["stage"])) for n in names if (m := SWIN_PATTERN.fullmatch(n))]
        points = [AttentionPoint(p.name, i, stage=p.stage) for i, p in enumerate(points)]
    else:
        raise ValueError(f"kind must be 'vit' or 'swin', got {kind!r}")
    if not points:
        other = "swin" if kind == "vit" else "vit"
        hint = ""
        if any((SWIN_PATTERN if other == "swin" else VIT_PATTERN).fullmatch(n) for n in names):
            hint = f" It is a {'Swin' if other == 'swin' else 'ViT-like'} model: use the '{'window_attention' if other == 'swin' else 'attention'}' extractor."
        raise ValueError(f"{type(model).__name__} has no {'ViT' if kind == 'vit' else 'Swin'} attention hook points "
                         f"({'blocks.{i}.attn.hook_pattern' if kind == 'vit' else 'layers.{s}.blocks.{j}.attn.hook_pattern'}); "
                         f"it has {len(names)} hook points{': ' + ', '.join(names[:4]) + ', ...' if names else ''}.{hint}")
    return points


def select_layers(points: Sequence[AttentionPoint], layers: int | Sequence[int] | None) -> list[AttentionPoint]:
    """The points of blocks ``layers`` (negative indices count from the end), in block order.

    Raises:
        ValueError: an index out of range, a duplicate, or an empty selection.
    """
    available = sorted({p.layer for p in points})
    if layers is None:
        return list(points)
    wanted = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
    n = len(available)
    resolved = []
    for i in wanted:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ValueError(f"layers must be ints, got {i!r}")
        if not -n <= i < n:
            raise ValueError(f"layer index {i} out of range for a model with {n} attention blocks (0..{n - 1})")
        resolved.append(available[int(i) % n])
    if not resolved:
        raise ValueError("layers selects no block; pass None for all blocks")
    if len(set(resolved)) != len(resolved):
        raise ValueError(f"duplicate layer indices in {wanted} (resolved: {resolved})")
    return [p for p in points if p.layer in resolved]


def record(model: nn.Module, images: torch.Tensor, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """One no-grad, eval-mode forward pass caching the named values (the rest of the model is skipped)."""
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}")
    if model.training:
        raise ValueError("attention extraction needs an eval-mode model (call model.eval()): in training mode "
                         "attention dropout changes the probabilities multiplied into v")
    with torch.no_grad():
        _, cache = run_with_cache(model, images, names=list(names), stop_early=True)
    return cache


@register("attention", example=Example(examples.vit, (2, 1, 28, 28), (0, 2)),
          explore=ExploreKind("attention", "attention", ("blocks.*attn.hook_pattern",), 40))
def extract_attention(
    model: nn.Module, images: torch.Tensor, *, layers: int | Sequence[int] | None = None, targets: torch.Tensor | None = None
) -> xr.Dataset:
    """Token-to-token attention probabilities of a ViT-like model (timm ViT / DeiT, or any model whose attention
    modules name their probabilities ``blocks.{i}.attn.hook_pattern``).

    Args:
        model: eval-mode timm ``VisionTransformer`` (incl. DeiT distilled, register tokens, any
            ``img_size``). Its fused-attention flags are left as they were.
        images: ``(B, C, H, W)`` float tensor, normalised for the model.
        layers: block indices (negative allowed); ``None`` for all blocks.
        targets: unused (attention does not depend on labels); part of every extractor's signature.

    Returns:
        Dataset with

        - ``attention(sample, layer, head, query, key)`` float32 probabilities (rows sum to 1), with a ``branch``
          dim after ``layer`` for a model with parallel branches;
          NaN for heads beyond a layer's ``num_heads`` when extracted layers differ in head count;
        - ``cls_attention(sample, layer, head, y, x)``: the CLS query row over the patch keys on
          the patch grid (omitted for models without a class token);
        - coords ``sample`` (0..B-1), ``layer`` (block indices), ``head``, ``query``/``key`` (token
          index) with ``query_kind``/``query_y``/``query_x`` and ``key_kind``/``key_y``/``key_x``
          (see :mod:`workbench.analysis.tokens`), ``y``, ``x``, and ``num_heads(layer)``;
        - attrs ``analysis="attention"``, ``config`` (JSON of ``layers``).

    Raises:
        ValueError: a model in training mode, without timm attention blocks, or bad ``layers``.
    """
    points = select_layers(attention_points(model, "vit"), layers)
    cache = record(model, images, [p.name for p in points])
    layout = vit_token_layout(model, tuple(images.shape[-2:]))
    layer_ids = sorted({p.layer for p in points})
    branches = sorted({p.branch for p in points if p.branch is not None})
    by_key = {(p.layer, p.branch): cache[p.name].float().cpu().numpy() for p in points}  # each (B, heads, N, N)
    n_tok = next(iter(by_key.values())).shape[-1]
    if n_tok != layout.num_tokens:
        raise ValueError(
            f"attention over {n_tok} tokens, but {layout.prefix_kinds} + a {layout.grid} patch grid "
            f"make {layout.num_tokens}; unsupported token layout"
        )
    if branches:  # (B, L, branch, heads, N, N)
        per_layer = [pad_stack([by_key[(layer, b)] for b in branches], axis=1) for layer in layer_ids]
        attn = pad_stack(per_layer, axis=1)
        dims = ("sample", "layer", "branch", "head", "query", "key")
    else:  # (B, L, heads, N, N)
        attn = pad_stack([by_key[(layer, None)] for layer in layer_ids], axis=1)
        dims = ("sample", "layer", "head", "query", "key")
    b = attn.shape[0]
    n_heads = attn.shape[dims.index("head")]
    data = {"attention": (dims, attn, {"units": "probability", "long_name": "attention probability"})}
    coords = {
        "sample": np.arange(b),
        "layer": layer_ids,
        "head": np.arange(n_heads),
        "num_heads": ("layer", [max(a.shape[1] for k, a in by_key.items() if k[0] == layer) for layer in layer_ids]),
        **({"branch": branches} if branches else {}),
        **layout.coords("query"),
        **layout.coords("key"),
    }
    if "cls" in layout.prefix_kinds:
        gh, gw = layout.grid
        rows = attn[..., layout.prefix_kinds.index("cls"), layout.num_prefix:]  # (..., gh*gw) row-major
        data["cls_attention"] = (dims[:-2] + ("y", "x"), rows.reshape(*rows.shape[:-1], gh, gw),  # (..., y, x)
                                 {"units": "probability", "long_name": "CLS-to-patch attention probability"})
        coords.update(y=np.arange(gh), x=np.arange(gw))
    ds = xr.Dataset(data, coords=coords)  # one constructor: each later assign would re-align every coordinate
    return ds.assign_attrs(analysis="attention", config=config_json(layers=layer_config(layers)))


@register("window_attention", example=Example(examples.swin, (2, 1, 32, 32), (0, 1)),
          explore=ExploreKind("attention", "window attention", ("layers.*attn.hook_pattern",), 30, layout="windows",
                              prepare=gated_hooks, masks=active_pairs, hint=deploy_form_hint))
def extract_window_attention(
    model: nn.Module,
    images: torch.Tensor,
    *,
    layers: int | Sequence[int] | None = None,
    targets: torch.Tensor | None = None,
    stage: int | None = None,
) -> xr.Dataset:
    """Window attention probabilities of a timm SwinTransformer (hook points ``layers.{s}.blocks.{j}.attn.hook_pattern``).

    Windows are in timm's ``window_partition`` order of the block's (cyclically shifted, for
    shifted blocks; bottom/right zero-padded when the map is not a multiple of the window) feature
    map. Layers of different stages have different window counts and heads (and possibly window
    sizes); all arrays are NaN-padded to the largest size over the extracted layers, and
    layer-dependent coordinates are ``-1`` where padded. Pass ``stage=`` (or ``layers`` inside one
    stage) for an unpadded array; for ``swin_tiny`` at 224 the padded all-layer array is ~20x larger.

    Args:
        model: eval-mode timm ``SwinTransformer``.
        images: ``(B, C, H, W)`` float tensor, normalised for the model.
        layers: global block indices counted over all stages (negative allowed); ``None`` for all.
        targets: unused; part of every extractor's signature.
        stage: take all blocks of this stage instead (mutually exclusive with ``layers``).

    Returns:
        Dataset with ``attention(sample, layer, window, head, query, key)`` float32 probabilities and
        coords: ``sample``, ``layer`` (global block index), ``window``, ``head``, ``query``, ``key``;
        per layer ``stage``, ``shifted``, ``shift_y``, ``shift_x``, ``window_h``, ``window_w``,
        ``map_h``, ``map_w`` (unpadded stage feature map), ``num_windows``, ``num_heads``;
        ``window_y``/``window_x(layer, window)`` (window row/col in the partition grid);
        ``query_wy``/``query_wx(layer, query)`` and ``key_wy``/``key_wx(layer, key)`` (position inside
        the window); ``query_y``/``query_x(layer, window, query)`` and ``key_y``/``key_x(layer, window,
        key)`` (row/col in the *unshifted* stage feature map, ``-1`` for padding tokens).
        attrs ``analysis="window_attention"``, ``config``.

    Raises:
        ValueError: training mode, a non-Swin model, bad ``layers``/``stage``.
    """
    points = _swin_points(model, layers, stage)
    block_names = [p.name.removesuffix(".attn.hook_pattern") for p in points]
    cache = record(model, images, [p.name for p in points] + [f"{b}.hook_resid_pre" for b in block_names])
    probs, per_layer = zip(*(_window_probs(model, cache, s, b) for s, b in zip(points, block_names)))
    attn = pad_stack(list(probs), axis=1)  # (B, L, windows, heads, N, N)
    _, n_layers, n_win, n_heads, n_tok, _ = attn.shape
    per_layer_coords = {
        k: ("layer", [info[k] for info in per_layer])
        for k in ("stage", "shifted", "shift_y", "shift_x", "window_h", "window_w", "map_h", "map_w",
                  "num_windows", "num_heads")
    }
    ds = xr.Dataset(
        {"attention": (("sample", "layer", "window", "head", "query", "key"), attn)},
        coords={
            "sample": np.arange(attn.shape[0]),
            "layer": [s.layer for s in points],
            "window": np.arange(n_win),
            "head": np.arange(n_heads),
            "query": np.arange(n_tok),
            "key": np.arange(n_tok),
            **per_layer_coords,
            **_window_position_coords(per_layer, n_win, n_tok),
        },
    )
    ds["attention"].attrs.update(units="probability", long_name="window attention probability")
    config = config_json(layers=None if stage is not None else layer_config(layers), stage=stage)
    return ds.assign_attrs(analysis="window_attention", config=config)


def _swin_points(model: nn.Module, layers: int | Sequence[int] | None, stage: int | None) -> list:
    """The Swin attention points of ``layers`` (global block indices) or of all blocks of ``stage``."""
    all_points = attention_points(model, "swin")
    if stage is not None:
        if layers is not None:
            raise ValueError("pass either layers or stage, not both")
        layers = [p.layer for p in all_points if p.stage == stage]
        if not layers:
            raise ValueError(f"stage {stage} out of range (stages 0..{all_points[-1].stage})")
    return select_layers(all_points, layers)


def _window_probs(model: nn.Module, cache: dict, point, block_name: str) -> tuple[np.ndarray, dict]:
    """One block's recorded window attention ``(B, windows, heads, N, N)`` and its geometry (per-layer coords)."""
    block = model.get_submodule(block_name)
    b, h, w, _ = cache[f"{block_name}.hook_resid_pre"].shape  # block input (B, H, W, C)
    wh, ww = block.window_size
    sy, sx = block.shift_size
    hp, wp = -(-h // wh) * wh, -(-w // ww) * ww  # padded map
    p = cache[point.name].float().cpu().numpy()  # (B * windows, heads, wh*ww, wh*ww)
    n_win = (hp // wh) * (wp // ww)
    if p.shape[0] != b * n_win or p.shape[-1] != wh * ww:
        raise RuntimeError(
            f"block {point.layer}: attention shape {p.shape} does not match {n_win} windows of {wh}x{ww}"
        )
    info = dict(stage=point.stage, shifted=bool(sy or sx), shift_y=sy, shift_x=sx, window_h=wh, window_w=ww,
                map_h=h, map_w=w, num_windows=n_win, num_heads=p.shape[1], padded=(hp, wp))
    return rearrange(p, "(b w) h q k -> b w h q k", b=b), info


def _window_position_coords(per_layer: Sequence[dict], n_win: int, n_tok: int) -> dict:
    """Window grid positions and token positions (in the window, in the unshifted map) per layer, ``-1`` padded."""
    n_layers = len(per_layer)

    def filled(shape: tuple[int, ...]) -> np.ndarray:
        return np.full(shape, -1, dtype=np.int64)

    win_y, win_x = filled((n_layers, n_win)), filled((n_layers, n_win))
    tok_wy, tok_wx = filled((n_layers, n_tok)), filled((n_layers, n_tok))
    map_y, map_x = filled((n_layers, n_win, n_tok)), filled((n_layers, n_win, n_tok))
    for i, info in enumerate(per_layer):
        win, nw, nt = (info["window_h"], info["window_w"]), info["num_windows"], info["window_h"] * info["window_w"]
        win_y[i, :nw], win_x[i, :nw] = window_grid(info["padded"], win)
        wc = window_coords(win, "query")
        tok_wy[i, :nt], tok_wx[i, :nt] = wc["query_wy"], wc["query_wx"]
        yy, xx = window_token_map_yx((info["map_h"], info["map_w"]), win, (info["shift_y"], info["shift_x"]))
        map_y[i, :nw, :nt], map_x[i, :nw, :nt] = yy, xx
    return {
        "window_y": (("layer", "window"), win_y),
        "window_x": (("layer", "window"), win_x),
        "query_wy": (("layer", "query"), tok_wy),
        "query_wx": (("layer", "query"), tok_wx),
        "key_wy": (("layer", "key"), tok_wy.copy()),
        "key_wx": (("layer", "key"), tok_wx.copy()),
        "query_y": (("layer", "window", "query"), map_y),
        "query_x": (("layer", "window", "query"), map_x),
        "key_y": (("layer", "window", "key"), map_y.copy()),
        "key_x": (("layer", "window", "key"), map_x.copy()),
    }
