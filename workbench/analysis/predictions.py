"""Prediction agreement of a student with its teacher, and each model's accuracy.

Per sample, from the logits on the same images (float64 softmax):

- ``top1_agreement`` — 1 if the student's top-1 class is the teacher's, else 0;
- ``kl`` — KL(p_teacher ‖ p_student) = Σ_c p_t(c) (log p_t(c) − log p_s(c)) in nats, computed
  from log-softmax so that tiny probabilities do not underflow;
- ``correct`` — 1/0 whether the model's top-1 class is the label; NaN where the label is unknown
  (``-1``, e.g. photos without a class).

Means over samples: ``agreement``, ``kl_mean`` and ``accuracy`` (over the labelled samples only;
NaN when no sample has a label).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
import torch.nn.functional as F
import xarray as xr

__all__ = ["prediction_agreement"]


def prediction_agreement(logits: Mapping[str, torch.Tensor], *, reference: str,
                         labels: np.ndarray | torch.Tensor | None = None) -> xr.Dataset:
    """Top-1 agreement, KL(reference ‖ model) and accuracy of every model (module docstring).

    Args:
        logits: model label -> ``(B, classes)`` logits on the same images (the reference included).
        reference: the teacher's label.
        labels: ``(B,)`` class per image, ``-1`` where unknown; None if none are known.

    Returns:
        Dataset over ``(model, sample)``: ``pred`` (int64 top-1 class), ``top1_agreement``, ``kl``,
        ``correct`` (float64); over ``model``: ``agreement``, ``kl_mean``, ``accuracy``; coord
        ``label(sample)``.

    Raises:
        ValueError: the reference is missing, or the models disagree in batch size or number of classes.
    """
    if reference not in logits:
        raise ValueError(f"reference {reference!r} is not among the models {list(logits)}")
    ref = logits[reference].double()
    b, c = ref.shape
    for name, lg in logits.items():
        if tuple(lg.shape) != (b, c):
            raise ValueError(f"{name}: logits {tuple(lg.shape)} do not match the reference's {(b, c)} "
                             "(same images and the same classes are needed)")
    lab = -np.ones(b, dtype=np.int64) if labels is None else np.asarray(torch.as_tensor(labels).cpu(), dtype=np.int64)
    if lab.shape != (b,):
        raise ValueError(f"labels must be ({b},), got {lab.shape}")
    known = lab >= 0
    if (lab[known] >= c).any():
        raise ValueError(f"labels out of range for {c} classes: {sorted(set(lab[lab >= c].tolist()))}")
    log_t = F.log_softmax(ref, -1)
    ref_pred = ref.argmax(-1)
    names = list(logits)
    pred, agree, kl, correct = [], [], [], []
    for name in names:
        lg = logits[name].double().to(ref.device)
        p = lg.argmax(-1)
        pred.append(p.cpu().numpy())
        agree.append((p == ref_pred).double().cpu().numpy())
        kl.append((log_t.exp() * (log_t - F.log_softmax(lg, -1))).sum(-1).cpu().numpy())
        correct.append(np.where(known, (p.cpu().numpy() == lab).astype(np.float64), np.nan))
    correct_arr = np.stack(correct)
    ds = xr.Dataset(
        {"pred": (("model", "sample"), np.stack(pred).astype(np.int64)),
         "top1_agreement": (("model", "sample"), np.stack(agree)),
         "kl": (("model", "sample"), np.stack(kl)),
         "correct": (("model", "sample"), correct_arr)},
        coords={"model": names, "sample": np.arange(b), "label": ("sample", lab)},
    )
    ds["agreement"] = ds["top1_agreement"].mean("sample")
    ds["kl_mean"] = ds["kl"].mean("sample")
    ds["accuracy"] = ("model", correct_arr[:, known].mean(1) if known.any() else np.full(len(names), np.nan))
    units = {"top1_agreement": "fraction", "agreement": "fraction", "kl": "nats", "kl_mean": "nats",
             "correct": "fraction", "accuracy": "fraction"}
    for k, u in units.items():
        ds[k].attrs["units"] = u
    ds["kl"].attrs["long_name"] = f"KL({reference} ‖ model)"
    for k in ("correct", "accuracy"):
        ds[k].attrs["nan_means"] = "the image's label is unknown"  # not a broken model (provenance.check_finite)
    return ds
