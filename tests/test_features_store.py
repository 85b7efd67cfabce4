"""Crosscoders from stored activations: the ``activations`` extractor's rows are the rows ``workbench features`` reads,
the stored batches visit every image once an epoch in bounded groups and resume exactly, a crosscoder trained from
stores recovers planted features, and the command refuses stores that do not fit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr
from test_crosscoder import _best, _images, _planted_pair

from workbench.analysis.activations import extract_activations, rows_of
from workbench.features import CrosscoderConfig, crosscoder_diff, fit_crosscoder, paired_tokens
from workbench.features.pairs import token_rows
from workbench.features.stored import stored_batches

pytestmark = pytest.mark.filterwarnings("ignore::workbench.provenance.RandomInitWarning")  # vit_demo: seeded random weights


@pytest.mark.parametrize("shape, name, reference", [
    ((2, 5, 8), "blocks.0.hook_resid_post", lambda v: v),  # ViT: tokens in sequence order
    ((2, 3, 4, 8), "layers.0.blocks.1.hook_resid_post", lambda v: v.reshape(2, 12, 8)),  # Swin (B, H, W, C)
    ((2, 8, 3, 4), "stages.1.hook_out", lambda v: v.permute(0, 2, 3, 1).reshape(2, 12, 8)),  # CNN (B, C, H, W)
])
def test_extractor_rows_are_positions_row_major_and_the_rows_features_reads(shape, name, reference):
    value = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    rows = rows_of(value, name)
    assert torch.equal(rows, reference(value))
    if value.ndim == 4:  # position (h, w) is row h·W + w
        cell = value[1, 2, 3] if not name.endswith(".hook_out") else value[1, :, 2, 3]
        assert torch.equal(rows[1, 2 * 4 + 3], cell)
    assert torch.equal(token_rows(value, name), rows.flatten(0, 1))


def _indexed(n: int, tokens: int = 3, channels: int = 2) -> xr.DataArray:
    """``(sample, token, channel)`` whose every value is its image's index (to follow images through batches)."""
    values = np.broadcast_to(np.arange(n, dtype=np.float32)[:, None, None], (n, tokens, channels)).copy()
    return xr.DataArray(values, dims=("sample", "token", "channel"))


def _images_of(batch: list[torch.Tensor], tokens: int = 3) -> list[int]:
    return batch[0][::tokens, 0].long().tolist()


def test_stored_batches_visit_every_image_once_an_epoch_mix_chunks_and_resume():
    n, chunk, b = 70, 8, 6
    arrays = {"teacher": _indexed(n), "student": _indexed(n, channels=5)}
    batches, steps = stored_batches(arrays, chunk, b, seed=3, buffer_chunks=3)
    assert steps == 12
    epochs = [list(batches(e, 0)) for e in (0, 1)]
    for got in epochs:
        assert len(got) == steps and [len(_images_of(x)) for x in got] == [b] * 11 + [4]
        seen = sorted(i for x in got for i in _images_of(x))
        assert seen == list(range(n))  # each image once
        for x in got:  # the student's rows are the same images', token by token
            assert torch.equal(x[0][:, 0], x[1][:, 0]) and x[1].shape[1] == 5
    assert [_images_of(x) for x in epochs[0]] != [_images_of(x) for x in epochs[1]]  # a new order every epoch
    assert [_images_of(x) for x in batches(0, 0)] == [_images_of(x) for x in epochs[0]]  # seeded
    assert [_images_of(x) for x in batches(1, 5)] == [_images_of(x) for x in epochs[1][5:]]  # resumes exactly
    assert any(len({i // chunk for i in _images_of(x)}) > 1 for x in epochs[0])  # batches mix chunks
    # bounded: the first batch only needs the first group of chunks
    first = {i // chunk for i in _images_of(epochs[0][0])}
    assert len(first) <= 3


def test_a_crosscoder_from_stored_activations_recovers_the_planted_features():
    train, held = _images(256, 0), _images(64, 1)
    teacher, student, u, v = _planted_pair(train)
    name = "blocks.1.hook_resid_post"
    arrays = {label: extract_activations(m, train, layers=[1]).activation.isel(layer=0)
              for label, m in (("teacher", teacher), ("student", student))}
    cfg = CrosscoderConfig(width=64, k=4, lr=5e-3, epochs=25, batch_images=16, seed=0, dead_after=5000)
    batches, steps = stored_batches(arrays, 32, cfg.batch_images, seed=cfg.seed, buffer_chunks=2)
    cc = fit_crosscoder(batches, steps, cfg, device="cpu")
    models, hooks = {"teacher": teacher, "student": student}, {"teacher": name, "student": name}
    diff = crosscoder_diff(cc, [paired_tokens(models, hooks, held[i:i + 32]) for i in (0, 32)])
    for model, direction, cls in ((0, u, "teacher_only"), (1, v, "student_only")):
        j, cos = _best(cc, model, direction)
        assert cos >= 0.9 and diff.latent_class.values[j] == cls, (cos, float(diff.relative_norm[j]))
        assert diff.scaling_verdict.values[j] == "confirmed"
    assert (diff.fve > 0.8).all(), diff.fve.values


def test_streamed_stores_hold_the_models_rows_and_train_the_command(tmp_path, capsys):
    from workbench.cli import main
    from workbench.data import load_images
    from workbench.models import load_model
    from workbench.store import open_store

    def store(model, layer, out, extra=()):
        args = ["analyze", "activations", "--model", model, "--images", "demo:train[:48]", "--layers", str(layer),
                "--chunk", "16", "--batch-size", "16", "--workers", "0", "--out", str(out), "--device", "cpu", *extra]
        assert main(args) == 0

    t, s = tmp_path / "t.zarr", tmp_path / "s.zarr"
    store("vit_demo", 2, t)
    store("vit_demo", 2, s)
    loaded = load_model("vit_demo", device="cpu")
    imgs = load_images("demo:train[:48]", input_size=loaded.input_size, mean=loaded.mean, std=loaded.std).tensor
    want = paired_tokens({"m": loaded.model}, {"m": "blocks.2.hook_resid_post"}, imgs)[0]
    got = torch.from_numpy(open_store(t).activation.isel(layer=0).values).flatten(0, 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # the rows the model computes, image by image

    out = tmp_path / "f.nc"
    args = ["features", "--teacher", "vit_demo", "--student", "vit_demo", "--teacher-activations", str(t),
            "--student-activations", str(s), "--held-out", "demo:val[:8]", "--width", "32", "--k", "2",
            "--batch-images", "16", "--block", "2", "--out", str(out), "--device", "cpu"]
    capsys.readouterr()
    assert main(args) == 0
    assert "wrote" in capsys.readouterr().out
    ds = open_store(out)
    assert int(ds.n_teacher_only) + int(ds.n_student_only) == 0 and (ds.fve.values > 0).all()
    assert "activations stored in" in ds.attrs["train_images"]
    ds.close()

    other = tmp_path / "o.zarr"
    store("vit_demo", 3, other)
    seeded = tmp_path / "seeded.zarr"
    store("vit_demo", 2, seeded, ("--seed", "1"))
    for flags, why in (((str(other), str(s)), "blocks.2.hook_resid_post"), ((str(seeded), str(s)), "another model"),
                       ((str(tmp_path / "none.zarr"), str(s)), "does not exist")):
        a = list(args)
        a[a.index("--teacher-activations") + 1], a[a.index("--student-activations") + 1] = flags
        assert main(a + ["--out", str(tmp_path / "g.nc")]) == 2
        assert why in capsys.readouterr().err
    a = list(args)
    del a[a.index("--student-activations"):a.index("--student-activations") + 2]
    assert main(a) == 2 and "both --teacher-activations and --student-activations" in capsys.readouterr().err
    assert not (tmp_path / "g.nc").exists()


def test_stored_batches_of_a_float16_store_are_float32():
    """A float16 store (``--dtype float16``) trains in float32: the rows come back as float32 tensors of its values."""
    arr = xr.DataArray(np.arange(24, dtype=np.float16).reshape(4, 3, 2), dims=("sample", "token", "channel"))
    batches, _ = stored_batches({"a": arr}, 2, 4, seed=0)
    (x,), = list(batches(0, 0))
    assert x.dtype == torch.float32 and sorted(x[:, 0].tolist()) == list(np.arange(0, 24, 2, dtype=float))
