"""Explanation maps of teachers and students side by side: images × methods × models, one colour scale per method.

Reads the ``compare.explain_<arch>`` Datasets (``map(model, explainer, shown, img_y, img_x)``, ``image``, ``reason``).
Each method's maps share one colour scale over every model and image of the figure (its 99th percentile of |value|:
a few extreme pixels do not wash out the rest), so a student's map is read against its teacher's on the same scale;
units differ between methods (each colour bar names its own).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, MaxNLocator

from workbench.plots.theme import ATTENTION_CMAP, DIVERGING_CMAP, MISSING_COLOR

__all__ = ["UNITS", "SIGNED", "plot_explanations", "method_scales"]

#: what each method's values measure (the colour bar's label)
UNITS = {
    "generic_attention": "relevance (a.u., ≥ 0)",
    "chefer_lrp": "LRP relevance (logit share)",
    "attnlrp": "AttnLRP relevance (logit share)",
    "rollout": "attention flow (share of the class token)",
    "raw_attention": "attention probability",
    "gradcam": "Grad-CAM (min–max scaled)",
    "legrad": "LeGrad relevance (a.u., ≥ 0)",
    "saliency": "|∂ logit / ∂ pixel|",
    "ig": "IG attribution (logit share)",
}
SIGNED = ("chefer_lrp", "attnlrp", "ig")  # methods whose maps have a sign (diverging colour map)
PERCENTILE = 99.0


def method_scales(datasets: list[xr.Dataset], methods: list[str]) -> dict[str, float]:
    """One colour-scale top per method over every model and image: the 99th percentile of |map|."""
    out = {}
    for m in methods:
        vals = np.concatenate([np.abs(ds["map"].sel(explainer=m).values).ravel() for ds in datasets
                               if m in set(ds["explainer"].values)])
        vals = vals[np.isfinite(vals)]
        out[m] = float(np.percentile(vals, PERCENTILE)) if vals.size and np.percentile(vals, PERCENTILE) > 0 else (
            float(vals.max()) if vals.size and vals.max() > 0 else 1.0)
    return out


def _cell(ax, ds: xr.Dataset, model: str, method: str, s: int, top: float):
    """One map over its digit (contour), or the reason it does not apply; returns the image artist or None."""
    ax.set_xticks([])
    ax.set_yticks([])
    v = ds["map"].sel(model=model, explainer=method).isel(shown=s).values
    if not np.isfinite(v).any():
        ax.set_facecolor(MISSING_COLOR)
        ax.text(0.5, 0.5, "n/a", ha="center", va="center", fontsize=7, transform=ax.transAxes)
        return None
    signed = method in SIGNED
    im = ax.imshow(np.clip(v, -top, top), cmap=DIVERGING_CMAP if signed else ATTENTION_CMAP,
                   vmin=-top if signed else 0, vmax=top)
    img = ds["image"].isel(shown=s).values
    if img.ndim == 2:
        ax.contour(img, levels=[0.5], colors="white", linewidths=0.5, alpha=0.8)
    return im


def plot_explanations(*datasets: xr.Dataset, n_images: int = 2, title: str | None = None) -> Figure:
    """Rows: every model (grouped by teacher); columns: each method's maps of ``n_images`` digits; a colour bar per
    method under its columns (module docstring)."""
    groups = [ds for ds in datasets if "map" in ds]
    if not groups:
        fig, ax = plt.subplots(figsize=(5, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, "no teacher with students: nothing to explain", ha="center", va="center")
        return fig
    methods = list(dict.fromkeys(str(m) for ds in groups for m in ds["explainer"].values
                                 if np.isfinite(ds["map"].sel(explainer=m).values).any()))
    n_img = min(n_images, min(ds.sizes["shown"] for ds in groups))
    rows = [(ds, str(m)) for ds in groups for m in ds["model"].values]
    scales = method_scales(groups, methods)
    ncol = len(methods) * n_img
    fig = plt.figure(figsize=(1.0 * ncol + 1.6, 1.0 * len(rows) + 1.6))
    grid = fig.add_gridspec(len(rows) + 1, ncol, height_ratios=[1.0] * len(rows) + [0.12], hspace=0.12, wspace=0.06,
                            left=0.13, right=0.99, top=1 - 0.75 / fig.get_figheight(), bottom=0.9 / fig.get_figheight())
    for j, m in enumerate(methods):
        im = None
        for r, (ds, model) in enumerate(rows):
            for s in range(n_img):
                ax = fig.add_subplot(grid[r, j * n_img + s])
                im = _cell(ax, ds, model, m, s, scales[m]) or im
                if r == 0:
                    lab = int(ds["label"].values[int(ds["shown"].values[s])])
                    ax.set_title((f"{m}\n" if s == 0 else "\n") + f"digit {lab}", fontsize=7, loc="left" if s == 0 else "center")
                if j == 0 and s == 0:
                    group = ds.attrs.get("arch", "")
                    ax.set_ylabel(f"{model}\n({group})" if model == "teacher" else model, fontsize=7, rotation=0,
                                  ha="right", va="center")
        if im is not None:
            cax = fig.add_subplot(grid[len(rows), j * n_img:(j + 1) * n_img])
            cb = fig.colorbar(im, cax=cax, orientation="horizontal")
            cb.set_label(UNITS.get(m, "relevance (a.u.)"), fontsize=6)
            cb.ax.tick_params(labelsize=6)
            cb.ax.xaxis.set_major_locator(MaxNLocator(3))
            cb.ax.xaxis.set_major_formatter(FormatStrFormatter("%.2g"))
    fig.suptitle(title or "Explanations of the label class, every model × method (one colour scale per method)",
                 fontsize=10)
    return fig
