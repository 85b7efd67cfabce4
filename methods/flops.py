"""One MAC counter for every method: ``torch.utils.flop_counter.FlopCounterMode`` plus the formulas it lacks.

``FlopCounterMode`` counts at the dispatcher (no tracing; per-module breakdown) but knows only some
of the kernels a model may run. Which kernel runs depends on the torch build, the device and the
inputs, so a counter that relies on torch's own table silently loses work on some machines:
torch 2.14's table has no entry for ``aten._scaled_dot_product_flash_attention_for_cpu`` (the kernel
timm's fused attention takes on a CPU), which drops QKᵀ and AV from every ViT count. Here every
scaled-dot-product-attention kernel gets one formula that depends only on the shapes:

    MACs(SDPA) = B · H_q · L_q · L_k · (E + E_v)        (QKᵀ: E per score, AV: E_v per score)

for query ``(B, H_q, L_q, E)``, key ``(B, H_k, L_k, E)``, value ``(B, H_k, L_k, E_v)``. It holds for
grouped-query attention (``H_k`` divides ``H_q``: every query head still scores every key) and with
any mask (masks select, they do not skip work in a dense kernel); the backward kernels count twice
the forward (dQ, dK, dV, dP: four matmuls of the forward's size). The LSTM kernels (CPU oneDNN
``mkldnn_rnn_layer``, cuDNN ``_cudnn_rnn``) are counted as their gate matmuls, T·4H·(D_in + H).
Sparse kernels (Sparsifiner's sparse path): a sparse × dense ``mm`` counts one MAC per stored entry
per output column (torch's formula reads shapes only and would count it as dense), and the sampled
matmul ``sparse_sampled_addmm`` counts nnz · inner width.

Convention: **MACs** (multiply-accumulates) = FlopCounterMode FLOPs / 2, per forward call. The
papers' "FLOPs" are MACs in this sense (fvcore's convention). Elementwise work (LayerNorm, softmax,
GELU, residual adds, biases) is not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["MacCount", "count_macs", "sdpa_macs", "flop_formulas", "SDPA_OPS"]


def sdpa_macs(query_shape: Sequence[int], key_shape: Sequence[int], value_shape: Sequence[int]) -> int:
    """MACs of one dense scaled-dot-product attention: ``B·H_q·L_q·L_k·(E + E_v)`` (module docstring).

    Shapes are ``(..., L, E)`` with any leading batch/head dims; the query's leading dims count.
    """
    *lead, lq, e = query_shape
    lk, ev = key_shape[-2], value_shape[-1]
    if key_shape[-1] != e:
        raise ValueError(f"query and key widths differ: {tuple(query_shape)} vs {tuple(key_shape)}")
    return math.prod(lead) * lq * lk * (e + ev)


def _forward_flop(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return 2 * sdpa_macs(query, key, value)


def _backward_flop(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return 4 * sdpa_macs(query, key, value)  # dP = dO Vᵀ, dV = Pᵀ dO, dQ = dS K, dK = dSᵀ Q


def _rnn_flop(inp_shape, weights) -> int:
    """2 · tokens · Σ rows·cols over the 2-D weights (W_ih, W_hh) of one RNN layer call."""
    tokens = math.prod(inp_shape[:-1])
    return 2 * tokens * sum(w[0] * w[1] for w in weights if w is not None and len(w) == 2)


def _mkldnn_rnn_layer_flop(inp, w0, w1, *args, out_shape=None, **kwargs) -> int:
    return _rnn_flop(inp, [w0, w1])


def _cudnn_rnn_flop(inp, weight, *args, out_shape=None, **kwargs) -> int:
    return _rnn_flop(inp, list(weight))


#: Every scaled-dot-product-attention kernel in (B, H, L, E) layout, forward and backward, that this
#: torch build has; the formulas above replace torch's own where both exist (torch's assume H_q == H_k).
SDPA_OPS: dict[str, str] = {
    "_scaled_dot_product_flash_attention": "forward",
    "_scaled_dot_product_flash_attention_for_cpu": "forward",
    "_scaled_dot_product_efficient_attention": "forward",
    "_scaled_dot_product_cudnn_attention": "forward",
    "_scaled_dot_product_fused_attention_overrideable": "forward",
    "_scaled_dot_product_attention_math_for_mps": "forward",
    "_scaled_dot_product_flash_attention_backward": "backward",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "backward",
    "_scaled_dot_product_efficient_attention_backward": "backward",
    "_scaled_dot_product_cudnn_attention_backward": "backward",
    "_scaled_dot_product_fused_attention_overrideable_backward": "backward",
}


def _sparse_aware_mm_flop(a, b, *args, out_val=None, **kwargs) -> int:
    """``aten.mm`` where either operand may be sparse (CSR / COO): one MAC per stored entry per column.

    torch's own formula reads only shapes, so a sparse × dense product is counted as dense.
    """
    if a.layout != torch.strided:
        return 2 * a._nnz() * b.shape[-1]
    if b.layout != torch.strided:
        return 2 * b._nnz() * a.shape[0]
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


def _sampled_addmm_flop(inp, mat1, mat2, *args, out_val=None, **kwargs) -> int:
    """``aten.sparse_sampled_addmm`` (SDDMM): (mat1 @ mat2) only at the stored entries of ``inp``."""
    return 2 * inp._nnz() * mat1.shape[-1]


_sparse_aware_mm_flop._get_raw = True  # FlopCounterMode passes tensors, not shapes, to formulas marked so
_sampled_addmm_flop._get_raw = True


def flop_formulas() -> dict[Any, Any]:
    """``custom_mapping`` for ``FlopCounterMode``: the SDPA, LSTM and sparse-matmul kernels of this build."""
    out: dict[Any, Any] = {torch.ops.aten.mm: _sparse_aware_mm_flop}
    op = getattr(torch.ops.aten, "sparse_sampled_addmm", None)
    if op is not None:
        out[op] = _sampled_addmm_flop
    for name, kind in SDPA_OPS.items():
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            out[op] = _forward_flop if kind == "forward" else _backward_flop
    for name, fn in (("mkldnn_rnn_layer", _mkldnn_rnn_layer_flop), ("_cudnn_rnn", _cudnn_rnn_flop)):
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            out[op] = fn
    return out


@dataclass(frozen=True)
class MacCount:
    """What :func:`count_macs` measured for one forward call.

    Attributes:
        total: MACs of the whole call.
        by_module: module path (``""`` for the root, ``"blocks.0.attn"``...) -> MACs inside that
            module, sub-modules included (so ``by_module[""] == total``).
        by_op: aten op name -> MACs.
    """

    total: int
    by_module: dict[str, int] = field(default_factory=dict)
    by_op: dict[str, int] = field(default_factory=dict)

    def within(self, prefix: str) -> int:
        """MACs inside the module at ``prefix`` (0 if it ran nothing)."""
        return self.by_module.get(prefix, 0)


@torch.no_grad()
def count_macs(model: nn.Module, *inputs: Any, **kwargs: Any) -> MacCount:
    """MACs of ``model(*inputs, **kwargs)`` in eval mode, whichever kernels run (module docstring).

    The model's mode is restored afterwards. Divide by the batch size for per-image counts.
    """
    was_training = model.training
    model.eval()
    try:
        with FlopCounterMode(display=False, custom_mapping=flop_formulas()) as counter:
            model(*inputs, **kwargs)
    finally:
        model.train(was_training)
    counts = counter.get_flop_counts()
    root = type(model).__name__  # FlopCounterMode names modules "<RootClass>.<path>"
    by_module: dict[str, int] = {}
    for key, ops in counts.items():
        if key == root or key.startswith(root + "."):
            by_module[key[len(root) + 1:]] = sum(ops.values()) // 2
    by_op = {str(op).removeprefix("aten."): n // 2 for op, n in counts.get("Global", {}).items()}
    return MacCount(sum(counts.get("Global", {}).values()) // 2, by_module, by_op)
