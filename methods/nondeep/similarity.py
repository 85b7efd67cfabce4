"""Branch similarity as plain tensors (Non-deep ViT App. C, Fig. 4–6).

Paper: "Non-deep Vision Transformers" (anonymous ICLR submission). Fig. 4 shows the cosine
similarity of branch *features* (attention and FFN outputs) before joining; Fig. 5–6 the
similarity of branch *weights* before and after joining. The paper does not define either measure
beyond "cosine similarity"; ours:

**Weights** — :func:`weight_similarity` returns ``(blocks, module, branch_i, branch_j)`` with
modules :data:`WEIGHT_MODULES`:

- ``qk``: per head ``W^Q_h W^K_hᵀ`` (D × D, the XWXᵀ matrix of §3.3), heads stacked;
- ``ov``: per head ``W^V_h W^O_h`` (D × D, what the head adds per attended token), heads stacked;
- ``fc1`` (F × D), ``fc2`` (D × F): the FFN weights.

``measure="cosine"`` (default): cosine of the flattened matrices. It depends on how hidden units
are ordered: two FFNs equal up to a permutation of their F units score ≈ 0. ``measure="cka"``:
cosine of the Gram matrices over the unit side (``fc1``: ``W₁ᵀW₁``; ``fc2``: ``W₂W₂ᵀ``), which is
linear CKA between the maps' outputs for white inputs and invariant to any rotation or permutation
of hidden units; ``qk`` and ``ov`` are already basis-free within a head, and stay as they are.
Weights are read as they act on the shared LayerNorm's output (our branches hold their teacher
block's LN affine, Eq. 1).

**Features** — :func:`feature_similarity` returns ``(blocks, module, branch_i, branch_j)`` with
modules :data:`FEATURE_MODULES` (``attn``: branch attention output O_b; ``ffn``: branch FFN
output), on given images: ``measure="cosine"`` is the cosine over D per token averaged over
tokens and images (the quantity the diversity regulariser squares); ``measure="cka"`` is linear
CKA over all (image, token) rows.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from methods.cka import cka_matrix
from methods.hooks import run_with_cache

from .branched import parallel_blocks, score_matrices, value_output_matrices

WEIGHT_MODULES: tuple[str, ...] = ("qk", "ov", "fc1", "fc2")
FEATURE_MODULES: tuple[str, ...] = ("attn", "ffn")
Measure = Literal["cosine", "cka"]


def _cosine_matrix(flat: torch.Tensor) -> torch.Tensor:
    """``(n, P) -> (n, n)`` cosine similarity of rows (float64)."""
    flat = flat.double()
    norm = flat.norm(dim=-1, keepdim=True)
    unit = flat / norm.where(norm > 0, torch.nan)  # a zero matrix has no direction: NaN, not 0
    return unit @ unit.t()


def _check_measure(measure: str) -> None:
    if measure not in ("cosine", "cka"):
        raise ValueError(f"unknown similarity measure {measure!r}; choose 'cosine' or 'cka'")


@torch.no_grad()
def branch_weights(model: nn.Module, module: str, measure: Measure = "cosine") -> list[torch.Tensor]:
    """Per block, the ``(n, P)`` flattened branch matrices compared by :func:`weight_similarity`."""
    _check_measure(measure)
    if module not in WEIGHT_MODULES:
        raise ValueError(f"unknown module {module!r}; choose from {WEIGHT_MODULES}")
    out = []
    for pb in _blocks(model):
        mats = []
        for br in pb.branches:
            if module == "qk":
                m = score_matrices(br.attn)  # (H, D, D)
            elif module == "ov":
                m = value_output_matrices(br.attn)  # (H, D, D)
            elif module == "fc1":
                w = br.mlp.fc1.weight  # (F, D)
                m = w.t() @ w if measure == "cka" else w
            else:
                w = br.mlp.fc2.weight  # (D, F)
                m = w @ w.t() if measure == "cka" else w
            mats.append(m.reshape(-1))
        out.append(torch.stack(mats))
    return out


@torch.no_grad()
def weight_similarity(model: nn.Module, measure: Measure = "cosine") -> torch.Tensor:
    """Similarity of branch weights, ``(blocks, len(WEIGHT_MODULES), n, n)`` float64 (module docstring)."""
    per_module = [[_cosine_matrix(w) for w in branch_weights(model, m, measure)] for m in WEIGHT_MODULES]
    return torch.stack([torch.stack(blocks) for blocks in per_module], dim=1)


@torch.no_grad()
def update_similarity(before: nn.Module, after: nn.Module) -> torch.Tensor:
    """Cosine similarity of the branches' weight *changes* from ``before`` to ``after``, ``(blocks, 4, n, n)`` float64.

    For each module of :data:`WEIGHT_MODULES` the change of the compared matrix (``qk``: Δ(W^Q_h W^K_hᵀ),
    ``ov``: Δ(W^V_h W^O_h), ``fc1``, ``fc2``: ΔW) of branch i against branch j. At λ = 1 every branch's FFN
    sees the same GELU input and the same output gradient, so plain gradient descent moves ``fc1`` and
    ``fc2`` of all branches by the same amount (similarity 1); Adam's per-branch second moments and
    weight decay bend that only slightly. Branches that keep receiving equal updates grow alike: the
    mechanism behind the rising FFN weight similarity after joining (Fig. 6, App. C.3). Zero change
    gives NaN.

    Args:
        before, after: the same branched model at two points of training (e.g. when λ reached 1, and at the end).
    """
    out = []
    for m in WEIGHT_MODULES:
        a, b = branch_weights(before, m), branch_weights(after, m)
        if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
            raise ValueError("before and after must be the same branched architecture")
        out.append(torch.stack([_cosine_matrix(y.double() - x.double()) for x, y in zip(a, b)]))
    return torch.stack(out, dim=1)


@torch.no_grad()
def branch_features(model: nn.Module, images: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """Branch outputs on ``images``: ``{"attn": [(n, B, T, D)] * blocks, "ffn": [...]}``."""
    blocks = _blocks(model)
    n = blocks[0].num_branches
    names = ["blocks.*.branches.*.attn.hook_out", "blocks.*.branches.*.mlp.hook_out"]
    _, cache = run_with_cache(model, images, names=names)
    return {mod: [torch.stack([cache[f"blocks.{i}.branches.{b}.{hook}.hook_out"] for b in range(n)])
                  for i in range(len(blocks))]
            for mod, hook in (("attn", "attn"), ("ffn", "mlp"))}


@torch.no_grad()
def feature_similarity(model: nn.Module, images: torch.Tensor, measure: Measure = "cosine") -> torch.Tensor:
    """Similarity of branch outputs, ``(blocks, len(FEATURE_MODULES), n, n)`` float64 (module docstring).

    The model runs in its current train / eval mode (use eval for analyses).
    """
    _check_measure(measure)
    feats = branch_features(model, images)
    out = torch.zeros(len(feats["attn"]), len(FEATURE_MODULES), *(feats["attn"][0].shape[:1] * 2), dtype=torch.float64)
    for m, mod in enumerate(FEATURE_MODULES):
        for i, f in enumerate(feats[mod]):
            f = f.double()
            n = f.shape[0]
            if measure == "cosine":
                unit = F.normalize(f, dim=-1, eps=1e-300)  # (n, B, T, D)
                out[i, m] = torch.einsum("abtd,cbtd->ac", unit, unit) / (f.shape[1] * f.shape[2])
            else:
                rows = f.reshape(n, -1, f.shape[-1])  # (n, B·T, D)
                out[i, m] = torch.tensor(cka_matrix(list(rows), list(rows), estimators=("biased",))[0])  # linear CKA
    return out


def _blocks(model: nn.Module):
    blocks = parallel_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no parallel blocks: branch similarity needs the branched form "
                         "(methods.nondeep.branch / timm 'nondeep_branched')")
    return blocks


__all__ = ["FEATURE_MODULES", "WEIGHT_MODULES", "Measure", "branch_features", "branch_weights", "feature_similarity",
           "update_similarity", "weight_similarity"]
