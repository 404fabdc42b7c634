"""Compiles the stand-in CUDA driver (fake_libcuda.cpp) into a shared library for tests.

    python tests/fake_cuda/build.py OUTDIR [--sanitize thread]   # prints the .so path
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import tempfile

SOURCE = pathlib.Path(__file__).resolve().with_name("fake_libcuda.cpp")
FLAGS = ["-std=c++17", "-O1", "-g", "-shared", "-fPIC", "-pthread"]


def build(out_dir: str | os.PathLike, sanitize: str | None = None) -> pathlib.Path:
    """Returns the path of the built library, compiling only if the source is newer.

    `sanitize` names a g++ sanitizer ("thread" adds -fsanitize=thread); each variant gets its own
    file name so that the plain and sanitized builds can live in the same directory.
    """
    if sanitize is not None and not re.fullmatch(r"[a-z,]+", sanitize):
        raise ValueError(f"sanitize must be a g++ sanitizer name such as 'thread', got {sanitize!r}")
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "" if sanitize is None else "_" + sanitize.replace(",", "_")
    target = out_dir / f"libfake_cuda{suffix}.so"
    if target.exists() and target.stat().st_mtime > SOURCE.stat().st_mtime:
        return target
    flags = FLAGS + ([f"-fsanitize={sanitize}"] if sanitize else [])
    # Built under a temporary name and renamed, so a concurrent reader never loads a half-written
    # file and a failed build leaves no stale library behind.
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=out_dir)
    os.close(fd)
    try:
        result = subprocess.run(["g++", *flags, str(SOURCE), "-o", tmp], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building {target.name} failed:\n{result.stderr}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--sanitize", default=None, help="g++ sanitizer, e.g. thread")
    args = parser.parse_args()
    print(build(args.out_dir, args.sanitize))


if __name__ == "__main__":
    main()
