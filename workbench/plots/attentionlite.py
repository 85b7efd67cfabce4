"""AttentionLite plots (Kundu & Sundaresan, papers/003): Datasets in, matplotlib Figures out (no torch, no models).

- :func:`plot_accuracy_curves` — held-out accuracy per epoch, KD vs KD+AT (Figs. 2 and 3);
- :func:`plot_layer_density` — kept fraction of every pruned layer per epoch (sparse momentum's redistribution);
- :func:`plot_at_maps` — teacher and students' attention-transfer maps per stage, and their distance to the teacher's;
- :func:`plot_local_attention` — a student's local attention for one query pixel, per layer and head.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import xarray as xr

from workbench.plots.theme import ATTENTION_CMAP, MISSING_COLOR, PALETTE

__all__ = ["DISTILL_COLORS", "plot_accuracy_curves", "plot_layer_density", "plot_at_maps", "plot_local_attention",
           "plot_student_baselines"]

#: Loss -> colour index in the categorical palette (the same in every AttentionLite figure).
DISTILL_COLORS = {"KD": 0, "KD+AT": 1}
_SEED_STYLES = ("-", "--", ":", "-.")


def _color(label: str):
    import seaborn as sns

    return sns.color_palette(PALETTE)[DISTILL_COLORS.get(label, 2)]


def plot_accuracy_curves(ds: xr.Dataset, *, ax=None, title: str | None = None):
    """Held-out top-1 accuracy per epoch of every run in ``ds``, coloured by loss (KD / KD+AT), one line style per seed.

    Args:
        ds: ``val_acc(run, epoch)`` (fraction) with coords ``distill(run)`` and ``seed(run)``; attrs
            ``teacher_val_acc`` (a dotted line) and ``density`` / ``pruning`` (for the default title).
        ax: an Axes to draw into (None: a new figure).
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, ax = (plt.subplots(figsize=(4.6, 3.2)) if ax is None else (ax.figure, ax))
    seeds = sorted({int(s) for s in ds.seed.values})
    epochs = ds.epoch.values + 1
    for r in ds.run.values:
        one = ds.sel(run=r)
        label, seed = str(one.distill.values), int(one.seed.values)
        ax.plot(epochs, 100 * one.val_acc.values, _SEED_STYLES[seeds.index(seed) % len(_SEED_STYLES)], marker="o", ms=4,
                color=_color(label), lw=1.6)
    teacher = ds.attrs.get("teacher_val_acc")
    if teacher is not None and np.isfinite(teacher):
        ax.axhline(100 * teacher, color="0.3", ls=":", lw=1.2)
    handles = [Line2D([], [], color=_color(k), marker="o", ms=4, label=k) for k in DISTILL_COLORS if k in set(ds.distill.values)]
    if len(seeds) > 1:
        handles += [Line2D([], [], color="0.4", ls=_SEED_STYLES[i % len(_SEED_STYLES)], label=f"seed {s}") for i, s in enumerate(seeds)]
    if teacher is not None and np.isfinite(teacher):
        handles.append(Line2D([], [], color="0.3", ls=":", label=f"teacher ({100 * teacher:.1f} %)"))
    ax.legend(handles=handles, loc="lower right", fontsize="small", frameon=True)
    ax.set_xticks(epochs)
    ax.set(xlabel="epoch", ylabel="held-out top-1 accuracy (%)", ylim=(0, 100),
           title=title or f"{ds.attrs.get('pruning', '')} pruning, d = {ds.attrs.get('density', '')}")
    ax.grid(alpha=0.3)
    return fig


def plot_layer_density(ds: xr.Dataset, *, title: str | None = None):
    """Kept fraction of every pruned layer (rows) per epoch (columns), one panel per run, with each layer's size.

    Args:
        ds: ``layer_density(run, epoch, layer)`` with coords ``layer_name(layer)``, ``layer_size(layer)`` (weights),
            ``label(run)`` (panel titles) and ``target(run)`` (the target density d).
    """
    import matplotlib.pyplot as plt

    runs = list(ds.run.values)
    n_layers = ds.sizes["layer"]
    fig, axes = plt.subplots(1, len(runs) + 1, figsize=(2.0 + 1.9 * len(runs) + 1.6, 0.26 * n_layers + 1.6),
                             gridspec_kw={"width_ratios": [1.0] * len(runs) + [0.9]}, squeeze=False)
    axes = axes[0]
    names = [str(n) for n in ds.layer_name.values]
    im = None
    for ax, r in zip(axes, runs):
        one = ds.sel(run=r)
        vals = one.layer_density.values.T  # (layer, epoch)
        im = ax.imshow(vals, cmap=ATTENTION_CMAP, vmin=0, vmax=1, aspect="auto")
        for (i, j), v in np.ndenumerate(vals):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="white" if v < 0.6 else "black")
        ax.set_xticks(range(vals.shape[1]), [str(e + 1) for e in ds.epoch.values])
        ax.set_yticks(range(n_layers), names if ax is axes[0] else [])
        ax.tick_params(axis="y", labelsize=7)
        ax.set(xlabel="epoch", title=f"{one.label.values}\n(target d = {float(one.target.values):g})")
    size_ax = axes[-1]
    size_ax.barh(range(n_layers), ds.layer_size.values, color="0.55")
    size_ax.set_xscale("log")
    size_ax.set_ylim(n_layers - 0.5, -0.5)
    size_ax.set_yticks(range(n_layers), [])
    size_ax.set(xlabel="weights in the layer", title="layer size")
    fig.colorbar(im, ax=list(axes), location="right", label="kept fraction of the layer's weights", fraction=0.03, pad=0.02)
    fig.suptitle(title or "Per-layer density under sparse momentum")
    return fig


def _contour(ax, image: np.ndarray | None) -> None:
    if image is not None:
        ax.contour(image, levels=[0.5 * float(np.nanmax(image))], colors="white", linewidths=0.6, alpha=0.8)


def plot_at_maps(maps: xr.Dataset, distance: xr.Dataset | None = None, *, sample: int | None = None,
                 title: str | None = None):
    """Attention-transfer maps of the teacher and the students (rows) per stage (columns) for one image, and the
    per-stage distance of each student's maps to the teacher's.

    Args:
        maps: ``at_map(model, sample, stage, y, x)`` (the first ``model`` is the teacher), ``image(sample, img_y, img_x)``
            optional; coords ``height`` / ``width`` (cells) per stage.
        distance: ``distance(run, stage)`` (mean ‖ψ_S − ψ_T‖₂ over images, one student run each) with coords
            ``distill``, ``pruning``, ``seed`` per run; drawn in a right-hand panel.
        sample: which image (default: the first).
    """
    import matplotlib.pyplot as plt

    s = int(maps.sample.values[0]) if sample is None else sample
    models, stages = list(maps.model.values), list(maps.stage.values)
    extra = 1 if distance is not None else 0
    fig = plt.figure(figsize=(1.55 * len(stages) + 3.4 * extra + 0.6, 1.55 * len(models) + 1.3))
    grid = fig.add_gridspec(len(models) + 1, len(stages) + extra, height_ratios=[1] * len(models) + [0.07],
                            width_ratios=[1] * len(stages) + ([2.1] if extra else []), wspace=0.12, hspace=0.14)
    image = maps["image"].sel(sample=s).values if "image" in maps else None
    for j, st in enumerate(stages):
        col = maps.at_map.sel(stage=st, sample=s)
        vmax = float(col.max())
        for i, m in enumerate(models):
            ax = fig.add_subplot(grid[i, j])
            im = ax.imshow(col.sel(model=m).values, cmap=ATTENTION_CMAP, vmin=0, vmax=vmax)
            _contour(ax, image)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                h, w = int(maps.height.sel(stage=st)), int(maps.width.sel(stage=st))
                ax.set_title(f"stage {int(st)} ({h}×{w} cells)", fontsize=8)
            if j == 0:
                ax.set_ylabel(str(m), fontsize=8)
        cb = fig.colorbar(im, cax=fig.add_subplot(grid[len(models), j]), orientation="horizontal")
        cb.ax.tick_params(labelsize=6)
        cb.set_ticks([0, vmax], labels=["0", f"{vmax:.2f}"])
        for label, ha in zip(cb.ax.get_xticklabels(), ("left", "right")):
            label.set_horizontalalignment(ha)
        if j == 0:
            cb.set_label("ψ of a cell (unit L2 norm per stage)", fontsize=7)
    if distance is not None:
        ax = fig.add_subplot(grid[:len(models), len(stages)])
        markers = {"irregular": "o", "column": "s"}
        for k, stu in enumerate(distance.run.values):
            one = distance.sel(run=stu)
            label = str(one.distill.values)
            ax.plot(distance.stage.values + 0.06 * (k - distance.sizes["run"] / 2), one.distance.values,
                    marker=markers.get(str(one.pruning.values), "^"), ls="-", lw=0.8, ms=4, color=_color(label), alpha=0.9)
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=_color(k), label=k) for k in DISTILL_COLORS if k in set(distance.distill.values)]
        handles += [Line2D([], [], color="0.4", marker=mk, ls="", label=pr) for pr, mk in markers.items()
                    if pr in set(distance.pruning.values)]
        ax.legend(handles=handles, fontsize="x-small", loc="upper left")
        ax.set_xticks(distance.stage.values)
        ax.set(xlabel="stage", ylabel="‖ψ_student − ψ_teacher‖₂ (mean over images)", ylim=(0, None),
               title="distance to the teacher's maps")
        ax.yaxis.set_label_position("right")
        ax.yaxis.tick_right()
        ax.grid(alpha=0.3)
    fig.suptitle(title or f"Attention-transfer maps, sample {s}", y=0.995)
    return fig


def plot_local_attention(ds: xr.Dataset, *, sample: int | None = None, layers: Sequence[int] | None = None,
                         title: str | None = None):
    """Where one query pixel looks in every local-attention layer (rows) and head (columns), over the input image.

    Args:
        ds: ``attention(sample, layer, head, y, x)`` (the ``local_attention`` extractor) with ``image(sample, img_y,
            img_x)``; coords ``layer_name``, ``kernel_size``, ``stride``, ``height`` per layer; attrs ``query_y`` /
            ``query_x``.
    """
    import matplotlib
    import matplotlib.patches as patches
    import matplotlib.pyplot as plt

    s = int(ds.sample.values[0]) if sample is None else sample
    layers = list(ds.layer.values) if layers is None else list(layers)
    heads = list(ds["head"].values)
    fig, axes = plt.subplots(len(layers), len(heads), figsize=(1.7 * len(heads) + 1.6, 1.7 * len(layers) + 0.6),
                             squeeze=False)
    image = ds["image"].sel(sample=s).values if "image" in ds else None
    qy, qx = int(ds.attrs["query_y"]), int(ds.attrs["query_x"])
    H, W = ds.sizes["y"], ds.sizes["x"]
    vmax = float(np.nanmax(ds.attention.sel(sample=s, layer=layers).values))
    cmap = matplotlib.colormaps[ATTENTION_CMAP].with_extremes(bad=(0, 0, 0, 0))  # outside the window: the image shows
    im = None
    for i, lay in enumerate(layers):
        one = ds.sel(layer=lay)
        st, k = int(one.stride), int(one.kernel_size)
        qi, qj, r = int(one.query_i), int(one.query_j), k // 2
        y0, x0 = (qi - r) * st, (qj - r) * st  # window's top-left pixel
        pad = k * st  # show one window width around the window
        ylim = (max(-0.5, y0 - pad - 0.5), min(H - 0.5, y0 + k * st + pad - 0.5))
        xlim = (max(-0.5, x0 - pad - 0.5), min(W - 0.5, x0 + k * st + pad - 0.5))
        for j, h in enumerate(heads):
            ax = axes[i, j]
            att = one.attention.sel(sample=s, head=h).values
            if image is not None:
                ax.imshow(image, cmap="gray", vmin=0, vmax=1)
            if np.isnan(att).all():
                ax.text(0.5, 0.5, "no such head", transform=ax.transAxes, ha="center", va="center", fontsize=7,
                        color=MISSING_COLOR)
            else:
                im = ax.imshow(np.ma.masked_where(~(att > 0), att), cmap=cmap, vmin=0, vmax=vmax, alpha=0.9)
                ax.add_patch(patches.Rectangle((x0 - 0.5, y0 - 0.5), k * st, k * st, fill=False, ec="white", lw=0.8, ls="--"))
                ax.plot(qx, qy, marker="+", color="red", ms=8, mew=1.5)
            ax.set_xlim(*xlim)
            ax.set_ylim(ylim[1], ylim[0])
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(f"head {int(h)}", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{one.layer_name.values}\n{int(one.height)}×{int(one.width)} cells, k = {k}\n"
                              f"({int(ylim[1] - ylim[0])} px shown)", fontsize=7)
    fig.colorbar(im, ax=axes, label="attention weight of the key cell", fraction=0.05, pad=0.03)
    fig.suptitle(title or f"Local attention of the query pixel (y, x) = ({qy}, {qx}), sample {s}")
    return fig


def plot_student_baselines(ds: xr.Dataset, *, densities: dict[str, float] | None = None, ax=None,
                           title: str | None = None):
    """Grouped bars of held-out top-1 (%) per pruning group and loss, with intervals, the teacher dotted.

    Args:
        ds: ``accuracy(model)``, ``ci_low(model)``, ``ci_high(model)`` with ``model`` labels ``<group>/<loss>``
            (groups e.g. ``irregular``, ``column``, ``dense``; losses ``none``, ``KD``, ``KD+AT``) and ``teacher``.
        densities: group -> density, for the group labels.
        ax: an Axes to draw into (None: a new figure).
        title: axes title.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7.2, 4.2), layout="constrained")
    labels = [str(m) for m in ds["model"].values if str(m) != "teacher"]
    groups = list(dict.fromkeys(m.split("/")[0] for m in labels))
    losses = ["none", "KD", "KD+AT"]
    width = 0.26
    present = {g: [loss for loss in losses if f"{g}/{loss}" in labels] for g in groups}
    for loss in losses:
        xs, ps, lo, hi = [], [], [], []
        for i, g in enumerate(groups):
            m = f"{g}/{loss}"
            if m not in labels:
                continue
            c = ds.sel(model=m)
            k, n = present[g].index(loss), len(present[g])
            xs.append(i + (k - (n - 1) / 2) * width)  # the group's bars centred on its tick
            ps.append(100 * float(c["accuracy"]))
            lo.append(100 * float(c["accuracy"] - c["ci_low"]))
            hi.append(100 * float(c["ci_high"] - c["accuracy"]))
        if xs:
            color = "0.6" if loss == "none" else _color(loss)
            ax.bar(xs, ps, width, yerr=[lo, hi], capsize=3, color=color, edgecolor="0.2",
                   label="no distillation (labels only)" if loss == "none" else loss)
            for x, p, h in zip(xs, ps, hi):
                ax.text(x, p + h + 0.5, f"{p:.1f}", ha="center", va="bottom", fontsize="x-small")
    if "teacher" in ds["model"].values:
        t = 100 * float(ds["accuracy"].sel(model="teacher"))
        ax.axhline(t, color="0.3", ls=":", label=f"CNN teacher ({t:.1f} %)")
    dens = densities or {}
    names = [f"{g} d = {dens[g]:g}" if g in dens else ("dense student d = 1" if g == "dense" else g) for g in groups]
    ax.set_xticks(range(len(groups)), names)
    ax.set_ylabel("held-out top-1 accuracy (%)")
    floor = 100 * float(np.nanmin(ds["ci_low"].values))
    ax.set_ylim(max(0.0, 10 * np.floor(floor / 10) - 10), 101)  # zoomed: the bars start at the axis floor
    ax.legend(fontsize="x-small", loc="upper center", ncols=4, framealpha=0.9, bbox_to_anchor=(0.5, -0.1))
    ax.set_title(title or "Students with and without distillation", fontsize="small")
    return ax.figure
