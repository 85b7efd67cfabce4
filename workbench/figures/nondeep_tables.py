"""Non-deep ViT tables (papers/002): Table 1 (size, MACs, CPU latency; demo accuracy), Table 5 (schedule and
diversity ablation on the demo), Tables 10 / 11 (peak memory) and the collapse-exactness table.

- ``nondeep.table1`` — real size (224², random weights): DeiT-Tiny (12 blocks), the DeiT-6/4/3 depth
  baselines, the exact collapsed 6/4/3-block models, the branched train forms and the paper's "R" form
  counted by hand (:func:`methods.nondeep.paper_r_form_cost`), params and MACs in both conventions and
  single-thread CPU latency (an ``exclusive`` data step: it runs alone, after every other preparation step,
  so no training shares the CPU); then the demo models with their held-out accuracy.
- ``nondeep.table5`` — the seven demo ablation rows (2×3 student, one epoch each), held-out top-1 of the
  deployed model with a 95% Wilson interval, and the difference to "linear + α" with its paired standard
  error (the same 1000 images), beside the paper's CIFAR-10 numbers.
- ``nondeep.table10`` / ``table11`` — peak memory of one training step of the branched models and of one
  inference forward of the collapsed ones, against DeiT-Tiny (:func:`methods.nondeep.peak_memory`).
- ``nondeep.exactness`` — every merge formula's error against the branched model (float64 / float32), per
  demo student and for n = 4, with the LayerNorm factorisations (Eq. 1, Eq. 2).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import xarray as xr

from workbench.figures import dataset, figure
from workbench.figures.context import Context
from workbench.figures.nondeep import PAPER, baselines, students, table5_runs
from workbench.plots.table import Table

BASE = "deit_tiny_patch16_224"


def _budget(ctx: Context):
    from workbench.pipelines import budget

    return budget("nondeep", ctx.profile)


def _dash(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.astype(object)
    return frame.where(frame.notna(), "–")


# ---------------------------------------------------------------------------------------- Table 1
def _real_size(b, log) -> list[dict]:
    import timm
    import torch

    from methods.nondeep import PAPER_TABLE1, PAPER_TABLE6, cost, latencies, paper_r_form_cost
    from methods.train import cpu_threads

    rows, models = [], {}
    with cpu_threads(1):
        torch.manual_seed(0)
        entries = [("DeiT-Tiny (12 blocks)", "DeiT-Tiny", timm.create_model(BASE), "teacher")]
        for n in b.table1_branches:
            d = 12 // n
            entries.append((f"DeiT-{d} (first {d} blocks)", f"DeiT-{d}", timm.create_model(BASE, depth=d), "depth baseline"))
            entries.append((f"collapsed {d} (exact, from {d}×{n})", f"D-MAE-{d}-R",
                            timm.create_model("nondeep_collapsed", base=BASE, branches=n, form="auto"), "collapsed"))
            entries.append((f"branched {d}×{n} (train form)", None, timm.create_model("nondeep_branched", base=BASE, branches=n),
                            "branched"))
        for name, paper, model, kind in entries:
            log(f"  nondeep.table1: counting {name}")
            c = cost(model.eval())
            row = PAPER_TABLE1.get(paper) if paper else None
            if kind == "branched":  # Table 6 Block-1: the branched D-MAE-l-n without re-parameterisation
                d = int(name.split(" ")[1].split("×")[0])
                paper = f"D-MAE-{d}-{12 // d}"
                p6 = PAPER_TABLE6[paper]
            rows.append({"setting": "224², random weights", "model": name, "kind": kind, "params": c.params, "macs": c.macs,
                         "macs_paper": c.macs_paper, "paper_row": paper,
                         "paper_params_m": row.params_m if row else (p6[0] if kind == "branched" else None),
                         "paper_flops_m": row.flops_m if row else (p6[1] if kind == "branched" else None),
                         "paper_cpu_ms": row.cpu_ms if row else None,
                         "head_dim": model.blocks[0].attn.head_dim if kind != "branched" else None})
            if kind != "branched":
                models[name] = model
        for n in b.table1_branches:
            d = 12 // n
            c = paper_r_form_cost(d)
            row = PAPER_TABLE1[f"D-MAE-{d}-R"]
            rows.append({"setting": "224², counted by hand", "model": f"paper's R form {d} (X·W·Xᵀ scores, Eq. 7 V/O)",
                         "kind": "paper R form", "params": c.params, "macs": c.macs, "macs_paper": c.macs_paper,
                         "paper_row": f"D-MAE-{d}-R", "paper_params_m": row.params_m, "paper_flops_m": row.flops_m,
                         "paper_cpu_ms": row.cpu_ms})
        log(f"  nondeep.table1: timing {len(models)} real-size models, {b.table1_repeats} round-robin runs")
        ms = latencies(models, (3, 224, 224), repeats=b.table1_repeats, warmup=b.table1_warmup)
    for r in rows:
        r["ms"] = ms.get(r["model"])
    return rows


def _demo_rows(ctx: Context, b) -> list[dict]:
    from methods.nondeep import cost, latencies
    from methods.train import cpu_threads
    from workbench.models import load_model

    teacher = ctx.teacher("vit")
    runs = [("demo teacher", teacher, "teacher")]
    studs, bases = students(ctx), baselines(ctx)
    for n in b.students:
        runs.append((f"demo depth baseline ({bases[n].manifest['results']['blocks']} blocks)", bases[n], "depth baseline"))
        runs.append((f"demo collapsed {studs[n].manifest['results']['blocks']} (from {6 // n}×{n})", studs[n], "collapsed"))
    models = {name: load_model(run.id).model for name, run, _ in runs}
    with cpu_threads(1):
        ms = latencies(models, tuple(models["demo teacher"].pretrained_cfg.get("input_size", (1, 28, 28))),
                       repeats=max(30, 2 * b.table1_repeats), warmup=max(3, b.table1_warmup))
    rows = []
    for name, run, kind in runs:
        c = cost(models[name])
        res = run.manifest["results"]
        rows.append({"setting": "demo (28², MNIST-5k)", "model": name, "kind": kind, "run": run.id, "params": c.params,
                     "macs": c.macs, "macs_paper": c.macs_paper, "ms": ms[name], "val_acc": res["val_acc"],
                     "paper_formulas_val_acc": res.get("paper_formulas_val_acc"), "val_images": res.get("val_images")})
    return rows


@dataset("nondeep.table1", after=("nondeep.students", "nondeep.baselines"), exclusive=True)
def table1_data(ctx: Context) -> xr.Dataset:
    """Params, MACs (both conventions) and single-thread latency at real size and on the demo, one row per model."""
    import torch

    from methods.nondeep import CONVENTIONS
    from workbench.xrutils import rows_to_dataset

    b = _budget(ctx)
    rows = _real_size(b, ctx.log) + _demo_rows(ctx, b)
    return rows_to_dataset(rows).assign_attrs(repeats=b.table1_repeats, warmup=b.table1_warmup, torch=torch.__version__,
                                              conventions=json.dumps(CONVENTIONS))


def _g(x: float | None, scale: float, nd: int) -> float | None:
    return None if x is None else round(x / scale, nd)


def table1(ds: xr.Dataset) -> Table:
    from workbench.xrutils import dataset_rows

    rows = dataset_rows(ds)
    deit = next(r for r in rows if r["model"].startswith("DeiT-Tiny"))
    demo_t = next(r for r in rows if r["model"] == "demo teacher")
    out = []
    for r in rows:
        base = demo_t if r["setting"].startswith("demo") else deit
        paper_ratio = None if not r.get("paper_cpu_ms") else round(r["paper_cpu_ms"] / 66.1, 2)
        dp = None if not r.get("paper_params_m") else f"{100 * (r['params'] / 1e6 / r['paper_params_m'] - 1):+.1f}%"
        dm = None if not r.get("paper_flops_m") else f"{100 * (r['macs_paper'] / 1e6 / r['paper_flops_m'] - 1):+.1f}%"
        out.append({
            "model": r["model"], "params (M)": _g(r["params"], 1e6, 3), "paper params (M)": r.get("paper_params_m"),
            "Δ params": dp, "MACs (M), all": _g(r["macs"], 1e6, 1), "MACs (M), w/o QKᵀ, AV": _g(r["macs_paper"], 1e6, 1),
            "paper FLOPs (M)": r.get("paper_flops_m"), "Δ MACs": dm,
            "CPU ms (1 thread)": None if r.get("ms") is None else round(r["ms"], 2 if r["ms"] < 10 else 1),
            "latency / teacher": None if r.get("ms") is None else round(r["ms"] / base["ms"], 2),
            "paper latency / DeiT-Tiny": paper_ratio,
            "demo top-1 (%)": None if r.get("val_acc") is None else round(100 * r["val_acc"], 1),
            "demo top-1, paper formulas (%)": None if r.get("paper_formulas_val_acc") is None
            else round(100 * r["paper_formulas_val_acc"], 1)})
    conv = json.loads(ds.attrs["conventions"])
    val = next((int(r["val_images"]) for r in rows if r.get("val_images")), None)
    notes = [
        "Counting: MACs per image (1 multiply-add = 1; the paper's Table 1 'FLOPs' are MACs) by methods.flops.count_macs, "
        "batch 1. 'all' counts everything including the attention matmuls QKᵀ and AV; 'w/o QKᵀ, AV' leaves them out, "
        "the paper's convention for its DeiT rows (DeiT-Tiny: 1.08 G without, 1.25 G with). Params: "
        + conv["params"] + ". The Δ columns compare the 'w/o' count and the params with the paper's row.",
        "The exact collapsed models are wider than the paper's R rows: a collapsed head concatenates the n branches' "
        "q and k (width n·d: 128 for 6 blocks) or, where n·d > D, scores X·(Σ W^Q W^Kᵀ)·Xᵀ with a per-key bias and "
        "values X·Σ W^V W^O (width D = 192: 4 and 3 blocks). The paper's R form (one D×D score matrix per head, "
        "Eq. 7's d-wide V and O) reproduces its R rows' params and MACs but is not exact (nondeep.exactness).",
        f"Latency: PyTorch {ds.attrs['torch']} eager, one thread, batch 1, median of {int(ds.attrs['repeats'])} "
        f"round-robin runs after {int(ds.attrs['warmup'])} (every model timed in turn, so load changes hit all alike), "
        "measured alone after the other preparation steps, random weights at real size. The paper used an Intel "
        "i9-9900X (66.1 ms for DeiT-Tiny): compare the ratios, not the ms. 'latency / teacher' is against DeiT-Tiny "
        "at real size and against the demo teacher for the demo rows.",
        f"Demo rows: held-out top-1 on {val} MNIST-5k images; students joined by the linear schedule (α = 0.05) "
        "and collapsed exactly (the collapsed model's accuracy is the branched model's); 'paper formulas' collapses "
        "the same branched model with Eq. 5–7 as printed; depth baselines are the teacher's first L/n blocks trained "
        "with the same budget and loss (the paper's DeiT-l rows).",
    ]
    title = f"Non-deep ViT Table 1: size, MACs, single-thread CPU latency; demo accuracy (profile {ds.attrs.get('profile')})"
    return Table(_dash(pd.DataFrame(out)), title, notes)


# ---------------------------------------------------------------------------------------- Table 5
@dataset("nondeep.table5", after=("teacher.vit",))
def table5_data(ctx: Context) -> xr.Dataset:
    """The Table 5 runs: held-out top-1 of each deployed model with per-image correctness (for paired statistics)."""
    import torch
    from torch.utils.data import DataLoader

    from methods.nondeep import PAPER_TABLE5
    from workbench.models import load_model
    from workbench.pipelines.teacher import datasets

    b = _budget(ctx)
    rows = table5_runs(ctx)
    _, val = datasets(ctx.profile.name)
    labels = torch.cat([y for _, y in DataLoader(val, batch_size=512)])
    correct, recs = [], []
    for schedule, div, run in rows:
        model = load_model(run.id).model
        with torch.no_grad():
            pred = torch.cat([model(x).argmax(-1) for x, _ in DataLoader(val, batch_size=256)])
        correct.append((pred == labels).numpy())
        r = run.manifest["results"]
        src = run.config["source_run"]
        recs.append({"schedule": schedule, "div": div, "run": run.id, "branched_run": src, "val_acc": r["val_acc"],
                     "branched_val_acc": r["branched_val_acc"], "form": r["form"], "blocks": r["blocks"],
                     "train_cpu_s": r["train_cpu_s"], "paper": PAPER_TABLE5.get((schedule, div), (np.nan,) * 3)})
        if schedule in ("none", "instant") and div:  # the paper has these rows without the regulariser only
            recs[-1]["paper"] = (np.nan,) * 3
    a = b.ablation or b.join
    return xr.Dataset(
        {"val_acc": ("row", [r["val_acc"] for r in recs]), "branched_val_acc": ("row", [r["branched_val_acc"] for r in recs]),
         "correct": (("row", "sample"), np.stack(correct)), "train_cpu_s": ("row", [r["train_cpu_s"] for r in recs]),
         "paper": (("row", "paper_model"), np.array([r["paper"] for r in recs], dtype=float))},
        coords={"row": np.arange(len(recs)), "sample": np.arange(len(labels)),
                "paper_model": ["D-MAE-6-R", "D-MAE-4-R", "D-MAE-3-R"],
                "schedule": ("row", [r["schedule"] for r in recs]), "div": ("row", [r["div"] for r in recs]),
                "run": ("row", [r["run"] for r in recs]), "form": ("row", [r["form"] for r in recs]),
                "blocks": ("row", [r["blocks"] for r in recs])},
        attrs={"budget": json.dumps({"branches": b.ablation_branches, "warmup_steps": a.warmup_steps,
                                     "adjust_steps": a.adjust_steps, "alpha": a.diversity_weight, "lr": a.lr,
                                     "batch": a.batch_size, "kd": a.kd_weight})})


def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return mid - half, mid + half


NAMES = {"none": "no joining (λ = 0)", "instant": "instant joining (λ = 1)", "linear": "linear", "cosine": "cosine",
         "exponential": "exponential", "sqrt": "sqrt"}


def _row(ds: xr.Dataset, schedule: str, div: bool | None = None) -> int | None:
    for i in range(ds.sizes["row"]):
        if ds.schedule.values[i] == schedule and (div is None or bool(ds["div"].values[i]) == div):
            return i
    return None


def _paired(ds: xr.Dataset, i: int, j: int) -> tuple[float, float]:
    """Accuracy difference (points) of row i minus row j on the same images, and its paired standard error."""
    d = ds["correct"].values[i].astype(float) - ds["correct"].values[j].astype(float)
    return 100 * d.mean(), 100 * d.std(ddof=1) / math.sqrt(d.size)


def table5(ds: xr.Dataset) -> Table:
    b = json.loads(ds.attrs["budget"])
    n = ds.sizes["sample"]
    ref = _row(ds, "linear", True)
    rows = []
    for i in range(ds.sizes["row"]):
        s, div = str(ds.schedule.values[i]), bool(ds["div"].values[i])
        c = ds["correct"].values[i]
        lo, hi = _wilson(int(c.sum()), n)
        delta = None if i == ref else "{:+.1f} ± {:.1f}".format(*_paired(ds, i, ref))
        rows.append({"λ schedule": NAMES.get(s, s), "div. reg.": "✓" if div else "✗",
                     "deployed model": f"{int(ds.blocks.values[i])} blocks ({ds.form.values[i]})",
                     "demo top-1 (%)": round(100 * float(c.mean()), 1), "95% CI": f"{100 * lo:.1f}–{100 * hi:.1f}",
                     "Δ vs linear ✓ (points)": delta,
                     **{f"paper {m} (CIFAR-10)": None if np.isnan(v) else v
                        for m, v in zip(ds.paper_model.values, ds["paper"].values[i])}})
    notes = [
        f"demo: the 2×3 student ({b['branches']} branches; the 6-block teacher → 2 blocks), one epoch per row: λ warm-up "
        f"{b['warmup_steps']} steps then {b['adjust_steps']} at λ = 1, batch {b['batch']}, AdamW lr {b['lr']:g}, CE + "
        f"logit distillation (weight {b['kd']:g}), α = {b['alpha']:g} where ✓; the same data order and initialisation "
        "(the teacher's blocks) for every row. Top-1 of the deployed model (the exact collapse; for no joining the exact "
        f"wide model, which keeps the teacher's cost) on the {n} held-out images. Paper: D-MAE on CIFAR-10.",
        "Uncertainty: 95% Wilson interval of each accuracy over the held-out images; Δ is the difference to the linear ✓ "
        "row on the same images ± its paired standard error (sd of the per-image difference / √n). Neither includes "
        "the run-to-run variation of training (seeds), which this budget does not sample "
        "(docs/nondeep-demo-budgets.md measures it for one row).",
    ]
    inst, lin0, lin1 = _row(ds, "instant"), _row(ds, "linear", False), ref
    if inst is not None and lin0 is not None and ref is not None:
        d, se = _paired(ds, inst, lin0)
        ps = ds["paper"].values
        gap = " / ".join(f"{ps[lin0, k] - ps[inst, k]:.1f}" for k in range(ps.shape[1]))
        prog = [i for i in range(ds.sizes["row"]) if ds.schedule.values[i] in ("linear", "cosine", "exponential", "sqrt")
                and bool(ds["div"].values[i])]
        accs = [100 * float(ds["correct"].values[i].mean()) for i in prog]
        dd, dse = _paired(ds, lin1, lin0)
        verdict = "does NOT appear" if abs(d) < 2 * se or d > 0 else "appears"
        notes.append(
            f"The paper's gap {verdict} on the demo: instant joining is {d:+.1f} ± {se:.1f} points against linear (both "
            f"without the regulariser, paired SE), where the paper's instant row loses {gap} points (6-R / 4-R / 3-R); "
            f"the four progressive schedules lie within {max(accs) - min(accs):.1f} points of each other; the regulariser "
            f"changes linear by {dd:+.1f} ± {dse:.1f} points (paper: +0.3 / +0.9 / +0.6). Our students start from the "
            "teacher's trained blocks and distil its logits, so joining all at once costs little here; the paper joins "
            "pre-trained branched models and fine-tunes on CIFAR-10 for 60k steps.")
    nj = _row(ds, "none")
    if nj is not None and ref is not None:
        d, se = _paired(ds, nj, ref)
        notes.append(f"No joining (λ = 0) is {d:+.1f} ± {se:.1f} points against linear ✓, as the paper's first row is its "
                     "best: the branches never share their non-linearities, so it cannot be collapsed into fewer blocks "
                     "(its exact deploy form is a teacher-sized wide model).")
    return Table(_dash(pd.DataFrame(rows)), f"Non-deep ViT Table 5 on the demo (profile {ds.attrs.get('profile')})", notes)


# ---------------------------------------------------------------------------------------- Tables 10 / 11
@dataset("nondeep.memory")
def memory_data(ctx: Context) -> xr.Dataset:
    """Peak memory of one training step (branched forms, DeiT-Tiny) and one inference forward (collapsed forms)."""
    import timm
    import torch

    from methods.nondeep import PAPER_MEMORY_GB, peak_memory
    from methods.train import cpu_threads, resolve_device
    from workbench.xrutils import rows_to_dataset

    b = _budget(ctx)
    dev = resolve_device(ctx.device)
    rows = []

    def add(mode: str, name: str, model, paper: str | None):
        torch.manual_seed(0)
        ctx.log(f"  nondeep.memory: {mode} {name}")
        peak = peak_memory(model.to(dev), b.memory_batch, mode)
        gb = PAPER_MEMORY_GB.get(paper) if paper else None
        rows.append({"mode": mode, "model": name, "bytes": peak, "paper_gb": None if gb is None else gb[0 if mode == "train" else 1],
                     "paper_row": paper})

    with cpu_threads(1):
        add("train", "DeiT-Tiny (12 blocks)", timm.create_model(BASE), "D-MAE-Tiny")
        explicit = timm.create_model(BASE)
        for m in explicit.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = False  # keeps the attention matrices for backward, as the branched blocks must
        add("train", "DeiT-Tiny, explicit attention", explicit, None)
        for n in b.table1_branches:
            add("train", f"branched {12 // n}×{n}", timm.create_model("nondeep_branched", base=BASE, branches=n),
                f"D-MAE-{12 // n}-R")
        add("infer", "DeiT-Tiny (12 blocks)", timm.create_model(BASE), "D-MAE-Tiny")
        for n in b.table1_branches:
            add("infer", f"collapsed {12 // n} (exact)", timm.create_model("nondeep_collapsed", base=BASE, branches=n),
                f"D-MAE-{12 // n}-R")
    return rows_to_dataset(rows).assign_attrs(batch=b.memory_batch, device=str(dev),
                                              measure="torch.cuda.max_memory_allocated" if dev.type == "cuda" else
                                              "live tensor storages (TorchDispatchMode)")


def _memory_table(mode: str):
    def plot(ds: xr.Dataset) -> Table:
        from workbench.xrutils import dataset_rows

        rows = [r for r in dataset_rows(ds) if r["mode"] == mode]
        base = rows[0]
        paper_base = base["paper_gb"]
        out = [{"model": r["model"], "peak memory (MiB)": round(r["bytes"] / 2**20, 1),
                "relative to DeiT-Tiny": round(r["bytes"] / base["bytes"], 2),
                "paper (GB)": r["paper_gb"], "paper relative": None if r["paper_gb"] is None else round(r["paper_gb"] / paper_base, 2)}
               for r in rows]
        what = ("one training step: forward + backward + SGD (momentum 0.9) step, train mode" if mode == "train"
                else "one inference forward, eval mode, no grad")
        notes = [f"{what}; batch {int(ds.attrs['batch'])} at 224², FP32, random weights, on {ds.attrs['device']}; "
                 f"measure: {ds.attrs['measure']} (parameters, inputs, activations, gradients and momentum buffers; no "
                 "allocator slack). Paper: torch.cuda.max_memory_allocated on an H100 at batch 256.",
                 "Training runs the branched (train) forms, as the paper's does (its table lists the collapsed params). "
                 "timm's DeiT-Tiny trains with fused attention, which keeps no T×T matrix for backward on this device; the "
                 "branched blocks must materialise theirs (the joining mixes the scores), so DeiT-Tiny with explicit "
                 "attention is the like-for-like reference." if mode == "train" else
                 "Inference runs the collapsed (deploy) forms: fewer blocks, but the exact collapse's wider heads "
                 "(n·d or D per head) make the attention's intermediate q/k/v larger than DeiT-Tiny's."]
        title = (f"Non-deep ViT Table {10 if mode == 'train' else 11}: peak memory in "
                 f"{'training' if mode == 'train' else 'inference'} (profile {ds.attrs.get('profile')})")
        return Table(_dash(pd.DataFrame(out)), title, notes)

    return plot


# ---------------------------------------------------------------------------------------- exactness
@dataset("nondeep.exactness", after=("nondeep.students",))
def exactness_data(ctx: Context) -> xr.Dataset:
    """Collapse errors of every merge formula per model (float64 / float32) and the LayerNorm factorisations."""
    import timm
    import torch

    from methods.nondeep import COLLAPSE_VARIANTS, branch, collapse_exactness, set_lambda
    from workbench.analysis import get_extractor
    from workbench.data import load_images
    from workbench.models import load_model
    from workbench.pipelines.nondeep import load_branched
    from workbench.xrutils import rows_to_dataset

    b = _budget(ctx)
    rows = []

    def add(label: str, ds: xr.Dataset, top1: bool):
        for v in ds["model"].values:
            e = ds.sel(model=v)
            rows.append({"pitfall": str(v), "equations": str(e["equations"].values), "model": label,
                         "error_float64": float(e["logit_error"].max()), "error_float32": float(e["logit_error_float32"].max()),
                         "block_error_float64": float(e["block_error"].max()),
                         "top1": float(e["correct"].mean()) if top1 and "correct" in e else None,
                         "branched_top1": float(ds["branched_correct"].mean()) if top1 and "branched_correct" in ds
                         else None,
                         "same_prediction": float(e["same_prediction"].mean()), "images": int(ds.sizes["sample"])})

    for n, run in students(ctx).items():
        ds = ctx.analysis("collapse_error", run.config["source_run"], b.eval_images).load()
        add(f"{6 // n}×{n} demo student", ds, True)
    # n = 4 does not divide the demo teacher's 6 blocks: a random 12-block demo-width ViT with every bias and LN
    # affine perturbed, branched into 3 blocks × 4 branches, branches perturbed apart, at λ = 1.
    torch.manual_seed(0)
    big = timm.create_model("vit_demo", depth=12).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in big.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
        four = branch(big, 4).eval()
        for p in four.blocks.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    set_lambda(four, 1.0)
    x = load_images(b.analysis_images, input_size=(1, 28, 28)).tensor[:64]
    add("3×4 random (12-block ViT)", get_extractor("collapse_error")(four, x), False)
    # LayerNorm factorisation (Eq. 1 forward, Eq. 2 backward): a property of the teacher
    teacher = load_model(ctx.teacher("vit").id).model
    ln = [r for r in collapse_exactness(load_branched(next(iter(students(ctx).values()))), x, teacher)
          if r["variant"].startswith("ln_")]
    for r in ln:
        rows.append({"pitfall": r["variant"], "equations": r["equations"], "model": "demo teacher",
                     "error_float64": r["max_rel_error"], "images": int(x.shape[0])})
    descriptions = {k: v.description for k, v in COLLAPSE_VARIANTS.items()}
    descriptions.update({r["variant"]: r["description"] for r in ln})
    return rows_to_dataset(rows).assign_attrs(descriptions=json.dumps(descriptions), eval_images=b.eval_images,
                                              analysis_images=b.analysis_images)


PITFALLS = {
    "exact": ("exact (ours)", "per-head concatenated q/k (or X·ΣW^Q W^Kᵀ·Xᵀ + per-key bias), Σ_b W^V_b W^O_b, scale √n·√d"),
    "paper_vo": ("Eq. 7", "W^V = Σ_b W^V_b, W^O = Σ_b W^O_b: cross terms W^V_b W^O_b′"),
    "paper_scale": ("Eq. 6", "scores / (n·√d) instead of the rectified √n·√d the model trained with"),
    "paper_qk_bias": ("Eq. 5–6", "scores X(Σ_b W_b)Xᵀ: the per-key term of the q/k biases dropped"),
    "paper": ("Eq. 5–7", "all of the paper's formulas at once (Alg. 1 l. 22: W_final = Σ_b W_b)"),
    "ln_forward": ("Eq. 1", "LayerNorm γ, β absorbed forward into qkv and fc1 (what branching uses)"),
    "ln_backward": ("Eq. 2", "LayerNorm γ, β absorbed backward into the previous fc2 / patch embedding"),
}


def exactness(ds: xr.Dataset) -> Table:
    from workbench.xrutils import dataset_rows

    rows = dataset_rows(ds)
    models = list(dict.fromkeys(r["model"] for r in rows if r["model"] != "demo teacher"))
    out = []
    for p, (eq, text) in PITFALLS.items():
        mine = {r["model"]: r for r in rows if r["pitfall"] == p}
        if not mine:
            continue
        rec = {"formula": eq, "what": text}
        for m in models:
            r, short = mine.get(m), m.split(" ")[0]
            rec[f"{short} f64"] = None if r is None else f"{r['error_float64']:.1e}"
            rec[f"{short} f32"] = None if r is None else f"{r['error_float32']:.1e}"
            if any(x.get("top1") is not None for x in rows if x["model"] == m):
                rec[f"{short} top-1 %"] = None if r is None or r.get("top1") is None else round(100 * r["top1"], 1)
                rec[f"{short} same top-1 %"] = None if r is None else round(100 * r["same_prediction"], 1)
        if "demo teacher" in mine:
            rec["teacher f64"] = f"{mine['demo teacher']['error_float64']:.1e}"
        out.append(rec)
    imgs = {r["model"]: int(r["images"]) for r in rows}
    branched = {r["model"]: r.get("branched_top1") for r in rows if r.get("branched_top1") is not None}
    notes = [
        "f64 / f32: max over images of max |collapsed logit − branched logit| / max |branched logit| of that image, both "
        "models in eval mode in float64 / float32 (float64: what remains is the formula, not rounding). Exact means "
        "≤ 1e-10 in float64 (issue 11); float32 leaves ~1e-7 of rounding. top-1: held-out accuracy of the collapsed model "
        "under that formula" + ("" if not branched else " (branched: " + ", ".join(
            f"{m.split(' ')[0]} {100 * v:.1f}%" for m, v in branched.items()) + ")")
        + "; same top-1: share of images whose predicted class the collapse keeps.",
        "Models: " + "; ".join(f"{m} on {imgs[m]} images" for m in models) + ". The demo students are the trained 3×2 "
        "and 2×3 branched models at λ = 1; 3×4 is a random 12-block demo-width ViT (every bias and LayerNorm affine "
        "perturbed) branched into 3 blocks of 4 and perturbed apart (4 does not divide the demo teacher's 6 blocks).",
        "Eq. 1 / Eq. 2 concern the teacher before branching (the reparameterised teacher against itself, on "
        f"{imgs.get('demo teacher', 0)} images): forward absorption is exact; the paper's backward absorption of the MHSA "
        "LayerNorm into the previous block is not, because LayerNorm's normalisation does not commute with the residual "
        "addition.",
    ]
    return Table(_dash(pd.DataFrame(out)), "Non-deep ViT: collapse exactness, the paper's merge formulas against the exact "
                                          f"collapse (profile {ds.attrs.get('profile')})", notes)


# ---------------------------------------------------------------------------------------- figures
figure("nondeep.table1", paper=PAPER, kind="table", data="nondeep.table1", plot=table1,
       caption="Table 1: parameters, MACs (with and without the attention matmuls; the paper counts without) and "
               "single-thread CPU latency of DeiT-Tiny (12 blocks), the DeiT-6/4/3 depth baselines and the exactly "
               "collapsed 6/4/3-block models at 224² (random weights), with the paper's numbers and its hand-counted R "
               "form beside; then the demo teacher, its depth baselines and collapsed students with held-out top-1.")
figure("nondeep.table5", paper=PAPER, kind="table", data="nondeep.table5", plot=table5,
       caption="Table 5: joining schedule and diversity regulariser ablation on the demo (2×3 student, one epoch per "
               "row): held-out top-1 of the deployed model with 95% intervals and paired differences to linear with "
               "the regulariser, beside the paper's CIFAR-10 numbers; the paper's gap between instant and progressive "
               "joining does not appear here.")
figure("nondeep.table10", paper=PAPER, kind="table", data="nondeep.memory", plot=_memory_table("train"),
       caption="Table 10: peak memory of one training step (forward, backward, SGD momentum step) of DeiT-Tiny and of "
               "the branched 6×2 / 4×3 / 3×4 models at 224², measured, relative to DeiT-Tiny, beside the paper's.")
figure("nondeep.table11", paper=PAPER, kind="table", data="nondeep.memory", plot=_memory_table("infer"),
       caption="Table 11: peak memory of one inference forward of DeiT-Tiny and of the exactly collapsed 6 / 4 / 3-block "
               "models at 224², measured, relative to DeiT-Tiny, beside the paper's.")
figure("nondeep.exactness", paper=PAPER, kind="table", data="nondeep.exactness", plot=exactness,
       caption="Collapse exactness: relative logit error of the collapsed model against the branched model at λ = 1 "
               "under the exact collapse and under each of the paper's merge formulas (Eq. 5–7) one at a time and "
               "together, in float64 and float32, for the 3×2 and 2×3 demo students and a random 3×4 model, with "
               "the collapsed models' held-out top-1; and the two LayerNorm factorisations (Eq. 1, Eq. 2).")
