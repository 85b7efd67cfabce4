"""A few attention rows beside timm's fused attention (``"attention_rows"``): O(N) per head and query.

The ``attention`` extractor reads whole probability maps, which needs timm's explicit attention
path (``fused_attn`` off, an N x N matrix per head materialised). A CLS map needs one row of it:

    P[q, :] = softmax( (q_q · scale) K^T )        (Dosovitskiy et al. 2021, Eq. 2-3; one row per query q)

This extractor hooks the output of each block's ``qkv`` projection -- the very q and k the model
uses -- and computes only the requested rows, O(N·D_h) per head and query, while the model itself
runs unchanged on its fused ``scaled_dot_product_attention`` path. The rows equal the
``attention`` extractor's rows to float rounding (tests/test_stream.py checks it).

It applies to blocks whose attention is timm's plain ``Attention`` (ViT, DeiT; any ``q_norm``/``k_norm``);
other token mixers (FAR's LSTMs, Sparsifiner's sparse attention, parallel branches) have no such
projection and are refused with a pointer to the ``attention`` extractor.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import xarray as xr

from workbench.analysis import Example, examples, register
from workbench.analysis.attention import attention_points, select_layers
from workbench.analysis.tokens import vit_token_layout
from workbench.provenance import config_json
from workbench.xrutils import layer_config

__all__ = ["supports_rows", "extract_attention_rows"]


class _Stop(Exception):
    """Raised by the last hook: the rest of the forward pass is not needed."""


def _plain_attention(module: nn.Module) -> bool:
    from timm.layers import Attention

    return type(module) is Attention


def supports_rows(model: nn.Module, layers: int | Sequence[int] | None = None) -> bool:
    """Whether every selected block of ``model`` holds timm's plain ``Attention`` (rows can be computed beside it)."""
    try:
        points = select_layers(attention_points(model, "vit"), layers)
    except ValueError:
        return False
    return all(p.branch is None and _plain_attention(model.get_submodule(p.name.removesuffix(".hook_pattern")))
               for p in points)


@register("attention_rows", example=Example(examples.vit, (2, 1, 28, 28), (0, 2)))
def extract_attention_rows(
    model: nn.Module, images: torch.Tensor, *, layers: int | Sequence[int] | None = None,
    targets: torch.Tensor | None = None, queries: Sequence[int] = (0,),
) -> xr.Dataset:
    """Attention probabilities of the query tokens ``queries`` only, computed beside the fused attention.

    Args:
        model: eval-mode timm ``VisionTransformer`` whose blocks hold timm ``Attention``.
        images: ``(B, C, H, W)`` float tensor, normalised for the model.
        layers: block indices (negative allowed); ``None`` for all blocks.
        targets: unused; part of every extractor's signature.
        queries: query token indices (0 is CLS in timm's layout).

    Returns:
        The ``attention`` extractor's Dataset restricted to ``queries``: ``attention(sample, layer, head, query, key)``
        float32 (rows sum to 1), ``cls_attention(sample, layer, head, y, x)`` when the CLS query is among them, the
        same coords, ``num_heads(layer)``; attrs ``analysis="attention_rows"``, ``config``.

    Raises:
        ValueError: training mode, a block that is not timm ``Attention``, a query out of range.
    """
    if model.training:
        raise ValueError("attention extraction needs an eval-mode model (call model.eval())")
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}")
    points = select_layers(attention_points(model, "vit"), layers)
    mods = {p.layer: model.get_submodule(p.name.removesuffix(".hook_pattern")) for p in points}
    bad = [i for i, m in mods.items() if not _plain_attention(m)] + [p.layer for p in points if p.branch is not None]
    if bad:
        raise ValueError(f"blocks {sorted(set(bad))} do not hold timm's plain Attention; use the 'attention' extractor")
    layout = vit_token_layout(model, tuple(images.shape[-2:]))
    qs = [int(q) for q in queries]
    if not qs or any(not 0 <= q < layout.num_tokens for q in qs):
        raise ValueError(f"queries {qs} out of range for {layout.num_tokens} tokens")
    rows: dict[int, torch.Tensor] = {}
    last = max(mods)
    q_index = torch.as_tensor(qs, device=images.device)

    def hook(layer: int, attn: nn.Module):
        def fn(_module, _inputs, out):  # out: qkv projection (B, N, 3·heads·D_h)
            b, n, _ = out.shape
            qkv = out.view(b, n, 3, attn.num_heads, attn.head_dim)  # (B, N, 3, heads, D_h)
            q = attn.q_norm(qkv[:, q_index, 0].transpose(1, 2))  # (B, heads, Q, D_h)
            k = attn.k_norm(qkv[:, :, 1].transpose(1, 2))  # (B, heads, N, D_h)
            rows[layer] = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, heads, Q, N)
            if layer == last:
                raise _Stop

        return fn

    handles = [m.qkv.register_forward_hook(hook(i, m)) for i, m in mods.items()]
    try:
        with torch.no_grad():
            model(images)
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    layer_ids = sorted(mods)
    heads = max(r.shape[1] for r in rows.values())
    b, n_tok = images.shape[0], rows[layer_ids[0]].shape[-1]
    attn = np.full((b, len(layer_ids), heads, len(qs), n_tok), np.nan, dtype=np.float32)  # (B, L, heads, Q, N)
    for j, i in enumerate(layer_ids):
        attn[:, j, : rows[i].shape[1]] = rows[i].float().cpu().numpy()
    qcoords = {k: (v[0], v[1][qs]) for k, v in layout.coords("query").items()}
    data = {"attention": (("sample", "layer", "head", "query", "key"), attn,
                          {"units": "probability", "long_name": "attention probability"})}
    coords = {"sample": np.arange(b), "layer": layer_ids, "head": np.arange(heads),
              "num_heads": ("layer", [rows[i].shape[1] for i in layer_ids]), **qcoords, **layout.coords("key")}
    if "cls" in layout.prefix_kinds and layout.prefix_kinds.index("cls") in qs:
        gh, gw = layout.grid
        row = attn[:, :, :, qs.index(layout.prefix_kinds.index("cls")), layout.num_prefix:]  # (B, L, heads, gh*gw)
        data["cls_attention"] = (("sample", "layer", "head", "y", "x"), row.reshape(*row.shape[:-1], gh, gw),
                                 {"units": "probability", "long_name": "CLS-to-patch attention probability"})
        coords.update(y=np.arange(gh), x=np.arange(gw))
    ds = xr.Dataset(data, coords=coords)  # one constructor (each later assign re-aligns every coordinate)
    return ds.assign_attrs(analysis="attention_rows", config=config_json(layers=layer_config(layers), queries=qs))
