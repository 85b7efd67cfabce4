"""Streamed extraction: any registered extractor over an image source, batch by batch, into a chunked zarr store.

``workbench analyze KIND --model M --images SPEC --out STORE.zarr`` (and :func:`stream_analysis`)
reads the images through a torch ``DataLoader`` with worker processes (:class:`ImageSource`: one
image per item, so an ImageFolder of 50k files is never read whole), runs the extractor on each
batch, keeps only what was asked for, and writes each completed chunk of samples into its region
of the store (layout and guarantees: :mod:`workbench.scale.chunked`). Memory is bounded by a chunk, not
by the number of images.

What is kept, during extraction (:class:`StreamOptions`):

- ``layers`` / ``heads`` / ``queries`` (``"all"``, ``"cls"`` or token indices): for the ``attention``
  extractor on timm attention blocks, ``queries`` other than ``"all"`` are computed as rows beside the
  fused attention, O(N) per head and query (:mod:`workbench.analysis.attention_rows`); the
  ``dependency`` extractor computes only those rows itself; others are sliced after extraction;
- ``dtype``: ``float16`` halves the store;
- ``reduce``: ``"mean"`` / ``"sum"`` keep one running float64 sum per chunk (no per-image data is
  stored; :func:`workbench.store.open_store` returns the finished sum or mean), ``"entropy"`` keeps
  per image only the entropy ``H = -Σ_k p_k log p_k`` (nats) of every row over its keys (rows
  normalised to sum 1 first).

Several processes, one store: under ``torchrun --nproc_per_node N`` each rank joins the process
group of :func:`methods.launch.init_distributed` (gloo on a CPU, NCCL on GPUs), takes a contiguous
shard of the chunks (:func:`workbench.scale.chunked.shard`; no padding or interleaving, so every chunk
is computed from the same batches whatever N is and the store is bit-for-bit the same), rank 0
writes the template, and every rank writes only whole chunks of its own.

An unreadable image file (a truncated JPEG in a folder) stops the run with one :class:`~workbench.data.DataError`
naming it, the chunks written so far kept (a rerun resumes them); with ``skip_bad_images`` (``--skip-bad-images``)
it is left out with a warning naming it: its row of a per-image store is NaN, and running sums and ``count`` leave
it out. The store is the same either way, so a run stopped by a bad file resumes with the flag.

Resume: a chunk is done once its marker exists; rerunning the same command skips done chunks.
A store of another analysis, model, image set or options is refused (:class:`StreamError`), and so is one
started with other weights: the store records the sha256 of the model's state dict (``weights_sha256``), which
a resumed run must match -- a timm name without a checkpoint has seeded random weights (``init_seed``), so a
rerun of the same command resumes, and one with another ``--seed`` is refused. Ranks check that they all loaded
the same weights before anything is written.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Literal, Sequence

import numpy as np
import torch
import xarray as xr
from torch.utils.data import DataLoader, Dataset

from workbench.data import DataError, demo_split_indices, load_images, open_image, scan_image_folder, warn_skipped
from workbench.provenance import NULL, RANDOM_INIT, DataSource, config_json, stamp
from workbench.scale.chunked import (
    ChunkError,
    StreamLayout,
    chunk_bounds,
    done_chunks,
    read_layout,
    shard,
    write_chunk,
    write_template,
)

__all__ = ["StreamError", "StreamOptions", "ImageSource", "parse_queries", "stream_analysis"]

Reduce = Literal["none", "mean", "sum", "entropy"]
#: provenance attrs a resumed run must share with the store (``created`` and versions may differ)
MATCH_ATTRS = ("analysis", "model_name", "method", "checkpoint_sha256", "run", "data", "config")


class StreamError(ValueError):
    """A streamed extraction refuses its input (message: the problem and the fix)."""


@dataclass(frozen=True)
class StreamOptions:
    """What a streamed extraction keeps and how it batches."""

    layers: tuple[int, ...] | None = None  # block indices (None: all)
    heads: tuple[int, ...] | None = None  # head indices kept (None: all)
    queries: str | tuple[int, ...] = "all"  # "all", "cls", or query token indices
    dtype: Literal["float32", "float16"] = "float32"  # floating dtype of per-image data (sums stay float64)
    reduce: Reduce = "none"  # keep per image ("none"), per-image row entropies, or per-chunk running sums
    batch_size: int = 32  # images per forward pass (batches never straddle chunks)
    chunk: int = 128  # images per store chunk: the unit of writing, sharding and resuming
    workers: int = 1  # DataLoader worker processes (0: load in the main process)
    skip_bad_images: bool = False  # unreadable image files: NaN rows and a warning (True) or an error (False)

    def __post_init__(self):
        if self.dtype not in ("float32", "float16"):
            raise StreamError(f"dtype must be float32 or float16, got {self.dtype!r}")
        if self.reduce not in ("none", "mean", "sum", "entropy"):
            raise StreamError(f"reduce must be none, mean, sum or entropy, got {self.reduce!r}")
        if self.batch_size < 1 or self.chunk < 1 or self.workers < 0:
            raise StreamError(f"batch_size and chunk must be >= 1 and workers >= 0 (got {self.batch_size}, {self.chunk}, "
                              f"{self.workers})")

    def stored(self) -> str:
        """The options that shape the store (JSON; batching and workers do not)."""
        d = asdict(self)
        return json.dumps({k: d[k] for k in ("layers", "heads", "queries", "dtype", "reduce")}, sort_keys=True)


def parse_queries(text: str | Sequence[int] | None) -> str | tuple[int, ...]:
    """``"cls"``, ``"all"`` or ``"i,j,..."`` (CLI) to the :class:`StreamOptions` form."""
    if text is None or text == "all":
        return "all"
    if isinstance(text, str):
        if text == "cls":
            return "cls"
        if not re.fullmatch(r"\d+(,\d+)*", text):
            raise StreamError(f"--queries must be cls, all or comma-separated token indices, got {text!r}")
        return tuple(int(q) for q in text.split(","))
    return tuple(int(q) for q in text)


# ------------------------------------------------------------------------------------------ images
_SLICE = re.compile(r"^(?P<base>.*?)(?:\[(?P<slice>-?\d*(?::-?\d*){0,2})\])?$")


def _positions(text: str | None, n: int) -> np.ndarray:
    if not text:
        return np.arange(n)
    if ":" not in text:
        return np.arange(n)[[int(text)]]
    a, b, c = (text.split(":") + [""])[:3]
    return np.arange(n)[slice(int(a) if a else None, int(b) if b else None, int(c) if c else None)]


class ImageSource(Dataset):
    """The images of an image spec (:mod:`workbench.data`), one per item, read lazily: ``(tensor (C, H, W), label,
    None)``, or with ``skip_bad`` for an unreadable file ``(zeros, label, the error message)``.

    ``demo:...`` and ``skimage:...`` items are exactly what :func:`workbench.data.load_images` gives
    (so a ``.zarr`` store equals the ``.nc`` one); a folder is read file by file with timm's eval
    transform (resize, centre crop), as an ImageFolder is for evaluation.
    """

    def __init__(self, spec: str, *, input_size: tuple[int, int, int], mean=None, std=None, skip_bad: bool = False):
        m = _SLICE.match(spec.strip())
        base, sl = m.group("base"), m.group("slice")
        self.spec, self.input_size, self.mean, self.std = spec, tuple(input_size), mean, std
        self.skip_bad = skip_bad
        self.folder = None
        if base.startswith("demo"):
            split = base.partition(":")[2] or "val"
            all_idx = demo_split_indices(split)
            self.positions = _positions(sl, len(all_idx))
            self.item_specs = [f"demo:{split}[{p}:{p + 1}]" for p in self.positions]
            self.split = split
            self.dataset, self.indices = f"demo:{split}", all_idx[self.positions]
        elif base.startswith("skimage:"):
            names = [n for n in base.partition(":")[2].split(",") if n]
            self.positions = _positions(sl, len(names))
            self.item_specs = [f"skimage:{names[p]}" for p in self.positions]
            self.dataset, self.indices = "skimage:" + ",".join(names), self.positions
        else:
            from timm.data import create_transform

            self.folder = scan_image_folder(base)
            self.positions = _positions(sl, len(self.folder.files))
            kw = {} if mean is None else {"mean": mean, "std": std}
            self.transform = create_transform(input_size=self.input_size, is_training=False, **kw)
            self.dataset, self.indices = str(self.folder.root), self.positions
        if len(self.positions) == 0:
            raise DataError(f"image spec {spec!r} selects no images; check the slice")

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, str | None]:
        if self.folder is None:
            batch = load_images(self.item_specs[i], input_size=self.input_size, mean=self.mean, std=self.std)
            return batch.tensor[0], int(batch.labels[0]), None
        p = int(self.positions[i])
        try:
            image = open_image(self.folder.files[p], "L" if self.input_size[0] == 1 else "RGB")
        except DataError as err:  # raised in a worker, the main process gets the same one-line DataError
            if not self.skip_bad:
                raise
            return torch.zeros(self.input_size), int(self.folder.labels[p]), str(err)
        return self.transform(image), int(self.folder.labels[p]), None

    def __getitems__(self, items: list[int]) -> list[tuple[torch.Tensor, int, str | None]]:
        """A batch in one :func:`~workbench.data.load_images` call where the items are evenly spaced demo images
        (what the DataLoader's batches are); item by item otherwise."""
        pos = self.positions[items]
        step = int(pos[1] - pos[0]) if len(pos) > 1 else 0
        if self.folder is not None or not self.dataset.startswith("demo") or step <= 0 or (np.diff(pos) != step).any():
            return [self[i] for i in items]
        batch = load_images(f"demo:{self.split}[{pos[0]}:{pos[-1] + 1}:{step}]", input_size=self.input_size,
                            mean=self.mean, std=self.std)
        return [(batch.tensor[j], int(batch.labels[j]), None) for j in range(len(items))]

    @property
    def source(self) -> DataSource:
        return DataSource(self.dataset, list(map(int, self.indices)))


# --------------------------------------------------------------------------------------- one batch
def _resolve_queries(model, images: torch.Tensor, queries) -> list[int] | None:
    if queries == "all":
        return None
    if queries == "cls":
        from workbench.analysis.tokens import class_token_index

        try:
            return [class_token_index(model, tuple(images.shape[-2:]))]
        except ValueError as err:
            raise StreamError(f"--queries cls needs a ViT-like model with a class token: {err}; pass token indices "
                              "instead") from None
    return list(queries)


def extract_batch(kind: str, model, images: torch.Tensor, targets, opts: StreamOptions, **options) -> xr.Dataset:
    """The extractor's Dataset for one batch, restricted to ``opts``' layers, heads and queries (no reduction)."""
    from workbench.analysis import get_extractor
    from workbench.analysis.attention_rows import extract_attention_rows, supports_rows

    layers = list(opts.layers) if opts.layers is not None else None
    qs = _resolve_queries(model, images, opts.queries)
    if kind == "attention" and qs is not None and supports_rows(model, layers):
        ds = extract_attention_rows(model, images, layers=layers, queries=qs).assign_attrs(analysis="attention")
    elif kind == "dependency":
        ds = get_extractor(kind)(model, images, layers=layers, targets=targets, queries=qs, **options)
    else:
        ds = get_extractor(kind)(model, images, layers=layers, targets=targets, **options)
        if qs is not None:
            if "query" not in ds.dims:
                raise StreamError(f"the {kind!r} analysis has no query dim; drop --queries")
            ds = ds.isel(query=qs)
    if opts.heads is not None:
        if "head" not in ds.dims:
            raise StreamError(f"the {kind!r} analysis has no head dim; drop --heads")
        ds = ds.isel(head=list(opts.heads))
    return ds.drop_vars([v for v in ("image",) if v in ds])


def _entropy(ds: xr.Dataset) -> xr.Dataset:
    """Per row (over ``key``) entropy in nats of every variable with a key dim; rows normalised to sum 1."""
    out = {}
    for name, x in ds.data_vars.items():
        if "key" not in x.dims:
            continue
        p = x.astype(np.float64)
        p = p / p.sum("key")
        h = -(xr.where(p > 0, p * np.log(p.where(p > 0, 1.0)), 0.0)).sum("key", skipna=False)
        out[f"{name}_entropy"] = h.assign_attrs(units="nats", long_name=f"entropy of {x.attrs.get('long_name', name)} rows")
    if not out:
        raise StreamError("--reduce entropy needs a variable with a key dim (attention or dependency rows)")
    return xr.Dataset(out, attrs=ds.attrs)


def _finish_batch(ds: xr.Dataset, labels: np.ndarray, opts: StreamOptions, coords: bool = True,
                  skipped: Sequence[int] = ()) -> xr.Dataset:
    """Per-image data (cast to ``opts.dtype``) or, for mean/sum, the batch's float64 sums with ``count``.

    ``coords=False`` drops every coordinate first (the template has them; xarray's alignment of a dozen token
    coords on every operation would cost more than the arithmetic). ``skipped``: positions in the batch of
    unreadable images, left out of the sums and ``count``, NaN in per-image data.
    """
    if not coords:
        ds = ds.drop_vars(list(ds.coords))
    keep = np.ones(ds.sizes["sample"], dtype=bool)
    keep[list(skipped)] = False
    if opts.reduce in ("mean", "sum"):
        ds = ds.isel(sample=np.flatnonzero(keep))
        sums = xr.Dataset({n: x.astype(np.float64).sum("sample", skipna=False).assign_attrs(x.attrs)
                           for n, x in ds.data_vars.items() if "sample" in x.dims and x.dtype.kind == "f"}, attrs=ds.attrs)
        return sums.assign(count=np.int64(ds.sizes["sample"]))
    if opts.reduce == "entropy":
        ds = _entropy(ds)
    if not keep.all():
        mask = xr.DataArray(keep, dims="sample")
        ds = ds.assign({n: x.where(mask) for n, x in ds.data_vars.items() if "sample" in x.dims and x.dtype.kind == "f"})
    dt = np.dtype(opts.dtype)
    ds = ds.assign({n: x.astype(dt) for n, x in ds.data_vars.items() if x.dtype.kind == "f" and x.dtype != dt})
    return ds.assign(label=("sample", np.asarray(labels, dtype=np.int64)))


def _chunk_sums(parts: list[xr.Dataset]) -> xr.Dataset:
    """A chunk's running sums (layout ``"chunk"``): its batches' sums added in batch order, along a ``chunk`` dim."""
    total = parts[0]
    for p in parts[1:]:
        total = total + p  # batch order is fixed: the same sums on any number of ranks
    return xr.Dataset({n: x.expand_dims("chunk").assign_attrs(parts[0][n].attrs) for n, x in total.data_vars.items()})


class _ChunkBuffers:
    """Per-sample data of the chunk being filled, batch by batch, in two reusable sets of arrays.

    One set fills while the writer thread writes the other (at most one chunk is in flight), so a
    chunk costs one copy into memory that is already paged in -- not a fresh allocation and a
    concatenation per chunk (page faults made that a tenth of the time of a full-map extraction).
    """

    def __init__(self, chunk: int):
        self.chunk = chunk
        self.sets: list[dict[str, np.ndarray] | None] = [None, None]
        self.dims: dict[str, tuple[str, ...]] = {}
        self.turn, self.fill = 0, 0

    def add(self, part: xr.Dataset) -> None:
        """Copy one finished batch (variables along ``sample``) in after the previous ones."""
        n = part.sizes["sample"]
        bufs = self.sets[self.turn]
        if bufs is None:
            self.dims = {k: x.dims for k, x in part.data_vars.items() if "sample" in x.dims}
            bufs = self.sets[self.turn] = {
                k: np.empty(tuple(self.chunk if d == "sample" else part.sizes[d] for d in dims), part[k].dtype)
                for k, dims in self.dims.items()}
        for k, dims in self.dims.items():
            at = dims.index("sample")
            bufs[k][(slice(None),) * at + (slice(self.fill, self.fill + n),)] = part[k].values
        self.fill += n

    def take(self) -> xr.Dataset:
        """The filled chunk (views of this set; the next chunk fills the other set)."""
        bufs, n = self.sets[self.turn], self.fill
        ds = xr.Dataset({k: (dims, bufs[k][(slice(None),) * dims.index("sample") + (slice(0, n),)])
                         for k, dims in self.dims.items()})
        self.turn, self.fill = 1 - self.turn, 0
        return ds


def _template(first: xr.Dataset, layout: StreamLayout) -> xr.Dataset:
    """``first`` (one batch, finished) grown to the whole store as unwritten dask arrays chunked by ``layout``."""
    import dask.array as da

    dim = "sample" if layout.layout == "sample" else "chunk"
    n, c = (layout.n_samples, layout.chunk) if dim == "sample" else (layout.n_chunks, 1)
    out = first.drop_vars([v for v, x in first.variables.items() if dim in x.dims])
    for name, x in first.data_vars.items():
        if dim in x.dims:
            shape = tuple(n if d == dim else first.sizes[d] for d in x.dims)
            chunks = tuple(c if d == dim else first.sizes[d] for d in x.dims)
            out[name] = (x.dims, da.zeros(shape, chunks=chunks, dtype=x.dtype), x.attrs)
    if dim == "chunk":
        out = out.assign_coords(chunk=np.arange(n))
    return out


def _fingerprint(ds: xr.Dataset) -> str:
    return json.dumps({n: [list(x.dims), [int(s) for s in x.shape], str(x.dtype)] for n, x in ds.data_vars.items()},
                      sort_keys=True)


def _check_weights(path: Path, attrs: dict, now: dict) -> None:
    """Refuse to resume a store whose chunks were computed with other weights (state-dict sha256, not only the name)."""
    old, new = attrs.get("weights_sha256"), now.get("weights_sha256")
    model = f"{now.get('model_name')!r}" + ("" if now.get("weights") != RANDOM_INIT else f" (random init, seed "
                                                                                       f"{now.get('init_seed')})")
    if old in (None, NULL, ""):
        if now.get("weights") == RANDOM_INIT:
            raise StreamError(f"store {str(path)!r} holds random-init chunks written before the weights were hashed, "
                              f"so nothing says they come from the weights of {model} (sha256 {new}); write to a new "
                              "--out, or delete the store to recompute it")
        return  # a run or checkpoint: its file's sha256 (checkpoint_sha256) is compared with the other attrs
    if old != new:
        raise StreamError(f"store {str(path)!r} was started with other weights than {model} has now: state-dict sha256 "
                          f"{old} in the store vs {new} now (another checkpoint, run or --seed). Its chunks would mix two "
                          "networks: rerun with the weights it was started with, write to a new --out, or delete it.")


def _check_ranks_agree(weights_sha256: str, world: int) -> None:
    """Every rank loaded the same weights (all raise otherwise, so none waits for the others)."""
    if world == 1:
        return
    import torch.distributed as dist

    hashes: list = [None] * world
    dist.all_gather_object(hashes, weights_sha256)
    if len(set(hashes)) > 1:
        listed = ", ".join(f"rank {r}: {h}" for r, h in enumerate(hashes))
        raise StreamError(f"the torchrun ranks loaded different weights ({listed}); every rank must load the same "
                          "model: pass a run id or --checkpoint, or the same --seed on every rank")


def _check_resume(path: Path, template: xr.Dataset, layout: StreamLayout) -> None:
    """Refuse to resume into a store written by another analysis, model, weights, image set or options."""
    try:
        old, attrs = read_layout(path)
    except ChunkError as err:
        raise StreamError(f"cannot resume into {str(path)!r}: {err}") from None
    _check_weights(path, attrs, template.attrs)
    diffs = [f"{k}: store {str(attrs.get(k))[:80]!r} vs now {str(template.attrs.get(k))[:80]!r}"
             for k in MATCH_ATTRS if str(attrs.get(k)) != str(template.attrs.get(k))]
    diffs += [f"stream {k}: store {getattr(old, k)!r} vs now {getattr(layout, k)!r}"
              for k in ("n_samples", "chunk", "layout", "reduce", "options", "variables") if getattr(old, k) != getattr(layout, k)]
    if diffs:
        raise StreamError(f"store {str(path)!r} holds {attrs.get('analysis')!r} of model {attrs.get('model_name')!r} "
                          f"({attrs.get('run') or 'no run'}) written with other inputs, so this run cannot resume it: "
                          + "; ".join(diffs) + ". Write to a new --out, or delete the store to recompute it.")


# ------------------------------------------------------------------------------------------ driver
def _batches(layout: StreamLayout, chunks: Sequence[int], batch_size: int) -> list[list[int]]:
    out = []
    for i in chunks:
        start, stop = chunk_bounds(layout, i)
        out += [list(range(s, min(s + batch_size, stop))) for s in range(start, stop, batch_size)]
    return out


def _collate(items):
    """``(images (B, C, H, W), labels (B,), [(position in the batch, error message) of unreadable images])``."""
    return (torch.stack([x for x, _, _ in items]), np.array([y for _, y, _ in items], dtype=np.int64),
            [(j, bad) for j, (_, _, bad) in enumerate(items) if bad])


def stream_analysis(kind: str, model: str, images: str, out: str | Path, *, checkpoint: str | None = None,
                    device: str = "auto", img_size: int | None = None, opts: StreamOptions | None = None,
                    progress: bool = True, seed: int | None = None, **options) -> Path:
    """Stream extractor ``kind`` over ``images`` into the chunked zarr store ``out`` (module docstring).

    Under torchrun each rank calls this with the same arguments. Returns the store's path.

    Args:
        kind: registered extractor name (``attention``, ``dependency``, ...).
        model: run id/dir or timm name (+ ``checkpoint``).
        images: image spec (``demo:val``, ``skimage:...``, a folder, with a slice).
        out: ``.zarr`` path; an existing store of the same analysis is resumed.
        checkpoint, device, img_size: as for ``workbench analyze``.
        opts: what to keep and how to batch (:class:`StreamOptions`).
        progress: a progress bar on rank 0 (also off with ``WORKBENCH_PROGRESS=0``).
        seed: seed of a random-init model's weights (None: :data:`workbench.models.DEFAULT_INIT_SEED`).
        **options: the extractor's own options (e.g. ``wrt``, ``norm`` of ``dependency``).

    Raises:
        StreamError: bad options, or a store that this run cannot resume.

    Example:
        The CLS rows of two layers' attention of the demo ViT (seeded random weights) over three photos, in chunks of
        two images:

        >>> import tempfile
        >>> from pathlib import Path
        >>> from workbench.scale.stream import StreamOptions, stream_analysis
        >>> from workbench.store import open_store
        >>> tmp = tempfile.TemporaryDirectory()
        >>> opts = StreamOptions(layers=(0, 5), queries="cls", batch_size=2, chunk=2, workers=0)
        >>> store = stream_analysis("attention", "vit_demo", "skimage:astronaut,coffee,chelsea",
        ...                         Path(tmp.name) / "attention.zarr", device="cpu", opts=opts, progress=False)
        >>> dict(open_store(store)["attention"].sizes)
        {'sample': 3, 'layer': 2, 'head': 4, 'query': 1, 'key': 50}
        >>> tmp.cleanup()
    """
    import torch.distributed as dist

    from workbench.models import load_model
    from workbench.runtime import init_distributed, resolve_device

    opts = opts or StreamOptions()
    out = Path(out).expanduser()
    if out.suffix != ".zarr":
        raise StreamError(f"a streamed store is a .zarr directory; got {str(out)!r}")
    dev = resolve_device(device)  # under torchrun cuda is this rank's own GPU
    rank, world = init_distributed(dev)  # NCCL for cuda, gloo for the CPU
    loaded = load_model(model, checkpoint=checkpoint, device=dev, **({"seed": seed} if seed is not None else {}),
                        **({"img_size": img_size} if img_size else {}))
    _check_ranks_agree(loaded.source.weights_sha256, world)
    source = ImageSource(images, input_size=loaded.input_size, mean=loaded.mean, std=loaded.std,
                         skip_bad=opts.skip_bad_images)
    n = len(source)
    layout = StreamLayout(n, opts.chunk, "chunk" if opts.reduce in ("mean", "sum") else "sample", opts.reduce, opts.stored())
    run = _BatchRunner(kind, loaded.model, source, dev, opts, options)
    first_idx = list(range(0, min(opts.batch_size, opts.chunk, n)))
    first, error = None, None
    if rank == 0:  # rank 0 writes the template (or checks the store it resumes) from the first batch's result
        first = run(first_idx, coords=True)
        layout, error = _open_store(out, first, layout, loaded, source, kind, opts, options)
    _raise_on_every_rank(error, world)
    todo = [i for i in shard(layout.n_chunks, rank, world) if i not in done_chunks(out)]
    batches = _batches(layout, todo, opts.batch_size)
    bar = _progress_bar(progress and rank == 0 and bool(batches), sum(map(len, batches)),
                        f"{kind} -> {out.name} (rank 0 of {world})")
    reuse = first is not None and bool(batches) and batches[0] == first_idx  # rank 0 computed it already
    loader = DataLoader(source, batch_sampler=batches[reuse:], num_workers=opts.workers if batches[reuse:] else 0,
                        collate_fn=_collate)
    computed = iter(loader)
    parts = (first.drop_vars(list(first.coords)) if (reuse and j == 0) else run(next(computed))
             for j in range(len(batches)))
    _write_chunks(out, layout, todo, batches, parts, opts.chunk, bar)
    if world > 1:
        dist.barrier()
    return out


def _raise_on_every_rank(error: str | None, world: int) -> None:
    """Raise rank 0's ``error`` (None: none) as a :class:`StreamError` on every rank."""
    if world > 1:
        import torch.distributed as dist

        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error:
        raise StreamError(error)


@dataclass(frozen=True)
class _BatchRunner:
    """Runs the extractor on one batch of the source and finishes its Dataset (:func:`_finish_batch`)."""

    kind: str  # registered extractor name
    model: torch.nn.Module  # the eval-mode model, on ``device``
    source: ImageSource  # the images streamed
    device: torch.device  # where the model runs
    opts: StreamOptions  # what to keep
    options: dict  # the extractor's own options

    def __call__(self, idx, coords: bool = False) -> xr.Dataset:
        """``idx``: sample indices, or an already collated ``(x, y, bad)`` batch."""
        x, y, bad = _collate(self.source.__getitems__(idx)) if isinstance(idx, list) else idx
        for _, message in bad:  # unreadable files (skip_bad_images): their zero images' rows become NaN
            warn_skipped(message)
        targets = torch.as_tensor(y, device=self.device) if (y >= 0).all() else None
        ds = extract_batch(self.kind, self.model, x.to(self.device), targets, self.opts, **self.options)
        return _finish_batch(ds, y, self.opts, coords, skipped=[j for j, _ in bad])


def _open_store(out: Path, first: xr.Dataset, layout: StreamLayout, loaded, source: ImageSource, kind: str,
                opts: StreamOptions, options: dict) -> tuple[StreamLayout, str | None]:
    """Rank 0: write the store's template from the first batch's result ``first`` (or check the store it resumes).

    Returns the layout with its variables' fingerprint, and the error that stops every rank (None: go on).
    """
    # provenance from the (small, numpy) first batch: stamping the dask template could compute it whole
    attrs = stamp(first, loaded.source, source.source).attrs
    template = _template(_chunk_sums([first]) if layout.layout == "chunk" else first, layout).assign_attrs(attrs)
    if layout.layout == "sample":
        template = template.assign_coords(sample=np.asarray(source.source.indices, dtype=np.int64))
    template.attrs["config"] = config_json(extractor=json.loads(first.attrs.get("config", "{}")),
                                           stream=json.loads(opts.stored()), options=options)
    template.attrs["analysis"] = kind
    layout = StreamLayout(**{**layout.__dict__, "variables": _fingerprint(template)})
    try:
        if out.exists():
            _check_resume(out, template, layout)
        else:
            write_template(template, out, layout)
    except (StreamError, ChunkError) as err:
        return layout, str(err)
    return layout, None


def _progress_bar(enabled: bool, total: int, desc: str):
    """A tqdm bar over ``total`` images, or None (disabled, or ``WORKBENCH_PROGRESS=0``)."""
    import os

    if not enabled or os.environ.get("WORKBENCH_PROGRESS", "1") == "0":
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="img")


def _write_chunks(out: Path, layout: StreamLayout, todo: Sequence[int], batches: Sequence[list[int]],
                  parts: Iterator[xr.Dataset], chunk: int, bar) -> None:
    """Gather the batches' Datasets ``parts`` (one per batch, in order) into chunks and write each complete chunk of
    ``todo`` (a chunk is compressed and written in a thread while the next one computes); closes ``bar`` at the end."""
    sums: list[xr.Dataset] = []  # running sums of the chunk (layout "chunk")
    buffers = _ChunkBuffers(chunk)  # per-sample data of the chunk (layout "sample")
    chunk_of = {s: i for i in todo for s in range(*chunk_bounds(layout, i))}
    with ThreadPoolExecutor(max_workers=1) as writer:
        pending = None
        for idx, part in zip(batches, parts):
            if layout.layout == "sample":
                buffers.add(part)
            else:
                sums.append(part)
            if bar is not None:
                bar.update(len(idx))
            i = chunk_of[idx[-1]]
            if idx[-1] == chunk_bounds(layout, i)[1] - 1:  # the chunk is complete: write it, then its marker
                if pending is not None:
                    pending.result()  # at most one chunk in flight: memory stays bounded
                data = buffers.take() if layout.layout == "sample" else _chunk_sums(sums)
                pending = writer.submit(write_chunk, out, i, data, layout)
                sums = []
        if pending is not None:
            pending.result()
    if bar is not None:
        bar.close()
