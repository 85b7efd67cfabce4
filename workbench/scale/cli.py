"""The command-line side of dataset-scale analyses: ``analyze ... --out X.zarr``, ``reduce``, ``inspect X.zarr``.

Kept beside :mod:`workbench.cli` so that the CLI module stays small; only argparse is imported at the
top (building the parser imports nothing heavy), the commands import their modules when they run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_stream_flags", "add_reduce_parser", "streamed", "cmd_stream", "cmd_reduce", "inspect_chunked",
           "print_whole"]

#: analyze flags that only a streamed (.zarr) store takes, with their argparse defaults
STREAM_FLAGS = {"heads": None, "queries": None, "dtype": None, "reduce": None, "batch_size": None, "chunk": None,
                "workers": None}


def add_stream_flags(p: argparse.ArgumentParser) -> None:
    """The streaming flags of ``workbench analyze`` (used with ``--out X.zarr``)."""
    g = p.add_argument_group("streamed stores (--out X.zarr)")
    g.add_argument("--heads", default=None, help="comma-separated head indices to keep (default: all)")
    g.add_argument("--queries", default=None, help="query tokens to keep: cls, all (default) or i,j,... "
                   "(attention on timm blocks: computed as rows beside the fused attention, O(N) per head)")
    g.add_argument("--dtype", default=None, choices=["float32", "float16"], help="stored float dtype (default float32)")
    g.add_argument("--reduce", default=None, choices=["none", "mean", "sum", "entropy"],
                   help="keep per-chunk running sums (mean, sum) or per-image row entropies instead of the maps")
    g.add_argument("--batch-size", type=int, default=None, help="images per forward pass (default 32)")
    g.add_argument("--chunk", type=int, default=None, help="images per store chunk: written, sharded and resumed "
                                                           "as a unit (default 128)")
    g.add_argument("--workers", type=int, default=None, help="DataLoader worker processes (default 1)")


def add_reduce_parser(r: argparse.ArgumentParser) -> None:
    """Arguments of ``workbench reduce``."""
    r.add_argument("store", help="a .zarr or .nc store")
    r.add_argument("--over", default="sample", help="dim to reduce (default: sample)")
    r.add_argument("--by", default=None, help="group by this variable along --over (e.g. label)")
    r.add_argument("--stat", default="mean", choices=["mean", "std", "quantile", "topk"], help="statistic (default: mean)")
    r.add_argument("--q", type=float, default=0.5, help="quantile for --stat quantile (default 0.5)")
    r.add_argument("--k", type=int, default=5, help="values kept by --stat topk (default 5)")
    r.add_argument("--vars", default=None, help="comma-separated variables (default: every float variable along --over)")
    r.add_argument("--scheduler", default=None, help="address of a dask.distributed scheduler (default: local threads)")
    r.add_argument("--out", required=True, help="output store (.nc, or .zarr)")


def _ints(text: str | None) -> tuple[int, ...] | None:
    return None if not text else tuple(int(x) for x in text.split(","))


def streamed(args) -> bool:
    """Whether ``analyze`` writes a streamed store; refuses streaming flags with a ``.nc`` store."""
    if Path(args.out).suffix == ".zarr":
        return True
    given = [f"--{k.replace('_', '-')}" for k in STREAM_FLAGS if getattr(args, k, None) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} apply to streamed stores only: write to a .zarr path (--out X.zarr)")
    return False


def cmd_stream(args) -> int:
    from workbench.scale.stream import StreamOptions, parse_queries, stream_analysis

    given = {k: getattr(args, k) for k in STREAM_FLAGS if getattr(args, k, None) is not None}
    opts = StreamOptions(layers=_ints(args.layers), heads=_ints(given.pop("heads", None)),
                         queries=parse_queries(given.pop("queries", None)),
                         skip_bad_images=bool(getattr(args, "skip_bad_images", False)), **given)
    extra = {n: getattr(args, n) for n in ("wrt", "norm") if getattr(args, n, None)}
    if extra and args.kind != "dependency":
        raise ValueError(f"--{next(iter(extra))} applies to the dependency analysis only")
    path = stream_analysis(args.kind.replace("-", "_"), args.model, args.images, args.out, checkpoint=args.checkpoint,
                           device=args.device, img_size=args.img_size, opts=opts, seed=getattr(args, "seed", None),
                           **extra)
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        from workbench.scale.chunked import completeness

        done, total = completeness(path)
        print(f"wrote {path} ({done}/{total} chunks)")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def cmd_reduce(args) -> int:
    from workbench.scale.reduce import run_reduce

    path = run_reduce(args.store, args.out, over=args.over, by=args.by, stat=args.stat, q=args.q, k=args.k,
                      variables=args.vars.split(",") if args.vars else None, scheduler=args.scheduler)
    print(f"wrote {path}")
    return 0


def print_whole(ds) -> None:
    """A Dataset's repr with every provenance attr (xarray shows 12 rows by default)."""
    import xarray as xr

    with xr.set_options(display_max_rows=max(12, len(ds.attrs), len(ds.data_vars))):
        print(ds)


def inspect_chunked(store: str) -> bool:
    """``workbench inspect`` of a ``.zarr`` store: completeness, then the (complete part of the) Dataset. False otherwise."""
    from workbench.scale.chunked import completeness, is_chunked, read_layout
    from workbench.store import StoreError, open_store

    if not is_chunked(store) or not Path(store).exists():
        return False
    try:
        layout, _ = read_layout(store)
    except ValueError as err:
        raise StoreError(str(err)) from None
    done, total = completeness(store)
    state = "complete" if done == total else "INCOMPLETE: rerun the command that writes it to resume"
    if total == 0:  # a `workbench reduce` result, written whole
        print(f"{store}: written whole by `workbench reduce` (statistic {layout.reduce!r}); complete")
    else:
        print(f"{store}: {done}/{total} chunks of {layout.chunk} images written ({layout.n_samples} images, layout "
              f"{layout.layout!r}, reduce {layout.reduce!r}); {state}")
    ds = open_store(store, partial=True)
    print_whole(ds)
    ds.close()
    return True
