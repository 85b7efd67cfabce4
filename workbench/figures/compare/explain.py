"""Explanations of every teacher and student, and their faithfulness: ``compare.explain`` and ``compare.faithfulness``.

Data ``compare.explain_vit``, ``compare.explain_swin``, ``compare.explain_cnn`` (one per demo teacher with
students, like ``compare.<arch>``): every model of the group explained by every explainer of :data:`BUDGETS`' list
that applies to it (:func:`workbench.explain.attribute`; the others carry their reason), on a class-spread subset of
the held-out digits, for the image's predicted and its target (label) class; per image and explainer Chefer's
positive / negative perturbation AUC (:func:`workbench.explain.faithfulness.faithfulness`), each student's agreement
with its teacher's map of the label class (:func:`workbench.explain.compress.agreement`), Adebayo's randomisation
check of the teacher (head and top block re-initialised), the maps of four digits for the figure and the seconds
each model took.

Budget (demo): maps and agreement on 100 of the 1000 held-out digits (``demo:val[::10]``: 10 per class); the
perturbation test (the costly part: 20 forward passes per image and explainer) on all 100 for the ViT teacher (the
field-ordering finding is about it) and on every 5th of them (20, two per class) for every other model, where the
randomisation check runs too; no Integrated Gradients (its
50 backward passes per image would cost more than every other explainer together; ``workbench explain --method ig``
has it) and no ROAD (a sparse solve per image and threshold; ``workbench explain ... --road --out X.zarr`` has it).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import numpy as np
import xarray as xr

from workbench.figures import dataset
from workbench.figures.compare.items import ARCH_TITLE, ARCHS, TEACHER, students_of
from workbench.figures.context import Context

__all__ = ["ExplainBudget", "BUDGETS", "SHOWN", "explain_data"]


@dataclass(frozen=True)
class ExplainBudget:
    """What the explanation items compute on one profile."""

    images: str  # held-out images of the faithfulness test (class-spread: the demo split is sorted by class)
    shown: tuple[int, ...]  # positions among ``images`` of the digits the figure shows (different classes)
    methods: tuple[str, ...]  # explainers tried on every model (those that do not apply are listed with why)
    perturb_every: int = 5  # the perturbation test on every n-th of ``images`` (the ViT teacher's on all of them)
    randomization_blocks: int = 1  # top blocks (and the head) re-initialised by the randomisation check


METHODS = ("generic_attention", "chefer_lrp", "attnlrp", "rollout", "raw_attention", "gradcam", "legrad", "saliency")
BUDGETS = {
    "demo": ExplainBudget("demo:val[::10]", (5, 35, 65, 95), METHODS),
    # smoke: one explainer of each family the verdicts compare (Chefer's / AttnLRP, the field's baselines, gradients);
    # every explainer on every model form is tests/test_explain_forms.py's
    "smoke": ExplainBudget("demo:val[50::200]", (0, 2, 4), ("generic_attention", "attnlrp", "rollout", "gradcam",
                                                             "saliency"), perturb_every=2),
    "paper": ExplainBudget("demo:val[::10]", (5, 35, 65, 95), METHODS),
}
SHOWN = 2  # digits the figure shows (of the budget's ``shown``)


def _models(ctx: Context, arch: str):
    from workbench.compare import load_models

    teacher = ctx.teacher(arch)
    runs = {s.label: ctx.use_run(s.run(ctx)) for s in students_of(arch)}
    return load_models(teacher.id, {k: r.id for k, r in runs.items()}, teacher_name=TEACHER, device=ctx.device), teacher


def _per_model(ctx: Context, models, methods: list[str], x, y, full: str, every: int) -> tuple[dict, dict, dict]:
    """label -> Dataset (perturbation AUCs on the ``every``-th image, on every image for the model ``full``, NaN
    elsewhere; the label class's maps and the prediction on every image), label -> {explainer: why it does not
    apply}, label -> seconds."""
    from workbench.explain import attribute
    from workbench.explain.faithfulness import faithfulness

    out, reasons, seconds = {}, {}, {}
    everyone = np.arange(len(x))
    for label, lm in models.loaded.items():
        t0 = time.perf_counter()
        pick = everyone if label == full else everyone[::every]
        f = faithfulness(lm.model, x[pick], y[pick], method=methods)
        f = f.assign_coords(sample=pick).reindex(sample=everyone)[["auc", "auc_probability"]]
        reasons[label] = json.loads(f.attrs["not_applicable"])
        names = [str(e) for e in f["explainer"].values]
        if names:  # the label class's maps on every image: the agreement and the figure
            m = attribute(lm.model, x, method=names, target=y)
            f = f.assign(relevance=m["relevance"].expand_dims(explained=["target"], axis=1),
                         relevance_pixel=m["relevance_pixel"].expand_dims(explained=["target"], axis=1),
                         predicted=("sample", m["predicted"].values))
        out[label], seconds[label] = f, time.perf_counter() - t0
        ctx.log(f"  explain {label}: {len(names)} explainers, {seconds[label]:.1f} s")
    return out, reasons, seconds


def _stack(per: dict, methods: list[str], var: str, samples=None, **sel) -> np.ndarray:
    """``var`` of every model on the full explainer list (NaN where an explainer did not apply), at ``samples``
    (positions; None: all)."""
    pick = slice(None) if samples is None else list(samples)
    first = next(iter(per.values()))[var].sel(**sel).isel(sample=pick)
    shape = first.shape[1:]
    out = np.full((len(per), len(methods), *shape), np.nan)
    for i, ds in enumerate(per.values()):
        for j, m in enumerate(methods):
            if m in set(ds["explainer"].values):
                out[i, j] = ds[var].sel(explainer=m, **sel).isel(sample=pick).values
    return out


def _agreements(per: dict, methods: list[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``spearman`` and ``topk`` ``(model, explainer, sample)`` of each student against the teacher (NaN for the
    teacher and where an explainer applies to only one of them), and the grid each student was compared on."""
    from workbench.explain.compress import agreement

    n = next(iter(per.values())).sizes["sample"]
    rho, top = np.full((2, len(per), len(methods), n), np.nan)
    grids = [""]
    for i, (label, ds) in enumerate(per.items()):
        if label == TEACHER or "relevance" not in ds:
            grids += [""] * (label != TEACHER)
            continue
        a = agreement(per[TEACHER], ds)
        grids.append(a.attrs["grid"])
        for e in a["explainer"].values:
            rho[i, methods.index(str(e))] = a["spearman"].sel(explainer=e).values
            top[i, methods.index(str(e))] = a["topk"].sel(explainer=e).values
    return rho, top, grids


def _randomization(model, x, methods: list[str], blocks: int) -> dict:
    from workbench.explain.faithfulness import randomization

    ds = randomization(model, x, methods, blocks=blocks)
    full = {k: np.full(len(methods), np.nan) for k in ("mean", "low", "high")}
    verdict = ["not applicable"] * len(methods)
    for e in ds["explainer"].values:
        j = methods.index(str(e))
        for k in full:
            full[k][j] = float(ds[k].sel(explainer=e))
        verdict[j] = str(ds["verdict"].sel(explainer=e).values)
    return {f"random_{k}": ("explainer", v) for k, v in full.items()} | {"random_verdict": ("explainer", verdict)}


def explain_data(arch: str):
    """The data function of ``compare.explain_<arch>`` (module docstring)."""

    def make(ctx: Context) -> xr.Dataset:
        import torch

        from workbench.data import load_images
        from workbench.explain import load_all as load_explainers

        if not students_of(arch):
            return xr.Dataset(attrs={"arch": arch, "title": ARCH_TITLE[arch], "students": "[]"})
        b = BUDGETS[ctx.profile.name]
        models, teacher = _models(ctx, arch)
        left_out = _without_grid(models)
        batch = load_images(ctx.image_spec(b.images), input_size=models.input_size, mean=models.mean, std=models.std)
        x = batch.tensor.to(ctx.device)
        y = torch.as_tensor(batch.labels, device=ctx.device)
        methods = [m for m in b.methods if m in load_explainers()]
        full = TEACHER if arch == "vit" else ""  # the ViT teacher (the finding's) on every image
        per, reasons, seconds = _per_model(ctx, models, methods, x, y, full, b.perturb_every)
        order = list(per)
        rho, top, grids = _agreements(per, methods)
        shown = [s for s in b.shown if s < len(x)]
        maps = _stack(per, methods, "relevance_pixel", shown, explained="target").astype(np.float32)
        dims = ("model", "explainer", "explained", "order", "sample")
        ds = xr.Dataset({
            "auc": (dims, np.stack([_stack(per, methods, "auc", explained=e) for e in ("predicted", "target")], 2)),
            "auc_probability": (dims, np.stack([_stack(per, methods, "auc_probability", explained=e)
                                                for e in ("predicted", "target")], 2)),
            "reason": (("model", "explainer"), [[reasons[m].get(e, "") for e in methods] for m in order]),
            "spearman": (("model", "explainer", "sample"), rho), "topk": (("model", "explainer", "sample"), top),
            "grid": ("model", grids), "seconds": ("model", [seconds[m] for m in order]),
            "predicted": (("model", "sample"), np.stack([per[m]["predicted"].values if "predicted" in per[m] else
                                                         np.full(len(x), -1) for m in order])),
            "label": ("sample", batch.labels),
            "map": (("model", "explainer", "shown", "img_y", "img_x"), maps),
            "image": (("shown", "img_y", "img_x") + (("rgb",) if batch.display.ndim == 4 else ()),
                      batch.display[shown]),
            **_randomization(models.loaded[TEACHER].model, x[::b.perturb_every], methods, b.randomization_blocks),
        }, coords={"model": order, "explainer": methods, "explained": ["predicted", "target"],
                   "order": ["positive", "negative"], "sample": np.arange(len(x)), "shown": shown})
        return ds.assign_attrs(arch=arch, title=f"{ARCH_TITLE[arch]} ({teacher.id})", images=ctx.image_spec(b.images),
                               perturbed=f"every {b.perturb_every}th" + (" (the teacher: every one)" if full else ""),
                               budget=json.dumps(asdict(b)), students=json.dumps(order[1:]),
                               left_out=json.dumps(left_out),
                               papers=json.dumps({m: _paper(m) for m in methods}))

    make.__name__ = f"compare_explain_{arch}"
    return make


def _without_grid(models) -> dict[str, str]:
    """Take the students with no patch grid (e.g. a registered student wrapping its model without a ``patch_embed``)
    out of ``models.loaded``: label -> why, named in the table's notes instead of failing the item."""
    from workbench.explain.grids import no_grid_reason

    out = {label: why for label, lm in models.loaded.items() if label != TEACHER and (why := no_grid_reason(lm.model))}
    for label in out:
        del models.loaded[label]
    return out


def _paper(name: str) -> str:
    from workbench.explain import get_explainer

    return get_explainer(name).paper


for _arch in ARCHS:
    dataset(f"compare.explain_{_arch}", after=lambda a=_arch: _needs(a))(explain_data(_arch))


def _needs(arch: str) -> tuple[str, ...]:
    studs = students_of(arch)
    return (f"teacher.{arch}", *dict.fromkeys(a for s in studs for a in s.after)) if studs else ()


# ---------------------------------------------------------------------------------------- items
def _fmt(x: np.ndarray, scale: float = 100.0, digits: int = 1) -> str:
    from workbench.explain.compress import mean_interval

    m, lo, hi = mean_interval(x)
    if not np.isfinite(m):
        return "–"
    return f"{scale * m:.{digits}f}" + ("" if not np.isfinite(lo) else f" ({scale * lo:.{digits}f}–{scale * hi:.{digits}f})")


def _row(ds: xr.Dataset, model: str, e: str) -> dict:
    auc = ds["auc"].sel(model=model, explainer=e)
    first = model == str(ds["model"].values[0])
    return {
        "model": f"{model} ({ds.attrs['arch']})" if first else model, "method": e,
        "pos. AUC ↓ (pred.)": _fmt(auc.sel(explained="predicted", order="positive").values),
        "neg. AUC ↑ (pred.)": _fmt(auc.sel(explained="predicted", order="negative").values),
        "pos. AUC ↓ (target)": _fmt(auc.sel(explained="target", order="positive").values),
        "neg. AUC ↑ (target)": _fmt(auc.sel(explained="target", order="negative").values),
        "ρ with teacher": "–" if first else _fmt(ds["spearman"].sel(model=model, explainer=e).values, 1, 2),
        "top-10 % overlap": "–" if first else _fmt(ds["topk"].sel(model=model, explainer=e).values, 1, 2),
    }


def _notes(ds: xr.Dataset) -> list[str]:
    from workbench.explain.compress import paired_auc
    from workbench.figures.compare.explain_findings import student_statuses

    title, teacher = ds.attrs["title"], str(ds["model"].values[0])
    rnd = [f"{e} ρ {float(m):.2f} [{float(lo):.2f}, {float(hi):.2f}] {v}" for e, m, lo, hi, v in zip(
        ds["explainer"].values, ds["random_mean"].values, ds["random_low"].values, ds["random_high"].values,
        ds["random_verdict"].values) if str(v) != "not applicable"]
    fails = [str(e) for e, v in zip(ds["explainer"].values, ds["random_verdict"].values) if str(v) == "unchanged"]
    notes = [f"{title}: randomisation check (Adebayo et al. 2018; head and top block re-initialised, Spearman ρ of "
             "the teacher's maps before / after, mean [95 % CI]; 'changes' = below 0.5): " + "; ".join(rnd)
             + (f". FAIL (maps unchanged): {', '.join(fails)}." if fails else ". No method fails it.")]
    auc = ds["auc"].sel(explained="predicted", order="positive")
    for student, (status, _) in student_statuses(ds).items():
        deltas = []
        for e in ds["explainer"].values:
            d, lo, hi = paired_auc(auc.sel(model=teacher, explainer=e).values, auc.sel(model=student, explainer=e).values)
            if np.isfinite(d):
                deltas.append(f"{e} {100 * d:+.1f} ({100 * lo:+.1f} … {100 * hi:+.1f})")
        says = {"keeps": "keeps its teacher's reasons", "loses": "loses its teacher's reasons",
                "mixed": "keeps its teacher's reasons for some methods only"}.get(status, status)
        notes.append(f"{student} ({says}; agreement on the {ds['grid'].sel(model=student).item()} "
                     "grid): positive AUC ×100 minus the teacher's, paired 95 % CI: " + "; ".join(deltas) + ".")
    na: dict[str, tuple[list, list]] = {}  # reason -> (methods, models)
    for m in ds["model"].values:
        for e, why in zip(ds["explainer"].values, ds["reason"].sel(model=m).values):
            if str(why):
                methods, models = na.setdefault(str(why), ([], []))
                methods += [str(e)] if str(e) not in methods else []
                models += [str(m)] if str(m) not in models else []
    notes += [f"{title}, not applicable: {', '.join(es)} to {', '.join(ms)} — {why}" for why, (es, ms) in na.items()]
    notes += [f"{title}: {label} left out — {why}" for label, why in json.loads(ds.attrs.get("left_out", "{}")).items()]
    secs = ", ".join(f"{m} {float(s):.1f} s" for m, s in zip(ds["model"].values, ds["seconds"].values))
    notes.append(f"{title}: maps and agreement on {ds.sizes['sample']} held-out digits ({ds.attrs['images']}), the "
                 f"perturbation test on {ds.attrs.get('perturbed', 'all')} of them and the randomisation check on "
                 "the perturbed digits, every explainer that applies, no Integrated Gradients and no ROAD (their cost: "
                 f"`workbench explain` has both); compute: {secs}.")
    return notes


def faithfulness_table(*datasets: xr.Dataset):
    """Every model × method: Chefer's perturbation AUCs (×100, mean and 95 % CI over the images), agreement with the
    teacher's map (Spearman ρ, top-10 % overlap)."""
    import pandas as pd

    from workbench.plots.table import Table

    groups = [ds for ds in datasets if "auc" in ds]
    rows, notes = [], []
    for ds in groups:
        for m in ds["model"].values:
            rows += [_row(ds, str(m), str(e)) for e in ds["explainer"].values
                     if np.isfinite(ds["auc"].sel(model=m, explainer=e).values).any()]
        notes += _notes(ds)
    notes.insert(0, "AUC: Chefer et al.'s perturbation test — patches removed (set to the dataset mean) in 10 % steps, "
                 "most relevant first (positive: lower = more faithful) or least relevant first (negative: higher = "
                 "more faithful), accuracy against the label integrated over 0–90 %, ×100; 'pred.' explains the "
                 "predicted class, 'target' the label. ρ / top-10 %: the student's map of the label class against "
                 "its teacher's, per image.")
    profile = next((ds.attrs.get("profile") for ds in groups if ds.attrs.get("profile")), "")
    frame = pd.DataFrame(rows) if rows else pd.DataFrame({"model": []})
    return Table(frame, f"Faithfulness of every explainer on every model (profile {profile})", notes, key_columns=2)


def _register() -> None:
    from workbench.figures import figure
    from workbench.figures.compare.explain_findings import ORDERING, REASONS
    from workbench.figures.compare.items import PAPER
    from workbench.plots.explain import plot_explanations

    data = tuple(f"compare.explain_{a}" for a in ARCHS)
    figure("compare.explain", paper=PAPER, data=data, plot=plot_explanations, finding=REASONS,
           caption="Explanations of the label class by every explainer that applies (columns, two digits each) for "
                   "every teacher and student (rows, grouped by teacher; n/a: the method does not apply, the reason is "
                   "in compare.faithfulness). One colour scale per method over all models (its 99th percentile of "
                   "|value|, clipped), the digit's outline in white. The verdict asks whether each student's maps "
                   "rank the pixels as its teacher's do (Spearman ρ ≥ 0.5 over 100 class-spread held-out digits on the demo profile, "
                   "95 % CI), for every method both take.")
    figure("compare.faithfulness", paper=PAPER, kind="table", data=data, plot=faithfulness_table, finding=ORDERING,
           caption="Faithfulness of every explainer on every model, measured the field's way (Chefer et al.'s "
                   "positive / negative perturbation, predicted and target class) on 100 class-spread held-out digits "
                   "for the ViT teacher and 20 of them (two per class) for every other model (demo profile), "
                   "with each student's agreement with its teacher's maps; the notes give Adebayo's randomisation "
                   "check of each teacher (methods that fail it named), each student's paired difference to its "
                   "teacher, the methods that do not apply and why, and the compute time.")


_register()
