"""Pipelines: data + model + method -> a run. One module per method, plus the teachers.

Importing a method's pipeline registers its model builder (:mod:`workbench.models`) and its
``workbench run`` command (:mod:`workbench.cli`); :func:`load_all` does that lazily.
"""

from __future__ import annotations

from workbench._registry import import_modules

METHOD_PIPELINES = ("workbench.pipelines.far", "workbench.pipelines.slimswin")


def load_all() -> None:
    """Import every method pipeline that exists (a method not written yet is skipped)."""
    import_modules(METHOD_PIPELINES)
