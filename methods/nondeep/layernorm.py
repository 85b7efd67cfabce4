"""LayerNorm factorisation (Non-deep ViT §3.2, Eq. 1–2): moving a LayerNorm's γ, β into linear layers.

Paper: "Non-deep Vision Transformers" (anonymous ICLR submission). Parallel branches may only share
a LayerNorm if each branch's own affine parameters leave it. The paper absorbs

- the FFN's LN *forward* into the first linear layer (Eq. 1, exact)::

      W₁ · LN(x) = (W₁ diag γ) · n(x) + (W₁ β + b₁)          n(x) = (x − μ) / σ

- the MHSA's LN *backward* into the previous block's last linear layer (Eq. 2)::

      W₂ⁿᵉʷ = diag(γ) W₂,   b₂ⁿᵉʷ = γ ⊙ b₂ + β

Eq. 2 is not exact: the LN normalises the residual stream ``x + W₂h + b₂``, not ``W₂h + b₂``, and
a scale applied before a normalisation is divided out again by it (``n(γ ⊙ y) ≠ γ ⊙ n(y)``).
:func:`absorb_layernorm_backward` applies it to a timm ViT so that the error can be measured
(``methods.nondeep.collapse_exactness`` reports it). We absorb *both* LNs forward instead
(:func:`absorb_layernorm_forward` — exact for attention too, see ``methods.nondeep.branched``); the
price the paper wanted to avoid, bias terms in q and k, is carried exactly by our collapse.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn


def _affine(norm: nn.Module, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(γ, β)`` of a LayerNorm (ones / zeros when it has no affine parameters)."""
    if not isinstance(norm, nn.LayerNorm):
        raise ValueError(f"expected a LayerNorm, got {type(norm).__name__}")
    d = norm.normalized_shape[-1]
    gamma = norm.weight.detach() if norm.weight is not None else like.new_ones(d)
    beta = norm.bias.detach() if norm.bias is not None else like.new_zeros(d)
    return gamma, beta


@torch.no_grad()
def absorb_layernorm_forward(linear: nn.Linear, norm: nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1: weight and bias of ``x ↦ linear(norm(x))`` acting on the affine-free ``n(x)``.

    Returns:
        ``(W diag γ, W β + b)`` with shapes ``(out, in)`` and ``(out,)`` (b = 0 without a bias).
    """
    w = linear.weight.detach()
    gamma, beta = _affine(norm, w)
    bias = linear.bias.detach() if linear.bias is not None else w.new_zeros(w.shape[0])
    return w * gamma[None, :], w @ beta + bias


@torch.no_grad()
def absorb_layernorm_backward(vit: nn.Module) -> nn.Module:
    """Eq. 2 applied literally to a timm ViT: a copy where every ``norm1``'s γ, β sit in the layer before.

    Block ``l``'s ``norm1`` loses its affine (γ = 1, β = 0); its γ, β go into block ``l−1``'s
    ``mlp.fc2`` (``W₂ ← diag(γ) W₂``, ``b₂ ← γ ⊙ b₂ + β``); block 0's go into the patch embedding
    (``conv ← diag(γ) conv``, ``b ← γ ⊙ b + β``), as §3.2 says. The result is *not* the same
    function (module docstring); compare its logits with the original's to see by how much.

    Raises:
        ValueError: ``vit`` has no timm ``Block``-style ``blocks`` with ``norm1`` / ``mlp.fc2``.
    """
    out = copy.deepcopy(vit)
    blocks = getattr(out, "blocks", None)
    if blocks is None or not all(hasattr(b, "norm1") and hasattr(b, "mlp") for b in blocks):
        raise ValueError(f"absorb_layernorm_backward needs a timm ViT made of Blocks; got {type(vit).__name__}")
    for i, blk in enumerate(blocks):
        gamma, beta = _affine(blk.norm1, blk.norm1.weight if blk.norm1.weight is not None else out.pos_embed)
        gamma, beta = gamma.clone(), beta.clone()
        prev = blocks[i - 1].mlp.fc2 if i > 0 else out.patch_embed.proj
        w = prev.weight  # fc2: (D, hidden); patch conv: (D, C, p, p)
        shape = (-1,) + (1,) * (w.dim() - 1)
        w.mul_(gamma.view(shape))
        if prev.bias is None:
            prev.bias = nn.Parameter(beta.clone())
        else:
            prev.bias.mul_(gamma).add_(beta)
        if blk.norm1.weight is not None:
            blk.norm1.weight.fill_(1.0)
        if blk.norm1.bias is not None:
            blk.norm1.bias.zero_()
    return out


__all__ = ["absorb_layernorm_backward", "absorb_layernorm_forward"]
