"""Tiny random-weight models the extractors apply to: the ``example`` of each registration.

``tests/test_extractors.py`` runs every registered extractor on its example through the guarantees they share; a
new extractor names one of these (or its own) in ``register(..., example=Example(...))``. Every factory builds a
fresh eval-mode model with whatever torch's random state is (the tests seed it).
"""

from __future__ import annotations

__all__ = ["vit", "swin", "far", "sparsifiner", "branched", "collapsed", "slimswin", "sa_resnet"]


def _timm(name: str, **kwargs):
    import timm

    import methods.teachers  # noqa: F401  (registers the demo teachers with timm)

    return timm.create_model(name, **kwargs)


def vit():
    """The 3-block demo ViT."""
    return _timm("vit_demo", depth=3).eval()


def swin():
    """The demo Swin."""
    return _timm("swin_demo").eval()


def far():
    """A FAR model of the 3-block demo ViT with some hidden units physically pruned."""
    import torch

    from methods.far import replace_attention, shrink

    model = replace_attention(_timm("vit_demo", depth=3))
    keep = torch.rand(3, 4, 2, 16, generator=torch.Generator().manual_seed(0)) > 0.3
    return shrink(model, keep).eval()


def sparsifiner():
    """A Sparsifiner student of the 3-block demo ViT (keep rate 0.25, n_down 8)."""
    from methods.sparsifiner import SparsifinerConfig, replace_attention

    return replace_attention(_timm("vit_demo", depth=3), SparsifinerConfig(keep_rate=0.25, n_down=8)).eval()


def branched():
    """A joined (λ = 1) Non-deep model: the 6-block demo ViT as 3 parallel blocks of 2 branches."""
    import methods.nondeep as nd

    model = nd.branch(_timm("vit_demo"), 2)
    nd.set_lambda(model, 1.0)
    return model.eval()


def collapsed():
    """The exact collapse (form "concat": a plain timm ViT) of :func:`branched`, computed in float64."""
    from methods.nondeep import collapse

    return collapse(branched().double(), form="concat").float().eval()


def slimswin(pruned: bool = False):
    """The gated demo Swin with about a third of its window-head pairs pruned (seeded; one pair always kept per
    layer); ``pruned``: its physically pruned form (the pruned pairs never computed)."""
    import torch

    from methods.slimswin import add_gates, get_masks, set_mask, to_pruned

    model = add_gates(swin()).eval()
    g = torch.Generator().manual_seed(5)
    masks = []
    for m in get_masks(model):  # (windows, heads) bool per layer
        keep = torch.rand(m.shape, generator=g) > 0.35
        keep.view(-1)[0] = True
        masks.append(keep)
    set_mask(model, masks)
    return to_pruned(model).eval() if pruned else model


def sa_resnet():
    """The tiny SA-ResNet of methods.attentionlite's tests (stage maps 12/6/3/2, attention grids 12/12/6/3)."""
    from methods.attentionlite import SA_VARIANTS

    return SA_VARIANTS["test"].build().eval()
