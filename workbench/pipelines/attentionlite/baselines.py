"""The baselines AttentionLite's claims are about (Kundu & Sundaresan, papers/003), as per-image correctness.

The paper compares its sparse-distilled students with the teacher and with the *unoptimised* student (Table 1: the
same SA-ResNet trained dense, without distillation), and KD with KD+AT (Figs. 2-3). On the demo this means, per
pruning kind at the figure density: the KD, KD+AT and no-distillation (labels alone, ``--no-kd --no-at``) runs, plus
the dense (d = 1) student trained without distillation. :func:`students_correctness` evaluates them all on the same
held-out images so that the figures test every difference paired.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from workbench.pipelines.heldout import run_correctness
from workbench.runs import Run

__all__ = ["students_correctness"]


def students_correctness(teacher: Run, runs: Mapping[str, Run], profile: str, device: str = "cpu"):
    """Per-image held-out correctness of the teacher and every labelled run.

    Args:
        teacher: the CNN teacher run.
        runs: label -> run (labels such as ``irregular/KD+AT`` or ``dense/none``).
        profile: selects the held-out set.
        device: where to evaluate.

    Returns:
        Dataset with ``correct(model, sample)`` (0/1), coords ``model`` (the labels, ``teacher`` first), ``run(model)``
        and ``val_acc(model)`` (the runs' recorded accuracy, a check of the evaluation).
    """
    import xarray as xr

    labels = ["teacher", *runs]
    all_runs = [teacher, *runs.values()]
    correct = np.stack([run_correctness(r, profile, device) for r in all_runs]).astype(float)
    return xr.Dataset(
        {"correct": (("model", "sample"), correct),
         "val_acc": ("model", [float(r.manifest["results"]["val_acc"]) for r in all_runs])},
        coords={"model": labels, "run": ("model", [r.id for r in all_runs]), "sample": np.arange(correct.shape[1])},
        attrs={"teacher_run": teacher.id})
