"""Analysis extractors: ``extract(model, images, *, layers=None, **options) -> xr.Dataset``.

Every extractor has that one signature shape. ``model`` is an eval-mode ``nn.Module``; ``images``
a float tensor ``(B, C, H, W)`` already normalised for the model. The Dataset uses the shared dims
of DESIGN.md and carries the attrs ``analysis`` (its registry name) and ``config`` (JSON of its
arguments); :func:`workbench.provenance.stamp` adds the rest. Extractors register themselves
with :func:`register`, so the CLI, the figure registry and the shared test table find them all.
"""

from __future__ import annotations

from typing import Callable, Protocol

import xarray as xr

from workbench._registry import import_modules


class Extractor(Protocol):
    def __call__(self, model, images, *, layers=None, **options) -> xr.Dataset: ...


EXTRACTORS: dict[str, Extractor] = {}

# Modules that register extractors; imported lazily so importing workbench stays cheap.
_MODULES = (
    "workbench.analysis.attention",
    "workbench.analysis.dependency",
    "workbench.analysis.retention",
    "workbench.analysis.window_saliency",
)


def register(name: str) -> Callable[[Extractor], Extractor]:
    """Decorator: register ``fn`` as the extractor called ``name``."""

    def deco(fn: Extractor) -> Extractor:
        EXTRACTORS[name] = fn
        return fn

    return deco


def get_extractor(name: str) -> Extractor:
    """The extractor registered as ``name``; raises ``KeyError`` listing the known ones."""
    load_all()
    if name not in EXTRACTORS:
        raise KeyError(f"unknown analysis {name!r}; known: {', '.join(sorted(EXTRACTORS))}")
    return EXTRACTORS[name]


def load_all() -> dict[str, Extractor]:
    import_modules(_MODULES)
    return EXTRACTORS
