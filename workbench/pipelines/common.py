"""What every method's pipeline needs: the teacher, the data, the run record, counts.

Public helpers for the modules of this package (and for a new method's own module), so that a
method's pipeline is its run body plus its registry entry. A run body opens with :func:`opening` (CPU threads,
the teacher on the request's device, its training and held-out sets) and records its run with :func:`student_run`.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, Subset

from workbench.data import DemoDataset
from workbench.data import datasets as source_datasets
from workbench.models import create_model, load_model, load_weights, read_state_dict
from workbench.runs import Run, ensure_run, open_run
from workbench.runtime import TrainConfig, cpu_threads, evaluate, resolve_device

if TYPE_CHECKING:
    from workbench.pipelines import RunRequest
    from workbench.profiles import Profile

__all__ = ["RUNTIME_ONLY", "TeacherRef", "IndexedSubset", "limited", "datasets", "eval_transform", "load_teacher",
           "Opening", "opening", "teacher_record", "train_record", "method_data", "phase_logger", "accuracy",
           "model_counts", "stored_weights", "student_run", "run_config", "run_tag", "teacher_val_acc"]

#: TrainConfig fields that do not define a run's result (left out of its config, so changing them reuses the run).
RUNTIME_ONLY = ("device", "progress", "cpu_threads", "num_workers")


@dataclass(frozen=True)
class TeacherRef:
    """A method's teacher, identified without loading it: a complete teacher run, or a timm name + weights file
    (:func:`workbench.pipelines.teacher.resolve_teacher` makes one)."""

    ref: str  # run id, timm name or hf:DIR as given
    tag: str  # short name for the student's run ids: the run id without "teacher-" ("vit-demo"), or the timm name
    model_name: str  # timm architecture
    model_kwargs: dict = field(default_factory=dict)  # timm.create_model kwargs of the architecture
    checkpoint: str | None = None  # weights file (None for a run: its own checkpoint)
    sha256: str | None = None  # hash of the teacher weights
    run: str | None = None  # teacher run id, if any
    data: str | None = None  # the data the teacher run was trained / evaluated on (None: a timm name + weights)


def load_teacher(t: "TeacherRef", device: str | torch.device = "cpu", *, frozen: bool = True) -> nn.Module:
    """The teacher in eval mode (a run's model, or a timm name with its weights); ``frozen``: no parameter
    requires grad (a distillation target). ``frozen=False`` for a copy that becomes the student."""
    if t.run is not None:
        model = load_model(t.run, device=device).model
    elif t.ref.startswith("hf:"):  # a Hugging Face folder (workbench.hf), converted as it loads
        model = load_model(t.ref, device=device).model
    else:
        model = create_model(t.model_name, **t.model_kwargs)
        load_weights(model, read_state_dict(t.checkpoint), what=f"teacher checkpoint {t.checkpoint!r}")
        model = model.to(device)
    if frozen and t.run is not None and open_run(t.run).config.get("memory_format") == "channels_last":
        model = model.to(memory_format=torch.channels_last)  # as it was trained: faster convolutions, same function
    for p in model.parameters():
        p.requires_grad_(not frozen)
    return model.eval()


def teacher_record(t: "TeacherRef") -> dict:
    """The teacher as recorded in a student run's config (what defines the result)."""
    return {"ref": t.ref, "run": t.run, "model_name": t.model_name, "model_kwargs": t.model_kwargs,
            "checkpoint_sha256": t.sha256}


def train_record(cfg: TrainConfig) -> dict:
    """A training config as recorded in a run's config (without the fields that do not change the result)."""
    return {k: v for k, v in asdict(cfg).items() if k not in RUNTIME_ONLY}


class IndexedSubset(Subset):
    """A ``Subset`` that keeps the parent's batch ``collate_fn`` (the demo set's augmentation)."""

    @property
    def collate_fn(self):
        return getattr(self.dataset, "collate_fn", None)


def limited(train_set: Dataset, limit: int | None) -> Dataset:
    """At most ``limit`` training images: the demo split's class-balanced head, else a fixed random subset."""
    if limit is None or len(train_set) <= limit:
        return train_set
    if isinstance(train_set, DemoDataset):
        return DemoDataset("train", train_transform=train_set.train_transform, limit=limit,
                           input_size=tuple(train_set.images.shape[1:]))
    idx = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(0))[:limit].sort().values.tolist()
    return IndexedSubset(train_set, idx)


def datasets(profile: "str | Profile", data: str | None = None, input_size=(1, 28, 28), mean=None, std=None, *,
             images: int | None = None, **kwargs) -> tuple[Dataset, Dataset]:
    """:func:`workbench.data.datasets` (same arguments) with a training set of at most ``images`` images (a request's
    ``--images``, :attr:`~workbench.pipelines.RunRequest.images`; the demo split's class-balanced head, else a fixed
    subset: :func:`limited`). Every pipeline that trains loads its data through this (or :func:`method_data`)."""
    train_set, val_set = source_datasets(profile, data, input_size, mean, std, **kwargs)
    return limited(train_set, images), val_set


def eval_transform(pretrained_cfg: dict | None) -> dict:
    """The held-out transform options of a model (its ``crop_pct`` and ``interpolation``) for :func:`datasets`: every
    pipeline evaluates a model on the same pixels as its teacher run did (timm's defaults, 0.875 bilinear, would crop
    a Swin-T's images differently from its own 0.9 bicubic and change the teacher's accuracy from one report to the next)."""
    pc = pretrained_cfg or {}
    return {k: pc[k] for k in ("crop_pct", "interpolation") if pc.get(k) is not None}


def method_data(req: "RunRequest", model: nn.Module) -> tuple[Dataset, Dataset]:
    """Training (at most the request's ``--images``) and held-out sets of the request's profile and data, sized and
    normalised for ``model`` (its teacher run's held-out pixels: :func:`eval_transform`)."""
    pc = getattr(model, "pretrained_cfg", {}) or {}
    return datasets(req.profile, req.data, tuple(pc.get("input_size", (1, 28, 28))), pc.get("mean"), pc.get("std"),
                    images=req.images, eval_transform=eval_transform(pc))


@dataclass(frozen=True)
class Opening:
    """What a run body starts from (:func:`opening`)."""

    teacher: nn.Module | None  # the request's teacher on ``device`` (None when the body passed its own model)
    train_set: Dataset  # the request's training set (at most its --images), sized for the teacher (or that model)
    val_set: Dataset  # the held-out set, on the teacher run's pixels
    device: torch.device  # the request's device, resolved once by run_method


@contextlib.contextmanager
def opening(req: "RunRequest", threads: int | None, *, frozen: bool = True,
            model: nn.Module | None = None) -> Iterator[Opening]:
    """The common opening of a run body: within the block torch uses ``threads`` CPU threads (on a CPU device; the
    budget's ``cpu_threads``), and the body gets the teacher loaded on the request's device (``frozen``: see
    :func:`load_teacher`) with the request's data sized for it (:func:`method_data`). Given ``model`` (a body that
    starts from another run's model), the data is sized for it and no teacher is loaded."""
    with cpu_threads(threads, req.device):
        teacher = load_teacher(req.teacher, req.device, frozen=frozen) if model is None else None
        train_set, val_set = method_data(req, teacher if model is None else model)
        yield Opening(teacher, train_set, val_set, req.device)


def phase_logger(run: Run, phase: str, offset: int) -> Callable[[int, dict], None]:
    """``fit``'s ``on_epoch_end`` writing the run's metrics with a phase label and a run-global epoch index."""
    def log(epoch: int, metrics: dict) -> None:
        run.log_epoch(offset + epoch, {"phase": phase, "phase_epoch": epoch,
                                       **{k: v for k, v in metrics.items() if k != "epoch"}})

    return log


def accuracy(model: nn.Module, val_set: Dataset, device: torch.device | str = "auto") -> float:
    """Held-out top-1 accuracy of ``model`` (eval mode) on ``device`` (a request's resolved torch.device, used as it
    is; ``auto`` / ``cpu`` / ``cuda`` resolved here)."""
    return evaluate(model.eval(), DataLoader(val_set, batch_size=256), resolve_device(device))["val_acc"]


#: buffer names that hold statistics, not weights (BatchNorm's running estimates)
_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


def stored_weights(model: nn.Module) -> int:
    """The weights a model stores, wherever they live: parameters plus *weight buffers*.

    A deploy form may keep its (sliced, folded) weights in buffers that ``parameters()`` misses (SlimSwin's
    pruned attention: ``qkv_weight_*``, ``proj_weight_*``, ``attn_bias_*``). Weight buffers are the persistent
    floating-point ones; left out are integer / bool buffers (masks, indices: ``active``, ``pair_id``,
    ``relative_position_index``), non-persistent buffers (caches recomputed from the weights, e.g. timm's
    ``attn_mask``, SlimSwin's ``pair_bias``) and BatchNorm's running statistics. A tensor shared by two
    modules is counted once.
    """
    seen: set[tuple[int, int]] = set()
    total = 0
    tensors = [p for p in model.parameters()]
    for mod in model.modules():
        for name, b in mod.named_buffers(recurse=False):
            if (b is not None and b.is_floating_point() and name not in mod._non_persistent_buffers_set
                    and name not in _STATISTICS):
                tensors.append(b)
    for t in tensors:
        key = (t.data_ptr(), t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel()
    return total


def model_counts(model: nn.Module, input_size: tuple[int, int, int] | None = None) -> dict[str, int]:
    """Stored weights (:func:`stored_weights`; ``params``) and MACs per image executed by the model as given
    (:func:`methods.flops.count_macs`, every kernel that runs, sparse ones by their kept entries), on a CPU copy."""
    from methods.flops import count_macs

    input_size = input_size or tuple((getattr(model, "pretrained_cfg", {}) or {}).get("input_size", (1, 28, 28)))
    cpu = copy.deepcopy(model).float().cpu().eval()
    return {"params": stored_weights(cpu), "macs": count_macs(cpu, torch.zeros(1, *input_size)).total}


def run_tag(req: "RunRequest") -> str:
    """The teacher part of a student's run id: ``vit-demo`` for ``teacher-vit-demo``, else ``<timm name>-<profile>``."""
    tag = req.teacher.tag if req.teacher is not None else "none"
    return tag if tag.endswith(f"-{req.profile.name}") else f"{tag}-{req.profile.name}"


def teacher_val_acc(req: "RunRequest") -> float | None:
    """The held-out accuracy its run recorded for the request's teacher (None for a timm name + checkpoint)."""
    t = req.teacher
    return open_run(t.run).manifest.get("results", {}).get("val_acc") if t is not None and t.run else None


def run_config(req: "RunRequest", config: dict) -> dict:
    """A student run's full config: the request's method, profile, data and teacher, then ``config``."""
    return {"method": req.method, "profile": req.profile.name, "data": req.data or "demo",
            **({"teacher": teacher_record(req.teacher)} if req.teacher is not None else {}), **config}


def student_run(req: "RunRequest", run_id: str, config: dict, body: Callable[[Run], dict]) -> Run:
    """``ensure_run`` of ``run_id`` with the request's id suffix (its data and overrides:
    :meth:`~workbench.pipelines.RunRequest.run_id`), its teacher, profile and data recorded in ``config``
    (:func:`run_config`), and its force and log."""
    return ensure_run(req.run_id(run_id), run_config(req, config), body, force=req.force, log=req.log)
