"""The depth-scaling baseline of Non-deep ViT (Table 1's DeiT-l / D-MAE-l rows, Table 6 Block-2).

Paper: "Non-deep Vision Transformers" (anonymous ICLR submission). The paper compares its L/n-block
re-parameterised models with plain L/n-block ViTs ("Depth-scaling baselines without re-parameterization",
§4). It does not say how those are initialised; :func:`depth_baseline` takes the teacher's first L/n
blocks (embeddings, final norm and head included), so baseline and branched student start from the same
teacher weights and train under the same budget and loss.
"""

from __future__ import annotations

import copy

import torch.nn as nn
from timm.models.vision_transformer import VisionTransformer

from .branched import check_branches, check_teacher


def depth_baseline(teacher: nn.Module, branches: int, *, base: str | None = None,
                   base_kwargs: dict | None = None) -> VisionTransformer:
    """The teacher cut to its first L/n blocks: a plain timm ViT of the collapsed student's depth.

    Args:
        teacher: a timm ViT (see :func:`methods.nondeep.check_teacher`); not modified.
        branches: n; must divide the teacher's depth.
        base, base_kwargs: the teacher's timm name and creation kwargs, recorded in ``timm_spec``
            as ``(base, {**base_kwargs, "depth": L/n})`` (rebuilds the architecture with ``timm.create_model``).

    Raises:
        ValueError: a teacher that is not a plain timm ViT, or ``branches`` not dividing its depth.
    """
    check_teacher(teacher)
    depth = len(teacher.blocks)
    check_branches(depth, branches)
    model = copy.deepcopy(teacher)
    model.blocks = nn.Sequential(*list(model.blocks)[: depth // branches])
    base = base or getattr(teacher, "pretrained_cfg", {}).get("architecture")
    model.timm_spec = (base, {**(base_kwargs or {}), "depth": depth // branches})
    return model


__all__ = ["depth_baseline"]
