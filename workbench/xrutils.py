"""Pure numpy / xarray helpers shared by extractors, figure data and plots (no torch)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import xarray as xr

__all__ = ["pad_stack", "layer_config", "rows_to_dataset", "dataset_rows"]


def pad_stack(arrays: Sequence[np.ndarray], axis: int) -> np.ndarray:
    """Stack arrays along a new ``axis``, NaN-padding every other dim to the largest size (float32).

    The result is allocated in its final (C-contiguous) layout, one copy per input array.
    """
    shape = [int(max(a.shape[d] for a in arrays)) for d in range(arrays[0].ndim)]
    out_shape = (*shape[:axis], len(arrays), *shape[axis:])
    out = np.empty(out_shape, np.float32) if all(list(a.shape) == shape for a in arrays) else np.full(out_shape, np.nan, np.float32)
    for i, a in enumerate(arrays):
        out[(*(slice(0, s) for s in a.shape[:axis]), i, *(slice(0, s) for s in a.shape[axis:]))] = a
    return out


def layer_config(layers: int | Sequence[int] | None) -> list[int] | int | None:
    """``layers`` as JSON for an extractor's ``config`` attr."""
    if layers is None or isinstance(layers, (int, np.integer)):
        return None if layers is None else int(layers)
    return [int(i) for i in layers]


def rows_to_dataset(rows: Sequence[dict], dim: str = "row") -> xr.Dataset:
    """A table (one dict per row) as a Dataset with one variable per column along ``dim``; None -> NaN / ""."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    data = {}
    for c in cols:
        vals = [r.get(c) for r in rows]
        if all(v is None or isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in vals):
            data[c] = (dim, np.array([np.nan if v is None else float(v) for v in vals]))
        else:
            data[c] = (dim, np.array(["" if v is None else str(v) for v in vals], dtype=object))
    return xr.Dataset(data, coords={dim: np.arange(len(rows))})


def dataset_rows(ds: xr.Dataset, dim: str = "row") -> list[dict]:
    """The inverse of :func:`rows_to_dataset`: one dict per row, NaN and "" back to None."""
    out = []
    for i in range(ds.sizes[dim]):
        row = {}
        for name, var in ds.data_vars.items():
            if var.dims != (dim,):
                continue
            v = var.values[i]
            v = v.item() if hasattr(v, "item") else v
            row[name] = None if (isinstance(v, float) and np.isnan(v)) or v == "" else v
        out.append(row)
    return out
