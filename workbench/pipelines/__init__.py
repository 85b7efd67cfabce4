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
up, checks the options, and calls ``run``. Every module of this package is imported by
:func:`load_all` (no hand-kept list), so a new method is one new module here. See
``docs/adding-a-method.md``.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from workbench.pipelines.teacher import TeacherRef
    from workbench.profiles import Profile
    from workbench.runs import Run

__all__ = ["Option", "Method", "RunRequest", "METHODS", "register_method", "get_method", "budget", "run_method",
           "load_all"]


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
    """What a method's run function gets besides its own options."""

    method: str  # the method's registry name
    profile: "Profile"  # budgets and data limits of the profile
    budget: Any  # ``budget(method, profile)``
    teacher: "TeacherRef | None" = None  # resolved teacher (None for methods without one, i.e. the teachers)
    device: Any = "cpu"  # the torch.device to train on, resolved once by run_method (from "auto", "cpu" or "cuda")
    data: str | None = None  # ImageFolder root with train/ and val/ (None: the demo set)
    force: bool = False  # redo the method's runs even if complete (the teacher is reused)
    log: Callable[[str], None] = print  # one-line status messages


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
    extra: dict[str, Any] = field(default_factory=dict)  # anything else the method's figures want to look up


METHODS: dict[str, Method] = {}


def register_method(entry: Method) -> Method:
    """Add ``entry`` to :data:`METHODS` (a second entry of the same name replaces the first)."""
    METHODS[entry.name] = entry
    return entry


def load_all() -> dict[str, Method]:
    """Import every module of this package (each registers its methods) and return :data:`METHODS`."""
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):  # private modules are helpers of the public ones
            importlib.import_module(f"{__name__}.{info.name}")
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


def budget(method: str, profile: str | "Profile") -> Any:
    """``budgets[method][profile]``: the one lookup of a method's budget.

    Raises:
        ValueError: the method has no budget for that profile.
    """
    name = profile if isinstance(profile, str) else profile.name
    entry = get_method(method)
    if name not in entry.budgets:
        raise ValueError(f"method {method!r} has no budget for profile {name!r}; choose from {', '.join(entry.budgets)}")
    return entry.budgets[name]


def run_method(
    name: str,
    teacher: "str | Run | None" = None,
    profile: "str | Profile" = "demo",
    *,
    teacher_checkpoint: str | None = None,
    device: str = "auto",
    data: str | None = None,
    force: bool = False,
    log: Callable[[str], None] = print,
    **options: Any,
) -> "Run":
    """Train or reuse method ``name``'s run(s) (the CLI's ``workbench run``, the figures and notebooks call this).

    Args:
        teacher: a teacher run (id, directory or Run), a demo arch (``vit``, ``swin``, ``cnn``), a timm name with
            ``checkpoint``, or None for the method's default demo teacher (trained if missing).
        profile: a :class:`~workbench.profiles.Profile` or its name (``demo``, ``smoke`` or ``paper``).
        teacher_checkpoint: weights of a timm-name teacher.
        device: ``auto``, ``cpu``, ``cuda`` (or a torch.device): resolved here, once.
        data, force, log: see :class:`RunRequest`.
        **options: the method's own options (:attr:`Method.options`); missing ones take their defaults.

    Raises:
        ValueError: an unknown profile or option, a missing required option, a value outside its choices, or a
            teacher the method cannot use.
    """
    from workbench.profiles import get_profile

    entry = get_method(name)
    prof = get_profile(profile)
    known = {o.name: o for o in entry.options}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"method {name!r} has no option {', '.join(unknown)}; its options: "
                         f"{', '.join(known) or 'none'}")
    for opt in entry.options:
        if options.get(opt.name) is None:
            if opt.required:
                raise ValueError(f"method {name!r} needs {opt.flag} ({opt.help})")
            options[opt.name] = opt.default
        elif opt.choices is not None and options[opt.name] not in opt.choices:
            raise ValueError(f"{opt.flag} must be one of {', '.join(map(str, opt.choices))}, got {options[opt.name]!r}")
        elif opt.check is not None:
            opt.check(options[opt.name])
    spent = budget(name, prof)  # an unknown profile fails before any teacher is trained
    from workbench.runtime import resolve_device

    dev = resolve_device(device)  # once, here: everything below gets the torch.device
    ref = None
    if entry.teacher is not None:
        from workbench.pipelines.teacher import resolve_teacher

        ref = resolve_teacher(teacher, prof, default_arch=entry.teacher, family=entry.family,
                              checkpoint=teacher_checkpoint, device=dev, data=data, log=log)
    elif teacher is not None or teacher_checkpoint is not None:
        raise ValueError(f"method {name!r} takes no teacher")
    request = RunRequest(name, prof, spent, ref, dev, data, force, log)
    return entry.run(request, **options)
