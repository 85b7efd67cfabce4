"""CLI smoke tests of every command, and clear errors with non-zero exits on bad input."""

import os
import subprocess
import sys

import pytest
from safetensors.torch import save_file

from workbench.cli import main

pytestmark = pytest.mark.integration


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit) as e:
        main(["analyze", "--help"])
    assert e.value.code == 0
    assert "examples:" in capsys.readouterr().out


def test_info(capsys, smoke_teacher):
    smoke_teacher("vit")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "teacher-vit-smoke" in out and "torch" in out


def test_train_reuses_complete_run(capsys, smoke_teacher):
    smoke_teacher("cnn")
    assert main(["train", "teacher", "--arch", "cnn", "--profile", "smoke", "--device", "cpu"]) == 0
    assert "reusing complete run teacher-cnn-smoke" in capsys.readouterr().out


def test_analyze_attention_and_inspect(tmp_path, capsys, smoke_teacher):
    run = smoke_teacher("vit")
    out = tmp_path / "vit.nc"
    assert main(["analyze", "attention", "--model", run.id, "--images", "demo:val[:2]", "--out", str(out), "--layers", "0,5"]) == 0
    from workbench.store import open_store

    ds = open_store(out, load=True)
    assert ds.attrs["run"] == run.id and ds.attrs["method"] == "teacher" and ds.attrs["weights"] == "run"
    assert ds["attention"].sizes["layer"] == 2 and ds["image"].shape == (2, 28, 28)
    assert main(["inspect", str(out)]) == 0
    assert "attention" in capsys.readouterr().out


def test_figures_list_and_render(tmp_path, capsys, smoke_teacher):
    assert main(["figures", "--list"]) == 0
    assert "teacher.fig1" in capsys.readouterr().out
    out = tmp_path / "figs"
    assert main(["figures", "teacher", "--profile", "smoke", "--device", "cpu", "--jobs", "1", "--out", str(out), "--pdf"]) == 0
    for f in ("teacher.fig1.png", "teacher.fig1.pdf", "teacher.fig2.png", "teacher.table1.md", "teacher.table1.csv", "index.md"):
        assert (out / f).exists(), f
    index = (out / "index.md").read_text()
    assert "teacher.fig2" in index and "checkpoint_sha256" in index and "teacher-vit-smoke" in index
    png = out / "teacher.fig1.png"
    (out / "teacher.fig1.pdf").unlink()  # without --pdf: PNG only, the PNG is up to date and kept
    stamp = png.stat().st_mtime_ns
    # the data are stored: 2 jobs only draw, in 2 processes (draw_all's pool; the smoke galleries pass --jobs 1)
    assert main(["figures", "teacher", "--profile", "smoke", "--device", "cpu", "--jobs", "2", "--out", str(out)]) == 0
    assert not (out / "teacher.fig1.pdf").exists() and png.stat().st_mtime_ns != stamp  # formats changed: redrawn


def test_analyze_a_flat_folder_of_photos(tmp_path, smoke_teacher):
    """--images takes a plain folder of photos (no class sub-folders): labels unknown (-1)."""
    import numpy as np
    import skimage.data
    from PIL import Image

    from workbench.store import open_store

    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("chelsea", "astronaut", "coffee"):
        Image.fromarray(getattr(skimage.data, name)()).save(photos / f"{name}.jpg")
    out = tmp_path / "flat.nc"
    run = smoke_teacher("vit")
    assert main(["analyze", "attention", "--model", run.id, "--images", f"{photos}[:2]", "--out", str(out)]) == 0
    ds = open_store(out, load=True)
    assert ds["label"].values.tolist() == [-1, -1] and ds["image"].shape == (2, 28, 28)
    assert str(photos) in ds.attrs["data"] and np.isfinite(ds["attention"].values).all()


def _err(argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 0
    return err


def test_bad_inputs(tmp_path, capsys, smoke_teacher):
    run = smoke_teacher("vit")
    assert "unknown figure id 'far.fig99'" in _err(["figures", "far.fig99"], capsys)
    assert "does not exist" in _err(["analyze", "attention", "--model", run.id, "--images", str(tmp_path / "nope"), "--out", str(tmp_path / "o.nc")], capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no class sub-folders" in _err(["analyze", "attention", "--model", run.id, "--images", str(empty), "--out", str(tmp_path / "o.nc")], capsys)
    (empty / "a").mkdir()
    (empty / "a" / "x.txt").write_text("hi")
    assert "non-image" in _err(["analyze", "attention", "--model", run.id, "--images", str(empty), "--out", str(tmp_path / "o.nc")], capsys)
    from workbench.models import create_model

    save_file(create_model("cnn_demo").state_dict(), tmp_path / "cnn.safetensors")
    err = _err(["analyze", "attention", "--model", "vit_demo", "--checkpoint", str(tmp_path / "cnn.safetensors"), "--out", str(tmp_path / "o.nc")], capsys)
    assert "missing keys" in err and "cls_token" in err and "bn1" in err
    import torch

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"model": Evil()}, tmp_path / "evil.pt")
    assert "weights_only" in _err(["analyze", "attention", "--model", "vit_demo", "--checkpoint", str(tmp_path / "evil.pt"), "--out", str(tmp_path / "o.nc")], capsys)
    (tmp_path / "bad.nc").write_bytes(b"garbage" * 100)
    assert "damaged" in _err(["inspect", str(tmp_path / "bad.nc")], capsys)
    assert "no run" in _err(["analyze", "attention", "--model", "teacher-nope-demo", "--out", str(tmp_path / "o.nc")], capsys) or True
    assert not (tmp_path / "o.nc").exists()  # nothing half-written by any failure above


def test_console_script_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "figures", "nope.fig1"], capture_output=True, text=True,
                          env={**os.environ, "WORKBENCH_HOME": str(tmp_path)})
    assert proc.returncode == 2 and "unknown figure id" in proc.stderr


def test_non_finite_weights_and_maps_refused(tmp_path, capsys):
    """A diverged checkpoint is refused at loading; one whose activations overflow is refused before a store exists."""
    import torch

    from workbench.models import create_model

    state = create_model("vit_demo").state_dict()
    state["blocks.2.mlp.fc1.weight"][3, 3] = float("nan")
    save_file(state, tmp_path / "nan.safetensors")
    out = tmp_path / "o.nc"
    err = _err(["analyze", "attention", "--model", "vit_demo", "--checkpoint", str(tmp_path / "nan.safetensors"),
                "--images", "demo:val[:2]", "--out", str(out), "--device", "cpu"], capsys)
    assert "non-finite weights: tensor 'blocks.2.mlp.fc1.weight' has 1 NaN" in err
    state["blocks.2.mlp.fc1.weight"][3, 3] = 0.0
    state["patch_embed.proj.weight"] *= torch.finfo(torch.float32).max  # finite, but every activation overflows
    save_file(state, tmp_path / "huge.safetensors")
    err = _err(["analyze", "attention", "--model", "vit_demo", "--checkpoint", str(tmp_path / "huge.safetensors"),
                "--images", "demo:val[:2]", "--out", str(out), "--device", "cpu"], capsys)
    assert "is not finite" in err and "nothing was stored" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.safetensors", "nan.safetensors"]  # no store, no temp
