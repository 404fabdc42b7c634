"""Bad images: a corrupt, truncated, missing or oversized file raises fl.ImageError at next(),
naming the file, the sample and what the decoder said; never a crash, never a grey picture passed
as data. The pixel limit is read from the header, before any pixel memory exists."""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from image_reference import needs_native_decoders, encode, photo, png_bytes, write

import fastload as fl
from fastload import _C
from fastload._images.fallback import PilDecoder

pytestmark = needs_native_decoders()


def _loader_error(tmp_path, bad_name: str, bad: bytes, spec=None, **loader):
    """The error next() raises over a folder of good JPEGs and one bad file."""
    for k in range(5):
        write(tmp_path / "c" / f"good{k}.jpg", encode(photo(40, 50, seed=k), "JPEG"))
    path = write(tmp_path / "c" / bad_name, bad)
    ds = fl.ImageFolder(tmp_path, image=spec or fl.Image(16))
    index = [p for p, _ in ds.samples].index(path)
    with pytest.raises(fl.ImageError) as info:
        for _ in fl.Loader(ds, batch_size=3, device="cpu", **loader):
            pass
    message = str(info.value)
    assert f"image file '{path}' (sample {index})" in message, message
    assert isinstance(info.value, OSError)
    return message


def _jpeg_with_size(width: int, height: int) -> bytes:
    """A small JPEG whose frame header claims width x height."""
    data = bytearray(encode(photo(16, 16), "JPEG"))
    at = data.index(b"\xff\xc0")
    data[at + 5:at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _png_with_size(width: int, height: int) -> bytes:
    data = bytearray(encode(photo(16, 16), "PNG"))
    ihdr = bytearray(data[12:29])  # "IHDR" + 13 bytes
    ihdr[4:12] = struct.pack(">II", width, height)
    data[12:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)) & 0xFFFFFFFF)
    return bytes(data)


def test_truncated_jpeg(tmp_path):
    data = encode(photo(40, 50, seed=9), "JPEG")
    message = _loader_error(tmp_path, "cut.jpg", data[: len(data) * 6 // 10], spec=fl.Image(crop="none", size=(40, 50)))
    assert "Premature end of JPEG file" in message


def test_truncated_progressive_jpeg(tmp_path):
    data = encode(photo(40, 50, seed=9), "JPEG", progressive=True)
    message = _loader_error(tmp_path, "cut.jpg", data[: len(data) // 2])
    assert "Premature end of JPEG file" in message


def test_truncated_png(tmp_path):
    data = encode(photo(40, 50, seed=9), "PNG")
    message = _loader_error(tmp_path, "cut.png", data[: len(data) // 2], spec=fl.Image(crop="none", size=(40, 50)))
    assert "PNG data: " in message and "truncated" in message


def test_corrupt_jpeg_data(tmp_path):
    data = bytearray(encode(photo(40, 50, seed=9), "JPEG"))
    start = data.index(b"\xff\xda") + 20
    data[start:start + 200] = b"\xff\x00" * 100  # entropy-coded garbage
    message = _loader_error(tmp_path, "bad.jpg", bytes(data), spec=fl.Image(crop="none", size=(40, 50)))
    assert "Corrupt JPEG data" in message


def test_not_an_image(tmp_path):
    message = _loader_error(tmp_path, "text.jpg", b"hello, this is not a picture" * 10)
    assert "UnidentifiedImageError" in message  # PIL's word, as the fallback tried it
    message = _loader_error(tmp_path, "text.jpg", b"hello, this is not a picture" * 10, spec=fl.Image(16, fallback=None))
    assert "format unknown (it starts with 0x68656c6c)" in message


def test_empty_file(tmp_path):
    message = _loader_error(tmp_path, "empty.png", b"", spec=fl.Image(16, fallback=None))
    assert "nothing (an empty file)" in message


def test_jpeg_header_only(tmp_path):
    data = encode(photo(40, 50, seed=9), "JPEG")
    message = _loader_error(tmp_path, "head.jpg", data[:30])
    assert "JPEG header" in message or "JPEG data" in message


def test_missing_file(tmp_path):
    for k in range(4):
        write(tmp_path / "c" / f"{k}.jpg", encode(photo(40, 50, seed=k), "JPEG"))
    ds = fl.ImageFolder(tmp_path, image=fl.Image(16))
    (tmp_path / "c" / "2.jpg").unlink()
    with pytest.raises(fl.ImageError, match=r"image file '.*2.jpg' \(sample 2\): cannot open: No such file"):
        list(fl.Loader(ds, batch_size=2, device="cpu"))


@pytest.mark.parametrize("make", [_jpeg_with_size, _png_with_size])
def test_oversized_headers_are_refused_before_decoding(tmp_path, make):
    # 20000 x 20000 = 4e8 pixels, over PIL's 89,478,485: refused from the header (the file holds
    # 16 x 16 pixels of data; a decode would have failed differently, and allocated 1.6 GB first).
    message = _loader_error(tmp_path, "huge.jpg" if make is _jpeg_with_size else "huge.png", make(20000, 20000))
    assert "20000x20000 = 400000000 pixels is over the limit of 89478485" in message
    assert "refused before decoding" in message


def test_the_pixel_limit_is_settable(tmp_path):
    data = encode(photo(40, 50, seed=1), "JPEG")
    with pytest.raises(fl.ImageError, match="50x40 = 2000 pixels is over the limit of 1999"):
        _C._decode_image(data, fl.Image(8, max_pixels=1999).native(), 0, 0, 0, None)
    _C._decode_image(data, fl.Image(8, max_pixels=2000).native(), 0, 0, 0, None)
    huge = _jpeg_with_size(20000, 20000)
    with pytest.raises(fl.ImageError, match="(?i)premature end"):  # no limit: decoded (and found cut short)
        _C._decode_image(huge, fl.Image(8, max_pixels=None).native(), 0, 0, 0, None)


def test_fallback_formats_obey_the_limit_too():
    data = encode(photo(40, 50, seed=1), "BMP")
    with pytest.raises(fl.ImageError, match="BMP image of 50x40 = 2000 pixels is over the limit"):
        _C._decode_image(data, fl.Image(8, max_pixels=1000).native(), 0, 0, 0, PilDecoder())


def test_an_error_does_not_stop_the_next_epoch_from_reporting_it_again(tmp_path):
    for k in range(3):
        write(tmp_path / "c" / f"{k}.jpg", encode(photo(40, 50, seed=k), "JPEG"))
    write(tmp_path / "c" / "3.jpg", b"\xff\xd8\xff garbage")
    loader = fl.Loader(fl.ImageFolder(tmp_path, image=fl.Image(8)), batch_size=2, device="cpu", num_threads=2)
    for epoch in range(2):
        loader.set_epoch(epoch)
        with pytest.raises(fl.ImageError, match="3.jpg"):
            list(loader)


def test_bad_pngs_of_every_kind():
    good = png_bytes(np.zeros((8, 8, 3), np.uint8), 2, 8)
    bad_crc = bytearray(good)
    bad_crc[29] ^= 0xFF  # IHDR's CRC
    for data, expected in [(bytes(bad_crc), "PNG header: IHDR: CRC error"), (good[:40], "PNG"),
                           (good[:8], "PNG header")]:
        with pytest.raises(fl.ImageError, match=expected):
            _C._decode_image(data, fl.Image(crop="none").native((8, 8)), 0, 0, 0, None)
