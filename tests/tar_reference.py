"""A slow reference for tar shards: members read with Python's tarfile and grouped by
WebDataset's rule (its base_plus_ext regex), and a shard writer over tarfile."""
from __future__ import annotations

import io
import json
import os
import re
import tarfile
import time

import numpy as np

_SPLIT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext


def tarfile_members(path) -> list[tuple[str, int, int]]:
    """(name, data offset, size) of every regular member, as tarfile reads them."""
    with tarfile.open(path, "r:") as t:
        return [(m.name, m.offset_data, m.size) for m in t.getmembers() if m.isreg()]


def reference_samples(paths) -> list[dict]:
    """Every sample of the shards in order: {"__key__": key, field: bytes, ...}."""
    out: list[dict] = []
    for path in paths:
        with tarfile.open(path, "r:") as t:
            current = None
            for m in t.getmembers():
                if not m.isreg():
                    continue
                if "/" not in m.name and m.name.startswith("__") and m.name.endswith("__"):
                    continue
                match = _SPLIT.match(m.name)
                if not match or not match.group(2):
                    continue
                key, field = match.group(1), match.group(2).lower()
                if current is None or current["__key__"] != key:
                    current = {"__key__": key}
                    out.append(current)
                assert field not in current
                current[field] = t.extractfile(m).read()
    return out


def npy_bytes(a: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, a)
    return f.getvalue()


def write_shard(path, samples, fmt=tarfile.PAX_FORMAT, extra_members=()) -> str:
    """A tar of samples [(key, {field: bytes})], members in sample order, plus extra (name, bytes)
    members first (folders, metadata). A fresh modification time each call (a rewrite is seen)."""
    with tarfile.open(path, "w", format=fmt) as t:
        for name, data in extra_members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        for key, fields in samples:
            for field, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{field}")
                info.size = len(data)
                info.mtime = 1_700_000_000
                t.addfile(info, io.BytesIO(data))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, max(st.st_mtime_ns, time.time_ns()) + 1_000_000))
    return str(path)


def every_kind_sample(i: int, prefix: str = "s") -> tuple[str, dict]:
    """One sample with a field of every kind fl.Tar reads."""
    return (f"{prefix}{i:05d}", {
        "cls": f"{i % 10}\n".encode(),
        "txt": f"caption {i} é".encode(),
        "json": json.dumps({"i": i, "tags": ["a", str(i)]}).encode(),
        "npy": npy_bytes(np.arange(6, dtype=np.float32).reshape(2, 3) + i),
        "jpg": bytes([i % 256]) * (i % 7 + 1),
        "pyd": b"\x80\x04K" + bytes([i % 256]) + b".",
        "bin": os.urandom(0) + i.to_bytes(4, "little"),
    })


def write_every_kind(folder, shards=3, per_shard=(5, 7, 4), fmt=tarfile.PAX_FORMAT) -> list[str]:
    paths, i = [], 0
    for s in range(shards):
        samples = []
        for _ in range(per_shard[s % len(per_shard)]):
            samples.append(every_kind_sample(i))
            i += 1
        paths.append(write_shard(os.path.join(folder, f"train-{s:06d}.tar"), samples, fmt=fmt))
    return paths
