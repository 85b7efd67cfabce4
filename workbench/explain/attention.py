"""Explanations read from attention: raw attention, attention rollout, Chefer's generic attention explainability.

All three read the attention probabilities at the hook points ``blocks.{l}.attn.hook_pattern`` (:mod:`methods.hooks`;
for timm's attention the adapter switches the fused SDPA path off while hooked, so the probabilities exist and are
the ones multiplied into ``v``). A token-to-token relevance ``(B, T, T)`` becomes a patch map through the classifier
token's row (:func:`workbench.explain.grids.token_row`).

- **raw_attention**: the last block's probabilities, mean over heads. Class-agnostic.
- **rollout** (Abnar & Zuidema 2020): exactly :func:`workbench.analysis.attribution.attention_rollout`
  (Â_l = ½ Ā_l + ½ I, rows renormalised, R = Â_{L−1} ⋯ Â_0). Class-agnostic.
- **generic_attention** (Chefer, Gur & Wolf, ICCV 2021, "Generic Attention-model Explainability", Eq. 5–6 for
  self-attention): R⁰ = I; for every block l in forward order, Ā_l = E_h[(∇A_l ⊙ A_l)⁺] and R ← R + Ā_l · R, where
  ∇A_l = ∂ y_t / ∂ A_l is the gradient of the explained logit y_t. Class-specific.

``applies`` says why a form has no such explanation: a CNN has no tokens, an attention-free mixer (FAR's BiLSTM)
has no probabilities, Swin's windowed attention has no token-to-token map of the whole image, and a block of
parallel branches (Non-deep) would need a rule for summed branches that is still to come.
"""

from __future__ import annotations

import re

import torch
import torch.nn as nn

from methods.hooks import hook_points, run_with_cache
from workbench.analysis.attention import attention_points
from workbench.analysis.attribution import attention_rollout
from workbench.explain.grids import token_layout, token_row
from workbench.explain.registry import Maps, explainer

__all__ = ["attention_applies", "attention_names", "generic_relevance"]


def attention_applies(model: nn.Module) -> str | None:
    """None if the model has one token-to-token attention map per block, else why not."""
    if any(re.fullmatch(r"layers\.\d+\.blocks\.\d+\.attn\.hook_pattern", n) for n in hook_points(model)):
        return "windowed attention (Swin) has no token-to-token map of the whole image"
    if getattr(model, "patch_embed", None) is None or getattr(model, "blocks", None) is None:
        return ("attention explanations need a token model (patch_embed + blocks); a CNN has no tokens "
                "(use gradcam on its last stage, ig or saliency)")
    try:
        points = attention_points(model, "vit")
    except ValueError:
        return ("the token mixer has no attention probabilities (no blocks.{i}.attn.hook_pattern; e.g. FAR's "
                "BiLSTM): gradient methods (gradcam, ig, saliency) apply")
    if any(p.branch is not None for p in points):
        return "blocks of parallel attention branches (Non-deep): the relevance rule for summed branches is still to come"
    if len(points) != len(model.blocks):
        return (f"{len(points)} of {len(model.blocks)} blocks have attention probabilities; "
                "the rules propagate through every block")
    return None


def attention_names(model: nn.Module) -> list[str]:
    """The ``blocks.{l}.attn.hook_pattern`` names in block order."""
    return [p.name for p in sorted(attention_points(model, "vit"), key=lambda p: p.layer)]


@torch.no_grad()
def _patterns(model: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    names = attention_names(model)
    _, cache = run_with_cache(model, images, names=names, stop_early=True)
    return [cache[n] for n in names]  # each (B, heads, T, T)


@explainer("raw_attention", applies=attention_applies, class_specific=False,
           paper="raw attention of the last block (the baseline of Chefer et al., CVPR 2021)")
def raw_attention(model: nn.Module, images: torch.Tensor, target: torch.Tensor) -> Maps:
    """The last block's attention, mean over heads, classifier row over the patches."""
    last = _patterns(model, images)[-1].double().mean(1)  # (B, T, T)
    return Maps(patch=token_row(last, token_layout(model, tuple(images.shape[-2:]))))


@explainer("rollout", applies=attention_applies, class_specific=False, paper="Abnar & Zuidema, ACL 2020")
def rollout(model: nn.Module, images: torch.Tensor, target: torch.Tensor) -> Maps:
    """Attention rollout (:func:`workbench.analysis.attribution.attention_rollout`), classifier row."""
    r = attention_rollout(_patterns(model, images))  # (B, T, T) float64
    return Maps(patch=token_row(r, token_layout(model, tuple(images.shape[-2:]))))


def generic_relevance(patterns: list[torch.Tensor], grads: list[torch.Tensor]) -> torch.Tensor:
    """Chefer's (ICCV 2021) self-attention relevance from per-block probabilities and their gradients.

    Args:
        patterns: per block, forward order, ``(B, heads, T, T)`` attention probabilities A_l.
        grads: the matching ``∂ y_t / ∂ A_l``, same shapes.

    Returns:
        ``(B, T, T)`` float64 relevance R (R⁰ = I; R ← R + E_h[(∇A ⊙ A)⁺] R per block).
    """
    b, _, t, _ = patterns[0].shape
    r = torch.eye(t, dtype=torch.float64, device=patterns[0].device).expand(b, t, t)
    for a, g in zip(patterns, grads):
        cam = (g.double() * a.double()).clamp(min=0).mean(1)  # (B, T, T): heads averaged after the ReLU
        r = r + cam @ r
    return r


@explainer("generic_attention", applies=attention_applies,
           paper="Chefer, Gur & Wolf, ICCV 2021 (Generic Attention-model Explainability)")
def generic_attention(model: nn.Module, images: torch.Tensor, target: torch.Tensor) -> Maps:
    """Chefer's generic attention explainability of the ``target`` logits (:func:`generic_relevance`)."""
    names = attention_names(model)
    x = images.detach().requires_grad_(True)  # a graph even when the weights are frozen
    with torch.enable_grad():
        logits, cache = run_with_cache(model, x, names=names, detach=False)
        score = logits.gather(1, target.view(-1, 1)).sum()  # images are independent: one backward for the batch
        pats = [cache[n] for n in names]
        grads = torch.autograd.grad(score, pats)
    r = generic_relevance([p.detach() for p in pats], list(grads))
    return Maps(patch=token_row(r, token_layout(model, tuple(images.shape[-2:]))))
