"""Teacher vs compressed, every method at once: ``compare.fig1``–``fig4`` and ``compare.table1``.

Every method's figure module registers the students it trains with :func:`workbench.figures.student`
(FAR: "FAR", "FAR†"; SlimSwin: "SlimSwin r=1/3", "SlimSwin r=2/3"; ...). Here they are grouped by the
demo teacher they were compressed from, and each teacher is compared with all its students in one
:func:`workbench.compare.compare_loaded` call (data ``compare.vit``, ``compare.swin``, ``compare.cnn``):
the teacher's own parts (features, attention, attributions and their curves) are computed once per
teacher, not once per pair.

Which students: :data:`~workbench.figures.STUDENTS` is read when the scheduler asks for the data's
dependencies (``after`` is a function, resolved by :func:`workbench.figures.closure` after every
figure module is imported), so a method whose figure module registers students is compared here
without an edit, whatever the import order. A teacher without students is skipped (its data holds
no ``model`` dim and is not trained for).

What is reused: the students' runs (trained by their methods' own steps, named in each student's
``after``), their held-out accuracies (the runs' manifests); each comparison's Dataset is stored as
figure data, so all five items draw from the four stores. CPU latency (``compare.latency``) is an
exclusive step: it runs after every other step, with no training alongside (figures are drawn meanwhile in
one process; interleaved rounds make such load hit every model alike).

Budget (:data:`BUDGETS`): on the demo, 20 held-out digits of all ten classes (``demo:val[25::50]``, two per class;
the demo split is sorted by class, so ``demo:val[:20]`` would be all zeros; 20 rather than the CLI's 32 keeps
``workbench figures --all`` in its cold budget), Integrated Gradients from 32 Gauss–Legendre nodes, doubled per
image while its relative completeness gap exceeds 0.05, up to 256 (FAR's logits change steeply along the path: at a
fixed 16 nodes its gap reached 5.6; compare.table2 reports each model's gap and nodes), 64 deletion / insertion steps
(1/64 of the pixels per step; at 16 steps, 49 pixels each, a digit's ~150 foreground pixels went in one or two
steps), IG and a random
map only (what the figures show; Saliency and rollout are a ``workbench compare`` away); top-1 agreement and KL on
all 1000 held-out digits (forward passes only).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
import xarray as xr

from workbench.figures import STUDENTS, dataset, figure, group, load_all
from workbench.figures.compare.findings import FINDING
from workbench.figures.context import Context
from workbench.plots.table import Table

PAPER = "compare"
group(PAPER, "Teacher vs compressed", place=1)
#: demo teacher archs (``workbench train teacher --arch``), in the order the figures show them
ARCHS = ("vit", "swin", "cnn")
ARCH_TITLE = {"vit": "ViT teacher", "swin": "Swin teacher", "cnn": "CNN teacher"}
TEACHER = "teacher"  # the teacher's ``model`` label


@dataclass(frozen=True)
class CompareBudget:
    """How much of the comparison one profile computes."""

    images: str  # image spec of the comparison (class-spread: the demo split is sorted by class)
    agreement_images: str  # image spec of top-1 agreement and KL (forward passes only)
    ig_steps: int  # Gauss–Legendre nodes of Integrated Gradients
    steps: int  # deletion / insertion steps
    latency_rounds: int  # timed rounds of compare.latency (each times every model once, interleaved)
    ig_tolerance: float | None = 0.05  # relative completeness gap above which an image's IG doubles its nodes …
    ig_max_steps: int = 256  # … up to this many (analysis.attribution.refined_integrated_gradients)
    attributions: tuple[str, ...] = ("integrated_gradients", "random")  # what the figures show: IG, random = chance


BUDGETS = {
    "demo": CompareBudget("demo:val[25::50]", "demo:val", ig_steps=32, steps=64, latency_rounds=24),
    "smoke": CompareBudget("demo:val[50::200]", "demo:val[::8]", ig_steps=4, steps=8, latency_rounds=3,
                           ig_max_steps=16),
    "paper": CompareBudget("demo:val[15::31]", "demo:val", ig_steps=50, steps=64, latency_rounds=100),
}


def students_of(arch: str) -> list:
    """The registered students (:class:`~workbench.figures.StudentSpec`) of the demo teacher ``arch``."""
    load_all()
    return [s for s in STUDENTS.values() if s.teacher == arch]


def _needs(arch: str):
    def needs() -> tuple[str, ...]:
        studs = students_of(arch)
        return (f"teacher.{arch}", *dict.fromkeys(a for s in studs for a in s.after)) if studs else ()

    return needs


def _needs_all() -> tuple[str, ...]:
    return tuple(dict.fromkeys(a for arch in ARCHS for a in _needs(arch)()))


def _models(ctx: Context, arch: str):
    """The teacher run, the student runs ``{label: run}`` and the loaded models of ``arch``."""
    from workbench.compare import load_models

    teacher = ctx.teacher(arch)
    runs = {s.label: ctx.use_run(s.run(ctx)) for s in students_of(arch)}
    models = load_models(teacher.id, {k: r.id for k, r in runs.items()}, teacher_name=TEACHER, device=ctx.device)
    return teacher, runs, models


def deployed(arch: str, models) -> dict:
    """label -> the model whose MACs and latency are reported: a student's deploy form where it registers one."""
    specs = {s.label: s for s in students_of(arch)}
    return {k: specs[k].deploy(m.model) if k in specs and specs[k].deploy is not None else m.model
            for k, m in models.loaded.items()}


# ---------------------------------------------------------------------------------------- data
def _comparison(arch: str):
    def make(ctx: Context) -> xr.Dataset:
        from workbench.compare import compare_loaded
        from workbench.pipelines.common import model_counts

        if not students_of(arch):
            return xr.Dataset(attrs={"arch": arch, "title": ARCH_TITLE[arch], "students": "[]"})
        b = BUDGETS[ctx.profile.name]
        teacher, runs, models = _models(ctx, arch)
        # image_spec: the paper profile's images come from the user's val/
        ds = compare_loaded(models, ctx.image_spec(b.images), ig_steps=b.ig_steps, ig_tolerance=b.ig_tolerance,
                            ig_max_steps=b.ig_max_steps, steps=b.steps, attributions=b.attributions,
                            infidelity=False, correspondence={s.label: s.blocks for s in students_of(arch)
                                                              if s.blocks is not None})
        held = compare_loaded(models, ctx.image_spec(b.agreement_images), parts=("predictions",))
        specs = {s.label: s for s in students_of(arch)}
        order = list(ds["model"].values)
        every = {TEACHER: teacher, **runs}
        counts = {k: model_counts(m, models.input_size) for k, m in deployed(arch, models).items()}
        ds = ds.assign(
            val_acc=("model", [every[m].manifest["results"]["val_acc"] for m in order]),
            params=("model", [counts[m]["params"] for m in order]),
            macs=("model", [counts[m]["macs"] for m in order]),
            heldout_agreement=("model", held["agreement"].sel(model=order).values),
            heldout_kl=("model", held["kl_mean"].sel(model=order).values),
            heldout_accuracy=("model", held["accuracy"].sel(model=order).values),
            heldout_correct=(("model", "heldout_sample"), held["correct"].sel(model=order).values),  # paired tests
        ).assign_coords(run=("model", [every[m].id for m in order]),
                        method=("model", ["teacher" if m == TEACHER else specs[m].method for m in order]),
                        deploy_form=("model", [int(m != TEACHER and specs[m].deploy is not None) for m in order]))
        ds["val_acc"].attrs.update(units="fraction", long_name="held-out top-1 accuracy (the run's own evaluation)")
        ds["macs"].attrs.update(units="MACs per image", long_name="methods.flops.count_macs")
        return ds.assign_attrs(arch=arch, title=f"{ARCH_TITLE[arch]} ({teacher.id})", teacher_run=teacher.id,
                               heldout_images=held.sizes["sample"], agreement_images=ctx.image_spec(b.agreement_images),
                               budget=json.dumps(asdict(b)), students=json.dumps(order[1:]))

    make.__name__ = f"compare_{arch}"
    return make


for _arch in ARCHS:
    dataset(f"compare.{_arch}", after=_needs(_arch))(_comparison(_arch))


@dataset("compare.latency", after=_needs_all, exclusive=True)
def latency_data(ctx: Context) -> xr.Dataset:
    """Single-thread CPU latency at batch 1 of every teacher and student: the median of interleaved rounds
    (``ms``, ``ratio`` to the teacher) and every round's time (``ms_rounds(row, round)``), paired by round."""
    import torch

    from workbench.runtime import cpu_threads

    rounds = BUDGETS[ctx.profile.name].latency_rounds
    rows, per_round = [], []
    for arch in ARCHS:
        if not students_of(arch):
            continue
        _, runs, models = _models(ctx, arch)
        cpu = {k: m.float().cpu().eval() for k, m in deployed(arch, models).items()}
        x = torch.randn(1, *models.input_size, generator=torch.Generator().manual_seed(0))
        times: dict[str, list[float]] = {k: [] for k in cpu}
        with cpu_threads(1), torch.inference_mode():
            for m in cpu.values():  # warm-up
                for _ in range(3):
                    m(x)
            for _ in range(rounds):  # interleaved: a load spike hits every model alike
                for k, m in cpu.items():
                    t0 = time.perf_counter()
                    m(x)
                    times[k].append(1e3 * (time.perf_counter() - t0))
        base = statistics.median(times[TEACHER])
        for k, t in times.items():
            rows.append({"arch": arch, "model": k, "ms": statistics.median(t), "ratio": statistics.median(t) / base})
            per_round.append(t)
        ctx.log(f"  latency {arch}: " + ", ".join(f"{k} {statistics.median(t):.2f} ms" for k, t in times.items()))
    from workbench.xrutils import rows_to_dataset

    ds = rows_to_dataset(rows).assign(ms_rounds=(("row", "round"), np.array(per_round)))
    ds["ms_rounds"].attrs.update(units="ms", long_name="each interleaved round's time (the verdict pairs them by round)")
    return ds.assign_attrs(rounds=rounds, torch=str(torch.__version__))


# ---------------------------------------------------------------------------------------- plots
def _groups(*datasets: xr.Dataset) -> dict[str, xr.Dataset]:
    return {ds.attrs["title"]: ds for ds in datasets if "model" in ds.dims}


def plot_fig1(*datasets: xr.Dataset):
    from workbench.plots.compare import plot_cka

    return plot_cka(_groups(*datasets))


def plot_fig2(*datasets: xr.Dataset):
    from workbench.plots.compare import plot_map_agreement

    return plot_map_agreement(_groups(*datasets))


def plot_fig3(*datasets: xr.Dataset):
    from workbench.plots.compare import plot_attributions

    return plot_attributions(_groups(*datasets))


def plot_fig4(*datasets: xr.Dataset):
    from workbench.plots.compare import plot_faithfulness

    return plot_faithfulness(_groups(*datasets))


def ig_gap_note(ds: xr.Dataset) -> str:
    """Integrated Gradients' completeness per model: median and largest relative gap, and the nodes it took."""
    b = json.loads(ds.attrs["budget"])
    parts = []
    for m in ds["model"].values:
        gap = np.abs(ds["ig_delta"].sel(model=m).values)
        if not np.isfinite(gap).any():
            continue
        nodes = ds["ig_steps"].sel(model=m).values if "ig_steps" in ds else np.array([b["ig_steps"]])
        span = f"{int(nodes.min())}–{int(nodes.max())}" if nodes.min() != nodes.max() else f"{int(nodes.min())}"
        parts.append(f"{m} {np.nanmedian(gap):.3f} / {np.nanmax(gap):.3f} ({span} nodes)")
    tol = b.get("ig_tolerance")
    return ("Integrated Gradients' relative completeness gap |Σ attributions − (f(x) − f(b))| / |f(x) − f(b)|, median / "
            "largest over the images: " + "; ".join(parts) + f". Each image starts at {b['ig_steps']} Gauss–Legendre "
            "nodes" + (f" and doubles them while its gap exceeds {tol:g}, up to {b.get('ig_max_steps')}" if tol else "")
            + "; a gap left above that comes from a path along which the logit changes steeply or jumps (LSTM "
            "gates, top-k key sets switching, ReLU kinks) or from a small f(x) − f(b): those maps are approximate.")


def _fmt_count(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def _rows(*datasets: xr.Dataset) -> tuple[pd.DataFrame, list[str], str]:
    """One row per student of every method, its teacher's numbers beside, the notes and the profile."""
    *comparisons, lat = datasets
    lat_rows = {(str(a), str(m)): float(r) for a, m, r in zip(lat["arch"].values, lat["model"].values,
                                                               lat["ratio"].values)} if "arch" in lat else {}
    rows, notes = [], []
    for ds in comparisons:
        if "model" not in ds.dims:
            continue
        rows += _student_rows(ds, lat_rows)
        notes += _comparison_notes(ds)
    notes += _general_notes(lat)
    teachers = [f"{ds.attrs['title']}" for ds in comparisons if "model" in ds.dims]
    notes.insert(0, "both|teachers: " + "; ".join(teachers) + ".")
    frame = pd.DataFrame(rows) if rows else pd.DataFrame({"student": []})
    profile = next((ds.attrs.get("profile") for ds in comparisons if ds.attrs.get("profile")), "")
    return frame, notes, profile


def _student_rows(ds: xr.Dataset, lat_rows: dict[tuple[str, str], float]) -> list[dict]:
    """The table rows of one comparison's students (``lat_rows``: (arch, student) -> CPU latency × teacher)."""
    from workbench.plots.compare import matched_cka

    rows = []
    arch = ds.attrs["arch"]
    cka = matched_cka(ds).mean("teacher_layer", skipna=True)
    t = {v: float(ds[v].sel(model=TEACHER)) for v in ("val_acc", "params", "macs")}
    ig = "integrated_gradients"
    del_t = float(ds["deletion_auc"].sel(model=TEACHER, attribution=ig).mean())
    ins_t = float(ds["insertion_auc"].sel(model=TEACHER, attribution=ig).mean())
    maps = ds["map_spearman_avg"].mean(["sample", "layer"]) if "map_spearman_avg" in ds else None
    for m in ds["model"].values[1:]:
        m = str(m)
        sel = ds.sel(model=m)
        kinds = sorted({str(k) for k in sel["map_measure"].values if str(k)}) if "map_measure" in ds.coords else []
        rho = float(maps.sel(model=m)) if maps is not None else np.nan
        ratio = lat_rows.get((arch, m))
        rows.append({
            "student": m, "method": str(sel["method"].values),
            "top-1 % (teacher)": f"{100 * float(sel['val_acc']):.1f} ({100 * t['val_acc']:.1f})",
            "weights (× teacher)": f"{_fmt_count(float(sel['params']))} ({float(sel['params']) / t['params']:.2f}×)",
            "MACs (× teacher)": f"{_fmt_count(float(sel['macs']))} ({float(sel['macs']) / t['macs']:.2f}×)",
            "CPU latency × teacher": "–" if ratio is None else f"{ratio:.2f}",
            "top-1 agreement %": f"{100 * float(sel['heldout_agreement']):.1f}",
            "KL (nats)": f"{float(sel['heldout_kl']):.3f}",
            # what the student kept (compare.table2)
            "CKA": f"{float(cka.sel(model=m)):.2f}",
            "token-map ρ": "–" if not np.isfinite(rho) else f"{rho:.2f} ({'/'.join(kinds)})",
            "IG deletion AUC ↓ (teacher)": f"{float(sel['deletion_auc'].sel(attribution=ig).mean()):.3f} ({del_t:.3f})",
            "IG insertion AUC ↑ (teacher)": f"{float(sel['insertion_auc'].sel(attribution=ig).mean()):.3f} ({ins_t:.3f})",
        })
    return rows


def _comparison_notes(ds: xr.Dataset) -> list[str]:
    """The notes one comparison adds (saliency ceiling, train-form costs, missing maps, IG gap, images and budget)."""
    notes = []
    t_macs = float(ds["macs"].sel(model=TEACHER))
    maps = ds["map_spearman_avg"].mean(["sample", "layer"]) if "map_spearman_avg" in ds else None
    if maps is not None and "saliency" in {str(k) for k in ds["map_measure"].sel(model=TEACHER).values}:
        notes.append("kept|" f"{ds.attrs['title']}: the teacher's own gradient saliency against its attention scores "
                     f"ρ = {float(maps.sel(model=TEACHER)):.2f}, the ceiling for students compared by saliency.")
    same = [str(m) for m in ds["model"].values[1:] if float(ds["macs"].sel(model=m)) == t_macs
            and not int(ds["deploy_form"].sel(model=m))]
    if same:
        notes.append("cost|" f"{', '.join(same)}: as many MACs as the teacher — the run saves its train form (e.g. gated, "
                     "computing every pair) and the student registers no deploy form (figures.student(deploy=...)), "
                     "so MACs and latency are of that form.")
    missing = {k: v for k, v in json.loads(ds.attrs.get("notes", "{}")).get("maps", {}).items() if k != TEACHER}
    if missing:
        notes.append("kept|" f"{ds.attrs['title']}, no token maps: " + "; ".join(f"{k}: {v}" for k, v in missing.items()) + ".")
    if "ig_delta" in ds:  # relative IG completeness gap |Σ attributions − (f(x) − f(b))| / |f(x) − f(b)|
        notes.append("kept|" f"{ds.attrs['title']}: " + ig_gap_note(ds))
    b = json.loads(ds.attrs["budget"])
    notes.append("both|" f"{ds.attrs['title']}: maps, CKA and faithfulness on {ds.sizes['sample']} held-out images "
                 f"({ds.attrs['images']}); agreement and KL on {int(ds.attrs['heldout_images'])} "
                 f"({ds.attrs['agreement_images']}); IG with {b['ig_steps']} nodes, {b['steps']} deletion steps.")
    return notes


def _general_notes(lat: xr.Dataset) -> list[str]:
    """The notes on every column (what each measures), latency's rounds from ``lat``."""
    return [
        "cost|top-1: each run's own held-out evaluation (demo: 1000 digits).",
        "kept|CKA: linear, debiased, token-averaged block "
        "outputs, each teacher layer against the student layer at the same relative depth, mean over teacher layers. "
        "token-map ρ: Spearman rank correlation of head-averaged token maps with the teacher's attention, mean over "
        "layers and images; 'saliency' = the student's gradient-saliency dependency (attention-free blocks).",
        "kept|IG deletion / insertion AUC: area under the probability of the teacher's predicted class as the most attributed "
        "pixels are deleted (lower = more faithful) or inserted into a blurred image (higher = more faithful), each "
        "model with its own Integrated Gradients maps.",
        "cost|weights: every weight the model (its deploy form where it registers one) stores — parameters plus floating-"
        "point persistent buffers (a deploy form's sliced weights and biases); not masks, indices, caches or BatchNorm "
        "statistics. SlimSwin's deploy form stores each kept (window group, head) rectangle's q/k/v rows and "
        "relative-position bias (shift mask baked in) separately, so a head kept in several window groups is stored "
        "several times and the form can hold more weights than the teacher. MACs: what the counted form executes "
        "(Sparsifiner: its sparse path, kept query-key pairs only, equal to sparsifiner.table2's executed column).",
        "kept|token-map ρ of a student of another depth (Non-deep): its block i against the last teacher block of the "
        "group it replaces (the student's declared correspondence), mean over its blocks.",
        "cost|CPU latency: batch 1, one thread, median of " + (f"{int(lat.attrs['rounds'])} interleaved rounds"
                                                          if "rounds" in lat.attrs else "interleaved rounds")
        + ", measured after every other preparation step with no training alongside (figures were being drawn on the "
        "other core), PyTorch eager; MACs by methods.flops.count_macs.",
    ]


_KEPT = ("CKA", "token-map ρ", "IG deletion AUC ↓ (teacher)", "IG insertion AUC ↑ (teacher)")


def table1(*datasets: xr.Dataset) -> Table:
    """Accuracy and cost of every student beside its teacher (8 columns; what it kept: :func:`table2`)."""
    frame, notes, profile = _rows(*datasets)
    keep = [c for c in frame.columns if c not in _KEPT]
    return Table(frame[keep], f"Teacher vs compressed: accuracy and cost, every method (profile {profile})",
                 _notes(notes, "cost"))


def table2(*datasets: xr.Dataset) -> Table:
    """What every student kept of its teacher: CKA, token maps, attribution faithfulness (module docstring)."""
    frame, notes, profile = _rows(*datasets)
    keep = ["student", *[c for c in _KEPT if c in frame.columns]]
    return Table(frame[keep], f"Teacher vs compressed: what the students kept, every method (profile {profile})",
                 _notes(notes, "kept"))


def _notes(notes: list[str], kind: str) -> list[str]:
    """The notes of one table: tagged ``kind|`` or ``both|``."""
    return [n.split("|", 1)[1] for n in notes if n.split("|", 1)[0] in (kind, "both")]


# ---------------------------------------------------------------------------------------- figures
_DATA = tuple(f"compare.{a}" for a in ARCHS)


def _who() -> str:
    """The students the comparison shows, as registered by the methods' figures, grouped by teacher."""
    by_method: dict[str, list[str]] = {}
    for arch in ARCHS:
        for s in students_of(arch):
            by_method.setdefault(s.method, []).append(s.label)
    from workbench.pipelines import METHODS

    def name(m: str) -> str:  # "FAR" of "FAR — attention replaced by BiLSTMs"
        return (METHODS[m].paper_title.split(" — ")[0] if m in METHODS else "") or m

    named = [f"{name(m)}: {', '.join(labels)}" for m, labels in by_method.items()]
    return (f"every student registered by a method's figures ({'; '.join(named)}), grouped by the demo teacher it was "
            "compressed from")


figure("compare.fig1", paper=PAPER, data=_DATA, plot=plot_fig1,
       caption=lambda: "Linear CKA (debiased, float64) of block outputs averaged over tokens, teacher layer (rows) × student "
               f"layer (columns), on 20 held-out digits of all ten classes, for {_who()}. The first panel of a row is the "
               "teacher against itself; dots mark the student layer at the same relative depth, whose mean is in each "
               "title. Students of another depth (Non-deep) and other block types (FAR's BiLSTMs, SA-ResNet stages) line "
               "up by the same measure.")
figure("compare.fig2", paper=PAPER, data=_DATA, plot=plot_fig2,
       caption="Token-map agreement with the teacher's attention, per teacher block: Spearman rank correlation (top) "
               "and Jensen–Shannon divergence in bits (bottom) of head-averaged token-to-token maps, mean ± sd over the "
               "images. A student of another depth (Non-deep) declares which teacher blocks each of its blocks replaces; its "
               "block is scored against the last of them and plotted there (Non-deep 3×2 at teacher blocks 1, 3, 5; "
               "2×3 at 2, 5). Students with attention are compared by their attention probabilities; attention-free students "
               "(FAR) by their gradient-saliency dependency, against which the teacher's own saliency-vs-attention "
               "agreement (dashed) is the ceiling. Students without an attention hook are listed under the panel.")
figure("compare.fig3", paper=PAPER, data=_DATA, plot=plot_fig3,
       caption=f"Integrated Gradients (captum; {BUDGETS['demo'].ig_steps} Gauss–Legendre nodes on the demo, doubled per "
               f"image while its relative completeness gap exceeds {BUDGETS['demo'].ig_tolerance:g}, up to "
               f"{BUDGETS['demo'].ig_max_steps}; baseline = the dataset mean) of the class the "
               "teacher predicts, for four held-out digits of different classes: the digits on top, the teacher's maps "
               "below them, then every student's; red = evidence for the class, blue = against, each map scaled to the "
               "99th percentile of its own |values| and clipped (a few extreme pixels no longer wash out the rest); "
               "ρ = the map's rank correlation with the teacher's map of the same image; the gaps are in compare.table2.")
figure("compare.fig4", paper=PAPER, data=_DATA, plot=plot_fig4,
       caption="Faithfulness of each model's own Integrated Gradients maps: probability of the teacher's predicted class "
               "as the most attributed pixels are deleted (set to zero, top; lower area = more faithful) or inserted "
               f"into a blurred copy (bottom; higher area = more faithful), mean over 20 held-out digits, {BUDGETS['demo'].steps} steps (demo), AUC "
               "under the panel; grey dotted: the teacher with a random map (chance).")
figure("compare.table1", paper=PAPER, kind="table", data=(*_DATA, "compare.latency"), plot=table1,
       finding=FINDING,
       caption="One row per compressed model of every method, accuracy and cost: held-out top-1 beside its teacher's, "
               "weights and MACs (ratio to the teacher; weights wherever stored, MACs executed by the deploy form), "
               "single-thread CPU latency ratio to the teacher, top-1 agreement and KL on the held-out set. The verdict "
               "tests accuracy and cost per student: top-1 paired with the teacher's on the same images, MACs, and "
               "latency paired by interleaved timing round (geometric mean ratio, 95 % t-interval of the log ratio).")
figure("compare.table2", paper=PAPER, kind="table", data=(*_DATA, "compare.latency"), plot=table2,
       caption="What each compressed model kept of its teacher: mean CKA at matched depth, token-map agreement with "
               "the teacher's attention (students of another depth paired by their declared block correspondence), "
               "and Integrated Gradients deletion / insertion AUC beside the teacher's (split from compare.table1 to "
               "stay readable at paper size).")
