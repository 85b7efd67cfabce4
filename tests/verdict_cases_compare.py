"""Verdict cases of the comparison (tests/test_verdict_rules.py): hand-built ``compare.<arch>`` Datasets (per-image
held-out correctness, MACs) and ``compare.latency`` rows (per-round times), each changed to push
``compare.table1``'s rule to one side of a threshold."""

from __future__ import annotations

import numpy as np
import xarray as xr
from test_verdict_rules import Case

N = 1000


def _teacher() -> np.ndarray:
    out = np.zeros(N)
    out[np.random.default_rng(0).permutation(N)[:930]] = 1
    return out


def _student(teacher: np.ndarray, gain: int, flips: int = 5, seed: int = 1) -> np.ndarray:
    """The teacher's correctness with ``flips`` discordant images each way and a net ``gain`` images."""
    rng = np.random.default_rng(seed)
    right, wrong = rng.permutation(np.flatnonzero(teacher == 1)), rng.permutation(np.flatnonzero(teacher == 0))
    out = teacher.copy()
    out[right[: flips + max(0, -gain)]] = 0
    out[wrong[: flips + max(0, gain)]] = 1
    return out


def _comparison(arch: str, students: dict[str, tuple[int, float]]) -> xr.Dataset:
    """``students``: label -> (net images right vs the teacher, MACs ratio to the teacher)."""
    t = _teacher()
    correct = [t] + [_student(t, g, seed=i + 1) for i, (g, _) in enumerate(students.values())]
    models = ["teacher", *students]
    return xr.Dataset({"heldout_correct": (("model", "heldout_sample"), np.array(correct)),
                       "macs": ("model", [1e7] + [1e7 * m for _, m in students.values()])},
                      coords={"model": models}).assign_attrs(arch=arch, title=f"{arch} teacher")


def _latency(ratios: dict[tuple[str, str], float], rounds: int = 24, jitter: float = 0.05) -> xr.Dataset:
    """Per-round times: the teacher 10 ms × a shared load factor per round, a student its ratio × that × its own
    noise (log-normal, sd ``jitter``)."""
    rng = np.random.default_rng(3)
    load = np.exp(0.2 * rng.standard_normal(rounds))
    archs = sorted({a for a, _ in ratios})
    rows, times = [], []
    for arch in archs:
        for model, ratio in [("teacher", 1.0), *[(m, r) for (a, m), r in ratios.items() if a == arch]]:
            t = 10 * ratio * load * (np.exp(jitter * rng.standard_normal(rounds)) if model != "teacher" else 1)
            rows.append((arch, model))
            times.append(t)
    times = np.array(times)
    med = np.median(times, 1)
    base = {a: med[i] for i, (a, m) in enumerate(rows) if m == "teacher"}
    return xr.Dataset({"arch": ("row", np.array([a for a, _ in rows], dtype=object)),
                       "model": ("row", np.array([m for _, m in rows], dtype=object)),
                       "ms": ("row", med), "ratio": ("row", [med[i] / base[a] for i, (a, _) in enumerate(rows)]),
                       "ms_rounds": (("row", "round"), times)}, coords={"row": np.arange(len(rows))})


def _case(vit: dict[str, tuple[int, float, float]], swin: dict[str, tuple[int, float, float]] | None = None,
          jitter: float = 0.05, rounds: int = 24):
    """Students per teacher: label -> (net images vs the teacher, MACs ratio, latency ratio); the figure's data order
    (compare.vit, compare.swin, compare.cnn, compare.latency), the CNN teacher without students."""
    def build():
        swin_ = swin or {}
        lat = {("vit", m): v[2] for m, v in vit.items()} | {("swin", m): v[2] for m, v in swin_.items()}
        empty = xr.Dataset(attrs={"arch": "cnn", "title": "CNN teacher", "students": "[]"})
        swin_ds = _comparison("swin", {m: v[:2] for m, v in swin_.items()}) if swin_ else \
            xr.Dataset(attrs={"arch": "swin", "title": "Swin teacher", "students": "[]"})
        return (_comparison("vit", {m: v[:2] for m, v in vit.items()}), swin_ds, empty,
                _latency(lat, rounds=rounds, jitter=jitter))

    return build


# student vs teacher on 1000 images, 5 discordant each way: −1.0 points has its interval's top just under 0
# (−0.8: just above); latency over 24 rounds with 5 % jitter: a ratio of 0.97 is faster beyond noise, 0.99 not
CASES = {"compare.table1": [
    Case("every student as accurate, fewer MACs and 30 % faster", _case({"FAR": (0, .8, .7), "Sparsifiner": (5, .6, .7)},
                                                                         {"SlimSwin": (-3, .5, .8)}), "shown"),
    Case("FAR 1.15× MACs and 4.2× latency (the demo's), the others cheaper",
         _case({"FAR": (22, 1.15, 4.2), "Sparsifiner": (0, .6, .7)}, {"SlimSwin": (-3, .5, .8)}), "partly"),
    Case("fewer MACs but slower on this CPU (2.8×): not cheaper", _case({"Sparsifiner": (0, .6, 2.8)}), "not shown"),
    Case("cheaper but 3 points below the teacher", _case({"FAR": (-30, .5, .5)}), "not shown"),
    Case("accurate and cheaper (0.97×, beyond the timing noise)", _case({"FAR": (0, .9, .97)}), "shown"),
    Case("accurate, fewer MACs, 0.99× (within the timing noise)", _case({"FAR": (0, .9, .99)}), "not shown"),
    Case("one student 0.8 points under (interval reaches 0), cheaper", _case({"FAR": (-8, .5, .5)}), "shown"),
    Case("one student 1.0 points under (interval below 0), cheaper; another keeps both",
         _case({"FAR": (-10, .5, .5), "Non-deep": (0, .5, .5)}), "partly"),
    Case("as many MACs as the teacher (a train form), faster by noise only", _case({"FAR": (0, 1.0, .5)}), "not shown"),
]}
