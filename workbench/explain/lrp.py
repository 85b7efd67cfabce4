"""Relevance propagation: AttnLRP, CP-LRP and Chefer et al.'s LRP-based relevance (CVPR 2021).

The rules are :mod:`workbench.explain.lrp_rules` (our implementation of AttnLRP's rules; ``lxt`` 2.1 cannot be
imported next to transformers 5 and knows no timm model; see that module). LRP is covered by patents of the
Fraunhofer-Gesellschaft (the notice ``lxt`` carries): the README says so; check before commercial use.

- **attnlrp** (Achtibat et al., ICML 2024): the relevance of the input pixels, ``x ⊙ ∂̃y_t/∂x`` under AttnLRP's rules,
  summed over channels. Every differentiable form: attention, an LSTM (Arras et al.'s rules), a CNN (LRP-0).
- **cp_lrp** (Ali et al., ICML 2022): the same with the attention probabilities held constant.
- **chefer_lrp** (Chefer, Gur & Wolf, CVPR 2021, "Transformer Interpretability Beyond Attention Visualization",
  Eq. 13): for every block, Ā_l = E_h[(∇A_l ⊙ R_{A_l})⁺] with R_{A_l} the LRP relevance of the attention map
  (α1β0 on linear layers, their Eq. 4) and ∇A_l the plain gradient, rolled out as the generic method
  (R ← R + Ā_l R, :func:`workbench.explain.attention.generic_relevance`). Deviation: the layers between use AttnLRP's
  rules (LayerNorm's σ constant, identity rule on GELU, uniform rule on products) instead of Chefer's
  normalised binary operations; the attention relevance only weights the rollout, as in their Eq. 13.

Conservation: relevance leaves the network only through the biases (and, under AttnLRP, the softmax's bias term),
so on a model whose biases are zero the input relevance sums to the explained logit (``tests/test_explain_lrp.py``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn as nn

from methods.devices import differentiable
from methods.hooks import run_with_cache
from workbench.explain.attention import (
    attention_applies,
    attention_names,
    branch_groups,
    generic_relevance,
    grads_of,
    joined_blocks,
)
from workbench.explain.grids import token_layout, token_row
from workbench.explain.lrp_rules import LinearRule, LRPRules, Variant
from workbench.explain.registry import Maps, explainer

__all__ = ["lrp_relevance", "frozen"]


@contextlib.contextmanager
def frozen(model: nn.Module) -> Iterator[None]:
    """Weights without gradients while the block runs (the input carries the graph), restored afterwards."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in trainable:
            p.requires_grad_(False)
        with differentiable(model):
            yield
    finally:
        for p in trainable:
            p.requires_grad_(True)


def lrp_relevance(model: nn.Module, images: torch.Tensor, target: torch.Tensor, variant: Variant = "attnlrp",
                  linear_rule: LinearRule = "epsilon", record: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(relevance, logit, absorbed)``: the input relevance ``(B, C, H, W)``, the explained logit ``(B,)`` and, with
    ``record`` (AttnLRP), the relevance absorbed by the softmax bias terms ``(B,)`` (else None)."""
    rules = LRPRules(variant, linear_rule, record=record)
    with frozen(model), torch.enable_grad():
        x = images.detach().requires_grad_(True)
        with rules:
            logit = model(x).gather(1, target.view(-1, 1))[:, 0]  # (B,)
        nodes = [s for _, s in rules.absorbed]
        grads = torch.autograd.grad(logit.sum(), [x] + nodes, allow_unused=True)  # outside the mode: plain backward
    absorbed = None
    if record:
        b = len(images)
        absorbed = torch.zeros(b, dtype=torch.float64, device=images.device)
        for (term, _), g in zip(rules.absorbed, grads[1:]):
            if g is not None:  # (B·windows, heads, T, T) or (B, heads, T, T): batch-major
                absorbed += (term * g).double().reshape(b, -1).sum(1)
    return (x.detach() * grads[0]), logit.detach(), absorbed


@explainer("attnlrp", paper="Achtibat et al., ICML 2024 (AttnLRP; our rules, lxt's efficient form)", native="pixel")
def attnlrp(model: nn.Module, images: torch.Tensor, target: torch.Tensor) -> Maps:
    """AttnLRP relevance of the ``target`` logits, summed over channels."""
    return Maps(pixel=lrp_relevance(model, images, target, "attnlrp")[0].sum(1))


@explainer("cp_lrp", paper="Ali et al., ICML 2022 (CP-LRP: attention held constant)", native="pixel")
def cp_lrp(model: nn.Module, images: torch.Tensor, target: torch.Tensor) -> Maps:
    """CP-LRP relevance of the ``target`` logits, summed over channels."""
    return Maps(pixel=lrp_relevance(model, images, target, "cp")[0].sum(1))


def attention_relevance(model: nn.Module, images: torch.Tensor, target: torch.Tensor) -> list[torch.Tensor]:
    """Per block (forward order), the α1β0-LRP relevance ``A ⊙ ∂̃y_t/∂A`` of its attention maps."""
    names = attention_names(model)
    with frozen(model), torch.enable_grad():
        x = images.detach().requires_grad_(True)
        with LRPRules("attnlrp", "alpha1beta0"):
            logits, cache = run_with_cache(model, x, names=names, detach=False)
            score = logits.gather(1, target.view(-1, 1)).sum()
        pats = [cache[n] for n in names]
        grads = torch.autograd.grad(score, pats)
    return [p.detach() * g for p, g in zip(pats, grads)]


@explainer("chefer_lrp", applies=attention_applies,
           paper="Chefer, Gur & Wolf, CVPR 2021 (Transformer Interpretability Beyond Attention Visualization)")
def chefer_lrp(model: nn.Module, images: torch.Tensor, target: torch.Tensor) -> Maps:
    """Chefer's LRP-based relevance of the ``target`` logits (module docstring)."""
    rel = attention_relevance(model, images, target)
    pats, grads = grads_of(model, images, target)
    r = generic_relevance(branch_groups(model, rel), branch_groups(model, grads), joined_blocks(model, pats))
    return Maps(patch=token_row(r, token_layout(model, tuple(images.shape[-2:]))))
