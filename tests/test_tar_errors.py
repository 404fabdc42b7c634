"""fl.Tar's bad input: corrupt, truncated and compressed tars, duplicate keys, missing fields,
bad arguments; each a clear error naming the shard (and the offset or key)."""
from __future__ import annotations

import gzip
import io
import pathlib
import tarfile

import pytest

import fastload as fl
from fastload import _C
from tar_reference import every_kind_sample, write_shard


def shard(tmp_path, n=4, name="s.tar", fmt=tarfile.PAX_FORMAT):
    return write_shard(tmp_path / name, [every_kind_sample(i) for i in range(n)], fmt=fmt)


def test_a_header_checksum_that_does_not_match_names_shard_and_offset(tmp_path):
    path = shard(tmp_path, fmt=tarfile.USTAR_FORMAT)
    data = bytearray(pathlib.Path(path).read_bytes())
    second = 512 + 512  # the first member ("s00000.cls", 2 bytes) takes one header and one block
    data[second + 10] ^= 0x5A  # a byte of the second header's name
    pathlib.Path(path).write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"tar shard '{path}'.*checksum mismatch.*offset {second}"):
        fl.Tar(path)
    with pytest.raises(ValueError, match="checksum"):
        _C._tar_members(bytes(500) + b"x" * 600, "junk")


def test_not_a_tar_at_all(tmp_path):
    path = tmp_path / "text.tar"
    path.write_bytes(b"hello world\n" * 100)
    with pytest.raises(ValueError, match=r"text.tar'.*checksum mismatch.*offset 0"):
        fl.Tar(str(path))


@pytest.mark.parametrize("cut", [100, 512 + 1, 3 * 512 + 7])
def test_a_truncated_tar_names_shard_and_offset(tmp_path, cut):
    path = shard(tmp_path, fmt=tarfile.USTAR_FORMAT)
    data = pathlib.Path(path).read_bytes()
    # every member of every_kind_sample is small: a cut inside the first member, or in a header
    pathlib.Path(path).write_bytes(data[:cut])
    with pytest.raises(ValueError, match=rf"tar shard '{path}'.*truncated.*offset \d+"):
        fl.Tar(path)


def test_a_member_past_the_end_is_refused(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        info = tarfile.TarInfo("k.bin")
        info.size = 10_000
        t.addfile(info, io.BytesIO(bytes(10_000)))
    data = buf.getvalue()[:512 + 4096]
    with pytest.raises(ValueError, match=r"member needs 10000 bytes at offset 512 but the file ends at 4608"):
        _C._tar_members(data, "cut.tar")


@pytest.mark.parametrize("name", ["s.tar.gz", "s.tgz"])
def test_compressed_tars_are_refused_by_name_saying_why(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(gzip.compress(pathlib.Path(shard(tmp_path)).read_bytes()))
    with pytest.raises(ValueError, match=r"compressed.*no random access.*Decompress it once"):
        fl.Tar(str(path))


def test_compressed_bytes_under_a_tar_name_are_refused_saying_why(tmp_path):
    path = tmp_path / "really-gzip.tar"
    path.write_bytes(gzip.compress(pathlib.Path(shard(tmp_path)).read_bytes()))
    with pytest.raises(ValueError, match=r"really-gzip.tar' is gzip-compressed.*no random access.*Decompress"):
        fl.Tar(str(path))


def test_a_key_twice_in_a_shard_is_refused_naming_it(tmp_path):
    samples = [("a", {"cls": b"1"}), ("b", {"cls": b"2"}), ("a", {"txt": b"again"})]
    path = write_shard(tmp_path / "dup.tar", samples)
    with pytest.raises(ValueError, match=r"dup.tar'.*key 'a' occurs twice"):
        fl.Tar(path)


def test_a_field_twice_in_a_sample_is_refused(tmp_path):
    path = tmp_path / "dup2.tar"
    with tarfile.open(path, "w") as t:
        for name in ("a.cls", "a.CLS"):
            info = tarfile.TarInfo(name)
            info.size = 1
            t.addfile(info, io.BytesIO(b"1"))
    with pytest.raises(ValueError, match=r"key 'a' has the field 'cls' twice"):
        fl.Tar(str(path))


def test_the_same_key_in_two_shards_is_two_samples(tmp_path):
    a = write_shard(tmp_path / "a.tar", [("k", {"cls": b"1"})])
    b = write_shard(tmp_path / "b.tar", [("k", {"cls": b"2"})])
    assert len(fl.Tar([a, b])) == 2


def test_a_missing_selected_field_names_shard_and_key(tmp_path):
    samples = [(f"k{i}", {"jpg": b"x", "cls": b"1"} if i != 2 else {"jpg": b"x"}) for i in range(4)]
    path = write_shard(tmp_path / "m.tar", samples)
    with pytest.raises(ValueError, match=r"tar shard '.*m.tar': the sample with key 'k2' has no field 'cls'"):
        fl.Tar(path, fields=["jpg", "cls"])
    with pytest.raises(ValueError, match=r"key 'k2' has no field 'cls'.*fields=None reads every field"):
        fl.Tar(path)
    assert len(fl.Tar(path, fields=["jpg"])) == 4
    ok = write_shard(tmp_path / "ok.tar", [("y", {"jpg": b"x", "cls": b"2"})])
    other = write_shard(tmp_path / "n.tar", [("z", {"jpg": b"y"})])  # the field is nowhere in this shard
    with pytest.raises(ValueError, match=r"n.tar': the sample with key 'z' has no field 'cls'"):
        fl.Tar([ok, other], fields=["jpg", "cls"])


def test_bad_arguments_name_themselves(tmp_path):
    path = shard(tmp_path)
    with pytest.raises(TypeError, match="urls must be"):
        fl.Tar(3)
    with pytest.raises(ValueError, match="urls is empty"):
        fl.Tar([])
    with pytest.raises(ValueError, match="no sample in these shards has the field 'png'"):
        fl.Tar(path, fields=["png"])
    with pytest.raises(TypeError, match="fields must be a list"):
        fl.Tar(path, fields="cls")
    with pytest.raises(ValueError, match="decode names the field 'png'"):
        fl.Tar(path, decode={"png": fl.Image(8)})
    with pytest.raises(TypeError, match=r"decode\['jpg'\] must be an fl.Image"):
        fl.Tar(path, decode={"jpg": "rgb"})
    with pytest.raises(ValueError, match=r"decode\['cls'\]: the field is read as int"):
        fl.Tar(path, decode={"cls": fl.Image(8)})
    with pytest.raises(ValueError, match="storage_options and cache_limit apply to shards in object storage"):
        fl.Tar(path, cache_limit="1GB")
    with pytest.raises(ValueError, match="neither a range"):
        fl.Tar(str(tmp_path / "x-{abc}.tar"))


def test_bad_json_is_a_value_error_naming_the_field(tmp_path):
    samples = [(f"k{i}", {"json": b"{\"a\": 1}" if i != 1 else b"{oops"}) for i in range(3)]
    ds = fl.Tar(write_shard(tmp_path / "j.tar", samples), fields=["json"])
    with pytest.raises(ValueError, match=r"field 'json' of row 1 of the batch is not JSON"):
        list(fl.Loader(ds, batch_size=3, shuffle=False, device="cpu"))


@pytest.mark.parametrize("kind", ["bzip2", "xz", "zstd"])
def test_other_compressions_are_refused_by_their_bytes(tmp_path, kind):
    import bz2
    import lzma
    raw = pathlib.Path(shard(tmp_path)).read_bytes()
    data = {"bzip2": lambda: bz2.compress(raw), "xz": lambda: lzma.compress(raw),
            "zstd": lambda: b"\x28\xb5\x2f\xfd" + bytes(1020)}[kind]()
    path = tmp_path / f"{kind}.tar"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=rf"is {kind}-compressed: a compressed tar has no random access"):
        fl.Tar(str(path))
