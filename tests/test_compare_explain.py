"""``workbench compare --explainers``: each student's explanation agreement with its teacher, in the compare store.

Tiny demo models (random weights from fixed seeds, 10 digits): a twin of the teacher agrees perfectly (ρ = 1, keeps
its reasons); another ViT's per-image Spearman ρ and top-10 % overlap equal scipy's and a hand count on
``workbench.explain.attribute``'s maps; a CNN student gets rollout's reason in the notes and its saliency compared
on the pixel grid; with ``--explain-perturbation`` each model's perturbation AUC and the paired student − teacher
interval.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from scipy.stats import spearmanr

from workbench.cli import main
from workbench.models import create_model, load_model
from workbench.store import open_store

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::workbench.provenance.RandomInitWarning")]
IMAGES = "demo:val[::100]"


def test_compare_stores_the_explanation_agreement(tmp_path, capsys):
    from workbench.data import load_images
    from workbench.explain import attribute
    from workbench.explain.faithfulness import perturbation
    from workbench.stats import paired_diff_interval

    torch.manual_seed(7)
    other = tmp_path / "other.safetensors"
    save_file(create_model("vit_demo").state_dict(), str(other))
    out = tmp_path / "c.nc"
    assert main(["compare", "--teacher", "vit_demo", "--student", "twin=vit_demo", "--student", "other=vit_demo",
                 "--checkpoint", f"other={other}", "--student", "cnn=cnn_demo", "--images", IMAGES, "--parts",
                 "predictions", "--explainers", "saliency,rollout", "--explain-perturbation", "--out", str(out),
                 "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    ds = open_store(out, load=True)
    assert ds["explainer"].values.tolist() == ["saliency", "rollout"]
    twin = ds.sel(model="twin")
    np.testing.assert_allclose(twin["explain_spearman"].values, 1.0, atol=1e-6)
    np.testing.assert_array_equal(twin["explain_auc_diff_mean"].values, 0.0)  # the same maps, the same AUCs
    assert twin["explain_reasons"].values.tolist() == ["keeps", "keeps"]
    # the other ViT: independently, scipy's Spearman and a top-10 % count on attribute()'s patch maps of the
    # teacher's predicted class
    x = load_images(IMAGES, input_size=(1, 28, 28)).tensor
    t, s = load_model("vit_demo").model, load_model("vit_demo", checkpoint=str(other)).model
    target = t(x).argmax(-1)
    ta, sa = attribute(t, x, method="saliency", target=target), attribute(s, x, method="saliency", target=target)
    a, b = ta["relevance"].values.reshape(len(x), -1), sa["relevance"].values.reshape(len(x), -1)
    rho = np.array([spearmanr(u, v)[0] for u, v in zip(a, b)])
    k = max(1, round(0.1 * a.shape[1]))
    top = np.array([len(set(np.argsort(-u)[:k]) & set(np.argsort(-v)[:k])) / k for u, v in zip(a, b)])
    got = ds.sel(model="other", explainer="saliency")
    np.testing.assert_allclose(got["explain_spearman"].values, rho, atol=1e-5)
    np.testing.assert_allclose(got["explain_topk"].values, top, atol=1e-6)
    lo, hi = paired_diff_interval(rho, np.zeros_like(rho))
    np.testing.assert_allclose([got["explain_spearman_low"], got["explain_spearman_high"]], [lo, hi], atol=1e-5)
    want = "keeps" if lo >= 0.5 else "loses" if hi < 0.5 else "inconclusive"
    # faithfulness side by side: each model's AUC of its own map, the student − teacher interval paired over images
    auc_t, auc_s = (perturbation(m, x, e)["auc"].sel(order="positive").values for m, e in ((t, ta), (s, sa)))
    np.testing.assert_allclose(got["explain_auc"].sel(order="positive").values, auc_s, atol=1e-9)
    np.testing.assert_allclose(ds["explain_auc"].sel(model="teacher", explainer="saliency", order="positive"), auc_t,
                               atol=1e-9)
    d = got.sel(order="positive")
    np.testing.assert_allclose([d["explain_auc_diff_mean"], d["explain_auc_diff_low"], d["explain_auc_diff_high"]],
                               [(auc_s - auc_t).mean(), *paired_diff_interval(auc_s, auc_t)], atol=1e-9)
    assert got["explain_reasons"].item() == want and ds["explain_grid"].sel(model="other").item() == "patch"
    # the teacher is not compared with itself; the CNN has no attention to roll out: its reason, not a NaN verdict
    assert np.isnan(ds["explain_spearman"].sel(model="teacher")).all()
    cnn = ds.sel(model="cnn")
    assert cnn["explain_reasons"].sel(explainer="rollout").item() == "" and np.isnan(cnn["explain_spearman"].sel(
        explainer="rollout")).all()
    assert cnn["explain_reasons"].sel(explainer="saliency").item() in ("keeps", "loses", "inconclusive")
    assert np.isfinite(cnn["explain_spearman"].sel(explainer="saliency")).all()
    assert ds["explain_grid"].sel(model="cnn").item() == "pixel"
    assert "cnn" in json.loads(ds.attrs["notes"])["explain rollout"]
    assert "explanations, other, saliency: Spearman" in printed and "note, explain rollout, cnn:" in printed
    assert "positive perturbation AUC, student − teacher" in printed
    assert np.isnan(ds["explain_auc"].sel(model="cnn", explainer="rollout")).all()


def test_an_unknown_explainer_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "c.nc"
    assert main(["compare", "--teacher", "vit_demo", "--student", "twin=vit_demo", "--images", "demo:val[:2]",
                 "--parts", "predictions", "--explainers", "saliency,nope", "--out", str(out), "--device", "cpu"]) != 0
    err = capsys.readouterr().err
    assert "unknown explainer 'nope'" in err and "generic_attention" in err and not out.exists()
