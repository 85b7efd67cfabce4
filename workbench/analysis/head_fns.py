"""Per-head outputs of a ViT block as functions of a chosen block-internal input, for gradient-saliency dependency.

:func:`head_output_fn` describes one timm ``Block`` — teacher ``Attention`` or FAR substitute — as a
:class:`HeadFn`: the per-head outputs ``(B, T, N, C)`` as a function of the input named by ``wrt``
(:data:`WRT`; see :mod:`workbench.analysis.dependency` for what each measures) and, for the fast
factored Jacobian of :mod:`workbench.analysis.dependency`, the head as token mixer ∘ per-token map:

==================  ============================================  ==============================================
``wrt``             attention (teacher)                           FAR substitute
==================  ============================================  ==============================================
``"residual"``      z = LN1(x); whole rows in closed form         z = I_n = Proj_in(LN(LN1(x)))[n], J_k closed
                    through the LayerNorm                         form through both LayerNorms
``"mixer_input"``   z = u = LN1(x) itself (the input); rows in    z = I_n = Proj_in(LN(u))[n], J_k closed form
                    closed form                                   through the substitute's own LayerNorm
``"lstm_input"``    — (an attention has no LSTM input)            z = I_n, a slice of the input I (a selection)
==================  ============================================  ==============================================

The mixer's input gradients for all queries come from ``torch.func`` (:func:`_attention_mixer_vjp_func`)
or in closed form (:func:`_attention_mixer_vjp`) for attention, and from the batched LSTM adjoint
(:func:`methods.far.bilstm_head_adjoint`) for FAR. Every closed form is checked against
``torch.autograd.functional.jacobian`` and against a per-(head, query) autograd loop on the real
model's hook points in tests/test_dependency.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from methods.far import bilstm_head_adjoint
from methods.hooks import hook_points

if TYPE_CHECKING:
    from methods.far import MultiHeadBiLSTM

#: What a dependency differentiates by (:mod:`workbench.analysis.dependency`).
Wrt = Literal["mixer_input", "residual", "lstm_input"]
WRT: tuple[str, ...] = ("mixer_input", "residual", "lstm_input")

#: ``fn(x, heads) -> (B, T, len(heads), C)``; ``heads=None`` means all heads.
HeadOutputs = Callable[[torch.Tensor, Optional[Sequence[int]]], torch.Tensor]
#: ``local(x, head) -> z``: the per-token part of one head, ``(..., D) -> (..., Z)``.
LocalFn = Callable[[torch.Tensor, int], torch.Tensor]
#: ``mixer_vjp(z, head, queries) -> (Q, B, T, Z)``: ∂(Σ_c y[:, q, head, c]) / ∂z for every query.
MixerVJP = Callable[[torch.Tensor, int, Sequence[int]], torch.Tensor]


@dataclass(frozen=True)
class HeadFn:
    """Per-head outputs of one block as a function of one block-internal input (``wrt``).

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
    jacobian: Optional[Callable[[torch.Tensor, int], Optional[torch.Tensor]]] = None  # closed-form J_k (B, T, Z, D), or None
    selects: bool = False  # local picks coordinates of its input (identity / a slice): ‖J_kᵀ δz‖_p = ‖δz‖_p
    wrt: str = "mixer_input"  # which input x is (WRT)

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


def _attention_heads(attn: nn.Module, xn: torch.Tensor, heads: Optional[Sequence[int]]) -> torch.Tensor:
    """Per-head ``softmax(q kᵀ · scale) v`` of a timm ``Attention`` from its input ``xn = LN1(x)``: ``(B, T, n, D_h)``."""
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


def _attention_rows_closed_form(
    block: nn.Module, x: torch.Tensor, head: int, queries: Sequence[int], through_norm: bool = True
) -> Optional[torch.Tensor]:
    """L2 dependency rows ``(B, Q, T)`` of attention head h without materialising a D-vector per (q, k).

    Uses :func:`_attention_mixer_vjp`'s closed form, ∂F_q/∂z_k = a_qk α_q + b_qk β_q (+ ω_q at
    k = q) with a = dS, b = P. With respect to z = LN1(x) itself (``through_norm=False``: x is z) the
    squared norm is a²‖α‖² + 2ab α·β + b²‖β‖². Through the block's LayerNorm (``through_norm=True``:
    x is the residual input), the input gradient at token k is (g − mean(g) − x̂_k mean(g ⊙ x̂_k)) / σ_k
    for g = γ ⊙ ∂F_q/∂z_k; its squared norm expands into inner products of α_q, β_q, 1 and x̂_k — a
    few (T × D)·(D × Q) matmuls instead of Q·T·D work. The k = q entries (with ω) are computed
    directly. None when the block is not LayerNorm → plain attention (then the generic factored
    path runs).
    """
    attn = block.attn
    if not (isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity)):
        return None
    if through_norm:
        parts = _layer_norm_parts(block.norm1, x)
        if parts is None:
            return None
        xhat, sigma, gamma = parts
        xn = block.norm1(x)
    else:
        xn, gamma = x, x.new_ones(x.shape[-1])
    d = x.shape[-1]
    wts = _head_weights(attn, head)
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
    if through_norm:
        m = (a * al.sum(-1, keepdim=True) + b * be.sum(-1, keepdim=True)) / d  # mean(g): (B, Q, T)
        n = (a * (al @ xhat.transpose(1, 2)) + b * (be @ xhat.transpose(1, 2))) / d  # mean(g ⊙ x̂_k)
        xx = (xhat * xhat).sum(-1)[:, None, :]  # x̂_k · x̂_k: (B, 1, T)
        x1 = xhat.sum(-1)[:, None, :]  # 1 · x̂_k (0 up to rounding)
        sq = gg - d * m * m - 2 * d * n * n + n * n * xx + 2 * m * n * x1
        out = sq.clamp_min(0).sqrt() / sigma.transpose(1, 2)  # (B, Q, T)
    else:
        out = gg.clamp_min(0).sqrt()
    # k = q: the query's own q (and gate) add ω_q; compute those entries directly
    own = attn.scale * (a @ k) @ wts["q"][0]
    if gate is not None:
        own = own + (y * gate * (1 - gate)) @ wts["g"][0]
    iq = torch.arange(len(qs), device=x.device)
    g = gamma * (a[:, iq, qs, None] * alpha + b[:, iq, qs, None] * beta + own)  # (B, Q, D)
    if through_norm:
        xq, sq_ = xhat[:, qs], sigma[:, qs]
        g = (g - g.mean(-1, keepdim=True) - xq * (g * xq).mean(-1, keepdim=True)) / sq_
    out[:, iq, qs] = g.norm(dim=-1)
    return out


def _layer_norm_vjp_rows(rows: torch.Tensor, norm: nn.Module, inp: torch.Tensor) -> Optional[torch.Tensor]:
    """``rows · ∂LN(inp)/∂inp`` per token, ``(B, T, Z, D)``: each row c maps to (cγ − mean(cγ) − x̂·mean(cγ ⊙ x̂)) / σ."""
    if isinstance(norm, nn.Identity):
        return rows
    parts = _layer_norm_parts(norm, inp)
    if parts is None:
        return None
    xhat, sigma, gamma = parts  # (B, T, D), (B, T, 1), (D,)
    cg = rows * gamma
    proj = (cg @ xhat[..., :, None]) / xhat.shape[-1]  # mean(cγ ⊙ x̂): (B, T, Z, 1)
    return (cg - cg.mean(-1, keepdim=True) - proj * xhat[..., None, :]) / sigma[..., None]


def _far_jacobian(block: nn.Module, x: torch.Tensor, head: int, through_norm1: bool) -> Optional[torch.Tensor]:
    """J_k = ∂I_n/∂x_k of FAR head n for every token in closed form: W_n through the substitute's LayerNorm (and
    ``norm1`` when x is the residual input) as rank-2 updates, O(D_h·D) per token. None when a norm is not a
    LayerNorm (then ``vmap(jacrev)`` runs)."""
    sub = block.attn
    w = sub.in_proj.weight[head * sub.head_dim:(head + 1) * sub.head_dim]  # (D_h, D)
    inner = block.norm1(x) if through_norm1 else x  # input of the substitute's own norm
    rows = _layer_norm_vjp_rows(w.expand(*x.shape[:2], *w.shape), sub.norm, inner)
    if rows is None or not through_norm1:
        return rows
    return _layer_norm_vjp_rows(rows, block.norm1, x)


def _far_local(block: nn.Module, x: torch.Tensor, head: int, through_norm1: bool) -> torch.Tensor:
    """Per-token part of FAR head n: the LSTM input I_n = Proj_in(LN(u))[n] with u = LN1(x) (or u = x), ``(..., D) -> (..., D_h)``."""
    sub = block.attn
    rows = slice(head * sub.head_dim, (head + 1) * sub.head_dim)
    u = block.norm1(x) if through_norm1 else x
    return F.linear(sub.norm(u), sub.in_proj.weight[rows], sub.in_proj.bias[rows])


def _head_slice(sub: MultiHeadBiLSTM, inputs: torch.Tensor, heads: Optional[Sequence[int]]) -> torch.Tensor:
    """Columns of ``heads`` in the LSTM input I ``(B, T, N·D_h)``: ``(B, T, n·D_h)``."""
    if heads is None:
        return inputs
    dh = sub.head_dim
    cols = torch.cat([torch.arange(n * dh, (n + 1) * dh) for n in heads]).to(inputs.device)
    return inputs.index_select(-1, cols)


def _far_head_fn(block: nn.Module, wrt: str) -> HeadFn:
    sub = block.attn
    adjoint = lambda z, h, qs: bilstm_head_adjoint(sub, h, z, qs)  # noqa: E731
    if wrt == "lstm_input":  # x = I (B, T, N·D_h); head n reads its own slice only
        dh = sub.head_dim
        return HeadFn(lambda i, heads=None: sub.heads_from_lstm_inputs(_head_slice(sub, i, heads), heads), sub.num_heads,
                      local=lambda i, h: i[..., h * dh:(h + 1) * dh], mixer_vjp=adjoint, selects=True, wrt=wrt)
    full = wrt == "residual"
    return HeadFn(
        lambda x, heads=None: sub.forward_heads(block.norm1(x) if full else x, heads), sub.num_heads,
        local=lambda x, h: _far_local(block, x, h, full), mixer_vjp=adjoint,
        jacobian=lambda x, h: _far_jacobian(block, x, h, full), wrt=wrt,
    )


def _attention_head_fn(block: nn.Module, wrt: str) -> HeadFn:
    attn = block.attn
    if not isinstance(getattr(attn, "norm", nn.Identity()), nn.Identity):
        raise TypeError("attention with scale_norm normalises over all heads together: per-head dependency is undefined")
    if wrt == "lstm_input":
        raise ValueError("wrt='lstm_input' needs a FAR substitute: an attention block has no LSTM input "
                         "(use wrt='mixer_input' for a teacher)")
    mixer = lambda z, h, qs: _attention_mixer_vjp(attn, z, h, qs)  # noqa: E731
    if wrt == "mixer_input":  # x = LN1 output: the per-token map is the identity
        return HeadFn(lambda u, heads=None: _attention_heads(attn, u, heads), attn.num_heads,
                      local=lambda u, h: u, mixer_vjp=mixer, selects=True, wrt=wrt,
                      rows=lambda u, h, qs: _attention_rows_closed_form(block, u, h, qs, through_norm=False))
    return HeadFn(
        lambda x, heads=None: _attention_heads(attn, block.norm1(x), heads), attn.num_heads,
        local=lambda x, h: block.norm1(x), mixer_vjp=mixer, wrt=wrt,
        rows=lambda x, h, qs: _attention_rows_closed_form(block, x, h, qs),
    )


def is_far_substitute(attn: nn.Module | None) -> bool:
    """Whether ``attn`` is a FAR substitute, by its hook point ``hook_lstm_in`` (the LSTM inputs), not its type."""
    return isinstance(attn, nn.Module) and "hook_lstm_in" in hook_points(attn)


def head_output_fn(block: nn.Module, wrt: Wrt = "mixer_input") -> HeadFn:
    """Per-head outputs of a timm ViT ``Block`` (teacher ``Attention`` or FAR substitute).

    Args:
        block: ``timm.models.vision_transformer.Block``; its ``.attn`` is a timm ``Attention`` or
            a :class:`methods.far.MultiHeadBiLSTM`. Put it in eval mode yourself.
        wrt: the input the returned function takes: ``"residual"`` the block input x_l ``(B, T, D)``
            (``hook_resid_pre``), ``"mixer_input"`` the LN1 output ``(B, T, D)`` (``hook_mixer_in``),
            ``"lstm_input"`` FAR's LSTM inputs I ``(B, T, N·D_h)`` (``attn.hook_lstm_in``).

    Returns:
        A :class:`HeadFn` mapping that input to ``(B, T, N, C)``: C = D_h for attention
        (``attn @ v``), 2·U for FAR (forward then reverse units).

    Raises:
        TypeError: ``block.attn`` is neither, or an attention whose output norm mixes heads.
        ValueError: an unknown ``wrt``, or ``"lstm_input"`` for an attention block.
    """
    if wrt not in WRT:
        raise ValueError(f"wrt must be one of {', '.join(map(repr, WRT))}, got {wrt!r}")
    attn = getattr(block, "attn", None)
    if is_far_substitute(attn):
        return _far_head_fn(block, wrt)
    if attn is not None and all(hasattr(attn, a) for a in ("qkv", "num_heads", "head_dim", "scale")):
        return _attention_head_fn(block, wrt)
    raise TypeError(f"block.attn must be a timm Attention or a FAR MultiHeadBiLSTM, got {type(attn).__name__}")
