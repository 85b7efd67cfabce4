"""Small helpers the findings' tests share: paired accuracy differences, their wording, Wilson intervals per cell.

Models scored on the same held-out images are compared paired (:func:`workbench.stats.paired_diff_interval`, 95 %);
a difference whose interval contains 0 is reported as "no difference".
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from workbench.stats import paired_diff_interval, wilson_interval

__all__ = ["paired", "fmt_diff", "accuracy_intervals", "significant"]


def paired(a, b) -> tuple[float, float, float]:
    """(mean of a − b, 95 % low, high) for per-image correctness (0/1, or a mean over draws) on the same images."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    lo, hi = paired_diff_interval(a, b)
    return float(a.mean() - b.mean()), lo, hi


def fmt_diff(d: float, lo: float, hi: float) -> str:
    """``+1.2 points (95% CI −0.3 … +2.7)``, with "no difference" when the interval contains 0."""
    tie = ", no difference" if lo <= 0 <= hi else ""
    return f"{100 * d:+.1f} points (95% CI {100 * lo:+.1f} … {100 * hi:+.1f}{tie})"


def significant(interval: tuple[float, float, float]) -> int:
    """+1 / −1 where the interval lies above / below 0, 0 where it contains 0."""
    _, lo, hi = interval
    return 1 if lo > 0 else -1 if hi < 0 else 0


def accuracy_intervals(correct: xr.DataArray, dim: str = "sample") -> xr.Dataset:
    """``accuracy`` (mean over ``dim``) and its 95 % Wilson interval ``ci_low`` / ``ci_high`` per remaining cell."""
    n = correct.sizes[dim]
    acc = correct.mean(dim, skipna=False)
    flat = acc.values.reshape(-1)
    ci = np.array([wilson_interval(float(v), n) if np.isfinite(v) else (np.nan, np.nan) for v in flat])
    shape = acc.shape
    return xr.Dataset({"accuracy": acc, "ci_low": (acc.dims, ci[:, 0].reshape(shape)),
                       "ci_high": (acc.dims, ci[:, 1].reshape(shape))})
