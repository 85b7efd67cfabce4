"""Every registered finding's verdict rule, driven to each verdict it can give by changing the item's data.

The cases live in ``tests/verdict_cases_<method>.py``: each module defines ``CASES``, a dict from a figure id to a
list of :class:`Case` (a name, a function building the item's Datasets, the verdict expected). A rule is a
measurement only if it can come out each way: every figure with a finding must have cases reaching "shown",
"partly" and "not shown", and cases on both sides of each threshold it uses.
"""

from __future__ import annotations

import importlib
import pathlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import xarray as xr

from workbench.figures import load_all

STATUSES = ("shown", "partly", "not shown")


@dataclass(frozen=True)
class Case:
    name: str  # what the case changes in the item's data, e.g. "FAR 2 points ahead, interval above 0"
    build: Callable[[], tuple[xr.Dataset, ...]]  # the item's Datasets, in the order the figure's data lists them
    expect: str  # the verdict the rule must give: "shown", "partly" or "not shown"


def _all_cases() -> dict[str, list[Case]]:
    cases: dict[str, list[Case]] = {}
    for path in sorted(pathlib.Path(__file__).parent.glob("verdict_cases_*.py")):
        module = importlib.import_module(path.stem)
        for fig_id, items in module.CASES.items():
            assert fig_id not in cases, f"{fig_id} has cases in two modules"
            cases[fig_id] = list(items)
    return cases


CASES = _all_cases()
PARAMS = [pytest.param(fig_id, case, id=f"{fig_id}:{case.name}") for fig_id, items in CASES.items() for case in items]


@pytest.mark.parametrize(("fig_id", "case"), PARAMS)
def test_rule_gives_the_expected_verdict(fig_id, case):
    spec = load_all()[fig_id]
    verdict = spec.verdict(*case.build())
    assert verdict is not None and verdict.status == case.expect, (
        f"{fig_id} [{case.name}]: expected {case.expect!r}, got {verdict.status!r} ({verdict.statistic})")


def test_every_finding_is_driven_to_every_verdict():
    with_finding = {fig_id for fig_id, spec in load_all().items() if spec.finding is not None}
    missing = sorted(with_finding - set(CASES))
    assert not missing, f"findings with no verdict cases: {missing}"
    short = {fig_id: sorted(set(STATUSES) - {c.expect for c in CASES[fig_id]}) for fig_id in with_finding}
    short = {k: v for k, v in short.items() if v}
    assert not short, f"findings never driven to these verdicts: {short}"
    unknown = sorted(set(CASES) - with_finding)
    assert not unknown, f"cases for ids that are not findings: {unknown}"
