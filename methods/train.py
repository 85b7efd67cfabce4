"""The training loop shared by the demo teachers and all five methods.

One loop, composed from small parts instead of subclassed:

- the optimizer and the learning-rate schedule come from timm's factories
  (``create_optimizer_v2``, ``create_scheduler_v2``; the schedule is stepped per update);
- ``loss_fn(model, images, targets) -> (loss, parts)`` carries any distillation objective
  (default: cross-entropy); ``parts`` are logged as per-epoch means;
- :class:`TrainHook` objects see the model and the optimizer after every optimizer step and at
  the end of every epoch (re-applying pruning masks, sparse momentum's prune-and-regrow), and put
  their own state (masks, schedules) into the epoch checkpoint, so that a resumed run is exact;
- ``on_epoch_end(epoch, metrics)`` receives the epoch's metrics (a run record writes them);
- ``batch_transform(images, targets) -> (images, targets)`` runs on every training batch on the
  device (e.g. ``timm.data.Mixup`` for mixup / cutmix, with a soft-target ``loss_fn``), and
  ``sampler(dataset, world_size, rank)`` replaces the shuffling (e.g. timm's ``RepeatAugSampler``
  for repeated augmentation); see :func:`mixup_cutmix` and :func:`repeated_augmentation`.

Determinism and resume: every epoch reseeds torch's, NumPy's and Python's generators from
``seed + epoch`` (augmentations draw from all three: timm's Mixup from NumPy, RandAugment from
Python), the persistent DataLoader workers reseed theirs from the same epoch seed, and the shuffle
is seeded the same way (every sampler gets ``set_epoch``), so an interrupted run that resumes from
its last epoch checkpoint ends with the same weights and metrics as an uninterrupted one (on the CPU).

Throughput: one DataLoader serves all epochs (persistent workers: ``num_workers=None`` gives several
per rank on CUDA and none on the CPU, see :func:`workers_for`; pinned memory on CUDA); the loss and
its parts are summed on the device and read by the host every :data:`SYNC_EVERY` steps and at the end
of the epoch (the non-finite check included), not every step. Mixed precision (``amp``): bfloat16
autocast on CUDA; LSTMs run in float16 there (PyTorch's autocast rule for cuDNN RNNs), so a model
with LSTMs trains with a gradient scaler (:func:`grad_scaler`), checkpointed with the epoch.
Checkpoints are written atomically (temporary file + rename): the model as safetensors, the
optimizer and schedule state as a tensors-only ``.pt`` read back with ``weights_only=True``.

Distributed: launched under ``torchrun``, :func:`init_distributed` joins the process group (its backend from the
device asked for: gloo on the CPU, NCCL on CUDA, each rank on ``cuda:LOCAL_RANK``); the model is wrapped in DDP,
each rank reads its shard through a ``DistributedSampler``, metrics are all-reduced, and only rank 0 writes files.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import timm
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from methods.devices import has_rnn
from methods.io import atomic_save_safetensors, atomic_torch_save
from methods.launch import cpu_threads, init_distributed, resolve_device

#: ``(model, images, targets) -> (loss, parts)``; parts are detached 0-dim tensors (summed on the device, read once per
#: epoch: no host sync per step) or floats.
LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, "torch.Tensor | float"]]]
#: ``(images, targets) -> (images, targets)`` applied to every training batch on the device (e.g. mixup).
BatchTransform = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
#: ``(dataset, world_size, rank) -> sampler`` with ``set_epoch(epoch)``; one rank's share of every epoch.
SamplerFactory = Callable[[Dataset, int, int], Sampler]


class TrainHook:
    """A training-loop hook; override what you need (every method is a no-op here).

    ``state_dict`` goes into the epoch checkpoint (``train_state.pt``, read back with
    ``weights_only=True``: tensors, numbers, strings, and lists / dicts of them) and
    ``load_state_dict`` gets it back when a run resumes, before the first step.
    """

    def after_step(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """After every optimizer step (model unwrapped from DDP)."""

    def on_epoch_end(self, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int) -> dict[str, float] | None:
        """After the epoch's last step, before evaluation and the checkpoint; may return metrics to log."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""


class _StepFn(TrainHook):
    """A plain ``fn(model)`` called after every step."""

    def __init__(self, fn: Callable[[nn.Module], None]):
        self.fn = fn

    def after_step(self, model, optimizer) -> None:
        self.fn(model)


Hook = TrainHook | Callable[[nn.Module], None]


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of one training phase (timm names where timm has them)."""

    epochs: int = 10  # number of epochs
    batch_size: int = 128  # global batch size (split over ranks under DDP)
    lr: float = 1e-3  # peak learning rate
    weight_decay: float = 0.05  # AdamW weight decay
    opt: str = "adamw"  # timm optimizer name
    sched: str = "cosine"  # timm scheduler name
    warmup_epochs: int = 1  # linear warm-up epochs
    warmup_lr: float = 1e-5  # learning rate at the start of warm-up
    min_lr: float = 1e-6  # floor of the cosine schedule
    label_smoothing: float = 0.0  # for the default cross-entropy loss
    seed: int = 0  # seeds shuffling and augmentation (the teacher pipeline also seeds the initialisation with it)
    device: str | torch.device = "auto"  # a resolved torch.device (used as it is), or "auto", "cpu", "cuda", "cuda:N"
    # (resolved by fit: resolve_device)
    amp: bool = False  # bfloat16 autocast on CUDA (LSTMs: float16 with a gradient scaler, see grad_scaler)
    eval_every: int = 1  # evaluate on the held-out set every N epochs (and at the last)
    num_workers: int | None = None  # DataLoader workers; None: auto (workers_for: several on CUDA, none on the CPU)
    progress: bool = True  # show a progress bar (rank 0 only)
    cpu_threads: int | None = None  # torch intra-op threads on CPU during fit (None: torch's default)

    def to_dict(self) -> dict:
        return asdict(self)


def cross_entropy(label_smoothing: float = 0.0) -> LossFn:
    def loss_fn(model, images, targets):
        loss = F.cross_entropy(model(images), targets, label_smoothing=label_smoothing)
        return loss, {"ce": loss.detach()}

    return loss_fn


def soft_target_cross_entropy() -> LossFn:
    """Cross-entropy against soft targets ``(B, K)`` (timm's ``SoftTargetCrossEntropy``), for mixup / cutmix."""
    from timm.loss import SoftTargetCrossEntropy

    criterion = SoftTargetCrossEntropy()

    def loss_fn(model, images, targets):
        loss = criterion(model(images), targets)
        return loss, {"ce": loss.detach()}

    return loss_fn


def mixup_cutmix(num_classes: int, mixup: float = 0.8, cutmix: float = 1.0, label_smoothing: float = 0.1,
                 switch_prob: float = 0.5) -> BatchTransform:
    """timm's ``Mixup`` (mixup / cutmix with smoothed soft targets, DeiT's defaults) as a ``batch_transform``.

    Pair it with :func:`soft_target_cross_entropy`. Batches must have an even size (``fit`` drops the last
    incomplete batch when a ``batch_transform`` is given).
    """
    from timm.data import Mixup

    return Mixup(mixup_alpha=mixup, cutmix_alpha=cutmix, switch_prob=switch_prob, mode="batch",
                 label_smoothing=label_smoothing, num_classes=num_classes)


def repeated_augmentation(repeats: int = 3) -> SamplerFactory:
    """timm's ``RepeatAugSampler`` (DeiT's repeated augmentation: each image ``repeats`` times per epoch,
    spread over the ranks, epoch length kept at about one pass) as a ``sampler`` for :func:`fit`."""
    from timm.data.distributed_sampler import RepeatAugSampler

    def make(dataset: Dataset, world: int, rank: int) -> Sampler:
        return RepeatAugSampler(dataset, num_replicas=world, rank=rank, shuffle=True, num_repeats=repeats)

    return make


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------


#: torch optimizers (by timm name) that take ``foreach``.
_FOREACH = ("sgd", "momentum", "nesterov", "adam", "adamw")


def foreach_kw(opt: str) -> dict:
    """``foreach=True`` for torch's own optimizers: the multi-tensor update, which torch picks on CUDA but not on the
    CPU, where it gives the same weights bit for bit as the per-tensor loop in ~30% less optimizer time (measured on
    the demo FAR student; ``tests/test_train_runs.py`` checks the equality)."""
    return {"foreach": True} if opt.lower() in _FOREACH else {}


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def save_checkpoint(ckpt_dir: Path, model: nn.Module, optimizer, epoch: int, num_updates: int, metrics: list[dict],
                    hooks: list[dict] | None = None, scaler: dict | None = None) -> None:
    """Epoch checkpoint: ``model.safetensors`` + ``train_state.pt`` (optimizer, epoch, metrics, hook states, and the
    gradient scaler's state where one is used)."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(
        {"optimizer": optimizer.state_dict(), "epoch": epoch, "num_updates": num_updates, "metrics": metrics,
         "hooks": hooks or [], **({"scaler": scaler} if scaler else {})},
        ckpt_dir / "train_state.pt",
    )
    atomic_save_safetensors(unwrap(model).state_dict(), ckpt_dir / "model.safetensors", {"epoch": str(epoch)})


def load_checkpoint_state(ckpt_dir: Path, model: nn.Module, optimizer,
                          hooks: list[TrainHook] = ()) -> tuple[int, int, list[dict]] | None:
    """Restore model, optimizer and hook states from ``ckpt_dir``; returns ``(next_epoch, num_updates, metrics)``."""
    state_path, model_path = ckpt_dir / "train_state.pt", ckpt_dir / "model.safetensors"
    if not (state_path.exists() and model_path.exists()):
        return None
    state = torch.load(state_path, map_location="cpu", weights_only=True)
    tensors = load_file(str(model_path))
    # The model file is written after the state file: if they disagree, the state is one behind.
    unwrap(model).load_state_dict(tensors)
    optimizer.load_state_dict(state["optimizer"])
    saved = state.get("hooks") or []
    if len(saved) not in (0, len(hooks)):
        raise RuntimeError(f"checkpoint in {ckpt_dir} holds {len(saved)} hook states but {len(hooks)} hooks were given")
    for hook, hook_state in zip(hooks, saved):
        hook.load_state_dict(hook_state)
    return state["epoch"] + 1, state["num_updates"], list(state["metrics"])


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, device: torch.device) -> dict[str, float]:
    """Top-1 accuracy and mean cross-entropy, all-reduced over ranks."""
    model.eval()
    stats = torch.zeros(3, dtype=torch.float64, device=device)  # correct, loss sum, count
    for images, targets in loader:
        images, targets = images.to(device), targets.to(device)
        logits = model(images)
        stats += torch.stack([
            (logits.argmax(-1) == targets).sum().double(),
            F.cross_entropy(logits.float(), targets, reduction="sum").double(),
            torch.tensor(float(len(targets)), dtype=torch.float64, device=device),
        ])
    if dist.is_initialized():
        dist.all_reduce(stats)
    return {"val_acc": (stats[0] / stats[2]).item(), "val_loss": (stats[1] / stats[2]).item()}


#: Steps between reads of the running loss on the host (the non-finite check, the progress bar): no sync every step.
SYNC_EVERY = 50


def workers_for(cfg: TrainConfig, device: torch.device) -> int:
    """DataLoader workers per rank: ``cfg.num_workers``, or for ``None`` none on the CPU (the demo's in-memory sets load
    faster in the process, and CPU runs keep their exact results) and ``min(8, CPUs / local ranks)`` on CUDA (decoding
    and augmenting paper-scale images keeps a GPU busy only from several processes)."""
    if cfg.num_workers is not None:
        return cfg.num_workers
    if device.type != "cuda":
        return 0
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    return max(1, min(8, (os.cpu_count() or 1) // local))


def grad_scaler(cfg: TrainConfig, device: torch.device, model: nn.Module) -> torch.amp.GradScaler | None:
    """A gradient scaler where autocast runs something in float16, else None.

    ``cfg.amp`` autocasts to bfloat16, which needs no scaler, except for recurrent layers: PyTorch's autocast rule for
    cuDNN RNNs (``_cudnn_rnn``) casts them to float16 whatever the autocast dtype, so a model with LSTMs (FAR) trains
    its LSTMs in float16, whose small gradients underflow without loss scaling. (Outside CUDA, or with cuDNN off, the
    LSTM cells follow the autocast dtype.)
    """
    if not (cfg.amp and device.type == "cuda" and torch.backends.cudnn.enabled and has_rnn(model)):
        return None
    return torch.amp.GradScaler("cuda")


class _EpochShuffle(Sampler[int]):
    """The training order without DDP: a permutation seeded by ``seed * 1000 + epoch`` (``set_epoch``).

    The order of ``DataLoader(shuffle=True, generator=torch.Generator().manual_seed(seed * 1000 + epoch))``, which
    draws one number (its workers' base seed) before the permutation; drawing it here too keeps the results of runs
    made when the loader was rebuilt every epoch. As a sampler it lets one loader, and its workers, serve all epochs.
    """

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        gen = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        torch.empty((), dtype=torch.int64).random_(generator=gen)  # the DataLoader's base-seed draw (docstring)
        return iter(torch.randperm(self.n, generator=gen).tolist())


class _EpochSeeded(Dataset):
    """``dataset`` whose worker processes reseed torch, NumPy and Python at their first sample of every epoch.

    Persistent workers keep their generators from epoch to epoch; reseeding each worker from the epoch's seed
    (``set_seed``, shared memory) and its id makes an epoch's augmentations depend on the epoch alone, so a resumed
    run draws what an uninterrupted one drew, as it did when every epoch had fresh workers.
    """

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        self.seed = torch.zeros((), dtype=torch.int64).share_memory_()
        self._seen: int | None = None  # the seed this process last reseeded from

    def set_seed(self, seed: int) -> None:
        self.seed.fill_(seed)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        seed = int(self.seed)
        if seed != self._seen:
            info = torch.utils.data.get_worker_info()
            worker_seed = seed * 1009 + (info.id if info is not None else 0) + 1
            torch.manual_seed(worker_seed)
            np.random.seed(worker_seed % 2**32)
            random.seed(worker_seed)
            self._seen = seed
        return self.dataset[index]


def _restore_scaler(scaler: torch.amp.GradScaler | None, ckpt_dir: Path | None) -> torch.amp.GradScaler | None:
    """``scaler`` with the state of the checkpoint in ``ckpt_dir`` (the loss scale reached before an interruption)."""
    state_path = Path(ckpt_dir) / "train_state.pt" if ckpt_dir is not None else None
    if scaler is not None and state_path is not None and state_path.exists():
        saved = torch.load(state_path, map_location="cpu", weights_only=True).get("scaler")
        if saved:
            scaler.load_state_dict(saved)
    return scaler


class _RunningSums:
    """Per-epoch sums of the loss and its parts, kept where they are (tensors on the device) and read once."""

    def __init__(self, device: torch.device):
        self.sums: dict[str, torch.Tensor | float] = {}
        self.steps = 0
        self.nonfinite = torch.zeros((), dtype=torch.bool, device=device)  # any non-finite loss so far

    def add(self, loss: torch.Tensor, parts: dict) -> None:
        loss = loss.detach()
        self.nonfinite |= ~torch.isfinite(loss)
        for k, v in {"loss": loss, **parts}.items():
            v = v.detach().double() if isinstance(v, torch.Tensor) else float(v)  # float64: as Python's float sums
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.steps += 1

    def check(self, epoch: int) -> None:
        """Raise if any loss so far was not finite (one host sync)."""
        if bool(self.nonfinite):
            raise FloatingPointError(f"the loss was not finite (NaN or inf) in epoch {epoch}; lower the learning rate "
                                     "or check the data for NaNs")

    def means(self) -> dict[str, float]:
        return {k: float(v) / max(1, self.steps) for k, v in self.sums.items()}


class _ConstantLR:
    """What a "constant" schedule without warm-up does: nothing (timm < 1.0.31 has no such scheduler)."""

    def step_update(self, num_updates: int) -> None:
        pass


@dataclass(frozen=True)
class _Loop:
    """The parts of one ``fit`` call that every epoch uses (built once by :func:`_build_loop`)."""

    model: nn.Module  # the bare model (checkpointed, evaluated)
    train_model: nn.Module  # what the loss calls: the model, DDP-wrapped on several ranks
    optimizer: torch.optim.Optimizer  # timm's optimizer over the trainable parameters
    scheduler: object  # timm scheduler (or _ConstantLR), stepped per update
    scaler: torch.amp.GradScaler | None  # float16 gradient scaler (LSTMs under amp), else None
    hooks: list[TrainHook]  # called after every step and at every epoch's end
    loss_fn: LossFn  # (model, images, targets) -> (loss, parts)
    batch_transform: BatchTransform | None  # applied to every training batch on the device
    autocast: torch.autocast  # bfloat16 autocast context (disabled off CUDA or without amp)
    loader: DataLoader  # the one training loader of all epochs
    data: Dataset  # what the loader reads (an _EpochSeeded wrapper with workers)
    train_sampler: Sampler  # the training order, set_epoch'ed every epoch
    val_loader: DataLoader | None  # this rank's share of the held-out set, or None
    workers: int  # DataLoader workers per rank
    device: torch.device  # where batches go
    rank: int  # this process's rank
    world: int  # number of ranks


def fit(
    model: nn.Module,
    train_set: Dataset,
    val_set: Dataset | None,
    cfg: TrainConfig,
    *,
    loss_fn: LossFn | None = None,
    hooks: Iterable[Hook] = (),
    ckpt_dir: Path | None = None,
    on_epoch_end: Callable[[int, dict], None] | None = None,
    params: Iterable[nn.Parameter] | None = None,
    stop_after: int | None = None,
    batch_transform: BatchTransform | None = None,
    sampler: SamplerFactory | None = None,
) -> list[dict]:
    """Train ``model`` in place and return per-epoch metrics.

    Args:
        model: the model to train (moved to the configured device).
        train_set: training dataset yielding ``(image, target)``.
        val_set: held-out dataset for ``val_acc``/``val_loss``, or None.
        cfg: hyperparameters.
        loss_fn: ``(model, images, targets) -> (loss, parts)``; default cross-entropy.
        hooks: :class:`TrainHook` objects (or plain ``fn(model)``, called after every optimizer step);
            their states are checkpointed with the epoch and restored on resume.
        ckpt_dir: where epoch checkpoints go; if it holds one, training resumes after it.
        on_epoch_end: called on rank 0 with ``(epoch, metrics)`` after each epoch's checkpoint.
        params: parameters to optimise (default: those with ``requires_grad``).
        stop_after: stop after this many epochs of this call (to simulate an interruption).
        batch_transform: applied to every training batch on the device, before ``loss_fn`` (e.g.
            :func:`mixup_cutmix`); the last incomplete batch of an epoch is then dropped (a set smaller than one
            batch trains on one even batch of all its samples).
        sampler: builds the training sampler from ``(train_set, world_size, rank)`` instead of a plain
            shuffle (or ``DistributedSampler`` under DDP), e.g. :func:`repeated_augmentation`.

    Raises:
        ValueError: nothing to train, or fewer training images than one batch when batches are dropped.
        FloatingPointError: a non-finite loss (read every :data:`SYNC_EVERY` steps and at the end of the epoch,
            before its checkpoint: the run stops without saving what the non-finite steps did).
    """
    device = resolve_device(cfg.device)
    if device.type == "cpu" and cfg.cpu_threads:
        with cpu_threads(cfg.cpu_threads):
            return fit(model, train_set, val_set, replace(cfg, cpu_threads=None), loss_fn=loss_fn, hooks=hooks,
                       ckpt_dir=ckpt_dir, on_epoch_end=on_epoch_end, params=params, stop_after=stop_after,
                       batch_transform=batch_transform, sampler=sampler)
    loop, (start, num_updates, history) = _build_loop(
        model, train_set, val_set, cfg, device, loss_fn=loss_fn, hooks=hooks, ckpt_dir=ckpt_dir, params=params,
        batch_transform=batch_transform, sampler=sampler)
    for done, epoch in enumerate(range(start, cfg.epochs)):
        if stop_after is not None and done >= stop_after:
            break
        t0 = time.perf_counter()
        _seed_epoch(loop, cfg.seed, epoch)
        bar = _progress(loop.loader, f"epoch {epoch + 1}/{cfg.epochs}", cfg.progress and loop.rank == 0)
        sums, num_updates = _train_epoch(loop, bar, epoch, num_updates)
        metrics = _epoch_metrics(loop, cfg, sums, epoch)
        metrics["epoch_time_s"] = time.perf_counter() - t0
        history.append(metrics)
        if loop.rank == 0 and ckpt_dir is not None:
            save_checkpoint(Path(ckpt_dir), model, loop.optimizer, epoch, num_updates, history,
                            [h.state_dict() for h in loop.hooks],
                            scaler=loop.scaler.state_dict() if loop.scaler is not None else None)
        if loop.rank == 0 and on_epoch_end is not None:
            on_epoch_end(epoch, metrics)
        if loop.world > 1:
            dist.barrier()
    model.eval()
    return history


def _build_loop(model: nn.Module, train_set: Dataset, val_set: Dataset | None, cfg: TrainConfig,
                device: torch.device, *, loss_fn: LossFn | None, hooks: Iterable[Hook], ckpt_dir: Path | None,
                params: Iterable[nn.Parameter] | None, batch_transform: BatchTransform | None,
                sampler: SamplerFactory | None) -> tuple[_Loop, tuple[int, int, list[dict]]]:
    """The loop's parts, and ``(first epoch, updates so far, history)`` (from ``ckpt_dir``'s checkpoint, if any)."""
    from timm.optim import create_optimizer_v2

    rank, world = init_distributed(device)
    hooks = [h if isinstance(h, TrainHook) else _StepFn(h) for h in hooks]
    model.to(device)
    trainable = [p for p in (params if params is not None else model.parameters()) if p.requires_grad]
    if not trainable:
        raise ValueError("nothing to train: no parameter requires grad")
    optimizer = create_optimizer_v2(trainable, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay, **foreach_kw(cfg.opt))
    train_sampler = _train_sampler(train_set, cfg.seed, sampler, world, rank)
    # Mixup needs even batches: the last incomplete one is dropped. Under DDP the samplers already give every rank
    # the same number of samples, so every rank takes the same number of steps with a partial last batch too.
    drop_last = batch_transform is not None
    per_rank, updates_per_epoch = _batches(len(train_sampler), max(1, cfg.batch_size // world), drop_last, rank)
    scheduler = _scheduler(optimizer, cfg, updates_per_epoch)
    resume = (0, 0, [])
    if ckpt_dir is not None:
        resume = load_checkpoint_state(Path(ckpt_dir), model, optimizer, hooks) or resume
    scheduler.step_update(resume[1])
    # static_graph: a loss may use parameters outside the forward or leave some without a gradient (Sparsifiner's losses
    # add a term on the predictor's W_up itself); every training loop here runs the same graph each step, which is
    # what DDP's static-graph mode needs to handle both.
    train_model = nn.parallel.DistributedDataParallel(model, static_graph=True) if world > 1 else model
    pin = device.type == "cuda"  # pinned host memory: asynchronous copies to the GPU
    workers = workers_for(cfg, device)
    val_loader = None
    if val_set is not None:
        # each rank its own share, unpadded (DistributedSampler repeats images to even the shares out, which counts
        # them twice: 9 images on 2 ranks were scored as 10); evaluate all-reduces the sums once, at the end
        val_sampler = list(range(rank, len(val_set), world)) if world > 1 else None
        val_loader = DataLoader(val_set, batch_size=256, sampler=val_sampler, num_workers=workers, pin_memory=pin,
                                persistent_workers=workers > 0)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg.amp and device.type == "cuda")
    scaler = _restore_scaler(grad_scaler(cfg, device, model), ckpt_dir)
    # One loader for all epochs (persistent workers, each epoch reseeded: _EpochSeeded). It draws its workers' base
    # seed from `generator`, torch's global one when None: a given sampler without workers keeps drawing it there every
    # epoch, as the per-epoch loaders of earlier versions did (the same results); otherwise a private generator.
    data = _EpochSeeded(train_set) if workers else train_set
    private = torch.Generator() if workers or isinstance(train_sampler, _EpochShuffle) else None
    loader = DataLoader(data, sampler=train_sampler, batch_size=per_rank, num_workers=workers, drop_last=drop_last,
                        collate_fn=getattr(train_set, "collate_fn", None),  # a dataset may batch its own augmentation
                        pin_memory=pin, persistent_workers=workers > 0, generator=private)
    loop = _Loop(model=model, train_model=train_model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                 hooks=hooks, loss_fn=loss_fn or cross_entropy(cfg.label_smoothing), batch_transform=batch_transform,
                 autocast=autocast, loader=loader, data=data, train_sampler=train_sampler, val_loader=val_loader,
                 workers=workers, device=device, rank=rank, world=world)
    return loop, resume


def _train_sampler(train_set: Dataset, seed: int, sampler: SamplerFactory | None, world: int, rank: int) -> Sampler:
    """The training order: ``sampler``'s, else a ``DistributedSampler`` on several ranks, else a seeded shuffle."""
    if sampler is not None:
        return sampler(train_set, world, rank)
    if world > 1:
        return DistributedSampler(train_set, world, rank, shuffle=True, seed=seed, drop_last=True)
    return _EpochShuffle(len(train_set), seed)  # a plain shuffle, seeded per epoch


def _batches(per_epoch: int, per_rank: int, drop_last: bool, rank: int) -> tuple[int, int]:
    """``(batch size per rank, updates per epoch)`` for ``per_epoch`` samples of this rank.

    Raises:
        ValueError: fewer samples than one batch (two with ``drop_last``, for mixup).
    """
    if drop_last and 0 < per_epoch < per_rank:
        # a set smaller than one batch (a trial on a few images): one batch of all of them (even, for mixup)
        fitted = per_epoch - per_epoch % 2
        if fitted > 0 and rank == 0:
            print(f"note: {per_epoch} training samples per epoch and rank are fewer than a batch of {per_rank}: "
                  f"training on batches of {fitted} (set --batch-size to choose)", flush=True)
        per_rank = max(fitted, 1)
    updates_per_epoch = per_epoch // per_rank if drop_last else math.ceil(per_epoch / per_rank)
    if updates_per_epoch == 0 or (drop_last and per_rank < 2):
        raise ValueError(f"the training set gives {per_epoch} samples per epoch and rank, fewer than one batch of "
                         f"{per_rank}{' (mixup needs 2)' if drop_last else ''}; give more images or lower --batch-size")
    return per_rank, updates_per_epoch


def _scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, updates_per_epoch: int):
    """timm's per-update schedule of ``cfg`` (a no-op one for ``constant`` on a timm that has none)."""
    from timm.scheduler import create_scheduler_v2

    scheduler, _ = create_scheduler_v2(
        optimizer, sched=cfg.sched, num_epochs=cfg.epochs, warmup_epochs=cfg.warmup_epochs,
        warmup_lr=cfg.warmup_lr, min_lr=cfg.min_lr, step_on_epochs=False, updates_per_epoch=max(1, updates_per_epoch),
    )
    if scheduler is None:  # timm < 1.0.31 knows no "constant" and returns None: the optimizer's lr is then constant
        if cfg.sched != "constant" or cfg.warmup_epochs:
            raise ValueError(f"timm {timm.__version__} has no scheduler {cfg.sched!r} (with warm-up "
                             f"{cfg.warmup_epochs}); upgrade timm or choose another schedule")
        scheduler = _ConstantLR()
    return scheduler


def _seed_epoch(loop: _Loop, seed: int, epoch: int) -> None:
    """Reseed every generator augmentations draw from for ``epoch`` (per rank), and the shuffle and the workers."""
    epoch_seed = seed * 1000 + epoch * 7919 + loop.rank  # augmentation randomness per epoch/rank
    torch.manual_seed(epoch_seed)
    np.random.seed(epoch_seed % 2**32)  # timm's Mixup
    random.seed(epoch_seed)  # timm's RandAugment / RandomErasing without DataLoader workers
    loop.train_sampler.set_epoch(epoch)
    if loop.workers:
        loop.data.set_seed(epoch_seed)


def _train_epoch(loop: _Loop, batches: Iterable, epoch: int, num_updates: int) -> tuple[_RunningSums, int]:
    """One epoch of optimizer steps over ``batches``; returns the loss sums (checked finite) and the update count."""
    loop.train_model.train()
    sums = _RunningSums(loop.device)
    for images, targets in batches:
        images, targets = images.to(loop.device, non_blocking=True), targets.to(loop.device, non_blocking=True)
        if loop.batch_transform is not None:
            images, targets = loop.batch_transform(images, targets)
        with loop.autocast:
            loss, parts = loop.loss_fn(loop.train_model, images, targets)
        loop.optimizer.zero_grad(set_to_none=True)
        if loop.scaler is None:
            loss.backward()
            loop.optimizer.step()
        else:  # float16 LSTMs under autocast (grad_scaler); the scaler skips steps whose gradients overflowed
            loop.scaler.scale(loss).backward()
            loop.scaler.step(loop.optimizer)
            loop.scaler.update()
        num_updates += 1
        loop.scheduler.step_update(num_updates)
        for hook in loop.hooks:
            hook.after_step(unwrap(loop.train_model), loop.optimizer)
        sums.add(loss, parts)
        if sums.steps % SYNC_EVERY == 0:  # the host reads the device only every SYNC_EVERY steps
            sums.check(epoch)
            if hasattr(batches, "set_postfix"):
                batches.set_postfix(loss=f"{sums.means()['loss']:.3f}")
    sums.check(epoch)
    return sums, num_updates


def _epoch_metrics(loop: _Loop, cfg: TrainConfig, sums: _RunningSums, epoch: int) -> dict:
    """The epoch's metrics: mean training loss and parts, learning rate, the hooks' and (when due) the held-out set's."""
    metrics = {"epoch": epoch, **{f"train_{k}": v for k, v in sums.means().items()}}
    metrics["lr"] = loop.optimizer.param_groups[0]["lr"]
    for hook in loop.hooks:
        metrics.update(hook.on_epoch_end(unwrap(loop.train_model), loop.optimizer, epoch) or {})
    if loop.val_loader is not None and ((epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs):
        metrics.update(evaluate(loop.model, loop.val_loader, loop.device))  # the bare model: no collective per batch
    return metrics


class _Bar:
    """Iterates ``loader`` itself (one iterator per epoch) and counts its steps on a tqdm bar of ``len(loader)``.

    The bar never iterates the loader: tqdm.auto's bar takes an iterator of what it wraps when it is made, so a
    wrapped loader was iterated twice per epoch: earlier per-epoch loaders then drew their workers' base seed twice from
    the shuffle's generator (another training order), persistent workers prefetch for the unused iterator (their
    augmentations move on), and what was trained depended on whether a bar was shown."""

    def __init__(self, loader, desc: str):
        from tqdm.auto import tqdm

        self.loader = loader
        self.bar = tqdm(total=len(loader), desc=desc, leave=False, dynamic_ncols=True)

    def __iter__(self):
        try:
            for batch in self.loader:
                yield batch
                self.bar.update(1)
        finally:
            self.bar.close()

    def set_postfix(self, **kw) -> None:
        self.bar.set_postfix(**kw)


def _progress(loader, desc: str, enabled: bool):
    if not enabled or os.environ.get("WORKBENCH_PROGRESS", "1") == "0":
        return loader
    return _Bar(loader, desc)
