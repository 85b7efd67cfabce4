"""Token-to-token dependency by gradient saliency (FAR §4.3 "Token-level Representation
Consistency", Fig. 5–6, App. C), and the ``dependency`` extractor.

Paper: Ren et al., "Is Attention Required for Transformer Inference? Explore Function-preserving
Attention Replacement". FAR has no attention weights, so the paper measures how much each output
token of a block depends on each input token with input–output gradients. For the per-head
outputs y ∈ R^{B×T×N×C} of one block as a function of an input u ∈ R^{B×T×·} we define

    dependency[b, h, q, k] = ‖ ∂(Σ_c y[b, q, h, c]) / ∂u[b, k, :] ‖_p        (p = 2, or 1: ``norm``)

(output token q = ``query``, input token k = ``key``, as in DESIGN.md). Samples are independent
in eval mode, so one backward serves the whole batch. Output: per-head outputs before the output
projection — for a teacher ``Attention`` the per-head ``softmax(qkᵀ)·v`` (times the gate if the
model has one), for FAR the per-head BiLSTM outputs H_n (:meth:`methods.far.MultiHeadBiLSTM.forward_heads`),
so a teacher's saliency and FAR's line up, and a teacher's attention probabilities too (same dims;
see :mod:`workbench.analysis.token_maps`).

Which input (``wrt``; hook names of :mod:`methods.hooks`):

- ``"mixer_input"`` (default) — u = LN1(x_l), the input of the token mixer (``blocks.{i}.hook_mixer_in``).
  This measures token mixing: for attention ∂y_q/∂u_k is the attention weight P_qk times W_v (plus
  the softmax's dependence on k), so the teacher's saliency follows its attention: on the demo ViT
  (8 analysis images) the rank correlation of its head-averaged, row-normalised saliency with its own
  attention is 0.94 in the first block and 0.88–0.94 in all six (docs/far-demo-budgets.md). FAR's own
  LayerNorm (§3.2) sits inside its token mixer, so FAR's columns still carry that LayerNorm's 1/σ_k.
- ``"residual"`` — u = x_l, the block's residual-stream input (``blocks.{i}.hook_resid_pre``): the
  gradient passes through LN1 (and FAR's own LayerNorm), whose Jacobian at token k is scaled by
  1/σ_k. On MNIST the blank patches have σ ≈ 0.04 and the strokes σ ≈ 1 in the first block, so
  their columns differ 25x for LayerNorm's sake alone, and the map mostly shows LayerNorm (the
  teacher's saliency then has rank correlation 0.29 with its own attention in the first block,
  0.35 in the second). This was our default before; kept for comparison.
- ``"lstm_input"`` (FAR only) — u = the LSTM inputs I = Proj_in(LN(LN1(x_l))) (``blocks.{i}.attn.hook_lstm_in``);
  head n's outputs depend only on its slice I_n. With ``norm="l1"`` this is the FAR authors' own
  form: their released visualisation script (``get_gradiants``) back-propagates Σ of an output
  token of the substitute from a forward hook on the LSTM and takes ``grad.abs().sum(-1)`` of the
  LSTM input, per query token. Ours differs where theirs is an artefact: their input ``.grad`` is
  never reset between query tokens, so row q holds |Σ_{q' ≤ q} ∂s_{q'}/∂I|₁ (the "cumulative"
  back-propagation of App. C), their model is in train mode (drop-path active), the output is the
  projected output summed over all heads rather than one head's H_n, and both axes are flipped;
  we compute every (head, query) row on its own, in eval mode.

Implementations of the same quantity:

- :func:`dependency_factored` (default) — the Jacobian of a head factors into a per-token part
  φ: u_k → z_k (norms and projections; z = I_n for FAR, the attention input for attention) and
  the token mixer M: z → y. ``∂y_q/∂u_k = (∂y_q/∂z_k)·J_k`` with J_k = ∂z_k/∂u_k. The mixer's input
  gradients for all queries come in one batch — for FAR from the LSTM's reverse-mode recurrence
  run for every query at once and truncated by causality (:func:`methods.far.lstm_sum_adjoint`),
  for attention in closed form or from ``torch.func.vmap`` over queries — and J_k in closed form
  or from ``vmap(jacrev(φ))`` over tokens; the L2 norm over the input is then
  ``√(δzᵀ (J_k J_kᵀ) δz)`` when z is narrower than u (FAR: D_h < D), else ``‖J_kᵀ δz‖``; whole
  attention rows have a closed form (L2 only); where φ selects coordinates (attention w.r.t.
  ``mixer_input``, FAR w.r.t. ``lstm_input``) the norm is the norm of δz. The L1 norm has no Gram
  form: it materialises J_kᵀ δz, per chunk of queries;
- :func:`dependency` — ``torch.func.vjp`` once per head, ``vmap`` over the T query cotangents
  (oneDNN off, because its LSTM backward has no vmap rule);
- :func:`dependency_loop` — one forward, then one ``autograd.grad`` per (head, query), the
  per-output-token loop of the FAR authors' analysis;
- :func:`dependency_captum` — ``captum.attr.Saliency`` on a wrapper selecting one (head, query).

Every ``wrt`` has the factored path (none falls back). tests/test_dependency.py checks each
against ``torch.autograd.functional.jacobian`` and against a per-(head, query) autograd loop on
the real model's hook points.

Speed (benchmarks/token_dependency.py, DeiT-Tiny-sized block, T = 197, B = 2, one CPU thread,
float32, ``wrt="residual"``): factored is ~50x faster than the per-(head, query) loop for attention
and ~6x for FAR (whose LSTM adjoints are FLOP-bound); the vmap form is 0.3–0.5x of the loop,
captum 0.2–0.9x. :func:`model_dependency` uses the factored form whenever the block allows it.

On a GPU every form runs with cuDNN off (:func:`methods.devices.differentiable`): the modules are in eval mode and
cuDNN refuses an LSTM backward outside training mode (attention blocks use no cuDNN kernel, so they lose nothing).
"""

from __future__ import annotations

import warnings
from typing import Callable, Literal, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import xarray as xr
from einops import rearrange

from methods.devices import differentiable
from methods.far import check_vit
from methods.hooks import run_with_cache
from workbench.analysis import Example, ExploreKind, ExtractorOption, examples, register
from workbench.analysis.head_fns import WRT, HeadFn, Wrt, head_output_fn, is_far_substitute
from workbench.analysis.tokens import vit_token_layout
from workbench.provenance import config_json

__all__ = ["HeadFn", "Wrt", "WRT", "Norm", "head_output_fn", "dependency_factored", "dependency", "dependency_loop", "dependency_captum",
           "block_inputs", "model_dependency", "extract_dependency", "token_jacobians", "auto_chunk_size"]

Method = Literal["auto", "factored", "batched", "loop"]
#: Norm over the input features of one key token's gradient.
Norm = Literal["l2", "l1"]

#: hook name (methods.hooks) of each ``wrt`` input, below ``blocks.{i}``
_WRT_HOOKS = {"residual": "hook_resid_pre", "mixer_input": "hook_mixer_in", "lstm_input": "attn.hook_lstm_in"}


def _vec_norm(g: torch.Tensor, norm: Norm) -> torch.Tensor:
    """‖g‖ over the last dim: L2 or L1."""
    return g.norm(dim=-1) if norm == "l2" else g.abs().sum(-1)


def _check_norm(norm: str) -> None:
    if norm not in ("l2", "l1"):
        raise ValueError(f"norm must be 'l2' or 'l1', got {norm!r}")


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
@differentiable()  # cuDNN off: an eval-mode LSTM cannot be differentiated with it (methods.devices)
def dependency_factored(
    fn: HeadFn, x: torch.Tensor, queries: Optional[Sequence[int]] = None, chunk_size: Optional[int] = None,
    norm: Norm = "l2",
) -> torch.Tensor:
    """Dependency from the factored Jacobian (module docstring), ``(B, N, Q, T)``.

    Args:
        fn: a factored :class:`HeadFn` (from :func:`head_output_fn`), modules in eval mode.
        x: the input ``fn`` takes (``fn.wrt``), ``(B, T, ·)``.
        queries: output tokens (default all T).
        chunk_size: queries per batch of mixer gradients (default :func:`auto_chunk_size`).
        norm: ``"l2"`` or ``"l1"`` over the input features.
    """
    if not fn.factored:
        raise ValueError("dependency_factored needs a HeadFn with local and mixer_vjp (see head_output_fn)")
    _check_norm(norm)
    x = x.detach()
    b, t, d = x.shape
    qs = sorted(_query_list(queries, t))
    order = torch.as_tensor([qs.index(q) for q in _query_list(queries, t)])  # back to the caller's order
    chunk_size = chunk_size or auto_chunk_size(x)
    out = []
    for h in range(fn.num_heads):
        direct = fn.rows(x, h, qs) if fn.rows is not None and norm == "l2" else None  # closed form, where there is one
        if direct is not None:
            out.append(direct[:, order])
            continue
        with torch.enable_grad():
            z, local_vjp = torch.func.vjp(lambda v: fn.local(v, h), x)  # z: (B, T, Z)
        jac = gram = None
        if not fn.selects and z.shape[-1] < d:  # narrow z (FAR: D_h < D): per-token Jacobians
            jac = fn.jacobian(x, h) if fn.jacobian is not None else None
            if jac is None:
                with torch.enable_grad():
                    jac = token_jacobians(lambda v: fn.local(v, h), x)  # (B, T, Z, D)
            if norm == "l2":
                gram = jac @ jac.transpose(-1, -2)  # (B, T, Z, Z): J_k J_kᵀ
        rows = []
        for start in range(0, len(qs), chunk_size):
            chunk = qs[start:start + chunk_size]
            with torch.enable_grad():
                dz = fn.mixer_vjp(z, h, chunk)  # (Q, B, T, Z)
            if fn.selects:  # the input gradient is δz itself, placed among zeros
                rows.append(_vec_norm(dz, norm))
            elif gram is not None:  # ‖J_kᵀ δz‖² = δzᵀ (J_k J_kᵀ) δz
                sq = torch.einsum("qbkz,bkzy,qbky->qbk", dz, gram, dz)
                rows.append(sq.clamp_min(0).sqrt())
            elif jac is not None:  # L1: J_kᵀ δz itself
                rows.append(_vec_norm(torch.einsum("qbkz,bkzd->qbkd", dz, jac), norm))
            else:  # wide z (attention w.r.t. the residual: z = LN1(x)): the per-token VJP, batched over queries
                with torch.enable_grad():
                    rows.append(_vec_norm(torch.func.vmap(lambda ct: local_vjp(ct)[0])(dz), norm))
        out.append(rearrange(torch.cat(rows), "q b k -> b q k")[:, order])
    return torch.stack(out, dim=1)  # (B, N, Q, T_k)


# --------------------------------------------------------------------------------- reference forms
@differentiable()  # cuDNN off: an eval-mode LSTM cannot be differentiated with it (methods.devices)
def dependency(
    fn: Callable, x: torch.Tensor, queries: Optional[Sequence[int]] = None, chunk_size: Optional[int] = None,
    norm: Norm = "l2",
) -> torch.Tensor:
    """Batched gradient-saliency dependency by ``vjp`` + ``vmap``, ``(B, N, Q, T)`` = (sample, head, query, key).

    For each head: one ``torch.func.vjp`` of the single-head function, then ``vmap`` of the VJP
    over the query cotangents, ``chunk_size`` queries at a time. oneDNN is switched off inside,
    because its LSTM backward has no vmap rule.

    Args:
        fn: a :class:`HeadFn` (from :func:`head_output_fn`) or any ``x -> (B, T, N, C)``; the
            module(s) inside must be in eval mode and treat samples independently.
        x: the input of ``fn`` ``(B, T, ·)``.
        queries: output tokens to compute (default all T; ``[0]`` for CLS maps, Fig. 5).
        chunk_size: queries per vmapped VJP.
        norm: ``"l2"`` or ``"l1"`` over the input features.
    """
    _check_norm(norm)
    x = x.detach()
    qs = _query_list(queries, x.shape[1])
    chunk_size = chunk_size or auto_chunk_size(x)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
        with torch.backends.mkldnn.flags(enabled=False):
            return _dependency(fn, x, qs, chunk_size, norm)


def _dependency(fn: Callable, x: torch.Tensor, qs: list[int], chunk_size: int, norm: Norm) -> torch.Tensor:
    out = []
    for f in _per_head(fn):
        y, vjp_fn = torch.func.vjp(f, x)  # y: (B, T, n, C)
        b, t, n, c = y.shape
        onehot_qs = torch.eye(t, dtype=y.dtype, device=y.device)[qs]  # (Q, T): one cotangent per query

        def pull(onehot_q: torch.Tensor, onehot_h: torch.Tensor) -> torch.Tensor:
            # cotangent: ones at y[:, q, head, :] for every sample, (B, T, n, C)
            ct = (onehot_q.view(1, t, 1, 1) * onehot_h.view(1, 1, n, 1)).expand(b, t, n, c)
            return _vec_norm(vjp_fn(ct)[0], norm)  # (B, T_key)

        for head in range(n):
            onehot_h = torch.zeros(n, dtype=y.dtype, device=y.device).index_fill(0, torch.tensor(head, device=y.device), 1.0)
            dep = torch.func.vmap(pull, in_dims=(0, None), chunk_size=chunk_size)(onehot_qs, onehot_h)  # (Q, B, T_k)
            out.append(rearrange(dep, "q b k -> b q k"))
    return torch.stack(out, dim=1)  # (B, N, Q, T_k)


@differentiable()  # cuDNN off: an eval-mode LSTM cannot be differentiated with it (methods.devices)
def dependency_loop(fn: Callable, x: torch.Tensor, queries: Optional[Sequence[int]] = None, norm: Norm = "l2") -> torch.Tensor:
    """Reference: one forward, then one ``autograd.grad`` per (head, query). ``(B, N, Q, T)``.

    With a plain ``fn`` (not a :class:`HeadFn`) every backward runs through all heads, as a
    straightforward per-output-token script does.
    """
    _check_norm(norm)
    x = x.detach().requires_grad_(True)
    qs = _query_list(queries, x.shape[1])
    out = []
    with torch.enable_grad():
        for f in _per_head(fn):
            y = f(x)  # (B, T, n, C)
            for head in range(y.shape[2]):
                rows = []
                for q in qs:
                    (g,) = torch.autograd.grad(_select(y, q, head).sum(), x, retain_graph=True)  # (B, T, ·)
                    rows.append(_vec_norm(g, norm))  # (B, T_key)
                out.append(torch.stack(rows, dim=1))  # (B, Q, T_k)
    return torch.stack(out, dim=1)


@differentiable()  # cuDNN off: an eval-mode LSTM cannot be differentiated with it (methods.devices)
def dependency_captum(fn: Callable, x: torch.Tensor, queries: Optional[Sequence[int]] = None, norm: Norm = "l2") -> torch.Tensor:
    """The same with ``captum.attr.Saliency(abs=False)`` per (head, query). ``(B, N, Q, T)``."""
    from captum.attr import Saliency

    _check_norm(norm)
    x = x.detach().requires_grad_(True)
    qs = _query_list(queries, x.shape[1])
    out = []
    for f in _per_head(fn):
        n = f(x[:1]).shape[2]
        for head in range(n):
            rows = []
            for q in qs:
                sal = Saliency(lambda inp, q=q, head=head: _select(f(inp), q, head))  # (B,) per sample
                rows.append(_vec_norm(sal.attribute(x, abs=False), norm))  # (B, T_key)
            out.append(torch.stack(rows, dim=1))
    return torch.stack(out, dim=1)


# ------------------------------------------------------------------------------------------- models
def _check_wrt(wrt: str) -> None:
    if wrt not in WRT:
        raise ValueError(f"wrt must be one of {', '.join(map(repr, WRT))}, got {wrt!r}")


@torch.no_grad()
def block_inputs(
    model: nn.Module, images: torch.Tensor, layers: Optional[Sequence[int]] = None, *, wrt: Wrt = "mixer_input"
) -> list[torch.Tensor]:
    """The input ``wrt`` names of every (or the given) block of a timm ViT, read at its hook point.

    ``"residual"``: x_l ``(B, T, D)`` (``blocks.{i}.hook_resid_pre``); ``"mixer_input"``: LN1(x_l)
    ``(B, T, D)`` (``blocks.{i}.hook_mixer_in``); ``"lstm_input"``: FAR's LSTM inputs ``(B, T, N·D_h)``
    (``blocks.{i}.attn.hook_lstm_in``). Prefix tokens (cls, dist) included, in timm's order
    ``[prefix…, patches…]``. The forward pass stops after the last block asked for.

    Returns:
        One tensor per block in ``layers`` (default all blocks, so ``block_inputs(m, x)[i]`` is block i's).
    """
    _check_wrt(wrt)
    depth = len(model.blocks)
    layers = list(range(depth)) if layers is None else [int(i) % depth for i in layers]
    names = [f"blocks.{i}.{_WRT_HOOKS[wrt]}" for i in layers]
    if wrt == "lstm_input":
        plain = [i for i in layers if not is_far_substitute(model.blocks[i].attn)]
        if plain:
            raise ValueError(f"wrt='lstm_input' needs FAR substitutes; blocks {plain} hold attention (use wrt='mixer_input')")
    _, cache = run_with_cache(model, images, names=names, stop_early=True)
    return [cache[n] for n in names]


def model_dependency(
    model: nn.Module,
    images: torch.Tensor,
    layers: Optional[Sequence[int]] = None,
    queries: Optional[Sequence[int]] = None,
    method: Method = "auto",
    chunk_size: Optional[int] = None,
    *,
    wrt: Wrt = "mixer_input",
    norm: Norm = "l2",
) -> torch.Tensor:
    """Dependency of every (or the given) block of ``model``, in eval mode.

    Args:
        model: a timm ViT or FAR model.
        images: ``(B, C, H, W)``.
        layers: block indices (default all).
        queries: output tokens (default all).
        method: "factored" (:func:`dependency_factored`), "batched" (:func:`dependency`), "loop"
            (:func:`dependency_loop`, per head) or "auto": "factored" where the block allows it
            (timm ``Attention`` without ``scale_norm``, FAR substitutes: every ``wrt``), else "loop".
        chunk_size: queries per batch for "factored" / "batched".
        wrt: the input differentiated by (module docstring): ``"mixer_input"`` (default: token
            mixing), ``"residual"`` or ``"lstm_input"`` (FAR blocks only).
        norm: ``"l2"`` (default) or ``"l1"`` over the input features (``wrt="lstm_input", norm="l1"``:
            the FAR authors' form).

    Returns:
        ``(len(layers), B, N, Q, T)`` = (layer, sample, head, query, key).
    """
    if method not in ("auto", "factored", "batched", "loop"):
        raise ValueError(f"method must be 'auto', 'factored', 'batched' or 'loop', got {method!r}")
    _check_wrt(wrt)
    _check_norm(norm)
    was_training = model.training
    model.eval()
    try:
        depth = len(model.blocks)
        layers = list(range(depth)) if layers is None else [int(i) % depth for i in layers]
        fns = [head_output_fn(model.blocks[i], wrt) for i in layers]  # refuses a bad wrt before any forward
        inputs = block_inputs(model, images, layers, wrt=wrt)
        maps = []
        for fn, x in zip(fns, inputs):
            how = ("factored" if fn.factored else "loop") if method == "auto" else method
            if how == "factored":
                maps.append(dependency_factored(fn, x, queries, chunk_size, norm))
            elif how == "batched":
                maps.append(dependency(fn, x, queries, chunk_size, norm))
            else:
                maps.append(dependency_loop(fn, x, queries, norm))
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


#: what the extractor's units and long names say for each input
_WRT_LABEL = {"residual": "x_l", "mixer_input": "LN1(x_l)", "lstm_input": "the LSTM input I"}


@register("dependency", options=(ExtractorOption("wrt", "differentiate by the token-mixer input (default), the block input, "
                                    "or FAR's LSTM input", choices=("mixer_input", "residual", "lstm_input")),
                     ExtractorOption("norm", "norm of the gradient (default l2)", choices=("l2", "l1"))),
          example=Example(examples.far, (2, 1, 28, 28), (0, 2)),
          explore=ExploreKind("dependency", "gradient saliency", ("*attn.hook_lstm_in",), 10))
def extract_dependency(
    model: nn.Module,
    images: torch.Tensor,
    *,
    layers: int | Sequence[int] | None = None,
    targets: torch.Tensor | None = None,
    queries: Optional[Sequence[int]] = None,
    method: Method = "auto",
    wrt: Wrt = "mixer_input",
    norm: Norm = "l2",
) -> xr.Dataset:
    """Gradient-saliency token-to-token dependency of a timm ViT teacher or a FAR model (module docstring).

    Args:
        model: eval-mode timm ``VisionTransformer`` whose blocks hold timm ``Attention`` or FAR
            substitutes (any mix).
        images: ``(B, C, H, W)`` float tensor, normalised for the model.
        layers: block indices (negative allowed); ``None`` for all blocks.
        queries: output tokens to compute (default all; ``[0]`` for the CLS row only).
        method: see :func:`model_dependency`; all give the same numbers.
        wrt: ``"mixer_input"`` (default: measures token mixing), ``"residual"`` (includes LN1's 1/σ
            per key token) or ``"lstm_input"`` (FAR only); see the module docstring.
        norm: ``"l2"`` or ``"l1"`` over the input features.

    Returns:
        Dataset with ``dependency(sample, layer, head, query, key)`` (float32, ‖∂Σ_c y_q / ∂u_k‖),
        ``cls_dependency(sample, layer, head, y, x)`` (the CLS query's row over the patch grid, when
        the CLS query is computed), and the token coords of the ``attention`` extractor
        (``query_kind``/``query_y``/``query_x``, ``key_…``), so ``xr.concat`` with a teacher's
        attention along ``model`` lines up. attrs ``analysis="dependency"``, ``wrt``, ``norm``, ``config``.

    Raises:
        ValueError: a model in training mode, a model that is not such a ViT, bad ``layers``,
            ``wrt`` or ``norm``, or ``wrt="lstm_input"`` on a block without a FAR substitute.
    """
    check_vit(model)
    if model.training:
        raise ValueError("dependency extraction needs an eval-mode model (call model.eval()): "
                         "dropout and drop-path would make the gradients random")
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}")
    _check_wrt(wrt)
    _check_norm(norm)
    sel = _resolve_layers(len(model.blocks), layers)
    layout = vit_token_layout(model, tuple(images.shape[-2:]))
    qs = list(range(layout.num_tokens)) if queries is None else [int(q) for q in queries]
    dep = model_dependency(model, images, sel, qs, method, wrt=wrt, norm=norm)  # (L, B, N, Q, T)
    arr = rearrange(dep.float().cpu().numpy(), "l b n q k -> b l n q k")
    qcoords = {k: (v[0], v[1][qs]) for k, v in layout.coords("query").items()}
    ds = xr.Dataset(
        {"dependency": (("sample", "layer", "head", "query", "key"), arr)},
        coords={"sample": np.arange(arr.shape[0]), "layer": sel, "head": np.arange(arr.shape[2]),
                **qcoords, **layout.coords("key")},
    )
    p = "₂" if norm == "l2" else "₁"
    units = f"gradient {norm.upper()} norm w.r.t. {_WRT_LABEL[wrt]}"
    ds["dependency"].attrs.update(units=units, long_name=f"‖∂Σ_c y[q, head, c] / ∂u[k]‖{p}, u = {_WRT_LABEL[wrt]} "
                                                         "(gradient saliency)")
    if "cls" in layout.prefix_kinds and layout.prefix_kinds.index("cls") in qs:
        gh, gw = layout.grid
        row = arr[:, :, :, qs.index(layout.prefix_kinds.index("cls")), layout.num_prefix:]  # (B, L, N, patches)
        ds["cls_dependency"] = (("sample", "layer", "head", "y", "x"), rearrange(row, "b l n (y x) -> b l n y x", y=gh, x=gw))
        ds = ds.assign_coords(y=np.arange(gh), x=np.arange(gw))
        ds["cls_dependency"].attrs.update(units=units, long_name="CLS-to-patch gradient saliency")
    config = config_json(layers=None if layers is None else sel, queries=None if queries is None else qs, method=method,
                         wrt=wrt, norm=norm)
    return ds.assign_attrs(analysis="dependency", wrt=wrt, norm=norm, config=config)
