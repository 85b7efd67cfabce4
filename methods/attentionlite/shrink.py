"""Deploy form of column pruning: pruned columns and the channels they free are removed (AttentionLite §3).

A column-pruned layer keeps whole columns of its ``C_out × C_in·k·k`` weight matrix. :func:`shrink`
turns the masked SA-ResNet into a smaller one computing the same function (in eval mode; BN
statistics are per channel, so train mode agrees as well):

- a layer whose input is the **residual stream** (a block's ``conv1``, a shortcut projection, the
  classifier) or the image (stem) cannot drop its producer's channels (other layers read them); it
  becomes a :class:`~.attention.ColumnConv2d` / :class:`~.attention.ColumnLinear` that gathers its
  kept input columns and multiplies a ``C_out × n_kept`` matrix;
- inside a bottleneck, channels have one reader, so a pruned column removes a channel outright:
  a column ``c`` of the attention's fused ``qkv`` (an input channel of q, k and v) removes filter
  ``c`` of ``conv1`` and channel ``c`` of ``bn1``; a column ``c`` of ``conv3`` removes value channel
  ``c`` of the attention (its row of W_V) and channel ``c`` of ``bn2``. No gather is left inside the block.

Queries and keys keep their width (every channel enters the logits), so the attention probabilities
— ``hook_pattern`` — are those of the masked model.

The result is the registered timm form ``sa_resnet_column``, rebuilt from JSON kwargs
(:func:`deploy_kwargs`): ``base`` (the train form's timm name), ``base_kwargs`` and ``kept`` (layer name
-> kept column count); which columns are kept is in the state dict (``index`` / ``v_index`` buffers),
so ``load_state_dict(strict=True)`` restores the shrunk model exactly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import timm
import torch
import torch.nn as nn
from timm.models import register_model

from .attention import ColumnConv2d, ColumnLinear, LocalSelfAttention
from .resnet import SABottleneck
from .sparse import prunable_layers

__all__ = ["kept_columns", "shrink", "deploy_kwargs", "sa_resnet_column"]


def kept_columns(masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Layer name -> sorted kept flat column indices (``c·k·k + k_h·k + k_w``) of weight-shaped column masks.

    Raises:
        ValueError: a mask that is not column-structured (an irregular mask's deploy form is the masked model).
    """
    out = {}
    for name, mask in masks.items():
        cols = mask.reshape(mask.shape[0], -1).bool()
        if not (cols == cols[:1]).all():
            raise ValueError(f"the mask of {name} is not column-structured (a column is partly kept): only column-pruned "
                             "models shrink; an irregularly pruned model deploys as its masked (sparse) form")
        out[name] = cols[0].nonzero().flatten().cpu()
    return out


def _column(module: nn.Module, n: int) -> nn.Module:
    """A placeholder of ``module`` (Conv2d / Linear) keeping ``n`` columns (itself when all are kept)."""
    if isinstance(module, nn.Linear):
        if n == module.in_features:
            return module
        return ColumnLinear(module.in_features, module.out_features, n, bias=module.bias is not None)
    k = module.kernel_size[0]
    if n == module.in_channels * k * k:
        return module
    if module.groups != 1 or module.dilation != (1, 1) or module.kernel_size[0] != module.kernel_size[1]:
        raise ValueError("column pruning handles square, ungrouped, undilated convolutions only")
    return ColumnConv2d(module.in_channels, module.out_channels, k, n, module.stride[0], module.padding[0],
                        bias=module.bias is not None)


@torch.no_grad()
def _fill_column(new: nn.Module, old: nn.Module, idx: torch.Tensor | None, rows: torch.Tensor | None = None) -> None:
    """Copy ``old``'s weight (rows ``rows``, columns ``idx``) into ``new`` (a column placeholder or a smaller dense layer)."""
    w = old.weight.detach()
    if rows is not None:
        w = w.index_select(0, rows.to(w.device))
    if isinstance(new, (ColumnConv2d, ColumnLinear)):
        new.weight.copy_(w.reshape(w.shape[0], -1).index_select(1, idx.to(w.device)))
        new.index.copy_(idx)
    else:
        new.weight.copy_(w if idx is None else w.reshape(w.shape[0], -1).index_select(1, idx.to(w.device)).view_as(new.weight))
    if getattr(old, "bias", None) is not None:
        new.bias.copy_(old.bias if rows is None else old.bias.index_select(0, rows.to(old.bias.device)))


def _bn(old: nn.BatchNorm2d, n: int) -> nn.BatchNorm2d:
    return old if n == old.num_features else nn.BatchNorm2d(n, old.eps, old.momentum, old.affine, old.track_running_stats)


@torch.no_grad()
def _fill_bn(new: nn.BatchNorm2d, old: nn.BatchNorm2d, idx: torch.Tensor) -> None:
    for name in ("weight", "bias", "running_mean", "running_var"):
        src = getattr(old, name)
        if src is not None:
            getattr(new, name).copy_(src.index_select(0, idx.to(src.device)))
    if old.num_batches_tracked is not None:
        new.num_batches_tracked.copy_(old.num_batches_tracked)


@dataclass(frozen=True)
class _Resize:
    """What :func:`_restructure` builds every layer from: kept sizes, kept indices and the model's dtype/device."""

    counts: dict[str, int]  # layer name -> kept columns (layers not listed keep all)
    full: dict[str, int]  # layer name -> its columns before shrinking
    idx: dict[str, torch.Tensor] | None  # layer name -> kept column indices (None: sizes only, no weights copied)
    ref: torch.Tensor  # a parameter of the model: new layers take its dtype and device

    def like(self, m: nn.Module) -> nn.Module:  # floating parameters / buffers only: kept-column indices stay int64
        return m.to(device=self.ref.device, dtype=self.ref.dtype)

    def n_of(self, name: str) -> int:
        return self.counts.get(name, self.full.get(name))

    def ix(self, name: str) -> torch.Tensor | None:
        return None if self.idx is None else self.idx.get(name, torch.arange(self.full[name]))


def _restructure(model: nn.Module, counts: dict[str, int], idx: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """Swap ``model``'s modules (in place) for their column-pruned sizes; with ``idx`` also copy the kept weights.

    ``counts``: layer name -> kept columns (layers not listed keep all); ``idx``: the kept column indices.
    New layers take the dtype and device of ``model``'s parameters *before* the kept weights are copied in
    (a float64 model shrinks exactly, in float64, where it lives).
    """
    mods = dict(model.named_modules())
    ref = next(model.parameters())
    full = {n: (m.weight[0].numel()) for n, m in prunable_layers(model).items()}
    unknown = sorted(set(counts) - set(full))
    if unknown:
        raise ValueError(f"kept names layers the model does not have: {unknown[:4]}")
    plan = _Resize(counts, full, idx, ref)
    done: set[str] = set()
    for path, block in list(mods.items()):
        if isinstance(block, SABottleneck):
            done |= _restructure_bottleneck(block, f"{path}.", plan)
    for name in full:
        if name not in done:
            _restructure_layer(model, name, plan)
    return model


def _restructure_bottleneck(block: SABottleneck, p: str, plan: _Resize) -> set[str]:
    """Resize one bottleneck (``p``: its name and a dot) as a unit: conv1 -> bn1 -> attention -> bn2 -> conv3, and its
    downsample conv. Returns the layer names it resized."""
    like, n_of, ix = plan.like, plan.n_of, plan.ix
    attn: LocalSelfAttention = block.attn
    width = attn.out_channels
    m1, v = n_of(p + "attn.qkv"), n_of(p + "conv3")
    s1 = ix(p + "attn.qkv")  # kept attention inputs = surviving conv1 filters
    s3 = ix(p + "conv3")  # kept conv3 inputs = surviving value channels
    old_conv1, old_bn1, old_bn2, old_conv3, old_ds = block.conv1, block.bn1, block.bn2, block.conv3, block.downsample
    n1 = n_of(p + "conv1")
    conv1 = nn.Conv2d(old_conv1.in_channels, m1, 1, bias=False)
    conv1 = like(ColumnConv2d(old_conv1.in_channels, m1, 1, n1) if n1 < old_conv1.in_channels else conv1)
    new_attn = like(LocalSelfAttention(m1, width, attn.kernel_size, attn.num_heads, v_channels=v))
    conv3 = like(nn.Conv2d(v, old_conv3.out_channels, 1, bias=False))
    bn1, bn2 = like(_bn(old_bn1, m1)), like(_bn(old_bn2, v))
    if plan.idx is not None:
        _fill_column(conv1, old_conv1, ix(p + "conv1") if n1 < old_conv1.in_channels else None, rows=s1)
        if bn1 is not old_bn1:
            _fill_bn(bn1, old_bn1, s1)
        wq, wk, wv = attn.qkv.weight.detach().reshape(3 * width, -1).split(width)  # (width, C_in) each, dense layer
        with torch.no_grad():
            new_attn.qkv.weight.copy_(torch.cat([wq[:, s1], wk[:, s1], wv[s3][:, s1]]).view_as(new_attn.qkv.weight))
            new_attn.rel_row.copy_(attn.rel_row)
            new_attn.rel_col.copy_(attn.rel_col)
            new_attn.v_index.copy_(s3)
        if bn2 is not old_bn2:
            _fill_bn(bn2, old_bn2, s3)
        _fill_column(conv3, old_conv3, s3)
    block.conv1, block.bn1, block.attn, block.bn2, block.conv3 = conv1, bn1, new_attn, bn2, conv3
    done = {p + "conv1", p + "attn.qkv", p + "conv3"}
    if old_ds is not None and isinstance(old_ds[0], nn.Conv2d):
        nd = n_of(p + "downsample.0")
        new = like(_column(old_ds[0], nd))
        if new is not old_ds[0] and plan.idx is not None:
            _fill_column(new, old_ds[0], ix(p + "downsample.0"))
        old_ds[0] = new
        done.add(p + "downsample.0")
    return done


def _restructure_layer(model: nn.Module, name: str, plan: _Resize) -> None:
    """Resize one prunable layer outside the bottlenecks (an attention stem's qkv: the whole attention module)."""
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, attr)
    if isinstance(parent, LocalSelfAttention):  # an attention stem: its qkv's columns are image channels
        n = plan.n_of(name)
        if n < parent.in_channels:
            new_attn = plan.like(LocalSelfAttention(parent.in_channels, parent.out_channels, parent.kernel_size,
                                                    parent.num_heads, in_kept=n))
            if plan.idx is not None:
                _fill_column(new_attn.qkv, old, plan.ix(name))
                with torch.no_grad():
                    new_attn.rel_row.copy_(parent.rel_row)
                    new_attn.rel_col.copy_(parent.rel_col)
            grand_name, _, pattr = parent_name.rpartition(".")
            setattr(model.get_submodule(grand_name) if grand_name else model, pattr, new_attn)
        return
    new = plan.like(_column(old, plan.n_of(name)))
    if new is not old:
        if plan.idx is not None:
            _fill_column(new, old, plan.ix(name))
        setattr(parent, attr, new)


def shrink(model: nn.Module, masks: dict[str, torch.Tensor]) -> nn.Module:
    """The column-pruned ``model`` with its pruned columns and freed channels removed (module docstring).

    Args:
        model: an SA-ResNet (train form), masked (weights outside ``masks`` zero; e.g. trained with
            :class:`~.sparse.SparseMomentum` in column mode); not modified.
        masks: layer name -> weight-shaped column mask (``SparseMomentum.weight_masks()``, or
            :func:`~.sparse.column_masks_from_weights`).

    Returns:
        A copy in eval mode equal to the masked model (``sa_resnet_column`` form, see :func:`deploy_kwargs`), with
        ``model``'s dtype and on its device.

    Raises:
        ValueError: a mask that is not column-structured, or names a layer the model lacks.
    """
    idx = kept_columns(masks)
    counts = {n: len(i) for n, i in idx.items()}
    return _restructure(copy.deepcopy(model), counts, idx).eval()


def deploy_kwargs(masks: dict[str, torch.Tensor], base: str, base_kwargs: dict | None = None) -> dict:
    """JSON kwargs of ``timm.create_model("sa_resnet_column", **kwargs)`` for the shrunk model of ``masks``.

    Args:
        base: the train form's timm name (e.g. "sa_resnet_demo"); base_kwargs: its kwargs.
    """
    return {"base": base, "base_kwargs": dict(base_kwargs or {}),
            "kept": {n: int(len(i)) for n, i in kept_columns(masks).items()}}


@register_model
def sa_resnet_column(pretrained: bool = False, *, base: str = "", base_kwargs: dict | None = None,
                     kept: dict | None = None, **kwargs) -> nn.Module:
    """Deploy form of a column-pruned SA-ResNet: ``base`` built with ``base_kwargs``, layers sized by ``kept``.

    Weights (and the kept column indices) come from the shrunk model's state dict.
    """
    if pretrained:
        raise ValueError("sa_resnet_column has no published weights; load the state dict of a shrunk model")
    for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
        kwargs.pop(key, None)
    if not base:
        raise ValueError("sa_resnet_column needs base=<train form's timm name> (and base_kwargs, kept)")
    if kwargs:
        raise ValueError(f"sa_resnet_column takes base, base_kwargs and kept only; got {sorted(kwargs)}")
    model = timm.create_model(base, **(base_kwargs or {}))
    return _restructure(model, {str(k): int(v) for k, v in (kept or {}).items()})
