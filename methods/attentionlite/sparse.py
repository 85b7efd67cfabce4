"""Sparse momentum (Dettmers & Zettlemoyer 2019), AttentionLite's pruning (§3, Algorithm 1).

The student trains sparse from the first step, at a fixed global budget of non-zero weights:

1. **Initial masks** (Alg. 1 lines 3–5): random, at the target parameter density ``d`` in every layer
   (Dettmers' ``enforce_density_per_layer``; exact counts here, not Bernoulli draws).
2. **After every optimizer step** (line 11): weights outside the mask are set to zero again.
3. **After every epoch** but the last (lines 14–22), with prune rate ``p_e``:
   - each layer's *momentum contribution* ``μ^l`` = mean ``|m|`` of the momentum over its active
     weights, normalised over layers (Dettmers' ``momentum_redistribution``);
   - each layer loses ``⌈p_e · active^l⌉`` of its active units with the smallest magnitude
     (always keeping one, as the initial masks do: no layer is ever cut off);
   - the freed budget is regrown across layers in proportion to ``μ^l`` (capped by each layer's free
     units, the overflow redistributed), choosing in each layer the inactive units with the largest
     momentum magnitude; regrown weights start at zero.
   - ``p_e`` decays to 0 over the run: linearly (Alg. 1 line 16, the default) or with a cosine
     (Dettmers' code), ``p_e = p_0 · s(e / (E - 1))``.
   There is no update after the last epoch: it would prune trained weights and regrow zeros that no
   step trains. By default the update decided at the end of epoch e runs after the first step of
   epoch e + 1 (``update_at``), so per-epoch evaluations see trained, not freshly regrown, weights.

Units (``Pruning``):

- ``"irregular"``: single weights; the score is ``|w|`` (prune) and ``|m|`` (regrow).
- ``"column"`` (§3, column pruning): the weight viewed as ``C_out`` rows × ``C_in·k·k`` columns; a unit is
  a column, scored by its squared Frobenius norm ``O_{c,k_h,k_w} = ‖W[:, c, k_h, k_w]‖²`` (prune) and
  that of its momentum (regrow). For a 1×1 layer a column is an input channel; for the fused
  ``qkv`` projection it is an input channel of q, k and v together, so a pruned column frees the
  channel that produces it (see :func:`methods.attentionlite.shrink`).

Budget: ``B = round(d · N)`` over the ``N`` prunable weights. Irregular masks hold exactly ``B``
weights after initialisation and after every update; column masks hold ``K ≤ B`` with
``B − K`` smaller than the widest layer's column (a column is ``C_out`` weights).

Pruned layers (the paper is silent; Dettmers, whose scheme it adopts, prunes every convolution and
linear weight and no bias / norm): every ``nn.Conv2d`` and ``nn.Linear`` weight, i.e. the stem
convolution, the 1×1 convolutions, the attention's fused ``qkv``, the shortcut projections and the
classifier. Relative position embeddings, norms and biases stay dense. ``exclude`` (fnmatch patterns
of module names) removes layers, e.g. ``("conv1", "fc")`` for the first and last layers.

Momentum: SGD's ``momentum_buffer``; Adam / AdamW's first moment ``exp_avg`` (``adam_normalize=True``
uses Dettmers' ``exp_avg / (√exp_avg_sq + 1e-8)`` instead).
"""

from __future__ import annotations

import fnmatch
import math
from typing import Literal

import torch
import torch.nn as nn

from methods.train import TrainHook

__all__ = ["Pruning", "Decay", "UpdateAt", "PRUNINGS", "prunable_layers", "check_density", "check_pruning", "prune_rate",
           "SparseMomentum", "column_masks_from_weights", "weight_masks_density"]

Pruning = Literal["irregular", "column"]
Decay = Literal["linear", "cosine"]
UpdateAt = Literal["next_step", "epoch_end"]
PRUNINGS: tuple[str, ...] = ("irregular", "column")


def check_density(density: float) -> float:
    """``density`` as a float in (0, 1], or a ValueError saying so."""
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not math.isfinite(density) \
            or not 0.0 < density <= 1.0:
        raise ValueError(f"density must be a number in (0, 1] (the fraction of prunable weights kept), got {density!r}")
    return float(density)


def check_pruning(pruning: str) -> str:
    if pruning not in PRUNINGS:
        raise ValueError(f"unknown pruning kind {pruning!r}; choose 'irregular' (single weights) or 'column' "
                         "(columns of the C_out × C_in·k·k weight matrix, AttentionLite §3)")
    return pruning


def prunable_layers(model: nn.Module, exclude: tuple[str, ...] | list[str] = ()) -> dict[str, nn.Module]:
    """The layers sparse momentum prunes: every ``nn.Conv2d`` / ``nn.Linear`` not matching an ``exclude`` pattern."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, (nn.Conv2d, nn.Linear)) and not any(fnmatch.fnmatchcase(name, p) for p in exclude)}


def prune_rate(p0: float, update: int, epochs: int, decay: Decay = "linear") -> float:
    """``p_e`` of the update after epoch ``update`` (0-based) of an ``epochs``-long run: ``p_0 · s(e / (E − 1))``."""
    if epochs <= 1:
        return 0.0
    t = min(max(update / (epochs - 1), 0.0), 1.0)
    if decay == "linear":
        return p0 * (1.0 - t)
    if decay == "cosine":
        return p0 * 0.5 * (1.0 + math.cos(math.pi * t))
    raise ValueError(f"unknown prune-rate decay {decay!r}; choose 'linear' (Algorithm 1) or 'cosine' (Dettmers)")


def _units(weight: torch.Tensor, pruning: str) -> tuple[int, int]:
    """(number of units, weights per unit) of a weight under ``pruning``."""
    if pruning == "irregular":
        return weight.numel(), 1
    return weight[0].numel(), weight.shape[0]  # columns: C_in·k·k of C_out weights


def _unit_scores(t: torch.Tensor, pruning: str) -> torch.Tensor:
    """Per-unit score of a weight-shaped tensor: ``|t|`` (irregular) or the column's ``‖t[:, col]‖²``."""
    if pruning == "irregular":
        return t.detach().abs().flatten()
    return t.detach().reshape(t.shape[0], -1).pow(2).sum(0)


def _expand(unit_mask: torch.Tensor, shape: tuple[int, ...] | torch.Size, pruning: str) -> torch.Tensor:
    """A weight-shaped bool mask (a view) from a flat unit mask."""
    if pruning == "irregular":
        return unit_mask.view(shape)
    return unit_mask.view(1, *shape[1:]).expand(shape)


def _allocate(share: list[float], capacity: list[int], size: list[int], budget: int,
              start: list[int] | None = None) -> list[int]:
    """Units per layer, ≤ capacity, about ``share`` of ``budget`` weights each, filling the budget.

    Proportional water-filling (overflow of full layers goes to the others), then a greedy fill of
    what rounding left, largest share first. Leaves less than one unit of every layer with room.
    ``start``: units every layer has from the outset (counted in the budget).
    """
    n = len(share)
    units = list(start) if start is not None else [0] * n
    remaining = budget - sum(u * s for u, s in zip(units, size))
    for _ in range(n + 1):
        open_ = [i for i in range(n) if units[i] < capacity[i] and size[i] <= remaining]
        if not open_:
            break
        tot = sum(share[i] for i in open_)
        weights = {i: (share[i] / tot if tot > 0 else 1.0 / len(open_)) for i in open_}
        added = 0
        for i in open_:
            want = min(capacity[i] - units[i], int(weights[i] * remaining // size[i]))
            units[i] += want
            added += want * size[i]
        remaining -= added
        if added == 0:
            break
    for i in sorted(range(n), key=lambda i: -share[i]):
        take = min(capacity[i] - units[i], remaining // size[i])
        if take > 0:
            units[i] += take
            remaining -= take * size[i]
    return units


class SparseMomentum(TrainHook):
    """Sparse momentum as a :class:`methods.train.TrainHook` (module docstring).

    Creating it draws the initial masks and applies them to ``model`` at once.

    Args:
        model: the student (its prunable layers are fixed now; pass the same model to ``fit``).
        density: target parameter density ``d`` in (0, 1].
        pruning: "irregular" or "column".
        epochs: length of the run (the prune rate decays to 0 over it; updates after epochs 0 … E−2).
        prune_rate: ``p_0`` (Dettmers: 0.5; the paper gives none).
        decay: "linear" (Algorithm 1, line 16) or "cosine" (Dettmers).
        exclude: fnmatch patterns of layer names left dense.
        adam_normalize: with Adam-type optimizers read ``exp_avg / √exp_avg_sq`` (Dettmers) instead of ``exp_avg``.
        seed: seeds the random initial masks.
        update_at: "next_step" (default) runs the update scheduled at the end of epoch e right after
            the first optimizer step of epoch e + 1, so that an epoch's evaluation (which ``fit`` runs
            after the hooks' ``on_epoch_end``) sees the model trained under that epoch's masks;
            "epoch_end" runs it in ``on_epoch_end`` (Algorithm 1 literally: the evaluation then sees
            half-pruned layers with zero-valued regrown weights, which in short runs reads as a
            collapse of the accuracy curve).

    Attributes:
        masks: layer name -> flat bool unit mask (``(C_out·C_in·k·k,)`` irregular, ``(C_in·k·k,)`` column).
        updates: prune/regrow updates done so far.
        budget: ``B``, the number of weights kept.

    Raises:
        ValueError: a density outside (0, 1], an unknown pruning kind or decay, no prunable layer.
    """

    def __init__(self, model: nn.Module, density: float, pruning: Pruning = "irregular", *, epochs: int,
                 prune_rate: float = 0.5, decay: Decay = "linear", exclude: tuple[str, ...] = (),
                 adam_normalize: bool = False, seed: int = 0, update_at: UpdateAt = "next_step"):
        self.density = check_density(density)
        self.pruning = check_pruning(pruning)
        if decay not in ("linear", "cosine"):
            raise ValueError(f"unknown prune-rate decay {decay!r}; choose 'linear' (Algorithm 1) or 'cosine' (Dettmers)")
        if not 0.0 <= prune_rate < 1.0:
            raise ValueError(f"prune_rate must be in [0, 1), got {prune_rate}")
        if epochs < 1:
            raise ValueError(f"epochs must be ≥ 1, got {epochs}")
        self.epochs, self.p0, self.decay, self.exclude = int(epochs), float(prune_rate), decay, tuple(exclude)
        self.adam_normalize = adam_normalize
        layers = prunable_layers(model, self.exclude)
        if not layers:
            raise ValueError(f"{type(model).__name__} has no nn.Conv2d / nn.Linear layer to prune (exclude={self.exclude})")
        self.names = list(layers)
        shapes = {n: m.weight.shape for n, m in layers.items()}
        self.n_units = {n: _units(m.weight, pruning)[0] for n, m in layers.items()}
        self.unit_size = {n: _units(m.weight, pruning)[1] for n, m in layers.items()}
        self.total = sum(math.prod(s) for s in shapes.values())
        self.budget = round(self.density * self.total)
        self.updates = 0
        if update_at not in ("next_step", "epoch_end"):
            raise ValueError(f"update_at must be 'next_step' or 'epoch_end', got {update_at!r}")
        self.update_at = update_at
        self.pending: float | None = None  # prune rate of an update scheduled for the next step
        gen = torch.Generator().manual_seed(seed)
        sizes = [self.unit_size[n] for n in self.names]
        caps = [self.n_units[n] for n in self.names]
        # every layer keeps at least one unit (as after every update), the rest uniformly by size
        count = _allocate([c * s / self.total for c, s in zip(caps, sizes)], caps, sizes, self.budget, [1] * len(caps))
        self.masks: dict[str, torch.Tensor] = {}
        for name, k in zip(self.names, count):
            m = torch.zeros(self.n_units[name], dtype=torch.bool)
            m[torch.randperm(self.n_units[name], generator=gen)[:k]] = True
            self.masks[name] = m
        self.apply(model)

    # ---------------------------------------------------------------- masks

    def _layers(self, model: nn.Module) -> dict[str, nn.Module]:
        model = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        cached = getattr(self, "_cache", None)
        if cached is not None and cached[0] is model:
            return cached[1]
        layers = dict(model.named_modules())
        missing = [n for n in self.names if n not in layers]
        if missing:
            raise ValueError(f"the model has none of the masked layers {missing[:4]}: pass the model the hook was made for")
        self._cache = (model, {n: layers[n] for n in self.names})
        return self._cache[1]

    def weight_masks(self) -> dict[str, torch.Tensor]:
        """Layer name -> weight-shaped bool mask (what :func:`methods.attentionlite.shrink` takes)."""
        return {n: _expand(self.masks[n], self._shapes[n], self.pruning).cpu().clone() for n in self.names}

    @torch.no_grad()
    def apply(self, model: nn.Module) -> None:
        """Zero every weight outside its mask (and remember the weight shapes)."""
        layers = self._layers(model)
        self._shapes = {n: tuple(m.weight.shape) for n, m in layers.items()}
        for name, m in layers.items():
            mask = self.masks[name].to(m.weight.device)
            self.masks[name] = mask
            m.weight.mul_(_expand(mask, m.weight.shape, self.pruning))

    def kept(self) -> dict[str, int]:
        """Layer name -> number of kept weights."""
        return {n: int(self.masks[n].sum()) * self.unit_size[n] for n in self.names}

    def realised_density(self) -> float:
        """Kept weights / prunable weights (= ``d`` for irregular masks; within one column for column masks)."""
        return sum(self.kept().values()) / self.total

    def layer_densities(self) -> dict[str, float]:
        """Layer name -> its kept fraction."""
        return {n: k / (self.n_units[n] * self.unit_size[n]) for n, k in self.kept().items()}

    # ---------------------------------------------------------------- TrainHook

    def after_step(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if self.pending is not None:  # the update scheduled at the end of the previous epoch
            rate, self.pending = self.pending, None
            self.prune_regrow(model, optimizer, rate)
        self.apply(model)

    def on_epoch_end(self, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int) -> dict[str, float]:
        rate = 0.0
        if epoch < self.epochs - 1 and self.density < 1.0:
            rate = prune_rate(self.p0, epoch, self.epochs, self.decay)
            if self.update_at == "epoch_end":
                self.prune_regrow(model, optimizer, rate)
            else:
                self.pending = rate
        metrics = {"density": self.realised_density(), "prune_rate": rate}
        metrics.update({f"density/{n}": v for n, v in self.layer_densities().items()})
        return metrics

    def state_dict(self) -> dict:
        return {"masks": {n: m.cpu() for n, m in self.masks.items()}, "updates": self.updates,
                "pruning": self.pruning, "density": self.density, "budget": self.budget,
                "pending": -1.0 if self.pending is None else float(self.pending)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("pruning") != self.pruning or state.get("budget") != self.budget:
            raise ValueError(f"checkpointed sparse-momentum state is for pruning={state.get('pruning')!r}, "
                             f"budget={state.get('budget')} but this hook has {self.pruning!r}, {self.budget}: "
                             "resume with the same --density / --pruning")
        masks = state["masks"]
        if set(masks) != set(self.names):
            raise ValueError("checkpointed masks name other layers than this model's: resume with the same student")
        for n in self.names:
            if masks[n].shape != self.masks[n].shape:
                raise ValueError(f"checkpointed mask of {n} has shape {tuple(masks[n].shape)}, "
                                 f"expected {tuple(self.masks[n].shape)}")
            self.masks[n] = masks[n].to(self.masks[n].device, torch.bool)
        self.updates = int(state["updates"])
        pending = float(state.get("pending", -1.0))
        self.pending = None if pending < 0 else pending

    # ---------------------------------------------------------------- prune and regrow (Alg. 1, 14–22)

    def momentum(self, optimizer: torch.optim.Optimizer, weight: torch.Tensor) -> torch.Tensor:
        """The optimizer's momentum of ``weight`` (module docstring)."""
        state = optimizer.state.get(weight, {})
        if state.get("momentum_buffer") is not None:
            return state["momentum_buffer"]
        if "exp_avg" in state:
            if self.adam_normalize and "exp_avg_sq" in state:
                return state["exp_avg"] / (state["exp_avg_sq"].sqrt() + 1e-8)
            return state["exp_avg"]
        raise ValueError(f"{type(optimizer).__name__} holds no momentum for a masked weight (state keys {sorted(state)}); "
                         "sparse momentum needs SGD with momentum > 0 or an Adam-type optimizer, stepped at least once")

    @torch.no_grad()
    def prune_regrow(self, model: nn.Module, optimizer: torch.optim.Optimizer, rate: float) -> dict[str, int]:
        """One update at prune rate ``rate``; returns layer name -> units regrown."""
        layers = self._layers(model)
        contrib, pruned = {}, {}
        for name, m in layers.items():
            w, mask = m.weight, self.masks[name]
            mom = self.momentum(optimizer, w)
            active_w = _expand(mask, w.shape, self.pruning)
            c = mom.abs()[active_w].mean().item() if active_w.any() else 0.0
            contrib[name] = c if math.isfinite(c) else 0.0
            active = int(mask.sum())
            n_prune = min(math.ceil(rate * active), max(active - 1, 0))
            if n_prune:
                score = _unit_scores(w, self.pruning).masked_fill(~mask, float("inf"))
                drop = torch.topk(score, n_prune, largest=False).indices
                mask = mask.clone()
                mask[drop] = False
                self.masks[name] = mask
            pruned[name] = n_prune
        total_c = sum(contrib.values())
        share = [contrib[n] / total_c if total_c > 0 else 1.0 / len(self.names) for n in self.names]
        caps = [self.n_units[n] - int(self.masks[n].sum()) for n in self.names]
        sizes = [self.unit_size[n] for n in self.names]
        regrow = _allocate(share, caps, sizes, self.budget - sum(self.kept().values()))
        grown = {}
        for name, r in zip(self.names, regrow):
            m, mask = layers[name], self.masks[name]
            if r:
                score = _unit_scores(self.momentum(optimizer, m.weight), self.pruning).masked_fill(mask, float("-inf"))
                new = torch.topk(score, r).indices
                mask = mask.clone()
                mask[new] = True
                self.masks[name] = mask
                m.weight[_expand(torch.zeros_like(mask).index_fill_(0, new, True), m.weight.shape, self.pruning)] = 0.0
            grown[name] = r
        self.apply(model)
        self.updates += 1
        return grown


def column_masks_from_weights(model: nn.Module, exclude: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Weight-shaped column masks read off a trained column-pruned model: a column is kept iff it is non-zero.

    A kept column that happens to be exactly zero reads as pruned (the function is the same either way).
    """
    out = {}
    for name, m in prunable_layers(model, exclude).items():
        w = m.weight.detach()
        cols = w.reshape(w.shape[0], -1).ne(0).any(0)
        out[name] = cols.view(1, *w.shape[1:]).expand_as(w).cpu()
    return out


def weight_masks_density(masks: dict[str, torch.Tensor]) -> float:
    """Kept fraction over all the weights the masks cover."""
    return sum(int(m.sum()) for m in masks.values()) / sum(m.numel() for m in masks.values())
