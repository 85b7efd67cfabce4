"""Baselines for SlimSwin's claim that *which* window-head pairs are pruned matters (papers/004, §VI).

SlimSwin (Eryilmaz & Akturk) prunes the pairs with the least gate-gradient saliency, ranked globally, and argues
that this "global, gradient-driven saliency measure" beats "manually prespecified layer-wise pruning ratios" (§VI).
A demo accuracy curve alone cannot test that: the test is the same number of pairs pruned another way. Two
choices at the same global ratio r (the same count of pruned pairs, Algorithm 1's ``pairs_to_prune``):

- ``random``: exactly that many prunable pairs drawn uniformly at random over all prunable layers;
- ``uniform``: the same share r of every prunable layer (the largest-remainder allocation of
  :func:`methods.slimswin.uniform_masks`), the pairs inside each layer drawn at random — a prespecified
  layer-wise ratio.

Two comparisons use them (:func:`finetune_with_masks`, :func:`masked_correctness`):

1. **fine-tuned** (a run, ``slimswin-r0.6667-swin-demo-random``): the baseline masks are set on the gated teacher
   at once, then the model gets exactly SlimSwin's training — one KD fine-tune per Algorithm-1 iteration on the
   same sampled subsets D-hat with the same seeds and learning rate, then the same final fine-tune — so the only
   difference to the SlimSwin run is which pairs are pruned (and that they are pruned at once, not gradually);
2. **no fine-tune**: the masks on the unpruned teacher's weights, evaluated directly (SlimSwin's learned masks
   against random and uniform ones), which isolates the choice of pairs from any training.

Per-image correctness on the held-out set is kept so the figures can test differences paired (same images).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Literal, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader

from methods.slimswin import (
    SlimSwinConfig,
    add_gates,
    attention_macs,
    get_masks,
    prunable_layers,
    set_mask,
    sum_macs,
    swin_layers,
    uniform_masks,
)
from workbench.models import load_model, read_state_dict
from workbench.pipelines.common import IndexedSubset, datasets, limited, opening
from workbench.pipelines.heldout import correctness
from workbench.pipelines.slimswin.body import (
    final_train_config,
    gated_student,
    iteration_train_config,
    kd_loss_fn,
    load_masks,
    sample_subset,
)
from workbench.runs import Run, atomic_write_text
from workbench.runtime import atomic_save_safetensors, evaluate, fit

if TYPE_CHECKING:
    from workbench.pipelines import RunRequest
    from workbench.pipelines.slimswin.budgets import SlimSwinRecipe

__all__ = ["MaskChoice", "MASK_CHOICES", "baseline_masks", "finetune_with_masks", "masked_correctness",
           "mask_comparison"]

MaskChoice = Literal["saliency", "random", "uniform"]
#: ``saliency``: Algorithm 1 (the method); the others: the baselines of the module docstring.
MASK_CHOICES: tuple[str, ...] = ("saliency", "random", "uniform")


def baseline_masks(model_or_config, num_pruned: int, choice: Literal["random", "uniform"], seed: int = 0,
                   exclude: str = "last_stage") -> list[torch.Tensor]:
    """Masks pruning exactly ``num_pruned`` prunable pairs, chosen at random (module docstring).

    Args:
        model_or_config: a (gated) timm Swin or its :class:`methods.slimswin.SwinConfig`.
        num_pruned: pairs to prune, in ``[0, prunable pairs]``.
        choice: ``random`` (over all prunable pairs) or ``uniform`` (the same share of every prunable layer).
        seed: seeds the draw.
        exclude: layers never pruned (SlimSwin's default: the last stage).

    Returns:
        One bool ``(num_windows, num_heads)`` tensor per layer, True = kept.

    Raises:
        ValueError: an unknown choice or ``num_pruned`` outside ``[0, prunable pairs]``.
    """
    layers = swin_layers(model_or_config)
    prunable = prunable_layers(model_or_config, exclude)
    sizes = [layers[l].num_pairs for l in prunable]
    if not 0 <= num_pruned <= sum(sizes):
        raise ValueError(f"num_pruned must be in [0, {sum(sizes)}] (the prunable pairs), got {num_pruned}")
    g = torch.Generator().manual_seed(seed)
    masks = [torch.ones(geo.num_windows, geo.num_heads, dtype=torch.bool) for geo in layers]
    if choice == "random":
        flat = torch.ones(sum(sizes), dtype=torch.bool)
        flat[torch.randperm(sum(sizes), generator=g)[:num_pruned]] = False
        for l, part in zip(prunable, flat.split(sizes)):  # (num_windows * num_heads,) -> (num_windows, num_heads)
            masks[l] = part.view(layers[l].num_windows, layers[l].num_heads).clone()
    elif choice == "uniform":
        counts = [int((~m).sum()) for m in uniform_masks(model_or_config, num_pruned, exclude)]
        for l in prunable:
            masks[l].view(-1)[torch.randperm(layers[l].num_pairs, generator=g)[: counts[l]]] = False
    else:
        raise ValueError(f"baseline masks are 'random' or 'uniform', got {choice!r}")
    return masks


def finetune_with_masks(run: Run, req: "RunRequest", cfg: SlimSwinConfig, choice: Literal["random", "uniform"],
                        num_pruned: int) -> dict:
    """The fine-tuned baseline run (module docstring, 1.): ``choice`` masks, then SlimSwin's fine-tunes with the
    request's teacher, data and recipe (its budget); its results.

    Resumable: after every iteration fine-tune the weights go to ``iterations/state.safetensors`` (the count done
    in its metadata); the final fine-tune checkpoints each epoch under ``final/``.
    """
    recipe: SlimSwinRecipe = req.budget
    with opening(req, recipe.cpu_threads) as start:  # the unpruned teacher, frozen, and the data on its pixels
        ref_model, train_set, val_set, dev = start.teacher, start.train_set, start.val_set, start.device
        model = gated_student(req.teacher, ref_model, cfg.gate_mode, dev)
        set_mask(model, baseline_masks(model, num_pruned, choice, seed=recipe.seed, exclude=cfg.exclude))
        model.to(dev)
        iterations = -(-num_pruned // cfg.step_pairs)  # Algorithm 1's iteration count to reach these pairs
        t0 = time.perf_counter()
        _iteration_finetunes(run, req, cfg, (model, ref_model), train_set, iterations, choice)
        val_loader = DataLoader(val_set, batch_size=256)
        before = evaluate(model, val_loader, dev)
        teacher_metrics = evaluate(ref_model, val_loader, dev)
        iter_time = time.perf_counter() - t0
        t1 = time.perf_counter()
        hist = fit(model, limited(train_set, recipe.final_train_images), val_set, final_train_config(cfg, recipe, dev),
                   loss_fn=kd_loss_fn(ref_model, cfg, req.teacher.sha256), ckpt_dir=run.phase_dir("final"),
                   on_epoch_end=run.log_epoch) if cfg.final_epochs > 0 else []
        after = hist[-1] if hist and "val_acc" in hist[-1] else evaluate(model, val_loader, dev)
        masks = get_masks(model)
        atomic_save_safetensors({f"layer{l}": m.to(torch.uint8) for l, m in enumerate(masks)}, run.dir / "masks.safetensors")
        atomic_write_text(run.dir / "history.json", json.dumps({"masks": choice, "iterations": iterations, "final": hist}))
        atomic_save_safetensors(model.state_dict(), run.checkpoint)
        total = sum(swin_layers(model)[l].num_pairs for l in prunable_layers(model, cfg.exclude))
        macs, dense = attention_macs(model), attention_macs(model, [torch.ones_like(m) for m in masks])
        return {"val_acc": after["val_acc"], "val_loss": after["val_loss"], "val_acc_before_final": before["val_acc"],
                "teacher_val_acc": teacher_metrics["val_acc"], "masks": choice, "target_ratio": cfg.target_ratio,
                "ratio": num_pruned / total, "pruned_pairs": num_pruned, "prunable_pairs": total, "iterations": iterations,
                "layer_ratio": {str(g.layer): float((~masks[g.layer]).sum()) / g.num_pairs for g in swin_layers(model)},
                "attention_macs": sum_macs(macs), "attention_macs_unpruned": sum_macs(dense),
                "mac_reduction": 1.0 - sum_macs(macs) / sum_macs(dense), "iterative_time_s": iter_time,
                "final_time_s": time.perf_counter() - t1, "train_images": len(train_set), "val_images": len(val_set)}


def _iteration_finetunes(run: Run, req: "RunRequest", cfg: SlimSwinConfig, models: tuple, train_set, iterations: int,
                         choice: str) -> None:
    """SlimSwin's fine-tune after each of its ``iterations`` (the same D-hat subsets and seeds as its run) on the
    masked ``models[0]`` (``models[1]``: the teacher), resumable after each one."""
    from safetensors import safe_open

    (model, ref_model), recipe = models, req.budget
    n_ft = max(recipe.batch_size, round(cfg.finetune_fraction * len(train_set)))
    iter_cfg = iteration_train_config(cfg, recipe, req.device)
    state = run.phase_dir("iterations") / "state.safetensors"
    done = 0
    if state.exists():
        with safe_open(str(state), framework="pt") as f:
            done = int(f.metadata()["done"])
        model.load_state_dict(read_state_dict(state))
        req.log(f"resuming after {done}/{iterations} fine-tunes")
    for it in range(done, iterations):  # the same D-hat subsets and seeds as the SlimSwin run's iterations
        idx = sample_subset(len(train_set), n_ft, recipe.seed * 100_003 + 2 * it + 1)
        fit(model, IndexedSubset(train_set, idx), None, replace(iter_cfg, seed=recipe.seed * 1000 + it),
            loss_fn=kd_loss_fn(ref_model, cfg, req.teacher.sha256))
        atomic_save_safetensors(model.state_dict(), state, metadata={"done": str(it + 1)})
        req.log(f"{choice} masks: fine-tune {it + 1}/{iterations} done")


def masked_correctness(teacher: str | Run, masks: dict[str, Sequence[torch.Tensor]], profile: str,
                       device: str = "cpu", gate_mode: str = "qkv", with_teacher: bool = True) -> dict[str, np.ndarray]:
    """Comparison 2 (module docstring): per-image correctness of the unpruned teacher's weights under each mask set.

    Args:
        teacher: the Swin teacher run.
        masks: label -> one bool ``(num_windows, num_heads)`` tensor per layer (e.g. a SlimSwin run's
            :func:`~workbench.pipelines.slimswin.run.load_masks`, or :func:`baseline_masks`).
        profile: selects the held-out set.
        device: where to evaluate.
        gate_mode: the runs' gate mode (gates are all ones: only the masks act).
        with_teacher: also evaluate the teacher unmasked (``"teacher"``).

    Returns:
        label -> ``(n,)`` bool, plus ``"teacher"`` (no mask) if asked.
    """
    ref = str(teacher.dir) if isinstance(teacher, Run) else teacher
    base = load_model(ref, device="cpu").model
    pc = base.pretrained_cfg
    _, val_set = datasets(profile, None, tuple(pc["input_size"]), pc.get("mean"), pc.get("std"))
    out = {"teacher": correctness(base, val_set, device)} if with_teacher else {}
    gated = add_gates(base, mode=gate_mode)
    for label, m in masks.items():
        set_mask(gated, m)
        out[label] = correctness(gated, val_set, device)
    return out


def mask_comparison(teacher: Run, saliency_runs: dict[float, Run], baseline_runs: dict[tuple[float, str], Run],
                    profile: str, seeds: Sequence[int], device: str = "cpu"):
    """Per-image held-out correctness of SlimSwin's masks and the baselines, fine-tuned and not (module docstring).

    Args:
        teacher: the Swin teacher run.
        saliency_runs: ratio r -> the SlimSwin run (its masks and fine-tuned model).
        baseline_runs: (r, ``random`` | ``uniform``) -> the fine-tuned baseline run (any subset of the ratios).
        profile: selects the held-out set.
        seeds: the baseline mask draws averaged in the no-fine-tune comparison.
        device: where to evaluate.

    Returns:
        Dataset with ``correct(stage, masks, ratio, sample)`` (float in [0, 1]: the mean over ``seeds`` for a
        baseline without fine-tuning; NaN where not run), ``teacher_correct(sample)``, ``pruned_pairs(ratio)``,
        ``run(stage, masks, ratio)`` (run id, "" where none); coords ``stage`` ("no fine-tune", "fine-tuned"),
        ``masks`` (:data:`MASK_CHOICES`).
    """
    import xarray as xr


    ratios = sorted(saliency_runs)
    base = load_model(str(teacher.dir), device="cpu").model
    pc = base.pretrained_cfg
    _, val_set = datasets(profile, None, tuple(pc["input_size"]), pc.get("mean"), pc.get("std"))
    n = len(val_set)
    correct = np.full((2, len(MASK_CHOICES), len(ratios), n), np.nan)
    runs = np.full((2, len(MASK_CHOICES), len(ratios)), "", dtype=object)
    pairs = []
    for j, r in enumerate(ratios):
        run = saliency_runs[r]
        learned = load_masks(run)
        pruned = int(sum(int((~m).sum()) for m in learned))
        pairs.append(pruned)
        masks = {"saliency": learned}
        for choice in ("random", "uniform"):
            for s in seeds:
                masks[f"{choice}/{s}"] = baseline_masks(base, pruned, choice, seed=s)
        got = masked_correctness(teacher, masks, profile, device, run.config["slimswin"]["gate_mode"],
                                 with_teacher=False)
        correct[0, 0, j] = got["saliency"]
        runs[0, 0, j] = run.id
        for i, choice in enumerate(MASK_CHOICES[1:], start=1):
            correct[0, i, j] = np.mean([got[f"{choice}/{s}"] for s in seeds], axis=0)
        correct[1, 0, j] = correctness(load_model(str(run.dir), device="cpu").model, val_set, device)
        runs[1, 0, j] = run.id
        for i, choice in enumerate(MASK_CHOICES[1:], start=1):
            if (r, choice) in baseline_runs:
                b = baseline_runs[(r, choice)]
                correct[1, i, j] = correctness(load_model(str(b.dir), device="cpu").model, val_set, device)
                runs[1, i, j] = b.id
    teacher_correct = correctness(base, val_set, device)
    return xr.Dataset(
        {"correct": (("stage", "masks", "ratio", "sample"), correct),
         "teacher_correct": ("sample", teacher_correct.astype(float)),
         "pruned_pairs": ("ratio", pairs), "run": (("stage", "masks", "ratio"), runs.astype(str))},
        coords={"stage": ["no fine-tune", "fine-tuned"], "masks": list(MASK_CHOICES), "ratio": ratios,
                "sample": np.arange(n)},
        attrs={"seeds": json.dumps(list(seeds)), "teacher_run": teacher.id, "val_images": n})
