"""Facts about this machine and process, read from the system and the environment: the memory
it may use (its cgroups' limits), the CPUs it may run on, and what a launcher tells about the
job's processes on this node. A leaf: it imports nothing else from fastload, so every module may
read it."""
from __future__ import annotations

import functools
import os
import re

import torch

INT64_MAX = 2**63 - 1


def env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def torch_sees_gpu() -> bool:
    """Whether PyTorch can use a GPU, asked without initialising CUDA: the one place fastload asks."""
    return torch.cuda.is_available()


def torch_gpu_count() -> int:
    """The GPUs PyTorch can use (0 without one), asked without initialising CUDA."""
    return torch.cuda.device_count() if torch_sees_gpu() else 0


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_share() -> int:
    """The CPU budget every thread fastload starts is sized from: the CPUs this process may use,
    shared among this job's processes on this node. The collation threads default to all of it
    (num_threads=None); a Parquet source's decode threads and fl.Pack's scan threads to a few of
    it (helper_threads). Object storage's download threads wait on the network, not a CPU: they
    are sized by max_concurrency instead."""
    return max(1, usable_cpus() // local_world_size())


def helper_threads(most: int) -> int:
    """Threads that work beside the collation threads (decode, scan): at most `most`, and no more
    than this process's CPU share."""
    return max(1, min(most, cpu_share()))


def local_world_size() -> int:
    """How many of this job's processes run on this node, from what the launcher tells:
    LOCAL_WORLD_SIZE (torchrun), SLURM_NTASKS_PER_NODE (Slurm); where a launcher sets only
    LOCAL_RANK (Lightning, Accelerate), WORLD_SIZE over the number of nodes if one of NUM_NODES,
    SLURM_NNODES or NNODES is set, else one process per visible GPU (at most WORLD_SIZE)."""
    local = env_int("LOCAL_WORLD_SIZE")
    if local:
        return local
    slurm = os.environ.get("SLURM_NTASKS_PER_NODE", "")
    match = re.match(r"\d+", slurm)  # e.g. "4" or "4(x2)"
    if match and int(match.group()) > 0:
        return int(match.group())
    local_rank = env_int("LOCAL_RANK")
    if local_rank is None:
        return 1
    world = env_int("WORLD_SIZE")
    nodes = next((n for n in map(env_int, ("NUM_NODES", "SLURM_NNODES", "NNODES")) if n), None)
    if world and nodes:
        share = -(-world // nodes)
    else:
        gpus = torch_gpu_count()
        share = min(world, gpus) if world and gpus else (gpus or world or 1)
    return max(share, local_rank + 1)


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


# The memory limit read from given roots (tests of _arguments read fake /proc and cgroup trees).
read_memory_limit = _memory_limit
