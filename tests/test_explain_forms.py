"""workbench.explain on every model form: the (method, form) table, LRP conservation, exact forms agree.

Smoke-sized random-weight models (seeded, CPU, no downloads): the examples of :mod:`workbench.analysis.examples`,
the demo CNN teacher, Non-deep's collapse of the branched example, SlimSwin's gated demo Swin and its physically
pruned form. Float64 where a test asserts an identity.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
import torch.nn as nn

import methods.teachers  # noqa: F401  (registers the demo teachers with timm)
from workbench.analysis import examples
from workbench.explain import EXPLAINERS, applicability, attribute, load_all
from workbench.explain.lrp import lrp_relevance

ATTENTION = {"raw_attention", "rollout", "generic_attention", "legrad", "chefer_lrp"}
EVERY = {"gradcam", "ig", "saliency", "attnlrp", "cp_lrp"}  # what applies to every differentiable form we have

#: form -> (methods that apply, a phrase of the reason the others do not)
EXPECTED = {
    "vit": (ATTENTION | EVERY, ""),
    "far": (EVERY, "no attention probabilities"),
    "sparsifiner": (ATTENTION | EVERY, ""),
    "branched": (ATTENTION | EVERY, ""),
    "collapsed": (ATTENTION | EVERY, ""),
    "swin": (EVERY, "windowed attention"),
    "slimswin": (EVERY, "windowed attention"),
    "slimswin_pruned": (EVERY, "windowed attention"),
    "cnn": (EVERY, "no tokens"),
    "sa_resnet": (EVERY, "local self-attention"),
}
SIZE = {"swin": 32, "slimswin": 32, "slimswin_pruned": 32, "sa_resnet": 48}
GRID = {"vit": 7, "far": 7, "sparsifiner": 7, "branched": 7, "collapsed": 7, "swin": 16, "slimswin": 16,
        "slimswin_pruned": 16, "cnn": 4, "sa_resnet": 6}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Smoke-sized models gain nothing from threads; on a shared machine extra threads only spin (4 min -> 30 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.cache
def _form(name: str, dtype: torch.dtype = torch.float32) -> nn.Module:
    import timm

    torch.manual_seed(0)
    if name == "slimswin_pruned":
        model = examples.slimswin(pruned=True)
    elif name == "cnn":
        model = timm.create_model("cnn_demo")
    else:
        model = getattr(examples, name)()
    return model.eval().to(dtype)


def _x(form: str, n: int = 1, dtype=torch.float32) -> torch.Tensor:
    s = SIZE.get(form, 28)
    return torch.randn(n, 1, s, s, generator=torch.Generator().manual_seed(7), dtype=dtype)


def test_the_table_is_the_registry():
    assert set(load_all()) == ATTENTION | EVERY


@pytest.mark.parametrize("form", sorted(EXPECTED))
@pytest.mark.parametrize("method", sorted(ATTENTION | EVERY))
def test_method_on_form(method, form):
    """Applies where the table says, with a reason where not; the map has the form's grids and is finite."""
    model, x = _form(form), _x(form)
    applies, phrase = EXPECTED[form]
    why = EXPLAINERS[method].applies(model)
    assert (why is None) == (method in applies), why
    if why:
        assert phrase in why
        with pytest.raises(ValueError, match="does not apply"):
            attribute(model, x, method=method)
        return
    trainable = [p.requires_grad for p in model.parameters()]
    ds = attribute(model, x, method=method, **({"n_steps": 4} if method == "ig" else {}))
    g = GRID[form]
    assert ds["relevance"].shape == (1, g, g) and ds["relevance_pixel"].shape == (1, *x.shape[-2:])
    assert np.isfinite(ds["relevance"].values).all() and np.isfinite(ds["relevance_pixel"].values).all()
    assert np.abs(ds["relevance"].values).max() > 0  # not an empty map
    assert all(p.grad is None for p in model.parameters())
    assert [p.requires_grad for p in model.parameters()] == trainable


def test_a_sequence_reports_what_does_not_apply():
    ds = attribute(_form("far"), _x("far", 2), method=sorted(ATTENTION | {"attnlrp"}))
    skipped = json.loads(ds.attrs["not_applicable"])
    assert list(ds["explainer"].values) == ["attnlrp"] and set(skipped) == ATTENTION
    assert all("no attention probabilities" in why for why in skipped.values())


# ------------------------------------------------------------------------------------------ LRP conservation
def _without_biases(model: nn.Module) -> nn.Module:
    """Biases, LayerNorm shifts, BatchNorm means, position embeddings and class tokens set to 0: relevance then has
    no sink but the input (and, under AttnLRP, the softmax's bias term). BatchNorm scales are drawn in [0.5, 1.5]
    (timm zero-initialises a residual branch's last one, which would leave SA layers without relevance)."""
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for name, p in model.named_parameters():
            last = name.split(".")[-1]
            if last.startswith("bias") or last in ("pos_embed", "cls_token") or "bias_table" in last:
                p.zero_()
        for m in model.modules():
            if getattr(m, "running_mean", None) is not None:
                m.running_mean.zero_()
                m.weight.copy_(0.5 + torch.rand(m.weight.shape, generator=g))
    return model


@pytest.mark.parametrize("form", ["vit", "far", "cnn", "swin", "sa_resnet"])
def test_lrp_conserves_the_explained_logit(form):
    """Σ input relevance = the logit (CP-LRP); = the logit − the softmax bias terms (AttnLRP, Prop. 3.3), float64,
    relative 1e-8; with the biases kept, they take a share (the identity does not hold)."""
    torch.manual_seed(0)
    model = _without_biases({"cnn": _form("cnn"), "swin": examples.swin()}.get(form) or getattr(examples, form)())
    model = model.double().eval()
    x, t = _x(form, 2, torch.float64), torch.tensor([1, 3])
    with torch.no_grad():
        y = model(x).gather(1, t[:, None])[:, 0]
    assert (y.abs() > 1e-4).all()
    r, logit, absorbed = lrp_relevance(model, x, t, "attnlrp", record=True)
    torch.testing.assert_close(logit, y)
    torch.testing.assert_close(r.sum((1, 2, 3)) + absorbed, y, rtol=1e-8, atol=1e-12)
    if form in ("vit", "swin", "sa_resnet"):  # softmax present: its bias term takes a share
        assert (absorbed.abs() > 1e-6).all()
    cp, _, _ = lrp_relevance(model, x, t, "cp")
    torch.testing.assert_close(cp.sum((1, 2, 3)), y, rtol=1e-8, atol=1e-12)


def test_lrp_of_a_relu_cnn_is_gradient_times_input():
    """Without biases a ReLU CNN is positively homogeneous: LRP-0 is x ⊙ ∂y/∂x (plain autograd)."""
    model, x, t = _without_biases(_form("cnn", torch.float64)), _x("cnn", 2, torch.float64), torch.tensor([0, 4])
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(model(xg).gather(1, t[:, None]).sum(), xg)
    r, _, _ = lrp_relevance(model, x, t, "attnlrp")
    torch.testing.assert_close(r, x * g, rtol=1e-10, atol=1e-14)


# ------------------------------------------------------------------------------------------ exact forms agree
EXACT = ["raw_attention", "rollout", "generic_attention", "legrad", "gradcam", "saliency", "ig", "attnlrp", "cp_lrp"]


def test_collapsed_nondeep_explains_as_its_branched_form():
    """The collapse is exact, so are these explanations (float64); Chefer's LRP is not among them: its α1β0 rule
    reads the signs of the weights, which the collapse sums."""
    from methods.nondeep import collapse

    branched = _form("branched", torch.float64)
    collapsed = collapse(branched, form="concat").eval()  # in float64
    x = _x("branched", 2, torch.float64)
    a = attribute(branched, x, method=EXACT, target=[2, 5], n_steps=8)
    b = attribute(collapsed, x, method=EXACT, target=[2, 5], n_steps=8)
    assert list(a["explainer"].values) == EXACT == list(b["explainer"].values)
    np.testing.assert_allclose(a["relevance"].values, b["relevance"].values, rtol=1e-6, atol=1e-9)
    # the branches' own rule matters: treating the joined branches as separate heads gives another map
    from workbench.explain.attention import branch_groups, generic_relevance, grads_of

    pats, grads = grads_of(branched, x, torch.tensor([2, 5]))
    wide = generic_relevance(branch_groups(branched, pats), branch_groups(branched, grads), [False] * 3)
    assert not np.allclose(wide[:, 0, 1:].reshape(2, 7, 7).numpy(), a["relevance"].sel(explainer="generic_attention"))


def test_pruned_slimswin_heads_contribute_nothing():
    """A gated Swin with pruned window-head pairs and its physically pruned form (which never computes them) give
    the same explanations (float64); the masks matter (the unpruned Swin's differ)."""
    from methods.slimswin import get_masks, set_mask, to_pruned

    torch.manual_seed(0)
    gated = examples.slimswin().double()
    full = examples.slimswin().double()
    full.load_state_dict(gated.state_dict())
    set_mask(full, [torch.ones_like(m) for m in get_masks(full)])
    pruned = to_pruned(gated).eval()
    x, names = _x("swin", 2, torch.float64), ["saliency", "attnlrp", "cp_lrp", "gradcam"]
    a, b, c = (attribute(m, x, method=names, target=[1, 2]) for m in (gated, pruned, full))
    np.testing.assert_allclose(a["relevance"].values, b["relevance"].values, rtol=1e-7, atol=1e-10)
    assert not np.allclose(a["relevance"].values, c["relevance"].values, rtol=1e-3)


def test_the_readme_holds_the_generated_applicability_table():
    """The README's table is ``python -m workbench.explain.table``'s output, not a hand-kept copy."""
    from pathlib import Path

    from workbench.explain.table import FORMS, form, markdown

    tables = {title: applicability(form(title)) for title in FORMS}
    assert all(why is None or len(why) > 20 for t in tables.values() for why in t.values())
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    start = readme.index("<!-- applicability table: python -m workbench.explain.table -->\n")
    end = readme.index("<!-- end of the applicability table -->")
    assert readme[start:end].split("\n", 1)[1] == markdown(tables), "run python -m workbench.explain.table"


def test_alpha1beta0_is_chefers_eq4_on_a_linear_layer():
    """R_j = Σ_k (x_j w_kj)⁺ / Σ_j' (x_j' w_kj')⁺ · R_k by hand, R_k = z_k (ones as the output's gradient)."""
    from workbench.explain.lrp_rules import LRPRules

    g = torch.Generator().manual_seed(8)
    x, w, b = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((3, 5), (4, 5), (4,)))
    xg = x.clone().requires_grad_(True)
    with LRPRules("attnlrp", "alpha1beta0"):
        z = torch.nn.functional.linear(xg, w, b)  # (3, 4), the bias's share passed on too (Chefer's rule)
    (grad,) = torch.autograd.grad(z, xg, torch.ones_like(z))
    contrib = (x[:, None, :] * w[None]).clamp(min=0)  # (3, 4, 5): (x_j w_kj)⁺
    ref = (contrib / contrib.sum(-1, keepdim=True) * z.detach()[..., None]).sum(1)  # (3, 5)
    torch.testing.assert_close(x * grad, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close((x * grad).sum(1), z.detach().sum(1))  # conservative
