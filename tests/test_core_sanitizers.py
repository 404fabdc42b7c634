"""Runs the C++ tests of the core (sampler, thread pool, buffer pool, pipeline) and of the CUDA
transfer engine (against the stand-in driver, tests/fake_cuda), built under ThreadSanitizer and
under AddressSanitizer + UBSan; see tests/cpp/run_sanitizers.sh.

The builds take a minute or more, so the script's phase lines ("=== tsan: compiling", each
binary's totals) are shown as they happen, past pytest's output capture; a failing case's line too.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time

import pytest

SCRIPT = pathlib.Path(__file__).parent / "cpp" / "run_sanitizers.sh"
TIMEOUT_S = 900


def _shown(line: str) -> bool:
    return line.startswith("===") or line.startswith("[ FAIL ]") or line.endswith(" failed")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_core_under_sanitizers(capsys: pytest.CaptureFixture[str]) -> None:
    env = dict(os.environ, PYTHON=sys.executable)  # builds the stand-in driver
    began = time.monotonic()
    proc = subprocess.Popen(["bash", str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, bufsize=1)
    watchdog = threading.Timer(TIMEOUT_S, proc.kill)
    watchdog.start()
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        with capsys.disabled():
            print(f"\n  [sanitizers] building and running {SCRIPT.relative_to(SCRIPT.parents[2])} "
                  f"(takes a minute or more)", flush=True)
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                lines.append(line)
                if _shown(line):
                    print(f"  [sanitizers {time.monotonic() - began:5.0f} s] {line}", flush=True)
        rc = proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()  # an unclosed pipe is an unraisable warning, an error under -W error
    output = "\n".join(lines)
    assert rc == 0, f"exit status {rc}" + (f" (killed after {TIMEOUT_S} s)" if rc == -9 else "") + "\n" + output[-12000:]
    last = lines[-1] if lines else ""
    assert last.endswith(" 0 failed") and not last.startswith("0 passed"), last
