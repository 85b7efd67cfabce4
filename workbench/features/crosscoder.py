"""A BatchTopK crosscoder over two models' activations (Lindsey et al. 2024; Minder et al. 2025, arXiv 2504.02922).

One dictionary of ``width`` latents reads both models and writes both: model ``m``'s activation ``x_m`` (``d_m``
wide; the two widths may differ) is scaled by a fixed per-model factor that makes its token variance
``E‖x_m − E x_m‖²`` equal to 1 — so a latent that explains the same share of each model's variance has equal decoder
norms in both, whatever the widths, and the relative decoder norm compares shares — and

    f(x) = ReLU( Σ_m (x_m − b_dec,m) W_enc,m + b_enc )                       (N, width)
    x̂_m  = f_sparse(x) W_dec,m + b_dec,m                                     (N, d_m)

Sparsity is BatchTopK (Bussmann et al. 2024, arXiv 2412.06410) with the crosscoder's score: a batch of ``N`` tokens
keeps its ``k·N`` largest values of ``f_j(x) · Σ_m ‖W_dec,m[j]‖`` (Minder et al.'s selection: a latent counts as much
as it writes into both models), so the mean L0 is ``k`` while a token may use more or fewer latents. After training,
and whenever :attr:`Crosscoder.training` is off, a latent fires where its score passes :attr:`Crosscoder.threshold`,
the running mean of the smallest score kept per training batch, so a token's code no longer depends on its batch.

BatchTopK alone puts no price on a decoder row: a latent for a feature only the teacher has may keep a student row
that mops up other latents' errors on its tokens, and two exclusive features that never co-occur (one per model) can
merge into one "shared" latent whose rows cancel each other elsewhere — on a tiny ViT with a planted teacher-only
and student-only feature, BatchTopK alone read their relative norms as 0.3-0.47 and 0.5-0.6. So training adds
Lindsey et al.'s sparsity term with a small weight, ``norm_coef · Σ_j f_j Σ_m ‖W_dec,m[j]‖`` (the L0 budget stays
BatchTopK's): a row that buys little reconstruction shrinks, and the planted latents read 0.02-0.06 and 0.93-0.97
(seeds 0-2; 0.37 and 0.54 with ``norm_coef=0``).
Latent Scaling (:mod:`~workbench.features.diff`) then checks that an exclusive latent was not shrunk too far.

Designated shared latents (``shared = N``, default 0: none): the first ``N`` latents have one decoder vector tied
across the models (``W_dec,m[j]`` equal for every ``m``, in the scaled units: the same direction and the same share of
each model's variance) and no decoder-norm penalty, so the features both models carry need not pay for two rows —
the update Minder et al. 2025 (arXiv 2504.02922) take from Mishra-Sharma et al. 2025 ("Insights on Crosscoder Model
Diffing"), where shared latents are tied and their sparsity penalty reduced; here it is lifted. The rows are tied by
construction: equal at initialisation, and :meth:`Crosscoder.tie_grads` gives each model's row the sum of their
gradients (the gradient of one tied vector) before every optimizer step, so Adam moves them alike. A tied latent's
relative norm is ½ by construction: the diff counts designated latents apart (``n_designated``), never as shared.
Needs models of one width at the block (a vector has no place in another space).

Dead latents (not selected for ``dead_after`` tokens) learn from the AuxK loss of Gao et al. 2024: their top
``aux_k`` pre-activations reconstruct the main reconstruction's error.

Why our own module: ``overcomplete`` 0.3.0 (the latest) has a BatchTopK SAE but no per-model decoders, keeps its
threshold outside the state dict, and cannot be imported with matplotlib ≥ 3.9 (its package ``__init__`` builds
colour maps with the removed ``matplotlib.cm.get_cmap``); ``dictionary-learning`` 0.1.0 on PyPI has no crosscoder
(the BatchTopK crosscoder lives in an unreleased fork) and pins nnsight < 0.4, wandb and datasets; ``sae-lens``
builds on TransformerLens's language models and has no crosscoder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["CrosscoderConfig", "Crosscoder", "save_crosscoder", "load_crosscoder", "config_dict"]


@dataclass(frozen=True)
class CrosscoderConfig:
    """The dictionary and its training."""

    width: int = 512  # number of latents (the dictionary's size)
    k: int = 16  # mean number of active latents per token (BatchTopK keeps k × tokens per batch)
    lr: float = 4e-3  # Adam learning rate (demo pair, 1 epoch: FVE 0.91 / 0.93 at 1e-3, 0.94 / 0.95 at 4e-3)
    epochs: int = 1  # passes over the training images
    batch_images: int = 32  # images per step (all their tokens form one BatchTopK batch)
    aux_k: int = 64  # dead latents that reconstruct the error in the AuxK loss
    aux_coef: float = 0.1  # weight of the AuxK loss (Gao et al. 2024); demo pair, 1 epoch: 24 % of 512 latents dead at
    # 1/32, 9 % at 0.1, 8 % at 0.25
    dead_after: int = 5_000  # tokens without firing after which a latent counts as dead (for AuxK)
    threshold_momentum: float = 0.9  # running mean of the smallest kept score (the inference threshold; 0.99
    # remembered the first steps, whose scores are small while the decoders grow: L0 34 at k = 16 on the demo)
    init_norm: float = 0.1  # initial decoder-row norm per model (encoder = decoder transposed)
    seed: int = 0  # initialisation and image order
    checkpoint_every: int = 50  # steps between checkpoints (and always at the end)
    norm_coef: float = 0.03  # weight of Lindsey et al.'s decoder-norm penalty Σ_j f_j Σ_m ‖W_dec,m[j]‖ (0: none)
    shared: int = 0  # designated shared latents (the first ones): one decoder tied across models, no norm penalty

    def __post_init__(self) -> None:
        if self.width < 1 or self.k < 1 or self.k > self.width:
            raise ValueError(f"need 1 <= k <= width, got k={self.k}, width={self.width}")
        if self.epochs < 1 or self.batch_images < 1 or self.lr <= 0:
            raise ValueError("epochs, batch_images and lr must be positive")
        if not 0 <= self.shared < self.width:
            raise ValueError(f"need 0 <= shared < width (designated shared latents), got shared={self.shared}, "
                             f"width={self.width}")


def config_dict(cfg: CrosscoderConfig) -> dict:
    """The config as a dict for stores and checkpoints; ``shared`` only when set, so a checkpoint or store written
    before the option existed reads (and resumes) as ``shared=0``."""
    d = asdict(cfg)
    if not d["shared"]:
        del d["shared"]
    return d


class Crosscoder(nn.Module):
    """BatchTopK crosscoder over ``len(dims)`` models (module docstring); inputs are lists of ``(N, d_m)`` tensors."""

    def __init__(self, dims: tuple[int, ...], width: int, k: int, *, init_norm: float = 0.1,
                 threshold_momentum: float = 0.99, generator: torch.Generator | None = None, shared: int = 0):
        super().__init__()
        self.dims, self.width, self.k, self.momentum = tuple(int(d) for d in dims), int(width), int(k), threshold_momentum
        self.shared = int(shared)  # designated shared latents: the first `shared` rows of W_dec, tied across models
        if self.shared and len(set(self.dims)) > 1:
            raise ValueError(f"designated shared latents tie one decoder vector across the models, whose widths differ "
                             f"here ({self.dims}); train without them (shared=0)")
        dec = [F.normalize(torch.randn(width, d, generator=generator), dim=1) * init_norm for d in self.dims]
        if self.shared:  # tied rows start equal (no extra draws: shared=0 is unchanged)
            for w in dec[1:]:
                w[:self.shared] = dec[0][:self.shared]
        self.W_dec = nn.ParameterList([nn.Parameter(w) for w in dec])  # per model (width, d_m)
        self.W_enc = nn.ParameterList([nn.Parameter(w.t().clone()) for w in dec])  # per model (d_m, width)
        self.b_dec = nn.ParameterList([nn.Parameter(torch.zeros(d)) for d in self.dims])  # per model (d_m,)
        self.b_enc = nn.Parameter(torch.zeros(width))  # (width,)
        self.register_buffer("scale", torch.ones(len(dims)))  # per-model input factor, set by fit_scale
        self.register_buffer("threshold", torch.tensor(-1.0))  # inference threshold on scores; < 0: unset

    @torch.no_grad()
    def fit_scale(self, xs: list[torch.Tensor]) -> None:
        """Set each model's input factor (unit token variance after it) and its decoder bias to the scaled mean."""
        for m, x in enumerate(xs):
            x = x.float()
            self.scale[m] = (x - x.mean(0)).pow(2).sum(1).mean().clamp_min(1e-12).rsqrt()
            self.b_dec[m].copy_(x.mean(0) * self.scale[m])

    @torch.no_grad()
    def tie_grads(self) -> None:
        """Give every model's designated shared rows the sum of their gradients (call between backward and step)."""
        if not self.shared:
            return
        grads = [w.grad[:self.shared] for w in self.W_dec if w.grad is not None]
        if not grads:
            return
        total = torch.stack(grads).sum(0)
        for w in self.W_dec:
            if w.grad is None:
                w.grad = torch.zeros_like(w)
            w.grad[:self.shared] = total

    def penalised_norms(self) -> torch.Tensor:
        """``(width,)`` Σ_m ‖W_dec,m[j]‖, 0 for the designated shared latents (the decoder-norm penalty's weights)."""
        norms = self.decoder_norms().sum(0)
        if self.shared:
            norms = torch.cat([torch.zeros_like(norms[:self.shared]), norms[self.shared:]])
        return norms

    def decoder_norms(self) -> torch.Tensor:
        """``(models, width)`` the norm of each latent's decoder row in each model (in scaled units)."""
        return torch.stack([w.norm(dim=1) for w in self.W_dec])

    def pre(self, xs: list[torch.Tensor]) -> torch.Tensor:
        """``(N, width)`` the ReLU pre-codes, before sparsity."""
        h = self.b_enc + sum((x * self.scale[m] - self.b_dec[m]) @ self.W_enc[m] for m, x in enumerate(xs))
        return F.relu(h)

    def encode(self, xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes, pre)``, both ``(N, width)``: BatchTopK in training, the threshold otherwise."""
        pre = self.pre(xs)
        score = pre * self.decoder_norms().sum(0)
        if self.training or self.threshold < 0:
            n_keep = min(self.k * pre.shape[0], score.numel())
            kept = torch.topk(score.flatten(), n_keep, sorted=False)
            mask = torch.zeros_like(score.flatten()).scatter_(0, kept.indices, 1.0).view_as(score)
            if self.training:
                lowest = kept.values.min().detach()
                self.threshold.copy_(lowest if self.threshold < 0 else self.momentum * self.threshold
                                     + (1 - self.momentum) * lowest)
        else:
            mask = (score > self.threshold).to(pre.dtype)
        return pre * mask, pre

    def decode(self, codes: torch.Tensor) -> list[torch.Tensor]:
        """Per model ``(N, d_m)`` reconstructions in the models' own units (the input factor undone)."""
        return [(codes @ w + b) / s for w, b, s in zip(self.W_dec, self.b_dec, self.scale)]

    def forward(self, xs: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """``(reconstructions, codes, pre)``."""
        codes, pre = self.encode(xs)
        return self.decode(codes), codes, pre


def save_crosscoder(cc: Crosscoder, path: str | Path, extra: dict[str, torch.Tensor] | None = None,
                    metadata: dict[str, str] | None = None) -> Path:
    """Write the crosscoder (and ``extra`` tensors, e.g. optimizer state) to a safetensors file, atomically."""
    from workbench.runtime import atomic_save_safetensors

    meta = {"dims": json.dumps(cc.dims), "width": str(cc.width), "k": str(cc.k), "momentum": str(cc.momentum),
            **({"shared": str(cc.shared)} if cc.shared else {}), **(metadata or {})}
    tensors = {f"cc.{k}": v for k, v in cc.state_dict().items()}
    tensors.update({f"extra.{k}": v for k, v in (extra or {}).items()})
    return atomic_save_safetensors(tensors, path, metadata=meta)


def load_crosscoder(path: str | Path, device: str | torch.device = "cpu"
                    ) -> tuple[Crosscoder, dict[str, torch.Tensor], dict[str, str]]:
    """``(crosscoder, extra tensors, metadata)`` from :func:`save_crosscoder`'s file (no unpickling)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device=str(device)) as f:
        meta = dict(f.metadata() or {})
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if "dims" not in meta:
        raise ValueError(f"{path} is not a crosscoder checkpoint (no 'dims' metadata); train one with train_crosscoder")
    cc = Crosscoder(tuple(json.loads(meta["dims"])), int(meta["width"]), int(meta["k"]),
                    threshold_momentum=float(meta["momentum"]), shared=int(meta.get("shared", 0)))
    cc.load_state_dict({k[3:]: v for k, v in tensors.items() if k.startswith("cc.")})
    return cc.to(device), {k[6:]: v for k, v in tensors.items() if k.startswith("extra.")}, meta

