"""A frozen teacher's outputs remembered by the content of the batch it was given, within one process.

The arms of a comparison are trained on the same seed with the same batches: SlimSwin's run and its random and
uniform baselines fine-tune on the same subsets, in the same order, with the same augmentation (their ``fit`` seeds
are the iteration's), and ``workbench figures`` trains them one after the other in one worker. Their distillation
asks the teacher for the same logits three times; :func:`teacher_logits` computes them once. The key is the teacher's
weights (their SHA-256, which names a run's checkpoint) and the bytes of the input batch, so a hit returns exactly what
the forward pass would: the same weights on the same input in the same process give the same numbers (a run's
checkpoint is bit-identical with and without the memo; ``tests/test_teacher_memo.py``). Inputs on a GPU, a teacher in
training mode or an unknown key are never remembered. The memo holds at most :data:`LIMIT_BYTES` of outputs (least
recently used first out).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import torch
import torch.nn as nn

__all__ = ["teacher_logits", "clear", "stats", "LIMIT_BYTES"]

#: bytes of remembered outputs (logits: 64 images x 10 classes x 4 bytes = 2.5 KiB a batch; a run asks ~200 batches)
LIMIT_BYTES = 64 << 20

_MEMO: OrderedDict[tuple, torch.Tensor] = OrderedDict()  # (key, shape, dtype, digest) -> output
_COUNTS = {"hits": 0, "misses": 0, "bytes": 0}


def teacher_logits(teacher: nn.Module, images: torch.Tensor, key: str | None) -> torch.Tensor:
    """``teacher(images)`` without gradients, from the memo when the teacher ``key`` (its weights' SHA-256) was given
    the same batch before in this process.

    Example:
        >>> import torch.nn as nn
        >>> net = nn.Linear(3, 2).eval()
        >>> x = torch.ones(4, 3)
        >>> a = teacher_logits(net, x, "sha-of-net"); b = teacher_logits(net, x.clone(), "sha-of-net")
        >>> bool(torch.equal(a, b)) and stats()["hits"] >= 1
        True
    """
    if key is None or images.device.type != "cpu" or teacher.training:
        with torch.no_grad():
            return teacher(images)
    x = images.detach().contiguous()
    digest = hashlib.blake2b(x.cpu().numpy().tobytes(), digest_size=20).digest()  # (on the CPU: checked above)
    slot = (key, tuple(x.shape), str(x.dtype), digest)
    if (out := _MEMO.get(slot)) is not None:
        _MEMO.move_to_end(slot)
        _COUNTS["hits"] += 1
        return out.clone()
    with torch.no_grad():
        out = teacher(images)
    _COUNTS["misses"] += 1
    _MEMO[slot] = out.detach().clone()
    _COUNTS["bytes"] += out.numel() * out.element_size()
    while _COUNTS["bytes"] > LIMIT_BYTES and _MEMO:
        _, old = _MEMO.popitem(last=False)
        _COUNTS["bytes"] -= old.numel() * old.element_size()
    return out


def stats() -> dict[str, int]:
    """Hits, misses and bytes held since the process started (or :func:`clear`)."""
    return dict(_COUNTS, entries=len(_MEMO))


def clear() -> None:
    """Forget every remembered output."""
    _MEMO.clear()
    _COUNTS.update(hits=0, misses=0, bytes=0)
