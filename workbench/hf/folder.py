"""A ``transformers`` ``save_pretrained`` folder, read without ``transformers``: config, weights, preprocessing.

Nothing here downloads or runs code from the folder: ``config.json`` and ``preprocessor_config.json`` are
JSON, the weights are safetensors (``model.safetensors`` or its shards) or a ``pytorch_model.bin`` read with
``torch.load(weights_only=True)`` (a pickle that needs code is refused).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.checkpoints import CheckpointError, read_state_dict
from workbench.runs import sha256_file

__all__ = ["HF_PREFIX", "HFError", "HFFolder", "is_hf_ref", "open_folder", "data_config", "transform"]

#: prefix of a model reference that names a Hugging Face folder: ``hf:DIR``
HF_PREFIX = "hf:"

#: PIL resampling codes of ``preprocessor_config.json``'s ``resample`` -> timm interpolation names
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}


class HFError(CheckpointError):
    """A Hugging Face folder is missing, incomplete, unsafe, or holds a model the workbench cannot represent."""


def is_hf_ref(ref: object) -> bool:
    """Whether a model reference names a Hugging Face folder (``hf:DIR``)."""
    return isinstance(ref, str) and ref.startswith(HF_PREFIX)


@dataclass(frozen=True)
class HFFolder:
    """What a ``save_pretrained`` folder holds."""

    path: Path  # the folder
    config: dict  # config.json
    preprocessor: dict | None  # preprocessor_config.json, None when absent
    weights: tuple[Path, ...]  # the weight files (one, or the shards of an index)

    @property
    def architecture(self) -> str:
        """The ``transformers`` class the folder was saved from (``architectures[0]``)."""
        archs = self.config.get("architectures") or []
        if not archs:
            raise HFError(f"{self.path}/config.json names no architecture ('architectures' is empty); "
                          "save the model with save_pretrained, which records its class")
        return archs[0]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor of the weight files (safetensors, or a weights-only pickle), by its saved name.

        Raises:
            HFError: a damaged or unsafe file, or a tensor in two shards.
        """
        out: dict[str, torch.Tensor] = {}
        for f in self.weights:
            try:
                part = read_state_dict(f)
            except CheckpointError as err:
                raise HFError(f"hf:{self.path}: {err}") from None
            if set(part) & set(out):
                raise HFError(f"hf:{self.path}: tensor {sorted(set(part) & set(out))[0]!r} is in two weight files")
            out.update(part)
        return out

    def sha256(self) -> str:
        """sha256 of the weight file (of the shard hashes, for a sharded model)."""
        if len(self.weights) == 1:
            return sha256_file(self.weights[0])
        import hashlib

        return hashlib.sha256("".join(sha256_file(f) for f in self.weights).encode()).hexdigest()


def _fetch_hint(name: str) -> str:
    return (f"Nothing is downloaded here. On a machine with network run `huggingface-cli download {name} --local-dir DIR` "
            f"(or `hf download {name} --local-dir DIR`), copy DIR to this machine, then pass hf:DIR")


def open_folder(ref: str | Path) -> HFFolder:
    """The folder ``hf:DIR`` (or ``DIR``) names, checked: config, weights, optional preprocessing config.

    Raises:
        HFError: no such folder (a hub name: how to fetch it elsewhere), no config.json, no weights, bad JSON.
    """
    raw = str(ref).removeprefix(HF_PREFIX)
    path = Path(raw).expanduser()
    if not path.is_dir():
        looks_hub = not raw.startswith(("/", ".", "~")) and raw.count("/") == 1
        raise HFError(f"hf:{raw}: no such folder. " + (_fetch_hint(raw) if looks_hub else _fetch_hint("ORG/NAME")))
    config = _read_json(path / "config.json", required=True)
    pre = _read_json(path / "preprocessor_config.json", required=False)
    return HFFolder(path, config, pre, _weight_files(path))


def _read_json(path: Path, *, required: bool) -> dict | None:
    if not path.is_file():
        if required:
            raise HFError(f"{path.parent} has no config.json: it is not a save_pretrained folder "
                          f"(it holds {', '.join(sorted(p.name for p in path.parent.iterdir())[:8]) or 'nothing'})")
        return None
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise HFError(f"{path} is not readable JSON ({err})") from None
    if not isinstance(out, dict):
        raise HFError(f"{path} holds {type(out).__name__}, not a JSON object")
    return out


def _weight_files(path: Path) -> tuple[Path, ...]:
    """model.safetensors, the shards of model.safetensors.index.json, or pytorch_model.bin (weights only)."""
    if (path / "model.safetensors").is_file():
        return (path / "model.safetensors",)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set((_read_json(index, required=True) or {}).get("weight_map", {}).values()))
        missing = [f for f in files if not (path / f).is_file()]
        if not files or missing:
            raise HFError(f"{index} lists {'missing shards ' + ', '.join(missing) if missing else 'no shards'}; "
                          "copy the whole folder")
        return tuple(path / f for f in files)
    if (path / "pytorch_model.bin").is_file():  # read with torch.load(weights_only=True): never unpickles code
        return (path / "pytorch_model.bin",)
    raise HFError(f"hf:{path}: no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin); "
                  f"the folder holds {', '.join(sorted(p.name for p in path.iterdir())[:8])}. Save the model with "
                  "model.save_pretrained(DIR), which writes model.safetensors")


def _size(value, what: str) -> tuple[int, int] | int:
    """``{"height", "width"}`` -> (h, w); ``{"shortest_edge"}`` or an int -> int."""
    if isinstance(value, int):
        return value
    if isinstance(value, dict) and {"height", "width"} <= set(value):
        return int(value["height"]), int(value["width"])
    if isinstance(value, dict) and set(value) == {"shortest_edge"}:
        return int(value["shortest_edge"])
    raise HFError(f"preprocessor_config.json: {what} {value!r} is not supported (use height/width or shortest_edge)")


def data_config(pre: dict | None, *, image_size: tuple[int, int], in_chans: int) -> dict:
    """A timm data config (``input_size``, ``interpolation``, ``crop_pct``, ``crop_mode``, ``mean``, ``std``) that
    reproduces a ``preprocessor_config.json`` (``timm.data.create_transform(**cfg)`` gives the same pixels).

    Without a preprocessing config: the model's ``image_size``, no crop, bicubic, ImageNet mean and std (0.5 and 0.5
    per channel for other than 3 channels).

    Raises:
        HFError: a step timm's eval transform cannot reproduce (a rescale other than 1/255, a shortest-edge resize
            without a crop, a crop that is not the same fraction of both sides), named.
    """
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    if pre is None:
        mean, std = (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD) if in_chans == 3 else ((0.5,) * in_chans, (0.5,) * in_chans)
        return {"input_size": (in_chans, *image_size), "interpolation": "bicubic", "crop_pct": 1.0, "crop_mode": "squash",
                "mean": tuple(mean), "std": tuple(std)}
    if pre.get("do_rescale", True) and not math.isclose(pre.get("rescale_factor", 1 / 255), 1 / 255, rel_tol=1e-9):
        raise HFError(f"preprocessor_config.json: rescale_factor {pre['rescale_factor']} is not 1/255, which timm's "
                      "ToTensor applies; not converted")
    if not pre.get("do_resize", True):
        raise HFError("preprocessor_config.json: do_resize false (images fed at their own size); timm's eval transform "
                      "always resizes; not converted")
    interp = _RESAMPLE.get(int(pre.get("resample", 2)))
    if interp is None:
        raise HFError(f"preprocessor_config.json: resample {pre.get('resample')} has no timm interpolation")
    size = _size(pre.get("size", {"height": image_size[0], "width": image_size[1]}), "size")
    crop = _size(pre["crop_size"], "crop_size") if pre.get("do_center_crop") else None
    if isinstance(crop, int):
        crop = (crop, crop)
    if crop is None:
        if isinstance(size, int):
            raise HFError("preprocessor_config.json: a shortest_edge resize without a center crop gives images of "
                          "varying shape; timm's eval transform needs a fixed input size")
        input_hw, crop_pct, mode = size, 1.0, "squash"
    elif isinstance(size, int):  # resize the shorter side to `size`, then crop the centre
        if crop[0] != crop[1]:
            raise HFError(f"preprocessor_config.json: a non-square crop {crop} after a shortest_edge resize; not converted")
        input_hw, crop_pct, mode = crop, _crop_pct(crop[0], size), "center"
    else:  # resize to (h, w), then crop the centre
        if crop[0] * size[1] != crop[1] * size[0]:
            raise HFError(f"preprocessor_config.json: crop {crop} is not the same fraction of both sides of size {size}")
        input_hw, crop_pct, mode = crop, _crop_pct(crop[0], size[0]), "squash"
    do_norm = pre.get("do_normalize", True)
    mean = tuple(pre.get("image_mean", IMAGENET_DEFAULT_MEAN)) if do_norm else (0.0,) * in_chans
    std = tuple(pre.get("image_std", IMAGENET_DEFAULT_STD)) if do_norm else (1.0,) * in_chans
    return {"input_size": (in_chans, *input_hw), "interpolation": interp, "crop_pct": crop_pct, "crop_mode": mode,
            "mean": mean, "std": std}


def _crop_pct(crop: int, resized: int) -> float:
    """The ``crop_pct`` for which timm's ``floor(crop / crop_pct)`` is exactly ``resized``."""
    pct = crop / resized
    while math.floor(crop / pct) < resized:  # float rounding: step pct down until the floor lands on `resized`
        pct = math.nextafter(pct, 0.0)
    return pct


class _FloorCenterCrop:
    """Center crop at ``((H - h) // 2, (W - w) // 2)``, as transformers' image processors crop (torchvision's
    ``CenterCrop`` rounds an odd margin up instead: one pixel apart)."""

    def __init__(self, size: tuple[int, int]):
        self.size = size  # (h, w)

    def __call__(self, img):
        h, w = self.size
        top, left = (img.height - h) // 2, (img.width - w) // 2
        return img.crop((left, top, left + w, top + h))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size})"


def transform(cfg: dict):
    """The eval transform of a data config from :func:`data_config` (a PIL image -> normalised ``(C, H, W)`` tensor),
    pixel for pixel the folder's image processor: timm's ``create_transform`` with the processor's crop rounding."""
    from timm.data import create_transform
    from torchvision.transforms import CenterCrop, Compose

    t = create_transform(**cfg)
    steps = [_FloorCenterCrop(tuple(cfg["input_size"][1:])) if isinstance(s, CenterCrop) else s for s in t.transforms]
    return Compose(steps)
