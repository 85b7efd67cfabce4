"""SlimSwin's model forms as timm model names (the method contract).

- ``slimswin_swin`` (train form): the timm Swin ``base`` with a ``(num_windows, num_heads)`` gate in
  every attention layer (:func:`~methods.slimswin.gates.add_gates`); the 0/1 pruning masks are the gates'
  ``gate_mask`` buffers, so a pruned run's state dict carries them and loads strictly.
- ``slimswin_pruned`` (deploy form): the same Swin whose attention computes only the kept pairs
  (:func:`~methods.slimswin.pruned.to_pruned`), built from ``masks`` (one nested list per layer).

All keyword arguments are JSON values, so a run's model is rebuilt from its record.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
from timm.models import register_model

from .gates import add_gates
from .pruned import to_pruned

__all__ = ["slimswin_swin", "slimswin_pruned"]


def _base(base: str, base_kwargs: dict | None, kwargs: dict) -> nn.Module:
    import timm

    import methods.teachers  # noqa: F401  (the demo teachers are timm names too)

    for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
        kwargs.pop(key, None)
    return timm.create_model(base, pretrained=False, **{**(base_kwargs or {}), **kwargs})


@register_model
def slimswin_swin(pretrained: bool = False, *, base: str, base_kwargs: dict | None = None, gate_mode: str = "qkv",
                  **kwargs) -> nn.Module:
    """The gated Swin ``base`` (train form; module docstring)."""
    if pretrained:
        raise ValueError("slimswin_swin has no published weights; load a SlimSwin run's checkpoint instead")
    return add_gates(_base(base, base_kwargs, kwargs), mode=gate_mode)


@register_model
def slimswin_pruned(pretrained: bool = False, *, base: str, base_kwargs: dict | None = None,
                    masks: Sequence | None = None, **kwargs) -> nn.Module:
    """The Swin ``base`` computing only the kept window-head pairs of ``masks`` (deploy form; module docstring)."""
    if pretrained:
        raise ValueError("slimswin_pruned has no published weights; convert a SlimSwin run's model with to_pruned")
    model = _base(base, base_kwargs, kwargs)
    return to_pruned(model, None if masks is None else [torch.as_tensor(m, dtype=torch.bool) for m in masks])
