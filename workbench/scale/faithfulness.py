"""Faithfulness of explanations at dataset scale: ``workbench explain ... --out X.zarr``, chunk by chunk.

:func:`stream_faithfulness` runs :func:`workbench.explain.faithfulness.faithfulness` (Chefer's positive / negative
perturbation for the predicted and the target class, ROAD with ``road=True``) over an image spec one chunk of images
at a time and writes each chunk into its region of a chunked zarr store (:mod:`workbench.scale.chunked`: the
template first, then each chunk and its done marker). Memory is bounded by a chunk (its images, maps and perturbed
batches), not by the number of images, so 50,000 images are a matter of compute. Images are read as
``workbench analyze --out X.zarr`` reads them (:class:`workbench.scale.stream.ImageSource`: a folder file by file).

Per image the store holds the AUCs and curves (no maps): ``auc(explainer, explained, order, sample)``,
``auc_probability``, ``curve``, ``curve_probability``, ``road`` (with ROAD), ``predicted``, ``target``, ``label``.

Resume: rerunning the same command skips the chunks marked done. A store written for another model, weights, image
set, method list or options is refused (:class:`~workbench.scale.stream.StreamError`, naming what differs). Building
the command's flags imports nothing heavy (the stream module, torch, are imported when it runs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr

from workbench.scale.chunked import StreamLayout, chunk_bounds, done_chunks, read_layout, write_chunk, write_template

__all__ = ["stream_faithfulness", "add_stream_flags", "refuse_stream_flags", "cmd_stream", "MATCH"]

#: attrs a resumed run must share with the store
MATCH = ("analysis", "model_name", "checkpoint_sha256", "run", "weights_sha256", "data", "config")


def _template(first: xr.Dataset, layout: StreamLayout, sample_ids: np.ndarray) -> xr.Dataset:
    """``first`` (one chunk's Dataset) grown to every sample as unwritten dask arrays, one zarr chunk per chunk."""
    import dask.array as da

    out = first.drop_vars([v for v, x in first.variables.items() if "sample" in x.dims])
    for name, x in first.data_vars.items():
        if "sample" in x.dims:
            shape = tuple(layout.n_samples if d == "sample" else first.sizes[d] for d in x.dims)
            chunks = tuple(layout.chunk if d == "sample" else first.sizes[d] for d in x.dims)
            out[name] = (x.dims, da.zeros(shape, chunks=chunks, dtype=x.dtype), x.attrs)
    return out.assign_coords(sample=sample_ids).assign_attrs(first.attrs)


def _check_resume(out: Path, attrs: dict, layout: StreamLayout) -> None:
    from workbench.scale.stream import StreamError

    old, stored = read_layout(out)
    diffs = [f"{k}: store {str(stored.get(k))[:80]!r} vs now {str(attrs.get(k))[:80]!r}"
             for k in MATCH if str(stored.get(k)) != str(attrs.get(k))]
    diffs += [f"{k}: store {getattr(old, k)!r} vs now {getattr(layout, k)!r}"
              for k in ("n_samples", "chunk", "options") if getattr(old, k) != getattr(layout, k)]
    if diffs:
        raise StreamError(f"store {str(out)!r} was written with other inputs, so this run cannot resume it: "
                          + "; ".join(diffs) + ". Write to a new --out, or delete the store to recompute it.")


def stream_faithfulness(model: str, images: str, out: str | Path, *, method: str | Sequence[str],
                        checkpoint: str | None = None, device: str = "auto", img_size: int | None = None,
                        seed: int | None = None, road: bool = False, chunk: int = 128, batch_size: int = 32,
                        log=None, **options) -> Path:
    """Stream the faithfulness of ``method``'s explanations of ``model`` over ``images`` into ``out`` (module
    docstring). Returns the store's path.

    Args:
        model: run id/dir or timm name (+ ``checkpoint``; ``seed`` for random weights).
        images: image spec (``demo:val``, a folder, with a slice); labels give the target class (-1: unknown).
        out: ``.zarr`` path; an existing store of the same inputs is resumed.
        road: add ROAD (grad-cam's, nine thresholds; costly: a sparse solve per image and threshold).
        chunk: images per chunk (the unit of memory, writing and resuming); ``batch_size``: images per explainer call.
        log: ``fn(str)`` called once per chunk written (None: quiet).
        options: the explainers' options (e.g. ``n_steps`` of ``ig``).

    Raises:
        StreamError: not a ``.zarr`` path, bad sizes, or a store this run cannot resume.
    """
    import torch

    from workbench.explain.faithfulness import ROAD_PERCENTILES, faithfulness
    from workbench.models import load_model
    from workbench.provenance import config_json, stamp
    from workbench.runtime import resolve_device
    from workbench.scale.stream import ImageSource, StreamError

    out = Path(out).expanduser()
    if out.suffix != ".zarr":
        raise StreamError(f"a streamed store is a .zarr directory; got {str(out)!r}")
    if chunk < 1 or batch_size < 1:
        raise StreamError(f"chunk and batch_size must be >= 1, got {chunk} and {batch_size}")
    names = [method] if isinstance(method, str) else list(method)
    dev = resolve_device(device)
    loaded = load_model(model, checkpoint=checkpoint, device=dev, **({"seed": seed} if seed is not None else {}),
                        **({"img_size": img_size} if img_size else {}))
    source = ImageSource(images, input_size=loaded.input_size, mean=loaded.mean, std=loaded.std)
    layout = StreamLayout(len(source), chunk, "sample", "none", json.dumps({"method": names, "road": road}))
    config = config_json(method=names, road=road, options=options)
    attrs = {**stamp(xr.Dataset(), loaded.source, source.source).attrs, "config": config, "analysis": "faithfulness"}
    if out.exists():
        _check_resume(out, attrs, layout)
    for i in range(layout.n_chunks):
        if out.exists() and i in done_chunks(out):
            continue
        start, stop = chunk_bounds(layout, i)
        items = source.__getitems__(list(range(start, stop)))
        x = torch.stack([t for t, _, _ in items]).to(dev)
        y = torch.as_tensor([lab for _, lab, _ in items], device=dev)
        ds = faithfulness(loaded.model, x, y, method=names, road_percentiles=ROAD_PERCENTILES if road else None,
                          batch_size=batch_size, **options)
        if not out.exists():
            ids = np.asarray(source.source.indices, dtype=np.int64)
            write_template(_template(ds.assign_attrs({**ds.attrs, **attrs}), layout, ids), out, layout)
        write_chunk(out, i, ds, layout)
        if log is not None:
            log(f"chunk {i + 1} of {layout.n_chunks} ({stop} of {layout.n_samples} images) -> {out}")
    return out


def add_stream_flags(p) -> None:
    """The flags ``workbench explain`` takes for a streamed store (``--out X.zarr``)."""
    g = p.add_argument_group("dataset-scale faithfulness (--out X.zarr)")
    g.add_argument("--road", action="store_true", help="add ROAD (grad-cam's metric; a sparse solve per image and "
                                                        "threshold, the costliest part)")
    g.add_argument("--chunk", type=int, default=None, help="images per store chunk: the unit of memory, writing and "
                                                          "resuming (default 128)")
    g.add_argument("--batch-size", type=int, default=None, help="images per explainer call (default 32)")


def refuse_stream_flags(args) -> None:
    """A ``.nc`` explain store takes none of the streamed store's flags: refuse them rather than ignore them."""
    from workbench.scale.stream import StreamError

    given = [f for f, v in (("--road", args.road), ("--chunk", args.chunk), ("--batch-size", args.batch_size)) if v]
    if given:
        raise StreamError(f"{', '.join(given)} apply to a streamed store only: write to a .zarr path (--out X.zarr)")


def cmd_stream(args) -> int:
    """``workbench explain ... --out X.zarr``: stream the faithfulness test; print the store's path."""
    from workbench.scale.stream import StreamError

    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    options = {"n_steps": args.ig_steps} if args.ig_steps else {}
    if args.target is not None:
        raise StreamError("--target does not apply to a streamed store: it tests the predicted and the target "
                          "(label) class of every image; drop --target")
    path = stream_faithfulness(args.model, args.images, args.out, method=methods, checkpoint=args.checkpoint,
                               device=args.device, img_size=args.img_size, seed=args.seed, road=args.road,
                               chunk=args.chunk or 128, batch_size=args.batch_size or 32, log=print, **options)
    print(f"wrote {path}")
    return 0
