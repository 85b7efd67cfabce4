"""Teacher-vs-student comparison (workbench.analysis.teacher_vs_students and its parts) against independent computations."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from scipy.spatial.distance import jensenshannon
from scipy.stats import spearmanr
from timm.models.vision_transformer import VisionTransformer

from methods.far import replace_attention
from workbench.analysis.attribution import attention_rollout, integrated_gradients, map_agreement, rollout_map
from workbench.analysis.cka import hsic, layer_cka, layer_features, linear_cka, pooled_examples
from workbench.analysis.faithfulness import auc, deletion_insertion
from workbench.analysis.predictions import prediction_agreement
from workbench.analysis.teacher_vs_students import compare_models, stamp_comparison
from workbench.analysis.token_agreement import token_map_agreement
from workbench.models import create_model
from workbench.provenance import DataSource, ModelSource

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = dict(ig_steps=8, steps=8, infidelity=False)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------------------- CKA
def _gram_hsic(x: np.ndarray, y: np.ndarray, debiased: bool) -> float:
    """HSIC from n×n linear kernels of the *uncentred* features: Gretton's tr(KHLH) or Song et al.'s U-statistic."""
    k, lk = x @ x.T, y @ y.T
    n = len(x)
    if not debiased:
        h = np.eye(n) - np.ones((n, n)) / n
        return np.trace(k @ h @ lk @ h) / (n - 1) ** 2
    kt, lt = k.copy(), lk.copy()
    np.fill_diagonal(kt, 0)
    np.fill_diagonal(lt, 0)
    one = np.ones(n)
    return (np.trace(kt @ lt) + one @ kt @ one * (one @ lt @ one) / ((n - 1) * (n - 2))
            - 2 / (n - 2) * one @ kt @ lt @ one) / (n * (n - 3))


def test_cka_of_a_representation_with_itself_is_one():
    x = _rng().normal(size=(40, 12)) + 3.0
    for est in ("debiased", "biased"):
        assert linear_cka(x, x, estimator=est) == pytest.approx(1.0, abs=1e-12)


def test_cka_matches_kernel_formulas_and_is_invariant():
    rng = _rng(1)
    x = rng.normal(size=(30, 8)) + 1.5
    y = x @ rng.normal(size=(8, 5)) + 0.5 * rng.normal(size=(30, 5))
    q, _ = np.linalg.qr(rng.normal(size=(8, 8)))  # orthogonal
    for est, debiased in (("debiased", True), ("biased", False)):
        ref = _gram_hsic(x, y, debiased) / np.sqrt(_gram_hsic(x, x, debiased) * _gram_hsic(y, y, debiased))
        assert hsic(x, y, estimator=est) == pytest.approx(_gram_hsic(x, y, debiased), rel=1e-10)
        assert linear_cka(x, y, estimator=est) == pytest.approx(ref, rel=1e-10)
        assert linear_cka(x @ q, y, estimator=est) == pytest.approx(ref, rel=1e-10)  # orthogonal transform
        assert linear_cka(7.5 * x, 0.01 * y, estimator=est) == pytest.approx(ref, rel=1e-10)  # isotropic scaling
        assert linear_cka(x + 100.0, y, estimator=est) == pytest.approx(ref, rel=1e-8)  # translation
    # not invariant to a non-isotropic rescaling of features (the point of *linear* CKA's invariance class)
    assert linear_cka(x * np.arange(1, 9), y) != pytest.approx(linear_cka(x, y), rel=1e-3)


def test_debiased_cka_of_independent_features_is_near_zero_and_biased_is_not():
    rng = _rng(2)
    vals = {"debiased": [], "biased": []}
    for _ in range(5):
        x, y = rng.normal(size=(64, 128)), rng.normal(size=(64, 96))
        for est in vals:
            vals[est].append(linear_cka(x, y, estimator=est))
    assert abs(np.mean(vals["debiased"])) < 0.02 and max(map(abs, vals["debiased"])) < 0.05
    assert min(vals["biased"]) > 0.5


def test_token_pooling_brings_grids_to_a_common_one():
    rng = _rng(3)
    cnn = torch.from_numpy(rng.normal(size=(3, 5, 28, 28)))  # (B, C, H, W) stage output
    vit = torch.from_numpy(rng.normal(size=(3, 1 + 49, 6)))  # CLS + 7x7 patches
    a = layer_features("stages.0.hook_out", cnn, layout="channels_first")
    b = layer_features("blocks.0.hook_resid_post", vit, layout="tokens", grid=(7, 7), prefix_kinds=("cls",))
    ex_a = pooled_examples(a, "token", (7, 7))
    by_hand = cnn.reshape(3, 5, 7, 4, 7, 4).mean((3, 5)).permute(0, 2, 3, 1).reshape(-1, 5)  # 4x4 block means
    np.testing.assert_allclose(ex_a.numpy(), by_hand.numpy(), rtol=1e-12)
    np.testing.assert_allclose(pooled_examples(b, "token", (7, 7)).numpy(), vit[:, 1:].reshape(-1, 6).numpy())
    np.testing.assert_allclose(pooled_examples(b, "cls").numpy(), vit[:, 0].numpy())
    np.testing.assert_allclose(pooled_examples(b, "mean").numpy(), vit[:, 1:].mean(1).numpy())  # CLS excluded
    assert pooled_examples(a, "cls") is None
    m = layer_cka([a], [b], "token")
    assert m.shape == (2, 1, 1)
    assert m[0, 0, 0] == pytest.approx(linear_cka(by_hand, vit[:, 1:].reshape(-1, 6)), rel=1e-10)
    assert np.isnan(layer_cka([a], [b], "cls")).all()


# ------------------------------------------------------------------------------------- attributions
def _tiny_vit(**kw) -> VisionTransformer:
    args = dict(img_size=8, patch_size=4, in_chans=1, num_classes=3, embed_dim=8, depth=2, num_heads=2, mlp_ratio=2.0)
    return VisionTransformer(**{**args, **kw}).eval()


def test_integrated_gradients_completeness():
    model = create_model("vit_demo").eval()
    with torch.no_grad():  # random init is nearly linear; doubling the weights makes the path integral matter
        for p in model.parameters():
            p.mul_(2.0)
    x = torch.randn(4, 1, 28, 28)
    target = model(x).argmax(-1)
    with torch.no_grad():
        gap = (model(x) - model(torch.zeros_like(x))).gather(1, target[:, None])[:, 0].double()
    coarse, _, _ = integrated_gradients(model, x, target, n_steps=4)
    assert ((coarse.double().sum((1, 2, 3)) - gap).abs() / gap.abs()).max() > 0.01  # 4 nodes are not enough
    attr, amap, delta = integrated_gradients(model, x, target, n_steps=50)
    total = attr.double().sum((1, 2, 3))
    assert ((total - gap).abs() / gap.abs()).max() < 0.01
    np.testing.assert_allclose(amap.double().sum((1, 2)).numpy(), total.numpy(), rtol=1e-5)
    np.testing.assert_allclose(delta.numpy(), ((total - gap).abs() / gap.abs()).numpy(), atol=1e-5)


def test_refined_integrated_gradients_adds_nodes_where_the_gap_is_large():
    from workbench.analysis.attribution import refined_integrated_gradients

    torch.manual_seed(0)
    model = create_model("vit_demo").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    x = torch.randn(4, 1, 28, 28)
    target = model(x).argmax(-1)
    _, _, coarse = integrated_gradients(model, x, target, n_steps=2)
    assert (coarse > 0.01).any()
    attr, amap, rel, used = refined_integrated_gradients(model, x, target, n_steps=2, tolerance=0.01, max_steps=64)
    assert ((rel <= 0.01) | (used == 64)).all() and (used > 2).any() and (rel <= coarse + 1e-12).all()
    for i in range(len(x)):  # each image's map is plain IG at the nodes it reports
        want, _, want_rel = integrated_gradients(model, x[i:i + 1], target[i:i + 1], n_steps=int(used[i]))
        np.testing.assert_allclose(attr[i:i + 1].numpy(), want.numpy(), atol=1e-4 * want.abs().max().item())
        np.testing.assert_allclose(rel[i].item(), want_rel.item(), atol=1e-4)  # float32 sums: 1e-4 of the gap scale
    _, _, _, plain = refined_integrated_gradients(model, x, target, n_steps=2)
    assert (plain == 2).all()


def test_attention_rollout_equals_a_hand_computed_product():
    model = _tiny_vit()
    with torch.no_grad():  # peaked attention, so that the product is far from uniform
        for blk in model.blocks:
            blk.attn.qkv.weight.mul_(20.0)
    x = torch.randn(2, 1, 8, 8)
    # attention probabilities recomputed from q and k of each block's input
    probs, h = [], model.norm_pre(model._pos_embed(model.patch_embed(x)))
    for blk in model.blocks:
        z = blk.norm1(h)
        b, t, d = z.shape
        qkv = blk.attn.qkv(z).reshape(b, t, 3, 2, d // 2).permute(2, 0, 3, 1, 4)  # (3, B, heads, T, Dh)
        q, k = blk.attn.q_norm(qkv[0]), blk.attn.k_norm(qkv[1])
        probs.append(torch.softmax(q @ k.transpose(-1, -2) * blk.attn.scale, -1).detach())
        h = blk(h)
    eye = torch.eye(5, dtype=torch.float64)
    hats = [0.5 * p.double().mean(1) + 0.5 * eye for p in probs]  # rows already sum to 1
    by_hand = torch.einsum("bij,bjk->bik", hats[1], hats[0])
    assert by_hand[:, 0, 1:].std() > 0.02
    np.testing.assert_allclose(attention_rollout(probs).numpy(), by_hand.numpy(), rtol=1e-6)  # float32 rows
    grid = by_hand[:, 0, 1:].reshape(2, 2, 2)  # CLS row over the 2x2 patches
    rmap = rollout_map(model, x)  # (B, 8, 8): each patch's value over its 4x4 pixels
    np.testing.assert_allclose(rmap[:, ::4, ::4].numpy(), grid.numpy(), rtol=1e-5)
    np.testing.assert_allclose(rmap[:, 3::4, 3::4].numpy(), grid.numpy(), rtol=1e-5)


def test_map_agreement_against_scipy():
    rng = _rng(4)
    a, b = rng.random((3, 5, 6)), rng.random((3, 5, 6))
    r = map_agreement(a, b, topk=0.2)  # k = 6 of 30 pixels
    for i in range(3):
        assert r["spearman"][i] == pytest.approx(spearmanr(a[i].ravel(), b[i].ravel())[0])
        fa, fb = a[i].ravel(), b[i].ravel()
        assert r["cosine"][i] == pytest.approx(fa @ fb / np.linalg.norm(fa) / np.linalg.norm(fb))
        assert r["topk"][i] == pytest.approx(len(set(np.argsort(-fa)[:6]) & set(np.argsort(-fb)[:6])) / 6)


# ------------------------------------------------------------------------------------- faithfulness
class _OnePixel(nn.Module):
    """Two classes; class 0's logit is 10 · x[0, 0, py, px], class 1's is 0."""

    def __init__(self, py: int, px: int):
        super().__init__()
        self.py, self.px = py, px

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = 10 * x[:, 0, self.py, self.px]
        return torch.stack([v, torch.zeros_like(v)], 1)


def test_deletion_drops_and_insertion_rises_at_the_pixel():
    model = _OnePixel(1, 2)
    x = torch.ones(2, 1, 4, 4)
    maps = torch.rand(2, 4, 4)
    maps[0, 1, 2] = 2.0  # image 0: the pixel comes first
    maps[1, 1, 2] = maps[1].flatten().sort().values[-5] - 1e-3  # image 1: the pixel is 6th of 16 (5 higher)
    r = deletion_insertion(model, x, maps, torch.zeros(2, dtype=torch.long), steps=16, deletion_baseline="zeros",
                           insertion_baseline="zeros")
    high, half = 1 / (1 + np.exp(-10.0)), 0.5
    for i, first in ((0, 1), (1, 6)):  # the pixel is removed at step `first`
        np.testing.assert_allclose(r["deletion"][i, :first], high, rtol=1e-9)
        np.testing.assert_allclose(r["deletion"][i, first:], half, rtol=1e-9)
        np.testing.assert_allclose(r["insertion"][i, :first], half, rtol=1e-9)
        np.testing.assert_allclose(r["insertion"][i, first:], high, rtol=1e-9)
    assert auc(r["deletion"], r["fraction"])[0] < auc(r["deletion"], r["fraction"])[1]


def test_batched_curves_equal_one_forward_per_step():
    model = create_model("cnn_demo").eval()
    x, maps = torch.randn(3, 1, 28, 28), torch.rand(3, 28, 28)
    target = torch.tensor([0, 3, 7])
    r = deletion_insertion(model, x, maps, target, steps=4, deletion_baseline="zeros", insertion_baseline="blur",
                           blur_sigma=2.0, batch_size=1000)
    order = torch.argsort(-maps.reshape(3, -1), dim=1, stable=True)
    from workbench.analysis.faithfulness import blur

    canvas = blur(x, 2.0)
    for i in range(3):
        for s in range(5):
            n = round(s / 4 * 784)
            mask = torch.zeros(784, dtype=torch.bool)
            mask[order[i, :n]] = True
            mask = mask.view(1, 1, 28, 28)
            with torch.no_grad():
                pd = F.softmax(model(torch.where(mask, 0.0, x[i:i + 1])).double(), -1)[0, target[i]]
                pi = F.softmax(model(torch.where(mask, x[i:i + 1], canvas[i:i + 1])).double(), -1)[0, target[i]]
            assert r["deletion"][i, s] == pytest.approx(pd.item(), rel=1e-5)
            assert r["insertion"][i, s] == pytest.approx(pi.item(), rel=1e-5)


# ---------------------------------------------------------------------------------- maps, predictions
def test_token_map_agreement_against_scipy():
    rng = _rng(5)
    t = torch.from_numpy(rng.random((2, 3, 4, 10)))  # (B, heads, rows, keys), unnormalised
    s = torch.from_numpy(rng.random((2, 3, 4, 10)))
    r = token_map_agreement(t, s, topk=0.3)  # k = 3
    tn, sn = (t / t.sum(-1, keepdim=True)).numpy(), (s / s.sum(-1, keepdim=True)).numpy()
    for b in range(2):
        for h in range(3):
            js = np.mean([jensenshannon(tn[b, h, q], sn[b, h, q], base=2) ** 2 for q in range(4)])
            sp = np.mean([spearmanr(tn[b, h, q], sn[b, h, q])[0] for q in range(4)])
            tk = np.mean([len(set(np.argsort(-tn[b, h, q])[:3]) & set(np.argsort(-sn[b, h, q])[:3])) / 3
                          for q in range(4)])
            assert r["js"][b, h] == pytest.approx(js, abs=1e-10)
            assert r["spearman"][b, h] == pytest.approx(sp, abs=1e-10)
            assert r["topk"][b, h] == pytest.approx(tk)
        ta, sa = tn[b].mean(0), sn[b].mean(0)
        js = np.mean([jensenshannon(ta[q], sa[q], base=2) ** 2 for q in range(4)])
        assert r["js_avg"][b] == pytest.approx(js, abs=1e-10)
    fewer = token_map_agreement(t, s[:, :2], topk=0.3)  # different head counts: only head-averaged scores
    assert np.isnan(fewer["js"]).all() and np.isfinite(fewer["js_avg"]).all()


def test_prediction_agreement_by_hand():
    rng = _rng(6)
    lt, ls = torch.from_numpy(rng.normal(size=(5, 4))), torch.from_numpy(rng.normal(size=(5, 4)))
    labels = np.array([0, 1, -1, 3, 2])
    ds = prediction_agreement({"teacher": lt, "s": ls}, reference="teacher", labels=labels)
    pt, ps = F.softmax(lt, -1).numpy(), F.softmax(ls, -1).numpy()
    np.testing.assert_allclose(ds["kl"].sel(model="s").values, (pt * np.log(pt / ps)).sum(1), rtol=1e-10)
    np.testing.assert_allclose(ds["kl"].sel(model="teacher").values, 0, atol=1e-12)
    agree = (lt.argmax(-1) == ls.argmax(-1)).numpy()
    assert ds["agreement"].sel(model="s").item() == pytest.approx(agree.mean())
    known = labels >= 0
    acc = (ls.argmax(-1).numpy()[known] == labels[known]).mean()
    assert ds["accuracy"].sel(model="s").item() == pytest.approx(acc)
    assert np.isnan(ds["correct"].sel(model="s", sample=2).item())
    assert np.isnan(prediction_agreement({"teacher": lt}, reference="teacher")["accuracy"].item())


# ------------------------------------------------------------------------------------ compare_models
def test_compare_vit_pair_and_store_round_trip(tmp_path):
    from workbench.store import open_store, save

    teacher = create_model("vit_demo").eval()
    small = create_model("vit_demo", depth=3, num_heads=2).eval()
    x = torch.randn(6, 1, 28, 28)
    ds = compare_models(teacher, {"copy": copy.deepcopy(teacher), "small": small}, x, labels=[0, 1, 2, -1, 4, 5],
                        **FAST)
    assert ds["model"].values.tolist() == ["teacher", "copy", "small"]
    assert ds["cka"].dims == ("model", "pooling", "estimator", "teacher_layer", "student_layer")
    assert ds.sizes["teacher_layer"] == 6 and ds.sizes["student_layer"] == 6
    assert ds["depth"].values.tolist() == [6, 6, 3]
    for pooling in ("mean", "token", "cls"):
        for model in ("teacher", "copy"):
            diag = np.diag(ds["cka"].sel(model=model, pooling=pooling).values[0])  # debiased
            np.testing.assert_allclose(diag, 1.0, atol=1e-9)
    assert np.isnan(ds["cka"].sel(model="small", student_layer=slice(3, None))).all()
    _pin_cka_and_js(ds, teacher, small, x)
    np.testing.assert_allclose(ds["block_cosine"].sel(model="copy").values, 1.0, atol=1e-6)
    assert np.isnan(ds["block_cosine"].sel(model="small")).all()
    assert ds["map_js"].dims == ("model", "sample", "layer", "head")
    np.testing.assert_allclose(ds["map_js"].sel(model="copy").values, 0.0, atol=1e-9)
    np.testing.assert_allclose(ds["map_spearman_avg"].sel(model="copy").values, 1.0, atol=1e-9)
    assert np.isnan(ds["map_js"].sel(model="small")).all()  # 2 vs 4 heads: head-averaged only
    assert np.isfinite(ds["map_js_avg"].sel(model="small", layer=[0, 1, 2])).all()
    assert np.isnan(ds["map_js_avg"].sel(model="small", layer=[3, 4, 5])).all()  # no blocks.3..5 in the student
    assert ds["agreement"].sel(model="copy").item() == 1.0 and ds["kl_mean"].sel(model="copy").item() == 0.0
    assert ds["attribution_map"].dims == ("model", "attribution", "sample", "y", "x")
    assert ds.sizes["y"] == 28 and ds.sizes["x"] == 28
    for a in ("integrated_gradients", "saliency", "rollout"):
        np.testing.assert_allclose(ds["attribution_spearman"].sel(model="copy", attribution=a).values, 1.0, atol=1e-9)
    assert ds["deletion"].dims == ("model", "attribution", "sample", "step") and ds.sizes["step"] == 9
    assert ds.attrs["analysis"] == "compare" and "ig_steps" in ds.attrs["config"]
    path = save(stamp_comparison(ds, ModelSource("vit_demo"), {"copy": ModelSource("vit_demo"),
                                                                "small": ModelSource("vit_demo", "small")},
                                 DataSource("random", range(6))), tmp_path / "cmp.nc")
    back = open_store(path, load=True)
    np.testing.assert_array_equal(back["cka"].values, ds["cka"].values)
    assert back["student_layer_name"].sel(model="small").values.tolist()[:4] == ["blocks.0", "blocks.1", "blocks.2", ""]
    assert back["sample"].values.tolist() == list(range(6)) and "small" in back.attrs["models"]


def _block_outputs_and_attention(model: nn.Module, x: torch.Tensor) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Independent of the workbench: every block's output and its attention probabilities, read with forward hooks
    from timm's own unfused Attention (its softmax output enters ``attn_drop``). ``(B, T, D)``, ``(B, H, T, T)``."""
    model = copy.deepcopy(model)
    outs, probs = [], []
    for block in model.blocks:
        block.attn.fused_attn = False
        block.register_forward_hook(lambda m, a, out: outs.append(out.detach().double().numpy()))
        block.attn.attn_drop.register_forward_hook(lambda m, a, out: probs.append(out.detach().double().numpy()))
    with torch.no_grad():
        model(x)
    return outs, probs


def _cka_by_hsic(a: np.ndarray, b: np.ndarray) -> float:
    """Biased linear CKA from the plain HSIC formula: tr(K H L H) / sqrt(tr(K H K H) tr(L H L H)), K = A Aᵀ."""
    n = a.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    k, l_ = a @ a.T, b @ b.T
    return np.trace(k @ h @ l_ @ h) / np.sqrt(np.trace(k @ h @ k @ h) * np.trace(l_ @ h @ l_ @ h))


def _pin_cka_and_js(ds, teacher: nn.Module, student: nn.Module, x: torch.Tensor) -> None:
    """A non-identical student's CKA (every layer pair, mean and CLS pooling) and head-averaged map JS divergence
    equal independently computed values, not only finite ones."""
    t_out, t_att = _block_outputs_and_attention(teacher, x)
    s_out, s_att = _block_outputs_and_attention(student, x)
    for i, a in enumerate(t_out):
        for j, b in enumerate(s_out):
            for pooling, pool in (("mean", lambda v: v[:, 1:].mean(1)), ("cls", lambda v: v[:, 0])):
                got = ds["cka"].sel(model="small", pooling=pooling, estimator="biased", teacher_layer=i,
                                    student_layer=j).item()
                assert got == pytest.approx(_cka_by_hsic(pool(a), pool(b)), rel=1e-5, abs=1e-7), (i, j, pooling)
    for i in range(len(s_att)):
        assert ds["map_student_block"].sel(model="small", layer=i).item() == f"blocks.{i}"
        p, q = t_att[i].mean(1), s_att[i].mean(1)  # head-averaged rows (B, T, T): each sums to 1
        js = np.array([[jensenshannon(p[b, r], q[b, r], base=2) ** 2 for r in range(p.shape[1])]
                       for b in range(p.shape[0])]).mean(1)
        np.testing.assert_allclose(ds["map_js_avg"].sel(model="small", layer=i).values, js, rtol=1e-5, atol=1e-7)
        assert js.min() > 1e-5  # the student's maps differ: a test that a divergence of 0 would fail


def test_block_correspondence_pairs_each_student_block_with_the_last_block_it_replaces():
    """A hand-built 3-block student = the teacher's first three blocks: its block i computes teacher block i's attention
    exactly, so declared one-to-one it scores ρ = 1; declared as replacing ((0,), (1, 2, 3), (4, 5)) its block 1 must be
    scored against teacher block 3 and block 2 against block 5 (scores recomputed here from the hooks)."""
    from methods.hooks import run_with_cache
    from workbench.figures import consecutive_groups

    torch.manual_seed(0)
    teacher = create_model("vit_demo").eval()
    student = copy.deepcopy(teacher)
    student.blocks = nn.Sequential(*[copy.deepcopy(teacher.blocks[i]) for i in range(3)])
    student.eval()
    x = torch.randn(5, 1, 28, 28)
    groups = {"one-to-one": ((0,), (1,), (2,)), "grouped": ((0,), (1, 2, 3), (4, 5))}
    ds = compare_models(teacher, {"one-to-one": copy.deepcopy(student), "grouped": student}, x, parts=("maps",),
                        correspondence=groups, **FAST)
    rho = ds["map_spearman_avg"]
    np.testing.assert_allclose(rho.sel(model="one-to-one", layer=[0, 1, 2]).values, 1.0, atol=1e-9)
    assert np.isnan(rho.sel(model="one-to-one", layer=[3, 4, 5])).all()
    assert ds["map_student_block"].sel(model="grouped").values.tolist() == ["blocks.0", "", "", "blocks.1", "",
                                                                            "blocks.2"]
    assert np.isnan(rho.sel(model="grouped", layer=[1, 2, 4])).all()
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(6)]
    _, t_cache = run_with_cache(teacher, x, names=names)
    _, s_cache = run_with_cache(student, x, names=names[:3])
    for t_block, s_block in ((0, 0), (3, 1), (5, 2)):
        want = token_map_agreement(t_cache[names[t_block]], s_cache[names[s_block]])["spearman_avg"]
        np.testing.assert_allclose(rho.sel(model="grouped", layer=t_block).values, want, atol=1e-9)
    assert (rho.sel(model="grouped", layer=[3, 5]) < 0.999).all()  # not the teacher's own block 1 / 2
    assert consecutive_groups(6, 2) == ((0, 1), (2, 3), (4, 5))
    with pytest.raises(ValueError, match="names 2 student blocks, the student has 3"):
        compare_models(teacher, {"s": student}, x, parts=("maps",), correspondence={"s": ((0, 1), (2, 3))}, **FAST)
    with pytest.raises(ValueError, match="not students"):
        compare_models(teacher, {"s": student}, x, parts=("maps",), correspondence={"t": ((0,),)}, **FAST)


def test_compare_vit_with_far_uses_saliency_maps():
    teacher = create_model("vit_demo").eval()
    far = replace_attention(teacher).eval()
    x = torch.randn(4, 1, 28, 28)
    ds = compare_models(teacher, {"far": far}, x, parts=("cka", "maps", "attributions"), **FAST)
    assert set(ds["map_measure"].sel(model="far").values.tolist()) == {"saliency"}
    assert set(ds["map_measure"].sel(model="teacher").values.tolist()) == {"saliency"}  # its own saliency vs attention
    assert np.isfinite(ds["map_js"].sel(model="far")).all() and np.isfinite(ds["map_js"].sel(model="teacher")).all()
    assert np.isfinite(ds["block_cosine"].sel(model="far")).all()  # FAR keeps the block shapes
    np.testing.assert_allclose(np.diag(ds["cka"].sel(model="teacher", pooling="mean", estimator="biased").values), 1.0)
    assert np.isnan(ds["attribution_map"].sel(model="far", attribution="rollout")).all()
    assert "far" in ds.attrs["notes"] and "rollout" in ds.attrs["notes"]
    assert "deletion" not in ds and "pred" not in ds


def test_attributions_without_integrated_gradients_have_no_ig_gap_or_infidelity():
    """Saliency and rollout alone (infidelity left on): no IG, so no completeness gap and no infidelity -- absent, not
    NaN rows that the finite check before storing would refuse; the maps and curves are there."""
    teacher = create_model("vit_demo").eval()
    x = torch.randn(3, 1, 28, 28)
    ds = compare_models(teacher, {"twin": teacher}, x, parts=("attributions", "faithfulness"),
                        attributions=("saliency", "rollout"), steps=4)
    assert not {"ig_delta", "ig_steps", "infidelity"} & set(ds.data_vars)
    assert np.isfinite(ds["attribution_map"]).all() and np.isfinite(ds["deletion_auc"]).all()
    np.testing.assert_array_equal(ds["attribution_map"].sel(model="twin"), ds["attribution_map"].sel(model="teacher"))
    stamped = stamp_comparison(ds, ModelSource("vit_demo"), {"twin": ModelSource("vit_demo")}, DataSource("random", range(3)))
    assert stamped.sizes["sample"] == 3


def test_compare_cnn_pair_leaves_out_maps_with_a_reason():
    teacher = create_model("cnn_demo").eval()
    student = create_model("cnn_demo", channels=(8, 16, 32, 64)).eval()
    x = torch.randn(5, 1, 28, 28)
    ds = compare_models(teacher, {"copy": copy.deepcopy(teacher), "narrow": student}, x, **FAST)
    assert "map_js" not in ds and "no attention" in ds.attrs["skipped"]
    assert ds["teacher_layer_name"].values.tolist() == ["stages.0", "stages.1", "stages.2", "stages.3"]
    np.testing.assert_allclose(np.diag(ds["cka"].sel(model="copy", pooling="token", estimator="debiased").values), 1.0,
                               atol=1e-9)
    assert np.isnan(ds["cka"].sel(pooling="cls")).all()
    assert np.isfinite(ds["cka"].sel(model="narrow", pooling=["mean", "token"])).all()
    assert np.isnan(ds["attribution_map"].sel(attribution="rollout")).all()
    assert np.isfinite(ds["deletion_auc"].sel(attribution="integrated_gradients")).all()
    _pin_deletion(ds, "narrow", student, x)


def _pin_deletion(ds, label: str, model: nn.Module, x: torch.Tensor) -> None:
    """The deletion curves and their AUC equal a by-hand computation: the stored map's top pixels set to 0 (the
    dataset mean in normalised space), one forward per step, softmax probability of the explained class."""
    h, w = x.shape[-2:]
    fraction = ds["fraction"].values
    for attribution in ("integrated_gradients", "saliency"):
        for s in range(x.shape[0]):
            order = np.argsort(-ds["attribution_map"].sel(model=label, attribution=attribution).values[s].ravel(),
                               kind="stable")  # most important pixel first
            steps = []
            for f in fraction:
                img = x[s].clone().reshape(x.shape[1], -1)
                img[:, torch.as_tensor(order[: int(round(f * h * w))])] = 0.0
                steps.append(img.reshape(x.shape[1:]))
            with torch.no_grad():
                prob = F.softmax(model(torch.stack(steps)).double(), -1)[:, int(ds["target"].values[s])].numpy()
            got = ds["deletion"].sel(model=label, attribution=attribution).values[s]
            np.testing.assert_allclose(got, prob, rtol=1e-4, atol=1e-6)
            assert ds["deletion_auc"].sel(model=label, attribution=attribution).values[s] == pytest.approx(
                np.trapezoid(prob, fraction), rel=1e-4)


def _swin28():
    """A 28 x 28 Swin (2 stages of 2 x 2 windows of 7 x 7 tokens, then one), to compare with the 28 x 28 ViT and CNN."""
    return create_model("swin_demo", img_size=28, window_size=7, embed_dim=32, depths=(2, 2), num_heads=(2, 4)).eval()


def test_compare_across_families_and_timm_names():
    x = torch.randn(4, 1, 28, 28)
    ds = compare_models(create_model("vit_demo").eval(), {"swin": _swin28(),
                                                          "cnn": create_model("cnn_demo").eval()}, x,
                        parts=("cka", "maps", "predictions"))
    assert ds["depth"].values.tolist() == [6, 4, 4]
    assert ds["student_layer_name"].sel(model="swin").values.tolist()[:4] == [
        "layers.0.blocks.0", "layers.0.blocks.1", "layers.1.blocks.0", "layers.1.blocks.1"]
    assert np.isfinite(ds["cka"].sel(model=["swin", "cnn"], pooling="token", student_layer=[0, 1, 2, 3])).all()
    assert np.isnan(ds["map_js_avg"].sel(model=["swin", "cnn"])).all()  # no token maps that line up
    swin = _swin28()
    ds = compare_models(swin, {"copy": copy.deepcopy(swin), "other": _swin28()}, x,
                        parts=("cka", "maps"))
    assert ds["layer_name"].values.tolist()[2] == "layers.1.blocks.0"
    assert ds["num_heads"].values.tolist() == [2, 2, 4, 4]
    np.testing.assert_allclose(ds["map_js_avg"].sel(model="copy").values, 0.0, atol=1e-9)  # windows x heads line up
    np.testing.assert_allclose(ds["map_js"].sel(model="copy", layer=[2, 3]).values, 0.0, atol=1e-9)
    assert np.isfinite(ds["map_js"].sel(model="other", head=[0, 1])).all()
    assert np.isnan(ds["map_js"].sel(layer=[0, 1], head=[2, 3])).all()  # stage 0 has 2 heads
    np.testing.assert_allclose(np.diag(ds["cka"].sel(model="copy", pooling="token", estimator="debiased").values), 1.0,
                               atol=1e-9)
    y = torch.randn(2, 3, 32, 32)
    tiny = create_model("deit_tiny_patch16_224", img_size=32).eval()
    small = create_model("deit_small_patch16_224", img_size=32).eval()
    ds = compare_models(tiny, {"deit_small": small}, y, parts=("cka", "maps", "predictions"))
    assert ds.sizes["teacher_layer"] == 12 and ds.sizes["head"] == 3
    assert np.isfinite(ds["map_js_avg"]).sel(model="deit_small").all()
    assert np.isnan(ds["cka"].sel(estimator="debiased", pooling="mean")).all()  # 2 images: debiased needs n >= 4
    assert np.isfinite(ds["cka"].sel(estimator="debiased", pooling="token")).all()  # 2 images x 4 tokens


def test_compare_models_rejects_bad_input():
    t = create_model("vit_demo").eval()
    x = torch.randn(2, 1, 28, 28)
    with pytest.raises(ValueError, match="training mode"):
        compare_models(t, {"s": create_model("vit_demo")}, x)
    with pytest.raises(ValueError, match="teacher's label"):
        compare_models(t, {"teacher": t}, x)
    with pytest.raises(ValueError, match="unknown parts"):
        compare_models(t, {"s": t}, x, parts=("cka", "gradcam"))
    with pytest.raises(ValueError, match="labels must be"):
        compare_models(t, {"s": t}, x, labels=[1, 2, 3])
