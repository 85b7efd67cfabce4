"""What gpu_check.sh checks after a command exits 0 (each prints one line and exits 1 when the check fails).

    python3 scripts/gpu_check_verify.py runs ID...            the runs ID under $WORKBENCH_HOME exist and are complete
    python3 scripts/gpu_check_verify.py stores A.zarr B.zarr  both complete, the same variables, equal values
    python3 scripts/gpu_check_verify.py explain CUDA.nc CPU.nc the same explanations on two devices: per explainer, the
        maps' rank correlation over each image >= 0.99 and the perturbation AUCs within 0.02 (float32 on two devices,
        TF32 convolutions on the GPU: ranks and areas, not bits)
    python3 scripts/gpu_check_verify.py features CUDA.nc CPU.nc one crosscoder trained on two devices (same seed, same
        tokens): finite, the fraction of variance explained of each model within 0.03
"""

from __future__ import annotations

import sys

import numpy as np


def runs(ids: list[str]) -> int:
    from workbench.runs import list_runs

    found = {r.id: r.status for r in list_runs() if r.id in ids}
    bad = {i: s for i, s in found.items() if s != "complete"}
    missing = [i for i in ids if i not in found]
    print(f"runs: {', '.join(f'{i} ({s})' for i, s in sorted(found.items())) or 'none'}"
          + (f"; not complete: {', '.join(bad)}" if bad else "") + (f"; missing: {', '.join(missing)}" if missing else ""))
    return int(bool(bad or missing))


def stores(a: str, b: str, rtol: float = 1e-5, atol: float = 1e-6) -> int:
    from workbench.scale.chunked import completeness
    from workbench.store import open_store

    for path in (a, b):
        done, total = completeness(path)
        if done != total:
            print(f"{path}: {done}/{total} chunks written")
            return 1
    x, y = open_store(a, load=True), open_store(b, load=True)
    if set(x.data_vars) != set(y.data_vars) or not np.array_equal(x.sample.values, y.sample.values):
        print(f"different stores: variables {sorted(x.data_vars)} vs {sorted(y.data_vars)}, "
              f"samples {x.sizes.get('sample')} vs {y.sizes.get('sample')}")
        return 1
    worst = {n: float(np.nanmax(np.abs(x[n].values.astype("float64") - y[n].values.astype("float64"))))
             for n in x.data_vars if np.issubdtype(x[n].dtype, np.number)}
    off = [n for n in worst if not np.allclose(x[n].values, y[n].values, rtol=rtol, atol=atol, equal_nan=True)]
    print(f"{x.sizes['sample']} samples, {len(worst)} variables; max |difference| "
          + ", ".join(f"{n} {v:.1e}" for n, v in worst.items()) + (f"; beyond rtol {rtol:g}: {', '.join(off)}" if off else ""))
    return int(bool(off))


def explain(a: str, b: str, min_rho: float = 0.99, auc_tol: float = 0.02) -> int:
    from scipy.stats import spearmanr

    from workbench.store import open_store

    x, y = open_store(a, load=True), open_store(b, load=True)
    if list(x.explainer.values) != list(y.explainer.values) or not np.array_equal(x.target.values, y.target.values):
        print(f"different explanations: {list(x.explainer.values)} vs {list(y.explainer.values)}, or other targets")
        return 1
    bad, parts = [], []
    for m in x.explainer.values:
        p, q = (d.relevance.sel(explainer=m).values.reshape(d.sizes["sample"], -1) for d in (x, y))
        rho = min(float(spearmanr(u, v).statistic) if np.ptp(u) > 0 else float(np.allclose(u, v)) for u, v in zip(p, q))
        gap = float(np.abs(x.perturbation_auc.sel(explainer=m) - y.perturbation_auc.sel(explainer=m)).max()) \
            if "perturbation_auc" in x else 0.0
        parts.append(f"{m} rho>={rho:.4f} dAUC<={gap:.3f}")
        if not (rho >= min_rho and gap <= auc_tol):
            bad.append(str(m))
    print(f"{x.sizes['sample']} images: " + ", ".join(parts) + (f"; off: {', '.join(bad)}" if bad else ""))
    return int(bool(bad))


def features(a: str, b: str, tol: float = 0.03) -> int:
    from workbench.store import open_store

    x, y = open_store(a, load=True), open_store(b, load=True)
    gap = float(np.abs(x.fve.values - y.fve.values).max())
    line = {p: f"FVE {', '.join(f'{v:.3f}' for v in d.fve.values)}, dead {int(d.dead.values.sum())}/{d.sizes['latent']}"
            for p, d in (("cuda", x), ("cpu", y))}
    print(f"{line['cuda']} on cuda; {line['cpu']} on cpu; |dFVE| {gap:.4f} (<= {tol})")
    return int(not (np.isfinite(x.fve.values).all() and gap <= tol))


if __name__ == "__main__":
    what, *args = sys.argv[1:]
    sys.exit({"runs": runs, "stores": lambda xs: stores(*xs), "explain": lambda xs: explain(*xs),
              "features": lambda xs: features(*xs)}[what](args))
