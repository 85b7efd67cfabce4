"""Linear CKA (biased and debiased) and HSIC of two feature sets, in float64: the one implementation.

Centered kernel alignment (Kornblith et al. 2019, "Similarity of Neural Network Representations
Revisited") compares two sets of features of the same n examples, X ∈ R^{n×d₁} and Y ∈ R^{n×d₂}:

    CKA(X, Y) = HSIC(K, L) / √(HSIC(K, K) · HSIC(L, L)),     K = X Xᵀ,  L = Y Yᵀ  (linear kernels).

- **biased** (Gretton et al. 2005): HSIC_b(K, L) = tr(K H L H) / (n − 1)², H = I − 11ᵀ/n. With
  column-centred features this is ‖Xᵀ Y‖²_F / (n − 1)², so CKA_b = ‖XᵀY‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F).
  It is biased upwards for finite n: two *independent* random feature sets of width d ≈ n have
  CKA_b far from 0.
- **debiased** (the unbiased HSIC estimator of Song et al. 2012, used for CKA by Nguyen, Raghu &
  Kornblith 2021, "Do Wide and Deep Networks Learn the Same Things?"): with K̃, L̃ the kernels with
  their diagonals set to 0,

      HSIC_u(K, L) = [tr(K̃ L̃) + (1ᵀK̃1)(1ᵀL̃1) / ((n−1)(n−2)) − 2/(n−2) · 1ᵀK̃L̃1] / (n(n−3)).

  The estimator is invariant to translating the features, so we centre them first; then K1 = 0
  and, with r_i = ‖x_i‖² and s_i = ‖y_i‖², it needs no n×n matrix:

      n(n−3) · HSIC_u = ‖XᵀY‖²_F − n/(n−2) · rᵀs + ‖X‖²_F ‖Y‖²_F / ((n−1)(n−2))

  (Kornblith's feature-space form). The factor n(n−3) cancels in the ratio. Debiased CKA of
  independent features is ≈ 0; it can be slightly negative, and for tiny n a debiased
  self-HSIC can be ≤ 0, in which case CKA is NaN.

Everything is computed in float64 (the terms above cancel heavily), on the device of the inputs.
Cost per pair O(n·d₁·d₂); per layer the centred features and self-HSICs are computed once.

Used by :mod:`methods.nondeep` (branch similarity) and the workbench's comparison (``workbench.analysis.cka``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import torch

__all__ = ["Estimator", "ESTIMATORS", "Prepared", "prepare", "prepared_cka", "linear_cka", "hsic", "cka_matrix"]

Estimator = Literal["debiased", "biased"]
ESTIMATORS: tuple[str, ...] = ("debiased", "biased")


def _as64(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.ndim != 2:
        raise ValueError(f"CKA features must be (n, d), got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError("CKA features contain NaN or inf")
    return t.to(torch.float64)


@dataclass(frozen=True)
class Prepared:
    """Centred float64 features with what every HSIC of them needs."""

    x: torch.Tensor  # (n, d) column-centred
    rows: torch.Tensor  # (n,) ‖x_i‖²
    total: float  # ‖X‖²_F
    self_hsic: dict[str, float]  # estimator -> HSIC(K, K) (scaled as in _hsic)


def prepare(x: torch.Tensor | np.ndarray) -> Prepared:
    """``(n, d)`` features centred in float64, with their self-HSICs (computed once per feature set)."""
    x = _as64(x)
    x = x - x.mean(0, keepdim=True)
    rows = (x * x).sum(1)
    gram = x.T @ x  # (d, d)
    xtx = float((gram * gram).sum())
    p = Prepared(x, rows, float(rows.sum()), {})
    for est in ESTIMATORS:
        p.self_hsic[est] = _hsic(xtx, p, p, est)
    return p


def _hsic(xty_sq: float, a: Prepared, b: Prepared, estimator: str) -> float:
    """HSIC from ‖XᵀY‖²_F of centred features: biased ``‖XᵀY‖²``, debiased ``n(n−3)·HSIC_u`` (module docstring)."""
    n = a.x.shape[0]
    if estimator == "biased":
        return xty_sq
    if estimator != "debiased":
        raise ValueError(f"estimator must be 'debiased' or 'biased', got {estimator!r}")
    if n < 4:  # the estimator divides by n − 3 and n − 2
        return float("nan")
    return xty_sq - n / (n - 2) * float(a.rows @ b.rows) + a.total * b.total / ((n - 1) * (n - 2))


def _check_n(n: int, estimator: str) -> None:
    if estimator == "debiased" and n < 4:
        raise ValueError(f"debiased HSIC needs at least 4 examples, got {n}")


def prepared_cka(a: Prepared, b: Prepared, estimator: str) -> float:
    """CKA of two :func:`prepare`-d feature sets (NaN when a self-HSIC is not positive)."""
    if a.x.shape[0] != b.x.shape[0]:
        raise ValueError(f"CKA needs the same examples in both: {a.x.shape[0]} vs {b.x.shape[0]} rows")
    xty = a.x.T @ b.x.to(a.x.device)  # (d1, d2)
    num = _hsic(float((xty * xty).sum()), a, b, estimator)
    den = a.self_hsic[estimator] * b.self_hsic[estimator]
    return num / np.sqrt(den) if den > 0 else float("nan")


def hsic(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray, *, estimator: Estimator = "debiased") -> float:
    """HSIC of linear kernels: biased ``tr(KHLH)/(n−1)²`` or the unbiased estimator of Song et al. 2012.

    Args:
        x: features ``(n, d1)``.
        y: features ``(n, d2)`` of the same n examples.
        estimator: ``"debiased"`` or ``"biased"``.
    """
    a, b = prepare(x), prepare(y)
    n = a.x.shape[0]
    _check_n(n, estimator)
    if b.x.shape[0] != n:
        raise ValueError(f"HSIC needs the same examples in both: {n} vs {b.x.shape[0]} rows")
    xty = a.x.T @ b.x
    raw = _hsic(float((xty * xty).sum()), a, b, estimator)
    return raw / (n - 1) ** 2 if estimator == "biased" else raw / (n * (n - 3))


def linear_cka(x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray, *,
               estimator: Estimator = "debiased") -> float:
    """Linear CKA of two feature sets of the same n examples, in float64 (module docstring).

    Args:
        x: ``(n, d1)``.
        y: ``(n, d2)``.
        estimator: ``"debiased"`` (Nguyen et al. 2021) or ``"biased"`` (Kornblith et al. 2019).

    Returns:
        CKA in [0, 1] (debiased: may be slightly below 0); NaN if a self-HSIC is not positive
        (constant features, or a debiased estimate at tiny n).

    Raises:
        ValueError: different numbers of examples, non-finite values, or fewer than 4 examples for
            the debiased estimator.
    """
    a, b = prepare(x), prepare(y)
    _check_n(a.x.shape[0], estimator)
    return prepared_cka(a, b, estimator)


def cka_matrix(xs: Sequence[torch.Tensor | np.ndarray], ys: Sequence[torch.Tensor | np.ndarray], *,
               estimators: Sequence[str] = ESTIMATORS) -> np.ndarray:
    """CKA of every pair ``(xs[i], ys[j])``, ``(len(estimators), len(xs), len(ys))`` float64.

    Each feature set is centred once; the cross term ``XᵀY`` is computed once per pair for all estimators.
    """
    px, py = [prepare(x) for x in xs], [prepare(y) for y in ys]
    out = np.full((len(estimators), len(px), len(py)), np.nan)
    for i, a in enumerate(px):
        for j, b in enumerate(py):
            for e, est in enumerate(estimators):
                out[e, i, j] = prepared_cka(a, b, est)
    return out
