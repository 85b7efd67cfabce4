"""Named hook points (methods.hooks): the values they give are the ones the model computed."""

import pytest
import timm
import torch
import torch.nn as nn

import methods.teachers  # noqa: F401
from methods.hooks import HookPoint, hook_points, hooks, run_with_cache

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return timm.create_model("vit_demo").eval()


def test_vit_pattern_is_softmax_of_q_and_k_and_flags_are_restored(vit):
    x = torch.randn(2, 1, 28, 28)
    assert all(b.attn.fused_attn for b in vit.blocks)
    logits, cache = run_with_cache(vit, x, names=["blocks.*.attn.hook_pattern", "blocks.*.hook_mixer_in"])
    assert all(b.attn.fused_attn for b in vit.blocks)  # restored
    torch.testing.assert_close(logits, vit(x))  # hooking changed nothing
    for i, blk in enumerate(vit.blocks):
        a = blk.attn
        q, k, _ = a.qkv(cache[f"blocks.{i}.hook_mixer_in"]).reshape(2, 50, 3, a.num_heads, a.head_dim).permute(2, 0, 3, 1, 4)
        ref = (q @ k.transpose(-1, -2) * a.scale).softmax(-1)
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_pattern"], ref, atol=1e-6, rtol=1e-5)


def test_swin_and_cnn_adapters():
    torch.manual_seed(0)
    swin = timm.create_model("swin_demo").eval()
    _, cache = run_with_cache(swin, torch.randn(1, 1, 32, 32), names="layers.*.blocks.*.attn.hook_pattern")
    # (windows, heads, tokens, tokens): 16 / 4 / 1 windows of 4 x 4 tokens, heads 3 / 6 / 12
    assert [tuple(v.shape) for v in cache.values()] == [(16, 3, 16, 16)] * 2 + [(4, 6, 16, 16)] * 2 + [(1, 12, 16, 16)] * 2
    cnn = timm.create_model("cnn_demo").eval()
    x = torch.randn(1, 1, 28, 28)
    _, cache = run_with_cache(cnn, x, names="stages.*.hook_out")
    torch.testing.assert_close(cache["stages.0.hook_out"], cnn.layer1(cnn.act1(cnn.bn1(cnn.conv1(x)))))


def test_gradient_with_respect_to_a_hook_point(vit):
    x = torch.randn(2, 1, 28, 28)
    out, cache = run_with_cache(vit, x, names="blocks.2.hook_mixer_in", retain_grad=True)
    out[:, 3].sum().backward()
    grad = cache["blocks.2.hook_mixer_in"].grad
    # the same by hand: recompute the rest of the model from block 2's LN1 output
    h = vit.blocks[1](vit.blocks[0](vit._pos_embed(vit.patch_embed(x))))
    z = vit.blocks[2].norm1(h).detach().requires_grad_(True)
    blk = vit.blocks[2]
    y = h + blk.ls1(blk.attn(z))
    y = y + blk.ls2(blk.mlp(blk.norm2(y)))
    for b in vit.blocks[3:]:
        y = b(y)
    logits = vit.forward_head(vit.norm(y))
    (ref,) = torch.autograd.grad(logits[:, 3].sum(), z)
    torch.testing.assert_close(grad, ref, atol=1e-6, rtol=1e-5)
    vit.zero_grad(set_to_none=True)


def test_replacing_a_value(vit):
    x = torch.randn(2, 1, 28, 28)
    with hooks(vit, {"blocks.*.hook_mixer_out": lambda v, name: torch.zeros_like(v)}):
        ablated = vit(x)
    y = vit._pos_embed(vit.patch_embed(x))
    for b in vit.blocks:  # every block without its attention
        y = y + b.ls2(b.mlp(b.norm2(y)))
    torch.testing.assert_close(ablated, vit.forward_head(vit.norm(y)))


def test_bad_names_and_reused_modules(vit):
    with pytest.raises(KeyError, match="no hook point 'blocks.0.attn.hook_nothing'"):
        run_with_cache(vit, torch.randn(1, 1, 28, 28), names="blocks.0.attn.hook_nothing")

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.hook_x = HookPoint()

        def forward(self, x):
            return self.hook_x(self.hook_x(x))

    assert list(hook_points(Twice())) == ["hook_x"]
    with pytest.raises(RuntimeError, match="more than once"):
        run_with_cache(Twice(), torch.ones(1))
