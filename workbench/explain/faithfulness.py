"""Faithfulness of explanations, tested the field's way.

**Positive / negative perturbation** (Chefer, Gur & Wolf, CVPR 2021, §4 "Perturbation tests"): "we gradually
remove 10%, 20%, ..., 90% of the tokens" in the order of the explanation, most relevant first (*positive*: a
faithful map makes the score fall fast, lower AUC is better) or least relevant first (*negative*: higher AUC is
better), and integrate the score. Here:

- a patch of the explanation's patch grid is removed by setting its pixels to 0 in normalised space (the dataset
  mean colour, as :mod:`workbench.analysis.faithfulness` deletes pixels); ties in the ranking: lower index first;
- fractions 0, 0.1, …, 0.9 of the patches (``fractions``), k = round(fraction × patches) removed;
- the score per step: ``"probability"`` (softmax probability of the explained class) or ``"accuracy"``
  (prediction == ``labels``, by default the explained class);
- AUC: trapezoidal rule over the fractions divided by their span (the mean score over the curve, in [0, 1];
  × 100 is the percentage scale of Chefer et al.'s tables);
- batched: every step of every image of a chunk goes through the model in one forward pass.

**Randomisation check** (Adebayo et al., NeurIPS 2018, "Sanity Checks for Saliency Maps", cascading model
parameter randomisation): re-initialise the classifier head and the top ``blocks`` blocks of a copy of the model,
explain the same images for the same classes, and measure the Spearman rank correlation of each image's patch map
before and after. A map that does not change does not depend on what the model learned: the check fails.
Verdict: ``"changes"`` when the upper end of the 95 % interval of the mean correlation is below ``max_rho``,
``"unchanged"`` when its lower end is above, else ``"inconclusive"``.
"""

from __future__ import annotations

import copy
import re
import warnings
from typing import Literal, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import xarray as xr

from methods.hooks import hook_points
from workbench.analysis.attribution import rank_correlation
from workbench.analysis.faithfulness import pixel_ranks
from workbench.explain.core import attribute, resolve_target
from workbench.explain.grids import to_pixels
from workbench.provenance import config_json
from workbench.stats import z_for

__all__ = ["CHEFER_FRACTIONS", "ROAD_PERCENTILES", "EXPLAINED", "perturbation_curves", "both_curves", "perturbation",
           "road", "faithfulness", "top_modules", "randomized", "randomization", "failing_randomization"]

Order = Literal["positive", "negative"]
Score = Literal["probability", "accuracy"]
CHEFER_FRACTIONS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(10))  # 0.0 .. 0.9
ROAD_PERCENTILES: tuple[int, ...] = tuple(range(10, 100, 10))  # grad-cam's ROAD thresholds (10 .. 90)
EXPLAINED = ("predicted", "target")  # the class an explanation is made for: the model's prediction or the label


@torch.no_grad()
def perturbation_curves(model: nn.Module, images: torch.Tensor, maps: torch.Tensor, target: torch.Tensor, *,
                        order: Order = "positive", fractions: Sequence[float] = CHEFER_FRACTIONS,
                        score: Score = "probability", labels: torch.Tensor | None = None, batch_size: int = 256
                        ) -> np.ndarray:
    """Score after removing ``fractions`` of the patches of ``maps`` in ``order``, ``(B, len(fractions))`` float64.

    Args:
        model: eval-mode classifier.
        images: ``(B, C, H, W)`` normalised.
        maps: ``(B, gh, gw)`` patch maps (higher = more relevant).
        target: ``(B,)`` the explained class (its probability is the ``"probability"`` score).
        labels: ``(B,)`` the class ``"accuracy"`` compares the prediction with (default ``target``).
        batch_size: model inputs per forward pass.
    """
    if score not in ("probability", "accuracy"):
        raise ValueError(f"score must be 'probability' or 'accuracy', got {score!r}")
    prob, acc = both_curves(model, images, maps, target, order=order, fractions=fractions, labels=labels,
                            batch_size=batch_size)
    return prob if score == "probability" else acc


@torch.no_grad()
def both_curves(model: nn.Module, images: torch.Tensor, maps: torch.Tensor, target: torch.Tensor, *,
                order: Order = "positive", fractions: Sequence[float] = CHEFER_FRACTIONS,
                labels: torch.Tensor | None = None, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Both scores of :func:`perturbation_curves` from the same forward passes: ``(probability, accuracy)``, each
    ``(B, len(fractions))`` float64."""
    if order not in ("positive", "negative"):
        raise ValueError(f"order must be 'positive' or 'negative', got {order!r}")
    b, c, h, w = images.shape
    if maps.ndim != 3 or len(maps) != b:
        raise ValueError(f"maps must be (B, gh, gw) with B = {b}, got {tuple(maps.shape)}")
    n = maps.shape[1] * maps.shape[2]
    counts = torch.tensor([round(f * n) for f in fractions], device=images.device)  # patches removed per step
    ranks = pixel_ranks(maps.to(images.device))  # (B, patches): 0 = most relevant
    if order == "negative":
        ranks = n - 1 - ranks  # least relevant first
    labels = target if labels is None else labels
    steps = len(counts)
    chunk = max(1, batch_size // steps)
    prob, acc = [], []
    for start in range(0, b, chunk):
        sl = slice(start, min(b, start + chunk))
        m = sl.stop - sl.start
        gone = (ranks[sl, None, :] < counts[None, :, None]).view(m * steps, *maps.shape[1:])  # (m·S, gh, gw)
        gone = to_pixels(gone.float(), (h, w)).bool().view(m, steps, 1, h, w)  # each patch over its pixels
        x = torch.where(gone, torch.zeros((), dtype=images.dtype, device=images.device), images[sl, None])
        logits = model(x.reshape(m * steps, c, h, w)).double().view(m, steps, -1)  # (m, S, classes)
        prob.append(F.softmax(logits, -1).gather(-1, target[sl].view(m, 1, 1).expand(m, steps, 1))[..., 0].cpu())
        acc.append((logits.argmax(-1) == labels[sl].view(m, 1)).double().cpu())
    return torch.cat(prob).cpu().numpy(), torch.cat(acc).cpu().numpy()


def _auc(curves: np.ndarray, fractions: Sequence[float]) -> np.ndarray:
    f = np.asarray(fractions, dtype=np.float64)
    return np.trapezoid(curves, f, axis=-1) / (f[-1] - f[0])


def perturbation(model: nn.Module, images: torch.Tensor, explanation: xr.Dataset, *,
                 fractions: Sequence[float] = CHEFER_FRACTIONS, score: Score = "probability",
                 labels: torch.Tensor | None = None, batch_size: int = 256) -> xr.Dataset:
    """Positive and negative perturbation of every map of an :func:`workbench.explain.attribute` Dataset.

    The explained class is the Dataset's ``target``.

    Returns:
        Dataset with ``score(explainer, order, sample, fraction)`` and ``auc(explainer, order, sample)`` (float64;
        ``explainer`` as in the input: a dim, or a scalar coord), attrs ``analysis="perturbation"``, ``config``.
    """
    rel = explanation["relevance"]
    names = list(np.atleast_1d(explanation["explainer"].values))
    per = rel if "explainer" in rel.dims else rel.expand_dims("explainer")
    target = torch.as_tensor(explanation["target"].values, device=images.device)
    curves = np.stack([np.stack([perturbation_curves(
        model, images, torch.as_tensor(per.sel(explainer=e).values), target, order=o, fractions=fractions,
        score=score, labels=labels, batch_size=batch_size) for o in ("positive", "negative")]) for e in names])
    ds = xr.Dataset({"score": (("explainer", "order", "sample", "fraction"), curves),
                     "auc": (("explainer", "order", "sample"), _auc(curves, fractions))},
                    coords={"explainer": names, "order": ["positive", "negative"],
                            "sample": explanation["sample"].values, "fraction": list(fractions)})
    if "explainer" not in rel.dims:
        ds = ds.isel(explainer=0)
    return ds.assign_attrs(analysis="perturbation", config=config_json(fractions=list(fractions), score=score))


def road(model: nn.Module, images: torch.Tensor, pixel_maps: torch.Tensor, target: torch.Tensor, *,
         percentiles: Sequence[int] = ROAD_PERCENTILES, seed: int = 0) -> np.ndarray:
    """ROAD (Rong et al., ICML 2022) through the ``grad-cam`` package (:mod:`pytorch_grad_cam.metrics.road`):
    ``(B, 2)`` float64, columns MoRF and LeRF.

    Each is the change of the explained class's softmax probability when the pixels above (MoRF: most relevant first;
    lower is better) or below (LeRF: least relevant first; higher is better) each percentile of the map are replaced
    by noisy linear imputation from their neighbours, averaged over ``percentiles``. The imputation's noise is drawn
    under ``seed`` (the global RNG is left as it was).

    Args:
        pixel_maps: ``(B, H, W)`` maps on the input's pixel grid.
        target: ``(B,)`` the explained class.
    """
    from pytorch_grad_cam.metrics.road import ROADLeastRelevantFirstAverage, ROADMostRelevantFirstAverage
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputSoftmaxTarget

    if pixel_maps.shape != (images.shape[0], *images.shape[-2:]):
        raise ValueError(f"ROAD needs one pixel map per image, (B, H, W) = {(images.shape[0], *images.shape[-2:])}, "
                         f"got {tuple(pixel_maps.shape)}")
    targets = [ClassifierOutputSoftmaxTarget(int(t)) for t in target]
    cams = pixel_maps.detach().float().cpu().numpy()
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # grad-cam's imputer hands torch tensors to numpy (np.argwhere), which NumPy 2 flags as deprecated
        warnings.filterwarnings("ignore", message=".*__array_wrap__.*", category=DeprecationWarning)
        torch.manual_seed(seed)
        morf = ROADMostRelevantFirstAverage(list(percentiles))(images, cams, targets, model)
        lerf = ROADLeastRelevantFirstAverage(list(percentiles))(images, cams, targets, model)
    return np.stack([morf, lerf], 1).astype(np.float64)


def _target_maps(model: nn.Module, images: torch.Tensor, pred_ds: xr.Dataset, tgt: torch.Tensor, batch_size: int,
                 options: dict) -> tuple[np.ndarray, np.ndarray]:
    """The maps of the ``target`` class ``(explainer, sample, gh, gw)`` and ``(explainer, sample, H, W)``: the
    predicted class's where they agree or the method is not class-specific, recomputed where they differ."""
    from workbench.explain.registry import get_explainer

    patch, pixel = pred_ds["relevance"].values.copy(), pred_ds["relevance_pixel"].values.copy()
    pred = torch.as_tensor(pred_ds["predicted"].values, device=tgt.device)
    differ = torch.nonzero(tgt != pred).flatten()
    specific = [str(e) for e in pred_ds["explainer"].values if get_explainer(str(e)).class_specific]
    if len(differ) and specific:
        ds = attribute(model, images[differ], method=specific, target=tgt[differ], batch_size=batch_size, **options)
        rows = differ.cpu().numpy()
        for e in specific:
            i = list(pred_ds["explainer"].values).index(e)
            patch[i, rows] = ds["relevance"].sel(explainer=e).values
            pixel[i, rows] = ds["relevance_pixel"].sel(explainer=e).values
    return patch, pixel


def faithfulness(model: nn.Module, images: torch.Tensor, labels: torch.Tensor | None, *,
                 method: str | Sequence[str], fractions: Sequence[float] = CHEFER_FRACTIONS,
                 road_percentiles: Sequence[int] | None = None, seed: int = 0, batch_size: int = 32,
                 keep_maps: bool = False, **options) -> xr.Dataset:
    """Chefer's positive / negative perturbation for the predicted and the target class, and optionally ROAD, of
    every explainer of ``method`` that applies, per image.

    The score at each step is Chefer et al.'s: whether the model's prediction equals the image's label (``labels``;
    an image with label -1 is scored against the original prediction, and its target class is its prediction), and
    beside it the softmax probability of the explained class. Maps of the target class are computed only where it
    differs from the prediction (elsewhere they are the same map). ROAD (``road_percentiles``: None leaves it out) is
    measured on the predicted class's pixel maps.

    Returns:
        Dataset with ``auc(explainer, explained, order, sample)`` (accuracy, Chefer's, in [0, 1]),
        ``auc_probability`` (same dims), ``curve`` / ``curve_probability`` (``…, fraction``), with ROAD
        ``road(explainer, road_order, sample)`` (``road_order`` = MoRF, LeRF), ``predicted(sample)``,
        ``label(sample)``, ``target(sample)``; with ``keep_maps`` the maps ``relevance(explainer, explained, sample,
        y, x)`` and ``relevance_pixel(…, img_y, img_x)``; attrs ``analysis="faithfulness"``, ``config``,
        ``not_applicable`` (JSON: method -> why).
    """
    names = [method] if isinstance(method, str) else list(method)
    pred_ds = attribute(model, images, method=names, batch_size=batch_size, **options)
    run = [str(e) for e in pred_ds["explainer"].values]
    pred = torch.as_tensor(pred_ds["predicted"].values, device=images.device)
    lab = pred.clone() if labels is None else torch.as_tensor(labels, device=images.device).long()
    tgt = torch.where(lab >= 0, lab, pred)  # the label; the prediction where the label is unknown
    t_patch, t_pixel = _target_maps(model, images, pred_ds, tgt, batch_size, options)
    patch = np.stack([pred_ds["relevance"].values, t_patch], 1)  # (explainer, explained, sample, gh, gw)
    differ = (tgt != pred).cpu().numpy()
    curves = np.zeros((2, len(run), 2, 2, len(images), len(fractions)))  # (score, explainer, explained, order, ...)
    for i in range(len(run)):
        for o, order in enumerate(("positive", "negative")):
            p, a = both_curves(model, images, torch.as_tensor(patch[i, 0]), pred, order=order, fractions=fractions,
                               labels=tgt)
            curves[:, i, 0, o] = curves[:, i, 1, o] = p, a
            if differ.any():  # the target class's own map and probability where it is not the prediction
                rows = np.flatnonzero(differ)
                p, a = both_curves(model, images[rows], torch.as_tensor(patch[i, 1, rows]), tgt[rows], order=order,
                                   fractions=fractions, labels=tgt[rows])
                curves[0, i, 1, o, rows], curves[1, i, 1, o, rows] = p, a
    dims = ("explainer", "explained", "order", "sample")
    data = {"curve": (dims + ("fraction",), curves[1]), "curve_probability": (dims + ("fraction",), curves[0]),
            "auc": (dims, _auc(curves[1], fractions)), "auc_probability": (dims, _auc(curves[0], fractions)),
            "predicted": ("sample", pred.cpu().numpy()), "target": ("sample", tgt.cpu().numpy()),
            "label": ("sample", lab.cpu().numpy())}
    if road_percentiles is not None:
        pix = torch.as_tensor(pred_ds["relevance_pixel"].values)
        data["road"] = (("explainer", "road_order", "sample"), np.stack(
            [road(model, images, pix[i], pred, percentiles=road_percentiles, seed=seed).T for i in range(len(run))]))
    if keep_maps:
        data["relevance"] = (("explainer", "explained", "sample", "y", "x"), patch)
        data["relevance_pixel"] = (("explainer", "explained", "sample", "img_y", "img_x"),
                                   np.stack([pred_ds["relevance_pixel"].values, t_pixel], 1))
    ds = xr.Dataset(data, coords={"explainer": run, "explained": list(EXPLAINED), "order": ["positive", "negative"],
                                  "sample": np.arange(len(images)), "fraction": list(fractions),
                                  **({"road_order": ["MoRF", "LeRF"]} if road_percentiles is not None else {})})
    ds["auc"].attrs.update(units="fraction", long_name="area under the accuracy curve (Chefer et al.)")
    return ds.assign_attrs(analysis="faithfulness", not_applicable=pred_ds.attrs["not_applicable"],
                           config=config_json(method=names, fractions=list(fractions), seed=seed, options=options,
                                              road_percentiles=None if road_percentiles is None else list(road_percentiles)))


def top_modules(model: nn.Module, blocks: int) -> list[str]:
    """Names of the classifier head and the last ``blocks`` blocks (ViT blocks or CNN stages, from the hook points
    ``*.hook_resid_post`` / ``stages.{i}.hook_out``), top first.

    Raises:
        ValueError: ``blocks`` out of range, or a model without such hook points.
    """
    points = hook_points(model)
    found = [n.removesuffix(".hook_resid_post") for n in points if re.fullmatch(r"(.*\.)?blocks\.\d+\.hook_resid_post", n)]
    if not found:  # a CNN: its stages' modules (an adapter's site)
        found = [n for n in points if re.fullmatch(r"stages\.\d+\.hook_out", n)]
    if not found:
        raise ValueError(f"{type(model).__name__} names no blocks (*.blocks.{{i}}.hook_resid_post) or stages")
    if not 0 <= blocks <= len(found):
        raise ValueError(f"blocks must be in 0..{len(found)}, got {blocks}")
    head = [n for n, m in model.named_modules() if m is model.get_classifier()] if hasattr(model, "get_classifier") else []
    return head + found[len(found) - blocks:][::-1]


def randomized(model: nn.Module, blocks: int, seed: int = 0) -> nn.Module:
    """A copy of ``model`` whose head and top ``blocks`` blocks are re-initialised (``reset_parameters`` where a
    module has it, else N(0, 0.02²)); seeded, the original untouched."""
    out = copy.deepcopy(model)
    points = hook_points(out)
    mods = []
    for name in top_modules(model, blocks):
        try:
            mods.append(out.get_submodule(name))
        except AttributeError:
            mods.append(points[name].module)  # an adapter's site (CNN stage)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        done: set[int] = set()
        for top in mods:
            for sub in top.modules():
                if hasattr(sub, "reset_parameters"):
                    sub.reset_parameters()
                    done.update(id(p) for p in sub.parameters(recurse=False))
            for p in top.parameters():
                if id(p) not in done:
                    p.normal_(0.0, 0.02)
    return out.eval()


def randomization(model: nn.Module, images: torch.Tensor, method: str | Sequence[str], *, blocks: int = 1,
                  target: torch.Tensor | None = None, seed: int = 0, max_rho: float = 0.5, **options) -> xr.Dataset:
    """Adebayo's randomisation check (module docstring) of one or several explainers.

    The explained class is ``target`` (None: the original model's prediction), the same for both models.

    Returns:
        Dataset with ``spearman(explainer, sample)``, ``mean``, ``low``, ``high`` (95 % interval) and ``verdict``
        per explainer, ``n(explainer)`` (images with non-constant maps on both sides); attrs ``analysis="randomization"``, ``config``.
    """
    names = [method] if isinstance(method, str) else list(method)
    tgt, _ = resolve_target(model, images, target)
    before = attribute(model, images, method=names, target=tgt, **options)
    after = attribute(randomized(model, blocks, seed), images, method=names, target=tgt, **options)
    rho = np.stack([rank_correlation(before["relevance"].sel(explainer=e).values,
                                     after["relevance"].sel(explainer=e).values) for e in before["explainer"].values])
    ok = np.isfinite(rho)  # a constant map (e.g. an all-zero Grad-CAM) has no ranks
    n = ok.sum(1)
    mean = np.array([r[k].mean() if k.any() else np.nan for r, k in zip(rho, ok)])
    sd = np.array([r[k].std(ddof=1) if k.sum() > 1 else np.nan for r, k in zip(rho, ok)])
    half = z_for(0.95) * sd / np.sqrt(np.maximum(n, 1))
    low, high = mean - half, mean + half
    verdict = np.where(n < 2, "undefined: constant maps", np.where(
        high < max_rho, "changes", np.where(low > max_rho, "unchanged", "inconclusive")))
    return xr.Dataset({"spearman": (("explainer", "sample"), rho), "mean": ("explainer", mean),
                       "low": ("explainer", low), "high": ("explainer", high), "verdict": ("explainer", verdict),
                       "n": ("explainer", n)},
                      coords={"explainer": before["explainer"].values, "sample": np.arange(rho.shape[1])}).assign_attrs(
        analysis="randomization", config=config_json(blocks=blocks, seed=seed, max_rho=max_rho, options=options),
        not_applicable=before.attrs["not_applicable"])


def failing_randomization(ds: xr.Dataset) -> list[str]:
    """The explainers of a :func:`randomization` Dataset whose maps did not change beyond noise (verdict
    ``"unchanged"``): they fail Adebayo et al.'s check, and a table of them names them."""
    return [str(e) for e, v in zip(ds["explainer"].values, ds["verdict"].values) if str(v) == "unchanged"]
