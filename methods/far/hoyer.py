"""Structured DeepHoyer pruning of the BiLSTM hidden units (FAR §3.3, Eq. 5–6, Fig. 3, App. A.2).

Paper: Ren et al., "Is Attention Required for Transformer Inference? Explore Function-preserving
Attention Replacement"; DeepHoyer: Yang, Wen, Li (2020).

For every replaced layer l, head n and direction d, hidden unit j owns one row of the composite
matrix W^(l) ∈ R^{U×G} (§3.3, Fig. 3). With ``grouping``:

- ``"rows"``: its rows of W_ih and of W_hh in all four gates (i, f, g, o) — what Fig. 3 draws;
- ``"full"`` (default): also its column of W_hh (every gate, the diagonal entries counted once)
  and the column of the output projection that reads it — "joint grouping over all structurally
  coupled parameters" (Fig. 3 caption, items (1)–(3) of §3.3).

Biases are not in the group (the paper lists weights only) but are zeroed with a pruned unit.

    G_H(w)     = (Σ_g ‖w_g‖₂)² / Σ_g ‖w_g‖₂²                                   (Eq. 5)
    R_Hoyer^(l) = (Σ_j ‖W^(l)[j,:]‖₂)² / Σ_j ‖W^(l)[j,:]‖₂²                     (Eq. 6)

computed per (layer, head, direction) and summed into the regulariser. A unit is pruned when its
group norm is ≤ the threshold (1e-4, App. A.2). A pruned unit with zero W_ih rows, W_hh rows and
biases has gate pre-activations 0, so i = f = o = ½, g = 0, c_t = ½ c_{t−1} = 0 and h_t = 0 for
all t: it outputs exactly 0, so removing it physically (:func:`shrink`) is exact.

Tensors are indexed ``(layer, head, direction, unit)`` with ``layer`` over the replaced blocks in
block order, ``direction`` 0 = forward, 1 = reverse, and ``unit`` the *original* unit index
(0..U−1); units already removed by :func:`shrink` read NaN in norms and False in masks.
"""

from __future__ import annotations

import copy
from typing import Callable, Iterator, Mapping

import torch
import torch.nn as nn

from .config import Grouping
from .lstm import MultiHeadBiLSTM
from .replace import _unwrap, substitutes


def _subs(model: nn.Module) -> list[tuple[int, MultiHeadBiLSTM]]:
    subs = substitutes(model)
    if not subs:
        raise ValueError(f"{type(_unwrap(model)).__name__} has no FAR substitutes")
    shapes = {(s.num_heads, s.hidden_dim) for _, s in subs}
    if len(shapes) != 1:
        raise ValueError(f"substitutes differ in (heads, hidden_dim): {sorted(shapes)}")
    return subs


def _iter_lstms(sub: MultiHeadBiLSTM) -> Iterator[tuple[int, int, nn.Module, slice, torch.Tensor]]:
    """``(head, direction, lstm, out_proj column slice, original index of each local unit)``."""
    for i, (lstm, sl) in enumerate(zip(sub.lstms, sub.out_proj_slices())):
        n, d = divmod(i, 2)
        if lstm.hidden_size == sub.hidden_dim:  # every unit kept (training before shrink): no nonzero, no host sync
            yield n, d, lstm, sl, torch.arange(sub.hidden_dim, device=sub.kept.device)
        else:
            yield n, d, lstm, sl, sub.kept[n, d].nonzero().squeeze(-1)


def _safe_sqrt(sq: torch.Tensor) -> torch.Tensor:
    """√sq with a zero (not NaN) gradient where sq = 0 (masked units)."""
    tiny = torch.finfo(sq.dtype).tiny
    return torch.where(sq > 0, sq.clamp_min(tiny).sqrt(), torch.zeros_like(sq))


def lstm_unit_sq_norms(lstm: nn.LSTM, out_cols: torch.Tensor, grouping: Grouping = "full") -> torch.Tensor:
    """Squared L2 norm of each hidden unit's group in one unidirectional LSTM, ``(h,)``.

    Args:
        lstm: a single-layer unidirectional ``nn.LSTM`` with hidden size h.
        out_cols: ``(D, h)`` columns of the output projection reading its units.
        grouping: "rows" or "full" (module docstring).
    """
    h = lstm.hidden_size
    w_ih = lstm.weight_ih_l0.view(4, h, -1)  # (gate, unit, D_h)
    w_hh = lstm.weight_hh_l0.view(4, h, h)  # (gate, row unit, column unit)
    sq = w_ih.pow(2).sum((0, 2)) + w_hh.pow(2).sum((0, 2))  # rows over 4 gates: (h,)
    if grouping == "full":
        offdiag = 1.0 - torch.eye(h, dtype=w_hh.dtype, device=w_hh.device)  # diagonal already in rows
        sq = sq + (w_hh.pow(2) * offdiag).sum((0, 1))  # column j of W_hh, all gates
        sq = sq + out_cols.pow(2).sum(0)  # column j of the output projection
    elif grouping != "rows":
        raise ValueError(f"grouping must be 'rows' or 'full', got {grouping!r}")
    return sq


def unit_group_norms(model: nn.Module, grouping: Grouping = "full") -> torch.Tensor:
    """‖W^(l)[j,:]‖₂ for every unit: ``(layer, head, direction, unit)``, NaN for removed units.

    Differentiable in the weights (used by :func:`hoyer_regularizer`).
    """
    subs = _subs(model)
    layers = []
    for _, sub in subs:
        w = sub.out_proj.weight
        per = []
        for _n, _d, lstm, sl, orig in _iter_lstms(sub):
            full = torch.full((sub.hidden_dim,), float("nan"), dtype=w.dtype, device=w.device)
            if lstm.hidden_size:
                norms = _safe_sqrt(lstm_unit_sq_norms(lstm, w[:, sl], grouping))  # (h,)
                full = full.index_put((orig.to(w.device),), norms)  # original unit positions
            per.append(full)
        layers.append(torch.stack(per).view(sub.num_heads, 2, sub.hidden_dim))  # (N, 2, U)
    return torch.stack(layers)  # (L, N, 2, U)


def group_hoyer(norms: torch.Tensor) -> torch.Tensor:
    """Group Hoyer measure (Eq. 5/6) over the last dim: (Σ_j n_j)² / Σ_j n_j², NaNs ignored.

    Args:
        norms: ``(..., U)`` group norms, e.g. from :func:`unit_group_norms`.

    Returns:
        ``(...)``; 0 where every group is zero or absent. Ranges over [1, U] otherwise.
    """
    n = torch.nan_to_num(norms, nan=0.0)
    s1 = n.sum(-1)
    s2 = n.pow(2).sum(-1)
    return torch.where(s2 > 0, s1.pow(2) / s2.clamp_min(torch.finfo(n.dtype).tiny), torch.zeros_like(s2))


def hoyer_regularizer(model: nn.Module, grouping: Grouping = "full") -> torch.Tensor:
    """Σ over (layer, head, direction) of Eq. 6: the DeepHoyer term added to the loss (App. A.2)."""
    return group_hoyer(unit_group_norms(model, grouping)).sum()


@torch.no_grad()
def prune_masks(model: nn.Module, threshold: float = 1e-4, grouping: Grouping = "full") -> torch.Tensor:
    """Keep-mask ``(layer, head, direction, unit)``: group norm > ``threshold`` (§3.3 pruning step)."""
    return unit_group_norms(model, grouping) > threshold  # NaN (removed) compares False


def kept_masks(model: nn.Module) -> torch.Tensor:
    """The units each substitute physically has, ``(layer, head, direction, unit)`` bool."""
    return torch.stack([sub.kept for _, sub in _subs(model)])


def _check_masks(subs, masks: torch.Tensor) -> None:
    want = (len(subs), subs[0][1].num_heads, 2, subs[0][1].hidden_dim)
    if tuple(masks.shape) != want:
        raise ValueError(f"masks must have shape (layer, head, direction, unit) = {want}, got {tuple(masks.shape)}")


@torch.no_grad()
def apply_masks(model: nn.Module, masks: torch.Tensor) -> nn.Module:
    """Zero every parameter of each pruned unit, in place (§3.3, coordinated across gates).

    For a pruned unit j: its rows of W_ih and W_hh in all 4 gates, its W_hh column, its entries
    of ``bias_ih``/``bias_hh`` and its output-projection column. Re-apply after every optimizer
    step during masked finetuning (:func:`mask_hook`).

    Returns:
        ``model``.
    """
    subs = _subs(model)
    _check_masks(subs, masks)
    for l, (_, sub) in enumerate(subs):
        for n, d, lstm, sl, orig in _iter_lstms(sub):
            if lstm.hidden_size == 0:
                continue
            w = lstm.weight_ih_l0
            m = masks[l, n, d].to(w.device)[orig.to(w.device)].to(w.dtype)  # (h,) over local units
            m4 = m.repeat(4)  # (4h,): the same unit in every gate
            lstm.weight_ih_l0.mul_(m4[:, None])
            lstm.weight_hh_l0.mul_(m4[:, None]).mul_(m[None, :])  # rows and column
            if sub.bias:
                lstm.bias_ih_l0.mul_(m4)
                lstm.bias_hh_l0.mul_(m4)
            sub.out_proj.weight[:, sl].mul_(m[None, :])
    return model


def mask_hook(masks: torch.Tensor) -> Callable[[nn.Module], None]:
    """A training hook ``hook(model)`` (``fit(hooks=...)``) that re-applies ``masks`` (masked finetuning, §3.3)."""

    on_device: dict[torch.device, torch.Tensor] = {}  # the masks copied to the model's device once, not every step

    def hook(model: nn.Module) -> None:
        dev = next(model.parameters()).device
        apply_masks(model, on_device.setdefault(dev, masks.to(dev)))

    return hook


def retention(masks: torch.Tensor) -> torch.Tensor:
    """Fraction of the U original units kept, ``(layer, head, direction)`` (Fig. 4, 7, 8)."""
    return masks.to(torch.float32).mean(-1)


def shrink(model: nn.Module, masks: torch.Tensor) -> nn.Module:
    """A physically smaller copy: each (head, direction) LSTM keeps only its masked-in units.

    It computes exactly what ``apply_masks(copy, masks)`` computes (module docstring).
    """
    model = copy.deepcopy(_unwrap(model))
    subs = _subs(model)
    _check_masks(subs, masks)
    for l, (i, sub) in enumerate(subs):
        model.blocks[i].attn = sub.pruned(masks[l])
    return model


def load_pruned_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> nn.Module:
    """Load a (possibly shrunk) FAR checkpoint into an unpruned FAR ``model`` of the same size.

    Each substitute is first shrunk to the units recorded in ``blocks.{i}.attn.kept``; the model
    is modified in place and returned.
    """
    model = _unwrap(model)
    for i, sub in substitutes(model):
        kept = state_dict.get(f"blocks.{i}.attn.kept")
        if kept is not None and not torch.equal(kept.cpu().bool(), sub.kept):
            model.blocks[i].attn = sub.pruned(kept)
    model.load_state_dict(state_dict, strict=strict)
    return model
