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
import statistics
import time

import timm
import torch

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


def time_attention(model, inputs, repeats: int) -> float:
    """Median over ``repeats`` of the summed time of all attention layers (seconds)."""
    attns = [block.attn for block in swin_blocks(model)]
    times = []
    with torch.inference_mode():
        for _ in range(2):  # warm-up
            for attn, (x, mask) in zip(attns, inputs):
                attn(x, mask=mask)
        for _ in range(repeats):
            start = time.perf_counter()
            for attn, (x, mask) in zip(attns, inputs):
                attn(x, mask=mask)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


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
    t_timm = time_attention(model, inputs, args.repeats)
    t_dense = time_attention(to_pruned(model), inputs, args.repeats)
    print(f"torch {torch.__version__}, timm {timm.__version__}, threads {torch.get_num_threads()}, "
          f"Swin-T 224 batch 1, attention of 12 layers, median of {args.repeats}")
    print(f"dense attention MACs {dense_macs / 1e9:.3f}e9; timm WindowAttention {t_timm * 1e3:.2f} ms; "
          f"PrunedWindowAttention (all active) {t_dense * 1e3:.2f} ms")
    print(f"{'mask':<11}{'r':>6}{'MAC ratio':>11}{'time ratio':>12}{'ms':>9}{'efficiency':>12}  (vs timm)")
    for ratio in args.ratios:
        for kind, masks in (("random", random_masks(model, ratio)), ("structured", structured_masks(model, ratio))):
            pruned = to_pruned(model, masks)
            macs = sum_macs(attention_macs(model, masks)) / dense_macs
            t = time_attention(pruned, inputs, args.repeats)
            eff = (1 - t / t_timm) / (1 - macs)
            print(f"{kind:<11}{ratio:>6.2f}{macs:>11.3f}{t / t_timm:>12.3f}{t * 1e3:>9.2f}{eff:>12.2f}")
            # whole-model check: pruned output differs from dense only by the pruned heads
    with torch.inference_mode():
        full = [time.perf_counter()]
        for _ in range(3):
            model(image)
        full.append(time.perf_counter())
    print(f"(whole Swin-T forward, dense, for scale: {(full[1] - full[0]) / 3 * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
