"""Benchmark: loading a DeiT-S-sized Hugging Face folder (``hf:DIR``) against the same weights as timm safetensors.

One DeiT-S-sized ``ViTForImageClassification`` (dim 384, depth 12, 6 heads, 1000 classes, 22 M parameters; random
weights, seeded; nothing downloaded) is saved with ``save_pretrained``, converted once, and its converted state dict
saved as a timm ``model.safetensors``. Each way of loading then runs in a fresh Python process (imports done before
the clock starts), interleaved, ``--repeats`` times:

- ``hf:DIR -> timm``: ``workbench.models.load_model("hf:DIR")`` (read, rename, fuse qkv, timm's filter, strict load);
- ``timm safetensors``: ``load_model("hf_vit", checkpoint=..., **kwargs)``: the same architecture and weights;
- ``transformers``: ``ViTForImageClassification.from_pretrained(DIR)`` for reference.

Each child has an empty ``WORKBENCH_HOME`` (``load_model`` first looks a timm name up among the runs, which is not
loading). Reported: median wall time, and median peak resident memory added by the load (``VmHWM`` after the load, its peak
reset through ``/proc/self/clear_refs`` just before, minus the resident size then; Linux), with the ratios to the
timm load. Run::

    PYTHONPATH=. python benchmarks/hf_load.py [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

CHILD = r"""
import json, sys, time, warnings
import torch
torch.set_num_threads(int(sys.argv[3]))
warnings.simplefilter("ignore")
import transformers, timm
from workbench.models import load_model
import workbench.hf.archs
from methods import register_models
register_models()  # imported before the clock: create_model imports every method package on its first call
kind, root = sys.argv[1], sys.argv[2]
spec = json.loads(open(f"{root}/spec.json").read())
def status(key):  # MiB of a /proc/self/status line (VmRSS: resident now; VmHWM: peak resident since the reset)
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":")) / 1024
open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current resident size (Linux)
before = status("VmRSS")
t = time.perf_counter()
if kind == "hf":
    m = load_model(f"hf:{root}/hf").model
elif kind == "timm":
    m = load_model(spec["name"], checkpoint=f"{root}/timm.safetensors", **spec["kwargs"]).model
else:
    m = transformers.ViTForImageClassification.from_pretrained(f"{root}/hf").eval()
seconds = time.perf_counter() - t
peak = status("VmHWM")
print(json.dumps({"seconds": seconds, "mib": peak - before, "params": sum(p.numel() for p in m.parameters())}))
"""

CASES = {"hf": "hf:DIR -> timm", "timm": "timm safetensors", "transformers": "transformers from_pretrained"}


def prepare(root: Path) -> None:
    """The HF folder, and the converted weights as timm safetensors with the timm name and kwargs."""
    import torch
    import transformers
    from safetensors.torch import save_file

    from workbench.hf import load_hf

    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=224, patch_size=16, hidden_size=384, num_hidden_layers=12,
                                    num_attention_heads=6, intermediate_size=1536, num_labels=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.ViTForImageClassification(config).save_pretrained(root / "hf")
    converted, _ = load_hf(f"hf:{root / 'hf'}")
    save_file({k: v.contiguous() for k, v in converted.model.state_dict().items()}, str(root / "timm.safetensors"))
    (root / "spec.json").write_text(json.dumps({"name": converted.name, "kwargs": converted.kwargs}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prepare(root)
        sizes = {"hf": (root / "hf" / "model.safetensors").stat().st_size, "timm": (root / "timm.safetensors").stat().st_size}
        runs: dict[str, list[dict]] = {k: [] for k in CASES}
        # an empty WORKBENCH_HOME: load_model first looks a timm name up among the runs, which is not loading
        env = {**os.environ, "WORKBENCH_HOME": str(root / "home")}
        for r in range(args.repeats):
            order = list(CASES)[r % 3:] + list(CASES)[:r % 3]  # rotate, so no case always runs first
            for kind in order:
                out = subprocess.run([sys.executable, "-c", CHILD, kind, str(root), str(args.threads)], check=True,
                                     capture_output=True, text=True, env=env).stdout
                runs[kind].append(json.loads(out.strip().splitlines()[-1]))
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("seconds", "mib")} for k, v in runs.items()}
    params = runs["hf"][0]["params"]
    print(f"DeiT-S-sized ViT, {params / 1e6:.1f} M parameters; files: HF {sizes['hf'] / 2**20:.1f} MiB, "
          f"timm {sizes['timm'] / 2**20:.1f} MiB; {args.repeats} fresh processes per case, {args.threads} thread(s)")
    print(f"{'load':32s} {'median s':>9s} {'x timm':>7s} {'peak +MiB':>10s} {'x timm':>7s}")
    for k, label in CASES.items():
        s, m = med[k]["seconds"], med[k]["mib"]
        print(f"{label:32s} {s:9.3f} {s / med['timm']['seconds']:7.2f} {m:10.1f} {m / med['timm']['mib']:7.2f}")


if __name__ == "__main__":
    main()
