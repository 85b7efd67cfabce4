"""Plots: xarray Datasets in, matplotlib Figures out.

Nothing in this package imports torch or sees a model, so any figure can be redrawn from a store
alone. Each plot function takes a Dataset (or DataArray), accepts ``ax=None`` (pass one Axes to
draw a single panel there) and returns the Figure. :func:`workbench.plots.theme.set_theme` gives
the shared look; the colormap constants there keep one meaning per colormap across figures.
"""

from workbench.plots.theme import ATTENTION_CMAP, DIVERGING_CMAP, set_theme

__all__ = ["ATTENTION_CMAP", "DIVERGING_CMAP", "set_theme"]
