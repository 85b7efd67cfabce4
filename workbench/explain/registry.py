"""The explainer registry: every attribution method is registered once with :func:`explainer` and called the same way.

An explainer is ``fn(model, images, target, **options) -> Maps``: ``model`` an eval-mode classifier, ``images``
``(B, C, H, W)`` normalised for it, ``target`` ``(B,)`` the class explained per image. It returns its map on the
grid where the method is defined (:class:`Maps`); :func:`workbench.explain.attribute` fills in the other grid and
builds the Dataset. Its registration also declares ``applies(model) -> None | reason``: the reason a method does not
apply to a model form (an LSTM has no attention, a CNN has no tokens), so that no caller ever gets a silent NaN.
Explainers reach a model only through its named hook points (:mod:`methods.hooks`), never by naming a method.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Protocol

import torch
import torch.nn as nn

__all__ = ["Maps", "Explainer", "ExplainerFn", "EXPLAINERS", "explainer", "get_explainer", "load_all",
           "applicability", "always"]


@dataclass(frozen=True)
class Maps:
    """What an explainer computed for a batch; at least one of the two grids."""

    patch: torch.Tensor | None = None  # (B, gh, gw) on the model's patch grid (a CNN: its last stage's feature grid)
    pixel: torch.Tensor | None = None  # (B, H, W) on the input's pixel grid
    extra: dict[str, torch.Tensor] | None = None  # per-image side results, name -> (B,), e.g. IG's completeness gap


class ExplainerFn(Protocol):
    def __call__(self, model: nn.Module, images: torch.Tensor, target: torch.Tensor, **options) -> Maps: ...


def always(model: nn.Module) -> str | None:
    """``applies`` of a method defined for every differentiable classifier."""
    return None


@dataclass(frozen=True)
class Explainer:
    """One registered attribution method."""

    name: str  # registry name, the ``explainer`` coordinate (e.g. "generic_attention")
    fn: ExplainerFn  # the method
    applies: Callable[[nn.Module], str | None]  # None if it applies to the model, else the reason it does not
    native: Literal["patch", "pixel"]  # the grid the method is defined on (the other one is derived)
    class_specific: bool  # whether the map depends on the explained class (rollout, raw attention do not)
    paper: str  # the reference, e.g. "Chefer et al., ICCV 2021"


EXPLAINERS: dict[str, Explainer] = {}


def explainer(name: str, *, applies: Callable[[nn.Module], str | None] = always,
              native: Literal["patch", "pixel"] = "patch", class_specific: bool = True, paper: str = ""
              ) -> Callable[[ExplainerFn], ExplainerFn]:
    """Decorator: register ``fn`` as the explainer called ``name`` (see :class:`Explainer` for the fields)."""

    def deco(fn: ExplainerFn) -> ExplainerFn:
        EXPLAINERS[name] = Explainer(name, fn, applies, native, class_specific, paper)
        return fn

    return deco


def load_all() -> dict[str, Explainer]:
    """Import every module of the package (each registers its explainers) and return :data:`EXPLAINERS`."""
    package = __name__.rsplit(".", 1)[0]  # workbench.explain, found from its files (no import of the package here)
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{package}.{info.name}")
    return EXPLAINERS


def get_explainer(name: str) -> Explainer:
    """The explainer registered as ``name``.

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if name not in EXPLAINERS:
        load_all()
    if name not in EXPLAINERS:
        raise ValueError(f"unknown explainer {name!r}; known: {', '.join(sorted(EXPLAINERS))}")
    return EXPLAINERS[name]


def applicability(model: nn.Module) -> dict[str, str | None]:
    """Every registered explainer -> None if it applies to ``model``, else the reason it does not."""
    return {name: e.applies(model) for name, e in sorted(load_all().items())}
