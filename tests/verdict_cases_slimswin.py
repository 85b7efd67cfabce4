"""Verdict cases of the SlimSwin items (tests/test_verdict_rules.py): small hand-built Datasets in the layout of
:mod:`workbench.figures.slimswin.items`'s data (``window_saliency`` pairs, the FLOPs breakdown, Table I's rows), each
changed to push a rule to one side of a threshold."""

from __future__ import annotations

import numpy as np
import xarray as xr
from test_verdict_rules import Case

# ------------------------------------------------------------------------------------ masks (figs. 2, 6, 7)
WINDOWS, HEADS = 4, 6  # every prunable test layer: 24 window-head pairs
SHARE = {0.2: 4, 0.4: 8, 0.6: 12, 0.8: 16}  # a layer's pruned share -> pruned pairs of its 24


def _pairs(layers: int) -> dict:
    """Pair coords of ``layers`` prunable layers of WINDOWS x HEADS plus a last, unprunable one-window layer."""
    layer, window, head = [], [], []
    for lay in range(layers):
        for w in range(WINDOWS):
            for h in range(HEADS):
                layer.append(lay), window.append(w), head.append(h)
    for h in range(12):
        layer.append(layers), window.append(0), head.append(h)
    return {"layer": ("pair", layer), "window": ("pair", window), "head": ("pair", head),
            "prunable": ("pair", [int(lay < layers) for lay in layer]), "stage": ("pair", [lay // 2 for lay in layer])}


def _masks(tables: dict[float, list[np.ndarray]]) -> xr.Dataset:
    """ratio -> one keep table (WINDOWS, HEADS) per prunable layer; the last layer kept whole."""
    layers = len(next(iter(tables.values())))
    rows = [np.r_[np.concatenate([t.reshape(-1) for t in ts]), np.ones(12)] for ts in tables.values()]
    return xr.Dataset({"mask": (("ratio", "pair"), np.array(rows, dtype=int))},
                      coords={"ratio": list(tables), "pair": np.arange(len(rows[0])), **_pairs(layers)})


def _first(k: int) -> np.ndarray:
    """A keep table with the first ``k`` pairs pruned in (window, head) order (windows differ in their heads)."""
    t = np.ones(WINDOWS * HEADS)
    t[:k] = 0
    return t.reshape(WINDOWS, HEADS)


def _by_share(shares: list[float]) -> list[np.ndarray]:
    return [_first(SHARE[s]) for s in shares]


def _trend(low: list[float], high: list[float]):
    """Layer shares (by depth) at r = 1/3 and r = 2/3."""
    return lambda: (_masks({1 / 3: _by_share(low), 2 / 3: _by_share(high)}),)


# ρ(depth, share) of four layers: [.8,.6,.4,.2] −1 (p = 1/24), [.8,.6,.2,.4] −0.8 (p = 4/24), [.6,.8,.2,.4] −0.6
# (p = 5/24), [.4,.8,.6,.2] −0.4 (p = 9/24), [.2,.8,.6,.4] +0.2, [.6,.2,.4,.8] +0.4, [.2,.4,.6,.8] +1
DOWN, DOWN8, DOWN6, DOWN4 = [.8, .6, .4, .2], [.8, .6, .2, .4], [.6, .8, .2, .4], [.4, .8, .6, .2]
UP2, UP4, UP = [.2, .8, .6, .4], [.6, .2, .4, .8], [.2, .4, .6, .8]
FIG6 = [
    Case("1/3 rises with depth, 2/3 decreases strictly: contrast +2.0", _trend(UP, DOWN), "shown"),
    Case("contrast +0.6 (just above 0.5): 1/3 ρ = −0.4, 2/3 ρ = −1", _trend(DOWN4, DOWN), "shown"),
    Case("contrast +0.4 (just below 0.5): 1/3 ρ = −0.6, 2/3 ρ = −1", _trend(DOWN6, DOWN), "partly"),
    Case("2/3 decreases at p = 5/24 (≤ 0.25), contrast +0.8", _trend(UP2, DOWN6), "shown"),
    Case("2/3 only at p = 9/24 (> 0.25), contrast +0.8", _trend(UP4, DOWN4), "partly"),
    Case("the same rank order at both ratios (the demo's): contrast 0", _trend(DOWN4, DOWN4), "not shown"),
    Case("1/3 decreases more than 2/3", _trend(DOWN, DOWN6), "not shown"),
]

FIG7 = [
    Case("strictly decreasing with depth: p = 1/24", _trend(UP, DOWN), "shown"),
    Case("ρ = −0.8, p = 4/24", _trend(UP, DOWN8), "partly"),
    Case("ρ = −0.6, p = 5/24 (just under 0.25)", _trend(UP, DOWN6), "partly"),
    Case("ρ = −0.4, p = 9/24 (what random orders give)", _trend(UP, DOWN4), "not shown"),
    Case("rising with depth", _trend(DOWN, UP), "not shown"),
]


def _heads(*tables_per_layer: np.ndarray):
    return lambda: (_masks({1 / 3: list(tables_per_layer)}),)


def _whole_heads(*heads: int) -> np.ndarray:
    t = np.ones((WINDOWS, HEADS))
    t[:, list(heads)] = 0
    return t


def _forced_plus(extra_windows: list[int]) -> np.ndarray:
    """Head 0 pruned in every window and head 1 in the first two: 6 pruned pairs, 6 % 4 ≠ 0 forces one mixed head;
    ``extra_windows`` move head 1's second pruned pair to head 2 in those windows (a second mixed head)."""
    t = _whole_heads(0)
    t[0, 1] = 0
    for w in extra_windows:
        t[w, 2] = 0
    if not extra_windows:
        t[1, 1] = 0
    return t


FIG2 = [
    Case("every layer keeps different heads in different windows", _heads(_first(5), _first(10)), "shown"),
    Case("one layer prunes whole heads, the other not", _heads(_whole_heads(0, 3), _first(10)), "partly"),
    Case("6 pruned pairs: one mixed head, as the count forces", _heads(_forced_plus([]), _whole_heads(2)), "not shown"),
    Case("6 pruned pairs, two mixed heads (one beyond the forced one)", _heads(_forced_plus([1]), _first(10)),
         "shown"),
    Case("every layer prunes whole heads", _heads(_whole_heads(1), _whole_heads(0, 5)), "not shown"),
]


# ------------------------------------------------------------------------------------ saliency (fig. 3)
SAL_WINDOWS, SAL_HEADS, SAMPLES = 16, 6, 8


def _saliency(table_a: np.ndarray, table_b: np.ndarray | None = None):
    """Gradients of one prunable layer (SAL_WINDOWS x SAL_HEADS): the first half of the images all ``table_a``, the
    second all ``table_b`` (default: the same), plus a last unprunable layer."""
    def build():
        b = table_a if table_b is None else table_b
        rows = [np.r_[t.reshape(-1), np.ones(4)] for t in [table_a] * (SAMPLES // 2) + [b] * (SAMPLES // 2)]
        pairs = SAL_WINDOWS * SAL_HEADS
        layer = [0] * pairs + [1] * 4
        window = [w for w in range(SAL_WINDOWS) for _ in range(SAL_HEADS)] + [0] * 4
        head = [h for _ in range(SAL_WINDOWS) for h in range(SAL_HEADS)] + list(range(4))
        return (xr.Dataset({"gradient": (("sample", "pair"), np.array(rows))},
                           coords={"sample": np.arange(SAMPLES), "pair": np.arange(pairs + 4), "layer": ("pair", layer),
                                   "window": ("pair", window), "head": ("pair", head),
                                   "prunable": ("pair", [int(lay == 0) for lay in layer])}),)

    return build


def _tops(k: int, spike: float = 1.5) -> np.ndarray:
    """Head 0 at 1.0 in every window (the layer's top head); the first ``k`` windows have a spike on another head."""
    t = np.full((SAL_WINDOWS, SAL_HEADS), 0.1)
    t[:, 0] = 1.0
    for w in range(k):
        t[w, 1 + w % (SAL_HEADS - 1)] = spike
    return t


def _unstable() -> tuple[np.ndarray, np.ndarray]:
    """Every window's top head differs from the layer's on all images, but is another head in each half."""
    a, b = np.full((SAL_WINDOWS, SAL_HEADS), 0.1), np.full((SAL_WINDOWS, SAL_HEADS), 0.1)
    a[:, 0] = b[:, 0] = 1.0
    for w in range(SAL_WINDOWS):
        a[w, 1 + w % 5] = 2.5
        b[w, 1 + (w + 1) % 5] = 2.5
    return a, b


# 16 windows of 6 heads: chance of a reproducible other top head 5/36 = 13.9 %, so "shown" needs ≥ 27.8 % (5 windows);
# "partly" needs ≥ 25 % differing on all images (4 windows)
FIG3 = [
    Case("5 of 16 windows (31 %) reproducibly prefer another head", _saliency(_tops(5)), "shown"),
    Case("4 of 16 (25 %): above 25 % but under twice chance", _saliency(_tops(4)), "partly"),
    Case("3 of 16 (19 %) prefer another head", _saliency(_tops(3)), "not shown"),
    Case("every window prefers another head, a different one in each half", _saliency(*_unstable()), "partly"),
    Case("the same head tops every window", _saliency(_tops(0)), "not shown"),
]


# ------------------------------------------------------------------------------------ fig. 1
def _flops(attention: dict[str, float], mlp: dict[str, float]):
    """Shares of the FLOPs per model: attention (split over its three parts), MLP, the rest in patch merging."""
    def build():
        models = list(attention)
        rows = []
        for m in models:
            a, g = attention[m], mlp[m]
            rows.append([0.7 * a, 0.1 * a, 0.2 * a, g, 1 - a - g])
        return (xr.Dataset({"flops": (("model", "component"), np.array(rows) * 9e9)},
                           coords={"model": models, "component": ["attn_qkv", "attn_matmul", "attn_proj", "mlp",
                                                                  "patch_merging"]}),)

    return build


FIG1 = [
    Case("Swin-T/B as counted: attention 34 %, MLP 62 %", _flops({"Swin-T": .34, "Swin-B": .34}, {"Swin-T": .62,
                                                                                                   "Swin-B": .64}), "shown"),
    Case("attention 20.5 % (just above a fifth)", _flops({"Swin-T": .205, "Swin-B": .34}, {"Swin-T": .7, "Swin-B": .6}),
         "shown"),
    Case("attention 19.5 % in Swin-T (just under a fifth)", _flops({"Swin-T": .195, "Swin-B": .34},
                                                                   {"Swin-T": .7, "Swin-B": .6}), "partly"),
    Case("attention above the MLP in Swin-B", _flops({"Swin-T": .34, "Swin-B": .45}, {"Swin-T": .6, "Swin-B": .44}),
         "partly"),
    Case("attention a tenth, the rest larger than the MLP", _flops({"Swin-T": .1, "Swin-B": .1},
                                                                   {"Swin-T": .2, "Swin-B": .2}), "not shown"),
]


# ------------------------------------------------------------------------------------ Table I
PAPER = {"Swin-B": (5.24e9, [30.7, 40.9, 51.1, 61.3]), "Swin-T": (2.61e9, [28.0, 37.3, 46.6, 56.0])}


def _table(gap: dict[str, float], share_gap: dict[str, float], macs: dict[str, float]):
    """Rows of Table I: ours = the paper's + gap (points) in the last ratio, r x share = paper + share_gap, unpruned
    MACs = the paper's × macs."""
    def build():
        rows = []
        for name, (dense, red) in PAPER.items():
            rows.append({"model": f"{name} @224", "r": "unpruned", "attention MACs": dense * macs[name],
                         "paper MACs": dense, "reduction (%)": np.nan, "paper reduction (%)": np.nan,
                         "r x prunable share (%)": np.nan})
            for i, p in enumerate(red):
                last = i == len(red) - 1
                rows.append({"model": f"{name} @224", "r": f"r{i}", "attention MACs": np.nan, "paper MACs": np.nan,
                             "reduction (%)": p + (gap[name] if last else 0.1),
                             "paper reduction (%)": p, "r x prunable share (%)": p + share_gap[name]})
        rows.append({"model": "demo Swin", "r": "unpruned", "attention MACs": 1e6, "paper MACs": np.nan,
                     "reduction (%)": np.nan, "paper reduction (%)": np.nan, "r x prunable share (%)": np.nan})
        return (xr.Dataset({k: ("row", np.array([r[k] for r in rows], dtype=object if k in ("model", "r") else float))
                            for k in rows[0]}, coords={"row": np.arange(len(rows))}),)

    return build


_EXACT = {"Swin-B": 1.0, "Swin-T": 1.0}
TABLE1 = [
    Case("both models within 0.49 points, MACs exact", _table({"Swin-B": .49, "Swin-T": -.49}, {"Swin-B": 1, "Swin-T": 1},
                                                              _EXACT), "shown"),
    Case("Swin-T 0.51 points off, r × share within 0.05", _table({"Swin-B": .2, "Swin-T": .51},
                                                                  {"Swin-B": 1, "Swin-T": .05}, _EXACT), "partly"),
    Case("Swin-T unpruned MACs 0.9 % off (reproduced)", _table({"Swin-B": .2, "Swin-T": .2}, {"Swin-B": 1, "Swin-T": 1},
                                                               {"Swin-B": 1.0, "Swin-T": 1.009}), "shown"),
    Case("Swin-T unpruned MACs 1.1 % off, Swin-B exact", _table({"Swin-B": .2, "Swin-T": .2}, {"Swin-B": 1, "Swin-T": 1},
                                                                {"Swin-B": 1.0, "Swin-T": 1.011}), "partly"),
    Case("both 0.6 points off by either count", _table({"Swin-B": .6, "Swin-T": .6}, {"Swin-B": .6, "Swin-T": .6},
                                                       _EXACT), "not shown"),
]

CASES = {
    "slimswin.fig1": FIG1,
    "slimswin.fig2": FIG2,
    "slimswin.fig3": FIG3,
    "slimswin.fig6": FIG6,
    "slimswin.fig7": FIG7,
    "slimswin.table1": TABLE1,
}
