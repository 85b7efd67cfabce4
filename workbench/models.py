"""Model loading: timm names, local checkpoints, and runs.

A model reference is one of

- a run id or run directory (``teacher-vit-demo``, ``far-vit-demo``): its record names the model
  as a timm name with JSON keyword arguments (every method registers its forms with timm), which
  rebuilds the architecture, and its ``model.safetensors`` is loaded strictly;
- a timm name (``deit_tiny_patch16_224``, ``swin_tiny_patch4_window7_224``, ``vit_demo``...)
  with an optional local checkpoint (``.safetensors``, or ``.pt``/``.pth`` read with
  ``weights_only=True``: a checkpoint that needs unpickling of arbitrary objects is refused); without a
  checkpoint the model keeps its random initial weights, with a :class:`~workbench.provenance.RandomInitWarning`
  and ``weights: random-init`` in its provenance. Those weights are drawn from a fixed seed (``seed``, default
  :data:`DEFAULT_INIT_SEED`; recorded as ``init_seed``), so two calls, two torchrun ranks, or a resumed streamed
  store all see the same network;
- ``hf:DIR``: a Hugging Face ``transformers`` ``save_pretrained`` folder, converted to the equivalent timm model
  with its image processor's size, mean and std (:mod:`workbench.hf`).

Every loaded model's provenance carries ``weights_sha256`` (:func:`state_dict_sha256`): a hash of the weights
themselves, which a resumed store checks whatever their origin.

Nothing is downloaded: asking for pretrained weights says how to pass a local file instead.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from workbench.checkpoints import CheckpointError, check_finite_weights, load_weights, read_state_dict  # noqa: F401  (re-exported)
from workbench.provenance import RANDOM_INIT, ModelSource, RandomInitWarning
from workbench.runs import Run, RunError, find_run, sha256_file

#: seed of the random initial weights of a timm name loaded without a checkpoint (``--seed`` of ``workbench analyze``)
DEFAULT_INIT_SEED = 0


@dataclass
class LoadedModel:
    """A model in eval mode with where it came from."""

    model: nn.Module
    source: ModelSource
    input_size: tuple[int, int, int]  # (C, H, W) the model expects
    mean: tuple[float, ...]
    std: tuple[float, ...]


def create_model(name: str, *, pretrained: bool = False, **kwargs) -> nn.Module:
    """``timm.create_model`` with the demo teachers registered and no downloads.

    Raises:
        ValueError: unknown architecture, or pretrained weights requested (the network is off).
    """
    import timm

    from methods import register_models

    register_models()  # the demo teachers and every method's model forms are timm names
    import workbench.hf.archs  # noqa: F401  (hf_vit, hf_swin: the architectures of converted Hugging Face folders)

    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('_')[0]}*")[:8]
        raise ValueError(f"unknown model {name!r}; not a timm architecture or run id{' (similar: ' + ', '.join(close) + ')' if close else ''}")
    if pretrained:
        raise ValueError(
            f"pretrained weights for {name!r} would be downloaded, and this machine has no network. "
            f"Download them elsewhere (e.g. timm.create_model({name!r}, pretrained=True) and "
            f"safetensors.torch.save_file(model.state_dict(), 'weights.safetensors')), then pass --checkpoint weights.safetensors"
        )
    return timm.create_model(name, pretrained=False, **kwargs)


def state_dict_sha256(model: nn.Module) -> str:
    """sha256 over a model's state dict: every tensor's name, dtype, shape and bytes, in name order.

    Equal for equal weights whatever their origin (a run, a checkpoint, a seeded random init) and device.
    """
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).cpu().numpy().tobytes())  # raw bytes of any dtype (bfloat16 included)
    return h.hexdigest()


def seeded_model(name: str, seed: int, **kwargs) -> nn.Module:
    """``create_model(name)`` with its random initial weights drawn from ``seed`` (torch's global generator is left as
    it was): the same weights on every call, process and rank."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return create_model(name, **kwargs)


def load_model(ref: str, *, checkpoint: str | Path | None = None, device: str | torch.device = "cpu",
               seed: int = DEFAULT_INIT_SEED, **kwargs) -> LoadedModel:
    """Load a model by run id/dir or timm name (+ optional checkpoint), in eval mode.

    Args:
        ref: run id, run directory, timm architecture name, ``hf:DIR`` (a Hugging Face folder), or a ``transformers``
            model object (:func:`workbench.hf.from_transformers`).
        checkpoint: local weights for a timm name (not allowed with a run).
        device: where to put the model.
        seed: seed of the random initial weights of a timm name without a checkpoint (ignored otherwise).
        **kwargs: passed to ``timm.create_model`` (e.g. ``img_size=384``).

    Warns:
        RandomInitWarning: a timm name without a checkpoint (its ``source.weights`` is ``"random-init"``).

    Example:
        The demo ViT by its timm name, without weights: seeded random ones (a ``RandomInitWarning`` says so; a run id
        loads the run's trained weights instead).

        >>> from workbench.models import load_model
        >>> loaded = load_model("vit_demo")
        >>> loaded.input_size, loaded.source.weights, loaded.model.training
        ((1, 28, 28), 'random-init', False)
    """
    if (isinstance(ref, str) and ref.startswith("hf:")) or _is_transformers_model(ref):  # Hugging Face (workbench.hf)
        return _load_hf(ref, checkpoint=checkpoint, device=device, kwargs=kwargs)
    run = _maybe_run(ref)
    if run is not None:
        if checkpoint is not None:
            raise ValueError(f"{ref!r} is a run, which has its own checkpoint; drop --checkpoint or pass a timm name")
        if run.status != "complete":
            raise RunError(f"run {run.id!r} is not complete (status {run.status!r}); finish it first (rerun its command to resume)")
        method = run.config.get("method", "teacher")
        name, model_kwargs = run_model_spec(run)
        model = create_model(name, **model_kwargs)
        load_weights(model, read_state_dict(run.checkpoint), what=f"run {run.id!r} checkpoint")
        source = ModelSource(name, method, run.manifest.get("checkpoint_sha256") or sha256_file(run.checkpoint), run.id,
                             weights_sha256=state_dict_sha256(model))
    elif checkpoint is not None:
        model = create_model(ref, **kwargs)
        load_weights(model, read_state_dict(checkpoint), what=f"checkpoint {str(checkpoint)!r}")
        source = ModelSource(ref, "teacher", sha256_file(Path(checkpoint).expanduser()), None,
                             weights_sha256=state_dict_sha256(model))
    else:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"--seed must be an integer, got {seed!r}")
        model = seeded_model(ref, seed, **kwargs)
        warnings.warn(f"{ref!r} has random-init weights (a timm name without a checkpoint; seed {seed}): what is "
                      f"computed from it describes an untrained network, and its provenance says weights: {RANDOM_INIT}. "
                      "Pass a run id, or the weights with --checkpoint (.safetensors, .pt, .pth)", RandomInitWarning,
                      stacklevel=2)
        source = ModelSource(ref, "teacher", None, None, init_seed=seed, weights_sha256=state_dict_sha256(model))
    model.eval().to(device)
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    input_size = tuple(cfg.get("input_size", (3, 224, 224)))
    if "img_size" in kwargs:
        s = kwargs["img_size"]
        input_size = (input_size[0], *((s, s) if isinstance(s, int) else s))
    return LoadedModel(model, source, input_size, tuple(cfg.get("mean", (0.485, 0.456, 0.406))), tuple(cfg.get("std", (0.229, 0.224, 0.225))))


def run_model_spec(run: Run) -> tuple[str, dict]:
    """The timm name and keyword arguments of the model a run saved.

    A run whose architecture is only known at its end (a pruned model) records it in its manifest as
    ``model: {name, kwargs}``; otherwise its config's ``model_name`` and ``model_kwargs`` define it.
    """
    spec = run.manifest.get("model")
    if spec:
        return spec["name"], dict(spec.get("kwargs") or {})
    return run.config["model_name"], dict(run.config.get("model_kwargs") or {})


def _load_hf(ref, *, checkpoint, device, kwargs: dict) -> LoadedModel:
    """``hf:DIR`` or a ``transformers`` model object as its converted timm model (:mod:`workbench.hf`)."""
    from workbench.hf import from_transformers, load_hf

    what = str(ref) if isinstance(ref, str) else type(ref).__name__
    if checkpoint is not None or kwargs:
        raise ValueError(f"{what!r} is a Hugging Face folder or model with its own weights and config; drop "
                         f"{'--checkpoint' if checkpoint is not None else ', '.join(kwargs)}")
    if isinstance(ref, str):
        converted, folder = load_hf(ref, device=device)
        name, sha = f"hf:{folder.path.resolve()}", folder.sha256()  # absolute: a relative folder names nothing later
    else:
        converted, sha = from_transformers(ref, device=device)
        name = f"transformers:{type(ref).__name__}"
    cfg = converted.data_config
    source = ModelSource(name, "teacher", sha, None, weights_sha256=state_dict_sha256(converted.model))
    return LoadedModel(converted.model, source, tuple(cfg["input_size"]), tuple(cfg["mean"]), tuple(cfg["std"]))


def _is_transformers_model(obj: object) -> bool:
    """A ``transformers`` ``PreTrainedModel`` (checked by class names: transformers is not imported)."""
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers") for c in type(obj).__mro__)


def _maybe_run(ref: str) -> Run | None:
    return find_run(ref)
