"""What it takes for the same code to run on a CUDA GPU as on the CPU: three small tools, used wherever it matters.

- :func:`differentiable` — the one way the workbench differentiates through a model outside training (Integrated
  Gradients, Saliency, token dependency, window saliency). cuDNN's RNN kernels refuse a backward unless the module is
  in training mode ("cudnn RNN backward can only be called in training mode"), so a FAR student (``nn.LSTM`` mixers)
  in eval mode cannot be differentiated with cuDNN on. Inside the context cuDNN is switched off whenever the model
  holds a recurrent module (or when the callable is not a module and so cannot be inspected): PyTorch then runs its
  native LSTM kernels, which differentiate in eval mode. Eval mode itself is kept — putting the LSTMs into training
  mode would also satisfy cuDNN (a one-layer ``nn.LSTM`` has no dropout, so its outputs would be the same), but
  ``torch.func.vmap`` has no batching rule for cuDNN's RNN backward, and the dependency extractor vmaps it. A model
  without recurrent modules (ViT, Swin, the CNNs) keeps cuDNN. Nothing changes on the CPU.
- :func:`exact_float32` — float32 arithmetic without TF32 for checks that compare two computations at a tolerance
  (a masked model against its physically shrunk copy, a collapsed model against its branched source). On Ampere and
  later GPUs cuDNN convolutions run in TF32 by default (``torch.backends.cudnn.allow_tf32`` is True), about 1e-3
  relative error, so a 1e-4 check that holds on any CPU fails there after all the training that precedes it.
- :func:`to_numpy` — a tensor's values as a NumPy array wherever the tensor lives (``.numpy()`` raises on a GPU).
- :func:`wall_clock` — elapsed wall time of work that may run on a GPU (queued kernels finished before each reading);
  ``time.process_time`` counts only this process's CPU time, which on a GPU is mostly waiting, not the cost.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn as nn

__all__ = ["has_rnn", "differentiable", "exact_float32", "to_numpy", "wall_clock"]


def has_rnn(*modules: object) -> bool:
    """Whether any of ``modules`` holds a recurrent ``nn.RNNBase`` (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``).

    A callable that is not an ``nn.Module`` (a head function, a lambda) cannot be inspected and counts as holding one.
    """
    if not modules:
        return True
    return any(not isinstance(m, nn.Module) or any(isinstance(s, nn.RNNBase) for s in m.modules()) for m in modules)


@contextlib.contextmanager
def _backend_flags(flags: dict[tuple[object, str], bool]) -> Iterator[None]:
    """Set backend flags ``{(torch.backends.x, name): value}`` within the block, restoring every one afterwards.

    (Attributes rather than ``torch.backends.cudnn.flags``, whose keyword arguments differ between torch releases and
    which resets the flags it is not given, ``benchmark`` and ``deterministic`` among them.)
    """
    before = {key: getattr(*key) for key in flags}
    try:
        for (obj, name), value in flags.items():
            setattr(obj, name, value)
        yield
    finally:
        for (obj, name), value in before.items():
            setattr(obj, name, value)


@contextlib.contextmanager
def differentiable(*modules: object) -> Iterator[None]:
    """Within the block, backward passes through ``modules`` in eval mode work on a GPU too (module docstring).

    cuDNN is disabled while the block runs if any of ``modules`` holds an RNN (or is an opaque callable, or none is
    given); otherwise nothing changes. It does not switch gradients on (the caller does, where it needs them). Also a
    decorator: ``@differentiable()`` on a function that differentiates an opaque callable.
    """
    off = {(torch.backends.cudnn, "enabled"): False} if has_rnn(*modules) else {}
    with _backend_flags(off):
        yield


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """Within the block, float32 convolutions and matmuls on a GPU run in full float32 (no TF32), as on the CPU."""
    with _backend_flags({(torch.backends.cudnn, "allow_tf32"): False, (torch.backends.cuda.matmul, "allow_tf32"): False}):
        yield


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """``t``'s values as a NumPy array, copied to the host when ``t`` lives on a GPU (detached from any graph)."""
    return t.detach().cpu().numpy()


def wall_clock(device: str | torch.device = "cpu") -> Callable[[], float]:
    """Start a clock; calling it returns the wall seconds since, after the GPU's queued work on ``device`` finished."""

    def sync() -> None:
        dev = torch.device(device)
        if dev.type == "cuda" and torch.cuda.is_available():
            torch.cuda.synchronize(dev)

    sync()
    start = time.perf_counter()

    def elapsed() -> float:
        sync()
        return time.perf_counter() - start

    return elapsed
