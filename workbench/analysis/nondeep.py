"""Non-deep ViT extractors: branch similarity, the joining coefficient λ, and the collapse error (App. C, §3.3).

Paper: "Non-deep Vision Transformers" (anonymous ICLR submission, papers/002). They read a *branched* model
(timm ``nondeep_branched``, :mod:`methods.nondeep`) by its hook-point names:

- ``branch_weight_similarity`` (Fig. 5, 6): similarity of the branches' weights per block and module
  (``qk``: W^Q_h W^K_hᵀ, ``ov``: W^V_h W^O_h, ``fc1``, ``fc2``), ``(layer, module, branch_i, branch_j)``;
  the weights of branch b of block i are those of ``blocks.{i}.branches.{b}``;
- ``branch_feature_similarity`` (Fig. 4): similarity of the branches' attention outputs
  (``blocks.{i}.branches.{b}.attn.hook_out``) and FFN outputs (``….mlp.hook_out``) on the images,
  ``(sample, layer, module, branch_i, branch_j)``;
- ``join_lambda`` (Fig. 3): the λ every block used (``blocks.{i}.hook_lambda``) and its score
  rectification, beside λ(t) of every schedule (App. B.2);
- ``collapse_error`` (§3.3): how far the collapsed model under each merge formula (exact, and the paper's
  Eq. 5–7 one by one) is from the branched model at λ = 1, per image and per block, in float64 and float32.

Attention maps of branched and collapsed models come from the shared ``attention`` extractor
(:mod:`workbench.analysis.attention`): it finds ``blocks.{i}.branches.{b}.attn.hook_pattern`` and adds a
``branch`` dim; a collapsed model is a plain timm ViT. Like every extractor these refuse a model in training
mode (dropout and the λ schedule's training-time state are not what the deployed model computes).
"""

from __future__ import annotations

import copy
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import xarray as xr

from methods.devices import to_numpy
from methods.hooks import run_with_cache
from methods.nondeep import (
    COLLAPSE_VARIANTS,
    FEATURE_MODULES,
    SCHEDULES,
    WEIGHT_MODULES,
    collapse,
    get_lambda,
    lambda_schedule,
    parallel_blocks,
    weight_similarity,
)
from workbench.analysis import Example, examples, register
from workbench.provenance import config_json
from workbench.xrutils import layer_config

__all__ = ["extract_weight_similarity", "extract_feature_similarity", "extract_join_lambda", "extract_collapse_error"]

_HOOK = {"attn": "attn.hook_out", "ffn": "mlp.hook_out"}


def _branched(model: nn.Module, what: str):
    if model.training:
        raise ValueError(f"{what} needs an eval-mode model (call model.eval()): in training mode dropout and drop-path "
                         "change what the branches compute")
    blocks = parallel_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no parallel blocks: {what} reads a branched Non-deep model "
                         "(timm 'nondeep_branched'; a Non-deep run's branched form is its source run "
                         "nondeep_branched-...)")
    return blocks


def _layers(layers: int | Sequence[int] | None, n: int) -> list[int]:
    """Block indices (negative count from the end), sorted, checked."""
    if layers is None:
        return list(range(n))
    wanted = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
    out = []
    for i in wanted:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ValueError(f"layers must be ints, got {i!r}")
        if not -n <= i < n:
            raise ValueError(f"layer index {i} out of range for a model with {n} parallel blocks (0..{n - 1})")
        out.append(int(i) % n)
    if not out:
        raise ValueError("layers selects no block; pass None for all blocks")
    if len(set(out)) != len(out):
        raise ValueError(f"duplicate layer indices in {wanted}")
    return sorted(out)


def _branch_coords(n: int) -> dict:
    return {"branch_i": np.arange(n), "branch_j": np.arange(n)}


@register("branch_weight_similarity", example=Example(examples.branched, (2, 1, 28, 28), (0, 2)))
@torch.no_grad()
def extract_weight_similarity(model: nn.Module, images: torch.Tensor | None = None, *,
                              layers: int | Sequence[int] | None = None,
                              targets: torch.Tensor | None = None) -> xr.Dataset:
    """Similarity of the branches' weights per block and module (Fig. 5 before joining, Fig. 6 after).

    Args:
        model: an eval-mode branched model.
        images: ignored (weights only); accepted for the common extractor signature.
        layers: parallel-block indices (negative allowed); None for all.
        targets: unused.

    Returns:
        Dataset with ``cosine(layer, module, branch_i, branch_j)``: cosine of the flattened matrices
        (:func:`methods.nondeep.weight_similarity`), and ``cka(...)``: the same for ``qk`` / ``ov`` and the
        cosine of the Gram matrices over hidden units for ``fc1`` / ``fc2`` (invariant to permuting or
        rotating the units); coords ``module`` (qk, ov, fc1, fc2) and ``lam(layer)``, the block's λ.
    """
    blocks = _branched(model, "branch weight similarity")
    sel = _layers(layers, len(blocks))
    cos = to_numpy(weight_similarity(model, "cosine")[sel])  # (layer, module, n, n)
    cka = to_numpy(weight_similarity(model, "cka")[sel])
    dims = ("layer", "module", "branch_i", "branch_j")
    ds = xr.Dataset({"cosine": (dims, cos), "cka": (dims, cka)},
                    coords={"layer": sel, "module": list(WEIGHT_MODULES), **_branch_coords(cos.shape[-1]),
                            "lam": ("layer", [float(blocks[i].lam) for i in sel])})
    ds["cosine"].attrs.update(units="cosine similarity", long_name="branch weight similarity (flattened matrices)")
    ds["cka"].attrs.update(units="cosine similarity", long_name="branch weight similarity (unit-permutation invariant)")
    return ds.assign_attrs(analysis="branch_weight_similarity", config=config_json(layers=layer_config(layers)))


@register("branch_feature_similarity", example=Example(examples.branched, (2, 1, 28, 28), (0, 2)))
@torch.no_grad()
def extract_feature_similarity(model: nn.Module, images: torch.Tensor, *, layers: int | Sequence[int] | None = None,
                               targets: torch.Tensor | None = None) -> xr.Dataset:
    """Similarity of the branches' attention and FFN outputs on ``images`` (Fig. 4).

    Reads ``blocks.{i}.branches.{b}.attn.hook_out`` and ``….mlp.hook_out`` (``(B, T, D)`` each).

    Returns:
        Dataset with ``cosine(sample, layer, module, branch_i, branch_j)``: the cosine over D between two
        branches' outputs at each token, averaged over the image's tokens (the quantity the diversity
        regulariser squares); ``cka(layer, module, branch_i, branch_j)``: linear CKA over all (image, token)
        rows; coords ``module`` (attn, ffn), ``lam(layer)``.
    """
    blocks = _branched(model, "branch feature similarity")
    sel = _layers(layers, len(blocks))
    n = blocks[0].num_branches
    names = [f"blocks.{i}.branches.{b}.{_HOOK[m]}" for i in sel for b in range(n) for m in FEATURE_MODULES]
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}")
    _, cache = run_with_cache(model, images, names=names, stop_early=True)
    cos = np.zeros((images.shape[0], len(sel), len(FEATURE_MODULES), n, n))
    cka = np.zeros((len(sel), len(FEATURE_MODULES), n, n))
    for li, i in enumerate(sel):
        for mi, m in enumerate(FEATURE_MODULES):
            f = torch.stack([cache[f"blocks.{i}.branches.{b}.{_HOOK[m]}"] for b in range(n)]).double()  # (n, B, T, D)
            unit = f / f.norm(dim=-1, keepdim=True).clamp_min(1e-300)
            cos[:, li, mi] = to_numpy(torch.einsum("abtd,cbtd->bac", unit, unit)) / f.shape[2]  # (B, n, n)
            rows = f.reshape(n, -1, f.shape[-1])
            rows = rows - rows.mean(1, keepdim=True)  # (n, B·T, D), centred
            hsic = torch.stack([torch.stack([(rows[a].t() @ rows[c]).square().sum() for c in range(n)])
                                for a in range(n)])  # ‖X_aᵀ X_c‖²_F: (n, n)
            norm = hsic.diagonal().sqrt()
            cka[li, mi] = to_numpy(hsic / (norm[:, None] * norm[None, :]))
    ds = xr.Dataset({"cosine": (("sample", "layer", "module", "branch_i", "branch_j"), cos),
                     "cka": (("layer", "module", "branch_i", "branch_j"), cka)},
                    coords={"sample": np.arange(images.shape[0]), "layer": sel, "module": list(FEATURE_MODULES),
                            **_branch_coords(n), "lam": ("layer", [float(blocks[i].lam) for i in sel])})
    ds["cosine"].attrs.update(units="cosine similarity", long_name="branch output similarity (token mean)")
    ds["cka"].attrs.update(units="linear CKA", long_name="branch output similarity (linear CKA over image tokens)")
    return ds.assign_attrs(analysis="branch_feature_similarity", config=config_json(layers=layer_config(layers)))


@register("join_lambda", example=Example(examples.branched, (2, 1, 28, 28), (0, 2)))
@torch.no_grad()
def extract_join_lambda(model: nn.Module, images: torch.Tensor, *, layers: int | Sequence[int] | None = None,
                        targets: torch.Tensor | None = None, warmup_steps: int = 100,
                        adjust_steps: int = 25) -> xr.Dataset:
    """The λ each block of a branched model used on ``images`` (``blocks.{i}.hook_lambda``) and λ(t) of every schedule.

    Args:
        warmup_steps, adjust_steps: the grid of the schedule curves: steps 0 … warmup + adjust, t = step / warmup
            (the curves do not depend on the model).

    Returns:
        Dataset with ``lambda(layer)`` and ``rectification(layer)`` (√(1+(n−1)λ²), or 1 without rectification:
        the joined scores are divided by it), and ``schedule_<name>(step)`` for every schedule of
        :data:`methods.nondeep.SCHEDULES` (Eq. 10–13, instant, none); coords ``step``, ``t(step)``.
    """
    blocks = _branched(model, "the joining coefficient")
    sel = _layers(layers, len(blocks))
    if warmup_steps < 1 or adjust_steps < 0:
        raise ValueError(f"warmup_steps must be ≥ 1 and adjust_steps ≥ 0, got {warmup_steps}, {adjust_steps}")
    _, cache = run_with_cache(model, images, names=[f"blocks.{i}.hook_lambda" for i in sel], stop_early=True)
    lam = torch.stack([cache[f"blocks.{i}.hook_lambda"].double() for i in sel])
    rect = torch.stack([blocks[i].rectification(lam[k]) for k, i in enumerate(sel)])
    steps = np.arange(warmup_steps + adjust_steps + 1)
    curves = {f"schedule_{s}": ("step", [lambda_schedule(s, k / warmup_steps) for k in steps]) for s in SCHEDULES}
    ds = xr.Dataset({"lambda": ("layer", to_numpy(lam)), "rectification": ("layer", to_numpy(rect)), **curves},
                    coords={"layer": sel, "step": steps, "t": ("step", steps / warmup_steps),
                            "branches": blocks[0].num_branches})
    ds["lambda"].attrs.update(units="1", long_name="joining coefficient λ")
    return ds.assign_attrs(analysis="join_lambda", config=config_json(layers=layer_config(layers),
                                                                      warmup_steps=warmup_steps,
                                                                      adjust_steps=adjust_steps))


def _relative(out: torch.Tensor, ref: torch.Tensor) -> np.ndarray:
    """Per sample ``max |out − ref| / max |ref|`` over every other dim."""
    d = (out - ref).abs().flatten(1).amax(1)
    return (d / ref.abs().flatten(1).amax(1).clamp_min(torch.finfo(ref.dtype).tiny)).double().cpu().numpy()


def _block_errors(col: nn.Module, cache: dict, sel: Sequence[int]) -> np.ndarray:
    """``(B, layer)``: block i of the collapsed model ``col`` fed the branched block's recorded input, max |Δ output| /
    max |the branched block's residual update|."""
    per_block = []
    for i in sel:
        pre, post = cache[f"blocks.{i}.hook_resid_pre"], cache[f"blocks.{i}.hook_resid_post"]
        d = (col.blocks[i](pre) - post).abs().flatten(1).amax(1)
        per_block.append((d / (post - pre).abs().flatten(1).amax(1).clamp_min(1e-300)).cpu().numpy())
    return np.stack(per_block, axis=1)


def _collapse_variables(out: dict[str, list], precisions: Sequence[str], targets: torch.Tensor | None,
                        ref_pred: torch.Tensor | None) -> dict:
    """The collapse-error Dataset's variables from the per-variant lists in ``out``, for the precisions run."""
    data = {}
    if "float64" in precisions:
        data["logit_error"] = (("model", "sample"), np.stack(out["logit_error"]))
        data["block_error"] = (("model", "sample", "layer"), np.stack(out["block_error"]))
    if "float32" in precisions:
        data["logit_error_float32"] = (("model", "sample"), np.stack(out["logit_error_float32"]))
        data["same_prediction"] = (("model", "sample"), np.stack(out["same_prediction"]))
    if targets is not None and "float32" in precisions:
        data["correct"] = (("model", "sample"), np.stack(out["correct"]))
        data["branched_correct"] = ("sample", (ref_pred == targets.to(ref_pred.device)).cpu().numpy())
    return data


@register("collapse_error", example=Example(examples.branched, (2, 1, 28, 28), (0, 2)))
@torch.no_grad()
def extract_collapse_error(model: nn.Module, images: torch.Tensor, *, layers: int | Sequence[int] | None = None,
                           targets: torch.Tensor | None = None, variants: Sequence[str] | None = None,
                           precisions: Sequence[str] = ("float64", "float32")) -> xr.Dataset:
    """How far each merge formula's collapsed model is from the branched one (§3.3; :data:`COLLAPSE_VARIANTS`).

    The branched model must be joined (λ = 1; a λ = 0 model is compared with its exact *wide* collapse, the only
    variant then). Both run in eval mode, in float64 and in float32.

    Args:
        variants: names from :data:`methods.nondeep.COLLAPSE_VARIANTS` (default: all).
        precisions: ``"float64"`` (the errors of the formulas: ``logit_error``, ``block_error``) and / or
            ``"float32"`` (rounding at deployment precision, predictions: the other variables). float64 is the
            costly one on a CPU: pass ``("float32",)`` to score many images, ``("float64",)`` to check exactness.

    Returns:
        Dataset along ``model`` (the variants) with (float64) ``logit_error(model, sample)`` and
        ``logit_error_float32(model, sample)``: max |Δ logit| / max |logit| of the branched model per image;
        ``block_error(model, sample, layer)``: block i of the collapsed model fed the branched block's input,
        max |Δ output| / max |branched block's residual update| (float64); ``same_prediction(model, sample)``
        (top-1 equal to the branched model's, float32); with ``targets`` also ``correct(model, sample)`` and
        ``branched_correct(sample)``; coords ``equations(model)``, ``description(model)``, attr ``form``.

    Raises:
        ValueError: training mode, no parallel blocks, λ strictly between 0 and 1 ("collapse before joining is
            complete"), an unknown variant, bad ``layers``.
    """
    blocks = _branched(model, "the collapse error")
    sel = _layers(layers, len(blocks))
    lam = get_lambda(model)
    form = "wide" if lam == 0.0 else "auto"
    variants = list(variants or (COLLAPSE_VARIANTS if form != "wide" else ("exact",)))
    unknown = [v for v in variants if v not in COLLAPSE_VARIANTS]
    if unknown:
        raise ValueError(f"unknown collapse variant(s) {unknown}; choose from {', '.join(COLLAPSE_VARIANTS)}")
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}")
    dtypes = {"float64": torch.float64, "float32": torch.float32}
    if not precisions or any(p not in dtypes for p in precisions):
        raise ValueError(f"precisions must be a non-empty selection of float64, float32; got {precisions!r}")
    out: dict[str, list] = {"logit_error": [], "logit_error_float32": [], "block_error": [], "same_prediction": [],
                            "correct": []}
    ref_pred = None
    for dtype in [dtypes[p] for p in ("float64", "float32") if p in precisions]:
        ref = copy.deepcopy(model).to(dtype).eval()
        x = images.to(dtype)
        names = [f"blocks.{i}.hook_{w}" for i in sel for w in ("resid_pre", "resid_post")]
        logits, cache = run_with_cache(ref, x, names=names)
        if dtype == torch.float32:
            ref_pred = logits.argmax(-1)
        for v in variants:
            col = collapse(ref, v, form).eval()  # raises "collapse before joining is complete" for 0 < λ < 1
            got = col(x)
            if dtype == torch.float64:
                out["logit_error"].append(_relative(got, logits))
                out["block_error"].append(_block_errors(col, cache, sel))  # (B, layer)
            else:
                out["logit_error_float32"].append(_relative(got, logits))
                pred = got.argmax(-1)
                out["same_prediction"].append((pred == ref_pred).cpu().numpy())
                if targets is not None:
                    out["correct"].append((pred == targets.to(pred.device)).cpu().numpy())
    ds = xr.Dataset(_collapse_variables(out, precisions, targets, ref_pred), coords={
        "model": variants, "sample": np.arange(images.shape[0]), "layer": sel,
        "equations": ("model", [COLLAPSE_VARIANTS[v].equations for v in variants]),
        "description": ("model", [COLLAPSE_VARIANTS[v].description for v in variants])})
    for name in ("logit_error", "logit_error_float32", "block_error"):
        if name in ds:
            ds[name].attrs.update(units="relative error")
    return ds.assign_attrs(analysis="collapse_error", form=form, lam=lam,
                           config=config_json(layers=layer_config(layers), variants=variants,
                                              precisions=list(precisions)))

