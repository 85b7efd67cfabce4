"""The ``workbench`` command line.

Every command prints a clear one-line error and exits non-zero on bad input (missing path, wrong
checkpoint, unknown id, damaged store); nothing is left half-written because every file is
written to a temporary name and renamed. The CLI owns every flag: the shared ones are defined
once here, a method's own come from its registry entry (:class:`workbench.pipelines.Option`).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import warnings
from typing import Callable, Sequence

EXAMPLES = {
    "info": "workbench info",
    "train": ("workbench train teacher --arch vit --profile demo\n  workbench train teacher --arch swin --profile smoke --force\n"
              "  torchrun --nproc_per_node 8 -m workbench.cli train teacher --arch vit --profile paper --data ~/imagenet\n"
              "  workbench train teacher --arch swin --model swin-b --profile paper --data ~/imagenet "
              "--checkpoint swin_b.safetensors --epochs 0"),
    "analyze": (
        "workbench analyze attention --model teacher-vit-demo --images 'demo:val[:8]' --out stores/vit.nc\n"
        "  workbench analyze attention --model deit_tiny_patch16_224 --checkpoint deit_tiny.safetensors "
        "--images skimage:astronaut,chelsea --out stores/deit.nc\n"
        "  workbench analyze attention --model deit_tiny_patch16_224 --checkpoint deit_tiny.safetensors --img-size 384 "
        "--images skimage:coffee --out stores/deit384.nc"
    ),
    "compare": (
        "workbench compare --teacher teacher-vit-demo --student FAR=far-vit-demo --student far_pruned-vit-demo "
        "--images 'demo:val[15::31]' --out stores/far.nc\n"
        "  workbench compare --teacher deit_tiny_patch16_224 --checkpoint deit_tiny.safetensors "
        "--student small=deit_small_patch16_224 --checkpoint small=deit_small.safetensors "
        "--images skimage:astronaut,chelsea,coffee,rocket --out stores/deit.nc"
    ),
    "explain": ("workbench explain --method generic_attention,rollout,gradcam,ig --model teacher-vit-demo "
                "--images 'demo:val[:16]' --perturbation --out stores/explain.nc"),
    "features": ("workbench features --teacher teacher-vit-demo --student far-vit-demo --block 3 --width 512 --k 16 "
                 "--out stores/far-features.nc"),
    "inspect": "workbench inspect stores/vit.nc\n  workbench inspect stores/val.zarr",
    "stream": ("workbench analyze attention --model teacher-vit-demo --images demo:val --queries cls --dtype float16 "
               "--out stores/val.zarr\n"
               "  torchrun --nproc_per_node 2 -m workbench.cli analyze attention --model teacher-vit-demo --images demo:train "
               "--out stores/train.zarr"),
    "reduce": ("workbench reduce stores/val.zarr --over sample --by label --stat mean --out stores/val-class-means.nc\n"
               "  workbench reduce stores/val.zarr --stat quantile --q 0.9 --scheduler tcp://10.0.0.5:8786 --out stores/q90.zarr"),
    "figures": "workbench figures --list\n  workbench figures --all\n  workbench figures --all --jobs 1\n"
               "  workbench figures teacher.fig1 far --profile smoke",
    "run": "workbench run far --teacher teacher-vit-demo\n  workbench run slimswin --teacher teacher-swin-demo --ratio 1/3",
}


def _add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to compute (default: auto)")


def _add_profile(p: argparse.ArgumentParser) -> None:
    from workbench.profiles import PROFILES

    p.add_argument("--profile", default="demo", choices=list(PROFILES), help="budgets (default: demo)")


def _add_run_flags(p: argparse.ArgumentParser, force_help: str) -> None:
    _add_profile(p)
    _add_device(p)
    p.add_argument("--data", default=None, help="ImageFolder root with train/ and val/ (required by --profile paper)")
    p.add_argument("--force", action="store_true", help=force_help)
    _add_skip_bad(p)


def _add_skip_bad(p: argparse.ArgumentParser) -> None:
    p.add_argument("--skip-bad-images", action="store_true",
                   help="leave unreadable image files (truncated, damaged) out with a warning naming each, instead of "
                        "stopping at the first")


def _skipping(args):
    """The block in which ``--skip-bad-images`` holds (this process and the worker processes it starts)."""
    from workbench.data import skipping_bad_images

    return skipping_bad_images(bool(getattr(args, "skip_bad_images", False)))


def _add_budget_flags(p: argparse.ArgumentParser, own: Sequence[str] = ()) -> None:
    """The budget overrides every run takes (``workbench.pipelines.Overrides``); a method's own option of the same
    name (Non-deep ViT's --epochs) keeps its meaning."""
    g = p.add_argument_group("budget overrides (a trial on a laptop before the real run; they name the run)")
    if "epochs" not in own:
        g.add_argument("--epochs", action="append", metavar="[PHASE=]N",
                       help="training epochs of every phase, or of PHASE (repeat for more); the plan printed before "
                            "the run names the phases")
    if "steps" not in own:
        g.add_argument("--steps", action="append", metavar="[NAME=]N",
                       help="optimizer steps of step-counted phases (Non-deep ViT: warmup, adjust)")
    if "batch_size" not in own:
        g.add_argument("--batch-size", dest="batch_size", action="append", metavar="[PHASE=]N",
                       help="global batch size of every phase, or of PHASE")
    g.add_argument("--images", type=int, default=None, metavar="N", help="train on N images of the training set")


def _overrides(args, own: Sequence[str] = ()):
    from workbench.pipelines import Overrides, parse_override

    return Overrides(**{k: parse_override(getattr(args, k, None), "--" + k.replace("_", "-"))
                        for k in ("epochs", "steps", "batch_size") if k not in own},
                     images=getattr(args, "images", None))


def _is_rank0() -> bool:
    import os

    return int(os.environ.get("RANK", "0")) == 0  # under torchrun only rank 0 reports


def _add_option(p: argparse.ArgumentParser, opt) -> None:
    if opt.switch:
        p.add_argument(opt.flag, dest=opt.name, action=argparse.BooleanOptionalAction, default=None,
                       help=f"{opt.help} (default: {'on' if opt.default else 'off'})")
        return
    default = f" (default: {opt.default})" if opt.default is not None else ""
    p.add_argument(opt.flag, dest=opt.name, type=opt.type, choices=opt.choices, required=opt.required,
                   default=None, help=opt.help + default)


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (the first word that is not a flag), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; only ``command``'s flags are built.

    Every subcommand is listed with its help line, but the flags are added to the chosen one only: the flags of
    ``train`` and ``run`` come from the method registry, which imports torch and timm (seconds), so
    ``workbench --help`` and a command that needs no registry must not build them.
    """
    p = argparse.ArgumentParser(
        prog="workbench",
        description="Compress vision transformers with five published methods and look inside the results.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  " + "\n  ".join(EXAMPLES.values()),
    )
    sub = p.add_subparsers(dest="command", required=True)

    def add(parent, name: str, help: str, examples: str = "") -> argparse.ArgumentParser:
        return parent.add_parser(name, help=help, description=help, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=("examples:\n  " + examples) if examples else None)

    add(sub, "info", "Versions, device, where runs and stores live, and what is there.", EXAMPLES["info"])

    t = add(sub, "train", "Train a teacher (a demo teacher, or any timm model on --data) as a run.", EXAMPLES["train"])
    if command == "train":
        _train_flags(t)
    a = add(sub, "analyze", "Run an analysis extractor on a model and images; write an xarray store.", EXAMPLES["analyze"])
    if command == "analyze":
        _analyze_flags(a)
    c = add(sub, "compare", "Compare a teacher with compressed students (representations, token maps, predictions, "
            "attributions and their faithfulness); write one xarray store.", EXAMPLES["compare"])
    if command == "compare":
        _compare_flags(c)
    e = add(sub, "explain", "Explain a model's decisions with the field's attribution methods (and test their "
            "faithfulness); write one xarray store.", EXAMPLES["explain"])
    if command == "explain":
        from workbench.explain.run import add_explain_flags
        from workbench.scale.faithfulness import add_stream_flags

        add_explain_flags(e)
        add_stream_flags(e)
    ft = add(sub, "features", "Diff a teacher and a student feature by feature: train a crosscoder over one block "
             "pair (resumable) and write which latents are shared, teacher-only or student-only.", EXAMPLES["features"])
    if command == "features":
        from workbench.features.run import add_features_flags

        add_features_flags(ft)
    i = add(sub, "inspect", "Summarise a store: variables, dims and provenance (checks that it opens).", EXAMPLES["inspect"])
    i.add_argument("store", help="path of a .nc or .zarr store")
    r = add(sub, "reduce", "Reduce a store over samples (mean, std, quantile, top-k; per group with --by), lazily with "
            "dask; write a new store.", EXAMPLES["reduce"])
    if command == "reduce":
        from workbench.scale.cli import add_reduce_parser

        add_reduce_parser(r)
    f = add(sub, "figures", "Regenerate paper figures and tables into figures/ with an index.", EXAMPLES["figures"])
    if command == "figures":
        _figures_flags(f)
    r = add(sub, "run", "Run a compression method end to end (as resumable runs).", EXAMPLES["run"])
    if command == "run":
        _run_flags(r, add)
    return p


def _train_flags(t: argparse.ArgumentParser) -> None:
    from workbench.pipelines import get_method

    t.add_argument("what", choices=["teacher"], help="what to train")
    for opt in get_method("teacher").options:
        _add_option(t, opt)
    _add_run_flags(t, "retrain even if a complete run exists")
    _add_budget_flags(t)


def _analyze_flags(a: argparse.ArgumentParser) -> None:
    a.add_argument("kind", help="analysis name: attention, window-attention, dependency, retention, window-saliency, ...")
    a.add_argument("--model", required=True, help="run id/dir, timm name, or hf:DIR (a Hugging Face save_pretrained folder)")
    a.add_argument("--native", action="store_true", help="hf:DIR only: analyse the HF model itself, run by transformers "
                                                         "(ViT, DeiT, DINOv2), not its timm conversion (the same maps)")
    a.add_argument("--checkpoint", default=None, help="local weights for a timm name (.safetensors, .pt, .pth)")
    a.add_argument("--seed", type=int, default=None, help="seed of the random initial weights of a timm name without "
                                                          "--checkpoint (default 0: every call sees the same network)")
    a.add_argument("--images", default="demo:val[:8]",
                   help="image spec: demo:val[:16], demo:val[50::100] (a step: one digit per class), "
                        "skimage:astronaut,chelsea, or a folder (flat or class sub-folders)")
    _add_skip_bad(a)
    a.add_argument("--out", required=True, help="store path: .nc (in memory, written at the end) or .zarr (streamed in "
                                                 "chunks, resumable, several processes under torchrun)")
    a.add_argument("--layers", default=None, help="comma-separated block indices (default: all)")
    from workbench.scale.cli import add_stream_flags

    add_stream_flags(a)
    a.add_argument("--img-size", type=int, default=None, help="input resolution for timm models (e.g. 384)")
    from workbench.analysis import cli_options

    for opt, kinds in cli_options().values():  # each extractor's own options (its registration declares them)
        a.add_argument(opt.flag, dest=f"x_{opt.name}", default=None, type=opt.type,
                       choices=list(opt.choices) if opt.choices else None, help=f"{', '.join(kinds)} only: {opt.help}")
    _add_device(a)


def _compare_flags(c: argparse.ArgumentParser) -> None:
    c.add_argument("--teacher", required=True, help="run id/dir, timm name, or hf:DIR (a Hugging Face folder)")
    c.add_argument("--student", action="append", required=True, metavar="[LABEL=]MODEL",
                   help="a student: run id/dir, timm name or hf:DIR, labelled LABEL (default: the reference); repeat for more")
    c.add_argument("--checkpoint", action="append", default=[], metavar="[LABEL=]PATH",
                   help="local weights of a timm-name model: PATH for the teacher, LABEL=PATH for the student LABEL; "
                        "repeat for more")
    c.add_argument("--images", default="demo:val[15::31]",
                   help="image spec (default: 32 held-out digits of all ten classes, demo:val[15::31])")
    c.add_argument("--out", required=True, help="store path (.nc)")
    c.add_argument("--parts", default=None, help="comma-separated parts: cka, maps, predictions, attributions, "
                                                 "faithfulness (default: all)")
    c.add_argument("--ig-steps", type=int, default=None, help="Integrated Gradients nodes (default 50)")
    c.add_argument("--steps", type=int, default=None, help="deletion / insertion steps (default 16)")
    c.add_argument("--target", default=None, choices=["teacher", "own", "label"],
                   help="class the attributions explain (default: the teacher's top-1)")
    c.add_argument("--explainers", default=None, metavar="NAMES",
                   help="comma-separated explainers of `workbench explain` (e.g. generic_attention,attnlrp,saliency): "
                        "each student's explanation agreement with the teacher's (Spearman, top-10%% overlap, 95%% "
                        "intervals over the images; keeps / loses its reasons) is added to the store (default: none)")
    c.add_argument("--explain-perturbation", action="store_true",
                   help="with --explainers: also every model's positive / negative perturbation AUC of its own maps "
                        "and each student's paired difference to the teacher")
    c.add_argument("--img-size", type=int, default=None, help="input resolution of timm-name models (e.g. 384)")
    _add_device(c)


def _figures_flags(f: argparse.ArgumentParser) -> None:
    f.add_argument("ids", nargs="*", help="figure ids or paper prefixes (e.g. far.fig4, far)")
    g = f.add_mutually_exclusive_group()
    g.add_argument("--list", action="store_true", help="list registered figures")
    g.add_argument("--all", action="store_true", help="render every registered figure")
    f.add_argument("--out", default="figures", help="output directory (default: figures)")
    f.add_argument("--jobs", type=int, default=None,
                   help="worker processes that train runs and compute the figures' data before drawing "
                        "(default: one per CPU core on the CPU, 1 on a GPU; 1 = all in this process)")
    _add_profile(f)
    _add_device(f)
    f.add_argument("--force", action="store_true",
                   help="recompute analyses and figure data and redraw every figure (runs are reused)")
    f.add_argument("--pdf", action="store_true", help="also write every figure as a vector PDF (default: PNG only)")
    f.add_argument("--data", default=None,
                   help="ImageFolder root with train/ and val/ (--profile paper: the figures use your teacher runs on it, "
                        "its val/ images, and the method runs of the same budget overrides)")
    _add_budget_flags(f)


def _run_flags(r: argparse.ArgumentParser, add: Callable[..., argparse.ArgumentParser]) -> None:
    from workbench.pipelines import load_all as load_methods

    rs = r.add_subparsers(dest="method", required=True)
    for name, entry in sorted(load_methods().items()):
        if entry.teacher is None:
            continue  # the teachers: `workbench train teacher`
        mp = add(rs, name, entry.summary, "\n  ".join(entry.examples))
        mp.add_argument("--teacher", default=None,
                        help=f"teacher run id/dir, a demo arch ({entry.teacher}: the profile's demo teacher, trained if "
                             f"missing; the default), a timm {entry.family} name with --checkpoint, or hf:DIR (a "
                             "Hugging Face folder)")
        mp.add_argument("--checkpoint", default=None, help="weights of a timm-name teacher (.safetensors, .pt, .pth)")
        for opt in entry.options:
            _add_option(mp, opt)
        _add_run_flags(mp, "redo the method's runs even if complete (the teacher is reused)")
        _add_budget_flags(mp, [o.name for o in entry.options])


def cmd_info(args) -> int:
    import platform

    import torch
    from rich.console import Console
    from rich.table import Table

    from workbench.figures import load_all
    from workbench.provenance import versions
    from workbench.runs import home, list_runs

    con = Console(soft_wrap=True)  # long paths are not broken across lines
    v = versions()
    con.print(f"[bold]vit-workbench[/] {v['workbench_version']}  torch {v['torch_version']}  timm {v['timm_version']}  "
              f"python {platform.python_version()}")
    con.print(f"device: {'cuda (' + torch.cuda.get_device_name(0) + ')' if torch.cuda.is_available() else 'cpu'}, "
              f"{torch.get_num_threads()} threads")
    con.print(f"home: {home()}  (set WORKBENCH_HOME to move it)")
    runs = list_runs()
    if runs:
        tab = Table()
        tab.add_column("run", no_wrap=True)  # ids are never cut (they are copied into other commands)
        for header in ("status", "model", "val_acc", "wall time (s)"):
            tab.add_column(header)
        for r in runs:
            m = r.manifest
            acc = (m.get("results") or {}).get("val_acc")
            tab.add_row(r.id, m.get("status", "?"), str(m.get("model_name")), f"{acc:.4f}" if acc is not None else "-",
                        f"{m.get('wall_time_s', 0):.0f}")
        need = Console(width=100_000).measure(tab).maximum  # rich would squeeze the table into 80 columns when piped
        Console(width=max(con.width, need)).print(tab)
    else:
        con.print("no runs yet: `workbench train teacher --arch vit` or `workbench figures --all`")
    con.print(f"{len(load_all())} registered figures (`workbench figures --list`)")
    return 0


def _method_options(args, entry) -> dict:
    return {o.name: getattr(args, o.name) for o in entry.options if getattr(args, o.name, None) is not None}


def _print_run(run, entry) -> None:
    if not _is_rank0():
        return
    print(f"run: {run.dir}")
    if entry.report is not None:
        print(entry.report(run))
        return
    res = run.manifest.get("results", {})
    print("  " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()))


def cmd_train(args) -> int:
    from workbench.pipelines import get_method, run_method

    entry = get_method("teacher")
    with _skipping(args):
        run = run_method("teacher", None, args.profile, device=args.device, data=args.data, force=args.force,
                         overrides=_overrides(args), **_method_options(args, entry))
    _print_run(run, entry)
    return 0


def cmd_run(args) -> int:
    from workbench.pipelines import get_method, run_method

    entry = get_method(args.method)
    own = [o.name for o in entry.options]
    with _skipping(args):
        run = run_method(args.method, args.teacher, args.profile, teacher_checkpoint=args.checkpoint,
                         device=args.device, data=args.data, force=args.force, overrides=_overrides(args, own),
                         **_method_options(args, entry))
    _print_run(run, entry)
    return 0


def cmd_analyze(args) -> int:
    from workbench.analyze import run_analysis
    from workbench.scale.cli import cmd_stream, streamed

    if streamed(args):
        if args.native:
            raise ValueError("--native writes an in-memory .nc store; pass --out X.nc (or drop --native: the converted "
                             "model streams, with the same maps)")
        return cmd_stream(args)
    opts = {}
    if args.layers:
        opts["layers"] = [int(x) for x in args.layers.split(",")]
    from workbench.analysis import cli_options

    kind = args.kind.replace("-", "_")
    for opt, kinds in cli_options().values():
        if getattr(args, f"x_{opt.name}", None) is not None:
            if kind not in kinds:
                raise ValueError(f"{opt.flag} applies to the {', '.join(kinds)} analysis only")
            opts[opt.name] = getattr(args, f"x_{opt.name}")
    with _skipping(args):
        path = run_analysis(kind, args.model, args.images, args.out, checkpoint=args.checkpoint, seed=args.seed,
                            device=args.device, img_size=args.img_size, native=args.native, **opts)
    print(f"wrote {path}")
    return 0


def _checkpoints(values: Sequence[str], labels: Sequence[str]) -> dict[str, str]:
    """``--checkpoint`` values: ``LABEL=PATH`` for a model labelled LABEL, a bare ``PATH`` for the teacher."""
    out: dict[str, str] = {}
    for v in values:
        label, sep, path = v.partition("=")
        key, path = (label, path) if sep and label in labels else ("teacher", v)
        if key in out:
            raise ValueError(f"two checkpoints for {key!r}: {out[key]!r} and {path!r}")
        out[key] = path
    return out


def cmd_compare(args) -> int:
    from workbench.compare import parse_students, run_compare
    from workbench.plots.compare import summary_frame
    from workbench.provenance import RANDOM_INIT
    from workbench.store import open_store

    students = parse_students(args.student)
    opts = {k: getattr(args, k) for k in ("ig_steps", "steps", "target") if getattr(args, k) is not None}
    if args.parts:
        opts["parts"] = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    if args.explainers:
        opts["explainers"] = [e.strip() for e in args.explainers.split(",") if e.strip()]
        opts["explain_perturbation"] = args.explain_perturbation
    elif args.explain_perturbation:
        raise ValueError("--explain-perturbation needs --explainers NAMES (the maps whose perturbation is measured)")
    path = run_compare(args.teacher, students, args.images, args.out,
                       checkpoints=_checkpoints(args.checkpoint, ["teacher", *students]), device=args.device,
                       img_size=args.img_size, **opts)
    ds = open_store(path)
    print(summary_frame(ds).to_string(index=False))
    if "explain_reasons" in ds:
        _print_explain_agreement(ds)
    untrained = [m for m, src in json.loads(ds.attrs.get("models", "{}")).items() if src.get("weights") == RANDOM_INIT]
    if untrained:
        print(f"random-init weights: {', '.join(untrained)} (no checkpoint given: these rows describe untrained networks)")
    for part, why in json.loads(ds.attrs.get("skipped", "{}")).items():
        print(f"skipped {part}: {why}")
    for part, per_model in json.loads(ds.attrs.get("notes", "{}")).items():
        for model, why in per_model.items():
            print(f"note, {part}, {model}: {why}")
    ds.close()
    print(f"wrote {path}")
    return 0


def _print_explain_agreement(ds) -> None:
    """One line per student and explainer: mean Spearman ρ and top-10 % overlap with 95 % intervals, the verdict."""
    says = {"keeps": "keeps its teacher's reasons", "loses": "loses its teacher's reasons"}
    for m in ds["model"].values[1:]:
        for e in ds["explainer"].values:
            v = ds.sel(model=m, explainer=e)
            if str(v["explain_reasons"].item()):
                print(f"explanations, {m}, {e}: Spearman {float(v['explain_spearman_mean']):.2f} "
                      f"({float(v['explain_spearman_low']):.2f} … {float(v['explain_spearman_high']):.2f}), top-10% "
                      f"{float(v['explain_topk_mean']):.2f} ({float(v['explain_topk_low']):.2f} … "
                      f"{float(v['explain_topk_high']):.2f}) -> {says.get(v['explain_reasons'].item(), 'inconclusive')}")
                if "explain_auc_diff_mean" in v:
                    d = v.sel(order="positive")
                    print(f"    positive perturbation AUC, student − teacher: {float(d['explain_auc_diff_mean']):+.3f} "
                          f"({float(d['explain_auc_diff_low']):+.3f} … {float(d['explain_auc_diff_high']):+.3f}; "
                          "lower is more faithful)")


def cmd_inspect(args) -> int:
    from workbench.scale.cli import inspect_chunked, print_whole
    from workbench.store import open_store

    if inspect_chunked(args.store):
        return 0
    ds = open_store(args.store)
    print_whole(ds)
    ds.close()
    return 0


def cmd_reduce(args) -> int:
    from workbench.scale.cli import cmd_reduce as run

    return run(args)


def _figures_scope(args) -> dict:
    """--data and the budget overrides of ``workbench figures``: the ``data`` and ``overrides`` of its contexts (the
    spawned workers' too: they get them as arguments).

    Raises:
        ValueError: the paper profile without --data.
    """
    from workbench.profiles import get_profile

    if get_profile(args.profile).is_paper and args.data is None:
        raise ValueError("figures on the paper profile draw from your runs and data: pass --data ROOT (the ImageFolder "
                         "your teacher runs were recorded or trained on)")
    return {"data": args.data, "overrides": _overrides(args)}


def cmd_figures(args) -> int:
    import time

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from workbench import figures as F

    if args.list:
        specs = F.load_all()
        tab = Table("id", "kind", "paper", "caption", "data")
        for s in sorted(specs.values(), key=lambda s: s.id):
            tab.add_row(s.id, s.kind, s.paper, textwrap.shorten(s.caption, 70), ", ".join(s.data))
        Console(width=200).print(tab)
        return 0
    if not args.all and not args.ids:
        raise ValueError("name figure ids, or pass --all or --list")
    from workbench.figures.render import BackgroundDraw, draw_all  # (imports methods, torch: not for --list)
    from workbench.figures.schedule import default_jobs, prepare

    specs = list(F.load_all().values()) if args.all else F.get(args.ids)
    scope = _figures_scope(args)
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    t0 = time.perf_counter()
    steps = F.closure(dict.fromkeys(d for spec in specs for d in spec.data))
    jobs = min(args.jobs or default_jobs(args.device), max(1, len(steps)))
    written = []
    with Progress(transient=False) as prog:
        def log(line: str) -> None:
            prog.console.print(line, markup=False, highlight=False)

        task = prog.add_task(f"prepare ({jobs} job{'s' * (jobs > 1)})", total=len(steps))
        fig_task = prog.add_task("figures", total=len(specs), start=False)
        formats = ("png", "pdf") if args.pdf else ("png",)
        early: list = []  # figures drawn beside the timing steps (they need none of their data)
        background: list[BackgroundDraw] = []

        def draw_beside(exclusive: list[str]) -> None:
            if not exclusive or jobs <= 1:
                return
            early[:] = [s for s in specs if not set(F.closure(s.data)) & set(exclusive)]
            log(f"drawing {len(early)} figures beside the {len(exclusive)} timing steps (one process)")
            prog.start_task(fig_task)
            background.append(BackgroundDraw(early, args.profile, args.out, device=args.device, reuse=not args.force,
                                             formats=formats, on_done=lambda i: prog.advance(fig_task), **scope))

        try:
            prepare(steps, jobs=jobs, profile=args.profile, device=args.device, force=args.force, log=log,
                    on_done=lambda i, sec: prog.advance(task), before_exclusive=draw_beside, **scope)
        except BaseException:
            for b in background:
                b.cancel()
            raise
        t1 = time.perf_counter()
        prog.start_task(fig_task)
        late = [s for s in specs if s not in early]  # (all of them when nothing was drawn beside the timing steps)
        # beside a background worker, this process draws: the figures of the timing steps, then those still waiting
        more, reused_late = draw_all(late, args.profile, args.out, jobs=1 if background else min(
            args.jobs or default_jobs(args.device), max(1, len(late))), device=args.device, reuse=not args.force,
            log=log, on_done=lambda i: prog.advance(fig_task), formats=formats, **scope)
        written, reused = background[0].finish() if background else ([], 0)
        written, reused = written + more, reused + reused_late
    t2 = time.perf_counter()
    beside = f", {len(early)} of them beside the timing steps" if early else ""
    print(f"prepared {len(steps)} data in {t1 - t0:.0f} s ({jobs} job{'s' * (jobs > 1)}), drew {len(specs) - reused} "
          f"items ({reused} unchanged since they were drawn{beside}); {t2 - t1:.0f} s after the preparation")
    print(f"wrote {len(written)} files to {args.out}/ (gallery: {args.out}/index.md)")
    return 0


def cmd_features(args) -> int:
    from workbench.features.run import cmd_features as run

    return run(args)


def cmd_explain(args) -> int:
    if str(args.out).endswith(".zarr"):  # dataset scale: the faithfulness test streamed chunk by chunk
        from workbench.scale.faithfulness import cmd_stream

        return cmd_stream(args)
    from workbench.explain.run import cmd_explain as run
    from workbench.scale.faithfulness import refuse_stream_flags

    refuse_stream_flags(args)
    return run(args)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A workbench warning (e.g. random-init weights) as one ``workbench: warning:`` line on stderr; others as usual."""
    if category.__module__.startswith("workbench."):
        print(f"workbench: warning: {message}", file=sys.stderr)
    else:
        print(warnings.formatwarning(message, category, filename, lineno, line), end="", file=file or sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser(_command(argv)).parse_args(argv)
    handlers = {"info": cmd_info, "train": cmd_train, "analyze": cmd_analyze, "compare": cmd_compare, "explain": cmd_explain,
                "features": cmd_features,
                "figures": cmd_figures, "inspect": cmd_inspect, "run": cmd_run, "reduce": cmd_reduce}
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            rc = handlers[args.command](args)
        _leave_process_group()  # on success only: after a failure another rank may still be in a collective
        return rc
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume from the last checkpoint", file=sys.stderr)
        return 130
    except (ValueError, KeyError, FileNotFoundError, RuntimeError, OSError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(f"workbench: error: {msg}", file=sys.stderr)
        return 2


def _leave_process_group() -> None:
    """Under torchrun, leave the process group the command joined (NCCL warns at exit about one left open)."""
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
