"""Sparsifiner end to end: a learned sparse-attention student of a ViT teacher at a keep rate, as runs.

Wei et al., "Sparsifiner: Learning Sparse Instance-Dependent Attention for Efficient Vision Transformers"
(CVPR 2023, papers/001), on top of :mod:`methods.sparsifiner`. Three kinds of run:

1. **Phase-1 run** (``sparsifiner_phase1-vit-demo``): every attention gains a connectivity predictor
   (§3), the backbone is frozen and only the predictors train on attention distillation (Eq. 10, with
   AdamW weight decay as Eq. 11). The attention stays dense in this phase, so the result does not depend
   on the keep rate: one phase-1 run serves every keep rate. Its model is recorded as the train form at
   keep rate 1 (every key kept: the teacher itself, plus the trained predictors).
2. **Keep-rate run** (``sparsifiner-k0.25-vit-demo``): the phase-1 state in the train form at keep rate K
   (budget B = ⌈K·n⌉ keys per patch query, Eq. 3), then phase 2 — backbone and predictors jointly with
   CE + token distillation (Eq. 8) + KL to the dense teacher (Eq. 9). Its results record the accuracy of
   the untrained predictor, after phase 1 and after phase 2; the deploy form's (sparse path) accuracy; the
   budget as realised on every patch-query row of the held-out set (kept keys per row, min and max); the
   measured sparsity of the basis and coefficients; and the MHSA MACs in the paper's convention
   (:mod:`methods.sparsifiner.flops`) beside what our sparse path executes.
3. **Linformer run** (``sparsifiner_linformer-k0.25-vit-demo``, ``--linformer``): the Table 4 baseline,
   keys and values projected to k = B tokens, trained with the same two phases (E, F alone, then
   everything, both with the phase-2 loss: Linformer has no attention map to distil into a predictor).

``--renormalize`` trains the authors' code's softmax over the kept keys instead of Eq. 4 (run ids get
``-renorm``). ``--seed S`` trains with another seed than the profile's (the predictors' or E, F's initialisation,
shuffling, augmentation; its own phase-1 run too): ids get ``-sS`` before the teacher part. Every phase checkpoints each epoch under its run's phase directory (``phase1/``,
``phase2/``), so an interrupted run resumes where it stopped. Budgets per profile: :data:`BUDGETS`.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from dataclasses import asdict, replace
from typing import Callable

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from methods.devices import exact_float32
from methods.hooks import run_with_cache
from methods.sparsifiner import (
    PAPER_TABLE2,
    PAPER_TABLE4,
    Phase1Loss,
    Phase2Loss,
    SparsifinerConfig,
    check_vit,
    connectivity,
    dense_mhsa_macs,
    executed_mhsa_macs,
    form_kwargs,
    freeze_for_phase1,
    linformer_attentions,
    linformer_mhsa_macs,
    num_tokens,
    replace_attention,
    replace_with_linformer,
    sparse_attentions,
    sparse_basis,
    sparsifiner_mhsa_macs,
    sparsity,
    to_sparse_path,
    unfreeze_all,
)
from methods.sparsifiner import budget as attention_budget
from workbench.models import create_model, load_model, load_weights, read_state_dict
from workbench.pipelines import Method, Option, RunRequest, budget, register_method, run_method
from workbench.pipelines.common import (
    model_counts,
    opening,
    phase_logger,
    run_tag,
    student_run,
    train_record,
)
from workbench.pipelines.sparsifiner.budgets import BUDGETS, SparsifinerBudget
from workbench.runs import Run, open_run
from workbench.runtime import atomic_save_safetensors, evaluate, fit, is_main

__all__ = ["BUDGETS", "SparsifinerBudget", "run_sparsifiner", "run_sweep", "run_id", "parse_keep_rate", "deploy_model"]


# --------------------------------------------------------------------------------------------
# Run ids and options
# --------------------------------------------------------------------------------------------


def parse_keep_rate(text: str) -> float:
    """``--keep-rate`` as a number in (0, 1] (argparse type: a bad value fails before any teacher is trained)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--keep-rate must be a number in (0, 1], got {text!r}") from None
    try:
        attention_budget(value, 1)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def run_id(tag: str, kind: str, keep_rate: float | None = None, renormalize: bool = False, seed: int | None = None) -> str:
    """``sparsifiner_phase1-vit-demo``, ``sparsifiner-k0.25-vit-demo``, ``sparsifiner_linformer-k0.25-vit-demo``
    (``-renorm`` after the keep rate for the authors' renormalised softmax, ``-s<seed>`` for a seed other than the
    profile's)."""
    prefix = {"phase1": "sparsifiner_phase1", "keep": "sparsifiner", "linformer": "sparsifiner_linformer"}[kind]
    parts = [prefix] + ([f"k{keep_rate:g}"] if keep_rate is not None else []) + (["renorm"] if renormalize else [])
    parts += [f"s{seed}"] if seed is not None else []
    return "-".join(parts + [tag])


def _check_keep_rate(keep_rate) -> float:
    if isinstance(keep_rate, bool) or not isinstance(keep_rate, (int, float)):
        raise ValueError(f"--keep-rate must be a number in (0, 1], got {keep_rate!r}")
    attention_budget(keep_rate, 1)  # "keep_rate must be a number in (0, 1] ..."
    return float(keep_rate)


def deploy_model(run: str | Run, device: str = "cpu") -> nn.Module:
    """A keep-rate run's model in its deploy form (``sparsifiner_vit_sparse``: only the kept pairs are computed)."""
    ref = str(run.dir) if isinstance(run, Run) else run
    return to_sparse_path(load_model(ref, device=device).model)


# --------------------------------------------------------------------------------------------
# Measurements of a trained student
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def _budget_check(model: nn.Module, loader: DataLoader, dev: torch.device) -> dict:
    """Keys kept by every patch-query row of every layer and head over the held-out set (Eq. 3: at most B; exactly B
    with ``discard_zeros=False``)."""
    found = sparse_attentions(model)
    prefix = found[0][1].num_prefix_tokens
    names = [f"blocks.{i}.attn.hook_mask" for i, _ in found]
    lo, hi, rows, kept_sum, tokens = None, None, 0, 0, found[0][1].num_tokens
    cls_kept = 0
    for images, _ in loader:
        _, cache = run_with_cache(model.eval(), images.to(dev), names=names)
        for name in names:
            mask = cache[name]  # (B, H, T, T) bool
            kept = mask[:, :, prefix:].sum(-1)  # (B, H, T-P): keys kept per patch query
            lo = int(kept.min()) if lo is None else min(lo, int(kept.min()))
            hi = int(kept.max()) if hi is None else max(hi, int(kept.max()))
            rows += kept.numel()
            kept_sum += int(kept.sum())
            cls_kept += int(mask[:, :, prefix:, :prefix].any(-1).sum())
    return {"kept_min": lo, "kept_max": hi, "rows_checked": rows, "realised_keep_rate": kept_sum / rows / tokens,
            "cls_key_kept_share": cls_kept / rows}


@torch.no_grad()
def _deploy_check(student: nn.Module, loader: DataLoader, dev: torch.device) -> dict:
    """The deploy form (sparse path) on the held-out set: accuracy, max |logit difference|, changed predictions."""
    deploy = to_sparse_path(copy.deepcopy(student).eval())
    correct = changed = n = 0
    gap = 0.0
    for images, targets in loader:
        images, targets = images.to(dev), targets.to(dev)
        with exact_float32():  # the gap of the two forms, not of TF32 rounding on a GPU
            a, b = student.eval()(images), deploy(images)
        gap = max(gap, (a - b).abs().max().item())
        correct += int((b.argmax(-1) == targets).sum())
        changed += int((a.argmax(-1) != b.argmax(-1)).sum())
        n += len(targets)
    return {"deploy_val_acc": correct / n, "deploy_max_abs_logit_diff": gap, "deploy_changed_predictions": changed}


@torch.no_grad()
def _mhsa(student: nn.Module, images: torch.Tensor) -> dict:
    """Sparsity of basis and coefficients on ``images`` and MHSA MACs per image, per convention (module docstring)."""
    found = sparse_attentions(student)
    attn = found[0][1]
    t, p, d, h = attn.num_tokens, attn.num_prefix_tokens, attn.attn_dim, attn.num_heads
    keep = attn.keep / t
    vals = connectivity(student.eval(), images, full=False)
    sp = sparsity(vals, sparse_basis(student), prefix=p)
    rho = _rounded(sp["up_density"])
    r = attn.predictor.n_down

    def total(renormalize: bool, density) -> int:
        return int(sum(sparsifiner_mhsa_macs(t, d, h, keep, r, prefix=p, renormalize=renormalize, up_density=u)["total"]
                       for u in density))

    deploy = to_sparse_path(copy.deepcopy(student))
    return {"mhsa_macs": total(True, rho), "mhsa_macs_eq4": total(False, rho),
            "mhsa_macs_executed": int(sum(executed_mhsa_macs(a) for _, a in sparse_attentions(deploy))),
            "mhsa_macs_dense": len(found) * dense_mhsa_macs(t, d), "up_density": _rounded(rho),
            "coef_sparsity": _rounded(sp["coef"]), "basis_sparsity": _rounded(sp["basis"]),
            "mask_sparsity": _rounded(sp["mask"])}


def _rounded(values) -> list[float]:
    """Per-layer shares for a manifest (4 decimals: float32 noise out of the JSON)."""
    return [round(float(v), 4) for v in values]


def _teacher_acc(req: RunRequest) -> float | None:
    t = req.teacher
    return open_run(t.run).manifest.get("results", {}).get("val_acc") if t.run else None


# --------------------------------------------------------------------------------------------
# Run bodies
# --------------------------------------------------------------------------------------------


def _phase1_body(req: RunRequest, cfg: SparsifinerConfig) -> Callable[[Run], dict]:
    b: SparsifinerBudget = req.budget

    def body(run: Run) -> dict:
        with opening(req, b.cpu_threads) as start:
            teacher, train_set, val_set, dev = start.teacher, start.train_set, start.val_set, start.device
            torch.manual_seed(b.seed)  # the predictors' initialisation (the keep-rate runs redo it for "untrained")
            student = freeze_for_phase1(replace_attention(teacher, cfg))
            loss = Phase1Loss(b.phase1.attn_weight, b.phase1.spa_weight, b.phase1.recon)
            hist = fit(student, train_set, None, b.train_config(b.phase1, req.device), loss_fn=loss,
                       ckpt_dir=run.phase_dir("phase1"), on_epoch_end=phase_logger(run, "phase1", 0))
            if is_main():
                atomic_save_safetensors(student.state_dict(), run.checkpoint)
            images = next(iter(DataLoader(val_set, batch_size=256)))[0].to(dev)
            sp = sparsity(connectivity(student.eval(), images, full=False), sparse_basis(student),
                          prefix=sparse_attentions(student)[0][1].num_prefix_tokens)
        return {"attn_loss": hist[-1]["train_attn"], "epochs": len(hist), "train_images": len(train_set),
                "coef_sparsity": _rounded(sp["coef"]), "basis_sparsity": _rounded(sp["basis"])}

    return body


def _keep_body(req: RunRequest, cfg: SparsifinerConfig, kwargs: dict, phase1: Run) -> Callable[[Run], dict]:
    b: SparsifinerBudget = req.budget

    def body(run: Run) -> dict:
        with opening(req, b.cpu_threads) as start:
            teacher, train_set, val_set, dev = start.teacher, start.train_set, start.val_set, start.device
            loader = DataLoader(val_set, batch_size=256)
            torch.manual_seed(b.seed)  # the phase-1 run's starting point: the predictors as initialised
            init_acc = evaluate(replace_attention(teacher, cfg), loader, dev)["val_acc"]
            student = create_model("sparsifiner_vit", **kwargs)
            load_weights(student, read_state_dict(phase1.checkpoint), what=f"phase-1 run {phase1.id!r} checkpoint")
            student.to(dev)
            phase1_acc = evaluate(student, loader, dev)["val_acc"]
            unfreeze_all(student)
            p2 = b.phase2
            loss = Phase2Loss(teacher, p2.token_weight, p2.cls_weight, p2.attn_weight, p2.kl_direction)
            hist = fit(student, train_set, val_set, b.train_config(p2, req.device), loss_fn=loss,
                       ckpt_dir=run.phase_dir("phase2"), on_epoch_end=phase_logger(run, "phase2", 0))
            if is_main():
                atomic_save_safetensors(student.state_dict(), run.checkpoint)
            student.eval()
            t, p = num_tokens(student)
            images = next(iter(loader))[0].to(dev)
            out = {"val_acc": hist[-1]["val_acc"], "phase1_val_acc": phase1_acc, "init_val_acc": init_acc,
                   "teacher_val_acc": _teacher_acc(req), "keep_rate": cfg.keep_rate,
                   "budget": attention_budget(cfg.keep_rate, t), "tokens": t, "prefix_tokens": p,
                   "n_down": cfg.n_down, "renormalize": cfg.renormalize,
                   **_budget_check(student, loader, dev), **_mhsa(student, images)}
            if b.deploy_check:
                out.update(_deploy_check(student, loader, dev))
            out.update(model_counts(to_sparse_path(copy.deepcopy(student))))
        return {**out, "epochs": len(hist), "train_images": len(train_set), "val_images": len(val_set)}

    return body


def _linformer_body(req: RunRequest, keep_rate: float) -> Callable[[Run], dict]:
    b: SparsifinerBudget = req.budget

    def body(run: Run) -> dict:
        with opening(req, b.cpu_threads) as start:
            teacher, train_set, val_set = start.teacher, start.train_set, start.val_set
            p2 = b.phase2
            loss = Phase2Loss(teacher, p2.token_weight, p2.cls_weight, 0.0, p2.kl_direction)
            torch.manual_seed(b.seed)  # E and F
            lin = freeze_for_phase1(replace_with_linformer(teacher, keep_rate))  # E, F alone first
            h1 = fit(lin, train_set, val_set, b.train_config(b.phase1, req.device), loss_fn=loss,
                     ckpt_dir=run.phase_dir("phase1"), on_epoch_end=phase_logger(run, "phase1", 0))
            unfreeze_all(lin)
            h2 = fit(lin, train_set, val_set, b.train_config(p2, req.device), loss_fn=loss,
                     ckpt_dir=run.phase_dir("phase2"), on_epoch_end=phase_logger(run, "phase2", b.phase1.epochs))
            if is_main():
                atomic_save_safetensors(lin.state_dict(), run.checkpoint)
            found = linformer_attentions(lin)
            t, k, d = found[0][1].num_tokens, found[0][1].k, found[0][1].attn_dim
            counts = model_counts(lin)
        return {"val_acc": h2[-1]["val_acc"], "phase1_val_acc": h1[-1]["val_acc"], "teacher_val_acc": _teacher_acc(req),
                "keep_rate": keep_rate, "k": k, "tokens": t,
                "mhsa_macs": len(found) * linformer_mhsa_macs(t, d, k)["total"],
                "mhsa_macs_dense": len(found) * dense_mhsa_macs(t, d), **counts,
                "epochs": len(h1) + len(h2), "train_images": len(train_set), "val_images": len(val_set)}

    return body


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


def _method_config(b: SparsifinerBudget, **changes) -> SparsifinerConfig:
    return replace(b.method, **changes)


def _seed_tag(req: RunRequest) -> int | None:
    """The run ids' seed part: the request budget's seed where it is not the profile's (:func:`_run`'s ``seed``)."""
    b: SparsifinerBudget = req.budget
    return b.seed if b.seed != BUDGETS.get(req.profile.name, b).seed else None


def _phase1_run(req: RunRequest) -> Run:
    b: SparsifinerBudget = req.budget
    cfg = _method_config(b, keep_rate=1.0, renormalize=False)  # phase 1: dense attention, no keep rate
    kwargs = form_kwargs(req.teacher.model_name, cfg, req.teacher.model_kwargs)
    config = {"model_name": "sparsifiner_vit", "model_kwargs": kwargs,
              "predictor": {k: v for k, v in cfg.to_kwargs().items() if k not in ("keep_rate", "renormalize")},
              "phase1": asdict(b.phase1), "train": train_record(b.train_config(b.phase1))}
    return student_run(req, run_id(run_tag(req), "phase1", seed=_seed_tag(req)), config, _phase1_body(req, cfg))


def _run(req: RunRequest, keep_rate: float, linformer: bool = False, renormalize: bool | None = None,
         seed: int | None = None) -> Run:
    keep_rate = _check_keep_rate(keep_rate)
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"--seed must be a non-negative integer, got {seed!r}")
        req = dataclasses.replace(req, budget=replace(req.budget, seed=seed))  # the same config and id at the profile's
    b: SparsifinerBudget = req.budget
    req.profile.require_data(req.data)
    arch = create_model(req.teacher.model_name, **req.teacher.model_kwargs)
    check_vit(arch)  # a clear error for a Swin, a CNN, ... before any run directory exists
    tokens, _ = num_tokens(arch)
    if linformer:
        if renormalize:
            raise ValueError("--renormalize applies to Sparsifiner's sparse attention, not to the Linformer baseline")
        kwargs = {"base": req.teacher.model_name, "base_kwargs": dict(req.teacher.model_kwargs), "keep_rate": keep_rate}
        config = {"model_name": "linformer_vit", "model_kwargs": kwargs, "k": attention_budget(keep_rate, tokens),
                  "phase1": {**asdict(b.phase1), "trains": "E, F", "loss": "phase2"}, "phase2": asdict(b.phase2),
                  "train": {"phase1": train_record(b.train_config(b.phase1)),
                            "phase2": train_record(b.train_config(b.phase2))}}
        return student_run(req, run_id(run_tag(req), "linformer", keep_rate, seed=_seed_tag(req)), config,
                           _linformer_body(req, keep_rate))
    renorm = b.method.renormalize if renormalize is None else bool(renormalize)
    phase1 = _phase1_run(req)
    cfg = _method_config(b, keep_rate=keep_rate, renormalize=renorm)
    kwargs = form_kwargs(req.teacher.model_name, cfg, req.teacher.model_kwargs)
    config = {"model_name": "sparsifiner_vit", "model_kwargs": kwargs, "budget_b": attention_budget(keep_rate, tokens),
              "phase1_run": phase1.id, "phase1_checkpoint_sha256": phase1.manifest.get("checkpoint_sha256"),
              "phase2": asdict(b.phase2), "train": train_record(b.train_config(b.phase2)),
              "deploy_check": b.deploy_check}
    rid = run_id(run_tag(req), "keep", keep_rate, renorm, seed=_seed_tag(req))
    return student_run(req, rid, config, _keep_body(req, cfg, kwargs, phase1))


def run_sparsifiner(
    teacher: str | Run | None = None,
    keep_rate: float = 0.25,
    profile: str = "demo",
    *,
    linformer: bool = False,
    renormalize: bool | None = None,
    checkpoint: str | None = None,
    data: str | None = None,
    force: bool = False,
    device: str = "auto",
    log: Callable[[str], None] = print,
) -> Run:
    """Train (or reuse, or resume) a Sparsifiner student of ``teacher`` at ``keep_rate`` (or its Linformer baseline).

    Args:
        teacher: a ViT teacher run (id, directory or Run), a demo arch (``vit``, trained if missing; the default),
            or a timm ViT name with ``checkpoint``.
        keep_rate: attention keep rate in (0, 1]; budget B = ⌈keep_rate · n⌉ keys per patch query.
        profile: ``demo``, ``smoke`` or ``paper`` (budgets: :data:`BUDGETS`).
        linformer: train the Linformer baseline at k = B instead (Table 4).
        renormalize: softmax over the kept keys (the authors' code) instead of Eq. 4; None: the profile's (Eq. 4).
        checkpoint: teacher weights for a timm-name teacher.
        data: ImageFolder root with ``train/`` and ``val/`` (required by ``paper``).
        force: redo the method's runs (phase 1 included) even if complete; the teacher is reused.
        device: ``auto``, ``cpu`` or ``cuda``.
        log: one-line status messages.

    Returns:
        The keep-rate (or Linformer) run; its config names the phase-1 run it started from.

    Raises:
        ValueError: a keep rate outside (0, 1], a teacher that is not a timm ViT, an unknown profile, the paper
            profile without data (all before any run directory is written).
        RunError: a run of that id exists with another config (pass ``force``).
    """
    _check_keep_rate(keep_rate)  # before a demo teacher would be trained
    return run_method("sparsifiner", teacher, profile, teacher_checkpoint=checkpoint, device=device, data=data,
                      force=force, log=log, keep_rate=keep_rate, linformer=linformer, renormalize=renormalize)


def run_sweep(teacher: str | Run | None = None, profile: str = "demo", keep_rates=None, *, device: str = "auto",
              log: Callable[[str], None] = print, **options) -> dict[float, Run]:
    """One keep-rate run per keep rate (default: the profile's), all from the same phase-1 run."""
    rates = budget("sparsifiner", profile).keep_rates if keep_rates is None else keep_rates
    return {float(k): run_sparsifiner(teacher, k, profile, device=device, log=log, **options) for k in rates}


# --------------------------------------------------------------------------------------------
# CLI: workbench run sparsifiner
# --------------------------------------------------------------------------------------------


def _report(run: Run) -> str:
    res = run.manifest["results"]
    teacher = f" (teacher {100 * res['teacher_val_acc']:.1f}%)" if res.get("teacher_val_acc") is not None else ""
    if run.config.get("model_name") == "linformer_vit":
        return (f"Linformer baseline, k = {res['k']} of {res['tokens']} tokens: held-out top-1 "
                f"{100 * res['val_acc']:.1f}%{teacher}; MHSA {res['mhsa_macs'] / 1e6:.3g}M MACs "
                f"(dense {res['mhsa_macs_dense'] / 1e6:.3g}M)")
    exact = ("met exactly" if res["kept_min"] == res["kept_max"] == res["budget"] else
             "never exceeded (zero-score keys discarded, §3)" if res["kept_max"] <= res["budget"] else "NOT met")
    deploy = (f"; deploy form (sparse path) {100 * res['deploy_val_acc']:.1f}%" if "deploy_val_acc" in res else "")
    return (f"keep rate {res['keep_rate']:g}: B = {res['budget']} of {res['tokens']} keys per patch query, {exact} on "
            f"{res['rows_checked']} held-out query rows (kept {res['kept_min']}..{res['kept_max']}); held-out top-1 "
            f"{100 * res['val_acc']:.1f}%{teacher}, after phase 1 only {100 * res['phase1_val_acc']:.1f}%, untrained "
            f"predictor {100 * res['init_val_acc']:.1f}%{deploy}; MHSA {res['mhsa_macs'] / 1e6:.3g}M MACs in the "
            f"paper's convention (dense {res['mhsa_macs_dense'] / 1e6:.3g}M; executed by our sparse path "
            f"{res['mhsa_macs_executed'] / 1e6:.3g}M)" + "".join("\n  note: " + n for n in _notes(run)))


def _notes(run: Run) -> list[str]:
    """What a summary's degenerate values mean (a phase 1 too short for the predictor, a CLS key never chosen)."""
    res, notes = run.manifest["results"], []
    coef = list(res.get("coef_sparsity") or [])
    empty = [i for i, c in enumerate(coef) if c >= 1.0]
    tau = (run.config.get("model_kwargs") or {}).get("tau", (run.config.get("predictor") or {}).get("tau"))
    if empty:
        notes.append(
            f"coef_sparsity 1.0 in layer(s) {', '.join(map(str, empty))}: every coefficient of the low-rank attention "
            f"Ã_down is below τ{f' = {tau:g}' if tau is not None else ''} (Eq. 2), so the approximate connectivity "
            "there is empty and up_density (the share of the sparse up-projection actually computed) is 0 for the same "
            "reason. A predictor still near its initialisation does this: its softmax over n_down is about uniform, "
            "1/n_down, below τ when n_down > 1/τ (the paper's 32 > 1/0.05). The top-k then ranks keys by ties, not by a "
            "learned connectivity; train phase 1 longer (--epochs phase1=N, the paper: 5 epochs on ImageNet).")
    if res.get("cls_key_kept_share") == 0:
        notes.append("cls_key_kept_share 0: no patch query kept the CLS key among its B (the share of patch-query rows "
                     "whose kept keys include a prefix token); the patch tokens still reach CLS through CLS's own row.")
    return notes


register_method(Method(
    "sparsifiner", "Sparsifiner: learned instance-dependent sparse attention of a ViT teacher at a keep rate "
    "(or its Linformer baseline).", BUDGETS, _run, teacher="vit", family="ViT",
    paper_title="Sparsifiner — instance-dependent sparse attention", paper_ref="papers/001",
    paper={"table2": PAPER_TABLE2, "table4": PAPER_TABLE4},
    options=(Option("keep_rate", "attention keep rate in (0, 1]: B = ceil(keep_rate * tokens) keys per patch query",
                    type=parse_keep_rate, required=True),
             Option("linformer", "train the Linformer baseline at k = B instead (Table 4)", type=None, default=False,
                    switch=True),
             Option("renormalize", "softmax over the kept keys (the authors' code) instead of Eq. 4", type=None,
                    default=None, switch=True),
             Option("seed", "training seed (default: the profile's, 0): initialisation of the predictors (E, F), "
                            "shuffling; another seed trains its own phase-1 run", type=int)),
    examples=("workbench run sparsifiner --keep-rate 0.25",
              "workbench run sparsifiner --keep-rate 0.25 --linformer",
              "workbench run sparsifiner --teacher deit_small_patch16_224 --checkpoint deit_s.safetensors "
              "--data ~/imagenet --profile paper --keep-rate 0.1"),
    report=_report,
))
