"""workers="processes": spawned worker processes write samples into shared-memory batch slots.
Every batch is compared with the thread workers' batches (themselves checked against the dataset
in test_python_source.py); failures of the dataset and of the workers themselves must reach the
training loop as clear errors, and no process may outlive its loader."""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import fastload as fl


class Records:
    """Picklable (module level): every leaf kind, the sample's own rng draw, a string."""

    def __init__(self, n=90, die_at=-1, raise_at=-1, kill_at=-1, sleep_at=-1):
        self.n, self.die_at, self.raise_at, self.kill_at, self.sleep_at = n, die_at, raise_at, kill_at, sleep_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.die_at:
            os._exit(3)
        if i == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if i == self.raise_at:
            raise ValueError(f"bad record {i}")
        if i == self.sleep_at:
            time.sleep(60)
        return {"x": np.arange(4, dtype=np.float32) + i, "y": i, "name": f"r{i}", "noise": fl.sample_rng().random(2),
                "t": torch.full((2,), i, dtype=torch.int16)}


def batches(loader):
    return [b for b in loader]


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], list):
                assert x[k] == y[k], k
            else:
                assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), k


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_processes_give_the_batches_threads_give_across_epochs_and_resume():
    kw = dict(batch_size=8, shuffle=True, seed=7, device="cpu", with_index=True)
    threads = fl.Loader(Records(), num_workers=2, **kw)
    procs = fl.Loader(Records(), num_workers=2, workers="processes", **kw)
    for _ in range(2):  # the workers persist into the second epoch
        same(batches(procs), batches(threads))
    pids = procs._workers.pids()
    assert len(pids) == 2 and all(alive(p) for p in pids)
    it = iter(procs)
    head = [next(it) for _ in range(3)]
    state = procs.state_dict()
    procs.close()
    assert not any(alive(p) for p in pids), "close() must reap the worker processes"
    resumed = fl.Loader(Records(), num_workers=3, workers="processes", **kw)
    resumed.load_state_dict(state)
    threads.set_epoch(2)
    same(head + batches(resumed), batches(threads))
    resumed.close()


def test_collate_fn_and_getitems_run_in_the_workers():
    procs = fl.Loader(Batched(), 5, device="cpu", workers="processes", num_workers=2, collate_fn=summarise)
    out = batches(procs)
    assert [b["pids"] != {os.getpid()} for b in out] == [True] * 4
    assert sum(b["sum"] for b in out) == sum(range(20))
    procs.close()


@pytest.mark.slow
def test_ranks_with_process_workers_get_the_thread_workers_batches():
    kw = dict(batch_size=6, shuffle=True, seed=3, device="cpu", with_index=True, rank=1, world_size=2, even="mask")
    procs = fl.Loader(Records(n=41), num_workers=3, workers="processes", **kw)
    same(batches(procs), batches(fl.Loader(Records(n=41), num_workers=1, **kw)))
    procs.close()


class MarksItsDeath:
    """Writes the time to a file, then ends its worker process without a word at sample `at`."""

    def __init__(self, path, at):
        self.path, self.at = path, at

    def __len__(self):
        return 400

    def __getitem__(self, i):
        if i == self.at:
            with open(self.path, "w") as f:
                f.write(repr(time.time()))
            os._exit(9)
        time.sleep(0.002)
        return {"v": i}


def test_a_worker_death_reaches_the_loop_within_seconds_of_it(tmp_path):
    loader = fl.Loader(MarksItsDeath(str(tmp_path / "died"), 150), 4, device="cpu", workers="processes",
                       num_workers=2, prefetch=4)
    with pytest.raises(RuntimeError, match=r"exited with status 9 while building the batch of dataset\[\d+\]"):
        batches(loader)
    raised = time.time()
    died = float((tmp_path / "died").read_text())
    assert raised - died < 3.0, f"the error came {raised - died:.1f} s after the worker died"
    pids = loader._workers.pids()
    loader.close()
    assert not any(alive(p) for p in pids)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_ctrl_c_while_next_waits_for_a_batch_interrupts_it_and_the_loader_goes_on(kind):
    # The Ctrl-C lands while the loop is blocked inside next(), waiting for workers that are in
    # __getitem__ (a batch takes ~0.4 s): next() must raise KeyboardInterrupt promptly, the loader
    # must start another epoch afterwards, and close() must end everything, with nothing on stderr.
    proc = _run(f"""
        import os, signal, threading, time
        import fastload as fl
        from test_python_workers import Slow
        if __name__ == "__main__":
            loader = fl.Loader(Slow(), 20, device="cpu", workers={kind!r}, num_workers=2, prefetch=2)
            it = iter(loader)
            next(it)
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            began = time.monotonic()
            try:
                while True:
                    next(it)
            except KeyboardInterrupt:
                print("interrupted after", round(time.monotonic() - began, 2))
            print("again", next(iter(loader))["v"].shape[0])
            pids = loader._workers.pids() if loader._workers else []
            began = time.monotonic()
            loader.close()
            print("closed in", round(time.monotonic() - began, 2))
            print("pids", *pids)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert 0.25 <= float(out.split("interrupted after")[1].split()[0]) < 2.0, out
    assert "again 20" in out and float(out.split("closed in")[1].split()[0]) < 5.0, out
    pids = [int(p) for p in out.split("pids")[1].split()]
    assert len(pids) == (2 if kind == "processes" else 0) and not any(alive(p) for p in pids)


@pytest.mark.slow
def test_exit_after_a_worker_died_without_close_leaves_no_process():
    proc = _run("""
        import fastload as fl
        from test_python_workers import Records
        if __name__ == "__main__":
            loader = fl.Loader(Records(n=200, die_at=21), 4, device="cpu", workers="processes", num_workers=2)
            try:
                list(loader)
            except RuntimeError as e:
                print("died:", "exited with status 3" in str(e))
            print("pids", *loader._workers.pids())  # no close(): the interpreter's exit must end the other one
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "died: True" in proc.stdout
    pids = [int(p) for p in proc.stdout.split("pids")[1].split()]
    time.sleep(0.5)
    assert len(pids) == 2 and not any(alive(p) for p in pids)


class Batched:
    def __len__(self):
        return 20

    def __getitem__(self, i):
        raise AssertionError("__getitems__ is used")

    def __getitems__(self, ids):
        return [{"v": int(i), "pid": os.getpid()} for i in ids]


def summarise(samples):
    return {"sum": sum(s["v"] for s in samples), "pids": {s["pid"] for s in samples}}


def test_an_exception_in_a_worker_carries_the_index_the_original_type_and_its_traceback():
    loader = fl.Loader(Records(raise_at=37), 6, device="cpu", workers="processes", num_workers=2)
    with pytest.raises(fl.SampleError) as e:
        batches(loader)
    text = str(e.value)
    assert "dataset.__getitem__(37) raised ValueError: bad record 37" in text
    assert "in worker process" in text and "The worker's traceback" in text and "__getitem__" in text
    assert isinstance(e.value.__cause__, ValueError) and e.value.__cause__.args == ("bad record 37",)
    loader.close()


@pytest.mark.parametrize("how,said", [("die_at", "exited with status 3"), ("kill_at", r"was killed by signal 9 \(SIGKILL\)")])
def test_a_dying_worker_is_a_clear_error_within_seconds_and_leaves_no_process(how, said):
    loader = fl.Loader(Records(**{how: 21}), 4, device="cpu", workers="processes", num_workers=2, prefetch=2)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"worker process \d \(pid \d+\) {said} while building the batch of"):
        batches(loader)
    assert time.monotonic() - t0 < 30
    pids = loader._workers.pids()
    loader.close()
    assert not any(alive(p) for p in pids)


def test_a_sample_that_never_returns_times_out_and_close_ends_its_worker():
    loader = fl.Loader(Records(sleep_at=10), 4, device="cpu", workers="processes", num_workers=2, timeout=1.0)
    with pytest.raises(TimeoutError, match=r"batch starting at dataset\[8\] has not come back from worker process "
                                           r"\d after \d+ ms \(timeout=1 s\)"):
        batches(loader)
    pids = loader._workers.pids()
    t0 = time.monotonic()
    loader.close()
    assert time.monotonic() - t0 < 15 and not any(alive(p) for p in pids)


def test_a_dataset_that_cannot_be_pickled_is_refused_at_construction():
    class Local:  # a class defined in a function cannot be pickled by reference
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {"v": i}

    with pytest.raises(TypeError, match="pickling it once, and Local cannot be pickled"):
        fl.Loader(Local(), 1, device="cpu", workers="processes")
    with pytest.raises(ValueError, match="workers='processes' runs a Python dataset"):
        fl.Loader(fl.Dataset({"x": np.zeros(3)}), 1, device="cpu", workers="processes")


def _run(code: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=os.path.dirname(__file__))


def test_ctrl_c_break_and_exit_with_process_workers_leave_nothing_behind():
    proc = _run("""
        import os, signal, threading, time
        import fastload as fl
        from test_python_workers import Records
        if __name__ == "__main__":
            loader = fl.Loader(Records(n=5000), 8, device="cpu", workers="processes", num_workers=2)
            pids = []
            try:
                for k, b in enumerate(loader):
                    pids = loader._workers.pids()
                    if k == 3:
                        os.kill(os.getpid(), signal.SIGINT)  # the workers ignore it; the loop gets it
                        time.sleep(1)
            except KeyboardInterrupt:
                print("interrupted")
            for k, b in enumerate(loader):  # the workers survived the Ctrl-C: a new epoch runs
                if k == 2:
                    break
            print("after break")
            other = fl.Loader(Records(n=5000), 8, device="cpu", workers="processes", num_workers=2)
            threading.Thread(target=lambda: [None for _ in other], daemon=True).start()
            time.sleep(4)
            print("pids", *(pids + other._workers.pids()))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "interrupted" in proc.stdout and "after break" in proc.stdout
    pids = [int(p) for p in proc.stdout.split("pids")[1].split()]
    time.sleep(0.5)
    assert len(pids) == 4 and not any(alive(p) for p in pids), "worker processes outlived the interpreter"


class Slow:
    """Picklable: every sample takes 20 ms, so a batch is always being built when the loader closes."""

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        time.sleep(0.02)
        return {"v": i}


def test_closing_while_workers_build_batches_is_silent_and_ends_them():
    # Workers replying to a loader that has just closed their socket must leave quietly: a
    # BrokenPipeError traceback from every worker on the user's stderr at each close() is noise.
    proc = _run("""
        import time
        import fastload as fl
        from test_python_workers import Slow
        if __name__ == "__main__":
            for _ in range(2):
                loader = fl.Loader(Slow(), 8, device="cpu", workers="processes", num_workers=2)
                next(iter(loader))
                pids = loader._workers.pids()
                loader.close()  # both workers are inside a batch now
            time.sleep(0.5)
            print("pids", *pids)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr[-3000:]
    pids = [int(p) for p in proc.stdout.split("pids")[1].split()]
    assert len(pids) == 2 and not any(alive(p) for p in pids)


class BrokenOnArrival:
    def __init__(self):
        self.path = "records.db"  # some state, so that unpickling calls __setstate__

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"v": i}

    def __setstate__(self, state):
        raise OSError("cannot reopen the database")


def test_a_dataset_that_fails_to_unpickle_in_the_worker_is_reported_when_the_workers_start():
    loader = fl.Loader(BrokenOnArrival(), 2, device="cpu", workers="processes", num_workers=1)
    with pytest.raises(RuntimeError, match="worker process 0: the dataset could not be set up in the worker: "
                                           "cannot reopen the database") as e:
        iter(loader)
    assert isinstance(e.value.__cause__, OSError)
    loader.close()


class DiesOnArrival(BrokenOnArrival):
    def __setstate__(self, state):
        os._exit(5)


def test_a_worker_that_dies_while_starting_is_named_with_its_exit_code():
    loader = fl.Loader(DiesOnArrival(), 2, device="cpu", workers="processes", num_workers=2)
    with pytest.raises(RuntimeError, match=r"worker process 0 \(pid \d+\) exited with code 5 while starting"):
        iter(loader)
    loader.close()


def test_the_payload_is_the_dataset_pickled_once():
    source = fl.PythonSource(Records(n=5))
    dataset, use_getitems, collate, init, leaves, tree, size = pickle.loads(pickle.dumps(source.worker_payload()))
    assert isinstance(dataset, Records) and size == 5 and not use_getitems and collate is None and init is None


GPU_WITH_PROCESS_WORKERS = """
    import ctypes, gc, os, sys, tempfile
    import numpy as np
    sys.path.insert(0, ".")
    from fake_cuda import build
    os.environ["FASTLOAD_LIBCUDA"] = str(build.build(tempfile.mkdtemp()))
    import fastload as fl
    from test_python_workers import Records
    lib = ctypes.CDLL(os.environ["FASTLOAD_LIBCUDA"])
    lib.fake_cuda_stat.restype = ctypes.c_longlong
    lib.fake_cuda_misuse_message.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]

    def misuses():
        out = []
        for i in range(lib.fake_cuda_misuse_count()):
            buf = ctypes.create_string_buffer(512)
            lib.fake_cuda_misuse_message(i, buf, 512)
            out.append(buf.value.decode())
        return out

    if __name__ == "__main__":
        want = {}  # (epoch, sample) -> x, noise, from thread workers
        cpu = fl.Loader(Records(n=300), 16, device="cpu", shuffle=True, seed=5, num_workers=2)
        for epoch in range(2):
            for b in cpu:
                for i, x, noise in zip(b["y"].tolist(), b["x"], b["noise"]):
                    want[epoch, i] = (x.numpy(), noise.numpy())
        loader = fl.Loader(Records(n=300), 16, device="cuda:0", shuffle=True, seed=5, workers="processes",
                           num_workers=2, prefetch=3)
        loader._raw_device_batches = True
        MISUSE
        for epoch in range(2):
            seen = []
            for b in loader:
                ids = np.frombuffer(b["y"].read(), np.int64)
                x = np.frombuffer(b["x"].read(), np.float32).reshape(b["x"].shape)
                noise = np.frombuffer(b["noise"].read(), np.float64).reshape(b["noise"].shape)
                for k, i in enumerate(ids):
                    assert (x[k] == want[epoch, i][0]).all() and (noise[k] == want[epoch, i][1]).all(), i
                assert b["name"] == [f"r{i}" for i in ids]
                seen += ids.tolist()
                registered = lib.fake_cuda_stat(b"registered_bytes")
            assert sorted(seen) == list(range(300)), epoch
        mem = loader._memory()
        print("registered", registered, "pinned", mem["pinned_bytes"], "allocations", lib.fake_cuda_stat(b"pinned_allocations"))
        loader.close()
        gc.collect()
        print("after close", lib.fake_cuda_stat(b"registered_bytes"))
        print("misuses", len(misuses()), misuses()[:1])
"""


def test_process_workers_feed_the_stand_in_gpu_through_page_locked_shared_memory():
    # The workers write samples into shared-memory slots; the main process page-locks each slot
    # once (cuMemHostRegister) and the transfer engine copies straight from it: no cuMemHostAlloc
    # staging slot, no misuse the stand-in can see (it refuses copies from unregistered memory),
    # every sample right, and every registration undone before its segment is unmapped.
    proc = _run(GPU_WITH_PROCESS_WORKERS.replace("MISUSE", ""), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.split()
    registered, pinned, allocations = int(out[1]), int(out[3]), int(out[5])
    assert registered > 0 and registered == pinned, proc.stdout  # every slot registered, none allocated
    assert allocations == 0, proc.stdout
    assert "after close 0" in proc.stdout and "misuses 0" in proc.stdout, proc.stdout


def test_the_stand_in_refuses_copies_from_unregistered_worker_memory():
    # The deliberate misuse: shared slots never page-locked. The stand-in must see it.
    proc = _run(GPU_WITH_PROCESS_WORKERS.replace("MISUSE", 'loader._engine._set_misuse("skip_host_register")'),
                timeout=180)
    assert proc.returncode != 0 or "misuses 0" not in proc.stdout, proc.stdout
    assert "source not page-locked" in proc.stderr + proc.stdout, (proc.stdout, proc.stderr[-2000:])


# ---------------------------------------------------------------- issue 26
class Pids:
    """Picklable: each sample says which process built it."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"i": i, "pid": os.getpid()}


class StuckOnce:
    """Picklable: sample 10 never returns the first time it is read (a marker file says so)."""

    def __init__(self, marker):
        self.marker = marker

    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 10 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            time.sleep(120)
        return {"i": i}


def test_a_stuck_worker_process_is_replaced_at_the_next_epoch(tmp_path):
    loader = fl.Loader(StuckOnce(str(tmp_path / "stuck")), 4, device="cpu", workers="processes", num_workers=2,
                       timeout=1.0)
    try:
        with pytest.raises(TimeoutError):
            batches(loader)
        old = loader._workers.pids()
        t0 = time.monotonic()
        got = sorted(int(v) for b in batches(loader) for v in b["i"])  # the next epoch: not blocked
        assert time.monotonic() - t0 < 60
        assert got == list(range(40))
        assert not any(alive(p) for p in old if p not in loader._workers.pids())
    finally:
        loader.close()


def test_a_forked_childs_exit_leaves_the_parents_worker_processes_alone():
    proc = _run("""
        import os, sys
        import fastload as fl
        from test_python_workers import Pids
        if __name__ == "__main__":
            loader = fl.Loader(Pids(), 4, device="cpu", workers="processes", num_workers=2)
            it = iter(loader)
            seen = [int(v) for v in next(it)["i"]]
            child = os.fork()
            if child == 0:
                sys.exit(0)  # multiprocessing's exit handler runs here, in the child
            os.waitpid(child, 0)
            seen += [int(v) for b in it for v in b["i"]]
            print("seen", len(seen), sorted(seen) == list(range(64)))
            again = [int(v) for b in loader for v in b["i"]]  # a new epoch: the workers must still be there
            print("again", len(again), sorted(again) == list(range(64)))
            loader.close()
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "seen 64 True" in proc.stdout and "again 64 True" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_ctrl_c_while_worker_processes_start_keeps_processes_and_prints_no_worker_traceback():
    code = textwrap.dedent("""
        import os, signal, threading, time
        import fastload as fl
        from test_python_workers import Pids
        if __name__ == "__main__":
            loader = fl.Loader(Pids(), 4, device="cpu", workers="processes", num_workers=2)
            # Ctrl-C goes to the whole process group, workers starting included.
            threading.Timer(0.3, lambda: os.killpg(os.getpgid(0), signal.SIGINT)).start()
            try:
                for b in loader:
                    pass
                print("not interrupted")
            except KeyboardInterrupt:
                print("interrupted")
            pids = {int(p) for b in loader for p in b["pid"]}
            print("main", os.getpid(), "built by", *sorted(pids))
            loader.close()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(__file__), start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "interrupted" in proc.stdout, proc.stdout
    main = int(proc.stdout.split("main")[1].split()[0])
    built = {int(p) for p in proc.stdout.split("built by")[1].split()}
    assert main not in built and len(built) >= 1, proc.stdout  # the next epoch runs in worker processes
    assert "KeyboardInterrupt" not in proc.stderr, proc.stderr[-3000:]


def test_a_lambda_collate_fn_or_worker_init_fn_is_named_when_it_cannot_be_pickled():
    with pytest.raises(TypeError, match=r"collate_fn .*cannot be pickled"):
        fl.Loader(Records(), 4, device="cpu", workers="processes", collate_fn=lambda s: s)
    with pytest.raises(TypeError, match=r"worker_init_fn .*cannot be pickled"):
        fl.Loader(Records(), 4, device="cpu", workers="processes", worker_init_fn=lambda k: None)


class TorchRandom:
    """Picklable: an augmentation that draws from torch's and Python's global generators, as
    torchvision's random transforms do."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        import random
        return {"t": torch.rand(3), "r": random.random()}


def test_processes_seed_torch_and_random_per_sample_from_seed_epoch_and_index():
    def run(seed, workers, epochs=2):
        with fl.Loader(TorchRandom(), 4, device="cpu", workers="processes", num_workers=workers, seed=seed,
                       shuffle=True) as loader:
            out = []
            for _ in range(epochs):
                rows = {}
                for b in loader:
                    for k in range(len(b["r"])):
                        rows[float(b["r"][k])] = b["t"][k]
                out.append(rows)
            return out

    a, b, c = run(7, 2), run(7, 1), run(8, 2)
    for ea, eb in zip(a, b):  # the same seed: the same draws for any number of workers
        assert sorted(ea) == sorted(eb)
        assert all(torch.equal(ea[k], eb[k]) for k in ea)
    assert sorted(a[0]) != sorted(a[1])  # another epoch: other draws
    assert sorted(a[0]) != sorted(c[0])  # another seed: other draws
