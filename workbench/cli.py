"""The ``workbench`` command line.

Every command prints a clear one-line error and exits non-zero on bad input (missing path, wrong
checkpoint, unknown id, damaged store); nothing is left half-written because every file is
written to a temporary name and renamed.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
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
        "  workbench analyze attention --model deit_tiny_patch16_224 --img-size 384 --images skimage:coffee --out stores/deit384.nc"
    ),
    "inspect": "workbench inspect stores/vit.nc",
    "figures": "workbench figures --list\n  workbench figures --all\n  workbench figures --all --jobs 1\n  workbench figures teacher.attention far --profile smoke",
}

#: Extra commands contributed by method pipelines: name -> (add_arguments, handler).
RUN_COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="workbench",
        description="Compress vision transformers with five published methods and look inside the results.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  " + "\n  ".join(EXAMPLES.values()),
    )
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="examples:\n  " + EXAMPLES.get(name, ""))

    add("info", "Versions, device, where runs and stores live, and what is there.")

    t = add("train", "Train a demo teacher (or any timm model on --data) as a run.")
    t.add_argument("what", choices=["teacher"], help="what to train")
    t.add_argument("--arch", required=True, choices=["vit", "swin", "cnn"],
                   help="model family: the demo teacher, or under --profile paper DeiT-S / Swin-T / ResNet-50")
    t.add_argument("--model", default=None, help="another timm name, or deit-t, deit-s, deit-b, swin-t, swin-b, resnet50")
    t.add_argument("--data", default=None, help="ImageFolder root with train/ and val/ (required by --profile paper)")
    t.add_argument("--checkpoint", default=None, help="pretrained weights to start from (.safetensors, .pt, .pth)")
    _common(t)
    t.add_argument("--epochs", type=int, default=None,
                   help="override the profile's epoch count (0 with --checkpoint: record the weights as the teacher)")
    t.add_argument("--batch-size", type=int, default=None, help="override the batch size (paper: lr = 5e-4 x batch / 512)")

    a = add("analyze", "Run an analysis extractor on a model and images; write an xarray store.")
    a.add_argument("kind", help="analysis name: attention, window-attention, dependency, retention, window-saliency, ...")
    a.add_argument("--model", required=True, help="run id/dir or timm name")
    a.add_argument("--checkpoint", default=None, help="local weights for a timm name (.safetensors, .pt, .pth)")
    a.add_argument("--images", default="demo:val[:8]", help="image spec: demo:val[:16], skimage:astronaut,chelsea, or a folder")
    a.add_argument("--out", required=True, help="store path (.nc)")
    a.add_argument("--layers", default=None, help="comma-separated block indices (default: all)")
    a.add_argument("--img-size", type=int, default=None, help="input resolution for timm models (e.g. 384)")
    a.add_argument("--wrt", default=None, choices=["mixer_input", "residual", "lstm_input"],
                   help="dependency only: differentiate by the token-mixer input (default), the block input, or FAR's LSTM input")
    a.add_argument("--norm", default=None, choices=["l2", "l1"], help="dependency only: norm of the gradient (default l2)")
    a.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to compute (default: auto)")

    i = add("inspect", "Summarise a store: variables, dims and provenance (checks that it opens).")
    i.add_argument("store", help="path of a .nc store")

    f = add("figures", "Regenerate paper figures and tables into figures/ with an index.")
    f.add_argument("ids", nargs="*", help="figure ids or paper prefixes (e.g. far.fig4, far)")
    g = f.add_mutually_exclusive_group()
    g.add_argument("--list", action="store_true", help="list registered figures")
    g.add_argument("--all", action="store_true", help="render every registered figure")
    f.add_argument("--out", default="figures", help="output directory (default: figures)")
    f.add_argument("--jobs", type=int, default=None,
                   help="worker processes that train runs and compute analyses before drawing "
                        "(default: one per CPU core on the CPU, 1 on a GPU; 1 = all in this process)")
    _common(f, force_help="recompute analyses (runs are reused)")

    r = add("run", "Run a compression method end to end (as a resumable run).")
    rs = r.add_subparsers(dest="method", required=True)
    from workbench.pipelines import load_all as load_pipelines

    load_pipelines()
    for name, (add_args, _) in RUN_COMMANDS.items():
        mp = rs.add_parser(name, help=f"run {name}")
        add_args(mp)
    return p


def _common(p: argparse.ArgumentParser, force_help: str = "retrain even if a complete run exists") -> None:
    p.add_argument("--profile", default="demo", choices=["demo", "smoke", "paper"], help="budgets (default: demo)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to compute (default: auto)")
    p.add_argument("--force", action="store_true", help=force_help)


def cmd_info(args) -> int:
    import platform

    import torch
    from rich.console import Console
    from rich.table import Table

    from workbench.figures import load_all
    from workbench.provenance import versions
    from workbench.runs import home, list_runs

    con = Console()
    v = versions()
    con.print(f"[bold]vit-workbench[/] {v['workbench_version']}  torch {v['torch_version']}  timm {v['timm_version']}  python {platform.python_version()}")
    con.print(f"device: {'cuda (' + torch.cuda.get_device_name(0) + ')' if torch.cuda.is_available() else 'cpu'}, {torch.get_num_threads()} threads")
    con.print(f"home: {home()}  (set WORKBENCH_HOME to move it)")
    runs = list_runs()
    if runs:
        tab = Table("run", "status", "model", "val_acc", "wall time (s)")
        for r in runs:
            m = r.manifest
            acc = (m.get("results") or {}).get("val_acc")
            tab.add_row(r.id, m.get("status", "?"), str(m.get("model_name")), f"{acc:.4f}" if acc is not None else "-", f"{m.get('wall_time_s', 0):.0f}")
        con.print(tab)
    else:
        con.print("no runs yet: `workbench train teacher --arch vit` or `workbench figures --all`")
    con.print(f"{len(load_all())} registered figures (`workbench figures --list`)")
    return 0


def cmd_train(args) -> int:
    from workbench.pipelines.teacher import train_teacher

    run = train_teacher(args.arch, args.profile, force=args.force, device=args.device, data=args.data,
                        model_name=args.model, epochs=args.epochs, batch_size=args.batch_size, checkpoint=args.checkpoint)
    print(f"run: {run.dir}")
    return 0


def cmd_analyze(args) -> int:
    from workbench.figures import run_analysis

    opts = {}
    if args.layers:
        opts["layers"] = [int(x) for x in args.layers.split(",")]
    if args.img_size:
        opts["img_size"] = args.img_size
    for name in ("wrt", "norm"):
        if getattr(args, name):
            if args.kind != "dependency":
                print(f"error: --{name} applies to the dependency analysis only", file=sys.stderr)
                return 2
            opts[name] = getattr(args, name)
    path = run_analysis(args.kind.replace("-", "_"), args.model, args.images, args.out, checkpoint=args.checkpoint,
                        device=args.device, **opts)
    print(f"wrote {path}")
    return 0


def cmd_inspect(args) -> int:
    from workbench.store import open_store

    ds = open_store(args.store)
    print(ds)
    ds.close()
    return 0


def cmd_figures(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from workbench import figures as F

    if args.list:
        specs = F.load_all()
        tab = Table("id", "kind", "paper", "caption", "needs", "steps")
        for s in sorted(specs.values(), key=lambda s: s.id):
            tab.add_row(s.id, s.kind, s.paper, textwrap.shorten(s.caption, 70), ", ".join(s.needs), ", ".join(s.steps))
        Console(width=200).print(tab)
        return 0
    if not args.all and not args.ids:
        raise ValueError("name figure ids, or pass --all or --list")
    specs = list(F.load_all().values()) if args.all else F.get(args.ids)
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    import time

    from rich.progress import Progress

    from workbench.figures.prepare import closure, default_jobs, prepare

    t0 = time.perf_counter()
    steps = closure(dict.fromkeys(s for spec in specs for s in spec.steps))
    jobs = min(args.jobs or default_jobs(args.device), max(1, len(steps)))
    written = []
    with Progress(transient=False) as prog:
        def log(line: str) -> None:
            prog.console.print(line, markup=False, highlight=False)

        if steps:
            task = prog.add_task(f"prepare ({jobs} job{'s' * (jobs > 1)})", total=len(steps))
            prepare(steps, jobs=jobs, profile=args.profile, device=args.device, force=args.force, log=log,
                    on_done=lambda i, sec: prog.advance(task))
        t1 = time.perf_counter()
        # drawing only reads what the steps prepared: "reusing complete run" for every figure would be noise
        ctx = F.Context(args.profile, args.device, args.force,
                        log=lambda line: None if line.startswith("reusing complete run") else log(line))
        task = prog.add_task("figures", total=len(specs))
        for spec in specs:
            prog.update(task, description=spec.id)
            written += F.render([spec], ctx, args.out)
            prog.advance(task)
    t2 = time.perf_counter()
    print(f"prepared {len(steps)} steps in {t1 - t0:.0f} s ({jobs} job{'s' * (jobs > 1)}), drew {len(specs)} items "
          f"in {t2 - t1:.0f} s")
    print(f"wrote {len(written)} files to {args.out}/ (index: {args.out}/index.md)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"info": cmd_info, "train": cmd_train, "analyze": cmd_analyze, "figures": cmd_figures, "inspect": cmd_inspect,
                "run": lambda a: RUN_COMMANDS[a.method][1](a)}
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume from the last checkpoint", file=sys.stderr)
        return 130
    except (ValueError, KeyError, FileNotFoundError, RuntimeError, OSError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        print(f"workbench: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
