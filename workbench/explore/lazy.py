"""FAR's dependency for the explorer: the clicked query's rows at once, every query's in the background.

FAR has no attention; its maps are the gradient saliency of :mod:`workbench.analysis.dependency`,
``dep[l, h, q, k] = ‖∂(Σ_c y_l[q, h, c]) / ∂u_l[k]‖₂`` with u_l = LN1(x_l) the mixer input of block l. Computing
every query of an image (the extractor) takes tens of seconds for a DeiT-S-sized FAR, so a click asks only for its
own query q (:func:`query_rows`): per head the output splits into the per-token map z = φ(u) (the substitute's
LayerNorm and input projection, I = Proj_in(LN(u)), head n reading its slice I_n only) and the BiLSTM mixer, and

    ∂(Σ_c y[q, n, c]) / ∂u_k = J_{k,n}ᵀ δz_{k,n},    δz_n = ∂(Σ_c y[q, n, c]) / ∂I_n.

Head n's outputs depend on I_n alone, so one backward of Σ_n Σ_c y[q, n, c] gives every head's δz_n at once, for
every layer together (one ``autograd.grad``; each LSTM runs only the steps its output at q depends on: tokens ≤ q
forwards, ≥ q in reverse); then per layer δz_n through head n's rows of Proj_in and one vector-Jacobian product of
the LayerNorm, batched over the heads (``vmap``) and over tokens (φ acts per token). :class:`Background` then computes every query of the image with the extractor's own
:func:`~workbench.analysis.dependency.dependency_factored`, layer by layer in a worker thread, from the block inputs
the click kept (no second forward, no hooks in the thread); later clicks slice it once it is done.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn as nn

from workbench.analysis.dependency import dependency_factored, head_output_fn
from workbench.analysis.head_fns import is_far_substitute

__all__ = ["query_rows", "Background"]

_RUNNING: weakref.WeakSet = weakref.WeakSet()  # background jobs not yet finished


@atexit.register
def _stop_all() -> None:
    """At interpreter exit: stop the background jobs after their current layer (a thread killed inside a torch op
    aborts the process)."""
    for job in list(_RUNNING):
        job.cancel()
    for job in list(_RUNNING):
        job.thread.join(timeout=60)


def query_rows(blocks: Sequence[nn.Module], inputs: Sequence[torch.Tensor], q: int) -> np.ndarray:
    """``(layer, head, T)`` dependency rows of query token ``q``, every block and head; NaN past a layer's heads.

    Args:
        blocks: the model's blocks (FAR substitutes, or attention: those take the factored path for one query).
        inputs: each block's mixer input u_l = LN1(x_l), ``(1, T, D)``.
        q: the query token (prefix tokens first).
    """
    t_len = inputs[0].shape[1]
    heads = [int(getattr(b.attn, "num_heads", 1)) for b in blocks]
    out = np.full((len(blocks), max(heads), t_len), np.nan, np.float32)
    far_layers, lstm_in, seeds = [], [], []
    for l, (block, u) in enumerate(zip(blocks, inputs)):
        if not is_far_substitute(block.attn):
            fn = head_output_fn(block, "mixer_input")
            out[l, :fn.num_heads] = dependency_factored(fn, u, [q])[0, :, 0].float().cpu().numpy()
            continue
        far_layers.append(l)
        with torch.no_grad():
            lstm_in.append(block.attn.lstm_inputs(u).requires_grad_(True))  # I: (1, T, N·D_h)
    with torch.enable_grad():
        for l, i_l in zip(far_layers, lstm_in):
            seeds.append(_seed(blocks[l].attn, i_l, q))
        grads = torch.autograd.grad(sum(seeds), lstm_in, allow_unused=True, materialize_grads=True) if lstm_in else []
    for l, dz in zip(far_layers, grads):  # dz: (1, T, N·D_h), head n's slice its own δz
        sub, n_h, dh = blocks[l].attn, heads[l], blocks[l].attn.head_dim
        dz_heads = dz[0].reshape(t_len, n_h, dh).transpose(0, 1)  # (N, T, D_h)
        w_heads = sub.in_proj.weight.reshape(n_h, dh, -1)  # (N, D_h, D): head n's rows of Proj_in
        with torch.enable_grad():
            _, pull = torch.func.vjp(sub.norm, inputs[l].detach())  # the substitute's own LayerNorm at u
        with torch.no_grad():
            g_norm = torch.einsum("ntc,ncd->ntd", dz_heads, w_heads)  # (N, T, D): through Proj_in, per head
            g = torch.func.vmap(lambda ct: pull(ct)[0])(g_norm[:, None])  # (N, 1, T, D): J_kᵀ δz_k, every token k
        out[l, :n_h] = g[:, 0].norm(dim=-1).float().cpu().numpy()
    return out


def _seed(sub: nn.Module, inputs: torch.Tensor, q: int) -> torch.Tensor:
    """Σ over heads and units of a FAR substitute's BiLSTM outputs at token q, from the LSTM inputs ``(1, T, N·D_h)``:
    each LSTM runs only the steps its output at q depends on (tokens ≤ q forwards, ≥ q in reverse)."""
    dh = sub.head_dim
    total = inputs.new_zeros(())
    for n in range(sub.num_heads):
        i_n = inputs[..., n * dh:(n + 1) * dh]  # (1, T, D_h)
        fwd, _ = sub.lstm(n, 0)(i_n[:, :q + 1])  # (1, q + 1, U_fwd)
        rev, _ = sub.lstm(n, 1)(i_n[:, q:].flip(1))  # (1, T - q, U_rev): the reverse LSTM reads the flipped sequence
        total = total + fwd[:, -1].sum() + rev[:, -1].sum()
    return total


class Background:
    """Every query's dependency of one image, computed layer by layer in a daemon thread.

    Args:
        blocks: the model's blocks.
        inputs: their mixer inputs for the image, ``(1, T, D)`` each.
        done: called with the ``(layer, head, T, T)`` float32 array when finished (not when cancelled).
    """

    def __init__(self, blocks: Sequence[nn.Module], inputs: Sequence[torch.Tensor], done: Callable[[np.ndarray], None]):
        self.blocks, self.inputs, self.done = list(blocks), list(inputs), done
        self.cancelled = threading.Event()
        self.finished = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="explore-far-dependency", daemon=True)
        _RUNNING.add(self)
        self.thread.start()

    def _run(self) -> None:
        try:
            try:  # Linux: a lower priority for this thread, so that clicks and the kernel stay responsive
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
            except (AttributeError, OSError):
                pass
            fns = [head_output_fn(b, "mixer_input") for b in self.blocks]
            t_len = self.inputs[0].shape[1]
            full = np.full((len(fns), max(f.num_heads for f in fns), t_len, t_len), np.nan, np.float32)
            for l, (fn, u) in enumerate(zip(fns, self.inputs)):
                if self.cancelled.is_set():
                    return
                full[l, :fn.num_heads] = dependency_factored(fn, u, None)[0].float().cpu().numpy()  # (N, T, T)
            if not self.cancelled.is_set():
                self.done(full)
        except BaseException as err:  # noqa: BLE001 — kept for wait() to raise; clicks fall back to query rows
            self.error = err
        finally:
            self.finished.set()
            _RUNNING.discard(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until finished; True when done. Raises what the thread raised."""
        self.finished.wait(timeout)
        if self.error is not None:
            raise self.error
        return self.finished.is_set()

    def cancel(self) -> None:
        """Stop after the current layer (the image is no longer kept)."""
        self.cancelled.set()
