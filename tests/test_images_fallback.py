"""The decode stage without native decoders: a build made without the libjpeg / libpng headers
still compiles and sends JPEG and PNG to the fallback (a C++ build of csrc/image without them,
tests/cpp/images_without_decoders.cpp), and in this process, with native decoding switched off
(_C._set_native_image_decoding(False): JPEG and PNG through PIL, as in such a build), the loader
gives what the native decoders give, image_backends() says PIL, fl.ImageFolder warns, and without
Pillow's fallback it refuses to start. The native-decoder tests skip (not fail) in such a build:
image_reference.needs_native_decoders()."""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import warnings

import numpy as np
import pytest
from image_reference import encode, photo, pil_rgb, write

import fastload as fl
from fastload import _C
from fastload._images.fallback import PilDecoder

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The decode stage's sources, as CMakeLists.txt lists them for fastload_image, less the decoders
# (with the core files they call into).
IMAGE_SOURCES = ["sample_rng", "image_spec", "crop", "resample", "image_decoder", "image_source", "image_column"]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_a_build_without_libjpeg_and_libpng_compiles_and_falls_back(tmp_path):
    sources = [str(ROOT / "csrc" / "image" / f"{s}.cpp") for s in IMAGE_SOURCES]
    sources.append(str(ROOT / "csrc" / "core" / "cpu_cache.cpp"))  # the resize's AVX2 check
    # image files fetched from object storage are pinned through LazyFiles (and its fork guard)
    sources += [str(ROOT / "csrc" / "core" / f"{s}.cpp") for s in ("lazy_mappings", "fork_guard")]
    binary = tmp_path / "images_without_decoders"
    # No -DFASTLOAD_WITH_LIBJPEG / -DFASTLOAD_WITH_LIBPNG and no -ljpeg -lpng: what CMake builds when
    # find_package(JPEG) and find_package(PNG) find nothing.
    cmd = ["g++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'csrc'}", *sources,
           str(ROOT / "tests" / "cpp" / "images_without_decoders.cpp"), "-pthread", "-o", str(binary)]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-4000:]
    ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout.strip() == "ok", ran.stdout + ran.stderr


needs_pil_and_native = pytest.mark.skipif(_C.image_backends()["jpeg"] is None or _C.image_backends()["png"] is None,
                                          reason="compares the fallback with the native decoders")


@pytest.fixture
def without_native():
    before = _C._set_native_image_decoding(False)
    try:
        yield
    finally:
        _C._set_native_image_decoding(before)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("fallback")
    for k in range(12):
        pixels = photo(40 + 4 * k, 56, seed=k)
        data = encode(pixels, "JPEG", quality=90) if k % 2 else encode(pixels, "PNG")
        write(root / f"c{k % 3}" / f"{k:02d}.{'jpg' if k % 2 else 'png'}", data)
    return root


def _images(folder, spec, **kw):
    loader = fl.Loader(fl.ImageFolder(folder, image=spec), batch_size=4, device="cpu", with_index=True, **kw)
    return {int(i): img.numpy().copy() for b in loader for i, img in zip(b["index"], b["image"])}


@needs_pil_and_native
def test_switched_off_jpeg_and_png_go_through_pil(folder, without_native):
    backends = fl.image_backends()
    assert backends["jpeg"].startswith("PIL ") and backends["jpeg"].endswith("(fallback)")
    assert backends["png"] == backends["jpeg"] == backends["other"]
    with pytest.warns(RuntimeWarning, match="decodes JPEG and PNG through PIL"):
        ds = fl.ImageFolder(folder, image=fl.Image(24))
    assert len(ds) == 12
    # Each whole image at its own size is PIL's convert("RGB") (what the fallback returns).
    for path, _ in ds.samples:
        data = pathlib.Path(path).read_bytes()
        out, info = _C._decode_image(data, fl.Image(crop="none").native(pil_rgb(data).size[::-1]), 0, 0, 0,
                                     PilDecoder())
        assert info["format"] == ("JPEG" if path.endswith(".jpg") else "PNG")  # PIL's names: the fallback's
        assert np.array_equal(out, np.asarray(pil_rgb(data)))


@needs_pil_and_native
def test_the_fallback_gives_the_native_crops(folder):
    spec = fl.Image(40, flip=0.5)  # crops of these pictures need no DCT downscale for 40x40 (full-scale decodes)
    native = _images(folder, spec, shuffle=True, seed=3)
    before = _C._set_native_image_decoding(False)
    try:
        with pytest.warns(RuntimeWarning):
            fallback = _images(folder, spec, shuffle=True, seed=3)
    finally:
        _C._set_native_image_decoding(before)
    assert native.keys() == fallback.keys()
    for i in native:  # the same crop boxes and flips; pixels within the bound of docs/images.md
        diff = np.abs(native[i].astype(int) - fallback[i].astype(int))
        assert diff.max() <= 2 and diff.mean() <= 0.35, (i, diff.max(), diff.mean())


def test_without_pillow_s_fallback_an_image_folder_refuses_to_start(folder, without_native):
    with pytest.raises(RuntimeError, match="decodes no JPEG or PNG natively.*pip install pillow"):
        fl.ImageFolder(folder, image=fl.Image(24, fallback=None))
    data = (folder / "c1" / "01.jpg").read_bytes()
    with pytest.raises(fl.ImageError, match="format JPEG .*not decoded natively by this build"):
        _C._decode_image(data, fl.Image(8, fallback=None).native(), 0, 0, 0, None)


def test_an_image_column_falls_back_too(without_native):
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("PIL")
    images = [encode(photo(30, 40, seed=k), "PNG") for k in range(5)]
    t = pa.table({"png": pa.array(images, pa.binary())})
    b = next(iter(fl.Loader(fl.Arrow(t, decode={"png": fl.Image((30, 40), crop="none")}), batch_size=5,
                            device="cpu")))
    for k in range(5):
        assert np.array_equal(b["png"][k].numpy(), np.asarray(pil_rgb(images[k])))
