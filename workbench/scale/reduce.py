"""Reductions of a store over samples, lazily with xarray + dask (flox for group-bys), in bounded memory.

The statistics papers report over a dataset -- means, standard deviations, quantiles, top-k values --
per class or over everything::

    workbench reduce stores/val.zarr --over sample --by label --stat mean --out stores/class-means.nc

A ``.zarr`` store (:mod:`workbench.scale.stream`) opens as dask arrays chunked along ``sample``, so a mean
or standard deviation is a tree of per-chunk partial sums and never holds more than a few chunks;
group-bys go through flox's map-reduce (one pass, partial sums per group and chunk). A quantile
needs every sample of an element at once, so the store is rechunked to whole samples over blocks of
the other dims first (memory: all samples of one block). ``topk`` keeps the ``k`` largest values
along ``over`` per element (dask's ``topk``: a per-chunk top-k, then the top-k of those).

The same graph runs on a ``dask.distributed`` cluster: pass ``scheduler="tcp://host:8786"`` (the
CLI's ``--scheduler``) or a ``Client``. Every result keeps the input's provenance attrs and adds
``reduction`` (JSON: store, over, by, stat and its parameters).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
import xarray as xr

from workbench.store import StoreError, open_store, save

__all__ = ["Stat", "reduce_dataset", "compute", "reduce_store", "run_reduce"]

Stat = Literal["mean", "std", "quantile", "topk"]
STATS = ("mean", "std", "quantile", "topk")


def _group_key(ds: xr.Dataset, over: str, by: str) -> xr.DataArray:
    if by not in ds.variables:
        have = sorted(n for n, v in ds.variables.items() if v.dims == (over,) and n != over)
        raise StoreError(f"--by {by!r}: the store has no variable or coordinate {by!r}; variables along {over!r}: "
                         f"{', '.join(have) or 'none'}")
    key = ds[by]
    if key.dims != (over,):
        raise StoreError(f"--by {by!r} has dims {key.dims}; grouping needs a 1-D variable along {over!r}")
    return key.load().rename(by)


def reduce_dataset(ds: xr.Dataset, *, over: str = "sample", by: str | None = None, stat: Stat = "mean", q: float = 0.5,
                   k: int = 5, variables: Sequence[str] | None = None) -> xr.Dataset:
    """The lazy reduction of ``ds`` (nothing computed; see :func:`compute`).

    Args:
        ds: a store's Dataset (dask-backed for a ``.zarr`` store).
        over: the dim reduced away (``sample``).
        by: a 1-D variable or coordinate along ``over`` to group by (e.g. ``label``); ``None``: no groups.
        stat: ``mean``, ``std`` (population, ddof 0), ``quantile`` (``q``) or ``topk`` (the ``k`` largest,
            descending, along a new dim ``rank``).
        q: quantile in [0, 1].
        k: how many values ``topk`` keeps.
        variables: data variables to reduce (default: every floating variable along ``over``).

    Raises:
        StoreError: an unknown dim, ``by`` variable, stat or variable, or ``q``/``k`` out of range.
    """
    if over not in ds.dims:
        raise StoreError(f"--over {over!r}: the store has no dim {over!r}; its dims: {', '.join(map(str, ds.dims))}")
    if stat not in STATS:
        raise StoreError(f"--stat must be one of {', '.join(STATS)}, got {stat!r}")
    if stat == "quantile" and not 0 <= q <= 1:
        raise StoreError(f"--q must be in [0, 1], got {q}")
    key = _group_key(ds, over, by) if by is not None else None
    names = list(variables) if variables else [n for n, x in ds.data_vars.items()
                                               if over in x.dims and x.dtype.kind == "f" and n != by]
    missing = [n for n in names if n not in ds.data_vars or over not in ds[n].dims]
    if missing or not names:
        raise StoreError(f"no floating variable along {over!r} to reduce" if not names else
                         f"variables {missing} are not data variables along {over!r}")
    if stat == "topk" and not 1 <= k <= ds.sizes[over]:
        raise StoreError(f"--k must be in 1..{ds.sizes[over]}, got {k}")
    data = ds[names]
    if key is not None:
        data = data.assign_coords({by: key})
    def groups(data: xr.Dataset):  # flox map-reduce over the chunks of ``over``; the groups are known up front
        from xarray.groupers import UniqueGrouper

        return data.groupby({by: UniqueGrouper(labels=np.unique(key.values))})

    if stat in ("mean", "std"):
        with xr.set_options(use_flox=True):  # the graph is built here: flox's map-reduce for the groups
            obj = groups(data) if key is not None else data
            out = getattr(obj, stat)(over, keep_attrs=True)
    else:  # quantile, topk: per group (a quantile needs all of a group's samples of an element in one block)
        def one(part: xr.Dataset) -> xr.Dataset:
            if stat == "topk":
                return _topk(part, over, k)
            part = part.chunk({over: -1, **{d: "auto" for d in part.dims if d != over}})
            return part.quantile(q, dim=over, keep_attrs=True).drop_vars("quantile")

        if key is None:
            out = one(data)
        else:
            labels = np.unique(key.values)
            out = xr.concat([one(data.isel({over: np.flatnonzero(key.values == g)}).drop_vars(by)) for g in labels],
                            dim=xr.DataArray(labels, dims=by, name=by), join="outer")
    out = out.drop_vars([c for c in out.coords if over in out[c].dims], errors="ignore")
    reduction = {"over": over, "by": by, "stat": stat, **({"q": q} if stat == "quantile" else {}),
                 **({"k": k} if stat == "topk" else {})}
    return out.assign_attrs({**ds.attrs, "reduction": json.dumps(reduction, sort_keys=True)})


def _topk(data: xr.Dataset, over: str, k: int) -> xr.Dataset:
    """The ``k`` largest values along ``over`` per element, descending, along a new dim ``rank`` (NaN sorts last)."""
    import dask.array as da

    out = {}
    for name, x in data.data_vars.items():
        axis = x.dims.index(over)
        arr = x.data if isinstance(x.data, da.Array) else da.from_array(x.values, chunks=-1)
        arr = da.where(da.isnan(arr), -np.inf, arr)
        top = da.moveaxis(da.topk(arr, k, axis=axis), axis, 0)  # (k, ...) descending
        dims = ("rank",) + tuple(d for d in x.dims if d != over)
        out[name] = xr.DataArray(top, dims=dims, coords={c: x.coords[c] for c in x.coords if over not in x.coords[c].dims},
                                 attrs=x.attrs)
    return xr.Dataset(out).assign_coords(rank=np.arange(k))


def compute(ds: xr.Dataset, *, scheduler: str | None = None, client=None, progress: bool = True) -> xr.Dataset:
    """Compute a lazy Dataset: locally (threads, with a progress bar), or on a dask.distributed cluster.

    Args:
        ds: the lazy result of :func:`reduce_dataset`.
        scheduler: address of a dask.distributed scheduler (``tcp://host:8786``).
        client: a ``distributed.Client`` (instead of ``scheduler``).
        progress: show a progress bar (also off with ``WORKBENCH_PROGRESS=0``).
    """
    import os

    progress = progress and os.environ.get("WORKBENCH_PROGRESS", "1") != "0"
    if scheduler is not None and client is None:
        from distributed import Client

        with Client(scheduler) as c:
            return compute(ds, client=c, progress=progress)
    if client is not None:
        future = client.compute(ds)
        if progress:
            from distributed import progress as show

            show(future)
        return future.result()
    if progress:
        from dask.diagnostics import ProgressBar

        with ProgressBar():
            return ds.compute(scheduler="threads")
    return ds.compute(scheduler="threads")


def reduce_store(store: str | Path, *, over: str = "sample", by: str | None = None, stat: Stat = "mean", q: float = 0.5,
                 k: int = 5, variables: Sequence[str] | None = None, scheduler: str | None = None, client=None,
                 progress: bool = True) -> xr.Dataset:
    """Open ``store`` lazily, reduce it (:func:`reduce_dataset`) and compute the result (:func:`compute`).

    Example:
        The mean over images of a streamed store (:func:`workbench.scale.stream.stream_analysis`):

        >>> import tempfile
        >>> from pathlib import Path
        >>> from workbench.scale.reduce import reduce_store
        >>> from workbench.scale.stream import StreamOptions, stream_analysis
        >>> tmp = tempfile.TemporaryDirectory()
        >>> store = stream_analysis("attention", "vit_demo", "skimage:astronaut,coffee,chelsea",
        ...                         Path(tmp.name) / "attention.zarr", device="cpu", progress=False,
        ...                         opts=StreamOptions(layers=(0, 5), queries="cls", chunk=2, workers=0))
        >>> mean = reduce_store(store, over="sample", stat="mean", progress=False)
        >>> dict(mean["attention"].sizes)
        {'layer': 2, 'head': 4, 'query': 1, 'key': 50}
        >>> round(float(mean["attention"].sum("key").mean()), 4)  # a mean of attention rows is still one
        1.0
        >>> tmp.cleanup()
    """
    ds = open_store(store)
    lazy = reduce_dataset(ds, over=over, by=by, stat=stat, q=q, k=k, variables=variables)
    out = compute(lazy, scheduler=scheduler, client=client, progress=progress)
    reduction = {**json.loads(out.attrs["reduction"]), "store": str(Path(store).expanduser())}
    return out.assign_attrs(reduction=json.dumps(reduction, sort_keys=True))


def run_reduce(store: str | Path, out: str | Path, **kwargs) -> Path:
    """:func:`reduce_store`, saved at ``out`` (``.nc``, or a ``.zarr`` written whole); returns its path."""
    out = Path(out).expanduser()
    if out.resolve() == Path(store).expanduser().resolve():
        raise StoreError(f"--out {str(out)!r} is the input store; write the reduction to a new path")
    ds = reduce_store(store, **kwargs)
    if out.suffix != ".zarr":
        return save(ds, out)
    import os
    import shutil

    from workbench.scale.chunked import StreamLayout

    if out.exists():
        raise StoreError(f"{str(out)!r} exists; remove it or choose another --out")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    attrs = {k: ("null" if v is None else v) for k, v in ds.attrs.items()}
    layout = StreamLayout(0, 1, "sample", json.loads(ds.attrs["reduction"])["stat"])  # written whole: no chunks
    ds.assign_attrs(attrs, stream=layout.to_attr()).to_zarr(tmp, mode="w", zarr_format=3, consolidated=True)
    os.replace(tmp, out)
    return out
