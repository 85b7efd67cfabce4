"""The method contract end to end: a toy method defined in one file (tests/toy_method.py) gets a run, a
`workbench run` command, an extractor reading its hook points and a figure, with no edit anywhere else."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import toy_method

from workbench.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]


def test_toy_method_is_small():
    lines = [ln for ln in Path(toy_method.__file__).read_text().splitlines() if ln.strip()]
    assert len(lines) < 100, len(lines)


def test_toy_method_run_extract_and_figure(tmp_path, smoke_teacher, capsys):
    from workbench.analysis import get_extractor
    from workbench.data import load_images
    from workbench.models import load_model
    from workbench.runs import open_run

    teacher = smoke_teacher("vit")
    assert main(["run", "toy", "--gain", "2", "--profile", "smoke", "--device", "cpu"]) == 0
    run = open_run("toy-g2-vit-smoke")
    assert run.status == "complete" and 0 <= run.manifest["results"]["val_acc"] <= 1
    assert "run: " in capsys.readouterr().out

    student, base = load_model(run.id).model, load_model(teacher.id).model
    batch = load_images("demo:val[:3]")
    with torch.no_grad():
        torch.testing.assert_close(student(batch.tensor), 2 * base(batch.tensor))  # rebuilt from (timm name, kwargs)
    ds = get_extractor("toy_logits")(student, batch.tensor)
    torch.testing.assert_close(torch.from_numpy(ds["logits"].values), 2 * base(batch.tensor).detach())

    out = tmp_path / "figs"
    assert main(["figures", "toy.fig1", "--profile", "smoke", "--device", "cpu", "--jobs", "1", "--out", str(out)]) == 0
    assert (out / "toy.fig1.png").exists() and "toy-g2-vit-smoke" in (out / "index.md").read_text()


def test_unknown_option_missing_option_and_unknown_method_are_clear_errors(capsys):
    from workbench.pipelines import run_method

    with pytest.raises(ValueError, match="method 'toy' has no option ratio; its options: gain"):
        run_method("toy", profile="smoke", ratio=0.5)
    with pytest.raises(ValueError, match="method 'slimswin' needs --ratio"):
        run_method("slimswin", profile="smoke")
    with pytest.raises(KeyError, match="unknown method 'nope'"):
        run_method("nope")
    with pytest.raises(SystemExit) as e:  # argparse: a missing required flag
        main(["run", "slimswin", "--profile", "smoke"])
    assert e.value.code == 2 and "--ratio" in capsys.readouterr().err


def test_figures_redraw_only_what_changed(tmp_path, smoke_teacher, capsys):
    import os

    smoke_teacher("vit")
    out = tmp_path / "figs"
    argv = ["figures", "toy.fig1", "--profile", "smoke", "--device", "cpu", "--jobs", "1", "--out", str(out)]
    assert main(argv) == 0
    png = out / "toy.fig1.png"
    first = png.stat().st_mtime_ns
    assert main(argv) == 0
    assert png.stat().st_mtime_ns == first and "(1 unchanged" in capsys.readouterr().out  # warm: nothing redrawn
    from workbench.figures.context import Context

    store = Context("smoke").data_path("toy.logits")
    os.utime(store, ns=(store.stat().st_atime_ns, store.stat().st_mtime_ns + 10**9))  # its data was recomputed
    assert main(argv) == 0
    assert png.stat().st_mtime_ns != first
