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

__all__ = ["attention_modules", "eager", "attention_maps", "NATIVE", "NativeViT", "load_native"]


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


class _Attn(nn.Module):
    """Where one block's probabilities are named: ``blocks.{i}.attn.hook_pattern``."""

    def __init__(self):
        super().__init__()
        from methods.hooks import HookPoint

        self.hook_pattern = HookPoint()  # (B, heads, T, T): the probabilities the HF block multiplied into v


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _Attn()


class _PatchGrid:
    """What the token-layout helpers read of a timm ``patch_embed``: the patch size."""

    def __init__(self, patch: int):
        self.patch_size = (patch, patch)  # (ph, pw)


#: transformers classes a NativeViT wraps (ViT-like: one (B, heads, T, T) map per block)
NATIVE = ("ViTForImageClassification", "ViTModel", "DeiTForImageClassification", "DeiTForImageClassificationWithTeacher",
          "DeiTModel", "Dinov2ForImageClassification", "Dinov2Model", "Dinov2WithRegistersForImageClassification",
          "Dinov2WithRegistersModel")


class NativeViT(nn.Module):
    """An HF ViT, DeiT or DINOv2 model run as it is, with the workbench's hook-point names, so the extractors, the
    explorer and the attributions that read ``blocks.{i}.attn.hook_pattern`` run on the HF model itself.

    A forward hook on each HF attention module passes its probabilities through the block's hook point; the eager
    path is switched on only for a forward in which a hook point is hooked (the capturing forward), SDPA otherwise.
    The hook point reads the probabilities (with their gradients): replacing them there does not change the output,
    which HF has already computed from them. ``forward(x)`` gives the logits (a headless model: the final-norm class
    token, what the converted timm model gives). The token layout (class, distillation and register tokens, patch
    size) is exposed under timm's attribute names. Only attention is named (no residual-stream hook points: what
    reads those, such as CKA, needs the converted model).
    """

    def __init__(self, hf: nn.Module):
        super().__init__()
        name = type(hf).__name__
        if name not in NATIVE:
            raise ValueError(f"{name} is not analysed natively (supported: {', '.join(NATIVE)}); Swin's maps: "
                             "workbench.hf.native.attention_maps, or use the converted model (hf:DIR without native)")
        self.hf = hf.eval()
        mods = attention_modules(hf)
        self.blocks = nn.ModuleList(_Block() for _ in mods)  # blocks.{i}.attn.hook_pattern, in forward order
        for i, (_, m) in enumerate(mods):
            m.register_forward_hook(self._route(i))
        emb = hf.base_model.embeddings
        self._emb = [emb]  # (a list: not registered twice as a sub-module)
        self.patch_embed = _PatchGrid(int(hf.config.patch_size))
        self.num_prefix_tokens = 1 + (self.dist_token is not None) + (0 if self.reg_token is None else self.reg_token.shape[1])
        self.eval()

    @property
    def cls_token(self):
        return self._emb[0].cls_token  # (1, 1, D)

    @property
    def dist_token(self):
        return getattr(self._emb[0], "distillation_token", None)  # DeiT: (1, 1, D), after the class token

    @property
    def reg_token(self):
        return getattr(self._emb[0], "register_tokens", None)  # DINOv2 with registers: (1, R, D)

    def _route(self, i: int):
        def hook(_m, _args, out):
            if isinstance(out, tuple) and len(out) > 1 and isinstance(out[1], torch.Tensor):
                return (out[0], self.blocks[i].attn.hook_pattern(out[1]), *out[2:])
            return None
        return hook

    def _capturing(self) -> bool:
        return any(b.attn.hook_pattern._forward_hooks or b.attn.hook_pattern._forward_pre_hooks for b in self.blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` pixels -> ``(B, classes)`` logits (a headless model: ``(B, D)`` features)."""
        with eager(self.hf) if self._capturing() else contextlib.nullcontext():
            out = self.hf(pixel_values=x, **({"output_attentions": True} if self._capturing() else {}))
        return out.logits if hasattr(out, "logits") else out.last_hidden_state[:, 0]


def load_native(folder) -> nn.Module:
    """The folder's HF model (an :class:`~workbench.hf.folder.HFFolder` already checked), loaded by ``transformers``
    from the local files only (its class named by the config, never remote code), wrapped as :class:`NativeViT`.

    Raises:
        HFError: transformers missing, or a class analysed only after conversion.
    """
    from workbench.hf.folder import HFError

    arch = folder.architecture
    if arch not in NATIVE:
        raise HFError(f"hf:{folder.path}: {arch} is not analysed natively (supported: {', '.join(NATIVE)}); drop "
                      "--native to analyse its converted timm model (the same maps)")
    try:
        import transformers
    except ImportError:
        raise HFError("--native runs the HF model itself and needs transformers: pip install -e '.[hf]' "
                      "(or drop --native: the converted model needs no transformers)") from None
    folder.state_dict()  # the files read safely first: a damaged or code-carrying file is refused here
    import warnings

    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its loading bar, for this call only
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf = getattr(transformers, arch).from_pretrained(folder.path, local_files_only=True, trust_remote_code=False)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    return NativeViT(hf)
