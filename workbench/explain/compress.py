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

:func:`explain_agreement` runs the agreement (and, asked, the perturbation AUCs side by side) on loaded models:
what ``workbench compare --explainers [--explain-perturbation]`` stores.
"""

from __future__ import annotations

import json
from typing import Literal

import numpy as np
import xarray as xr

from workbench.stats import paired_diff_interval

__all__ = ["KEEP_RHO", "TOPK", "agreement", "mean_interval", "paired_auc", "reasons", "student_reasons",
           "explain_agreement"]

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


def _maps(model, images, methods: list[str], target, batch_size: int) -> tuple[xr.Dataset | None, dict[str, str]]:
    """``model``'s :func:`~workbench.explain.attribute` Dataset of the ``methods`` that apply to it (None if none
    does), and the reasons of those that do not apply."""
    from workbench.explain import attribute, get_explainer

    why = {m: r for m in methods if (r := get_explainer(m).applies(model))}
    run = [m for m in methods if m not in why]
    if not run:
        return None, why
    return attribute(model, images, method=run, target=target, batch_size=batch_size), why


def _as_explained(ds: xr.Dataset) -> xr.Dataset:
    """An attribute Dataset's maps as :func:`agreement` reads them (an ``explained`` dim of one, ``"target"``)."""
    return ds[["relevance", "relevance_pixel"]].expand_dims(explained=["target"], axis=1)


def _perturbation(models, images, maps: dict, methods: list[str], teacher: str) -> xr.Dataset:
    """Chefer's positive / negative perturbation AUC of every model's own maps (the explained class's probability,
    :func:`workbench.explain.faithfulness.perturbation`) and each student's paired difference to its teacher."""
    from workbench.explain.faithfulness import perturbation

    names, n = list(models), images.shape[0]
    auc = np.full((len(names), len(methods), 2, n), np.nan)  # (model, explainer, order, sample)
    for i, label in enumerate(names):
        if maps[label] is not None:
            p = perturbation(models[label], images, maps[label])
            for e in np.atleast_1d(p["explainer"].values):
                auc[i, methods.index(str(e))] = p["auc"].sel(explainer=e).values
    diff = np.full((3, len(names), len(methods), 2), np.nan)  # (mean / low / high, model, explainer, order)
    t = names.index(teacher)
    for i in (i for i in range(len(names)) if i != t):
        for j in range(len(methods)):
            for o in range(2):
                diff[:, i, j, o] = paired_auc(auc[t, j, o], auc[i, j, o])
    dims = ("model", "explainer", "order")
    out = xr.Dataset({"explain_auc": ((*dims, "sample"), auc),
                      **{f"explain_auc_diff_{k}": (dims, d) for k, d in zip(("mean", "low", "high"), diff)}},
                     coords={"order": ["positive", "negative"]})
    out["explain_auc"].attrs.update(units="probability", long_name="Chefer's perturbation AUC of the model's own map "
                                    "(the explained class's probability; positive: lower is better, negative: higher)")
    out["explain_auc_diff_mean"].attrs.update(long_name="student − teacher perturbation AUC, mean over the images "
                                              "(95 % paired interval: explain_auc_diff_low / _high)")
    return out


def explain_agreement(models, images, methods, *, teacher: str, targets, topk: float = TOPK,
                      threshold: float = KEEP_RHO, batch_size: int = 32, perturb: bool = False) -> xr.Dataset:
    """Each student's explanations against its teacher's on the same images (module docstring): per explainer that
    applies to both, the per-image Spearman ρ and top-``topk`` overlap (:func:`agreement`), their means with 95 %
    intervals over the images (:func:`mean_interval`) and the verdict (:func:`reasons`).

    Args:
        models: label -> eval-mode model, the teacher among them.
        images: ``(B, C, H, W)`` normalised for every model.
        methods: explainer names (``workbench.explain.EXPLAINERS``).
        teacher: the teacher's label.
        targets: label -> the class each image's map explains, ``(B,)`` (the same for every model, so both maps
            answer one question), or None for the model's own prediction.
        topk, threshold: the top-k share and :data:`KEEP_RHO`.
        perturb: also each model's faithfulness side by side (:func:`_perturbation`).

    Returns:
        ``explain_spearman`` / ``explain_topk(model, explainer, sample)`` (NaN for the teacher and where an explainer
        applies to only one of the two), ``explain_spearman_mean`` / ``_low`` / ``_high`` and the same for
        ``explain_topk`` ``(model, explainer)``, ``explain_reasons(model, explainer)`` (``keeps``, ``loses``,
        ``inconclusive``; ``""`` where not compared), coord ``explain_grid(model)`` (``patch`` or ``pixel``: where the
        maps were compared); attrs ``explain_not_applicable`` (JSON: model -> explainer -> why). With ``perturb``:
        ``explain_auc(model, explainer, order, sample)`` (order: positive, negative) and the student − teacher
        ``explain_auc_diff_mean`` / ``_low`` / ``_high(model, explainer, order)`` (95 %, paired over the images).
    """
    methods, names = list(methods), list(models)
    maps, why = {}, {}
    for label, model in models.items():
        maps[label], why[label] = _maps(model, images, methods, targets[label], batch_size)
    n, shape = images.shape[0], (len(names), len(methods))
    per = {k: np.full((*shape, n), np.nan) for k in ("spearman", "topk")}
    summary = {f"{k}_{s}": np.full(shape, np.nan) for k in per for s in ("mean", "low", "high")}
    verdict, grid = np.full(shape, "", dtype=object), [""] * len(names)
    for i, label in enumerate(names):
        if label == teacher or maps[label] is None or maps[teacher] is None:
            continue
        got = agreement(_as_explained(maps[teacher]), _as_explained(maps[label]), topk=topk)
        grid[i] = got.attrs["grid"]
        for e in got["explainer"].values:
            j = methods.index(str(e))
            for k in per:
                per[k][i, j] = got[k].sel(explainer=e).values
                summary[f"{k}_mean"][i, j], summary[f"{k}_low"][i, j], summary[f"{k}_high"][i, j] = \
                    mean_interval(per[k][i, j])
            verdict[i, j] = reasons(per["spearman"][i, j], threshold=threshold)[0]
    dims = ("model", "explainer")
    out = xr.Dataset({**{f"explain_{k}": ((*dims, "sample"), v) for k, v in per.items()},
                      **{f"explain_{k}": (dims, v) for k, v in summary.items()},
                      "explain_reasons": (dims, verdict.astype(str))},
                     coords={"model": names, "explainer": methods, "sample": np.arange(n),
                             "explain_grid": ("model", grid)})
    out["explain_spearman"].attrs.update(long_name="Spearman ρ of the student's map with its teacher's, per image")
    out["explain_topk"].attrs.update(long_name=f"share of the top {topk:.0%} cells in common with the teacher's map")
    out["explain_reasons"].attrs.update(
        long_name=f"keeps its teacher's reasons: 95 % interval of the mean ρ ≥ {threshold}; loses: < {threshold}")
    if perturb:
        out = xr.merge([out, _perturbation(models, images, maps, methods, teacher)])
    return out.assign_attrs(explain_not_applicable=json.dumps({k: v for k, v in why.items() if v}, sort_keys=True))
