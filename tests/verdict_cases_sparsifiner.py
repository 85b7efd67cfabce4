"""Verdict cases of the Sparsifiner findings (tests/test_verdict_rules.py): each rule driven to "shown", "partly" and
"not shown" by hand-built item data, with cases just either side of every threshold.

Near-threshold cases state the statistic they land on; ``_near`` recomputes it independently (numpy / scipy) and
fails the build when a case drifts to the wrong side, so a case cannot silently stop testing its threshold.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from scipy import stats
from test_verdict_rules import Case

from workbench.xrutils import rows_to_dataset

N = 1000  # held-out images of the accuracy cases
Z = 1.959963984540054  # two-sided 95 % normal quantile


def _near(value: float, threshold: float, above: bool, margin: float) -> None:
    """The case's statistic lies on the stated side of its threshold, within ``margin``."""
    assert (value > threshold) == above and abs(value - threshold) < margin, (value, threshold, above)


# ------------------------------------------------------------------------------------------- paired accuracies
def _base(acc: float = 0.9, n: int = N, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random(n) < acc).astype(float)


def _shift(a: np.ndarray, wins: int, losses: int, seed: int = 1) -> np.ndarray:
    """A copy of ``a`` that is right on ``losses`` more and ``wins`` fewer images: ``a − result`` has ``wins`` +1s
    and ``losses`` −1s."""
    b = a.copy()
    rng = np.random.default_rng(seed)
    right, wrong = rng.permutation(np.flatnonzero(a == 1)), rng.permutation(np.flatnonzero(a == 0))
    b[right[:wins]] = 0
    b[wrong[:losses]] = 1
    return b


def _paired_lo(a: np.ndarray, b: np.ndarray) -> float:
    d = a - b
    return float(d.mean() - Z * d.std(ddof=1) / np.sqrt(d.size))


# ------------------------------------------------------------------------------------------- baselines
def _baselines(vs_random: tuple[int, int], vs_top: tuple[int, int], lo_random=None, lo_top=None):
    """Learned mask, with (wins, losses) against random keys and against the teacher's top-B."""
    def build():
        learned = _base()
        random = _shift(learned, *vs_random, seed=2)
        top = _shift(learned, *vs_top, seed=3)
        if lo_random is not None:
            _near(_paired_lo(learned, random), 0.0, *lo_random)
        if lo_top is not None:
            _near(_paired_lo(learned, top), -0.02, *lo_top)
        correct = np.stack([np.stack([learned, random, top, learned])] * 2, axis=1)  # (mask, keep_rate, sample)
        ds = xr.Dataset({"correct": (("mask", "keep_rate", "sample"), correct),
                         "budget": ("keep_rate", [5, 13]), "teacher_correct": ("sample", _base(0.95, seed=9)),
                         "linformer_correct": ("sample", _base(0.8, seed=8))},
                        coords={"mask": ["learned", "random", "top-B", "trained"], "keep_rate": [0.1, 0.25],
                                "sample": np.arange(N)},
                        attrs={"tokens": 50, "linformer_keep_rate": 0.25})
        return (ds,)
    return build


BASELINES = [
    Case("beats random by 8 points, ties the top-B", _baselines((80, 0), (0, 0)), "shown"),
    Case("beats random just beyond noise (lo +0.00002), top-B 1.2 points ahead (lo −1.88 > −2)",
         _baselines((18, 8), (0, 12), (True, 0.001), (True, 0.002)), "shown"),
    Case("beats random, top-B 1.3 points ahead (lo −2.002 < −2 points)",
         _baselines((80, 0), (0, 13), None, (False, 0.002)), "partly"),
    Case("beats random, top-B 10 points ahead", _baselines((80, 0), (0, 100)), "partly"),
    Case("learned − random +0.9 points, interval just reaching 0", _baselines((17, 8), (0, 0), (False, 0.001)),
         "not shown"),
    Case("random keys as good as the learned mask", _baselines((0, 0), (0, 0)), "not shown"),
]


# ------------------------------------------------------------------------------------------- table4
def _table4(vs_lin: tuple[int, int], lin_vs_teacher: tuple[int, int], lo_d=None, lo_gap=None):
    def build():
        sp = _base(0.9)
        lin = _shift(sp, *vs_lin, seed=4)
        teacher = _shift(lin, *lin_vs_teacher, seed=5)  # lin − teacher: (wins, losses) of the Linformer
        if lo_d is not None:
            _near(_paired_lo(sp, lin), 0.0, *lo_d)
        if lo_gap is not None:
            _near(_paired_lo(lin, teacher), -0.05, *lo_gap)
        correct = np.stack([np.stack([sp, sp])])  # (mask, keep_rate, sample)
        base = xr.Dataset({"correct": (("mask", "keep_rate", "sample"), correct),
                           "teacher_correct": ("sample", teacher), "linformer_correct": ("sample", lin)},
                          coords={"mask": ["trained"], "keep_rate": [0.1, 0.25], "sample": np.arange(N)},
                          attrs={"linformer_keep_rate": 0.25})
        return xr.Dataset(), base
    return build


TABLE4 = [
    Case("Sparsifiner 5 points above the Linformer, Linformer 1 point under the teacher",
         _table4((50, 0), (0, 10)), "shown"),
    Case("Sparsifiner just beyond noise, Linformer 3.6 points under the teacher (lo −4.8 > −5)",
         _table4((18, 8), (0, 36), (True, 0.001), (True, 0.004)), "shown"),
    Case("Sparsifiner ahead, Linformer 3.9 points under (lo −5.1 < −5): undertrained",
         _table4((50, 0), (0, 39), None, (False, 0.004)), "partly"),
    Case("Sparsifiner ahead, Linformer 8 points under the teacher", _table4((50, 0), (0, 80)), "partly"),
    Case("Sparsifiner +0.9 points, interval just reaching 0", _table4((17, 8), (0, 10), (False, 0.001)), "not shown"),
    Case("Linformer ahead", _table4((0, 40), (0, 10)), "not shown"),
]


# ------------------------------------------------------------------------------------------- fig3
def _fig3(budget: int, img_keys: int, head_keys: int, img_rows: int = 20):
    """Masks whose key set of a (layer, head, query) row is a core shared by every image and head, ``img_keys`` keys
    of the image's own (on the first ``img_rows`` of 20 patch rows; the others use image 0's) and ``head_keys`` of the
    head's own. Jaccard distance between two images' sets: 2a / (B + a) on the varying rows; between heads 2c / (B + c).
    """
    def build():
        s_, l_, h_, q_ = 6, 2, 3, 20
        core = budget - img_keys - head_keys
        keys = core + s_ * img_keys + h_ * head_keys
        m = np.zeros((s_, l_, h_, q_ + 1, keys), bool)  # query 0: the CLS row (dense, ignored)
        m[:, :, :, 0] = True
        m[:, :, :, 1:, :core] = True
        for s in range(s_):
            for q in range(1, q_ + 1):
                own = s if q <= img_rows else 0
                m[s, :, :, q, core + own * img_keys: core + (own + 1) * img_keys] = True
        for h in range(h_):
            start = core + s_ * img_keys + h * head_keys
            m[:, :, h, 1:, start: start + head_keys] = True
        return (xr.Dataset({"mask": (("sample", "layer", "head", "query", "key"), m)},
                           coords={"query_kind": ("query", ["cls"] + ["patch"] * q_)}),)
    return build


def _fig3_random():
    """Independent random key sets (B = 5 of 20) for every image, head and query: the jackknife interval is not 0."""
    m = np.zeros((6, 2, 3, 12, 20), bool)
    rng = np.random.default_rng(0)
    for idx in np.ndindex(m.shape[:-1]):
        m[idx + (rng.choice(20, 5, replace=False),)] = True
    return (xr.Dataset({"mask": (("sample", "layer", "head", "query", "key"), m)}),)


FIG3 = [
    Case("random key sets for every image and head (distance ≈ 0.8, jackknife interval)", _fig3_random, "shown"),
    Case("one of B = 8 keys differs between images and between heads (2/9 = 0.222 > 0.2)", _fig3(8, 1, 1), "shown"),
    Case("one of B = 8 keys differs between heads, and between images on 19 of 20 rows (0.211 > 0.2)",
         _fig3(8, 1, 1, img_rows=19), "shown"),
    Case("one of B = 8 keys differs between heads, and between images on 17 of 20 rows (0.189 < 0.2)",
         _fig3(8, 1, 1, img_rows=17), "partly"),
    Case("heads differ (4/12), images by one of B = 10 keys (2/11 = 0.18)", _fig3(10, 1, 2), "partly"),
    Case("images differ on 2 of 20 rows only (0.022 > 0.02), heads alike", _fig3(8, 1, 0, img_rows=2), "partly"),
    Case("images differ on 1 of 20 rows only (0.011 < 0.02), heads alike", _fig3(8, 1, 0, img_rows=1), "not shown"),
    Case("one fixed mask for every image and head", _fig3(8, 0, 0), "not shown"),
]


# ------------------------------------------------------------------------------------------- fig5
T = 20  # tokens of the hand-built maps (diagonal: their singular values are the diagonal)


def _fig5(sparse_offsets, low_offsets, sparse_rank: int = T, low_rank: int = 4):
    """Diagonal maps (sample, layer 1, head 1): the teacher's log10 spectrum is 0, then −1 to −3; the sparse / low-rank
    maps add a per-image offset to every log singular value but the first, and keep only their first ``rank`` ones.
    The spectrum distance is then offset · (T − 1) / T, plus the floored tail of a deficient rank."""
    def build():
        teacher = np.concatenate([[0.0], -1 - np.linspace(0, 2, T - 1)])
        maps = {"teacher_attention": [teacher] * len(sparse_offsets)}
        for name, offsets, rank in (("attention", sparse_offsets, sparse_rank),
                                    ("linformer_attention", low_offsets, low_rank)):
            rows = []
            for off in offsets:
                spec = 10.0 ** np.concatenate([[0.0], teacher[1:] + off])
                spec[rank:] = 0.0
                rows.append(np.log10(np.maximum(spec, 1e-300)))
            maps[name] = rows
        data = {k: (("sample", "layer", "head", "query", "key"),
                    np.stack([np.diag(10.0 ** np.array(v))[None, None] for v in rows]))
                for k, rows in maps.items()}
        return (xr.Dataset(data, attrs={"linformer_k": 4}),)
    return build


def _t_lo(diffs) -> float:
    return float(stats.t.interval(0.95, len(diffs) - 1, loc=np.mean(diffs), scale=stats.sem(diffs))[0])


# per-image offsets (sparse 0.05 everywhere) whose paired difference Linformer − sparse has a t lower bound just
# above / below 0
_SPARSE = [0.05] * 6
_STEP = np.array([0.02, 0.30, 0.05, 0.25, 0.10, 0.15])
_L_ABOVE, _L_BELOW = 0.05 + _STEP - 0.02, 0.05 + _STEP - 0.03
assert 0 < _t_lo((_L_ABOVE - 0.05) * (T - 1) / T) < 0.01 and -0.01 < _t_lo((_L_BELOW - 0.05) * (T - 1) / T) < 0
_ZERO = [0.0] * 6

FIG5 = [
    Case("sparse spectrum = teacher's, Linformer rank 4 (tail floored)", _fig5(_ZERO, _ZERO), "shown"),
    Case("full-rank sparse maps just closer than the Linformer's (t lower bound > 0)",
         _fig5(_SPARSE, _L_ABOVE, low_rank=T), "shown"),
    Case("sparse rank 19 of 20 (≥ 0.95 · 20), closer", _fig5(_ZERO, _ZERO, sparse_rank=19), "shown"),
    Case("sparse rank 18 of 20 (< 0.95 · 20), closer", _fig5(_ZERO, _ZERO, sparse_rank=18), "partly"),
    Case("full rank, Linformer − sparse interval just reaching 0", _fig5(_SPARSE, _L_BELOW, low_rank=T), "partly"),
    Case("full rank, Linformer's spectrum the closer one", _fig5([0.3] * 6, _ZERO, low_rank=T), "partly"),
    Case("sparse rank 10, farther from the teacher than a full-rank Linformer", _fig5(_ZERO, _ZERO, 10, T),
         "not shown"),
]


# ------------------------------------------------------------------------------------------- fig6
def _blob(y: int, x: int) -> np.ndarray:
    v = np.zeros((7, 7))
    v[y:y + 2, x:x + 2] = 1.0
    return v


def _scattered(seed: int) -> np.ndarray:
    v = np.zeros(49)
    v[np.random.default_rng(seed).choice(49, 4, replace=False)] = 1.0
    return v.reshape(7, 7)


_rng = np.random.default_rng(0)
_BLOBS = [_blob(*_rng.integers(0, 6, 2)) for _ in range(16)]
_SCATTERED = [_scattered(i) for i in range(16)]


def _fig6(blobs: int, zeros: float, dead: int = 2):
    """16 surviving basis vectors — ``blobs`` 2×2 blobs, the rest 4 scattered patches — and ``dead`` all-zero ones;
    ``zeros``: the share of W̃_up that is zero. Upper 95 % bound of spread / random placement: 9 blobs 0.801, 10 blobs
    0.738; 3 blobs 1.008, 4 blobs 0.978 (measured with the rule's fixed-seed shuffles)."""
    def build():
        w = np.stack(_BLOBS[:blobs] + _SCATTERED[blobs:] + [np.zeros((7, 7))] * dead)
        return (xr.Dataset({"w_up": (("layer", "basis", "y", "x"), w.reshape(2, -1, 7, 7)),
                            "basis_sparsity": ("layer", [zeros, zeros])}),)
    return build


FIG6 = [
    Case("local 2×2 blobs, 90 % zeros", _fig6(16, 0.9), "shown"),
    Case("10 blobs of 16 (spread bound 0.74 < 0.8), exactly half zeros", _fig6(10, 0.5), "shown"),
    Case("9 blobs of 16 (spread bound 0.80 ≥ 0.8), sparse", _fig6(9, 0.9), "partly"),
    Case("local blobs, 49 % zeros (< 50 %)", _fig6(16, 0.49), "partly"),
    Case("4 blobs of 16 (bound 0.98 < 1: more compact than random), not sparse", _fig6(4, 0.2), "partly"),
    Case("scattered patches, sparse", _fig6(0, 0.9), "partly"),
    Case("3 blobs of 16 (bound 1.01 ≥ 1), not sparse", _fig6(3, 0.2), "not shown"),
    Case("scattered patches, not sparse", _fig6(0, 0.1), "not shown"),
]


# ------------------------------------------------------------------------------------------- fig7
def _fig7(one_big: int, p_big, flat: int = 0):
    """A_down rows over n_down = 8 basis vectors, τ = 1/8, 10 patch queries per (image, layer, head): ``one_big`` rows
    with one entry ``p_big`` (7 zeros), ``flat`` uniform rows (all ≤ τ: 8 zeros, nothing kept), the rest with two
    entries p_big / 2 + 0.07 (6 zeros). Zeros: (7·one + 8·flat + 6·rest) / 80. ``p_big``: one value, or one per image
    (4 images)."""
    def rows(p: float) -> np.ndarray:
        n, out = 8, []
        for i in range(10):
            if i < one_big:
                r = np.full(n, (1 - p) / (n - 1))
                r[0] = p
            elif i < one_big + flat:
                r = np.full(n, 1 / n)
            else:
                r = np.full(n, (1 - p - 0.14) / (n - 2))
                r[:2] = p / 2 + 0.07
            out.append(r)
        return np.stack(out)

    def build():
        ps = np.broadcast_to(np.asarray(p_big, dtype=float), (4,))
        a_down = np.stack([rows(p) for p in ps])[:, None, None]  # (sample, layer, head, query, basis)
        coef = np.where(a_down > 1 / 8, a_down, 0.0)
        dims = ("sample", "layer", "head", "query", "basis")
        return (xr.Dataset({"a_down": (dims, a_down), "coefficients": (dims, coef)}),)
    return build


FIG7 = [
    Case("one entry of 0.7 per row: 87.5 % zeros, 70 % of the mass kept", _fig7(10, 0.7), "shown"),
    Case("4 of 10 rows with one big entry: exactly 80 % zeros, 59 % kept", _fig7(4, 0.51), "shown"),
    Case("3 of 10 rows with one big entry: 78.75 % zeros (< 80 %)", _fig7(3, 0.7), "partly"),
    Case("two big entries per row: 75 % zeros", _fig7(0, 0.7), "partly"),
    Case("one entry of 0.49 per row: 87.5 % zeros but only 49 % of the mass kept", _fig7(10, 0.49), "not shown"),
    Case("flat rows: every coefficient zeroed by τ, nothing kept", _fig7(0, 0.7, flat=10), "not shown"),
    Case("kept 52–55 % over 4 images (t lower bound 51.4 % ≥ 50 %)", _fig7(10, [0.52, 0.53, 0.54, 0.55]), "shown"),
    Case("kept 50–56 % over 4 images (mean 53 %, t lower bound 48.9 % < 50 %)", _fig7(10, [0.50, 0.52, 0.54, 0.56]),
         "not shown"),
]


# ------------------------------------------------------------------------------------------- agreement
def _agreement(masses, oracle: float = 0.5, sd: float = 0.1, n_images: int = 8):
    """Per layer the mean teacher mass on the kept keys at the smallest keep rate (chance 0.1, sd 0.1 over rows:
    above chance when mass − 1.96 · 0.1 / √8 = mass − 0.0693 > 0.1)."""
    def build():
        m = np.array([masses, [0.6] * len(masses)])
        ds = xr.Dataset({"mass": (("keep_rate", "layer"), m), "mass_sd": (("keep_rate", "layer"), np.full(m.shape, sd)),
                         "oracle_mass": (("keep_rate", "layer"), np.full(m.shape, oracle)),
                         "chance_mass": (("keep_rate", "layer"), np.full(m.shape, 0.1))},
                        coords={"keep_rate": [0.1, 0.25], "layer": np.arange(len(masses))},
                        attrs={"n_images": n_images})
        return (ds,)
    return build


AGREEMENT = [
    Case("every layer 0.45 of the top-B's 0.5 (90 %)", _agreement([0.45, 0.45, 0.45]), "shown"),
    Case("layers at 0.17 (0.1007 > chance), 81 % of the top-B", _agreement([0.170, 0.170], oracle=0.17 / 0.81),
         "shown"),
    Case("layers at 0.17, 79 % of the top-B (< 80 %)", _agreement([0.170, 0.170], oracle=0.17 / 0.79), "partly"),
    Case("one layer at 0.169 (0.0997 ≤ chance), the other far above", _agreement([0.45, 0.169]), "partly"),
    Case("every layer at 0.169 (0.0997 ≤ chance)", _agreement([0.169, 0.169], oracle=0.18), "not shown"),
    Case("the kept keys carry what random keys do", _agreement([0.1, 0.1]), "not shown"),
]


# ------------------------------------------------------------------------------------------- tables 1–3
def _flops(table1=(), table2=(), table3=()):
    """``sparsifiner.flops`` rows: (keep rate, ours / paper) per table; paper 100 MFLOPs (dense row 1.0 exact)."""
    def build():
        rows = [{"table": "table1", "model": "LV-ViT-S @224", "keep_rate": k, "ours_fitted": 100 * r,
                 "ours_stated": 100 * r, "paper": 100.0} for k, r in [(1.0, 1.0), *table1]]
        rows += [{"table": "table1", "model": "DeiT-S @224", "keep_rate": 0.25, "ours_fitted": 50.0,
                  "ours_stated": 50.0, "paper": None}]
        rows += [{"table": "table2", "model": "DeiT-S @224", "keep_rate": k, "ours_fitted": 100 * r,
                  "ours_stated": 100 * r, "paper": 100.0} for k, r in [(1.0, 1.0), *table2]]
        rows += [{"table": "table3", "model": "DeiT-T @384", "keep_rate": k, "ours_zero": 100 * r, "paper": 100.0}
                 for k, r in table3]
        return rows_to_dataset(rows).assign_attrs(rho_stated=0.13), xr.Dataset()
    return build


_OK1 = [(0.5, 1.0), (0.25, 1.0), (0.1, 1.0)]
TABLE1 = [
    Case("every sparse LV-ViT-S row exact", _flops(table1=_OK1), "shown"),
    Case("rows +0.99 % and −0.99 % (within 1 %)", _flops(table1=[(0.5, 1.0099), (0.25, 0.9901), (0.1, 1.0)]),
         "shown"),
    Case("one row +1.01 % (beyond 1 %)", _flops(table1=[(0.5, 1.0101), (0.25, 1.0), (0.1, 1.0)]), "partly"),
    Case("two of three rows 5 % off", _flops(table1=[(0.5, 1.05), (0.25, 0.95), (0.1, 1.0)]), "partly"),
    Case("every sparse row +1.01 %", _flops(table1=[(0.5, 1.0101), (0.25, 1.0101), (0.1, 1.0101)]), "not shown"),
    Case("every sparse row 20 % off", _flops(table1=[(0.5, 1.2), (0.25, 0.8), (0.1, 1.2)]), "not shown"),
]

TABLE2 = [
    Case("every sparse row within 3 % (+2.99 %, −2.99 %)", _flops(table2=[(0.5, 1.0299), (0.1, 0.9701)]), "shown"),
    Case("keep 0.1 row +3.01 %", _flops(table2=[(0.5, 1.0), (0.1, 1.0301)]), "partly"),
    Case("small keep rates 10 % off", _flops(table2=[(0.5, 1.0), (0.25, 1.1), (0.1, 1.2)]), "partly"),
    Case("every sparse row +3.01 %", _flops(table2=[(0.5, 1.0301), (0.1, 1.0301)]), "not shown"),
    Case("every sparse row 50 % off", _flops(table2=[(0.5, 1.5), (0.1, 0.5)]), "not shown"),
]

TABLE3 = [
    Case("dense exact, sparse rows within 3 %", _flops(table3=[(1.0, 1.0), (0.5, 1.0299), (0.1, 0.98)]), "shown"),
    Case("dense +0.99 %, sparse rows exact", _flops(table3=[(1.0, 1.0099), (0.5, 1.0)]), "shown"),
    Case("dense exact, a sparse row +3.01 %", _flops(table3=[(1.0, 1.0), (0.5, 1.0301)]), "partly"),
    Case("dense exact, sparse rows 20 % off", _flops(table3=[(1.0, 1.0), (0.5, 1.2), (0.1, 1.3)]), "partly"),
    Case("dense +1.01 %, sparse exact", _flops(table3=[(1.0, 1.0101), (0.5, 1.0)]), "not shown"),
    Case("dense 10 % off", _flops(table3=[(1.0, 1.1), (0.5, 1.2)]), "not shown"),
]

CASES = {"sparsifiner.baselines": BASELINES, "sparsifiner.table4": TABLE4, "sparsifiner.fig3": FIG3,
         "sparsifiner.fig5": FIG5, "sparsifiner.fig6": FIG6, "sparsifiner.fig7": FIG7,
         "sparsifiner.agreement": AGREEMENT, "sparsifiner.table1": TABLE1, "sparsifiner.table2": TABLE2,
         "sparsifiner.table3": TABLE3}
