"""Benchmark: the whole teacher-vs-students comparison and the share of each part, from one run.

One teacher (``vit_demo``: random weights, or a trained run with ``--teacher teacher-vit-demo``) and
two students — FAR (``methods.far.replace_attention`` of the teacher; substitutes untrained unless
``--far RUN`` names a FAR run) and a 3-block ``vit_demo`` (a shallower student, as Non-deep's) —
compared by :func:`workbench.analysis.comparison.compare_models` on 64 held-out demo images (evenly
spaced over the split, so all ten classes) with its
defaults (IG with 50 Gauss–Legendre nodes, 16 deletion/insertion steps, infidelity on). Prints the
wall time of the whole call and, from the Dataset's ``seconds`` attr, each part's time and share:

  forward       one batched forward per model caching block outputs and logits
  cka           linear CKA, 3 poolings x 2 estimators, every (teacher, student) layer pair; block cosine
  maps          attention of teacher and students (hook_pattern), FAR's and the teacher's saliency
                dependency, agreement per layer and head
  predictions   top-1 agreement, KL, accuracy
  attributions  IG, Saliency, rollout and random maps of 3 models; their agreement with the teacher
  faithfulness  deletion + insertion curves of every map (batched), captum infidelity of IG

Usage: PYTHONPATH=. python benchmarks/compare.py [--teacher RUN] [--far RUN] [--images demo:val] [--count 64]
       [--threads 1] [--ig-steps 50] [--steps 16]

Timings are one run on whatever machine this is: on the shared 2-core development VM they are taken
under load from other jobs (say so when quoting them).

Measured on the 2-core development VM under load (load average 8-9 from other jobs), one thread,
trained demo teacher (93.7 % held-out top-1), ``--teacher teacher-vit-demo``, one run:

  compare_models total 94.3 s (48.8 s of CPU time in the process)
  forward 0.34 s (0.4 %), cka 0.82 s (0.9 %), maps 11.1 s (11.8 %), predictions 0.01 s (0.0 %),
  attributions 40.8 s (43.3 %), faithfulness 41.2 s (43.6 %)

IG (3 models x 64 images x 50 nodes, forward + backward) and the deletion/insertion curves
(3 models x 4 maps x 64 images x 34 inputs, + infidelity) dominate; FAR's and the teacher's
saliency dependency dominate ``maps``. With random weights instead (load average 7): 218 s, of which
attributions 107 s, faithfulness 81 s, maps 26 s. ``--ig-steps 32`` keeps IG's completeness gap
at 1e-4 on the trained teacher for ~0.65x its time.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teacher", default=None, help="run id of a trained vit_demo teacher (default: random weights)")
    ap.add_argument("--far", default=None, help="run id of a FAR student (default: replace_attention of the teacher)")
    ap.add_argument("--images", default="demo:val", help="image spec (default: the held-out demo digits)")
    ap.add_argument("--count", type=int, default=64, help="images taken evenly spaced from the spec (MNIST-5k is "
                    "sorted by class, so the first 64 would all be zeros)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ig-steps", type=int, default=50)
    ap.add_argument("--steps", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from methods.far import replace_attention
    from workbench.analysis.comparison import compare_models
    from workbench.data import load_images
    from workbench.models import create_model, load_model

    teacher = load_model(args.teacher).model if args.teacher else create_model("vit_demo").eval()
    far = load_model(args.far).model if args.far else replace_attention(teacher).eval()
    shallow = create_model("vit_demo", depth=3).eval()
    batch = load_images(args.images, input_size=(1, 28, 28))
    pick = torch.linspace(0, len(batch.tensor) - 1, min(args.count, len(batch.tensor))).round().long()
    images, labels = batch.tensor[pick], batch.labels[pick.numpy()]
    classes = sorted(set(labels.tolist()))
    print(f"teacher: {args.teacher or 'vit_demo, random weights'}; "
          f"students: far ({args.far or 'untrained substitutes'}), vit_demo depth 3 (random); "
          f"{len(images)} images evenly spaced over {args.images} (classes {classes}); {args.threads} thread(s); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

    start = time.perf_counter()
    ds = compare_models(teacher, {"far": far, "shallow": shallow}, images, labels,
                        ig_steps=args.ig_steps, steps=args.steps)
    total = time.perf_counter() - start
    seconds = json.loads(ds.attrs["seconds"])
    print(f"\ncompare_models total: {total:.1f} s (load average now {os.getloadavg()[0]:.1f})")
    print(f"{'part':<14}{'seconds':>9}{'share':>8}")
    for part, s in seconds.items():
        print(f"{part:<14}{s:>9.2f}{s / total:>8.1%}")
    print(f"{'(other)':<14}{total - sum(seconds.values()):>9.2f}{(total - sum(seconds.values())) / total:>8.1%}")

    print("\nwhat it found (means over images):")
    print("  accuracy      ", {str(m): round(float(v), 3) for m, v in zip(ds.model.values, ds.accuracy.values)})
    print("  top-1 agree   ", {str(m): round(float(v), 3) for m, v in zip(ds.model.values, ds.agreement.values)})
    diag = ds.cka.sel(pooling="mean", estimator="debiased")
    print("  CKA (debiased, token mean), teacher layer l vs student layer l:")
    for m in ds.model.values[1:]:
        d = int(ds.depth.sel(model=m))
        print(f"    {m:<8}", [round(float(diag.sel(model=m, teacher_layer=i, student_layer=i)), 3) for i in range(d)])
    print("  map JS (head-avg, bits) per layer:")
    for m in ds.model.values:
        print(f"    {m:<8}", [round(float(v), 3) for v in ds.map_js_avg.sel(model=m).mean("sample").values],
              list(dict.fromkeys(ds.map_measure.sel(model=m).values.tolist())))
    print("  deletion AUC / insertion AUC (lower / higher is more faithful):")
    for m in ds.model.values:
        row = {str(a): f"{float(ds.deletion_auc.sel(model=m, attribution=a).mean()):.3f}/"
                  f"{float(ds.insertion_auc.sel(model=m, attribution=a).mean()):.3f}" for a in ds.attribution.values}
        print(f"    {m:<8}", row)
    print("  IG completeness gap, max over images:", {str(m): f"{float(v):.1e}" for m, v in
                                                      zip(ds.model.values, ds.ig_delta.max("sample").values)})


if __name__ == "__main__":
    main()
