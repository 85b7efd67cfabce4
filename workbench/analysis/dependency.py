"""Token-to-token dependency by gradient saliency (FAR §4.3 "Token-level Representation
Consistency", Fig. 5–6, App. C).

Paper: Ren et al., "Is Attention Required for Transformer Inference? Explore Function-preserving
Attention Replacement". FAR has no attention weights, so the paper measures how much each output
token of a block depends on each input token with input–output gradients. For a function
f: x ∈ R^{B×T×D} → y ∈ R^{B×T×N×C} giving per-head outputs of one block, we define

    dependency[b, h, q, k] = ‖ ∂(Σ_c y[b, q, h, c]) / ∂x[b, k, :] ‖₂

(output token q = ``query``, input token k = ``key``, as in DESIGN.md) — one vector–Jacobian
product per (head, query). Samples are independent in eval mode, so one VJP serves the whole
batch.

Which input: x is the block's *residual-stream input* x_l, so the dependency includes the
block's ``norm1`` (and, for FAR, the substitute's own LayerNorm and input projection). Which
output: per-head outputs before the output projection — for a teacher ``Attention`` the
per-head ``softmax(qkᵀ)·v`` (times the gate if the model has one), for FAR the per-head BiLSTM
outputs H_n (:meth:`methods.far.MultiHeadBiLSTM.forward_heads`).

Three implementations of the same quantity, for cross-checking and benchmarking:

- :func:`dependency` — batched: ``torch.func.vjp`` once per head, ``torch.func.vmap`` over the T
  query cotangents (chunked), oneDNN off so ``nn.LSTM``'s backward is vmappable;
- :func:`dependency_loop` — one forward, then one ``autograd.grad`` per (head, query), the
  per-output-token loop of the FAR authors' analysis;
- :func:`dependency_captum` — ``captum.attr.Saliency`` on a wrapper selecting one (head, query).

Speed (benchmarks/token_dependency.py, DeiT-Tiny-sized block, T = 197, B = 2, one CPU thread,
float32): the batched form is 1.2–2x faster than a loop whose backward runs through all heads
and ~6x faster than a loop on the same (non-oneDNN) LSTM kernels, but a per-head loop using
oneDNN's fused LSTM backward is ~1.5–2x faster than it on a CPU; :func:`model_dependency` picks
per device ("auto").
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Literal, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from methods.far import MultiHeadBiLSTM, embed_tokens

#: ``fn(x, heads) -> (B, T, len(heads), C)``; ``heads=None`` means all heads.
HeadOutputs = Callable[[torch.Tensor, Optional[Sequence[int]]], torch.Tensor]


@dataclass(frozen=True)
class HeadFn:
    """Per-head outputs of one block as a function of the block input.

    Calling ``f(x)`` gives ``(B, T, N, C)``; ``f(x, [h])`` computes head h only (``(B, T, 1, C)``),
    which is what the dependency functions use so that a VJP never runs through other heads.
    """

    fn: HeadOutputs  # (x (B, T, D), heads) -> (B, T, n, C)
    num_heads: int  # N

    def __call__(self, x: torch.Tensor, heads: Optional[Sequence[int]] = None) -> torch.Tensor:
        return self.fn(x, heads)


def _attention_heads(block: nn.Module, x: torch.Tensor, heads: Optional[Sequence[int]]) -> torch.Tensor:
    """Per-head ``softmax(q kᵀ · scale) v`` of a timm ``Block``/``Attention``: ``(B, T, n, D_h)``."""
    attn = block.attn
    xn = block.norm1(x)  # (B, T, D)
    b, t, _ = xn.shape
    idx = list(range(attn.num_heads)) if heads is None else list(heads)
    nh, dh = attn.num_heads, attn.head_dim
    # qkv.weight rows are (3, N, D_h)-ordered; keep the selected heads' rows only
    rows = torch.arange(3 * nh * dh, device=xn.device).view(3, nh, dh)[:, idx].reshape(-1)
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


def head_output_fn(block: nn.Module) -> HeadFn:
    """Per-head outputs of a timm ViT ``Block`` (teacher ``Attention`` or FAR substitute).

    Args:
        block: ``timm.models.vision_transformer.Block``; its ``.attn`` is a timm ``Attention`` or
            a :class:`methods.far.MultiHeadBiLSTM`. Put it in eval mode yourself.

    Returns:
        A :class:`HeadFn` mapping the block input x_l ``(B, T, D)`` to ``(B, T, N, C)``:
        C = D_h for attention (``attn @ v``), 2·U for FAR (forward then reverse units).

    Raises:
        TypeError: ``block.attn`` is neither.
    """
    attn = getattr(block, "attn", None)
    if isinstance(attn, MultiHeadBiLSTM):
        return HeadFn(lambda x, heads=None: attn.forward_heads(block.norm1(x), heads), attn.num_heads)
    if attn is not None and all(hasattr(attn, a) for a in ("qkv", "num_heads", "head_dim", "scale")):
        return HeadFn(lambda x, heads=None: _attention_heads(block, x, heads), attn.num_heads)
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
    """Queries per vmapped VJP so that the largest batched gradient, about
    ``chunk · B · T · max(D, T)`` elements (input grads, or attention-score grads), fits ``budget_bytes``."""
    b, t, d = x.shape
    per_query = b * t * max(d, t) * x.element_size()
    return max(1, min(t, budget_bytes // per_query))


def _query_list(queries: Optional[Sequence[int]], t: int) -> list[int]:
    return list(range(t)) if queries is None else [int(q) for q in queries]


def dependency(
    fn: Callable, x: torch.Tensor, queries: Optional[Sequence[int]] = None, chunk_size: Optional[int] = None
) -> torch.Tensor:
    """Batched gradient-saliency dependency, ``(B, N, Q, T)`` = (sample, head, query, key).

    For each head: one ``torch.func.vjp`` of the single-head function, then ``vmap`` of the VJP
    over the query cotangents, ``chunk_size`` queries at a time (default
    :func:`auto_chunk_size`: all 197 queries of a DeiT at 224², ~100 at 384²). oneDNN is switched
    off inside, because its LSTM backward has no vmap rule.

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


@torch.no_grad()
def block_inputs(model: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    """The residual-stream input x_l ``(B, T, D)`` of every block of a timm ViT (teacher or FAR).

    Prefix tokens (cls, dist) included, in timm's order ``[prefix…, patches…]``.
    """
    x = embed_tokens(model, images)
    inputs = []
    for blk in model.blocks:
        inputs.append(x)
        x = blk(x)
    return inputs


def model_dependency(
    model: nn.Module,
    images: torch.Tensor,
    layers: Optional[Sequence[int]] = None,
    queries: Optional[Sequence[int]] = None,
    method: Literal["auto", "batched", "loop"] = "auto",
    chunk_size: Optional[int] = None,
) -> torch.Tensor:
    """Dependency of every (or the given) block of ``model``, in eval mode.

    Args:
        model: a timm ViT or FAR model.
        images: ``(B, C, H, W)``.
        layers: block indices (default all).
        queries: output tokens (default all).
        method: "batched" (:func:`dependency`), "loop" (:func:`dependency_loop`, per head) or
            "auto": "loop" for float32 on a CPU, else "batched". On a 1–2 thread CPU in float32
            the per-head loop is faster (oneDNN's fused LSTM backward, a cache-resident attention
            backward; benchmarks/token_dependency.py); "batched" wins where both run the same
            kernels (float64: ~4x) and is the one meant for GPUs.
        chunk_size: queries per vmapped VJP for "batched".

    Returns:
        ``(len(layers), B, N, Q, T)`` = (layer, sample, head, query, key).
    """
    was_training = model.training
    model.eval()
    try:
        inputs = block_inputs(model, images)
        layers = range(len(inputs)) if layers is None else layers
        if method == "auto":
            method = "loop" if images.device.type == "cpu" and images.dtype == torch.float32 else "batched"
        if method == "batched":
            maps = [dependency(head_output_fn(model.blocks[i]), inputs[i], queries, chunk_size) for i in layers]
        elif method == "loop":
            maps = [dependency_loop(head_output_fn(model.blocks[i]), inputs[i], queries) for i in layers]
        else:
            raise ValueError(f"method must be 'batched' or 'loop', got {method!r}")
        return torch.stack(maps)
    finally:
        model.train(was_training)
