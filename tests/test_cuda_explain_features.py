"""Explanations and crosscoders on a CUDA GPU equal the same computation on the CPU (skipped without a GPU).

Each case builds one seeded model, runs it on the CPU and on ``cuda`` in float64 (no TF32, no float32 reduction-order
noise: what differs is placement, which is what these tests are for), and compares:

- every explainer of :mod:`workbench.explain` that applies, on every model form of ``tests/test_explain_forms.py``
  (ViT, FAR's LSTMs through cuDNN, Sparsifiner, Non-deep, Swin, SlimSwin, the CNN, SA-ResNet), patch and pixel maps;
- Chefer's positive / negative perturbation curves of :func:`workbench.explain.faithfulness.perturbation`;
- a crosscoder's training (same seed, same batches), its diff and a latent's causal effect.

``scripts/gpu_check.sh`` runs this file (its ``cuda-tests`` check selects the test files that name cuda).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import methods.teachers  # noqa: F401  (registers the demo teachers with timm)
from methods.devices import exact_float32
from workbench.analysis import examples
from workbench.explain import applicability, attribute

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on a GPU host)")

FORMS = ("vit", "far", "sparsifiner", "branched", "swin", "slimswin", "cnn", "sa_resnet")
SIZE = {"swin": 32, "slimswin": 32, "sa_resnet": 48}


def _form(name: str) -> torch.nn.Module:
    import timm

    torch.manual_seed(0)
    model = timm.create_model("cnn_demo") if name == "cnn" else getattr(examples, name)()
    return model.eval().double()


def _x(form: str, n: int = 3) -> torch.Tensor:
    s = SIZE.get(form, 28)
    return torch.randn(n, 1, s, s, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


def _close(a: np.ndarray, b: np.ndarray, what: str, rtol: float = 1e-6) -> None:
    scale = max(float(np.abs(a).max()), 1e-12)
    gap = float(np.abs(a - b).max()) / scale
    assert gap <= rtol, f"{what}: cuda vs cpu differ by {gap:.2e} of the map's maximum"


@pytest.mark.parametrize("form", FORMS)
def test_explanations_on_the_gpu_equal_the_cpu(form):
    model, x = _form(form), _x(form)
    methods = sorted(m for m, why in applicability(model).items() if why is None)
    assert methods, f"no explainer applies to {form}"
    opts = {"n_steps": 8}
    cpu = attribute(model, x, method=methods, **opts)
    gpu = attribute(copy.deepcopy(model).cuda(), x.cuda(), method=methods, **opts)
    assert list(gpu.explainer.values) == list(cpu.explainer.values)
    np.testing.assert_array_equal(gpu.target.values, cpu.target.values)
    for m in methods:
        for var in ("relevance", "relevance_pixel"):
            _close(cpu[var].sel(explainer=m).values, gpu[var].sel(explainer=m).values, f"{form} {m} {var}")


@pytest.mark.parametrize("form", ("vit", "far", "cnn"))
def test_perturbation_curves_on_the_gpu_equal_the_cpu(form):
    from workbench.explain.faithfulness import perturbation

    model, x = _form(form), _x(form, 4)
    ex = attribute(model, x, method=["saliency", "gradcam"])
    cpu = perturbation(model, x, ex)
    gpu = perturbation(copy.deepcopy(model).cuda(), x.cuda(), ex)
    for var in cpu.data_vars:
        if np.issubdtype(cpu[var].dtype, np.floating):
            np.testing.assert_allclose(gpu[var].values, cpu[var].values, rtol=1e-6, atol=1e-9, err_msg=var)


def test_a_crosscoder_trains_diffs_and_edits_alike_on_the_gpu():
    from workbench.features import CrosscoderConfig, crosscoder_diff, paired_tokens, train_crosscoder
    from workbench.features.effects import latent_effects

    torch.manual_seed(0)
    teacher = examples.vit().eval()
    student = copy.deepcopy(teacher)
    with torch.no_grad():
        student.blocks[-1].mlp.fc2.weight.mul_(0.5)  # a changed student: not the teacher's copy
    hooks = {"teacher": "blocks.1.hook_resid_post", "student": "blocks.1.hook_resid_post"}
    train, held = _x("vit", 64).float(), _x("vit", 16).float() + 0.1
    cfg = CrosscoderConfig(width=32, k=4, lr=5e-3, epochs=3, batch_images=16, seed=0)
    out = {}
    for dev in ("cpu", "cuda"):
        models = {k: copy.deepcopy(m).to(dev) for k, m in (("teacher", teacher), ("student", student))}
        with exact_float32():
            cc = train_crosscoder(models, hooks, train, cfg, device=dev)
            diff = crosscoder_diff(cc, [paired_tokens(models, hooks, held, dev)])
            eff = latent_effects(cc, models, hooks, held, [0] * len(held), [0, 1, 2], device=dev)
        out[dev] = (cc.cpu().state_dict(), diff, eff)
    (sc, dc, ec), (sg, dg, eg) = out["cpu"], out["cuda"]
    for k in sc:  # float32 training on two devices: summation orders differ, a few ulps per step
        torch.testing.assert_close(sg[k], sc[k], rtol=1e-3, atol=1e-4, msg=k)
    np.testing.assert_allclose(dg.fve.values, dc.fve.values, atol=1e-3)
    np.testing.assert_allclose(dg.relative_norm.values, dc.relative_norm.values, atol=1e-3)
    np.testing.assert_allclose(eg.effect.values, ec.effect.values, atol=1e-3, equal_nan=True)
