"""Attention-probability extractors for timm ViTs/DeiTs (``"attention"``) and Swin (``"window_attention"``).

Both return the probabilities the model actually multiplies into ``v``. timm attention modules
have two paths: a fused ``F.scaled_dot_product_attention`` (no probabilities ever materialised)
and an explicit one, ``softmax(q k^T * scale [+ bias + mask]) -> attn_drop -> @ v``. For the
duration of a call, :func:`record_attention` switches the selected modules to the explicit path
(``module.fused_attn = False``, restored afterwards, also on error) and hooks each module's
``attn_drop``: its output is exactly the tensor multiplied into ``v``. The two paths agree to float
rounding (the tests check logits to 1e-5), so the maps describe the fused model too.

The model must be in eval mode: in training mode ``attn_drop`` would drop probabilities at random
(and the fused path would use a different dropout mask), so the extractors refuse it.

Both extractors share one shape of code: find the attention *sites* (block index, block, attention
module, stage), select them with ``layers``, record, then assemble a Dataset. Heads (and for Swin
windows and window tokens) may differ between the extracted layers -- head-pruned students, Swin
stages -- so arrays are NaN-padded to the largest size over the *extracted* layers; per-layer
coordinates say how much of each layer is real. Select one stage (``stage=``) to avoid padding.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Literal, Sequence

import numpy as np
import torch
import torch.nn as nn
import xarray as xr
from einops import rearrange

from workbench.analysis import register
from workbench.analysis.tokens import vit_token_layout, window_coords, window_grid, window_token_map_yx
from workbench.provenance import config_json

SiteKind = Literal["vit", "swin"]


@dataclass(frozen=True)
class AttentionSite:
    """One attention module of a model.

    Attributes:
        layer: global 0-based block index (across Swin stages).
        block: the transformer block holding ``attn``.
        attn: the timm ``Attention`` / ``WindowAttention`` module.
        stage: Swin stage index (``0`` for a ViT).
    """

    layer: int
    block: nn.Module
    attn: nn.Module
    stage: int = 0


@dataclass
class AttentionRecord:
    """What :func:`record_attention` captured during one forward pass.

    Attributes:
        probs: block index -> list of probability tensors, one per call of the module; a ViT gives
            ``(B, heads, N, N)``, Swin ``(B * windows, heads, N, N)``.
        block_input_shapes: block index -> shape of the block's input (Swin: ``(B, H, W, C)``).
    """

    probs: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    block_input_shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)


class _StopForward(Exception):
    """Raised from a hook once every requested layer is recorded (skips the rest of the model)."""


def _timm_attention_types() -> tuple[type, ...]:
    from timm.layers import Attention

    return (Attention,)


def _timm_window_attention_types() -> tuple[type, ...]:
    from timm.models.swin_transformer import WindowAttention

    return (WindowAttention,)


def vit_attention_sites(model: nn.Module) -> list[AttentionSite]:
    """Attention sites of a timm ``VisionTransformer``-like model: ``model.blocks[i].attn``.

    Raises:
        ValueError: the model has no ``blocks`` holding timm ``Attention`` modules.
    """
    name = type(model).__name__
    blocks = getattr(model, "blocks", None)
    sites = []
    if isinstance(blocks, (nn.Sequential, nn.ModuleList)):
        sites = [
            AttentionSite(i, blk, blk.attn)
            for i, blk in enumerate(blocks)
            if isinstance(getattr(blk, "attn", None), _timm_attention_types())
        ]
    if not sites:
        hint = ""
        if any(isinstance(m, _timm_window_attention_types()) for m in model.modules()):
            hint = " This is a Swin model: use the 'window_attention' extractor."
        raise ValueError(
            f"{name} has no timm attention blocks: expected a timm VisionTransformer/DeiT whose "
            f"`model.blocks[i].attn` is a timm.layers.Attention.{hint}"
        )
    return sites


def swin_attention_sites(model: nn.Module) -> list[AttentionSite]:
    """Attention sites of a timm ``SwinTransformer``: ``model.layers[stage].blocks[j].attn``.

    The site's ``layer`` is the global block index, counting blocks over all stages.

    Raises:
        ValueError: the model has no Swin stages holding timm ``WindowAttention`` modules.
    """
    sites: list[AttentionSite] = []
    stages = getattr(model, "layers", None)
    if isinstance(stages, (nn.Sequential, nn.ModuleList)):
        for s, stage in enumerate(stages):
            for blk in getattr(stage, "blocks", ()):
                if isinstance(getattr(blk, "attn", None), _timm_window_attention_types()):
                    sites.append(AttentionSite(len(sites), blk, blk.attn, stage=s))
    if not sites:
        raise ValueError(
            f"{type(model).__name__} has no Swin window-attention blocks: expected a timm "
            "SwinTransformer whose `model.layers[s].blocks[j].attn` is a timm WindowAttention."
        )
    return sites


def find_sites(model: nn.Module, kind: SiteKind) -> list[AttentionSite]:
    """All attention sites of ``model``; ``kind`` is ``"vit"`` or ``"swin"``."""
    if kind == "vit":
        return vit_attention_sites(model)
    if kind == "swin":
        return swin_attention_sites(model)
    raise ValueError(f"kind must be 'vit' or 'swin', got {kind!r}")


def select_sites(sites: Sequence[AttentionSite], layers: int | Sequence[int] | None) -> list[AttentionSite]:
    """The sites with block indices ``layers`` (negative indices count from the end), in block order.

    Raises:
        ValueError: an index out of range, a duplicate, or an empty selection.
    """
    if layers is None:
        return list(sites)
    wanted = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
    n = len(sites)
    resolved = []
    for i in wanted:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ValueError(f"layers must be ints, got {i!r}")
        if not -n <= i < n:
            raise ValueError(f"layer index {i} out of range for a model with {n} attention blocks (0..{n - 1})")
        resolved.append(int(i) % n)
    if not resolved:
        raise ValueError("layers selects no block; pass None for all blocks")
    if len(set(resolved)) != len(resolved):
        raise ValueError(f"duplicate layer indices in {wanted} (resolved: {resolved})")
    return [sites[i] for i in sorted(resolved)]


def check_eval(model: nn.Module, sites: Sequence[AttentionSite]) -> None:
    """Raise ``ValueError`` unless ``model`` and its attention modules are in eval mode."""
    if model.training or any(s.attn.training for s in sites):
        raise ValueError(
            "attention extraction needs an eval-mode model (call model.eval()): in training mode "
            "attention dropout changes the probabilities multiplied into v"
        )


@contextmanager
def record_attention(
    model: nn.Module,
    layers: int | Sequence[int] | None = None,
    *,
    kind: SiteKind = "vit",
    stop_early: bool = False,
) -> Iterator[AttentionRecord]:
    """Record the attention probabilities of the selected blocks during the forward passes in the body.

    Sets ``fused_attn = False`` on the selected attention modules and hooks their ``attn_drop``;
    everything is restored on exit, also on error. Gradients are not disabled here.

    Args:
        model: an eval-mode timm ViT (``kind="vit"``) or SwinTransformer (``kind="swin"``).
        layers: block indices to record (negative allowed); ``None`` for all.
        kind: which block layout to look for.
        stop_early: abort the forward pass (silently) once every selected block has been
            recorded; the body's forward call then returns nothing.

    Yields:
        An :class:`AttentionRecord`, filled as the body runs.

    Example:
        >>> with record_attention(model, layers=[0, -1]) as rec:
        ...     logits = model(images)
        >>> rec.probs[0][0].shape  # (B, heads, N, N)
    """
    sites = select_sites(find_sites(model, kind), layers)
    check_eval(model, sites)
    record = AttentionRecord()
    handles = []
    saved_flags = {}

    def make_hooks(site: AttentionSite):
        def on_block_input(_mod, args):
            record.block_input_shapes[site.layer] = tuple(args[0].shape)

        def on_probs(_mod, _args, out):
            record.probs.setdefault(site.layer, []).append(out.detach())
            if stop_early and len(record.probs) == len(sites):
                raise _StopForward

        return on_block_input, on_probs

    try:
        for site in sites:
            if hasattr(site.attn, "fused_attn"):
                saved_flags[site.layer] = site.attn.fused_attn
                site.attn.fused_attn = False
            on_block_input, on_probs = make_hooks(site)
            handles.append(site.block.register_forward_pre_hook(on_block_input))
            handles.append(site.attn.attn_drop.register_forward_hook(on_probs))
        try:
            yield record
        except _StopForward:
            pass
    finally:
        for h in handles:
            h.remove()
        for site in sites:
            if site.layer in saved_flags:
                site.attn.fused_attn = saved_flags[site.layer]


def _run_recorded(
    model: nn.Module, images: torch.Tensor, layers: int | Sequence[int] | None, kind: SiteKind
) -> tuple[list[AttentionSite], AttentionRecord]:
    """One no-grad forward pass recording the selected sites; checks each was called exactly once."""
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}")
    sites = select_sites(find_sites(model, kind), layers)
    with torch.no_grad(), record_attention(model, [s.layer for s in sites], kind=kind, stop_early=True) as rec:
        model(images)
    for s in sites:
        calls = len(rec.probs.get(s.layer, []))
        if calls != 1:
            raise RuntimeError(
                f"block {s.layer}: expected its attention to run once per forward pass, got {calls} "
                "(a custom attention that bypasses attn_drop, or a block reused within the model)"
            )
    return sites, rec


def _pad_stack(arrays: Sequence[np.ndarray], axis: int) -> np.ndarray:
    """Stack arrays along a new ``axis``, NaN-padding every other dim to the largest size.

    The result is allocated in its final (C-contiguous) layout, one copy per input array.
    """
    shape = [int(max(a.shape[d] for a in arrays)) for d in range(arrays[0].ndim)]
    out_shape = (*shape[:axis], len(arrays), *shape[axis:])
    if all(list(a.shape) == shape for a in arrays):
        out = np.empty(out_shape, dtype=np.float32)
    else:
        out = np.full(out_shape, np.nan, dtype=np.float32)
    for i, a in enumerate(arrays):
        out[(*(slice(0, s) for s in a.shape[:axis]), i, *(slice(0, s) for s in a.shape[axis:]))] = a
    return out


def _layer_config(layers: int | Sequence[int] | None) -> list[int] | int | None:
    if layers is None or isinstance(layers, (int, np.integer)):
        return None if layers is None else int(layers)
    return [int(i) for i in layers]


@register("attention")
def extract_attention(
    model: nn.Module, images: torch.Tensor, *, layers: int | Sequence[int] | None = None
) -> xr.Dataset:
    """Token-to-token attention probabilities of a timm ViT / DeiT.

    Args:
        model: eval-mode timm ``VisionTransformer`` (incl. DeiT distilled, register tokens, any
            ``img_size``). Its fused-attention flags are left as they were.
        images: ``(B, C, H, W)`` float tensor, normalised for the model.
        layers: block indices (negative allowed); ``None`` for all blocks.

    Returns:
        Dataset with

        - ``attention(sample, layer, head, query, key)`` float32 probabilities (rows sum to 1);
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
    sites, rec = _run_recorded(model, images, layers, "vit")
    layout = vit_token_layout(model, tuple(images.shape[-2:]))
    probs = [rec.probs[s.layer][0].float().cpu().numpy() for s in sites]  # each (B, heads, N, N)
    n_tok = probs[0].shape[-1]
    if n_tok != layout.num_tokens:
        raise ValueError(
            f"attention over {n_tok} tokens, but {layout.prefix_kinds} + a {layout.grid} patch grid "
            f"make {layout.num_tokens}; unsupported token layout"
        )
    attn = _pad_stack(probs, axis=1)  # (B, L, heads, N, N)
    b, n_layers, n_heads = attn.shape[:3]
    ds = xr.Dataset(
        {"attention": (("sample", "layer", "head", "query", "key"), attn)},
        coords={
            "sample": np.arange(b),
            "layer": [s.layer for s in sites],
            "head": np.arange(n_heads),
            "num_heads": ("layer", [p.shape[1] for p in probs]),
            **layout.coords("query"),
            **layout.coords("key"),
        },
    )
    if "cls" in layout.prefix_kinds:
        cls = layout.prefix_kinds.index("cls")
        gh, gw = layout.grid
        rows = attn[:, :, :, cls, layout.num_prefix :]  # (B, L, heads, gh*gw), row-major patches
        grid = rearrange(rows, "b l h (y x) -> b l h y x", y=gh, x=gw)
        ds["cls_attention"] = (("sample", "layer", "head", "y", "x"), grid)
        ds = ds.assign_coords(y=np.arange(gh), x=np.arange(gw))
    ds["attention"].attrs.update(units="probability", long_name="attention probability")
    if "cls_attention" in ds:
        ds["cls_attention"].attrs.update(units="probability", long_name="CLS-to-patch attention probability")
    return ds.assign_attrs(analysis="attention", config=config_json(layers=_layer_config(layers)))


@register("window_attention")
def extract_window_attention(
    model: nn.Module,
    images: torch.Tensor,
    *,
    layers: int | Sequence[int] | None = None,
    stage: int | None = None,
) -> xr.Dataset:
    """Window attention probabilities of a timm SwinTransformer.

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
    all_sites = swin_attention_sites(model)
    if stage is not None:
        if layers is not None:
            raise ValueError("pass either layers or stage, not both")
        layers = [s.layer for s in all_sites if s.stage == stage]
        if not layers:
            raise ValueError(f"stage {stage} out of range (stages 0..{all_sites[-1].stage})")
    sites, rec = _run_recorded(model, images, layers, "swin")

    per_layer: list[dict] = []
    probs = []
    for s in sites:
        b, h, w, _ = rec.block_input_shapes[s.layer]  # block input (B, H, W, C)
        wh, ww = s.block.window_size
        sy, sx = s.block.shift_size
        hp, wp = -(-h // wh) * wh, -(-w // ww) * ww  # padded map
        p = rec.probs[s.layer][0].float().cpu().numpy()  # (B * windows, heads, wh*ww, wh*ww)
        n_win = (hp // wh) * (wp // ww)
        if p.shape[0] != b * n_win or p.shape[-1] != wh * ww:
            raise RuntimeError(
                f"block {s.layer}: attention shape {p.shape} does not match {n_win} windows of {wh}x{ww}"
            )
        probs.append(rearrange(p, "(b w) h q k -> b w h q k", b=b))
        per_layer.append(
            dict(stage=s.stage, shifted=bool(sy or sx), shift_y=sy, shift_x=sx, window_h=wh, window_w=ww,
                 map_h=h, map_w=w, num_windows=n_win, num_heads=p.shape[1], padded=(hp, wp))
        )
    attn = _pad_stack(probs, axis=1)  # (B, L, windows, heads, N, N)
    _, n_layers, n_win, n_heads, n_tok, _ = attn.shape

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

    per_layer_coords = {
        k: ("layer", [info[k] for info in per_layer])
        for k in ("stage", "shifted", "shift_y", "shift_x", "window_h", "window_w", "map_h", "map_w",
                  "num_windows", "num_heads")
    }
    ds = xr.Dataset(
        {"attention": (("sample", "layer", "window", "head", "query", "key"), attn)},
        coords={
            "sample": np.arange(attn.shape[0]),
            "layer": [s.layer for s in sites],
            "window": np.arange(n_win),
            "head": np.arange(n_heads),
            "query": np.arange(n_tok),
            "key": np.arange(n_tok),
            **per_layer_coords,
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
        },
    )
    ds["attention"].attrs.update(units="probability", long_name="window attention probability")
    config = config_json(layers=None if stage is not None else _layer_config(layers), stage=stage)
    return ds.assign_attrs(analysis="window_attention", config=config)
