"""memory_limit(): the process's own cgroup limit (v2 and v1, nested, through a mount that shows
only part of the hierarchy), read from a fake /proc and cgroup tree."""
from __future__ import annotations

import os

import pytest

from fastload._arguments import _memory_limit, memory_limit

GiB = 2**30
PHYS = 64 * GiB


def tree(tmp_path, cgroup, files, mountinfo=None):
    """A fake /proc/self/cgroup (and mountinfo if given) and cgroup files under tmp_path/sys."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    if mountinfo is not None:
        (proc / "self" / "mountinfo").write_text(mountinfo.format(sys=tmp_path / "sys"))
    for rel, text in files.items():
        f = tmp_path / "sys" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return str(proc), str(tmp_path / "sys")


def limit(tmp_path, cgroup, files, mountinfo=None):
    proc, sys_root = tree(tmp_path, cgroup, files, mountinfo)
    return _memory_limit(proc, sys_root, physical=PHYS)


def test_v2_reads_the_process_cgroup_not_the_root(tmp_path):
    files = {"memory.max": "max\n", "job.slice/job-1.scope/memory.max": f"{GiB}\n"}
    assert limit(tmp_path, "0::/job.slice/job-1.scope\n", files) == GiB


def test_v2_a_parent_limit_applies_to_the_children(tmp_path):
    files = {"kubepods/memory.max": f"{2 * GiB}\n", "kubepods/pod1/memory.max": "max\n",
             "kubepods/pod1/ctr/memory.max": "max\n"}
    assert limit(tmp_path, "0::/kubepods/pod1/ctr\n", files) == 2 * GiB


def test_v2_the_smallest_of_the_chain_wins(tmp_path):
    files = {"a/memory.max": f"{4 * GiB}\n", "a/b/memory.max": f"{GiB}\n", "a/b/c/memory.max": f"{3 * GiB}\n"}
    assert limit(tmp_path, "0::/a/b/c\n", files) == GiB


def test_v2_max_everywhere_or_missing_files_is_physical_memory(tmp_path):
    assert limit(tmp_path, "0::/a/b\n", {"a/memory.max": "max\n"}) == PHYS
    assert limit(tmp_path / "2", "0::/nowhere\n", {}) == PHYS


def test_a_limit_above_physical_memory_does_not_raise_it(tmp_path):
    assert limit(tmp_path, "0::/a\n", {"a/memory.max": f"{2 * PHYS}\n"}) == PHYS


def test_v1_memory_controller_under_its_mount(tmp_path):
    cgroup = "12:pids:/x\n5:cpu,cpuacct:/slurm/uid_1/job_7\n4:memory:/slurm/uid_1/job_7\n0::/\n"
    files = {"memory/memory.limit_in_bytes": "9223372036854771712\n",
             "memory/slurm/uid_1/memory.limit_in_bytes": f"{8 * GiB}\n",
             "memory/slurm/uid_1/job_7/memory.limit_in_bytes": f"{3 * GiB}\n",
             "cpu,cpuacct/slurm/uid_1/job_7/memory.limit_in_bytes": "1\n"}  # not the memory controller
    assert limit(tmp_path, cgroup, files) == 3 * GiB


def test_v1_and_v2_together_take_the_smaller(tmp_path):
    cgroup = "4:memory:/a\n0::/b\n"
    files = {"memory/a/memory.limit_in_bytes": f"{5 * GiB}\n", "b/memory.max": f"{2 * GiB}\n"}
    assert limit(tmp_path, cgroup, files) == 2 * GiB


def test_mountinfo_places_the_hierarchies(tmp_path):
    # A container: the memory hierarchy's /docker/abc is mounted at .../sys/mem, and cgroup2 at .../sys/unified.
    mountinfo = ("35 31 0:32 /docker/abc {sys}/mem rw,relatime - cgroup cgroup rw,memory\n"
                 "32 31 0:29 / {sys}/cpu rw,relatime - cgroup cgroup rw,cpu\n"
                 "41 31 0:38 / {sys}/unified rw,relatime - cgroup2 cgroup2 rw\n")
    cgroup = "4:memory:/docker/abc/inner\n1:cpu:/docker/abc\n0::/\n"
    files = {"mem/inner/memory.limit_in_bytes": f"{GiB}\n", "mem/memory.limit_in_bytes": f"{6 * GiB}\n",
             "cpu/memory.limit_in_bytes": "1\n", "unified/memory.max": "max\n"}
    assert limit(tmp_path, cgroup, files, mountinfo) == GiB


def test_mountinfo_a_cgroup_outside_the_mount_reads_the_mount_top(tmp_path):
    mountinfo = "35 31 0:32 /docker/abc {sys}/mem rw - cgroup cgroup rw,memory\n"
    files = {"mem/memory.limit_in_bytes": f"{2 * GiB}\n"}
    assert limit(tmp_path, "4:memory:/elsewhere\n", files, mountinfo) == 2 * GiB


@pytest.mark.parametrize("cgroup", ["", "garbage\n", "0::relative\n", "4:memory\n"])
def test_unreadable_or_malformed_cgroup_files_mean_physical_memory(tmp_path, cgroup):
    assert limit(tmp_path, cgroup, {"memory.max": f"{GiB}\n"}) == PHYS


@pytest.mark.parametrize("text", ["", "-1\n", "abc\n", "0\n", "1.5e9\n"])
def test_malformed_limit_files_are_ignored(tmp_path, text):
    assert limit(tmp_path, "0::/a\n", {"a/memory.max": text}) == PHYS


def test_no_proc_means_physical_memory(tmp_path):
    assert _memory_limit(str(tmp_path / "none"), str(tmp_path / "none"), physical=PHYS) == PHYS


def test_the_public_limit_is_cached_and_at_most_physical_memory():
    assert memory_limit() == memory_limit() > 0
    assert memory_limit() <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
