"""Swap every attention of a timm ViT for a multi-head BiLSTM (FAR §3.1, Eq. 1–2, Fig. 1).

Paper: Ren et al., "Is Attention Required for Transformer Inference? Explore Function-preserving
Attention Replacement". A pretrained block computes (Eq. 1)

    y_l = x_l + A_l(LN1(x_l)),      x_{l+1} = y_l + F_l(LN2(y_l)),

and FAR replaces A_l by a learnable A'_l (Eq. 2) under *plug-in compatibility*: surrounding layers
are not modified.

Norm placement (our decision): the substitute takes the slot of timm's ``block.attn``, so the
student block computes ``y'_l = x_l + A'_l(LN1(x_l))`` with the teacher's pretrained ``norm1`` kept
(and frozen during distillation) and the substitute's own LayerNorm (§3.2) applied after it. We
read the norm-free Eq. 2 as shorthand — it also drops ``LN2`` in front of the frozen MLP F_l, which
cannot be literal. Keeping ``norm1`` means the block's code, LayerScale, drop-path, every timm
API (``forward_features``, ``forward_head``, ``forward_intermediates``) and hooks on ``.attn`` work
unchanged; the cost is one extra LayerNorm per block (no matmul, 0 MACs in :mod:`methods.far.flops`,
which counts the substitute as everything inside ``block.attn``).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Iterator, Optional

import torch
import torch.nn as nn
from timm.layers import Attention
from timm.models.vision_transformer import Block, VisionTransformer

from .config import FARConfig
from .lstm import MultiHeadBiLSTM


def _unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP / DataParallel wrapper."""
    return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model


def check_vit(model: nn.Module) -> None:
    """Raise ``ValueError`` unless ``model`` is a timm ViT made of ``Block``s with ``Attention``.

    Raises:
        ValueError: naming what was found and what is expected.
    """
    expected = (
        "a timm VisionTransformer (e.g. deit_tiny_patch16_224, or a distilled DeiT) whose `.blocks` "
        "are timm.models.vision_transformer.Block with `.attn` a timm.layers.Attention"
    )
    name = type(model).__name__
    if not isinstance(model, VisionTransformer):
        found = "a `.blocks` attribute" if hasattr(model, "blocks") else "no `.blocks` attribute"
        raise ValueError(f"FAR replaces the attention of {expected}; got {name} (not a VisionTransformer, {found})")
    bad = sorted({f"{type(b).__name__}.attn={type(getattr(b, 'attn', None)).__name__}" for b in model.blocks
                  if not (isinstance(b, Block) and isinstance(b.attn, (Attention, MultiHeadBiLSTM)))})
    if bad:
        raise ValueError(f"FAR replaces the attention of {expected}; {name} has blocks {', '.join(bad)}")


def replace_attention(teacher: nn.Module, cfg: Optional[FARConfig] = None) -> nn.Module:
    """A copy of ``teacher`` with every (or ``cfg.layers``) attention replaced by a BiLSTM substitute.

    N and D_h of each substitute are the teacher attention's ``num_heads`` and ``head_dim``
    (§3.2); the substitute is created on the teacher's device and dtype, with PyTorch's default
    initialisation. Everything else (embeddings, norms, MLPs, head, dist token) is copied.

    Args:
        teacher: a timm ``VisionTransformer`` (see :func:`check_vit`); it is not modified.
        cfg: substitute architecture; default :class:`FARConfig`.

    Returns:
        The student, a timm ``VisionTransformer`` with the same API.

    Raises:
        ValueError: ``teacher`` is not a ViT made of timm ``Block``/``Attention`` (e.g. a ResNet, a
            Swin), or ``cfg.layers`` names a block that does not exist.
    """
    cfg = cfg or FARConfig()
    check_vit(teacher)
    student = copy.deepcopy(teacher)
    depth = len(student.blocks)
    layers = range(depth) if cfg.layers is None else cfg.layers
    if any(not 0 <= i < depth for i in layers):
        raise ValueError(f"cfg.layers={cfg.layers} outside the teacher's {depth} blocks")
    for i in layers:
        blk = student.blocks[i]
        attn = blk.attn
        if isinstance(attn, MultiHeadBiLSTM):
            continue
        if attn.proj.out_features != attn.qkv.in_features:
            raise ValueError(f"block {i}: attention maps {attn.qkv.in_features} -> {attn.proj.out_features} features")
        ref = attn.qkv.weight
        sub = MultiHeadBiLSTM(
            attn.qkv.in_features, attn.num_heads, attn.head_dim, hidden_dim=cfg.hidden_dim,
            own_norm=cfg.own_norm, bias=cfg.lstm_bias, norm_eps=getattr(blk.norm1, "eps", 1e-6),
        )
        if cfg.out_init == "zero":
            nn.init.zeros_(sub.out_proj.weight)
            nn.init.zeros_(sub.out_proj.bias)
        elif cfg.out_init != "default":
            raise ValueError(f"out_init must be 'default' or 'zero', got {cfg.out_init!r}")
        blk.attn = sub.to(device=ref.device, dtype=ref.dtype)
    return student


def substitutes(model: nn.Module) -> list[tuple[int, MultiHeadBiLSTM]]:
    """``[(block index, substitute), …]`` of a FAR model, in block order."""
    model = _unwrap(model)
    return [(i, b.attn) for i, b in enumerate(getattr(model, "blocks", [])) if isinstance(getattr(b, "attn", None), MultiHeadBiLSTM)]


def freeze_for_distillation(model: nn.Module) -> nn.Module:
    """Distillation phase (§3.1, App. A.1): only the substitutes' parameters stay trainable.

    Returns:
        ``model`` (modified in place).
    """
    subs = substitutes(model)
    if not subs:
        raise ValueError(f"{type(model).__name__} has no FAR substitutes; call replace_attention first")
    model.requires_grad_(False)
    for _, sub in subs:
        sub.requires_grad_(True)
    return model


def unfreeze_all(model: nn.Module) -> nn.Module:
    """Finetuning phase (§3.1): every parameter trainable. Returns ``model`` (in place)."""
    return model.requires_grad_(True)


def from_scratch(model: nn.Module) -> nn.Module:
    """Table 3's "TFS" baseline: a copy of ``model`` with every weight randomly re-initialised.

    Every submodule with ``reset_parameters`` (Linear, LayerNorm, Conv, LSTM) is reset, then
    timm's ``init_weights`` (truncated-normal linears, position / class / dist tokens) runs if the
    model has it. All parameters are trainable. Seed torch beforehand for reproducibility.
    """
    model = copy.deepcopy(model)
    for m in model.modules():
        if hasattr(m, "reset_parameters") and not isinstance(m, MultiHeadBiLSTM):
            m.reset_parameters()
    if hasattr(model, "init_weights"):
        model.init_weights()
    return unfreeze_all(model)


def embed_tokens(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Input x_0 of the first block: ``(B, C, H, W) -> (B, T, D)`` with prefix (cls/dist) tokens.

    Follows timm ``VisionTransformer.forward_features`` up to the blocks.
    """
    model = _unwrap(model)
    x = model.patch_embed(images)  # (B, T_patches, D)
    x = model._pos_embed(x)  # (B, T, D): prefix tokens prepended, position embedding added
    x = model.patch_drop(x)
    return model.norm_pre(x)


@contextlib.contextmanager
def capture_block_outputs(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Within the context, every forward pass of ``model`` appends each block's output ``(B, T, D)``.

    Forward hooks on ``model.blocks`` — so it also works when the call goes through a DDP wrapper.
    """
    outs: list[torch.Tensor] = []
    handles = [b.register_forward_hook(lambda _m, _i, out: outs.append(out)) for b in _unwrap(model).blocks]
    try:
        yield outs
    finally:
        for h in handles:
            h.remove()


def block_outputs(model: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    """Output x_{l+1} of every block, ``[(B, T, D)] * L``, all tokens (cls/dist included).

    Args:
        model: a timm ViT (teacher or FAR student), in whatever train/eval mode it is in.
        images: ``(B, C, H, W)``.
    """
    with capture_block_outputs(model) as outs:
        _unwrap(model).forward_features(images)
    return list(outs)
