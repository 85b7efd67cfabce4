"""Sparsifiner's training objectives (§3.3, Eq. 7–12) for its two phases (§4).

Paper: Wei et al., "Sparsifiner: Learning Sparse Instance-Dependent Attention for Efficient Vision
Transformers", CVPR 2023.

    L_cls         = CE(y_pred, y)                                        (Eq. 7)
    L_token       = MSE(x, x_teach)         tokens after the last block   (Eq. 8)
    L_cls-distill = KL(y_pred ‖ y_teach)                                  (Eq. 9)
    L_attn        = MSE(Ã_down W_up, A_teach)                             (Eq. 10)
    L_spa         = Σ_i (w_i^up)²                                         (Eq. 11)
    L = L_cls + λ_token L_token + λ_cls L_cls-distill + λ_attn L_attn + λ_spa L_spa     (Eq. 12)

Phase 1 (:class:`Phase1Loss`): backbone frozen, λ_attn = 1, the rest 0; the paper puts L_spa in
the optimizer as weight decay 0.05 instead of the loss (an explicit ``spa_weight`` is offered).
Phase 2 (:class:`Phase2Loss`): backbone and predictor together with CE, λ_token = λ_cls = 0.5,
λ_attn = 0.

Choices where the paper is silent or cannot be taken literally (all options; defaults stated):

- Phase 1 runs the student with *full* attention (:func:`~.replace.dense_attention`, as the
  authors' code does during attention reconstruction). With the backbone frozen that student is
  the teacher, so A_teach is the student's own full attention — no second forward (pass
  ``teacher=`` to take it from a separate model instead).
- Eq. 10 with the thresholded Ã_down cannot train from initialisation: W_down starts near 0, so
  A_down ≈ 1/n_down < τ everywhere (n_down = 32, τ = 0.05) and every coefficient, hence every
  gradient, is 0. ``recon="raw"`` (default, the authors' code) distils A_down W_up; the literal
  form is ``recon="thresholded"``.
- MSE is the mean over batch, heads, patch query rows and keys, averaged over layers; the prefix
  (CLS) query rows are not predicted and not compared (the code drops them too).
- Eq. 8 compares the patch tokens after the final norm (the code's ``features``); CLS is covered by Eq. 9.
- Eq. 9 as printed is KL(y_pred ‖ y_teach); the code computes KL(y_teach ‖ y_pred) (``kl_direction``).
- In phase 2 with λ_attn = 0 the predictor receives **no gradient**: the mask is a top-k indicator
  (Eq. 3) and the code detaches it. "Jointly" then means that the backbone adapts to the phase-1
  predictor; set ``attn_weight > 0`` to keep distilling the predictor to the dense teacher.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..hooks import run_with_cache
from ..train import unwrap as _unwrap
from .attention import SparsifinerAttention
from .config import KLDirection, Recon
from .replace import dense_attention


def _logits(out) -> torch.Tensor:
    """Class logits of a timm forward; a distilled DeiT in distilled-training mode gives a pair."""
    return sum(out) / len(out) if isinstance(out, (tuple, list)) else out


def _attentions(model: nn.Module) -> list[tuple[str, int, SparsifinerAttention]]:
    """``(module path, block index, attention)`` — paths as the model names them (``module.`` under DDP)."""
    out = []
    for path, mod in model.named_modules():
        if isinstance(mod, SparsifinerAttention):
            out.append((path, int(path.split("blocks.")[-1].split(".")[0]), mod))
    if not out:
        raise ValueError(f"{type(_unwrap(model)).__name__} has no Sparsifiner attention; call replace_attention first")
    return out


def _recon_names(path: str, recon: Recon) -> str:
    return f"{path}.predictor.hook_a_down" if recon == "raw" else f"{path}.predictor.hook_score"


def _reconstruction(cache: dict, path: str, attn: SparsifinerAttention, recon: Recon) -> torch.Tensor:
    """The predictor's approximation of the patch rows of the attention: ``(B, H, T-P, T)``."""
    if recon == "raw":
        return cache[_recon_names(path, recon)] @ attn.predictor.w_up  # A_down W_up
    return cache[_recon_names(path, recon)]  # Ã_down W̃_up, the score map of Eq. 3


def attention_distillation(
    model: nn.Module, cache: dict, targets: dict[int, torch.Tensor], recon: Recon = "raw"
) -> torch.Tensor:
    """Eq. 10 averaged over layers: mean squared error of each predictor's reconstruction to ``targets``.

    Args:
        model: the student (its Sparsifiner attentions).
        cache: from ``run_with_cache(..., detach=False)`` holding the predictors' values (see :func:`recon_hook_names`).
        targets: block index -> the teacher's attention ``(B, H, T, T)`` (all rows; prefix rows are dropped).
        recon: "raw" (A_down W_up) or "thresholded" (Ã_down W̃_up).
    """
    total, found = None, _attentions(model)
    for path, i, attn in found:
        approx = _reconstruction(cache, path, attn, recon)
        err = F.mse_loss(approx, targets[i][:, :, attn.num_prefix_tokens:].detach())
        total = err if total is None else total + err
    return total / len(found)


def recon_hook_names(model: nn.Module, recon: Recon = "raw") -> list[str]:
    """Hook names :func:`attention_distillation` needs in its cache."""
    if recon not in ("raw", "thresholded"):
        raise ValueError(f"recon must be 'raw' or 'thresholded', got {recon!r}")
    return [_recon_names(path, recon) for path, _, _ in _attentions(model)]


def basis_l2(model: nn.Module) -> torch.Tensor:
    """L_spa (Eq. 11): Σ over layers and entries of W_up² (the raw parameter)."""
    return sum((a.predictor.w_up ** 2).sum() for _, _, a in _attentions(model))


@torch.no_grad()
def teacher_attention(teacher: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
    """``(logits, tokens after the final norm, {block: attention (B, H, T, T)})`` of a dense timm ViT."""
    tokens: list[torch.Tensor] = []
    handle = _unwrap(teacher).norm.register_forward_hook(lambda _m, _i, out: tokens.append(out))
    try:
        logits, cache = run_with_cache(teacher, images, names="blocks.*.attn.hook_pattern")
    finally:
        handle.remove()
    attn = {int(k.split(".")[1]): v for k, v in cache.items()}
    return _logits(logits), tokens[-1], attn


class Phase1Loss(nn.Module):
    """Phase 1: ``(model, images, targets) -> (loss, parts)`` with λ_attn · Eq. 10 (+ λ_spa · Eq. 11).

    Use with :func:`~.replace.freeze_for_phase1` and ``methods.train.fit`` (weight decay 0.05 plays
    the role of L_spa, §3.3). ``parts``: ``attn`` (and ``spa`` when ``spa_weight > 0``). Targets are unused.

    Args:
        attn_weight: λ_attn.
        spa_weight: λ_spa of an explicit Σ W_up² term.
        recon: see :data:`~.config.Recon`.
        teacher: a dense ViT to take A_teach from; None (default): the student's own full attention,
            which is the teacher's while the backbone is frozen (module docstring).
    """

    def __init__(self, attn_weight: float = 1.0, spa_weight: float = 0.0, recon: Recon = "raw",
                 teacher: nn.Module | None = None):
        super().__init__()
        if recon not in ("raw", "thresholded"):
            raise ValueError(f"recon must be 'raw' or 'thresholded', got {recon!r}")
        self.attn_weight, self.spa_weight, self.recon = attn_weight, spa_weight, recon
        self.teacher = teacher.eval().requires_grad_(False) if teacher is not None else None

    def train(self, mode: bool = True) -> Phase1Loss:
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()
        return self

    def forward(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        found = _attentions(model)
        names = recon_hook_names(model, self.recon)
        if self.teacher is None:
            names += [f"{path}.hook_pattern_full" for path, _, _ in found]
        with dense_attention(model):
            _, cache = run_with_cache(model, images, names=names, detach=False)
        if self.teacher is None:
            attn_t = {i: cache[f"{path}.hook_pattern_full"] for path, i, _ in found}
        else:
            attn_t = teacher_attention(self.teacher, images)[2]
        attn = attention_distillation(model, cache, attn_t, self.recon)
        loss = self.attn_weight * attn
        parts = {"attn": attn.detach()}
        if self.spa_weight > 0:
            spa = basis_l2(model)
            parts["spa"] = spa.detach()
            loss = loss + self.spa_weight * spa
        return loss, parts


class Phase2Loss(nn.Module):
    """Phase 2: ``(model, images, targets) -> (loss, parts)`` with CE + λ_token Eq. 8 + λ_cls Eq. 9 (+ λ_attn Eq. 10).

    Works for any student (Sparsifiner or the Linformer baseline, trained "under identical
    settings", §4). ``parts``: ``ce``, ``token``, ``kl`` (when their weights are > 0) and ``attn``.

    Args:
        teacher: the dense pretrained ViT; kept frozen in eval mode.
        token_weight: λ_token.
        cls_weight: λ_cls.
        attn_weight: λ_attn (0 in the paper's phase 2; the predictor then gets no gradient).
        kl_direction: see :data:`~.config.KLDirection`.
        recon: Eq. 10's reconstruction when ``attn_weight > 0``.
        label_smoothing: for the cross-entropy.
    """

    def __init__(self, teacher: nn.Module, token_weight: float = 0.5, cls_weight: float = 0.5, attn_weight: float = 0.0,
                 kl_direction: KLDirection = "pred_teach", recon: Recon = "raw", label_smoothing: float = 0.0):
        super().__init__()
        if kl_direction not in ("pred_teach", "teach_pred"):
            raise ValueError(f"kl_direction must be 'pred_teach' (paper) or 'teach_pred' (authors' code), got {kl_direction!r}")
        if recon not in ("raw", "thresholded"):
            raise ValueError(f"recon must be 'raw' or 'thresholded', got {recon!r}")
        self.teacher = teacher.eval().requires_grad_(False)
        self.token_weight, self.cls_weight, self.attn_weight = token_weight, cls_weight, attn_weight
        self.kl_direction, self.recon, self.label_smoothing = kl_direction, recon, label_smoothing

    def train(self, mode: bool = True) -> Phase2Loss:
        super().train(mode)
        self.teacher.eval()  # the teacher never trains
        return self

    def forward(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self.teacher.training:
            self.teacher.eval()
        inner = _unwrap(model)
        prefix = int(getattr(inner, "num_prefix_tokens", 1))
        tokens: list[torch.Tensor] = []
        handle = inner.norm.register_forward_hook(lambda _m, _i, out: tokens.append(out))
        try:
            if self.attn_weight > 0:
                out, cache = run_with_cache(model, images, names=recon_hook_names(model, self.recon), detach=False)
            else:
                out, cache = model(images), {}
        finally:
            handle.remove()
        logits = _logits(out)
        t_logits, t_tokens, t_attn = teacher_attention(self.teacher, images) if self.attn_weight > 0 else self._teacher(images)
        ce = F.cross_entropy(logits, targets, label_smoothing=self.label_smoothing)
        loss, parts = ce, {"ce": ce.detach()}
        if self.token_weight > 0:
            token = F.mse_loss(tokens[-1][:, prefix:], t_tokens[:, prefix:])  # (B, T-P, D) patch tokens
            loss, parts["token"] = loss + self.token_weight * token, token.detach()
        if self.cls_weight > 0:
            log_s, log_t = F.log_softmax(logits, dim=-1), F.log_softmax(t_logits, dim=-1)
            if self.kl_direction == "pred_teach":  # Σ p_s (log p_s − log p_t)
                kl = F.kl_div(log_t, log_s, reduction="batchmean", log_target=True)
            else:  # Σ p_t (log p_t − log p_s)
                kl = F.kl_div(log_s, log_t, reduction="batchmean", log_target=True)
            loss, parts["kl"] = loss + self.cls_weight * kl, kl.detach()
        if self.attn_weight > 0:
            attn = attention_distillation(model, cache, t_attn, self.recon)
            loss, parts["attn"] = loss + self.attn_weight * attn, attn.detach()
        return loss, parts

    @torch.no_grad()
    def _teacher(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        feats = self.teacher.forward_features(images)
        return _logits(self.teacher.forward_head(feats)), feats, {}
