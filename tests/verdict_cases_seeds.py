"""Verdict cases of the items whose verdict compares trained arms over training seeds (attentionlite.fig2, far.table3,
nondeep.table5, sparsifiner.fig4, slimswin.fig4), for tests/test_verdict_rules.py.

Each seed's correctness is a block of ``round(acc · N)`` correct images out of N = 1000 (the first images), so a
seed's paired difference between two arms is exactly the difference of their accuracies; the t interval over seeds
then follows from the per-seed differences the case names. ``d = [.010, .012, .014]`` (mean 1.2 points, sd 0.2,
95 % half-width 0.50 points with 3 seeds) lies above 0; ``d = [.004, .012, .020]`` (same mean, sd 0.8, half-width 1.99)
contains 0: the two sides of the "interval above 0" threshold.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from test_verdict_rules import Case

N = 1000
ABOVE = (0.010, 0.012, 0.014)  # per-seed differences whose 95 % t interval is above 0 (low +0.70 points)
ACROSS = (0.004, 0.012, 0.020)  # the same mean, spread so that the interval contains 0 (low −0.79 points)


def _block(acc: float) -> np.ndarray:
    """Correctness of one run: the first round(acc · N) images right."""
    c = np.zeros(N)
    c[: round(acc * N)] = 1.0
    return c


def _arm(accs) -> np.ndarray:
    """``(seed, sample)`` correctness, one row per accuracy (None: that seed was not run, NaN)."""
    return np.stack([np.full(N, np.nan) if a is None else _block(a) for a in accs])


def _seeds(arms: dict[str, list], **coords) -> xr.Dataset:
    """A ``<item>_seeds`` Dataset: ``correct(arm, seed, sample)``."""
    c = np.stack([_arm(v) for v in arms.values()])
    return xr.Dataset({"correct": (("arm", "seed", "sample"), c)},
                      coords={"arm": list(arms), "seed": np.arange(c.shape[1]), "sample": np.arange(N), **coords})


def _plus(base: float, diffs) -> list[float]:
    return [base + d for d in diffs]


# ---------------------------------------------------------------------------------------- attentionlite.fig2
def _fig2(kdat_minus_kd, kd=(0.85, 0.86, 0.84)):
    def build():
        kd_accs = list(kd)[: len(kdat_minus_kd)]
        curves = xr.Dataset(attrs={"density": 0.25})
        base = xr.Dataset({"correct": (("model", "sample"), np.stack([_block(0.97), _block(kd_accs[0] + kdat_minus_kd[0])]))},
                          coords={"model": ["teacher", "irregular/KD+AT"], "sample": np.arange(N)})
        seeds = _seeds({"KD": kd_accs, "KD+AT": [k + d for k, d in zip(kd_accs, kdat_minus_kd)]})
        return curves, base, seeds

    return build


FIG2 = [
    Case("KD+AT 1.2 points ahead in every seed, interval above 0", _fig2(ABOVE), "shown"),
    Case("KD+AT 1.2 points ahead on average, seeds spread: interval contains 0", _fig2(ACROSS), "partly"),
    Case("ahead in all 3 seeds, the last by 0.2 points, within the noise", _fig2((0.03, 0.01, 0.002)), "partly"),
    Case("ahead on average, behind by 0.2 points in one seed", _fig2((0.03, 0.01, -0.002)), "not shown"),
    Case("KD ahead on average", _fig2((-0.01, -0.01, 0.005)), "not shown"),
    Case("one seed, 3 points ahead: the image interval, above 0", _fig2((0.03,)), "shown"),
    Case("one seed, 0.1 points ahead within the image noise (no seed spread to call it consistent)", _fig2((0.001,)),
         "not shown"),
]


# ---------------------------------------------------------------------------------------- far.table3
def _table3(combined_minus_sim, cls: float = 0.48, scratch: float = 0.25, sim=(0.67, 0.68, 0.66)):
    def build():
        arms = {"scratch": [scratch, None, None], "cls": [cls, None, None], "sim": list(sim),
                "combined": [s + d for s, d in zip(sim, combined_minus_sim)]}
        return xr.Dataset(), _seeds(arms).assign_attrs(finetune_epochs=0)

    return build


TABLE3 = [
    Case("combined best, 1.2 points above sim in every seed", _table3(ABOVE), "shown"),
    Case("combined best on average, interval against sim contains 0", _table3(ACROSS), "partly"),
    Case("sim ahead on average within the noise", _table3(tuple(-d for d in ACROSS)), "partly"),
    Case("sim ahead beyond the noise", _table3(tuple(-d for d in ABOVE)), "not shown"),
    Case("a one-seed schedule (cls) 5 points ahead of every combined seed", _table3(ABOVE, cls=0.74), "not shown"),
    Case("a one-seed schedule (cls) ahead of combined on average, within the seeds' noise",
         _table3(ACROSS, cls=0.687), "partly"),
]


# ---------------------------------------------------------------------------------------- nondeep.table5
def _table5(linear_minus_instant, instant=(0.80, 0.81, 0.79), rows=("none", "instant", "linear+div", "linear", "sqrt+div")):
    def build():
        lin = [i + d for i, d in zip(instant, linear_minus_instant)]
        accs = {"none": [0.9] * len(lin), "instant": list(instant)[: len(lin)], "linear+div": [a + 0.005 for a in lin],
                "linear": lin, "sqrt+div": lin}
        arms = {r: accs[r] for r in rows}
        seeds = _seeds(arms, schedule=("arm", [r.split("+")[0] for r in rows]), div=("arm", ["+div" in r for r in rows]))
        return xr.Dataset(), seeds

    return build


TABLE5 = [
    Case("linear 1.2 points above instant in every seed", _table5(ABOVE), "shown"),
    Case("linear ahead on average, interval contains 0", _table5(ACROSS), "partly"),
    Case("linear ahead in all 3 seeds, the last by 0.2 points", _table5((0.03, 0.01, 0.002)), "partly"),
    Case("linear ahead on average, behind by 0.2 points in one seed", _table5((0.03, 0.01, -0.002)), "not shown"),
    Case("instant ahead beyond the noise", _table5(tuple(-d for d in ABOVE)), "not shown"),
    Case("no instant row", _table5(ABOVE, rows=("none", "linear+div", "linear")), "not shown"),
]


# ---------------------------------------------------------------------------------------- sparsifiner.fig4
def _fig4_sparsifiner(minus_teacher: dict[str, tuple], teacher: float = 0.95):
    def build():
        arms = {arm: [teacher + d for d in diffs] for arm, diffs in minus_teacher.items()}
        seeds = _seeds(arms, keep_rate=("arm", [float(a.split()[1]) for a in arms]))
        return xr.Dataset(), xr.Dataset(), seeds.assign(teacher_correct=("sample", _block(teacher)))

    return build


NEAR = (0.0, -0.002, 0.002)
INSIDE = tuple(-0.024 + d for d in ABOVE)  # −1.4, −1.2, −1.0 points: low −1.7 > −2
OUTSIDE = tuple(-0.024 + d for d in ACROSS)  # −2.0, −1.2, −0.4 points: low −3.2 < −2
FAR_BELOW = (-0.06, -0.07, -0.05)
FIG4_SPARSIFINER = [
    Case("every keep rate within 2 points of the teacher", _fig4_sparsifiner(
        {"keep 0.5": NEAR, "keep 0.25": NEAR, "keep 0.1": INSIDE}), "shown"),
    Case("keep 0.1 may lose more than 2 points (seed spread)", _fig4_sparsifiner(
        {"keep 0.5": NEAR, "keep 0.25": NEAR, "keep 0.1": OUTSIDE}), "partly"),
    Case("keep 0.1 6 points under the teacher", _fig4_sparsifiner(
        {"keep 0.5": NEAR, "keep 0.25": INSIDE, "keep 0.1": FAR_BELOW}), "partly"),
    Case("every keep rate may lose more than 2 points", _fig4_sparsifiner(
        {"keep 0.5": OUTSIDE, "keep 0.25": FAR_BELOW, "keep 0.1": FAR_BELOW}), "not shown"),
]


# ---------------------------------------------------------------------------------------- slimswin.fig4
def _fig4_slimswin(tuned_minus_teacher, random_gain, uniform_gain, raw_gain=(0.0, 0.0, 0.0), teacher: float = 0.95):
    """SlimSwin fine-tuned = teacher + ``tuned_minus_teacher``; the fine-tuned baselines ``*_gain`` below it; no
    fine-tune: SlimSwin's masks ``raw_gain`` above the baselines' (0.70)."""
    def build():
        tuned = [teacher + d for d in tuned_minus_teacher]
        rows = {("fine-tuned", "saliency"): tuned,
                ("fine-tuned", "random"): [t - g for t, g in zip(tuned, random_gain)],
                ("fine-tuned", "uniform"): [t - g for t, g in zip(tuned, uniform_gain)],
                ("no fine-tune", "saliency"): [0.70 + g for g in raw_gain],
                ("no fine-tune", "random"): [0.70] * 3, ("no fine-tune", "uniform"): [0.70] * 3}
        stages, masks = ["no fine-tune", "fine-tuned"], ["saliency", "random", "uniform"]
        c = np.stack([np.stack([_arm(rows[(st, m)]) for m in masks]) for st in stages])
        seeds = xr.Dataset({"correct": (("stage", "masks", "seed", "sample"), c),
                            "teacher_correct": ("sample", _block(teacher))},
                           coords={"stage": stages, "masks": masks, "seed": [0, 1, 2], "sample": np.arange(N)},
                           attrs={"ratio": 2 / 3})
        return xr.Dataset(), xr.Dataset(), seeds

    return build


KEEPS = tuple(-0.034 + d for d in ABOVE)  # −2.4, −2.2, −2.0 points: low −2.7 > −3
LOSES = tuple(-0.034 + d for d in ACROSS)  # −3.0, −2.2, −1.4 points: low −4.2 < −3
FIG4_SLIMSWIN = [
    Case("keeps accuracy, beats both fine-tuned baselines in every seed", _fig4_slimswin(KEEPS, ABOVE, ABOVE), "shown"),
    Case("keeps accuracy, beats uniform but the random baseline's interval contains 0",
         _fig4_slimswin(KEEPS, ACROSS, ABOVE), "partly"),
    Case("may lose more than 3 points, beats both baselines", _fig4_slimswin(LOSES, ABOVE, ABOVE), "partly"),
    Case("keeps accuracy, no difference from any baseline", _fig4_slimswin(KEEPS, NEAR, NEAR), "partly"),
    Case("may lose more than 3 points, masks alone beat the baselines only without fine-tuning",
         _fig4_slimswin(LOSES, NEAR, NEAR, raw_gain=ABOVE), "partly"),
    Case("may lose more than 3 points and wins nowhere", _fig4_slimswin(LOSES, NEAR, ACROSS, raw_gain=ACROSS),
         "not shown"),
]


CASES = {"attentionlite.fig2": FIG2, "far.table3": TABLE3, "nondeep.table5": TABLE5, "sparsifiner.fig4": FIG4_SPARSIFINER,
         "slimswin.fig4": FIG4_SLIMSWIN}
