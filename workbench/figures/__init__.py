"""The figure registry: paper figure ids -> their data and their plot (shared DESIGN.md, "Figures").

Every figure or table is two functions:

- a **data** function ``data(ctx) -> xr.Dataset``, registered with :func:`dataset` under an id
  (several figures may share one): it trains or reuses runs and computes analyses through the
  :class:`~workbench.figures.context.Context`, and returns what the plot needs as one Dataset,
  which is stored with its provenance (``$WORKBENCH_HOME/stores/<profile>/figdata/<id>.nc``);
- a **plot** function ``plot(ds, ...) -> Figure | Table`` that sees only the stored Datasets (no
  torch, no model), registered with the figure under :func:`figure`.

The data functions are the preparation steps of ``workbench figures``
(:mod:`workbench.figures.schedule`): a data function names the data it builds on (``after``), the
scheduler runs them in dependency order in worker processes, then every figure is drawn from the
stores alone (:mod:`workbench.figures.render`). ``after`` may also be a function returning the ids,
called when :func:`closure` asks (after :func:`load_all`): data whose inputs other modules register —
the comparison (``compare.*``) needs every :data:`STUDENTS`' ``after``, whatever the import order. A
notebook calls the same functions::

    ctx = Context("demo")
    fig = get("far.fig6")[0].draw(ctx)          # data (computed or read back) + plot

Every module of this package registers its figures on import; :func:`load_all` imports them all.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal

if TYPE_CHECKING:
    import xarray as xr

    from workbench.figures.context import Context

__all__ = ["Verdict", "Finding", "DataSpec", "FigureSpec", "StudentSpec", "consecutive_groups", "DATA", "FIGURES",
           "STUDENTS", "GROUPS", "dataset", "figure", "student", "group", "paper_titles", "load_all", "get", "closure"]


Status = Literal["shown", "partly", "not shown"]


@dataclass(frozen=True)
class Verdict:
    """Whether a figure's data shows its paper's finding, computed from that data (never written by hand)."""

    status: Status  # "shown", "partly" or "not shown"
    statistic: str  # the measured statistic that tests the finding, with its noise, e.g. "Δ = +4.5 ± 1.9 points (95% CI)"
    reason: str = ""  # why not (or only partly) shown; empty when shown

    def __post_init__(self):
        if self.status not in ("shown", "partly", "not shown"):
            raise ValueError(f"verdict status must be 'shown', 'partly' or 'not shown', got {self.status!r}")


@dataclass(frozen=True)
class Finding:
    """The paper's finding a figure reproduces, and the test of it on the figure's own data."""

    claim: str  # the paper's finding in one sentence
    paper_value: str  # the paper's number(s) behind it, e.g. "DeiT-S 79.9 % vs FAR-S 79.8 % (Table 1)"
    test: Callable[..., Verdict]  # test(*datasets) -> Verdict, from the same Datasets the plot receives


@dataclass(frozen=True)
class DataSpec:
    """A registered data function (a preparation step)."""

    id: str  # e.g. "teacher.vit", "far.maps"
    make: Callable[["Context"], "xr.Dataset"]  # computes the Dataset (runs, analyses...)
    after: tuple[str, ...] | Callable[[], Iterable[str]] = ()  # data ids whose results it uses (computed first), or
    # a function returning them, called by ``needs()`` once every figure module is imported (module docstring)
    exclusive: bool = False  # times models: run alone, after every other step, in the main process
    module: str = ""  # where it is registered (a spawned worker imports it)

    def needs(self) -> tuple[str, ...]:
        """The data ids it uses: ``after``, or what ``after()`` returns now."""
        return tuple(self.after() if callable(self.after) else self.after)


@dataclass(frozen=True)
class FigureSpec:
    """A registered figure or table."""

    id: str  # e.g. "far.fig4", "far.table2", "teacher.attention"
    paper: str  # short name of the paper it mirrors ("far", ...) or "workbench"
    caption_source: str | Callable[[], str]  # one-paragraph caption for index.md, or a function writing it from what
    # is registered when asked (e.g. the comparison's list of students)
    data: tuple[str, ...]  # data ids; their Datasets are the plot's positional arguments
    plot: Callable[..., Any]  # plot(*datasets) -> matplotlib Figure or workbench.plots.table.Table
    kind: Literal["figure", "table"] = "figure"
    finding: Finding | None = None  # the paper's finding it reproduces (None: a workbench view, no paper claim)

    def verdict(self, *datasets: "xr.Dataset") -> Verdict | None:
        """The finding's verdict on these Datasets (the figure's data), or None without a finding."""
        return None if self.finding is None else self.finding.test(*datasets)

    @property
    def caption(self) -> str:
        """The caption (written now, after :func:`load_all`, when it is a function)."""
        if callable(self.caption_source):
            load_all()
            return self.caption_source()
        return self.caption_source

    def draw(self, ctx: "Context"):
        """The figure (or table) from its data, computed or read back through ``ctx``."""
        return self.plot(*(ctx.data(d) for d in self.data))


@dataclass(frozen=True)
class StudentSpec:
    """A compressed model a method's figures train, offered to the teacher-vs-compressed comparison (``compare.*``)."""

    label: str  # e.g. "FAR†", "SlimSwin r=1/3": the comparison's ``model`` coordinate
    method: str  # registry name of the method
    teacher: str  # demo teacher arch it was compressed from ("vit", "swin", "cnn")
    after: tuple[str, ...]  # data ids whose computation trains it
    run: Callable[["Context"], Any]  # fn(ctx) -> the student's Run (reused: the ``after`` data trained it)
    deploy: Callable[[Any], Any] | None = None  # fn(model) -> its inference form, counted (MACs) and timed by
    # compare.table1, for a run that saves its train form (e.g. a gated model whose pruned form skips work); None: as saved
    blocks: tuple[tuple[int, ...], ...] | None = None  # block correspondence: blocks[i] = the teacher block indices the
    # student's block i replaces (a student of another depth, e.g. Non-deep); None: block i is teacher block i
    maps: Literal["attention", "saliency"] = "attention"  # the token-to-token maps its model gives: attention
    # probabilities (``hook_pattern``), or gradient saliency where it has no attention (FAR); scale.fig1 streams the first


def consecutive_groups(depth: int, n: int) -> tuple[tuple[int, ...], ...]:
    """``depth / n`` student blocks each replacing ``n`` consecutive teacher blocks: ``((0, …, n−1), (n, …), …)``.

    Raises:
        ValueError: ``n`` does not divide ``depth``.
    """
    if n < 1 or depth % n:
        raise ValueError(f"{n} consecutive blocks do not tile a depth of {depth}")
    return tuple(tuple(range(n * i, n * i + n)) for i in range(depth // n))


DATA: dict[str, DataSpec] = {}
FIGURES: dict[str, FigureSpec] = {}
STUDENTS: dict[str, StudentSpec] = {}
GROUPS: dict[str, tuple[int, str]] = {}  # figure group that is no method (a FigureSpec's ``paper``: "workbench",
# "compare") -> (place in the index: before the methods < 0 < after them, heading)


def group(name: str, title: str, *, place: int) -> None:
    """Register the heading of the figure group ``name`` that is no method (a method's heading is its registry
    entry's ``paper_title``); ``place`` < 0 puts it before the methods in the index, > 0 after them."""
    GROUPS[name] = (place, title)


def paper_titles() -> dict[str, str]:
    """Figure group (a FigureSpec's ``paper``) -> its heading in the index, in index order: the groups placed
    before the methods, every method with a ``paper_title`` (in the order of their papers), the groups after."""
    from workbench.pipelines import load_all as load_methods

    load_all()
    methods = sorted((m for m in load_methods().values() if m.paper_title), key=lambda m: (m.paper_ref, m.name))
    places = sorted([(place, "", name, title) for name, (place, title) in GROUPS.items()]
                    + [(0, m.paper_ref, m.name, m.paper_title) for m in methods])
    return {name: title for _, _, name, title in places}


def dataset(id: str, *, after: tuple[str, ...] | Callable[[], Iterable[str]] = (), exclusive: bool = False):
    """Decorator registering ``fn(ctx) -> xr.Dataset`` as the data ``id`` (module docstring).

    ``after``: the data ids it uses, or a function returning them (resolved by :func:`closure`).
    """

    def deco(fn: Callable[["Context"], "xr.Dataset"]) -> Callable[["Context"], "xr.Dataset"]:
        DATA[id] = DataSpec(id, fn, after if callable(after) else tuple(after), exclusive, fn.__module__)
        return fn

    return deco


def student(label: str, *, method: str, teacher: str, after: tuple[str, ...],
            deploy: Callable[[Any], Any] | None = None, blocks: tuple[tuple[int, ...], ...] | None = None,
            maps: Literal["attention", "saliency"] = "attention"):
    """Decorator registering ``fn(ctx) -> Run`` as a student the comparison figures include (see :class:`StudentSpec`).

    ``deploy``: ``fn(model) -> model``, the inference form of the run's saved model whose MACs and latency the
    comparison reports (e.g. a pruned model built from a gated one); by default the saved model itself.
    ``blocks``: the block correspondence (``blocks[i]`` = the teacher blocks the student's block ``i`` replaces,
    e.g. :func:`consecutive_groups`), for a student of another depth; the comparison scores block ``i`` against
    the last of them (:func:`workbench.analysis.comparison.block_pairs`). ``maps``: what its token-to-token maps are
    (``"saliency"`` for a model without attention).
    """

    def deco(fn: Callable[["Context"], Any]) -> Callable[["Context"], Any]:
        STUDENTS[label] = StudentSpec(label, method, teacher, tuple(after), fn, deploy,
                                      None if blocks is None else tuple(tuple(g) for g in blocks), maps)
        return fn

    return deco


def figure(id: str, *, paper: str, caption: str | Callable[[], str], data: str | tuple[str, ...],
           plot: Callable[..., Any], kind: Literal["figure", "table"] = "figure", finding: Finding | None = None) -> FigureSpec:
    """Register the figure ``id``: ``plot(*[data Datasets])`` with its caption for ``figures/index.md`` (a string, or
    a function writing it from what is registered).

    ``finding``: the paper's claim the item reproduces; its verdict, computed from the data whenever the item is
    drawn, is appended to the caption and listed in the findings table that opens ``figures/index.md``.
    """
    spec = FigureSpec(id, paper, caption, (data,) if isinstance(data, str) else tuple(data), plot, kind, finding)
    FIGURES[id] = spec
    return spec


def load_all() -> dict[str, FigureSpec]:
    """Import every figure module of this package (each registers its figures and data) and return the figures."""
    for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):  # a method's package and its modules
        name = info.name.rsplit(".", 1)[-1]
        if not name.startswith("_") and name not in ("context", "schedule", "render"):
            importlib.import_module(info.name)
    return FIGURES


def get(ids: list[str]) -> list[FigureSpec]:
    """Specs for ids (a prefix such as ``far`` selects all of that paper).

    Raises:
        KeyError: an unknown id, listing the known ones.
    """
    load_all()
    out: list[FigureSpec] = []
    for i in ids:
        hits = [FIGURES[i]] if i in FIGURES else [s for k, s in FIGURES.items() if k.split(".")[0] == i]
        if not hits:
            raise KeyError(f"unknown figure id {i!r}; known ids: {', '.join(sorted(FIGURES))} (see `workbench figures --list`)")
        out += [h for h in hits if h not in out]
    return out


def closure(data_ids) -> dict[str, tuple[str, ...]]:
    """The data the ids need, with their dependencies: ``{id: after}`` (a graph for :mod:`graphlib`).

    A data spec whose ``after`` is a function is resolved here, after :func:`load_all` (so every module's
    registrations, e.g. :data:`STUDENTS`, are in).

    Raises:
        KeyError: a data id nobody registered (a figure module's mistake).
    """
    graph: dict[str, tuple[str, ...]] = {}
    todo = list(data_ids)
    loaded = False
    while todo:
        i = todo.pop()
        if i in graph:
            continue
        if i not in DATA:
            raise KeyError(f"unknown figure data {i!r} (known: {', '.join(sorted(DATA))})")
        if callable(DATA[i].after) and not loaded:
            load_all()
            loaded = True
        graph[i] = DATA[i].needs()
        todo += graph[i]
    return graph
