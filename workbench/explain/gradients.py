"""Gradient explanations of the input pixels through captum: Integrated Gradients and Saliency.

Both are :mod:`workbench.analysis.attribution`'s (captum's ``IntegratedGradients`` and ``Saliency``, its baseline,
node count and channel reductions); they apply to every differentiable classifier. Pixel maps are native; the patch
map sums each patch's pixels (IG's total, hence completeness, is kept).

- **ig** (Sundararajan et al. 2017): signed channel sum of the attributions from the zero (dataset-mean) baseline;
  extra ``ig_delta(sample)``: the relative completeness gap |Σ attr − (f(x) − f(0))| / |f(x) − f(0)|.
- **saliency** (Simonyan et al. 2014): max over channels of |∂ y_t / ∂ x|.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from workbench.analysis.attribution import integrated_gradients, saliency
from workbench.explain.registry import Maps, explainer

__all__: list[str] = []


@explainer("ig", native="pixel", paper="Sundararajan et al., ICML 2017 (via captum)")
def ig(model: nn.Module, images: torch.Tensor, target: torch.Tensor, *, n_steps: int = 50, batch_size: int = 64
       ) -> Maps:
    """Integrated Gradients of the ``target`` logits (``n_steps`` Gauss–Legendre nodes)."""
    _, amap, rel = integrated_gradients(model, images, target, n_steps=n_steps, batch_size=batch_size)
    return Maps(pixel=amap, extra={"ig_delta": rel})


@explainer("saliency", native="pixel", paper="Simonyan et al., ICLR 2014 workshop (via captum)")
def grad_saliency(model: nn.Module, images: torch.Tensor, target: torch.Tensor, *, batch_size: int = 64) -> Maps:
    """|∂ y_t / ∂ x|, max over channels."""
    _, amap = saliency(model, images, target, batch_size=batch_size)
    return Maps(pixel=amap)
