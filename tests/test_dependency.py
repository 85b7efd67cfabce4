"""Gradient-saliency token dependency (workbench.analysis.dependency) against autograd's Jacobian."""

from __future__ import annotations

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from methods.far import apply_masks, replace_attention
from workbench.analysis.dependency import (
    HeadFn,
    block_inputs,
    dependency,
    dependency_captum,
    dependency_loop,
    head_output_fn,
    model_dependency,
)

TINY = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5)
T = (16 // 4) ** 2 + 1


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


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
