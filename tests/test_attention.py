"""Tests of the attention extractors against the model's own forward pass and an independent recomputation."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
import xarray as xr
from einops import rearrange
from skimage import data as skdata
from timm.layers import Attention
from timm.models.swin_transformer import SwinTransformer, window_partition
from timm.models.vision_transformer import VisionTransformer

from methods.hooks import run_with_cache
from workbench.analysis import get_extractor
from workbench.analysis.attention import extract_attention, extract_window_attention

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def photos(size: int, n: int = 2) -> torch.Tensor:
    """Real photos (astronaut, chelsea) resized to ``size`` and ImageNet-normalised: (n, 3, size, size)."""
    imgs = [skdata.astronaut(), skdata.chelsea()][:n]
    out = []
    for im in imgs:
        t = torch.from_numpy(im).permute(2, 0, 1)[None].float() / 255.0  # (1, 3, H, W)
        out.append(F.interpolate(t, size=(size, size), mode="bilinear", antialias=True, align_corners=False))
    return (torch.cat(out) - MEAN) / STD


def set_fused(model: torch.nn.Module, flag: bool) -> None:
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = flag


def fused_flags(model: torch.nn.Module) -> list[bool]:
    return [m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")]


def make(name: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, **kw).eval()


def demo_vit() -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(
        img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=64, depth=4, num_heads=4
    ).eval()


def tiny_swin() -> SwinTransformer:
    torch.manual_seed(0)
    return SwinTransformer(
        img_size=28, patch_size=2, in_chans=1, window_size=7, embed_dim=32,
        depths=(2, 2), num_heads=(2, 4), num_classes=10,
    ).eval()


@contextmanager
def hook_block_inputs(blocks: Sequence[torch.nn.Module]) -> Iterator[dict[int, torch.Tensor]]:
    """Capture each block's input during the body, independently of the extractor's hooks."""
    inputs: dict[int, torch.Tensor] = {}
    handles = [
        blk.register_forward_pre_hook(lambda _m, a, i=i: inputs.__setitem__(i, a[0].detach()))
        for i, blk in enumerate(blocks)
    ]
    try:
        yield inputs
    finally:
        for h in handles:
            h.remove()


def vit_reference(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T * scale) from the block's own weights and input: (B, heads, N, N)."""
    a = block.attn
    with torch.no_grad():
        qkv = a.qkv(block.norm1(x))  # (B, N, 3 * heads * d)
        qkv = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=a.num_heads)
        q, k = a.q_norm(qkv[0]), a.k_norm(qkv[1])
        return torch.softmax((q * a.scale) @ k.transpose(-2, -1), dim=-1)


def check_vit(model: torch.nn.Module, images: torch.Tensor, fused: bool, layers=None) -> xr.Dataset:
    """Logits unchanged by recording, maps equal to the recomputation, rows sum to 1, flags restored."""
    set_fused(model, fused)
    flags = fused_flags(model)
    with torch.no_grad():
        logits_plain = model(images)
        with hook_block_inputs(model.blocks) as inputs:
            logits_rec, rec = run_with_cache(model, images, names="blocks.*.attn.hook_pattern")
    assert fused_flags(model) == flags
    torch.testing.assert_close(logits_rec, logits_plain, atol=1e-5, rtol=0)

    ds = extract_attention(model, images, layers=layers)
    assert fused_flags(model) == flags
    assert ds.attention.dtype == np.float32
    for layer in ds.layer.values:
        ref = vit_reference(model.blocks[layer], inputs[layer]).numpy()
        got = ds.attention.sel(layer=layer).values[:, : ref.shape[1]]  # real heads (rest NaN-padded)
        np.testing.assert_allclose(got, ref, atol=1e-6, rtol=0)
        # what the model multiplied into v during an ordinary forward (float rounding apart: separate passes)
        np.testing.assert_allclose(got, rec[f"blocks.{int(layer)}.attn.hook_pattern"].numpy(), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(ds.attention.sum("key", skipna=False).fillna(1.0).values, 1.0, atol=1e-5)
    assert ds.attrs["analysis"] == "attention"
    return ds


@pytest.fixture(scope="module")
def deit() -> torch.nn.Module:
    return make("deit_tiny_patch16_224")


@pytest.fixture(scope="module")
def images224() -> torch.Tensor:
    return photos(224)


@pytest.mark.parametrize("fused", [True, False])
def test_deit_224_matches_model_and_recomputation(deit, images224, fused):
    n = 2 if fused else 1  # the real photos: astronaut (+ chelsea)
    ds = check_vit(deit, images224[:n], fused)
    assert ds.sizes == {"sample": n, "layer": 12, "head": 3, "query": 197, "key": 197, "y": 14, "x": 14}
    assert list(ds.sample.values) == list(range(n))
    assert ds.query_kind.values[0] == "cls" and set(ds.query_kind.values[1:]) == {"patch"}
    # cls_attention is the CLS row over patch keys, row-major on the grid
    np.testing.assert_array_equal(
        ds.cls_attention.values.reshape(n, 12, 3, 196), ds.attention.isel(query=0, key=slice(1, None)).values
    )
    k = 1 + 3 * 14 + 5  # patch (y=3, x=5)
    assert (int(ds.key_y[k]), int(ds.key_x[k])) == (3, 5)


def test_deit_384(images224):
    model = make("deit_tiny_patch16_224", img_size=384)
    ds = check_vit(model, photos(384, n=1), fused=True, layers=[0, 5, -1])
    assert ds.sizes["query"] == 1 + 24 * 24 and (ds.sizes["y"], ds.sizes["x"]) == (24, 24)
    assert list(ds.layer.values) == [0, 5, 11]


@pytest.mark.parametrize("fused", [True, False])
def test_distilled_deit_dist_token(images224, fused):
    model = make("deit_tiny_distilled_patch16_224")
    ds = check_vit(model, images224[:1], fused, layers=[0, -1])
    assert list(ds.query_kind.values[:3]) == ["cls", "dist", "patch"]
    assert list(ds.key_kind.values[:3]) == ["cls", "dist", "patch"]
    assert list(ds.query_y.values[:3]) == [-1, -1, 0] and list(ds.key_x.values[:3]) == [-1, -1, 0]
    assert (int(ds.key_y[2 + 14]), int(ds.key_x[2 + 14])) == (1, 0)
    np.testing.assert_array_equal(
        ds.cls_attention.values.reshape(1, 2, 3, 196), ds.attention.isel(query=0, key=slice(2, None)).values
    )


def test_demo_vit_and_registry():
    model = demo_vit()
    torch.manual_seed(1)
    ds = check_vit(model, torch.randn(2, 1, 28, 28), fused=True)
    assert ds.sizes["head"] == 4 and (ds.sizes["y"], ds.sizes["x"]) == (7, 7)
    assert get_extractor("attention") is extract_attention
    assert get_extractor("window_attention") is extract_window_attention


def test_layer_selection(deit, images224):
    x = images224[:1]
    full = extract_attention(deit, x)
    sub = extract_attention(deit, x, layers=[-1, 2])
    assert list(sub.layer.values) == [2, 11]
    np.testing.assert_array_equal(sub.attention.values, full.attention.sel(layer=[2, 11]).values)
    assert list(extract_attention(deit, x, layers=4).layer.values) == [4]
    assert '"layers": [-1, 2]' in sub.attrs["config"]
    for bad in (12, -13, [0, -12], [], ["a"]):
        with pytest.raises(ValueError):
            extract_attention(deit, x, layers=bad)


def test_head_count_differs_between_layers():
    model = demo_vit()
    torch.manual_seed(2)
    model.blocks[1].attn = Attention(64, num_heads=2, qkv_bias=True).eval()  # a head-pruned block
    ds = check_vit(model, torch.randn(1, 1, 28, 28), fused=True, layers=[0, 1])
    assert list(ds.num_heads.values) == [4, 2]
    assert np.isnan(ds.attention.sel(layer=1, head=[2, 3])).all()
    assert not np.isnan(ds.attention.sel(layer=0)).any()


def test_refuses_training_mode_and_non_vit(images224):
    model = demo_vit().train()
    with pytest.raises(ValueError, match="eval"):
        extract_attention(model, torch.randn(1, 1, 28, 28))
    resnet = make("resnet18")
    with pytest.raises(ValueError, match=r"ResNet has no ViT attention hook points \(blocks.\{i\}.attn.hook_pattern\)"):
        extract_attention(resnet, images224[:1])
    with pytest.raises(ValueError, match="Swin model: use the 'window_attention' extractor"):
        extract_attention(tiny_swin(), torch.randn(1, 1, 28, 28))
    with pytest.raises(ValueError, match="no Swin attention hook points.*use the 'attention' extractor"):
        extract_window_attention(demo_vit(), torch.randn(1, 1, 28, 28))


def test_flags_restored_on_error():
    model = demo_vit()
    set_fused(model, True)
    with pytest.raises(RuntimeError):
        extract_attention(model, torch.randn(1, 3, 28, 28))  # wrong channel count fails inside forward
    assert all(fused_flags(model))


# --- Swin -------------------------------------------------------------------------------------


def swin_reference(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T * scale + relative position bias + shift mask): (B, windows, heads, N, N).

    Recomputed from the block's input ``x (B, H, W, C)`` and weights; the shift mask is rebuilt
    here from the region definition of the Swin paper (-100 between tokens of different regions).
    """
    a = block.attn
    (wh, ww), (sy, sx) = block.window_size, block.shift_size
    b, h, w, c = x.shape
    with torch.no_grad():
        xs = torch.roll(block.norm1(x), shifts=(-sy, -sx), dims=(1, 2))
        hp, wp = -(-h // wh) * wh, -(-w // ww) * ww
        xs = F.pad(xs, (0, 0, 0, wp - w, 0, hp - h))
        xw = rearrange(xs, "b (gy wy) (gx wx) c -> (b gy gx) (wy wx) c", wy=wh, wx=ww)
        qkv = rearrange(a.qkv(xw), "bw n (three h d) -> three bw h n d", three=3, h=a.num_heads)
        scores = (qkv[0] * a.scale) @ qkv[1].transpose(-2, -1)  # (B*nW, heads, N, N)
        # relative position bias, indexed by (dy, dx) between tokens t and u of a window
        ty, tx = torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij")
        ty, tx = ty.flatten(), tx.flatten()
        idx = (ty[:, None] - ty[None, :] + wh - 1) * (2 * ww - 1) + (tx[:, None] - tx[None, :] + ww - 1)
        scores = scores + a.relative_position_bias_table[idx].permute(2, 0, 1)[None]
        if sy or sx:
            ry = torch.zeros(hp, dtype=torch.long)
            ry[hp - wh :], ry[hp - sy :] = 1, 2
            rx = torch.zeros(wp, dtype=torch.long)
            rx[wp - ww :], rx[wp - sx :] = 1, 2
            region = rearrange(ry[:, None] * 3 + rx[None, :], "(gy wy) (gx wx) -> (gy gx) (wy wx)", wy=wh, wx=ww)
            mask = torch.where(region[:, :, None] == region[:, None, :], 0.0, -100.0)  # (nW, N, N)
            scores = rearrange(scores, "(b w) h q k -> b w h q k", b=b) + mask[None, :, None]
            scores = rearrange(scores, "b w h q k -> (b w) h q k")
        probs = torch.softmax(scores, dim=-1)
    return rearrange(probs, "(b w) h q k -> b w h q k", b=b)


def check_swin(model, images, **kw):
    blocks = [blk for stage in model.layers for blk in stage.blocks]
    with torch.no_grad():
        logits_plain = model(images)
        with hook_block_inputs(blocks) as inputs:
            logits_rec, _ = run_with_cache(model, images, names="layers.*.blocks.*.attn.hook_pattern")
    torch.testing.assert_close(logits_rec, logits_plain, atol=1e-5, rtol=0)
    ds = extract_window_attention(model, images, **kw)
    for layer in ds.layer.values:
        blk, x = blocks[layer], inputs[layer]
        ref = swin_reference(blk, x).numpy()
        nw, nh, n = ref.shape[1:4]
        got = ds.attention.sel(layer=layer).values
        np.testing.assert_allclose(got[:, :nw, :nh, :n, :n], ref, atol=1e-6, rtol=0)
        assert np.isnan(got[:, nw:]).all() and np.isnan(got[:, :, nh:]).all()
        # window_y/x and query_y/x locate each window token in the unshifted feature map
        lc = ds.sel(layer=layer)
        xs = torch.roll(x, shifts=tuple(-s for s in blk.shift_size), dims=(1, 2))
        xw = window_partition(xs, blk.window_size)  # (B*nW, wh, ww, C), no padding in these models
        qy, qx = lc.query_y.values[:nw, :n], lc.query_x.values[:nw, :n]
        np.testing.assert_array_equal(x[0, qy, qx].numpy(), xw[:nw].flatten(1, 2).numpy())
        if not any(blk.shift_size):  # unshifted: window (gy, gx) holds map rows gy*wh.. and cols gx*ww..
            wh, ww = blk.window_size
            assert (qy // wh == lc.window_y.values[:nw, None]).all()
            assert (qx // ww == lc.window_x.values[:nw, None]).all()
        assert bool(lc.shifted) == any(blk.shift_size) and int(lc.num_heads) == nh
    np.testing.assert_allclose(ds.attention.sum("key", skipna=False).fillna(1.0).values, 1.0, atol=1e-5)
    return ds


@pytest.mark.parametrize("fused", [True, False])
def test_tiny_swin_window_attention_matches_recomputation(fused):
    model = tiny_swin()
    set_fused(model, fused)
    torch.manual_seed(3)
    ds = check_swin(model, torch.randn(2, 1, 28, 28))
    assert all(f == fused for f in fused_flags(model))
    assert ds.sizes == {"sample": 2, "layer": 4, "window": 4, "head": 4, "query": 49, "key": 49}
    assert list(ds.stage.values) == [0, 0, 1, 1]
    assert list(ds.shifted.values) == [False, True, False, False]  # stage 1's 7x7 map is one window
    assert list(ds.num_windows.values) == [4, 4, 1, 1] and list(ds.num_heads.values) == [2, 2, 4, 4]
    assert list(ds.window_y.values[0]) == [0, 0, 1, 1] and list(ds.window_x.values[0]) == [0, 1, 0, 1]
    assert list(ds.window_y.values[2]) == [0, -1, -1, -1]
    assert list(ds.query_wy.values[0, :9]) == [0] * 7 + [1, 1] and list(ds.query_wx.values[0, :9]) == [*range(7), 0, 1]
    one = extract_window_attention(model, torch.randn(1, 1, 28, 28), stage=0)
    assert list(one.layer.values) == [0, 1] and not np.isnan(one.attention).any()
    assert list(extract_window_attention(model, torch.randn(1, 1, 28, 28), layers=[-1]).layer.values) == [3]
    with pytest.raises(ValueError):
        extract_window_attention(model, torch.randn(1, 1, 28, 28), layers=[0], stage=0)
    with pytest.raises(ValueError):
        extract_window_attention(model, torch.randn(1, 1, 28, 28), stage=2)


def test_swin_tiny_224(images224):
    model = make("swin_tiny_patch4_window7_224")
    set_fused(model, True)  # timm's WindowAttention defaults to unfused; the fused path is the one to check here
    ds = check_swin(model, images224[:1], layers=[0, 1, 3])  # stages 0 and 1 (padding stays small)
    assert all(fused_flags(model))
    assert list(ds.num_windows.values) == [64, 64, 16] and list(ds.stage.values) == [0, 0, 1]
    assert list(ds.shifted.values) == [False, True, True] and list(ds.num_heads.values) == [3, 3, 6]
