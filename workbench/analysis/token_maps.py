"""Teacher vs student token maps: line them up along ``model`` and score their agreement per layer.

A teacher's attention (``attention`` extractor) and a FAR model's gradient saliency
(``dependency`` extractor) are both ``(sample, layer, head, query, key)`` maps, but in different
units: attention rows are probabilities (each row sums to 1), saliency rows are gradient norms
whose size differs from query to query. :func:`stack_maps` renames them to one variable, ``map``,
records each model's ``measure`` and ``units``, and lines them up with
``xr.concat(..., dim="model")``. By default the values stay as extracted (``normalize="none"``), as
the paper shows them (App. C.2): a query whose output depends strongly on its inputs is a bright
row, which is what the horizontal bands of Fig. 13–14 are. ``normalize="row"`` makes every query
row sum to 1 over the keys ("share of the query's dependence on each key"), which erases those
bands but puts attention and saliency on one scale. FAR §4.3 / App. C compares teacher attention
with FAR saliency (the "paper-style" comparison); comparing the teacher's own saliency with FAR's
is the like-for-like one.

:func:`agreement` scores a model's maps against a reference model's, per sample and layer, on
head-averaged maps (as App. C.2 averages over heads; heads of FAR and the teacher need not
correspond one to one):

- ``pearson`` — Pearson correlation of the two T×T maps (all entries, CLS row and diagonal included);
- ``spearman`` — the same on ranks (robust to the different value scales of attention and saliency);
- ``js`` — mean over query rows of the Jensen–Shannon divergence (base 2, in [0, 1]: 0 = identical
  rows) between the two models' key distributions (rows normalised to sum to 1: a divergence of
  distributions);
- ``cls_pearson`` / ``cls_js`` — the same two on the CLS row over the patch grid only (Fig. 5, 9–11).

Which values the correlations see (``normalize`` of :func:`agreement`; our decision): row-normalised
by default, because the paper-style reference is attention, whose rows sum to 1 by construction —
it has no per-query magnitude, so on raw values the saliency's per-query magnitude (which attention
cannot reproduce) would dominate Pearson and much of Spearman, scoring FAR on a quantity the
reference lacks. Row-normalised correlations answer "does each query spread its dependence over
the keys as the reference's query does?". Between two maps of the *same* measure (teacher
saliency vs FAR saliency) raw values are comparable, and ``normalize="none"`` scores the per-query
magnitudes too (the bands); it refuses maps of different measures.

Everything works on stores alone (the Jensen–Shannon divergence is
:func:`workbench.analysis.token_agreement.row_js`, shared with the per-head agreement of the comparison).
"""

from __future__ import annotations

from typing import Literal, Mapping

import numpy as np
import xarray as xr
from scipy.stats import rankdata

Normalize = Literal["row", "none"]

#: variable names of the extractors' token maps: (full map, CLS row on the patch grid, measure label)
_SOURCES = {"attention": ("attention", "cls_attention", "attention"),
            "dependency": ("dependency", "cls_dependency", "saliency")}


def _source(ds: xr.Dataset) -> tuple[str, str, str]:
    for key, names in _SOURCES.items():
        if key in ds:
            return names
    raise ValueError(f"the Dataset holds neither an attention nor a dependency map (variables: {list(ds.data_vars)}); "
                     "pass outputs of the 'attention' or 'dependency' extractor")


def _normalise(da: xr.DataArray, dims: tuple[str, ...], how: Normalize) -> xr.DataArray:
    if how == "none":
        return da
    if how != "row":
        raise ValueError(f"normalize must be 'row' or 'none', got {how!r}")
    total = da.sum(dims)
    return da / total.where(total > 0)


def stack_maps(datasets: Mapping[str, xr.Dataset], *, normalize: Normalize = "none") -> xr.Dataset:
    """Several models' token maps as one Dataset along ``model`` (in the mapping's order).

    Args:
        datasets: model label -> an ``attention`` or ``dependency`` Dataset (same images).
        normalize: ``"none"`` (default): the values as extracted (probabilities, gradient norms;
            see ``units``); ``"row"``: every query row sums to 1 over the keys (``cls_map``: over the
            patches), so all models share one unit.

    Returns:
        ``map(model, sample, layer, head, query, key)``, ``cls_map(model, sample, layer, head, y, x)``
        (when every input has a CLS row), coords of the inputs (``query_kind`` …), ``measure(model)``
        ("attention" or "saliency") and ``units(model)``; only the samples, layers and queries all
        inputs share. attr ``normalize``.

    Raises:
        ValueError: an input that is neither kind, or inputs with no sample/layer/query in common.
    """
    if not datasets:
        raise ValueError("no Datasets to stack")
    maps, cls_maps, measures, units = [], [], [], []
    for ds in datasets.values():
        full, cls, measure = _source(ds)
        da = _normalise(ds[full], ("key",), normalize)
        maps.append(da.rename("map"))
        cls_maps.append(None if cls not in ds else _normalise(ds[cls], ("y", "x"), normalize).rename("cls_map"))
        measures.append(measure)
        units.append("share of the row" if normalize == "row" else str(ds[full].attrs.get("units", "")))
    aligned = xr.align(*maps, join="inner", exclude=("key",))
    if any(a.sizes.get(d, 0) == 0 for a in aligned for d in ("sample", "layer", "query")):
        raise ValueError("the maps share no sample, layer or query: compute them on the same images and layers")
    labels = list(datasets)
    out = xr.concat(aligned, dim="model", coords="minimal", compat="override", join="outer").to_dataset()
    if all(c is not None for c in cls_maps):
        cls_aligned = xr.align(*cls_maps, join="inner")
        out["cls_map"] = xr.concat(cls_aligned, dim="model", coords="minimal", compat="override",
                                   join="outer")
    out = out.drop_vars("num_heads", errors="ignore").assign_coords(model=labels, measure=("model", measures),
                                                                     units=("model", units))
    out["map"].attrs.update(units="share of the row" if normalize == "row" else "per model: the units coordinate",
                            long_name="token-to-token map (attention or gradient saliency)")
    return out.assign_attrs(analysis="token_maps", normalize=normalize)


def token_maps(teacher: xr.Dataset, student: xr.Dataset, *, names: tuple[str, str] = ("teacher", "far"),
               normalize: Normalize = "none") -> xr.Dataset:
    """A teacher's and a student's maps along ``model`` (:func:`stack_maps` of the two)."""
    return stack_maps({names[0]: teacher, names[1]: student}, normalize=normalize)


def _pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Correlation over the last axis."""
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (a * b).sum(-1) / den, np.nan)


def _js(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen–Shannon divergence (base 2) of distributions along the last axis, in float64: the one implementation,
    :func:`workbench.analysis.token_agreement.row_js`."""
    import torch

    from workbench.analysis.token_agreement import row_js

    return row_js(torch.as_tensor(p, dtype=torch.float64), torch.as_tensor(q, dtype=torch.float64)).numpy()


def agreement(maps: xr.Dataset, *, reference: str, normalize: Normalize = "row") -> xr.Dataset:
    """Per-sample, per-layer agreement of every model's maps with ``reference``'s (module docstring).

    Args:
        maps: output of :func:`stack_maps` / :func:`token_maps` (either normalisation).
        reference: the ``model`` label to compare against (e.g. "teacher attention").
        normalize: what the correlations see: ``"row"`` (default) every query row of every map
            normalised to sum to 1 before averaging over heads; ``"none"`` the maps as stored
            (only between maps of one measure: see the module docstring). ``js`` / ``cls_js``
            always compare row-normalised rows.

    Returns:
        ``pearson``, ``spearman``, ``js`` (and ``cls_pearson``, ``cls_js``) with dims ``(model, sample,
        layer)`` for every model but the reference; attrs ``reference``, ``normalize``.

    Raises:
        ValueError: an unknown reference or ``normalize``, or ``normalize="none"`` across measures.
    """
    if reference not in maps["model"].values:
        raise ValueError(f"reference {reference!r} not among the models {maps['model'].values.tolist()}")
    if normalize not in ("row", "none"):
        raise ValueError(f"normalize must be 'row' or 'none', got {normalize!r}")
    if normalize == "none":
        if maps.attrs.get("normalize") == "row":
            raise ValueError("normalize='none' needs maps stacked with normalize='none' (these rows already sum to 1)")
        kinds = set(maps["measure"].values.tolist()) if "measure" in maps.coords else set()
        if len(kinds) > 1:
            raise ValueError(f"normalize='none' compares raw values, which only maps of one measure share; got {sorted(kinds)}: "
                             "attention rows sum to 1 and have no per-query magnitude (use normalize='row')")
    rows_map = _normalise(maps["map"], ("key",), "row")
    avg_rows = rows_map.mean("head")  # (model, sample, layer, query, key), rows still sum to 1
    avg = avg_rows if normalize == "row" else maps["map"].mean("head")
    others = [m for m in maps["model"].values.tolist() if m != reference]
    dims = ("sample", "layer")

    def values(da: xr.DataArray, model: str, last: tuple[str, ...]) -> np.ndarray:
        return da.sel(model=model).transpose(*dims, *last).values

    ref_flat = values(avg, reference, ("query", "key"))
    flat_ref = ref_flat.reshape(*ref_flat.shape[:2], -1)
    ref_rows = values(avg_rows, reference, ("query", "key"))
    rows: dict[str, list[np.ndarray]] = {k: [] for k in ("pearson", "spearman", "js", "cls_pearson", "cls_js")}
    for m in others:
        cur = values(avg, m, ("query", "key"))
        flat = cur.reshape(*cur.shape[:2], -1)
        rows["pearson"].append(_pearson(flat, flat_ref))
        rows["spearman"].append(_pearson(rankdata(flat, axis=-1), rankdata(flat_ref, axis=-1)))
        rows["js"].append(_js(values(avg_rows, m, ("query", "key")), ref_rows).mean(-1))
        if "cls_map" in maps:
            c_rows = _normalise(maps["cls_map"], ("y", "x"), "row").mean("head")
            c = c_rows if normalize == "row" else maps["cls_map"].mean("head")
            cc, cr = (values(c, k, ("y", "x")).reshape(*flat.shape[:2], -1) for k in (m, reference))
            rows["cls_pearson"].append(_pearson(cc, cr))
            ccn, crn = (values(c_rows, k, ("y", "x")).reshape(*flat.shape[:2], -1) for k in (m, reference))
            rows["cls_js"].append(_js(ccn, crn))
    coords = {"model": others, "sample": maps["sample"].values, "layer": maps["layer"].values}
    out = {k: (("model",) + dims, np.stack(v)) for k, v in rows.items() if v}
    ds = xr.Dataset(out, coords=coords)
    units = {"pearson": "correlation", "spearman": "rank correlation", "js": "bits", "cls_pearson": "correlation",
             "cls_js": "bits"}
    for k in ds.data_vars:
        ds[k].attrs["units"] = units[k]
    return ds.assign_attrs(reference=reference, normalize=normalize, analysis="agreement")
