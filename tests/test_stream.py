"""Streamed extraction into chunked zarr stores: equal to the in-memory extractors, the same on 1 or 2 torchrun
ranks and after a ``kill -9`` and resume; lazy reductions (local and dask.distributed) against numpy; bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from workbench.scale.chunked import ChunkError, completeness, done_chunks, read_layout, write_chunk
from workbench.scale.stream import StreamError, StreamOptions, stream_analysis
from workbench.store import StoreError, open_store

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::workbench.provenance.RandomInitWarning")]  # seeded random init: tested


def _seeded_vit(folder: Path, seed: int) -> str:
    """Seeded random weights of the demo ViT as a safetensors file (a timm name + checkpoint: no training needed)."""
    from safetensors.torch import save_file

    from workbench.models import create_model

    torch.manual_seed(seed)
    path = folder / "vit.safetensors"
    save_file(create_model("vit_demo").state_dict(), str(path))
    return str(path)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return _seeded_vit(tmp_path_factory.mktemp("ckpt"), 1)


@pytest.fixture(scope="module")
def other_ckpt(tmp_path_factory):
    return _seeded_vit(tmp_path_factory.mktemp("ckpt2"), 2)


def _stream(out, ckpt, kind="attention", images="demo:val[:24]", **opts):
    opts = {"batch_size": 4, "chunk": 8, "workers": 0, **opts}
    return stream_analysis(kind, "vit_demo", images, out, checkpoint=ckpt, device="cpu", opts=StreamOptions(**opts),
                           progress=False)


def _cli(*args, nproc: int = 0, **popen) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WORKBENCH_PROGRESS": "0", "PYTHONWARNINGS": "ignore"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] \
        if nproc else [sys.executable]
    return launch + ["-m", "workbench.cli", "analyze", *args], env


def _run_cli(*args, nproc: int = 0) -> None:
    cmd, env = _cli(*args, nproc=nproc)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


def _assert_same(a: xr.Dataset, b: xr.Dataset) -> None:
    assert set(a.data_vars) == set(b.data_vars)
    for n in a.data_vars:
        np.testing.assert_array_equal(a[n].values, b[n].values, err_msg=n)
    np.testing.assert_array_equal(a.sample.values, b.sample.values)


# ------------------------------------------------------------------------------------------ streaming
def test_stream_equals_in_memory_extractor(tmp_path, ckpt):
    from workbench.analyze import analyze

    ds = open_store(_stream(tmp_path / "a.zarr", ckpt))
    ref = analyze("attention", "vit_demo", "demo:val[:24]", checkpoint=ckpt, device="cpu")
    assert ds.attrs["analysis"] == "attention" and ds.attrs["model_name"] == "vit_demo"
    assert ds.attrs["checkpoint_sha256"] == ref.attrs["checkpoint_sha256"] and ds.attrs["data"] == ref.attrs["data"]
    np.testing.assert_array_equal(ds.sample.values, ref.sample.values)
    np.testing.assert_array_equal(ds.label.values, ref.label.values)
    for n in ("attention", "cls_attention"):  # other batch sizes than the reference's: float rounding only
        np.testing.assert_allclose(ds[n].values, ref[n].values, rtol=0, atol=1e-6)
    assert ds["attention"].data.chunks[0] == (8, 8, 8)  # dask, chunked as written


def test_cls_rows_beside_fused_attention_match_full_maps(ckpt):
    from workbench.analysis.attention import extract_attention
    from workbench.analysis.attention_rows import extract_attention_rows
    from workbench.data import load_images
    from workbench.models import load_model

    m = load_model("vit_demo", checkpoint=ckpt).model.double()
    x = load_images("demo:val[:3]", input_size=(1, 28, 28)).tensor.double()
    rows = extract_attention_rows(m, x, queries=[0, 7], layers=[0, -1])
    full = extract_attention(m, x, layers=[0, -1])
    np.testing.assert_allclose(rows.attention.values, full.attention.isel(query=[0, 7]).values, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rows.cls_attention.values, full.cls_attention.values, rtol=0, atol=1e-12)
    assert all(getattr(b.attn, "fused_attn", True) for b in m.blocks)  # the model's own path untouched


def test_options_heads_queries_dtype_and_running_reductions(tmp_path, ckpt):
    full = open_store(_stream(tmp_path / "full.zarr", ckpt)).load()
    small = open_store(_stream(tmp_path / "small.zarr", ckpt, layers=(1, 5), heads=(0, 2), queries="cls",
                               dtype="float16")).load()
    assert small.attention.dtype == np.float16 and small.sizes["query"] == 1 and list(small["head"].values) == [0, 2]
    want = full.attention.sel(layer=[1, 5]).isel(head=[0, 2], query=[0])
    np.testing.assert_allclose(small.attention.values.astype(np.float32), want.values, rtol=1e-3, atol=1e-4)

    mean = open_store(_stream(tmp_path / "mean.zarr", ckpt, reduce="mean"))
    assert "sample" not in mean.dims and int(mean["count"]) == 24
    np.testing.assert_allclose(mean.attention.values, full.attention.values.astype(np.float64).mean(0), rtol=1e-6)
    total = open_store(_stream(tmp_path / "sum.zarr", ckpt, reduce="sum", queries="cls"))
    np.testing.assert_allclose(total.cls_attention.values, full.cls_attention.values.astype(np.float64).sum(0), rtol=1e-6)

    ent = open_store(_stream(tmp_path / "ent.zarr", ckpt, reduce="entropy")).load()
    p = full.attention.values.astype(np.float64)
    h = -(p * np.log(np.where(p > 0, p, 1))).sum(-1)
    np.testing.assert_allclose(ent.attention_entropy.values, h, rtol=1e-5)
    assert ent.attention_entropy.attrs["units"] == "nats"


def _model_args(ckpt: str | None) -> list[str]:
    """A timm name with a checkpoint, or (None) without one: seeded random-init weights."""
    return ["--model", "vit_demo"] + (["--checkpoint", ckpt] if ckpt else [])


@pytest.mark.integration
@pytest.mark.parametrize("kind,flags,weights", [("attention", [], "checkpoint"),
                                                ("dependency", ["--queries", "cls", "--layers", "0,5"], "checkpoint"),
                                                ("attention", ["--queries", "cls"], "random-init")])
def test_two_torchrun_ranks_equal_one_process_bit_for_bit(tmp_path, ckpt, kind, flags, weights):
    args = [kind, *_model_args(ckpt if weights == "checkpoint" else None), "--images", "demo:val[:20]", "--batch-size",
            "4", "--chunk", "8", "--workers", "1", "--device", "cpu", *flags]
    from workbench.cli import main

    # one process: the CLI here (the kill -9 tests run it as its own process); two: a torchrun of it
    assert main(["analyze", *args, "--out", str(tmp_path / "one.zarr")]) == 0
    _run_cli(*args, "--out", str(tmp_path / "two.zarr"), nproc=2)
    one, two = open_store(tmp_path / "one.zarr").load(), open_store(tmp_path / "two.zarr").load()
    _assert_same(one, two)
    assert completeness(tmp_path / "two.zarr") == (3, 3)
    assert f"{kind}" in one.data_vars and np.isfinite(one[kind].values).all()
    assert one.attrs["weights"] == two.attrs["weights"] == weights
    assert one.attrs["weights_sha256"] == two.attrs["weights_sha256"]


@pytest.mark.integration
@pytest.mark.parametrize("weights", ["checkpoint", "random-init"])
def test_kill_9_then_rerun_equals_uninterrupted(tmp_path, ckpt, weights):
    ckpt = ckpt if weights == "checkpoint" else None
    out = tmp_path / "killed.zarr"
    args = ["attention", *_model_args(ckpt), "--images", "demo:val[:480]", "--batch-size", "2",
            "--chunk", "8", "--workers", "0", "--device", "cpu", "--out", str(out)]
    cmd, env = _cli(*args)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not (out.exists() and done_chunks(out)):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done, total = completeness(out)
    assert 1 <= done < total, f"the kill came too late or too early: {done}/{total} chunks"
    with pytest.raises(StoreError, match="incomplete"):
        open_store(out)
    partial = open_store(out, partial=True)
    assert partial.sizes["sample"] == 8 * done
    torch.manual_seed(1234)  # the global generator's state must not matter to a random init
    _stream(out, ckpt, images="demo:val[:480]", batch_size=2)  # the same command, resumed
    assert completeness(out) == (total, total)
    _assert_same(open_store(out).load(), open_store(_stream(tmp_path / "clean.zarr", ckpt, images="demo:val[:480]",
                                                            batch_size=2)).load())


# ----------------------------------------------------------------------------------------- reductions
@pytest.fixture(scope="module")
def store(tmp_path_factory, ckpt):
    return _stream(tmp_path_factory.mktemp("red") / "s.zarr", ckpt, images="demo:val[::50]", queries="cls")


def test_reduce_by_label_matches_numpy(store):
    from workbench.scale.reduce import reduce_store

    ds = open_store(store).load()
    x, y = ds.cls_attention.values.astype(np.float64), ds.label.values
    labels = np.unique(y)
    mean = reduce_store(store, by="label", stat="mean", progress=False)
    assert list(mean.label.values) == list(labels) and "reduction" in mean.attrs and mean.attrs["model_name"] == "vit_demo"
    np.testing.assert_allclose(mean.cls_attention.values, np.stack([x[y == c].mean(0) for c in labels]), rtol=1e-6)
    std = reduce_store(store, stat="std", progress=False)
    np.testing.assert_allclose(std.cls_attention.values, x.std(0), rtol=1e-5, atol=1e-7)
    q = reduce_store(store, by="label", stat="quantile", q=0.75, progress=False)
    np.testing.assert_allclose(q.cls_attention.values, np.stack([np.quantile(x[y == c], 0.75, axis=0) for c in labels]),
                               rtol=1e-6)
    top = reduce_store(store, stat="topk", k=3, progress=False)
    np.testing.assert_allclose(top.cls_attention.values, -np.sort(-x, axis=0)[:3], rtol=1e-6)


@pytest.mark.integration
@pytest.mark.parametrize("processes", [False, True])
def test_dask_distributed_local_cluster_gives_the_local_numbers(store, processes):
    from distributed import Client, LocalCluster

    from workbench.scale.reduce import reduce_store

    local = reduce_store(store, by="label", stat="mean", progress=False)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        remote = reduce_store(store, by="label", stat="mean", client=client, progress=False)
        by_address = reduce_store(store, stat="std", scheduler=cluster.scheduler_address, progress=False)
    np.testing.assert_allclose(remote.cls_attention.values, local.cls_attention.values, rtol=1e-12)
    np.testing.assert_allclose(by_address.cls_attention.values,
                               reduce_store(store, stat="std", progress=False).cls_attention.values, rtol=1e-12)


def test_cli_reduce_and_inspect(store, tmp_path, capsys):
    from workbench.cli import main

    out = tmp_path / "means.nc"
    assert main(["reduce", str(store), "--by", "label", "--stat", "mean", "--out", str(out)]) == 0
    assert open_store(out).sizes["label"] == 10
    assert main(["inspect", str(store)]) == 0
    assert "3/3 chunks" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------- bad input
def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_resume_into_another_analysis_or_model_is_refused(tmp_path, ckpt, other_ckpt):
    out = _stream(tmp_path / "a.zarr", ckpt, queries="cls", layers=(0,))
    before = _snapshot(out)
    with pytest.raises(StreamError, match="analysis.*Write to a new --out"):
        _stream(out, ckpt, kind="dependency", queries="cls", layers=(0,))
    with pytest.raises(StreamError, match="other weights.*state-dict sha256 [0-9a-f]{64} in the store vs [0-9a-f]{64} now"):
        _stream(out, other_ckpt, queries="cls", layers=(0,))
    with pytest.raises(StreamError, match="dtype"):
        _stream(out, ckpt, queries="cls", layers=(0,), dtype="float16")
    assert _snapshot(out) == before  # nothing written


def _stream_random(out, seed=None, **opts):
    opts = {"batch_size": 4, "chunk": 8, "workers": 0, "queries": "cls", "layers": (0,), **opts}
    return stream_analysis("attention", "vit_demo", "demo:val[:16]", out, device="cpu", opts=StreamOptions(**opts),
                           progress=False, seed=seed)


def test_resume_with_other_random_weights_is_refused_naming_both_hashes(tmp_path):
    """A random-init store records its seed and its state dict's hash; a resume with another seed is refused."""
    from workbench.models import load_model
    from workbench.scale.chunked import DONE_DIR

    out = _stream_random(tmp_path / "r.zarr")
    attrs = read_layout(out)[1]
    assert attrs["weights"] == "random-init" and attrs["init_seed"] == 0
    assert attrs["weights_sha256"] == load_model("vit_demo").source.weights_sha256
    (out / DONE_DIR / "chunk-000001").unlink()  # as if killed before its marker: a rerun resumes it
    before = _snapshot(out)
    other = load_model("vit_demo", seed=7).source.weights_sha256
    with pytest.raises(StreamError, match=f"state-dict sha256 {attrs['weights_sha256']} in the store vs {other} now"):
        _stream_random(out, seed=7)
    assert _snapshot(out) == before  # nothing written
    torch.manual_seed(99)
    _stream_random(out)  # the same command (seed 0 by default) resumes it
    assert completeness(out) == (2, 2)
    _assert_same(open_store(out).load(), open_store(_stream_random(tmp_path / "clean.zarr")).load())


def test_resume_checks_the_weights_not_only_the_name(tmp_path, ckpt):
    """Two stores of one name, one file name: the hash of the weights decides."""
    import json

    import zarr

    out = _stream(tmp_path / "a.zarr", ckpt, queries="cls", layers=(0,))
    group = zarr.open_group(str(out), mode="r+")
    group.attrs["weights_sha256"] = "0" * 64  # same name, checkpoint and run; other weights
    with pytest.raises(StreamError, match="0{64} in the store vs [0-9a-f]{64} now"):
        _stream(out, ckpt, queries="cls", layers=(0,))
    group.attrs["weights_sha256"] = "null"  # a random-init store written before the hash was recorded
    group.attrs["weights"] = "random-init"
    assert json.loads(group.attrs["stream"])["n_samples"] == 24
    with pytest.raises(StreamError, match="written before the weights were hashed"):
        _stream_random(out, layers=(0,))


def test_region_written_twice_or_unaligned_is_refused(tmp_path, ckpt, capsys):
    out = _stream(tmp_path / "a.zarr", ckpt, queries="cls")
    layout, _ = read_layout(out)
    ds = open_store(out).load()
    before = _snapshot(out)
    chunk = ds.isel(sample=slice(0, 8)).copy(deep=True)
    chunk["cls_attention"][:] = 0.5
    with pytest.raises(ChunkError, match="already written"):
        write_chunk(out, 0, chunk, layout)
    (out / ".workbench-done" / "chunk-000001").unlink()  # pretend chunk 1 is pending
    with pytest.raises(ChunkError, match="whole chunks"):
        write_chunk(out, 1, ds.isel(sample=slice(8, 13)), layout)
    before.pop(".workbench-done/chunk-000001")
    assert _snapshot(out) == before
    from workbench.cli import main

    assert main(["inspect", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2/3 chunks" in printed and "INCOMPLETE" in printed


def test_zarr_without_provenance_is_refused(tmp_path, ckpt):
    bare = tmp_path / "bare.zarr"
    xr.Dataset({"attention": (("sample", "key"), np.zeros((4, 3)))}).to_zarr(bare, zarr_format=3, consolidated=False)  # a foreign store
    with pytest.raises(StoreError, match="not written by"):
        open_store(bare)
    before = _snapshot(bare)
    with pytest.raises(StreamError, match="cannot resume"):
        _stream(bare, ckpt)
    assert _snapshot(bare) == before


def test_reduce_by_unknown_coordinate_is_refused(store, tmp_path, capsys):
    from workbench.cli import main

    out = tmp_path / "x.nc"
    assert main(["reduce", str(store), "--by", "colour", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no variable or coordinate 'colour'" in err and "label" in err
    assert not out.exists()
    assert main(["reduce", str(store), "--over", "pixel", "--out", str(out)]) == 2
    assert "no dim 'pixel'" in capsys.readouterr().err and not out.exists()


# ------------------------------------------------------------------------------------------- figure
@pytest.mark.integration
def test_dataset_scale_figure_draws_on_smoke(tmp_path):
    """Trains the smoke teacher and the attention-keeping students, streams their CLS rows, draws scale.fig1.

    The contract test's toy method (registered here too) adds an attention student whose model wraps the ViT and so
    has no class token: the figure leaves it out and names it, and draws the others."""
    import toy_method  # noqa: F401  (registers the toy student, as test_contract does in every xdist worker)

    from workbench.cli import main
    from workbench.figures import STUDENTS

    out = tmp_path / "figs"  # --force: notebook 08 (its kernel has no toy student) may have stored scale.maps first
    assert main(["figures", "scale", "--profile", "smoke", "--device", "cpu", "--jobs", "1", "--force",
                 "--out", str(out)]) == 0
    assert (out / "scale.fig1.png").stat().st_size > 10_000
    from workbench.figures.context import Context

    ds = Context("smoke").data("scale.maps")
    students = [s.label for s in STUDENTS.values() if s.teacher == "vit" and s.maps == "attention"]
    assert "toy g2" in students and "toy g2" not in ds["model"].values
    assert [str(m) for m in ds["model"].values] == ["teacher", *(s for s in students if s != "toy g2")]
    assert "toy g2 (toy-g2-vit-smoke: Scaled is not a ViT-like model with a class token" in ds.attrs["left_out"]
    assert ds.sizes["label"] == 10 and ds["model"].values[0] == "teacher" and int(ds["images"].max()) == 100
    assert np.isfinite(ds["cls_map"].values).all()
    ent = ds["entropy"].sel(model="teacher").values
    assert np.isfinite(ent).all() and (ent > 0).all() and (ent <= np.log(int(ds.attrs["keys"])) + 1e-9).all()


def test_a_student_without_a_class_token_is_named_not_streamed():
    """scale.fig1's check (the same one ``--queries cls`` makes before streaming): a ViT with a class token passes;
    a ViT pooling without one, and a model wrapping its ViT (the contract test's toy), are named with the reason."""
    from types import SimpleNamespace

    import toy_method

    from workbench.figures.scale import no_cls_row
    from workbench.models import create_model
    from workbench.scale.stream import StreamError, StreamOptions, extract_batch

    def reason(model):
        return no_cls_row(SimpleNamespace(model=lambda run: model), run=None)

    no_cls = create_model("vit_demo", class_token=False, global_pool="avg")
    assert reason(create_model("vit_demo")) is None
    assert reason(create_model("vit_demo", reg_tokens=2)) is None  # the class token first, then registers
    assert reason(no_cls) == "VisionTransformer has no class token (prefix tokens: none)"
    assert reason(toy_method.toy_scaled()).startswith("Scaled is not a ViT-like model with a class token (Scaled has "
                                                      "no patch_embed")
    with pytest.raises(StreamError, match="VisionTransformer has no class token .*; pass token indices instead"):
        extract_batch("attention", no_cls.eval(), torch.zeros(2, 1, 28, 28), None, StreamOptions(queries="cls"))


def test_scale_plot_names_the_students_left_out():
    import matplotlib.pyplot as plt

    from workbench.plots.scale import plot_dataset_scale

    rng = np.random.default_rng(0)
    ds = xr.Dataset({"cls_map": (("model", "label", "y", "x"), rng.dirichlet(np.ones(49), (1, 10)).reshape(1, 10, 7, 7)),
                     "entropy": (("model", "sample", "layer"), rng.uniform(2, 3.9, (1, 20, 6)))},
                    coords={"model": ["teacher"], "label": np.arange(10), "layer": np.arange(6), "last_layer": 5,
                            "images": ("model", [20])}, attrs={"keys": 50, "left_out": "toy g2 (toy-g2: no class token)"})
    fig = plot_dataset_scale(ds)
    assert [f.get_supxlabel() for f in fig.subfigs] == ["", "Not shown (no CLS attention row): toy g2 (toy-g2: no "
                                                               "class token)"]
    plt.close(fig)
    ds.attrs["left_out"] = ""
    fig = plot_dataset_scale(ds)
    assert [f.get_supxlabel() for f in fig.subfigs] == ["", ""]
    plt.close(fig)


def test_scale_plot_draws_from_a_dataset():
    """The plot alone, on a synthetic figure Dataset (two models of different depth, NaN for the missing blocks)."""
    import matplotlib.pyplot as plt

    from workbench.plots.scale import plot_dataset_scale

    rng = np.random.default_rng(0)
    ent = rng.uniform(2, 3.9, (2, 20, 6))
    ent[1, :, 3:] = np.nan  # the student has 3 blocks
    ds = xr.Dataset({"cls_map": (("model", "label", "y", "x"), rng.dirichlet(np.ones(49), (2, 10)).reshape(2, 10, 7, 7)),
                     "entropy": (("model", "sample", "layer"), ent)},
                    coords={"model": ["teacher", "student"], "label": np.arange(10), "layer": np.arange(6),
                            "last_layer": ("model", [5, 2]), "images": ("model", [20, 20])}, attrs={"keys": 50})
    fig = plot_dataset_scale(ds)
    assert len(fig.axes) == 2 * 10 + 2  # maps, colour bar, entropy
    plt.close(fig)


def test_streaming_flags_need_a_zarr_store(tmp_path, capsys):
    from workbench.cli import main

    out = tmp_path / "x.nc"
    assert main(["analyze", "attention", "--model", "vit_demo", "--queries", "cls", "--out", str(out)]) == 2
    assert "--queries apply to streamed stores only" in capsys.readouterr().err and not out.exists()


def test_stream_a_flat_folder_of_images(tmp_path, ckpt):
    """A folder is read file by file (timm's eval transform); labels unknown (-1)."""
    from PIL import Image

    folder = tmp_path / "photos"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (40, 36, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    ds = open_store(_stream(tmp_path / "f.zarr", ckpt, images=f"{folder}[1:]", queries="cls", chunk=2, batch_size=2))
    assert ds.sizes["sample"] == 4 and list(ds.sample.values) == [1, 2, 3, 4] and (ds.label.values == -1).all()
    np.testing.assert_allclose(ds.attention.sum("key").values, 1, rtol=1e-5)
