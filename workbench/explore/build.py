"""Build an :class:`~workbench.explore.state.ExploreState` from models (live) and / or stores.

Stores open lazily with xarray (h5netcdf) and are checked like :func:`workbench.store.open_store` checks them,
without importing :mod:`workbench.store` (which pulls in torch through ``methods.io``): exploring stores alone
never imports torch. Models are anything :func:`workbench.models.load_model` takes (run ids / directories, timm
names with ``checkpoints``), or loaded ``nn.Module`` / ``LoadedModel`` objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import xarray as xr

from workbench.explore.rows import DatasetReader, ExploreError, image_ids
from workbench.explore.state import ExploreState, Images
from workbench.provenance import NULL, REQUIRED_ATTRS

__all__ = ["build_state", "open_store_lazily"]


def open_store_lazily(path: str | Path, label: str) -> xr.Dataset:
    """Open a workbench store lazily (no torch).

    Raises:
        ExploreError: missing or damaged file, or a Dataset without provenance.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise ExploreError(f"{label!r}: store {str(path)!r} does not exist; create it with "
                           f"`workbench analyze attention|dependency|sparse_attention|window_attention MODEL IMAGES --out {path}`")
    try:
        ds = xr.open_dataset(path, engine="h5netcdf")
    except Exception as err:
        raise ExploreError(f"{label!r}: store {str(path)!r} is damaged or not a workbench store "
                           f"({type(err).__name__}); delete it and re-run the analysis that wrote it") from None
    missing = [a for a in REQUIRED_ATTRS if a not in ds.attrs]
    if missing:
        raise ExploreError(f"{label!r}: store {str(path)!r} lacks the provenance attrs {', '.join(missing)}")
    ds.attrs = {k: (None if v == NULL else v) for k, v in ds.attrs.items()}
    return ds


def _dataset(label: str, spec: Any) -> tuple[xr.Dataset, Any]:
    """A store spec -> (map Dataset, pruning masks Dataset or None): a path, a Dataset, or a pair of either."""
    masks = None
    if isinstance(spec, (tuple, list)):
        if len(spec) != 2:
            raise ExploreError(f"{label!r}: a store pair is (map store, window_saliency store), got {len(spec)} items")
        spec, masks = spec
        masks = masks if isinstance(masks, xr.Dataset) else open_store_lazily(masks, label)
    ds = spec if isinstance(spec, xr.Dataset) else open_store_lazily(spec, label)
    return ds, masks


def _store_images(stores: Mapping[str, xr.Dataset]) -> Images | None:
    for ds in stores.values():
        if "image" in ds:
            return Images(np.asarray(ds["image"].values, np.float32), image_ids(ds))
    return None


def _loaded(label: str, ref: Any, checkpoint, device: str, img_size: int | None):
    """``ref`` as a LoadedModel (run id, timm name, nn.Module or LoadedModel)."""
    from workbench.models import LoadedModel, load_model
    from workbench.provenance import ModelSource

    if isinstance(ref, LoadedModel):
        return ref
    if isinstance(ref, str):
        kw = {"img_size": img_size} if img_size else {}
        try:
            return load_model(ref, checkpoint=checkpoint, device=device, **kw)
        except ValueError as err:
            raise ExploreError(f"{label!r}: {err}") from None
    import torch.nn as nn

    if not isinstance(ref, nn.Module):
        raise ExploreError(f"{label!r}: a model is a run id, a timm name, an nn.Module or a LoadedModel; got {type(ref).__name__}")
    cfg = getattr(ref, "pretrained_cfg", {}) or {}
    size = tuple(cfg.get("input_size", (3, 224, 224)))
    if img_size:
        size = (size[0], img_size, img_size)
    elif hasattr(ref, "patch_embed") and getattr(ref.patch_embed, "img_size", None):
        size = (size[0], *ref.patch_embed.img_size)
    return LoadedModel(ref.eval(), ModelSource(type(ref).__name__, "module", None, None), size,
                       tuple(cfg.get("mean", (0.485, 0.456, 0.406))), tuple(cfg.get("std", (0.229, 0.224, 0.225))))


def build_state(teacher=None, students: Mapping[str, Any] | None = None, images: str | None = None, *,
                stores: Mapping[str, Any] | None = None, checkpoints: Mapping[str, str] | None = None,
                teacher_name: str = "teacher", device: str = "cpu", img_size: int | None = None) -> ExploreState:
    """The explorer's state for a teacher and students (live) and / or stores (see :func:`workbench.explore.explore`).

    Raises:
        ExploreError: no models, an image spec with no images, models of different input sizes, stores of other
            images, a store without a map the view needs.
    """
    students = dict(students or {})
    stores = dict(stores or {})
    if teacher is None and students:
        raise ExploreError("students need their teacher: explore(teacher, students={...}, images=...)")
    if teacher is None and not stores:
        raise ExploreError("nothing to explore: pass a teacher (and students) with images=SPEC, or stores={label: path}")
    if teacher_name in students:
        raise ExploreError(f"a student is labelled {teacher_name!r}, the teacher's label; label it otherwise")
    clash = sorted(set(stores) & ({teacher_name, *students} if teacher is not None else set()))
    if clash:
        raise ExploreError(f"labels {clash} name both a model and a store; give each its own label")
    opened = {label: _dataset(label, spec) for label, spec in stores.items()}
    sources: dict = {}
    if teacher is not None:
        if images is None:
            raise ExploreError("live models need images: pass images='demo:val[:8]' (an image spec)")
        sources.update(_live_sources(teacher, students, images, checkpoints or {}, teacher_name, device, img_size))
        live_images = next(iter(sources.values())).images_meta
    for label, (ds, masks) in opened.items():
        sources[label] = DatasetReader(label, ds, masks)
    if teacher is not None:
        imgs = live_images
    else:
        imgs = _store_images({k: v[0] for k, v in opened.items()})
        if imgs is None:
            raise ExploreError("none of the stores holds its images (variable 'image'); analyse with "
                               "`workbench analyze`, which stores them, or pass a teacher and images=SPEC")
        shapes = {label: tuple(ds["image"].shape[1:]) for label, (ds, _) in opened.items() if "image" in ds}
        if len(set(shapes.values())) > 1:
            raise ExploreError(f"the stores' images differ in size ({shapes}): their models take different inputs, "
                               "so their maps do not line up pixel by pixel; explore models of one input size together")
    # every store must hold the images explored; keep those all hold
    keep = [i for i, iid in enumerate(imgs.ids)
            if all(iid in s.ids for s in sources.values() if isinstance(s, DatasetReader))]
    if not keep:
        listed = "; ".join(f"{k}: {', '.join(s.ids[:3])}..." for k, s in sources.items() if isinstance(s, DatasetReader))
        raise ExploreError(f"the stores were computed on other images than {', '.join(imgs.ids[:3])}... ({listed}); "
                           "maps are never drawn over another image: analyse the same images")
    imgs = Images(imgs.display[keep], [imgs.ids[i] for i in keep])
    return ExploreState(sources, imgs)


def _live_sources(teacher, students, images, checkpoints, teacher_name, device, img_size) -> dict:
    from workbench.data import load_images
    from workbench.explore.live import LiveModel
    from workbench.runtime import resolve_device

    dev = resolve_device(device)
    refs = {teacher_name: teacher, **students}
    unknown = sorted(set(checkpoints) - set(refs))
    if unknown:
        raise ExploreError(f"checkpoints for {unknown}, which is no model here; label them with one of {list(refs)}")
    loaded = {label: _loaded(label, ref, checkpoints.get(label), dev, img_size) for label, ref in refs.items()}
    first = loaded[teacher_name]
    other = {k: tuple(m.input_size) for k, m in loaded.items() if tuple(m.input_size) != tuple(first.input_size)}
    if other:
        listed = ", ".join(f"{k} {v}" for k, v in other.items())
        raise ExploreError(f"the teacher takes {tuple(first.input_size)} (C, H, W) inputs, but {listed}: the explorer "
                           "feeds one image to all models and overlays their maps on it; explore a student with its "
                           "own teacher (for timm names, img_size= sets the input size)")
    try:
        batch = load_images(images, input_size=first.input_size, mean=first.mean, std=first.std)
    except ValueError as err:
        raise ExploreError(f"images {images!r}: {err}") from None
    ids = [f"{batch.source.dataset}[{int(i)}]" for i in batch.source.indices]
    meta = Images(batch.display, ids)
    out = {}
    for label, m in loaded.items():
        x = batch.tensor.to(next(iter(m.model.parameters())).device)
        src = LiveModel(label, m.model, x, ids)
        src.images_meta = meta
        out[label] = src
    return out

