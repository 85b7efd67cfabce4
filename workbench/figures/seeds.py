"""Training seeds of the items whose verdict compares trained arms: per-seed held-out correctness, the interval of a
difference over seeds and images, its wording.

One training run per arm measures a difference with the noise of the held-out images only; another seed moves such
a difference by about as much as the effects the papers claim (AttentionLite: ~2 points between two seeds,
``docs/attentionlite-demo-budgets.md``). Each item whose verdict rests on a few points between trained arms
(``attentionlite.fig2``, ``far.table3``, ``nondeep.table5``, ``sparsifiner.fig4``, ``slimswin.fig4``) has a data step
``<item>_seeds`` that trains its arms on the seeds of the method's budget — the first seed is the run the item's other
data use (reused, not retrained) — and stores :func:`correctness_by_seed`'s ``correct(arm, seed, sample)``. Its verdict
takes :func:`seed_diff`: per seed the paired difference over the same images, then a t interval over the seeds
(:func:`workbench.stats.seed_diff_interval`), and says how many seeds each arm has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, NamedTuple

import numpy as np
import xarray as xr

from workbench.stats import seed_diff_interval

if TYPE_CHECKING:
    from workbench.figures.context import Context

__all__ = ["SeedDiff", "correctness_by_seed", "seed_diff", "fmt_seed_diff", "seeds_of"]


class SeedDiff(NamedTuple):
    """A difference of accuracies between two arms over seeds (fractions) and what it rests on."""

    mean: float  # mean over the seeds of the per-seed paired difference
    low: float  # 95 % interval (t over seeds; the paired image interval with one seed)
    high: float
    seeds: int  # seeds the interval spans (1: image noise only)
    per_seed: tuple[float, ...]  # each seed's paired difference over the images (one entry with one seed)
    images: int  # held-out images per seed


def correctness_by_seed(ctx: "Context", runs: Mapping[tuple[str, int], object]) -> xr.Dataset:
    """Per-image held-out correctness of every ``(arm, seed) -> Run``: ``correct(arm, seed, sample)`` (NaN where an
    arm has no run of that seed) and ``run(arm, seed)`` (its id, "" where none), the runs recorded as used."""
    from workbench.pipelines.heldout import correctness

    arms = list(dict.fromkeys(a for a, _ in runs))
    seeds = sorted({int(s) for _, s in runs})
    rows: dict[tuple[str, int], np.ndarray] = {}
    for (arm, seed), run in runs.items():
        model = ctx.model(run)
        rows[(arm, int(seed))] = correctness(model, ctx.heldout(model), ctx.device).astype(float)
    n = len(next(iter(rows.values())))
    correct = np.full((len(arms), len(seeds), n), np.nan)
    ids = np.full((len(arms), len(seeds)), "", dtype=object)
    for (arm, seed), c in rows.items():
        correct[arms.index(arm), seeds.index(seed)] = c
        ids[arms.index(arm), seeds.index(seed)] = runs[(arm, seed)].id
    return xr.Dataset({"correct": (("arm", "seed", "sample"), correct), "run": (("arm", "seed"), ids.astype(str))},
                      coords={"arm": arms, "seed": seeds, "sample": np.arange(n)})


def _rows(c) -> np.ndarray:
    """``(seed, sample)`` rows of ``c`` that were run (no NaN); a ``(sample,)`` vector is one row."""
    a = np.atleast_2d(np.asarray(c, dtype=float))
    return a[np.isfinite(a).all(axis=1)]


def seed_diff(a, b) -> SeedDiff:
    """Accuracy of arm ``a`` minus arm ``b``, each ``(seed, sample)`` correctness (NaN rows: seeds not run) or a
    ``(sample,)`` vector (one run, e.g. the teacher).

    Seeds both arms have are paired seed by seed; an arm with a single run is compared with every seed of the other
    (its own seed spread is then not sampled); with one seed on each side the interval is the paired image interval.

    Raises:
        ValueError: an arm without any run.
    """
    a_full, b_full = np.atleast_2d(np.asarray(a, dtype=float)), np.atleast_2d(np.asarray(b, dtype=float))
    ra, rb = _rows(a_full), _rows(b_full)
    if not len(ra) or not len(rb):
        raise ValueError("seed_diff needs at least one run of each arm")
    if a_full.shape[0] == b_full.shape[0]:
        both = np.isfinite(a_full).all(axis=1) & np.isfinite(b_full).all(axis=1)
        if both.sum() >= 2 or (len(ra) == 1 and len(rb) == 1 and both.sum() == 1):
            ra, rb = a_full[both], b_full[both]
    if len(ra) == len(rb) or len(rb) == 1:
        mean, lo, hi, s = seed_diff_interval(ra, rb)
        per = tuple(float(v) for v in (ra - rb).mean(axis=1))
    elif len(ra) == 1:  # arm a ran once: b − a over b's seeds, turned round
        mean, lo, hi, s = seed_diff_interval(rb, ra)
        mean, lo, hi = -mean, -hi, -lo
        per = tuple(float(v) for v in (ra - rb).mean(axis=1))
    else:  # unequal seed sets with several on each side and fewer than two in common: pair the first of each
        mean, lo, hi, s = seed_diff_interval(ra[:1], rb[:1])
        per = (float(ra[0].mean() - rb[0].mean()),)
    return SeedDiff(mean, lo, hi, s, per, int(ra.shape[1]))


def fmt_seed_diff(d: SeedDiff) -> str:
    """``+1.2 points (95% CI −0.3 … +2.7 over 3 seeds × 1000 images; per seed +0.4, +1.1, +2.1)``."""
    noise = (f"over {d.seeds} seeds × {d.images} images; per seed " + ", ".join(f"{100 * v:+.1f}" for v in d.per_seed)
             if d.seeds > 1 else f"{d.images} images, 1 seed: image noise only")
    return f"{100 * d.mean:+.1f} points (95% CI {100 * d.low:+.1f} … {100 * d.high:+.1f} {noise})"


def seeds_of(ds: xr.Dataset, arm: str, var: str = "correct") -> int:
    """How many seeds ``arm`` was trained on (rows of ``ds[var]`` without NaN)."""
    return len(_rows(ds[var].sel(arm=arm).transpose("seed", "sample").values))
