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


def test_intervals_against_independent_computation():
    rng = np.random.default_rng(0)
    lo, hi = wilson_interval(0.9, 1000)
    from scipy.stats import binomtest

    ci = binomtest(900, 1000).proportion_ci(0.95, method="wilson")
    assert (lo, hi) == pytest.approx((ci.low, ci.high), abs=1e-12)
    a = (rng.random(2000) < 0.8).astype(float)
    b = np.where(rng.random(2000) < 0.9, a, 1 - a)  # positively correlated with a
    plo, phi = paired_diff_interval(a, b)
    ulo, uhi = diff_interval(a.mean(), a.size, b.mean(), b.size)
    assert plo < a.mean() - b.mean() < phi and (phi - plo) < (uhi - ulo)  # pairing narrows the interval


# nondeep.table5 (a verdict over training seeds): tests/verdict_cases_seeds.py


def test_far_table1_verdict_follows_the_data():
    from workbench.figures.findings_far import table1_verdict

    def runs(far: float, pruned: float) -> xr.Dataset:
        return xr.Dataset({"kind": ("row", ["DeiT", "FAR", "FAR†"]), "val_acc": ("row", [0.95, far, pruned]),
                           "val_images": ("row", [1000.0] * 3)})

    assert table1_verdict(runs(0.945, 0.95)).status == "shown"
    assert table1_verdict(runs(0.80, 0.95)).status == "partly"
    assert table1_verdict(runs(0.80, 0.70)).status == "not shown"


def test_far_table2_verdict_follows_the_data():
    from workbench.figures.findings_far import table2_verdict

    def rows(pruned_ms_384: float, pruned_gmacs: float = 1.0) -> xr.Dataset:
        recs = [("DeiT-Tiny", 224, 1.25, 26.0), ("FAR-Tiny†", 224, pruned_gmacs, 31.0),
                ("DeiT-Tiny", 384, 4.6, 100.0), ("FAR-Tiny†", 384, 3.1, pruned_ms_384), ("demo ViT", 28, 0.01, 1.0)]
        return xr.Dataset({"model": ("row", [r[0] for r in recs]), "size": ("row", [r[1] for r in recs]),
                           "gmacs": ("row", [r[2] for r in recs]), "ms": ("row", [r[3] for r in recs]),
                           "family": ("row", [f"tiny-{r[1]}" if r[1] > 28 else "demo" for r in recs])},
                          coords={"row": range(len(recs))})

    assert table2_verdict(rows(85.0)).status == "shown"  # slower at 224² is the paper's own result, not a failure
    assert table2_verdict(rows(110.0)).status == "partly"
    assert table2_verdict(rows(85.0, pruned_gmacs=1.5)).status == "not shown"
