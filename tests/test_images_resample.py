"""The resize's vector forms give the bytes of its scalar form: every crop kind, downscales from
none to 40x (the widest filters, whose pairs of output pixels differ most in length), upscales,
flips and both layouts, decoded with the AVX2 form (where the CPU has it), the SSE2 form and the
scalar one (_C._set_resample_simd), compared byte for byte; and, built under AddressSanitizer,
random crops of every kind resized by every form inside regions of their exact size
(tests/cpp/resample_forms.cpp)."""
from __future__ import annotations

import pathlib
import shutil
import subprocess

import numpy as np
import pytest
from image_reference import encode, needs_native_decoders, photo

import fastload as fl
from fastload import _C

pytestmark = needs_native_decoders()

FORMS = ("scalar", "sse2", "avx2")


@pytest.fixture
def simd():
    before, _ = _C._set_resample_simd("avx2")

    def use(form: str) -> str:
        return _C._set_resample_simd(form)[1]

    yield use
    _C._set_resample_simd(before)


CASES = [
    ((375, 500), fl.Image(224, flip=0.5), "JPEG"),
    ((375, 500), fl.Image(224, crop="center", layout="CHW"), "JPEG"),
    ((1200, 1600), fl.Image(224, flip=0.5), "JPEG"),            # DCT-scaled crops
    ((1200, 1600), fl.Image((61, 37), crop="none"), "PNG"),     # 20-40x down, odd widths
    ((900, 700), fl.Image(17, scale=(0.9, 1.0)), "PNG"),         # ~45x down
    ((40, 30), fl.Image(223, flip=1.0), "JPEG"),                 # upscales
    ((333, 257), fl.Image((129, 131), crop="center", resize=200), "PNG"),
]


@pytest.mark.parametrize("shape, spec, fmt", CASES)
def test_every_form_gives_the_same_bytes(simd, shape, spec, fmt):
    data = encode(photo(*shape, seed=shape[0]), fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    used = [simd(f) for f in FORMS]
    assert used[0] == "scalar" and used[1] == "sse2"
    for index in range(6):
        out = {}
        for form in FORMS:
            simd(form)
            out[form], _ = _C._decode_image(data, spec.native(), 3, 0, index, None)
        assert np.array_equal(out["scalar"], out["sse2"]), index
        assert np.array_equal(out["scalar"], out["avx2"]), index


def test_the_cap_is_checked():
    with pytest.raises(ValueError, match="simd must be 'scalar', 'sse2' or 'avx2', got 'neon'"):
        _C._set_resample_simd("neon")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_the_forms_stay_inside_their_memory_under_asan(tmp_path):
    root = pathlib.Path(__file__).resolve().parents[1]
    sources = [str(root / "csrc" / "image" / f"{s}.cpp") for s in ("crop", "resample", "sample_rng", "image_spec")]
    binary = tmp_path / "resample_forms"
    cmd = ["g++", "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
           "-fno-sanitize-recover=undefined", f"-I{root / 'csrc'}", *sources, str(root / "csrc" / "core" / "cpu_cache.cpp"),
           str(root / "tests" / "cpp" / "resample_forms.cpp"), "-o", str(binary)]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if built.returncode != 0 and "asan" in built.stderr.lower():
        pytest.skip("no AddressSanitizer runtime (Debian: libasan8)")
    assert built.returncode == 0, built.stderr[-4000:]
    ran = subprocess.run([str(binary), "600"], capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0 and "600 runs, 0 mismatches" in ran.stdout, ran.stdout[-2000:] + ran.stderr[-4000:]
