"""Pure numpy / xarray helpers shared by extractors (no torch)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["pad_stack", "layer_config"]


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
