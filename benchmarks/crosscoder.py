"""Tokens per second of crosscoder training (paired activation collection + BatchTopK steps) against a plain forward
of both models, side by side in one run, on the demo teacher's architecture (random weights, random images).

    python benchmarks/crosscoder.py [--images 1024] [--block 5] [--width 512] [--k 16] [--device auto]

The student is a second random-init ``vit_demo`` (the pairing and the cost do not depend on the weights).
"""

from __future__ import annotations

import argparse
import time

import timm
import torch

import methods.teachers  # noqa: F401  (registers vit_demo with timm)
from methods.train import resolve_device
from workbench.features import CrosscoderConfig, paired_hooks, train_crosscoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--batch-images", type=int, default=64)
    ap.add_argument("--device", default="auto")
    a = ap.parse_args()
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


if __name__ == "__main__":
    main()
