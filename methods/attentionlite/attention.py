"""Stand-alone local self-attention (AttentionLite Eq. 1; Ramachandran, Parmar et al. 2019).

For the pixel ``(i, j)`` of a ``(C_in, H, W)`` map, one head of width ``d`` computes

    y_ij = Σ_{(a,b) ∈ N_k(i,j)} softmax_ab( q_ijᵀ k_ab / √d  +  q_ijᵀ r_{a-i, b-j} / d^{1/4} ) v_ab      (Eq. 1)

with ``q = W_Q x``, ``k = W_K x``, ``v = W_V x`` (1×1 projections, no bias) and ``N_k(i, j)`` the
``k × k`` neighbourhood centred on ``(i, j)``. Multi-head: ``N`` heads each own ``C_out / N``
channels of q, k, v (Eq. 1 written per head, so ``C_out`` in its scalings is the head width ``d``).

Relative position embedding (Ramachandran et al. §3.1): ``r_{a-i, b-j}`` is the concatenation of a
row-offset embedding (first ``d/2`` channels) and a column-offset embedding (last ``d - d/2``), one
per head and offset, so ``q · r = q_rowᵀ r_row[a-i] + q_colᵀ r_col[b-j]``; the logits' position
part is two ``(k)``-sized products broadcast to ``k × k``, never a ``(k², d)`` table per pixel.

Borders: neighbours outside the image are *masked* (logit −∞), so every pixel's attention sums to 1
over real pixels. (The popular unfold implementations zero-pad the input instead, which lets padded
positions draw weight through the position term; masking is the local-attention definition.)

Implementation (no Python loop over positions): two custom operators, ``attentionlite::neighbour_dot``
(``(B, G, c, H, W)`` queries × keys -> ``(B, G, k², H, W)`` products with the ``k²`` neighbours) and
``attentionlite::neighbour_mix`` (``(B, G, k², H, W)`` weights × values -> ``(B, G, c, H, W)``), each a loop
over the ``k²`` neighbour *offsets* of one vectorised multiply-add over the whole batch, every head and
pixel, with hand-written backward passes that accumulate in place. Nothing ``k²``-times larger than
the inputs is materialised, unlike the im2col (unfold) formulation (:func:`local_attention_unfold`,
the reference and benchmark baseline; ``benchmarks/attentionlite_latency.py`` measures the two),
except on maps no larger than the window (``UNFOLD_RATIO``), where one im2col beats ``k²`` small kernels.
Being registered operators with flop formulas, they are counted by ``methods.flops.count_macs``:
``B·G·c·H·W·k²`` MACs each (border neighbours included: a dense kernel computes them).

Fused projection: ``qkv`` is one 1×1 convolution ``C_in → 2·C_out + C_v`` (W_Q, W_K, W_V stacked;
mathematically the three matrices of Eq. 1). Sparse momentum then treats it as one layer, and a
column of it (an input channel) is read by q, k and v together, which lets column pruning remove
the producing channel (``methods.attentionlite.shrink``). ``C_v`` is ``C_out`` except in a shrunk
model, where value channels nobody reads were removed (``v_index`` names the survivors).

Hook points:

=================  ==========================================================================
``hook_pattern``   attention probabilities ``(B, heads, H, W, k, k)``: ``[b, h, i, j, u, v]`` is
                   the weight of the key at ``(i + u - k//2, j + v - k//2)`` for the query
                   ``(i, j)``; 0 where that key lies outside the image. Local, not token-to-token.
``hook_q``         queries ``(B, C_out, H, W)`` (head ``h`` = channels ``h·d … (h+1)·d - 1``)
``hook_k``         keys ``(B, C_out, H, W)``
``hook_v``         values ``(B, C_v, H, W)``
=================  ==========================================================================
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import register_flop_formula

from methods.hooks import HookPoint

__all__ = ["LocalSelfAttention", "ColumnConv2d", "ColumnLinear", "neighbour_dot", "neighbour_mix", "neighbour_mask",
           "local_attention_unfold"]


# --------------------------------------------------------------------------------------------
# The two neighbourhood operators (offset loops; o = u·k + w is the neighbour at (u - k//2, w - k//2))
# --------------------------------------------------------------------------------------------


#: Maps with at most this many pixels per window pixel (H·W ≤ UNFOLD_RATIO · k²) use im2col (``F.unfold`` /
#: ``F.fold``) instead of offset loops: there the k² small per-offset kernels cost more than one copy.
#: Measured on the project's 2-core CPU (min of 7, one thread): 4×4 maps with k = 7 take 2.6 ms (im2col)
#: vs 4.4 ms (loop) forward at B = 1, C = 512; from 8×8 on, and for 28×28 with k = 3, the loop is
#: 2–3× faster than im2col forward and backward.
UNFOLD_RATIO = 1.0


def _unfolded(x: torch.Tensor, k: int) -> torch.Tensor:
    """``(B, G, c, H, W) -> (B, G, c, k², H, W)``: each pixel's k × k neighbours (zeros outside the image)."""
    B, G, c, H, W = x.shape
    return F.unfold(x.reshape(B, G * c, H, W), k, padding=k // 2).view(B, G, c, k * k, H, W)


def _small(x: torch.Tensor, k: int) -> bool:
    return x.shape[-2] * x.shape[-1] <= UNFOLD_RATIO * k * k


def _dot(q: torch.Tensor, x: torch.Tensor, k: int) -> torch.Tensor:
    """``out[b, g, o, i, j] = Σ_c q[b, g, c, i, j] · x[b, g, c, i + u - r, j + w - r]`` (0 outside the image)."""
    if _small(x, k):
        return (q.unsqueeze(3) * _unfolded(x, k)).sum(2)
    B, G, c, H, W = q.shape
    r = k // 2
    xp = F.pad(x.reshape(B, G * c, H, W), (r, r, r, r)).view(B, G, c, H + 2 * r, W + 2 * r)
    out = q.new_empty(k * k, B, G, H, W)
    for o in range(k * k):
        u, w = divmod(o, k)
        torch.linalg.vecdot(q, xp[..., u:u + H, w:w + W], dim=2, out=out[o])
    return out.permute(1, 2, 0, 3, 4).contiguous()  # (B, G, k², H, W)


def _mix(a: torch.Tensor, x: torch.Tensor, k: int) -> torch.Tensor:
    """``out[b, g, c, i, j] = Σ_o a[b, g, o, i, j] · x[b, g, c, i + u - r, j + w - r]``."""
    if _small(x, k):
        return (a.unsqueeze(2) * _unfolded(x, k)).sum(3)
    B, G, c, H, W = x.shape
    r = k // 2
    xp = F.pad(x.reshape(B, G * c, H, W), (r, r, r, r)).view(B, G, c, H + 2 * r, W + 2 * r)
    out = torch.zeros_like(x)
    for o in range(k * k):
        u, w = divmod(o, k)
        out.addcmul_(a[:, :, o].unsqueeze(2), xp[..., u:u + H, w:w + W])
    return out


def _scatter(a: torch.Tensor, x: torch.Tensor, k: int) -> torch.Tensor:
    """Adjoint of both operators in their second argument: ``a_o · x`` sent to the neighbour at offset o.

    ``out[b, g, c, i + u - r, j + w - r] += a[b, g, o, i, j] · x[b, g, c, i, j]`` (dropping what leaves the image).
    """
    B, G, c, H, W = x.shape
    r = k // 2
    if _small(x, k):
        cols = (a.unsqueeze(2) * x.unsqueeze(3)).reshape(B, G * c * k * k, H * W)  # (B, G·c·k², H·W)
        return F.fold(cols, (H, W), k, padding=r).view(B, G, c, H, W)  # fold = adjoint of unfold
    outp = x.new_zeros(B, G, c, H + 2 * r, W + 2 * r)
    for o in range(k * k):
        u, w = divmod(o, k)
        outp[..., u:u + H, w:w + W].addcmul_(a[:, :, o].unsqueeze(2), x)
    return outp[..., r:r + H, r:r + W].contiguous()


@torch.library.custom_op("attentionlite::neighbour_dot", mutates_args=())
def neighbour_dot(q: torch.Tensor, k: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """Products of each query ``(B, G, c, H, W)`` with its ``k × k`` neighbouring keys -> ``(B, G, k², H, W)``.

    Neighbours outside the image contribute 0 (mask them before a softmax).
    """
    return _dot(q, k, kernel_size)


@torch.library.custom_op("attentionlite::neighbour_mix", mutates_args=())
def neighbour_mix(a: torch.Tensor, v: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """Weighted sums of the ``k × k`` neighbouring values: ``a (B, G, k², H, W)``, ``v (B, G, c, H, W)`` -> same as v."""
    return _mix(a, v, kernel_size)


@neighbour_dot.register_fake
def _(q, k, kernel_size):
    B, G, _, H, W = q.shape
    return q.new_empty(B, G, kernel_size ** 2, H, W)


@neighbour_mix.register_fake
def _(a, v, kernel_size):
    return torch.empty_like(v)


def _dot_setup(ctx, inputs, output):
    q, k, ks = inputs
    ctx.save_for_backward(q, k)
    ctx.ks = ks


def _dot_backward(ctx, grad):
    q, k = ctx.saved_tensors
    grad = grad.contiguous()
    gq = _mix(grad, k, ctx.ks) if ctx.needs_input_grad[0] else None
    gk = _scatter(grad, q, ctx.ks) if ctx.needs_input_grad[1] else None
    return gq, gk, None


def _mix_backward(ctx, grad):
    a, v = ctx.saved_tensors
    grad = grad.contiguous()
    ga = _dot(grad, v, ctx.ks) if ctx.needs_input_grad[0] else None
    gv = _scatter(a, grad, ctx.ks) if ctx.needs_input_grad[1] else None
    return ga, gv, None


neighbour_dot.register_autograd(_dot_backward, setup_context=_dot_setup)
neighbour_mix.register_autograd(_mix_backward, setup_context=_dot_setup)


@register_flop_formula(torch.ops.attentionlite.neighbour_dot)
def _dot_flop(q_shape, k_shape, kernel_size, *args, out_shape=None, **kwargs) -> int:
    return 2 * math.prod(q_shape) * kernel_size ** 2  # FLOPs = 2 · MACs


@register_flop_formula(torch.ops.attentionlite.neighbour_mix)
def _mix_flop(a_shape, v_shape, kernel_size, *args, out_shape=None, **kwargs) -> int:
    return 2 * math.prod(v_shape) * kernel_size ** 2


_MASKS: dict[tuple, torch.Tensor] = {}


def neighbour_mask(height: int, width: int, kernel_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(k², H, W)`` bool: True where the neighbour at offset ``o = u·k + w`` of pixel ``(i, j)`` is inside the image."""
    key = (height, width, kernel_size, str(device))
    if key not in _MASKS:
        ones = torch.ones(1, 1, height, width, device=device)
        _MASKS[key] = F.unfold(ones, kernel_size, padding=kernel_size // 2).view(kernel_size ** 2, height, width) > 0.5
    return _MASKS[key]


# --------------------------------------------------------------------------------------------
# Column-pruned layers (deploy form of column pruning, AttentionLite §3)
# --------------------------------------------------------------------------------------------


class ColumnConv2d(nn.Module):
    """A column-pruned convolution: only the kept columns ``(c, k_h, k_w)`` of ``W ∈ R^{C_out × C_in·k·k}``.

    AttentionLite §3 (column pruning): the weight viewed as ``C_out`` rows × ``C_in·k·k`` columns
    keeps ``n`` columns, listed (flat index ``c·k·k + k_h·k + k_w``) in the buffer ``index``.
    A 1×1 layer gathers its kept input channels and runs a smaller matmul; a k×k layer gathers the
    kept rows of the im2col matrix. Equal to the dense convolution whose other columns are zero.

    Args:
        in_channels, out_channels, kernel_size, stride, padding: as ``nn.Conv2d``.
        n_kept: number of kept columns (``≤ in_channels·k²``).
        bias: a bias per output channel.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, n_kept: int, stride: int = 1,
                 padding: int = 0, bias: bool = False):
        super().__init__()
        if not 0 <= n_kept <= in_channels * kernel_size ** 2:
            raise ValueError(f"n_kept={n_kept} is outside [0, {in_channels * kernel_size ** 2}]")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.weight = nn.Parameter(torch.zeros(out_channels, n_kept))  # (C_out, n) kept columns
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.register_buffer("index", torch.arange(n_kept, dtype=torch.long))  # kept flat column ids

    @property
    def n_kept(self) -> int:
        return self.weight.shape[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, _, H, W = x.shape
        k, s, p = self.kernel_size, self.stride, self.padding
        Ho, Wo = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1
        if k == 1:
            xs = x[:, :, ::s, ::s] if s > 1 else x
            cols = xs.index_select(1, self.index).flatten(2)  # (B, n, Ho·Wo)
        else:
            cols = F.unfold(x, k, padding=p, stride=s).index_select(1, self.index)  # (B, n, Ho·Wo)
        out = torch.matmul(self.weight, cols).view(B, self.out_channels, Ho, Wo)
        return out if self.bias is None else out + self.bias.view(1, -1, 1, 1)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, kept_columns={self.n_kept}/{self.in_channels * self.kernel_size ** 2}")


class ColumnLinear(nn.Module):
    """A column-pruned ``nn.Linear``: reads only the input features listed in the buffer ``index``."""

    def __init__(self, in_features: int, out_features: int, n_kept: int, bias: bool = True):
        super().__init__()
        if not 0 <= n_kept <= in_features:
            raise ValueError(f"n_kept={n_kept} is outside [0, {in_features}]")
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.zeros(out_features, n_kept))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.register_buffer("index", torch.arange(n_kept, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.index_select(-1, self.index), self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, kept_columns={self.weight.shape[1]}/{self.in_features}"


# --------------------------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------------------------


class LocalSelfAttention(nn.Module):
    """Multi-head local self-attention over ``k × k`` neighbourhoods with relative positions (Eq. 1).

    Args:
        in_channels: ``C_in``.
        out_channels: ``C_out`` (query/key width, and value width of the dense layer).
        kernel_size: spatial extent ``k`` (odd).
        num_heads: ``N``; must divide ``C_out``, and each head needs ≥ 2 channels (row + column embedding).
        v_channels: number of value channels kept (deploy form only; default ``C_out``).
        in_kept: number of input channels the projection reads (deploy form: a column-pruned
            projection, :class:`ColumnConv2d`); default all, a plain ``nn.Conv2d``.

    Shapes: ``(B, C_in, H, W) -> (B, C_v, H, W)``; stride 1 (downsampling is an average pool after
    the layer, as in Ramachandran et al.).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 7, num_heads: int = 8,
                 v_channels: int | None = None, in_kept: int | None = None):
        super().__init__()
        if kernel_size % 2 != 1 or kernel_size < 1:
            raise ValueError(f"kernel_size must be odd and positive, got {kernel_size}")
        if num_heads < 1 or out_channels % num_heads or out_channels // num_heads < 2:
            raise ValueError(f"out_channels={out_channels} must split into num_heads={num_heads} heads of ≥ 2 channels")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.num_heads = kernel_size, num_heads
        self.head_dim = out_channels // num_heads
        self.v_channels = out_channels if v_channels is None else v_channels
        proj_out = 2 * out_channels + self.v_channels
        if in_kept is None:
            self.qkv = nn.Conv2d(in_channels, proj_out, 1, bias=False)  # W_Q, W_K, W_V stacked
        else:
            self.qkv = ColumnConv2d(in_channels, proj_out, 1, in_kept)
        d_row = self.head_dim // 2
        # rel_row[h, :, u] embeds row offset u - k//2, rel_col[h, :, w] column offset w - k//2 (Ramachandran §3.1)
        self.rel_row = nn.Parameter(torch.randn(num_heads, d_row, kernel_size) / math.sqrt(d_row))
        self.rel_col = nn.Parameter(torch.randn(num_heads, self.head_dim - d_row, kernel_size) / math.sqrt(self.head_dim - d_row))
        # value channel c of this layer is value channel v_index[c] of the dense layer (head v_index[c] // d)
        self.register_buffer("v_index", torch.arange(self.v_channels, dtype=torch.long))
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_pattern = HookPoint()

    def extra_repr(self) -> str:
        v = "" if self.v_channels == self.out_channels else f", v_channels={self.v_channels}"
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, num_heads={self.num_heads}{v}"

    def logits(self, q: torch.Tensor, kmap: torch.Tensor) -> torch.Tensor:
        """Eq. 1's logits ``(B, h, k², H, W)`` from queries and keys ``(B, C_out, H, W)``; −∞ outside the image."""
        B, _, H, W = q.shape
        h, d, k = self.num_heads, self.head_dim, self.kernel_size
        qh = q.reshape(B, h, d, H, W)
        content = neighbour_dot(qh, kmap.reshape(B, h, d, H, W), k)  # q_ijᵀ k_ab, (B, h, k², H, W)
        # position part q_rowᵀ r_row[u] + q_colᵀ r_col[w], broadcast to (B, h, k, k, H, W)
        pr = torch.einsum("bhdyx,hdu->bhuyx", qh[:, :, : d // 2], self.rel_row)
        pc = torch.einsum("bhdyx,hdw->bhwyx", qh[:, :, d // 2:], self.rel_col)
        pos = (pr.unsqueeze(3) + pc.unsqueeze(2)).reshape(B, h, k * k, H, W)
        logits = content * d ** -0.5 + pos * d ** -0.25
        return logits.masked_fill(~neighbour_mask(H, W, k, q.device), float("-inf"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, _, H, W = x.shape
        C, Cv, h, d, k = self.out_channels, self.v_channels, self.num_heads, self.head_dim, self.kernel_size
        q, kmap, v = self.qkv(x).split([C, C, Cv], dim=1)
        q, kmap, v = self.hook_q(q), self.hook_k(kmap), self.hook_v(v)
        attn = self.logits(q, kmap).softmax(dim=2)  # (B, h, k², H, W)
        # hook layout (B, h, H, W, k, k); the model multiplies whatever the hook returns into v
        attn = self.hook_pattern(attn.permute(0, 1, 3, 4, 2).reshape(B, h, H, W, k, k))
        attn = attn.reshape(B, h, H, W, k * k).permute(0, 1, 4, 2, 3).contiguous()  # (B, h, k², H, W)
        if Cv == C:
            out = neighbour_mix(attn, v.reshape(B, h, d, H, W), k)  # (B, h, d, H, W)
        else:  # shrunk: value channel c is channel v_index[c] of the dense layer (head v_index[c] // d)
            # mixed at full head width with zeros for the removed channels: one operator call instead of one per
            # head (measured faster at batch 1; the a·v MACs are the dense layer's, ~3 % of SA-ResNet26's)
            full = v.new_zeros(B, C, H, W).index_copy(1, self.v_index, v)
            out = neighbour_mix(attn, full.reshape(B, h, d, H, W), k).reshape(B, C, H, W).index_select(1, self.v_index)
        return out.reshape(B, Cv, H, W)


def local_attention_unfold(x: torch.Tensor, layer: LocalSelfAttention) -> torch.Tensor:
    """A naive reference of ``layer(x)``: keys and values unfolded per pixel, the position table materialised.

    What most published local-attention code does (im2col of keys and values, a ``(d, k, k)``
    relative embedding multiplied with every query); the latency benchmark's baseline. Dense layers only.
    """
    if layer.v_channels != layer.out_channels or not isinstance(layer.qkv, nn.Conv2d):
        raise ValueError("the reference handles dense layers (all value channels, a plain qkv convolution) only")
    B, _, H, W = x.shape
    C, h, d, k = layer.out_channels, layer.num_heads, layer.head_dim, layer.kernel_size
    q, kmap, v = layer.qkv(x).split([C, C, C], dim=1)
    ku = F.unfold(kmap, k, padding=k // 2).view(B, h, d, k, k, H * W)
    vu = F.unfold(v, k, padding=k // 2).view(B, h, d, k * k, H * W)
    rel = torch.cat([layer.rel_row.unsqueeze(3).expand(h, d // 2, k, k),
                     layer.rel_col.unsqueeze(2).expand(h, d - d // 2, k, k)], dim=1)  # (h, d, k, k): r_{u,w}
    qf = q.reshape(B, h, d, 1, 1, H * W)
    logits = (qf * ku).sum(2) * d ** -0.5 + (qf * rel.view(1, h, d, k, k, 1)).sum(2) * d ** -0.25  # (B, h, k, k, HW)
    valid = neighbour_mask(H, W, k, x.device).view(1, 1, k, k, H * W)
    attn = logits.masked_fill(~valid, float("-inf")).reshape(B, h, k * k, H * W).softmax(2)
    return (attn.unsqueeze(2) * vu).sum(3).reshape(B, C, H, W)
