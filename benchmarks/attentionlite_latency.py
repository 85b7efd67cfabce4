"""Benchmark: single-thread CPU latency of AttentionLite's teacher, dense student and column-pruned student,
and of the local self-attention layer against a naive unfold implementation.

Part 1 (models, eval mode, batch 1 unless --batch, random weights): at paper size the CIFAR-stem
ResNet50 teacher vs SA-ResNet26 (hybrid) dense vs SA-ResNet26 column-pruned at d = 0.5 and shrunk
(``methods.attentionlite.shrink``; masks = sparse momentum's initial masks, uniform density per
layer), 3×32×32; at demo size ``cnn_demo`` vs ``sa_resnet_demo`` vs the same at d = 0.5, 1×28×28.
Prints ms, MACs and the ratio to the teacher measured in the same run. The paper reports FLOPs only
(Tables 1–2), no latency.

Part 2 (one LocalSelfAttention layer): ours (``neighbour_dot`` / ``neighbour_mix``: offset loops with
in-place accumulation and hand-written backward) vs ``local_attention_unfold`` (im2col of keys and
values, the relative-embedding table materialised per pixel, autograd), forward and forward+backward,
at the shapes of SA-ResNet26's stages (batch 8) and of the demo student's first stage (batch 64).

Each timing is the minimum of --repeat rounds after --warmup, the compared functions interleaved in
every round (ratios compare timings taken under the same load). One thread (torch.set_num_threads(1)).

Measured on the shared 2-core development VM (load average ≈ 3 during the run, one run; ratios are
the meaningful part):

  32×32, batch 1:  teacher 1298 MMACs 103 ms | SA-ResNet26 679 MMACs 1.25× | column d=0.5 shrunk 298 MMACs 1.12×
  (batch 16 in a separate run: dense 1.33×, shrunk 1.17× the teacher's time)
  28×28, batch 1:  cnn_demo 19.6 MMACs 2.2 ms | sa_resnet_demo 5.4 MMACs 4.09× | shrunk 2.6 MMACs 3.11×
  (batch 64 in a separate run: dense 1.62×, shrunk 1.59×)
  The students do 2–4× fewer MACs than their teachers but are not faster on a CPU: 1×1 convolutions,
  gathers and 2k² element-wise neighbour products per attention layer run far below the GEMM rate of
  the teachers' 3×3 convolutions. The paper reports FLOPs only.

  attention layer, naive / ours (forward; forward+backward): B8 C64 32² k7 7.8×; 8.0× | C128 16² 8.7×; 10.0× |
  C256 8² 3.3×; 1.3× | C512 4² 0.97×; 0.91× (both im2col there) | B1 C64 32² 2.6×; 2.4× |
  B64 C8 28² k3 1.6×; 1.8× | B64 C16 28² k3 2.2×; 3.2×

Usage: PYTHONPATH=. python benchmarks/attentionlite_latency.py [--repeat 10] [--warmup 2] [--skip-paper]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import time  # noqa: E402
from typing import Callable  # noqa: E402

import timm  # noqa: E402
import torch  # noqa: E402

import methods.teachers  # noqa: E402,F401  (registers cnn_demo)
from methods.attentionlite import (  # noqa: E402
    LocalSelfAttention,
    SparseMomentum,
    cifar_resnet50,
    count_macs_sparse,
    local_attention_unfold,
    shrink,
)


def round_robin_ms(fns: dict[str, Callable[[], object]], repeat: int, warmup: int) -> dict[str, float]:
    """Minimum ms of each function over ``repeat`` rounds, the functions interleaved within every round
    (so that every ratio compares timings taken under the same load of a shared machine)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: min(t) * 1e3 for name, t in times.items()}


@torch.no_grad()
def models_part(title: str, teacher: torch.nn.Module, student: torch.nn.Module, x: torch.Tensor, repeat: int,
                warmup: int) -> None:
    masked = copy.deepcopy(student)
    hook = SparseMomentum(masked, 0.5, "column", epochs=1)
    rows = {"teacher": teacher.eval(), "student (dense)": student.eval(),
            "student column d=0.5 (shrunk)": shrink(masked, hook.weight_masks())}
    print(f"\n{title}: input {tuple(x.shape)}, realised density {hook.realised_density():.3f}")
    print(f"  {'model':32s} {'MMACs':>8s} {'params':>9s} {'ms':>8s} {'/teacher':>9s}")
    ms = round_robin_ms({name: (lambda m=model: m(x)) for name, model in rows.items()}, repeat, warmup)
    for name, model in rows.items():
        macs = count_macs_sparse(model, x)["dense"] / 1e6 * x.shape[0]
        params = sum(p.numel() for p in model.parameters())
        print(f"  {name:32s} {macs:8.1f} {params:9d} {ms[name]:8.2f} {ms[name] / ms['teacher']:9.2f}")


def attention_part(shapes: list[tuple[int, int, int, int, int]], repeat: int, warmup: int) -> None:
    print("\nLocalSelfAttention: ours (neighbour operators) vs naive unfold; ms, ratio naive / ours")
    print(f"  {'B':>3s} {'C':>4s} {'HxW':>6s} {'k':>2s} {'heads':>5s} | {'fwd ours':>9s} {'naive':>9s} {'x':>5s} | "
          f"{'fwd+bwd ours':>12s} {'naive':>9s} {'x':>5s}")
    for B, C, H, k, heads in shapes:
        torch.manual_seed(0)
        layer = LocalSelfAttention(C, C, k, heads)
        x = torch.randn(B, C, H, H)
        with torch.no_grad():
            torch.testing.assert_close(layer(x), local_attention_unfold(x, layer), rtol=1e-4, atol=1e-5)
            fwd = round_robin_ms({"ours": lambda: layer(x), "naive": lambda: local_attention_unfold(x, layer)},
                                 repeat, warmup)
        xg = x.clone().requires_grad_()
        bwd = round_robin_ms({"ours": lambda: layer(xg).sum().backward(),
                              "naive": lambda: local_attention_unfold(xg, layer).sum().backward()}, repeat, warmup)
        f_ours, f_naive, b_ours, b_naive = fwd["ours"], fwd["naive"], bwd["ours"], bwd["naive"]
        print(f"  {B:3d} {C:4d} {H:>3d}x{H:<2d} {k:2d} {heads:5d} | {f_ours:9.2f} {f_naive:9.2f} {f_naive / f_ours:5.2f} | "
              f"{b_ours:12.2f} {b_naive:9.2f} {b_naive / b_ours:5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--skip-paper", action="store_true", help="skip the paper-size models (slowest part)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, min of {args.repeat} interleaved rounds after {args.warmup} warm-up, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    torch.manual_seed(0)
    if not args.skip_paper:
        models_part("paper size: CIFAR ResNet50 vs SA-ResNet26 (hybrid)", cifar_resnet50(10),
                    timm.create_model("sa_resnet26"), torch.randn(args.batch, 3, 32, 32), args.repeat, args.warmup)
    models_part("demo size: cnn_demo vs sa_resnet_demo", timm.create_model("cnn_demo"), timm.create_model("sa_resnet_demo"),
                torch.randn(args.batch, 1, 28, 28), args.repeat, args.warmup)
    shapes = [(8, 64, 32, 7, 8), (8, 128, 16, 7, 8), (8, 256, 8, 7, 8), (8, 512, 4, 7, 8), (1, 64, 32, 7, 8),
              (64, 8, 28, 3, 2), (64, 16, 28, 3, 2)]
    attention_part(shapes, args.repeat, args.warmup)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
