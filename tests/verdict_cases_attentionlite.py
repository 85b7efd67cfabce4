"""Verdict cases of the AttentionLite items (tests/test_verdict_rules.py): small hand-built Datasets in the layout of
:mod:`workbench.figures.attentionlite.items`'s data, each changed to push a rule to one side of a threshold."""

from __future__ import annotations

import numpy as np
import xarray as xr
from test_verdict_rules import Case

N = 1000  # held-out images


def _correct(acc: float, n: int = N, seed: int = 0) -> np.ndarray:
    """0/1 correctness with exactly round(acc · n) correct images."""
    out = np.zeros(n)
    out[np.random.default_rng(seed).permutation(n)[: int(round(acc * n))]] = 1
    return out


def _paired(base: np.ndarray, gain: int, flips: int = 60, seed: int = 1) -> np.ndarray:
    """``base`` with discordant images both ways and a net ``gain`` images more right (``flips`` the smaller side)."""
    rng = np.random.default_rng(seed)
    right, wrong = rng.permutation(np.flatnonzero(base == 1)), rng.permutation(np.flatnonzero(base == 0))
    out = base.copy()
    out[right[: flips + max(0, -gain)]] = 0
    out[wrong[: flips + max(0, gain)]] = 1
    return out


def _base(models: dict[str, np.ndarray]) -> xr.Dataset:
    return xr.Dataset({"correct": (("model", "sample"), np.stack(list(models.values())))},
                      coords={"model": list(models), "sample": np.arange(N)})


# ------------------------------------------------------------------------------------ fig3 (column KD+AT vs KD)
def _curves(gaps_by_seed: list[float], pruning: str = "column") -> xr.Dataset:
    runs, distill, seed, acc = [], [], [], []
    for s, g in enumerate(gaps_by_seed):
        for d, a in (("KD", 0.90), ("KD+AT", 0.90 + g)):
            runs.append(f"{pruning}-{d}-{s}")
            distill.append(d)
            seed.append(s)
            acc.append(a)
    return xr.Dataset({"final_val_acc": ("run", acc)},
                      coords={"run": runs, "distill": ("run", distill), "seed": ("run", seed)}).assign_attrs(
        pruning=pruning, density=0.5)


def _fig3(gain_images: int, gaps_by_seed: list[float]):
    def build():
        kd = _correct(0.90)
        base = _base({"teacher": _correct(0.95, seed=5), "column/KD": kd,
                       "column/KD+AT": _paired(kd, gain_images, flips=5)})
        return _curves(gaps_by_seed), base

    return build


# 5 discordant images each way plus the gain, n = 1000: the image interval excludes 0 from +9 images up (+8: not);
# three seeds 0.01 ± a: the t-interval (t = 4.30) excludes 0 for a < 0.0040
FIG3 = [
    Case("one seed, +2 points beyond image noise: seed spread unmeasured", _fig3(20, [0.02]), "partly"),
    Case("three seeds all ahead (t-interval above 0), +2 points on the images", _fig3(20, [0.02, 0.025, 0.03]), "shown"),
    Case("three seeds, t-interval just above 0", _fig3(20, [0.0061, 0.010, 0.0139]), "shown"),
    Case("three seeds, t-interval just containing 0", _fig3(20, [0.0058, 0.010, 0.0142]), "partly"),
    Case("images +0.9 points, interval just above 0, seeds spread", _fig3(9, [0.01, -0.01, 0.02]), "partly"),
    Case("images +0.8 points, interval just containing 0, seeds spread", _fig3(8, [0.01, -0.01, 0.02]), "not shown"),
    Case("seeds ahead, images tie", _fig3(3, [0.02, 0.025, 0.03]), "partly"),
    Case("KD better on the images and over the seeds", _fig3(-20, [-0.02, -0.03, -0.025]), "not shown"),
]


# ------------------------------------------------------------------------------------ baselines
def _baselines(irregular: int, column: int, dense: int):
    """Net images right relative to the teacher (95 %) of the irregular and column KD+AT students and of the dense
    student trained on labels alone; each with 20 discordant images each way against the teacher."""
    def build():
        teacher = _correct(0.95)
        models = {"teacher": teacher, "dense/none": _paired(teacher, dense, flips=5, seed=7)}
        for i, (pruning, vt) in enumerate((("irregular", irregular), ("column", column))):
            models[f"{pruning}/KD+AT"] = _paired(teacher, vt, flips=5, seed=2 + i)
            models[f"{pruning}/KD"] = _paired(teacher, vt - 5, flips=20, seed=4 + i)
            models[f"{pruning}/none"] = _paired(teacher, vt - 10, flips=20, seed=6 + i)
        return (_base(models),)

    return build


# 5 discordant images each way against the teacher: 1.9 points under it puts the interval's low end at −2.96 (close),
# 2.0 points at −3.07 (not); KD+AT 1.7 points above the dense student (−13 vs −30 images) is just beyond the noise
BASELINES = [
    Case("both kinds beat the dense student by 5 points, 1 under the teacher", _baselines(-10, -10, -60), "shown"),
    Case("both beat it; 1.9 points under the teacher (low end just above −3)", _baselines(-19, -19, -60), "shown"),
    Case("irregular 2.0 points under the teacher (low end just below −3)", _baselines(-20, -19, -60), "partly"),
    Case("column 0.8 points above the dense student (interval contains 0)", _baselines(-10, -19, -27), "partly"),
    Case("column 1.4 points above the dense student (low end just below 0)", _baselines(-13, -16, -30), "partly"),
    Case("both 1.7 points above the dense student (interval above 0)", _baselines(-13, -13, -30), "shown"),
    Case("neither beats the dense student, both far under the teacher", _baselines(-80, -80, -60), "not shown"),
]


# ------------------------------------------------------------------------------------ at_maps
def _at_maps(shift: dict[tuple[str, int], float], noise: float = 0.05, n: int = 60):
    """KD distances ~0.5 per image, KD+AT = KD + shift[(pruning, stage)] + image noise (paired)."""
    def build():
        rng = np.random.default_rng(0)
        stages = [0, 1, 2, 3]
        runs, rows, meta = [], [], []
        for pruning in ("irregular", "column"):
            kd = 0.5 + 0.1 * rng.standard_normal((len(stages), n))
            for distill in ("KD", "KD+AT"):
                d = kd if distill == "KD" else kd + np.array([shift.get((pruning, s), -0.05) for s in stages])[:, None] \
                    + noise * rng.standard_normal((len(stages), n))
                runs.append(f"{pruning}-{distill}")
                rows.append(d)
                meta.append((distill, pruning, 0))
        dist = np.array(rows)
        return (xr.Dataset({"distance": (("run", "stage"), dist.mean(-1)),
                            "distance_image": (("run", "stage", "sample"), dist)},
                           coords={"run": runs, "stage": stages, "sample": np.arange(n),
                                   "distill": ("run", [m[0] for m in meta]), "pruning": ("run", [m[1] for m in meta]),
                                   "seed": ("run", [m[2] for m in meta])}),)

    return build


# 60 images, noise sd 0.05: se of the paired mean ≈ 0.0065, the interval excludes 0 beyond ≈ ±0.013
AT_MAPS = [
    Case("every (pruning, stage) closer with AT beyond the image noise", _at_maps({}), "shown"),
    Case("column stage 0 −0.004 (a tie), the rest closer", _at_maps({("column", 0): -0.004}), "partly"),
    Case("column stage 0 just closer (−0.015)", _at_maps({("column", 0): -0.015}), "shown"),
    Case("column stage 0 just a tie (−0.012)", _at_maps({("column", 0): -0.012}), "partly"),
    Case("no cell closer: AT leaves the maps as far", _at_maps({(p, s): 0.0 for p in ("irregular", "column")
                                                                 for s in range(4)}), "not shown"),
    Case("AT moves every map farther", _at_maps({(p, s): 0.05 for p in ("irregular", "column")
                                                  for s in range(4)}), "not shown"),
    Case("stored data without per-image distances", lambda: (_at_maps({})()[0].drop_vars("distance_image"),),
         "not shown"),
]


# ------------------------------------------------------------------------------------ density
def _density(finals: list[list[float]]):
    """One run per list: its layers' final densities (the first epoch uniform at 0.25)."""
    def build():
        final = np.array(finals)
        layers = final.shape[1]
        dens = np.stack([np.full_like(final, 0.25), final], axis=1)  # (run, epoch, layer)
        return (xr.Dataset({"layer_density": (("run", "epoch", "layer"), dens)},
                           coords={"run": [f"r{i}" for i in range(len(finals))], "epoch": [0, 1],
                                   "layer": np.arange(layers), "label": ("run", [f"run {i}" for i in range(len(finals))])}),)

    return build


_UP = [0.9, 0.6, 0.4, 0.2, 0.1, 0.05]  # early layers kept denser
DENSITY = [
    Case("every run spreads by 0.85, same layer order", _density([_UP, _UP[:5] + [0.06], _UP]), "shown"),
    Case("spread just above 0.2 in every run, same order", _density([[0.36, 0.3, 0.25, 0.2, 0.18, 0.155]] * 2),
         "shown"),
    Case("one run's spread just under 0.2", _density([_UP, [0.34, 0.3, 0.25, 0.2, 0.18, 0.145]]), "partly"),
    Case("runs spread but rank the layers oppositely", _density([_UP, _UP[::-1]]), "partly"),
    Case("runs rank the layers alike, ρ = 0.60", _density([_UP, [_UP[r - 1] for r in (4, 2, 1, 3, 5, 6)]]), "shown"),
    Case("runs rank the layers alike, ρ = 0.43", _density([_UP, [_UP[r - 1] for r in (4, 3, 1, 2, 6, 5)]]), "partly"),
    Case("spread everywhere under 0.2 (0.19)", _density([[0.34, 0.3, 0.25, 0.2, 0.18, 0.15]] * 2), "not shown"),
]


# ------------------------------------------------------------------------------------ tables 1 and 2
def _table(param_gap: float, flops_gap: float, rows: int = 3):
    """Paper rows whose counted reductions are off by the given relative gaps (largest in the last row)."""
    def build():
        paper_p, paper_f = np.array([29.75, 28.2, 11.0][:rows]), np.array([1.96, 1.89, 1.97][:rows])
        rel_p, rel_f = np.linspace(0, param_gap, rows), np.linspace(0, flops_gap, rows)
        return (xr.Dataset({
            "param. red. (paper)": ("row", np.r_[paper_p, np.nan]),
            "param. red. (ours)": ("row", np.r_[paper_p * (1 + rel_p), 3.1]),
            "FLOPs red. (paper)": ("row", np.r_[paper_f, np.nan]),
            "FLOPs red. dense student (ours)": ("row", np.r_[paper_f * (1 - rel_f), 0.9]),
            "source": ("row", np.array(["paper acc.; our counts"] * rows + ["measured here (1 seed: 95.0 %)"],
                                       dtype=object))}, coords={"row": np.arange(rows + 1)}),)

    return build


TABLE = [
    Case("both counts within 5 %", _table(0.05, 0.05), "shown"),
    Case("parameter reductions 9.9 % off, FLOPs 2 %", _table(0.099, 0.02), "shown"),
    Case("parameter reductions 10.1 % off (one row), FLOPs 2 %", _table(0.101, 0.02), "partly"),
    Case("FLOPs reductions 12 % off, parameters exact", _table(0.0, 0.12), "partly"),
    Case("both off by more than 10 %", _table(0.2, 0.15), "not shown"),
]

CASES = {
    "attentionlite.fig3": FIG3,
    "attentionlite.baselines": BASELINES,
    "attentionlite.at_maps": AT_MAPS,
    "attentionlite.density": DENSITY,
    "attentionlite.table1": TABLE,
    "attentionlite.table2": TABLE,
}
