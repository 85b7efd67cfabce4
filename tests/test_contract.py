"""The method contract end to end: a toy method defined in one file (tests/toy_method.py) gets a run, a
`workbench run` command, an extractor reading its hook points with a `workbench analyze` flag of its own, an
explorer kind, a figure under its paper's heading, and a student of the teacher-vs-compressed comparison, with no edit
anywhere else."""

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


def test_every_toy_registration_comes_from_its_own_file():
    """What the toy adds to every registry is defined in tests/toy_method.py, and nothing else had to change: the
    CLI's flags, the figure index's headings, the comparison's students and caption are built from the registries."""
    import inspect

    from workbench.analysis import EXTRACTORS, OPTIONS, explore_kinds
    from workbench.figures import DATA, FIGURES, STUDENTS, closure, get, paper_titles
    from workbench.figures.compare.items import students_of
    from workbench.pipelines import METHODS

    defined_in = {inspect.getsourcefile(obj) for obj in (
        METHODS["toy"].run, EXTRACTORS["toy_logits"], EXTRACTORS["toy_attention"], DATA["toy.logits"].make,
        FIGURES["toy.fig1"].plot, STUDENTS["toy g2"].run)}
    assert defined_in == {toy_method.__file__}  # the files the toy touched: its own
    assert [o.flag for o in OPTIONS["toy_logits"]] == ["--offset"]
    assert explore_kinds()["toy_attention"].label == "toy attention"
    assert paper_titles()["toy"] == "Toy — identity compression"
    assert "toy g2" in [s.label for s in students_of("vit")] and "toy.logits" in closure(["compare.vit"])
    assert "toy g2" in get(["compare.fig1"])[0].caption


def test_the_toy_adds_an_explorer_kind():
    """The explorer detects the toy's kind for the toy's model (by its hook point), titles its panels with the
    kind's label and reads its map: the base ViT's attention, so the rows equal the teacher's, which the explorer
    reads through the built-in ``attention`` kind. Nothing in workbench/explore names the toy."""
    import numpy as np

    from workbench.explore import build_state
    from workbench.models import create_model

    teacher = create_model("vit_demo").eval()
    toy = toy_method.toy_scaled(gain=2.0).eval()
    toy.base.load_state_dict(teacher.state_dict())
    st = build_state(teacher, {"toy": toy}, "demo:val[:1]")
    assert (st.sources["toy"].kind, st.sources["toy"].measure) == ("toy_attention", "toy attention")
    assert st.sources["teacher"].kind == "attention"
    for query in ("cls", (3, 2)):
        a, b = st.rows("toy", image=0, query=st.query_token(query)), st.rows("teacher", image=0, query=st.query_token(query))
        np.testing.assert_allclose(a.tokens, b.tokens, rtol=1e-6)
        assert np.isfinite(a.tokens).all() and not np.allclose(a.tokens, a.tokens[..., :1])  # real rows, not constant
    assert [(p["label"], p["measure"]) for p in st.view()["panels"]] == [("teacher", "attention"), ("toy", "toy attention")]


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

    # the extractor's own option is a flag of `workbench analyze` (built from its registration)
    path = tmp_path / "logits.nc"
    assert main(["analyze", "toy_logits", "--model", run.id, "--images", "demo:val[:3]", "--offset", "1.5",
                 "--out", str(path)]) == 0
    from workbench.store import open_store

    stored = open_store(path, load=True)
    torch.testing.assert_close(torch.from_numpy(stored["logits"].values), torch.from_numpy(ds["logits"].values) + 1.5)
    assert main(["analyze", "attention", "--model", run.id, "--offset", "1", "--out", str(tmp_path / "x.nc")]) == 2
    assert "--offset applies to the toy_logits analysis only" in capsys.readouterr().err

    # `workbench compare` accepts the toy student (the comparison figures include it: it is a registered student)
    assert main(["compare", "--teacher", teacher.id, "--student", f"toy={run.id}", "--images", "demo:val[:2]",
                 "--parts", "predictions", "--out", str(tmp_path / "cmp.nc"), "--device", "cpu"]) == 0
    cmp = open_store(tmp_path / "cmp.nc", load=True)
    assert "toy" in [str(m) for m in cmp["model"].values]

    out = tmp_path / "figs"
    assert main(["figures", "toy.fig1", "--profile", "smoke", "--device", "cpu", "--jobs", "1", "--out", str(out)]) == 0
    index = (out / "index.md").read_text()
    assert (out / "toy.fig1.png").exists() and "toy-g2-vit-smoke" in index and "## Toy — identity compression" in index


def test_unknown_option_missing_option_and_unknown_method_are_clear_errors(capsys):
    from workbench.pipelines import run_method

    with pytest.raises(ValueError, match="method 'toy' has no option ratio; its options: gain"):
        run_method("toy", profile="smoke", ratio=0.5)
    with pytest.raises(ValueError, match="method 'slimswin' needs --ratio"):
        run_method("slimswin", profile="smoke")
    with pytest.raises(ValueError, match="--ratio must be in the open interval"):  # Option.check: before any teacher
        run_method("slimswin", "no-such-teacher", profile="smoke", ratio=1.5)
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
