"""Teacher-vs-compressed figures from comparison Datasets (no torch): CKA, token-map agreement, attributions, faithfulness.

Every function takes one comparison Dataset (:func:`workbench.compare.compare`) or several —
``{title: Dataset}``, one per teacher, e.g. the demo ViT with its FAR / Sparsifiner / Non-deep
students and the demo Swin with its SlimSwin students — and draws each teacher's group in its own
row (or column) of panels. Models keep one colour across figures: the teacher black, students in
the order of the ``model`` coordinate, from the workbench palette.

- :func:`plot_cka` — linear CKA (debiased, token-averaged by default) of block outputs, teacher layer
  × student layer, one panel per student after the teacher's self-similarity; dots mark the student
  layer at the teacher layer's relative depth (:func:`matched_layer`), the cells :func:`matched_cka`
  averages.
- :func:`plot_map_agreement` — per-layer agreement of token maps with the teacher's attention.
- :func:`plot_attributions` — attribution maps, the images on top, teacher below, students under it.
- :func:`plot_faithfulness` — deletion and insertion curves, mean over the images, AUC in the legend.
- :func:`summary_frame` — one row per model with the headline numbers (``workbench compare`` prints it).
"""

from __future__ import annotations

import json
import textwrap
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import xarray as xr
from matplotlib.figure import Figure

from workbench.plots.theme import ATTENTION_CMAP, DIVERGING_CMAP, MISSING_COLOR, PANEL_INCHES

__all__ = ["ATTRIBUTION_LABELS", "groups", "model_colors", "matched_layer", "matched_cka", "summary_frame",
           "model_markers", "plot_cka", "plot_map_agreement", "plot_attributions", "plot_faithfulness"]

ATTRIBUTION_LABELS = {"integrated_gradients": "Integrated Gradients", "saliency": "Saliency",
                      "rollout": "attention rollout", "random": "random map"}
_MAP_METRICS = {"spearman": ("map_spearman_avg", "Spearman ρ (↑)"), "js": ("map_js_avg", "JS divergence, bits (↓)"),
                "topk": ("map_topk_avg", "top-10% key overlap (↑)")}


# ---------------------------------------------------------------------------------------- views
def groups(data: xr.Dataset | Mapping[str, xr.Dataset]) -> dict[str, xr.Dataset]:
    """``{title: Dataset}`` of the comparisons that have students (a single Dataset gets its teacher's name)."""
    if isinstance(data, xr.Dataset):
        data = {data.attrs.get("title") or f"teacher {data.attrs.get('model_name', '')}".strip(): data}
    return {k: ds for k, ds in data.items() if "model" in ds.dims and ds.sizes["model"] > 1}


def _teacher(ds: xr.Dataset) -> str:
    return str(ds.attrs.get("reference", ds["model"].values[0]))


def _students(ds: xr.Dataset) -> list[str]:
    return [str(m) for m in ds["model"].values if str(m) != _teacher(ds)]


#: Student colours in order: hues far apart (the colorblind palette's orange, vermillion and tan, next to each other
#: in it, read as one orange among six students; grey is left to chance lines)
STUDENT_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D62728", "#56B4E9", "#8C564B", "#BCBD22", "#17BECF")
#: Student markers in the same order, so that two lines are told apart without their colour too
STUDENT_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")


def model_colors(ds: xr.Dataset) -> dict[str, tuple]:
    """model label -> colour: the teacher black, the students from :data:`STUDENT_COLORS` in order."""
    pal = sns.color_palette(list(STUDENT_COLORS))
    return {_teacher(ds): (0.0, 0.0, 0.0), **{m: pal[i % len(pal)] for i, m in enumerate(_students(ds))}}


def model_markers(ds: xr.Dataset) -> dict[str, str]:
    """model label -> marker: the teacher a dot, the students from :data:`STUDENT_MARKERS` in order."""
    return {_teacher(ds): ".", **{m: STUDENT_MARKERS[i % len(STUDENT_MARKERS)] for i, m in enumerate(_students(ds))}}


def matched_layer(i: int, n_teacher: int, n_student: int) -> int:
    """The student layer at teacher layer ``i``'s relative depth: round(i · (S − 1) / (T − 1))."""
    if n_teacher <= 1:
        return n_student - 1
    return int(round(i * (n_student - 1) / (n_teacher - 1)))


def matched_cka(ds: xr.Dataset, *, estimator: str = "debiased", pooling: str = "mean") -> xr.DataArray:
    """CKA of each teacher layer with the student layer at the same relative depth: ``(model, teacher_layer)``.

    Students as deep as the teacher are compared block by block (the diagonal); a shallower student
    (Non-deep) layer by layer at the same relative depth (:func:`matched_layer`).
    """
    cka = ds["cka"].sel(estimator=estimator, pooling=pooling)
    n_t = ds.sizes["teacher_layer"]
    out = np.full((ds.sizes["model"], n_t), np.nan)
    for mi, m in enumerate(ds["model"].values):
        depth = int(ds["depth"].sel(model=m))
        if depth == 0:
            continue
        for i in range(n_t):
            out[mi, i] = float(cka.sel(model=m).isel(teacher_layer=i, student_layer=matched_layer(i, n_t, depth)))
    return xr.DataArray(out, dims=("model", "teacher_layer"), coords={"model": ds["model"].values,
                                                                      "teacher_layer": ds["teacher_layer"].values},
                        attrs={"units": "CKA", "long_name": f"linear CKA ({estimator}, {pooling} pooling), "
                                                             "layers matched by relative depth"})


def _mean(ds: xr.Dataset, var: str, **sel) -> xr.DataArray | None:
    if var not in ds:
        return None
    da = ds[var].sel(**{k: v for k, v in sel.items() if k in ds[var].dims})
    return da.mean([d for d in da.dims if d != "model"], skipna=True)


def summary_frame(ds: xr.Dataset) -> pd.DataFrame:
    """One row per model of a comparison: accuracy on its images, prediction agreement, CKA, map and attribution
    agreement with the teacher, IG faithfulness (means over images and layers; NaN where a part did not apply)."""
    rows = {str(m): {"model": str(m)} for m in ds["model"].values}

    def put(col: str, da: xr.DataArray | None, digits: int = 3) -> None:
        if da is not None:
            for m, v in zip(da["model"].values, da.values):
                rows[str(m)][col] = round(float(v), digits)

    put("accuracy", ds.get("accuracy"))
    put("top-1 agreement", ds.get("agreement"))
    put("KL (nats)", ds.get("kl_mean"), 4)
    if "cka" in ds:
        put("CKA (matched depth)", matched_cka(ds).mean("teacher_layer", skipna=True))
    put("map ρ", _mean(ds, "map_spearman_avg"))
    if "map_measure" in ds.coords:
        for m in ds["model"].values:
            kinds = sorted({str(k) for k in ds["map_measure"].sel(model=m).values if str(k)})
            rows[str(m)]["map measure"] = "/".join(kinds)
    put("IG ρ", _mean(ds, "attribution_spearman", attribution="integrated_gradients"))
    put("IG deletion AUC", _mean(ds, "deletion_auc", attribution="integrated_gradients"))
    put("IG insertion AUC", _mean(ds, "insertion_auc", attribution="integrated_gradients"))
    return pd.DataFrame(list(rows.values()))


# ---------------------------------------------------------------------------------------- helpers
def _empty(title: str, why: str) -> Figure:
    fig, ax = plt.subplots(figsize=(5, 1.2))
    ax.axis("off")
    ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True)
    fig.suptitle(title)
    return fig


def _colorbar(fig: Figure, mappable, axes, label: str) -> None:
    cb = fig.colorbar(mappable, ax=axes, shrink=0.9, pad=0.02, fraction=0.03)
    cb.set_label(label)


def _notes(ds: xr.Dataset, part: str) -> dict[str, str]:
    return json.loads(ds.attrs.get("notes", "{}")).get(part, {})


# -------------------------------------------------------------------------------------------- CKA
#: panels per row of :func:`plot_cka` (a teacher with more students wraps): readable ticks at print width
CKA_COLUMNS = 4

def plot_cka(data: xr.Dataset | Mapping[str, xr.Dataset], *, estimator: str = "debiased", pooling: str = "mean",
             title: str | None = None) -> Figure:
    """CKA heatmaps, one row per teacher: its self-similarity, then one panel per student (module docstring)."""
    gs = groups(data)
    if not gs:
        return _empty(title or "CKA", "no comparison with students")
    panels = {k: [_teacher(ds), *_students(ds)] for k, ds in gs.items()}
    ncols = min(CKA_COLUMNS, max(len(p) for p in panels.values()))
    rows = {k: -(-len(p) // ncols) for k, p in panels.items()}  # a group's panels wrap onto several rows
    fig, axes = plt.subplots(sum(rows.values()), ncols, squeeze=False, layout="constrained",
                             figsize=(ncols * 1.15 * PANEL_INCHES + 1.0, sum(rows.values()) * 1.3 * PANEL_INCHES))
    cmap = plt.get_cmap(ATTENTION_CMAP).with_extremes(bad=MISSING_COLOR)
    im, first = None, 0
    for gtitle, ds in gs.items():
        cka = ds["cka"].sel(estimator=estimator, pooling=pooling)
        n_t = ds.sizes["teacher_layer"]
        for c, m in enumerate(panels[gtitle]):
            ax = axes[first + c // ncols, c % ncols]
            depth = int(ds["depth"].sel(model=m))
            vals = cka.sel(model=m).values[:, :depth]
            im = ax.imshow(vals, origin="lower", cmap=cmap, vmin=0, vmax=1, aspect="auto",
                           extent=(-0.5, depth - 0.5, -0.5, n_t - 0.5))
            ax.plot([matched_layer(i, n_t, depth) for i in range(n_t)], range(n_t), "o", ms=3, color="white",
                    mec="black", mew=0.4)
            ax.set_xticks(range(0, depth, 1 if depth <= 8 else 2))
            ax.set_yticks(range(0, n_t, 1 if n_t <= 8 else 2))
            ax.tick_params(labelsize=8, length=2)
            ax.set_xlabel(f"{'teacher' if c == 0 else 'student'} layer", fontsize=8)
            mean = float(np.nanmean([vals[i, matched_layer(i, n_t, depth)] for i in range(n_t)]))
            label = textwrap.fill(str(m), 24) if c else "teacher (itself)"  # long labels on two lines
            ax.set_title(f"{label}\nmatched mean {mean:.2f}", fontsize=8)
            if c % ncols == 0:
                ax.set_ylabel(f"{textwrap.fill(gtitle, 22)}\nteacher layer", fontsize=8)
        for c in range(len(panels[gtitle]), rows[gtitle] * ncols):
            axes[first + c // ncols, c % ncols].axis("off")
        first += rows[gtitle]
    _colorbar(fig, im, axes, f"linear CKA ({estimator})")
    fig.suptitle(title or f"Representation similarity of block outputs (linear CKA, {estimator}, "
                          f"{'token-averaged' if pooling == 'mean' else pooling + ' pooling'})")
    return fig


# ---------------------------------------------------------------------------------- token maps
def plot_map_agreement(data: xr.Dataset | Mapping[str, xr.Dataset], *, metrics: Sequence[str] = ("spearman", "js"),
                       title: str | None = None) -> Figure:
    """Per-layer agreement of each student's token maps with the teacher's attention (head-averaged maps, mean ± sd
    over the images); columns: teachers with attention, rows: ``metrics``. The teacher's own gradient saliency against
    its attention (dashed, black) is the reference for students compared by saliency (attention-free, FAR)."""
    gs, without = {}, []
    for k, ds in groups(data).items():
        has = [m for m in _students(ds) if "map_spearman_avg" in ds
               and np.isfinite(ds["map_spearman_avg"].sel(model=m).values).any()]
        if has:
            gs[k] = ds
        else:
            why = "the teacher has no attention" if "map_spearman_avg" not in ds else "no student's token map lines up"
            without.append(f"{k}: {why} ({', '.join(_students(ds))})")
    if not gs:
        return _empty(title or "Token-map agreement", "no token maps to compare: " + "; ".join(without))
    fig, axes = plt.subplots(len(metrics), len(gs), figsize=(4.2 * len(gs) + 1.6, 2.4 * len(metrics)),
                             squeeze=False, layout="constrained")
    handles: dict[str, object] = {}
    for c, (gtitle, ds) in enumerate(gs.items()):
        colors, markers = model_colors(ds), model_markers(ds)
        names = [str(n) for n in ds["layer_name"].values]
        x = np.arange(len(names))
        missing = []
        for r, metric in enumerate(metrics):
            var, label = _MAP_METRICS[metric]
            ax = axes[r, c]
            for m in [*_students(ds), _teacher(ds)]:
                da = ds[var].sel(model=m)
                if not np.isfinite(da.values).any():
                    if r == 0 and m != _teacher(ds):
                        missing.append(m)
                    continue
                kinds = sorted({str(k) for k in ds["map_measure"].sel(model=m).values if str(k)})
                is_t = m == _teacher(ds)
                lab = ("teacher: its saliency vs its attention" if is_t else f"{m} ({'/'.join(kinds)})")
                mu, sd = da.mean("sample").values, da.std("sample").values
                ok = np.isfinite(mu)  # a student of another depth is scored only at the last block of each group
                if ok.all():  # measured at every block: a line with its ± sd band
                    (line,) = ax.plot(x, mu, "--" if is_t else "-", marker=markers[m], ms=3.5, color=colors[m],
                                      label=lab, lw=1.3)
                    ax.fill_between(x, mu - sd, mu + sd, color=colors[m], alpha=0.12, lw=0)
                else:  # only at some blocks: markers with ± sd bars, no line through the blocks never measured
                    line = ax.errorbar(x[ok], mu[ok], yerr=sd[ok], fmt=markers[m], ms=5, color=colors[m], label=lab,
                                       capsize=2, elinewidth=0.9, ls="none")
                handles.setdefault(f"{gtitle}|{lab}", line)
            ax.set_xticks(x, [n.replace("layers.", "L").replace(".blocks.", ".b").replace("blocks.", "")
                              for n in names], fontsize=7, rotation=0 if len(names) <= 8 else 45)
            ax.set_ylabel(label, fontsize=8)
            if metric == "spearman":
                ax.set_ylim(min(0.0, ax.get_ylim()[0]), 1.0)
            else:
                ax.set_ylim(bottom=0)
            if r == 0:
                ax.set_title(gtitle, fontsize=9)
            if r == len(metrics) - 1:
                ax.set_xlabel("teacher block", fontsize=8)
            ax.grid(alpha=0.3)
        col = [h for k, h in handles.items() if k.startswith(f"{gtitle}|")]
        leg = axes[-1, c].legend(col, [h.get_label() for h in col], fontsize=7, frameon=False, loc="upper center",
                                 bbox_to_anchor=(0.5, -0.3 if len(names) <= 8 else -0.45), ncol=2,  # below: covers no data
                                 title=("no token maps: " + ", ".join(missing) + " (no attention hook, no ViT blocks)")
                                 if missing else None, title_fontsize=7)
        if missing:
            leg.get_title().set_color("0.35")
    fig.suptitle(title or "Token-map agreement with the teacher's attention, per layer (head-averaged maps)")
    if without:
        fig.text(0.01, -0.01, "not shown: " + "; ".join(without), fontsize=7, color="0.35", va="top", wrap=True)
    return fig


# ------------------------------------------------------------------------------------ attributions
def _pick_samples(ds: xr.Dataset, n: int) -> list[int]:
    """Positions of ``n`` images: the first of each of ``n`` labels spread over the labels present (0, 3, 6, 9 of ten
    digits), or evenly spaced images where labels are unknown or too few."""
    labels = ds["label"].values if "label" in ds.coords else -np.ones(ds.sizes["sample"], int)
    known = sorted(set(int(v) for v in labels if v >= 0))
    if len(known) >= n:
        want = [known[int(round(k))] for k in np.linspace(0, len(known) - 1, n)]
        return [int(np.flatnonzero(labels == lab)[0]) for lab in want]
    return [int(round(k)) for k in np.linspace(0, ds.sizes["sample"] - 1, min(n, ds.sizes["sample"]))]


#: percentile of |map| each attribution map is scaled to (values beyond are clipped to the colour scale's ends)
PERCENTILE = 99.0


def plot_attributions(data: xr.Dataset | Mapping[str, xr.Dataset], *, attribution: str = "integrated_gradients",
                      n_images: int = 4, title: str | None = None) -> Figure:
    """Attribution maps of the class the teacher predicts: per teacher, the images on top, then the teacher's maps,
    then each student's, the same images in the same columns. Signed maps (IG) on a diverging scale, each map scaled
    to the :data:`PERCENTILE` th percentile of its own |values| and clipped (the maps' units differ between models; a
    few extreme pixels would wash out the rest at max-scaling); ρ = the map's rank correlation with the teacher's."""
    gs = {k: ds for k, ds in groups(data).items() if "attribution_map" in ds}
    if not gs:
        return _empty(title or "Attributions", "no attribution maps among the comparisons")
    n_cols = min(n_images, min(ds.sizes["sample"] for ds in gs.values()))
    heights: list[float] = []
    for ds in gs.values():
        heights += [0.32] + [1.0] * (1 + ds.sizes["model"])  # title row, images, models
    fig = plt.figure(figsize=(n_cols * 1.25 + 1.8, sum(heights) * 1.3))  # square panels of ~1.1 in (0.7 before)
    grid = fig.add_gridspec(len(heights), n_cols + 1, height_ratios=heights, width_ratios=[1.0] * n_cols + [0.07],
                            hspace=0.3, wspace=0.12, left=0.02, right=0.93, top=1 - 0.55 / fig.get_figheight(),
                            bottom=0.01)
    signed = attribution == "integrated_gradients"
    cmap = plt.get_cmap(DIVERGING_CMAP if signed else ATTENTION_CMAP)
    row = 0
    for gtitle, ds in gs.items():
        models = [_teacher(ds), *_students(ds)]
        head = fig.add_subplot(grid[row, :n_cols])
        head.axis("off")
        head.text(0.5, 0.0, gtitle, ha="center", va="bottom", fontsize=9, fontweight="bold", transform=head.transAxes)
        cols = _pick_samples(ds, n_cols)
        a = ds["attribution_map"].sel(attribution=attribution)
        target = ds["target"].values if "target" in ds.coords and ds["target"].ndim == 1 else None
        mappable = None
        for j, s in enumerate(cols):
            ax = fig.add_subplot(grid[row + 1, j])
            img = ds["image"].isel(sample=s).values
            ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=1)
            lab = int(ds["label"].values[s]) if "label" in ds.coords else -1
            ax.set_title((f"label {lab}" if lab >= 0 else f"#{int(ds['sample'].values[s])}")
                         + (f" · teacher: {int(target[s])}" if target is not None else ""), fontsize=8, pad=2)
            _bare(ax, "image" if j == 0 else None)
            for i, m in enumerate(models):
                ax = fig.add_subplot(grid[row + 2 + i, j])
                v = a.sel(model=m).isel(sample=s).values
                if not np.isfinite(v).any():
                    ax.set_facecolor(MISSING_COLOR)
                    ax.text(0.5, 0.5, "n/a", ha="center", va="center", fontsize=7, transform=ax.transAxes)
                else:
                    # the 99th percentile of |map|, not its maximum: one extreme pixel would wash out the rest
                    scale = float(np.nanpercentile(np.abs(v), PERCENTILE)) or float(np.nanmax(np.abs(v))) or 1.0
                    mappable = ax.imshow(np.clip(v / scale, -1, 1), cmap=cmap, vmin=-1 if signed else 0, vmax=1)
                    if img.ndim == 2:
                        ax.contour(img, levels=[0.5], colors="black", linewidths=0.4, alpha=0.6)
                    if i and "attribution_spearman" in ds:  # inside its own panel, not between two rows
                        rho = float(ds["attribution_spearman"].sel(model=m, attribution=attribution).isel(sample=s))
                        ax.text(0.03, 0.97, f"ρ = {rho:.2f}", transform=ax.transAxes, ha="left", va="top", fontsize=7,
                                bbox=dict(facecolor="white", edgecolor="none", alpha=0.75, pad=1.0))
                _bare(ax, m if j == 0 else None)
        if mappable is not None:
            cb = fig.colorbar(mappable, cax=fig.add_subplot(grid[row + 2: row + 2 + len(models), n_cols]))
            cb.set_label(f"map / {PERCENTILE:g}th percentile of |map|\n(clipped to ±1)", fontsize=7)
            cb.ax.tick_params(labelsize=7)
        row += 2 + len(models)
    fig.suptitle(title or f"{ATTRIBUTION_LABELS[attribution]} of the class the teacher predicts", fontsize=10,
                 y=1 - 0.12 / fig.get_figheight(), va="top")
    return fig


def _bare(ax, ylabel: str | None) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=8, rotation=0, ha="right", va="center")


# ------------------------------------------------------------------------------------ faithfulness
def plot_faithfulness(data: xr.Dataset | Mapping[str, xr.Dataset], *, attribution: str = "integrated_gradients",
                      title: str | None = None) -> Figure:
    """Deletion (top, log probability: the curves fall within the first steps) and insertion (bottom) curves of each
    model's own maps — each model's own probability of the class the teacher predicts — mean over the images; the
    teacher's random-map curve (grey, dotted) is chance. A faithful map makes the deletion curve fall early (low AUC)
    and the insertion curve rise early (high AUC)."""
    gs = {k: ds for k, ds in groups(data).items() if "deletion" in ds}
    if not gs:
        return _empty(title or "Faithfulness", "no deletion / insertion curves among the comparisons")
    fig, axes = plt.subplots(2, len(gs), figsize=(4.2 * len(gs) + 0.6, 8.4), squeeze=False, layout="constrained")
    for c, (gtitle, ds) in enumerate(gs.items()):
        colors, markers = model_colors(ds), model_markers(ds)
        frac = ds["fraction"].values
        for r, kind in enumerate(("deletion", "insertion")):
            ax = axes[r, c]
            for m in [_teacher(ds), *_students(ds)]:
                cur = ds[kind].sel(model=m, attribution=attribution)
                if not np.isfinite(cur.values).any():
                    continue
                aucv = float(ds[f"{kind}_auc"].sel(model=m, attribution=attribution).mean())
                ax.plot(frac, cur.mean("sample"), color=colors[m], lw=2.0 if m == _teacher(ds) else 1.3,
                        marker=markers[m], ms=3, markevery=max(1, len(frac) // 8), label=f"{m}: {aucv:.3f}")
            if "random" in ds["attribution"].values:
                rnd = ds[kind].sel(model=_teacher(ds), attribution="random")
                if np.isfinite(rnd.values).any():
                    ax.plot(frac, rnd.mean("sample"), ":", color="0.5",
                            label=f"teacher, random map: {float(ds[f'{kind}_auc'].sel(model=_teacher(ds), attribution='random').mean()):.3f}")
            if kind == "deletion":  # the curves fall within the first steps and stay near 0: a log axis shows them
                low = [float(np.nanmin(line.get_ydata())) for line in ax.get_lines()]
                low = [v for v in low if v > 0]
                ax.set_yscale("log")
                ax.set_ylim(max(1e-5, 0.5 * min(low)) if low else 1e-3, 1.3)
            else:
                ax.set_ylim(0, 1.02)
            ax.set_xlim(0, 1)
            ax.set_xlabel(f"fraction of pixels {'deleted (most attributed first)' if kind == 'deletion' else 'inserted'}",
                          fontsize=8)
            ax.set_ylabel("each model's own probability of\nthe class the teacher predicts" +
                          (" (log)" if kind == "deletion" else ""), fontsize=8)
            ax.set_title(f"{gtitle}: {kind}", fontsize=9)
            ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False,
                      title=f"{kind} AUC", title_fontsize=6)  # below the panel: covers no curve
            ax.grid(alpha=0.3)
    fig.suptitle(title or f"Faithfulness of {ATTRIBUTION_LABELS[attribution]} maps: deletion and insertion curves")
    return fig
