"""The paper profile end to end on the user's own data and checkpoints (README, "Your own model and data").

A 3-class ImageFolder of 32×32 PNGs and random-initialised timm checkpoints made here (the demo archs, so that every
step takes seconds): teachers recorded from the checkpoints, every method with budget overrides, an analysis of each
student, ``compare``, ``figures --profile paper --data``; a failed step marked failed and retried by the same command;
``--force`` refused under a teacher with students; a 2-process torchrun (gloo on the CPU) of a teacher and a method.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

REPO = Path(__file__).resolve().parents[1]
TRIAL = ["--epochs", "1", "--images", "12", "--batch-size", "8", "--device", "cpu"]


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    """(data root, checkpoints by arch, home): the user's folder and weights, in a home of its own."""
    import timm
    import torch
    from PIL import Image
    from safetensors.torch import save_file

    import methods.teachers  # noqa: F401  (the demo archs are timm names)

    tmp = tmp_path_factory.mktemp("paper")
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 3)):
        for c in range(3):
            folder = tmp / "data" / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                img = (rng.random((32, 32, 3)) * 80).astype(np.uint8)
                img[..., c] += 150  # a colour per class
                Image.fromarray(img).save(folder / f"{i}.png")
    ckpts = {}
    for arch in ("vit", "swin", "cnn"):
        torch.manual_seed(0)
        model = timm.create_model(f"{arch}_demo")  # 10 classes: the 3-class head is re-initialised on loading
        ckpts[arch] = tmp / f"{arch}_demo.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpts[arch]))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORKBENCH_HOME", str(tmp / "home"))
        yield tmp / "data", ckpts, tmp / "home"


def cli(capsys, *args: str) -> tuple[int, str, str]:
    from workbench.cli import main

    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def run_dir(out: str) -> Path:
    (line,) = [line for line in out.splitlines() if line.startswith("run: ")]
    return Path(line.removeprefix("run: "))


def epochs_in(config) -> list[int]:
    """Every ``epochs`` / ``<phase>_epochs`` value of a run's config, at any depth."""
    if isinstance(config, dict):
        return [v for k, v in config.items() if (k == "epochs" or k.endswith("_epochs") and k != "warmup_epochs")
                and isinstance(v, int)] + \
            [e for v in config.values() for e in epochs_in(v)]
    if isinstance(config, list):
        return [e for v in config for e in epochs_in(v)]
    return []


def test_paper_profile_end_to_end(paper, capsys, tmp_path):
    from workbench.runs import open_run

    data, ckpts, home = paper
    where = ["--profile", "paper", "--data", data]

    # teachers recorded from the user's checkpoints: the id names model, profile, data, weights and the override
    teachers = {}
    for arch in ("vit", "swin", "cnn"):
        rc, out, err = cli(capsys, "train", "teacher", "--arch", arch, "--model", f"{arch}_demo", "--checkpoint",
                           ckpts[arch], "--epochs", "0", "--device", "cpu", *where)
        assert rc == 0, err
        run = open_run(run_dir(out))
        teachers[arch] = run.id
        assert run.id.startswith(f"teacher-{arch}_demo-paper+data_") and run.id.endswith(".e0"), run.id
        assert run.status == "complete" and run.config["data"] == str(data.resolve())
        assert "plan: teacher, paper profile, 18 training images" in out
    # training the recorded teacher is another run beside it, not a clash with it
    rc, out, err = cli(capsys, "train", "teacher", "--arch", "vit", "--model", "vit_demo", "--checkpoint", ckpts["vit"],
                       "--epochs", "1", "--batch-size", "512", "--images", "12", "--device", "cpu", *where)
    assert rc == 0, err
    trained = open_run(run_dir(out))
    assert trained.id != teachers["vit"] and trained.manifest["results"]["train_images"] == 12
    assert open_run(teachers["vit"]).status == "complete"

    # every method with the same budget overrides (one epoch, 12 images, batch 8): the plan names every phase
    commands = {
        "far": ["run", "far", "--teacher", teachers["vit"]],
        "sparsifiner": ["run", "sparsifiner", "--teacher", teachers["vit"], "--keep-rate", "0.25"],
        "nondeep": ["run", "nondeep", "--teacher", teachers["vit"], "--branches", "2", "--steps", "warmup=1",
                    "--steps", "adjust=1", "--images", "12", "--batch-size", "8", "--device", "cpu"],
        "attentionlite": ["run", "attentionlite", "--teacher", teachers["cnn"], "--variant", "demo", "--density", "0.5"],
        "slimswin": ["run", "slimswin", "--teacher", teachers["swin"], "--ratio", "1/3", "--step-pairs", "8"],
    }
    students = {}
    for method, cmd in commands.items():
        extra = [] if method == "nondeep" else TRIAL
        rc, out, err = cli(capsys, *cmd, *extra, *where)
        assert rc == 0, f"{method}: {err}"
        assert f"plan: {method}, paper profile, 12 training images (of 18, --images 12)" in out, out
        run = open_run(run_dir(out))
        students[method] = run
        assert run.status == "complete"
        assert run.id.endswith("+" + ("warmup-s1.adjust-s1.b8.n12" if method == "nondeep" else "e1.b8.n12")), run.id
        assert run.config["data"] == str(data.resolve())
        if method != "nondeep":
            assert epochs_in(run.config) and max(epochs_in(run.config)) <= 1, (method, epochs_in(run.config))
    plan = [line for line in cli(capsys, *commands["far"], *TRIAL, *where)[1].splitlines() if line.startswith("  ")]
    assert [p.split(":")[0].strip() for p in plan[:4]] == ["distill", "finetune", "regularise", "masked_finetune"]
    assert "reusing complete run" in "".join(cli(capsys, *commands["sparsifiner"], *TRIAL, *where)[1:])

    # an analysis of each student, on the user's val/ images
    kinds = {"far": "dependency", "sparsifiner": "sparse-attention", "nondeep": "collapse-error",
             "attentionlite": "at-maps", "slimswin": "window-saliency"}
    for method, kind in kinds.items():
        model = students[method].id
        if method == "nondeep":
            model = students[method].config["source_run"]  # the branched run the collapse comes from
        rc, out, err = cli(capsys, "analyze", kind, "--model", model, "--images", f"{data}/val[::3]", "--out",
                           tmp_path / f"{method}.nc", "--device", "cpu")
        assert rc == 0, f"{kind} of {method}: {err}"
        assert (tmp_path / f"{method}.nc").exists()

    rc, out, err = cli(capsys, "compare", "--teacher", teachers["vit"], "--student", f"FAR={students['far'].id}",
                       "--student", f"Sparsifiner={students['sparsifiner'].id}", "--images", f"{data}/val",
                       "--ig-steps", "4", "--steps", "4", "--out", tmp_path / "cmp.nc", "--device", "cpu")
    assert rc == 0, err

    # the figures draw from the user's teacher runs and val/ images (the newest vit teacher on the data)
    rc, out, err = cli(capsys, "figures", "teacher.fig1", "--profile", "paper", "--data", data, "--jobs", "1",
                       "--out", tmp_path / "figs", "--device", "cpu")
    assert rc == 0, err
    assert (tmp_path / "figs" / "teacher.fig1.png").exists()
    (figdata,) = (home / "stores").glob("paper+data_*/figdata/teacher.attention.nc")
    import xarray as xr

    with xr.open_dataset(figdata) as ds:
        assert ds.attrs["run"] == trained.id  # the newest vit teacher on the data, not a profile default
        assert json.loads(ds.attrs["data"]) == {"dataset": str(data.resolve() / "val"), "indices": list(range(8))}
    rc, _, err = cli(capsys, "figures", "teacher.fig1", "--profile", "paper", "--out", tmp_path / "figs")
    assert rc == 2 and "pass --data ROOT" in err

    # --force never replaces a run others were built on
    rc, out, err = cli(capsys, "train", "teacher", "--arch", "vit", "--model", "vit_demo", "--checkpoint", ckpts["vit"],
                       "--epochs", "0", "--force", "--device", "cpu", *where)
    assert rc == 2 and "other run(s) were built on" in err and students["far"].config["source_run"] in err
    assert open_run(teachers["vit"]).status == "complete"


def test_a_failed_step_is_marked_and_the_same_command_retries_it(paper, capsys, monkeypatch):
    import methods.train
    from workbench.runs import list_runs, open_run

    data, ckpts, _ = paper
    cmd = ["train", "teacher", "--arch", "swin", "--model", "swin_demo", "--checkpoint", ckpts["swin"], "--epochs", "1",
           "--images", "6", "--batch-size", "6", "--profile", "paper", "--data", data, "--device", "cpu"]
    real = methods.train.fit

    def broken(*args, **kwargs):
        raise RuntimeError("disk full (simulated)")

    monkeypatch.setattr("workbench.pipelines.teacher.fit", broken)
    rc, out, err = cli(capsys, *cmd)
    assert rc == 2 and "disk full" in err
    (failed,) = [r for r in list_runs() if r.id.endswith(".e1.b6.n6") and "swin_demo" in r.id]
    assert failed.status == "failed" and "disk full" in failed.manifest["error"]
    monkeypatch.setattr("workbench.pipelines.teacher.fit", real)
    rc, out, err = cli(capsys, *cmd)
    assert rc == 0, err
    assert f"resuming failed run {failed.id}" in out
    assert open_run(failed.id).status == "complete"


def _torchrun(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORKBENCH_HOME": str(home), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "WORKBENCH_PROGRESS": "0"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "workbench.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_torchrun_two_processes_teacher_and_method(paper, tmp_path):
    """A 2-process torchrun (gloo on the CPU): a teacher whose default batch (1024) is more than the 9 images per rank
    trains on one batch of them, then a method on the same folder; one "run:" line per job."""
    data, ckpts, _ = paper
    home = tmp_path / "home"
    where = ["--profile", "paper", "--data", str(data), "--device", "cpu"]
    res = _torchrun("train", "teacher", "--arch", "vit", "--model", "vit_demo", "--checkpoint", str(ckpts["vit"]),
                    "--epochs", "1", *where, home=home)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [line for line in res.stdout.splitlines() if line.startswith("run: ")]
    assert len(lines) == 1, res.stdout
    teacher = Path(lines[0].removeprefix("run: "))
    manifest = json.loads((teacher / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["results"]["train_images"] == 18
    acc = manifest["results"]["val_acc"]  # each of the 9 held-out images counted once over the two ranks
    assert abs(acc * 9 - round(acc * 9)) < 1e-9, acc
    res = _torchrun("run", "sparsifiner", "--teacher", str(teacher), "--keep-rate", "0.25", "--epochs", "1",
                    "--batch-size", "8", *where, home=home)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [line for line in res.stdout.splitlines() if line.startswith("run: ")]
    assert len(lines) == 1, res.stdout
    student = json.loads((Path(lines[0].removeprefix("run: ")) / "manifest.json").read_text())
    assert student["status"] == "complete" and abs(student["results"]["val_acc"] * 9 - round(student["results"]["val_acc"] * 9)) < 1e-9


def test_attentionlite_paper_teacher_from_imagenet_resnet50_weights(paper, capsys):
    """resnet50_cifar (AttentionLite's paper teacher) from ImageNet-stem ResNet-50 weights: every layer loads but the
    7×7 stem, which a fine-tune trains; recording it untrained (--epochs 0) is refused with the fix."""
    import timm
    import torch
    from safetensors.torch import save_file

    from workbench.models import load_model

    data, _, home = paper
    torch.manual_seed(0)
    imagenet = timm.create_model("resnet50").state_dict()  # stands in for downloaded ImageNet weights
    path = home.parent / "resnet50.safetensors"
    save_file({k: v.contiguous() for k, v in imagenet.items()}, str(path))
    cmd = ["train", "teacher", "--arch", "cnn", "--model", "resnet50_cifar", "--checkpoint", path, "--profile", "paper",
           "--data", data, "--device", "cpu"]
    rc, out, err = cli(capsys, *cmd, "--epochs", "0")
    assert rc == 2 and "a new stem must be trained: pass --epochs N" in err
    rc, out, err = cli(capsys, *cmd, "--epochs", "1", "--images", "6", "--batch-size", "6")
    assert rc == 0, err
    assert "stem (conv1.weight) has another shape: re-initialised" in out
    state = load_model(str(run_dir(out))).model.state_dict()
    assert state["conv1.weight"].shape == (64, 3, 3, 3) and state["fc.weight"].shape == (3, 2048)
    # the residual stages came from the checkpoint (one fine-tune step at lr ~6e-6 moves them far less than 1e-2)
    assert torch.allclose(state["layer1.0.conv1.weight"], imagenet["layer1.0.conv1.weight"], atol=1e-2)
    fresh = timm.create_model("resnet50").state_dict()  # another random draw: far from the checkpoint at that tolerance
    assert not torch.allclose(fresh["layer1.0.conv1.weight"], imagenet["layer1.0.conv1.weight"], atol=1e-2)
