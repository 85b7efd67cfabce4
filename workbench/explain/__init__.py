"""Explanations of any model form, registered once and called one way (issue #29).

``attribute(model, images, method=..., target=None, **options) -> xr.Dataset`` (:mod:`workbench.explain.core`)
runs any explainer of :data:`EXPLAINERS` (registered with :func:`explainer`; :func:`load_all` imports every module
of this package, so there is no hand-kept list). Each explainer declares whether it applies to a model and why
not. Faithfulness tests (Chefer's positive / negative perturbation, Adebayo's randomisation check) are in
:mod:`workbench.explain.faithfulness`.
"""

from __future__ import annotations

from workbench.explain.core import attribute, resolve_target
from workbench.explain.registry import (
    EXPLAINERS,
    Explainer,
    Maps,
    applicability,
    explainer,
    get_explainer,
    load_all,
)

__all__ = ["attribute", "resolve_target", "EXPLAINERS", "Explainer", "Maps", "applicability", "explainer",
           "get_explainer", "load_all"]
