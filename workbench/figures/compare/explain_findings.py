"""Verdicts of the explanation items, computed from their data (``compare.explain_<arch>`` Datasets).

**Field ordering** (``compare.faithfulness``): on the ViT teacher, does each of Chefer et al.'s methods (the generic
attention explainability, their LRP-based relevance, AttnLRP: those registered and applicable) come out ahead of
rollout, raw attention and Grad-CAM on *positive* perturbation of the predicted class (lower AUC = the score falls
faster = more faithful)? Each (Chefer method, other method) pair is tested on the same images: the per-image AUC
difference, 95 % paired interval; *ahead* when its upper end is below 0, *behind* when its lower end is above 0.
Shown: every pair ahead; not shown: none ahead; partly: some.

**Compression** (``compare.explain``): does each student keep its teacher's reasons? Per student and explainer that
applies to both, the Spearman ρ of the two maps of the label class per image (:func:`workbench.explain.compress.reasons`,
threshold :data:`~workbench.explain.compress.KEEP_RHO`, 0.5); a student keeps them when it does for every such explainer.
Shown: every student keeps them; not shown: none does; partly: some.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from workbench.figures import Finding, Verdict

__all__ = ["CHEFER", "BASELINES", "ordering_pairs", "field_ordering_verdict", "student_statuses", "reasons_verdict",
           "ORDERING", "REASONS"]

CHEFER = ("generic_attention", "chefer_lrp", "attnlrp")  # Chefer et al.'s methods and AttnLRP, as the issue groups them
BASELINES = ("rollout", "raw_attention", "gradcam")  # what the field's table puts behind them


def _groups(datasets) -> list[xr.Dataset]:
    return [ds for ds in datasets if "model" in getattr(ds, "dims", {})]


def ordering_pairs(ds: xr.Dataset) -> list[tuple[str, str, float, float, float]]:
    """``(chefer method, other, mean AUC difference, low, high)`` of the teacher's positive perturbation (predicted
    class), for every pair whose both methods applied."""
    from workbench.explain.compress import paired_auc  # lazily: the explain package imports torch

    teacher = str(ds["model"].values[0])
    auc = ds["auc"].sel(model=teacher, explained="predicted", order="positive")
    have = [str(e) for e in ds["explainer"].values if np.isfinite(auc.sel(explainer=e).values).any()]
    out = []
    for c in (m for m in CHEFER if m in have):
        for o in (m for m in BASELINES if m in have):
            d, lo, hi = paired_auc(auc.sel(explainer=o).values, auc.sel(explainer=c).values)
            out.append((c, o, d, lo, hi))
    return out


def field_ordering_verdict(*datasets: xr.Dataset) -> Verdict:
    """The field's ordering on the ViT teacher (module docstring)."""
    vit = next((ds for ds in _groups(datasets) if ds.attrs.get("arch") == "vit"), None)
    if vit is None:
        return Verdict("not shown", "no ViT teacher among the data", "the ordering is a claim about a ViT")
    pairs = ordering_pairs(vit)
    if not pairs:
        return Verdict("not shown", "no pair of a Chefer method and rollout / raw attention / Grad-CAM applied",
                       "nothing to compare")
    auc = vit["auc"].sel(model=vit["model"].values[0], explained="predicted", order="positive").mean("sample")
    means = ", ".join(f"{e} {100 * float(v):.1f}" for e, v in zip(auc["explainer"].values, auc.values)
                      if np.isfinite(v))
    stat = (f"positive perturbation AUC ×100 of the ViT teacher's predicted class on {vit.sizes['sample']} held-out "
            f"images (lower = more faithful): {means}; Chefer minus other, 95 % paired CI: "
            + "; ".join(f"{c} − {o} {100 * d:+.1f} ({100 * lo:+.1f} … {100 * hi:+.1f})" for c, o, d, lo, hi in pairs))
    ahead = [(c, o) for c, o, _, _, hi in pairs if hi < 0]
    behind = [(c, o) for c, o, _, lo, _ in pairs if lo > 0]
    if len(ahead) == len(pairs):
        return Verdict("shown", stat)
    why = f"ahead in {len(ahead)} of {len(pairs)} pairs" + (
        f"; behind {', '.join(o for _, o in behind)}" if behind else "") + (
        "; the others within noise" if len(ahead) + len(behind) < len(pairs) else "")
    return Verdict("partly" if ahead else "not shown", stat, why)


def student_statuses(ds: xr.Dataset, threshold: float | None = None) -> dict[str, tuple[str, dict[str, tuple]]]:
    """student -> (overall status, {explainer: (status, mean ρ, low, high)}) against its teacher (``threshold``:
    :data:`~workbench.explain.compress.KEEP_RHO` by default)."""
    from workbench.explain.compress import KEEP_RHO, reasons, student_reasons

    threshold = KEEP_RHO if threshold is None else threshold
    out = {}
    for m in ds["model"].values[1:]:
        per = {}
        for e in ds["explainer"].values:
            rho = ds["spearman"].sel(model=m, explainer=e).values
            if np.isfinite(rho).sum() >= 2:
                per[str(e)] = reasons(rho, threshold=threshold)
        out[str(m)] = (student_reasons({k: v[0] for k, v in per.items()}), per)
    return out


def reasons_verdict(*datasets: xr.Dataset) -> Verdict:
    """Whether the students keep their teachers' reasons (module docstring)."""
    from workbench.explain.compress import KEEP_RHO

    parts, keep, total = [], [], 0
    for ds in _groups(datasets):
        for student, (status, per) in student_statuses(ds).items():
            if status == "untested":
                continue
            total += 1
            keep += [student] if status == "keeps" else []
            parts.append(f"{student} {status} (" + ", ".join(f"{e} ρ {v[1]:.2f} [{v[2]:.2f}, {v[3]:.2f}]"
                                                         for e, v in per.items()) + ")")
    if not total:
        return Verdict("not shown", "no student with an explainer it shares with its teacher", "nothing to compare")
    stat = (f"Spearman ρ of student vs teacher maps of the label class, mean [95 % CI] over the images, keep at "
            f"ρ ≥ {KEEP_RHO:g}: " + "; ".join(parts))
    if len(keep) == total:
        return Verdict("shown", stat)
    return Verdict("partly" if keep else "not shown", stat,
                   f"{len(keep)} of {total} students keep their teacher's reasons for every explainer"
                   + (f" ({', '.join(keep)})" if keep else ""))


ORDERING = Finding(
    "Chefer et al. (CVPR 2021) 'demonstrate a clear advantage over the existing explainability methods': on positive "
    "perturbation of the predicted class their relevance (and the LRP-free generic form, ICCV 2021) removes the "
    "evidence faster than rollout, raw attention and Grad-CAM.",
    "ImageNet ViT-B, predicted class, positive / negative AUC (a published replication): Chefer 17.0 / 54.2, "
    "rollout 20.1 / 53.1, raw attention 24.0 / 45.6, Grad-CAM 34.1 / 41.5",
    field_ordering_verdict)

REASONS = Finding(
    "FAR: 'Further analysis shows that FAR preserves the semantic token relationships and the token-to-token "
    "correlation learned in the transformer's attention module' — every method distils its student from its "
    "teacher, so a student that keeps its teacher's function should explain its decisions by the same pixels.",
    "no number in the papers (FAR shows token-to-token correlation maps qualitatively)",
    reasons_verdict)
