"""Benchmark: the whole teacher-vs-students comparison (``workbench compare``) and the share of each part, from one run.

One teacher and two students compared by :func:`workbench.compare.compare` — what ``workbench compare``
runs: load the models, load the images, :func:`~workbench.analysis.teacher_vs_students.compare_models`, stamp —
on 64 held-out demo digits spread over the ten classes (``demo:val[7:967:15]``; the split is sorted by
class). Defaults: the demo ViT teacher and its FAR and pruned-FAR students (``teacher-vit-demo``,
``far-vit-demo``, ``far_pruned-vit-demo``: run ``workbench figures far.table1`` first, or pass other
run ids / timm names), ``workbench compare``'s defaults (IG with 50 Gauss–Legendre nodes, 16
deletion / insertion steps, captum's infidelity on); ``--ig-steps 32 --no-infidelity`` is the figures'
demo budget. Prints the wall time of the whole call and each part's time and share (from the
Dataset's ``seconds`` attr; "load + stamp" is the rest):

  forward       one batched forward per model caching block outputs and logits
  cka           linear CKA, 3 poolings x 2 estimators, every (teacher, student) layer pair; block cosine
  maps          attention (hook_pattern) of the teacher; FAR's and the teacher's gradient-saliency dependency
                (FAR has no attention); agreement per layer and head
  predictions   top-1 agreement, KL, accuracy
  attributions  IG, Saliency, rollout and random maps of 3 models; their agreement with the teacher
  faithfulness  deletion + insertion curves of every map (batched), captum infidelity of IG

Usage: PYTHONPATH=. python benchmarks/workbench_compare.py [--teacher RUN] [--student LABEL=RUN ...] [--images SPEC]
       [--threads 1] [--ig-steps 50] [--steps 16] [--no-infidelity]

Timings are one run on whatever machine this is: on the shared 2-core development VM they are taken
under load from other jobs (say so when quoting them).

Measured (phase 2) on the 2-core development VM under load, one thread, trained demo runs (teacher 93.7 %,
FAR 87.7 %, FAR† 84.2 % held-out top-1), 64 images, ``workbench compare``'s defaults; see the numbers printed
by the run quoted in docs/compare-budgets.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teacher", default="teacher-vit-demo", help="run id / timm name of the teacher")
    ap.add_argument("--student", action="append", default=None, metavar="[LABEL=]MODEL",
                    help="a student (repeat; default: FAR=far-vit-demo, FAR†=far_pruned-vit-demo)")
    ap.add_argument("--images", default="demo:val[7:967:15]", help="image spec (default: 64 held-out digits, all classes)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ig-steps", type=int, default=50)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--no-infidelity", action="store_true", help="leave captum's infidelity out (the figures do)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    from workbench.compare import compare

    students = args.student or ["FAR=far-vit-demo", "FAR†=far_pruned-vit-demo"]
    load0 = os.getloadavg()[0]
    start, cpu0 = time.perf_counter(), time.process_time()
    ds = compare(args.teacher, students, args.images, device="cpu", ig_steps=args.ig_steps, steps=args.steps,
                 infidelity=not args.no_infidelity)
    total, cpu = time.perf_counter() - start, time.process_time() - cpu0
    classes = sorted(set(int(v) for v in ds["label"].values))
    print(f"teacher {args.teacher}; students {', '.join(students)}; {ds.sizes['sample']} images {args.images} "
          f"(classes {classes}); {args.threads} thread(s); IG {args.ig_steps} nodes, {args.steps} steps, infidelity "
          f"{'off' if args.no_infidelity else 'on'}; load average {load0:.1f} -> {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    seconds = json.loads(ds.attrs["seconds"])
    print(f"\nworkbench.compare.compare total: {total:.1f} s wall, {cpu:.1f} s CPU time of this process")
    print(f"{'part':<14}{'seconds':>9}{'share':>8}")
    for part, s in seconds.items():
        print(f"{part:<14}{s:>9.2f}{s / total:>8.1%}")
    rest = total - sum(seconds.values())
    print(f"{'load + stamp':<14}{rest:>9.2f}{rest / total:>8.1%}")

    from workbench.plots.compare import matched_cka, summary_frame

    print("\nwhat it found (means over images):")
    print(summary_frame(ds).to_string(index=False))
    print("  CKA (debiased, token mean), teacher layer l vs matched student layer:")
    m = matched_cka(ds)
    for label in ds.model.values[1:]:
        print(f"    {label:<8}", [round(float(v), 3) for v in m.sel(model=label).values])
    print("  deletion AUC / insertion AUC per attribution (lower / higher is more faithful):")
    for label in ds.model.values:
        row = {str(a): f"{float(ds.deletion_auc.sel(model=label, attribution=a).mean()):.3f}/"
                  f"{float(ds.insertion_auc.sel(model=label, attribution=a).mean()):.3f}" for a in ds.attribution.values}
        print(f"    {label:<8}", row)
    print("  IG completeness gap, max over images:", {str(k): f"{float(v):.1e}" for k, v in
                                                      zip(ds.model.values, ds.ig_delta.max("sample").values)})


if __name__ == "__main__":
    main()
