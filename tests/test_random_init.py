"""A model without weights is never taken for a result: said on stderr, recorded, marked in what is built on it.

A timm name loaded without a checkpoint keeps its random initial weights. ``workbench analyze`` / ``compare`` say
so on stderr, the store's provenance has ``weights: random-init`` (``checkpoint``, ``run`` otherwise), and a
figure, a table or the gallery built on such a store carries a visible "random-init weights" marker.
"""

from __future__ import annotations

import json

import matplotlib
import pytest
import torch
from safetensors.torch import save_file

from workbench.cli import main
from workbench.provenance import RANDOM_INIT, ModelSource, RandomInitWarning, weights_of
from workbench.store import open_store

matplotlib.use("Agg")
IMAGES = "skimage:astronaut,chelsea"


@pytest.fixture(scope="module")
def demo_weights(tmp_path_factory):
    from workbench.models import create_model

    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("weights") / "vit_demo.safetensors"
    save_file(create_model("vit_demo").state_dict(), str(path))
    return path


def test_analyze_without_weights_says_so_and_records_it(tmp_path, capsys):
    out = tmp_path / "rnd.nc"
    assert main(["analyze", "attention", "--model", "vit_demo", "--images", IMAGES, "--out", str(out), "--device",
                 "cpu"]) == 0
    err = capsys.readouterr().err
    assert "workbench: warning: 'vit_demo' has random-init weights" in err and "--checkpoint" in err
    ds = open_store(out, load=True)
    assert ds.attrs["weights"] == RANDOM_INIT and ds.attrs["checkpoint_sha256"] is None


def test_analyze_with_a_checkpoint_is_quiet(tmp_path, capsys, demo_weights):
    out = tmp_path / "ckpt.nc"
    assert main(["analyze", "attention", "--model", "vit_demo", "--checkpoint", str(demo_weights), "--images", IMAGES,
                 "--out", str(out), "--device", "cpu"]) == 0
    assert "random-init" not in capsys.readouterr().err
    assert open_store(out, load=True).attrs["weights"] == "checkpoint"


def test_compare_names_the_untrained_rows(tmp_path, capsys, demo_weights):
    out = tmp_path / "cmp.nc"
    assert main(["compare", "--teacher", "vit_demo", "--checkpoint", str(demo_weights), "--student", "rnd=vit_demo",
                 "--parts", "predictions", "--images", IMAGES, "--out", str(out), "--device", "cpu"]) == 0
    got = capsys.readouterr()
    assert "'vit_demo' has random-init weights" in got.err
    assert "random-init weights: rnd (" in got.out
    models = json.loads(open_store(out, load=True).attrs["models"])
    assert models["rnd"]["weights"] == RANDOM_INIT and models["teacher"]["weights"] == "checkpoint"


def test_weights_of_stores_written_before_the_attr():
    assert weights_of({"model_name": "vit_demo", "checkpoint_sha256": None, "run": None}) == RANDOM_INIT
    assert weights_of({"model_name": "vit_demo", "checkpoint_sha256": "null", "run": "null"}) == RANDOM_INIT
    assert weights_of({"model_name": "vit_demo", "checkpoint_sha256": "ab12", "run": None}) == "checkpoint"
    assert weights_of({"model_name": "vit_demo", "checkpoint_sha256": "ab12", "run": "teacher-vit-demo"}) == "run"
    assert ModelSource("vit_demo", run="teacher-vit-demo", checkpoint_sha256="ab").weights == "run"


def test_mark_random_init_on_a_figure_and_a_table():
    import matplotlib.pyplot as plt
    import pandas as pd

    from workbench.plots.table import Table
    from workbench.plots.theme import mark_random_init

    fig, _ = plt.subplots()
    assert mark_random_init(fig, []) is fig and not fig.texts
    mark_random_init(fig, ["vit_demo"])
    assert [t.get_text() for t in fig.texts] == ["random-init weights: vit_demo (untrained, no checkpoint)"]
    plt.close(fig)
    table = mark_random_init(Table(pd.DataFrame({"a": [1]}), "Accuracy"), ["vit_demo"])
    md = table.to_markdown()
    assert md.startswith("### [random-init weights] Accuracy") and "untrained networks" in md


@pytest.mark.parametrize("kind", ["figure", "table"])
def test_a_figure_built_on_random_weights_is_marked(tmp_path, monkeypatch, kind):
    """Through the figure registry: the analysis store's provenance reaches the drawn item and the gallery."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from workbench import figures as F
    from workbench.figures.context import Context
    from workbench.figures.render import draw, write_index
    from workbench.plots.table import Table

    def data(ctx):
        return ctx.analysis("attention", "vit_demo", IMAGES)[["attention"]].load()

    def plot(ds):
        if kind == "table":
            return Table(pd.DataFrame({"max": [float(ds["attention"].max())]}), "Attention")
        fig, ax = plt.subplots()
        ax.plot(ds["attention"].mean(("sample", "head", "query", "key")).values)
        ax.set(title="mean attention", xlabel="layer", ylabel="attention")
        return fig

    monkeypatch.setitem(F.DATA, "probe.rnd", F.DataSpec("probe.rnd", data, module=__name__))
    spec = F.FigureSpec(f"probe.{kind}", "probe", "a probe", ("probe.rnd",), plot, kind=kind)
    ctx = Context("smoke", "cpu", force=True, log=lambda _: None)
    with pytest.warns(RandomInitWarning):
        files = draw(spec, ctx, tmp_path)
    assert files
    entry = json.loads((tmp_path / f".probe.{kind}.json").read_text())
    assert entry["random_init"] == ["vit_demo"]
    assert any(u.get("weights") == RANDOM_INIT for u in entry["provenance"])
    assert ctx.data("probe.rnd").attrs["weights"] == RANDOM_INIT
    index = write_index(tmp_path).read_text()
    assert f"### `probe.{kind}` ({kind}, profile smoke) — **random-init weights: vit_demo** (untrained)" in index
    if kind == "table":
        assert (tmp_path / "probe.table.md").read_text().startswith("### [random-init weights] Attention")


def test_two_calls_with_one_random_init_name_give_identical_maps(tmp_path, capsys):
    """A timm name without a checkpoint has seeded weights: the same command twice gives the same maps, whatever
    torch's global generator holds; the seed and the state dict's hash are in the provenance; --seed changes both."""
    stores = []
    for i, extra in enumerate(([], [], ["--seed", "5"])):
        torch.manual_seed(100 + i)  # the global generator differs between the calls
        out = tmp_path / f"rnd{i}.nc"
        assert main(["analyze", "attention", "--model", "vit_demo", "--images", IMAGES, "--out", str(out), "--device",
                     "cpu", *extra]) == 0
        stores.append(open_store(out, load=True))
    a, b, c = stores
    assert (a.attention.values == b.attention.values).all()
    assert a.attrs["init_seed"] == 0 and c.attrs["init_seed"] == 5
    assert a.attrs["weights_sha256"] == b.attrs["weights_sha256"] != c.attrs["weights_sha256"]
    assert abs(a.attention.values - c.attention.values).max() > 1e-4  # another seed: another network
    assert "seed 0" in capsys.readouterr().err


def test_random_init_leaves_the_global_generator_alone_and_hash_tracks_weights():
    from workbench.models import load_model, state_dict_sha256

    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    with pytest.warns(RandomInitWarning, match="seed 0"):
        loaded = load_model("vit_demo")
    assert torch.equal(torch.rand(3), expected)  # loading drew nothing from the global generator
    assert loaded.source.weights_sha256 == state_dict_sha256(loaded.model)
    with torch.no_grad():
        next(loaded.model.parameters()).view(-1)[0] += 1e-6  # one weight changed
    assert state_dict_sha256(loaded.model) != loaded.source.weights_sha256
