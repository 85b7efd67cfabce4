"""Training seeds of the runs behind the seed-level verdicts: seed 0 keeps every run id (existing runs are reused),
every other seed gets its own; the budgets name the seeds per profile."""

from __future__ import annotations

from dataclasses import replace

import pytest

from methods.nondeep import JoinConfig


def test_far_table3_ids():
    from workbench.pipelines.far.run import run_id

    assert run_id("vit-demo", "cls", table3=True) == run_id("vit-demo", "cls", table3=True, seed=0) == "far_table3_cls-vit-demo"
    assert run_id("vit-demo", "cls", table3=True, seed=2) == "far_table3_cls_s2-vit-demo"
    assert run_id("vit-demo", seed=2) == "far-vit-demo"  # the seed names Table 3 runs only (others refuse a seed)


def test_sparsifiner_ids():
    from workbench.pipelines.sparsifiner.run import run_id

    assert run_id("vit-demo", "keep", 0.25) == "sparsifiner-k0.25-vit-demo"
    assert run_id("vit-demo", "keep", 0.25, seed=1) == "sparsifiner-k0.25-s1-vit-demo"
    assert run_id("vit-demo", "phase1", seed=1) == "sparsifiner_phase1-s1-vit-demo"
    assert run_id("vit-demo", "keep", 0.1, True, seed=2) == "sparsifiner-k0.1-renorm-s2-vit-demo"


def test_slimswin_ids():
    from workbench.pipelines.slimswin.run import RECIPES, run_id

    cfg = replace(RECIPES["demo"].method, target_ratio=2 / 3)
    assert run_id("swin-demo", 2 / 3, cfg, RECIPES["demo"].method) == "slimswin-r0.6667-swin-demo"
    assert run_id("swin-demo", 2 / 3, cfg, RECIPES["demo"].method, 1) == "slimswin-r0.6667-swin-demo-s1"


def test_nondeep_ids():
    from workbench.pipelines.nondeep.run import JoinPlan

    join = JoinConfig(schedule="linear", warmup_steps=4, adjust_steps=4)

    def ids(seed: int) -> tuple[str, str, str]:
        p = JoinPlan(join, 1, 8, 6, 3, "vit-demo", True, join, seed, 0)
        return p.collapsed_id, p.branched_id, p.baseline_id

    assert ids(0) == ("nondeep_table5-n3-linear-div0.05-vit-demo", "nondeep_table5_branched-n3-linear-div0.05-vit-demo",
                      "nondeep_depth-d2-table5-vit-demo")
    assert ids(2) == ("nondeep_table5-n3-linear-div0.05-s2-vit-demo",
                      "nondeep_table5_branched-n3-linear-div0.05-s2-vit-demo", "nondeep_depth-d2-table5-s2-vit-demo")


@pytest.mark.parametrize("profile,seeds", [("demo", 3), ("smoke", 2), ("paper", 1)])
def test_budgets_name_the_seeds(profile, seeds):
    from workbench.pipelines import budget

    one_in_smoke = 1 if profile == "smoke" else seeds  # the suite's time: only Non-deep's smoke rows train two seeds
    assert len(budget("attentionlite", profile).gain_seeds) == one_in_smoke
    assert len(budget("nondeep", profile).ablation_seeds) == seeds
    assert len(budget("sparsifiner", profile).sweep_seeds) == one_in_smoke
    assert len(budget("slimswin", profile).run_seeds) == one_in_smoke
    # FAR's smoke profile has no Table 3 ablation budget: its Table 3 reads the main runs, seed 0 only
    assert len(budget("far", profile).ablation_seeds) == (1 if profile == "smoke" else seeds)
    for method, field in (("attentionlite", "gain_seeds"), ("nondeep", "ablation_seeds"), ("sparsifiner", "sweep_seeds"),
                          ("slimswin", "run_seeds"), ("far", "ablation_seeds")):
        assert getattr(budget(method, profile), field)[0] == 0  # the first seed is the runs the other items use
