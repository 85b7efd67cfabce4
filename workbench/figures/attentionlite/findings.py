"""The AttentionLite paper's findings (Kundu & Sundaresan, papers/003) and their tests on the figures' own data.

Each ``Finding`` names the claim and the paper's numbers; its test reads only the Datasets its figure draws
(:mod:`workbench.figures.attentionlite.items`). Accuracies on the same held-out images are compared paired
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


def _seed_interval(curves: xr.Dataset) -> tuple[int, tuple[float, float, float] | None]:
    """KD+AT − KD in final held-out accuracy per seed (paired by seed): (seeds, (mean, 95 % t-interval)) or None
    with fewer than two seeds."""
    from scipy.stats import t as student_t

    acc = {(str(d), int(s)): float(a) for d, s, a in zip(curves["distill"].values, curves["seed"].values,
                                                          curves["final_val_acc"].values)}
    seeds = sorted({s for d, s in acc if (("KD", s) in acc and ("KD+AT", s) in acc)})
    gaps = np.array([acc[("KD+AT", s)] - acc[("KD", s)] for s in seeds])
    if gaps.size < 2:
        return gaps.size, None
    half = float(student_t.ppf(0.975, gaps.size - 1) * gaps.std(ddof=1) / np.sqrt(gaps.size))
    return gaps.size, (float(gaps.mean()), float(gaps.mean()) - half, float(gaps.mean()) + half)


def _column_gain(curves: xr.Dataset, base: xr.Dataset) -> Verdict:
    """KD+AT − KD with column pruning: paired over the held-out images (first seed) and, with two seeds or more,
    a t-interval over the seeds' final accuracies. Shown: both above 0; partly: one of them; not shown: neither."""
    c = base["correct"]
    d = paired(c.sel(model="column/KD+AT").values, c.sel(model="column/KD").values)
    n_seeds, seeds = _seed_interval(curves)
    stat = f"column d = {curves.attrs['density']:g}: KD+AT − KD {fmt_diff(*d)} over {c.sizes['sample']} images (seed " \
           f"{int(curves['seed'].values[0])})"
    stat += (f"; over {n_seeds} seeds {fmt_diff(*seeds)} (t-interval)" if seeds else
             f"; {n_seeds} seed per loss: seed-to-seed spread not measured")
    on_images, on_seeds = significant(d) > 0, seeds is not None and seeds[1] > 0
    if on_images and on_seeds:
        return Verdict("shown", stat)
    if on_images or on_seeds:
        return Verdict("partly", stat, "KD+AT is ahead on the held-out images, but " + (
            "one seed per loss cannot tell that from seed-to-seed spread" if seeds is None else
            "its lead is within the seed-to-seed spread") if on_images else
            "KD+AT is ahead over the seeds, but not beyond the image noise of the first seed")
    return Verdict("not shown", stat, "no difference between KD+AT and KD" if significant(d) == 0 else "KD alone is better")


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
FIG3 = Finding("'We also observe from figures 2 and 3 that transferring logits as well as features via distillation (KD + AT) "
               "consistently yields better accuracy (up to 2.33%) across different models, pruning types and datasets' "
               "(§4.2): here Fig. 3, column pruning at d = 0.5.", "KD+AT − KD: up to +2.33 points (Figs. 2-3, Tables 1-2)",
               _column_gain)


def _baselines(base: xr.Dataset) -> Verdict:
    """Per pruning kind, the KD+AT student against the unoptimised (dense, undistilled) student and the teacher, paired
    over the held-out images: shown when both kinds beat the former and stay within :data:`TEACHER_GAP` of the
    latter; not shown when no condition holds."""
    c = base["correct"]
    parts, met, failed = [], 0, []
    for pruning in ("irregular", "column"):
        best = c.sel(model=f"{pruning}/KD+AT").values
        vs_dense = paired(best, c.sel(model="dense/none").values)
        vs_teacher = paired(best, c.sel(model="teacher").values)
        parts.append(f"{pruning} KD+AT − unoptimised dense student {fmt_diff(*vs_dense)}, − teacher {fmt_diff(*vs_teacher)}")
        beats, close = bool(significant(vs_dense) > 0), bool(vs_teacher[1] > -TEACHER_GAP)
        met += int(beats) + int(close)
        failed += ([] if beats else [f"{pruning}: not above the unoptimised student"]) + (
            [] if close else [f"{pruning}: may be more than {100 * TEACHER_GAP:.0f} points under the teacher"])
    stat = "; ".join(parts)
    if met == 4:
        return Verdict("shown", stat)
    if met:
        return Verdict("partly", stat, "; ".join(failed) + f" (paper: 0.6 points under, {100 * TEACHER_GAP:.0f} allowed)")
    return Verdict("not shown", stat, "the distilled sparse students neither beat the unoptimised one nor stay near the "
                   "teacher")


BASELINES = Finding("'With both forms of pruning, we can see that AttentionLite models incur a tiny drop in accuracy "
                    "compared to their teacher but outperform their unoptimized counterparts significantly' (§4.2).",
                    "SA-ResNet26, CIFAR-10: KD+AT 94.7 % (irregular, d = 0.1) / 94.88 % (column, d = 0.5) vs "
                    "unoptimised 92.77 %, teacher 95.34 % (Table 1)", _baselines)


def _at_maps(ds: xr.Dataset) -> Verdict:
    """Per (pruning, stage): ‖ψ_S − ψ_T‖₂ of the KD+AT students minus that of the KD students, paired over the analysis
    images (each image's distance averaged over the seeds). Closer: the interval lies below 0."""
    if "distance_image" not in ds:
        return Verdict("not shown", "no per-image distances in the stored data", "the data predates the paired test: "
                       "recompute it (`workbench figures attentionlite.at_maps --force`)")
    parts, cells, closer, farther = [], 0, 0, 0
    for pruning in dict.fromkeys(str(p) for p in ds["pruning"].values):
        sel = ds["distance_image"].where(ds["pruning"] == pruning, drop=True)
        at = sel.where(sel["distill"] == "KD+AT", drop=True).mean("run")  # (stage, sample)
        kd = sel.where(sel["distill"] == "KD", drop=True).mean("run")
        row = []
        for st in ds["stage"].values:
            d = paired(at.sel(stage=st).values, kd.sel(stage=st).values)
            cells += 1
            closer += int(d[2] < 0)
            farther += int(d[1] > 0)
            row.append(f"stage {st} {d[0]:+.3f} ({d[1]:+.3f} … {d[2]:+.3f})")
        parts.append(f"{pruning}: " + ", ".join(row))
    seeds = len(np.unique(ds["seed"].values))
    stat = (f"‖ψ_S − ψ_T‖₂ of KD+AT − KD, paired over {ds.sizes['sample']} images (95 % CI; {seeds} seed"
            f"{'s' if seeds > 1 else ''}): " + "; ".join(parts))
    if closer == cells:
        return Verdict("shown", stat)
    if closer:
        return Verdict("partly", stat, f"closer beyond the image noise in {closer} of {cells} (pruning, stage) cells"
                       + (f", farther in {farther}" if farther else "") + "; the others are ties")
    return Verdict("not shown", stat, "attention transfer does not bring the student's maps closer beyond the image "
                   "noise in any (pruning, stage) cell")


AT_MAPS = Finding("'We use traditional softmax temperature based knowledge distillation [6] for transferring knowledge "
                  "from logits and employ attention transfer [7] to transfer knowledge from the teacher's activation "
                  "maps' (§2.2): with AT the student's maps ψ are closer to the teacher's than with KD alone.",
                  "no number printed", _at_maps)


#: "moves away from uniform": a run's final per-layer densities span more than this (all layers start at d)
DENSITY_SPREAD = 0.2
#: "decides which layers": the runs' final per-layer densities rank the layers alike (mean pairwise Spearman ρ)
DENSITY_AGREEMENT = 0.5


def _density(ds: xr.Dataset) -> Verdict:
    """Sparse momentum moves budget between layers (final spread) and does so systematically: the runs (pruning
    kinds, losses) agree on which layers get more (pairwise Spearman ρ of their final per-layer densities)."""
    from itertools import combinations

    from scipy.stats import spearmanr

    last = ds["layer_density"].isel(epoch=-1)
    spread = (last.max("layer") - last.min("layer")).values
    rhos = []
    for i, j in combinations(range(ds.sizes["run"]), 2):
        a, b = last.isel(run=i).values, last.isel(run=j).values
        ok = np.isfinite(a) & np.isfinite(b)
        if ok.sum() > 2 and np.ptp(a[ok]) > 0 and np.ptp(b[ok]) > 0:
            rhos.append(float(spearmanr(a[ok], b[ok]).statistic))
    agree = float(np.mean(rhos)) if rhos else float("nan")
    stat = ("final per-layer density range (max − min) per run: "
            + ", ".join(f"{str(lbl)} {s:.2f}" for lbl, s in zip(ds["label"].values, spread))
            + f"; runs agree on the layers' order: mean pairwise Spearman ρ = {agree:+.2f} over {len(rhos)} pairs")
    moved = spread > DENSITY_SPREAD
    if moved.all() and agree >= DENSITY_AGREEMENT:
        return Verdict("shown", stat)
    if moved.any():
        return Verdict("partly", stat, "some runs keep nearly uniform densities" if not moved.all() else
                       f"the runs do not agree on which layers get more (ρ < {DENSITY_AGREEMENT:g}): the moves may be noise")
    return Verdict("not shown", stat, f"sparse momentum leaves every layer within {DENSITY_SPREAD:g} of the others")


DENSITY = Finding("'we evaluate the layer's importance by computing the normalized momentum contributed by its non-zero "
                  "weights during an epoch. This enables us to decide which layers should have more non-zero weights "
                  "under the given parameter budget' (§3): the per-layer densities move away from uniform, the same "
                  "layers in every run.", "no number printed", _density)


def _counts(ds: xr.Dataset) -> tuple[list[float], list[float], int]:
    frame = ds.to_dataframe().reset_index()
    paper = frame[frame["source"].astype(str).str.startswith("paper")]
    p = (paper["param. red. (ours)"].astype(float) / paper["param. red. (paper)"].astype(float) - 1).abs().tolist()
    f = (paper["FLOPs red. dense student (ours)"].astype(float) / paper["FLOPs red. (paper)"].astype(float) - 1
         ).abs().tolist()
    demo = int(frame["source"].astype(str).str.startswith("measured").sum())
    return p, f, demo


#: paper-size counts reproduce a paper reduction when within this relative distance of it
COUNT_TOLERANCE = 0.1


def _table(ds: xr.Dataset) -> Verdict:
    """The paper's parameter and FLOPs reductions against ours for the same architectures and densities at paper size:
    shown when both are within :data:`COUNT_TOLERANCE` in every row, partly when one is."""
    p, f, demo = _counts(ds)
    if not p:
        return Verdict("not shown", "no paper rows", "nothing to compare")
    stat = (f"paper-size counts over {len(p)} rows: parameter reductions within {100 * max(p):.1f} % of the paper's, "
            f"FLOPs reductions (dense student) within {100 * max(f):.1f} % (tolerance {100 * COUNT_TOLERANCE:.0f} %); "
            f"{demo} demo rows (accuracy: not tested here)")
    ok = {"parameter": max(p) <= COUNT_TOLERANCE, "FLOPs": max(f) <= COUNT_TOLERANCE}
    if all(ok.values()):
        return Verdict("shown", stat)
    if any(ok.values()):
        return Verdict("partly", stat, " and ".join(k for k, v in ok.items() if not v) + " reductions differ from the "
                       f"paper's by more than {100 * COUNT_TOLERANCE:.0f} % in some row")
    return Verdict("not shown", stat, f"neither count is within {100 * COUNT_TOLERANCE:.0f} % of the paper's")


TABLE1 = Finding("'with the hybrid variants, our sparse distillation framework can yield parameter reduction of up to "
                 "30.26×, 28.59×, and 11× on CIFAR-10, CIFAR-100, and Tiny-ImageNet respectively with irregular "
                 "pruning. However, column pruning yields a FLOPs reduction of up to 2.02×, 2.02×, and 2.11×' (§4.2).",
                 "e.g. SA-ResNet26, CIFAR-10, d = 0.1: 29.75× (KD) / 30.26× (KD+AT) params, 1.96× / 1.91× FLOPs",
                 _table)
TABLE2 = Finding("'The homogeneous variants achieve a parameter reduction of up to 11.51× on CIFAR-10 and CIFAR-100, and "
                 "11× on Tiny ImageNet. They have a FLOPs reduction of 2.02×, 2.01×, and 2.11×, respectively' (§4.2).",
                 "Table 2 (KD+AT, d = 0.25 irregular / 0.5 column)", _table)
