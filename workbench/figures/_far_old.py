"""FAR figures and tables (Ren et al., "Is Attention Required for Transformer Inference? Explore
Function-preserving Attention Replacement", papers/000): the paper's Fig. 4–6, 9–14 and Tables 1–3
on the demo (teacher ``teacher-vit-<profile>``, runs of :mod:`workbench.pipelines.far`), plus the
per-layer agreement of FAR's token maps with the teacher's (``far.agreement``).

Token maps compare three things on the profile's analysis images: the teacher's attention
probabilities (what the paper shows for DeiT), the teacher's gradient saliency and FAR's gradient
saliency (what the paper shows for FAR), with respect to each block's token-mixer input
(``wrt="mixer_input"``, :mod:`workbench.analysis.dependency`), drawn as extracted — probabilities
and gradient norms, each unit on its own stated colour scale — as the paper draws them; the
agreement scores use row-normalised maps (:mod:`workbench.analysis.compare` says why).

Layers of App. C (Fig. 9–14): the paper shows DeiT-Tiny's layers 0, 5 and 7 of 12 as shallow,
intermediate and deep. We take the block at the same relative depth, round(p / 11 · (L − 1)) for
paper layer p and our L blocks — 0, 2 and 3 for the 6-block demo ViT — rather than first / middle /
last: the paper's "deep" layer 7 is not DeiT-Tiny's last block (its last is 11), and our
token-level findings should be read at the positions the paper read them.
"""

from __future__ import annotations

import pandas as pd

from workbench.figures import Context, Table, figure
from workbench.figures.prepare import step

#: Shallow, intermediate and deep layer of App. C (DeiT-Tiny: 0, 5, 7 of 12); for the 6-block demo ViT: 0, 2, 3.
PAPER_LAYERS = {"fig9": 0, "fig10": 5, "fig11": 7, "fig12": 0, "fig13": 5, "fig14": 7}
PAPER_DEPTH = 12  # DeiT-Tiny's blocks
MODELS = ("teacher attention", "teacher saliency", "FAR saliency")
#: what the saliency maps differentiate by (workbench.analysis.dependency): the token-mixer input
WRT = "mixer_input"


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
    """Token maps (as extracted) of teacher attention, teacher saliency and FAR saliency, and the teacher store."""
    from workbench.analysis.compare import stack_maps

    teacher, far, _ = _runs(ctx)
    images = ctx.profile.analysis_images
    att = ctx.analysis("attention", teacher.id, images)
    maps = stack_maps(dict(zip(MODELS, (att, ctx.analysis("dependency", teacher.id, images, wrt=WRT),
                                        ctx.analysis("dependency", far.id, images, wrt=WRT)))))
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


@step("far.table3", after=("teacher-vit",), cost=145)  # 4 schedules x 2 epochs at batch 16
def train_table3(ctx: Context):
    _table3_runs(ctx)


def relative_layer(maps, paper_layer: int, paper_depth: int = PAPER_DEPTH) -> int:
    """Our block at the relative depth of the paper's DeiT-Tiny layer: round(p / (12 − 1) · (L − 1)) (module docstring)."""
    layers = sorted(int(v) for v in maps["layer"].values)
    depth = layers[-1] + 1
    want = round(paper_layer / (paper_depth - 1) * (depth - 1))
    return min(layers, key=lambda lay: abs(lay - want))


# ---------------------------------------------------------------------------------------- figures
@figure("far.fig4", paper="far", needs=("far_pruned-vit", "retention"), steps=("far.maps",),
        caption="Fig. 4: share of hidden units each LSTM head keeps after DeepHoyer structured pruning of the demo FAR "
                "model (rows: layers, columns: heads), forward and reverse directions separately; numbers are percent.")
def fig4(ctx: Context):
    from workbench.plots.far import plot_retention

    _, _, pruned = _runs(ctx)
    ds = ctx.analysis("retention", pruned.id, ctx.profile.analysis_images)
    return plot_retention(ds)


_UNITS = ("attention in probability, saliency in gradient norm (‖∂Σ_c y_q / ∂LN1(x)_k‖₂), each on its own "
          "stated colour scale, not row-normalised")


@figure("far.fig5", paper="far", needs=("teacher-vit", "far-vit", "attention", "dependency"), steps=("far.maps",),
        caption="Fig. 5: token importance of the CLS token in the last block, per head: the teacher's attention "
                "probabilities (top) and the FAR model's gradient saliency w.r.t. the block's token-mixer input "
                "(bottom), drawn over the input digit; each model's heads share one colour scale, so a weak head "
                f"looks weak ({_UNITS}).")
def fig5(ctx: Context):
    from workbench.plots.far import plot_cls_comparison

    maps, att = _maps(ctx)
    s = int(maps.sample[0])
    return plot_cls_comparison(maps, att["image"].sel(sample=s).values, sample=s, layers=[_last(maps)],
                               models=["teacher attention", "FAR saliency"],
                               title=f"CLS token importance per head, last layer · teacher vs FAR · sample {s}")


@figure("far.fig6", paper="far", needs=("teacher-vit", "far-vit", "attention", "dependency"), steps=("far.maps",),
        caption="Fig. 6: token-to-token dependency in the last block, averaged over heads and samples (App. C.2): "
                "teacher attention, teacher gradient saliency and FAR gradient saliency; the two saliencies share one "
                f"colour scale ({_UNITS}; a bright row is a query whose output depends strongly on its inputs).")
def fig6(ctx: Context):
    from workbench.plots.far import plot_token_maps

    maps, _ = _maps(ctx)
    return plot_token_maps(maps, layer=_last(maps))


def _last(maps) -> int:
    return max(int(v) for v in maps["layer"].values)


def _depth_note(maps, fig_id: str) -> str:
    layer = relative_layer(maps, PAPER_LAYERS[fig_id])
    return f"block {layer} of {_last(maps) + 1} (paper: DeiT-Tiny layer {PAPER_LAYERS[fig_id]} of {PAPER_DEPTH}, same relative depth)"


def _cls_figure(fig_id: str):
    def build(ctx: Context):
        from workbench.plots.far import plot_cls_comparison

        maps, att = _maps(ctx)
        s = int(maps.sample[0])
        heads = [int(h) for h in maps["head"].values[:3]]
        return plot_cls_comparison(maps, att["image"].sel(sample=s).values, sample=s, layers=[relative_layer(maps, PAPER_LAYERS[fig_id])],
                                   heads=heads, models=["teacher attention", "FAR saliency"],
                                   title=f"CLS → patch, {_depth_note(maps, fig_id)} · sample {s}")

    return build


def _token_figure(fig_id: str):
    def build(ctx: Context):
        from workbench.plots.far import plot_token_maps

        maps, _ = _maps(ctx)
        return plot_token_maps(maps, layer=relative_layer(maps, PAPER_LAYERS[fig_id]),
                               title=f"Token-to-token dependency, {_depth_note(maps, fig_id)} · mean over heads and samples")

    return build


_DEPTH = {"fig9": "shallow", "fig10": "intermediate", "fig11": "deep", "fig12": "shallow", "fig13": "intermediate",
          "fig14": "deep"}
_WHERE = ("the block at the paper's relative depth (DeiT-Tiny layer {p} of 12 → block round({p}/11·(L−1)) of our L; "
          "block {d} of the 6-block demo ViT)")
for _id in ("fig9", "fig10", "fig11"):
    _p = PAPER_LAYERS[_id]
    figure(f"far.{_id}", paper="far", needs=("teacher-vit", "far-vit", "attention", "dependency"), steps=("far.maps",),
           caption=f"Fig. {_id[3:]} (App. C.1): CLS-to-patch maps of three heads in the {_DEPTH[_id]} block — "
                   + _WHERE.format(p=_p, d=round(_p / 11 * 5))
                   + " — teacher attention (top) above FAR gradient saliency (bottom), over the input digit; each "
                     f"model's heads share one colour scale ({_UNITS}).",
           )(_cls_figure(_id))
for _id in ("fig12", "fig13", "fig14"):
    _p = PAPER_LAYERS[_id]
    figure(f"far.{_id}", paper="far", needs=("teacher-vit", "far-vit", "attention", "dependency"), steps=("far.maps",),
           caption=f"Fig. {_id[3:]} (App. C.2): token-to-token dependency in the {_DEPTH[_id]} block — "
                   + _WHERE.format(p=_p, d=round(_p / 11 * 5))
                   + " — averaged over heads and samples: teacher attention, teacher gradient saliency, FAR gradient "
                     f"saliency; the two saliencies share one colour scale ({_UNITS}; horizontal bands = queries whose "
                     "output depends strongly on their inputs).",
           )(_token_figure(_id))


@figure("far.agreement", paper="far", needs=("teacher-vit", "far-vit", "attention", "dependency"), steps=("far.maps",),
        caption="Per-layer agreement of token-to-token maps (head-averaged, per sample; mean ± sd over the analysis "
                "images), saliency taken w.r.t. each block's token-mixer input. Paper-style: FAR saliency vs teacher "
                "attention, with the teacher's own saliency vs its attention as the ceiling a perfect copy could reach "
                "under the change of measure; like-for-like: FAR saliency vs teacher saliency. Correlations use "
                "row-normalised maps (attention rows sum to 1 and carry no per-query magnitude, so raw values would score "
                "FAR on a quantity the reference lacks), except 'like-for-like, raw', which compares the two saliencies' "
                "stored values and so also scores per-query magnitude (the bands of Fig. 12–14). Spearman ρ / Pearson r "
                "over all T×T entries; Jensen–Shannon divergence (bits) between corresponding row-normalised query rows, "
                "averaged over rows.")
def agreement_figure(ctx: Context):
    from workbench.analysis.compare import agreement
    from workbench.plots.far import plot_agreement

    maps, _ = _maps(ctx)
    saliencies = maps.sel(model=["teacher saliency", "FAR saliency"]).assign_attrs(maps.attrs)
    paper_style = agreement(maps, reference="teacher attention")
    like = agreement(saliencies, reference="teacher saliency")
    raw = agreement(saliencies, reference="teacher saliency", normalize="none")[["pearson", "spearman", "cls_pearson"]]
    return plot_agreement({"paper-style": paper_style, "like-for-like": like, "like-for-like, raw": raw})


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
                "with the profile's short ablation budget, the same for all four, beside the paper's ImageNet numbers, with "
                "the ordering of the schedules compared to the paper's.")
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
             _ordering(res, PAPER_TABLE3, cols),
             f"teacher: {100 * teacher.manifest['results']['val_acc']:.1f}% ({teacher.id}); runs: "
             + ", ".join(r.id for r in runs.values()) + "."]
    return Table(pd.DataFrame(rows), f"FAR Table 3 on the demo (profile {ctx.profile.name})", notes)


def _ordering(res: dict, paper: dict, cols: dict) -> str:
    """Our schedules sorted by accuracy after distillation, beside the paper's orderings (Table 3)."""
    def order(acc: dict) -> str:
        ranked = sorted(acc, key=lambda k: acc[k])
        return " < ".join(cols[k] for k in ranked)

    acc = {k: v["distill_val_acc"] for k, v in res.items()}
    ours = order(acc)
    theirs = "; ".join(f"{name}: {order(vals)}" for name, vals in paper.items())
    same = [name for name, vals in paper.items() if order(vals) == ours]
    verdict = f"the same as the paper's {' and '.join(same)}" if same else "not the paper's ordering"
    best = max(acc, key=acc.get)
    paper_best = {max(vals, key=vals.get) for vals in paper.values()}
    if not same and paper_best == {best}:
        verdict += f", though {cols[best]} is best here too, as in every row of the paper"
    return f"ordering after distillation here: {ours} — {verdict} (paper, ImageNet: {theirs})."


@figure("far.table2", paper="far", kind="table", needs=("teacher-vit", "far-vit", "far_pruned-vit"), steps=("far",),
        caption="Table 2: parameters, MACs ('FLOPs' in the paper's fvcore convention) and single-thread CPU latency at "
                "224² and 384² of DeiT-Tiny/Small/Base, their FAR versions and uniformly pruned FAR† versions at real "
                "size (random weights), plus the demo models, with the paper's numbers beside.")
def table2(ctx: Context) -> Table:
    from workbench.figures.far_table2 import table2_frame

    return table2_frame(ctx, _runs(ctx))
