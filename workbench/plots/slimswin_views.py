"""Pure xarray views of window-head pair Datasets (the ``window_saliency`` extractor's, SlimSwin, papers/004).

No torch: plots and figure data use them alike.

* :func:`as_window_grid` -- one layer as ``(head, y, x)`` maps over the token grid or the image;
* :func:`layer_ratio` -- layer-wise pruning ratios for several global ratios, ``layer_ratio(ratio, layer)``;
* :func:`accuracy` -- accuracy against the global ratio, ``accuracy(ratio)``.
"""

from __future__ import annotations

from typing import Literal, Mapping

import numpy as np
import xarray as xr

__all__ = ["as_window_grid", "layer_ratio", "accuracy"]


def _layer_pairs(da: xr.DataArray, layer: int) -> xr.DataArray:
    labels = da["layer"].values
    if layer not in set(labels.tolist()):
        raise ValueError(f"layer {layer} not in the Dataset (layers: {sorted(set(labels.tolist()))})")
    return da.isel(pair=np.flatnonzero(labels == layer))


def as_window_grid(ds: xr.Dataset | xr.DataArray, layer: int, var: str = "saliency",
                   units: Literal["token", "pixel"] = "token") -> xr.DataArray:
    """One layer's per-pair values painted over its token grid: every token gets its window's value.

    Args:
        ds: a ``window_saliency`` Dataset (or one of its pair DataArrays with the pair coords).
        layer: layer label.
        var: pair variable to paint (``saliency``, ``mask``, ``gradient``...).
        units: ``"token"`` (y, x = token row/column of the stage grid) or ``"pixel"`` (every token
            repeated ``token_px`` times: y, x = input pixel, to overlay the image).

    Returns:
        ``(head, y, x)`` (``(sample, head, y, x)`` for ``gradient``) float maps, NaN for heads a
        window does not have, with coord ``window(y, x)`` (the window of each position) and attrs
        ``layer``, ``shifted``, ``units`` plus the variable's own.
    """
    if units not in ("token", "pixel"):
        raise ValueError(f"units must be 'token' or 'pixel', got {units!r}")
    da = ds[var] if isinstance(ds, xr.Dataset) else ds
    part = _layer_pairs(da, layer)
    first = part.isel(pair=0)
    h, w = int(first["map_h"]), int(first["map_w"])
    wh, ww = int(first["window_h"]), int(first["window_w"])
    sy, sx = int(first["shift_y"]), int(first["shift_x"])
    win, head = part["window"].values, part["head"].values
    nx = int(part["window_col"].max()) + 1
    # token (y, x) sits at ((y - sy) % H, (x - sx) % W) after timm's roll (then padding), hence in
    # window row ((y - sy) % H) // wh and column ((x - sx) % W) // ww
    rows = ((np.arange(h) - sy) % h) // wh
    cols = ((np.arange(w) - sx) % w) // ww
    window = rows[:, None] * nx + cols[None, :]  # (H, W)
    lead = part.dims[:-1] if part.dims[-1] == "pair" else None
    if lead is None:
        raise ValueError(f"{var} must have 'pair' as its last dim, got {part.dims}")
    heads = np.unique(head)
    table = np.full((*part.shape[:-1], len(heads), int(win.max()) + 1), np.nan)  # (..., head, window)
    table[..., np.searchsorted(heads, head), win] = part.values
    values = table[..., window]  # (..., head, H, W)
    if units == "pixel":
        px = int(first["token_px"])
        values = values.repeat(px, axis=-2).repeat(px, axis=-1)
        window = window.repeat(px, axis=0).repeat(px, axis=1)
    coords = {d: part[d].values for d in lead if d in part.coords}
    coords.update(head=heads, y=np.arange(values.shape[-2]), x=np.arange(values.shape[-1]), window=(("y", "x"), window))
    out = xr.DataArray(values, dims=(*lead, "head", "y", "x"), coords=coords, name=da.name)
    return out.assign_attrs(da.attrs, layer=int(layer), shifted=bool(first["shifted"]), units=units)


def layer_ratio(masks: Mapping[float, xr.Dataset | xr.DataArray]) -> xr.Dataset:
    """Layer-wise pruning ratios for several global ratios (the paper's Figs. 6 and 7).

    Args:
        masks: global ratio r -> a ``window_saliency`` Dataset (or its ``mask`` DataArray) of the
            model pruned at r. All must cover the same pairs.

    Returns:
        Dataset with ``layer_ratio(ratio, layer)`` (pruned share of the layer's pairs),
        ``pruned_pairs(ratio, layer)``, ``global_ratio(ratio)`` (pruned share of all prunable pairs),
        coords ``ratio`` (the requested r), ``stage(layer)``, ``prunable(layer)``, ``num_pairs(layer)``.
    """
    if not masks:
        raise ValueError("layer_ratio needs at least one ratio")
    ratios = sorted(masks)
    arrays = [masks[r]["mask"] if isinstance(masks[r], xr.Dataset) else masks[r] for r in ratios]
    ref = arrays[0]
    layer_of, stage_of, prunable = ref["layer"].values, ref["stage"].values, ref["prunable"].values.astype(bool)
    layers = np.unique(layer_of)
    for r, m in zip(ratios, arrays):
        if not np.array_equal(m["layer"].values, layer_of):
            raise ValueError(f"the masks for ratio {r} cover other pairs than those for ratio {ratios[0]}")
    off = np.stack([~m.values.astype(bool) for m in arrays])  # (ratio, pair) True = pruned
    pruned = np.stack([off[:, layer_of == l].sum(1) for l in layers], axis=1)  # (ratio, layer)
    num_pairs = np.array([(layer_of == l).sum() for l in layers])
    glob = off[:, prunable].sum(1) / max(1, prunable.sum())
    ds = xr.Dataset(
        {"layer_ratio": (("ratio", "layer"), pruned / num_pairs[None, :]),
         "pruned_pairs": (("ratio", "layer"), pruned), "global_ratio": ("ratio", glob)},
        coords={"ratio": ratios, "layer": layers,
                "stage": ("layer", [int(stage_of[layer_of == l][0]) for l in layers]),
                "prunable": ("layer", [bool(prunable[layer_of == l][0]) for l in layers]),
                "num_pairs": ("layer", num_pairs)},
    )
    ds["layer_ratio"].attrs.update(long_name="pruned share of the layer's window-head pairs", units="1")
    ds["global_ratio"].attrs.update(long_name="pruned share of all prunable pairs", units="1")
    return ds


def accuracy(results: Mapping[float, Mapping[str, float]], teacher: float | None = None) -> xr.Dataset:
    """Accuracy against the global pruning ratio.

    Args:
        results: requested ratio r -> ``{"val_acc", "ratio" (achieved), optionally
            "val_acc_before_final", "mac_reduction"}`` (a SlimSwin run's manifest ``results``).
        teacher: the unpruned teacher's accuracy (attr ``teacher_accuracy``).

    Returns:
        Dataset with ``accuracy(ratio)`` and, when given, ``accuracy_before_final(ratio)``,
        ``achieved_ratio(ratio)``, ``mac_reduction(ratio)``.
    """
    ratios = sorted(results)
    data = {"accuracy": ("ratio", [float(results[r]["val_acc"]) for r in ratios])}
    for name, key in (("accuracy_before_final", "val_acc_before_final"), ("achieved_ratio", "ratio"),
                      ("mac_reduction", "mac_reduction")):
        if all(key in results[r] for r in ratios):
            data[name] = ("ratio", [float(results[r][key]) for r in ratios])
    ds = xr.Dataset(data, coords={"ratio": ratios})
    ds["accuracy"].attrs.update(long_name="held-out top-1 accuracy", units="1")
    return ds.assign_attrs(teacher_accuracy=float("nan") if teacher is None else float(teacher))
