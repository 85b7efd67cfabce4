"""Benchmark: images per second of every explainer against a plain forward + backward, measured side by side.

A DeiT-S-sized model (timm ``deit_small_patch16_224``, random weights, no download), 224 px, batch 8, one
thread by default. Cases, timed in interleaved rounds (every case once per round, rotating order, so that a drifting
machine load affects all alike), median over ``--repeats`` after ``--warmup``:

- ``forward + backward``: the untouched model (timm's fused attention), the target logits' sum backpropagated
  (``.backward()``: the weights' gradients and the input's), the reference of the ratios;
- ``forward + input grad``: the same with the weights frozen, only ∂y/∂x (the least any gradient explanation
  must do; explainers never need the weights' gradients);
- ``forward``: the same without the backward, no grad;
- each registered explainer that applies, through :func:`workbench.explain.attribute` (Dataset included), IG with
  ``--ig-steps`` nodes (timed in one round only: it costs ~``--ig-steps`` forward + backward passes, long enough
  that one round is a stable measurement);
- ``perturbation (pos + neg)``: Chefer's positive and negative perturbation of one map per image (10 steps each).

Printed: seconds per batch, images per second, and the ratio to ``forward + backward`` (issue #29's target: the
generic attention method, AttnLRP and Grad-CAM within 3x). Run::

    PYTHONPATH=. python benchmarks/explanations.py [--batch 8] [--threads 1] [--repeats 3] [--ig-steps 50]
        [--only attnlrp,cp_lrp,chefer_lrp] [--skip ig]

``--held-out N`` times instead the perturbation test over the first N held-out demo digits (``demo:val[:N]``; issue
#29's target: the 1000 within 2 minutes per (method, model)) for a trained model (``--run``, default the demo ViT
teacher ``teacher-vit-demo`` of ``$WORKBENCH_HOME``) and each explainer of ``--only`` (default generic_attention,
attnlrp, rollout), once each, in three parts: the maps of the predicted class (:func:`workbench.explain.attribute`),
Chefer's positive + negative perturbation of those maps (:func:`workbench.explain.faithfulness.perturbation`, 10
steps each), and the whole ``faithfulness`` call the gallery makes (predicted and label class: the label's maps
where it differs from the prediction, both scores)::

    PYTHONPATH=. python benchmarks/explanations.py --held-out 1000 [--run teacher-vit-demo] [--threads 1]
        [--only generic_attention,attnlrp,rollout] [--batch 32]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import timm
import torch

from workbench.explain import applicability, attribute
from workbench.explain.faithfulness import perturbation


def median_times(cases: dict[str, Callable[[], object]], warmup: int, repeats: int, once: set[str] = frozenset()
                 ) -> dict[str, float]:
    """Median wall time (s) of each case over interleaved rounds after ``warmup`` untimed ones; the cases in
    ``once`` run in the first timed round only."""
    names = list(cases)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + repeats):
        for n in names[r % len(names):] + names[: r % len(names)]:
            if n in once and r != warmup:
                continue
            t0 = time.perf_counter()
            cases[n]()
            if r >= warmup:
                times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}


def held_out(args) -> None:
    """``--held-out N``: the perturbation test over N held-out demo digits per explainer (module docstring)."""
    from workbench.data import load_images
    from workbench.explain.faithfulness import faithfulness
    from workbench.models import load_model

    lm = load_model(args.run, device="cpu")
    batch = load_images(f"demo:val[:{args.held_out}]", input_size=lm.input_size, mean=lm.mean, std=lm.std)
    x, y = batch.tensor, torch.as_tensor(batch.labels)
    names = [s for s in (args.only or "generic_attention,attnlrp,rollout").split(",") if s]
    print(f"{args.run}, {len(x)} held-out digits {tuple(x.shape[1:])}, {torch.get_num_threads()} thread(s), "
          f"explainer batch {args.batch}; each part timed once")
    print(f"{'explainer':<20}{'maps s':>9}{'perturb s':>11}{'maps+perturb s':>16}{'faithfulness s':>16}"
          f"{'img / s':>9}{'≤ 120 s':>9}")
    for n in names:
        t0 = time.perf_counter()
        expl = attribute(lm.model, x, method=n, batch_size=args.batch)
        t1 = time.perf_counter()
        perturbation(lm.model, x, expl, batch_size=256)
        t2 = time.perf_counter()
        faithfulness(lm.model, x, y, method=[n], batch_size=args.batch)
        t3 = time.perf_counter()
        print(f"{n:<20}{t1 - t0:>9.1f}{t2 - t1:>11.1f}{t2 - t0:>16.1f}{t3 - t2:>16.1f}{len(x) / (t3 - t2):>9.1f}"
              f"{'yes' if t3 - t2 <= 120 else 'no':>9}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ig-steps", type=int, default=50)
    parser.add_argument("--skip", default="", help="comma-separated explainers not to time")
    parser.add_argument("--only", default="", help="comma-separated explainers to time (default: every one that applies)")
    parser.add_argument("--held-out", type=int, default=0, metavar="N",
                        help="time the perturbation test over N held-out demo digits instead (module docstring)")
    parser.add_argument("--run", default="teacher-vit-demo", help="--held-out: the trained model (a run id)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.held_out:
        return held_out(args)

    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False).eval()
    x = torch.randn(args.batch, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    target = torch.arange(args.batch) % 1000

    def forward_backward() -> None:
        xi = x.detach().requires_grad_(True)
        model(xi).gather(1, target[:, None]).sum().backward()
        model.zero_grad(set_to_none=True)

    def forward_input_grad() -> None:
        for p in model.parameters():
            p.requires_grad_(False)
        xi = x.detach().requires_grad_(True)
        torch.autograd.grad(model(xi).gather(1, target[:, None]).sum(), xi)
        for p in model.parameters():
            p.requires_grad_(True)

    def forward() -> None:
        with torch.no_grad():
            model(x)

    cases: dict[str, Callable[[], object]] = {"forward + backward": forward_backward,
                                                  "forward + input grad": forward_input_grad, "forward": forward}
    skip = {s for s in args.skip.split(",") if s}
    only = {s for s in args.only.split(",") if s}
    names = [n for n, why in applicability(model).items() if why is None and n not in skip and (not only or n in only)]
    for n in names:
        cases[n] = lambda n=n: attribute(model, x, method=n, target=target, batch_size=args.batch,
                                         **({"n_steps": args.ig_steps} if n == "ig" else {}))
    expl = attribute(model, x, method="rollout", target=target)
    cases["perturbation (pos + neg)"] = lambda: perturbation(model, x, expl, batch_size=80)

    print(f"{args.model}, random weights, 224 px, batch {args.batch}, {torch.get_num_threads()} thread(s), "
          f"median of {args.repeats} after {args.warmup} warm-up; ig: {args.ig_steps} nodes")
    times = median_times(cases, args.warmup, args.repeats, once={"ig"})
    base = times["forward + backward"]
    print(f"{'case':<26}{'s / batch':>11}{'images / s':>12}{'x fwd+bwd':>11}")
    for n, t in times.items():
        print(f"{n:<26}{t:>11.3f}{args.batch / t:>12.2f}{t / base:>11.2f}")
    skipped = {n: why for n, why in applicability(model).items() if why is not None}
    for n, why in skipped.items():
        print(f"not applicable: {n}: {why}")


if __name__ == "__main__":
    main()
