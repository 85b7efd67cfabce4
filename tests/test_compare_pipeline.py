"""Teacher vs compressed on the smoke profile: every pair the methods produce, timm names from local checkpoints,
the CLI, the figures, bad inputs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from workbench.cli import main
from workbench.compare import compare, load_models
from workbench.figures import STUDENTS
from workbench.figures.compare.items import ARCHS, deployed, students_of
from workbench.models import create_model, load_model
from workbench.runs import sha256_file
from workbench.store import open_store

pytestmark = pytest.mark.integration

FAST = dict(ig_steps=4, steps=4, infidelity=False)
IMAGES = "demo:val[50::200]"  # 5 digits: 0, 2, 4, 6, 8


@pytest.fixture(scope="module")
def pairs():
    """Every registered student with its teacher, trained (or reused) on the smoke profile: {arch: (teacher, {label: run})}."""
    from workbench.figures.context import Context

    ctx = Context("smoke", "cpu", log=lambda s: None)
    # the five methods' students; the contract test's toy student (registered when tests/toy_method.py was imported
    # in the same xdist worker) wraps the teacher under `base.` and is compared in tests/test_contract.py
    of = lambda arch: [s for s in students_of(arch) if s.method != "toy"]
    return {arch: (ctx.teacher(arch), {s.label: s.run(ctx) for s in of(arch)}) for arch in ARCHS if of(arch)}


def test_compare_every_pair_the_methods_produce(pairs):
    from workbench.data import load_images

    assert {"vit", "swin"} <= set(pairs) and {"FAR", "FAR†"} <= set(pairs["vit"][1])  # and whatever else registers
    for arch, (teacher, runs) in pairs.items():
        ds = compare(teacher.id, {label: r.id for label, r in runs.items()}, IMAGES, device="cpu", **FAST)
        labels = ["teacher", *runs]
        assert ds["model"].values.tolist() == labels, arch
        assert ds.attrs["run"] == teacher.id and ds.attrs["analysis"] == "compare"
        sources = json.loads(ds.attrs["models"])
        assert {k: v["run"] for k, v in sources.items()} == {"teacher": teacher.id, **{k: r.id for k, r in runs.items()}}
        batch = load_images(IMAGES, input_size=load_model(teacher.id).input_size)
        assert ds["sample"].values.tolist() == list(batch.source.indices)  # dataset indices
        assert ds["label"].values.tolist() == [0, 2, 4, 6, 8]
        for label, run in [("teacher", teacher), *runs.items()]:  # predictions against an independent forward pass
            with torch.no_grad():
                pred = load_model(run.id).model(batch.tensor).argmax(-1).numpy()
            np.testing.assert_array_equal(ds["pred"].sel(model=label).values, pred, err_msg=f"{arch} {label}")
            depth = int(ds["depth"].sel(model=label))
            assert np.isfinite(ds["cka"].sel(model=label, pooling="token", student_layer=range(depth))).all()
            assert np.isfinite(ds["attribution_map"].sel(model=label, attribution="integrated_gradients")).all()
            assert np.isfinite(ds["deletion_auc"].sel(model=label, attribution="saliency")).all()
        teacher_cka = ds["cka"].sel(model="teacher", estimator="biased", pooling="token").values
        np.testing.assert_allclose(np.diag(teacher_cka), 1.0, atol=1e-9)


def test_cli_on_the_far_students(pairs, tmp_path, capsys):
    teacher, runs = pairs["vit"]
    out = tmp_path / "far.nc"
    assert main(["compare", "--teacher", teacher.id, "--student", f"FAR={runs['FAR'].id}", "--student",
                 runs["FAR†"].id, "--images", IMAGES, "--out", str(out), "--ig-steps", "4", "--steps", "4",
                 "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "CKA (matched depth)" in printed and f"wrote {out}" in printed and "saliency" in printed
    ds = open_store(out)
    assert ds["model"].values.tolist() == ["teacher", "FAR", runs["FAR†"].id]
    assert set(ds["map_measure"].sel(model="FAR").values.tolist()) == {"saliency"}  # FAR has no attention
    assert "rollout" in json.loads(ds.attrs["notes"]) and ds["image"].dims == ("sample", "img_y", "img_x")
    ds.close()


def test_timm_names_from_local_checkpoints(tmp_path, capsys):
    paths = {}
    for name in ("deit_tiny_patch16_224", "deit_small_patch16_224"):
        torch.manual_seed(len(name))
        paths[name] = tmp_path / f"{name}.safetensors"
        save_file(create_model(name, img_size=32).state_dict(), str(paths[name]))
    out = tmp_path / "deit.nc"
    assert main(["compare", "--teacher", "deit_tiny_patch16_224", "--checkpoint", str(paths["deit_tiny_patch16_224"]),
                 "--student", "small=deit_small_patch16_224", "--checkpoint",
                 f"small={paths['deit_small_patch16_224']}", "--images", "skimage:astronaut,chelsea,coffee,rocket",
                 "--img-size", "32", "--out", str(out), "--ig-steps", "4", "--steps", "4", "--device", "cpu"]) == 0
    ds = open_store(out, load=True)
    models = json.loads(ds.attrs["models"])
    assert models["small"]["checkpoint_sha256"] == sha256_file(paths["deit_small_patch16_224"])
    assert ds.attrs["checkpoint_sha256"] == sha256_file(paths["deit_tiny_patch16_224"])
    assert ds.sizes["teacher_layer"] == 12 and ds["image"].dims[-1] == "rgb" and (ds["label"] == -1).all()
    assert set(ds["map_measure"].sel(model="small").values.tolist()) == {"attention"}
    assert np.isfinite(ds["map_js_avg"].sel(model="small")).all() and np.isfinite(ds["insertion_auc"]).all()
    small = load_model("deit_small_patch16_224", checkpoint=paths["deit_small_patch16_224"], img_size=32).model
    assert small.blocks[0].attn.num_heads == 6 and ds.sizes["head"] == 3  # head agreement over the teacher's heads


def test_a_student_without_comparable_parts_gives_reasons_not_a_crash(smoke_teacher):
    vit, cnn = smoke_teacher("vit"), smoke_teacher("cnn")
    ds = compare(vit.id, {"cnn": cnn.id}, IMAGES, device="cpu", **FAST)
    notes = json.loads(ds.attrs["notes"])
    assert "no token maps" in notes["maps"]["cnn"] and "cnn" in notes["rollout"]
    assert np.isnan(ds["map_js_avg"].sel(model="cnn")).all()
    assert np.isfinite(ds["cka"].sel(model="cnn", pooling="token", student_layer=range(4))).all()  # stages vs blocks
    assert ds["student_layer_name"].sel(model="cnn").values.tolist()[:4] == [f"stages.{i}" for i in range(4)]


def test_bad_inputs(smoke_teacher, tmp_path, capsys):
    vit, swin = smoke_teacher("vit"), smoke_teacher("swin")
    with pytest.raises(ValueError, match=r"different input sizes \(teacher \(1, 28, 28\), swin \(1, 32, 32\)"):
        load_models(vit.id, {"swin": swin.id})
    with pytest.raises(ValueError, match="student 'x': unknown model 'no_such_model'"):
        load_models(vit.id, {"x": "no_such_model"})
    with pytest.raises(ValueError, match="the teacher's label"):
        load_models(vit.id, {"teacher": vit.id})
    with pytest.raises(ValueError, match=r"checkpoints for \['nobody'\]"):
        load_models(vit.id, {"s": vit.id}, checkpoints={"nobody": "x.safetensors"})
    with pytest.raises(ValueError, match="is a run, which has its own checkpoint"):
        load_models(vit.id, {"s": vit.id}, checkpoints={"s": "x.safetensors"})
    out = tmp_path / "bad.nc"
    assert main(["compare", "--teacher", "no_such_model", "--student", vit.id, "--out", str(out)]) == 2
    assert "teacher: unknown model 'no_such_model'" in capsys.readouterr().err
    assert main(["compare", "--teacher", vit.id, "--student", swin.id, "--out", str(out)]) == 2
    assert "different input sizes" in capsys.readouterr().err and not out.exists()
    assert main(["compare", "--teacher", vit.id, "--student", vit.id, "--images", "demo:val[::0]", "--out", str(out)]) == 2
    assert "step 0" in capsys.readouterr().err and not out.exists()


def test_figures_smoke(pairs, tmp_path):
    import pandas as pd

    out = tmp_path / "figs"
    assert main(["figures", "compare", "--profile", "smoke", "--device", "cpu", "--jobs", "1", "--out", str(out)]) == 0
    for fid in ("fig1", "fig2", "fig3", "fig4"):
        assert (out / f"compare.{fid}.png").exists(), fid
    table = pd.read_csv(out / "compare.table1.csv")
    assert table["student"].tolist() == [s for arch in ARCHS for s in (x.label for x in students_of(arch))]
    toy = {s.label for arch in ARCHS for s in students_of(arch) if s.method == "toy"}  # see `pairs`
    for _, row in table[~table["student"].isin(toy)].iterrows():  # each student's accuracy is its run's, beside its teacher's
        arch = next(a for a in pairs if row["student"] in pairs[a][1])
        teacher, runs = pairs[arch]
        acc = runs[row["student"]].manifest["results"]["val_acc"]
        assert row["top-1 % (teacher)"] == f"{100 * acc:.1f} ({100 * teacher.manifest['results']['val_acc']:.1f})"
        assert float(row["CPU latency × teacher"]) > 0
    assert len(table.columns) <= 8  # readable at paper size: what the students kept is compare.table2
    kept = pd.read_csv(out / "compare.table2.csv")
    assert kept["student"].tolist() == table["student"].tolist() and "CKA" in kept.columns
    index = (out / "index.md").read_text()
    assert "[`compare.table1`](#compare-table1)" in index.split("## Contents")[0]  # a finding, in the findings table
    assert "## Teacher vs compressed" in index and "far_pruned-vit-smoke" in index
    assert '<img src="compare.fig3.png"' in index
    # the explanation items (issue #29): every model x method, a table of at most 8 columns, both with a verdict
    assert (out / "compare.explain.png").exists()
    faith = pd.read_csv(out / "compare.faithfulness.csv")
    assert len(faith.columns) <= 8 and {"teacher (vit)", "FAR"} <= set(faith["model"])
    assert "[`compare.faithfulness`](#compare-faithfulness)" in index.split("## Contents")[0]


def test_a_registered_deploy_form_is_what_the_table_counts(pairs, monkeypatch):
    """SlimSwin's runs save the gated model; a student's deploy form (its pruned model) is what MACs count."""
    from workbench.data import load_images
    from workbench.pipelines.common import model_counts

    spec = next(s for s in STUDENTS.values() if s.method == "slimswin" and s.label.endswith("1/3"))
    assert spec.deploy is not None  # SlimSwin registers its pruned deploy form
    monkeypatch.setitem(STUDENTS, spec.label, dataclasses.replace(spec, deploy=None))  # as if it did not
    teacher, runs = pairs["swin"]
    models = load_models(teacher.id, {k: r.id for k, r in runs.items()}, device="cpu")
    forms = deployed("swin", models)
    macs = {k: model_counts(m, models.input_size)["macs"] for k, m in forms.items()}
    other = next(k for k in runs if k != spec.label)
    res = runs[other].manifest["results"]
    assert macs["teacher"] - macs[other] == res["attention_macs_unpruned"] - res["attention_macs"] > 0
    assert macs[spec.label] == macs["teacher"]  # no deploy form registered: counted as saved (gated)
    x = load_images(IMAGES, input_size=models.input_size).tensor
    with torch.no_grad():
        torch.testing.assert_close(forms[other](x), models.loaded[other].model(x), atol=1e-4, rtol=1e-4)
