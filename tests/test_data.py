import numpy as np
import pytest
import torch

from workbench.data import (
    DataError,
    DemoDataset,
    check_image_folder,
    demo_split_indices,
    image_folder,
    load_images,
    scan_image_folder,
)


def test_demo_split_fixed_stratified_disjoint():
    train, val = demo_split_indices("train"), demo_split_indices("val")
    assert len(train) == 4000 and len(val) == 1000
    assert not set(train) & set(val)
    assert np.array_equal(val, demo_split_indices("val"))  # same split every call
    ds = DemoDataset("val")
    assert np.bincount(ds.targets.numpy()).tolist() == [100] * 10


def test_demo_split_cache_is_scikit_learns_split_and_a_damaged_one_is_recomputed(tmp_path, monkeypatch):
    """The cached split equals scikit-learn's stratified split computed here, is read back without scikit-learn, and
    a damaged cache file is computed again."""
    import sklearn.model_selection

    from workbench import data

    _, y = data._demo_arrays()
    train, val = sklearn.model_selection.train_test_split(np.arange(len(y)), test_size=data.DEMO_VAL_SIZE, stratify=y,
                                                          random_state=data.DEMO_SEED)
    expected = (np.sort(train), np.sort(val))
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))

    def fresh():
        data._split_indices.cache_clear()
        return data._split_indices()

    try:
        computed = fresh()
        (cache,) = (tmp_path / "cache").glob("demo-split-*.npz")
        with monkeypatch.context() as m:  # read back: scikit-learn is not asked
            m.setattr(sklearn.model_selection, "train_test_split", lambda *a, **k: pytest.fail("split recomputed"))
            read = fresh()
        cache.write_bytes(b"not an npz file")
        redone = fresh()
        for got in (computed, read, redone):
            assert all(np.array_equal(a, b) for a, b in zip(got, expected))
        with np.load(cache) as f:  # the damaged file was replaced
            assert np.array_equal(f["val"], expected[1])
    finally:
        data._split_indices.cache_clear()


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
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    pixels = torch.from_numpy(b.display).permute(0, 3, 1, 2).double()  # what the model saw, in [0, 1]
    expected = (pixels - torch.tensor(IMAGENET_DEFAULT_MEAN).view(1, 3, 1, 1)) / torch.tensor(
        IMAGENET_DEFAULT_STD).view(1, 3, 1, 1)
    torch.testing.assert_close(b.tensor.double(), expected, rtol=0, atol=1e-6)  # timm's ImageNet constants
    assert 0.05 < float(pixels.std()) and float(pixels.min()) >= 0 and float(pixels.max()) <= 1
    d = load_images("demo:val[:4]")  # 1 channel: the digits / 255 with the customary MNIST statistics
    from workbench.data import _demo_arrays

    raw = torch.from_numpy(_demo_arrays()[0][demo_split_indices("val")[:4]]).double()[:, None] / 255.0
    torch.testing.assert_close(d.tensor.double(), (raw - 0.1307) / 0.3081, rtol=0, atol=1e-6)
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


def _photos(root, names=("astronaut", "chelsea", "coffee", "rocket")):
    """A flat folder of the bundled skimage photos, as a user's folder of JPEGs and PNGs."""
    import skimage.data
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        Image.fromarray(getattr(skimage.data, name)()).save(root / f"{name}.{'jpg' if i % 2 else 'png'}")
    return root


def test_image_folder_spec(tmp_path):
    root = _folder(tmp_path / "d", ["a/1.png", "a/2.png", "b/3.png"])
    b = load_images(f"{root}[:2]", input_size=(3, 32, 32))
    assert b.tensor.shape == (2, 3, 32, 32) and b.labels.tolist() == [0, 0]
    b = load_images(str(root), input_size=(3, 32, 32))
    assert b.labels.tolist() == [0, 0, 1] and b.source.dataset == str(root)
    # the same order and labels as torchvision's ImageFolder and our training dataset
    from torchvision.datasets import ImageFolder

    tv = ImageFolder(str(root))
    ds = image_folder(root, input_size=(3, 32, 32), is_training=False)
    assert [str(p) for p in scan_image_folder(root).files] == [p for p, _ in tv.samples]
    assert ds.targets == tv.targets and ds.classes == tv.classes and ds[2][0].shape == (3, 32, 32)


def test_flat_folder_of_photos(tmp_path):
    import skimage.data

    root = _photos(tmp_path / "photos")
    b = load_images(str(root), input_size=(3, 64, 64))
    assert b.tensor.shape == (4, 3, 64, 64) and b.labels.tolist() == [-1] * 4  # labels unknown
    assert b.source.indices == [0, 1, 2, 3] and b.source.dataset == str(root)
    # name order: astronaut, chelsea, coffee, rocket; the pixels are the photo's (PNG is lossless)
    ref = load_images("skimage:astronaut", input_size=(3, 64, 64))
    np.testing.assert_allclose(b.display[0], ref.display[0], atol=1e-6)
    assert scan_image_folder(root).flat and [p.stem for p in scan_image_folder(root).files] == \
        ["astronaut", "chelsea", "coffee", "rocket"]
    b = load_images(f"{root}[1:3]", input_size=(1, 28, 28))
    assert b.tensor.shape == (2, 1, 28, 28) and b.source.indices == [1, 2]
    grey = skimage.data.camera()  # a grey photo converts to RGB
    from PIL import Image

    Image.fromarray(grey).save(root / "zz_camera.png")
    assert load_images(f"{root}[-1]", input_size=(3, 32, 32)).display.shape == (1, 32, 32, 3)
    with pytest.raises(DataError, match="no class sub-folders.*labels"):
        check_image_folder(root)  # training needs classes


@pytest.mark.parametrize("case, match", [
    ("missing", "does not exist"),
    ("empty", "no images and no class sub-folders"),
    ("empty_classes", "is empty"),
    ("non_image", "non-image file"),
    ("flat_non_image", "non-image file"),
    ("mixed", "mixes files"),
])
def test_bad_folders_for_images(tmp_path, case, match):
    root = tmp_path / "data"
    if case == "empty":
        root.mkdir()
    elif case == "empty_classes":
        (root / "cat").mkdir(parents=True)
    elif case == "non_image":
        _folder(root, ["cat/1.png", "cat/notes.txt"])
    elif case == "flat_non_image":
        _folder(root, ["1.png", "notes.txt"])
    elif case == "mixed":
        _folder(root, ["cat/1.png", "2.png"])
    with pytest.raises(DataError, match=match):
        load_images(str(root), input_size=(3, 32, 32))


def test_corrupt_image_is_a_clear_error(tmp_path):
    root = tmp_path / "photos"
    root.mkdir()
    (root / "broken.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match="cannot read image"):
        load_images(str(root), input_size=(3, 32, 32))


def test_demo_digits_padded_to_the_model_input():
    """A 32 x 32 model (swin_demo) gets the 28 x 28 digits centred on black, the same in training and in specs."""
    x28 = DemoDataset("val", limit=3)
    x32 = DemoDataset("val", limit=3, input_size=(1, 32, 32))
    a, b = x28[0][0], x32[0][0]
    assert b.shape == (1, 32, 32) and torch.equal(b[:, 2:30, 2:30], a)
    background = b[0, 0, 0]
    assert torch.all(b[:, :2] == background) and torch.all(b[:, :, 30:] == background)
    spec = load_images("demo:val[:3]", input_size=(1, 32, 32))
    assert torch.equal(spec.tensor[0], b) and spec.display.shape == (3, 32, 32)
    with pytest.raises(DataError, match="cannot train on it"):
        DemoDataset("val", limit=3, input_size=(3, 224, 224))


@pytest.mark.parametrize("spec, match", [
    ("skimage:nonexistent", "unknown skimage photo"),
    ("demo:test", "unknown demo split"),
    ("demo:val[5:5]", "selects no images"),
])
def test_bad_specs(spec, match):
    with pytest.raises(DataError, match=match):
        load_images(spec)
