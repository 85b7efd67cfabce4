"""Models from Hugging Face ``transformers``: a ``save_pretrained`` folder, named ``hf:DIR``, used as a timm model.

Layer: the same as :mod:`workbench.models` (2), which resolves ``hf:DIR`` through :func:`load_hf`; it imports
``workbench.models``, ``workbench.runs``, ``workbench.provenance``, torch and (lazily) timm, and ``transformers``
only where the HF model itself is run (:mod:`workbench.hf.native`).

- :mod:`workbench.hf.folder`: the folder read without ``transformers`` (JSON configs, safetensors or weights-only
  pickles; nothing downloaded, no remote code), and its image processor as a timm data config (:func:`transform`: the same pixels);
- :mod:`workbench.hf.convert`: ViT, DeiT (distilled), Swin and DINOv2 (with registers) as the equivalent timm
  models, by each family's converter; options timm cannot represent are refused, named;
- :mod:`workbench.hf.archs`: the timm names (``hf_vit``, ``hf_swin``, JSON kwargs) a converted model is built by;
- :mod:`workbench.hf.native`: the HF model analysed as it is (attention probabilities from the eager path, switched
  on for the capturing forward only).

A ``transformers`` model object works too (:func:`from_transformers`, or ``load_model(model)``).

Example::

    from workbench.models import load_model
    loaded = load_model("hf:~/models/vit-base-patch16-224")   # a timm VisionTransformer, eval mode
    loaded.model.pretrained_cfg["crop_pct"], loaded.mean, loaded.std
"""

from __future__ import annotations

from pathlib import Path

import torch

from workbench.hf.convert import Converted, convert, family, supported
from workbench.hf.folder import HF_PREFIX, HFError, HFFolder, data_config, is_hf_ref, open_folder, transform

__all__ = ["HF_PREFIX", "HFError", "HFFolder", "Converted", "is_hf_ref", "open_folder", "data_config", "transform", "convert",
           "family", "supported", "load_hf", "from_transformers"]


def load_hf(ref: str | Path, *, device: str | torch.device = "cpu") -> tuple[Converted, HFFolder]:
    """The folder ``hf:DIR`` converted to its timm model (eval mode, on ``device``), and the folder.

    Raises:
        HFError: see :func:`open_folder` and :func:`convert`.
    """
    folder = open_folder(ref)
    converted = convert(folder)
    converted.model.to(device)
    return converted, folder


def from_transformers(model, image_processor=None, *, device: str | torch.device = "cpu") -> tuple[Converted, str]:
    """A ``transformers`` model object (and optionally its image processor) as its timm model: saved with
    ``save_pretrained`` to a temporary folder (the hub format, whatever the installed transformers names its modules
    in memory) and converted as ``hf:DIR`` is. Returns the conversion and the sha256 of the saved weights.

    Raises:
        HFError: as :func:`convert`.
    """
    import tempfile
    import warnings

    with tempfile.TemporaryDirectory() as tmp:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # save_pretrained's notes about generation configs and the like
            model.save_pretrained(tmp, safe_serialization=True)
            if image_processor is not None:
                image_processor.save_pretrained(tmp)
        converted, folder = load_hf(tmp, device=device)
        return converted, folder.sha256()
