"""Baselines for Sparsifiner's connectivity masks: the teacher's own top-B keys and B random keys (papers/001).

Sparsifiner (Wei et al., CVPR 2023) claims that its learned, instance-dependent connectivity mask keeps the keys that
matter (§4, Fig. 3: the sparse map "retains all of the highest connectivity values"), so that attention restricted to
B = ⌈K·n⌉ keys per patch query costs little accuracy. Whether a *learned* mask is good is only measurable against
other masks of the same budget on the same weights. Three masks, each applied to the dense teacher's weights with
Eq. 4's rule (the kept entries keep their full-softmax values; the others are 0), prefix (CLS) query rows dense as
in :mod:`methods.sparsifiner`:

- ``learned``: the phase-1 predictors' mask (the keep-rate run's train form with the phase-1 checkpoint: the
  backbone is still the teacher's, only the predictors were trained) — the accuracy the run records as
  ``phase1_val_acc``;
- ``top-B``: each row's B largest entries of the teacher's own attention (an oracle: it needs the dense map the
  method avoids computing, so it bounds what any mask of that size can keep);
- ``random``: B keys drawn uniformly per (image, head, query) row.

:func:`mask_baselines` returns per-image held-out correctness of each, beside the trained students' and the
teacher's, so the figures can test the differences paired.
"""

from __future__ import annotations

import copy
from typing import Literal, Sequence

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from methods.sparsifiner import budget as attention_budget
from workbench.models import create_model, load_model, load_weights, read_state_dict
from workbench.runs import Run, open_run

__all__ = ["MaskedAttention", "mask_teacher", "mask_baselines", "correctness"]

Choice = Literal["top-B", "random"]


class MaskedAttention(nn.Module):
    """A timm ``Attention`` whose patch-query rows keep only ``keep`` keys (top-B of its own softmax, or random).

    Eq. 4 of the paper: ``A = softmax(QKᵀ/√d) ⊙ M`` (kept entries keep their dense values), ``out = A V``.
    """

    def __init__(self, attn: nn.Module, keep: int, prefix: int, choice: Choice, seed: int = 0):
        super().__init__()
        self.attn, self.keep, self.prefix, self.choice = attn, keep, prefix, choice
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, **_) -> torch.Tensor:
        a = self.attn
        b, n, _ = x.shape
        qkv = a.qkv(x).reshape(b, n, 3, a.num_heads, a.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, N, D_h)
        q, k, v = qkv.unbind(0)
        q, k = a.q_norm(q), a.k_norm(k)
        probs = ((q * a.scale) @ k.transpose(-2, -1)).softmax(-1)  # (B, H, N, N)
        score = probs if self.choice == "top-B" else torch.rand(probs.shape, generator=self.generator).to(probs)
        idx = score[:, :, self.prefix:].topk(self.keep, dim=-1).indices  # (B, H, N-P, keep)
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[:, :, : self.prefix] = True  # prefix (CLS) query rows stay dense
        mask[:, :, self.prefix:].scatter_(-1, idx, True)
        out = (probs * mask) @ v  # (B, H, N, D_h)
        out = a.norm(out.transpose(1, 2).reshape(b, n, -1))
        return a.proj_drop(a.proj(out))


def mask_teacher(teacher: nn.Module, keep_rate: float, choice: Choice, seed: int = 0) -> nn.Module:
    """A copy of a timm ViT teacher whose every attention keeps ``⌈keep_rate · n⌉`` keys per patch query."""
    model = copy.deepcopy(teacher).eval()
    tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    keep = attention_budget(keep_rate, tokens)
    for i, blk in enumerate(model.blocks):
        blk.attn = MaskedAttention(blk.attn, keep, model.num_prefix_tokens, choice, seed=seed + 1000 * i)
    return model


@torch.no_grad()
def correctness(model: nn.Module, val_set, device: str | torch.device = "cpu", batch_size: int = 250) -> np.ndarray:
    """Per held-out image, whether ``model``'s top-1 class is the label: ``(n,)`` bool, in the set's order."""
    model = model.to(device).eval()
    out = [(model(x.to(device)).argmax(-1) == y.to(device)).cpu() for x, y in DataLoader(val_set, batch_size=batch_size)]
    return torch.cat(out).numpy()


def _phase1_student(run: Run) -> nn.Module:
    """The keep-rate run's train form with the phase-1 weights (teacher backbone + trained predictors)."""
    model = create_model(run.config["model_name"], **run.config["model_kwargs"])
    phase1 = open_run(run.config["phase1_run"])
    load_weights(model, read_state_dict(phase1.checkpoint), what=f"phase-1 run {phase1.id!r} checkpoint")
    return model


def mask_baselines(teacher: Run, runs: dict[float, Run], linformer: Run | None, profile: str,
                   seeds: Sequence[int] = (0,), device: str = "cpu"):
    """Per-image held-out correctness of the masks of the module docstring and of the trained models.

    Args:
        teacher: the dense ViT teacher run.
        runs: keep rate -> the Sparsifiner keep-rate run.
        linformer: the Linformer baseline run (or None).
        profile: selects the held-out set.
        seeds: random-key draws, averaged per image.
        device: where to evaluate.

    Returns:
        Dataset with ``correct(mask, keep_rate, sample)`` (``mask``: ``learned`` (phase 1, teacher weights),
        ``top-B``, ``random`` (mean over seeds), ``trained`` (phase 2: the student as trained)),
        ``teacher_correct(sample)``, ``linformer_correct(sample)`` (NaN without a run), ``budget(keep_rate)``.
    """
    import xarray as xr

    from workbench.pipelines.teacher import datasets

    base = load_model(str(teacher.dir), device="cpu").model.eval()
    pc = base.pretrained_cfg
    _, val_set = datasets(profile, None, tuple(pc["input_size"]), pc.get("mean"), pc.get("std"))
    rates = sorted(runs)
    masks = ("learned", "top-B", "random", "trained")
    correct = np.full((len(masks), len(rates), len(val_set)), np.nan)
    tokens = base.patch_embed.num_patches + base.num_prefix_tokens
    for j, k in enumerate(rates):
        correct[0, j] = correctness(_phase1_student(runs[k]), val_set, device)
        correct[1, j] = correctness(mask_teacher(base, k, "top-B"), val_set, device)
        correct[2, j] = np.mean([correctness(mask_teacher(base, k, "random", seed=s), val_set, device) for s in seeds], 0)
        correct[3, j] = correctness(load_model(str(runs[k].dir), device="cpu").model, val_set, device)
    lin = (correctness(load_model(str(linformer.dir), device="cpu").model, val_set, device).astype(float)
           if linformer is not None else np.full(len(val_set), np.nan))
    return xr.Dataset(
        {"correct": (("mask", "keep_rate", "sample"), correct),
         "teacher_correct": ("sample", correctness(base, val_set, device).astype(float)),
         "linformer_correct": ("sample", lin),
         "budget": ("keep_rate", [attention_budget(k, tokens) for k in rates])},
        coords={"mask": list(masks), "keep_rate": rates, "sample": np.arange(len(val_set))},
        attrs={"teacher_run": teacher.id, "tokens": tokens, "seeds": str(list(seeds)),
               "linformer_run": linformer.id if linformer is not None else ""})
