"""The baselines behind the SlimSwin / Sparsifiner / AttentionLite findings, and verdicts that follow their data.

- SlimSwin's random and uniform-per-layer masks prune exactly the pairs Algorithm 1 would at that ratio, counted
  independently per layer;
- the Sparsifiner baselines' masked attention equals the dense attention when every key is kept and an independent
  recomputation (float64) when only B are;
- each item's verdict changes when its data changes (no verdict is a constant).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

import methods.teachers  # noqa: F401  (registers the demo architectures)
from methods.slimswin import SWIN_TINY, pairs_to_prune, prunable_layers, swin_layers, uniform_masks
from workbench.models import create_model
from workbench.pipelines.slimswin.baselines import baseline_masks

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------ SlimSwin masks
@pytest.mark.parametrize("cfg", ["demo", "tiny"])
@pytest.mark.parametrize("ratio", [1 / 3, 2 / 3])
def test_baseline_masks_prune_exactly_the_pairs_of_the_ratio(cfg, ratio):
    arch = create_model("swin_demo") if cfg == "demo" else SWIN_TINY
    layers, prunable = swin_layers(arch), prunable_layers(arch)
    total = sum(layers[l].num_pairs for l in prunable)
    n = pairs_to_prune(total, ratio, 8)
    for seed in (0, 1):
        rnd = baseline_masks(arch, n, "random", seed=seed)
        uni = baseline_masks(arch, n, "uniform", seed=seed)
        for masks in (rnd, uni):
            assert [tuple(m.shape) for m in masks] == [(g.num_windows, g.num_heads) for g in layers]
            assert sum(int((~masks[l]).sum()) for l in prunable) == n  # exactly the ratio's count
            assert all(bool(masks[l].all()) for l in range(len(layers)) if l not in prunable)  # last stage untouched
        # uniform: every prunable layer loses its share, by largest remainder: counted independently here
        quota = [n * layers[l].num_pairs / total for l in prunable]
        floors = [int(q) for q in quota]
        extra = sorted(range(len(quota)), key=lambda i: (-(quota[i] - floors[i]), i))[: n - sum(floors)]
        expected = [f + (i in extra) for i, f in enumerate(floors)]
        assert [int((~uni[l]).sum()) for l in prunable] == expected
        assert [int((~uni[l]).sum()) for l in prunable] == [int((~m).sum()) for m in
                                                             (uniform_masks(arch, n)[l] for l in prunable)]
    # random draws differ between seeds and do not follow the per-layer shares
    a, b = baseline_masks(arch, n, "random", seed=0), baseline_masks(arch, n, "random", seed=1)
    assert any(not torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="num_pruned"):
        baseline_masks(arch, total + 1, "random")
    with pytest.raises(ValueError, match="random' or 'uniform"):
        baseline_masks(arch, n, "saliency")


# ------------------------------------------------------------------------------------------ Sparsifiner masks
def test_masked_teacher_against_recomputation():
    from workbench.pipelines.sparsifiner.baselines import mask_teacher

    torch.manual_seed(0)
    vit = create_model("vit_demo").double().eval()
    x = torch.randn(3, 1, 28, 28, dtype=torch.float64)
    with torch.no_grad():
        dense = vit(x)
        full = mask_teacher(vit, 1.0, "top-B")(x)  # every key kept: the dense model
        assert torch.allclose(full, dense, atol=1e-10)
        # one layer with B = 5 keys recomputed by hand from q, k, v
        masked = mask_teacher(vit, 0.1, "top-B")
        blk, ref = masked.blocks[0].attn, vit.blocks[0].attn
        h = torch.randn(2, 50, ref.qkv.in_features, dtype=torch.float64)
        q, k, v = ref.qkv(h).reshape(2, 50, 3, ref.num_heads, -1).permute(2, 0, 3, 1, 4)
        p = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1)
        keep = torch.zeros_like(p)
        for b in range(2):
            for hd in range(ref.num_heads):
                for t in range(50):
                    if t < 1:  # the CLS query row stays dense
                        keep[b, hd, t] = 1
                    else:
                        keep[b, hd, t, p[b, hd, t].argsort(descending=True)[:5]] = 1
        expect = ref.proj((p * keep @ v).transpose(1, 2).reshape(2, 50, -1))
        assert torch.allclose(blk(h), expect, atol=1e-10)
        rnd = mask_teacher(vit, 0.1, "random", seed=3)
        assert not torch.allclose(rnd(x), dense)


# ------------------------------------------------------------------------------------------ verdicts follow data
# slimswin.fig4 and attentionlite.fig2 (verdicts over training seeds): tests/verdict_cases_seeds.py
def test_sparsifiner_mask_verdict_follows_its_data():
    from workbench.figures.sparsifiner.findings import BASELINES

    rng = np.random.default_rng(1)
    n = 1000

    def base(learned_p: float) -> xr.Dataset:
        c = np.stack([[rng.random(n) < p for _ in range(2)] for p in (learned_p, 0.93, 0.30, 0.90)]).astype(float)
        return xr.Dataset({"correct": (("mask", "keep_rate", "sample"), c), "budget": ("keep_rate", [5, 13])},
                          coords={"mask": ["learned", "top-B", "random", "trained"], "keep_rate": [0.1, 0.25],
                                  "sample": np.arange(n)}, attrs={"tokens": 50})

    assert BASELINES.test(base(0.96)).status == "shown"
    assert BASELINES.test(base(0.60)).status == "partly"
    assert BASELINES.test(base(0.30)).status == "not shown"


def test_attentionlite_no_kd_run_ids():
    from workbench.pipelines.attentionlite.run import run_id

    common = dict(variant="demo", default_variant="demo", stem="conv", seed=0)
    assert run_id("cnn-demo", "irregular", 0.25, False, kd=False, **common) == "attentionlite-irregular-d0.25-ce-cnn-demo"
    assert run_id("cnn-demo", "irregular", 0.25, True, **common) == "attentionlite-irregular-d0.25-kdat-cnn-demo"
    assert run_id("cnn-demo", "irregular", 1.0, False, kd=False, **common) == "attentionlite-irregular-d1-ce-cnn-demo"
