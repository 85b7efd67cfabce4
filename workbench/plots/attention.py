"""Attention figures from the ``attention`` / ``window_attention`` Datasets.

- :func:`plot_attention_grid`: a layer x head grid of query x key probability matrices (or of one
  query's attention over the patch grid).
- :func:`plot_cls_maps`: CLS-to-patch attention over the input image, layers x heads.

With a ``model`` dim (``xr.concat([teacher, student], dim="model")``) and no ``model=`` choice,
rows become (model, layer) pairs -- teacher and student rows one above the other (see
:func:`panel_rows`). Every panel in a figure shares one colour scale and one colour bar.
Coordinates are selected by *label*: ``sample`` is the dataset index after provenance stamping,
``layers`` are block indices, ``heads`` head indices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colorbar import Colorbar
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from workbench.plots.theme import ATTENTION_CMAP, MISSING_COLOR, PANEL_INCHES

Scale = Literal["linear", "sqrt", "log"]
ImageLike = Any  # np.ndarray | xr.DataArray of shape (H, W) or (H, W, 3), values in [0, 1]


@dataclass(frozen=True)
class PanelRow:
    """One row of a panel grid.

    Attributes:
        label: panel-title prefix, ``"layer L"``.
        sel: coordinate labels that select the row (``layer``, and ``model`` if any).
        model: the row's model label, ``None`` without a ``model`` dim (shown left of the row).
    """

    label: str
    sel: dict[str, Any]
    model: str | None = None


def panel_rows(da: xr.DataArray, *, layers: Sequence[int] | None = None, model: str | None = None) -> list[PanelRow]:
    """Rows of a layer-by-head figure: one per layer, or per (model, layer) when ``da`` has a ``model`` dim.

    Args:
        da: DataArray with a ``layer`` dim and optionally a ``model`` dim.
        layers: layer labels to show; ``None`` for all.
        model: one model label to show; ``None`` for all models (one row block per model).
    """
    layer_labels = list(da["layer"].values) if layers is None else list(layers)
    missing = set(layer_labels) - set(da["layer"].values.tolist())
    if missing:
        raise ValueError(f"layers {sorted(missing)} not in the Dataset (layers: {da['layer'].values.tolist()})")
    if "model" in da.dims:
        models = list(da["model"].values) if model is None else [model]
        return [
            PanelRow(f"layer {int(lay)}", {"model": m, "layer": lay}, str(m)) for m in models for lay in layer_labels
        ]
    if model is not None:
        raise ValueError("model= given but the Dataset has no 'model' dim")
    return [PanelRow(f"layer {int(lay)}", {"layer": lay}) for lay in layer_labels]


def _pick_sample(da: xr.DataArray, sample: int | None) -> tuple[xr.DataArray, Any]:
    if "sample" not in da.dims:
        return da, None
    label = da["sample"].values[0] if sample is None else sample
    if label not in da["sample"].values:
        raise ValueError(f"sample {label} not in the Dataset (samples: {da['sample'].values.tolist()})")
    return da.sel(sample=label), label


def _norm(scale: Scale, vmax: float, vmin_pos: float) -> mcolors.Normalize:
    if scale == "linear":
        return mcolors.Normalize(0.0, vmax)
    if scale == "sqrt":
        return mcolors.PowerNorm(0.5, 0.0, vmax)
    if scale == "log":
        return mcolors.LogNorm(max(vmin_pos, vmax * 1e-4), vmax)
    raise ValueError(f"scale must be 'linear', 'sqrt' or 'log', got {scale!r}")


def _cmap() -> mcolors.Colormap:
    return plt.get_cmap(ATTENTION_CMAP).with_extremes(bad=MISSING_COLOR)


def _color_range(panels: Sequence[np.ndarray], vmax: float | None) -> tuple[float, float]:
    """Shared ``vmax`` (max over panels unless given) and the smallest positive value (for log scales)."""
    vals = np.concatenate([p[np.isfinite(p)].ravel() for p in panels] or [np.zeros(1)])
    top = float(vals.max()) if vmax is None and vals.size else float(vmax or 1.0)
    pos = vals[vals > 0]
    return (top if top > 0 else 1.0), (float(pos.min()) if pos.size else 1e-6)


def _grid(n_rows: int, n_cols: int, ax: Axes | None, aspect: float = 1.0) -> tuple[Figure, np.ndarray]:
    if ax is not None:
        return ax.figure, np.array([[ax]])
    fig, axes = plt.subplots(
        n_rows,
        n_cols,
        figsize=(PANEL_INCHES * n_cols * aspect + 1.2, PANEL_INCHES * n_rows + 0.7),
        squeeze=False,
        layout="constrained",
    )
    return fig, axes


def _bottom_rows(present: list[list[bool]]) -> list[int]:
    """Per column, the lowest row holding a real panel (which gets the x label)."""
    return [max((r for r, row in enumerate(present) if row[c]), default=-1) for c in range(len(present[0]))]


def _row_ylabel(row: PanelRow, text: str) -> str:
    """Y label of a row's first panel; names the model on comparison figures."""
    return text if row.model is None else f"model: {row.model}\n{text}"


def _missing_panel(ax: Axes, title: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, "not in this layer", ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _row_to_grid(row: xr.DataArray, yname: str, xname: str) -> np.ndarray:
    """Scatter a 1-D row over ``key`` onto a (y, x) grid using its coords; non-grid keys are dropped."""
    y, x, v = row[yname].values, row[xname].values, row.values
    keep = (y >= 0) & (x >= 0)
    grid = np.full((int(y[keep].max()) + 1, int(x[keep].max()) + 1), np.nan, dtype=np.float32)
    grid[y[keep], x[keep]] = v[keep]
    return grid


def _mark_query(ax: Axes, cell: xr.DataArray, windowed: bool) -> None:
    """Draw a marker where the query token itself sits on the key grid (patch queries only)."""
    names = ("query_wy", "query_wx") if windowed else ("query_y", "query_x")
    if all(n in cell.coords for n in names):
        qy, qx = (int(cell[n].item()) for n in names)
        if qy >= 0 and qx >= 0:
            ax.plot(qx, qy, marker="+", color="red", ms=7, mew=1.5, ls="none")


def _token_ticks(ax: Axes, da: xr.DataArray) -> None:
    """Mark prefix tokens (cls, dist, ...) and the patch range on both axes, with separator lines."""
    if "query_kind" not in da.coords:
        return
    kinds = da["query_kind"].values
    n_pre = int((kinds != "patch").sum())
    n = len(kinds)
    ticks, labels = [], []
    if n_pre:
        ticks.append((n_pre - 1) / 2)  # one tick for all prefix tokens: they are 1-2 px wide
        labels.append("+".join(dict.fromkeys(kinds[:n_pre])))
    ticks.append(n_pre + (n - n_pre - 1) / 2)
    labels.append(f"{n - n_pre} patches")
    ax.set_xticks(ticks, labels)
    ax.set_yticks(ticks, labels, rotation=90, va="center")
    ax.tick_params(length=2, pad=1, labelsize="x-small")
    if n_pre:
        for line in (ax.axvline, ax.axhline):
            line(n_pre - 0.5, color="white", lw=0.6)


def _add_colorbar(
    fig: Figure, norm: mcolors.Normalize, axes: np.ndarray, label: str, uniform: float | None = None
) -> Colorbar:
    """One colour bar (opaque, whatever the panels' alpha) for all ``axes``; marks ``uniform`` if given."""
    mappable = ScalarMappable(norm=norm, cmap=_cmap())
    cbar = fig.colorbar(mappable, ax=list(axes.ravel()), shrink=min(1.0, 0.55 + 0.1 * axes.shape[0]), aspect=30)
    if isinstance(norm, mcolors.PowerNorm):  # evenly spaced on the sqrt axis, 2 significant digits
        cbar.set_ticks(sorted({float(f"{norm.vmax * f:.2g}") for f in (0, 1 / 16, 1 / 4, 9 / 16, 1)}))
    if uniform is not None and (norm.vmin or 0.0) <= uniform <= norm.vmax:
        cbar.ax.axhline(uniform, color="white", lw=1.5, ls=(0, (2, 1)))
        label = f"{label}\n(dashed line: uniform, {uniform:.2g})"
    if isinstance(norm, mcolors.PowerNorm):
        label = f"{label}\n(square-root colour scale)"
    cbar.set_label(label)
    return cbar


def plot_attention_grid(
    ds: xr.Dataset | xr.DataArray,
    *,
    sample: int | None = None,
    query: int | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    model: str | None = None,
    window: int = 0,
    scale: Scale = "sqrt",
    vmax: float | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Layer x head grid of attention maps.

    Args:
        ds: an ``attention`` or ``window_attention`` Dataset (or its ``attention`` DataArray).
        sample: sample label (dataset index); ``None`` for the first sample.
        query: ``None`` shows each head's full query x key matrix; a query token index shows that
            token's attention over the patch keys laid out on the patch grid (for window attention,
            over the keys of its window), a red ``+`` marking the query's own position.
        layers: layer labels (block indices) to show as rows; ``None`` for all.
        heads: head labels to show as columns; ``None`` for all.
        model: with a ``model`` dim, show only this model; ``None`` stacks (model, layer) rows.
        window: window label, for ``window_attention`` Datasets.
        scale: colour scale of the probabilities; ``"sqrt"`` (default) keeps small values visible.
        vmax: top of the shared colour scale; ``None`` for the maximum shown.
        ax: draw only the first selected panel into this Axes.

    Returns:
        The Figure (the one holding ``ax`` when given; no suptitle is added to it then).
    """
    da = ds["attention"] if isinstance(ds, xr.Dataset) else ds
    da, sample_label = _pick_sample(da, sample)
    windowed = "window" in da.dims
    if windowed:
        da = da.sel(window=window)
    rows = panel_rows(da, layers=layers, model=model)
    head_labels = list(da["head"].values) if heads is None else list(heads)
    if ax is not None:
        rows, head_labels = rows[:1], head_labels[:1]

    panels: list[list[tuple[str, np.ndarray | None, xr.DataArray]]] = []
    for row in rows:
        cells = []
        for h in head_labels:
            cell = da.sel(row.sel).sel(head=h)
            if query is not None:
                cell = cell.sel(query=query)
                values = _row_to_grid(cell, "key_wy", "key_wx") if windowed else _row_to_grid(cell, "key_y", "key_x")
            else:
                values = cell.values
            cells.append((f"{row.label} · head {int(h)}", None if np.isnan(values).all() else values, cell))
        panels.append(cells)
    top, pos = _color_range([v for cells in panels for _, v, _ in cells if v is not None], vmax)
    norm = _norm(scale, top, pos)

    fig, axes = _grid(len(rows), len(head_labels), ax)
    bottom = _bottom_rows([[v is not None for _, v, _ in cells] for cells in panels])
    im = None
    for r, cells in enumerate(panels):
        for c, (title, values, cell) in enumerate(cells):
            a = axes[r, c]
            if values is None:
                _missing_panel(a, title)
                continue
            im = a.imshow(values, cmap=_cmap(), norm=norm, interpolation="nearest")
            a.set_title(title)
            if query is None:
                _token_ticks(a, cell)
                a.set_xlabel("key token" if r == bottom[c] else "")
                a.set_ylabel(_row_ylabel(rows[r], "query token") if c == 0 else "")
            else:
                _mark_query(a, cell, windowed)
                a.xaxis.set_major_locator(MaxNLocator(integer=True))
                a.yaxis.set_major_locator(MaxNLocator(integer=True))
                a.set_xlabel("key x (window)" if windowed else "key x (patch)")
                a.set_ylabel(_row_ylabel(rows[r], "key y (window)" if windowed else "key y (patch)") if c == 0 else "")
    where = f"sample {sample_label}" + (f" · window {window}" if windowed else "")
    if query is None:
        what = "Attention probabilities, query × key"
    else:
        kind = ""
        if "query_kind" in da.coords:
            q = da.sel(query=query)
            kind = f" ({q['query_kind'].item()}"
            kind += f", y={int(q['query_y'])}, x={int(q['query_x'])})" if int(q["query_y"]) >= 0 else ")"
        what = f"Attention of query token {query}{kind} over {'window' if windowed else 'patch'} keys"
    if im is not None:
        _add_colorbar(fig, norm, axes, "attention probability")
    if ax is not None:
        who = "" if rows[0].model is None else f"{rows[0].model} · "
        ax.set_title(f"{what}\n{who}{panels[0][0][0]} · {where}", fontsize="small")
    else:
        fig.suptitle(f"{what} · {where}")
    return fig


def _as_image(image: ImageLike) -> np.ndarray:
    """(H, W) or (H, W, 3) float array in [0, 1]; channel-first input is transposed."""
    img = np.asarray(image.values if isinstance(image, xr.DataArray) else image, dtype=np.float32)
    if img.ndim == 3 and img.shape[0] in (1, 3) and img.shape[-1] not in (1, 3):
        img = np.moveaxis(img, 0, -1)  # (C, H, W) -> (H, W, C)
    if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
    if img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[-1] != 3):
        raise ValueError(f"image must be (H, W) or (H, W, 3), got shape {img.shape}")
    return np.clip(img, 0.0, 1.0)


def plot_cls_maps(
    ds: xr.Dataset | xr.DataArray,
    image: ImageLike | None = None,
    *,
    sample: int | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    model: str | None = None,
    alpha: float = 0.6,
    interpolation: Literal["nearest", "bilinear"] = "nearest",
    scale: Scale = "linear",
    vmax: float | None = None,
    ax: Axes | None = None,
) -> Figure:
    """CLS-to-patch attention maps over the input image; rows = layers, columns = heads.

    Each map (the CLS query's probabilities over the patch grid) is stretched over the image
    extent, so every patch covers its pixels, and drawn semi-transparently on top of it (the image
    is shown in grey so that colour only encodes attention). The colour
    bar marks the uniform level ``1 / number of patches``.

    Args:
        ds: an ``attention`` Dataset with ``cls_attention(..., layer, head, y, x)`` (or that DataArray).
        image: the input image, ``(H, W)`` or ``(H, W, 3)`` in [0, 1] (ndarray or DataArray), for the
            same sample; ``None`` draws the maps alone on the patch grid.
        sample: sample label (dataset index); ``None`` for the first sample.
        layers: layer labels (rows); ``None`` for all.
        heads: head labels (columns); ``None`` for all.
        model: with a ``model`` dim, show only this model; ``None`` stacks (model, layer) rows.
        alpha: opacity of the attention overlay (1.0 when there is no image).
        interpolation: ``"nearest"`` shows patches as blocks, ``"bilinear"`` smooths them.
        scale: colour scale (``"linear"``, ``"sqrt"``, ``"log"``).
        vmax: top of the shared colour scale; ``None`` for the maximum shown.
        ax: draw only the first selected panel into this Axes.

    Returns:
        The Figure (the one holding ``ax`` when given; no suptitle is added to it then).
    """
    if isinstance(ds, xr.Dataset):
        if "cls_attention" not in ds:
            raise ValueError("the Dataset has no 'cls_attention' (a model without a class token?)")
        da = ds["cls_attention"]
    else:
        da = ds
    da, sample_label = _pick_sample(da, sample)
    rows = panel_rows(da, layers=layers, model=model)
    head_labels = list(da["head"].values) if heads is None else list(heads)
    if ax is not None:
        rows, head_labels = rows[:1], head_labels[:1]
    maps = [[da.sel(row.sel).sel(head=h).transpose("y", "x").values for h in head_labels] for row in rows]
    top, pos = _color_range([m for ms in maps for m in ms if not np.isnan(m).all()], vmax)
    norm = _norm(scale, top, pos)
    gh, gw = da.sizes["y"], da.sizes["x"]

    img = None if image is None else _as_image(image)
    if img is not None and img.ndim == 3:
        img = img @ np.array([0.299, 0.587, 0.114], dtype=np.float32)  # grey, so colours belong to the map
    if img is not None:
        h, w = img.shape[:2]
        extent = (-0.5, w - 0.5, h - 0.5, -0.5)  # pixel edges: the map is upsampled onto the image
        aspect = w / h
    else:
        extent, aspect = (-0.5, gw - 0.5, gh - 0.5, -0.5), gw / gh

    fig, axes = _grid(len(rows), len(head_labels), ax, aspect=aspect)
    bottom = _bottom_rows([[not np.isnan(m).all() for m in ms] for ms in maps])
    im = None
    for r, row in enumerate(rows):
        for c, h in enumerate(head_labels):
            a, m = axes[r, c], maps[r][c]
            title = f"{row.label} · head {int(h)}"
            if np.isnan(m).all():
                _missing_panel(a, title)
                continue
            if img is not None:
                a.imshow(img, cmap="gray", vmin=0, vmax=1, interpolation="antialiased")
            im = a.imshow(
                m, cmap=_cmap(), norm=norm, extent=extent, interpolation=interpolation,
                alpha=alpha if img is not None else 1.0,
            )
            a.set_xlim(extent[0], extent[1])
            a.set_ylim(extent[2], extent[3])
            a.set_title(title)
            unit = "pixel" if img is not None else "patch"
            last_row = r == bottom[c]
            a.set_xlabel(f"x ({unit})" if last_row else "")
            a.set_ylabel(_row_ylabel(row, f"y ({unit})") if c == 0 else "")
            if not last_row:
                a.set_xticklabels([])
            if c:
                a.set_yticklabels([])
            if img is None:
                a.xaxis.set_major_locator(MaxNLocator(integer=True))
                a.yaxis.set_major_locator(MaxNLocator(integer=True))
    if im is not None:
        _add_colorbar(fig, norm, axes, "CLS → patch attention probability", uniform=1.0 / (gh * gw))
    where = f"sample {sample_label}" + (f" · {gh}×{gw} patch grid")
    if ax is not None:
        who = "" if rows[0].model is None else f"{rows[0].model} · "
        ax.set_title(f"CLS attention · {who}{rows[0].label} · head {int(head_labels[0])}\n{where}", fontsize="small")
    else:
        fig.suptitle(f"CLS-to-patch attention over the input · {where}")
    return fig
