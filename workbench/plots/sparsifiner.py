"""Sparsifiner figures from Datasets (no torch): Fig. 3–7 of Wei et al., "Sparsifiner" (CVPR 2023, papers/001).

- :func:`plot_query_maps` — Fig. 3: for one query patch, its connectivity mask, the sparse attention and the
  teacher's full attention over layers and heads (``sparse_attention`` Dataset with ``teacher_attention``);
- :func:`plot_accuracy_vs_macs` — Fig. 4: held-out accuracy against MHSA MACs over keep rates, with the dense
  teacher and the Linformer baseline (a table of runs, one row each);
- :func:`plot_lowrank_vs_sparse` — Fig. 5: one query's full, Linformer (low-rank) and Sparsifiner (sparse
  full-rank) maps, and the singular-value spectra of the three kinds of attention matrix;
- :func:`plot_basis` — Fig. 6: the sparse basis W_up of every layer as images on the patch grid, the CLS key's
  entries apart;
- :func:`plot_coefficients` — Fig. 7: the basis coefficients of one head over all layers;
- :func:`plot_mass_agreement` — the share of the dense teacher's attention that the kept keys carry, per layer
  and keep rate, against the best any B keys could carry.

Maps on the patch grid are drawn cell by cell (one cell per patch), with the input digit's outline in white
and the query patch framed.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from workbench.plots.theme import ATTENTION_CMAP, DIVERGING_CMAP, MISSING_COLOR

#: Inches per map panel (the demo's 7 x 7 patch grids are small images).
MAP_INCHES = 0.82
#: Colour of the query patch's frame.
QUERY_COLOR = "#ff2d55"


def _cmap(name: str = ATTENTION_CMAP) -> mcolors.Colormap:
    return plt.get_cmap(name).with_extremes(bad=MISSING_COLOR)


def _grey(image) -> np.ndarray:
    img = np.asarray(getattr(image, "values", image), dtype=np.float32)
    if img.ndim == 3 and img.shape[-1] == 3:
        img = img @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    return np.clip(img, 0, 1)


def _grid_of(row: xr.DataArray, dim: str = "key") -> np.ndarray:
    """A token row over ``dim`` as the patch grid ``(gh, gw)`` (prefix tokens dropped)."""
    patch = row[f"{dim}_kind"].values == "patch"
    ys, xs = row[f"{dim}_y"].values[patch], row[f"{dim}_x"].values[patch]
    grid = np.full((ys.max() + 1, xs.max() + 1), np.nan, np.float32)
    grid[ys, xs] = row.values[patch]
    return grid


def _outline_lines(image: np.ndarray | None, grid: tuple[int, int]) -> list[np.ndarray]:
    """The digit's outline (image level 0.5) as polylines in grid cell coordinates (computed once per figure)."""
    if image is None or not image.max() > 0.5 > image.min():
        return []
    import contourpy  # matplotlib's contouring engine

    h, w = image.shape[:2]
    gh, gw = grid
    yy = (np.arange(h) + 0.5) * gh / h - 0.5
    xx = (np.arange(w) + 0.5) * gw / w - 0.5
    return list(contourpy.contour_generator(xx, yy, image.astype(np.float64)).lines(0.5))


def _outline(a: Axes, lines: list[np.ndarray]) -> None:
    xlim, ylim = a.get_xlim(), a.get_ylim()
    for line in lines:  # (points, 2): x, y
        a.plot(line[:, 0], line[:, 1], color="white", lw=0.6, alpha=0.9)
    a.set_xlim(xlim)
    a.set_ylim(ylim)


def _frame(a: Axes, yx: tuple[int, int], lw: float = 1.4) -> None:
    a.add_patch(Rectangle((yx[1] - 0.5, yx[0] - 0.5), 1, 1, fill=False, ec=QUERY_COLOR, lw=lw))


def _bare(a: Axes) -> None:
    a.set_xticks([])
    a.set_yticks([])
    for s in a.spines.values():
        s.set_linewidth(0.4)


def _query_yx(ds: xr.Dataset, query: int) -> tuple[int, int]:
    q = ds.sel(query=query)
    return int(q["query_y"]), int(q["query_x"])


# ------------------------------------------------------------------------------------------ Fig. 3
def plot_query_maps(ds: xr.Dataset, *, sample: int, query: int, layers: Sequence[int] | None = None,
                    heads: Sequence[int] | None = None, title: str | None = None) -> Figure:
    """Connectivity mask, sparse attention and the teacher's full attention of one query patch (Fig. 3).

    Args:
        ds: a ``sparse_attention`` Dataset with ``teacher_attention`` (else the student's own ``full_attention`` is
            drawn) and ``image(sample, img_y, img_x)``.
        sample: the image (``sample`` label).
        query: the query token (a patch).
        layers: block indices to show (rows); None for all.
        heads: heads to show; None for all.
        title: figure title.

    Returns:
        A figure with one row per layer: the image with the query patch, then per head the mask (the image with the
        keys not kept darkened; "CLS" where the CLS key is kept), then per head the sparse map, then per head the
        full map. Sparse and full maps of a layer share one colour scale (probability; bar at the right).
    """
    full_name = "teacher_attention" if "teacher_attention" in ds else "full_attention"
    d = ds.sel(sample=sample, query=query)
    layers = [int(v) for v in (ds["layer"].values if layers is None else layers)]
    heads = [int(v) for v in (ds["head"].values if heads is None else heads)]
    image = _grey(ds["image"].sel(sample=sample)) if "image" in ds else None
    gh = int(ds["key_y"].max()) + 1
    gw = int(ds["key_x"].max()) + 1
    yx = _query_yx(ds, query)
    outline = _outline_lines(image, (gh, gw))
    nh = len(heads)
    ncols = 1 + 3 * nh
    fig = plt.figure(figsize=(MAP_INCHES * (ncols + 0.6) + 0.9, MAP_INCHES * len(layers) + 0.9), layout="constrained")
    gs = fig.add_gridspec(len(layers), ncols + 1, width_ratios=[1] * ncols + [0.12])
    cls_key = ds["key_kind"].values == "cls"
    for r, layer in enumerate(layers):
        row = d.sel(layer=layer)
        maps = [_grid_of(row[name].sel(head=h)) for name in ("attention", full_name) for h in heads]
        vmax = max(float(np.nanmax(m)) for m in maps) or 1.0
        norm = mcolors.Normalize(0, vmax)
        a = fig.add_subplot(gs[r, 0])
        if image is not None:
            a.imshow(image, cmap="gray", vmin=0, vmax=1, extent=(-0.5, gw - 0.5, gh - 0.5, -0.5))
        _frame(a, yx, 1.6)
        a.set_xlim(-0.5, gw - 0.5)
        a.set_ylim(gh - 0.5, -0.5)
        _bare(a)
        a.set_ylabel(f"layer {layer}", fontsize="small")
        if r == 0:
            a.set_title("(a) query", fontsize="small")
        for j, h in enumerate(heads):
            mask = _grid_of(row["mask"].sel(head=h).astype(np.float32))
            a = fig.add_subplot(gs[r, 1 + j])
            if image is not None:  # background lifted to grey, so that kept patches show even where the image is black
                a.imshow(0.4 + 0.6 * image, cmap="gray", vmin=0, vmax=1, extent=(-0.5, gw - 0.5, gh - 0.5, -0.5))
            a.imshow(np.where(mask > 0, np.nan, 1.0), cmap=mcolors.ListedColormap(["black"]), alpha=0.8,
                     vmin=0, vmax=1, extent=(-0.5, gw - 0.5, gh - 0.5, -0.5))
            if bool(row["mask"].sel(head=h).values[cls_key].any()):
                a.text(0.03, 0.97, "CLS", transform=a.transAxes, ha="left", va="top", fontsize=5, color="#ffd60a",
                       fontweight="bold")
            _frame(a, yx)
            a.set_xlim(-0.5, gw - 0.5)
            a.set_ylim(gh - 0.5, -0.5)
            _bare(a)
            if r == 0:
                a.set_title(f"(b) mask h{h}", fontsize="small")
            for k, label in enumerate(("(c) sparse", "(d) full")):
                a = fig.add_subplot(gs[r, 1 + (k + 1) * nh + j])
                a.imshow(maps[k * nh + j], cmap=_cmap(), norm=norm)
                _outline(a, outline)
                _frame(a, yx)
                _bare(a)
                if r == 0:
                    a.set_title(f"{label} h{h}", fontsize="small")
        cax = fig.add_subplot(gs[r, -1])
        cb = fig.colorbar(ScalarMappable(norm=norm, cmap=_cmap()), cax=cax)
        cb.ax.tick_params(labelsize=6)
        if r == len(layers) // 2:
            cb.set_label("probability", fontsize="small")
    full_label = "teacher's full attention" if full_name == "teacher_attention" else "full attention (same model)"
    fig.suptitle(title or f"Query patch (y={yx[0]}, x={yx[1]}): mask, sparse attention, {full_label}")
    return fig


# ------------------------------------------------------------------------------------------ Fig. 4
def plot_accuracy_vs_macs(runs: xr.Dataset, ax: Axes | None = None, *, paper: bool = True,
                          title: str | None = None) -> Figure:
    """Held-out top-1 (%) against MHSA MACs per image, over keep rates (Fig. 4).

    Args:
        runs: one row per model along ``row``: ``kind`` ("teacher", "sparsifiner", "linformer"), ``keep_rate``,
            ``mhsa_macs`` (paper convention), ``val_acc``, and for Sparsifiner rows ``phase1_val_acc``,
            ``init_val_acc``; optional paper curve ``paper_mflops(paper_row)`` / ``paper_top1(paper_row)`` /
            ``paper_keep_rate(paper_row)``.
        ax: draw the demo panel only, into this Axes.
        paper: add a panel with the paper's Table 2 (DeiT-S on ImageNet) when the data has it.
        title: figure title.
    """
    kinds = runs["kind"].values
    sp = runs.isel(row=kinds == "sparsifiner").sortby("keep_rate")
    show_paper = paper and ax is None and "paper_mflops" in runs
    if ax is None:
        fig, axes = plt.subplots(1, 2 if show_paper else 1, figsize=(9.6 if show_paper else 5.0, 4.4),
                                 layout="constrained", squeeze=False)
        a = axes[0, 0]
    else:
        fig, a = ax.figure, ax
    x = sp["mhsa_macs"].values / 1e6

    def se(acc: np.ndarray, n) -> np.ndarray | None:
        """One binomial standard error (percentage points) of a held-out accuracy on ``n`` images."""
        return None if n is None else 100 * np.sqrt(acc * (1 - acc) / n)

    n_sp = sp["val_images"].values if "val_images" in sp else None
    a.errorbar(x, 100 * sp["val_acc"].values, yerr=se(sp["val_acc"].values, n_sp), fmt="o-", color="C0", capsize=2,
               label="Sparsifiner (after phase 2; bars: ±1 s.e.)", zorder=3)
    if "phase1_val_acc" in sp:
        a.plot(x, 100 * sp["phase1_val_acc"].values, "s--", color="C0", alpha=0.55, mfc="white",
               label="predictor trained, backbone not (phase 1)")
    if "init_val_acc" in sp:
        a.plot(x, 100 * sp["init_val_acc"].values, "^:", color="0.45", mfc="white", label="untrained predictor")
    for xi, yi, k, b in zip(x, 100 * sp["val_acc"].values, sp["keep_rate"].values, sp["budget"].values):
        a.annotate(f"keep {k:g}\nB = {int(b)}\n{yi:.1f}%", (xi, yi), textcoords="offset points", xytext=(0, 9),
                   ha="center", fontsize="x-small")
    t = runs.isel(row=kinds == "teacher")
    for i in range(t.sizes["row"]):
        xt, yt = t["mhsa_macs"].values[i] / 1e6, 100 * t["val_acc"].values[i]
        a.plot(xt, yt, "*", ms=13, color="C3", label="dense teacher", zorder=4)
        a.annotate(f"{yt:.1f}%", (xt, yt), textcoords="offset points", xytext=(0, -14), ha="center", fontsize="x-small")
    lin = runs.isel(row=kinds == "linformer")
    for i in range(lin.sizes["row"]):
        xl, yl = lin["mhsa_macs"].values[i] / 1e6, 100 * lin["val_acc"].values[i]
        a.plot(xl, yl, "D", ms=7, color="C2", zorder=4,
               label=f"Linformer, k = {int(lin['budget'].values[i])} "
                     f"(= B at keep {float(lin['keep_rate'].values[i]):g})")
        a.annotate(f"{yl:.1f}%", (xl, yl), textcoords="offset points", xytext=(9, -3), fontsize="x-small")
    a.set_xlabel("MHSA MACs per image (millions; QKᵀ, AV, predictor)")
    a.set_ylabel("held-out top-1 accuracy (%)")
    vals = np.concatenate([100 * runs["val_acc"].values, 100 * sp.get("init_val_acc", sp["val_acc"]).values])
    a.set_ylim(max(0.0, np.nanmin(vals) - 4), min(100.5, np.nanmax(vals) + 7))
    a.margins(x=0.12)
    a.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, frameon=False)
    a.set_title("demo ViT on MNIST-5k (held-out)", fontsize="medium")
    if show_paper:
        b = axes[0, 1]
        pk = runs["paper_keep_rate"].values
        sparse = pk < 1
        b.plot(runs["paper_mflops"].values[sparse], runs["paper_top1"].values[sparse], "o-", color="C0",
               label="Sparsifiner-S (Table 2)")
        b.plot(runs["paper_mflops"].values[~sparse], runs["paper_top1"].values[~sparse], "*", ms=13, color="C3",
               label="DeiT-S (dense)")
        for xi, yi, k in zip(runs["paper_mflops"].values, runs["paper_top1"].values, pk):
            if k in (0.5, 0.25, 0.1, 0.2, 0.05, 0.01):
                b.annotate(f"{k:g}", (xi, yi), textcoords="offset points", xytext=(4, -9), fontsize="x-small")
        b.set_xlabel("MHSA MFLOPs (the paper's unit: millions of MACs)")
        b.set_ylabel("ImageNet top-1 (%)")
        b.set_title("paper: DeiT-S on ImageNet (Table 2)", fontsize="medium")
        b.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=2, frameon=False)
    if ax is None:
        fig.suptitle(title or "Accuracy against MHSA cost over attention keep rates")
    return fig


# ------------------------------------------------------------------------------------------ Fig. 5
def plot_lowrank_vs_sparse(ds: xr.Dataset, *, sample: int, query: int, layers: Sequence[int] | None = None,
                           head: int = 0, title: str | None = None) -> Figure:
    """One query's full attention, Linformer's low-rank map and Sparsifiner's sparse full-rank map (Fig. 5).

    Args:
        ds: ``teacher_attention``, ``linformer_attention`` (the T x T map A·F that multiplies V) and ``attention``
            (Sparsifiner's sparse map), each ``(sample, layer, head, query, key)``; ``image``; optional
            ``spectrum(map, rank)``: mean normalised singular values σ_i / σ_1 of each kind of attention matrix.
        sample, query: the image and the query token (a patch).
        layers: rows; None for all.
        head: the head shown.
        title: figure title.
    """
    layers = [int(v) for v in (ds["layer"].values if layers is None else layers)]
    d = ds.sel(sample=sample, query=query, head=head)
    image = _grey(ds["image"].sel(sample=sample)) if "image" in ds else None
    gh = int(ds["key_y"].max()) + 1
    gw = int(ds["key_x"].max()) + 1
    yx = _query_yx(ds, query)
    outline = _outline_lines(image, (gh, gw))
    spectrum = "spectrum" in ds
    side = MAP_INCHES * 1.25
    fig = plt.figure(figsize=(side * 4 + (3.4 if spectrum else 0) + 1.6, side * len(layers) + 0.9),
                     layout="constrained")
    outer = fig.add_gridspec(1, 2 if spectrum else 1, width_ratios=[4 * 1.25 + 1.4, 3.4] if spectrum else [1])
    gs = outer[0, 0].subgridspec(len(layers), 6, width_ratios=[1, 1, 1, 1, 0.1, 0.1])
    for r, layer in enumerate(layers):
        row = d.sel(layer=layer)
        full, sparse = _grid_of(row["teacher_attention"]), _grid_of(row["attention"])
        low = _grid_of(row["linformer_attention"])
        vmax = max(float(np.nanmax(full)), float(np.nanmax(sparse))) or 1.0
        norm = mcolors.Normalize(0, vmax)
        lim = float(np.nanmax(np.abs(low))) or 1.0
        lnorm = mcolors.TwoSlopeNorm(0, -lim, lim)
        a = fig.add_subplot(gs[r, 0])
        if image is not None:
            a.imshow(image, cmap="gray", vmin=0, vmax=1, extent=(-0.5, gw - 0.5, gh - 0.5, -0.5))
        a.set_xlim(-0.5, gw - 0.5)
        a.set_ylim(gh - 0.5, -0.5)
        _frame(a, yx, 1.6)
        _bare(a)
        a.set_ylabel(f"layer {layer}", fontsize="small")
        if r == 0:
            a.set_title("(a) query\n", fontsize="small")
        panels = ((full, norm, _cmap(), "(b) full\n(teacher)"),
                  (low, lnorm, _cmap(DIVERGING_CMAP), "(c) low-rank\n(Linformer)"),
                  (sparse, norm, _cmap(), "(d) sparse\n(Sparsifiner)"))
        for c, (grid, nrm, cmap, label) in enumerate(panels, start=1):
            a = fig.add_subplot(gs[r, c])
            a.imshow(grid, cmap=cmap, norm=nrm)
            _outline(a, outline)
            _frame(a, yx)
            _bare(a)
            if r == 0:
                a.set_title(label, fontsize="small")
        cb = fig.colorbar(ScalarMappable(norm=norm, cmap=_cmap()), cax=fig.add_subplot(gs[r, 4]))
        cb.ax.tick_params(labelsize=6)
        cb2 = fig.colorbar(ScalarMappable(norm=lnorm, cmap=_cmap(DIVERGING_CMAP)), cax=fig.add_subplot(gs[r, 5]))
        cb2.ax.tick_params(labelsize=6)
        if r == len(layers) - 1:
            cb.set_label("prob.", fontsize="x-small")
            cb2.set_label("A·F weight", fontsize="x-small")
    if spectrum:
        s = fig.add_subplot(outer[0, 1])
        styles = {"full (teacher)": ("C3", "-"), "sparse (Sparsifiner)": ("C0", "-"),
                  "low-rank (Linformer)": ("C2", "--")}
        for m in ds["map"].values:
            color, ls = styles.get(str(m), (None, "-"))
            vals = ds["spectrum"].sel(map=m).values
            label = str(m)
            if "numerical_rank" in ds:
                label += f", rank ≈ {float(ds['numerical_rank'].sel(map=m)):.0f}"
            s.semilogy(np.arange(1, len(vals) + 1), np.maximum(vals, 1e-8), ls, color=color, label=label)
        if "linformer_k" in ds.attrs:
            s.axvline(int(ds.attrs["linformer_k"]), color="C2", lw=0.8, ls=":")
            s.annotate(f"k = {int(ds.attrs['linformer_k'])}", (int(ds.attrs["linformer_k"]), 1e-7), fontsize="x-small",
                       color="C2", xytext=(3, 0), textcoords="offset points")
        s.set_ylim(1e-8, 1.5)
        s.set_xlabel("singular value index i")
        s.set_ylabel("σ_i / σ_1 (mean over images, layers, heads)")
        s.set_title("spectrum of the T×T attention matrix", fontsize="medium")
        s.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)  # below: the
        # curves fill the lower left, where the legend sat
    fig.suptitle(title or f"Query patch (y={yx[0]}, x={yx[1]}), head {head}: full vs low-rank vs sparse attention")
    return fig


# ------------------------------------------------------------------------------------------ Fig. 6
def plot_basis(ds: xr.Dataset, *, layers: Sequence[int] | None = None, title: str | None = None) -> Figure:
    """The sparse basis W̃_up of each layer as images on the patch grid, the CLS key's entries apart (Fig. 6).

    Args:
        ds: a ``sparse_basis`` Dataset (``w_up(layer, basis, y, x)``, ``w_up_prefix(layer, basis, key)``,
            ``basis_sparsity(layer)``).
        layers: rows; None for all.
        title: figure title.
    """
    layers = [int(v) for v in (ds["layer"].values if layers is None else layers)]
    basis = [int(b) for b in ds["basis"].values]
    w = ds["w_up"].sel(layer=layers)
    prefix = ds["w_up_prefix"].sel(layer=layers)
    lim = float(max(np.abs(w).max(), np.abs(prefix).max())) or 1.0
    signed = float(min(w.min(), prefix.min())) < 0
    # signed weights: diverging colours around 0 (white); all non-negative: the attention colours, 0 darkest (paper)
    norm = mcolors.TwoSlopeNorm(0, -lim, lim) if signed else mcolors.Normalize(0, lim)
    cmap = _cmap(DIVERGING_CMAP if signed else ATTENTION_CMAP)
    nb = len(basis)
    fig = plt.figure(figsize=(MAP_INCHES * (nb + 1.6) + 1.0, MAP_INCHES * len(layers) + 1.0), layout="constrained")
    gs = fig.add_gridspec(len(layers), nb + 2, width_ratios=[1] * nb + [0.55, 0.12])
    thr = ds.attrs.get("basis_threshold")
    for r, layer in enumerate(layers):
        for c, b in enumerate(basis):
            a = fig.add_subplot(gs[r, c])
            a.imshow(ds["w_up"].sel(layer=layer, basis=b).values, cmap=cmap, norm=norm)
            _bare(a)
            if r == 0:
                a.set_title(f"basis {b}", fontsize="small")
            if c == 0:
                used = int((np.abs(ds["w_up"].sel(layer=layer)).sum(("y", "x")) > 0).sum())
                a.set_ylabel(f"layer {layer}\n{100 * float(ds['basis_sparsity'].sel(layer=layer)):.0f}% zero\n"
                             f"{used}/{nb} used", fontsize="x-small")
        a = fig.add_subplot(gs[r, nb])
        cls = ds["w_up_prefix"].sel(layer=layer).transpose("basis", "key").values  # (r, P)
        a.imshow(cls, cmap=cmap, norm=norm, aspect="auto")
        a.set_xticks([])
        a.set_yticks(range(nb))
        a.set_yticklabels(basis, fontsize=5)
        a.yaxis.tick_right()
        if r == 0:
            a.set_title("CLS key", fontsize="small")
    cb = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=fig.add_subplot(gs[:, -1]))
    cb.set_label("W_up weight (0 = pruned" + (f", |w| ≤ {thr:g}" if thr is not None else "") + ")", fontsize="small")
    fig.suptitle(title or "Sparse basis W_up per layer: each basis vector's weights on the key patches")
    return fig


# ------------------------------------------------------------------------------------------ Fig. 7
def plot_coefficients(ds: xr.Dataset, *, sample: int, head: int, title: str | None = None) -> Figure:
    """The basis coefficients Ã_down of one head over all layers: patch queries x basis per layer (Fig. 7).

    Args:
        ds: a ``sparse_basis`` Dataset (``coefficients(sample, layer, head, query, basis)``, ``a_down``).
        sample: the image.
        head: the head.
        title: figure title.
    """
    coef = ds["coefficients"].sel(sample=sample, head=head)
    layers = [int(v) for v in ds["layer"].values]
    vmax = float(coef.max()) or 1.0
    norm = mcolors.Normalize(0, vmax)
    cmap = _cmap()
    n_q = coef.sizes["query"]
    fig, axes = plt.subplots(1, len(layers), figsize=(0.95 * len(layers) + 1.4, 0.045 * n_q + 1.6), sharey=True,
                             layout="constrained", squeeze=False)
    tau = ds.attrs.get("tau")
    for a, layer in zip(axes[0], layers):
        vals = coef.sel(layer=layer).transpose("query", "basis").values
        a.imshow(vals, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
        zero = 100 * float((vals == 0).mean())
        a.set_title(f"layer {layer}\n{zero:.0f}% zero", fontsize="small")
        a.set_xticks(range(vals.shape[1]))
        a.set_xticklabels([int(b) for b in coef["basis"].values], fontsize=5)
        a.set_xlabel("basis", fontsize="small")
    ticks = np.arange(0, n_q, max(1, n_q // 7))
    axes[0, 0].set_yticks(ticks)
    axes[0, 0].set_yticklabels([int(coef["query"].values[t]) for t in ticks], fontsize=6)
    axes[0, 0].set_ylabel("patch query (token index)")
    cb = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=list(axes[0]), shrink=0.9)
    cb.set_label("coefficient Ã_down" + (f" (≤ τ = {tau:g} → 0)" if tau is not None else ""), fontsize="small")
    fig.suptitle(title or f"Basis coefficients of head {head} over all layers (sample {sample})")
    return fig


# ------------------------------------------------------------------------------------------ agreement
def plot_mass_agreement(ds: xr.Dataset, ax: Axes | None = None, *, title: str | None = None) -> Figure:
    """Share of the dense teacher's attention row on the kept keys, per layer, for each keep rate.

    Args:
        ds: ``mass(keep_rate, layer)``, ``oracle_mass(keep_rate, layer)``, ``chance_mass(keep_rate, layer)`` (means
            over samples, heads and patch queries), optionally ``mass_sd`` and ``budget(keep_rate)``.
        ax: draw into this Axes.
        title: figure (or axes) title.
    """
    from matplotlib.lines import Line2D

    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
    fig = ax.figure
    layers = ds["layer"].values
    colours = []
    for i, k in enumerate(sorted(ds["keep_rate"].values, reverse=True)):
        d = ds.sel(keep_rate=k)
        color = f"C{i}"
        b = int(d["budget"]) if "budget" in d else None
        label = f"keep {k:g}" + (f" (B = {b})" if b is not None else "")
        colours.append(Line2D([], [], color=color, marker="o", label=label))
        ax.plot(layers, d["mass"].values, "o-", color=color)
        if "mass_sd" in d:
            ax.fill_between(layers, d["mass"] - d["mass_sd"], d["mass"] + d["mass_sd"], color=color, alpha=0.12, lw=0)
        ax.plot(layers, d["oracle_mass"].values, "--", color=color, alpha=0.8)
        ax.plot(layers, d["chance_mass"].values, ":", color=color, alpha=0.8)
    styles = [Line2D([], [], color="0.3", ls="-", label="keys the mask keeps"),
              Line2D([], [], color="0.3", ls="--", label="best B keys (teacher's top-B)"),
              Line2D([], [], color="0.3", ls=":", label="B random keys")]
    first = ax.legend(handles=colours, fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                      title="keep rate", title_fontsize="x-small")
    ax.add_artist(first)
    ax.legend(handles=styles, fontsize="x-small", loc="lower left", bbox_to_anchor=(1.01, 0.0), frameon=False)
    ax.set_xticks(layers)
    ax.set_xlabel("layer (block)")
    ax.set_ylabel("teacher's attention on kept keys\n(share of the row)")
    ax.set_ylim(0, 1.02)
    text = title or "How much of the dense teacher's attention the connectivity mask keeps"
    if own:
        fig.suptitle(text)
    else:
        ax.set_title(text, fontsize="medium")
    return fig


#: Styles of the masks in :func:`plot_mask_baselines`.
MASK_STYLES = {"trained": ("o-", "C0", "Sparsifiner, trained (phase 2)"),
               "learned": ("D--", "C1", "learned mask on teacher weights (phase 1)"),
               "top-B": ("^:", "C2", "teacher's own top-B keys (oracle)"),
               "random": ("s--", "C3", "B random keys")}


def plot_mask_baselines(ds: xr.Dataset, ax: Axes | None = None, *, title: str | None = None) -> Figure:
    """Held-out top-1 (%) against the keep rate for each mask, with intervals; teacher and Linformer as lines.

    Args:
        ds: ``accuracy(mask, keep_rate)`` with ``ci_low`` / ``ci_high``, scalars ``teacher_accuracy`` and
            ``linformer_accuracy`` (NaN: none), attr ``linformer_keep_rate``.
        ax: draw into this Axes.
        title: axes title.
    """
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    fig = ax.figure
    x = ds["keep_rate"].values
    for m in ds["mask"].values:
        style, color, label = MASK_STYLES.get(str(m), ("x-", "0.4", str(m)))
        c = ds.sel(mask=m)
        p = c["accuracy"].values
        err = np.stack([p - c["ci_low"].values, c["ci_high"].values - p])
        ax.errorbar(x, 100 * p, yerr=100 * err, fmt=style, color=color, capsize=3, ms=5, label=label)
    t = float(ds["teacher_accuracy"])
    ax.axhline(100 * t, color="0.3", ls=":", label=f"dense teacher ({100 * t:.1f} %)")
    low = max(0.0, 100 * float(np.nanmin(ds["ci_low"].values)) - 3)  # zoom on the masks: their differences are small
    lin = float(ds["linformer_accuracy"])
    if np.isfinite(lin):
        k = ds.attrs["linformer_keep_rate"]
        if 100 * lin >= low:
            ax.plot([k], [100 * lin], "P", color="C4", ms=9, label=f"Linformer, k = B ({100 * lin:.1f} %)")
        else:  # far below: an arrow at the axis floor, its value in the legend
            ax.annotate("", (k, low + 0.2), xytext=(k, low + 1.5), arrowprops=dict(arrowstyle="->", color="C4", lw=2))
            ax.plot([], [], "P", color="C4", ms=9, label=f"Linformer, k = B ({100 * lin:.1f} %, below the axis: arrow)")
    ax.set_xscale("log")
    ax.set_xticks(x, [f"{k:g}" for k in x])
    ax.minorticks_off()
    ax.set_xlabel("attention keep rate K (B = ⌈K·n⌉ keys per patch query)")
    ax.set_ylabel("held-out top-1 accuracy (%)")
    ax.set_ylim(low, min(100.5, max(100 * t, 100 * float(np.nanmax(ds["ci_high"].values))) + 3))
    ax.legend(fontsize="x-small", loc="best", framealpha=0.9)
    ax.set_title(title or "Which keys to keep", fontsize="small")
    return fig
