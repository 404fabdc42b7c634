"""Argument checks shared by the Loader and its sources: integers, the limits every size must stay
within before it reaches C++, and this machine's memory. All arithmetic is on exact Python ints."""
from __future__ import annotations

import functools
import operator
import os
from typing import Any

# The sampler refuses a global batch (batch_size x world_size x devices) above this (sampler.cpp).
MAX_GLOBAL_BATCH = 2**40
# More collation threads than this only contend; the native pool takes a C int.
MAX_THREADS = 4096
# Batches in flight per device; each is one slot in every output of the pipeline.
MAX_PREFETCH = 65536
MAX_STREAMS = 1024
INT64_MAX = 2**63 - 1
MAX_SAMPLES = 2**62


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


@functools.lru_cache(maxsize=1)
def memory_limit() -> int:
    """Bytes this process can ever hold: physical memory, or the smallest limit of the memory
    cgroups it is in (its own and their parents', v2 and v1)."""
    return _memory_limit()


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return INT64_MAX


def _memory_limit(proc_root: str = "/proc", sys_root: str = "/sys/fs/cgroup", physical: int | None = None) -> int:
    """memory_limit() read from other roots (tests build a fake /proc and cgroup tree).

    The limit that applies is the process's own cgroup's (from proc_root/self/cgroup), not the
    one at the mount root: inside a Slurm job, a systemd-run scope or a Kubernetes pod the root's
    file says "max" while the job's says 1 GiB. Every ancestor's limit applies too, so the
    smallest from the process's cgroup up to the mount is taken."""
    limit = _physical_memory() if physical is None else physical
    for directory, top, name in _memory_cgroups(proc_root, sys_root):
        d = directory
        while True:
            value = _read_limit(os.path.join(d, name))
            if value is not None and value < limit:
                limit = value
            if os.path.normpath(d) == os.path.normpath(top) or len(d) <= len(top):
                break
            d = os.path.dirname(d)
    return limit


def _read_limit(path: str) -> int | None:
    """A cgroup limit file's bytes; None for "max", a missing or unreadable file."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def _memory_cgroups(proc_root: str, sys_root: str) -> list[tuple[str, str, str]]:
    """(the process's cgroup directory, its hierarchy's mount point, limit file name) for the v2
    hierarchy and the v1 memory controller, where the process is in one."""
    try:
        with open(os.path.join(proc_root, "self", "cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    mounts = _cgroup_mounts(proc_root, sys_root)
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            kind, name = "v2", "memory.max"
        elif "memory" in controllers.split(","):
            kind, name = "v1", "memory.limit_in_bytes"
        else:
            continue
        for point, root in mounts[kind]:
            # The mount shows the hierarchy from `root` down (a container sees its own cgroup as /).
            if root == "/":
                rel = path
            elif path == root or path.startswith(root + "/"):
                rel = path[len(root):]
            else:
                rel = "/"  # outside what the mount shows: its top is the nearest limit we can read
            out.append((os.path.normpath(point + "/" + rel.lstrip("/")), point, name))
    return out


def _cgroup_mounts(proc_root: str, sys_root: str) -> dict[str, list[tuple[str, str]]]:
    """Mount points (and the hierarchy path each shows as its root) of cgroup v2 and of the v1
    memory controller, from proc_root/self/mountinfo; the usual places under sys_root without it."""
    found: dict[str, list[tuple[str, str]]] = {"v2": [], "v1": []}
    try:
        with open(os.path.join(proc_root, "self", "mountinfo")) as f:
            for line in f:
                pre, _, post = line.partition(" - ")
                fields, tail = pre.split(), post.split()
                if len(fields) < 5 or len(tail) < 3:
                    continue
                root, point = fields[3], fields[4].replace("\\040", " ")
                if tail[0] == "cgroup2":
                    found["v2"].append((point, root))
                elif tail[0] == "cgroup" and "memory" in tail[2].split(","):
                    found["v1"].append((point, root))
    except OSError:
        found = {"v2": [(sys_root, "/")], "v1": [(os.path.join(sys_root, "memory"), "/")]}
    return found


def _fmt(n: int) -> str:
    return f"{n} bytes ({n / 2**30:.3g} GiB)"


def check_loader_limits(source: Any, *, batch_size: int, world_size: int, prefetch: int, num_threads: int,
                        streams: int, batch_bytes: int, prefetch_origin: str = "") -> None:
    """Refuses values that would overflow a size in the core or cannot be held in memory; each
    error names the argument and its value (prefetch_origin says where a default prefetch came
    from). `batch_bytes`: one full batch, every part (fastload._C.BatchLayout.batch_bytes). Runs
    before the engine is built."""
    if num_threads > MAX_THREADS:
        raise ValueError(f"num_threads must be at most {MAX_THREADS} (more threads only contend for "
                         f"memory bandwidth), got {num_threads}")
    if prefetch > MAX_PREFETCH:
        raise ValueError(f"prefetch must be at most {MAX_PREFETCH}, got {prefetch}")
    if streams > MAX_STREAMS:
        raise ValueError(f"streams must be at most {MAX_STREAMS}, got {streams}")
    check_batch_limits(source, batch_size=batch_size, world_size=world_size)
    limit = memory_limit()
    one = batch_bytes
    if one > limit:
        raise MemoryError(f"a batch of batch_size={batch_size} takes {_fmt(one)}, more than this machine's memory "
                          f"({_fmt(limit)}); lower batch_size")
    if one * (prefetch + 1) > limit:
        raise MemoryError(f"prefetch={prefetch}{prefetch_origin} keeps up to {prefetch + 1} batches of {_fmt(one)} "
                          f"in memory, more than this machine's memory ({_fmt(limit)}); lower prefetch or batch_size")


def check_batch_limits(source: Any, *, batch_size: int, world_size: int) -> None:
    """Sizes the sampler and the batch layout must be able to hold (before either is made)."""
    if world_size > MAX_GLOBAL_BATCH:
        raise ValueError(f"world_size must be at most 2**40, got {world_size}")
    if batch_size > MAX_GLOBAL_BATCH:
        raise ValueError(f"batch_size must be at most 2**40, got {batch_size}")
    if batch_size * world_size > MAX_GLOBAL_BATCH:
        raise ValueError(f"batch_size * world_size must be at most 2**40, got batch_size={batch_size} "
                         f"and world_size={world_size}")
    if len(source) > MAX_SAMPLES:
        raise ValueError(f"source has {len(source)} samples; fastload takes at most 2**62 (positions, padding "
                         f"and resume points must stay within int64)")
