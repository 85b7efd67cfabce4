"""Window x head gates for timm Swin attention (SlimSwin §IV-C, Fig. 2; Michel et al. 2019 for comparison).

SlimSwin (Eryilmaz & Akturk) estimates the importance of each (window, head) pair of every Swin
attention layer by "multiply[ing] the query (Q), key (K), and value (V) tensors by a learnable
binary gating tensor of shape W x H" set to all ones during the saliency backward pass (§IV-C).
:func:`add_gates` installs such a gate in every ``SwinTransformerBlock`` by replacing its
``WindowAttention`` with a :class:`GatedWindowAttention` that shares the same parameters (state-dict
keys of the original weights do not change; ``attn.gate`` and ``attn.gate_mask`` are added).

Two gate placements (``mode``):

* ``"qkv"`` (the paper): ``q, k, v <- g * q, g * k, g * v`` per (window, head). The logits
  ``q k^T`` are then scaled by ``g^2`` while the relative position bias and shift mask are not, so
  ``dL/dg`` at ``g = 1`` is ``2 * (gradient through the attention logits) + (gradient through V)``:
  it measures the sensitivity to *sharpening/flattening* the head's attention pattern as well as
  to its output. With ``g = 0`` the head's logits reduce to bias + mask and ``V = 0``, so the head
  outputs exactly zero.
* ``"output"`` (Michel et al., "Are sixteen heads really better than one?", 2019): the head's
  output ``softmax(.) V`` is multiplied by ``g``; ``dL/dg`` is then only the gradient through the
  head output (their head importance).

With 0/1 gates both modes compute the same function (a gated-off head contributes zero before the
output projection), which is what pruned inference (:mod:`.pruned`) implements; they differ only
in the saliency they yield.

A gate has three factors: ``gate`` (an ``nn.Parameter`` of ones, frozen by default so an optimiser
over ``model.parameters()`` never changes it; unfreeze it for soft-gate experiments), ``gate_mask``
(the 0/1 pruning mask, a persistent buffer, saved with checkpoints) and an optional per-sample
``probe`` of shape ``(B, W, H)`` used by :func:`.saliency.window_head_saliency` to get per-sample
gate gradients from a single backward pass.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Literal, Sequence

import torch
from einops import rearrange
from timm.models.swin_transformer import WindowAttention
from torch import nn

from .geometry import SwinLayerGeometry, swin_blocks, swin_layers, validate_layer_list

__all__ = [
    "GateMode",
    "GatedWindowAttention",
    "add_gates",
    "gated_modules",
    "is_gated",
    "set_mask",
    "get_masks",
    "gate_probes",
]

GateMode = Literal["qkv", "output"]


class GatedWindowAttention(nn.Module):
    """timm ``WindowAttention`` with a ``(num_windows, num_heads)`` gate (SlimSwin §IV-C).

    Shares ``qkv``, ``proj`` and ``relative_position_bias_table`` with the wrapped module, so training
    either updates both. Computes attention like timm's non-fused path, with the gate applied to
    Q, K, V (``mode="qkv"``) or to the head output (``mode="output"``).
    """

    def __init__(self, attn: WindowAttention, num_windows: int, mode: GateMode = "qkv", layer: int = -1):
        """Wrap ``attn``.

        Args:
            attn: the block's timm ``WindowAttention``.
            num_windows: windows per image of the block (``SwinLayerGeometry.num_windows``).
            mode: ``"qkv"`` (paper) or ``"output"`` (Michel et al.).
            layer: the block's layer index, used in error messages.
        """
        super().__init__()
        if mode not in ("qkv", "output"):
            raise ValueError(f"gate mode must be 'qkv' or 'output', got {mode!r}")
        if not isinstance(attn, WindowAttention):
            raise ValueError(f"expected a timm WindowAttention, got {type(attn).__name__}")
        self.dim = attn.dim
        self.num_heads = attn.num_heads
        self.head_dim = attn.qkv.out_features // (3 * attn.num_heads)
        self.window_size = attn.window_size
        self.window_area = attn.window_area
        self.scale = attn.scale
        self.num_windows = num_windows
        self.mode: GateMode = mode
        self.layer = layer
        self.qkv = attn.qkv
        self.proj = attn.proj
        self.attn_drop = attn.attn_drop
        self.proj_drop = attn.proj_drop
        self.relative_position_bias_table = attn.relative_position_bias_table
        self.register_buffer("relative_position_index", attn.relative_position_index, persistent=False)
        weight = attn.qkv.weight
        ones = torch.ones(num_windows, attn.num_heads, dtype=weight.dtype, device=weight.device)
        self.gate = nn.Parameter(ones.clone(), requires_grad=False)  # (W, H) the paper's all-ones gate
        self.register_buffer("gate_mask", ones.clone())  # (W, H) 0/1 pruning mask, 1 = active
        self.probe: torch.Tensor | None = None  # (B, W, H) per-sample multiplier for saliency, or None

    def extra_repr(self) -> str:
        return f"layer={self.layer}, num_windows={self.num_windows}, num_heads={self.num_heads}, mode={self.mode!r}"

    def _rel_pos_bias(self) -> torch.Tensor:
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]  # (N*N, H)
        return rearrange(bias, "(n m) h -> 1 h n m", n=self.window_area)  # (1, H, N, N)

    def gate_values(self, batch: int) -> torch.Tensor:
        """Effective gate ``gate * gate_mask (* probe)`` of shape ``(batch, W, H)``."""
        g = (self.gate * self.gate_mask).unsqueeze(0).expand(batch, -1, -1)  # (B, W, H)
        if self.probe is not None:
            expected = (batch, self.num_windows, self.num_heads)
            if tuple(self.probe.shape) != expected:
                raise ValueError(f"layer {self.layer}: gate probe expected shape {expected}, got {tuple(self.probe.shape)}")
            g = g * self.probe
        return g

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Gated window attention.

        Args:
            x: windows ``(B * W, N, C)``, batch outermost as produced by timm's ``window_partition``.
            mask: shift mask ``(W, N, N)`` (0 / -100) or None.

        Returns:
            ``(B * W, N, C)``.
        """
        bw, n, _ = x.shape
        nw, nh = self.num_windows, self.num_heads
        if bw % nw or (mask is not None and mask.shape[0] != nw):
            raise ValueError(
                f"layer {self.layer}: gates were built for {nw} windows per image, but attention got "
                f"{bw} windows{'' if mask is None else f' and a shift mask for {mask.shape[0]}'}; "
                "the input size changed -- rebuild the gates for the new size"
            )
        qkv = self.qkv(x)  # (B*W, N, 3*H*d)
        q, k, v = rearrange(qkv, "bw n (three h d) -> three bw h n d", three=3, h=nh).unbind(0)  # each (B*W, H, N, d)
        g = rearrange(self.gate_values(bw // nw), "b w h -> (b w) h 1 1")  # (B*W, H, 1, 1)
        if self.mode == "qkv":
            q, k, v = q * g, k * g, v * g
        attn = (q * self.scale) @ k.transpose(-2, -1)  # (B*W, H, N, N)
        attn = attn + self._rel_pos_bias()
        if mask is not None:
            attn = rearrange(attn, "(b w) h n m -> b w h n m", w=nw) + mask[None, :, None]  # (B, W, H, N, N)
            attn = rearrange(attn, "b w h n m -> (b w) h n m")
        attn = self.attn_drop(attn.softmax(dim=-1))
        out = attn @ v  # (B*W, H, N, d)
        if self.mode == "output":
            out = out * g
        out = rearrange(out, "bw h n d -> bw n (h d)")  # (B*W, N, H*d)
        return self.proj_drop(self.proj(out))


def is_gated(model: nn.Module) -> bool:
    """Whether :func:`add_gates` has been applied to ``model`` (a timm Swin)."""
    return all(isinstance(block.attn, GatedWindowAttention) for block in swin_blocks(model))


def add_gates(model: nn.Module, mode: GateMode = "qkv") -> nn.Module:
    """Install an all-ones ``(num_windows, num_heads)`` gate in every attention layer, in place.

    Works for any timm (v1) ``SwinTransformer``: window counts follow each block's (clamped) window
    size and padding; a stage whose resolution is not larger than the window has one unshifted window.

    Args:
        model: a timm ``SwinTransformer`` built with ``pretrained=False`` or loaded from a checkpoint.
        mode: ``"qkv"`` gates Q, K and V (SlimSwin §IV-C); ``"output"`` gates the head output
            (Michel et al. 2019). See the module docstring for how their gradients differ.

    Returns:
        ``model`` (modified in place).

    Raises:
        ValueError: ``model`` is not a timm Swin, is already gated, or ``mode`` is unknown.
    """
    if mode not in ("qkv", "output"):
        raise ValueError(f"gate mode must be 'qkv' or 'output', got {mode!r}")
    blocks = swin_blocks(model)
    for geo, block in zip(swin_layers(model), blocks):
        if not isinstance(block.attn, WindowAttention):
            raise ValueError(
                f"layer {geo.layer} already has {type(block.attn).__name__}; add_gates needs plain timm "
                "WindowAttention (gate a fresh or loaded model, not a gated or pruned one)"
            )
    for geo, block in zip(swin_layers(model), blocks):
        block.attn = GatedWindowAttention(block.attn, geo.num_windows, mode=mode, layer=geo.layer)
    return model


def gated_modules(model: nn.Module) -> list[GatedWindowAttention]:
    """The :class:`GatedWindowAttention` of every layer, in layer order.

    Raises:
        ValueError: ``model`` is not a timm Swin or has no gates (call :func:`add_gates` first).
    """
    modules = [block.attn for block in swin_blocks(model)]
    if not all(isinstance(m, GatedWindowAttention) for m in modules):
        raise ValueError("model has no window-head gates: call methods.slimswin.add_gates(model) first")
    return modules


def get_masks(model: nn.Module) -> list[torch.Tensor]:
    """Current 0/1 masks, one bool ``(num_windows, num_heads)`` tensor per layer (True = active).

    Works on gated models, on pruned models (:func:`.pruned.to_pruned`) and on plain timm Swins
    (all True: nothing pruned).
    """
    masks = []
    for geo, block in zip(swin_layers(model), swin_blocks(model)):
        attn = block.attn
        if isinstance(attn, GatedWindowAttention):
            masks.append(attn.gate_mask.detach().bool().cpu().clone())
        elif hasattr(attn, "active"):  # PrunedWindowAttention
            masks.append(attn.active.detach().bool().cpu().clone())
        else:
            masks.append(torch.ones(geo.num_windows, geo.num_heads, dtype=torch.bool))
    return masks


def _as_binary(mask: torch.Tensor, geo: SwinLayerGeometry) -> torch.Tensor:
    if mask.dtype != torch.bool:
        if not torch.all((mask == 0) | (mask == 1)):
            raise ValueError(f"mask of layer {geo.layer} must be bool or hold only 0/1 values")
    return mask.bool()


def set_mask(model: nn.Module, masks: Sequence[torch.Tensor]) -> None:
    """Set the 0/1 pruning masks of a gated model (True / 1 = pair active).

    Args:
        model: a gated timm Swin (:func:`add_gates`).
        masks: one ``(num_windows, num_heads)`` bool or 0/1 tensor per layer (see :func:`get_masks`).

    Raises:
        ValueError: model not gated; wrong number of masks; a mask of the wrong shape (the message
            names the layer, the expected and the given shape); values other than 0/1.
    """
    modules = gated_modules(model)
    layers = swin_layers(model)
    validate_layer_list(masks, layers, "masks")
    binary = [_as_binary(mask, geo) for mask, geo in zip(masks, layers)]
    with torch.no_grad():
        for module, mask in zip(modules, binary):
            module.gate_mask.copy_(mask.to(module.gate_mask))


@contextmanager
def gate_probes(model: nn.Module, batch_size: int) -> Iterator[list[torch.Tensor]]:
    """Attach per-sample all-ones probes ``(batch_size, W, H)`` (requires_grad) to every gate.

    Inside the context, sample ``b`` of a forward pass sees gate ``gate * gate_mask * probe[b]``.
    Because Swin treats samples independently (LayerNorm, no BatchNorm), ``d loss_b / d probe[b]``
    is the per-sample gate gradient and ``sum_b d loss_b / d probe[b]`` the gradient w.r.t. the gate.

    Yields:
        The probe tensors, one per layer, to pass to ``torch.autograd.grad``.
    """
    modules = gated_modules(model)
    probes = []
    for module in modules:
        ref = module.gate
        probes.append(torch.ones(batch_size, module.num_windows, module.num_heads,
                                 dtype=ref.dtype, device=ref.device, requires_grad=True))
    try:
        for module, probe in zip(modules, probes):
            module.probe = probe
        yield probes
    finally:
        for module in modules:
            module.probe = None
