"""The explorer's latent view (workbench.explore.latents): the clicked token's active latents and a picked latent's
maps equal the crosscoder's encode of those tokens, computed here by hand from the models' hook values."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

SPEC = "demo:val[::400]"  # 3 digits of different classes
HOOK = "blocks.2.hook_resid_post"


@pytest.fixture(scope="module")
def pair():
    import methods.far as far
    from workbench.models import create_model

    torch.manual_seed(1)
    teacher = create_model("vit_demo").eval()
    torch.manual_seed(2)
    return teacher, far.replace_attention(create_model("vit_demo")).eval()


@pytest.fixture(scope="module")
def batch():
    from workbench.data import load_images

    return load_images(SPEC, input_size=(1, 28, 28))


def _hook(model, x):
    from methods.hooks import run_with_cache

    _, cache = run_with_cache(model, x, names=[HOOK])
    return cache[HOOK]  # (B, 1 + 49, D)


def write_latent_store(path, teacher, student, x):
    """An untrained crosscoder over ``HOOK`` of the two models (random dictionary; its scale and threshold set on the
    images ``x``), its diff store at ``path`` and the checkpoint beside it; returns ``(crosscoder, diff)``."""
    from workbench.features import Crosscoder, crosscoder_diff
    from workbench.features.crosscoder import save_crosscoder

    rows = [_hook(m, x).flatten(0, 1) for m in (teacher, student)]  # (B·T, D) per model
    cc = Crosscoder((rows[0].shape[1], rows[1].shape[1]), 48, 6, generator=torch.Generator().manual_seed(0))
    cc.fit_scale(rows)
    with torch.no_grad():
        cc.b_enc.fill_(0.05)
        cc.train()
        cc.encode(rows)  # sets the inference threshold (6 latents per token on these images)
    cc.eval()
    ds = crosscoder_diff(cc, [rows]).assign_attrs(hooks=json.dumps({"teacher": HOOK, "student": HOOK}))
    ds.to_netcdf(path)
    save_crosscoder(cc, path.with_suffix(".crosscoder.safetensors"))
    return cc, ds


@pytest.fixture(scope="module")
def store(tmp_path_factory, pair, batch):
    path = tmp_path_factory.mktemp("latents") / "f.nc"
    return (path, *write_latent_store(path, *pair, batch.tensor))


def _by_hand(cc, pair, x):
    """``(code, sided)``: (T, width) the crosscoder's eval code and (2, T, width) each model's encoding alone, float64."""
    xs = [_hook(m, x)[0].double() for m in pair]  # (T, D) of the one image
    terms = [(xm * float(cc.scale[m]) - cc.b_dec[m].double()) @ cc.W_enc[m].double() for m, xm in enumerate(xs)]
    b = cc.b_enc.double()
    pre = torch.relu(b + terms[0] + terms[1])
    score = pre * sum(w.double().norm(dim=1) for w in cc.W_dec)
    code = torch.where(score > float(cc.threshold), pre, 0.0)
    return code.detach().numpy(), torch.stack([torch.relu(b + t) for t in terms]).detach().numpy()


def test_active_latents_and_maps_equal_the_crosscoder_encode(store, pair, batch):
    from workbench.explore import explore

    path, cc, ds = store
    w = explore(pair[0], {"FAR": pair[1]}, SPEC, latents={"FAR": str(path)})
    for image, (y, x) in ((0, (3, 4)), (2, (0, 6)), (1, (6, 1))):
        w.state.select(image=image, query=(y, x))
        lat = w.view.latents
        code, sided = _by_hand(cc, pair, batch.tensor[image:image + 1])
        t = 1 + y * 7 + x  # the class token first, then the 7 x 7 patch grid row by row
        on = np.flatnonzero(code[t] > 0)
        want = on[np.argsort(-code[t][on])]
        assert lat["image_id"] == w.state.image_id and lat["cell"] == [y, x]
        assert [a["id"] for a in lat["active"]] == want.tolist() and len(want) > 0
        np.testing.assert_allclose([a["activation"] for a in lat["active"]], code[t][want], rtol=1e-4, atol=1e-5)
        assert [a["cls"] for a in lat["active"]] == ds.latent_class.values[want].tolist()
        np.testing.assert_allclose([a["relative"] for a in lat["active"]], ds.relative_norm.values[want], rtol=1e-6)
        j = lat["picked"]
        assert j == want[0] and lat["panels"] == ["code", "teacher", "FAR"]
        maps = np.frombuffer(w.view.latent_maps, np.float16).astype(np.float64).reshape(3, 7, 7)
        expect = np.stack([code[1:, j], sided[0, 1:, j], sided[1, 1:, j]]).reshape(3, 7, 7)
        np.testing.assert_allclose(maps, expect, rtol=2e-3, atol=2e-3 * expect.max())  # float16 on the wire
        assert lat["vmin"] == 0.0 and lat["vmax"] == pytest.approx(expect.max(), rel=1e-4)
        np.testing.assert_allclose(lat["prefix"]["cls"], [code[0, j], sided[0, 0, j], sided[1, 0, j]], rtol=1e-4,
                                   atol=1e-5)
    # a picked latent (a row click) stays shown on another token and image; the class token lists its own latents
    other = int(np.flatnonzero((code > 0).any(0))[-1])
    w.view.latent_pick = [other, 1]
    w.state.select(image=0, query="cls")
    code, sided = _by_hand(cc, pair, batch.tensor[:1])
    assert w.view.latents["picked"] == other and w.view.latents["cell"] == [-1, -1]
    assert [a["id"] for a in w.view.latents["active"]] == [int(i) for i in np.argsort(-code[0]) if code[0, i] > 0]
    maps = np.frombuffer(w.view.latent_maps, np.float16).astype(np.float64).reshape(3, 7, 7)
    np.testing.assert_allclose(maps[1], sided[0, 1:, other].reshape(7, 7), rtol=2e-3, atol=2e-3 * sided.max())


def test_latent_view_bad_inputs(store, pair, tmp_path):
    from workbench.explore import explore
    from workbench.explore.rows import ExploreError

    path, _, _ = store
    with pytest.raises(ExploreError, match="no crosscoder checkpoint"):
        ds_only = tmp_path / "x.nc"
        ds_only.write_bytes(path.read_bytes())
        explore(pair[0], {"FAR": pair[1]}, SPEC, latents={"FAR": str(ds_only)})
    with pytest.raises(ExploreError, match="needs the live teacher and student"):
        explore(pair[0], {"FAR": pair[1]}, SPEC, latents={"other": str(path)})
    with pytest.raises(ExploreError, match="pass the models the crosscoder was trained on"):
        from workbench.models import create_model

        explore(pair[0], {"S": create_model("vit_demo", embed_dim=32).eval()}, SPEC, latents={"S": str(path)})


@pytest.mark.parametrize("kind", ["swin", "cnn"])
def test_maps_of_position_tokens(kind):
    """Swin block outputs (B, H, W, C) and CNN stage maps (B, C, H, W): the clicked cell's latents and the picked
    latent's map are the crosscoder's codes of those positions (encoded here over both images at once, row-major)."""
    import timm

    import methods.slimswin as ss
    from methods.hooks import run_with_cache
    from workbench.explore.latents import LatentView
    from workbench.features import Crosscoder
    from workbench.features.pairs import token_rows
    from workbench.models import create_model

    torch.manual_seed(0)
    if kind == "swin":
        models, hook, size = (create_model("swin_demo").eval(), ss.add_gates(create_model("swin_demo")).eval()), \
            "layers.1.blocks.1.hook_resid_post", 32
    else:
        models, hook, size = (timm.create_model("cnn_demo").eval(), timm.create_model("sa_resnet_demo").eval()), \
            "stages.1.hook_out", 28
    x = torch.randn(2, 1, size, size, generator=torch.Generator().manual_seed(1))
    rows = [token_rows(run_with_cache(m, x, names=[hook])[1][hook], hook) for m in models]  # (2·H·W, d_m)
    cc = Crosscoder(tuple(r.shape[1] for r in rows), 32, 4, generator=torch.Generator().manual_seed(0))
    cc.fit_scale(rows)
    with torch.no_grad():
        cc.train()
        cc.encode(rows)
        code = cc.eval().encode(rows)[0].numpy()  # (2·H·W, 32)
    view = LatentView(cc, dict(zip(("teacher", "student"), models)), {"teacher": hook, "student": hook}, x,
                      ["a", "b"], ["shared"] * 32, [0.5] * 32)
    state, buf = view.payload(1, ("patch", 0.1, 0.8))
    gh, gw = state["grid"]
    assert (gh, gw) == ((8, 8) if kind == "swin" else (14, 14)) and state["cell"] == [int(0.1 * gh), int(0.8 * gw)]
    mine = code[gh * gw:]  # image 1's positions, row-major
    t = state["cell"][0] * gw + state["cell"][1]
    assert sorted(a["id"] for a in state["active"]) == np.flatnonzero(mine[t] > 0).tolist()
    j = state["picked"]
    got = np.frombuffer(buf, np.float16).astype(np.float64)[:gh * gw].reshape(gh, gw)
    np.testing.assert_allclose(got, mine[:, j].reshape(gh, gw), rtol=2e-3, atol=2e-3 * mine[:, j].max())
