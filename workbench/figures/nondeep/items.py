"""Non-deep ViT figures ("Non-deep Vision Transformers", anonymous ICLR submission, papers/002) on the demo.

The demo teacher is the 6-block demo ViT (``teacher-vit-<profile>``); the students have 3 blocks × 2 branches
and 2 blocks × 3 branches (:mod:`workbench.pipelines.nondeep.run`), joined with the linear schedule and α = 0.05 (Table 5's ablation: α = 5, see its caption) and
collapsed exactly into 3- and 2-block ViTs. Here: Fig. 3 (λ schedules), Fig. 4 (feature similarity of branches
before joining), Figs. 5 and 6 (weight similarity before and after joining) and the collapsed students'
attention beside the teacher's (``nondeep.attention``); the tables are in :mod:`workbench.figures.nondeep.tables`.

"Before joining" is, as in the paper's Figs. 4–5, a branched model whose branches have not been joined: each
student at its initialisation (branch b of block i = teacher block n·i + b) and the 2×3 model after one epoch
of training at λ = 0 (Table 5's "no joining" run; the paper's is a pre-trained D-MAE-3-4). "After joining" (Fig. 6)
is the students at the end of training and Table 5's linear run without the diversity regulariser — the setting of
the paper's Fig. 6 — plus the similarity of the branches' weight *updates* during the Post-Joining Adjustment
Phase: at λ = 1 every branch's FFN sees one GELU input and one output gradient, so their FFN updates coincide
(:func:`methods.nondeep.update_similarity`), the mechanism behind the paper's rising FFN similarity.
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from workbench.figures import Finding, consecutive_groups, dataset, figure, student
from workbench.figures.context import Context
from workbench.figures.nondeep.findings import fig4_verdict, fig5_verdict, fig6_verdict

PAPER = "nondeep"


# ---------------------------------------------------------------------------------------- runs
def nondeep_budget(ctx: Context):
    """The profile's :class:`workbench.pipelines.nondeep.budgets.NonDeepBudget`."""
    return ctx.budget("nondeep")


def dashed(frame):
    """A table frame with empty cells shown as "–"."""
    frame = frame.astype(object)
    return frame.where(frame.notna(), "–")


def _with_source(ctx: Context, run):
    """Record a collapsed run and its branched source run for provenance; returns the collapsed run."""
    from workbench.runs import open_run

    ctx.use_run(run)
    if "source_run" in run.config:
        ctx.use_run(open_run(run.config["source_run"]))
    return run


def students(ctx: Context) -> dict:
    """``{n: collapsed run}`` of the profile's students (3×2, 2×3 on the demo), trained or reused."""
    teacher = ctx.teacher("vit")
    return {n: _with_source(ctx, ctx.run("nondeep", teacher.id, branches=n)) for n in nondeep_budget(ctx).students}


def baselines(ctx: Context) -> dict:
    """``{n: depth-baseline run}``: the teacher's first L/n blocks trained with the students' budget."""
    teacher = ctx.teacher("vit")
    return {n: ctx.run("nondeep", teacher.id, branches=n, baseline=True) for n in nondeep_budget(ctx).students}


def table5_runs(ctx: Context) -> list[tuple[str, bool, object]]:
    """``[(schedule, diversity on, collapsed run)]`` of Table 5's rows on the profile's ablation budget."""
    b = nondeep_budget(ctx)
    alpha = (b.ablation or b.join).diversity_weight
    teacher = ctx.teacher("vit")
    return [(s, div, _with_source(ctx, ctx.run("nondeep", teacher.id, branches=b.ablation_branches, schedule=s,
                                               diversity=alpha if div else 0.0, table5=True)))
            for s, div in b.ablation_rows]


def _table5_run(ctx: Context, schedule: str, div: bool | None = None):
    """The Table 5 run of ``schedule`` (with / without the regulariser; None: whichever the rows have)."""
    return next(r for s, d, r in table5_runs(ctx) if s == schedule and (div is None or d == div))


def _label(n: int, depth: int = 6) -> str:
    return f"{depth // n}×{n}"


def _student(n: int):
    def run(ctx: Context):
        return students(ctx)[n]

    return run


# block i of an n-branch student replaces the demo teacher's (depth 6) blocks n·i … n·i+n−1 (methods.nondeep.branched)
student("Non-deep 3×2 collapsed", method="nondeep", teacher="vit", after=("nondeep.students",),
        blocks=consecutive_groups(6, 2))(_student(2))
student("Non-deep 2×3 collapsed", method="nondeep", teacher="vit", after=("nondeep.students",),
        blocks=consecutive_groups(6, 3))(_student(3))


# ---------------------------------------------------------------------------------------- data
@dataset("nondeep.students", after=("teacher.vit",))
def students_data(ctx: Context) -> xr.Dataset:
    """The teacher and the collapsed students: accuracy of both forms and of the paper's formulas, size, cost."""
    from workbench.pipelines.common import model_counts
    from workbench.xrutils import rows_to_dataset

    teacher = ctx.teacher("vit")
    t_counts = model_counts(ctx.model(teacher))
    rows = [{"kind": "teacher", "n": 1, "blocks": len(ctx.model(teacher).blocks), "run": teacher.id,
             "val_acc": teacher.manifest["results"]["val_acc"], **t_counts}]
    for n, run in students(ctx).items():
        r = run.manifest["results"]
        rows.append({"kind": "collapsed", "n": n, "blocks": r["blocks"], "run": run.id,
                     "branched_run": run.config["source_run"], "val_acc": r["val_acc"],
                     "branched_val_acc": r["branched_val_acc"], "paper_formulas_val_acc": r["paper_formulas_val_acc"],
                     "params": r["params"], "macs": r["macs"], "branched_params": r["branched_params"],
                     "branched_macs": r["branched_macs"], "train_cpu_s": r["train_cpu_s"], "collapse_cpu_s": r["cpu_s"],
                     "train_wall_s": r.get("train_wall_s") or float("nan"),  # runs before the wall clock: NaN
                     "collapse_wall_s": r.get("wall_s", float("nan")),
                     "exact_error_float64": r["collapse_error_float64"]["exact"],
                     "paper_error_float64": r["collapse_error_float64"].get("paper"), "val_images": r["val_images"]})
    return rows_to_dataset(rows).assign_attrs(budget=json.dumps(_budget_summary(ctx)))


def _budget_summary(ctx: Context) -> dict:
    b = nondeep_budget(ctx)
    j, a = b.join, b.ablation or b.join
    return {"warmup_steps": j.warmup_steps, "adjust_steps": j.adjust_steps, "lr": j.lr, "batch": j.batch_size,
            "alpha": j.diversity_weight, "kd": j.kd_weight, "distill": j.distill_weight, "schedule": j.schedule,
            "ablation_warmup_steps": a.warmup_steps, "ablation_adjust_steps": a.adjust_steps,
            "ablation_branches": b.ablation_branches}


@dataset("nondeep.baselines", after=("teacher.vit",))
def baselines_data(ctx: Context) -> xr.Dataset:
    """Depth baselines (Table 1's DeiT-l rows on the demo): the teacher's first L/n blocks, trained alike."""
    from workbench.xrutils import rows_to_dataset

    rows = []
    for n, run in baselines(ctx).items():
        r = run.manifest["results"]
        rows.append({"kind": "depth baseline", "n": n, "blocks": r["blocks"], "run": run.id, "val_acc": r["val_acc"],
                     "val_acc_before_training": r["val_acc_before_training"], "params": r["params"], "macs": r["macs"],
                     "train_cpu_s": r["cpu_s"], "train_wall_s": r.get("wall_s", float("nan"))})
    return rows_to_dataset(rows)


@dataset("nondeep.schedules")
def schedules_data(ctx: Context) -> xr.Dataset:
    """λ(t) of every schedule (App. B.2) on t ∈ [0, 1.25], with the demo and paper warm-up / adjustment lengths."""
    from workbench.pipelines.nondeep.measures import lambda_schedules

    t = np.round(np.linspace(0.0, 1.25, 501), 6)
    schedules, lam, paper_warmup, paper_adjust = lambda_schedules(t)
    j = nondeep_budget(ctx).join
    ds = xr.Dataset({"lam": (("schedule", "t"), lam)}, coords={"schedule": schedules, "t": t})
    return ds.assign_attrs(warmup_steps=j.warmup_steps, adjust_steps=j.adjust_steps,
                           paper_warmup_steps=paper_warmup, paper_adjust_steps=paper_adjust)


def _initial(ctx: Context, n: int):
    """A function building the branched model at its initialisation from the teacher (λ = 0, branch b of block i =
    teacher block n·i+b), and the key naming it (for the analysis store)."""
    from workbench.pipelines.nondeep.measures import initial_branched

    teacher = ctx.teacher("vit")
    key = f"nondeep_branched-n{n}-init-from-{teacher.id}-{teacher.manifest.get('checkpoint_sha256')}"
    return key, lambda: initial_branched(ctx.model(teacher), n, teacher)


def _stacked(parts: dict[str, xr.Dataset], notes: dict[str, str]) -> xr.Dataset:
    """Similarity Datasets of several models along ``model`` (NaN-padded blocks and branches)."""
    clean = [p.drop_vars([c for c in p.coords if c not in p.dims]).expand_dims(model=[k]) for k, p in parts.items()]
    ds = xr.concat(clean, dim="model", join="outer", data_vars="all", coords="minimal", compat="override")
    return ds.assign_coords(note=("model", [notes.get(k, "") for k in parts]))


@dataset("nondeep.fig4", after=("nondeep.students", "nondeep.table5"))
def fig4_data(ctx: Context) -> xr.Dataset:
    """Branch output similarity before joining: students at initialisation, the 2×3 model after an epoch at λ = 0."""
    b = nondeep_budget(ctx)
    parts, notes = {}, {}
    for n in b.students:
        ds = ctx.extract("branch_feature_similarity", *_initial(ctx, n), b.analysis_images).load()
        parts[f"{_label(n)} at initialisation"] = ds.mean("sample").assign(cosine_sd=ds["cosine"].std("sample"))
        notes[f"{_label(n)} at initialisation"] = "λ = 0, untrained"
    none = _table5_run(ctx, "none")
    ds = ctx.analysis("branch_feature_similarity", none.config["source_run"], b.analysis_images).load()
    key = f"{_label(b.ablation_branches)} after training at λ = 0"
    parts[key] = ds.drop_vars(["image", "label"], errors="ignore").mean("sample").assign(
        cosine_sd=ds["cosine"].std("sample"))
    notes[key] = "Table 5 'no joining' run"
    return _stacked(parts, notes).assign_attrs(images=b.analysis_images, n_images=int(ds.sizes["sample"]))


@dataset("nondeep.fig5", after=("nondeep.students", "nondeep.table5"))
def fig5_data(ctx: Context) -> xr.Dataset:
    """Branch weight similarity before joining (the same models as Fig. 4), and for the model trained at λ = 0 the
    similarity of the weight updates it made from its initialisation (NaN for the untrained models)."""
    from workbench.pipelines.nondeep.measures import training_update_similarity

    b = nondeep_budget(ctx)
    parts, notes = {}, {}
    for n in b.students:
        parts[f"{_label(n)} at initialisation"] = ctx.extract("branch_weight_similarity", *_initial(ctx, n),
                                                              b.analysis_images).load()
        notes[f"{_label(n)} at initialisation"] = "λ = 0, untrained"
    none = _table5_run(ctx, "none")
    key = f"{_label(b.ablation_branches)} after training at λ = 0"
    parts[key] = ctx.analysis("branch_weight_similarity", none.config["source_run"], b.analysis_images).load()
    notes[key] = "Table 5 'no joining' run"
    upd, modules = training_update_similarity(_initial(ctx, b.ablation_branches)[1](), none)
    dims = ("layer", "module", "branch_i", "branch_j")
    out = {}
    for k, v in parts.items():
        v = v.drop_vars(["image", "label"], errors="ignore")
        u = upd[v["layer"].values] if k == key else np.full((v.sizes["layer"], len(modules), v.sizes["branch_i"],
                                                             v.sizes["branch_j"]), np.nan)
        out[k] = v.assign(update=(dims, u))
    return _stacked(out, notes).assign_coords(module=modules)


@dataset("nondeep.fig6", after=("nondeep.students", "nondeep.table5"))
def fig6_data(ctx: Context) -> xr.Dataset:
    """Branch weight similarity after joining, and similarity of the weight updates made at λ = 1."""
    from workbench.pipelines.nondeep.measures import weight_update_similarity
    from workbench.runs import open_run

    b = nondeep_budget(ctx)
    runs = {f"{_label(n)}, α = {b.join.diversity_weight:g}": run for n, run in students(ctx).items()}
    runs[f"{_label(b.ablation_branches)}, α = 0 (Table 5)"] = _table5_run(ctx, "linear", False)
    runs[f"{_label(b.ablation_branches)}, α = {(b.ablation or b.join).diversity_weight:g} (Table 5)"] = \
        _table5_run(ctx, "linear", True)
    parts, notes = {}, {}
    for key, run in runs.items():
        weights = ctx.analysis("branch_weight_similarity", run.config["source_run"], b.analysis_images).load()
        upd, modules = weight_update_similarity(run)
        upd = upd[weights["layer"].values]  # (layer, module, n, n)
        res = run.manifest["results"]
        src = open_run(run.config["source_run"])
        adjust = src.manifest["results"]["steps"] - src.manifest["results"]["warmup_steps"]
        n = weights.sizes["branch_i"]
        init = ctx.extract("branch_weight_similarity", *_initial(ctx, n), b.analysis_images).load()
        parts[key] = weights.drop_vars(["image", "label"], errors="ignore").assign(
            update=(("layer", "module", "branch_i", "branch_j"), upd),
            cosine_init=(weights["cosine"].dims, init["cosine"].transpose(*weights["cosine"].dims).values))
        notes[key] = f"{adjust} steps at λ = 1, top-1 {100 * res['val_acc']:.1f}%"
    ds = _stacked(parts, notes)
    return ds.assign_coords(module=modules)


@dataset("nondeep.attention", after=("nondeep.students",))
def attention_data(ctx: Context) -> xr.Dataset:
    """CLS-to-patch attention (mean over heads) of the teacher and of the collapsed students, by teacher block."""
    teacher = ctx.teacher("vit")
    images = ctx.profile.analysis_images
    att = ctx.analysis("attention", teacher.id, images).load()
    t_cls = att["cls_attention"].mean("head")  # (sample, layer, y, x)
    depth = t_cls.sizes["layer"]
    rows, blocks, starts = [t_cls.values], [list(range(depth))], [list(range(depth))]
    names = ["teacher (6 blocks)" if depth == 6 else f"teacher ({depth} blocks)"]
    pearson = [np.full((t_cls.sizes["sample"], depth), np.nan)]
    for n, run in students(ctx).items():
        s = ctx.analysis("attention", run.id, images).load()["cls_attention"].mean("head")  # (sample, L/n, y, x)
        grid = np.full(t_cls.shape, np.nan)
        blk, start, rho = [-1] * depth, [-1] * depth, np.full((t_cls.sizes["sample"], depth), np.nan)
        for i in range(s.sizes["layer"]):
            col = n * i + n - 1  # the last teacher block of the group it replaces
            grid[:, col] = s.values[:, i]
            blk[col], start[col] = i, n * i
            for k in range(t_cls.sizes["sample"]):
                rho[k, col] = np.corrcoef(s.values[k, i].ravel(), t_cls.values[k, col].ravel())[0, 1]
        rows.append(grid)
        blocks.append(blk)
        starts.append(start)
        pearson.append(rho)
        names.append(f"collapsed {_label(n, depth)} ({depth // n} blocks)")
    return xr.Dataset(
        {"cls": (("model", "sample", "layer", "y", "x"), np.stack(rows)),
         "pearson": (("model", "sample", "layer"), np.stack(pearson)), "image": att["image"]},
        coords={"model": names, "sample": att["sample"].values, "layer": t_cls["layer"].values,
                "block": (("model", "layer"), np.array(blocks)), "group_start": (("model", "layer"), np.array(starts))})


# ---------------------------------------------------------------------------------------- plots
def plot_fig3(ds: xr.Dataset):
    from workbench.plots.nondeep import plot_lambda_schedules

    return plot_lambda_schedules(ds)


def plot_fig4(ds: xr.Dataset):
    from workbench.plots.nondeep import pair_mean, plot_similarity

    mean = pair_mean(ds["cosine"])[0]  # (model, layer, module)
    first = ", ".join(f"{m.split(' ')[0]}{' trained at λ = 0' if 'train' in m else ''}: "
                      f"{float(mean.sel(model=m, layer=0, module='attn')):.2f}" for m in [str(v) for v in ds["model"].values])
    rest = float(mean.where(~((mean.layer == 0) & (mean.module == "attn"))).mean())
    fig = plot_similarity(ds, "cosine", title="Fig. 4: branch output similarity before joining (cosine over D per "
                                              f"token, mean over tokens and {ds.attrs.get('n_images', '')} held-out "
                                              "images)")
    fig.text(0.5, -0.01, f"block 0 attention, mean over branch pairs — {first} (paper, D-MAE-3-4: layer 0 attention "
                          f"0.59, the other modules low); all other blocks and modules here: {rest:.2f} on average",
             ha="center", va="top", fontsize="small")
    return fig


def plot_fig5(ds: xr.Dataset):
    from workbench.plots.nondeep import plot_similarity_summary

    rows = {"cosine": "weights before joining"}
    if "update" in ds:
        rows["update"] = "weight updates at λ = 0"
    return plot_similarity_summary(ds, rows, limit=None,
                                   title="Fig. 5: branch weight similarity before joining (cosine of the matrices), "
                                         "and of the weight updates made while training at λ = 0")


def plot_fig6(ds: xr.Dataset):
    from workbench.plots.nondeep import plot_similarity_summary

    return plot_similarity_summary(ds, {"cosine": "weights after joining", "update": "weight updates at λ = 1"},
                                   title="Fig. 6: branch weight similarity after joining, and of the updates made "
                                         "during the adjustment phase (λ = 1)")


def plot_attention(ds: xr.Dataset):
    from workbench.plots.nondeep import plot_cls_beside

    return plot_cls_beside(ds, title="CLS-to-patch attention: teacher blocks and the collapsed students' blocks "
                                     f"that replace them (sample {int(ds.sample[0])})")


# ---------------------------------------------------------------------------------------- figures
figure("nondeep.fig3", paper=PAPER, data="nondeep.schedules", plot=plot_fig3,
       caption="Fig. 3: the joining coefficient λ(t) of the four schedules of App. B.2 (Eq. 10–13) over the Lambda "
               "Warmup Period (t = step / warm-up steps) and the Post-Joining Adjustment Phase (shaded, λ = 1), with "
               "Table 5's instant joining (λ = 1 throughout) and no joining (λ = 0). Eq. 12 as printed ends at "
               "1 − e⁻⁵ ≈ 0.9933 and jumps to 1; Eq. 13 (√t) rises fastest at the start, although App. B.2 describes "
               "the square-root schedule as slow at first.")
figure("nondeep.fig4", paper=PAPER, data="nondeep.fig4", plot=plot_fig4,
       finding=Finding("\"while Layer 0 attention modules exhibit high inter-branch similarity (average = 0.59), which "
                       "can be attributed to all branches receiving identical input tokens, other modules demonstrate "
                       "relatively low similarity\" (App. C.1, Fig. 4: the branched model before joining).",
                       "Fig. 4 (D-MAE-3-R): block 0 attention 0.59, other modules relatively low", fig4_verdict),
       caption="Fig. 4: cosine similarity between the branches' attention outputs and FFN outputs (per token, over "
               "the width D, averaged over tokens and the analysis images) in every parallel block, before joining: "
               "the 3×2 and 2×3 demo students at initialisation (branch b of block i = teacher block n·i + b, all "
               "fed the same normalised input) and the 2×3 model after one epoch at λ = 0 (Table 5's no-joining run; "
               "the paper shows its pre-trained D-MAE-3-4).")
figure("nondeep.fig5", paper=PAPER, data="nondeep.fig5", plot=plot_fig5,
       finding=Finding("\"Weight similarity matrices across branches before progressive joining. This analysis "
                       "corroborates the feature diversity observed in Figure 4, confirming that branches maintain "
                       "distinct parameter spaces in D-MAE-3-4\" (App. C.2, Fig. 5): the branches stay distinct while "
                       "they train before joining.", "Fig. 5 (D-MAE-3-4, qualitative)", fig5_verdict),
       caption="Fig. 5: cosine similarity between the branches' weights before joining, per block and module: qk = "
               "W^Q_h W^K_hᵀ and ov = W^V_h W^O_h per head (the matrices the collapse sums), fc1, fc2 (the FFN), for "
               "the models of Fig. 4. The store also holds a unit-permutation-invariant variant (cka). The colour "
               "scale spans only the largest |value| (stated on the bar): on ±1 every cell is ≈ 0 and looks blank. "
               "The last two panels differ by at most a few thousandths: the λ = 0 run's short training barely moves "
               "weights that started as different teacher blocks; the lower row is therefore what tests the claim: the "
               "similarity of the weight changes the λ = 0 run made from its initialisation (alike changes would pull "
               "the branches together; none for the untrained models).")
figure("nondeep.fig6", paper=PAPER, data="nondeep.fig6", plot=plot_fig6,
       finding=Finding("\"After completing the Lambda Warmup Period (10k steps) and Post-Joining Adjustment Phase "
                       "(50k steps) without diversity regularization, we observe alarmingly high similarity in FFN "
                       "weights (0.725-0.928)\" (App. C.2, Fig. 6).",
                       "Fig. 6: FFN weight similarity 0.725–0.928 after 10k + 50k steps", fig6_verdict),
       caption="Fig. 6: after joining (λ = 1 reached, then the adjustment phase): for each model, the cosine "
               "similarity between the branches' weights (upper row) and between the weight changes the branches "
               "made during the adjustment phase (lower row). At λ = 1 every branch's FFN sees the same GELU input and "
               "the same output gradient, so the FFN updates coincide (≈ 0.98 under AdamW; exactly 1 under plain "
               "gradient descent) whatever α, while qk/ov updates do not: branches that keep receiving equal updates "
               "grow alike, the mechanism behind the paper's FFN similarity of 0.73–0.93 after 60k steps. At the "
               "demo's length the weights themselves stay dissimilar: the updates are small next to the different "
               "teacher blocks the branches started from. The verdict compares the α = 0 model's FFN weight similarity "
               "with the same branched model at initialisation (the teacher blocks it started from).")
figure("nondeep.attention", paper=PAPER, data="nondeep.attention", plot=plot_attention,
       caption="CLS-to-patch attention probabilities (mean over heads) of the demo teacher's six blocks and of the "
               "collapsed 3-block (3×2) and 2-block (2×3) students, each student block drawn under the last teacher "
               "block of the group it replaces (r: Pearson correlation with that teacher map on this digit, r̄: its "
               "mean over the analysis images), over a held-out digit. "
               "The collapsed models are plain timm ViTs read by the shared attention extractor; at λ = 1 their maps "
               "equal every branch's map of the branched model.")
