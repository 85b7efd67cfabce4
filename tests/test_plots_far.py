"""FAR plots from Datasets alone: titles, labelled axes, colour bars with units; no torch needed."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402
from test_token_maps import _maps  # noqa: E402

from workbench.analysis.token_maps import agreement, stack_maps  # noqa: E402
from workbench.plots.far import plot_agreement, plot_cls_comparison, plot_retention, plot_token_maps  # noqa: E402


def _colorbar_labels(fig) -> list[str]:
    return [a.get_ylabel() for a in fig.axes if a.get_label() == "<colorbar>"]


def test_plot_retention():
    kept = np.zeros((3, 2, 2))
    kept[0, 0, 0], kept[2, 1, 1] = 1.0, 0.25
    ds = xr.Dataset({"retention": (("layer", "head", "direction"), kept)},
                    coords={"layer": [0, 1, 2], "head": [0, 1], "direction": ["forward", "reverse"]})
    fig = plot_retention(ds)
    axes = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    assert [a.get_title() for a in axes] == ["forward LSTMs · 17% kept", "reverse LSTMs · 4% kept"]
    assert axes[0].get_xlabel() == "head" and axes[0].get_ylabel() == "layer (block)"
    texts = [t.get_text() for t in axes[0].texts]
    assert texts[0] == "100" and texts.count("0") == 5  # % annotated per (layer, head)
    assert _colorbar_labels(fig) == ["hidden units kept (%)"]
    assert "overall" in fig._suptitle.get_text()
    plt.close(fig)


def test_plot_maps_and_agreement():
    maps = stack_maps({"teacher attention": _maps("attention", 0), "FAR saliency": _maps("dependency", 1)}, normalize="row")
    image = np.random.default_rng(0).random((16, 16))
    fig = plot_cls_comparison(maps, image, layers=[2], heads=[0, 1])
    axes = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    assert len(axes) == 4 and axes[0].get_ylabel() == "teacher attention" and axes[2].get_ylabel() == "FAR saliency"
    assert len(_colorbar_labels(fig)) == 2 and all("share of CLS row" in s for s in _colorbar_labels(fig))
    plt.close(fig)
    fig = plot_token_maps(maps, layer=1, shared_scale=False)
    axes = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    assert [a.get_title() for a in axes] == ["teacher attention", "FAR saliency"]
    assert axes[0].get_xlabel() == "key token (input)" and axes[0].get_ylabel() == "query token (output)"
    assert "block 1" in fig._suptitle.get_text() and len(_colorbar_labels(fig)) == 2
    plt.close(fig)
    fig = plot_agreement({"paper-style": agreement(maps, reference="teacher attention")})
    axes = [a for a in fig.axes]
    assert [a.get_xlabel() for a in axes] == ["layer (block)"] * 3
    assert fig.legends and "FAR saliency vs teacher attention" in [t.get_text() for t in fig.legends[0].texts]
    plt.close(fig)


def test_unnormalised_maps_keep_query_magnitude_and_share_scales_by_unit():
    """Fig. 6/12–14: the default draws the stored values (per-query magnitude kept, so bands can show); panels in
    the same unit share one colour bar naming the unit; normalize="row" is the mean of rows that sum to 1."""
    dep = _maps("dependency", 1)
    bands = dep.copy(deep=True)  # query 4 depends 10x more strongly on its inputs: a horizontal band
    bands["dependency"] = dep["dependency"] * xr.DataArray(np.where(np.arange(17) == 4, 10.0, 1.0), dims="query")
    maps = stack_maps({"teacher attention": _maps("attention", 0), "teacher saliency": dep, "FAR saliency": bands})
    fig = plot_token_maps(maps, layer=1)
    panels = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    shown = panels[2].images[0].get_array()
    np.testing.assert_allclose(shown, maps["map"].sel(model="FAR saliency", layer=1).mean(("head", "sample")).values, rtol=1e-6)
    assert shown[4].mean() > 5 * np.delete(shown, 4, axis=0).mean()  # the band is there
    assert panels[1].images[0].norm.vmax == panels[2].images[0].norm.vmax  # one scale for the two saliencies
    assert panels[0].images[0].norm.vmax != panels[1].images[0].norm.vmax
    assert sorted(_colorbar_labels(fig)) == ["attention: probability\n(square-root colour scale)",
                                             "saliency: gradient norm\n(square-root colour scale)"]  # the default
    plt.close(fig)
    fig = plot_token_maps(maps, layer=1, normalize="row")
    shown = [a for a in fig.axes if a.get_label() != "<colorbar>"][2].images[0].get_array()
    rows = maps["map"].sel(model="FAR saliency", layer=1)
    np.testing.assert_allclose(shown, (rows / rows.sum("key")).mean(("head", "sample")).values, rtol=1e-5)
    np.testing.assert_allclose(shown.sum(-1), 1.0, rtol=1e-5)  # the band is gone
    assert _colorbar_labels(fig) == ["share of query row (attention & saliency)\n(square-root colour scale)"]
    plt.close(fig)
    fig = plot_cls_comparison(maps, layers=[1], heads=[0, 1], models=["teacher saliency", "FAR saliency"])
    labels = _colorbar_labels(fig)
    assert len(labels) == 2 and all("gradient norm" in s for s in labels)
    plt.close(fig)


def _agreement_views(far_rho: float, seed: int = 0) -> xr.Dataset:
    """far.agreement's layout: views × (FAR saliency, teacher saliency) × 8 images × 3 layers; the teacher's
    like-for-like rows are all NaN (it is the reference there), as in the stored data."""
    rng = np.random.default_rng(seed)
    views, models = ["paper-style", "like-for-like", "like-for-like, raw"], ["FAR saliency", "teacher saliency"]
    v = np.empty((3, 2, 8, 3))
    v[:, 0] = far_rho + 0.02 * rng.standard_normal((3, 8, 3))
    v[:, 1] = 0.9 + 0.02 * rng.standard_normal((3, 8, 3))
    v[1:, 1] = np.nan
    return xr.Dataset({m: (("view", "model", "sample", "layer"), v.copy()) for m in ("spearman", "pearson", "js")},
                      coords={"view": views, "model": models, "sample": np.arange(8), "layer": np.arange(3),
                              "reference": ("view", ["teacher attention", "teacher saliency", "teacher saliency"]),
                              "normalize": ("view", ["row", "row", "none"])})


def test_far_agreement_legend_names_each_reference_and_the_verdict_follows_the_data():
    from workbench.figures.far.findings import agreement_verdict
    from workbench.figures.far.items import plot_agreement_views

    fig = plot_agreement_views(_agreement_views(0.1))
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "FAR saliency vs teacher saliency" in names and "FAR saliency vs teacher attention" in names
    assert not any("teacher saliency vs teacher saliency" in n for n in names)  # all-NaN rows: no legend entry
    assert "ceiling of 0.9" in fig._suptitle.get_text()
    plt.close(fig)
    assert agreement_verdict(_agreement_views(0.1)).status == "partly"
    assert agreement_verdict(_agreement_views(0.6)).status == "shown"
    assert agreement_verdict(_agreement_views(0.0)).status == "not shown"


def test_agreement_bars_are_the_verdicts_95_percent_t_intervals():
    """far.agreement's error bars are the interval the verdict uses (Student t over images), not a standard deviation."""
    from scipy import stats

    maps = stack_maps({"teacher attention": _maps("attention", 0, samples=(1, 2, 3)),
                       "FAR saliency": _maps("dependency", 1, samples=(1, 2, 3))}, normalize="row")
    ds = agreement(maps, reference="teacher attention")
    fig = plot_agreement({"paper-style": ds}, metrics=("spearman",))
    bars = [c for c in fig.axes[0].collections if c.get_segments()][0].get_segments()  # one vertical segment per layer
    rho = ds["spearman"].sel(model="FAR saliency").values  # (sample, layer)
    lo, hi = stats.t.interval(0.95, rho.shape[0] - 1, loc=rho.mean(0), scale=stats.sem(rho, axis=0))
    np.testing.assert_allclose([s[:, 1].min() for s in bars], lo, rtol=1e-6)
    np.testing.assert_allclose([s[:, 1].max() for s in bars], hi, rtol=1e-6)
    plt.close(fig)


def test_cls_heads_show_every_head_and_the_means_the_verdict_reads():
    from workbench.plots.far import plot_cls_heads

    maps = stack_maps({"teacher attention": _maps("attention", 0), "teacher saliency": _maps("dependency", 2),
                       "FAR saliency": _maps("dependency", 1)})
    image = np.zeros((16, 16))
    image[4:12, 6:9] = 1.0
    fig = plot_cls_heads(maps, layer=2, sample=7, models=list(maps["model"].values), image=image, title="t")
    axes = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    assert len(axes) == 3 * (2 + 2)  # 3 models × (2 heads + head mean + head-and-image mean)
    assert [a.get_title() for a in axes[4:8]] == ["teacher head 0", "teacher head 1", "teacher: mean of heads",
                                                  "teacher: mean of heads\n& 2 images"]
    assert axes[8].get_title() == "FAR head 0" and "teacher head n is not FAR head n" in fig._suptitle.get_text()
    assert axes[0].images[0].get_alpha() is None  # the map is opaque: its colours are the colour bar's
    assert axes[0].collections and not axes[3].collections  # the digit's outline on the image's panels only
    mean = maps["cls_map"].sel(model="FAR saliency", layer=2).mean(("head", "sample")).transpose("y", "x").values
    np.testing.assert_allclose(axes[11].images[0].get_array(), mean)
    assert len(_colorbar_labels(fig)) == 3
    plt.close(fig)


def test_order_bias_plot():
    from test_verdict_rules import Case  # noqa: F401  (verdict_cases_far imports it)
    from verdict_cases_far import _order

    from workbench.figures.far.order import order_measures, plot_order_bias

    maps = _order({2: 0.9, 3: 0.9, 4: 0.9, 5: 0.9}, 0.05)()[0].assign_attrs(profile="demo")
    m = order_measures(maps)
    np.testing.assert_allclose(m["order_r"].sel(model="FAR saliency", layer=3).mean(), 0.9, atol=1e-9)
    fig = plot_order_bias(maps)
    axes = fig.axes
    assert [a.get_xlabel() for a in axes[:2]] == ["block", "block"]
    assert "1 / sequence distance" in axes[0].get_ylabel() and "first patch row" in axes[1].get_ylabel()
    assert {"FAR saliency", "teacher saliency", "teacher attention"} <= {t.get_text() for t in fig.legends[0].texts}
    plt.close(fig)
