"""The comparison's light parts: image specs with a step, model labels, summary views, plots, the figure gallery."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import xarray as xr

from workbench.analysis.teacher_vs_students import compare_models
from workbench.compare import parse_students
from workbench.models import create_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_image_spec_with_a_step_spreads_over_classes():
    from workbench.data import DataError, demo_split_indices, load_images

    batch = load_images("demo:val[50::100]")
    assert batch.labels.tolist() == list(range(10))  # the split is sorted by class: one digit of each
    assert batch.source.indices == demo_split_indices("val")[50::100].tolist()
    assert np.bincount(load_images("demo:val[15::31]").labels).min() == 3  # 32 digits, 3-4 per class
    assert load_images("demo:val[:3]").labels.tolist() == [0, 0, 0]  # the plain slice is unchanged
    assert load_images("demo:val[::-500]").source.indices == demo_split_indices("val")[::-500].tolist()
    with pytest.raises(DataError, match="step 0"):
        load_images("demo:val[::0]")


def test_student_labels_and_checkpoint_flags():
    from workbench.cli import _checkpoints

    assert parse_students(["FAR=far-vit-demo", "far_pruned-vit-demo"]) == {"FAR": "far-vit-demo",
                                                                            "far_pruned-vit-demo": "far_pruned-vit-demo"}
    with pytest.raises(ValueError, match="two students are labelled 'a'"):
        parse_students(["a=x", "a=y"])
    with pytest.raises(ValueError, match="no students"):
        parse_students([])
    assert _checkpoints(["t.safetensors", "small=s.safetensors"], ["teacher", "small"]) == {
        "teacher": "t.safetensors", "small": "s.safetensors"}
    assert _checkpoints(["odd=name.pt"], ["teacher"]) == {"teacher": "odd=name.pt"}  # not a label: the teacher's path
    with pytest.raises(ValueError, match="two checkpoints for 'teacher'"):
        _checkpoints(["a.pt", "b.pt"], ["teacher"])


@pytest.fixture(scope="module")
def comparison():
    """A ViT teacher with a copy of itself, a 3-block ViT and a FAR student, on 4 random images."""
    from methods.far import replace_attention

    teacher = create_model("vit_demo").eval()
    students = {"copy": copy.deepcopy(teacher), "shallow": create_model("vit_demo", depth=3).eval(),
                "far": replace_attention(teacher).eval()}
    x = np.random.default_rng(0).normal(size=(4, 1, 28, 28)).astype(np.float32)
    import torch

    ds = compare_models(teacher, students, torch.from_numpy(x), labels=[0, 1, 2, 3], ig_steps=4, steps=4,
                        infidelity=False)
    return ds.assign(image=(("sample", "img_y", "img_x"), (x[:, 0] - x.min()) / np.ptp(x)))


def test_matched_layers_and_summary(comparison):
    from workbench.plots.compare import matched_cka, matched_layer, summary_frame

    assert [matched_layer(i, 6, 3) for i in range(6)] == [0, 0, 1, 1, 2, 2]  # round(i * 2 / 5)
    assert [matched_layer(i, 6, 6) for i in range(6)] == list(range(6))
    m = matched_cka(comparison)
    cka = comparison["cka"].sel(estimator="debiased", pooling="mean")
    for i in range(6):
        assert m.sel(model="shallow", teacher_layer=i) == cka.sel(model="shallow").isel(
            teacher_layer=i, student_layer=matched_layer(i, 6, 3))
    np.testing.assert_allclose(m.sel(model="copy"), 1.0, atol=1e-9)
    frame = summary_frame(comparison).set_index("model")
    assert frame.loc["copy", "top-1 agreement"] == 1.0 and frame.loc["copy", "CKA (matched depth)"] == 1.0
    assert frame.loc["copy", "map ρ"] == 1.0 and frame.loc["far", "map measure"] == "saliency"
    assert frame.loc["shallow", "CKA (matched depth)"] == round(float(m.sel(model="shallow").mean()), 3)


def test_plots_draw_every_group(comparison):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workbench.plots.compare import plot_attributions, plot_cka, plot_faithfulness, plot_map_agreement

    two = {"ViT teacher": comparison, "again": comparison.sel(model=["teacher", "far"])}
    fig = plot_cka(two)
    titles = [ax.get_title() for ax in fig.axes if ax.get_images()]
    assert len(titles) == 4 + 2 and titles[0].startswith("teacher (itself)") and "matched mean 1.00" in titles[1]
    fig2 = plot_map_agreement(comparison)
    legends = [ax.get_legend() for ax in fig2.axes if ax.get_legend() is not None]
    assert len(legends) == 1 and legends[0].axes is fig2.axes[-1]  # one per column, under its lowest panel
    labels = [t.get_text() for t in legends[0].get_texts()]
    assert "far (saliency)" in labels and "copy (attention)" in labels and any("its saliency" in x for x in labels)
    fig3 = plot_attributions(two, n_images=3)
    assert sum(1 for ax in fig3.axes if ax.get_images()) == 3 * (1 + 4) + 3 * (1 + 2)  # images + maps
    fig4 = plot_faithfulness(comparison)
    assert any("random map" in t.get_text() for t in fig4.axes[0].get_legend().get_texts())
    plt.close("all")


def test_gallery_shows_each_figure_as_a_thumbnail_with_its_caption_under_its_paper(tmp_path, monkeypatch):
    import pandas as pd

    from workbench.figures import DATA, FigureSpec, dataset, paper_titles
    from workbench.figures.context import Context
    from workbench.figures.render import render
    from workbench.plots.table import Table

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("workbench.figures.DATA", dict(DATA))  # the test's data leave the registry as it was
    dataset("gallery.points")(lambda ctx: xr.Dataset({"y": ("i", np.arange(3.0))}))

    def line(ds):
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        ax.plot(ds["y"].values)
        return fig

    def table(ds):
        return Table(pd.DataFrame({"col": ds["y"].values}), "A table", ["a note"])

    specs = [FigureSpec(i, paper, f"Caption of {i}.", ("gallery.points",), plot, kind)
             for i, paper, plot, kind in (("compare.fig2", "compare", line, "figure"), ("far.fig10", "far", line, "figure"),
                                          ("far.fig4", "far", line, "figure"), ("far.table1", "far", table, "table"))]
    out = tmp_path / "figs"
    render(specs, Context("smoke", "cpu", log=lambda s: None), out)
    index = (out / "index.md").read_text()
    titles = paper_titles()
    sections = {p: index.index(f"\n## {titles[p]}\n") for p in ("far", "compare")}
    assert sections["far"] < sections["compare"]  # papers in their fixed order
    for spec in specs:
        head = index.index(f"### `{spec.id}`")
        paper_start = sections[spec.paper]
        later = [s for s in sections.values() if s > paper_start]
        assert paper_start < head < min(later, default=len(index)), spec.id  # under its paper's heading
        end = index.find("### `", head + 1) % (len(index) + 1)
        block = index[head:end if end > head else len(index)]
        if spec.kind == "figure":  # a thumbnail linking the full-size PNG, then the caption
            assert f'<a href="{spec.id}.png"><img src="{spec.id}.png" width="420"' in block
            assert block.index("<img") < block.index(spec.caption)
        else:  # tables inline, with their notes
            assert "**A table**" in block and "a note" in block
            assert block.index("**A table**") < block.index("col") < block.index(spec.caption)
        assert "<details><summary>provenance</summary>" in block and "gallery.points" in block
        assert f'<a id="{spec.id.replace(".", "-")}"></a>' in index
    assert index.index("### `far.fig4`") < index.index("### `far.fig10`") < index.index("### `far.table1`")
    contents = index[index.index("## Contents"):sections["far"]]
    assert "[fig4](#far-fig4) · [fig10](#far-fig10) · [table1](#far-table1)" in contents
    assert f"[{titles['compare']}](#compare): [fig2](#compare-fig2)" in contents
    assert json.loads((out / ".far.fig4.json").read_text())["caption"] == "Caption of far.fig4."
