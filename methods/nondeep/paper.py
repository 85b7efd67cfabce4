"""The paper's numbers that the workbench compares against ("Non-deep Vision Transformers", anonymous ICLR submission).

Copied as printed (ImageNet-1K / CIFAR-10, their hardware). Where the paper contradicts itself
the field comment says so; :mod:`methods.nondeep.flops` reconstructs the cost rows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Table1Row:
    """One row of Table 1 (ImageNet-1K, 300-epoch fine-tuning)."""

    params_m: float  # "#parameters", millions
    flops_m: float  # "FLOPs", millions: multiply-accumulates without the attention matmuls (methods.nondeep.flops)
    gpu_fps: float  # throughput on an RTX 4080, batch 32
    cpu_ms: float  # latency on an Intel i9-9900X, single thread, batch 1
    arm_ms: float  # latency on a Cortex-A72, single thread, batch 1
    top1: float | None  # DeiT row's accuracy (None where only D-MAE's is meaningful)
    top1_dmae: float | None = None  # the D-MAE accuracy printed in the same row


#: Table 1. Rows "DeiT-l / D-MAE-l" share cost columns; the R rows are the collapsed models.
#: Table 2 and Table 6 print the R rows' params as 3.1 / 2.2 / 1.7 M (Table 1: 3.3 / 2.4 / 1.9 M).
PAPER_TABLE1: dict[str, Table1Row] = {
    "DeiT-Tiny": Table1Row(5.7, 1080, 1723, 66.1, 793, 72.2),
    "DeiT-6": Table1Row(3.1, 556, 2932, 41.3, 456, 63.4, 68.6),
    "DeiT-4": Table1Row(2.2, 381, 3756, 32.2, 361, 54.2, 61.0),
    "DeiT-3": Table1Row(1.7, 293, 4114, 28.4, 289, 38.7, 53.8),
    "D-MAE-6-R": Table1Row(3.3, 595, 2840, 41.7, 482, None, 72.4),
    "D-MAE-4-R": Table1Row(2.4, 415, 3592, 33.4, 397, None, 67.0),
    "D-MAE-3-R": Table1Row(1.9, 322, 3884, 31.0, 347, None, 60.5),
}

#: Table 6 (ImageNet-1K): block -> model -> (params M, FLOPs M, top-1 %). Block-1: the branched models without
#: re-parameterisation (same params as DeiT-Tiny), Block-2: depth baselines, Block-3: the re-parameterised models
#: (whose params, 3.1 / 2.2 / 1.7 M, disagree with Table 1's 3.3 / 2.4 / 1.9 M for the same models).
PAPER_TABLE6: dict[str, tuple[float, float, float]] = {
    "D-MAE-6-2": (5.7, 1080, 75.4), "D-MAE-4-3": (5.7, 1080, 71.4), "D-MAE-3-4": (5.7, 1080, 68.8),
    "D-MAE-6": (3.1, 556, 68.6), "D-MAE-4": (2.2, 381, 61.0), "D-MAE-3": (1.7, 293, 53.8),
    "D-MAE-6-R": (3.1, 595, 72.4), "D-MAE-4-R": (2.2, 415, 67.0), "D-MAE-3-R": (1.7, 322, 60.5),
}

#: Table 1 CPU latency ratios against DeiT-Tiny (66.1 ms): what benchmarks/nondeep_latency.py compares.
PAPER_CPU_RATIOS: dict[str, float] = {k: round(r.cpu_ms / 66.1, 3) for k, r in PAPER_TABLE1.items()}

#: Table 5 (CIFAR-10 top-1, %): (schedule, diversity regulariser) -> (6-R, 4-R, 3-R).
PAPER_TABLE5: dict[tuple[str, bool], tuple[float, float, float]] = {
    ("none", False): (95.9, 94.0, 92.2),
    ("instant", False): (91.0, 86.8, 83.4),
    ("linear", True): (95.2, 93.8, 90.4),
    ("linear", False): (94.9, 92.9, 89.8),
    ("cosine", True): (93.9, 92.2, 90.2),
    ("cosine", False): (93.9, 91.7, 89.7),
    ("exponential", True): (94.1, 91.6, 87.8),
    ("exponential", False): (94.3, 91.2, 84.4),
    ("sqrt", True): (94.6, 91.7, 88.9),
    ("sqrt", False): (94.5, 91.4, 87.8),
}

#: Tables 10 / 11: peak GPU memory (GB) on an H100, batch 256, FP32, SGD momentum 0.9:
#: model -> (training, inference). Training runs the *branched* models (5.7 M parameters), although
#: the tables' params column lists the collapsed counts (and "1.08G", a FLOPs figure, for D-MAE-Tiny).
PAPER_MEMORY_GB: dict[str, tuple[float, float]] = {
    "D-MAE-Tiny": (13.16, 1.30),
    "D-MAE-6-R": (14.43, 1.29),
    "D-MAE-4-R": (14.43, 1.29),
    "D-MAE-3-R": (14.54, 1.29),
}

#: §3.3's operation counts for DeiT-Tiny (d = 192, n = 197 tokens), as printed.
PAPER_SEC33_OPS_M: dict[str, float] = {"xwx": 58.8, "qk": 43.9, "ffn": 116.1}

__all__ = ["PAPER_CPU_RATIOS", "PAPER_MEMORY_GB", "PAPER_SEC33_OPS_M", "PAPER_TABLE1", "PAPER_TABLE5", "PAPER_TABLE6",
           "Table1Row"]
