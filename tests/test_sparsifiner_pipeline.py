"""The Sparsifiner pipeline on the smoke profile: runs (phase 1 shared by the keep rates, phase 2, Linformer), resume,
CLI run / analyze, bad inputs, the extractors against independent computations, figures."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import methods.sparsifiner as S
from methods.hooks import run_with_cache
from workbench.cli import main
from workbench.data import load_images
from workbench.models import create_model, load_model, read_state_dict
from workbench.runs import open_run

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

QUIET = dict(device="cpu", log=lambda *_: None)
PREDICTOR = ".attn.predictor."


@pytest.fixture(scope="module")
def runs(smoke_teacher):
    from workbench.pipelines.sparsifiner.run import run_sparsifiner

    teacher = smoke_teacher("vit")
    return teacher, run_sparsifiner(teacher.id, 0.25, "smoke", **QUIET)


@pytest.fixture(scope="module")
def batch():
    return load_images("demo:val[:4]", input_size=(1, 28, 28))


def test_runs_end_to_end(runs, batch):
    teacher, run = runs
    res = run.manifest["results"]
    assert run.id == "sparsifiner-k0.25-vit-smoke" and run.status == "complete"
    phase1 = open_run(run.config["phase1_run"])
    assert phase1.id == "sparsifiner_phase1-vit-smoke" and phase1.status == "complete"
    assert [m["phase"] for m in phase1.metrics()] == ["phase1"] and [m["phase"] for m in run.metrics()] == ["phase2"]
    # phase 1 trained the predictors only; phase 2 trained the backbone and, at λ_attn = 0, left the predictors alone
    t_state = read_state_dict(teacher.checkpoint)
    p1, p2 = read_state_dict(phase1.checkpoint), read_state_dict(run.checkpoint)
    assert set(p1) == set(p2) and set(t_state) == {k for k in p1 if PREDICTOR not in k}
    for key, value in t_state.items():
        assert torch.equal(p1[key], value), key
    init = S.replace_attention(create_model("vit_demo"), S.SparsifinerConfig(n_down=8))
    assert not torch.equal(p1["blocks.0.attn.predictor.w_up"], init.state_dict()["blocks.0.attn.predictor.w_up"])
    for key in p1:
        assert torch.equal(p1[key], p2[key]) == (PREDICTOR in key), key
    # load_model rebuilds the train form at keep 0.25 from the run's (timm name, kwargs)
    student = load_model(run.id).model
    assert S.sparse_attentions(student)[0][1].keep == 13 == res["budget"]
    # at most B keys on every patch-query row, none with a zero score (§3; recorded over the held-out set, recounted)
    assert 0 <= res["kept_min"] <= res["kept_max"] <= 13 and res["rows_checked"] == 6 * 4 * 49 * res["val_images"]
    _, cache = run_with_cache(student, batch.tensor, names=["blocks.*.attn.hook_mask", "blocks.*.attn.predictor.hook_score"])
    for i in range(6):
        m, score = cache[f"blocks.{i}.attn.hook_mask"], cache[f"blocks.{i}.attn.predictor.hook_score"]
        assert (m[:, :, 1:].sum(-1) <= 13).all() and m[:, :, 0].all() and (m[:, :, 1:] <= (score > 0)).all()
    # the deploy form (sparse path) computes what the train form computes
    deploy = S.to_sparse_path(load_model(run.id).model)
    with torch.no_grad():
        assert (deploy(batch.tensor) - student(batch.tensor)).abs().max() <= 1e-4
    assert res["deploy_changed_predictions"] == 0 and res["deploy_val_acc"] == res["val_acc"]
    # MACs: dense 2·n²·D per layer; the paper's convention with the measured up-projection density
    assert res["mhsa_macs_dense"] == 6 * 2 * 50 * 50 * 64
    want = sum(S.sparsifiner_mhsa_macs(50, 64, 4, 0.25, 8, up_density=r)["total"] for r in res["up_density"])
    assert res["mhsa_macs"] == want < res["mhsa_macs_dense"]
    assert res["mhsa_macs_executed"] == sum(S.executed_mhsa_macs(a) for _, a in S.sparse_attentions(deploy))
    for key in ("val_acc", "phase1_val_acc", "init_val_acc"):
        assert 0 <= res[key] <= 1


def test_keep_rates_share_phase1_and_linformer(runs):
    from workbench.pipelines.sparsifiner.run import run_sparsifiner

    teacher, k25 = runs
    lines = []
    k10 = run_sparsifiner(teacher.id, 0.1, "smoke", device="cpu", log=lines.append)
    assert any(line.startswith("reusing complete run sparsifiner_phase1-vit-smoke") for line in lines)
    assert k10.config["phase1_run"] == k25.config["phase1_run"] and k10.manifest["results"]["budget"] == 5
    lin = run_sparsifiner(teacher.id, 0.25, "smoke", linformer=True, **QUIET)
    res = lin.manifest["results"]
    assert lin.id == "sparsifiner_linformer-k0.25-vit-smoke" and res["k"] == 13
    assert [m["phase"] for m in lin.metrics()] == ["phase1", "phase2"]
    model = load_model(lin.id).model
    assert [a.k for _, a in S.linformer_attentions(model)] == [13] * 6
    assert res["mhsa_macs"] == 6 * S.linformer_mhsa_macs(50, 64, 13)["total"]
    # its first phase trained E and F only
    first, t_state = read_state_dict(lin.dir / "phase1" / "model.safetensors"), read_state_dict(teacher.checkpoint)
    assert all(torch.equal(first[k], v) for k, v in t_state.items())


def test_resume_after_interruption(runs, tmp_path, monkeypatch):
    import workbench.pipelines.sparsifiner.run as pipeline

    teacher, reference = runs
    home = tmp_path / "home"
    shutil.copytree(teacher.dir, home / "runs" / teacher.id)
    monkeypatch.setenv("WORKBENCH_HOME", str(home))
    real_fit, calls = pipeline.fit, []

    def interrupting_fit(model, train_set, val_set, cfg, **kw):
        calls.append(kw["ckpt_dir"].name)
        if calls == ["phase1", "phase2"]:
            raise KeyboardInterrupt  # phase 1 is a complete run by now; phase 2 is interrupted
        return real_fit(model, train_set, val_set, cfg, **kw)

    monkeypatch.setattr(pipeline, "fit", interrupting_fit)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_sparsifiner(teacher.id, 0.25, "smoke", **QUIET)
    assert open_run("sparsifiner_phase1-vit-smoke").status == "complete"
    assert open_run(reference.id).status == "interrupted"
    again = pipeline.run_sparsifiner(teacher.id, 0.25, "smoke", **QUIET)
    assert again.status == "complete" and calls == ["phase1", "phase2", "phase2"]  # phase 1 was not redone
    got, want = read_state_dict(again.checkpoint), read_state_dict(reference.checkpoint)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert again.manifest["results"]["val_acc"] == reference.manifest["results"]["val_acc"]


def test_cli_run_and_bad_inputs(runs, tmp_path, capsys, private_runs):
    teacher, _ = runs
    assert main(["run", "sparsifiner", "--keep-rate", "0.25", "--profile", "smoke", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "reusing complete run sparsifiner-k0.25-vit-smoke" in out
    assert "B = 13 of 50 keys per patch query, met exactly" in out or "B = 13 of 50 keys per patch query, never exceeded" in out
    root = private_runs(teacher)
    before = sorted(p.name for p in root.iterdir())
    for bad in ("1.5", "0", "-0.1", "nan", "abc"):
        with pytest.raises(SystemExit) as e:  # argparse: refused before any teacher is trained
            main(["run", "sparsifiner", "--keep-rate", bad, "--profile", "smoke"])
        assert e.value.code == 2 and "(0, 1]" in capsys.readouterr().err
    from workbench.pipelines.sparsifiner.run import run_sparsifiner

    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        run_sparsifiner(teacher.id, 1.5, "smoke", **QUIET)
    weights = tmp_path / "cnn.safetensors"
    save_file(create_model("cnn_demo").state_dict(), weights)
    assert main(["run", "sparsifiner", "--teacher", "cnn_demo", "--checkpoint", str(weights), "--keep-rate", "0.25",
                 "--profile", "smoke", "--device", "cpu"]) == 2
    assert "VisionTransformer" in capsys.readouterr().err
    assert main(["run", "sparsifiner", "--teacher", teacher.id, "--keep-rate", "0.25", "--linformer", "--renormalize",
                 "--profile", "smoke"]) == 2
    assert "--renormalize" in capsys.readouterr().err
    assert sorted(p.name for p in root.iterdir()) == before  # nothing written by the failures


def test_cli_analyze_and_extractors_against_recomputation(runs, batch, tmp_path):
    from workbench.analysis.sparsifiner import mass_agreement
    from workbench.store import open_store

    teacher, run = runs
    out = tmp_path / "sa.nc"
    assert main(["analyze", "sparse-attention", "--model", run.id, "--images", "demo:val[:4]", "--out", str(out),
                 "--device", "cpu"]) == 0
    ds = open_store(out, load=True)
    assert ds.attrs["run"] == run.id and ds.attrs["method"] == "sparsifiner"
    assert dict(ds["mask"].sizes) == {"sample": 4, "layer": 6, "head": 4, "query": 50, "key": 50}
    assert (ds["kept_max"] <= 13).all() and (ds["realised_keep_rate"] <= 0.26).all()
    # full attention recomputed from q and k of block 2 (its input taken from the model), sparse = full on the mask
    student = load_model(run.id).model
    attn = student.blocks[2].attn
    _, cache = run_with_cache(student, batch.tensor, names="blocks.2.hook_mixer_in")
    x = cache["blocks.2.hook_mixer_in"]
    q, k, _ = attn.qkv(x).reshape(4, 50, 3, 4, 16).permute(2, 0, 3, 1, 4)
    full = (q @ k.transpose(-2, -1) / 4.0).softmax(-1).detach().numpy()
    np.testing.assert_allclose(ds["full_attention"].sel(layer=2).values, full, atol=1e-6)
    mask = ds["mask"].sel(layer=2).values
    np.testing.assert_allclose(ds["attention"].sel(layer=2).values, np.where(mask, full, 0), atol=1e-6)
    # the kept keys are the top-B of the predictor's score map (Eq. 3), recomputed from the same q, k
    _, _, score = attn.predictor(q, k)
    top = score.topk(13, dim=-1).indices
    assert (np.take_along_axis(mask[:, :, 1:], top.numpy(), -1)).all()
    # own_mass: the share of the dense row on the kept keys; against a reference equal to the mask's own top-B it is
    # the oracle
    assert np.allclose(ds["own_mass"].sel(layer=2).values[..., 1:], np.where(mask, full, 0).sum(-1)[..., 1:], atol=1e-5)
    sharp = ds["mask"].astype(np.float32) / 13.0
    agree = mass_agreement(ds["mask"], sharp.where(ds["query_kind"] == "patch", 1.0 / 50))
    np.testing.assert_allclose(agree["mass"].values, 1.0, atol=1e-6)
    np.testing.assert_allclose(agree["overlap"].values, 1.0)
    # sparse-basis: W_up thresholded as used, on the patch grid; coefficients = A_down with entries <= tau zeroed
    out = tmp_path / "sb.nc"
    assert main(["analyze", "sparse-basis", "--model", run.id, "--images", "demo:val[:4]", "--layers", "0,5",
                 "--out", str(out), "--device", "cpu"]) == 0
    sb = open_store(out, load=True)
    w = student.blocks[5].attn.predictor.w_up.detach()
    used = (w * (w.abs() > 1e-2)).numpy()
    np.testing.assert_array_equal(sb["w_up"].sel(layer=5).values, used[:, 1:].reshape(8, 7, 7))
    np.testing.assert_array_equal(sb["w_up_prefix"].sel(layer=5).values[:, 0], used[:, 0])
    a = sb["a_down"].values
    tau = student.blocks[5].attn.predictor.tau
    assert sb.attrs["tau"] == tau == 0.125  # the smoke and demo budgets' τ = 1 / n_down
    np.testing.assert_array_equal(sb["coefficients"].values, np.where(a > tau, a, 0))
    np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-5)
    assert sb["basis_sparsity"].sel(layer=5) == pytest.approx(float((used == 0).mean()))


def test_sparsifiner_figures_render(runs, tmp_path):
    import pandas as pd

    out = tmp_path / "figs"
    assert main(["figures", "sparsifiner", "--profile", "smoke", "--device", "cpu", "--jobs", "1",
                 "--out", str(out)]) == 0
    for fid in ("fig3", "fig4", "fig5", "fig6", "fig7", "agreement", "baselines"):
        assert (out / f"sparsifiner.{fid}.png").exists(), fid
    t2 = pd.read_csv(out / "sparsifiner.table2.csv")
    dense = t2[(t2["model"] == "DeiT-S @224") & (t2["keep rate"] == 1.0)]
    assert float(dense["MHSA MMACs ours"].iloc[0]) == 357.7 == float(dense["paper MHSA MFLOPs"].iloc[0])
    demo = t2[t2["model"].str.startswith("demo: Sparsifiner")]
    assert demo["kept keys per patch-query row (held-out set)"].str.contains("exact").all()
    assert sorted(demo["B / k"].astype(int)) == [5, 13]
    t3 = pd.read_csv(out / "sparsifiner.table3.csv")
    assert float(t3[t3["keep rate"] == 1.0]["MHSA MMACs ours (ρ = 0)"].iloc[0]) == 1534.1
    t4 = (out / "sparsifiner.table4.md").read_text()
    assert "Linformer k=13" in t4 and "246.73" in t4
    index = (out / "index.md").read_text()
    assert "sparsifiner-k0.25-vit-smoke" in index and "sparse_attention" in index
    assert "learned mask − random keys" in index and "Sparsifiner − Linformer" in index  # verdicts from the data


def test_plots_do_not_import_torch():
    import subprocess
    import sys

    code = "import sys, workbench.plots.sparsifiner; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_mass_agreement_against_a_row_by_row_reference():
    """mass, oracle_mass and overlap against plain Python per row, ties (repeated values) broken by key index."""
    import xarray as xr

    from workbench.analysis.sparsifiner import mass_agreement

    rng = np.random.default_rng(0)
    t = 9
    ref = rng.integers(0, 4, size=(2, 3, t, t)).astype(np.float64) + 1e-3  # many ties
    ref /= ref.sum(-1, keepdims=True)
    mask = rng.random((2, 3, t, t)) < 0.4
    kinds = ["cls"] + ["patch"] * (t - 1)
    dims = ("sample", "head", "query", "key")
    coords = {"query_kind": ("query", kinds), "key_kind": ("key", kinds)}
    got = mass_agreement(xr.DataArray(mask, dims=dims, coords=coords), xr.DataArray(ref, dims=dims, coords=coords))
    for s in range(2):
        for h in range(3):
            for q in range(1, t):
                row, kept = ref[s, h, q], mask[s, h, q]
                b = int(kept.sum())
                top = sorted(range(t), key=lambda j: (-row[j], j))[:b]
                assert got["mass"].values[s, h, q - 1] == pytest.approx(row[kept].sum(), abs=1e-6)
                assert got["oracle_mass"].values[s, h, q - 1] == pytest.approx(sum(row[j] for j in top), abs=1e-6)
                assert got["overlap"].values[s, h, q - 1] == pytest.approx(sum(kept[j] for j in top) / max(b, 1))
