"""MAC counts of Swin attention under a window-head mask (SlimSwin Table I) and of a whole Swin (Fig. 1).

Conventions (all counts are per image, in multiply-accumulates unless ``unit="flops"``, which is
exactly 2 x MACs):

* Attention of one layer, per active (window, head) pair with ``N`` tokens per window, block width
  ``C`` and head width ``d`` (§III-D, Eq. 4):
  ``qkv = N*C*3d``, ``qk = N*N*d`` (``Q K^T``), ``av = N*N*d`` (``softmax(.) V``), ``proj = N*d*C``
  (the output projection only multiplies the active heads' input columns, as
  :mod:`.pruned` does). Biases, the ``1/sqrt(d)`` scale, relative position bias, shift mask and
  softmax are not counted. Windows containing padding are counted in full (they are computed).
* This reproduces the paper's unpruned Swin-B attention count (5.2374e9 vs 5.24e9, Table I: QKV
  projection, self-attention and output projection of all 24 layers). The paper's Swin-T entry,
  2.61e9, is **not reproduced**: Swin-T (C = 96, heads 3/6/12/24) gives 1.527e9 under this
  convention, and no other convention we tried gives 2.61e9 (FLOPs: 3.055e9; FLOPs without the
  last stage: 2.578e9; without the projection: 1.181e9 MACs / 2.361e9 FLOPs; Eq. 4's ``H * N^2 * C``
  for the two matmuls: 2.449e9); a Swin with Swin-T's depths at Swin-B's width (C = 128, heads
  4/8/16/32) gives 2.653e9. (An earlier note here matched 2.61e9 "exactly" with C = 128 but Swin-T's
  heads 3/6/12/24, i.e. heads of width 42 covering 126 of the 128 channels: no Swin has that
  layout, so it explains nothing.) The paper's Swin-T *reductions* (28.0 ... 56.0 %) equal ``r x``
  a prunable (non-last-stage) share of 84.0 % of the attention MACs; C = 96 gives 84.4 %, so the
  reductions agree within 0.3 points. See ``PAPER_TABLE_I``.
* Table I's ratios are the four uniformly spaced values from 1/3 to 2/3 (:data:`PAPER_RATIOS`; the
  paper labels them 0.33, 0.44, 0.55, 0.67). Algorithm 1 prunes ``i`` pairs per iteration until the
  ratio is reached, so it reaches the first multiple of ``i`` at or above ``r x pairs``
  (:func:`.saliency.pairs_to_prune`); with ``i = 32`` that is exactly 1/3 ... 2/3 of Swin-T's 864
  prunable pairs, but 640 / 864 / 1088 / 1280 of Swin-B's 1920 (1/3, 0.45, 0.567, 2/3). The paper's
  Swin-B reductions (30.7 / 40.9 / 51.1 / 61.3 %) equal ``r x`` the prunable share (91.96 %) at the
  exact fractions (30.65 / 40.87 / 51.09 / 61.31 %), i.e. pair counts Algorithm 1 with ``i = 32``
  cannot reach at 4/9 and 5/9. Without trained weights the allocation over layers is an assumption:
  :func:`uniform_masks` spreads a pair count over the prunable layers in proportion to their pairs.
* Whole-model breakdown (:func:`swin_flops_breakdown`): patch embedding convolution, attention
  (as above), MLP (two linears), patch merging (the ``4C -> 2C`` linear), classifier head; norms
  are counted as one MAC per normalised element (the affine ``g * x + b``; statistics not counted);
  GELU, softmax, residual adds and pooling are not counted.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, Sequence

import torch
from torch import nn

from .config import Exclude
from .gates import get_masks
from .geometry import SwinConfig, swin_layers, validate_layer_list
from .prune import prunable_layers

__all__ = [
    "PaperTableRow",
    "PAPER_RATIOS",
    "PAPER_TABLE_I",
    "PAPER_ATTENTION_MACS",
    "attention_macs",
    "sum_macs",
    "swin_flops_breakdown",
    "uniform_masks",
]


class PaperTableRow(NamedTuple):
    """One cell pair of the paper's Table I ("MAC reduction under different pruning ratios")."""

    model: str  # "swin_base" or "swin_tiny"
    ratio: float | None  # global pruning ratio r (None = unpruned)
    macs: float  # attention MACs (QKV, self-attention, output projection) per image
    reduction_pct: float | None  # reduction vs unpruned, in percent (None for unpruned)


#: Table I of the paper, verbatim (Swin at 224x224).
PAPER_TABLE_I: tuple[PaperTableRow, ...] = (
    PaperTableRow("swin_base", None, 5.24e9, None),
    PaperTableRow("swin_base", 0.33, 3.63e9, 30.7),
    PaperTableRow("swin_base", 0.44, 3.10e9, 40.9),
    PaperTableRow("swin_base", 0.55, 2.56e9, 51.1),
    PaperTableRow("swin_base", 0.67, 2.03e9, 61.3),
    PaperTableRow("swin_tiny", None, 2.61e9, None),
    PaperTableRow("swin_tiny", 0.33, 1.88e9, 28.0),
    PaperTableRow("swin_tiny", 0.44, 1.63e9, 37.3),
    PaperTableRow("swin_tiny", 0.55, 1.39e9, 46.6),
    PaperTableRow("swin_tiny", 0.67, 1.15e9, 56.0),
)

#: The global ratios of Table I and Figs. 4-7: "four uniformly spaced pruning ratios between r ~ 0.33 and
#: r ~ 0.67 (inclusive)" (§VI), i.e. 1/3, 4/9, 5/9, 2/3 (Table I prints them as 0.33, 0.44, 0.55, 0.67).
PAPER_RATIOS: tuple[float, ...] = (1 / 3, 4 / 9, 5 / 9, 2 / 3)

#: Unpruned attention MACs per image reported in Table I.
PAPER_ATTENTION_MACS = {row.model: row.macs for row in PAPER_TABLE_I if row.ratio is None}

COMPONENTS = ("qkv", "qk", "av", "proj")


def attention_macs(model_or_config: nn.Module | SwinConfig,
                   masks: Sequence[torch.Tensor] | None = None) -> dict[int, dict[str, int]]:
    """Attention MACs per image of every layer under a window-head mask (convention: module docstring).

    Args:
        model_or_config: timm Swin (plain, gated or pruned) or :class:`.geometry.SwinConfig`.
        masks: one bool ``(num_windows, num_heads)`` per layer (True = computed); default: the
            model's own masks (:func:`.gates.get_masks`), or all active for a config.

    Returns:
        ``{layer: {"stage", "num_windows", "num_heads", "active_pairs", "qkv", "qk", "av", "proj",
        "total"}}`` with integer MAC counts.

    Raises:
        ValueError: not a Swin / config; masks of the wrong number or shape.
    """
    layers = swin_layers(model_or_config)
    if masks is None:
        masks = (get_masks(model_or_config) if not isinstance(model_or_config, SwinConfig)
                 else [torch.ones(g.num_windows, g.num_heads, dtype=torch.bool) for g in layers])
    validate_layer_list(masks, layers, "masks")
    out = {}
    for geo, mask in zip(layers, masks):
        pairs = int(mask.bool().sum())
        n, c, d = geo.window_area, geo.dim, geo.head_dim
        row = {"stage": geo.stage, "num_windows": geo.num_windows, "num_heads": geo.num_heads, "active_pairs": pairs,
               "qkv": pairs * n * c * 3 * d, "qk": pairs * n * n * d, "av": pairs * n * n * d,
               "proj": pairs * n * d * c}
        row["total"] = sum(row[k] for k in COMPONENTS)
        out[geo.layer] = row
    return out


def sum_macs(per_layer: dict[int, dict[str, int]], component: str = "total",
             layers: Sequence[int] | None = None) -> int:
    """Sum one component of :func:`attention_macs` over ``layers`` (default: all)."""
    keys = per_layer.keys() if layers is None else layers
    return sum(per_layer[l][component] for l in keys)


def swin_flops_breakdown(model_or_config: nn.Module | SwinConfig, img_size: int | None = None,
                         masks: Sequence[torch.Tensor] | None = None,
                         unit: Literal["macs", "flops"] = "macs") -> dict[str, int]:
    """Component-wise cost of a whole Swin per image (the paper's Fig. 1), optionally under a mask.

    Args:
        model_or_config: timm Swin or :class:`.geometry.SwinConfig` (only its architecture is read).
        img_size: input side; default the model's / config's own.
        masks: window-head masks for the attention components (default: all active; ignored if
            ``img_size`` changes the window counts -- then pass masks for that size).
        unit: ``"macs"`` or ``"flops"`` (= 2 x MACs).

    Returns:
        ``{"patch_embed", "norm", "attn_qkv", "attn_matmul" (QK^T + AV), "attn_proj", "mlp",
        "patch_merging", "head", "total"}``.
    """
    if unit not in ("macs", "flops"):
        raise ValueError(f"unit must be 'macs' or 'flops', got {unit!r}")
    cfg = model_or_config if isinstance(model_or_config, SwinConfig) else SwinConfig.from_model(model_or_config)
    if img_size is not None and img_size != cfg.img_size:
        cfg = cfg.replace(img_size=img_size)
    layers = swin_layers(cfg)
    attn = attention_macs(cfg, masks)
    grid = cfg.img_size // cfg.patch_size
    c0 = cfg.embed_dim
    out = dict.fromkeys(("patch_embed", "norm", "attn_qkv", "attn_matmul", "attn_proj", "mlp", "patch_merging",
                         "head"), 0)
    out["patch_embed"] = grid * grid * c0 * cfg.in_chans * cfg.patch_size ** 2
    out["norm"] = grid * grid * c0  # patch-embedding norm
    for geo in layers:
        h, w = geo.resolution
        tokens = h * w
        if geo.block == 0 and geo.stage > 0:
            in_dim = geo.dim // 2
            out["patch_merging"] += tokens * 4 * in_dim * geo.dim
            out["norm"] += tokens * 4 * in_dim
        out["norm"] += 2 * tokens * geo.dim  # norm1, norm2
        out["mlp"] += 2 * tokens * geo.dim * geo.mlp_hidden
        row = attn[geo.layer]
        out["attn_qkv"] += row["qkv"]
        out["attn_matmul"] += row["qk"] + row["av"]
        out["attn_proj"] += row["proj"]
    last = layers[-1]
    out["norm"] += last.resolution[0] * last.resolution[1] * last.dim  # final norm
    out["head"] = last.dim * cfg.num_classes
    out["total"] = sum(out.values())
    if unit == "flops":
        out = {k: 2 * v for k, v in out.items()}
    return out


def uniform_masks(model_or_config: nn.Module | SwinConfig, num_pruned: int,
                  exclude: Exclude = "last_stage") -> list[torch.Tensor]:
    """Masks pruning ``num_pruned`` pairs spread over the prunable layers in proportion to their pairs.

    The allocation Table I must assume for a Swin without trained weights (no saliency): layer ``l``
    with ``P_l`` of the ``P`` prunable pairs loses ``num_pruned * P_l / P`` pairs, rounded by largest
    remainder (ties to the earlier layer) so that exactly ``num_pruned`` go. Every pair of a layer
    costs the same MACs, so which windows and heads are pruned inside a layer does not matter here.

    Raises:
        ValueError: ``num_pruned`` outside ``[0, P]``.
    """
    layers = swin_layers(model_or_config)
    prunable = prunable_layers(model_or_config, exclude)
    sizes = [layers[l].num_pairs for l in prunable]
    total = sum(sizes)
    if not 0 <= num_pruned <= total:
        raise ValueError(f"num_pruned must be in [0, {total}] (the prunable pairs), got {num_pruned}")
    quota = [num_pruned * n / total for n in sizes]
    counts = [int(q) for q in quota]
    by_remainder = sorted(range(len(sizes)), key=lambda i: (-(quota[i] - counts[i]), i))
    for i in by_remainder[: num_pruned - sum(counts)]:
        counts[i] += 1
    masks = [torch.ones(g.num_windows, g.num_heads, dtype=torch.bool) for g in layers]
    for l, k in zip(prunable, counts):
        masks[l].view(-1)[:k] = False
    return masks
