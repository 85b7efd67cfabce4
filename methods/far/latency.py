"""Single-image CPU latency of DeiT and FAR models (FAR Table 2, App. A.4), in PyTorch or ONNX Runtime.

Paper: Ren et al., "Is Attention Required for Transformer Inference? Explore Function-preserving
Attention Replacement", App. A.4: ONNX Runtime on one thread (``OMP_NUM_THREADS=1``, no memory
arena, AVX2), batch 1, median of 100 runs after 30 warm-up runs. :func:`torch_latency_ms` is the
same protocol in PyTorch with fewer runs; :func:`torch_latencies_ms` times several models round-robin (the figures:
median of 3 rounds of DeiT, FAR and FAR† after the MAC count's forward);
:func:`onnx_latency_ms` exports with ``torch.onnx.export`` (TorchScript exporter, ``dynamo=False``;
each ``nn.LSTM`` becomes one ONNX ``LSTM`` node) and times an ``onnxruntime`` session.

Pruned models for timing (:func:`uniform_keep_masks`): Table 2's FAR† rows come from learned
masks we do not have; keeping the same number of units in every LSTM — about 48% of 64 for
FAR-Tiny†, which reproduces its FLOPs (``methods.far.flops.CONVENTIONS``) — gives a model of the
same cost.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn

from ..train import cpu_threads  # noqa: F401  (re-exported for figures and benchmarks)
from .hoyer import _subs


def uniform_keep_masks(model: nn.Module, keep_fraction: float) -> torch.Tensor:
    """Keep-mask ``(layer, head, direction, unit)`` keeping the first ``round(keep_fraction · U)`` units everywhere."""
    subs = _subs(model)
    sub = subs[0][1]
    u = sub.hidden_dim
    keep = max(1, round(keep_fraction * u))
    masks = torch.zeros(len(subs), sub.num_heads, 2, u, dtype=torch.bool)
    masks[..., :keep] = True
    return masks


def _input(model: nn.Module, img_size: int) -> torch.Tensor:
    chans = getattr(getattr(getattr(model, "patch_embed", None), "proj", None), "in_channels", 3)
    ref = next(model.parameters())
    return torch.randn(1, chans, img_size, img_size, generator=torch.Generator().manual_seed(0)).to(ref)


@torch.no_grad()
def torch_latency_ms(model: nn.Module, img_size: int, *, repeats: int = 3, warmup: int = 1, threads: int = 1) -> float:
    """Median wall time (ms) of ``repeats`` single-image forward passes after ``warmup`` ones, on ``threads`` CPU threads."""
    model = model.eval()
    x = _input(model, img_size)
    with cpu_threads(threads):
        for _ in range(warmup):
            model(x)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(x)
            times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


@torch.no_grad()
def torch_latency_runs_ms(models: dict[str, nn.Module], img_size: int, *, repeats: int = 3, warmup: int = 1,
                          threads: int = 1) -> dict[str, list[float]]:
    """Wall times (ms) of ``repeats`` single-image forward passes of several models timed round-robin (one forward of
    each in turn per run, after ``warmup`` such runs), so that a change of load hits every model of a run alike: the
    per-run ratios of two models are paired measurements (an interval over runs, not one median against another)."""
    for m in models.values():
        m.eval()
    inputs = {k: _input(m, img_size) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in models}
    with cpu_threads(threads):
        for r in range(warmup + repeats):
            for k, m in models.items():
                start = time.perf_counter()
                m(inputs[k])
                if r >= warmup:
                    times[k].append(1e3 * (time.perf_counter() - start))
    return times


def torch_latencies_ms(models: dict[str, nn.Module], img_size: int, *, repeats: int = 3, warmup: int = 1,
                       threads: int = 1) -> dict[str, float]:
    """The median of each model's :func:`torch_latency_runs_ms`."""
    runs = torch_latency_runs_ms(models, img_size, repeats=repeats, warmup=warmup, threads=threads)
    return {k: statistics.median(v) for k, v in runs.items()}


def export_onnx(model: nn.Module, img_size: int, path: str | Path, opset: int = 17) -> Path:
    """Export ``model`` (batch 1) to ONNX with the TorchScript exporter; returns the path.

    Raises:
        RuntimeError: the export failed (message names the model and the exporter's error).
    """
    path = Path(path)
    x = _input(model.eval(), img_size)
    try:
        torch.onnx.export(model, (x,), str(path), input_names=["images"], output_names=["logits"], opset_version=opset,
                          dynamo=False)
    except Exception as err:  # the exporters raise many types
        raise RuntimeError(f"ONNX export of {type(model).__name__} at {img_size}px failed: {err}") from err
    return path


def onnx_latency_ms(model: nn.Module, img_size: int, *, repeats: int = 10, warmup: int = 3, threads: int = 1,
                    path: Optional[str | Path] = None) -> float:
    """Median ONNX Runtime latency (ms) of one image on ``threads`` intra-op threads, no CPU memory arena (App. A.4)."""
    import numpy as np
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = export_onnx(model, img_size, Path(tmp) / "model.onnx") if path is None else Path(path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.enable_cpu_mem_arena = False
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
        x = _input(model, img_size).cpu().numpy().astype(np.float32)
        for _ in range(warmup):
            session.run(None, {"images": x})
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            session.run(None, {"images": x})
            times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)
