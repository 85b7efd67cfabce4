"""Dataset scale: analyses streamed into chunked zarr stores and reduced lazily with dask.

- :mod:`.stream` — :func:`~workbench.scale.stream.stream_analysis`: an extractor over a whole image folder,
  chunk by chunk, resumable, sharded over torchrun ranks;
- :mod:`.chunked` — the chunked store's layout, done markers and completeness;
- :mod:`.reduce` — means, per-class means, quantiles over a store (xarray + dask, also on a cluster);
- :mod:`.cli` — ``workbench analyze ... --out X.zarr``, ``workbench reduce``, ``workbench inspect``.
"""
