"""A user's folder with one unreadable image (a truncated JPEG): one clear error naming it, also when a DataLoader
worker process read it, or (``--skip-bad-images``) the image left out with a warning naming it; a streamed store
stopped by it resumes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from workbench.data import BadImageWarning, DataError, image_folder, load_images

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::workbench.provenance.RandomInitWarning")]


def _images(folder: Path, names: list[str], bad: str | None, seed: int = 0) -> Path:
    """JPEGs of random colours at ``folder/NAME``; ``bad`` cut to half its bytes (a truncated download)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i, name in enumerate(names):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        img = (rng.random((32, 32, 3)) * 80).astype(np.uint8)
        img[..., i % 3] += 150
        Image.fromarray(img).save(path, quality=90)
    if bad:
        data = (folder / bad).read_bytes()
        (folder / bad).write_bytes(data[: len(data) // 2])
    return folder


def _one_line(message: str, bad: Path) -> None:
    assert message.startswith(f"cannot read image {str(bad)!r}: ") and "--skip-bad-images" in message
    assert "\n" not in message and "Traceback" not in message and "worker" not in message


@pytest.mark.parametrize("workers", [0, 1])
def test_unreadable_image_is_one_clear_error_in_a_worker_too(tmp_path, workers):
    root = _images(tmp_path / "train", [f"c{i % 2}/{i}.jpg" for i in range(6)], bad="c0/2.jpg")
    ds = image_folder(root, input_size=(3, 32, 32), is_training=False)
    with pytest.raises(DataError) as err:
        list(DataLoader(ds, batch_size=3, num_workers=workers))
    _one_line(str(err.value), root / "c0/2.jpg")


def test_skipped_image_is_replaced_by_the_next_readable_one_with_a_warning(tmp_path):
    root = _images(tmp_path / "train", [f"c{i % 2}/{i}.jpg" for i in range(6)], bad="c0/2.jpg")
    ds = image_folder(root, input_size=(3, 32, 32), is_training=False)
    ds.skip_bad = True
    bad = ds.folder.files.index(root / "c0/2.jpg")
    with pytest.warns(BadImageWarning, match=f"skipped an unreadable image.*{root / 'c0/2.jpg'}"):
        x, y = ds[bad]
    x_next, y_next = ds[bad + 1]
    assert torch.equal(x, x_next) and y == y_next  # the next readable image, its own label
    batches = list(DataLoader(ds, batch_size=3, num_workers=1))  # in a worker process too
    assert sum(len(b[1]) for b in batches) == len(ds)


def test_analyze_with_skip_leaves_the_image_out(tmp_path):
    root = _images(tmp_path / "photos", [f"{i}.jpg" for i in range(4)], bad="2.jpg")
    with pytest.raises(DataError, match="cannot read image .*2.jpg"):
        load_images(str(root), input_size=(3, 32, 32))
    with pytest.warns(BadImageWarning, match="2.jpg"):
        batch = load_images(str(root), input_size=(3, 32, 32), skip_bad=True)
    assert batch.source.indices == [0, 1, 3]
    good = load_images(f"{root}[3:]", input_size=(3, 32, 32))
    assert torch.equal(batch.tensor[2], good.tensor[0])


# ------------------------------------------------------------------------------------------ streamed stores
def _stream(out, images, **opts):
    from workbench.scale.stream import StreamOptions, stream_analysis

    opts = {"batch_size": 2, "chunk": 2, "workers": 1, "queries": "cls", **opts}
    return stream_analysis("attention", "vit_demo", images, out, device="cpu", img_size=32,
                           opts=StreamOptions(**opts), progress=False)


def test_stream_stops_at_a_bad_image_and_resumes_with_skip(tmp_path):
    from workbench.scale.chunked import completeness, done_chunks
    from workbench.store import open_store

    root = _images(tmp_path / "photos", [f"{i}.jpg" for i in range(6)], bad="3.jpg")
    out = tmp_path / "s.zarr"
    with pytest.raises(DataError) as err:  # read in the DataLoader worker
        _stream(out, str(root))
    _one_line(str(err.value), root / "3.jpg")
    assert done_chunks(out) == {0}  # the chunk before the bad image is kept
    with pytest.warns(BadImageWarning, match="3.jpg"):
        _stream(out, str(root), skip_bad_images=True)  # resumed: the flag does not change the store
    assert completeness(out) == (3, 3)
    ds = open_store(out).load()
    clean = open_store(_stream(tmp_path / "clean.zarr", str(root), skip_bad_images=True)).load()
    np.testing.assert_array_equal(ds.attention.values, clean.attention.values)
    assert np.isnan(ds.attention.values[3]).all() and np.isfinite(np.delete(ds.attention.values, 3, 0)).all()
    alone = open_store(_stream(tmp_path / "alone.zarr", str(root) + "[:3]")).load()  # other batches: float32 noise
    np.testing.assert_allclose(ds.attention.values[:3], alone.attention.values, rtol=1e-5, atol=1e-7)
    mean = open_store(_stream(tmp_path / "mean.zarr", str(root), reduce="mean", skip_bad_images=True)).load()
    assert int(mean["count"]) == 5  # the bad image is out of the sums and the count
    np.testing.assert_allclose(mean.attention.values, np.nanmean(ds.attention.values.astype(np.float64), 0),
                               rtol=1e-5)


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WORKBENCH_PROGRESS": "0",
           "WORKBENCH_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.integration
def test_cli_analyze_zarr_prints_only_the_message(tmp_path):
    root = _images(tmp_path / "photos", [f"{i}.jpg" for i in range(4)], bad="3.jpg")
    res = _cli("analyze", "attention", "--model", "vit_demo", "--img-size", "32", "--images", str(root), "--out",
               str(tmp_path / "s.zarr"), "--chunk", "2", "--batch-size", "2", "--workers", "1", "--queries", "cls",
               "--device", "cpu", home=tmp_path / "home")
    assert res.returncode == 2
    lines = [line for line in res.stderr.splitlines() if "random-init" not in line]
    assert len(lines) == 1, res.stderr
    _one_line(lines[0].removeprefix("workbench: error: "), root / "3.jpg")


@pytest.mark.integration
def test_cli_train_teacher_prints_only_the_message_or_skips(tmp_path):
    """`workbench train teacher --profile paper --data` reads train/ in DataLoader worker processes."""
    data = tmp_path / "data"
    _images(data / "train", [f"c{i % 2}/{i}.jpg" for i in range(8)], bad=None)
    bad = [f"c{i % 2}/{i}.jpg" for i in range(2, 8)]  # the paper recipe's repeated augmentation sees ~3 of 8 images
    for name in bad:  # an epoch: so most are bad, and it meets one
        cut = (data / "train" / name).read_bytes()
        (data / "train" / name).write_bytes(cut[: len(cut) // 2])
    _images(data / "val", [f"c{i % 2}/{i}.jpg" for i in range(4)], bad=None)
    args = ["train", "teacher", "--arch", "vit", "--model", "vit_demo", "--profile", "paper", "--data", str(data),
            "--epochs", "1", "--batch-size", "4", "--device", "cpu"]
    res = _cli(*args, home=tmp_path / "home")
    assert res.returncode == 2
    assert len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stderr.startswith("workbench: error: cannot read image ") and "Traceback" not in res.stderr
    res = _cli(*args, "--skip-bad-images", home=tmp_path / "home")
    assert res.returncode == 0, res.stderr
    warned = [line for line in res.stderr.splitlines() if line.startswith("workbench: warning: skipped an unreadable")]
    assert warned and all(any(f"train/{n}'" in line for n in bad) for line in warned)
