"""The quick subset (`pytest -m quick`) stays quick: few files, few tests, none slow."""
from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_TESTS = 300  # about a minute on two cores when this was set (see the README's Set-up)
MAX_FILES = 10


def test_the_quick_subset_stays_small_and_leaves_out_slow_tests():
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", "quick", str(REPO / "tests")], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    files = Counter(i.split("::", 1)[0] for i in ids)
    assert 100 <= len(ids) <= MAX_TESTS, (len(ids), files)
    assert len(files) <= MAX_FILES, files
    assert {"tests/test_loader.py", "tests/test_sampler.py", "tests/test_readme.py"} <= set(files)
    slow = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", "quick and (slow or distributed or cuda)", str(REPO / "tests")],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert not [line for line in slow.stdout.splitlines() if "::" in line]
