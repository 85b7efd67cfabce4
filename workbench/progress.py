"""Progress bars of long work: tqdm (a bar on a terminal, a widget in a notebook), silent when asked.

``WORKBENCH_PROGRESS=0`` turns every workbench bar off (the tests set it, and so do the figures' worker
processes: bars from several processes garble a terminal); tqdm's own ``TQDM_DISABLE=1`` works too.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["enabled", "progress_bar"]


def enabled() -> bool:
    """Whether workbench progress bars are shown (``WORKBENCH_PROGRESS`` is not ``0``)."""
    return os.environ.get("WORKBENCH_PROGRESS", "1") != "0"


def progress_bar(total: int, desc: str, *, unit: str = "step") -> Any:
    """A tqdm bar of ``total`` steps (use as a context manager; ``update()`` after each step).

    It goes away when closed (``leave=False``) and writes to stderr, so a command's printed results stay clean.
    """
    from tqdm.auto import tqdm

    off = {} if enabled() else {"disable": True}  # not passed otherwise: TQDM_DISABLE still applies
    return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True, **off)
