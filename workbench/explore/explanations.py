"""The explorer's explanation mode: one method's map per model for the shown image, teacher beside its students.

:class:`ExplanationState` is plain Python (selection: image, method, colour scale -> the arrays of the view), like
:class:`~workbench.explore.state.ExploreState`. Its sources serve one model's maps of one image:

- :class:`StoreMaps`: a ``workbench explain`` store (``relevance_pixel(explainer, sample, img_y, img_x)``; no torch);
- :class:`LiveMaps`: a model explained on demand with :func:`workbench.explain.attribute`, every method of the
  mode at once per image, cached.

A method that does not apply to a model (an LSTM has no attention) gives an empty panel with the reason. Colour
scale ``"shared"``: one scale for the method over every model's panel (maps of one method are in the same units),
its top the largest 99th percentile of |map| (clipped); ``"panel"``: each panel its own. :func:`draw` renders a view
with matplotlib (numpy only), :func:`explanation_mode` wraps the state in a small ipywidgets control.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Literal, Mapping

import numpy as np

from workbench.explore.rows import ExploreError
from workbench.explore.state import Images

__all__ = ["StoreMaps", "LiveMaps", "ExplainSelection", "ExplanationState", "draw", "explanation_state",
           "explanation_mode"]

PERCENTILE = 99.0
SIGNED = ("chefer_lrp", "attnlrp", "ig")  # signed maps: a diverging scale centred on 0


class StoreMaps:
    """Maps read from a ``workbench explain`` store (an xarray Dataset or its path)."""

    def __init__(self, store):
        import xarray as xr

        from workbench.store import open_store

        ds = store if isinstance(store, xr.Dataset) else open_store(store, load=True)
        if "relevance_pixel" not in ds:
            raise ExploreError("an explanation store needs relevance_pixel (written by `workbench explain`)")
        self.ds = ds if "explainer" in ds["relevance_pixel"].dims else ds.expand_dims(explainer=[str(ds["explainer"].values)])
        self.reasons = json.loads(ds.attrs.get("not_applicable", "{}"))

    def maps(self, image: int) -> dict[str, np.ndarray | str]:
        """method -> ``(H, W)`` map of image ``image``, or the reason the method does not apply."""
        rel = self.ds["relevance_pixel"].isel(sample=image)
        return {**self.reasons, **{str(e): rel.sel(explainer=e).values for e in self.ds["explainer"].values}}


class LiveMaps:
    """Maps of a live model, explained on demand (every method at once per image, cached)."""

    def __init__(self, model, images, methods: list[str], **options):
        self.model, self.images, self.methods, self.options = model, images, list(methods), options
        self.cache: dict[int, dict] = {}

    def maps(self, image: int) -> dict[str, np.ndarray | str]:
        if image not in self.cache:
            from workbench.explain import attribute

            ds = attribute(self.model, self.images[image:image + 1], method=self.methods, **self.options)
            out: dict = json.loads(ds.attrs["not_applicable"])
            out.update({str(e): ds["relevance_pixel"].sel(explainer=e).values[0] for e in ds["explainer"].values})
            self.cache[image] = out
        return self.cache[image]


@dataclass(frozen=True)
class ExplainSelection:
    """What the explanation view shows."""

    image: int = 0  # position in Images.ids
    method: str = ""  # the explainer shown ("" = the first)
    scale: Literal["shared", "panel"] = "shared"  # one colour scale over the models' panels, or one per panel


class ExplanationState:
    """Selection -> one method's map per model for the shown image (module docstring)."""

    def __init__(self, sources: Mapping[str, StoreMaps | LiveMaps], images: Images, methods: list[str]):
        if not sources:
            raise ExploreError("the explanation mode needs at least one model or store")
        if not methods:
            raise ExploreError("the explanation mode needs at least one method")
        self.sources, self.images, self.methods = dict(sources), images, list(methods)
        self.selection = ExplainSelection(method=self.methods[0])

    def select(self, **changes) -> "ExplanationState":
        """Change the selection (``image``, ``method``, ``scale``); bad values raise :class:`ExploreError`."""
        sel = replace(self.selection, **changes)
        if not 0 <= sel.image < len(self.images.ids):
            raise ExploreError(f"image must be in 0..{len(self.images.ids) - 1}, got {sel.image}")
        if sel.method not in self.methods:
            raise ExploreError(f"unknown method {sel.method!r}; this view has {', '.join(self.methods)}")
        if sel.scale not in ("shared", "panel"):
            raise ExploreError(f"scale must be 'shared' or 'panel', got {sel.scale!r}")
        self.selection = sel
        return self

    def view(self) -> dict:
        """The arrays of the current view: the image, one panel per model (map or note, colour range)."""
        sel = self.selection
        panels = []
        for label, src in self.sources.items():
            got = src.maps(sel.image).get(sel.method, "not computed for this model")
            if isinstance(got, str):
                panels.append({"label": label, "map": None, "note": got})
            else:
                m = np.asarray(got, np.float64)
                top = float(np.nanpercentile(np.abs(m), PERCENTILE)) if np.isfinite(m).any() else 0.0
                panels.append({"label": label, "map": m, "note": "", "top": top or float(np.nanmax(np.abs(m)) or 1.0)})
        tops = [p["top"] for p in panels if p["map"] is not None]
        shared = max(tops) if tops else 1.0
        signed = sel.method in SIGNED
        for p in panels:
            if p["map"] is not None:
                top = shared if sel.scale == "shared" else p["top"]
                p["vmin"], p["vmax"] = (-top if signed else min(0.0, float(np.nanmin(p["map"])))), top
        return {"image": self.images.display[sel.image], "image_id": self.images.ids[sel.image], "method": sel.method,
                "scale": sel.scale, "signed": signed, "panels": panels}


def draw(view: dict, *, panel_inches: float = 2.2):
    """The view as a matplotlib figure: the image, then one panel per model with its colour bar."""
    import matplotlib.pyplot as plt

    panels = view["panels"]
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(panel_inches * (len(panels) + 1) + 0.6, panel_inches + 0.7),
                             layout="constrained", squeeze=False)
    axes = axes[0]
    img = np.asarray(view["image"])
    axes[0].imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=1)
    axes[0].set_title(view["image_id"], fontsize=8)
    cmap = "RdBu_r" if view["signed"] else "viridis"
    for ax, p in zip(axes[1:], panels):
        ax.set_title(p["label"], fontsize=9)
        if p["map"] is None:
            ax.set_facecolor("#d9d9d9")
            ax.text(0.5, 0.5, "n/a:\n" + p["note"][:90], ha="center", va="center", fontsize=6, wrap=True,
                    transform=ax.transAxes)
        else:
            im = ax.imshow(np.clip(p["map"], p["vmin"], p["vmax"]), cmap=cmap, vmin=p["vmin"], vmax=p["vmax"])
            cb = fig.colorbar(im, ax=ax, shrink=0.8)
            cb.set_label(f"{view['method']} relevance (its units)", fontsize=7)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"{view['method']}: one map per model ({view['scale']} colour scale)", fontsize=10)
    return fig


def explanation_state(models: Mapping[str, object] | None = None, images: str | None = None, *,
                      methods: list[str], stores: Mapping[str, object] | None = None, device: str = "cpu"
                      ) -> ExplanationState:
    """An :class:`ExplanationState` over live models (label -> run id, timm name or ``nn.Module``; ``images`` an
    image spec) or ``stores`` (label -> ``workbench explain`` store or Dataset; no torch)."""
    if stores:
        sources = {k: StoreMaps(v) for k, v in stores.items()}
        first = next(iter(sources.values())).ds
        display = first["image"].values if "image" in first else np.zeros((first.sizes["sample"], 1, 1))
        return ExplanationState(sources, Images(display, [f"#{int(s)}" for s in first["sample"].values]), methods)
    if not models or images is None:
        raise ExploreError("give models and an image spec, or stores")
    from workbench.data import load_images
    from workbench.models import load_model

    loaded = {k: (load_model(v, device=device) if isinstance(v, str) else v) for k, v in models.items()}
    first = next((m for m in loaded.values() if hasattr(m, "input_size")), None)
    kw = {} if first is None else dict(input_size=first.input_size, mean=first.mean, std=first.std)
    batch = load_images(images, **kw)
    ids = [f"{batch.source.dataset}[{int(i)}]" for i in batch.source.indices]
    sources = {k: LiveMaps(getattr(m, "model", m), batch.tensor, methods) for k, m in loaded.items()}
    return ExplanationState(sources, Images(batch.display, ids), methods)


def _close(fig) -> None:
    """Close ``fig`` (it is shown once, as an output, not again by the notebook's inline backend)."""
    import matplotlib.pyplot as plt

    plt.close(fig)


def explanation_mode(state: ExplanationState):
    """A small ipywidgets view of the state: method and image controls above the drawn view."""
    import ipywidgets as widgets
    from IPython.display import display

    method = widgets.Dropdown(options=state.methods, value=state.selection.method, description="method")
    image = widgets.IntSlider(value=state.selection.image, min=0, max=len(state.images.ids) - 1, description="image")
    scale = widgets.ToggleButtons(options=["shared", "panel"], value=state.selection.scale, description="scale")
    out = widgets.Output()

    def redraw(_=None):
        state.select(method=method.value, image=image.value, scale=scale.value)
        with out:
            out.clear_output(wait=True)
            fig = draw(state.view())
            display(fig)
            _close(fig)

    for w in (method, image, scale):
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([method, image, scale]), out])
