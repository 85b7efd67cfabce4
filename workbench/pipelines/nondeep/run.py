"""Non-deep ViT end to end: branch a ViT teacher, join the branches progressively, collapse them exactly, as runs.

"Non-deep Vision Transformers" (anonymous ICLR submission, papers/002) on top of :mod:`methods.nondeep`.
``workbench run nondeep --branches N --schedule S`` makes two runs:

1. **Branched run** (``nondeep_branched-n2-vit-demo``; the train form, timm ``nondeep_branched``): the
   teacher's L blocks become L/n parallel blocks of n branches (branch b of block i starts as teacher
   block n·i + b, LayerNorms before branching, Eq. 1); training with CE + α·L_div (+ the budget's logit
   and attention-map distillation from the teacher) while λ(t) joins the branches' softmax and GELU
   inputs (Eq. 4–9, App. B.2) over the Lambda Warmup Period, then at λ = 1 (Post-Joining Adjustment
   Phase). It checkpoints every epoch (``join/``) and resumes exactly; ``joined.safetensors`` keeps the
   weights at the step λ first reached 1 (what the adjustment phase started from: Fig. 6's analysis).
2. **Collapsed run** (``nondeep-n2-vit-demo``; the deploy form, timm ``nondeep_collapsed``): the exact
   collapse (:func:`methods.nondeep.collapse`) of the branched run's model into a plain L/n-block timm
   ViT. Its results record both forms: held-out top-1 of the collapsed and branched models (equal: the
   collapse is exact) and of the paper's merge formulas (Eq. 5–7), the collapse errors of every formula
   in float64 and float32, params and MACs. With ``--schedule none`` (Table 5's "no joining", λ = 0)
   the branches never share their non-linearities; the deploy form is then the exact *wide* model
   (n·H heads, n·F FFN, the teacher's cost), not an L/n-block one.

Also: ``--table5`` (a Table 5 ablation run with the profile's shorter budget; id
``nondeep_table5-n3-linear-div0.05-vit-demo``) and ``--baseline`` (the depth baseline of Table 1's
DeiT-l rows: the teacher's first L/n blocks trained with the same budget and loss, no branches; id
``nondeep_depth-d3-vit-demo``). ``--seed S`` trains with another shuffling seed than the profile's (ids end their
options with ``-sS``; the initialisation is the teacher's blocks whatever the seed). Budgets per profile:
:mod:`workbench.pipelines.nondeep.budgets`.

Refused before any run is written, with a message naming the fix: a branch count that does not divide
the teacher's depth, an unknown schedule, a teacher that is not a plain timm ViT, and a training too short
for λ to reach 1 (the collapse would come before joining is complete).

Cost: every run records ``wall_s``, its wall seconds with the GPU's queued work finished
(:func:`methods.devices.wall_clock`; the cost on a GPU), and ``cpu_s``, the CPU seconds of its process
(``time.process_time``: on a GPU mostly waiting, so not the cost there); a collapsed run also records
its branched run's as ``train_wall_s`` / ``train_cpu_s``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, replace

import torch
import torch.nn as nn

from methods.devices import wall_clock
from methods.nondeep import (
    COLLAPSE_VARIANTS,
    CONVENTIONS,
    PAPER_TABLE5,
    SCHEDULES,
    JoinConfig,
    NonDeepLoss,
    ProgressiveJoin,
    branch,
    check_branches,
    check_schedule,
    check_teacher,
    collapse,
    collapse_errors,
    depth_baseline,
    get_lambda,
    lambda_schedule,
    teacher_layers,
)
from workbench.models import create_model, load_model
from workbench.pipelines import Method, Option, RunRequest, register_method
from workbench.pipelines.common import (
    accuracy,
    limited,
    method_data,
    model_counts,
    opening,
    phase_logger,
    run_tag,
    student_run,
    train_record,
)
from workbench.pipelines.nondeep.budgets import BUDGETS, TABLE5_ROWS, NonDeepBudget
from workbench.runs import Run, open_run
from workbench.runtime import TrainConfig, TrainHook, atomic_save_safetensors, cpu_threads, fit, is_main

__all__ = ["BUDGETS", "NonDeepBudget", "TABLE5_ROWS", "JoinPlan", "plan", "run_nondeep", "load_branched",
           "load_joined"]


# --------------------------------------------------------------------------------------------
# The plan of one request (validated before anything is written)
# --------------------------------------------------------------------------------------------


class JoinPlan:
    """A validated request: the joining config, the epoch count and the run ids."""

    def __init__(self, join: JoinConfig, epochs: int, steps_per_epoch: int, depth: int, branches: int, tag: str,
                 table5: bool, default: JoinConfig, seed: int = 0, default_seed: int = 0):
        self.join, self.epochs, self.steps_per_epoch = join, epochs, steps_per_epoch
        self.depth, self.branches, self.table5 = depth, branches, table5
        self.seed = seed  # shuffling / augmentation seed of the training (the profile's unless --seed)
        parts = [f"n{branches}"]
        if table5 or join.schedule != default.schedule:
            parts.append(join.schedule)
        if table5 or join.diversity_weight != default.diversity_weight:
            parts.append(f"div{join.diversity_weight:g}")
        if join.rectify != default.rectify:
            parts.append("norect")
        if join.warmup_steps != default.warmup_steps:
            parts.append(f"w{join.warmup_steps}")
        if epochs != _default_epochs(default, steps_per_epoch):
            parts.append(f"e{epochs}")
        if seed != default_seed:
            parts.append(f"s{seed}")
        kind = "nondeep_table5" if table5 else "nondeep"
        self.collapsed_id = f"{kind}-{'-'.join(parts)}-{tag}"
        self.branched_id = f"{kind}_branched-{'-'.join(parts)}-{tag}"
        extra = (("-table5" if table5 else "") + _epochs_tag(epochs, default, steps_per_epoch)
                 + (f"-s{seed}" if seed != default_seed else ""))
        self.baseline_id = f"nondeep_depth-d{depth // branches}{extra}-{tag}"

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch


def _default_epochs(join: JoinConfig, steps_per_epoch: int) -> int:
    return max(1, math.ceil(join.total_steps / steps_per_epoch))


def _epochs_tag(epochs: int, default: JoinConfig, steps_per_epoch: int) -> str:
    return "" if epochs == _default_epochs(default, steps_per_epoch) else f"-e{epochs}"


def plan(req: RunRequest, branches: int = 2, schedule: str | None = None, diversity: float | None = None,
         rectify: bool = True, warmup_steps: int | None = None, epochs: int | None = None, table5: bool = False,
         train_images: int | None = None, seed: int | None = None) -> JoinPlan:
    """Validate a request and resolve its budget (nothing is written).

    Raises:
        ValueError: an unknown schedule, a teacher that is not a plain timm ViT, a branch count that does not
            divide its depth, negative weights or steps, or a training too short for λ to reach 1.
    """
    b: NonDeepBudget = req.budget
    default = (b.ablation or b.join) if table5 else b.join
    if schedule is not None:
        check_schedule(schedule)
    if isinstance(branches, bool) or not isinstance(branches, int) or branches < 1:
        raise ValueError(f"--branches must be a positive integer, got {branches!r}")
    if diversity is not None and diversity < 0:
        raise ValueError(f"--diversity must be ≥ 0, got {diversity}")
    if warmup_steps is not None and warmup_steps < 0:
        raise ValueError(f"--warmup-steps must be ≥ 0, got {warmup_steps}")
    if epochs is not None and epochs < 1:
        raise ValueError(f"--epochs must be ≥ 1, got {epochs}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"--seed must be a non-negative integer, got {seed!r}")
    join = replace(default, **{k: v for k, v in dict(schedule=schedule, diversity_weight=diversity, rectify=rectify,
                                                      warmup_steps=warmup_steps).items() if v is not None})
    t = req.teacher
    arch = create_model(t.model_name, **t.model_kwargs)
    check_teacher(arch)  # a clear error for Swin, CNNs, ViTs with q/k norm ...
    depth = len(arch.blocks)
    check_branches(depth, branches)
    if train_images is None:
        train_images = len(method_data(req, arch)[0])
        if table5 and b.ablation_train_images is not None:
            train_images = min(train_images, b.ablation_train_images)
    steps_per_epoch = max(1, math.ceil(train_images / join.batch_size))
    n_epochs = epochs if epochs is not None else _default_epochs(join, steps_per_epoch)
    steps = n_epochs * steps_per_epoch
    if join.schedule not in ("none", "instant") and steps < join.warmup_steps:
        reached = lambda_schedule(join.schedule, steps / join.warmup_steps)
        raise ValueError(
            f"collapse before joining is complete: {n_epochs} epoch(s) of {steps_per_epoch} steps end at step {steps}, "
            f"where the {join.schedule} λ(t) of a {join.warmup_steps}-step warm-up is only {reached:.2f}; the branches "
            f"share their softmax and GELU inputs (and collapse exactly) only at λ = 1. Train at least "
            f"{math.ceil(join.warmup_steps / steps_per_epoch)} epochs or shorten --warmup-steps.")
    return JoinPlan(join, n_epochs, steps_per_epoch, depth, branches, run_tag(req), table5, default,
                    b.seed if seed is None else seed, b.seed)


# --------------------------------------------------------------------------------------------
# Loading the forms of a run
# --------------------------------------------------------------------------------------------


def load_branched(run: str | Run, device: str = "cpu") -> nn.Module:
    """The branched (train-form) model behind a Non-deep run (a collapsed run's source, or a branched run itself)."""
    run = run if isinstance(run, Run) else open_run(run)
    source = run.config.get("source_run", run.id) if run.config.get("model_name") == "nondeep_collapsed" else run.id
    return load_model(source, device=device).model


def load_joined(run: str | Run, device: str = "cpu") -> nn.Module | None:
    """The branched model at the step λ first reached 1 (``joined.safetensors``), or None (no joining: ``none``)."""
    from workbench.models import load_weights, read_state_dict, run_model_spec

    run = run if isinstance(run, Run) else open_run(run)
    if run.config.get("model_name") == "nondeep_collapsed":
        run = open_run(run.config["source_run"])
    path = run.dir / "joined.safetensors"
    if not path.exists():
        return None
    name, kwargs = run_model_spec(run)
    model = create_model(name, **kwargs)
    load_weights(model, read_state_dict(path), what=f"run {run.id!r} joined.safetensors")
    return model.eval().to(device)


# --------------------------------------------------------------------------------------------
# Run bodies
# --------------------------------------------------------------------------------------------


class JoinSnapshot(TrainHook):
    """Saves the model once, at the first step where λ = 1 (before any step if it starts there)."""

    def __init__(self, path, join: ProgressiveJoin):
        self.path, self.join = path, join

    def _save(self, model: nn.Module) -> None:
        if is_main() and not self.path.exists() and self.join.value() >= 1.0:
            atomic_save_safetensors(model.state_dict(), self.path, {"step": str(self.join.step)})

    def start(self, model: nn.Module) -> JoinSnapshot:
        self._save(model)
        return self

    def after_step(self, model: nn.Module, optimizer) -> None:
        self._save(model)


def _train_config(p: JoinPlan, b: NonDeepBudget, device: torch.device) -> TrainConfig:
    j = p.join
    return TrainConfig(epochs=p.epochs, batch_size=j.batch_size, lr=j.lr, weight_decay=j.weight_decay,
                       warmup_epochs=b.warmup_epochs, min_lr=j.lr * b.min_lr_ratio, label_smoothing=b.label_smoothing,
                       seed=p.seed, device=device, amp=b.amp, progress=b.progress, cpu_threads=b.cpu_threads,
                       eval_every=b.eval_every)


def _loss(teacher: nn.Module, j: JoinConfig, p: JoinPlan, b: NonDeepBudget, branches: bool) -> NonDeepLoss:
    layers = teacher_layers(p.depth, p.branches, j.teacher_layer) if branches else None
    return NonDeepLoss(teacher, distill_weight=j.distill_weight if branches else 0.0,
                       diversity_weight=j.diversity_weight if branches else 0.0, kd_weight=j.kd_weight,
                       kd_temperature=j.kd_temperature, layers=layers, label_smoothing=b.label_smoothing)


def _teacher_acc(req: RunRequest) -> float | None:
    t = req.teacher
    return open_run(t.run).manifest.get("results", {}).get("val_acc") if t.run else None


def _branched_body(req: RunRequest, p: JoinPlan):
    b, t = req.budget, req.teacher

    def body(run: Run) -> dict:
        t0, clock = time.process_time(), wall_clock(req.device)
        cfg = _train_config(p, b, req.device)
        with opening(req, b.cpu_threads) as start:
            teacher, train_set, val_set = start.teacher, start.train_set, start.val_set
            if p.table5:  # Table 5 rows train on the profile's (smaller) share of the training set
                train_set = limited(train_set, b.ablation_train_images)
            model = branch(teacher, p.branches, rectify=p.join.rectify, base=t.model_name,
                           base_kwargs=t.model_kwargs).requires_grad_(True)
            join = ProgressiveJoin(p.join.schedule, p.join.warmup_steps).start(model)
            snap = JoinSnapshot(run.dir / "joined.safetensors", join).start(model)
            hist = fit(model, train_set, val_set, replace(cfg, cpu_threads=None),
                       loss_fn=_loss(teacher, p.join, p, b, True), hooks=[join, snap], ckpt_dir=run.phase_dir("join"),
                       on_epoch_end=phase_logger(run, "join", 0))
            if is_main():
                atomic_save_safetensors(model.state_dict(), run.checkpoint)
            counts = model_counts(model)
        return {"val_acc": hist[-1]["val_acc"], "lambda": get_lambda(model), "epochs": len(hist),
                "steps": p.total_steps, "warmup_steps": p.join.warmup_steps, "train_images": len(train_set),
                "val_images": len(val_set), "teacher_val_acc": _teacher_acc(req), "cpu_s": time.process_time() - t0,
                "wall_s": clock(), **counts}

    return body


def _collapsed_body(req: RunRequest, src: Run, p: JoinPlan):
    b = req.budget

    def body(run: Run) -> dict:
        t0, clock = time.process_time(), wall_clock(req.device)
        with cpu_threads(b.cpu_threads, req.device):
            dev = req.device
            branched = load_model(src.id, device=dev).model
            lam = get_lambda(branched)
            if 0.0 < lam < 1.0:  # plan() refuses such budgets; a hand-edited run could still get here
                raise ValueError(f"collapse before joining is complete: run {src.id!r} ended at λ = {lam:g}")
            form = "wide" if lam == 0.0 else "auto"
            deploy = collapse(branched, "exact", form).eval()
            _, val_set = method_data(req, deploy)
            images = torch.stack([val_set[i][0] for i in range(min(b.collapse_check_images, len(val_set)))]).to(dev)
            variants = tuple(COLLAPSE_VARIANTS) if form != "wide" else ("exact",)
            err64 = collapse_errors(branched, images, variants, form)
            err32 = collapse_errors(branched, images, variants, form, dtype=torch.float32)
            acc = accuracy(deploy, val_set, dev)
            paper = accuracy(collapse(branched, "paper").eval(), val_set, dev) if form != "wide" else None
            if is_main():
                atomic_save_safetensors(deploy.state_dict(), run.checkpoint)
            counts, src_res = model_counts(deploy), src.manifest["results"]
        return {"model": {"name": deploy.timm_spec[0], "kwargs": deploy.timm_spec[1]}, "val_acc": acc,
                "branched_val_acc": src_res["val_acc"], "paper_formulas_val_acc": paper,
                "form": deploy.timm_spec[1]["form"],
                "lambda": lam, "blocks": len(deploy.blocks), "branches": p.branches,
                "collapse_error_float64": err64, "collapse_error_float32": err32,
                "teacher_val_acc": src_res.get("teacher_val_acc"), "val_images": len(val_set),
                "branched_params": src_res["params"], "branched_macs": src_res["macs"], **counts,
                "train_cpu_s": src_res.get("cpu_s"), "cpu_s": time.process_time() - t0,
                "train_wall_s": src_res.get("wall_s"), "wall_s": clock()}

    return body


def _baseline_body(req: RunRequest, p: JoinPlan):
    b, t = req.budget, req.teacher

    def body(run: Run) -> dict:
        t0, clock = time.process_time(), wall_clock(req.device)
        cfg = _train_config(p, b, req.device)
        with opening(req, b.cpu_threads) as start:
            teacher, train_set, val_set, dev = start.teacher, start.train_set, start.val_set, start.device
            model = depth_baseline(teacher, p.branches, base=t.model_name, base_kwargs=t.model_kwargs)
            model.requires_grad_(True)
            before = accuracy(model, val_set, dev)
            hist = fit(model, train_set, val_set, replace(cfg, cpu_threads=None),
                       loss_fn=_loss(teacher, p.join, p, b, False), ckpt_dir=run.phase_dir("train"),
                       on_epoch_end=phase_logger(run, "train", 0))
            if is_main():
                atomic_save_safetensors(model.state_dict(), run.checkpoint)
            counts = model_counts(model)
        return {"val_acc": hist[-1]["val_acc"], "val_acc_before_training": before, "blocks": len(model.blocks),
                "epochs": len(hist), "steps": p.total_steps, "train_images": len(train_set), "val_images": len(val_set),
                "teacher_val_acc": _teacher_acc(req), "cpu_s": time.process_time() - t0, "wall_s": clock(), **counts}

    return body


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def _record(p: JoinPlan, b: NonDeepBudget, device: str) -> dict:
    return {"join": asdict(p.join), "train": train_record(_train_config(p, b, device)), "branches": p.branches,
            **({"train_images": b.ablation_train_images} if p.table5 and b.ablation_train_images else {})}


def run_nondeep(req: RunRequest, branches: int = 2, schedule: str | None = None, diversity: float | None = None,
                rectify: bool = True, warmup_steps: int | None = None, epochs: int | None = None, table5: bool = False,
                baseline: bool = False, seed: int | None = None) -> Run:
    """Train (or reuse, or resume) the branched run and collapse it; returns the collapsed (deploy) run.

    With ``baseline`` the depth baseline's run instead (the teacher's first L/n blocks, same budget and loss).
    Options: see the module docstring and :data:`OPTIONS`.

    Raises:
        ValueError: bad options (before anything is written; :func:`plan`).
        RunError: a run id exists with another config (pass ``force``).
    """
    p = plan(req, branches, schedule, diversity, rectify, warmup_steps, epochs, table5, seed=seed)
    t, b = req.teacher, req.budget
    base = {"base": t.model_name, "base_kwargs": t.model_kwargs, "branches": p.branches}
    if baseline:
        kwargs = {**t.model_kwargs, "depth": p.depth // p.branches}
        return student_run(req, p.baseline_id, {"model_name": t.model_name, "model_kwargs": kwargs, "baseline": "depth",
                                                **_record(p, b, req.device)}, _baseline_body(req, p))
    branched = {"model_name": "nondeep_branched", "model_kwargs": {**base, "rectify": p.join.rectify},
                **_record(p, b, req.device)}
    src = student_run(req, p.branched_id, branched, _branched_body(req, p))
    form = "wide" if p.join.schedule == "none" else "auto"
    collapsed = {"model_name": "nondeep_collapsed", "model_kwargs": {**base, "form": form}, "source_run": src.id,
                 "source_checkpoint_sha256": src.manifest.get("checkpoint_sha256"), "collapse": "exact"}
    return student_run(req, p.collapsed_id, collapsed, _collapsed_body(req, src, p))


# --------------------------------------------------------------------------------------------
# CLI: workbench run nondeep
# --------------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _report(run: Run) -> str:
    r = run.manifest["results"]
    if run.config.get("baseline") == "depth":
        return (f"depth baseline: the teacher's first {r['blocks']} blocks, trained alike: held-out top-1 "
                f"{_pct(r['val_acc'])} (before training {_pct(r['val_acc_before_training'])}, "
                f"teacher {_pct(r['teacher_val_acc'])})")
    n, blocks = r["branches"], r["blocks"]
    if r["form"] == "wide":
        head = (f"no joining (λ = 0): the {blocks}×{n} branched model deploys as an exact wide {blocks}-block ViT "
                "(teacher-sized)")
    else:
        head = f"collapsed {blocks}-block ViT from {blocks}×{n} branches (form {r['form']})"
    err = r["collapse_error_float64"]
    paper = "" if r["paper_formulas_val_acc"] is None else (
        f"; the paper's merge formulas give {_pct(r['paper_formulas_val_acc'])} "
        f"(relative logit error {err['paper']:.2g})")
    return (f"{head}: held-out top-1 {_pct(r['val_acc'])} (branched {_pct(r['branched_val_acc'])}, teacher "
            f"{_pct(r['teacher_val_acc'])}); exact collapse error {err['exact']:.1e} (float64){paper}; "
            f"{r['params'] / 1e3:.0f}k params, {r['macs'] / 1e6:.2f} M MACs "
            f"(branched {r['branched_macs'] / 1e6:.2f} M)")


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


OPTIONS = (
    Option("branches", "n parallel branches per block; must divide the teacher's depth (demo ViT, 6 blocks: 2 -> 3 "
                       "blocks, 3 -> 2 blocks)", type=_positive_int, default=2),
    Option("schedule", "λ(t) joining schedule (App. B.2; default: the profile's, linear); none = no joining (deploys "
                       "the exact wide model), instant = λ = 1 from the start", choices=SCHEDULES),
    Option("diversity", "weight α of the diversity regulariser (§4; default: the profile's, 0.05; 0 = off)",
           type=float),
    Option("rectify", "variance rectification √(1+(n−1)λ²) of the joined scores (§3.3)", type=None, default=True,
           switch=True),
    Option("warmup_steps", "Lambda Warmup Period in optimizer steps (App. B.1; default: the profile's)", type=int),
    Option("epochs", "training epochs (default: enough for the profile's warm-up + adjustment steps)", type=int),
    Option("table5", "a Table 5 ablation run (the profile's shorter ablation budget)", type=None, default=False,
           switch=True),
    Option("baseline", "train the depth baseline instead: the teacher's first L/n blocks, same budget and loss "
                       "(Table 1's DeiT-l rows)", type=None, default=False, switch=True),
    Option("seed", "shuffling seed of the training (default: the profile's, 0); run ids end with -sN for another",
           type=int),
)

register_method(Method(
    "nondeep", "Non-deep ViT: train L/n blocks of n parallel branches joined progressively, collapse exactly into L/n "
               "blocks.", BUDGETS, run_nondeep, teacher="vit", family="ViT", options=OPTIONS,
    paper_title="Non-deep ViT — parallel branches collapsed", paper_ref="papers/002",
    paper={"table5": PAPER_TABLE5, "conventions": CONVENTIONS},
    examples=("workbench run nondeep --branches 2",
              "workbench run nondeep --branches 3 --schedule cosine --diversity 0",
              "workbench run nondeep --branches 3 --baseline",
              "workbench run nondeep --teacher deit_tiny_patch16_224 --checkpoint deit_t.safetensors --data ~/imagenet "
              "--profile paper --branches 2"),
    report=_report,
))
