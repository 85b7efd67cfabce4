"""The explorer's current view as a matplotlib figure, and its export (PNG + data + code that redraws it).

Saved widget state does not survive a JupyterLab reload, so a view worth keeping is drawn here: the image with the
query marked, one panel per model (the query's map for the chosen layer and head over the image, outlines of kept
keys / windows, pruned heads greyed, a colour bar with units each), the agreement strip (student vs reference per
layer) and the layer x head thumbnails of one model. :func:`draw` takes the dict of
:meth:`~workbench.explore.state.ExploreState.view` (numpy only, no torch); :func:`export` writes it with its
arrays (``.npz``) and a ``.py`` file whose lines redraw it.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

__all__ = ["draw", "export", "load_view", "save_view"]

CMAP = "viridis"


def _show_image(ax, image: np.ndarray) -> None:
    ax.imshow(image, cmap="gray" if image.ndim == 2 else None, vmin=0, vmax=1, interpolation="nearest")


def _extent(image: np.ndarray) -> tuple[float, float, float, float]:
    h, w = image.shape[:2]
    return (-0.5, w - 0.5, h - 0.5, -0.5)


def _outline(ax, mask: np.ndarray, extent, colour: str = "white") -> None:
    """Outline each True cell of ``mask`` (gh, gw) placed over ``extent``."""
    gh, gw = mask.shape
    x0, x1, y1, y0 = extent
    ch, cw = (y1 - y0) / gh, (x1 - x0) / gw
    for y, x in zip(*np.nonzero(mask)):
        ax.add_patch(Rectangle((x0 + x * cw, y0 + y * ch), cw, ch, fill=False, ec=colour, lw=0.8))


def _mark(ax, cell, grid, extent, colour: str = "red", size=(1, 1)) -> None:
    """Outline the query's token: ``size`` cells of the grid from ``cell`` (a coarser Swin stage's token covers several)."""
    if cell[0] < 0:
        return
    gh, gw = grid
    x0, x1, y1, y0 = extent
    ch, cw = (y1 - y0) / gh, (x1 - x0) / gw
    sy, sx = size
    ax.add_patch(Rectangle((x0 + cell[1] * cw, y0 + cell[0] * ch), sx * cw, sy * ch, fill=False, ec=colour, lw=2))


def draw(view: dict, *, figsize_per_panel: float = 2.6):
    """Draw an explorer view (:meth:`ExploreState.view`); returns the figure."""
    n = len(view["panels"])
    strip = np.asarray(view["strip"])  # (L, H, gh, gw)
    n_l = strip.shape[0]
    fig = plt.figure(figsize=(figsize_per_panel * (n + 1), figsize_per_panel * 2.4 + 0.35 * n_l), layout="constrained")
    top, middle, bottom = fig.subfigures(3, 1, height_ratios=[1.25, 0.8, 0.25 * n_l + 0.3])
    _draw_panels(fig, top, view)
    _draw_agreement(middle, view)
    _draw_thumbnails(fig, bottom, view, strip)
    return fig


def _draw_panels(fig, top, view: dict) -> None:
    """The image with the query marked, then each model's map over it, one colour bar each."""
    panels = view["panels"]
    n = len(panels)
    axes = top.subplots(1, n + 1)
    image = np.asarray(view["image"])
    extent = _extent(image)
    _show_image(axes[0], image)
    ref_grid = panels[0]["map"].shape
    _mark(axes[0], panels[0]["cell"], ref_grid, extent, size=panels[0].get("cell_size", (1, 1)))
    axes[0].set_title(f"{view['image_id']}\nquery: {view['query_label']}", fontsize=8)
    head = "mean over heads" if view["head"] is None else f"head {view['head']}"
    for ax, p in zip(axes[1:], panels):
        _show_image(ax, image)
        m = np.ma.masked_invalid(p["map"])
        cmap = "RdBu_r" if p.get("diverging") else CMAP  # a signed difference: blue below 0, red above
        im = ax.imshow(m, cmap=cmap, vmin=p["vmin"], vmax=p["vmax"], alpha=0.75, extent=extent, interpolation="nearest")
        if p["outline"] is not None:
            _outline(ax, np.asarray(p["outline"]), extent)
        _mark(ax, p["cell"], p["map"].shape, extent, size=p.get("cell_size", (1, 1)))
        pre = ", ".join(f"{k}={v:.3g}" for k, v in zip(p["prefix_kinds"], np.atleast_1d(p["prefix"])) if np.isfinite(v))
        if p.get("self_value") is not None:
            pre += (", " if pre else "") + f"query's own {p['self_value']:.3g}: off scale"
        ax.set_title(f"{p['label']} ({p['measure']})\nlayer {p['layer']}, {head}" + (f"\n{p['note']}" if p["note"] else ""),
                     fontsize=8, color="0.5" if p["pruned"] else "black")
        if p["pruned"]:
            ax.imshow(np.full(image.shape[:2], 0.5), cmap="gray", vmin=0, vmax=1, alpha=0.6, extent=extent)
        cb = fig.colorbar(im, ax=ax, orientation="horizontal", fraction=0.06, pad=0.04)
        cb.set_label(p["units"] + (f"   ({pre})" if pre else ""), fontsize=7)
        cb.ax.tick_params(labelsize=6)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0].set_xlabel("x (pixels)", fontsize=7)
    axes[0].set_ylabel("y (pixels)", fontsize=7)


def _draw_agreement(middle, view: dict) -> None:
    """Jensen–Shannon and top-10 % overlap of each student's row with the reference's, per reference layer."""
    panels = view["panels"]
    ax_js, ax_top = middle.subplots(1, 2)
    layers = np.arange(len(view["ref_layers"]))
    for label, d in view["agreement"].items():
        ax_js.plot(layers, d["js"], marker="o", label=label)
        ax_top.plot(layers, d["topk"], marker="o", label=label)
    if not view["agreement"]:
        ax_js.text(0.5, 0.5, "one model: no agreement to show", ha="center", transform=ax_js.transAxes, fontsize=8)
    elif all(np.isnan(np.asarray(d["js"], float)).all() for d in view["agreement"].values()):
        ax_js.text(0.5, 0.5, "no agreement: the students' keys are not the reference's tokens",
                   ha="center", transform=ax_js.transAxes, fontsize=8)
    ax_js.set(xlabel="reference layer", ylabel="Jensen–Shannon (bits)", ylim=(0, 1),
              title=f"agreement with {panels[0]['label']} for this query\n(head-averaged rows)")
    ax_top.set(xlabel="reference layer", ylabel="top-10% key overlap (share)", ylim=(0, 1.05))
    for ax in (ax_js, ax_top):
        ax.set_xticks(layers, view["ref_layers"], fontsize=7)
        ax.title.set_fontsize(8)
        ax.xaxis.label.set_fontsize(7)
        ax.yaxis.label.set_fontsize(7)
        ax.tick_params(labelsize=6)
    if view["agreement"]:
        ax_top.legend(fontsize=6)


def _draw_thumbnails(fig, bottom, view: dict, strip: np.ndarray) -> None:
    """Every layer x head map for the query, each scaled to its own max; pruned pairs grey."""
    n_l, n_h = strip.shape[:2]
    ax = bottom.subplots(1, 1)
    gh, gw = strip.shape[2:]
    mosaic = np.full((n_l * (gh + 1), n_h * (gw + 1)), np.nan)
    with np.errstate(all="ignore"):
        top_val = np.nanmax(np.where(np.isfinite(strip), strip, -np.inf).reshape(n_l, n_h, -1), -1)
    for l in range(n_l):
        for h in range(n_h):
            if np.isfinite(top_val[l, h]) and top_val[l, h] > 0:
                mosaic[l * (gh + 1): l * (gh + 1) + gh, h * (gw + 1): h * (gw + 1) + gw] = strip[l, h] / top_val[l, h]
    im = ax.imshow(np.ma.masked_invalid(mosaic), cmap=CMAP, vmin=0, vmax=1, interpolation="nearest", aspect="equal")
    pruned = np.asarray(view["strip_pruned"])
    for l, h in zip(*np.nonzero(pruned)):
        ax.add_patch(Rectangle((h * (gw + 1) - 0.5, l * (gh + 1) - 0.5), gw, gh, color="0.6", alpha=0.85))
    ax.set_xticks([h * (gw + 1) + gw / 2 for h in range(n_h)], [str(h) for h in range(n_h)], fontsize=6)
    ax.set_yticks([l * (gh + 1) + gh / 2 for l in range(n_l)], view["strip_layers"], fontsize=6)
    ax.set_xlabel("head", fontsize=7)
    ax.set_ylabel("layer", fontsize=7)
    ax.set_title(f"{view['strip_label']}: every layer and head for this query\n(each scaled to its own max"
                 + ("; grey = pruned (window, head) pair" if pruned.any() else "") + ")", fontsize=8)
    cb = fig.colorbar(im, ax=ax, fraction=0.02)
    cb.set_label("share of the thumbnail's max", fontsize=6)
    cb.ax.tick_params(labelsize=6)


def save_view(view: dict, path: str | Path) -> Path:
    """The view's arrays and labels as one ``.npz`` (no pickles: JSON for the labels)."""
    path = Path(path)
    arrays = {"image": np.asarray(view["image"]), "strip": np.asarray(view["strip"], np.float32),
              "strip_pruned": np.asarray(view["strip_pruned"], bool)}
    meta = {k: view[k] for k in ("image_id", "query_label", "head", "layer", "scale", "ref_layers", "strip_label",
                                 "strip_layers")}
    meta["query"] = list(view["query"])
    meta["agreement"] = {k: {m: np.asarray(a, float).tolist() for m, a in d.items()} for k, d in view["agreement"].items()}
    meta["panels"] = []
    for i, p in enumerate(view["panels"]):
        arrays[f"map{i}"] = np.asarray(p["map"], np.float32)
        arrays[f"prefix{i}"] = np.atleast_1d(np.asarray(p["prefix"], np.float32))
        if p["outline"] is not None:
            arrays[f"outline{i}"] = np.asarray(p["outline"], bool)
        meta["panels"].append({k: p[k] for k in ("label", "measure", "units", "layer", "prefix_kinds", "pruned", "note")}
                              | {k: p.get(k) for k in ("image_id", "diverging", "self_value")}
                              | {"cell_size": list(map(int, p.get("cell_size", (1, 1))))}
                              | {"cell": list(map(int, p["cell"])), "vmin": float(p["vmin"]), "vmax": float(p["vmax"])})
    np.savez_compressed(path, meta=np.array(json.dumps(meta)), **arrays)
    return path


def load_view(path: str | Path) -> dict:
    """A view saved by :func:`save_view`, ready for :func:`draw`."""
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        view = dict(meta, image=z["image"], strip=z["strip"], strip_pruned=z["strip_pruned"])
        view["query"] = tuple(meta["query"])
        view["panels"] = [dict(p, map=z[f"map{i}"], prefix=z[f"prefix{i}"],
                               outline=z[f"outline{i}"] if f"outline{i}" in z else None)
                          for i, p in enumerate(meta["panels"])]
    return view


def export(view: dict, path: str | Path, *, call: str | None = None, selection=None) -> dict[str, Path]:
    """Write ``path`` (PNG), ``path`` with ``.npz`` (the view's arrays) and ``.py`` (the code that redraws it)."""
    png = Path(path).expanduser()
    if png.suffix.lower() != ".png":
        png = png.with_suffix(png.suffix + ".png") if png.suffix else png.with_suffix(".png")
    png.parent.mkdir(parents=True, exist_ok=True)
    data, code = png.with_suffix(".npz"), png.with_suffix(".py")
    fig = draw(view)
    tmp = png.with_name(f".{png.name}.tmp.png")
    fig.savefig(tmp, dpi=150)
    plt.close(fig)
    tmp_data = data.with_name(f".{data.stem}.tmp.npz")
    save_view(view, tmp_data)
    lines = ["# Redraws the explorer view saved beside this file.",
             "from workbench.explore.snapshot import draw, load_view", "",
             f"fig = draw(load_view({data.name!r}))", f"fig.savefig({png.name!r}, dpi=150)"]
    if call is not None and selection is not None:
        q = selection.query
        query = repr(q[0]) if q[0] != "patch" else view["query_label"].removeprefix("patch ")
        lines += ["", "# The live explorer at the same view:", "# from workbench.explore import explore",
                  f"# w = {call}",
                  f"# w.state.select(image={selection.image}, layer={selection.layer}, head={selection.head!r}, "
                  f"query={query}, scale={selection.scale!r}, strip={selection.strip!r})"]
    tmp_code = code.with_name(f".{code.name}.tmp")
    tmp_code.write_text("\n".join(lines) + "\n")
    for t, final in ((tmp, png), (tmp_data, data), (tmp_code, code)):
        t.replace(final)
    return {"png": png, "data": data, "code": code}
