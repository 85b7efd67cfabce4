"""Teacher vs compressed students: one comparison Dataset for any pair of models the workbench loads.

:func:`compare_models` runs five parts on the same images and returns one Dataset with a ``model``
dim (the teacher first, then the students):

``cka`` (:mod:`~workbench.analysis.cka`)
    linear CKA of block outputs per (teacher layer, student layer), debiased and biased, pooled
    three ways; block-output cosine where layers correspond one to one.
``maps`` (:mod:`~workbench.analysis.token_agreement`)
    the teacher's attention against the student's attention (``*.attn.hook_pattern``) or, for
    attention-free blocks (FAR), its gradient-saliency dependency; per layer and head.
``predictions`` (:mod:`~workbench.analysis.predictions`)
    top-1 agreement, KL(teacher ‖ student), accuracy on the labels.
``attributions`` (:mod:`~workbench.analysis.attribution`)
    Integrated Gradients, Saliency, attention rollout (ViTs) and a random map of the *teacher's
    predicted class* (``target="teacher"``), on the image grid; each student's agreement with the teacher.
``faithfulness`` (:mod:`~workbench.analysis.faithfulness`)
    deletion / insertion curves of every model for its own maps and their AUC; infidelity of IG.

Which layers: a model's *blocks* are its hook points ``*.hook_resid_post`` (ViT and Swin blocks,
FAR blocks, any method's blocks named by the contract), or, for a model without any,
``stages.*.hook_out`` (CNN / SA-ResNet stages); override with ``representations``. A block's name
is the hook name without its suffix (``blocks.3``, ``layers.1.blocks.0``, ``stages.2``). Token maps
are matched by block name, so the teacher's ``blocks.3`` meets the student's ``blocks.3`` — unless the
student declares a *correspondence* (``correspondence={label: groups}``: its ``i``-th attention block, in
forward order, replaces the teacher blocks ``groups[i]``, e.g. a Non-deep 3×2 student ``((0, 1), (2, 3), (4, 5))``).
Then its block ``i`` is scored against the **last** teacher block of ``groups[i]`` and stored at that teacher
block's position (the other positions of the group are NaN): the student block's output stands in for the
residual stream after the whole group, and it is the pairing the Non-deep students were distilled with (their
attention-map loss matches block i to the group's last teacher block, ``methods.nondeep.teacher_layers``) and the one
``nondeep.attention`` draws; the mean of the group's maps would score a map no teacher block computes.

Where a part does not apply to a pair (no attention in a CNN teacher, no rollout for a FAR
student, different class counts), it is left out — NaN for that model, or the part's variables
absent — and the reason is in the attrs ``skipped`` (whole parts) or ``notes`` (part -> model -> reason).

Dataset layout (dims: DESIGN.md's ``model``, ``sample``, ``layer``, ``head``, ``y``, ``x``, ``step``
plus these, added here):

- ``teacher_layer``, ``student_layer`` — block indices of the teacher / of each student (students
  of different depths are NaN-padded to the deepest); coords ``teacher_layer_name(teacher_layer)``,
  ``student_layer_name(model, student_layer)`` ("" where padded), ``depth(model)``;
- ``pooling`` — "mean" (token-averaged), "token" (tokens as examples on a common grid), "cls";
- ``estimator`` — "debiased", "biased";
- ``attribution`` — "integrated_gradients", "saliency", "rollout", "random".

Variables (present when their part ran):

- ``cka(model, pooling, estimator, teacher_layer, student_layer)`` float64 (the teacher's row: its
  self-similarity); ``block_cosine(model, sample, layer)`` float64;
- ``map_js``/``map_topk``/``map_spearman(model, sample, layer, head)`` and ``…_avg(model, sample, layer)``
  float64, coords ``map_measure(model, layer)`` ("attention", "saliency" or ""), ``num_heads(layer)``;
  ``layer`` = the teacher's block index, coord ``layer_name(layer)``; coord ``map_student_block(model, layer)``
  = the student block scored there ("" where none). The teacher's row holds its
  own saliency against its own attention when any student is compared by saliency (the agreement
  of the two measures on one network: the reference for an attention-free student), else NaN;
- ``pred``, ``top1_agreement``, ``kl``, ``correct(model, sample)``; ``agreement``, ``kl_mean``,
  ``accuracy(model)``; coord ``label(sample)`` (-1 = unknown);
- ``attribution_map(model, attribution, sample, y, x)`` float32 (``y``, ``x`` = image pixels here,
  not patches); ``ig_delta(model, sample)`` (relative IG completeness gap); ``ig_steps(model, sample)``
  (Gauss–Legendre nodes used: ``ig_steps``, more where ``ig_tolerance`` asked for them; 0 = no IG);
  ``attribution_spearman``/``attribution_topk``/``attribution_cosine(model, attribution, sample)``
  against the teacher's map (teacher: NaN); coord ``target(sample)`` — the class explained
  (``target(model, sample)`` with ``target="own"``);
- ``deletion``/``insertion(model, attribution, sample, step)`` (probability of the target),
  coord ``fraction(step)``; ``deletion_auc``/``insertion_auc(model, attribution, sample)``;
  ``infidelity(model, sample)`` (captum, of IG).

attrs: ``analysis="compare"``, ``config`` (JSON of the options), ``reference`` (the teacher's
label), ``skipped``, ``notes``, ``seconds`` (JSON: wall time per part and of the shared forward
pass). :func:`stamp_comparison` adds DESIGN.md's provenance (the teacher's) and every model's source.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn
import xarray as xr

from methods.hooks import hook_points, run_with_cache
from workbench.analysis.attribution import ATTRIBUTIONS, attribution_maps, map_agreement
from workbench.analysis.cka import ESTIMATORS, POOLINGS, LayerFeatures, block_cosine, layer_cka, layer_features
from workbench.analysis.faithfulness import auc, deletion_insertion, infidelity
from workbench.analysis.predictions import prediction_agreement
from workbench.analysis.token_agreement import METRICS, attention_maps, saliency_maps, token_map_agreement
from workbench.analysis.tokens import vit_token_layout
from workbench.progress import progress_bar
from workbench.provenance import DataSource, ModelSource, config_json, stamp

__all__ = ["PARTS", "Part", "CompareConfig", "compare_models", "block_pairs", "representation_names", "model_features",
           "stamp_comparison"]

Part = Literal["cka", "maps", "predictions", "attributions", "faithfulness"]
PARTS: tuple[str, ...] = ("cka", "maps", "predictions", "attributions", "faithfulness")
_SUFFIXES = (".hook_resid_post", ".hook_out")


@dataclass(frozen=True)
class CompareConfig:
    """Options of :func:`compare_models` (stored as the ``config`` attr)."""

    parts: tuple[str, ...] = PARTS  # which parts to run
    attributions: tuple[str, ...] = ATTRIBUTIONS  # attribution methods (rollout only where it applies)
    target: Literal["teacher", "own", "label"] = "teacher"  # class explained: teacher's top-1, model's own, label
    ig_steps: int = 50  # Gauss–Legendre nodes of Integrated Gradients
    ig_tolerance: float | None = None  # relative completeness gap above which an image's IG is redone with 2× the
    # nodes, up to ig_max_steps (analysis.attribution.refined_integrated_gradients); None: ig_steps only
    ig_max_steps: int = 256  # most Gauss–Legendre nodes an image's IG may take when refining
    topk: float = 0.1  # top-k overlap: k as a fraction of pixels (attributions) / keys (token maps)
    student_maps: Literal["auto", "attention", "dependency"] = "auto"  # student token map; auto: attention if any
    steps: int = 16  # deletion / insertion steps (curves have steps + 1 points)
    deletion_baseline: Literal["zeros", "blur"] = "zeros"  # what deleted pixels become (RISE: zeros)
    insertion_baseline: Literal["zeros", "blur"] = "blur"  # canvas pixels are inserted into (RISE: blurred image)
    blur_sigma: float | None = None  # Gaussian sigma in pixels of a "blur" baseline; None: max(H, W) / 8
    infidelity: bool = True  # captum's infidelity of Integrated Gradients (10 perturbations per image)
    batch_size: int = 64  # images per forward pass (attribution and curve inputs are batched to this many too)
    seed: int = 0  # random maps and infidelity perturbations

    def __post_init__(self) -> None:
        bad = [p for p in self.parts if p not in PARTS]
        if bad:
            raise ValueError(f"unknown parts {bad}; choose from {PARTS}")
        bad = [a for a in self.attributions if a not in ATTRIBUTIONS]
        if bad:
            raise ValueError(f"unknown attribution methods {bad}; choose from {ATTRIBUTIONS}")
        if self.target not in ("teacher", "own", "label"):
            raise ValueError(f"target must be 'teacher', 'own' or 'label', got {self.target!r}")
        if self.student_maps not in ("auto", "attention", "dependency"):
            raise ValueError(f"student_maps must be 'auto', 'attention' or 'dependency', got {self.student_maps!r}")
        if not 0 < self.topk <= 1:
            raise ValueError(f"topk is a fraction in (0, 1], got {self.topk}")
        if self.ig_tolerance is not None and (self.ig_tolerance <= 0 or self.ig_max_steps < self.ig_steps):
            raise ValueError("ig_tolerance must be positive and ig_max_steps at least ig_steps")
        if self.steps < 1 or self.ig_steps < 1 or self.batch_size < 1:
            raise ValueError("steps, ig_steps and batch_size must be positive")


# ---------------------------------------------------------------------------------------- features
def _block(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def representation_names(model: nn.Module, pattern: str | Sequence[str] | None = None) -> list[str]:
    """The hook points whose values are the model's block outputs, in forward order (module docstring)."""
    points = list(hook_points(model))
    if pattern is not None:
        import fnmatch

        pats = [pattern] if isinstance(pattern, str) else list(pattern)
        return [n for n in points if any(fnmatch.fnmatchcase(n, p) for p in pats)]
    names = [n for n in points if n.endswith(".hook_resid_post")]
    return names or [n for n in points if n.startswith("stages.") and n.endswith(".hook_out")]


def _layout(model: nn.Module, name: str, value: torch.Tensor, image_size: tuple[int, int]) -> LayerFeatures:
    if value.ndim == 4:
        return layer_features(name, value, layout="channels_first" if name.endswith(".hook_out") else "channels_last")
    if value.ndim != 3:
        raise ValueError(f"{name}: a block output of shape {tuple(value.shape)} is neither tokens nor a feature map")
    try:
        tl = vit_token_layout(model, image_size)
        grid, kinds = tl.grid, tl.prefix_kinds
    except ValueError:  # not a timm ViT: tokens of unknown layout
        grid, kinds = None, ()
    return layer_features(name, value, layout="tokens", grid=grid, prefix_kinds=kinds)


@torch.no_grad()
def model_features(model: nn.Module, images: torch.Tensor, names: Sequence[str], *, batch_size: int = 64
                   ) -> tuple[torch.Tensor, list[LayerFeatures]]:
    """Logits ``(B, classes)`` and the block outputs ``names`` of ``model`` on ``images``, batched."""
    logits, values = [], {n: [] for n in names}
    for start in range(0, len(images), batch_size):
        out, cache = run_with_cache(model, images[start:start + batch_size], names=list(names) or (lambda _n: False))
        logits.append(out.detach())
        for n in names:
            values[n].append(cache[n])
    size = tuple(images.shape[-2:])
    return torch.cat(logits), [_layout(model, n, torch.cat(values[n]), size) for n in names]


# ------------------------------------------------------------------------------------------- parts
def _cka_part(feats: Mapping[str, list[LayerFeatures]], reference: str, notes: dict) -> xr.Dataset:
    t = feats[reference]
    models = list(feats)
    depth = max(len(f) for f in feats.values())
    cka = np.full((len(models), len(POOLINGS), len(ESTIMATORS), len(t), depth), np.nan)
    names = np.full((len(models), depth), "", dtype=object)
    cos = np.full((len(models), t[0].tokens.shape[0], len(t)), np.nan)
    for m, label in enumerate(models):
        s = feats[label]
        if not s:
            notes.setdefault("cka", {})[label] = "no block outputs (no *.hook_resid_post / stages.*.hook_out)"
            continue
        names[m, : len(s)] = [_block(f.name) for f in s]
        for p, pooling in enumerate(POOLINGS):
            cka[m, p, :, :, : len(s)] = layer_cka(t, s, pooling)
        c = block_cosine(t, s)
        if c is None:
            notes.setdefault("block_cosine", {})[label] = "layers do not correspond one to one (depth or shapes differ)"
        else:
            cos[m] = c
    ds = xr.Dataset(
        {"cka": (("model", "pooling", "estimator", "teacher_layer", "student_layer"), cka),
         "block_cosine": (("model", "sample", "layer"), cos)},
        coords={"model": models, "pooling": list(POOLINGS), "estimator": list(ESTIMATORS),
                "teacher_layer": np.arange(len(t)),
                "teacher_layer_name": ("teacher_layer", [_block(f.name) for f in t]),
                "student_layer": np.arange(depth),
                "student_layer_name": (("model", "student_layer"), names.astype(str)),
                "depth": ("model", [len(feats[m]) for m in models]), "layer": np.arange(len(t)),
                "layer_name": ("layer", [_block(f.name) for f in t])},
    )
    ds["cka"].attrs.update(units="CKA", long_name="linear CKA of block outputs")
    ds["block_cosine"].attrs.update(units="cosine", long_name="cosine of corresponding block outputs, token mean")
    return ds


def _block_indices(blocks: Sequence[str]) -> list[int]:
    """ViT block indices of names ``blocks.{i}`` (others are not ViT blocks and are left out)."""
    return [int(b.split(".")[1]) for b in blocks
            if b.count(".") == 1 and b.startswith("blocks.") and b.split(".")[1].isdigit()]


def block_pairs(teacher_blocks: Sequence[str], student_blocks: Sequence[str],
                groups: Sequence[Sequence[int]] | None) -> dict[str, str]:
    """Teacher block name -> the student block scored against it (module docstring, "correspondence").

    Args:
        teacher_blocks: the teacher's blocks in forward order (``blocks.0`` …).
        student_blocks: the student's blocks in forward order.
        groups: ``groups[i]`` = the teacher block indices the student's block ``i`` replaces; None: by name.

    Raises:
        ValueError: groups that do not fit the two models' depths.
    """
    if groups is None:
        return {b: b for b in teacher_blocks}
    groups = [tuple(int(j) for j in g) for g in groups]
    if len(groups) != len(student_blocks):
        raise ValueError(f"the correspondence names {len(groups)} student blocks, the student has "
                         f"{len(student_blocks)} ({list(student_blocks)})")
    bad = [g for g in groups if not g or not all(0 <= j < len(teacher_blocks) for j in g)]
    if bad:
        raise ValueError(f"correspondence groups {bad} are empty or name teacher blocks outside 0…{len(teacher_blocks) - 1}")
    return {teacher_blocks[g[-1]]: s for g, s in zip(groups, student_blocks)}


class _MapScores:
    """The token-map agreement arrays of :func:`_maps_part`, filled one (model, block) pair at a time."""

    def __init__(self, n_models: int, n_samples: int, n_blocks: int, heads: int, topk: Any):
        shape = (n_models, n_samples, n_blocks)
        self.topk = topk
        self.out = {m: np.full((*shape, heads), np.nan) for m in METRICS}  # (model, sample, layer, head)
        self.out.update({f"{m}_avg": np.full(shape, np.nan) for m in METRICS})  # (model, sample, layer)
        self.measure = np.full((n_models, n_blocks), "", dtype=object)  # "attention" / "saliency" per pair scored
        self.paired = np.full((n_models, n_blocks), "", dtype=object)  # the model's block scored against the teacher's

    def score(self, mi: int, li: int, a: torch.Tensor, b: torch.Tensor, kind: str, block: str) -> None:
        r = token_map_agreement(a, b, topk=self.topk)
        for m in METRICS:
            self.out[m][mi, :, li, : a.shape[1]] = r[m]
            self.out[f"{m}_avg"][mi, :, li] = r[f"{m}_avg"]
        self.measure[mi, li] = kind
        self.paired[mi, li] = block


def _maps_part(models: Mapping[str, nn.Module], images: torch.Tensor, reference: str, layer_names: list[str],
               cfg: CompareConfig, notes: dict, bar: Any,
               correspondence: Mapping[str, Sequence[Sequence[int]]] | None = None) -> xr.Dataset | str:
    bar.set_postfix_str(f"maps: {reference}")
    ref = attention_maps(models[reference], images, batch_size=cfg.batch_size)
    bar.update()
    if not ref:
        return f"the teacher {reference!r} has no attention (no *.attn.hook_pattern hook points)"
    blocks = [b for b in layer_names if b in ref] or list(ref)
    heads = max(ref[b].shape[1] for b in blocks)
    scores = _MapScores(len(models), images.shape[0], len(blocks), heads, cfg.topk)
    saliency_used = False
    for mi, (label, model) in enumerate(models.items()):
        if label == reference:
            continue
        bar.set_postfix_str(f"maps: {label}")
        saliency_used |= _score_student(scores, mi, label, model, images, ref, blocks, cfg, notes,
                                        (correspondence or {}).get(label))
        bar.update()
    ti = list(models).index(reference)
    if saliency_used:  # the teacher's own saliency against its attention: the reference for saliency students
        try:
            own = saliency_maps(models[reference], images, _block_indices(blocks))
            for li, b in enumerate(blocks):
                if b in own:
                    scores.score(ti, li, ref[b], own[b], "saliency", b)
        except ValueError as err:
            notes.setdefault("maps", {})[reference] = f"no saliency of the teacher: {err}"
    else:
        notes.setdefault("maps", {})[reference] = "the reference (its saliency is compared only when a student's is)"
    return _maps_dataset(scores, list(models), blocks, layer_names, ref, images.shape[0])


def _score_student(scores: _MapScores, mi: int, label: str, model: nn.Module, images: torch.Tensor,
                   ref: Mapping[str, torch.Tensor], blocks: list[str], cfg: CompareConfig, notes: dict,
                   groups: Sequence[Sequence[int]] | None) -> bool:
    """Score student ``label``'s token maps against the teacher's ``ref`` (its attention where it has it, else its
    gradient saliency); notes what does not line up. Returns whether a saliency map was scored."""
    att = attention_maps(model, images, batch_size=cfg.batch_size) if cfg.student_maps != "dependency" else {}
    own_blocks = list(att) or [f"blocks.{i}" for i in range(len(getattr(model, "blocks", [])))]
    pair = block_pairs(blocks, own_blocks, groups)
    want_sal = [pair[b] for b in blocks if b in pair and (pair[b] not in att or cfg.student_maps == "dependency")]
    sal: dict[str, torch.Tensor] = {}
    if want_sal and cfg.student_maps != "attention":
        if not isinstance(getattr(model, "blocks", None), (nn.Sequential, nn.ModuleList)):
            notes.setdefault("maps", {})[label] = ("no token maps: neither attention (*.attn.hook_pattern) nor ViT "
                                                   "blocks for gradient-saliency dependency")
        else:
            try:
                sal = saliency_maps(model, images, _block_indices(want_sal))
            except ValueError as err:
                notes.setdefault("maps", {})[label] = f"no gradient-saliency dependency for {want_sal}: {err}"
    missing, saliency_used = [], False
    for li, b in enumerate(blocks):
        if b not in pair:  # inside a group the student replaces: scored at the group's last block
            continue
        sb = pair[b]
        if sb in att and cfg.student_maps != "dependency":
            student, kind = att[sb], "attention"
        else:
            student, kind = sal.get(sb), "saliency"
        if student is None or student.shape[0] != images.shape[0] or student.shape[2:] != ref[b].shape[2:]:
            missing.append(b)
            continue
        scores.score(mi, li, ref[b], student, kind, sb)
        saliency_used |= kind == "saliency"
    if missing and label not in notes.get("maps", {}):
        notes.setdefault("maps", {})[label] = f"no token map lining up with the teacher's for blocks {missing}"
    return saliency_used


def _maps_dataset(scores: _MapScores, models: list[str], blocks: list[str], layer_names: list[str],
                  ref: Mapping[str, torch.Tensor], b_count: int) -> xr.Dataset:
    """The ``map_*`` variables of the comparison Dataset from the filled ``scores``."""
    out = scores.out
    lay = [layer_names.index(b) if b in layer_names else i for i, b in enumerate(blocks)]
    dims = ("model", "sample", "layer")
    ds = xr.Dataset(
        {**{f"map_{m}": ((*dims, "head"), out[m]) for m in METRICS},
         **{f"map_{m}_avg": (dims, out[f"{m}_avg"]) for m in METRICS}},
        coords={"model": models, "sample": np.arange(b_count), "layer": lay,
                "head": np.arange(out[METRICS[0]].shape[-1]),
                "layer_name": ("layer", blocks), "num_heads": ("layer", [ref[b].shape[1] for b in blocks]),
                "map_measure": (("model", "layer"), scores.measure.astype(str)),
                "map_student_block": (("model", "layer"), scores.paired.astype(str))},
    )
    for m, u in (("js", "bits"), ("topk", "fraction"), ("spearman", "rank correlation")):
        ds[f"map_{m}"].attrs["units"] = ds[f"map_{m}_avg"].attrs["units"] = u
        for v in (f"map_{m}", f"map_{m}_avg"):  # a student without maps lining up: NaN, said in the notes attr
            ds[v].attrs["nan_means"] = "the model has no token map lining up with the teacher's (notes attr)"
    return ds


def _targets(logits: Mapping[str, torch.Tensor], reference: str, labels: np.ndarray | None,
             cfg: CompareConfig) -> dict[str, torch.Tensor]:
    if cfg.target == "teacher":
        t = logits[reference].argmax(-1)
        return {m: t for m in logits}
    if cfg.target == "own":
        return {m: lg.argmax(-1) for m, lg in logits.items()}
    if labels is None or (np.asarray(labels) < 0).any():
        raise ValueError("target='label' needs a known label for every image; use target='teacher'")
    t = torch.as_tensor(np.asarray(labels), device=logits[reference].device)
    return {m: t for m in logits}


def _attribution_parts(models: Mapping[str, nn.Module], images: torch.Tensor, targets: Mapping[str, torch.Tensor],
                       reference: str, cfg: CompareConfig, notes: dict, seconds: dict, bar: Any) -> xr.Dataset:
    start = time.perf_counter()
    ds, got, raw_ig = _attributions(models, images, targets, reference, cfg, notes, bar)
    seconds["attributions"] = time.perf_counter() - start
    if "faithfulness" not in cfg.parts:
        return ds
    start = time.perf_counter()
    ds = _faithfulness(ds, models, images, targets, got, raw_ig, cfg, bar)
    seconds["faithfulness"] = time.perf_counter() - start
    return ds


def _attributions(models: Mapping[str, nn.Module], images: torch.Tensor, targets: Mapping[str, torch.Tensor],
                  reference: str, cfg: CompareConfig, notes: dict, bar: Any
                  ) -> tuple[xr.Dataset, dict[str, dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """The attribution maps of every model and their agreement with the teacher's; also the maps per model and
    attribution method, and the raw Integrated Gradients per model (for infidelity)."""
    methods = list(cfg.attributions)
    b, _, h, w = images.shape
    n_m = len(models)
    maps = np.full((n_m, len(methods), b, h, w), np.nan, dtype=np.float32)
    delta = np.full((n_m, b), np.nan)
    nodes = np.zeros((n_m, b), dtype=np.int64)
    raw_ig: dict[str, torch.Tensor] = {}
    got: dict[str, dict[str, torch.Tensor]] = {}
    for mi, (label, model) in enumerate(models.items()):
        bar.set_postfix_str(f"attributions: {label}")
        mp, raw, skipped = attribution_maps(model, images, targets[label], methods=methods, n_steps=cfg.ig_steps,
                                            batch_size=cfg.batch_size, seed=cfg.seed + mi,
                                            ig_tolerance=cfg.ig_tolerance, ig_max_steps=cfg.ig_max_steps)
        got[label] = mp
        for k, v in mp.items():
            maps[mi, methods.index(k)] = v.detach().float().cpu().numpy()
        if "ig_delta" in raw:
            delta[mi] = raw["ig_delta"].cpu().numpy()
            nodes[mi] = raw["ig_steps"].cpu().numpy()
            raw_ig[label] = raw["integrated_gradients"]
        for k, why in skipped.items():
            notes.setdefault(k, {})[label] = why
        bar.update()
    agree = {k: np.full((n_m, len(methods), b), np.nan) for k in ("spearman", "topk", "cosine")}
    for mi, label in enumerate(models):
        if label == reference:
            continue
        for ai, a in enumerate(methods):
            if a in got[label] and a in got[reference]:
                for k, v in map_agreement(got[reference][a], got[label][a], topk=cfg.topk).items():
                    agree[k][mi, ai] = v
    tgt = targets[reference].cpu().numpy()
    coords = {"model": list(models), "attribution": methods, "sample": np.arange(b),
              "y": np.arange(h), "x": np.arange(w)}
    if cfg.target == "own":
        coords["target"] = (("model", "sample"), np.stack([targets[m].cpu().numpy() for m in models]))
    else:
        coords["target"] = ("sample", tgt)
    ds = xr.Dataset({"attribution_map": (("model", "attribution", "sample", "y", "x"), maps),
                     "ig_delta": (("model", "sample"), delta), "ig_steps": (("model", "sample"), nodes),
                     **{f"attribution_{k}": (("model", "attribution", "sample"), v) for k, v in agree.items()}},
                    coords=coords)
    ds["ig_delta"].attrs.update(units="fraction", long_name="|Σ IG − (f(x) − f(baseline))| / |f(x) − f(baseline)|")
    if "integrated_gradients" not in methods:  # no IG: no completeness gap (not a NaN the finite check refuses)
        ds = ds.drop_vars(["ig_delta", "ig_steps"])
    return ds, got, raw_ig


def _faithfulness(ds: xr.Dataset, models: Mapping[str, nn.Module], images: torch.Tensor,
                  targets: Mapping[str, torch.Tensor], got: Mapping[str, Mapping[str, torch.Tensor]],
                  raw_ig: Mapping[str, torch.Tensor], cfg: CompareConfig, bar: Any) -> xr.Dataset:
    """``ds`` with the deletion / insertion curves of every attribution map (and their AUCs) and, with
    ``cfg.infidelity``, the infidelity of each model's Integrated Gradients."""
    methods, b, n_m = list(cfg.attributions), images.shape[0], len(models)
    steps = cfg.steps + 1
    curves = {k: np.full((n_m, len(methods), b, steps), np.nan) for k in ("deletion", "insertion")}
    fraction = None
    infid = np.full((n_m, b), np.nan)
    for mi, (label, model) in enumerate(models.items()):
        bar.set_postfix_str(f"faithfulness: {label}")
        for ai, a in enumerate(methods):
            if a not in got[label]:
                continue
            r = deletion_insertion(model, images, got[label][a], targets[label], steps=cfg.steps,
                                   deletion_baseline=cfg.deletion_baseline, insertion_baseline=cfg.insertion_baseline,
                                   blur_sigma=cfg.blur_sigma, batch_size=4 * cfg.batch_size)
            fraction = r["fraction"]
            curves["deletion"][mi, ai], curves["insertion"][mi, ai] = r["deletion"], r["insertion"]
        if cfg.infidelity and label in raw_ig:
            infid[mi] = infidelity(model, images, raw_ig[label], targets[label], seed=cfg.seed,
                                   batch_size=4 * cfg.batch_size)
        bar.update()
    if fraction is None:
        fraction = np.linspace(0, 1, steps)
    dims = ("model", "attribution", "sample")
    ds = ds.assign_coords(step=np.arange(steps), fraction=("step", fraction))
    for k, v in curves.items():
        ds[k] = ((*dims, "step"), v)
        ds[k].attrs.update(units="probability", long_name=f"probability of the target class, {k} curve")
        ds[f"{k}_auc"] = (dims, auc(v, fraction))
        ds[f"{k}_auc"].attrs["units"] = "probability × fraction"
    if cfg.infidelity and raw_ig:  # infidelity is IG's: none without it
        ds["infidelity"] = (("model", "sample"), infid)
        ds["infidelity"].attrs.update(long_name="captum infidelity of Integrated Gradients (normalised)")
    return ds


# ------------------------------------------------------------------------------------------- main
def compare_models(teacher: nn.Module, students: Mapping[str, nn.Module], images: torch.Tensor,
                   labels: np.ndarray | torch.Tensor | Sequence[int] | None = None, *,
                   parts: Sequence[str] = PARTS, teacher_name: str = "teacher",
                   representations: Mapping[str, str | Sequence[str]] | None = None,
                   correspondence: Mapping[str, Sequence[Sequence[int]]] | None = None, **options) -> xr.Dataset:
    """Compare a teacher with its students on the same images (module docstring: parts and layout).

    Args:
        teacher: eval-mode model (timm ViT / DeiT / Swin / ResNet, a demo teacher, any model with hook points).
        students: label -> eval-mode model taking the same images; labels become the ``model`` coord.
        images: ``(B, C, H, W)`` images normalised for the models, on their device.
        labels: ``(B,)`` classes, ``-1`` where unknown; None if unknown.
        parts: which of :data:`PARTS` to run.
        teacher_name: the teacher's ``model`` label.
        representations: model label -> fnmatch pattern(s) of the hook points used as its block
            outputs (default: :func:`representation_names`).
        correspondence: student label -> ``groups``, ``groups[i]`` = the teacher block indices its ``i``-th
            block replaces (students of another depth, e.g. Non-deep; module docstring); others: by block name.
        **options: fields of :class:`CompareConfig` (``ig_steps``, ``steps``, ``topk``, ``batch_size`` …).

    Returns:
        The comparison Dataset (module docstring); attrs ``analysis="compare"`` and ``config``.

    Raises:
        ValueError: models in training mode, a student labelled like the teacher, bad images or options.
    """
    cfg = CompareConfig(parts=tuple(parts), **options)
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}")
    if not students:
        raise ValueError("no students to compare: pass students={'label': model, ...}")
    if teacher_name in students:
        raise ValueError(f"a student is labelled {teacher_name!r}, the teacher's label; rename it or pass "
                         "teacher_name=")
    models = {teacher_name: teacher, **students}
    stray = sorted(set(correspondence or {}) - set(students))
    if stray:
        raise ValueError(f"a block correspondence is given for {stray}, which are not students ({list(students)})")
    training = [k for k, m in models.items() if m.training]
    if training:
        raise ValueError(f"models in training mode: {training}; call .eval() (dropout would make every part random)")
    if not torch.isfinite(images).all():
        raise ValueError("images contain NaN or inf")
    lab = None if labels is None else np.asarray(torch.as_tensor(labels).cpu(), dtype=np.int64)
    if lab is not None and lab.shape != (images.shape[0],):
        raise ValueError(f"labels must be ({images.shape[0]},), got {lab.shape}")
    notes: dict[str, dict[str, str]] = {}
    skipped: dict[str, str] = {}
    seconds: dict[str, float] = {}
    per_model = ["forward", *(p for p in ("maps", "attributions", "faithfulness") if p in cfg.parts)]
    if "faithfulness" in cfg.parts and "attributions" not in cfg.parts:
        per_model.append("attributions")  # the faithfulness curves delete and insert by the attribution maps
    steps = len(models) * len(per_model) + ("cka" in cfg.parts) + ("predictions" in cfg.parts)
    with progress_bar(steps, "compare") as bar:
        out, rep_names = _compare_parts(models, images, lab, teacher_name, representations, cfg, notes, skipped,
                                        seconds, bar, correspondence)
    result = xr.merge(out, join="outer", compat="no_conflicts", combine_attrs="drop") if out else xr.Dataset()
    for part in out:  # the parts' own attrs are dropped by the merge; their variables' attrs (units, nan_means) stay
        for name, var in part.data_vars.items():
            result[name].attrs.update(var.attrs)
    result = result.reindex(model=list(models)) if "model" in result.dims else result
    if lab is not None and "sample" in result.dims:
        result = result.assign_coords(label=("sample", lab))
    config = {**asdict(cfg), "teacher_name": teacher_name, "students": list(students),
              "representations": {k: list(v) for k, v in rep_names.items()},
              "correspondence": {k: [list(g) for g in v] for k, v in (correspondence or {}).items()}}
    return result.assign_attrs(
        analysis="compare", config=config_json(**config), reference=teacher_name,
        skipped=json.dumps(skipped, sort_keys=True), notes=json.dumps(notes, sort_keys=True),
        seconds=json.dumps({k: round(v, 4) for k, v in seconds.items()}),
    )


def _compare_parts(models: dict[str, nn.Module], images: torch.Tensor, lab: np.ndarray | None, teacher_name: str,
                   representations: Mapping[str, str | Sequence[str]] | None, cfg: CompareConfig, notes: dict,
                   skipped: dict, seconds: dict, bar: Any,
                   correspondence: Mapping[str, Sequence[Sequence[int]]] | None = None
                   ) -> tuple[list[xr.Dataset], dict[str, list[str]]]:
    """The parts of :func:`compare_models` (filling ``notes``, ``skipped``, ``seconds``), one ``bar`` step per model
    and part; returns the parts' Datasets and every model's representation names."""
    start = time.perf_counter()
    rep_names = {k: representation_names(m, (representations or {}).get(k)) for k, m in models.items()}
    logits, feats = {}, {}
    for k, m in models.items():
        bar.set_postfix_str(f"forward: {k}")
        logits[k], feats[k] = model_features(m, images, rep_names[k] if "cka" in cfg.parts else [],
                                             batch_size=cfg.batch_size)
        bar.update()
    seconds["forward"] = time.perf_counter() - start
    layer_names = [_block(n) for n in rep_names[teacher_name]]

    out = []
    if "cka" in cfg.parts:
        start = time.perf_counter()
        bar.set_postfix_str("cka")
        if not feats[teacher_name]:
            skipped["cka"] = f"the teacher has no block outputs ({', '.join(_SUFFIXES)} hook points)"
        else:
            out.append(_cka_part(feats, teacher_name, notes))
        seconds["cka"] = time.perf_counter() - start
        bar.update()
    if "maps" in cfg.parts:
        start = time.perf_counter()
        ds = _maps_part(models, images, teacher_name, layer_names, cfg, notes, bar, correspondence)
        if isinstance(ds, str):
            skipped["maps"] = ds
        else:
            out.append(ds)
        seconds["maps"] = time.perf_counter() - start
    n_classes = logits[teacher_name].shape[-1]
    same = {k: v for k, v in logits.items() if v.shape[-1] == n_classes}
    for k in set(logits) - set(same):
        notes.setdefault("predictions", {})[k] = f"{logits[k].shape[-1]} classes, the teacher has {n_classes}"
    if "predictions" in cfg.parts:
        start = time.perf_counter()
        bar.set_postfix_str("predictions")
        out.append(prediction_agreement(same, reference=teacher_name, labels=lab))
        seconds["predictions"] = time.perf_counter() - start
        bar.update()
    if "attributions" in cfg.parts or "faithfulness" in cfg.parts:
        usable = {k: models[k] for k in same}
        targets = _targets({k: logits[k] for k in same}, teacher_name, lab, cfg)
        ds = _attribution_parts(usable, images, targets, teacher_name, cfg, notes, seconds, bar)
        if "attributions" not in cfg.parts:
            ds = ds.drop_vars([v for v in ds.data_vars if v.startswith("attribution_") or v in ("ig_delta", "ig_steps")])
        out.append(ds)
    bar.update(bar.total - bar.n)  # the steps of parts left out (a teacher without attention, other classes)
    return out, rep_names


def stamp_comparison(ds: xr.Dataset, teacher: ModelSource, students: Mapping[str, ModelSource],
                     data: DataSource) -> xr.Dataset:
    """DESIGN.md's provenance for a comparison: the teacher's source in the standard attrs, all in ``models``."""
    ref = ds.attrs.get("reference", "teacher")
    sources = {ref: teacher, **students}
    missing = [m for m in ds["model"].values.tolist() if m not in sources] if "model" in ds.coords else []
    if missing:
        raise ValueError(f"no source given for the models {missing}")
    out = stamp(ds, teacher, data)
    return out.assign_attrs(models=json.dumps({k: {**asdict(v), "weights": v.weights} for k, v in sources.items()},
                                              sort_keys=True))
