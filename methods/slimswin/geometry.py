"""Window geometry of a timm Swin Transformer: layers, windows, shifts and window positions.

SlimSwin (Eryilmaz & Akturk, "SlimSwin: Gradient-Based Window-Level Head Pruning for Efficient
Vision Transformers") scores and prunes *window-head pairs* (§IV-C: a gate of shape ``W x H`` per
attention layer). Everything in this package indexes a pair as ``(layer, window, head)``:

* ``layer``: 0-based index of a ``SwinTransformerBlock`` over all stages, in forward order
  (``model.layers[s].blocks[b]``), as the ``layer`` dim of the workbench's DESIGN.md.
* ``window``: index in the order of timm's ``window_partition`` *for that block*, i.e. on the
  cyclically shifted (``torch.roll(x, -shift)``) and bottom/right padded feature map for shifted
  blocks (§III-A): ``window = window_row * num_windows_x + window_col``. In a batch, timm stacks
  windows batch-outermost: row ``b * num_windows + window`` of the attention input.
* ``head``: attention head.

This module holds the pure geometry (no gates): a frozen :class:`SwinConfig` that describes a Swin
without building it (for MAC counting of Swin-T/B at 224 in milliseconds), the per-layer
:class:`SwinLayerGeometry`, and the maps from window index to image position
(:func:`window_positions`, :func:`token_window_assignment`) used to draw the paper's window-level
figures on the unshifted token grid.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
from timm.models.swin_transformer import SwinTransformer, SwinTransformerBlock
from torch import nn

__all__ = [
    "SwinConfig",
    "SWIN_TINY",
    "SWIN_BASE",
    "SWIN_DEMO",
    "SwinLayerGeometry",
    "WindowPosition",
    "check_swin",
    "swin_blocks",
    "swin_layers",
    "window_positions",
    "window_centers",
    "token_window_assignment",
]


@dataclass(frozen=True)
class SwinConfig:
    """Architecture of a (timm, v1) Swin Transformer, enough to derive its window geometry and MACs.

    Mirrors the ``timm.models.swin_transformer.SwinTransformer`` constructor arguments (square
    images and windows only) so that MACs of e.g. Swin-B at 224 can be computed without
    instantiating 88 M parameters.
    """

    img_size: int = 224  # input image side in pixels
    patch_size: int = 4  # patch-embedding stride (pixels per token side)
    in_chans: int = 3  # input image channels
    embed_dim: int = 96  # channels of stage 0; stage s has embed_dim * 2**s
    depths: tuple[int, ...] = (2, 2, 6, 2)  # blocks per stage
    num_heads: tuple[int, ...] = (3, 6, 12, 24)  # attention heads per stage
    window_size: int | tuple[int, ...] = 7  # window side, one for all stages or one per stage
    mlp_ratio: float = 4.0  # MLP hidden width / block width
    num_classes: int = 1000  # classifier outputs
    head_dim: int | None = None  # channels per head; None -> dim // num_heads (timm default)

    def __post_init__(self) -> None:
        if len(self.depths) != len(self.num_heads):
            raise ValueError(f"depths {self.depths} and num_heads {self.num_heads} must have one entry per stage")
        if isinstance(self.window_size, tuple) and len(self.window_size) != len(self.depths):
            raise ValueError(f"window_size {self.window_size} must be an int or have one entry per stage")
        if self.img_size < self.patch_size:
            raise ValueError(f"img_size {self.img_size} is smaller than patch_size {self.patch_size}")

    def stage_window(self, stage: int) -> int:
        """Requested (unclamped) window side of ``stage``."""
        return self.window_size[stage] if isinstance(self.window_size, tuple) else self.window_size

    def replace(self, **changes) -> SwinConfig:
        """Copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_model(cls, model: nn.Module) -> SwinConfig:
        """Read the configuration of a timm ``SwinTransformer`` (gated or pruned ones included).

        Raises:
            ValueError: ``model`` is not a timm Swin Transformer, or has non-square images/windows.
        """
        check_swin(model)
        img_h, img_w = model.patch_embed.img_size
        patch_h, patch_w = model.patch_embed.patch_size
        if img_h != img_w or patch_h != patch_w:
            raise ValueError(f"SwinConfig supports square images and patches, got img {(img_h, img_w)}, patch {(patch_h, patch_w)}")
        if any(getattr(b, "always_partition", False) for stage in model.layers for b in stage.blocks):
            raise ValueError("SwinConfig does not model always_partition=True; read geometry from the model instead")
        # requested window per stage (timm >= 1.0.20 keeps it; older: the block's, equal unless clamped)
        ref = getattr(model, "_ref_window_sizes", None) or [stage.blocks[0].window_size for stage in model.layers]
        windows = []
        for win_h, win_w in ref:
            if win_h != win_w:
                raise ValueError(f"SwinConfig supports square windows, got {(win_h, win_w)}")
            windows.append(win_h)
        first = [stage.blocks[0] for stage in model.layers]
        return cls(
            img_size=img_h,
            patch_size=patch_h,
            in_chans=model.in_chans,
            embed_dim=first[0].dim,
            depths=tuple(len(stage.blocks) for stage in model.layers),
            num_heads=tuple(block.attn.num_heads for block in first),
            window_size=windows[0] if len(set(windows)) == 1 else tuple(windows),
            mlp_ratio=first[0].mlp_ratio,
            num_classes=model.num_classes,
            head_dim=None if all(_head_dim(b.attn) == b.dim // b.attn.num_heads for b in first) else _head_dim(first[0].attn),
        )


#: ``swin_tiny_patch4_window7_224`` (Swin-T, the paper's small model).
SWIN_TINY = SwinConfig()
#: ``swin_base_patch4_window7_224`` (Swin-B, the paper's large model).
SWIN_BASE = SwinConfig(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))
#: The workbench's demo Swin (``methods.teachers.swin_demo``): digits padded to 32x32x1, patch 2 -> 16x16
#: tokens, windows of 4x4 tokens: 16 windows in stage 0, 4 in stage 1 (shifted by 2 in odd blocks), one in
#: the last stage; 144 prunable pairs.
SWIN_DEMO = SwinConfig(img_size=32, patch_size=2, in_chans=1, embed_dim=24, depths=(2, 2, 2), num_heads=(3, 6, 12),
                       window_size=4, mlp_ratio=2.0, num_classes=10)


@dataclass(frozen=True)
class SwinLayerGeometry:
    """Window geometry of one Swin attention layer (one ``SwinTransformerBlock``)."""

    layer: int  # 0-based block index over all stages (forward order)
    stage: int  # stage index (model.layers[stage])
    block: int  # block index within the stage
    resolution: tuple[int, int]  # token grid (H, W) the block sees, before padding
    window_size: tuple[int, int]  # (wh, ww) after timm's clamping to the resolution
    shift_size: tuple[int, int]  # cyclic shift (sy, sx); (0, 0) for W-MSA blocks
    dim: int  # block width C
    num_heads: int  # attention heads H
    head_dim: int  # channels per head d
    mlp_hidden: int  # MLP hidden width

    @property
    def shifted(self) -> bool:
        """Whether the block uses shifted windows (SW-MSA)."""
        return any(self.shift_size)

    @property
    def padded_resolution(self) -> tuple[int, int]:
        """Token grid after timm pads bottom/right up to a multiple of the window."""
        (h, w), (wh, ww) = self.resolution, self.window_size
        return math.ceil(h / wh) * wh, math.ceil(w / ww) * ww

    @property
    def windows_hw(self) -> tuple[int, int]:
        """Number of windows along (y, x)."""
        (hp, wp), (wh, ww) = self.padded_resolution, self.window_size
        return hp // wh, wp // ww

    @property
    def num_windows(self) -> int:
        """Windows per image (W in the paper)."""
        ny, nx = self.windows_hw
        return ny * nx

    @property
    def window_area(self) -> int:
        """Tokens per window (N-hat in the paper)."""
        return self.window_size[0] * self.window_size[1]

    @property
    def num_pairs(self) -> int:
        """Window-head pairs of the layer."""
        return self.num_windows * self.num_heads


class WindowPosition(NamedTuple):
    """Where a window sits in the *unshifted* token grid of its stage.

    ``window_y, window_x`` is the token that is the window's top-left corner after undoing the
    cyclic shift; for a shifted layer the window then extends ``window_size`` tokens down/right and
    wraps around the grid (timm's ``torch.roll``). Windows made only partly of padding still start
    inside the grid.
    """

    window_y: int  # row of the window's top-left token in the unshifted grid
    window_x: int  # column of the window's top-left token in the unshifted grid
    shifted: bool  # whether the layer uses shifted windows (then the window may wrap around)


def check_swin(model: nn.Module) -> SwinTransformer:
    """Return ``model`` if it is a timm (v1) ``SwinTransformer``; raise a clear error otherwise.

    Raises:
        ValueError: ``model`` is not a ``timm.models.swin_transformer.SwinTransformer`` (e.g. a ViT,
            a ResNet or a SwinTransformerV2, whose cosine attention this package does not gate).
    """
    if not isinstance(model, SwinTransformer):
        raise ValueError(
            f"SlimSwin needs a timm SwinTransformer (timm.models.swin_transformer, e.g. "
            f"'swin_tiny_patch4_window7_224'), got {type(model).__module__}.{type(model).__name__}"
        )
    return model


def swin_blocks(model: nn.Module) -> list[SwinTransformerBlock]:
    """All ``SwinTransformerBlock`` of a timm Swin in forward order (index = ``layer``)."""
    check_swin(model)
    return [block for stage in model.layers for block in stage.blocks]


def _head_dim(attn: nn.Module) -> int:
    # timm's WindowAttention keeps no head_dim; gated / pruned attention modules do
    head_dim = getattr(attn, "head_dim", None)
    return head_dim if head_dim is not None else attn.qkv.out_features // (3 * attn.num_heads)


def _layers_from_model(model: nn.Module) -> list[SwinLayerGeometry]:
    out = []
    for stage_idx, stage in enumerate(model.layers):
        for block_idx, block in enumerate(stage.blocks):
            attn = block.attn
            out.append(SwinLayerGeometry(
                layer=len(out), stage=stage_idx, block=block_idx,
                resolution=tuple(block.input_resolution), window_size=tuple(block.window_size),
                shift_size=tuple(block.shift_size), dim=block.dim, num_heads=attn.num_heads,
                head_dim=_head_dim(attn), mlp_hidden=block.mlp.fc1.out_features,
            ))
    return out


def _layers_from_config(cfg: SwinConfig) -> list[SwinLayerGeometry]:
    # replicates SwinTransformer.__init__ / SwinTransformerBlock._calc_window_shift (always_partition=False)
    grid = cfg.img_size // cfg.patch_size
    out = []
    res = grid
    for stage, (depth, heads) in enumerate(zip(cfg.depths, cfg.num_heads)):
        if stage > 0:
            res = (res + 1) // 2  # PatchMerging pads odd sizes
        dim = cfg.embed_dim * 2 ** stage
        target = cfg.stage_window(stage)
        window = min(res, target)
        head_dim = cfg.head_dim or dim // heads
        for block in range(depth):
            shift = 0 if (block % 2 == 0 or res <= window) else target // 2
            out.append(SwinLayerGeometry(
                layer=len(out), stage=stage, block=block, resolution=(res, res), window_size=(window, window),
                shift_size=(shift, shift), dim=dim, num_heads=heads, head_dim=head_dim,
                mlp_hidden=int(dim * cfg.mlp_ratio),
            ))
    return out


def swin_layers(model_or_config: nn.Module | SwinConfig) -> list[SwinLayerGeometry]:
    """Geometry of every attention layer, read from a built model or derived from a config.

    Args:
        model_or_config: a timm ``SwinTransformer`` (plain, gated or pruned) or a :class:`SwinConfig`.

    Returns:
        One :class:`SwinLayerGeometry` per ``SwinTransformerBlock``, in forward order.

    Raises:
        ValueError: neither a timm Swin Transformer nor a ``SwinConfig``.
    """
    if isinstance(model_or_config, SwinConfig):
        return _layers_from_config(model_or_config)
    return _layers_from_model(check_swin(model_or_config))


def window_positions(model_or_config: nn.Module | SwinConfig) -> list[list[WindowPosition]]:
    """Top-left token of every window in the unshifted grid of its stage, per layer.

    Window ``w`` of a layer is row ``w // nx``, column ``w % nx`` of timm's ``window_partition`` of
    the rolled map. Rolling by ``-shift`` puts unrolled token ``y`` at rolled row ``(y - shift) % H``,
    so the rolled row ``r * wh`` holds unrolled token ``(r * wh + shift) % H``.

    Returns:
        ``positions[layer][window] = WindowPosition(window_y, window_x, shifted)``.
    """
    out = []
    for geo in swin_layers(model_or_config):
        (h, w), (wh, ww), (sy, sx) = geo.resolution, geo.window_size, geo.shift_size
        ny, nx = geo.windows_hw
        out.append([
            WindowPosition((row * wh + sy) % h, (col * ww + sx) % w, geo.shifted)
            for row in range(ny) for col in range(nx)
        ])
    return out


def window_centers(model_or_config: nn.Module | SwinConfig) -> list[torch.Tensor]:
    """Centre of every window in the unshifted token grid, per layer, for placing markers on images.

    The centre is taken in the rolled map (``top-left + (window - 1) / 2``) and unrolled modulo the
    grid, so a wrapped window of a shifted layer gets the centre of its *rolled* extent (it may fall
    near a border; its tokens are on both sides). Padding is ignored.

    Returns:
        ``centers[layer]``: float tensor ``(num_windows, 2)`` of ``(y, x)`` token coordinates.
    """
    out = []
    for geo in swin_layers(model_or_config):
        (h, w), (wh, ww), (sy, sx) = geo.resolution, geo.window_size, geo.shift_size
        ny, nx = geo.windows_hw
        rows = torch.arange(ny, dtype=torch.float64).repeat_interleave(nx)  # (ny*nx,) window row
        cols = torch.arange(nx, dtype=torch.float64).repeat(ny)  # (ny*nx,) window column
        cy = torch.remainder(rows * wh + (wh - 1) / 2 + sy, h)
        cx = torch.remainder(cols * ww + (ww - 1) / 2 + sx, w)
        out.append(torch.stack([cy, cx], dim=-1))  # (num_windows, 2)
    return out


def token_window_assignment(model_or_config: nn.Module | SwinConfig) -> list[torch.Tensor]:
    """For each layer, which window every token of the unshifted ``(H, W)`` grid is attended in.

    Token ``(y, x)`` sits at ``((y - sy) % H, (x - sx) % W)`` after timm's ``torch.roll(x, -shift)``;
    padding is appended after the roll, so the window is
    ``((y - sy) % H // wh) * nx + ((x - sx) % W // ww)``. This is the map to paint window-level
    saliencies or masks back onto an image (equal to what timm's roll + ``window_partition`` does;
    see ``tests/test_slimswin_method.py``).

    Returns:
        ``assignment[layer]``: long tensor ``(H, W)`` of window indices.
    """
    out = []
    for geo in swin_layers(model_or_config):
        (h, w), (wh, ww), (sy, sx) = geo.resolution, geo.window_size, geo.shift_size
        _, nx = geo.windows_hw
        ys = torch.remainder(torch.arange(h) - sy, h) // wh  # (H,) window row of each token row
        xs = torch.remainder(torch.arange(w) - sx, w) // ww  # (W,) window column of each token column
        out.append(ys[:, None] * nx + xs[None, :])  # (H, W)
    return out


def validate_layer_list(values: Sequence, layers: list[SwinLayerGeometry], what: str) -> None:
    """Check that ``values`` holds one ``(num_windows, num_heads)`` tensor per layer.

    Raises:
        ValueError: wrong number of entries or a wrong shape, naming expected vs got.
    """
    if len(values) != len(layers):
        raise ValueError(f"expected {len(layers)} {what} (one per attention layer), got {len(values)}")
    for geo, value in zip(layers, values):
        expected = (geo.num_windows, geo.num_heads)
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else None
        if got != expected:
            raise ValueError(
                f"{what} of layer {geo.layer} (stage {geo.stage}, block {geo.block}): expected shape "
                f"(num_windows, num_heads) = {expected}, got {got if got is not None else type(value).__name__}"
            )
