"""Progressive joining schedules λ(t) (Non-deep ViT §3.3, App. B.2, Eq. 10–13) and the training hook.

Paper: "Non-deep Vision Transformers" (anonymous ICLR submission). λ(t) moves every branch from its
own pre-non-linearity input (λ = 0) to the sum over branches (λ = 1) during the *Lambda Warmup
Period*; ``t ∈ [0, 1]`` is the normalised progress within that period, and after it λ stays 1
(*Post-Joining Adjustment Phase*, App. B.1)::

    linear       λ(t) = t                          (Eq. 10)
    cosine       λ(t) = ½ (1 − cos πt)             (Eq. 11)
    exponential  λ(t) = 1 − e^{−5t}                (Eq. 12)
    sqrt         λ(t) = √t                         (Eq. 13)
    instant      λ(t) = 1                          (Table 5, "instant joining")
    none         λ(t) = 0                          (Table 5, "no joining"; cannot be collapsed)

Notes where the paper disagrees with itself (each shown by a test in ``tests/test_nondeep_method.py``):

- Eq. 12 does not reach 1: λ_exp(1⁻) = 1 − e^{−5} ≈ 0.9933. We implement it literally, so λ jumps
  by 0.0067 to 1 when the adjustment phase starts (``test_schedule_endpoints_and_monotone``).
- App. B.2 says the square-root schedule "emphasizes slower growth at the beginning but accelerates
  toward the end"; Eq. 13 does the opposite (√t ≥ t: fastest at the start). We follow Eq. 13
  (``test_sqrt_schedule_is_fastest_early``).
- Algorithm 1 (line 19) names the cosine schedule as the one used; §3.3, App. A.2 and Table 5 say
  linear is the default. Our default is linear (:class:`methods.nondeep.config.JoinConfig`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, get_args

import torch
import torch.nn as nn

from methods.train import TrainHook

#: Joining schedules (App. B.2 plus Table 5's two baselines).
Schedule = Literal["linear", "cosine", "exponential", "sqrt", "instant", "none"]
SCHEDULES: tuple[str, ...] = get_args(Schedule)

_CURVES: dict[str, Callable[[float], float]] = {
    "linear": lambda t: t,  # Eq. 10
    "cosine": lambda t: 0.5 * (1.0 - math.cos(math.pi * t)),  # Eq. 11
    "exponential": lambda t: 1.0 - math.exp(-5.0 * t),  # Eq. 12
    "sqrt": lambda t: math.sqrt(t),  # Eq. 13
    "instant": lambda t: 1.0,
    "none": lambda t: 0.0,
}


def check_schedule(schedule: str) -> None:
    """Raise ``ValueError`` unless ``schedule`` is one of :data:`SCHEDULES`."""
    if schedule not in _CURVES:
        raise ValueError(f"unknown joining schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def lambda_schedule(schedule: Schedule, t: float) -> float:
    """λ(t) of ``schedule`` at normalised warm-up progress ``t`` (module docstring).

    ``t ≤ 0`` gives λ(0); ``t ≥ 1`` is the adjustment phase: λ = 1 (0 for ``"none"``).

    Raises:
        ValueError: an unknown schedule or a NaN ``t``.
    """
    check_schedule(schedule)
    if math.isnan(t):
        raise ValueError("t is NaN")
    if schedule == "none":
        return 0.0
    if t >= 1.0:
        return 1.0
    return float(_CURVES[schedule](max(t, 0.0)))


def lambda_curves(steps: int = 101, schedules: tuple[str, ...] = SCHEDULES[:4]) -> tuple[torch.Tensor, torch.Tensor]:
    """λ(t) of several schedules on a grid (the paper's Fig. 3).

    Returns:
        ``(t, lam)``: ``t`` of shape ``(steps,)`` over ``[0, 1]``, ``lam`` of shape
        ``(len(schedules), steps)`` in float64.
    """
    t = torch.linspace(0.0, 1.0, steps, dtype=torch.float64)
    lam = torch.tensor([[lambda_schedule(s, float(x)) for x in t] for s in schedules], dtype=torch.float64)
    return t, lam


# ----------------------------------------------------------------------------- λ on a model
def _lambda_buffers(model: nn.Module) -> list[torch.Tensor]:
    model = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return [m.lam for m in model.modules() if hasattr(m, "lam") and isinstance(m.lam, torch.Tensor)]


def set_lambda(model: nn.Module, value: float) -> None:
    """Set the joining coefficient λ of every parallel block of a branched model (in place).

    Raises:
        ValueError: ``value`` outside [0, 1], or a model without parallel blocks.
    """
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"λ must lie in [0, 1], got {value}")
    bufs = _lambda_buffers(model)
    if not bufs:
        raise ValueError(f"{type(model).__name__} has no parallel blocks (build one with methods.nondeep.branch)")
    for b in bufs:
        b.fill_(float(value))


def get_lambda(model: nn.Module) -> float:
    """The common λ of a branched model's blocks.

    Raises:
        ValueError: no parallel blocks, or blocks with different λ.
    """
    bufs = _lambda_buffers(model)
    if not bufs:
        raise ValueError(f"{type(model).__name__} has no parallel blocks (build one with methods.nondeep.branch)")
    values = sorted({float(b) for b in bufs})
    if len(values) > 1:
        raise ValueError(f"the blocks have different λ: {values}")
    return values[0]


class ProgressiveJoin(TrainHook):
    """Drives λ during training: ``λ = lambda_schedule(schedule, step / warmup_steps)`` (App. B).

    Call :meth:`start` once before training (sets λ(0)); after every optimizer step λ advances.
    The step count is checkpointed through ``state_dict``, so a resumed run continues the schedule
    exactly. ``on_epoch_end`` logs the current λ as ``lambda``.

    Args:
        schedule: one of :data:`SCHEDULES`.
        warmup_steps: length of the Lambda Warmup Period in optimizer steps (10k in the paper,
            App. B.1); 0 joins instantly.
    """

    def __init__(self, schedule: Schedule = "linear", warmup_steps: int = 1):
        check_schedule(schedule)
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be ≥ 0, got {warmup_steps}")
        self.schedule, self.warmup_steps, self.step = schedule, int(warmup_steps), 0

    def value(self, step: int | None = None) -> float:
        """λ after ``step`` optimizer steps (default: the current step)."""
        step = self.step if step is None else step
        t = 1.0 if self.warmup_steps == 0 else step / self.warmup_steps
        return lambda_schedule(self.schedule, t)

    def start(self, model: nn.Module) -> ProgressiveJoin:
        set_lambda(model, self.value())
        return self

    def after_step(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.step += 1
        set_lambda(model, self.value())

    def on_epoch_end(self, model, optimizer, epoch) -> dict[str, float]:
        return {"lambda": get_lambda(model)}

    def state_dict(self) -> dict:
        return {"schedule": self.schedule, "warmup_steps": self.warmup_steps, "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        if state.get("schedule") != self.schedule or int(state.get("warmup_steps", -1)) != self.warmup_steps:
            raise ValueError(f"checkpoint was trained with joining schedule {state.get('schedule')!r} over "
                             f"{state.get('warmup_steps')} steps, not {self.schedule!r} over {self.warmup_steps}")
        self.step = int(state["step"])


__all__ = ["SCHEDULES", "Schedule", "ProgressiveJoin", "check_schedule", "get_lambda", "lambda_curves",
           "lambda_schedule", "set_lambda"]
