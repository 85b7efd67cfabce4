"""Benchmark: single-thread CPU latency of DeiT-Tiny, FAR-Tiny and pruned FAR-Tiny at 224² and 384² (FAR Table 2).

Models at real size with random weights (``pretrained=False``), batch 1, one thread. The pruned
model keeps the same 31 of 64 hidden units (48%, the share that reproduces FAR-Tiny†'s FLOPs in
Table 2) in every LSTM (``methods.far.latency.uniform_keep_masks``) and is physically shrunk.

Runtimes, as App. A.4 where possible:
  ort    ONNX Runtime, TorchScript-exported (torch.onnx.export, dynamo=False; every nn.LSTM is one
         ONNX LSTM node), intra-op threads 1, CPU memory arena off (ORT_ENABLE_CPU_MEM_ARENA=0)
  torch  PyTorch eager, torch.set_num_threads(1)
Each: median of --repeat runs after --warmup runs (paper: 100 after 30). Prints ms and the ratio to
DeiT-Tiny at the same resolution; paper (ORT, AMD EPYC 9254): FAR-Tiny 1.27 (224) / 0.91 (384),
FAR-Tiny† 1.17 / 0.87.

Measured on the 2-core development VM (shared; median of 20 after 5, one run), ratio to DeiT-Tiny:

  224²: FAR-Tiny  torch 1.89, ORT 1.52 (paper 1.27);  FAR-Tiny† torch 1.57, ORT 1.01 (paper 1.17)
  384²: FAR-Tiny  torch 1.03, ORT 1.13 (paper 0.91);  FAR-Tiny† torch 0.79, ORT 0.77 (paper 0.87)
  (DeiT-Tiny ORT: 29.4 ms at 224², 108 ms at 384²; paper 26.5 / 103.0 ms)

Usage: PYTHONPATH=. python benchmarks/far_latency.py [--repeat 20] [--warmup 5] [--sizes 224 384] [--skip-onnx]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch / onnxruntime start their thread pools
os.environ.setdefault("ORT_ENABLE_CPU_MEM_ARENA", "0")

import argparse  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402

from methods.far import FAR_VARIANTS, PAPER_TABLE2, count_flops, replace_attention, shrink  # noqa: E402
from methods.far.latency import onnx_latency_ms, torch_latency_ms, uniform_keep_masks  # noqa: E402

KEEP = 0.48


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[224, 384])
    ap.add_argument("--skip-onnx", action="store_true")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, batch 1, median of {args.repeat} after {args.warmup} warm-up; "
          f"pruned = {round(KEEP * 64)}/64 units kept in every LSTM")
    for size in args.sizes:
        torch.manual_seed(0)
        deit = FAR_VARIANTS["tiny"].build_teacher(img_size=size).eval()
        far = replace_attention(deit).eval()
        pruned = shrink(far, uniform_keep_masks(far, KEEP)).eval()
        models = {"DeiT-Tiny": deit, "FAR-Tiny": far, "FAR-Tiny†": pruned}
        results: dict[str, dict[str, float]] = {}
        for name, model in models.items():
            row = {"gmacs": count_flops(model, size)["total"]["macs"] / 1e9,
                   "torch": torch_latency_ms(model, size, repeats=args.repeat, warmup=args.warmup)}
            if not args.skip_onnx:
                try:
                    row["ort"] = onnx_latency_ms(model, size, repeats=args.repeat, warmup=args.warmup)
                except Exception as err:  # report and fall back to torch only
                    print(f"  {name}: ONNX Runtime unavailable ({str(err).splitlines()[0][:120]})")
            results[name] = row
        print(f"\n{size}x{size} ({(size // 16) ** 2 + 1} tokens)")
        print(f"  {'model':10s} {'GMACs':>6s} {'torch ms':>9s} {'/DeiT':>6s} {'ORT ms':>8s} {'/DeiT':>6s}   paper ms (/DeiT)")
        base = results["DeiT-Tiny"]
        for name, row in results.items():
            paper = PAPER_TABLE2[name]
            p_ms = paper.cpu_ms_224 if size == 224 else paper.cpu_ms_384
            p_base = PAPER_TABLE2["DeiT-Tiny"].cpu_ms_224 if size == 224 else PAPER_TABLE2["DeiT-Tiny"].cpu_ms_384
            ort = f"{row['ort']:8.1f} {row['ort'] / base['ort']:6.2f}" if "ort" in row and "ort" in base else f"{'-':>8s} {'-':>6s}"
            print(f"  {name:10s} {row['gmacs']:6.2f} {row['torch']:9.1f} {row['torch'] / base['torch']:6.2f} {ort}"
                  f"   {p_ms:7.2f} ({p_ms / p_base:.2f})")


if __name__ == "__main__":
    main()
