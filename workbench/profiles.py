"""Profiles: which data and how much of it (shared DESIGN.md, "Profiles").

- ``demo`` (default): the bundled MNIST-5k, the three small teachers trained here; budgets such
  that ``workbench figures --all`` from a cold start finishes in minutes on a 2-core CPU.
- ``smoke``: the same pipeline with the smallest budgets, for tests (accuracy is not a goal).
- ``paper``: the papers' backbones and hyperparameters on user data (an ImageFolder given with
  ``--data``), launched with ``torchrun`` on GPUs; never run by the tests.

A profile names the data side only; each method's epochs, learning rates and sizes per profile are
its registry entry's budgets (:func:`workbench.pipelines.budget`), the teachers' included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ProfileName", "Profile", "PROFILES", "get_profile"]

ProfileName = Literal["demo", "smoke", "paper"]


@dataclass(frozen=True)
class Profile:
    """The data side of one profile."""

    name: ProfileName  # "demo", "smoke" or "paper"
    train_limit: int | None  # training images used (None: all)
    val_limit: int | None  # held-out images used for accuracy (None: all)
    analysis_images: str = "demo:val[:8]"  # image spec of the figures' analyses
    is_paper: bool = False  # the papers' backbones and hyperparameters on the user's data (--data), launched on GPUs;
    # no demo teacher is trained under it (tests run it with budget overrides on a tiny folder: test_paper_profile)

    def require_data(self, data: str | None, what: str = "trains") -> None:
        """Refuse to run without ``--data`` under the paper profile (``what``: "trains", "prunes"...).

        Raises:
            ValueError: the paper profile and no data.
        """
        if self.is_paper and data is None:
            raise ValueError(f"the {self.name} profile {what} on your data: pass --data PATH (an ImageFolder with "
                             "train/ and val/)")


PROFILES: dict[str, Profile] = {
    "demo": Profile("demo", None, None),
    "smoke": Profile("smoke", 128, 64, analysis_images="demo:val[:2]"),
    "paper": Profile("paper", None, None, is_paper=True),
}


def get_profile(name: str | Profile) -> Profile:
    """The profile called ``name`` (a Profile passes through).

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if isinstance(name, Profile):
        return name
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose from {', '.join(PROFILES)}")
    return PROFILES[name]
