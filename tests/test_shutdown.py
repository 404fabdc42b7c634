"""Threads stop cleanly: breaking out, deleting the loader, a new epoch mid-epoch, an error on a
native thread, Ctrl-C, interpreter exit and fork."""
from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import fastload as fl

from conftest import native_thread_count

TIMEOUT = 60


def run_python(code: str, timeout: float = TIMEOUT, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def big_loader(**kw):
    return fl.Loader(fl.Dataset({"x": np.zeros((20_000, 256), np.float32)}), batch_size=64, shuffle=True, **kw)


def test_break_delete_and_close_leave_no_threads():
    gc.collect()
    before = native_thread_count()
    loader = big_loader(num_threads=4)
    assert native_thread_count() == before + 4
    for i, _ in enumerate(loader):
        if i == 3:
            break
    for i, _ in enumerate(loader):  # a new epoch after breaking out
        if i == 2:
            break
    del loader
    gc.collect()
    assert native_thread_count() == before
    with big_loader(num_threads=2) as loader:
        next(iter(loader))
    assert native_thread_count() == before


def test_new_epoch_mid_epoch_ends_the_old_iterator():
    loader = big_loader(num_threads=2, prefetch=2)
    old = iter(loader)
    next(old)
    new = iter(loader)
    assert len(list(new)) == len(loader)
    with pytest.raises(RuntimeError, match="ended by a newer iter"):
        next(old)


def test_use_after_close_is_an_error():
    loader = big_loader(num_threads=1)
    loader.close()
    loader.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


@pytest.mark.parametrize("threads,prefetch", [(1, 2), (2, 2), (2, 8), (3, 16)])
@pytest.mark.parametrize("fail_at", [0, 5, 29])
def test_error_on_a_native_thread_reaches_the_caller(fail_at, threads, prefetch):
    """The batches before the failed one are handed out, then next() raises naming it: the same
    batch number, and the same count handed out before it, for any threads and prefetch (issue 33:
    "batch 129" after 128 batches, "batch 102" after 102, depending on timing)."""
    loader = fl.Loader(fl.Dataset({"x": np.arange(20_000)}), batch_size=64, shuffle=True, num_threads=threads,
                       prefetch=prefetch)
    loader._fail_at_batch = fail_at
    got = []
    with pytest.raises(RuntimeError, match=f"collation thread failed on batch {fail_at} of epoch 0 .this iterator's "
                                           f"batches, counted from 0: the {fail_at} before it were handed out.: "
                                           "injected failure"):
        for b in loader:
            got.append(b["x"].numpy().copy())
    assert len(got) == fail_at
    if got:
        np.testing.assert_array_equal(np.concatenate(got), loader.plan(0)[:fail_at * 64])
    loader._fail_at_batch = -1
    assert len(list(loader)) == len(loader)  # the loader still works afterwards


def test_interpreter_exit_with_a_live_loader_mid_epoch():
    t = time.perf_counter()
    result = run_python("""
        import numpy as np, fastload as fl
        loader = fl.Loader(fl.Dataset({"x": np.zeros((100_000, 64), np.float32)}), batch_size=32, shuffle=True)
        it = iter(loader)
        next(it)
        keep = next(it)
        print("ok")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert time.perf_counter() - t < 30


def test_ctrl_c_while_waiting_for_a_batch():
    # One thread building 64 MB batches: the main thread spends its time waiting in next().
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, numpy as np, fastload as fl
        x = np.ones((1024, 1 << 18), np.uint8)
        loader = fl.Loader(fl.Dataset({"x": x}), batch_size=256, shuffle=True, num_threads=1, prefetch=1)
        print("ready", flush=True)
        try:
            while True:
                for batch in loader:
                    pass
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
    """)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 3, err
    assert "interrupted" in out


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_fork_child_gets_a_clear_error_and_a_fresh_loader_works():
    loader = big_loader(num_threads=2)
    it = iter(loader)
    next(it)  # threads are busy prefetching
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 1
        try:
            try:
                next(it)
                msg = "no error"
            except RuntimeError as e:
                msg = str(e)
            try:
                iter(loader)
            except RuntimeError:
                pass
            else:
                msg += "; iter() did not raise"
            fresh = fl.Loader(fl.Dataset({"x": np.arange(100)}), batch_size=10, num_threads=2)
            n = sum(len(b["x"]) for b in fresh)
            del loader  # the parent's loader is dropped in the child: must not hang
            os.write(w, f"{msg}|{n}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.time() + TIMEOUT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("forked child hung")
        time.sleep(0.05)
    report = os.read(r, 4096).decode()
    os.close(r)
    assert os.waitstatus_to_exitcode(status) == 0, report
    msg, n = report.split("|")
    assert "created before a fork" in msg and n == "100"
    assert len(list(it)) > 0  # the parent is unaffected


def test_a_loader_dropped_on_a_thread_its_collation_waits_for_does_not_wait():
    """Garbage collection may run a Loader's finaliser on one of fastload's own threads (a
    download thread a collation thread is waiting for). There the finaliser must not wait for the
    collation threads: it closes from a thread of its own, and the threads still end."""
    import threading

    inside, release = threading.Event(), threading.Event()

    class Waits:
        def __len__(self):
            return 64

        def __getitem__(self, i):
            if threading.current_thread() is not threading.main_thread():  # not the first sample's probe
                inside.set()
                release.wait(30)  # what a collation thread does while its download is in flight
            return np.float32(i)

    gc.collect()
    before = native_thread_count()
    held = [fl.Loader(Waits(), batch_size=4, num_threads=1, timeout=20)]
    held.append(iter(held[0]))
    assert inside.wait(10)
    took = []

    def download():  # the thread the collation thread waits for drops the last references
        t0 = time.monotonic()
        held.clear()  # without the fix: 20 s (the timeout), then the collation thread left behind
        took.append(time.monotonic() - t0)
        release.set()

    t = threading.Thread(target=download, name="fastload-fetch-test")
    t.start()
    t.join(30)
    assert took and took[0] < 2.0, took
    deadline = time.monotonic() + 20
    while native_thread_count() != before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert native_thread_count() == before
