"""Provenance attributes carried by every stored Dataset (shared DESIGN.md, "Provenance").

Extractors set ``analysis`` and ``config``; :func:`stamp` adds where the model and the images came
from and which software produced the numbers, so any figure can be traced back from its store. ``weights``
says whether the model's weights come from a ``run``, a ``checkpoint``, or nowhere (``random-init``: a timm
name loaded without weights, which :func:`workbench.models.load_model` warns about and the figures mark).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Sequence

import xarray as xr

#: Attributes every stored Dataset must carry; :mod:`workbench.store` refuses a store without them.
REQUIRED_ATTRS = (
    "analysis",
    "model_name",
    "method",
    "checkpoint_sha256",
    "run",
    "data",
    "config",
    "workbench_version",
    "torch_version",
    "timm_version",
    "created",
)

#: netCDF attributes cannot hold None; a missing value is stored as this string.
NULL = "null"

#: The ``weights`` attr of a model nobody trained: a timm name loaded without a checkpoint.
RANDOM_INIT = "random-init"


class RandomInitWarning(UserWarning):
    """A model is used with its random initial weights (a timm name without a checkpoint)."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model came from."""

    name: str  # timm architecture name, e.g. "deit_tiny_patch16_224" or "vit_demo"
    method: str = "teacher"  # "teacher" or a method short name ("far", "slimswin", ...)
    checkpoint_sha256: str | None = None  # sha256 of the weights file, None for random init
    run: str | None = None  # run id when the model comes from a run directory

    @property
    def weights(self) -> str:
        """Where the weights came from: ``"run"``, ``"checkpoint"`` or ``"random-init"`` (:data:`RANDOM_INIT`)."""
        return "run" if self.run else "checkpoint" if self.checkpoint_sha256 else RANDOM_INIT


def weights_of(attrs: dict) -> str:
    """The ``weights`` attr of a stored Dataset's provenance; derived for stores written before it was recorded."""
    def get(key: str) -> str | None:
        value = attrs.get(key)
        return None if value in (None, NULL, "") else str(value)

    return get("weights") or ModelSource(str(get("model_name")), checkpoint_sha256=get("checkpoint_sha256"),
                                         run=get("run")).weights


@dataclass(frozen=True)
class DataSource:
    """Which images an analysis saw."""

    dataset: str  # dataset id, e.g. "demo:val", "skimage", or a folder path
    indices: Sequence[int] = field(default_factory=tuple)  # dataset indices of the samples

    def describe(self) -> str:
        return json.dumps({"dataset": self.dataset, "indices": list(map(int, self.indices))})


def versions() -> dict[str, str]:
    """Versions of the software that produced a result."""
    import timm
    import torch

    from workbench import __version__

    return {"workbench_version": __version__, "torch_version": str(torch.__version__), "timm_version": str(timm.__version__)}


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def stamp(ds: xr.Dataset, model: ModelSource, data: DataSource) -> xr.Dataset:
    """Return ``ds`` with the full provenance attrs of DESIGN.md; sample coords become dataset indices."""
    if "sample" in ds.dims and len(data.indices) == ds.sizes["sample"]:
        ds = ds.assign_coords(sample=list(map(int, data.indices)))
    attrs = dict(ds.attrs)
    attrs.setdefault("analysis", "unknown")
    attrs.setdefault("config", "{}")
    attrs.update(
        model_name=model.name,
        method=model.method,
        checkpoint_sha256=model.checkpoint_sha256 or NULL,
        run=model.run or NULL,
        weights=model.weights,
        data=data.describe(),
        created=now_iso(),
        **versions(),
    )
    return ds.assign_attrs(attrs)


def config_json(**kwargs: Any) -> str:
    """An extractor's arguments as the ``config`` attr (sorted JSON, non-JSON values as str)."""
    return json.dumps(kwargs, sort_keys=True, default=str)
