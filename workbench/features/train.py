"""Training a crosscoder on paired activations streamed from the images: seeded, resumable, on the GPU when present.

One step = one batch of ``batch_images`` images: both models run on it (up to the paired hook points only), and all
its tokens form one BatchTopK batch. Loss = Σ_m mean squared error of model ``m`` in its scaled units (each model's
token variance is 1 there, so a model's term is its share of unexplained variance) + ``norm_coef`` × the decoder-norm
penalty (:mod:`~workbench.features.crosscoder`) + ``aux_coef`` × AuxK.

Resuming: with ``checkpoint=PATH``, the crosscoder, Adam's moments, the step and each latent's tokens-since-firing are
written there every ``checkpoint_every`` steps (safetensors, atomically); a call with the same path and config
continues from the last one, skipping the image batches already seen (the image order is a function of the seed and
epoch), so an interrupted training ends where an uninterrupted one does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Iterator, Mapping

import torch
import torch.nn as nn

from workbench.features.crosscoder import Crosscoder, CrosscoderConfig, config_dict, load_crosscoder, save_crosscoder
from workbench.features.pairs import ImageSource, image_batches, paired_tokens
from workbench.runtime import resolve_device

__all__ = ["train_crosscoder", "fit_crosscoder", "crosscoder_loss", "BatchFn"]

DEFAULT = CrosscoderConfig()  # the default options


def crosscoder_loss(cc: Crosscoder, xs: list[torch.Tensor], since_fired: torch.Tensor, cfg: CrosscoderConfig
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, codes)`` of one batch; updates ``since_fired`` (tokens since each latent last fired) in place."""
    recon, codes, pre = cc(xs)
    errs = [(x - r) * cc.scale[m] for m, (x, r) in enumerate(zip(xs, recon))]  # per model (N, d_m), scaled units
    loss = sum(e.pow(2).sum(1).mean() for e in errs)
    if cfg.norm_coef > 0:
        loss = loss + cfg.norm_coef * (codes * cc.penalised_norms()).sum(1).mean()
    with torch.no_grad():
        since_fired += codes.shape[0]
        since_fired[(codes > 0).any(0)] = 0
    dead = since_fired >= cfg.dead_after
    if cfg.aux_coef > 0 and dead.any():
        # AuxK (Gao et al. 2024): the dead latents' top pre-activations reconstruct the remaining error
        n = min(cfg.aux_k, int(dead.sum()))
        masked = torch.where(dead, pre * cc.decoder_norms().sum(0), torch.zeros_like(pre))
        top = torch.topk(masked, n, dim=1)  # (N, n)
        aux = torch.zeros_like(pre).scatter(1, top.indices, pre.gather(1, top.indices))
        aux_err = sum((aux @ w - e.detach()).pow(2).sum(1).mean() / e.detach().pow(2).sum(1).mean().clamp_min(1e-12)
                      for w, e in zip(cc.W_dec, errs))
        loss = loss + cfg.aux_coef * aux_err
    return loss, codes


def _opt_tensors(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    return {f"opt.{i}.{k}": v for i, st in opt.state_dict()["state"].items() for k, v in st.items()}


def _load_opt(opt: torch.optim.Optimizer, extra: dict[str, torch.Tensor]) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, v in extra.items():
        if key.startswith("opt."):
            _, i, name = key.split(".", 2)
            state.setdefault(int(i), {})[name] = v
    sd = opt.state_dict()
    opt.load_state_dict({"state": state, "param_groups": sd["param_groups"]})


def _resume(path: Path | None, cfg: CrosscoderConfig, device: torch.device):
    if path is None or not path.exists():
        return None
    cc, extra, meta = load_crosscoder(path, device)
    if meta.get("config") != json.dumps(config_dict(cfg), sort_keys=True):
        raise ValueError(f"the checkpoint {path} was trained with another config ({meta.get('config')}); "
                         "pass the same CrosscoderConfig to resume, or another checkpoint path to start afresh")
    return cc, extra, meta


#: (epoch, first batch index) -> that epoch's batches from there on, each a per-model list of (N, d_m) rows
BatchFn = Callable[[int, int], Iterator[list[torch.Tensor]]]


def train_crosscoder(models: Mapping[str, nn.Module], hooks: Mapping[str, str], images: ImageSource,
                     cfg: CrosscoderConfig = DEFAULT, *, checkpoint: str | Path | None = None,
                     device: str | torch.device = "auto", progress: bool = False) -> Crosscoder:
    """Train (or resume, or reuse when complete) a crosscoder over ``models``' activations at ``hooks`` on ``images``.

    Args:
        models: label -> model (the teacher first), in eval mode; moved to ``device``.
        hooks: label -> the hook point read in that model (:func:`~workbench.features.pairs.paired_hooks`).
        images: the training images (:data:`~workbench.features.pairs.ImageSource`).
        cfg: dictionary and training options.
        checkpoint: a safetensors path to write to and resume from (module docstring); None: no checkpoint.
        device: ``auto`` / ``cpu`` / ``cuda``.
        progress: show a progress bar of the steps (:func:`workbench.progress.progress_bar`).

    Returns:
        The crosscoder in eval mode on ``device``.
    """
    dev = resolve_device(device)
    models = {k: m.to(dev).eval() for k, m in models.items()}

    def batches(epoch: int, start: int) -> Iterator[list[torch.Tensor]]:
        for _, imgs in image_batches(images, cfg.batch_images, seed=cfg.seed, epoch=epoch, start=start):
            yield paired_tokens(models, hooks, imgs, dev)

    return fit_crosscoder(batches, math.ceil(len(images) / cfg.batch_images), cfg, checkpoint=checkpoint,
                          device=dev, metadata={"hooks": json.dumps(dict(hooks))}, progress=progress)


def fit_crosscoder(batches: BatchFn, steps_per_epoch: int, cfg: CrosscoderConfig = DEFAULT, *,
                   checkpoint: str | Path | None = None, device: str | torch.device = "auto",
                   metadata: Mapping[str, str] | None = None, progress: bool = False) -> Crosscoder:
    """Train on any stream of paired rows (:data:`BatchFn`, ``steps_per_epoch`` batches an epoch); see
    :func:`train_crosscoder`. The first batch of epoch 0 sets the input factors (:meth:`Crosscoder.fit_scale`)."""
    dev = resolve_device(device)
    path = None if checkpoint is None else Path(checkpoint)
    total = cfg.epochs * steps_per_epoch
    resumed = _resume(path, cfg, dev)
    if resumed is None:
        first = [x.to(dev) for x in next(batches(0, 0))]
        cc = Crosscoder(tuple(x.shape[1] for x in first), cfg.width, cfg.k, init_norm=cfg.init_norm,
                        threshold_momentum=cfg.threshold_momentum,
                        generator=torch.Generator().manual_seed(cfg.seed), shared=cfg.shared).to(dev)
        cc.fit_scale(first)
        step, since_fired, extra = 0, torch.zeros(cfg.width, dtype=torch.long, device=dev), {}
    else:
        cc, extra, meta = resumed
        step, since_fired = int(meta["step"]), extra["since_fired"].to(dev)
    opt = torch.optim.Adam(cc.parameters(), lr=cfg.lr)
    if extra:
        _load_opt(opt, extra)
    cc.train()
    meta = {"config": json.dumps(config_dict(cfg), sort_keys=True), **(metadata or {})}
    with _bar(progress, total, step) as bar:
        step = _steps(cc, opt, batches, steps_per_epoch, total, step, since_fired, cfg, path, meta, bar)
    return cc.eval()


def _bar(on: bool, total: int, done: int):
    from contextlib import nullcontext

    from workbench.progress import progress_bar

    if not on:
        return nullcontext(None)
    bar = progress_bar(total, "crosscoder")
    bar.update(done)
    return bar


def _steps(cc, opt, batches: BatchFn, steps_per_epoch: int, total: int, step: int, since_fired, cfg, path, meta,
           bar) -> int:
    """The training loop of :func:`fit_crosscoder` from ``step`` to ``total``; returns ``total``."""
    dev = cc.b_enc.device
    while step < total:
        before = step
        for xs in batches(step // steps_per_epoch, step % steps_per_epoch):
            loss, _ = crosscoder_loss(cc, [x.to(dev) for x in xs], since_fired, cfg)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            cc.tie_grads()
            opt.step()
            step += 1
            if bar is not None:
                bar.update(1)
            if path is not None and (step % cfg.checkpoint_every == 0 or step == total):
                save_crosscoder(cc, path, {**_opt_tensors(opt), "since_fired": since_fired},
                                {**meta, "step": str(step)})
            if step % steps_per_epoch == 0:
                break
        if step == before:
            raise ValueError(f"the batches ran out at step {step} of {total} ({steps_per_epoch} per epoch): "
                             "pass the number of batches the stream yields per epoch")
    return step
