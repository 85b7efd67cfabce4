"""Run an analysis: model + images -> extractor -> stamped, stored Dataset.

The one path used by ``workbench analyze``, the figures' data functions and notebooks. Every
extractor has the signature ``extract(model, images, *, layers=None, targets=None, **options)``;
``targets`` are the images' labels when every label is known, else None.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr

__all__ = ["analyze", "run_analysis"]


def analyze(kind: str, model: str, images: str, *, checkpoint: str | None = None, device: str = "auto",
            img_size: int | None = None, seed: int | None = None, **options) -> xr.Dataset:
    """Load ``model`` (run id/dir or timm name [+ checkpoint]) and the ``images`` spec, run extractor ``kind``.

    ``seed`` seeds a random-init model's weights (None: :data:`workbench.models.DEFAULT_INIT_SEED`).

    Returns:
        The extractor's Dataset with ``image(sample, img_y, img_x[, rgb])`` (what the model saw, in [0, 1]),
        ``label(sample)`` (-1 when unknown) and the full provenance attrs.
    """
    import torch

    from workbench.analysis import get_extractor
    from workbench.data import load_images
    from workbench.models import load_model
    from workbench.provenance import stamp
    from workbench.runtime import resolve_device

    extractor = get_extractor(kind)
    dev = resolve_device(device)
    loaded = load_model(model, checkpoint=checkpoint, device=dev, **({"seed": seed} if seed is not None else {}),
                        **({"img_size": img_size} if img_size else {}))
    batch = load_images(images, input_size=loaded.input_size, mean=loaded.mean, std=loaded.std)
    targets = torch.as_tensor(batch.labels, device=dev) if (batch.labels >= 0).all() else None
    ds = extractor(loaded.model, batch.tensor.to(dev), targets=targets, **options)
    if "image" not in ds:
        dims = ("sample", "img_y", "img_x") if batch.display.ndim == 3 else ("sample", "img_y", "img_x", "rgb")
        ds["image"] = (dims, batch.display)
    ds["label"] = ("sample", batch.labels)
    return stamp(ds, loaded.source, batch.source)


def run_analysis(kind: str, model: str, images: str, out: str | Path, **kwargs) -> Path:
    """:func:`analyze`, then save the store atomically at ``out``; returns its path."""
    from workbench.store import save

    return save(analyze(kind, model, images, **kwargs), out)
