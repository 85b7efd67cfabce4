"""Demo teachers: a DeiT-style ViT, a Swin and a ResNet-style CNN sized for 28x28 digits.

They are ordinary timm architectures (``VisionTransformer``, ``SwinTransformer``, ``ResNet``)
registered with timm's ``register_model`` so that ``timm.create_model("vit_demo")`` knows them and
every method handles them exactly like the papers' real-size backbones. Sizes were chosen so that
each trains to its accuracy target on the demo set in about a minute on a 2-core CPU.

| name       | timm class          | layout                                                        |
|------------|---------------------|---------------------------------------------------------------|
| vit_demo   | VisionTransformer   | 28x28x1, patch 4 (7x7 grid + CLS), dim 64, depth 6, 4 heads   |
| swin_demo  | SwinTransformer     | 32x32x1 (digits padded by the data pipeline), patch 2 (16x16), window 4, dim 24, depths (2, 2, 2), heads (3, 6, 12) |
| cnn_demo   | ResNet (BasicBlock) | 28x28x1, 3x3 stem, channels (16, 32, 64, 128), one block per stage (strides 1, 2, 2, 2) |
"""

from __future__ import annotations

import torch.nn as nn
from timm.models import register_model
from timm.models.resnet import BasicBlock, ResNet
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import VisionTransformer

__all__ = ["vit_demo", "swin_demo", "cnn_demo", "DEMO_TEACHERS"]

_DEMO_CFG = dict(num_classes=10, in_chans=1)

#: ``--arch`` of ``workbench train teacher`` -> timm name of the demo teacher.
DEMO_TEACHERS = {"vit": "vit_demo", "swin": "swin_demo", "cnn": "cnn_demo"}


def _cfg(model: nn.Module, name: str, size: int = 28) -> nn.Module:
    model.pretrained_cfg = dict(
        architecture=name, input_size=(1, size, size), mean=(0.1307,), std=(0.3081,), num_classes=10,
        crop_pct=1.0, interpolation="bilinear", first_conv="", classifier="head",
    )
    return model


def _kw(kwargs: dict) -> dict:
    for key in ("pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
        kwargs.pop(key, None)
    return {**_DEMO_CFG, **kwargs}


@register_model
def vit_demo(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-style ViT for 28x28 digits (no pretrained weights exist: train with ``workbench train teacher``)."""
    _no_pretrained(pretrained, "vit_demo")
    args = dict(img_size=28, patch_size=4, embed_dim=64, depth=6, num_heads=4, mlp_ratio=2.0, qkv_bias=True)
    return _cfg(VisionTransformer(**{**args, **_kw(kwargs)}), "vit_demo")


@register_model
def swin_demo(pretrained: bool = False, **kwargs) -> SwinTransformer:
    """Swin for digits padded to 32x32, a scaled-down Swin-T (heads 3, 6, 12; window 4 instead of 7).

    Patch 2 gives 16x16 tokens; windows of 4x4 tokens tile stage 0 into 4x4 = 16 windows, stage 1
    (8x8 tokens) into 2x2 = 4 and the last stage (4x4 tokens) into one, so SlimSwin has 144 prunable
    window-head pairs (2 x 16 x 3 + 2 x 4 x 6) in 4 layers of 2 stages; odd blocks of stages 0 and 1 use
    shifted windows (shift 2). ``pretrained_cfg["input_size"]`` is ``(1, 32, 32)``: the workbench's data
    pipeline pads the 28x28 digits to it.
    """
    _no_pretrained(pretrained, "swin_demo")
    args = dict(img_size=32, patch_size=2, window_size=4, embed_dim=24, depths=(2, 2, 2), num_heads=(3, 6, 12),
                mlp_ratio=2.0)
    return _cfg(SwinTransformer(**{**args, **_kw(kwargs)}), "swin_demo", size=32)


@register_model
def cnn_demo(pretrained: bool = False, **kwargs) -> ResNet:
    """ResNet-style CNN for 28x28 digits: a stride-1 3x3 stem and four BasicBlock stages."""
    _no_pretrained(pretrained, "cnn_demo")
    args = dict(block=BasicBlock, layers=(1, 1, 1, 1), channels=(16, 32, 64, 128), stem_width=16)
    model = ResNet(**{**args, **_kw(kwargs)})
    # 28x28 digits are too small for the ImageNet stem (7x7 stride 2 + max-pool): use 3x3 stride 1.
    model.conv1 = nn.Conv2d(_kw(kwargs)["in_chans"], model.bn1.num_features, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()
    return _cfg(model, "cnn_demo")


def _no_pretrained(pretrained: bool, name: str) -> None:
    if pretrained:
        raise ValueError(f"{name} has no published weights; train it with `workbench train teacher` or pass --checkpoint FILE")


