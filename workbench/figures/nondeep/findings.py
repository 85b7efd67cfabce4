"""Verdicts of the Non-deep ViT items' findings (papers/002), computed from the items' own Datasets.

Each ``*_verdict(*datasets) -> Verdict`` is the ``test`` of a :class:`~workbench.figures.Finding` registered in
:mod:`workbench.figures.nondeep.items` / :mod:`workbench.figures.nondeep.tables`; accuracies are compared on the same
held-out images (paired, :func:`workbench.stats.paired_diff_interval`).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from workbench.figures import Verdict
from workbench.figures.verdicts import fmt_diff, paired
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


def _similarity(ds: xr.Dataset, var: str, model) -> dict[tuple[int, str], float]:
    """Mean |cosine| over branch pairs per (block, module) of one model; blocks the model lacks (NaN) left out."""
    return _finite({(int(la), str(mo)): _offdiag(ds[var].sel(model=model, layer=la, module=mo).values)
                    for la in ds["layer"].values for mo in ds["module"].values})


def _model(ds: xr.Dataset, words: str, default: int = -1):
    """The first model whose name contains ``words`` (else the ``default``-th one)."""
    return next((m for m in ds["model"].values if words in str(m)), ds["model"].values[default])


def _initial_of(ds: xr.Dataset, model) -> object | None:
    """The model 'at initialisation' with the same branch layout (label prefix, e.g. '2×3') as ``model``."""
    prefix = str(model).split(" ")[0].rstrip(",")
    return next((m for m in ds["model"].values if str(m).startswith(prefix) and "initialisation" in str(m)), None)


#: fig4: "relatively low" similarity: the other modules below this (upper 95 % bound)
FEATURES_LOW = 0.5


def fig4_verdict(ds: xr.Dataset) -> Verdict:
    """Before joining, only layer 0's attention outputs are alike across branches (paper 0.59); other modules low.

    On the model trained at λ = 0 (the paper's is pre-trained branched): mean |cosine| over branch pairs per
    (block, module), with a 95 % interval from the spread over the analysis images (``cosine_sd``; conservative: the
    pairs share images). Shown: block 0 attention is above every other module beyond noise and every other module is
    below 0.5; partly: one of the two; not shown: neither. The same numbers at initialisation are reported beside.
    """
    model = _model(ds, "after training")
    n = max(int(ds.attrs.get("n_images", 1)), 1)
    sims = _similarity(ds, "cosine", model)
    half = ({k: 1.96 * v / np.sqrt(n) for k, v in _similarity(ds, "cosine_sd", model).items()}
            if "cosine_sd" in ds else {})
    key0 = (int(ds["layer"].values[0]), "attn")
    first, others = sims[key0], {k: v for k, v in sims.items() if k != key0}
    top = max(others, key=others.get)
    lo0, hi_top = first - half.get(key0, 0.0), others[top] + half.get(top, 0.0)
    hi_all = max(v + half.get(k, 0.0) for k, v in others.items())
    init = _initial_of(ds, model)
    stat = (f"{model}: block 0 attention {first:.2f} (95% CI low {lo0:.2f}), other modules "
            f"{min(others.values()):.2f}–{others[top]:.2f} (largest: block {top[0]} {top[1]}, 95% CI high "
            f"{hi_top:.2f}); mean |cosine| over branch pairs, {n} images")
    if init is not None:
        s0 = _similarity(ds, "cosine", init)
        stat += (f"; at initialisation: block 0 attention {s0[key0]:.2f}, others up to "
                 f"{max(v for k, v in s0.items() if k != key0):.2f}")
    low, first_top = hi_all < FEATURES_LOW, lo0 > hi_top
    if low and first_top:
        return Verdict("shown", stat)
    if low:
        return Verdict("partly", stat, "branches are dissimilar, but block 0 attention is not the most similar module "
                       "beyond noise")
    if first_top:
        return Verdict("partly", stat, f"block 0 attention is the most similar, but some other module's similarity may "
                       f"reach {FEATURES_LOW:g} (95 % bound)")
    return Verdict("not shown", stat, f"block 0 attention is not the most similar module, and some other module may "
                   f"reach {FEATURES_LOW:g}")


#: fig5: weights (and weight updates) count as "distinct" below this mean |cosine| over branch pairs
DISTINCT = 0.3


def fig5_verdict(ds: xr.Dataset) -> Verdict:
    """Before joining, the branches maintain distinct weights (Fig. 5) — tested where training could change that.

    Our branches start as different teacher blocks, so their weights are dissimilar at step 0 whatever training
    does; the measurement is what training at λ = 0 does to them: the similarity of the branches' weight *updates*
    (``update``: cosine of the changes from initialisation to the end of the λ = 0 run). Alike updates pull the
    branches together; dissimilar ones keep them apart. Shown: after training the weights are distinct (every
    (block, module) below 0.3) and the updates are too (every module type below 0.3, mean over blocks); partly: the
    weights are distinct, but training moves them alike (they are distinct only because they started so); not
    shown: the weights are alike.
    """
    model = _model(ds, "after training")
    w = _similarity(ds, "cosine", model)
    init = _initial_of(ds, model)
    w0 = _similarity(ds, "cosine", init) if init is not None else {}
    u = _similarity(ds, "update", model) if "update" in ds else {}
    per_module = {mo: float(np.mean([v for (_, m), v in u.items() if m == mo])) for mo in {m for _, m in u}}
    worst = max(w, key=w.get)
    stat = (f"{model}: branch weight |cosine| up to {w[worst]:.3f} (block {worst[0]} {worst[1]})"
            + (f", at initialisation up to {max(w0.values()):.3f}" if w0 else "")
            + "; similarity of the updates made at λ = 0: "
            + (", ".join(f"{m} {v:.2f}" for m, v in sorted(per_module.items())) if per_module else "not measured"))
    if w[worst] >= DISTINCT:
        return Verdict("not shown", stat, f"some branches' weights are alike (|cosine| ≥ {DISTINCT:g})")
    if not per_module:
        return Verdict("partly", stat, "the weights are distinct, but only because the branches started as different "
                       "teacher blocks: no weight updates to tell whether training keeps them apart")
    alike = [m for m, v in per_module.items() if v >= DISTINCT]
    if alike:
        return Verdict("partly", stat, f"the weights are distinct because they started distinct; training at λ = 0 "
                       f"moves the branches' {', '.join(sorted(alike))} alike (update similarity ≥ {DISTINCT:g})")
    return Verdict("shown", stat)


#: fig6: the paper's FFN weight similarity after joining is 0.725–0.928: "shown" from 0.7 ...
FFN_ALIKE = 0.7
#: ... "partly" when joining raised the FFN weights' similarity by at least this much above their initial value
FFN_RISE = 0.05


def _ffn(sims: dict[tuple[int, str], float]) -> float:
    return float(np.mean([v for (_, m), v in sims.items() if m.startswith("fc")]))


def fig6_verdict(ds: xr.Dataset) -> Verdict:
    """After joining without the regulariser the branches' FFN weights grow alike (paper 0.725–0.928 after 60k
    steps), measured against where they started (``cosine_init``: the same branched model at initialisation).

    Shown: FFN weight similarity ≥ 0.7 for the α = 0 model; partly: below, but joining raised it by ≥ 0.05 over its
    initial value; not shown otherwise. The similarity of the FFN updates at λ = 1 is reported beside: it is high by
    construction (every branch's FFN sees one GELU input and one output gradient), so it is the mechanism, not the
    evidence.
    """
    model = next((m for m in ds["model"].values if "α = 0 " in str(m) or str(m).endswith("α = 0")), ds["model"].values[0])
    w = _ffn(_similarity(ds, "cosine", model))
    w0 = _ffn(_similarity(ds, "cosine_init", model)) if "cosine_init" in ds else np.nan
    u = _ffn(_similarity(ds, "update", model)) if "update" in ds else np.nan
    others = {str(m): (_ffn(_similarity(ds, "cosine", m)), _ffn(_similarity(ds, "cosine_init", m))
                       if "cosine_init" in ds else np.nan) for m in ds["model"].values if m != model}
    rise = w - w0
    stat = (f"{model}: FFN weight similarity {w:.3f} after joining, {w0:.3f} at initialisation (rise {rise:+.3f}); FFN "
            f"update similarity at λ = 1 {u:.2f}; " + ", ".join(f"{k}: {a:.3f} (from {b:.3f})" for k, (a, b)
                                                                in others.items()))
    if w >= FFN_ALIKE:
        return Verdict("shown", stat)
    if np.isfinite(rise) and rise >= FFN_RISE:
        return Verdict("partly", stat, f"joining makes the FFN weights more alike (+{rise:.2f}), short of the paper's "
                       "0.73–0.93")
    return Verdict("not shown", stat, f"the FFN weights stay as dissimilar as the teacher blocks they started from "
                   f"(rise {rise:+.3f} < {FFN_RISE:g}); the updates are alike, but too small at the demo's length")


#: table1: a real-size collapsed model counts as faster than DeiT-Tiny at this latency ratio or below (one timing
#: per model, no interval: a margin for the timing noise of a shared CPU)
FASTER = 0.9


def table1_verdict(ds: xr.Dataset, correct: xr.Dataset) -> Verdict:
    """A collapsed non-deep student beats the ViT of the same depth trained alike (the depth baseline), and runs
    faster than the full-depth teacher (Table 1: D-MAE-6-R 72.4 % vs D-MAE-6 68.6 %; 41.7 ms vs DeiT-Tiny 66.1 ms).

    Accuracy: paired over the held-out images (``correct``: per-image correctness of the demo models); latency: the
    real-size collapsed models against DeiT-Tiny (single-thread median; faster at ≤ 0.9×). Shown: every collapsed
    student above its depth baseline beyond noise and every real-size collapsed model faster; partly: some of
    either; not shown: none.
    """
    models = [str(m) for m in correct["model"].values]
    parts, above = [], []
    for name in models:
        if not name.startswith("demo collapsed"):
            continue
        blocks = int(name.split("collapsed ")[1].split()[0])
        base = next((m for m in models if m.startswith("demo depth baseline") and f"({blocks} blocks)" in m), None)
        if base is None:
            continue
        d = paired(correct["correct"].sel(model=name).values, correct["correct"].sel(model=base).values)
        parts.append(f"{blocks} blocks: collapsed − depth baseline {fmt_diff(*d)}")
        above.append(d[1] > 0)
    kind, ms = ds["kind"].values.astype(str), ds["ms"].values.astype(float)
    real = [i for i in range(ds.sizes["row"]) if not str(ds["setting"].values[i]).startswith("demo")]
    teacher = next((i for i in real if kind[i] == "teacher"), None)
    ratios = {str(ds["model"].values[i]): ms[i] / ms[teacher] for i in real
              if teacher is not None and kind[i] == "collapsed" and np.isfinite(ms[i])}
    fast = [r <= FASTER for r in ratios.values()]
    stat = "; ".join(parts) + f" (paired, {correct.sizes['sample']} held-out images, one training seed per arm); " \
        "real-size latency / DeiT-Tiny: " \
        + (", ".join(f"{m.split(' (')[0]} {r:.2f}×" for m, r in ratios.items()) or "not measured") + " (paper 6-R 0.63×)"
    if not parts:
        return Verdict("not shown", "no collapsed student with a depth baseline", "the table lacks the pairs")
    if all(above) and fast and all(fast):
        return Verdict("shown", stat)
    if any(above) or any(fast):
        return Verdict("partly", stat, ("some collapsed students are not above their depth baseline beyond noise; "
                                        if not all(above) else "") + (f"some real-size collapsed models are not "
                                                                      f"faster than {FASTER:g}× DeiT-Tiny"
                                                                      if not (fast and all(fast)) else ""))
    return Verdict("not shown", stat, "no collapsed student is above its depth baseline beyond noise, and no "
                   "real-size collapsed model is faster than DeiT-Tiny")


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
