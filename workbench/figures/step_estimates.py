"""How long each preparation step of ``workbench figures`` takes, for scheduling a cold start.

:func:`workbench.figures.schedule.prepare` starts, among the ready steps, the one with the longest remaining
chain of work. It measures every step and records the seconds in the home (``stores/<profile>/step_seconds.json``);
before the first run there is nothing recorded, so the seconds a measuring run recorded and shipped with the package
(``step_seconds.json`` beside this module) stand in. Without them every step counts one second and a cold
``workbench figures --all`` on two cores leaves one idle for the last minute (simulated over the measured times:
895 s for the shared steps instead of 857). A step nobody measured yet (a new method's) counts one second: a
default, nothing to edit.

The shipped seconds are what a cold ``workbench figures --all --profile demo`` recorded on the 2-core development
machine; after such a run, ``python -m workbench.figures.step_estimates --profile demo`` ships its record (merges the
home's ``step_seconds.json`` into the package's).
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

__all__ = ["SHIPPED", "DEFAULT_SECONDS", "estimates", "estimate", "record", "main"]

SHIPPED = Path(__file__).with_name("step_seconds.json")  # profile -> data id -> seconds, recorded by measuring runs
DEFAULT_SECONDS = 1.0  # a step never measured


@functools.lru_cache(maxsize=None)
def _read(path: Path) -> dict[str, dict[str, float]]:
    return json.loads(path.read_text()) if path.exists() else {}


def estimates(profile: str, path: Path | None = None) -> dict[str, float]:
    """The shipped seconds (``path``: :data:`SHIPPED`) of every step measured under ``profile`` (empty if none was)."""
    return dict(_read(path or SHIPPED).get(profile, {}))


def estimate(profile: str, step: str) -> float:
    """Seconds ``step`` is expected to take under ``profile`` (:data:`DEFAULT_SECONDS` when never measured)."""
    return estimates(profile).get(step, DEFAULT_SECONDS)


def record(profile: str, seconds: dict[str, float], path: Path | None = None) -> Path:
    """Merge measured ``seconds`` (step id -> seconds, rounded to whole seconds) into the estimates at ``path``
    (:data:`SHIPPED`)."""
    from workbench.runtime import atomic_write_text

    path = path or SHIPPED
    data = json.loads(path.read_text()) if path.exists() else {}
    data[profile] = {**data.get(profile, {}), **{k: round(float(v)) for k, v in seconds.items()}}
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    _read.cache_clear()
    return path


def main(argv: list[str] | None = None) -> int:
    """Ship the seconds the last ``workbench figures`` run in this home measured (``--profile``)."""
    from workbench.runs import home

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--profile", default="demo")
    args = p.parse_args(argv)
    measured = home() / "stores" / args.profile / "step_seconds.json"
    if not measured.exists():
        raise SystemExit(f"{measured} does not exist: run `workbench figures --all --profile {args.profile}` first")
    print(f"recorded {args.profile!r} step seconds in {record(args.profile, json.loads(measured.read_text()))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
