"""Verdict cases of the explanation items (tests/test_verdict_rules.py): hand-built ``compare.explain_<arch>``
Datasets, changed to push each rule to every verdict and to both sides of its thresholds.

- ``compare.faithfulness`` (field ordering): the ViT teacher's positive-perturbation AUC per image, the generic
  attention method shifted against rollout, raw attention and Grad-CAM (noise sd 0.05 over 200 images: the paired
  interval's half-width is about 0.007 × √2);
- ``compare.explain`` (students keep their teacher's reasons): per-image Spearman ρ of two students around a mean,
  against the threshold 0.5 (sd 0.1 over 200 images: half-width about 0.014).
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from test_verdict_rules import Case

N = 200
METHODS = ["generic_attention", "rollout", "raw_attention", "gradcam"]


def _explain(arch: str = "vit", shift: dict[str, float] | None = None, rho: dict[str, float] | None = None,
             sd_auc: float = 0.05) -> xr.Dataset:
    """``shift``: the generic method's AUC minus each other method's (per image, plus noise); ``rho``: student ->
    mean per-image Spearman ρ of every explainer (sd 0.1)."""
    rng = np.random.default_rng(0)
    shift = shift or {}
    rho = rho if rho is not None else {"S1": 0.8, "S2": 0.8}
    models = ["teacher", *rho]
    base = 0.4 + 0.1 * rng.random(N)  # an image's difficulty, shared by every method (paired)
    auc = np.zeros((len(models), len(METHODS), 2, 2, N))
    for j, m in enumerate(METHODS):
        own = base + sd_auc * rng.standard_normal(N)
        auc[:, j] = own - (shift.get(m, 0.0) if m != "generic_attention" else 0.0)
    generic = base + sd_auc * rng.standard_normal(N)
    auc[:, 0] = generic
    sp = np.full((len(models), len(METHODS), N), np.nan)
    for i, s in enumerate(rho):
        sp[i + 1] = np.clip(rho[s] + 0.1 * rng.standard_normal((len(METHODS), N)), -1, 1)
    return xr.Dataset({"auc": (("model", "explainer", "explained", "order", "sample"), auc),
                       "spearman": (("model", "explainer", "sample"), sp)},
                      coords={"model": models, "explainer": METHODS, "explained": ["predicted", "target"],
                              "order": ["positive", "negative"], "sample": np.arange(N)}).assign_attrs(arch=arch)


def _ordering(**shift):
    """Each other method's AUC minus the generic method's by ``shift`` (positive: the generic method ahead)."""
    return lambda: (_explain(shift={k: -v for k, v in shift.items()}), xr.Dataset(), xr.Dataset())


CASES = {
    "compare.faithfulness": [
        Case("generic 0.1 below every other method: ahead of all", _ordering(rollout=0.1, raw_attention=0.1, gradcam=0.1),
             "shown"),
        Case("generic 0.02 below every other: just beyond the noise", _ordering(rollout=0.02, raw_attention=0.02,
                                                                                gradcam=0.02), "shown"),
        Case("generic 0.002 below every other: within the noise", _ordering(rollout=0.002, raw_attention=0.002,
                                                                            gradcam=0.002), "not shown"),
        Case("generic ahead of rollout and raw attention, behind Grad-CAM",
             _ordering(rollout=0.1, raw_attention=0.1, gradcam=-0.1), "partly"),
        Case("generic 0.1 above every other method: behind all", _ordering(rollout=-0.1, raw_attention=-0.1,
                                                                           gradcam=-0.1), "not shown"),
        Case("no ViT teacher in the data", lambda: (xr.Dataset(), _explain(arch="swin"), xr.Dataset()), "not shown"),
    ],
    "compare.explain": [
        Case("both students at ρ 0.8", lambda: (_explain(rho={"S1": 0.8, "S2": 0.8}),), "shown"),
        Case("both students at ρ 0.53: interval just above 0.5", lambda: (_explain(rho={"S1": 0.53, "S2": 0.53}),),
             "shown"),
        Case("one student at 0.8, one at 0.2", lambda: (_explain(rho={"S1": 0.8, "S2": 0.2}),), "partly"),
        Case("both students at ρ 0.47: interval just below 0.5", lambda: (_explain(rho={"S1": 0.47, "S2": 0.47}),),
             "not shown"),
        Case("both students at ρ 0.5: inconclusive", lambda: (_explain(rho={"S1": 0.5, "S2": 0.5}),), "not shown"),
        Case("no student shares an explainer with its teacher", lambda: (_explain(rho={}),), "not shown"),
    ],
}
