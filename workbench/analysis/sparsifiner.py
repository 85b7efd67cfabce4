"""Sparsifiner's internals as Datasets: connectivity masks, sparse vs full attention, the sparse basis W_up
and its coefficients (Wei et al., "Sparsifiner", CVPR 2023, papers/001, Fig. 3, 5, 6, 7).

Two extractors, reading the hook points of :mod:`methods.sparsifiner` (``blocks.{i}.attn.…``):

- ``sparse_attention`` (:func:`extract_sparse_attention`): per sample, layer, head, query and key the
  connectivity mask M (Eq. 3), the sparse attention multiplied into V (Eq. 4–5) and the dense softmax of the
  same queries; the budget as realised per query row; how much of the dense attention the kept keys carry,
  against the best any B keys could carry; with ``teacher=`` the same against the dense teacher's attention;
- ``sparse_basis`` (:func:`extract_sparse_basis`): the sparse basis W̃_up on the patch grid ``(layer, basis,
  y, x)`` with the prefix (CLS) keys' entries apart, the raw parameter beside it, the low-rank attention A_down
  (Eq. 1) and the basis coefficients Ã_down (Eq. 2) ``(sample, layer, head, query, basis)``, and the sparsity of
  basis and coefficients per layer.

:func:`mass_agreement` (pure numpy/xarray) scores a mask against any reference attention; the figures use it
with the teacher's ``attention`` store.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import xarray as xr

from methods.hooks import hook_points
from methods.sparsifiner import sparse_attentions, sparse_basis
from workbench.analysis import Example, ExploreKind, examples, register
from workbench.analysis.attention import AttentionPoint, record, select_layers
from workbench.analysis.tokens import vit_token_layout
from workbench.provenance import config_json
from workbench.xrutils import layer_config

__all__ = ["extract_sparse_attention", "extract_sparse_basis", "mass_agreement", "sparse_points"]

MASK_PATTERN = re.compile(r"blocks\.(?P<layer>\d+)\.attn\.hook_mask")


def sparse_points(model: nn.Module) -> list[AttentionPoint]:
    """The Sparsifiner attention blocks of ``model`` (hook ``blocks.{i}.attn.hook_mask``), in block order.

    Raises:
        ValueError: the model has none (a dense ViT, a Linformer baseline, a Swin...).
    """
    names = list(hook_points(model))
    points = [AttentionPoint(n.removesuffix(".hook_mask"), int(m["layer"]))
              for n in names if (m := MASK_PATTERN.fullmatch(n))]
    if not points:
        hint = " It has blocks.{i}.attn.hook_pattern: use the 'attention' extractor." if any(
            n.endswith(".attn.hook_pattern") for n in names) else ""
        raise ValueError(f"{type(model).__name__} has no Sparsifiner attention hook points "
                         "(blocks.{i}.attn.hook_mask): build it with methods.sparsifiner.replace_attention or load "
                         f"a Sparsifiner run.{hint}")
    return points


def _teacher_model(teacher, device) -> tuple[nn.Module, str]:
    if isinstance(teacher, nn.Module):
        return teacher, type(teacher).__name__
    from workbench.models import load_model

    return load_model(str(teacher), device=device).model, str(teacher)


def mass_agreement(mask: xr.DataArray, reference: xr.DataArray) -> xr.Dataset:
    """How well a connectivity mask keeps the mass of a reference attention, per patch-query row.

    Args:
        mask: bool ``(…, query, key)``, with ``query_kind`` coords (prefix rows are skipped).
        reference: attention probabilities of the same shape (rows sum to 1): the model's own dense softmax, or
            the dense teacher's attention.

    Returns:
        Dataset over ``(…, query)`` (patch queries only): ``mass`` Σ_kept reference (the share of the reference
        row the kept keys carry), ``oracle_mass`` the largest share any set of as many keys could carry (the
        reference's own top-B), ``overlap`` |kept ∩ top-B(reference)| / B, ``chance_mass`` B / T (random keys),
        and ``kept`` B.
    """
    patch = mask["query_kind"].values == "patch"
    m = mask.isel(query=patch)
    ref = reference.isel(query=patch).transpose(*m.dims).values.astype(np.float64)
    mv = m.values.astype(bool)
    kept = mv.sum(-1)  # (..., query)
    mass = np.where(mv, ref, 0.0).sum(-1)
    # one stable argsort of each row, descending (ties broken by key index): the sorted values give the oracle, the
    # first B positions of the order the reference's top-B
    order = np.argsort(-ref, axis=-1, kind="stable")  # (..., query, key)
    cum = np.cumsum(np.take_along_axis(ref, order, -1), axis=-1)
    idx = np.clip(kept - 1, 0, ref.shape[-1] - 1)
    oracle = np.where(kept > 0, np.take_along_axis(cum, idx[..., None], -1)[..., 0], 0.0)
    top = np.zeros_like(mv)
    np.put_along_axis(top, order, np.arange(ref.shape[-1]) < kept[..., None], -1)
    overlap = (top & mv).sum(-1) / np.maximum(kept, 1)
    dims = m.dims[:-1]
    coords = {k: v for k, v in m.coords.items() if "key" not in v.dims}
    return xr.Dataset({"mass": (dims, mass.astype(np.float32)), "oracle_mass": (dims, oracle.astype(np.float32)),
                       "overlap": (dims, overlap.astype(np.float32)),
                       "chance_mass": (dims, (kept / mv.shape[-1]).astype(np.float32)), "kept": (dims, kept)},
                      coords=coords)


#: (variable, units, long name) of the sparse-attention Dataset's probabilities and shares.
_SPARSE_LABELS = (("attention", "probability", "sparse attention (Eq. 4-5) multiplied into V"),
                  ("full_attention", "probability", "dense softmax(QK^T/sqrt(d)) of the same queries"),
                  ("teacher_attention", "probability", "dense teacher's attention"),
                  ("own_mass", "share", "share of the own dense row on the kept keys"),
                  ("teacher_mass", "share", "share of the teacher's row on the kept keys"))


def _with_teacher_attention(ds: xr.Dataset, teacher: nn.Module | str, images: torch.Tensor,
                            layer_ids: Sequence[int], agreement: bool = True) -> tuple[xr.Dataset, str]:
    """``ds`` with the dense teacher's attention of the same layers and the masks' agreement with it, and the
    teacher's reference (for the config).

    Raises:
        ValueError: the teacher's attention is not of the masks' shape (another token layout or heads).
    """
    t_model, ref = _teacher_model(teacher, images.device)
    t_cache = record(t_model, images, [f"blocks.{i}.attn.hook_pattern" for i in layer_ids])
    t_attn = np.stack([t_cache[f"blocks.{i}.attn.hook_pattern"].float().cpu().numpy() for i in layer_ids], axis=1)
    mask = ds["mask"]
    if t_attn.shape != mask.shape:
        raise ValueError(f"the teacher's attention has shape {t_attn.shape}, the student's masks {mask.shape}: "
                         "not the same token layout and heads")
    ds["teacher_attention"] = (mask.dims, t_attn)
    if not agreement:  # the explorer's first click: the maps only
        return ds, ref
    agree = mass_agreement(ds["mask"], ds["teacher_attention"])
    return ds.assign(teacher_mass=agree["mass"], teacher_oracle_mass=agree["oracle_mass"],
                     teacher_overlap=agree["overlap"]), ref


@register("sparse_attention", example=Example(examples.sparsifiner, (2, 1, 28, 28), (0, 2)),
          explore=ExploreKind("attention", "sparse attention", ("*attn.hook_mask",), 20, outline="mask"))
def extract_sparse_attention(
    model: nn.Module,
    images: torch.Tensor,
    *,
    layers: int | Sequence[int] | None = None,
    targets: torch.Tensor | None = None,
    teacher: nn.Module | str | None = None,
    agreement: bool = True,
) -> xr.Dataset:
    """Connectivity masks with the sparse and the full attention of the same queries (Fig. 3, 5).

    Args:
        model: eval-mode Sparsifiner model (train or deploy form) with hook points ``blocks.{i}.attn.hook_mask``,
            ``hook_pattern`` and ``hook_pattern_full``.
        images: ``(B, C, H, W)`` normalised for the model.
        layers: Sparsifiner block indices (negative allowed); None for all.
        targets: unused.
        teacher: a dense ViT (eval-mode module, run id or timm name) on the same token layout: adds its attention
            and the mask's agreement with it.
        agreement: add the mask's :func:`mass_agreement` summaries (``own_*``, ``chance_mass``, ``teacher_mass`` …);
            False leaves them out (the live explorer, which shows maps only: at 577 tokens and 12 layers they take
            ~5 s of a click, an argsort of every row).

    Returns:
        Dataset with ``mask(sample, layer, head, query, key)`` bool (prefix query rows all True),
        ``attention`` the sparse attention multiplied into V (zeros off the mask; Eq. 4 rows sum to the kept
        share of the dense row, renormalised rows to 1), ``full_attention`` the dense softmax(QKᵀ/√d) of the same
        queries; ``kept(sample, layer, head, query)`` keys kept per query row; per layer ``budget`` (B),
        ``realised_keep_rate`` (mean kept / T over patch rows), ``kept_min`` / ``kept_max`` (over patch rows and
        samples: both B when the budget is met exactly), ``mask_sparsity`` (share of M off, prefix rows
        included); with ``agreement``, :func:`mass_agreement` against the model's own dense attention
        (``own_mass``, ``own_oracle_mass``, ``own_overlap``, ``chance_mass``); with ``teacher``:
        ``teacher_attention`` and (with ``agreement``) ``teacher_mass``, ``teacher_oracle_mass``,
        ``teacher_overlap``. Token coords as in the ``attention``
        extractor. attrs ``analysis``, ``config``.

    Raises:
        ValueError: a model in training mode, without Sparsifiner attention, bad ``layers``, or a teacher whose
            token layout differs.
    """
    points = select_layers(sparse_points(model), layers)
    suffixes = ("hook_mask", "hook_pattern", "hook_pattern_full")
    cache = record(model, images, [f"{p.name}.{s}" for p in points for s in suffixes])
    layout = vit_token_layout(model, tuple(images.shape[-2:]))

    def stack(suffix: str) -> np.ndarray:  # (B, L, H, T, T)
        return np.stack([cache[f"{p.name}.{suffix}"].cpu().numpy() for p in points], axis=1)

    mask = stack("hook_mask").astype(bool)
    if mask.shape[-1] != layout.num_tokens:
        raise ValueError(f"masks over {mask.shape[-1]} tokens, but the token layout has {layout.num_tokens}")
    dims = ("sample", "layer", "head", "query", "key")
    layer_ids = [p.layer for p in points]
    ds = xr.Dataset(
        {"mask": (dims, mask), "attention": (dims, stack("hook_pattern").astype(np.float32)),
         "full_attention": (dims, stack("hook_pattern_full").astype(np.float32))},
        coords={"sample": np.arange(mask.shape[0]), "layer": layer_ids, "head": np.arange(mask.shape[2]),
                **layout.coords("query"), **layout.coords("key")},
    )
    ds["kept"] = ds["mask"].sum("key").astype(np.int64)
    patch_kept = ds["kept"].isel(query=ds["query_kind"].values == "patch")
    blocks = dict(sparse_attentions(model))
    ds["budget"] = ("layer", [int(blocks[i].keep) if i in blocks else -1 for i in layer_ids])
    ds["kept_min"] = patch_kept.min(("sample", "head", "query"))
    ds["kept_max"] = patch_kept.max(("sample", "head", "query"))
    ds["realised_keep_rate"] = (patch_kept.mean(("sample", "head", "query")) / layout.num_tokens).astype(np.float32)
    ds["mask_sparsity"] = (1 - ds["mask"].mean(("sample", "head", "query", "key"))).astype(np.float32)
    if agreement:
        own = mass_agreement(ds["mask"], ds["full_attention"])
        ds = ds.assign(own_mass=own["mass"], own_oracle_mass=own["oracle_mass"], own_overlap=own["overlap"],
                       chance_mass=own["chance_mass"])
    ref = None
    if teacher is not None:
        ds, ref = _with_teacher_attention(ds, teacher, images, layer_ids, agreement)
    for name, units, long in _SPARSE_LABELS:
        if name in ds:
            ds[name].attrs.update(units=units, long_name=long)
    summaries = {} if agreement else {"agreement": False}  # recorded only when off: earlier stores keep their config
    return ds.assign_attrs(analysis="sparse_attention",
                           config=config_json(layers=layer_config(layers), teacher=ref, **summaries))


@register("sparse_basis", example=Example(examples.sparsifiner, (2, 1, 28, 28), (0, 2)))
def extract_sparse_basis(
    model: nn.Module,
    images: torch.Tensor,
    *,
    layers: int | Sequence[int] | None = None,
    targets: torch.Tensor | None = None,
) -> xr.Dataset:
    """The sparse basis W_up on the patch grid and its coefficients per query (Fig. 6, 7).

    Args:
        model: eval-mode Sparsifiner model (train or deploy form).
        images: ``(B, C, H, W)`` normalised for the model (for the coefficients).
        layers: Sparsifiner block indices (negative allowed); None for all.
        targets: unused.

    Returns:
        Dataset with ``w_up(layer, basis, y, x)`` the thresholded basis W̃_up as used (Eq. 3; entry [l, j, y, x]:
        the weight basis vector j gives the key at patch (y, x)) and ``w_up_raw`` the parameter;
        ``w_up_prefix`` / ``w_up_prefix_raw(layer, basis, key)`` the prefix (CLS) keys' entries, kept apart;
        ``a_down(sample, layer, head, query, basis)`` the low-rank attention A_down (Eq. 1) and ``coefficients``
        Ã_down (Eq. 2: entries ≤ τ zeroed) of the patch queries; per layer ``basis_sparsity`` (zeros of W̃_up),
        ``coef_sparsity`` (zeros of Ã_down) and ``up_density`` (the share of the dense product Ã_down W̃_up a
        sparse-sparse product does); attrs ``tau``, ``basis_threshold``, ``basis_sign``, ``analysis``, ``config``.

    Raises:
        ValueError: a model in training mode, without Sparsifiner attention, or bad ``layers``.
    """
    points = select_layers(sparse_points(model), layers)
    suffixes = ("predictor.hook_a_down", "predictor.hook_coef", "predictor.hook_w_up")
    cache = record(model, images, [f"{p.name}.{s}" for p in points for s in suffixes])
    layout = vit_token_layout(model, tuple(images.shape[-2:]))
    gh, gw = layout.grid
    pre = layout.num_prefix
    order = [i for i, _ in sparse_attentions(model)]
    raw = sparse_basis(model, thresholded=False)[[order.index(p.layer) for p in points]].cpu().numpy()  # (L, r, T)
    used = np.stack([cache[f"{p.name}.predictor.hook_w_up"].cpu().numpy() for p in points])  # (L, r, T)
    # (B, L, H, T-P, r) each
    a_down = np.stack([cache[f"{p.name}.predictor.hook_a_down"].cpu().numpy() for p in points], axis=1)
    coef = np.stack([cache[f"{p.name}.predictor.hook_coef"].cpu().numpy() for p in points], axis=1)
    n_layers, r, n_tok = used.shape
    q = layout.coords("query")
    k = layout.coords("key")
    patch_q = {name: (dim, vals[pre:]) for name, (dim, vals) in q.items()}
    prefix_k = {name: (dim, vals[:pre]) for name, (dim, vals) in k.items()}
    nonzero = (used != 0).sum(-1)  # (L, r): nonzeros of each basis vector
    # a sparse-sparse product visits, per query row, the nonzeros of the basis rows of its nonzero coefficients
    products = np.einsum("blhqr,lr->blhq", (coef != 0).astype(np.float64), nonzero.astype(np.float64))
    ds = xr.Dataset(
        {"w_up": (("layer", "basis", "y", "x"), used[..., pre:].reshape(n_layers, r, gh, gw).astype(np.float32)),
         "w_up_raw": (("layer", "basis", "y", "x"), raw[..., pre:].reshape(n_layers, r, gh, gw).astype(np.float32)),
         "w_up_prefix": (("layer", "basis", "key"), used[..., :pre].astype(np.float32)),
         "w_up_prefix_raw": (("layer", "basis", "key"), raw[..., :pre].astype(np.float32)),
         "a_down": (("sample", "layer", "head", "query", "basis"), a_down.astype(np.float32)),
         "coefficients": (("sample", "layer", "head", "query", "basis"), coef.astype(np.float32)),
         "basis_sparsity": ("layer", (used == 0).mean((1, 2)).astype(np.float32)),
         "coef_sparsity": ("layer", (coef == 0).mean((0, 2, 3, 4)).astype(np.float32)),
         "up_density": ("layer", (products.mean((0, 2, 3)) / (r * n_tok)).astype(np.float32))},
        coords={"sample": np.arange(coef.shape[0]), "layer": [p.layer for p in points],
                "head": np.arange(coef.shape[2]), "basis": np.arange(r), "y": np.arange(gh), "x": np.arange(gw),
                **patch_q, **prefix_k},
    )
    pred = dict(sparse_attentions(model))[points[0].layer].predictor
    for name, long in (("w_up", "sparse basis W_up as used (thresholded)"), ("w_up_raw", "W_up parameter"),
                       ("a_down", "low-rank attention A_down (Eq. 1)"), ("coefficients", "basis coefficients (Eq. 2)")):
        ds[name].attrs.update(long_name=long, units="weight" if name.startswith("w_up") else "probability")
    return ds.assign_attrs(analysis="sparse_basis", config=config_json(layers=layer_config(layers)),
                           tau=float(pred.tau), basis_threshold=float(pred.basis_threshold), basis_sign=pred.basis_sign,
                           coef_topk=-1 if pred.coef_topk is None else int(pred.coef_topk), n_tokens=int(n_tok))
