"""The device and the process group of one launch: a plain process or a ``torchrun`` rank (torch only, no timm).

Everything that asks "where am I running" reads it here: :func:`resolve_device` (``auto`` / ``cpu`` / ``cuda``, and
under ``torchrun`` the rank's own GPU), :func:`cpu_threads`, :func:`launch_env` (what ``torchrun`` set),
:func:`init_distributed` (NCCL for cuda, gloo for the CPU), :func:`is_main`, :func:`barrier` and :func:`main_decides`.
The training loop (:mod:`methods.train`) uses them; a process that only needs the device or its rank (a scheduler's
worker, a store reader) imports this module and not the training loop's timm.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist

__all__ = ["resolve_device", "cpu_threads", "LaunchEnv", "launch_env", "init_distributed", "is_main", "barrier",
           "main_decides"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """The torch.device of ``auto`` / ``cpu`` / ``cuda`` for this process; the one place ``cuda`` gets its index.

    A torch.device already resolved (a CPU device, or cuda with its index) is returned as it is: callers resolve once
    and pass the result on. ``auto`` is cuda when a GPU is available, else cpu. Under ``torchrun`` (``LOCAL_RANK`` set) ``cuda`` is
    ``cuda:LOCAL_RANK``, made the current device (``torch.cuda.set_device``), so every rank, and everything it builds
    (teachers included), lives on its own GPU.

    Raises:
        RuntimeError: cuda without a GPU; under torchrun, more processes on this host than GPUs, or a ``cuda:N``
            other than the process's own.
    """
    if isinstance(device, torch.device) and (device.type != "cuda" or device.index is not None):
        return device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise RuntimeError("--device cuda was requested but no CUDA GPU is available; use --device cpu or auto")
    local = launch_env().local_rank
    if local is None:
        return dev
    gpus, procs = torch.cuda.device_count(), launch_env().local_world_size
    if procs > gpus:
        raise RuntimeError(f"torchrun started {procs} processes on this host, which has {gpus} GPU(s); with --device "
                           f"cuda each process needs its own GPU: use --nproc_per_node {gpus} (or --device cpu)")
    if dev.index is not None and dev.index != local:
        raise RuntimeError(f"under torchrun each process uses the GPU of its LOCAL_RANK (cuda:{local} here), not "
                           f"{dev}; give --device cuda")
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


@contextlib.contextmanager
def cpu_threads(n: int | None, device: str | torch.device = "cpu") -> Iterator[None]:
    """Within the block torch uses ``n`` intra-op threads on the CPU (restored afterwards).

    A no-op for ``n=None`` or a device (resolved by the caller: :func:`resolve_device`; only its type is read) that is
    not the CPU. Tiny models on a shared 2-core CPU run faster on one.
    """
    if not n or torch.device(device).type != "cpu":
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@dataclass(frozen=True)
class LaunchEnv:
    """Where ``torchrun`` put this process, read from the environment it sets (known before the process group
    exists; all None / 1 outside torchrun)."""

    rank: int  # RANK: the process's rank among all (0 outside torchrun)
    world_size: int  # WORLD_SIZE: processes in all (1 outside torchrun)
    local_rank: int | None  # LOCAL_RANK: the process's rank on this host (None outside torchrun)
    local_world_size: int  # LOCAL_WORLD_SIZE: processes on this host (1 outside torchrun)


def launch_env() -> LaunchEnv:
    """This process's :class:`LaunchEnv`."""
    env = os.environ
    launched = "RANK" in env and "WORLD_SIZE" in env
    local = int(env.get("LOCAL_RANK", 0)) if launched else None
    return LaunchEnv(rank=int(env["RANK"]) if launched else 0, world_size=int(env["WORLD_SIZE"]) if launched else 1,
                     local_rank=local, local_world_size=int(env.get("LOCAL_WORLD_SIZE", (local or 0) + 1)))


def init_distributed(device: str | torch.device = "auto") -> tuple[int, int]:
    """Join the process group when launched by torchrun; returns ``(rank, world_size)`` (``(0, 1)`` otherwise).

    The backend follows ``device`` (the ``--device`` asked for), not what the host has: NCCL for cuda, gloo for
    the CPU (``torchrun ... --device cpu`` on a GPU host runs gloo on CPU tensors). ``cuda`` is this rank's own GPU
    (:func:`resolve_device`). A no-op when the group exists.
    """
    env = launch_env()
    if env.local_rank is None:
        return 0, 1
    if not dist.is_initialized():
        dev = resolve_device(device)
        if dev.type == "cuda":
            dist.init_process_group("nccl", device_id=dev)
        else:
            dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def is_main() -> bool:
    """Whether this process writes the files: rank 0 of the group, or of the launch while no group exists yet
    (``RANK``), so that a write before :func:`init_distributed` is still made once."""
    return dist.get_rank() == 0 if dist.is_initialized() else launch_env().rank == 0


def barrier() -> None:
    """Wait for every rank (a no-op in one process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def main_decides(value=None):
    """Rank 0's ``value`` on every rank (``broadcast_object_list``; ``value`` itself in one process).

    Raises:
        RuntimeError: launched by torchrun with several processes but the group not joined (call
            :func:`init_distributed` with the device first).
    """
    if not dist.is_initialized():
        if launch_env().world_size > 1:
            raise RuntimeError("a torchrun process must join the process group (init_distributed) before ranks "
                               "can agree on anything")
        return value
    if dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
