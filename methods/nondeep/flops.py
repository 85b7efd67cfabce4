"""Parameters and MACs of the branched, collapsed and baseline models beside the paper's Table 1.

Paper: "Non-deep Vision Transformers" (anonymous ICLR submission), Table 1 (and Tables 2, 6).

Counting convention. Every count is measured with ``methods.flops.count_macs`` (multiply-
accumulates of one 224² image, batch 1, random weights) and reported two ways:

- ``macs``: everything the counter sees (patch embedding, qkv, QKᵀ, AV, projections, FFN, head);
- ``macs_paper``: ``macs`` minus the attention matmuls QKᵀ and AV (``H · T² · 2r`` per attention
  of H heads of width r; for a parallel block n times that with r = d) — the paper's convention:
  DeiT-Tiny's 1.08 G and the DeiT-6/4/3 rows 556 / 381 / 293 M leave them out (with them, DeiT-Tiny
  is 1.25 G). The subtraction is checked against the counter's own SDPA-kernel count in the tests.

Elementwise work (LayerNorm, softmax, GELU, the λ mixing) is not counted, as in the paper.

Where the paper's "R" rows come from. §3.3 computes scores as ``X W Xᵀ`` with a stored D × D
matrix per head; values and output keep their d-wide heads (Eq. 7). Counting that form
(:func:`paper_r_form_cost`, H = 3 heads as in DeiT-Tiny, not the "12 heads" §4 mentions) reproduces
the **6-R row only**; 4-R and 3-R come out below the paper:

=========  ==========================  ==========================
row        params ours / paper         MACs (paper conv.) ours / paper
=========  ==========================  ==========================
D-MAE-6-R  3.267 M / 3.3 M (−1.0 %)    595.5 M / 595 M (+0.1 %)
D-MAE-4-R  2.304 M / 2.4 M (−4.0 %)    406.7 M / 415 M (−2.0 %)
D-MAE-3-R  1.823 M / 1.9 M (−4.0 %)    312.3 M / 322 M (−3.0 %)
=========  ==========================  ==========================

No accounting with a per-block cost independent of n can match all three: the paper's R rows exceed
its own DeiT-6/4/3 rows by 39 / 34 / 29 M MACs, i.e. 6.5 / 8.5 / 9.7 M per block for n = 2 / 3 / 4
branches, while this form (and any form whose block does not depend on n) adds the same T·D² = 7.3 M
per block. The growth fits ≈ 13 M · (1 − 1/n) per block, for which the paper gives no formula. That
form is not exact either (Eq. 7, see :mod:`methods.nondeep.collapse`). The exact collapses cost more:
:func:`table1` lists them beside the paper, and ``form="xwx_min"`` (the smallest exact form: 3.494 /
2.456 / 1.937 M parameters, 639 / 436 / 334 M MACs for n = 2 / 3 / 4) is 1.9–5.0 % above the 4-R and
3-R rows (params +2.3 / +1.9 %, MACs +5.0 / +3.8 %) and 5.9 / 7.4 % above 6-R.

§3.3's own operation counts (58.8 M for XWXᵀ vs 43.9 M for QKᵀ, 116.1 M for the FFN of one
DeiT-Tiny layer) are FLOPs at 2 per MAC: 43.9 M = 2·(2·T·D² + T²·D) (q, k projections and QKᵀ),
116.1 M = 2·(2·T·D·4D), and 58.8 M = 4·(T·D² + T²·D), i.e. the XWXᵀ path for *two* D × D
matrices — DeiT-Tiny's three heads would need 88.3 M. Table 1, by contrast, counts MACs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from timm.layers import Attention

from methods.flops import SDPA_OPS, count_macs

from .branched import ParallelBlock
from .collapse import XWXAttention
from .paper import PAPER_TABLE1

#: What each count includes (for tables and reports).
CONVENTIONS: dict[str, str] = {
    "unit": "MACs per image (1 multiply-add = 1), batch 1, random weights; the paper's Table 1 'FLOPs' are MACs",
    "macs": "everything methods.flops.count_macs sees: patch embedding, qkv, QK^T, AV, projections, FFN, head",
    "macs_paper": "macs minus the attention matmuls QK^T and AV (H·T²·2r per attention), as the paper's DeiT rows",
    "params": "all parameters incl. position embedding, class token and the 1000-class head",
}


@dataclass(frozen=True)
class Cost:
    """Size of one model at one resolution."""

    params: int  # parameters
    macs: int  # all MACs (count_macs)
    macs_paper: int  # without the attention matmuls (paper convention)


def attention_matmul_macs(model: nn.Module, tokens: int) -> int:
    """MACs of QKᵀ and AV in ``model`` for ``tokens`` tokens, from its structure (module docstring)."""
    total = 0
    for m in model.modules():
        if isinstance(m, Attention):
            total += m.num_heads * tokens * tokens * 2 * m.head_dim
        elif isinstance(m, XWXAttention):  # H heads of width D: (X M_hᵀ) Xᵀ and S_h V_h
            total += m.num_heads * tokens * tokens * 2 * m.head_dim
        elif isinstance(m, ParallelBlock):
            a = m.branches[0].attn
            total += m.num_branches * a.num_heads * tokens * tokens * 2 * a.head_dim
    return total


def _tokens(model: nn.Module) -> int:
    return model.patch_embed.num_patches + getattr(model, "num_prefix_tokens", 1)


@torch.no_grad()
def cost(model: nn.Module) -> Cost:
    """Parameters and MACs of ``model`` on one image of its own input size (see :data:`CONVENTIONS`)."""
    size = model.patch_embed.img_size
    chans = model.patch_embed.proj.in_channels
    ref = next(model.parameters())
    x = torch.zeros(1, chans, *size, dtype=ref.dtype, device=ref.device)
    macs = count_macs(model, x).total
    return Cost(sum(p.numel() for p in model.parameters()), macs, macs - attention_matmul_macs(model, _tokens(model)))


def sdpa_macs_counted(model: nn.Module) -> int:
    """The counter's own MACs in SDPA kernels (for checking :func:`attention_matmul_macs` on fused timm attention)."""
    size, chans = model.patch_embed.img_size, model.patch_embed.proj.in_channels
    ref = next(model.parameters())
    by_op = count_macs(model, torch.zeros(1, chans, *size, dtype=ref.dtype, device=ref.device)).by_op
    return sum(v for k, v in by_op.items() if k.split(".")[0] in SDPA_OPS)


def paper_r_form_cost(depth: int, dim: int = 192, heads: int = 3, head_dim: int = 64, hidden: int = 768,
                      tokens: int = 197, patch: int = 16, chans: int = 3, classes: int = 1000) -> Cost:
    """The paper's "R" form counted by hand: per head a stored D × D score matrix, d-wide V and O (module docstring).

    Per block: ``H·D²`` (score matrices) + ``D·H·d + H·d`` (V) + ``H·d·D + D`` (O) + FFN + 2 LayerNorms.
    Reproduces Table 1's D-MAE-6-R (params −1.0 %, MACs +0.1 %) but not 4-R (−4.0 %, −2.0 %) or 3-R
    (−4.0 %, −3.0 %): the paper's per-block cost grows with the branch count n, this one does not.
    """
    attn_p = heads * dim * dim + dim * heads * head_dim + heads * head_dim + heads * head_dim * dim + dim
    ffn_p = dim * hidden + hidden + hidden * dim + dim
    block_p = attn_p + ffn_p + 4 * dim
    embed_p = chans * patch * patch * dim + dim + dim + tokens * dim  # conv, its bias, cls token, pos embed
    head_p = 2 * dim + dim * classes + classes  # final norm + head
    attn_m = tokens * (heads * dim * dim + 2 * dim * heads * head_dim)  # X·W_h, V, O
    score_m = heads * tokens * tokens * (dim + head_dim)  # (XW)Xᵀ and AV
    ffn_m = tokens * 2 * dim * hidden
    embed_m = (tokens - 1) * chans * patch * patch * dim + dim * classes
    params = embed_p + depth * block_p + head_p
    macs_paper = embed_m + depth * (attn_m + ffn_m)
    return Cost(params, macs_paper + depth * score_m, macs_paper)


@dataclass(frozen=True)
class SizeRow:
    """One row of the size table."""

    model: str  # our name for the row
    paper_row: str | None  # the Table 1 row it stands beside
    cost: Cost  # measured (or, for the paper's R form, counted by hand)
    paper_params_m: float | None  # Table 1
    paper_flops_m: float | None  # Table 1 (MACs, paper convention)


def table1(base: str = "deit_tiny_patch16_224", depth: int = 12) -> list[SizeRow]:
    """Params and MACs of the teacher, the shallow baselines, the branched and the collapsed models (Table 1).

    Rows: ``DeiT-Tiny`` (12 blocks), per n ∈ {2, 3, 4}: ``DeiT-{L/n}`` (the teacher cut to L/n
    blocks), ``branched {L/n}x{n}`` (train form; = teacher size, Table 6 Block-1),
    ``collapsed {L/n} exact ({form})`` for the narrowest exact form and, where it differs, the
    other exact form, and ``paper R form {L/n}`` (:func:`paper_r_form_cost`). Random weights;
    nothing is downloaded.
    """
    import timm

    from . import forms  # noqa: F401  (registers the timm names)

    rows = [SizeRow("DeiT-Tiny", "DeiT-Tiny", cost(timm.create_model(base)), *_paper("DeiT-Tiny"))]
    for n in (2, 3, 4):
        shallow = depth // n
        rows.append(SizeRow(f"DeiT-{shallow}", f"DeiT-{shallow}", cost(timm.create_model(base, depth=shallow)),
                            *_paper(f"DeiT-{shallow}")))
        rows.append(SizeRow(f"branched {shallow}x{n}", None,
                            cost(timm.create_model("nondeep_branched", base=base, branches=n)), None, None))
        for form in ("concat", "xwx"):
            model = timm.create_model("nondeep_collapsed", base=base, branches=n, form=form)
            rows.append(SizeRow(f"collapsed {shallow} exact ({form})", f"D-MAE-{shallow}-R", cost(model),
                                *_paper(f"D-MAE-{shallow}-R")))
        rows.append(SizeRow(f"paper R form {shallow}", f"D-MAE-{shallow}-R", paper_r_form_cost(shallow),
                            *_paper(f"D-MAE-{shallow}-R")))
    return rows


def _paper(row: str) -> tuple[float, float]:
    r = PAPER_TABLE1[row]
    return r.params_m, r.flops_m


__all__ = ["CONVENTIONS", "Cost", "SizeRow", "attention_matmul_macs", "cost", "paper_r_form_cost",
           "sdpa_macs_counted", "table1"]
