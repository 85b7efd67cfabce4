"""What gpu_check.sh checks after a command exits 0 (each prints one line and exits 1 when the check fails).

    python3 scripts/gpu_check_verify.py runs ID...            the runs ID under $WORKBENCH_HOME exist and are complete
    python3 scripts/gpu_check_verify.py stores A.zarr B.zarr  both complete, the same variables, equal values
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


if __name__ == "__main__":
    what, *args = sys.argv[1:]
    sys.exit({"runs": runs, "stores": lambda xs: stores(*xs)}[what](args))
