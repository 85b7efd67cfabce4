"""The run body of a SlimSwin run (Algorithm 1 + final fine-tune), resumable; see :mod:`workbench.pipelines.slimswin.run`.

:func:`prune_and_finetune` is called by ``ensure_run`` with the run directory. It keeps two phases:
``prune/state.safetensors`` (weights with masks, plus the iteration records as metadata, rewritten
atomically after every iteration) and ``final/`` (the training loop's epoch checkpoints), so an
interruption costs at most one iteration or one epoch.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from methods.slimswin import (
    SlimSwinConfig,
    add_gates,
    attention_macs,
    check_swin,
    get_masks,
    kd_loss,
    prunable_layers,
    prune,
    sum_macs,
    swin_layers,
    window_head_saliency,
)
from workbench.models import create_model, read_state_dict
from workbench.pipelines.common import IndexedSubset, limited, opening
from workbench.runs import Run, RunError, atomic_write_text, open_run
from workbench.runtime import TrainConfig, atomic_save_safetensors, evaluate, fit, init_distributed, is_main

if TYPE_CHECKING:
    from workbench.pipelines import RunRequest
    from workbench.pipelines.common import TeacherRef


def sample_subset(n_total: int, n: int, seed: int) -> list[int]:
    """A seeded subset of ``n`` of ``n_total`` indices, sorted (Algorithm 1's d-hat / D-hat draws)."""
    return torch.randperm(n_total, generator=torch.Generator().manual_seed(seed))[: min(n, n_total)].sort().values.tolist()


def kd_loss_fn(teacher: nn.Module, cfg: SlimSwinConfig, key: str | None = None):
    """§V-B's distillation loss against the unpruned ``teacher``; ``key`` (the teacher's weights' SHA-256) lets the
    arms trained on the same batches share its logits (:mod:`workbench.pipelines.teacher_memo`)."""
    from workbench.pipelines.teacher_memo import teacher_logits

    def loss_fn(model, images, targets):
        logits = model(images)
        t_logits = teacher_logits(teacher, images, key)
        loss = kd_loss(logits, t_logits, targets, alpha=cfg.kd_alpha, T=cfg.kd_temperature)
        return loss, {"kd": loss.detach()}

    return loss_fn


def iteration_train_config(cfg: SlimSwinConfig, recipe, dev: torch.device) -> TrainConfig:
    """The short fine-tune after each of Algorithm 1's pruning steps: constant learning rate, no warm-up (the
    caller sets the seed per iteration)."""
    return TrainConfig(epochs=cfg.iteration_epochs, batch_size=recipe.batch_size, lr=cfg.lr, weight_decay=cfg.weight_decay,
                       sched="constant", warmup_epochs=0, device=dev, progress=False)


def final_train_config(cfg: SlimSwinConfig, recipe, dev: torch.device) -> TrainConfig:
    """The final fine-tune's schedule (Algorithm 1, line 20): cosine with warm-up over ``cfg.final_epochs``."""
    return TrainConfig(epochs=cfg.final_epochs, batch_size=recipe.batch_size, lr=cfg.lr, weight_decay=cfg.weight_decay,
                       sched="cosine", warmup_epochs=cfg.warmup_fraction * cfg.final_epochs, warmup_lr=cfg.min_lr,
                       min_lr=cfg.min_lr, seed=recipe.seed, device=dev, progress=recipe.progress)


def _state_metadata(steps: list[dict]) -> dict[str, str]:
    return {"steps": json.dumps(steps)}


def _save_state(path, model: nn.Module, steps: list[dict]) -> None:
    """Weights (masks included) and the iteration records in one atomic file (rank 0 only under torchrun)."""
    if is_main():
        atomic_save_safetensors(model.state_dict(), path, metadata=_state_metadata(steps))


def _same_on_all_ranks(saliency: list[torch.Tensor]) -> list[torch.Tensor]:
    """Under torchrun every rank must prune the same pairs: use rank 0's saliency everywhere."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        for s in saliency:
            buf = s.to(torch.device("cuda") if dist.get_backend() == "nccl" else s.device)
            dist.broadcast(buf, src=0)
            s.copy_(buf.cpu())
    return saliency


def _load_state(path, model: nn.Module) -> list[dict]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        steps = json.loads(f.metadata()["steps"])
    model.load_state_dict(read_state_dict(path))
    return steps


def _step_record(step, saliency: list[torch.Tensor], metrics: dict, iteration: int) -> dict:
    return {"iteration": iteration, "pruned": step.pruned.tolist(), "scores": step.scores.tolist(),
            "num_pruned": step.num_pruned, "ratio": step.ratio,
            "saliency": [s.tolist() for s in saliency],
            "val_acc": metrics.get("val_acc"), "val_loss": metrics.get("val_loss"),
            "train_loss": metrics.get("train_loss")}


def load_masks(run: str | Run) -> list[torch.Tensor]:
    """The run's 0/1 masks, one bool ``(num_windows, num_heads)`` tensor per layer (True = kept)."""
    run = run if isinstance(run, Run) else open_run(run)
    state = read_state_dict(run.dir / "masks.safetensors")
    return [state[f"layer{l}"].bool() for l in range(len(state))]


def gated_student(teacher: "TeacherRef", ref_model: nn.Module, gate_mode: str, dev: torch.device) -> nn.Module:
    """The teacher's architecture with SlimSwin's gates (all ones), holding the unpruned teacher's weights, on ``dev``.

    Raises:
        RunError: the teacher's weights do not fit its architecture.
    """
    model = add_gates(create_model(teacher.model_name, **teacher.model_kwargs), mode=gate_mode)
    keys = model.load_state_dict(ref_model.state_dict(), strict=False)  # the gates stay all-ones
    if keys.unexpected_keys or any(not k.endswith((".gate", ".gate_mask")) for k in keys.missing_keys):
        raise RunError(f"teacher {teacher.ref!r} does not fit {teacher.model_name}: {keys}")
    return model.to(dev)


def prune_and_finetune(run: Run, req: "RunRequest", cfg: SlimSwinConfig, start_from: Run | None) -> dict:
    """Algorithm 1 to ``cfg.target_ratio`` then the final fine-tune, in ``run.dir``; returns the run's results.

    Args:
        run: the run being made (resumes from its ``prune/`` and ``final/`` checkpoints if present).
        req: the request: resolved teacher (run or timm name + checkpoint), profile and its budget (the
            :class:`SlimSwinRecipe`: batch size, seeds, threads...), data, device, log.
        cfg: SlimSwin hyper-parameters, with the run's ratio.
        start_from: a compatible complete run whose iterations this run continues, or None.
    """
    init_distributed(req.device)  # a no-op unless launched by torchrun (run_method joined the group already)
    with opening(req, req.budget.cpu_threads) as start:  # the unpruned teacher, frozen
        ref_model, train_set, val_set, dev = start.teacher, start.train_set, start.val_set, start.device
        check_swin(ref_model)
        model = gated_student(req.teacher, ref_model, cfg.gate_mode, dev)
        layers = prunable_layers(model, cfg.exclude)
        total = sum(swin_layers(model)[l].num_pairs for l in layers)
        steps = _restore(run, model, start_from, total, req.log)
        t0 = time.perf_counter()
        _iterate(run, req, cfg, (model, ref_model), (train_set, val_set), steps, total)
        before = evaluate(model, DataLoader(val_set, batch_size=256), dev)
        teacher_metrics = evaluate(ref_model, DataLoader(val_set, batch_size=256), dev)
        iter_time = time.perf_counter() - t0
        # --- final fine-tune on the full training set (Algorithm 1, line 20), resumable per epoch
        t1 = time.perf_counter()
        final_set = limited(train_set, req.budget.final_train_images)  # the demo's shorter final fine-tune
        final_hist = fit(model, final_set, val_set, final_train_config(cfg, req.budget, dev),
                         loss_fn=kd_loss_fn(ref_model, cfg, req.teacher.sha256), ckpt_dir=run.phase_dir("final"),
                         on_epoch_end=run.log_epoch) if cfg.final_epochs > 0 else []
        # the final fine-tune's last epoch evaluated this very model on the held-out set; without one, evaluate here
        after = final_hist[-1] if final_hist and "val_acc" in final_hist[-1] else \
            evaluate(model, DataLoader(val_set, batch_size=256), dev)
        if not is_main():  # rank 0 writes the outputs
            return {}
        history = {"prunable_layers": layers, "total_pairs": total, "step_pairs": cfg.step_pairs,
                   "target_ratio": cfg.target_ratio, "steps": steps, "final": final_hist}
        return {"val_acc": after["val_acc"], "val_loss": after["val_loss"],
                "val_acc_before_final": before["val_acc"], "teacher_val_acc": teacher_metrics["val_acc"],
                **_outputs(run, model, history), "iterative_time_s": iter_time,
                "final_time_s": time.perf_counter() - t1, "train_images": len(train_set), "val_images": len(val_set)}


def _restore(run: Run, model: nn.Module, start_from: Run | None, total: int, log) -> list[dict]:
    """The iteration records done so far (their weights loaded into ``model``): this run's own after an
    interruption, else those of ``start_from`` (they become this run's), else none."""
    state_path = run.phase_dir("prune") / "state.safetensors"
    steps: list[dict] = []
    if not state_path.exists() and start_from is not None:
        parent_state = start_from.dir / "prune" / "state.safetensors"
        log(f"continuing Algorithm 1 from {start_from.id} ({parent_state})")
        _save_state(state_path, model, _load_state(parent_state, model))  # the parent's iterations become ours
        run.update_manifest(chained_from=start_from.id)
    if state_path.exists():
        device = next(model.parameters()).device
        steps = _load_state(state_path, model)
        model.to(device)
        if steps:
            log(f"resuming after iteration {steps[-1]['iteration']} ({steps[-1]['num_pruned']}/{total} pairs pruned)")
    return steps


def _iterate(run: Run, req: "RunRequest", cfg: SlimSwinConfig, models: tuple[nn.Module, nn.Module],
             data: tuple[Dataset, Dataset], steps: list[dict], total: int) -> None:
    """Algorithm 1's iterative phase (lines 2-19) on the gated ``models[0]`` (``models[1]``: the unpruned teacher)
    with the training and held-out sets ``data``, after the ``steps`` done; resumable after every iteration
    (``prune/state.safetensors``); appends each iteration's record to ``steps``."""
    (model, ref_model), (train_set, val_set) = models, data
    recipe, dev, log = req.budget, req.device, req.log
    plain_train = _saliency_set(train_set, req.data, tuple(ref_model.pretrained_cfg["input_size"]),
                                ref_model.pretrained_cfg.get("mean"), ref_model.pretrained_cfg.get("std"))
    state_path = run.phase_dir("prune") / "state.safetensors"
    offset = len(steps)
    n_ft = max(recipe.batch_size, round(cfg.finetune_fraction * len(train_set)))
    iter_cfg = iteration_train_config(cfg, recipe, dev)
    last_saliency: list[list[torch.Tensor]] = []
    last_metrics: list[dict] = []

    def saliency_fn(m: nn.Module, it: int) -> list[torch.Tensor]:
        idx = sample_subset(len(plain_train), cfg.saliency_samples, recipe.seed * 100_003 + 2 * (offset + it))  # d-hat
        loader = DataLoader(IndexedSubset(plain_train, idx), batch_size=recipe.saliency_batch)
        batches = ((x.to(dev), y.to(dev)) for x, y in loader)
        sal = _same_on_all_ranks(window_head_saliency(m, batches, F.cross_entropy, reduce=cfg.reduce))
        last_saliency[:] = [sal]
        return sal

    def finetune_fn(m: nn.Module, it: int) -> None:
        idx = sample_subset(len(train_set), n_ft, recipe.seed * 100_003 + 2 * (offset + it) + 1)  # D-hat
        hist = fit(m, IndexedSubset(train_set, idx), val_set if recipe.eval_iterations else None,
                   replace(iter_cfg, seed=recipe.seed * 1000 + offset + it),
                   loss_fn=kd_loss_fn(ref_model, cfg, req.teacher.sha256))
        last_metrics[:] = [hist[-1]]

    def on_step(step, m: nn.Module) -> None:
        rec = _step_record(step, last_saliency[0], last_metrics[0] if last_metrics else {}, offset + step.iteration)
        steps.append(rec)
        _save_state(state_path, m, steps)
        acc = "" if rec["val_acc"] is None else f", held-out top-1 {rec['val_acc']:.4f}"
        log(f"iteration {rec['iteration']}: pruned {rec['pruned']} -> {rec['num_pruned']}/{total} pairs "
            f"(ratio {rec['ratio']:.3f}){acc}")

    prune(model, cfg.target_ratio, cfg.step_pairs, saliency_fn=saliency_fn, finetune_fn=finetune_fn,
          exclude=cfg.exclude, on_step=on_step)


def _outputs(run: Run, model: nn.Module, history: dict) -> dict:
    """Write the run's masks, history and weights (with masks); the pruning's results."""
    masks = get_masks(model)
    atomic_save_safetensors({f"layer{l}": m.to(torch.uint8) for l, m in enumerate(masks)}, run.dir / "masks.safetensors")
    macs, dense = attention_macs(model), attention_macs(model, [torch.ones_like(m) for m in masks])
    atomic_write_text(run.dir / "history.json", json.dumps(history))
    atomic_save_safetensors(model.state_dict(), run.checkpoint)
    steps, total = history["steps"], history["total_pairs"]
    return {
        "target_ratio": history["target_ratio"], "ratio": steps[-1]["ratio"] if steps else 0.0,
        "pruned_pairs": steps[-1]["num_pruned"] if steps else 0, "prunable_pairs": total, "iterations": len(steps),
        "layer_ratio": {str(g.layer): float((~masks[g.layer]).sum()) / g.num_pairs for g in swin_layers(model)},
        "attention_macs": sum_macs(macs), "attention_macs_unpruned": sum_macs(dense),
        "mac_reduction": 1.0 - sum_macs(macs) / sum_macs(dense),
    }


def _saliency_set(train_set: Dataset, data: str | None, input_size, mean, std) -> Dataset:
    """The training images without augmentation: saliency is measured on the images themselves."""
    from workbench.data import DemoDataset, image_folder

    if data is not None:
        return image_folder(Path(data).expanduser() / "train", is_training=False, input_size=input_size, mean=mean, std=std)
    if isinstance(train_set, DemoDataset):
        plain = DemoDataset.__new__(DemoDataset)
        plain.__dict__.update(train_set.__dict__)
        plain.train_transform = False
        return plain
    return train_set
