"""``workbench explain``: a model and an image spec in, a stamped store of explanations (and their faithfulness) out.

The same path from Python (:func:`explain`) and the command line (:func:`add_explain_flags`, :func:`cmd_explain`,
hooked into :mod:`workbench.cli`). The store holds :func:`workbench.explain.attribute`'s variables, the images as
the model saw them (``image(sample, img_y, img_x[, rgb])`` in [0, 1]), ``label(sample)`` (-1 when unknown), with
``--perturbation`` Chefer's curves and AUCs (``perturbation_score``, ``perturbation_auc``), and the provenance attrs.
"""

from __future__ import annotations

import argparse
from typing import Literal, Sequence

import xarray as xr

__all__ = ["explain", "add_explain_flags", "cmd_explain"]


def explain(model: str, images: str, *, method: str | Sequence[str], target: int | None = None,
            checkpoint: str | None = None, device: str = "auto", img_size: int | None = None, seed: int | None = None,
            perturb: bool = False, score: Literal["probability", "accuracy"] = "probability", **options) -> xr.Dataset:
    """Load ``model`` (run id/dir or timm name [+ checkpoint]) and the ``images`` spec; explain; stamp.

    ``target`` None explains each image's predicted class. ``perturb`` adds the positive / negative perturbation
    test of every map (:func:`workbench.explain.faithfulness.perturbation`; ``"accuracy"`` against the labels).
    """
    import torch

    from workbench.data import load_images
    from workbench.explain.core import attribute
    from workbench.explain.faithfulness import perturbation
    from workbench.models import load_model
    from workbench.provenance import stamp
    from workbench.runtime import resolve_device

    dev = resolve_device(device)
    loaded = load_model(model, checkpoint=checkpoint, device=dev, **({"seed": seed} if seed is not None else {}),
                        **({"img_size": img_size} if img_size else {}))
    batch = load_images(images, input_size=loaded.input_size, mean=loaded.mean, std=loaded.std)
    x = batch.tensor.to(dev)
    ds = attribute(loaded.model, x, method=method, target=target, **options)
    if perturb:
        labels = None
        if score == "accuracy":
            if (batch.labels < 0).any():
                raise ValueError("--score accuracy needs labelled images (e.g. demo:val); use --score probability")
            labels = torch.as_tensor(batch.labels, device=dev)
        p = perturbation(loaded.model, x, ds, score=score, labels=labels)
        ds = ds.assign(perturbation_score=p["score"], perturbation_auc=p["auc"])
    dims = ("sample", "img_y", "img_x") if batch.display.ndim == 3 else ("sample", "img_y", "img_x", "rgb")
    ds = ds.assign(image=(dims, batch.display), label=("sample", batch.labels))
    return stamp(ds, loaded.source, batch.source)


def add_explain_flags(p: argparse.ArgumentParser) -> None:
    """The flags of ``workbench explain``."""
    p.add_argument("--method", required=True,
                   help="comma-separated explainers: raw_attention, rollout, generic_attention, gradcam, legrad, ig, "
                        "saliency, attnlrp (those that do not apply to the model are listed in the store, with why)")
    p.add_argument("--model", required=True, help="run id/dir or timm name")
    p.add_argument("--checkpoint", default=None, help="local weights for a timm name (.safetensors, .pt, .pth)")
    p.add_argument("--seed", type=int, default=None, help="seed of a timm name's random weights (no --checkpoint)")
    p.add_argument("--images", default="demo:val[:8]", help="image spec, e.g. demo:val[:16] (see workbench analyze)")
    p.add_argument("--target", type=int, default=None, help="class to explain (default: each image's prediction)")
    p.add_argument("--ig-steps", type=int, default=None, help="ig only: Gauss-Legendre nodes (default 50)")
    p.add_argument("--perturbation", action="store_true", help="add Chefer's positive / negative perturbation test")
    p.add_argument("--score", default="probability", choices=["probability", "accuracy"],
                   help="perturbation score: the explained class's probability, or accuracy against the labels")
    p.add_argument("--img-size", type=int, default=None, help="input resolution for timm models")
    p.add_argument("--out", required=True, help="store path (.nc)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to compute (default: auto)")


def cmd_explain(args: argparse.Namespace) -> int:
    """Run ``workbench explain``; print the store's path and the methods that did not apply."""
    import json

    from workbench.store import save

    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    options = {"n_steps": args.ig_steps} if args.ig_steps else {}
    ds = explain(args.model, args.images, method=methods if len(methods) > 1 else methods[0], target=args.target,
                 checkpoint=args.checkpoint, device=args.device, img_size=args.img_size, seed=args.seed,
                 perturb=args.perturbation, score=args.score, **options)
    path = save(ds, args.out)
    for name, why in json.loads(ds.attrs["not_applicable"]).items():
        print(f"not applicable: {name}: {why}")
    print(f"wrote {path}")
    return 0
