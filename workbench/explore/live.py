"""Live models for the explorer: one forward per image keeps what the hook points give; a click slices it.

For a model with attention (teacher ViT / DeiT, Sparsifiner, Non-deep, Swin / SlimSwin) the image's first
click runs the matching extractor of :mod:`workbench.analysis` once (one hooked forward pass: every layer's
probabilities for every query), and every later click on that image reads rows from it
(:class:`~workbench.explore.rows.DatasetReader`, the same code that reads stores). For FAR, which has no
attention, a click computes the clicked query's dependency rows only (:func:`workbench.explore.lazy.query_rows`:
one LSTM adjoint recurrence for every layer and head together, then one vector-Jacobian product per head), from
each block's mixer input kept at the image's first click (``blocks.{i}.hook_mixer_in``, one forward), and starts
every query's dependency of the image in a background thread (``dependency="lazy"``, the default); once that is
done, clicks slice it. ``dependency="query"`` computes the clicked query each time and nothing in the background;
``dependency="image"`` runs the ``dependency`` extractor for every query at the image's first click.

Which extractor shows a model is asked of the extractors' registrations (:func:`workbench.analysis.explore_kind_of`:
the first :class:`~workbench.analysis.ExploreKind` whose hook-point patterns the model has); a kind's own needs
come with it (SlimSwin's gated attention gets timm's ``hook_pattern`` from the ``window_attention`` kind's
``prepare``, its pruned pairs from its ``masks``).
"""

from __future__ import annotations

import json
import threading
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import xarray as xr

from workbench.analysis import explore_kind_of, explore_kinds, get_extractor, hook_names
from workbench.analysis.dependency import block_inputs
from workbench.analysis.tokens import vit_token_layout
from workbench.explore.lazy import Background, query_rows
from workbench.explore.rows import DatasetReader, ExploreError, ModelRows, Query

__all__ = ["LiveModel", "detect_kind"]


def detect_kind(model: nn.Module) -> str:
    """Which map the explorer shows for ``model``: the registered kind whose hook points it has
    (:func:`workbench.analysis.explore_kind_of`).

    Raises:
        ExploreError: a model no registered kind shows (e.g. a CNN without stage hook points), with a kind's hint
            where one knows why (SlimSwin's pruned deploy form).
    """
    kind = explore_kind_of(model)
    if kind is not None:
        return kind
    kinds = explore_kinds()
    for spec in kinds.values():
        why = spec.hint(model) if spec.hint is not None else None
        if why:
            raise ExploreError(why)
    names = hook_names(model)
    wanted = "; ".join(f"{name}: {' or '.join(spec.hooks)}" for name, spec in kinds.items())
    raise ExploreError(f"{type(model).__name__} has no token-to-token maps the explorer can show (no hook point of a "
                       f"registered kind — {wanted}); its hook points: {', '.join(names[:5]) or 'none'}")


def _tag(ds: xr.Dataset, image_id: str) -> xr.Dataset:
    """``ds`` (one sample) labelled with its image: sample coord = dataset index, attr ``data``."""
    dataset, _, index = image_id.rpartition("[")
    i = int(index.rstrip("]"))
    return ds.assign_coords(sample=[i]).assign_attrs(data=json.dumps({"dataset": dataset, "indices": [i]}))


class LiveModel:
    """A loaded model serving :class:`ModelRows` for the explorer's images.

    Args:
        label: the model's label.
        model: eval-mode model.
        images: ``(B, C, H, W)`` normalised images (the explorer's), on the model's device.
        ids: ``dataset[index]`` of each image.
        dependency: FAR's dependency rows: ``lazy``, ``query`` or ``image`` (module docstring).
        agreement: Sparsifiner: also compute its masks' mass-agreement summaries at an image's first click
            (``sparse_attention``'s ``agreement``); off by default: the explorer does not show them, and at 577 tokens
            they are most of a first click (~5 s of ~7 s on a 2-core CPU).
    """

    def __init__(self, label: str, model: nn.Module, images: torch.Tensor, ids: list[str],
                 dependency: Literal["lazy", "query", "image"] = "lazy", agreement: bool = False):
        if dependency not in ("lazy", "image", "query"):
            raise ExploreError(f"dependency must be 'lazy' (the clicked query at once, the image's other queries in "
                               f"the background), 'query' (the clicked query only, each click) or 'image' (every "
                               f"query of an image at its first click), got {dependency!r}")
        self.per_query = dependency in ("lazy", "query")
        self.lazy = dependency == "lazy"
        if model.training:
            raise ExploreError(f"{label!r} is in training mode; call model.eval() (dropout would change the maps)")
        self.label, self.model, self.images, self.ids = label, model, images, list(ids)
        self.agreement = agreement  # Sparsifiner: also its masks' mass-agreement summaries (not shown; seconds a click)
        self.kind = detect_kind(model)
        self.spec = explore_kinds()[self.kind]
        self.measure = self.spec.label
        self._readers: dict[str, DatasetReader] = {}  # image id -> its maps, the most recent last
        self.keep_images = 2  # images whose maps are kept (going back to the previous image is free)
        self._inputs: dict[str, list[torch.Tensor]] = {}  # image id -> its blocks' mixer inputs (FAR)
        self._jobs: dict[str, Background] = {}  # image id -> every query's dependency, computing or done
        self._lock = threading.Lock()
        self._pending: list[str] = []  # images whose every-query dependency waits for start_background()
        if self.kind == "dependency" and self.per_query:
            layout = vit_token_layout(model, tuple(images.shape[-2:]))
            self.prefix_kinds, self.grid = layout.prefix_kinds, layout.grid
            self.layout = layout
            self.layer_labels = [str(i) for i in range(len(model.blocks))]
            self.num_heads = max(int(getattr(b.attn, "num_heads", 1)) for b in model.blocks)
            self.heads_per_layer = np.array([int(getattr(b.attn, "num_heads", 1)) for b in model.blocks])
            self.units = "gradient L2 norm w.r.t. LN1(x_l)"
            self.branches = False
        else:  # one forward on the first image gives the layout
            r = self.reader(self.ids[0])
            self.prefix_kinds, self.grid, self.layer_labels = r.prefix_kinds, r.grid, r.layer_labels
            self.num_heads, self.units, self.branches = r.num_heads, r.units, r.branches
            self.heads_per_layer = getattr(r, "heads_per_layer", None)

    def _index(self, image_id: str) -> int:
        if image_id not in self.ids:
            raise ExploreError(f"{self.label!r} has no image {image_id} (its images: {', '.join(self.ids[:4])}, ...)")
        return self.ids.index(image_id)

    def reader(self, image_id: str) -> DatasetReader:
        """The extractor's Dataset of one image, computed on first use (one forward pass)."""
        if image_id not in self._readers:
            i = self._index(image_id)
            options = {"agreement": self.agreement} if self.kind == "sparse_attention" else {}
            ds = get_extractor(self.kind)(self.model, self.images[i:i + 1], **options)  # FAR: every query's saliency
            ds = _tag(ds, image_id)
            masks = self.spec.masks(self.model) if self.spec.masks is not None else None
            self._readers[image_id] = DatasetReader(self.label, ds, masks)
            while len(self._readers) > self.keep_images:  # memory stays bounded: the oldest image goes
                self._readers.pop(next(iter(self._readers)))
        return self._readers[image_id]

    def rows(self, image_id: str, query: Query) -> ModelRows:
        if self.kind != "dependency" or not self.per_query:
            return self.reader(image_id).rows(image_id, query)
        return self._dependency_rows(image_id, query)

    def columns(self, image_id: str, key: Query) -> ModelRows:
        """The reverse view (:meth:`DatasetReader.columns`). A lazy FAR needs every query of the image: until its
        background work is done this says so (and starts it)."""
        if self.kind != "dependency" or not self.per_query:
            return self.reader(image_id).columns(image_id, key)
        with self._lock:
            full = self._readers.get(image_id)
        if full is None:
            if self.lazy and image_id not in self._jobs:
                self._block_inputs(image_id)
                self._pending.append(image_id)
            raise ExploreError(f"{self.label!r}: the reverse view needs every query's dependency of this image"
                               + (", being computed in the background; click again shortly" if self.lazy else
                                  " (dependency='query' computes one query per click)"))
        return full.columns(image_id, key)

    def _dependency_rows(self, image_id: str, query: Query) -> ModelRows:
        with self._lock:
            full = self._readers.get(image_id)
        if full is not None:  # every query of this image is done
            return full.rows(image_id, query)
        inputs = self._block_inputs(image_id)
        lay = self.layout
        gh, gw = lay.grid
        if query[0] == "patch":
            y, x = min(gh - 1, int(query[1] * gh)), min(gw - 1, int(query[2] * gw))
            q = lay.num_prefix + y * gw + x
        else:
            if query[0] not in lay.prefix_kinds:
                raise ExploreError(f"{self.label!r} has no {query[0]!r} token (prefix tokens: {list(lay.prefix_kinds)})")
            q = lay.prefix_kinds.index(query[0])
        row = query_rows(self.model.blocks, inputs, q)  # (layer, head, T)
        if self.lazy and image_id not in self._jobs:
            self._pending.append(image_id)  # started by start_background(), once the view that asked is answered
        return DatasetReader(self.label, self._dependency_ds(image_id, row[:, :, None], [q])).rows(image_id, query)

    def start_background(self) -> None:
        """Start computing every query of the image last clicked (FAR, ``dependency="lazy"``), if not yet started.

        :meth:`ExploreState.view` calls this after the view is computed, so the background work does not slow the
        click that asked for it."""
        pending, self._pending = self._pending, []
        for image_id in dict.fromkeys(pending):
            if image_id not in self._jobs and image_id in self._inputs:
                self._jobs[image_id] = Background(self.model.blocks, self._inputs[image_id],
                                                  lambda full, i=image_id: self._finished(i, full))

    def _block_inputs(self, image_id: str) -> list[torch.Tensor]:
        """Each block's mixer input for the image (one forward, kept for ``keep_images`` images)."""
        if image_id not in self._inputs:
            i = self._index(image_id)
            with torch.no_grad():
                self._inputs[image_id] = block_inputs(self.model, self.images[i:i + 1], wrt="mixer_input")
            while len(self._inputs) > self.keep_images:  # the oldest image goes, and its background work stops
                old = next(iter(self._inputs))
                self._inputs.pop(old)
                job = self._jobs.pop(old, None)
                if job is not None:
                    job.cancel()
                with self._lock:
                    self._readers.pop(old, None)
        return self._inputs[image_id]

    def _finished(self, image_id: str, full: np.ndarray) -> None:
        """The background's every-query dependency ``(layer, head, T, T)`` of an image, kept as a reader."""
        reader = DatasetReader(self.label, self._dependency_ds(image_id, full, None))
        with self._lock:
            if image_id in self._inputs:
                self._readers[image_id] = reader

    def _dependency_ds(self, image_id: str, rows: np.ndarray, queries: list[int] | None) -> xr.Dataset:
        """A ``dependency`` Dataset of one image from ``(layer, head, Q, T)`` rows (``queries``: None = all T)."""
        lay = self.layout
        qcoords = {k: (d, v if queries is None else v[queries]) for k, (d, v) in lay.coords("query").items()}
        ds = xr.Dataset({"dependency": (("sample", "layer", "head", "query", "key"), rows[None])},
                        coords={"sample": [0], "layer": np.arange(rows.shape[0]), "head": np.arange(rows.shape[1]),
                                **qcoords, **lay.coords("key")})
        ds["dependency"].attrs["units"] = self.units
        return _tag(ds.assign_attrs(analysis="dependency"), image_id)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the background work (FAR: every query of the images clicked); True when all is done."""
        return all(job.wait(timeout) for job in list(self._jobs.values()))
