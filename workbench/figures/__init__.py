"""The figure registry: paper figure ids -> how to make them (shared DESIGN.md, "Figures").

A figure module registers builders with :func:`figure`. A builder takes a :class:`Context`, asks
it for runs (trained or reused) and analyses (computed once, then read back from their store),
and returns a matplotlib Figure or a :class:`Table`. :func:`render` writes
``figures/<id>.png`` and ``.pdf`` (tables: ``.md`` and ``.csv``) and ``figures/index.md`` with
every item's caption and the provenance of the data behind it. Notebooks call the same builders.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import pandas as pd
import xarray as xr

from workbench._registry import import_modules

_MODULES = ("workbench.figures.teacher", "workbench.figures.far", "workbench.figures.slimswin")


@dataclass
class Table:
    """A table figure: a DataFrame plus a title; written as Markdown and CSV."""

    frame: pd.DataFrame
    title: str
    notes: list[str] = field(default_factory=list)  # lines printed under the Markdown table

    def to_markdown(self) -> str:
        lines = [f"### {self.title}", "", self.frame.to_markdown(index=False), ""]
        return "\n".join(lines + [f"- {n}" for n in self.notes]) + "\n"


@dataclass(frozen=True)
class FigureSpec:
    """A registered figure or table."""

    id: str  # e.g. "far.fig4", "far.table2", "teacher.attention"
    paper: str  # short name of the paper it mirrors ("far", ...) or "workbench"
    caption: str  # one-paragraph caption for index.md
    needs: tuple[str, ...]  # the runs and analyses it uses (for --list)
    kind: Literal["figure", "table"]
    build: Callable[["Context"], object]
    steps: tuple[str, ...] = ()  # preparation steps (runs, analyses) to run first, in parallel (figures.prepare)


FIGURES: dict[str, FigureSpec] = {}


def figure(id: str, *, paper: str, caption: str, needs: tuple[str, ...] = (), kind: Literal["figure", "table"] = "figure",
           steps: tuple[str, ...] = ()):
    """Decorator registering a figure builder under a paper-mirroring id.

    Args:
        needs: what the figure reads, in words (for ``--list``).
        steps: the preparation steps (:func:`workbench.figures.prepare.step`) that compute it.
    """

    def deco(fn: Callable[["Context"], object]) -> Callable[["Context"], object]:
        FIGURES[id] = FigureSpec(id, paper, caption, tuple(needs), kind, fn, tuple(steps))
        return fn

    return deco


def load_all() -> dict[str, FigureSpec]:
    import_modules(_MODULES)
    return FIGURES


def get(ids: list[str]) -> list[FigureSpec]:
    """Specs for ids (a prefix such as ``far`` selects all of that paper).

    Raises:
        KeyError: an unknown id, listing the known ones.
    """
    load_all()
    out = []
    for i in ids:
        hits = [FIGURES[i]] if i in FIGURES else [s for k, s in FIGURES.items() if k.split(".")[0] == i]
        if not hits:
            raise KeyError(f"unknown figure id {i!r}; known ids: {', '.join(sorted(FIGURES))} (see `workbench figures --list`)")
        out += [h for h in hits if h not in out]
    return out


class Context:
    """What a builder may ask for: runs, cached analyses, the profile, provenance collection."""

    def __init__(self, profile: str = "demo", device: str = "auto", force: bool = False, log: Callable[[str], None] = print):
        from workbench.profiles import get_profile
        from workbench.runs import home

        self.profile = get_profile(profile)
        self.device = device
        self.force = force
        self.log = log
        self.store_dir = home() / "stores" / profile
        self.used: list[dict] = []  # provenance of every Dataset a builder read

    # runs ----------------------------------------------------------------------------------
    def teacher(self, arch: str):
        from workbench.pipelines.teacher import train_teacher

        return self.use_run(train_teacher(arch, self.profile.name, device=self.device, log=self.log))

    def use_run(self, run):
        """Record that the figure being built uses ``run`` (for index.md); returns it."""
        self.used.append({"run": run.id, "method": run.config.get("method"), "model_name": run.config.get("model_name"),
                          "checkpoint_sha256": run.manifest.get("checkpoint_sha256"), "results": run.manifest.get("results")})
        return run

    # analyses --------------------------------------------------------------------------------
    def analysis(self, kind: str, model: str, images: str, *, checkpoint: str | None = None, **options) -> xr.Dataset:
        """Run extractor ``kind`` on ``model`` and ``images`` once; later calls read the store."""
        from workbench.store import open_store

        key = json.dumps({"kind": kind, "model": model, "checkpoint": checkpoint, "images": images, "options": options}, sort_keys=True, default=str)
        sha = _model_sha(model, checkpoint)
        path = self.store_dir / f"{kind}-{hashlib.sha256((key + str(sha)).encode()).hexdigest()[:16]}.nc"
        if not path.exists():
            run_analysis(kind, model, images, path, checkpoint=checkpoint, device=self.device, **options)
        ds = open_store(path)
        self.used.append({k: ds.attrs.get(k) for k in ("analysis", "model_name", "method", "checkpoint_sha256", "run", "data", "created")} | {"store": str(path)})
        return ds


def _model_sha(model: str, checkpoint: str | None) -> str | None:
    from workbench.runs import runs_root

    manifest = runs_root() / model / "manifest.json"
    if manifest.exists():
        return json.loads(manifest.read_text()).get("checkpoint_sha256")
    return checkpoint


def run_analysis(kind: str, model: str, images: str, out: str | Path, *, checkpoint: str | None = None,
                 device: str = "auto", **options) -> Path:
    """Load a model and images, run an extractor, stamp provenance and save the store."""
    from methods.train import resolve_device
    from workbench.analysis import get_extractor
    from workbench.data import load_images
    from workbench.models import load_model
    from workbench.provenance import stamp
    from workbench.store import save

    extractor = get_extractor(kind)
    model_kwargs = {"img_size": options.pop("img_size")} if options.get("img_size") else {}
    dev = resolve_device(device)
    loaded = load_model(model, checkpoint=checkpoint, device=dev, **model_kwargs)
    batch = load_images(images, input_size=loaded.input_size, mean=loaded.mean, std=loaded.std)
    import inspect

    if "targets" in inspect.signature(extractor).parameters and "targets" not in options and (batch.labels >= 0).all():
        import torch

        options["targets"] = torch.as_tensor(batch.labels, device=dev)  # e.g. for gradient saliency of the loss
    ds = extractor(loaded.model, batch.tensor.to(dev), **options)
    if "image" not in ds:
        dims = ("sample", "img_y", "img_x") if batch.display.ndim == 3 else ("sample", "img_y", "img_x", "rgb")
        ds["image"] = (dims, batch.display)
    ds["label"] = ("sample", batch.labels)
    return save(stamp(ds, loaded.source, batch.source), out)


def render(specs: list[FigureSpec], ctx: Context, out_dir: str | Path = "figures") -> list[Path]:
    """Build and write each spec; then rewrite ``index.md`` from every item present in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workbench.plots.theme import set_theme

    set_theme()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in specs:
        ctx.used = []
        ctx.log(f"[figure] {spec.id}: {spec.caption.split('.')[0]}")
        result = spec.build(ctx)
        if isinstance(result, Table):
            files = [_atomic_text(out_dir / f"{spec.id}.md", result.to_markdown()),
                     _atomic_text(out_dir / f"{spec.id}.csv", result.frame.to_csv(index=False))]
        else:
            files = []
            for ext in ("png", "pdf"):
                tmp = out_dir / f".{spec.id}.tmp.{ext}"
                result.savefig(tmp, dpi=150 if ext == "png" else None, bbox_inches="tight")
                os.replace(tmp, out_dir / f"{spec.id}.{ext}")
                files.append(out_dir / f"{spec.id}.{ext}")
            plt.close(result)
        entry = {"id": spec.id, "paper": spec.paper, "kind": spec.kind, "caption": spec.caption,
                 "files": [f.name for f in files], "provenance": ctx.used, "profile": ctx.profile.name}
        _atomic_text(out_dir / f".{spec.id}.json", json.dumps(entry, indent=1, default=str))
        written += files
    _write_index(out_dir)
    return written


def _atomic_text(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def _write_index(out_dir: Path) -> None:
    from workbench.provenance import now_iso, versions

    entries = sorted((json.loads(p.read_text()) for p in out_dir.glob(".*.json")), key=lambda e: e["id"])
    v = versions()
    lines = ["# Figures", "", f"Regenerate with `workbench figures --all`. Index written {now_iso()} by "
             f"workbench {v['workbench_version']} (torch {v['torch_version']}, timm {v['timm_version']}).", ""]
    for e in entries:
        lines += [f"## `{e['id']}` ({e['kind']}, paper: {e['paper']}, profile: {e['profile']})", "", e["caption"], "",
                  "Files: " + ", ".join(f"[{f}]({f})" for f in e["files"]), ""]
        for p in e["provenance"]:
            lines.append("- " + "; ".join(f"{k}: `{v}`" for k, v in p.items() if v is not None))
        lines.append("")
    _atomic_text(out_dir / "index.md", "\n".join(lines))
