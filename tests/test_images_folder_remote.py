"""fl.ImageFolder over object storage, against the real servers of the tests (moto's S3 server
behind the fault proxy of tests/s3_proxy.py, the GCS emulator, Python's file server): the same
classes, samples and batches, byte for byte, as fl.ImageFolder over the same folder read locally
(ranks, threads, order="block", a later epoch, resume mid-epoch, a Mix, a cache smaller than the
folder, faults retried, a pickle); a deleted object is FileNotFoundError naming its URL; a
rewritten one is refused; credentials stay out of pickles."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from image_reference import encode, needs_native_decoders, photo, write

import fastload as fl
from remote_helpers import resume_equals_local, S3_CLIENTS, FolderServer, batches, equal, new_bucket, opts, upload_dir

pytestmark = needs_native_decoders()
boto3 = pytest.importorskip("boto3")

# Keys whose listing order is not torchvision's: "zebra/sub/..." lists before "zebra/tz.png",
# but torchvision reads a folder's own files before its subfolders'.
TREE = ["zebra/tz.png", "zebra/a.PNG", "zebra/sub/c.jpeg", "zebra/sub/deeper/d.JPG", "zebra/sub-x/e.jpg",
        "apple/x.webp", "apple/.hidden.png", "apple/y.jpg", "Mango/m.png", "mango/n.jpg", "kiwi/only/k.jpg",
        "kiwi/k2.jpeg"]
NOT_IMAGES = ["apple/notes.txt", "apple/v.jpg.bak", "not_a_class.png"]


def _image(rel: str, k: int) -> bytes:
    pixels = photo(40 + 3 * k, 52 + 2 * k, seed=k)
    if rel.lower().endswith((".jpg", ".jpeg")):
        return encode(pixels, "JPEG", quality=90)
    return encode(pixels, "WEBP" if rel.endswith(".webp") else "PNG")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    for k, rel in enumerate(TREE):
        write(root / rel, _image(rel, k))
    for rel in NOT_IMAGES:
        write(root / rel, b"not an image" if not rel.endswith(".png") else _image(rel, 99))
    return root


def _bucket(endpoint):
    return new_bucket(endpoint, tag="i")


def _batches(loader, epoch=None):
    return batches(loader, epoch)


def _equal(a, b):
    equal(a, b, nonempty=True)


def _same_layout(remote, local, base: str, root) -> None:
    assert remote.classes == local.classes == ["Mango", "apple", "kiwi", "mango", "zebra"]
    assert remote.class_to_idx == local.class_to_idx
    assert remote.samples == [(f"{base}/{os.path.relpath(p, root)}", c) for p, c in local.samples]
    assert remote.targets == local.targets and len(remote) == len(local) == len(TREE)


SPEC = fl.Image(24, flip=0.5)


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_classes_samples_and_batches_equal_the_local_folder(tree, s3_server, s3_proxy, tmp_path, client):
    bucket, s3 = _bucket(s3_server[0])
    upload_dir(s3, bucket, "train", tree)
    s3_proxy.reset_counts()
    remote = fl.ImageFolder(f"s3://{bucket}/train", image=SPEC, storage_options=opts(s3_proxy.url, client=client),
                            cache_dir=tmp_path / "cache")
    assert s3_proxy.requests == 1  # one listing, no object read at open
    local = fl.ImageFolder(tree, image=SPEC)
    _same_layout(remote, local, f"s3://{bucket}/train", tree)
    for rank in range(3):
        kw = dict(batch_size=3, shuffle=True, seed=5, rank=rank, world_size=3, num_threads=2, with_index=True,
                  device="cpu")
        _equal(_batches(fl.Loader(remote, **kw)), _batches(fl.Loader(local, **kw)))
    for order in ("block", "random"):
        kw = dict(batch_size=4, shuffle=True, seed=7, order=order, num_threads=3, device="cpu")
        _equal(_batches(fl.Loader(remote, **kw), epoch=1), _batches(fl.Loader(local, **kw), epoch=1))
    stats = remote.storage_stats()  # each image fetched once: the cache holds the folder
    assert stats.bytes_fetched == sum(os.path.getsize(tree / rel) for rel in TREE)
    assert stats.evictions == 0
    # Fetched ahead along the plan: the fetcher reads sample i as file i (FileSet.shards_read(
    # per_sample=True)); read as one shard of the source, it would know of file 0 only.
    assert stats.prefetched >= 2, stats


def test_resume_a_mix_a_small_cache_faults_and_a_pickle(tree, s3_server, s3_proxy, tmp_path):
    bucket, s3 = _bucket(s3_server[0])
    upload_dir(s3, bucket, "train", tree)
    largest = max(os.path.getsize(tree / rel) for rel in TREE)
    limit = 3 * largest  # three of the twelve images
    remote = fl.ImageFolder(f"s3://{bucket}/train/", image=SPEC, storage_options=opts(s3_proxy.url),
                            cache_dir=tmp_path / "cache", cache_limit=limit)
    local = fl.ImageFolder(tree, image=SPEC)
    s3_proxy.arm("503", match=".jp", times=3)
    kw = dict(batch_size=2, shuffle=True, seed=3, num_threads=1, device="cpu")
    _equal(_batches(fl.Loader(remote, **kw)), _batches(fl.Loader(local, **kw)))
    stats = remote.storage_stats()
    assert stats.cached_bytes <= limit and stats.evictions > 0
    resume_equals_local(remote, local, 3, **kw)
    # A Mix: the folder's share of the plan (its own sample ids) is what its fetcher follows.
    other = tmp_path / "other"
    for k in range(5):
        write(other / f"c{k % 2}" / f"{k}.png", encode(photo(30, 30, seed=50 + k)))
    small = fl.ImageFolder(other, image=SPEC)
    mkw = dict(batch_size=4, steps=6, seed=2, device="cpu", num_threads=2)
    _equal(_batches(fl.Loader(fl.Mix([remote, small], weights=[0.7, 0.3]), **mkw)),
           _batches(fl.Loader(fl.Mix([local, small], weights=[0.7, 0.3]), **mkw)))
    back = pickle.loads(pickle.dumps(remote))
    _same_layout(back, local, f"s3://{bucket}/train", tree)
    _equal(_batches(fl.Loader(back, batch_size=5, seed=1, device="cpu")),
           _batches(fl.Loader(local, batch_size=5, seed=1, device="cpu")))


def test_gs_and_http_folders(tree, gcs_server, tmp_path):
    local = fl.ImageFolder(tree, image=SPEC)
    kw = dict(batch_size=4, shuffle=True, seed=9, num_threads=2, with_index=True, device="cpu")
    reference = _batches(fl.Loader(local, **kw))
    bucket = gcs_server.bucket()
    gcs_server.put_dir(bucket, "train", tree)
    gs = fl.ImageFolder(f"gs://{bucket}/train", image=SPEC, storage_options={"endpoint_url": gcs_server.url,
                                                                             "anon": True},
                        cache_dir=tmp_path / "c1")
    _same_layout(gs, local, f"gs://{bucket}/train", tree)
    _equal(_batches(fl.Loader(gs, **kw)), reference)

    with FolderServer(tree) as server:
        base = server.url + "/"
        with pytest.raises(ValueError, match=r"http\(s\):// has no listing; pass files="):
            fl.ImageFolder(base, image=SPEC)
        # The files named: paths below the root or URLs; what is not an image is left out, as locally.
        named = [rel if k % 2 else base + rel for k, rel in enumerate(TREE + NOT_IMAGES)]
        web = fl.ImageFolder(base, image=SPEC, files=named, storage_options={"backoff": 0.01},
                             cache_dir=tmp_path / "c2")
        _same_layout(web, local, server.url, tree)
        _equal(_batches(fl.Loader(web, **kw)), reference)
        with pytest.raises(ValueError, match=r"files\[0\] = 'http://elsewhere/x.jpg' is not a file below the root"):
            fl.ImageFolder(base, image=SPEC, files=["http://elsewhere/x.jpg"])


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_an_image_deleted_after_open_names_its_url(tree, s3_server, tmp_path, client):
    bucket, s3 = _bucket(s3_server[0])
    upload_dir(s3, bucket, "train", tree)
    remote = fl.ImageFolder(f"s3://{bucket}/train", image=SPEC, storage_options=opts(s3_server[0], client=client),
                            cache_dir=tmp_path / "cache")
    s3.delete_object(Bucket=bucket, Key="train/kiwi/only/k.jpg")
    loader = fl.Loader(remote, batch_size=4, num_threads=2, device="cpu")
    with pytest.raises(FileNotFoundError, match=rf"s3://{bucket}/train/kiwi/only/k\.jpg: no such object") as e:
        _batches(loader)
    assert "cached copy" not in str(e.value)


def test_an_image_rewritten_after_open_is_refused(tree, s3_server, tmp_path):
    bucket, s3 = _bucket(s3_server[0])
    upload_dir(s3, bucket, "train", tree)
    remote = fl.ImageFolder(f"s3://{bucket}/train", image=SPEC, storage_options=opts(s3_server[0]),
                            cache_dir=tmp_path / "cache")
    blob = pickle.dumps(remote)
    s3.put_object(Bucket=bucket, Key="train/apple/y.jpg", Body=_image("y.jpg", 42))
    with pytest.raises(RuntimeError, match=rf"s3://{bucket}/train/apple/y\.jpg: the object changed since the "
                                           "source was opened"):
        _batches(fl.Loader(remote, batch_size=4, device="cpu"))
    with pytest.raises(ValueError, match=rf"s3://{bucket}/train/apple/y\.jpg: the object changed since this "
                                         "ImageFolder was pickled or copied"):
        pickle.loads(blob)


def test_credentials_never_travel_and_bad_arguments(tree, s3_server, tmp_path):
    bucket, s3 = _bucket(s3_server[0])
    upload_dir(s3, bucket, "train", tree)
    secret = "SECRETsecretSECRET0123456789"  # the fixture's, passed as options too
    remote = fl.ImageFolder(f"s3://{bucket}/train", image=SPEC, cache_dir=tmp_path / "cache",
                            storage_options=opts(s3_server[0], key="testing-key-id", secret=secret))
    blob = pickle.dumps(remote)
    assert secret.encode() not in blob and b"testing-key-id" not in blob
    assert secret not in repr(remote)
    assert len(pickle.loads(blob)) == len(TREE)  # the copy takes them from its own chain
    with pytest.raises(ValueError, match="are for a root in object storage"):
        fl.ImageFolder(tree, image=SPEC, cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match="files= names the images of an http"):
        fl.ImageFolder(f"s3://{bucket}/train", image=SPEC, files=["a/b.jpg"], storage_options=opts(s3_server[0]))
    with pytest.raises(FileNotFoundError, match="no objects under this prefix"):
        fl.ImageFolder(f"s3://{bucket}/nothing", image=SPEC, storage_options=opts(s3_server[0]))
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder"):
        fl.ImageFolder(f"s3://{bucket}/train/zebra/sub/deeper", image=SPEC, storage_options=opts(s3_server[0]))
    with pytest.raises(FileNotFoundError, match="Found no valid file for the classes mango. Supported extensions are: .png, .jpeg"):
        fl.ImageFolder(f"s3://{bucket}/train", image=SPEC, extensions=(".png", ".jpeg"),
                       storage_options=opts(s3_server[0]))
    few = fl.ImageFolder(f"s3://{bucket}/train", image=SPEC, extensions=(".png",), allow_empty=True,
                         storage_options=opts(s3_server[0]), cache_dir=tmp_path / "c3")
    assert few.samples == [(s, c) for s, c in remote.samples if s.lower().endswith(".png")]


def test_crop_none_reads_the_first_images_size(s3_server, tmp_path):
    root = tmp_path / "same"
    for k in range(4):
        write(root / f"c{k % 2}" / f"{k}.png", encode(photo(20, 28, seed=k)))
    bucket, s3 = _bucket(s3_server[0])
    upload_dir(s3, bucket, "same", root)
    remote = fl.ImageFolder(f"s3://{bucket}/same", image=fl.Image(crop="none"), storage_options=opts(s3_server[0]),
                            cache_dir=tmp_path / "cache")
    got = _batches(fl.Loader(remote, batch_size=4, device="cpu"))
    want = _batches(fl.Loader(fl.ImageFolder(root, image=fl.Image(crop="none")), batch_size=4, device="cpu"))
    _equal(got, want)
    assert got[0]["image"].shape == (4, 20, 28, 3)
    assert np.array_equal(got[0]["label"].numpy(), [0, 0, 1, 1])


def test_the_pages_example_runs_as_written(tree, s3_server, tmp_path, capsys):
    """docs/images.md's "Image folders in object storage" block, with its bucket, ENDPOINT and
    CACHE those of the test's S3 server."""
    import pathlib
    import re

    page = (pathlib.Path(__file__).parent.parent / "docs" / "images.md").read_text()
    section = page.split("## Image folders in object storage", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    bucket, s3 = _bucket(s3_server[0])
    upload_dir(s3, bucket, "imagenet/train", tree)
    code = block.replace("s3://my-bucket/", f"s3://{bucket}/")
    exec(compile(code, "docs/images.md", "exec"), {"ENDPOINT": s3_server[0], "CACHE": tmp_path / "cache"})
    lines = capsys.readouterr().out.splitlines()
    local = fl.ImageFolder(tree, image=fl.Image(224))
    assert lines[0] == f"{local.classes} {len(TREE)} ('s3://{bucket}/imagenet/train/Mango/m.png', 0)"
    assert lines[1].startswith(f"({len(TREE)}, 224, 224, 3) [") and len(lines) == 2
    labels = [int(v) for v in lines[1].split("[")[1].rstrip("]").split(",")]
    assert sorted(labels) == sorted(local.targets)


def test_the_cache_walk_finds_complete_files_in_nested_folders(tmp_path):
    """ObjectCache.scan (walked before each eviction; an image folder's copies sit in folders of
    1,000): every complete file by its relative name and size, never a lock file, a partial
    download, the manifest, or what a link to a folder holds."""
    from fastload._storage.cache import ObjectCache

    root = tmp_path / "c"
    files = {"0000/0000000-a.jpg": 3, "0000/0000001-b.png": 5, "0001/0001000-c.jpg": 7, "top.bin": 1}
    for rel, n in files.items():
        write(root / rel, b"x" * n)
    write(root / "0000/0000000-a.jpg.lock", b"")
    write(root / "0001/0001000-c.jpg.part-123-abc", b"partial")
    write(root / "manifest.json", b"{}")
    write(tmp_path / "elsewhere/e.jpg", b"e" * 9)
    os.symlink(tmp_path / "elsewhere", root / "linked")
    cache = ObjectCache(str(root))
    assert cache.scan() == {rel.replace("/", os.sep): n for rel, n in files.items()}


def test_many_small_files_evict_a_sixteenth_at_once_within_the_limit(tmp_path, monkeypatch):
    """The fetcher with 600 small files and room for 128: every file it hands out is present
    and whole, the cache never holds more than its limit, the files evicted at the first eviction
    are those the plan needs furthest ahead, and the folder is walked once per many downloads (a
    16th of the cache freed at once), not once per download."""
    from fastload._storage.cache import Entry, ObjectCache
    from fastload._storage.client_protocol import Client
    from fastload._storage.fetcher import Fetcher
    from fastload._storage.urls import Url

    n, size = 600, 100
    limit = 128 * size

    class Memory(Client):
        concurrency, requests = 4, 0

        def __init__(self):
            pass

        def get_whole(self, url, out, expected=None, check=None, version=None):
            self.requests += 1
            out.write(bytes([int(url.key[1:]) % 251]) * size)
            return size

    walks = [0]
    scan = ObjectCache.scan
    monkeypatch.setattr(ObjectCache, "scan", lambda self: (walks.__setitem__(0, walks[0] + 1), scan(self))[1])
    cache = ObjectCache(str(tmp_path / "c"))
    f = Fetcher(Memory(), cache, [Entry(Url("s3", "b", f"k{i}"), f"f{i}", size) for i in range(n)],
                [[i] for i in range(n)], limit)
    seq = np.random.default_rng(1).integers(0, n, 1500)
    pos = [0]
    f.start_epoch(seq, lambda: pos[0], prefetch=False)
    first, own = None, 0
    for p, i in enumerate(seq.tolist()):
        pos[0] = p
        before = set(scan(cache)) if first is None else None
        f.provide(i)
        assert (tmp_path / "c" / f"f{i}").read_bytes() == bytes([i % 251]) * size
        if first is None or p % 10 == 0:
            on_disk = set(scan(cache))
            assert len(on_disk) * size <= limit
        if first is None and before - on_disk:
            first = before - on_disk
            later = {k: next((q for q in range(p, len(seq)) if seq[q] == k), len(seq)) for k in
                     (int(r[1:]) for r in before)}
            furthest = sorted(later, key=lambda k: -later[k])[:len(first)]
            assert sorted(later[int(r[1:])] for r in first) == sorted(later[k] for k in furthest)
    assert first is not None and len(first) >= limit // 16 // size
    misses = f.stats(walk=False).misses
    assert misses > 600 and walks[0] < misses // 3, (walks[0], misses)
    f.stop()
