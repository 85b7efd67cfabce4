"""Window-head saliency and pruning masks of Swin Transformers (SlimSwin, papers/004), as xarray.

The extractor ``window_saliency`` returns, for every (layer, window, head) *pair* of a timm Swin,
the gradient of the loss with respect to the pair's gate (SlimSwin §IV-C: a ``W x H`` gate
multiplying Q, K and V of every attention layer, all ones) for each image, its reduction over the
images (the score Algorithm 1 ranks), and the pair's 0/1 mask. It works on

* a teacher (a plain timm Swin): all-ones gates are installed on a copy, every mask is 1;
* a SlimSwin run (``load_model("slimswin-r0.3333-swin-demo")``, a gated Swin): its own gates and
  masks; a pruned pair has gradient 0.

Pairs are flattened to one ``pair`` dim (DESIGN.md) in (layer, window, head) order, with coords
``stage``, ``layer``, ``window``, ``head``, ``shifted``, ``prunable`` (not in the last stage, §V-A),
where the window sits -- ``window_y``/``window_x``: its top-left token in the *unshifted* token grid
of the stage (:func:`methods.slimswin.window_positions`; a window of a shifted layer extends
``window_h x window_w`` tokens from there and wraps around the grid), ``window_row``/``window_col``:
its row/column in timm's ``window_partition`` order (the ``window_y``/``window_x`` of the
``window_attention`` extractor), ``shift_y``/``shift_x``, ``map_h``/``map_w`` (token grid of the
stage) and ``token_px`` (input pixels per token side).

Pure xarray views of these Datasets (window grids, layer-wise ratios, accuracy against the ratio) are in
:mod:`workbench.plots.slimswin_views`, which plots use too.

For the attention maps inside the windows use the ``window_attention`` extractor on the teacher.
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
import xarray as xr

from workbench.analysis import Example, examples, register
from workbench.provenance import config_json

Reduce = Literal["abs_of_mean", "abs", "signed"]

__all__ = ["extract_window_saliency", "reduce_gradient", "gated_hooks", "active_pairs", "deploy_form_hint"]

_GATED_HOOKS: list[bool] = []


def gated_hooks() -> None:
    """Give SlimSwin's gated window attention (``methods.slimswin.GatedWindowAttention``, which names no
    ``hook_pattern`` of its own) the hook point of timm's ``WindowAttention`` (its ``attn_drop`` output), once per
    process, so that the ``window_attention`` extractor reads a gated model (the explorer's ``prepare``)."""
    if _GATED_HOOKS:
        return
    import methods.slimswin as ss
    from methods.hooks import Site, adapter

    def sites(attn) -> dict[str, Site]:
        return {"hook_pattern": Site(attn.attn_drop, "output")}

    adapter(ss.GatedWindowAttention)(sites)
    _GATED_HOOKS.append(True)


def active_pairs(model) -> dict[int, np.ndarray] | None:
    """``{layer: (window, head) bool}`` the (window, head) pairs a SlimSwin model keeps (:func:`methods.slimswin.get_masks`);
    None when nothing is pruned (a plain Swin teacher: no heads to grey)."""
    import methods.slimswin as ss

    masks = ss.get_masks(model)
    if all(bool(m.all()) for m in masks):
        return None
    return {i: m.cpu().numpy() for i, m in enumerate(masks)}


def deploy_form_hint(model) -> str | None:
    """Why the explorer cannot show ``model``'s window attention when it is SlimSwin's pruned (deploy) form; else None."""
    import methods.slimswin as ss

    if any(isinstance(m, ss.PrunedWindowAttention) for m in model.modules()):
        return ("this is SlimSwin's pruned (deploy) form, which computes only the active (window, head) pairs "
                "and so has no attention maps to show; explore the run's gated model (load_model(run_id))")
    return None


def reduce_gradient(gradient: xr.DataArray, reduce: Reduce = "abs_of_mean") -> xr.DataArray:
    """Per-sample gate gradients ``(sample, pair)`` -> one score per pair, as Algorithm 1 ranks them.

    ``"abs_of_mean"``: ``|mean_x G|`` (default; Alg. 1 line 8 averaged, §IV-C's "magnitude");
    ``"abs"``: ``mean_x |G|`` (Michel et al.); ``"signed"``: ``mean_x G``. See
    :func:`methods.slimswin.window_head_saliency`.
    """
    if reduce == "abs_of_mean":
        return abs(gradient.mean("sample"))
    if reduce == "abs":
        return abs(gradient).mean("sample")
    if reduce == "signed":
        return gradient.mean("sample")
    raise ValueError(f"reduce must be 'abs_of_mean', 'abs' or 'signed', got {reduce!r}")


def _pair_coords(model, layers: Sequence[int], masks) -> dict[str, tuple[str, np.ndarray]]:
    from methods.slimswin import prunable_layers, swin_layers, window_positions

    geos, positions = swin_layers(model), window_positions(model)
    prunable = set(prunable_layers(model))
    patch = model.patch_embed.patch_size[0]
    rows: dict[str, list] = {k: [] for k in ("stage", "layer", "window", "head", "window_row", "window_col", "window_y",
                                             "window_x", "window_h", "window_w", "shift_y", "shift_x", "shifted",
                                             "prunable", "map_h", "map_w", "token_px", "mask")}
    for l in layers:
        geo, pos = geos[l], positions[l]
        _, nx = geo.windows_hw
        for w in range(geo.num_windows):
            for h in range(geo.num_heads):
                for key, value in (("stage", geo.stage), ("layer", l), ("window", w), ("head", h),
                                   ("window_row", w // nx), ("window_col", w % nx),
                                   ("window_y", pos[w].window_y), ("window_x", pos[w].window_x),
                                   ("window_h", geo.window_size[0]), ("window_w", geo.window_size[1]),
                                   ("shift_y", geo.shift_size[0]), ("shift_x", geo.shift_size[1]),
                                   ("shifted", geo.shifted), ("prunable", l in prunable),
                                   ("map_h", geo.resolution[0]), ("map_w", geo.resolution[1]),
                                   ("token_px", patch * 2 ** geo.stage), ("mask", bool(masks[l][w, h]))):
                    rows[key].append(value)
    return {k: ("pair", np.asarray(v)) for k, v in rows.items()}


def _select_layers(n_layers: int, layers) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    wanted = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
    out = []
    for i in wanted:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -n_layers <= i < n_layers:
            raise ValueError(f"layer index {i!r} out of range for a Swin with {n_layers} attention layers (0..{n_layers - 1})")
        out.append(int(i) % n_layers)
    if not out or len(set(out)) != len(out):
        raise ValueError(f"layers must select distinct attention layers, got {wanted}")
    return sorted(out)


@register("window_saliency", example=Example(examples.swin, (2, 1, 32, 32), (0, 1)))
def extract_window_saliency(
    model,
    images,
    *,
    layers: int | Sequence[int] | None = None,
    targets=None,
    reduce: Reduce = "abs_of_mean",
    gate_mode: Literal["qkv", "output"] = "qkv",
    batch_size: int = 64,
) -> xr.Dataset:
    """Gate-gradient saliency and masks of every window-head pair of a timm Swin (SlimSwin §IV-C).

    Args:
        model: eval-mode timm ``SwinTransformer``: plain (a teacher: all-ones gates of ``gate_mode``
            are installed on a copy) or gated (:func:`methods.slimswin.add_gates`, e.g. a SlimSwin
            run loaded with ``load_model``: its own gates and masks). Left unchanged.
        images: ``(B, C, H, W)`` float tensor, normalised for the model.
        layers: attention layers (global block indices, negative allowed); ``None`` for all.
        targets: ``(B,)`` class indices for the cross-entropy loss; ``None`` uses the model's own
            predictions (``run_analysis`` passes the image labels when they are known).
        reduce: how per-sample gradients become ``saliency`` (:func:`reduce_gradient`).
        gate_mode: gate placement installed on a plain model (``"qkv"``: the paper; ``"output"``:
            Michel et al.); a gated model keeps its own.
        batch_size: images per forward/backward pass (memory only).

    Returns:
        Dataset with ``gradient(sample, pair)`` (``d CE(x) / d gate``, float64), ``saliency(pair)``
        (its reduction), ``mask(pair)`` (True = pair computed), ``target(sample)`` (the class the loss
        used) and ``predicted(sample)``; pair coords as in the module docstring; attrs ``analysis``,
        ``config`` (incl. ``targets``: ``"given"`` or ``"predictions"``).

    Raises:
        ValueError: a model in training mode, not a timm Swin, a pruned model (no gates), bad
            ``layers``, ``targets`` of the wrong length.
    """
    import copy

    from methods.slimswin import add_gates, get_masks, is_gated, swin_blocks

    _check_saliency_input(model, images)
    selected = _select_layers(len(swin_blocks(model)), layers)
    gated = model if is_gated(model) else add_gates(copy.deepcopy(model), mode=gate_mode)
    images = images.to(next(gated.parameters()).device)
    predicted, target, source = _loss_targets(gated, images, targets, batch_size)
    gradient = _gate_gradients(gated, images, target, selected, batch_size)  # (B, pairs)
    coords = _pair_coords(gated, selected, get_masks(gated))
    mask = coords.pop("mask")
    ds = xr.Dataset(
        {"gradient": (("sample", "pair"), gradient), "mask": mask,
         "target": ("sample", target.cpu().numpy()), "predicted": ("sample", predicted.cpu().numpy())},
        coords={"sample": np.arange(len(images)), "pair": np.arange(gradient.shape[1]), **coords},
    )
    ds["saliency"] = reduce_gradient(ds["gradient"], reduce)
    ds["gradient"].attrs.update(long_name="gate gradient d CE / d g", units="loss per unit gate")
    ds["saliency"].attrs.update(long_name=f"window-head saliency ({reduce})", units="loss per unit gate")
    ds["mask"].attrs.update(long_name="pair computed (1) or pruned (0)")
    config = config_json(layers=None if layers is None else selected, reduce=reduce, targets=source,
                         gate_mode=_gate_mode(gated), loss="cross_entropy")
    return ds.assign_attrs(analysis="window_saliency", config=config)


def _check_saliency_input(model, images) -> None:
    """Raise a ValueError unless ``model`` is an eval-mode, gated or plain timm Swin and ``images`` a batch."""
    import torch

    from methods.slimswin import check_swin, swin_blocks

    check_swin(model)
    if model.training or any(m.training for m in model.modules()):
        raise ValueError("window_saliency needs an eval-mode model (call model.eval()): dropout and drop-path "
                         "would make the gradients random")
    if any(hasattr(b.attn, "active") for b in swin_blocks(model)):
        raise ValueError("this Swin is pruned (to_pruned) and has no gates; analyse the gated model instead "
                         "(load_model(run_id).model)")
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}")


def _loss_targets(gated, images, targets, batch_size: int):
    """``(predicted, target, source)``: the model's top-1 classes ``(B,)``, the classes the loss uses (``targets``, or
    the predictions when None) and which of the two it is (``"given"`` / ``"predictions"``)."""
    import torch

    with torch.no_grad():
        predicted = torch.cat([gated(images[i: i + batch_size]).argmax(-1) for i in range(0, len(images), batch_size)])
    if targets is None:
        return predicted, predicted, "predictions"
    target = torch.as_tensor(targets, device=images.device).long()
    if target.shape != (len(images),):
        raise ValueError(f"targets must be one class index per image, shape ({len(images)},), got {tuple(target.shape)}")
    return predicted, target, "given"


def _gate_gradients(gated, images, target, selected: Sequence[int], batch_size: int) -> np.ndarray:
    """``d CE(x) / d gate`` per image and pair of the ``selected`` layers: ``(B, pairs)`` float64, pairs in
    (layer, window, head) order."""
    import torch
    import torch.nn.functional as F

    from methods.devices import differentiable
    from methods.slimswin import gate_probes

    grads = []
    for i in range(0, len(images), batch_size):
        x, t = images[i: i + batch_size], target[i: i + batch_size]
        with torch.enable_grad(), differentiable(gated), gate_probes(gated, x.shape[0]) as probes:  # also under no_grad
            loss = F.cross_entropy(gated(x), t, reduction="sum")  # sum_b loss_b: d/d probe[b] = G[b]
            g = torch.autograd.grad(loss, [probes[l] for l in selected])  # each (b, W, H)
        grads.append(torch.cat([gl.detach().reshape(x.shape[0], -1) for gl in g], dim=1).double().cpu())  # (b, pairs)
    return torch.cat(grads).cpu().numpy()  # (B, pairs) in (layer, window, head) order


def _gate_mode(model) -> str:
    """Gate mode of a gated Swin (``"qkv"`` or ``"output"``)."""
    from methods.slimswin import gated_modules

    return gated_modules(model)[0].mode
