"""Paired activations: a teacher's and a student's values at corresponding places, token by token on the same images.

Which places: a model's blocks are its ``*.hook_resid_post`` hook points (or ``stages.*.hook_out``), as for
``compare``; the student's block ``i`` stands for the teacher's blocks ``groups[i]`` of the correspondence its method
declares (``compare``'s ``correspondence``), paired with the last block of the group; without one, blocks pair by name.

Tokens: a ``(B, T, D)`` token sequence gives ``B·T`` rows, a ``(B, H, W, C)`` map (Swin) ``B·H·W`` rows, a
``(B, C, H, W)`` stage map (CNN) ``B·H·W`` rows (positions as tokens). Swin's window tokens need no reordering: timm
reverses the window partition and the shift inside each block, so a block's output is in image order (row-major
positions) in a Swin and its SlimSwin alike, as a CNN's and its AttentionLite student's stage maps of equal
resolution are (``tests/test_features_pairs.py`` checks that a change of one patch of pixels moves the row at that
position most, in both models). The two models' rows must describe the same tokens: equal counts, else a clear error
(the common grid of unequal maps is not implemented yet).

Images stream in batches of a seeded order, so memory stays bounded by one batch of both models' activations.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import torch
import torch.nn as nn

from methods.hooks import run_with_cache
from workbench.analysis.activations import rows_of
from workbench.analysis.teacher_vs_students import block_pairs, representation_names

__all__ = ["ImageSource", "paired_hooks", "token_rows", "hook_value", "image_batches", "paired_tokens"]

#: images: a ``(N, C, H, W)`` tensor, or any indexable whose items are an image tensor or ``(image, label, ...)``
ImageSource = torch.Tensor | Sequence


def paired_hooks(teacher: nn.Module, student: nn.Module,
                 groups: Sequence[Sequence[int]] | None = None) -> dict[str, str]:
    """Teacher hook name -> the student hook name at the corresponding place (module docstring), in forward order.

    Raises:
        ValueError: a model without block hook points, or a correspondence that does not fit the models.
    """
    t_names, s_names = representation_names(teacher), representation_names(student)
    if not t_names or not s_names:
        which = "teacher" if not t_names else "student"
        raise ValueError(f"the {which} has no block hook points (*.hook_resid_post or stages.*.hook_out); "
                         "name its blocks with methods.hooks.HookPoint or an adapter")
    suffix = {_block(n): n for n in t_names}, {_block(n): n for n in s_names}
    pairs = block_pairs(list(suffix[0]), list(suffix[1]), groups)
    return {suffix[0][t]: suffix[1][s] for t, s in pairs.items() if s in suffix[1]}


def _block(name: str) -> str:
    return name.rsplit(".", 1)[0]


def token_rows(value: torch.Tensor, name: str) -> torch.Tensor:
    """``(tokens, D)`` rows of one hook value (module docstring, "Tokens"): the ``activations`` extractor's
    :func:`~workbench.analysis.activations.rows_of`, images flattened into the rows."""
    return rows_of(value, name).flatten(0, 1)  # (B, T, D) -> (B·T, D)


@torch.no_grad()
def hook_value(model: nn.Module, name: str, images: torch.Tensor) -> torch.Tensor:
    """``model``'s value at hook point ``name`` on ``images`` (the forward stops there)."""
    _, cache = run_with_cache(model, images, names=[name], stop_early=True)
    return cache[name]


def _image(item) -> torch.Tensor:
    return item[0] if isinstance(item, (tuple, list)) else item


def image_batches(images: ImageSource, batch_size: int, *, seed: int, epoch: int = 0, shuffle: bool = True,
                  start: int = 0) -> Iterator[tuple[int, torch.Tensor]]:
    """``(batch index, (B, C, H, W) images)`` in a seeded order (the same for the same seed and epoch).

    ``start`` skips the first batches without loading them (resuming a training).
    """
    n = len(images)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)) if shuffle \
        else torch.arange(n)
    for i, lo in enumerate(range(0, n, batch_size)):
        if i < start:
            continue
        idx = order[lo:lo + batch_size]
        if isinstance(images, torch.Tensor):
            yield i, images[idx]
        else:
            yield i, torch.stack([_image(images[int(j)]) for j in idx])


@torch.no_grad()
def paired_tokens(models: Mapping[str, nn.Module], hooks: Mapping[str, str], images: torch.Tensor,
                  device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """Per model (in ``models``' order) ``(tokens, d_m)`` float32 rows of its hook ``hooks[label]`` on ``images``.

    Raises:
        ValueError: the models give different numbers of tokens for the same images.
    """
    rows = []
    for label, model in models.items():
        _, cache = run_with_cache(model, images.to(device), names=[hooks[label]], stop_early=True)
        rows.append(token_rows(cache[hooks[label]], hooks[label]).float())
    counts = {label: r.shape[0] for label, r in zip(models, rows)}
    if len(set(counts.values())) > 1:
        raise ValueError(f"the paired hook points give different token counts per batch ({counts}, hooks "
                         f"{dict(hooks)}); pair blocks whose outputs share a token grid")
    return rows
