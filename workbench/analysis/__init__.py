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
  ``tests/test_extractors.py`` checks the guarantees every extractor shares.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, Protocol

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


EXTRACTORS: dict[str, Extractor] = {}
OPTIONS: dict[str, tuple[ExtractorOption, ...]] = {}  # extractor name -> its CLI options
EXAMPLES: dict[str, Example] = {}  # extractor name -> its example


def register(name: str, *, options: tuple[ExtractorOption, ...] = (), example: Example | None = None
             ) -> Callable[[Extractor], Extractor]:
    """Decorator: register ``fn`` as the extractor called ``name``, with its CLI ``options`` and ``example``."""

    def deco(fn: Extractor) -> Extractor:
        EXTRACTORS[name] = fn
        OPTIONS[name] = tuple(options)
        if example is not None:
            EXAMPLES[name] = example
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
