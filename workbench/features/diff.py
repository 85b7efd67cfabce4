"""The diff a crosscoder reads out: which latents each model has, and how well the dictionary fits each model.

Per latent ``j`` (dim ``latent``):

- ``decoder_norm(model, latent)``: ``‖W_dec,m[j]‖`` in the model's scaled units (unit token variance, so equal norms
  mean equal shares of each model's variance);
- ``relative_norm(latent)``: ``‖d_student‖ / (‖d_teacher‖ + ‖d_student‖)`` (Lindsey et al. 2024: 0 = the teacher
  only, 1 = the student only, ½ = both alike);
- coord ``latent_class(latent)`` by :class:`ClassThresholds`: ``teacher_only`` below ``exclusive``, ``student_only``
  above ``1 − exclusive``, ``shared`` within ``shared`` of ½, ``partial`` in between (the band edges of Minder et al.
  2025, Fig. 2, whose ``Δnorm = ½((‖d_s‖ − ‖d_t‖) / max(‖d_s‖, ‖d_t‖) + 1)`` is another scale: their 0.1 is a norm
  ratio of 0.2, ours 0.11, so our exclusive band is the stricter); a dead latent keeps its class but is not counted (``n_*`` counts live latents only);
- ``firing_rate(latent)``: share of held-out tokens where it is active; ``dead`` (never active on them) and
  ``dense`` (active on more than ``dense`` of them).

Latent Scaling (Minder et al. 2025, arXiv 2504.02922) checks every exclusive latent ``j``: with ``d`` its decoder
direction in the model that owns it (the teacher for ``relative_norm < ½``), ``β`` is the least-squares scalar of
``Σ_i ‖β f_ij d − y_i‖²`` (``β = Σ_i f_ij ⟨d, y_i⟩ / (‖d‖² Σ_i f_ij²)``) for two targets ``y`` per model ``m``:

- ``reconstruction``: ``x̂_m − b_dec,m`` (what the dictionary writes into ``m``: latent ``j``'s own row and any other
  latent that carries ``d`` — Minder et al.'s Latent Decoupling);
- ``error``: ``x_m − x̂_m + f_j W_dec,m[j]`` (``m``'s activation the dictionary leaves unexplained, latent ``j``'s
  own row given back — their Complete Shrinkage).

``nu(variant, latent) = β(other model) / β(owner)``: about 0 when the other model has nothing along ``d`` on the
tokens where ``j`` fires, about 1 when it has as much as the owner. An exclusive latent is ``confirmed`` when both
ratios are below ``ClassThresholds.scaling`` (½: the other model carries less than half of it), else ``in_other``
(not truly exclusive); ``scaling_verdict`` is ``n/a`` for non-exclusive and dead latents and ``unchecked`` when the
models' widths differ (the direction has no place in the other model). Reading ``d`` in the other model assumes the
two share a basis at the block, as a student fine-tuned from its teacher does (FAR, Sparsifiner).

Designated shared latents (a crosscoder trained with ``shared = N``: the first ``N``, decoders tied) read ½ by
construction: they keep the class ``shared`` but are flagged by ``designated(latent)`` and left out of ``n_shared``
(counted in ``n_designated``); both variables exist only when ``N > 0``.

Per model: ``fve(model)`` = 1 − Σ‖x − x̂‖² / Σ‖x − x̄‖² over held-out tokens, and ``l0`` = mean active latents
per token (one code for both models).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np
import torch
import xarray as xr

from workbench.features.crosscoder import Crosscoder

__all__ = ["ClassThresholds", "LATENT_CLASSES", "SCALING_VERDICTS", "latent_classes", "crosscoder_diff"]

LATENT_CLASSES: tuple[str, ...] = ("shared", "teacher_only", "student_only", "partial")
SCALING_VERDICTS: tuple[str, ...] = ("confirmed", "in_other", "n/a", "unchecked")


@dataclass(frozen=True)
class ClassThresholds:
    """Where a latent's relative decoder norm puts it, and when it is dense."""

    exclusive: float = 0.1  # relative norm < this: teacher_only; > 1 - this: student_only
    shared: float = 0.1  # |relative norm - 0.5| <= this: shared
    dense: float = 0.1  # active on more than this share of held-out tokens: dense
    scaling: float = 0.5  # Latent Scaling: an exclusive latent with a beta ratio >= this is present in the other model

    def __post_init__(self) -> None:
        if not (0 < self.exclusive < 0.5 - self.shared and 0 <= self.shared and 0 < self.dense <= 1
                and self.scaling > 0):
            raise ValueError(f"need 0 < exclusive < 0.5 - shared, shared >= 0, 0 < dense <= 1; got {self} (scaling > 0)")


def latent_classes(relative: np.ndarray, th: ClassThresholds = ClassThresholds()) -> np.ndarray:
    """The class of each relative decoder norm (module docstring)."""
    out = np.full(relative.shape, "partial", dtype=object)
    out[np.abs(relative - 0.5) <= th.shared] = "shared"
    out[relative < th.exclusive] = "teacher_only"
    out[relative > 1 - th.exclusive] = "student_only"
    return out.astype(str)


class _Totals:
    """Running sums over held-out tokens, float64."""

    def __init__(self, cc: Crosscoder, owner: torch.Tensor | None = None):
        self.n, self.active = 0, 0.0
        self.owner = owner  # (width,) 0 / 1: the model each latent's direction comes from; None: no Latent Scaling
        self.f2 = torch.zeros(cc.width, dtype=torch.float64)  # Σ_i f_ij²
        self.fy = torch.zeros(2, 2, cc.width, dtype=torch.float64)  # (variant, model, latent) Σ_i f_ij ⟨d_j, y_i⟩
        self.fired = torch.zeros(cc.width, dtype=torch.float64)
        self.sse = [0.0 for _ in cc.dims]
        self.sum = [torch.zeros(d, dtype=torch.float64) for d in cc.dims]
        self.sq = [0.0 for _ in cc.dims]

    def add(self, xs: list[torch.Tensor], recon: list[torch.Tensor], codes: torch.Tensor) -> None:
        self.n += codes.shape[0]
        on = (codes > 0).double().cpu()
        self.fired += on.sum(0)
        self.active += float(on.sum())
        for m, (x, r) in enumerate(zip(xs, recon)):
            x, r = x.double().cpu(), r.double().cpu()
            self.sse[m] += float((x - r).pow(2).sum())
            self.sum[m] += x.sum(0)
            self.sq[m] += float(x.pow(2).sum())

    def add_scaling(self, cc: Crosscoder, xs: list[torch.Tensor], recon: list[torch.Tensor], codes: torch.Tensor
                    ) -> None:
        """Latent Scaling's sums (module docstring) over one batch; the models share a width."""
        raw = [w / s for w, s in zip(cc.W_dec, cc.scale)]  # per model (width, d) rows in its own units
        d = torch.where(self.owner.bool().unsqueeze(1), raw[1], raw[0])  # (width, d) each latent's direction
        f = codes.double()
        self.f2 += f.pow(2).sum(0).cpu()
        for m, (x, r) in enumerate(zip(xs, recon)):
            own = (raw[m] * d).sum(1)  # (width,) ⟨d_j, W_dec,m[j]⟩ in m's units
            rec = (r - cc.b_dec[m] / cc.scale[m]) @ d.t()  # (N, width) ⟨d_j, x̂_i − b⟩
            err = (x - r) @ d.t() + codes * own  # (N, width) ⟨d_j, x_i − x̂_i + f_ij W_dec,m[j]⟩
            for v, y in enumerate((rec, err)):
                self.fy[v, m] += (f * y.double()).sum(0).cpu()

    def scaling(self, cc: Crosscoder) -> tuple[np.ndarray, np.ndarray]:
        """``(beta (variant, model, latent), nu (variant, latent))`` (module docstring)."""
        raw = [(w / s).detach().double().cpu() for w, s in zip(cc.W_dec, cc.scale)]
        d2 = torch.where(self.owner.bool().cpu(), raw[1].pow(2).sum(1), raw[0].pow(2).sum(1))  # (width,) ‖d_j‖²
        beta = (self.fy / (d2 * self.f2).clamp_min(1e-300)).cpu().numpy()
        own = self.owner.long().cpu().numpy()
        cols = np.arange(beta.shape[2])
        b_own, b_other = beta[:, own, cols], beta[:, 1 - own, cols]  # (variant, latent)
        with np.errstate(divide="ignore", invalid="ignore"):
            return beta, np.where(np.abs(b_own) > 1e-12, b_other / b_own, np.nan)

    def fve(self) -> np.ndarray:
        total = [sq - float(s.pow(2).sum()) / self.n for sq, s in zip(self.sq, self.sum)]  # Σ‖x − x̄‖²
        return np.array([1 - e / max(t, 1e-300) for e, t in zip(self.sse, total)])


@torch.no_grad()
def crosscoder_diff(cc: Crosscoder, batches: Iterable[list[torch.Tensor]], labels: Sequence[str] = ("teacher", "student"),
                    th: ClassThresholds = ClassThresholds()) -> xr.Dataset:
    """The diff Dataset (module docstring) of ``cc`` on held-out ``batches`` (per-model lists of ``(N, d_m)`` rows).

    ``labels``: the model coord, the teacher first. Provenance is the caller's (``workbench.provenance.stamp``).
    """
    if len(labels) != 2 or len(cc.dims) != 2:
        raise ValueError(f"the diff compares two models (teacher, student); got labels {list(labels)} for "
                         f"a crosscoder over {len(cc.dims)}")
    was_training = cc.training
    cc.eval()
    dev = cc.b_enc.device
    norms = cc.decoder_norms().detach()
    same_space = cc.dims[0] == cc.dims[1]
    totals = _Totals(cc, (norms[1] > norms[0]).long() if same_space else None)
    for xs in batches:
        xs = [x.to(dev).float() for x in xs]
        recon, codes, _ = cc(xs)
        totals.add(xs, recon, codes)
        if same_space:
            totals.add_scaling(cc, xs, recon, codes)
    cc.train(was_training)
    if totals.n == 0:
        raise ValueError("no held-out tokens: pass at least one batch of held-out images")
    return _dataset(cc, totals, list(labels), th)


def _dataset(cc: Crosscoder, totals: _Totals, labels: list[str], th: ClassThresholds) -> xr.Dataset:
    norms = cc.decoder_norms().detach().double().cpu().numpy()  # (2, width)
    relative = norms[1] / np.maximum(norms.sum(0), 1e-300)
    classes = latent_classes(relative, th)
    rate = (totals.fired / totals.n).cpu().numpy()
    dead, dense = rate == 0, rate > th.dense
    ds = xr.Dataset(
        {"decoder_norm": (("model", "latent"), norms), "relative_norm": ("latent", relative),
         "firing_rate": ("latent", rate), "dead": ("latent", dead), "dense": ("latent", dense),
         "fve": ("model", totals.fve()), "l0": ((), totals.active / totals.n)},
        coords={"model": labels, "latent": np.arange(cc.width), "latent_class": ("latent", classes)})
    live = ~dead
    designated = np.arange(cc.width) < getattr(cc, "shared", 0)  # tied by construction: not counted as found shared
    counts = {f"n_{c}": int(((classes == c) & live & ~designated).sum()) for c in LATENT_CLASSES}
    if designated.any():
        ds = ds.assign(designated=("latent", designated), n_designated=((), int(designated.sum())))
    ds = ds.assign({k: ((), v) for k, v in counts.items()} | {"n_dead": ((), int(dead.sum())),
                                                             "n_dense": ((), int(dense.sum()))})
    ds = _with_scaling(ds, cc, totals, classes, live, th)
    ds["relative_norm"].attrs.update(units="1", long_name="‖d_student‖ / (‖d_teacher‖ + ‖d_student‖)")
    ds["fve"].attrs.update(units="1", long_name="fraction of variance explained on held-out tokens")
    ds["nu"].attrs.update(units="1", long_name="Latent Scaling: β(other model) / β(owner)",
                          nan_means="models of different widths, or the owner's β is 0")
    ds["beta"].attrs.update(units="1", nan_means="models of different widths (no shared space)")
    ds["l0"].attrs.update(units="latents per token", long_name="mean active latents per held-out token")
    return ds.assign_attrs(analysis="crosscoder_diff", thresholds=json.dumps(asdict(th)), held_out_tokens=totals.n,
                           width=cc.width, k=cc.k)


def _with_scaling(ds: xr.Dataset, cc: Crosscoder, totals: _Totals, classes: np.ndarray, live: np.ndarray,
                  th: ClassThresholds) -> xr.Dataset:
    """Latent Scaling's ``beta``, ``nu``, ``scaling_verdict`` and ``n_confirmed`` / ``n_in_other`` (module docstring)."""
    exclusive = np.isin(classes, ["teacher_only", "student_only"]) & live
    if totals.owner is None:
        beta, nu = np.full((2, 2, cc.width), np.nan), np.full((2, cc.width), np.nan)
        verdict = np.where(exclusive, "unchecked", "n/a")
    else:
        beta, nu = totals.scaling(cc)
        present = ~(np.nan_to_num(nu, nan=np.inf) < th.scaling).all(0)  # a ratio at or over the bar (or undefined)
        verdict = np.where(exclusive, np.where(present, "in_other", "confirmed"), "n/a")
    variant = ["reconstruction", "error"]
    ds = ds.assign(beta=(("variant", "model", "latent"), beta), nu=(("variant", "latent"), nu),
                   n_confirmed=((), int((verdict == "confirmed").sum())),
                   n_in_other=((), int((verdict == "in_other").sum())))
    return ds.assign_coords(variant=variant, scaling_verdict=("latent", verdict.astype(str)))
