"""Hugging Face ViT, DeiT, Swin and DINOv2 folders as the equivalent timm models.

Each supported ``transformers`` class has a converter (registered with :func:`family`) that builds the timm model
from ``config.json`` and renames the saved tensors onto it (the original Google / Meta / Microsoft names, with query,
key and value fused into timm's ``qkv``); timm's own checkpoint filters then do what they do for those checkpoints:
DINOv2's mask token dropped (``timm.models.vision_transformer.checkpoint_filter_fn``), Swin's downsampling moved to
the start of the next stage and its ``head.fc`` (``timm.models.swin_transformer.checkpoint_filter_fn``). DINOv2's
register tokens become timm's ``reg_token`` with zero position rows (exact; timm's ``no_embed_class`` form would
fold the class position into the class token, one float32 rounding off). The renamed weights are loaded
strictly (:func:`workbench.checkpoints.load_weights`: every tensor used, every shape equal, all finite).

What timm cannot represent exactly is refused, naming the config option: an activation timm's block lacks, a
non-square patch, Swin's absolute position embeddings or an activation other than GELU, DINOv2's SwiGLU MLP, a
``num_labels`` that differs from the classifier's rows, a processor image size a ViT or Swin would not take (DINOv2,
which interpolates its position embedding on every forward, is resampled once to it, as it would be).

Saved names are those ``save_pretrained`` writes (the hub format; transformers 5.24 still writes them, though it
names its modules otherwise in memory). ViT's pooler
(``ViTModel``'s dense + tanh, unused by ``ViTForImageClassification``) is not part of the timm model: a headless
ViT's output is the final-norm CLS token (``last_hidden_state[:, 0]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from workbench.checkpoints import load_weights
from workbench.hf.folder import HFError, HFFolder, data_config

__all__ = ["Converted", "family", "supported", "convert"]


@dataclass(frozen=True)
class Converted:
    """A folder's model as a timm model, with how to feed it."""

    model: nn.Module  # timm model in eval mode, weights loaded
    data_config: dict  # timm data config reproducing the folder's image processor (folder.data_config)
    architecture: str  # the transformers class it came from, e.g. "ViTForImageClassification"
    name: str  # timm name that builds the architecture: "hf_vit" or "hf_swin" (workbench.hf.archs)
    kwargs: dict  # its JSON keyword arguments: timm.create_model(name, **kwargs) is the model, untrained


#: transformers class name -> converter(folder) -> Converted
_FAMILIES: dict[str, Callable[[HFFolder], Converted]] = {}


def family(*architectures: str) -> Callable[[Callable[[HFFolder], Converted]], Callable[[HFFolder], Converted]]:
    """Register a converter for the ``transformers`` classes ``architectures``."""

    def deco(fn: Callable[[HFFolder], Converted]) -> Callable[[HFFolder], Converted]:
        for a in architectures:
            _FAMILIES[a] = fn
        return fn

    return deco


def supported() -> list[str]:
    """The ``transformers`` classes a folder may hold."""
    return sorted(_FAMILIES)


def convert(folder: HFFolder) -> Converted:
    """The folder's model as the equivalent timm model (module docstring).

    Raises:
        HFError: an unsupported class, an option timm cannot represent, weights that do not fit the config.
    """
    arch = folder.architecture
    if arch not in _FAMILIES:
        raise HFError(f"hf:{folder.path}: {arch} (model_type {folder.config.get('model_type')!r}) is not supported; "
                      f"supported: {', '.join(supported())}")
    return _FAMILIES[arch](folder)


# ---- config -> timm keyword arguments ------------------------------------------------------------------------------

def _opt(folder: HFFolder, key: str, default):
    return folder.config.get(key, default)


def _refuse(folder: HFFolder, option: str, why: str) -> HFError:
    return HFError(f"hf:{folder.path}: {folder.architecture} with {option}={folder.config.get(option)!r}: {why}; "
                   "timm cannot represent it exactly, so it is not converted")


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, (int, float)) else (int(v[0]), int(v[1]))


def _square_patch(folder: HFFolder) -> int:
    ph, pw = _pair(_opt(folder, "patch_size", 16))
    if ph != pw:
        raise _refuse(folder, "patch_size", "a non-square patch")
    return ph


def _num_classes(folder: HFFolder, state: dict[str, torch.Tensor], head: str | None) -> int:
    """Rows of the classifier ``head`` (0 for a headless model), checked against the config's ``num_labels``."""
    if head is None:
        return 0
    if f"{head}.weight" not in state:
        raise HFError(f"hf:{folder.path}: {folder.architecture} but no {head}.weight in the weights")
    rows = int(state[f"{head}.weight"].shape[0])
    labels = len(folder.config.get("id2label") or {}) or folder.config.get("num_labels")
    if labels is not None and int(labels) != rows:
        raise HFError(f"hf:{folder.path}: config.json has {labels} labels (id2label / num_labels) but the weights' "
                      f"classifier has {rows} rows; save the config and weights of one model together")
    return rows


def _vit_kwargs(folder: HFFolder, *, mlp_hidden: int) -> dict:
    """timm ``VisionTransformer`` arguments shared by ViT, DeiT and DINOv2 configs."""
    from workbench.hf.archs import ACTS

    dim = int(_opt(folder, "hidden_size", 768))
    act = _opt(folder, "hidden_act", "gelu")
    if act not in ACTS:
        raise _refuse(folder, "hidden_act", f"timm's MLP takes {', '.join(sorted(ACTS))}")
    if mlp_hidden % dim and int(dim * (mlp_hidden / dim)) != mlp_hidden:
        raise _refuse(folder, "intermediate_size", f"{mlp_hidden} is not a ratio timm's int(dim * mlp_ratio) reproduces")
    return dict(img_size=list(_pair(_opt(folder, "image_size", 224))), patch_size=_square_patch(folder),
                in_chans=int(_opt(folder, "num_channels", 3)), embed_dim=dim, depth=int(_opt(folder, "num_hidden_layers", 12)),
                num_heads=int(_opt(folder, "num_attention_heads", 12)), mlp_ratio=mlp_hidden / dim,
                qkv_bias=bool(_opt(folder, "qkv_bias", True)), act=act, layer_norm_eps=float(_opt(folder, "layer_norm_eps", 1e-12)))


# ---- saved names -> original names --------------------------------------------------------------------------------

#: (pattern, replacement) on a ViT-like name without its model prefix; unmatched names pass through (and fail the
#: strict load, named, if timm has no such tensor)
_VIT_NAMES = [
    (r"^embeddings\.cls_token$", "cls_token"), (r"^embeddings\.distillation_token$", "dist_token"),
    (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^embeddings\.(register_tokens|mask_token)$", r"\1"),  # timm's DINOv2 filter moves / drops them
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^encoder\.layer\.(\d+)\.(?:layernorm_before|norm1)\.", r"blocks.\1.norm1."),
    (r"^encoder\.layer\.(\d+)\.(?:layernorm_after|norm2)\.", r"blocks.\1.norm2."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"blocks.\1.attn.proj."),
    (r"^encoder\.layer\.(\d+)\.(?:intermediate\.dense|mlp\.fc1)\.", r"blocks.\1.mlp.fc1."),
    (r"^encoder\.layer\.(\d+)\.(?:output\.dense|mlp\.fc2)\.", r"blocks.\1.mlp.fc2."),
    (r"^encoder\.layer\.(\d+)\.layer_scale([12])\.lambda1$", r"blocks.\1.ls\2.gamma"),
    (r"^layernorm\.", "norm."), (r"^(?:classifier|cls_classifier)\.", "head."),
    (r"^distillation_classifier\.", "head_dist."),
]
_VIT_QKV = re.compile(r"^encoder\.layer\.(\d+)\.attention\.attention\.(query|key|value)\.(weight|bias)$")

_SWIN_NAMES = [
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."), (r"^embeddings\.norm\.", "patch_embed.norm."),
    (r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.layernorm_before\.", r"layers.\1.blocks.\2.norm1."),
    (r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.layernorm_after\.", r"layers.\1.blocks.\2.norm2."),
    (r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.attention\.self\.relative_position_bias_table$",
     r"layers.\1.blocks.\2.attn.relative_position_bias_table"),
    (r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.attention\.output\.dense\.", r"layers.\1.blocks.\2.attn.proj."),
    (r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.intermediate\.dense\.", r"layers.\1.blocks.\2.mlp.fc1."),
    (r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.output\.dense\.", r"layers.\1.blocks.\2.mlp.fc2."),
    (r"^encoder\.layers\.(\d+)\.downsample\.", r"layers.\1.downsample."),  # end of stage i (timm's filter moves it)
    (r"^layernorm\.", "norm."), (r"^classifier\.", "head."),
]
_SWIN_QKV = re.compile(r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)$")
_DROP = re.compile(r"(relative_position_index|^pooler\.)")  # buffers, and ViT's unused pooler (module docstring)


def _renamed(state: dict[str, torch.Tensor], prefix: str, names: list, qkv: re.Pattern, qkv_name: str) -> dict:
    """``state`` without ``prefix``, renamed by ``names``, query/key/value concatenated into timm's fused qkv."""
    out, parts = {}, {}
    for key, v in state.items():
        key = key.removeprefix(prefix)
        if _DROP.search(key):
            continue
        m = qkv.match(key)
        if m:
            *where, which, kind = m.groups()
            parts.setdefault((tuple(where), kind), {})[which] = v
            continue
        for pat, rep in names:
            key, n = re.subn(pat, rep, key)
            if n:
                break
        out[key] = v
    for (where, kind), qkv_parts in parts.items():
        if set(qkv_parts) != {"query", "key", "value"}:
            raise HFError(f"attention {'.'.join(where)} has {kind}s of only {sorted(qkv_parts)}")
        out[qkv_name.format(*where) + f".{kind}"] = torch.cat([qkv_parts[k] for k in ("query", "key", "value")], 0)
    return out


# ---- the families ------------------------------------------------------------------------------------------------


def _build(name: str, kwargs: dict, cfg: dict) -> nn.Module:
    """``timm.create_model(name, **kwargs)`` with the data config ``cfg`` (as JSON) added to ``kwargs``."""
    import timm

    import workbench.hf.archs  # noqa: F401  (registers hf_vit, hf_swin)

    kwargs["data"] = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}
    return timm.create_model(name, pretrained=False, **kwargs)


def _finish(folder: HFFolder, model: nn.Module, state: dict, cfg: dict, name: str, kwargs: dict) -> Converted:
    load_weights(model, state, what=f"hf:{folder.path} weights")
    return Converted(model.eval(), cfg, folder.architecture, name, kwargs)


def _input_hw(folder: HFFolder, cfg: dict, *, interpolates: bool) -> tuple[int, int]:
    """The model's input size from the preprocessing; a model that does not interpolate refuses another size."""
    hw, own = tuple(cfg["input_size"][1:]), _pair(_opt(folder, "image_size", 224))
    if hw != own and not interpolates:
        raise _refuse(folder, "image_size", f"the image processor gives {hw[0]}x{hw[1]} images; the model takes "
                      f"{own[0]}x{own[1]} (without interpolate_pos_encoding)")
    return hw


@family("ViTForImageClassification", "ViTModel", "DeiTForImageClassificationWithTeacher")
def vit(folder: HFFolder) -> Converted:
    """ViT (``timm`` ``VisionTransformer``, class token pooling) and distilled DeiT (``VisionTransformerDistilled``:
    class and distillation tokens, the two heads averaged in eval as in timm's ``deit_*_distilled``)."""
    from timm.models.vision_transformer import checkpoint_filter_fn

    distilled = folder.architecture.startswith("DeiT")
    prefix = "deit." if distilled else "vit." if folder.architecture != "ViTModel" else ""
    state = _renamed(folder.state_dict(), prefix, _VIT_NAMES, _VIT_QKV, "blocks.{}.attn.qkv")
    cfg = data_config(folder.preprocessor, image_size=_pair(_opt(folder, "image_size", 224)),
                      in_chans=int(_opt(folder, "num_channels", 3)))
    _input_hw(folder, cfg, interpolates=False)
    kwargs = _vit_kwargs(folder, mlp_hidden=int(_opt(folder, "intermediate_size", 3072)))
    head = None if folder.architecture == "ViTModel" else "head"
    kwargs.update(num_classes=_num_classes(folder, state, head), head="distilled" if distilled else "token")
    model = _build("hf_vit", kwargs, cfg)
    return _finish(folder, model, checkpoint_filter_fn(state, model), cfg, "hf_vit", kwargs)


@family("Dinov2Model", "Dinov2ForImageClassification", "Dinov2WithRegistersModel",
        "Dinov2WithRegistersForImageClassification")
def dinov2(folder: HFFolder) -> Converted:
    """DINOv2, with register tokens where the config has them: timm's ``vit_*_dinov2`` form (layer scale), registers
    as timm's ``reg_token`` (with zero position rows). The classifier of ``Dinov2ForImageClassification`` reads
    [CLS, mean of the patch tokens] (:class:`workbench.hf.archs.ClsMeanViT`). DINOv2 interpolates its position embedding to the image
    size on every forward (bicubic, in float32); a processor size other than ``image_size`` is done once here, the
    same way."""
    from timm.models.vision_transformer import checkpoint_filter_fn

    if _opt(folder, "use_swiglu_ffn", False):
        raise _refuse(folder, "use_swiglu_ffn", "the converter maps the plain MLP only")
    arch = folder.architecture
    prefix = "" if arch.endswith("Model") else "dinov2_with_registers." if "Registers" in arch else "dinov2."
    state = _renamed(folder.state_dict(), prefix, _VIT_NAMES, _VIT_QKV, "blocks.{}.attn.qkv")
    state.setdefault("mask_token", torch.zeros(1))  # selects timm's DINOv2 filter (which drops it)
    cfg = data_config(folder.preprocessor, image_size=_pair(_opt(folder, "image_size", 518)),
                      in_chans=int(_opt(folder, "num_channels", 3)))
    hw = _input_hw(folder, cfg, interpolates=True)
    dim = int(_opt(folder, "hidden_size", 768))
    kwargs = _vit_kwargs(folder, mlp_hidden=int(dim * float(_opt(folder, "mlp_ratio", 4))))
    regs = int(_opt(folder, "num_register_tokens", 0)) if "Registers" in arch else 0
    head = None if arch.endswith("Model") else "head"
    kwargs.update(img_size=list(hw), num_classes=_num_classes(folder, state, head), init_values=1.0, reg_tokens=regs,
                  head="token" if head is None else "cls_mean")
    model = _build("hf_vit", kwargs, cfg)
    pos = _dinov2_pos_embed(state["pos_embed"], model.patch_embed.grid_size)  # (1, 1 + gh*gw, D)
    if regs:  # HF adds no position to the registers: zero rows in timm's embedding of every prefix token (exact,
        # where timm's no_embed_class form would fold the class position into the class token with a float32 rounding)
        state["reg_token"] = state.pop("register_tokens")
        pos = torch.cat([pos[:, :1], pos.new_zeros(1, regs, pos.shape[-1]), pos[:, 1:]], dim=1)  # (1, 1+regs+gh*gw, D)
    state["pos_embed"] = pos
    return _finish(folder, model, checkpoint_filter_fn(state, model), cfg, "hf_vit", kwargs)


def _dinov2_pos_embed(pos: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """``(1, 1 + n*n, D)`` position embedding at ``grid``, resampled as ``Dinov2Embeddings.interpolate_pos_encoding``
    does (bicubic, no antialiasing, float32, the class position kept)."""
    n = int(round((pos.shape[1] - 1) ** 0.5))
    if (n, n) == tuple(grid):
        return pos
    patch = pos[:, 1:].reshape(1, n, n, -1).permute(0, 3, 1, 2)  # (1, D, n, n)
    patch = nn.functional.interpolate(patch.float(), size=tuple(grid), mode="bicubic", align_corners=False).to(pos.dtype)
    return torch.cat([pos[:, :1], patch.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], -1)], dim=1)  # (1, 1+gh*gw, D)


@family("SwinForImageClassification", "SwinModel")
def swin(folder: HFFolder) -> Converted:
    """Swin (timm ``SwinTransformer``): the saved names are mapped to Microsoft's original ones, whose conversion
    timm's Swin filter already does (downsampling moved to the next stage's start, ``head`` -> ``head.fc``)."""
    from timm.models.swin_transformer import checkpoint_filter_fn

    if _opt(folder, "hidden_act", "gelu") != "gelu":
        raise _refuse(folder, "hidden_act", "timm's Swin blocks use GELU")
    if _opt(folder, "use_absolute_embeddings", False):
        raise _refuse(folder, "use_absolute_embeddings", "timm's Swin has no absolute position embedding")
    prefix = "" if folder.architecture == "SwinModel" else "swin."
    state = _renamed(folder.state_dict(), prefix, _SWIN_NAMES, _SWIN_QKV, "layers.{}.blocks.{}.attn.qkv")
    cfg = data_config(folder.preprocessor, image_size=_pair(_opt(folder, "image_size", 224)),
                      in_chans=int(_opt(folder, "num_channels", 3)))
    kwargs = dict(
        img_size=list(_input_hw(folder, cfg, interpolates=False)), patch_size=_square_patch(folder),
        in_chans=int(_opt(folder, "num_channels", 3)), embed_dim=int(_opt(folder, "embed_dim", 96)),
        depths=list(_opt(folder, "depths", (2, 2, 6, 2))), num_heads=list(_opt(folder, "num_heads", (3, 6, 12, 24))),
        window_size=int(_opt(folder, "window_size", 7)), mlp_ratio=float(_opt(folder, "mlp_ratio", 4.0)),
        qkv_bias=bool(_opt(folder, "qkv_bias", True)), drop_path_rate=0.0,
        layer_norm_eps=float(_opt(folder, "layer_norm_eps", 1e-5)),
        num_classes=_num_classes(folder, state, None if folder.architecture == "SwinModel" else "head"))
    model = _build("hf_swin", kwargs, cfg)
    state = checkpoint_filter_fn(state, model)
    for kind in ("weight", "bias"):  # a one-stage model has no downsampling, by which the filter knows the format
        if f"head.{kind}" in state:
            state[f"head.fc.{kind}"] = state.pop(f"head.{kind}")
    return _finish(folder, model, state, cfg, "hf_swin", kwargs)
