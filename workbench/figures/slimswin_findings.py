"""The SlimSwin paper's findings (Eryilmaz & Akturk, papers/004) and their tests on the figures' own data.

Each ``Finding`` names the claim and the paper's number; its test reads only the Datasets the figure draws
(:mod:`workbench.figures.slimswin`) and returns a :class:`~workbench.figures.Verdict` with the measured statistic.
Accuracy differences of models scored on the same held-out images are tested paired
(:func:`workbench.stats.paired_diff_interval`, 95 %): a difference whose interval contains 0 is "no difference".
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from workbench.figures import Finding, Verdict

__all__ = ["FIG1", "FIG2", "FIG3", "FIG4", "FIG6", "FIG7", "TABLE1"]

#: "keeps accuracy": the pruned model is at most this far below the teacher at 95 % confidence (the paper's Swin-T:
#: ~1.5 points at r ≈ 0.67).
KEEP_TOLERANCE = 0.03


def _fig4(sweep: xr.Dataset, base: xr.Dataset, seeds: xr.Dataset) -> Verdict:
    """SlimSwin keeps accuracy at the largest fine-tuned baseline ratio and its masks beat random / uniform ones, over
    training seeds and held-out images.

    Each difference is taken per seed, paired on the same images, with a t interval over the seeds
    (:func:`workbench.figures.seeds.seed_diff`; the teacher, and the no-fine-tune baselines' mean over mask draws, are
    one row compared with every seed). Keeps: the interval of SlimSwin − teacher has its lower end above
    −KEEP_TOLERANCE; a win: the interval of SlimSwin − baseline is above 0. Shown: keeps and wins against both
    fine-tuned baselines; partly: keeps, or some win; not shown: neither.
    """
    from workbench.figures.seeds import fmt_seed_diff, seed_diff

    c = seeds["correct"].transpose("stage", "masks", "seed", "sample")
    r = float(seeds.attrs["ratio"])
    tuned = c.sel(stage="fine-tuned", masks="saliency").values
    n_seeds = int(np.isfinite(tuned).all(axis=1).sum())
    drop = seed_diff(tuned, seeds["teacher_correct"].values)
    parts = [f"r = {r:.2f} ({n_seeds} seed{'s' * (n_seeds > 1)} per arm): SlimSwin − teacher {fmt_seed_diff(drop)}"]
    keeps = drop.low > -KEEP_TOLERANCE
    wins, ties, worse = [], [], []
    for stage in ("fine-tuned", "no fine-tune"):
        for choice in ("random", "uniform"):
            other = c.sel(stage=stage, masks=choice).values
            if not np.isfinite(other).all(axis=1).any():
                continue
            d = seed_diff(c.sel(stage=stage, masks="saliency").values, other)
            parts.append(f"{stage}, SlimSwin − {choice} {fmt_seed_diff(d)}")
            (wins if d.low > 0 else worse if d.high < 0 else ties).append((stage, choice))
    stat = "; ".join(parts)
    tuned_wins = [ch for st, ch in wins if st == "fine-tuned"]
    if keeps and len(tuned_wins) == 2:
        return Verdict("shown", stat)
    if keeps or wins:
        why = []
        if not keeps:
            why.append(f"the pruned model may lose more than {100 * KEEP_TOLERANCE:.0f} points")
        won = [f"{ch} ({st})" for st, ch in wins]
        if won:
            why.append("better than " + ", ".join(won))
        tied = [f"{ch} ({st})" for st, ch in ties]
        if tied:
            why.append("no difference from " + ", ".join(tied) + " (the interval over seeds and images contains 0)")
        lost = [f"{ch} ({st})" for st, ch in worse]
        if lost:
            why.append("worse than " + ", ".join(lost) + " beyond the noise of seeds and images")
        if not any(st == "fine-tuned" for st, _ in wins + ties + worse):
            why.append("no fine-tuned baseline was trained")
        return Verdict("partly", stat, "; ".join(why))
    return Verdict("not shown", stat, "the pruned model loses accuracy and its masks do no better than random or "
                   "uniform ones (no difference)")


FIG4 = Finding(
    "\"SlimSwin achieves significant MAC reductions up to around 60% in the attention blocks while incurring at most "
    "about a 1.5% drop in top-1 accuracy at the highest pruning levels\" (abstract); \"This validates our choice of a "
    "global, gradient-driven saliency measure, rather than manually prespecified layer-wise pruning ratios.\" (§VI)",
    "Swin-T: −0.5 points at r = 0.33, ~−1.5 at r ≈ 0.67 (Fig. 4); no baseline printed",
    _fig4)


def _layer_ratios(masks: xr.Dataset, ratio: float) -> pd.Series:
    sel = masks.sel(ratio=ratio, method="nearest")
    m = sel["mask"]
    frame = pd.DataFrame({"layer": m["layer"].values, "prunable": m["prunable"].values.astype(bool),
                          "pruned": ~m.values.astype(bool)})
    frame = frame[frame.prunable]
    return frame.groupby("layer")["pruned"].mean()


def _fig6(masks: xr.Dataset) -> Verdict:
    lr = _layer_ratios(masks, float(masks.ratio.min()))
    rising = [int(b) for a, b in zip(lr.index[:-1], lr.index[1:]) if lr[b] > lr[a]]
    stat = (f"r = {float(masks.ratio.min()):.2f}: pruned share per prunable layer "
            + " / ".join(f"{v:.2f}" for v in lr.values) + f"; rises with depth at layer(s) {rising or 'none'}")
    if rising:
        return Verdict("shown", stat)
    return Verdict("not shown", stat, "the layer-wise ratios decrease monotonically with depth")


FIG6 = Finding("At r ≈ 0.33 the layer-wise pruning ratios are irregular, not a decreasing function of depth (§VI).",
               "Swin-T, r ≈ 0.33: irregular ratios over 12 layers (Fig. 6)", _fig6)


def _fig7(masks: xr.Dataset) -> Verdict:
    from scipy.stats import spearmanr

    lr = _layer_ratios(masks, float(masks.ratio.max()))
    rho = float(spearmanr(np.asarray(lr.index, dtype=float), lr.values).statistic) if len(lr) > 2 else np.nan
    stat = (f"r = {float(masks.ratio.max()):.2f}: pruned share per prunable layer "
            + " / ".join(f"{v:.2f}" for v in lr.values) + f"; Spearman ρ(depth, share) = {rho:+.2f}")
    if rho < -0.5:
        return Verdict("shown", stat)
    if rho < 0:
        return Verdict("partly", stat, "the decrease with depth is weak")
    return Verdict("not shown", stat, "the pruned share does not decrease with depth")


FIG7 = Finding("At r ≈ 0.67 the layer-wise pruning ratio generally decreases with network depth (§VI).",
               "Swin-T, r ≈ 0.67: decreasing with depth (Fig. 7)", _fig7)


def _fig2(masks: xr.Dataset) -> Verdict:
    """Window dependence: in a partly pruned layer, do windows keep different heads (not one head set everywhere)?"""
    per_layer = []
    for r in masks.ratio.values:
        m = masks["mask"].sel(ratio=r)
        for layer in np.unique(m["layer"].values[m["prunable"].values.astype(bool)]):
            sel = m.where(m["layer"] == layer, drop=True)
            grid = pd.DataFrame({"w": sel["window"].values, "h": sel["head"].values, "k": sel.values.astype(bool)})
            table = grid.pivot(index="w", columns="h", values="k").values  # (windows, heads)
            if 0 < table.sum() < table.size:
                per_layer.append(len({tuple(row) for row in table}) > 1)
    share = float(np.mean(per_layer)) if per_layer else float("nan")
    stat = (f"{sum(per_layer)} of {len(per_layer)} partly pruned (ratio, layer) panels keep different head sets in "
            "different windows")
    if per_layer and share == 1.0:
        return Verdict("shown", stat)
    if per_layer and share > 0:
        return Verdict("partly", stat, "some layers prune the same heads in every window (head-level pruning)")
    return Verdict("not shown", stat, "no layer keeps window-dependent heads")


FIG2 = Finding("Head relevance is window-dependent: pruning keeps different heads in different windows of a layer "
               "(§IV, Figs. 2-3).", "qualitative (Figs. 2-3)", _fig2)


def _fig1(ds: xr.Dataset) -> Verdict:
    comps = list(ds.component.values)
    attn = [c for c in comps if str(c).startswith("attn")]
    share = ds["flops"].sel(component=attn).sum("component") / ds["flops"].sum("component")
    stat = ", ".join(f"{m}: attention {100 * float(share.sel(model=m)):.1f} % of FLOPs" for m in ds.model.values)
    mlp = ds["flops"].sel(component="mlp") / ds["flops"].sum("component")
    ok = bool((share > 0.2).all()) and bool((mlp > share).all())
    stat += f"; MLP {100 * float(mlp.min()):.1f}–{100 * float(mlp.max()):.1f} %"
    return Verdict("shown", stat) if ok else Verdict("not shown", stat, "attention is not a substantial share "
                                                     "below the MLP's")


FIG1 = Finding("MLPs dominate Swin's FLOPs, but attention (QKV, QKᵀ/AV, output projection) is a substantial share "
               "(§I, Fig. 1).", "Swin-T/B bars (Fig. 1; no number printed)", _fig1)


def _table1(ds: xr.Dataset) -> Verdict:
    rows = ds.to_dataframe().reset_index()
    out, exact, ideal = [], [], []
    for model in ("Swin-B @224", "Swin-T @224"):
        name = model.split()[0]
        sel = rows[(rows["model"] == model) & rows["paper reduction (%)"].notna() & rows["reduction (%)"].notna()]
        dense = rows[(rows["model"] == model) & (rows["r"] == "unpruned")]
        if sel.empty or dense.empty:
            continue
        paper = sel["paper reduction (%)"].astype(float)
        gap = float((sel["reduction (%)"].astype(float) - paper).abs().max())
        share_gap = float((sel["r x prunable share (%)"].astype(float) - paper).abs().max())
        macs = float(dense["attention MACs"].iloc[0]) / float(dense["paper MACs"].iloc[0])
        out.append(f"{name}: unpruned MACs ours/paper = {macs:.3f}, max |reduction − paper| = {gap:.2f} points "
                   f"(Algorithm 1 at i = 32) / {share_gap:.2f} (r × prunable share)")
        exact.append(gap <= 0.5 and abs(macs - 1) < 0.01)
        ideal.append(min(gap, share_gap) <= 0.5 and abs(macs - 1) < 0.01)
    stat = "; ".join(out)
    if not out:
        return Verdict("not shown", "no comparable rows", "the table has no paper rows")
    if all(exact):
        return Verdict("shown", stat)
    if any(ideal):
        why = [f"{m}: {'its unpruned MACs are not reproduced' if not i else 'only r × the prunable share reproduces it'}"
               for m, e, i in zip(("Swin-B", "Swin-T"), exact, ideal) if not e]
        return Verdict("partly", stat, "; ".join(why) + " (table notes)")
    return Verdict("not shown", stat, "our counts differ from the paper's by more than 0.5 points")


TABLE1 = Finding("Window-head pruning at r = 0.33 … 0.67 cuts attention MACs by 30.7–61.3 % (Swin-B) and "
                 "28.0–56.0 % (Swin-T) (Table I).", "Swin-B 30.7 / 40.9 / 51.1 / 61.3 %, Swin-T 28.0 / 37.3 / 46.6 / "
                 "56.0 %", _table1)


def _fig3(ds: xr.Dataset) -> Verdict:
    """Window dependence of the teacher's saliency: does a window's most salient head differ from its layer's?

    Stability: the same on two halves of the images (the saliency is |mean gradient| over samples).
    """
    g = ds["gradient"]
    prunable = ds["prunable"].values.astype(bool) if "prunable" in ds else np.ones(ds.sizes["pair"], bool)
    half = ds.sizes["sample"] // 2
    parts = [np.abs(g.isel(sample=s).mean("sample").values) for s in (slice(None), slice(0, half), slice(half, None))]
    layer, window, head = ds["layer"].values, ds["window"].values, ds["head"].values
    differ, agree, n = 0, 0, 0
    for l in np.unique(layer[prunable]):
        sel = (layer == l) & prunable
        windows, heads = np.unique(window[sel]), np.unique(head[sel])
        tables = [np.zeros((windows.size, heads.size)) for _ in parts]
        for t, sal in zip(tables, parts):
            t[np.searchsorted(windows, window[sel]), np.searchsorted(heads, head[sel])] = sal[sel]
        top = tables[0].argmax(1)
        differ += int((top != tables[0].sum(0).argmax()).sum())
        agree += int((tables[1].argmax(1) == tables[2].argmax(1)).sum())
        n += windows.size
    share, stable = differ / max(n, 1), agree / max(n, 1)
    stat = (f"{100 * share:.0f} % of {n} windows' most salient head is not their layer's; the two halves of the "
            f"{ds.sizes['sample']} images agree on a window's top head in {100 * stable:.0f} %")
    if share >= 0.25 and stable >= 0.6:
        return Verdict("shown", stat)
    if share >= 0.25:
        return Verdict("partly", stat, "the windows' top heads differ, but not stably between halves of the images")
    return Verdict("not shown", stat, "the same head is most salient in (nearly) every window")


FIG3 = Finding("Head relevance is window-dependent: the saliency ranking of a layer's heads differs between windows "
               "(§IV).", "qualitative (Figs. 2-3)", _fig3)
