"""Token-to-token dependency by gradient saliency (FAR §4.3 "Token-level Representation
Consistency", Fig. 5–6, App. C), and the ``dependency`` extractor.

Paper: Ren et al., "Is Attention Required for Transformer Inference? Explore Function-preserving
Attention Replacement". FAR has no attention weights, so the paper measures how much each output
token of a block depends on each input token with input–output gradients. For a function
f: x ∈ R^{B×T×D} → y ∈ R^{B×T×N×C} giving per-head outputs of one block, we define

    dependency[b, h, q, k] = ‖ ∂(Σ_c y[b, q, h, c]) / ∂x[b, k, :] ‖₂

(output token q = ``query``, input token k = ``key``, as in DESIGN.md). Samples are independent
in eval mode, so one backward serves the whole batch.

Which input: x is the block's *residual-stream input* x_l, so the dependency includes the
block's ``norm1`` (and, for FAR, the substitute's own LayerNorm and input projection). Which
output: per-head outputs before the output projection — for a teacher ``Attention`` the
per-head ``softmax(qkᵀ)·v`` (times the gate if the model has one), for FAR the per-head BiLSTM
outputs H_n (:meth:`methods.far.MultiHeadBiLSTM.forward_heads`). The same definition for both, so
a teacher's saliency and FAR's line up; a teacher's attention probabilities line up too (same
dims; see :mod:`workbench.analysis.compare`).

Four implementations of the same quantity:

- :func:`dependency_factored` (default) — the Jacobian of a head factors into a per-token part
  φ: x_k → z_k (norms and projections; z = I_n for FAR, (q, k, v) for attention) and the token
  mixer M: z → y. ``∂y_q/∂x_k = (∂y_q/∂z_k)·J_k`` with J_k = ∂z_k/∂x_k. The mixer's input
  gradients for all queries come in one batch — for FAR from the LSTM's reverse-mode recurrence
  run for every query at once and truncated by causality (:func:`methods.far.adjoint.lstm_sum_adjoint`),
  for attention from ``torch.func.vmap`` over queries of ``torch.func.grad`` of one query's row —
  and J_k from ``vmap(jacrev(φ))`` over tokens; the norm over D is then
  ``√(δzᵀ (J_k J_kᵀ) δz)`` when z is narrower than x (FAR: D_h < D), else ``‖J_kᵀ δz‖``;
- :func:`dependency` — ``torch.func.vjp`` once per head, ``vmap`` over the T query cotangents
  (oneDNN off, because its LSTM backward has no vmap rule);
- :func:`dependency_loop` — one forward, then one ``autograd.grad`` per (head, query), the
  per-output-token loop of the FAR authors' analysis;
- :func:`dependency_captum` — ``captum.attr.Saliency`` on a wrapper selecting one (head, query).

Speed (benchmarks/token_dependency.py, DeiT-Tiny-sized block, T = 197, B = 2, one CPU thread):
see that script's docstring for the measured ratios; :func:`model_dependency` uses the factored
form whenever the block allows it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Literal, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import xarray as xr
from einops import rearrange

from methods.far import MultiHeadBiLSTM, check_vit, embed_tokens
from methods.far.adjoint import bilstm_head_adjoint
from workbench.analysis import register
from workbench.analysis.tokens import vit_token_layout
from workbench.provenance import config_json

#: ``fn(x, heads) -> (B, T, len(heads), C)``; ``heads=None`` means all heads.
HeadOutputs = Callable[[torch.Tensor, Optional[Sequence[int]]], torch.Tensor]
#: ``local(x, head) -> z``: the per-token part of one head, ``(..., D) -> (..., Z)``.
LocalFn = Callable[[torch.Tensor, int], torch.Tensor]
#: ``mixer_vjp(z, head, queries) -> (Q, B, T, Z)``: ∂(Σ_c y[:, q, head, c]) / ∂z for every query.
MixerVJP = Callable[[torch.Tensor, int, Sequence[int]], torch.Tensor]

Method = Literal["auto", "factored", "batched", "loop"]


@dataclass(frozen=True)
class HeadFn:
    """Per-head outputs of one block as a function of the block input.

    Calling ``f(x)`` gives ``(B, T, N, C)``; ``f(x, [h])`` computes head h only (``(B, T, 1, C)``),
    which is what the dependency functions use so that a backward never runs through other heads.
    ``local`` and ``mixer_vjp`` (both or neither) describe the head as token mixer ∘ per-token map,
    which :func:`dependency_factored` needs.
    """

    fn: HeadOutputs  # (x (B, T, D), heads) -> (B, T, n, C)
    num_heads: int  # N
    local: Optional[LocalFn] = None  # per-token part of head h, (..., D) -> (..., Z)
    mixer_vjp: Optional[MixerVJP] = None  # token mixer's input gradients for many queries
    rows: Optional[Callable[[torch.Tensor, int, Sequence[int]], Optional[torch.Tensor]]] = None  # closed form (B, Q, T), or None

    def __call__(self, x: torch.Tensor, heads: Optional[Sequence[int]] = None) -> torch.Tensor:
        return self.fn(x, heads)

    @property
    def factored(self) -> bool:
        return self.local is not None and self.mixer_vjp is not None


# ------------------------------------------------------------------------------------ head functions
def _attention_rows(attn: nn.Module, heads: Sequence[int]) -> torch.Tensor:
    """Rows of ``qkv.weight`` of the given heads, ``(q, k, v)``-major: qkv rows are (3, N, D_h)-ordered."""
    nh, dh = attn.num_heads, attn.head_dim
    return torch.arange(3 * nh * dh, device=attn.qkv.weight.device).view(3, nh, dh)[:, list(heads)].reshape(-1)


def _attention_heads(block: nn.Module, x: torch.Tensor, heads: Optional[Sequence[int]]) -> torch.Tensor:
    """Per-head ``softmax(q kᵀ · scale) v`` of a timm ``Block``/``Attention``: ``(B, T, n, D_h)``."""
    attn = block.attn
    xn = block.norm1(x)  # (B, T, D)
    b, t, _ = xn.shape
    idx = list(range(attn.num_heads)) if heads is None else list(heads)
    dh = attn.head_dim
    rows = _attention_rows(attn, idx)
    bias = None if attn.qkv.bias is None else attn.qkv.bias[rows]
    qkv = F.linear(xn, attn.qkv.weight[rows], bias)  # (B, T, 3·n·D_h)
    qkv = qkv.reshape(b, t, 3, len(idx), dh).permute(2, 0, 3, 1, 4)  # (3, B, n, T, D_h)
    q, k, v = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    probs = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, n, T, T), no mask in a ViT
    out = (probs @ v).transpose(1, 2)  # (B, T, n, D_h)
    if getattr(attn, "gate", None) is not None:  # elementwise gate: per head, so still separable
        gate = attn.gate(xn).sigmoid().reshape(b, t, attn.num_heads, attn.head_dim)
        out = out * gate[:, :, idx]
    return out


def _head_weights(attn: nn.Module, head: int) -> dict[str, tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """(weight, bias) of head h's q, k, v (and gate) projections: weights ``(D_h, D)``."""
    dh, nh = attn.head_dim, attn.num_heads
    w = attn.qkv.weight.view(3, nh, dh, -1)[:, head]  # (3, D_h, D)
    b = None if attn.qkv.bias is None else attn.qkv.bias.view(3, nh, dh)[:, head]
    out = {name: (w[i], None if b is None else b[i]) for i, name in enumerate("qkv")}
    if getattr(attn, "gate", None) is not None:
        cols = slice(head * dh, (head + 1) * dh)
        out["g"] = (attn.gate.weight[cols], None if attn.gate.bias is None else attn.gate.bias[cols])
    return out


def _attention_mixer_vjp_func(attn: nn.Module, xn: torch.Tensor, head: int, queries: Sequence[int]) -> torch.Tensor:
    """``∂(Σ_c y[:, q, c]) / ∂LN1(x)`` of attention head h for every query: ``vmap`` over one query's row
    of ``torch.func.grad`` (any q/k norm or gate). ``(Q, B, T, D)``."""
    wts = _head_weights(attn, head)
    onehots = torch.eye(xn.shape[1], dtype=xn.dtype, device=xn.device)[list(queries)]  # (Q, T)

    def row_sum(z: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        zq = torch.einsum("t,btd->bd", onehot, z)  # the query token's input: (B, D)
        q = attn.q_norm(F.linear(zq, *wts["q"]))  # (B, D_h)
        k = attn.k_norm(F.linear(z, *wts["k"]))  # (B, T, D_h); not batched over queries by vmap
        v = F.linear(z, *wts["v"])
        probs = torch.softmax(attn.scale * torch.einsum("bc,btc->bt", q, k), dim=-1)  # the query's row: (B, T)
        y = torch.einsum("bt,btc->bc", probs, v)  # (B, D_h)
        if "g" in wts:
            y = y * F.linear(zq, *wts["g"]).sigmoid()
        return y.sum()  # Σ over c and samples (samples are independent)

    return torch.func.vmap(torch.func.grad(row_sum), in_dims=(None, 0))(xn, onehots)


def _attention_mixer_vjp(attn: nn.Module, xn: torch.Tensor, head: int, queries: Sequence[int]) -> torch.Tensor:
    """The same as :func:`_attention_mixer_vjp_func` in closed form, for all queries at once.

    With s = scale·Q Kᵀ, P = softmax(s), Y = P V, gate G (1 without), F_q = Σ_c Y_qc G_qc and
    U_qj = Σ_c V_jc G_qc, the row sums' gradients are dS = P ⊙ (U − F) and

        ∂F_q/∂z_k = dS_qk · scale·W_kᵀ Q_q + P_qk · W_vᵀ G_q
                    + [k = q] · (scale·W_qᵀ Σ_j dS_qj K_j + W_gᵀ (Y_q ⊙ G_q ⊙ (1 − G_q))),

    whose first two terms are rank one in (q, k): no per-pair matmul. Needs ``q_norm``/``k_norm``
    to be identities (timm's default); otherwise :func:`_attention_mixer_vjp_func` is used.
    """
    if not (isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity)):
        return _attention_mixer_vjp_func(attn, xn, head, queries)
    wts = _head_weights(attn, head)
    qs = torch.as_tensor(list(queries), device=xn.device)
    q_all, k, v = (F.linear(xn, *wts[n]) for n in "qkv")  # (B, T, D_h)
    q = q_all[:, qs]  # (B, Q, D_h)
    gate = F.linear(xn[:, qs], *wts["g"]).sigmoid() if "g" in wts else None  # (B, Q, D_h)
    probs = torch.softmax(attn.scale * q @ k.transpose(1, 2), dim=-1)  # (B, Q, T)
    y = probs @ v  # (B, Q, D_h)
    if gate is None:
        u = v.sum(-1)[:, None, :]  # (B, 1, T)
        f = y.sum(-1, keepdim=True)  # (B, Q, 1)
        wv = wts["v"][0].sum(0).expand(*q.shape[:2], -1)  # W_vᵀ 1: (B, Q, D)
    else:
        u = gate @ v.transpose(1, 2)  # (B, Q, T)
        f = (y * gate).sum(-1, keepdim=True)
        wv = gate @ wts["v"][0]  # W_vᵀ G_q: (B, Q, D)
    ds = probs * (u - f)  # (B, Q, T)
    wk = attn.scale * q @ wts["k"][0]  # scale·W_kᵀ Q_q: (B, Q, D)
    dz = ds[..., None] * wk[:, :, None, :] + probs[..., None] * wv[:, :, None, :]  # (B, Q, T, D)
    own = attn.scale * (ds @ k) @ wts["q"][0]  # through the query's own q: (B, Q, D)
    if gate is not None:
        own = own + (y * gate * (1 - gate)) @ wts["g"][0]
    dz[:, torch.arange(len(qs), device=xn.device), qs] += own
    return rearrange(dz, "b q t d -> q b t d")


def _layer_norm_parts(norm: nn.Module, x: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(x̂, σ, γ)`` of a LayerNorm over the last dim (x̂ = (x − μ)/σ, σ = √(var + eps)); None if not one."""
    if not isinstance(norm, nn.LayerNorm) or len(norm.normalized_shape) != 1:
        return None
    sigma = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # (B, T, 1)
    gamma = norm.weight if norm.weight is not None else x.new_ones(x.shape[-1])
    return (x - x.mean(-1, keepdim=True)) / sigma, sigma, gamma


def _attention_rows_closed_form(block: nn.Module, x: torch.Tensor, head: int, queries: Sequence[int]) -> Optional[torch.Tensor]:
    """Dependency rows ``(B, Q, T)`` of attention head h without materialising a D-vector per (q, k).

    Uses :func:`_attention_mixer_vjp`'s closed form, ∂F_q/∂z_k = a_qk α_q + b_qk β_q (+ ω_q at
    k = q) with a = dS, b = P, through the block's LayerNorm, whose input gradient at token k is
    (g − mean(g) − x̂_k mean(g ⊙ x̂_k)) / σ_k for g = γ ⊙ ∂F_q/∂z_k. Its squared norm expands into
    inner products of α_q, β_q, 1 and x̂_k — a few (T × D)·(D × Q) matmuls instead of Q·T·D work.
    The k = q entries (with ω) are computed directly. None when the block is not LayerNorm →
    plain attention (then the generic factored path runs).
    """
    attn = block.attn
    parts = _layer_norm_parts(block.norm1, x)
    if parts is None or not (isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity)):
        return None
    xhat, sigma, gamma = parts
    d = x.shape[-1]
    wts = _head_weights(attn, head)
    xn = block.norm1(x)
    qs = torch.as_tensor(list(queries), device=x.device)
    k, v = F.linear(xn, *wts["k"]), F.linear(xn, *wts["v"])  # (B, T, D_h)
    q = F.linear(xn[:, qs], *wts["q"])  # (B, Q, D_h)
    gate = F.linear(xn[:, qs], *wts["g"]).sigmoid() if "g" in wts else None
    probs = torch.softmax(attn.scale * q @ k.transpose(1, 2), dim=-1)  # (B, Q, T)
    y = probs @ v
    if gate is None:
        u, f = v.sum(-1)[:, None, :], y.sum(-1, keepdim=True)
        beta = wts["v"][0].sum(0).expand(*q.shape[:2], -1)  # W_vᵀ 1: (B, Q, D)
    else:
        u, f = gate @ v.transpose(1, 2), (y * gate).sum(-1, keepdim=True)
        beta = gate @ wts["v"][0]  # W_vᵀ G_q
    a = probs * (u - f)  # dS: (B, Q, T)
    alpha = attn.scale * q @ wts["k"][0]  # scale·W_kᵀ Q_q: (B, Q, D)
    al, be = gamma * alpha, gamma * beta  # γ ⊙ α, γ ⊙ β
    b = probs
    gg = a * a * (al * al).sum(-1, keepdim=True) + 2 * a * b * (al * be).sum(-1, keepdim=True) + b * b * (be * be).sum(-1, keepdim=True)
    m = (a * al.sum(-1, keepdim=True) + b * be.sum(-1, keepdim=True)) / d  # mean(g): (B, Q, T)
    n = (a * (al @ xhat.transpose(1, 2)) + b * (be @ xhat.transpose(1, 2))) / d  # mean(g ⊙ x̂_k)
    xx = (xhat * xhat).sum(-1)[:, None, :]  # x̂_k · x̂_k: (B, 1, T)
    x1 = xhat.sum(-1)[:, None, :]  # 1 · x̂_k (0 up to rounding)
    sq = gg - d * m * m - 2 * d * n * n + n * n * xx + 2 * m * n * x1
    out = sq.clamp_min(0).sqrt() / sigma.transpose(1, 2)  # (B, Q, T)
    # k = q: the query's own q (and gate) add ω_q; compute those entries directly
    own = attn.scale * (a @ k) @ wts["q"][0]
    if gate is not None:
        own = own + (y * gate * (1 - gate)) @ wts["g"][0]
    iq = torch.arange(len(qs), device=x.device)
    g = gamma * (a[:, iq, qs, None] * alpha + b[:, iq, qs, None] * beta + own)  # (B, Q, D)
    xq, sq_ = xhat[:, qs], sigma[:, qs]
    dx = (g - g.mean(-1, keepdim=True) - xq * (g * xq).mean(-1, keepdim=True)) / sq_
    out[:, iq, qs] = dx.norm(dim=-1)
    return out


def _far_local(block: nn.Module, x: torch.Tensor, head: int) -> torch.Tensor:
    """Per-token part of FAR head n: the LSTM input I_n = Proj_in(LN(LN1(x)))[n], ``(..., D) -> (..., D_h)``."""
    sub = block.attn
    rows = slice(head * sub.head_dim, (head + 1) * sub.head_dim)
    return F.linear(sub.norm(block.norm1(x)), sub.in_proj.weight[rows], sub.in_proj.bias[rows])


def head_output_fn(block: nn.Module) -> HeadFn:
    """Per-head outputs of a timm ViT ``Block`` (teacher ``Attention`` or FAR substitute).

    Args:
        block: ``timm.models.vision_transformer.Block``; its ``.attn`` is a timm ``Attention`` or
            a :class:`methods.far.MultiHeadBiLSTM`. Put it in eval mode yourself.

    Returns:
        A :class:`HeadFn` mapping the block input x_l ``(B, T, D)`` to ``(B, T, N, C)``:
        C = D_h for attention (``attn @ v``), 2·U for FAR (forward then reverse units).

    Raises:
        TypeError: ``block.attn`` is neither, or an attention whose output norm mixes heads.
    """
    attn = getattr(block, "attn", None)
    if isinstance(attn, MultiHeadBiLSTM):
        return HeadFn(
            lambda x, heads=None: attn.forward_heads(block.norm1(x), heads), attn.num_heads,
            local=lambda x, h: _far_local(block, x, h),
            mixer_vjp=lambda z, h, qs: bilstm_head_adjoint(attn, h, z, qs),
        )
    if attn is not None and all(hasattr(attn, a) for a in ("qkv", "num_heads", "head_dim", "scale")):
        if not isinstance(getattr(attn, "norm", nn.Identity()), nn.Identity):
            raise TypeError("attention with scale_norm normalises over all heads together: per-head dependency is undefined")
        return HeadFn(
            lambda x, heads=None: _attention_heads(block, x, heads), attn.num_heads,
            local=lambda x, h: block.norm1(x),
            mixer_vjp=lambda z, h, qs: _attention_mixer_vjp(attn, z, h, qs),
            rows=lambda x, h, qs: _attention_rows_closed_form(block, x, h, qs),
        )
    raise TypeError(f"block.attn must be a timm Attention or a FAR MultiHeadBiLSTM, got {type(attn).__name__}")


def _per_head(fn: Callable) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """Split a :class:`HeadFn` into one single-head function per head; a plain fn stays whole."""
    if isinstance(fn, HeadFn):
        return [lambda x, h=h: fn(x, [h]) for h in range(fn.num_heads)]
    return [fn]


def _select(y: torch.Tensor, q: int, h: int) -> torch.Tensor:
    """Σ_c y[:, q, h, c] per sample, ``(B,)``."""
    return y[:, q, h, :].sum(-1)


def auto_chunk_size(x: torch.Tensor, budget_bytes: int = 2**28) -> int:
    """Queries per batched step so that the largest batched gradient, about
    ``chunk · B · T · max(D, T)`` elements (input grads, or attention-score grads), fits ``budget_bytes``."""
    b, t, d = x.shape
    per_query = b * t * max(d, t) * x.element_size()
    return max(1, min(t, budget_bytes // per_query))


def _query_list(queries: Optional[Sequence[int]], t: int) -> list[int]:
    qs = list(range(t)) if queries is None else [int(q) for q in queries]
    bad = [q for q in qs if not 0 <= q < t]
    if bad:
        raise ValueError(f"query tokens {bad} out of range for {t} tokens")
    return qs


# ----------------------------------------------------------------------------------- factored (fast)
def token_jacobians(local: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """J_k = ∂z_k/∂x_k of a per-token map for every token: ``(B, T, D) -> (B, T, Z, D)`` (``vmap(jacrev)``)."""
    b, t, d = x.shape
    jac = torch.func.vmap(torch.func.jacrev(local))(x.reshape(b * t, d))  # (B·T, Z, D)
    return jac.reshape(b, t, *jac.shape[1:])


@torch.no_grad()
def dependency_factored(
    fn: HeadFn, x: torch.Tensor, queries: Optional[Sequence[int]] = None, chunk_size: Optional[int] = None
) -> torch.Tensor:
    """Dependency from the factored Jacobian (module docstring), ``(B, N, Q, T)``.

    Args:
        fn: a factored :class:`HeadFn` (from :func:`head_output_fn`), modules in eval mode.
        x: block input ``(B, T, D)``.
        queries: output tokens (default all T).
        chunk_size: queries per batch of mixer gradients (default :func:`auto_chunk_size`).
    """
    if not fn.factored:
        raise ValueError("dependency_factored needs a HeadFn with local and mixer_vjp (see head_output_fn)")
    x = x.detach()
    b, t, d = x.shape
    qs = sorted(_query_list(queries, t))
    order = torch.as_tensor([qs.index(q) for q in _query_list(queries, t)])  # back to the caller's order
    chunk_size = chunk_size or auto_chunk_size(x)
    out = []
    for h in range(fn.num_heads):
        direct = fn.rows(x, h, qs) if fn.rows is not None else None  # closed form, where there is one
        if direct is not None:
            out.append(direct[:, order])
            continue
        with torch.enable_grad():
            z, local_vjp = torch.func.vjp(lambda v: fn.local(v, h), x)  # z: (B, T, Z)
        gram = None
        if z.shape[-1] < d:  # narrow z (FAR: D_h < D): per-token Jacobians and their Gram matrices
            with torch.enable_grad():
                jac = token_jacobians(lambda v: fn.local(v, h), x)  # (B, T, Z, D)
            gram = jac @ jac.transpose(-1, -2)  # (B, T, Z, Z): J_k J_kᵀ
        rows = []
        for start in range(0, len(qs), chunk_size):
            chunk = qs[start:start + chunk_size]
            with torch.enable_grad():
                dz = fn.mixer_vjp(z, h, chunk)  # (Q, B, T, Z)
            if gram is not None:  # ‖J_kᵀ δz‖² = δzᵀ (J_k J_kᵀ) δz
                sq = torch.einsum("qbkz,bkzy,qbky->qbk", dz, gram, dz)
                rows.append(sq.clamp_min(0).sqrt())
            else:  # wide z (attention: z = LN1(x)): the per-token VJP, batched over queries
                with torch.enable_grad():
                    rows.append(torch.func.vmap(lambda ct: local_vjp(ct)[0])(dz).norm(dim=-1))
        out.append(rearrange(torch.cat(rows), "q b k -> b q k")[:, order])
    return torch.stack(out, dim=1)  # (B, N, Q, T_k)


# --------------------------------------------------------------------------------- reference forms
def dependency(
    fn: Callable, x: torch.Tensor, queries: Optional[Sequence[int]] = None, chunk_size: Optional[int] = None
) -> torch.Tensor:
    """Batched gradient-saliency dependency by ``vjp`` + ``vmap``, ``(B, N, Q, T)`` = (sample, head, query, key).

    For each head: one ``torch.func.vjp`` of the single-head function, then ``vmap`` of the VJP
    over the query cotangents, ``chunk_size`` queries at a time. oneDNN is switched off inside,
    because its LSTM backward has no vmap rule.

    Args:
        fn: a :class:`HeadFn` (from :func:`head_output_fn`) or any ``x -> (B, T, N, C)``; the
            module(s) inside must be in eval mode and treat samples independently.
        x: block input ``(B, T, D)``.
        queries: output tokens to compute (default all T; ``[0]`` for CLS maps, Fig. 5).
        chunk_size: queries per vmapped VJP.
    """
    x = x.detach()
    qs = _query_list(queries, x.shape[1])
    chunk_size = chunk_size or auto_chunk_size(x)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
        with torch.backends.mkldnn.flags(enabled=False):
            return _dependency(fn, x, qs, chunk_size)


def _dependency(fn: Callable, x: torch.Tensor, qs: list[int], chunk_size: int) -> torch.Tensor:
    out = []
    for f in _per_head(fn):
        y, vjp_fn = torch.func.vjp(f, x)  # y: (B, T, n, C)
        b, t, n, c = y.shape
        onehot_qs = torch.eye(t, dtype=y.dtype, device=y.device)[qs]  # (Q, T): one cotangent per query

        def pull(onehot_q: torch.Tensor, onehot_h: torch.Tensor) -> torch.Tensor:
            # cotangent: ones at y[:, q, head, :] for every sample, (B, T, n, C)
            ct = (onehot_q.view(1, t, 1, 1) * onehot_h.view(1, 1, n, 1)).expand(b, t, n, c)
            return vjp_fn(ct)[0].norm(dim=-1)  # (B, T_key)

        for head in range(n):
            onehot_h = torch.zeros(n, dtype=y.dtype, device=y.device).index_fill(0, torch.tensor(head), 1.0)
            dep = torch.func.vmap(pull, in_dims=(0, None), chunk_size=chunk_size)(onehot_qs, onehot_h)  # (Q, B, T_k)
            out.append(rearrange(dep, "q b k -> b q k"))
    return torch.stack(out, dim=1)  # (B, N, Q, T_k)


def dependency_loop(fn: Callable, x: torch.Tensor, queries: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Reference: one forward, then one ``autograd.grad`` per (head, query). ``(B, N, Q, T)``.

    With a plain ``fn`` (not a :class:`HeadFn`) every backward runs through all heads, as a
    straightforward per-output-token script does.
    """
    x = x.detach().requires_grad_(True)
    qs = _query_list(queries, x.shape[1])
    out = []
    with torch.enable_grad():
        for f in _per_head(fn):
            y = f(x)  # (B, T, n, C)
            for head in range(y.shape[2]):
                rows = []
                for q in qs:
                    (g,) = torch.autograd.grad(_select(y, q, head).sum(), x, retain_graph=True)  # (B, T, D)
                    rows.append(g.norm(dim=-1))  # (B, T_key)
                out.append(torch.stack(rows, dim=1))  # (B, Q, T_k)
    return torch.stack(out, dim=1)


def dependency_captum(fn: Callable, x: torch.Tensor, queries: Optional[Sequence[int]] = None) -> torch.Tensor:
    """The same with ``captum.attr.Saliency(abs=False)`` per (head, query). ``(B, N, Q, T)``."""
    from captum.attr import Saliency

    x = x.detach().requires_grad_(True)
    qs = _query_list(queries, x.shape[1])
    out = []
    for f in _per_head(fn):
        n = f(x[:1]).shape[2]
        for head in range(n):
            rows = []
            for q in qs:
                sal = Saliency(lambda inp, q=q, head=head: _select(f(inp), q, head))  # (B,) per sample
                rows.append(sal.attribute(x, abs=False).norm(dim=-1))  # (B, T_key)
            out.append(torch.stack(rows, dim=1))
    return torch.stack(out, dim=1)


# ------------------------------------------------------------------------------------------- models
@torch.no_grad()
def block_inputs(model: nn.Module, images: torch.Tensor, upto: Optional[int] = None) -> list[torch.Tensor]:
    """The residual-stream input x_l ``(B, T, D)`` of every block (or blocks ``0..upto``) of a timm ViT.

    Prefix tokens (cls, dist) included, in timm's order ``[prefix…, patches…]``.
    """
    x = embed_tokens(model, images)
    inputs = []
    for i, blk in enumerate(model.blocks):
        if upto is not None and i > upto:
            break
        inputs.append(x)
        x = blk(x)
    return inputs


def model_dependency(
    model: nn.Module,
    images: torch.Tensor,
    layers: Optional[Sequence[int]] = None,
    queries: Optional[Sequence[int]] = None,
    method: Method = "auto",
    chunk_size: Optional[int] = None,
) -> torch.Tensor:
    """Dependency of every (or the given) block of ``model``, in eval mode.

    Args:
        model: a timm ViT or FAR model.
        images: ``(B, C, H, W)``.
        layers: block indices (default all).
        queries: output tokens (default all).
        method: "factored" (:func:`dependency_factored`), "batched" (:func:`dependency`), "loop"
            (:func:`dependency_loop`, per head) or "auto": "factored" where the block allows it
            (timm ``Attention`` without ``scale_norm``, FAR substitutes), else "loop".
        chunk_size: queries per batch for "factored" / "batched".

    Returns:
        ``(len(layers), B, N, Q, T)`` = (layer, sample, head, query, key).
    """
    if method not in ("auto", "factored", "batched", "loop"):
        raise ValueError(f"method must be 'auto', 'factored', 'batched' or 'loop', got {method!r}")
    was_training = model.training
    model.eval()
    try:
        depth = len(model.blocks)
        layers = list(range(depth)) if layers is None else [int(i) % depth for i in layers]
        inputs = block_inputs(model, images, upto=max(layers))
        maps = []
        for i in layers:
            fn = head_output_fn(model.blocks[i])
            how = ("factored" if fn.factored else "loop") if method == "auto" else method
            if how == "factored":
                maps.append(dependency_factored(fn, inputs[i], queries, chunk_size))
            elif how == "batched":
                maps.append(dependency(fn, inputs[i], queries, chunk_size))
            else:
                maps.append(dependency_loop(fn, inputs[i], queries))
        return torch.stack(maps)
    finally:
        model.train(was_training)


# ---------------------------------------------------------------------------------------- extractor
def _resolve_layers(depth: int, layers) -> list[int]:
    if layers is None:
        return list(range(depth))
    wanted = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
    out = []
    for i in wanted:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ValueError(f"layers must be ints, got {i!r}")
        if not -depth <= i < depth:
            raise ValueError(f"layer index {i} out of range for a model with {depth} blocks (0..{depth - 1})")
        out.append(int(i) % depth)
    if not out or len(set(out)) != len(out):
        raise ValueError(f"layers must select distinct blocks, got {wanted}")
    return sorted(out)


@register("dependency")
def extract_dependency(
    model: nn.Module,
    images: torch.Tensor,
    *,
    layers: int | Sequence[int] | None = None,
    queries: Optional[Sequence[int]] = None,
    method: Method = "auto",
) -> xr.Dataset:
    """Gradient-saliency token-to-token dependency of a timm ViT teacher or a FAR model (module docstring).

    Args:
        model: eval-mode timm ``VisionTransformer`` whose blocks hold timm ``Attention`` or FAR
            substitutes (any mix).
        images: ``(B, C, H, W)`` float tensor, normalised for the model.
        layers: block indices (negative allowed); ``None`` for all blocks.
        queries: output tokens to compute (default all; ``[0]`` for the CLS row only).
        method: see :func:`model_dependency`; all give the same numbers.

    Returns:
        Dataset with ``dependency(sample, layer, head, query, key)`` (float32, ‖∂Σ_c y_q / ∂x_k‖₂),
        ``cls_dependency(sample, layer, head, y, x)`` (the CLS query's row over the patch grid, when
        the CLS query is computed), and the token coords of the ``attention`` extractor
        (``query_kind``/``query_y``/``query_x``, ``key_…``), so ``xr.concat`` with a teacher's
        attention along ``model`` lines up. attrs ``analysis="dependency"``, ``config``.

    Raises:
        ValueError: a model in training mode, a model that is not such a ViT, or bad ``layers``.
    """
    check_vit(model)
    if model.training:
        raise ValueError("dependency extraction needs an eval-mode model (call model.eval()): "
                         "dropout and drop-path would make the gradients random")
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}")
    sel = _resolve_layers(len(model.blocks), layers)
    layout = vit_token_layout(model, tuple(images.shape[-2:]))
    qs = list(range(layout.num_tokens)) if queries is None else [int(q) for q in queries]
    dep = model_dependency(model, images, sel, qs, method)  # (L, B, N, Q, T)
    arr = rearrange(dep.float().cpu().numpy(), "l b n q k -> b l n q k")
    qcoords = {k: (v[0], v[1][qs]) for k, v in layout.coords("query").items()}
    ds = xr.Dataset(
        {"dependency": (("sample", "layer", "head", "query", "key"), arr)},
        coords={"sample": np.arange(arr.shape[0]), "layer": sel, "head": np.arange(arr.shape[2]),
                **qcoords, **layout.coords("key")},
    )
    ds["dependency"].attrs.update(units="gradient norm", long_name="‖∂Σ_c y[q, head, c] / ∂x[k]‖₂ (gradient saliency)")
    if "cls" in layout.prefix_kinds and layout.prefix_kinds.index("cls") in qs:
        gh, gw = layout.grid
        row = arr[:, :, :, qs.index(layout.prefix_kinds.index("cls")), layout.num_prefix:]  # (B, L, N, patches)
        ds["cls_dependency"] = (("sample", "layer", "head", "y", "x"), rearrange(row, "b l n (y x) -> b l n y x", y=gh, x=gw))
        ds = ds.assign_coords(y=np.arange(gh), x=np.arange(gw))
        ds["cls_dependency"].attrs.update(units="gradient norm", long_name="CLS-to-patch gradient saliency")
    config = config_json(layers=None if layers is None else sel, queries=None if queries is None else qs, method=method)
    return ds.assign_attrs(analysis="dependency", config=config)
