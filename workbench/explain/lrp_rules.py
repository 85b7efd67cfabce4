"""Layer-wise relevance propagation as Gradient × Input with modified backward rules, written for our forms.

Why not ``lxt``: ``lxt`` 2.1 (the registry's current release) imports ``transformers.modeling_attn_mask_utils``
at ``import lxt``, which transformers 5 (the ``hf`` extra, 5.24) no longer has, and it pulls ``bitsandbytes``,
``accelerate`` and ``open_clip_torch``; its rules come as monkey-patches of the classes of the models it knows
(Llama, BERT, torchvision's ViT: not timm's, not ours). Its rules are small, so they are written here once, in
lxt's own "efficient" form (Achtibat et al., ICML 2024, §3.3 and App. A): the relevance of an input ``x`` is
``x ⊙ ∂̃y_t/∂x`` where ``∂̃`` is autograd with these rules in the backward pass:

- **linear maps** (``linear``, convolutions, sums, pooling, residual adds, affine norms in eval): unchanged, which
  is LRP-ε with ε → 0 (LRP-0); biases absorb their share of the relevance;
- **LayerNorm** (AttnLRP Prop. 3.4 / lxt's ``layer_norm_forward``): the standard deviation is a constant;
- **element-wise non-linearities** (GELU, SiLU): the identity rule (relevance passes through, Eq. 9);
- **products of two input-dependent tensors** (``matmul``, ``bmm``, ``baddbmm``, ``mul``, AttentionLite's
  ``neighbour_dot`` / ``neighbour_mix``: ``q @ kᵀ``, ``A @ v``): the uniform rule (each factor gets half,
  Eq. 7);
- **softmax**: AttnLRP's rule (Prop. 3.3) is Gradient × Input of the softmax itself, so autograd is kept; its bias
  term ``s − J x`` absorbs relevance, which :class:`LRPRules` records (``absorbed``) so that conservation can be
  checked exactly;
- **CP-LRP** (Ali et al., ICML 2022, "XAI for Transformers: Better Explanations through Conservative
  Propagation"): the attention probabilities are constants (``softmax(...).detach()``): relevance flows through
  the values only, and the products of two input-dependent tensors that remain (none in a ViT) get the uniform rule;
- **LSTM** (Arras et al., 2017, "Explaining Recurrent Neural Network Predictions in Sentiment Analysis"): the
  gates are constants ("signal-take-all"), ``tanh`` gets the identity rule, the linear maps LRP-0;
- **α1β0** (``linear_rule="alpha1beta0"``, the rule of Chefer et al., CVPR 2021, Eq. 4): a linear layer or a
  convolution passes relevance in proportion to the positive contributions ``(x_j w_jk)⁺``.

The rules are installed as a :class:`torch.overrides.TorchFunctionMode` over the functions above, so that they
reach every model form (timm's fused attention included: ``scaled_dot_product_attention`` is written out with the
rules) without naming a module type and without changing any module.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["LRPRules", "Variant", "LinearRule"]

Variant = Literal["attnlrp", "cp"]
LinearRule = Literal["epsilon", "alpha1beta0"]

_TINY = 1e-12


def _safe_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.where(b.abs() > _TINY, a / torch.where(b.abs() > _TINY, b, torch.ones_like(b)), torch.zeros_like(a))


class _Identity(torch.autograd.Function):
    """Identity rule: ``y = fn(x)``, backward ``g ⊙ y / x`` (so ``x ⊙ grad = y ⊙ g``: relevance passes through)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(_safe_div(y, x))
        return y.clone()

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return ctx.saved_tensors[0] * g, None


def identity_rule(fn, x: torch.Tensor) -> torch.Tensor:
    return _Identity.apply(x, fn(x.detach()))


class _Scale(torch.autograd.Function):
    """Forward identity, backward × ``factor`` (the uniform rule's ½)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return g * ctx.factor, None


class _AlphaBeta(torch.autograd.Function):
    """α1β0 on ``op(x, w)`` (``F.linear`` / ``F.conv2d`` without bias): ``R_x = Σ (x w)⁺ / Σ (x w)⁺ · R``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b, op, kw) -> torch.Tensor:
        out = op(x, w, b, **kw)
        ctx.save_for_backward(x, w, out)
        ctx.op, ctx.kw = op, kw
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, w, out = ctx.saved_tensors
        op, kw = ctx.op, ctx.kw
        rel = out * g  # the output's relevance, all of it passed on to the inputs (Chefer's Eq. 4)
        xp, xn, wp, wn = x.clamp(min=0), x.clamp(max=0), w.clamp(min=0), w.clamp(max=0)
        with torch.enable_grad():
            xs = [xp.detach().requires_grad_(True), xn.detach().requires_grad_(True)]
            zp = op(xs[0], wp, None, **kw) + op(xs[1], wn, None, **kw)  # Σ_j (x_j w_jk)⁺
            cp, cn = torch.autograd.grad(zp, xs, _safe_div(rel, zp))
        r_in = xp * cp + xn * cn
        return _safe_div(r_in, x), None, None, None, None


class LRPRules(TorchFunctionMode):
    """Within ``with LRPRules(variant):`` the backward pass computes relevance (module docstring).

    Args:
        variant: ``"attnlrp"`` (AttnLRP) or ``"cp"`` (CP-LRP: attention probabilities constant).
        linear_rule: ``"epsilon"`` (LRP-0, AttnLRP's) or ``"alpha1beta0"`` (Chefer et al., CVPR 2021).

    Attributes:
        absorbed: per softmax call, ``(s ⊙ (1 − (x − Σ s x)), probabilities)``: the bias term ``s − J x`` of its
            linearisation (AttnLRP Prop. 3.3); the relevance it absorbs is ``Σ g ⊙ term`` with ``g`` the
            gradient reaching the probabilities. Kept only under ``"attnlrp"`` with ``record=True``.
    """

    def __init__(self, variant: Variant = "attnlrp", linear_rule: LinearRule = "epsilon", record: bool = False):
        super().__init__()
        self.variant, self.linear_rule, self.record = variant, linear_rule, record
        self.absorbed: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "").removesuffix(".default").strip("_")  # custom ops: "name.default"
        rule = getattr(self, f"_rule_{name}", None)
        return rule(func, *args, **kwargs) if rule is not None else func(*args, **kwargs)

    # ------------------------------------------------------------------------------------ rules, by function
    def _rule_layer_norm(self, func, x, shape, weight=None, bias=None, eps=1e-5):
        dims = tuple(range(-len(shape), 0))
        mean = x.mean(dims, keepdim=True)
        std = (x.var(dims, unbiased=False, keepdim=True) + eps).sqrt().detach()  # a constant (AttnLRP Prop. 3.4)
        y = (x - mean) / std
        y = y * weight if weight is not None else y
        return y + bias if bias is not None else y

    def _rule_gelu(self, func, x, *args, **kwargs):
        return identity_rule(lambda t: func(t, *args, **kwargs), x)

    _rule_silu = _rule_gelu

    def _product(self, func, a, b, *args, **kwargs):
        out = func(a, b, *args, **kwargs)
        both = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.requires_grad and b.requires_grad
        return _Scale.apply(out, 0.5) if both else out  # the uniform rule: each factor gets half

    _rule_matmul = _rule_bmm = _rule_mul = _product
    _rule_neighbour_dot = _rule_neighbour_mix = _product  # AttentionLite's local q·k and a·v (custom ops)

    def _rule_baddbmm(self, func, inp, b1, b2, *, beta=1, alpha=1):
        return inp * beta + alpha * self._product(torch.bmm, b1, b2)

    def _rule_softmax(self, func, x, *args, **kwargs):
        s = func(x, *args, **kwargs)
        if self.variant == "cp":
            return s.detach()
        if self.record and s.requires_grad:
            dim = kwargs.get("dim", args[0] if args else -1)
            xs = torch.where(s > 0, x, torch.zeros_like(x)).detach()  # masked (-inf) scores have s = 0
            sd = s.detach()
            term = sd * (1 - (xs - (sd * xs).sum(dim, keepdim=True)))  # s − J x (shift-invariant)
            s = s.view_as(s)  # a node whose gradient is the relevance per unit probability
            s.retain_grad()
            self.absorbed.append((term, s))
        return s

    def _rule_scaled_dot_product_attention(self, func, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
                                           scale=None, enable_gqa=False):
        """Written out (eval: no dropout), the rules applied to its products and its softmax."""
        if dropout_p:
            raise ValueError("LRP explains an eval-mode model: attention dropout must be 0")
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        if enable_gqa and k.shape[-3] != q.shape[-3]:
            rep = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)
        scores = self._product(torch.matmul, q * scale, k.transpose(-2, -1))  # (..., T_q, T_k)
        if is_causal:
            causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
        return self._product(torch.matmul, self._rule_softmax(torch.softmax, scores, -1), v)

    def _rule_lstm(self, func, *args, **kwargs):
        return _lstm(*args)

    def _rule_linear(self, func, x, w, b=None):
        if self.linear_rule == "alpha1beta0" and x.requires_grad:
            return _AlphaBeta.apply(x, w, b, F.linear, {})
        return func(x, w, b)

    def _rule_conv2d(self, func, x, w, b=None, *args, **kwargs):
        if self.linear_rule == "alpha1beta0" and x.requires_grad:
            kw = dict(zip(("stride", "padding", "dilation", "groups"), args)) | kwargs
            return _AlphaBeta.apply(x, w, b, F.conv2d, kw)
        return func(x, w, b, *args, **kwargs)


def _lstm(x, hx, weights, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """``torch.lstm`` (``nn.LSTM``'s kernel) written out with Arras et al.'s rules: gates constant, tanh identity."""
    if not isinstance(hx, (tuple, list)) or train and dropout:
        raise ValueError("LRP of an LSTM: packed sequences and training-mode dropout are not supported")
    per = 4 if has_biases else 2
    dirs = 2 if bidirectional else 1
    seq = x if batch_first else x.transpose(0, 1)  # (B, T, D)
    h0, c0 = hx
    hs, cs = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            w = weights[(layer * dirs + d) * per:(layer * dirs + d + 1) * per]
            h, c = h0[layer * dirs + d], c0[layer * dirs + d]  # (B, U)
            steps = range(seq.shape[1]) if d == 0 else range(seq.shape[1] - 1, -1, -1)
            out = [None] * seq.shape[1]
            zx = F.linear(seq, w[0], w[2] if has_biases else None)  # (B, T, 4U): the input part of every step
            for t in steps:
                z = zx[:, t] + F.linear(h, w[1], w[3] if has_biases else None)
                i, f, g, o = z.chunk(4, -1)  # PyTorch's gate order
                c = torch.sigmoid(f).detach() * c + torch.sigmoid(i).detach() * identity_rule(torch.tanh, g)
                h = torch.sigmoid(o).detach() * identity_rule(torch.tanh, c)
                out[t] = h
            outs.append(torch.stack(out, 1))  # (B, T, U)
            hs.append(h)
            cs.append(c)
        seq = torch.cat(outs, -1)
    y = seq if batch_first else seq.transpose(0, 1)
    return y, torch.stack(hs), torch.stack(cs)
