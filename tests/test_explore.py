"""workbench.explore: the state object against independent computations, bad input, the widget, stores without torch.

Tiny random-weight demo models (vit_demo 7 x 7 patches, swin_demo 16 x 16 tokens): no training, no downloads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
SPEC = "demo:val[::400]"  # 3 digits of different classes


@pytest.fixture(scope="module")
def vit():
    from workbench.models import create_model

    torch.manual_seed(1)
    return create_model("vit_demo").eval()


@pytest.fixture(scope="module")
def far_student():
    import methods.far as far
    from workbench.models import create_model

    torch.manual_seed(2)
    return far.replace_attention(create_model("vit_demo")).eval()


@pytest.fixture(scope="module")
def sparse_student():
    import methods.sparsifiner as sp
    from workbench.models import create_model

    torch.manual_seed(3)
    model = sp.replace_attention(create_model("vit_demo")).eval()
    for mod in model.modules():  # a spread of predictor coefficients (as a trained one has): with the paper's rule of
        if isinstance(mod, sp.SparsifinerAttention):  # discarding zero scores an untrained predictor keeps no key
            torch.nn.init.normal_(mod.predictor.w_down, std=1.0)
            torch.nn.init.normal_(mod.predictor.w_up, std=0.05)
    return model


@pytest.fixture(scope="module")
def slimswin():
    """A gated demo Swin with about a third of its prunable (window, head) pairs pruned at random."""
    import methods.slimswin as ss
    from workbench.models import create_model

    torch.manual_seed(4)
    model = ss.add_gates(create_model("swin_demo")).eval()
    gen = torch.Generator().manual_seed(5)
    masks = [m if i >= 4 else torch.rand(m.shape, generator=gen) > 0.35 for i, m in enumerate(ss.get_masks(model))]
    ss.set_mask(model, masks)
    return model


@pytest.fixture(scope="module")
def batch():
    from workbench.data import load_images

    return load_images(SPEC, input_size=(1, 28, 28))


@pytest.fixture(scope="module")
def state(vit, far_student, sparse_student):
    from workbench.explore import build_state

    return build_state(vit, {"FAR": far_student, "Sparsifiner": sparse_student}, SPEC)


def _token(y, x, gw=7, prefix=1):
    return prefix + y * gw + x


# ---------------------------------------------------------------------------------------------- rows
@pytest.mark.parametrize("query,token", [("cls", 0), ((2, 5), _token(2, 5)), ((6, 0), _token(6, 0))])
def test_attention_rows_equal_the_extractor_and_softmax_qk(state, vit, batch, query, token):
    from methods.hooks import run_with_cache
    from workbench.analysis import get_extractor

    ds = get_extractor("attention")(vit, batch.tensor)
    _, cache = run_with_cache(vit, batch.tensor, names="blocks.*.hook_mixer_in")
    for image in range(len(batch.labels)):
        rows = state.rows("teacher", image=image, query=state.query_token(query))
        assert rows.image_id == f"demo:val[{batch.source.indices[image]}]"
        np.testing.assert_allclose(rows.tokens, ds["attention"].values[image, :, :, token, :], rtol=0, atol=1e-7)
        for layer, block in enumerate(vit.blocks):  # softmax(q kᵀ / √d) from the model's own q and k, float64
            attn = block.attn
            x = cache[f"blocks.{layer}.hook_mixer_in"][image:image + 1].double()
            qkv = torch.nn.functional.linear(x, attn.qkv.weight.double(), attn.qkv.bias.double())
            q, k, _ = qkv.reshape(1, x.shape[1], 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)  # (1, heads, T, d)
            ref = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1)[0, :, token]  # (heads, T)
            np.testing.assert_allclose(rows.tokens[layer], ref.detach().numpy(), rtol=1e-4, atol=1e-6)
        # the maps are the patch keys of the rows, placed on the grid; prefix keys apart
        np.testing.assert_array_equal(rows.maps.reshape(*rows.maps.shape[:2], -1), rows.tokens[..., 1:])
        np.testing.assert_array_equal(rows.prefix[..., 0], rows.tokens[..., 0])


@pytest.mark.parametrize("mode", ["lazy", "image", "query"])
def test_far_rows_equal_the_dependency_extractor(vit, far_student, batch, mode):
    from workbench.analysis import get_extractor
    from workbench.explore.build import build_state
    from workbench.explore.live import LiveModel

    st = build_state(vit, {"FAR": far_student}, SPEC)
    st.sources["FAR"] = src = LiveModel("FAR", far_student, batch.tensor, st.images.ids, dependency=mode)
    ref = get_extractor("dependency")(far_student, batch.tensor, queries=[0, _token(3, 1)])
    for image in (0, 2):
        for i, query in enumerate(["cls", (3, 1)]):
            rows = st.rows("FAR", image=image, query=st.query_token(query))
            want = ref["dependency"].values[image, :, :, i, :]
            np.testing.assert_allclose(rows.tokens, want, rtol=1e-4, atol=1e-6 * float(np.abs(want).max()))
    if mode == "lazy":  # every query of both images is computed in the background: later rows are sliced from it
        assert not src._jobs  # not before the view that asked is answered (ExploreState.view starts it)
        src.start_background()
        assert src.wait(120)
        assert set(src._readers) == {st.images.ids[0], st.images.ids[2]}
        for image in (0, 2):
            full = src.rows(st.images.ids[image], st.query_token((3, 1)))
            want = ref["dependency"].values[image, :, :, 1, :]
            np.testing.assert_allclose(full.tokens, want, rtol=1e-4, atol=1e-6 * float(np.abs(want).max()))


@pytest.mark.parametrize("shrunk", [False, True])
def test_far_query_rows_equal_autograd_jacobian(far_student, batch, shrunk):
    """The clicked query's rows (one adjoint recurrence for every layer and head) against
    torch.autograd.functional.jacobian of the substitute's own forward_heads, per block and head."""
    from methods.far.hoyer import kept_masks, shrink
    from methods.hooks import run_with_cache
    from workbench.explore.lazy import query_rows

    model = far_student
    if shrunk:  # heads and directions of different unit counts (one LSTM with none): several adjoint groups
        gen = torch.Generator().manual_seed(9)
        keep = kept_masks(model) & (torch.rand(kept_masks(model).shape, generator=gen) > 0.4)
        keep[0, 0, 1] = False
        model = shrink(model, keep).eval()
    x = batch.tensor[1:2]
    _, cache = run_with_cache(model, x, names="blocks.*.hook_mixer_in")
    inputs = [cache[f"blocks.{l}.hook_mixer_in"] for l in range(len(model.blocks))]
    t_len = inputs[0].shape[1]
    for q in (0, _token(2, 3), t_len - 1):
        rows = query_rows(model.blocks, inputs, q)  # (layer, head, T)
        for l, block in enumerate(model.blocks):
            u = inputs[l].detach().double()
            attn = block.attn.double()
            jac = torch.autograd.functional.jacobian(lambda v: attn.forward_heads(v)[0, q].sum(-1), u)  # (N, 1, T, D)
            block.attn.float()
            want = jac[:, 0].norm(dim=-1).numpy()  # (N, T)
            np.testing.assert_allclose(rows[l], want, rtol=1e-3, atol=1e-5 * float(np.abs(want).max()))


def test_sparsifiner_outline_is_the_kept_keys(state, sparse_student, batch):
    from workbench.analysis import get_extractor

    ds = get_extractor("sparse_attention")(sparse_student, batch.tensor)
    rows = state.rows("Sparsifiner", image=1, query=state.query_token((4, 2)))
    mask = ds["mask"].values[1, :, :, _token(4, 2), 1:].reshape(rows.outline.shape)
    np.testing.assert_array_equal(rows.outline, mask)
    np.testing.assert_allclose(rows.tokens, ds["attention"].values[1, :, :, _token(4, 2)], atol=1e-7)
    assert (~mask).any() and mask.any()


def test_a_live_sparsifiner_first_click_skips_the_mass_summaries(vit, sparse_student, batch, monkeypatch):
    """The explorer shows Sparsifiner's maps and kept keys, not its masks' mass-agreement summaries (an argsort of every
    row: ~5 s of a 577-token first click): a live model leaves them out unless asked (``agreement=True``), and what it
    shows is the same either way."""
    import workbench.analysis.sparsifiner as spa
    from workbench.explore import build_state
    from workbench.explore.live import LiveModel

    calls = []
    real = spa.mass_agreement
    monkeypatch.setattr(spa, "mass_agreement", lambda *a: calls.append(1) or real(*a))
    st = build_state(vit, {"Sparsifiner": sparse_student}, SPEC)
    skipped = st.rows("Sparsifiner", image=1, query=st.query_token((4, 2)))
    assert not calls and "own_mass" not in st.sources["Sparsifiner"].reader(st.images.ids[1]).ds
    st.sources["Sparsifiner"] = src = LiveModel("Sparsifiner", sparse_student, batch.tensor, st.images.ids,
                                                agreement=True)
    full = st.rows("Sparsifiner", image=1, query=st.query_token((4, 2)))
    assert calls and "own_mass" in src.reader(st.images.ids[1]).ds  # computed when asked for
    np.testing.assert_array_equal(skipped.tokens, full.tokens)
    np.testing.assert_array_equal(skipped.outline, full.outline)
    ds = spa.extract_sparse_attention(sparse_student, batch.tensor, agreement=False)
    assert not {"own_mass", "own_oracle_mass", "own_overlap", "chance_mass"} & set(ds.data_vars)
    assert json.loads(ds.attrs["config"])["agreement"] is False  # a store says what it left out
    assert "agreement" not in json.loads(spa.extract_sparse_attention(sparse_student, batch.tensor).attrs["config"])


def test_slimswin_greyed_heads_are_exactly_the_pruned_pairs(slimswin):
    import methods.slimswin as ss
    from workbench.explore import build_state
    from workbench.models import create_model

    st = build_state(create_model("swin_demo").eval(), {"SlimSwin": slimswin}, "demo:val[:1]")
    masks = [m.numpy() for m in ss.get_masks(slimswin)]
    windows = [a.numpy() for a in ss.token_window_assignment(slimswin)]
    geo = ss.swin_layers(slimswin)
    assert sum((~m).sum() for m in masks) > 10  # something is pruned
    for y in range(0, 16, 3):
        for x in range(0, 16, 5):
            rows = st.rows("SlimSwin", query=st.query_token((y, x)))  # the teacher's grid is 16 x 16 too
            teacher = st.rows("teacher", query=st.query_token((y, x)))
            assert not teacher.pruned.any() if teacher.pruned is not None else True
            for layer, g in enumerate(geo):
                h, w = g.resolution
                win = windows[layer][y * h // 16, x * w // 16]
                np.testing.assert_array_equal(rows.pruned[layer, :g.num_heads], ~masks[layer][win])
                # the window is outlined: exactly the tokens of that window (on the stage map, repeated to 16 x 16)
                inside = (windows[layer] == win).repeat(16 // h, 0).repeat(16 // w, 1)
                np.testing.assert_array_equal(rows.outline[layer, 0], inside)
                assert np.isnan(rows.maps[layer, 0][~inside]).all() and np.isfinite(rows.maps[layer, 0][inside]).all()
    agree = st.agreement()["SlimSwin"]  # over the query's window's keys
    assert np.isfinite(agree["js"]).all() and (agree["js"] > 0).all()


def test_nondeep_per_branch_rows_equal_the_attention_extractor(vit, batch):
    from workbench.analysis import get_extractor
    from workbench.explore import build_state
    from workbench.models import create_model

    torch.manual_seed(8)
    branched = create_model("nondeep_branched", base="vit_demo").eval()  # 3 layers x 2 parallel branches
    st = build_state(vit, {"Non-deep": branched}, SPEC)
    assert st.sources["Non-deep"].layer_labels == ["0·b0", "0·b1", "1·b0", "1·b1", "2·b0", "2·b1"]
    ref = get_extractor("attention")(branched, batch.tensor)["attention"].values  # (sample, layer, branch, head, q, k)
    rows = st.rows("Non-deep", image=1, query=st.query_token((5, 2)))
    np.testing.assert_allclose(rows.tokens, ref[1, :, :, :, _token(5, 2)].reshape(6, *ref.shape[3:4], -1), atol=1e-7)
    st.select(layer=5)  # the teacher's last layer is the student's last (layer 2, branch 1) by relative depth
    assert st.model_layer("Non-deep") == 5


def test_attentionlite_stage_maps_equal_the_at_maps_extractor(batch):
    from workbench.analysis import get_extractor
    from workbench.explore import build_state
    from workbench.models import create_model

    torch.manual_seed(6)
    cnn, sa = create_model("cnn_demo").eval(), create_model("sa_resnet_demo").eval()
    st = build_state(cnn, {"AttentionLite": sa}, SPEC)
    for label, model in (("teacher", cnn), ("AttentionLite", sa)):
        ref = get_extractor("at_maps")(model, batch.tensor)["at_map"].values  # (sample, stage, y, x)
        for query in ((0, 0), (20, 9)):
            rows = st.rows(label, image=2, query=st.query_token(query))
            np.testing.assert_allclose(rows.maps[:, 0], ref[2], atol=1e-7)
    agree = st.agreement()["AttentionLite"]
    assert np.isfinite(agree["js"]).all() and (agree["js"] > 0).all()


def test_another_patch_grid_maps_the_clicked_position_to_its_own_token(vit, batch):
    from workbench.analysis import get_extractor
    from workbench.explore import build_state
    from workbench.models import create_model

    torch.manual_seed(7)
    coarse = create_model("vit_demo", patch_size=7).eval()  # 4 x 4 patches of the same 28 x 28 input
    st = build_state(vit, {"coarse": coarse}, SPEC)
    ref = get_extractor("attention")(coarse, batch.tensor)["attention"].values
    # the centre of the teacher's cell (y, x) falls in the coarse cell: e.g. row 3 -> 3.5 / 7 * 4 = 2.0 -> row 2
    for (y, x), (cy, cx) in {(0, 0): (0, 0), (6, 6): (3, 3), (3, 1): (2, 0), (4, 5): (2, 3)}.items():
        rows = st.rows("coarse", image=0, query=st.query_token((y, x)))  # the teacher's 7 x 7 cell (y, x)
        assert rows.query_cell[0].tolist() == [cy, cx]
        np.testing.assert_allclose(rows.tokens, ref[0, :, :, _token(cy, cx, gw=4)], atol=1e-7)
    assert np.isnan(st.agreement()["coarse"]["js"]).all()  # other keys: no agreement, not a wrong one


def test_agreement_matches_workbench_compare_definitions():
    from workbench.analysis.token_agreement import normalise_rows, row_js, row_topk_overlap
    from workbench.explore import state as st

    rng = np.random.default_rng(0)
    p = rng.random((5, 50)) * (rng.random((5, 50)) > 0.5)
    q = np.round(rng.random((5, 50)), 1)  # ties
    pn, qn = st.normalise_rows(p), st.normalise_rows(q)
    np.testing.assert_allclose(pn, normalise_rows(torch.from_numpy(p)).numpy())
    np.testing.assert_allclose(st.row_js(pn, qn), row_js(torch.from_numpy(pn), torch.from_numpy(qn)).numpy(), atol=1e-12)
    for k in (1, 5, 17):
        np.testing.assert_array_equal(st.row_topk_overlap(pn, qn, k),
                                      row_topk_overlap(torch.from_numpy(pn), torch.from_numpy(qn), k).numpy())


def test_payload_holds_the_current_view_only(state):
    state.select(query=(1, 1), head=None, layer=2)
    meta, buffers = state.payload()
    assert len(buffers["panels"]) == 3 * 49 * 2  # three float16 7 x 7 maps
    assert len(buffers["outlines"]) == 49  # Sparsifiner's kept keys
    assert len(buffers["strip"]) == 6 * 4 * 49  # uint8 thumbnails of one model
    assert meta["query_label"] == "patch (1, 1)" and [p["label"] for p in meta["panels"]] == ["teacher", "FAR", "Sparsifiner"]
    units = {p["label"]: p["units"] for p in meta["panels"]}
    assert units["teacher"] == "probability" and "gradient" in units["FAR"]
    teacher, far = meta["panels"][0], meta["panels"][1]
    assert teacher["vmax"] == meta["panels"][2]["vmax"]  # shared scale per unit
    panel0 = np.frombuffer(buffers["panels"], np.float16)[:49].astype(np.float32)
    rows = state.rows("teacher")
    np.testing.assert_allclose(panel0, rows.maps[2].mean(0).ravel(), rtol=1e-3)
    far_map = state.rows("FAR").maps[2].mean(0)  # (7, 7)
    others = np.delete(far_map.ravel(), 1 * 7 + 1)  # every key but the query's own (1, 1)
    # saliency maps leave the query's own token out of the colour range by default; it is reported beside
    assert far["exclude_query"] and not teacher["exclude_query"]
    assert far["vmax"] == pytest.approx(float(others.max()), rel=1e-6)
    assert far["self_value"] == pytest.approx(float(far_map[1, 1]), rel=1e-6)
    assert all(p["image_id"] == meta["image_id"] == state.image_id for p in meta["panels"])
    state.select(exclude_query=False)
    meta, _ = state.payload()
    assert meta["panels"][1]["vmax"] == pytest.approx(float(far_map.max()), rel=1e-6)
    state.select(exclude_query=True)  # now the teacher's own token leaves its range too
    meta, _ = state.payload()
    att = np.delete(rows.maps[2].mean(0).ravel(), 8)
    spa = np.delete(state.rows("Sparsifiner").maps[2].mean(0).ravel(), 8)
    assert meta["panels"][0]["vmax"] == pytest.approx(float(max(att.max(), spa.max())), rel=1e-6)
    state.select(exclude_query=None)


# ------------------------------------------------------------------------------------------ bad input
def _stamped(ds, batch, name="vit_demo"):
    from workbench.provenance import ModelSource, stamp

    ds = stamp(ds, ModelSource(name, "teacher", None, None), batch.source)
    ds["image"] = (("sample", "img_y", "img_x"), batch.display)
    return ds


@pytest.fixture(scope="module")
def stores(tmp_path_factory, vit, far_student, batch):
    from workbench.analysis import get_extractor
    from workbench.store import save

    root = tmp_path_factory.mktemp("explore_stores")
    att = save(_stamped(get_extractor("attention")(vit, batch.tensor), batch), root / "vit.nc")
    dep = save(_stamped(get_extractor("dependency")(far_student, batch.tensor), batch, "far"), root / "far.nc")
    return {"teacher": att, "FAR": dep}


def test_stores_serve_the_same_rows_as_live_models(stores, state):
    from workbench.explore import build_state

    st = build_state(stores=stores)
    assert st.images.ids == state.images.ids
    for query in ("cls", (5, 3)):
        for label in ("teacher", "FAR"):
            a = st.rows(label, image=1, query=st.query_token(query))
            b = state.rows(label, image=1, query=state.query_token(query))
            np.testing.assert_allclose(a.tokens, b.tokens, rtol=1e-5, atol=1e-7)


def test_exploring_stores_imports_no_torch(stores, tmp_path):
    code = f"""
import sys
from workbench.explore import explore
w = explore(stores={json.dumps({k: str(v) for k, v in stores.items()})})
w.view.click = [0.6, 0.3, 1]
assert w.view.state["query_label"] == "patch (4, 2)", w.view.state["query_label"]
w.export({str(tmp_path / 'view.png')!r})
assert "torch" not in sys.modules, "exploring stores imported torch"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"})
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
    assert (tmp_path / "view.png").stat().st_size > 10_000


def test_a_map_is_never_drawn_over_another_image(stores, vit, batch):
    from workbench.explore import ExploreError, build_state
    from workbench.explore.rows import DatasetReader
    from workbench.store import open_store

    with pytest.raises(ExploreError, match="other images"):
        build_state(vit, {}, "demo:val[1::400]", stores={"FAR store": stores["FAR"]})
    reader = DatasetReader("FAR", open_store(stores["FAR"]))
    with pytest.raises(ExploreError, match=r"not on image demo:val\[1\]; refusing"):
        reader.rows("demo:val[1]", ("cls",))

    class Liar:  # a source that answers with another image's rows
        def __init__(self, inner):
            self.inner = inner
            for k in ("grid", "prefix_kinds", "layer_labels", "num_heads", "units", "measure"):
                setattr(self, k, getattr(inner, k))

        def rows(self, image_id, query):
            other = [i for i in self.inner.ids if i != image_id][0]
            return self.inner.rows(other, query)

    st = build_state(stores={"teacher": stores["teacher"]})
    st.sources["liar"] = Liar(st.sources["teacher"])
    with pytest.raises(ExploreError, match="refusing to draw"):
        st.rows("liar")


def test_bad_inputs_get_clear_messages(stores, vit, tmp_path, batch):
    import xarray as xr

    from workbench.explore import ExploreError, build_state, explore
    from workbench.models import create_model
    from workbench.store import save

    # a store without the map the view needs
    preds = _stamped(xr.Dataset({"logits": (("sample", "class"), np.zeros((3, 10)))}).assign_attrs(analysis="predictions"), batch)
    with pytest.raises(ExploreError, match=r"'P'.*analysis 'predictions'.*needs one of at_maps, attention, dependency, "):
        build_state(stores={"teacher": stores["teacher"], "P": save(preds, tmp_path / "p.nc")})
    cut = _stamped(xr.Dataset({"cls_attention": (("sample", "y"), np.zeros((3, 2)))}).assign_attrs(analysis="attention"), batch)
    with pytest.raises(ExploreError, match="has no 'attention' variable"):
        build_state(stores={"cut": save(cut, tmp_path / "cut.nc")})
    with pytest.raises(ExploreError, match="does not exist"):
        build_state(stores={"x": tmp_path / "missing.nc"})
    # an image spec with no images
    with pytest.raises(ExploreError, match="selects no images"):
        build_state(vit, {}, "demo:val[5:5]")
    # a student of another input size (the demo Swin takes 32 x 32, the demo ViT 28 x 28)
    with pytest.raises(ExploreError, match=r"takes \(1, 28, 28\).*Swin.*\(1, 32, 32\)"):
        build_state(vit, {"Swin": create_model("swin_demo").eval()}, SPEC)
    # a query outside the grid, a head out of range
    st = build_state(stores=stores)
    with pytest.raises(ExploreError, match=r"query \(7, 2\) is outside the 7 x 7 patch grid of 'teacher'"):
        st.select(query=(7, 2))
    with pytest.raises(ExploreError, match="head 9 out of range"):
        st.select(head=9)
    with pytest.raises(ExploreError, match="no 'dist' token"):
        st.select(query="dist")
    # in a notebook the message is shown alone, without a traceback
    err = ExploreError("x is wrong; do y")
    assert err._render_traceback_() == ["ExploreError: x is wrong; do y"]
    # the widget shows a bad click as a message instead of raising
    w = explore(stores=stores)
    w.view.click = [1.5, 0.2, 1]
    assert "outside the image" in w.view.error


def test_widget_click_layer_head_and_export(state, tmp_path):
    from workbench.explore.widget import Explorer

    w = Explorer(state)
    w.view.click = [0.05, 0.95, 1]  # top right patch
    assert w.view.state["query_label"] == "patch (0, 6)"
    before = bytes(w.view.panels)
    w.layer_slider.value = 4
    w.head_menu.value = 1
    assert w.view.state["layer"] == 4 and w.view.state["head"] == 1 and bytes(w.view.panels) != before
    w.token_buttons[0].click()
    assert w.view.state["query_label"] == "cls token"
    out = w.export(tmp_path / "view.png")
    assert out["png"].stat().st_size > 10_000
    # the exported code redraws the view from its data
    run = subprocess.run([sys.executable, out["code"].name], cwd=tmp_path, capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"})
    assert run.returncode == 0, run.stderr
    fig = w.snapshot()
    titles = [ax.get_title() for ax in fig.axes]
    assert any("FAR (gradient saliency)" in t and "layer 4, head 1" in t for t in titles)


def test_import_workbench_stays_light():
    code = "import sys, workbench; assert callable(workbench.explore); " \
           "assert not {'torch', 'anywidget', 'ipywidgets'} & set(sys.modules), sorted(sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr


# ------------------------------------------------------------------------------ one source of truth
def test_stores_read_the_explorer_kinds_the_extractors_register():
    """Reading a store takes the kinds from the registrations' source text (no torch); it must say what importing the
    extractors registers, field for field (the functions aside, which a store needs none of)."""
    from dataclasses import replace

    from workbench.analysis import EXTRACTORS, _declared_kinds, explore_kinds

    imported = {k: replace(v, prepare=None, masks=None, hint=None) for k, v in explore_kinds().items()
                if EXTRACTORS[k].__module__.startswith("workbench.analysis.")}  # not a test's (the toy's)
    assert _declared_kinds() == imported and len(imported) >= 5
    assert {"attention", "dependency", "sparse_attention", "window_attention", "at_maps"} <= set(imported)


def test_state_changed_from_code_moves_every_control_and_the_pixels(vit, far_student):
    """The notebook's calls: select from code, then a click; the controls, the pixels and every map follow the state."""
    from workbench.explore import build_state
    from workbench.explore.widget import Explorer

    st = build_state(vit, {"FAR": far_student}, SPEC)
    w = Explorer(st)
    pixels = lambda: np.frombuffer(w.view.image, np.uint8).reshape(w.view.image_shape)  # noqa: E731
    want = lambda i: np.clip(np.round(st.images.display[i] * 255), 0, 255).astype(np.uint8)  # noqa: E731
    np.testing.assert_array_equal(pixels(), want(0))
    st.select(image=1, query=(3, 4), layer=2)
    assert (w.image_slider.value, w.layer_slider.value) == (1, 2)
    assert w.view.image_id == w.view.state["image_id"] == st.images.ids[1]
    np.testing.assert_array_equal(pixels(), want(1))  # the pixels are image 1's, sent with its maps
    w.view.click = [0.05, 0.05, 1]  # then a click: still image 1, every panel's maps computed on it
    assert w.view.state["query_label"] == "patch (0, 0)" and w.image_slider.value == 1
    assert [p["image_id"] for p in w.view.state["panels"]] == [st.images.ids[1]] * 2
    np.testing.assert_array_equal(pixels(), want(1))
    panel0 = np.frombuffer(w.view.panels, np.float16)[:49].astype(np.float32)
    np.testing.assert_allclose(panel0, st.rows("teacher", image=1).maps[2].mean(0).ravel(), rtol=1e-3)
    st.select(strip="FAR", head=3, scale="panel", exclude_query=False)
    assert (w.strip_menu.value, w.head_menu.value, w.scale_toggle.value, w.self_menu.value) == ("FAR", 3, "panel", "in the scale")
    assert w.view.state["strip"]["label"] == "FAR"
    # a control moves the state (and the other controls stay as they are)
    w.layer_slider.value = 4
    w.image_slider.value = 2
    assert (st.selection.layer, st.selection.image, w.view.image_id) == (4, 2, st.images.ids[2])
    np.testing.assert_array_equal(pixels(), want(2))
    # a thumbnail click selects its layer and head
    w.view.pick = [5, 1, 1]
    assert (st.selection.layer, st.selection.head, w.layer_slider.value, w.head_menu.value) == (5, 1, 5, 1)
    # a bad value from code changes nothing
    with pytest.raises(Exception, match="head 9 out of range"):
        st.select(head=9)
    assert w.head_menu.value == 1 and st.selection.head == 1


def test_agreement_follows_the_selected_head(state):
    state.select(query=(2, 2), head=None, layer=0)
    mean = {k: v["js"].copy() for k, v in state.agreement().items()}
    state.select(head=1)
    ag = state.agreement()
    for label in ("FAR", "Sparsifiner"):
        t = normalise_rows_of(state.rows("teacher").tokens[:, 1])
        s = normalise_rows_of(state.rows(label).tokens[:, 1])
        from workbench.explore.state import row_js

        np.testing.assert_allclose(ag[label]["js_head"], row_js(t, s), atol=1e-12)
        assert not np.allclose(ag[label]["js_head"], mean[label])
    state.select(head=None)


def normalise_rows_of(p):
    p = np.asarray(p, np.float64)
    with np.errstate(invalid="ignore"):
        return p / p.sum(-1, keepdims=True)  # an all-zero row (a Sparsifiner head keeping no key): NaN


@pytest.fixture(scope="module")
def slim_all_pruned():
    """A gated demo Swin whose layer-2 window 0 has all 6 heads pruned, layer-0 window 0 two of its 3."""
    import methods.slimswin as ss
    from workbench.models import create_model

    torch.manual_seed(4)
    model = ss.add_gates(create_model("swin_demo")).eval()
    masks = [m.clone() for m in ss.get_masks(model)]
    masks[2][0, :] = False
    masks[0][0, :2] = False
    ss.set_mask(model, masks)
    return model


def test_slimswin_window_with_every_head_pruned_is_greyed_and_means_cover_its_heads(slim_all_pruned):
    from workbench.explore import build_state
    from workbench.models import create_model

    st = build_state(create_model("swin_demo").eval(), {"SlimSwin": slim_all_pruned}, "demo:val[:1]")
    st.select(query=(0, 0), layer=2, strip="SlimSwin")  # window 0 of every layer holds the top-left token
    assert st.heads_at() == 6 and st.heads_at(0) == 3 and st.heads_at(4) == 12
    view = st.view()
    slim, teacher = view["panels"][1], view["panels"][0]
    assert slim["pruned"] and "all 6 heads pruned here" in slim["note"] and not teacher["pruned"]
    rows = st.rows("SlimSwin")
    np.testing.assert_allclose(slim["map"], rows.maps[2, :6].mean(0), rtol=1e-6)  # its 6 heads, not 12 slots
    assert np.isfinite(rows.maps[2, :6]).any() and np.isnan(rows.maps[2, 6:]).all()
    np.testing.assert_allclose(teacher["map"], st.rows("teacher").maps[2, :6].mean(0), rtol=1e-6)
    assert view["strip_heads"] == [3, 3, 6, 6, 12, 12] and view["strip_pruned"][2, :6].all()
    # layer 0: two of three heads pruned in this window: the mean is the one head left
    st.select(layer=0)
    slim = st.view()["panels"][1]
    assert not slim["pruned"] and "mean over 1 of 3 heads (2 pruned here)" in slim["note"]
    np.testing.assert_allclose(slim["map"], rows.maps[0, 2], rtol=1e-6)
    # the head menu offers the heads the layer has; a deeper layer keeps a head it has, a shallower one returns to the mean
    from workbench.explore.widget import Explorer

    w = Explorer(st)
    assert [v for _, v in w.head_menu.options] == ["mean", 0, 1, 2]
    st.select(layer=4, head=9)
    assert [v for _, v in w.head_menu.options][-1] == 11 and w.head_menu.value == 9
    st.select(layer=1)
    assert st.selection.head is None and w.head_menu.value == "mean"
    with pytest.raises(Exception, match="head 3 out of range: layer 1 has at most 3 heads"):
        st.select(head=3)


def test_difference_view_is_the_students_share_minus_the_teachers(state):
    state.select(query=(4, 2), layer=3, head=None, difference=True)
    try:
        meta, buffers = state.payload()
        maps = np.frombuffer(buffers["panels"], np.float16).astype(np.float32).reshape(3, 7, 7)
        share = {}
        for label in ("teacher", "FAR", "Sparsifiner"):
            row = state.rows(label).tokens[3].astype(np.float64).mean(0)  # (T,): head mean, CLS first
            with np.errstate(invalid="ignore"):  # a Sparsifiner row that kept no key: NaN, as the view has it
                share[label] = (row / row.sum())[1:].reshape(7, 7)
        np.testing.assert_allclose(maps[0], state.rows("teacher").maps[3].mean(0), rtol=1e-3)  # the reference as is
        for i, label in ((1, "FAR"), (2, "Sparsifiner")):
            want = share[label] - share["teacher"]
            np.testing.assert_allclose(maps[i], want, atol=2e-3 * np.abs(want).max())
            p = meta["panels"][i]
            assert p["diverging"] and p["vmin"] == -p["vmax"] and "teacher" in p["units"]
        assert (maps[1] < 0).any() and (maps[1] > 0).any()
    finally:
        state.select(difference=False)


def test_reverse_view_shows_which_queries_attend_to_the_key(vit, far_student, batch):
    from workbench.analysis import get_extractor
    from workbench.explore import build_state

    st = build_state(vit, {"FAR": far_student}, SPEC)
    st.select(image=1, query=(2, 5), layer=1, direction="key")
    att = get_extractor("attention")(vit, batch.tensor)["attention"].values  # (sample, layer, head, query, key)
    dep = get_extractor("dependency")(far_student, batch.tensor)["dependency"].values
    k = _token(2, 5)
    view = st.view()
    teacher, far = view["panels"]
    assert view["query_label"].startswith("key patch (2, 5)")
    np.testing.assert_allclose(teacher["map"], att[1, 1, :, 1:, k].mean(0).reshape(7, 7), atol=1e-7)
    np.testing.assert_allclose(teacher["prefix"], [att[1, 1, :, 0, k].mean()], atol=1e-7)  # the CLS query's value
    assert np.isnan(far["map"]).all() and "every query's dependency" in far["note"]  # until the background is done
    assert st.sources["FAR"].wait(120)
    st._cache.clear()
    far = st.view()["panels"][1]
    want = dep[1, 1, :, 1:, k].mean(0).reshape(7, 7)
    np.testing.assert_allclose(far["map"], want, rtol=1e-4, atol=1e-6 * np.abs(want).max())
    st.select(direction="query")
    np.testing.assert_allclose(st.view()["panels"][0]["map"], att[1, 1, :, k, 1:].mean(0).reshape(7, 7), atol=1e-7)
