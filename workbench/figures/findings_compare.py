"""Verdict of the comparison's finding (``compare.table1``), computed from the comparison Datasets.

Every method's paper claims a student that keeps its teacher's accuracy; here each student's held-out top-1 is
compared with its teacher's on the same images (paired, :func:`workbench.stats.paired_diff_interval`).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from workbench.figures import Verdict
from workbench.stats import paired_diff_interval

__all__ = ["accuracy_kept_verdict"]


def accuracy_kept_verdict(*datasets: xr.Dataset) -> Verdict:
    """Students keep their teacher's top-1: none is below its teacher beyond the noise of the held-out images.

    Shown: no student is worse beyond noise; partly: some are; not shown: every student is. Datasets without
    per-image correctness (``heldout_correct``) or without students are skipped.
    """
    kept, lost, parts, n = [], [], [], 0
    for ds in datasets:
        if "model" not in ds.dims or "heldout_correct" not in ds:
            continue
        teacher = str(ds["model"].values[0])
        t = ds["heldout_correct"].sel(model=teacher).values
        for m in ds["model"].values[1:]:
            s = ds["heldout_correct"].sel(model=m).values
            ok = np.isfinite(t) & np.isfinite(s)
            if ok.sum() < 2:
                continue
            lo, hi = paired_diff_interval(s[ok], t[ok])
            d = float(s[ok].mean() - t[ok].mean())
            n = max(n, int(ok.sum()))
            parts.append(f"{m} {100 * d:+.1f} ({100 * lo:+.1f} … {100 * hi:+.1f})")
            (lost if hi < 0 else kept).append(str(m))
    if not parts:
        return Verdict("not shown", "no per-image correctness in the data", "the comparison lacks held-out predictions")
    stat = f"student − teacher top-1, points (95% CI), {n} held-out images: " + "; ".join(parts)
    if not lost:
        return Verdict("shown", stat)
    if kept:
        return Verdict("partly", stat, f"{len(lost)} of {len(lost) + len(kept)} students are below their teacher "
                                       f"beyond noise: {', '.join(lost)}")
    return Verdict("not shown", stat, "every student is below its teacher beyond the noise of the held-out images")
