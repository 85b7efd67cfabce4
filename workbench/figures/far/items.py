"""FAR figures and tables (Ren et al., "Is Attention Required for Transformer Inference? Explore
Function-preserving Attention Replacement", papers/000): the paper's Fig. 4–6, 9–14 and Tables 1 and 3
on the demo (teacher ``teacher-vit-<profile>``, runs of :mod:`workbench.pipelines.far.run`), plus the
per-layer agreement of FAR's token maps with the teacher's (``far.agreement``); Table 2 is in
:mod:`workbench.figures.far.tables`.

Token maps compare three things on the profile's analysis images: the teacher's attention
probabilities (what the paper shows for DeiT), the teacher's gradient saliency and FAR's gradient
saliency (what the paper shows for FAR), with respect to each block's token-mixer input
(``wrt="mixer_input"``, :mod:`workbench.analysis.dependency`), drawn as extracted — probabilities
and gradient norms, each unit on its own stated colour scale — as the paper draws them; the
agreement scores use row-normalised maps (:mod:`workbench.analysis.token_maps` says why).

Layers of App. C (Fig. 9–14): the paper shows DeiT-Tiny's layers 0, 5 and 7 of 12 as shallow,
intermediate and deep. We take the block at the same relative depth, round(p / 11 · (L − 1)) for
paper layer p and our L blocks — 0, 2 and 3 for the 6-block demo ViT — rather than first / middle /
last: the paper's "deep" layer 7 is not DeiT-Tiny's last block (its last is 11), and our
token-level findings should be read at the positions the paper read them.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import xarray as xr

from workbench.figures import Finding, dataset, figure, student
from workbench.figures.context import Context
from workbench.figures.far.findings import (
    agreement_verdict,
    retention_verdict,
    table1_diffs,
    table1_verdict,
    table3_verdict,
)
from workbench.figures.far.findings_maps import cls_verdict, diagonal_verdict, left_bias_verdict
from workbench.plots.table import Table

#: Shallow, intermediate and deep layer of App. C (DeiT-Tiny: 0, 5, 7 of 12); for the 6-block demo ViT: 0, 2, 3.
PAPER_LAYERS = {"fig9": 0, "fig10": 5, "fig11": 7, "fig12": 0, "fig13": 5, "fig14": 7}
PAPER_DEPTH = 12  # DeiT-Tiny's blocks
MODELS = ("teacher attention", "teacher saliency", "FAR saliency")
#: what the saliency maps differentiate by (workbench.analysis.dependency): the token-mixer input
WRT = "mixer_input"
SCHEDULES = ("scratch", "cls", "sim", "combined")
COLUMNS = {"scratch": "TFS", "cls": "Distill (cls)", "sim": "Distill (sim)", "combined": "Distill (combine)"}


# ---------------------------------------------------------------------------------------- runs
def far_runs(ctx: Context):
    """(teacher, FAR, pruned FAR) runs of the profile, trained or reused, recorded for provenance."""
    from workbench.runs import open_run

    teacher = ctx.teacher("vit")
    pruned = ctx.run("far", teacher.id)
    return teacher, ctx.use_run(open_run(pruned.config["source_run"])), pruned


@student("FAR", method="far", teacher="vit", after=("far.runs",), maps="saliency")
def far_student(ctx: Context):
    return far_runs(ctx)[1]


@student("FAR†", method="far", teacher="vit", after=("far.runs",), maps="saliency")
def pruned_far_student(ctx: Context):
    return far_runs(ctx)[2]


# ---------------------------------------------------------------------------------------- data
@dataset("far.runs", after=("teacher.vit",))
def runs_data(ctx: Context) -> xr.Dataset:
    """Teacher, FAR and pruned FAR: accuracy, size and what pruning kept, one row each, with the paper's Table 1."""
    from workbench.pipelines.common import model_counts
    from workbench.pipelines.heldout import run_correctness
    from workbench.xrutils import rows_to_dataset

    paper = ctx.paper("far")["table1_imagenet"]  # methods.far.PAPER_TABLE1_IMAGENET
    teacher, far, pruned = far_runs(ctx)
    rows, correct = [], []
    for kind, run in (("DeiT", teacher), ("FAR", far), ("FAR†", pruned)):
        correct.append(run_correctness(run, ctx.profile.name, ctx.device))  # (heldout_sample,) bool: paired tests
        res = run.manifest["results"]
        counts = model_counts(ctx.model(run))
        rows.append({"kind": kind, "run": run.id, "val_acc": res["val_acc"], "params": counts["params"],
                     "macs": counts["macs"], "val_images": res.get("val_images"),
                     "kept_fraction": res.get("kept_fraction"),
                     "pruned_before_finetune_val_acc": res.get("pruned_before_finetune_val_acc"),
                     "shrunk_vs_masked_max_abs_diff": res.get("shrunk_vs_masked_max_abs_diff"),
                     **{f"paper_{size}": paper[f"{kind.rstrip('†')}-{size}{'†' if '†' in kind else ''}"]
                        for size in ("Tiny", "Small", "Base")}})
    ds = rows_to_dataset(rows)
    return ds.assign(correct=(("row", "heldout_sample"), np.stack(correct).astype(np.int8)))  # (3 models, held-out images)


@dataset("far.maps", after=("far.runs",))
def maps_data(ctx: Context) -> xr.Dataset:
    """Token maps (as extracted) of teacher attention, teacher saliency and FAR saliency, with the images."""
    from workbench.analysis.token_maps import stack_maps

    teacher, far, _ = far_runs(ctx)
    images = ctx.profile.analysis_images
    att = ctx.analysis("attention", teacher.id, images)
    maps = stack_maps(dict(zip(MODELS, (att, ctx.analysis("dependency", teacher.id, images, wrt=WRT),
                                        ctx.analysis("dependency", far.id, images, wrt=WRT)))))
    return maps.assign(image=att["image"].load())


@dataset("far.retention", after=("far.runs",))
def retention_data(ctx: Context) -> xr.Dataset:
    return ctx.analysis("retention", far_runs(ctx)[2].id, ctx.profile.analysis_images).load()


@dataset("far.agreement", after=("far.maps",))
def agreement_data(ctx: Context) -> xr.Dataset:
    """Per-layer agreement of the token maps, three views along ``view`` (see the figure's caption)."""
    from workbench.analysis.token_maps import agreement

    maps = ctx.data("far.maps").drop_vars("image")
    saliencies = maps.sel(model=["teacher saliency", "FAR saliency"]).assign_attrs(maps.attrs)
    views = {"paper-style": agreement(maps, reference="teacher attention"),
             "like-for-like": agreement(saliencies, reference="teacher saliency"),
             "like-for-like, raw": agreement(saliencies, reference="teacher saliency", normalize="none")[
                 ["pearson", "spearman", "cls_pearson"]]}
    out = xr.concat([v.expand_dims(view=[k]) for k, v in views.items()], dim="view", join="outer", data_vars="all",
                    coords="different", compat="no_conflicts")
    return out.assign_coords(reference=("view", [v.attrs["reference"] for v in views.values()]),  # per view: concat
                             normalize=("view", [v.attrs.get("normalize", "row") for v in views.values()]))  # keeps 1st


@dataset("far.table3", after=("teacher.vit", "far.table3_seeds"))
def table3_data(ctx: Context) -> xr.Dataset:
    """The four Table 3 schedules with the profile's short ablation budget: accuracy after distillation / finetuning.
    After ``far.table3_seeds``, which trains these runs (its first seed): started beside it, this step waited for the
    runs it was training (85 s of an idle core in a cold ``workbench figures --all``)."""
    paper = ctx.paper("far")["table3"]  # methods.far.PAPER_TABLE3
    teacher = ctx.teacher("vit")
    runs = {s: ctx.run("far", teacher.id, schedule=s, prune=False, table3=True) for s in SCHEDULES}
    b = ctx.budget("far")
    d, f = b.ablation or (b.distill, b.finetune)
    return xr.Dataset(
        {"distill_val_acc": ("schedule", [runs[s].manifest["results"]["distill_val_acc"] for s in SCHEDULES]),
         "val_acc": ("schedule", [runs[s].manifest["results"]["val_acc"] for s in SCHEDULES]),
         "paper": (("paper_model", "schedule"), [[paper[m][s] for s in SCHEDULES] for m in paper])},
        coords={"schedule": list(SCHEDULES), "paper_model": list(paper), "run": ("schedule", [runs[s].id for s in SCHEDULES])},
        attrs={"teacher_run": teacher.id, "teacher_val_acc": teacher.manifest["results"]["val_acc"],
               "val_images": int(teacher.manifest["results"].get("val_images", 0)),  # n of the binomial intervals
               "budget": json.dumps({"distill_epochs": d.epochs, "distill_lr": d.lr, "finetune_epochs": f.epochs,
                                     "finetune_lr": f.lr, "batch_size": d.batch_size, "scratch_lr": b.scratch_lr})},
    )


@dataset("far.table3_seeds", after=("teacher.vit",))
def table3_seeds_data(ctx: Context) -> xr.Dataset:
    """Per-seed held-out correctness ``correct(arm, seed, sample)`` of the Table 3 runs (``arm``: the schedule): every
    schedule on the budget's first seed (``far.table3``'s runs), the budget's ``ablation_seed_schedules`` on every seed
    of ``ablation_seeds`` (:mod:`workbench.figures.seeds`). The other seeds train first, the first seed last
    (``far.table3`` reads them after this step)."""
    from workbench.figures.seeds import correctness_by_seed

    teacher = ctx.teacher("vit")
    b = ctx.budget("far")
    seeds = b.ablation_seeds if b.ablation is not None else b.ablation_seeds[:1]  # no ablation budget: seed 0 only
    first = seeds[0]
    wanted = [(s, k) for k in seeds[1:] for s in SCHEDULES if s in b.ablation_seed_schedules] + [(s, first) for s in SCHEDULES]
    runs = {(s, k): ctx.run("far", teacher.id, schedule=s, prune=False, table3=True, seed=k) for s, k in wanted}
    d, f = b.ablation or (b.distill, b.finetune)
    return correctness_by_seed(ctx, runs).assign_attrs(finetune_epochs=f.epochs, distill_epochs=d.epochs)


# ---------------------------------------------------------------------------------------- plots
def relative_layer(maps: xr.Dataset, paper_layer: int, paper_depth: int = PAPER_DEPTH) -> int:
    """Our block at the relative depth of the paper's DeiT-Tiny layer: round(p / (12 − 1) · (L − 1)) (module docstring)."""
    layers = sorted(int(v) for v in maps["layer"].values)
    want = round(paper_layer / (paper_depth - 1) * (layers[-1]))
    return min(layers, key=lambda lay: abs(lay - want))


def _last(maps: xr.Dataset) -> int:
    return max(int(v) for v in maps["layer"].values)


def _depth_note(maps: xr.Dataset, fig_id: str) -> str:
    layer = relative_layer(maps, PAPER_LAYERS[fig_id])
    return (f"block {layer} of {_last(maps) + 1} (paper: DeiT-Tiny layer {PAPER_LAYERS[fig_id]} of {PAPER_DEPTH}, "
            "same relative depth)")


def _cls(maps: xr.Dataset, layer: int, title: str):
    from workbench.plots.far import plot_cls_heads
    from workbench.profiles import PROFILES

    s = maps.sample.values[0]
    profile = PROFILES.get(str(maps.attrs.get("profile")))
    spec = profile.analysis_images if profile is not None else "the analysis images"
    return plot_cls_heads(maps, layer=layer, sample=s, image=maps["image"].sel(sample=s).values,
                          models=list(MODELS), title=f"{title} · image {s} = the first of {maps.sizes['sample']} "
                                                     f"({spec}; {s} is its index in the source dataset)")


def plot_fig5(maps: xr.Dataset):
    return _cls(maps, _last(maps), f"CLS token importance, last block ({_last(maps)}) · teacher vs FAR")


def plot_fig6(maps: xr.Dataset):
    from workbench.plots.far import plot_token_maps

    return plot_token_maps(maps, layer=_last(maps))


def _cls_figure(fig_id: str):
    def plot(maps: xr.Dataset):
        return _cls(maps, relative_layer(maps, PAPER_LAYERS[fig_id]), f"CLS → patch, {_depth_note(maps, fig_id)}")

    return plot


def _token_figure(fig_id: str):
    def plot(maps: xr.Dataset):
        from workbench.plots.far import plot_token_maps

        return plot_token_maps(maps, layer=relative_layer(maps, PAPER_LAYERS[fig_id]),
                               title=f"Token-to-token dependency, {_depth_note(maps, fig_id)} · mean over heads and samples")

    return plot


def plot_agreement_views(ds: xr.Dataset):
    from workbench.figures.far.findings import agreement_headline
    from workbench.plots.far import plot_agreement

    views = {}
    for v in ds.view.values:
        one = ds.sel(view=v).dropna("layer", how="all").dropna("model", how="all")  # a view's absent pairs: no line
        attrs = {**ds.attrs, "reference": str(one["reference"].values), "normalize": str(one["normalize"].values)} \
            if "reference" in ds.coords else ds.attrs
        views[str(v)] = one.drop_vars([c for c in ("view", "reference", "normalize") if c in one.coords]).assign_attrs(attrs)
    return plot_agreement(views, title="Agreement of token maps, per layer (mean and 95 % interval over images)\n"
                          + agreement_headline(ds).replace(" (the teacher's own", "\n(the teacher's own"))


def table1(ds: xr.Dataset) -> Table:
    from workbench.figures.verdicts import fmt_diff
    from workbench.xrutils import dataset_rows

    rows = {r["kind"]: r for r in dataset_rows(ds)}
    f, p = rows["FAR"], rows["FAR†"]
    d = table1_diffs(ds)
    names = {"DeiT": "teacher (ViT, attention)", "FAR": "FAR (BiLSTM, distilled + finetuned)",
             "FAR†": f"FAR† (pruned, {100 * p['kept_fraction']:.0f}% units kept)"}
    frame = pd.DataFrame([{"model": names[k], "run": r["run"], "demo top-1 (%)": round(100 * r["val_acc"], 1),
                           "params": f"{r['params'] / 1e3:.0f}k", "MACs": f"{r['macs'] / 1e6:.2f}M",
                           **{f"paper ImageNet {s}": r[f"paper_{s}"] for s in ("Tiny", "Small", "Base")}}
                          for k, r in rows.items()])
    notes = [f"demo: MNIST-5k held-out set ({int(f['val_images'])} images), profile {ds.attrs.get('profile')}; "
             "paper: ImageNet-1k top-1 (Table 1).",
             f"FAR − teacher: {fmt_diff(*d['FAR'])}; FAR† − teacher: {fmt_diff(*d['FAR†'])}, paired over the "
             f"{ds.sizes['heldout_sample']} held-out images (paper, Tiny: +2.0 and +0.3).",
             f"pruned model before its masked finetuning: {100 * p['pruned_before_finetune_val_acc']:.1f}%; the physically "
             f"shrunk model equals the masked one to {p['shrunk_vs_masked_max_abs_diff']:.1e} (max |logit diff|)."]
    per_image = ds["correct"].mean("heldout_sample").values  # the saved models re-scored, image by image
    if np.abs(per_image - ds["val_acc"].values).max() > 0.5 / ds.sizes["heldout_sample"]:
        notes.append("the saved models re-scored image by image (the paired intervals) give "
                     + ", ".join(f"{k} {100 * a:.1f}%" for k, a in zip(ds["kind"].values, per_image))
                     + ", not the runs' own accuracies above")
    return Table(frame, f"FAR Table 1 on the demo (profile {ds.attrs.get('profile')})", notes)


def _ordering(acc: dict[str, float], paper: dict[str, dict[str, float]]) -> str:
    """Our schedules sorted by accuracy after distillation, beside the paper's orderings (Table 3)."""
    def order(a: dict) -> str:
        return " < ".join(COLUMNS[k] for k in sorted(a, key=lambda k: a[k]))

    ours = order(acc)
    theirs = "; ".join(f"{name}: {order(vals)}" for name, vals in paper.items())
    same = [name for name, vals in paper.items() if order(vals) == ours]
    verdict = f"the same as the paper's {' and '.join(same)}" if same else "not the paper's ordering"
    best = max(acc, key=acc.get)
    if not same and {max(vals, key=vals.get) for vals in paper.values()} == {best}:
        verdict += f", though {COLUMNS[best]} is best here too, as in every row of the paper"
    return f"ordering after distillation here: {ours} — {verdict} (paper, ImageNet: {theirs})."


def table3(ds: xr.Dataset, seeds: xr.Dataset | None = None) -> Table:
    b = json.loads(ds.attrs["budget"])
    schedules = [str(s) for s in ds.schedule.values]
    paper = {str(m): {s: float(ds.paper.sel(paper_model=m, schedule=s)) for s in schedules} for m in ds.paper_model.values}
    rows = [{"model": f"{m} (paper, ImageNet)", **{COLUMNS[s]: v for s, v in d.items()}} for m, d in paper.items()]
    acc = {s: float(ds.distill_val_acc.sel(schedule=s)) for s in schedules}
    rows.append({"model": f"demo FAR, after distillation ({b['distill_epochs']} epochs)",
                 **{COLUMNS[s]: round(100 * a, 1) for s, a in acc.items()}})
    if b["finetune_epochs"]:
        rows.append({"model": f"demo FAR, after finetuning ({b['finetune_epochs']} epochs)",
                     **{COLUMNS[s]: round(100 * float(ds.val_acc.sel(schedule=s)), 1) for s in schedules}})
    if seeds is not None:
        acc_by = 100 * seeds["correct"].mean("sample")  # (arm, seed): NaN where a schedule has no run of that seed
        n_by = {str(a): int(np.isfinite(acc_by.sel(arm=a)).sum()) for a in acc_by.arm.values}
        rows.append({"model": "demo FAR, mean over seeds (seeds: " + ", ".join(f"{COLUMNS[a]} {n_by[a]}" for a in n_by)
                              + ")", **{COLUMNS[str(a)]: round(float(acc_by.sel(arm=a).mean(skipna=True)), 1)
                                        for a in acc_by.arm.values}})
    n = 1000 if ds.attrs.get("profile") == "demo" else None
    se = "" if n is None else (f" At this accuracy one standard error of a held-out score is about "
                               f"{100 * np.sqrt(max(acc.values()) * (1 - max(acc.values())) / n):.1f} points.")
    tfs = f" (TFS at lr {b['scratch_lr']:g}: it trains a whole ViT)" if b.get("scratch_lr") else ""
    notes = [f"demo budget: distillation {b['distill_epochs']} epochs at lr {b['distill_lr']:g}{tfs}, "
             + (f"then finetuning {b['finetune_epochs']} epochs at lr {b['finetune_lr']:g}, " if b["finetune_epochs"]
                else "no finetuning, ")
             + f"batch {b['batch_size']}; the same for all four schedules. TFS re-initialises every weight and trains all "
             "of them with CE; cls and sim train only the substitutes, with CE or the block similarity (Eq. 3) alone.",
             _ordering(acc, paper) + se,
             f"teacher: {100 * ds.attrs['teacher_val_acc']:.1f}% ({ds.attrs['teacher_run']}); runs: "
             + ", ".join(str(r) for r in ds.run.values) + "."]
    return Table(pd.DataFrame(rows), f"FAR Table 3 on the demo (profile {ds.attrs.get('profile')})", notes)


def plot_fig4(ds: xr.Dataset):
    from workbench.plots.far import plot_retention

    return plot_retention(ds)


# ---------------------------------------------------------------------------------------- figures
_UNITS = ("attention in probability, saliency in gradient norm (‖∂Σ_c y_q / ∂LN1(x)_k‖₂), each on its own "
          "stated colour scale, not row-normalised")
_CLS_LAYOUT = ("Rows: the teacher's attention (what the paper draws for DeiT, the reference), the teacher's gradient "
               "saliency (the same quantity as FAR's, what the verdict compares with) and FAR's gradient saliency; "
               "columns: every head of the first analysis image, the head mean of that image, and the head mean over "
               "all analysis images (what the verdict measures). Head n of FAR is not head n of the teacher: each "
               "model numbers its own heads. The digit is drawn as an outline (red) over the map, so every cell keeps "
               "the colour its colour bar gives it; each row has its own colour scale")
_ORDER = ("far.order_bias measures FAR's order bias block by block (its CLS map against the distance along the token "
          "sequence): where it dominates, FAR's map piles onto the top patch rows, and on a digit whose top rows are "
          "blank it cannot follow the teacher's")
figure("far.fig4", paper="far", data="far.retention", plot=plot_fig4,
       finding=Finding("“As shown in Section 4.3, we observe considerable variation in compression ratios across depth "
                       "and direction, highlighting the benefit of block-wise flexibility.” (§3.3)",
                       "Fig. 4 / §4.3: 'the pruning ratio varies substantially between forward and reverse LSTM "
                       "modules, and across layers and heads'; tested over (layer, direction), head-averaged",
                       retention_verdict),
       caption="Fig. 4: share of hidden units each LSTM head keeps after DeepHoyer structured pruning of the demo FAR "
               "model (rows: layers, columns: heads), forward and reverse directions separately; numbers are percent.")
figure("far.fig5", paper="far", data="far.maps", plot=plot_fig5,
       finding=Finding("“Figure 5 shows that FAR learns to focus on semantically important regions, with each head "
                       "capturing distinct spatial patterns similar to that of the attention model.” (§4.3)",
                       "qualitative (Fig. 5: 'Each head in FAR recovers distinct semantic regions without attention'); "
                       "tested as the spatial layout of FAR's CLS saliency against the teacher's, last block",
                       cls_verdict(lambda maps: int(maps["layer"].values[-1]))),
       caption="Fig. 5: token importance of the CLS token in the last block. " + _CLS_LAYOUT + f" ({_UNITS}). " + _ORDER
               + ".")
figure("far.fig6", paper="far", data="far.maps", plot=plot_fig6,
       finding=Finding("“FAR’s dependency map demonstrates a higher self-dependency and on neighboring tokens "
                       "(illustrated by the bright near-diagonal region), which is as expected given the LSTM "
                       "formulation.” (§4.3)",
                       "qualitative (Fig. 6); tested as the share of each row on itself and its sequence neighbours, "
                       "FAR's saliency against the teacher's saliency, last block",
                       diagonal_verdict(lambda maps: int(maps["layer"].values[-1]))),
       caption="Fig. 6: token-to-token dependency in the last block, averaged over heads and samples (App. C.2): "
               "teacher attention (the paper's reference), teacher gradient saliency (the same quantity as FAR's, what "
               f"the verdict compares with) and FAR gradient saliency; the two saliencies share one colour scale ({_UNITS}; "
               "a bright row is a query whose output depends strongly on its inputs).")

_DEPTH = {"fig9": "shallow", "fig10": "intermediate", "fig11": "deep", "fig12": "shallow", "fig13": "intermediate",
          "fig14": "deep"}
_WHERE = ("the block at the paper's relative depth (DeiT-Tiny layer {p} of 12 → block round({p}/11·(L−1)) of our L; "
          "block {d} of the 6-block demo ViT)")
#: App. C's own sentence (figure caption) for each layer figure, and what the rule measures
_CLAIMS = {
    "fig9": ("“FAR (bottom) displays strong left-biased sparsity due to sequential computation, while DeiT (top) "
             "exhibits uniform spatial spread.” (App. C.1, Fig. 9)",
             "qualitative; tested as FAR's CLS mass on the first patch row against the teacher's saliency, and the "
             "evenness (entropy) of DeiT's CLS attention",
             left_bias_verdict(lambda maps: relative_layer(maps, 0))),
    "fig10": ("“FAR heads display early signs of global context encoding, resembling the spatial layout of attention "
              "heads in DeiT.” (App. C.1, Fig. 10)",
              "qualitative; tested as Pearson r of FAR's and the teacher's CLS saliency over the patches",
              cls_verdict(lambda maps: relative_layer(maps, 5))),
    "fig11": ("“Layer 7 attribution maps show high structural agreement between DeiT and FAR, confirming the convergence "
              "of interaction modeling in deeper layers.” (App. C.1, Fig. 11)",
              "qualitative ('highly similar in structural distribution'); tested as Pearson r of FAR's and the "
              "teacher's CLS saliency over the patches",
              cls_verdict(lambda maps: relative_layer(maps, 7))),
    "fig12": ("“DeiT (left) shows moderate locality; FAR (right) is strongly diagonal due to sequential access.” "
              "(App. C.2, Fig. 12)", "qualitative; tested as the near-diagonal share, FAR's saliency against the "
              "teacher's", diagonal_verdict(lambda maps: relative_layer(maps, 0))),
    "fig13": ("“DeiT attention is broader and distributed; FAR shows sparse diagonals capturing long-range "
              "dependencies.” (App. C.2, Fig. 13)", "qualitative; tested as the main near-diagonal share only, FAR's "
              "saliency against the teacher's (the long-range diagonals are not measured)",
              diagonal_verdict(lambda maps: relative_layer(maps, 5))),
    "fig14": ("“While DeiT’s diagonals weaken and the map becomes more diffuse, FAR retains a consistent diagonal "
              "structure due to its inherently sequential nature.” (App. C.2)", "qualitative (Fig. 14); tested as the "
              "near-diagonal share, FAR's saliency against the teacher's", diagonal_verdict(lambda maps: relative_layer(maps, 7))),
}
for _id in ("fig9", "fig10", "fig11"):
    _p = PAPER_LAYERS[_id]
    figure(f"far.{_id}", paper="far", data="far.maps", plot=_cls_figure(_id), finding=Finding(*_CLAIMS[_id]),
           caption=f"Fig. {_id[3:]} (App. C.1): CLS-to-patch maps in the {_DEPTH[_id]} block — "
                   + _WHERE.format(p=_p, d=round(_p / 11 * 5)) + ". " + _CLS_LAYOUT + f" ({_UNITS})."
                   + " " + _ORDER + ".")
for _id in ("fig12", "fig13", "fig14"):
    _p = PAPER_LAYERS[_id]
    figure(f"far.{_id}", paper="far", data="far.maps", plot=_token_figure(_id), finding=Finding(*_CLAIMS[_id]),
           caption=f"Fig. {_id[3:]} (App. C.2): token-to-token dependency in the {_DEPTH[_id]} block — "
                   + _WHERE.format(p=_p, d=round(_p / 11 * 5))
                   + " — averaged over heads and samples: teacher attention (the paper's reference), teacher gradient "
                     "saliency (the same quantity as FAR's, what the verdict compares with), FAR gradient saliency; the "
                     f"two saliencies share one colour scale ({_UNITS}; horizontal bands = queries whose output depends "
                     "strongly on their inputs).")
figure("far.agreement", paper="far", data="far.agreement", plot=plot_agreement_views,
       finding=Finding("“Further analysis shows that FAR preserves the semantic token relationships and the "
                       "token-to-token correlation learned in the transformer’s attention module.” (abstract)",
                       "qualitative (Fig. 6, 9–14: heatmaps, no number); tested per layer against the ceiling the "
                       "teacher's own saliency reaches", agreement_verdict),
       caption="Per-layer agreement of token-to-token maps (head-averaged, per sample; mean and 95 % Student t interval "
               "over the analysis images, the interval the verdict uses), saliency taken w.r.t. each block's token-mixer "
               "input. Paper-style: FAR saliency vs teacher "
               "attention, with the teacher's own saliency vs its attention as the ceiling a perfect copy could reach "
               "under the change of measure; like-for-like: FAR saliency vs teacher saliency. Correlations use "
               "row-normalised maps (attention rows sum to 1 and carry no per-query magnitude, so raw values would score "
               "FAR on a quantity the reference lacks), except 'like-for-like, raw', which compares the two saliencies' "
               "stored values and so also scores per-query magnitude (the bands of Fig. 12–14). Spearman ρ / Pearson r "
               "over all T×T entries; Jensen–Shannon divergence (bits) between corresponding row-normalised query rows, "
               "averaged over rows. Legend: '<model> vs <reference>' names each curve's reference (teacher attention "
               "in the paper-style view, teacher saliency in the like-for-like views); the title states the headline "
               "numbers.")
figure("far.table1", paper="far", kind="table", data="far.runs", plot=table1,
       finding=Finding("“On DeiT-Tiny, FAR matches or even exceeds the baseline: the unpruned model improves accuracy by "
                       "+2.0%, while the pruned variant retains competitive performance with fewer parameters.” (§4.2)",
                       "FAR +2.0, FAR† +0.3 points over DeiT-Tiny (Table 1)", table1_verdict),
       caption="Table 1: held-out top-1 accuracy of the demo teacher, its FAR student and the pruned FAR student, "
               "with parameters, MACs and the paper's ImageNet top-1 of DeiT / FAR / FAR† (Tiny, Small, Base) beside; "
               "differences to the teacher paired image by image over the held-out set (the interval compare.table1 "
               "gives too).")
figure("far.table3", paper="far", kind="table", data=("far.table3", "far.table3_seeds"), plot=table3,
       finding=Finding("\"In contrast, combining classification and similarity objectives consistently improves "
                       "performance, indicating that block-level supervision provides essential guidance during "
                       "training.\" (§4.3, Table 3)", "Table 3: 'Distill (combine)' best for FAR-Tiny and FAR-Small",
                       table3_verdict),
       caption="Table 3: top-1 accuracy of FAR under the four loss schedules of the distillation phase — train from "
               "scratch (TFS), distill with CE only, with the block similarity only, with both (Eq. 4) — on the demo "
               "with the profile's short ablation budget, the same for all four, beside the paper's ImageNet numbers, with "
               "the ordering of the schedules compared to the paper's. The close pair on the demo (combined, sim) is "
               "trained on 3 seeds, TFS and cls (20+ points behind) on one; the last row is the mean over each "
               "schedule's seeds, and the verdict's interval spans the seeds (far.table3_seeds).")
