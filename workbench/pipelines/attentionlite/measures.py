"""AttentionLite counts the figures read: parameters and MACs at paper size (Tables 1-2).

Mandal et al., "AttentionLite" (papers/003), on top of :mod:`methods.attentionlite`: the paper's SA-ResNet students
and CIFAR ResNet50 teacher at paper size with random weights and sparse momentum's initial masks (uniform density per
layer), one image. The figure module (:mod:`workbench.figures.attentionlite.items`) stores what this returns as figure
data; nothing here reads or writes a store.
"""

from __future__ import annotations

import copy
from typing import Iterable, Mapping

__all__ = ["paper_size_rows"]


def paper_size_rows(combos: Iterable[tuple[str, str, str, str, float]],
                    datasets: Mapping[str, tuple[str, int, int]]) -> list[dict]:
    """One row per (student, stem, dataset, pruning, d) of ``combos``: teacher, dense student and pruned student
    parameters and MACs. ``datasets``: dataset key -> (name, classes, image size)."""
    import torch

    from methods.attentionlite import (
        SA_VARIANTS,
        SparseMomentum,
        count_macs_sparse,
        count_params,
        resnet50_cifar,
        shrink,
    )
    from methods.flops import count_macs

    torch.manual_seed(0)
    teachers, students, rows = {}, {}, []
    with torch.no_grad():
        for name, stem, data, pruning, d in combos:
            _, classes, size = datasets[data]
            x = torch.zeros(1, 3, size, size)
            if (classes, size) not in teachers:
                t = resnet50_cifar(num_classes=classes).eval()
                teachers[(classes, size)] = (count_params(t)["total"], count_macs(t, x).total)
            if (name, stem, classes, size) not in students:
                m = SA_VARIANTS[name].build(stem, classes).eval()
                students[(name, stem, classes, size)] = (m, count_params(m), count_macs(m, x))
            dense, counts, macs = students[(name, stem, classes, size)]
            model = copy.deepcopy(dense)
            hook = SparseMomentum(model, d, pruning, epochs=1, seed=0)
            kept = count_params(model, masks=hook.weight_masks())["kept"]
            if pruning == "column":
                small = shrink(model, hook.weight_masks())
                shrunk, pruned_macs = sum(p.numel() for p in small.parameters()), count_macs_sparse(small, x)["dense"]
            else:  # MACs of the non-zero weights: each layer's MACs × its kept fraction (count_macs_sparse's rule)
                shrunk = None
                pruned_macs = macs.total - sum(macs.within(n) * (1 - f) for n, f in hook.layer_densities().items())
            t_params, t_macs = teachers[(classes, size)]
            rows.append({"student": name, "stem": stem, "dataset": data, "pruning": pruning, "density": d,
                         "image_size": size, "teacher_params": t_params, "teacher_macs": t_macs,
                         "student_params": counts["total"], "student_macs": macs.total, "kept_params": kept,
                         "shrunk_params": shrunk, "pruned_macs": pruned_macs, "realised_density": hook.realised_density()})
    return rows
