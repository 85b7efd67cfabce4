"""Does a compressed model still decide for its teacher's reasons? Teacher and student explained side by side.

For a teacher and a student, on the same images and for the same class (the image's label: both models explain the
class the image is, so their maps answer the same question), per explainer that applies to both:

- **agreement** of the two maps per image: Spearman rank correlation and the share of the top 10 % cells in common
  (:func:`workbench.analysis.attribution.map_agreement`; on the patch grid where both models have the same one, else
  on the pixel grid);
- **faithfulness** side by side: each model's positive / negative perturbation AUC of its own map
  (:func:`workbench.explain.faithfulness.faithfulness`), the student minus the teacher paired over the images.

**Verdict per student and explainer** (:func:`reasons`): the student *keeps* its teacher's reasons when the lower end
of the 95 % interval of the mean Spearman ρ over the images is at least :data:`KEEP_RHO`, *loses* them when its upper
end is below, else it is *inconclusive*. A student keeps its teacher's reasons overall when it keeps them for every
explainer that applies to both, loses them when it loses them for every one, else *mixed*.
Intervals: :func:`workbench.stats.paired_diff_interval` (normal, over images).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import xarray as xr

from workbench.stats import paired_diff_interval

__all__ = ["KEEP_RHO", "TOPK", "agreement", "mean_interval", "paired_auc", "reasons", "student_reasons"]

KEEP_RHO = 0.5  # mean Spearman ρ (teacher vs student map of one image) at or above which a student keeps the reasons
TOPK = 0.1  # top-k overlap: the top 10 % cells of each map
Status = Literal["keeps", "loses", "inconclusive"]


def mean_interval(x: np.ndarray) -> tuple[float, float, float]:
    """Mean over the finite values and its 95 % normal interval ``(mean, low, high)`` (NaN without two values)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 2:
        return (float(x.mean()) if x.size else np.nan, np.nan, np.nan)
    lo, hi = paired_diff_interval(x, np.zeros_like(x))
    return float(x.mean()), float(lo), float(hi)


def agreement(teacher: xr.Dataset, student: xr.Dataset, *, explained: str = "target", topk: float = TOPK
              ) -> xr.Dataset:
    """Per-image agreement of two models' maps of the same images (:func:`faithfulness` Datasets with maps).

    Returns:
        ``spearman(explainer, sample)`` and ``topk(explainer, sample)`` over the explainers both have; attrs
        ``grid``: ``"patch"`` or ``"pixel"`` (where the two patch grids differ).

    Raises:
        ValueError: Datasets without maps, or of different images.
    """
    from workbench.analysis.attribution import map_agreement

    for ds in (teacher, student):
        if "relevance" not in ds:
            raise ValueError("agreement needs the maps: compute faithfulness(..., keep_maps=True)")
    if teacher.sizes["sample"] != student.sizes["sample"]:
        raise ValueError(f"teacher and student must be explained on the same images, got {teacher.sizes['sample']} "
                         f"and {student.sizes['sample']}")
    same = teacher["relevance"].shape[-2:] == student["relevance"].shape[-2:]
    var = "relevance" if same else "relevance_pixel"
    both = [e for e in teacher["explainer"].values if e in set(student["explainer"].values)]
    rho, top = [], []
    for e in both:
        a = teacher[var].sel(explainer=e, explained=explained).values
        b = student[var].sel(explainer=e, explained=explained).values
        got = map_agreement(a, b, topk=topk)
        rho.append(got["spearman"])
        top.append(got["topk"])
    shape = (0, teacher.sizes["sample"])
    return xr.Dataset({"spearman": (("explainer", "sample"), np.array(rho).reshape(-1, shape[1])),
                       "topk": (("explainer", "sample"), np.array(top).reshape(-1, shape[1]))},
                      coords={"explainer": [str(e) for e in both]}).assign_attrs(
        grid="patch" if same else "pixel", topk_share=topk)


def paired_auc(teacher_auc: np.ndarray, student_auc: np.ndarray) -> tuple[float, float, float]:
    """Student minus teacher AUC over the same images: ``(mean difference, low, high)`` (95 %, paired)."""
    t, s = np.asarray(teacher_auc, float), np.asarray(student_auc, float)
    ok = np.isfinite(t) & np.isfinite(s)
    if ok.sum() < 2:
        return np.nan, np.nan, np.nan
    lo, hi = paired_diff_interval(s[ok], t[ok])
    return float((s[ok] - t[ok]).mean()), float(lo), float(hi)


def reasons(spearman: np.ndarray, *, threshold: float = KEEP_RHO) -> tuple[Status, float, float, float]:
    """Whether a student keeps its teacher's reasons for one explainer, from the per-image Spearman ρ (module
    docstring): ``(status, mean, low, high)``."""
    mean, lo, hi = mean_interval(spearman)
    if not np.isfinite(lo):
        return "inconclusive", mean, lo, hi
    return ("keeps" if lo >= threshold else "loses" if hi < threshold else "inconclusive"), mean, lo, hi


def student_reasons(per_explainer: dict[str, Status]) -> Literal["keeps", "loses", "mixed", "untested"]:
    """A student's overall status from its per-explainer statuses (module docstring)."""
    got = set(per_explainer.values())
    if not got:
        return "untested"
    return "keeps" if got == {"keeps"} else "loses" if got == {"loses"} else "mixed"
