"""workbench.explain: each explainer against an independent computation, the faithfulness tests both ways.

Tiny random-weight models (seeded, CPU, no downloads): the demo ViT at depth 2 or 3, timm's resnet18 at 64 px.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import xarray as xr

import methods.teachers  # noqa: F401  (registers vit_demo with timm)
from workbench.analysis import examples
from workbench.analysis.attribution import rollout_map
from workbench.explain import EXPLAINERS, Maps, attribute, explainer, load_all
from workbench.explain.faithfulness import perturbation, perturbation_curves, randomization, randomized


def _vit(depth: int = 2, dtype=torch.float32) -> nn.Module:
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_demo", depth=depth).eval().to(dtype)


def _images(n: int = 3, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(1), dtype=dtype)


# ------------------------------------------------------------------------------------------ explainers
def _reference_generic(model: nn.Module, image: torch.Tensor, cls: int) -> torch.Tensor:
    """Chefer et al. (ICCV 2021) written out: plain forward hooks on each block's attn_drop, one image at a time."""
    attns = []

    def keep(_module, _inputs, out):
        out.retain_grad()
        attns.append(out)

    handles = []
    for blk in model.blocks:
        blk.attn.fused_attn = False
        handles.append(blk.attn.attn_drop.register_forward_hook(keep))
    try:
        model(image[None])[0, cls].backward()
    finally:
        for h in handles:
            h.remove()
        for blk in model.blocks:
            blk.attn.fused_attn = True
    t = attns[0].shape[-1]
    r = torch.eye(t, dtype=torch.float64)
    for a in attns:  # forward order
        cam = torch.zeros(t, t, dtype=torch.float64)
        for h in range(a.shape[1]):
            cam += (a.grad[0, h].double() * a[0, h].detach().double()).clamp(min=0)
        r = r + (cam / a.shape[1]) @ r
    return r[0, 1:].reshape(7, 7)  # CLS row over the 7 x 7 patches


def test_generic_attention_equals_a_hand_written_reference():
    model, x = _vit(2, torch.float64), _images(3, torch.float64)
    ds = attribute(model, x, method="generic_attention", target=torch.tensor([0, 3, 9]))
    for i, cls in enumerate([0, 3, 9]):
        ref = _reference_generic(model, x[i], cls).numpy()
        assert np.abs(ref).max() > 1e-3  # not trivially zero
        np.testing.assert_allclose(ds["relevance"].values[i], ref, rtol=1e-5, atol=1e-7)


def test_rollout_equals_todays_implementation():
    model, x = _vit(3), _images(4)
    ds = attribute(model, x, method="rollout")
    np.testing.assert_array_equal(ds["relevance_pixel"].values, rollout_map(model, x).numpy())


def test_raw_attention_is_the_attention_extractors_last_block_head_mean():
    from workbench.analysis.attention import extract_attention

    model, x = _vit(3), _images(3)
    ds = attribute(model, x, method="raw_attention")
    ref = extract_attention(model, x, layers=[-1])["cls_attention"].isel(layer=0).mean("head")
    np.testing.assert_allclose(ds["relevance"].values, ref.values, rtol=1e-5, atol=1e-7)


def test_legrad_equals_a_hand_written_reference():
    """LeGrad (torchcam's rule) by hand: per block, the head applied to that block's output, the gradient of the
    class score w.r.t. the block's attention, ReLU, mean over heads and queries, then over blocks."""
    model, x = _vit(2, torch.float64), _images(2, torch.float64)
    ds = attribute(model, x, method="legrad", target=torch.tensor([1, 6]))
    for i, cls in enumerate([1, 6]):
        attns, outs = [], []
        handles = [b.attn.attn_drop.register_forward_hook(lambda _m, _i, o: attns.append(o)) for b in model.blocks]
        handles += [b.register_forward_hook(lambda _m, _i, o: outs.append(o)) for b in model.blocks]
        for b in model.blocks:
            b.attn.fused_attn = False
        model(x[i:i + 1])
        for h in handles:
            h.remove()
        for b in model.blocks:
            b.attn.fused_attn = True
        maps = []
        for a, o in zip(attns, outs):
            score = model.head(model.norm(o)[:, 0])[0, cls]  # vit_demo pools the CLS token
            (g,) = torch.autograd.grad(score, a, retain_graph=True)
            maps.append(g[0].clamp(min=0).mean((0, 1))[1:])
        ref = torch.stack(maps).mean(0).reshape(7, 7)
        assert ref.abs().max() > 0
        np.testing.assert_allclose(ds["relevance"].values[i], ref.numpy(), rtol=1e-5, atol=1e-9)


def test_gradcam_is_the_grad_cam_packages_output():
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    model, x = _vit(2), _images(3)
    target = torch.tensor([1, 4, 7])
    ds = attribute(model, x, method="gradcam", target=target)

    def reshape(t):  # (B, 1 + 49, D) -> (B, D, 7, 7)
        return t[:, 1:].transpose(1, 2).reshape(t.shape[0], -1, 7, 7)

    with GradCAM(model, [model.blocks[-1].norm1], reshape_transform=reshape) as cam:
        theirs = cam(input_tensor=x, targets=[ClassifierOutputTarget(int(t)) for t in target])
    np.testing.assert_array_equal(ds["relevance_pixel"].values, theirs)
    # the patch map by hand: ReLU(sum_c mean_yx(dy/dA_c) A_c) on the last block's LN1 tokens
    acts = []

    def keep(_module, _inputs, out):
        out.retain_grad()
        acts.append(out)

    h = model.blocks[-1].norm1.register_forward_hook(keep)
    model(x).gather(1, target[:, None]).sum().backward()
    h.remove()
    a, g = reshape(acts[0]).detach(), reshape(acts[0].grad)
    ref = F.relu((g.mean((2, 3), keepdim=True) * a).sum(1))
    np.testing.assert_allclose(ds["relevance"].values, ref.numpy(), rtol=1e-4, atol=1e-6)


def test_gradcam_on_a_cnn_reads_its_last_stage():
    import timm
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    torch.manual_seed(0)
    model = timm.create_model("resnet18", num_classes=5).eval()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    ds = attribute(model, x, method=["gradcam", "rollout"], target=2)
    assert list(ds["explainer"].values) == ["gradcam"] and "no tokens" in ds.attrs["not_applicable"]
    with GradCAM(model, [model.layer4]) as cam:
        theirs = cam(input_tensor=x, targets=[ClassifierOutputTarget(2)] * 2)
    np.testing.assert_array_equal(ds["relevance_pixel"].sel(explainer="gradcam").values, theirs)
    assert ds.sizes["y"] == ds.sizes["x"] == 2  # layer4's 2 x 2 map at 64 px


def test_integrated_gradients_completeness():
    model, x = _vit(2), _images(3)
    target = torch.tensor([2, 5, 8])
    ds = attribute(model, x, method="ig", target=target, n_steps=50)
    with torch.no_grad():
        gap = (model(x) - model(torch.zeros_like(x))).gather(1, target[:, None])[:, 0].double().numpy()
    total = ds["relevance_pixel"].values.astype(np.float64).sum((1, 2))
    # completeness within 1 % of f(x) - f(baseline) (50 Gauss-Legendre nodes)
    np.testing.assert_allclose(total, gap, rtol=1e-2, atol=1e-4)
    np.testing.assert_allclose(ds["relevance"].values.sum((1, 2)), total, rtol=1e-4)  # patch sums keep the total
    assert (ds["ig_delta"].values < 1e-2).all()


def test_attention_methods_say_why_they_do_not_apply():
    far = examples.far()
    with pytest.raises(ValueError, match="no attention probabilities"):
        attribute(far, _images(2), method="generic_attention")
    ds = attribute(far, _images(2), method=["rollout", "saliency", "gradcam", "legrad"])
    assert list(ds["explainer"].values) == ["saliency", "gradcam"]
    assert not np.isnan(ds["relevance"].values).any()
    with pytest.raises(ValueError, match="lxt"):
        attribute(_vit(), _images(1), method="attnlrp")


def test_bad_calls_are_refused():
    model, x = _vit(), _images(2)
    with pytest.raises(ValueError, match="unknown explainer"):
        attribute(model, x, method="nope")
    with pytest.raises(ValueError, match="n_step"):
        attribute(model, x, method="saliency", n_step=3)
    with pytest.raises(ValueError, match="eval"):
        attribute(model.train(), x, method="saliency")


ALLOWED_DIMS = {"explainer", "sample", "y", "x", "img_y", "img_x"}


@pytest.mark.parametrize("name", sorted(load_all()))
def test_every_explainer_on_the_vit_keeps_the_shared_guarantees(name):
    """One call for every registered explainer: no side effects, deterministic, finite, the shared dims, the
    derived grid as documented; one that does not apply raises with its reason."""
    model, x = _vit(3), _images(2)
    why = EXPLAINERS[name].applies(model)
    if why:
        with pytest.raises(ValueError, match="does not apply"):
            attribute(model, x, method=name)
        return
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ds = attribute(model, x, method=name, n_steps=8) if name == "ig" else attribute(model, x, method=name)
    assert set(ds.dims) <= ALLOWED_DIMS and ds.attrs["analysis"] == "explain" and int(ds["stride"]) == 4
    assert np.isfinite(ds["relevance"].values).all() and np.isfinite(ds["relevance_pixel"].values).all()
    assert not model.training and all(m.fused_attn for m in model.modules() if hasattr(m, "fused_attn"))
    assert all(p.grad is None for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    again = attribute(model, x, method=name, n_steps=8) if name == "ig" else attribute(model, x, method=name)
    xr.testing.assert_identical(ds, again)
    patch, pixel = ds["relevance"].values, ds["relevance_pixel"].values
    if EXPLAINERS[name].native == "pixel":  # summed per 4 x 4 patch
        np.testing.assert_allclose(patch, pixel.reshape(2, 7, 4, 7, 4).sum((2, 4)), rtol=1e-5, atol=1e-7)
    elif name != "gradcam":  # repeated over each patch's pixels (Grad-CAM's pixel map is the package's own)
        np.testing.assert_array_equal(pixel, patch.repeat(4, 1).repeat(4, 2))


@pytest.mark.parametrize("form", ["sparsifiner", "branched", "sa_resnet"])
def test_other_forms_get_maps_or_reasons(form):
    model = getattr(examples, form)()
    x = torch.randn(2, 1, 48 if form == "sa_resnet" else 28, 48 if form == "sa_resnet" else 28,
                    generator=torch.Generator().manual_seed(4))
    names = [n for n in sorted(load_all()) if n != "ig"]
    ds = attribute(model, x, method=names)
    skipped = json.loads(ds.attrs["not_applicable"])
    assert set(ds["explainer"].values) | set(skipped) == set(names) and all(skipped.values())
    assert np.isfinite(ds["relevance"].values).all()
    expected = {"sparsifiner": {"generic_attention", "rollout", "raw_attention", "legrad", "gradcam"},
                "branched": {"gradcam"}, "sa_resnet": {"gradcam"}}[form]
    assert expected <= set(ds["explainer"].values)


# ------------------------------------------------------------------------------------------ perturbation
class Planted(nn.Module):
    """Class 0's logit is a weighted sum of the mean of a few 4x4 patches of a 16x16 image; class 1's is fixed."""

    def __init__(self, weights: torch.Tensor, bias: float):
        super().__init__()
        self.weights, self.bias = weights, bias  # (4, 4) per patch, mostly 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        means = F.avg_pool2d(x[:, :1], 4)[:, 0]  # (B, 4, 4)
        z = (means * self.weights).sum((1, 2))
        return torch.stack([z, torch.full_like(z, self.bias)], 1)


def test_perturbation_ranks_the_planted_answer_both_ways():
    g = torch.Generator().manual_seed(3)
    w = torch.zeros(4, 4)
    w.view(-1)[torch.randperm(16, generator=g)[:5]] = torch.tensor([4.0, 3.0, 2.0, 1.5, 1.0])
    model = Planted(w, bias=5.0).eval()
    x = 0.5 + torch.rand(6, 1, 16, 16, generator=g)  # positive pixels: removing (zeroing) a planted patch lowers z
    right = (F.avg_pool2d(x, 4)[:, 0] * w)  # each patch's exact contribution
    maps = torch.stack([right, -right])
    expl = xr.Dataset({"relevance": (("explainer", "sample", "y", "x"), maps.numpy()), "target": ("sample", np.zeros(6, int))},
                      coords={"explainer": ["right", "reversed"], "sample": np.arange(6)})
    auc = perturbation(model, x, expl)["auc"].mean("sample")
    # positive: removing the right patches first drops the probability fastest (lower is better)
    assert auc.sel(explainer="right", order="positive") < auc.sel(explainer="reversed", order="positive") - 0.1
    # negative: removing the right map's least relevant patches first keeps it (higher is better)
    assert auc.sel(explainer="right", order="negative") > auc.sel(explainer="reversed", order="negative") + 0.1
    # the accuracy score: the prediction (class 0) falls once the planted patches are gone
    acc = perturbation_curves(model, x, right, torch.zeros(6, dtype=torch.long), score="accuracy")
    assert acc[:, 0].all() and not acc[:, -1].any()
    rev = perturbation_curves(model, x, -right, torch.zeros(6, dtype=torch.long), score="accuracy")
    assert rev[:, 5].all()  # half the (irrelevant) patches gone: still class 0


# ------------------------------------------------------------------------------------------ randomisation
@pytest.fixture
def blind_explainer():
    """A map of the image alone (patch means of |x|): it ignores the model, so it must fail the check."""

    @explainer("blind_test_only")
    def blind(model, images, target) -> Maps:
        return Maps(pixel=images.abs().sum(1))

    yield "blind_test_only"
    EXPLAINERS.pop("blind_test_only")


def test_randomisation_check_both_ways(blind_explainer):
    model, x = _vit(3), _images(8)
    out = randomization(model, x, ["generic_attention", blind_explainer], blocks=3)
    assert out["verdict"].sel(explainer="generic_attention") == "changes"
    assert out["verdict"].sel(explainer=blind_explainer) == "unchanged"
    np.testing.assert_allclose(out["spearman"].sel(explainer=blind_explainer).values, 1.0)


def test_randomized_copy_resets_only_the_top():
    model = _vit(3)
    rnd = randomized(model, blocks=1, seed=0)
    same = [n for n, p in model.named_parameters() if torch.equal(p, rnd.get_parameter(n))]
    # LayerNorms reset to (1, 0): what a random-weight model already holds; every other top weight is new
    assert not any(n.startswith(("head.", "blocks.2.")) and ".norm" not in n for n in same)
    assert any(n.startswith("blocks.1.") for n in same) and "patch_embed.proj.weight" in same


# ------------------------------------------------------------------------------------------ command line
def test_workbench_explain_writes_a_stamped_store(tmp_path, capsys, monkeypatch):
    from workbench.cli import main
    from workbench.store import open_store

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    out = tmp_path / "e.nc"
    rc = main(["explain", "--method", "rollout,saliency,attnlrp", "--model", "vit_demo", "--seed", "0",
               "--images", "demo:val[:4]", "--perturbation", "--out", str(out), "--device", "cpu"])
    assert rc == 0 and "not applicable: attnlrp" in capsys.readouterr().out
    ds = open_store(out, load=True)
    assert list(ds["explainer"].values) == ["rollout", "saliency"] and ds.attrs["model_name"] == "vit_demo"
    assert ds["perturbation_auc"].dims == ("explainer", "order", "sample") and ds.sizes["sample"] == 4
    assert main(["explain", "--method", "nope", "--model", "vit_demo", "--out", str(tmp_path / "x.nc")]) == 2
    assert "unknown explainer 'nope'" in capsys.readouterr().err and not (tmp_path / "x.nc").exists()
