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
    image_id = traitlets.Unicode("").tag(sync=True)  # "dataset[index]" of `image`: panels of another id are not drawn
    panels = traitlets.Bytes().tag(sync=True)  # float16 panel maps, concatenated in model order
    outlines = traitlets.Bytes().tag(sync=True)  # uint8 0/1 outline cells of the panels that have one
    strip = traitlets.Bytes().tag(sync=True)  # uint8 thumbnails (layer, head, gh, gw), 255 = no value
    strip_max = traitlets.Bytes().tag(sync=True)  # float16 (layer, head) maximum of each thumbnail
    click = traitlets.List().tag(sync=True)  # [fy, fx, serial] from the browser
    pick = traitlets.List().tag(sync=True)  # [layer, head, serial] from a clicked thumbnail (strip model's layer)
    error = traitlets.Unicode("").tag(sync=True)  # a message shown in the view (bad input, no traceback)
    latents = traitlets.Dict().tag(sync=True)  # the latent view's JSON part (workbench.explore.latents), {} = none
    latent_maps = traitlets.Bytes().tag(sync=True)  # float16 maps of the picked latent (code, teacher, student)
    latent_pick = traitlets.List().tag(sync=True)  # [latent, serial] from a clicked row of the latent list


#: the colour-range choices for the query's own token (ExploreState's ``exclude_query``)
SELF_SCALE = {"auto (out for saliency)": None, "left out of scale": True, "in the scale": False}


class Explorer(widgets.VBox):
    """The explorer: controls above an :class:`ExploreView`, all kept in step with :attr:`state`.

    The state is the one source of truth: a change from code (``w.state.select(...)``) or from a control goes to
    the state, whose observer sets every control and sends the view (with the image when it changed). The "view"
    menu's "explanations" shows :attr:`explanations` instead (:func:`~workbench.explore.explanations.follow_explorer`:
    one explainer's map per model, on this state's image and colour scale).
    """

    def __init__(self, state: ExploreState, call: str | None = None, explainers: list[str] | None = None,
                 explain_stores: Mapping[str, Any] | None = None, latents=None):
        from workbench.explore.explanations import follow_explorer

        self.state = state
        self.latents = latents  # a workbench.explore.latents.LatentView, or None
        self.call = call  # the explore(...) call that rebuilds this explorer, when it has one
        self.explanations = follow_explorer(state, explainers, explain_stores)  # the "explanations" view: same image
        ref = state.sources[state.reference]
        n_img, n_layers = len(state.images.ids), len(ref.layer_labels)
        wide = dict(layout=widgets.Layout(width="290px"), style={"description_width": "80px"})
        self.image_slider = widgets.IntSlider(0, 0, max(0, n_img - 1), description="image", continuous_update=False, **wide)
        self.layer_slider = widgets.IntSlider(0, 0, max(0, n_layers - 1), description="layer", continuous_update=False, **wide)
        self.head_menu = widgets.Dropdown(options=self._head_options(), value="mean", description="head", **wide)
        self.scale_toggle = widgets.Dropdown(options=[("shared per unit", "shared"), ("per panel", "panel")],
                                             value="shared", description="colour scale", **wide)
        self.self_menu = widgets.Dropdown(options=list(SELF_SCALE), value=next(iter(SELF_SCALE)), description="own token", **wide)
        self.diff_toggle = widgets.Dropdown(options=[("maps", False), ("student − teacher", True)], value=False,
                                            description="panels", **wide)
        self.direction_toggle = widgets.Dropdown(options=[("query (its row)", "query"), ("key (reverse view)", "key")],
                                                 value="query", description="clicked as", **wide)
        self.strip_menu = widgets.Dropdown(options=list(state.sources), value=state.reference, description="thumbnails", **wide)
        self.token_buttons = [widgets.Button(description=f"{k.upper()} token", layout=widgets.Layout(width="auto"))
                              for k in ref.prefix_kinds]
        self.export_button = widgets.Button(description="export PNG", icon="download", layout=widgets.Layout(width="auto"))
        self.export_path = widgets.Text("explore_view.png", layout=widgets.Layout(width="220px"))
        self.export_note = widgets.HTML("")
        self.mode_menu = widgets.Dropdown(options=[("maps (click a patch)", False), ("explanations", True)],
                                          value=False, description="view", **wide)
        self.method_menu = widgets.Dropdown(options=self.explanations.methods, description="explainer", **wide)
        for w, cls in ((self.image_slider, "image"), (self.layer_slider, "layer"), (self.head_menu, "head"),
                       (self.scale_toggle, "scale"), (self.self_menu, "self"), (self.strip_menu, "strip"),
                       (self.diff_toggle, "difference"), (self.direction_toggle, "direction"),
                       (self.mode_menu, "mode"), (self.method_menu, "method")):
            w.add_class(f"wbx-control-{cls}")
        for kind, button in zip(ref.prefix_kinds, self.token_buttons):
            button.on_click(lambda _b, k=kind: self._apply(query=k))
        self.export_button.on_click(lambda _b: self._export_clicked())
        self.view = ExploreView()
        self._syncing = False
        self._sent_image: str | None = None
        for w, key, value in ((self.image_slider, "image", None), (self.layer_slider, "layer", None),
                              (self.head_menu, "head", None), (self.scale_toggle, "scale", None),
                              (self.self_menu, "exclude_query", SELF_SCALE), (self.strip_menu, "strip", None),
                              (self.diff_toggle, "difference", None), (self.direction_toggle, "direction", None)):
            w.observe(lambda c, k=key, m=value: self._from_control(k, c["new"] if m is None else m[c["new"]]), "value")
        self.mode_menu.observe(lambda c: self._from_control("explain", dict(shown=c["new"])), "value")
        self.method_menu.observe(lambda c: self._from_control("explain", dict(method=c["new"])), "value")
        self.view.observe(self._on_click, "click")
        self.view.observe(self._on_pick, "pick")
        self.view.observe(self._on_latent_pick, "latent_pick")
        wrap = widgets.Layout(flex_flow="row wrap")  # narrow outputs put controls on more rows, never cut them
        controls = widgets.VBox([widgets.HBox([self.mode_menu, self.method_menu], layout=wrap),
                                 widgets.HBox([self.image_slider, self.layer_slider, self.head_menu], layout=wrap),
                                 widgets.HBox([self.scale_toggle, self.self_menu, self.diff_toggle], layout=wrap),
                                 widgets.HBox([self.direction_toggle, self.strip_menu, *self.token_buttons, self.export_button,
                                               self.export_path, self.export_note], layout=wrap)])
        super().__init__([controls, self.view])
        self._unobserve = state.observe(lambda _s, changed: self._follow(changed))
        self.explanations.observe(lambda _s, changed: self._follow(changed))
        self._follow(set())

    # ------------------------------------------------------------------ state -> controls and view
    def _head_options(self) -> list:
        return [("mean over heads", "mean")] + [(f"head {h}", h) for h in range(self.state.heads_at())]

    def _sync_controls(self) -> None:
        """Every control shows the state's selection (without sending it back)."""
        sel = self.state.selection
        self._syncing = True
        try:
            self.image_slider.value = sel.image
            self.layer_slider.value = sel.layer
            options = self._head_options()
            if list(self.head_menu.options) != options:
                self.head_menu.options = options
            self.head_menu.value = "mean" if sel.head is None else sel.head
            self.scale_toggle.value = sel.scale
            self.self_menu.value = next(k for k, v in SELF_SCALE.items() if v is sel.exclude_query)
            self.strip_menu.value = sel.strip
            self.diff_toggle.value = sel.difference
            self.direction_toggle.value = sel.direction
            shown = self.mode_menu.value = self.explanations.selection.shown
            self.method_menu.value = self.explanations.selection.method
            self.method_menu.disabled = not shown
            for w in (self.layer_slider, self.head_menu, self.self_menu, self.diff_toggle, self.direction_toggle,
                      self.strip_menu, *self.token_buttons):  # the attention maps' own controls
                w.disabled = shown
        finally:
            self._syncing = False

    def _follow(self, changed: set) -> None:
        self._sync_controls()
        try:
            self._push()
        except ExploreError as err:
            self.view.error = str(err)

    def _push(self) -> None:
        explain = self.explanations.selection.shown  # the explanation view: its payload, the same image
        state, buffers = self.explanations.payload() if explain else self.state.payload()
        with self.view.hold_sync():
            if self._sent_image != self.state.image_id:  # the pixels follow the state, whoever changed the image
                shape, data = self.state.image_bytes()
                self.view.image_shape, self.view.image, self.view.image_id = shape, data, self.state.image_id
                self._sent_image = self.state.image_id
            for key, data in buffers.items():  # panels, outlines, strip, strip_max (explanations: panels)
                setattr(self.view, key, data)
            self.view.state = state
            if self.latents is not None:  # the latent view follows the same selection (image, clicked token)
                sel = self.state.selection
                self.view.latents, self.view.latent_maps = self.latents.payload(sel.image, sel.query)
            self.view.error = ""

    # ------------------------------------------------------------------ controls and clicks -> state
    def _from_control(self, key: str, value) -> None:
        if not self._syncing:
            self._apply(**{key: value})

    def _apply(self, explain: dict | None = None, **changes) -> None:
        try:
            if explain is not None:
                self.explanations.select(**explain)
            else:
                self.state.select(**changes)
        except ExploreError as err:
            self._sync_controls()  # the control goes back to what the state holds
            self.view.error = str(err)

    def _on_click(self, change: dict) -> None:
        value = change["new"]
        if not value or len(value) < 2:
            return
        try:
            self.state.click(float(value[0]), float(value[1]))
        except ExploreError as err:
            self.view.error = str(err)

    def _on_pick(self, change: dict) -> None:
        """A clicked thumbnail: its layer (the strip model's, mapped back to the reference's depth) and head."""
        value = change["new"]
        if not value or len(value) < 2:
            return
        self._apply(layer=self.state.reference_layer(self.state.selection.strip, int(value[0])), head=int(value[1]))

    def _on_latent_pick(self, change: dict) -> None:
        """A clicked row of the latent list: show that latent's maps."""
        value = change["new"]
        if not value or self.latents is None:
            return
        try:
            self.latents.pick(int(value[0]))
            self._push()
        except ExploreError as err:
            self.view.error = str(err)

    def _export_clicked(self) -> None:
        try:
            out = self.export(self.export_path.value or "explore_view.png")
        except (OSError, ValueError) as err:
            self.export_note.value = f"<span style='color:#a00'>export failed: {err}</span>"
            return
        self.export_note.value = f"wrote {out['png']}" + (" (+ .npz, .py)" if "data" in out else "")

    # ------------------------------------------------------------------ outputs
    def snapshot(self):
        """The current view as a matplotlib figure (:func:`workbench.explore.snapshot.draw`)."""
        if self.explanations.selection.shown:
            from workbench.explore.explanations import draw as draw_explanations

            return draw_explanations(self.explanations.view())
        from workbench.explore.snapshot import draw

        return draw(self.state.view())

    def export(self, path: str | Path) -> dict[str, Path]:
        """Write the current view as ``path`` (PNG), its arrays (``.npz``) and ``.py`` code that redraws it.

        Returns:
            ``{"png": ..., "data": ..., "code": ...}`` (the explanation view: ``{"png": ...}``, its figure).
        """
        if self.explanations.selection.shown:
            import matplotlib.pyplot as plt

            fig, path = self.snapshot(), Path(path)
            fig.savefig(path, dpi=150)
            plt.close(fig)
            return {"png": path}
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
            teacher_name: str = "teacher", device: str = "cpu", img_size: int | None = None,
            explainers: list[str] | None = None, explain_stores: Mapping[str, Any] | None = None,
            latents: Mapping[str, str] | None = None) -> Explorer:
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
        explainers: the explainers of the "explanations" view (default: every registered one,
            :data:`workbench.explore.explanations.DEFAULT_METHODS`); each is computed when first shown.
        explain_stores: label -> ``workbench explain`` store: that model's explanations read from it (matched to
            the images by id; no torch for a model given as a store), not computed.
        latents: ``{student label: diff store}`` of one ``workbench features`` crosscoder of the teacher and that
            student (its checkpoint beside the store): a click also lists the token's active latents, and a picked
            latent shows its activation over the image (:mod:`workbench.explore.latents`). Live models only.

    Raises:
        ExploreError: bad input (no images, a store without the map the view needs, a student of another input
            size ...), with a one-line message in notebooks (no traceback).

    Example:
        Two tiny random-weight ViTs on one photo (in a notebook, the returned widget shows itself):

        >>> from workbench import explore
        >>> from workbench.analysis import examples
        >>> w = explore(examples.vit(), {"student": examples.vit()}, "skimage:astronaut")
        >>> view = w.state.view()
        >>> [p["label"] for p in view["panels"]], view["panels"][0]["map"].shape
        (['teacher', 'student'], (7, 7))
    """
    state = build_state(teacher, students, images, stores=stores, checkpoints=checkpoints, teacher_name=teacher_name,
                        device=device, img_size=img_size)
    kwargs = {k: v for k, v in dict(checkpoints=checkpoints, img_size=img_size, latents=latents).items() if v}
    if teacher_name != "teacher":
        kwargs["teacher_name"] = teacher_name
    if explainers is not None:
        kwargs["explainers"] = list(explainers)
    if explain_stores:
        kwargs["explain_stores"] = dict(explain_stores)
    view = _latent_view(state, teacher_name, latents) if latents else None
    return Explorer(state, call=_call_text(teacher, students, images, stores, kwargs), explainers=explainers,
                    explain_stores=explain_stores, latents=view)


def _latent_view(state: ExploreState, teacher_name: str, latents: Mapping[str, str]):
    """The :class:`~workbench.explore.latents.LatentView` of ``{student label: store}`` on the state's live models."""
    from workbench.explore.latents import LatentView

    if len(latents) != 1:
        raise ExploreError(f"latents= takes one {{student label: store}}, got {len(latents)}: explore one pair's "
                           "crosscoder at a time")
    (label, path), = latents.items()
    live = {k: s for k, s in state.sources.items() if hasattr(s, "model")}
    if teacher_name not in live or label not in live:
        raise ExploreError(f"latents for {label!r}: the latent view needs the live teacher and student (models, not "
                           f"stores); live models here: {list(live) or 'none'}")
    models = {teacher_name: live[teacher_name].model, label: live[label].model}
    return LatentView.from_store(path, models, live[teacher_name].images, state.images.ids)
