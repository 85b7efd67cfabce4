"""Verdicts are computed from a figure's data: the caption and the findings table follow the data, never a constant."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from workbench.figures import DATA, FIGURES, Finding, Verdict, dataset, figure
from workbench.figures.context import Context
from workbench.figures.render import draw, write_index
from workbench.stats import diff_interval, paired_diff_interval, wilson_interval

GAP = {"value": 0.2}  # the toy data's accuracy gap, changed by the test


def _gap_verdict(ds: xr.Dataset) -> Verdict:
    a, b, n = float(ds["acc"].sel(model="student")), float(ds["acc"].sel(model="teacher")), int(ds.attrs["n"])
    lo, hi = diff_interval(a, n, b, n)
    stat = f"Δ = {100 * (a - b):+.1f} points (95% CI {100 * lo:+.1f} … {100 * hi:+.1f})"
    if lo > 0:
        return Verdict("shown", stat)
    return Verdict("not shown", stat, "the gap is within the binomial noise of the held-out images")


@pytest.fixture
def toy_item():
    @dataset("findingtoy.acc")
    def make(ctx) -> xr.Dataset:
        return xr.Dataset({"acc": ("model", [0.5, 0.5 + GAP["value"]])}, coords={"model": ["teacher", "student"]},
                          attrs={"n": 400})

    spec = figure("findingtoy.table1", paper="findingtoy", caption="A toy accuracy table.", data="findingtoy.acc",
                  plot=lambda ds: __import__("workbench.plots.table", fromlist=["Table"]).Table(
                      ds.to_dataframe().reset_index(), "toy"),
                  kind="table", finding=Finding("the student beats the teacher", "+20 points", _gap_verdict))
    yield spec
    FIGURES.pop("findingtoy.table1")
    DATA.pop("findingtoy.acc")


def test_verdict_follows_the_data(toy_item, tmp_path):
    out = tmp_path / "figs"
    out.mkdir()
    ctx = Context("smoke", "cpu", force=True, log=lambda _: None)
    draw(toy_item, ctx, out, reuse=False)
    index = write_index(out).read_text()
    assert "## Findings" in index and "**Verdict: shown**" in index and "+20.0 points" in index
    assert "1 shown, 0 partly, 0 not shown" in index

    GAP["value"] = 0.01  # the same item, other data: the verdict must change
    ctx.data_path("findingtoy.acc").unlink()
    draw(toy_item, ctx, out, reuse=False)
    index = write_index(out).read_text()
    assert "**Verdict: not shown** — the gap is within the binomial noise" in index
    assert "0 shown, 0 partly, 1 not shown" in index


def test_verdict_status_is_checked():
    with pytest.raises(ValueError, match="verdict status"):
        Verdict("maybe", "x")


@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_intervals_against_independent_computation(level):
    """Each interval of workbench.stats equals scipy's / statsmodels' own computation of it, at several levels and
    sample sizes (a standard error divided by n instead of sqrt(n), a wrong quantile or a lost term fails here)."""
    from scipy.stats import binomtest, norm, sem
    from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint
    from statsmodels.stats.weightstats import DescrStatsW

    for k, n in ((900, 1000), (3, 20), (0, 15), (58, 60)):
        ci = binomtest(k, n).proportion_ci(level, method="wilson")
        assert wilson_interval(k / n, n, level) == pytest.approx((ci.low, ci.high), abs=1e-12)
        assert wilson_interval(k / n, n, level) == pytest.approx(
            proportion_confint(k, n, alpha=1 - level, method="wilson"), abs=1e-12)
    for (ka, na), (kb, nb) in (((820, 1000), (790, 1000)), ((12, 40), (30, 50)), ((581, 1000), (585, 1000))):
        ref = confint_proportions_2indep(ka, na, kb, nb, method="wald", compare="diff", alpha=1 - level)
        assert diff_interval(ka / na, na, kb / nb, nb, level) == pytest.approx(ref, abs=1e-12)
    rng = np.random.default_rng(0)
    for n in (30, 1000):
        a = (rng.random(n) < 0.8).astype(float)
        b = np.where(rng.random(n) < 0.9, a, 1 - a)  # positively correlated with a
        d = a - b
        lo, hi = paired_diff_interval(a, b, level)
        assert (lo, hi) == pytest.approx(norm.interval(level, loc=d.mean(), scale=sem(d)), abs=1e-12)
        assert (lo, hi) == pytest.approx(DescrStatsW(d).zconfint_mean(alpha=1 - level), abs=1e-12)
        ulo, uhi = diff_interval(a.mean(), a.size, b.mean(), b.size, level)
        assert lo < d.mean() < hi and (hi - lo) < (uhi - ulo)  # pairing narrows the interval


# nondeep.table5 (a verdict over training seeds): tests/verdict_cases_seeds.py


def test_far_table1_verdict_is_paired_per_image():
    """far.table1 reads per-image correctness: FAR − teacher gets the paired interval (scipy's t-free normal interval of
    the mean per-image difference, computed here independently), and an old store without it is refused clearly."""
    from scipy.stats import norm

    from workbench.figures.far.findings import table1_verdict

    rng = np.random.default_rng(0)
    teacher = (rng.random(1000) < 0.95).astype(np.int8)
    far = teacher.copy()
    far[rng.choice(np.flatnonzero(teacher == 0), 30, replace=False)] = 1  # FAR right on 30 of the teacher's errors
    far[rng.choice(np.flatnonzero(teacher == 1), 8, replace=False)] = 0  # and wrong on 8 of its successes
    ds = xr.Dataset({"kind": ("row", ["DeiT", "FAR", "FAR†"]), "val_acc": ("row", [0.0] * 3),
                     "correct": (("row", "heldout_sample"), np.stack([teacher, far, teacher]))})
    d = far.astype(float) - teacher
    half = norm.ppf(0.975) * np.sqrt(np.var(d, ddof=1) / d.size)
    want = f"{100 * d.mean():+.1f} points (95% CI {100 * (d.mean() - half):+.1f} … {100 * (d.mean() + half):+.1f}"
    v = table1_verdict(ds)
    assert v.status == "shown" and f"FAR − teacher {want}" in v.statistic and "paired over 1000" in v.statistic
    with pytest.raises(ValueError, match="--force"):
        table1_verdict(ds.drop_vars("correct"))


def test_far_table2_verdict_follows_the_data():
    from workbench.figures.far.findings import table2_verdict

    def rows(pruned_ms_384: float, pruned_gmacs: float = 1.0) -> xr.Dataset:
        recs = [("DeiT-Tiny", 224, 1.25, 26.0), ("FAR-Tiny†", 224, pruned_gmacs, 31.0),
                ("DeiT-Tiny", 384, 4.6, 100.0), ("FAR-Tiny†", 384, 3.1, pruned_ms_384), ("demo ViT", 28, 0.01, 1.0)]
        deit = {r[1]: r[3] for r in recs if r[0].startswith("DeiT")}  # three round-robin runs, ±1 % around each
        runs = [",".join(f"{r[3] * f / deit[r[1]]:.5f}" for f in (0.99, 1.0, 1.01)) if r[1] in deit else ""
                for r in recs]
        return xr.Dataset({"model": ("row", [r[0] for r in recs]), "size": ("row", [r[1] for r in recs]),
                           "gmacs": ("row", [r[2] for r in recs]), "ms": ("row", [r[3] for r in recs]),
                           "ratio_runs": ("row", runs),
                           "family": ("row", [f"tiny-{r[1]}" if r[1] > 28 else "demo" for r in recs])},
                          coords={"row": range(len(recs))})

    assert table2_verdict(rows(85.0)).status == "shown"  # slower at 224² is the paper's own result, not a failure
    assert table2_verdict(rows(110.0)).status == "partly"
    assert table2_verdict(rows(85.0, pruned_gmacs=1.5)).status == "not shown"
