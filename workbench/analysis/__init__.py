"""Analysis extractors: ``extract(model, images, *, layers=None, targets=None, **options) -> xr.Dataset``.

Every extractor has that one signature shape. ``model`` is an eval-mode ``nn.Module``; ``images`` a
float tensor ``(B, C, H, W)`` already normalised for the model; ``targets`` the images' labels
``(B,)`` when known (extractors that do not need them ignore them). Extractors read model internals
by hook-point name (:mod:`methods.hooks`), never by module type. The Dataset uses the shared dims
(``docs/conventions.md``) and carries the attrs ``analysis`` (its registry name) and ``config`` (JSON of
its arguments); :func:`workbench.provenance.stamp` adds the rest. Extractors register themselves with
:func:`register`; every module of this package is imported by :func:`load_all` (no hand-kept list), so
the CLI and the shared test table find them all.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Protocol

import xarray as xr


class Extractor(Protocol):
    def __call__(self, model, images, *, layers=None, targets=None, **options) -> xr.Dataset: ...


EXTRACTORS: dict[str, Extractor] = {}


def register(name: str) -> Callable[[Extractor], Extractor]:
    """Decorator: register ``fn`` as the extractor called ``name``."""

    def deco(fn: Extractor) -> Extractor:
        EXTRACTORS[name] = fn
        return fn

    return deco


def get_extractor(name: str) -> Extractor:
    """The extractor registered as ``name``; raises ``KeyError`` listing the known ones."""
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
