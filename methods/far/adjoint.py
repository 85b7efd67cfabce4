"""Input gradients of the BiLSTM substitute for many output tokens at once (FAR §4.3, App. C).

Paper: Ren et al., "Is Attention Required for Transformer Inference? Explore Function-preserving
Attention Replacement". The paper's token dependency of a FAR head is the gradient of an output
token's features with respect to every input token. One backward pass per output token repeats
the whole recurrence T times; here the reverse-mode recurrence of ``nn.LSTM`` is written out once
and run for all output tokens together, as one matrix per step:

    pre-activations a_t = W_ih x_t + W_hh h_{t-1} + b,   (i, f, g, o) = (σ, σ, tanh, σ)(a_t)
    c_t = f ⊙ c_{t-1} + i ⊙ g,   h_t = o ⊙ tanh(c_t)                     (PyTorch's nn.LSTM)

For the scalar s_p = Σ_u h_p[u] of output position p, the adjoints δh_t = ∂s_p/∂h_t and
δc_t = ∂s_p/∂c_t (through later steps) run backwards from t = p:

    δc_t += δh_t ⊙ o_t ⊙ (1 − tanh² c_t)
    δa_t  = [δc_t ⊙ g_t ⊙ i_t(1−i_t),  δc_t ⊙ c_{t−1} ⊙ f_t(1−f_t),  δc_t ⊙ i_t ⊙ (1−g_t²),  δh_t ⊙ tanh c_t ⊙ o_t(1−o_t)]
    ∂s_p/∂x_t = W_ihᵀ δa_t,   δh_{t−1} = W_hhᵀ δa_t,   δc_{t−1} = δc_t ⊙ f_t

Causality truncates the work: s_p does not depend on x_t for t > p, so position p joins the
batch of adjoints only when the backward sweep reaches t = p (positions sorted, so the active
adjoints are always a suffix of the batch), and the sweep starts at max(p) instead of T − 1.
The forward pass runs once (its activations are shared by all positions). Exactness is checked
against ``torch.autograd.functional.jacobian`` in ``tests/test_dependency.py``.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import torch
import torch.nn as nn
from einops import rearrange

from .lstm import MultiHeadBiLSTM


@torch.no_grad()
def lstm_sum_adjoint(lstm: nn.Module, inputs: torch.Tensor, positions: Sequence[int]) -> torch.Tensor:
    """``∂(Σ_u h_p[u]) / ∂inputs`` of a unidirectional single-layer LSTM, for every ``p`` in ``positions``.

    Args:
        lstm: ``nn.LSTM(batch_first=True)`` with one layer (or a pruned-away ``EmptyLSTM``).
        inputs: ``(B, T, D_in)``, in the LSTM's processing order.
        positions: output positions p (processing order), ascending, each in ``[0, T)``.

    Returns:
        ``(P, B, T, D_in)``; zero for t > p (causality) and for an LSTM without units.
    """
    b, t_len, d_in = inputs.shape
    pos = [int(p) for p in positions]
    if any(q < p for p, q in zip(pos, pos[1:])) or (pos and not 0 <= pos[0] <= pos[-1] < t_len):
        raise ValueError(f"positions must be ascending within [0, {t_len}), got {pos[:8]}...")
    out = inputs.new_zeros(len(pos), b, t_len, d_in)
    hid = getattr(lstm, "hidden_size", 0)
    if not pos or hid == 0:
        return out
    w_ih, w_hh = lstm.weight_ih_l0, lstm.weight_hh_l0  # (4H, D_in), (4H, H)
    steps = pos[-1] + 1  # nothing after the last position matters
    pre = inputs[:, :steps] @ w_ih.T  # (B, steps, 4H)
    if lstm.bias:
        pre = pre + (lstm.bias_ih_l0 + lstm.bias_hh_l0)
    # forward once: activated gates and cell states of every step
    gates = inputs.new_empty(steps, b, 4 * hid)  # (i, f, g, o) after their nonlinearities
    cells = inputs.new_zeros(steps + 1, b, hid)  # cells[t + 1] = c_t, cells[0] = c_{-1} = 0
    h = inputs.new_zeros(b, hid)
    for t in range(steps):
        a = torch.addmm(pre[:, t], h, w_hh.T)  # (B, 4H)
        torch.sigmoid(a, out=gates[t])
        gates[t, :, 2 * hid:3 * hid] = torch.tanh(a[:, 2 * hid:3 * hid])
        i, f, g, o = gates[t].split(hid, -1)
        cells[t + 1] = f * cells[t] + i * g
        h = o * torch.tanh(cells[t + 1])
    # per-step factors of the adjoint recurrence, for all steps at once
    i, f, g, o = gates.split(hid, -1)  # each (steps, B, H)
    tanh_c = torch.tanh(cells[1:])
    dc_to_ifg = torch.stack([g * i * (1 - i), cells[:-1] * f * (1 - f), i * (1 - g * g)], dim=2)  # (steps, B, 3, H)
    dh_to_o = tanh_c * o * (1 - o)
    dh_to_dc = o * (1 - tanh_c * tanh_c)
    w = torch.cat([w_ih, w_hh], dim=1)  # (4H, D_in + H): one matmul gives both input and recurrent adjoints
    n = len(pos)
    dh = inputs.new_zeros(n, b, hid)
    dc = inputs.new_zeros(n, b, hid)
    da = inputs.new_empty(n, b, 4 * hid)
    dx = inputs.new_zeros(steps, n, b, d_in)
    for t in range(steps - 1, -1, -1):
        first = bisect.bisect_left(pos, t)  # positions >= t are active: a suffix
        last = bisect.bisect_right(pos, t)
        dh[first:last] += 1.0  # s_p = Σ_u h_p[u] seeds δh_p = 1 at t = p
        dh_a, dc_a, da_a = dh[first:], dc[first:], da[first:]
        dc_a.addcmul_(dh_a, dh_to_dc[t])
        torch.mul(dc_a.unsqueeze(2), dc_to_ifg[t], out=da_a[..., : 3 * hid].view(-1, b, 3, hid))
        torch.mul(dh_a, dh_to_o[t], out=da_a[..., 3 * hid:])
        both = (da_a.reshape(-1, 4 * hid) @ w).view(-1, b, d_in + hid)  # (active, B, D_in + H)
        dx[t, first:] = both[..., :d_in]
        dh_a.copy_(both[..., d_in:])
        dc_a.mul_(f[t])
    out[:, :, :steps] = rearrange(dx, "t p b d -> p b t d")
    return out


def bilstm_head_adjoint(sub: MultiHeadBiLSTM, head: int, inputs: torch.Tensor, queries: Sequence[int]) -> torch.Tensor:
    """``∂(Σ_c H_n[q, c]) / ∂I_n`` of one BiLSTM head for every query token q (forward + reverse units).

    Args:
        sub: the substitute.
        head: n.
        inputs: the head's LSTM input I_n ``(B, T, D_h)`` (after the substitute's norm and input projection).
        queries: output token indices, ascending.

    Returns:
        ``(Q, B, T, D_h)``.
    """
    t_len = inputs.shape[1]
    qs = [int(q) for q in queries]
    fwd = lstm_sum_adjoint(sub.lstm(head, 0), inputs, qs)
    # the reverse LSTM reads the flipped sequence: token q sits at position T-1-q
    rev = lstm_sum_adjoint(sub.lstm(head, 1), inputs.flip(1), [t_len - 1 - q for q in reversed(qs)])
    return fwd + rev.flip(0).flip(2)
