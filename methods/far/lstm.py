"""The multi-head bidirectional LSTM that replaces attention in FAR.

Paper: Ren, Collins, Hu, Yang, "Is Attention Required for Transformer Inference? Explore
Function-preserving Attention Replacement" (FAR), §3.2 and Figure 2:

    I_n = split_n(Proj_in(LN(x)))                 x ∈ R^{T×D},  I_n ∈ R^{T×D_h},  D = N·D_h
    H_n = BiLSTM_n(I_n) ∈ R^{T×2H}                forward and reverse outputs concatenated
    H   = [H_1; …; H_N] ∈ R^{T×2NH}
    y   = Proj_out(H) ∈ R^{T×D}

with N = the teacher's number of heads and H = D_h = the teacher's head dimension (§3.2, §4.1).

Layout: one *unidirectional* ``nn.LSTM`` per (head, direction), 2N in all, in the order
``[head0-forward, head0-reverse, head1-forward, …]`` (the order of ``nn.LSTM(bidirectional=True)``
outputs, head after head as in H above). The reverse LSTM runs on the time-flipped sequence and
its output is flipped back, which is exactly what a bidirectional ``nn.LSTM`` computes. Separate
modules make per-(head, direction) hidden sizes natural after structured pruning (§3.3, Fig. 4:
forward and reverse directions keep different numbers of units), which a bidirectional
``nn.LSTM`` cannot express since it forces equal sizes in both directions.

Unit bookkeeping: the boolean buffer ``kept`` ``(N, 2, U)`` (U = the unpruned hidden size) says
which of the original hidden units each (head, direction) still has; the LSTM of (n, d) holds the
kept units in ascending original order. It is a persistent buffer, so a saved state dict says
which units a physically pruned model has, and :meth:`MultiHeadBiLSTM.forward_heads` can place
every unit's output at its original index (zeros for removed units), the same for a masked and a
shrunk model.

Norm placement (see :func:`methods.far.replace.replace_attention`): the module takes the place of
timm's ``block.attn``, so it receives ``LN1(x)`` from the block's (pretrained, kept) ``norm1`` and
applies its own LayerNorm on top, as §3.2 says the substitute does.

Precision on a GPU: under CUDA autocast, whatever its dtype (the paper budgets use bfloat16), PyTorch runs
cuDNN's ``nn.LSTM`` in float16 (its autocast rule for ``_cudnn_rnn``), so :func:`methods.train.fit` trains a model
with these LSTMs under a gradient scaler (:func:`methods.train.grad_scaler`); the rest of the model follows the
autocast dtype. ``tests/test_cuda_safety.py`` checks both on a GPU. cuDNN refuses an LSTM backward in eval mode:
analyses differentiate these modules inside :func:`methods.devices.differentiable`.

Hook points (:mod:`methods.hooks`; no parameters, so state dicts and checkpoints are unchanged). Inside
a ViT they are named ``blocks.{i}.attn.<suffix>``:

=================  =====================================================================  =========================
suffix             value                                                                   shape
=================  =====================================================================  =========================
``hook_lstm_in``   the LSTM inputs I = Proj_in(LN(x)), heads concatenated: head n is       ``(B, T, N·D_h)``
                   ``[..., n·D_h:(n+1)·D_h]`` (what the authors' saliency differentiates by)
``hook_heads``     the LSTM outputs H, in ``lstms`` order (head 0 forward, head 0 reverse,   ``(B, T, Σ hidden)``;
                   head 1 forward, …), before the output projection                        ``(B, T, 2·N·U)`` unpruned
=================  =====================================================================  =========================

(``hook_heads`` is the shared name of "per-head outputs, heads concatenated, before the output
projection"; the block's ``hook_mixer_in`` / ``hook_mixer_out`` come from timm ``Block``'s adapter.)
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from methods.hooks import HookPoint

DIRECTIONS: tuple[str, str] = ("forward", "reverse")


class EmptyLSTM(nn.Module):
    """Stand-in for an ``nn.LSTM`` whose hidden units were all pruned (``nn.LSTM`` needs ≥ 1).

    Args:
        input_size: features per input token (kept for introspection).
    """

    def __init__(self, input_size: int):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = 0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        # (B, T, D_h) -> (B, T, 0)
        return x.new_zeros(x.shape[0], x.shape[1], 0), None


def _make_lstm(input_size: int, hidden_size: int, bias: bool) -> nn.Module:
    if hidden_size == 0:
        return EmptyLSTM(input_size)
    return nn.LSTM(input_size, hidden_size, batch_first=True, bias=bias)


class MultiHeadBiLSTM(nn.Module):
    """Multi-head bidirectional LSTM token mixer (FAR §3.2, Fig. 2), a drop-in for timm ``Attention``.

    Args:
        dim: embedding size D of the tokens in and out.
        num_heads: number of LSTM heads N (= the teacher's attention heads).
        head_dim: per-head input size D_h after the input projection (= the teacher's head dim).
        hidden_dim: unpruned hidden size U of every LSTM; ``None`` means ``head_dim`` (paper).
        kept: optional ``(N, 2, U)`` bool mask of the hidden units each (head, direction) has;
            ``None`` means all of them. Hidden size of (n, d) is ``kept[n, d].sum()``.
        own_norm: apply the substitute's own LayerNorm first (§3.2); ``False`` uses ``nn.Identity``.
        bias: LSTM biases (``bias_ih`` and ``bias_hh`` as in ``nn.LSTM``).
        norm_eps: epsilon of the own LayerNorm (timm ViTs use 1e-6).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        head_dim: int,
        hidden_dim: Optional[int] = None,
        kept: Optional[torch.Tensor] = None,
        own_norm: bool = True,
        bias: bool = True,
        norm_eps: float = 1e-6,
    ):
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.hidden_dim = hidden_dim or head_dim
        self.own_norm = own_norm
        self.bias = bias
        self.norm_eps = norm_eps
        if kept is None:
            kept = torch.ones(num_heads, 2, self.hidden_dim, dtype=torch.bool)
        if tuple(kept.shape) != (num_heads, 2, self.hidden_dim):
            raise ValueError(f"kept must have shape {(num_heads, 2, self.hidden_dim)}, got {tuple(kept.shape)}")
        self.register_buffer("kept", kept.detach().to(torch.bool).cpu().clone())
        self.norm = nn.LayerNorm(dim, eps=norm_eps) if own_norm else nn.Identity()
        self.in_proj = nn.Linear(dim, num_heads * head_dim)
        sizes = self.hidden_sizes()
        self.lstms = nn.ModuleList(
            _make_lstm(head_dim, sizes[n][d], bias) for n in range(num_heads) for d in range(2)
        )
        self.out_proj = nn.Linear(sum(sum(s) for s in sizes), dim)
        self.hook_lstm_in = HookPoint()  # I: (B, T, N·D_h)
        self.hook_heads = HookPoint()  # H: (B, T, Σ hidden)

    # ----------------------------------------------------------------------------------- structure
    def hidden_sizes(self) -> list[tuple[int, int]]:
        """Hidden size of every head as ``[(forward, reverse), …]``, from the ``kept`` buffer."""
        counts = self.kept.sum(-1).tolist()  # (N, 2)
        return [(int(f), int(r)) for f, r in counts]

    def lstm(self, head: int, direction: int) -> nn.Module:
        """The unidirectional LSTM of ``head`` and ``direction`` (0 = forward, 1 = reverse)."""
        return self.lstms[2 * head + direction]

    def out_proj_slices(self) -> list[slice]:
        """Column slice of ``out_proj.weight`` read by each LSTM, in ``lstms`` order."""
        slices, start = [], 0
        for lstm in self.lstms:
            slices.append(slice(start, start + lstm.hidden_size))
            start += lstm.hidden_size
        return slices

    def reset_parameters(self) -> None:
        """Re-initialise all weights with PyTorch's defaults (used by ``from_scratch``)."""
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"hidden_sizes={self.hidden_sizes()}"
        )

    # ------------------------------------------------------------------------------------- forward
    def lstm_inputs(self, x: torch.Tensor, heads: Optional[Sequence[int]] = None) -> torch.Tensor:
        """The LSTM inputs I = Proj_in(LN(x)) of ``heads`` (default all), concatenated: ``(B, T, n·D_h)``."""
        xn = self.norm(x)
        if heads is None:
            return self.in_proj(xn)  # (B, T, D) -> (B, T, N·D_h)
        # project onto the selected heads' subspaces only
        rows = torch.cat([torch.arange(n * self.head_dim, (n + 1) * self.head_dim) for n in heads]).to(x.device)
        return F.linear(xn, self.in_proj.weight[rows], self.in_proj.bias[rows])  # (B, T, n·D_h)

    def _lstm_outputs(self, inputs: torch.Tensor, heads: Sequence[int]) -> list[torch.Tensor]:
        """Outputs of the LSTMs of ``heads`` from their inputs ``(B, T, len(heads)·D_h)``, each ``(B, T, hidden)``, in ``lstms`` order."""
        inputs = rearrange(inputs, "b t (n c) -> n b t c", c=self.head_dim)  # I_n: (B, T, D_h)
        outs = []
        for i, n in enumerate(heads):
            fwd, _ = self.lstm(n, 0)(inputs[i])  # (B, T, H_fwd)
            rev, _ = self.lstm(n, 1)(inputs[i].flip(1))  # run on the reversed sequence
            outs += [fwd, rev.flip(1)]  # (B, T, H_rev), re-aligned to token order
        return outs

    def forward(
        self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False
    ) -> torch.Tensor:
        """Mix tokens: ``(B, T, D) -> (B, T, D)``; the signature of timm ``Attention.forward``.

        Raises:
            ValueError: an attention mask or causal masking was asked for (an LSTM has neither).
        """
        if attn_mask is not None or is_causal:
            raise ValueError("MultiHeadBiLSTM has no attention mask; attn_mask/is_causal are unsupported")
        inputs = self.hook_lstm_in(self.lstm_inputs(x))  # I: (B, T, N·D_h)
        h = self.hook_heads(torch.cat(self._lstm_outputs(inputs, range(self.num_heads)), dim=-1))  # H: (B, T, Σ hidden)
        return self.out_proj(h)  # (B, T, D)

    def forward_heads(self, x: torch.Tensor, heads: Optional[Sequence[int]] = None) -> torch.Tensor:
        """Per-head BiLSTM outputs H_n before the output projection, for analysis.

        Args:
            x: module input ``(B, T, D)`` (i.e. ``LN1`` of the block input).
            heads: which heads to run (default all, in order); others are not computed.

        Returns:
            ``(B, T, n_heads, 2·U)``: features ``[forward units 0..U-1, reverse units 0..U-1]`` at
            their original unit index; removed units read 0 (a pruned unit's output is exactly 0).
        """
        return self.heads_from_lstm_inputs(self.lstm_inputs(x, heads), heads)

    def heads_from_lstm_inputs(self, inputs: torch.Tensor, heads: Optional[Sequence[int]] = None) -> torch.Tensor:
        """:meth:`forward_heads` from the LSTM inputs of ``heads`` (``hook_lstm_in``'s value, or its slices of ``heads``).

        Args:
            inputs: ``(B, T, n_heads·D_h)``, the inputs of ``heads`` in that order (all N heads when ``heads`` is None).
            heads: which heads ``inputs`` holds (default all).

        Returns:
            ``(B, T, n_heads, 2·U)`` as :meth:`forward_heads`.
        """
        heads = list(range(self.num_heads)) if heads is None else list(heads)
        outs = self._lstm_outputs(inputs, heads)
        b, t = inputs.shape[:2]
        placed = []
        for i, out in enumerate(outs):
            n, d = heads[i // 2], i % 2
            idx = self.kept[n, d].nonzero().squeeze(-1).to(inputs.device)
            # (B, T, h) -> (B, T, U), out of place so torch.func transforms can trace it
            placed.append(out.new_zeros(b, t, self.hidden_dim).index_copy(-1, idx, out))
        full = torch.stack(placed, dim=2)  # (B, T, 2·n_heads, U) in lstms order
        return rearrange(full, "b t (n d) u -> b t n (d u)", d=2)  # (B, T, n_heads, 2U)

    # ------------------------------------------------------------------------------------- pruning
    @torch.no_grad()
    def pruned(self, keep: torch.Tensor) -> "MultiHeadBiLSTM":
        """A physically smaller copy keeping only the units where ``keep`` (and ``kept``) is true.

        The copy computes exactly what this module computes after zeroing the removed units
        (see :func:`methods.far.hoyer.apply_masks`).

        Args:
            keep: ``(N, 2, U)`` bool, indexed by original unit index.

        Returns:
            A new :class:`MultiHeadBiLSTM` on the same device and dtype.
        """
        kept = self.kept.cpu()
        keep = keep.detach().to(torch.bool).cpu() & kept
        new = MultiHeadBiLSTM(
            self.dim, self.num_heads, self.head_dim, self.hidden_dim, keep, self.own_norm, self.bias, self.norm_eps
        )
        ref = self.in_proj.weight
        new.to(device=ref.device, dtype=ref.dtype)
        new.norm.load_state_dict(self.norm.state_dict())
        new.in_proj.load_state_dict(self.in_proj.state_dict())
        cols = []
        for i, (old_lstm, new_lstm, sl) in enumerate(zip(self.lstms, new.lstms, self.out_proj_slices())):
            n, d = divmod(i, 2)
            old_units = kept[n, d].nonzero().squeeze(-1)  # original index of each local unit
            local = keep[n, d][old_units].nonzero().squeeze(-1).to(ref.device)  # local units to keep
            cols.append(sl.start + local)
            if new_lstm.hidden_size == 0:
                continue
            h = old_lstm.hidden_size
            gate_rows = (local[None, :] + h * torch.arange(4, device=ref.device)[:, None]).reshape(-1)  # 4 gates
            new_lstm.weight_ih_l0.copy_(old_lstm.weight_ih_l0[gate_rows])  # (4h', D_h)
            new_lstm.weight_hh_l0.copy_(old_lstm.weight_hh_l0[gate_rows][:, local])  # (4h', h')
            if self.bias:
                new_lstm.bias_ih_l0.copy_(old_lstm.bias_ih_l0[gate_rows])
                new_lstm.bias_hh_l0.copy_(old_lstm.bias_hh_l0[gate_rows])
        new.out_proj.weight.copy_(self.out_proj.weight[:, torch.cat(cols)])  # (D, Σ h')
        new.out_proj.bias.copy_(self.out_proj.bias)
        old_params = dict(self.named_parameters())
        for name, p_new in new.named_parameters():  # keep frozen parts frozen
            p_new.requires_grad_(old_params[name].requires_grad if name in old_params else True)
        return new
