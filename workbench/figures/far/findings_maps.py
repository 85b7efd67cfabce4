"""Verdicts of FAR's token-map findings (papers/000 §4.3, App. C), from ``far.maps`` alone (no torch, no runs).

Like with like: FAR's maps are gradient saliency, so each rule compares them with the teacher's own gradient saliency
(the same quantity, w.r.t. the same block input); the teacher's attention, which the paper draws, is reported beside
it, labelled. Noise: every measure is taken per analysis image and compared paired over the images, with a Student t
interval (95 %) of the mean — the demo has 8 images, where a normal interval would be too narrow.

- :func:`diagonal_verdict` — Fig. 6, 12–14: share of each query row on itself and its sequence neighbours.
- :func:`cls_verdict` — Fig. 5, 10, 11: Pearson r of the head-averaged CLS maps over the patches.
- :func:`left_bias_verdict` — Fig. 9: FAR's CLS mass on the first patch row, and the spread of DeiT's CLS attention.
- :func:`order_bias_verdict` — ``far.order_bias``: FAR's CLS map against 1 / (distance along the token sequence).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import xarray as xr

from workbench.figures import Verdict

__all__ = ["mean_ci", "diagonal_share", "diagonal_verdict", "cls_r", "cls_verdict", "top_row_share",
           "head_entropy", "left_bias_verdict", "order_r", "order_bias_verdict", "FAR", "T_SAL", "T_ATT"]

FAR, T_SAL, T_ATT = "FAR saliency", "teacher saliency", "teacher attention"
MIN_IMAGES = 3  # fewer images give no interval: the rules then say "too few images" and give "partly" at best


def mean_ci(values) -> tuple[float, float, float]:
    """Mean of the finite ``values`` (one per image) and its 95 % Student t interval; NaNs with no finite value,
    an infinite interval with one."""
    from scipy.stats import t

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan
    if v.size == 1:
        return float(v[0]), -math.inf, math.inf
    half = float(t.ppf(0.975, v.size - 1)) * v.std(ddof=1) / math.sqrt(v.size)
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def _pts(x: float) -> str:
    return f"{100 * x:+.0f}"


def _diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float, str]:
    """Paired difference a − b over images (shares): mean, 95 % interval, and its wording in points."""
    m, lo, hi = mean_ci(np.asarray(a, float) - np.asarray(b, float))
    return m, lo, hi, f"{_pts(m)} points (95% CI {_pts(lo)} … {_pts(hi)})"


# --------------------------------------------------------------------------------------------- diagonal
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


def diagonal_verdict(layer_of: Callable[[xr.Dataset], int]):
    """FAR's dependency is more concentrated on itself and its sequence neighbours than the teacher's, in block
    ``layer_of(ds)``: FAR saliency's near-diagonal share against the teacher *saliency*'s, paired over the images.

    Shown: FAR's share exceeds the teacher saliency's beyond noise; partly: not beyond noise like for like, but
    above the teacher attention's beyond noise (the paper's comparison, across two measures); not shown: neither.
    With fewer than 3 images (no interval): 'partly' at best, when FAR's share is the larger on every image.
    """

    def test(ds: xr.Dataset) -> Verdict:
        layer = int(layer_of(ds))
        far, sal, att = (diagonal_share(ds, m, layer) for m in (FAR, T_SAL, T_ATT))
        band = 3 / ds.sizes["key"]  # a uniform row's share of the band (3 keys of T)
        stat = (f"block {layer}: share of each patch row on itself and its sequence neighbours — FAR saliency "
                f"{100 * far.mean():.0f}%, teacher saliency {100 * sal.mean():.0f}% (like for like), teacher attention "
                f"{100 * att.mean():.0f}% (the paper's reference; uniform ≈ {100 * band:.0f}%)")
        if far.size < MIN_IMAGES:
            stat += f" ({far.size} images: too few for an interval)"
            if (far > sal).all():
                return Verdict("partly", stat, "larger than the teacher saliency's on every image, but too few images")
            return Verdict("not shown", stat, "FAR's near-diagonal share is not above the teacher saliency's")
        like, paper = _diff(far, sal), _diff(far, att)
        stat += (f"; FAR − teacher saliency {like[3]}, FAR − teacher attention {paper[3]}, paired over "
                 f"{far.size} images")
        if like[1] > 0:
            return Verdict("shown", stat)
        if paper[1] > 0:
            return Verdict("partly", stat, "above the teacher's attention, but not above the teacher's own saliency "
                                           "beyond noise: the band comes with the measure, not with FAR")
        return Verdict("not shown", stat, "FAR's near-diagonal share is not above the teacher's beyond noise")

    return test


# --------------------------------------------------------------------------------------------- CLS maps
def _cls(ds: xr.Dataset, model: str, layer: int) -> np.ndarray:
    """Head-averaged CLS map, (sample, patches in sequence order: the (y, x) grid row-major)."""
    da = ds["cls_map"].sel(model=model, layer=layer).mean("head").transpose("sample", "y", "x")
    return np.abs(da.values.reshape(da.sizes["sample"], -1).astype(float))


def _pearson_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson r of every row of ``a`` with the same row of ``b`` (NaN where either row is constant)."""
    r = []
    for x, y in zip(np.broadcast_to(a, np.broadcast_shapes(a.shape, b.shape)),
                    np.broadcast_to(b, np.broadcast_shapes(a.shape, b.shape))):
        ok = np.isfinite(x) & np.isfinite(y)
        good = ok.sum() > 2 and x[ok].std() > 0 and y[ok].std() > 0
        r.append(float(np.corrcoef(x[ok], y[ok])[0, 1]) if good else math.nan)
    return np.array(r)


def cls_r(ds: xr.Dataset, model: str, reference: str, layer: int) -> np.ndarray:
    """Per image: Pearson r over the patches of two models' head-averaged CLS maps in ``layer``."""
    return _pearson_rows(_cls(ds, model, layer), _cls(ds, reference, layer))


def cls_verdict(layer_of: Callable[[xr.Dataset], int], threshold: float = 0.5):
    """FAR's CLS map has the spatial layout of the teacher's (Fig. 5, 10, 11): per image, Pearson r over the patches
    of FAR's and the teacher's head-averaged CLS *saliency* in block ``layer_of(ds)`` (FAR vs the teacher's attention
    and the teacher's saliency vs its attention, the ceiling of a perfect copy, reported beside).

    Shown: mean r ≥ ``threshold`` and above zero beyond noise; partly: above zero beyond noise but below
    ``threshold``; not shown: within noise of zero or below (fewer than 3 images: 'partly' at best, r > 0 on each).
    """

    def test(ds: xr.Dataset) -> Verdict:
        layer = int(layer_of(ds))
        r = cls_r(ds, FAR, T_SAL, layer)
        att, ceil = cls_r(ds, FAR, T_ATT, layer), cls_r(ds, T_SAL, T_ATT, layer)
        mean, lo, hi = mean_ci(r)
        n = int(np.isfinite(r).sum())
        stat = (f"block {layer}: Pearson r of FAR's and the teacher's CLS saliency over the patches {mean:.2f} "
                f"(per image {', '.join(f'{v:.2f}' for v in r)})")
        tail = (f"; beside it FAR saliency vs teacher attention r {np.nanmean(att):.2f}, teacher saliency vs its "
                f"attention {np.nanmean(ceil):.2f}")
        if n < MIN_IMAGES:
            stat += f" ({n} images: too few for an interval)" + tail
            if n and n == r.size and (r > 0).all():
                return Verdict("partly", stat, "positive on every image, but too few images to tell it from noise")
            return Verdict("not shown", stat, "FAR's CLS map does not follow the teacher's")
        stat += f", 95% CI {lo:.2f} … {hi:.2f} over {n} images" + tail
        if lo > 0 and mean >= threshold:
            return Verdict("shown", stat)
        if lo > 0:
            return Verdict("partly", stat, f"FAR's CLS map follows the teacher's above noise, but weakly (r < {threshold})")
        return Verdict("not shown", stat, "FAR's CLS map is not correlated with the teacher's beyond noise")

    return test


def top_row_share(ds: xr.Dataset, model: str, layer: int) -> np.ndarray:
    """Per image: the share of the head-averaged CLS map on the first patch row — the patches right after CLS in
    the token sequence (the paper's "top-left region (neighboring tokens)")."""
    v = ds["cls_map"].sel(model=model, layer=layer).mean("head").transpose("sample", "y", "x").values
    v = np.abs(v.astype(float))
    return v[:, 0, :].sum(-1) / np.clip(v.sum((-2, -1)), 1e-30, None)


def head_entropy(ds: xr.Dataset, model: str, layer: int) -> np.ndarray:
    """Per image: each head's CLS-map entropy over the patches divided by log(patches) (1 = uniform), head mean."""
    v = np.abs(ds["cls_map"].sel(model=model, layer=layer).transpose("sample", "head", "y", "x").values.astype(float))
    p = v.reshape(*v.shape[:2], -1)
    p = p / np.clip(p.sum(-1, keepdims=True), 1e-30, None)
    h = -(p * np.log(np.where(p > 0, p, 1))).sum(-1) / math.log(p.shape[-1])
    return h.mean(-1)


def left_bias_verdict(layer_of: Callable[[xr.Dataset], int], uniform: float = 0.9):
    """Fig. 9: in the shallow block FAR's CLS attribution sits on the first tokens of the sequence (the top patch
    row), while DeiT's CLS attention is spread evenly.

    (a) left bias, like for like: FAR's top-row share of its CLS saliency minus the teacher saliency's, paired over
    the images, above zero beyond noise; (b) uniform spread: the lower end of the interval of the teacher attention's
    normalised entropy (per head, head mean) at least ``uniform`` (0.9: the heads spread over ≥ 49^0.9 ≈ 33 of 49
    patches). Shown: both; partly: one; not shown: neither. Fewer than 3 images: no interval, neither holds.
    """

    def test(ds: xr.Dataset) -> Verdict:
        layer = int(layer_of(ds))
        far, sal, att = (top_row_share(ds, m, layer) for m in (FAR, T_SAL, T_ATT))
        ent = mean_ci(head_entropy(ds, T_ATT, layer))
        rows = ds.sizes["y"]
        like = _diff(far, sal) if far.size >= MIN_IMAGES else (far.mean() - sal.mean(), -math.inf, math.inf,
                                                                "(too few images for an interval)")
        stat = (f"block {layer}: CLS mass on the first patch row — FAR saliency {100 * far.mean():.0f}%, teacher "
                f"saliency {100 * sal.mean():.0f}%, teacher attention {100 * att.mean():.0f}% (uniform "
                f"{100 / rows:.0f}%); FAR − teacher saliency {like[3]}; teacher attention's normalised entropy "
                f"{ent[0]:.2f} (95% CI {ent[1]:.2f} … {ent[2]:.2f}; 1 = uniform), {far.size} images")
        biased, spread = like[1] > 0, ent[1] >= uniform
        if biased and spread:
            return Verdict("shown", stat)
        if biased:
            return Verdict("partly", stat, f"FAR is left-biased, but DeiT's CLS attention is not evenly spread "
                                           f"(entropy interval below {uniform})")
        if spread:
            return Verdict("partly", stat, "DeiT's CLS attention is evenly spread, but FAR's CLS map is not on the "
                                           "first tokens more than the teacher's saliency beyond noise")
        return Verdict("not shown", stat, "neither FAR's left bias nor DeiT's even spread is there beyond noise")

    return test


# --------------------------------------------------------------------------------------------- order bias
def order_r(ds: xr.Dataset, model: str, layer: int) -> np.ndarray:
    """Per image: Pearson r of the head-averaged CLS map with 1 / (distance from CLS along the token sequence),
    the patch at sequence position i (1 = right after CLS, row-major) weighing 1 / i."""
    v = _cls(ds, model, layer)  # (sample, patches)
    return _pearson_rows(v, 1.0 / np.arange(1, v.shape[1] + 1)[None, :])


def order_blocks(ds: xr.Dataset, first: int) -> list[int]:
    """The blocks the order-bias claim is read in: from ``first`` to the last."""
    return [int(v) for v in ds["layer"].values if int(v) >= first]


def order_bias_verdict(first_of: Callable[[xr.Dataset], int], r_min: float = 0.5):
    """``far.order_bias``: FAR's CLS map is ordered by the distance along the token sequence in the blocks where
    App. C expects the sequential bias gone (from block ``first_of(ds)``, the paper's intermediate depth, on).

    A block is order-dominated when (a) the mean r of FAR's CLS saliency with 1 / sequence distance is at least
    ``r_min`` with its interval above zero, and (b) FAR's top-row share exceeds the teacher saliency's beyond noise
    (paired). Shown: every block read is order-dominated; partly: some; not shown: none (fewer than 3 images: none).
    """

    def test(ds: xr.Dataset) -> Verdict:
        blocks = order_blocks(ds, int(first_of(ds)))
        parts, hit = [], []
        for b in blocks:
            r = mean_ci(order_r(ds, FAR, b))
            tr = mean_ci(order_r(ds, T_SAL, b))[0]
            far, sal = top_row_share(ds, FAR, b), top_row_share(ds, T_SAL, b)
            d = _diff(far, sal) if far.size >= MIN_IMAGES else (math.nan, -math.inf, math.inf, "(too few images)")
            ok = r[0] >= r_min and r[1] > 0 and d[1] > 0 and far.size >= MIN_IMAGES
            hit.append(ok)
            parts.append(f"block {b}: r {r[0]:.2f} (95% CI {r[1]:.2f} … {r[2]:.2f}; teacher saliency {tr:.2f}), "
                         f"top row {100 * far.mean():.0f}% vs teacher saliency {100 * sal.mean():.0f}%, {d[3]}")
        n = int(ds.sizes["sample"])
        stat = ("FAR's CLS saliency vs 1 / distance along the token sequence — " + "; ".join(parts)
                + f" ({n} images, paired)")
        if blocks and all(hit):
            return Verdict("shown", stat)
        if any(hit):
            return Verdict("partly", stat, "order-dominated in block(s) "
                           f"{[b for b, h in zip(blocks, hit) if h]} only")
        return Verdict("not shown", stat, f"in no block from {blocks[0] if blocks else '–'} on is FAR's CLS map "
                                          "ordered by sequence distance beyond noise")

    return test
