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

from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from typing import Callable, Literal

import numpy as np

from workbench.explore.panels import colour_ranges, differences, panel_map
from workbench.explore.panels import quiet as _quiet
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
    head: int | None = None  # head index, or None for the mean over the heads a layer has (not pruned)
    query: Query = ("patch", 0.5, 0.5)  # see workbench.explore.rows.Query
    scale: Scale = "shared"  # one colour scale per unit (shared) or one per panel
    strip: str = ""  # the model whose layer x head thumbnails are shown ("" = the reference)
    exclude_query: bool | None = None  # leave the query's own token out of the colour range (None: for saliency maps)
    difference: bool = False  # students' panels show their share of the row minus the reference's
    direction: Literal["query", "key"] = "query"  # the clicked token as the query (its row) or the key (its column)


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
        self._observers: list[Callable[[ExploreState, set], None]] = []
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

    def observe(self, callback: Callable[[ExploreState, set], None]) -> Callable[[], None]:
        """Call ``callback(state, changed_fields)`` after every change of the selection, whoever made it (code or
        a control): the one source of truth every view follows. Returns a function that stops the calls."""
        self._observers.append(callback)
        return lambda: self._observers.remove(callback) if callback in self._observers else None

    def select(self, **changes) -> ExploreState:
        """Change the selection (``image``, ``layer``, ``head`` (int or None = mean), ``query``, ``scale``, ``strip``,
        ``exclude_query`` (bool, or None: on for saliency maps), ``difference`` (students minus the reference));
        observers are told what changed.

        A layer change that leaves the selected head past the heads the new layer has returns to the mean.

        Raises:
            ExploreError: a value out of range, naming the range (nothing changes then).
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
            elif key == "direction":
                if value not in ("query", "key"):
                    raise _error(f"direction is 'query' (what the token attends to) or 'key' (which queries attend to "
                                 f"it), got {value!r}")
                sel = replace(sel, direction=value)
            elif key == "difference":
                sel = replace(sel, difference=bool(value))
            elif key == "exclude_query":
                if value not in (None, True, False):
                    raise _error(f"exclude_query is True, False or None (on for saliency maps), got {value!r}")
                sel = replace(sel, exclude_query=value)
            else:
                raise _error(f"unknown selection {key!r}; use image, layer, head, query, scale, strip, exclude_query, difference or direction")
        if sel.head is not None:
            n = self.heads_at(sel.layer)
            if not 0 <= sel.head < n:
                if "head" in changes:
                    raise _error(f"head {sel.head} out of range: layer {ref.layer_labels[sel.layer]} has at most {n} heads "
                                 f"(0..{n - 1}) in any model, or None for the mean over heads")
                sel = replace(sel, head=None)
        changed = {f.name for f in fields(Selection) if getattr(sel, f.name) != getattr(self.selection, f.name)}
        self.selection = sel
        if changed:
            for callback in list(self._observers):
                callback(self, changed)
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

    def heads_of(self, label: str, layer: int | None = None) -> int:
        """Heads ``label``'s layer at the reference layer's depth has."""
        src, l = self.sources[label], self.model_layer(label, layer)
        per_layer = getattr(src, "heads_per_layer", None)
        return int(per_layer[l]) if per_layer is not None else int(src.num_heads)

    def heads_at(self, layer: int | None = None) -> int:
        """The most heads any model has at the reference layer ``layer`` (default: the selected one)."""
        return max(self.heads_of(label, layer) for label in self.sources)

    def model_layer(self, label: str, layer: int | None = None) -> int:
        """The layer of ``label`` at the reference layer's relative depth."""
        layer = self.selection.layer if layer is None else layer
        n_ref, n = len(self.sources[self.reference].layer_labels), len(self.sources[label].layer_labels)
        return layer if n == n_ref else int(round(layer * (n - 1) / max(1, n_ref - 1)))

    def reference_layer(self, label: str, layer: int) -> int:
        """The reference layer whose relative depth is ``label``'s layer ``layer`` (the nearest one)."""
        n_ref = len(self.sources[self.reference].layer_labels)
        return min(range(n_ref), key=lambda r: (abs(self.model_layer(label, r) - layer), r))

    # ------------------------------------------------------------------ rows
    def rows(self, label: str, image: int | None = None, query: Query | None = None) -> ModelRows:
        """The model's rows for the (selected) image and query, cached; checked to belong to that image."""
        image_id = self.images.ids[self.selection.image if image is None else image]
        query = self.selection.query if query is None else query
        direction = self.selection.direction
        key = (label, image_id, query, direction)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        src = self.sources[label]
        if direction == "key":  # the reverse view: the clicked token's column
            if not hasattr(src, "columns"):
                raise _error(f"{label!r} has no reverse view")
            rows = src.columns(image_id, query)
        else:
            rows = src.rows(image_id, query)
        if rows.image_id != image_id:
            raise _error(f"{label!r} returned maps of image {rows.image_id} for image {image_id}; refusing to draw them")
        self._cache[key] = rows
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return rows

    def _view_rows(self, label: str) -> ModelRows:
        """:meth:`rows`; in the reverse view, a model without one gets empty rows with the reason as a note."""
        try:
            return self.rows(label)
        except ExploreError as err:
            if self.selection.direction != "key":
                raise
            return self._empty_rows(label, str(err))

    def _empty_rows(self, label: str, note: str) -> ModelRows:
        src = self.sources[label]
        n_l, n_h, (gh, gw) = len(src.layer_labels), src.num_heads, src.grid
        return ModelRows(label, self.image_id, np.full((n_l, n_h, gh, gw), np.nan, np.float32),
                         np.full((n_l, n_h, len(src.prefix_kinds)), np.nan, np.float32), None,
                         np.full((n_l, 2), -1), notes=[note])

    def agreement(self) -> dict[str, dict[str, np.ndarray]]:
        """Per student: ``js`` and ``topk`` per reference layer (rows averaged over the heads each layer has, pruned
        heads left out as in the panels) and ``js_head`` / ``topk_head`` (the selected head, where both models' layers
        have it); NaN where not comparable."""
        ref = self._view_rows(self.reference)
        out = {}
        n_l = len(self.sources[self.reference].layer_labels)
        for label in self.sources:
            if label == self.reference:
                continue
            r = self._view_rows(label)
            res = {k: np.full(n_l, np.nan) for k in ("js", "topk", "js_head", "topk_head")}
            same_keys = _keys(self.sources[self.reference]) == _keys(self.sources[label])
            if same_keys and ref.tokens is not None and r.tokens is not None and ref.tokens.shape[-1] == r.tokens.shape[-1]:
                k = max(1, int(round(TOPK * ref.tokens.shape[-1])))
                layers = [self.model_layer(label, l) for l in range(n_l)]
                t = normalise_rows(ref.tokens)  # (layer, head, T)
                s = normalise_rows(r.tokens)  # (layer, head, T); its `layers` are at the reference's depths
                pairs = [("js", "topk", _head_mean(t, ref, range(n_l)), _head_mean(s, r, layers))]
                s = s[layers]
                h = self.selection.head
                if h is not None and h < min(t.shape[1], s.shape[1]):
                    pairs.append(("js_head", "topk_head", t[:, h], s[:, h]))
                for js, topk, a, b in pairs:  # (layer, T) each
                    ok = ~(np.isnan(a).any(-1) | np.isnan(b).any(-1))
                    if ok.any():
                        res[js][ok], res[topk][ok] = row_js(a[ok], b[ok]), row_topk_overlap(a[ok], b[ok], k)
            out[label] = res
        return out

    # ------------------------------------------------------------------ the view
    def exclude_query_for(self, label: str) -> bool:
        """Whether ``label``'s colour range leaves out the query's own token (default: for saliency maps)."""
        flag = self.selection.exclude_query
        return self.sources[label].measure == "gradient saliency" if flag is None else bool(flag)

    def view(self) -> dict:
        """The current view as numpy arrays (what the widget draws and :func:`~workbench.explore.snapshot.draw`
        redraws): per model its panel map on its own grid, the image id it was computed on, outline, pruned flag,
        colour range and units; the strip model's layer x head maps; the agreement strip; the image."""
        sel = self.selection
        panels = []
        for label, src in self.sources.items():
            rows = self._view_rows(label)
            l = self.model_layer(label)
            p = panel_map(rows, l, sel.head, src.layer_labels[l])
            if rows.notes and sel.direction == "key":
                p["note"] = "; ".join(rows.notes)
            panels.append(dict(label=label, measure=src.measure, units=src.units, layer=src.layer_labels[l],
                               image_id=rows.image_id, map=np.asarray(p["map"], np.float32),
                               prefix=np.asarray(p["prefix"], np.float32), prefix_kinds=list(src.prefix_kinds),
                               outline=p["outline"], pruned=p["pruned"], cell=rows.query_cell[l].tolist(),
                               cell_size=rows.cell_size[l].tolist() if rows.cell_size is not None else [1, 1],
                               exclude_query=self.exclude_query_for(label), self_value=None, note=p["note"],
                               heads=rows.num_heads_at(l), diverging=False))
        if sel.difference:
            ref_keys = _keys(self.sources[self.reference])
            differences(panels, [_keys(src) == ref_keys for src in self.sources.values()])
        colour_ranges(panels, sel.scale)
        strip_rows = self._view_rows(sel.strip)
        agreement = self.agreement()
        for src in self.sources.values():  # the view is computed: background work may start (a live FAR's queries)
            if hasattr(src, "start_background"):
                src.start_background()
        strip_src = self.sources[sel.strip]
        n_sl = len(strip_src.layer_labels)
        q = sel.query
        ref = self.sources[self.reference]
        if q[0] == "patch":
            gh, gw = ref.grid
            qlabel = f"patch ({min(gh - 1, int(q[1] * gh))}, {min(gw - 1, int(q[2] * gw))})"
        else:
            qlabel = f"{q[0]} token"
        if sel.direction == "key":
            qlabel = f"key {qlabel} (which queries attend to it)"
        return dict(image=self.images.display[sel.image], image_id=self.image_id, query=q, query_label=qlabel,
                    layer=sel.layer, head=sel.head, scale=sel.scale, panels=panels, agreement=agreement,
                    ref_layers=list(ref.layer_labels), strip_label=sel.strip, strip=strip_rows.maps,
                    strip_image_id=strip_rows.image_id, strip_layers=list(strip_src.layer_labels),
                    strip_layer=self.model_layer(sel.strip),
                    strip_heads=[strip_rows.num_heads_at(i) for i in range(n_sl)],
                    strip_pruned=strip_rows.pruned if strip_rows.pruned is not None else
                    np.zeros(strip_rows.maps.shape[:2], bool), units={p["label"]: p["units"] for p in panels},
                    heads_at=self.heads_at())

    def payload(self) -> tuple[dict, dict[str, bytes]]:
        """What the browser receives for the current selection: a JSON-able dict and binary buffers.

        Buffers: ``panels`` float16 (each panel's map on its grid, concatenated in model order; NaN = no value),
        ``outlines`` uint8 (0/1 per panel cell, for panels with an outline), ``strip`` uint8 (layer x head
        thumbnails of the strip model, each scaled to its own max; 255 = NaN), ``strip_max`` float16 (those maxima).
        Every panel and the strip carry the id of the image their maps were computed on (the view refuses to draw
        a map over another image).
        """
        v = self.view()
        panels, outlines, meta = [], [], []
        for p in v["panels"]:
            m = p["map"]
            panels.append(m.astype(np.float16).ravel())
            if p["outline"] is not None:
                outlines.append(p["outline"].astype(np.uint8).ravel())
            meta.append(dict(label=p["label"], measure=p["measure"], units=p["units"], layer=p["layer"],
                             image_id=p["image_id"], grid=list(m.shape), vmin=_num(p["vmin"]), vmax=_num(p["vmax"]),
                             prefix=[_num(x) for x in np.asarray(p["prefix"]).ravel().tolist()],
                             prefix_kinds=p["prefix_kinds"], outline=p["outline"] is not None, pruned=p["pruned"],
                             cell=p["cell"], cell_size=p["cell_size"], exclude_query=p["exclude_query"],
                             self_value=None if p["self_value"] is None else _num(p["self_value"]), note=p["note"],
                             heads=p["heads"], diverging=p["diverging"]))
        strip = v["strip"]  # (L, H, gh, gw)
        with _quiet():
            smax = np.nanmax(strip.reshape(*strip.shape[:2], -1), -1)  # (L, H)
        smax = np.where(np.isfinite(smax) & (smax > 0), smax, 1.0)
        thumbs = np.where(np.isnan(strip), 255, np.clip(np.round(254 * strip / smax[..., None, None]), 0, 254))
        state = dict(
            image_id=v["image_id"], query=list(v["query"]), query_label=v["query_label"], layer=v["layer"],
            head=v["head"], scale=v["scale"], difference=self.selection.difference, panels=meta, ref_layers=v["ref_layers"], heads_at=v["heads_at"],
            strip=dict(label=v["strip_label"], image_id=v["strip_image_id"], shape=list(strip.shape),
                       layers=v["strip_layers"], layer=v["strip_layer"], heads=v["strip_heads"],
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


def _head_mean(rows_n: np.ndarray, rows: ModelRows, layers) -> np.ndarray:
    """``(len(layers), T)``: the mean of normalised rows ``(layer, head, T)`` over the heads each layer has that are
    not pruned (all of them where every one is), as the panels average them."""
    layers = list(layers)
    n_h = rows_n.shape[1]
    have = np.arange(n_h)[None, :] < np.array([rows.num_heads_at(l) for l in layers])[:, None]  # (layer, head)
    keep = have.copy()
    if rows.pruned is not None:
        active = have & ~rows.pruned[layers]
        keep = np.where(active.any(1, keepdims=True), active, have)
    with _quiet():
        return np.nanmean(np.where(keep[..., None], rows_n[layers], np.nan), 1)
