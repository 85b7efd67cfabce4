"""Crosscoder training cost, side by side in one run:

1. tokens per second of crosscoder training (paired activation collection + BatchTopK steps) against a plain forward
   of both models (``--images`` random images, the demo teacher's architecture, random weights);
2. with ``--demo``: a crosscoder over the demo's 4000 training images (all tokens of one block pair, the demo
   teacher and ``--student``; the issue's bar: within 3 minutes on this CPU), and the peak memory of the same
   training over the demo set passed once (4,000 images) and ten times (40,000, streamed; bar: within 10 %), each in
   a fresh child process (peak resident set size, and its rise over the RSS before training).

    python benchmarks/crosscoder.py [--images 1024] [--block 5] [--width 512] [--k 16] [--device auto]
    python benchmarks/crosscoder.py --demo [--student far-vit-demo] [--passes 10] [--block 3] [--train-images SPEC]
    python benchmarks/crosscoder.py --demo --stored DIR   # the same from activations stored once in DIR (zarr)

With ``--stored DIR`` the two models' activations at the block are first streamed into ``DIR/teacher.zarr`` and
``DIR/student.zarr`` (``workbench analyze activations``; timed, reused when complete), and the trainings read them
(:mod:`workbench.features.stored`) instead of running the models.

The plain-forward comparison's student is a second random-init ``vit_demo`` (the cost does not depend on the
weights); ``--demo`` needs the demo runs in ``WORKBENCH_HOME`` (``workbench figures --all`` trains them).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from workbench.features import CrosscoderConfig, paired_hooks, train_crosscoder
from workbench.runtime import resolve_device


def _rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def throughput(a: argparse.Namespace) -> None:
    import timm

    import methods.teachers  # noqa: F401  (registers vit_demo with timm)

    dev = resolve_device(a.device)
    torch.manual_seed(0)
    teacher, student = (timm.create_model("vit_demo").eval().to(dev) for _ in range(2))
    images = torch.randn(a.images, 1, 28, 28)
    name = f"blocks.{a.block}.hook_resid_post"
    assert paired_hooks(teacher, student)[name] == name
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    with torch.no_grad():
        for lo in range(0, a.images, a.batch_images):
            x = images[lo:lo + a.batch_images].to(dev)
            teacher(x), student(x)
    sync()
    plain = time.perf_counter() - t0
    tokens = a.images * 50  # 7×7 patches + CLS per image
    cfg = CrosscoderConfig(width=a.width, k=a.k, batch_images=a.batch_images, epochs=1)
    t0 = time.perf_counter()
    cc = train_crosscoder({"teacher": teacher, "student": student}, {"teacher": name, "student": name}, images, cfg,
                          device=dev)
    sync()
    train = time.perf_counter() - t0
    print(f"device {dev}, {a.images} images = {tokens} token pairs at {name}, width {cc.width}, k {cc.k}")
    print(f"plain forward of both models: {tokens / plain:,.0f} tokens/s ({plain:.2f} s)")
    print(f"collection + training:        {tokens / train:,.0f} tokens/s ({train:.2f} s)")
    print(f"training / plain forward time: {train / plain:.2f}x")


def child(a: argparse.Namespace) -> None:
    """One demo training (``--epochs`` passes over demo:train), in this process; prints a JSON line."""
    from workbench.data import load_images
    from workbench.models import load_model

    dev = resolve_device(a.device)
    t, s = load_model("teacher-vit-demo", device=dev), load_model(a.student, device=dev)
    hooks = {"teacher": f"blocks.{a.block}.hook_resid_post", "student": f"blocks.{a.block}.hook_resid_post"}
    cfg = CrosscoderConfig(width=a.width, k=a.k, batch_images=a.batch_images, epochs=a.epochs)
    if a.stored:
        from workbench.features import fit_crosscoder
        from workbench.features.stored import open_activations, stored_batches

        stores = {k: f"{a.stored}/{k}.zarr" for k in hooks}
        before = _rss_mib()
        t0 = time.perf_counter()
        arrays = open_activations(stores, hooks, {"teacher": t.source, "student": s.source})
        n = next(iter(arrays.values())).sizes["sample"]
        batches, steps = stored_batches(arrays, a.chunk, a.batch_images, seed=cfg.seed)
        fit_crosscoder(batches, steps, cfg, device=dev)
    else:
        images = load_images(a.train_images, input_size=t.input_size, mean=t.mean, std=t.std).tensor
        n = len(images)
        before = _rss_mib()
        t0 = time.perf_counter()
        train_crosscoder({"teacher": t.model, "student": s.model}, hooks, images, cfg, device=dev)
    seconds = time.perf_counter() - t0
    print(json.dumps({"images": n * a.epochs, "seconds": seconds, "rss_before_mib": before,
                      "peak_rss_mib": _rss_mib(), "cpu_threads": torch.get_num_threads()}))


def write_stores(a: argparse.Namespace) -> float:
    """Stream the teacher's and the student's block outputs into ``a.stored`` (reused when complete); seconds."""
    from pathlib import Path

    from workbench.scale.stream import StreamOptions, stream_analysis

    opts = StreamOptions(layers=(a.block,), batch_size=a.batch_images, chunk=a.chunk, workers=0)
    t0 = time.perf_counter()
    for label, ref in (("teacher", "teacher-vit-demo"), ("student", a.student)):
        stream_analysis("activations", ref, a.train_images, Path(a.stored) / f"{label}.zarr", device=a.device,
                        opts=opts, progress=False)
    return time.perf_counter() - t0


def _child_run(a: argparse.Namespace, epochs: int, stored: str | None) -> dict:
    cmd = [sys.executable, __file__, "--child", "--epochs", str(epochs), "--student", a.student, "--train-images",
           a.train_images, "--block",
           str(a.block), "--width", str(a.width), "--k", str(a.k), "--batch-images", str(a.batch_images),
           "--device", a.device, "--chunk", str(a.chunk)] + (["--stored", stored] if stored else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def demo(a: argparse.Namespace) -> None:
    if a.stored:
        written = write_stores(a)
        direct = _child_run(a, 1, None)["seconds"]
        stored = _child_run(a, 1, a.stored)["seconds"]
        print(f"one pass over {a.train_images}: {direct:.1f} s from the images (both models run every step), "
              f"{stored:.1f} s from the stores ({direct / stored:.1f}x faster) after {written:.1f} s writing them once "
              f"(streamed to {a.stored}; reused by every later training)")
    runs = {epochs: _child_run(a, epochs, a.stored) for epochs in sorted({1, a.passes})}
    one, many = runs[1], runs[a.passes]
    print(f"demo pair teacher-vit-demo / {a.student}, blocks.{a.block}, width {a.width}, k {a.k}, "
          f"{a.batch_images} images a step, device {a.device}, {one['cpu_threads']} CPU threads")
    what = "training from the stores" if a.stored else "collection + training"
    print(f"{one['images']} images ({one['images'] * 50:,} token pairs): {one['seconds']:.0f} s {what}"
          + (f" ({'within' if one['seconds'] <= 180 else 'over'} the 3-minute bar)" if one["images"] == 4000 else ""))
    print(f"{many['images']} images: {many['seconds']:.0f} s")
    rise = [r["peak_rss_mib"] - r["rss_before_mib"] for r in (one, many)]
    print(f"peak RSS: {one['peak_rss_mib']:.0f} MiB at {one['images']} images vs {many['peak_rss_mib']:.0f} MiB at "
          f"{many['images']} ({many['peak_rss_mib'] / one['peak_rss_mib']:.3f}x); rise during training "
          f"{rise[0]:.0f} vs {rise[1]:.0f} MiB ({rise[1] / max(rise[0], 1e-9):.3f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1024, help="random images of the throughput comparison")
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--batch-images", type=int, default=32)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--demo", action="store_true", help="the demo pair: 4000-image time, 4,000 vs 40,000 memory")
    ap.add_argument("--student", default="far-vit-demo", help="the demo student run (--demo)")
    ap.add_argument("--passes", type=int, default=10, help="passes over the images of the memory comparison")
    ap.add_argument("--train-images", default="demo:train", help="image spec of the --demo trainings (default: all "
                                                                  "4000 demo:train)")
    ap.add_argument("--stored", default=None, help="--demo from activations stored in this folder (written first)")
    ap.add_argument("--chunk", type=int, default=128, help="images per store chunk (--stored)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
    elif a.demo:
        demo(a)
    else:
        throughput(a)


if __name__ == "__main__":
    main()
