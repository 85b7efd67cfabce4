"""Train a teacher: the demo teachers on the demo set, or any timm model on an ImageFolder."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from torch.utils.data import Dataset

from methods.teachers import DEMO_TEACHERS
from methods.train import TrainConfig, fit
from workbench.data import DemoDataset, image_folder
from workbench.models import create_model
from workbench.profiles import get_profile
from workbench.runs import Run, RunError, ensure_run, open_run, runs_root, sha256_file


def datasets(profile: str, data: str | None = None, input_size=(1, 28, 28), mean=None, std=None) -> tuple[Dataset, Dataset]:
    """Training and held-out sets of a profile: the demo split, or ``DATA/train`` and ``DATA/val``."""
    prof = get_profile(profile)
    if data is None:
        if profile == "paper":
            raise ValueError("the paper profile trains on your data: pass --data PATH (an ImageFolder with train/ and val/)")
        size = tuple(input_size)  # digits padded to the model's input size (DemoDataset)
        return (DemoDataset("train", train_transform=True, limit=prof.train_limit, input_size=size),
                DemoDataset("val", limit=prof.val_limit, input_size=size))
    root = Path(data).expanduser()
    kw = dict(input_size=input_size, mean=mean, std=std)
    return image_folder(root / "train", is_training=True, **kw), image_folder(root / "val", is_training=False, **kw)


def teacher_run_id(arch: str, profile: str) -> str:
    return f"teacher-{arch}-{profile}"


def train_teacher(
    arch: str,
    profile: str = "demo",
    *,
    force: bool = False,
    device: str = "auto",
    data: str | None = None,
    model_name: str | None = None,
    epochs: int | None = None,
    log=print,
) -> Run:
    """Train (or reuse, or resume) a teacher run.

    Args:
        arch: ``vit``, ``swin`` or ``cnn`` (the demo teachers; with ``model_name`` only the recipe).
        profile: ``demo``, ``smoke`` or ``paper``.
        force: retrain even if a complete run exists.
        device: ``auto``, ``cpu`` or ``cuda``.
        data: an ImageFolder root with ``train/`` and ``val/`` (required by ``paper``).
        model_name: a timm architecture instead of the demo teacher of ``arch``.
        epochs: override the profile's epoch count.
    """
    if arch not in DEMO_TEACHERS:
        raise ValueError(f"unknown teacher arch {arch!r}; choose from {', '.join(DEMO_TEACHERS)}")
    name = model_name or DEMO_TEACHERS[arch]
    cfg: TrainConfig = replace(get_profile(profile).teacher(arch), device=device)
    if epochs is not None:
        cfg = replace(cfg, epochs=epochs)
    model_kwargs = {} if data is None else {"num_classes": len(_classes(data))}
    config = {"method": "teacher", "model_name": name, "model_kwargs": model_kwargs, "profile": profile,
              "data": data or "demo", "train": {k: v for k, v in cfg.to_dict().items() if k not in ("device", "progress", "cpu_threads")}}

    def body(run: Run) -> dict:
        import torch

        torch.manual_seed(cfg.seed)  # the initialisation: the same whatever ran before in this process
        model = create_model(name, **model_kwargs)
        pc = model.pretrained_cfg
        train_set, val_set = datasets(profile, data, tuple(pc["input_size"]), pc.get("mean"), pc.get("std"))
        history = fit(model, train_set, val_set, cfg, ckpt_dir=run.dir, on_epoch_end=run.log_epoch)
        final = history[-1]
        return {"val_acc": final["val_acc"], "val_loss": final["val_loss"], "epochs": len(history),
                "train_images": len(train_set), "val_images": len(val_set)}

    return ensure_run(teacher_run_id(arch, profile), config, body, force=force, log=log)


def _classes(data: str) -> list[str]:
    root = Path(data).expanduser() / "train"
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


@dataclass(frozen=True)
class TeacherRef:
    """A method's teacher, identified without loading it: a complete teacher run, or a timm name + weights file."""

    ref: str  # run id or timm name as given
    tag: str  # short name for the student's run ids: the run id without "teacher-" ("vit-demo"), or the timm name
    model_name: str  # timm architecture
    model_kwargs: dict = field(default_factory=dict)  # timm.create_model kwargs of the architecture
    checkpoint: str | None = None  # weights file (None for a run: its own checkpoint)
    sha256: str | None = None  # hash of the teacher weights
    run: str | None = None  # teacher run id, if any


def resolve_teacher(teacher: str | Run | None, profile: str, *, default_arch: str, family: str,
                    checkpoint: str | None = None, device: str = "auto", data: str | None = None,
                    log: Callable[[str], None] = print) -> TeacherRef:
    """Identify a method's teacher; a demo arch is trained (or reused) first.

    Args:
        teacher: a teacher run (id, directory or Run), a demo arch (``vit``, ``swin``, ``cnn``), None for
            ``default_arch``, or a timm name (then ``checkpoint`` is required).
        default_arch: the demo arch the method uses when ``teacher`` is None.
        family: what the method needs ("ViT", "Swin"), for the messages.
        checkpoint: weights file of a timm-name teacher.

    Raises:
        ValueError: a demo arch under the paper profile, a checkpoint beside a run, an unknown name, a timm
            name without weights, a missing weights file.
        RunError: an incomplete teacher run.
    """
    teacher = default_arch if teacher is None else str(teacher.dir) if isinstance(teacher, Run) else teacher
    if teacher in DEMO_TEACHERS:
        if profile == "paper":
            raise ValueError(f"the paper profile needs a real {family} teacher: pass --teacher a teacher run id, "
                             f"or a timm {family} name with --checkpoint WEIGHTS")
        teacher = train_teacher(teacher, profile, device=device, data=data, log=log).id
    if (runs_root() / teacher / "manifest.json").exists() or (Path(teacher).expanduser() / "manifest.json").exists():
        if checkpoint is not None:
            raise ValueError(f"teacher {teacher!r} is a run with its own checkpoint; drop --checkpoint")
        run = open_run(teacher)
        if run.status != "complete":
            raise RunError(f"teacher run {run.id!r} is not complete (status {run.status!r}); finish it first")
        return TeacherRef(run.id, run.id.removeprefix("teacher-"), run.config["model_name"],
                          dict(run.config.get("model_kwargs", {})), None, run.manifest.get("checkpoint_sha256"), run.id)
    create_model(teacher)  # validates the name: a clear error for an unknown architecture
    if checkpoint is None:
        raise ValueError(f"teacher {teacher!r} is not a run; pass a teacher run id (e.g. teacher-{default_arch}-demo), "
                         f"a demo arch ({default_arch}), or a timm {family} name with --checkpoint WEIGHTS "
                         "(compressing random weights measures nothing)")
    path = Path(checkpoint).expanduser()
    if not path.is_file():
        raise ValueError(f"teacher checkpoint {str(path)!r} does not exist")
    return TeacherRef(teacher, teacher, teacher, {}, str(path), sha256_file(path))
