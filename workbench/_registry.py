"""The one helper behind the workbench's small registries (extractors, figures, pipelines)."""

from __future__ import annotations

import importlib
from typing import Iterable


def import_modules(modules: Iterable[str]) -> None:
    """Import modules that fill a registry; a module that does not exist (yet) is skipped.

    An import error *inside* an existing module is raised, so a broken method is never hidden.
    """
    for mod in modules:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as err:
            if err.name != mod:
                raise
