"""Compression methods from the five papers, plus what they share.

``methods`` never imports ``workbench``: a method exposes models, losses, schedules, pruning and
its own introspection as plain tensors; ``workbench`` turns those into named xarray Datasets.
Shared parts: :mod:`.hooks` (named hook points), :mod:`.flops` (one MAC counter), :mod:`.train`
(the training loop), :mod:`.io` (atomic writes), :mod:`.teachers` (the demo teachers). Every
method is a subpackage that registers its model forms with timm when imported.
"""

from __future__ import annotations

import importlib
import pkgutil

__all__ = ["register_models"]


def register_models() -> None:
    """Import the demo teachers and every method subpackage, so that timm knows all their model names."""
    importlib.import_module(f"{__name__}.teachers")
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg:
            importlib.import_module(f"{__name__}.{info.name}")
