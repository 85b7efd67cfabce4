"""One model's maps for one clicked query, on its own patch grid, read from an extractor's Dataset (no torch).

Every map the explorer shows is a row of a token-to-token map, ``map[sample, layer, head, query, :]``,
for every layer and head at once, placed on the model's patch grid. Which analyses those are, the variable holding
the map, what it measures and how its keys are laid out come from the extractors' registrations
(:class:`workbench.analysis.ExploreKind`); those of the workbench:

- ``attention`` (teacher ViT / DeiT, Non-deep collapsed, Non-deep branched: ``(layer, branch)`` become one
  row of the strip each) — attention probabilities;
- ``dependency`` (FAR) — gradient saliency ``‖∂Σ_c y_q / ∂u_k‖`` (:mod:`workbench.analysis.dependency`);
- ``sparse_attention`` (Sparsifiner) — the sparse attention multiplied into V, and its connectivity mask
  (kept keys, outlined);
- ``window_attention`` (Swin, SlimSwin) — the query's window's attention placed on the stage map (keys outside
  the window are NaN: not attended), the window outlined, the map repeated onto the finest (stage-0) grid,
  and, with a ``window_saliency`` Dataset's ``mask``, the pruned (window, head) pairs of the query's window;
- ``at_maps`` (AttentionLite's CNN teacher and SA-ResNet students) — attention-transfer maps ψ of every residual
  stage on the input pixels (a stage is a layer with one head); the same for every query.

A :class:`ModelRows` carries the id of the image its rows belong to (``dataset[index]``), so the state can
refuse to draw a map over another image. Dataset readers (:class:`DatasetReader`) hold index tables built
once, so a click is numpy slicing (and for a store on disk, one hyperslab read per variable).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal, Union

import numpy as np
import xarray as xr

from workbench.analysis import explore_kinds

__all__ = ["Query", "ModelRows", "DatasetReader", "image_ids", "ExploreError"]

#: a query token: ``("patch", fy, fx)`` a position in the image as fractions of its height and width (the centre
#: of the clicked cell), or ``("cls",)`` / ``("dist",)`` a prefix token.
Query = Union[tuple[Literal["patch"], float, float], tuple[str]]


class ExploreError(ValueError):
    """Bad input to the explorer: what is wrong and how to fix it."""

    def _render_traceback_(self) -> list[str]:
        """IPython's hook: a notebook shows the message alone, not a traceback (the input is wrong, not the code)."""
        return [f"ExploreError: {self}"]


@dataclass
class ModelRows:
    """One model's rows for one (image, query), every layer and head.

    Attributes:
        label: the model's label.
        image_id: ``dataset[index]`` of the image these rows were computed on.
        maps: ``(layer, head, gh, gw)`` float32 values on the patch keys (NaN: a head the layer does not have, or
            a key outside the query's window).
        prefix: ``(layer, head, P)`` values on the prefix keys (CLS, dist), in ``prefix_kinds`` order.
        tokens: ``(layer, head, T)`` the full rows in token order (prefix first), for agreement; for window
            attention the row over the query's window's keys (comparable between a Swin and its pruned copy).
        query_cell: ``(layer, 2)`` the query's (row, column) on ``maps``' grid per layer; ``-1`` for a prefix query.
        outline: ``(layer, head, gh, gw)`` bool keys to outline (Sparsifiner's kept keys, Swin's window) or None.
        pruned: ``(layer, head)`` bool pruned (window, head) pairs of the query's window (SlimSwin) or None.
        heads: ``(layer,)`` how many heads each layer has (head slots past that are padding), or None: all of them.
        cell_size: ``(layer, 2)`` cells of ``maps`` one token covers (a coarser Swin stage repeated onto the finest
            grid), or None: one.
    """

    label: str
    image_id: str
    maps: np.ndarray
    prefix: np.ndarray
    tokens: np.ndarray | None
    query_cell: np.ndarray
    outline: np.ndarray | None = None
    pruned: np.ndarray | None = None
    notes: list[str] = field(default_factory=list)
    heads: np.ndarray | None = None
    cell_size: np.ndarray | None = None

    def num_heads_at(self, layer: int) -> int:
        """Heads layer ``layer`` has."""
        return int(self.heads[layer]) if self.heads is not None else int(self.maps.shape[1])


def image_ids(ds: xr.Dataset) -> list[str]:
    """``dataset[index]`` of every sample of a stamped Dataset (attr ``data``; sample coords are dataset indices)."""
    data = ds.attrs.get("data")
    try:
        dataset = json.loads(data)["dataset"] if isinstance(data, str) else None
    except (ValueError, KeyError, TypeError):
        dataset = None
    if dataset is None:
        raise ExploreError("the Dataset carries no image provenance (attr 'data'), so its maps cannot be tied to "
                           "their images; stamp it with workbench.provenance.stamp(ds, model_source, batch.source)")
    return [f"{dataset}[{int(i)}]" for i in ds["sample"].values]


def _cell(fy: float, fx: float, h: int, w: int) -> tuple[int, int]:
    """The cell of an ``h x w`` grid holding the image position (fy, fx) (fractions of height and width)."""
    return min(h - 1, max(0, int(np.floor(fy * h)))), min(w - 1, max(0, int(np.floor(fx * w))))


class DatasetReader:
    """Serves :class:`ModelRows` from one extractor Dataset (in memory or a lazily opened store).

    Args:
        label: the model's label (for messages).
        ds: an ``attention``, ``dependency``, ``sparse_attention`` or ``window_attention`` Dataset, stamped.
        masks: for ``window_attention``: a ``window_saliency`` Dataset whose ``mask(pair)`` marks active pairs
            (SlimSwin), or ``(layer) -> (window, head)`` bool arrays; None when nothing is pruned.

    Raises:
        ExploreError: a Dataset of another kind, or without the map variable the view needs.
    """

    def __init__(self, label: str, ds: xr.Dataset, masks=None):
        kind = ds.attrs.get("analysis")
        kinds = explore_kinds(load=False)  # the extractors' registrations (no torch)
        if kind not in kinds:
            have = ", ".join(v for v in ds.data_vars if "query" in ds[v].dims) or "no token-to-token map"
            raise ExploreError(f"{label!r}: the store holds analysis {kind!r} ({have}); the explorer needs one of "
                               f"{', '.join(sorted(kinds))} — run `workbench analyze {'|'.join(sorted(kinds))} ...` for "
                               "this model")
        spec = kinds[kind]
        var, self.measure, self.layout, self.outline = spec.variable, spec.label, spec.layout, spec.outline
        if var not in ds:
            raise ExploreError(f"{label!r}: the {kind!r} store has no {var!r} variable (variables: {list(ds.data_vars)}); "
                               "it is not an extractor's output or was cut down — re-run the analysis")
        self.label, self.ds, self.kind, self.var = label, ds, kind, var
        self._arrays: dict = {}
        source = ds.encoding.get("source")
        self._source = str(source) if source and str(source).endswith(".nc") else None
        self._disk_dims = {v: ds[v].dims for v in ds.data_vars}
        self._h5 = None
        self.units = str(ds[var].attrs.get("units", ""))
        self.ids = image_ids(ds)
        if self.layout == "windows":
            self._init_window(masks)
        elif self.layout == "stages":
            self._init_at()
        else:
            self._init_vit()

    def array(self, var: str):
        """``var`` as something numpy-indexable in the reader's dim order: the in-memory array, or for a store on
        disk its HDF5 dataset (one hyperslab read per click; xarray's lazy indexing costs ~5 ms more per read)."""
        if var not in self._arrays:
            da = self.ds[var]
            if self._source is None:
                self._arrays[var] = da.values  # in memory already
            elif self._disk_dims.get(var) == da.dims:
                import h5py

                if self._h5 is None:
                    self._h5 = h5py.File(self._source, "r")
                self._arrays[var] = self._h5[var]
            else:
                self._arrays[var] = da  # transposed view of a store: xarray's lazy indexing
        return self._arrays[var]

    # ------------------------------------------------------------------ ViT-like token maps
    def _init_vit(self) -> None:
        ds = self.ds
        kk = ds["key_kind"].values.astype(str)
        self.prefix_kinds = tuple(kk[kk != "patch"].tolist())
        ky, kx = ds["key_y"].values, ds["key_x"].values
        self.grid = (int(ky.max()) + 1, int(kx.max()) + 1)
        self.patch_keys = np.flatnonzero(kk == "patch")
        self.patch_yx = (ky[self.patch_keys], kx[self.patch_keys])
        self.prefix_keys = np.flatnonzero(kk != "patch")
        qk = ds["query_kind"].values.astype(str)
        qy, qx = ds["query_y"].values, ds["query_x"].values
        self.query_index = {(str(k), int(y), int(x)): i for i, (k, y, x) in enumerate(zip(qk, qy, qx))}
        self.key_index = {(str(k), int(y), int(x)): i for i, (k, y, x) in enumerate(zip(kk, ky, kx))}
        self.query_patches = np.flatnonzero(qk == "patch")  # the stored query rows that are patches, and where
        self.query_patch_yx = (qy[self.query_patches].astype(int), qx[self.query_patches].astype(int))
        self.query_prefix = [int(np.flatnonzero(qk == k)[0]) if (qk == k).any() else -1 for k in self.prefix_kinds]
        dims = ds[self.var].dims
        self.branches = "branch" in dims
        layers = ds["layer"].values.tolist()
        if self.branches:
            self.layer_labels = [f"{l}·b{b}" for l in layers for b in ds["branch"].values.tolist()]
        else:
            self.layer_labels = [str(l) for l in layers]
        self.order = ("sample", "layer", *(("branch",) if self.branches else ()), "head", "query", "key")
        if tuple(dims) != self.order:
            self.ds = ds.transpose(*self.order, ...)
        self.num_heads = int(ds.sizes["head"])

    def _query_token(self, query: Query) -> int:
        if query[0] == "patch":
            y, x = _cell(query[1], query[2], *self.grid)
            key = ("patch", y, x)
        else:
            key = (query[0], -1, -1)
        if key not in self.query_index:
            have = sorted({k for k, _, _ in self.query_index})
            what = f"patch ({key[1]}, {key[2]})" if key[0] == "patch" else f"the {key[0]!r} token"
            raise ExploreError(f"{self.label!r} has no map row for {what}: its {self.kind!r} data hold "
                               f"{len(self.query_index)} query tokens (kinds {have}); "
                               + ("re-run the analysis with all queries (queries=None)" if self.kind == "dependency"
                                  else "the model has no such token"))
        return self.query_index[key]

    def sample_index(self, image_id: str) -> int:
        if image_id not in self.ids:
            raise ExploreError(f"{self.label!r}: its maps were computed on {', '.join(self.ids[:4])}"
                               f"{', ...' if len(self.ids) > 4 else ''}, not on image {image_id}; refusing to draw "
                               "them over another image (analyse the same images, or pick one they share)")
        return self.ids.index(image_id)

    def rows(self, image_id: str, query: Query) -> ModelRows:
        """Every layer's and head's row of ``query`` on image ``image_id``."""
        s = self.sample_index(image_id)
        if self.layout == "windows":
            return self._window_rows(s, image_id, query)
        if self.layout == "stages":
            return self._at_rows(s, image_id, query)
        q = self._query_token(query)
        row = np.asarray(self.array(self.var)[s, ..., q, :], dtype=np.float32)  # (layer[, branch], head, T)
        row = row.reshape(-1, *row.shape[-2:])  # (layer·branch, head, T)
        n_l, n_h, _ = row.shape
        gh, gw = self.grid
        maps = np.full((n_l, n_h, gh, gw), np.nan, np.float32)
        maps[:, :, self.patch_yx[0], self.patch_yx[1]] = row[:, :, self.patch_keys]
        cell = (-1, -1) if query[0] != "patch" else _cell(query[1], query[2], gh, gw)
        outline = None
        if self.outline is not None and self.outline in self.ds:
            m = np.asarray(self.array(self.outline)[s, ..., q, :], dtype=bool).reshape(n_l, n_h, -1)
            outline = np.zeros((n_l, n_h, gh, gw), bool)
            outline[:, :, self.patch_yx[0], self.patch_yx[1]] = m[:, :, self.patch_keys]
        return ModelRows(self.label, image_id, maps, row[:, :, self.prefix_keys], row,
                         np.tile(np.array(cell), (n_l, 1)), outline)

    def columns(self, image_id: str, key: Query) -> ModelRows:
        """The reverse view: every stored query's value on the key token ``key`` (which queries attend to it), every
        layer and head, placed on the query grid; ``prefix`` holds the prefix queries' values.

        Raises:
            ExploreError: Swin windows and CNN stage maps (no reverse view).
        """
        if self.layout != "tokens":
            raise ExploreError(f"{self.label!r}: no reverse view for {self.kind.replace('_', ' ')} (its keys are a "
                               "window's or a stage's cells); switch back to queries")
        s = self.sample_index(image_id)
        if key[0] == "patch":
            y, x = _cell(key[1], key[2], *self.grid)
            k, cell = self.key_index[("patch", y, x)], (y, x)
        else:
            if (key[0], -1, -1) not in self.key_index:
                raise ExploreError(f"{self.label!r} has no {key[0]!r} token")
            k, cell = self.key_index[(key[0], -1, -1)], (-1, -1)
        col = np.asarray(self.array(self.var)[s, ..., k], dtype=np.float32)  # (layer[, branch], head, Q)
        col = col.reshape(-1, *col.shape[-2:])  # (layer·branch, head, Q)
        n_l, n_h, _ = col.shape
        gh, gw = self.grid
        maps = np.full((n_l, n_h, gh, gw), np.nan, np.float32)
        maps[:, :, self.query_patch_yx[0], self.query_patch_yx[1]] = col[:, :, self.query_patches]
        prefix = np.stack([col[:, :, i] if i >= 0 else np.full((n_l, n_h), np.nan, np.float32)
                           for i in self.query_prefix], -1) if self.query_prefix else np.zeros((n_l, n_h, 0), np.float32)
        notes = [] if len(self.query_patches) == gh * gw else [f"{len(self.query_patches)} of {gh * gw} patch queries stored"]
        return ModelRows(self.label, image_id, maps, prefix, col, np.tile(np.array(cell), (n_l, 1)), notes=notes)

    # ------------------------------------------------------------------ AttentionLite: CNN stage maps
    def _init_at(self) -> None:
        """AT maps ψ (AttentionLite, Zagoruyko & Komodakis): one spatial map per residual stage, on the input pixels,
        the same for every query (a CNN has no query token): a stage is a layer, with one "head"."""
        ds = self.ds.transpose("sample", "stage", "y", "x")
        self.ds = ds
        self.prefix_kinds, self.branches, self.num_heads = (), False, 1
        self.layer_labels = [f"stage {int(s)}" for s in ds["stage"].values]
        self.grid = (int(ds.sizes["y"]), int(ds.sizes["x"]))

    def _at_rows(self, s: int, image_id: str, query: Query) -> ModelRows:
        maps = np.asarray(self.array(self.var)[s], np.float32)[:, None]  # (stage, 1, y, x)
        n_l = maps.shape[0]
        cell = _cell(query[1], query[2], *self.grid) if query[0] == "patch" else (-1, -1)
        return ModelRows(self.label, image_id, maps, np.zeros((n_l, 1, 0), np.float32), maps.reshape(n_l, 1, -1),
                         np.tile(np.array(cell), (n_l, 1)),
                         notes=["attention-transfer maps do not depend on the query"])

    # ------------------------------------------------------------------ Swin window attention
    def _init_window(self, masks) -> None:
        ds = self.ds
        self.prefix_kinds = ()
        self.branches = False
        self.layer_labels = [str(l) for l in ds["layer"].values.tolist()]
        self.map_hw = np.stack([ds["map_h"].values, ds["map_w"].values], 1).astype(int)  # (layer, 2)
        self.grid = (int(self.map_hw[:, 0].max()), int(self.map_hw[:, 1].max()))
        self.num_heads = int(ds.sizes["head"])
        self.heads_per_layer = ds["num_heads"].values.astype(int)
        self.qyx = (ds["query_y"].values, ds["query_x"].values)  # (layer, window, query) on the unshifted stage map
        self.kyx = (ds["key_y"].values, ds["key_x"].values)
        if tuple(ds[self.var].dims) != ("sample", "layer", "window", "head", "query", "key"):
            self.ds = ds.transpose("sample", "layer", "window", "head", "query", "key")
        self.active = None
        if masks is not None:
            self.active = self._active_table(masks)

    def _active_table(self, masks) -> np.ndarray:
        """``(layer, window, head)`` bool: the pair is active (not pruned)."""
        n_l, n_w, n_h = len(self.layer_labels), self.ds.sizes["window"], self.num_heads
        table = np.ones((n_l, n_w, n_h), bool)
        layers = self.ds["layer"].values.tolist()
        if isinstance(masks, xr.Dataset):
            if "mask" not in masks:
                raise ExploreError(f"{self.label!r}: the pruning masks need a 'window_saliency' store with a 'mask' "
                                   f"variable; got variables {list(masks.data_vars)}")
            for l, w, h, on in zip(masks["layer"].values, masks["window"].values, masks["head"].values,
                                   masks["mask"].values.astype(bool)):
                if int(l) in layers:
                    table[layers.index(int(l)), int(w), int(h)] = on
            return table
        for i, layer in enumerate(layers):
            m = np.asarray(masks[layer], dtype=bool)  # (windows, heads) of that layer
            table[i, : m.shape[0], : m.shape[1]] = m
        return table

    def _window_rows(self, s: int, image_id: str, query: Query) -> ModelRows:
        if query[0] != "patch":
            raise ExploreError(f"{self.label!r} is a Swin: it has no {query[0]!r} token; click a patch")
        gh, gw = self.grid
        n_l, n_h = len(self.layer_labels), self.num_heads
        maps = np.full((n_l, n_h, gh, gw), np.nan, np.float32)
        outline = np.zeros((n_l, n_h, gh, gw), bool)
        pruned = np.zeros((n_l, n_h), bool) if self.active is not None else None
        cells, sizes = np.zeros((n_l, 2), int), np.ones((n_l, 2), int)
        arr = self.array(self.var)
        tokens = np.full((n_l, n_h, arr.shape[-1]), np.nan, np.float32)  # the window's keys, for agreement
        for i in range(n_l):
            h, w = self.map_hw[i]
            y, x = _cell(query[1], query[2], h, w)
            win, q = np.argwhere((self.qyx[0][i] == y) & (self.qyx[1][i] == x))[0]  # the query's window and slot
            row = np.asarray(arr[s, i, win, :, q, :], np.float32)  # (head, N)
            tokens[i] = row
            ky, kx = self.kyx[0][i, win], self.kyx[1][i, win]
            ok = ky >= 0  # padding tokens have no position
            stage = np.full((n_h, h, w), np.nan, np.float32)
            stage[:, ky[ok], kx[ok]] = row[:, ok]
            inside = np.zeros((h, w), bool)
            inside[ky[ok], kx[ok]] = True
            ry, rx = gh // h, gw // w  # repeat a coarser stage map onto the finest grid
            maps[i] = stage.repeat(ry, 1).repeat(rx, 2)
            outline[i] = inside.repeat(ry, 0).repeat(rx, 1)[None]
            cells[i], sizes[i] = (y * ry, x * rx), (ry, rx)
            if pruned is not None:
                pruned[i] = ~self.active[i, win]
                pruned[i, self.heads_per_layer[i]:] = False
        absent = np.arange(n_h)[None, :] >= self.heads_per_layer[:, None]  # (layer, head): slots a layer lacks
        maps[absent], tokens[absent], outline[absent] = np.nan, np.nan, False
        return ModelRows(self.label, image_id, maps, np.zeros((n_l, n_h, 0), np.float32), tokens, cells, outline, pruned,
                         heads=self.heads_per_layer.copy(), cell_size=sizes)
