"""The run body of an AttentionLite run (sparse distillation, Algorithm 1), resumable; see :mod:`workbench.pipelines.attentionlite.run`.

:func:`sparse_distill` is called by ``ensure_run`` with the run directory. Training is one ``fit`` whose epoch
checkpoints (weights, optimizer, the sparse-momentum masks and pending update) live in ``train/``, so an
interruption costs at most one epoch and the resumed run ends where an uninterrupted one would. After training:

- irregular pruning: ``model.safetensors`` is the masked train form (its deploy form: sparse weights);
- column pruning: ``model.safetensors`` is the *shrunk* deploy form (:func:`methods.attentionlite.shrink`,
  timm ``sa_resnet_column``), checked against the masked model on held-out images before it is written; the
  masked train form stays in ``train/model.safetensors``;
- ``masks.safetensors``: the final weight-shaped masks (uint8), one tensor per pruned layer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from methods.attentionlite import (
    SparseDistillationLoss,
    SparseMomentum,
    count_macs_sparse,
    count_params,
    deploy_kwargs,
    shrink,
    weight_masks_density,
)
from methods.devices import exact_float32
from workbench.models import create_model
from workbench.pipelines.attentionlite.budgets import AttentionLiteBudget
from workbench.pipelines.common import limited, opening, teacher_val_acc
from workbench.runs import Run, RunError
from workbench.runtime import TrainConfig, TrainHook, atomic_save_safetensors, evaluate, fit, is_main

if TYPE_CHECKING:
    from workbench.pipelines import RunRequest

__all__ = ["RunSpec", "StepDecay", "sparse_distill", "SHRINK_TOLERANCE"]

#: Largest |logit difference| allowed between the shrunk and the masked model (float32 on the held-out images; on a
#: GPU with TF32 off, :func:`methods.devices.exact_float32`, since cuDNN's TF32 convolutions alone differ by ~1e-3).
SHRINK_TOLERANCE = 1e-4


@dataclass(frozen=True)
class RunSpec:
    """What one AttentionLite run trains (besides the budget): the student, its pruning, its losses."""

    student: str  # timm name of the train form, e.g. "sa_resnet_demo"
    student_kwargs: dict  # its JSON kwargs
    pruning: str  # "irregular" or "column"
    density: float  # target parameter density d in (0, 1]
    at: bool  # attention-transfer loss on (KD+AT) or off (KD)
    seed: int  # initialisation, masks, shuffling
    kd: bool = True  # distil from the teacher (Eq. 2); False: cross-entropy on the labels alone (the no-distillation
    # baseline: no KL, no AT, the teacher never runs)


class StepDecay(TrainHook):
    """The learning rate × ``gamma`` after each milestone epoch (§4.1: × 0.1 after epochs 120, 160, 180).

    Applied after every optimizer step on top of a constant timm schedule (``TrainConfig`` has no milestones):
    ``lr = initial_lr · gamma^(milestones passed)``. Its state (the epoch) is checkpointed; after a resume the first
    update of the resumed epoch runs at the schedule's base rate (the hook first acts after it).
    """

    def __init__(self, milestones: tuple[int, ...], gamma: float):
        self.milestones, self.gamma, self.epoch = tuple(milestones), float(gamma), 0

    def _set(self, optimizer: torch.optim.Optimizer) -> None:
        factor = self.gamma ** sum(self.epoch >= m for m in self.milestones)
        for group in optimizer.param_groups:
            group["lr"] = group.get("initial_lr", group["lr"]) * factor

    def after_step(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self._set(optimizer)

    def on_epoch_end(self, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int) -> dict[str, float]:
        self.epoch = epoch + 1
        self._set(optimizer)
        return {}

    def state_dict(self) -> dict:
        return {"epoch": torch.tensor(self.epoch)}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])


def _macs(model: nn.Module, input_size: tuple[int, ...]) -> dict[str, float]:
    import copy

    cpu = copy.deepcopy(model).float().cpu().eval()
    return count_macs_sparse(cpu, torch.zeros(1, *input_size))


def sparse_distill(run: Run, req: "RunRequest", spec: RunSpec, cfg: TrainConfig) -> dict:
    """Algorithm 1 with Eq. 2 for ``spec`` in ``run.dir`` (the request's teacher, data and budget, ``cfg`` its
    training); returns the run's results (module docstring)."""
    budget: AttentionLiteBudget = req.budget
    with opening(req, budget.cpu_threads) as start:  # the data on the teacher run's held-out pixels
        train_set = limited(start.train_set, budget.train_limit)
        student, loss, sparse, history, train_time = _train(run, req, spec, cfg, start.teacher, train_set, start.val_set)
        results, deploy, masks, deploy_acc = _deploy(run, spec, student, sparse, start.val_set, start.device)
        masked_acc = history[-1]["val_acc"]
        return {**results, "val_acc": masked_acc if deploy_acc is None else deploy_acc, "masked_val_acc": masked_acc,
                "teacher_val_acc": teacher_val_acc(req), "target_density": spec.density,
                **_sizes(spec, start.teacher, student, deploy, masks),
                "at_stages": list(loss.stages) if spec.at else [], "epochs": len(history),
                "train_images": len(train_set), "val_images": len(start.val_set), "train_time_s": train_time}


def _cross_entropy(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The no-distillation baseline's loss: cross-entropy on the labels (Eq. 2's L_S alone)."""
    ce = F.cross_entropy(model(images), targets)
    return ce, {"ce": ce.detach()}


def _train(run: Run, req: "RunRequest", spec: RunSpec, cfg: TrainConfig, teacher: nn.Module, train_set, val_set):
    """The sparse distillation itself (one resumable ``fit``): the student, its loss, its sparse-momentum hook (None
    when dense), the history and the training seconds."""
    budget: AttentionLiteBudget = req.budget
    torch.manual_seed(spec.seed)  # the student's initialisation
    student = create_model(spec.student, **spec.student_kwargs)
    d = budget.distill
    loss = SparseDistillationLoss(teacher, alpha=d.alpha, beta=d.beta if spec.at else 0.0, rho=d.rho, p=d.p,
                                  at_form=d.at_form, resize=d.resize, kl_scale=d.kl_scale, student=student)
    hooks: list[TrainHook] = []
    sparse = None
    if spec.density < 1.0:
        s = budget.sparse
        sparse = SparseMomentum(student, spec.density, spec.pruning, epochs=cfg.epochs, prune_rate=s.prune_rate,
                                decay=s.decay, exclude=tuple(s.exclude), adam_normalize=s.adam_normalize, seed=spec.seed,
                                update_at=s.update_at)
        hooks.append(sparse)
    if budget.lr_milestones:
        hooks.append(StepDecay(budget.lr_milestones, budget.lr_gamma))
    req.log(f"sparse distillation: {spec.student} ({spec.pruning}, d = {spec.density:g}, {'KD+AT' if spec.at else 'KD' if spec.kd else 'no distillation'}, "
            f"seed {spec.seed}) from {req.teacher.ref} on {len(train_set)} images, {cfg.epochs} epochs")
    t0 = time.perf_counter()
    history = fit(student, train_set, val_set, cfg, loss_fn=loss if spec.kd else _cross_entropy, hooks=hooks,
                  ckpt_dir=run.phase_dir("train"), on_epoch_end=run.log_epoch)
    return student, loss, sparse, history, time.perf_counter() - t0


def _deploy(run: Run, spec: RunSpec, student: nn.Module, sparse: SparseMomentum | None, val_set,
            dev: torch.device) -> tuple[dict, nn.Module, dict, float | None]:
    """The deploy form (column pruning: shrunk, checked against the masked model) written as the run's model, with
    the masks: the shrink check's results, the deploy form, the masks and the deploy form's held-out accuracy (None
    when the deploy form is the masked model, whose accuracy is its last epoch's)."""
    student.eval()
    masks = sparse.weight_masks() if sparse is not None else {}
    loader = DataLoader(val_set, batch_size=256)
    results: dict = {}
    deploy = student
    if spec.pruning == "column" and masks:
        deploy = shrink(student, masks).to(dev)
        with torch.no_grad(), exact_float32():  # full float32 on a GPU too: TF32 convolutions differ by ~1e-3
            images = next(iter(loader))[0][:64].to(dev)
            gap = (deploy(images) - student(images)).abs().max().item()
        if not gap <= SHRINK_TOLERANCE:
            raise RunError(f"the shrunk model differs from the masked one by {gap:.2e} (> {SHRINK_TOLERANCE:g}) in its logits: "
                           "a bug in methods.attentionlite.shrink; the masked model is in train/model.safetensors")
        results.update(shrunk_vs_masked_max_abs_diff=gap,
                       model={"name": "sa_resnet_column", "kwargs": deploy_kwargs(masks, spec.student, spec.student_kwargs)})
    deploy_acc = evaluate(deploy, loader, dev)["val_acc"] if deploy is not student else None
    if is_main():
        if masks:
            atomic_save_safetensors({n: m.to(torch.uint8).contiguous() for n, m in masks.items()}, run.dir / "masks.safetensors",
                                    {"pruning": spec.pruning, "density": str(spec.density)})
        atomic_save_safetensors(deploy.state_dict(), run.checkpoint)
    return results, deploy, masks, deploy_acc


def _sizes(spec: RunSpec, teacher: nn.Module, student: nn.Module, deploy: nn.Module, masks: dict) -> dict:
    """Densities, parameters and MACs of the teacher, the dense student and its pruned (deploy) form."""
    input_size = tuple(teacher.pretrained_cfg["input_size"])
    dense_counts = count_params(create_model(spec.student, **spec.student_kwargs))
    t_params = sum(p.numel() for p in teacher.parameters())
    t_macs = _macs(teacher, input_size)["dense"]
    s_macs = _macs(student, input_size)
    if deploy is not student:
        kept_params, pruned_macs = sum(p.numel() for p in deploy.parameters()), _macs(deploy, input_size)["dense"]
    else:
        kept_params, pruned_macs = count_params(student, masks=masks)["kept"], s_macs["sparse"]
    return {
        "realised_density": weight_masks_density(masks) if masks else 1.0,  # kept / prunable weights, from the masks
        "nonzero_density": count_params(student)["prunable_nonzero"] / dense_counts["prunable"],  # from the weights
        "teacher_params": t_params, "student_params": dense_counts["total"], "kept_params": kept_params,
        "masked_params": count_params(student, masks=masks)["kept"],  # kept by the masks + all unmasked, masked train form
        "teacher_macs": t_macs, "student_macs": s_macs["dense"], "pruned_macs": pruned_macs,
        "param_reduction": t_params / kept_params, "flops_reduction": t_macs / pruned_macs,
        "dense_flops_reduction": t_macs / s_macs["dense"],
    }
