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

Speed (benchmarks/token_dependency.py, DeiT-Tiny-sized block, T = 197, B = 2, one CPU thread,
float32): factored is ~50x faster than the per-(head, query) loop for attention and ~6x for FAR
(whose LSTM adjoints are FLOP-bound); the vmap form is 0.3–0.5x of the loop, captum 0.2–0.9x.
:func:`model_dependency` uses the factored form whenever the block allows it.
"""

from __future__ import annotations

import warnings
from typing import Callable, Literal, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import xarray as xr
from einops import rearrange

from methods.far import check_vit, embed_tokens
from workbench.analysis import register
from workbench.analysis.head_fns import HeadFn, head_output_fn
from workbench.analysis.tokens import vit_token_layout
from workbench.provenance import config_json

__all__ = ["HeadFn", "head_output_fn", "dependency_factored", "dependency", "dependency_loop", "dependency_captum",
           "block_inputs", "model_dependency", "extract_dependency", "token_jacobians", "auto_chunk_size"]

Method = Literal["auto", "factored", "batched", "loop"]


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
            jac = fn.jacobian(x, h) if fn.jacobian is not None else None
            if jac is None:
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
    targets: torch.Tensor | None = None,
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
