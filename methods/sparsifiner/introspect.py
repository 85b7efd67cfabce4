"""What a Sparsifiner model learned, as plain tensors (the workbench turns them into Datasets).

Paper: Wei et al., "Sparsifiner: Learning Sparse Instance-Dependent Attention for Efficient Vision
Transformers", CVPR 2023 — Fig. 3 (connectivity masks, sparse vs full attention of one query),
Fig. 6 (the sparse basis W_up as images), Fig. 7 (basis coefficients of one head over the layers).

Shapes use ``L`` for the Sparsifiner layers (:func:`~.replace.sparse_attentions` order; their block
indices are returned as ``layers``), ``r`` = n_down, ``T`` tokens of which ``P`` prefix (CLS) tokens,
and the patch grid ``(gh, gw)`` with ``T = P + gh·gw``.
"""

from __future__ import annotations

import torch
from torch import nn

from ..hooks import run_with_cache
from ..train import unwrap as _unwrap
from .replace import sparse_attentions


def _found(model: nn.Module):
    found = sparse_attentions(model)
    if not found:
        raise ValueError(f"{type(_unwrap(model)).__name__} has no Sparsifiner attention; call replace_attention first")
    return found


@torch.no_grad()
def sparse_basis(model: nn.Module, thresholded: bool = True) -> torch.Tensor:
    """W_up of every layer, ``(L, r, T)``: as used (thresholded, the default) or the raw parameter."""
    return torch.stack([(a.predictor.basis() if thresholded else a.predictor.w_up).detach() for _, a in _found(model)])


def grid_shape(model: nn.Module) -> tuple[int, int]:
    """``(gh, gw)``: the patch grid of a timm ViT."""
    gh, gw = _unwrap(model).patch_embed.grid_size
    return int(gh), int(gw)


@torch.no_grad()
def basis_grid(model: nn.Module, thresholded: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The sparse basis on the patch grid (Fig. 6): ``(grid (L, r, gh, gw), prefix (L, r, P))``.

    Entry ``[l, j, y, x]`` is the weight basis vector j of layer l gives the key at patch (y, x);
    the prefix (CLS) keys' weights are kept apart in ``prefix``.
    """
    basis = sparse_basis(model, thresholded)  # (L, r, T)
    p = _found(model)[0][1].num_prefix_tokens
    gh, gw = grid_shape(model)
    return basis[..., p:].reshape(*basis.shape[:2], gh, gw), basis[..., :p]


@torch.no_grad()
def connectivity(model: nn.Module, images: torch.Tensor, full: bool = True) -> dict[str, torch.Tensor]:
    """Masks, sparse and full attention, and the predictor's values for ``images``, in one forward.

    Args:
        model: a Sparsifiner model (either form); run in its current train/eval mode (use eval).
        images: ``(B, C, H, W)``.
        full: also return the dense attention for the same queries (one extra softmax per layer).

    Returns:
        ``layers`` (block indices, ``(L,)``) and, stacked over layers along dim 1:
        ``mask`` ``(B, L, H, T, T)`` bool, ``pattern`` sparse attention ``(B, L, H, T, T)``,
        ``pattern_full`` ``(B, L, H, T, T)`` (if ``full``), ``a_down`` and ``coef`` ``(B, L, H, T-P, r)``,
        ``score`` ``(B, L, H, T-P, T)``, ``logits`` ``(B, classes)``.
    """
    found = _found(model)
    keys = {"mask": "hook_mask", "pattern": "hook_pattern", "a_down": "predictor.hook_a_down",
            "coef": "predictor.hook_coef", "score": "predictor.hook_score"}
    if full:
        keys["pattern_full"] = "hook_pattern_full"
    names = {k: [f"blocks.{i}.attn.{suffix}" for i, _ in found] for k, suffix in keys.items()}
    logits, cache = run_with_cache(_unwrap(model), images, names=[n for ns in names.values() for n in ns])
    out = {k: torch.stack([cache[n] for n in ns], dim=1) for k, ns in names.items()}
    out["layers"] = torch.tensor([i for i, _ in found])
    out["logits"] = logits
    return out


def sparsity(values: dict[str, torch.Tensor], basis: torch.Tensor | None = None, prefix: int = 1) -> dict[str, torch.Tensor]:
    """Sparsity (share of zeros) per layer of the basis, the coefficients and the masks, and the realised budget.

    Args:
        values: :func:`connectivity`'s output.
        basis: :func:`sparse_basis` ``(L, r, T)``; its sparsity is reported when given.
        prefix: P.

    Returns:
        ``coef`` ``(L,)``: zeros in Ã_down; ``mask`` ``(L,)``: entries of M off (prefix rows included);
        ``kept_per_row`` ``(B, L, H, T-P)``: keys kept by each patch query (exactly B when the budget is met);
        ``keep_rate`` ``(L,)``: mean kept / T over patch rows; ``basis`` ``(L,)`` if ``basis`` is given, and
        ``up_density`` ``(L,)``: the share of the dense up-projection Ã_down W̃_up that a sparse-sparse
        product does (Σ over nonzero coefficients of the nonzeros of their basis row, / (r·T)) — the ρ of
        :func:`~.flops.sparsifiner_mhsa_macs`.
    """
    coef = values["coef"]  # (B, L, H, T-P, r)
    mask = values["mask"]  # (B, L, H, T, T)
    kept = mask[..., prefix:, :].sum(-1)  # (B, L, H, T-P)
    out = {
        "coef": (coef == 0).float().mean(dim=(0, 2, 3, 4)),
        "mask": (~mask).float().mean(dim=(0, 2, 3, 4)),
        "kept_per_row": kept,
        "keep_rate": kept.float().mean(dim=(0, 2, 3)) / mask.shape[-1],
    }
    if basis is not None:
        out["basis"] = (basis == 0).float().mean(dim=(1, 2))
        per_basis = (basis != 0).sum(-1).float()  # (L, r): nonzeros of each basis vector
        products = torch.einsum("blhir,lr->blhi", (coef != 0).float(), per_basis)  # (B, L, H, T-P)
        out["up_density"] = products.mean(dim=(0, 2, 3)) / (basis.shape[1] * basis.shape[2])
    return out
