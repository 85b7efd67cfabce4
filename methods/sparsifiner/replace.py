"""Put Sparsifiner's attention (or the Linformer baseline) into a timm ViT, switch its forms, and
set up the two training phases (§3.3, §4 "Implementation details").

Paper: Wei et al., "Sparsifiner: Learning Sparse Instance-Dependent Attention for Efficient Vision
Transformers", CVPR 2023. "We use pre-trained ViT models to initialize the backbone models": the
student is a copy of the teacher whose attentions gain a connectivity predictor; every pretrained
weight keeps its name, so a teacher's state dict loads into the student with only the predictor's
parameters missing.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

from timm.layers import Attention
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

from .attention import LinformerAttention, Path, SparsifinerAttention
from .config import SparsifinerConfig, budget


def _unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP / DataParallel wrapper."""
    return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model


def check_vit(model: nn.Module) -> None:
    """Raise ``ValueError`` unless ``model`` is a timm ViT of ``Block``s with timm ``Attention`` (or ours).

    Raises:
        ValueError: naming what was found and what is expected.
    """
    expected = ("a timm VisionTransformer (e.g. deit_small_patch16_224, vit_demo) whose `.blocks` are "
                "timm.models.vision_transformer.Block with `.attn` a timm.layers.Attention")
    name = type(model).__name__
    if not isinstance(model, VisionTransformer):
        found = "a `.blocks` attribute" if hasattr(model, "blocks") else "no `.blocks` attribute"
        raise ValueError(f"Sparsifiner replaces the attention of {expected}; got {name} (not a VisionTransformer, "
                         f"{found}). Swin, CNN and other backbones are not supported")
    ok = (Attention, SparsifinerAttention, LinformerAttention)
    bad = sorted({f"{type(b).__name__}.attn={type(getattr(b, 'attn', None)).__name__}" for b in model.blocks
                  if not (isinstance(b, Block) and isinstance(b.attn, ok))})
    if bad:
        raise ValueError(f"Sparsifiner replaces the attention of {expected}; {name} has blocks {', '.join(bad)}")
    if getattr(model.patch_embed, "dynamic_img_size", False) or getattr(model, "dynamic_img_size", False):
        raise ValueError("Sparsifiner needs a fixed token count (W_down, W_up are n_down x n): build the teacher "
                         "with dynamic_img_size=False")


def num_tokens(model: nn.Module) -> tuple[int, int]:
    """``(T, P)``: tokens per image (prefix tokens included) and prefix tokens of a timm ViT."""
    model = _unwrap(model)
    prefix = int(getattr(model, "num_prefix_tokens", 1))
    return model.patch_embed.num_patches + prefix, prefix


def _layers(model: nn.Module, layers: tuple[int, ...] | None) -> range | tuple[int, ...]:
    depth = len(model.blocks)
    chosen = range(depth) if layers is None else tuple(layers)
    if any(not 0 <= i < depth for i in chosen):
        raise ValueError(f"layers={layers} outside the teacher's {depth} blocks")
    return chosen


def replace_attention(teacher: nn.Module, cfg: SparsifinerConfig | None = None, path: Path = "masked") -> nn.Module:
    """A copy of ``teacher`` whose attentions (all, or ``cfg.layers``) are :class:`SparsifinerAttention`.

    The teacher's qkv / proj weights are copied; the predictors are freshly initialised (seed torch
    first for reproducibility) on the teacher's device and dtype.

    Args:
        teacher: a timm ``VisionTransformer`` (see :func:`check_vit`); not modified.
        cfg: predictor and attention options; default :class:`SparsifinerConfig`.
        path: "masked" (train form) or "sparse" (deploy form).

    Raises:
        ValueError: not a ViT (e.g. a Swin or a ResNet), a keep rate outside (0, 1], a layer that
            does not exist, or a dynamic image size.
    """
    cfg = cfg or SparsifinerConfig()
    if path not in ("masked", "sparse"):
        raise ValueError(f"path must be 'masked' (train form) or 'sparse' (deploy form), got {path!r}")
    check_vit(teacher)
    student = copy.deepcopy(teacher)
    t, p = num_tokens(student)
    budget(cfg.keep_rate, t)
    for i in _layers(student, cfg.layers):
        blk = student.blocks[i]
        if isinstance(blk.attn, (SparsifinerAttention, LinformerAttention)):
            raise ValueError(f"block {i} already has a {type(blk.attn).__name__}; start from the dense teacher")
        blk.attn = SparsifinerAttention.from_attention(blk.attn, t, p, cfg, path=path)
    return student


def replace_with_linformer(teacher: nn.Module, keep_rate: float, layers: tuple[int, ...] | None = None) -> nn.Module:
    """The Linformer baseline of Table 4: every attention projects keys and values to k = B = ⌈keep_rate · n⌉ rows.

    "We set the reduced dimension of Linformer equal to the sparse attention budget of
    Sparsifiner-S" (§4), so both models' attention-value products cost the same.
    """
    check_vit(teacher)
    student = copy.deepcopy(teacher)
    t, _ = num_tokens(student)
    k = budget(keep_rate, t)
    for i in _layers(student, layers):
        blk = student.blocks[i]
        if not isinstance(blk.attn, Attention):
            raise ValueError(f"block {i} has a {type(blk.attn).__name__}; start from the dense teacher")
        blk.attn = LinformerAttention.from_attention(blk.attn, t, k)
    return student


def sparse_attentions(model: nn.Module) -> list[tuple[int, SparsifinerAttention]]:
    """``[(block index, attention), …]`` of the Sparsifiner attentions, in block order."""
    model = _unwrap(model)
    return [(i, b.attn) for i, b in enumerate(getattr(model, "blocks", [])) if isinstance(getattr(b, "attn", None), SparsifinerAttention)]


def linformer_attentions(model: nn.Module) -> list[tuple[int, LinformerAttention]]:
    """``[(block index, attention), …]`` of the Linformer attentions, in block order."""
    model = _unwrap(model)
    return [(i, b.attn) for i, b in enumerate(getattr(model, "blocks", [])) if isinstance(getattr(b, "attn", None), LinformerAttention)]


def _require(model: nn.Module) -> list[tuple[int, SparsifinerAttention]]:
    found = sparse_attentions(model)
    if not found:
        raise ValueError(f"{type(_unwrap(model)).__name__} has no Sparsifiner attention; call replace_attention first")
    return found


def to_sparse_path(model: nn.Module) -> nn.Module:
    """Deploy conversion (§3 "Sparse MHSA"): every Sparsifiner attention computes only the kept pairs.

    Same parameters; inference only. Returns ``model`` (in place). Given the same connectivity
    mask the two forms agree to float rounding (≤ 1e-5). The kept-pair kernels round differently
    from the dense ones (~1e-6 in the residual stream), which can flip a top-k near-tie of a later
    layer's score map: measured on the trained demo model, at most 1 of ~50k patch-query rows per
    layer, logits within 1e-4, and identical validation accuracy.
    """
    for _, attn in _require(model):
        attn.path = "sparse"
    return model


def to_masked(model: nn.Module) -> nn.Module:
    """Back to the train form (masked dense computation). Returns ``model`` (in place)."""
    for _, attn in _require(model):
        attn.path = "masked"
    return model


@contextlib.contextmanager
def dense_attention(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block the Sparsifiner attentions compute full attention (phase 1); the predictors still run."""
    found = _require(model)
    saved = [a.dense for _, a in found]
    try:
        for _, a in found:
            a.dense = True
        yield model
    finally:
        for (_, a), d in zip(found, saved):
            a.dense = d


def predictor_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The connectivity predictors' parameters (W_down, W_up and optional q/k projections), all layers."""
    return [p for _, a in _require(model) for p in a.predictor.parameters()]


def freeze_for_phase1(model: nn.Module) -> nn.Module:
    """Phase 1 (§4): "we freeze the backbone model and train the connectivity mask predictor module". In place.

    For the Linformer baseline the new parameters are its projections E and F: they alone train
    (with :class:`~.losses.Phase2Loss`, as Linformer has no attention map to distil into a predictor),
    so that both models get the same two-phase schedule.
    """
    lin = linformer_attentions(model)
    found = sparse_attentions(model) if not lin else []
    if not found and not lin:
        _require(model)
    model.requires_grad_(False)
    for _, a in found:
        a.predictor.requires_grad_(True)
    for _, a in lin:
        a.e.requires_grad_(True)
        a.f.requires_grad_(True)
    return model


def unfreeze_all(model: nn.Module) -> nn.Module:
    """Phase 2 (§4): "we jointly train the backbone model and the connectivity mask predictor module". In place."""
    return model.requires_grad_(True)
