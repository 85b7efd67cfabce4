"""The explorer's latent view: a clicked token's active crosscoder latents, and one latent's activation over the image.

A crosscoder trained by ``workbench features`` (its diff store ``X.nc`` with the checkpoint
``X.crosscoder.safetensors`` beside it) reads a teacher's and a student's activations at one block pair. For the
explorer's current image and clicked token (the state's selection: one source of truth), :class:`LatentView` lists

- every latent active on that token — the crosscoder's own code (eval mode: its inference threshold), largest first —
  with its id, its class (``shared`` / ``teacher_only`` / ``student_only`` / ``partial``, from the diff store, by its
  relative decoder norm ``‖d_student‖ / (‖d_teacher‖ + ‖d_student‖)``) and that relative norm;

and, for the picked latent ``j`` (the token's most active one until another is picked), three maps over the image's
token grid, on one colour scale (0 to the largest of the three):

- ``code``: the crosscoder's code ``f_j`` on each token (both models' activations read together);
- ``teacher`` / ``student``: the latent's encoding from that model's activation alone,
  ``ReLU(b_enc,j + (s_m x_m − b_dec,m) · W_enc,m[:, j])`` (the other model's term left out, no threshold): where the
  teacher's activation alone would switch the latent on, and where the student's would — a teacher-only latent lit
  in the teacher's map and dark in the student's is a feature the student lost on those tokens.

Units: the crosscoder's code (its input scaled to unit token variance per model). Prefix tokens (``cls``) have no
place on the grid; their values are listed beside the maps.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from workbench.explore.rows import ExploreError, Query
from workbench.features.crosscoder import Crosscoder, load_crosscoder
from workbench.features.meaning import token_layout
from workbench.features.pairs import hook_value, token_rows

__all__ = ["LatentView", "UNITS", "one_sided_codes"]

UNITS = "code (inputs at unit variance)"


def one_sided_codes(cc: Crosscoder, rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """``(models, N, width)``: each latent's encoding from one model's ``(N, d_m)`` rows alone (module docstring)."""
    return torch.stack([F.relu(cc.b_enc + (x * cc.scale[m] - cc.b_dec[m]) @ cc.W_enc[m]) for m, x in enumerate(rows)])


class LatentView:
    """A clicked token's active latents and a picked latent's maps, for one teacher-student crosscoder.

    Args:
        cc: the crosscoder (teacher first); used in eval mode.
        models: ``{teacher label: model, student label: model}`` (eval mode), the teacher first.
        hooks: label -> the hook point the crosscoder reads.
        images: ``(B, C, H, W)`` the explorer's images, normalised for the models, in its order.
        ids: ``dataset[index]`` of each image.
        classes, relative: ``(width,)`` each latent's class and relative decoder norm (the diff store's).

    Raises:
        ExploreError: a crosscoder of other widths than the models' activations at ``hooks``.
    """

    def __init__(self, cc: Crosscoder, models: Mapping[str, nn.Module], hooks: Mapping[str, str],
                 images: torch.Tensor, ids: Sequence[str], classes: Sequence[str], relative: Sequence[float],
                 cache_size: int = 4):
        if len(models) != 2 or set(models) != set(hooks):
            raise ExploreError(f"a latent view needs a teacher and one student with their hooks, got models "
                               f"{list(models)} and hooks {dict(hooks)}")
        self.cc, self.models, self.hooks = cc.eval(), dict(models), dict(hooks)
        self.images, self.ids = images, list(ids)
        self.classes, self.relative = np.asarray(classes).astype(str), np.asarray(relative, np.float64)
        if len(self.classes) != cc.width or len(self.relative) != cc.width:
            raise ExploreError(f"the diff store describes {len(self.classes)} latents, the crosscoder has {cc.width}: "
                               "pass the store the checkpoint beside it was trained for")
        self.picked: int | None = None  # the latent whose maps are shown (None: the clicked token's most active)
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = cache_size
        self.codes(0)  # checks the widths on the first image

    @classmethod
    def from_store(cls, path: str | Path, models: Mapping[str, nn.Module], images: torch.Tensor,
                   ids: Sequence[str]) -> LatentView:
        """From a ``workbench features`` store and its checkpoint beside it (``X.crosscoder.safetensors``).

        ``models``: ``{teacher label: model, student label: model}``, in that order.

        Raises:
            ExploreError: a missing store or checkpoint, a store that is no crosscoder diff.
        """
        import xarray as xr

        path = Path(path)
        ckpt = path.with_suffix(".crosscoder.safetensors")
        for p, what in ((path, "diff store"), (ckpt, "crosscoder checkpoint")):
            if not p.exists():
                raise ExploreError(f"no {what} at {p}; train one with `workbench features --teacher T --student S "
                                   f"--out {path}` (the checkpoint is written beside the store)")
        with xr.open_dataset(path) as ds:
            if "relative_norm" not in ds or "hooks" not in ds.attrs:
                raise ExploreError(f"{path} is no crosscoder diff store (no relative_norm / hooks); write one with "
                                   "`workbench features`")
            stored = json.loads(ds.attrs["hooks"])
            classes, relative = ds["latent_class"].values, ds["relative_norm"].values
        device = next(iter(next(iter(models.values())).parameters())).device
        cc, _, _ = load_crosscoder(ckpt, device=device)
        labels = list(models)
        hooks = {labels[0]: stored["teacher"], labels[1]: stored["student"]}
        return cls(cc, models, hooks, images, ids, classes, relative)

    # ------------------------------------------------------------------ computation
    @torch.no_grad()
    def codes(self, image: int) -> dict:
        """One image's ``layout``, ``code`` ``(T, width)`` and ``sided`` ``(models, T, width)`` (cached)."""
        if image in self._cache:
            self._cache.move_to_end(image)
            return self._cache[image]
        x = self.images[image:image + 1]
        rows, shape = [], None
        for label, model in self.models.items():
            value = hook_value(model, self.hooks[label], x)
            shape = tuple(value.shape) if shape is None else shape
            rows.append(token_rows(value, self.hooks[label]).float().to(self.cc.b_enc.device))
        widths = tuple(r.shape[1] for r in rows)
        if widths != self.cc.dims or rows[0].shape[0] != rows[1].shape[0]:
            raise ExploreError(f"the crosscoder reads widths {self.cc.dims}, the models give {widths} "
                               f"({rows[0].shape[0]} and {rows[1].shape[0]} tokens) at {self.hooks}: pass the "
                               "models the crosscoder was trained on")
        first = next(iter(self.models))
        layout = token_layout(shape, self.hooks[first], tuple(x.shape[-2:]), self.models[first])
        code, _ = self.cc.encode(rows)
        out = {"layout": layout, "code": code.cpu().numpy(), "sided": one_sided_codes(self.cc, rows).cpu().numpy()}
        self._cache[image] = out
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return out

    def token(self, image: int, query: Query) -> tuple[int | None, tuple[int, int] | None]:
        """``(token index, (row, column) on the crosscoder's grid)`` of a query (``None`` where it has no such token)."""
        layout = self.codes(image)["layout"]
        if query[0] == "patch":
            gh, gw = layout.grid
            y, x = min(gh - 1, int(query[1] * gh)), min(gw - 1, int(query[2] * gw))
            return layout.num_prefix + y * gw + x, (y, x)
        kinds = list(layout.prefix_kinds)
        return (kinds.index(query[0]), None) if query[0] in kinds else (None, None)

    def active(self, image: int, query: Query) -> list[dict]:
        """The latents active on the query's token, largest code first: ``id``, ``cls``, ``activation``, ``relative``."""
        t, _ = self.token(image, query)
        if t is None:
            return []
        code = self.codes(image)["code"][t]
        ids = np.flatnonzero(code > 0)
        ids = ids[np.argsort(-code[ids], kind="stable")]
        return [{"id": int(j), "cls": str(self.classes[j]), "activation": float(code[j]),
                 "relative": float(self.relative[j])} for j in ids]

    def maps(self, image: int, latent: int) -> dict[str, np.ndarray]:
        """``{"code", teacher label, student label}`` -> the latent's ``(gh, gw)`` map over the image's grid."""
        c = self.codes(image)
        layout = c["layout"]
        p, (gh, gw) = layout.num_prefix, layout.grid
        out = {"code": c["code"][p:, latent].reshape(gh, gw)}  # (T - prefix,) -> (gh, gw), row-major grid
        for m, label in enumerate(self.models):
            out[label] = c["sided"][m, p:, latent].reshape(gh, gw)
        return out

    def pick(self, latent: int | None) -> None:
        """Show ``latent``'s maps (None: the clicked token's most active latent)."""
        if latent is not None and not 0 <= int(latent) < self.cc.width:
            raise ExploreError(f"latent {latent} out of range: the crosscoder has {self.cc.width} (0..{self.cc.width - 1})")
        self.picked = None if latent is None else int(latent)

    def payload(self, image: int, query: Query) -> tuple[dict, bytes]:
        """The view's JSON part and its float16 maps (``code``, teacher, student; row-major, concatenated)."""
        active = self.active(image, query)
        _, cell = self.token(image, query)
        layout = self.codes(image)["layout"]
        picked = self.picked if self.picked is not None else (active[0]["id"] if active else None)
        state = {"image_id": self.ids[image], "grid": list(layout.grid), "cell": list(cell) if cell else [-1, -1],
                 "active": active, "picked": picked, "units": UNITS, "models": list(self.models),
                 "hooks": [self.hooks[k] for k in self.models]}
        if picked is None:
            return state, b""
        maps = self.maps(image, picked)
        vmax = max(float(m.max()) for m in maps.values())
        c = self.codes(image)
        prefix = {kind: [float(c["code"][i, picked])] + [float(c["sided"][m, i, picked]) for m in range(2)]
                  for i, kind in enumerate(layout.prefix_kinds)}
        state.update(panels=list(maps), vmin=0.0, vmax=vmax if vmax > 0 else 1.0, prefix=prefix,
                     picked_cls=str(self.classes[picked]), picked_relative=float(self.relative[picked]))
        return state, np.concatenate([m.ravel() for m in maps.values()]).astype(np.float16).tobytes()
