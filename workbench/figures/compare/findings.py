"""Verdict of the comparison's finding (``compare.table1``), computed from the comparison Datasets.

Every method's paper claims a student that keeps its teacher's accuracy at a lower cost. Here each student is tested
on both halves of that claim: its held-out top-1 against its teacher's on the same images (paired,
:func:`workbench.stats.paired_diff_interval`), and its cost — the MACs its deployed form executes
(``methods.flops.count_macs``) and its single-thread CPU latency, paired by interleaved timing round (a t-interval of
the mean log ratio student / teacher over the rounds).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from workbench.figures import Finding, Verdict
from workbench.stats import paired_diff_interval

__all__ = ["accuracy_and_cost_verdict", "latency_ratio", "FINDING"]


def latency_ratio(student_ms: np.ndarray, teacher_ms: np.ndarray) -> tuple[float, float, float]:
    """Student / teacher latency from times paired by round: (geometric mean ratio, 95 % low, high), a t-interval of
    the mean log ratio. One round: no interval (low = high = the ratio)."""
    from scipy.stats import t as student_t

    s, t = np.asarray(student_ms, dtype=float), np.asarray(teacher_ms, dtype=float)
    if s.shape != t.shape or s.ndim != 1 or s.size == 0 or (s <= 0).any() or (t <= 0).any():
        raise ValueError(f"latency ratios need two equal-length vectors of positive times, got {s.shape} and {t.shape}")
    d = np.log(s / t)
    half = float(student_t.ppf(0.975, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else 0.0
    return float(np.exp(d.mean())), float(np.exp(d.mean() - half)), float(np.exp(d.mean() + half))


def _latencies(lat: xr.Dataset | None) -> dict[tuple[str, str], tuple[float, float, float] | None]:
    """(arch, model) -> the student's latency ratio to its teacher (with its interval where rounds are stored)."""
    if lat is None or "arch" not in lat:
        return {}
    arch, model = [str(a) for a in lat["arch"].values], [str(m) for m in lat["model"].values]
    out: dict[tuple[str, str], tuple[float, float, float] | None] = {}
    for i, (a, m) in enumerate(zip(arch, model)):
        if "ms_rounds" in lat:
            teacher = next(j for j, (b, n) in enumerate(zip(arch, model)) if b == a and n == "teacher")
            out[(a, m)] = latency_ratio(lat["ms_rounds"].values[i], lat["ms_rounds"].values[teacher])
        else:  # a store from before the rounds were kept: the median ratio, no interval
            r = float(lat["ratio"].values[i])
            out[(a, m)] = (r, r, r)
    return out


def _student(ds: xr.Dataset, m, lat: dict) -> tuple[str, bool, bool, str] | None:
    """(text, keeps top-1, cheaper on MACs and on this CPU, cost note) of student ``m``, or None without predictions."""
    teacher = ds["model"].values[0]
    t, s = ds["heldout_correct"].sel(model=teacher).values, ds["heldout_correct"].sel(model=m).values
    ok = np.isfinite(t) & np.isfinite(s)
    if ok.sum() < 2:
        return None
    lo, hi = paired_diff_interval(s[ok], t[ok])
    d = float(s[ok].mean() - t[ok].mean())
    macs = float(ds["macs"].sel(model=m)) / float(ds["macs"].sel(model=teacher)) if "macs" in ds else np.nan
    ratio = lat.get((str(ds.attrs.get("arch")), str(m)))
    fewer = bool(macs < 1)
    faster = ratio is not None and ratio[2] < 1
    slower = ratio is not None and ratio[1] > 1
    speed = "latency not measured" if ratio is None else (
        f"latency {ratio[0]:.2f}× ({ratio[1]:.2f} … {ratio[2]:.2f})")
    text = f"{m}: top-1 {100 * d:+.1f} points ({100 * lo:+.1f} … {100 * hi:+.1f}), MACs {macs:.2f}×, {speed}"
    note = ("cheaper" if fewer and faster else
            "fewer MACs but " + ("slower here" if slower else "not faster beyond noise here" if ratio else "no latency")
            if fewer else ("as many" if macs == 1 else "more") + " MACs" + (" and slower here" if slower else ""))
    return text, hi >= 0, fewer and faster, note


def accuracy_and_cost_verdict(*datasets: xr.Dataset) -> Verdict:
    """Each student keeps its teacher's top-1 (not below it beyond the noise of the held-out images) at a lower cost
    (fewer MACs and faster on this CPU beyond the noise of the timing rounds).

    Shown: every student does both; partly: some do; not shown: none. Datasets without per-image correctness
    (``heldout_correct``) or without students are skipped; the last Dataset with ``arch`` rows is the latency.
    """
    lat = _latencies(next((ds for ds in datasets if "arch" in ds and "model" not in ds.dims), None))
    parts, both, kept_only, cost_only, n = [], [], [], [], 0
    for ds in datasets:
        if "model" not in ds.dims or "heldout_correct" not in ds:
            continue
        n = max(n, ds.sizes.get("heldout_sample", 0))
        for m in ds["model"].values[1:]:
            got = _student(ds, m, lat)
            if got is None:
                continue
            text, kept, cheaper, note = got
            parts.append(f"{text} [{note}]")
            (both if kept and cheaper else kept_only if kept else cost_only if cheaper else []).append(str(m))
    if not parts:
        return Verdict("not shown", "no per-image correctness in the data", "the comparison lacks held-out predictions")
    stat = (f"student vs teacher, {n} held-out images (paired 95 % CI), MACs executed, single-thread CPU latency "
            "(geometric mean over interleaved rounds, 95 % CI): " + "; ".join(parts))
    total = len(parts)
    why = []
    if kept_only:
        why.append(f"keep top-1 but are not cheaper on this CPU: {', '.join(kept_only)}")
    if cost_only:
        why.append(f"are cheaper but below their teacher beyond noise: {', '.join(cost_only)}")
    lost = total - len(both) - len(kept_only) - len(cost_only)
    if lost:
        why.append(f"{lost} neither keep top-1 nor are cheaper")
    if len(both) == total:
        return Verdict("shown", stat)
    if both:
        return Verdict("partly", stat, f"{len(both)} of {total} students keep top-1 at a lower cost "
                       f"({', '.join(both)}); the others " + "; ".join(why))
    return Verdict("not shown", stat, "no student keeps its teacher's top-1 at a lower cost on this CPU; they "
                   + "; ".join(why))


FINDING = Finding(
    "Each paper's student keeps its teacher's accuracy at a lower cost: FAR 'replace[s] attention blocks in "
    "pretrained transformers with efficient alternatives, without sacrificing model performance'; Sparsifiner "
    "'achieves a 68% reduction in FLOPs … while maintaining a top-1 accuracy of 79.5%'; Non-deep 'compresses the "
    "model from 12 layers to as few as {3, 4, 6} while preserving accuracy, delivering up to 37% lower inference "
    "latency on mobile CPUs'; AttentionLite models 'incur a tiny drop in accuracy compared to their teacher' at "
    "'a fraction of the parameters and FLOPs'; SlimSwin 'preserves accuracy while significantly reducing "
    "computation'.",
    "e.g. FAR +2.0 points over DeiT-Tiny (Table 1); Sparsifiner within 0.4 % at 48–69 % fewer MHSA FLOPs (abstract); "
    "Non-deep up to 37 % lower latency; the other methods' numbers are in their own items",
    accuracy_and_cost_verdict)
