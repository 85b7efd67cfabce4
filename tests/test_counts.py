"""compare.table1's counts: weights wherever a model stores them, and the MACs its deploy form executes."""

from __future__ import annotations

import copy

import pytest
import torch

from methods.flops import count_macs
from methods.slimswin import add_gates, set_mask, to_pruned
from methods.slimswin.flops import uniform_masks
from methods.sparsifiner import SparsifinerConfig, executed_mhsa_macs, replace_attention, to_sparse_path
from workbench.figures import STUDENTS, load_all
from workbench.models import create_model
from workbench.pipelines.common import model_counts, stored_weights

pytestmark = pytest.mark.usefixtures("one_thread")

_WEIGHT_BUFFERS = ("qkv_weight_", "qkv_bias_", "attn_bias_", "proj_weight_", "proj_bias")


def _by_hand(model: torch.nn.Module) -> int:
    """Parameters plus the pruned attentions' weight buffers, named one by one (not the masks or indices)."""
    n = sum(p.numel() for p in model.parameters())
    for mod in model.modules():
        for name, b in mod.named_buffers(recurse=False):
            if name.startswith(_WEIGHT_BUFFERS) and b is not None:
                n += b.numel()
    return n


def test_slimswin_deploy_form_weights_are_counted_in_its_buffers():
    torch.manual_seed(0)
    teacher = create_model("swin_demo").eval()
    gated = add_gates(copy.deepcopy(teacher)).eval()
    counts = {}
    for pruned_pairs in (4, 12):
        set_mask(gated, uniform_masks(gated, pruned_pairs))
        deploy = to_pruned(gated).eval()
        counts[pruned_pairs] = stored_weights(deploy)
        assert counts[pruned_pairs] == _by_hand(deploy)
        assert counts[pruned_pairs] > sum(p.numel() for p in deploy.parameters())  # parameters() alone misses them
        assert model_counts(deploy)["params"] == counts[pruned_pairs]
    assert counts[4] != counts[12]  # more pruned pairs, fewer stored attention weights
    assert stored_weights(teacher) == sum(p.numel() for p in teacher.parameters())  # no weight buffers in the teacher
    cnn = create_model("cnn_demo")
    assert stored_weights(cnn) == sum(p.numel() for p in cnn.parameters())  # BatchNorm statistics are not weights


def test_sparsifiner_students_report_the_macs_their_sparse_path_executes():
    torch.manual_seed(0)
    load_all()
    teacher = create_model("vit_demo").eval()
    x = torch.zeros(1, 1, 28, 28)
    macs = {}
    for label, k in (("Sparsifiner k=0.25", 0.25), ("Sparsifiner k=0.1", 0.1)):
        student = replace_attention(teacher, SparsifinerConfig(keep_rate=k, n_down=8)).eval()
        deploy = STUDENTS[label].deploy(student)  # what compare.table1 counts
        macs[k] = model_counts(deploy)["macs"]
        count = count_macs(deploy, x)
        for i, blk in enumerate(deploy.blocks):  # the one counter's attention MACs == the Sparsifiner accountant's
            attention = count.within(f"blocks.{i}.attn") - count.within(f"blocks.{i}.attn.qkv") \
                - count.within(f"blocks.{i}.attn.proj")
            assert attention == executed_mhsa_macs(blk.attn)
        assert model_counts(student)["macs"] > macs[k]  # the masked train form computes every pair
    gap = sum(executed_mhsa_macs(a.attn) for a in to_sparse_path(replace_attention(
        teacher, SparsifinerConfig(keep_rate=0.25, n_down=8))).blocks) - sum(executed_mhsa_macs(a.attn) for a in to_sparse_path(
            replace_attention(teacher, SparsifinerConfig(keep_rate=0.1, n_down=8))).blocks)
    assert macs[0.25] - macs[0.1] == gap > 0


def test_latency_ratio_interval_equals_scipy_paired_t_on_log_times():
    """compare.table1's latency interval: a paired t-interval of log(student / teacher) over the rounds, exponentiated
    (scipy's ttest_rel on the log times, computed independently)."""
    import numpy as np
    from scipy.stats import ttest_rel

    from workbench.figures.compare.findings import latency_ratio

    rng = np.random.default_rng(0)
    teacher = 10 * np.exp(0.3 * rng.standard_normal(24))
    student = 0.8 * teacher * np.exp(0.05 * rng.standard_normal(24))
    ratio, lo, hi = latency_ratio(student, teacher)
    ci = ttest_rel(np.log(student), np.log(teacher)).confidence_interval(0.95)
    np.testing.assert_allclose([lo, hi], np.exp([ci.low, ci.high]), rtol=1e-12)
    np.testing.assert_allclose(ratio, np.exp(np.mean(np.log(student / teacher))), rtol=1e-12)
    with pytest.raises(ValueError, match="positive times"):
        latency_ratio(np.array([1.0, -1.0]), np.array([1.0, 1.0]))
