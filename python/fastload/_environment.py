"""Resolves what the Loader needs from its surroundings, once, at construction: this process's
rank and world size, its default device, and how many collation threads it may use."""
from __future__ import annotations

import os
from typing import Any

import torch

from ._arguments import MAX_THREADS, as_int
from ._machine import cpu_share, env_int, local_world_size, torch_gpu_count, torch_sees_gpu, usable_cpus  # noqa: F401 - re-exported


def resolve_rank(rank: Any, world_size: Any, process_group: Any = None) -> tuple[int, int]:
    """Explicit values win; then a process group; then torch.distributed if initialised; then
    the RANK/WORLD_SIZE variables torchrun sets; else a single process."""
    if (rank is None) != (world_size is None):
        given = "rank" if rank is not None else "world_size"
        raise ValueError(f"rank and world_size must be given together, got only {given}")
    if rank is not None:  # explicit values win, even over a process_group
        rank, world_size = as_int("rank", rank), as_int("world_size", world_size)
        source = "argument"
    elif process_group is not None:
        import torch.distributed as dist

        rank, world_size = dist.get_rank(process_group), dist.get_world_size(process_group)
        if rank < 0:
            raise ValueError("this process is not a member of the given process_group")
        source = "process_group"
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        source = "torch.distributed"
    else:
        env_rank, env_world = env_int("RANK"), env_int("WORLD_SIZE")
        if (env_rank is None) != (env_world is None):
            # Half a launcher's environment: guessing rank 0 of 1 would make every process load
            # the whole dataset.
            given, missing = ("RANK", "WORLD_SIZE") if env_rank is not None else ("WORLD_SIZE", "RANK")
            raise ValueError(f"the environment sets {given}={os.environ[given]!r} but not {missing}; set both "
                             f"(torchrun does), or pass rank= and world_size= explicitly")
        if env_rank is not None:
            rank, world_size, source = env_rank, env_world, "RANK/WORLD_SIZE"
        else:
            rank, world_size, source = 0, 1, "default"
    if world_size <= 0:
        raise ValueError(f"world_size must be positive, got {world_size} (from {source})")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank} (from {source})")
    return rank, world_size


def default_num_threads() -> int:
    """The CPUs this process may use, shared among this job's processes on this node (the whole
    of _machine.cpu_share, the budget decode and scan threads are sized from too)."""
    return min(MAX_THREADS, cpu_share())


def resolve_device(device: Any) -> torch.device:
    """Parses a device, with the GPU index resolved now and without initialising CUDA (see
    default_cuda_index): a Loader's `device` is the device its batches will be on."""
    if device is None:
        if not torch_sees_gpu():
            return torch.device("cpu")
        local_rank, gpus = env_int("LOCAL_RANK") or 0, torch_gpu_count()
        if local_rank >= gpus:
            raise ValueError(
                f"device=None picks cuda:LOCAL_RANK, but LOCAL_RANK={local_rank} and only "
                f"{gpus} CUDA device(s) are visible; pass device= explicitly")
        return torch.device("cuda", local_rank)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}") from None
    if dev.type == "cuda":
        return dev if dev.index is not None else torch.device("cuda", default_cuda_index())
    if dev.type != "cpu":
        raise ValueError(f"device must be a CPU or CUDA device, got {device!r}")
    return torch.device("cpu")  # "cpu:0" is the same place


def default_cuda_index() -> int:
    """The index "cuda" stands for, decided when the Loader is built, without initialising CUDA
    (torch.cuda.current_device() would, and a process that forks workers afterwards could no
    longer use CUDA in them):
    - CUDA already initialised in this process (torch.cuda.set_device() does that): PyTorch's
      current device, as for any "cuda" tensor made now;
    - else LOCAL_RANK when it names a visible GPU: under torchrun each process's GPU, the one its
      torch.cuda.set_device(LOCAL_RANK) will select (device=None picks it too);
    - else 0, PyTorch's current device until something selects another (also when PyTorch sees no
      GPU, as with the tests' stand-in driver: the first iter() then checks the index)."""
    if not torch_sees_gpu():
        return 0
    if torch.cuda.is_initialized():
        return torch.cuda.current_device()
    local_rank = env_int("LOCAL_RANK")
    if local_rank is not None and 0 <= local_rank < torch_gpu_count():
        return local_rank
    return 0
