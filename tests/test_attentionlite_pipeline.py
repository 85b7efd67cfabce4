"""AttentionLite pipeline on the smoke profile: runs (irregular, column), resume, CLI, extractors on runs, figures."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader

from workbench.cli import main
from workbench.models import create_model, load_model, read_state_dict
from workbench.runs import open_run

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

QUIET = dict(device="cpu", log=lambda *_: None)


def _run(teacher, **options):
    from workbench.pipelines.attentionlite.run import run_attentionlite

    return run_attentionlite(teacher.id, "smoke", **QUIET, **options)


@pytest.fixture(scope="module")
def teacher(smoke_teacher):
    return smoke_teacher("cnn")


@pytest.fixture(scope="module")
def irregular(teacher):
    return _run(teacher, density=0.25, pruning="irregular", at=True)


@pytest.fixture(scope="module")
def column(teacher):
    return _run(teacher, density=0.5, pruning="column", at=True)


def _val_images(n: int = 32) -> torch.Tensor:
    from workbench.data import datasets

    return next(iter(DataLoader(datasets("smoke")[1], batch_size=n)))[0]


# --------------------------------------------------------------------------- runs


def test_irregular_run_holds_its_density_and_rebuilds(irregular):
    from methods.train import evaluate
    from workbench.data import datasets
    from workbench.pipelines.attentionlite.run import load_masks, training_history

    res = irregular.manifest["results"]
    assert irregular.id == "attentionlite-irregular-d0.25-kdat-cnn-smoke" and irregular.status == "complete"
    masks = load_masks(irregular)
    kept, total = sum(int(m.sum()) for m in masks.values()), sum(m.numel() for m in masks.values())
    assert kept == round(0.25 * total) and res["realised_density"] == kept / total  # exactly the target budget
    # the saved model is the masked train form, rebuilt from its timm name; nothing outside the masks is non-zero
    model = load_model(irregular.id).model
    layers = dict(model.named_modules())
    for name, mask in masks.items():
        assert not layers[name].weight[~mask].any(), name
    # every parameter the masks do not cover (norms, biases, embeddings) counts, zero-initialised BN scales included
    assert res["masked_params"] == res["kept_params"] == sum(p.numel() for p in model.parameters()) - total + kept
    assert evaluate(model, DataLoader(datasets("smoke")[1], batch_size=256), torch.device("cpu"))["val_acc"] == res["val_acc"]
    # every epoch: the realised density is the target; the last epoch's per-layer densities are the saved masks'
    h = training_history(irregular)
    assert h.sizes["epoch"] == 2 and np.all(h["density"].values == kept / total)
    np.testing.assert_allclose(h["layer_density"].isel(epoch=-1).values,
                               [int(masks[n].sum()) / masks[n].numel() for n in h["layer_name"].values], rtol=0, atol=1e-12)
    assert list(h["layer_size"].values) == [masks[n].numel() for n in h["layer_name"].values]
    assert not np.allclose(h["layer_density"].isel(epoch=-1).values, 0.25)  # sparse momentum moved the budget
    assert res["at_stages"] == [f"stages.{s}.hook_out" for s in range(4)] and np.all(h["train_at"].values > 0)


def test_column_run_saves_the_shrunk_model_equal_to_the_masked_one(column):
    from methods.attentionlite import count_params
    from workbench.pipelines.attentionlite.run import load_masks, masked_model

    res = column.manifest["results"]
    assert column.manifest["model"]["name"] == "sa_resnet_column"
    shrunk, masked = load_model(column.id).model, masked_model(column)
    masks = load_masks(column)
    for mask in masks.values():  # whole columns of C_out × C_in·k·k
        cols = mask.reshape(mask.shape[0], -1)
        assert (cols == cols[:1]).all()
    assert sum(p.numel() for p in shrunk.parameters()) == res["kept_params"] < count_params(masked)["total"]
    n_masked = sum(m.numel() for m in masks.values()) - sum(int(m.sum()) for m in masks.values())
    assert res["masked_params"] == count_params(masked)["total"] - n_masked > res["kept_params"]  # freed channels removed too
    x = _val_images()
    with torch.no_grad():
        assert (shrunk(x) - masked(x)).abs().max().item() <= 1e-5
    assert res["shrunk_vs_masked_max_abs_diff"] <= 1e-5 and abs(res["realised_density"] - 0.5) < 0.01


class Interrupted(Exception):
    pass


def test_interrupted_run_resumes_to_the_same_weights(irregular, teacher, tmp_path, monkeypatch):
    import workbench.pipelines.attentionlite.body as body

    home = tmp_path / "home"
    shutil.copytree(teacher.dir, home / "runs" / teacher.id)
    monkeypatch.setenv("WORKBENCH_HOME", str(home))
    real_fit = body.fit
    calls = []

    def interrupting_fit(*args, **kw):
        calls.append(1)
        if len(calls) == 1:
            real_fit(*args, stop_after=1, **kw)  # one epoch checkpointed, then the process "dies"
            raise Interrupted
        return real_fit(*args, **kw)

    monkeypatch.setattr(body, "fit", interrupting_fit)
    with pytest.raises(Interrupted):
        _run(teacher, density=0.25, pruning="irregular", at=True)
    assert open_run(irregular.id).status == "failed"  # an exception: marked failed; the same call resumes it
    resumed = _run(teacher, density=0.25, pruning="irregular", at=True)
    assert resumed.status == "complete" and len(calls) == 2
    assert [m["epoch"] for m in resumed.metrics()] == [0, 1]
    want, got = read_state_dict(irregular.checkpoint), read_state_dict(resumed.checkpoint)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert resumed.manifest["results"]["val_acc"] == irregular.manifest["results"]["val_acc"]


# --------------------------------------------------------------------------- CLI and bad inputs


def test_cli_run_analyze_and_bad_inputs(irregular, teacher, smoke_teacher, tmp_path, capsys, private_runs):
    from workbench.pipelines import run_method
    from workbench.store import open_store

    assert main(["run", "attentionlite", "--teacher", teacher.id, "--density", "0.25", "--pruning", "irregular", "--at",
                 "--profile", "smoke", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert f"reusing complete run {irregular.id}" in out and "realised density 0.2500" in out
    vit = smoke_teacher("vit")
    root = private_runs(teacher, irregular, vit)
    before = sorted(p.name for p in root.iterdir())
    for bad in ("1.5", "0", "-0.1", "nan"):
        with pytest.raises(SystemExit) as e:
            main(["run", "attentionlite", "--teacher", teacher.id, "--density", bad, "--profile", "smoke"])
        assert e.value.code == 2 and "(0, 1]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["run", "attentionlite", "--teacher", teacher.id, "--pruning", "channel", "--profile", "smoke"])
    assert e.value.code == 2 and "invalid choice: 'channel'" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"density must be a number in \(0, 1\]"):
        run_method("attentionlite", teacher.id, "smoke", density=1.5, **QUIET)
    with pytest.raises(ValueError, match="--pruning must be one of irregular, column"):
        run_method("attentionlite", teacher.id, "smoke", pruning="filter", **QUIET)
    # a ViT has no stage outputs for the AT loss
    assert main(["run", "attentionlite", "--teacher", vit.id, "--at", "--profile", "smoke"]) == 2
    assert "has no hook point stages.0.hook_out" in capsys.readouterr().err
    # a CNN whose stages have other resolutions (ImageNet stem: 56/28/14/7 at 224 vs the student's 224/112/56/28)
    weights = tmp_path / "r18.safetensors"
    save_file(create_model("resnet18", num_classes=10).state_dict(), str(weights))
    assert main(["run", "attentionlite", "--teacher", "resnet18", "--checkpoint", str(weights), "--profile", "smoke"]) == 2
    err = capsys.readouterr().err
    assert "stages.0.hook_out: teacher (56, 56) vs student (224, 224)" in err and "--no-at" in err
    assert sorted(p.name for p in root.iterdir()) == before  # nothing written by the failures
    # workbench analyze on a run: AT maps of the student line up with the teacher's
    paths = {}
    for ref in (teacher.id, irregular.id):
        paths[ref] = tmp_path / f"{ref}.nc"
        assert main(["analyze", "at-maps", "--model", ref, "--images", "demo:val[:3]", "--out", str(paths[ref]),
                     "--device", "cpu"]) == 0
    t, s = (open_store(paths[r], load=True) for r in (teacher.id, irregular.id))
    assert s.attrs["run"] == irregular.id and s.attrs["method"] == "attentionlite"
    assert t["at_map"].dims == s["at_map"].dims and list(t.height.values) == list(s.height.values) == [28, 14, 7, 4]


def test_resnet50_cifar_teacher_pairs_with_sa_resnet26():
    """The paper profile's teacher: a CIFAR-stem ResNet50 whose stage maps are SA-ResNet26's at 32×32."""
    from workbench.pipelines import budget
    from workbench.pipelines.attentionlite.run import _check_teacher, student_spec

    with torch.device("meta"):
        t = create_model("resnet50_cifar", num_classes=100)
    name, kwargs = student_spec(t, "sa_resnet26", "conv")
    assert (name, kwargs) == ("sa_resnet26", {"stem": "conv", "num_classes": 100})
    _check_teacher(t, name, kwargs, True, budget("attentionlite", "paper"))  # no error: 32/16/8/4 in both
    with torch.device("meta"):
        imagenet_stem = create_model("resnet50", num_classes=100)
    with pytest.raises(ValueError, match=r"teacher \(7, 7\) vs student \(224, 224\)|resnet50_cifar"):
        _check_teacher(imagenet_stem, *student_spec(imagenet_stem, "sa_resnet26", "conv"), True,
                       budget("attentionlite", "paper"))


# --------------------------------------------------------------------------- extractors on runs


def test_at_maps_and_local_attention_against_independent_computations(irregular):
    from methods.attentionlite import query_attention
    from workbench.analysis import get_extractor

    model, x = load_model(irregular.id).model, _val_images(4)
    acts = {}
    handles = [getattr(model, f"layer{s + 1}").register_forward_hook(lambda m, i, o, s=s: acts.__setitem__(s, o))
               for s in range(4)]
    ds = get_extractor("at_maps")(model, x)
    for h in handles:
        h.remove()
    for s in range(4):  # ψ = mean_c A² / ‖·‖₂ of the stage output, on the stage's cells
        f = acts[s].pow(2).mean(1).flatten(1)
        psi = (f / f.norm(dim=1, keepdim=True)).view(acts[s].shape[0], *acts[s].shape[-2:]).numpy()
        stride = int(ds.stride.sel(stage=s))
        np.testing.assert_allclose(ds.at_map.sel(stage=s).values[:, ::stride, ::stride], psi, rtol=1e-5, atol=1e-7)
    for query in ((0.5, 0.5), (0.25, 0.75)):
        la = get_extractor("local_attention")(model, x, query=query)
        ref = query_attention(model, x, query)
        for lay in la.layer.values:
            one = la.sel(layer=lay)
            stride, name = int(one.stride), str(one.layer_name.values)
            np.testing.assert_allclose(one.attention.values[:, :, ::stride, ::stride], ref[name]["map"].numpy(), atol=1e-7)
            assert (int(one.query_i), int(one.query_j)) == ref[name]["query"]
            np.testing.assert_allclose(one.attention.values[:, :, ::stride, ::stride].sum((-1, -2)), 1.0, atol=1e-5)


# --------------------------------------------------------------------------- figures


def test_figures_smoke(irregular, column, tmp_path):
    import pandas as pd

    out = tmp_path / "figs"
    assert main(["figures", "attentionlite", "--profile", "smoke", "--device", "cpu", "--jobs", "1", "--out", str(out)]) == 0
    for name in ("fig2.png", "fig3.png", "density.png", "at_maps.png", "local_attention.png", "table1.md", "table2.csv"):
        assert (out / f"attentionlite.{name}").exists(), name
    assert irregular.id in (out / "index.md").read_text()
    table = pd.read_csv(out / "attentionlite.table1.csv")
    demo = table[table["data"] == "MNIST-5k (demo)"].set_index(["loss", "pruning"])
    for run in (irregular, column):
        res = run.manifest["results"]
        row = demo.loc[("KD+AT", run.config["pruning"])]
        assert row["accuracy (%)"] == round(100 * res["val_acc"], 1)  # one seed on smoke
        assert row["FLOPs red. pruned (ours)"] == round(res["flops_reduction"], 2)
    paper = table[table["data"] == "CIFAR-10"].set_index(["loss", "pruning"])
    assert paper.loc[("KD", "irregular"), "param. red. (paper)"] == 29.75
    assert 25 < paper.loc[("KD", "irregular"), "param. red. (ours)"] < 30  # d = 0.1 of SA-ResNet26 vs ResNet50
    from workbench.figures import STUDENTS

    assert {"AttentionLite irregular d=0.25 KD+AT", "AttentionLite column d=0.5 KD+AT"} <= set(STUDENTS)
    # the no-distillation baselines: trained on the labels alone (no KL term recorded), at the figure density and dense
    from workbench.pipelines.attentionlite.run import training_history

    assert (out / "attentionlite.baselines.png").exists()
    for rid in ("attentionlite-irregular-d0.25-ce-cnn-smoke", "attentionlite-irregular-d1-ce-cnn-smoke"):
        ce = open_run(rid)
        hist = training_history(ce)
        assert ce.config["kd"] is False and "train_kl" not in hist and "train_ce" in hist
    assert "unoptimised dense student" in (out / "index.md").read_text()


def test_cnn_teacher_trains_and_teaches_in_channels_last_with_the_same_function(teacher):
    """The CNN teacher is recorded, trained and loaded as a distillation target in channels-last memory format; its
    logits equal those of the same weights in the default (contiguous) layout."""
    from workbench.pipelines.common import load_teacher
    from workbench.pipelines.teacher import resolve_teacher

    assert open_run(teacher.id).config["memory_format"] == "channels_last"
    frozen = load_teacher(resolve_teacher(teacher.id, "smoke", default_arch="cnn", family="CNN", log=lambda *_: None))
    plain = load_model(teacher.id).model.eval()
    conv = next(m for m in frozen.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size != (1, 1) and m.in_channels > 1)
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
    x = torch.randn(8, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = frozen(x), plain(x)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()


def test_a_seeded_run_trains_the_same_weights_however_it_is_launched(teacher, tmp_path, monkeypatch):
    """A seed-1 run trained twice, in two homes of its own, gives bit-identical weights and masks: launched with two
    torch threads and no progress bar (a figures worker), then with one thread and the bar shown (``workbench run``
    in a terminal). The training's thread count is the budget's (``cpu_threads``), not the launcher's; the bar does
    not iterate the loader (an earlier version's order, and so the seed-1 demo run, changed with it)."""
    from dataclasses import replace

    from workbench.pipelines.attentionlite import budgets
    from workbench.runs import home

    b = budgets.BUDGETS["smoke"]
    cache, runs = home() / "cache", []
    for i, (threads, bar) in enumerate([(2, False), (1, True)]):
        private = tmp_path / f"home{i}"
        (private / "runs").mkdir(parents=True)
        (private / "runs" / teacher.id).symlink_to(teacher.dir, target_is_directory=True)
        if cache.exists():
            (private / "cache").symlink_to(cache, target_is_directory=True)
        monkeypatch.setenv("WORKBENCH_HOME", str(private))
        monkeypatch.setenv("WORKBENCH_PROGRESS", "1" if bar else "0")
        monkeypatch.setitem(budgets.BUDGETS, "smoke", replace(b, train=replace(b.train, progress=bar)))
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            runs.append(_run(teacher, density=0.25, pruning="irregular", at=False, seed=1))
        finally:
            torch.set_num_threads(before)
    first, again = runs
    assert first.id == again.id == "attentionlite-irregular-d0.25-kd-s1-cnn-smoke" and first.dir != again.dir
    assert first.manifest["checkpoint_sha256"] == again.manifest["checkpoint_sha256"]
    from safetensors.torch import load_file

    masks, masks_again = load_file(first.dir / "masks.safetensors"), load_file(again.dir / "masks.safetensors")
    assert masks.keys() == masks_again.keys()  # the same masks, tensor by tensor (the header's order may differ)
    assert all(torch.equal(masks[k], masks_again[k]) for k in masks)
