"""AttentionLite end to end: sparse distillation of a CNN teacher into a self-attention ResNet, as a run.

Kundu & Sundaresan, "AttentionLite: Towards Efficient Self-Attention Models for Vision" (papers/003), on top
of :mod:`methods.attentionlite`. One run (``workbench run attentionlite``) trains one student in a single pass
(§3, Algorithm 1): an SA-ResNet (every k × k convolution a local self-attention layer, Eq. 1) starts from random
weights and a random mask at the target parameter density ``d``, learns from the teacher by Eq. 2 — α·CE +
(1 − α)·ρ²·KL(teacher ‖ student at temperature ρ) (**KD**) plus, with ``--at``, β/2 · Σ_stages AT loss on the
normalised spatial attention maps of every residual stage (**KD+AT**) — and is pruned by sparse momentum
(every epoch but the last: prune the smallest active weights / columns of each layer, regrow by momentum).

- ``--pruning irregular``: single weights; the run saves the masked model (its deploy form is sparse);
- ``--pruning column``: columns of each layer's ``C_out × C_in·k·k`` matrix (§3); the run saves the *shrunk*
  deploy form (``sa_resnet_column``: pruned columns and the channels they free removed), after checking that it
  computes what the masked model computes (max |logit difference| ≤ 1e-4, recorded in the results).

Run ids: ``attentionlite-irregular-d0.25-kdat-cnn-demo`` (``kd`` without AT; ``-<variant>`` for a non-default
student, ``-homog`` for the attention stem, ``-s<seed>`` for a seed other than 0). Per-epoch metrics (held-out
accuracy, loss parts, realised density overall and per layer, prune rate) are in the run's ``metrics.jsonl``;
:func:`training_history` reads them as a Dataset ``(epoch)`` / ``(epoch, layer)``. Budgets per profile:
:data:`BUDGETS`; the run body: :mod:`workbench.pipelines.attentionlite.body`.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace

import numpy as np
import torch
import xarray as xr

from methods.attentionlite import (
    PAPER_TABLE1,
    PAPER_TABLE2,
    SA_VARIANTS,
    SparseDistillationLoss,
    check_density,
    check_pruning,
)
from workbench.models import create_model, read_state_dict
from workbench.pipelines import Method, Option, register_method, run_method
from workbench.pipelines.attentionlite.body import RunSpec, sparse_distill
from workbench.pipelines.attentionlite.budgets import BUDGETS, AttentionLiteBudget
from workbench.pipelines.common import run_tag, student_run, train_record
from workbench.runs import Run, RunError, open_run

__all__ = ["BUDGETS", "AttentionLiteBudget", "run_attentionlite", "run_id", "student_spec", "training_history",
           "load_masks", "masked_model", "DISTILL_LABEL"]

#: ``at`` -> the paper's name of the loss (Figs. 2-3 legends).
DISTILL_LABEL = {False: "KD", True: "KD+AT"}


def parse_density(text: str) -> float:
    """``--density`` as a number in (0, 1] (argparse type: a bad value is a usage error before anything runs)."""
    try:
        return check_density(float(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def run_id(tag: str, pruning: str, density: float, at: bool, *, variant: str, default_variant: str, stem: str,
           seed: int, kd: bool = True) -> str:
    """``attentionlite-irregular-d0.25-kdat-cnn-demo`` (module docstring; ``ce`` for the no-distillation baseline)."""
    parts = ["attentionlite", pruning, f"d{density:g}", ("kdat" if at else "kd") if kd else "ce"]
    if variant != default_variant:
        parts.append(variant)
    if stem == "attention":
        parts.append("homog")
    if seed:
        parts.append(f"s{seed}")
    return "-".join(parts + [tag])


def student_spec(teacher: torch.nn.Module, variant: str, stem: str) -> tuple[str, dict]:
    """The student's timm name and JSON kwargs for ``teacher``: the variant with the teacher's classes and channels.

    Raises:
        ValueError: an unknown variant or stem.
    """
    if variant not in SA_VARIANTS:
        raise ValueError(f"unknown student variant {variant!r}; choose from {', '.join(SA_VARIANTS)}")
    if stem not in ("conv", "attention"):
        raise ValueError(f"--stem must be 'conv' (hybrid) or 'attention' (homogeneous), got {stem!r}")
    v = SA_VARIANTS[variant]
    classes = int(getattr(teacher, "num_classes", 0) or (teacher.pretrained_cfg or {}).get("num_classes") or v.num_classes)
    in_chans = int(tuple((teacher.pretrained_cfg or {}).get("input_size", (v.in_chans,)))[0])
    kwargs = v.kwargs(stem, classes)
    if in_chans != kwargs.get("in_chans", v.in_chans):
        kwargs["in_chans"] = in_chans
    return v.model, kwargs


def _check_teacher(teacher: torch.nn.Module, name: str, kwargs: dict, at: bool, b: AttentionLiteBudget) -> None:
    """Refuse, before anything is written, a teacher whose stages the AT loss cannot pair with the student's.

    ``teacher`` may live on the meta device: the check runs both architectures on a meta image of the teacher's
    input size (shapes only, no arithmetic).
    """
    device = next(teacher.parameters()).device
    with torch.device(device):
        student = create_model(name, **kwargs)
    if not at:
        return
    d = b.distill
    loss = SparseDistillationLoss(teacher, beta=max(d.beta, 1e-12), p=d.p, at_form=d.at_form, resize=d.resize,
                                  student=student)  # raises for missing stages
    if d.resize != "none":
        return
    from methods.hooks import run_with_cache

    x = torch.zeros(1, *tuple((teacher.pretrained_cfg or {}).get("input_size", (1, 28, 28))), device=device)
    with torch.no_grad():
        shapes = [{n: tuple(v.shape[-2:]) for n, v in run_with_cache(m.eval(), x, names=loss.stages, stop_early=True)[1].items()}
                  for m in (teacher, student)]
    bad = [f"{n}: teacher {shapes[0][n]} vs student {shapes[1][n]}" for n in loss.stages if shapes[0][n] != shapes[1][n]]
    if bad:
        raise ValueError(f"the attention-transfer loss compares stage maps pixel by pixel, but the teacher's and the "
                         f"student's differ ({'; '.join(bad)}); use a teacher with the student's stage resolutions "
                         "(e.g. resnet50_cifar for 32×32 images), or --no-at for logit distillation only")


def _run(req, density: float | None = None, pruning: str = "irregular", at: bool = True, variant: str | None = None,
         stem: str | None = None, seed: int = 0, kd: bool = True) -> Run:
    b: AttentionLiteBudget = req.budget
    pruning = check_pruning(pruning)
    density = check_density(b.densities[pruning] if density is None else density)
    variant, stem = variant or b.variant, stem or b.stem
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {seed!r}")
    if not kd and at:
        raise ValueError("--no-kd trains the student on the labels alone, without the teacher: pass --no-at too")
    t = req.teacher
    with torch.device("meta"):  # the architecture only: no weights, no arithmetic
        teacher_arch = create_model(t.model_name, **t.model_kwargs)
    name, kwargs = student_spec(teacher_arch, variant, stem)
    _check_teacher(teacher_arch, name, kwargs, at, b)
    spec = RunSpec(name, kwargs, pruning, density, bool(at), seed, bool(kd))
    cfg = replace(b.train, seed=seed, device=req.device)
    d = asdict(b.distill)
    config = {
        "model_name": name, "model_kwargs": kwargs, "pruning": pruning, "density": density, "at": bool(at), "seed": seed,
        "variant": variant, "stem": stem,
        "distill": {k: d[k] for k in ("alpha", "rho", "p", "at_form", "resize", "kl_scale")} | {"beta": d["beta"] if at else 0.0},
        "sparse": {k: v for k, v in asdict(b.sparse).items() if k not in ("density", "pruning", "seed")},
        "train": train_record(cfg), "train_limit": b.train_limit,
        "lr_milestones": list(b.lr_milestones), "lr_gamma": b.lr_gamma if b.lr_milestones else None,
    }
    if not kd:  # the no-distillation baseline (only then in the config: the distilled runs keep their ids and hashes)
        config["kd"] = False
    rid = run_id(run_tag(req), pruning, density, bool(at), variant=variant, default_variant=b.variant, stem=stem, seed=seed,
                 kd=bool(kd))
    return student_run(req, rid, config, lambda run: sparse_distill(run, req, spec, cfg))


def run_attentionlite(teacher=None, profile: str = "demo", *, device: str = "auto", data: str | None = None,
                      checkpoint: str | None = None, force: bool = False, log=print, **options) -> Run:
    """Train or reuse one AttentionLite run (``workbench run attentionlite``; options: density, pruning, at, variant,
    stem, seed). ``teacher``: a CNN teacher run, ``cnn`` (the demo teacher, trained if missing) or a timm name with
    ``checkpoint``.

    Raises:
        ValueError: a density outside (0, 1], an unknown pruning kind, variant or stem, a teacher without the stage
            outputs (or stage sizes) the AT loss needs — before anything is written.
        RunError: a run of that id exists with another config (pass ``force``).
    """
    return run_method("attentionlite", teacher, profile, teacher_checkpoint=checkpoint, device=device, data=data,
                      force=force, log=log, **options)


# --------------------------------------------------------------------------------------------
# Reading runs
# --------------------------------------------------------------------------------------------


def _open(run: str | Run) -> Run:
    run = run if isinstance(run, Run) else open_run(run)
    if run.config.get("method") != "attentionlite":
        raise RunError(f"run {run.id!r} is not an AttentionLite run (method {run.config.get('method')!r})")
    return run


def training_history(run: str | Run) -> xr.Dataset:
    """A run's per-epoch record as a Dataset.

    Returns:
        ``val_acc``, ``val_loss``, ``train_loss``, ``train_ce``, ``train_kl``, ``train_at`` (AT runs), ``lr``,
        ``density`` (realised, over all pruned layers) and ``prune_rate`` along ``epoch``; ``layer_density(epoch,
        layer)``: the kept fraction of every pruned layer (the masks in force during that epoch, which its held-out
        accuracy was measured with; the update decided at an epoch's end applies from the next epoch), with coords
        ``layer_name`` and ``layer_size`` (weights); attrs: the run id, pruning, density, at, seed.
    """
    run = _open(run)
    rows = run.metrics()
    if not rows:
        raise RunError(f"run {run.id!r} has no recorded epoch yet")
    names = [k.removeprefix("density/") for k in rows[0] if k.startswith("density/")]
    epochs = [int(r["epoch"]) for r in rows]
    data = {}
    for key in ("val_acc", "val_loss", "train_loss", "train_ce", "train_kl", "train_at", "lr", "density", "prune_rate"):
        if any(key in r for r in rows):
            data[key] = ("epoch", np.array([r.get(key, np.nan) for r in rows], dtype=float))
    coords = {"epoch": epochs}
    if names:
        data["layer_density"] = (("epoch", "layer"), np.array([[r[f"density/{n}"] for n in names] for r in rows], dtype=float))
        sizes = {}
        masks_path = run.dir / "masks.safetensors"
        if masks_path.exists():
            sizes = {n: int(m.numel()) for n, m in read_state_dict(masks_path).items()}
        coords.update(layer=np.arange(len(names)), layer_name=("layer", names),
                      layer_size=("layer", [sizes.get(n, -1) for n in names]))
    ds = xr.Dataset(data, coords=coords)
    ds["val_acc"].attrs.update(units="fraction", long_name="held-out top-1 accuracy")
    if "layer_density" in ds:
        ds["layer_density"].attrs.update(units="fraction", long_name="kept fraction of the layer's weights")
    cfg = run.config
    return ds.assign_attrs(run=run.id, pruning=cfg["pruning"], density=cfg["density"], at=int(cfg["at"]), seed=cfg["seed"],
                           distill=DISTILL_LABEL[bool(cfg["at"])] if cfg.get("kd", True) else "none")


def load_masks(run: str | Run) -> dict[str, torch.Tensor]:
    """The run's final weight-shaped bool masks (layer name -> mask); empty for a dense (d = 1) run."""
    run = _open(run)
    path = run.dir / "masks.safetensors"
    return {n: m.bool() for n, m in read_state_dict(path).items()} if path.exists() else {}


def masked_model(run: str | Run) -> torch.nn.Module:
    """The run's trained *train form* (masked SA-ResNet) in eval mode: for a column run, the model before shrinking."""
    from workbench.models import load_weights

    run = _open(run)
    if run.status != "complete":
        raise RunError(f"run {run.id!r} is not complete (status {run.status!r})")
    model = create_model(run.config["model_name"], **run.config["model_kwargs"])
    path = run.dir / "train" / "model.safetensors" if "model" in run.manifest else run.checkpoint
    load_weights(model, read_state_dict(path), what=f"run {run.id!r} masked weights")
    return model.eval()


# --------------------------------------------------------------------------------------------
# Registry entry: workbench run attentionlite
# --------------------------------------------------------------------------------------------


def _report(run: Run) -> str:
    r, c = run.manifest["results"], run.config
    loss = DISTILL_LABEL[bool(c["at"])] if c.get("kd", True) else "no distillation"
    parts = [f"{c['pruning']} d = {c['density']:g}, {loss}: held-out top-1 {100 * r['val_acc']:.2f} %"]
    if r.get("teacher_val_acc") is not None:
        parts[0] += f" (teacher {100 * r['teacher_val_acc']:.2f} %)"
    parts.append(f"realised density {r['realised_density']:.4f}; {r['kept_params']:,} parameters kept of the student's "
                 f"{r['student_params']:,} (teacher {r['teacher_params']:,}: {r['param_reduction']:.2f}× fewer)")
    parts.append(f"MACs per image {r['pruned_macs'] / 1e6:.2f} M ({'shrunk' if c['pruning'] == 'column' else 'non-zero weights'}; "
                 f"dense student {r['student_macs'] / 1e6:.2f} M, teacher {r['teacher_macs'] / 1e6:.2f} M)")
    if "shrunk_vs_masked_max_abs_diff" in r:
        parts.append(f"shrunk model == masked model to {r['shrunk_vs_masked_max_abs_diff']:.1e} (max |logit difference|)")
    return "; ".join(parts)


register_method(Method(
    "attentionlite",
    "AttentionLite: sparse distillation of a CNN teacher into a self-attention ResNet (KD or KD+AT; irregular or column).",
    BUDGETS, _run, teacher="cnn", family="CNN",
    paper_title="AttentionLite — distillation into SA-ResNets", paper_ref="papers/003",
    paper={"table1": PAPER_TABLE1, "table2": PAPER_TABLE2},
    phases=("train",),  # DistillConfig's epochs/batch_size are unused (its docstring): the one training phase is `train`
    options=(
        Option("density", "target parameter density d in (0, 1] (default: the profile's, demo 0.25 irregular / 0.5 column)",
               type=parse_density),
        Option("pruning", "irregular (single weights) or column (columns of C_out × C_in·k·k, shrunk at the end)",
               choices=("irregular", "column"), default="irregular"),
        Option("at", "attention-transfer loss on the stage maps (KD+AT); --no-at: logits only (KD)", type=None,
               default=True, switch=True),
        Option("variant", "student size (default: the profile's: demo, or sa_resnet26 under --profile paper)",
               choices=tuple(SA_VARIANTS)),
        Option("stem", "conv (hybrid, Table 1) or attention (homogeneous, Table 2)", choices=("conv", "attention")),
        Option("seed", "seed of the initialisation, the initial masks and the shuffling", type=int, default=0),
        Option("kd", "distil from the teacher (default); --no-kd (with --no-at): labels alone, the no-distillation "
                     "baseline", type=None, default=True, switch=True),
    ),
    examples=("workbench run attentionlite --density 0.25 --pruning irregular --at",
              "workbench run attentionlite --density 0.5 --pruning column --no-at --seed 1",
              "workbench run attentionlite --teacher resnet50_cifar --checkpoint r50.safetensors --data ~/cifar10 "
              "--profile paper --density 0.1"),
    report=_report,
))
