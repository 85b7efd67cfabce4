"""Dataset-scale views: per-class mean CLS attention maps, and per-layer attention entropy distributions.

Both read the ``scale.maps`` figure data (:mod:`workbench.figures.scale`), a Dataset with

- ``cls_map(model, label, y, x)``: the CLS-to-patch attention of a model's last block, averaged over its heads
  (and branches) and over every held-out image of a class (probability);
- ``entropy(model, sample, layer)``: per image and block, the entropy (nats) of the CLS attention row over all
  keys, averaged over heads; NaN for blocks a model does not have;
- coords ``model`` (labels, teacher first), ``label`` (class), ``last_layer(model)``, ``images(model)``;
- attr ``left_out`` (optional): the students left out (no class token), with the reason, written under the figure.
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from workbench.plots.theme import ATTENTION_CMAP, PANEL_INCHES

__all__ = ["plot_class_maps", "plot_entropy", "plot_dataset_scale"]


def plot_class_maps(ds: xr.Dataset, *, axes: np.ndarray | None = None) -> Figure:
    """Models (rows) x classes (columns) of mean CLS maps on one shared colour scale with one colour bar."""
    maps = ds["cls_map"]
    models, labels = [str(m) for m in ds["model"].values], list(ds["label"].values)
    if axes is None:
        fig, axes = plt.subplots(len(models), len(labels), squeeze=False,
                                 figsize=(0.9 * PANEL_INCHES * len(labels), 0.95 * PANEL_INCHES * len(models) + 0.6),
                                 layout="constrained")
    fig = axes.flat[0].figure
    vmin, vmax = float(np.nanmin(maps.values)), float(np.nanmax(maps.values))  # one scale: models comparable
    im = None
    for r, m in enumerate(models):
        for c, lab in enumerate(labels):
            ax = axes[r, c]
            im = ax.imshow(maps.sel(model=m, label=lab).values, cmap=ATTENTION_CMAP, vmin=vmin, vmax=vmax,
                           interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"class {lab}")
            if c == 0:
                last = ds["last_layer"]  # one value for all models where they agree (xarray keeps it scalar)
                layer = int(last.sel(model=m) if "model" in last.dims else last)
                ax.set_ylabel(f"{m}\nblock {layer}", fontsize="small")
    cb = fig.colorbar(im, ax=axes, shrink=0.8, pad=0.01)
    cb.set_label("mean CLS→patch attention (probability)")
    return fig


def plot_entropy(ds: xr.Dataset, ax: Axes | None = None) -> Figure:
    """Per block, the distribution over images of the CLS row's attention entropy (nats), one box per model."""
    if ax is None:
        _, ax = plt.subplots(figsize=(2.2 * PANEL_INCHES + 0.4 * ds.sizes["layer"] * ds.sizes["model"], 2.2 * PANEL_INCHES),
                             layout="constrained")
    models = [str(m) for m in ds["model"].values]
    layers = list(ds["layer"].values)
    width = 0.8 / len(models)
    from workbench.plots.compare import STUDENT_COLORS

    colors = ["0.3", *STUDENT_COLORS]  # the teacher grey, students in compare's distinct colours (no two oranges)
    for i, m in enumerate(models):
        data, pos = [], []
        for j, layer in enumerate(layers):
            v = ds["entropy"].sel(model=m, layer=layer).values
            v = v[np.isfinite(v)]
            if v.size:
                data.append(v)
                pos.append(j - 0.4 + width * (i + 0.5))
        if not data:
            continue
        parts = ax.violinplot(data, positions=pos, widths=width * 0.95, showmedians=True, showextrema=False)
        for body in parts["bodies"]:
            body.set_facecolor(colors[i % len(colors)])
            body.set_alpha(0.6)
        parts["cmedians"].set_color(colors[i % len(colors)])
        ax.plot([], [], color=colors[i % len(colors)], lw=6, alpha=0.6, label=m)
    n_keys = ds.attrs.get("keys")
    if n_keys:
        ax.axhline(np.log(float(n_keys)), color="0.5", ls="--", lw=0.8)
        ax.text(len(layers) - 0.5, np.log(float(n_keys)), f" uniform over {n_keys} tokens", va="bottom", ha="right",
                fontsize="small", color="0.4")
    ax.set_xticks(range(len(layers)), [str(int(x)) for x in layers])
    ax.set_xlabel(ds["layer"].attrs.get("long_name", "block"))
    ax.set_ylabel("entropy of the CLS attention row (nats)")
    ax.set_title("CLS attention entropy over the held-out images, per block (head mean)")
    ax.legend(fontsize="small", loc="lower left")
    return ax.figure


def plot_dataset_scale(ds: xr.Dataset) -> Figure:
    """The two views in one figure: class-mean CLS maps on top, entropy distributions below."""
    n_models, n_labels = ds.sizes["model"], ds.sizes["label"]
    fig = plt.figure(figsize=(max(0.9 * PANEL_INCHES * n_labels, 8), 0.95 * PANEL_INCHES * n_models + 3.2 * PANEL_INCHES),
                     layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[0.95 * n_models, 2.6])
    axes = top.subplots(n_models, n_labels, squeeze=False)
    plot_class_maps(ds, axes=axes)
    top.suptitle(f"Per-class mean CLS attention of the last block over {int(ds['images'].max())} held-out images")
    plot_entropy(ds, ax=bottom.subplots())
    if ds.attrs.get("left_out"):
        bottom.supxlabel(textwrap.fill(f"Not shown (no CLS attention row): {ds.attrs['left_out']}", 150),
                         fontsize="small", color="0.3")
    return fig
