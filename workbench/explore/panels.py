"""One model's panel for the current selection: its map over the heads a layer has, and the panels' colour ranges.

A layer's head mean averages the heads the layer *has* (Swin stages have different head counts: the slots past a
layer's count are padding) and, for a pruned model (SlimSwin), only those that are not pruned in the query's window;
a window whose heads are all pruned is greyed, its map the mean of the (inactive) heads it has. The colour range of
a panel covers the cells it colours (the patch keys; prefix keys such as CLS are printed as numbers beside it) and,
when ``exclude_query`` is on, leaves out the query's own token, whose value can dwarf every other key (FAR's
gradient saliency of a token with respect to itself).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

import numpy as np

from workbench.explore.rows import ModelRows

__all__ = ["panel_map", "colour_ranges", "query_mask", "quiet", "differences"]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence numpy's all-NaN / empty-mean warnings (NaN is the answer there)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def panel_map(rows: ModelRows, layer: int, head: int | None, layer_label: str) -> dict:
    """``map`` (gh, gw), ``prefix`` (P,), ``outline`` (gh, gw) or None, ``pruned`` and ``note`` of one layer.

    ``head`` None: the mean over the layer's heads that are not pruned (over all of them when every one is pruned:
    then ``pruned`` is True and the panel is greyed).
    """
    n = rows.num_heads_at(layer)
    pruned_heads = rows.pruned[layer, :n] if rows.pruned is not None else np.zeros(n, bool)
    if head is None:
        keep = ~pruned_heads if (~pruned_heads).any() else np.ones(n, bool)
        with quiet():
            m = np.nanmean(rows.maps[layer, :n][keep], 0)
            pre = np.nanmean(rows.prefix[layer, :n][keep], 0)
        outline = rows.outline[layer, :n][keep].any(0) if rows.outline is not None else None
        pruned = bool(n and pruned_heads.all())
        note = ""
        if pruned:
            note = f"all {n} heads pruned here (greyed)"
        elif pruned_heads.any():
            note = f"mean over {int(keep.sum())} of {n} heads ({int(pruned_heads.sum())} pruned here)"
        return dict(map=m, prefix=pre, outline=outline, pruned=pruned, note=note)
    if head < n and not np.isnan(rows.maps[layer, head]).all():
        pruned = bool(pruned_heads[head])
        return dict(map=rows.maps[layer, head], prefix=rows.prefix[layer, head],
                    outline=rows.outline[layer, head] if rows.outline is not None else None, pruned=pruned,
                    note="pruned (window, head) pair" if pruned else "")
    return dict(map=np.full(rows.maps.shape[2:], np.nan, np.float32), prefix=rows.prefix[layer, 0] * np.nan,
                outline=None, pruned=False, note=f"layer {layer_label} has {n} heads: no head {head}")


def query_mask(panel: dict) -> np.ndarray:
    """``(gh, gw)`` bool: the cells of the panel's map that are the query's own token (none for a prefix query)."""
    mask = np.zeros(panel["map"].shape, bool)
    cy, cx = panel["cell"]
    if cy >= 0:
        sy, sx = panel.get("cell_size", (1, 1))
        mask[cy:cy + sy, cx:cx + sx] = True
    return mask


def _share(p: dict) -> np.ndarray:
    """The panel's map as a share of its whole row (patch and prefix keys), ``(gh, gw)``."""
    total = np.nansum(p["map"]) + np.nansum(p["prefix"])
    return np.asarray(p["map"], np.float64) / total if total > 0 else np.full(p["map"].shape, np.nan)


def differences(panels: list[dict], comparable: list[bool]) -> None:
    """Student minus reference (the first panel): each comparable panel's map becomes its share of the row minus the
    reference's (both normalised to sum to 1 over their keys, so attention and saliency compare), a signed map drawn
    with a diverging colour map; a panel over other keys says so and shows nothing."""
    ref = _share(panels[0])
    for p, ok in zip(panels[1:], comparable[1:]):
        if ok and p["map"].shape == ref.shape:
            p["map"] = (_share(p) - ref).astype(np.float32)
            p["units"] = f"share of the row: {p['label']} − {panels[0]['label']}"
            p["note"] = (p["note"] + " · " if p["note"] else "") + f"minus {panels[0]['label']}"
        else:
            p["map"] = np.full(p["map"].shape, np.nan, np.float32)
            p["note"] = f"no difference: its keys are not {panels[0]['label']}'s"
        p["diverging"] = True
        p["exclude_query"] = False


def colour_ranges(panels: list[dict], scale: str) -> None:
    """``vmin`` / ``vmax`` per panel, over the cells it colours (leaving out the query's own token where the panel's
    ``exclude_query`` is set): shared among the panels of one unit (``scale="shared"``) or per panel; from 0 (maps
    are non-negative). ``self_value`` records the query's own value where it was left out."""
    def top(p: dict) -> float:
        m = np.abs(np.asarray(p["map"], np.float64)) if p.get("diverging") else np.asarray(p["map"], np.float64)
        if p.get("exclude_query"):
            mask = query_mask(p)
            p["self_value"] = float(np.nanmax(m[mask])) if mask.any() and np.isfinite(m[mask]).any() else None
            m = np.where(mask, np.nan, m)
        return float(np.nanmax(m)) if np.isfinite(m).any() else np.nan

    with quiet():
        tops = [top(p) for p in panels]
        if scale == "panel":
            for p, t in zip(panels, tops):
                p["vmin"], p["vmax"] = 0.0, t
        else:
            for units in {p["units"] for p in panels}:
                group = [t for p, t in zip(panels, tops) if p["units"] == units]
                shared = np.nanmax(group) if np.isfinite(group).any() else np.nan
                for p in panels:
                    if p["units"] == units:
                        p["vmin"], p["vmax"] = 0.0, shared
    for p in panels:
        if not np.isfinite(p["vmax"]) or p["vmax"] <= 0:
            p["vmax"] = 1.0
        if p.get("diverging"):  # signed: symmetric about 0
            p["vmin"] = -p["vmax"]
