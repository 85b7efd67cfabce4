"""The branched (train) form: L/n parallel blocks of n branches, joined progressively (§3.2–3.3).

Paper: "Non-deep Vision Transformers" (anonymous ICLR submission). A parallel block holds n branches
that see the same normalised input (LayerNorm before branching, §3.2) and are summed into the
residual stream. Each branch computes multi-head attention blockwise, as a sum of per-head
projections (Eq. 3)::

    O_b = Σ_h softmax(Ã_{b,h}) V_{b,h} W^O_{b,h}

where its pre-softmax scores are joined with the other branches' (Eq. 4–5, Algorithm 1 line 10–11,
generalised from two to n branches)::

    A_{b,h} = X W_{b,h} Xᵀ   (W_{b,h} = W^Q_{b,h} W^K_{b,h}ᵀ, plus the bias terms of q and k)
    Ã_{b,h} = (A_{b,h} + λ Σ_{b'≠b} A_{b',h}) / (√(1 + (n−1)λ²) · √d_k)      (variance rectification)

and its FFN joins the GELU inputs the same way (Eq. 8–9, no rectification in the paper)::

    h_b = W_{1,b} x + b_{1,b},    FFN_b = W_{2,b} GELU(h_b + λ Σ_{b'≠b} h_{b'}) + b_{2,b}

We write the joined input as ``(1 − λ)·A_b + λ·Σ_{b'} A_{b'}`` (the same number), so at λ = 1 every
branch's softmax / GELU input is bitwise the same tensor. Scores are computed as ``q kᵀ`` (the
factored form of ``X W Xᵀ``: same function, the teacher's cost); :func:`score_matrices` returns
the ``W_{b,h}`` themselves. The rectification keeps the joined logits' variance that of one
branch's when the branches' scores are independent and identically distributed (§3.3).

Initialisation from a teacher (:func:`branch`): the paper pre-trains its branched models
(D-MAE-l-n) and does not say how branches relate to a teacher's blocks; Algorithm 1 only says
"initialize parallel transformer branches" and §3.4 "the original L sequential layers are replaced
by L/n parallel blocks, each with n branches". We replace consecutive groups: branch ``b`` of
block ``i`` starts as teacher block ``n·i + b`` (so block i stands for teacher blocks
``n·i … n·i+n−1``; at small residual updates ``x + Σ_b f_b(x)`` is the first-order expansion of
their composition). Each teacher block's two LayerNorm affines are absorbed forward (Eq. 1) into
that branch's qkv and fc1 (exact), its LayerScale (if any) into proj and fc2; the shared norms
start as identity affines.

Hook points (``methods.hooks`` names; B batch, T tokens, D width, H heads, d head width, F FFN
hidden width). Per block ``blocks.{i}.``:

- ``hook_resid_pre`` / ``hook_resid_post`` ``(B, T, D)``: block input / output;
- ``hook_mixer_in`` ``(B, T, D)``: shared LN1 output (every branch's attention input);
- ``hook_mixer_out`` ``(B, T, D)``: Σ_b branch attention outputs (before the residual add);
- ``hook_mlp_in`` / ``hook_mlp_out`` ``(B, T, D)``: shared LN2 output / Σ_b branch FFN outputs;
- ``hook_lambda`` ``()``: the λ the block used.

Per branch ``blocks.{i}.branches.{b}.``:

- ``attn.hook_scores`` ``(B, H, T, T)``: joined, rectified, scaled softmax input Ã_{b,h};
- ``attn.hook_pattern`` ``(B, H, T, T)``: softmax(Ã_{b,h}) (after attention dropout, as timm's);
- ``attn.hook_heads`` ``(B, T, H·d)``: per-head outputs, heads concatenated, before W^O;
- ``attn.hook_out`` ``(B, T, D)``: the branch's attention output O_b (Eq. 3);
- ``mlp.hook_pre_act`` ``(B, T, F)``: joined GELU input (Eq. 9);
- ``mlp.hook_out`` ``(B, T, D)``: the branch's FFN output.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
from timm.layers import Attention, DropPath, LayerScale, Mlp, maybe_add_mask, resolve_self_attn_mask
from timm.models.vision_transformer import Block, VisionTransformer

from methods.hooks import HookPoint

from .layernorm import absorb_layernorm_forward


class BranchAttention(nn.Module):
    """One branch's multi-head attention, output projected blockwise per head (Eq. 3).

    Parameters carry timm's names (``qkv``, ``proj``), so a branch reads like a timm ``Attention``.
    The scores are joined by the enclosing :class:`ParallelBlock`: :meth:`project` gives q, k, v,
    :meth:`forward` takes the joined softmax input.
    """

    def __init__(self, dim: int, num_heads: int, head_dim: int, qkv_bias: bool = True, proj_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.qkv = nn.Linear(dim, 3 * num_heads * head_dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(num_heads * head_dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)
        self.hook_scores = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_heads = HookPoint()
        self.hook_out = HookPoint()

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(B, T, D) -> q, k, v``, each ``(B, H, T, d)``."""
        b, t, _ = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, T, d)
        q, k, v = qkv.unbind(0)
        return q, k, v

    def forward(self, scores: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Softmax of the joined scores ``(B, H, T, T)``, applied to ``v`` ``(B, H, T, d)``; returns ``(B, T, D)``."""
        b, h, t, d = v.shape
        p = self.hook_pattern(self.attn_drop(self.hook_scores(scores).softmax(dim=-1)))
        heads = self.hook_heads((p @ v).transpose(1, 2).reshape(b, t, h * d))  # (B, T, H·d)
        w_o = self.proj.weight.t().reshape(h, d, -1)  # W^O = [W^O_1; …; W^O_H]: (H, d, D)
        out = torch.einsum("bthe,hec->btc", heads.view(b, t, h, d), w_o)  # Eq. 3: Σ_h H_h W^O_h
        if self.proj.bias is not None:
            out = out + self.proj.bias
        return self.hook_out(self.proj_drop(out))


class BranchMlp(nn.Module):
    """One branch's FFN; :meth:`forward` takes the joined pre-activation (Eq. 9). timm ``Mlp`` names."""

    def __init__(self, dim: int, hidden: int, act_layer: Callable[[], nn.Module] = nn.GELU, bias: bool = True,
                 drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim, bias=bias)
        self.drop2 = nn.Dropout(drop)
        self.hook_pre_act = HookPoint()
        self.hook_out = HookPoint()

    def forward(self, pre_act: torch.Tensor) -> torch.Tensor:
        """``(B, T, F)`` joined GELU input -> ``(B, T, D)``."""
        h = self.drop1(self.act(self.hook_pre_act(pre_act)))
        return self.hook_out(self.drop2(self.fc2(h)))


class Branch(nn.Module):
    """One branch of a parallel block: an attention and an FFN (a teacher block without its norms)."""

    def __init__(self, attn: BranchAttention, mlp: BranchMlp):
        super().__init__()
        self.attn, self.mlp = attn, mlp


class ParallelBlock(nn.Module):
    """n branches behind shared LayerNorms, joined at the softmax and GELU inputs by λ (module docstring).

    Args:
        dim, num_heads, head_dim, hidden: D, H, d, F.
        branches: n.
        rectify: divide the joined scores by √(1 + (n−1)λ²) (§3.3); False keeps 1/√d_k only.
        norm_layer: builds a norm of width D (default: LayerNorm, eps 1e-6, as timm's ViTs).
        act_layer: builds the FFN activation (default GELU).
        qkv_bias, proj_bias, mlp_bias: linear biases.
        drop_path, attn_drop, proj_drop: regularisation as in timm's ``Block``.
    """

    def __init__(self, dim: int, num_heads: int, head_dim: int, hidden: int, branches: int, *, rectify: bool = True,
                 norm_layer: Callable[[int], nn.Module] | None = None, act_layer: Callable[[], nn.Module] = nn.GELU,
                 qkv_bias: bool = True, proj_bias: bool = True, mlp_bias: bool = True, drop_path: float = 0.0,
                 attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        if branches < 1:
            raise ValueError(f"a parallel block needs at least one branch, got {branches}")
        norm_layer = norm_layer or (lambda d: nn.LayerNorm(d, eps=1e-6))
        self.rectify = rectify
        self.scale = head_dim ** -0.5
        self.norm1 = norm_layer(dim)
        self.norm2 = norm_layer(dim)
        self.branches = nn.ModuleList(
            Branch(BranchAttention(dim, num_heads, head_dim, qkv_bias, proj_bias, attn_drop, proj_drop),
                   BranchMlp(dim, hidden, act_layer, mlp_bias, proj_drop))
            for _ in range(branches)
        )
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.register_buffer("lam", torch.zeros(()))  # λ, saved with the weights (a resumed run keeps it)
        for name in ("resid_pre", "mixer_in", "mixer_out", "mlp_in", "mlp_out", "resid_post", "lambda"):
            setattr(self, f"hook_{name}", HookPoint())

    @property
    def num_branches(self) -> int:
        return len(self.branches)

    def rectification(self, lam: torch.Tensor) -> torch.Tensor:
        """√(1 + (n−1)λ²): the std of the joined scores relative to one branch's (1 if not rectifying)."""
        if not self.rectify:
            return torch.ones_like(lam)
        return torch.sqrt(1.0 + (self.num_branches - 1) * lam * lam)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        """``(B, T, D) -> (B, T, D)``; ``attn_mask`` / ``is_causal`` as timm's ``Block``."""
        x = self.hook_resid_pre(x)
        lam = self.hook_lambda(self.lam).to(x.dtype)
        h = self.hook_mixer_in(self.norm1(x))
        qkv = [br.attn.project(h) for br in self.branches]
        scores = [q @ k.transpose(-2, -1) for q, k, _ in qkv]  # A_b = X W_b Xᵀ (+ bias terms): (B, H, T, T)
        total = torch.stack(scores).sum(0)  # Σ_b A_b
        scale = self.scale / self.rectification(lam)
        mask = resolve_self_attn_mask(x.shape[1], scores[0], attn_mask, is_causal)
        attn = [br.attn(maybe_add_mask(((1 - lam) * s + lam * total) * scale, mask), v)  # Eq. 5, rectified
                for br, s, (_, _, v) in zip(self.branches, scores, qkv, strict=True)]
        x = x + self.drop_path1(self.hook_mixer_out(torch.stack(attn).sum(0)))
        h = self.hook_mlp_in(self.norm2(x))
        pre = [br.mlp.fc1(h) for br in self.branches]  # Eq. 8: (B, T, F)
        pre_total = torch.stack(pre).sum(0)
        ffn = [br.mlp((1 - lam) * u + lam * pre_total) for br, u in zip(self.branches, pre, strict=True)]  # Eq. 9
        x = x + self.drop_path2(self.hook_mlp_out(torch.stack(ffn).sum(0)))
        return self.hook_resid_post(x)

    # -------------------------------------------------------------------------- from a teacher
    @classmethod
    @torch.no_grad()
    def from_blocks(cls, blocks: Sequence[Block], rectify: bool = True) -> ParallelBlock:
        """A parallel block whose branch ``b`` computes ``blocks[b]``'s attention and FFN (module docstring).

        LN affines are absorbed forward (Eq. 1) into qkv / fc1, LayerScale into proj / fc2; the
        shared norms copy ``blocks[0]``'s norm type and eps with γ = 1, β = 0.
        """
        first = blocks[0]
        attn, mlp = first.attn, first.mlp
        dim, heads, head_dim = attn.qkv.in_features, attn.num_heads, attn.head_dim
        norm = first.norm1

        def norm_layer(d: int) -> nn.Module:
            new = copy.deepcopy(norm)
            if new.weight is not None:
                new.weight.fill_(1.0)
            if new.bias is not None:
                new.bias.zero_()
            return new

        drop_path = blocks[-1].drop_path1.drop_prob if isinstance(blocks[-1].drop_path1, DropPath) else 0.0
        block = cls(dim, heads, head_dim, mlp.fc1.out_features, len(blocks), rectify=rectify, norm_layer=norm_layer,
                    act_layer=lambda: copy.deepcopy(mlp.act), qkv_bias=True, proj_bias=attn.proj.bias is not None,
                    mlp_bias=True, drop_path=drop_path, attn_drop=attn.attn_drop.p, proj_drop=attn.proj_drop.p)
        block.to(device=attn.qkv.weight.device, dtype=attn.qkv.weight.dtype)
        for br, blk in zip(block.branches, blocks, strict=True):
            _copy_linear(br.attn.qkv, *absorb_layernorm_forward(blk.attn.qkv, blk.norm1))  # Eq. 1 (exact)
            _copy_linear(br.attn.proj, *_layer_scaled(blk.attn.proj, blk.ls1))
            _copy_linear(br.mlp.fc1, *absorb_layernorm_forward(blk.mlp.fc1, blk.norm2))  # Eq. 1
            _copy_linear(br.mlp.fc2, *_layer_scaled(blk.mlp.fc2, blk.ls2))
        return block


def _layer_scaled(linear: nn.Linear, ls: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weight and bias of ``ls(linear(x))`` for a LayerScale (diag γ) or an identity ``ls``."""
    w, b = linear.weight.detach(), None if linear.bias is None else linear.bias.detach()
    if isinstance(ls, LayerScale):
        g = ls.gamma.detach()
        return w * g[:, None], None if b is None else b * g
    return w, b


def _copy_linear(linear: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    linear.weight.copy_(weight)
    if linear.bias is not None:
        linear.bias.copy_(bias if bias is not None else torch.zeros_like(linear.bias))
    elif bias is not None and bias.abs().max() > 0:
        raise ValueError("a non-zero bias has no place in a bias-free linear layer")


# ------------------------------------------------------------------------------------ checks
def check_teacher(model: nn.Module) -> None:
    """Raise ``ValueError`` unless ``model`` is a timm ViT the method can branch and collapse exactly.

    Needs a ``VisionTransformer`` of timm ``Block``s with plain ``Attention`` (no q/k norm, no
    output norm, no gate), a plain ``Mlp`` (elementwise activation, no hidden norm) and
    ``LayerNorm``s; LayerScale is fine (absorbed).
    """
    name = type(model).__name__
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"Non-deep ViT branches a timm VisionTransformer (e.g. deit_tiny_patch16_224, vit_demo); "
                         f"got {name}")
    problems = []
    for i, blk in enumerate(model.blocks):
        if type(blk) is not Block:
            problems.append(f"blocks.{i} is {type(blk).__name__}, not a timm Block")
            continue
        a = blk.attn
        if type(a) is not Attention:
            problems.append(f"blocks.{i}.attn is {type(a).__name__}, not timm Attention")
        elif not (isinstance(a.q_norm, nn.Identity) and isinstance(a.k_norm, nn.Identity)
                  and isinstance(a.norm, nn.Identity) and getattr(a, "gate", None) is None):
            problems.append(f"blocks.{i}.attn uses q/k norm, an output norm or a gate (no exact collapse exists)")
        if type(blk.mlp) is not Mlp or not isinstance(blk.mlp.norm, nn.Identity):
            problems.append(f"blocks.{i}.mlp is {type(blk.mlp).__name__} with a hidden norm or gating, "
                            "not a plain timm Mlp")
        for n in ("norm1", "norm2"):
            if not isinstance(getattr(blk, n), nn.LayerNorm):
                problems.append(f"blocks.{i}.{n} is {type(getattr(blk, n)).__name__}, not a LayerNorm")
    if problems:
        raise ValueError(f"{name} cannot be branched: " + "; ".join(problems[:4]))


def check_branches(depth: int, branches: int) -> None:
    """Raise ``ValueError`` unless ``branches`` (n ≥ 1) divides ``depth`` (L)."""
    if not isinstance(branches, int) or branches < 1 or depth % branches:
        divisors = [d for d in range(1, depth + 1) if depth % d == 0]
        raise ValueError(f"{branches} branches do not divide the teacher's depth {depth}: the L/n blocks would not "
                         f"be whole; choose n from {divisors}")


def parallel_blocks(model: nn.Module) -> list[ParallelBlock]:
    """The :class:`ParallelBlock`\\ s of a branched model, in order (empty for other models)."""
    model = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return [b for b in getattr(model, "blocks", []) if isinstance(b, ParallelBlock)]


# ------------------------------------------------------------------------------------ branch
def branch(teacher: nn.Module, branches: int, *, rectify: bool = True, base: str | None = None,
           base_kwargs: dict | None = None) -> VisionTransformer:
    """The branched form of ``teacher``: L/n parallel blocks, branch ``b`` of block ``i`` = teacher block ``n·i+b``.

    The result is a timm ``VisionTransformer`` (embeddings, final norm, head and every timm API —
    ``forward_features``, ``forward_head``, ``forward_intermediates`` — are the teacher's) whose
    ``blocks`` are :class:`ParallelBlock`\\ s with λ = 0. ``teacher`` is not modified.

    Args:
        teacher: a timm ViT (see :func:`check_teacher`).
        branches: n; must divide the teacher's depth.
        rectify: variance rectification of the joined scores (§3.3).
        base, base_kwargs: the teacher's timm name and creation kwargs, recorded in the result's
            ``timm_spec`` (default: ``teacher.pretrained_cfg["architecture"]`` and ``{}``).

    Returns:
        The branched model, with ``timm_spec = ("nondeep_branched", kwargs)`` such that
        ``timm.create_model(*spec)`` rebuilds the same architecture.

    Raises:
        ValueError: a teacher that is not a plain timm ViT, or ``branches`` not dividing its depth.
    """
    check_teacher(teacher)
    depth = len(teacher.blocks)
    check_branches(depth, branches)
    model = copy.deepcopy(teacher)
    groups = [list(teacher.blocks[i * branches:(i + 1) * branches]) for i in range(depth // branches)]
    model.blocks = nn.Sequential(*[ParallelBlock.from_blocks(g, rectify=rectify) for g in groups])
    model.pretrained_cfg = {**getattr(teacher, "pretrained_cfg", {}), "architecture": "nondeep_branched"}
    base = base or getattr(teacher, "pretrained_cfg", {}).get("architecture")
    model.timm_spec = ("nondeep_branched", {"base": base, "base_kwargs": dict(base_kwargs or {}),
                                            "branches": branches, "rectify": rectify})
    return model


@torch.no_grad()
def score_matrices(attn: BranchAttention | Attention) -> torch.Tensor:
    """W_h = W^Q_h W^K_hᵀ per head (§3.3), ``(H, D, D)``: ``A = X W_h Xᵀ`` are the bias-free scores.

    In the paper's row-vector notation Q = X W^Q, so ``W_h[i, j]`` multiplies ``x_i`` of the query
    token and ``x_j`` of the key token.
    """
    h, d = attn.num_heads, attn.head_dim
    wq, wk = attn.qkv.weight[: h * d].view(h, d, -1), attn.qkv.weight[h * d: 2 * h * d].view(h, d, -1)
    return wq.transpose(1, 2) @ wk  # (H, D, d) @ (H, d, D)


@torch.no_grad()
def value_output_matrices(attn: BranchAttention | Attention) -> torch.Tensor:
    """W_h = W^V_h W^O_h per head, ``(H, D, D)``: head h adds ``P_h X W_h`` to the output (bias-free)."""
    h, d = attn.num_heads, attn.head_dim
    wv = attn.qkv.weight[2 * h * d: 3 * h * d].view(h, d, -1)  # (H, d, D): V_h = X wv_hᵀ
    wo = attn.proj.weight.t().reshape(h, d, -1)  # (H, d, D): W^O_h
    return wv.transpose(1, 2) @ wo


__all__ = ["Branch", "BranchAttention", "BranchMlp", "ParallelBlock", "branch", "check_branches", "check_teacher",
           "parallel_blocks", "score_matrices", "value_output_matrices"]
