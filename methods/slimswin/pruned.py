"""Pruned inference: window attention that skips pruned window-head pairs (SlimSwin §IV-C, Fig. 3).

SlimSwin (Eryilmaz & Akturk) applies its static masks at inference by "decompos[ing] the projection
weights into per-head blocks before the attention operation and selectively apply[ing] these
head-specific weights to each window according to the saliency mask" (§IV-C). This module does that
for timm Swin Transformers, in three phases per layer:

1. **QKV projection.** The active pairs (a ``(W, H)`` bool mask) are partitioned into *rectangles*
   ``windows x heads`` (:func:`pair_rectangles`): one per distinct active-head set
   (``"window_groups"``: windows with the same heads share one GEMM) or one per distinct
   active-window set (``"head_groups"``: heads active in the same windows share one GEMM). Each
   rectangle gathers its windows and multiplies them with the QKV weight rows of its heads only
   (``1/sqrt(d)`` folded into the Q rows).
2. **Attention** of all active pairs of the layer at once: one ``baddbmm`` (pre-added relative
   position bias + shift mask per pair), one softmax, one ``bmm``.
3. **Output projection**, with its own rectangle partition: each rectangle multiplies its pairs'
   outputs with the projection columns of its heads only and scatter-adds (``index_add_``) into the
   output, which starts at the projection bias (a window without active heads outputs ``proj(0)``,
   exactly as a gated model with all its gates at 0).

``strategy="auto"`` picks, for phases 1 and 3 independently, the cheapest of those two partitions
and a greedy cover, by estimated single-thread CPU time (:func:`rectangle_cost`: GEMM efficiency
fitted on this project's 2-core CPU, plus a per-kernel launch cost). Short or narrow GEMMs (a few
49-token windows, one 32-channel head) are what keep pruned attention from being as fast as its
MAC count: on Swin-T at batch 1 about 60 % of the MAC reduction becomes time at r = 0.33 and
about 85 % at r = 0.67 (``benchmarks/slimswin_latency.py``).

The result equals the gated model with the same 0/1 gates up to rounding (both gate modes compute
the same function at 0/1) and performs exactly the MACs counted by :func:`.macs.attention_macs`.
Converted weights are frozen copies (buffers): the pruned model is for inference; fine-tune the
gated model and convert again.
"""

from __future__ import annotations

import copy
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from timm.models.swin_transformer import WindowAttention
from torch import nn

from .gates import GatedWindowAttention, get_masks
from .geometry import SwinLayerGeometry, check_swin, swin_blocks, swin_layers, validate_layer_list

__all__ = ["Strategy", "Rectangle", "PrunedWindowAttention", "pair_rectangles", "rectangle_cost", "to_pruned"]

Strategy = Literal["auto", "window_groups", "head_groups"]
Rectangle = tuple[list[int], list[int]]  # (window indices, head indices), every pair active

# GEMM model fitted on this project's CPU (single thread, float32): MAC/s = PEAK / ((1+a/M)(1+b/N)(1+c/K))
_PEAK_MACS, _GEMM_A, _GEMM_B, _GEMM_C = 59.5e9, 16.0, 12.6, 9.9
_KERNEL_S = 6e-6  # seconds per extra kernel launch (gather, reshape copy, scatter)


def _gemm_seconds(m: int, n: int, k: int) -> float:
    return m * n * k / _PEAK_MACS * (1 + _GEMM_A / m) * (1 + _GEMM_B / n) * (1 + _GEMM_C / k)


def rectangle_cost(rects: Sequence[Rectangle], phase: Literal["qkv", "proj"], num_windows: int, window_area: int,
                   dim: int, head_dim: int) -> float:
    """Estimated single-thread seconds of one phase of a layer computed over ``rects`` (one image).

    ``"qkv"``: per rectangle a gather (unless it covers all windows), a ``(G*N, C) x (C, 3*S*d)`` GEMM
    and a reshape copy. ``"proj"``: a gather of the pairs, a ``(G*N, S*d) x (S*d, C)`` GEMM and a scatter.
    """
    cost = 0.0
    for windows, heads in rects:
        rows, width = len(windows) * window_area, len(heads) * head_dim
        if phase == "qkv":
            cost += _gemm_seconds(rows, 3 * width, dim) + _KERNEL_S * (2 + (len(windows) < num_windows))
        else:
            cost += _gemm_seconds(rows, dim, width) + _KERNEL_S * 3
    return cost


def pair_rectangles(active: torch.Tensor, strategy: Strategy = "auto", phase: Literal["qkv", "proj"] = "qkv",
                    window_area: int = 49, dim: int = 96, head_dim: int = 32) -> list[Rectangle]:
    """Partition the active pairs of a ``(W, H)`` mask into ``(windows, heads)`` rectangles.

    Every active pair is in exactly one rectangle and every pair of a rectangle is active.

    Args:
        active: bool ``(num_windows, num_heads)``.
        strategy: ``"window_groups"`` (one rectangle per distinct non-empty active-head set),
            ``"head_groups"`` (one per distinct non-empty active-window set; with all sets distinct,
            one per head) or ``"auto"``: the lowest :func:`rectangle_cost` among those two and a greedy
            cover (repeatedly the maximal rectangle of lowest cost per pair); ties go to
            ``"window_groups"``.
        phase, window_area, dim, head_dim: what the partition is for; used by ``"auto"`` only.

    Returns:
        List of ``(window indices, head indices)``, both sorted, ordered by their first pair.
    """
    if strategy not in ("auto", "window_groups", "head_groups"):
        raise ValueError(f"strategy must be 'auto', 'window_groups' or 'head_groups', got {strategy!r}")
    active = active.bool().cpu()

    def group(matrix: torch.Tensor) -> list[tuple[list[int], list[int]]]:
        # rows of `matrix` with the same non-empty set of True columns -> (rows, columns)
        sets: dict[tuple[int, ...], list[int]] = {}
        for r, row in enumerate(matrix.tolist()):
            cols = tuple(c for c, on in enumerate(row) if on)
            if cols:
                sets.setdefault(cols, []).append(r)
        return [(rows, list(cols)) for cols, rows in sets.items()]

    def head_groups(matrix: torch.Tensor) -> list[tuple[list[int], list[int]]]:
        return sorted(((windows, heads) for heads, windows in group(matrix.T)), key=lambda r: (r[0][0], r[1][0]))

    if strategy == "window_groups":
        return group(active)
    if strategy == "head_groups":
        return head_groups(active)
    shape = (phase, active.shape[0], window_area, dim, head_dim)

    def greedy() -> list[Rectangle]:
        # set-cover heuristic: repeatedly take the maximal rectangle with the lowest cost per pair among
        # (windows having all heads of a head-set) and (heads active in all windows of a window-set)
        residual, rects = active.clone(), []
        while residual.any():
            candidates = []
            for _, heads in group(residual):
                windows = residual[:, heads].all(1).nonzero().flatten().tolist()
                candidates.append((windows, heads))
            for windows, _ in head_groups(residual):
                heads = residual[windows].all(0).nonzero().flatten().tolist()
                candidates.append((windows, heads))
            best = min(candidates, key=lambda r: (rectangle_cost([r], *shape) / (len(r[0]) * len(r[1])), r))
            rects.append(best)
            residual[torch.tensor(best[0])[:, None], torch.tensor(best[1])[None, :]] = False
        return sorted(rects, key=lambda r: (r[0][0], r[1][0]))

    options = [group(active), head_groups(active), greedy()]
    return min(options, key=lambda rects: rectangle_cost(rects, *shape))  # first wins ties


def _index(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


class PrunedWindowAttention(nn.Module):
    """Drop-in replacement for a timm ``WindowAttention`` that computes only active window-head pairs.

    Pairs are numbered, for one image, in *QKV order*: QKV rectangle by rectangle, (window, head)
    row-major inside each. With a batch of ``B`` images a QKV rectangle of ``G x S`` pairs yields
    ``B*G*S`` pairs ordered (image, window, head).
    """

    def __init__(self, attn: nn.Module, active: torch.Tensor, geometry: SwinLayerGeometry,
                 shift_mask: torch.Tensor | None = None, strategy: Strategy = "auto"):
        """Slice the weights of ``attn`` for the active pairs.

        Args:
            attn: timm ``WindowAttention`` or :class:`.gates.GatedWindowAttention` (gates must be 1).
            active: bool ``(num_windows, num_heads)``, True = computed.
            geometry: the layer's :class:`.geometry.SwinLayerGeometry`.
            shift_mask: the block's static ``attn_mask`` ``(W, N, N)`` to pre-add to the attention
                bias (None for unshifted blocks, or for ``dynamic_mask`` models: then the runtime
                mask is added at every call).
            strategy: see :func:`pair_rectangles`; ``"auto"`` chooses per phase.
        """
        super().__init__()
        if not isinstance(attn, (WindowAttention, GatedWindowAttention)):
            raise ValueError(f"layer {geometry.layer}: cannot prune {type(attn).__name__}")
        active = active.bool().cpu()
        nw, nh, d, c = geometry.num_windows, geometry.num_heads, geometry.head_dim, geometry.dim
        n = attn.window_area
        self.layer, self.num_windows, self.num_heads, self.head_dim, self.dim = geometry.layer, nw, nh, d, c
        self.window_size, self.window_area = attn.window_size, n
        self.mask_baked = shift_mask is not None
        self.dense = bool(active.all())  # every pair active: one rectangle per phase, no gather / scatter
        self.register_buffer("active", active.clone())  # (W, H) True = computed
        shape = (n, c, d)
        self.qkv_rects = pair_rectangles(active, strategy, "qkv", *shape)
        self.proj_rects = pair_rectangles(active, strategy, "proj", *shape)
        self.same_partition = self.qkv_rects == self.proj_rects
        self._cache: dict[tuple, list[torch.Tensor]] = {}

        def head_channels(heads: list[int]) -> torch.Tensor:
            return (_index(heads)[:, None] * d + torch.arange(d)).reshape(-1)  # (S*d,) channels of the heads

        with torch.no_grad():
            rel = attn.relative_position_bias_table[attn.relative_position_index.view(-1)]  # (N*N, H)
            rel = rel.view(n, n, nh).permute(2, 0, 1)  # (H, N, N)
            qkv_w, qkv_b, biases, pair_id, start = [], [], [], torch.full((nw, nh), -1), 0
            for windows, heads in self.qkv_rects:
                cols = head_channels(heads)
                rows = torch.cat([cols + part * nh * d for part in range(3)])  # (3*S*d,) q, k, v rows
                weight = attn.qkv.weight[rows].clone()  # (3*S*d, C)
                weight[: len(cols)] *= attn.scale  # fold the 1/sqrt(d) of q into its rows
                qkv_w.append(weight)
                if attn.qkv.bias is not None:
                    bias = attn.qkv.bias[rows].clone()  # (3*S*d,)
                    bias[: len(cols)] *= attn.scale
                    qkv_b.append(bias)
                bias = rel[_index(heads)][None]  # (1, S, N, N)
                if shift_mask is not None:
                    bias = bias + shift_mask[_index(windows)][:, None].to(rel)  # (G, S, N, N)
                biases.append(bias.contiguous())
                g, s = len(windows), len(heads)
                pair_id[_index(windows)[:, None], _index(heads)[None, :]] = start + torch.arange(g * s).view(g, s)
                start += g * s
            for i, (w, b) in enumerate(zip(qkv_w, qkv_b or [None] * len(qkv_w))):
                self.register_buffer(f"qkv_weight_{i}", w.contiguous())
                self.register_buffer(f"qkv_bias_{i}", b)
                self.register_buffer(f"attn_bias_{i}", biases[i])  # (G or 1, S, N, N)
            for i, (_windows, heads) in enumerate(self.proj_rects):
                self.register_buffer(f"proj_weight_{i}", attn.proj.weight[:, head_channels(heads)].contiguous())
            pair_bias = [b.expand(len(w), len(h), n, n).reshape(-1, n, n) for b, (w, h) in zip(biases, self.qkv_rects)]
            self.register_buffer(  # (P, N, N): attention bias of every pair of one image, in QKV order
                "pair_bias", torch.cat(pair_bias) if pair_bias else rel.new_zeros(0, n, n), persistent=False)
            proj_bias = attn.proj.bias if attn.proj.bias is not None else attn.proj.weight.new_zeros(c)
            self.register_buffer("proj_bias", proj_bias.detach().clone())  # (C,)
        self.register_buffer("pair_id", pair_id, persistent=False)  # (W, H) QKV-order pair number, -1 if pruned

    def extra_repr(self) -> str:
        return (f"layer={self.layer}, active_pairs={int(self.active.sum())}/{self.active.numel()}, "
                f"qkv_rectangles={len(self.qkv_rects)}, proj_rectangles={len(self.proj_rects)}")

    def _indices(self, batch: int, device: torch.device) -> list[torch.Tensor]:
        """Per-batch index tensors: rows of each QKV rectangle, then rows and pair ids of each proj one."""
        key = (batch, device)
        if key not in self._cache:
            nw = self.num_windows
            offsets = torch.arange(batch)[:, None] * nw  # (B, 1)
            sizes = torch.tensor([len(w) * len(h) for w, h in self.qkv_rects])  # pairs per QKV rectangle
            starts = torch.cumsum(sizes, 0) - sizes
            rect_of = torch.repeat_interleave(torch.arange(len(sizes)), sizes)  # (P,) QKV rectangle of each pair
            out = [(offsets + _index(w)[None]).reshape(-1) for w, _ in self.qkv_rects]  # (B*G,) input rows
            for windows, heads in self.proj_rects:
                out.append((offsets + _index(windows)[None]).reshape(-1))  # (B*G,) output rows
                ids = self.pair_id.cpu()[_index(windows)][:, _index(heads)].reshape(-1)  # (G*S,) one-image ids
                r = rect_of[ids]
                # id in a batch of B: rectangle offset B*start, image b after b*size pairs, then local id
                out.append((batch * starts[r] + torch.arange(batch)[:, None] * sizes[r] + ids - starts[r]).reshape(-1))
            self._cache[key] = [t.to(device) for t in out]
        return self._cache[key]

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int,
                   mask: torch.Tensor | None) -> torch.Tensor:
        """Attention of all pairs, each ``(P_B, N, d)`` (q pre-scaled); returns ``(P_B, N, d)``."""
        if batch == 1 and mask is None:
            attn = torch.baddbmm(self.pair_bias, q, k.transpose(1, 2))  # (P, N, N)
        else:
            attn = torch.bmm(q, k.transpose(1, 2))  # (P_B, N, N)
            start, n = 0, self.window_area
            for i, (windows, heads) in enumerate(self.qkv_rects):  # bias (+ runtime shift mask) per rectangle
                g, s = len(windows), len(heads)
                part = attn[start: start + batch * g * s].view(batch, g, s, n, n)  # (B, G, S, N, N)
                part += getattr(self, f"attn_bias_{i}")
                if mask is not None:
                    part += mask[_index(windows).to(mask.device)][None, :, None]  # (1, G, 1, N, N)
                start += batch * g * s
        return torch.bmm(attn.softmax(dim=-1), v)  # (P_B, N, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Window attention over the active pairs only.

        Args:
            x: ``(B * W, N, C)`` windows, batch outermost (timm ``window_partition`` order).
            mask: the block's shift mask ``(W, N, N)`` or None (ignored when pre-added).

        Returns:
            ``(B * W, N, C)``.
        """
        bw, n, c = x.shape
        nw, d = self.num_windows, self.head_dim
        if bw % nw or (mask is not None and mask.shape[0] != nw):
            raise ValueError(f"layer {self.layer}: pruned attention was built for {nw} windows per image, "
                             f"got {bw} windows; the input size changed")
        batch = bw // nw
        mask = None if self.mask_baked else mask
        out = self.proj_bias.expand(bw, n, c).clone()  # windows without heads output proj(0) = bias
        if not self.qkv_rects:
            return out
        index = self._indices(batch, x.device)
        qkv = x.new_empty(3, batch * self.pair_bias.shape[0], n, d)  # (3, P_B, N, d) q, k, v of every pair
        start = 0
        for i, (_windows, heads) in enumerate(self.qkv_rects):
            xr = x if self.dense else x.index_select(0, index[i])  # (B*G, N, C)
            t = F.linear(xr, getattr(self, f"qkv_weight_{i}"), getattr(self, f"qkv_bias_{i}"))  # (B*G, N, 3*S*d)
            size = xr.shape[0] * len(heads)
            qkv[:, start: start + size].view(3, -1, len(heads), n, d).copy_(  # (3, B*G, S, N, d)
                t.view(-1, n, 3, len(heads), d).permute(2, 0, 3, 1, 4))
            start += size
        q, k, v = qkv.unbind(0)  # each (P_B, N, d)
        pairs = self._attention(q, k, v, batch, mask)  # (P_B, N, d)
        start, base = 0, len(self.qkv_rects)
        for i, (_windows, heads) in enumerate(self.proj_rects):
            rows, ids = index[base + 2 * i], index[base + 2 * i + 1]
            s = len(heads)
            if self.same_partition:  # pairs of this rectangle are contiguous
                o = pairs[start: start + len(ids)]
                start += len(ids)
            else:
                o = pairs.index_select(0, ids)  # (B*G*S, N, d)
            o = o.view(-1, s, n, d).transpose(1, 2).reshape(-1, n, s * d)  # (B*G, S, N, d) -> (B*G, N, S*d)
            y = F.linear(o, getattr(self, f"proj_weight_{i}"))  # (B*G, N, C)
            if self.dense:
                out += y
            else:
                out.index_add_(0, rows, y)
        return out


def to_pruned(model: nn.Module, masks: Sequence[torch.Tensor] | None = None, strategy: Strategy = "auto") -> nn.Module:
    """Copy of a Swin whose attention layers compute only the active window-head pairs.

    Args:
        model: timm ``SwinTransformer``, plain or gated (its gates must all be 1: soft gates cannot be
            folded into per-window weights; the masks carry the pruning). Left unchanged.
        masks: one bool / 0-1 ``(num_windows, num_heads)`` per layer; default: the model's own
            (:func:`.gates.get_masks`; all active for a plain model).
        strategy: rectangle partition of each layer's active pairs (:func:`pair_rectangles`).

    Returns:
        A deep copy (same timm class, eval mode) with every ``block.attn`` a :class:`PrunedWindowAttention`.

    Raises:
        ValueError: not a timm Swin, already pruned, soft gates, or masks of the wrong number/shape.
    """
    check_swin(model)
    layers = swin_layers(model)
    masks = get_masks(model) if masks is None else list(masks)
    validate_layer_list(masks, layers, "masks")
    for geo, block in zip(layers, swin_blocks(model)):
        if isinstance(block.attn, PrunedWindowAttention):
            raise ValueError(f"layer {geo.layer} is already pruned")
        if isinstance(block.attn, GatedWindowAttention) and not torch.all(block.attn.gate == 1):
            raise ValueError(f"layer {geo.layer}: gate values other than 1 cannot be converted; use set_mask for pruning")
    pruned = copy.deepcopy(model)
    for geo, block, mask in zip(layers, swin_blocks(pruned), masks):
        if not torch.all((mask == 0) | (mask == 1)):
            raise ValueError(f"mask of layer {geo.layer} must be bool or hold only 0/1 values")
        shift_mask = None if getattr(block, "dynamic_mask", False) else block.attn_mask
        block.attn = PrunedWindowAttention(block.attn, mask.bool().cpu(), geo, shift_mask, strategy)
    return pruned.eval()
