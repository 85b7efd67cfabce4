"""Self-attention ResNets: the students of AttentionLite (§2.1; Parmar / Ramachandran et al. 2019).

A ResNet of bottleneck blocks in which every spatial (k × k, k > 1) convolution is a
:class:`~methods.attentionlite.attention.LocalSelfAttention` layer (Fig. 1b): ``conv1`` (1×1) →
local self-attention (k × k, stride 1) → 2×2 average pool when the block downsamples
(Ramachandran et al. §4.1; ``ceil_mode`` so odd maps such as 7×7 halve to 4×4 like a stride-2 conv)
→ ``conv3`` (1×1), with the usual 1×1 strided projection shortcut.

Variants (§2.1): **hybrid** (``stem="conv"``) keeps a convolutional stem; **homogeneous**
(``stem="attention"``) replaces the stem convolution by a local self-attention layer with the same
simple relative embedding (the paper drops Parmar's special stem embedding). Both use a CIFAR-style
stem (3×3 / k × k at stride 1, no max pool: the images are 32×32 or smaller).

The models are timm ``ResNet`` instances (``forward_features``, ``forward_head``,
``forward_intermediates``, ``layer1…layer4``), registered with timm so that
``timm.create_model(name, **json_kwargs)`` rebuilds them:

==========================  ========================================================================
``sa_resnet26``             SA-ResNet26: bottlenecks (1, 2, 4, 1), widths (64, 128, 256, 512) ×4 out
``sa_resnet38``             SA-ResNet38: bottlenecks (2, 3, 5, 2), same widths
``sa_resnet_demo``          28×28×1 digits, sized beside the demo teacher ``cnn_demo`` (same stage strides)
``sa_resnet``               any ``layers`` / ``channels`` (the tests' tiny variant)
``sa_resnet_column``        deploy form of column pruning (:mod:`methods.attentionlite.shrink`)
==========================  ========================================================================

Common kwargs: ``stem`` ("conv" | "attention"), ``num_classes``, ``in_chans``, ``kernel_size`` (k,
default 7), ``num_heads`` (default 8, §4.1), ``stem_kernel`` (3).

Hook points: ``stages.{s}.hook_out`` (stage outputs ``(B, C_s, H_s, W_s)``, through the ResNet adapter of
:mod:`methods.hooks`, the names the CNN teacher has), and inside every attention layer
``layer{s+1}.{b}.attn.hook_pattern`` ``(B, heads, H, W, k, k)`` (``conv1.hook_pattern`` for an
attention stem), ``hook_q``, ``hook_k``, ``hook_v`` (:mod:`.attention`).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn as nn
from timm.models import register_model
from timm.models.resnet import ResNet

from .attention import LocalSelfAttention

__all__ = ["Stem", "SABottleneck", "build_sa_resnet", "sa_resnet", "sa_resnet26", "sa_resnet38", "sa_resnet_demo",
           "attention_layers"]

Stem = Literal["conv", "attention"]

_CIFAR = dict(input_size=(3, 32, 32), mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616))
_DIGITS = dict(input_size=(1, 28, 28), mean=(0.1307,), std=(0.3081,))


class SABottleneck(nn.Module):
    """Bottleneck block with local self-attention in place of the 3×3 convolution (timm block API).

    Args (timm's, from ``make_blocks``): ``inplanes``, ``planes`` (bottleneck width; out = 4·planes),
    ``stride``, ``downsample``, ``act_layer``, ``norm_layer``, ``drop_path``; ours: ``kernel_size``,
    ``num_heads``. Grouped / dilated / anti-aliased / attention-augmented options are refused.
    """

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 cardinality: int = 1, base_width: int = 64, reduce_first: int = 1, dilation: int = 1,
                 first_dilation: int | None = None, act_layer: type[nn.Module] = nn.ReLU,
                 norm_layer: type[nn.Module] = nn.BatchNorm2d, attn_layer: Any = None, aa_layer: Any = None,
                 drop_block: Any = None, drop_path: nn.Module | None = None, device: Any = None, dtype: Any = None,
                 kernel_size: int = 7, num_heads: int = 8):
        super().__init__()
        if cardinality != 1 or base_width != 64 or reduce_first != 1 or dilation != 1 or attn_layer or aa_layer or drop_block:
            raise ValueError("SABottleneck supports plain bottlenecks only (cardinality 1, base_width 64, no dilation, "
                             "no attn/aa/drop_block layers)")
        width, out = planes, planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = norm_layer(width)
        self.act1 = act_layer(inplace=True)
        self.attn = LocalSelfAttention(width, width, kernel_size, num_heads)
        self.pool = nn.AvgPool2d(2, 2, ceil_mode=True) if stride > 1 else nn.Identity()
        self.bn2 = norm_layer(width)
        self.act2 = act_layer(inplace=True)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = norm_layer(out)
        self.act3 = act_layer(inplace=True)
        self.downsample = downsample
        self.stride = stride
        self.drop_path = drop_path

    def zero_init_last(self) -> None:
        if getattr(self.bn3, "weight", None) is not None:
            nn.init.zeros_(self.bn3.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.act2(self.bn2(self.pool(self.attn(x))))
        x = self.bn3(self.conv3(x))
        if self.drop_path is not None:
            x = self.drop_path(x)
        if self.downsample is not None:
            shortcut = self.downsample(shortcut)
        return self.act3(x + shortcut)


def build_sa_resnet(layers: tuple[int, ...] | list[int], channels: tuple[int, ...] | list[int], *, stem: Stem = "conv",
                    num_classes: int = 10, in_chans: int = 3, kernel_size: int = 7, num_heads: int = 8,
                    stem_kernel: int = 3, stem_heads: int | None = None, stem_width: int = 64,
                    drop_path_rate: float = 0.0, pretrained_cfg: dict | None = None) -> ResNet:
    """An SA-ResNet (module docstring) as a timm ``ResNet``.

    Args:
        layers: bottleneck blocks of the four stages (stage s > 0 halves the resolution).
        channels: bottleneck width per stage (stage output = 4 × width).
        stem: "conv" (hybrid) or "attention" (homogeneous).
        stem_kernel: stem convolution size, or the stem attention's spatial extent.
        stem_heads: heads of an attention stem (default ``num_heads``).
        stem_width: stem output channels (timm's plain stem is 64; others rebuild the first block).
        pretrained_cfg: timm's data config (input size, mean, std) to attach.

    Raises:
        ValueError: an unknown stem, mismatched ``layers`` / ``channels``.
    """
    if stem not in ("conv", "attention"):
        raise ValueError(f"stem must be 'conv' (hybrid) or 'attention' (homogeneous), got {stem!r}")
    layers, channels = tuple(int(n) for n in layers), tuple(int(c) for c in channels)
    if len(layers) != 4 or len(channels) != 4:
        raise ValueError(f"layers {layers} and channels {channels} must have four stages each (timm's ResNet runs layer1–layer4)")
    model = ResNet(block=SABottleneck, layers=layers, channels=channels, num_classes=num_classes, in_chans=in_chans,
                   stem_width=stem_width, drop_path_rate=drop_path_rate,
                   block_args=dict(kernel_size=kernel_size, num_heads=num_heads))
    width = stem_width
    if width != model.bn1.num_features:  # timm's plain stem is 64 wide: rebuild it and the block reading it
        model.bn1 = nn.BatchNorm2d(width)
        first = model.layer1[0]
        out = first.conv3.out_channels
        down = nn.Sequential(nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out)) if width != out else None
        model.layer1[0] = SABottleneck(width, first.conv1.out_channels, 1, down, kernel_size=kernel_size,
                                       num_heads=num_heads)
        for m in model.layer1[0].modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        model.layer1[0].zero_init_last()
        model.feature_info[0]["num_chs"] = width
    if stem == "conv":
        model.conv1 = nn.Conv2d(in_chans, width, stem_kernel, 1, stem_kernel // 2, bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    else:
        model.conv1 = LocalSelfAttention(in_chans, width, stem_kernel, stem_heads or num_heads)
    model.maxpool = nn.Identity()
    model.pretrained_cfg = dict(crop_pct=1.0, interpolation="bilinear", first_conv="conv1", classifier="fc",
                                num_classes=num_classes, **(pretrained_cfg or {}))
    model.default_cfg = model.pretrained_cfg
    return model


def _kw(name: str, pretrained: bool, kwargs: dict) -> dict:
    if pretrained:
        raise ValueError(f"{name} has no published weights; train it with AttentionLite's sparse distillation")
    for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir", "features_only"):
        kwargs.pop(key, None)
    return kwargs


def _cifar_cfg(kwargs: dict) -> dict:
    in_chans = kwargs.get("in_chans", 3)
    return _CIFAR if in_chans == 3 else dict(input_size=(in_chans, 32, 32))


@register_model
def sa_resnet(pretrained: bool = False, **kwargs) -> ResNet:
    """An SA-ResNet of any depth: pass ``layers`` and ``channels`` (e.g. the tests' tiny variant)."""
    kw = _kw("sa_resnet", pretrained, kwargs)
    if "layers" not in kw or "channels" not in kw:
        raise ValueError("sa_resnet needs layers=(…) and channels=(…); or use sa_resnet26 / sa_resnet38 / sa_resnet_demo")
    return build_sa_resnet(kw.pop("layers"), kw.pop("channels"), **kw)


@register_model
def sa_resnet26(pretrained: bool = False, **kwargs) -> ResNet:
    """SA-ResNet26 (Parmar et al. 2019): bottlenecks (1, 2, 4, 1); CIFAR-size by default (10 classes, 3×32×32)."""
    kw = _kw("sa_resnet26", pretrained, kwargs)
    return build_sa_resnet((1, 2, 4, 1), (64, 128, 256, 512), pretrained_cfg=_cifar_cfg(kw), **kw)


@register_model
def sa_resnet38(pretrained: bool = False, **kwargs) -> ResNet:
    """SA-ResNet38 (Parmar et al. 2019): bottlenecks (2, 3, 5, 2); CIFAR-size by default (10 classes, 3×32×32)."""
    kw = _kw("sa_resnet38", pretrained, kwargs)
    return build_sa_resnet((2, 3, 5, 2), (64, 128, 256, 512), pretrained_cfg=_cifar_cfg(kw), **kw)


#: The demo student's architecture (see ``config.SA_VARIANTS["demo"]`` for why these numbers).
DEMO_ARCH = dict(layers=(1, 1, 1, 1), channels=(8, 16, 32, 32), kernel_size=3, num_heads=2, stem_kernel=3, stem_width=16)


@register_model
def sa_resnet_demo(pretrained: bool = False, **kwargs) -> ResNet:
    """Demo student for 28×28×1 digits: stage resolutions 28/14/7/4 like ``cnn_demo``, so AT maps line up."""
    kw = {**DEMO_ARCH, "in_chans": 1, "num_classes": 10, **_kw("sa_resnet_demo", pretrained, kwargs)}
    return build_sa_resnet(kw.pop("layers"), kw.pop("channels"), pretrained_cfg=_DIGITS, **kw)


def attention_layers(model: nn.Module) -> dict[str, LocalSelfAttention]:
    """Every :class:`LocalSelfAttention` of ``model`` by module name (``conv1`` for an attention stem)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LocalSelfAttention)}
