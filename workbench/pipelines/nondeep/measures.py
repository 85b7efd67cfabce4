"""Non-deep ViT measurements and model forms the figures read (Tables 1, 10, 11, App. B.2, Figs. 4-6).

Ding et al., "Non-deep ViT" (papers/002), on top of :mod:`methods.nondeep`: parameter / MAC counts and
single-thread CPU latency of real-size DeiT-Tiny forms (Table 1), peak memory (Tables 10-11), the λ schedules
(App. B.2), the branched model at its initialisation from a teacher (Figs. 4-5), the similarity of the weight
updates made at λ = 1 (Fig. 6), and the random 3×4 model and LayerNorm factorisations of the exactness table.
The figure modules (:mod:`workbench.figures.nondeep.items`, ``nondeep_table1``, ``nondeep_tables``) store what these
return as figure data; nothing here reads or writes a store.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from workbench.runs import Run

__all__ = ["BASE", "collapse_descriptions", "deit", "real_size_rows",
           "demo_costs_and_latencies", "memory_rows", "lambda_schedules", "initial_branched", "weight_update_similarity",
           "training_update_similarity",
           "random_four_branch", "ln_factorisation"]

BASE = "deit_tiny_patch16_224"  # the real-size teacher of Tables 1, 10, 11


def collapse_descriptions() -> dict[str, str]:
    """Merge formula -> what it does (:data:`methods.nondeep.COLLAPSE_VARIANTS`)."""
    from methods.nondeep import COLLAPSE_VARIANTS

    return {k: v.description for k, v in COLLAPSE_VARIANTS.items()}


def deit(size: int, name: str | None = None, **kwargs) -> nn.Module:
    """DeiT-Tiny at ``size``² (random weights), or one of its Non-deep forms (``name``, ``branches=n``)."""
    import timm

    if name is None:
        return timm.create_model(BASE, img_size=size, **kwargs)
    return timm.create_model(name, base=BASE, base_kwargs={"img_size": size}, **kwargs)


def real_size_rows(b, log: Callable[[str], None]) -> list[dict]:
    """Table 1 at real size (random weights): params, MACs (both conventions), the paper's rows, the paper's R form
    counted by hand, and single-thread latency (round-robin, ``b.table1_repeats`` rounds) of every deployable form."""
    from methods.nondeep import PAPER_TABLE1, PAPER_TABLE6, cost, latencies, paper_r_form_cost
    from workbench.runtime import cpu_threads

    rows, models, size = [], {}, b.real_img_size
    with cpu_threads(1):
        torch.manual_seed(0)
        entries = [("DeiT-Tiny (12 blocks)", "DeiT-Tiny", deit(size), "teacher")]
        for n in b.table1_branches:
            d = 12 // n
            entries.append((f"DeiT-{d} (first {d} blocks)", f"DeiT-{d}", deit(size, depth=d), "depth baseline"))
            collapsed = deit(size, "nondeep_collapsed", branches=n)
            entries.append((f"collapsed {d} (exact, from {d}×{n})", f"D-MAE-{d}-R", collapsed, "collapsed"))
            smallest = deit(size, "nondeep_collapsed", branches=n, form="xwx_min")  # no identity matrices (not timed)
            entries.append((f"collapsed {d} (smallest exact: X·M·Xᵀ, X·G)", f"D-MAE-{d}-R", smallest, "smallest exact"))
            branched = deit(size, "nondeep_branched", branches=n)
            entries.append((f"branched {d}×{n} (train form)", None, branched, "branched"))
        for name, paper, model, kind in entries:
            log(f"  nondeep.table1: counting {name}")
            c = cost(model.eval())
            row = PAPER_TABLE1.get(paper) if paper else None
            if kind == "branched":  # Table 6 Block-1: the branched D-MAE-l-n without re-parameterisation
                d = int(name.split(" ")[1].split("×")[0])
                paper = f"D-MAE-{d}-{12 // d}"
                p6 = PAPER_TABLE6[paper]
            rows.append({"setting": f"{size}², random weights", "model": name, "kind": kind, "params": c.params,
                         "macs": c.macs,
                         "macs_paper": c.macs_paper, "paper_row": paper,
                         "paper_params_m": row.params_m if row else (p6[0] if kind == "branched" else None),
                         "paper_flops_m": row.flops_m if row else (p6[1] if kind == "branched" else None),
                         "paper_cpu_ms": row.cpu_ms if row else None,
                         "head_dim": model.blocks[0].attn.head_dim if kind != "branched" else None})
            if kind not in ("branched", "smallest exact"):
                models[name] = model
        for n in b.table1_branches:
            d = 12 // n
            c = paper_r_form_cost(d, tokens=(size // 16) ** 2 + 1)
            row = PAPER_TABLE1[f"D-MAE-{d}-R"]
            rows.append({"setting": f"{size}², counted by hand",
                         "model": f"paper's R form {d} (X·W·Xᵀ scores, Eq. 7 V/O)",
                         "kind": "paper R form", "params": c.params, "macs": c.macs, "macs_paper": c.macs_paper,
                         "paper_row": f"D-MAE-{d}-R", "paper_params_m": row.params_m, "paper_flops_m": row.flops_m,
                         "paper_cpu_ms": row.cpu_ms})
        log(f"  nondeep.table1: timing {len(models)} real-size models, {b.table1_repeats} round-robin runs")
        ms = latencies(models, (3, size, size), repeats=b.table1_repeats, warmup=b.table1_warmup)
    for r in rows:
        r["ms"] = ms.get(r["model"])
    return rows


def demo_costs_and_latencies(models: dict[str, nn.Module], input_size: tuple[int, int, int], repeats: int,
                             warmup: int) -> tuple[dict[str, object], dict[str, float]]:
    """``(name -> cost, name -> single-thread latency in ms)`` of trained demo models (timed round-robin)."""
    from methods.nondeep import cost, latencies
    from workbench.runtime import cpu_threads

    with cpu_threads(1):
        ms = latencies(models, input_size, repeats=repeats, warmup=warmup)
    return {name: cost(m) for name, m in models.items()}, ms


def memory_rows(b, device: torch.device, log: Callable[[str], None]) -> list[dict]:
    """Peak memory of one training step (branched forms, DeiT-Tiny) and one inference forward (collapsed forms),
    beside the paper's Tables 10-11."""
    from methods.nondeep import PAPER_MEMORY_GB, peak_memory
    from workbench.runtime import cpu_threads

    rows = []

    def add(mode: str, name: str, model, paper: str | None):
        torch.manual_seed(0)
        log(f"  nondeep.memory: {mode} {name}")
        peak = peak_memory(model.to(device), b.memory_batch, mode, input_size=(3, b.real_img_size, b.real_img_size))
        gb = PAPER_MEMORY_GB.get(paper) if paper else None
        rows.append({"mode": mode, "model": name, "bytes": peak,
                     "paper_gb": None if gb is None else gb[0 if mode == "train" else 1],
                     "paper_row": paper})

    with cpu_threads(1):
        size = b.real_img_size
        add("train", "DeiT-Tiny (12 blocks)", deit(size), "D-MAE-Tiny")
        explicit = deit(size)
        for m in explicit.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = False  # keeps the attention matrices for backward, as the branched blocks must
        add("train", "DeiT-Tiny, explicit attention", explicit, None)
        for n in b.table1_branches:
            add("train", f"branched {12 // n}×{n}", deit(size, "nondeep_branched", branches=n),
                f"D-MAE-{12 // n}-R")
        add("infer", "DeiT-Tiny (12 blocks)", deit(size), "D-MAE-Tiny")
        for n in b.table1_branches:
            add("infer", f"collapsed {12 // n} (exact)", deit(size, "nondeep_collapsed", branches=n),
                f"D-MAE-{12 // n}-R")
    return rows


def lambda_schedules(t: np.ndarray) -> tuple[list[str], np.ndarray, int, int]:
    """``(schedules, λ (schedule, t), the paper's warm-up steps, the paper's adjustment steps)`` (App. B.2)."""
    from methods.nondeep import SCHEDULES, JoinConfig, lambda_schedule

    paper = JoinConfig()
    lam = np.array([[lambda_schedule(s, float(x)) for x in t] for s in SCHEDULES])
    return list(SCHEDULES), lam, paper.warmup_steps, paper.adjust_steps


def initial_branched(teacher: nn.Module, n: int, teacher_run: Run) -> nn.Module:
    """The branched model at its initialisation from the teacher (λ = 0, branch b of block i = teacher block n·i+b)."""
    from methods.nondeep import branch

    return branch(teacher, n, base=teacher_run.config["model_name"], base_kwargs=teacher_run.config["model_kwargs"]).eval()


def weight_update_similarity(run: Run | str) -> tuple[np.ndarray, list[str]]:
    """Similarity of the weight updates made at λ = 1 between branches, ``(block, module, n, n)``, and the modules."""
    from methods.nondeep import WEIGHT_MODULES, update_similarity
    from workbench.pipelines.nondeep.run import load_branched, load_joined

    return update_similarity(load_joined(run), load_branched(run)).numpy(), list(WEIGHT_MODULES)


def training_update_similarity(start: nn.Module, run: Run | str) -> tuple[np.ndarray, list[str]]:
    """Similarity of the weight updates the branches made from ``start`` (the branched model at its initialisation)
    to the end of ``run`` (e.g. Table 5's λ = 0 run), ``(block, module, n, n)``, and the modules."""
    from methods.nondeep import WEIGHT_MODULES, update_similarity
    from workbench.pipelines.nondeep.run import load_branched

    return update_similarity(start, load_branched(run)).cpu().numpy(), list(WEIGHT_MODULES)


def random_four_branch() -> nn.Module:
    """n = 4 does not divide the demo teacher's 6 blocks: a random 12-block demo-width ViT with every bias and LN
    affine perturbed, branched into 3 blocks × 4 branches, branches perturbed apart, at λ = 1."""
    import timm

    from methods.nondeep import branch, set_lambda

    torch.manual_seed(0)
    big = timm.create_model("vit_demo", depth=12).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in big.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
        four = branch(big, 4).eval()
        for p in four.blocks.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    set_lambda(four, 1.0)
    return four


def ln_factorisation(run: Run | str, images: torch.Tensor, teacher: nn.Module) -> list[dict]:
    """LayerNorm factorisation errors (Eq. 1 forward, Eq. 2 backward) of ``run``'s branched model: a property of
    the teacher (:func:`methods.nondeep.collapse_exactness`'s ``ln_*`` rows)."""
    from methods.nondeep import collapse_exactness
    from workbench.pipelines.nondeep.run import load_branched

    return [r for r in collapse_exactness(load_branched(run), images, teacher) if r["variant"].startswith("ln_")]
