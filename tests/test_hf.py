"""Hugging Face folders (workbench.hf): ViT, DeiT, Swin and DINOv2 converted to timm, checked against transformers.

Every model is a tiny config built here with seeded random weights and saved with ``save_pretrained`` to a
temporary folder (nothing downloaded). The converted timm model must give the HF model's logits (1e-4 in float32,
1e-10 in float64), its attention probabilities (eager path), and the HF image processor's pixels.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from workbench.hf import HFError, load_hf  # noqa: E402
from workbench.models import load_model  # noqa: E402

VIT = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _save(model_cls, config, path, *, seed=0, preprocessor=None):
    """Seeded random weights of ``model_cls(config)`` saved to ``path`` (with a preprocessing config if given)."""
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():  # HF initialises layer scale, some biases and tokens to constants: randomise every tensor
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(path)
    if preprocessor is not None:
        preprocessor.save_pretrained(path)
    return model


FAMILIES = {
    "vit": lambda: (transformers.ViTForImageClassification, transformers.ViTConfig(**VIT, num_labels=5)),
    "vit-model": lambda: (transformers.ViTModel, transformers.ViTConfig(**VIT, qkv_bias=False, hidden_act="gelu_pytorch_tanh")),
    "deit": lambda: (transformers.DeiTForImageClassificationWithTeacher, transformers.DeiTConfig(**VIT, num_labels=4)),
    "swin": lambda: (transformers.SwinForImageClassification, transformers.SwinConfig(
        image_size=32, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4, num_labels=3)),
    "swin-clipped": lambda: (transformers.SwinModel, transformers.SwinConfig(  # stage 1 is one window: no shift; eps 1e-6
        image_size=16, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4, qkv_bias=False,
        layer_norm_eps=1e-6)),
    "dinov2": lambda: (transformers.Dinov2ForImageClassification, transformers.Dinov2Config(
        image_size=28, patch_size=7, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_labels=3)),
    "dinov2-reg": lambda: (transformers.Dinov2WithRegistersForImageClassification, transformers.Dinov2WithRegistersConfig(
        image_size=28, patch_size=7, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_labels=3,
        num_register_tokens=2)),
    "dinov2-model": lambda: (transformers.Dinov2Model, transformers.Dinov2Config(
        image_size=28, patch_size=7, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)),
}


def _hf_output(model, x):
    out = model(pixel_values=x)
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(model, transformers.SwinModel):
        return out.pooler_output
    return out.last_hidden_state[:, 0]  # a headless ViT / DINOv2: the final-norm class token (timm's features)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_converted_logits_equal_hf(tmp_path, name):
    cls, config = FAMILIES[name]()
    hf = _save(cls, config, tmp_path / name)
    converted, _ = load_hf(f"hf:{tmp_path / name}")
    size = config.image_size
    x = torch.randn(3, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = converted.model(x), _hf_output(hf, x)
        assert ours.shape == theirs.shape
        assert torch.allclose(ours, theirs, atol=1e-4, rtol=0), float((ours - theirs).abs().max())
        ours64, theirs64 = converted.model.double()(x.double()), _hf_output(hf.double(), x.double())
    assert torch.allclose(ours64, theirs64, atol=1e-10, rtol=0), float((ours64 - theirs64).abs().max())
    assert theirs64.abs().max() > 1e-3  # not a trivially equal (zero) output


@pytest.mark.parametrize("name", ["vit", "deit", "dinov2-reg"])
def test_attention_equals_hf_eager(tmp_path, name):
    from workbench.analysis.attention import extract_attention

    cls, config = FAMILIES[name]()
    _save(cls, config, tmp_path / name)
    hf = cls.from_pretrained(tmp_path / name, attn_implementation="eager").eval()
    converted, _ = load_hf(f"hf:{tmp_path / name}")
    x = torch.randn(2, 3, config.image_size, config.image_size, generator=torch.Generator().manual_seed(2))
    ds = extract_attention(converted.model, x)
    with torch.no_grad():
        want = torch.stack(hf(pixel_values=x, output_attentions=True).attentions, dim=1)  # (B, layer, head, q, k)
    assert ds["attention"].shape == tuple(want.shape)
    np.testing.assert_allclose(ds["attention"].values, want.numpy(), atol=1e-5, rtol=0)
    kinds = list(ds["query_kind"].values[: 1 + (name == "deit") + 2 * (name == "dinov2-reg")])
    assert kinds[0] == "cls" and ("dist" in kinds) == (name == "deit")


def test_swin_window_attention_equals_hf_eager(tmp_path):
    from methods.hooks import run_with_cache

    cls, config = FAMILIES["swin"]()
    _save(cls, config, tmp_path / "swin")
    hf = cls.from_pretrained(tmp_path / "swin", attn_implementation="eager").eval()
    converted, _ = load_hf(f"hf:{tmp_path / 'swin'}")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, cache = run_with_cache(converted.model, x, names="layers.*.attn.hook_pattern")
        want = hf(pixel_values=x, output_attentions=True).attentions
    ours = list(cache.values())  # every block's (B*windows, heads, N, N), in block order
    assert len(ours) == sum(config.depths)
    # transformers 5 returns the last block's map of each stage (4.x: every block's)
    last = np.cumsum(config.depths) - 1 if len(want) == len(config.depths) else np.arange(sum(config.depths))
    assert len(want) == len(last)
    for j, ref in zip(last, want):
        assert ours[j].shape == ref.shape
        np.testing.assert_allclose(ours[j].numpy(), ref.numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("processor", ["vit", "bit", "deit"])
def test_preprocessing_equals_hf_image_processor(tmp_path, processor):
    from PIL import Image

    from workbench.hf import transform

    pil = lambda n: getattr(transformers, n + "Pil", None) or getattr(transformers, n)  # the PIL processor (v4: the slow one)
    procs = {"vit": lambda: pil("ViTImageProcessor")(size={"height": 32, "width": 32}, image_mean=[0.5, 0.4, 0.3],
                                                     image_std=[0.2, 0.3, 0.25]),
             "bit": lambda: pil("BitImageProcessor")(size={"shortest_edge": 36}, crop_size={"height": 32, "width": 32}),
             "deit": lambda: pil("DeiTImageProcessor")(size={"height": 37, "width": 37}, crop_size={"height": 32, "width": 32},
                                                       resample=3)}
    cls, config = FAMILIES["vit"]()
    _save(cls, config, tmp_path / "m", preprocessor=procs[processor]())
    converted, _ = load_hf(f"hf:{tmp_path / 'm'}")
    rng = np.random.default_rng(4)
    for shape in [(50, 41, 3), (29, 64, 3)]:
        img = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8))
        want = procs[processor]()(img, return_tensors="pt")["pixel_values"][0]
        ours = transform(converted.data_config)(img)
        assert ours.shape == want.shape == (3, 32, 32)
        np.testing.assert_allclose(ours.numpy(), want.numpy(), atol=1e-5, rtol=0)


def test_load_model_takes_hf_folder(tmp_path):
    cls, config = FAMILIES["deit"]()
    processor = transformers.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    _save(cls, config, tmp_path / "deit", preprocessor=processor)
    loaded = load_model(f"hf:{tmp_path / 'deit'}")
    assert loaded.input_size == (3, 32, 32) and loaded.mean == (0.5,) * 3 and loaded.std == (0.5,) * 3
    assert loaded.source.name == f"hf:{tmp_path / 'deit'}" and loaded.source.weights == "checkpoint"
    assert type(loaded.model).__name__ == "VisionTransformerDistilled" and not loaded.model.training
    with pytest.raises(ValueError, match="drop --checkpoint"):
        load_model(f"hf:{tmp_path / 'deit'}", checkpoint="x.safetensors")
    from workbench.models import create_model

    converted, _ = load_hf(f"hf:{tmp_path / 'deit'}")  # a run records the architecture as a timm name + JSON kwargs
    rebuilt = create_model(converted.name, **json.loads(json.dumps(converted.kwargs)))
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in converted.model.state_dict().items()}
    assert rebuilt.pretrained_cfg["input_size"] == [3, 32, 32] and rebuilt.pretrained_cfg["mean"] == [0.5] * 3


# ---- refused ------------------------------------------------------------------------------------------------------


@pytest.fixture
def vit_folder(tmp_path):
    cls, config = FAMILIES["vit"]()
    _save(cls, config, tmp_path / "vit")
    return tmp_path / "vit"


def test_hub_name_without_folder_says_how_to_fetch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HFError, match=r"huggingface-cli download google/vit-base-patch16-224 --local-dir DIR"):
        load_model("hf:google/vit-base-patch16-224")


def test_folder_without_weights_refused(vit_folder):
    (vit_folder / "model.safetensors").unlink()
    with pytest.raises(HFError, match="no weights"):
        load_model(f"hf:{vit_folder}")


def test_truncated_safetensors_refused(vit_folder):
    f = vit_folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(HFError, match="not a readable safetensors"):
        load_model(f"hf:{vit_folder}")


def test_unsupported_family_refused(tmp_path):
    _save(transformers.BeitForImageClassification, transformers.BeitConfig(**VIT, num_labels=2), tmp_path / "beit")
    with pytest.raises(HFError, match=r"BeitForImageClassification .* is not supported; supported: .*ViTModel"):
        load_model(f"hf:{tmp_path / 'beit'}")


def test_option_timm_lacks_refused_by_name(tmp_path):
    cfg = transformers.SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[2], num_heads=[2], window_size=4,
                                  use_absolute_embeddings=True)
    _save(transformers.SwinModel, cfg, tmp_path / "swin")
    with pytest.raises(HFError, match="use_absolute_embeddings=True"):
        load_model(f"hf:{tmp_path / 'swin'}")
    _save(transformers.ViTModel, transformers.ViTConfig(**{**VIT, "hidden_act": "mish"}), tmp_path / "mish")
    with pytest.raises(HFError, match="hidden_act='mish'"):
        load_model(f"hf:{tmp_path / 'mish'}")
    _save(transformers.Dinov2Model, transformers.Dinov2Config(image_size=28, patch_size=7, hidden_size=32, num_hidden_layers=1,
                                                               num_attention_heads=4, use_swiglu_ffn=True), tmp_path / "swiglu")
    with pytest.raises(HFError, match="use_swiglu_ffn=True"):
        load_model(f"hf:{tmp_path / 'swiglu'}")
    _save(transformers.ViTModel, transformers.ViTConfig(**{**VIT, "patch_size": (8, 4)}), tmp_path / "patch")
    with pytest.raises(HFError, match=r"patch_size=\[8, 4\]: a non-square patch"):
        load_model(f"hf:{tmp_path / 'patch'}")


def test_pytorch_model_bin_read_weights_only(vit_folder, tmp_path):
    from safetensors.torch import load_file

    state = load_file(vit_folder / "model.safetensors")
    (vit_folder / "model.safetensors").unlink()
    torch.save(state, vit_folder / "pytorch_model.bin")  # plain tensors: read with weights_only=True
    converted, _ = load_hf(f"hf:{vit_folder}")
    assert torch.equal(converted.model.head.weight, state["classifier.weight"])

    class Payload:  # a pickle that needs code to load is refused, never run
        def __reduce__(self):
            return (print, ("unpickled!",))

    torch.save({"x": Payload()}, vit_folder / "pytorch_model.bin")
    with pytest.raises(HFError, match="weights_only=True"):
        load_hf(f"hf:{vit_folder}")


def test_num_labels_differing_from_weights_refused(vit_folder, tmp_path):
    cfg = json.loads((vit_folder / "config.json").read_text())
    cfg["id2label"] = {str(i): f"c{i}" for i in range(7)}
    cfg["label2id"] = {f"c{i}": i for i in range(7)}
    (vit_folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HFError, match=r"7 labels .* classifier has 5 rows"):
        load_model(f"hf:{vit_folder}")


def test_cli_analyze_refuses_bad_folder_and_writes_nothing(vit_folder, tmp_path):
    from workbench.cli import main

    (vit_folder / "model.safetensors").unlink()
    out = tmp_path / "att.nc"
    rc = main(["analyze", "attention", "--model", f"hf:{vit_folder}", "--images", "demo:val[:2]", "--out", str(out)])
    assert rc != 0 and not out.exists() and not list(tmp_path.glob("att*"))


@pytest.fixture(scope="module")
def hf_vit_runs(tmp_path_factory):
    """An HF ViT folder (1-channel 28x28, the demo digits' preprocessing) as the teacher of a FAR and a Sparsifiner
    run on the smoke profile: (folder, FAR's pruned run, Sparsifiner's run), shared by the end-to-end tests below."""
    from workbench.pipelines import run_method

    folder = tmp_path_factory.mktemp("hf") / "vit"
    cfg = transformers.ViTConfig(image_size=28, patch_size=4, num_channels=1, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=64, num_labels=10)
    _save(transformers.ViTForImageClassification, cfg, folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "ViTImageProcessor", "size": {"height": 28, "width": 28}, "resample": 2,
        "rescale_factor": 1 / 255, "image_mean": [0.1307], "image_std": [0.3081]}))
    pruned = run_method("far", f"hf:{folder}", "smoke", device="cpu", log=lambda *_: None)
    sparsifiner = run_method("sparsifiner", f"hf:{folder}", "smoke", device="cpu", log=lambda *_: None, keep_rate=0.25)
    return folder, pruned, sparsifiner


def _eager_attention(folder, x):
    """HF's own ``output_attentions`` on the eager path: (B, layer, head, q, k)."""
    eager = transformers.ViTForImageClassification.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return torch.stack(eager(pixel_values=x, output_attentions=True).attentions, dim=1).numpy()


@pytest.mark.integration
def test_hf_vit_teaches_far_and_sparsifiner(hf_vit_runs):
    """The teacher recorded by its timm name, kwargs and weight hash; the students built from them."""
    from workbench.cli import main
    from workbench.runs import open_run

    folder, pruned, sparsifiner = hf_vit_runs
    far = open_run(pruned.config["source_run"])
    assert far.config["teacher"]["ref"] == f"hf:{folder}" and far.config["teacher"]["model_name"] == "hf_vit"
    assert far.config["teacher"]["model_kwargs"]["data"]["mean"] == [0.1307] and pruned.status == "complete"
    assert load_model(pruned.id).input_size == (1, 28, 28)  # the student keeps the folder's preprocessing
    assert main(["run", "far", "--teacher", f"hf:{folder}", "--profile", "smoke", "--device", "cpu"]) == 0  # reused
    assert main(["run", "far", "--teacher", f"hf:{folder}", "--checkpoint", "w.safetensors", "--profile", "smoke"]) == 2
    assert sparsifiner.status == "complete" and sparsifiner.config["teacher"]["model_name"] == "hf_vit"


@pytest.mark.integration
def test_compare_hf_teacher_with_its_students(hf_vit_runs, tmp_path, capsys):
    """``workbench compare --teacher hf:DIR``, and ``compare(hf_model, ...)`` in Python: the teacher's row is the HF
    model's (its predictions are HF's)."""
    import xarray as xr

    from workbench.cli import main
    from workbench.data import load_images

    folder, pruned, sparsifiner = hf_vit_runs
    out = tmp_path / "cmp.nc"
    assert main(["compare", "--teacher", f"hf:{folder}", "--student", f"FAR={pruned.id}", "--student",
                 f"Sparsifiner={sparsifiner.id}", "--images", "demo:val[15::200]", "--parts", "predictions",
                 "--out", str(out), "--device", "cpu"]) == 0
    ds = xr.open_dataset(out)
    assert json.loads(ds.attrs["models"])["teacher"]["name"] == f"hf:{folder.resolve()}"
    assert list(ds["model"].values) == ["teacher", "FAR", "Sparsifiner"]
    x = load_images("demo:val[15::200]", input_size=(1, 28, 28), mean=(0.1307,), std=(0.3081,)).tensor
    hf = transformers.ViTForImageClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        want = hf(pixel_values=x).logits.argmax(-1).numpy()
    pred = [v for v in ds.data_vars if "pred" in v]
    assert pred, list(ds.data_vars)
    np.testing.assert_array_equal(ds[pred[0]].sel(model="teacher").values, want)
    from workbench.compare import compare  # Python: a transformers model object as the teacher, converted

    obj = compare(hf, {"again": hf}, "demo:val[15::200]", parts=("predictions",), device="cpu")
    assert json.loads(obj.attrs["models"])["teacher"]["name"] == "transformers:ViTForImageClassification"
    np.testing.assert_array_equal(obj[pred[0]].sel(model="teacher").values, want)
    with pytest.raises(ValueError, match=r"normalise their input differently \(teacher mean \(0.5,\)"):
        compare(hf, {"FAR": pruned.id}, "demo:val[15::200]", parts=("predictions",), device="cpu")  # no processor given


@pytest.mark.integration
@pytest.mark.parametrize("native", [False, True])
def test_analyze_attention_of_hf_folder_equals_hf_eager(hf_vit_runs, tmp_path, native):
    """``workbench analyze attention --model hf:DIR [--native]``: the converted model's maps, and the HF model's own
    (run by transformers, hooked), each equal to HF's ``output_attentions`` on the eager path."""
    import xarray as xr

    from workbench.cli import main
    from workbench.data import load_images

    folder = hf_vit_runs[0]
    out = tmp_path / "att.nc"
    assert main(["analyze", "attention", "--model", f"hf:{folder}", "--images", "demo:val[:3]", "--out", str(out),
                 "--device", "cpu"] + ["--native"] * native) == 0
    ds = xr.open_dataset(out)
    assert ds.attrs["model_name"].startswith(f"hf:{folder.resolve()}") and ds.attrs["model_name"].endswith("#native") == native
    x = load_images("demo:val[:3]", input_size=(1, 28, 28), mean=(0.1307,), std=(0.3081,)).tensor
    np.testing.assert_allclose(ds["attention"].values, _eager_attention(folder, x), atol=1e-5, rtol=0)
    assert list(ds["query_kind"].values[:2]) == ["cls", "patch"] and ds.sizes["y"] == ds.sizes["x"] == 7


@pytest.mark.integration
def test_explore_hf_folder_and_transformers_object(hf_vit_runs):
    """``explore(...)`` takes ``hf:DIR`` (converted), a transformers model object (converted, not wrapped raw) and
    the native model: the three panels of one clicked token equal (those of hf:DIR equal HF's eager maps, above)."""
    from workbench.explore import explore

    folder = hf_vit_runs[0]
    hf = transformers.ViTForImageClassification.from_pretrained(folder).eval()
    w = explore(f"hf:{folder}", {"object": hf, "native": load_model(f"hf:{folder}", native=True)}, "demo:val[:1]")
    view = w.state.view()
    maps = {p["label"]: np.asarray(p["map"]) for p in view["panels"]}
    assert set(maps) == {"teacher", "object", "native"}
    np.testing.assert_allclose(maps["object"], maps["teacher"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(maps["native"], maps["teacher"], atol=1e-5, rtol=0)
    assert float(np.nanmax(maps["teacher"])) > 0


@pytest.mark.parametrize("name", ["vit", "deit", "dinov2-reg", "swin"])
def test_native_hf_attention_equals_converted(tmp_path, name):
    """The HF model analysed as it is (hooks on its attention modules, eager only for that forward) gives the maps of
    its converted timm model's hook points, every block (Swin too), and its SDPA setting comes back."""
    from methods.hooks import run_with_cache
    from workbench.hf.native import attention_maps

    cls, config = FAMILIES[name]()
    _save(cls, config, tmp_path / name)
    hf = cls.from_pretrained(tmp_path / name, attn_implementation="sdpa").eval()
    converted, _ = load_hf(f"hf:{tmp_path / name}")
    x = torch.randn(2, 3, config.image_size, config.image_size, generator=torch.Generator().manual_seed(5))
    native = attention_maps(hf, x)
    with torch.no_grad():
        _, cache = run_with_cache(converted.model, x, names="*attn.hook_pattern")
    ours = list(cache.values())
    assert len(native) == len(ours) == (sum(config.depths) if name == "swin" else config.num_hidden_layers)
    for got, want in zip(native, ours):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=0)
    assert hf.config._attn_implementation == "sdpa"


def test_dinov2_processor_size_other_than_image_size(tmp_path):
    """DINOv2 interpolates its position embedding to the image on every forward; the converted model does it once,
    the same way (bicubic in float32), and takes the processor's size."""
    cls, config = FAMILIES["dinov2"]()  # image_size 28, patch 7: a 4 x 4 grid; the processor crops 21 (3 x 3)
    processor = getattr(transformers, "BitImageProcessorPil", transformers.BitImageProcessor)(
        size={"shortest_edge": 24}, crop_size={"height": 21, "width": 21})
    hf = _save(cls, config, tmp_path / "d", preprocessor=processor)
    converted, _ = load_hf(f"hf:{tmp_path / 'd'}")
    assert converted.data_config["input_size"] == (3, 21, 21) and converted.model.pos_embed.shape[1] == 1 + 9
    x = torch.randn(2, 3, 21, 21, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.allclose(converted.model(x), hf(pixel_values=x).logits, atol=1e-4, rtol=0)
        ours64, theirs64 = converted.model.double()(x.double()), hf.double()(pixel_values=x.double()).logits
    assert torch.allclose(ours64, theirs64, atol=1e-10, rtol=0), float((ours64 - theirs64).abs().max())


def test_vit_processor_size_other_than_image_size_refused(tmp_path):
    cls, config = FAMILIES["vit"]()  # a ViT does not interpolate its position embedding unless asked per call
    processor = transformers.ViTImageProcessor(size={"height": 48, "width": 48})
    _save(cls, config, tmp_path / "v", preprocessor=processor)
    with pytest.raises(HFError, match=r"image_size=32: the image processor gives 48x48 images"):
        load_hf(f"hf:{tmp_path / 'v'}")


@pytest.mark.integration
def test_hf_swin_teaches_slimswin(tmp_path):
    from workbench.pipelines import run_method

    folder = tmp_path / "swin"
    cfg = transformers.SwinConfig(image_size=32, patch_size=2, num_channels=1, embed_dim=24, depths=[2, 2, 2],
                                  num_heads=[3, 6, 12], window_size=4, mlp_ratio=2.0, num_labels=10)
    _save(transformers.SwinForImageClassification, cfg, folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "size": {"height": 32, "width": 32}, "resample": 2, "image_mean": [0.1307], "image_std": [0.3081]}))
    run = run_method("slimswin", f"hf:{folder}", "smoke", device="cpu", log=lambda *_: None, ratio=1 / 3)
    assert run.status == "complete" and run.config["teacher"]["ref"] == f"hf:{folder}"
    assert run.id.startswith("slimswin-r0.3333-hf-swin+ck") and load_model(run.id).input_size == (1, 32, 32)


def test_transformers_model_object(tmp_path):
    """A transformers model object (not a folder) converts as its save_pretrained folder would."""
    cls, config = FAMILIES["swin"]()
    hf = _save(cls, config, tmp_path / "swin")
    loaded = load_model(hf)
    assert loaded.source.name == "transformers:SwinForImageClassification" and loaded.source.weights == "checkpoint"
    assert loaded.source.weights_sha256 == load_model(f"hf:{tmp_path / 'swin'}").source.weights_sha256
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert torch.allclose(loaded.model(x), hf(pixel_values=x).logits, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="drop img_size"):
        load_model(hf, img_size=64)


def test_run_with_bad_hf_teacher_refused_before_any_run_dir(vit_folder):
    from workbench.pipelines import run_method
    from workbench.runs import runs_root

    f = vit_folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])  # truncated
    before = sorted(runs_root().glob("*")) if runs_root().exists() else []
    with pytest.raises(HFError, match="not a readable safetensors"):
        run_method("far", f"hf:{vit_folder}", "smoke", device="cpu", log=lambda *_: None)
    assert (sorted(runs_root().glob("*")) if runs_root().exists() else []) == before


@pytest.mark.integration
def test_train_teacher_records_hf_folder(tmp_path):
    """``workbench train teacher --checkpoint hf:DIR --epochs 0``: the folder recorded as a teacher run, whose model
    computes what the HF model computes."""
    from workbench.cli import main
    from workbench.runs import runs_root

    folder = tmp_path / "vit"
    cfg = transformers.ViTConfig(image_size=28, patch_size=4, num_channels=1, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=64, num_labels=10)
    hf = _save(transformers.ViTForImageClassification, cfg, folder)
    assert main(["train", "teacher", "--arch", "vit", "--profile", "smoke", "--checkpoint", f"hf:{folder}",
                 "--epochs", "0", "--device", "cpu"]) == 0
    (run_dir,) = [p for p in runs_root().glob("teacher-*") if "hf_vit" in p.name]
    loaded = load_model(run_dir.name)
    x = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        assert torch.allclose(loaded.model(x), hf(pixel_values=x).logits, atol=1e-4, rtol=0)
    assert main(["train", "teacher", "--arch", "vit", "--profile", "smoke", "--checkpoint", f"hf:{folder}",
                 "--model", "deit-s", "--epochs", "0"]) == 2


@pytest.mark.integration
def test_train_teacher_from_hf_deit_on_other_classes(tmp_path):
    """Fine-tuning a distilled HF DeiT on data of another class count re-initialises both heads (and says so)."""
    from workbench.pipelines.teacher import train_teacher

    folder = tmp_path / "deit"
    cfg = transformers.DeiTConfig(image_size=28, patch_size=4, num_channels=1, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=4, intermediate_size=64, num_labels=7)
    _save(transformers.DeiTForImageClassificationWithTeacher, cfg, folder)
    said = []
    run = train_teacher("vit", "smoke", checkpoint=f"hf:{folder}", epochs=1, device="cpu", log=said.append)
    assert run.status == "complete" and any("classifier" in s and "re-initialised" in s for s in said)
    assert load_model(run.id).model.head_dist.out_features == 10  # the demo set's classes


def test_cli_run_with_bad_hf_teacher_exits_2_and_writes_nothing(vit_folder, tmp_path, monkeypatch, capsys):
    """``workbench run far --teacher hf:DIR`` with a truncated weights file, and with a hub name that is no folder:
    exit 2, the problem and the fix on stderr, no run directory and no store."""
    from workbench.cli import main
    from workbench.runs import home

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    f = vit_folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    assert main(["run", "far", "--teacher", f"hf:{vit_folder}", "--profile", "smoke", "--device", "cpu"]) == 2
    assert "not a readable safetensors" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    assert main(["run", "sparsifiner", "--teacher", "hf:facebook/deit-small-patch16-224", "--keep-rate", "0.25",
                 "--profile", "smoke"]) == 2
    assert "huggingface-cli download facebook/deit-small-patch16-224 --local-dir DIR" in capsys.readouterr().err
    assert not list((tmp_path / "home").rglob("manifest.json")) and not list((tmp_path / "home").rglob("*.nc"))
    assert not (home() / "runs").exists() or not any((home() / "runs").iterdir())


@pytest.mark.integration
def test_paper_profile_takes_an_hf_teacher_recorded_on_the_data(tmp_path, monkeypatch):
    """``figures --profile paper --data ROOT`` draws from the user's teacher runs on ROOT: an HF folder recorded with
    ``train teacher --profile paper --data ROOT --checkpoint hf:DIR --epochs 0`` is the teacher its figures use."""
    from PIL import Image

    from workbench.cli import main
    from workbench.figures.context import Context

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    rng = np.random.default_rng(0)
    for split, n in (("train", 2), ("val", 2)):
        for c in range(2):
            (tmp_path / "data" / split / f"c{c}").mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(tmp_path / "data" / split / f"c{c}" / f"{i}.png")
    folder = tmp_path / "vit"
    _save(transformers.ViTForImageClassification, transformers.ViTConfig(**VIT, num_labels=2), folder)
    root = str(tmp_path / "data")
    assert main(["train", "teacher", "--arch", "vit", "--profile", "paper", "--data", root, "--checkpoint", f"hf:{folder}",
                 "--epochs", "0", "--device", "cpu"]) == 0
    run = Context("paper", device="cpu", log=lambda *_: None, data=root).teacher("vit")
    assert run.config["model_name"] == "hf_vit" and run.manifest["results"]["epochs"] == 0
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    hf = transformers.ViTForImageClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        assert torch.allclose(load_model(run.id).model(x), hf(pixel_values=x).logits, atol=1e-4, rtol=0)


def test_native_refused_where_it_does_not_apply(tmp_path):
    """--native is for the ViT-like HF folders: Swin (window maps need the converted model) and non-HF models are
    refused naming the alternative; a streamed store too."""
    from workbench.cli import main

    cls, config = FAMILIES["swin"]()
    _save(cls, config, tmp_path / "swin")
    with pytest.raises(HFError, match="not analysed natively .* drop --native"):
        load_model(f"hf:{tmp_path / 'swin'}", native=True)
    with pytest.raises(ValueError, match=r"native applies to a Hugging Face folder \(hf:DIR\) only"):
        load_model("vit_demo", native=True)
    assert main(["analyze", "attention", "--model", f"hf:{tmp_path / 'swin'}", "--native", "--out",
                 str(tmp_path / "a.zarr")]) == 2 and not (tmp_path / "a.zarr").exists()


@pytest.mark.parametrize("name", ["vit", "deit", "dinov2-reg"])
def test_native_hf_attributions_equal_converted(tmp_path, name):
    """Attributions run on the HF model itself (its attention read at the native hook points, with gradients) equal
    those of its converted timm model; LeGrad, which needs timm's final norm and head, is refused with its reason."""
    from workbench.explain import attribute
    from workbench.hf.native import NativeViT

    cls, config = FAMILIES[name]()
    _save(cls, config, tmp_path / name)
    hf = cls.from_pretrained(tmp_path / name, attn_implementation="sdpa").eval()
    converted, _ = load_hf(f"hf:{tmp_path / name}")
    x = torch.randn(2, 3, config.image_size, config.image_size, generator=torch.Generator().manual_seed(5))
    for method in ("raw_attention", "rollout", "generic_attention", "saliency", "attnlrp"):
        got = attribute(NativeViT(hf), x, method=method, target=1)["relevance"].values
        want = attribute(converted.model.eval(), x, method=method, target=1)["relevance"].values
        scale = float(np.abs(want).max())
        assert scale > 0, method
        np.testing.assert_allclose(got, want, atol=1e-4 * scale, rtol=1e-3, err_msg=method)
    with pytest.raises(ValueError, match="legrad does not apply"):
        attribute(NativeViT(hf), x, method="legrad", target=1)
    assert hf.config._attn_implementation == "sdpa"
