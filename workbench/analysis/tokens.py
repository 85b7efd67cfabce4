"""Describe the token sequence of a vision transformer as xarray coordinates.

A ViT sequence is ``[prefix tokens..., patch tokens...]``: prefix tokens (class, distillation,
register tokens) first, then the patch grid flattened row-major (``index = y * gw + x``). The
helpers here turn that layout into non-dimension coordinates for the ``query`` and ``key`` dims of
a token-to-token map:

- ``query_kind`` / ``key_kind``: ``"cls"``, ``"dist"``, ``"reg"`` or ``"patch"``;
- ``query_y``, ``query_x`` / ``key_y``, ``key_x``: patch-grid row / column, ``-1`` for prefix tokens.

xarray cannot attach one coordinate name to two dims, hence the ``query_``/``key_`` prefixes
instead of a single ``token_kind``.

For Swin window attention, :func:`window_coords` gives the matching coordinates of tokens inside a
window (``query_wy``/``query_wx``) and of windows inside the (shifted, padded) feature map.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Sequence

import numpy as np

if TYPE_CHECKING:  # torch is only needed for the model-inspection helpers
    import torch.nn as nn

TokenKind = Literal["cls", "dist", "reg", "patch"]
TokenDim = Literal["query", "key"]

#: Prefix-token kinds the helpers know; anything else is rejected.
PREFIX_KINDS: tuple[str, ...] = ("cls", "dist", "reg")


@dataclass(frozen=True)
class TokenLayout:
    """The token sequence of one ViT forward pass.

    Attributes:
        prefix_kinds: kind of each prefix token, in sequence order, e.g. ``("cls", "dist")``.
        grid: patch grid ``(gh, gw)``.
    """

    prefix_kinds: tuple[str, ...]
    grid: tuple[int, int]

    @property
    def num_prefix(self) -> int:
        return len(self.prefix_kinds)

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def num_tokens(self) -> int:
        return self.num_prefix + self.num_patches

    def coords(self, dim: TokenDim) -> dict[str, tuple[str, np.ndarray]]:
        """Coordinates for ``dim``; see :func:`token_coords`."""
        return token_coords(self.prefix_kinds, self.grid, dim)


def token_arrays(prefix_kinds: Sequence[str], grid: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-token kind, grid row and grid column of a ``[prefix..., patches...]`` sequence.

    Args:
        prefix_kinds: kind of each prefix token in order (``[]``, ``["cls"]``, ``["cls", "dist"]``,
            ``["cls", "reg", "reg"]``, ...).
        grid: patch grid ``(gh, gw)``; patches are flattened row-major.

    Returns:
        ``(kind, y, x)``, each of length ``len(prefix_kinds) + gh * gw``; ``y = x = -1`` for prefix
        tokens.

    Raises:
        ValueError: an unknown prefix kind or a non-positive grid.
    """
    bad = [k for k in prefix_kinds if k not in PREFIX_KINDS]
    if bad:
        raise ValueError(f"unknown prefix token kinds {bad}; expected some of {PREFIX_KINDS}")
    gh, gw = (int(g) for g in grid)
    if gh <= 0 or gw <= 0:
        raise ValueError(f"patch grid must be positive, got {grid}")
    n_pre = len(prefix_kinds)
    kind = np.array(list(prefix_kinds) + ["patch"] * (gh * gw), dtype="<U5")
    # patch index p = y * gw + x  (row-major flatten of the (gh, gw) grid)
    yy, xx = np.divmod(np.arange(gh * gw, dtype=np.int64), gw)
    y = np.concatenate([np.full(n_pre, -1, np.int64), yy])
    x = np.concatenate([np.full(n_pre, -1, np.int64), xx])
    return kind, y, x


def token_coords(
    prefix_kinds: Sequence[str], grid: tuple[int, int], dim: TokenDim
) -> dict[str, tuple[str, np.ndarray]]:
    """Coordinates of a token dim, ready for ``Dataset.assign_coords``.

    Args:
        prefix_kinds: kind of each prefix token in order.
        grid: patch grid ``(gh, gw)``.
        dim: ``"query"`` or ``"key"``.

    Returns:
        ``{dim: (dim, index), f"{dim}_kind": (dim, kind), f"{dim}_y": (dim, y), f"{dim}_x": (dim, x)}``.
    """
    if dim not in ("query", "key"):
        raise ValueError(f"dim must be 'query' or 'key', got {dim!r}")
    kind, y, x = token_arrays(prefix_kinds, grid)
    return {
        dim: (dim, np.arange(len(kind), dtype=np.int64)),
        f"{dim}_kind": (dim, kind),
        f"{dim}_y": (dim, y),
        f"{dim}_x": (dim, x),
    }


def query_key_coords(prefix_kinds: Sequence[str], grid: tuple[int, int]) -> dict[str, tuple[str, np.ndarray]]:
    """Coordinates of both the ``query`` and the ``key`` dim of a token-to-token map."""
    return {**token_coords(prefix_kinds, grid, "query"), **token_coords(prefix_kinds, grid, "key")}


def vit_prefix_kinds(model: "nn.Module") -> tuple[str, ...]:
    """Kinds of a timm ViT's prefix tokens, in sequence order.

    timm's ``VisionTransformer._pos_embed`` concatenates ``[cls, reg...]`` and DeiT's distilled
    variant ``[cls, dist]`` in front of the patches.

    Args:
        model: a timm ``VisionTransformer`` (or subclass such as ``VisionTransformerDistilled``).

    Returns:
        e.g. ``()``, ``("cls",)``, ``("cls", "dist")``, ``("cls", "reg", "reg", "reg", "reg")``.

    Raises:
        ValueError: the found tokens do not add up to ``model.num_prefix_tokens``.
    """
    kinds: list[str] = []
    if getattr(model, "cls_token", None) is not None:
        kinds.append("cls")
    if getattr(model, "dist_token", None) is not None:
        kinds.append("dist")
    reg = getattr(model, "reg_token", None)
    if reg is not None:
        kinds += ["reg"] * int(reg.shape[1])
    expected = int(getattr(model, "num_prefix_tokens", len(kinds)))
    if len(kinds) != expected:
        raise ValueError(
            f"{type(model).__name__}: found prefix tokens {kinds} but num_prefix_tokens={expected}; "
            "cannot tell which token is which"
        )
    return tuple(kinds)


def vit_patch_grid(model: "nn.Module", image_size: tuple[int, int]) -> tuple[int, int]:
    """Patch grid ``(gh, gw)`` a timm ViT produces for images of ``image_size = (H, W)``.

    Uses ``model.patch_embed.dynamic_feat_size`` when present (dynamic image size / padding),
    else ``image_size // patch_size``.
    """
    pe = getattr(model, "patch_embed", None)
    if pe is None:
        raise ValueError(f"{type(model).__name__} has no patch_embed; expected a timm VisionTransformer")
    h, w = (int(s) for s in image_size)
    if hasattr(pe, "dynamic_feat_size"):
        gh, gw = pe.dynamic_feat_size((h, w))
    else:
        ph, pw = pe.patch_size
        gh, gw = h // ph, w // pw
    return int(gh), int(gw)


def vit_token_layout(model: "nn.Module", image_size: tuple[int, int]) -> TokenLayout:
    """Prefix tokens and patch grid of a timm ViT for images of ``image_size = (H, W)``."""
    return TokenLayout(vit_prefix_kinds(model), vit_patch_grid(model, image_size))


def class_token_index(model: "nn.Module", image_size: tuple[int, int]) -> int:
    """Position of ``model``'s class token in its token sequence (the CLS query row of its attention maps).

    Raises:
        ValueError: ``model`` is not a ViT-like model (:func:`vit_token_layout` cannot read it), or it has no class
            token; the message names the model's class and what is missing.
    """
    try:
        kinds = vit_token_layout(model, image_size).prefix_kinds
    except (ValueError, AttributeError) as err:  # AttributeError: a patch_embed without timm's patch_size
        raise ValueError(f"{type(model).__name__} is not a ViT-like model with a class token ({err})") from None
    if "cls" not in kinds:
        raise ValueError(f"{type(model).__name__} has no class token (prefix tokens: {list(kinds) or 'none'})")
    return kinds.index("cls")


def window_coords(window: tuple[int, int], prefix: TokenDim) -> dict[str, np.ndarray]:
    """Position of each token inside a ``(wh, ww)`` window, flattened row-major.

    Returns:
        ``{f"{prefix}_wy": row, f"{prefix}_wx": col}``, each of length ``wh * ww``.
    """
    wh, ww = window
    # token t inside the window: t = wy * ww + wx
    wy, wx = np.divmod(np.arange(wh * ww, dtype=np.int64), ww)
    return {f"{prefix}_wy": wy, f"{prefix}_wx": wx}


def window_grid(padded_map: tuple[int, int], window: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of each window in timm's ``window_partition`` order.

    ``window_partition`` views ``(B, Hp, Wp, C)`` as ``(B, Hp/wh, wh, Wp/ww, ww, C)`` and flattens
    ``(window row, window col)`` row-major, so window ``w = window_y * (Wp / ww) + window_x``.
    """
    (hp, wp), (wh, ww) = padded_map, window
    return np.divmod(np.arange((hp // wh) * (wp // ww), dtype=np.int64), wp // ww)


def window_token_map_yx(
    feature_map: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Feature-map position of every token of every window of a (shifted) Swin block.

    timm rolls the map by ``-shift`` (so shifted position ``i`` holds original ``(i + shift) mod H``),
    then pads bottom/right to a multiple of the window and partitions.

    Args:
        feature_map: unpadded stage feature map ``(H, W)``.
        window: window size ``(wh, ww)``.
        shift: cyclic shift ``(sy, sx)``; ``(0, 0)`` for regular blocks.

    Returns:
        ``(y, x)`` arrays of shape ``(num_windows, wh * ww)``: the original (unshifted) map row and
        column of each token; ``-1`` for padding tokens.
    """
    (h, w), (wh, ww), (sy, sx) = feature_map, window, shift
    hp, wp = -(-h // wh) * wh, -(-w // ww) * ww
    win_y, win_x = window_grid((hp, wp), window)
    t_y, t_x = np.divmod(np.arange(wh * ww, dtype=np.int64), ww)
    ys = win_y[:, None] * wh + t_y[None, :]  # (window, token) position in the shifted, padded map
    xs = win_x[:, None] * ww + t_x[None, :]
    pad = (ys >= h) | (xs >= w)
    y = np.where(pad, -1, (ys + sy) % h)
    x = np.where(pad, -1, (xs + sx) % w)
    return y, x
