"""Tests of the AttentionLite method core (methods.attentionlite): local attention, students, Eq. 2,
sparse momentum, column shrinking, introspection, registered forms."""

from __future__ import annotations

import json
import math

import pytest
import timm
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import methods.teachers  # noqa: F401  (registers cnn_demo / vit_demo)
from methods.attentionlite import (
    SA_VARIANTS,
    LocalSelfAttention,
    SparseDistillationLoss,
    SparseMomentum,
    at_loss,
    at_map,
    count_macs_sparse,
    count_params,
    deploy_kwargs,
    kd_loss,
    layer_densities,
    local_attention_unfold,
    neighbour_dot,
    neighbour_mix,
    prune_rate,
    query_attention,
    shrink,
    stage_at_maps,
)
from methods.flops import count_macs
from methods.hooks import hooks, run_with_cache
from methods.train import TrainConfig, fit

pytestmark = pytest.mark.usefixtures("one_thread")

TEST = SA_VARIANTS["test"]


def _randomise_bn(model: nn.Module) -> nn.Module:
    """Non-trivial BN affine parameters and statistics (zero-init-last would hide the residual branches)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.5)
                m.running_mean.normal_(0, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model


def _reference_attention(layer: LocalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """Eq. 1 pixel by pixel, head by head, from the layer's weights (loops; tiny maps only)."""
    B, _, H, W = x.shape
    C, h, d, k = layer.out_channels, layer.num_heads, layer.head_dim, layer.kernel_size
    r = k // 2
    wq, wk, wv = layer.qkv.weight.reshape(3 * C, -1).split(C)
    q = torch.einsum("oc,bcyx->boyx", wq, x)
    kk = torch.einsum("oc,bcyx->boyx", wk, x)
    v = torch.einsum("oc,bcyx->boyx", wv, x)
    out = torch.zeros(B, C, H, W, dtype=x.dtype)
    for b in range(B):
        for head in range(h):
            sl = slice(head * d, (head + 1) * d)
            for i in range(H):
                for j in range(W):
                    logits, values = [], []
                    for a in range(i - r, i + r + 1):
                        for c in range(j - r, j + r + 1):
                            if 0 <= a < H and 0 <= c < W:
                                rel = torch.cat([layer.rel_row[head, :, a - i + r], layer.rel_col[head, :, c - j + r]])
                                qv = q[b, sl, i, j]
                                logits.append(qv @ kk[b, sl, a, c] / math.sqrt(d) + qv @ rel / d ** 0.25)
                                values.append(v[b, sl, a, c])
                    p = torch.softmax(torch.stack(logits), 0)
                    out[b, sl, i, j] = (p[:, None] * torch.stack(values)).sum(0)
    return out


# --------------------------------------------------------------------------------------------
# Local self-attention (Eq. 1)
# --------------------------------------------------------------------------------------------


@pytest.fixture(params=["unfold", "offset_loop"])
def path(request, monkeypatch):
    """Both implementations of the neighbourhood operators (small operands take im2col, large an offset loop)."""
    import methods.attentionlite.attention as attention

    monkeypatch.setattr(attention, "UNFOLD_RATIO", 1e9 if request.param == "unfold" else 0.0)
    return request.param


@pytest.mark.parametrize("k,heads", [(3, 2), (5, 1)])
def test_local_attention_equals_per_pixel_reference(k, heads, path):
    torch.manual_seed(0)
    layer = LocalSelfAttention(3, 8, kernel_size=k, num_heads=heads).double()
    x = torch.randn(2, 3, 5, 6, dtype=torch.double)
    ref = _reference_attention(layer, x)
    torch.testing.assert_close(layer(x), ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(local_attention_unfold(x, layer), ref, rtol=1e-10, atol=1e-10)


def test_neighbour_operators_gradients(path):
    torch.manual_seed(0)
    q = torch.randn(1, 2, 3, 4, 5, dtype=torch.double, requires_grad=True)
    key = torch.randn(1, 2, 3, 4, 5, dtype=torch.double, requires_grad=True)
    a = torch.randn(1, 2, 9, 4, 5, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, key: neighbour_dot(q, key, 3), (q, key))
    assert torch.autograd.gradcheck(lambda a, v: neighbour_mix(a, v, 3), (a, key))


def test_relative_positions_translation_equivariant_and_used():
    torch.manual_seed(0)
    layer = LocalSelfAttention(2, 4, kernel_size=3, num_heads=2).double()
    x = torch.randn(1, 2, 10, 10, dtype=torch.double)
    shifted = torch.roll(x, shifts=(2, 1), dims=(2, 3))
    y, ys = layer(x), layer(shifted)
    # away from the borders (and from the wrapped rows/columns) the output moves with the input
    torch.testing.assert_close(ys[..., 3:9, 2:9], y[..., 1:7, 1:8], rtol=1e-10, atol=1e-10)
    # the position term matters: a large embedding for row offset -1 pulls every query's attention up
    with torch.no_grad():
        layer.qkv.weight.zero_()
        layer.qkv.weight[:4, 0] = 1.0  # q = x channel 0 in every query channel, k = v = 0
        layer.rel_row.zero_()
        layer.rel_row[:, :, 0] = 50.0
        layer.rel_col.zero_()
    _, cache = run_with_cache(layer, x.abs() + 1.0, names="hook_pattern")
    pattern = cache["hook_pattern"]  # (1, h, H, W, k, k)
    assert pattern[0, :, 5, 5, 0].sum(-1).min() > 0.99  # row offset -1 takes the weight
    assert (pattern[0, :, 0, 5, 0] == 0).all()  # top row: nothing above, the weight stays on real pixels
    assert torch.allclose(pattern[0, :, 0, 5, 1:].sum((-1, -2)), torch.ones(2, dtype=torch.double))


def test_hook_pattern_is_the_attention_the_layer_used(path):
    torch.manual_seed(0)
    layer = LocalSelfAttention(3, 4, kernel_size=3, num_heads=2)
    x = torch.randn(2, 3, 6, 5)
    out, cache = run_with_cache(layer, x, names=["hook_pattern", "hook_v"])
    p, v = cache["hook_pattern"], cache["hook_v"]  # (B, h, H, W, 3, 3), (B, 4, H, W)
    assert p.shape == (2, 2, 6, 5, 3, 3)
    torch.testing.assert_close(p.sum((-1, -2)), torch.ones(2, 2, 6, 5))
    assert (p[:, :, 0, :, 0] == 0).all() and (p[:, :, :, -1, :, 2] == 0).all()  # outside the image
    vu = F.unfold(v, 3, padding=1).view(2, 2, 2, 3, 3, 6, 5)  # (B, h, d, u, w, H, W)
    torch.testing.assert_close(torch.einsum("bhyxuw,bhduwyx->bhdyx", p, vu).reshape(2, 4, 6, 5), out)
    # a hook that replaces the pattern changes what is mixed (uniform attention = local mean of v)
    with hooks(layer, {"hook_pattern": lambda t, n: torch.full_like(t, 1 / 9)}):
        mean = layer(x)
    torch.testing.assert_close(mean, F.avg_pool2d(v, 3, 1, 1, count_include_pad=True))


def test_attention_macs_counted_by_hand():
    layer = LocalSelfAttention(6, 8, kernel_size=5, num_heads=2)
    B, H, W = 2, 7, 9
    macs = count_macs(layer, torch.randn(B, 6, H, W))
    qkv = B * H * W * 6 * 24
    dot = mix = B * 8 * H * W * 25  # q·k and a·v over every neighbour offset
    position = B * 8 * H * W * 5  # q_row·r_row (d/2 · k) + q_col·r_col (d/2 · k) per head
    assert macs.total == qkv + dot + mix + position
    assert macs.by_op["attentionlite.neighbour_dot"] == macs.by_op["attentionlite.neighbour_mix"] == dot


# --------------------------------------------------------------------------------------------
# Students
# --------------------------------------------------------------------------------------------


def _bottleneck_params(cin: int, w: int, k: int, down: bool) -> int:
    out = 4 * w
    return cin * w + 2 * w + 3 * w * w + w * k + 2 * w + w * out + 2 * out + (cin * out + 2 * out if down else 0)


@pytest.mark.parametrize("name,layers", [("sa_resnet26", (1, 2, 4, 1)), ("sa_resnet38", (2, 3, 5, 2))])
def test_paper_size_parameter_counts_by_hand(name, layers):
    model = timm.create_model(name, num_classes=100)
    cin, total = 64, 3 * 64 * 9 + 2 * 64  # CIFAR stem conv + BN
    for n, w in zip(layers, (64, 128, 256, 512)):
        for b in range(n):
            total += _bottleneck_params(cin, w, 7, b == 0)
            cin = 4 * w
    total += 2048 * 100 + 100
    assert sum(p.numel() for p in model.parameters()) == total
    homog = timm.create_model(name, stem="attention")  # stem = local attention 3 -> 64 (k = 3, 8 heads)
    assert sum(p.numel() for p in homog.parameters()) == total - 3 * 64 * 9 + 3 * 192 + 64 * 3 - (2048 * 90 + 90)


def test_demo_student_stages_line_up_with_cnn_demo():
    student, teacher = timm.create_model("sa_resnet_demo"), timm.create_model("cnn_demo")
    x = torch.randn(2, 1, 28, 28)
    s_maps, t_maps = stage_at_maps(student, x), stage_at_maps(teacher, x)
    assert list(s_maps) == list(t_maps) == [f"stages.{i}.hook_out" for i in range(4)]
    assert [m.shape for m in s_maps.values()] == [m.shape for m in t_maps.values()]
    assert [tuple(m.shape[-2:]) for m in s_maps.values()] == [(28, 28), (14, 14), (7, 7), (4, 4)]
    _, cache = run_with_cache(student, x, names="*.hook_pattern")
    # attention runs before the block's 2×2 average pool (Ramachandran et al.), at the stage's input size
    assert cache["layer2.0.attn.hook_pattern"].shape == (2, 2, 28, 28, 3, 3)
    assert cache["layer3.0.attn.hook_pattern"].shape == (2, 2, 14, 14, 3, 3)
    homog = timm.create_model("sa_resnet_demo", stem="attention")
    _, cache = run_with_cache(homog, x, names="conv1.hook_pattern")
    assert cache["conv1.hook_pattern"].shape == (2, 2, 28, 28, 3, 3)


def test_query_attention_places_the_window():
    torch.manual_seed(0)
    model = TEST.build().eval()
    x = torch.randn(2, 1, 12, 12)
    maps = query_attention(model, x, (0.5, 0.0))
    _, cache = run_with_cache(model, x, names="layer1.0.attn.hook_pattern")
    entry = maps["layer1.0.attn"]
    i, j = entry["query"]
    assert (i, j) == (6, 0)
    m = entry["map"]  # (B, h, 12, 12)
    torch.testing.assert_close(m.sum((-1, -2)), torch.ones(2, 2))
    assert (m[..., :5, :] == 0).all() and (m[..., :, 2:] == 0).all()
    torch.testing.assert_close(m[..., 5:8, 0:2], cache["layer1.0.attn.hook_pattern"][:, :, 6, 0, :, 1:])


# --------------------------------------------------------------------------------------------
# Eq. 2
# --------------------------------------------------------------------------------------------


def test_at_loss_equals_hand_computation():
    torch.manual_seed(0)
    s = [torch.randn(3, 5, 4, 4), torch.randn(3, 2, 2, 2)]
    t = [torch.randn(3, 7, 4, 4), torch.randn(3, 9, 2, 2)]
    hand_sq, hand_norm = 0.0, 0.0
    for a, b in zip(s, t):
        fa = (a ** 2).sum(1).flatten(1)  # Σ_c |A_c|^2, (B, HW)
        fb = (b ** 2).sum(1).flatten(1)
        da = fa / fa.norm(dim=1, keepdim=True) - fb / fb.norm(dim=1, keepdim=True)
        hand_sq += (da ** 2).sum().item() / da.numel()
        hand_norm += da.norm(dim=1).mean().item()
    assert at_loss(s, t).item() == pytest.approx(hand_sq, rel=1e-5)
    assert at_loss(s, t, form="norm").item() == pytest.approx(hand_norm, rel=1e-5)
    torch.testing.assert_close(at_map(s[0]).norm(dim=1), torch.ones(3))


def test_kd_part_equals_hand_kl():
    torch.manual_seed(0)
    zs, zt, rho = torch.randn(4, 10), torch.randn(4, 10) * 3, 4.0
    ps, pt = torch.softmax(zs / rho, -1), torch.softmax(zt / rho, -1)
    hand = (pt * (pt.log() - ps.log())).sum() / 4
    assert kd_loss(zs, zt, rho).item() == pytest.approx(hand.item() * rho ** 2, rel=1e-5)
    assert kd_loss(zs, zt, rho, scale=False).item() == pytest.approx(hand.item(), rel=1e-5)


def test_sparse_distillation_loss_is_eq2():
    torch.manual_seed(0)
    teacher, student = timm.create_model("cnn_demo").eval(), timm.create_model("sa_resnet_demo").train()
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    loss_fn = SparseDistillationLoss(teacher, alpha=0.1, beta=1000.0, rho=4.0, student=student)
    loss, parts = loss_fn(student, x, y)
    names = [f"stages.{i}.hook_out" for i in range(4)]
    zs, s_cache = run_with_cache(student, x, names=names)
    zt, t_cache = run_with_cache(teacher, x, names=names)
    at = at_loss([s_cache[n] for n in names], [t_cache[n] for n in names])
    expected = 0.1 * F.cross_entropy(zs, y) + 0.9 * kd_loss(zs, zt, 4.0) + 500.0 * at
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)
    assert set(parts) == {"ce", "kl", "at"}
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    kd_only, parts = SparseDistillationLoss(teacher, beta=0.0)(student, x, y)
    assert "at" not in parts


def test_teacher_without_stages_or_other_sizes_refused():
    student = timm.create_model("sa_resnet_demo")
    with pytest.raises(ValueError, match=r"teacher \(VisionTransformer\) has no hook point stages\.0\.hook_out"):
        SparseDistillationLoss(timm.create_model("vit_demo"), student=student)
    SparseDistillationLoss(timm.create_model("vit_demo"), beta=0.0, student=student)  # KD only needs no stages
    imagenet_stem = timm.create_model("resnet18", num_classes=10, in_chans=1)  # stages 7/4/2/1 on 28×28
    x, y = torch.randn(2, 1, 28, 28), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="stages.0.hook_out: the student's map is \\(28, 28\\).*resize='pool'"):
        SparseDistillationLoss(imagenet_stem, student=student)(student, x, y)
    loss, _ = SparseDistillationLoss(imagenet_stem, student=student, resize="pool")(student, x, y)
    assert torch.isfinite(loss)


# --------------------------------------------------------------------------------------------
# Sparse momentum (Algorithm 1)
# --------------------------------------------------------------------------------------------


def _outside_zero(model: nn.Module, hook: SparseMomentum) -> bool:
    masks = hook.weight_masks()
    mods = dict(model.named_modules())
    return all((mods[n].weight.detach()[~m] == 0).all() for n, m in masks.items())


@pytest.mark.parametrize("pruning", ["irregular", "column"])
def test_density_holds_after_every_step_and_update(pruning):
    torch.manual_seed(0)
    model = TEST.build()
    hook = SparseMomentum(model, 0.3, pruning, epochs=4, update_at="epoch_end")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 1, 12, 12), torch.randint(0, 10, (8,))
    widest = max(hook.unit_size.values())
    for epoch in range(4):
        for _ in range(2):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            hook.after_step(model, opt)
            kept = sum(hook.kept().values())
            assert _outside_zero(model, hook)
            if pruning == "irregular":
                assert kept == hook.budget == round(0.3 * hook.total)
            else:
                assert 0 <= hook.budget - kept < widest
        before = {n: m.clone() for n, m in hook.masks.items()}
        metrics = hook.on_epoch_end(model, opt, epoch)
        kept = sum(hook.kept().values())
        assert metrics["density"] == pytest.approx(kept / hook.total)
        if pruning == "irregular":
            assert kept == hook.budget
        else:
            assert 0 <= hook.budget - kept < widest
        changed = any((before[n] != hook.masks[n]).any() for n in hook.names)
        assert changed == (epoch < 3)  # no update after the last epoch
        assert _outside_zero(model, hook)
    dens = layer_densities(model)
    assert set(dens) == set(hook.names) and all(v <= hook.layer_densities()[n] + 1e-6 for n, v in dens.items())


def test_regrowth_follows_momentum():
    """Constructed case: layer 0's mean active momentum is 3× layer 1's, so it regrows 3/4 of the freed weights,
    each layer at its largest-momentum inactive positions; pruning takes the smallest active magnitudes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 10, bias=False), nn.Linear(10, 10, bias=False))
    hook = SparseMomentum(model, 0.4, "irregular", epochs=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    old, expect_pruned, expect_grown = {}, {}, {}
    for i, layer in enumerate(model):
        w, mask = layer.weight, hook.masks[str(i)].view(10, 10)
        old[str(i)] = hook.masks[str(i)].clone()
        with torch.no_grad():
            w.copy_(torch.where(mask, torch.arange(1.0, 101.0).view(10, 10), torch.zeros(())))  # |w| grows with position
        active = mask.flatten().nonzero().flatten()
        inactive = (~mask).flatten().nonzero().flatten()
        assert len(active) == 40
        mom = torch.zeros(100)
        mom[active[20:]] = 6.0 if i == 0 else 2.0  # mean over active: 3 : 1; the 20 to be pruned have none
        mom[inactive] = torch.linspace(0.01, 0.5, len(inactive))  # later inactive = larger momentum
        opt.state[w]["momentum_buffer"] = mom.view(10, 10)
        expect_pruned[str(i)] = set(active[:20].tolist())  # ⌈0.5 · 40⌉ smallest magnitudes
        expect_grown[str(i)] = set(inactive[-(30 if i == 0 else 10):].tolist())
    grown = hook.prune_regrow(model, opt, rate=0.5)
    assert grown == {"0": 30, "1": 10}  # 20 + 20 freed, regrown 3 : 1
    for i, layer in enumerate(model):
        before, after = old[str(i)], hook.masks[str(i)]
        assert set((before & ~after).nonzero().flatten().tolist()) == expect_pruned[str(i)]
        assert set((after & ~before).nonzero().flatten().tolist()) == expect_grown[str(i)]
        assert (layer.weight.detach().view(-1)[list(expect_grown[str(i)])] == 0).all()  # regrown weights start at zero
    assert sum(hook.kept().values()) == hook.budget == 80


def test_update_deferred_to_the_next_step_by_default():
    torch.manual_seed(0)
    model = TEST.build()
    hook = SparseMomentum(model, 0.3, "irregular", epochs=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 1, 12, 12), torch.randint(0, 10, (8,))

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        hook.after_step(model, opt)

    step()
    before = {n: m.clone() for n, m in hook.masks.items()}
    assert hook.on_epoch_end(model, opt, 0)["prune_rate"] == 0.5
    assert hook.updates == 0 and all(torch.equal(before[n], hook.masks[n]) for n in hook.names)
    assert hook.state_dict()["pending"] == 0.5
    step()
    assert hook.updates == 1 and any(not torch.equal(before[n], hook.masks[n]) for n in hook.names)
    assert sum(hook.kept().values()) == hook.budget and _outside_zero(model, hook)


def test_prune_rate_schedules():
    assert [prune_rate(0.5, e, 5) for e in range(4)] == pytest.approx([0.5, 0.375, 0.25, 0.125])
    assert prune_rate(0.5, 2, 5, "cosine") == pytest.approx(0.25)
    assert prune_rate(0.5, 0, 5, "cosine") == pytest.approx(0.5)


def test_resume_is_exact_with_hook_state(tmp_path):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(24, 1, 12, 12), torch.randint(0, 10, (24,)))
    cfg = TrainConfig(epochs=3, batch_size=8, lr=0.05, opt="momentum", weight_decay=0.0, sched="cosine",
                      warmup_epochs=0, progress=False, device="cpu")

    def run(ckpt, stop_after=None):
        torch.manual_seed(1)
        model = TEST.build()
        hook = SparseMomentum(model, 0.4, "column", epochs=3, seed=3)
        fit(model, data, None, cfg, hooks=[hook], ckpt_dir=ckpt, stop_after=stop_after)
        return model, hook

    full_model, full_hook = run(tmp_path / "a")
    run(tmp_path / "b", stop_after=1)
    resumed_model, resumed_hook = run(tmp_path / "b")
    assert resumed_hook.updates == full_hook.updates == 2
    for n in full_hook.names:
        assert torch.equal(full_hook.masks[n], resumed_hook.masks[n])
    for (k, a), (_, b) in zip(full_model.state_dict().items(), resumed_model.state_dict().items()):
        assert torch.equal(a, b), k


def test_bad_inputs_refused():
    model = TEST.build()
    for bad in (0.0, -0.1, 1.5, float("nan"), "0.5", True):
        with pytest.raises(ValueError, match=r"density must be a number in \(0, 1\]"):
            SparseMomentum(model, bad, epochs=2)
    with pytest.raises(ValueError, match="unknown pruning kind 'filter'"):
        SparseMomentum(model, 0.5, "filter", epochs=2)
    hook = SparseMomentum(model, 0.5, epochs=2)
    plain_sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    hook.on_epoch_end(model, plain_sgd, 0)  # schedules the update
    with pytest.raises(ValueError, match="holds no momentum"):
        hook.after_step(model, plain_sgd)
    with pytest.raises(ValueError, match="resume with the same --density"):
        SparseMomentum(model, 0.3, epochs=2).load_state_dict(hook.state_dict())
    with pytest.raises(ValueError, match="not column-structured"):
        shrink(model, hook.weight_masks())


# --------------------------------------------------------------------------------------------
# Deploy form
# --------------------------------------------------------------------------------------------


def test_kept_parameters_counted_from_the_masks_by_hand():
    """Paper-size reductions divide by the pruned model's size: masked weights count by their masks, every other
    parameter counts whatever its value (a zero-initialised BN scale is not pruned; a kept weight may be 0)."""
    model = nn.Sequential(nn.Conv2d(2, 4, 3, bias=False), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 3))
    with torch.no_grad():
        model[1].weight.zero_()  # timm's zero_init_last: 4 scales of 0 (the 4 shifts start at 0 too)
        model[0].weight.fill_(1.0)
    masks = {"0": torch.zeros(4, 2, 3, 3, dtype=torch.bool), "3": torch.zeros(3, 4, dtype=torch.bool)}
    masks["0"].view(-1)[:10] = True
    masks["3"].view(-1)[:5] = True
    with torch.no_grad():
        model[0].weight.mul_(masks["0"])
        model[3].weight.mul_(masks["3"])
        model[3].weight.view(-1)[0] = 0.0  # a kept weight that happens to be 0
    c = count_params(model, masks=masks)
    # by hand: conv 72 weights (10 kept), BN 4 + 4 (all kept), linear 12 weights (5 kept) + 3 biases (kept)
    assert c["total"] == 72 + 8 + 12 + 3 and c["prunable"] == 72 + 12
    assert c["kept"] == 10 + 8 + 5 + 3 == 26
    # the non-zero count misses the zero BN scales, the BN shifts (initialised at 0) and the zero kept weight
    assert c["nonzero"] == 10 + 0 + 0 + 4 + 3
    assert count_params(model)["kept"] == 10 + 8 + 4 + 3  # without masks the prunable non-zeros stand in
    with pytest.raises(ValueError, match="matches no weight"):
        count_params(model, masks={"0": masks["3"]})
    # a student: timm's zero-initialised last BN of every block is counted as kept
    student = TEST.build("conv")
    hook = SparseMomentum(student, 0.25, "irregular", epochs=1)
    c = count_params(student, masks=hook.weight_masks())
    assert c["kept"] == c["total"] - c["prunable"] + sum(hook.kept().values()) > c["nonzero"]


@pytest.mark.parametrize("stem", ["conv", "attention"])
def test_shrunk_equals_masked_and_rebuilds_from_json(stem):
    torch.manual_seed(0)
    model = _randomise_bn(TEST.build(stem))
    hook = SparseMomentum(model, 0.4, "column", epochs=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(4, 1, 12, 12)
    for _ in range(2):
        opt.zero_grad()
        model(x).logsumexp(-1).mean().backward()
        opt.step()
        hook.after_step(model, opt)
    hook.on_epoch_end(model, opt, 0)  # a prune / regrow, so masks are not just the initial ones
    with torch.no_grad():
        for m in model.modules():  # regrown weights are zero: give every kept weight a value
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.weight.add_(torch.randn_like(m.weight) * 0.1)
    hook.apply(model)
    model.eval()
    masks = hook.weight_masks()
    small = shrink(model, masks)
    torch.testing.assert_close(small(x), model(x), rtol=0, atol=1e-5)
    assert count_params(small)["total"] < count_params(model)["total"]
    # the shrunk model drops more than the masks: filters of conv1 / value rows whose only reader lost the column
    assert count_params(small)["prunable"] < sum(hook.kept().values()) == count_params(model)["prunable_nonzero"]
    assert count_macs_sparse(small, x[:1])["dense"] < count_macs_sparse(model, x[:1])["dense"]
    _, a = run_with_cache(model, x, names="layer3.0.attn.hook_pattern")
    _, b = run_with_cache(small, x, names="layer3.0.attn.hook_pattern")
    torch.testing.assert_close(a["layer3.0.attn.hook_pattern"], b["layer3.0.attn.hook_pattern"], rtol=0, atol=1e-6)
    kwargs = json.loads(json.dumps(deploy_kwargs(masks, TEST.model, TEST.kwargs(stem))))
    rebuilt = timm.create_model("sa_resnet_column", **kwargs)
    rebuilt.load_state_dict(small.state_dict(), strict=True)
    torch.testing.assert_close(rebuilt.eval()(x), model(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("stem", ["conv", "attention"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def test_shrink_keeps_dtype_and_device(stem, device):
    """A float64 model shrinks in float64 where it lives, and equals its masked form to float64 rounding."""
    torch.manual_seed(0)
    model = _randomise_bn(TEST.build(stem)).to(device=device, dtype=torch.float64)
    hook = SparseMomentum(model, 0.4, "column", epochs=1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.weight.add_(torch.randn_like(m.weight) * 0.1)
    hook.apply(model)
    model.eval()
    small = shrink(model, hook.weight_masks())
    floats = [t for t in [*small.parameters(), *small.buffers()] if t.is_floating_point()]
    assert {t.dtype for t in floats} == {torch.float64}
    assert {t.device.type for t in [*small.parameters(), *small.buffers()]} == {device}
    x = torch.randn(3, 1, 12, 12, dtype=torch.float64, device=device)
    with torch.no_grad():
        torch.testing.assert_close(small(x), model(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name,kwargs", [("sa_resnet", TEST.kwargs("attention")), ("sa_resnet_demo", {"num_classes": 5}),
                                         ("sa_resnet26", {"num_classes": 100, "stem": "attention"})])
def test_registered_forms_rebuild_from_json_kwargs(name, kwargs):
    kwargs = json.loads(json.dumps(kwargs))
    a, b = timm.create_model(name, **kwargs), timm.create_model(name, **kwargs)
    b.load_state_dict(a.state_dict(), strict=True)
    with pytest.raises(ValueError, match="no published weights"):
        timm.create_model(name, pretrained=True, **kwargs)
