"""fl.Tar against a reference built with Python's tarfile: members located as tarfile locates them
(ustar, PAX, GNU long names), samples grouped by WebDataset's rule, every field type in batches."""
from __future__ import annotations

import io
import json
import os
import pickle
import tarfile

import numpy as np
import pytest

import fastload as fl
from fastload import _C
from tar_reference import (every_kind_sample, npy_bytes, reference_samples, tarfile_members, write_every_kind,
                           write_shard)

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}


def all_batches(source, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("shuffle", False)
    return list(fl.Loader(source, device="cpu", num_threads=2, **kw))


def rows(batches, name):
    out = []
    for b in batches:
        v = b[name]
        out.extend(v.tolist() if hasattr(v, "tolist") and not isinstance(v, list) else v)
    return out


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_members_are_where_tarfile_finds_them(tmp_path, fmt):
    deep = "/".join(f"folder.{i}.with.dots" for i in range(8))  # a path past ustar's 100 + 155 bytes
    names = [f"{deep}/k{i}.JPG" for i in range(3)] + ["plain/k9.cls", "x" * 150 + ".txt"]
    if fmt == "ustar":
        names = [n for n in names if len(n) <= 100 or ("/" in n and len(n.rsplit("/", 1)[1]) <= 100
                                                       and len(n.rsplit("/", 1)[0]) <= 155)]
    if fmt == "pax":
        names.append("dossier/ünïcödé.txt")
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w", format=FORMATS[fmt]) as t:
        d = tarfile.TarInfo("plain")
        d.type = tarfile.DIRTYPE
        t.addfile(d)
        for i, n in enumerate(names):
            info = tarfile.TarInfo(n)
            data = os.urandom(i * 300 + 1)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("plain/link.cls")
        link.type = tarfile.SYMTYPE
        link.linkname = "k9.cls"
        t.addfile(link)
    mine = [(n.decode(), o, s) for n, o, s in _C._tar_members(path.read_bytes(), "s.tar")]
    assert mine == tarfile_members(path)
    assert len(mine) == len(names)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_field_type_matches_the_reference(tmp_path, fmt):
    paths = write_every_kind(tmp_path, fmt=FORMATS[fmt])
    ref = reference_samples(paths)
    ds = fl.Tar(str(tmp_path / "train-{000000..000002}.tar"))
    assert len(ds) == len(ref) == 16
    assert ds.shard_rows == [5, 7, 4]
    assert ds.names == ["__key__", "cls", "txt", "json", "npy", "jpg", "pyd", "bin"]
    batches = all_batches(ds, batch_size=5)
    b = batches[0]
    assert b["cls"].dtype.is_floating_point is False and str(b["cls"].dtype) == "torch.int64"
    assert str(b["npy"].dtype) == "torch.float32" and tuple(b["npy"].shape) == (5, 2, 3)
    assert rows(batches, "__key__") == [r["__key__"] for r in ref]
    assert rows(batches, "cls") == [int(r["cls"]) for r in ref]
    assert rows(batches, "txt") == [r["txt"].decode() for r in ref]
    assert rows(batches, "json") == [json.loads(r["json"]) for r in ref]
    npy = np.concatenate([b["npy"].numpy() for b in batches])
    assert np.array_equal(npy, np.stack([np.load(io.BytesIO(r["npy"])) for r in ref]))
    for field in ("jpg", "pyd", "bin"):  # undecoded images, pickles (never unpickled), anything else
        got = rows(batches, field)
        assert all(isinstance(v, bytes) for v in got)
        assert got == [r[field] for r in ref]


def test_shuffled_batches_hold_the_samples_their_index_names(tmp_path):
    paths = write_every_kind(tmp_path)
    ref = reference_samples(paths)
    ds = fl.Tar(paths, fields=["cls", "__key__", "npy"])
    seen = []
    for b in all_batches(ds, batch_size=3, shuffle=True, seed=5, with_index=True):
        for j, i in enumerate(b["index"].tolist()):
            assert b["__key__"][j] == ref[i]["__key__"]
            assert b["cls"][j].item() == int(ref[i]["cls"])
            assert np.array_equal(b["npy"][j].numpy(), np.load(io.BytesIO(ref[i]["npy"])))
            seen.append(i)
    assert sorted(seen) == list(range(len(ref)))


def test_keys_keep_folders_with_dots_and_suffixes_are_lower_cased(tmp_path):
    samples = [("a.b/c.d/img1", {"JPG": b"1", "Seg.PNG": b"s1", "CLS": b"1"}),
               ("a.b/c.d/img2", {"JPG": b"2", "Seg.PNG": b"s2", "CLS": b"2"}),
               ("e/img1", {"JPG": b"3", "Seg.PNG": b"s3", "CLS": b"3"})]
    path = write_shard(tmp_path / "s.tar", samples,
                       extra_members=[("a.b", None), ("__meta__", b"x"), ("noext", b"y"), (".hidden", b"z")])
    ref = reference_samples([path])
    ds = fl.Tar(path)
    assert ds.names == ["__key__", "jpg", "seg.png", "cls"]
    b = all_batches(ds)[0]
    assert b["__key__"] == [r["__key__"] for r in ref] == ["a.b/c.d/img1", "a.b/c.d/img2", "e/img1"]
    assert b["seg.png"] == [b"s1", b"s2", b"s3"] and b["cls"].tolist() == [1, 2, 3]


def test_fields_select_and_order(tmp_path):
    paths = write_every_kind(tmp_path)
    ds = fl.Tar(paths, fields=["npy", "CLS"])
    assert ds.names == ["npy", "cls"] and ds.string_lists == []
    b = all_batches(ds)[0]
    assert set(b) == {"npy", "cls"}


def test_decoded_images_equal_the_decode_stage_on_the_same_bytes(tmp_path):
    image_reference = pytest.importorskip("image_reference")
    samples = []
    for i in range(6):
        jpg = image_reference.encode(image_reference.photo(40 + i, 50, seed=i), "JPEG", quality=90)
        samples.append((f"k{i}", {"jpg": jpg, "cls": str(i).encode()}))
    path = write_shard(tmp_path / "img.tar", samples)
    spec = fl.Image(24, crop="random", flip=0.5)
    ds = fl.Tar(path, fields=["jpg", "cls"], decode={"jpg": spec})
    assert ds.string_lists == []
    from fastload._images.fallback import fallback_for
    seen = 0
    for b in all_batches(ds, batch_size=4, shuffle=True, seed=3, with_index=True):
        assert b["jpg"].shape[1:] == (24, 24, 3)
        for j, i in enumerate(b["index"].tolist()):
            want, _ = _C._decode_image(samples[i][1]["jpg"], spec.native(), 3, 0, i, fallback_for(spec))
            assert np.array_equal(b["jpg"][j].numpy(), want)
            assert b["cls"][j].item() == i
            seen += 1
    assert seen == 6


def test_brace_patterns_folders_and_lists(tmp_path):
    from fastload._sources.tar_urls import expand_braces
    assert expand_braces("a-{000..002}.tar") == ["a-000.tar", "a-001.tar", "a-002.tar"]
    assert expand_braces("{a,b}-{1..2}") == ["a-1", "a-2", "b-1", "b-2"]
    assert expand_braces("x-{8..10}.tar") == ["x-8.tar", "x-9.tar", "x-10.tar"]
    with pytest.raises(ValueError, match="backwards"):
        expand_braces("{3..1}")
    paths = write_every_kind(tmp_path)
    assert fl.Tar(str(tmp_path)).shards == paths
    assert fl.Tar(paths[::-1]).shards == paths[::-1]
    with pytest.raises(ValueError, match="twice"):
        fl.Tar([paths[0], paths[0]])
    with pytest.raises(FileNotFoundError, match="no tar shard"):
        fl.Tar(str(tmp_path / "nope-{0..1}.tar"))
    with pytest.raises(ValueError, match="mixes URLs and local paths"):
        fl.Tar([paths[0], "s3://bucket/train-0.tar"])


def test_empty_shards_are_skipped_and_counted(tmp_path):
    paths = write_every_kind(tmp_path, shards=2)
    empty = write_shard(tmp_path / "empty.tar", [])
    only_meta = write_shard(tmp_path / "meta.tar", [], extra_members=[("__index__", b"x")])
    zero = tmp_path / "zero.tar"
    zero.write_bytes(b"")
    ds = fl.Tar([paths[0], empty, only_meta, str(zero), paths[1]])
    assert ds.empty_shards == [empty, only_meta, str(zero)]
    assert ds.shards == paths and len(ds) == 12
    assert "3 empty skipped" in repr(ds)
    with pytest.raises(ValueError, match="none of the 2 tar shards holds a sample"):
        fl.Tar([empty, str(zero)])


def test_the_index_is_cached_and_a_rewritten_shard_is_indexed_again(tmp_path):
    cache = tmp_path / "cache"
    (tmp_path / "d").mkdir()
    path = write_shard(tmp_path / "d" / "s.tar", [every_kind_sample(i) for i in range(4)])
    ds = fl.Tar(path, cache_dir=cache, fields=["cls", "__key__"])
    assert len(os.listdir(cache / "tar-index")) == 1
    loader = fl.Loader(ds, batch_size=4, shuffle=False, device="cpu")
    assert next(iter(loader))["cls"].tolist() == [0, 1, 2, 3]
    # Rewritten with other samples (same count): the old index must not be used.
    write_shard(path, [every_kind_sample(i + 3, prefix="t") for i in range(4)])
    with pytest.raises(ValueError, match="rewritten since it was indexed"):
        next(iter(loader))
    again = fl.Tar(path, cache_dir=cache, fields=["cls", "__key__"])
    b = all_batches(again)[0]
    assert b["cls"].tolist() == [3, 4, 5, 6] and b["__key__"][0] == "t00003"
    assert len(os.listdir(cache / "tar-index")) == 1  # the stale index was removed


def test_a_tar_pickles_and_reads_the_same(tmp_path):
    paths = write_every_kind(tmp_path)
    ds = fl.Tar(paths, fields=["__key__", "cls"])
    copy = pickle.loads(pickle.dumps(ds))
    assert all_batches(copy)[1]["__key__"] == all_batches(ds)[1]["__key__"]


def test_npy_of_another_shape_is_refused_naming_the_key(tmp_path):
    samples = [(f"k{i}", {"npy": npy_bytes(np.zeros((2, 3) if i != 3 else (3, 2), np.float32))}) for i in range(5)]
    ds = fl.Tar(write_shard(tmp_path / "s.tar", samples), fields=["npy"])
    with pytest.raises(Exception, match=r"key 'k3'.*\(3, 2\).*\(2, 3\)"):
        all_batches(ds)


def test_bad_class_text_is_refused_naming_the_key(tmp_path):
    samples = [(f"k{i}", {"cls": b"7" if i != 2 else b"seven"}) for i in range(4)]
    ds = fl.Tar(write_shard(tmp_path / "s.tar", samples))
    with pytest.raises(Exception, match=r"key 'k2'.*not a decimal integer: 'seven'"):
        all_batches(ds)


def test_every_suffix_of_the_type_table(tmp_path):
    ints = ["cls", "cls2", "index", "idx", "id", "label"]
    samples = [(f"k{i}", {**{s: f" {i * 10 + j}\n".encode() for j, s in enumerate(ints)},
                          "text": f"t{i}".encode(), "jsn": b"[1, 2]", "pickle": b"\x80\x04N.", "pth": b"PK",
                          "pt": b"\x80\x02", "webp": b"RIFF", "Seg.PNG": b"\x89PNG"}) for i in range(3)]
    path = write_shard(tmp_path / "t.tar", samples)
    with pytest.raises(ValueError, match="'index' is reserved by the loader"):  # the Loader's own name
        all_batches(fl.Tar(path))
    ds = fl.Tar(path, fields=[f for f in fl.Tar(path).fields if f != "index"])
    b = all_batches(ds)[0]
    for j, s in enumerate(ints):
        if s == "index":
            continue
        assert str(b[s].dtype) == "torch.int64" and b[s].tolist() == [i * 10 + j for i in range(3)]
    assert b["text"] == ["t0", "t1", "t2"] and b["jsn"] == [[1, 2]] * 3
    for s in ("pickle", "pth", "pt", "webp", "seg.png"):  # pickles never unpickled; images without decode=
        assert b[s] == [samples[0][1][s if s != "seg.png" else "Seg.PNG"]] * 3


def test_an_image_that_does_not_decode_names_field_key_and_shard(tmp_path):
    image_reference = pytest.importorskip("image_reference")
    good = image_reference.encode(image_reference.photo(20, 20), "PNG")
    samples = [(f"k{i}", {"png": good if i != 1 else b"\x89PNG\r\n\x1a\n broken"}) for i in range(3)]
    path = write_shard(tmp_path / "img.tar", samples)
    ds = fl.Tar(path, decode={"png": fl.Image(8, crop="center", layout="CHW")})
    with pytest.raises(fl.ImageError, match=rf"field 'png' of key 'k1' of tar shard '{path}'"):
        all_batches(ds)
    ok = fl.Tar(write_shard(tmp_path / "ok.tar", [("a", {"png": good})]), decode={"png": fl.Image(8, layout="CHW")})
    assert tuple(all_batches(ok)[0]["png"].shape) == (1, 3, 8, 8)
