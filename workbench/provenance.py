"""Provenance attributes carried by every stored Dataset (shared DESIGN.md, "Provenance").

Extractors set ``analysis`` and ``config``; :func:`stamp` adds where the model and the images came
from and which software produced the numbers, so any figure can be traced back from its store. ``weights``
says whether the model's weights come from a ``run``, a ``checkpoint``, or nowhere (``random-init``: a timm
name loaded without weights, which :func:`workbench.models.load_model` warns about and the figures mark); a random
init is seeded (``init_seed``) and every model's weights are hashed (``weights_sha256``, a hash of the state dict), so
a resumed or sharded store can check that all its chunks come from one network.
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
    init_seed: int | None = None  # seed of the random initial weights (random init only)
    weights_sha256: str | None = None  # sha256 of the state dict (models.state_dict_sha256); None when not loaded

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


class NonFiniteError(ValueError):
    """An extracted Dataset holds values no working model produces (±inf, or a variable that is all NaN)."""


def check_finite(ds: xr.Dataset, model: ModelSource) -> None:
    """Refuse extracted values that only a broken model gives: ±inf anywhere, or a floating variable entirely NaN.

    NaN *padding* is legitimate (heads a layer does not have, a CKA whose self-HSIC is not positive), so a
    variable holding some NaN passes; a model with non-finite weights or activations gives inf, or NaN in every
    entry of its maps. A variable whose NaN has a meaning says so in its ``nan_means`` attr (accuracy on images
    whose labels are unknown) and may be NaN everywhere.

    Raises:
        NonFiniteError: naming the variables, the model and the fix.
    """
    import numpy as np

    bad = []
    for name, var in ds.data_vars.items():
        if var.dtype.kind not in "fc" or var.size == 0:
            continue
        values = np.asarray(var.values)
        n_inf = int(np.isinf(values).sum())
        if n_inf:
            bad.append(f"{name} has {n_inf} inf of {values.size}")
        elif np.isnan(values).all() and "nan_means" not in var.attrs:  # e.g. accuracy where no label is known
            bad.append(f"{name} is NaN everywhere ({values.size} values)")
    if bad:
        where = f"run {model.run!r}" if model.run else f"{model.name!r}" + (
            f" (checkpoint sha256 {model.checkpoint_sha256[:12]}…)" if model.checkpoint_sha256 else "")
        raise NonFiniteError(
            f"the {ds.attrs.get('analysis', 'analysis')} of {where} is not finite: {'; '.join(bad[:4])}"
            f"{f'; ... ({len(bad)} variables)' if len(bad) > 4 else ''}. The model's activations overflow or its "
            "weights are not finite; nothing was stored. Check the checkpoint (retrain a diverged run) or run in "
            "float32 on other inputs.")


def stamp(ds: xr.Dataset, model: ModelSource, data: DataSource) -> xr.Dataset:
    """Return ``ds`` with the full provenance attrs of DESIGN.md; sample coords become dataset indices.

    Raises:
        NonFiniteError: the extracted values are not finite (:func:`check_finite`): a store is never written from them.
    """
    check_finite(ds, model)
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
        weights_sha256=model.weights_sha256 or NULL,
        init_seed=NULL if model.init_seed is None else int(model.init_seed),
        data=data.describe(),
        created=now_iso(),
        **versions(),
    )
    return ds.assign_attrs(attrs)


def config_json(**kwargs: Any) -> str:
    """An extractor's arguments as the ``config`` attr (sorted JSON, non-JSON values as str)."""
    return json.dumps(kwargs, sort_keys=True, default=str)
