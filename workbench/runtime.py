"""Where the workbench runs: the device, CPU threads, atomic file writes.

The implementations live in :mod:`methods.train` and :mod:`methods.io` (training needs them and ``methods`` never
imports ``workbench``); this module is their workbench-level home, so that figures, the CLI and the scheduler reach
them without importing ``methods``.
"""

from __future__ import annotations

from methods.io import atomic_path, atomic_write_text
from methods.train import cpu_threads, resolve_device

__all__ = ["atomic_path", "atomic_write_text", "cpu_threads", "resolve_device"]
