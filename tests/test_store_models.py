"""Stores (round trip, refusal of damaged or unstamped ones) and checkpoints (safe loading, mismatches)."""

import numpy as np
import pytest
import timm
import torch
import xarray as xr
from safetensors.torch import save_file

import methods.teachers  # noqa: F401
from workbench.models import CheckpointError, create_model, load_model, read_state_dict
from workbench.provenance import REQUIRED_ATTRS, DataSource, ModelSource, stamp
from workbench.store import StoreError, open_store, save


def _ds():
    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {"attention": (("sample", "layer", "head", "query", "key"), rng.random((2, 3, 2, 4, 4)).astype(np.float32)),
         "mask": (("layer", "head"), rng.random((3, 2)) > 0.5)},
        coords={"sample": [0, 1], "layer": [0, 1, 2], "head": [0, 1], "query": range(4), "key": range(4),
                "query_kind": ("query", ["cls", "patch", "patch", "patch"]), "key_y": ("key", [-1, 0, 0, 1]),
                "shifted": ("layer", [False, True, False])},
        attrs={"analysis": "attention", "config": "{}"},
    )
    return stamp(ds, ModelSource("vit_demo"), DataSource("demo:val", [5, 9]))


def test_store_round_trip_exact(tmp_path):
    ds = _ds()
    path = save(ds, tmp_path / "a.nc")
    back = open_store(path, load=True)
    xr.testing.assert_identical(back.drop_attrs(), ds.drop_attrs())
    assert back["mask"].dtype == bool and back["shifted"].dtype == bool
    assert back.attrs["run"] is None and back.attrs["checkpoint_sha256"] is None
    assert {k: v for k, v in back.attrs.items() if v is not None} == {k: v for k, v in ds.attrs.items() if v != "null"}
    assert set(REQUIRED_ATTRS) <= set(back.attrs)
    assert back.sample.values.tolist() == [5, 9]


def test_store_is_lazy(tmp_path):
    path = save(_ds(), tmp_path / "lazy.nc")
    ds = open_store(path)
    assert not ds["attention"].variable._in_memory
    ds.close()


def test_store_refuses_unstamped_and_damaged(tmp_path):
    raw = _ds().drop_attrs()
    with pytest.raises(StoreError, match="lacks the provenance attrs"):
        save(raw, tmp_path / "x.nc")
    assert not list(tmp_path.iterdir())  # nothing half-written
    raw.to_netcdf(tmp_path / "foreign.nc", engine="h5netcdf")
    with pytest.raises(StoreError, match="lacks the provenance"):
        open_store(tmp_path / "foreign.nc")
    good = save(_ds(), tmp_path / "good.nc")
    data = good.read_bytes()
    (tmp_path / "cut.nc").write_bytes(data[: len(data) // 2])
    with pytest.raises(StoreError, match="damaged"):
        open_store(tmp_path / "cut.nc")
    with pytest.raises(StoreError, match="does not exist"):
        open_store(tmp_path / "missing.nc")


def test_failed_save_leaves_nothing(tmp_path):
    ds = _ds()
    ds.attrs["config"] = {"not": "serialisable"}  # netCDF attrs cannot hold a dict
    with pytest.raises((TypeError, ValueError)):
        save(ds, tmp_path / "bad.nc")
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_round_trip_and_formats(tmp_path):
    model = create_model("vit_demo")
    save_file(model.state_dict(), tmp_path / "w.safetensors")
    torch.save({"state_dict": model.state_dict()}, tmp_path / "w.pt")
    for name in ("w.safetensors", "w.pt"):
        loaded = load_model("vit_demo", checkpoint=tmp_path / name)
        assert torch.equal(loaded.model.head.weight, model.head.weight)
        assert len(loaded.source.checkpoint_sha256) == 64


def test_checkpoint_of_another_architecture_names_keys(tmp_path):
    save_file(create_model("cnn_demo").state_dict(), tmp_path / "cnn.safetensors")
    with pytest.raises(CheckpointError, match=r"missing keys: cls_token.*unexpected keys: bn1"):
        load_model("vit_demo", checkpoint=tmp_path / "cnn.safetensors")
    other = timm.create_model("vit_demo", embed_dim=32)
    save_file(other.state_dict(), tmp_path / "narrow.safetensors")
    with pytest.raises(CheckpointError, match=r"shape mismatches .*cls_token \(1, 1, 32\) vs \(1, 1, 64\)"):
        load_model("vit_demo", checkpoint=tmp_path / "narrow.safetensors")


class Payload:
    def __reduce__(self):
        return (print, ("this would run code",))


def test_pickled_checkpoint_refused(tmp_path):
    torch.save({"model": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="weights_only=True"):
        read_state_dict(tmp_path / "evil.pt")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        read_state_dict(tmp_path / "junk.safetensors")
    with pytest.raises(CheckpointError, match="does not exist"):
        read_state_dict(tmp_path / "nope.safetensors")


def test_pretrained_offline_says_how_to_pass_a_file():
    with pytest.raises(ValueError, match="--checkpoint"):
        create_model("deit_tiny_patch16_224", pretrained=True)
    with pytest.raises(ValueError, match="unknown model"):
        create_model("not_a_model_xyz")


def test_non_finite_checkpoint_refused_naming_the_tensor(tmp_path):
    state = create_model("vit_demo").state_dict()
    state["blocks.1.attn.qkv.weight"][0, :3] = float("nan")
    state["head.bias"][0] = float("inf")
    save_file(state, tmp_path / "diverged.safetensors")
    n = state["blocks.1.attn.qkv.weight"].numel()
    with pytest.raises(CheckpointError, match=rf"non-finite weights: tensor 'blocks.1.attn.qkv.weight' has 3 NaN and 0 inf "
                                              rf"of {n} values \(and 1 more tensor\).*retrain"):
        load_model("vit_demo", checkpoint=tmp_path / "diverged.safetensors")
    state["blocks.1.attn.qkv.weight"][0, :3] = 0.0
    torch.save(state, tmp_path / "diverged.pt")  # the .pt path is checked too
    with pytest.raises(CheckpointError, match="tensor 'head.bias' has 0 NaN and 1 inf of 10 values. Every analysis"):
        load_model("vit_demo", checkpoint=tmp_path / "diverged.pt")


def test_non_finite_maps_refused_before_a_store_exists():
    from workbench.provenance import NonFiniteError

    ds = _ds()  # finite: stamped without complaint
    padded = ds.copy(deep=True)
    padded["attention"][:, :, 1] = np.nan  # NaN padding (a head a layer lacks) is legitimate
    stamp(padded, ModelSource("vit_demo"), DataSource("demo:val", [5, 9]))
    for value, what in ((np.inf, "has 1 inf of 192"), (np.nan, "is NaN everywhere")):
        bad = ds.copy(deep=True)
        if np.isinf(value):
            bad["attention"][0, 0, 0, 0, 0] = -value
        else:
            bad["attention"][:] = value
        with pytest.raises(NonFiniteError, match=rf"attention of 'vit_demo' is not finite: attention {what}.*nothing was stored"):
            stamp(bad, ModelSource("vit_demo"), DataSource("demo:val", [5, 9]))
