"""The explorer widget: an anywidget view (JavaScript and CSS shipped in this package, no CDN) with ipywidgets
controls, observing an :class:`~workbench.explore.state.ExploreState`.

Works offline wherever Jupyter widgets render (JupyterLab 4, Notebook 7, VS Code): anywidget loads
``static/explore.js`` from the package, so there is no separately built JupyterLab extension. The view sends a
click as a position in the image (fractions of height and width); Python maps it to the reference model's patch,
computes the payload and sends it back as binary buffers (float16 panel maps, uint8 thumbnails) and a small
JSON dict. Saved widget state does not survive a JupyterLab reload: :meth:`Explorer.snapshot` returns the
current view as a matplotlib figure and :meth:`Explorer.export` writes it as a PNG with the code that redraws it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import anywidget
import ipywidgets as widgets
import traitlets

from workbench.explore.build import build_state
from workbench.explore.rows import ExploreError
from workbench.explore.state import ExploreState

__all__ = ["ExploreView", "Explorer", "explore"]

STATIC = Path(__file__).parent / "static"


class ExploreView(anywidget.AnyWidget):
    """The drawing surface: image, per-model panels, colour bars, agreement strip, layer x head thumbnails."""

    _esm = STATIC / "explore.js"
    _css = STATIC / "explore.css"
    state = traitlets.Dict().tag(sync=True)  # the payload's JSON part
    image_shape = traitlets.List().tag(sync=True)  # (H, W[, 3]) of `image`
    image = traitlets.Bytes().tag(sync=True)  # uint8, sent when the image changes
    panels = traitlets.Bytes().tag(sync=True)  # float16 panel maps, concatenated in model order
    outlines = traitlets.Bytes().tag(sync=True)  # uint8 0/1 outline cells of the panels that have one
    strip = traitlets.Bytes().tag(sync=True)  # uint8 thumbnails (layer, head, gh, gw), 255 = no value
    strip_max = traitlets.Bytes().tag(sync=True)  # float16 (layer, head) maximum of each thumbnail
    click = traitlets.List().tag(sync=True)  # [fy, fx, serial] from the browser
    error = traitlets.Unicode("").tag(sync=True)  # a message shown in the view (bad input, no traceback)


class Explorer(widgets.VBox):
    """The explorer: controls above an :class:`ExploreView`, kept in step with :attr:`state`."""

    def __init__(self, state: ExploreState, call: str | None = None):
        self.state = state
        self.call = call  # the explore(...) call that rebuilds this explorer, when it has one
        ref = state.sources[state.reference]
        n_img, n_layers = len(state.images.ids), len(ref.layer_labels)
        self.image_slider = widgets.IntSlider(0, 0, max(0, n_img - 1), description="image", continuous_update=False)
        self.layer_slider = widgets.IntSlider(0, 0, max(0, n_layers - 1), description="layer", continuous_update=False)
        self.head_menu = widgets.Dropdown(options=[("mean over heads", "mean")] + [(f"head {h}", h) for h in range(state.max_heads)],
                                          value="mean", description="head")
        self.scale_toggle = widgets.ToggleButtons(options=[("shared scale", "shared"), ("per panel", "panel")],
                                                  value="shared", description="colour")
        self.strip_menu = widgets.Dropdown(options=list(state.sources), value=state.reference, description="thumbnails")
        self.token_buttons = [widgets.Button(description=f"{k.upper()} token", layout=widgets.Layout(width="auto"))
                              for k in ref.prefix_kinds]
        for kind, button in zip(ref.prefix_kinds, self.token_buttons):
            button.on_click(lambda _b, k=kind: self._apply(query=k))
        self.view = ExploreView()
        self.image_slider.observe(lambda c: self._apply(image=c["new"]), "value")
        self.layer_slider.observe(lambda c: self._apply(layer=c["new"]), "value")
        self.head_menu.observe(lambda c: self._apply(head=c["new"]), "value")
        self.scale_toggle.observe(lambda c: self._apply(scale=c["new"]), "value")
        self.strip_menu.observe(lambda c: self._apply(strip=c["new"]), "value")
        self.view.observe(self._on_click, "click")
        controls = widgets.VBox([widgets.HBox([self.image_slider, self.layer_slider, self.head_menu]),
                                 widgets.HBox([self.scale_toggle, self.strip_menu, *self.token_buttons])])
        super().__init__([controls, self.view])
        self._push(image=True)

    # ------------------------------------------------------------------ state -> view
    def _push(self, image: bool = False) -> None:
        state, buffers = self.state.payload()
        with self.view.hold_sync():
            if image:
                shape, data = self.state.image_bytes()
                self.view.image_shape, self.view.image = shape, data
            self.view.panels, self.view.outlines = buffers["panels"], buffers["outlines"]
            self.view.strip, self.view.strip_max = buffers["strip"], buffers["strip_max"]
            self.view.state = state
            self.view.error = ""

    def _apply(self, **changes) -> None:
        try:
            self.state.select(**changes)
            self._push(image="image" in changes)
        except ExploreError as err:
            self.view.error = str(err)

    def _on_click(self, change: dict) -> None:
        value = change["new"]
        if not value or len(value) < 2:
            return
        try:
            self.state.click(float(value[0]), float(value[1]))
            self._push()
        except ExploreError as err:
            self.view.error = str(err)

    # ------------------------------------------------------------------ outputs
    def snapshot(self):
        """The current view as a matplotlib figure (:func:`workbench.explore.snapshot.draw`)."""
        from workbench.explore.snapshot import draw

        return draw(self.state.view())

    def export(self, path: str | Path) -> dict[str, Path]:
        """Write the current view as ``path`` (PNG), its arrays (``.npz``) and ``.py`` code that redraws it.

        Returns:
            ``{"png": ..., "data": ..., "code": ...}``.
        """
        from workbench.explore.snapshot import export

        return export(self.state.view(), path, call=self.call, selection=self.state.selection)


def _call_text(teacher, students, images, stores, kwargs) -> str | None:
    """The explore(...) call as code, when every argument is a plain value (paths, run ids, timm names)."""
    def plain(v):
        return isinstance(v, (str, int, float, type(None))) or (isinstance(v, (tuple, list)) and all(plain(x) for x in v)) \
            or (isinstance(v, Mapping) and all(isinstance(k, str) and plain(x) for k, x in v.items()))

    args = dict(teacher=teacher, students=students, images=images, stores=stores, **kwargs)
    if not all(plain(v) for v in args.values()):
        return None
    return "explore(" + ", ".join(f"{k}={v!r}" for k, v in args.items() if v is not None) + ")"


def explore(teacher: Any = None, students: Mapping[str, Any] | None = None, images: str | None = None, *,
            stores: Mapping[str, Any] | None = None, checkpoints: Mapping[str, str] | None = None,
            teacher_name: str = "teacher", device: str = "cpu", img_size: int | None = None) -> Explorer:
    """Explore a teacher beside its students: click a patch, see that token's map in every layer and head.

    Args:
        teacher: run id / run directory, timm name (weights from ``checkpoints``), ``nn.Module`` or ``LoadedModel``.
        students: label -> model, the same kinds (FAR, Sparsifiner, Non-deep, SlimSwin students ...).
        images: image spec for live models (``demo:val[15::31]``, ``skimage:astronaut``, a folder).
        stores: label -> store path (``attention``, ``dependency``, ``sparse_attention`` or ``window_attention``
            analyses), or a pair (window-attention store, ``window_saliency`` store) for SlimSwin's pruned pairs;
            exploring stores alone imports no torch. The first model (teacher, else first store) is the reference.
        checkpoints: label -> local weights for a timm-name model.
        teacher_name: the teacher's label.
        device: ``cpu``, ``cuda`` or ``auto``.
        img_size: input resolution of timm-name models.

    Raises:
        ExploreError: bad input (no images, a store without the map the view needs, a student of another input
            size ...), with a one-line message in notebooks (no traceback).
    """
    state = build_state(teacher, students, images, stores=stores, checkpoints=checkpoints, teacher_name=teacher_name,
                        device=device, img_size=img_size)
    kwargs = {k: v for k, v in dict(checkpoints=checkpoints, img_size=img_size).items() if v}
    if teacher_name != "teacher":
        kwargs["teacher_name"] = teacher_name
    return Explorer(state, call=_call_text(teacher, students, images, stores, kwargs))
