"""SlimSwin figures and tables (Eryilmaz & Akturk, papers/004), on the demo Swin and at real size.

The demo Swin (``swin_demo``: digits padded to 32 x 32, patch 2, window 4, depths (2, 2, 2), heads
(3, 6, 12)) has 16 windows in stage 0, 4 in stage 1 and a single window in its last stage, which SlimSwin
never prunes (§V-A): its 144 prunable pairs are 2 layers x 16 windows x 3 heads + 2 layers x 4 windows x 6
heads. The sweep behind Figs. 2, 4, 6, 7 and Table I runs :func:`workbench.pipelines.slimswin.run.run_sweep`
(r = 1/3, 4/9, 5/9, 2/3, each run continuing the previous one's iterations). MAC counts at real size
(Fig. 1, Table I) need no weights.
"""

from __future__ import annotations

import json
from fractions import Fraction

import pandas as pd
import xarray as xr

from workbench.figures import dataset, figure, student
from workbench.figures.slimswin import findings
from workbench.figures.context import Context
from workbench.plots.table import Table

PAPER = "slimswin"


def _ratio_label(r: float) -> str:
    """``1/3 (0.33)`` for a paper ratio, ``0.30`` otherwise."""
    f = Fraction(r).limit_denominator(9)
    return f"{f} ({r:.2f})" if abs(float(f) - r) < 1e-9 and f.denominator > 1 else f"{r:.2f}"


def sweep(ctx: Context):
    """The teacher and the profile's SlimSwin runs (one per ratio, ascending), trained or reused."""
    from workbench.pipelines.slimswin.run import run_sweep

    teacher = ctx.teacher("swin")
    return teacher, [ctx.use_run(r) for r in run_sweep(teacher.id, ctx.profile.name, device=ctx.device, log=ctx.log)]


def _student(index: int):
    def run(ctx: Context):
        return sweep(ctx)[1][index]

    return run


def _deploy(model):
    """The deploy form of a gated SlimSwin model: attention computes only the kept window-head pairs."""
    from workbench.pipelines.slimswin.measures import deploy_form

    return deploy_form(model)


student("SlimSwin r=1/3", method="slimswin", teacher="swin", after=("slimswin.sweep",), deploy=_deploy)(_student(0))
student("SlimSwin r=2/3", method="slimswin", teacher="swin", after=("slimswin.sweep",), deploy=_deploy)(_student(-1))


# ---------------------------------------------------------------------------------------- data
@dataset("slimswin.breakdown")
def breakdown_data(ctx: Context) -> xr.Dataset:
    """Component-wise FLOPs of Swin-T and Swin-B at 224 (from the architecture; no weights)."""
    from workbench.pipelines.slimswin.measures import flops_breakdown

    parts = flops_breakdown()
    comps = [c for c in parts["Swin-T"] if c != "total"]
    return xr.Dataset({"flops": (("model", "component"), [[parts[m][c] for c in comps] for m in parts])},
                      coords={"model": list(parts), "component": comps})


@dataset("slimswin.sweep", after=("teacher.swin",))
def sweep_data(ctx: Context) -> xr.Dataset:
    """Accuracy, achieved ratio and MAC reduction per requested ratio, with each run's results for Table I."""
    from workbench.plots.slimswin_views import accuracy

    _, runs = sweep(ctx)
    results = {float(r.config["slimswin"]["target_ratio"]): r.manifest["results"] for r in runs}
    ds = accuracy(results, teacher=runs[0].manifest["results"]["teacher_val_acc"])
    ratios = list(ds.ratio.values)
    keys = ("pruned_pairs", "prunable_pairs", "attention_macs", "attention_macs_unpruned")
    ds = ds.assign({k: ("ratio", [results[r][k] for r in ratios]) for k in keys})
    return ds.assign_coords(run=("ratio", [r.id for r in runs])).assign_attrs(
        step_pairs=int(runs[0].config["slimswin"]["step_pairs"]))


@dataset("slimswin.baselines", after=("slimswin.sweep",))
def baselines_data(ctx: Context) -> xr.Dataset:
    """SlimSwin's masks against random and uniform-per-layer ones at the same r: per-image held-out correctness,
    without fine-tuning (masks on the teacher's weights) and fine-tuned alike (:mod:`workbench.pipelines.slimswin.baselines`)."""
    from workbench.pipelines import budget
    from workbench.pipelines.slimswin.baselines import mask_comparison

    teacher, runs = sweep(ctx)
    b = budget("slimswin", ctx.profile)
    by_ratio = {float(r.config["slimswin"]["target_ratio"]): r for r in runs}
    base = {(float(r), c): ctx.run("slimswin", teacher.id, ratio=float(r), masks=c)
            for r in b.baseline_ratios for c in ("random", "uniform")}
    return mask_comparison(teacher, by_ratio, base, ctx.profile.name, b.baseline_seeds, device=ctx.device)


@dataset("slimswin.fig4_seeds", after=("teacher.swin",))
def fig4_seeds_data(ctx: Context) -> xr.Dataset:
    """Per-seed held-out correctness at the largest fine-tuned baseline ratio r, for every seed of the budget's
    ``run_seeds`` (:mod:`workbench.figures.seeds`): ``correct(stage, masks, seed, sample)`` — fine-tuned: the SlimSwin
    run and its random / uniform baselines of that seed; no fine-tune: that seed's learned masks, and the baselines'
    masks as in ``slimswin.baselines`` (the mean over ``baseline_seeds`` draws, the same for every seed), on the
    teacher's weights — with ``teacher_correct(sample)``. The other seeds train first (a seed's SlimSwin run starts
    from the teacher: the same as the chained sweep, at r only); the first seed's runs (the sweep's and
    ``slimswin.baselines``') are reused last."""
    import numpy as np

    from workbench.figures.seeds import correctness_by_seed
    from workbench.pipelines import budget
    from workbench.pipelines.slimswin.run import load_masks
    from workbench.pipelines.slimswin.baselines import MASK_CHOICES, baseline_masks, masked_correctness

    b = budget("slimswin", ctx.profile)
    teacher = ctx.teacher("swin")
    r = float(max(b.baseline_ratios or b.ratios))
    choices = ("random", "uniform") if b.baseline_ratios else ()
    runs = {}
    for s in b.run_seeds[1:]:
        runs[("saliency", s)] = ctx.run("slimswin", teacher.id, ratio=r, seed=s)
        runs.update({(c, s): ctx.run("slimswin", teacher.id, ratio=r, masks=c, seed=s) for c in choices})
    first = b.run_seeds[0]
    runs[("saliency", first)] = {float(x.config["slimswin"]["target_ratio"]): x for x in sweep(ctx)[1]}[r]
    runs.update({(c, first): ctx.run("slimswin", teacher.id, ratio=r, masks=c, seed=first) for c in choices})
    tuned = correctness_by_seed(ctx, runs)
    seeds = [int(s) for s in tuned.seed.values]
    base = ctx.model(teacher)
    learned = {s: load_masks(runs[("saliency", s)]) for s in seeds}
    pruned = int(sum(int((~m).sum()) for m in learned[first]))
    masks = {**{f"saliency/{s}": m for s, m in learned.items()},
             **{f"{c}/{d}": baseline_masks(base, pruned, c, seed=d) for c in ("random", "uniform") for d in b.baseline_seeds}}
    got = masked_correctness(teacher, masks, ctx.profile.name, ctx.device, runs[("saliency", first)].config["slimswin"][
        "gate_mode"])
    n = tuned.sizes["sample"]
    correct = np.full((2, len(MASK_CHOICES), len(seeds), n), np.nan)  # (stage, masks, seed, sample)
    for j, s in enumerate(seeds):
        correct[0, 0, j] = got[f"saliency/{s}"]
        for i, c in enumerate(MASK_CHOICES[1:], start=1):
            correct[0, i, j] = np.mean([got[f"{c}/{d}"] for d in b.baseline_seeds], axis=0)
    for i, c in enumerate(MASK_CHOICES):
        if c in tuned.arm.values:
            correct[1, i] = tuned["correct"].sel(arm=c).values
    return xr.Dataset(
        {"correct": (("stage", "masks", "seed", "sample"), correct),
         "teacher_correct": ("sample", got["teacher"].astype(float)), "run": tuned["run"]},
        coords={"stage": ["no fine-tune", "fine-tuned"], "masks": list(MASK_CHOICES), "seed": seeds,
                "sample": np.arange(n)},
        attrs={"ratio": r, "pruned_pairs": pruned, "draws": json.dumps(list(b.baseline_seeds))})


@dataset("slimswin.masks", after=("slimswin.sweep",))
def masks_data(ctx: Context) -> xr.Dataset:
    """The ``window_saliency`` Dataset (masks included) of every run of the sweep, along ``ratio``."""
    _, runs = sweep(ctx)
    parts = [ctx.analysis("window_saliency", r.id, ctx.profile.analysis_images).load()
             .expand_dims(ratio=[float(r.config["slimswin"]["target_ratio"])]) for r in runs]
    return xr.concat(parts, dim="ratio", data_vars="minimal", coords="minimal", compat="override",
                     join="outer")


@dataset("slimswin.saliency", after=("teacher.swin",))
def saliency_data(ctx: Context) -> xr.Dataset:
    """Window-head saliency of the unpruned teacher on the recipe's saliency images."""
    return ctx.analysis("window_saliency", ctx.teacher("swin").id, ctx.budget("slimswin").saliency_images).load()


@dataset("slimswin.table1", after=("slimswin.sweep",))
def table1_data(ctx: Context) -> xr.Dataset:
    """Attention MACs under the paper's ratios at real size (Algorithm 1's pair counts at i = 32) and on the demo."""
    from workbench.pipelines.slimswin.measures import table1_real_size
    from workbench.xrutils import rows_to_dataset

    rows, facts = table1_real_size(_ratio_label)
    demo = ctx.data("slimswin.sweep")
    first = demo.isel(ratio=0)
    rows.append({"model": "demo Swin", "r": "unpruned", "pruned pairs": f"0/{int(first.prunable_pairs)}",
                 "achieved ratio": 0.0, "attention MACs": float(f"{float(first.attention_macs_unpruned):.4g}"),
                 "masks": "none"})
    for r in demo.ratio.values:
        d = demo.sel(ratio=r)
        rows.append({"model": "demo Swin", "r": _ratio_label(float(r)),
                     "pruned pairs": f"{int(d.pruned_pairs)}/{int(d.prunable_pairs)}",
                     "achieved ratio": round(float(d.achieved_ratio), 4), "attention MACs": float(f"{float(d.attention_macs):.4g}"),
                     "reduction (%)": round(100 * float(d.mac_reduction), 2), "masks": f"learned ({str(d.run.values)})"})
    facts = {**facts, "demo_step": int(demo.attrs["step_pairs"]), "demo_total": int(first.prunable_pairs)}
    return rows_to_dataset(rows).assign_attrs(facts=json.dumps(facts))


# ---------------------------------------------------------------------------------------- plots
def plot_fig1(ds: xr.Dataset):
    from workbench.plots.slimswin import plot_flops_breakdown

    return plot_flops_breakdown(ds)


def plot_fig2(masks: xr.Dataset):
    from workbench.plots.slimswin import plot_kept_heads

    image = masks["image"].isel(ratio=0, sample=0).values
    fig = plot_kept_heads({f"r = {_ratio_label(float(r))}": masks.sel(ratio=r) for r in masks.ratio.values}, image=image)
    fig.suptitle(f"Heads kept per window by SlimSwin in the demo Swin (profile {masks.attrs.get('profile')})")
    return fig


def plot_fig3(ds: xr.Dataset):
    from workbench.plots.slimswin import plot_window_saliency

    mean = ds["image"].mean("sample")
    fig = plot_window_saliency(ds, image=mean.values / max(1e-6, float(mean.max())))
    fig.suptitle(f"Window-head saliency before pruning ({ds.sizes['sample']} held-out images)")
    return fig


def _with_intervals(base: xr.Dataset) -> xr.Dataset:
    """``accuracy`` and its 95 % Wilson interval per (stage, masks, ratio) from the per-image correctness."""
    from workbench.figures.verdicts import accuracy_intervals

    return accuracy_intervals(base["correct"]).assign(teacher_accuracy=base["teacher_correct"].mean()).assign_coords(
        sample=base["sample"])


def _mark_seeds(ax, seeds: xr.Dataset, stage: str) -> None:
    """Each seed's accuracy at the seeds' ratio, one hollow marker per seed beside each choice's point."""
    import numpy as np

    from workbench.plots.slimswin import MASK_STYLES

    acc = 100 * seeds["correct"].sel(stage=stage).mean("sample")  # (masks, seed)
    r = float(seeds.attrs["ratio"])
    for i, choice in enumerate(acc.masks.values):
        vals = acc.sel(masks=choice).values
        vals = vals[np.isfinite(vals)]
        _, color, _ = MASK_STYLES.get(str(choice), ("x", "0.4", str(choice)))
        ax.scatter(np.full(vals.size, r + 0.012 * (i + 1)), vals, s=20, facecolors="none", edgecolors=color, lw=1.0,
                   zorder=4, label=f"each of {seeds.sizes['seed']} seeds" if i == 0 else None)
    ax.legend(fontsize="x-small", frameon=True, framealpha=0.9, loc="best")


def plot_fig4(ds: xr.Dataset, base: xr.Dataset, by_seed: xr.Dataset | None = None):
    import matplotlib.pyplot as plt

    from workbench.plots.slimswin import plot_accuracy_vs_ratio, plot_mask_baselines

    acc = _with_intervals(base)
    fig, axes = plt.subplots(1, 3, figsize=(14.5, 4.0), layout="constrained")
    plot_accuracy_vs_ratio(ds, ax=axes[0], title="SlimSwin: accuracy vs ratio")
    plot_mask_baselines(acc, "fine-tuned", ax=axes[1], title="Same r, fine-tuned alike")
    seeds = json.loads(base.attrs["seeds"])
    plot_mask_baselines(acc, "no fine-tune", ax=axes[2],
                        title=f"Same r, teacher weights, no fine-tune (baselines: mean of {len(seeds)} draws)")
    if by_seed is not None:
        _mark_seeds(axes[1], by_seed, "fine-tuned")
        _mark_seeds(axes[2], by_seed, "no fine-tune")
    low = min(a.get_ylim()[0] for a in axes)
    for a in axes:
        a.set_ylim(low, 100.5)
    fig.suptitle(f"SlimSwin on the demo Swin (profile {ds.attrs.get('profile')}): accuracy, and which pairs to prune "
                 f"(error bars: 95 % Wilson intervals over {base.sizes['sample']} held-out images)")
    return fig


def _layer_ratio_plot(ratio: float):
    def plot(masks: xr.Dataset):
        from workbench.plots.slimswin import plot_layer_ratio
        from workbench.plots.slimswin_views import layer_ratio

        ds = layer_ratio({float(r): masks.sel(ratio=r) for r in masks.ratio.values})
        return plot_layer_ratio(ds, ratio, title=f"Layer-wise pruning ratios of the demo Swin (r = {_ratio_label(ratio)})")

    return plot


def table1(ds: xr.Dataset) -> Table:
    from workbench.xrutils import dataset_rows

    f = json.loads(ds.attrs["facts"])
    step = f["step"]
    notes = [
        "Convention (methods.slimswin.flops): per active (window, head) pair with N tokens per window, block width C and "
        "head width d: QKV N*C*3d + QK^T N*N*d + AV N*N*d + output projection N*d*C MACs; biases, scale, relative position "
        "bias, masks and softmax not counted; all 24 (Swin-B) / 12 (Swin-T) layers, the unpruned last stage included. "
        "The same count as methods.flops.count_macs on timm's modules with fused attention (tests/test_slimswin_method.py).",
        f"Swin-B unpruned: {f['swin_b']:.4g} MACs, the paper's 5.24e9 reproduced.",
        f"Swin-T unpruned: {f['swin_t']:.4g} MACs; the paper's 2.61e9 is NOT reproduced by Swin-T (C = 96) under any "
        f"counting convention we tried, nor by a Swin with Swin-T's depths at C = 128 ({f['swin_t_c128']:.4g}).",
        "r: the paper's four uniformly spaced ratios 1/3, 4/9, 5/9, 2/3 (printed 0.33, 0.44, 0.55, 0.67). Algorithm 1 "
        f"prunes i = {step} pairs per iteration until r is reached, so it stops at the first multiple of {step} at or above "
        "r x pairs: exactly r for Swin-T's 864 prunable pairs, but 0.45 and 0.567 instead of 4/9 and 5/9 for Swin-B's 1920.",
        "Real-size Swins have no trained weights here, so no saliency: their rows ASSUME the pruned pairs spread over the "
        "prunable layers in proportion to each layer's pairs (methods.slimswin.uniform_masks); a learned allocation that "
        "prunes more in cheap (or costly) layers changes the number.",
        f"'r x prunable share': the reduction if exactly the share r of every prunable layer's pairs were pruned "
        f"(prunable share of the attention MACs: {100 * f['share_b']:.2f} % for Swin-B, {100 * f['share_t']:.2f} % "
        "for Swin-T). The paper's Swin-B reductions equal this column within 0.05 points, including 4/9 and 5/9, which "
        f"Algorithm 1 with i = {step} cannot reach; its Swin-T reductions are r x 84.0 %, 0.3 points below.",
        f"Demo Swin rows use the masks learned by SlimSwin here (profile {ds.attrs.get('profile')}, i = {f['demo_step']} "
        f"pairs per iteration, {f['demo_total']} prunable pairs).",
    ]
    frame = pd.DataFrame(dataset_rows(ds)).astype(object)
    frame = frame.where(frame.notna(), None)  # empty cells, not "nan"
    return Table(frame, "Attention MAC reduction under different global pruning ratios (SlimSwin Table I)", notes)


# ---------------------------------------------------------------------------------------- figures
figure("slimswin.fig1", paper=PAPER, data="slimswin.breakdown", plot=plot_fig1, finding=findings.FIG1,
       caption="Component-wise FLOPs per 224 x 224 image of Swin-T and Swin-B (the paper's Fig. 1), counted from the "
               "architecture (methods.slimswin.swin_flops_breakdown; 1 MAC = 2 FLOPs; LayerNorm counted as one MAC per "
               "element; softmax, GELU and additions not counted). Attention (QKV projection, QK^T and AV, output "
               "projection) is about a third of Swin-T's 9.0 GFLOPs (4.5 GMACs).")
figure("slimswin.fig2", paper=PAPER, data="slimswin.masks", plot=plot_fig2, finding=findings.FIG2,
       caption="Gate masks of the demo Swin after SlimSwin pruning (the paper's Figs. 2-3 recast as data): for each "
               "global ratio r (rows) and each prunable layer (columns), the number of heads every window keeps (the "
               "colour: share of the layer's heads), drawn at pixel scale with the window borders in grey and the outline "
               "of a held-out digit; SW marks the shifted-window layers, whose windows wrap around the image. The last "
               "stage (one window) is never pruned. Which heads: plot_gate_masks in notebooks/05_slimswin.ipynb.")
figure("slimswin.fig3", paper=PAPER, data="slimswin.saliency", plot=plot_fig3, finding=findings.FIG3,
       caption="Window-head saliency of the unpruned demo Swin before pruning: |mean over held-out images of "
               "d cross-entropy / d gate| for every window (painted over its pixels, borders in white) of each "
               "prunable layer (rows) and head (columns) -- the score Algorithm 1 ranks globally, least salient pruned "
               "first. White contour: the mean digit of the images.")
figure("slimswin.fig4", paper=PAPER, data=("slimswin.sweep", "slimswin.baselines", "slimswin.fig4_seeds"), plot=plot_fig4,
       finding=findings.FIG4,
       caption="Held-out top-1 accuracy of the demo Swin pruned by SlimSwin against the achieved global ratio of pruned "
               "window-head pairs (r = 1/3, 4/9, 5/9, 2/3 above each point, reached exactly: 48 / 64 / 80 / 96 of the demo's "
               "144 prunable pairs at 8 pairs per iteration), after the iterative phase alone and after the final "
               "fine-tune, with the unpruned teacher dotted (the paper's Fig. 4 for Swin-T on ImageNet). Middle and "
               "right: the baselines the claim is about, at the same number of pruned pairs: random pairs over all "
               "prunable layers, and the same share r of every layer (a prespecified layer-wise ratio, random pairs "
               "inside each layer); middle: given exactly SlimSwin's fine-tunes (the same subsets, seeds and learning "
               "rate), at the ratios the profile's budget trains them; right: the masks alone on the unpruned "
               "teacher's weights (SlimSwin's learned masks vs the mean of random draws). Hollow markers: every training "
               "seed of SlimSwin and of its fine-tuned baselines at that ratio (demo: 3; slimswin.fig4_seeds). The "
               "verdict tests each difference per seed, paired on the same held-out images, with a t interval over "
               "the seeds.")
_LAYER_CAPTION = ("Layer-wise pruning ratios of the demo Swin at global ratio r = {r} (the paper's Fig. {n}, r ≈ {p}): the "
                  "pruned share of each layer's window-head pairs that the global saliency ranking produced; numbers are "
                  "pruned / all pairs; the last stage (single window) is not pruned.")
figure("slimswin.fig6", paper=PAPER, data="slimswin.masks", plot=_layer_ratio_plot(1 / 3), finding=findings.FIG6,
       caption=_LAYER_CAPTION.format(r="1/3", n=6, p=0.33))
figure("slimswin.fig7", paper=PAPER, data="slimswin.masks", plot=_layer_ratio_plot(2 / 3), finding=findings.FIG7,
       caption=_LAYER_CAPTION.format(r="2/3", n=7, p=0.67))
figure("slimswin.table1", paper=PAPER, kind="table", data="slimswin.table1", plot=table1, finding=findings.TABLE1,
       caption="Attention MACs per image (QKV projection, QK^T, AV and output projection of every layer) and their "
               "reduction under global pruning ratio r = 1/3, 4/9, 5/9, 2/3 (the paper's Table I, printed there as "
               "0.33 ... 0.67), for Swin-B and Swin-T at 224 x 224 with the pairs Algorithm 1 reaches at i = 32 pairs per "
               "iteration, beside r x the prunable share and the paper's numbers; and for the demo Swin with the masks "
               "SlimSwin learned here.")
