"""workbench.features meaning / effects / lost: each against an independent computation on tiny models and data.

- effects: removing a latent through a forward hook on the named hook point changes log p(correct) exactly as
  editing the activation by hand and running the rest of the model does; a latent with no decoder in a model has no
  effect there;
- meaning: the streamed image means, top tokens and class means equal a brute-force pass over all codes at once;
  crops hold the pixels under the token;
- lost: the verdict comes out shown / partly / not shown on synthetic data on each side of its thresholds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from methods.hooks import HookPoint
from workbench.features import Crosscoder
from workbench.features.effects import latent_contribution, latent_effects, rows_to_value
from workbench.features.lost import LostThresholds, lost_features, lost_status, rank_teacher_only
from workbench.features.meaning import latent_activations, patch_crops, token_layout
from workbench.features.pairs import token_rows


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.hook_resid_post = HookPoint()

    def forward(self, x):
        return self.hook_resid_post(x + torch.tanh(self.fc(x)))


class Toy(nn.Module):
    """A tiny token model: 2×2-pixel patches of a 1×4×4 image (4 tokens) after a class token, 3 blocks, mean pool."""

    def __init__(self, d: int = 6, classes: int = 3, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Linear(4, d)
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.blocks = nn.ModuleList(Block(d) for _ in range(3))
        self.head = nn.Linear(d, classes)

    def tokens(self, x):  # (B, 1, 4, 4) -> (B, 5, d)
        patches = x.unfold(2, 2, 2).unfold(3, 2, 2).reshape(x.shape[0], 4, 4)  # (B, 4 patches, 4 pixels)
        t = self.embed(patches)
        return torch.cat([self.cls.expand(x.shape[0], -1, -1), t], 1)

    def rest(self, h, start: int):
        for blk in self.blocks[start:]:
            h = blk(h)
        return self.head(h.mean(1))

    def forward(self, x):
        return self.rest(self.tokens(x), 0)


def _setup(seed: int = 0, n: int = 12):
    teacher, student = Toy(6, seed=seed).eval(), Toy(5, seed=seed + 1).eval()
    cc = Crosscoder((6, 5), width=10, k=3, generator=torch.Generator().manual_seed(seed)).eval()
    with torch.no_grad():
        cc.scale.copy_(torch.tensor([0.7, 1.3]))
        cc.b_enc.fill_(0.05)
        cc.threshold.fill_(0.0)
    x = torch.randn(n, 1, 4, 4, generator=torch.Generator().manual_seed(seed + 2))
    y = torch.arange(n) % 3
    hooks = {"teacher": "blocks.0.hook_resid_post", "student": "blocks.0.hook_resid_post"}
    return {"teacher": teacher, "student": student}, hooks, cc, x, y


def _by_hand(models, cc, x, y, latent):
    """Δ log p(y) per model: block 0's output computed by hand, the latent's contribution subtracted, blocks 1.. run."""
    with torch.no_grad():
        hs = [m.blocks[0](m.tokens(x)) for m in models.values()]  # (B, 5, d_m)
        codes, _ = cc.encode([h.reshape(-1, h.shape[-1]) for h in hs])  # (B·5, width)
        out = []
        for m, (model, h) in enumerate(zip(models.values(), hs)):
            d = cc.W_dec[m][latent] / cc.scale[m]
            edited = h - codes.reshape(x.shape[0], 5, -1)[..., latent:latent + 1] * d
            lp = [F.log_softmax(model.rest(v, 1), -1)[torch.arange(len(y)), y] for v in (edited, h)]
            out.append((lp[0] - lp[1]).numpy())
    return np.stack(out)  # (models, B)


def test_latent_effect_equals_editing_the_activation_by_hand():
    models, hooks, cc, x, y = _setup()
    latents = [0, 3, 7]
    ds = latent_effects(cc, models, hooks, x, y, latents, batch_size=5, chunk=2)
    assert ds["effect"].dims == ("model", "latent", "sample") and ds.sizes["sample"] == len(x)
    for j in latents:
        np.testing.assert_allclose(ds["effect"].sel(latent=j).values, _by_hand(models, cc, x, y, j), atol=1e-5)
    assert np.abs(ds["effect"].values).max() > 1e-3  # the edits change something: the comparison is not 0 == 0


def test_a_latent_without_a_decoder_in_a_model_has_no_effect_there():
    models, hooks, cc, x, y = _setup(seed=1)
    with torch.no_grad():
        cc.W_dec[1][4] = 0.0  # latent 4: teacher-only
    ds = latent_effects(cc, models, hooks, x, y, [4])
    assert np.abs(ds["effect"].sel(model="student").values).max() == 0.0
    assert np.abs(ds["effect"].sel(model="teacher").values).max() > 1e-4


def test_effects_refuse_images_without_a_label():
    models, hooks, cc, x, y = _setup()
    with pytest.raises(ValueError, match="teacher's predicted classes"):
        latent_effects(cc, models, hooks, x, -torch.ones_like(y), [0])


@pytest.mark.parametrize("shape,name", [((2, 5, 3), "blocks.0.hook_resid_post"),
                                        ((2, 4, 3, 5), "stages.1.hook_out"),
                                        ((2, 3, 4, 5), "layers.0.blocks.1.hook_resid_post")])
def test_rows_go_back_into_the_hook_value(shape, name):
    v = torch.randn(*shape)
    rows = token_rows(v, name)
    assert torch.equal(rows_to_value(rows, v.shape, name), v)


def test_latent_contribution_is_in_the_models_units():
    _, _, cc, _, _ = _setup()
    codes = torch.rand(4, cc.width)
    recon = cc.decode(codes)
    with torch.no_grad():
        without = cc.decode(codes * (torch.arange(cc.width) != 2))
    for m in range(2):
        torch.testing.assert_close(recon[m] - without[m], latent_contribution(cc, codes, 2, m), atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ meaning
def test_latent_activations_equal_a_brute_force_pass():
    models, hooks, cc, x, y = _setup(n=14)
    samples = np.arange(100, 114)
    ds = latent_activations(cc, models, hooks, x, y.numpy(), samples, top=5, batch_size=4)
    with torch.no_grad():
        hs = [m.blocks[0](m.tokens(x)) for m in models.values()]
        codes = cc.encode([h.reshape(-1, h.shape[-1]) for h in hs])[0].reshape(14, 5, -1).numpy()  # (B, T, width)
    np.testing.assert_allclose(ds["image_mean"].values, codes.mean(1), atol=1e-6)
    flat = codes.transpose(2, 0, 1).reshape(cc.width, -1)  # (width, B·T)
    for j in range(cc.width):
        best = np.sort(flat[j])[::-1][:5]
        np.testing.assert_allclose(ds["top_activation"].sel(latent=j).values, best, atol=1e-6)
        for r in range(5):  # each top entry points at a token holding that value
            p, t = int(ds["top_position"][j, r]), int(ds["top_token"][j, r])
            assert codes[p, t, j] == pytest.approx(float(ds["top_activation"][j, r]), abs=1e-6)
            assert int(ds["top_sample"][j, r]) == samples[p]
    for c in range(3):
        np.testing.assert_allclose(ds["class_mean"].sel(label=c).values, codes.mean(1)[y.numpy() == c].mean(0), atol=1e-6)
    assert list(ds.attrs["grid"]) == [2, 2] and list(ds.attrs["prefix_kinds"]) == ["cls"]
    assert set(ds["top_kind"].values.ravel()) <= {"cls", "patch"}


def test_token_layouts():
    assert token_layout((2, 50, 64), "blocks.3.hook_resid_post", (28, 28)).grid == (7, 7)
    assert token_layout((2, 50, 64), "blocks.3.hook_resid_post", (28, 28)).prefix_kinds == ("cls",)
    assert token_layout((2, 64, 7, 7), "stages.2.hook_out", (28, 28)).grid == (7, 7)
    assert token_layout((2, 8, 8, 48), "layers.1.blocks.1.hook_resid_post", (32, 32)).grid == (8, 8)
    with pytest.raises(ValueError, match="no square patch grid"):
        token_layout((2, 7, 4), "blocks.0.hook_resid_post", (28, 28))


def test_patch_crops_hold_the_pixels_under_the_token():
    yy, xx = np.mgrid[0:8, 0:8]
    display = np.stack([yy * 8 + xx, 100 + yy * 8 + xx]).astype(np.float32)  # (2, 8, 8): value = position
    pos, ty, tx = np.array([[1, 0, -1, 0]]), np.array([[1, 0, 0, -1]]), np.array([[2, 3, 0, -1]])
    crops = patch_crops(display, pos, ty, tx, grid=(4, 4), context=1)  # cells of 2×2 px, crops 6×6
    assert crops.shape == (1, 4, 6, 6)
    np.testing.assert_array_equal(crops[0, 0], display[1, 0:6, 2:8])  # cell (1, 2) ± 1 cell
    np.testing.assert_array_equal(crops[0, 1, 2:, :4], display[0, 0:4, 4:8])  # cell (0, 3): padded above, right
    assert np.isnan(crops[0, 1, :2]).all() and np.isnan(crops[0, 1, :, 4:]).all()
    assert np.isnan(crops[0, 2]).all()  # no token
    assert crops[0, 3, 0, 0] == display[0, 0, 0] and crops[0, 3, -1, -1] == display[0, -1, -1]  # cls: whole image


# ------------------------------------------------------------------------------------------------ lost
def _synthetic(excess: float, n: int = 600, n_lost: int = 60, noise: float = 0.3, seed: int = 0):
    """Scores of 3 latents on ``n`` images of 4 classes; the student lost ``n_lost`` (teacher right on all)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 4
    lost = np.zeros(n, bool)
    lost[rng.choice(n, n_lost, replace=False)] = True
    act = np.abs(1.0 + noise * rng.standard_normal((n, 3)))
    act[lost] *= 1 + excess
    return act, labels, np.ones(n, bool), ~lost


def _test(excess, drop=(0.3, 0.2, 0.1), **kw):
    act, labels, t_ok, s_ok = _synthetic(excess, **kw)
    return lost_features(act, labels, t_ok, s_ok, np.array([0, 1, 2]), np.array(drop), LostThresholds())


def test_lost_features_reach_every_verdict():
    assert _test(1.0).status == "shown"
    small = _test(0.1, n=4000, n_lost=800, noise=0.1)
    assert small.status == "partly" and small.low > 0 and small.excess < 0.25
    assert _test(0.0).status == "not shown" and _test(0.0).low <= 0
    assert _test(-0.5).status == "not shown"
    unused = _test(1.0, drop=(0.005, 0.001, 0.0))  # large excess, but the teacher does not use the latents
    assert unused.status == "not shown" and unused.latents == ()
    assert _test(1.0, n_lost=3).status == "not shown"


def test_lost_features_delta_is_the_class_weighted_difference():
    act, labels, t_ok, s_ok = _synthetic(0.5, seed=3)
    res = lost_features(act, labels, t_ok, s_ok, np.array([0, 1, 2]), np.array([1.0, 1.0, 1.0]))
    score = (act / act.mean(0)).mean(1)
    lost = ~s_ok
    w = np.array([(lost & (labels == c)).sum() for c in range(4)], float) / lost.sum()
    want = sum(w[c] * (score[lost & (labels == c)].mean() - score[~lost & (labels == c)].mean()) for c in range(4))
    assert res.delta == pytest.approx(want, rel=1e-12) and res.low < res.delta < res.high
    assert res.n_lost == lost.sum() and res.n_kept == (~lost).sum()


def test_lost_status_at_its_thresholds():
    th = LostThresholds(min_excess=0.25, min_lost=5)
    assert lost_status(2, 10, 0.01, 0.26, th)[0] == "shown"
    assert lost_status(2, 10, 0.01, 0.24, th)[0] == "partly"
    assert lost_status(2, 10, -0.01, 0.9, th)[0] == "not shown"
    assert lost_status(2, 4, 0.5, 0.9, th)[0] == "not shown"
    assert lost_status(0, 10, 0.5, 0.9, th)[0] == "not shown"


def test_rank_teacher_only_keeps_live_teacher_only_latents_by_drop():
    classes = np.array(["teacher_only", "shared", "teacher_only", "teacher_only", "student_only"])
    dead = np.array([False, False, False, True, False])
    ranked = rank_teacher_only(classes, dead, np.array([0.1, 0.9, 0.5, 0.8, 0.7]))
    assert ranked.tolist() == [2, 0]


# ------------------------------------------------------------------------------------------------ gallery
def test_study_pair_feeds_the_gallery_figure_and_table():
    import json

    from matplotlib.figure import Figure

    from workbench.features import CrosscoderConfig
    from workbench.features.report import StudyOptions, study_pair
    from workbench.figures.compare.features import assemble, features_table
    from workbench.plots.features import plot_feature_diff

    models, hooks, _, _, _ = _setup()
    g = torch.Generator().manual_seed(5)
    train, held = torch.randn(48, 1, 4, 4, generator=g), torch.randn(30, 1, 4, 4, generator=g)
    labels = np.arange(30) % 3
    display = (held[:, 0].numpy() - held.min().item()) / (held.max() - held.min()).item()  # (30, 4, 4) in [0, 1]
    cfg = CrosscoderConfig(width=8, k=2, epochs=2, batch_images=8)
    opt = StudyOptions(candidates=3, show=2, crops=3, batch_size=16)
    ds = study_pair(models, hooks, train, held, labels, np.arange(500, 530), display, cfg, opt)
    assert ds.sizes["shown"] == 2 and ds.sizes["rank"] == 3 and ds["crop"].shape[-2:] == (6, 6)
    assert set(ds["crop_sample"].values.ravel()) <= set(range(500, 530))
    correct = ds["correct"].values  # the models' own predictions on the held-out images
    with torch.no_grad():
        for m, model in enumerate(models.values()):
            np.testing.assert_array_equal(correct[m], model(held).argmax(-1).numpy() == labels)
    assert str(ds["lost_status"].values) in ("shown", "partly", "not shown")
    arch = assemble([ds, ds], ["A", "B"], ["toy", "toy"], title="toy teacher", pairs=json.dumps(
        {"A": list(hooks.values()), "B": list(hooks.values())}), budget=json.dumps({"width": 8, "k": 2, "epochs": 2}),
        train_images="toy", held_images="toy")
    table = features_table(arch)
    assert list(table.frame["student"]) == ["A", "B"]
    assert table.frame["lost features → lost accuracy"][0].startswith(str(ds["lost_status"].values))
    fig = plot_feature_diff([arch])
    assert isinstance(fig, Figure) and len(fig.axes) >= 2 + 2 * (1 + 2 * 3)


def test_a_latent_without_a_student_decoder_is_ranked_and_shown_as_teacher_only():
    from workbench.features import CrosscoderConfig
    from workbench.features.report import StudyOptions, study_pair

    models, hooks, cc, _, _ = _setup(seed=2)
    with torch.no_grad():
        cc.W_dec[1][5] = 0.0  # latent 5: r = 0, teacher-only by construction
    g = torch.Generator().manual_seed(7)
    held = torch.randn(24, 1, 4, 4, generator=g)
    labels = np.arange(24) % 3
    ds = study_pair(models, hooks, held, held, labels, np.arange(24), np.zeros((24, 4, 4)),
                    CrosscoderConfig(width=10, k=3), StudyOptions(candidates=3, show=2, crops=2), cc=cc)
    assert str(ds["latent_class_name"].values[5]) == "teacher_only" and not bool(ds["dead"].values[5])
    assert int(ds["ranked_latent"].values[0]) == 5 and int(ds["shown_latent"].values[0]) == 5
    assert float(ds["shown_effect"].sel(model="student").values[0]) == 0.0  # nothing of it in the student
    eff = latent_effects(cc, models, hooks, held, labels, [5])  # the figure's teacher effect, independently
    assert float(ds["shown_effect"].sel(model="teacher").values[0]) == pytest.approx(
        float(eff["effect_mean"].sel(model="teacher", latent=5)), abs=1e-9)
