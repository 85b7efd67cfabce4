"""Profiles: the budgets of a pipeline (shared DESIGN.md, "Profiles").

- ``demo`` (default): the bundled MNIST-5k, the three small teachers trained here; budgets such
  that ``workbench figures --all`` from a cold start finishes in minutes on a 2-core CPU.
- ``smoke``: the same pipeline with the smallest budgets, for tests (accuracy is not a goal).
- ``paper``: the papers' backbones and hyperparameters on user data (an ImageFolder given with
  ``--data``), launched with ``torchrun`` on GPUs; never run by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from methods.train import TrainConfig

ProfileName = Literal["demo", "smoke", "paper"]


@dataclass(frozen=True)
class Profile:
    """Budgets of one profile."""

    name: str  # "demo", "smoke" or "paper"
    train_limit: int | None  # training images used (None: all)
    val_limit: int | None  # held-out images used for accuracy (None: all)
    teachers: dict[str, TrainConfig] = field(default_factory=dict)  # --arch -> teacher training config
    analysis_images: str = "demo:val[:8]"  # image spec for the figures' analyses
    photo_images: str = "skimage:astronaut,chelsea,coffee"  # natural photos for qualitative views

    def teacher(self, arch: str) -> TrainConfig:
        if arch not in self.teachers:
            raise ValueError(f"profile {self.name!r} has no teacher {arch!r}; choose from {', '.join(self.teachers)}")
        return self.teachers[arch]


_DEMO_TEACHERS = {
    # Small transformers learn slowly from 4000 images. Measured here: batch 32 beat 64 (more
    # updates), label smoothing only slowed them; the ViT wants lr 1e-3 (2e-3 and 3e-3 stalled),
    # the Swin 2e-3 (80% after 15 epochs at 1e-3). The initialisation is seeded (seed 0), and the
    # epochs were chosen over it with a margin: held-out top-1 ViT 93.4% after 24 epochs (89.7% after
    # 18, 93.9% after 30 in an unseeded run), Swin 93.1% after 24 (90.0% after 20, 93.7% after 30;
    # drop path 0 instead of timm's 0.1: 90.2% after 20; embed dim 48: 92.1% after 20 at 1.5x the time),
    # CNN (channels 16-128, batch 32) 97.8% after 8 epochs (97.4% after 6; channels 32-256 at batch 64:
    # 96.9% after 5 epochs in about the same time).
    # One CPU thread: these models are so small that a second thread mostly adds synchronisation
    # (measured ~10x slower per step with two threads on a loaded 2-core machine); `workbench figures`
    # trains two of them side by side instead.
    "vit": TrainConfig(epochs=24, batch_size=32, lr=1e-3, weight_decay=0.05, warmup_epochs=2, cpu_threads=1),
    "swin": TrainConfig(epochs=24, batch_size=32, lr=2e-3, weight_decay=0.05, warmup_epochs=2, cpu_threads=1),
    "cnn": TrainConfig(epochs=8, batch_size=32, lr=2e-3, weight_decay=0.05, warmup_epochs=1, cpu_threads=1),
}

PROFILES: dict[str, Profile] = {
    "demo": Profile("demo", None, None, _DEMO_TEACHERS),
    "smoke": Profile(
        "smoke", 256, 128,
        {k: replace(v, epochs=2, batch_size=64, warmup_epochs=0, progress=False) for k, v in _DEMO_TEACHERS.items()},
        analysis_images="demo:val[:2]", photo_images="skimage:astronaut",
    ),
    "paper": Profile(
        "paper", None, None,
        # DeiT recipe (Touvron et al. 2021): AdamW, lr 5e-4 x batch/512, wd 0.05, 300 epochs, 5 warm-up.
        {k: TrainConfig(epochs=300, batch_size=1024, lr=1e-3, weight_decay=0.05, warmup_epochs=5, label_smoothing=0.1, amp=True)
         for k in ("vit", "swin", "cnn")},
        analysis_images="demo:val[:8]",
    ),
}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose from {', '.join(PROFILES)}")
    return PROFILES[name]
