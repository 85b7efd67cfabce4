"""Structural reparameterisation: collapse a joined branched model into a plain timm ViT (§3.3, Eq. 5–7).

Paper: "Non-deep Vision Transformers" (anonymous ICLR submission). At λ = 1 every branch of a
parallel block feeds the same tensor to its softmax and to its GELU, so the block is one ordinary
pre-norm block. What that block is, exactly:

- **Scores.** Head h's logits are ``Σ_b q_{b,h} k_{b,h}ᵀ / (√n √d)`` — the rectified scale
  √(1+(n−1)λ²)·√d at λ = 1. With q and k biases (every timm ViT has them, and Eq. 1's forward LN
  absorption creates them from β) the sum ``Σ_b (X W^Q_b + a_b)(X W^K_b + c_b)ᵀ`` holds, beyond
  ``X (Σ_b W^Q_b W^K_bᵀ) Xᵀ``, a *per-key* term ``Σ_b a_b W^K_bᵀ x_j`` that softmax does not
  cancel (per-query terms and constants it does). Concatenating the n branches' q's (and k's)
  into one head of width n·d carries every term, and timm's scale 1/√(n·d) *is* the rectified one.
- **Values and output.** The block adds ``Σ_b S_h V_{b,h} W^O_{b,h} = S_h X (Σ_b W^V_{b,h} W^O_{b,h})``.
  Concatenating the values and stacking the W^O blocks gives exactly that.
- **FFN.** Eq. 9 at λ = 1: ``W₁ = Σ_b W_{1,b}``, ``W₂ = Σ_b W_{2,b}``, biases summed — exact (§3.3).

The exact collapse is therefore a timm ``Block`` whose ``Attention`` has H heads of width
``n·d`` (``attn_head_dim``; form ``"concat"``). When ``n·d > D`` a narrower exact form exists,
``"xwx"``: heads of width D with ``q = X (Σ_b W^Q_b W^K_bᵀ) + per-key bias``, ``k = X``,
``v = X Σ_b W^V_b W^O_b`` and an identity output block per head; ``"auto"`` takes the narrower.
Either is an ordinary ``timm.models.vision_transformer.VisionTransformer``.

**The smallest exact form** (``"xwx_min"``, :class:`XWXAttention`). timm's ``Attention`` makes the
``"xwx"`` form store ``k = X`` and the output blocks as two D × D identity matrices per head. Without
them a head is ``S_h = softmax((X M_hᵀ + 1 m_hᵀ) Xᵀ · s)`` and adds ``S_h (X G_hᵀ + 1 g_hᵀ)``: two D × D
matrices and two D-vectors per head (2·H·(D² + D) attention parameters and the output bias), which is
also below ``"concat"``'s 4·H·n·d·D whenever 2·n·d > D (every n ≥ 2 on DeiT-Tiny: d = 64, D = 192).
DeiT-Tiny at 224² (whole model; 6 / 4 / 3 blocks), parameters concat / xwx / xwx_min: n = 2:
3.936 / 4.825 / 3.494 M; n = 3: 3.343 / 3.343 / 2.456 M; n = 4: 3.046 / 2.602 / 1.937 M (the 2.602 M
that ``"auto"`` gives at n = 4 holds 0.664 M of identity matrices and zero key biases, 2·H·D² + H·D
per block). MACs without the attention matmuls: n = 2: 726 / 901 / 639 M; n = 3: 610 / 610 / 436 M;
n = 4: 552 / 465 / 334 M. ``"auto"`` keeps choosing among the plain-timm forms. The blocks are timm
``Block`` modules whose ``attn`` is an :class:`XWXAttention` (not a timm ``Attention``: hook points that
expect ``qkv`` are not there).

The paper's own merge (Eq. 6–7, Algorithm 1 line 22, "W_final = Σ_b W_b") is kept as variants,
each changing one formula so its error can be seen on its own (:data:`COLLAPSE_VARIANTS`):

- ``paper_vo``: ``W^V = Σ_b W^V_b``, ``W^O = Σ_b W^O_b`` (Eq. 7) — the product has cross terms
  ``W^V_b W^O_{b'}``; even n identical branches come out n× too large.
- ``paper_scale``: Eq. 6's ``2√d_k`` (``n√d_k``) instead of the rectified ``√2·√d_k`` the model
  was trained with (§3.3's own rectification at λ = 1).
- ``paper_qk_bias``: scores ``X (Σ_b W_b) Xᵀ`` only — the per-key bias term dropped.
- ``paper``: all three at once (Eq. 5–7 as printed).

At λ = 0 the branches do not interact, and the block is exactly a *wide* timm block with n·H heads
of width d and an FFN of width n·F (form ``"wide"``; the paper's "no joining" row of Table 5 and
its D-MAE-l-n models of Table 6).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.nn as nn
from timm.layers import Attention, Mlp
from timm.models.vision_transformer import Block, VisionTransformer

from methods.devices import exact_float32

from .branched import ParallelBlock, parallel_blocks
from .layernorm import absorb_layernorm_backward
from .schedules import get_lambda

#: Which merge formulas (module docstring).
CollapseVariant = Literal["exact", "paper", "paper_vo", "paper_scale", "paper_qk_bias"]
#: Shape of the collapsed attention (module docstring).
Form = Literal["auto", "concat", "xwx", "xwx_min", "wide"]
FORMS: tuple[str, ...] = get_args(Form)


@dataclass(frozen=True)
class MergeFormulas:
    """The formulas one collapse variant uses."""

    vo: Literal["exact", "eq7"]  # per-head Σ_b W^V_b W^O_b, or Eq. 7's (Σ W^V)(Σ W^O)
    scale: Literal["rectified", "eq6"]  # 1/(√n √d) as trained, or Eq. 6's 1/(n √d)
    qk_bias: bool  # keep the q/k bias terms of the scores (False: X W Xᵀ only)
    equations: str  # where the paper states the formulas
    description: str  # one line for tables


COLLAPSE_VARIANTS: dict[str, MergeFormulas] = {
    "exact": MergeFormulas("exact", "rectified", True, "Eq. 5, 9 (corrected)",
                           "per-head Σ_b W^V_b W^O_b, q/k bias terms kept, rectified scale √n·√d"),
    "paper_vo": MergeFormulas("eq7", "rectified", True, "Eq. 6–7",
                              "value/output merge W^V = Σ_b W^V_b, W^O = Σ_b W^O_b (cross terms)"),
    "paper_scale": MergeFormulas("exact", "eq6", True, "Eq. 6",
                                 "score scale n·√d (Eq. 6's 2√d_k) instead of the rectified √n·√d"),
    "paper_qk_bias": MergeFormulas("exact", "rectified", False, "Eq. 5–6",
                                   "scores X(Σ_b W^Q_b W^K_bᵀ)Xᵀ without the per-key bias term"),
    "paper": MergeFormulas("eq7", "eq6", False, "Eq. 5–7, Alg. 1 l. 22", "all of the paper's formulas"),
}


def resolve_form(form: str, branches: int, head_dim: int, dim: int) -> str:
    """``"auto"`` -> ``"concat"`` if ``n·d ≤ D`` else ``"xwx"``; other forms are checked and returned."""
    if form not in FORMS:
        raise ValueError(f"unknown collapse form {form!r}; choose one of {', '.join(FORMS)}")
    if form == "auto":
        return "concat" if branches * head_dim <= dim else "xwx"
    return form


def collapsed_head_dim(form: str, branches: int, head_dim: int, dim: int) -> tuple[int, int]:
    """``(heads per teacher head, head width)`` of a collapsed attention: concat (1, n·d), xwx / xwx_min (1, D),
    wide (n, d)."""
    form = resolve_form(form, branches, head_dim, dim)
    return {"concat": (1, branches * head_dim), "xwx": (1, dim), "xwx_min": (1, dim), "wide": (branches, head_dim)}[form]


class XWXAttention(nn.Module):
    """The smallest exact collapsed attention (module docstring): per head ``S_h = softmax((X M_hᵀ + m_h) Xᵀ · s)``,
    output ``Σ_h S_h (X G_hᵀ + g_h) + b``. No key or output projection is stored.

    Parameters: ``m`` ``(H, D, D)``, ``m_bias`` ``(H, D)``, ``g`` ``(H, D, D)``, ``g_bias`` ``(H, D)``, ``proj_bias``
    ``(D,)`` (or None). Called like timm's ``Attention`` (``attn_mask``, ``is_causal``).
    """

    def __init__(self, dim: int, num_heads: int, scale: float, proj_bias: bool = True, attn_drop: float = 0.0):
        super().__init__()
        self.num_heads, self.head_dim, self.scale = num_heads, dim, scale
        self.m = nn.Parameter(torch.zeros(num_heads, dim, dim))  # M_h = Σ_b W^K_{b,h}ᵀ W^Q_{b,h}
        self.m_bias = nn.Parameter(torch.zeros(num_heads, dim))  # m_h = Σ_b W^K_{b,h}ᵀ a_{b,h} (the per-key term)
        self.g = nn.Parameter(torch.zeros(num_heads, dim, dim))  # G_h = Σ_b W^O_{b,h} W^V_{b,h}
        self.g_bias = nn.Parameter(torch.zeros(num_heads, dim))  # g_h = Σ_b W^O_{b,h} c^V_{b,h}
        self.proj_bias = nn.Parameter(torch.zeros(dim)) if proj_bias else None
        self.attn_drop = attn_drop

    def extra_repr(self) -> str:
        return f"dim={self.head_dim}, num_heads={self.num_heads}, scale={self.scale:.4g}"

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        b, t, dim = x.shape
        q = torch.einsum("btd,hed->bhte", x, self.m) + self.m_bias[:, None]  # (B, H, T, D)
        v = torch.einsum("btd,hed->bhte", x, self.g) + self.g_bias[:, None]  # (B, H, T, D)
        k = x.unsqueeze(1).expand(b, self.num_heads, t, dim)  # k = X for every head: (B, H, T, D), a view
        out = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=self.scale,
            dropout_p=self.attn_drop if self.training else 0.0)  # (B, H, T, D)
        out = out.sum(1)  # Σ_h: (B, T, D)
        return out if self.proj_bias is None else out + self.proj_bias


# ------------------------------------------------------------------------------------ one block
@torch.no_grad()
def _collapse_block(pb: ParallelBlock, form: str, f: MergeFormulas) -> Block:
    """A timm ``Block`` equal to ``pb`` at λ = 1 (λ = 0 for ``"wide"``) under the formulas ``f``."""
    n = pb.num_branches
    a0, m0 = pb.branches[0].attn, pb.branches[0].mlp
    dim, heads, d, hidden = a0.qkv.in_features, a0.num_heads, a0.head_dim, m0.fc1.out_features
    form = resolve_form(form, n, d, dim)
    mult, r = collapsed_head_dim(form, n, d, dim)
    ref = a0.qkv.weight
    has_proj_bias = a0.proj.bias is not None

    w = torch.stack([br.attn.qkv.weight for br in pb.branches]).view(n, 3, heads, d, dim)  # (n, 3, H, d, D)
    b = torch.stack([br.attn.qkv.bias for br in pb.branches]).view(n, 3, heads, d)  # (n, 3, H, d)
    wq, wk, wv = w.unbind(1)  # (n, H, d, D): q_{b,h} = wq[b, h] x + bq[b, h]
    bq, bk, bv = b.unbind(1)  # (n, H, d)
    p = torch.stack([br.attn.proj.weight for br in pb.branches]).view(n, dim, heads, d)  # W^O_{b,h}ᵀ = p[b, :, h]
    p_bias = sum(br.attn.proj.bias for br in pb.branches) if has_proj_bias else None
    if not f.qk_bias:
        bq, bk = torch.zeros_like(bq), torch.zeros_like(bk)
    if form == "wide":
        rho = 1.0  # λ = 0: no rectification
    else:
        rho = math.sqrt(n) if pb.rectify else 1.0
    want = 1.0 / ((n if f.scale == "eq6" else rho) * math.sqrt(d))  # the score scale to reproduce
    q_factor = want * math.sqrt(r)  # timm scales by r^-1/2

    if form in ("concat", "wide"):
        if f.vo == "eq7":  # Σ_b W^V in the first d slots of each head, Σ_b W^O in the matching rows
            wv_new, bv_new, p_new = torch.zeros_like(wv), torch.zeros_like(bv), torch.zeros_like(p)
            wv_new[0], bv_new[0], p_new[0] = wv.sum(0), bv.sum(0), p.sum(0)
            wv, bv, p = wv_new, bv_new, p_new
        order = (lambda t: t.transpose(0, 1)) if form == "concat" else (lambda t: t)  # concat: (H, n, ...)
        q_w, k_w, v_w = (order(t).reshape(heads * n * d, dim) for t in (wq, wk, wv))
        q_b, k_b, v_b = (order(t).reshape(heads * n * d) for t in (bq, bk, bv))
        proj_w = (p.permute(1, 2, 0, 3) if form == "concat" else p.permute(1, 0, 2, 3)).reshape(dim, heads * n * d)
    else:  # xwx / xwx_min: per head q = X Mᵀ... with k = X, v = X G_hᵀ, identity output blocks (xwx only)
        q_w = torch.einsum("bhkd,bhke->hde", wk, wq)  # M_h = Σ_b W^K_bᵀ W^Q_b: (H, D, D); q'·x_j = x_iᵀ M_hᵀ x_j
        q_b = torch.einsum("bhkd,bhk->hd", wk, bq)  # per-key term Σ_b W^K_bᵀ a_b: (H, D)
        k_w = torch.eye(dim, dtype=ref.dtype, device=ref.device).expand(heads, dim, dim)
        k_b = torch.zeros(heads, dim, dtype=ref.dtype, device=ref.device)
        if f.vo == "eq7":
            v_w = torch.einsum("chk,hke->hce", p.sum(0), wv.sum(0))  # (Σ W^O)(Σ W^V): (H, D, D)
            v_b = torch.einsum("chk,hk->hc", p.sum(0), bv.sum(0))
        else:
            v_w = torch.einsum("bchk,bhke->hce", p, wv)  # G_h = Σ_b W^O_{b,h}ᵀ… as a Linear weight: (H, D, D)
            v_b = torch.einsum("bchk,bhk->hc", p, bv)
        if form == "xwx_min":
            return _xwx_min_block(pb, q_w, q_b, v_w, v_b, p_bias, want)
        q_w, q_b, k_w, k_b, v_w, v_b = (t.reshape(heads * dim, *t.shape[2:]) for t in (q_w, q_b, k_w, k_b, v_w, v_b))
        proj_w = torch.eye(dim, dtype=ref.dtype, device=ref.device).repeat(1, heads)  # (D, H·D): Σ_h of head outputs

    blk = Block(dim, 1, qkv_bias=True, proj_bias=has_proj_bias)
    blk.attn = Attention(dim, heads * mult, attn_head_dim=r, qkv_bias=True, proj_bias=has_proj_bias,
                         attn_drop=a0.attn_drop.p, proj_drop=a0.proj_drop.p)
    act = m0.act
    blk.mlp = Mlp(dim, hidden * (n if form == "wide" else 1), act_layer=lambda: copy.deepcopy(act), bias=True,
                  drop=m0.drop1.p)
    blk.norm1, blk.norm2 = copy.deepcopy(pb.norm1), copy.deepcopy(pb.norm2)
    blk.drop_path1, blk.drop_path2 = copy.deepcopy(pb.drop_path1), copy.deepcopy(pb.drop_path2)
    blk.to(device=ref.device, dtype=ref.dtype)

    blk.attn.qkv.weight.copy_(torch.cat([q_w * q_factor, k_w, v_w]))
    blk.attn.qkv.bias.copy_(torch.cat([q_b * q_factor, k_b, v_b]))
    blk.attn.proj.weight.copy_(proj_w)
    if has_proj_bias:
        blk.attn.proj.bias.copy_(p_bias)
    fc1 = [br.mlp.fc1 for br in pb.branches]
    fc2 = [br.mlp.fc2 for br in pb.branches]
    if form == "wide":  # hidden units side by side
        blk.mlp.fc1.weight.copy_(torch.cat([m.weight for m in fc1]))
        blk.mlp.fc1.bias.copy_(torch.cat([m.bias for m in fc1]))
        blk.mlp.fc2.weight.copy_(torch.cat([m.weight for m in fc2], dim=1))
    else:  # Eq. 9 at λ = 1: one GELU input Σ_b h_b
        blk.mlp.fc1.weight.copy_(sum(m.weight for m in fc1))
        blk.mlp.fc1.bias.copy_(sum(m.bias for m in fc1))
        blk.mlp.fc2.weight.copy_(sum(m.weight for m in fc2))
    blk.mlp.fc2.bias.copy_(sum(m.bias for m in fc2))
    return blk


def _mlp_and_norms(blk: Block, pb: ParallelBlock) -> None:
    """Eq. 9 at λ = 1 into ``blk.mlp`` (summed fc1, fc2 and biases); norms and drop paths copied from ``pb``."""
    fc1 = [br.mlp.fc1 for br in pb.branches]
    fc2 = [br.mlp.fc2 for br in pb.branches]
    blk.mlp.fc1.weight.copy_(sum(m.weight for m in fc1))
    blk.mlp.fc1.bias.copy_(sum(m.bias for m in fc1))
    blk.mlp.fc2.weight.copy_(sum(m.weight for m in fc2))
    blk.mlp.fc2.bias.copy_(sum(m.bias for m in fc2))


@torch.no_grad()
def _xwx_min_block(pb: ParallelBlock, m: torch.Tensor, m_bias: torch.Tensor, g: torch.Tensor, g_bias: torch.Tensor,
                   p_bias: torch.Tensor | None, scale: float) -> Block:
    """A timm ``Block`` with an :class:`XWXAttention` of ``(H, D, D)`` matrices ``m``, ``g`` (module docstring)."""
    a0, m0 = pb.branches[0].attn, pb.branches[0].mlp
    dim, heads, hidden = a0.qkv.in_features, a0.num_heads, m0.fc1.out_features
    ref = a0.qkv.weight
    blk = Block(dim, 1, qkv_bias=True, proj_bias=p_bias is not None)
    blk.attn = XWXAttention(dim, heads, scale, proj_bias=p_bias is not None, attn_drop=a0.attn_drop.p)
    act = m0.act
    blk.mlp = Mlp(dim, hidden, act_layer=lambda: copy.deepcopy(act), bias=True, drop=m0.drop1.p)
    blk.norm1, blk.norm2 = copy.deepcopy(pb.norm1), copy.deepcopy(pb.norm2)
    blk.drop_path1, blk.drop_path2 = copy.deepcopy(pb.drop_path1), copy.deepcopy(pb.drop_path2)
    blk.to(device=ref.device, dtype=ref.dtype)
    blk.attn.m.copy_(m)
    blk.attn.m_bias.copy_(m_bias)
    blk.attn.g.copy_(g)
    blk.attn.g_bias.copy_(g_bias)
    if p_bias is not None:
        blk.attn.proj_bias.copy_(p_bias)
    _mlp_and_norms(blk, pb)
    return blk


# ------------------------------------------------------------------------------------ the model
def collapse(model: nn.Module, variant: CollapseVariant = "exact", form: Form = "auto") -> VisionTransformer:
    """Reparameterise a joined branched model into a plain timm ``VisionTransformer`` (module docstring).

    Args:
        model: a branched model (:func:`methods.nondeep.branch`) with λ = 1 in every block
            (λ = 0 for ``form="wide"``). It is not modified.
        variant: ``"exact"`` or one of the paper's formulas (:data:`COLLAPSE_VARIANTS`).
        form: ``"auto"`` (narrowest exact attention), ``"concat"`` (H heads of n·d), ``"xwx"``
            (H heads of D), ``"xwx_min"`` (the fewest parameters: :class:`XWXAttention`) or ``"wide"``
            (λ = 0: n·H heads of d, FFN n·F).

    Returns:
        The collapsed model (same device, dtype and train/eval mode), with
        ``timm_spec = ("nondeep_collapsed", kwargs)`` for ``timm.create_model``.

    Raises:
        ValueError: no parallel blocks; joining not complete (λ < 1; or λ > 0 for ``"wide"``);
            an unknown variant or form; a paper variant with the wide form.
    """
    blocks = parallel_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no parallel blocks; collapse takes a model made by "
                         "methods.nondeep.branch (or timm.create_model('nondeep_branched', ...))")
    if variant not in COLLAPSE_VARIANTS:
        raise ValueError(f"unknown collapse variant {variant!r}; choose one of {', '.join(COLLAPSE_VARIANTS)}")
    a0 = blocks[0].branches[0].attn
    form = resolve_form(form, blocks[0].num_branches, a0.head_dim, a0.qkv.in_features)
    lam = get_lambda(model)
    if form == "wide":
        if lam != 0.0:
            raise ValueError(f"the wide form is the model before joining (λ = 0); this model has λ = {lam:g}")
        if variant != "exact":
            raise ValueError("the paper's merge formulas concern joined branches; use variant='exact' with form='wide'")
    elif lam != 1.0:
        raise ValueError(f"collapse before joining is complete: λ = {lam:g}, but the branches only share their softmax "
                         "and GELU inputs at λ = 1. Train through the warm-up (ProgressiveJoin) first, or "
                         "set_lambda(model, 1.0) if you accept that the model's function changes.")
    out = copy.deepcopy(model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model)
    out.blocks = nn.Sequential(*[_collapse_block(pb, form, COLLAPSE_VARIANTS[variant]) for pb in blocks])
    out.train(model.training)
    spec = dict(getattr(model, "timm_spec", ("", {}))[1])
    out.pretrained_cfg = {**getattr(out, "pretrained_cfg", {}), "architecture": "nondeep_collapsed"}
    out.timm_spec = ("nondeep_collapsed", {"base": spec.get("base"), "base_kwargs": spec.get("base_kwargs", {}),
                                           "branches": blocks[0].num_branches, "form": form})
    return out


def max_relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |out − ref| / max |ref|`` (the error relative to the largest reference logit)."""
    out, ref = out.detach(), ref.detach()
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(torch.finfo(ref.dtype).tiny))


@torch.no_grad()
def collapse_errors(model: nn.Module, images: torch.Tensor, variants: Sequence[str] = ("exact", "paper"),
                    form: Form = "auto", dtype: torch.dtype = torch.float64) -> dict[str, float]:
    """Max relative error of the collapsed logits against the branched model's, per variant.

    Both run in eval mode in ``dtype`` (float64 by default: what remains is the merge, not rounding).

    Args:
        model: a joined branched model (λ = 1). Not modified.
        images: ``(B, C, H, W)``.
        variants: names from :data:`COLLAPSE_VARIANTS`.

    Returns:
        ``{variant: max |collapsed − branched| / max |branched|}``.
    """
    ref_model = copy.deepcopy(model).to(dtype).eval()
    x = images.to(dtype=dtype, device=next(ref_model.parameters()).device)
    with exact_float32():  # float32 errors on a GPU measure the merge, not TF32 rounding
        ref = ref_model(x)
        return {v: max_relative_error(collapse(ref_model, v, form)(x), ref) for v in variants}


@torch.no_grad()
def collapse_exactness(model: nn.Module, images: torch.Tensor, teacher: nn.Module | None = None,
                       form: Form = "auto", dtype: torch.dtype = torch.float64) -> list[dict]:
    """The collapse-exactness table: one row per merge formula, errors in ``dtype`` (float64).

    Rows: every :data:`COLLAPSE_VARIANTS` entry on ``model`` (λ = 1); with a ``teacher`` also the
    LayerNorm factorisation, Eq. 1 (forward absorption, our :func:`branch` with n = 1 against
    the teacher) and Eq. 2 (backward absorption, :func:`absorb_layernorm_backward` against it).

    Returns:
        ``[{"variant", "equations", "description", "max_rel_error"}, …]``.
    """
    from .branched import branch

    errs = collapse_errors(model, images, tuple(COLLAPSE_VARIANTS), form, dtype)
    rows = [{"variant": k, "equations": f.equations, "description": f.description, "max_rel_error": errs[k]}
            for k, f in COLLAPSE_VARIANTS.items()]
    if teacher is not None:
        t = copy.deepcopy(teacher).to(dtype).eval()
        x = images.to(dtype)
        ref = t(x)
        rows.append({"variant": "ln_forward", "equations": "Eq. 1 (+ Eq. 3)",
                     "description": "LN γ, β absorbed forward into qkv and fc1 (branch(teacher, n=1) vs teacher)",
                     "max_rel_error": max_relative_error(branch(t, 1).eval()(x), ref)})
        rows.append({"variant": "ln_backward", "equations": "Eq. 2",
                     "description": "LN1 γ, β absorbed backward into the previous fc2 / patch embedding",
                     "max_rel_error": max_relative_error(absorb_layernorm_backward(t)(x), ref)})
    return rows


__all__ = ["COLLAPSE_VARIANTS", "FORMS", "CollapseVariant", "Form", "MergeFormulas", "XWXAttention", "collapse",
           "collapse_errors",
           "collapse_exactness", "collapsed_head_dim", "max_relative_error", "resolve_form"]
