"""Per-image held-out correctness of a run's model: what paired accuracy tests need (same images, two models).

A run's manifest keeps only its accuracy; a difference between two models measured on the same held-out images is
tested far more sharply paired, image by image (:func:`workbench.stats.paired_diff_interval`), than from the two
accuracies alone. :func:`run_correctness` evaluates a complete run's saved (deploy) model on its profile's held-out
set, in the set's order.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from workbench.models import load_model
from workbench.pipelines.common import datasets, eval_transform
from workbench.runs import Run
from workbench.runtime import resolve_device

__all__ = ["correctness", "heldout_set", "run_correctness"]


@torch.no_grad()
def correctness(model: nn.Module, val_set, device: str | torch.device = "cpu", batch_size: int = 250) -> np.ndarray:
    """Per held-out image, whether ``model``'s top-1 class is the label: ``(n,)`` bool, in the set's order."""
    dev = resolve_device(device)  # a resolved torch.device passes through
    model = model.to(dev).eval()
    out = [(model(x.to(dev)).argmax(-1) == y.to(dev)).cpu() for x, y in DataLoader(val_set, batch_size=batch_size)]
    return torch.cat(out).numpy()


def heldout_set(model: nn.Module, profile: str, data: str | None = None):
    """The profile's held-out set, sized and normalised for ``model`` (its ``pretrained_cfg``, with its teacher run's
    crop and interpolation)."""
    pc = model.pretrained_cfg
    return datasets(profile, data, tuple(pc["input_size"]), pc.get("mean"), pc.get("std"),
                    eval_transform=eval_transform(pc))[1]


def run_correctness(run: Run, profile: str, device: str = "cpu") -> np.ndarray:
    """:func:`correctness` of a complete run's saved model on ``profile``'s held-out set."""
    model = load_model(str(run.dir), device="cpu").model
    return correctness(model, heldout_set(model, profile), device)
