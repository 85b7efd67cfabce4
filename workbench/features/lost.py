"""The user's question: do the features a student lost explain the images it now gets wrong?

1. **Which features.** The live teacher-only latents of the diff, ranked by their effect in the teacher (the mean
   drop of the correct class's log-probability when the latent is removed from the teacher,
   :mod:`~workbench.features.effects`); the ``top`` largest drops are kept, and of them only those whose drop is at
   least ``min_effect`` nats — a lost latent that the teacher does not use cannot explain lost accuracy.
2. **Which images.** Per-image correctness of both models on the same held-out images: *lost* = the teacher is
   right and the student wrong (the accuracy the student lost), *kept* = both right. Images the teacher gets wrong
   are left out (no accuracy of the teacher's to lose there).
3. **The statistic.** Per image, the score ``s = mean_j a_j(image) / ā_j`` over the kept latents ``j``
   (``a_j(image)``: the latent's mean code over the image's tokens; ``ā_j``: its mean over all the test's images, so
   every latent counts alike and ``s`` ≈ 1 on an average image). Lost and kept images are different images, so no
   pairing by image exists; what is compared like with like is the class: the difference is taken within each true
   class and averaged with the class's share of the lost images,

       Δ = Σ_c w_c (mean_lost,c s − mean_kept,c s),   w_c = n_lost,c / Σ n_lost,c

   over the classes with both lost and kept images (a class the student often confuses and a latent specific to
   that class would otherwise make a difference by themselves). The interval is a percentile bootstrap that
   resamples the images within each (class, lost / kept) cell (``draws`` draws, seeded); the *excess* is Δ over
   the kept images' class-weighted mean score (``+0.5``: lost images carry 50 % more of the lost features).
4. **The verdict** (:func:`lost_status`), per student:

   - ``shown``: the interval lies above 0 and the excess is at least ``min_excess``;
   - ``partly``: the interval lies above 0 but the excess is below ``min_excess`` (they fire more, by little);
   - ``not shown``: no teacher-only latent with an effect in the teacher, fewer than ``min_lost`` lost images
     (or no class with both kinds), or an interval that reaches 0 or below.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["LostThresholds", "LostTest", "rank_teacher_only", "lost_status", "lost_features"]


@dataclass(frozen=True)
class LostThresholds:
    """What the lost-features test uses and when its verdict says what (module docstring)."""

    top: int = 8  # teacher-only latents scored: the largest drops in the teacher
    min_effect: float = 0.01  # nats: a latent counts when removing it lowers log p(correct) by this much on average
    min_lost: int = 5  # fewer lost images than this: nothing to test
    min_excess: float = 0.25  # lost images carry at least this much more of the latents (relative) for "shown"
    level: float = 0.95  # confidence level of the bootstrap interval
    draws: int = 2000  # bootstrap draws
    seed: int = 0  # bootstrap generator seed

    def __post_init__(self) -> None:
        if self.top < 1 or self.min_lost < 1 or self.draws < 100 or not 0 < self.level < 1 or self.min_excess < 0:
            raise ValueError(f"need top >= 1, min_lost >= 1, draws >= 100, 0 < level < 1, min_excess >= 0; got {self}")


@dataclass(frozen=True)
class LostTest:
    """The test's result for one student."""

    latents: tuple[int, ...]  # the teacher-only latents scored (largest teacher effect first)
    n_lost: int  # images the teacher gets right and the student wrong (in classes with both kinds)
    n_kept: int  # images both get right (in those classes)
    delta: float  # class-weighted mean score difference, lost − kept (NaN when not testable)
    low: float  # bootstrap interval of delta
    high: float
    excess: float  # delta / kept images' class-weighted mean score
    status: str  # "shown" / "partly" / "not shown"
    reason: str = ""  # why not (or only partly) shown
    method: str = field(default="class-stratified difference of mean scores, percentile bootstrap within cells")

    @property
    def statistic(self) -> str:
        """The measured statistic with its interval, for a table cell or a caption."""
        if not np.isfinite(self.delta):
            return f"{self.n_lost} lost / {self.n_kept} kept images, {len(self.latents)} latents"
        return (f"Δ = {self.delta:+.2f} [{self.low:+.2f}, {self.high:+.2f}] (excess {100 * self.excess:+.0f} %; "
                f"{self.n_lost} lost / {self.n_kept} kept images, {len(self.latents)} latents)")


def rank_teacher_only(latent_class: np.ndarray, dead: np.ndarray, teacher_drop: np.ndarray,
                      latents: np.ndarray | None = None) -> np.ndarray:
    """The live teacher-only latents, largest teacher drop first.

    Args:
        latent_class, dead: per latent of the dictionary (the diff's ``latent_class`` and ``dead``).
        teacher_drop: ``−effect_mean`` in the teacher (nats; positive = the teacher needs it) of the latents
            ``latents`` (default: every latent).
    """
    latents = np.arange(len(latent_class)) if latents is None else np.asarray(latents)
    drop = np.asarray(teacher_drop, float)
    ok = (np.asarray(latent_class)[latents] == "teacher_only") & ~np.asarray(dead, bool)[latents]
    order = np.argsort(-np.where(ok, drop, -np.inf), kind="stable")
    return latents[order[: int(ok.sum())]]


def lost_status(n_latents: int, n_lost: int, low: float, excess: float, th: LostThresholds = LostThresholds(),
                n_teacher_only: int | None = None) -> tuple[str, str]:
    """``(status, reason)`` from the test's numbers (module docstring, 4); ``n_teacher_only``: the live teacher-only
    latents there were before the effect filter (for the reason only)."""
    if n_teacher_only == 0:
        return "not shown", "the diff found no live teacher-only latent: nothing lost at this block"
    if n_latents == 0:
        return "not shown", (f"no live teacher-only latent lowers the teacher's log p(correct) by ≥ {th.min_effect:g} "
                             "nats when removed: nothing lost that the teacher used")
    if n_lost < th.min_lost:
        return "not shown", f"{n_lost} lost images (< {th.min_lost}) in classes with kept ones: too few to test"
    if not low > 0:
        return "not shown", (f"the {100 * th.level:.0f} % interval reaches {low:+.2f} ≤ 0: the lost latents do not "
                             "fire measurably more on the images the student lost")
    if excess < th.min_excess:
        return "partly", (f"they fire more on lost images, but by {100 * excess:.0f} % < {100 * th.min_excess:.0f} %"
                          " of their level on kept images")
    return "shown", ""


def _stratified(score: np.ndarray, lost: np.ndarray, kept: np.ndarray, labels: np.ndarray, th: LostThresholds):
    """``(delta, low, high, excess, n_lost, n_kept)`` of the class-stratified difference and its bootstrap."""
    cells = [(score[lost & (labels == c)], score[kept & (labels == c)]) for c in np.unique(labels[lost])]
    cells = [(a, b) for a, b in cells if a.size and b.size]
    n_lost, n_kept = sum(a.size for a, _ in cells), sum(b.size for _, b in cells)
    if n_lost < th.min_lost:
        return np.nan, np.nan, np.nan, np.nan, n_lost, n_kept
    w = np.array([a.size for a, _ in cells], float) / n_lost
    delta = float(sum(wi * (a.mean() - b.mean()) for wi, (a, b) in zip(w, cells)))
    base = float(sum(wi * b.mean() for wi, (_, b) in zip(w, cells)))
    rng = np.random.default_rng(th.seed)
    draws = np.zeros(th.draws)
    for wi, (a, b) in zip(w, cells):  # resample within each (class, lost / kept) cell
        draws += wi * (a[rng.integers(0, a.size, (th.draws, a.size))].mean(1)
                       - b[rng.integers(0, b.size, (th.draws, b.size))].mean(1))
    low, high = np.quantile(draws, [(1 - th.level) / 2, (1 + th.level) / 2])
    return delta, float(low), float(high), delta / base if base > 0 else np.inf, n_lost, n_kept


def lost_features(image_act: np.ndarray, labels: np.ndarray, teacher_correct: np.ndarray,
                  student_correct: np.ndarray, ranked: np.ndarray, teacher_drop: np.ndarray,
                  th: LostThresholds = LostThresholds()) -> LostTest:
    """The lost-features test (module docstring) of one student on the same held-out images.

    Args:
        image_act: ``(images, latents)`` each latent's mean code over the image's tokens (a column per latent of
            the dictionary; :func:`~workbench.features.meaning.latent_activations`' ``image_mean``).
        labels, teacher_correct, student_correct: ``(images,)`` true class and per-image correctness.
        ranked: the teacher-only latents, largest teacher drop first (:func:`rank_teacher_only`).
        teacher_drop: ``(latents,)`` the teacher's drop (nats) of every latent in ``ranked``, in that order.
    """
    drop = np.asarray(teacher_drop, float)
    chosen = tuple(int(j) for j, d in zip(ranked[: th.top], drop[: th.top]) if d >= th.min_effect)
    t_ok, s_ok = np.asarray(teacher_correct, bool), np.asarray(student_correct, bool)
    lost, kept = t_ok & ~s_ok, t_ok & s_ok
    if chosen:
        act = np.asarray(image_act, float)[:, list(chosen)]
        score = (act / np.maximum(act.mean(0), 1e-12)).mean(1)  # (images,): 1 on an average image
        delta, low, high, excess, n_lost, n_kept = _stratified(score, lost, kept, np.asarray(labels), th)
    else:
        delta = low = high = excess = np.nan
        n_lost, n_kept = int(lost.sum()), int(kept.sum())
    status, reason = lost_status(len(chosen), n_lost, low, excess, th, n_teacher_only=len(ranked))
    return LostTest(chosen, n_lost, n_kept, delta, low, high, excess, status, reason)
