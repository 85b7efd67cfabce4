"""AttentionLite's column shrink on a device: the shrunk model against the masked one it replaces (gpu_check.sh, check d).

The demo SA-ResNet (both stems, float32, random weights and BatchNorm statistics) is column-pruned to d = 0.5 by sparse
momentum's masks and shrunk (``methods.attentionlite.shrink``); the largest |logit difference| over 64 random 28×28
images is printed as cuDNN computes it by default (TF32 convolutions allowed) and in full float32 (TF32 off), beside the
pipeline's tolerance. Exit 1 when the full-float32 difference exceeds it (the shrink itself would be wrong on the device);
a TF32 difference over it is reported, not failed here (whether the run accepts it is the run's check).

    python3 scripts/gpu_check_shrink.py [--device cuda]
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from methods.attentionlite import SA_VARIANTS, SparseMomentum, shrink
from workbench.pipelines.attentionlite.body import SHRINK_TOLERANCE


def _randomised(stem: str, device: str) -> nn.Module:
    torch.manual_seed(0)
    model = SA_VARIANTS["demo"].build(stem)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):  # non-trivial statistics: zero-init BN would hide residual branches
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.5)
                m.running_mean.normal_(0, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model.to(device)


def gaps(stem: str, device: str) -> dict[str, float]:
    """max |shrunk - masked| logits with TF32 allowed (cuDNN's default) and off."""
    model = _randomised(stem, device)
    hook = SparseMomentum(model, 0.5, "column", epochs=1)
    hook.apply(model)
    model.eval()
    small = shrink(model, hook.weight_masks()).to(device).eval()
    x = torch.randn(64, 1, 28, 28, device=device, generator=torch.Generator(device).manual_seed(1))
    out = {}
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    for name, tf32 in (("tf32_allowed", True), ("float32", False)):
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
        with torch.no_grad():
            out[name] = (small(x) - model(x)).abs().max().item()
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    device = p.parse_args().device
    bad = []
    for stem in ("conv", "attention"):
        g = gaps(stem, device)
        print(f"{stem} stem on {device}: max |shrunk - masked| logit = {g['float32']:.2e} in float32, "
              f"{g['tf32_allowed']:.2e} with TF32 allowed (cuDNN's default); the run's tolerance {SHRINK_TOLERANCE:g}"
              + (" - TF32 exceeds it" if g["tf32_allowed"] > SHRINK_TOLERANCE else ""))
        if not g["float32"] <= SHRINK_TOLERANCE:
            bad.append(stem)
    if bad:
        print(f"the shrunk model differs from the masked one beyond {SHRINK_TOLERANCE:g} in float32 ({', '.join(bad)} stem)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
