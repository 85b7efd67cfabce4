"""Non-deep ViT extractors (workbench.analysis.nondeep) and the shared attention extractor on branched and collapsed
models, against independent computations; the plots draw from synthetic Datasets."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
import xarray as xr

import methods.nondeep as nd
from methods.hooks import run_with_cache
from workbench.analysis import get_extractor

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(img_size=16, patch_size=4, embed_dim=16, depth=6, num_heads=2, num_classes=5, in_chans=1)


def _jitter(module: torch.nn.Module, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def branched(n: int, lam: float):
    """A branched model of a perturbed small ViT (biases, LN affines non-zero), branches moved apart, λ set."""
    torch.manual_seed(0)
    teacher = timm.create_model("vit_demo", **SMALL).eval()
    _jitter(teacher, 0.2, 1)
    model = nd.branch(teacher, n).eval()
    _jitter(model.blocks, 0.1, 2)
    nd.set_lambda(model, lam)
    return model


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(3, 1, 16, 16, generator=torch.Generator().manual_seed(3))


# ------------------------------------------------------------------------------------ similarity
def test_weight_similarity_against_flattened_cosines(images):
    model = branched(3, 1.0)
    ds = get_extractor("branch_weight_similarity")(model, images)
    assert dict(ds["cosine"].sizes) == {"layer": 2, "module": 4, "branch_i": 3, "branch_j": 3}
    blk = model.blocks[1]
    fc2 = [br.mlp.fc2.weight.flatten().double() for br in blk.branches]
    ov = [torch.einsum("hdi,hdo->hio", br.attn.qkv.weight[32:48].view(2, 8, 16).double(),  # W^V_h: (H, d, D)
                       br.attn.proj.weight.t().reshape(2, 8, 16).double()).flatten() for br in blk.branches]
    for mod, mats in (("fc2", fc2), ("ov", ov)):
        want = F.cosine_similarity(mats[0], mats[2], dim=0).item()
        # the extractor forms W^V_h W^O_h in the model's float32 (as the model computes it); this reference in float64:
        # cosines agree to float32 rounding (~1e-8 seen), not to 1e-9 on every CPU (another kernel: 1.1e-9 apart)
        assert ds["cosine"].sel(layer=1, module=mod, branch_i=0, branch_j=2).item() == pytest.approx(want, abs=1e-6)
    # cka of fc1: cosine of the Gram matrices W₁ᵀW₁ (invariant to permuting hidden units)
    perm = torch.randperm(blk.branches[1].mlp.fc1.out_features)
    with torch.no_grad():
        blk.branches[1].mlp.fc1.weight.copy_(blk.branches[0].mlp.fc1.weight[perm])
    ds = get_extractor("branch_weight_similarity")(model, images, layers=[1])
    assert ds["cka"].sel(layer=1, module="fc1", branch_i=0, branch_j=1).item() == pytest.approx(1.0, abs=1e-9)
    assert ds["cosine"].sel(layer=1, module="fc1", branch_i=0, branch_j=1).item() < 0.5
    assert np.allclose(ds["lam"].values, 1.0)


def test_feature_similarity_against_recomputed_branch_outputs(images):
    model = branched(2, 0.5)
    ds = get_extractor("branch_feature_similarity")(model, images)
    assert dict(ds["cosine"].sizes) == {"sample": 3, "layer": 3, "module": 2, "branch_i": 2, "branch_j": 2}
    # recompute block 2's branch FFN outputs by hand from its LN2 output (Eq. 8-9 at λ = 0.5)
    _, cache = run_with_cache(model, images, names=["blocks.2.hook_mlp_in"])
    h = cache["blocks.2.hook_mlp_in"]
    blk = model.blocks[2]
    pre = [br.mlp.fc1(h) for br in blk.branches]
    outs = [br.mlp.fc2(F.gelu(0.5 * pre[b] + 0.5 * (pre[0] + pre[1]))) for b, br in enumerate(blk.branches)]
    cos = F.cosine_similarity(outs[0], outs[1], dim=-1).mean(-1)  # (B,): mean over tokens
    np.testing.assert_allclose(ds["cosine"].sel(layer=2, module="ffn", branch_i=0, branch_j=1).values, cos.detach().numpy(),
                               atol=1e-5)
    # linear CKA over all (image, token) rows, directly from its definition
    x, y = (o.detach().double().reshape(-1, o.shape[-1]) for o in outs)
    x, y = x - x.mean(0), y - y.mean(0)
    cka = (x.t() @ y).square().sum() / ((x.t() @ x).square().sum().sqrt() * (y.t() @ y).square().sum().sqrt())
    assert ds["cka"].sel(layer=2, module="ffn", branch_i=0, branch_j=1).item() == pytest.approx(cka.item(), abs=1e-6)
    # the extractor's token-mean cosine averaged over images is methods.nondeep.feature_similarity
    ref = nd.feature_similarity(model, images)
    np.testing.assert_allclose(ds["cosine"].mean("sample").values, ref.numpy(), atol=1e-6)


# ------------------------------------------------------------------------------------ λ
def test_join_lambda_reads_the_hook_and_the_schedules(images):
    model = branched(3, 0.3)
    ds = get_extractor("join_lambda")(model, images, warmup_steps=10, adjust_steps=5)
    np.testing.assert_allclose(ds["lambda"].values, 0.3, atol=1e-7)
    np.testing.assert_allclose(ds["rectification"].values, math.sqrt(1 + 2 * 0.09), atol=1e-6)
    assert ds.sizes["step"] == 16 and ds["t"].values[-1] == pytest.approx(1.5)
    for s in nd.SCHEDULES:
        want = [nd.lambda_schedule(s, k / 10) for k in range(16)]
        np.testing.assert_allclose(ds[f"schedule_{s}"].values, want)
    assert ds["schedule_exponential"].values[9] < 1 and ds["schedule_exponential"].values[10] == 1.0


# ------------------------------------------------------------------------------------ collapse error
@pytest.mark.parametrize("n", [2, 3])
def test_collapse_error_exact_and_paper_formulas(n, images):
    model = branched(n, 1.0)
    targets = torch.tensor([0, 1, 2])
    ds = get_extractor("collapse_error")(model, images, targets=targets)
    assert list(ds["model"].values) == list(nd.COLLAPSE_VARIANTS)
    assert ds["logit_error"].sel(model="exact").max() <= 1e-10  # float64, all biases, the trained-style branches
    assert ds["block_error"].sel(model="exact").max() <= 1e-10
    assert ds["logit_error_float32"].sel(model="exact").max() <= 1e-5
    for v in ("paper_vo", "paper_scale", "paper"):
        assert ds["logit_error"].sel(model=v).max() > 1e-3, v
    assert ds["logit_error"].sel(model="paper_qk_bias").max() > 1e-8  # the per-key bias term is not zero
    # per image: max |Δ logit| / max |logit| of the branched model, recomputed in float64
    ref64 = copy.deepcopy(model).double()
    x64 = images.double()
    with torch.no_grad():
        ref = ref64(x64)
        for v in nd.COLLAPSE_VARIANTS:
            got = nd.collapse(ref64, v)(x64)
            want = (got - ref).abs().amax(-1) / ref.abs().amax(-1)
            np.testing.assert_allclose(ds["logit_error"].sel(model=v).values, want.numpy(), rtol=1e-6, atol=1e-15)
    with torch.no_grad():
        want = nd.collapse(model, "paper")(images).argmax(-1) == targets
    np.testing.assert_array_equal(ds["correct"].sel(model="paper").values, want.numpy())
    assert ds.attrs["form"] == "auto"


def test_collapse_error_refuses_half_joined_and_collapses_unjoined_wide(images):
    with pytest.raises(ValueError, match="collapse before joining is complete"):
        get_extractor("collapse_error")(branched(2, 0.5), images)
    ds = get_extractor("collapse_error")(branched(2, 0.0), images)  # no joining: the exact wide model
    assert list(ds["model"].values) == ["exact"] and ds.attrs["form"] == "wide"
    assert ds["logit_error"].max() <= 1e-10


def test_extractors_refuse_a_model_without_branches(images):
    col = nd.collapse(branched(2, 1.0))
    for kind in ("branch_weight_similarity", "branch_feature_similarity", "join_lambda", "collapse_error"):
        with pytest.raises(ValueError, match="no parallel blocks"):
            get_extractor(kind)(col.eval(), images)


# ------------------------------------------------------------------------------------ attention
def test_attention_extractor_on_branched_model_is_the_joined_softmax(images):
    """The shared extractor adds a branch dim; its maps are softmax of the joined, rectified scores (Eq. 5)."""
    lam, n = 0.4, 3
    model = branched(n, lam)
    ds = get_extractor("attention")(model, images, layers=[1])
    assert ds["attention"].dims == ("sample", "layer", "branch", "head", "query", "key")
    assert list(ds["branch"].values) == [0, 1, 2]
    _, cache = run_with_cache(model, images, names=["blocks.1.hook_mixer_in"])
    h = cache["blocks.1.hook_mixer_in"]
    blk = model.blocks[1]
    qk = [br.attn.project(h)[:2] for br in blk.branches]
    scores = [q @ k.transpose(-2, -1) for q, k in qk]
    for b in range(n):
        joined = scores[b] + lam * sum(scores[c] for c in range(n) if c != b)  # Eq. 5 for n branches
        want = (joined / (math.sqrt(1 + (n - 1) * lam ** 2) * math.sqrt(blk.branches[0].attn.head_dim))).softmax(-1)
        np.testing.assert_allclose(ds["attention"].sel(layer=1, branch=b).values, want.detach().numpy(), atol=1e-5)


def test_joined_branch_maps_equal_the_collapsed_models_maps(images):
    """At λ = 1 every branch attends alike, and the collapsed (plain timm) model's maps are those maps."""
    model = branched(2, 1.0)
    att = get_extractor("attention")
    br = att(model, images)
    col = att(nd.collapse(model).eval(), images)
    assert "branch" not in col.dims and col.sizes["layer"] == 3
    np.testing.assert_allclose(br["attention"].sel(branch=0).values, br["attention"].sel(branch=1).values, atol=1e-6)
    np.testing.assert_allclose(col["attention"].values, br["attention"].sel(branch=0).values, atol=1e-5)


# ------------------------------------------------------------------------------------ plots
def test_plots_draw_from_datasets():
    import matplotlib.pyplot as plt

    from workbench.plots.nondeep import pair_mean, plot_lambda_schedules, plot_similarity, plot_similarity_summary

    rng = np.random.default_rng(0)
    sim = rng.uniform(-1, 1, (2, 3, 4, 3, 3))
    sim[0, :, :, 2, :] = sim[0, :, :, :, 2] = np.nan  # model 0 has 2 branches
    sim[1, 2] = np.nan  # model 1 has 2 blocks
    ds = xr.Dataset({"cosine": (("model", "layer", "module", "branch_i", "branch_j"), sim)},
                    coords={"model": ["a", "b"], "layer": [0, 1, 2], "module": ["qk", "ov", "fc1", "fc2"],
                            "branch_i": [0, 1, 2], "branch_j": [0, 1, 2], "note": ("model", ["x", "y"])})
    mean, lo, hi = pair_mean(ds["cosine"].sel(model="b"))
    assert mean.sel(layer=0, module="qk").item() == pytest.approx(np.mean([sim[1, 0, 0, 0, 1], sim[1, 0, 0, 0, 2],
                                                                           sim[1, 0, 0, 1, 2]]))
    pairs = [sim[1, 0, 0, 0, 1], sim[1, 0, 0, 0, 2], sim[1, 0, 0, 1, 2]]  # the upper triangle: i < j
    assert (lo.sel(layer=0, module="qk").item(), hi.sel(layer=0, module="qk").item()) == pytest.approx(
        (min(pairs), max(pairs)))
    assert np.isnan(mean.sel(layer=2)).all()  # model b has no block 2
    mean_a = pair_mean(ds["cosine"].sel(model="a"))[0]  # model a: 2 branches, one pair (0, 1)
    np.testing.assert_allclose(mean_a.values, sim[0, :, :, 0, 1])
    figs = [plot_similarity(ds, "cosine", title="t"), plot_similarity_summary(ds, {"cosine": "weights"}, title="t")]
    t = np.linspace(0, 1.25, 11)
    lam = np.stack([np.minimum(t, 1), np.ones_like(t)])
    figs.append(plot_lambda_schedules(xr.Dataset({"lam": (("schedule", "t"), lam)},
                                                 coords={"schedule": ["linear", "instant"], "t": t})))
    small = ds.assign(cosine=ds["cosine"] * 0.01)  # near-0 similarities (nondeep.fig5): the scale follows the data
    fig = plot_similarity_summary(small, {"cosine": "weights"}, limit=None)
    top = max(float(np.nanmax(np.abs(pair_mean(small["cosine"].sel(model=m))[0].values))) for m in ("a", "b"))
    vmax = fig.axes[0].images[0].norm.vmax
    assert top <= vmax < 2 * top and "not ±1" in fig.axes[-1].get_ylabel()
    figs.append(fig)
    for fig in figs:
        assert fig.axes
        plt.close(fig)
