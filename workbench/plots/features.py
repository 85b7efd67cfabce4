"""The feature-level diff of teachers and students (``compare.features``), from the study Datasets (no torch).

:func:`plot_feature_diff` takes one Dataset per teacher (dim ``student``; :mod:`workbench.features.report`) and draws

- on top, per student, the histogram of the live latents' relative decoder norms with the class bands shaded;
- below, one row per student: the latents shown (teacher-only by their teacher effect, else the lowest relative
  norms, the class named in each title), each as its top-activating held-out patches (image id above each crop,
  the token's cell outlined) and its effects in the teacher (T) and the student (S).
"""

from __future__ import annotations

import json
import textwrap
from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from workbench.plots.theme import MISSING_COLOR

__all__ = ["CLASS_COLORS", "plot_feature_diff"]

#: latent class -> colour of its band in the histogram
CLASS_COLORS = {"teacher_only": "#d62728", "shared": "#7f7f7f", "student_only": "#1f77b4", "partial": "#bcbd22"}
_HIST_COLUMNS = 5


def _students(datasets: Sequence[xr.Dataset]) -> list[tuple[xr.Dataset, str]]:
    return [(ds, str(s)) for ds in datasets for s in ds["student"].values]


def _histogram(ax, d: xr.Dataset, label: str, th: dict) -> None:
    ex, sh = th.get("exclusive", 0.1), th.get("shared", 0.1)
    for lo, hi, c in ((0, ex, "teacher_only"), (0.5 - sh, 0.5 + sh, "shared"), (1 - ex, 1, "student_only")):
        ax.axvspan(lo, hi, color=CLASS_COLORS[c], alpha=0.15, lw=0)
    r = d["relative_norm"].values[~d["dead"].values.astype(bool)]
    ax.hist(r, bins=np.linspace(0, 1, 41), color="#333333")
    ax.set_xlim(0, 1)
    ax.set_title(f"{textwrap.fill(label, 26)}\nT-only {int(d['n_teacher_only'])} · S-only {int(d['n_student_only'])}"
                 f" · shared {int(d['n_shared'])}", fontsize=8)
    ax.set_xlabel("relative decoder norm r", fontsize=8)
    ax.set_ylabel("live latents", fontsize=8)
    ax.tick_params(labelsize=7, length=2)


def _crop(ax, d: xr.Dataset, i: int, r: int, context: int) -> None:
    img = d["crop"].values[i, r]
    cmap = plt.get_cmap("gray").with_extremes(bad=MISSING_COLOR)
    ax.imshow(img, cmap=cmap if img.ndim == 2 else None, vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    sample, kind = int(d["crop_sample"].values[i, r]), str(d["crop_kind"].values[i, r])
    if sample < 0:
        ax.axis("off")
        return
    if kind == "patch":
        ch, cw = img.shape[0] / (2 * context + 1), img.shape[1] / (2 * context + 1)
        ax.add_patch(Rectangle((context * cw - 0.5, context * ch - 0.5), cw, ch, fill=False, ec="#ff7f0e", lw=1.2))
    ax.set_title(f"img {sample}{' cls' if kind == 'cls' else ''}\n{float(d['crop_activation'].values[i, r]):.2f}",
                 fontsize=6, pad=2)


def _latent_row(fig, gs_row, d: xr.Dataset, label: str, context: int) -> None:
    n_show, n_crops = d.sizes["shown"], d.sizes["rank"]
    sub = gs_row.subgridspec(1, 1 + n_show * n_crops, width_ratios=[1.6] + [1] * (n_show * n_crops), wspace=0.08)
    ax = fig.add_subplot(sub[0, 0])
    ax.axis("off")
    ax.text(0, 0.5, f"{textwrap.fill(label, 18)}\nlost test: {str(d['lost_status'].values)}", fontsize=7,
            va="center", ha="left", transform=ax.transAxes)
    classes = d["latent_class_name"].values
    for i in range(n_show):
        j = int(d["shown_latent"].values[i])
        eff = d["shown_effect"].values[:, i]
        for r in range(n_crops):
            ax = fig.add_subplot(sub[0, 1 + i * n_crops + r])
            _crop(ax, d, i, r, context)
            if r == 0:
                ax.text(0, 1.55, f"#{j} {classes[j].replace('_', '-')} r={float(d['relative_norm'].values[j]):.2f}  "
                        f"Δlog p: T {eff[0]:+.3f} S {eff[1]:+.3f} nats", transform=ax.transAxes, fontsize=6.5,
                        color=CLASS_COLORS.get(str(classes[j]), "black"), ha="left", va="bottom")


def plot_feature_diff(datasets: Sequence[xr.Dataset], title: str = "Feature-level diff: what each student lost, "
                      "kept and invented") -> Figure:
    """The ``compare.features`` figure (module docstring) from one study Dataset per teacher."""
    studs = _students(datasets)
    if not studs:
        fig, ax = plt.subplots(figsize=(5, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, "no students to diff", ha="center", va="center")
        fig.suptitle(title)
        return fig
    n_hist = -(-len(studs) // _HIST_COLUMNS)
    fig = plt.figure(figsize=(15, 2.2 * n_hist + 1.25 * len(studs) + 0.8))
    outer = fig.add_gridspec(2, 1, height_ratios=[2.2 * n_hist, 1.25 * len(studs)], hspace=0.12, top=0.93,
                             bottom=0.02, left=0.05, right=0.98)
    top = outer[0].subgridspec(n_hist, _HIST_COLUMNS, hspace=0.95, wspace=0.35)
    rows = outer[1].subgridspec(len(studs), 1, hspace=0.9)
    for k, (ds, label) in enumerate(studs):
        d = ds.sel(student=label)
        th = json.loads(ds.attrs.get("thresholds", "{}"))
        _histogram(fig.add_subplot(top[k // _HIST_COLUMNS, k % _HIST_COLUMNS]), d, label, th)
        context = int(json.loads(ds.attrs.get("study", "{}")).get("context", 1))
        _latent_row(fig, rows[k], d, label, context)
    fig.legend(handles=[Patch(color=CLASS_COLORS[c], alpha=0.3, label=c.replace("_", "-") + " band")
                        for c in ("teacher_only", "shared", "student_only")],
               loc="upper right", ncols=3, fontsize=8, frameon=False, bbox_to_anchor=(0.98, 0.975))
    fig.suptitle(title, fontsize=11, x=0.05, ha="left", y=0.985)
    return fig
