"""workbench.stats.seed_diff_interval against independent computations (scipy's one-sample t test, statsmodels-free)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from workbench.stats import paired_diff_interval, seed_diff_interval


def _arms(seeds: int, n: int = 400, gap: float = 0.03, spread: float = 0.02, seed: int = 0):
    rng = np.random.default_rng(seed)
    base = rng.random(n)  # per-image difficulty shared by both arms (what makes them paired)
    a = np.stack([(base < 0.7 + gap + spread * rng.standard_normal()).astype(float) for _ in range(seeds)])
    b = np.stack([(base < 0.7 + spread * rng.standard_normal()).astype(float) for _ in range(seeds)])
    return a, b


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_equals_scipy_t_interval_over_seed_differences(seeds):
    a, b = _arms(seeds, seed=seeds)
    mean, lo, hi, s = seed_diff_interval(a, b)
    per_seed = [a[k].mean() - b[k].mean() for k in range(seeds)]  # computed here, one seed at a time
    ci = stats.ttest_1samp(per_seed, 0.0).confidence_interval(0.95)
    assert s == seeds
    assert mean == pytest.approx(np.mean(per_seed), abs=1e-12)
    assert (lo, hi) == (pytest.approx(ci.low, abs=1e-12), pytest.approx(ci.high, abs=1e-12))
    ci90 = stats.ttest_1samp(per_seed, 0.0).confidence_interval(0.90)
    assert seed_diff_interval(a, b, level=0.90)[1:3] == (pytest.approx(ci90.low, abs=1e-12),
                                                          pytest.approx(ci90.high, abs=1e-12))


def test_one_row_arm_is_compared_with_every_seed():
    a, b = _arms(3)
    teacher = b[0]
    per_seed = [a[k].mean() - teacher.mean() for k in range(3)]
    ci = stats.ttest_1samp(per_seed, 0.0).confidence_interval(0.95)
    for other in (teacher, teacher[None, :]):
        _, lo, hi, s = seed_diff_interval(a, other)
        assert s == 3 and lo == pytest.approx(ci.low, abs=1e-12) and hi == pytest.approx(ci.high, abs=1e-12)


def test_one_seed_falls_back_to_the_paired_image_interval():
    a, b = _arms(1)
    d = a[0] - b[0]
    half = stats.norm.ppf(0.975) * d.std(ddof=1) / np.sqrt(d.size)  # the paired normal interval, computed here
    mean, lo, hi, s = seed_diff_interval(a, b)
    assert s == 1 and mean == pytest.approx(d.mean())
    assert (lo, hi) == (pytest.approx(d.mean() - half), pytest.approx(d.mean() + half))
    assert (lo, hi) == pytest.approx(paired_diff_interval(a[0], b[0]))


def test_seed_spread_widens_the_interval():
    """Two seeds that disagree by 10 points give a wide interval even though each is sharp over the images."""
    n = 1000
    a = np.zeros((2, n))
    a[0, :800], a[1, :700] = 1, 1  # 80 % and 70 %
    b = np.zeros((2, n))
    b[:, :740] = 1  # 74 % both seeds
    mean, lo, hi, _ = seed_diff_interval(a, b)
    assert mean == pytest.approx(0.01)
    assert lo < -0.3 and hi > 0.3  # t(1) = 12.7 times sd 0.0707 / √2
    assert paired_diff_interval(a[0], b[0])[0] > 0  # seed 0 alone: FAR above 0 beyond the image noise


@pytest.mark.parametrize("shapes", [((3, 10), (2, 10)), ((3, 10), (3, 9)), ((0, 10), (1, 10))])
def test_bad_shapes_are_refused(shapes):
    with pytest.raises(ValueError, match="seed-level correctness"):
        seed_diff_interval(np.zeros(shapes[0]), np.zeros(shapes[1]))


def test_latency_ratio_interval_is_statsmodels_t_interval_on_log_ratios():
    """far.table2's latency interval: a t interval over the runs of the per-run log ratio (statsmodels' own)."""
    from statsmodels.stats.weightstats import DescrStatsW

    from workbench.figures.far.findings import latency_ratio_interval

    ratios = [0.91, 0.95, 0.88, 0.97]
    g, lo, hi, n = latency_ratio_interval(",".join(map(str, ratios)))
    want = DescrStatsW(np.log(ratios)).tconfint_mean(0.05)
    assert n == 4 and np.allclose([lo, hi], np.exp(want), rtol=1e-12)
    assert np.isclose(g, np.exp(np.mean(np.log(ratios))), rtol=1e-12)
    assert np.isnan(latency_ratio_interval("0.9")[1]) and latency_ratio_interval("")[3] == 0
