"""FAR figures from Datasets (no torch): retention heatmaps, teacher-vs-FAR token maps, agreement.

- :func:`plot_retention` — Fig. 4/7/8: % of hidden units each (layer, head) LSTM keeps, forward
  and reverse side by side (``retention`` extractor).
- :func:`plot_cls_comparison` — Fig. 5, 9–11: the CLS row over the image, one row per (layer,
  model), heads as columns (``cls_map`` of :func:`workbench.analysis.token_maps.stack_maps`).
- :func:`plot_token_maps` — Fig. 6, 12–14: token-to-token maps averaged over heads and samples
  (App. C.2), one panel per model.
- :func:`plot_agreement` — per-layer agreement of FAR's maps with the teacher's.
- :func:`plot_order_bias` — ``far.order_bias``: how much of FAR's CLS map follows the distance along the token
  sequence, block by block, against the teacher's maps.

The map helpers take :func:`~workbench.analysis.token_maps.stack_maps` output in either form and draw
it as stored (``normalize="none"``, the default: probabilities and gradient norms, as the paper
shows them, so a query whose output depends strongly on its inputs is a bright row) or with every
query row normalised to sum to 1 before averaging (``normalize="row"``: "share of the row", one
unit for attention and saliency, per-query magnitude erased). Panels in the same unit share one
colour scale and one colour bar naming the unit (``shared_scale``).
"""

from __future__ import annotations

from typing import Literal, Mapping, Sequence

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.figure import Figure

from workbench.plots.theme import ATTENTION_CMAP, MISSING_COLOR, PANEL_INCHES

Normalize = Literal["none", "row"]


def _cmap() -> mcolors.Colormap:
    return plt.get_cmap(ATTENTION_CMAP).with_extremes(bad=MISSING_COLOR)


def _rows_normalised(da: xr.DataArray, dims: tuple[str, ...], normalize: Normalize) -> xr.DataArray:
    """Every row (sum over ``dims``) scaled to 1 for ``normalize="row"``; unchanged for ``"none"``."""
    if normalize == "none":
        return da
    if normalize != "row":
        raise ValueError(f"normalize must be 'none' or 'row', got {normalize!r}")
    total = da.sum(dims)
    return da / total.where(total > 0)


def _units(maps: xr.Dataset, normalize: Normalize) -> dict[str, str]:
    """model -> the unit its values are drawn in."""
    models = [str(m) for m in maps["model"].values]
    if normalize == "row" or maps.attrs.get("normalize") == "row":
        return dict.fromkeys(models, "share of the row")
    units = maps["units"].values if "units" in maps.coords else [""] * len(models)
    return {m: str(u) or "value" for m, u in zip(models, units)}


def _scale_groups(models: Sequence[str], units: Mapping[str, str], shared: bool) -> list[list[int]]:
    """Indices of ``models`` drawn on one colour scale: same unit together (``shared``), else one each."""
    if not shared:
        return [[i] for i in range(len(models))]
    groups: dict[str, list[int]] = {}
    for i, m in enumerate(models):
        groups.setdefault(units[m], []).append(i)
    return list(groups.values())


# ------------------------------------------------------------------------------------------ retention
def plot_retention(ds: xr.Dataset, *, title: str | None = None, ax: Axes | None = None) -> Figure:
    """Percentage of hidden units kept per (layer, head), forward and reverse LSTMs side by side.

    Args:
        ds: a ``retention`` Dataset (``retention(layer, head, direction)``).
        title: figure title; default names the kept share overall.
        ax: draw only the forward direction into this Axes.

    Returns:
        The Figure.
    """
    pct = 100 * ds["retention"].transpose("direction", "layer", "head")
    directions = list(pct["direction"].values)
    if ax is not None:
        fig, axes = ax.figure, [ax]
        directions = directions[:1]
    else:
        n_layers, n_heads = pct.sizes["layer"], pct.sizes["head"]
        width = max(2.2, 0.55 * n_heads + 0.9)
        fig, axes = plt.subplots(1, len(directions), figsize=(width * len(directions) + 1.0, 0.42 * n_layers + 1.3),
                                 layout="constrained", sharey=True)
    norm = mcolors.Normalize(0, 100)
    for a, d in zip(np.atleast_1d(axes), directions):
        grid = pct.sel(direction=d)
        sns.heatmap(grid.values, ax=a, cmap=_cmap(), norm=norm, annot=True, fmt=".0f", cbar=False,
                    annot_kws={"fontsize": "x-small"}, linewidths=0.5, linecolor="white", square=False,
                    xticklabels=[int(h) for h in grid["head"].values], yticklabels=[int(l) for l in grid["layer"].values])
        kept = float(grid.mean())
        a.set_title(f"{d} LSTMs · {kept:.0f}% kept")
        a.set_xlabel("head")
        a.set_ylabel("layer (block)" if a is np.atleast_1d(axes)[0] else "")
        a.tick_params(axis="y", rotation=0)
    cbar = fig.colorbar(ScalarMappable(norm=norm, cmap=_cmap()), ax=list(np.atleast_1d(axes)), shrink=0.9, aspect=25)
    cbar.set_label("hidden units kept (%)")
    if ax is None:
        total = float(100 * ds["retention"].mean())
        fig.suptitle(title or f"Hidden units kept after DeepHoyer pruning (numbers: %, overall {total:.0f}%)")
    return fig


# ------------------------------------------------------------------------------------------ CLS maps
def _as_grey(image) -> np.ndarray:
    img = np.asarray(getattr(image, "values", image), dtype=np.float32)
    if img.ndim == 3 and img.shape[-1] == 3:
        img = img @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    return np.clip(img, 0, 1)


OUTLINE_COLOR = "#ff2a2a"  # the digit's outline: red, a hue viridis lacks


def _outline(a: Axes, img: np.ndarray, level: float = 0.5) -> None:
    """The image's strokes as a contour at ``level`` of its grey value, over a map drawn opaque."""
    if float(img.max()) > level > float(img.min()):
        a.contour(img, levels=[level], colors=OUTLINE_COLOR, linewidths=1.0)


def plot_cls_comparison(
    maps: xr.Dataset,
    image=None,
    *,
    sample: int | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    models: Sequence[str] | None = None,
    normalize: Normalize = "none",
    shared_scale: bool = False,
    title: str | None = None,
) -> Figure:
    """CLS-to-patch maps with the image's outline: rows = (block, model), models one above the other, columns = heads.

    Args:
        maps: :func:`~workbench.analysis.token_maps.stack_maps` output with ``cls_map``.
        image: the sample's image ``(H, W)`` or ``(H, W, 3)`` in [0, 1], drawn as an outline over the opaque map (so
            every cell keeps its colour-bar colour); ``None`` shows the patch grid only.
        sample: sample label; ``None`` for the first.
        layers: layer labels (default all); heads: head labels (default all); models: model labels (default all).
        normalize: ``"none"`` (default) values as stored — each head's CLS row keeps its size, so a weak
            head looks weak; ``"row"`` each head's CLS row over the patches sums to 1.
        shared_scale: one colour scale for all rows in the same unit; default one per row, shared by its
            heads (attention and saliency concentrate very differently, so a shared scale hides the flatter one).
        title: figure title.

    Returns:
        The Figure; every colour bar names its unit (row-normalised: marking the uniform share 1 / patches).
    """
    da = _rows_normalised(maps["cls_map"], ("y", "x"), normalize)
    sample = da["sample"].values[0] if sample is None else sample
    da = da.sel(sample=sample)
    layers = list(da["layer"].values) if layers is None else list(layers)
    heads = list(da["head"].values) if heads is None else list(heads)
    models = list(da["model"].values) if models is None else list(models)
    units = _units(maps, normalize)
    rows = [(lay, m) for lay in layers for m in models]
    panels = [[da.sel(layer=lay, model=m, head=h).transpose("y", "x").values for h in heads] for lay, m in rows]
    tops = [float(np.nanmax([np.nanmax(p) for p in r])) for r in panels]
    groups = _scale_groups([m for _, m in rows], units, shared_scale)
    for g in groups:
        for r in g:
            tops[r] = max(tops[i] for i in g)
    last_of_group = {g[-1]: g for g in groups}
    gh, gw = da.sizes["y"], da.sizes["x"]
    uniform = 1.0 / (gh * gw) if units[models[0]] == "share of the row" else None
    img = None if image is None else _as_grey(image)
    extent = (-0.5, gw - 0.5, gh - 0.5, -0.5) if img is None else (-0.5, img.shape[1] - 0.5, img.shape[0] - 0.5, -0.5)
    fig, axes = plt.subplots(len(rows), len(heads), figsize=(PANEL_INCHES * len(heads) + 2.2, PANEL_INCHES * len(rows) + 0.6),
                             squeeze=False, layout="constrained")
    measure = dict(zip(maps["model"].values, maps["measure"].values)) if "measure" in maps.coords else {}
    for r, (lay, m) in enumerate(rows):
        norm = mcolors.Normalize(0, tops[r])
        for c, h in enumerate(heads):
            a = axes[r, c]
            a.imshow(panels[r][c], cmap=_cmap(), norm=norm, extent=extent, interpolation="nearest")
            if img is not None:
                _outline(a, img)
            a.set_xlim(extent[0], extent[1])
            a.set_ylim(extent[2], extent[3])
            a.set_xticks([])
            a.set_yticks([])
            a.set_title(f"block {int(lay)} · head {int(h)}", fontsize="small")
            if c == 0:
                a.set_ylabel(f"{m}", fontsize="small")
        if r not in last_of_group:
            continue
        cbar = fig.colorbar(ScalarMappable(norm=norm, cmap=_cmap()), ax=[axes[i, j] for i in last_of_group[r] for j in range(len(heads))],
                            shrink=0.9, aspect=12, pad=0.02)
        if uniform is not None and uniform <= tops[r]:
            cbar.ax.axhline(uniform, color="white", lw=1.5, ls=(0, (2, 1)))
        what = measure.get(m, "map")
        label = (f"share of CLS row\n({what}; - - uniform)" if uniform is not None
                 else f"CLS row, {what}\n({units[m]})")
        cbar.set_label(label, fontsize="x-small")
        cbar.ax.tick_params(labelsize="x-small")
    fig.suptitle(title or f"CLS → patch dependency, teacher vs FAR · sample {sample}")
    return fig


def plot_cls_heads(maps: xr.Dataset, *, layer: int, sample, models: Sequence[str], image=None,
                   title: str | None = None) -> Figure:
    """One block's CLS-to-patch maps, one row per model: every head of ``sample``, the head mean of that image, and
    the head mean over all of ``maps``' images (what a verdict over heads and images measures).

    Args:
        maps: :func:`~workbench.analysis.token_maps.stack_maps` output with ``cls_map`` (values as stored).
        layer: block label; sample: the image drawn per head; models: one row each, top to bottom.
        image: that sample's image in [0, 1], drawn as a red outline over the (opaque) maps of that image.
        title: figure title (the layout note is added below it).

    Returns:
        The Figure; each row has its own colour scale and colour bar naming its unit. Heads are titled per model
        ("<model> head n"): the models' heads do not correspond.
    """
    da = maps["cls_map"].sel(layer=layer)
    heads = [int(h) for h in da["head"].values]
    n = da.sizes["sample"]
    units = _units(maps, "none")
    measure = dict(zip(maps["model"].values, maps["measure"].values)) if "measure" in maps.coords else {}
    img = None if image is None else _as_grey(image)
    gh, gw = da.sizes["y"], da.sizes["x"]
    extent = (-0.5, gw - 0.5, gh - 0.5, -0.5) if img is None else (-0.5, img.shape[1] - 0.5, img.shape[0] - 0.5, -0.5)
    cols = len(heads) + 2
    fig, axes = plt.subplots(len(models), cols, figsize=(PANEL_INCHES * cols + 2.0, PANEL_INCHES * len(models) + 1.0),
                             squeeze=False, layout="constrained")
    for r, m in enumerate(models):
        one = da.sel(model=m)
        panels = [one.sel(sample=sample, head=h).transpose("y", "x").values for h in heads]
        panels += [one.sel(sample=sample).mean("head").transpose("y", "x").values,
                   one.mean(("head", "sample")).transpose("y", "x").values]
        short = str(m).split()[0]
        names = [f"{short} head {h}" for h in heads] + [f"{short}: mean of heads", f"{short}: mean of heads\n& {n} images"]
        norm = mcolors.Normalize(0, float(np.nanmax([np.nanmax(p) for p in panels])))
        for c, (a, p, name) in enumerate(zip(axes[r], panels, names)):
            last = c == cols - 1
            a.imshow(p, cmap=_cmap(), norm=norm, extent=(-0.5, gw - 0.5, gh - 0.5, -0.5) if last else extent,
                     interpolation="nearest")
            if img is not None and not last:
                _outline(a, img)
            a.set_xticks([])
            a.set_yticks([])
            a.set_title(name, fontsize="x-small")
        axes[r, 0].set_ylabel(str(m), fontsize="small")
        cbar = fig.colorbar(ScalarMappable(norm=norm, cmap=_cmap()), ax=list(axes[r]), shrink=0.9, aspect=12, pad=0.02)
        cbar.set_label(f"CLS row, {measure.get(m, 'map')}\n({units[str(m)]})", fontsize="x-small")
        cbar.ax.tick_params(labelsize="x-small")
    note = (f"per-head panels: image {sample} (red: its digit's outline); heads are numbered per model, "
            "teacher head n is not FAR head n")
    fig.suptitle(f"{title or f'CLS → patch, block {layer}'}\n{note}", fontsize="small")
    return fig


# --------------------------------------------------------------------------------------- token maps
def _token_axes(a: Axes, kinds: np.ndarray) -> None:
    n_pre = int((kinds != "patch").sum())
    n = len(kinds)
    ticks = ([(n_pre - 1) / 2] if n_pre else []) + [n_pre + (n - n_pre - 1) / 2]
    labels = (["+".join(dict.fromkeys(kinds[:n_pre]))] if n_pre else []) + [f"{n - n_pre} patches"]
    a.set_xticks(ticks, labels, fontsize="x-small")
    a.set_yticks(ticks, labels, fontsize="x-small", rotation=90, va="center")
    if n_pre:
        a.axvline(n_pre - 0.5, color="white", lw=0.6)
        a.axhline(n_pre - 0.5, color="white", lw=0.6)


def plot_token_maps(
    maps: xr.Dataset,
    *,
    layer: int,
    models: Sequence[str] | None = None,
    samples: Sequence[int] | None = None,
    scale: str = "sqrt",
    normalize: Normalize = "none",
    shared_scale: bool = True,
    title: str | None = None,
) -> Figure:
    """Token-to-token maps of one layer, averaged over heads and samples (App. C.2), one panel per model.

    Args:
        maps: :func:`~workbench.analysis.token_maps.stack_maps` output.
        layer: layer label.
        models: model labels (default all), left to right.
        samples: sample labels to average over (default all).
        scale: ``"sqrt"`` (default, keeps small values visible) or ``"linear"``.
        normalize: ``"none"`` (default) the mean of the stored values: a query row's brightness is how
            strongly that output token depends on its inputs (the paper's horizontal bands);
            ``"row"`` every (sample, head) query row scaled to sum to 1 before averaging.
        shared_scale: panels in the same unit (e.g. teacher and FAR saliency) share one colour scale
            and colour bar (default); False gives every panel its own.
        title: figure title.

    Returns:
        The Figure; colour = mean over heads and samples, in the unit its colour bar names.
    """
    da = _rows_normalised(maps["map"].sel(layer=layer), ("key",), normalize)
    if samples is not None:
        da = da.sel(sample=list(samples))
    avg = da.mean(("head", "sample"))
    models = list(avg["model"].values) if models is None else list(models)
    units = _units(maps, normalize)
    tops = [float(np.nanmax(avg.sel(model=m).values)) for m in models]
    groups = _scale_groups(models, units, shared_scale)
    for g in groups:
        for i in g:
            tops[i] = max(tops[j] for j in g)
    last_of_group = {g[-1]: g for g in groups}
    fig, axes = plt.subplots(1, len(models), figsize=(3.1 * len(models) + 0.4 + 0.3 * len(groups), 3.0), squeeze=False,
                             layout="constrained")
    measure = dict(zip(maps["model"].values, maps["measure"].values)) if "measure" in maps.coords else {}
    kinds = maps["query_kind"].values if "query_kind" in maps.coords else None
    for i, (a, m) in enumerate(zip(axes[0], models)):
        norm = mcolors.PowerNorm(0.5, 0, tops[i]) if scale == "sqrt" else mcolors.Normalize(0, tops[i])
        a.imshow(avg.sel(model=m).transpose("query", "key").values, cmap=_cmap(), norm=norm, interpolation="nearest")
        a.set_title(f"{m}", fontsize="small")
        if kinds is not None:
            _token_axes(a, kinds)
        a.set_xlabel("key token (input)")
        a.set_ylabel("query token (output)" if i == 0 else "")
        if i not in last_of_group:
            continue
        cbar = fig.colorbar(ScalarMappable(norm=norm, cmap=_cmap()), ax=[axes[0, j] for j in last_of_group[i]],
                            shrink=0.85, aspect=20, pad=0.02)
        if isinstance(norm, mcolors.PowerNorm):
            cbar.set_ticks(sorted({float(f"{tops[i] * f:.2g}") for f in (0, 1 / 16, 1 / 4, 9 / 16, 1)}))
        cbar.ax.tick_params(labelsize="x-small")
        what = " & ".join(dict.fromkeys(measure.get(models[j], "map") for j in last_of_group[i]))
        label = f"share of query row ({what})" if units[m] == "share of the row" else f"{what}: {units[m]}"
        if isinstance(norm, mcolors.PowerNorm):
            label += "\n(square-root colour scale)"
        cbar.set_label(label, fontsize="x-small")
    how = "rows normalised, " if normalize == "row" or maps.attrs.get("normalize") == "row" else ""
    fig.suptitle(title or f"Token-to-token dependency · block {layer} · {how}mean over {da.sizes['sample']} samples "
                          f"× {da.sizes['head']} heads", fontsize="medium")
    return fig


# ---------------------------------------------------------------------------------------- agreement
def mean_and_interval(da: xr.DataArray) -> tuple[np.ndarray, np.ndarray]:
    """Per layer: mean over ``sample`` and the half-width of its 95 % Student t interval (NaN with < 2 samples)."""
    from scipy.stats import t

    n = da.notnull().sum("sample").values.astype(float)
    sd = da.std("sample", ddof=1).values
    with np.errstate(invalid="ignore", divide="ignore"):
        half = np.where(n > 1, t.ppf(0.975, np.maximum(n - 1, 1)) * sd / np.sqrt(n), np.nan)
    return da.mean("sample").values, half
def plot_agreement(agreements: Mapping[str, xr.Dataset], *, metrics: Sequence[str] = ("spearman", "pearson", "js"),
                   title: str | None = None) -> Figure:
    """Per-layer agreement with a reference, one panel per metric, one line per (model vs reference).

    Args:
        agreements: label of a comparison family -> :func:`~workbench.analysis.token_maps.agreement`
            output (dims ``(model, sample, layer)``); lines are named "<model> vs <reference>".
        metrics: variables to show, one panel each.
        title: figure title.

    Returns:
        The Figure (mean over samples, bars: its 95 % Student t interval over the samples).
    """
    labels = {"pearson": "Pearson r of the maps", "spearman": "Spearman ρ of the maps",
              "js": "JS divergence (bits)", "cls_pearson": "Pearson r, CLS row",
              "cls_js": "JS divergence, CLS row (bits)"}
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.3 * len(metrics) + 0.6, 3.2), squeeze=False, layout="constrained")
    palette = sns.color_palette("colorblind")
    lines = []
    for family, ds in agreements.items():
        raw = ds.attrs.get("normalize") == "none"  # stored values, not row-normalised: dashed
        for m in ds["model"].values:
            if not np.isfinite(np.asarray(ds[list(ds.data_vars)[0]].sel(model=m).values, dtype=float)).any():
                continue  # nothing to draw: no legend entry either
            name = f"{m} vs {ds.attrs.get('reference', 'reference')}"
            if any(n == name for n, _, _ in lines) or raw:
                name = f"{name} ({family})"
            lines.append((name, ds.sel(model=m), raw))
    for a, metric in zip(axes[0], metrics):
        for i, (name, ds, raw) in enumerate(lines):
            if metric not in ds:
                continue
            mean, half = mean_and_interval(ds[metric])
            layers = ds["layer"].values
            a.errorbar(layers, mean, yerr=half, marker="o", ms=3.5, capsize=2, lw=1.3, color=palette[i],
                       ls="--" if raw else "-", label=name)
        a.set_xlabel("layer (block)")
        a.set_ylabel(labels.get(metric, metric))
        a.set_xticks(lines[0][1]["layer"].values if lines else [])
        if metric in ("js", "cls_js"):
            a.set_ylim(bottom=0)
        else:
            a.axhline(0, color="0.6", lw=0.8)
        a.grid(alpha=0.3)
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=min(2, len(names)), fontsize="small", frameon=False)
    fig.suptitle(title or "Agreement of token maps with the reference, per layer (mean, 95 % interval over samples)")
    return fig


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
