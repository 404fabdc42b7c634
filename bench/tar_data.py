"""The data and the server of bench/bench_tar.py: WebDataset tar shards of a given size (small
samples: a 1 KiB .npy and a .cls; photo-like ~100 KB JPEGs and a .cls), a fastload dataset
directory of the same small samples (the local directory the first batch is compared with), each
made once under a data folder; moto's S3 server on 127.0.0.1 with shards uploaded to it."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

SMALL_FLOATS = 256  # a 1 KiB float32 row
# A member's bytes in the tar: npy = 128 header + 1,024 data -> header block + 3 blocks; cls -> 2 blocks.
SMALL_SAMPLE_BYTES = 6 * 512
JPEG_SIZE = (375, 500)  # ImageNet's most common shape; quality 87 gives ~100 KB of photo-like content
JPEG_QUALITY = 87


def _member(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_700_000_000
    pad = (-len(data)) % 512
    return info.tobuf(format=tarfile.USTAR_FORMAT) + data + b"\0" * pad


def _npy_bytes(i: int) -> bytes:
    f = io.BytesIO()
    np.save(f, np.full(SMALL_FLOATS, i, dtype=np.float32))
    return f.getvalue()


def samples_per_small_shard(shard_mib: int) -> int:
    return shard_mib * 2**20 // SMALL_SAMPLE_BYTES


def _write_atomically(path: Path, parts) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        for p in parts:
            f.write(p)
        f.write(b"\0" * 1024)  # the end-of-archive blocks
    os.replace(tmp, path)


def _digits(values, width: int, base: int = 10):
    """ASCII digits of each value, zero-padded to width: (len(values), width) uint8."""
    powers = base ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return ((values[:, None] // powers) % base + 48).astype(np.uint8)


def _set_checksums(records, at: int) -> None:
    """Writes the ustar header checksum of the header at byte `at` of every record (as tarfile
    does: the sum of the header's bytes with the field as spaces, then "%06o\\0 ")."""
    records[:, at + 148:at + 156] = 32
    sums = records[:, at:at + 512].sum(axis=1, dtype=np.int64)
    records[:, at + 148:at + 154] = _digits(sums, 6, 8)
    records[:, at + 154] = 0


def _small_records(first: int, count: int):
    """The tar bytes of samples first..first+count-1, one 3,072-byte row each, built with numpy
    from one sample's headers (the keys, the data, the .cls text and size and the checksums
    patched): the same bytes tarfile writes, at disk speed."""
    i = np.arange(first, first + count, dtype=np.int64)
    cls_text = np.array([str(c).encode() for c in range(1000)], dtype="S3")[i % 1000]
    rec = np.zeros((count, SMALL_SAMPLE_BYTES), dtype=np.uint8)
    rec[:, 0:512] = np.frombuffer(_member("000000000.npy", _npy_bytes(0))[:512], np.uint8)
    rec[:, 512:640] = np.frombuffer(_npy_bytes(0)[:128], np.uint8)
    rec[:, 640:1664] = np.repeat(i.astype(np.float32)[:, None], SMALL_FLOATS, axis=1).view(np.uint8)
    rec[:, 2048:2560] = np.frombuffer(_member("000000000.cls", b"0")[:512], np.uint8)
    rec[:, 2560:2563] = cls_text[:, None].view(np.uint8).reshape(count, 3)
    lengths = np.char.str_len(cls_text)
    rec[:, 2048 + 124:2048 + 135] = _digits(lengths, 11, 8)  # the .cls member's size
    for at in (0, 2048):
        rec[:, at:at + 9] = _digits(i, 9)  # the key
        _set_checksums(rec, at)
    return rec


def make_small(folder: Path, shards: int, shard_mib: int) -> list[str]:
    """`shards` tars of `shard_mib` MiB: sample i = i:09d.npy (256 float32s, all i) + .cls (i % 1000).
    Made once (a shard that exists is kept: its name says its size)."""
    folder.mkdir(parents=True, exist_ok=True)
    per = samples_per_small_shard(shard_mib)
    paths = []
    t0 = time.perf_counter()
    for s in range(shards):
        path = folder / f"small-{shard_mib}m-{s:06d}.tar"
        if not path.exists():
            _write_atomically(path, [_small_records(s * per, per).tobytes()])
        paths.append(str(path))
    if time.perf_counter() - t0 > 1:
        print(f"made {shards} small-sample shards in {time.perf_counter() - t0:.0f} s", flush=True)
    return paths


def make_small_dataset(folder: Path, shards: int, shard_mib: int) -> str:
    """A fastload dataset directory of the same samples as make_small's shards (npy, cls columns),
    one dataset shard per tar shard."""
    import fastload as fl

    path = folder / f"small-{shard_mib}m-{shards}-dir"
    if path.exists():
        return str(path)
    per = samples_per_small_shard(shard_mib)
    with fl.DatasetWriter(path, rows_per_shard=per, fsync=False) as w:
        for s in range(shards):
            i = np.arange(s * per, (s + 1) * per)
            w.append({"npy": np.repeat(i.astype(np.float32)[:, None], SMALL_FLOATS, axis=1),
                      "cls": (i % 1000).astype(np.int64)})
    return str(path)


def _photo_bases(rng, count: int, size: int) -> list:
    """Photo-like pictures (bench_images.py's: 1/f noise, discs, grain): every 8x8 block has detail."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_images import _bases

    return _bases(rng, count, size, size)


def make_jpegs(folder: Path, shards: int, shard_mib: int) -> list[str]:
    """`shards` tars of about `shard_mib` MiB of 500x375 photo-like JPEGs (quality 87) + .cls."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"jpg-{shard_mib}m-{s:06d}.tar" for s in range(shards)]
    if all(p.exists() for p in paths):
        return [str(p) for p in paths]
    rng = np.random.default_rng(2026)
    h, w = JPEG_SIZE
    big = max(h, w) + 64
    bases = _photo_bases(rng, 6, big)
    t0, k = time.perf_counter(), 0
    for path in paths:
        def parts():
            nonlocal k
            size = 0
            while size < shard_mib * 2**20 - 200_000:
                base = bases[k % len(bases)]
                y, x = rng.integers(0, big - h), rng.integers(0, big - w)
                img = base[y:y + h, x:x + w] * rng.uniform(0.8, 1.2, 3) + rng.normal(0, 3, (h, w, 3))
                f = io.BytesIO()
                Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(f, format="JPEG", quality=JPEG_QUALITY)
                for m in (_member(f"{k:09d}.jpg", f.getvalue()), _member(f"{k:09d}.cls", str(k % 1000).encode())):
                    size += len(m)
                    yield m
                k += 1
        _write_atomically(path, parts())
    print(f"made {k} JPEGs in {len(paths)} shards in {time.perf_counter() - t0:.0f} s", flush=True)
    return [str(p) for p in paths]


# ------------------------------------------------------------------------------ the S3 server
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": "SECRETsecretSECRET0123456789",
               "AWS_DEFAULT_REGION": "us-east-1"}


def start_moto(ranges: bool) -> tuple[subprocess.Popen, str]:
    """moto's S3 server on 127.0.0.1 and a free port, objects kept in memory: moto's own
    (`python -m moto.server`, as the tests run it), or with ranges=True the benchmarks' moto whose
    ranged GETs read their bytes only (s3_counting_server.py, moto_ranges.py): stock moto copies
    the whole object for each range, which charges a loader that fetches in ranged parts for
    moto's copy. Started by remote_peers.start_server, as bench_remote starts it."""
    from remote_peers import start_server  # noqa: PLC0415 - a sibling script of bench/

    stock = None if ranges else (lambda port: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)])
    return start_server(stock)


def upload(endpoint: str, bucket: str, paths: list[str]) -> list[str]:
    """Puts the shards in the bucket (made if missing); returns their s3:// URLs."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, **_client_credentials())
    if bucket not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
        s3.create_bucket(Bucket=bucket)
    urls = []
    for p in paths:
        key = os.path.basename(p)
        s3.upload_file(p, bucket, key)
        urls.append(f"s3://{bucket}/{key}")
    return urls


def count_samples(paths: list[str]) -> int:
    """Samples (distinct keys) in the shards, by tarfile: the GET ceiling's samples per byte."""
    keys = set()
    for p in paths:
        with tarfile.open(p) as t:
            keys.update((p, n.split(".", 1)[0]) for n in t.getnames())
    return len(keys)


def presigned(endpoint: str, url: str) -> str:
    """An http URL that GETs the object without signing (curl, webdataset's pipe:)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, **_client_credentials())
    bucket, key = url[len("s3://"):].split("/", 1)
    return s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=86400)


def _client_credentials() -> dict:
    return {"aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"], "region_name": "us-east-1"}
