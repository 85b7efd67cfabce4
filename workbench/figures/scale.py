"""A figure only a dataset-scale analysis gives: class-mean CLS attention and attention entropy over the held-out set.

Eight images show where one digit is read from; a class mean over the whole held-out set (100
images per class on the demo profile) shows where the model reads a *class* from, and the spread of
the CLS row's entropy over a thousand images shows whether a compressed student attends more
sharply or more diffusely than its teacher, block by block. Both come from streamed, chunked stores
(:mod:`workbench.scale.stream`, ``--queries cls``: one attention row per head, computed beside the fused
attention where the blocks are timm's) reduced lazily (:mod:`workbench.scale.reduce`).

Models: the demo ViT teacher and the registered students of it whose maps are attention probabilities
(:class:`~workbench.figures.StudentSpec` ``maps="attention"``: Sparsifiner's sparse attention, Non-deep's parallel
branches -- averaged over branches). FAR replaces attention by LSTMs and has no attention rows
(``maps="saliency"``), so it is not shown. A registered attention student whose model has no class token (e.g. one
that wraps its ViT, or pools without a CLS token) has no CLS row to stream: it is left out and named under the figure
(the data's ``left_out`` attribute), not an error that stops the figure.
"""

from __future__ import annotations

import hashlib

import numpy as np
import xarray as xr

from workbench.figures import STUDENTS, dataset, figure
from workbench.figures.context import Context

#: images per profile: the whole held-out set on demo, a tenth of it on smoke
IMAGES = {"demo": "demo:val", "smoke": "demo:val[::10]", "paper": "demo:val"}


def _students() -> list:
    """The ViT teacher's registered students whose models have attention rows to compare with the teacher's."""
    return [s for s in STUDENTS.values() if s.teacher == "vit" and s.maps == "attention"]


def _after() -> tuple[str, ...]:
    return ("teacher.vit", *dict.fromkeys(a for s in _students() for a in s.after))


def model_stats(ctx: Context, run, images: str, blocks: tuple[tuple[int, ...], ...] | None = None) -> xr.Dataset:
    """Stream the CLS attention rows of ``run`` over ``images`` into a zarr store (reused while its weights are the
    same), then reduce: the class-mean CLS map of the last block, and the per-image, per-block CLS row entropy.

    ``blocks``: a student of another depth's block correspondence (:class:`~workbench.figures.StudentSpec`): its block
    ``i`` is placed at the last teacher block of ``blocks[i]``, the convention of compare.fig2, so ``layer`` always
    counts teacher blocks."""
    from workbench.scale.reduce import compute, reduce_dataset
    from workbench.scale.stream import StreamOptions, stream_analysis
    from workbench.store import open_store

    ctx.use_run(run)
    sha = (run.manifest.get("checkpoint_sha256") or "none")[:12]
    key = hashlib.sha256(f"{run.id}|{sha}|{images}".encode()).hexdigest()[:12]
    path = ctx.store_dir / "scale" / f"cls-{run.id}-{key}.zarr"
    stream_analysis("attention", run.id, images, path, device=ctx.device, progress=False,
                    opts=StreamOptions(queries="cls", batch_size=50, chunk=100, workers=0))
    ds = open_store(path)
    head_dims = [d for d in ("branch", "head") if d in ds.dims]
    last = int(ds["layer"].values[-1])
    means = compute(reduce_dataset(ds[["cls_attention", "label"]].sel(layer=last), by="label", stat="mean"), progress=False)
    cls_map = means["cls_attention"].mean(head_dims)  # (label, y, x)
    p = ds["attention"].isel(query=0).astype(np.float64)  # (sample, layer, [branch,] head, key)
    ent = -(p * np.log(p.where(p > 0, 1.0))).sum("key", skipna=False).mean(head_dims)  # (sample, layer)
    ent = compute(ent.drop_vars([c for c in ent.coords if c not in ("sample", "layer")]), progress=False)
    if blocks is not None:  # student block i -> the last teacher block it replaces
        ent = ent.assign_coords(layer=[blocks[int(i)][-1] for i in ent["layer"].values])
        last = blocks[last][-1]
    return xr.Dataset({"cls_map": cls_map.drop_vars([c for c in cls_map.coords if c not in ("label", "y", "x")]),
                       "entropy": ent}, coords={"last_layer": last, "images": ds.sizes["sample"],
                                                "keys": ds.sizes["key"]})


def no_cls_row(ctx: Context, run) -> str | None:
    """Why ``run``'s model has no CLS attention row to stream (no class token, or not ViT-like); None when it has."""
    from workbench.analysis.tokens import class_token_index

    model = ctx.model(run)
    size = tuple((getattr(model, "pretrained_cfg", None) or {}).get("input_size", (1, 28, 28))[-2:])
    try:
        class_token_index(model, size)
    except ValueError as err:
        return str(err)
    return None


@dataset("scale.maps", after=_after)
def scale_maps(ctx: Context) -> xr.Dataset:
    """Teacher and students: class-mean last-block CLS maps and per-block CLS entropies over the held-out images.
    A student whose model has no CLS row is left out, with its label and the reason in the ``left_out`` attribute."""
    images = IMAGES[ctx.profile.name]
    parts = {"teacher": model_stats(ctx, ctx.teacher("vit"), images)}
    left_out = {}
    for spec in _students():
        run = spec.run(ctx)
        if (why := no_cls_row(ctx, run)) is not None:
            left_out[spec.label] = f"{run.id}: {why}"
            continue
        parts[spec.label] = model_stats(ctx, run, images, spec.blocks)
    ds = xr.concat(list(parts.values()), dim=xr.DataArray(list(parts), dims="model", name="model"), join="outer",
                   coords="different", compat="equals")
    ds["cls_map"].attrs.update(units="probability", long_name="class-mean CLS-to-patch attention, last block, head mean")
    ds["entropy"].attrs.update(units="nats", long_name="entropy of the CLS attention row, head mean")
    ds["layer"].attrs.update(long_name="teacher block (a shallower student: the last teacher block each of its "
                                       "blocks replaces)")
    return ds.assign_attrs(images=images, keys=int(ds["keys"].max()),
                           left_out="; ".join(f"{label} ({why})" for label, why in left_out.items()))


def _plot(ds: xr.Dataset):
    from workbench.plots.scale import plot_dataset_scale

    return plot_dataset_scale(ds)


figure("scale.fig1", paper="workbench", data="scale.maps", plot=_plot,
       caption="Dataset-scale attention of the demo ViT teacher and its attention-keeping students over the held-out "
               "set (demo profile: all 1000 images). Top: the CLS-to-patch attention of each model's last block, "
               "averaged over heads and over every image of a class. Bottom: per block, the distribution over images of "
               "the entropy of the CLS attention row (head mean; dashed: uniform attention). Blocks are counted in teacher "
               "blocks: a Non-deep block is placed at the last teacher block it replaces (3×2 at 1, 3, 5; 2×3 at 2, 5), "
               "as in compare.fig2. A registered attention-keeping student whose model has no class token has no CLS "
               "row: it is left out, and named with the reason under the figure. Streamed into chunked zarr "
               "stores with --queries cls and reduced with dask (workbench.scale.stream, workbench.scale.reduce).")
