"""The guarantees every registered extractor shares, checked over one parametrised table.

``CASES`` comes from the registrations: each extractor's ``example`` (a tiny model factory, an input shape and a
layer subset, ``workbench.analysis.Example``).
Every extractor must: return a Dataset whose dims are DESIGN.md dims, carry ``analysis`` and a JSON
``config``, keep one ``sample`` per image, honour ``layers=`` as a selection of the full result,
be deterministic, leave the model's parameters, mode and fused-attention flags unchanged, and
survive stamping, saving and reopening exactly.
"""

from __future__ import annotations

import json
from typing import Callable

import numpy as np
import pytest
import torch
import xarray as xr

import methods.teachers  # noqa: F401
from workbench.analysis import EXAMPLES, get_extractor, load_all
from workbench.provenance import DataSource, ModelSource, stamp
from workbench.store import open_store, save

# The shared dims of docs/conventions.md.
DESIGN_DIMS = {"model", "sample", "layer", "head", "query", "key", "y", "x", "direction", "unit", "branch",
               "branch_i", "branch_j", "module", "stage", "window", "pair", "basis", "epoch", "step", "run", "token",
               "channel"}


def _cases() -> dict[str, tuple[Callable[[], torch.nn.Module], tuple[int, ...], list[int]]]:
    """name -> (model factory, input shape (B, C, H, W), layers subset): every registration's ``example``."""
    load_all()
    return {k: (e.model, tuple(e.images), list(e.layers)) for k, e in EXAMPLES.items()}


CASES = _cases()


def test_every_registered_extractor_has_a_case_and_the_shared_signature():
    import inspect

    ours = {k: fn for k, fn in load_all().items() if fn.__module__.startswith("workbench.")}  # not the tests' toys
    assert set(ours) <= set(CASES), f"register an example for {set(ours) - set(CASES)}"
    for name, fn in ours.items():
        params = inspect.signature(fn).parameters
        assert list(params)[:2] == ["model", "images"], name
        for kw in ("layers", "targets"):
            assert params[kw].kind is inspect.Parameter.KEYWORD_ONLY and params[kw].default is None, (name, kw)


@pytest.fixture(params=sorted(CASES), ids=sorted(CASES))
def case(request):
    name = request.param
    factory, shape, subset = CASES[name]
    torch.manual_seed(0)
    return name, factory(), torch.randn(shape), subset


def _fused_flags(model):
    return {n: m.fused_attn for n, m in model.named_modules() if hasattr(m, "fused_attn")}


def test_shared_guarantees(case, tmp_path):
    name, model, images, subset = case
    extract = get_extractor(name)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = _fused_flags(model)
    ds = extract(model, images)
    assert isinstance(ds, xr.Dataset) and ds.data_vars
    assert set(ds.dims) <= DESIGN_DIMS, f"dims outside DESIGN.md: {set(ds.dims) - DESIGN_DIMS}"
    assert ds.attrs["analysis"] == name
    json.loads(ds.attrs["config"])
    if "sample" in ds.dims:  # extractors of weights only (e.g. retention) have no sample dim
        assert ds.sizes["sample"] == images.shape[0]
    # no side effects on the model
    assert not model.training and _fused_flags(model) == flags
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    # deterministic
    xr.testing.assert_identical(ds, extract(model, images))
    # layers= selects from the full result
    part = extract(model, images, layers=subset)
    assert sorted(set(part.layer.values.tolist())) == subset  # a dim, or a coord of a flattened pair dim
    for var in part.data_vars:
        full = ds[var].sel(layer=subset) if "layer" in ds[var].dims else ds[var]
        np.testing.assert_allclose(part[var].values, full.values[tuple(slice(0, n) for n in part[var].shape)], atol=1e-6, equal_nan=True)
    # stamp, save, reopen exactly
    stamped = stamp(ds, ModelSource("test"), DataSource("random", list(range(images.shape[0]))))
    back = open_store(save(stamped, tmp_path / f"{name}.nc"), load=True)
    xr.testing.assert_identical(back.drop_attrs(), stamped.drop_attrs())


def test_bad_layers_rejected(case):
    name, model, images, _ = case
    with pytest.raises(ValueError, match="layer"):
        get_extractor(name)(model, images, layers=[999])


def test_training_mode_rejected(case):
    name, model, images, _ = case
    model.train()
    with pytest.raises(ValueError, match="eval"):
        get_extractor(name)(model, images)
