"""Map-style Python datasets (fastload._sources.python, csrc/bindings/py_source.cpp): every batch
is compared with what the dataset itself returns for the loader's plan (the reference is the
dataset read one sample at a time in plain Python), on the structures, dtypes and errors users
meet, on any worker count, across ranks and resumes."""
from __future__ import annotations

import collections
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

import fastload as fl


class Rows(torch.utils.data.Dataset):
    """A dict sample of every leaf kind, each a function of the index."""

    def __init__(self, n=203, jitter=0.0):
        self.n, self.jitter = n, jitter

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.jitter:
            time.sleep(self.jitter * ((i * 7919) % 5) / 4)  # uneven per sample: workers finish out of order
        return {"x": np.arange(6, dtype=np.float32).reshape(2, 3) + i, "y": i, "w": i / 2, "flag": i % 3 == 0,
                "name": f"s{i}", "t": torch.tensor([i, -i], dtype=torch.int16), "u": np.uint16(i)}


def expected(ds, ids):
    samples = [ds[int(i)] for i in ids]
    return {"x": np.stack([s["x"] for s in samples]), "y": np.array([s["y"] for s in samples], np.int64),
            "w": np.array([s["w"] for s in samples], np.float32), "flag": np.array([s["flag"] for s in samples]),
            "name": [s["name"] for s in samples], "t": np.stack([s["t"].numpy() for s in samples]),
            "u": np.array([s["u"] for s in samples], np.uint16)}


def check_batch(batch, ref):
    for k, v in ref.items():
        if isinstance(v, list):
            assert batch[k] == v, k
        else:
            got = batch[k].numpy()
            assert got.dtype == v.dtype, (k, got.dtype, v.dtype)
            assert np.array_equal(got, v), k


def all_batches(loader):
    return [b for b in loader]


def test_dict_samples_arrive_collated_with_dtypes_as_default_collate_gives():
    ds = Rows()
    loader = fl.Loader(ds, batch_size=16, shuffle=True, seed=3, device="cpu", with_index=True, num_workers=2)
    plan = loader.plan(0)
    batches = all_batches(loader)
    assert len(batches) == len(loader) == 13
    ids = torch.cat([b["index"] for b in batches]).numpy()
    assert np.array_equal(ids, plan)
    pos = 0
    for b in batches:
        n = len(b["index"])
        check_batch(b, expected(ds, plan[pos:pos + n]))
        pos += n
    b = batches[0]
    assert b["y"].dtype == torch.int64 and b["w"].dtype == torch.float32 and b["flag"].dtype == torch.bool
    assert b["u"].dtype == torch.uint16 and b["t"].dtype == torch.int16 and b["x"].shape == (16, 2, 3)


def test_a_torch_dataset_in_the_quick_start_form_trains():
    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return torch.tensor([float(i)]), torch.tensor(float(i * i))

    loader = fl.Loader(Squares(), batch_size=8, shuffle=True, device="cpu")
    seen = []
    for x, y in loader:
        assert x.shape == (8, 1) and y.shape == (8,)
        assert torch.equal(x[:, 0] ** 2, y)
        seen += x[:, 0].tolist()
    assert sorted(seen) == [float(i) for i in range(64)]


def test_tuples_lists_namedtuples_nested_and_bare_arrays_keep_their_structure():
    Pair = collections.namedtuple("Pair", "a b")

    class Nested:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return (Pair(np.float64(i), [i, "x" * i]), {"inner": {"v": np.full(2, i, np.int8), "s": np.str_(i)}})

    b = next(iter(fl.Loader(Nested(), batch_size=4, device="cpu")))
    assert isinstance(b, tuple) and isinstance(b[0], Pair)
    assert b[0].a.dtype == torch.float64 and b[0].a.tolist() == [0, 1, 2, 3]
    assert isinstance(b[0].b, list) and b[0].b[0].tolist() == [0, 1, 2, 3] and b[0].b[1] == ["", "x", "xx", "xxx"]
    assert b[1]["inner"]["v"].tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]]
    assert b[1]["inner"]["s"] == ["0", "1", "2", "3"]  # numpy strings are objects, as Python's

    class Bare:
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return np.full((2,), i, np.int32)

    assert next(iter(fl.Loader(Bare(), batch_size=5, device="cpu"))).tolist() == [[i, i] for i in range(5)]


def test_getitems_is_called_once_per_batch_when_defined():
    class Batched:
        calls = []

        def __len__(self):
            return 40

        def __getitem__(self, i):
            raise AssertionError("__getitems__ should be used")

        def __getitems__(self, ids):
            self.calls.append(list(ids))
            return [{"v": np.int64(i)} for i in ids]

    ds = Batched()
    # The structure is read from one sample through __getitems__ too.
    loader = fl.Loader(ds, batch_size=8, shuffle=True, seed=1, device="cpu")
    got = [b["v"].tolist() for b in loader]
    plan = loader.plan(0).tolist()
    assert sum(got, []) == plan
    assert ds.calls[0] == [0] and sorted(map(tuple, ds.calls[1:])) == sorted(tuple(g) for g in got)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_order_and_values_do_not_depend_on_the_number_of_workers(workers):
    ds = Rows(n=97, jitter=0.002)
    loader = fl.Loader(ds, batch_size=8, shuffle=True, seed=11, device="cpu", num_workers=workers, prefetch=4)
    got = [(b["y"].tolist(), b["name"]) for b in loader]
    ref_loader = fl.Loader(Rows(n=97), batch_size=8, shuffle=True, seed=11, device="cpu", num_workers=1)
    assert got == [(b["y"].tolist(), b["name"]) for b in ref_loader]


def test_resume_mid_epoch_continues_with_exactly_the_next_batch():
    ds = Rows(n=150)
    full = [b["y"].tolist() for b in fl.Loader(ds, 10, shuffle=True, seed=5, device="cpu")]
    a = fl.Loader(ds, 10, shuffle=True, seed=5, device="cpu", num_workers=2)
    it = iter(a)
    head = [next(it)["y"].tolist() for _ in range(6)]
    state = a.state_dict()
    a.close()
    b = fl.Loader(ds, 10, shuffle=True, seed=5, device="cpu", num_workers=3)
    b.load_state_dict(state)
    assert head + [x["y"].tolist() for x in b] == full


def test_ranks_are_disjoint_equal_in_steps_and_cover_the_dataset():
    ds = Rows(n=101)
    per_rank = [[b["y"].tolist() for b in fl.Loader(ds, 7, shuffle=True, seed=2, rank=r, world_size=3, device="cpu",
                                                    even="mask", with_index=True)] for r in range(3)]
    assert len({len(p) for p in per_rank}) == 1
    loaders = [fl.Loader(ds, 7, shuffle=True, seed=2, rank=r, world_size=3, device="cpu", even="mask",
                         with_index=True) for r in range(3)]
    valid_ids = []
    for ld in loaders:
        for b in ld:
            assert b["y"].tolist() == b["index"].tolist()
            valid_ids += b["y"][b["valid"]].tolist()
    assert sorted(valid_ids) == list(range(101))


class Augmented:
    def __len__(self):
        return 60

    def __getitem__(self, i):
        rng = fl.sample_rng()
        return {"r": rng.random(3), "i": i}


def test_sample_rng_is_the_same_for_any_worker_count_and_after_resume_and_differs_by_sample_and_epoch():
    def run(workers, **kw):
        ld = fl.Loader(Augmented(), 6, shuffle=True, seed=9, device="cpu", num_workers=workers, **kw)
        return {int(i): r for b in ld for i, r in zip(b["i"].tolist(), b["r"].numpy())}

    one, three = run(1), run(3)
    assert one.keys() == three.keys() == set(range(60))
    assert all(np.array_equal(one[i], three[i]) for i in one)
    assert len({tuple(v) for v in one.values()}) == 60  # every sample its own stream
    ld = fl.Loader(Augmented(), 6, shuffle=True, seed=9, device="cpu")
    ld.set_epoch(1)
    epoch1 = {int(i): r for b in ld for i, r in zip(b["i"].tolist(), b["r"].numpy())}
    assert not any(np.array_equal(one[i], epoch1[i]) for i in one)
    other_seed = {int(i): r for b in fl.Loader(Augmented(), 6, shuffle=True, seed=10, device="cpu")
                  for i, r in zip(b["i"].tolist(), b["r"].numpy())}
    assert not any(np.array_equal(one[i], other_seed[i]) for i in one)
    # After a resume mid-epoch the remaining samples draw what they drew without the interruption.
    a = fl.Loader(Augmented(), 6, shuffle=True, seed=9, device="cpu", num_workers=2)
    it = iter(a)
    for _ in range(4):
        next(it)
    state = a.state_dict()
    b = fl.Loader(Augmented(), 6, shuffle=True, seed=9, device="cpu", num_workers=1)
    b.load_state_dict(state)
    for batch in b:
        for i, r in zip(batch["i"].tolist(), batch["r"].numpy()):
            assert np.array_equal(r, one[i])


def test_sample_rng_outside_a_fetch_and_inside_getitems_without_an_index_explain_themselves():
    with pytest.raises(RuntimeError, match="outside one there is no"):
        fl.sample_rng()

    class Batched:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return {"v": i}

        def __getitems__(self, ids):
            return [{"v": int(fl.sample_rng(i).integers(1 << 30))} for i in ids]

    a = [b["v"].tolist() for b in fl.Loader(Batched(), 4, seed=1, device="cpu", num_workers=2)]
    b = [b["v"].tolist() for b in fl.Loader(Batched(), 4, seed=1, device="cpu", num_workers=1)]
    assert a == b

    class Forgets(Batched):
        def __getitems__(self, ids):
            return [{"v": int(fl.sample_rng().integers(9))} for _ in ids]

    with pytest.raises(fl.SampleError) as e:
        list(fl.Loader(Forgets(), 4, device="cpu"))
    assert "needs the sample's index" in str(e.value.__cause__)


def test_padded_fields_get_lengths_and_are_cut_at_max_length():
    class Tokens:
        def __len__(self):
            return 30

        def __getitem__(self, i):
            return {"tokens": np.arange(i % 7, dtype=np.int32) + 1, "label": i}

    loader = fl.Loader(Tokens(), 10, device="cpu", pad={"tokens": -1}, max_length={"tokens": 5})
    for b in loader:
        labels = b["label"].tolist()
        assert b["tokens"].shape == (len(labels), 5) and b["tokens"].dtype == torch.int32
        for row, length, i in zip(b["tokens"].tolist(), b["tokens_lengths"].tolist(), labels):
            n = min(i % 7, 5)
            assert length == n and row == list(range(1, n + 1)) + [-1] * (5 - n)
    with pytest.raises(ValueError, match="pad names field 'tokens' without max_length"):
        fl.Loader(Tokens(), 10, device="cpu", pad={"tokens": 0})
    with pytest.raises(ValueError, match=r"fields the samples do not have: \['text'\]"):
        fl.Loader(Tokens(), 10, device="cpu", pad={"text": 0}, max_length={"text": 3})
    with pytest.raises(ValueError, match="pad=-1 cannot be stored as uint8"):
        fl.Loader([{"t": np.zeros(2, np.uint8)}], 1, device="cpu", pad={"t": -1}, max_length={"t": 3})


def test_a_varying_shape_without_pad_is_an_error_naming_the_sample_field_and_both_shapes():
    class Varying:
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return {"x": np.zeros(3 if i != 13 else 4, np.float32)}

    with pytest.raises(fl.SampleError, match=r"sample 13, field 'x': has shape \(4,\), the first sample's \(3,\)"):
        list(fl.Loader(Varying(), 5, device="cpu"))

    class Retyped(Varying):
        def __getitem__(self, i):
            return {"x": np.zeros(3, np.float64 if i == 7 else np.float32)}

    with pytest.raises(fl.SampleError, match="sample 7, field 'x': has dtype float64, the first sample's float32"):
        list(fl.Loader(Retyped(), 5, device="cpu"))

    class Missing(Varying):
        def __getitem__(self, i):
            return {"x": np.zeros(3, np.float32)} if i != 4 else {"y": 1}

    with pytest.raises(fl.SampleError, match=r"sample 4, field 'x': is missing \(the first sample has it\)"):
        list(fl.Loader(Missing(), 5, device="cpu"))


def test_an_exception_in_getitem_reaches_the_loop_with_index_batch_and_the_original_traceback():
    class Broken:
        def __len__(self):
            return 50

        def __getitem__(self, i):
            if i == 23:
                raise KeyError(f"no record {i}")
            return {"v": i}

    loader = fl.Loader(Broken(), 5, device="cpu", num_workers=2)
    with pytest.raises(fl.SampleError) as e:
        list(loader)
    assert "dataset.__getitem__(23) raised KeyError" in str(e.value)
    assert "batch 4 of epoch 0" in str(e.value)
    cause = e.value.__cause__
    assert isinstance(cause, KeyError) and cause.args == ("no record 23",)
    frames = []
    tb = cause.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "__getitem__" in frames
    loader.close()


def test_timeout_names_the_sample_that_never_returns():
    release = threading.Event()

    class Stuck:
        def __len__(self):
            return 20

        def __getitem__(self, i):
            if i == 6:
                release.wait(30)
            return {"v": i}

    loader = fl.Loader(Stuck(), 4, device="cpu", num_workers=2, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"dataset\[6\] has not returned after \d+ ms .*timeout=0.3"):
        list(loader)
    assert time.monotonic() - t0 < 5
    release.set()
    loader.close()


def test_collate_fn_is_the_escape_hatch_and_worker_init_fn_runs_once_per_worker():
    seen = []

    def init(worker):
        seen.append((worker, threading.get_ident()))

    def collate(samples):
        time.sleep(0.03)  # long enough that the second thread always gets a batch to build (and runs init)
        return {"sum": sum(s["v"] for s in samples), "n": len(samples)}

    loader = fl.Loader([{"v": i} for i in range(20)], 5, device="cpu", collate_fn=collate, num_workers=2,
                       worker_init_fn=init)
    out = [b for b in loader] + [b for b in loader]  # two epochs: still once per worker
    assert [b["n"] for b in out] == [5] * 8 and sum(b["sum"] for b in out) == 2 * sum(range(20))
    assert sorted(w for w, _ in seen) == [0, 1] and len({t for _, t in seen}) == 2
    with pytest.raises(ValueError, match="not possible with collate_fn"):
        fl.Loader([{"v": 1}], 1, device="cpu", collate_fn=collate, with_index=True)
    with pytest.raises(ValueError, match="with samples that are not dicts"):
        fl.Loader([(1, 2)], 1, device="cpu", even="mask")


def test_help_of_loader_names_every_refused_dataloader_argument_and_its_replacement():
    """help(fl.Loader) says what **dataloader_args does (issue 33): every refused name, with the
    replacement the error gives, from the same table."""
    import inspect

    from fastload._dataloader_args import REPLACEMENTS

    text = " ".join(inspect.getdoc(fl.Loader).split())
    assert "**dataloader_args" in text
    for name, replacement in REPLACEMENTS.items():
        assert f"{name}=: {' '.join(replacement.split())}" in text, name
    assert "{dataloader_args}" not in text


def test_dataloader_arguments_map_or_are_refused_with_the_replacement():
    ds = [{"v": i} for i in range(10)]
    with pytest.raises(TypeError, match="DataLoader's sampler=: fastload samples natively: use shuffle="):
        fl.Loader(ds, 2, sampler=object())
    with pytest.raises(TypeError, match="batch_sampler=: .*batch_size="):
        fl.Loader(ds, 2, batch_sampler=object())
    with pytest.raises(TypeError, match="prefetch_factor=: use prefetch="):
        fl.Loader(ds, 2, prefetch_factor=4)
    with pytest.raises(TypeError, match="generator=: use seed="):
        fl.Loader(ds, 2, generator=torch.Generator())
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        fl.Loader(ds, 2, bogus=1)
    with pytest.raises(ValueError, match="num_threads and num_workers name the same thing"):
        fl.Loader(ds, 2, num_threads=1, num_workers=2)
    with pytest.raises(ValueError, match="num_workers must be positive, got 0 .*no main-process mode"):
        fl.Loader(ds, 2, num_workers=0)
    with pytest.raises(ValueError, match="workers must be one of"):
        fl.Loader(ds, 2, workers="fibers")
    with pytest.raises(ValueError, match="timeout must be a non-negative number"):
        fl.Loader(ds, 2, timeout=-1)
    ld = fl.Loader(ds, 2, device="cpu", pin_memory=True, persistent_workers=True, num_workers=2, drop_last=True)
    assert ld.num_threads == 2 and len(ld) == 5
    with pytest.raises(ValueError, match="apply to Python datasets"):
        fl.Loader(fl.Dataset({"x": np.zeros(4)}), 2, pad={"x": 0})
    with pytest.raises(TypeError, match="an array is not a dataset"):
        fl.Loader(np.zeros((4, 2)), 2)


def test_stats_show_time_in_user_code_apart_from_collation():
    class Slow:
        def __len__(self):
            return 40

        def __getitem__(self, i):
            time.sleep(0.001)
            return {"v": i}

    loader = fl.Loader(Slow(), 8, device="cpu", num_workers=2)
    list(loader)
    s = loader.stats()
    assert 0.04 * 0.9 <= s.user_s <= s.collation.busy_s + 1e-3
    assert "user code" in str(s)
    assert fl.Loader(fl.Dataset({"x": np.zeros(8)}), 4, device="cpu").stats().user_s == 0


def test_user_time_of_fast_samples_is_most_of_the_workers_time_and_never_more():
    # __getitem__ is not timed call by call (two clock reads per sample would cost a sixth of a
    # small sample): the batch's loop is timed whole, less fastload's writes sampled one in 8. The
    # estimate must still be most of the workers' busy time, never more.
    class Busy:
        def __len__(self):
            return 4096

        def __getitem__(self, i):
            total = 0
            for k in range(200):  # a few µs of pure Python, the same for every sample
                total += k * i
            return {"v": total}

    loader = fl.Loader(Busy(), 64, device="cpu", num_workers=1)
    list(loader)
    s = loader.stats()
    assert 0.5 * s.collation.busy_s <= s.user_s <= s.collation.busy_s + 1e-3, (s.user_s, s.collation.busy_s)


def test_breaking_out_and_dropping_the_loader_stop_its_threads():
    from conftest import native_thread_count

    before = native_thread_count()
    for _ in range(5):
        loader = fl.Loader(Rows(n=500), 4, device="cpu", num_workers=3)
        for i, _ in enumerate(loader):
            if i == 3:
                break
        del loader
    import gc
    gc.collect()
    assert native_thread_count() <= before + 1


def _run(code: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


def test_ctrl_c_in_the_loop_and_exit_with_a_thread_still_iterating_are_clean():
    proc = _run("""
        import os, signal, threading, time, numpy as np, fastload as fl
        class DS:
            def __len__(self): return 10_000
            def __getitem__(self, i):
                time.sleep(0.0005)
                return {"x": np.full(64, i, np.float32), "i": i}
        loader = fl.Loader(DS(), 16, device="cpu", num_workers=2)
        try:
            for k, b in enumerate(loader):
                if k == 5:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(1)
        except KeyboardInterrupt:
            print("interrupted")
        loader.close()
        # A daemon thread still iterating when the interpreter exits.
        other = fl.Loader(DS(), 16, device="cpu", num_workers=2)
        threading.Thread(target=lambda: [None for _ in other], daemon=True).start()
        time.sleep(0.3)
        print("exiting")
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "interrupted" in proc.stdout and "exiting" in proc.stdout
    assert "terminate called" not in proc.stderr


def test_exit_while_worker_threads_are_inside_torch_ops_is_clean():
    # A worker thread still inside a torch op when the interpreter finalizes aborts the process
    # ("terminate called without an active exception") unless it is parked first.
    proc = _run("""
        import threading, time, numpy as np, torch, fastload as fl
        class Heavy:
            def __len__(self): return 1_000_000
            def __getitem__(self, i):
                x = torch.full((128, 128), 0.01)
                for _ in range(10):
                    x = torch.tanh(x @ x)
                return {"x": x[0].numpy(), "s": torch.stack([x[0], x[1]])}
        loader = fl.Loader(Heavy(), 8, device="cpu", num_workers=2)
        threading.Thread(target=lambda: [None for _ in loader], daemon=True).start()
        time.sleep(1.0)
        print("exiting")
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exiting" in proc.stdout and "terminate called" not in proc.stderr


def test_a_python_source_through_the_stand_in_gpu_engine():
    proc = _run("""
        import os, sys, gc, numpy as np
        sys.path.insert(0, "tests")
        from fake_cuda import build
        import tempfile
        os.environ["FASTLOAD_LIBCUDA"] = str(build.build(tempfile.mkdtemp()))
        import fastload as fl
        class DS:
            def __len__(self): return 50
            def __getitem__(self, i):
                return {"x": np.full((2, 3), i, np.float32), "name": f"n{i}", "y": i}
        loader = fl.Loader(DS(), 8, shuffle=True, seed=4, device="cuda:0", with_index=True)
        loader._raw_device_batches = True
        plan = loader.plan(0).tolist()
        seen = []
        for b in loader:
            x = np.frombuffer(b["x"].read(), np.float32).reshape(b["x"].shape)
            y = np.frombuffer(b["y"].read(), np.int64)
            idx = np.frombuffer(b["index"].read(), np.int64)
            assert (x == idx[:, None, None]).all() and (y == idx).all(), (x, idx)
            assert b["name"] == [f"n{i}" for i in idx], b["name"]
            seen += idx.tolist()
        assert seen == plan, (seen, plan)
        print("ok", len(seen))
    """, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ok 50" in proc.stdout


@pytest.mark.parametrize("user_share, processes, says", [
    (0.9, False, "the dataset's own code (__getitem__) is the bottleneck (90% of the workers' time): raise "
                 "num_workers (now 3), or use workers='processes'"),
    (0.9, True, "raise num_workers (now 3)"),
    (0.3, False, "collation is the bottleneck"),  # the gathering, not the user's code
    (-1.0, False, "collation is the bottleneck"),  # an array source
])
def test_the_stall_hint_names_num_workers_when_user_code_is_the_bottleneck(user_share, processes, says):
    from fastload._advice import stall_advice
    advice = stall_advice(0.95, 0.0, num_threads=3, copy_streams=1, prefetch=8, user_share=user_share,
                              processes=processes)
    assert says in advice, advice
    assert ("workers='processes'" in advice) == (user_share > 0.5 and not processes)


def test_a_loop_starved_by_a_slow_getitem_is_told_to_raise_num_workers(caplog):
    import logging

    class Slow:
        def __len__(self):
            return 700

        def __getitem__(self, i):
            time.sleep(0.0002)
            return {"i": i}

    with caplog.at_level(logging.WARNING, logger="fastload"):
        for _ in fl.Loader(Slow(), 1, device="cpu", num_workers=1, prefetch=2):
            pass
    hints = [r.getMessage() for r in caplog.records if r.name == "fastload"]
    assert len(hints) == 1 and "raise num_workers (now 1)" in hints[0], hints


# ---------------------------------------------------------------- a __getitem__ that never returns
# A thread stuck in the dataset's code cannot be stopped: it is left behind (counted in stats(),
# warned about once) and never waited for, whether the loop ends, close() runs, a new epoch starts
# or the interpreter exits (issue 26, item 2).
STUCK = """
    import sys, time, numpy as np, fastload as fl

    class Stuck:
        def __len__(self):
            return 40

        def __getitem__(self, i):
            if i == 6:
                time.sleep(3600)
            return {"v": np.full(3, i)}
"""


@pytest.mark.parametrize("ending", ["inline", "kept", "closed"])
def test_a_stuck_getitem_with_timeout_never_hangs_the_program(ending):
    make = "loader = fl.Loader(Stuck(), 4, num_workers=2, timeout=1)"
    loop = {"inline": "for b in fl.Loader(Stuck(), 4, num_workers=2, timeout=1): pass",
            "kept": f"{make}\n    for b in loader: pass",
            "closed": f"{make}\n    for b in loader: pass"}[ending]
    after = "loader.close()\nprint('closed', flush=True)\n" if ending == "closed" else ""
    code = textwrap.dedent(STUCK) + (
        "t0 = time.monotonic()\n"
        "try:\n"
        f"    {loop}\n"
        "except TimeoutError as e:\n"
        "    print('caught', round(time.monotonic() - t0), flush=True)\n") + after
    t0 = time.monotonic()
    proc = _run(code, timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    caught = proc.stdout.split()
    assert caught[:1] == ["caught"] and int(caught[1]) <= 4, proc.stdout
    assert took < 25, took
    if ending == "closed":
        assert "closed" in proc.stdout


def test_a_stuck_thread_is_left_behind_counted_and_warned_about_once(caplog):
    release = threading.Event()
    calls = collections.Counter()

    class Stuck:
        def __len__(self):
            return 40

        def __getitem__(self, i):
            calls[i] += 1
            if i == 6 and calls[i] == 1:  # only the first call: the next epoch reads it at once
                release.wait(60)
            return {"v": np.full(3, i)}

    loader = fl.Loader(Stuck(), 4, device="cpu", num_workers=2, timeout=0.5)
    try:
        with pytest.raises(TimeoutError):
            list(loader)
        t0 = time.monotonic()
        with caplog.at_level("WARNING", logger="fastload"):
            batches = list(loader)  # the next epoch: not blocked by the stuck thread
            list(loader)
        assert time.monotonic() - t0 < 5
        assert loader.stats().left_behind_threads == 1
        warned = [r for r in caplog.records if "thread(s) behind" in r.getMessage()]
        assert len(warned) == 1, [r.getMessage() for r in caplog.records]
        assert "dataset[6]" in warned[0].getMessage()
        # The epoch after it is complete and right: the stuck sample is fetched again by a fresh thread
        # (sample 6 sleeps only in the first call's thread, which never reached the others).
        assert sorted(int(v) for b in batches for v in b["v"][:, 0]) == list(range(40))
    finally:
        release.set()
        t0 = time.monotonic()
        loader.close()
        assert time.monotonic() - t0 < 5


# ---------------------------------------------------------------- issue 26, items 5, 6, 8, 11, 12, 14
class Growing:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"v": i}


def test_a_dataset_whose_length_changed_is_refused_at_the_next_iter_naming_both_lengths():
    ds = Growing(10)
    loader = fl.Loader(ds, 4, device="cpu", num_workers=1)
    assert sorted(int(v) for b in loader for v in b["v"]) == list(range(10))
    ds.n = 14
    with pytest.raises(ValueError, match=r"len\(dataset\) is 14, but it was 10 when the Loader was built"):
        iter(loader)
    with pytest.raises(ValueError, match=r"len\(dataset\) is 14, but it was 10"):
        loader.split(["cpu"])
    ds.n = 10  # back to the length it was built with: fine again
    assert sorted(int(v) for b in loader for v in b["v"]) == list(range(10))
    loader.close()


def test_a_mix_part_whose_length_changed_is_refused_at_the_next_iter():
    a, b = Growing(10), Growing(6)
    loader = fl.Loader(fl.Mix({"a": a, "b": b}), 4, device="cpu", num_workers=1)
    list(loader)
    b.n = 9
    with pytest.raises(ValueError, match=r"source 1 \(Growing\) is 9, but it was 6"):
        iter(loader)
    loader.close()


@pytest.mark.parametrize("odd, said", [({0: 111, 1: 222}, "is dict, the first sample's was a tuple"),
                                       (b"\x07\x08", "is bytes, the first sample's was a tuple"),
                                       ("ab", "is str, the first sample's was a tuple"),
                                       (np.array([7, 8]), "is numpy.ndarray, the first sample's was a tuple")])
def test_a_sample_of_another_structure_is_a_sample_error_not_wrong_values(odd, said):
    class Odd:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return odd if i == 3 else (10 * i, 20 * i)

    loader = fl.Loader(Odd(), 4, device="cpu", num_workers=1)
    with pytest.raises(fl.SampleError, match=rf"sample 3.*{said}"):
        list(loader)
    loader.close()


def test_a_list_sample_after_a_tuple_one_is_still_read():
    class Mixed:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return [i, 2 * i] if i % 2 else (i, 2 * i)

    (batch,) = list(fl.Loader(Mixed(), 4, device="cpu", num_workers=1))
    assert batch[0].tolist() == [0, 1, 2, 3] and batch[1].tolist() == [0, 2, 4, 6]


def test_max_length_without_pad_is_refused_at_construction():
    class Tokens:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"tokens": np.arange(i + 1)}

    with pytest.raises(ValueError, match=r"max_length names field\(s\) \['tokens'\] without pad="):
        fl.Loader(Tokens(), 2, device="cpu", max_length={"tokens": 8})


def test_a_conjugate_view_tensor_is_resolved():
    class Conj:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {"z": ((torch.arange(3, dtype=torch.float32) + i) * (1 + 1j)).to(torch.complex64).conj()}

    batches = list(fl.Loader(Conj(), 3, device="cpu", num_workers=1))
    got = torch.cat([b["z"] for b in batches])
    want = torch.stack([Conj()[i]["z"].resolve_conj() for i in range(6)])
    assert torch.equal(got, want)


def test_getitems_returning_a_generator_is_read_as_every_batch_is_and_a_non_iterable_is_named():
    class Gen:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"v": i}

        def __getitems__(self, ids):
            return ({"v": 10 * i} for i in ids)

    batches = list(fl.Loader(Gen(), 2, device="cpu", num_workers=1))  # the construction's probe and the threads agree
    assert [b["v"].tolist() for b in batches] == [[0, 10], [20, 30]]

    class Number(Gen):
        def __getitems__(self, ids):
            return 7

    with pytest.raises(TypeError, match=r"__getitems__ must return the samples .*Number.__getitems__\(\[0\]\) returned int"):
        fl.Loader(Number(), 2, device="cpu")


def test_help_documents_every_argument():
    doc = fl.Loader.__doc__
    for name in ("num_workers", "workers", "pad", "max_length", "collate_fn", "worker_init_fn", "timeout",
                 "pin_memory", "persistent_workers", "steps", "sample_rng"):
        assert f"{name}" in doc, name
    assert "torch's global\n    generator" in doc or "torch's global generator" in doc
