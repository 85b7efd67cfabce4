"""What a crosscoder latent does in each model: remove it from that model's activation and watch the correct class.

For latent ``j`` and model ``m`` (hook point ``h_m``, the block the crosscoder reads), the edit is

    x_m(token)  ←  x_m(token) − f_j(token) · W_dec,m[j] / s_m                  (per token, in the model's units)

— the latent's own contribution to the crosscoder's reconstruction of model ``m`` (``f_j`` its code on that token,
from both models' activations, in eval mode; ``s_m`` the model's input factor), applied by a forward hook on ``h_m``
while the rest of the model runs unchanged. The effect is the change of the correct class's log-probability,
``Δ_j,m(image) = log p_m(y | x edited) − log p_m(y | x)`` in nats: negative where the model needed the latent.

Why this edit, not the alternatives:

- *subtract ``f_j · d_j``* (this one) is zero on every token where the latent is off, so the effect belongs to the
  latent and to the tokens it fires on, with the size it has there;
- *project the activation onto the decoder direction and remove the projection* acts on every token, firing or not,
  and — the decoder vectors of a dictionary wider than the activation are far from orthogonal — removes parts of
  every other latent along that direction (and of the reconstruction error);
- *the decoder vector alone* (``x − d_j``) has no size of its own: it ignores how strongly the latent fires.

Each model is edited with its own decoder vector, so a teacher-only latent (``‖W_dec,student[j]‖ ≈ 0``) removes
nearly nothing from the student: its effect there is near zero by construction, and what the diff calls teacher-only
should matter to the teacher.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import xarray as xr
from einops import rearrange

from methods.hooks import hooks as hooked
from workbench.features.crosscoder import Crosscoder
from workbench.features.meaning import paired_codes

__all__ = ["rows_to_value", "latent_contribution", "latent_effects"]


def rows_to_value(rows: torch.Tensor, shape: Sequence[int], name: str) -> torch.Tensor:
    """The inverse of :func:`~workbench.features.pairs.token_rows`: ``(tokens, D)`` rows back into a hook value of
    ``shape`` (``(B, T, D)``, a ``(B, C, H, W)`` stage map for ``*.hook_out``, else a ``(B, H, W, C)`` map)."""
    if len(shape) == 3:
        return rearrange(rows, "(b t) d -> b t d", b=shape[0])
    if len(shape) == 4 and name.endswith(".hook_out"):
        return rearrange(rows, "(b h w) c -> b c h w", b=shape[0], h=shape[2])
    if len(shape) == 4:
        return rearrange(rows, "(b h w) c -> b h w c", b=shape[0], h=shape[1])
    raise ValueError(f"{name}: cannot put rows back into a value of shape {tuple(shape)}")


def latent_contribution(cc: Crosscoder, codes: torch.Tensor, latent: int, model: int) -> torch.Tensor:
    """``(N, d_m)`` what latent ``latent`` writes into model ``model``'s activation, in the model's own units:
    ``f_j · W_dec,m[j] / s_m`` (module docstring)."""
    return codes[:, latent:latent + 1] * cc.W_dec[model][latent] / cc.scale[model]


def _logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits.float(), -1).gather(1, targets[:, None]).squeeze(1)


@torch.no_grad()
def _batch_effects(cc: Crosscoder, models: Mapping[str, nn.Module], hooks: Mapping[str, str], x: torch.Tensor,
                   y: torch.Tensor, latents: Sequence[int], measure: Sequence[str], chunk: int, device
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(effects (models, latents, B), fires (latents, B))`` of one batch of images.

    Only the (latent, image) pairs where the latent fires on some token are run: elsewhere the edit is zero and so is
    the effect, exactly."""
    _, codes = paired_codes(cc, models, hooks, x, device)  # (B·T, width)
    b = x.shape[0]
    per_image = codes.reshape(b, -1, cc.width)[..., list(latents)]  # (B, T, latents)
    fires = (per_image > 0).any(1).T  # (latents, B)
    pairs = fires.nonzero()  # (P, 2): (position in latents, image)
    out = np.full((len(models), len(latents), b), np.nan)
    for m, (label, model) in enumerate(models.items()):
        if label not in measure:
            continue
        out[m] = 0.0
        base = _logp(model(x), y)
        for lo in range(0, pairs.shape[0], chunk * b):
            lat, img = pairs[lo:lo + chunk * b].unbind(1)  # (P,), (P,)
            a = per_image[img, :, lat]  # (P, T): the latent's code on each token of its image
            w = cc.W_dec[m][torch.as_tensor(latents, device=a.device)[lat]] / cc.scale[m]  # (P, d_m)
            delta = (a[..., None] * w[:, None, :]).reshape(-1, w.shape[1])  # (P·T, d_m), image-major

            def edit(value: torch.Tensor, name: str, delta=delta) -> torch.Tensor:
                return value - rows_to_value(delta.to(value.dtype), value.shape, name)

            with hooked(model, {hooks[label]: edit}):
                logits = model(x[img])  # (P, classes)
            out[m, lat.cpu().numpy(), img.cpu().numpy()] = (_logp(logits, y[img]) - base[img]).double().cpu().numpy()
    return out, fires.cpu().numpy()


@torch.no_grad()
def latent_effects(cc: Crosscoder, models: Mapping[str, nn.Module], hooks: Mapping[str, str], images: torch.Tensor,
                   targets: Sequence[int], latents: Sequence[int], samples: Sequence[int] | None = None, *,
                   measure: Sequence[str] | None = None, batch_size: int = 64, chunk: int = 8,
                   device: torch.device | str = "cpu") -> xr.Dataset:
    """The causal effect of each of ``latents`` in each model (module docstring) on ``images``.

    Args:
        cc: the crosscoder over ``models`` (the teacher first, in eval mode, on ``device``) at ``hooks``.
        images: ``(N, C, H, W)`` normalised for the models; ``targets``: ``(N,)`` the correct class of each.
        latents: the latent indices to remove, one at a time.
        samples: dataset index of each image (the ``sample`` coordinate); default ``0..N-1``.
        measure: the model labels to measure the effects in (default: all; the others get NaN). Every model runs
            up to its hook point anyway: a token's code reads both models.
        chunk: (latent, image) pairs run in one forward pass, in multiples of ``batch_size``.

    Returns:
        ``effect(model, latent, sample)``: Δ log p(correct class) in nats (0 where the latent does not fire on the
        image: nothing is removed); ``fires(latent, sample)``: whether the latent is active on any token of the
        image; ``effect_mean(model, latent)``: the mean over the images.

    Raises:
        ValueError: a target outside the models' classes (e.g. -1 for an image without a label).
    """
    y_all = torch.as_tensor(np.asarray(targets), dtype=torch.long)
    if y_all.shape != (images.shape[0],) or bool((y_all < 0).any()):
        raise ValueError(f"targets must be one class index >= 0 per image ({images.shape[0]}), got shape "
                         f"{tuple(y_all.shape)} with min {int(y_all.min()) if y_all.numel() else 'n/a'}; for "
                         "images without labels pass the teacher's predicted classes")
    latents = [int(j) for j in latents]
    measure = list(models) if measure is None else list(measure)
    n = images.shape[0]
    eff, fire = np.full((len(models), len(latents), n), np.nan), np.zeros((len(latents), n), bool)
    for lo in range(0, n, batch_size):
        x, y = images[lo:lo + batch_size].to(device), y_all[lo:lo + batch_size].to(device)
        if latents:
            eff[..., lo:lo + x.shape[0]], fire[:, lo:lo + x.shape[0]] = _batch_effects(
                cc, models, hooks, x, y, latents, measure, chunk, device)
    return _effects_dataset(eff, fire, list(models), latents, np.arange(n) if samples is None else np.asarray(samples))


def _effects_dataset(eff: np.ndarray, fire: np.ndarray, labels: list[str], latents: list[int],
                     samples: np.ndarray) -> xr.Dataset:
    ds = xr.Dataset({"effect": (("model", "latent", "sample"), eff), "fires": (("latent", "sample"), fire)},
                    coords={"model": labels, "latent": np.asarray(latents, dtype=np.int64), "sample": samples})
    ds["effect_mean"] = ds["effect"].mean("sample")
    for v in ("effect", "effect_mean"):
        ds[v].attrs.update(units="nats", long_name="Δ log p(correct class) with the latent removed from the model")
    return ds.assign_attrs(edit="x_m - f_j * W_dec[m, j] / s_m at the crosscoder's hook point, per token")
