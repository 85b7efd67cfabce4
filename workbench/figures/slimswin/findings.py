"""The SlimSwin paper's findings (Eryilmaz & Akturk, papers/004) and their tests on the figures' own data.

Each ``Finding`` names the claim and the paper's number; its test reads only the Datasets the figure draws
(:mod:`workbench.figures.slimswin.items`) and returns a :class:`~workbench.figures.Verdict` with the measured statistic.
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


def depth_trend(shares: pd.Series) -> tuple[float, float]:
    """Spearman ρ(depth, pruned share) of the layers' shares, and its exact one-sided permutation p-value for a
    decrease: the share of all orderings of these shares over the layers whose ρ is at most as large (ties kept;
    every ordering for up to 8 layers, else scipy's asymptotic p)."""
    from itertools import permutations

    from scipy.stats import rankdata, spearmanr

    depth, v = np.arange(len(shares), dtype=float), np.asarray(shares.values, dtype=float)
    if len(v) < 3 or np.ptp(v) == 0:
        return float("nan"), 1.0
    rho = float(spearmanr(depth, v).statistic)
    if len(v) > 8:
        return rho, float(spearmanr(depth, v, alternative="less").pvalue)
    orders = np.array(list(permutations(range(len(v)))))  # (n!, layers)
    ranks = rankdata(v[orders], axis=1)  # average ranks for ties, as spearmanr
    ranks -= ranks.mean(1, keepdims=True)
    d = depth - depth.mean()
    null = ranks @ d / np.sqrt((ranks ** 2).sum(1) * (d ** 2).sum())
    return rho, float((null <= rho + 1e-9).mean())


def _trend_text(r: float, shares: pd.Series, rho: float, p: float) -> str:
    return (f"r = {r:.2f}: pruned share per prunable layer " + " / ".join(f"{v:.2f}" for v in shares.values)
            + f", ρ(depth, share) = {rho:+.2f} (one-sided permutation p = {p:.2f}, {len(shares)} layers)")


#: a decrease with depth counts when at most this share of the orderings of the layers decreases as much (4 layers:
#: only a strict decrease, 1 of 24)
TREND_P = 0.05
#: a weaker decrease ("partly") is still rarer than this among the orderings
WEAK_P = 0.25
#: "markedly more irregular" at r ≈ 0.33: its ρ(depth, share) exceeds the r ≈ 0.67 one by at least this
CONTRAST = 0.5


def _fig6(masks: xr.Dataset) -> Verdict:
    """The contrast the paper draws: at the smallest ratio the layer shares are markedly less of a decrease with depth
    than at the largest (ρ₁ − ρ₂ ≥ :data:`CONTRAST`), which does decrease (p ≤ :data:`WEAK_P`)."""
    lo, hi = float(masks.ratio.min()), float(masks.ratio.max())
    s1, s2 = _layer_ratios(masks, lo), _layer_ratios(masks, hi)
    (rho1, p1), (rho2, p2) = depth_trend(s1), depth_trend(s2)
    gap = rho1 - rho2
    stat = f"{_trend_text(lo, s1, rho1, p1)}; {_trend_text(hi, s2, rho2, p2)}; contrast ρ₁ − ρ₂ = {gap:+.2f}"
    if not np.isfinite(gap):
        return Verdict("not shown", stat, "a ratio prunes every layer alike: no order to compare")
    if gap >= CONTRAST and p2 <= WEAK_P:
        return Verdict("shown", stat)
    if gap > 0:
        return Verdict("partly", stat, "the smaller ratio is less of a decrease, but " + (
            f"only by {gap:.2f} (< {CONTRAST:g})" if gap < CONTRAST else
            f"the larger ratio does not decrease with depth either (p = {p2:.2f})"))
    return Verdict("not shown", stat, "the layer shares at the smaller ratio decrease with depth at least as much as "
                   "at the larger one: the contrast is absent (one pruning run per ratio)")


FIG6 = Finding("'At r ≈ 0.67, the pruning ratio generally decreases with network depth. … However, the pattern at "
               "r ≈ 0.33 deviates substantially from this behavior: the layer-wise pruning ratios are markedly more "
               "irregular' (§VI).", "Swin-T, r ≈ 0.33: irregular ratios over 12 layers (Fig. 6) against r ≈ 0.67 "
               "(Fig. 7)", _fig6)


def _fig7(masks: xr.Dataset) -> Verdict:
    r = float(masks.ratio.max())
    shares = _layer_ratios(masks, r)
    rho, p = depth_trend(shares)
    stat = _trend_text(r, shares, rho, p)
    if p <= TREND_P:
        return Verdict("shown", stat)
    if p <= WEAK_P:
        return Verdict("partly", stat, f"a decrease that {100 * p:.0f} % of the orderings of the layers reach")
    return Verdict("not shown", stat, f"no decrease beyond chance: {100 * p:.0f} % of the orderings of the layers "
                   "decrease as much" if rho < 0 else "the pruned share does not decrease with depth")


FIG7 = Finding("'At r ≈ 0.67, the pruning ratio generally decreases with network depth' (§VI).",
               "Swin-T, r ≈ 0.67: decreasing with depth (Fig. 7)", _fig7)


def _mixed_heads(table: np.ndarray) -> tuple[int, int]:
    """Of a layer's (windows, heads) keep table: the heads kept in some windows and pruned in others, and the fewest
    such heads any mask with the same number of pruned pairs must have (1 when that number is not a multiple of the
    windows, else 0: head-level pruning)."""
    kept = table.mean(0)
    pruned = int(table.size - table.sum())
    return int(((kept > 0) & (kept < 1)).sum()), int(pruned % table.shape[0] != 0)


def _fig2(masks: xr.Dataset) -> Verdict:
    """Window dependence beyond what the pair count forces: in a partly pruned layer, more heads are kept in some
    windows and pruned in others than a head-level mask with the same number of pruned pairs needs."""
    dependent, panels = 0, 0
    for r in masks.ratio.values:
        m = masks["mask"].sel(ratio=r)
        for layer in np.unique(m["layer"].values[m["prunable"].values.astype(bool)]):
            sel = m.where(m["layer"] == layer, drop=True)
            grid = pd.DataFrame({"w": sel["window"].values, "h": sel["head"].values, "k": sel.values.astype(bool)})
            table = grid.pivot(index="w", columns="h", values="k").values.astype(float)  # (windows, heads)
            if 0 < table.sum() < table.size:
                mixed, forced = _mixed_heads(table)
                panels += 1
                dependent += int(mixed > forced)
    stat = (f"{dependent} of {panels} partly pruned (ratio, layer) panels keep heads in some windows and prune them in "
            "others beyond what their number of pruned pairs forces")
    if panels and dependent == panels:
        return Verdict("shown", stat)
    if dependent:
        return Verdict("partly", stat, "some layers prune whole heads (the same heads in every window)")
    return Verdict("not shown", stat, "every layer prunes whole heads: no window-dependent head sets")


FIG2 = Finding("'We hypothesize that attention head relevance is window-dependent, i.e., some windows contain rich "
               "semantic features that require multiple heads, while others are sufficiently represented with only a "
               "subset of heads' (§III-E): the learned masks keep different heads in different windows of a layer.",
               "qualitative (Figs. 2-3)", _fig2)


#: "substantial": the attention (QKV, QKᵀ/AV, output projection) share of the FLOPs is at least this
ATTENTION_SHARE = 0.2


def _fig1(ds: xr.Dataset) -> Verdict:
    """Per model: the MLP is the largest component, above attention; attention is at least :data:`ATTENTION_SHARE`."""
    comps = [str(c) for c in ds.component.values]
    attn = [c for c in comps if c.startswith("attn")]
    total = ds["flops"].sum("component")
    share = ds["flops"].sel(component=attn).sum("component") / total
    mlp = ds["flops"].sel(component="mlp") / total
    others = ds["flops"].sel(component=[c for c in comps if c != "mlp"]).max("component") / total
    parts, held, failed = [], 0, []
    for m in ds.model.values:
        a, g = float(share.sel(model=m)), float(mlp.sel(model=m))
        dominates, substantial = bool(g > a and g > float(others.sel(model=m))), bool(a >= ATTENTION_SHARE)
        held += int(dominates) + int(substantial)
        failed += ([] if dominates else [f"{m}: the MLP is not the largest part"]) + (
            [] if substantial else [f"{m}: attention under {100 * ATTENTION_SHARE:.0f} %"])
        parts.append(f"{m}: attention {100 * a:.1f} %, MLP {100 * g:.1f} % of FLOPs")
    stat = "; ".join(parts) + " (counted from the architecture, no noise)"
    if held == 2 * ds.sizes["model"]:
        return Verdict("shown", stat)
    if held:
        return Verdict("partly", stat, "; ".join(failed))
    return Verdict("not shown", stat, "; ".join(failed))


FIG1 = Finding("'Although MLP layers appear to dominate the overall computational cost, … as shown in Figure 1, "
               "self-attention and output projection also account for a substantial proportion of the total FLOPs' "
               "(§I).", "Swin-T/B bars (Fig. 1; no number printed)", _fig1)


def _table1(ds: xr.Dataset) -> Verdict:
    rows = ds.to_dataframe().reset_index()
    out, names, exact, ideal = [], [], [], []
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
        names.append(name)
        exact.append(gap <= 0.5 and abs(macs - 1) < 0.01)
        ideal.append(min(gap, share_gap) <= 0.5 and abs(macs - 1) < 0.01)
    stat = "; ".join(out)
    if not out:
        return Verdict("not shown", "no comparable rows", "the table has no paper rows")
    if all(exact):
        return Verdict("shown", stat)
    if any(ideal):
        why = [f"{m}: {'its unpruned MACs are not reproduced' if not i else 'only r × the prunable share reproduces it'}"
               for m, e, i in zip(names, exact, ideal) if not e]
        return Verdict("partly", stat, "; ".join(why) + " (table notes)")
    return Verdict("not shown", stat, "our counts differ from the paper's by more than 0.5 points")


TABLE1 = Finding("'Table I reports the MAC reductions for the entire attention computation, including the "
                 "query/key/value projections, the self-attention computation, and the output projection' (§VI): "
                 "30.7–61.3 % (Swin-B) and 28.0–56.0 % (Swin-T) at r ≈ 0.33 … 0.67.",
                 "Swin-B 30.7 / 40.9 / 51.1 / 61.3 %, Swin-T 28.0 / 37.3 / 46.6 / 56.0 %", _table1)


#: "window-dependent": at least this share of the windows has a top head other than its layer's, in both halves
WINDOW_SHARE = 0.25


def _fig3(ds: xr.Dataset) -> Verdict:
    """Window dependence of the teacher's saliency, reproducibly: a window counts when, on each of two disjoint halves of
    the images, its most salient head is the same and is not its layer's most salient head (of that half).

    Shown: at least :data:`WINDOW_SHARE` of the windows, and twice what halves of pure noise give ((H − 1) / H² per
    window: the halves agree by chance on one of H heads, other than the layer's); partly: the windows' top heads
    differ on all the images but not reproducibly; not shown: they hardly differ.
    """
    g = ds["gradient"]
    prunable = ds["prunable"].values.astype(bool) if "prunable" in ds else np.ones(ds.sizes["pair"], bool)
    half = ds.sizes["sample"] // 2
    parts = [np.abs(g.isel(sample=s).mean("sample").values) for s in (slice(None), slice(0, half), slice(half, None))]
    layer, window, head = ds["layer"].values, ds["window"].values, ds["head"].values
    differ, stable, chance, n = 0, 0, 0.0, 0
    for l in np.unique(layer[prunable]):
        sel = (layer == l) & prunable
        windows, heads = np.unique(window[sel]), np.unique(head[sel])
        tables = [np.zeros((windows.size, heads.size)) for _ in parts]
        for t, sal in zip(tables, parts):
            t[np.searchsorted(windows, window[sel]), np.searchsorted(heads, head[sel])] = sal[sel]
        top = [t.argmax(1) for t in tables]
        own = [t.sum(0).argmax() for t in tables]  # the layer's most salient head
        differ += int((top[0] != own[0]).sum())
        stable += int(((top[1] == top[2]) & (top[1] != own[1]) & (top[2] != own[2])).sum())
        chance += windows.size * (heads.size - 1) / heads.size ** 2
        n += windows.size
    share, repro, null = differ / max(n, 1), stable / max(n, 1), chance / max(n, 1)
    stat = (f"{100 * share:.0f} % of {n} windows' most salient head is not their layer's; on both halves of the "
            f"{ds.sizes['sample']} images alike: {100 * repro:.0f} % (chance: {100 * null:.0f} %)")
    if repro >= WINDOW_SHARE and repro >= 2 * null:
        return Verdict("shown", stat)
    if share >= WINDOW_SHARE:
        return Verdict("partly", stat, "the windows' top heads differ, but not reproducibly between halves of the "
                       "images (no more than twice chance)")
    return Verdict("not shown", stat, "the same head is most salient in (nearly) every window")


FIG3 = Finding("'We hypothesize that attention head relevance is window-dependent, i.e., some windows contain rich "
               "semantic features that require multiple heads, while others are sufficiently represented with only a "
               "subset of heads' (§III-E): the teacher's window-head saliency ranks a layer's heads differently in "
               "different windows.", "qualitative (Figs. 2-3)", _fig3)
