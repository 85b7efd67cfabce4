"""Sparsifiner's sparse attention (§3, Eq. 1–6) and the Linformer baseline (§4, Table 4), as drop-ins
for timm's ViT ``Attention``.

Paper: Wei et al., "Sparsifiner: Learning Sparse Instance-Dependent Attention for Efficient Vision
Transformers", CVPR 2023. Per block and head, with q, k, v the backbone's own projections:

    A_down = softmax(Q (W_down K)ᵀ · s)                      (Eq. 1)  W_down ∈ R^{n_down×n}, s = 1/√d
    Ã_down = A_down ⊙ 1[A_down > τ]                           (Eq. 2)  "basis coefficients"
    M      = 1[Top-k_B(Ã_down W̃_up)]                          (Eq. 3)  W̃_up = thresholded W_up, the "sparse basis"
    Ã      = M ⊙ softmax(QKᵀ/√d)                              (Eq. 4–5)
    out    = Ã V                                              (Eq. 6)

**Prefix tokens (CLS, dist, registers).** The predictor runs for the n − P patch queries only; each of
them keeps at most B = ⌈keep_rate · n⌉ keys chosen by top-k among all n keys, the CLS key included
(it is kept only when it scores among the top B). A prefix query row is dense: CLS attends to every
token. This is the authors' code (``cheap_attn[..., 1:, :]``, ``cls_mask = ones``) and what the
paper's Table 2 counts (its MFLOPs grow by 2·(n−1)·D·L per unit of B: see :mod:`.flops`).
W_down and W_up are shared by the heads of a layer (the code's ``proj_n`` / ``proj_back_n``; Fig. 6
shows one basis per layer).

**Zero scores (§3: "We discard zero values and binarize").** ``discard_zeros=True`` (paper, default):
of a row's Top-k_B keys, those whose score Ã_down·W̃_up is ≤ 0 are not kept, so a row keeps *at most*
B keys — fewer, or none (its output is then 0), where the predictor gives no key a positive score.
The score reconstructs attention probabilities (Eq. 10 trains it against them), so a zero is "no
predicted connectivity": no kept coefficient's basis vector covers the key. With the signed basis a
score can be negative, which predicts less than zero attention, below every zero; dense Top-k ranks
it after the zeros that are discarded, so it is discarded too (with ``basis_sign="abs"`` scores are
≥ 0 and the rule is exactly "≠ 0"). Why it matters: with the paper's n_down = 32 and τ = 0.05 every
coefficient of an untrained predictor is ≈ 1/32 < τ, the score map is all zero, and exact Top-k would
keep the same index-chosen B keys for every query, head and image (``torch.topk``'s tie order) — a
fixed pattern the paper does not describe. ``discard_zeros=False`` keeps exactly B (the authors' code:
``topk`` then ``scatter``, no zero test).

**Paper vs the authors' code** (options of :class:`~.config.SparsifinerConfig`; paper = default):

- ``renormalize``: Eq. 4 keeps the kept entries at their full-softmax values (rows sum to < 1);
  the code renormalises the softmax over the kept set (``masked_fill(-inf)`` then softmax). Note
  that Eq. 4 needs each row's full normaliser Σ_j exp(q·k_j / √d) over *all* n keys, so its sparse
  path still computes the dense QKᵀ (only AV is sparse); the paper's FLOP counts (sparse QKᵀ and AV)
  hold for the renormalised form only.
- ``scale``: 1/√d in Eq. 1 vs num_heads^-0.5 in the code.
- ``basis_sign`` / ``basis_threshold``: W_up with |w| ≤ 1e-2 zeroed (signed, §4) vs |W_up| with
  entries ≤ 2e-2 zeroed (code). The threshold applies whenever a mask is made (training and
  inference); Eq. 10's reconstruction may use the raw basis (see :mod:`.losses`).
- ``predictor_dim``: the code first maps q and k of each head to head_dim/2 channels with learned
  linears (``proj_c_q``, ``proj_c_k``); the paper uses Q and K as they are.
- ``coef_topk``: the code's default experiment keeps the 8 largest coefficients instead of τ.

**Forms.** ``path="masked"`` (train form): the dense scores are computed and masked (Eq. 5), so the
forward is differentiable in the backbone (the mask itself has no gradient: Eq. 3 is an indicator;
the code detaches it). ``path="sparse"`` (deploy form, inference only): only the kept query–key
pairs are computed, with a sampled dense-dense matmul (``torch.sparse.sampled_addmm``) for QKᵀ and
a CSR × dense matmul for ÃV; it equals the masked form to float rounding. The kernels were picked by
measurement (one thread, loaded 2-core machine): gathering the kept keys and values
(``index_select`` + batched products) took 9–84× the dense SDPA time, the CSR kernels 0.4–2.9×; at
577 tokens and keep rate 0.1 the kept-pair attention alone runs in ~0.6× SDPA's CPU time, but the
predictor's n × n score map and its top-k cost more than dense attention on a CPU
(``benchmarks/sparse_attention.py`` prints the pieces). ``dense=True`` (phase 1
of training): full attention, the predictor still runs (its output only feeds the Eq. 10 loss).

Hook points (names relative to the attention module; P prefix tokens, n = T tokens, r = n_down):

==============================  ==============================================================  ============================
name                            value                                                           shape
==============================  ==============================================================  ============================
``predictor.hook_a_down``       low-rank attention A_down (Eq. 1), patch queries                ``(B, H, T-P, r)``
``predictor.hook_coef``         basis coefficients Ã_down (Eq. 2)                               ``(B, H, T-P, r)``
``predictor.hook_w_up``         sparse basis W̃_up as used (thresholded), shared by the heads     ``(r, T)``
``predictor.hook_score``        connectivity score map Ã_down W̃_up (the top-k input, Eq. 3)     ``(B, H, T-P, T)``
``hook_mask``                   connectivity mask M (bool), prefix rows all True                ``(B, H, T, T)``
``hook_pattern``                sparse attention multiplied into V (zeros off the mask)         ``(B, H, T, T)``
``hook_pattern_full``           dense softmax(QKᵀ/√d) for the same queries                       ``(B, H, T, T)``
``hook_heads``                  per-head outputs, heads concatenated, before ``proj``            ``(B, T, H·D_h)``
==============================  ==============================================================  ============================

Cost of the hooks: in the masked form ``hook_mask`` and ``hook_pattern`` are the tensors the forward
uses, and ``hook_pattern_full`` is too when ``renormalize=False``; with ``renormalize=True`` the full
softmax is computed only while ``hook_pattern_full`` is hooked. In the sparse path the three
``(B, H, T, T)`` tensors are built only while hooked (scattered from what the forward computed, or,
for the full map, one extra dense softmax); the rest are computed anyway.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
from timm.layers import trunc_normal_
from torch import nn

from ..hooks import HookPoint
from .config import SparsifinerConfig, budget

Path = Literal["masked", "sparse"]


def _active(point: HookPoint) -> bool:
    """Whether anything listens at ``point`` (so a value that costs work is worth computing)."""
    return bool(point._forward_hooks) or bool(point._forward_pre_hooks)


def connectivity_indices(score: torch.Tensor, keep: int) -> torch.Tensor:
    """The kept keys of every patch query: ``Top-k_B`` of the score map (Eq. 3), sorted by key index.

    Exactly ``keep`` keys per row, also when scores tie (zeros of a sparse score map): ties are
    broken by ``torch.topk``, deterministically for a given input.

    Args:
        score: ``(B, H, T-P, T)`` connectivity scores.
        keep: the budget B.

    Returns:
        ``(B, H, T-P, keep)`` int64 key indices, ascending within each row.
    """
    return score.topk(keep, dim=-1, sorted=False).indices.sort(dim=-1).values


def kept_connections(score: torch.Tensor, keep: int, discard_zeros: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eq. 3 with §3's zero rule: ``(idx, valid)``, the Top-k_B keys of every patch query and which of them are kept.

    Args:
        score: ``(B, H, T-P, T)`` connectivity scores.
        keep: the budget B.
        discard_zeros: drop the Top-k_B keys whose score is ≤ 0 (module docstring); False: keep all B.

    Returns:
        ``idx`` ``(B, H, T-P, keep)`` int64, ascending within each row (:func:`connectivity_indices`), and
        ``valid`` ``(B, H, T-P, keep)`` bool (``score > 0`` at ``idx``), or None when every index is kept.
    """
    idx = connectivity_indices(score, keep)
    return idx, (score.gather(-1, idx) > 0 if discard_zeros else None)


def mask_from_indices(idx: torch.Tensor, tokens: int, prefix: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean connectivity mask ``(B, H, T, T)``: prefix query rows all True, patch rows True at ``idx``
    (where ``valid``, when given: :func:`kept_connections`)."""
    b, h = idx.shape[:2]
    mask = torch.zeros(b, h, tokens, tokens, dtype=torch.bool, device=idx.device)
    mask[:, :, :prefix] = True
    mask[:, :, prefix:].scatter_(-1, idx, True if valid is None else valid)
    return mask


class ConnectivityPredictor(nn.Module):
    """The connectivity mask predictor of §3 (Eq. 1–3) for one layer, all heads.

    Parameters: ``w_down`` (W_down, ``(r, T)``) and ``w_up`` (W_up, ``(r, T)``), both shared by the
    heads and initialised from N(0, 0.02²) truncated (the authors' code); optionally ``q_proj`` /
    ``k_proj`` (``predictor_dim``).
    """

    def __init__(self, num_tokens: int, num_prefix_tokens: int, num_heads: int, head_dim: int, cfg: SparsifinerConfig):
        super().__init__()
        self.num_tokens, self.num_prefix_tokens, self.num_heads = num_tokens, num_prefix_tokens, num_heads
        self.n_down, self.tau, self.coef_topk = cfg.n_down, cfg.tau, cfg.coef_topk
        self.basis_threshold, self.basis_sign = cfg.basis_threshold, cfg.basis_sign
        self.keep = budget(cfg.keep_rate, num_tokens)
        width = cfg.predictor_dim or head_dim
        self.q_proj = nn.Linear(head_dim, width) if cfg.predictor_dim else None
        self.k_proj = nn.Linear(head_dim, width) if cfg.predictor_dim else None
        self.scale = width ** -0.5 if cfg.scale == "head_dim" else num_heads ** -0.5
        self.w_down = nn.Parameter(torch.empty(cfg.n_down, num_tokens))  # W_down: (r, T)
        self.w_up = nn.Parameter(torch.empty(cfg.n_down, num_tokens))  # W_up: (r, T), the sparse basis
        trunc_normal_(self.w_down, std=0.02)
        trunc_normal_(self.w_up, std=0.02)
        self.hook_a_down = HookPoint()
        self.hook_coef = HookPoint()
        self.hook_w_up = HookPoint()
        self.hook_score = HookPoint()

    def basis(self) -> torch.Tensor:
        """W̃_up, the thresholded sparse basis ``(r, T)`` (signed, or |W_up| with ``basis_sign="abs"``)."""
        w = self.w_up.abs() if self.basis_sign == "abs" else self.w_up
        return w * (w.abs() > self.basis_threshold)

    def coefficients(self, a_down: torch.Tensor) -> torch.Tensor:
        """Ã_down (Eq. 2): entries ≤ τ zeroed (or all but the ``coef_topk`` largest)."""
        if self.coef_topk is not None:
            kept = a_down.topk(self.coef_topk, dim=-1).indices
            return a_down * torch.zeros_like(a_down, dtype=torch.bool).scatter_(-1, kept, True)
        return a_down * (a_down > self.tau)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(A_down, Ã_down, score)`` for the patch queries.

        Args:
            q, k: ``(B, H, T, D_h)`` queries and keys of the backbone.

        Returns:
            A_down and Ã_down ``(B, H, T-P, r)``; the score map Ã_down W̃_up ``(B, H, T-P, T)``.
        """
        qp = q[:, :, self.num_prefix_tokens:]  # (B, H, T-P, D_h): the predictor skips prefix queries
        if self.q_proj is not None:
            qp, k = self.q_proj(qp), self.k_proj(k)  # (..., predictor_dim)
        k_down = torch.einsum("rn,bhnd->bhrd", self.w_down, k)  # W_down K: (B, H, r, d)
        a_down = self.hook_a_down((qp @ k_down.transpose(-2, -1) * self.scale).softmax(dim=-1))  # (B, H, T-P, r)
        coef = self.hook_coef(self.coefficients(a_down))
        score = self.hook_score(coef @ self.hook_w_up(self.basis()))  # (B, H, T-P, r) @ (r, T) -> (B, H, T-P, T)
        return a_down, coef, score


class SparsifinerAttention(nn.Module):
    """timm ``Attention`` with Sparsifiner's connectivity predictor and sparse attention (module docstring).

    Sub-module names follow timm's ``Attention`` (``qkv``, ``q_norm``, ``k_norm``, ``attn_drop``,
    ``norm``, ``proj``, ``proj_drop``), so a teacher's attention weights load under the same keys;
    the predictor's parameters live under ``predictor``.

    Args:
        dim: token width D.
        num_heads: H.
        num_tokens: T, fixed (W_down and W_up are r × T).
        num_prefix_tokens: P (1 for a CLS token).
        cfg: predictor and attention options.
        path: "masked" (train form) or "sparse" (deploy form).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_tokens: int,
        num_prefix_tokens: int,
        cfg: SparsifinerConfig,
        *,
        head_dim: int | None = None,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        path: Path = "masked",
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim or dim // num_heads
        self.attn_dim = num_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.num_tokens, self.num_prefix_tokens = num_tokens, num_prefix_tokens
        self.renormalize = cfg.renormalize
        self.discard_zeros = cfg.discard_zeros
        self.keep = budget(cfg.keep_rate, num_tokens)
        self.path: Path = _check_path(path)
        self.dense = False  # phase 1: full attention, predictor still runs (see replace.dense_attention)
        self.qkv = nn.Linear(dim, 3 * self.attn_dim, bias=qkv_bias)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = nn.Identity()
        self.proj = nn.Linear(self.attn_dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)
        self.predictor = ConnectivityPredictor(num_tokens, num_prefix_tokens, num_heads, self.head_dim, cfg)
        self.hook_mask = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_pattern_full = HookPoint()
        self.hook_heads = HookPoint()

    @classmethod
    def from_attention(cls, attn: nn.Module, num_tokens: int, num_prefix_tokens: int, cfg: SparsifinerConfig,
                       path: Path = "masked") -> SparsifinerAttention:
        """Wrap a timm ``Attention``: its modules (qkv, norms, proj, dropouts) are taken over as they are."""
        if getattr(attn, "gate", None) is not None:
            raise ValueError("gated timm attention (gated=True) is not supported by Sparsifiner")
        new = cls(attn.qkv.in_features, attn.num_heads, num_tokens, num_prefix_tokens, cfg, head_dim=attn.head_dim,
                  qkv_bias=attn.qkv.bias is not None, proj_bias=attn.proj.bias is not None, path=path)
        for name in ("qkv", "q_norm", "k_norm", "attn_drop", "norm", "proj", "proj_drop"):
            setattr(new, name, getattr(attn, name))
        ref = attn.qkv.weight
        return new.to(device=ref.device, dtype=ref.dtype)

    def extra_repr(self) -> str:
        return (f"tokens={self.num_tokens}, prefix={self.num_prefix_tokens}, budget={self.keep}, "
                f"path={self.path}, renormalize={self.renormalize}, discard_zeros={self.discard_zeros}")

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("Sparsifiner attention makes its own connectivity mask; attn_mask / is_causal are not supported")
        b, n, _ = x.shape
        if n != self.num_tokens:
            raise ValueError(f"this Sparsifiner attention was built for {self.num_tokens} tokens (W_down and W_up are "
                             f"n_down x {self.num_tokens}), got {n}; build the model at the input's resolution")
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, H, T, D_h)
        q, k = self.q_norm(q), self.k_norm(k)
        _, _, score = self.predictor(q, k)
        if self.dense:
            out = self._dense(q, k, v)
        elif self.path == "sparse":
            out = self._sparse(q, k, v, *kept_connections(score, self.keep, self.discard_zeros))
        else:
            out = self._masked(q, k, v, *kept_connections(score, self.keep, self.discard_zeros))
        out = self.hook_heads(out.transpose(1, 2).reshape(b, n, self.attn_dim))  # (B, T, H·D_h)
        return self.proj_drop(self.proj(self.norm(out)))

    # ----------------------------------------------------------------------------- the three paths
    def _dense(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Full attention (phase 1); the probabilities are both ``hook_pattern`` and ``hook_pattern_full``."""
        if not (_active(self.hook_pattern) or _active(self.hook_pattern_full)):
            p = self.attn_drop.p if self.training else 0.0
            return nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, scale=self.scale)
        full = self.hook_pattern_full((q * self.scale @ k.transpose(-2, -1)).softmax(dim=-1))
        return self.hook_pattern(self.attn_drop(full)) @ v

    def _masked(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                valid: torch.Tensor | None = None) -> torch.Tensor:
        """Eq. 4–6 on dense tensors: ``(B, H, T, D_h)``, differentiable in q, k, v. A row keeping no key gives 0."""
        mask = self.hook_mask(mask_from_indices(idx, self.num_tokens, self.num_prefix_tokens, valid))  # (B, H, T, T)
        logits = q * self.scale @ k.transpose(-2, -1)  # (B, H, T, T)
        if self.renormalize:
            if valid is None:
                pattern = logits.masked_fill(~mask, float("-inf")).softmax(dim=-1)  # softmax over the kept set
            else:  # a row keeping no key gives 0: softmax it unmasked (all -inf would give NaN values and gradients)
                empty = ~mask.any(-1, keepdim=True)  # (B, H, T, 1)
                pattern = logits.masked_fill(~mask & ~empty, float("-inf")).softmax(dim=-1).masked_fill(empty, 0.0)
            if _active(self.hook_pattern_full):
                self.hook_pattern_full(logits.softmax(dim=-1))
        else:
            pattern = self.hook_pattern_full(logits.softmax(dim=-1)) * mask  # Eq. 5: M ⊙ A
        return self.hook_pattern(self.attn_drop(pattern)) @ v

    def _sparse(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                valid: torch.Tensor | None = None) -> torch.Tensor:
        """Only the kept pairs: prefix rows dense, patch rows as CSR (SDDMM for QKᵀ, SpMM for ÃV).

        ``valid`` (``(B, H, T-P, keep)``, :func:`kept_connections`) leaves a row fewer than ``keep`` entries:
        its CSR row holds the valid ones only (row-major boolean selection keeps the ascending key order)."""
        if self.training and torch.is_grad_enabled():
            raise RuntimeError("the sparse path (deploy form) is for inference; call model.eval(), or train the "
                               "masked form (methods.sparsifiner.to_masked)")
        b, h, t, d = q.shape
        pre, keep = self.num_prefix_tokens, self.keep
        rows = b * h * (t - pre)
        # prefix queries (CLS) attend to every key: (B, H, P, T) @ (B, H, T, D_h)
        pre_attn = (q[:, :, :pre] * self.scale @ k.transpose(-2, -1)).softmax(dim=-1)
        out_pre = pre_attn @ v
        # patch queries: row (b, h, i) keeps columns (b·H + h)·T + idx of the block-diagonal (B·H·(T-P)) × (B·H·T) matrix
        offset = (torch.arange(b * h, device=q.device) * t).view(b, h, 1, 1)
        cols = (idx + offset).reshape(rows, keep)  # (rows, B_k)
        ok = None if valid is None else valid.reshape(rows, keep)
        if ok is None:
            crow = torch.arange(0, rows * keep + 1, keep, device=q.device)
            cols = cols.reshape(-1)  # (rows·B_k,)
        else:  # rows of different lengths: the valid entries only, in row-major order
            crow = torch.cat([torch.zeros(1, dtype=torch.long, device=q.device), ok.sum(-1).cumsum(0)])
            cols = cols[ok]  # (n_kept,)
        qp = q[:, :, pre:].reshape(rows, d)
        if self.renormalize:
            pattern = _csr(crow, cols, torch.zeros(cols.numel(), dtype=q.dtype, device=q.device), rows, b * h * t)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*[Ss]parse.*beta.*")
                logits = torch.sparse.sampled_addmm(pattern, qp, k.reshape(b * h * t, d).t(), beta=0.0, alpha=self.scale)
            if ok is None:
                vals = logits.values().view(rows, keep).softmax(dim=-1)  # softmax over the kept set
            else:  # pad to (rows, keep) with -inf, softmax, an empty row's NaNs to 0
                padded = torch.full((rows, keep), float("-inf"), dtype=q.dtype, device=q.device)
                padded[ok] = logits.values()
                vals = padded.softmax(dim=-1).nan_to_num(0.0)
        else:  # Eq. 4 needs each row's normaliser over all keys: dense QKᵀ for the patch rows
            dense_logits = q[:, :, pre:] * self.scale @ k.transpose(-2, -1)  # (B, H, T-P, T)
            lse = dense_logits.logsumexp(dim=-1, keepdim=True)
            vals = (dense_logits.gather(-1, idx) - lse).exp().reshape(rows, keep)
        if ok is not None:
            vals = vals * ok  # (rows, keep), 0 where not kept (for the hook)
        attn = _csr(crow, cols, vals.reshape(-1) if ok is None else vals[ok], rows, b * h * t)
        out_patch = (attn @ v.reshape(b * h * t, d)).view(b, h, t - pre, d)
        if _active(self.hook_mask):
            self.hook_mask(mask_from_indices(idx, t, pre, valid))
        if _active(self.hook_pattern):
            dense = torch.zeros(b, h, t - pre, t, dtype=q.dtype, device=q.device).scatter_(-1, idx, vals.view(b, h, t - pre, keep))
            self.hook_pattern(torch.cat([pre_attn, dense], dim=2))
        if _active(self.hook_pattern_full):
            self.hook_pattern_full((q * self.scale @ k.transpose(-2, -1)).softmax(dim=-1))
        return torch.cat([out_pre, out_patch], dim=2)  # (B, H, T, D_h)


def _csr(crow: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, rows: int, ncols: int) -> torch.Tensor:
    """A CSR matrix built without invariant checks (indices are valid by construction)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta.*")
        return torch.sparse_csr_tensor(crow, cols, values, size=(rows, ncols), check_invariants=False)


def _check_path(path: str) -> Path:
    if path not in ("masked", "sparse"):
        raise ValueError(f"path must be 'masked' (train form) or 'sparse' (deploy form), got {path!r}")
    return path  # type: ignore[return-value]


class LinformerAttention(nn.Module):
    """Linformer's low-rank attention (Wang et al. 2020) at a matched budget: the baseline of Table 4 / Fig. 5.

    Keys and values are projected along the token axis to k = B rows by learned E, F ∈ R^{k×n}
    (shared by the heads of a layer, as in the authors' ``linformer.py``; initialised uniform in
    ±1/√k like there), so that the attention-value product costs what Sparsifiner's does at
    keep rate B/n (§4, "Low-rank: connectivities or attention?"):

        A = softmax(Q (E K)ᵀ / √d)  ∈ R^{n×k},     out = A (F V) = (A F) V

    Hook points: ``hook_pattern_lowrank`` A ``(B, H, T, k)``; ``hook_pattern`` the equivalent
    token-to-token map A F ``(B, H, T, T)`` that multiplies V (computed only while hooked; its rows
    need not be positive or sum to 1); ``hook_heads`` ``(B, T, H·D_h)``.
    """

    def __init__(self, dim: int, num_heads: int, num_tokens: int, k: int, *, head_dim: int | None = None,
                 qkv_bias: bool = True, proj_bias: bool = True):
        super().__init__()
        if not 1 <= k <= num_tokens:
            raise ValueError(f"Linformer k must be in [1, {num_tokens}], got {k}")
        self.num_heads, self.head_dim = num_heads, head_dim or dim // num_heads
        self.attn_dim = num_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.num_tokens, self.k = num_tokens, k
        self.qkv = nn.Linear(dim, 3 * self.attn_dim, bias=qkv_bias)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.attn_drop = nn.Dropout(0.0)
        self.norm = nn.Identity()
        self.proj = nn.Linear(self.attn_dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(0.0)
        bound = k ** -0.5
        self.e = nn.Parameter(torch.empty(k, num_tokens).uniform_(-bound, bound))  # E: (k, T), keys
        self.f = nn.Parameter(torch.empty(k, num_tokens).uniform_(-bound, bound))  # F: (k, T), values
        self.hook_pattern_lowrank = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_heads = HookPoint()

    @classmethod
    def from_attention(cls, attn: nn.Module, num_tokens: int, k: int) -> LinformerAttention:
        """Wrap a timm ``Attention`` (its qkv, norms, proj and dropouts are taken over)."""
        if getattr(attn, "gate", None) is not None:
            raise ValueError("gated timm attention (gated=True) is not supported by the Linformer baseline")
        new = cls(attn.qkv.in_features, attn.num_heads, num_tokens, k, head_dim=attn.head_dim,
                  qkv_bias=attn.qkv.bias is not None, proj_bias=attn.proj.bias is not None)
        for name in ("qkv", "q_norm", "k_norm", "attn_drop", "norm", "proj", "proj_drop"):
            setattr(new, name, getattr(attn, name))
        ref = attn.qkv.weight
        return new.to(device=ref.device, dtype=ref.dtype)

    def extra_repr(self) -> str:
        return f"tokens={self.num_tokens}, k={self.k}"

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("the Linformer baseline does not support attn_mask / is_causal")
        b, n, _ = x.shape
        if n != self.num_tokens:
            raise ValueError(f"this Linformer attention was built for {self.num_tokens} tokens, got {n}")
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, H, T, D_h)
        q, k = self.q_norm(q), self.k_norm(k)
        k_low = torch.einsum("mn,bhnd->bhmd", self.e, k)  # E K: (B, H, k, D_h)
        v_low = torch.einsum("mn,bhnd->bhmd", self.f, v)  # F V: (B, H, k, D_h)
        attn = self.hook_pattern_lowrank((q * self.scale @ k_low.transpose(-2, -1)).softmax(dim=-1))  # (B, H, T, k)
        attn = self.attn_drop(attn)
        if _active(self.hook_pattern):
            self.hook_pattern(attn @ self.f)  # (B, H, T, k) @ (k, T): the map applied to V
        out = self.hook_heads((attn @ v_low).transpose(1, 2).reshape(b, n, self.attn_dim))
        return self.proj_drop(self.proj(self.norm(out)))
