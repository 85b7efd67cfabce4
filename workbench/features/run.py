"""``workbench features``: a teacher and a student in, a crosscoder over one block pair and its diff store out.

The same path from Python (:func:`features`) and the command line (:func:`add_features_flags`,
:func:`cmd_features`, hooked into :mod:`workbench.cli`). Both models run on the training images (``demo:train``,
all 4000, by default) up to the paired hook points; all their tokens train a BatchTopK crosscoder
(:mod:`~workbench.features.train`), checkpointed beside the store (``OUT.crosscoder.safetensors``) so an interrupted
command resumes where it stopped; the diff (:mod:`~workbench.features.diff`) is measured on the held-out images
(``demo:val``) and written, stamped, to ``OUT``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Sequence

import xarray as xr

__all__ = ["features", "add_features_flags", "cmd_features", "parse_groups"]


def parse_groups(spec: str | None) -> tuple[tuple[int, ...], ...] | None:
    """``"0,1;2,3;4,5"`` -> ``((0, 1), (2, 3), (4, 5))``: the teacher blocks each student block replaces."""
    if not spec:
        return None
    try:
        return tuple(tuple(int(j) for j in g.split(",")) for g in spec.split(";"))
    except ValueError:
        raise ValueError(f"bad --groups {spec!r}: write the teacher blocks each student block replaces, e.g. "
                         "'0,1;2,3;4,5'") from None


def _pick_block(pairs: dict[str, str], block: int | None) -> tuple[str, str]:
    names = list(pairs)
    if not names:
        raise ValueError("no student block corresponds to a teacher block by name; give the student's block "
                         "correspondence with --groups (e.g. '0,1;2,3;4,5')")
    if block is None:
        return names[len(names) // 2], pairs[names[len(names) // 2]]
    hit = [n for n in names if n.split(".")[-2] == str(block)]
    if not hit:
        blocks = [int(n.split(".")[-2]) for n in names]
        raise ValueError(f"teacher block {block} has no student counterpart; pick one of {blocks} (--block)")
    return hit[0], pairs[hit[0]]


def features(teacher: str, student: str, *, out: str | Path, block: int | None = None,
             groups: Sequence[Sequence[int]] | None = None, images: str = "demo:train", held_out: str = "demo:val",
             activations: tuple[str | Path, str | Path] | None = None, device: str = "auto", **config) -> Path:
    """Train (or resume) the crosscoder of ``teacher`` and ``student`` at one block pair; write its diff to ``out``.

    Args:
        teacher, student: run id / run directory, or timm name.
        out: the store (``.nc``); the crosscoder's checkpoint goes beside it.
        block: the teacher block (its index); default the middle one of the paired blocks.
        groups: the student's block correspondence (``groups[i]``: the teacher blocks its block ``i`` replaces);
            None pairs blocks by name.
        images, held_out: image specs of the training and the held-out images.
        activations: the teacher's and the student's ``activations`` zarr stores (``workbench analyze activations``)
            to train on instead of ``images`` (:mod:`workbench.features.stored`: bounded memory, computed once).
        **config: fields of :class:`~workbench.features.CrosscoderConfig` (``width``, ``k``, ``epochs``, ...).

    Raises:
        ValueError: an unknown model, models of different inputs, a block without a counterpart, bad options.
    """
    from workbench.data import load_images
    from workbench.features.crosscoder import CrosscoderConfig, config_dict
    from workbench.features.diff import crosscoder_diff
    from workbench.features.pairs import image_batches, paired_hooks, paired_tokens
    from workbench.features.train import train_crosscoder
    from workbench.models import load_model
    from workbench.provenance import stamp
    from workbench.runtime import resolve_device
    from workbench.store import save

    out = Path(out)
    if out.suffix != ".nc":
        raise ValueError(f"--out {out}: the diff store is a .nc file")
    cfg = CrosscoderConfig(**config)
    dev = resolve_device(device)
    loaded = {}
    for label, ref in (("teacher", teacher), ("student", student)):
        try:
            loaded[label] = load_model(ref, device=dev)
        except ValueError as err:
            raise ValueError(f"{label}: {err}") from None
    t, s = loaded["teacher"], loaded["student"]
    if (t.input_size, t.mean, t.std) != (s.input_size, s.mean, s.std):
        raise ValueError(f"the teacher takes {t.input_size} images (mean {t.mean}, std {t.std}), the student "
                         f"{s.input_size} (mean {s.mean}, std {s.std}); pair a student with its own teacher")
    t_hook, s_hook = _pick_block(paired_hooks(t.model, s.model, groups), block)
    hooks = {"teacher": t_hook, "student": s_hook}
    models = {"teacher": t.model, "student": s.model}
    held = load_images(held_out, input_size=t.input_size, mean=t.mean, std=t.std)
    ckpt = out.with_suffix(".crosscoder.safetensors")
    if activations is None:
        train = load_images(images, input_size=t.input_size, mean=t.mean, std=t.std)
        cc = train_crosscoder(models, hooks, train.tensor, cfg, checkpoint=ckpt, device=dev, progress=True)
    else:
        cc, images = _train_from_stores(dict(zip(("teacher", "student"), activations)), hooks,
                                        {"teacher": t.source, "student": s.source}, cfg, ckpt, dev)
    batches = (paired_tokens(models, hooks, x, dev) for _, x in
               image_batches(held.tensor, cfg.batch_images, seed=0, shuffle=False))
    ds = crosscoder_diff(cc, batches)
    ds = stamp(ds, t.source, held.source).assign_attrs(
        student=json.dumps({k: v for k, v in asdict(s.source).items()}), hooks=json.dumps(hooks),
        train_images=images, held_out_images=held_out, config=json.dumps(config_dict(cfg), sort_keys=True))
    return save(ds, out)


def _train_from_stores(stores: dict, hooks: dict, sources: dict, cfg, ckpt: Path, dev):
    """The crosscoder trained on two activation stores, and a description of their images (for the diff's attrs)."""
    from workbench.features.stored import open_activations, stored_batches
    from workbench.features.train import fit_crosscoder
    from workbench.scale.chunked import read_layout

    arrays = open_activations(stores, hooks, sources)
    layout, attrs = read_layout(stores["teacher"])
    batches, steps = stored_batches(arrays, layout.chunk, cfg.batch_images, seed=cfg.seed)
    meta = {"hooks": json.dumps(hooks), "activations": json.dumps({k: str(v) for k, v in stores.items()})}
    cc = fit_crosscoder(batches, steps, cfg, checkpoint=ckpt, device=dev, metadata=meta, progress=True)
    return cc, f"activations stored in {stores['teacher']} and {stores['student']} ({json.loads(attrs['data'])['dataset']})"


def add_features_flags(p: argparse.ArgumentParser) -> None:
    """The ``workbench features`` flags."""
    from workbench.features.crosscoder import CrosscoderConfig

    p.add_argument("--teacher", required=True, help="teacher run id/dir or timm name")
    p.add_argument("--student", required=True, help="student run id/dir or timm name")
    p.add_argument("--block", type=int, default=None, help="teacher block index (default: the middle paired block)")
    p.add_argument("--groups", default=None, help="the student's block correspondence, e.g. '0,1;2,3;4,5' (teacher "
                                                  "blocks each student block replaces; default: pair by name)")
    p.add_argument("--images", default="demo:train", help="training images (default: all 4000 demo:train)")
    p.add_argument("--held-out", default="demo:val", help="held-out images of the diff (default: demo:val)")
    p.add_argument("--teacher-activations", default=None,
                   help="train on the teacher's activations stored by `workbench analyze activations --layers L --out "
                        "T.zarr` instead of --images (with --student-activations; bounded memory, computed once)")
    p.add_argument("--student-activations", default=None, help="the student's activations store (see above)")
    default = CrosscoderConfig()
    for f in fields(CrosscoderConfig):
        if f.name in ("width", "k", "epochs", "batch_images", "lr", "seed", "shared"):
            what = "designated shared latents: decoder tied across the models, no norm penalty" \
                if f.name == "shared" else f"crosscoder {f.name}"
            p.add_argument("--" + f.name.replace("_", "-"), type=type(getattr(default, f.name)), default=None,
                           help=f"{what} (default {getattr(default, f.name)})")
    p.add_argument("--out", required=True, help="diff store (.nc); the crosscoder checkpoint goes beside it")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to compute (default: auto)")


def cmd_features(args) -> int:
    opts = {k: getattr(args, k) for k in ("width", "k", "epochs", "batch_images", "lr", "seed", "shared")
            if getattr(args, k) is not None}
    stores = (args.teacher_activations, args.student_activations)
    if (stores[0] is None) != (stores[1] is None):
        raise ValueError("give both --teacher-activations and --student-activations (the two models' stores at the "
                         "paired blocks over the same images), or neither")
    path = features(args.teacher, args.student, out=args.out, block=args.block, groups=parse_groups(args.groups),
                    images=args.images, held_out=args.held_out, activations=None if stores[0] is None else stores,
                    device=args.device, **opts)
    ds = xr.open_dataset(path)
    fve = ", ".join(f"{m} {float(v):.3f}" for m, v in zip(ds.model.values, ds.fve.values))
    designated = f", designated shared {int(ds.n_designated)}" if "n_designated" in ds else ""
    print(f"{ds.attrs['hooks']}: FVE {fve}; L0 {float(ds.l0):.1f}; dead {int(ds.n_dead)} of {ds.sizes['latent']}; "
          f"shared {int(ds.n_shared)}, teacher-only {int(ds.n_teacher_only)}, student-only {int(ds.n_student_only)}, "
          f"partial {int(ds.n_partial)}{designated}; Latent Scaling: {int(ds.n_confirmed)} confirmed, "
          f"{int(ds.n_in_other)} present in the other model")
    ds.close()
    print(f"wrote {path}")
    return 0
