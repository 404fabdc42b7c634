#!/usr/bin/env bash
# The image decoders the manylinux wheel links statically: libjpeg-turbo (with its SIMD), libpng
# and zlib, built from Debian's source packages as position-independent static libraries by
# zig's clang against glibc 2.28 (tools/zig-cc), so that the wheel carries them and still needs
# nothing newer than manylinux_2_28 (Debian's own static libraries are not position-independent,
# and its libpng16.so.16 needs GLIBC_2.29). Nothing is vendored in the repository: the sources
# are fetched by apt-get (deb-src lines in a private apt configuration under OUT_DIR; the
# system's sources are not touched) at the pinned versions below.
#   bash tools/build_image_deps.sh [OUT_DIR]     # default: build/image-deps; prints the prefix
# Needs: apt-get and dpkg-source (dpkg-dev), nasm, cmake and ninja, and FASTLOAD_ZIG (set by
# tools/build_wheel.sh) or the ziglang package in PYTHON. A second run with the same versions
# reuses the prefix.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-$repo/build/image-deps}" && cd "${1:-$repo/build/image-deps}" && pwd)"
python="${PYTHON:-python3}"
JPEG_VERSION="1:2.1.5-2"           # libjpeg-turbo, Debian bookworm
PNG_VERSION="1.6.39-2+deb12u5"     # libpng1.6, Debian bookworm (point release 12.x)
ZLIB_VERSION="1:1.2.13.dfsg-1"     # zlib, Debian bookworm
prefix="$out/prefix"
stamp="$prefix/versions.txt"
want="libjpeg-turbo $JPEG_VERSION; libpng1.6 $PNG_VERSION; zlib $ZLIB_VERSION"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$prefix"
  exit 0
fi
for tool in apt-get dpkg-source nasm cmake ninja ar; do
  command -v "$tool" >/dev/null || { echo "build_image_deps.sh needs $tool (Debian: apt-get install -y dpkg-dev nasm cmake ninja-build binutils)" >&2; exit 1; }
done
if [ -z "${FASTLOAD_ZIG:-}" ]; then
  FASTLOAD_ZIG="$("$python" -c 'import ziglang, pathlib; print(pathlib.Path(ziglang.__file__).parent / "zig")')"
fi
export FASTLOAD_ZIG
cc="$repo/tools/zig-cc"
cflags="-O2 -fPIC -fvisibility=hidden -w"  # -w: their warnings are theirs
start=$SECONDS

# The sources, through a private apt configuration (its lists and cache under $out).
apt_dir="$out/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$out/src"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main" \
  > "$apt_dir/sources.list"
apt=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
     -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "Debug::NoLocking=1")
apt-get "${apt[@]}" -q update >/dev/null
rm -rf "$out/src" && mkdir -p "$out/src"
(cd "$out/src" && apt-get "${apt[@]}" -q source --download-only \
   "libjpeg-turbo=$JPEG_VERSION" "libpng1.6=$PNG_VERSION" "zlib=$ZLIB_VERSION" >/dev/null 2>&1)
for dsc in "$out"/src/*.dsc; do
  # Debian's patches applied; the archive's signature was checked by apt against Debian's keyring.
  (cd "$out/src" && dpkg-source --no-check -x "$(basename "$dsc")" >/dev/null)
done
jpeg_src="$(ls -d "$out"/src/libjpeg-turbo-*/)"
png_src="$(ls -d "$out"/src/libpng1.6-*/)"
zlib_src="$(ls -d "$out"/src/zlib-*/)"
rm -rf "$prefix" && mkdir -p "$prefix/include" "$prefix/lib"

# zlib: its C files, as its Makefile lists them.
zobj="$out/obj/zlib" && rm -rf "$zobj" && mkdir -p "$zobj"
for f in adler32 compress crc32 deflate gzclose gzlib gzread gzwrite infback inffast inflate inftrees trees uncompr zutil; do
  "$cc" $cflags -DHAVE_HIDDEN -c "$zlib_src/$f.c" -o "$zobj/$f.o" &
done
wait
ar rcs "$prefix/lib/libz.a" "$zobj"/*.o
cp "$zlib_src/zlib.h" "$zlib_src/zconf.h" "$prefix/include/"

# libpng: the library's C files, configured by its prebuilt pnglibconf.h (the default options).
pobj="$out/obj/png" && rm -rf "$pobj" && mkdir -p "$pobj"
cp "$png_src/scripts/pnglibconf.h.prebuilt" "$png_src/pnglibconf.h"
for f in png pngerror pngget pngmem pngpread pngread pngrio pngrtran pngrutil pngset pngtrans pngwio pngwrite pngwtran pngwutil; do
  "$cc" $cflags -I"$prefix/include" -c "$png_src/$f.c" -o "$pobj/$f.o" &
done
wait
ar rcs "$prefix/lib/libpng.a" "$pobj"/*.o
cp "$png_src/png.h" "$png_src/pngconf.h" "$png_src/pnglibconf.h" "$prefix/include/"

# libjpeg-turbo: its CMake build, static only, SIMD required (nasm), no TurboJPEG API or tools.
cmake -S "$jpeg_src" -B "$out/obj/jpeg" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_C_FLAGS="$cflags" -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DENABLE_SHARED=OFF -DENABLE_STATIC=ON \
  -DWITH_TURBOJPEG=OFF -DREQUIRE_SIMD=ON -DWITH_JPEG8=OFF -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_INSTALL_INCLUDEDIR=include -DCMAKE_POLICY_VERSION_MINIMUM=3.5 >/dev/null
cmake --build "$out/obj/jpeg" --target jpeg-static >/dev/null
cp "$out/obj/jpeg/libjpeg.a" "$prefix/lib/"
cp "$jpeg_src/jpeglib.h" "$jpeg_src/jmorecfg.h" "$jpeg_src/jerror.h" "$out/obj/jpeg/jconfig.h" "$prefix/include/"

echo "$want" > "$stamp"
echo "built libjpeg-turbo, libpng and zlib in $((SECONDS - start)) s" >&2
echo "$prefix"
