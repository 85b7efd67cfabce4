"""What AttentionLite's analyses read, as plain tensors and numbers (the workbench makes Datasets of them).

- :func:`layer_densities` — kept fraction of every prunable layer (Alg. 1's per-layer budget);
- :func:`count_params` — total / kept / non-zero / prunable parameters;
- :func:`stage_at_maps` — the normalised spatial attention-transfer maps ``ψ`` per stage, as images;
- :func:`query_attention` — a student's local attention for one query pixel, placed on the layer's grid;
- :func:`count_macs_sparse` — MACs (``methods.flops.count_macs``), dense and with pruned weights skipped.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
import torch.nn as nn

from methods.flops import count_macs
from methods.hooks import run_with_cache

from .attention import ColumnConv2d, ColumnLinear
from .losses import at_map, stage_names
from .resnet import attention_layers
from .sparse import prunable_layers

__all__ = ["layer_densities", "count_params", "stage_at_maps", "query_attention", "count_macs_sparse"]


def layer_densities(model: nn.Module, exclude: Sequence[str] = ()) -> dict[str, float]:
    """Layer name -> fraction of non-zero weights (the realised per-layer density of a masked model)."""
    return {n: m.weight.detach().ne(0).float().mean().item() for n, m in prunable_layers(model, tuple(exclude)).items()}


def count_params(model: nn.Module, exclude: Sequence[str] = (),
                 masks: Mapping[str, torch.Tensor] | None = None) -> dict[str, int]:
    """Parameter counts of a (masked) student.

    Returns ``total``; ``nonzero`` (all non-zero parameters: a diagnostic of the weights, not a size —
    BatchNorm scales that start at zero, timm's ``zero_init_last``, and any weight that happens to be
    0 read as pruned); ``prunable`` and ``prunable_nonzero`` (the conv / linear weights sparse momentum
    masks, and the column-pruned layers of a shrunk model); and ``kept``, the size of the pruned model
    the paper's "parameter reduction" divides by (AttentionLite Tables 1-2): every parameter the masks
    do not cover counts as kept (norms, biases, relative embeddings stay dense whatever their value),
    and a masked weight counts as kept iff its mask keeps it. Without ``masks`` the prunable weights'
    non-zeros stand in for their masks. Buffers (kept-column indices) are not parameters.

    Args:
        model: the student (masked train form or shrunk deploy form).
        exclude: ``fnmatch`` patterns of layers sparse momentum leaves dense.
        masks: layer name -> weight-shaped bool mask (``SparseMomentum.weight_masks()``).
    """
    total = sum(p.numel() for p in model.parameters())
    nonzero = sum(int(p.detach().ne(0).sum()) for p in model.parameters())
    layers = prunable_layers(model, tuple(exclude))
    layers.update({n: m for n, m in model.named_modules() if isinstance(m, (ColumnConv2d, ColumnLinear))})
    prunable = sum(m.weight.numel() for m in layers.values())
    prunable_nz = sum(int(m.weight.detach().ne(0).sum()) for m in layers.values())
    if masks is None:
        kept = total - prunable + prunable_nz
    else:
        modules = dict(model.named_modules())
        for name, mask in masks.items():
            if name not in modules or tuple(modules[name].weight.shape) != tuple(mask.shape):
                raise ValueError(f"mask {name!r} ({tuple(mask.shape)}) matches no weight of the model: "
                                 "pass the masks of this model (SparseMomentum(model, ...).weight_masks())")
        kept = total - sum(m.numel() for m in masks.values()) + sum(int(m.sum()) for m in masks.values())
    return {"total": total, "nonzero": nonzero, "prunable": prunable, "prunable_nonzero": prunable_nz, "kept": kept}


@torch.no_grad()
def stage_at_maps(model: nn.Module, images: torch.Tensor, p: float = 2.0,
                  stages: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
    """Stage name -> ``(B, H_s, W_s)`` attention-transfer map ``ψ`` (unit L2 norm per image; :func:`.losses.at_map`).

    Works for the CNN teacher and the SA-ResNet students alike (both have ``stages.{s}.hook_out``).
    """
    names = list(stages) if stages is not None else stage_names(model)
    was = model.training
    model.eval()
    try:
        _, cache = run_with_cache(model, images, names=names)
    finally:
        model.train(was)
    return {n: at_map(cache[n], p).view(images.shape[0], *cache[n].shape[-2:]) for n in names}


@torch.no_grad()
def query_attention(model: nn.Module, images: torch.Tensor, query: tuple[float, float],
                    layers: Sequence[str] | None = None) -> dict[str, dict]:
    """Each attention layer's weights for one query pixel, placed on that layer's ``H × W`` grid.

    Args:
        query: ``(y, x)`` in relative image coordinates (0 … 1, e.g. (0.5, 0.5) = centre); on a layer
            of ``H × W`` the query is pixel ``(min(⌊y·H⌋, H−1), min(⌊x·W⌋, W−1))``.
        layers: attention layer names (default all, e.g. ``layer2.0.attn``).

    Returns:
        layer name -> ``{"map": (B, heads, H, W) weights (0 outside the k × k window; sums to 1),
        "query": (i, j), "kernel_size": k}``.
    """
    attn = attention_layers(model)
    names = list(layers) if layers is not None else list(attn)
    bad = [n for n in names if n not in attn]
    if bad:
        raise KeyError(f"no attention layer {bad[0]!r}; the model has {', '.join(attn) or 'none'}")
    was = model.training
    model.eval()
    try:
        _, cache = run_with_cache(model, images, names=[f"{n}.hook_pattern" for n in names])
    finally:
        model.train(was)
    out = {}
    for n in names:
        pat = cache[f"{n}.hook_pattern"]  # (B, h, H, W, k, k)
        B, h, H, W, k, _ = pat.shape
        r = k // 2
        i, j = min(int(query[0] * H), H - 1), min(int(query[1] * W), W - 1)
        window = pat[:, :, i, j]  # (B, h, k, k): key (i + u - r, j + w - r)
        full = pat.new_zeros(B, h, H + 2 * r, W + 2 * r)
        full[:, :, i:i + k, j:j + k] = window
        out[n] = {"map": full[:, :, r:r + H, r:r + W], "query": (i, j), "kernel_size": k}
    return out


def count_macs_sparse(model: nn.Module, images: torch.Tensor, exclude: Sequence[str] = ()) -> dict[str, float]:
    """MACs per image of ``model(images)``: ``dense`` (every weight), ``sparse`` (each prunable layer's MACs
    times its non-zero fraction: what an irregular-sparse kernel would do), ``attention`` (the local
    attention's q·k and a·v products, ``attentionlite::neighbour_*``) and ``position`` (q·r).

    A column-shrunk model has no zeros left, so its ``dense`` is already what it computes.
    """
    count = count_macs(model, images)
    B = images.shape[0]
    sparse = count.total
    for name, m in prunable_layers(model, tuple(exclude)).items():
        macs = count.within(name)
        sparse -= macs * (1.0 - m.weight.detach().ne(0).float().mean().item())
    attention = sum(v for k, v in count.by_op.items() if "neighbour" in k)
    position = sum(count.within(n) - count.within(f"{n}.qkv") for n in attention_layers(model)) - attention
    return {"dense": count.total / B, "sparse": sparse / B, "attention": attention / B, "position": position / B}
