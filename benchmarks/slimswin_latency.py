"""Single-thread CPU latency of Swin-T attention: dense vs SlimSwin-pruned (methods.slimswin.pruned).

Swin-T (``swin_tiny_patch4_window7_224``, random weights, ``pretrained=False``), one 224x224 image,
eval mode, ``torch.set_num_threads(1)``. The inputs of every attention layer are recorded from one
dense forward pass; then the 12 attention modules are timed on those inputs (the paper, §VI, also
times attention separately from the rest of the network):

* ``timm``: timm's own ``WindowAttention``;
* ``dense``: :class:`PrunedWindowAttention` with all pairs active (the same kernels, nothing skipped);
* ``pruned``: :class:`PrunedWindowAttention` under a global mask at ratio ``r`` of the prunable
  (non-last-stage) window-head pairs: ``random`` (uniform over pairs: many distinct head sets per
  layer, the worst case for batching) or ``structured`` (in each layer the same number of heads
  per window, rotated across windows; MAC ratio as close as possible to the random one).

Printed per mask: MAC ratio (pruned / dense attention MACs, :func:`attention_macs`), time ratio, and
efficiency = (1 - time ratio) / (1 - MAC ratio), the share of the MAC reduction turned into a
wall-clock reduction. Run: ``PYTHONPATH=. python benchmarks/slimswin_latency.py [--repeats 20]``.
"""

from __future__ import annotations

import argparse
import math
import time

import timm
import torch
from torch import nn

from methods.flops import count_macs
from methods.slimswin import attention_macs, prunable_layers, sum_macs, swin_blocks, swin_layers, to_pruned


def random_masks(model, ratio: float, seed: int = 0) -> list[torch.Tensor]:
    """Prune ``round(ratio * P)`` of the ``P`` prunable pairs uniformly at random."""
    layers, geo = prunable_layers(model), swin_layers(model)
    masks = [torch.ones(g.num_windows, g.num_heads, dtype=torch.bool) for g in geo]
    index = [(l, w, h) for l in layers for w in range(geo[l].num_windows) for h in range(geo[l].num_heads)]
    order = torch.randperm(len(index), generator=torch.Generator().manual_seed(seed))
    for i in order[: round(ratio * len(index))].tolist():
        l, w, h = index[i]
        masks[l][w, h] = False
    return masks


def structured_masks(model, ratio: float) -> list[torch.Tensor]:
    """Each prunable layer keeps ``round((1 - ratio) * H)`` heads per window, rotated over windows."""
    geo = swin_layers(model)
    masks = [torch.ones(g.num_windows, g.num_heads, dtype=torch.bool) for g in geo]
    for l in prunable_layers(model):
        nh = geo[l].num_heads
        keep = max(1, round((1 - ratio) * nh))
        for w in range(geo[l].num_windows):
            masks[l][w] = False
            masks[l][w, [(w + j) % nh for j in range(keep)]] = True
    return masks


def record_inputs(model, image) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(x, mask) seen by each block's attention in a forward pass of ``image``."""
    seen, hooks = [], []
    for block in swin_blocks(model):
        hooks.append(block.attn.register_forward_pre_hook(
            lambda mod, args, kwargs: seen.append((args[0], kwargs.get("mask", args[1] if len(args) > 1 else None))),
            with_kwargs=True))
    with torch.inference_mode():
        model(image)
    for h in hooks:
        h.remove()
    return seen


def time_attention(models: dict[str, nn.Module], inputs, repeats: int) -> dict[str, float]:
    """Per model, the minimum over ``repeats`` rounds of the summed CPU time of its 12 attention layers.

    Thread CPU time (``time.thread_time``), not wall-clock: the time this thread spends computing,
    unaffected by other processes taking the core (the development machine is shared); rounds
    alternate between the models so that slow phases hit all of them alike.
    """
    attns = {name: [block.attn for block in swin_blocks(model)] for name, model in models.items()}
    best = dict.fromkeys(models, math.inf)
    with torch.inference_mode():
        for round_ in range(repeats + 2):  # two warm-up rounds
            for name, layers in attns.items():
                start = time.thread_time()
                for attn, (x, mask) in zip(layers, inputs):
                    attn(x, mask=mask)
                if round_ >= 2:
                    best[name] = min(best[name], time.thread_time() - start)
    return best


def time_forward(models: dict[str, nn.Module], image: torch.Tensor, repeats: int) -> dict[str, float]:
    """Minimum thread CPU time of a whole forward pass per model."""
    best = dict.fromkeys(models, math.inf)
    with torch.inference_mode():
        for round_ in range(repeats + 1):
            for name, model in models.items():
                start = time.thread_time()
                model(image)
                if round_ >= 1:
                    best[name] = min(best[name], time.thread_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.33, 0.67])
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).eval()
    image = torch.randn(1, 3, 224, 224)
    inputs = record_inputs(model, image)
    dense_macs = sum_macs(attention_macs(model))
    fused = [block.attn.fused_attn for block in swin_blocks(model)]
    for block in swin_blocks(model):
        block.attn.fused_attn = True  # the count below must not depend on the attention kernel
    counted = count_macs(model, image)
    for block, flag in zip(swin_blocks(model), fused):
        block.attn.fused_attn = flag  # timed as timm builds it
    counted_attn = sum(counted.within(f"layers.{g.stage}.blocks.{g.block}.attn") for g in swin_layers(model))
    if counted_attn != dense_macs:
        raise RuntimeError(f"analytic attention MACs {dense_macs} != methods.flops.count_macs {counted_attn}")
    models = {"timm": model, "dense": to_pruned(model)}
    masks = {}
    for ratio in args.ratios:
        for kind, make in (("random", random_masks), ("structured", structured_masks)):
            masks[f"{kind} {ratio:.2f}"] = make(model, ratio)
            models[f"{kind} {ratio:.2f}"] = to_pruned(model, masks[f"{kind} {ratio:.2f}"])
    times = time_attention(models, inputs, args.repeats)
    t_timm, t_dense = times["timm"], times["dense"]
    print(f"torch {torch.__version__}, timm {timm.__version__}, {torch.get_num_threads()} thread, Swin-T 224, batch 1, "
          f"eval; attention of all 12 layers; thread CPU time, min of {args.repeats} interleaved rounds")
    print(f"dense attention: {dense_macs / 1e9:.3f} GMAC (= methods.flops.count_macs with fused SDPA); timm WindowAttention {t_timm * 1e3:.2f} ms; "
          f"PrunedWindowAttention with all pairs active ('dense') {t_dense * 1e3:.2f} ms")
    print("efficiency = (1 - time ratio) / (1 - MAC ratio): share of the MAC reduction realised in time")
    print(f"{'mask':<17}{'MAC ratio':>10}{'ms':>8}{'t/timm':>8}{'eff':>6}{'t/dense':>9}{'eff':>6}")
    for name, mask in masks.items():
        mac = sum_macs(attention_macs(model, mask)) / dense_macs
        t = times[name]
        print(f"{name:<17}{mac:>10.3f}{t * 1e3:>8.2f}{t / t_timm:>8.3f}{(1 - t / t_timm) / (1 - mac):>6.2f}"
              f"{t / t_dense:>9.3f}{(1 - t / t_dense) / (1 - mac):>6.2f}")
    full = time_forward({k: models[k] for k in ("timm", *[n for n in masks if n.startswith("random")])}, image, 5)
    print("whole Swin-T forward (ms): " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in full.items()))


if __name__ == "__main__":
    main()
