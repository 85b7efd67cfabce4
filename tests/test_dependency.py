"""Gradient-saliency token dependency (workbench.analysis.dependency) against autograd's Jacobian."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from methods.far import apply_masks, replace_attention, shrink
from methods.hooks import hooks, run_with_cache
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


#: (model kind, wrt) pairs that exist: an attention block has no LSTM input
KIND_WRT = [("teacher", "mixer_input"), ("teacher", "residual"), ("far", "mixer_input"), ("far", "residual"),
            ("far", "lstm_input")]


def jacobian_reference(fn, x: torch.Tensor, norm: str = "l2") -> torch.Tensor:
    """dependency[b, h, q, k] = ‖Σ_c ∂y[b, q, h, c] / ∂x[b, k, :]‖ from the full Jacobian."""
    jac = torch.autograd.functional.jacobian(lambda inp: fn(inp), x, vectorize=True)  # (B, T, N, C, B, T, D)
    jac = jac.sum(3)  # Σ_c: (B, T_q, N, B, T_k, D)
    b = torch.arange(x.shape[0])
    same = jac[b, :, :, b]  # same sample: (B, T_q, N, T_k, D)
    size = same.norm(dim=-1) if norm == "l2" else same.abs().sum(-1)
    return size.permute(0, 2, 1, 3)  # (B, N, T_q, T_k)


HOOK_IN = {"residual": "hook_resid_pre", "mixer_input": "hook_mixer_in", "lstm_input": "attn.hook_lstm_in"}


def _head_columns(attn) -> list[slice]:
    """Columns of each head in ``hook_heads`` (the proj's input, heads concatenated)."""
    if hasattr(attn, "out_proj_slices"):  # FAR: LSTM outputs in lstms order, (forward, reverse) per head
        sl = attn.out_proj_slices()
        return [slice(sl[2 * n].start, sl[2 * n + 1].stop) for n in range(attn.num_heads)]
    return [slice(n * attn.head_dim, (n + 1) * attn.head_dim) for n in range(attn.num_heads)]


def module_head_fn(model, images, layer: int, wrt: str):
    """Independent of our head functions: ``u`` (the block's ``wrt`` value) -> the per-head outputs ``(B, T, N, C)``
    that the block's *own* forward (timm's Attention, FAR's module) computes when ``u`` is put in at that hook point;
    the heads are read where ``hook_heads`` reads them (the output projection's input)."""
    block = model.blocks[layer]
    x = block_inputs(model, images, wrt="residual")[layer]  # the block's input; replaced at the wrt point

    def fn(u: torch.Tensor) -> torch.Tensor:
        seen = {}

        def keep(value, name):
            seen["heads"] = value

        with hooks(model, {f"blocks.{layer}.{HOOK_IN[wrt]}": lambda value, name: u,
                           f"blocks.{layer}.attn.hook_heads": keep}):
            block(x)
        heads = seen["heads"]  # (B, T, heads concatenated)
        return torch.stack([heads[..., c] for c in _head_columns(block.attn)], 2)  # (B, T, N, C)

    return fn


def naive_hook_loop(model, images, layer: int, wrt: str, norm: str = "l2") -> torch.Tensor:
    """Independent reference: the real model's forward, the input and the per-head outputs read at their hook
    points (methods.hooks), one ``autograd.grad`` per (head, query). ``(B, N, T, T)``."""
    names = [f"blocks.{layer}.{HOOK_IN[wrt]}", f"blocks.{layer}.attn.hook_heads"]
    with torch.enable_grad():
        _, cache = run_with_cache(model.eval(), images, names=names, detach=False)
    u, heads = cache[names[0]], cache[names[1]]  # (B, T, ·), (B, T, heads concatenated)
    cols = _head_columns(model.blocks[layer].attn)
    out = torch.zeros(u.shape[0], len(cols), u.shape[1], u.shape[1], dtype=u.dtype)
    for n, c in enumerate(cols):
        for q in range(u.shape[1]):
            (g,) = torch.autograd.grad(heads[:, q, c].sum(), u, retain_graph=True)  # (B, T, ·)
            out[:, n, q] = g.norm(dim=-1) if norm == "l2" else g.abs().sum(-1)
    return out


def test_block_inputs(models, images):
    model = models["far"]
    xs = block_inputs(model, images, wrt="residual")
    assert len(xs) == 2 and xs[0].shape == (2, T, 16)
    torch.testing.assert_close(xs[1], model.blocks[0](xs[0]))
    mixer = block_inputs(model, images)  # default: the token mixer's input
    torch.testing.assert_close(mixer[1], model.blocks[1].norm1(xs[1]))
    lstm = block_inputs(model, images, [1], wrt="lstm_input")
    assert len(lstm) == 1 and lstm[0].shape == (2, T, 2 * 8)  # N · D_h
    torch.testing.assert_close(lstm[0], model.blocks[1].attn.in_proj(model.blocks[1].attn.norm(mixer[1])))
    with pytest.raises(ValueError, match="lstm_input.*FAR"):
        block_inputs(models["teacher"], images, wrt="lstm_input")
    with pytest.raises(ValueError, match="wrt"):
        block_inputs(model, images, wrt="ln1")


@pytest.mark.parametrize("kind, wrt", KIND_WRT)
@pytest.mark.parametrize("layer", [0, 1])
def test_batched_loop_captum_equal_jacobian(models, images, kind, layer, wrt):
    """Every path of ``dependency`` over our head function equals the Jacobian of the block's own forward."""
    model = models[kind]
    block = model.blocks[layer]
    x = block_inputs(model, images, wrt=wrt)[layer]
    fn = head_output_fn(block, wrt)
    c = 8 if kind == "teacher" else 2 * 8  # D_h, or forward + reverse units
    own = module_head_fn(model, images, layer, wrt)
    assert fn(x).shape == own(x).shape == (2, T, 2, c)
    torch.testing.assert_close(fn(x), own(x))
    ref = jacobian_reference(own, x)  # the model's own modules, not our head function
    assert ref.abs().max() > 0
    batched = dependency(fn, x)
    assert batched.shape == (2, 2, T, T)  # (sample, head, query, key)
    torch.testing.assert_close(batched, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency(fn, x, chunk_size=4), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency(fn, x, queries=[0, 5]), ref[:, :, [0, 5]], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency_loop(fn, x, queries=[3]), ref[:, :, [3]], atol=1e-5, rtol=1e-5)
    l1 = jacobian_reference(own, x, "l1")
    torch.testing.assert_close(dependency(fn, x, norm="l1"), l1, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency_loop(fn, x, queries=[3], norm="l1"), l1[:, :, [3]], atol=1e-5, rtol=1e-5)
    if wrt != "mixer_input":  # the full-loop, plain-fn and captum forms do not depend on wrt: checked once
        return
    torch.testing.assert_close(dependency(lambda inp: fn(inp), x), ref, atol=1e-5, rtol=1e-5)  # plain fn
    torch.testing.assert_close(dependency_loop(fn, x), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency_loop(lambda inp: fn(inp), x), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency_captum(fn, x), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind, wrt", KIND_WRT + [("far_pruned", w) for w in ("mixer_input", "residual", "lstm_input")])
@pytest.mark.parametrize("norm", ["l2", "l1"])
def test_extractor_equals_naive_hook_loop(models, images, kind, wrt, norm):
    """For every wrt: model_dependency and the extractor (factored paths) equal a per-(head, query) autograd loop
    on the real model's hook points — an independent computation (no HeadFn), for teacher, FAR and pruned FAR."""
    from workbench.analysis.dependency import extract_dependency

    if kind == "far_pruned":  # unequal hidden sizes per (head, direction): hook_heads columns are not uniform
        masks = torch.rand(2, 2, 2, 8, generator=torch.Generator().manual_seed(5)) < 0.6
        masks[0, 0, 1] = False  # one reverse LSTM with no units left
        model = shrink(models["far"], masks).eval()
    else:
        model = models[kind]
    got = model_dependency(model, images, wrt=wrt, norm=norm)  # (L, B, N, T, T)
    for layer in (0, 1):
        ref = naive_hook_loop(model, images, layer, wrt, norm)
        assert ref.abs().max() > 0
        torch.testing.assert_close(got[layer], ref, atol=1e-6, rtol=1e-6)
    ds = extract_dependency(model, images, layers=[1], wrt=wrt, norm=norm)
    assert ds.attrs["wrt"] == wrt and ds.attrs["norm"] == norm and wrt in ds.attrs["config"]
    np.testing.assert_allclose(ds["dependency"].isel(layer=0).values, got[1].float().numpy(), rtol=2e-5, atol=1e-6)


def test_residual_columns_carry_layer_norm_scale(models, images):
    """The reason for wrt="mixer_input": LN1 is scale-invariant per token, so scaling key token k's residual input
    by c leaves the token-mixer input (and its dependency map) unchanged but divides column k of the residual map by c."""
    for kind in ("teacher", "far"):
        block = models[kind].blocks[1]
        x = block_inputs(models[kind], images, wrt="residual")[1]
        scaled = x.clone()
        scaled[:, 5] = 10 * (scaled[:, 5] - scaled[:, 5].mean(-1, keepdim=True)) + scaled[:, 5].mean(-1, keepdim=True)
        res, res_scaled = (dependency_factored(head_output_fn(block, "residual"), v) for v in (x, scaled))
        torch.testing.assert_close(res_scaled[..., 5], res[..., 5] / 10, rtol=1e-4, atol=0)
        torch.testing.assert_close(res_scaled[..., :5], res[..., :5], rtol=1e-4, atol=0)  # other keys: the same
        mix = head_output_fn(block, "mixer_input")
        torch.testing.assert_close(dependency_factored(mix, block.norm1(scaled)), dependency_factored(mix, block.norm1(x)),
                                   rtol=1e-4, atol=0)


def test_attention_head_fn_matches_timm(models, images):
    """The per-head outputs, concatenated and projected, give timm's attention output."""
    block = models["teacher"].blocks[0]
    x = block_inputs(models["teacher"], images)[0]
    heads = head_output_fn(block, "residual")(x)  # (B, T, N, D_h)
    torch.testing.assert_close(block.attn.proj(heads.flatten(2)), block.attn(block.norm1(x)))
    torch.testing.assert_close(head_output_fn(block)(block.norm1(x)), heads)  # mixer_input: the LN1 output
    assert isinstance(head_output_fn(block), HeadFn)
    with pytest.raises(TypeError, match="Attention"):
        head_output_fn(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="lstm_input"):
        head_output_fn(block, "lstm_input")


def test_far_forward_only_is_causal(models, images):
    """With every reverse unit pruned, output token q depends only on keys k <= q."""
    far = replace_attention(models["teacher"]).eval()
    masks = torch.ones(2, 2, 2, 8, dtype=torch.bool)
    masks[:, :, 1] = False
    apply_masks(far, masks)
    x = block_inputs(far, images)[1]
    dep = dependency(head_output_fn(far.blocks[1]), x)
    lstm = dependency(head_output_fn(far.blocks[1], "lstm_input"), block_inputs(far, images, wrt="lstm_input")[1])
    upper = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    assert dep[..., upper].abs().max() == 0 and dep[..., ~upper].min() > 0
    assert lstm[..., upper].abs().max() == 0 and lstm[..., ~upper].min() > 0


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


@pytest.mark.parametrize("kind, wrt", KIND_WRT)
@pytest.mark.parametrize("layer", [0, 1])
def test_factored_equals_jacobian(models, images, kind, layer, wrt):
    """The factored Jacobian (closed-form attention rows / batched LSTM adjoint) is the Jacobian's, L2 and L1."""
    model = models[kind]
    x = block_inputs(model, images, wrt=wrt)[layer]
    fn = head_output_fn(model.blocks[layer], wrt)
    assert fn.factored and fn.wrt == wrt
    own = module_head_fn(model, images, layer, wrt)  # the block's own forward
    ref = jacobian_reference(own, x)
    torch.testing.assert_close(dependency_factored(fn, x), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dependency_factored(fn, x, queries=[7, 0, 3], chunk_size=2), ref[:, :, [7, 0, 3]],
                               atol=1e-5, rtol=1e-5)
    l1 = jacobian_reference(own, x, "l1")
    torch.testing.assert_close(dependency_factored(fn, x, norm="l1", chunk_size=5), l1, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("gated, qk_norm", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("wrt", ["mixer_input", "residual"])
def test_factored_attention_variants(gated, qk_norm, wrt):
    """Gated attention (closed form) and q/k-normed attention (torch.func fallback) against the Jacobian."""
    blk = _attention_block(gated, qk_norm)
    x = torch.randn(2, T, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    fn = head_output_fn(blk, wrt)
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


@pytest.mark.parametrize("kind, wrt", KIND_WRT)
def test_model_dependency_methods_agree(models, images, kind, wrt):
    model = models[kind]
    auto = model_dependency(model, images, layers=[-1], wrt=wrt)
    torch.testing.assert_close(auto, model_dependency(model, images, layers=[1], method="loop", wrt=wrt))
    torch.testing.assert_close(auto, model_dependency(model, images, layers=[1], method="batched", wrt=wrt))
    torch.testing.assert_close(auto, model_dependency(model, images, layers=[1], method="factored", wrt=wrt))


def test_model_dependency_refuses_bad_options(models, images):
    with pytest.raises(ValueError, match="method"):
        model_dependency(models["far"], images, method="fast")
    with pytest.raises(ValueError, match="norm"):
        model_dependency(models["far"], images, norm="linf")
    with pytest.raises(ValueError, match="lstm_input"):
        model_dependency(models["teacher"], images, wrt="lstm_input")


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
    both = xr.concat([att["attention"], dep["dependency"]], dim="model", coords="minimal", compat="override", join="outer")
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
