"""Analysis stores: save and open xarray Datasets with their provenance.

Format: **netCDF-4 (HDF5) through h5netcdf**, one ``.nc`` file per analysis. Why not zarr: a
store here is written once and read many times, and a single file makes the atomic write trivial
(write ``.name.tmp`` beside it, then ``os.replace``), is one attachment to share, and HDF5 checks
its own structure on open, so a truncated or damaged file is detected rather than half-read.
``xarray.open_dataset`` reads it lazily (variables load on first access), which keeps large
attention tensors out of memory until a plot asks for a slice.

At dataset scale (tens of thousands of images, several processes) a store is a chunked **zarr v3**
directory, ``NAME.zarr``, written chunk by chunk by :mod:`workbench.scale.stream` (parallel chunk writes,
done markers, resume) and read lazily as dask arrays; its layout is :mod:`workbench.scale.chunked`.
:func:`open_store` opens both kinds with the same provenance attrs.

Encoding notes: netCDF attributes cannot be ``None`` (stored as ``"null"``) and booleans are
stored as int8 with xarray's ``dtype: bool`` encoding, so a round trip is exact.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from workbench.provenance import NULL, REQUIRED_ATTRS
from workbench.runtime import atomic_path

SUFFIX = ".nc"


class StoreError(ValueError):
    """A store is missing, damaged, or lacks provenance."""


def _check_attrs(ds: xr.Dataset, where: str) -> None:
    missing = [a for a in REQUIRED_ATTRS if a not in ds.attrs]
    if missing:
        raise StoreError(
            f"{where} lacks the provenance attrs {', '.join(missing)}; "
            "stamp it with workbench.provenance.stamp(ds, model_source, data_source) before saving"
        )


def _attr(value):
    """netCDF-safe attribute: None -> "null", str subclasses (e.g. torch's version) -> str, bool -> int."""
    if value is None:
        return NULL
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool):
        return int(value)
    return value


def save(ds: xr.Dataset, path: str | Path) -> Path:
    """Write ``ds`` to ``path`` (``.nc``) atomically; refuse a Dataset without provenance.

    Raises:
        StoreError: provenance attrs missing, or the parent directory cannot be created.
    """
    path = Path(path).expanduser()
    if path.suffix != SUFFIX:
        path = path.with_suffix(path.suffix + SUFFIX) if path.suffix else path.with_suffix(SUFFIX)
    _check_attrs(ds, "the Dataset")
    attrs = {k: _attr(v) for k, v in ds.attrs.items()}
    ds = ds.copy(deep=False).assign_attrs(attrs)
    with atomic_path(path) as tmp:
        ds.to_netcdf(tmp, engine="h5netcdf", invalid_netcdf=False)
    return path


def open_store(path: str | Path, *, load: bool = False, partial: bool = False) -> xr.Dataset:
    """Open a store lazily: ``.nc`` (variables load on access) or ``.zarr`` (dask arrays, complete chunks only).

    ``load=True`` reads everything and closes the file; ``partial=True`` opens the complete chunks of an
    incomplete ``.zarr`` store (:func:`workbench.scale.chunked.open_chunked`) instead of refusing it.

    Raises:
        StoreError: missing file, damaged file, incomplete zarr store, or missing provenance attrs.
    """
    from workbench.scale.chunked import ChunkError, is_chunked, open_chunked

    path = Path(path).expanduser()
    if not path.exists():
        raise StoreError(f"store {str(path)!r} does not exist; create it with `workbench analyze ... --out {path}`")
    try:
        ds = open_chunked(path, partial=partial) if is_chunked(path) else xr.open_dataset(path, engine="h5netcdf")
    except ChunkError as err:
        raise StoreError(str(err)) from None
    except Exception as err:
        raise StoreError(
            f"store {str(path)!r} is damaged or not a workbench store ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
            "delete it and re-run the analysis that wrote it"
        ) from None
    _check_attrs(ds, f"store {str(path)!r}")
    ds.attrs = {k: (None if v == NULL else v) for k, v in ds.attrs.items()}
    if load:
        with ds:
            ds = ds.load()
    return ds
