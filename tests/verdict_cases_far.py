"""Verdict cases of FAR's findings (tests/test_verdict_rules.py): small hand-built ``far.*`` Datasets that drive each
rule to every verdict, with cases on both sides of each threshold.

Token-map cases build ``far.maps``-shaped Datasets (3 models × 8 images × 6 blocks × 4 heads, 7×7 patches + CLS)
whose per-image statistic is set exactly by construction (a near-diagonal share, a Pearson r, a first-row share, an
entropy), so a case sits where its name says; the rules' intervals are Student t over the 8 images.
"""

from __future__ import annotations

import math

import numpy as np
import xarray as xr
from test_verdict_rules import Case

from workbench.analysis.tokens import query_key_coords

MODELS = ("teacher attention", "teacher saliency", "FAR saliency")
N, LAYERS, HEADS, GRID = 8, 6, 4, 7
P = GRID * GRID
SPREAD = np.array([-1.5, -1.0, -0.5, -0.2, 0.2, 0.5, 1.0, 1.5])  # per-image deviations (sd ≈ 1.0, mean 0)
T = 2.365 * SPREAD.std(ddof=1) / math.sqrt(N)  # half-width of the t interval per unit of spread (≈ 0.85)


def _band_rows(share: float) -> np.ndarray:
    """A (patches × patches) map whose every row puts exactly ``share`` on keys at most 1 position away."""
    q, k = np.arange(P)[:, None], np.arange(P)[None, :]
    band = np.abs(q - k) <= 1
    b = band.sum(1, keepdims=True)
    x = (share * P - b) / (b * (1 - share))  # boost of a band cell over 1: b(1+x) / (P + b x) = share
    return 1.0 + band * x


def _cls_pattern(rng, corr: float, base: np.ndarray) -> np.ndarray:
    """A CLS map (patches,) whose Pearson r with ``base`` is exactly ``corr`` (positive everywhere)."""
    u = (base - base.mean()) / np.linalg.norm(base - base.mean())
    v = rng.standard_normal(P)
    v -= v.mean()
    v -= (v @ u) * u
    v /= np.linalg.norm(v)
    return 10.0 + corr * u + math.sqrt(max(0.0, 1 - corr ** 2)) * v


def _top_rows(share: float) -> np.ndarray:
    """A CLS map (patches,) with exactly ``share`` of its mass on the first row of the grid."""
    m = np.ones(P)
    m[:GRID] = (P - GRID) * share / (GRID * (1 - share))
    return m


def _peaked(entropy: float) -> np.ndarray:
    """A CLS map (patches,) whose normalised entropy is ``entropy`` (one patch raised over a flat rest)."""
    def h(w):
        p = np.ones(P)
        p[0] = w
        p /= p.sum()
        return -(p * np.log(p)).sum() / math.log(P)

    lo, hi = 1.0, 1e6
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if h(mid) > entropy else (lo, mid)
    m = np.ones(P)
    m[0] = lo
    return m


def maps(cls: dict | None = None, band: dict | None = None) -> xr.Dataset:
    """A ``far.maps`` Dataset: ``cls[model](layer, image) -> CLS map (patches,)``, ``band[model](layer) -> per-image
    near-diagonal shares`` (default: a flat CLS map, a 10 % band)."""
    full = np.ones((len(MODELS), N, LAYERS, HEADS, P + 1, P + 1))
    cmap = np.ones((len(MODELS), N, LAYERS, HEADS, P))
    for i, m in enumerate(MODELS):
        for la in range(LAYERS):
            shares = (band or {}).get(m, lambda _: np.full(N, 0.1))(la)
            for s in range(N):
                full[i, s, la, :, 1:, 1:] = _band_rows(float(shares[s]))
                if cls and m in cls:
                    cmap[i, s, la] = cls[m](la, s)
    full[:, :, :, :, 0, 1:] = cmap
    ds = xr.Dataset({"map": (("model", "sample", "layer", "head", "query", "key"), full),
                     "cls_map": (("model", "sample", "layer", "head", "y", "x"),
                                 cmap.reshape(len(MODELS), N, LAYERS, HEADS, GRID, GRID))},
                    coords={"model": list(MODELS), "sample": np.arange(N) + 100, "layer": np.arange(LAYERS),
                            "head": np.arange(HEADS), "y": np.arange(GRID), "x": np.arange(GRID),
                            **query_key_coords(["cls"], (GRID, GRID))})
    return ds.assign_coords(measure=("model", ["attention", "saliency", "saliency"]),
                            units=("model", ["probability", "gradient norm", "gradient norm"]))


# ------------------------------------------------------------------------------------ diagonal (fig6, 12–14)
def _diag(far_lead: float, att_lead: float, layer: int | None = None):
    """FAR's band share = teacher saliency's + ``far_lead`` (per image ± spread 0.02) and = teacher attention's +
    ``att_lead``, in ``layer`` (all layers when None)."""
    sal = 0.20
    dev = 0.02 * SPREAD

    def per(m):
        def f(la):
            if layer is not None and la != layer:
                return np.full(N, 0.1)
            far = sal + far_lead + dev
            return {"FAR saliency": far, "teacher saliency": np.full(N, sal),
                    "teacher attention": far - att_lead - dev}[m]
        return f

    return lambda: (maps(band={m: per(m) for m in MODELS}),)


def _diag_cases(layer: int) -> list[Case]:
    h = 0.02 * T  # the like-for-like interval's half-width
    return [Case("FAR ahead of the teacher's saliency beyond noise", _diag(0.15, 0.4, layer), "shown"),
            Case("lead just above its interval's half-width", _diag(h + 0.002, 0.4, layer), "shown"),
            Case("lead just below its half-width, ahead of attention", _diag(h - 0.002, 0.4, layer), "partly"),
            Case("tied with the teacher's saliency, attention just beaten", _diag(0.0, h + 0.002, layer), "partly"),
            Case("tied with the teacher's saliency and attention within noise", _diag(0.0, h - 0.002, layer),
                 "not shown"),
            Case("below the teacher's saliency", _diag(-0.1, -0.1, layer), "not shown")]


# ------------------------------------------------------------------------------------ CLS maps (fig5, 10, 11)
def _cls_r(r: float, layer: int, spread: float = 0.05):
    """FAR's CLS map has Pearson r = ``r`` (± ``spread`` per image) with the teacher's saliency in ``layer``."""
    rng = np.random.default_rng(0)
    bases = [rng.random(P) for _ in range(N)]

    def far(la, s):
        return _cls_pattern(np.random.default_rng(s), float(np.clip(r + spread * SPREAD[s], -1, 1)) if la == layer
                            else 0.0, bases[s])

    def teacher(la, s):
        return bases[s] + 1.0

    return lambda: (maps(cls={"FAR saliency": far, "teacher saliency": teacher, "teacher attention": teacher}),)


def _cls_cases(layer: int) -> list[Case]:
    h = 0.05 * T
    return [Case("r 0.8", _cls_r(0.8, layer), "shown"),
            Case("r just above 0.5", _cls_r(0.52, layer), "shown"),
            Case("r just below 0.5", _cls_r(0.48, layer), "partly"),
            Case("r just above its interval's half-width", _cls_r(h + 0.01, layer), "partly"),
            Case("r just below its interval's half-width", _cls_r(h - 0.01, layer), "not shown"),
            Case("r negative", _cls_r(-0.4, layer), "not shown")]


# ------------------------------------------------------------------------------------ left bias (fig9)
def _left(far_lead: float, entropy: float):
    """Block 0: FAR's first-row share = teacher saliency's (0.15) + ``far_lead`` (± 0.02 per image); the teacher
    attention's heads have normalised entropy ``entropy`` (± 0.01 per image)."""
    def far(la, s):
        return _top_rows(0.15 + far_lead + 0.02 * SPREAD[s])

    def att(la, s):
        return _peaked(entropy + 0.01 * SPREAD[s])

    return lambda: (maps(cls={"FAR saliency": far, "teacher saliency": lambda la, s: _top_rows(0.15),
                              "teacher attention": att}),)


_LH, _EH = 0.02 * T, 0.01 * T
FIG9 = [Case("FAR on the first row, DeiT spread evenly", _left(0.4, 0.97), "shown"),
        Case("FAR's lead just above noise, entropy interval just above 0.9", _left(_LH + 0.002, 0.9 + _EH + 0.002),
             "shown"),
        Case("FAR's lead just below noise, entropy spread", _left(_LH - 0.002, 0.97), "partly"),
        Case("FAR left-biased, entropy interval just below 0.9", _left(0.4, 0.9 + _EH - 0.002), "partly"),
        Case("no lead, DeiT peaked", _left(0.0, 0.6), "not shown"),
        Case("FAR below the teacher, entropy interval just below 0.9", _left(-0.05, 0.9 + _EH - 0.002), "not shown")]


# ------------------------------------------------------------------------------------ order bias
def _order(r_by_layer: dict[int, float], top_lead: float, spread: float = 0.05):
    """FAR's CLS map has r = ``r_by_layer[layer]`` (± ``spread``) with 1 / sequence distance; the teacher
    saliency's first-row share is FAR's minus ``top_lead`` (image by image, ± 0.01)."""
    inv = 1.0 / np.arange(1, P + 1)

    def far(la, s):
        return _cls_pattern(np.random.default_rng(s + 10 * la), float(np.clip(r_by_layer.get(la, 0.0)
                                                                               + spread * SPREAD[s], -1, 1)), inv)

    def sal(la, s):
        m = far(la, s)
        return _top_rows(m[:GRID].sum() / m.sum() - top_lead - 0.01 * SPREAD[s])

    return lambda: (maps(cls={"FAR saliency": far, "teacher saliency": sal, "teacher attention": sal}),)


_TH = 0.01 * T
ORDER = [Case("r 0.9 and a first-row lead in blocks 2–5", _order({2: 0.9, 3: 0.9, 4: 0.9, 5: 0.9}, 0.05), "shown"),
         Case("r just above 0.5 everywhere, lead just above noise", _order(dict.fromkeys(range(2, 6), 0.52),
                                                                         _TH + 0.002), "shown"),
         Case("r just below 0.5 in block 5 only", _order({2: 0.9, 3: 0.9, 4: 0.9, 5: 0.48}, 0.05), "partly"),
         Case("lead just below noise, r high", _order(dict.fromkeys(range(2, 6), 0.9), _TH - 0.002), "not shown"),
         Case("r 0.9 only in block 1 (not read)", _order({1: 0.9}, 0.05), "not shown"),
         Case("r just below 0.5 everywhere", _order(dict.fromkeys(range(6), 0.48), 0.05), "not shown")]


# ------------------------------------------------------------------------------------ agreement
def _agreement(far_by_layer: list[float], ceiling: float = 0.6, spread: float = 0.05):
    """far.agreement: FAR's ρ per layer (± ``spread`` per image), the teacher saliency's ρ ``ceiling``."""
    layers = len(far_by_layer)
    rho = np.empty((2, 2, N, layers))  # (view, model, sample, layer); like-for-like: only the headline reads it
    rho[:, 0] = ceiling
    rho[:, 1] = np.array(far_by_layer)[None, :] + spread * SPREAD[:, None]
    return lambda: (xr.Dataset({"spearman": (("view", "model", "sample", "layer"), rho)},
                               coords={"view": ["paper-style", "like-for-like"], "model": ["teacher saliency", "FAR saliency"],
                                       "sample": np.arange(N), "layer": np.arange(layers)}),)


_AH = 0.05 * T
AGREEMENT = [Case("FAR at 0.5 of the ceiling 0.6", _agreement([0.5, 0.5, 0.5]), "shown"),
             Case("upper end just above half the ceiling", _agreement([0.4, 0.3 - _AH + 0.005, 0.5]), "shown"),
             Case("upper end just below half the ceiling", _agreement([0.4, 0.3 - _AH - 0.005, 0.5]), "partly"),
             Case("lower end just above 0 in the weakest layer", _agreement([0.4, _AH + 0.005, 0.5]), "partly"),
             Case("lower end just below 0 in the weakest layer", _agreement([0.4, _AH - 0.005, 0.5]), "not shown"),
             Case("FAR negative everywhere", _agreement([-0.3, -0.3, -0.3]), "not shown")]


# ------------------------------------------------------------------------------------ tables and retention
def _runs(far_wrong: int, pruned_wrong: int, n: int = 1000, teacher_wrong: int = 50):
    """far.runs with per-image correctness: the teacher wrong on the first ``teacher_wrong`` images, FAR and FAR†
    wrong on those and on ``*_wrong`` more (negative: right on that many of the teacher's errors)."""
    def col(extra):
        c = np.ones(n, np.int8)
        c[:teacher_wrong] = 0
        if extra >= 0:
            c[teacher_wrong:teacher_wrong + extra] = 0
        else:
            c[:-extra] = 1
        return c

    correct = np.stack([col(0), col(far_wrong), col(pruned_wrong)])
    return lambda: (xr.Dataset({"kind": ("row", ["DeiT", "FAR", "FAR†"]), "val_acc": ("row", correct.mean(1)),
                                "val_images": ("row", [float(n)] * 3),
                                "correct": (("row", "heldout_sample"), correct)}, coords={"row": range(3)}),)


# k extra errors on 1000 images, all discordant one way: the paired interval is k/n ± 1.96·sd/√n; it excludes 0 from
# k = 4 on (k = 3: 0.003 − 1.96·0.0547/31.6 = −0.0004; k = 4: 0.004 − 1.96·0.0631/31.6 = +0.0001)
TABLE1 = [Case("FAR +2 points, FAR† tied", _runs(-20, 0), "shown"),
          Case("FAR 3 errors more (interval just reaches 0), FAR† tied", _runs(3, 0), "shown"),
          Case("FAR 4 errors more (just below beyond noise)", _runs(4, 0), "partly"),
          Case("FAR† 4 errors more, FAR 3", _runs(3, 4), "partly"),
          Case("both 4 errors more", _runs(4, 4), "not shown"),
          Case("both 30 errors more", _runs(30, 30), "not shown")]


def _retention(spread: float):
    kept = np.repeat(0.5 + spread * np.linspace(-0.5, 0.5, 6).reshape(3, 1, 2), 2, axis=1)  # (layer, head, direction)
    return lambda: (xr.Dataset({"retention": (("layer", "head", "direction"), kept)},
                               coords={"layer": [0, 1, 2], "head": [0, 1], "direction": ["forward", "reverse"]}),)


FIG4 = [Case("range 40 points", _retention(0.40), "shown"), Case("range 20.5 points", _retention(0.205), "shown"),
        Case("range 19.5 points", _retention(0.195), "partly"), Case("range 5.5 points", _retention(0.055), "partly"),
        Case("range 4.5 points", _retention(0.045), "not shown"), Case("no range", _retention(0.0), "not shown")]


def _table2(pruned_runs_384: tuple[float, ...], pruned_gmacs_224: float = 1.0, with_384: bool = True):
    """Rows of one tiny family; FAR†'s ms per round-robin run at 384² against DeiT's 100 ms in each run."""
    deit = (100.0,) * len(pruned_runs_384)
    recs = [("DeiT-Tiny", 224, 1.25, (26.0,) * 3, (26.0,) * 3), ("FAR-Tiny†", 224, pruned_gmacs_224, (31.0,) * 3,
                                                                 (26.0,) * 3)]
    if with_384:
        recs += [("DeiT-Tiny", 384, 4.6, deit, deit), ("FAR-Tiny†", 384, 3.1, pruned_runs_384, deit)]
    ratios = [",".join(f"{a / b:.5f}" for a, b in zip(r[3], r[4])) for r in recs] + [""]
    recs += [("demo ViT", 28, 0.01, (1.0,), (1.0,))]
    return lambda: (xr.Dataset({"model": ("row", [r[0] for r in recs]), "size": ("row", [r[1] for r in recs]),
                                "gmacs": ("row", [r[2] for r in recs]),
                                "ms": ("row", [float(np.median(r[3])) for r in recs]), "ratio_runs": ("row", ratios),
                                "family": ("row", [f"tiny-{r[1]}" if r[1] > 28 else "demo" for r in recs])},
                               coords={"row": range(len(recs))}),)


TABLE2 = [Case("fewer MACs, 15 % faster at 384² in every run", _table2((85.0, 86.0, 84.0)), "shown"),
          Case("3 % faster, runs within 1 %", _table2((97.0, 96.5, 97.5)), "shown"),
          Case("6 % faster by the median, runs spread over 1", _table2((80.0, 94.0, 108.0)), "partly"),
          Case("one run: no interval", _table2((85.0,)), "partly"),
          Case("slower beyond the noise", _table2((110.0, 111.0, 109.0)), "partly"),
          Case("fewer MACs, 384² not measured", _table2((), with_384=False), "partly"),
          Case("MACs ratio 1.01 at 224²", _table2((85.0, 86.0, 84.0), pruned_gmacs_224=1.2625), "not shown"),
          Case("MACs ratio 0.99 at 224², slower", _table2((120.0, 121.0, 119.0), pruned_gmacs_224=1.2375), "partly")]

CASES = {
    "far.fig4": FIG4,
    "far.fig5": _cls_cases(LAYERS - 1),
    "far.fig6": _diag_cases(LAYERS - 1),
    "far.fig9": FIG9,
    "far.fig10": _cls_cases(2),
    "far.fig11": _cls_cases(3),
    "far.fig12": _diag_cases(0),
    "far.fig13": _diag_cases(2),
    "far.fig14": _diag_cases(3),
    "far.agreement": AGREEMENT,
    "far.order_bias": ORDER,
    "far.table1": TABLE1,
    "far.table2": TABLE2,
}
