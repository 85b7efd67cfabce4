"""Shared look of every workbench figure: seaborn theme at paper size, one colormap per meaning.

Importing this module changes nothing; call :func:`set_theme` (the figure registry and the
notebooks do) to apply the theme globally, or use :func:`theme_rc` with ``plt.rc_context``.
"""

from __future__ import annotations

from typing import Any, Literal

#: Sequential colormap for probabilities and other non-negative magnitudes (attention, saliency).
ATTENTION_CMAP = "viridis"
#: Diverging colormap for signed differences (student minus teacher, ...); centre it on 0.
DIVERGING_CMAP = "RdBu_r"
#: Categorical palette for lines and bars (models, methods).
PALETTE = "colorblind"
#: Colour of missing values (NaN padding, e.g. heads a layer does not have).
MISSING_COLOR = "#d9d9d9"
#: Side of one image panel in inches at the paper context.
PANEL_INCHES = 1.7

Context = Literal["paper", "notebook", "talk", "poster"]


def theme_rc(context: Context = "paper", font_scale: float = 1.0) -> dict[str, Any]:
    """Matplotlib rc parameters of the workbench theme (for ``plt.rc_context``)."""
    import seaborn as sns

    rc = dict(sns.plotting_context(context, font_scale=font_scale))
    rc.update(sns.axes_style("white"))
    rc.update(
        {
            "image.cmap": ATTENTION_CMAP,
            "image.interpolation": "nearest",
            "figure.dpi": 100,
            "savefig.dpi": 200,
            "savefig.bbox": "tight",
            "figure.titleweight": "bold",
            "axes.titlepad": 3.0,
        }
    )
    return rc


def set_theme(context: Context = "paper", font_scale: float = 1.0) -> None:
    """Apply the workbench theme globally (seaborn ``white`` style, paper-size fonts, shared cmaps).

    Args:
        context: seaborn plotting context; ``"paper"`` for figures, ``"notebook"`` for exploration.
        font_scale: multiplies the context's font sizes.
    """
    import matplotlib as mpl
    import seaborn as sns

    sns.set_theme(context=context, style="white", palette=PALETTE, font_scale=font_scale)
    mpl.rcParams.update(theme_rc(context, font_scale))


def mark_random_init(result: Any, models: list[str]) -> Any:
    """Mark a figure or :class:`~workbench.plots.table.Table` built on models with random-init weights.

    A red line above the figure (a table: a title prefix and a note) names the untrained ``models``, so a picture
    of an untrained network is never mistaken for a result. Nothing happens when ``models`` is empty.

    Returns:
        ``result``, marked.
    """
    if not models:
        return result
    text = f"random-init weights: {', '.join(models)} (untrained, no checkpoint)"
    if hasattr(result, "frame") and hasattr(result, "notes"):  # a Table
        result.title = f"[random-init weights] {result.title}"
        result.notes.append(text + ": these numbers describe untrained networks")
        return result
    result.text(0.5, 1.0, text, transform=result.transFigure, ha="center", va="bottom", color="#c00000",
                fontweight="bold", fontsize="small")
    return result
