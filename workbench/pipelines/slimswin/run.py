"""SlimSwin end to end: prune a trained Swin teacher's window-head pairs to a global ratio, as a run.

Algorithm 1 of Eryilmaz & Akturk ("SlimSwin: Gradient-Based Window-Level Head Pruning", papers/004)
on top of :mod:`methods.slimswin`:

1. gate every attention layer of a copy of the teacher (``add_gates``, all ones);
2. per iteration: gate-gradient saliency on a freshly sampled subset ``d-hat``
   (``saliency_samples`` training images, cross-entropy on their labels), prune exactly
   ``step_pairs`` pairs over all layers but the last stage, fine-tune one epoch on a sampled
   subset ``D-hat`` (``finetune_fraction`` of the training set) with the distillation loss of §V-B
   (alpha = 0.7, T = 2, the unpruned teacher), constant learning rate;
3. once the ratio ``r`` is reached, a final fine-tune on the full training set (cosine, 10 %
   warm-up from ``min_lr``).

A run (``run_method("slimswin", ratio=...)``, id ``slimswin-r0.3333-swin-demo`` for r = 1/3, ``slimswin-r0.30-swin-demo`` for 0.3) stores ``model.safetensors`` (the
gated model, masks included as ``gate_mask`` buffers, so ``load_model(run_id)`` rebuilds it),
``masks.safetensors`` (one 0/1 ``(num_windows, num_heads)`` tensor per layer, for
:func:`methods.slimswin.to_pruned`) and ``history.json`` (per iteration: pruned pairs, their scores,
the saliency of every pair, held-out accuracy). It resumes after an interruption from the last
finished iteration (``prune/``) or final fine-tune epoch (``final/``).

**Chaining.** Algorithm 1 is iterative and every iteration draws its subsets from seeds fixed by
the iteration number, so the first iterations towards r = 0.44 are exactly the iterations towards
r = 0.33. :func:`run_sweep` therefore starts each ratio's run from the iterative state of the next
smaller ratio (weights and masks *before* that run's final fine-tune; the ``start_from`` option) and only adds
the missing iterations; the result equals a run started from the teacher (checked by the tests), at a fraction
of the cost. The manifest records ``chained_from``.

``seed=S`` (``--seed``) repeats a run with another seed than the recipe's (its subsets d-hat / D-hat, fine-tune
shuffling, a baseline's mask draw): id ``slimswin-r0.6667-swin-demo-s1`` (``...-s1-random`` for a baseline).

Budgets per profile are in :data:`RECIPES` (``demo``, ``smoke``, ``paper``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import asdict, replace
from typing import Callable, Sequence

import torch.nn as nn

from methods.slimswin import SlimSwinConfig, check_swin, pairs_to_prune, prunable_layers, swin_layers
from workbench.models import create_model, load_model
from workbench.pipelines import Method, Option, RunRequest, budget, register_method, run_method
from workbench.pipelines.common import run_config, run_tag, student_run
from workbench.pipelines.slimswin.baselines import MASK_CHOICES, finetune_with_masks
from workbench.pipelines.slimswin.body import load_masks, prune_and_finetune
from workbench.pipelines.slimswin.budgets import RECIPES, SlimSwinRecipe
from workbench.runs import Run, open_run

__all__ = ["SlimSwinRecipe", "RECIPES", "run_sweep", "run_id", "load_masks", "load_history", "pruned_model"]


# --------------------------------------------------------------------------------------------
# Run ids
# --------------------------------------------------------------------------------------------


def ratio_tag(ratio: float) -> str:
    """``0.30`` for a two-decimal ratio, ``0.3333`` for 1/3 (so that 0.33 and 1/3 are different runs)."""
    return f"{ratio:.2f}" if abs(ratio - round(ratio, 2)) < 1e-9 else f"{ratio:.4f}"


def run_id(teacher_tag: str, ratio: float, cfg: SlimSwinConfig, default: SlimSwinConfig, seed: int | None = None) -> str:
    """``slimswin-r0.3333-swin-demo``, with ``-i2`` / ``-abs`` / ``-output`` for non-default options, ``-s<seed>`` for
    a seed other than the recipe's."""
    parts = [f"slimswin-r{ratio_tag(ratio)}-{teacher_tag}"]
    if seed is not None:
        parts.append(f"s{seed}")
    if cfg.step_pairs != default.step_pairs:
        parts.append(f"i{cfg.step_pairs}")
    if cfg.reduce != default.reduce:
        parts.append(cfg.reduce.replace("_", ""))
    if cfg.gate_mode != default.gate_mode:
        parts.append(cfg.gate_mode)
    return "-".join(parts)


def parse_ratio(text: str) -> float:
    """``--ratio`` as a number (``0.33``) or a fraction (``1/3``)."""
    num, sep, den = text.partition("/")
    try:
        return float(num) / float(den) if sep else float(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"--ratio must be a number or a fraction such as 1/3, got {text!r}") from None


# --------------------------------------------------------------------------------------------
# Builder, masks, history
# --------------------------------------------------------------------------------------------


def load_history(run: str | Run) -> dict:
    """The run's ``history.json``: per-iteration pruned pairs, scores, saliency, accuracy."""
    run = run if isinstance(run, Run) else open_run(run)
    return json.loads((run.dir / "history.json").read_text())


def pruned_model(run: str | Run, device: str = "cpu") -> nn.Module:
    """The run's model converted for inference that skips pruned pairs (:func:`methods.slimswin.to_pruned`)."""
    from methods.slimswin import to_pruned

    ref = str(run.dir) if isinstance(run, Run) else run
    return to_pruned(load_model(ref, device=device).model)


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def _config(cfg: SlimSwinConfig, recipe: SlimSwinRecipe, req: RunRequest) -> dict:
    """What defines a SlimSwin run besides the method, profile, data and teacher (``student_run`` adds those)."""
    t = req.teacher
    return {"model_name": "slimswin_swin",
            "model_kwargs": {"base": t.model_name, "base_kwargs": t.model_kwargs, "gate_mode": cfg.gate_mode},
            # SlimSwin runs have recorded their teacher by ref and weights hash (which identify it) since their first
            # version; recording the full teacher_record instead would make every existing run's config differ
            "teacher": {"ref": t.ref, "checkpoint_sha256": t.sha256},
            "slimswin": asdict(cfg),
            "recipe": {"batch_size": recipe.batch_size, "seed": recipe.seed,
                       **({"final_train_images": recipe.final_train_images} if recipe.final_train_images else {})}}


def _compatible_parent(parent: Run | None, config: dict, cfg: SlimSwinConfig, arch: nn.Module) -> Run | None:
    """``parent`` if its iterations are a prefix of this run's (same everything but a smaller ratio)."""
    if parent is None or parent.status != "complete" or not (parent.dir / "prune" / "state.safetensors").exists():
        return None
    theirs = dict(parent.config)
    mine = json.loads(json.dumps(config, default=str))
    their_ratio = theirs.get("slimswin", {}).pop("target_ratio", None)
    mine["slimswin"].pop("target_ratio")
    if theirs != mine or their_ratio is None:
        return None
    done = int(parent.manifest.get("results", {}).get("pruned_pairs", 0))
    return parent if done <= _pairs_to_prune(cfg, arch) else None


def _pairs_to_prune(cfg: SlimSwinConfig, arch: nn.Module) -> int:
    """Pairs a run will have pruned: the first multiple of step_pairs reaching the ratio.

    Raises:
        ValueError: that is more than the prunable pairs (``step_pairs`` too large for the ratio).
    """
    total = sum(swin_layers(arch)[l].num_pairs for l in prunable_layers(arch, cfg.exclude))
    try:
        return pairs_to_prune(total, cfg.target_ratio, cfg.step_pairs)
    except ValueError:
        raise ValueError(f"--step-pairs {cfg.step_pairs} overshoots: reaching ratio {cfg.target_ratio:.4g} would prune "
                         f"more than the {total} prunable pairs; use a smaller --step-pairs") from None


def check_ratio(ratio) -> None:
    """Refuse a ratio outside (0, 1) (before a demo teacher would be trained)."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 < float(ratio) < 1.0:
        raise ValueError(f"--ratio must be in the open interval (0, 1), got {ratio}")


def _run(req: RunRequest, ratio: float, step_pairs: int | None = None, reduce: str | None = None,
         gate_mode: str | None = None, start_from: str | Run | None = None,
         masks: str = "saliency", seed: int | None = None) -> Run:
    """Prune the request's Swin teacher to the global ratio ``ratio`` with SlimSwin (reusing or resuming the run).

    Args:
        req: teacher, profile, budget (:data:`RECIPES`), device, data, force (delete an existing run of this id
            and start afresh), log.
        ratio: global pruning ratio r in (0, 1) of the prunable window-head pairs.
        step_pairs: pairs pruned per iteration ``i`` (default: the profile's).
        reduce: saliency reduction over samples (``abs_of_mean`` default, ``abs``, ``signed``).
        gate_mode: ``qkv`` (paper) or ``output`` (Michel et al.).
        start_from: a complete SlimSwin run of the same teacher and settings at a smaller ratio to
            continue Algorithm 1 from (see the module docstring); ignored if incompatible.
        masks: ``saliency`` (Algorithm 1), or a baseline at the same number of pruned pairs with SlimSwin's
            fine-tunes: ``random`` or ``uniform`` per layer (:mod:`workbench.pipelines.slimswin.baselines`; run id
            suffix ``-random`` / ``-uniform``).
        seed: the recipe's ``seed`` for this run (None: the recipe's; another gives the id ``-s<seed>``).

    Returns:
        The complete run.

    Raises:
        ValueError: ratio outside (0, 1), a non-Swin teacher, bad options (before anything is written).
        RunError: the run exists with a different config (pass ``force=True``).
    """
    recipe: SlimSwinRecipe = req.budget
    check_ratio(ratio)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"--seed must be a non-negative integer, got {seed!r}")
    seed_tag = seed if seed is not None and seed != recipe.seed else None
    if seed_tag is not None:
        recipe = replace(recipe, seed=seed)
        req = dataclasses.replace(req, budget=recipe)
    changes = {k: v for k, v in dict(target_ratio=float(ratio), step_pairs=step_pairs, reduce=reduce,
                                     gate_mode=gate_mode).items() if v is not None}
    cfg = replace(recipe.method, **changes)
    if cfg.reduce not in ("abs_of_mean", "abs", "signed"):
        raise ValueError(f"--reduce must be abs_of_mean, abs or signed, got {cfg.reduce!r}")
    if cfg.gate_mode not in ("qkv", "output"):
        raise ValueError(f"gate mode must be qkv or output, got {cfg.gate_mode!r}")
    req.profile.require_data(req.data, "prunes")
    t = req.teacher
    arch = check_swin(create_model(t.model_name, **t.model_kwargs))  # a clear error for ViTs, CNNs, ...
    if not prunable_layers(arch, cfg.exclude):
        raise ValueError(f"{t.model_name} has no prunable layers (exclude={cfg.exclude!r})")
    _pairs_to_prune(cfg, arch)  # step_pairs must fit in the prunable pairs (raises otherwise)
    config = _config(cfg, recipe, req)
    rid = run_id(run_tag(req), float(ratio), cfg, recipe.method, seed_tag)
    if masks not in MASK_CHOICES:
        raise ValueError(f"--masks must be one of {', '.join(MASK_CHOICES)}, got {masks!r}")
    if masks != "saliency":  # a baseline: the same pairs count and fine-tunes, other masks (no chaining)
        pairs = _pairs_to_prune(cfg, arch)
        return student_run(req, f"{rid}-{masks}", {**config, "masks": masks},
                           lambda run: finetune_with_masks(run, req, cfg, masks, pairs))
    parent = None
    if start_from is not None:
        parent = _compatible_parent(start_from if isinstance(start_from, Run) else open_run(start_from),
                                    run_config(req, config), cfg, arch)
    return student_run(req, rid, config, lambda run: prune_and_finetune(run, req, cfg, parent))


def run_sweep(teacher: str | Run | None = None, profile: str = "demo", ratios: Sequence[float] | None = None, *,
              device: str = "auto", log: Callable[[str], None] = print, **options) -> list[Run]:
    """One run per ratio (default: the profile's), ascending, each continuing the previous one's iterations
    (``run_method("slimswin", ..., start_from=<the previous run>)``).

    Returns:
        The runs in ascending ratio order.
    """
    ratios = sorted(budget("slimswin", profile).ratios if ratios is None else ratios)
    runs: list[Run] = []
    for r in ratios:
        runs.append(run_method("slimswin", teacher, profile, device=device, log=log, ratio=r,
                               start_from=runs[-1] if runs else None, **options))
    return runs


# --------------------------------------------------------------------------------------------
# CLI: workbench run slimswin
# --------------------------------------------------------------------------------------------


def _report(run: Run) -> str:
    res = run.manifest["results"]
    return (f"pruned {res['pruned_pairs']}/{res['prunable_pairs']} window-head pairs (ratio {res['ratio']:.3f}); "
            f"held-out top-1 {100 * res['val_acc']:.2f} % (teacher {100 * res['teacher_val_acc']:.2f} %); "
            f"attention MACs -{100 * res['mac_reduction']:.1f} %")


register_method(Method(
    "slimswin", "SlimSwin: prune window-head pairs of a Swin teacher to a global ratio (Algorithm 1).", RECIPES, _run,
    teacher="swin", family="Swin", paper_title="SlimSwin — window-head pruning", paper_ref="papers/004",
    options=(Option("ratio", "global pruning ratio r in (0, 1), e.g. 1/3 (the paper's 0.33) or 0.3", type=parse_ratio,
                    required=True, check=check_ratio),
             Option("step_pairs", "pairs pruned per iteration i (default: the profile's)", type=int),
             Option("reduce", "saliency over samples: |mean gradient| (default), mean |gradient|, or signed mean",
                    choices=("abs_of_mean", "abs", "signed")),
             Option("gate_mode", "gate Q/K/V (paper, default) or head outputs", choices=("qkv", "output")),
             Option("start_from", "a complete SlimSwin run (same teacher and settings, smaller ratio) whose iterations "
                    "this run continues; ignored if incompatible"),
             Option("masks", "which pairs: least salient (Algorithm 1, default), or the baselines at the same count: "
                             "random, uniform (the same share of every layer)", default="saliency", choices=MASK_CHOICES),
             Option("seed", "seed of the subsets, fine-tunes and baseline masks (default: the profile's, 0)", type=int)),
    examples=("workbench run slimswin --ratio 1/3",
              "workbench run slimswin --teacher teacher-swin-demo --ratio 2/3 --step-pairs 4",
              "workbench run slimswin --teacher swin_tiny_patch4_window7_224 --checkpoint swin_t.safetensors "
              "--data ~/imagenet --profile paper --ratio 1/3"),
    report=_report,
))
