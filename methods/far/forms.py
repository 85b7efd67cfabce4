"""FAR's model forms as timm model names (the method contract): ``far_vit`` (distilled, possibly shrunk).

``timm.create_model("far_vit", base="vit_demo", far={...})`` builds the teacher architecture ``base``
(random weights) with every attention replaced by a :class:`~methods.far.lstm.MultiHeadBiLSTM`
(:func:`~methods.far.replace.replace_attention` with ``FARConfig(**far)``); with ``keep`` (the pruning
masks ``(layer, head, direction, unit)`` as nested lists) every substitute is shrunk to its kept units
(:func:`~methods.far.hoyer.shrink`), i.e. the deploy form of a pruned run. All keyword arguments are
JSON values, so a run's model is rebuilt from its record and its safetensors load strictly.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn as nn
from timm.models import register_model

from .config import FARConfig
from .hoyer import shrink
from .replace import replace_attention

__all__ = ["far_vit", "far_config"]


def far_config(far: dict[str, Any] | None) -> FARConfig:
    """A :class:`FARConfig` from its JSON form (lists back to tuples)."""
    far = dict(far or {})
    if far.get("layers") is not None:
        far["layers"] = tuple(far["layers"])
    return FARConfig(**far)


@register_model
def far_vit(pretrained: bool = False, *, base: str, base_kwargs: dict | None = None, far: dict | None = None,
            keep: Sequence | None = None, **kwargs) -> nn.Module:
    """A FAR student of the timm ViT ``base`` (module docstring); ``kwargs`` go to ``base`` (e.g. ``img_size``)."""
    import timm

    import methods.teachers  # noqa: F401  (the demo teachers are timm names too)

    if pretrained:
        raise ValueError("far_vit has no published weights; load a FAR run's checkpoint instead")
    for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
        kwargs.pop(key, None)
    teacher = timm.create_model(base, pretrained=False, **{**(base_kwargs or {}), **kwargs})
    student = replace_attention(teacher, far_config(far))
    if keep is not None:
        student = shrink(student, torch.as_tensor(keep, dtype=torch.bool))
    student.pretrained_cfg = dict(getattr(teacher, "pretrained_cfg", {}) or {}, architecture="far_vit")
    return student
