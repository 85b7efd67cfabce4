"""The AttentionLite paper's findings (Kundu & Sundaresan, papers/003) and their tests on the figures' own data.

Each ``Finding`` names the claim and the paper's numbers; its test reads only the Datasets its figure draws
(:mod:`workbench.figures.attentionlite`). Accuracies on the same held-out images are compared paired
(:mod:`workbench.figures.verdicts`); a difference whose 95 % interval contains 0 is "no difference".
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from workbench.figures import Finding, Verdict
from workbench.figures.verdicts import fmt_diff, paired, significant

__all__ = ["FIG2", "FIG3", "BASELINES", "AT_MAPS", "DENSITY", "TABLE1", "TABLE2"]

#: "close to the teacher": the distilled student is at most this far below it at 95 % confidence (the paper's
#: SA-ResNet26 on CIFAR-10: 0.6 points).
TEACHER_GAP = 0.03


def _gain(pruning: str):
    def test(curves: xr.Dataset, base: xr.Dataset) -> Verdict:
        c = base["correct"]
        d = paired(c.sel(model=f"{pruning}/KD+AT").values, c.sel(model=f"{pruning}/KD").values)
        t = paired(c.sel(model=f"{pruning}/KD+AT").values, c.sel(model="teacher").values)
        stat = f"{pruning} d = {curves.attrs['density']:g}: KD+AT − KD {fmt_diff(*d)}; KD+AT − teacher {fmt_diff(*t)}"
        s = significant(d)
        if s > 0:
            return Verdict("shown", stat)
        if s == 0:
            return Verdict("not shown", stat, "no difference between KD+AT and KD on these images (one seed)")
        return Verdict("not shown", stat, "KD alone is better")

    return test


def _fig2(curves: xr.Dataset, base: xr.Dataset, seeds: xr.Dataset) -> Verdict:
    """KD+AT beats KD with irregular pruning, over training seeds and held-out images.

    Per seed the paired difference of KD+AT and KD on the same images; a t interval over the seeds
    (:func:`workbench.figures.seeds.seed_diff`). Shown: the interval is above 0. Partly: KD+AT is ahead in every one of
    two or more seeds (the paper's "consistently"), within the noise. Not shown: otherwise.
    """
    from workbench.figures.seeds import fmt_seed_diff, seed_diff, seeds_of

    c = seeds["correct"].transpose("arm", "seed", "sample")
    d = seed_diff(c.sel(arm="KD+AT").values, c.sel(arm="KD").values)
    t = paired(base["correct"].sel(model="irregular/KD+AT").values, base["correct"].sel(model="teacher").values)
    ahead = sum(v > 0 for v in d.per_seed)
    stat = (f"irregular d = {curves.attrs['density']:g}: KD+AT − KD {fmt_seed_diff(d)}; KD {seeds_of(seeds, 'KD')} "
            f"seeds, KD+AT {seeds_of(seeds, 'KD+AT')} seeds; KD+AT − teacher (seed 0) {fmt_diff(*t)}")
    if d.low > 0:
        return Verdict("shown", stat)
    if len(d.per_seed) > 1 and ahead == len(d.per_seed):
        return Verdict("partly", stat, f"KD+AT is ahead in all {ahead} seeds, but within the noise of seeds and images "
                                       "(the interval contains 0)")
    return Verdict("not shown", stat, f"KD+AT is not better than KD over the seeds (ahead in {ahead} of "
                                      f"{len(d.per_seed)}; mean {100 * d.mean:+.1f} points)")


FIG2 = Finding("\"We also observe from figures 2 and 3 that transferring logits as well as features via distillation "
               "(KD + AT) consistently yields better accuracy (up to 2.33%) across different models, pruning types and "
               "datasets.\" (§4; here: irregular pruning, Fig. 2)", "KD+AT − KD: up to +2.33 points (Figs. 2-3, "
               "Tables 1-2)", _fig2)
FIG3 = Finding("KD+AT gives a more accurate sparse student than KD alone with column pruning too (Fig. 3).",
               "KD+AT − KD: up to +2.33 points (Figs. 2-3, Tables 1-2)", _gain("column"))


def _baselines(base: xr.Dataset) -> Verdict:
    c = base["correct"]
    best = c.sel(model="irregular/KD+AT").values
    vs_dense = paired(best, c.sel(model="dense/none").values)
    vs_none = paired(best, c.sel(model="irregular/none").values)
    vs_teacher = paired(best, c.sel(model="teacher").values)
    stat = (f"irregular KD+AT − unoptimised dense student {fmt_diff(*vs_dense)}; − same density without distillation "
            f"{fmt_diff(*vs_none)}; − teacher {fmt_diff(*vs_teacher)}")
    if significant(vs_dense) > 0 and vs_teacher[1] > -TEACHER_GAP:
        return Verdict("shown", stat)
    if significant(vs_dense) > 0:
        return Verdict("partly", stat, f"it beats the unoptimised student, but may stay more than "
                       f"{100 * TEACHER_GAP:.0f} points under the teacher (paper: 0.6)")
    if significant(vs_none) > 0:
        return Verdict("partly", stat, "distillation helps at the same density, but the sparse student does not beat "
                       "the dense one trained on labels alone")
    return Verdict("not shown", stat, "the distilled sparse student is no better than the undistilled ones")


BASELINES = Finding("Sparse distillation yields a student with far fewer parameters that is more accurate than the "
                    "unoptimised (dense, undistilled) student and close to the teacher (Table 1).",
                    "SA-ResNet26, CIFAR-10, d = 0.1: KD+AT 94.7 % vs unoptimised 92.77 %, teacher 95.34 %", _baselines)


def _at_maps(ds: xr.Dataset) -> Verdict:
    parts, closer = [], []
    for pruning in np.unique(ds["pruning"].values):
        sel = ds["distance"].where(ds["pruning"] == pruning, drop=True)
        at = sel.where(sel["distill"] == "KD+AT", drop=True).mean("run")
        kd = sel.where(sel["distill"] == "KD", drop=True).mean("run")
        closer += list((at < kd).values)
        parts.append(f"{pruning}: ‖ψ_S − ψ_T‖ KD+AT / KD per stage "
                     + ", ".join(f"{a:.2f}/{k:.2f}" for a, k in zip(at.values, kd.values)))
    stat = "; ".join(parts) + " (mean over the analysis images; no interval)"
    if all(closer):
        return Verdict("shown", stat)
    if any(closer):
        return Verdict("partly", stat, f"closer in {sum(closer)} of {len(closer)} (pruning, stage) cells only")
    return Verdict("not shown", stat, "attention transfer does not bring the student's maps closer")


AT_MAPS = Finding("The AT loss transfers the teacher's spatial attention maps ψ to the self-attention student (§3, "
                  "Eq. 2).", "no number printed", _at_maps)


def _density(ds: xr.Dataset) -> Verdict:
    last = ds["layer_density"].isel(epoch=-1)
    spread = (last.max("layer") - last.min("layer")).values
    stat = ("final per-layer density range (max − min) per run: "
            + ", ".join(f"{str(lbl)} {s:.2f}" for lbl, s in zip(ds["label"].values, spread)))
    if (spread > 0.2).all():
        return Verdict("shown", stat)
    if (spread > 0.2).any():
        return Verdict("partly", stat, "some runs keep nearly uniform densities")
    return Verdict("not shown", stat, "sparse momentum leaves every layer near the target density")


DENSITY = Finding("Sparse momentum decides which layers get more non-zero weights under the global budget (§3, "
                  "Algorithm 1): the per-layer densities move away from uniform.", "no number printed", _density)


def _counts(ds: xr.Dataset) -> tuple[list[float], list[float], int]:
    frame = ds.to_dataframe().reset_index()
    paper = frame[frame["source"].astype(str).str.startswith("paper")]
    p = (paper["param. red. (ours)"].astype(float) / paper["param. red. (paper)"].astype(float) - 1).abs().tolist()
    f = (paper["FLOPs red. dense student (ours)"].astype(float) / paper["FLOPs red. (paper)"].astype(float) - 1
         ).abs().tolist()
    demo = int(frame["source"].astype(str).str.startswith("measured").sum())
    return p, f, demo


def _table(homogeneous: bool):
    def test(ds: xr.Dataset) -> Verdict:
        p, f, demo = _counts(ds)
        if not p:
            return Verdict("not shown", "no paper rows", "nothing to compare")
        stat = (f"paper-size counts: parameter reductions within {100 * max(p):.1f} % of the paper's, FLOPs reductions "
                f"(dense student) within {100 * max(f):.1f} %; {demo} demo rows")
        counts_ok = max(p) <= 0.1 and max(f) <= 0.1
        if homogeneous:
            return Verdict("partly" if counts_ok else "not shown", stat,
                           "the demo trains no homogeneous student: the accuracies are the paper's only")
        if counts_ok and demo:
            return Verdict("shown", stat)
        return Verdict("partly", stat, "counts differ from the paper's by more than 10 %" if not counts_ok else
                       "no demo accuracy")

    return test


TABLE1 = Finding("Hybrid SA-ResNet students reach 20-30× fewer parameters and 1.5-2× fewer FLOPs than ResNet50 "
                 "(Table 1).", "e.g. SA-ResNet26, CIFAR-10, d = 0.1: 29.75× (KD) / 30.26× (KD+AT) params, 1.96× / "
                 "1.91× FLOPs", _table(False))
TABLE2 = Finding("Homogeneous (attention-stem) students reach comparable accuracy with fewer parameter reductions "
                 "(Table 2).", "Table 2 (KD+AT, d = 0.25 / 0.5)", _table(True))
