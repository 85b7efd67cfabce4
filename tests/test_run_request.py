"""RunRequest carries what defines a run explicitly: the budget is a pure function of (method, profile, overrides,
data), the same inside and outside run_method; the overrides' tag ends the request's run ids (issue 28)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from workbench.pipelines import METHODS, Method, Overrides, budget, register_method, run_method
from workbench.runs import suffixed_id


@dataclass(frozen=True)
class _Budget:
    epochs: int = 3  # one phase
    batch_size: int = 16
    probe_images: str = "demo:val[:4]"  # an image spec (read from the user's val/ under the paper profile)


@pytest.fixture
def probe():
    """A method without a teacher whose run function records its request and the budget it looks up itself."""
    seen = {}

    def run(req):
        seen["req"], seen["looked_up"] = req, budget("probe", req.profile)
        return None

    register_method(Method("probe", "records its request", {"smoke": _Budget(), "paper": _Budget()}, run))
    yield seen
    METHODS.pop("probe", None)


def test_budget_is_pure():
    base = budget("far", "smoke")
    other = budget("far", "smoke", Overrides(epochs=((None, 7),), batch_size=(("distill", 4),)))
    assert other.distill.epochs == other.finetune.epochs == 7 and other.distill.batch_size == 4
    assert other.finetune.batch_size == base.finetune.batch_size != 4
    assert budget("far", "smoke") == base and base.distill.epochs != 7  # nothing left behind


def test_request_carries_overrides_images_suffix_and_device(probe):
    overrides = Overrides(epochs=((None, 1),), images=5)
    run_method("probe", profile="smoke", device="cpu", overrides=overrides, log=lambda s: None)
    req = probe["req"]
    assert req.budget == _Budget(epochs=1) == budget("probe", "smoke", overrides)
    assert probe["looked_up"] == _Budget()  # inside run_method budget() answers as outside: no ambient overrides
    assert req.overrides == overrides and req.images == 5
    assert req.id_suffix == "e1.n5" and req.run_id("probe-smoke") == "probe-smoke+e1.n5"
    assert isinstance(req.device, torch.device) and req.device.type == "cpu"
    run_method("probe", profile="smoke", device="cpu", log=lambda s: None)
    assert probe["req"].id_suffix == "" and probe["req"].run_id("probe-smoke") == "probe-smoke"
    assert probe["req"].budget == _Budget() and probe["req"].images is None


def test_strict_overrides_refused_before_the_run(probe):
    with pytest.raises(ValueError, match="no phase 'distill'"):
        run_method("probe", profile="smoke", device="cpu", overrides=Overrides(epochs=(("distill", 1),)),
                   log=lambda s: None)
    assert "req" not in probe


def test_suffixed_id():
    assert suffixed_id("far-vit-demo", "") == "far-vit-demo"
    assert suffixed_id("far-vit-demo", "e1.n12") == "far-vit-demo+e1.n12"
    assert suffixed_id("teacher-x-paper+flowers_3fa2", "e1") == "teacher-x-paper+flowers_3fa2.e1"
