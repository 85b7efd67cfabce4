"""Checkpoint files and state dicts: read safely (safetensors, or ``weights_only=True``), load strictly, check finite.

Below :mod:`workbench.models` (which re-exports these) so that the loaders it dispatches to (:mod:`workbench.hf`)
use them without an import cycle.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

__all__ = ["CheckpointError", "read_state_dict", "load_weights", "check_finite_weights"]


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable, unsafe, or does not fit the architecture."""


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read weights from ``.safetensors`` or (``weights_only=True``) ``.pt``/``.pth``.

    Raises:
        CheckpointError: missing file, unknown suffix, damaged file, or a pickle that needs code.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as err:
            raise CheckpointError(f"checkpoint {str(path)!r} is not a readable safetensors file ({err})") from err
    if path.suffix in (".pt", ".pth", ".bin"):
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:
            raise CheckpointError(
                f"checkpoint {str(path)!r} cannot be loaded with weights_only=True: it pickles objects other than "
                f"tensors, and unpickling could run arbitrary code. If you trust it, convert it once to safetensors "
                f"(load it yourself and save model.state_dict() with safetensors.torch.save_file). Detail: {str(err).splitlines()[0]}"
            ) from None
        for key in ("state_dict", "model", "model_ema"):
            if isinstance(obj, dict) and isinstance(obj.get(key), dict):
                obj = obj[key]
                break
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise CheckpointError(f"checkpoint {str(path)!r} holds no state dict of tensors")
        return obj
    raise CheckpointError(f"checkpoint {str(path)!r}: unknown format {path.suffix!r}; use .safetensors, .pt or .pth")


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], *, what: str) -> None:
    """Load ``state`` strictly, naming mismatched keys and shapes on failure.

    Raises:
        CheckpointError: the checkpoint belongs to another architecture.
    """
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in own if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        def few(xs):
            return ", ".join(xs[:6]) + (f", ... ({len(xs)} in all)" if len(xs) > 6 else "")

        parts = [f"missing keys: {few(missing)}" if missing else "", f"unexpected keys: {few(unexpected)}" if unexpected else "",
                 f"shape mismatches (checkpoint vs model): {few(shapes)}" if shapes else ""]
        raise CheckpointError(f"{what} does not fit the architecture {type(model).__name__}: " + "; ".join(p for p in parts if p)
                              + ". Pass the --model the checkpoint was trained as.")
    check_finite_weights(state, what=what)
    model.load_state_dict(state)


def check_finite_weights(state: dict[str, torch.Tensor], *, what: str) -> None:
    """Refuse a state dict with a NaN or ±inf in any floating tensor (a diverged training, a damaged file).

    Raises:
        CheckpointError: naming the first bad tensor, its NaN / inf counts and how many tensors are affected.
    """
    bad = []
    for name, t in state.items():
        if t.is_floating_point() or t.is_complex():
            finite = torch.isfinite(t)
            if not bool(finite.all()):
                bad.append((name, int(torch.isnan(t).sum()), int((~finite).sum()) - int(torch.isnan(t).sum()), t.numel()))
    if bad:
        name, nan, inf, numel = bad[0]
        more = f" (and {len(bad) - 1} more tensor{'s' if len(bad) > 2 else ''})" if len(bad) > 1 else ""
        raise CheckpointError(
            f"{what} holds non-finite weights: tensor {name!r} has {nan} NaN and {inf} inf of {numel} values{more}. "
            "Every analysis of it would be meaningless. The training that wrote it diverged (retrain it, e.g. with a "
            "lower learning rate or gradient clipping, or resume from an earlier finite checkpoint) or the file is "
            "damaged (export it again).")
