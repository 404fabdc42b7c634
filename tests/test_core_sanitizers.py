"""Runs the C++ test of the core (sampler, thread pool, buffer pool, pipeline) built under
ThreadSanitizer and under AddressSanitizer + UBSan; see tests/cpp/run_sanitizers.sh."""
from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

SCRIPT = pathlib.Path(__file__).parent / "cpp" / "run_sanitizers.sh"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_core_under_sanitizers():
    result = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.endswith(" 0 failed") and not last.startswith("0 passed"), last
