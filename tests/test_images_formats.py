"""The pixels fl.Image produces, against PIL, format by format.

Bounds, and why:
- crop="none" at the image's own size: within 1 of PIL's convert("RGB") (measured: equal; JPEG
  through the same libjpeg-turbo integer IDCT and upsampling, PNG lossless).
- a resized crop decoded at full scale (JPEG 8/8, PNG, fallback formats): against PIL's
  crop + resize(BILINEAR) of the same box, every pixel within 2 and the mean within 0.35: the
  weights are 14-bit, not PIL's 22-bit (1 per pass), and PIL 13 filters vertically first when the
  height shrinks much more than the width, which rounds the 8-bit intermediate differently.
- a resized crop decoded at a reduced DCT scale (1/2, 1/4, 1/8: the large photos): mean within 1.5
  on photograph-like pictures: the DCT-domain downscale is a box-like filter, not the triangle
  PIL applies to the full-size decode (measured 0.4-1.0).
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from image_reference import needs_native_decoders, encode, photo, pil_rgb, png_bytes, torchvision_eval
from PIL import Image as PILImage

import fastload as fl
from fastload import _C
from fastload._images.fallback import PilDecoder

pytestmark = needs_native_decoders()


def _decode(data: bytes, spec: fl.Image, index: int = 0, *, own=None, fallback=True):
    return _C._decode_image(data, spec.native(own), 0, 0, index, PilDecoder() if fallback else None)


def _whole(data: bytes, fallback=True) -> np.ndarray:
    w, h = pil_rgb(data).size
    out, info = _decode(data, fl.Image(crop="none"), own=(h, w), fallback=fallback)
    return out, info


def _assert_close_to_pil(out: np.ndarray, ref: np.ndarray, max_diff: int, mean_diff: float):
    d = np.abs(out.astype(int) - ref.astype(int))
    assert d.max() <= max_diff and d.mean() <= mean_diff, (d.max(), d.mean())


# ------------------------------------------------------------------------------ JPEG
JPEGS = {
    "baseline 4:2:0": dict(quality=90),
    "baseline 4:4:4": dict(quality=90, subsampling=0),
    "baseline 4:2:2": dict(quality=85, subsampling=1),
    "progressive": dict(quality=90, progressive=True),
    "restart markers": dict(quality=90, restart_marker_rows=2),
}


@pytest.mark.parametrize("name", list(JPEGS))
def test_jpeg_whole_image_equals_pil(name):
    data = encode(photo(75, 101, seed=1), "JPEG", **JPEGS[name])
    out, info = _whole(data, fallback=False)
    assert info["format"] == "JPEG"
    _assert_close_to_pil(out, np.asarray(pil_rgb(data)), 1, 0.01)


def test_grayscale_jpeg_is_replicated_to_rgb():
    gray = photo(60, 80, seed=2)[..., 0]
    data = encode(gray, "JPEG", quality=90)
    out, _ = _whole(data, fallback=False)
    assert (out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all()
    _assert_close_to_pil(out, np.asarray(pil_rgb(data)), 1, 0.01)


def test_cmyk_jpeg_converts_as_pil_does():
    cmyk = np.concatenate([photo(40, 50, seed=3), photo(40, 50, seed=4)[..., :1]], axis=-1)
    data = encode(cmyk, "JPEG", mode="CMYK", quality=95)
    assert PILImage.open(__import__("io").BytesIO(data)).mode == "CMYK"
    out, _ = _whole(data, fallback=False)
    _assert_close_to_pil(out, np.asarray(pil_rgb(data)), 1, 0.05)


@pytest.fixture(scope="module")
def ycck_writer(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("needs g++ and the libjpeg headers to write a YCCK JPEG")
    exe = tmp_path_factory.mktemp("ycck") / "images_ycck"
    src = __import__("pathlib").Path(__file__).parent / "images_ycck.cpp"
    if subprocess.run(["g++", "-O1", str(src), "-ljpeg", "-o", str(exe)], capture_output=True).returncode != 0:
        pytest.skip("could not build the YCCK writer (libjpeg headers missing)")
    return exe


def test_ycck_jpeg_converts_as_pil_does(ycck_writer):
    cmyk = np.concatenate([photo(32, 48, seed=5), photo(32, 48, seed=6)[..., :1]], axis=-1)
    data = subprocess.run([str(ycck_writer), "48", "32"], input=cmyk.tobytes(), capture_output=True, check=True).stdout
    out, _ = _whole(data, fallback=False)
    _assert_close_to_pil(out, np.asarray(pil_rgb(data)), 1, 0.05)


def test_exif_orientation_is_ignored():
    a = photo(40, 64, seed=7)
    exif = PILImage.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    data = encode(a, "JPEG", quality=95, exif=exif.tobytes())
    out, _ = _whole(data, fallback=False)
    assert out.shape == (40, 64, 3)  # not rotated to 64 x 40
    _assert_close_to_pil(out, np.asarray(pil_rgb(data)), 1, 0.01)


# ------------------------------------------------------------------------------ PNG
def _png_cases():
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (23, 31, 3))
    cases = {
        "rgb8": (png_bytes(rgb, 2, 8), rgb),
        "rgb8 interlaced": (png_bytes(rgb, 2, 8, interlaced=True), rgb),
        "rgba8 (alpha dropped)": (png_bytes(np.concatenate([rgb, rng.integers(0, 256, (23, 31, 1))], -1), 6, 8), rgb),
        "rgb16 (high byte)": (png_bytes(rgb * 256 + rng.integers(0, 256, rgb.shape), 2, 16), rgb),
        "rgba16": (png_bytes(np.concatenate([rgb * 256, rng.integers(0, 65536, (23, 31, 1))], -1), 6, 16), rgb),
    }
    for bits in (1, 2, 4, 8):
        g = rng.integers(0, 2**bits, (23, 31, 1))
        scaled = (g * (255 // (2**bits - 1))).repeat(3, -1)
        cases[f"gray{bits}"] = (png_bytes(g, 0, bits), scaled)
        cases[f"gray{bits} interlaced"] = (png_bytes(g, 0, bits, interlaced=True), scaled)
    g = rng.integers(0, 256, (23, 31, 1))
    cases["gray+alpha8"] = (png_bytes(np.concatenate([g, g[::-1]], -1), 4, 8), g.repeat(3, -1))
    cases["gray16 (high byte)"] = (png_bytes(g * 256 + 77, 0, 16), g.repeat(3, -1))
    for bits in (1, 2, 4, 8):
        palette = rng.integers(0, 256, (2**bits, 3))
        idx = rng.integers(0, 2**bits, (23, 31, 1))
        cases[f"palette{bits}"] = (png_bytes(idx, 3, bits, palette=palette), palette[idx[..., 0]])
    palette = rng.integers(0, 256, (16, 3))
    idx = rng.integers(0, 16, (23, 31, 1))
    cases["palette with transparency"] = (png_bytes(idx, 3, 8, palette=palette, trns=bytes(range(0, 160, 10))),
                                          palette[idx[..., 0]])
    return cases


PNGS = _png_cases()


@pytest.mark.parametrize("name", list(PNGS))
@pytest.mark.filterwarnings("ignore:Palette images with Transparency")  # PIL's, converting the reference
def test_png_layouts_decode_to_rgb(name):
    data, expected = PNGS[name]
    out, info = _whole(data, fallback=False)
    assert info["format"] == "PNG"
    assert (out == expected).all()
    if "gray16" not in name:  # PIL's convert("RGB") clips 16-bit gray at 255 instead (docs/images.md)
        _assert_close_to_pil(out, np.asarray(pil_rgb(data)), 0, 0)


@pytest.mark.parametrize("name", ["rgb8", "rgb8 interlaced", "palette4", "gray2"])
def test_png_crops_read_only_the_rows_they_need(name):
    data, expected = PNGS[name]
    out, info = _decode(data, fl.Image(8), index=5, fallback=False)
    x, y, w, h = info["box"]
    ref = np.asarray(PILImage.fromarray(expected.astype(np.uint8)[y:y + h, x:x + w]).resize((8, 8), PILImage.BILINEAR))
    _assert_close_to_pil(out, ref, 2, 0.35)
    assert info["decoded"][1] + info["decoded"][3] <= 23


# ------------------------------------------------------------------------------ other formats: the fallback
@pytest.mark.parametrize("fmt, options", [("WEBP", dict(lossless=True)), ("BMP", {}), ("TIFF", {}), ("GIF", {}),
                                          ("PPM", {})])
def test_other_formats_decode_through_pil(fmt, options):
    a = photo(30, 44, seed=8)
    if fmt == "GIF":
        a = np.asarray(PILImage.fromarray(a).convert("P").convert("RGB"))
    data = encode(a, fmt, **options)
    out, info = _whole(data)
    assert info["format"] == fmt
    _assert_close_to_pil(out, np.asarray(pil_rgb(data)), 0, 0)
    crop, _ = _decode(data, fl.Image(16, flip=1.0), index=2)
    assert crop.shape == (16, 16, 3)


@pytest.mark.parametrize("fmt, name", [("WEBP", "WebP"), ("BMP", "BMP"), ("TIFF", "TIFF"), ("GIF", "GIF")])
def test_other_formats_are_refused_without_the_fallback(fmt, name):
    data = encode(photo(30, 40, seed=9), fmt)
    with pytest.raises(fl.ImageError, match=f"format {name} .*fallback=None"):
        _decode(data, fl.Image(8, fallback=None), fallback=False)


# ------------------------------------------------------------------------------ resized crops vs PIL
@pytest.mark.parametrize("subsampling", [0, 1, 2])
def test_random_crops_at_full_scale_match_pil(subsampling):
    data = encode(photo(375, 500, seed=10), "JPEG", quality=90, subsampling=subsampling)
    full = pil_rgb(data)
    for index in range(12):
        out, info = _decode(data, fl.Image(224), index=index, fallback=False)
        assert info["scale"] == (8, 8)  # crops of a 500 x 375 picture are never twice 224
        x, y, w, h = info["box"]
        ref = np.asarray(full.crop((x, y, x + w, y + h)).resize((224, 224), PILImage.BILINEAR))
        _assert_close_to_pil(out, ref, 2, 0.35)


@pytest.mark.parametrize("subsampling", [0, 2])
def test_random_crops_at_reduced_dct_scale_stay_close_to_pil(subsampling):
    data = encode(photo(1200, 1600, seed=11), "JPEG", quality=90, subsampling=subsampling)
    full = pil_rgb(data)
    scales = set()
    for index in range(10):
        out, info = _decode(data, fl.Image(224), index=index, fallback=False)
        scales.add(info["scale"][0])
        x, y, w, h = info["box"]
        ref = np.asarray(full.crop((x, y, x + w, y + h)).resize((224, 224), PILImage.BILINEAR))
        d = np.abs(out.astype(int) - ref.astype(int))
        assert d.mean() <= 1.5, (info, d.mean())
        # the decoded region is the crop's, at the chosen scale, not the whole picture
        dx, dy, dw, dh = info["decoded"]
        s = info["scale"][0] / 8
        assert dw <= w * s + 40 and dh <= h * s + 8, (info, s)
    assert scales & {1, 2, 4}, scales


def test_center_crop_matches_torchvisions_eval_transform():
    data = encode(photo(375, 500, seed=12), "JPEG", quality=90)
    out, info = _decode(data, fl.Image(224, crop="center"), fallback=False)
    ref = torchvision_eval(pil_rgb(data), (224, 224), 256)
    _assert_close_to_pil(out, ref, 2, 0.35)


def test_center_crop_pads_like_torchvision():
    data = encode(photo(90, 120, seed=13), "PNG")
    out, _ = _decode(data, fl.Image((80, 120), crop="center", resize=64), fallback=False)
    ref = torchvision_eval(pil_rgb(data), (80, 120), 64)
    _assert_close_to_pil(out, ref, 2, 0.35)
    assert (out[:, :17] == 0).all() and (out[:8] == 0).all()


def test_an_image_smaller_than_the_crop_is_upsampled():
    data = encode(photo(20, 24, seed=14), "PNG")
    out, info = _decode(data, fl.Image(64, scale=(1.0, 1.0), ratio=(1.2, 1.2)), fallback=False)
    assert info["box"] == (0, 0, 24, 20)
    ref = np.asarray(pil_rgb(data).resize((64, 64), PILImage.BILINEAR))
    _assert_close_to_pil(out, ref, 2, 0.35)


def test_whole_image_resized_matches_pil():
    data = encode(photo(150, 200, seed=15), "JPEG", quality=95, subsampling=0)
    out, _ = _decode(data, fl.Image((100, 90), crop="none"), fallback=False)
    ref = np.asarray(pil_rgb(data).resize((90, 100), PILImage.BILINEAR))
    _assert_close_to_pil(out, ref, 2, 0.35)


def test_formats_are_told_by_bytes_not_names(tmp_path):
    # A PNG named .jpg and a JPEG named .png, as ImageNet holds.
    a = photo(30, 40, seed=16)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "png.jpg").write_bytes(encode(a, "PNG"))
    (tmp_path / "c" / "jpeg.png").write_bytes(encode(a, "JPEG", quality=95))
    ds = fl.ImageFolder(tmp_path, image=fl.Image(crop="none", fallback=None))
    batch = next(iter(fl.Loader(ds, batch_size=2, device="cpu")))
    for img, (path, _) in zip(batch["image"].numpy(), ds.samples):
        with open(path, "rb") as f:
            _assert_close_to_pil(img, np.asarray(pil_rgb(f.read())), 1, 0.01)
