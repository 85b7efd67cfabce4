"""Non-deep ViT figures (papers/002) from Datasets: λ schedules, branch similarity, attention beside the teacher.

- :func:`plot_lambda_schedules` — Fig. 3: λ(t) of the joining schedules over the Lambda Warmup Period and
  the Post-Joining Adjustment Phase (``lam(schedule, t)``).
- :func:`plot_similarity` — Figs. 4–6: one n × n branch-similarity matrix per (model, block, module)
  (``(model, layer, module, branch_i, branch_j)``, NaN-padded where models have fewer blocks or branches),
  values printed in the cells, one signed colour scale [−1, 1].
- :func:`plot_similarity_summary` — the same, compact: per model one (block × module) heatmap of the mean
  similarity over branch pairs i < j (min–max over pairs printed for n > 2); several variables as rows.
- :func:`plot_cls_beside` — the CLS-to-patch attention of the teacher's blocks beside the collapsed students'
  blocks that replace them (``cls(model, layer, y, x)``), over the input digit.

No torch here: everything is drawn from xarray.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from workbench.plots.theme import ATTENTION_CMAP, DIVERGING_CMAP, MISSING_COLOR, PANEL_INCHES

__all__ = ["plot_lambda_schedules", "plot_similarity", "plot_similarity_summary", "pair_mean", "plot_cls_beside",
           "SCHEDULE_STYLE"]

#: Line style per schedule: the paper's four (App. B.2) solid, Table 5's two baselines thin and dashed.
SCHEDULE_STYLE = {
    "linear": dict(color="C0", lw=2.0), "cosine": dict(color="C1", lw=2.0), "exponential": dict(color="C2", lw=2.0),
    "sqrt": dict(color="C3", lw=2.0), "instant": dict(color="0.45", lw=1.0, ls="--"),
    "none": dict(color="0.45", lw=1.0, ls=":"),
}
EQUATIONS = {"linear": "Eq. 10: $t$", "cosine": r"Eq. 11: $\frac{1}{2}(1 - \cos \pi t)$",
             "exponential": "Eq. 12: $1 - e^{-5t}$", "sqrt": r"Eq. 13: $\sqrt{t}$", "instant": "instant: 1",
             "none": "no joining: 0"}


def plot_lambda_schedules(ds: xr.Dataset, ax: Axes | None = None) -> Figure:
    """λ against the warm-up progress t = step / warm-up steps, the adjustment phase (t > 1, λ = 1) shaded.

    Args:
        ds: ``lam(schedule, t)``; attrs ``warmup_steps`` / ``adjust_steps`` (the demo budget's) and
            ``paper_warmup_steps`` / ``paper_adjust_steps`` (App. B.1), shown in the axis label.
        ax: draw into this Axes.
    """
    fig, a = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(5.6, 3.4), layout="constrained")
    t = ds["t"].values
    a.axvspan(1.0, float(t.max()), color="0.93", zorder=0)
    a.text(1.0 + 0.5 * (float(t.max()) - 1.0), 0.5, "Post-Joining\nAdjustment Phase\n(λ = 1)", ha="center",
           va="center", fontsize="small", color="0.35")
    for s in [str(v) for v in ds["schedule"].values]:
        lam = ds["lam"].sel(schedule=s).values
        a.plot(t, lam, label=EQUATIONS.get(s, s), drawstyle="steps-post" if s in ("instant", "none") else "default",
               **SCHEDULE_STYLE.get(s, {}))
    if "exponential" in ds["schedule"].values and (t < 1).any():
        below = float(ds["lam"].sel(schedule="exponential").where(ds["t"] < 1, drop=True).values[-1])
        a.annotate(f"Eq. 12 ends at 1 − e⁻⁵ = {1 - np.exp(-5):.4f},\nthen jumps to 1", xy=(1.0, below),
                   xytext=(0.42, 0.22), fontsize="x-small", arrowprops=dict(arrowstyle="->", color="C2", lw=0.8),
                   color="C2")
    w, adj = ds.attrs.get("warmup_steps"), ds.attrs.get("adjust_steps")
    pw, padj = ds.attrs.get("paper_warmup_steps"), ds.attrs.get("paper_adjust_steps")
    label = "t = step / Lambda Warmup Period"
    if w:
        label += f"\n(demo: {w} + {adj} steps; paper: {pw // 1000}k + {padj // 1000}k)" if pw else f" ({w} steps)"
    a.set(xlabel=label, ylabel="λ(t)", xlim=(0, float(t.max())), ylim=(-0.03, 1.05),
          title="Joining schedules λ(t) (App. B.2)")
    a.legend(fontsize="x-small", loc="lower right", frameon=True)
    return fig


def _present(da: xr.DataArray) -> xr.DataArray:
    """Drop the NaN padding of one model's similarity array (blocks, branches it does not have)."""
    da = da.dropna("layer", how="all")
    return da.dropna("branch_i", how="all").dropna("branch_j", how="all")


def plot_similarity(ds: xr.Dataset, var: str = "cosine", *, title: str | None = None,
                    units: str = "cosine similarity", annotate: bool = True) -> Figure:
    """One n × n heatmap per (model row, block × module column), signed colour scale [−1, 1], values printed.

    Args:
        ds: ``var(model, layer, module, branch_i, branch_j)`` (NaN-padded); optional coord ``note(model)``
            printed under the row label.
        var: the variable to draw.
        title: figure title.
        units: colour-bar label.
        annotate: print every value in its cell.
    """
    da = ds[var]
    models = [str(m) for m in da["model"].values]
    modules = [str(m) for m in da["module"].values]
    per_model = {m: _present(da.sel(model=m)) for m in models}
    n_cols = max(p.sizes["layer"] for p in per_model.values()) * len(modules)
    side = 0.78 * PANEL_INCHES
    fig, axes = plt.subplots(len(models), n_cols, figsize=(side * n_cols + 2.4, side * len(models) + 1.0),
                             squeeze=False, layout="constrained")
    cmap = plt.get_cmap(DIVERGING_CMAP).with_extremes(bad=MISSING_COLOR)
    im = None
    for r, m in enumerate(models):
        sub = per_model[m]
        layers = [int(v) for v in sub["layer"].values]
        for c in range(n_cols):
            a = axes[r, c]
            li, mi = divmod(c, len(modules))
            if li >= len(layers):
                a.axis("off")
                continue
            mat = sub.sel(layer=layers[li], module=modules[mi]).values
            n = mat.shape[0]
            im = a.imshow(mat, cmap=cmap, vmin=-1, vmax=1)
            if annotate:
                for i in range(n):
                    for j in range(n):
                        v = mat[i, j]
                        if np.isfinite(v):
                            a.text(j, i, f"{v:.2f}".replace("-0.00", "0.00"), ha="center", va="center",
                                   fontsize=6.5 if n <= 3 else 5, color="white" if abs(v) > 0.6 else "black")
            a.set_xticks(range(n), [str(k) for k in range(n)], fontsize="x-small")
            a.set_yticks(range(n), [str(k) for k in range(n)], fontsize="x-small")
            a.tick_params(length=0, pad=1)
            a.set_title(f"block {layers[li]} · {modules[mi]}", fontsize="x-small")
            if c == 0:
                note = str(sub["note"].values) if "note" in sub.coords else ""
                a.set_ylabel(m + (f"\n{note}" if note else "") + "\nbranch", fontsize="x-small")
            if r == len(models) - 1 or li == len(layers) - 1:
                a.set_xlabel("branch", fontsize="x-small")
    if im is not None:
        fig.colorbar(im, ax=axes, shrink=0.8, label=units, fraction=0.02)
    if title:
        fig.suptitle(title)
    return fig


def pair_mean(da: xr.DataArray) -> tuple[xr.DataArray, xr.DataArray, xr.DataArray]:
    """Mean, min and max over the branch pairs i < j of ``da(..., branch_i, branch_j)`` (NaN pairs ignored)."""
    n = da.sizes["branch_i"]
    upper = xr.DataArray(np.triu(np.ones((n, n), bool), 1), dims=("branch_i", "branch_j"),
                         coords={"branch_i": da["branch_i"], "branch_j": da["branch_j"]})
    pairs = da.where(upper)
    dims = ("branch_i", "branch_j")
    return pairs.mean(dims), pairs.min(dims), pairs.max(dims)


def plot_similarity_summary(ds: xr.Dataset, variables: dict[str, str], *, title: str | None = None,
                            units: str = "cosine similarity\n(mean over branch pairs)", limit: float | None = 1.0
                            ) -> Figure:
    """Per model (columns) and variable (rows) one heatmap of blocks × modules: the mean similarity over branch pairs.

    Args:
        ds: ``var(model, layer, module, branch_i, branch_j)`` for every var of ``variables`` (NaN-padded); optional
            coord ``note(model)`` printed under the panel title.
        variables: variable -> row label (e.g. ``{"cosine": "weights", "update": "updates at λ = 1"}``).
        title: figure title.
        units: colour-bar label.
        limit: the colour scale spans ±limit; None: ±the largest |value| shown (at least 0.01), for similarities
            that are all near 0 (on ±1 every cell would look blank) — the bar's label says so.
    """
    models = [str(m) for m in ds["model"].values]
    modules = [str(m) for m in ds["module"].values]
    rows = list(variables)
    blocks = {m: _present(ds[rows[0]].sel(model=m)).sizes["layer"] for m in models}
    if limit is None:
        means = [pair_mean(_present(ds[v].sel(model=m)))[0].values for v in rows for m in models
                 if _present(ds[v].sel(model=m)).sizes["layer"]]
        top = max([float(np.nanmax(np.abs(x))) for x in means if np.isfinite(x).any()] or [1.0])
        limit = float(f"{max(top, 0.01):.1g}") if float(f"{max(top, 0.01):.1g}") >= top else float(f"{top:.2g}")
        units = f"{units}\n(scale ±{limit:g}, not ±1)"
    cell = 0.42 if limit >= 0.1 else 0.62  # three-digit labels need wider cells
    width = sum(cell * len(modules) + 0.9 for _ in models) + 1.4
    height = sum(0.36 * max(blocks.values()) + 1.0 for _ in rows) + 0.5
    fig, axes = plt.subplots(len(rows), len(models), figsize=(width, height), squeeze=False, layout="constrained")
    cmap = plt.get_cmap(DIVERGING_CMAP).with_extremes(bad=MISSING_COLOR)
    im = None
    for r, var in enumerate(rows):
        for c, m in enumerate(models):
            a = axes[r, c]
            if c == 0:
                a.set_ylabel(variables[var], fontsize="small")
            if r == 0:
                note = str(ds["note"].sel(model=m).values) if "note" in ds.coords else ""
                a.set_title(f"{m}\n{note}" if note else m, fontsize="x-small")
            sub = _present(ds[var].sel(model=m))
            if sub.sizes["layer"] == 0:  # nothing measured for this model (e.g. updates before any training)
                a.text(0.5, 0.5, f"no {variables[var]}\nfor this model", ha="center", va="center",
                       fontsize="small", color="0.4", transform=a.transAxes)
                a.set_xticks([])
                a.set_yticks([])
                continue
            mean, lo, hi = pair_mean(sub)
            vals = mean.transpose("layer", "module").values
            n = int(np.isfinite(sub.isel(layer=0, module=0).values).any(axis=1).sum())
            im = a.imshow(vals, cmap=cmap, vmin=-limit, vmax=limit, aspect="auto")
            for i in range(vals.shape[0]):
                for j in range(vals.shape[1]):
                    v = vals[i, j]
                    if not np.isfinite(v):
                        continue
                    digits = 3 if limit < 0.1 else 2  # near-0 similarities: a third digit tells the cells apart
                    text = f"{v:.{digits}f}".replace("-0.000", "0.000").replace("-0.00", "0.00")
                    if n > 2:
                        lo_v, hi_v = float(lo.transpose("layer", "module").values[i, j]), float(
                            hi.transpose("layer", "module").values[i, j])
                        text += f"\n{lo_v:.{digits}f}…{hi_v:.{digits}f}"
                    a.text(j, i, text, ha="center", va="center", fontsize=6.5 if n <= 2 else 5.5,
                           color="white" if abs(v) > 0.6 * limit else "black")
            a.set_xticks(range(len(modules)), modules, fontsize="x-small")
            a.set_yticks(range(vals.shape[0]), [f"block {int(k)}" for k in sub["layer"].values], fontsize="x-small")
            a.tick_params(length=0, pad=1)
    if im is not None:
        fig.colorbar(im, ax=axes, shrink=0.85, label=units, fraction=0.03)
    if title:
        fig.suptitle(title, fontsize="medium")
    return fig


def plot_cls_beside(ds: xr.Dataset, *, sample: int | None = None, title: str | None = None) -> Figure:
    """The CLS-to-patch attention (mean over heads) of every block, one row per model, over the input digit.

    Columns are the teacher's blocks; a student block is drawn in the column of the last teacher block it
    stands for (block i of an L/n-block student replaces teacher blocks n·i … n·i + n − 1).

    Args:
        ds: ``cls(model, sample, layer, y, x)`` with ``layer`` = teacher block positions (NaN where a model has no
            block), ``image(sample, img_y, img_x)``; coords ``block(model, layer)`` (the model's own block index,
            -1 where none) and ``group_start(model, layer)`` (first teacher block it stands for); optional
            ``pearson(model, sample, layer)`` (correlation with the teacher's map in that column), printed for the
            sample and as r̄, its mean over every sample of ``ds``.
        sample: which image (default the first).
        title: figure title.
    """
    s = int(ds["sample"].values[0]) if sample is None else sample
    da = ds["cls"].sel(sample=s)
    models = [str(m) for m in da["model"].values]
    layers = [int(v) for v in da["layer"].values]
    size = (PANEL_INCHES * 0.95 * (len(layers) + 1) + 1.0, PANEL_INCHES * 1.05 * len(models) + 0.6)
    fig, axes = plt.subplots(len(models), len(layers) + 1, figsize=size, squeeze=False, layout="constrained")
    image = ds["image"].sel(sample=s).values if "image" in ds else None
    cmap = plt.get_cmap(ATTENTION_CMAP)
    vmax = float(np.nanmax(da.values))
    im = None
    for r, m in enumerate(models):
        a0 = axes[r, 0]
        if image is not None:
            a0.imshow(image, cmap="gray")
        a0.set_xticks([])
        a0.set_yticks([])
        a0.set_ylabel(m, fontsize="small")
        if r == 0:
            a0.set_title("input", fontsize="small")
        for c, lay in enumerate(layers):
            a = axes[r, c + 1]
            grid = da.sel(model=m, layer=lay).values
            if not np.isfinite(grid).any():
                a.axis("off")
                continue
            a.set_xticks([])
            a.set_yticks([])
            h, w = image.shape[:2] if image is not None else grid.shape
            if image is not None:
                a.imshow(image, cmap="gray", extent=(0, w, h, 0))
            im = a.imshow(grid, cmap=cmap, vmin=0, vmax=vmax, alpha=0.8 if image is not None else 1.0,
                          extent=(0, w, h, 0))
            block = int(ds["block"].sel(model=m, layer=lay)) if "block" in ds.coords else lay
            start = int(ds["group_start"].sel(model=m, layer=lay)) if "group_start" in ds.coords else lay
            label = f"block {block}" + (f" ← teacher {start}–{lay}" if start < lay else "")
            if "pearson" in ds:
                rho = float(ds["pearson"].sel(model=m, sample=s, layer=lay))
                avg = float(ds["pearson"].sel(model=m, layer=lay).mean())
                if np.isfinite(rho):
                    label += f"\nr = {rho:.2f} vs teacher {lay} (r̄ = {avg:.2f})"
            a.set_title(label, fontsize="x-small")
    if im is not None:
        fig.colorbar(im, ax=axes[:, 1:], shrink=0.8, label="attention probability\n(CLS → patch, mean over heads)")
    if title:
        fig.suptitle(title)
    return fig
