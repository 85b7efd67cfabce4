"""workbench.pipelines.teacher_memo: a teacher's outputs remembered by the input batch's bytes, exact, bounded; the
SlimSwin arms of one seed share them and train the same weights as without the memo."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn as nn

from workbench.pipelines import teacher_memo as tm


@pytest.fixture(autouse=True)
def _empty():
    tm.clear()
    yield
    tm.clear()


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 4)).eval()


def test_a_hit_is_the_forward_pass_exactly_and_anything_else_misses():
    net, x = _net(), torch.randn(8, 6)
    with torch.no_grad():
        direct = net(x)
    first = tm.teacher_logits(net, x, "k")
    again = tm.teacher_logits(net, x.clone(), "k")  # same bytes, another tensor
    assert torch.equal(first, direct) and torch.equal(again, direct)
    assert tm.stats()["hits"] == 1 and tm.stats()["misses"] == 1
    again.add_(1.0)  # a caller's in-place change does not reach the memo
    assert torch.equal(tm.teacher_logits(net, x, "k"), direct)
    y = x.clone()
    y[3, 2] += 1e-6  # one changed input value
    assert not torch.equal(tm.teacher_logits(net, y, "k"), direct)
    tm.teacher_logits(net, x, "other weights")  # another teacher key
    tm.teacher_logits(net, x[:4], "k")  # another batch
    assert tm.stats()["misses"] == 4 and tm.stats()["hits"] == 2


def test_unknown_key_or_training_mode_is_never_remembered():
    net, x = _net(), torch.randn(4, 6)
    tm.teacher_logits(net, x, None)
    tm.teacher_logits(net.train(), x, "k")
    assert tm.stats() == {"hits": 0, "misses": 0, "bytes": 0, "entries": 0}


def test_the_memo_stays_within_its_bytes_least_recent_out(monkeypatch):
    monkeypatch.setattr(tm, "LIMIT_BYTES", 3 * 8 * 4 * 4)  # three (8, 4) float32 outputs
    net = _net()
    xs = [torch.full((8, 6), float(i)) for i in range(5)]
    for x in xs:
        tm.teacher_logits(net, x, "k")
    assert tm.stats()["entries"] == 3 and tm.stats()["bytes"] <= tm.LIMIT_BYTES
    tm.teacher_logits(net, xs[-1], "k")  # kept (recent)
    tm.teacher_logits(net, xs[0], "k")  # evicted: computed again
    assert tm.stats()["hits"] == 1 and tm.stats()["misses"] == 6


@pytest.mark.integration
def test_slimswin_baseline_shares_its_seeds_teacher_logits_and_trains_the_same_weights(smoke_teacher, monkeypatch):
    """SlimSwin and its random-mask baseline of one seed fine-tune on the same batches: the baseline's teacher logits all
    come from the memo, and its weights equal those of the same run trained without the memo."""
    from workbench.pipelines import run_method

    teacher = smoke_teacher("swin")
    quiet = dict(device="cpu", log=lambda *_: None)
    run_method("slimswin", teacher, "smoke", ratio=1 / 3, seed=11, **quiet)
    asked = tm.stats()["misses"]
    base = run_method("slimswin", teacher, "smoke", ratio=1 / 3, seed=11, masks="random", **quiet)
    assert tm.stats()["hits"] == asked > 0 and tm.stats()["misses"] == asked  # every batch: a hit
    with_memo = base.manifest["checkpoint_sha256"]
    shutil.rmtree(base.dir)
    plain = tm.teacher_logits
    monkeypatch.setattr(tm, "teacher_logits", lambda t, images, key: plain(t, images, None))
    again = run_method("slimswin", teacher, "smoke", ratio=1 / 3, seed=11, masks="random", **quiet)
    assert again.manifest["checkpoint_sha256"] == with_memo
