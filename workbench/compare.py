"""Compare a teacher with its compressed students, by reference: the function behind ``workbench compare``.

Models are given as :func:`workbench.analyze.analyze` takes them — a run id / run directory, or a
timm name with optional local weights — and images as an image spec (:func:`workbench.data.load_images`).
:func:`compare` loads them, checks that every model takes the same input (size and normalisation:
the comparison feeds one batch to all of them and compares maps pixel by pixel), runs
:func:`workbench.analysis.teacher_vs_students.compare_models` and returns its Dataset stamped with
provenance: DESIGN.md's attrs (the teacher's), ``models`` (JSON: every model's source), ``images``
(the spec), plus ``image(sample, img_y, img_x[, rgb])`` — what the models saw, in [0, 1] — and
``label(sample)`` (-1 where unknown). ``sample`` holds the images' dataset indices.

A student that shares no comparable part with the teacher (an attention-free CNN beside a ViT, a
model with another number of classes) is not an error: the parts that do not apply are left out
and the reasons are in the attrs ``skipped`` and ``notes``. Models with different input sizes are
an error (:class:`ValueError` naming each model's input), since nothing lines up pixel by pixel.

``explainers=[...]`` (``--explainers``) adds each student's agreement with the teacher's explanations
(:func:`workbench.explain.compress.explain_agreement`: ``explain_spearman`` / ``explain_topk(model, explainer,
sample)``, their means with 95 % intervals, ``explain_reasons(model, explainer)``: keeps / loses / inconclusive),
the explained class being the one ``target`` names; explainers that do not apply are in the ``notes``. With
``explain_perturbation=True`` (``--explain-perturbation``) also every model's positive / negative perturbation AUC of
its own maps (``explain_auc``) and each student's paired difference to the teacher (``explain_auc_diff_*``).

::

    from workbench.compare import compare
    ds = compare("teacher-vit-demo", {"FAR": "far-vit-demo", "FAR†": "far_pruned-vit-demo"}, "demo:val[15::31]")
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import xarray as xr

__all__ = ["Models", "parse_students", "load_models", "compare_loaded", "compare", "run_compare"]


@dataclass
class Models:
    """A teacher and its students, loaded, with the input they share."""

    teacher_name: str  # the teacher's label (the ``model`` coordinate)
    loaded: dict  # label -> workbench.models.LoadedModel, the teacher first
    input_size: tuple[int, int, int]  # (C, H, W) every model takes
    mean: tuple[float, ...]  # the shared normalisation
    std: tuple[float, ...]


def parse_students(specs: Sequence[str] | Mapping[str, str]) -> dict[str, str]:
    """``["FAR=far-vit-demo", "far_pruned-vit-demo"]`` -> ``{"FAR": "far-vit-demo", "far_pruned-vit-demo": ...}``.

    A student without a label is labelled by its reference (the run id, or the timm name).

    Raises:
        ValueError: no students, an empty label or reference, or two students with one label.
    """
    if isinstance(specs, Mapping):
        pairs = list(specs.items())
    else:
        pairs = []
        for s in specs:
            label, sep, ref = s.partition("=")
            pairs.append((label.strip(), ref.strip()) if sep else (s.strip(), s.strip()))
    if not pairs:
        raise ValueError("no students to compare: pass --student [LABEL=]RUN_OR_TIMM_NAME (one or more)")
    out: dict[str, str] = {}
    for label, ref in pairs:
        if not label or not ref:
            raise ValueError(f"bad student {label!r}={ref!r}: use LABEL=REF or REF (a run id or a timm name)")
        if label in out:
            raise ValueError(f"two students are labelled {label!r}; give each its own label (--student LABEL=REF)")
        out[label] = ref
    return out


def load_models(teacher: str, students: Sequence[str] | Mapping[str, str], *,
                checkpoints: Mapping[str, str] | None = None, teacher_name: str = "teacher", device: str = "auto",
                img_size: int | None = None) -> Models:
    """Load the teacher and the students (eval mode) and check that they take the same input.

    Args:
        teacher: run id / run directory, or timm name.
        students: ``{label: ref}`` or ``["label=ref" | "ref", ...]`` (:func:`parse_students`).
        checkpoints: label -> local weights of a timm-name model (``teacher_name`` for the teacher).
        teacher_name: the teacher's label.
        device: ``auto``, ``cpu`` or ``cuda``.
        img_size: input resolution of timm-name models (e.g. 384); runs keep their own.

    Raises:
        ValueError: an unknown model, a checkpoint for an unknown label or for a run, a student labelled like
            the teacher, models that take different input sizes or normalisations.
    """
    from workbench.models import load_model
    from workbench.runtime import resolve_device

    studs = parse_students(students)
    if teacher_name in studs:
        raise ValueError(f"a student is labelled {teacher_name!r}, the teacher's label; label it otherwise "
                         "(--student LABEL=REF)")
    refs = {teacher_name: teacher, **studs}
    checkpoints = dict(checkpoints or {})
    unknown = sorted(set(checkpoints) - set(refs))
    if unknown:
        raise ValueError(f"checkpoints for {unknown}, which is no model here; label them with one of {list(refs)}")
    dev = resolve_device(device)
    loaded = {}
    for label, ref in refs.items():
        kw = {"img_size": img_size} if img_size and not _is_run(ref) else {}
        try:
            loaded[label] = load_model(ref, checkpoint=checkpoints.get(label), device=dev, **kw)
        except ValueError as err:
            raise type(err)(f"{'teacher' if label == teacher_name else f'student {label!r}'}: {err}") from None
    inputs = {label: (m.input_size, tuple(m.mean), tuple(m.std)) for label, m in loaded.items()}
    first = inputs[teacher_name]
    if any(v[0] != first[0] for v in inputs.values()):
        listed = ", ".join(f"{k} {tuple(v[0])}" for k, v in inputs.items())
        raise ValueError(f"the models take different input sizes ({listed}; (C, H, W)): a comparison feeds one batch to "
                         "all of them and compares maps pixel by pixel. Compare models of one input size (for timm "
                         "names, --img-size sets it)")
    if any(v[1:] != first[1:] for v in inputs.values()):
        listed = ", ".join(f"{k} mean {v[1]} std {v[2]}" for k, v in inputs.items())
        raise ValueError(f"the models normalise their input differently ({listed}); compare models trained with the "
                         "same normalisation")
    return Models(teacher_name, loaded, tuple(first[0]), first[1], first[2])


def _is_run(ref: str) -> bool:
    from workbench.runs import find_run

    return find_run(ref) is not None


def compare_loaded(models: Models, images: str, *, explainers: Sequence[str] = (), explain_perturbation: bool = False,
                   **options) -> xr.Dataset:
    """:func:`~workbench.analysis.teacher_vs_students.compare_models` of loaded models on an image spec, stamped (module docstring).

    Args:
        models: from :func:`load_models`.
        images: image spec, e.g. ``demo:val[15::31]`` (32 digits of all classes), ``skimage:astronaut,chelsea``.
        explainers: explainers of :mod:`workbench.explain` whose teacher–student agreement is added
            (:func:`_explanations`); none by default.
        explain_perturbation: with ``explainers``, also each model's perturbation AUC of its own maps and each
            student's paired difference to the teacher.
        **options: ``parts`` and the fields of :class:`~workbench.analysis.teacher_vs_students.CompareConfig`.
    """
    import torch

    from workbench.analysis.teacher_vs_students import compare_models, stamp_comparison
    from workbench.data import load_images

    if explainers:
        from workbench.explain import get_explainer

        for e in explainers:
            get_explainer(e)  # an unknown name: ValueError listing the known ones, before any work
    batch = load_images(images, input_size=models.input_size, mean=models.mean, std=models.std)
    teacher = models.loaded[models.teacher_name]
    x = batch.tensor.to(next(iter(teacher.model.parameters()), torch.empty(0)).device)
    students = {k: m.model for k, m in models.loaded.items() if k != models.teacher_name}
    ds = compare_models(teacher.model, students, x, batch.labels, teacher_name=models.teacher_name, **options)
    dims = ("sample", "img_y", "img_x") if batch.display.ndim == 3 else ("sample", "img_y", "img_x", "rgb")
    if explainers:
        ds = _explanations(ds, models, x, batch.labels, list(explainers), options.get("target", "teacher"),
                           explain_perturbation)
    ds = ds.assign(image=(dims, batch.display)).assign_coords(label=("sample", batch.labels))
    ds["image"].attrs.update(units="intensity in [0, 1]", long_name="the image the models saw")
    out = stamp_comparison(ds, teacher.source, {k: m.source for k, m in models.loaded.items()
                                                if k != models.teacher_name}, batch.source)
    return out.assign_attrs(images=images, input_size=json.dumps(list(models.input_size)))


def _explanations(ds: xr.Dataset, models: Models, x, labels, explainers: list[str], target: str, perturb: bool
                  ) -> xr.Dataset:
    """``ds`` with each student's explanation agreement with the teacher
    (:func:`workbench.explain.compress.explain_agreement`: per explainer, Spearman ρ and top-10 % overlap per image,
    their means with 95 % intervals, keeps / loses / inconclusive), explaining the class compare's ``target`` names
    (the teacher's top-1, the label, or each model's own); explainers that do not apply go to the ``notes``."""
    import time

    import numpy as np
    import torch

    from workbench.explain.compress import explain_agreement

    nets = {k: m.model for k, m in models.loaded.items()}
    if target == "label" and (np.asarray(labels) < 0).any():
        raise ValueError("target 'label' needs every image's label; these images have none (use --target teacher)")
    with torch.no_grad():
        fixed = {"teacher": nets[models.teacher_name](x).argmax(-1),
                 "label": torch.as_tensor(np.asarray(labels), device=x.device).long()}.get(target)
    start = time.perf_counter()
    got = explain_agreement(nets, x, explainers, teacher=models.teacher_name, targets={k: fixed for k in nets},
                            perturb=perturb)
    seconds = {**json.loads(ds.attrs.get("seconds", "{}")), "explanations": round(time.perf_counter() - start, 4)}
    notes = json.loads(ds.attrs.get("notes", "{}"))
    for label, why in json.loads(got.attrs["explain_not_applicable"]).items():
        for e, reason in why.items():
            notes.setdefault(f"explain {e}", {})[label] = reason
    out = xr.merge([ds, got.drop_vars("sample")], compat="no_conflicts", combine_attrs="override")
    return out.assign_attrs(notes=json.dumps(notes, sort_keys=True), seconds=json.dumps(seconds),
                            explainers=json.dumps(explainers), explain_not_applicable=got.attrs["explain_not_applicable"])


def compare(teacher: str, students: Sequence[str] | Mapping[str, str], images: str, *,
            checkpoints: Mapping[str, str] | None = None, teacher_name: str = "teacher", device: str = "auto",
            img_size: int | None = None, **options) -> xr.Dataset:
    """Compare ``teacher`` with ``students`` on ``images`` (module docstring): :func:`load_models` + :func:`compare_loaded`.

    Args:
        teacher: run id / run directory, or timm name (weights from ``checkpoints[teacher_name]``).
        students: ``{label: ref}`` or ``["label=ref" | "ref", ...]``; an unlabelled student is labelled by its ref.
        images: image spec.
        checkpoints, teacher_name, device, img_size: see :func:`load_models`.
        **options: ``parts`` (:data:`~workbench.analysis.teacher_vs_students.PARTS`) and
            :class:`~workbench.analysis.teacher_vs_students.CompareConfig` fields (``ig_steps``, ``steps``, ``target``, ...).

    Returns:
        The comparison Dataset (dims ``model``, ``sample``, ``layer``, ``head``, ``y``, ``x``, ``step``,
        ``teacher_layer``, ``student_layer``, ``pooling``, ``estimator``, ``attribution``) with provenance.

    Example:
        The demo ViT against a "student" with the same seeded random weights (timm names without checkpoints), on two
        photos, CKA and token maps only: the twin's maps are the teacher's.

        >>> from workbench.compare import compare
        >>> ds = compare("vit_demo", {"twin": "vit_demo"}, "skimage:astronaut,coffee", device="cpu",
        ...              parts=("cka", "maps"))
        >>> ds["model"].values.tolist(), ds.sizes["sample"], ds.sizes["layer"]
        (['teacher', 'twin'], 2, 6)
        >>> bool(ds["map_js_avg"].sel(model="twin").max() < 1e-6)  # Jensen-Shannon divergence to the teacher's maps
        True
    """
    return compare_loaded(load_models(teacher, students, checkpoints=checkpoints, teacher_name=teacher_name,
                                      device=device, img_size=img_size), images, **options)


def run_compare(teacher: str, students: Sequence[str] | Mapping[str, str], images: str, out: str | Path,
                **kwargs) -> Path:
    """:func:`compare`, then save the store atomically at ``out``; returns its path."""
    from workbench.store import save

    return save(compare(teacher, students, images, **kwargs), out)
