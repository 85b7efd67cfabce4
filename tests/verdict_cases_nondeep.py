"""Verdict cases of the Non-deep ViT findings (tests/test_verdict_rules.py): each rule driven to "shown", "partly" and
"not shown" by hand-built item data, with cases just either side of every threshold. (nondeep.table5's cases come
with its several-seed rule.)
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from test_verdict_rules import Case

from workbench.xrutils import rows_to_dataset

DIMS = ("model", "layer", "module", "branch_i", "branch_j")
N = 1000  # held-out images of the accuracy cases


def _pairs(value: float, n: int = 3) -> np.ndarray:
    """An n × n branch-pair matrix: ``value`` off the diagonal, 1 on it."""
    m = np.full((n, n), float(value))
    np.fill_diagonal(m, 1.0)
    return m


def _similarity(models: dict[str, dict[str, dict]], modules: list[str], layers: int = 2, attrs=None) -> xr.Dataset:
    """``{model: {var: {(layer, module) or module or "*": off-diagonal value}}}`` → Dataset over DIMS (most specific
    key wins; a missing variable is NaN)."""
    names = sorted({v for spec in models.values() for v in spec})
    data = {}
    for var in names:
        arr = np.full((len(models), layers, len(modules), 3, 3), np.nan)
        for i, spec in enumerate(models.values()):
            if var not in spec:
                continue
            vals = spec[var]
            for la in range(layers):
                for j, mo in enumerate(modules):
                    v = vals.get((la, mo), vals.get(mo, vals.get("*")))
                    arr[i, la, j] = _pairs(v)
        data[var] = (DIMS, arr)
    return xr.Dataset(data, coords={"model": list(models), "layer": np.arange(layers), "module": modules},
                      attrs=attrs or {})


# ------------------------------------------------------------------------------------------- fig4
def _fig4(first: float, others: float, sd: float = 0.0, init=(0.9, 0.05)):
    """The 2×3 model trained at λ = 0: block 0 attention ``first``, every other (block, module) ``others``; the spread
    over 16 images ``sd`` (95 % half-width 1.96 · sd / 4: 0.098 at sd = 0.2)."""
    def build():
        def spec(a, b):
            return {"cosine": {(0, "attn"): a, "*": b}, "cosine_sd": {"*": sd}}
        return (_similarity({"2×3 at initialisation": spec(*init), "2×3 after training at λ = 0": spec(first, others)},
                            ["attn", "ffn"], attrs={"n_images": 16}),)
    return build


FIG4 = [
    Case("block 0 attention 0.6, the rest 0.1", _fig4(0.6, 0.1), "shown"),
    Case("the rest 0.400 + 0.098 = 0.498 < 0.5; block 0 0.600 − 0.098 = 0.502 above it", _fig4(0.6, 0.4, 0.2),
         "shown"),
    Case("block 0 0.595 − 0.098 = 0.497 not above the rest's 0.498", _fig4(0.595, 0.4, 0.2), "partly"),
    Case("the rest 0.403 + 0.098 = 0.501 may reach 0.5; block 0 far above", _fig4(0.9, 0.403, 0.2), "partly"),
    Case("every module alike at 0.3: block 0 not the most similar", _fig4(0.3, 0.3), "partly"),
    Case("block 0 attention 0.3, other modules 0.6", _fig4(0.3, 0.6), "not shown"),
]


# ------------------------------------------------------------------------------------------- fig5
def _fig5(weights: float, updates: dict | None, init: float = 0.01):
    """Weights before joining (init, and after training at λ = 0) and the updates the trained model made."""
    def build():
        trained = {"cosine": {"*": weights}}
        if updates is not None:
            trained["update"] = updates
        models = {"2×3 at initialisation": {"cosine": {"*": init}},
                  "3×2 at initialisation": {"cosine": {"*": init}},
                  "2×3 after training at λ = 0": trained}
        ds = _similarity(models, ["qk", "ov", "fc1", "fc2"])
        if updates is None:
            ds = ds.drop_vars("update", errors="ignore")
        return (ds,)
    return build


FIG5 = [
    Case("weights 0.02 apart, updates 0.1 alike", _fig5(0.02, {"*": 0.1}), "shown"),
    Case("weights 0.299, fc2 updates 0.299 (< 0.3)", _fig5(0.299, {"fc2": 0.299, "*": 0.1}), "shown"),
    Case("weights distinct, fc2 updates 0.301 (≥ 0.3): training moves them alike",
         _fig5(0.02, {"fc2": 0.301, "*": 0.1}), "partly"),
    Case("weights distinct, no updates measured", _fig5(0.02, None), "partly"),
    Case("weights 0.300 (≥ 0.3) after training", _fig5(0.300, {"*": 0.1}), "not shown"),
    Case("weights 0.8 alike", _fig5(0.8, {"*": 0.9}), "not shown"),
]


# ------------------------------------------------------------------------------------------- fig6
def _fig6(after: float, init: float, update: float = 0.98):
    """FFN weight similarity of the α = 0 model after joining and at initialisation (attention modules 0.01)."""
    def build():
        def spec(a, b):
            return {"cosine": {"fc1": a, "fc2": a, "*": 0.01}, "cosine_init": {"fc1": b, "fc2": b, "*": 0.01},
                    "update": {"fc1": update, "fc2": update, "*": 0.1}}
        models = {"3×2, α = 0.05": spec(0.02, 0.02), "2×3, α = 0 (Table 5)": spec(after, init),
                  "2×3, α = 5 (Table 5)": spec(0.02, 0.02)}
        return (_similarity(models, ["qk", "ov", "fc1", "fc2"]),)
    return build


FIG6 = [
    Case("FFN weights 0.8 alike after joining", _fig6(0.8, 0.02), "shown"),
    Case("FFN weights 0.700 (≥ 0.7)", _fig6(0.700, 0.69), "shown"),
    Case("FFN weights 0.699, 0.009 above their start", _fig6(0.699, 0.69), "not shown"),
    Case("FFN similarity rose from 0.02 to 0.3", _fig6(0.3, 0.02), "partly"),
    Case("FFN similarity rose by 0.0501 (≥ 0.05)", _fig6(0.2501, 0.2), "partly"),
    Case("FFN similarity rose by 0.0499 (< 0.05)", _fig6(0.2499, 0.2), "not shown"),
    Case("updates alike (0.98) but the weights stay where they started", _fig6(0.021, 0.02), "not shown"),
]


# ------------------------------------------------------------------------------------------- table1
def _base(acc: float = 0.85, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random(N) < acc).astype(float)


def _shift(a: np.ndarray, wins: int, losses: int, seed: int = 1) -> np.ndarray:
    """A copy of ``a``; ``a − result`` has ``wins`` +1s and ``losses`` −1s."""
    b = a.copy()
    rng = np.random.default_rng(seed)
    b[rng.permutation(np.flatnonzero(a == 1))[:wins]] = 0
    b[rng.permutation(np.flatnonzero(a == 0))[:losses]] = 1
    return b


def _table1(vs_baseline: list[tuple[int, int]], ratios: list[float]):
    """Collapsed 3- and 2-block students with (wins, losses) against their depth baselines; real-size collapsed 6 / 4
    / 3 latency ratios to DeiT-Tiny (66 ms)."""
    def build():
        rows = [{"setting": "224², random weights", "model": "DeiT-Tiny (12 blocks)", "kind": "teacher", "ms": 66.0},
                {"setting": "224², random weights", "model": "DeiT-6 (first 6 blocks)", "kind": "depth baseline",
                 "ms": 33.0}]
        rows += [{"setting": "224², random weights", "model": f"collapsed {d} (exact, from {d}×{12 // d})",
                  "kind": "collapsed", "ms": 66.0 * r} for d, r in zip((6, 4, 3), ratios)]
        rows += [{"setting": "demo (28², MNIST-5k)", "model": "demo teacher", "kind": "teacher", "ms": 1.0}]
        names, correct = ["demo teacher"], [_base(0.95, 7)]
        for (blocks, n), (w, lo) in zip(((3, 2), (2, 3)), vs_baseline):
            student = _base(0.85, blocks)
            names += [f"demo depth baseline ({blocks} blocks)", f"demo collapsed {blocks} (from {blocks}×{n})"]
            correct += [_shift(student, w, lo, seed=blocks + 10), student]
        corr = xr.Dataset({"correct": (("model", "sample"), np.stack(correct))},
                          coords={"model": names, "sample": np.arange(N)})
        return rows_to_dataset(rows), corr
    return build


_FAST = [0.63, 0.5, 0.47]
TABLE1 = [
    Case("both students 5 points above their depth baselines, every collapsed model ≤ 0.63×",
         _table1([(50, 0), (50, 0)], _FAST), "shown"),
    Case("students just beyond noise (+1.0, lo +0.00002), slowest collapsed model 0.899×",
         _table1([(18, 8), (18, 8)], [0.899, 0.5, 0.47]), "shown"),
    Case("one collapsed model 0.901× (> 0.9)", _table1([(50, 0), (50, 0)], [0.901, 0.5, 0.47]), "partly"),
    Case("one student's interval just reaching 0 (+0.9)", _table1([(17, 8), (50, 0)], _FAST), "partly"),
    Case("students tie their baselines; collapsed models faster", _table1([(0, 0), (0, 0)], _FAST), "partly"),
    Case("students above their baselines; collapsed models 1.2× slower", _table1([(50, 0), (50, 0)], [1.2] * 3),
         "partly"),
    Case("students +0.9 (interval reaching 0); every collapsed model 0.901×", _table1([(17, 8), (17, 8)], [0.901] * 3),
         "not shown"),
    Case("depth baselines ahead; collapsed models slower", _table1([(0, 40), (0, 40)], [1.3] * 3), "not shown"),
]


# ------------------------------------------------------------------------------------------- tables 10 / 11
def _memory(train_ratio: float, infer_ratio: float):
    """Peak bytes relative to DeiT-Tiny (the paper: training 14.43 / 13.16 = 1.0965×, inference 1.29 / 1.30)."""
    def build():
        rows = [{"mode": "train", "model": "DeiT-Tiny (12 blocks)", "bytes": 1e9, "paper_gb": 13.16},
                {"mode": "train", "model": "DeiT-Tiny (12 blocks, explicit attention)", "bytes": 1.3e9,
                 "paper_gb": None},
                {"mode": "train", "model": "branched 6×2 (train form)", "bytes": 1e9 * train_ratio, "paper_gb": 14.43},
                {"mode": "infer", "model": "DeiT-Tiny (12 blocks)", "bytes": 1e8, "paper_gb": 1.30},
                {"mode": "infer", "model": "collapsed 6 (exact)", "bytes": 1e8 * infer_ratio, "paper_gb": 1.29}]
        return (rows_to_dataset(rows),)
    return build


_P10, _P11 = 14.43 / 13.16, 1.29 / 1.30
TABLE10 = [
    Case("training memory 1.10×, the paper's", _memory(1.10, 1.0), "shown"),
    Case("paper + 0.0499", _memory(_P10 + 0.0499, 1.0), "shown"),
    Case("paper + 0.0501: more, not the paper's ratio", _memory(_P10 + 0.0501, 1.0), "partly"),
    Case("1.011×: barely more than DeiT-Tiny", _memory(1.011, 1.0), "partly"),
    Case("1.009×: no difference from DeiT-Tiny", _memory(1.009, 1.0), "not shown"),
    Case("0.8×: less than DeiT-Tiny", _memory(0.8, 1.0), "not shown"),
]

TABLE11 = [
    Case("inference memory 1.0×", _memory(1.1, 1.0), "shown"),
    Case("paper − 0.0499", _memory(1.1, _P11 - 0.0499), "shown"),
    Case("paper − 0.0501: less than DeiT-Tiny, beyond the paper's", _memory(1.1, _P11 - 0.0501), "partly"),
    Case("paper + 0.0501 = 1.04×: more than DeiT-Tiny", _memory(1.1, _P11 + 0.0501), "not shown"),
    Case("1.5×", _memory(1.1, 1.5), "not shown"),
]


# ------------------------------------------------------------------------------------------- exactness
def _exactness(exact: float, paper: float):
    """The two demo students' relative logit errors in float64 under the exact collapse and the paper's formulas."""
    def build():
        rows = []
        for model in ("3×2 demo student", "2×3 demo student"):
            rows += [{"pitfall": "exact", "model": model, "error_float64": exact, "same_prediction": 1.0},
                     {"pitfall": "paper", "model": model, "error_float64": paper, "same_prediction": 0.9},
                     {"pitfall": "paper_vo", "model": model, "error_float64": paper, "same_prediction": 0.9}]
        rows += [{"pitfall": "ln_backward", "model": "demo teacher", "error_float64": 0.5, "same_prediction": None}]
        return (rows_to_dataset(rows),)
    return build


EXACTNESS = [
    Case("the paper's formulas exact (1e-12)", _exactness(1e-13, 1e-12), "shown"),
    Case("the paper's formulas 9.9e-7 (< 1e-6)", _exactness(1e-13, 9.9e-7), "shown"),
    Case("the paper's formulas 1.01e-6; the exact collapse 1e-13", _exactness(1e-13, 1.01e-6), "partly"),
    Case("the paper's formulas 0.3 off; the exact collapse 9.9e-7", _exactness(9.9e-7, 0.3), "partly"),
    Case("the exact collapse 1.01e-6 off, the paper's 0.3", _exactness(1.01e-6, 0.3), "not shown"),
    Case("neither collapse exact", _exactness(1e-2, 0.3), "not shown"),
]

CASES = {"nondeep.fig4": FIG4, "nondeep.fig5": FIG5, "nondeep.fig6": FIG6, "nondeep.table1": TABLE1,
         "nondeep.table10": TABLE10, "nondeep.table11": TABLE11, "nondeep.exactness": EXACTNESS}
