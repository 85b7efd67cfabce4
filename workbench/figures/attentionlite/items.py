"""AttentionLite figures and tables (Kundu & Sundaresan, papers/003), on the demo and at paper size.

The demo distils the CNN teacher ``teacher-cnn-<profile>`` (``cnn_demo``) into the SA-ResNet ``sa_resnet_demo``
(every 3×3 convolution a local self-attention layer; stage maps 28/14/7/4 like the teacher's) with Eq. 2 and sparse
momentum, one run per (pruning, loss, seed) of the profile (:func:`workbench.pipelines.attentionlite.run._run`):
irregular pruning at Fig. 2's d = 0.25 and column pruning at Fig. 3's d = 0.5, each with KD and with KD+AT. What the
demo can and cannot claim is in the captions and ``docs/attentionlite-demo-budgets.md``. Tables 1 and 2 count
parameters and MACs of SA-ResNet26/38 and the CIFAR ResNet50 at paper size (random weights, masks at the target
density) beside the paper's reductions, with the demo's measured rows below.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import xarray as xr

from workbench.figures.attentionlite import findings
from workbench.figures import dataset, figure, student
from workbench.figures.context import Context
from workbench.plots.table import Table

PAPER = "attentionlite"
KINDS = ("irregular", "column")
LOSSES = {False: "KD", True: "KD+AT"}
DATASETS = {"cifar10": ("CIFAR-10", 10, 32), "cifar100": ("CIFAR-100", 100, 32), "tiny-imagenet": ("Tiny-ImageNet", 200, 64)}
STUDENTS = {"sa_resnet26": "SA-ResNet26", "sa_resnet38": "SA-ResNet38"}


# ---------------------------------------------------------------------------------------- runs
def _budget(ctx: Context):
    return ctx.budget("attentionlite")


def demo_runs(ctx: Context, pruning: str, seeds=None, *, stem: str | None = None) -> dict[tuple[bool, int], object]:
    """The profile's runs of ``pruning`` at its figure density: ``{(at, seed): Run}``, trained or reused."""
    b = _budget(ctx)
    teacher = ctx.teacher("cnn")
    d = b.figure_densities[pruning]
    return {(at, s): ctx.run("attentionlite", teacher.id, density=d, pruning=pruning, at=at, seed=s,
                             **({"stem": stem} if stem else {}))
            for at in (False, True) for s in (b.seeds if seeds is None else seeds)}


def _student(pruning: str):
    def run(ctx: Context):
        return demo_runs(ctx, pruning, seeds=_budget(ctx).seeds[:1])[(True, _budget(ctx).seeds[0])]

    return run


student("AttentionLite irregular d=0.25 KD+AT", method=PAPER, teacher="cnn", after=("attentionlite.fig2",))(_student("irregular"))
student("AttentionLite column d=0.5 KD+AT", method=PAPER, teacher="cnn", after=("attentionlite.fig3",))(_student("column"))


# ---------------------------------------------------------------------------------------- data
def _curves(ctx: Context, pruning: str) -> xr.Dataset:
    """Held-out accuracy per epoch and the final results of the profile's runs of ``pruning`` (dim ``run``)."""
    from workbench.pipelines.attentionlite.run import training_history

    b = _budget(ctx)
    runs = demo_runs(ctx, pruning)
    parts, rows = [], []
    for (at, seed), run in runs.items():
        h = training_history(run)
        h = h.assign({k: h[k] if k in h else xr.full_like(h["val_acc"], np.nan) for k in ("train_at", "train_kl", "train_ce")})
        parts.append(h[["val_acc", "train_at", "train_kl", "train_ce"]].expand_dims(run=[run.id]))
        rows.append({"distill": LOSSES[at], "seed": seed, **run.manifest["results"]})
    ds = xr.concat(parts, dim="run", join="outer", data_vars="all", coords="different", compat="no_conflicts")
    ds = ds.assign_coords(distill=("run", [r["distill"] for r in rows]), seed=("run", [r["seed"] for r in rows]))
    for key in ("val_acc", "param_reduction", "flops_reduction", "dense_flops_reduction", "realised_density", "kept_params",
                "student_params", "teacher_params", "pruned_macs", "student_macs", "teacher_macs", "masked_val_acc"):
        ds[f"final_{key}"] = ("run", [float(r[key]) for r in rows])
    ds["final_masked_params"] = ("run", [float(r.get("masked_params", r["kept_params"] if pruning == "irregular" else np.nan))
                                         for r in rows])
    if pruning == "column":
        ds["shrunk_gap"] = ("run", [float(r["shrunk_vs_masked_max_abs_diff"]) for r in rows])
    t = b.train
    return ds.assign_attrs(pruning=pruning, density=b.figure_densities[pruning], teacher_val_acc=rows[0]["teacher_val_acc"],
                           budget=json.dumps({"epochs": t.epochs, "batch_size": t.batch_size, "lr": t.lr, "opt": t.opt,
                                              "train_images": rows[0]["train_images"], "val_images": rows[0]["val_images"],
                                              "beta": b.distill.beta, "alpha": b.distill.alpha, "rho": b.distill.rho,
                                              "seeds": list(b.seeds)}))


@dataset("attentionlite.fig2", after=("teacher.cnn",))
def fig2_data(ctx: Context) -> xr.Dataset:
    return _curves(ctx, "irregular")


@dataset("attentionlite.fig3", after=("teacher.cnn",))
def fig3_data(ctx: Context) -> xr.Dataset:
    return _curves(ctx, "column")


@dataset("attentionlite.fig2_seeds", after=("teacher.cnn",))
def fig2_seeds_data(ctx: Context) -> xr.Dataset:
    """Per-seed held-out correctness ``correct(arm, seed, sample)`` of Fig. 2's KD and KD+AT runs (irregular, figure
    density) on the budget's ``gain_seeds`` (:mod:`workbench.figures.seeds`). The other seeds train first; the
    figure's own seed (``attentionlite.fig2``'s runs, trained meanwhile by that step) is taken last, reused."""
    from workbench.figures.seeds import correctness_by_seed

    b = _budget(ctx)
    runs = {}
    for s in sorted(b.gain_seeds, key=lambda s: s == b.seeds[0]):
        got = demo_runs(ctx, "irregular", seeds=(s,))
        runs.update({(LOSSES[at], s): got[(at, s)] for at in (False, True)})
    return correctness_by_seed(ctx, runs).assign_attrs(pruning="irregular", density=b.figure_densities["irregular"])


@dataset("attentionlite.baselines", after=("attentionlite.fig2", "attentionlite.fig3"))
def baselines_data(ctx: Context) -> xr.Dataset:
    """Per-image held-out correctness of the first seed's KD, KD+AT and no-distillation students of both pruning kinds
    at their figure densities, of the dense student without distillation (the paper's 'unoptimised student') and of
    the teacher (:mod:`workbench.pipelines.attentionlite.baselines`)."""
    from workbench.pipelines.attentionlite.baselines import students_correctness

    b = _budget(ctx)
    teacher, s = ctx.teacher("cnn"), b.seeds[0]
    runs = {}
    for pruning in KINDS:
        got = demo_runs(ctx, pruning, seeds=(s,))
        runs[f"{pruning}/none"] = ctx.run("attentionlite", teacher.id, density=b.figure_densities[pruning],
                                          pruning=pruning, at=False, kd=False, seed=s)
        runs[f"{pruning}/KD"], runs[f"{pruning}/KD+AT"] = got[(False, s)], got[(True, s)]
    runs["dense/none"] = ctx.run("attentionlite", teacher.id, density=1.0, pruning="irregular", at=False, kd=False, seed=s)
    return students_correctness(teacher, runs, ctx.profile.name, ctx.device).assign_attrs(
        densities=json.dumps(b.figure_densities), epochs=b.train.epochs)


@dataset("attentionlite.density", after=("attentionlite.fig2", "attentionlite.fig3"))
def density_data(ctx: Context) -> xr.Dataset:
    """Per-layer density per epoch ``(run, epoch, layer)`` of the first seed's runs, both pruning kinds and losses."""
    from workbench.pipelines.attentionlite.run import training_history

    b = _budget(ctx)
    parts = []
    for pruning in KINDS:
        for (at, _), run in demo_runs(ctx, pruning, seeds=b.seeds[:1]).items():
            h = training_history(run)
            parts.append(h[["layer_density"]].expand_dims(run=[run.id]).assign_coords(
                label=("run", [f"{pruning}, {LOSSES[at]}"]), target=("run", [b.figure_densities[pruning]])))
    return xr.concat(parts, dim="run", data_vars="all", coords="different", compat="no_conflicts", join="outer")


def _distance(student: xr.Dataset, teacher: xr.Dataset) -> np.ndarray:
    """‖ψ_S − ψ_T‖₂ per stage and image ``(stage, sample)``, on the stages' cells (the AT loss's geometry)."""
    out = []
    for st in student.stage.values:
        s = int(student.stride.sel(stage=st))
        cells = dict(y=slice(0, None, s), x=slice(0, None, s))
        diff = student.at_map.sel(stage=st).isel(**cells) - teacher.at_map.sel(stage=st).isel(**cells)
        out.append(np.sqrt((diff ** 2).sum(("y", "x"))).transpose("sample").values)
    return np.array(out)


@dataset("attentionlite.at_maps", after=("attentionlite.fig2", "attentionlite.fig3"))
def at_maps_data(ctx: Context) -> xr.Dataset:
    """Teacher and irregular students' (first seed) AT maps on the analysis images, and every student's distance to
    the teacher's maps per stage: its mean over the images (``distance``, drawn) and per image (``distance_image``,
    paired by the verdict)."""
    b = _budget(ctx)
    images = ctx.profile.analysis_images
    teacher = ctx.teacher("cnn")
    t_maps = ctx.analysis("at_maps", teacher.id, images).load()
    irregular = demo_runs(ctx, "irregular")
    first = b.seeds[0]
    maps = {"teacher (CNN)": t_maps}
    for at in (False, True):
        maps[f"student, {LOSSES[at]}"] = ctx.analysis("at_maps", irregular[(at, first)].id, images).load()
    out = xr.concat([m["at_map"] for m in maps.values()], dim=xr.DataArray(list(maps), dims="model"), join="outer",
                    coords="different", compat="no_conflicts")
    students, dist = [], []
    for pruning in KINDS:
        for (at, seed), run in demo_runs(ctx, pruning).items():
            dist.append(_distance(ctx.analysis("at_maps", run.id, images).load(), t_maps))
            students.append({"run": run.id, "distill": LOSSES[at], "pruning": pruning, "seed": seed})
    dist = np.array(dist)  # (run, stage, sample)
    ds = xr.Dataset({"at_map": out, "image": t_maps["image"], "distance": (("run", "stage"), dist.mean(-1)),
                     "distance_image": (("run", "stage", "sample"), dist)})
    ds["distance_image"].attrs.update(long_name="‖ψ_student − ψ_teacher‖₂ per image (the verdict pairs them)")
    return ds.assign_coords(run=[s["run"] for s in students],
                            **{k: ("run", [s[k] for s in students]) for k in ("distill", "pruning", "seed")})


@dataset("attentionlite.local_attention", after=("attentionlite.fig2",))
def local_attention_data(ctx: Context) -> xr.Dataset:
    """The irregular KD+AT student's (first seed) local attention for the budget's query pixel."""
    b = _budget(ctx)
    run = demo_runs(ctx, "irregular", seeds=b.seeds[:1])[(True, b.seeds[0])]
    return ctx.analysis("local_attention", run.id, ctx.profile.analysis_images, query=list(b.query)).load()


# ---------------------------------------------------------------------------------------- paper size
def _paper_combos(ctx: Context) -> list[tuple[str, str, str, str, float]]:
    """Unique (student, stem, dataset, pruning, d) of Tables 1 and 2 (the profile's students and datasets)."""
    paper = ctx.paper("attentionlite")  # methods.attentionlite.PAPER_TABLE1, PAPER_TABLE2
    b = _budget(ctx)
    return list(dict.fromkeys((r.student, r.stem, r.dataset, r.pruning, r.density) for r in paper["table1"] + paper["table2"]
                              if r.student in b.paper_students and r.dataset in b.paper_datasets))


@dataset("attentionlite.paper_size")
def paper_size_data(ctx: Context) -> xr.Dataset:
    """Parameters and MACs at paper size of every (student, stem, dataset, pruning, d) of Tables 1-2 and of the CIFAR
    ResNet50 teacher: random weights, sparse momentum's initial masks (uniform density per layer), one image."""
    from workbench.pipelines.attentionlite.measures import paper_size_rows
    from workbench.xrutils import rows_to_dataset

    rows = paper_size_rows(_paper_combos(ctx), DATASETS)
    return rows_to_dataset(rows)


def _paper_rows(paper, ours: list[dict], stem: str) -> list[dict]:
    out = []
    for r in paper:
        o = next((c for c in ours if (c["student"], c["stem"], c["dataset"], c["pruning"], c["density"])
                 == (r.student, r.stem, r.dataset, r.pruning, r.density)), None)
        if r.stem != stem or o is None:
            continue
        name, _, _ = DATASETS[r.dataset]
        out.append({
            "model": f"{STUDENTS[r.student]} ({'hybrid' if stem == 'conv' else 'homogeneous'})", "data": name,
            "loss": r.distill, "pruning": r.pruning, "d": r.density,
            "accuracy (%)": r.accuracy, "teacher (%)": r.teacher_acc, "unoptimised student (%)": r.student_acc,
            **({"unoptimised homogeneous (%)": r.homogeneous_acc} if stem == "attention" else {}),
            "param. red. (paper)": r.param_reduction, "param. red. (ours)": round(o["teacher_params"] / o["kept_params"], 2),
            "param. red. shrunk (ours)": None if o["shrunk_params"] is None else round(o["teacher_params"] / o["shrunk_params"], 2),
            "FLOPs red. (paper)": r.flops_reduction,
            "FLOPs red. dense student (ours)": round(o["teacher_macs"] / o["student_macs"], 2),
            "FLOPs red. pruned (ours)": round(o["teacher_macs"] / o["pruned_macs"], 2),
            "source": "paper acc.; our counts"})
    return out


def _demo_rows(curves: list[xr.Dataset], stem_label: str) -> list[dict]:
    out = []
    for ds in curves:
        for loss in ("KD", "KD+AT"):
            sel = ds.where(ds.distill == loss, drop=True)
            if not sel.sizes.get("run"):
                continue
            acc = sel.final_val_acc.values
            seeds = ", ".join(f"{100 * a:.1f}" for a in acc)
            out.append({
                "model": f"demo SA-ResNet ({stem_label}, {int(sel.final_student_params.values[0]) / 1e3:.0f}k)",
                "data": "MNIST-5k (demo)", "loss": loss, "pruning": ds.attrs["pruning"], "d": ds.attrs["density"],
                "accuracy (%)": round(100 * float(acc.mean()), 1), "teacher (%)": round(100 * ds.attrs["teacher_val_acc"], 1),
                "param. red. (ours)": round(float((sel.final_teacher_params / sel.final_masked_params).mean()), 2),
                **({"param. red. shrunk (ours)": round(float(sel.final_param_reduction.mean()), 2)}
                   if ds.attrs["pruning"] == "column" else {}),
                "FLOPs red. dense student (ours)": round(float(sel.final_dense_flops_reduction.mean()), 2),
                "FLOPs red. pruned (ours)": round(float(sel.final_flops_reduction.mean()), 2),
                "source": f"measured here ({len(acc)} seed{'s' if len(acc) > 1 else ''}: {seeds} %)"})
    return out


def _table_data(ctx: Context, stem: str) -> xr.Dataset:
    from workbench.xrutils import dataset_rows, rows_to_dataset

    ours = dataset_rows(ctx.data("attentionlite.paper_size"))
    rows = _paper_rows(ctx.paper("attentionlite")["table1" if stem == "conv" else "table2"], ours, stem)
    curves = [ctx.data("attentionlite.fig2"), ctx.data("attentionlite.fig3")]
    if stem == "conv":  # the demo trains hybrid students only: Table 2 (homogeneous) gets no demo rows
        rows += _demo_rows(curves, "hybrid")
    budget = json.loads(curves[0].attrs["budget"])
    return rows_to_dataset(rows).assign_attrs(budget=json.dumps(budget), teacher_params=int(curves[0].final_teacher_params[0]),
                                              teacher_macs=float(curves[0].final_teacher_macs[0]))


@dataset("attentionlite.table1", after=("attentionlite.paper_size", "attentionlite.fig2", "attentionlite.fig3"))
def table1_data(ctx: Context) -> xr.Dataset:
    return _table_data(ctx, "conv")


@dataset("attentionlite.table2", after=("attentionlite.paper_size", "attentionlite.fig2", "attentionlite.fig3"))
def table2_data(ctx: Context) -> xr.Dataset:
    return _table_data(ctx, "attention")


# ---------------------------------------------------------------------------------------- plots
def _spread_note(ds: xr.Dataset) -> str:
    """KD+AT − KD in final accuracy, per seed, and the seed-to-seed spread of each loss."""
    by = {loss: {int(s): float(a) for s, a, d in zip(ds.seed.values, ds.final_val_acc.values, ds.distill.values) if d == loss}
          for loss in ("KD", "KD+AT")}
    common = sorted(set(by["KD"]) & set(by["KD+AT"]))
    gaps = ", ".join(f"{100 * (by['KD+AT'][s] - by['KD'][s]):+.1f}" for s in common)
    return f"final KD+AT − KD: {gaps} points (seed{'s' if len(common) > 1 else ''} {', '.join(map(str, common))})"


def _curves_plot(fig_no: int):
    def plot(ds: xr.Dataset, base: xr.Dataset | None = None):
        from workbench.plots.attentionlite import plot_accuracy_curves

        b = json.loads(ds.attrs["budget"])
        fig = plot_accuracy_curves(ds, title=f"Fig. {fig_no} on the demo: {ds.attrs['pruning']} pruning, d = {ds.attrs['density']:g}")
        fig.axes[0].text(0.03, 0.93, f"{_spread_note(ds)}\n{b['epochs']} epochs × {b['train_images']} images, "
                         f"held-out {b['val_images']} images", transform=fig.axes[0].transAxes, fontsize=7, va="top")
        return fig

    return plot


def plot_fig2(ds: xr.Dataset, base: xr.Dataset, seeds: xr.Dataset):
    """Fig. 2's curves (the figure's seed) with every seed's final held-out accuracy beside the last epoch."""
    import seaborn as sns

    from workbench.plots.attentionlite import DISTILL_COLORS

    fig = _curves_plot(2)(ds, base)
    ax = fig.axes[0]
    last = float(ds.epoch.values[-1] + 1)
    acc = 100 * seeds["correct"].mean("sample")  # (arm, seed)
    palette = sns.color_palette()
    for i, arm in enumerate(acc.arm.values):
        vals = acc.sel(arm=arm).values
        vals = vals[np.isfinite(vals)]
        ax.scatter(np.full(vals.size, last + 0.25 + 0.2 * i), vals, s=22, facecolors="none", lw=1.2,
                   edgecolors=palette[DISTILL_COLORS.get(str(arm), 0)], zorder=3)
    ax.set_xlim(right=last + 0.8)
    ax.text(0.97, 0.30, f"○ final accuracy of each of {seeds.sizes['seed']} seeds", transform=ax.transAxes,
            fontsize=7, ha="right")
    return fig


def plot_baselines(ds: xr.Dataset):
    from workbench.figures.verdicts import accuracy_intervals
    from workbench.plots.attentionlite import plot_student_baselines

    acc = accuracy_intervals(ds["correct"])
    dens = json.loads(ds.attrs["densities"])
    return plot_student_baselines(acc, densities=dens, title=f"Sparse students with and without distillation (demo, "
                                  f"{ds.attrs.get('epochs')} epochs; bars: 95 % Wilson intervals over "
                                  f"{ds.sizes['sample']} held-out images)")


def plot_density(ds: xr.Dataset):
    from workbench.plots.attentionlite import plot_layer_density

    return plot_layer_density(ds, title="Kept fraction of each pruned layer per epoch (sparse momentum, demo student)")


def plot_at(ds: xr.Dataset):
    from workbench.plots.attentionlite import plot_at_maps

    maps = ds[["at_map", "image"]]
    return plot_at_maps(maps, ds[["distance"]], title="Attention-transfer maps ψ of the CNN teacher and its SA-ResNet "
                                                      "students (irregular, d = 0.25)")


def plot_query(ds: xr.Dataset):
    from workbench.plots.attentionlite import plot_local_attention

    return plot_local_attention(ds, title=f"Local attention of the KD+AT student for the query pixel "
                                          f"({ds.attrs['query_y']}, {ds.attrs['query_x']})")


_NOTES = [
    "Reductions are teacher / student. Teacher at paper size: ResNet50 with the CIFAR stem (resnet50_cifar: 3×3 stride-1 "
    "stem, no max pool, stage maps 32/16/8/4 like the students'), counted at 32×32 (Tiny-ImageNet rows: 64×64; the "
    "paper states neither the teacher's stem nor the Tiny-ImageNet resolution). 'param. red. (ours)': teacher parameters / "
    "parameters the masked student keeps at the target d: the weights its masks keep plus every parameter they do not "
    "cover (norms, biases and relative embeddings stay dense, zero-initialised BN parameters included; realised "
    "density exactly d for irregular masks, within one column for column masks); 'shrunk': / parameters of "
    "the column-shrunk deploy model, which also drops the channels the pruned columns free.",
    "FLOPs are counted as MACs (methods.flops.count_macs: every convolution, linear and local-attention product; a MAC "
    "ratio is the FLOP ratio at 2 FLOPs per MAC). 'dense student': the unpruned student's MACs — the paper's FLOPs "
    "reductions (1.5-2.1×) match these, i.e. the paper counts the student's FLOPs without its sparsity; 'pruned': "
    "the MACs of non-zero weights (irregular: what a sparse kernel would do) or of the shrunk model (column).",
    "Paper-size masks are sparse momentum's initial masks (uniform d per layer); training moves budget between layers, "
    "which changes the MACs of the pruned model but not its parameter count. The paper's parameter reductions are "
    "0.5-12 % above ours at the same d and differ between KD and KD+AT (e.g. 29.75× vs 30.26×): its realised densities "
    "vary around the target (29.75× at d = 0.1 means a realised density ≈ 0.090), ours are exact.",
]


def _table(title: str, extra: list[str]):
    def plot(ds: xr.Dataset) -> Table:
        from workbench.xrutils import dataset_rows

        b = json.loads(ds.attrs["budget"])
        frame = pd.DataFrame(dataset_rows(ds)).astype(object)
        frame = frame.where(frame.notna(), None)
        notes = _NOTES + extra + [
            f"Demo rows: measured here on the held-out {b['val_images']} MNIST-5k images (teacher cnn_demo, "
            f"{ds.attrs['teacher_params'] / 1e3:.0f}k parameters, {ds.attrs['teacher_macs'] / 1e6:.1f} M MACs), student "
            f"sa_resnet_demo, {b['epochs']} epochs × {b['train_images']} images, AdamW lr {b['lr']:g}, α = {b['alpha']:g}, "
            f"β = {b['beta']:g}, ρ = {b['rho']:g}; d = 0.25 (irregular, Fig. 2's) and 0.5 (column). Accuracy: mean over "
            f"the seeds listed in 'source'. One held-out standard error is ≈ 1 point at 90 %; KD+AT − KD differences of a "
            "few points are within the seed-to-seed spread measured in docs/attentionlite-demo-budgets.md."]
        return Table(frame, title + f" (profile {ds.attrs.get('profile')})", notes)

    return plot


figure("attentionlite.fig2", paper=PAPER, data=("attentionlite.fig2", "attentionlite.baselines",
                                                 "attentionlite.fig2_seeds"), plot=plot_fig2, finding=findings.FIG2,
       caption="Fig. 2 on the demo: held-out top-1 accuracy per epoch of the demo SA-ResNet (every 3×3 convolution a local "
               "self-attention layer) sparse-distilled from the CNN teacher with irregular pruning at d = 0.25 (the "
               "paper's Fig. 2 density), with KD (logits) and with KD+AT (logits + attention transfer at every stage); "
               "the teacher dotted. The demo trains 6 short epochs of 1600 images (the paper: 200 on CIFAR); the curves are "
               "seed 0's, the circles the final accuracy of every seed of the profile's budget (demo: 3 seeds per loss). "
               "The verdict tests KD+AT − KD per seed, paired on the same held-out images, with a t interval over the "
               "seeds (it covers seed-to-seed spread, ≈ 2 points at the earlier budget, and image noise; "
               "attentionlite.fig2_seeds).")
figure("attentionlite.fig3", paper=PAPER, data=("attentionlite.fig3", "attentionlite.baselines"), plot=_curves_plot(3),
       finding=findings.FIG3,
       caption="Fig. 3 on the demo: as Fig. 2 with column pruning at d = 0.5 (whole columns of each layer's C_out × C_in·k·k "
               "weight matrix); accuracy of the masked model per epoch; the saved deploy model is the shrunk one, equal to "
               "the masked model to ≤ 1e-4 in its logits (recorded per run).")
figure("attentionlite.density", paper=PAPER, data="attentionlite.density", plot=plot_density, finding=findings.DENSITY,
       caption="Per-layer density under sparse momentum (Algorithm 1): the kept fraction of every pruned layer (rows, in "
               "forward order; the stem, each block's conv1, fused q/k/v projection, conv3 and shortcut, the classifier) "
               "during each epoch (columns), for the demo runs of both pruning kinds and losses; right: each layer's size. "
               "All layers start at the target d; after each epoch the smallest weights (columns) are pruned and regrown "
               "where the momentum is largest, which moves the budget into the small early layers (the stem, layer1 and "
               "layer2 end up nearly dense) and out of the large late ones.")
figure("attentionlite.at_maps", paper=PAPER, data="attentionlite.at_maps", plot=plot_at, finding=findings.AT_MAPS,
       caption="Attention-transfer maps ψ = F/‖F‖₂, F = mean over channels of |activation|² (§3), of every residual stage "
               "for one held-out digit: the CNN teacher (top) and its SA-ResNet students distilled with KD and with KD+AT "
               "(irregular, d = 0.25). Stage maps have 28, 14, 7 and 4 cells per side in teacher and student alike; each "
               "cell is drawn over the pixels it covers (stride 1, 2, 4, 8; no interpolation), one colour scale per stage, "
               "white contour: the digit. Right: the distance ‖ψ_student − ψ_teacher‖₂ per stage (mean over the analysis "
               "images; the quantity Eq. 2's AT term penalises) for every demo student. The verdict pairs the per-image "
               "distances of the KD+AT and KD students in every (pruning, stage) cell: a difference whose 95 % interval "
               "contains 0 is a tie.")
figure("attentionlite.local_attention", paper=PAPER, data="attentionlite.local_attention", plot=plot_query,
       caption="Where the demo student looks: the local self-attention weights (Eq. 1) of the query pixel at the image "
               "centre (red cross), in every attention layer (rows) and head (columns) of the KD+AT student (irregular, "
               "d = 0.25), over the input digit. Each layer attends within a k × k = 3 × 3 window of its own grid (dashed: "
               "the window); deeper layers run on coarser grids (28, 28, 14, 7 cells; layer2's attention runs before its "
               "pooling), so the same 3 × 3 window covers 3, 3, 6 and 12 pixels.")
figure("attentionlite.table1", paper=PAPER, kind="table", data="attentionlite.table1", finding=findings.TABLE1,
       plot=_table("AttentionLite Table 1: hybrid students, reductions at paper size and accuracy on the demo",
                   ["Paper rows: accuracies are the paper's (CIFAR-10/100, Tiny-ImageNet; not trained here); densities "
                    "d = 0.1 irregular (CIFAR), 0.25 irregular (Tiny-ImageNet), 0.5 column (Table 1's caption)."]),
       caption="Table 1: hybrid (convolutional stem) SA-ResNet26/38 students — the paper's accuracies and parameter / FLOPs "
               "reductions against its ResNet50 teacher beside the reductions we count for the same architectures and "
               "densities at paper size, and the demo's measured accuracies and reductions (teacher cnn_demo).")
figure("attentionlite.table2", paper=PAPER, kind="table", data="attentionlite.table2", finding=findings.TABLE2,
       plot=_table("AttentionLite Table 2: homogeneous students, reductions at paper size and accuracy on the demo",
                   ["Paper rows: homogeneous (attention stem) students with KD+AT, d = 0.25 irregular and 0.5 column "
                    "(Table 2's caption); accuracies are the paper's.",
                    "No demo rows: the demo profile trains no homogeneous student (budget), and its hybrid students "
                    "are in Table 1; `workbench run attentionlite --stem attention` trains one (measured once: see "
                    "docs/attentionlite-demo-budgets.md)."]),
       caption="Table 2: homogeneous (attention stem) SA-ResNet26/38 students with KD+AT — the paper's accuracies and "
               "reductions beside the reductions we count at paper size (no demo rows: the demo trains hybrid "
               "students only, shown in Table 1).")
figure("attentionlite.baselines", paper=PAPER, data="attentionlite.baselines", plot=plot_baselines,
       finding=findings.BASELINES,
       caption="What distillation buys, tested on the same held-out images: held-out top-1 of the demo SA-ResNet "
               "trained with the same budget, pruning schedule and seed three ways at each figure density (irregular "
               "d = 0.25, column d = 0.5): on the labels alone (no teacher), with KD (logits) and with KD+AT (logits + "
               "attention transfer); and the dense student (d = 1) trained on the labels alone — the paper's "
               "'unoptimised student' of Table 1; the teacher dotted. Bars: 95 % Wilson intervals; differences are "
               "tested paired in the verdict. The accuracy axis is zoomed (it does not start at 0).")
