"""Paired activations from zarr stores: a crosscoder trained in bounded memory on activations written once.

``workbench analyze activations --model M --layers L --images SPEC --out M.zarr`` streams one model's block output
into a chunked zarr store (:mod:`workbench.analysis.activations`; resumable, ``torchrun``-sharded, float16 on
request: :mod:`workbench.scale.stream`). Two such stores, the teacher's and the student's at corresponding blocks
over the same images, replace the images as the crosscoder's training source (:func:`stored_batches`, fed to
:func:`workbench.features.train.fit_crosscoder`; ``workbench features --teacher-activations T.zarr
--student-activations S.zarr``). The activations are computed once however many crosscoders (widths, k, seeds) are
trained on them.

Order: an epoch visits the store's chunks in a seeded random order, ``buffer_chunks`` at a time; the images of those
chunks, with what was left from the previous ones, are shuffled (seeded by seed, epoch and group) and cut into
batches of ``batch_images`` images, all their tokens one batch. Memory holds ``buffer_chunks`` chunks of both
models' rows, whatever the number of images; every epoch has ``ceil(n / batch_images)`` batches, the last one
short; resuming at batch ``start`` re-reads the groups before it and skips their batches, so an interrupted
training ends where an uninterrupted one does (:mod:`workbench.features.train`). The shuffle is local to the buffer,
not the images' order of :func:`workbench.features.pairs.image_batches`: the two sources train equally good but not
identical crosscoders (``tests/test_features_store.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np
import torch
import xarray as xr

from workbench.features.train import BatchFn
from workbench.scale.chunked import read_layout
from workbench.store import StoreError, open_store

__all__ = ["open_activations", "stored_batches"]


def _weights_differ(attrs: Mapping, source) -> str | None:
    """Why the store's model is not ``source`` (a :class:`~workbench.provenance.ModelSource`), or None."""
    stored = {k: attrs.get(k) for k in ("model_name", "weights_sha256", "checkpoint_sha256")}
    now = {"model_name": source.name, "weights_sha256": getattr(source, "weights_sha256", None),
           "checkpoint_sha256": source.checkpoint_sha256}
    keys = ["weights_sha256"] if stored["weights_sha256"] and now["weights_sha256"] else ["model_name", "checkpoint_sha256"]
    diffs = [f"{k} {stored[k]!r} in the store vs {now[k]!r}" for k in keys if str(stored[k]) != str(now[k])]
    return "; ".join(diffs) or None


def open_activations(stores: Mapping[str, str | Path], hooks: Mapping[str, str],
                     sources: Mapping[str, object] | None = None) -> dict[str, xr.DataArray]:
    """Label -> the lazily opened ``(sample, token, channel)`` activations at ``hooks[label]`` in ``stores[label]``.

    Args:
        stores: label (teacher first) -> a complete ``activations`` zarr store.
        hooks: label -> the hook point the crosscoder pairs (:func:`~workbench.features.pairs.paired_hooks`).
        sources: label -> the model's :class:`~workbench.provenance.ModelSource`, checked against the store's (its
            weights' sha256, else its name and checkpoint); None: not checked.

    Raises:
        ValueError: a missing, incomplete or damaged store, one of another analysis, model or hook point, or stores
            over different images, token grids or chunks.
    """
    out, attrs = {}, {}
    for label, path in stores.items():
        try:
            ds = open_store(path)
        except StoreError as err:
            raise ValueError(f"{label} activations: {err}") from None
        where = f"{label} activations {str(path)!r}"
        if ds.attrs.get("analysis") != "activations":
            raise ValueError(f"{where} holds {ds.attrs.get('analysis')!r}, not activations; write it with `workbench "
                             f"analyze activations --model ... --layers ... --out {path}`")
        if sources is not None and (why := _weights_differ(ds.attrs, sources[label])):
            raise ValueError(f"{where} was written from another model than the {label} given ({why}); pass the "
                             "store of this model, or the model the store was written from")
        names = list(ds.hook.values)
        if hooks[label] not in names:
            raise ValueError(f"{where} has blocks {names}, not {hooks[label]!r}, the block the crosscoder pairs; write "
                             f"it with --layers naming that block, or pick the block with --block")
        out[label] = ds.activation.isel(layer=names.index(hooks[label]))
        attrs[label] = (ds.attrs.get("data"), read_layout(path)[0].chunk, out[label].sizes["token"])
    first = next(iter(stores))
    for label in stores:
        if json.loads(attrs[label][0] or "null") != json.loads(attrs[first][0] or "null"):
            raise ValueError(f"the {label} and {first} activation stores cover different images; write both from the "
                             "same --images")
        if attrs[label][1:] != attrs[first][1:]:
            raise ValueError(f"the {label} and {first} activation stores differ in chunk or token count "
                             f"({attrs[label][1:]} vs {attrs[first][1:]}: chunk, tokens); write both with the same "
                             "--chunk, at blocks that share a token grid")
    return out


def stored_batches(arrays: Mapping[str, xr.DataArray], chunk: int, batch_images: int, *, seed: int,
                   buffer_chunks: int = 8) -> tuple[BatchFn, int]:
    """``(batches, steps per epoch)`` over stored activations (module docstring: the order), for
    :func:`~workbench.features.train.fit_crosscoder`: each batch a per-model list of ``(images·tokens, channels)``
    float32 rows.

    Args:
        arrays: label -> ``(sample, token, channel)`` activations (:func:`open_activations`), all over one image set.
        chunk: images per store chunk (the unit read at once).
        batch_images: images per batch.
        seed: the order's seed (the crosscoder's).
        buffer_chunks: chunks shuffled together (memory: this many chunks of every model's rows).
    """
    n = next(iter(arrays.values())).sizes["sample"]
    n_chunks = -(-n // chunk)

    def batches(epoch: int, start: int) -> Iterator[list[torch.Tensor]]:
        g = torch.Generator().manual_seed(seed * 100_003 + epoch)
        order = torch.randperm(n_chunks, generator=g).tolist()
        left: list[np.ndarray] = [np.zeros((0,) + a.shape[1:], np.float32) for a in arrays.values()]
        done = 0
        for lo in range(0, n_chunks, buffer_chunks):
            parts = [[np.asarray(a[c * chunk:min(n, (c + 1) * chunk)], np.float32) for c in order[lo:lo + buffer_chunks]]
                     for a in arrays.values()]  # per model: the group's chunks, each (images, token, channel)
            perm = torch.randperm(sum(len(p) for p in parts[0]), generator=g).cpu().numpy()
            pool = [np.concatenate([rest, np.concatenate(p)[perm]]) for rest, p in zip(left, parts)]
            last = lo + buffer_chunks >= n_chunks
            cut = len(pool[0]) if last else len(pool[0]) // batch_images * batch_images
            for b in range(0, cut, batch_images):
                if done >= start:
                    yield [torch.from_numpy(p[b:b + batch_images]).flatten(0, 1) for p in pool]  # (images·token, ch)
                done += 1
            left = [p[cut:] for p in pool]

    return batches, math.ceil(n / batch_images)
