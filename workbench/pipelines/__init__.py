"""Pipelines: teacher + data + method -> a run. One registry for every method.

A method plugs into the workbench with one :class:`Method` entry, registered with
:func:`register_method` from its own module in this package:

- ``budgets``: profile name -> the method's budget (a frozen dataclass of its own), the one place
  where a method's epochs, learning rates and sizes per profile live (:func:`budget`);
- ``run``: ``run(request: RunRequest, **options) -> Run`` trains or reuses the method's run(s);
  the request carries the resolved teacher, the profile, the budget, device, data and logging;
- ``options``: the method's own options (:class:`Option`), which become ``workbench run <name>``
  flags and keywords of ``run``; the flags every method shares (``--teacher``, ``--checkpoint``,
  ``--profile``, ``--data``, ``--device``, ``--force``) belong to the CLI;
- ``paper_title`` and ``paper``: the paper's short title (the figure index's heading) and its published
  numbers, which the figures show beside ours.

:func:`run_method` is the single entry point behind the CLI, the figures and notebooks: it resolves
the teacher (a run, a demo arch trained on demand, or a timm name with weights), looks the budget
up, checks the options, prints the run's plan and calls ``run``.

Budget overrides (:class:`Overrides`: ``--epochs [PHASE=]N``, ``--steps [NAME=]N``, ``--batch-size [PHASE=]N``,
``--images N``) are declared once here for every method: a budget's phases are found in its dataclass (every
``epochs`` / ``<phase>_epochs``, ``<name>_steps`` and ``batch_size`` field, at any depth; :func:`budget_knobs`) and
replaced with :func:`dataclasses.replace`. Nothing travels implicitly: :func:`budget` is a pure function of
(method, profile, overrides, data), and the :class:`RunRequest` carries the overridden budget, the overrides (its
training sets hold at most ``--images`` images: :attr:`RunRequest.images`) and the run-id suffix that every run id it
creates ends with (:meth:`RunRequest.run_id`: the overrides' tag), so a shortened trial never collides with the full
run. Every module of this package is imported by :func:`load_all` (no hand-kept list), so a new method is one new
module here. See ``docs/adding-a-method.md``.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

if TYPE_CHECKING:
    import torch

    from workbench.pipelines.common import TeacherRef
    from workbench.profiles import Profile
    from workbench.runs import Run

__all__ = ["Option", "Method", "RunRequest", "METHODS", "register_method", "get_method", "budget", "run_method",
           "load_all", "Overrides", "Knob", "budget_knobs", "apply_overrides", "parse_override", "plan_lines", "data_tag",
           "user_images"]


@dataclass(frozen=True)
class Option:
    """A method's own option: the ``--flag`` of ``workbench run <method>`` and a keyword of its run function."""

    name: str  # keyword of the run function, e.g. "keep_rate" (flag: --keep-rate)
    help: str  # one line for --help
    type: Callable[[str], Any] | None = str  # argparse type (None for a switch)
    default: Any = None  # used when the flag is not given
    choices: tuple[Any, ...] | None = None  # allowed values
    required: bool = False  # the flag must be given on the command line
    switch: bool = False  # a boolean --flag / --no-flag pair
    check: Callable[[Any], None] | None = None  # raises ValueError for a bad value; run_method calls it on a given
    # value before the teacher is resolved (a bad value fails before a demo teacher is trained)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class RunRequest:
    """What a method's run function gets besides its own options: everything that defines its runs, explicitly."""

    method: str  # the method's registry name
    profile: "Profile"  # budgets and data limits of the profile
    budget: Any  # ``budget(method, profile, overrides, data)``: the profile's budget with the request's overrides
    teacher: "TeacherRef | None" = None  # resolved teacher (None for methods without one, i.e. the teachers)
    device: "torch.device | str" = "cpu"  # the torch.device to train on, resolved once by run_method (from "auto",
    # "cpu" or "cuda"); run bodies, cpu_threads and fit use it as it is
    data: str | None = None  # absolute ImageFolder root with train/ and val/ (None: the demo set)
    force: bool = False  # redo the method's runs even if complete (the teacher is reused)
    log: Callable[[str], None] = print  # one-line status messages
    overrides: "Overrides" = field(default_factory=lambda: Overrides())  # budget overrides (in ``budget`` already;
    # their ``images`` limit every training set of the request)
    id_suffix: str = ""  # ends every run id the request creates: the data tag of a student on other data than its
    # teacher's, then the overrides' tag (``e1.n12``); "" for neither

    @property
    def images(self) -> int | None:
        """``--images``: the most training images any of the request's data sets may hold (None: all)."""
        return self.overrides.images

    def run_id(self, base: str) -> str:
        """``base`` with the request's :attr:`id_suffix` (:func:`workbench.runs.suffixed_id`): the id a run gets."""
        from workbench.runs import suffixed_id

        return suffixed_id(base, self.id_suffix)


@dataclass(frozen=True)
class Method:
    """One method's registry entry (module docstring)."""

    name: str  # ``workbench run <name>``; also the ``method`` of its runs and stores
    summary: str  # one line for ``workbench run --help``
    budgets: Mapping[str, Any]  # profile name -> budget
    run: Callable[..., "Run"]  # run(request: RunRequest, **options) -> Run
    teacher: str | None = None  # demo teacher arch it compresses ("vit", "swin", "cnn"); None: needs no teacher
    family: str = "ViT"  # what the teacher must be, for messages ("ViT", "Swin", "CNN")
    options: tuple[Option, ...] = ()  # its own flags
    examples: tuple[str, ...] = ()  # command lines for --help
    report: Callable[["Run"], str] | None = None  # one-paragraph summary of a finished run for the CLI
    paper_title: str = ""  # short title of the paper it implements, the heading of its figures in the index ("FAR —
    # attention replaced by BiLSTMs"); "" for none (the teachers)
    paper_ref: str = ""  # the paper's file in the shared papers/ folder ("papers/000"); orders the figure index
    paper: Mapping[str, Any] = field(default_factory=dict)  # the paper's published numbers and conventions the
    # figures show beside ours (e.g. {"table3": methods.far.PAPER_TABLE3}), so figures never import ``methods``
    phases: tuple[str, ...] | None = None  # budget fields holding its training phases (None: every one found)
    extra: dict[str, Any] = field(default_factory=dict)  # anything else the method's figures want to look up


METHODS: dict[str, Method] = {}


def register_method(entry: Method) -> Method:
    """Add ``entry`` to :data:`METHODS` (a second entry of the same name replaces the first)."""
    METHODS[entry.name] = entry
    return entry


def load_all() -> dict[str, Method]:
    """Import every module of this package (each registers its methods) and return :data:`METHODS`."""
    for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):  # a method's package and its modules
        if not info.name.rsplit(".", 1)[-1].startswith("_"):  # private modules are helpers of the public ones
            importlib.import_module(info.name)
    return METHODS


def get_method(name: str) -> Method:
    """The entry of ``name``.

    Raises:
        KeyError: an unknown method, listing the known ones.
    """
    if name not in METHODS:
        load_all()
    if name not in METHODS:
        raise KeyError(f"unknown method {name!r}; known: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def budget(method: str, profile: "str | Profile", overrides: "Overrides | None" = None, data: str | None = None) -> Any:
    """``budgets[method][profile]``, the one lookup of a method's budget, with ``overrides`` set (phases the budget
    lacks are skipped: :func:`apply_overrides`) and, under the paper profile with ``data``, every demo or
    sample-photo image spec (``*_images`` fields) read from ``data``'s val/ folder (:func:`user_images`). A pure
    function of its arguments: :func:`run_method` gives its run the same answer (``RunRequest.budget``).

    Raises:
        ValueError: the method has no budget for that profile.
    """
    name = profile if isinstance(profile, str) else profile.name
    entry = get_method(method)
    if name not in entry.budgets:
        raise ValueError(f"method {method!r} has no budget for profile {name!r}; choose from {', '.join(entry.budgets)}")
    spent = entry.budgets[name]
    if overrides:
        spent = apply_overrides(spent, overrides, phases=entry.phases)
    if name == "paper" and data is not None and dataclasses.is_dataclass(spent):
        # no demo or sample-photo images on the user's data: every image-spec field reads its val/ folder
        spent = dataclasses.replace(spent, **{f.name: user_images(getattr(spent, f.name), data)
                                              for f in dataclasses.fields(spent)
                                              if f.name.endswith("_images") and isinstance(getattr(spent, f.name), str)})
    return spent


def user_images(spec: str, data: str | None) -> str:
    """A demo (``demo:val[15::31]``) or sample-photo (``skimage:a,b,c``) spec as as many images of the user's
    ``DATA/val`` (``data``), spread over its classes (ImageFolder order is by class): ``DATA/val[0:64:2]``. Other
    specs, or no user data (``data`` None): ``spec`` unchanged."""
    import numpy as np

    if data is None or not isinstance(spec, str):
        return spec
    if spec.startswith("skimage:"):
        n = len([x for x in spec.split(":", 1)[1].split(",") if x.strip()])
    elif spec.startswith("demo:"):
        from workbench.data import demo_split_indices

        head, _, sl = spec.split(":", 1)[1].partition("[")
        split = head or "val"
        total = len(demo_split_indices(split))  # type: ignore[arg-type]
        parts = [int(p) if p else None for p in sl.rstrip("]").split(":")] if sl else [None]
        n = len(np.arange(total)[slice(*parts)]) if len(parts) > 1 else (1 if parts[0] is not None else total)
    else:
        return spec
    from workbench.data import scan_image_folder

    have = len(scan_image_folder(Path(data) / "val", require_classes=True).files)
    step = max(1, have // max(1, n))
    return f"{data}/val[0:{min(have, n * step)}:{step}]"


# --------------------------------------------------------------------------------------------
# Budget overrides: one set of options for every method
# --------------------------------------------------------------------------------------------

KnobKind = Literal["epochs", "steps", "batch_size"]


@dataclass(frozen=True)
class Overrides:
    """Budget overrides of one run (``--epochs``, ``--steps``, ``--batch-size``, ``--images``); empty: the budget as is.

    Each of ``epochs``, ``steps`` and ``batch_size`` is a tuple of ``(phase, value)``: ``phase`` None sets every
    phase's, else the phases whose name (:func:`budget_knobs`) is ``phase`` or ends with ``.phase``.
    """

    epochs: tuple[tuple[str | None, int], ...] = ()  # training epochs per phase (FAR: distill, finetune, ...)
    steps: tuple[tuple[str | None, int], ...] = ()  # optimizer steps (Non-deep ViT: warmup, adjust)
    batch_size: tuple[tuple[str | None, int], ...] = ()  # global batch size per phase
    images: int | None = None  # training images (a fixed subset; the demo set: its class-balanced head)

    def __bool__(self) -> bool:
        return bool(self.epochs or self.steps or self.batch_size or self.images is not None)

    def tag(self) -> str:
        """Readable, stable id part: ``e1.b8.n12``, ``distill-e2`` (empty without overrides)."""
        parts = []
        for kind, letter in (("epochs", "e"), ("steps", "s"), ("batch_size", "b")):
            for phase, value in getattr(self, kind):
                parts.append(f"{phase}-{letter}{value}" if phase else f"{letter}{value}")
        if self.images is not None:
            parts.append(f"n{self.images}")
        return ".".join(parts)

    def to_dict(self) -> dict:
        return {k: [list(p) for p in v] if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def parse_override(values: "list[str] | None", flag: str) -> tuple[tuple[str | None, int], ...]:
    """``["2", "distill=3"]`` -> ``((None, 2), ("distill", 3))`` (the values of a repeatable ``--flag [PHASE=]N``).

    Raises:
        ValueError: a value that is not ``N`` or ``PHASE=N`` with an integer ``N``, naming the flag.
    """
    out = []
    for v in values or ():
        phase, sep, num = str(v).rpartition("=")
        try:
            out.append((phase.strip() if sep else None, int(num)))
        except ValueError:
            raise ValueError(f"{flag} takes N or PHASE=N with an integer N, got {v!r}") from None
        if sep and not phase.strip():
            raise ValueError(f"{flag} {v!r}: name the phase before '=' (or give N alone for every phase)")
    return tuple(out)


@dataclass(frozen=True)
class Knob:
    """One overridable number of a budget."""

    kind: KnobKind  # what it counts
    phase: str  # dotted phase name ("distill", "join.warmup", "method.final"; "" for the budget itself)
    path: tuple[str, ...]  # field names / dict keys from the budget down to the number
    value: int  # its value in the budget


def budget_knobs(budget: Any, *, phases: tuple[str, ...] | None = None, keep: frozenset[str] = frozenset()) -> list[Knob]:
    """The epochs, steps and batch sizes of a budget dataclass, found by field name at any depth.

    ``epochs`` and ``batch_size`` belong to the phase they sit in (``distill.epochs`` -> phase ``distill``);
    ``<name>_epochs`` (not ``warmup_epochs``) and ``<name>_steps`` name their own (``method.final_epochs`` ->
    ``method.final``). Tuples and None are not walked (ablation budgets of the figures).

    Args:
        phases: only the sub-trees under these top-level fields (a method's :attr:`Method.phases`).
        keep: of a dict of phases (the teacher's ``configs`` per arch), only the keys in ``keep`` when any is.
    """
    out: list[Knob] = []

    def walk(obj: Any, path: tuple[str, ...]) -> None:
        if isinstance(obj, dict):
            keys = [k for k in obj if str(k) in keep] or list(obj)
            for k in keys:
                if dataclasses.is_dataclass(obj[k]):
                    walk(obj[k], path + (str(k),))
            return
        for f in dataclasses.fields(obj):
            if not path and phases is not None and f.name not in phases:
                continue
            v = getattr(obj, f.name)
            where = ".".join(path)
            if isinstance(v, bool) or v is None:
                continue
            if isinstance(v, int):
                if f.name == "epochs":
                    out.append(Knob("epochs", where, path + (f.name,), v))
                elif f.name.endswith("_epochs") and f.name != "warmup_epochs":
                    out.append(Knob("epochs", ".".join(path + (f.name[:-7],)), path + (f.name,), v))
                elif f.name.endswith("_steps"):
                    out.append(Knob("steps", ".".join(path + (f.name[:-6],)), path + (f.name,), v))
                elif f.name == "batch_size":
                    out.append(Knob("batch_size", where, path + (f.name,), v))
            elif dataclasses.is_dataclass(v) or isinstance(v, dict):
                walk(v, path + (f.name,))

    if dataclasses.is_dataclass(budget):
        walk(budget, ())
    return out


def _matches(phase: str, selector: str | None) -> bool:
    return selector is None or phase == selector or phase.endswith("." + selector)


def _set(obj: Any, path: tuple[str, ...], value: int) -> Any:
    if isinstance(obj, dict):
        return {**obj, path[0]: _set(obj[path[0]], path[1:], value) if len(path) > 1 else value}
    if len(path) == 1:
        return dataclasses.replace(obj, **{path[0]: value})
    return dataclasses.replace(obj, **{path[0]: _set(getattr(obj, path[0]), path[1:], value)})


_MINIMUM = {"epochs": 0, "steps": 0, "batch_size": 1}
_FLAGS = {"epochs": "--epochs", "steps": "--steps", "batch_size": "--batch-size"}


def apply_overrides(budget: Any, overrides: Overrides, *, phases: tuple[str, ...] | None = None,
                    strict: bool = False, what: str = "the budget") -> Any:
    """``budget`` with ``overrides`` set by :func:`dataclasses.replace` (``--images`` is the data's: see
    :attr:`RunRequest.images`).

    Args:
        strict: refuse a phase name, or a kind, that ``budget`` does not have (``workbench run``); otherwise
            such overrides are skipped (``workbench figures`` passes one set to every method).

    Raises:
        ValueError: a value below its minimum; with ``strict``, an unknown phase (listing the budget's phases) or a
            kind the budget has none of.
    """
    knobs = budget_knobs(budget, phases=phases)
    for kind in ("epochs", "steps", "batch_size"):
        for selector, value in getattr(overrides, kind):
            flag = _FLAGS[kind]
            if value < _MINIMUM[kind]:
                raise ValueError(f"{flag} must be >= {_MINIMUM[kind]}, got {value}")
            hits = [k for k in knobs if k.kind == kind and _matches(k.phase, selector)]
            if not hits and strict:
                names = sorted({k.phase for k in knobs if k.kind == kind and k.phase})
                if not any(k.kind == kind for k in knobs):
                    raise ValueError(f"{what} has no {kind.replace('_', ' ')} to set with {flag}; its phases: "
                                     f"{', '.join(sorted({k.phase or '(all)' for k in knobs})) or 'none'}")
                raise ValueError(f"{what} has no phase {selector!r} for {flag}; choose from {', '.join(names)} "
                                 f"(or {flag} N for all)")
            for k in hits:
                budget = _set(budget, k.path, value)
    if overrides.images is not None and overrides.images < 1:
        raise ValueError(f"--images must be >= 1, got {overrides.images}")
    return budget


def data_tag(data: str) -> str:
    """The data part of a run id: the ImageFolder's name and 4 hex digits of its absolute path (``flowers_3fa2``)."""
    import hashlib

    root = str(Path(data).expanduser().resolve())
    return f"{Path(root).name}_{hashlib.sha256(root.encode()).hexdigest()[:4]}"


def _train_images(prof: "Profile", data: str | None) -> tuple[int | None, str]:
    if data is None:
        return prof.train_limit, "the demo set (MNIST-5k)"
    from workbench.data import scan_image_folder

    try:
        return len(scan_image_folder(Path(data) / "train", require_classes=True).files), f"{data}/train"
    except Exception:  # noqa: BLE001 - the run itself reports bad data with its own message
        return None, f"{data}/train"


def plan_lines(entry: Method, spent: Any, overrides: Overrides, prof: "Profile", data: str | None,
               options: Mapping[str, Any]) -> list[str]:
    """The run's whole plan: every phase's epochs / steps and batch, and the training images."""
    keep = frozenset(str(v) for v in options.values() if isinstance(v, (str, int)) and not isinstance(v, bool))
    rows: dict[str, dict[str, int]] = {}
    for k in budget_knobs(spent, phases=entry.phases, keep=keep):
        rows.setdefault(k.phase, {})[k.kind] = k.value
    total, where = _train_images(prof, data)
    used = min(x for x in (total, overrides.images) if x is not None) if (total, overrides.images) != (None, None) else None
    images = (f"{used} training images" if used is not None else "all training images") + (
        f" (of {total}, --images {overrides.images})" if overrides.images is not None and total is not None else "")
    lines = [f"plan: {entry.name}, {prof.name} profile, {images} of {where}"
             + (f"; overrides {overrides.tag()}" if overrides else "")]
    for phase, kv in rows.items():
        parts = []
        if "epochs" in kv:
            parts.append(f"{kv['epochs']} epoch{'s' * (kv['epochs'] != 1)}")
        if "steps" in kv:
            parts.append(f"{kv['steps']} steps")
        if "batch_size" in kv:
            parts.append(f"batch {kv['batch_size']}")
        lines.append(f"  {phase or entry.name}: {', '.join(parts)}")
    return lines


def _quiet(message: str) -> None:
    """A ``log`` that says nothing (the ranks other than 0)."""


def _checked_options(entry: Method, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the method's defaults filled in, each given one checked (:class:`Option`).

    Raises:
        ValueError: an unknown option, a missing required one, a value outside its choices or refused by its check.
    """
    known = {o.name: o for o in entry.options}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"method {entry.name!r} has no option {', '.join(unknown)}; its options: "
                         f"{', '.join(known) or 'none'}")
    options = dict(options)
    for opt in entry.options:
        if options.get(opt.name) is None:
            if opt.required:
                raise ValueError(f"method {entry.name!r} needs {opt.flag} ({opt.help})")
            options[opt.name] = opt.default
        elif opt.choices is not None and options[opt.name] not in opt.choices:
            raise ValueError(f"{opt.flag} must be one of {', '.join(map(str, opt.choices))}, got {options[opt.name]!r}")
        elif opt.check is not None:
            opt.check(options[opt.name])
    return options


def _teacher_ref(entry: Method, teacher: "str | Run | None", checkpoint: str | None, prof: "Profile",
                 device: "torch.device", data: str | None, log: Callable[[str], None]) -> "TeacherRef | None":
    """The method's resolved teacher (a demo teacher is trained or reused first); None for a method without one.

    Raises:
        ValueError: a teacher or checkpoint given to a method that takes none (and :func:`resolve_teacher`'s errors).
    """
    if entry.teacher is None:
        if teacher is not None or checkpoint is not None:
            raise ValueError(f"method {entry.name!r} takes no teacher")
        return None
    resolve_teacher = get_method("teacher").extra["resolve"]  # registered by pipelines.teacher (no import cycle)
    return resolve_teacher(teacher, prof, default_arch=entry.teacher, family=entry.family, checkpoint=checkpoint,
                           device=device, data=data, log=log)


def run_id_suffix(data: str | None, teacher: "TeacherRef | None", overrides: Overrides) -> str:
    """What ends the run ids of a request (:attr:`RunRequest.id_suffix`): a student on other data than its teacher's
    says so (:func:`data_tag`; the teacher's own id says its data), then the overrides' tag."""
    tokens = [data_tag(data)] if data is not None and teacher is not None and teacher.data != data else []
    tokens += [overrides.tag()] if overrides else []
    return ".".join(t for t in tokens if t)


def run_method(
    name: str,
    teacher: "str | Run | None" = None,
    profile: "str | Profile" = "demo",
    *,
    teacher_checkpoint: str | None = None,
    device: "str | torch.device" = "auto",
    data: str | None = None,
    force: bool = False,
    overrides: Overrides | None = None,
    strict: bool = True,
    log: Callable[[str], None] = print,
    **options: Any,
) -> "Run":
    """Train or reuse method ``name``'s run(s) (the CLI's ``workbench run``, the figures and notebooks call this).

    It checks the options, looks the budget up (:func:`budget` with the overrides and data), resolves the device
    once, resolves the teacher (training a demo teacher if missing), prints the plan and calls the method's ``run``
    with a :class:`RunRequest` carrying all of it.

    Args:
        teacher: a teacher run (id, directory or Run), a demo arch (``vit``, ``swin``, ``cnn``), a timm name with
            ``checkpoint``, or None for the method's default demo teacher (trained if missing).
        profile: a :class:`~workbench.profiles.Profile` or its name (``demo``, ``smoke`` or ``paper``).
        teacher_checkpoint: weights of a timm-name teacher.
        device: ``auto``, ``cpu``, ``cuda`` (or a torch.device): resolved here, once.
        data, force, log: see :class:`RunRequest`.
        overrides: budget overrides (module docstring); their tag ends every run id the method creates.
        strict: refuse an override the method's budget has no phase for (False: skip it, for the figures).
        **options: the method's own options (:attr:`Method.options`); missing ones take their defaults.

    Raises:
        ValueError: an unknown profile or option, a missing required option, a value outside its choices, an
            override the budget has no phase for, or a teacher the method cannot use.

    Example: the smoke profile's CNN teacher in a fresh home, then a one-epoch trial of it (its own id):

    >>> import os, tempfile
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, WORKBENCH_HOME=tempfile.mkdtemp()):
    ...     run = run_method("teacher", profile="smoke", device="cpu", arch="cnn", log=lambda line: None)
    ...     trial = run_method("teacher", profile="smoke", device="cpu", arch="cnn", log=lambda line: None,
    ...                        overrides=Overrides(epochs=((None, 1),)))
    >>> run.id, run.status, run.manifest["results"]["epochs"]
    ('teacher-cnn-smoke', 'complete', 2)
    >>> trial.id, trial.manifest["results"]["epochs"]
    ('teacher-cnn-smoke+e1', 1)
    """
    from workbench.profiles import get_profile

    entry = get_method(name)
    prof = get_profile(profile)
    overrides = overrides or Overrides()
    options = _checked_options(entry, options)
    if data is not None:
        data = str(Path(data).expanduser().resolve())  # the same data whatever the working directory
    data_of = data if prof.is_paper else None  # the image specs read the user's val/ under the paper profile only
    # an unknown profile, or an override the budget has no phase for, fails before any teacher is trained
    apply_overrides(budget(name, prof, data=data_of), overrides, phases=entry.phases, strict=strict,
                    what=f"{name}'s {prof.name} budget")
    spent = budget(name, prof, overrides, data_of)
    from workbench.runtime import init_distributed, is_main, resolve_device

    # Once, here, before anything is built: the torch.device (under torchrun cuda is this rank's own GPU, made current)
    # and the process group (its backend from that device), so teachers and students share a device, every rank
    # knows its rank, and ranks can wait for each other's runs.
    dev = resolve_device(device)
    init_distributed(dev)
    if not is_main():
        log = _quiet  # under torchrun rank 0 alone reports (every rank does the same work)
    ref = _teacher_ref(entry, teacher, teacher_checkpoint, prof, dev, data, log)
    for line in plan_lines(entry, spent, overrides, prof, data, options):
        log(line)
    request = RunRequest(name, prof, spent, ref, dev, data, force, log, overrides, run_id_suffix(data, ref, overrides))
    return entry.run(request, **options)
