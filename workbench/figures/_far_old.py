"""FAR figures and tables (Ren et al., "Is Attention Required for Transformer Inference? Explore
Function-preserving Attention Replacement", papers/000): the paper's Fig. 4–6, 9–14 and Tables 1–3
on the demo (teacher ``teacher-vit-<profile>``, runs of :mod:`workbench.pipelines.far`), plus the
per-layer agreement of FAR's token maps with the teacher's (``far.agreement``).

Token maps compare three things on the profile's analysis images: the teacher's attention
probabilities (what the paper shows for DeiT), the teacher's gradient saliency and FAR's gradient
saliency (what the paper shows for FAR), all row-normalised (:mod:`workbench.analysis.compare`).
"""

from __future__ import annotations

import pandas as pd

from workbench.figures import Context, Table, figure
from workbench.figures.prepare import step

#: Shallow, middle and deep layer of App. C (DeiT-Tiny: 0, 5, 7 of 12); for the 6-block demo ViT: 0, 3, 5.
PAPER_LAYERS = {"fig9": 0, "fig10": 5, "fig11": 7, "fig12": 0, "fig13": 5, "fig14": 7}
MODELS = ("teacher attention", "teacher saliency", "FAR saliency")


# ---------------------------------------------------------------------------------------- helpers
def _runs(ctx: Context):
    """(teacher, FAR, pruned FAR) runs of the profile, trained or reused, recorded for provenance."""
    from workbench.pipelines.far import run_far
    from workbench.runs import open_run

    teacher = ctx.teacher("vit")
    pruned = run_far(teacher.id, ctx.profile.name, device=ctx.device, log=ctx.log)
    far = open_run(pruned.config["source_run"])
    return teacher, ctx.use_run(far), ctx.use_run(pruned)


def _maps(ctx: Context):
    """Row-normalised token maps of teacher attention, teacher saliency and FAR saliency, and the teacher store."""
    from workbench.analysis.compare import stack_maps

    teacher, far, _ = _runs(ctx)
    images = ctx.profile.analysis_images
    att = ctx.analysis("attention", teacher.id, images)
    maps = stack_maps(dict(zip(MODELS, (att, ctx.analysis("dependency", teacher.id, images),
                                        ctx.analysis("dependency", far.id, images)))))
    return maps, att


def _table3_runs(ctx: Context) -> dict:
    """schedule -> the Table 3 ablation run (trained or reused), recorded for provenance."""
    from workbench.pipelines.far import run_far_ablation

    teacher = ctx.teacher("vit")
    return {s: ctx.use_run(run_far_ablation(teacher.id, ctx.profile.name, s, device=ctx.device, log=ctx.log))
            for s in ("scratch", "cls", "sim", "combined")}


# ------------------------------------------------------------------------------ preparation steps
@step("far", after=("teacher-vit",), cost=160)  # FAR (distil, finetune) then its pruned run
def train_far(ctx: Context):
    _runs(ctx)


@step("far.maps", after=("far",), cost=15)
def far_maps(ctx: Context):
    _maps(ctx)
    ctx.analysis("retention", _runs(ctx)[2].id, ctx.profile.analysis_images)


@step("far.table3", after=("teacher-vit",), cost=60)
def train_table3(ctx: Context):
    _table3_runs(ctx)


def _layer(maps, paper_layer: int, paper_depth: int = 12) -> int:
    """Our layer at the same relative depth as the paper's DeiT-Tiny layer (0 -> 0, 5 -> middle, 7 -> last)."""
    layers = [int(v) for v in maps["layer"].values]
    if paper_layer == 0:
        return layers[0]
    if paper_layer == 7:
        return layers[-1]
    return layers[len(layers) // 2]


# ---------------------------------------------------------------------------------------- figures
@figure("far.fig4", paper="far", needs=("far_pruned-vit", "retention"), steps=("far.maps",),
        caption="Fig. 4: share of hidden units each LSTM head keeps after DeepHoyer structured pruning of the demo FAR "
                "model (rows: layers, columns: heads), forward and reverse directions separately; numbers are percent.")
def fig4(ctx: Context):
    from workbench.plots.far import plot_retention

    _, _, pruned = _runs(ctx)
    ds = ctx.analysis("retention", pruned.id, ctx.profile.analysis_images)
    return plot_retention(ds)


@figure("far.fig5", paper="far", needs=("teacher-vit", "far-vit", "attention", "dependency"), steps=("far.maps",),
        caption="Fig. 5: token importance of the CLS token in the last block, per head: the teacher's attention "
                "probabilities (top) and the FAR model's gradient saliency (bottom), each row-normalised over the "
                "patches and drawn over the input digit.")
def fig5(ctx: Context):
    from workbench.plots.far import plot_cls_comparison

    maps, att = _maps(ctx)
    s = int(maps.sample[0])
    return plot_cls_comparison(maps, att["image"].sel(sample=s).values, sample=s, layers=[_layer(maps, 7)],
                               models=["teacher attention", "FAR saliency"],
                               title=f"CLS token importance per head, last layer · teacher vs FAR · sample {s}")


@figure("far.fig6", paper="far", needs=("teacher-vit", "far-vit", "attention", "dependency"), steps=("far.maps",),
        caption="Fig. 6: token-to-token dependency in the last block, averaged over heads and samples (App. C.2): "
                "teacher attention, teacher gradient saliency and FAR gradient saliency, each query row normalised "
                "to sum to 1.")
def fig6(ctx: Context):
    from workbench.plots.far import plot_token_maps

    maps, _ = _maps(ctx)
    return plot_token_maps(maps, layer=_layer(maps, 7))


def _cls_figure(fig_id: str):
    def build(ctx: Context):
        from workbench.plots.far import plot_cls_comparison

        maps, att = _maps(ctx)
        layer = _layer(maps, PAPER_LAYERS[fig_id])
        s = int(maps.sample[0])
        heads = [int(h) for h in maps["head"].values[:3]]
        return plot_cls_comparison(maps, att["image"].sel(sample=s).values, sample=s, layers=[layer], heads=heads,
                                   models=["teacher attention", "FAR saliency"],
                                   title=f"CLS → patch, layer {layer} (paper: DeiT-Tiny layer {PAPER_LAYERS[fig_id]}) · sample {s}")

    return build


def _token_figure(fig_id: str):
    def build(ctx: Context):
        from workbench.plots.far import plot_token_maps

        maps, _ = _maps(ctx)
        layer = _layer(maps, PAPER_LAYERS[fig_id])
        return plot_token_maps(maps, layer=layer, title=f"Token-to-token dependency, layer {layer} (paper: DeiT-Tiny "
                                                        f"layer {PAPER_LAYERS[fig_id]}) · mean over heads and samples")

    return build


_DEPTH = {"fig9": "shallow (first)", "fig10": "middle", "fig11": "deep (last)",
          "fig12": "shallow (first)", "fig13": "middle", "fig14": "deep (last)"}
for _id in ("fig9", "fig10", "fig11"):
    figure(f"far.{_id}", paper="far", needs=("teacher-vit", "far-vit", "attention", "dependency"), steps=("far.maps",),
           caption=f"Fig. {_id[3:]} (App. C.1): CLS-to-patch maps of three heads in the {_DEPTH[_id]} block of the demo ViT, "
                   "teacher attention (top) above FAR gradient saliency (bottom), row-normalised, over the input digit.",
           )(_cls_figure(_id))
for _id in ("fig12", "fig13", "fig14"):
    figure(f"far.{_id}", paper="far", needs=("teacher-vit", "far-vit", "attention", "dependency"), steps=("far.maps",),
           caption=f"Fig. {_id[3:]} (App. C.2): token-to-token dependency in the {_DEPTH[_id]} block, averaged over heads and "
                   "samples: teacher attention, teacher gradient saliency, FAR gradient saliency (rows sum to 1).",
           )(_token_figure(_id))


@figure("far.agreement", paper="far", needs=("teacher-vit", "far-vit", "attention", "dependency"), steps=("far.maps",),
        caption="Per-layer agreement of token-to-token maps (head-averaged, row-normalised, per sample; mean ± sd over "
                "the analysis images). Paper-style: FAR saliency vs teacher attention, with the teacher's own saliency vs "
                "its attention as the ceiling a perfect copy could reach under the change of measure; like-for-like: FAR "
                "saliency vs teacher saliency. Spearman ρ / Pearson r over all T×T entries; Jensen–Shannon divergence "
                "(bits) between corresponding query rows, averaged over rows.")
def agreement_figure(ctx: Context):
    from workbench.analysis.compare import agreement
    from workbench.plots.far import plot_agreement

    maps, _ = _maps(ctx)
    paper_style = agreement(maps, reference="teacher attention")
    like = agreement(maps.sel(model=["teacher saliency", "FAR saliency"]).assign_attrs(maps.attrs), reference="teacher saliency")
    return plot_agreement({"paper-style": paper_style, "like-for-like": like})


# ------------------------------------------------------------------------------------------ tables
@figure("far.table1", paper="far", kind="table", needs=("teacher-vit", "far-vit", "far_pruned-vit"), steps=("far",),
        caption="Table 1: held-out top-1 accuracy of the demo teacher, its FAR student and the pruned FAR student, "
                "with the paper's ImageNet top-1 of DeiT / FAR / FAR† (Tiny, Small, Base) beside.")
def table1(ctx: Context) -> Table:
    from methods.far.paper import PAPER_TABLE1_IMAGENET as P

    teacher, far, pruned = _runs(ctx)
    tr, fr, pr = (r.manifest["results"] for r in (teacher, far, pruned))
    from workbench.models import load_model

    params_t = sum(p.numel() for p in load_model(teacher.id).model.parameters())
    rows = [
        ("teacher (ViT, attention)", teacher.id, tr["val_acc"], params_t, "DeiT"),
        ("FAR (BiLSTM, distilled + finetuned)", far.id, fr["val_acc"], fr["params"], "FAR"),
        (f"FAR† (pruned, {100 * pr['kept_fraction']:.0f}% units kept)", pruned.id, pr["val_acc"], pr["params"], "FAR†"),
    ]
    frame = pd.DataFrame([{
        "model": name, "run": run_id, "demo top-1 (%)": round(100 * acc, 1), "params": f"{params / 1e3:.0f}k",
        **{f"paper ImageNet {size}": P[f"{kind.replace('†', '')}-{size}{'†' if '†' in kind else ''}"]
           for size in ("Tiny", "Small", "Base")},
    } for name, run_id, acc, params, kind in rows])
    notes = [f"demo: MNIST-5k held-out set ({fr['val_images']} images), profile {ctx.profile.name}; paper: ImageNet-1k top-1 (Table 1).",
             f"FAR - teacher: {100 * (fr['val_acc'] - tr['val_acc']):+.1f} points; FAR† - teacher: "
             f"{100 * (pr['val_acc'] - tr['val_acc']):+.1f} points (paper, Tiny: +2.0 and +0.3).",
             f"pruned model before its masked finetuning: {100 * pr['pruned_before_finetune_val_acc']:.1f}%; "
             f"the physically shrunk model equals the masked one to {pr['shrunk_vs_masked_max_abs_diff']:.1e} (max |logit diff|)."]
    return Table(frame, f"FAR Table 1 on the demo (profile {ctx.profile.name})", notes)


@figure("far.table3", paper="far", kind="table", needs=("teacher-vit", "far_table3_*"), steps=("far.table3",),
        caption="Table 3: top-1 accuracy of FAR under the four loss schedules of the distillation phase — train from "
                "scratch (TFS), distill with CE only, with the block similarity only, with both (Eq. 4) — on the demo "
                "with the profile's short ablation budgets, after distillation and after finetuning, beside the paper's "
                "ImageNet numbers.")
def table3(ctx: Context) -> Table:
    from methods.far.paper import PAPER_TABLE3
    from workbench.pipelines.far import get_budget

    teacher = ctx.teacher("vit")
    runs = _table3_runs(ctx)
    cols = {"scratch": "TFS", "cls": "Distill (cls)", "sim": "Distill (sim)", "combined": "Distill (combine)"}
    rows = [{"model": f"{k} (paper, ImageNet)", **{cols[s]: v for s, v in d.items()}} for k, d in PAPER_TABLE3.items()]
    res = {s: r.manifest["results"] for s, r in runs.items()}
    b = get_budget(ctx.profile.name)
    d, f = b.ablation or (b.distill, b.finetune)
    rows.append({"model": f"demo FAR, after distillation ({d.epochs} epochs)",
                 **{cols[s]: round(100 * res[s]["distill_val_acc"], 1) for s in runs}})
    if f.epochs:
        rows.append({"model": f"demo FAR, after finetuning ({f.epochs} epochs)", **{cols[s]: round(100 * res[s]["val_acc"], 1) for s in runs}})
    tfs = f" (TFS at lr {b.scratch_lr:g}: it trains a whole ViT)" if b.scratch_lr else ""
    notes = [f"demo budgets: distillation {d.epochs} epochs at lr {d.lr:g}{tfs}, "
             + (f"then finetuning {f.epochs} epochs at lr {f.lr:g}, " if f.epochs else "no finetuning, ")
             + f"batch {d.batch_size}; the same for all four schedules. TFS re-initialises every weight and trains all of "
             "them with CE; cls and sim train only the substitutes, with CE or the block similarity (Eq. 3) alone.",
             f"teacher: {100 * teacher.manifest['results']['val_acc']:.1f}% ({teacher.id}); runs: "
             + ", ".join(r.id for r in runs.values()) + "."]
    return Table(pd.DataFrame(rows), f"FAR Table 3 on the demo (profile {ctx.profile.name})", notes)


@figure("far.table2", paper="far", kind="table", needs=("teacher-vit", "far-vit", "far_pruned-vit"), steps=("far",),
        caption="Table 2: parameters, MACs ('FLOPs' in the paper's fvcore convention) and single-thread CPU latency at "
                "224² and 384² of DeiT-Tiny/Small/Base, their FAR versions and uniformly pruned FAR† versions at real "
                "size (random weights), plus the demo models, with the paper's numbers beside.")
def table2(ctx: Context) -> Table:
    from workbench.figures.far_table2 import table2_frame

    return table2_frame(ctx, _runs(ctx))
