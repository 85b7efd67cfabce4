"""Verdicts of the Non-deep ViT items' findings (papers/002), computed from the items' own Datasets.

Each ``*_verdict(*datasets) -> Verdict`` is the ``test`` of a :class:`~workbench.figures.Finding` registered in
:mod:`workbench.figures.nondeep` / :mod:`workbench.figures.nondeep_tables`; accuracies are compared on the same
held-out images (paired, :func:`workbench.stats.paired_diff_interval`).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from workbench.figures import Verdict
from workbench.stats import paired_diff_interval

__all__ = ["table5_verdict", "exactness_verdict", "fig4_verdict", "fig5_verdict", "fig6_verdict", "table1_verdict", "memory_verdict"]


def _row(ds: xr.Dataset, schedule: str, div: bool | None = None) -> int | None:
    for i in range(ds.sizes["row"]):
        if ds["schedule"].values[i] == schedule and (div is None or bool(ds["div"].values[i]) == div):
            return i
    return None


def _paired(ds: xr.Dataset, i: int, j: int) -> tuple[float, float, float, str]:
    a, b = ds["correct"].values[i], ds["correct"].values[j]
    lo, hi = paired_diff_interval(a, b)
    d = float(a.mean() - b.mean())
    return d, lo, hi, f"{100 * d:+.1f} points (95% CI {100 * lo:+.1f} … {100 * hi:+.1f})"


def table5_verdict(ds: xr.Dataset, seeds: xr.Dataset) -> Verdict:
    """Progressive joining beats instant joining (Table 5: instant loses 3.9–6.4 points), over seeds and images.

    Linear and instant, both without the regulariser (the paper's pair): per shuffling seed the paired difference on
    the same held-out images, then a t interval over the seeds (:func:`workbench.figures.seeds.seed_diff`). Shown: the
    interval is above 0; partly: linear is ahead in every one of two or more seeds, within the noise; not shown:
    otherwise. The regulariser's own effect (linear ✓ − ✗) is reported in the statistic.
    """
    from workbench.figures.seeds import fmt_seed_diff, seed_diff, seeds_of

    arms = [str(a) for a in seeds["arm"].values]
    if "instant" not in arms or "linear" not in arms:
        return Verdict("not shown", "no instant / linear rows", "the ablation lacks the rows the claim compares")
    c = seeds["correct"].transpose("arm", "seed", "sample")
    d = seed_diff(c.sel(arm="linear").values, c.sel(arm="instant").values)
    ahead = sum(v > 0 for v in d.per_seed)
    stat = (f"linear − instant {fmt_seed_diff(d)}; seeds: linear {seeds_of(seeds, 'linear')}, instant "
            f"{seeds_of(seeds, 'instant')}")
    if "linear+div" in arms:
        stat += f"; regulariser (linear ✓ − ✗) {fmt_seed_diff(seed_diff(c.sel(arm='linear+div').values, c.sel(arm='linear').values))}"
    if d.low > 0:
        return Verdict("shown", stat)
    if len(d.per_seed) > 1 and ahead == len(d.per_seed):
        return Verdict("partly", stat, f"linear is ahead in all {ahead} seeds, but within the noise of seeds and images "
                                       "(the interval contains 0)")
    if d.high < 0:
        return Verdict("not shown", stat, "instant joining is ahead of linear beyond the noise of seeds and images")
    return Verdict("not shown", stat, f"no difference: linear is ahead in {ahead} of {len(d.per_seed)} seeds, "
                                      f"{100 * d.mean:+.1f} points on average, within the noise")


def exactness_verdict(ds: xr.Dataset) -> Verdict:
    """The branched model collapses into L/n ordinary blocks with the same outputs (§3.2, Eq. 5–7).

    Tested on both forms: the paper's merge formulas and the exact (corrected) collapse, relative logit error in
    float64. Shown: the paper's formulas are exact (error < 1e-6); partly: only the corrected collapse is exact;
    not shown: neither is.
    """
    eq = ds["pitfall"].values.astype(str)
    err = ds["error_float64"].values
    models = ds["model"].values.astype(str)
    students = [i for i in range(len(eq)) if "ln_" not in eq[i]]
    exact = [err[i] for i in students if eq[i] == "exact"]
    paper = {models[i]: err[i] for i in students if eq[i] == "paper"}
    same = {models[i]: float(ds["same_prediction"].values[i]) for i in students if eq[i] == "paper"}
    stat = (f"exact collapse: relative logit error ≤ {max(exact):.1e}; the paper's formulas (Eq. 5–7): "
            + ", ".join(f"{m} {e:.2f} ({100 * same[m]:.0f}% same top-1)" for m, e in paper.items()))
    if paper and max(paper.values()) < 1e-6:
        return Verdict("shown", stat)
    if exact and max(exact) < 1e-6:
        return Verdict("partly", stat, "the collapse is exact only with the corrected equations; the paper's formulas "
                                       "change the logits")
    return Verdict("not shown", stat, "no collapse reproduces the branched model's logits")


def _offdiag(a: np.ndarray) -> float:
    """Mean |value| over the off-diagonal branch pairs; NaN where the model has no such block (padded)."""
    v = np.abs(np.asarray(a, dtype=float)[..., ~np.eye(a.shape[-1], dtype=bool)])
    v = v[np.isfinite(v)]  # NaN: a student with fewer branches or blocks, padded
    return float(v.mean()) if v.size else float("nan")


def _finite(d: dict) -> dict:
    return {k: v for k, v in d.items() if np.isfinite(v)}


def fig4_verdict(ds: xr.Dataset) -> Verdict:
    """Before joining, only layer 0's attention outputs are alike across branches (paper 0.59); other modules low.

    On the model trained at λ = 0 (the paper's is pre-trained branched): mean |cosine| over branch pairs per
    (block, module). Shown: block 0 attention is the most similar module and every other is below 0.5; partly:
    the others are low but block 0 attention is not the highest; not shown: some other module is 0.5 or more.
    """
    model = next((m for m in ds["model"].values if "after training" in str(m)), ds["model"].values[-1])
    sims = _finite({(int(la), str(mo)): _offdiag(ds["cosine"].sel(model=model, layer=la, module=mo).values)
                    for la in ds["layer"].values for mo in ds["module"].values})
    first = sims[(int(ds["layer"].values[0]), "attn")]
    others = {k: v for k, v in sims.items() if k != (int(ds["layer"].values[0]), "attn")}
    stat = (f"{model}: block 0 attention {first:.2f}, other modules {min(others.values()):.2f}–{max(others.values()):.2f} "
            "(mean |cosine| over branch pairs)")
    if max(others.values()) < 0.5 and first >= max(others.values()):
        return Verdict("shown", stat)
    if max(others.values()) < 0.5:
        return Verdict("partly", stat, "branches are dissimilar, but block 0 attention is not the most similar module")
    return Verdict("not shown", stat, "some module other than block 0 attention has branch similarity ≥ 0.5")


def fig5_verdict(ds: xr.Dataset) -> Verdict:
    """Before joining, the branches' weights are distinct (Fig. 5): low cosine between every pair of branches.

    Shown: every (block, module) has mean |cosine| over branch pairs below 0.3 in every model; not shown otherwise.
    """
    sims = _finite({(str(m), int(la), str(mo)): _offdiag(ds["cosine"].sel(model=m, layer=la, module=mo).values)
                    for m in ds["model"].values for la in ds["layer"].values for mo in ds["module"].values})
    worst = max(sims, key=sims.get)
    stat = (f"branch-pair weight |cosine| {min(sims.values()):.3f}–{max(sims.values()):.3f} over models, blocks and "
            f"modules (largest: {worst[0]}, block {worst[1]} {worst[2]})")
    if max(sims.values()) < 0.3:
        return Verdict("shown", stat)
    return Verdict("not shown", stat, "some branches' weights are alike (|cosine| ≥ 0.3)")


def fig6_verdict(ds: xr.Dataset) -> Verdict:
    """After joining without the regulariser the branches' FFN weights grow alike (paper 0.725–0.928 after 60k
    steps). Shown: FFN weight similarity ≥ 0.7 for the α = 0 model; partly: below, but the FFN *updates* at λ = 1
    are alike (≥ 0.7: the mechanism runs, the demo is too short for it to show in the weights); not shown otherwise.
    """
    model = next((m for m in ds["model"].values if "α = 0 " in str(m) or str(m).endswith("α = 0")), ds["model"].values[0])
    ffn = [mo for mo in ds["module"].values if str(mo).startswith("fc")]
    w = np.mean([_offdiag(ds["cosine"].sel(model=model, module=mo).values) for mo in ffn])
    u = np.mean([_offdiag(ds["update"].sel(model=model, module=mo).values) for mo in ffn]) if "update" in ds else np.nan
    others = {str(m): np.mean([_offdiag(ds["cosine"].sel(model=m, module=mo).values) for mo in ffn])
              for m in ds["model"].values if m != model}
    stat = (f"{model}: FFN weight similarity {w:.2f}, FFN update similarity {u:.2f}; "
            + ", ".join(f"{k}: weights {v:.2f}" for k, v in others.items()))
    if w >= 0.7:
        return Verdict("shown", stat)
    if np.isfinite(u) and u >= 0.7:
        return Verdict("partly", stat, "the FFN updates at λ = 1 are alike, but the demo's short adjustment phase "
                                       "leaves the weights dissimilar")
    return Verdict("not shown", stat, "neither the FFN weights nor their updates grow alike")


def table1_verdict(ds: xr.Dataset) -> Verdict:
    """A collapsed non-deep student beats the ViT of the same depth trained alike (the depth baseline), and runs
    faster than the full-depth teacher (Table 1: D-MAE-6-R 41.7 ms vs DeiT-Tiny 66.1 ms, 0.63×).

    The accuracy part decides (unpaired binomial intervals over the held-out images, per depth): shown if every
    collapsed student is above its depth baseline beyond noise; partly if some; not shown if none. The real-size
    latency ratio is reported beside (one timing, no interval).
    """
    from workbench.stats import diff_interval

    kind, model = ds["kind"].values.astype(str), ds["model"].values.astype(str)
    demo = [i for i in range(ds.sizes["row"]) if str(ds["setting"].values[i]).startswith("demo")]
    parts, above, n = [], [], 0
    for i in demo:
        if kind[i] != "collapsed":
            continue
        blocks = int(str(model[i]).split("collapsed ")[1].split()[0])
        base = next((j for j in demo if kind[j] == "depth baseline" and f"({blocks} blocks)" in model[j]), None)
        if base is None:
            continue
        n = int(ds["val_images"].values[i])
        a, b = float(ds["val_acc"].values[i]), float(ds["val_acc"].values[base])
        lo, hi = diff_interval(a, n, b, n)
        parts.append(f"{blocks} blocks: collapsed − depth baseline {100 * (a - b):+.1f} points "
                     f"(95% CI {100 * lo:+.1f} … {100 * hi:+.1f})")
        above.append(lo > 0)
    real = {kind[i]: float(ds["ms"].values[i]) for i in range(ds.sizes["row"]) if i not in demo
            and np.isfinite(ds["ms"].values[i]) and kind[i] in ("teacher", "collapsed")}
    stat = "; ".join(parts) + f"; {n} held-out images"
    if {"teacher", "collapsed"} <= set(real):
        stat += f"; real-size collapsed 6 / DeiT-Tiny latency {real['collapsed'] / real['teacher']:.2f}× (paper 0.63×)"
    if not parts:
        return Verdict("not shown", "no collapsed student with a depth baseline", "the table lacks the pairs")
    if all(above):
        return Verdict("shown", stat)
    if any(above):
        return Verdict("partly", stat, "only some collapsed students beat their depth baseline beyond noise")
    return Verdict("not shown", stat, "no collapsed student is above its depth baseline beyond the binomial noise")


def _memory_ratio(ds: xr.Dataset, mode: str, student: str) -> tuple[float, float]:
    rows = [i for i in range(ds.sizes["row"]) if str(ds["mode"].values[i]) == mode]
    base = next(i for i in rows if str(ds["model"].values[i]).startswith("DeiT-Tiny (12"))
    other = next(i for i in rows if str(ds["model"].values[i]).startswith(student))
    ours = float(ds["bytes"].values[other] / ds["bytes"].values[base])
    paper = float(ds["paper_gb"].values[other] / ds["paper_gb"].values[base])
    return ours, paper


def memory_verdict(mode: str, student: str, paper_claim: str, tolerance: float = 0.05):
    """The student's peak memory against DeiT-Tiny's, as a ratio, against the paper's ratio (Tables 10 / 11): the
    measured peak is deterministic for a fixed shape (no noise). Shown: within ``tolerance`` of the paper's ratio;
    partly: on the same side of 1 (both more or both less); not shown otherwise."""

    def test(ds: xr.Dataset) -> Verdict:
        ours, paper = _memory_ratio(ds, mode, student)
        stat = f"{student} / DeiT-Tiny peak {mode} memory {ours:.2f}× (paper {paper:.2f}×: {paper_claim})"
        if abs(ours - paper) <= tolerance:
            return Verdict("shown", stat)
        if abs(ours - 1) < 0.01:
            return Verdict("not shown", stat, "no difference from DeiT-Tiny here (ratio ≈ 1)")
        if (ours - 1) * (paper - 1) > 0:
            return Verdict("partly", stat, f"the same direction as the paper's, {abs(ours - paper):.2f} apart")
        return Verdict("not shown", stat, "the ratio is on the other side of 1 from the paper's")

    return test
