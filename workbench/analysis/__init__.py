"""Analysis extractors: ``extract(model, images, *, layers=None, targets=None, **options) -> xr.Dataset``.

Every extractor has that one signature shape. ``model`` is an eval-mode ``nn.Module``; ``images`` a
float tensor ``(B, C, H, W)`` already normalised for the model; ``targets`` the images' labels
``(B,)`` when known (extractors that do not need them ignore them). Extractors read model internals
by hook-point name (:mod:`methods.hooks`), never by module type. The Dataset uses the shared dims
(``docs/conventions.md``) and carries the attrs ``analysis`` (its registry name) and ``config`` (JSON of
its arguments); :func:`workbench.provenance.stamp` adds the rest. Extractors register themselves with
:func:`register`; every module of this package is imported by :func:`load_all` (no hand-kept list), so
the CLI and the shared test table find them all. A registration also declares

- ``options``: the extractor's own keyword options the CLI offers (:class:`ExtractorOption`), which become
  ``workbench analyze`` flags (:func:`cli_options` merges them over every extractor);
- ``example``: a tiny model it applies to, an input shape and a layer subset (:class:`Example`), on which
  ``tests/test_extractors.py`` checks the guarantees every extractor shares;
- ``explore``: for an extractor of token-to-token maps, how the explorer (:mod:`workbench.explore`) shows them
  (:class:`ExploreKind`: the map variable, what it measures, the hook points that select it for a model). The
  explorer asks :func:`explore_kinds` / :func:`explore_kind_of`, so a new kind needs no edit in the explorer.
  Reading a store needs no torch: :func:`explore_kinds` ``(load=False)`` reads this package's registrations from
  its source instead of importing the extractors.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import importlib
import pkgutil
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Literal, Protocol

import xarray as xr


class Extractor(Protocol):
    def __call__(self, model, images, *, layers=None, targets=None, **options) -> xr.Dataset: ...


@dataclass(frozen=True)
class ExtractorOption:
    """A keyword option of an extractor that ``workbench analyze`` offers as a flag."""

    name: str  # keyword of the extractor, e.g. "wrt" (flag: --wrt)
    help: str  # one line for --help
    choices: tuple[str, ...] | None = None  # allowed values (None: any)
    type: Callable[[str], Any] = str  # argparse type

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Example:
    """A tiny model an extractor applies to (for the shared extractor tests and the docs)."""

    model: Callable[[], Any]  # () -> eval-mode nn.Module (random weights)
    images: tuple[int, ...]  # input shape (B, C, H, W)
    layers: tuple[int, ...]  # a subset of its layers for the ``layers=`` check


@dataclass(frozen=True)
class ExploreKind:
    """How the explorer shows an extractor's maps: one row ``map[sample, layer, head, query, :]`` per click."""

    variable: str  # the Dataset variable holding the map, e.g. "attention"
    label: str  # what the map measures, in every panel's title, e.g. "gradient saliency"
    hooks: tuple[str, ...]  # fnmatch patterns of hook-point names: a model with a point matching one is shown this way
    order: int  # the explorer tries the kinds lowest first: a kind whose models also match another's patterns comes
    # before it (Sparsifiner's ``attn.hook_mask`` before plain attention's ``attn.hook_pattern``)
    layout: Literal["tokens", "windows", "stages"] = "tokens"  # the keys: tokens on the patch grid (prefix tokens
    # aside), Swin windows on a stage's map, or one map per stage on the input pixels (same for every query)
    outline: str | None = None  # a bool variable (like the map) whose True keys are outlined (kept keys), or None
    prepare: Callable[[], None] | None = None  # run once before the explorer reads a model's hook points (e.g.
    # registering a hook-point adapter its models need), or None
    masks: Callable[[Any], Any] | None = None  # model -> ``{layer: (window, head) bool}`` active pairs, greyed
    # where False (None: nothing pruned), or None
    hint: Callable[[Any], str | None] | None = None  # model no kind shows -> why this kind cannot (e.g. a pruned
    # deploy form), or None

    def shows(self, hook_names) -> bool:
        """Whether a model with these hook-point names is shown this way."""
        return any(fnmatch.fnmatchcase(n, p) for p in self.hooks for n in hook_names)


EXTRACTORS: dict[str, Extractor] = {}
OPTIONS: dict[str, tuple[ExtractorOption, ...]] = {}  # extractor name -> its CLI options
EXAMPLES: dict[str, Example] = {}  # extractor name -> its example
EXPLORE: dict[str, ExploreKind] = {}  # extractor name -> how the explorer shows its maps


def register(name: str, *, options: tuple[ExtractorOption, ...] = (), example: Example | None = None,
             explore: ExploreKind | None = None) -> Callable[[Extractor], Extractor]:
    """Decorator: register ``fn`` as the extractor called ``name``, with its CLI ``options``, ``example`` and, for
    token-to-token maps, how the explorer shows them (``explore``)."""

    def deco(fn: Extractor) -> Extractor:
        EXTRACTORS[name] = fn
        OPTIONS[name] = tuple(options)
        if example is not None:
            EXAMPLES[name] = example
        if explore is not None:
            EXPLORE[name] = explore
        return fn

    return deco


def cli_options() -> dict[str, tuple[ExtractorOption, tuple[str, ...]]]:
    """Option name -> (the option, the extractors that take it), over every registered extractor. Extractors that
    share an option name share its flag (their choices are merged).

    Raises:
        ValueError: two extractors declare one option name with different types.
    """
    load_all()
    out: dict[str, tuple[ExtractorOption, tuple[str, ...]]] = {}
    for kind, opts in OPTIONS.items():
        for o in opts:
            if o.name in out:
                seen, kinds = out[o.name]
                if seen.type is not o.type:
                    raise ValueError(f"extractors {kinds[0]!r} and {kind!r} declare option {o.name!r} with different types")
                choices = None if seen.choices is None or o.choices is None else tuple(dict.fromkeys(seen.choices + o.choices))
                out[o.name] = (ExtractorOption(o.name, seen.help, choices, seen.type), kinds + (kind,))
            else:
                out[o.name] = (o, (kind,))
    return out


def get_extractor(name: str) -> Extractor:
    """The extractor registered as ``name``; raises ``KeyError`` listing the known ones.

    Example:
        The ``attention`` extractor on the tiny random-weight ViT of its registration (``examples.vit``):

        >>> import torch
        >>> from workbench.analysis import examples, get_extractor
        >>> extract = get_extractor("attention")
        >>> _ = torch.manual_seed(0)
        >>> ds = extract(examples.vit(), torch.randn(2, 1, 28, 28), layers=[0, 2])
        >>> dict(ds["attention"].sizes), ds.attrs["analysis"]
        ({'sample': 2, 'layer': 2, 'head': 4, 'query': 50, 'key': 50}, 'attention')
        >>> bool(abs(ds["attention"].sum("key") - 1).max() < 1e-5)  # every row a probability distribution
        True
    """
    if name not in EXTRACTORS:
        load_all()
    if name not in EXTRACTORS:
        raise KeyError(f"unknown analysis {name!r}; known: {', '.join(sorted(EXTRACTORS))}")
    return EXTRACTORS[name]


def load_all() -> dict[str, Extractor]:
    """Import every module of this package (each registers its extractors) and return :data:`EXTRACTORS`."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    return EXTRACTORS


def explore_kinds(load: bool = True) -> dict[str, ExploreKind]:
    """Extractor name -> :class:`ExploreKind`, every registered one, in the order the explorer tries them.

    ``load=False`` imports no extractor (no torch: the explorer reading stores): the registrations made so far, and
    those of this package's modules read from their source — the literal fields of each ``register(...,
    explore=ExploreKind(...))``; its functions (``prepare``, ``masks``, ``hint``) are left None, reading a store
    needs none of them.
    """
    if load:
        load_all()
        kinds = dict(EXPLORE)
    else:
        kinds = {**_declared_kinds(), **EXPLORE}
    return dict(sorted(kinds.items(), key=lambda kv: (kv[1].order, kv[0])))


@functools.cache
def _declared_kinds() -> dict[str, ExploreKind]:
    """The ``register("name", explore=ExploreKind(...))`` calls in this package's source, literal fields only."""
    out: dict[str, ExploreKind] = {}
    literal = {f.name for f in fields(ExploreKind) if f.name not in ("prepare", "masks", "hint")}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        text = path.read_text()
        if "explore=ExploreKind(" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register" and node.args):
                continue
            spec = next((k.value for k in node.keywords if k.arg == "explore"), None)
            if isinstance(spec, ast.Call) and getattr(spec.func, "id", None) == "ExploreKind":
                names = [f.name for f in fields(ExploreKind)]
                args = dict(zip(names, (ast.literal_eval(a) for a in spec.args)))
                args.update({k.arg: ast.literal_eval(k.value) for k in spec.keywords if k.arg in literal})
                out[ast.literal_eval(node.args[0])] = ExploreKind(**args)
    return out


def hook_names(model) -> list[str]:
    """The names of ``model``'s hook points (:func:`methods.hooks.hook_points`), in module order."""
    from methods.hooks import hook_points

    return list(hook_points(model))


def explore_kind_of(model) -> str | None:
    """The registered explorer kind that shows ``model`` (the first, in :func:`explore_kinds` order, one of whose
    hook-point patterns the model has), or None."""
    kinds = explore_kinds()
    for kind in kinds.values():
        if kind.prepare is not None:
            kind.prepare()
    names = hook_names(model)
    return next((name for name, kind in kinds.items() if kind.shows(names)), None)
