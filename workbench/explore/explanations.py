"""The explorer's explanation mode: one method's map per model for the shown image, teacher beside its students.

:class:`ExplanationState` is plain Python (selection: image, method, colour scale -> the arrays of the view), like
:class:`~workbench.explore.state.ExploreState`. Its sources serve one model's maps of one image:

- :class:`StoreMaps`: a ``workbench explain`` store (``relevance_pixel(explainer, sample, img_y, img_x)``; no torch);
- :class:`LiveMaps`: a model explained on demand with :func:`workbench.explain.attribute`, one method of one image
  per call, cached per (image id, method);
- :class:`NoMaps`: a model the explorer holds only as a store of attention maps (the reason, no map).

A method that does not apply to a model (an LSTM has no attention) gives an empty panel with the reason. Colour
scale ``"shared"``: one scale for the method over every model's panel (maps of one method are in the same units,
:data:`workbench.plots.explain.UNITS`), its top the largest 99th percentile of |map| (clipped); ``"panel"``: each
panel its own. :func:`draw` renders a view with matplotlib (numpy only), :func:`explanation_mode` wraps the state in
a small ipywidgets control.

In the browser explorer (:class:`~workbench.explore.widget.Explorer`, its "view" menu set to "explanations"), the
state comes from :func:`follow_explorer`: it follows the explorer's :class:`~workbench.explore.state.ExploreState`
for the image and colour scale (one source of truth: the explanation of one image is never drawn over another;
every panel carries the id of the image its map was computed on, checked against the shown image's), and
:meth:`ExplanationState.payload` is what the browser draws.
"""

from __future__ import annotations

import json
import textwrap
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Literal, Mapping

import numpy as np

from workbench.explore.rows import ExploreError, image_ids
from workbench.explore.state import Images
from workbench.plots.explain import SIGNED, UNITS

__all__ = ["StoreMaps", "LiveMaps", "NoMaps", "ExplainSelection", "ExplanationState", "draw", "explanation_state",
           "explanation_mode", "follow_explorer", "coarsest", "Aligned", "DEFAULT_METHODS"]

PERCENTILE = 99.0
#: the explainers an Explorer offers, in this order (those registered; the field's most trusted first)
DEFAULT_METHODS = ("generic_attention", "chefer_lrp", "attnlrp", "cp_lrp", "rollout", "raw_attention", "gradcam",
                   "legrad", "saliency", "ig")


class StoreMaps:
    """Maps read from a ``workbench explain`` store (an xarray Dataset or its path)."""

    def __init__(self, store):
        import xarray as xr

        from workbench.explore.build import open_store_lazily  # no torch

        ds = store if isinstance(store, xr.Dataset) else open_store_lazily(store, "explanations").load()
        if "relevance_pixel" not in ds:
            raise ExploreError("an explanation store needs relevance_pixel (written by `workbench explain`)")
        self.ds = ds if "explainer" in ds["relevance_pixel"].dims else ds.expand_dims(explainer=[str(ds["explainer"].values)])
        self.reasons = json.loads(ds.attrs.get("not_applicable") or "{}")
        try:  # "dataset[index]" where the store is stamped (``workbench explain``), else "#sample"
            self.ids = image_ids(ds)
        except ExploreError:
            self.ids = [f"#{int(s)}" for s in ds["sample"].values]

    def maps(self, image: int) -> dict[str, np.ndarray | str]:
        """method -> ``(H, W)`` map of image ``image``, or the reason the method does not apply."""
        rel = self.ds["relevance_pixel"].isel(sample=image)
        return {**self.reasons, **{str(e): rel.sel(explainer=e).values for e in self.ds["explainer"].values}}

    def image_id(self, image: int) -> str:
        return self.ids[image]

    def map(self, image: int, method: str) -> np.ndarray | str:
        return self.maps(image).get(method, "not in this explanation store")


class Aligned:
    """A source's maps numbered by another image list (an explorer's): an image the source lacks gets the reason."""

    def __init__(self, source, ids: list[str]):
        self.source, self.ids = source, list(ids)
        self.rows = {iid: k for k, iid in enumerate(source.ids)}  # image id -> the source's numbering

    def image_id(self, image: int) -> str:
        iid = self.ids[image]
        return self.source.image_id(self.rows[iid]) if iid in self.rows else iid

    def map(self, image: int, method: str) -> np.ndarray | str:
        iid = self.ids[image]
        if iid not in self.rows:
            return f"its explanation store holds no map of {iid} (explain these images: `workbench explain`)"
        return self.source.map(self.rows[iid], method)


class LiveMaps:
    """Maps of a live model, explained on demand: one method of one image per call, cached per (image id, method).

    Args:
        model: eval-mode classifier.
        images: ``(B, C, H, W)`` normalised for it.
        methods: the explainers offered.
        ids: the images' ids (``dataset[index]``; default ``#i``): each map is returned with the id of its image.
        keep: maps kept (the most recently shown; a 224-pixel map is 200 kB).
        positions: the row of ``images`` of each image the caller numbers (default: the same numbering), e.g. an
            explorer that shows only the images every store holds, a subset of its live models' images.
        options: explainer options (each goes to the methods that take it, e.g. ``n_steps`` to ``ig``).
    """

    def __init__(self, model, images, methods: list[str], ids: list[str] | None = None, keep: int = 64,
                 positions: list[int] | None = None, **options):
        self.model, self.images, self.methods, self.options = model, images, list(methods), options
        self.ids = list(ids) if ids is not None else [f"#{i}" for i in range(len(images))]
        self.keep = keep
        self.positions = list(positions) if positions is not None else list(range(len(images)))
        self.cache: OrderedDict[tuple[str, str], np.ndarray | str] = OrderedDict()

    def image_id(self, image: int) -> str:
        return self.ids[self.positions[image]]

    def map(self, image: int, method: str) -> np.ndarray | str:
        """``(H, W)`` map of ``method`` on image ``image``, or the reason it does not apply (or failed)."""
        key = (self.image_id(image), method)
        if key not in self.cache:
            self.cache[key] = self._compute(image, method)
            while len(self.cache) > self.keep:  # memory stays bounded: the least recently shown go
                self.cache.popitem(last=False)
        self.cache.move_to_end(key)
        return self.cache[key]

    def _compute(self, image: int, method: str) -> np.ndarray | str:
        import inspect

        from workbench.explain import attribute, get_explainer

        e = get_explainer(method)
        why = e.applies(self.model)
        if why:
            return why
        params = inspect.signature(e.fn).parameters
        opts = {k: v for k, v in self.options.items() if k in params}
        try:
            row = self.positions[image]
            ds = attribute(self.model, self.images[row:row + 1], method=method, **opts)
        except (ValueError, ImportError) as err:  # e.g. the optional `lxt` missing: the panel says so
            return f"not computed: {err}"
        return ds["relevance_pixel"].values[0]

    def maps(self, image: int) -> dict[str, np.ndarray | str]:
        """method -> map (or reason), every method of this source."""
        return {m: self.map(image, m) for m in self.methods}


class NoMaps:
    """A model the explorer has only as a store of maps: no explanation, with the reason."""

    def __init__(self, reason: str, ids: list[str]):
        self.reason, self.ids = reason, list(ids)

    def image_id(self, image: int) -> str:
        return self.ids[image]

    def map(self, image: int, method: str) -> str:
        return self.reason


@dataclass(frozen=True)
class ExplainSelection:
    """What the explanation view shows."""

    image: int = 0  # position in Images.ids (followed: the explorer's own image, not this field)
    method: str = ""  # the explainer shown ("" = the first)
    scale: Literal["shared", "panel"] = "shared"  # one colour scale over the models' panels, or one per panel
    shown: bool = False  # in an Explorer: whether its view shows the explanations (else its attention maps)


class ExplanationState:
    """Selection -> one method's map per model for the shown image (module docstring).

    Args:
        sources: label -> maps source (:class:`StoreMaps`, :class:`LiveMaps`, :class:`NoMaps`).
        images: the images.
        methods: the explainers offered.
        follow: an :class:`~workbench.explore.state.ExploreState` whose image and colour scale this view shows: the
            one source of truth for the image (selecting ``image`` or ``scale`` here selects it there), so that the
            explanation of one image is never drawn over another.
    """

    def __init__(self, sources: Mapping[str, object], images: Images, methods: list[str], *, follow=None):
        if not sources:
            raise ExploreError("the explanation mode needs at least one model or store")
        if not methods:
            raise ExploreError("the explanation mode needs at least one method")
        self.sources, self.images, self.methods = dict(sources), images, list(methods)
        self.follow = follow
        self.selection = ExplainSelection(method=self.methods[0])
        self._observers: list = []

    @property
    def image(self) -> int:
        """The shown image's position (the followed explorer's, when there is one)."""
        return self.follow.selection.image if self.follow is not None else self.selection.image

    @property
    def scale(self) -> str:
        return self.follow.selection.scale if self.follow is not None else self.selection.scale

    def observe(self, callback) -> None:
        """Call ``callback(state, changed_fields)`` after each selection change."""
        self._observers.append(callback)

    def select(self, **changes) -> "ExplanationState":
        """Change the selection (``image``, ``method``, ``scale``, ``shown``); bad values raise :class:`ExploreError`."""
        if self.follow is not None:
            shared = {k: changes.pop(k) for k in ("image", "scale") if k in changes}
            if shared:
                self.follow.select(**shared)
        sel = replace(self.selection, **changes)
        if not 0 <= sel.image < len(self.images.ids):
            raise ExploreError(f"image must be in 0..{len(self.images.ids) - 1}, got {sel.image}")
        if sel.method not in self.methods:
            raise ExploreError(f"unknown method {sel.method!r}; this view has {', '.join(self.methods)}")
        if sel.scale not in ("shared", "panel"):
            raise ExploreError(f"scale must be 'shared' or 'panel', got {sel.scale!r}")
        changed = {k for k in ("image", "method", "scale", "shown") if getattr(sel, k) != getattr(self.selection, k)}
        self.selection = sel
        for callback in list(self._observers) if changed else []:
            callback(self, changed)
        return self

    def view(self) -> dict:
        """The arrays of the current view: the image, one panel per model (map or note, colour range, units, the id
        of the image its map was computed on).

        Raises:
            ExploreError: a source that returns the map of another image than the one shown.
        """
        method, image, scale = self.selection.method, self.image, self.scale
        image_id = self.images.ids[image]
        units = UNITS.get(method, "relevance (a.u.)")
        panels = []
        for label, src in self.sources.items():
            got, of = src.map(image, method), src.image_id(image)
            if of != image_id:
                raise ExploreError(f"{label!r} returned the {method} map of image {of} for image {image_id}; "
                                   "refusing to draw it")
            if isinstance(got, str):
                panels.append({"label": label, "map": None, "note": got, "image_id": of, "units": units})
            else:
                m = np.asarray(got, np.float64)
                top = float(np.nanpercentile(np.abs(m), PERCENTILE)) if np.isfinite(m).any() else 0.0
                panels.append({"label": label, "map": m, "note": "", "image_id": of, "units": units,
                               "top": top or float(np.nanmax(np.abs(m), initial=0.0) or 1.0),
                               "low": min(0.0, float(np.nanmin(m, initial=0.0)))})
        drawn = [p for p in panels if p["map"] is not None]
        shared_top = max((p["top"] for p in drawn), default=1.0)
        shared_low = min((p["low"] for p in drawn), default=0.0)
        signed = method in SIGNED
        for p in drawn:
            top, low = (shared_top, shared_low) if scale == "shared" else (p["top"], p["low"])
            p["vmin"], p["vmax"] = (-top if signed else max(low, -top)), top
        return {"image": self.images.display[image], "image_id": image_id, "method": method, "scale": scale,
                "signed": signed, "units": units, "panels": panels}

    def payload(self) -> tuple[dict, dict[str, bytes]]:
        """What the explorer's browser view receives: a JSON-able dict (``mode="explain"``; per panel its label,
        grid, colour range, units, note, image id) and ``panels``: float32 maps of the drawn panels, concatenated in
        model order (float32: relevance values span more decades than float16 keeps), each on the coarsest grid it
        is constant over (:func:`coarsest`: a patch map repeated over its pixels travels as the patch grid)."""
        v = self.view()
        maps, meta = [], []
        for p in v["panels"]:
            drawn = p["map"] is not None
            if drawn:
                maps.append(coarsest(np.asarray(p["map"], np.float32)))
            meta.append(dict(label=p["label"], image_id=p["image_id"], note=p["note"], units=p["units"],
                             grid=list(maps[-1].shape) if drawn else [0, 0],
                             vmin=float(p["vmin"]) if drawn else None, vmax=float(p["vmax"]) if drawn else None))
        state = dict(mode="explain", image_id=v["image_id"], method=v["method"], scale=v["scale"], signed=v["signed"],
                     units=v["units"], panels=meta)
        return state, {"panels": np.concatenate([m.ravel() for m in maps]).tobytes() if maps else b""}


def coarsest(m: np.ndarray) -> np.ndarray:
    """``m`` ``(H, W)`` on the coarsest grid it is constant over, blocks of s x s pixels (s divides H and W; the
    largest that holds exactly): repeating each cell s times along both axes gives ``m`` back, bit for bit."""
    h, w = m.shape
    for s in sorted((d for d in range(2, min(h, w) + 1) if h % d == 0 and w % d == 0), reverse=True):
        small = m[::s, ::s]  # (H / s, W / s)
        if np.array_equal(np.repeat(np.repeat(small, s, 0), s, 1), m, equal_nan=True):
            return small
    return m


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
        if p["map"] is None:  # the image's shape in grey (panels line up), the reason wrapped inside it
            ax.imshow(np.full(img.shape[:2], 0.85), cmap="gray", vmin=0, vmax=1)
            why = textwrap.wrap(p["note"], 30)
            ax.text(0.5, 0.5, "does not apply:\n" + "\n".join(why[:7] + (["…"] if len(why) > 7 else [])),
                    ha="center", va="center", fontsize=6, transform=ax.transAxes)
        else:
            im = ax.imshow(np.clip(p["map"], p["vmin"], p["vmax"]), cmap=cmap, vmin=p["vmin"], vmax=p["vmax"])
            cb = fig.colorbar(im, ax=ax, shrink=0.8)
            cb.set_label(view.get("units", f"{view['method']} relevance"), fontsize=7)
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
        first = next(iter(sources.values()))
        display = first.ds["image"].values if "image" in first.ds else np.zeros((first.ds.sizes["sample"], 1, 1))
        return ExplanationState(sources, Images(display, first.ids), methods)
    if not models or images is None:
        raise ExploreError("give models and an image spec, or stores")
    from workbench.data import load_images
    from workbench.models import load_model

    loaded = {k: (load_model(v, device=device) if isinstance(v, str) else v) for k, v in models.items()}
    first = next((m for m in loaded.values() if hasattr(m, "input_size")), None)
    kw = {} if first is None else dict(input_size=first.input_size, mean=first.mean, std=first.std)
    batch = load_images(images, **kw)
    ids = [f"{batch.source.dataset}[{int(i)}]" for i in batch.source.indices]
    sources = {k: LiveMaps(getattr(m, "model", m), batch.tensor, methods, ids=ids) for k, m in loaded.items()}
    return ExplanationState(sources, Images(batch.display, ids), methods)


def follow_explorer(state, methods: list[str] | None = None, stores: Mapping[str, object] | None = None,
                    **options) -> ExplanationState:
    """The explanation mode of an explorer: an :class:`ExplanationState` over its models that follows its
    :class:`~workbench.explore.state.ExploreState` (the image and colour scale are the explorer's own).

    Args:
        state: the explorer's state; its live models are explained on the images they hold, a store has no model
            (its panel says so).
        methods: the explainers offered (default: :data:`DEFAULT_METHODS` that are registered; with stores alone,
            those the stores hold).
        stores: label (one of the explorer's models) -> ``workbench explain`` store (path or Dataset): that model's
            maps read from it (matched to the explorer's images by image id), not computed.
        options: explainer options (e.g. ``n_steps`` of ``ig``).
    """
    stores = {k: StoreMaps(v) for k, v in (stores or {}).items()}
    stray = sorted(set(stores) - set(state.sources))
    if stray:
        raise ExploreError(f"explanation stores for {stray}, which is no model here; label them with one of "
                           f"{list(state.sources)}")
    live = [k for k, src in state.sources.items() if getattr(src, "model", None) is not None and k not in stores]
    if methods is None and stores and not live:
        held = {str(e) for st in stores.values() for e in st.ds["explainer"].values}
        methods = [m for m in DEFAULT_METHODS if m in held] + sorted(held - set(DEFAULT_METHODS))
    if live:
        from workbench.explain import load_all  # torch: only where there is a live model (stores alone stay light)

        known = load_all()
        methods = [m for m in DEFAULT_METHODS if m in known] if methods is None else list(methods)
        unknown = [m for m in methods if m not in known]
        if unknown:
            raise ExploreError(f"unknown explainers {unknown}; known: {', '.join(sorted(known))}")
    methods = list(DEFAULT_METHODS) if methods is None else methods
    sources: dict = {}
    for label, src in state.sources.items():
        model = getattr(src, "model", None)
        if label in stores:
            sources[label] = Aligned(stores[label], state.images.ids)
        elif model is None:
            sources[label] = NoMaps("a store of maps, no model to explain (pass the model itself, or explain it with "
                                    "`workbench explain`)", state.images.ids)
        else:
            sources[label] = LiveMaps(model, src.images, methods, ids=src.ids, **options,
                                      positions=[src.ids.index(i) for i in state.images.ids])
    return ExplanationState(sources, state.images, methods, follow=state)


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
