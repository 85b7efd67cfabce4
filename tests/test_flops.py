"""The shared MAC counter (methods.flops): the same count whichever attention kernel runs."""

import pytest
import timm
import torch
import torch.nn.functional as F

from methods.flops import count_macs, sdpa_macs

pytestmark = pytest.mark.usefixtures("one_thread")


class _SDPA(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **self.kw)


@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"attn_mask": torch.ones(7, 5, dtype=torch.bool)}])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # multi-head, grouped-query, multi-query
def test_sdpa_counted_by_shape_for_every_variant(kw, kv_heads):
    q = torch.randn(3, 4, 7, 8)
    k, v = torch.randn(3, kv_heads, 5, 8), torch.randn(3, kv_heads, 5, 6)
    if kv_heads != 4:
        kw = {**kw, "enable_gqa": True}
    got = count_macs(_SDPA(**kw), q, k, v).total
    assert got == 3 * 4 * 7 * 5 * (8 + 6) == sdpa_macs(q.shape, k.shape, v.shape)


@pytest.mark.parametrize("fused", [True, False])
def test_vit_counts_do_not_depend_on_the_kernel_and_match_a_hand_count(fused):
    torch.manual_seed(0)
    m = timm.create_model("vit_tiny_patch16_224", depth=2)
    for b in m.blocks:
        b.attn.fused_attn = fused
    c = count_macs(m, torch.zeros(1, 3, 224, 224))
    t, d = 197, 192
    block = t * d * 3 * d + 2 * t * t * d + t * d * d + 2 * t * d * 4 * d  # qkv, QKᵀ + AV, proj, MLP
    assert c.within("blocks.0") == block
    assert c.total == 2 * block + 196 * 16 * 16 * 3 * d + d * 1000  # + patch embedding + head


@pytest.mark.parametrize("name,size,paper", [
    ("deit_tiny_patch16_224", 224, 1.25), ("deit_small_patch16_224", 224, 4.60), ("deit_base_patch16_224", 224, 17.56),
    ("deit_small_patch16_224", 384, 15.49), ("deit_base_patch16_224", 384, 55.49),
])
def test_deit_gmacs_match_the_papers(name, size, paper):
    """FAR Table 2 (fvcore MACs) with timm's fused attention on. DeiT-Tiny at 384 is left out on purpose:
    the paper's 4.63 is 1.1% below what this convention gives (4.682), while Small and Base at 384 match to
    0.1%; Sparsifiner's paper counts DeiT-T@384's attention at 1534.1 MFLOPs, which is ours (see test_far_method)."""
    m = timm.create_model(name, img_size=size).eval()
    assert all(b.attn.fused_attn for b in m.blocks)
    g = count_macs(m, torch.zeros(1, 3, size, size)).total / 1e9
    assert abs(g / paper - 1) < 0.01, g
