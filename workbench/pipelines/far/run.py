"""FAR end to end: distill a BiLSTM replacement of a ViT teacher's attention, then prune it, as runs.

Ren et al., "Is Attention Required for Transformer Inference? Explore Function-preserving Attention
Replacement" (papers/000), on top of :mod:`methods.far`:

1. **FAR run** (``far-vit-demo``; ``far_<schedule>-vit-demo`` for another Table 3 schedule):
   every attention is replaced (§3.1, global replacement); the *distillation phase* trains only the
   substitutes with L = λ Σ_i (1 − cos(x_{i+1}, x'_{i+1})) + CE (Eq. 3–4, λ = 1), the *finetuning
   phase* trains everything with CE (App. A.1). Schedules (Table 3): ``combined`` (Eq. 4), ``cls``
   (CE only), ``sim`` (similarity only), ``scratch`` (every weight re-initialised, CE; "TFS").
2. **Pruned run** (``far_pruned-vit-demo``, from the FAR run): DeepHoyer-regularised training of
   everything (CE + w·Σ Eq. 6, per layer, head and direction), pruning of every hidden unit whose
   group L2 norm is below the threshold (coordinated over gates, W_hh columns and the output
   projection, §3.3), then finetuning with the masks fixed (App. A.2). The run's
   ``model.safetensors`` is the *physically shrunk* model (:func:`methods.far.shrink`, exactly the
   masked model's function) and ``masks.safetensors`` holds the keep-mask ``(layer, head,
   direction, unit)``, from which :func:`load_model` rebuilds the shrunk architecture.
3. **Table 3 ablation** (``far_table3_<schedule>-vit-demo``): the four schedules with the profile's
   shorter ``ablation`` budgets, all four alike (so "combined" is its own short run there). ``--seed S`` (S > 0)
   trains another seed of it (``far_table3_<schedule>_s<S>-vit-demo``: the substitutes' initialisation, the shuffling
   and augmentation); seed 0 is the run above.

Every phase checkpoints each epoch under its run's phase directory (``distill/``, ``finetune/``,
``regularise/``, ``masked_finetune/``); an interrupted run resumes where it stopped. Budgets per
profile are in :data:`BUDGETS`.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Callable, Literal

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from methods.devices import exact_float32
from methods.far import (
    CONVENTIONS,
    PAPER_TABLE1_IMAGENET,
    PAPER_TABLE3,
    SCHEDULES,
    FARLoss,
    apply_masks,
    count_flops,
    freeze_for_distillation,
    from_scratch,
    mask_hook,
    prune_masks,
    replace_attention,
    retention,
    shrink,
    unfreeze_all,
)
from workbench.models import create_model, load_model, read_state_dict
from workbench.pipelines import Method, Option, RunRequest, register_method
from workbench.pipelines.common import (
    RUNTIME_ONLY,
    limited,
    opening,
    phase_logger,
    run_tag,
    student_run,
    teacher_val_acc,
    train_record,
)
from workbench.pipelines.far.budgets import BUDGETS, FARBudget, for_teacher
from workbench.runs import Run, RunError, open_run
from workbench.runtime import TrainConfig, atomic_save_safetensors, evaluate, fit, is_main

__all__ = ["BUDGETS", "FARBudget", "run_id", "load_masks"]

Schedule = Literal["scratch", "cls", "sim", "combined"]


# --------------------------------------------------------------------------------------------
# Run ids
# --------------------------------------------------------------------------------------------


def run_id(tag: str, schedule: str = "combined", *, pruned: bool = False, table3: bool = False, seed: int = 0) -> str:
    """``far-vit-demo``, ``far_sim-vit-demo``, ``far_pruned-vit-demo``, ``far_table3_cls-vit-demo``,
    ``far_table3_cls_s1-vit-demo`` (``tag``: :func:`~workbench.pipelines.common.run_tag`, the teacher and profile part;
    a seed other than 0 only for Table 3 runs)."""
    if table3:
        kind = f"far_table3_{schedule}" + (f"_s{seed}" if seed else "")
    else:
        kind = "far" if schedule == "combined" else f"far_{schedule}"
        kind = f"{kind}_pruned" if pruned else kind
    return f"{kind}-{tag}"


# --------------------------------------------------------------------------------------------
# Builder and masks
# --------------------------------------------------------------------------------------------


def load_masks(run: str | Run) -> torch.Tensor:
    """A pruned run's keep-mask ``(layer, head, direction, unit)`` bool (layer = replaced blocks in order)."""
    run = run if isinstance(run, Run) else open_run(run)
    path = run.dir / "masks.safetensors"
    if not path.exists():
        raise RunError(f"run {run.id!r} has no masks.safetensors: it is not a pruned FAR run")
    return read_state_dict(path)["keep"].bool()


# --------------------------------------------------------------------------------------------
# Run bodies
# --------------------------------------------------------------------------------------------


def _set_drop_path(model: nn.Module, rate: float) -> None:
    """Stochastic depth with timm's linear decay rule over the blocks (no parameters: checkpoints unaffected)."""
    from timm.layers import DropPath

    n = len(model.blocks)
    for i, blk in enumerate(model.blocks):
        r = rate * i / max(1, n - 1)
        for name in ("drop_path1", "drop_path2"):
            if hasattr(blk, name):
                setattr(blk, name, DropPath(r) if r > 0 else nn.Identity())


def _with_device(cfg: TrainConfig, device: torch.device) -> TrainConfig:
    return replace(cfg, device=device)


def _counts(model: nn.Module) -> dict:
    """Parameters and MACs per image (``methods.far.count_flops``), counted on a CPU copy."""
    import copy

    c = count_flops(copy.deepcopy(model).float().cpu())
    return {"params": c["total"]["params"], "macs": c["total"]["macs"], "attn_macs": c["attn"]["macs"]}


def _far_body(req: RunRequest, schedule: str, phases: tuple[TrainConfig, TrainConfig], budget: FARBudget,
              table3: bool = False) -> Callable[[Run], dict]:
    def body(run: Run) -> dict:
        with opening(req, phases[0].cpu_threads, frozen=False) as start:
            return _far_phases(run, start.teacher, start.train_set, start.val_set)

    def _far_phases(run: Run, teacher: nn.Module, train_set, val_set) -> dict:
        if table3:  # the Table 3 runs' own (smaller) share of the training set
            train_set = limited(train_set, budget.ablation_train_images)
        distill_cfg, finetune_cfg = (_with_device(c, req.device) for c in phases)
        if schedule == "scratch" and budget.scratch_lr is not None:
            distill_cfg = replace(distill_cfg, lr=budget.scratch_lr)
        torch.manual_seed(distill_cfg.seed)  # the substitutes' initialisation
        student = replace_attention(teacher, budget.far)
        if budget.drop_path:
            _set_drop_path(student, budget.drop_path)
        if schedule == "scratch":  # Table 3 "TFS": every weight re-initialised, all trainable, CE only
            student = from_scratch(student)
        else:
            freeze_for_distillation(student)
        loss = FARLoss(teacher, schedule, lam=budget.lam, sim_input=budget.sim_input,
                       label_smoothing=distill_cfg.label_smoothing)
        hist_d = fit(student, train_set, val_set, distill_cfg, loss_fn=loss, ckpt_dir=run.phase_dir("distill"),
                     on_epoch_end=phase_logger(run, "distill", 0))
        unfreeze_all(student)
        hist_f = []
        if finetune_cfg.epochs:
            hist_f = fit(student, train_set, val_set, finetune_cfg, ckpt_dir=run.phase_dir("finetune"),
                         on_epoch_end=phase_logger(run, "finetune", distill_cfg.epochs))
        if is_main():
            atomic_save_safetensors(student.state_dict(), run.checkpoint)
        return {"val_acc": (hist_f or hist_d)[-1]["val_acc"], "distill_val_acc": hist_d[-1]["val_acc"],
                "teacher_val_acc": teacher_val_acc(req), "epochs": len(hist_d) + len(hist_f),
                "train_images": len(train_set), "val_images": len(val_set), **_counts(student)}

    return body


def _pruned_body(req: RunRequest, far_run: Run, budget: FARBudget) -> Callable[[Run], dict]:
    def body(run: Run) -> dict:
        student = load_model(far_run.id, device=req.device).model
        with opening(req, budget.regularise.cpu_threads, model=student) as start:
            return _prune_phases(run, student, start.train_set, start.val_set)

    def _prune_phases(run: Run, student: nn.Module, train_set, val_set) -> dict:
        dev = req.device
        unfreeze_all(student)
        if budget.drop_path:
            _set_drop_path(student, budget.drop_path)
        reg_cfg, ft_cfg = _with_device(budget.regularise, req.device), _with_device(budget.masked_finetune, req.device)
        reg = FARLoss(None, "cls", hoyer_weight=budget.hoyer_weight, grouping=budget.grouping,
                      label_smoothing=reg_cfg.label_smoothing)
        hist_r = fit(student, train_set, val_set, reg_cfg, loss_fn=reg, ckpt_dir=run.phase_dir("regularise"),
                     on_epoch_end=phase_logger(run, "regularise", 0))
        masks_path = run.dir / "masks.safetensors"
        if masks_path.exists():  # resuming after the pruning step
            masks = load_masks(run)
        else:
            masks = prune_masks(student, budget.threshold, budget.grouping).cpu()
            if is_main():
                atomic_save_safetensors({"keep": masks.to(torch.uint8)}, masks_path,
                                        {"threshold": str(budget.threshold), "grouping": budget.grouping})
        apply_masks(student, masks)
        loader = DataLoader(val_set, batch_size=256)
        acc_pruned = evaluate(student, loader, dev)["val_acc"]  # masked, before finetuning
        hist_f = fit(student, train_set, val_set, ft_cfg, hooks=[mask_hook(masks)],
                     ckpt_dir=run.phase_dir("masked_finetune"), on_epoch_end=phase_logger(run, "masked_finetune", reg_cfg.epochs))
        student.eval()
        small = shrink(student, masks).eval()
        with torch.no_grad(), exact_float32():  # the shrunk model computes what the masked one does (no TF32 on a GPU)
            images = next(iter(loader))[0][:64].to(dev)
            gap = (small(images) - student(images)).abs().max().item()
        if is_main():
            atomic_save_safetensors(small.state_dict(), run.checkpoint)
        ret = retention(masks)  # (layer, head, direction)
        before, after = _counts(student), _counts(small)
        model = {"name": "far_vit", "kwargs": {**far_run.config["model_kwargs"], "keep": masks.int().tolist()}}
        return {"model": model, "val_acc": evaluate(small, loader, dev)["val_acc"], "regularised_val_acc": hist_r[-1]["val_acc"],
                "pruned_before_finetune_val_acc": acc_pruned, "masked_val_acc": hist_f[-1]["val_acc"],
                "kept_fraction": ret.mean().item(), "kept_forward": ret[:, :, 0].mean().item(),
                "kept_reverse": ret[:, :, 1].mean().item(), "kept_units": int(masks.sum()), "units": masks.numel(),
                "shrunk_vs_masked_max_abs_diff": gap, "params_before": before["params"], "params": after["params"],
                "macs_before": before["macs"], "macs": after["macs"],
                "epochs": len(hist_r) + len(hist_f)}

    return body


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


def _config(req: RunRequest, schedule: str, phases, budget: FARBudget, **extra) -> dict:
    """What defines a FAR run besides the method, profile, data and teacher (``student_run`` adds those)."""
    t = req.teacher
    return {
        "model_name": "far_vit",
        "model_kwargs": {"base": t.model_name, "base_kwargs": t.model_kwargs, "far": asdict(budget.far)},
        "far": asdict(budget.far), "schedule": schedule,
        "budget": {"distill": train_record(phases[0]), "finetune": train_record(phases[1]), "lam": budget.lam,
                   "sim_input": budget.sim_input, "drop_path": budget.drop_path,
                   **({"scratch_lr": budget.scratch_lr} if schedule == "scratch" else {})},
        **extra,
    }


def _far_run(req: RunRequest, schedule: str, spent: FARBudget) -> Run:
    """The FAR run of ``schedule`` (distillation + finetuning, App. A.1)."""
    phases = (spent.distill, spent.finetune)
    return student_run(req, run_id(run_tag(req), schedule), _config(req, schedule, phases, spent),
                       _far_body(req, schedule, phases, spent))


def _pruned_run(req: RunRequest, schedule: str, spent: FARBudget, far: Run) -> Run:
    """The DeepHoyer pruning run on top of ``far`` (App. A.2)."""
    phases = (spent.distill, spent.finetune)
    cfg = _config(req, schedule, phases, spent, source_run=far.id,
                  source_checkpoint_sha256=far.manifest.get("checkpoint_sha256"),
                  pruning={"regularise": asdict(spent.regularise), "masked_finetune": asdict(spent.masked_finetune),
                           "hoyer_weight": spent.hoyer_weight, "threshold": spent.threshold, "grouping": spent.grouping})
    for phase in ("regularise", "masked_finetune"):
        for k in RUNTIME_ONLY:
            cfg["pruning"][phase].pop(k)
    return student_run(req, run_id(run_tag(req), schedule, pruned=True), cfg, _pruned_body(req, far, spent))


def _table3_run(req: RunRequest, schedule: str, spent: FARBudget, seed: int = 0) -> Run:
    """One Table 3 run: ``schedule`` with the profile's (shorter) ablation budgets, trained with ``seed`` (both phases'
    seed: initialisation, shuffling, augmentation; seed 0 leaves the budget's configs, and so the run, as they were)."""
    phases = tuple(replace(c, seed=seed) for c in spent.ablation) if seed else spent.ablation
    config = _config(req, schedule, phases, spent, table3=True)
    if spent.ablation_train_images is not None:
        config["budget"]["train_images"] = spent.ablation_train_images
    return student_run(req, run_id(run_tag(req), schedule, table3=True, seed=seed), config,
                       _far_body(req, schedule, phases, spent, table3=True))


def _check_teacher_is_vit(req: RunRequest) -> None:
    """Refuse a non-ViT teacher before any run directory is created (``check_vit``'s message)."""
    from methods.far import check_vit

    check_vit(create_model(req.teacher.model_name, **req.teacher.model_kwargs))


def _check_schedule(schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")


def _check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {seed!r}")


def _run(req: RunRequest, schedule: Schedule = "combined", prune: bool = True, table3: bool = False,
         seed: int = 0) -> Run:
    """Distill FAR from the request's teacher (and prune it), or one Table 3 run; reuse, resume or start the runs.

    Args:
        req: teacher, profile, budget (:data:`BUDGETS`), device, data, force, log.
        schedule: Table 3 loss schedule of the distillation phase.
        prune: also run the DeepHoyer pruning run on top of the FAR run.
        table3: the Table 3 ablation run of ``schedule`` (the profile's short ablation budgets; the main FAR run
            when the profile has none).
        seed: training seed of a Table 3 ablation run (0: the run every figure uses; others: its repeats).

    Returns:
        The pruned run when ``prune`` (and not ``table3``), else the FAR (or Table 3) run.

    Raises:
        ValueError: unknown schedule, a teacher that is not a ViT, a seed other than 0 for a run that is not a
            Table 3 ablation run.
        RunError: a run id exists with another config (pass ``force``).
    """
    _check_schedule(schedule)
    _check_seed(seed)
    _check_teacher_is_vit(req)
    spent = for_teacher(req.budget, req.profile, req.teacher.model_name)
    if seed and (not table3 or spent.ablation is None):
        raise ValueError(f"--seed {seed} repeats a Table 3 ablation run: pass --table3 (on a profile with an ablation "
                         "budget, demo or smoke); the main FAR run has seed 0 only")
    if table3 and spent.ablation is not None:
        return _table3_run(req, schedule, spent, seed)
    far = _far_run(req, schedule, spent)
    return far if table3 or not prune else _pruned_run(req, schedule, spent, far)


# --------------------------------------------------------------------------------------------
# CLI: workbench run far
# --------------------------------------------------------------------------------------------


register_method(Method(
    "far", "Distill a FAR (BiLSTM instead of attention) student from a ViT teacher, then prune it.", BUDGETS, _run,
    teacher="vit", family="ViT", paper_title="FAR — attention replaced by BiLSTMs", paper_ref="papers/000",
    paper={"table1_imagenet": PAPER_TABLE1_IMAGENET, "table3": PAPER_TABLE3, "conventions": CONVENTIONS},
    options=(Option("schedule", "Table 3 loss schedule of the distillation phase (combined = Eq. 4)",
                    choices=tuple(SCHEDULES), default="combined"),
             Option("prune", "DeepHoyer pruning after distillation + finetuning", type=None, default=True, switch=True),
             Option("table3", "the Table 3 ablation run of --schedule (the profile's short ablation budget)", type=None,
                    default=False, switch=True),
             Option("seed", "training seed of a --table3 run (0: the figures' run; others repeat it)", type=int,
                    default=0, check=_check_seed)),
    examples=("workbench run far", "workbench run far --teacher teacher-vit-demo --schedule sim --no-prune"),
))
