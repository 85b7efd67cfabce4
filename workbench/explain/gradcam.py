"""Grad-CAM (Selvaraju et al., ICCV 2017) on tokens and on a CNN's last stage, through the ``grad-cam`` package.

``pytorch_grad_cam.GradCAM`` does the work; ours is only the choice of layer (by hook-point name) and the reshape
of tokens to a grid:

- a token model (ViT teacher, FAR, Sparsifiner, Non-deep): the last block's ``hook_mixer_in`` (its LN1 output, the
  layer ``grad-cam``'s own ViT recipe hooks), tokens ``(B, T, D)`` -> prefix tokens dropped -> ``(B, D, gh, gw)``;
- a CNN (the CNN teacher, AttentionLite's SA-ResNets): the last ``stages.{i}.hook_out``, ``(B, C, gh, gw)`` as is.

The patch map is the package's CAM before its rescaling, ReLU(Σ_c w_c A_c) with w_c the spatial mean of the
gradient; the pixel map is the package's own output (its bilinear ``cv2.resize`` to the image, min–max scaled to
[0, 1] per image), unchanged.
"""

from __future__ import annotations

import re

import numpy as np
import torch
import torch.nn as nn
from einops import rearrange

from methods.devices import differentiable
from methods.hooks import Site, hook_points
from workbench.explain.grids import last_stage, token_layout
from workbench.explain.registry import Maps, explainer

__all__ = ["gradcam_layer", "gradcam_applies", "token_reshape"]

_MIXER_IN = re.compile(r"^blocks\.(\d+)\.hook_mixer_in$")


def gradcam_layer(model: nn.Module) -> tuple[str, Site] | None:
    """The hook point Grad-CAM reads (module docstring), or None."""
    points = hook_points(model)
    if getattr(model, "patch_embed", None) is not None:
        blocks = sorted((int(m.group(1)), n) for n in points if (m := _MIXER_IN.match(n)))
        return (blocks[-1][1], points[blocks[-1][1]]) if blocks else None
    stage = last_stage(model)
    return (stage, points[stage]) if stage else None


def gradcam_applies(model: nn.Module) -> str | None:
    """None if Grad-CAM has a layer to read in ``model``, else why not."""
    found = gradcam_layer(model)
    if found is None:
        return ("Grad-CAM needs blocks.{i}.hook_mixer_in (a token model) or stages.{i}.hook_out (a CNN); "
                "windowed token grids (Swin) are still to come")
    name, site = found
    if site.io != "output" or site.flags:
        return f"Grad-CAM hooks a module's output; {name} is a module's input"
    return None


def token_reshape(num_prefix: int, grid: tuple[int, int]):
    """``grad-cam``'s reshape transform for tokens: ``(B, T, D)`` -> ``(B, D, gh, gw)`` without the prefix tokens."""

    def reshape(tokens: torch.Tensor) -> torch.Tensor:
        return rearrange(tokens[:, num_prefix:], "b (y x) d -> b d y x", y=grid[0], x=grid[1])

    return reshape


@explainer("gradcam", applies=gradcam_applies, paper="Selvaraju et al., ICCV 2017 (via the grad-cam package)")
def gradcam(model: nn.Module, images: torch.Tensor, target: torch.Tensor) -> Maps:
    """Grad-CAM of the ``target`` logits on the layer of :func:`gradcam_layer`."""
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    _, site = gradcam_layer(model)
    reshape = None
    if getattr(model, "patch_embed", None) is not None:
        layout = token_layout(model, tuple(images.shape[-2:]))
        reshape = token_reshape(layout.num_prefix, layout.grid)
    targets = [ClassifierOutputTarget(int(t)) for t in target]
    # the package calls zero_grad() and backward(): leave the weights' .grad as found, and let the backward skip
    # the weights' gradients (frozen while it runs; the input carries the graph instead)
    saved = {p: p.grad for p in model.parameters()}
    trainable = [p for p in saved if p.requires_grad]
    try:
        for p in trainable:
            p.requires_grad_(False)
        x = images.detach().requires_grad_(True)
        with differentiable(model), torch.enable_grad(), GradCAM(model, [site.module], reshape_transform=reshape) as cam:
            pixel = cam(input_tensor=x, targets=targets)  # (B, H, W) float32, min-max scaled
            ag = cam.activations_and_grads
            acts, grads = (v[0].cpu().numpy() for v in (ag.activations, ag.gradients))  # as the package reads them
            raw = cam.get_cam_image(x, site.module, targets, acts, grads)  # (B, gh, gw)
    finally:
        for p in trainable:
            p.requires_grad_(True)
        for p, g in saved.items():
            p.grad = g
    patch = torch.from_numpy(np.maximum(raw, 0)).to(images.device)
    return Maps(patch=patch, pixel=torch.from_numpy(pixel).to(images.device))
