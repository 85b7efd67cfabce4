"""Block outputs as token rows: the ``activations`` extractor, what a crosscoder trains on, for storing at scale.

A model's blocks are its ``*.hook_resid_post`` hook points, or its ``stages.*.hook_out`` (a CNN / SA-ResNet), as
:func:`~workbench.analysis.teacher_vs_students.representation_names` lists them; ``layer`` ``i`` is the ``i``-th of
that list (a Swin's blocks counted over all stages) and the ``hook`` coord names it. Each block output becomes rows
of ``channel`` values, one per ``token``:

- a ViT token sequence ``(B, T, D)``: token ``t`` is the ``t``-th of the sequence, prefix tokens first;
- a Swin block output ``(B, H, W, C)`` (channels last; timm undoes the window partition and the shift inside the
  block, so the map is in image order): token ``h·W + w``;
- a CNN stage map ``(B, C, H, W)`` (channels first): token ``h·W + w``.

That is the row order of :func:`workbench.features.pairs.token_rows`, so ``activation.isel(layer=j)`` reshaped to
``(sample·token, channel)`` is what ``workbench features`` reads from the images directly
(``tests/test_features_store.py``). Streamed with ``workbench analyze activations --layers L --out X.zarr``
(:mod:`workbench.scale.stream`: chunked, resumable, float16 on request), a teacher's and a student's stores train a
crosscoder in bounded memory (``workbench features --activations DIR``).

The selected blocks must share one shape (all of a ViT's do; a Swin's or a CNN's within a stage): pick them with
``layers``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import xarray as xr
from einops import rearrange

from methods.hooks import run_with_cache
from workbench.analysis import Example, examples, register
from workbench.analysis.teacher_vs_students import representation_names
from workbench.provenance import config_json

__all__ = ["extract_activations", "rows_of"]


def rows_of(value: torch.Tensor, name: str) -> torch.Tensor:
    """``(B, tokens, channels)`` of one block output (module docstring: the token order)."""
    if value.ndim == 3:
        return value
    if value.ndim == 4 and name.endswith(".hook_out"):  # CNN stage: channels first
        return rearrange(value, "b c h w -> b (h w) c")
    if value.ndim == 4:  # Swin: channels last
        return rearrange(value, "b h w c -> b (h w) c")
    raise ValueError(f"{name}: a block output of shape {tuple(value.shape)} is neither tokens nor a feature map")


def _selected(names: list[str], layers: int | Sequence[int] | None) -> list[int]:
    if layers is None:
        return list(range(len(names)))
    wanted = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
    out = []
    for i in wanted:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -len(names) <= i < len(names):
            raise ValueError(f"layer index {i!r} out of range for a model with {len(names)} blocks "
                             f"(0..{len(names) - 1})")
        out.append(int(i) % len(names))
    return sorted(set(out))


@register("activations", example=Example(examples.vit, (2, 1, 28, 28), (0, 2)))
@torch.no_grad()
def extract_activations(model: nn.Module, images: torch.Tensor, *, layers: int | Sequence[int] | None = None,
                        targets: torch.Tensor | None = None) -> xr.Dataset:
    """The block outputs of ``model`` on ``images`` as ``activation(sample, layer, token, channel)`` (float32).

    Args:
        model: an eval-mode model with block hook points (module docstring).
        images: ``(B, C, H, W)`` normalised for the model.
        layers: block indices (negative allowed) into the model's block list; ``None`` for all.
        targets: ignored (the common extractor signature).

    Returns:
        Dataset with ``activation(sample, layer, token, channel)``; coords ``layer``, ``hook`` (per layer: its hook
        point name); attrs ``analysis`` and ``config``.

    Raises:
        ValueError: a model in training mode or without block hook points, a bad ``layers``, or selected blocks of
            different shapes.

    Example:
        >>> import torch
        >>> from workbench.analysis import examples
        >>> ds = extract_activations(examples.vit(), torch.randn(2, 1, 28, 28), layers=[1])
        >>> dict(ds.activation.sizes), ds.hook.values.tolist()
        ({'sample': 2, 'layer': 1, 'token': 50, 'channel': 64}, ['blocks.1.hook_resid_post'])
    """
    if model.training:
        raise ValueError("activations expects an eval-mode model (call model.eval()), like every extractor")
    names = representation_names(model)
    if not names:
        raise ValueError(f"{type(model).__name__} has no block hook points (*.hook_resid_post or stages.*.hook_out); "
                         "name its blocks with methods.hooks.HookPoint or an adapter")
    sel = _selected(names, layers)
    _, cache = run_with_cache(model, images, names=[names[i] for i in sel], stop_early=True)
    rows = [rows_of(cache[names[i]], names[i]).float() for i in sel]  # each (B, tokens, channels)
    shapes = {names[i]: tuple(r.shape[1:]) for i, r in zip(sel, rows)}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"the selected blocks differ in shape (tokens, channels): {shapes}; select blocks of one "
                         "shape with layers= (--layers), e.g. one Swin or CNN stage")
    value = torch.stack(rows, 1).cpu().numpy()  # (B, layer, token, channel)
    return xr.Dataset(
        {"activation": (("sample", "layer", "token", "channel"), value)},
        coords={"layer": sel, "hook": ("layer", [names[i] for i in sel])},
        attrs={"analysis": "activations", "config": config_json(layers=sel)},
    )
