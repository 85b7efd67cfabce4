"""The method's model forms as timm model names (rebuildable from JSON-serialisable kwargs).

=====================  ==========================================================================  =========
name                   what                                                                        made by
=====================  ==========================================================================  =========
``nondeep_branched``   train form: L/n :class:`ParallelBlock`\\ s of n branches, λ a buffer         :func:`branch`
``nondeep_collapsed``  deploy form: a plain timm ``VisionTransformer`` of L/n ``Block``\\ s         :func:`collapse`
=====================  ==========================================================================  =========

kwargs (both): ``base`` — the teacher's timm name (e.g. ``"vit_demo"``, ``"deit_tiny_patch16_224"``);
``base_kwargs`` — the kwargs the teacher was created with (e.g. ``{"num_classes": 10}``);
``branches`` — n. ``nondeep_branched`` adds ``rectify`` (bool); ``nondeep_collapsed`` adds ``form``
(``"concat"``, ``"xwx"`` or ``"wide"``, see :mod:`methods.nondeep.collapse`; ``"auto"`` resolves
to one of the first two). Other kwargs (``num_classes``, ``img_size``, ``drop_path_rate`` …) go to the
base. Weights are random (a fresh base, branched / collapsed); load a checkpoint with
``load_state_dict(..., strict=True)``. ``model.timm_spec`` of a model made by :func:`branch` /
:func:`collapse` is the ``(name, kwargs)`` pair that rebuilds it.
"""

from __future__ import annotations

import timm
import torch
from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer

import methods.teachers  # noqa: F401  (registers vit_demo, the demo profile's default base)

from .branched import branch, check_branches
from .collapse import collapse
from .schedules import set_lambda

_TIMM_ONLY = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")


def _base(base: str, base_kwargs: dict | None, kwargs: dict) -> VisionTransformer:
    for k in _TIMM_ONLY:
        kwargs.pop(k, None)
    if not isinstance(base, str) or not timm.is_model(base):
        raise ValueError(f"base={base!r} is not a timm model name (e.g. 'vit_demo', 'deit_tiny_patch16_224')")
    return timm.create_model(base, pretrained=False, **{**(base_kwargs or {}), **kwargs})


def _no_pretrained(pretrained: bool, name: str) -> None:
    if pretrained:
        raise ValueError(f"{name} has no published weights; build it from a teacher (methods.nondeep.branch) "
                         "or load a run's checkpoint")


@register_model
def nondeep_branched(pretrained: bool = False, *, base: str = "vit_demo", branches: int = 2, rectify: bool = True,
                     base_kwargs: dict | None = None, **kwargs) -> VisionTransformer:
    """Branched (train) form of ``base``: L/n parallel blocks of n branches (λ = 0)."""
    _no_pretrained(pretrained, "nondeep_branched")
    teacher = _base(base, base_kwargs, kwargs)
    check_branches(len(teacher.blocks), branches)
    return branch(teacher, branches, rectify=rectify, base=base, base_kwargs={**(base_kwargs or {}), **kwargs})


@register_model
def nondeep_collapsed(pretrained: bool = False, *, base: str = "vit_demo", branches: int = 2, form: str = "auto",
                      base_kwargs: dict | None = None, **kwargs) -> VisionTransformer:
    """Collapsed (deploy) form: a timm ``VisionTransformer`` with L/n blocks (attention width set by ``form``)."""
    _no_pretrained(pretrained, "nondeep_collapsed")
    teacher = _base(base, base_kwargs, kwargs)
    check_branches(len(teacher.blocks), branches)
    with torch.no_grad():
        model = branch(teacher, branches, base=base, base_kwargs={**(base_kwargs or {}), **kwargs})
        set_lambda(model, 0.0 if form == "wide" else 1.0)
        return collapse(model, "exact", form)


__all__ = ["nondeep_branched", "nondeep_collapsed"]
