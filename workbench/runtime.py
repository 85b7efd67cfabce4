"""The workbench's one door to :mod:`methods.launch`, :mod:`methods.train` and :mod:`methods.io`: device, CPU
threads, distributed ranks, atomic writes and the training loop.

The implementations live in :mod:`methods.launch`, :mod:`methods.train` and :mod:`methods.io` (training needs
them and ``methods`` never imports ``workbench``); every workbench module — the CLI, figures, the explorer, the scheduler and the pipelines —
takes them from here, never from ``methods`` (``tests/test_imports.py`` checks it transitively). The atomic writes
come with this module (light: no torch); the device and the ranks from :mod:`methods.launch` (torch only) and the
training loop from :mod:`methods.train` (torch, timm) on first use, so that reading a store or listing the figures
stays torch-free and a process that only needs its device does not import timm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from methods.io import atomic_path, atomic_write_text

if TYPE_CHECKING:
    from methods.launch import barrier, cpu_threads, init_distributed, is_main, main_decides, resolve_device  # noqa: F401
    from methods.train import (  # noqa: F401
        TrainConfig,
        TrainHook,
        atomic_save_safetensors,
        evaluate,
        fit,
        mixup_cutmix,
        repeated_augmentation,
        soft_target_cross_entropy,
        workers_for,
    )

#: names served from :mod:`methods.launch` (the device and the ranks: torch only), imported on first use
LAUNCH = ("barrier", "cpu_threads", "init_distributed", "is_main", "main_decides", "resolve_device")
#: names served from :mod:`methods.train` (the training loop: torch and timm), imported on first use
TRAIN = ("TrainConfig", "TrainHook", "atomic_save_safetensors", "evaluate", "fit", "mixup_cutmix",
         "repeated_augmentation", "soft_target_cross_entropy", "workers_for")

__all__ = ["atomic_path", "atomic_write_text", *LAUNCH, *TRAIN]


def __getattr__(name: str) -> Any:
    if name in LAUNCH:
        import methods.launch as launch

        return getattr(launch, name)
    if name in TRAIN:
        import methods.train as train

        return getattr(train, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
