"""What structured pruning kept in a FAR model: the ``retention`` extractor (FAR §3.3, Fig. 4, 7, 8).

Paper: Ren et al., "Is Attention Required for Transformer Inference? Explore Function-preserving
Attention Replacement". DeepHoyer pruning removes hidden units of each (layer, head, direction)
LSTM of the substitutes; Fig. 4 shows the percentage of units each one keeps. This extractor reads
the weights only (the images are ignored; they are accepted so the extractor has the common
signature) and reports, per replaced block:

- ``retention(layer, head, direction)``: fraction of the U original hidden units kept — a unit
  counts as kept when the model physically has it (the ``kept`` buffer of a shrunk model) and its
  group L2 norm is above ``threshold`` (default 0: only exactly-zero, i.e. masked, units are out);
- ``unit_norm(layer, head, direction, unit)``: the group L2 norm of every unit
  (:func:`methods.far.unit_group_norms`: its W_ih and W_hh rows over the four gates, plus with
  ``grouping="full"`` its W_hh column and output-projection column), NaN for removed units;
- ``hoyer(layer, head, direction)``: the group Hoyer measure (Σ_j n_j)² / Σ_j n_j² of Eq. 6 over
  those norms, in [1, U] (1 = one unit left, U = all equal), 0 for a group with no unit left.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import xarray as xr

from methods.far import DIRECTIONS, group_hoyer, substitutes, unit_group_norms
from workbench.analysis import Example, examples, register
from workbench.provenance import config_json


@register("retention", example=Example(examples.far, (2, 1, 28, 28), (0, 2)))
@torch.no_grad()
def extract_retention(
    model: nn.Module,
    images: torch.Tensor | None = None,
    *,
    layers: int | Sequence[int] | None = None,
    targets: torch.Tensor | None = None,
    threshold: float = 0.0,
    grouping: str = "full",
) -> xr.Dataset:
    """Per (layer, head, direction) retention, unit group norms and Hoyer measure of a FAR model.

    Args:
        model: an eval-mode FAR model (a timm ViT whose blocks hold :class:`methods.far.MultiHeadBiLSTM`),
            pruned (physically shrunk or masked) or not.
        images: ignored (weights only); accepted for the common extractor signature.
        layers: block indices of replaced blocks (negative allowed); ``None`` for all.
        threshold: a unit counts as kept when its group norm is above this (0: not exactly zero).
        grouping: ``"full"`` or ``"rows"`` (see :mod:`methods.far.hoyer`).

    Returns:
        Dataset with ``retention(layer, head, direction)``, ``unit_norm(layer, head, direction, unit)``,
        ``hoyer(layer, head, direction)``, ``kept_units(layer, head, direction)``; coords ``layer``
        (block index), ``head``, ``direction`` ("forward"/"reverse"), ``unit``; attrs ``analysis``,
        ``config``, ``hidden_units`` (U).

    Raises:
        ValueError: a model without FAR substitutes, in training mode, or bad ``layers``.
    """
    subs = substitutes(model)
    if not subs:
        raise ValueError(f"{type(model).__name__} has no FAR substitutes (MultiHeadBiLSTM blocks): retention "
                         "describes a FAR model, e.g. a far / far_pruned run")
    if model.training:
        raise ValueError("retention expects an eval-mode model (call model.eval()), like every extractor")
    blocks = [i for i, _ in subs]
    if layers is None:
        sel = blocks
    else:
        wanted = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
        n = len(model.blocks)
        sel = []
        for i in wanted:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -n <= i < n:
                raise ValueError(f"layer index {i!r} out of range for a model with {n} blocks (0..{n - 1})")
            if int(i) % n not in blocks:
                raise ValueError(f"layer {i} is not a replaced block (replaced: {blocks})")
            sel.append(int(i) % n)
        if not sel or len(set(sel)) != len(sel):
            raise ValueError(f"layers must select distinct replaced blocks, got {wanted}")
        sel = sorted(sel)
    rows = [blocks.index(i) for i in sel]
    norms = unit_group_norms(model, grouping)[rows].float().cpu()  # (L, N, 2, U), NaN = removed
    kept = torch.nan_to_num(norms, nan=-1.0) > threshold
    hoyer = group_hoyer(norms)
    u = norms.shape[-1]
    ds = xr.Dataset(
        {
            "retention": (("layer", "head", "direction"), kept.float().mean(-1).numpy()),
            "kept_units": (("layer", "head", "direction"), kept.sum(-1).numpy().astype(np.int64)),
            "unit_norm": (("layer", "head", "direction", "unit"), norms.numpy()),
            "hoyer": (("layer", "head", "direction"), hoyer.numpy()),
        },
        coords={"layer": sel, "head": np.arange(norms.shape[1]), "direction": list(DIRECTIONS), "unit": np.arange(u)},
    )
    ds["retention"].attrs.update(units="fraction of hidden units", long_name="hidden units kept")
    ds["unit_norm"].attrs.update(units="L2 norm", long_name=f"group L2 norm of a hidden unit ({grouping} grouping)")
    ds["hoyer"].attrs.update(units="1", long_name="group Hoyer measure (Σ n)² / Σ n² (Eq. 6)")
    return ds.assign_attrs(analysis="retention", hidden_units=u,
                           config=config_json(layers=None if layers is None else sel, threshold=threshold, grouping=grouping))
