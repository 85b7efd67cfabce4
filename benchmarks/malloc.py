"""Benchmark: the figure workers' glibc malloc settings (``workbench.figures.schedule.MALLOC_ENV``) on training.

``workbench figures`` trains in spawned worker processes that start with ``MALLOC_ENV``: glibc keeps freed blocks
of up to 256 MiB in its heap instead of unmapping them, so a training step reuses the pages of the previous one.
This script trains the same small model (the demo Swin, batches of random noise images of the demo size and
random labels: nothing downloaded) in fresh subprocesses, alternately with glibc's defaults and with ``MALLOC_ENV``, one thread
each, and prints per setting the median wall time, system time and minor page faults of the training loop, the peak RSS, their ratios, and
whether the trained weights are bit-identical (they must be: only where memory comes from changes). Run::

    PYTHONPATH=. python benchmarks/malloc.py [--rounds 3] [--steps 150]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import hashlib, json, resource, sys, time
import torch
from workbench.models import create_model
torch.set_num_threads(1)
torch.manual_seed(0)
steps = int(sys.argv[1])
model = create_model("swin_demo")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
size = model.pretrained_cfg.get("input_size", (3, 32, 32))
g = torch.Generator().manual_seed(0)
before = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
for _ in range(steps):
    x = torch.randn(32, *size, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
print(json.dumps({"wall": wall, "sys": ru.ru_stime - before.ru_stime, "minflt": ru.ru_minflt - before.ru_minflt,
                  "rss_mb": ru.ru_maxrss / 1024,
                  "weights": digest}))
"""


def _once(env: dict[str, str], steps: int) -> dict:
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}, **env, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(steps)], env=full, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from workbench.figures.schedule import MALLOC_ENV

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs per setting")
    ap.add_argument("--steps", type=int, default=150, help="training steps per run (batch 32)")
    args = ap.parse_args()
    settings = {"glibc default": {}, "MALLOC_ENV": dict(MALLOC_ENV)}
    got: dict[str, list[dict]] = {k: [] for k in settings}
    for r in range(args.rounds):
        for name, env in settings.items():  # interleaved: machine load hits both alike
            got[name].append(_once(env, args.steps))
            print(f"round {r + 1}/{args.rounds} {name}: {got[name][-1]}", flush=True)
    med = {name: {k: statistics.median(x[k] for x in runs) for k in ("wall", "sys", "minflt", "rss_mb")}
           for name, runs in got.items()}
    print(f"\n{'setting':16s} {'wall s':>8s} {'sys s':>7s} {'minor faults':>13s} {'peak RSS MB':>12s}")
    for name, m in med.items():
        print(f"{name:16s} {m['wall']:8.2f} {m['sys']:7.2f} {m['minflt']:13.0f} {m['rss_mb']:12.0f}")
    a, b = med["MALLOC_ENV"], med["glibc default"]
    print(f"\nMALLOC_ENV / default: wall {a['wall'] / b['wall']:.3f}x, system time {a['sys'] / max(b['sys'], 1e-9):.3f}x, "
          f"page faults {a['minflt'] / b['minflt']:.3f}x, peak RSS {a['rss_mb'] / b['rss_mb']:.3f}x")
    same = len({x["weights"] for runs in got.values() for x in runs}) == 1
    print(f"trained weights bit-identical across settings and rounds: {same}")


if __name__ == "__main__":
    main()
