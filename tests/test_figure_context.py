"""The figure context's reads: an extraction on a model that is no run is computed once and read back."""

from __future__ import annotations

import torch

import methods.teachers  # noqa: F401
from workbench.analysis import get_extractor, load_all


def test_extract_on_a_model_that_is_no_run_is_stored_and_read_back(tmp_path, monkeypatch):
    import timm

    from workbench.figures.context import Context

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    load_all()
    builds = []

    def build():
        builds.append(1)
        torch.manual_seed(0)
        return timm.create_model("vit_demo", depth=2).eval()

    ctx = Context("smoke", device="cpu", log=lambda s: None)
    first = ctx.extract("attention", "vit_demo-depth2-seed0", build, "demo:val[:2]").load()
    again = ctx.extract("attention", "vit_demo-depth2-seed0", build, "demo:val[:2]").load()
    assert builds == [1]  # the second call read the store
    assert first.attrs["model_name"] == "vit_demo-depth2-seed0" and first.attrs["analysis"] == "attention"
    x = ctx.images("demo:val[:2]", build()).tensor
    want = get_extractor("attention")(build(), x)  # an independent extraction of the same model and images
    torch.testing.assert_close(torch.from_numpy(again["attention"].values), torch.from_numpy(want["attention"].values))
    forced = Context("smoke", device="cpu", force=True, log=lambda s: None)
    forced.extract("attention", "vit_demo-depth2-seed0", build, "demo:val[:2]")
    assert len(builds) == 4  # --force recomputes (once per context)


def test_stored_data_of_another_version_of_its_function_is_recomputed(tmp_path, monkeypatch):
    """A home built by older code holds data in an older form: the changed data function recomputes it."""
    import xarray as xr

    from workbench.figures import DATA, dataset
    from workbench.figures.context import Context

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    calls = []

    def v1(ctx):
        calls.append("v1")
        return xr.Dataset({"value": ("i", [1.0])})

    def v2(ctx):
        calls.append("v2")
        return xr.Dataset({"value": ("i", [1.0]), "correct": ("i", [1.0])})

    try:
        dataset("versiontoy.data")(v1)
        ctx = Context("smoke", device="cpu", log=lambda s: None)
        assert "correct" not in ctx.data("versiontoy.data")
        assert ctx.is_fresh("versiontoy.data") and "correct" not in ctx.data("versiontoy.data")
        assert calls == ["v1"]  # the same function: read back
        dataset("versiontoy.data")(v2)  # the code changed
        later = Context("smoke", device="cpu", log=lambda s: None)
        assert not later.is_fresh("versiontoy.data")
        assert "correct" in later.data("versiontoy.data") and calls == ["v1", "v2"]
    finally:
        DATA.pop("versiontoy.data", None)


def test_data_being_computed_elsewhere_is_waited_for_and_read_back(tmp_path, monkeypatch):
    """Two contexts on one home (two xdist workers, a notebook beside `workbench figures`) ask for the same data at
    once: the second waits on the data's file lock (its own file descriptor, as another process's would be) and reads
    back what the first stored; the data function runs once."""
    import threading
    import time

    import xarray as xr

    from workbench.figures import DATA, dataset
    from workbench.figures.context import Context

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    started, go, calls, logs, got = threading.Event(), threading.Event(), [], [], {}

    @dataset("locktoy.data")
    def make(ctx):
        calls.append(1)
        started.set()
        assert go.wait(30)
        return xr.Dataset({"value": ("i", [float(len(calls))])})

    def ask(name):
        got[name] = Context("smoke", device="cpu", log=logs.append).data("locktoy.data").load()

    try:
        first = threading.Thread(target=ask, args=("first",))
        first.start()
        assert started.wait(30)
        second = threading.Thread(target=ask, args=("second",))
        second.start()
        for _ in range(300):  # until the second one waits on the lock
            if logs:
                break
            time.sleep(0.1)
        assert logs == ["figure data locktoy.data is being computed by another process; waiting for it"]
        go.set()
        first.join(30)
        second.join(30)
        assert calls == [1] and float(got["first"]["value"][0]) == float(got["second"]["value"][0]) == 1.0
    finally:
        go.set()
        DATA.pop("locktoy.data", None)
