"""Explore in JupyterLab: click a patch, see that token's map in every layer and head, teacher beside its students.

``explore(teacher, students={...}, images=SPEC)`` or ``explore(stores={"teacher": "vit.nc", "FAR": "far_dep.nc"})``
returns an :class:`~workbench.explore.widget.Explorer` widget (anywidget + ipywidgets). The logic is a plain
Python state object (:class:`~workbench.explore.state.ExploreState`: selection -> arrays of the current view) that
the widget observes; ``.snapshot()`` draws the current view with matplotlib and ``.export(path)`` writes the PNG
with the code that redraws it. The explanation mode (:mod:`~workbench.explore.explanations`:
``explanation_mode(explanation_state(models, images, methods=[...]))``) shows one explainer's map per model for the
shown image. Nothing is imported until used: ``import workbench.explore`` stays light, and
exploring stores alone never imports torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__all__ = ["explore", "ExploreState", "ExploreError", "Explorer", "build_state", "draw", "explanation_state",
           "explanation_mode"]

_WHERE = {"ExploreState": "state", "ExploreError": "rows", "Explorer": "widget", "build_state": "build",
          "draw": "snapshot", "explore": "widget", "explanation_state": "explanations",
          "explanation_mode": "explanations"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    """This package, callable: ``workbench.explore(...)`` is :func:`workbench.explore.widget.explore` (the package
    and the function share the name, and importing the package makes ``workbench.explore`` the package)."""

    def __call__(self, *args: Any, **kwargs: Any):
        return self.explore(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
