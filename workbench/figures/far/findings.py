"""Verdicts of the FAR items' findings (papers/000), computed from the items' own Datasets (no torch, no runs).

Each ``*_verdict(*datasets) -> Verdict`` is the ``test`` of a :class:`~workbench.figures.Finding` registered in
:mod:`workbench.figures.far.items`; noise is the spread over the held-out / analysis images (Student t intervals of a
mean over images, paired intervals of accuracy differences where per-image correctness is stored,
:mod:`workbench.stats`). The token-map rules are in :mod:`workbench.figures.far.findings_maps`.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from workbench.figures import Verdict
from workbench.figures.far.findings_maps import mean_ci
from workbench.figures.verdicts import fmt_diff, paired
from workbench.stats import diff_interval

__all__ = ["agreement_headline", "agreement_verdict", "table1_diffs", "table1_verdict", "table3_verdict", "retention_verdict",
           "table2_verdict"]


def _per_layer(ds: xr.Dataset, view: str, model: str, metric: str = "spearman") -> dict[int, tuple[float, float, float]]:
    da = ds[metric].sel(view=view, model=model)
    return {int(layer): mean_ci(da.sel(layer=layer).values) for layer in da["layer"].values
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


def _delta(a: float, b: float, n: int) -> tuple[float, float, float, str]:
    lo, hi = diff_interval(a, n, b, n)
    return a - b, lo, hi, f"{100 * (a - b):+.1f} points (95% CI {100 * lo:+.1f} … {100 * hi:+.1f})"


def table1_diffs(ds: xr.Dataset) -> dict[str, tuple[float, float, float]]:
    """FAR − teacher and FAR† − teacher top-1 on the same held-out images, paired image by image: kind -> (difference,
    95 % low, high) from ``correct(row, heldout_sample)`` (far.runs)."""
    if "correct" not in ds:
        raise ValueError("far.runs holds no per-image correctness ('correct'): it was stored by an older workbench; "
                         "redraw with `workbench figures far --force` to recompute it")
    rows = {str(k): i for i, k in enumerate(ds["kind"].values)}
    c = ds["correct"].values.astype(float)  # (row, heldout_sample)
    return {k: paired(c[rows[k]], c[rows["DeiT"]]) for k in ("FAR", "FAR†")}


def table1_verdict(ds: xr.Dataset) -> Verdict:
    """FAR and FAR† keep the teacher's top-1 (Table 1): neither is worse than the teacher beyond noise.

    Paired intervals over the held-out images (each model's per-image correctness, ``correct``; the same interval
    compare.table1 reports). Shown: neither worse beyond noise; partly: one of the two; not shown: both.
    """
    d = table1_diffs(ds)
    n = int(ds.sizes["heldout_sample"])
    stat = f"FAR − teacher {fmt_diff(*d['FAR'])}; FAR† − teacher {fmt_diff(*d['FAR†'])}; paired over {n} held-out images"
    worse = [name for name, (_, _, hi) in d.items() if hi < 0]
    if not worse:
        return Verdict("shown", stat)
    if len(worse) == 1:
        return Verdict("partly", stat, f"{worse[0]} is below the teacher beyond noise")
    return Verdict("not shown", stat, "FAR and FAR† are both below the teacher beyond noise")


def table3_verdict(ds: xr.Dataset, seeds: xr.Dataset) -> Verdict:
    """Distilling with both losses (Eq. 4) is the best schedule, as in every row of Table 3, over seeds and images.

    Accuracy: each schedule's mean over its seeds of the held-out top-1 of its saved model (after distillation where
    the ablation budget has no finetuning, the demo's). The runner-up is the best other schedule; combined − runner-up
    is taken per seed, paired on the same images, with a t interval over the seeds both have (a schedule trained on
    one seed only is compared with every seed of the other: :func:`workbench.figures.seeds.seed_diff`). Shown:
    combined is best and its interval against the runner-up is above 0; partly: combined is best within the noise,
    or another schedule is ahead within the noise; not shown: another schedule is ahead beyond the noise.
    """
    from workbench.figures.seeds import fmt_seed_diff, seed_diff, seeds_of

    c = seeds["correct"].transpose("arm", "seed", "sample")
    acc = {str(a): float(np.nanmean(c.sel(arm=a).mean("sample").values)) for a in c.arm.values}
    n = {a: seeds_of(seeds, a) for a in acc}
    best = max(acc, key=acc.get)
    second = max((k for k in acc if k != "combined"), key=acc.get)
    d = seed_diff(c.sel(arm="combined").values, c.sel(arm=second).values)
    when = "after distillation" if not int(seeds.attrs.get("finetune_epochs", 0)) else "after distillation + finetuning"
    stat = (", ".join(f"{k} {100 * v:.1f}% ({n[k]} seed{'s' * (n[k] > 1)})" for k, v in acc.items()) + f" {when}, "
            f"mean over seeds; combined − {second} {fmt_seed_diff(d)}")
    if best == "combined" and d.low > 0:
        return Verdict("shown", stat)
    if best == "combined":
        return Verdict("partly", stat, f"combined is best, but not ahead of {second} beyond the noise of seeds and "
                                       "images")
    if d.high >= 0:
        return Verdict("partly", stat, f"{second} is ahead of combined on average, within the noise of seeds and images")
    return Verdict("not shown", stat, f"{second} beats the combined schedule beyond the noise of seeds and images")


def retention_verdict(ds: xr.Dataset) -> Verdict:
    """Structured pruning keeps very different shares of units across depth and direction (§3.3, Fig. 4).

    The spread is the range of the kept share over (layer, direction), head-averaged; deterministic for one trained
    model (no image noise). Shown: a range of at least 20 points; partly: 5–20 points; not shown: under 5.
    """
    r = ds["retention"].mean("head")
    spread = float(r.max() - r.min())
    by_dir = {str(d): float(r.sel(direction=d).mean()) for d in r["direction"].values}
    by_layer = r.mean("direction").values
    stat = (f"kept share {100 * float(r.min()):.0f}–{100 * float(r.max()):.0f}% over (layer, direction), range "
            f"{100 * spread:.0f} points; per layer {', '.join(f'{100 * v:.0f}' for v in by_layer)}%; "
            + ", ".join(f"{k} {100 * v:.0f}%" for k, v in by_dir.items()))
    if spread >= 0.2:
        return Verdict("shown", stat)
    if spread >= 0.05:
        return Verdict("partly", stat, "the kept share varies across layers and directions, but by less than 20 points")
    return Verdict("not shown", stat, "every layer and direction keeps about the same share")


def latency_ratio_interval(ratio_runs: str, level: float = 0.95) -> tuple[float, float, float, int]:
    """(geometric mean, low, high, runs) of per-run latency ratios ``"r1,r2,..."`` (one model / DeiT in the same
    round-robin run: paired): a t interval on the log ratios over the runs; NaN bounds with fewer than 2 runs."""
    from scipy import stats

    logs = np.log([float(v) for v in str(ratio_runs).split(",") if v.strip()])
    n = len(logs)
    if n == 0:
        return float("nan"), float("nan"), float("nan"), 0
    mean = float(logs.mean())
    if n < 2:
        return float(np.exp(mean)), float("nan"), float("nan"), n
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * logs.std(ddof=1) / np.sqrt(n))
    return float(np.exp(mean)), float(np.exp(mean - half)), float(np.exp(mean + half)), n


def table2_verdict(ds: xr.Dataset) -> Verdict:
    """Pruned FAR (FAR†) needs fewer MACs and less CPU time than its DeiT at real size (Table 2: FAR-Tiny† −13.6 %
    MACs at 224², −32.6 % MACs and 13.4 % faster at 384²), per (variant, size) family measured.

    MACs are exact counts. Latency is judged at 384² only (at 224² the paper's own FAR-Tiny† and -Base† are slower
    than DeiT), by FAR†'s time over DeiT's in each round-robin run (paired: a load change hits both alike) with a 95 %
    t interval over the runs (:func:`latency_ratio_interval`): faster when the whole interval is below 1. Shown:
    fewer MACs everywhere and faster at every 384² family; partly: fewer MACs everywhere but not faster beyond the
    run-to-run noise (or 384² not measured); not shown: not even fewer MACs.
    """
    from workbench.xrutils import dataset_rows

    rows = [r for r in dataset_rows(ds) if r.get("family") != "demo"]
    fams: dict[str, dict[str, dict]] = {}
    for r in rows:
        kind = "FAR†" if str(r["model"]).endswith("†") else str(r["model"]).split("-")[0]
        fams.setdefault(str(r["family"]), {})[kind] = r
    parts, macs_ok, fast = [], [], {}
    for fam, k in fams.items():
        if "DeiT" not in k or "FAR†" not in k:
            continue
        mr = float(k["FAR†"]["gmacs"]) / float(k["DeiT"]["gmacs"])
        macs_ok.append(mr < 1)
        if int(k["DeiT"]["size"]) < 384:  # the paper claims the speed-up at 384² (at 224² its FAR† is slower)
            parts.append(f"{fam}: MACs {mr:.2f}×")
            continue
        g, lo, hi, n = latency_ratio_interval(k["FAR†"].get("ratio_runs", ""))
        ci = f" ({lo:.2f} … {hi:.2f}, {n} runs)" if n >= 2 else f" ({n} run: no interval)"
        parts.append(f"{fam}: MACs {mr:.2f}×, latency {g:.2f}×{ci}")
        fast[fam] = "faster" if hi < 1 else "slower" if lo > 1 else "tie"  # NaN bounds (one run): a tie
    if not parts:
        return Verdict("not shown", "no DeiT / FAR† pair in the data", "the table lacks the rows the claim compares")
    stat = "FAR† / DeiT — " + "; ".join(parts) + " (latency: per-run paired ratios, 95 % t interval over the runs)"
    if not all(macs_ok):
        return Verdict("not shown", stat, "FAR† does not need fewer MACs than DeiT everywhere")
    if not fast:
        return Verdict("partly", stat, "FAR† needs fewer MACs everywhere; latency at 384², where the paper claims the "
                                       "speed-up, is not measured in this profile")
    if all(v == "faster" for v in fast.values()):
        return Verdict("shown", stat)
    other = ", ".join(f"{f} {v}" for f, v in fast.items() if v != "faster")
    return Verdict("partly", stat, f"FAR† needs fewer MACs everywhere but is not faster than DeiT beyond the run-to-run "
                                   f"noise at every 384² size ({other}; PyTorch eager LSTMs on this CPU)")
