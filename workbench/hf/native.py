"""A ``transformers`` model analysed as it is: its attention probabilities read at hook points on its own modules.

Where conversion is not wanted, the HF model itself is run. ``transformers`` computes attention with SDPA by default,
which never forms the probabilities (transformers issue 30978); :func:`attention_maps` switches the eager path on
for the one capturing forward pass only (the model's setting is restored after it, also on error) and reads the
probabilities with a forward hook on every module that owns the query / key / value projections (``q_proj`` in
transformers 5, ``query`` in 4): its output is ``(context, probabilities)`` on the eager path. Every block is read
(transformers 5's ``output_attentions`` gives Swin's last block of each stage only).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn as nn

__all__ = ["attention_modules", "eager", "attention_maps"]


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules that compute one block's attention, in forward order: those with query / key / value children."""
    return [(name, m) for name, m in model.named_modules()
            if (hasattr(m, "q_proj") and hasattr(m, "k_proj")) or (hasattr(m, "query") and hasattr(m, "key"))]


@contextlib.contextmanager
def eager(model: nn.Module) -> Iterator[None]:
    """Within the block, ``model`` (and every sub-model sharing or owning a config) uses the eager attention path."""
    configs = {id(m.config): m.config for m in model.modules() if hasattr(getattr(m, "config", None), "_attn_implementation")}
    saved = {k: c._attn_implementation for k, c in configs.items()}
    try:
        for c in configs.values():
            c._attn_implementation = "eager"
        yield
    finally:
        for k, c in configs.items():
            c._attn_implementation = saved[k]


def attention_maps(model: nn.Module, pixel_values: torch.Tensor) -> list[torch.Tensor]:
    """Every block's attention probabilities, in block order: ViT / DeiT / DINOv2 ``(B, heads, T, T)``, Swin
    ``(B·windows, heads, N, N)`` (the token order of transformers, which the converted timm model shares).

    Raises:
        ValueError: a model in training mode (dropout would change the maps), or one without attention modules.
    """
    if model.training:
        raise ValueError("attention maps need an eval-mode model (call model.eval()): attention dropout changes them")
    mods = attention_modules(model)
    if not mods:
        raise ValueError(f"{type(model).__name__} has no attention modules with query/key/value projections")
    maps: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(_m, _args, out):
            if not (isinstance(out, tuple) and len(out) > 1 and isinstance(out[1], torch.Tensor) and out[1].ndim == 4):
                raise RuntimeError(f"{name} returned no attention probabilities on the eager path")
            maps[name] = out[1].detach()
        return hook

    handles = [m.register_forward_hook(keep(name)) for name, m in mods]
    try:
        with eager(model), torch.no_grad():
            model(pixel_values=pixel_values, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    return [maps[name] for name, _ in mods]
