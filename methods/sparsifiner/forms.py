"""Sparsifiner's model forms as timm model names, each rebuilt from JSON-serialisable kwargs.

| form | timm name | what it is |
|---|---|---|
| dense teacher | the base's own name (``vit_demo``, ``deit_small_patch16_224``) | the pretrained ViT |
| train form | ``sparsifiner_vit`` | masked dense computation (Eq. 4–5), differentiable |
| deploy form | ``sparsifiner_vit_sparse`` | the sparse path: only the kept query–key pairs |
| baseline | ``linformer_vit`` | Linformer at the matched budget (Table 4) |

Every form takes ``base`` (the teacher's timm name) and ``base_kwargs`` (its ``create_model``
kwargs) plus the method's options, so ``timm.create_model(name, **kwargs)`` rebuilds the
architecture of any run, and the run's safetensors load strictly (the train and deploy forms have
the same state dict). Weights are never downloaded: ``pretrained=True`` is refused.

Conversions: :func:`~.replace.replace_attention` (teacher → train form, teacher weights copied),
:func:`~.replace.to_sparse_path` (train → deploy), :func:`~.replace.to_masked` (deploy → train),
:func:`~.replace.replace_with_linformer` (teacher → baseline).
"""

from __future__ import annotations

import timm
from timm.models import register_model
from torch import nn

from .config import SparsifinerConfig
from .replace import replace_attention, replace_with_linformer

#: The registered forms: role -> timm name.
FORMS: dict[str, str] = {"train": "sparsifiner_vit", "deploy": "sparsifiner_vit_sparse", "linformer": "linformer_vit"}

_TIMM_EXTRAS = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")


def _base(name: str, pretrained: bool, base: str | None, base_kwargs: dict | None, kwargs: dict) -> nn.Module:
    if pretrained:
        raise ValueError(f"{name} has no published weights; build it from a trained teacher with "
                         "methods.sparsifiner.replace_attention, or load a run's checkpoint")
    if not base:
        raise ValueError(f"{name} needs base=<timm name of the dense teacher>, e.g. base='vit_demo'")
    for key in _TIMM_EXTRAS:
        kwargs.pop(key, None)
    from .. import teachers  # noqa: F401  (registers the demo teachers, e.g. vit_demo, with timm)

    return timm.create_model(base, pretrained=False, **(base_kwargs or {}))


def _finish(model: nn.Module, teacher: nn.Module, name: str) -> nn.Module:
    cfg = dict(getattr(teacher, "pretrained_cfg", {}) or {})
    model.pretrained_cfg = {**cfg, "architecture": name}
    return model


def _config(kwargs: dict) -> SparsifinerConfig:
    unknown = sorted(set(kwargs) - set(SparsifinerConfig.__dataclass_fields__))
    if unknown:
        raise TypeError(f"unknown Sparsifiner option(s) {unknown}; known: {sorted(SparsifinerConfig.__dataclass_fields__)}")
    if kwargs.get("layers") is not None:
        kwargs = {**kwargs, "layers": tuple(kwargs["layers"])}
    return SparsifinerConfig(**kwargs)


@register_model
def sparsifiner_vit(pretrained: bool = False, base: str | None = None, base_kwargs: dict | None = None,
                    **kwargs) -> nn.Module:
    """Train form: ``base`` with Sparsifiner attention, masked dense computation.

    Args:
        base: timm name of the dense teacher.
        base_kwargs: ``create_model`` kwargs of the teacher (e.g. ``{"img_size": 384}``).
        **kwargs: :class:`~.config.SparsifinerConfig` fields (``keep_rate``, ``n_down``, ``tau``, ...).
    """
    teacher = _base("sparsifiner_vit", pretrained, base, base_kwargs, kwargs)
    return _finish(replace_attention(teacher, _config(kwargs), path="masked"), teacher, "sparsifiner_vit")


@register_model
def sparsifiner_vit_sparse(pretrained: bool = False, base: str | None = None, base_kwargs: dict | None = None,
                           **kwargs) -> nn.Module:
    """Deploy form: as :func:`sparsifiner_vit`, computing only the kept query–key pairs (inference only)."""
    teacher = _base("sparsifiner_vit_sparse", pretrained, base, base_kwargs, kwargs)
    return _finish(replace_attention(teacher, _config(kwargs), path="sparse"), teacher, "sparsifiner_vit_sparse")


@register_model
def linformer_vit(pretrained: bool = False, base: str | None = None, base_kwargs: dict | None = None,
                  keep_rate: float = 0.25, layers: list[int] | None = None, **kwargs) -> nn.Module:
    """Linformer baseline: ``base`` with keys and values projected to k = ⌈keep_rate · n⌉ tokens."""
    teacher = _base("linformer_vit", pretrained, base, base_kwargs, kwargs)
    if kwargs:
        raise TypeError(f"unknown linformer_vit option(s) {sorted(kwargs)}; known: keep_rate, layers")
    model = replace_with_linformer(teacher, keep_rate, None if layers is None else tuple(layers))
    return _finish(model, teacher, "linformer_vit")


def form_kwargs(base: str, cfg: SparsifinerConfig, base_kwargs: dict | None = None) -> dict:
    """JSON-serialisable kwargs that rebuild the train / deploy form of ``base`` with ``cfg``."""
    return {"base": base, "base_kwargs": dict(base_kwargs or {}), **cfg.to_kwargs()}
