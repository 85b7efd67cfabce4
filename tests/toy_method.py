"""A toy method written against the method contract alone (docs/adding-a-method.md): an identity
"compression" of the demo ViT whose deploy form scales the teacher's logits by a gain. It registers a model
form with timm, a hook point, a registry entry (budgets, run function, a CLI option, its paper's title), an
extractor reading the hook point with an option of its own (a `workbench analyze` flag), an extractor the explorer
shows (its kind, label and hook point declared in the registration), a figure (data + plot) and a student of the
teacher-vs-compressed comparison; tests/test_contract.py drives it end to end."""

from __future__ import annotations

import torch.nn as nn
import xarray as xr
from timm.models import register_model

from methods.hooks import HookPoint, run_with_cache
from workbench.analysis import ExploreKind, ExtractorOption, get_extractor, register
from workbench.figures import dataset, figure, student
from workbench.pipelines import Method, Option, register_method
from workbench.pipelines.common import accuracy, load_teacher, method_data, run_tag, student_run
from workbench.runtime import atomic_save_safetensors


class Scaled(nn.Module):
    """The teacher with its logits times ``gain``, named ``hook_logits``."""

    def __init__(self, base: nn.Module, gain: float):
        super().__init__()
        self.base, self.gain, self.hook_logits = base, gain, HookPoint()
        self.pretrained_cfg = base.pretrained_cfg

    def forward(self, x):
        return self.hook_logits(self.base(x) * self.gain)


@register_model
def toy_scaled(pretrained: bool = False, *, base: str = "vit_demo", base_kwargs: dict | None = None, gain: float = 1.0,
               **kwargs) -> Scaled:
    import timm

    return Scaled(timm.create_model(base, **(base_kwargs or {})), gain)


def run(req, gain: float = 1.0):
    kwargs = {"base": req.teacher.model_name, "base_kwargs": req.teacher.model_kwargs, "gain": gain}

    def body(run):
        student = toy_scaled(**kwargs)
        student.base.load_state_dict(load_teacher(req.teacher).state_dict())
        atomic_save_safetensors(student.state_dict(), run.checkpoint)
        return {"val_acc": accuracy(student, method_data(req, student)[1], req.device)}

    return student_run(req, f"toy-g{gain:g}-{run_tag(req)}", {"model_name": "toy_scaled", "model_kwargs": kwargs}, body)


register_method(Method("toy", "Identity compression (tests the method contract).", {p: {} for p in ("demo", "smoke", "paper")},
                       run, teacher="vit", options=(Option("gain", "factor on the logits", type=float, default=1.0),),
                       paper_title="Toy — identity compression", paper_ref="papers/999"))


@register("toy_logits", options=(ExtractorOption("offset", "added to the logits read", type=float),))
def extract_logits(model, images, *, layers=None, targets=None, offset: float = 0.0) -> xr.Dataset:
    _, cache = run_with_cache(model, images, names="hook_logits")
    return xr.Dataset({"logits": (("sample", "class"), cache["hook_logits"].cpu().numpy() + offset)}).assign_attrs(
        analysis="toy_logits", config=f'{{"offset": {offset}}}')


@register("toy_attention", explore=ExploreKind("toy_attention", "toy attention", ("hook_logits",), 0))
def extract_toy_attention(model, images, *, layers=None, targets=None) -> xr.Dataset:
    """The base ViT's attention as the toy's own map: an explorer kind of the toy's (models with ``hook_logits``)."""
    ds = get_extractor("attention")(model.base, images, layers=layers)
    return ds.rename(attention="toy_attention").assign_attrs(analysis="toy_attention")


@dataset("toy.logits", after=("teacher.vit",))
def logits_data(ctx) -> xr.Dataset:
    return ctx.analysis("toy_logits", ctx.run("toy", gain=2.0).id, ctx.profile.analysis_images).load()


@student("toy g2", method="toy", teacher="vit", after=("toy.logits",))
def toy_student(ctx):
    return ctx.run("toy", gain=2.0)


def plot_logits(ds: xr.Dataset):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 2.5))
    im = ax.imshow(ds["logits"].values, cmap="viridis", aspect="auto")
    ax.set(xlabel="class", ylabel="sample", title="Logits of the toy student (gain 2)")
    fig.colorbar(im, ax=ax, label="logit")
    return fig


figure("toy.fig1", paper="toy", caption="Logits of the toy student on the analysis images.", data="toy.logits",
       plot=plot_logits)
