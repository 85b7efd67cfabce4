"""Teacher-vs-student token-map comparison (workbench.analysis.token_maps) against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from scipy.spatial.distance import jensenshannon
from scipy.stats import spearmanr

from workbench.analysis.token_maps import agreement, stack_maps, token_maps
from workbench.analysis.tokens import query_key_coords


def _maps(kind: str, seed: int, samples=(3, 7), layers=(0, 1, 2)) -> xr.Dataset:
    """A synthetic attention / dependency Dataset shaped like the extractors' (4x4 patches + CLS)."""
    rng = np.random.default_rng(seed)
    t, heads = 17, 2
    vals = rng.random((len(samples), len(layers), heads, t, t)).astype(np.float32) ** 3
    if kind == "attention":
        vals /= vals.sum(-1, keepdims=True)
    name, cls = ("attention", "cls_attention") if kind == "attention" else ("dependency", "cls_dependency")
    ds = xr.Dataset({name: (("sample", "layer", "head", "query", "key"), vals)},
                    coords={"sample": list(samples), "layer": list(layers), "head": np.arange(heads),
                            **query_key_coords(["cls"], (4, 4))})
    ds[cls] = (("sample", "layer", "head", "y", "x"), vals[:, :, :, 0, 1:].reshape(len(samples), len(layers), heads, 4, 4))
    for v in (name, cls):
        ds[v].attrs["units"] = "probability" if kind == "attention" else "gradient norm"
    if kind == "attention":
        ds = ds.assign_coords(num_heads=("layer", [heads] * len(layers)))
    return ds.assign_coords(y=np.arange(4), x=np.arange(4))


def test_stack_maps_lines_up_and_normalises():
    att, dep = _maps("attention", 0), _maps("dependency", 1, samples=(3, 7, 9), layers=(1, 2))
    raw = token_maps(att, dep)  # default: the values as extracted, units per model
    assert raw.attrs["normalize"] == "none" and raw["units"].values.tolist() == ["probability", "gradient norm"]
    np.testing.assert_array_equal(raw["map"].sel(model="far", sample=7, layer=2).values,
                                  dep["dependency"].sel(sample=7, layer=2).values)
    assert not np.allclose(raw["map"].sel(model="far").sum("key").values, 1.0)  # per-query magnitude kept
    both = token_maps(att, dep, normalize="row")
    assert both["map"].dims == ("model", "sample", "layer", "head", "query", "key")
    assert both["model"].values.tolist() == ["teacher", "far"] and both["measure"].values.tolist() == ["attention", "saliency"]
    assert both["units"].values.tolist() == ["share of the row"] * 2
    assert both["sample"].values.tolist() == [3, 7] and both["layer"].values.tolist() == [1, 2]  # what both share
    np.testing.assert_allclose(both["map"].sum("key").values, 1.0, rtol=1e-5)
    np.testing.assert_allclose(both["cls_map"].sum(("y", "x")).values, 1.0, rtol=1e-5)
    raw = dep["dependency"].sel(sample=7, layer=2, head=1, query=5).values
    np.testing.assert_allclose(both["map"].sel(model="far", sample=7, layer=2, head=1, query=5).values, raw / raw.sum(), rtol=1e-6)
    assert "query_kind" in both.coords and "num_heads" not in both.coords
    with pytest.raises(ValueError, match="neither"):
        stack_maps({"a": att.rename(attention="other")})
    with pytest.raises(ValueError, match="share no"):
        token_maps(att, _maps("dependency", 2, samples=(100,)))


def test_agreement_by_hand():
    att, dep = _maps("attention", 0), _maps("dependency", 1)
    maps = stack_maps({"teacher": att, "copy": att, "far": dep}, normalize="row")
    agree = agreement(maps, reference="teacher")
    raw_stack = agreement(stack_maps({"teacher": att, "copy": att, "far": dep}), reference="teacher")
    for k in agree.data_vars:  # normalize="row" normalises raw maps itself: the same scores
        np.testing.assert_allclose(raw_stack[k].values, agree[k].values, rtol=1e-5)
    assert agree["model"].values.tolist() == ["copy", "far"] and agree.attrs["reference"] == "teacher"
    same = agree.sel(model="copy")
    np.testing.assert_allclose(same["pearson"].values, 1.0, rtol=1e-6)
    np.testing.assert_allclose(same["spearman"].values, 1.0, rtol=1e-6)
    np.testing.assert_allclose(same["js"].values, 0.0, atol=1e-7)
    for s in (3, 7):
        for layer in (0, 2):
            a = maps["map"].sel(model="teacher", sample=s, layer=layer).mean("head").values  # (T, T)
            b = maps["map"].sel(model="far", sample=s, layer=layer).mean("head").values
            far = agree.sel(model="far", sample=s, layer=layer)
            assert float(far["pearson"]) == pytest.approx(np.corrcoef(a.ravel(), b.ravel())[0, 1], rel=1e-5)
            assert float(far["spearman"]) == pytest.approx(spearmanr(a.ravel(), b.ravel())[0], rel=1e-5)
            js = np.mean([jensenshannon(b[q], a[q], base=2) ** 2 for q in range(a.shape[0])])
            assert float(far["js"]) == pytest.approx(js, rel=1e-4)
            ca = maps["cls_map"].sel(model="teacher", sample=s, layer=layer).mean("head").values.ravel()
            cb = maps["cls_map"].sel(model="far", sample=s, layer=layer).mean("head").values.ravel()
            assert float(far["cls_pearson"]) == pytest.approx(np.corrcoef(ca, cb)[0, 1], rel=1e-5)
            assert float(far["cls_js"]) == pytest.approx(jensenshannon(cb, ca, base=2) ** 2, rel=1e-4)
    assert ((agree["js"] >= 0) & (agree["js"] <= 1)).all()
    with pytest.raises(ValueError, match="reference"):
        agreement(maps, reference="nobody")
    with pytest.raises(ValueError, match="one measure"):
        agreement(stack_maps({"a": att, "b": dep}), reference="a", normalize="none")
    with pytest.raises(ValueError, match="already sum to 1"):
        agreement(maps, reference="teacher", normalize="none")


def test_agreement_on_raw_saliency_sees_query_magnitude():
    """normalize="none" (same measure only) scores per-query magnitudes: a map whose rows are rescaled differs in
    Pearson on raw values but is identical row-normalised; JS always compares normalised rows."""
    dep = _maps("dependency", 1)
    scaled = dep.copy(deep=True)
    scaled["dependency"] = dep["dependency"] * xr.DataArray(np.linspace(0.1, 10, 17), dims="query")
    maps = stack_maps({"teacher saliency": dep, "far saliency": scaled})
    row, raw = (agreement(maps, reference="teacher saliency", normalize=n) for n in ("row", "none"))
    np.testing.assert_allclose(row["pearson"].values, 1.0, rtol=1e-6)
    assert (raw["pearson"].values < 0.9).all() and raw.attrs["normalize"] == "none"
    np.testing.assert_allclose(raw["js"].values, row["js"].values)
    a = maps["map"].sel(model="teacher saliency", sample=3, layer=0).mean("head").values
    b = maps["map"].sel(model="far saliency", sample=3, layer=0).mean("head").values
    assert float(raw["pearson"].sel(model="far saliency", sample=3, layer=0)) == pytest.approx(
        np.corrcoef(a.ravel(), b.ravel())[0, 1], rel=1e-5)
