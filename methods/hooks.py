"""Named hook points: every internal an analysis reads has a stable name (after TransformerLens).

A method puts a :class:`HookPoint` (an identity module) wherever its forward pass produces something
worth reading — attention probabilities, per-head outputs, gates, masks, learned bases, per-branch
outputs — and the hook point's qualified module name is the tensor's name, e.g.
``blocks.3.attn.hook_pattern``. Analyses select by those names (``fnmatch`` patterns such as
``blocks.*.attn.hook_pattern``), never by module type.

Models we do not write (timm's ViT, Swin, ResNet: the teachers, and students that stay timm models)
get the same names through *adapters*: a small table, filled with :func:`adapter`, from a module type
to the places inside it that hold a named value (a sub-module's output or input) and the flags that
make the value exist (timm's fused attention never materialises probabilities, so ``hook_pattern``
switches ``fused_attn`` off while it is hooked; the maps are then the ones the model multiplied into
``v``, and the fused and explicit paths agree to float rounding).

Hook names shared by every model (so a teacher and its students line up):

=================  =====================================================================  ==========================
suffix             value                                                                   shape
=================  =====================================================================  ==========================
``hook_resid_pre``   input of a transformer block (residual stream)                          ``(B, T, D)``; Swin ``(B, H, W, C)``
``hook_mixer_in``    input of the token mixer (LN1 output)                                  same as the block input
``hook_mixer_out``   output of the token mixer (before the residual add)                    same
``hook_resid_post``  output of the block                                                    same
``hook_pattern``     attention probabilities multiplied into the values                     ``(B, heads, T_q, T_k)``; Swin ``(B·windows, heads, N, N)``
``hook_heads``       per-head outputs, heads concatenated, before the output projection     ``(B, T, heads·D_h)``
``stages.{s}.hook_out``  output of a CNN / SA-ResNet stage                                   ``(B, C, H, W)``
=================  =====================================================================  ==========================

Methods add their own suffixes (documented in their modules), e.g. Sparsifiner's ``hook_mask``.

Use :func:`run_with_cache` to read values and :func:`hooks` to replace them::

    logits, cache = run_with_cache(model, images, names="blocks.*.attn.hook_pattern")
    cache["blocks.0.attn.hook_pattern"]          # (B, heads, T, T)
"""

from __future__ import annotations

import contextlib
import fnmatch
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Union

import torch
import torch.nn as nn

__all__ = ["HookPoint", "Site", "adapter", "hook_points", "select", "run_with_cache", "hooks", "Names"]

#: What selects hook points: None (all), one fnmatch pattern, several patterns/names, or a predicate.
Names = Union[None, str, Iterable[str], Callable[[str], bool]]


class HookPoint(nn.Module):
    """An identity placed at a named value of a forward pass (TransformerLens's ``HookPoint``).

    It has no parameters, so adding one never changes a state dict.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@dataclass(frozen=True)
class Site:
    """Where a named value lives: the output (or first positional input) of ``module``.

    Attributes:
        module: the module whose output / input is the value.
        io: ``"output"`` or ``"input"``.
        flags: ``(module, attribute, value)`` set while the site is hooked and restored afterwards
            (e.g. timm's ``fused_attn = False``, without which probabilities are never computed).
    """

    module: nn.Module
    io: Literal["output", "input"] = "output"
    flags: tuple[tuple[nn.Module, str, Any], ...] = ()


#: (module type, adapter) pairs: adapter(module) -> {suffix: Site}; see :func:`adapter`.
_ADAPTERS: list[tuple[type, Callable[[nn.Module], dict[str, Site]]]] = []


def adapter(cls: type) -> Callable[[Callable[[nn.Module], dict[str, Site]]], Callable[[nn.Module], dict[str, Site]]]:
    """Register ``fn(module) -> {suffix: Site}`` naming values inside modules of type ``cls`` (exact type or subclass)."""

    def deco(fn: Callable[[nn.Module], dict[str, Site]]) -> Callable[[nn.Module], dict[str, Site]]:
        _ADAPTERS.append((cls, fn))
        return fn

    return deco


def _timm_adapters() -> None:
    """Adapters for the timm modules the workbench's teachers are made of (registered once, on first use)."""
    if getattr(_timm_adapters, "done", False):
        return
    _timm_adapters.done = True
    from timm.layers import Attention
    from timm.models.resnet import ResNet
    from timm.models.swin_transformer import SwinTransformerBlock, WindowAttention
    from timm.models.vision_transformer import Block

    def attention_sites(attn: nn.Module) -> dict[str, Site]:
        flags = ((attn, "fused_attn", False),) if hasattr(attn, "fused_attn") else ()
        sites = {"hook_pattern": Site(attn.attn_drop, "output", flags)}
        norm = getattr(attn, "norm", None)  # timm >= 1.0: Identity unless scale_norm; proj's input otherwise
        sites["hook_heads"] = Site(norm if isinstance(norm, nn.Module) else attn.proj, "input")
        return sites

    adapter(Attention)(attention_sites)
    adapter(WindowAttention)(attention_sites)

    def block_sites(block: nn.Module) -> dict[str, Site]:
        return {"hook_resid_pre": Site(block, "input"), "hook_mixer_in": Site(block.norm1),
                "hook_mixer_out": Site(block.attn), "hook_resid_post": Site(block)}

    adapter(Block)(block_sites)
    adapter(SwinTransformerBlock)(block_sites)

    @adapter(ResNet)
    def resnet_sites(model: nn.Module) -> dict[str, Site]:
        return {f"stages.{i}.hook_out": Site(getattr(model, f"layer{i + 1}")) for i in range(4) if hasattr(model, f"layer{i + 1}")}


def hook_points(model: nn.Module) -> dict[str, Site]:
    """Every named value of ``model``: its :class:`HookPoint` modules and the adapters' sites, by name."""
    _timm_adapters()
    out: dict[str, Site] = {}
    for path, mod in model.named_modules():
        if isinstance(mod, HookPoint):
            out[path] = Site(mod)
            continue
        for cls, fn in _ADAPTERS:
            if isinstance(mod, cls):
                for suffix, site in fn(mod).items():
                    out[f"{path}.{suffix}" if path else suffix] = site
                break
    return out


def select(model_or_points: nn.Module | dict[str, Site], names: Names = None) -> dict[str, Site]:
    """The hook points matching ``names`` (see :data:`Names`), in the model's module order.

    Raises:
        KeyError: an exact name (no wildcard) that the model does not have, listing similar ones.
    """
    points = model_or_points if isinstance(model_or_points, dict) else hook_points(model_or_points)
    if names is None:
        return dict(points)
    if callable(names):
        return {k: v for k, v in points.items() if names(k)}
    patterns = [names] if isinstance(names, str) else list(names)
    for p in patterns:
        if not any(c in p for c in "*?[") and p not in points:
            suffix = p.rsplit(".", 1)[-1]
            near = [k for k in points if k.endswith(suffix)][:6] or list(points)[:6]
            raise KeyError(f"the model has no hook point {p!r}; e.g. {', '.join(near)}")
    if not any(c in p for p in patterns for c in "*?["):  # exact names: no pattern matching per point
        wanted = set(patterns)
        return {k: v for k, v in points.items() if k in wanted}
    return {k: v for k, v in points.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}


class _Stop(Exception):
    """Raised once every selected value is cached (``stop_early``): the rest of the forward is skipped."""


@contextlib.contextmanager
def _flags(sites: Iterable[Site]) -> Iterator[None]:
    saved = []
    try:
        for site in sites:
            for mod, attr, value in site.flags:
                saved.append((mod, attr, getattr(mod, attr)))
                setattr(mod, attr, value)
        yield
    finally:
        for mod, attr, value in reversed(saved):
            setattr(mod, attr, value)


@contextlib.contextmanager
def hooks(model: nn.Module, fns: dict[str, Callable[[torch.Tensor, str], torch.Tensor | None]]) -> Iterator[None]:
    """Within the block, ``fn(value, name)`` sees (and, by returning a tensor, replaces) each named value.

    Args:
        model: any model with hook points (or adapters).
        fns: hook name -> function; a name may be an fnmatch pattern.

    Raises:
        KeyError: a name the model does not have.
    """
    points = hook_points(model)
    chosen: list[tuple[str, Site, Callable]] = []
    for pattern, fn in fns.items():
        for name, site in select(points, pattern).items():
            chosen.append((name, site, fn))
    with _hooked(chosen):
        yield


@contextlib.contextmanager
def _hooked(chosen: list[tuple[str, Site, Callable]]) -> Iterator[None]:
    """Register ``fn`` on each resolved ``(name, site, fn)`` for the duration of the block."""
    handles = []
    try:
        with _flags(site for _, site, _ in chosen):
            for name, site, fn in chosen:
                if site.io == "output":
                    handles.append(site.module.register_forward_hook(lambda _m, _a, out, n=name, f=fn: f(out, n)))
                else:
                    def pre(_m, args, n=name, f=fn):
                        new = f(args[0], n)
                        return None if new is None else (new, *args[1:])

                    handles.append(site.module.register_forward_pre_hook(pre))
            yield
    finally:
        for h in handles:
            h.remove()


def run_with_cache(
    model: nn.Module,
    *inputs: Any,
    names: Names = None,
    detach: bool = True,
    retain_grad: bool = False,
    stop_early: bool = False,
    **kwargs: Any,
) -> tuple[Any, dict[str, torch.Tensor]]:
    """Run ``model(*inputs, **kwargs)`` and return ``(output, {name: value})`` for the selected hook points.

    Args:
        names: which values (see :data:`Names`); None caches every hook point.
        detach: store detached values (the default); False keeps them in the autograd graph, so
            ``torch.autograd.grad(out, cache[name])`` differentiates with respect to an internal.
        retain_grad: call ``retain_grad()`` on each value (implies ``detach=False``), so that after a
            backward pass ``cache[name].grad`` holds the gradient with respect to it (e.g. of gates).
        stop_early: skip the rest of the forward once every selected value is cached; the output is
            then None.

    Raises:
        KeyError: an exact name the model does not have.
        RuntimeError: a selected hook point ran more than once in the forward pass (its name would be
            ambiguous), or never ran.
    """
    sites = select(model, names)
    cache: dict[str, torch.Tensor] = {}
    calls: dict[str, int] = dict.fromkeys(sites, 0)

    def keep(value: torch.Tensor, name: str) -> None:
        calls[name] += 1
        if retain_grad and value.requires_grad:
            value.retain_grad()
        cache[name] = value.detach() if detach and not retain_grad else value
        if stop_early and all(calls.values()):
            raise _Stop

    out = None
    # the sites are resolved once (a second walk of the modules per call would cost as much as a small forward)
    with _hooked([(name, site, keep) for name, site in sites.items()]):
        try:
            out = model(*inputs, **kwargs)
        except _Stop:
            out = None
    twice = [k for k, n in calls.items() if n > 1]
    if twice:
        raise RuntimeError(f"hook points ran more than once in one forward pass: {', '.join(twice)} "
                           "(a module reused within the model cannot name one value)")
    never = [k for k, n in calls.items() if n == 0]
    if never and not stop_early:
        raise RuntimeError(f"hook points never ran: {', '.join(never[:6])} (a branch the forward pass skipped)")
    return out, cache
