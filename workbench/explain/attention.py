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
has no probabilities, Swin's windowed attention has no token-to-token map of the whole image.

A block of parallel branches (Non-deep, ``blocks.{l}.branches.{b}.attn.hook_pattern``) is read as the one block its
exact collapse is (:mod:`methods.nondeep.collapse`): joined branches (λ = 1) share one softmax, so their
probabilities are equal and the collapsed head's gradient is the sum of the branches' (Chefer's product is summed
over branches before the ReLU); unjoined branches (λ = 0) are the wide block's n·H separate heads (concatenated).
Raw attention and rollout average the probabilities over branches and heads, which is the collapsed model's head
mean in both cases. The explanations of a branched model and of its collapse are then equal (tested in float64).
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

__all__ = ["attention_applies", "attention_names", "branch_groups", "generic_relevance", "grads_of", "heads",
           "joined_blocks"]


def attention_applies(model: nn.Module) -> str | None:
    """None if the model has one token-to-token attention map per block, else why not."""
    if any(re.fullmatch(r"layers\.\d+\.blocks\.\d+\.hook_mixer_in", n) for n in hook_points(model)):
        return ("windowed attention (Swin, SlimSwin): each token attends within its window and the windows shift "
                "between blocks, and patch merging changes the grid between stages: no token-to-token map of the whole image "
                "to read or roll out (use gradcam, attnlrp, cp_lrp, ig or saliency)")
    points = hook_points(model)
    if getattr(model, "patch_embed", None) is None and any(n.endswith("attn.hook_pattern") for n in points):
        return ("local self-attention (SA-ResNet): each pixel attends to its own k x k neighbourhood, so there is no "
                "token-to-token map of the whole image to read or roll out (use gradcam, attnlrp, cp_lrp, ig or saliency)")
    if getattr(model, "patch_embed", None) is None or getattr(model, "blocks", None) is None:
        return ("attention explanations need a token model (patch_embed + blocks); a CNN has no tokens "
                "(use gradcam on its last stage, attnlrp, cp_lrp, ig or saliency)")
    try:
        points = attention_points(model, "vit")
    except ValueError:
        return ("the token mixer has no attention probabilities (no blocks.{i}.attn.hook_pattern; e.g. FAR's "
                "BiLSTM): gradcam, ig, saliency and LRP (attnlrp, cp_lrp: Arras et al.'s LSTM rules) apply")
    if len({p.layer for p in points}) != len(model.blocks):
        return (f"{len(points)} of {len(model.blocks)} blocks have attention probabilities; "
                "the rules propagate through every block")
    return None


def attention_names(model: nn.Module) -> list[str]:
    """The ``blocks.{l}[.branches.{b}].attn.hook_pattern`` names in block (then branch) order."""
    return [p.name for p in sorted(attention_points(model, "vit"), key=lambda p: (p.layer, p.branch or 0))]


def branch_groups(model: nn.Module, values: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``values`` in :func:`attention_names` order, grouped per block: ``[[branch 0, branch 1, ...], ...]``."""
    groups: dict[int, list[torch.Tensor]] = {}
    for p, v in zip(sorted(attention_points(model, "vit"), key=lambda p: (p.layer, p.branch or 0)), values):
        groups.setdefault(p.layer, []).append(v)
    return [groups[k] for k in sorted(groups)]


def heads(group: list[torch.Tensor]) -> torch.Tensor:
    """One block's branches as one head axis: ``(B, branches·heads, T, T)``."""
    return group[0] if len(group) == 1 else torch.cat(group, 1)


@torch.no_grad()
def _patterns(model: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    names = attention_names(model)
    _, cache = run_with_cache(model, images, names=names, stop_early=True)
    return [heads(g) for g in branch_groups(model, [cache[n] for n in names])]  # each (B, heads, T, T)


def grads_of(model: nn.Module, images: torch.Tensor, target: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``(patterns, ∂y_t/∂patterns)`` at every attention hook point (:func:`attention_names` order)."""
    names = attention_names(model)
    x = images.detach().requires_grad_(True)  # a graph even when the weights are frozen
    with torch.enable_grad():
        logits, cache = run_with_cache(model, x, names=names, detach=False)
        score = logits.gather(1, target.view(-1, 1)).sum()  # images are independent: one backward for the batch
        pats = [cache[n] for n in names]
        grads = torch.autograd.grad(score, pats)
    return [p.detach() for p in pats], list(grads)


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


def _cam(a: list[torch.Tensor], g: list[torch.Tensor], joined: bool) -> torch.Tensor:
    """One block's E_h[(∇A ⊙ A)⁺] ``(B, T, T)``; branches summed before the ReLU when ``joined``, else extra heads."""
    prods = [gi.double() * ai.double() for ai, gi in zip(a, g)]
    if joined:
        return torch.stack(prods).sum(0).clamp(min=0).mean(1)
    return heads(prods).clamp(min=0).mean(1)


def generic_relevance(patterns: list, grads: list, joined: list[bool] | None = None) -> torch.Tensor:
    """Chefer's (ICCV 2021) self-attention relevance from per-block probabilities and their gradients.

    Args:
        patterns: per block, forward order, ``(B, heads, T, T)`` attention probabilities A_l, or a list of them
            per branch (Non-deep; module docstring).
        grads: the matching ``∂ y_t / ∂ A_l``, same shapes.
        joined: per block, whether its branches share one softmax (default: their ``patterns`` are equal).

    Returns:
        ``(B, T, T)`` float64 relevance R (R⁰ = I; R ← R + E_h[(∇A ⊙ A)⁺] R per block).
    """
    patterns = [p if isinstance(p, list) else [p] for p in patterns]
    grads = [g if isinstance(g, list) else [g] for g in grads]
    if joined is None:
        joined = [all(torch.equal(a[0], ai) for ai in a[1:]) for a in patterns]
    b, _, t, _ = patterns[0][0].shape
    r = torch.eye(t, dtype=torch.float64, device=patterns[0][0].device).expand(b, t, t)
    for a, g, j in zip(patterns, grads, joined):
        r = r + _cam(a, g, j) @ r  # heads averaged after the ReLU
    return r


def joined_blocks(model: nn.Module, patterns: list[torch.Tensor]) -> list[bool]:
    """Per block, whether its branches share one softmax (equal probabilities: joined, λ = 1)."""
    return [all(torch.equal(g[0], gi) for gi in g[1:]) for g in branch_groups(model, patterns)]


@explainer("generic_attention", applies=attention_applies,
           paper="Chefer, Gur & Wolf, ICCV 2021 (Generic Attention-model Explainability)")
def generic_attention(model: nn.Module, images: torch.Tensor, target: torch.Tensor) -> Maps:
    """Chefer's generic attention explainability of the ``target`` logits (:func:`generic_relevance`)."""
    pats, grads = grads_of(model, images, target)
    r = generic_relevance(branch_groups(model, pats), branch_groups(model, grads))
    return Maps(patch=token_row(r, token_layout(model, tuple(images.shape[-2:]))))
