"""Small, pure-numpy statistics the figures' verdicts use to tell a finding from noise.

Accuracies on the demo's held-out images are binomial proportions; two models scored on the same images are
compared with a paired test where per-image correctness is stored (McNemar), or with an unpaired normal
approximation otherwise (conservative for positively correlated models). No torch here: figures only read.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["wilson_interval", "diff_interval", "paired_diff_interval", "z_for"]


def z_for(level: float = 0.95) -> float:
    """Two-sided normal quantile for a confidence ``level`` (0.95 -> 1.96)."""
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2))


def wilson_interval(p: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``p`` measured on ``n`` trials."""
    if n <= 0:
        raise ValueError(f"a proportion needs n > 0 trials, got {n}")
    z = z_for(level)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def diff_interval(p_a: float, n_a: int, p_b: float, n_b: int, level: float = 0.95) -> tuple[float, float]:
    """Normal-approximation interval of ``p_a - p_b`` for two independent proportions."""
    z = z_for(level)
    se = math.sqrt(max(p_a * (1 - p_a), 1e-12) / n_a + max(p_b * (1 - p_b), 1e-12) / n_b)
    d = p_a - p_b
    return d - z * se, d + z * se


def paired_diff_interval(correct_a: np.ndarray, correct_b: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Interval of ``acc_a - acc_b`` for two models scored on the same images (per-image 0/1 correctness)."""
    a, b = np.asarray(correct_a, dtype=float), np.asarray(correct_b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"paired correctness must be two equal-length vectors, got {a.shape} and {b.shape}")
    d = a - b
    se = d.std(ddof=1) / math.sqrt(d.size) if d.size > 1 else 0.0
    return d.mean() - z_for(level) * se, d.mean() + z_for(level) * se


def seed_diff_interval(correct_a, correct_b, level: float = 0.95) -> tuple[float, float, float, int]:
    """Interval of ``acc_a - acc_b`` that includes the spread between training seeds, not only the held-out images.

    Each arm was trained once per seed and scored on the same held-out images. Per seed ``s`` the difference is the
    paired mean over the images, ``d_s = mean_i(a[s, i] - b[s, i])``; each ``d_s`` carries its seed's training noise
    and its images' sampling noise, so a **Student-t interval over the seed-level differences** (``S - 1`` degrees of
    freedom, ``mean(d) ± t · sd(d) / √S``) covers both. With one seed there is no seed spread to measure: the paired
    image interval of :func:`paired_diff_interval` (image noise only) is returned, and ``seeds`` = 1 says so.

    Args:
        correct_a: ``(seeds, images)`` per-image correctness (0/1, or a mean over draws) of arm a, one row per seed.
        correct_b: the same for arm b, row ``s`` trained with the same seed as row ``s`` of a; or one row (or an
            ``(images,)`` vector) for an arm trained once (a shared teacher), compared with every seed of a.
        level: confidence level.

    Returns:
        (mean difference over seeds, low, high, number of seeds).

    Raises:
        ValueError: arrays that are not (seeds, images) over the same images, or arm b with another seed count.
    """
    from scipy.stats import t as student_t

    a, b = np.atleast_2d(np.asarray(correct_a, dtype=float)), np.atleast_2d(np.asarray(correct_b, dtype=float))
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or a.size == 0 or b.shape[0] not in (1, a.shape[0]):
        raise ValueError(f"seed-level correctness must be (seeds, images) arrays over the same images, arm b with one "
                         f"row or as many seeds as arm a; got {a.shape} and {b.shape}")
    s = a.shape[0]
    if s == 1:
        lo, hi = paired_diff_interval(a[0], b[0], level)
        return float(a[0].mean() - b[0].mean()), float(lo), float(hi), 1
    d = (a - b).mean(axis=1)  # (seeds,): each seed's paired difference over the images
    half = float(student_t.ppf(0.5 + level / 2, s - 1)) * d.std(ddof=1) / math.sqrt(s)
    return float(d.mean()), float(d.mean() - half), float(d.mean() + half), s
