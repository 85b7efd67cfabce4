"""What a figure's data function may ask for: runs, cached analyses, other figure data, the profile.

A :class:`Context` records the provenance of everything a data function uses (runs with their
checkpoint hashes, analysis stores), stamps it on the Dataset the function returns, and stores that
Dataset under ``$WORKBENCH_HOME/stores/<profile>/figdata/<id>.nc``. A stored Dataset is read back
instead of recomputed while every run it used still has the same checkpoint and every store it read
still exists (``force=True`` recomputes analyses and figure data; runs are always reused).

On the user's data (``workbench figures --profile paper --data ROOT``) a context uses the user's teacher runs on
``ROOT`` (recorded or trained with ``workbench train teacher``; it never trains a paper teacher itself), makes or
reuses the method runs with the budget overrides it is given (the same ``--epochs``/``--images`` ... as the user's
``workbench run`` find the same runs), and reads every demo or sample-photo image spec from ``ROOT/val``
(:func:`workbench.pipelines.user_images`). Its stores live apart, under ``stores/paper+<data tag>[.<overrides>]``.
``workbench figures`` hands data and overrides to its spawned workers as arguments (their Context's ``data`` and
``overrides``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Callable

import xarray as xr

from workbench.provenance import NULL, now_iso, versions, weights_of

__all__ = ["Context"]


class Context:
    """Runs, analyses and figure data for one profile (module docstring)."""

    def __init__(self, profile: str = "demo", device: str = "auto", force: bool = False,
                 log: Callable[[str], None] = print, *, data: str | None = None, overrides=None):
        from workbench.pipelines import Overrides, data_tag, user_images
        from workbench.profiles import get_profile
        from workbench.runs import home
        from workbench.runtime import resolve_device

        self.profile = get_profile(profile)
        self.device = resolve_device(device)  # once, here: runs, analyses and data functions get the torch.device
        self.force = force
        self.log = log
        self.data_root = data or None  # the user's ImageFolder root (None: the demo set)
        self.overrides = overrides or Overrides()  # budget overrides of every method run
        where = self.profile.name
        if self.data_root is not None:
            self.data_root = str(Path(self.data_root).expanduser().resolve())
            where += f"+{data_tag(self.data_root)}"
            if self.profile.is_paper:
                self.profile = dataclasses.replace(
                    self.profile, analysis_images=user_images(self.profile.analysis_images, self.data_root))
        if self.overrides:
            where += ("." if "+" in where else "+") + self.overrides.tag()
        self.store_dir = home() / "stores" / where
        self._used: list[list[dict]] = [[]]  # one frame per data function being computed (they nest)
        self._fresh: set[str] = set()  # data ids computed by this context (not recomputed again under force)
        self._recomputed: set[Path] = set()  # analysis stores computed by this context

    # runs ------------------------------------------------------------------------------------
    def teacher(self, arch: str):
        """The profile's demo teacher of ``arch`` (``vit``, ``swin``, ``cnn``), trained or reused; under ``paper``
        the user's newest complete teacher run of ``arch`` on the data (never trained here)."""
        if self.profile.is_paper:
            from workbench.pipelines.teacher import resolve_teacher
            from workbench.runs import open_run

            ref = resolve_teacher(arch, self.profile, default_arch=arch, family=arch, data=self.data_root, log=self.log)
            return self.use_run(open_run(ref.run))
        return self.run("teacher", arch=arch)

    def run(self, method: str, teacher=None, **options):
        """A method's run through the registry (:func:`workbench.pipelines.run_method`), trained or reused, on the
        context's data with its budget overrides."""
        from workbench.pipelines import run_method

        return self.use_run(run_method(method, teacher, self.profile, device=self.device, data=self.data_root,
                                       overrides=self.overrides, strict=False, log=self.log, **options))

    def use_run(self, run):
        """Record that the data being computed uses ``run``; returns it."""
        self._used[-1].append({"run": run.id, "method": run.config.get("method"), "model_name": run.config.get("model_name"),
                               "checkpoint_sha256": run.manifest.get("checkpoint_sha256"), "weights": "run"})
        return run

    def model(self, run, **kwargs):
        """The model of ``run`` (a Run or a run id), loaded on the CPU in eval mode, recorded as used."""
        from workbench.models import load_model
        from workbench.runs import Run, open_run

        run = run if isinstance(run, Run) else open_run(run)
        self.use_run(run)
        return load_model(run.id, **kwargs).model

    def images(self, spec: str, model=None):
        """The image batch ``spec`` (:func:`workbench.data.load_images`), sized and normalised for ``model`` (its
        ``pretrained_cfg``; the demo's 1×28×28 without one). On the user's data a demo or sample-photo spec reads
        their val/ images (:func:`workbench.pipelines.user_images`)."""
        from workbench.data import load_images

        cfg = getattr(model, "pretrained_cfg", {}) or {}
        return load_images(self.image_spec(spec), input_size=tuple(cfg.get("input_size", (1, 28, 28))), mean=cfg.get("mean"),
                           std=cfg.get("std"))

    def image_spec(self, spec: str) -> str:
        """``spec`` as this context reads it: on the user's data (the paper profile with ``--data``) a demo or
        sample-photo spec names as many of their val/ images (:func:`workbench.pipelines.user_images`)."""
        from workbench.pipelines import user_images

        return user_images(spec, self._user_data)

    @property
    def _user_data(self) -> str | None:
        """The ImageFolder the budgets' and figures' image specs read (the paper profile's ``--data``), else None."""
        return self.data_root if self.profile.is_paper else None

    def heldout(self, model=None):
        """The profile's held-out set (the demo set's validation split on the demo and smoke profiles; the user's
        ``val/`` with ``--data``), sized and normalised for ``model`` (its ``pretrained_cfg``, with its teacher run's
        crop and interpolation; the demo's 1×28×28 without one)."""
        from workbench.data import datasets
        from workbench.pipelines.heldout import heldout_set

        if model is None:
            return datasets(self.profile, self.data_root)[1]
        return heldout_set(model, self.profile, self.data_root)

    def budget(self, method: str):
        """``method``'s budget on this profile (:func:`workbench.pipelines.budget`; its image specs on the user's data
        under the paper profile). Without the overrides: a figure shows the budget's own numbers."""
        from workbench.pipelines import budget

        return budget(method, self.profile, data=self._user_data)

    def paper(self, method: str):
        """The paper's published numbers of ``method`` (its registry entry's ``paper``)."""
        from workbench.pipelines import get_method

        return get_method(method).paper

    # analyses --------------------------------------------------------------------------------
    def analysis(self, kind: str, model: str, images: str, *, checkpoint: str | None = None, **options) -> xr.Dataset:
        """Extractor ``kind`` on ``model`` and ``images``, computed once and read back from its store afterwards."""
        from workbench.analyze import run_analysis
        from workbench.store import open_store

        images = self.image_spec(images)  # on the user's data: their val/ images, not the demo's
        key = json.dumps({"kind": kind, "model": model, "checkpoint": checkpoint, "images": images, "options": options,
                          "weights": _weights_sha(model, checkpoint)}, sort_keys=True, default=str)
        path = self.store_dir / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.nc"
        if not path.exists() or (self.force and path not in self._recomputed):  # --force: once per context
            run_analysis(kind, model, images, path, checkpoint=checkpoint, device=self.device, **options)
            self._recomputed.add(path)
        ds = open_store(path)
        self._used[-1].append({"store": str(path), **{k: ds.attrs.get(k) for k in ("analysis", "model_name", "run",
                                                                                     "checkpoint_sha256")},
                               "weights": weights_of(ds.attrs)})
        return ds

    def extract(self, kind: str, key: str, build: Callable[[], object], images: str, **options) -> xr.Dataset:
        """Extractor ``kind`` on a model that is no run (``build()`` makes it, e.g. a branched model at its
        initialisation), computed once per ``key`` and read back from its store afterwards, like :meth:`analysis`.

        Args:
            key: names the model and everything that defines it (part of the store's name).
            build: ``() -> nn.Module`` in eval mode; called only when the store is computed.
            images: image spec, sized and normalised for the model.
        """
        from workbench.analysis import get_extractor
        from workbench.provenance import ModelSource, stamp
        from workbench.store import open_store, save

        sig = json.dumps({"kind": kind, "model": key, "images": images, "options": options}, sort_keys=True, default=str)
        path = self.store_dir / f"{kind}-{hashlib.sha256(sig.encode()).hexdigest()[:16]}.nc"
        if not path.exists() or (self.force and path not in self._recomputed):
            model = build()
            batch = self.images(images, model)
            ds = get_extractor(kind)(model, batch.tensor, **options)
            save(stamp(ds, ModelSource(name=key, method="figure-model"), batch.source), path)
            self._recomputed.add(path)
        ds = open_store(path)
        self._used[-1].append({"store": str(path), "analysis": ds.attrs.get("analysis"), "model_name": key})
        return ds

    # figure data -----------------------------------------------------------------------------
    def data_path(self, id: str) -> Path:
        return self.store_dir / "figdata" / f"{id}.nc"

    def is_fresh(self, id: str) -> bool:
        """Whether the data ``id`` is stored and still valid (it would be read back, not recomputed)."""
        from workbench.store import StoreError, open_store

        path = self.data_path(id)
        if not path.exists() or (self.force and id not in self._fresh):
            return False
        try:
            ds = open_store(path)
        except StoreError:
            return False
        with ds:
            return id in self._fresh or _still_valid(ds, id)

    def data(self, id: str) -> xr.Dataset:
        """The Dataset of the registered data ``id``: read back when fresh, else computed, stamped and stored."""
        from workbench.figures import DATA, load_all
        from workbench.store import open_store, save

        if id not in DATA:
            load_all()
        if id not in DATA:
            raise KeyError(f"unknown figure data {id!r}; known: {', '.join(sorted(DATA))}")
        path = self.data_path(id)
        if (ds := self._stored(id, path)) is not None:
            return ds
        with _data_lock(path, id, self.log):  # one process computes it; another (an xdist worker, a notebook) waits
            if (ds := self._stored(id, path)) is not None:  # computed by the process this one waited for
                return ds
            self._used.append([])
            try:
                ds = DATA[id].make(self)
            finally:
                used = self._used.pop()
            if not isinstance(ds, xr.Dataset):
                raise TypeError(f"figure data {id!r} must return an xarray Dataset, got {type(ds).__name__}")
            save(_stamp(ds, id, used, self.profile.name), path)
        self._fresh.add(id)
        self._used[-1].extend(used)
        return open_store(path)

    def _stored(self, id: str, path: Path) -> xr.Dataset | None:
        """The stored Dataset of ``id`` when it is read back (fresh, or computed by this context), recorded as used."""
        from workbench.store import open_store

        if path.exists() and (id in self._fresh or not self.force):
            ds = open_store(path)
            if id in self._fresh or _still_valid(ds, id):
                self._used[-1].extend(json.loads(ds.attrs.get("sources", "[]")))
                return ds
            ds.close()
        return None


def _data_lock(path: Path, id: str, log: Callable[[str], None]):
    """One process at a time computes the figure data ``id`` of a store folder; a second one (an xdist worker, a
    notebook beside ``workbench figures``) waits, then reads back what the first stored. Data functions nest only
    along ``after`` (acyclic), so two processes never wait for each other."""
    from workbench.runs import waiting_lock

    return waiting_lock(path.parent / ".locks" / f"{id}.lock", f"figure data {id} is being computed by another "
                        "process; waiting for it", log)


def _weights_sha(model: str, checkpoint: str | None) -> str | None:
    from workbench.runs import find_run

    run = find_run(model)
    return run.manifest.get("checkpoint_sha256") if run is not None else checkpoint


def _unique(used: list[dict]) -> list[dict]:
    out, seen = [], set()
    for u in used:
        key = json.dumps(u, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(u)
    return out


def _stamp(ds: xr.Dataset, id: str, used: list[dict], profile: str) -> xr.Dataset:
    """Provenance of a figure's data: the shared attrs (joined over the runs and stores it used) plus ``sources``."""
    used = _unique(used)

    def joined(key: str) -> str:
        vals = list(dict.fromkeys(str(u[key]) for u in used if u.get(key) not in (None, NULL)))
        return ", ".join(vals) if vals else NULL

    attrs = {"analysis": f"figure-data:{id}", "model_name": joined("model_name"), "method": joined("method"),
             "checkpoint_sha256": joined("checkpoint_sha256"), "run": joined("run"), "weights": joined("weights"),
             "data": ds.attrs.get("data", NULL),
             "config": ds.attrs.get("config", "{}"), "created": now_iso(), **versions(),
             "profile": profile, "sources": json.dumps(used, default=str), "code": code_version(id)}
    return ds.assign_attrs({**ds.attrs, **attrs})


def code_version(id: str) -> str:
    """12 hex digits of sha256 over the source of the data function ``id``: stored data computed by another version of
    that function (e.g. one that did not yet store per-image correctness) is recomputed, not read back in an old form.
    Helpers it calls in other modules are not covered; ``--force`` recomputes everything."""
    import hashlib
    import inspect

    from workbench.figures import DATA

    try:
        source = inspect.getsource(DATA[id].make)
    except (KeyError, OSError, TypeError):  # not registered here, or no source (e.g. defined interactively)
        return NULL
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def _still_valid(ds: xr.Dataset, id: str) -> bool:
    """The data function ``id`` is the one that computed the stored Dataset, every run it used still has the same
    checkpoint, and every store it read exists."""
    from workbench.runs import runs_root

    if ds.attrs.get("code", NULL) != code_version(id):
        return False

    for u in json.loads(ds.attrs.get("sources", "[]")):
        if u.get("store") and not Path(u["store"]).exists():
            return False
        if u.get("run") and "store" not in u:
            manifest = runs_root() / u["run"] / "manifest.json"
            if not manifest.exists() or json.loads(manifest.read_text()).get("checkpoint_sha256") != u.get("checkpoint_sha256"):
                return False
    return True
