"""Verdicts of the FAR items' findings (papers/000), computed from the items' own Datasets (no torch, no runs).

Each ``*_verdict(*datasets) -> Verdict`` is the ``test`` of a :class:`~workbench.figures.Finding` registered in
:mod:`workbench.figures.far`; noise is the spread over the held-out / analysis images (normal intervals of a
mean over images, binomial intervals of accuracies, :mod:`workbench.stats`).
"""

from __future__ import annotations

import math

import numpy as np
import xarray as xr

from workbench.figures import Verdict
from workbench.stats import z_for

__all__ = ["agreement_headline", "agreement_verdict"]


def _mean_ci(values: np.ndarray) -> tuple[float, float, float]:
    """Mean over images and its 95% normal interval (``values``: one per image)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan
    half = z_for() * v.std(ddof=1) / math.sqrt(v.size) if v.size > 1 else math.inf
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def _per_layer(ds: xr.Dataset, view: str, model: str, metric: str = "spearman") -> dict[int, tuple[float, float, float]]:
    da = ds[metric].sel(view=view, model=model)
    return {int(layer): _mean_ci(da.sel(layer=layer).values) for layer in da["layer"].values
            if np.isfinite(da.sel(layer=layer).values).any()}


def _span(values) -> str:
    values = [v for v in values if np.isfinite(v)]
    return "–" if not values else f"{min(values):.2f}–{max(values):.2f}"


def agreement_headline(ds: xr.Dataset) -> str:
    """One line: FAR saliency vs teacher attention against the ceiling, and like-for-like (far.agreement's data)."""
    far = _per_layer(ds, "paper-style", "FAR saliency")
    ceiling = _per_layer(ds, "paper-style", "teacher saliency")
    like = _per_layer(ds, "like-for-like", "FAR saliency")
    return (f"FAR saliency vs teacher attention ρ {_span(m for m, _, _ in far.values())} over layers, against a "
            f"ceiling of {_span(m for m, _, _ in ceiling.values())} (the teacher's own saliency vs its attention); "
            f"vs teacher saliency ρ {_span(m for m, _, _ in like.values())}")


def agreement_verdict(ds: xr.Dataset) -> Verdict:
    """FAR preserves the teacher's token-to-token correlation: per layer, FAR's ρ against the ceiling's.

    Shown: in every layer the interval of FAR's ρ (over the images) reaches at least half the ceiling's mean;
    partly: FAR's ρ is above zero beyond noise in every layer but below half the ceiling somewhere; not shown:
    some layer's ρ is within noise of zero (or below).
    """
    far = _per_layer(ds, "paper-style", "FAR saliency")
    ceiling = _per_layer(ds, "paper-style", "teacher saliency")
    n = int(ds.sizes.get("sample", 0))
    layers = sorted(set(far) & set(ceiling))
    if not layers:
        return Verdict("not shown", "no layer with both FAR's and the teacher's maps", "the data holds no agreement")
    share = [far[la][0] / ceiling[la][0] for la in layers]
    stat = (agreement_headline(ds) + f"; FAR reaches {100 * min(share):.0f}–{100 * max(share):.0f} % of the ceiling "
            f"({n} images, 95% intervals over images)")
    if all(far[la][2] >= 0.5 * ceiling[la][0] for la in layers):
        return Verdict("shown", stat)
    if all(far[la][1] > 0 for la in layers):
        return Verdict("partly", stat, "FAR's saliency correlates with the teacher's attention above noise, but at less "
                                       "than half of what the teacher's own saliency reaches")
    weak = [la for la in layers if far[la][1] <= 0]
    return Verdict("not shown", stat, f"in layer(s) {weak} FAR's ρ is within noise of zero")
