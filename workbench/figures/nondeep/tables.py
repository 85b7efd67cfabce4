"""Non-deep ViT tables on the demo (papers/002): Table 5 (schedule and diversity ablation) and the
collapse-exactness table (the paper's merge formulas against the exact collapse).

- ``nondeep.table5`` — the five demo ablation rows (2×3 student, one epoch of 2000 images each), held-out top-1 of the
  deployed model with a 95% Wilson interval, and the difference to "linear + α" with its paired standard
  error (the same 1000 images), beside the paper's CIFAR-10 numbers.
- ``nondeep.exactness`` — every merge formula's error against the branched model (float64 / float32), per
  demo student and for n = 4, with the LayerNorm factorisations (Eq. 1, Eq. 2).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import xarray as xr

from workbench.figures import Finding, dataset, figure
from workbench.figures.context import Context
from workbench.figures.nondeep.findings import exactness_verdict, table5_verdict
from workbench.figures.nondeep.items import PAPER, dashed, nondeep_budget, students, table5_runs
from workbench.plots.table import Table
from workbench.stats import wilson_interval


# ---------------------------------------------------------------------------------------- Table 5
@dataset("nondeep.table5", after=("teacher.vit",))
def table5_data(ctx: Context) -> xr.Dataset:
    """The Table 5 runs: held-out top-1 of each deployed model with per-image correctness (for paired statistics)."""
    import torch
    from torch.utils.data import DataLoader

    PAPER_TABLE5 = ctx.paper("nondeep")["table5"]  # noqa: N806 (methods.nondeep.PAPER_TABLE5)
    b = nondeep_budget(ctx)
    rows = table5_runs(ctx)
    val = ctx.heldout()
    labels = torch.cat([y for _, y in DataLoader(val, batch_size=512)])
    correct, recs = [], []
    for schedule, div, run in rows:
        model = ctx.model(run, device=ctx.device)  # on the figures' --device, as the run was evaluated
        with torch.no_grad():
            pred = torch.cat([model(x.to(ctx.device)).argmax(-1).cpu() for x, _ in DataLoader(val, batch_size=256)])
        correct.append((pred == labels).cpu().numpy())
        r = run.manifest["results"]
        src = run.config["source_run"]
        recs.append({"schedule": schedule, "div": div, "run": run.id, "branched_run": src, "val_acc": r["val_acc"],
                     "branched_val_acc": r["branched_val_acc"], "form": r["form"], "blocks": r["blocks"],
                     "train_cpu_s": r["train_cpu_s"], "train_wall_s": r.get("train_wall_s") or float("nan"), "paper": PAPER_TABLE5.get((schedule, div), (np.nan,) * 3)})
        if schedule in ("none", "instant") and div:  # the paper has these rows without the regulariser only
            recs[-1]["paper"] = (np.nan,) * 3
    a = b.ablation or b.join
    return xr.Dataset(
        {"val_acc": ("row", [r["val_acc"] for r in recs]),
         "branched_val_acc": ("row", [r["branched_val_acc"] for r in recs]),
         "correct": (("row", "sample"), np.stack(correct)), "train_cpu_s": ("row", [r["train_cpu_s"] for r in recs]),
         "train_wall_s": ("row", [r["train_wall_s"] for r in recs]),
         "paper": (("row", "paper_model"), np.array([r["paper"] for r in recs], dtype=float))},
        coords={"row": np.arange(len(recs)), "sample": np.arange(len(labels)),
                "paper_model": ["D-MAE-6-R", "D-MAE-4-R", "D-MAE-3-R"],
                "schedule": ("row", [r["schedule"] for r in recs]), "div": ("row", [r["div"] for r in recs]),
                "run": ("row", [r["run"] for r in recs]), "form": ("row", [r["form"] for r in recs]),
                "blocks": ("row", [r["blocks"] for r in recs])},
        attrs={"budget": json.dumps({"branches": b.ablation_branches, "train_images": b.ablation_train_images,
                                     "warmup_steps": a.warmup_steps,
                                     "adjust_steps": a.adjust_steps, "alpha": a.diversity_weight, "lr": a.lr,
                                     "batch": a.batch_size, "kd": a.kd_weight})})


@dataset("nondeep.table5_seeds", after=("teacher.vit",))
def table5_seeds_data(ctx: Context) -> xr.Dataset:
    """Per-seed held-out correctness ``correct(arm, seed, sample)`` of every Table 5 row (``arm``: ``linear+div``,
    ``instant``, ...; coords ``schedule``, ``div``) on the budget's ``ablation_seeds`` (:mod:`workbench.figures.seeds`):
    the other seeds train first, the first seed (``nondeep.table5``'s runs, trained meanwhile) is reused last."""
    from workbench.figures.seeds import correctness_by_seed

    b = nondeep_budget(ctx)
    alpha = (b.ablation or b.join).diversity_weight
    teacher = ctx.teacher("vit")
    seeds = list(b.ablation_seeds[1:]) + list(b.ablation_seeds[:1])
    runs = {(f"{s}{'+div' if div else ''}", k): ctx.run("nondeep", teacher.id, branches=b.ablation_branches, schedule=s,
                                                         diversity=alpha if div else 0.0, table5=True, seed=k)
            for k in seeds for s, div in b.ablation_rows}
    ds = correctness_by_seed(ctx, runs)
    return ds.assign_coords(schedule=("arm", [s for s, _ in b.ablation_rows]),
                            div=("arm", [bool(d) for _, d in b.ablation_rows]))


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


def table5(ds: xr.Dataset, seeds: xr.Dataset | None = None) -> Table:
    b = json.loads(ds.attrs["budget"])
    by_seed = None if seeds is None else 100 * seeds["correct"].mean("sample")  # (arm, seed), NaN: not run
    n = ds.sizes["sample"]
    ref = _row(ds, "linear", True)
    rows = []
    for i in range(ds.sizes["row"]):
        s, div = str(ds.schedule.values[i]), bool(ds["div"].values[i])
        c = ds["correct"].values[i]
        lo, hi = wilson_interval(float(c.mean()), n)
        delta = None if i == ref else "{:+.1f} ± {:.1f}".format(*_paired(ds, i, ref))
        rows.append({"λ schedule": NAMES.get(s, s), "div. reg.": "✓" if div else "✗",
                     "deployed model": f"{int(ds.blocks.values[i])} blocks ({ds.form.values[i]})",
                     "demo top-1 (%)": round(100 * float(c.mean()), 1), "95% CI": f"{100 * lo:.1f}–{100 * hi:.1f}",
                     "Δ vs linear ✓ (points)": delta,
                     **({} if by_seed is None else {
                         f"mean of {seeds.sizes['seed']} seeds (%)": round(float(by_seed.sel(
                             arm=f"{s}{'+div' if div else ''}").mean(skipna=True)), 1)}),
                     **{f"paper {m} (CIFAR-10)": None if np.isnan(v) else v
                        for m, v in zip(ds.paper_model.values, ds["paper"].values[i])}})
    notes = [
        f"demo: the 2×3 student ({b['branches']} branches; the 6-block teacher → 2 blocks), one epoch per row"
        + (f" of {b['train_images']} training images (class-balanced)" if b.get("train_images") else "") + ": λ warm-up "
        f"{b['warmup_steps']} steps then {b['adjust_steps']} at λ = 1, batch {b['batch']}, AdamW lr {b['lr']:g}, CE + "
        f"logit distillation (weight {b['kd']:g}), α = {b['alpha']:g} where ✓; the same data order and initialisation "
        "(the teacher's blocks) for every row. Top-1 of the deployed model (the exact collapse; for no joining the "
        "exact "
        f"wide model, which keeps the teacher's cost) on the {n} held-out images. Paper: D-MAE on CIFAR-10.",
        "Uncertainty: 95% Wilson interval of each accuracy over the held-out images; Δ is the difference to the "
        "linear ✓ "
        "row on the same images ± its paired standard error (sd of the per-image difference / √n). Neither includes "
        "the run-to-run variation of training (seeds): every row is also trained on the budget's other shuffling seeds "
        "(their mean: the seeds column), and the verdict's interval for linear − instant spans seeds and images.",
    ]
    inst, lin0, lin1 = _row(ds, "instant"), _row(ds, "linear", False), ref
    if inst is not None and lin0 is not None and ref is not None:
        d, se = _paired(ds, inst, lin0)
        ps = ds["paper"].values
        gap = " / ".join(f"{ps[lin0, k] - ps[inst, k]:.1f}" for k in range(ps.shape[1]))
        prog = [i for i in range(ds.sizes["row"])
                if ds.schedule.values[i] in ("linear", "cosine", "exponential", "sqrt") and bool(ds["div"].values[i])]
        accs = [100 * float(ds["correct"].values[i].mean()) for i in prog]
        dd, dse = _paired(ds, lin1, lin0)
        verdict = "does NOT appear" if abs(d) < 2 * se or d > 0 else "appears"
        notes.append(
            f"The paper's gap {verdict} on the demo: instant joining is {d:+.1f} ± {se:.1f} points against linear "
            "(both "
            f"without the regulariser, paired SE), where the paper's instant row loses {gap} points (6-R / 4-R / 3-R); "
            f"the {len(prog)} progressive schedules lie within {max(accs) - min(accs):.1f} points of each other; the "
            "regulariser "
            f"changes linear by {dd:+.1f} ± {dse:.1f} points (paper: +0.3 / +0.9 / +0.6). Our students start from the "
            "teacher's trained blocks and distil its logits, so joining all at once costs little here; the paper joins "
            "pre-trained branched models and fine-tunes on CIFAR-10 for 60k steps.")
    nj = _row(ds, "none")
    if nj is not None and ref is not None:
        d, se = _paired(ds, nj, ref)
        notes.append(f"No joining (λ = 0) is {d:+.1f} ± {se:.1f} points against linear ✓, as the paper's first row is "
                     "its "
                     "best: the branches never share their non-linearities, so it cannot be collapsed into fewer "
                     "blocks "
                     "(its exact deploy form is a teacher-sized wide model).")
    title = f"Non-deep ViT Table 5 on the demo (profile {ds.attrs.get('profile')})"
    return Table(dashed(pd.DataFrame(rows)), title, notes)


# ---------------------------------------------------------------------------------------- exactness
@dataset("nondeep.exactness", after=("nondeep.students",))
def exactness_data(ctx: Context) -> xr.Dataset:
    """Collapse errors of every merge formula per model (float64 / float32) and the LayerNorm factorisations."""
    from workbench.pipelines.nondeep.measures import collapse_descriptions, ln_factorisation, random_four_branch
    from workbench.xrutils import rows_to_dataset

    b = nondeep_budget(ctx)
    rows = []

    def add(label: str, f64: xr.Dataset, f32: xr.Dataset):
        for v in f64["model"].values:
            e, e32 = f64.sel(model=v), f32.sel(model=v)
            rows.append({"pitfall": str(v), "equations": str(e["equations"].values), "model": label,
                         "error_float64": float(e["logit_error"].max()),
                         "block_error_float64": float(e["block_error"].max()),
                         "error_float32": float(e32["logit_error_float32"].max()),
                         "top1": float(e32["correct"].mean()) if "correct" in e32 else None,
                         "branched_top1": float(f32["branched_correct"].mean()) if "branched_correct" in f32 else None,
                         "same_prediction": float(e32["same_prediction"].mean()), "images": int(f64.sizes["sample"]),
                         "images_float32": int(f32.sizes["sample"])})

    for n, run in students(ctx).items():
        src = run.config["source_run"]
        f64 = ctx.analysis("collapse_error", src, b.exact_images, precisions=["float64"]).load()
        add(f"{6 // n}×{n} demo student", f64,
            ctx.analysis("collapse_error", src, b.eval_images, precisions=["float32"]).load())
    # n = 4 does not divide the demo teacher's 6 blocks: a random 12-block demo-width ViT, branched into 3 × 4
    # (workbench.pipelines.nondeep.measures.random_four_branch)
    ds = ctx.extract("collapse_error", "nondeep-random-3x4-vit_demo-depth12-seeds0,1", random_four_branch,
                     b.exact_images).load()
    add("3×4 random (12-block ViT)", ds, ds)
    # LayerNorm factorisation (Eq. 1 forward, Eq. 2 backward): a property of the teacher
    x = ctx.images(b.exact_images).tensor
    ln = ln_factorisation(next(iter(students(ctx).values())), x, ctx.model(ctx.teacher("vit")))
    for r in ln:
        rows.append({"pitfall": r["variant"], "equations": r["equations"], "model": "demo teacher",
                     "error_float64": r["max_rel_error"], "images": int(x.shape[0])})
    descriptions = collapse_descriptions()
    descriptions.update({r["variant"]: r["description"] for r in ln})
    return rows_to_dataset(rows).assign_attrs(descriptions=json.dumps(descriptions), eval_images=b.eval_images,
                                              analysis_images=b.analysis_images)


PITFALLS = {
    "exact": ("exact (ours)",
              "per-head concatenated q/k (or X·ΣW^Q W^Kᵀ·Xᵀ + per-key bias), Σ_b W^V_b W^O_b, scale √n·√d"),
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
    imgs32 = {r["model"]: int(r["images_float32"]) for r in rows if r.get("images_float32") is not None}
    branched = {r["model"]: r.get("branched_top1") for r in rows if r.get("branched_top1") is not None}
    notes = [
        "f64 / f32: max over images of max |collapsed logit − branched logit| / max |branched logit| of that image, "
        "both "
        "models in eval mode in float64 / float32 (float64: what remains is the formula, not rounding). Exact means "
        "≤ 1e-10 in float64 (issue 11); float32 leaves ~1e-7 of rounding. top-1: held-out accuracy of the collapsed "
        "model "
        "under that formula" + ("" if not branched else " (branched: " + ", ".join(
            f"{m.split(' ')[0]} {100 * v:.1f}%" for m, v in branched.items()) + ")")
        + "; same top-1: share of images whose predicted class the collapse keeps.",
        "Models: " + "; ".join(f"{m} on {imgs[m]} images (f64), {imgs32.get(m, imgs[m])} (f32, top-1)" for m in models)
        + ". The demo students are the trained 3×2 "
        "and 2×3 branched models at λ = 1; 3×4 is a random 12-block demo-width ViT (every bias and LayerNorm affine "
        "perturbed) branched into 3 blocks of 4 and perturbed apart (4 does not divide the demo teacher's 6 blocks).",
        "Eq. 1 / Eq. 2 concern the teacher before branching (the reparameterised teacher against itself, on "
        f"{imgs.get('demo teacher', 0)} images): forward absorption is exact; the paper's backward absorption of the "
        "MHSA "
        "LayerNorm into the previous block is not, because LayerNorm's normalisation does not commute with the "
        "residual "
        "addition.",
    ]
    return Table(dashed(pd.DataFrame(out)), "Non-deep ViT: collapse exactness, the paper's merge formulas against the "
                                            "exact "
                                          f"collapse (profile {ds.attrs.get('profile')})", notes)


# ---------------------------------------------------------------------------------------- figures
figure("nondeep.table5", paper=PAPER, kind="table", data=("nondeep.table5", "nondeep.table5_seeds"), plot=table5,
       finding=Finding("\"First, instant joining severely degrades performance, confirming the necessity of a "
                       "progressive schedule.\" (§4, Lambda Scheduling and Diversity Regularization; Table 5)",
                       "Table 5 (CIFAR-10): instant loses 3.9 / 6.1 / 6.4 points against linear, both without α (6-R / 4-R / 3-R)",
                       table5_verdict),
       caption="Table 5: joining schedule and diversity regulariser ablation on the demo (2×3 student, one short epoch "
               "per row): held-out top-1 of the deployed model with 95% intervals and paired differences to linear with "
               "the regulariser, and the mean over the shuffling seeds each row is trained on (demo: 3), beside the "
               "paper's CIFAR-10 numbers; the notes say whether the paper's gap between "
               "instant and progressive joining appears here. The regulariser's weight is α = 5 on the demo, not the "
               "paper's 0.05: at the demo's 63 steps α = 0.05 left the trained branches' similarity L_div unchanged "
               "(0.070 vs 0.074 at α = 0; α = 5: 0.019), so ✓ and ✗ trained the same model "
               "(workbench.pipelines.nondeep.budgets.ABLATION_ALPHA).")
figure("nondeep.exactness", paper=PAPER, kind="table", data="nondeep.exactness", plot=exactness,
       finding=Finding("\"This allows the reparameterization of both the multi-head self-attention (MHSA) and feed "
                       "forward network (FFN) modules during inference without approximation loss\" (abstract; §3.3, "
                       "Eq. 5–7): the joined branches collapse into L/n ordinary blocks computing the same function.",
                       "§3.2, Eq. 5–7 (structural reparameterisation, exact by construction)", exactness_verdict),
       caption="Collapse exactness: relative logit error of the collapsed model against the branched model at λ = 1 "
               "under the exact collapse and under each of the paper's merge formulas (Eq. 5–7) one at a time and "
               "together, in float64 and float32, for the 3×2 and 2×3 demo students and a random 3×4 model, with "
               "the collapsed models' held-out top-1; and the two LayerNorm factorisations (Eq. 1, Eq. 2).")
