"""The Non-deep ViT pipeline on the smoke profile: branched + collapsed runs, reuse, resume, CLI, bad inputs, figures."""

from __future__ import annotations

import shutil

import pytest
import torch

import methods.nondeep as nd
from workbench.cli import main
from workbench.models import load_model, read_state_dict
from workbench.runs import open_run, runs_root

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

QUIET = dict(device="cpu", log=lambda *_: None)


def run(teacher, **options):
    from workbench.pipelines import run_method

    return run_method("nondeep", teacher.id, "smoke", **QUIET, **options)


@pytest.fixture(scope="module")
def teacher(smoke_teacher):
    return smoke_teacher("vit")


@pytest.fixture(scope="module")
def student(teacher):
    return run(teacher, branches=2)


def test_branched_and_collapsed_runs(student, teacher):
    assert student.id == "nondeep-n2-vit-smoke" and student.status == "complete"
    src = open_run(student.config["source_run"])
    assert src.id == "nondeep_branched-n2-vit-smoke" and src.status == "complete"
    res = student.manifest["results"]
    # the branched run trained while λ went 0 -> 1 (linear over 4 steps of 8) and saved its weights at λ = 1
    assert [m["phase"] for m in src.metrics()] == ["join"] and src.metrics()[-1]["lambda"] == 1.0
    assert read_state_dict(src.dir / "joined.safetensors")["blocks.0.lam"].item() == 1.0
    # both forms rebuild from their timm names; the deploy form is a plain 3-block timm ViT equal to the branched one
    branched, collapsed = load_model(src.id).model, load_model(student.id).model
    assert type(branched.blocks[0]).__name__ == "ParallelBlock" and nd.get_lambda(branched) == 1.0
    assert type(collapsed).__name__ == "VisionTransformer" and len(collapsed.blocks) == 3
    assert not nd.parallel_blocks(collapsed)
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():  # the saved weights are the exact collapse of the saved branched model (float32) ...
        redo = nd.collapse(branched)
        assert all(torch.equal(v, redo.state_dict()[k]) for k, v in collapsed.state_dict().items())
        assert (collapsed(x) - branched(x)).abs().max() <= 1e-5 * branched(x).abs().max()
        b64 = branched.double()  # ... and in float64 the collapse is exact to rounding
        assert (nd.collapse(b64)(x.double()) - b64(x.double())).abs().max() <= 1e-10 * b64(x.double()).abs().max()
    assert res["collapse_error_float64"]["exact"] <= 1e-10 < res["collapse_error_float64"]["paper"]
    assert res["val_acc"] == res["branched_val_acc"] and res["blocks"] == 3 and res["form"] == "concat"
    assert res["params"] < res["branched_params"] and res["macs"] < res["branched_macs"]
    assert student.config["teacher"]["run"] == teacher.id
    from safetensors import safe_open

    with safe_open(str(src.dir / "joined.safetensors"), "pt") as f:
        assert f.metadata()["step"] == "4"  # the first step at λ = 1 (linear over the smoke budget's 4 warm-up steps)


def test_no_joining_deploys_the_exact_wide_model(teacher):
    wide = run(teacher, branches=3, schedule="none", epochs=1)
    res = wide.manifest["results"]
    assert wide.id == "nondeep-n3-none-vit-smoke"
    assert res["form"] == "wide" and res["lambda"] == 0.0 and res["paper_formulas_val_acc"] is None
    model = load_model(wide.id).model
    assert len(model.blocks) == 2 and model.blocks[0].attn.num_heads == 3 * 4  # n·H heads of width d
    assert res["collapse_error_float64"]["exact"] <= 1e-10


def test_depth_baseline(teacher):
    base = run(teacher, branches=2, baseline=True)
    assert base.id == "nondeep_depth-d3-vit-smoke"
    model = load_model(base.id).model
    assert len(model.blocks) == 3 and base.manifest["results"]["blocks"] == 3


def test_resume_after_interruption_matches_an_uninterrupted_run(teacher, tmp_path, monkeypatch):
    import workbench.pipelines.nondeep.run as pipeline

    full = run(teacher, branches=2, epochs=2)  # 16 steps, λ reaches 1 after 4
    home = tmp_path / "home"
    shutil.copytree(teacher.dir, home / "runs" / teacher.id)
    monkeypatch.setenv("WORKBENCH_HOME", str(home))
    real_fit, calls = pipeline.fit, []

    def interrupted(*args, **kw):
        calls.append(kw["ckpt_dir"].name)
        if len(calls) == 1:
            real_fit(*args, **{**kw, "stop_after": 1})  # one epoch checkpointed, then the process "dies"
            raise KeyboardInterrupt
        return real_fit(*args, **kw)

    monkeypatch.setattr(pipeline, "fit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(teacher, branches=2, epochs=2)
    src = runs_root() / full.config["source_run"]
    assert open_run(src).status == "interrupted" and not (runs_root() / full.id).exists()
    again = run(teacher, branches=2, epochs=2)
    assert again.status == "complete" and calls == ["join", "join"]
    assert [m["epoch"] for m in open_run(src).metrics()] == [0, 1]
    for rid in (full.id, full.config["source_run"]):
        got = read_state_dict(runs_root() / rid / "model.safetensors")
        want = read_state_dict(full.dir.parent / rid / "model.safetensors")
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), rid


def test_cli_run_report_and_analyses(student, tmp_path, capsys):
    from workbench.store import open_store

    assert main(["run", "nondeep", "--branches", "2", "--profile", "smoke", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "reusing complete run nondeep-n2-vit-smoke" in out and "collapsed 3-block ViT from 3×2 branches" in out
    src = student.config["source_run"]
    for kind, model in (("branch-weight-similarity", src), ("branch-feature-similarity", src), ("join-lambda", src),
                        ("collapse-error", src), ("attention", student.id)):
        path = tmp_path / f"{kind}.nc"
        assert main(["analyze", kind, "--model", model, "--images", "demo:val[:3]", "--out", str(path)]) == 0, kind
        ds = open_store(path, load=True)
        assert ds.attrs["run"] == model and ds.attrs["analysis"] == kind.replace("-", "_")
    err = open_store(tmp_path / "collapse-error.nc", load=True)
    assert float(err["logit_error"].sel(model="exact").max()) <= 1e-10
    att = open_store(tmp_path / "attention.nc", load=True)
    assert att.sizes["layer"] == 3 and "branch" not in att.dims  # the collapsed model: a plain timm ViT
    assert main(["analyze", "collapse-error", "--model", student.id, "--out", str(tmp_path / "x.nc")]) == 2
    assert "no parallel blocks" in capsys.readouterr().err


def test_bad_inputs_are_clear_errors_and_write_nothing(teacher, tmp_path, capsys, private_runs):
    from workbench.pipelines import run_method

    root = private_runs(teacher)
    before = sorted(p.name for p in root.iterdir())
    with pytest.raises(ValueError, match=r"4 branches do not divide the teacher's depth 6.*choose n from \[1, 2, 3, 6\]"):
        run(teacher, branches=4)
    with pytest.raises(ValueError, match="--schedule must be one of linear, cosine"):
        run(teacher, schedule="quadratic")
    with pytest.raises(ValueError, match="collapse before joining is complete.*only 0.08.*Train at least 13 epochs"):
        run(teacher, branches=2, warmup_steps=100, epochs=1)
    with pytest.raises(ValueError, match="--diversity must be ≥ 0"):
        run(teacher, diversity=-0.1)
    from safetensors.torch import save_file

    from workbench.models import create_model

    weights = tmp_path / "cnn.safetensors"
    save_file(create_model("cnn_demo").state_dict(), weights)
    with pytest.raises(ValueError, match="branches a timm VisionTransformer"):
        run_method("nondeep", "cnn_demo", "smoke", teacher_checkpoint=str(weights), **QUIET)
    assert sorted(p.name for p in root.iterdir()) == before
    for argv, msg in ((["--branches", "0"], "expected a positive integer"), (["--schedule", "quadratic"], "invalid choice")):
        with pytest.raises(SystemExit) as e:
            main(["run", "nondeep", "--profile", "smoke", *argv])
        assert e.value.code == 2 and msg in capsys.readouterr().err
    assert main(["run", "nondeep", "--teacher", teacher.id, "--branches", "5", "--profile", "smoke", "--device", "cpu"]) == 2
    assert "do not divide" in capsys.readouterr().err


def test_nondeep_figures_smoke(student, tmp_path):
    import pandas as pd

    out = tmp_path / "figs"
    assert main(["figures", "nondeep", "--profile", "smoke", "--device", "cpu", "--jobs", "1", "--out", str(out)]) == 0
    for name in ("nondeep.fig3.png", "nondeep.fig4.png", "nondeep.fig5.png", "nondeep.fig6.png", "nondeep.attention.png",
                 "nondeep.table1.md", "nondeep.table5.csv", "nondeep.table10.md", "nondeep.table11.md",
                 "nondeep.exactness.md"):
        assert (out / name).exists(), name
    assert "nondeep-n2-vit-smoke" in (out / "index.md").read_text()
    table5 = pd.read_csv(out / "nondeep.table5.csv")
    lin = table5[(table5["λ schedule"] == "linear") & (table5["div. reg."] == "✓")]["demo top-1 (%)"].item()
    from workbench.pipelines.nondeep.budgets import ABLATION_ALPHA

    ablation = run(open_run("teacher-vit-smoke"), branches=3, schedule="linear", diversity=ABLATION_ALPHA, table5=True)
    assert lin == round(100 * ablation.manifest["results"]["val_acc"], 1)  # the table shows the run, reused
    exact = pd.read_csv(out / "nondeep.exactness.csv").set_index("formula")
    assert float(exact.loc["exact (ours)", "3×2 f64"]) <= 1e-10 and float(exact.loc["Eq. 5–7", "3×2 f64"]) > 1e-3
    from workbench.figures import STUDENTS

    assert STUDENTS["Non-deep 3×2 collapsed"].method == "nondeep"
