"""LeGrad (Bousselham et al. 2024, "LeGrad: An Explainability Method for Vision Transformers via Feature Formation
Sensitivity"), written on our hook points because ``torchcam``'s ``LeGrad`` cannot read a timm ViT.

Why not torchcam 0.5: its ``LeGrad`` hooks a ``self_attention`` child that must be a ``torch.nn.MultiheadAttention``
(torchvision's ViT) and re-runs that module's value projection from ``in_proj_weight``; timm's ``Attention`` (our
teachers and every student built from them) has a fused ``qkv`` linear and no such child, so torchcam refuses it
("target block must expose `self_attention: nn.MultiheadAttention`"). The rule is the one torchcam implements:

for every block l, the block's output tokens go through the model's own final norm and head (timm's
``model.norm`` and ``model.forward_head``: the same pooling as the real output), giving a class score s^l_t; its
gradient with respect to the block's attention probabilities A_l (``blocks.{l}.attn.hook_pattern``) is ReLU-ed and
averaged over heads and query tokens; the prefix keys are dropped and the patch maps averaged over the blocks.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from methods.hooks import hook_points, run_with_cache
from workbench.explain.attention import attention_applies, attention_names
from workbench.explain.grids import token_layout
from workbench.explain.registry import Maps, explainer

__all__ = ["legrad_applies"]


def legrad_applies(model: nn.Module) -> str | None:
    """None if LeGrad applies: attention in every block, block outputs named, timm's ``norm`` and ``forward_head``."""
    why = attention_applies(model)
    if why:
        return why
    if not (hasattr(model, "forward_head") and isinstance(getattr(model, "norm", None), nn.Module)):
        return "LeGrad projects every block's tokens through the model's head: needs timm's norm and forward_head"
    points = hook_points(model)
    missing = [n for n in _posts(attention_names(model)) if n not in points]
    return f"LeGrad needs every block's output; missing hook points {missing[:3]}" if missing else None


def _posts(attn_names: list[str]) -> list[str]:
    return [n.replace("attn.hook_pattern", "hook_resid_post") for n in attn_names]


@explainer("legrad", applies=legrad_applies, paper="Bousselham et al., 2024 (torchcam's rule on timm hook points)")
def legrad(model: nn.Module, images: torch.Tensor, target: torch.Tensor) -> Maps:
    """LeGrad of the ``target`` class over all blocks (module docstring)."""
    names = attention_names(model)
    posts = _posts(names)
    layout = token_layout(model, tuple(images.shape[-2:]))
    x = images.detach().requires_grad_(True)
    maps = []
    with torch.enable_grad():
        _, cache = run_with_cache(model, x, names=names + posts, detach=False)
        for i, (a, p) in enumerate(zip(names, posts)):
            s = model.forward_head(model.norm(cache[p])).gather(1, target.view(-1, 1)).sum()  # s^l_t over the batch
            g = torch.autograd.grad(s, cache[a], retain_graph=i < len(names) - 1)[0]  # (B, heads, T, T)
            maps.append(g.clamp(min=0).mean(dim=(1, 2))[:, layout.num_prefix:].double())  # (B, patches)
    patch = torch.stack(maps).mean(0).reshape(-1, *layout.grid)  # (B, gh, gw), patches row-major
    return Maps(patch=patch)
