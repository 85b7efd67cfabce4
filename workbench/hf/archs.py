"""The timm model names a converted Hugging Face model is built by: ``hf_vit`` and ``hf_swin``.

Their keyword arguments are JSON (the activation and the LayerNorm epsilon by value, not as classes), so a run
records a converted teacher, and a method builds its student from it, as ``timm.create_model(name, **kwargs)``
like any other teacher. Importing this module registers the names (as ``methods`` registers its model forms);
:func:`workbench.models.create_model` imports it.
"""

from __future__ import annotations

from functools import cache, partial
from typing import Callable, Literal

import torch
import torch.nn as nn
from timm.models import register_model
from timm.models.deit import VisionTransformerDistilled
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import VisionTransformer

__all__ = ["ACTS", "ClsMeanViT", "hf_vit", "hf_swin"]

#: transformers ``hidden_act`` -> the activation of timm's MLP that computes the same function
ACTS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU, "gelu_pytorch_tanh": partial(nn.GELU, approximate="tanh"),
    "gelu_new": partial(nn.GELU, approximate="tanh"), "relu": nn.ReLU, "silu": nn.SiLU, "swish": nn.SiLU,
}

#: what reads the final tokens: the class token (ViT), class and distillation tokens averaged (distilled DeiT in
#: eval), or [class token, mean of the patch tokens] (Dinov2ForImageClassification)
Head = Literal["token", "distilled", "cls_mean"]


class ClsMeanViT(VisionTransformer):
    """timm's ``VisionTransformer`` with ``Dinov2ForImageClassification``'s head: a linear layer on the class token
    concatenated with the mean of the patch tokens (register tokens left out)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.head = nn.Linear(2 * self.embed_dim, self.num_classes) if self.num_classes else nn.Identity()

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = torch.cat([x[:, 0], x[:, self.num_prefix_tokens:].mean(dim=1)], dim=-1)  # (B, T, D) -> (B, 2D)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)


_VIT_CLASSES = {"token": VisionTransformer, "distilled": VisionTransformerDistilled, "cls_mean": ClsMeanViT}


def _timm_only(kwargs: dict) -> dict:
    """``kwargs`` without what ``timm.create_model`` passes every entry point (no pretrained configs here)."""
    return {k: v for k, v in kwargs.items() if k not in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")}


def _with_data(model: nn.Module, name: str, data: dict | None, classifier: str | tuple[str, ...]) -> nn.Module:
    """``model`` with ``pretrained_cfg`` holding the folder's data config (input size, interpolation, crop, mean,
    std), which the workbench's loaders and every method's student read, and its classifier and first convolution
    (re-initialised by a fine-tune to another class count)."""
    model.pretrained_cfg = {"architecture": name, "num_classes": model.num_classes, "classifier": classifier,
                            "first_conv": "patch_embed.proj", **(data or {})}
    return model


@register_model
def hf_vit(pretrained: bool = False, *, head: Head = "token", act: str = "gelu", layer_norm_eps: float = 1e-12,
           data: dict | None = None, **kwargs) -> nn.Module:
    """A timm ViT (``VisionTransformer`` / ``VisionTransformerDistilled`` / :class:`ClsMeanViT` by ``head``) with the
    activation ``act`` (a transformers ``hidden_act``, :data:`ACTS`) and LayerNorm epsilon of a HF config; ``data``:
    the folder's data config (:func:`workbench.hf.data_config`), as ``pretrained_cfg``."""
    if pretrained:
        raise ValueError("hf_vit has no pretrained weights of its own: load the folder with hf:DIR")
    model = _VIT_CLASSES[head](**_timm_only(kwargs), act_layer=ACTS[act], norm_layer=partial(nn.LayerNorm, eps=layer_norm_eps))
    return _with_data(model, "hf_vit", data, ("head", "head_dist") if head == "distilled" else "head")


@register_model
def hf_swin(pretrained: bool = False, *, layer_norm_eps: float = 1e-5, data: dict | None = None, **kwargs) -> nn.Module:
    """A timm ``SwinTransformer`` with a HF config's LayerNorm epsilon in its blocks and final norm (the patch
    embedding's and the patch merging's norms keep 1e-5, as in transformers' Swin; its activation is always GELU);
    ``data`` as for :func:`hf_vit`."""
    if pretrained:
        raise ValueError("hf_swin has no pretrained weights of its own: load the folder with hf:DIR")
    model = SwinTransformer(**_timm_only(kwargs), norm_layer=partial(nn.LayerNorm, eps=layer_norm_eps))
    for name, m in model.named_modules():  # transformers builds these two with LayerNorm's default eps, whatever the config
        if isinstance(m, nn.LayerNorm) and (name == "patch_embed.norm" or name.endswith("downsample.norm")):
            m.eps = 1e-5
    return _with_data(model, "hf_swin", data, "head.fc")


@cache
def registered() -> bool:
    """True (importing this module registered the names); a hook for callers that want the import explicit."""
    return True
