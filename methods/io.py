"""Atomic file writes: every file the workbench writes appears whole or not at all.

One helper, :func:`atomic_path`: write to a temporary name beside the target (same directory, so
the rename is atomic on POSIX), then ``os.replace`` it onto the target; on error the temporary file
is removed and the target is untouched. The other functions are that helper applied to the formats
the workbench writes.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch

__all__ = ["atomic_path", "atomic_write_text", "atomic_save_safetensors", "atomic_torch_save"]


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (same suffix); rename it onto ``path`` when the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def atomic_save_safetensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """Tensors to ``.safetensors`` (made contiguous and moved to the CPU first)."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    return Path(path)


def atomic_torch_save(obj: dict, path: str | Path) -> Path:
    """A tensors-only object (read back with ``torch.load(..., weights_only=True)``)."""
    import torch  # here: the atomic text writers serve commands that never need torch (``workbench inspect``)

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
    return Path(path)
