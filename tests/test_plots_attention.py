"""Attention plots run on small synthetic Datasets, label what they show, and never import torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import xarray as xr  # noqa: E402

from workbench.analysis.tokens import query_key_coords, window_coords  # noqa: E402
from workbench.plots import set_theme  # noqa: E402
from workbench.plots.attention import plot_attention_grid, plot_cls_maps  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def synthetic_attention(
    layers=(0, 2), heads=3, grid=(4, 5), prefix=("cls",), samples=(10, 11), seed=0
) -> xr.Dataset:
    """An ``attention`` Dataset shaped like the extractor's output (random probabilities)."""
    rng = np.random.default_rng(seed)
    gh, gw = grid
    n = len(prefix) + gh * gw
    att = softmax(rng.normal(size=(len(samples), len(layers), heads, n, n))).astype(np.float32)
    ds = xr.Dataset(
        {"attention": (("sample", "layer", "head", "query", "key"), att)},
        coords={
            "sample": list(samples), "layer": list(layers), "head": np.arange(heads), **query_key_coords(prefix, grid)
        },
    )
    cls = att[:, :, :, 0, len(prefix):].reshape(len(samples), len(layers), heads, gh, gw)
    ds["cls_attention"] = (("sample", "layer", "head", "y", "x"), cls)
    return ds.assign_coords(y=np.arange(gh), x=np.arange(gw)).assign_attrs(analysis="attention", config="{}")


def colorbars(fig) -> list:
    return [a for a in fig.axes if a.get_label() == "<colorbar>"]


def titles(fig) -> list[str]:
    return [a.get_title() for a in fig.axes]


@pytest.fixture(autouse=True)
def _close_figures():
    set_theme()
    yield
    plt.close("all")


def test_attention_grid_matrices():
    ds = synthetic_attention(prefix=("cls", "dist"))
    fig = plot_attention_grid(ds, sample=11)
    assert isinstance(fig, matplotlib.figure.Figure)
    assert "sample 11" in fig.get_suptitle()
    (cbar,) = colorbars(fig)
    assert cbar.get_ylabel() == "attention probability\n(square-root colour scale)"  # the default scale, named
    assert "layer 2 · head 1" in titles(fig)
    panels = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    assert len(panels) == 2 * 3
    assert any(a.get_xlabel() == "key token" for a in panels) and any(a.get_ylabel() == "query token" for a in panels)
    assert "cls+dist" in [t.get_text() for t in panels[0].get_xticklabels()]


def test_attention_grid_query_map_and_selection():
    ds = synthetic_attention()
    fig = plot_attention_grid(ds, query=1 + 5 + 2, layers=[2], heads=[0, 2], scale="linear")
    assert "query token 8 (patch, y=1, x=2)" in fig.get_suptitle()
    assert titles(fig)[:2] == ["layer 2 · head 0", "layer 2 · head 2"]
    img = fig.axes[0].get_images()[0].get_array()
    assert img.shape == (4, 5)  # keys laid out on the patch grid
    np.testing.assert_allclose(img, ds.attention.sel(sample=10, layer=2, head=0, query=8).values[1:].reshape(4, 5))
    with pytest.raises(ValueError, match="layers"):
        plot_attention_grid(ds, layers=[5])
    with pytest.raises(ValueError, match="sample"):
        plot_attention_grid(ds, sample=3)


def test_cls_maps_over_images():
    ds = synthetic_attention()
    rgb = np.random.default_rng(1).uniform(size=(32, 40, 3))
    for image in (rgb, rgb[..., 0], xr.DataArray(rgb, dims=("h", "w", "c")), np.moveaxis(rgb, -1, 0), None):
        fig = plot_cls_maps(ds, image, sample=10, heads=[0, 1])
        (cbar,) = colorbars(fig)
        assert "probability" in cbar.get_ylabel() and "uniform" in cbar.get_ylabel()
        assert fig.get_suptitle().startswith("CLS-to-patch attention")
        assert titles(fig)[:3] == ["layer 0 · head 0", "layer 0 · head 1", "layer 2 · head 0"]
        if image is not None:  # the map is stretched over the image: one extent for both
            first = fig.axes[0]
            assert first.get_images()[1].get_extent() == [-0.5, 39.5, 31.5, -0.5]
            assert first.get_xlabel() == "" and fig.axes[2].get_xlabel() == "x (pixel)"
        plt.close(fig)
    with pytest.raises(ValueError, match="image"):
        plot_cls_maps(ds, np.zeros((4, 4, 4, 4)))
    with pytest.raises(ValueError, match="cls_attention"):
        plot_cls_maps(ds.drop_vars("cls_attention"))


def test_model_dim_rows():
    models = xr.Variable("model", ["teacher", "far"])
    both = xr.concat([synthetic_attention(seed=0), synthetic_attention(seed=1)], dim=models, join="outer",
                     coords="different", compat="no_conflicts")
    fig = plot_cls_maps(both, layers=[2])
    labels = [a.get_ylabel() for a in fig.axes]
    assert "model: teacher\ny (patch)" in labels and "model: far\ny (patch)" in labels
    fig = plot_attention_grid(both, model="far")
    assert len([a for a in fig.axes if a.get_label() != "<colorbar>"]) == 2 * 3
    with pytest.raises(ValueError, match="model"):
        plot_cls_maps(synthetic_attention(), model="far")


def test_single_axes_and_missing_heads():
    ds = synthetic_attention()
    ds["attention"][:, 1, 2] = np.nan  # layer 2 has only two heads (NaN padding)
    ds["cls_attention"][:, 1, 2] = np.nan
    fig, (a1, a2) = plt.subplots(1, 2)
    assert plot_cls_maps(ds, np.zeros((8, 10)), layers=[2], heads=[1], ax=a1) is fig
    assert plot_attention_grid(ds, layers=[0], ax=a2) is fig
    assert "layer 2 · head 1" in a1.get_title() and len(colorbars(fig)) == 2
    fig = plot_cls_maps(ds)
    texts = [t.get_text() for a in fig.axes for t in a.texts]
    assert "not in this layer" in texts


def test_window_attention_dataset():
    rng = np.random.default_rng(0)
    att = softmax(rng.normal(size=(1, 2, 4, 2, 9, 9))).astype(np.float32)  # (sample, layer, window, head, q, k)
    wc = window_coords((3, 3), "query")
    ds = xr.Dataset(
        {"attention": (("sample", "layer", "window", "head", "query", "key"), att)},
        coords={
            "sample": [0], "layer": [0, 1], "window": np.arange(4), "head": [0, 1],
            "query": np.arange(9), "key": np.arange(9),
            "query_wy": (("layer", "query"), np.stack([wc["query_wy"]] * 2)),
            "query_wx": (("layer", "query"), np.stack([wc["query_wx"]] * 2)),
            "key_wy": (("layer", "key"), np.stack([wc["query_wy"]] * 2)),
            "key_wx": (("layer", "key"), np.stack([wc["query_wx"]] * 2)),
        },
    )
    fig = plot_attention_grid(ds, window=3)
    assert "window 3" in fig.get_suptitle() and colorbars(fig)
    fig = plot_attention_grid(ds, window=1, query=4)
    assert fig.axes[0].get_images()[0].get_array().shape == (3, 3)
    assert fig.axes[0].get_xlabel() == "key x (window)"


def test_plots_do_not_import_torch():
    code = (
        "import workbench.plots, workbench.plots.attention, workbench.plots.theme, sys; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
