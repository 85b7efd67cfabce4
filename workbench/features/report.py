"""One teacher and one student, everything the gallery shows of them (``compare.features``): a crosscoder at one
block pair, its diff, what its most teacher-leaning latents mean and do, and the lost-features test.

:func:`study_pair` trains the crosscoder on the training images' activations, read once and kept in memory for the
epochs (a subset small enough for that: the streamed, bounded-memory training is
:func:`~workbench.features.train.train_crosscoder`), then on the held-out images computes

- the diff (:func:`~workbench.features.diff.crosscoder_diff`),
- per-image correctness of both models and each latent's image means (:mod:`~workbench.features.meaning`),
- the effects (:mod:`~workbench.features.effects`) of the live teacher-only latents (up to ``candidates``, the most
  active first) and of the ``show`` latents the figure shows: the teacher-only ones with the largest teacher drop,
  filled up with the live latents of lowest relative decoder norm when fewer are teacher-only (their class is
  stored beside them: a figure never passes a partial latent off as lost),
- the lost-features test (:mod:`~workbench.features.lost`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Mapping

import numpy as np
import torch
import torch.nn as nn
import xarray as xr

from workbench.features.crosscoder import Crosscoder, CrosscoderConfig, config_dict
from workbench.features.diff import ClassThresholds, crosscoder_diff
from workbench.features.effects import latent_effects
from workbench.features.lost import LostThresholds, lost_features, rank_teacher_only
from workbench.features.meaning import activations_from_rows, hook_shape, patch_crops, token_layout
from workbench.features.pairs import image_batches, paired_tokens
from workbench.features.train import fit_crosscoder

__all__ = ["StudyOptions", "middle_pair", "cached_crosscoder", "study_pair"]


@dataclass(frozen=True)
class StudyOptions:
    """What :func:`study_pair` computes beyond the crosscoder's own config."""

    candidates: int = 12  # live teacher-only latents whose effects are measured (the most active first)
    show: int = 3  # latents shown per student (crops, class means, effects)
    crops: int = 4  # top tokens shown per latent
    context: int = 1  # grid cells of context around a token's crop
    batch_size: int = 100  # held-out images per forward pass
    effect_every: int = 1  # effects on every n-th held-out image (a student's forward can be slow: FAR's BiLSTMs)
    thresholds: ClassThresholds = ClassThresholds()  # latent classes
    lost: LostThresholds = LostThresholds()  # the lost-features test


def middle_pair(hooks: Mapping[str, str]) -> tuple[str, str]:
    """The middle pair (``len // 2``) of :func:`~workbench.features.pairs.paired_hooks`' forward-ordered pairs."""
    items = list(hooks.items())
    if not items:
        raise ValueError("no corresponding block pairs between the teacher and the student")
    return items[len(items) // 2]


def cached_crosscoder(models: Mapping[str, nn.Module], hooks: Mapping[str, str], images: torch.Tensor,
                      cfg: CrosscoderConfig, device: torch.device | str = "cpu") -> Crosscoder:
    """:func:`~workbench.features.train.fit_crosscoder` on ``images``' paired rows, read once (``(N·T, d_m)`` per
    model in memory) and batched by image in the same seeded order as the streamed training."""
    rows = [[] for _ in models]
    for _, x in image_batches(images, 256, seed=0, shuffle=False):
        for m, r in enumerate(paired_tokens(models, hooks, x, device)):
            rows[m].append(r)
    rows = [torch.cat(r) for r in rows]  # per model (N·T, d_m), image-major
    t = rows[0].shape[0] // images.shape[0]  # tokens per image

    def batches(epoch: int, start: int):
        for _, idx in image_batches(torch.arange(images.shape[0]), cfg.batch_images, seed=cfg.seed, epoch=epoch,
                                    start=start):
            tok = (idx[:, None] * t + torch.arange(t)).reshape(-1)  # (B·T,) rows of the batch's images
            yield [r[tok] for r in rows]

    steps = -(-images.shape[0] // cfg.batch_images)
    return fit_crosscoder(batches, steps, cfg, device=device)


def _predictions(models: Mapping[str, nn.Module], images: torch.Tensor, labels: np.ndarray, bs: int, device):
    with torch.no_grad():
        return np.stack([np.concatenate([m(images[i:i + bs].to(device)).argmax(-1).cpu().numpy()
                                         for i in range(0, len(images), bs)]) == labels for m in models.values()])


def _shown(diff: xr.Dataset, ranked: np.ndarray, n: int) -> np.ndarray:
    """``n`` latents to show: the ranked teacher-only ones, then the live latents of lowest relative norm."""
    live = np.flatnonzero(~diff["dead"].values)
    rest = [j for j in live[np.argsort(diff["relative_norm"].values[live], kind="stable")] if j not in set(ranked)]
    return np.asarray([*ranked[:n], *rest][:n], dtype=np.int64)


def study_pair(models: Mapping[str, nn.Module], hooks: Mapping[str, str], train: torch.Tensor, held: torch.Tensor,
               labels: np.ndarray, samples: np.ndarray, display: np.ndarray, cfg: CrosscoderConfig,
               opt: StudyOptions = StudyOptions(), device: torch.device | str = "cpu",
               correct: np.ndarray | None = None, cc: Crosscoder | None = None) -> xr.Dataset:
    """Everything the gallery shows of one pair (module docstring), as one Dataset.

    Args:
        models: ``{"teacher": ..., "student": ...}`` in eval mode on ``device``; ``hooks``: the pair read.
        train, held: ``(N, C, H, W)`` training and held-out images, normalised for the models.
        labels, samples: ``(N_held,)`` true class and dataset index of each held-out image.
        display: ``(N_held, H, W[, 3])`` the held-out images in [0, 1] (for the crops).
        correct: ``(2, N_held)`` per-image correctness of the teacher and the student when already known (e.g.
            what ``compare`` stores); None: computed here.
        cc: a crosscoder already trained on ``train`` with ``cfg`` (e.g. by :func:`cached_crosscoder`); None:
            trained here.
    """
    cc = cached_crosscoder(models, hooks, train, cfg, device) if cc is None else cc
    rows = [paired_tokens(models, hooks, x, device) for _, x in
            image_batches(held, opt.batch_size, seed=0, shuffle=False)]  # per batch, per model (B·T, d_m)
    diff = crosscoder_diff(cc, rows, list(models), opt.thresholds)
    first = next(iter(models))
    layout = token_layout(hook_shape(models[first], hooks[first], held[:1], device),
                          hooks[first], tuple(held.shape[-2:]), models[first])
    act = activations_from_rows(cc, rows, held.shape[0], labels, samples, layout, top=opt.crops)
    del rows
    if correct is None:
        correct = _predictions(models, held, labels, opt.batch_size, device)  # (models, N_held)
    classes, dead = diff["latent_class"].values, diff["dead"].values
    teacher_only = np.flatnonzero((classes == "teacher_only") & ~dead)
    mass = act["image_mean"].values.sum(0)
    cand = teacher_only[np.argsort(-mass[teacher_only], kind="stable")][:opt.candidates]
    fill = _shown(diff, np.array([], np.int64), opt.show)
    measured = np.asarray(list(dict.fromkeys([*cand.tolist(), *fill.tolist()])), dtype=np.int64)
    sub = slice(None, None, opt.effect_every)  # the effects' images
    common = dict(batch_size=opt.batch_size, device=device)
    eff_t = latent_effects(cc, models, hooks, held[sub], labels[sub], measured, samples[sub], measure=[first], **common)
    drop = -eff_t["effect_mean"].sel(model=first).values  # (measured,), nats
    ranked = rank_teacher_only(classes, dead, drop, measured)
    ranked_drop = np.array([drop[list(measured).index(j)] for j in ranked])
    test = lost_features(act["image_mean"].values, labels, correct[0], correct[1], ranked, ranked_drop, opt.lost)
    shown = _shown(diff, ranked, opt.show)
    eff_s = latent_effects(cc, models, hooks, held[sub], labels[sub], shown, samples[sub],
                           measure=[m for m in models if m != first], **common)
    effect = np.stack([eff_t["effect_mean"].sel(latent=shown).values[0], eff_s["effect_mean"].values[1]])
    return _study_dataset(diff, act, effect, eff_t["fires"].sel(latent=shown).mean("sample").values, correct, shown,
                          ranked, ranked_drop, test, display, opt, hooks, cfg)


def _study_dataset(diff, act, effect, fires, correct, shown, ranked, ranked_drop, test, display, opt, hooks, cfg) -> xr.Dataset:
    sel = act.sel(latent=shown)  # (shown, rank) top tokens of the shown latents
    crops = patch_crops(display, sel["top_position"].values, sel["top_y"].values, sel["top_x"].values,
                        act.attrs["grid"], opt.context)  # (shown, rank, crop_y, crop_x[, rgb])
    crop_dims = ("shown", "rank", "crop_y", "crop_x") + (("rgb",) if crops.ndim == 5 else ())
    pad = opt.candidates - len(ranked)
    ds = diff.drop_vars("latent_class").assign(
        latent_class_name=("latent", diff["latent_class"].values.astype(str)),
        correct=(("model", "sample"), correct), sample_label=("sample", np.asarray(act["sample_label"].values)),
        shown_latent=("shown", shown), crop=(crop_dims, crops),
        crop_sample=(("shown", "rank"), sel["top_sample"].values),
        crop_activation=(("shown", "rank"), sel["top_activation"].values),
        crop_kind=(("shown", "rank"), sel["top_kind"].values.astype(str)),
        shown_class_mean=(("shown", "label"), sel["class_mean"].values),
        shown_effect=(("model", "shown"), effect), shown_fires=("shown", fires),
        ranked_latent=("ranked", np.concatenate([ranked, -np.ones(max(pad, 0), np.int64)])[:opt.candidates]),
        ranked_drop=("ranked", np.concatenate([ranked_drop, np.full(max(pad, 0), np.nan)])[:opt.candidates]),
        lost_delta=test.delta, lost_low=test.low, lost_high=test.high, lost_excess=test.excess,
        lost_n_lost=test.n_lost, lost_n_kept=test.n_kept, lost_status=test.status, lost_reason=test.reason,
        lost_statistic=test.statistic, lost_latents=json.dumps(list(test.latents)),
    ).assign_coords(label=act["label"].values, sample=act["sample"].values)
    ds["shown_effect"].attrs.update(units="nats", long_name="mean Δ log p(correct) with the latent removed")
    ds["crop"].attrs.update(units="intensity in [0, 1]", long_name="pixels under the token (± context cells)")
    return ds.assign_attrs(hooks=json.dumps(dict(hooks)), crosscoder=json.dumps(config_dict(cfg)),
                           study=json.dumps(asdict(opt), default=str), lost_method=test.method)
