import numpy as np
import pytest
import torch

from workbench.data import DataError, DemoDataset, check_image_folder, demo_split_indices, load_images


def test_demo_split_fixed_stratified_disjoint():
    train, val = demo_split_indices("train"), demo_split_indices("val")
    assert len(train) == 4000 and len(val) == 1000
    assert not set(train) & set(val)
    assert np.array_equal(val, demo_split_indices("val"))  # same split every call
    ds = DemoDataset("val")
    assert np.bincount(ds.targets.numpy()).tolist() == [100] * 10


def test_demo_dataset_normalised_and_jitter_seeded():
    ds = DemoDataset("train", train_transform=True, limit=20)
    assert np.bincount(ds.targets.numpy()).tolist() == [2] * 10  # a balanced small subset
    batch = [ds[i] for i in range(8)]
    torch.manual_seed(1)
    a, _ = ds.collate_fn(batch)
    torch.manual_seed(1)
    b, _ = ds.collate_fn(batch)
    c, _ = DemoDataset("train", limit=20).collate_fn(batch)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (8, 1, 28, 28)


def test_image_specs():
    b = load_images("demo:val[:4]")
    assert b.tensor.shape == (4, 1, 28, 28) and b.display.shape == (4, 28, 28)
    assert b.source.indices == list(map(int, demo_split_indices("val")[:4]))
    assert (b.labels >= 0).all()
    b = load_images("skimage:astronaut,chelsea", input_size=(3, 224, 224))
    assert b.tensor.shape == (2, 3, 224, 224) and b.display.shape == (2, 224, 224, 3)
    assert abs(float(b.tensor.mean())) < 2.0
    b = load_images("demo:train[10:13]")
    assert len(b.labels) == 3


def _folder(tmp_path, files):
    from PIL import Image

    for rel in files:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.suffix == ".png":
            Image.fromarray((np.random.rand(12, 12, 3) * 255).astype(np.uint8)).save(p)
        else:
            p.write_text("not an image")
    return tmp_path


def test_image_folder_spec(tmp_path):
    root = _folder(tmp_path / "d", ["a/1.png", "a/2.png", "b/3.png"])
    b = load_images(f"{root}[:2]", input_size=(3, 32, 32))
    assert b.tensor.shape == (2, 3, 32, 32)


@pytest.mark.parametrize("case, match", [
    ("missing", "does not exist"),
    ("empty", "no class sub-folders"),
    ("empty_classes", "is empty"),
    ("non_image", "non-image file"),
])
def test_bad_folders(tmp_path, case, match):
    root = tmp_path / "data"
    if case == "empty":
        root.mkdir()
    elif case == "empty_classes":
        (root / "cat").mkdir(parents=True)
    elif case == "non_image":
        _folder(root, ["cat/1.png", "cat/notes.txt"])
    with pytest.raises(DataError, match=match):
        check_image_folder(root)


@pytest.mark.parametrize("spec, match", [
    ("skimage:nonexistent", "unknown skimage photo"),
    ("demo:test", "unknown demo split"),
    ("demo:val[5:5]", "selects no images"),
])
def test_bad_specs(spec, match):
    with pytest.raises(DataError, match=match):
        load_images(spec)
