"""SlimSwin figures (papers/004) from Datasets: FLOP breakdown, window maps, accuracy, layer-wise ratios.

- :func:`plot_flops_breakdown` -- Fig. 1: component-wise FLOPs of whole Swins, ``flops(model, component)``.
- :func:`plot_window_saliency` -- saliency (or any pair variable) of a ``window_saliency`` Dataset
  painted over the image, layers x heads, window borders drawn (shifted windows wrap around).
- :func:`plot_gate_masks` -- Figs. 2/3 recast: which window-head pairs survive, per ratio, over the image
  (blue = kept, grey = pruned, the paper's colours), one panel per (layer, head).
- :func:`plot_kept_heads` -- the same masks compacted: per ratio and layer, how many heads each window keeps.
- :func:`plot_accuracy_vs_ratio` -- Figs. 4/5: held-out accuracy against the global ratio, teacher dashed.
- :func:`plot_layer_ratio` -- Figs. 6/7: the pruned share of every layer's pairs at one global ratio.

No torch here: everything is drawn from xarray (see :mod:`workbench.analysis.window_saliency` for
the Datasets and the pure-xarray helpers used below).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from workbench.plots.slimswin_views import as_window_grid
from workbench.plots.theme import ATTENTION_CMAP, MISSING_COLOR, PANEL_INCHES

#: Colours of the paper's Figs. 2 and 3: blue = remaining pair, grey = pruned pair.
KEPT_COLOR = "#3b75af"
PRUNED_COLOR = "#bdbdbd"

COMPONENT_LABELS = {
    "patch_embed": "patch embedding", "norm": "LayerNorm", "attn_qkv": "attention: QKV projection",
    "attn_matmul": "attention: QK$^T$ and AV", "attn_proj": "attention: output projection", "mlp": "MLP",
    "patch_merging": "patch merging", "head": "classifier",
}


def _figure(n_rows: int, n_cols: int, ax: Axes | None, extra_w: float = 1.2) -> tuple[Figure, np.ndarray]:
    if ax is not None:
        return ax.figure, np.array([[ax]])
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(PANEL_INCHES * n_cols + extra_w, PANEL_INCHES * n_rows + 0.8),
                             squeeze=False, layout="constrained")
    return fig, axes


# --------------------------------------------------------------------------------------------
# Fig. 1
# --------------------------------------------------------------------------------------------


def plot_flops_breakdown(ds: xr.Dataset, ax: Axes | None = None) -> Figure:
    """Horizontal bars of each component's FLOPs per image, one bar per model, share of the total printed.

    Args:
        ds: ``flops(model, component)`` in FLOPs per image (attrs ``convention`` optional, shown as a note).
        ax: draw into this Axes.
    """
    da = ds["flops"]
    models = [str(m) for m in da["model"].values]
    comps = [str(c) for c in da["component"].values]
    fig, axes = _figure(1, 1, ax)
    if ax is None:
        fig.set_size_inches(6.4, 0.22 * len(comps) * len(models) + 1.3)
    a = axes[0, 0]
    height = 0.8 / len(models)
    colors = plt.get_cmap("tab10").colors
    y = np.arange(len(comps))
    for i, m in enumerate(models):
        vals = da.sel(model=m).values / 1e9
        total = vals.sum()
        pos = y - 0.4 + height * (i + 0.5)
        a.barh(pos, vals, height=height * 0.92, color=colors[i % 10], label=f"{m} ({total:.2f} GFLOPs)")
        for p, v in zip(pos, vals):
            a.text(v, p, f" {100 * v / total:.1f} %", va="center", ha="left", fontsize="x-small")
    a.set_yticks(y, [COMPONENT_LABELS.get(c, c) for c in comps])
    a.invert_yaxis()
    a.set_xlabel("GFLOPs per image (1 MAC = 2 FLOPs)")
    a.set_xlim(0, float(da.max()) / 1e9 * 1.22)
    a.legend(loc="lower right", fontsize="small", frameon=False)
    if ax is None:
        a.set_title("Component-wise FLOPs of the Swin Transformer (224 x 224)")
    return fig


# --------------------------------------------------------------------------------------------
# Window maps over the image
# --------------------------------------------------------------------------------------------


def _window_borders(window: np.ndarray) -> LineCollection:
    """Line segments between positions of different windows (pixel units, pixel edges at k - 0.5)."""
    segs = []
    h, w = window.shape
    ys, xs = np.nonzero(window[:, 1:] != window[:, :-1])  # vertical edges right of (y, x)
    segs += [((x + 0.5, y - 0.5), (x + 0.5, y + 0.5)) for y, x in zip(ys, xs)]
    ys, xs = np.nonzero(window[1:, :] != window[:-1, :])  # horizontal edges below (y, x)
    segs += [((x - 0.5, y + 0.5), (x + 0.5, y + 0.5)) for y, x in zip(ys, xs)]
    return LineCollection(segs, colors="white", linewidths=1.2)


def _label_windows(a: Axes, grid: xr.DataArray, values: np.ndarray, fmt: str,
                   color: str | Callable[[float], str] = "white") -> None:
    """Write each window's value at the centre of its largest piece (wrapped windows have several).

    ``color`` is a colour or a function of the value (e.g. dark text on light windows).
    """
    window = grid["window"].values
    for win in np.unique(window):
        ys, xs = np.nonzero(window == win)
        # the largest rectangle-ish piece: split at wrap-around gaps
        ys_u, xs_u = np.unique(ys), np.unique(xs)
        y_piece = max(np.split(ys_u, np.flatnonzero(np.diff(ys_u) > 1) + 1), key=len)
        x_piece = max(np.split(xs_u, np.flatnonzero(np.diff(xs_u) > 1) + 1), key=len)
        v = values[window == win][0]
        if np.isfinite(v):
            a.text(x_piece.mean(), y_piece.mean(), fmt.format(v), ha="center", va="center", fontsize="x-small",
                   color=color(v) if callable(color) else color, fontweight="bold")


def _image_extent(grid: xr.DataArray) -> tuple[float, float, float, float]:
    return (-0.5, grid.sizes["x"] - 0.5, grid.sizes["y"] - 0.5, -0.5)


def plot_window_saliency(ds: xr.Dataset, *, layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                         var: str = "saliency", image: np.ndarray | xr.DataArray | None = None, annotate: bool = True,
                         ax: Axes | None = None) -> Figure:
    """One panel per (layer, head): the pair variable painted over the input, windows outlined.

    Args:
        ds: a ``window_saliency`` Dataset.
        layers: layer labels (rows); default: the prunable ones.
        heads: head labels (columns); default: all heads of the shown layers (missing ones are blank).
        var: pair variable (``saliency``).
        image: ``(H, W)`` image in [0, 1] drawn as contours for orientation (default: none).
        annotate: write each window's value into it (only for layers with at most 16 windows).
        ax: draw only the first panel into this Axes.
    """
    if layers is None:
        layers = sorted(set(ds["layer"].values[ds["prunable"].values.astype(bool)].tolist())) or \
            sorted(set(ds["layer"].values.tolist()))
    grids = {l: as_window_grid(ds, l, var, units="pixel") for l in layers}
    head_labels = sorted(set(h for g in grids.values() for h in g["head"].values.tolist())) if heads is None else list(heads)
    fig, axes = _figure(len(layers), len(head_labels), ax)
    vals = np.concatenate([g.values[np.isfinite(g.values)].ravel() for g in grids.values()])
    top = float(np.abs(vals).max()) if vals.size and np.abs(vals).max() > 0 else 1.0
    scale = 10.0 ** np.floor(np.log10(top))  # values are printed and shown on the colour bar in units of `scale`
    norm = mcolors.Normalize(min(0.0, float(vals.min()) / scale) if vals.size else 0.0, top / scale)
    cmap = plt.get_cmap(ATTENTION_CMAP).with_extremes(bad=MISSING_COLOR)
    for r, l in enumerate(layers):
        g = grids[l]
        for c, h in enumerate(head_labels):
            if ax is not None and (r or c):
                continue
            a = axes[r, c]
            title = f"layer {l}{' (shifted)' if g.attrs['shifted'] else ''}, head {h}"
            if h not in g["head"].values:  # a layer with fewer heads than the widest one: leave the slot empty
                a.set_axis_off()
                continue
            panel = g.sel(head=h) / scale
            a.imshow(panel.values, cmap=cmap, norm=norm, extent=_image_extent(g))
            if image is not None:
                a.contour(np.asarray(image), levels=[0.5], colors="white", linewidths=0.8, alpha=0.8,
                          extent=(-0.5, g.sizes["x"] - 0.5, -0.5, g.sizes["y"] - 0.5), origin="upper")
            a.add_collection(_window_borders(g["window"].values))
            if annotate and len(np.unique(g["window"].values)) <= 16:
                _label_windows(a, panel, panel.values, "{:.1f}")
            a.set_title(title, fontsize="small")
            a.set_xticks([]), a.set_yticks([])
            if c == 0:
                a.set_ylabel(f"{g.sizes['y']} px")
            if r == len(layers) - 1:
                a.set_xlabel(f"{g.sizes['x']} px")
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    label = ds[var].attrs.get("long_name", var)
    units = ds[var].attrs.get("units", "")
    factor = "" if scale == 1 else f"x {scale:.0e} "
    fig.colorbar(sm, ax=list(axes.ravel()), shrink=0.8, aspect=25).set_label(
        f"{label}" + (f"\n[{factor}{units}]" if units or factor else ""))
    return fig


def plot_gate_masks(masks: Mapping[str, xr.Dataset], *, layers: Sequence[int] | None = None,
                    image: np.ndarray | xr.DataArray | None = None, ax: Axes | None = None) -> Figure:
    """Which window-head pairs each pruned model keeps, over the image: rows = models, columns = (layer, head).

    Args:
        masks: row label (e.g. ``"r = 0.33"``) -> a ``window_saliency`` Dataset of that model (its ``mask``).
        layers: layer labels to show; default: the prunable layers.
        image: ``(H, W)`` image in [0, 1] shown under the masks for orientation.
        ax: draw only the first panel into this Axes.
    """
    labels = list(masks)
    first = masks[labels[0]]
    if layers is None:
        layers = sorted(set(first["layer"].values[first["prunable"].values.astype(bool)].tolist()))
    columns = [(l, h) for l in layers for h in sorted(set(first["head"].values[first["layer"].values == l].tolist()))]
    fig, axes = _figure(len(labels), len(columns), ax, extra_w=0.4)
    cmap = mcolors.ListedColormap([PRUNED_COLOR, KEPT_COLOR])
    for r, lab in enumerate(labels):
        grids = {l: as_window_grid(masks[lab], l, "mask", units="pixel") for l in layers}
        for c, (l, h) in enumerate(columns):
            if ax is not None and (r or c):
                continue
            a = axes[r, c]
            g = grids[l]
            kept = g.sel(head=h).values
            a.imshow(kept, cmap=cmap, vmin=0, vmax=1, extent=_image_extent(g), alpha=0.9)
            if image is not None:
                a.imshow(np.asarray(image), cmap="gray_r", vmin=0, vmax=1, alpha=0.35, extent=_image_extent(g))
            a.add_collection(_window_borders(g["window"].values))
            n_kept = int(np.nansum(masks[lab]["mask"].values[(masks[lab]["layer"].values == l) &
                                                             (masks[lab]["head"].values == h)]))
            n_all = int(((masks[lab]["layer"].values == l) & (masks[lab]["head"].values == h)).sum())
            a.set_title(f"layer {l}{' (SW)' if g.attrs['shifted'] else ''}, head {h}: {n_kept}/{n_all}", fontsize="small")
            a.set_xticks([]), a.set_yticks([])
            if c == 0:
                a.set_ylabel(lab)
    fig.legend(handles=[Patch(color=KEPT_COLOR, label="kept pair"), Patch(color=PRUNED_COLOR, label="pruned pair")],
               loc="outside lower center", ncols=2, frameon=False, fontsize="small")
    return fig


def plot_kept_heads(masks: Mapping[str, xr.Dataset], *, layers: Sequence[int] | None = None,
                    image: np.ndarray | xr.DataArray | None = None, ax: Axes | None = None) -> Figure:
    """How many heads every window keeps, per model (rows) and layer (columns), over the image.

    Each window is coloured by the share of the layer's heads it keeps (white: none, dark blue: all) and
    labelled with the count; the panel title gives the layer's kept / all pairs.

    Args:
        masks: row label (e.g. ``"r = 1/3"``) -> a ``window_saliency`` Dataset of that model (its ``mask``).
        layers: layer labels to show; default: the prunable layers.
        image: ``(H, W)`` image in [0, 1] drawn as a contour for orientation.
        ax: draw only the first panel into this Axes.
    """
    labels = list(masks)
    first = masks[labels[0]]
    if layers is None:
        layers = sorted(set(first["layer"].values[first["prunable"].values.astype(bool)].tolist()))
    fig, axes = _figure(len(labels), len(layers), ax)
    cmap = plt.get_cmap("Blues")
    norm = mcolors.Normalize(0.0, 1.0)
    for r, lab in enumerate(labels):
        for c, l in enumerate(layers):
            if ax is not None and (r or c):
                continue
            a = axes[r, c]
            g = as_window_grid(masks[lab], l, "mask", units="pixel")  # (head, y, x) 0/1
            kept = g.sum("head")  # (y, x) kept heads of each position's window
            a.imshow((kept / g.sizes["head"]).values, cmap=cmap, norm=norm, extent=_image_extent(g))
            if image is not None:
                a.contour(np.asarray(image), levels=[0.5], colors="0.45", linewidths=0.8,
                          extent=(-0.5, g.sizes["x"] - 0.5, -0.5, g.sizes["y"] - 0.5), origin="upper")
            borders = _window_borders(g["window"].values)
            borders.set_color("0.6")
            a.add_collection(borders)
            n_heads = g.sizes["head"]
            _label_windows(a, kept, kept.values, "{:.0f}", color=lambda v, n=n_heads: "white" if v / n > 0.6 else "0.15")
            sel = masks[lab]["layer"].values == l
            n_kept, n_all = int(masks[lab]["mask"].values[sel].sum()), int(sel.sum())
            a.set_title(f"layer {l}{' (SW)' if g.attrs['shifted'] else ''}: {n_kept}/{n_all} kept", fontsize="small")
            a.set_xticks([]), a.set_yticks([])
            if c == 0:
                a.set_ylabel(lab)
            if r == len(labels) - 1:
                a.set_xlabel(f"{g.sizes['head']} heads, {len(np.unique(g['window'].values))} windows", fontsize="small")
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=list(axes.ravel()), shrink=0.8, aspect=25).set_label(
        "share of the layer's heads kept in the window\n(number: heads kept)")
    return fig


# --------------------------------------------------------------------------------------------
# Figs. 4-7
# --------------------------------------------------------------------------------------------


def plot_accuracy_vs_ratio(ds: xr.Dataset, ax: Axes | None = None, title: str | None = None) -> Figure:
    """Held-out top-1 accuracy (%) against the global pruning ratio, the unpruned teacher dashed.

    Args:
        ds: from :func:`workbench.analysis.window_saliency.accuracy`: ``accuracy(ratio)``, optional
            ``achieved_ratio(ratio)`` (used as x when present) and ``accuracy_before_final(ratio)``;
            attr ``teacher_accuracy``.
        ax: draw into this Axes.
        title: axes title (default: none when ``ax`` is given).
    """
    fig, axes = _figure(1, 1, ax)
    if ax is None:
        fig.set_size_inches(4.6, 3.2)
    a = axes[0, 0]
    x = ds["achieved_ratio"].values if "achieved_ratio" in ds else ds["ratio"].values
    a.plot(x, 100 * ds["accuracy"].values, "o-", label="after final fine-tune")
    if "accuracy_before_final" in ds:
        a.plot(x, 100 * ds["accuracy_before_final"].values, "s--", alpha=0.7, label="after iterative pruning only")
    teacher = float(ds.attrs.get("teacher_accuracy", np.nan))
    if np.isfinite(teacher):
        a.axhline(100 * teacher, color="0.3", ls=":", label=f"unpruned teacher ({100 * teacher:.1f} %)")
    for xi, yi, r in zip(x, 100 * ds["accuracy"].values, ds["ratio"].values):
        a.annotate(f"r={r:.2f}", (xi, yi), textcoords="offset points", xytext=(0, 7), ha="center", fontsize="x-small",
                   bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
    a.margins(x=0.1)  # room for the first and last ratio labels
    a.set_xlabel("global pruning ratio (pruned share of prunable window-head pairs)")
    a.set_ylabel("held-out top-1 accuracy (%)")
    a.legend(fontsize="small", frameon=True, framealpha=0.9, loc="best")
    lo = np.nanmin([*(100 * ds["accuracy"].values), *(100 * ds.get("accuracy_before_final", ds["accuracy"]).values), 100 * teacher if np.isfinite(teacher) else np.inf])
    a.set_ylim(max(0.0, lo - 8), 100.5)
    if title or ax is None:
        a.set_title(title or "Accuracy vs. global pruning ratio")
    return fig


def plot_layer_ratio(ds: xr.Dataset, ratio: float, ax: Axes | None = None, title: str | None = None) -> Figure:
    """Bars of each layer's pruned share of window-head pairs at global ratio ``ratio``.

    Args:
        ds: from :func:`workbench.analysis.window_saliency.layer_ratio` (``layer_ratio(ratio, layer)``).
        ratio: the requested global ratio to show (nearest label).
        ax: draw into this Axes.
        title: axes title (default derived from the ratio).
    """
    sel = ds.sel(ratio=ratio, method="nearest")
    fig, axes = _figure(1, 1, ax)
    if ax is None:
        fig.set_size_inches(max(3.6, 0.45 * sel.sizes["layer"] + 1.8) + 1.4, 3.0)  # + the legend beside
    a = axes[0, 0]
    layers = sel["layer"].values
    prunable = sel["prunable"].values.astype(bool)
    colors = plt.get_cmap("tab10").colors
    bar_colors = [colors[int(s) % 10] if p else "white" for s, p in zip(sel["stage"].values, prunable)]
    a.bar(layers, sel["layer_ratio"].values, color=bar_colors, edgecolor="0.3",
          hatch=[None if p else "//" for p in prunable])
    for l, p, n in zip(layers, prunable, sel["pruned_pairs"].values):
        # at the foot of the bar, clear of the global-ratio line whatever the bar's height
        a.text(l, 0.015, f"{int(n)}/{int(sel['num_pairs'].sel(layer=l))}" if p else "not\nprunable",
               ha="center", va="bottom", fontsize="x-small",
               bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=0.5))
    a.axhline(float(sel["global_ratio"]), color="0.3", ls="--", lw=1,
              label=f"global ratio {float(sel['global_ratio']):.3f}")
    stages = sorted(set(int(s) for s in sel["stage"].values))
    handles = [Patch(facecolor=colors[s % 10], edgecolor="0.3", label=f"stage {s}") for s in stages
               if any(prunable[sel["stage"].values == s])]
    if (~prunable & (sel["layer_ratio"].values > 0)).any():  # a hatched bar is visible only with some height;
        # unpruned layers have none (ratio 0): they are labelled "not prunable" above their position instead
        handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="//", label="last stage (not pruned)"))
    a.legend(handles=handles + a.get_legend_handles_labels()[0], fontsize="x-small", frameon=False, loc="upper left",
             bbox_to_anchor=(1.01, 1.0))  # beside the axes: covers no bar
    a.set_xticks(layers)
    a.set_xlabel("layer (Swin block, all stages)")
    a.set_ylabel("pruned share of the layer's pairs\n(labels: pruned / all pairs)")
    a.set_ylim(0, 1.0)  # a share
    a.set_title(title or f"Layer-wise pruning ratios (r ≈ {float(sel['ratio']):.2f})")
    return fig


#: Line styles of the mask choices in :func:`plot_mask_baselines`.
MASK_STYLES = {"saliency": ("o-", "C0", "SlimSwin (least salient pairs)"),
               "random": ("s--", "C3", "random pairs"),
               "uniform": ("^:", "C2", "uniform per layer (random pairs)")}


def plot_mask_baselines(ds: xr.Dataset, stage: str, ax: Axes | None = None, title: str | None = None) -> Figure:
    """Held-out top-1 (%) against the global ratio for SlimSwin's masks and the baselines, with 95 % Wilson intervals.

    Args:
        ds: ``accuracy(stage, masks, ratio)`` with its interval ``ci_low`` / ``ci_high`` (NaN where a choice was not
            run), ``teacher_accuracy`` (scalar), and ``sample`` (its size: the images behind the intervals).
        stage: ``"no fine-tune"`` or ``"fine-tuned"``.
        ax: draw into this Axes.
        title: axes title.
    """
    fig, axes = _figure(1, 1, ax)
    a = axes[0, 0]
    n = ds.sizes["sample"]
    sel = ds.sel(stage=stage)
    for choice in sel["masks"].values:
        style, color, label = MASK_STYLES.get(str(choice), ("x-", "0.4", str(choice)))
        c = sel.sel(masks=choice)
        ok = np.isfinite(c["accuracy"].values)
        if not ok.any():
            continue
        x, p = ds["ratio"].values[ok], c["accuracy"].values[ok]
        err = np.stack([p - c["ci_low"].values[ok], c["ci_high"].values[ok] - p])
        a.errorbar(x, 100 * p, yerr=100 * err, fmt=style, color=color, capsize=3, ms=5, label=label)
    t = float(ds["teacher_accuracy"])
    a.axhline(100 * t, color="0.3", ls=":", label=f"unpruned teacher ({100 * t:.1f} %)")
    a.set_xticks(ds["ratio"].values, [f"{r:.2f}" for r in ds["ratio"].values])
    a.margins(x=0.12)
    a.set_xlabel("global pruning ratio r (same number of pruned pairs)")
    a.set_ylabel("held-out top-1 accuracy (%)")
    a.legend(fontsize="x-small", frameon=True, framealpha=0.9, loc="best")
    a.set_title(title or f"Which pairs to prune ({stage}; bars: 95 % CI over {n} images)", fontsize="small")
    return fig
