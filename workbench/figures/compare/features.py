"""Feature-level diffing in the gallery: ``compare.features`` (figure) and ``compare.features_table`` (table).

Per demo teacher (data ``compare.features_vit``, ``_swin``, ``_cnn``), every student the comparison shows gets a
crosscoder over the teacher's and its activations at one block pair — the middle of the pairs its correspondence
declares (:func:`workbench.features.report.middle_pair`: ViT block 3, Swin stage 1 block 1, CNN stage 2; Non-deep
2×3 collapsed its block 1 against the teacher's block 5) — and :func:`workbench.features.report.study_pair` reads
out the diff, the latents it shows and the lost-features test on held-out digits.

Per-image correctness comes from the comparison (``compare.<arch>``'s ``heldout_correct`` on its agreement images),
so the lost test reads the same predictions as ``compare.table1``.

Budget (:data:`BUDGETS`): on the demo the crosscoder trains on 1000 of the 4000 training digits (``demo:train[::4]``,
every class), 3 epochs of 32 images a step, 128 latents, k = 16 — a subset and a short schedule, so the two items
cost ≤ 150 s cold together (measured as one thread's CPU time, what a step costs on an idle core: 39 + 16 + 18 s
for the three teachers' data and 5 s to draw both; wall time on the shared, loaded development machine was 2–3×
that); the diff and the lost test use all 1000 held-out digits, the effects every 5th of them. A longer training
(``workbench features``) gives sharper classes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np
import xarray as xr

from workbench.figures import dataset, figure
from workbench.figures.compare.items import ARCH_TITLE, ARCHS, TEACHER, students_of
from workbench.figures.context import Context
from workbench.plots.table import Table


@dataclass(frozen=True)
class FeaturesBudget:
    """How much of the feature diff one profile computes."""

    train_images: str  # image spec the crosscoder trains on (class-spread)
    epochs: int  # passes over the training images
    width: int  # latents
    k: int  # mean active latents per token (BatchTopK)
    batch_images: int = 32  # images per training step
    candidates: int = 12  # teacher-only latents whose effects are measured
    show: int = 3  # latents shown per student
    min_lost: int = 5  # lost images below which the lost test says "not shown"
    effect_every: int = 4  # effects on every n-th held-out image


BUDGETS = {
    "demo": FeaturesBudget("demo:train[::4]", epochs=3, width=128, k=16, candidates=8, effect_every=5),
    "smoke": FeaturesBudget("demo:train[::40]", epochs=1, width=64, k=8, batch_images=16, candidates=4, show=2,
                            min_lost=2, effect_every=5),  # effects on 25 of the 125 held-out images
    "paper": FeaturesBudget("demo:train[::2]", epochs=4, width=1024, k=32),
}


def _features(arch: str):
    def make(ctx: Context) -> xr.Dataset:
        import torch

        from workbench.compare import load_models
        from workbench.data import load_images
        from workbench.features import CrosscoderConfig, paired_hooks
        from workbench.features.lost import LostThresholds
        from workbench.features.report import StudyOptions, middle_pair, study_pair

        studs = students_of(arch)
        if not studs:
            return xr.Dataset(attrs={"arch": arch, "title": ARCH_TITLE[arch], "students": "[]"})
        b = BUDGETS[ctx.profile.name]
        teacher = ctx.teacher(arch)
        runs = {s.label: ctx.use_run(s.run(ctx)) for s in studs}
        models = load_models(teacher.id, {k: r.id for k, r in runs.items()}, teacher_name=TEACHER, device=ctx.device)

        def batch(spec):
            return load_images(ctx.image_spec(spec), input_size=models.input_size, mean=models.mean, std=models.std)

        comparison = ctx.data(f"compare.{arch}")  # per-image correctness on its held-out images (agreement_images)
        train, held = batch(b.train_images), batch(comparison.attrs["agreement_images"])
        order = [str(m) for m in comparison["model"].values]
        cfg = CrosscoderConfig(width=b.width, k=b.k, epochs=b.epochs, batch_images=b.batch_images)
        opt = StudyOptions(candidates=b.candidates, show=b.show, effect_every=b.effect_every,
                           lost=LostThresholds(min_lost=b.min_lost))
        t_model, parts, pairs, skipped = models.loaded[TEACHER].model, [], {}, {}
        for s in studs:
            torch.manual_seed(0)
            s_model = models.loaded[s.label].model
            try:  # a student without block hook points, or whose blocks do not pair with the teacher's: left out
                pair = middle_pair(paired_hooks(t_model, s_model, s.blocks))
            except ValueError as err:
                skipped[s.label] = str(err)
                continue
            pairs[s.label] = pair
            ds = study_pair({"teacher": t_model, "student": s_model}, {"teacher": pair[0], "student": pair[1]},
                            train.tensor, held.tensor, held.labels, np.asarray(held.source.indices), held.display,
                            cfg, opt, ctx.device, correct=comparison["heldout_correct"].values[
                                [order.index(TEACHER), order.index(s.label)]].astype(bool))
            parts.append(ds)
            ctx.log(f"  features {arch} {s.label}: {pair[0]} ~ {pair[1]}, fve {np.round(ds['fve'].values, 3)}, "
                    f"lost test {str(ds['lost_status'].values)}")
        done = [s for s in studs if s.label in pairs]
        if not done:
            return xr.Dataset(attrs={"arch": arch, "title": ARCH_TITLE[arch], "students": "[]",
                                     "skipped": json.dumps(skipped)})
        return assemble(parts, [s.label for s in done], [s.method for s in done], arch=arch, skipped=json.dumps(skipped),
                        title=f"{ARCH_TITLE[arch]} ({teacher.id})", teacher_run=teacher.id, pairs=json.dumps(pairs),
                        budget=json.dumps(asdict(b)), train_images=ctx.image_spec(b.train_images),
                        held_images=comparison.attrs["agreement_images"])

    make.__name__ = f"features_{arch}"
    return make


def assemble(parts: list[xr.Dataset], students: list[str], methods: list[str], **attrs) -> xr.Dataset:
    """One teacher's study Datasets (:func:`workbench.features.report.study_pair`) along the ``student`` dim, with
    the attrs the plot and the table read (``title``, ``pairs``, ``budget``, ``train_images``, ``held_images``)."""
    out = xr.concat(parts, dim="student", coords="minimal", compat="override", combine_attrs="drop")
    kept = {k: parts[0].attrs[k] for k in ("thresholds", "study", "lost_method", "crosscoder")}
    return out.assign_coords(student=students, method=("student", methods)).assign_attrs(
        students=json.dumps(students), **kept, **attrs)


def _needs(arch: str):
    def needs() -> tuple[str, ...]:  # the comparison (its per-image correctness) and the runs' training steps
        studs = students_of(arch)
        return (f"teacher.{arch}", f"compare.{arch}", *dict.fromkeys(a for s in studs for a in s.after)) if studs \
            else ()

    return needs


for _arch in ARCHS:
    dataset(f"compare.features_{_arch}", after=_needs(_arch))(_features(_arch))

_DATA = tuple(f"compare.features_{a}" for a in ARCHS)


def plot_features(*datasets: xr.Dataset):
    from workbench.plots.features import plot_feature_diff

    return plot_feature_diff([ds for ds in datasets if "student" in ds.dims])


def features_table(*datasets: xr.Dataset) -> Table:
    """Per student: FVE per model, L0, dead latents, class counts and the lost-features test."""
    import pandas as pd

    rows, notes, profile = [], [], ""
    for ds in datasets:
        notes += [f"{k}: left out ({v})." for k, v in json.loads(ds.attrs.get("skipped", "{}")).items()]
        if "student" not in ds.dims:
            continue
        profile = ds.attrs.get("profile", profile)
        pairs = json.loads(ds.attrs["pairs"])
        for s in ds["student"].values:
            d = ds.sel(student=s)
            rows.append({
                "student": str(s), "block pair (teacher ~ student)": " ~ ".join(p.rsplit(".", 1)[0] for p in pairs[str(s)]),
                "FVE teacher / student": f"{float(d['fve'].sel(model='teacher')):.2f} / "
                                         f"{float(d['fve'].sel(model='student')):.2f}",
                "L0": f"{float(d['l0']):.1f}", "dead %": f"{100 * int(d['n_dead']) / ds.sizes['latent']:.0f}",
                "shared / teacher-only / student-only / partial": " / ".join(
                    str(int(d[f"n_{c}"])) for c in ("shared", "teacher_only", "student_only", "partial")),
                **({"Latent Scaling: confirmed / in the other": f"{int(d['n_confirmed'])} / {int(d['n_in_other'])}"}
                   if "n_confirmed" in d else {}),
                "lost features → lost accuracy": f"{str(d['lost_status'].values)}: {str(d['lost_statistic'].values)}",
            })
            if str(d["lost_reason"].values):
                notes.append(f"{s}: {str(d['lost_reason'].values)}.")
        b = json.loads(ds.attrs["budget"])
        notes.append(f"{ds.attrs['title']}: crosscoder of {b['width']} latents, k = {b['k']}, {b['epochs']} epochs on "
                     f"{ds.attrs['train_images']}; FVE, L0, dead and classes on {ds.sizes['sample']} held-out images "
                     f"({ds.attrs['held_images']}).")
    notes += _general_notes(datasets)
    frame = pd.DataFrame(rows) if rows else pd.DataFrame({"student": []})
    return Table(frame, f"Feature-level diff per student: crosscoder fit and the lost-features test (profile {profile})",
                 notes)


def _general_notes(datasets) -> list[str]:
    th = next((json.loads(ds.attrs["thresholds"]) for ds in datasets if "thresholds" in ds.attrs), {})
    ex, sh = th.get("exclusive", 0.1), th.get("shared", 0.1)
    return [
        f"Classes by the relative decoder norm r = ‖d_student‖ / (‖d_teacher‖ + ‖d_student‖): teacher-only r < {ex:g}, "
        f"student-only r > {1 - ex:g}, shared |r − ½| ≤ {sh:g}, partial between; dead latents (never active on the "
        "held-out tokens) are left out of the counts. FVE = 1 − Σ‖x − x̂‖² / Σ‖x − x̄‖² per model on held-out tokens.",
        "Lost-features test: the live teacher-only latents with the largest drop of the teacher's log p(correct) when "
        "removed (up to 8, each ≥ 0.01 nats); per image their mean code relative to its average; lost images "
        "(teacher right, student wrong) against kept ones (both right), difference within each true class weighted "
        "by the lost images' classes, 95 % percentile bootstrap within cells. shown: interval > 0 and ≥ 25 % excess; "
        "partly: interval > 0, excess < 25 %; not shown: otherwise (or no teacher-only latent the teacher uses, or "
        "fewer lost images than the minimum).",
    ]


_CAPTION = ("Feature-level diff of every student against its teacher (sparse BatchTopK crosscoder over both models' "
            "activations at the middle corresponding block pair). Top: histogram of relative decoder norms "
            "r = ‖d_student‖ / (‖d_teacher‖ + ‖d_student‖) of the live latents per student (r near 0: the teacher "
            "only; near 1: the student only; bands: class thresholds). Below: per student the latents with the "
            "largest effect in the teacher among the teacher-only ones (filled up with the lowest-r live latents "
            "when fewer are teacher-only; each panel names the class), each with the held-out image patches it "
            "fires on most (image id above each crop; the token's cell with one cell of context) and its effect: the "
            "mean change of log p(correct class) in nats when its contribution f·d is subtracted from the teacher's "
            "(T) and the student's (S) activation. Demo budget: a crosscoder on 1000 training digits, 3 epochs.")

figure("compare.features", paper="compare", data=_DATA, plot=plot_features, caption=_CAPTION)
figure("compare.features_table", paper="compare", kind="table", data=_DATA, plot=features_table,
       caption="Per student: the crosscoder's fraction of variance explained in the teacher and in the student on "
               "held-out tokens, L0 (active latents per token), dead latents, the latents per class, and whether the "
               "features the student lost (teacher-only latents the teacher uses) fire more on the images it lost "
               "than on those it kept (class-stratified difference with a bootstrap interval; verdict per student).")
