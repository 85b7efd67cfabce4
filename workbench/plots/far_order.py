"""FAR's order bias (``far.order_bias``) from a Dataset of per-image measures (no torch): how much of FAR's CLS map
follows the distance along the token sequence, block by block, against the teacher's maps.

:func:`plot_order_bias` draws three panels: the Pearson r of each model's CLS map with 1 / sequence distance per
block, the share of the CLS map on the first patch row per block (both mean and 95 % Student t interval over the
images), and the CLS map's share per sequence position in one block (mean over heads and images).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import seaborn as sns
import xarray as xr
from matplotlib.figure import Figure

from workbench.plots.far import mean_and_interval


def plot_order_bias(ds: xr.Dataset, *, title: str | None = None) -> Figure:
    """Order bias of FAR's CLS map against the teacher's, per block.

    Args:
        ds: ``order_r(model, layer, sample)`` (Pearson r of the head-averaged CLS map with 1 / sequence distance),
            ``top_row(model, layer, sample)`` (share on the first patch row), ``position_share(model, position)``
            (share per sequence position in block ``attrs["profile_block"]``, mean over heads and images); attrs
            ``grid_x`` (patches per row), ``first_block`` (the first block the verdict reads).
        title: figure title.

    Returns:
        The Figure.
    """
    models = [str(m) for m in ds["model"].values]
    colors = dict(zip(models, sns.color_palette("colorblind", len(models))))
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.6), layout="constrained")
    layers = ds["layer"].values
    first = int(ds.attrs.get("first_block", layers[0]))
    for a, var, label in ((axes[0], "order_r", "Pearson r with 1 / sequence distance"),
                          (axes[1], "top_row", "share of CLS map on the first patch row")):
        for i, m in enumerate(models):
            mean, half = mean_and_interval(ds[var].sel(model=m))
            a.errorbar(layers + (i - 1) * 0.06, mean, yerr=half, marker="o", ms=4, capsize=2, lw=1.3, color=colors[m],
                       label=m, ls=":" if "attention" in m else "-")
        a.axvspan(first - 0.5, layers[-1] + 0.5, color="0.92", zorder=0, label="blocks the verdict reads")
        a.set_xticks(layers)
        a.set_xlabel("block")
        a.set_ylabel(label)
        a.grid(alpha=0.3)
    axes[0].axhline(0, color="0.5", lw=0.8)
    axes[0].set_title("CLS map vs distance from CLS", fontsize="small")
    gx = int(ds.attrs["grid_x"])
    rows = ds.sizes["position"] // gx
    axes[1].axhline(1 / rows, color="0.3", lw=1, ls="--", label=f"uniform (1/{rows})")
    axes[1].set_ylim(0, 1)
    axes[1].set_title("mass on the tokens right after CLS", fontsize="small")
    pos = ds["position"].values
    for m in models:
        axes[2].plot(pos, ds["position_share"].sel(model=m).values, color=colors[m], lw=1.3, label=m,
                     ls=":" if "attention" in m else "-")
    for b in range(gx, ds.sizes["position"], gx):
        axes[2].axvline(b + 0.5, color="0.8", lw=0.6)
    axes[2].axhline(1 / ds.sizes["position"], color="0.3", lw=1, ls="--")
    axes[2].set_xlabel(f"patch position after CLS (grey lines: rows of {gx})")
    axes[2].set_ylabel("share of the CLS map")
    axes[2].set_title(f"block {int(ds.attrs['profile_block'])}, mean over heads and images", fontsize="small")
    axes[2].grid(alpha=0.3)
    handles, names = axes[1].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=len(names), fontsize="small", frameon=False)
    fig.suptitle(title or "FAR's CLS map against the token order, per block", fontsize="medium")
    return fig
