"""Chunked zarr (v3) analysis stores: the layout that streamed, sharded, resumable extraction writes.

A *chunked store* ``NAME.zarr`` is one xarray Dataset in a zarr v3 directory, written in pieces:

- **the template** (written once, by rank 0, to a temporary directory renamed into place, so a
  store either has its whole metadata or does not exist): every variable with its final shape,
  dtype and chunking, the coordinates that do not depend on the sample, and the provenance attrs of
  :mod:`workbench.provenance` plus ``stream`` (JSON: sample count, chunk size, layout, options, and
  the shape of every variable -- what a resumed run must match);
- **chunks**: chunk ``i`` covers samples ``[i·C, min((i+1)·C, N))`` (layout ``"sample"``) or, for a
  store of running sums (``--reduce mean|sum``), the one index ``i`` of a ``chunk`` dim (layout
  ``"chunk"``). Every zarr chunk along that dim is exactly one of these, so a writer never touches
  another writer's zarr chunk (an unaligned region write would read-modify-write a shared chunk and
  silently lose data; :func:`write_chunk` refuses one);
- **done markers**: ``.workbench-done/chunk-000012``, one empty file per chunk, created (by
  rename) only after the chunk's data is written. A chunk without a marker is never read as data:
  :func:`open_chunked` refuses an incomplete store unless asked for its complete part, and a
  resumed extraction recomputes the chunk.

This module is pure xarray + zarr (no torch): :mod:`workbench.store` opens a ``.zarr`` store through
:func:`open_chunked`; :mod:`workbench.scale.stream` writes one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import xarray as xr

__all__ = ["DONE_DIR", "StreamLayout", "ChunkError", "quiet", "is_chunked", "chunk_bounds", "shard", "write_template",
           "read_layout", "done_chunks", "write_chunk", "completeness", "open_chunked"]

DONE_DIR = ".workbench-done"  # marker directory inside the store (zarr ignores it)

Layout = Literal["sample", "chunk"]


class ChunkError(ValueError):
    """A chunked store refuses a write or a read (the message names the problem and the fix)."""


@dataclass(frozen=True)
class StreamLayout:
    """How a chunked store is cut; stored as the ``stream`` attr (JSON)."""

    n_samples: int  # images the store covers
    chunk: int  # samples per chunk
    layout: Layout = "sample"  # "sample": per-sample data; "chunk": one running sum per chunk (dim ``chunk``)
    reduce: str = "none"  # "none", "entropy", "mean" or "sum": what was kept per chunk
    options: str = "{}"  # JSON of the streaming options (layers, heads, queries, dtype, ...)
    variables: str = "{}"  # JSON {name: [dims, shape, dtype]} of the template

    @property
    def n_chunks(self) -> int:
        return -(-self.n_samples // self.chunk)

    def to_attr(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_attr(cls, text: str) -> "StreamLayout":
        return cls(**json.loads(text))


@contextlib.contextmanager
def quiet():
    """Silence zarr's notes that consolidated metadata and fixed-width strings are not yet in the v3 spec (both are
    read back by zarr-python and xarray, which is all a workbench store needs)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(Consolidated metadata|not part of the Zarr format 3|"
                                                  "does not have a Zarr V3 specification).*")
        yield


def is_chunked(path: str | Path) -> bool:
    """Whether ``path`` names a zarr store (``.zarr`` suffix, or a directory holding ``zarr.json``)."""
    path = Path(path)
    return path.suffix == ".zarr" or (path.is_dir() and (path / "zarr.json").exists())


def chunk_bounds(layout: StreamLayout, i: int) -> tuple[int, int]:
    """Sample range ``[start, stop)`` of chunk ``i``."""
    if not 0 <= i < layout.n_chunks:
        raise ChunkError(f"chunk {i} out of range: the store has {layout.n_chunks} chunks")
    return i * layout.chunk, min((i + 1) * layout.chunk, layout.n_samples)


def shard(n_chunks: int, rank: int, world: int) -> range:
    """The contiguous chunks of ``rank`` out of ``world`` (sizes differ by at most one; no padding, no interleaving)."""
    return range(rank * n_chunks // world, (rank + 1) * n_chunks // world)


def _dim(layout: StreamLayout) -> str:
    return "sample" if layout.layout == "sample" else "chunk"


def write_template(template: xr.Dataset, path: str | Path, layout: StreamLayout) -> Path:
    """Write the store's metadata and sample-independent coords; data chunks stay unwritten.

    ``template``'s variables along the chunked dim must be dask arrays chunked by ``layout`` (nothing
    is computed). Written to ``.NAME.zarr.tmp-PID`` and renamed, so a crash leaves no half template.

    Raises:
        ChunkError: the store already exists.
    """
    path = Path(path)
    if path.exists():
        raise ChunkError(f"store {str(path)!r} already exists; its template is not rewritten")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        from zarr.codecs import BloscCodec

        ds = template.assign_attrs(stream=layout.to_attr())
        dim = _dim(layout)
        # blosc lz4 + bitshuffle: 4x faster to write than zarr's default zstd and smaller on attention maps
        codec = {"compressors": [BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle")]}
        encoding = {n: codec for n, x in ds.data_vars.items() if dim in x.dims}
        with quiet():
            ds.to_zarr(tmp, mode="w", compute=False, zarr_format=3, consolidated=True, encoding=encoding)
        (tmp / DONE_DIR).mkdir()
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def read_layout(path: str | Path) -> tuple[StreamLayout, dict]:
    """The store's :class:`StreamLayout` and its attrs (without opening the data).

    Raises:
        ChunkError: not a zarr store, or one without the ``stream`` attr (not written by the workbench).
    """
    import zarr

    path = Path(path)
    try:
        with quiet():
            attrs = dict(zarr.open_group(str(path), mode="r").attrs)
    except Exception as err:
        raise ChunkError(f"{str(path)!r} is not a readable zarr store ({type(err).__name__}: {err}); "
                         "delete it and rerun the analysis that writes it") from None
    if "stream" not in attrs:
        raise ChunkError(f"zarr store {str(path)!r} has no 'stream' attr: it was not written by `workbench analyze "
                         "... --out X.zarr`, so its chunks and provenance cannot be trusted; write it with the workbench")
    return StreamLayout.from_attr(attrs["stream"]), attrs


def done_chunks(path: str | Path) -> set[int]:
    """Indices of the chunks whose done marker exists."""
    folder = Path(path) / DONE_DIR
    if not folder.is_dir():
        return set()
    return {int(p.name.removeprefix("chunk-")) for p in folder.iterdir() if p.name.startswith("chunk-")}


def _mark_done(path: Path, i: int) -> None:
    marker = path / DONE_DIR / f"chunk-{i:06d}"
    tmp = marker.with_name(f".{marker.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write("done\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, marker)


def write_chunk(path: str | Path, i: int, data: xr.Dataset, layout: StreamLayout | None = None) -> None:
    """Write chunk ``i``'s data into its region, then its done marker.

    ``data`` holds only variables along the chunked dim, with exactly the chunk's extent along it.

    Raises:
        ChunkError: the chunk is already done (a region written twice), or ``data`` does not cover exactly
            the chunk (an unaligned region, which would share zarr chunks with another writer).
    """
    path = Path(path)
    layout = layout or read_layout(path)[0]
    start, stop = chunk_bounds(layout, i)
    dim = _dim(layout)
    region = slice(start, stop) if dim == "sample" else slice(i, i + 1)
    if i in done_chunks(path):
        raise ChunkError(f"chunk {i} (samples {start}..{stop - 1}) of {str(path)!r} is already written and marked done; "
                         "a region is written once (delete the store to recompute it)")
    size = data.sizes.get(dim)
    if size != region.stop - region.start:
        raise ChunkError(f"chunk {i} of {str(path)!r} covers {region.stop - region.start} along {dim!r}, but the data "
                         f"has {size}: regions must be whole chunks")
    extra = [v for v, x in data.variables.items() if dim not in x.dims]
    with quiet():
        data.drop_vars(extra + ([dim] if dim in data.coords else [])).to_zarr(path, region={dim: region}, mode="r+")
    _mark_done(path, i)


def completeness(path: str | Path) -> tuple[int, int]:
    """``(done chunks, all chunks)`` of a chunked store."""
    layout, _ = read_layout(path)
    return len(done_chunks(path) & set(range(layout.n_chunks))), layout.n_chunks


def open_chunked(path: str | Path, *, partial: bool = False) -> xr.Dataset:
    """Open a chunked store lazily (dask arrays), reading only chunks marked done.

    A per-sample store (layout ``"sample"``) is returned as written. A store of running sums (layout
    ``"chunk"``) is returned finished: summed over its chunks, divided by the image count for
    ``reduce="mean"`` (``count`` then says how many images it covers).

    Args:
        path: the ``.zarr`` directory.
        partial: return the complete chunks of an incomplete store (per-sample: only their samples;
            sums: over them) instead of refusing it.

    Raises:
        ChunkError: not a workbench store, or incomplete without ``partial``.
    """
    path = Path(path)
    layout, _ = read_layout(path)
    done = sorted(done_chunks(path) & set(range(layout.n_chunks)))
    if len(done) < layout.n_chunks and not partial:
        raise ChunkError(f"store {str(path)!r} is incomplete: {len(done)} of {layout.n_chunks} chunks written; rerun the "
                         "command that writes it to resume, or open it with partial=True for the complete chunks")
    with quiet():
        ds = xr.open_zarr(path, consolidated=True, zarr_format=3)
    if layout.layout == "sample":
        if len(done) < layout.n_chunks:
            keep = np.concatenate([np.arange(*chunk_bounds(layout, i)) for i in done]) if done else np.arange(0)
            ds = ds.isel(sample=keep)
        return ds
    ds = ds.isel(chunk=done)
    count = ds["count"].sum("chunk")
    sums = ds.drop_vars("count").sum("chunk")
    out = (sums / count) if layout.reduce == "mean" else sums
    for name in out.data_vars:
        out[name].attrs = {**ds[name].attrs, "reduced": f"{layout.reduce} over sample"}
    return out.assign(count=count).assign_attrs(ds.attrs)
