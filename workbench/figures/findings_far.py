"""Verdicts of the FAR items' findings (papers/000), computed from the items' own Datasets (no torch, no runs).

Each ``*_verdict(*datasets) -> Verdict`` is the ``test`` of a :class:`~workbench.figures.Finding` registered in
:mod:`workbench.figures.far`; noise is the spread over the held-out / analysis images (normal intervals of a
mean over images, binomial intervals of accuracies, :mod:`workbench.stats`).
"""

from __future__ import annotations

import math

import numpy as np
import xarray as xr

from workbench.figures import Verdict
from workbench.stats import diff_interval, paired_diff_interval, z_for

__all__ = ["agreement_headline", "agreement_verdict", "table1_verdict", "table3_verdict", "retention_verdict",
           "diagonal_verdict", "diagonal_share", "cls_verdict", "table2_verdict"]


def _mean_ci(values: np.ndarray) -> tuple[float, float, float]:
    """Mean over images and its 95% normal interval (``values``: one per image)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan
    half = z_for() * v.std(ddof=1) / math.sqrt(v.size) if v.size > 1 else math.inf
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def _per_layer(ds: xr.Dataset, view: str, model: str, metric: str = "spearman") -> dict[int, tuple[float, float, float]]:
    da = ds[metric].sel(view=view, model=model)
    return {int(layer): _mean_ci(da.sel(layer=layer).values) for layer in da["layer"].values
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


def table1_verdict(ds: xr.Dataset) -> Verdict:
    """FAR and FAR† keep the teacher's top-1: neither is worse than the teacher beyond the binomial noise.

    Unpaired intervals over the held-out images (the runs store accuracies, not per-image predictions: conservative
    for models that err on the same images). Shown: neither worse beyond noise; partly: one of the two; not shown: both.
    """
    rows = {str(k): i for i, k in enumerate(ds["kind"].values)}
    acc = {k: float(ds["val_acc"].values[i]) for k, i in rows.items()}
    n = int(ds["val_images"].values[rows["FAR"]])
    far, pruned = _delta(acc["FAR"], acc["DeiT"], n), _delta(acc["FAR†"], acc["DeiT"], n)
    stat = f"FAR − teacher {far[3]}; FAR† − teacher {pruned[3]}; {n} held-out images"
    worse = [name for name, d in (("FAR", far), ("FAR†", pruned)) if d[2] < 0]
    if not worse:
        return Verdict("shown", stat)
    if len(worse) == 1:
        return Verdict("partly", stat, f"{worse[0]} is below the teacher beyond the binomial noise")
    return Verdict("not shown", stat, "FAR and FAR† are both below the teacher beyond the binomial noise")


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


def diagonal_share(ds: xr.Dataset, model: str, layer: int, width: int = 1) -> np.ndarray:
    """Per image: the share of each patch query's (row-normalised, head-averaged) map on keys at most ``width``
    positions from it in the token sequence (the near-diagonal band of the T×T heatmap), mean over patch queries."""
    m = ds["map"].sel(model=model, layer=layer).mean("head")  # (sample, query, key)
    patch_q = ds["key_kind"].values[ds["query"].values] == "patch" if "key_kind" in ds.coords else \
        np.ones(ds.sizes["query"], bool)
    patch_k = ds["key_kind"].values == "patch" if "key_kind" in ds.coords else np.ones(ds.sizes["key"], bool)
    v = np.abs(m.values)[:, patch_q][:, :, patch_k].astype(float)  # (sample, patch queries, patch keys)
    v = v / np.clip(v.sum(-1, keepdims=True), 1e-30, None)
    q = ds["query"].values[patch_q][:, None]
    k = ds["key"].values[patch_k][None, :]
    band = np.abs(q - k) <= width
    return (v * band).sum(-1).mean(-1)


def diagonal_verdict(layer_of):
    """FAR's dependency is more concentrated near the diagonal (self and neighbouring tokens) than the teacher's
    attention (§4.3, Fig. 6; App. C.2, Fig. 12–14), in the block ``layer_of(ds)``; paired over the analysis images.

    Shown: FAR saliency's near-diagonal share exceeds the teacher attention's beyond noise; not shown: not above it
    beyond noise (with fewer than 3 images no interval exists: then 'partly' when it is larger on every image).
    """

    def test(ds: xr.Dataset) -> Verdict:
        layer = int(layer_of(ds))
        far, att = diagonal_share(ds, "FAR saliency", layer), diagonal_share(ds, "teacher attention", layer)
        band = 3 / ds.sizes["key"]  # a uniform row's share of the band (3 keys of T)
        stat = (f"block {layer}: share of each row on itself and its sequence neighbours — FAR saliency "
                f"{100 * far.mean():.0f}%, teacher attention {100 * att.mean():.0f}% (uniform ≈ {100 * band:.0f}%)")
        if far.size >= 3:
            lo, hi = paired_diff_interval(far, att)
            stat += f"; difference {100 * (far.mean() - att.mean()):+.0f} points (95% CI {100 * lo:+.0f} … {100 * hi:+.0f}, "
            stat += f"{far.size} images)"
            if lo > 0:
                return Verdict("shown", stat)
            return Verdict("not shown", stat, "FAR's near-diagonal share is not above the teacher attention's beyond noise")
        stat += f" ({far.size} images: too few for an interval)"
        if (far > att).all():
            return Verdict("partly", stat, "larger on every image, but too few images to tell it from noise")
        return Verdict("not shown", stat, "FAR's near-diagonal share is not above the teacher attention's")

    return test


def cls_verdict(layer_of):
    """FAR's CLS saliency focuses where the teacher's CLS attention does (§4.3, Fig. 5; App. C.1, Fig. 9–11): Pearson
    r over the patches of the head-averaged maps, per image, in the block ``layer_of(ds)``.

    Shown: the mean r is at least 0.5 and above zero beyond noise (normal interval over the images); partly: above
    zero beyond noise but below 0.5; not shown: within noise of zero or below (with fewer than 3 images: 'partly'
    at best, when r > 0 on every image).
    """

    def test(ds: xr.Dataset) -> Verdict:
        layer = int(layer_of(ds))
        t = ds["cls_map"].sel(model="teacher attention", layer=layer).mean("head")
        f = ds["cls_map"].sel(model="FAR saliency", layer=layer).mean("head")
        r = []
        for s in ds["sample"].values:
            a, b = t.sel(sample=s).values.ravel(), f.sel(sample=s).values.ravel()
            ok = np.isfinite(a) & np.isfinite(b)
            r.append(float(np.corrcoef(a[ok], b[ok])[0, 1]) if ok.sum() > 2 and a[ok].std() and b[ok].std() else np.nan)
        r = np.array(r)
        mean, lo, hi = _mean_ci(r)
        stat = f"block {layer}: Pearson r of FAR's CLS saliency with the teacher's CLS attention over the patches, " \
               f"{mean:.2f} (per image {', '.join(f'{v:.2f}' for v in r)})"
        if np.isfinite(r).sum() < 3:
            stat += f" ({np.isfinite(r).sum()} images: too few for an interval)"
            if np.isfinite(r).all() and (r > 0).all():
                return Verdict("partly", stat, "positive on every image, but too few images to tell it from noise")
            return Verdict("not shown", stat, "FAR's CLS map does not follow the teacher's attention")
        stat += f", 95% CI {lo:.2f} … {hi:.2f} over {np.isfinite(r).sum()} images"
        if lo > 0 and mean >= 0.5:
            return Verdict("shown", stat)
        if lo > 0:
            return Verdict("partly", stat, "FAR's CLS map follows the teacher's attention above noise, but weakly (r < 0.5)")
        return Verdict("not shown", stat, "FAR's CLS map is not correlated with the teacher's attention beyond noise")

    return test


def table2_verdict(ds: xr.Dataset) -> Verdict:
    """Pruned FAR (FAR†) needs fewer MACs and less CPU time than its DeiT at real size (Table 2: FAR-Tiny† −13.6 %
    MACs at 224², −32.6 % MACs and 13.4 % faster at 384²), per (variant, size) family measured.

    MACs are exact counts; latency is one median of round-robin runs per model (no interval: a ratio within 5 % of 1
    counts as no difference), judged at 384² only (at 224² the paper's own FAR-Tiny† and -Base† are slower than
    DeiT). Shown: FAR† below DeiT in MACs everywhere and faster at the largest size; partly: fewer MACs
    everywhere but not faster; not shown: not even fewer MACs.
    """
    from workbench.xrutils import dataset_rows

    rows = [r for r in dataset_rows(ds) if r.get("family") != "demo"]
    fams: dict[str, dict[str, dict]] = {}
    for r in rows:
        kind = "FAR†" if str(r["model"]).endswith("†") else str(r["model"]).split("-")[0]
        fams.setdefault(str(r["family"]), {})[kind] = r
    parts, macs_ok, ms_ok = [], [], []
    for fam, k in fams.items():
        if "DeiT" not in k or "FAR†" not in k:
            continue
        mr = float(k["FAR†"]["gmacs"]) / float(k["DeiT"]["gmacs"])
        tr = float(k["FAR†"]["ms"]) / float(k["DeiT"]["ms"])
        parts.append(f"{fam}: MACs {mr:.2f}×, latency {tr:.2f}×")
        macs_ok.append(mr < 1)
        if int(k["DeiT"]["size"]) >= 384:  # the paper claims the speed-up at 384² (at 224² its FAR† is slower)
            ms_ok.append(tr < 0.95)
    if not parts:
        return Verdict("not shown", "no DeiT / FAR† pair in the data", "the table lacks the rows the claim compares")
    stat = "FAR† / DeiT — " + "; ".join(parts) + " (latency: one median each, ±5 % counted as no difference)"
    if all(macs_ok) and ms_ok and all(ms_ok):
        return Verdict("shown", stat)
    if all(macs_ok) and not ms_ok:
        return Verdict("partly", stat, "FAR† needs fewer MACs everywhere; latency at 384², where the paper claims the "
                                       "speed-up, is not measured in this profile")
    if all(macs_ok):
        return Verdict("partly", stat, "FAR† needs fewer MACs everywhere but is not faster than DeiT at 384² "
                                       "(PyTorch eager LSTMs on this CPU)")
    return Verdict("not shown", stat, "FAR† does not need fewer MACs than DeiT everywhere")
