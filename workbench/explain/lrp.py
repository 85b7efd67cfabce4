"""AttnLRP (Achtibat et al., ICML 2024) through ``lxt``: an optional extra, ``pip install 'vit-workbench[lrp]'``.

``lxt`` carries a patent notice for its LRP rules (see its README), so it is not a dependency of the workbench.
Until it is installed, ``attnlrp`` is registered but does not apply, and says how to get it; its rules for our
forms are still to come (issue #29), and it says that too rather than returning a map.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn as nn

from workbench.explain.registry import Maps, explainer

__all__ = ["lrp_applies"]


def lrp_applies(model: nn.Module) -> str | None:
    """Why AttnLRP does not apply (yet)."""
    if importlib.util.find_spec("lxt") is None:
        return ("AttnLRP needs the optional extra 'lrp' (the lxt package, which carries a patent notice): "
                "pip install 'vit-workbench[lrp]'")
    return "lxt is installed, but its rules for the workbench's model forms are not wired yet (issue #29)"


@explainer("attnlrp", applies=lrp_applies, paper="Achtibat et al., ICML 2024 (lxt; optional extra)")
def attnlrp(model: nn.Module, images: torch.Tensor, target: torch.Tensor) -> Maps:
    raise ValueError(lrp_applies(model))
