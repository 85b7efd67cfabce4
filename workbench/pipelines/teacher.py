"""Train a teacher: the demo teachers on the demo set, or the papers' backbones (any timm model) on an ImageFolder.

Under the ``paper`` profile a teacher is the paper's backbone by timm name (``--arch vit`` ->
``deit_small_patch16_224``, ``swin`` -> ``swin_tiny_patch4_window7_224``, ``cnn`` -> ``resnet50``;
``--model deit-t|deit-b|swin-b|NAME`` for others) at its own resolution, trained with the DeiT recipe
(:data:`BUDGETS`): timm's RandAugment and random erasing in the transform, timm's
``Mixup`` (mixup / cutmix, label smoothing) as ``fit``'s batch transform with a soft-target cross-entropy,
timm's ``RepeatAugSampler``, AdamW with the lr scaled by batch / 512, DataLoader workers.

Pretrained weights (``--checkpoint FILE``, or ``hf:DIR``: a Hugging Face folder with its own architecture; nothing is
downloaded) initialise the model; the classifier is
re-initialised when the checkpoint's has another number of classes. With ``--epochs 0`` the checkpoint is
recorded as the teacher run as it is (evaluated on ``val/``, not trained): the usual way to give the
methods an ImageNet teacher. Otherwise the recipe fine-tunes from it for the given epochs.

Registered as the method ``teacher`` (``workbench train teacher --arch ...``); its budgets per profile
(:data:`BUDGETS`: models, training configs and augmentation per arch) live here like every method's. The
measured curves behind the demo recipes are in ``docs/budgets.md``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from torch.utils.data import Dataset

from methods.teachers import DEMO_TEACHERS
from workbench.data import DEMO_CLASSES, scan_image_folder
from workbench.models import create_model, load_weights, read_state_dict
from workbench.pipelines import Method, Option, RunRequest, budget, data_tag, get_method, register_method
from workbench.pipelines.common import RUNTIME_ONLY, TeacherRef, datasets, eval_transform
from workbench.profiles import Profile, get_profile
from workbench.runs import Run, RunError, ensure_run, find_run, list_runs, sha256_file, suffixed_id
from workbench.runtime import (
    TrainConfig,
    fit,
    is_main,
    mixup_cutmix,
    repeated_augmentation,
    resolve_device,
    soft_target_cross_entropy,
)

if TYPE_CHECKING:
    import torch

__all__ = ["Augment", "TeacherBudget", "BUDGETS", "PAPER_BACKBONES", "backbone", "TeacherRef", "datasets",
           "eval_transform", "teacher_run_id", "find_teachers", "train_teacher", "resolve_teacher"]


@dataclass(frozen=True)
class Augment:
    """Training-set augmentation of a teacher recipe, by timm's implementations (all off by default)."""

    auto_augment: str | None = None  # timm RandAugment spec (DeiT: "rand-m9-mstd0.5-inc1"), None = off
    re_prob: float = 0.0  # random erasing probability (timm RandomErasing, per-pixel noise; DeiT: 0.25)
    mixup: float = 0.0  # mixup alpha (timm.data.Mixup; DeiT: 0.8); 0 with cutmix 0 = off
    cutmix: float = 0.0  # cutmix alpha (DeiT: 1.0)
    repeats: int = 0  # repeated augmentation (timm RepeatAugSampler; DeiT: 3), 0 = off
    interpolation: str = "bilinear"  # resize interpolation of the training crops (DeiT: bicubic)

    @property
    def mixes(self) -> bool:
        return self.mixup > 0 or self.cutmix > 0


@dataclass(frozen=True)
class TeacherBudget:
    """How one profile trains its teachers."""

    configs: dict[str, TrainConfig]  # --arch -> training config
    models: dict[str, str] = field(default_factory=lambda: dict(DEMO_TEACHERS))  # --arch -> default timm name
    augment: Augment = Augment()  # training augmentation of ImageFolder teachers (the demo digits have their own jitter)
    lr_per_512: float | None = None  # if set, lr = lr_per_512 * batch / 512 (DeiT's scaling rule)
    channels_last: tuple[str, ...] = ()  # archs trained (and used as frozen teachers) in channels-last memory format

    def config(self, arch: str) -> TrainConfig:
        if arch not in self.configs:
            raise ValueError(f"no teacher {arch!r}; choose from {', '.join(self.configs)}")
        return self.configs[arch]

    def model(self, arch: str) -> str:
        """The default timm name of ``arch`` (demo: the small demo teachers; paper: the papers' backbones)."""
        self.config(arch)
        return self.models[arch]


#: Short names of the papers' backbones for ``--model`` (any other timm name works too).
PAPER_BACKBONES = {
    "deit-t": "deit_tiny_patch16_224", "deit-s": "deit_small_patch16_224", "deit-b": "deit_base_patch16_224",
    "swin-t": "swin_tiny_patch4_window7_224", "swin-b": "swin_base_patch4_window7_224", "resnet50": "resnet50",
}


def backbone(name: str) -> str:
    """A ``--model`` value as a timm name: a :data:`PAPER_BACKBONES` alias or the name itself."""
    return PAPER_BACKBONES.get(name.lower(), name)


#: Demo recipes, chosen from measured held-out curves over the seeded initialisation (docs/budgets.md): ViT 93.4-93.7%
#: after 24 epochs, Swin 94.7% after 12 (95.6% after 16), CNN 97.1% after 6 (97.8% after 8). One CPU thread: these models are so small that a second
#: thread mostly adds synchronisation; `workbench figures` trains two of them side by side instead. The held-out set is
#: evaluated every 8th (Swin, CNN: 6th) epoch and after the last: evaluation draws no random numbers, so the weights are the
#: same as with an evaluation after every epoch, and no figure plots the teachers' curves (it saves ~8% of their time).
_DEMO = {
    "vit": TrainConfig(epochs=24, batch_size=32, lr=1e-3, weight_decay=0.05, warmup_epochs=2, cpu_threads=1, eval_every=8),
    "swin": TrainConfig(epochs=12, batch_size=32, lr=2e-3, weight_decay=0.05, warmup_epochs=2, cpu_threads=1, eval_every=6),
    "cnn": TrainConfig(epochs=6, batch_size=32, lr=2e-3, weight_decay=0.05, warmup_epochs=1, cpu_threads=1, eval_every=6),
}

#: profile -> how it trains teachers.
BUDGETS: dict[str, TeacherBudget] = {
    # the CNN in channels-last memory format: oneDNN's convolutions then take 18% less time per training step and
    # 45% less per forward pass on this CPU (measured side by side; the other demo teachers only have a patch embedding)
    "demo": TeacherBudget(_DEMO, channels_last=("cnn",)),
    "smoke": TeacherBudget({k: replace(v, epochs=2, batch_size=64, warmup_epochs=0, progress=False) for k, v in _DEMO.items()},
                           channels_last=("cnn",)),
    # DeiT recipe (Touvron et al. 2021, Table 9): AdamW, lr 5e-4 x batch / 512 (1e-3 at batch 1024), wd 0.05, cosine,
    # 5 warm-up epochs, 300 epochs, label smoothing 0.1 (inside Mixup's soft targets), bf16 on GPUs; DataLoader
    # workers: one per core up to 8.
    "paper": TeacherBudget(
        {k: TrainConfig(epochs=300, batch_size=1024, lr=1e-3, weight_decay=0.05, warmup_epochs=5, warmup_lr=1e-6,
                        min_lr=1e-5, label_smoothing=0.1, amp=True, num_workers=min(8, os.cpu_count() or 1))
         for k in ("vit", "swin", "cnn")},
        models={"vit": PAPER_BACKBONES["deit-s"], "swin": PAPER_BACKBONES["swin-t"], "cnn": PAPER_BACKBONES["resnet50"]},
        augment=Augment(auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25, mixup=0.8, cutmix=1.0, repeats=3,
                        interpolation="bicubic"),
        lr_per_512=5e-4,
    ),
}


def teacher_run_id(arch: str, profile: "str | Profile", model_name: str | None = None, *, data: str | None = None,
                   init_sha256: str | None = None) -> str:
    """``teacher-swin-demo`` for the demo profiles' own model of ``arch``, else ``teacher-<timm name>-<profile>``
    (the paper profile always names the timm model), then ``+`` what else changes the result: the data
    (:func:`workbench.pipelines.data_tag`) and the initial checkpoint (``ck`` + 8 hex digits of its SHA-256):
    ``teacher-deit_small_patch16_224-paper+flowers_3fa2.ck1a2b3c4d``. Budget overrides follow (``.e0``)."""
    prof = get_profile(profile)  # a Profile passes through
    profile = prof.name
    default = budget("teacher", prof).model(arch)
    base = f"teacher-{arch}-{profile}" if model_name in (None, default) and not prof.is_paper else \
        f"teacher-{model_name or default}-{profile}"
    tokens = ([data_tag(data)] if data is not None else []) + ([f"ck{init_sha256[:8]}"] if init_sha256 else [])
    return base + ("+" + ".".join(tokens) if tokens else "")


def find_teachers(arch: str, profile: "str | Profile", data: str | None) -> list[Run]:
    """Complete teacher runs of ``arch`` (recorded in the manifest, or the profile's model of it) on ``data`` (None:
    any), newest first: the paper profile's teachers, recorded or trained by the user."""
    profile = get_profile(profile).name  # a Profile passes through
    default = budget("teacher", profile).model(arch)
    want = str(Path(data).expanduser().resolve()) if data is not None else None  # None: on any data
    found = []
    for run in list_runs():
        try:
            m, c = run.manifest, run.config
        except RunError:
            continue
        if (c.get("method") == "teacher" and c.get("profile") == profile and m.get("status") == "complete"
                and want in (None, c.get("data")) and (m.get("arch") == arch or c.get("model_name") == default)):
            found.append(run)
    # "completed" has one-second resolution: two runs completed within a second are told apart by the manifest's mtime
    return sorted(found, key=lambda r: (r.manifest.get("completed", ""), (r.dir / "manifest.json").stat().st_mtime_ns),
                  reverse=True)


def _classes(data: str) -> list[str]:
    """Class names of ``DATA/train`` (which ``DATA/val`` must share)."""
    root = Path(data).expanduser()
    train = scan_image_folder(root / "train", require_classes=True).classes
    val = scan_image_folder(root / "val", require_classes=True).classes
    if train != val:
        raise ValueError(f"{root}/train and {root}/val have different class folders ({len(train)} vs {len(val)}: "
                         f"{sorted(set(train) ^ set(val))[:5]}); both need the same classes")
    return list(train)


def _load_pretrained(model, checkpoint: str, log: Callable[[str], None], *, trains: bool = True,
                     state: dict | None = None) -> None:
    """Load a checkpoint; a classifier of another class count is left freshly initialised (and said so), and so is a
    first convolution of another shape when the model will be trained (``trains``): ImageNet ResNet-50 weights in
    ``resnet50_cifar``, whose 3×3 stride-1 CIFAR stem replaces the 7×7 one (AttentionLite's paper teacher).

    Raises:
        ValueError: a new stem on a teacher recorded untrained (``--epochs 0``), naming the fix.
    """
    state = read_state_dict(checkpoint) if state is None else state  # given: an hf:DIR folder's converted weights
    own = model.state_dict()
    pc = model.pretrained_cfg
    head = pc.get("classifier") or ()
    head = (head,) if isinstance(head, str) else tuple(head)
    if hasattr(model, "get_classifier"):  # the module itself (a pretrained_cfg may name another, e.g. the demo CNN's)
        cls = model.get_classifier()
        head += tuple(n for n, mod in model.named_modules() if n and mod is cls)
    stem = pc.get("first_conv") or ()
    stem = (stem,) if isinstance(stem, str) else tuple(stem)
    mismatched = [k for k in state if k in own and state[k].shape != own[k].shape]
    for part, names in (("classifier", head), ("stem", stem)):
        prefixes = tuple(f"{n}." for n in names)
        hit = [k for k in mismatched if k.startswith(prefixes)]
        if not hit:
            continue
        if part == "stem" and not trains:
            raise ValueError(f"checkpoint {checkpoint!r} has another first convolution ({', '.join(hit)}: "
                             f"{tuple(state[hit[0]].shape)} vs {tuple(own[hit[0]].shape)}); a new stem must be trained: "
                             "pass --epochs N (N > 0) to fine-tune it on your data")
        state = {k: v for k, v in state.items() if not k.startswith(prefixes)}
        state.update({k: v for k, v in own.items() if k.startswith(prefixes)})
        log(f"checkpoint {part} ({', '.join(hit)}) has another shape: re-initialised"
            + (" (another number of classes)" if part == "classifier" else "; the fine-tune trains it"))
    load_weights(model, state, what=f"checkpoint {checkpoint!r}")


@dataclass(frozen=True)
class _Plan:
    """What one teacher run trains (:func:`train_teacher`): everything its body needs."""

    name: str  # timm name of the model
    model_kwargs: dict  # its kwargs (num_classes on the user's data)
    profile: str  # the profile's name
    data: str | None  # absolute ImageFolder root (None: the demo set)
    cfg: TrainConfig  # the recipe with the overrides and the resolved device
    checkpoint: str | None  # initial weights (None: the seeded initialisation)
    augment: Augment | None  # training augmentation (None on the demo digits, which have their own jitter)
    classes: int  # classes of the user's data (0 on the demo set)
    channels_last: bool  # trained in channels-last memory format
    images: int | None  # --images: the most training images (None: all)
    arch: str  # --arch, recorded in the manifest (find_teachers)
    log: Callable[[str], None]  # one-line status messages
    hf_state: dict | None = None  # --checkpoint hf:DIR: the folder's weights converted to timm (None: a file or none)


def _train_config(recipe: TeacherBudget, arch: str, device, epochs: int | None, batch_size: int | None) -> TrainConfig:
    """The profile's recipe for ``arch`` with ``epochs`` / ``batch_size`` set (the paper profile scales the lr)."""
    cfg: TrainConfig = replace(recipe.config(arch), device=device)
    if epochs is not None:
        if epochs < 0:
            raise ValueError(f"--epochs must be >= 0, got {epochs}")
        cfg = replace(cfg, epochs=epochs)
    if batch_size is not None:
        if batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
        cfg = replace(cfg, batch_size=batch_size)
    if recipe.lr_per_512 is not None:
        cfg = replace(cfg, lr=recipe.lr_per_512 * cfg.batch_size / 512)  # DeiT: 5e-4 x batch / 512
    return cfg


def _model_name(recipe: TeacherBudget, arch: str, model_name: str | None) -> str:
    """The timm name to train: ``model_name`` (or its alias), else the profile's model of ``arch``.

    Raises:
        ValueError: an unknown arch or timm name (before anything is written).
    """
    if arch not in DEMO_TEACHERS:
        raise ValueError(f"unknown teacher arch {arch!r}; choose from {', '.join(DEMO_TEACHERS)}")
    name = backbone(model_name) if model_name else recipe.model(arch)
    import timm

    import methods.teachers  # noqa: F401  (the demo teachers are timm names)

    if not timm.is_model(name):
        create_model(name)  # its clear error for an unknown name, before anything is written
    return name


def _checkpoint_sha(checkpoint: str | None) -> str | None:
    """SHA-256 of the initial weights (None without).

    Raises:
        ValueError: a checkpoint file that does not exist.
    """
    if checkpoint is None:
        return None
    if not Path(checkpoint).expanduser().is_file():
        raise ValueError(f"teacher checkpoint {checkpoint!r} does not exist")
    return sha256_file(Path(checkpoint).expanduser())


def _run_config(plan: _Plan, sha: str | None) -> dict:
    """What defines a teacher run's result (its config.json)."""
    config = {"method": "teacher", "model_name": plan.name, "model_kwargs": plan.model_kwargs, "profile": plan.profile,
              "data": plan.data or "demo", "init_checkpoint_sha256": sha,
              "augment": asdict(plan.augment) if plan.augment is not None else None,
              "train": {k: v for k, v in plan.cfg.to_dict().items() if k not in RUNTIME_ONLY}}
    if plan.channels_last:  # recorded only where used: the other teachers' configs stay what they were
        config["memory_format"] = "channels_last"
    return config


def _teacher_body(run: Run, plan: _Plan) -> dict:
    """Train (or record) the teacher in ``run.dir``; its results."""
    import torch

    if is_main():  # under torchrun rank 0 keeps the record
        run.update_manifest(arch=plan.arch)  # find_teachers looks teachers up by arch
    cfg, augment = plan.cfg, plan.augment
    torch.manual_seed(cfg.seed)  # the initialisation: the same whatever ran before in this process
    model = create_model(plan.name, **plan.model_kwargs)
    if plan.checkpoint is not None:
        where = plan.checkpoint if plan.hf_state is not None else str(Path(plan.checkpoint).expanduser())
        _load_pretrained(model, where, plan.log, trains=cfg.epochs > 0, state=plan.hf_state)
    if plan.channels_last:
        model = model.to(memory_format=torch.channels_last)  # the convolutions' weights; activations follow
    pc = model.pretrained_cfg
    train_set, val_set = datasets(plan.profile, plan.data, tuple(pc["input_size"]), pc.get("mean"), pc.get("std"),
                                  images=plan.images, augment=augment, eval_transform=eval_transform(pc))
    options = {}
    if augment is not None and augment.mixes:
        options.update(batch_transform=mixup_cutmix(plan.classes, augment.mixup, augment.cutmix, cfg.label_smoothing),
                       loss_fn=soft_target_cross_entropy())
    if augment is not None and augment.repeats:
        options["sampler"] = repeated_augmentation(augment.repeats)
    if cfg.epochs == 0:
        return _record_checkpoint(run, model, val_set, cfg, len(train_set))
    plan.log(f"training {plan.name} ({plan.profile} profile) on {plan.data or 'the demo set'}: {len(train_set)} images, "
             f"{cfg.epochs} epochs, batch {cfg.batch_size}, lr {cfg.lr:.3g}")
    history = fit(model, train_set, val_set, cfg, ckpt_dir=run.dir, on_epoch_end=run.log_epoch, **options)
    final = history[-1]
    return {"val_acc": final["val_acc"], "val_loss": final["val_loss"], "epochs": len(history),
            "train_images": len(train_set), "val_images": len(val_set)}


def train_teacher(
    arch: str,
    profile: str = "demo",
    *,
    force: bool = False,
    device: "str | torch.device" = "auto",
    data: str | None = None,
    model_name: str | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    checkpoint: str | None = None,
    images: int | None = None,
    id_suffix: str | None = None,
    log=print,
) -> Run:
    """Train (or reuse, or resume) a teacher run.

    Args:
        arch: ``vit``, ``swin`` or ``cnn``: the profile's model of that family (demo teachers; the papers'
            backbones under ``paper``) and its recipe.
        profile: ``demo``, ``smoke`` or ``paper``.
        force: retrain even if a complete run exists.
        device: ``auto``, ``cpu``, ``cuda``, or a torch.device already resolved (:func:`run_method`'s).
        data: an ImageFolder root with ``train/`` and ``val/`` (required by ``paper``).
        model_name: a timm architecture (or a ``PAPER_BACKBONES`` alias such as ``deit-b``) instead of the
            profile's model of ``arch``.
        epochs: override the profile's epoch count (0: record ``checkpoint`` as the teacher, untrained).
        batch_size: override the profile's batch size (the paper profile scales the lr with it).
        checkpoint: pretrained weights to start from (module docstring).
        images: the most training images (``--images``; None: all).
        id_suffix: what ends the run id (a request's budget overrides, ``RunRequest.id_suffix``); None (a call
            from Python): ``epochs`` / ``batch_size`` other than the profile's name the run as the CLI's do.

    Raises:
        ValueError: unknown arch or model, ``--epochs 0`` without a checkpoint, bad data, missing checkpoint.
    """
    recipe = budget("teacher", profile)
    hf = _hf_checkpoint(checkpoint, model_name)  # --checkpoint hf:DIR: the folder's own architecture and weights
    name = hf[0].name if hf else _model_name(recipe, arch, model_name)
    cfg = _train_config(recipe, arch, resolve_device(device), epochs, batch_size)
    if cfg.epochs == 0 and checkpoint is None:
        raise ValueError("--epochs 0 records a teacher without training it: pass its weights with --checkpoint FILE")
    sha = hf[1].sha256() if hf else _checkpoint_sha(checkpoint)
    data = str(Path(data).expanduser().resolve()) if data is not None else None
    classes = _classes(data) if data is not None else []
    if hf and data is None:  # an HF folder on the demo set: its digits' classes (the demo teachers have them built in)
        classes = list(DEMO_CLASSES)
    model_kwargs = {**(hf[0].kwargs if hf else {}), **({"num_classes": len(classes)} if classes else {})}
    plan = _Plan(name, model_kwargs, profile, data, cfg, checkpoint,
                 recipe.augment if data is not None else None, len(classes), arch in recipe.channels_last, images,
                 arch, log, hf[0].model.state_dict() if hf else None)
    rid = teacher_run_id(arch, profile, name, data=data, init_sha256=sha)
    if id_suffix is None:  # called from Python with epochs / batch_size: they name the run as the CLI's do
        base = get_method("teacher").budgets[profile].config(arch)
        tokens = [f"e{cfg.epochs}"] * (cfg.epochs != base.epochs) + [f"b{cfg.batch_size}"] * (cfg.batch_size != base.batch_size)
        rid += (("." if "+" in rid else "+") + ".".join(tokens)) if tokens else ""
    else:
        rid = suffixed_id(rid, id_suffix)
    return ensure_run(rid, _run_config(plan, sha), lambda run: _teacher_body(run, plan), force=force, log=log)


def _hf_checkpoint(checkpoint: str | None, model_name: str | None):
    """``(Converted, HFFolder)`` of ``--checkpoint hf:DIR`` (:mod:`workbench.hf`), else None."""
    if checkpoint is None or not str(checkpoint).startswith("hf:"):
        return None
    if model_name:
        raise ValueError(f"--checkpoint {checkpoint} brings its own architecture; drop --model {model_name}")
    from workbench.hf import load_hf

    return load_hf(checkpoint)


def _record_checkpoint(run: Run, model, val_set: Dataset, cfg: TrainConfig, train_images: int) -> dict:
    """``--epochs 0``: the checkpoint becomes the run's weights after one evaluation on the held-out set (on
    ``cfg.device``, resolved by :func:`train_teacher`)."""
    from torch.utils.data import DataLoader

    from workbench.runtime import atomic_save_safetensors, evaluate, workers_for

    model.to(cfg.device)
    metrics = evaluate(model, DataLoader(val_set, batch_size=256, num_workers=workers_for(cfg, cfg.device)), cfg.device)
    if is_main():  # under torchrun rank 0 keeps the record
        atomic_save_safetensors(model.state_dict(), run.checkpoint)
    return {**metrics, "epochs": 0, "train_images": train_images, "val_images": len(val_set)}


def resolve_teacher(teacher: str | Run | None, profile: "str | Profile", *, default_arch: str, family: str,
                    checkpoint: str | None = None, device: "str | torch.device" = "auto", data: str | None = None,
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
    prof = get_profile(profile)  # a Profile passes through
    teacher = default_arch if teacher is None else str(teacher.dir) if isinstance(teacher, Run) else teacher
    if teacher in DEMO_TEACHERS:
        if prof.is_paper:  # the paper's backbone trained (or recorded) on the user's data; never trained here
            found = find_teachers(teacher, prof.name, data)
            if not found:
                name = budget("teacher", prof).model(teacher)
                raise ValueError(
                    f"the paper profile needs a real {family} teacher and there is no complete --arch {teacher} teacher "
                    f"run on {data or 'your data (pass --data ROOT)'}: train {name} with `workbench train teacher --arch "
                    f"{teacher} --profile paper --data ROOT`, or record pretrained weights with `... --checkpoint WEIGHTS "
                    f"--epochs 0` (--model NAME for another backbone); or pass --teacher RUN_ID, or a timm {family} name "
                    "with --checkpoint WEIGHTS")
            if len(found) > 1:
                log(f"{len(found)} --arch {teacher} teacher runs on this data: using the newest, {found[0].id} (others: "
                    f"{', '.join(r.id for r in found[1:])}; pass --teacher RUN_ID to choose)")
            teacher = found[0].id
        else:
            teacher = train_teacher(teacher, prof.name, device=device, data=data, log=log).id
    if teacher.startswith("hf:"):  # a Hugging Face folder, converted to timm (workbench.hf)
        return _hf_teacher(teacher, checkpoint)
    run = find_run(teacher)
    if run is not None:
        if checkpoint is not None:
            raise ValueError(f"teacher {teacher!r} is a run with its own checkpoint; drop --checkpoint")
        if run.status != "complete":
            raise RunError(f"teacher run {run.id!r} is not complete (status {run.status!r}); finish it first")
        return TeacherRef(run.id, _tag(run), run.config["model_name"], dict(run.config.get("model_kwargs", {})), None,
                          run.manifest.get("checkpoint_sha256"), run.id, run.config.get("data"))
    create_model(teacher)  # validates the name: a clear error for an unknown architecture
    if checkpoint is None:
        raise ValueError(f"teacher {teacher!r} is not a run; pass a teacher run id (e.g. teacher-{default_arch}-demo), "
                         f"a demo arch ({default_arch}), or a timm {family} name with --checkpoint WEIGHTS "
                         "(compressing random weights measures nothing)")
    path = Path(checkpoint).expanduser()
    if not path.is_file():
        raise ValueError(f"teacher checkpoint {str(path)!r} does not exist")
    sha = sha256_file(path)
    return TeacherRef(teacher, f"{teacher}+ck{sha[:8]}", teacher, {}, str(path), sha)  # the weights are in the id


def _hf_teacher(ref: str, checkpoint: str | None) -> TeacherRef:
    """``hf:DIR`` as a teacher: its timm name and JSON kwargs, the weights' hash in the students' ids."""
    import re

    from workbench.hf import load_hf

    if checkpoint is not None:
        raise ValueError(f"teacher {ref!r} is a Hugging Face folder with its own weights; drop --checkpoint")
    converted, folder = load_hf(ref)
    sha = folder.sha256()
    tag = f"hf-{re.sub(r'[^A-Za-z0-9_.-]', '_', folder.path.resolve().name)}+ck{sha[:8]}"
    return TeacherRef(ref, tag, converted.name, converted.kwargs, None, sha)


def _tag(run: Run) -> str:
    """The teacher part of its students' ids: ``vit-demo`` for ``teacher-vit-demo``, ``resnet18+flowers_3fa2.e0-paper``
    for ``teacher-resnet18-paper+flowers_3fa2.e0`` (the profile last, as the students' ids end with it)."""
    head, plus, extra = run.id.removeprefix("teacher-").partition("+")
    profile = run.config.get("profile")
    if plus and profile and head.endswith(f"-{profile}"):
        return f"{head.removesuffix(f'-{profile}')}+{extra}-{profile}"
    return run.id.removeprefix("teacher-")


def _run(req: RunRequest, arch: str, model: str | None = None, checkpoint: str | None = None) -> Run:
    # --epochs / --batch-size are the shared budget overrides (workbench.pipelines.Overrides): req.budget has them
    cfg = req.budget.config(arch)
    return train_teacher(arch, req.profile.name, force=req.force, device=req.device, data=req.data, model_name=model,
                         epochs=cfg.epochs, batch_size=cfg.batch_size, checkpoint=checkpoint, images=req.images,
                         id_suffix=req.id_suffix, log=req.log)


register_method(Method(
    "teacher", "Train a teacher (a demo teacher, or the papers' backbones / any timm model on --data) as a run.",
    BUDGETS, _run,
    options=(Option("arch", "model family: the demo teacher, or under --profile paper DeiT-S / Swin-T / ResNet-50",
                    choices=tuple(DEMO_TEACHERS), required=True),
             Option("model", "another timm name, or deit-t, deit-s, deit-b, swin-t, swin-b, resnet50"),
             Option("checkpoint", "pretrained weights to start from (.safetensors, .pt, .pth); with --epochs 0 they "
                    "are recorded as the teacher, untrained")),
    examples=("workbench train teacher --arch vit", "workbench train teacher --arch swin --profile smoke --force",
              "workbench train teacher --arch vit --profile paper --data ~/imagenet --checkpoint deit_s.safetensors "
              "--epochs 0"),
    extra={"resolve": resolve_teacher},  # how run_method resolves any method's teacher
))
