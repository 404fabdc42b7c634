"""`python -m fastload` (the demo job) runs end to end with tiny settings and prints its summary."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Small enough to finish in a few seconds anywhere (most of it is importing torch).
SMALL = ["--samples", "3000", "--features", "16", "--batch-size", "64", "--hidden", "32", "--lr", "0.01",
         "--no-progress"]
TINY = [*SMALL, "--steps", "30", "--log-every", "10"]
SUMMARY = [r"fastload summary: 30 steps, 1,920 samples", r"throughput +[\d,]+ samples/s",
           r"data wait +[\d.]+% of step time", r"loss +[\d.]+ -> [\d.]+", r"dataset +3,000 x 16 float16",
           r"settings +threads=\d+ (\(auto\) )?prefetch=\d+ \(auto\) copy_streams=n/a batch-size=64 device=\S+",
           r"\(n/a: on the CPU there are no copy streams, and nothing to synchronise"]


def run_main(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fastload", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_main_runs_and_prints_the_summary(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = run_main(*TINY, "--data-dir", str(data))
    assert first.returncode == 0, first.stderr
    for pattern in SUMMARY:
        assert re.search(pattern, first.stdout), (pattern, first.stdout)
    assert "writing" in first.stderr and "step 30/30" in first.stderr
    assert "\r" not in first.stderr  # not a terminal: plain lines, no bar
    initial, final = map(float, re.search(r"loss +([\d.]+) -> ([\d.]+)", first.stdout).groups())
    assert final < initial  # the labels are learnable

    # A matching dataset in --data-dir is reused, not rewritten; the folder is kept.
    again = run_main(*TINY, "--data-dir", str(data), "--threads", "1", "--prefetch", "2")
    assert again.returncode == 0, again.stderr
    assert "reusing" in again.stderr
    assert re.search(r"threads=1 prefetch=2 copy_streams", again.stdout), again.stdout
    assert sorted(p.name for p in data.iterdir()) == ["demo_features.npy", "demo_labels.npy", "demo_meta.json"]


def test_data_dir_with_a_tilde_is_the_home_folders(tmp_path: Path) -> None:
    """`--data-dir=~/x` reaches the program unexpanded (the shell expands a leading ~ only): it is
    the home folder's x, not a folder named "~" in the working directory."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    done = subprocess.run([sys.executable, "-m", "fastload", *TINY, "--data-dir=~/demo"], capture_output=True,
                          text=True, timeout=60, cwd=work, env={**os.environ, "HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert (home / "demo" / "demo_features.npy").exists() and not list(work.iterdir())


def test_help_documents_the_options() -> None:
    helped = run_main("--help")
    assert helped.returncode == 0
    for option in ("--samples", "--features", "--data-dir", "--steps", "--threads", "--prefetch",
                   "--batch-size", "--device", "--sync", "--compare", "--no-progress", "--log-every"):
        assert option in helped.stdout
    words = " ".join(helped.stdout.split())  # help text is wrapped to the terminal's width
    assert "nothing to synchronise" in words and "python -m fastload tune" in words
    tune = run_main("tune", "--help")
    assert tune.returncode == 0 and "--batch-size" in tune.stdout and "--plot" in tune.stdout


def test_compare_runs_the_same_loop_on_torch_dataloader(tmp_path: Path) -> None:
    done = run_main(*TINY, "--threads", "1", "--compare", "--data-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "torch.utils.data.DataLoader (1 workers" in done.stderr
    assert done.stderr.count("step 30/30") == 2  # both runs, the same number of steps
    line = re.search(r"compared +fastload ([\d,]+) samples/s, data wait [\d.]+% \| torch DataLoader \(1 workers\) "
                     r"([\d,]+) samples/s, data wait [\d.]+% \| fastload/DataLoader ([\d.]+)x", done.stdout)
    assert line, done.stdout
    ours, theirs, ratio = (float(g.replace(",", "")) for g in line.groups())
    assert ours > 0 and theirs > 0 and abs(ratio - ours / theirs) < 0.01 * ratio + 0.01


@pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="needs POSIX signals")
def test_ctrl_c_prints_the_summary_so_far(tmp_path: Path) -> None:
    log = tmp_path / "stderr.txt"
    with open(log, "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "fastload", *SMALL, "--steps", "1000000", "--log-every", "5"],
                                stdout=subprocess.PIPE, stderr=err_file, text=True)
    try:
        # Wait until training is under way (a progress line), then interrupt as Ctrl-C would.
        deadline = time.monotonic() + 60
        while "step " not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    err = log.read_text()
    assert proc.returncode == 130, err
    assert re.search(r"fastload summary: interrupted after \d+ of 1000000 steps", out), out
    assert "Traceback" not in err
