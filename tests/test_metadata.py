"""Packaging metadata: one version everywhere, the declared license's text, classifiers that match
what is built, and a clear build error on a platform other than Linux."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import fastload
from fastload import _C

REPO = Path(__file__).resolve().parent.parent

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")



def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_one_version_for_the_package_its_metadata_and_the_compiled_module():
    written = re.search(r'__version__ = "([^"]+)"', (REPO / "python/fastload/_version.py").read_text())[1]
    assert fastload.__version__ == written
    assert version("fastload") == written  # the installed distribution's metadata
    assert _C.__version__ == written  # CMake's project version, compiled in
    assert "version" in pyproject()["project"]["dynamic"] and "version" not in pyproject()["project"]


def test_the_license_file_is_the_apache_2_license_the_metadata_declares():
    project = pyproject()["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    assert "License :: OSI Approved :: Apache Software License" in project["classifiers"]
    text = " ".join((REPO / "LICENSE").read_text().split())
    assert text.startswith("Apache License Version 2.0, January 2004 http://www.apache.org/licenses/")
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_classifiers_name_linux_and_the_python_versions_the_wheels_are_built_for():
    config = pyproject()
    classifiers = config["project"]["classifiers"]
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert not [c for c in classifiers if c.startswith("Operating System") and "Linux" not in c]
    pythons = {c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    built = {f"3.{b[3:-2]}" for b in config["tool"]["cibuildwheel"]["build"]}  # "cp310-*" -> 3.10
    assert pythons == built == {"3.10", "3.11", "3.12", "3.13"}
    assert config["project"]["requires-python"] == ">=3.10"


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
def test_configuring_for_another_platform_fails_at_once_with_a_clear_message(tmp_path):
    done = subprocess.run(["cmake", "-S", str(REPO), "-B", str(tmp_path), "-DCMAKE_SYSTEM_NAME=Darwin"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    message = " ".join(done.stderr.split())
    assert "fastload builds only on Linux" in message and "targets Darwin" in message, done.stderr
    assert "compiler" not in message.lower()  # said before any compiler check
