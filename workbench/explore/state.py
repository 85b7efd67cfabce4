"""The explorer's state: a selection (image, layer, head, query, colour scale) -> the arrays of the current view.

All the logic of ``workbench.explore`` lives here, in plain Python; the widget only observes it. Sources (a
:class:`~workbench.explore.rows.DatasetReader` over a store, or a :class:`~workbench.explore.live.LiveModel`)
serve one model's rows for a clicked query — every layer and head at once — and the state caches them per
(model, image, query), so moving the layer or head slider re-slices without recomputing. :meth:`ExploreState.payload`
is what the browser receives for a click: float16 panel maps and uint8 thumbnails of the current view only (never
a layers x heads x N x N tensor), plus a small JSON dict.

Agreement strip (student vs the reference model, the first one, for the current query, per layer): the two rows
normalised to sum to 1 over the keys, then

- ``js`` — Jensen–Shannon divergence, base 2, in [0, 1];
- ``topk`` — share of the top-k keys in common, k = ``topk`` x keys (at least 1), ties: lower key index first;

on the head-averaged rows (the mean of the heads' normalised rows), as ``workbench compare`` defines them
(:mod:`workbench.analysis.token_agreement`, whose torch functions the tests hold these numpy ones to: exploring
stores must not import torch). A student whose keys are not the reference's tokens (another grid, Swin windows)
has no agreement (NaN, with a note). Swin window attention is compared over the query's window's keys (a SlimSwin
student against its Swin teacher), AttentionLite's stage maps over the stage cells.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Iterator, Literal

import numpy as np

from workbench.explore.rows import ExploreError, ModelRows, Query

__all__ = ["Images", "Selection", "ExploreState", "row_js", "row_topk_overlap", "normalise_rows", "TOPK"]

#: top-k overlap: k as a fraction of the keys (``workbench compare``'s default)
TOPK = 0.1
Scale = Literal["shared", "panel"]


@dataclass
class Images:
    """The images being explored: what the models saw, and their ids."""

    display: np.ndarray  # (B, H, W) or (B, H, W, 3) in [0, 1]
    ids: list[str]  # "dataset[index]" per image


@dataclass(frozen=True)
class Selection:
    """What the view shows."""

    image: int = 0  # position in Images.ids
    layer: int = 0  # the reference model's layer (others: the same relative depth)
    head: int | None = None  # head index, or None for the mean over heads
    query: Query = ("patch", 0.5, 0.5)  # see workbench.explore.rows.Query
    scale: Scale = "shared"  # one colour scale per unit (shared) or one per panel
    strip: str = ""  # the model whose layer x head thumbnails are shown ("" = the reference)


def normalise_rows(p: np.ndarray) -> np.ndarray:
    """Rows summing to 1 over the last axis, float64; all-zero (or NaN) rows become NaN."""
    p = np.asarray(p, np.float64)
    total = p.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, p / np.where(total > 0, total, 1.0), np.nan)


def row_js(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen–Shannon divergence (base 2) of distributions along the last axis."""
    m = 0.5 * (p + q)

    def kl(x: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(x > 0, x / np.where(m > 0, m, 1.0), 1.0)
            return (x * np.log2(ratio)).sum(-1)

    return np.maximum(0.5 * kl(p) + 0.5 * kl(q), 0.0)


def row_topk_overlap(p: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """Share of the top-``k`` keys (last axis) two rows have in common (ties: lower index first)."""
    tp = np.argsort(-p, axis=-1, kind="stable")[..., :k]
    tq = np.argsort(-q, axis=-1, kind="stable")[..., :k]
    hit = np.zeros(p.shape, bool)
    np.put_along_axis(hit, tp, True, -1)
    return np.take_along_axis(hit, tq, -1).sum(-1) / k


def _error(msg: str) -> ExploreError:
    return ExploreError(msg)


class ExploreState:
    """Selection -> view, for a reference model (the first source) and others beside it.

    Args:
        sources: label -> source (anything with ``rows(image_id, query) -> ModelRows``, ``grid``,
            ``prefix_kinds``, ``layer_labels``, ``num_heads``, ``units``, ``measure``); the first is the reference.
        images: the images (each source must hold rows for them).
        cache_size: (model, image, query) rows kept.
    """

    def __init__(self, sources: dict, images: Images, *, cache_size: int = 64):
        if not sources:
            raise _error("nothing to explore: pass a teacher (and students) or stores={label: path}")
        if len(images.ids) == 0:
            raise _error("no images to explore: the image spec selects none")
        self.sources = dict(sources)
        self.images = images
        self.reference = next(iter(self.sources))
        self.selection = Selection(strip=self.reference)
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = cache_size
        ref = self.sources[self.reference]
        gh, gw = ref.grid
        self.selection = replace(self.selection, query=("patch", (gh // 2 + 0.5) / gh, (gw // 2 + 0.5) / gw))

    # ------------------------------------------------------------------ selection
    @property
    def image_id(self) -> str:
        return self.images.ids[self.selection.image]

    def query_token(self, query) -> Query:
        """A query as the state keeps it, from ``(y, x)`` on the reference's patch grid or ``"cls"`` / ``"dist"``.

        Raises:
            ExploreError: a cell outside the grid, or a token the reference does not have.
        """
        ref = self.sources[self.reference]
        if isinstance(query, str):
            if query not in ref.prefix_kinds:
                raise _error(f"the reference model {self.reference!r} has no {query!r} token "
                             f"(its prefix tokens: {list(ref.prefix_kinds) or 'none'}); click a patch instead")
            return (query,)
        if isinstance(query, tuple) and query and query[0] == "patch":
            return query
        try:
            y, x = (int(v) for v in query)
        except (TypeError, ValueError):
            raise _error(f"a query is (row, column) on the patch grid or 'cls' / 'dist', got {query!r}") from None
        gh, gw = ref.grid
        if not (0 <= y < gh and 0 <= x < gw):
            raise _error(f"query ({y}, {x}) is outside the {gh} x {gw} patch grid of {self.reference!r} "
                         f"(rows 0..{gh - 1}, columns 0..{gw - 1})")
        return ("patch", (y + 0.5) / gh, (x + 0.5) / gw)

    def select(self, **changes) -> ExploreState:
        """Change the selection (``image``, ``layer``, ``head`` (int or None = mean), ``query``, ``scale``, ``strip``).

        Raises:
            ExploreError: a value out of range, naming the range.
        """
        sel = self.selection
        ref = self.sources[self.reference]
        for key, value in changes.items():
            if key == "image":
                if not 0 <= int(value) < len(self.images.ids):
                    raise _error(f"image {value} out of range: {len(self.images.ids)} images (0..{len(self.images.ids) - 1})")
                sel = replace(sel, image=int(value))
            elif key == "layer":
                n = len(ref.layer_labels)
                if not 0 <= int(value) < n:
                    raise _error(f"layer {value} out of range: {self.reference!r} has {n} layers (0..{n - 1})")
                sel = replace(sel, layer=int(value))
            elif key == "head":
                if value is not None and value != "mean" and not 0 <= int(value) < self.max_heads:
                    raise _error(f"head {value} out of range: at most {self.max_heads} heads (0..{self.max_heads - 1}), "
                                 "or None for the mean over heads")
                sel = replace(sel, head=None if value in (None, "mean") else int(value))
            elif key == "query":
                sel = replace(sel, query=self.query_token(value))
            elif key == "scale":
                if value not in ("shared", "panel"):
                    raise _error(f"scale must be 'shared' (one colour scale per unit) or 'panel', got {value!r}")
                sel = replace(sel, scale=value)
            elif key == "strip":
                if value not in self.sources:
                    raise _error(f"strip model {value!r} is not among {list(self.sources)}")
                sel = replace(sel, strip=value)
            else:
                raise _error(f"unknown selection {key!r}; use image, layer, head, query, scale or strip")
        self.selection = sel
        return self

    def click(self, fy: float, fx: float) -> ExploreState:
        """Select the reference's patch under the image position (fy, fx) (fractions of height and width)."""
        gh, gw = self.sources[self.reference].grid
        if not (0 <= fy < 1 and 0 <= fx < 1):
            raise _error(f"click at ({fy:.3f}, {fx:.3f}) is outside the image (fractions in [0, 1))")
        return self.select(query=(int(fy * gh), int(fx * gw)))

    @property
    def max_heads(self) -> int:
        return max(s.num_heads for s in self.sources.values())

    def model_layer(self, label: str, layer: int | None = None) -> int:
        """The layer of ``label`` at the reference layer's relative depth."""
        layer = self.selection.layer if layer is None else layer
        n_ref, n = len(self.sources[self.reference].layer_labels), len(self.sources[label].layer_labels)
        return layer if n == n_ref else int(round(layer * (n - 1) / max(1, n_ref - 1)))

    # ------------------------------------------------------------------ rows
    def rows(self, label: str, image: int | None = None, query: Query | None = None) -> ModelRows:
        """The model's rows for the (selected) image and query, cached; checked to belong to that image."""
        image_id = self.images.ids[self.selection.image if image is None else image]
        query = self.selection.query if query is None else query
        key = (label, image_id, query)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        rows = self.sources[label].rows(image_id, query)
        if rows.image_id != image_id:
            raise _error(f"{label!r} returned maps of image {rows.image_id} for image {image_id}; refusing to draw them")
        self._cache[key] = rows
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return rows

    def agreement(self) -> dict[str, dict[str, np.ndarray]]:
        """Per student: ``js`` and ``topk`` per reference layer (head-averaged rows) and ``js_head`` / ``topk_head``
        (the selected head, when head counts match); NaN where not comparable."""
        ref = self.rows(self.reference)
        out = {}
        n_l = len(self.sources[self.reference].layer_labels)
        for label in self.sources:
            if label == self.reference:
                continue
            r = self.rows(label)
            res = {k: np.full(n_l, np.nan) for k in ("js", "topk", "js_head", "topk_head")}
            same_keys = _keys(self.sources[self.reference]) == _keys(self.sources[label])
            if same_keys and ref.tokens is not None and r.tokens is not None and ref.tokens.shape[-1] == r.tokens.shape[-1]:
                k = max(1, int(round(TOPK * ref.tokens.shape[-1])))
                for l in range(n_l):
                    t = normalise_rows(ref.tokens[l])  # (head, T)
                    s = normalise_rows(r.tokens[self.model_layer(label, l)])
                    with _quiet():
                        ta, sa = np.nanmean(t, 0), np.nanmean(s, 0)
                    if not (np.isnan(ta).any() or np.isnan(sa).any()):
                        res["js"][l], res["topk"][l] = row_js(ta, sa), row_topk_overlap(ta, sa, k)
                    h = self.selection.head
                    if h is not None and h < min(len(t), len(s)) and not (np.isnan(t[h]).any() or np.isnan(s[h]).any()):
                        res["js_head"][l], res["topk_head"][l] = row_js(t[h], s[h]), row_topk_overlap(t[h], s[h], k)
            out[label] = res
        return out

    # ------------------------------------------------------------------ the view
    def view(self) -> dict:
        """The current view as numpy arrays (what the widget draws and :func:`~workbench.explore.snapshot.draw`
        redraws): per model its panel map on its own grid, outline, pruned flag, colour range and units; the
        strip model's layer x head maps; the agreement strip; the image."""
        sel = self.selection
        panels = []
        for label, src in self.sources.items():
            rows = self.rows(label)
            l = self.model_layer(label)
            note = ""
            if sel.head is None:
                with _quiet():
                    m = np.nanmean(rows.maps[l], 0)
                    pre = np.nanmean(rows.prefix[l], 0) if rows.prefix.shape[-1] else rows.prefix[l, 0]
                outline = rows.outline[l].any(0) if rows.outline is not None else None
                pruned = bool(rows.pruned[l].all()) if rows.pruned is not None else False
                if rows.pruned is not None and rows.pruned[l].any():
                    note = f"mean over heads incl. {int(rows.pruned[l].sum())} pruned"
            elif sel.head < rows.maps.shape[1] and not np.isnan(rows.maps[l, sel.head]).all():
                m, pre = rows.maps[l, sel.head], rows.prefix[l, sel.head]
                outline = rows.outline[l, sel.head] if rows.outline is not None else None
                pruned = bool(rows.pruned[l, sel.head]) if rows.pruned is not None else False
            else:
                m = np.full(rows.maps.shape[2:], np.nan, np.float32)
                pre, outline, pruned = rows.prefix[l, 0] * np.nan, None, False
                note = f"layer {src.layer_labels[l]} has no head {sel.head}"
            if pruned:
                note = "pruned head (window, head) pair" if sel.head is not None else "all heads pruned"
            panels.append(dict(label=label, measure=src.measure, units=src.units, layer=src.layer_labels[l],
                               map=np.asarray(m, np.float32), prefix=np.asarray(pre, np.float32),
                               prefix_kinds=list(src.prefix_kinds), outline=outline, pruned=pruned,
                               cell=rows.query_cell[l].tolist(), note=note))
        _colour_ranges(panels, sel.scale)
        strip_rows = self.rows(sel.strip)
        strip_src = self.sources[sel.strip]
        q = sel.query
        ref = self.sources[self.reference]
        if q[0] == "patch":
            gh, gw = ref.grid
            qlabel = f"patch ({min(gh - 1, int(q[1] * gh))}, {min(gw - 1, int(q[2] * gw))})"
        else:
            qlabel = f"{q[0]} token"
        return dict(image=self.images.display[sel.image], image_id=self.image_id, query=q, query_label=qlabel,
                    layer=sel.layer, head=sel.head, scale=sel.scale, panels=panels, agreement=self.agreement(),
                    ref_layers=list(ref.layer_labels), strip_label=sel.strip, strip=strip_rows.maps,
                    strip_layers=list(strip_src.layer_labels),
                    strip_pruned=strip_rows.pruned if strip_rows.pruned is not None else
                    np.zeros(strip_rows.maps.shape[:2], bool), units={p["label"]: p["units"] for p in panels})

    def payload(self) -> tuple[dict, dict[str, bytes]]:
        """What the browser receives for the current selection: a JSON-able dict and binary buffers.

        Buffers: ``panels`` float16 (each panel's map on its grid, concatenated in model order; NaN = no value),
        ``outlines`` uint8 (0/1 per panel cell, for panels with an outline), ``strip`` uint8 (layer x head
        thumbnails of the strip model, each scaled to its own max; 255 = NaN), ``strip_max`` float16 (those maxima).
        """
        v = self.view()
        panels, outlines, meta = [], [], []
        for p in v["panels"]:
            m = p["map"]
            panels.append(m.astype(np.float16).ravel())
            if p["outline"] is not None:
                outlines.append(p["outline"].astype(np.uint8).ravel())
            meta.append(dict(label=p["label"], measure=p["measure"], units=p["units"], layer=p["layer"],
                             grid=list(m.shape), vmin=_num(p["vmin"]), vmax=_num(p["vmax"]),
                             prefix=[_num(x) for x in np.asarray(p["prefix"]).ravel().tolist()],
                             prefix_kinds=p["prefix_kinds"], outline=p["outline"] is not None, pruned=p["pruned"],
                             cell=p["cell"], note=p["note"]))
        strip = v["strip"]  # (L, H, gh, gw)
        with _quiet():
            smax = np.nanmax(strip.reshape(*strip.shape[:2], -1), -1)  # (L, H)
        smax = np.where(np.isfinite(smax) & (smax > 0), smax, 1.0)
        thumbs = np.where(np.isnan(strip), 255, np.clip(np.round(254 * strip / smax[..., None, None]), 0, 254))
        state = dict(
            image_id=v["image_id"], query=list(v["query"]), query_label=v["query_label"], layer=v["layer"],
            head=v["head"], scale=v["scale"], panels=meta, ref_layers=v["ref_layers"],
            strip=dict(label=v["strip_label"], shape=list(strip.shape), layers=v["strip_layers"],
                       pruned=v["strip_pruned"].astype(int).tolist()),
            agreement={k: {m: [_num(x) for x in a.tolist()] for m, a in d.items()} for k, d in v["agreement"].items()},
        )
        buffers = dict(panels=np.concatenate(panels).tobytes(),
                       outlines=np.concatenate(outlines).tobytes() if outlines else b"",
                       strip=thumbs.astype(np.uint8).tobytes(), strip_max=smax.astype(np.float16).tobytes())
        return state, buffers

    def image_bytes(self) -> tuple[list[int], bytes]:
        """The selected image as uint8 ``(H, W[, 3])``: its shape and bytes (sent once per image, not per click)."""
        img = np.clip(np.round(self.images.display[self.selection.image] * 255), 0, 255).astype(np.uint8)
        return list(img.shape), img.tobytes()


def _keys(source) -> str:
    """What a source's row keys are: image tokens, a Swin window's tokens, or CNN stage cells (comparable within one)."""
    kind = getattr(source, "kind", "")
    return {"window_attention": "window", "at_maps": "cells"}.get(kind, "tokens")


def _num(x) -> float | None:
    """A JSON number, None for NaN / inf."""
    x = float(x)
    return x if np.isfinite(x) else None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence numpy's all-NaN / empty-mean warnings (NaN is the answer there)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _colour_ranges(panels: list[dict], scale: Scale) -> None:
    """vmin / vmax per panel: shared among panels of one unit, or per panel; from 0 (maps are non-negative)."""
    def vmax_of(ps):
        vals = [np.nanmax(np.concatenate([p["map"].ravel(), np.asarray(p["prefix"]).ravel()])) for p in ps
                if np.isfinite(p["map"]).any()]
        return max(vals) if vals else 1.0

    with _quiet():
        if scale == "panel":
            for p in panels:
                p["vmin"], p["vmax"] = 0.0, vmax_of([p])
        else:
            for units in {p["units"] for p in panels}:
                group = [p for p in panels if p["units"] == units]
                top = vmax_of(group)
                for p in group:
                    p["vmin"], p["vmax"] = 0.0, top
    for p in panels:
        if not np.isfinite(p["vmax"]) or p["vmax"] <= 0:
            p["vmax"] = 1.0

