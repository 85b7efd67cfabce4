"""The explorer's explanation mode: one method's map per model for the shown image (workbench.explore.explanations).

From stores (no torch in the state: the maps are the stores' own) and from live models (the maps equal
:func:`workbench.explain.attribute`'s), the shared colour scale, the reason for a method that does not apply, bad
selections refused, and the snapshot drawn.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from workbench.explore.explanations import ExplanationState, draw, explanation_state
from workbench.explore.rows import ExploreError
from workbench.plots.explain import UNITS


def _store(scale: float, seed: int, methods=("rollout", "saliency"), missing: dict | None = None) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    rel = scale * rng.random((len(methods), 3, 8, 8))
    return xr.Dataset({"relevance_pixel": (("explainer", "sample", "img_y", "img_x"), rel),
                       "image": (("sample", "img_y", "img_x"), rng.random((3, 8, 8)))},
                      coords={"explainer": list(methods), "sample": [5, 6, 7]}).assign_attrs(
        not_applicable=json.dumps(missing or {}))


def test_store_views_show_each_models_map_on_one_scale():
    t, s = _store(1.0, 0), _store(3.0, 1, methods=("saliency",), missing={"rollout": "an LSTM has no attention"})
    state = explanation_state(stores={"teacher": t, "FAR": s}, methods=["rollout", "saliency"])
    view = state.select(image=1, method="saliency").view()
    a, b = view["panels"]
    np.testing.assert_array_equal(a["map"], t["relevance_pixel"].sel(explainer="saliency").isel(sample=1).values)
    np.testing.assert_array_equal(b["map"], s["relevance_pixel"].sel(explainer="saliency").isel(sample=1).values)
    top = max(np.percentile(np.abs(a["map"]), 99), np.percentile(np.abs(b["map"]), 99))
    assert a["vmax"] == b["vmax"] == pytest.approx(top)  # shared: the larger of the two 99th percentiles
    panel = state.select(scale="panel").view()["panels"]
    assert panel[0]["vmax"] == pytest.approx(np.percentile(np.abs(a["map"]), 99))
    assert panel[0]["vmax"] < panel[1]["vmax"]
    rollout = state.select(method="rollout").view()["panels"]
    assert rollout[1]["map"] is None and "no attention" in rollout[1]["note"]
    assert view["image_id"] == "#6"
    fig = draw(state.view())
    assert [ax.get_title() for ax in fig.axes[:3]] == ["#6", "teacher", "FAR"]
    assert any(ax.get_ylabel() == UNITS["rollout"] for ax in fig.axes)  # the colour bar names what it shows
    with pytest.raises(ExploreError, match="unknown method"):
        state.select(method="nope")
    with pytest.raises(ExploreError, match="image must be"):
        state.select(image=3)
    with pytest.raises(ExploreError, match="at least one"):
        ExplanationState({}, state.images, ["rollout"])


def test_live_views_equal_attribute():
    import torch

    from workbench.analysis import examples
    from workbench.explain import attribute

    torch.manual_seed(0)
    teacher, far = examples.vit(), examples.far()
    state = explanation_state({"teacher": teacher, "FAR": far}, "demo:val[::500]", methods=["rollout", "saliency"])
    view = state.select(image=1, method="saliency").view()
    x = state.sources["teacher"].images
    ref = attribute(teacher, x[1:2], method="saliency")["relevance_pixel"].values[0]
    np.testing.assert_allclose(view["panels"][0]["map"], ref, rtol=1e-5, atol=1e-7)
    from workbench.explore.explanations import LiveMaps

    subset = LiveMaps(teacher, x, ["saliency"], ids=["demo:val[a]", "demo:val[b]"], positions=[1])  # the caller's
    assert subset.image_id(0) == "demo:val[b]"  # image 0 is the tensor's row 1: its id and its map
    np.testing.assert_allclose(subset.map(0, "saliency"), ref, rtol=1e-5, atol=1e-7)
    assert state.select(method="rollout").view()["panels"][1]["map"] is None  # FAR: no attention to roll out
    src = state.sources["teacher"]
    src.keep = 2  # the cache keeps the most recently shown maps only
    state.select(image=0, method="saliency").view()
    assert list(src.cache) == [(src.ids[1], "rollout"), (src.ids[0], "saliency")]


def test_the_widget_drives_the_state():
    import matplotlib

    from workbench.explore.explanations import explanation_mode

    matplotlib.use("Agg")
    state = explanation_state(stores={"teacher": _store(1.0, 0)}, methods=["rollout", "saliency"])
    w = explanation_mode(state)
    method, image, scale = w.children[0].children
    method.value, image.value, scale.value = "saliency", 2, "panel"
    assert state.selection == type(state.selection)(image=2, method="saliency", scale="panel")


def test_the_explorer_explanation_view_shows_attribute_maps_of_its_own_image():
    """The browser explorer's "explanations" view (Explorer.explanations, following the explorer's state): the maps it
    sends are :func:`workbench.explain.attribute`'s on the image the explorer shows — computed here from the image
    spec, independently — after an image change from code; one colour scale over the models; FAR's reason for
    rollout instead of a map; back to the attention maps on the same image."""
    import torch

    from workbench.analysis import examples
    from workbench.data import load_images
    from workbench.explain import attribute
    from workbench.explore import explore

    torch.manual_seed(0)
    teacher, far = examples.vit(), examples.far()
    spec = "demo:val[::500]"
    w = explore(teacher, {"FAR": far}, images=spec, explainers=["saliency", "rollout"])
    assert [o for o in w.method_menu.options] == ["saliency", "rollout"] and w.mode_menu.value is False
    assert w.method_menu.disabled and not w.layer_slider.disabled
    w.mode_menu.value = True  # the control -> the explanation state -> the view
    assert not w.method_menu.disabled and w.layer_slider.disabled and w.head_menu.disabled  # maps-only controls off
    w.state.select(image=1)  # the explorer's image: the one source of truth
    batch = load_images(spec, input_size=(1, 28, 28))
    want_id = f"demo:val[{int(batch.source.indices[1])}]"
    sent = w.view.state
    assert sent["mode"] == "explain" and sent["method"] == "saliency"
    assert sent["image_id"] == w.view.image_id == want_id
    np.testing.assert_array_equal(np.frombuffer(w.view.image, np.uint8).reshape(w.view.image_shape),
                                  np.clip(np.round(batch.display[1] * 255), 0, 255).astype(np.uint8))
    maps = np.frombuffer(w.view.panels, np.float32).reshape(2, 28, 28)
    for got, model in zip(maps, (teacher, far)):
        ref = attribute(model, batch.tensor[1:2], method="saliency")["relevance_pixel"].values[0]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-8)
    t, f = sent["panels"]
    top = max(np.percentile(np.abs(m), 99) for m in maps)
    assert t["vmax"] == f["vmax"] == pytest.approx(top) and t["units"] == UNITS["saliency"]
    assert (t["image_id"], f["image_id"]) == (want_id, want_id)
    w.method_menu.value = "rollout"
    t, f = w.view.state["panels"]
    assert t["grid"] == [7, 7] and f["grid"] == [0, 0] and f["vmax"] is None  # rollout: the patch grid travels
    assert "no attention" in f["note"]
    sent = np.frombuffer(w.view.panels, np.float32).reshape(7, 7)  # the teacher's map only, no NaN stand-in
    ref = attribute(teacher, batch.tensor[1:2], method="rollout")["relevance_pixel"].values[0]
    np.testing.assert_array_equal(np.kron(sent, np.ones((4, 4), np.float32)), ref)  # each patch over its 4 x 4 pixels
    w.explanations.select(shown=False)  # from code: the control follows, the view is the maps again
    assert w.mode_menu.value is False and "mode" not in w.view.state and w.view.state["image_id"] == want_id


def test_an_explorer_of_stores_says_there_is_no_model_to_explain():
    """An explorer built from attention stores only: its explanation view names the reason per panel (no map, no
    NaN), on the explorer's own image, and lists the default explainers without importing the explainers."""
    from types import SimpleNamespace

    from workbench.explore.explanations import DEFAULT_METHODS, follow_explorer
    from workbench.explore.state import Images, Selection

    images = Images(np.zeros((2, 4, 4)), ["demo:val[3]", "demo:val[8]"])
    fake = SimpleNamespace(sources={"teacher": object(), "FAR": object()}, images=images, selection=Selection(image=1))
    state = follow_explorer(fake)
    assert state.methods == list(DEFAULT_METHODS)
    sent, buffers = state.select(method="saliency").payload()
    assert sent["image_id"] == "demo:val[8]" and buffers["panels"] == b""
    assert [(p["label"], p["grid"], p["image_id"]) for p in sent["panels"]] == [
        ("teacher", [0, 0], "demo:val[8]"), ("FAR", [0, 0], "demo:val[8]")]
    assert all("no model to explain" in p["note"] for p in sent["panels"])


def test_coarsest_grid_is_lossless():
    from workbench.explore.explanations import coarsest

    patch = np.random.default_rng(0).random((7, 7)).astype(np.float32)
    m = np.kron(patch, np.ones((4, 4), np.float32))  # a patch map over its pixels
    np.testing.assert_array_equal(coarsest(m), patch)
    m[0, 1] += 1  # one pixel off its patch's value: nothing coarser holds it
    assert coarsest(m).shape == (28, 28)
    assert coarsest(np.full((6, 4), 2.0)).shape == (3, 2)  # the largest block dividing both sides: 2 x 2


def test_explorer_reads_a_models_explanations_from_its_store_by_image_id():
    """``explore(..., explain_stores={"FAR": store})``: FAR's maps come from its ``workbench explain`` store (stamped:
    matched by image id, here holding only the explorer's image 1), the teacher's are computed; an image the store
    lacks and an explainer that does not apply get their reasons; a store for no model here is refused."""
    import torch

    from workbench.analysis import examples
    from workbench.data import load_images
    from workbench.explain import attribute
    from workbench.explore import explore
    from workbench.provenance import DataSource, ModelSource, stamp

    torch.manual_seed(0)
    teacher, far = examples.vit(), examples.far()
    spec = "demo:val[::500]"
    batch = load_images(spec, input_size=(1, 28, 28))
    one = int(batch.source.indices[1])
    store = stamp(attribute(far, batch.tensor[1:2], method=["saliency", "rollout"]),
                  ModelSource("far", "module", None, None), DataSource("demo:val", [one]))
    w = explore(teacher, {"FAR": far}, images=spec, explainers=["saliency", "rollout"], explain_stores={"FAR": store})
    w.explanations.select(shown=True, method="saliency")
    w.state.select(image=1)
    t, f = w.explanations.view()["panels"]
    assert f["image_id"] == t["image_id"] == f"demo:val[{one}]"
    np.testing.assert_array_equal(f["map"], store["relevance_pixel"].sel(explainer="saliency").values[0])
    assert "no attention" in w.explanations.select(method="rollout").view()["panels"][1]["note"]
    w.state.select(image=0)
    assert "holds no map of demo:val[" in w.explanations.view()["panels"][1]["note"]
    with pytest.raises(ExploreError, match="no model here"):
        explore(teacher, {"FAR": far}, images=spec, explain_stores={"Swin": store})
