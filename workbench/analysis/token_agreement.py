"""Token-map agreement per layer and head: a teacher's attention against a student's token maps.

Generalises :mod:`workbench.analysis.token_maps` (FAR's maps, head-averaged, ViT layout only) to any
pair of models with token-to-token maps of the same layout — ViT ``(B, heads, T, T)`` and Swin
window attention ``(B·windows, heads, N, N)`` — per head as well as head-averaged. The student's
map of a block is its attention probabilities (``*.attn.hook_pattern``, read with
:func:`methods.hooks.run_with_cache`; for sparse attention the sparse probabilities) or, for an
attention-free block (FAR's BiLSTM), its gradient-saliency dependency
(``workbench.analysis.get_extractor("dependency")``, see :mod:`workbench.analysis.dependency`).

Maps are brought to ``(B, heads, rows, keys)``: a ViT's rows are its query tokens; Swin's rows are
(window, query-in-window) pairs, ``rows = windows·N``. Every row is normalised to sum to 1 over the
keys (attention rows already do; saliency rows are gradient norms), so both read as "the query's
share of dependence on each key". Per row, then averaged over rows (NaN rows — all-zero saliency —
left out):

- ``js`` — Jensen–Shannon divergence, base 2, in [0, 1] (0 = identical rows);
- ``topk`` — share of the k keys with the highest values that the two rows have in common
  (k = ``topk`` × keys, at least 1; ties: lower key index first);
- ``spearman`` — Spearman rank correlation of the two rows (average ranks for ties, which matter for
  sparse attention's zeros; NaN for a constant row).

Per head where the two maps have the same number of heads (heads are compared by index — whether
they correspond is for the reader to judge: FAR's heads were distilled jointly, not one to one);
head-averaged (the mean of the heads' normalised rows, still a distribution) always. Differences
from :func:`workbench.analysis.token_maps.agreement`: its ``spearman`` ranks the whole T×T map at
once, ours ranks each row (so every query counts equally), and it has no per-head scores.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
from einops import rearrange
from scipy.stats import rankdata

from methods.hooks import run_with_cache

__all__ = ["METRICS", "row_js", "row_topk_overlap", "row_spearman", "normalise_rows", "token_map_agreement",
           "attention_maps", "saliency_maps", "block_of"]

METRICS: tuple[str, ...] = ("js", "topk", "spearman")
_PATTERN = re.compile(r"^(?P<block>.+)\.attn\.hook_pattern$")


def block_of(hook_name: str) -> str | None:
    """The block prefix of an attention hook name: ``blocks.3.attn.hook_pattern`` -> ``blocks.3``."""
    m = _PATTERN.match(hook_name)
    return m.group("block") if m else None


def normalise_rows(maps: torch.Tensor) -> torch.Tensor:
    """Rows summing to 1 over the last axis, float64; all-zero rows become NaN."""
    m = maps.double()
    total = m.sum(-1, keepdim=True)
    return torch.where(total > 0, m / total.where(total > 0, torch.ones_like(total)), torch.full_like(m, float("nan")))


def row_js(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen–Shannon divergence (base 2) of distributions along the last axis."""
    m = 0.5 * (p + q)

    def kl(x: torch.Tensor) -> torch.Tensor:
        ratio = torch.where(x > 0, x / m.where(m > 0, torch.ones_like(m)), torch.ones_like(x))
        return (x * torch.log2(ratio)).sum(-1)

    return (0.5 * kl(p) + 0.5 * kl(q)).clamp_min(0)


def row_topk_overlap(p: torch.Tensor, q: torch.Tensor, k: int) -> torch.Tensor:
    """Share of the top-``k`` keys (last axis) two rows have in common (ties: lower index first)."""
    if not 1 <= k <= p.shape[-1]:
        raise ValueError(f"k must be in 1..{p.shape[-1]}, got {k}")
    tp = torch.sort(-p, dim=-1, stable=True).indices[..., :k]
    tq = torch.sort(-q, dim=-1, stable=True).indices[..., :k]
    hit = torch.zeros(p.shape, dtype=torch.bool, device=p.device).scatter_(-1, tp, True)
    return hit.gather(-1, tq).double().sum(-1) / k


def row_spearman(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Spearman rank correlation of rows (last axis), average ranks for ties; NaN for a constant row."""
    rp = torch.from_numpy(rankdata(p.cpu().numpy(), axis=-1))
    rq = torch.from_numpy(rankdata(q.cpu().numpy(), axis=-1))
    rp, rq = rp - rp.mean(-1, keepdim=True), rq - rq.mean(-1, keepdim=True)
    den = (rp.square().sum(-1) * rq.square().sum(-1)).sqrt()
    return torch.where(den > 0, (rp * rq).sum(-1) / den.where(den > 0, torch.ones_like(den)),
                       torch.full_like(den, float("nan"))).to(p.device)


def _scores(p: torch.Tensor, q: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    """Row scores averaged over rows: ``(..., rows, keys) -> (...)`` per metric (NaN rows left out)."""
    ok = ~(p.isnan().any(-1) | q.isnan().any(-1))  # (..., rows)
    p0, q0 = torch.nan_to_num(p), torch.nan_to_num(q)
    rows = {"js": row_js(p0, q0), "topk": row_topk_overlap(p0, q0, k), "spearman": row_spearman(p0, q0)}
    return {name: torch.where(ok, v, torch.full_like(v, float("nan"))).nanmean(-1) for name, v in rows.items()}


def token_map_agreement(teacher: torch.Tensor, student: torch.Tensor, *, topk: float = 0.1
                        ) -> dict[str, np.ndarray]:
    """Agreement of two models' maps of one block (module docstring).

    Args:
        teacher: ``(B, heads_t, rows, keys)`` token maps (any non-negative values; rows are normalised here).
        student: ``(B, heads_s, rows, keys)`` for the same images.
        topk: k of the top-k overlap as a fraction of the keys (at least 1 key).

    Returns:
        For each metric in :data:`METRICS`: ``metric`` ``(B, heads_t)`` per head (NaN when the
        head counts differ) and ``metric + "_avg"`` ``(B,)`` on the head-averaged maps; float64.

    Raises:
        ValueError: the maps differ in batch, rows or keys.
    """
    if teacher.shape[0] != student.shape[0] or teacher.shape[2:] != student.shape[2:]:
        raise ValueError(f"token maps do not line up: teacher {tuple(teacher.shape)} vs student {tuple(student.shape)} "
                         "(need the same images, rows and keys)")
    k = max(1, int(round(topk * teacher.shape[-1])))
    t, s = normalise_rows(teacher), normalise_rows(student.to(teacher.device))
    out: dict[str, np.ndarray] = {}
    avg = _scores(t.mean(1), s.mean(1), k)  # head average of normalised rows: (B, rows, keys)
    if t.shape[1] == s.shape[1]:
        per_head = _scores(t, s, k)
    else:
        per_head = {m: torch.full(t.shape[:2], float("nan"), dtype=torch.float64) for m in METRICS}
    for m in METRICS:
        out[m] = per_head[m].cpu().numpy()
        out[f"{m}_avg"] = avg[m].cpu().numpy()
    return out


@torch.no_grad()
def attention_maps(model: nn.Module, images: torch.Tensor, *, batch_size: int = 64) -> dict[str, torch.Tensor]:
    """Every block's attention probabilities as ``{block prefix: (B, heads, rows, keys)}`` (float32, CPU).

    A ViT's ``(B, heads, T, T)`` is kept; Swin's ``(B·windows, heads, N, N)`` becomes
    ``(B, heads, windows·N, N)``. Blocks without ``*.attn.hook_pattern`` are absent.
    """
    parts: dict[str, list[torch.Tensor]] = {}
    for start in range(0, len(images), batch_size):
        x = images[start:start + batch_size]
        _, cache = run_with_cache(model, x, names="*.attn.hook_pattern", stop_early=True)
        for name, p in cache.items():
            block = block_of(name)
            if block is None:
                continue
            if p.shape[0] != x.shape[0]:  # windowed: (b·windows, heads, N, N)
                if p.shape[0] % x.shape[0]:
                    raise RuntimeError(f"{name}: {p.shape[0]} attention rows-blocks for {x.shape[0]} images")
                p = rearrange(p, "(b w) h q k -> b h (w q) k", b=x.shape[0])
            parts.setdefault(block, []).append(p.float().cpu())
    return {k: torch.cat(v) for k, v in parts.items()}


def saliency_maps(model: nn.Module, images: torch.Tensor, layers: Sequence[int]) -> dict[str, torch.Tensor]:
    """Gradient-saliency dependency of a timm ViT / FAR model's blocks ``layers``: ``{"blocks.{i}": (B, heads, T, T)}``.

    Uses the registered ``dependency`` extractor (all queries, its fastest exact method).
    """
    from workbench.analysis import get_extractor

    if not layers:
        return {}
    ds = get_extractor("dependency")(model, images, layers=list(layers))
    dep = torch.from_numpy(ds["dependency"].transpose("layer", "sample", "head", "query", "key").values)
    return {f"blocks.{int(i)}": dep[j] for j, i in enumerate(ds["layer"].values)}
