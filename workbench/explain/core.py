"""``attribute(model, images, *, method, target=None, **options) -> xr.Dataset``: every explainer, one call.

The Dataset (dims of DESIGN.md; ``img_y``/``img_x`` are the pixel dims of the ``image`` variable
``workbench analyze`` adds):

- ``relevance(sample, y, x)``: the map on the patch grid (:mod:`workbench.explain.grids`), float32;
- ``relevance_pixel(sample, img_y, img_x)``: the map on the pixel grid, float32;
- scalar coord ``stride``: pixels per patch-grid cell (a ViT's patch size; a CNN's last-stage stride);
- ``target(sample)``: the class explained; ``predicted(sample)``: the model's prediction;
- side results of a method, e.g. ``ig_delta(sample)`` (IG's relative completeness gap);
- an ``explainer`` dim when ``method`` is a sequence (a scalar ``explainer`` coord for one name);
- attrs ``analysis="explain"``, ``config`` (JSON of the arguments), ``native`` (JSON: method -> the grid it is
  defined on; the other grid is derived), ``papers`` (JSON), ``not_applicable`` (JSON: method -> reason, for the
  methods of a sequence that do not apply; a single method that does not apply raises instead).
  :func:`workbench.provenance.stamp` adds the rest of the provenance.

Maps are not rescaled (Grad-CAM's pixel map excepted: the ``grad-cam`` package's own, min–max scaled); compare
them by rank (Spearman, top-k) or per method.
"""

from __future__ import annotations

import inspect
import json
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import xarray as xr

from workbench.explain.grids import model_grid, to_patches, to_pixels
from workbench.explain.registry import Maps, get_explainer
from workbench.provenance import config_json

__all__ = ["attribute", "resolve_target"]


@torch.no_grad()
def resolve_target(model: nn.Module, images: torch.Tensor, target: int | Sequence[int] | torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(target, predicted)``, each ``(B,)`` long: ``target`` None explains the predicted class."""
    pred = model(images).argmax(-1)
    if target is None:
        return pred, pred
    t = torch.as_tensor(target, device=images.device).long()
    if t.ndim == 0:
        t = t.expand(len(images))
    if t.shape != (len(images),):
        raise ValueError(f"target must be a class index or one per image ({len(images)}), got shape {tuple(t.shape)}")
    return t, pred


def _options_for(fn, options: dict) -> dict:
    params = inspect.signature(fn).parameters
    return {k: v for k, v in options.items() if k in params and params[k].kind is inspect.Parameter.KEYWORD_ONLY}


def _check(model: nn.Module, images: torch.Tensor, methods: list[str], options: dict) -> None:
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}")
    if model.training:
        raise ValueError("explanations need an eval-mode model (call model.eval()): in training mode dropout "
                         "changes the function being explained")
    taken = {k for m in methods for k in _options_for(get_explainer(m).fn, options)}
    unknown = sorted(set(options) - taken)
    if unknown:
        raise ValueError(f"options {unknown} are taken by none of the explainers {methods}")


def _run(model: nn.Module, images: torch.Tensor, target: torch.Tensor, name: str, grid: tuple[int, int],
         batch_size: int, options: dict) -> Maps:
    """One explainer over the batch in chunks, both grids filled in."""
    e = get_explainer(name)
    opts = _options_for(e.fn, options)
    patch, pixel, extra = [], [], {}
    size = tuple(images.shape[-2:])
    for start in range(0, len(images), batch_size):
        sl = slice(start, start + batch_size)
        m = e.fn(model, images[sl], target[sl], **opts)
        p = m.patch if m.patch is not None else to_patches(m.pixel, grid)
        patch.append(p.detach().float().cpu())
        pixel.append((m.pixel if m.pixel is not None else to_pixels(p, size)).detach().float().cpu())
        for k, v in (m.extra or {}).items():
            extra.setdefault(k, []).append(v.detach().cpu())
    return Maps(torch.cat(patch), torch.cat(pixel), {k: torch.cat(v) for k, v in extra.items()})


def attribute(model: nn.Module, images: torch.Tensor, *, method: str | Sequence[str],
              target: int | Sequence[int] | torch.Tensor | None = None, batch_size: int = 32, **options
              ) -> xr.Dataset:
    """Explain ``model``'s ``target`` class (None: its prediction) on ``images`` with one or several explainers.

    Args:
        model: eval-mode classifier returning logits ``(B, classes)``.
        images: ``(B, C, H, W)`` normalised for the model.
        method: a registered explainer name (``workbench.explain.EXPLAINERS``) or a sequence of them.
        target: class per image, one class for all, or None for the predicted class.
        batch_size: images per explainer call.
        options: keyword options of the explainers (e.g. ``n_steps`` of ``ig``); each goes to those taking it.

    Returns:
        The Dataset of the module docstring.

    Raises:
        ValueError: bad images, a training-mode model, an unknown method or option, or a single method that does
            not apply to the model (with the reason).
    """
    methods = [method] if isinstance(method, str) else list(method)
    _check(model, images, methods, options)
    not_applicable = {m: why for m in methods if (why := get_explainer(m).applies(model))}
    if isinstance(method, str) and not_applicable:
        raise ValueError(f"{method} does not apply to {type(model).__name__}: {not_applicable[method]}")
    run = [m for m in methods if m not in not_applicable]
    tgt, pred = resolve_target(model, images, target)
    grid = model_grid(model, images)
    results = {m: _run(model, images, tgt, m, grid, batch_size, options) for m in run}
    b, (h, w) = len(images), images.shape[-2:]
    coords = {"sample": np.arange(b), "y": np.arange(grid[0]), "x": np.arange(grid[1]),
              "img_y": np.arange(h), "img_x": np.arange(w)}
    ex = ("explainer",) if not isinstance(method, str) else ()
    stack = (lambda xs: np.stack(xs)) if ex else (lambda xs: xs[0])
    data = {
        "relevance": (ex + ("sample", "y", "x"), stack([results[m].patch.cpu().numpy() for m in run]),
                      {"long_name": "relevance on the patch grid"}),
        "relevance_pixel": (ex + ("sample", "img_y", "img_x"), stack([results[m].pixel.cpu().numpy() for m in run]),
                            {"long_name": "relevance on the pixel grid"}),
        "target": ("sample", tgt.cpu().numpy()), "predicted": ("sample", pred.cpu().numpy()),
    }
    for m in run:
        data.update({k: ("sample", v.double().cpu().numpy()) for k, v in results[m].extra.items()})
    coords["explainer"] = list(run) if ex else method
    coords["stride"] = int(round(h / grid[0]))  # pixels per patch-grid cell (docs/conventions.md)
    config = config_json(method=methods, target=None if target is None else tgt.tolist(), options=options)
    return xr.Dataset(data, coords=coords).assign_attrs(
        analysis="explain", config=config, native=json.dumps({m: get_explainer(m).native for m in run}),
        papers=json.dumps({m: get_explainer(m).paper for m in run}), not_applicable=json.dumps(not_applicable))
