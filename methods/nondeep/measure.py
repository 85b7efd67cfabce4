"""Measuring the deployment claims: single-thread CPU latency and peak memory (Non-deep ViT Table 1, App. D).

Paper: "Non-deep Vision Transformers" (anonymous ICLR submission). Table 1 times batch-1 inference on
one CPU thread (Intel i9-9900X); Tables 10 / 11 report peak GPU memory of one training step (forward +
backward, SGD momentum 0.9, FP32, batch 256) and of one inference forward (eval, no grad), read with
``torch.cuda.max_memory_allocated``.

- :func:`latencies`: the models timed **round-robin** (one forward of each in turn, ``repeats`` rounds
  after ``warmup``), so a load change on a shared machine hits every model alike; median per model.
- :func:`peak_memory`: on a CUDA device the paper's own measure (``max_memory_allocated`` after a reset);
  on a CPU the maximum of the live bytes of every tensor storage created inside the step plus the
  pre-existing ones (parameters, inputs), tracked through a ``TorchDispatchMode`` — allocator-independent
  and deterministic, so it needs no quiet machine. Both count parameters, inputs, activations kept for
  backward, gradients and the optimizer's momentum buffers; the CPU count leaves out allocator slack.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Mapping
from typing import Literal

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["PeakMemory", "latencies", "peak_memory"]


class PeakMemory(TorchDispatchMode):
    """Live bytes of tensor storages (``preexisting`` ones plus those created inside the mode) and their maximum."""

    def __init__(self, preexisting: list[torch.Tensor]):
        super().__init__()
        self.seen: dict[int, int] = {}
        for t in preexisting:  # views of one storage count once
            self.seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        self.live = self.peak = sum(self.seen.values())

    def _free(self, key: int) -> None:
        self.live -= self.seen.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                key = st.data_ptr()
                if key in self.seen or st.nbytes() == 0:
                    continue
                self.seen[key] = st.nbytes()
                self.live += st.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(st, self._free, key)
        return out


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None, optimizer) -> None:
    if y is None:
        with torch.no_grad():
            model(x)
        return
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def peak_memory(model: nn.Module, batch: int, mode: Literal["train", "infer"], *,
                input_size: tuple[int, ...] | None = None, num_classes: int | None = None) -> int:
    """Peak bytes of one training step (``"train"``: forward + backward + SGD momentum 0.9 step, train mode) or of one
    inference forward (``"infer"``: eval mode, no grad) at ``batch`` images, on the model's device (module docstring).

    The model's gradients are cleared before and after; its weights change by one SGD step in ``"train"``.
    """
    if mode not in ("train", "infer"):
        raise ValueError(f"mode must be 'train' or 'infer', got {mode!r}")
    ref = next(model.parameters())
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    input_size = tuple(input_size or cfg.get("input_size", (3, 224, 224)))
    num_classes = num_classes or getattr(model, "num_classes", 1000)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *input_size, generator=gen).to(ref.device, ref.dtype)
    y = torch.randint(0, num_classes, (batch,), generator=gen).to(ref.device) if mode == "train" else None
    model.train(mode == "train")
    model.zero_grad(set_to_none=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9) if mode == "train" else None
    try:
        if ref.device.type == "cuda":
            torch.cuda.synchronize(ref.device)
            torch.cuda.reset_peak_memory_stats(ref.device)
            _step(model, x, y, opt)
            torch.cuda.synchronize(ref.device)
            return int(torch.cuda.max_memory_allocated(ref.device))
        with PeakMemory([*model.parameters(), *model.buffers(), x, *([y] if y is not None else [])]) as mem:
            _step(model, x, y, opt)
        return int(mem.peak)
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


@torch.no_grad()
def latencies(models: Mapping[str, nn.Module], input_size: tuple[int, ...] = (3, 224, 224), *, repeats: int = 30,
              warmup: int = 5) -> dict[str, float]:
    """Median wall time (ms) of one batch-1 forward per model, timed round-robin (module docstring).

    Runs on the models' own devices (synchronised on CUDA) with the caller's thread settings: wrap the
    call in ``methods.launch.cpu_threads(1)`` for the paper's single-thread protocol.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be ≥ 1, got {repeats}")
    inputs = {}
    for name, m in models.items():
        ref = next(m.parameters())
        inputs[name] = torch.randn(1, *input_size, generator=torch.Generator().manual_seed(0)).to(ref.device, ref.dtype)
        m.eval()
    times: dict[str, list[float]] = {k: [] for k in models}
    for r in range(warmup + repeats):
        for name, m in models.items():
            cuda = inputs[name].device.type == "cuda"
            if cuda:
                torch.cuda.synchronize(inputs[name].device)
            t0 = time.perf_counter()
            m(inputs[name])
            if cuda:
                torch.cuda.synchronize(inputs[name].device)
            if r >= warmup:
                times[name].append(1e3 * (time.perf_counter() - t0))
    return {k: statistics.median(v) for k, v in times.items()}
