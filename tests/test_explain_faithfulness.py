"""Faithfulness at dataset scale and teacher-vs-student explanations (issue #29, items 3-4).

Each against an independent computation: the per-class perturbation AUCs against :func:`perturbation` of an
explanation made for that class; ROAD ranking a planted answer both ways; the streamed ``.zarr`` store equal to the
in-memory result, resumed chunk by chunk and refused for other inputs; map agreement against scipy's Spearman.
Tiny seeded models on the CPU, no downloads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import xarray as xr
from scipy.stats import spearmanr

import methods.teachers  # noqa: F401  (registers vit_demo with timm)
from workbench.explain import attribute
from workbench.explain.compress import agreement, reasons, student_reasons
from workbench.explain.faithfulness import failing_randomization, faithfulness, perturbation, road


def _vit(depth: int = 2) -> nn.Module:
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_demo", depth=depth).eval()


def _images(n: int = 4) -> torch.Tensor:
    return torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(1))


def test_per_class_aucs_equal_perturbation_of_that_class_map():
    model, x = _vit(), _images(4)
    pred = model(x).argmax(-1)
    labels = pred.clone()
    labels[1] = (pred[1] + 1) % 10  # image 1's label differs from the prediction
    labels[3] = -1  # image 3's label unknown: scored against the prediction
    ds = faithfulness(model, x, labels, method=["generic_attention", "rollout"])
    tgt = torch.where(labels >= 0, labels, pred)
    for explained, cls in (("predicted", pred), ("target", tgt)):
        expl = attribute(model, x, method=["generic_attention", "rollout"], target=cls)
        ref = perturbation(model, x, expl, score="accuracy", labels=tgt)["auc"]
        np.testing.assert_allclose(ds["auc"].sel(explained=explained).values, ref.values, atol=1e-12)
        refp = perturbation(model, x, expl, score="probability")["auc"]
        np.testing.assert_allclose(ds["auc_probability"].sel(explained=explained).values, refp.values, atol=1e-12)
    # where the label is the prediction the two explained classes give the same numbers
    same = ds["auc"].isel(sample=[0, 2, 3])
    np.testing.assert_array_equal(same.sel(explained="predicted").values, same.sel(explained="target").values)
    assert list(ds["target"].values) == tgt.tolist() and ds["label"].values[3] == -1


class Linear(nn.Module):
    """Class 0's logit is a fixed weighted sum of the pixels of an 8x8 image; class 1's is a constant."""

    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.w = w

    def forward(self, x):
        z = (x[:, 0] * self.w).sum((1, 2))
        return torch.stack([z, torch.full_like(z, 2.0)], 1)


def test_road_ranks_a_planted_answer_both_ways():
    g = torch.Generator().manual_seed(0)
    w = torch.zeros(8, 8)
    w[2:5, 2:6] = 1.0  # the evidence: a block in the middle
    x = 0.5 + torch.rand(6, 1, 8, 8, generator=g)
    right = x[:, 0] * w  # each pixel's exact contribution
    target = torch.zeros(6, dtype=torch.long)
    good, bad = road(Linear(w), x, right, target), road(Linear(w), x, -right, target)
    assert good.shape == (6, 2)
    # MoRF: removing the evidence first drops the probability more (lower); LeRF: removing it last keeps it (higher)
    assert good[:, 0].mean() < bad[:, 0].mean() - 0.05
    assert good[:, 1].mean() > bad[:, 1].mean() + 0.05
    np.testing.assert_array_equal(road(Linear(w), x, right, target, seed=0), good)  # seeded imputation noise
    with pytest.raises(ValueError, match="one pixel map per image"):
        road(Linear(w), x, right[:, :4], target)


def test_streamed_store_equals_memory_resumes_and_refuses(tmp_path):
    from workbench.data import load_images
    from workbench.models import load_model
    from workbench.scale.chunked import DONE_DIR
    from workbench.scale.faithfulness import stream_faithfulness
    from workbench.scale.stream import StreamError
    from workbench.store import open_store

    spec, out = "demo:val[::200]", tmp_path / "f.zarr"  # 5 images, chunks of 2: 3 chunks
    kw = dict(method=["rollout", "saliency"], device="cpu", seed=0, chunk=2, batch_size=2)
    stream_faithfulness("vit_demo", spec, out, **kw)
    loaded = load_model("vit_demo", device="cpu", seed=0)
    batch = load_images(spec, input_size=loaded.input_size, mean=loaded.mean, std=loaded.std)
    ref = faithfulness(loaded.model, batch.tensor, torch.as_tensor(batch.labels), method=["rollout", "saliency"])
    got = open_store(out, load=True)
    assert got.sizes["sample"] == 5 and got.attrs["model_name"] == "vit_demo"
    for v in ("auc", "auc_probability", "curve", "predicted", "target"):
        np.testing.assert_allclose(got[v].values, ref[v].values, atol=1e-6, err_msg=v)
    # resume: a chunk without its done marker is recomputed, the others are kept
    (out / DONE_DIR / "chunk-000001").unlink()
    stream_faithfulness("vit_demo", spec, out, **kw)
    np.testing.assert_allclose(open_store(out, load=True)["auc"].values, ref["auc"].values, atol=1e-6)
    with pytest.raises(StreamError, match="config"):
        stream_faithfulness("vit_demo", spec, out, **{**kw, "method": ["rollout"]})
    with pytest.raises(StreamError, match=".zarr"):
        stream_faithfulness("vit_demo", spec, tmp_path / "f.nc", **kw)


def test_explain_cli_streams_and_refuses_stream_flags_on_nc(tmp_path, capsys, monkeypatch):
    from workbench.cli import main

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    rc = main(["explain", "--method", "rollout", "--model", "vit_demo", "--seed", "0", "--images", "demo:val[::500]",
               "--out", str(tmp_path / "s.zarr"), "--device", "cpu", "--chunk", "1"])
    assert rc == 0 and "chunk 2 of 2" in capsys.readouterr().out
    rc = main(["explain", "--method", "rollout", "--model", "vit_demo", "--images", "demo:val[:2]", "--road",
               "--out", str(tmp_path / "x.nc"), "--device", "cpu"])
    assert rc == 2 and "--road apply to a streamed store only" in capsys.readouterr().err
    assert not (tmp_path / "x.nc").exists()


def _maps(a: np.ndarray, b: np.ndarray | None = None) -> xr.Dataset:
    """A faithfulness-like Dataset with maps: ``a`` (explainer, sample, y, x) for both explained classes."""
    rel = np.stack([a, a], 1)
    pix = np.repeat(np.repeat(rel, 2, -1), 2, -2) if b is None else np.stack([b, b], 1)
    return xr.Dataset({"relevance": (("explainer", "explained", "sample", "y", "x"), rel),
                       "relevance_pixel": (("explainer", "explained", "sample", "img_y", "img_x"), pix)},
                      coords={"explainer": ["m"], "explained": ["predicted", "target"]})


def test_agreement_against_scipy_and_on_the_pixel_grid_when_grids_differ():
    rng = np.random.default_rng(0)
    a, b = rng.random((1, 5, 4, 4)), rng.random((1, 5, 4, 4))
    got = agreement(_maps(a), _maps(b))
    ref = [spearmanr(a[0, i].ravel(), b[0, i].ravel())[0] for i in range(5)]
    np.testing.assert_allclose(got["spearman"].sel(explainer="m").values, ref, atol=1e-12)
    assert got.attrs["grid"] == "patch"
    # top 10 % of 16 cells = 2 cells: the same map shares both
    np.testing.assert_allclose(agreement(_maps(a), _maps(a))["topk"].values, 1.0)
    other = _maps(rng.random((1, 5, 2, 2)), b=np.repeat(np.repeat(b, 2, -1), 2, -2))  # a 2x2 grid, same 8x8 pixels
    assert agreement(_maps(a), other).attrs["grid"] == "pixel"


def test_reasons_statuses_and_randomisation_failures():
    rng = np.random.default_rng(0)
    assert reasons(0.8 + 0.1 * rng.standard_normal(100))[0] == "keeps"
    assert reasons(0.2 + 0.1 * rng.standard_normal(100))[0] == "loses"
    assert reasons(np.array([0.0, 1.0]))[0] == "inconclusive"
    assert student_reasons({"a": "keeps", "b": "keeps"}) == "keeps"
    assert student_reasons({"a": "keeps", "b": "loses"}) == "mixed" and student_reasons({}) == "untested"
    ds = xr.Dataset({"verdict": ("explainer", ["changes", "unchanged", "inconclusive"])},
                    coords={"explainer": ["a", "b", "c"]})
    assert failing_randomization(ds) == ["b"]


def test_faithfulness_lists_what_does_not_apply():
    from workbench.analysis import examples

    far = examples.far()
    x = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    ds = faithfulness(far, x, None, method=["rollout", "saliency"])
    assert list(ds["explainer"].values) == ["saliency"] and "rollout" in ds.attrs["not_applicable"]
    assert F.one_hot(torch.as_tensor(ds["predicted"].values), 10).shape == (2, 10)
