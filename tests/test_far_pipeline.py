"""The FAR pipeline on the smoke profile: runs, the shrunk model through load_model, resume, CLI, figures."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader

from methods.far import apply_masks, kept_masks, replace_attention
from methods.train import evaluate
from workbench.cli import main
from workbench.models import CheckpointError, create_model, load_model, load_weights, read_state_dict
from workbench.runs import open_run, runs_root

pytestmark = pytest.mark.integration

QUIET = dict(device="cpu", log=lambda *_: None)


@pytest.fixture(scope="module")
def far_runs(smoke_teacher):
    from workbench.pipelines import run_method

    teacher = smoke_teacher("vit")
    pruned = run_method("far", teacher.id, "smoke", **QUIET)
    return teacher, open_run(pruned.config["source_run"]), pruned


def test_runs_end_to_end(far_runs):
    from workbench.data import datasets
    from workbench.pipelines.far.run import load_masks

    teacher, far, pruned = far_runs
    assert (far.id, pruned.id) == ("far-vit-smoke", "far_pruned-vit-smoke")
    assert far.status == pruned.status == "complete"
    assert [m["phase"] for m in far.metrics()] == ["distill", "finetune"]
    assert [m["phase"] for m in pruned.metrics()] == ["regularise", "masked_finetune"]
    # the distillation phase trained the substitutes only: everything else is the teacher's
    distilled, teacher_state = read_state_dict(far.dir / "distill" / "model.safetensors"), read_state_dict(teacher.checkpoint)
    for key, value in teacher_state.items():
        if ".attn." not in key:
            assert torch.equal(distilled[key], value), key
    assert not torch.equal(distilled["blocks.0.attn.in_proj.weight"], read_state_dict(far.checkpoint)["blocks.0.attn.in_proj.weight"])
    # the pruned run's model is the physically shrunk one, rebuilt from its masks by load_model
    res = pruned.manifest["results"]
    masks = load_masks(pruned)
    assert masks.shape == (6, 4, 2, 16) and 0 < res["kept_fraction"] < 1
    small = load_model(pruned.id).model
    assert torch.equal(kept_masks(small), masks)
    full = load_model(far.id).model
    assert sum(p.numel() for p in small.parameters()) == res["params"] < sum(p.numel() for p in full.parameters())
    # ... and computes what the masked model (the masked finetuning's last checkpoint) computes
    masked = replace_attention(create_model("vit_demo"))
    masked.load_state_dict(read_state_dict(pruned.dir / "masked_finetune" / "model.safetensors"))
    apply_masks(masked.eval(), masks)
    val = datasets("smoke")[1]
    images = next(iter(DataLoader(val, batch_size=32)))[0]
    with torch.no_grad():
        assert (small(images) - masked(images)).abs().max().item() <= 1e-5
    assert evaluate(small, DataLoader(val, batch_size=256), torch.device("cpu"))["val_acc"] == res["val_acc"]


def test_wrong_teacher_refused(far_runs, tmp_path, monkeypatch):
    """FAR weights loaded into a FAR built from another teacher: a CheckpointError naming keys and shapes."""
    _, far, _ = far_runs
    state = read_state_dict(far.checkpoint)
    narrower = replace_attention(create_model("vit_demo", embed_dim=32, num_heads=2))
    with pytest.raises(CheckpointError, match=r"unexpected keys: blocks\.0\.attn\.lstms.*shape mismatches.*cls_token \(1, 1, 64\) vs \(1, 1, 32\)"):
        load_weights(narrower, state, what="far-vit-smoke")
    deeper = replace_attention(create_model("vit_demo", depth=7))
    with pytest.raises(CheckpointError, match=r"missing keys: blocks\.6\."):
        load_weights(deeper, state, what="far-vit-smoke")
    # a run whose recorded teacher does not match its weights is refused by load_model the same way
    home = tmp_path / "home"
    shutil.copytree(far.dir, home / "runs" / far.id)
    cfg_path = home / "runs" / far.id / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["model_kwargs"]["base_kwargs"] = {"embed_dim": 32, "num_heads": 2}  # the student's recorded architecture
    cfg_path.write_text(json.dumps(cfg))
    monkeypatch.setenv("WORKBENCH_HOME", str(home))
    with pytest.raises(CheckpointError, match=r"far-vit-smoke.*unexpected keys: blocks\.0\.attn\.lstms\.4.*pos_embed \(1, 50, 64\) vs \(1, 50, 32\)"):
        load_model(far.id)


def test_resume_after_interruption(far_runs, tmp_path, monkeypatch):
    """Interrupted in the finetuning phase and after pruning, both runs resume to the same weights."""
    import workbench.pipelines.far.run as pipeline
    from workbench.pipelines import run_method

    teacher, far, pruned = far_runs
    home = tmp_path / "home"
    shutil.copytree(teacher.dir, home / "runs" / teacher.id)
    monkeypatch.setenv("WORKBENCH_HOME", str(home))
    real_fit = pipeline.fit
    calls = []

    def interrupting_fit(model, train_set, val_set, cfg, **kw):
        calls.append(kw["ckpt_dir"].name)
        if kw["ckpt_dir"].name in ("finetune", "masked_finetune") and calls.count(kw["ckpt_dir"].name) == 1:
            raise KeyboardInterrupt  # after the previous phase's checkpoints, before this one's
        return real_fit(model, train_set, val_set, cfg, **kw)

    monkeypatch.setattr(pipeline, "fit", interrupting_fit)
    with pytest.raises(KeyboardInterrupt):
        run_method("far", teacher.id, "smoke", **QUIET)
    assert open_run(far.id).status == "interrupted"
    with pytest.raises(KeyboardInterrupt):
        run_method("far", teacher.id, "smoke", **QUIET)  # FAR resumes and completes; pruning stops after the masks
    assert open_run(far.id).status == "complete" and (runs_root() / pruned.id / "masks.safetensors").exists()
    again = run_method("far", teacher.id, "smoke", **QUIET)
    assert again.status == "complete"
    assert calls == ["distill", "finetune", "distill", "finetune", "regularise", "masked_finetune", "regularise",
                     "masked_finetune"]
    for run_id, ref in ((far.id, far), (pruned.id, pruned)):
        got, want = read_state_dict(runs_root() / run_id / "model.safetensors"), read_state_dict(ref.checkpoint)
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), key


def test_cli_run_and_analyze(far_runs, tmp_path, capsys):
    from workbench.store import open_store

    _, far, pruned = far_runs
    assert main(["run", "far", "--profile", "smoke", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "reusing complete run far_pruned-vit-smoke" in out and "kept_fraction" in out
    path = tmp_path / "ret.nc"
    assert main(["analyze", "retention", "--model", pruned.id, "--images", "demo:val[:2]", "--out", str(path)]) == 0
    from workbench.pipelines.far.run import load_masks

    ret = open_store(path, load=True)
    assert ret.attrs["run"] == pruned.id and ret.attrs["method"] == "far"
    assert (ret["retention"].values == load_masks(pruned).float().mean(-1).numpy()).all()
    path = tmp_path / "dep.nc"
    assert main(["analyze", "dependency", "--model", far.id, "--images", "demo:val[:2]", "--layers", "0,5",
                 "--out", str(path)]) == 0
    dep = open_store(path, load=True)
    assert dict(dep["dependency"].sizes) == {"sample": 2, "layer": 2, "head": 4, "query": 50, "key": 50}
    assert dep["cls_dependency"].shape == (2, 2, 4, 7, 7)
    assert dep.attrs["wrt"] == "mixer_input" and dep.attrs["norm"] == "l2"  # the default: token mixing
    path = tmp_path / "dep_authors.nc"
    assert main(["analyze", "dependency", "--model", far.id, "--images", "demo:val[:2]", "--layers", "1",
                 "--wrt", "lstm_input", "--norm", "l1", "--out", str(path)]) == 0
    authors = open_store(path, load=True)
    assert authors.attrs["wrt"] == "lstm_input" and authors.attrs["norm"] == "l1"
    assert dict(authors["dependency"].sizes) == {"sample": 2, "layer": 1, "head": 4, "query": 50, "key": 50}
    assert (authors["dependency"].values >= 0).all() and authors["dependency"].values.max() > 0


def test_cli_errors(far_runs, tmp_path, capsys):
    teacher, _, _ = far_runs
    assert main(["analyze", "retention", "--model", teacher.id, "--out", str(tmp_path / "r.nc")]) == 2
    assert "no FAR substitutes" in capsys.readouterr().err
    assert main(["analyze", "retention", "--model", teacher.id, "--wrt", "residual", "--out", str(tmp_path / "r.nc")]) == 2
    assert "dependency analysis only" in capsys.readouterr().err
    assert main(["analyze", "dependency", "--model", teacher.id, "--wrt", "lstm_input", "--out", str(tmp_path / "r.nc")]) == 2
    assert "lstm_input" in capsys.readouterr().err
    weights = tmp_path / "cnn.safetensors"
    save_file(create_model("cnn_demo").state_dict(), weights)
    assert main(["run", "far", "--teacher", "cnn_demo", "--checkpoint", str(weights), "--profile", "smoke", "--device", "cpu"]) == 2
    assert "VisionTransformer" in capsys.readouterr().err
    assert not (runs_root() / "far-cnn_demo-smoke").exists()  # nothing half-written
    assert main(["run", "far", "--teacher", "vit", "--profile", "paper"]) == 2
    assert "--checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "r.nc").exists()


def test_far_figures_smoke(far_runs, tmp_path):
    out = tmp_path / "figs"
    # --jobs 1: spawned workers import torch each; the pool (tests/test_schedule.py) and drawing beside a timing step
    # through the CLI (test_schedule's last test) are tested on test data
    assert main(["figures", "far", "--profile", "smoke", "--device", "cpu", "--jobs", "1", "--out", str(out)]) == 0
    for name in ("far.fig4.png", "far.fig5.png", "far.fig6.png", "far.fig9.png", "far.fig14.png", "far.agreement.png", "far.order_bias.png",
                 "far.table1.md", "far.table2.csv", "far.table3.md"):
        assert (out / name).exists(), name
    index = (out / "index.md").read_text()
    assert "far.fig4" in index and "far_pruned-vit-smoke" in index
    import pandas as pd

    from workbench.pipelines import run_method

    table3 = pd.read_csv(out / "far.table3.csv").set_index("model")
    demo = table3.loc[[i for i in table3.index if i.startswith("demo FAR, after distillation")][0]]
    cols = {"scratch": "TFS", "cls": "Distill (cls)", "sim": "Distill (sim)", "combined": "Distill (combine)"}
    for schedule, col in cols.items():  # the table shows our runs' accuracies, schedule by schedule
        run = run_method("far", far_runs[0].id, "smoke", schedule=schedule, table3=True, **QUIET)  # reused, not retrained
        assert float(demo[col]) == round(100 * run.manifest["results"]["distill_val_acc"], 1)
