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


def lstm_sum_adjoint(lstm: nn.Module, inputs: torch.Tensor, positions: Sequence[int]) -> torch.Tensor:
    """``∂(Σ_u h_p[u]) / ∂inputs`` of a unidirectional single-layer LSTM, for every ``p`` in ``positions``.

    Args:
        lstm: ``nn.LSTM(batch_first=True)`` with one layer (or a pruned-away ``EmptyLSTM``).
        inputs: ``(B, T, D_in)``, in the LSTM's processing order.
        positions: output positions p (processing order), ascending, each in ``[0, T)``.

    Returns:
        ``(P, B, T, D_in)``; zero for t > p (causality) and for an LSTM without units.
    """
    return _adjoints([lstm], inputs[None], [[int(p) for p in positions]])[0]


def _check_positions(pos: list[int], t_len: int) -> None:
    if any(q < p for p, q in zip(pos, pos[1:])) or (pos and not 0 <= pos[0] <= pos[-1] < t_len):
        raise ValueError(f"positions must be ascending within [0, {t_len}), got {pos[:8]}...")


@torch.no_grad()
def _adjoints(lstms: Sequence[nn.Module], inputs: torch.Tensor, positions: Sequence[list[int]]) -> torch.Tensor:
    """The adjoint recurrence of G LSTMs of one hidden size at once (one ``bmm`` per step for all of them).

    Args:
        lstms: G single-layer LSTMs with equal ``hidden_size`` (0 allowed: zeros).
        inputs: ``(G, B, T, D_in)``, each in its LSTM's processing order.
        positions: per LSTM, P ascending output positions (the same count P for all).

    Returns:
        ``(G, P, B, T, D_in)``.
    """
    g_n, b, t_len, d_in = inputs.shape
    for pos in positions:
        _check_positions(pos, t_len)
    n = len(positions[0])
    out = inputs.new_zeros(g_n, n, b, t_len, d_in)
    hid = getattr(lstms[0], "hidden_size", 0)
    if n == 0 or hid == 0:
        return out
    w_ih = torch.stack([m.weight_ih_l0 for m in lstms])  # (G, 4H, D_in)
    w_hh = torch.stack([m.weight_hh_l0 for m in lstms])  # (G, 4H, H)
    steps = max(pos[-1] for pos in positions) + 1  # nothing after the last position matters
    pre = inputs[:, :, :steps] @ w_ih.transpose(1, 2)[:, None]  # (G, B, steps, 4H)
    if lstms[0].bias:
        pre = pre + torch.stack([m.bias_ih_l0 + m.bias_hh_l0 for m in lstms])[:, None, None]
    # forward once: activated gates and cell states of every step
    gates = inputs.new_empty(steps, g_n, b, 4 * hid)  # (i, f, g, o) after their nonlinearities
    cells = inputs.new_zeros(steps + 1, g_n, b, hid)  # cells[t + 1] = c_t, cells[0] = c_{-1} = 0
    h = inputs.new_zeros(g_n, b, hid)
    w_hh_t = w_hh.transpose(1, 2)
    for t in range(steps):
        a = torch.baddbmm(pre[:, :, t], h, w_hh_t)  # (G, B, 4H)
        torch.sigmoid(a, out=gates[t])
        gates[t, ..., 2 * hid:3 * hid] = torch.tanh(a[..., 2 * hid:3 * hid])
        i, f, g, o = gates[t].split(hid, -1)
        cells[t + 1] = f * cells[t] + i * g
        h = o * torch.tanh(cells[t + 1])
    # per-step factors of the adjoint recurrence, for all steps at once
    i, f, g, o = gates.split(hid, -1)  # each (steps, G, B, H)
    tanh_c = torch.tanh(cells[1:])
    dc_to_ifg = torch.stack([g * i * (1 - i), cells[:-1] * f * (1 - f), i * (1 - g * g)], dim=3)  # (steps, G, B, 3, H)
    dh_to_o = tanh_c * o * (1 - o)
    dh_to_dc = o * (1 - tanh_c * tanh_c)
    w = torch.cat([w_ih, w_hh], dim=2)  # (G, 4H, D_in + H): one bmm gives input and recurrent adjoints
    dh = inputs.new_zeros(g_n, n, b, hid)
    dc = inputs.new_zeros(g_n, n, b, hid)
    da = inputs.new_empty(g_n, n, b, 4 * hid)
    dx = inputs.new_zeros(steps, g_n, n, b, d_in)
    for t in range(steps - 1, -1, -1):
        first = n
        for k, pos in enumerate(positions):  # positions >= t are active: a suffix of each list
            lo, hi = bisect.bisect_left(pos, t), bisect.bisect_right(pos, t)
            dh[k, lo:hi] += 1.0  # s_p = Σ_u h_p[u] seeds δh_p = 1 at t = p
            first = min(first, lo)
        if first == n:
            continue
        dh_a, dc_a, da_a = dh[:, first:], dc[:, first:], da[:, first:]
        dc_a.addcmul_(dh_a, dh_to_dc[t][:, None])
        torch.mul(dc_a.unsqueeze(3), dc_to_ifg[t][:, None], out=da_a[..., : 3 * hid].view(g_n, -1, b, 3, hid))
        torch.mul(dh_a, dh_to_o[t][:, None], out=da_a[..., 3 * hid:])
        both = torch.bmm(da_a.reshape(g_n, -1, 4 * hid), w).view(g_n, -1, b, d_in + hid)  # (G, active, B, D_in + H)
        dx[t, :, first:] = both[..., :d_in]
        dh_a.copy_(both[..., d_in:])
        dc_a.mul_(f[t][:, None])
    out[:, :, :, :steps] = rearrange(dx, "t g p b d -> g p b t d")
    return out


def bilstm_head_adjoint(sub: MultiHeadBiLSTM, head: int, inputs: torch.Tensor, queries: Sequence[int]) -> torch.Tensor:
    """``∂(Σ_c H_n[q, c]) / ∂I_n`` of one BiLSTM head for every query token q (forward + reverse units).

    Both directions run in one recurrence when they have the same number of units (one ``bmm`` per step).

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
    fwd_lstm, rev_lstm = sub.lstm(head, 0), sub.lstm(head, 1)
    rev_pos = [t_len - 1 - q for q in reversed(qs)]  # the reverse LSTM reads the flipped sequence
    if getattr(fwd_lstm, "hidden_size", 0) == getattr(rev_lstm, "hidden_size", 0):
        both = _adjoints([fwd_lstm, rev_lstm], torch.stack([inputs, inputs.flip(1)]), [qs, rev_pos])
        fwd, rev = both[0], both[1]
    else:
        fwd = lstm_sum_adjoint(fwd_lstm, inputs, qs)
        rev = lstm_sum_adjoint(rev_lstm, inputs.flip(1), rev_pos)
    return fwd + rev.flip(0).flip(2)

