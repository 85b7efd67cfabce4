"""Gradient-saliency token dependency (workbench.analysis.dependency) against autograd's Jacobian."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from methods.far import apply_masks, replace_attention
from workbench.analysis.dependency import (
    HeadFn,
    block_inputs,
    dependency,
    dependency_captum,
    dependency_factored,
    dependency_loop,
    head_output_fn,
    model_dependency,
)

TINY = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5)
T = (16 // 4) ** 2 + 1


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    teacher = VisionTransformer(**TINY).double().eval()
    return {"teacher": teacher, "far": replace_attention(teacher).eval()}


@pytest.fixture(scope="module")
def images():
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def jacobian_reference(fn, x: torch.Tensor) -> torch.Tensor:
    """dependency[b, h, q, k] = ‖Σ_c ∂y[b, q, h, c] / ∂x[b, k, :]‖ from the full Jacobian."""
    jac = torch.autograd.functional.jacobian(lambda inp: fn(inp), x, vectorize=True)  # (B, T, N, C, B, T, D)
    jac = jac.sum(3)  # Σ_c: (B, T_q, N, B, T_k, D)
    b = torch.arange(x.shape[0])
    same = jac[b, :, :, b]  # same sample: (B, T_q, N, T_k, D)
    return same.norm(dim=-1).permute(0, 2, 1, 3)  # (B, N, T_q, T_k)


def test_block_inputs(models, images):
    model = models["far"]
    xs = block_inputs(model, images)
    assert len(xs) == 2 and xs[0].shape == (2, T, 16)
    torch.testing.assert_close(xs[1], model.blocks[0](xs[0]))


@pytest.mark.parametrize("kind", ["teacher", "far"])
@pytest.mark.parametrize("layer", [0, 1])
def test_batched_loop_captum_equal_jacobian(models, images, kind, layer):
    model = models[kind]
    block = model.blocks[layer]
    x = block_inputs(model, images)[layer]
    fn = head_output_fn(block)
    c = 8 if kind == "teacher" else 2 * 8  # D_h, or forward + reverse units
    assert fn(x).shape == (2, T, 2, c)
    ref = jacobian_reference(fn, x)
    assert ref.abs().max() > 0
    batched = dependency(fn, x)
    assert batched.shape == (2, 2, T, T)  # (sample, head, query, key)
    torch.testing.assert_close(batched, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency(fn, x, chunk_size=4), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency(fn, x, queries=[0, 5]), ref[:, :, [0, 5]], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency_loop(fn, x, queries=[3]), ref[:, :, [3]], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency(lambda inp: fn(inp), x), ref, atol=1e-5, rtol=1e-5)  # plain fn
    torch.testing.assert_close(dependency_loop(fn, x), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency_loop(lambda inp: fn(inp), x), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency_captum(fn, x), ref, atol=1e-5, rtol=1e-5)


def test_attention_head_fn_matches_timm(models, images):
    """The per-head outputs, concatenated and projected, give timm's attention output."""
    block = models["teacher"].blocks[0]
    x = block_inputs(models["teacher"], images)[0]
    heads = head_output_fn(block)(x)  # (B, T, N, D_h)
    torch.testing.assert_close(block.attn.proj(heads.flatten(2)), block.attn(block.norm1(x)))
    assert isinstance(head_output_fn(block), HeadFn)
    with pytest.raises(TypeError, match="Attention"):
        head_output_fn(torch.nn.Linear(2, 2))


def test_far_forward_only_is_causal(models, images):
    """With every reverse unit pruned, output token q depends only on keys k <= q."""
    far = replace_attention(models["teacher"]).eval()
    masks = torch.ones(2, 2, 2, 8, dtype=torch.bool)
    masks[:, :, 1] = False
    apply_masks(far, masks)
    x = block_inputs(far, images)[1]
    dep = dependency(head_output_fn(far.blocks[1]), x)
    upper = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    assert dep[..., upper].abs().max() == 0 and dep[..., ~upper].min() > 0


def test_model_dependency(models, images):
    model = models["far"].train()
    dep = model_dependency(model, images, layers=[1], method="batched")
    assert dep.shape == (1, 2, 2, T, T) and model.training  # mode restored
    cls = model_dependency(model, images, queries=[0])
    assert cls.shape == (2, 2, 2, 1, T)  # CLS query only
    torch.testing.assert_close(model_dependency(model, images, queries=[0], method="loop"), cls)
    torch.testing.assert_close(model_dependency(model.float(), images.float(), queries=[0]), cls.float(), atol=1e-4, rtol=1e-3)
    model.double()
    model.eval()
    torch.testing.assert_close(dep[0], dependency(head_output_fn(model.blocks[1]), block_inputs(model, images)[1]))


# ------------------------------------------------------------------------------- factored (fast) path
def _attention_block(gated: bool = False, qk_norm: bool = False) -> torch.nn.Module:
    from timm.layers import Attention
    from timm.models.vision_transformer import Block

    torch.manual_seed(3)
    blk = Block(16, 2, qkv_bias=True)
    blk.attn = Attention(16, 2, qkv_bias=True, gated=gated, qk_norm=qk_norm, norm_layer=torch.nn.LayerNorm)
    torch.nn.init.normal_(blk.norm1.weight)  # a non-trivial LayerNorm affine
    torch.nn.init.normal_(blk.norm1.bias)
    return blk.double().eval()


@pytest.mark.parametrize("kind", ["teacher", "far"])
@pytest.mark.parametrize("layer", [0, 1])
def test_factored_equals_jacobian(models, images, kind, layer):
    """The factored Jacobian (closed-form attention rows / batched LSTM adjoint) is the Jacobian's."""
    model = models[kind]
    x = block_inputs(model, images)[layer]
    fn = head_output_fn(model.blocks[layer])
    assert fn.factored
    ref = jacobian_reference(fn, x)
    torch.testing.assert_close(dependency_factored(fn, x), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency_factored(fn, x, queries=[7, 0, 3], chunk_size=2), ref[:, :, [7, 0, 3]],
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("gated, qk_norm", [(True, False), (False, True), (True, True)])
def test_factored_attention_variants(gated, qk_norm):
    """Gated attention (closed form) and q/k-normed attention (torch.func fallback) against the Jacobian."""
    blk = _attention_block(gated, qk_norm)
    x = torch.randn(2, T, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    fn = head_output_fn(blk)
    torch.testing.assert_close(dependency_factored(fn, x), jacobian_reference(fn, x), atol=1e-5, rtol=1e-5)


def test_lstm_adjoint_matches_autograd():
    """∂(Σ_u h_p[u]) / ∂inputs of one nn.LSTM for several positions, against autograd, and causal."""
    from methods.far.adjoint import lstm_sum_adjoint

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(5, 6, batch_first=True).double()
    x = torch.randn(3, 9, 5, dtype=torch.float64, requires_grad=True)
    out, _ = lstm(x)
    positions = [0, 4, 4, 8]
    got = lstm_sum_adjoint(lstm, x.detach(), positions)  # (P, B, T, D)
    for i, p in enumerate(positions):
        (ref,) = torch.autograd.grad(out[:, p].sum(), x, retain_graph=True)
        torch.testing.assert_close(got[i], ref, atol=1e-12, rtol=1e-10)
        assert (got[i, :, p + 1:] == 0).all()
    with pytest.raises(ValueError, match="ascending"):
        lstm_sum_adjoint(lstm, x.detach(), [3, 1])


def test_factored_forward_only_is_causal(models, images):
    far = replace_attention(models["teacher"]).eval()
    masks = torch.ones(2, 2, 2, 8, dtype=torch.bool)
    masks[:, :, 1] = False  # every reverse unit pruned
    apply_masks(far, masks)
    x = block_inputs(far, images)[1]
    dep = dependency_factored(head_output_fn(far.blocks[1]), x)
    upper = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    assert dep[..., upper].abs().max() == 0 and dep[..., ~upper].min() > 0


def test_model_dependency_methods_agree(models, images):
    for kind in ("teacher", "far"):
        model = models[kind]
        auto = model_dependency(model, images, layers=[-1])
        torch.testing.assert_close(auto, model_dependency(model, images, layers=[1], method="loop"))
        torch.testing.assert_close(auto, model_dependency(model, images, layers=[1], method="factored"))
    with pytest.raises(ValueError, match="method"):
        model_dependency(models["far"], images, method="fast")


# ------------------------------------------------------------------------------------------ extractor
def test_extractor_lines_up_with_attention(models, images):
    """Teacher attention and FAR dependency concat along `model`; the CLS view is the CLS row."""
    import xarray as xr

    from workbench.analysis.attention import extract_attention
    from workbench.analysis.dependency import extract_dependency

    teacher = models["teacher"].float()
    far = replace_attention(teacher).eval()
    x = images.float()
    att = extract_attention(teacher, x)
    dep = extract_dependency(far, x)
    assert dep["dependency"].dims == att["attention"].dims == ("sample", "layer", "head", "query", "key")
    both = xr.concat([att["attention"], dep["dependency"]], dim="model", coords="minimal", compat="override")
    assert both.sizes == {"model": 2, "sample": 2, "layer": 2, "head": 2, "query": T, "key": T}
    for c in ("query_kind", "query_y", "query_x", "key_kind", "key_y", "key_x"):
        assert (att[c].values == dep[c].values).all()
    grid = dep["dependency"].sel(query=0).isel(key=slice(1, None)).values.reshape(2, 2, 2, 4, 4)
    np.testing.assert_array_equal(dep["cls_dependency"].values, grid)
    ref = model_dependency(far, x).permute(1, 0, 2, 3, 4).numpy()
    np.testing.assert_allclose(dep["dependency"].values, ref, rtol=1e-6)
    cls_only = extract_dependency(far, x, queries=[0], layers=[1])
    np.testing.assert_allclose(cls_only["cls_dependency"].values, dep["cls_dependency"].sel(layer=[1]).values, rtol=1e-5, atol=1e-7)
    assert extract_dependency(teacher, x)["dependency"].shape == (2, 2, 2, T, T)  # a teacher works too


def test_extractor_refuses_non_vit():
    import timm

    from workbench.analysis.dependency import extract_dependency

    cnn = timm.create_model("resnet10t", pretrained=False, num_classes=10).eval()
    with pytest.raises(ValueError, match="VisionTransformer"):
        extract_dependency(cnn, torch.randn(1, 3, 32, 32))
