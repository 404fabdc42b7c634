"""Property-based tests (hypothesis): random sources and Loader arguments against numpy indexing
and the sampling contract (tests/reference.py), random resume points and world sizes, and random
invalid arguments, which must raise ValueError/TypeError/MemoryError naming what is wrong.

The default run draws about 3,000 examples in all; FASTLOAD_HYPOTHESIS_EXAMPLES=N draws about N.
"""
from __future__ import annotations

import copy
import os
import pickle

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload as fl
from fastload import _C

from reference import reference_batches

# Hypothesis's failure report imports a module that warns; let a failure be reported as one.
pytestmark = pytest.mark.filterwarnings("ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning")

TOTAL_EXAMPLES = int(os.environ.get("FASTLOAD_HYPOTHESIS_EXAMPLES", "3000"))
# Share of the examples each test draws (sums to 1; "sources" is shared by three tests).
_WEIGHTS = {"values": 0.3, "contract": 0.2, "resume": 0.2, "arguments": 0.12, "sources": 0.04, "states": 0.06}

settings.register_profile(
    "fastload", deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.load_profile("fastload")


def examples(name: str) -> settings:
    return settings(max_examples=max(1, round(TOTAL_EXAMPLES * _WEIGHTS[name])))


# ---------------------------------------------------------------------------- random sources
NUMPY_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                "float16", "float32", "float64", "complex64", "complex128"]
ROW_SHAPES = [(), (1,), (3,), (2, 3), (4, 1), (1, 5), (0,), (7,)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A module-wide directory for memmap files (hypothesis re-runs a test body many times)."""
    return {"dir": tmp_path_factory.mktemp("prop"), "count": 0}


def _base(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random bits of every pattern (NaNs and all), so equality is checked byte for byte."""
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    np_dtype = np.dtype("int16" if dtype == "bfloat16" else dtype)
    raw = rng.integers(0, 256, int(np.prod(shape)) * np_dtype.itemsize, dtype=np.uint8)
    return raw.view(np_dtype).reshape(shape)


@st.composite
def columns(draw, files, n: int):
    """(array for the Dataset, numpy array with the same bytes per row, torch dtype expected)."""
    backend = draw(st.sampled_from(["numpy", "torch", "memmap"]))
    dtype = draw(st.sampled_from(NUMPY_DTYPES + (["bfloat16"] if backend == "torch" else [])))
    row = draw(st.sampled_from(ROW_SHAPES))
    layouts = ["contiguous", "offset", "step", "broadcast"] + (["reversed"] if backend != "torch" else [])
    layout = draw(st.sampled_from(layouts))
    step = draw(st.integers(2, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    base_rows = {"contiguous": n, "offset": n + 3, "step": n * step, "broadcast": 1, "reversed": n}[layout]
    base = _base(rng, dtype, (base_rows,) + row)
    if backend == "memmap" and base.nbytes > 0:
        files["count"] += 1
        path = files["dir"] / f"c{files['count']}.bin"
        base.tofile(path)
        base = np.memmap(path, dtype=base.dtype, mode="r", shape=base.shape)

    def arrange(a):
        if layout == "offset":
            return a[3:]
        if layout == "step":
            return a[::step]
        if layout == "reversed":
            return a[::-1]
        if layout == "broadcast":
            return a.expand((n,) + row) if isinstance(a, torch.Tensor) else np.broadcast_to(a, (n,) + row)
        return a

    expected = arrange(base)
    if backend == "torch":
        t = torch.from_numpy(np.ascontiguousarray(base) if isinstance(base, np.memmap) else base)
        if dtype == "bfloat16":
            t = t.view(torch.bfloat16)
        array, torch_dtype = arrange(t), t.dtype
    else:
        array = expected
        torch_dtype = torch.from_numpy(np.zeros(1, dtype=base.dtype)).dtype
    return array, expected, torch_dtype


@st.composite
def sources(draw, files, max_rows: int = 60):
    n = draw(st.integers(1, max_rows))
    if draw(st.integers(0, 4)) == 0:  # Windows over 1-D tokens
        length = draw(st.integers(1, 12))
        stride = draw(st.integers(1, 12))
        num_tokens = length + (n - 1) * stride
        dtype = draw(st.sampled_from(["uint8", "uint16", "int32", "int64", "float32"]))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        tokens = _base(rng, dtype, (num_tokens,))
        if draw(st.booleans()):
            tokens_arg = torch.from_numpy(tokens)
        else:
            tokens_arg = tokens
        windows = np.lib.stride_tricks.as_strided(tokens, shape=(n, length),
                                                  strides=(stride * tokens.itemsize, tokens.itemsize))
        source = fl.Windows(tokens_arg, length, stride)
        expected = {"tokens": (windows, torch.from_numpy(tokens[:1]).dtype)}
    else:
        k = draw(st.integers(1, 3))
        made = {f"c{i}": draw(columns(files, n)) for i in range(k)}
        source = fl.Dataset({name: m[0] for name, m in made.items()})
        expected = {name: (m[1], m[2]) for name, m in made.items()}
    via = draw(st.sampled_from(["direct", "direct", "pickle", "deepcopy"]))
    if via == "pickle":
        source = pickle.loads(pickle.dumps(source))
    elif via == "deepcopy":
        source = copy.deepcopy(source)
    assert len(source) == n
    return source, expected


def _bytes(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8) if a.size else np.zeros(0, np.uint8)


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


@st.composite
def loader_arguments(draw):
    kw = draw(st.fixed_dictionaries({
        "batch_size": st.one_of(st.integers(1, 70), st.just(2**40)),
        "shuffle": st.booleans(),
        "seed": st.one_of(st.integers(0, 10), st.integers(0, 2**64 - 1)),
        "drop_last": st.booleans(),
        "even": st.sampled_from(["pad", "drop", "mask"]),
        "order": st.sampled_from(["random", "block"]),
        "world_size": st.integers(1, 5),
        "prefetch": st.integers(1, 4),
        "num_threads": st.integers(1, 2),
    }))
    kw["batch_size"] = min(kw["batch_size"], 2**40 // kw["world_size"])  # the largest global batch
    return kw


def _sampler(loader):
    return loader._schedule.samplers(1)[0]


# ---------------------------------------------------------------------------- exact values
@examples("values")
@given(data=st.data(), kw=loader_arguments(), epoch=st.integers(0, 3))
def test_batches_equal_numpy_indexing(files, data, kw, epoch):
    source, expected = data.draw(sources(files))
    rank = data.draw(st.integers(0, kw["world_size"] - 1))
    loader = fl.Loader(source, rank=rank, with_index=True, device="cpu", **kw)
    loader.set_epoch(epoch)
    batches = list(loader)
    assert len(batches) == len(loader)
    sampler = _sampler(loader)
    names = list(expected) + ["index"] + (["valid"] if kw["even"] == "mask" else [])
    for step, batch in enumerate(batches):
        assert list(batch) == names
        ids, valid = sampler.batch_ids(epoch, 0, step)
        assert np.array_equal(batch["index"].numpy(), ids)
        if kw["even"] == "mask":
            assert np.array_equal(batch["valid"].numpy(), valid)
        for name, (array, dtype) in expected.items():
            got, want = batch[name], array[ids]
            assert got.dtype == dtype and tuple(got.shape) == want.shape, name
            assert np.array_equal(_bytes(_as_numpy(got)), _bytes(want)), name
    plan = np.concatenate([b["index"].numpy() for b in batches]) if batches else np.zeros(0, np.int64)
    assert np.array_equal(loader.plan(epoch), plan)
    loader.close()


# ---------------------------------------------------------------------------- sampling contract
@examples("contract")
@given(n=st.integers(1, 300), kw=loader_arguments(), epoch=st.integers(0, 2**20), devices=st.integers(1, 2))
def test_the_sampling_contract_holds_across_ranks(n, kw, epoch, devices):
    for key in ("prefetch", "num_threads"):
        kw.pop(key)
    ds = fl.Dataset({"x": np.broadcast_to(np.zeros(1, np.uint8), (n,))})
    world = kw["world_size"]
    loaders = [fl.Loader(ds, rank=r, num_threads=1, device="cpu", **kw) for r in range(world)]
    counts = {len(loader) for loader in loaders}
    assert len(counts) == 1  # every rank has the same number of batches
    perm = _sampler(loaders[0]).permutation(epoch, 0, n)
    assert np.array_equal(np.sort(perm), np.arange(n))
    if not kw["shuffle"]:
        assert np.array_equal(perm, np.arange(n))
    valid_ids = []
    checked = epoch % world  # the native valid flags of one rank, batch by batch
    for r, loader in enumerate(loaders):
        ref = reference_batches(perm, kw["batch_size"], world, r, kw["even"], kw["drop_last"])
        assert len(ref) == len(loader)
        plan = loader.plan(epoch)
        assert np.array_equal(plan, np.concatenate([ids for ids, _ in ref]) if ref else plan[:0])
        valid_ids.extend(ids[valid] for ids, valid in ref)
        if r == checked:
            sampler = _sampler(loader)
            for step, (ids, valid) in enumerate(ref):
                got_ids, got_valid = sampler.batch_ids(epoch, 0, step)
                assert np.array_equal(got_ids, ids) and np.array_equal(got_valid, valid)
    valid_ids = np.concatenate(valid_ids) if valid_ids else np.zeros(0, np.int64)
    assert len(np.unique(valid_ids)) == len(valid_ids)  # ranks are disjoint (padding aside)
    if not kw["drop_last"]:
        covered = n if kw["even"] != "drop" else n // world * world
        assert np.array_equal(np.sort(valid_ids), np.sort(perm[:covered]))  # and cover the epoch
    if devices > 1:  # split(): each device is a rank of a world devices times larger
        rank = epoch % world
        if kw["batch_size"] * world * devices > 2**40:
            with pytest.raises(ValueError, match="batch_size"):
                loaders[rank].split(["cpu"] * devices)
        else:
            its = loaders[rank].split(["cpu"] * devices)
            for d, it in enumerate(its):
                ref = reference_batches(perm, kw["batch_size"], world * devices, rank * devices + d, kw["even"],
                                        kw["drop_last"])
                assert len(it) == len(ref)
    for loader in loaders:
        loader.close()


# ---------------------------------------------------------------------------- resume
@examples("resume")
@given(data=st.data(), n=st.integers(1, 200), kw=loader_arguments(), epoch=st.integers(0, 5),
       mode=st.sampled_from(["same", "elastic", "other"]), call_set_epoch=st.booleans())
def test_resume_anywhere_continues_the_contract(data, n, kw, epoch, mode, call_set_epoch):
    ds = fl.Dataset({"x": np.arange(n, dtype=np.int64) * 3})
    world = kw.pop("world_size")
    kw["batch_size"] = min(kw["batch_size"], 40)
    rank = data.draw(st.integers(0, world - 1))
    run = fl.Loader(ds, rank=rank, world_size=world, with_index=True, device="cpu", **kw)
    run.set_epoch(epoch)
    it = iter(run)
    k = data.draw(st.integers(0, len(run)))
    taken = [next(it)["index"].numpy().copy() for _ in range(k)]
    state = run.state_dict()
    full = reference_batches(_sampler(run).permutation(epoch, 0, n), kw["batch_size"], world, rank,
                             kw["even"], kw["drop_last"])
    if k == len(full):
        assert (state["epoch"], state["position"]) == (epoch + 1, 0)
    else:
        assert (state["epoch"], state["position"]) == (epoch, k * kw["batch_size"] * world)
    for a, (b, _) in zip(taken, full):
        assert np.array_equal(a, b)

    if mode == "same":
        batch_size, new_world = kw["batch_size"], world
    elif mode == "elastic":  # the same global batch on another world size
        g = kw["batch_size"] * world
        new_world = data.draw(st.sampled_from([w for w in range(1, 9) if g % w == 0]))
        batch_size = g // new_world
    else:
        batch_size, new_world = data.draw(st.integers(1, 40)), data.draw(st.integers(1, 6))
    new_rank = rank if mode == "same" else data.draw(st.integers(0, new_world - 1))
    resumed = fl.Loader(ds, **{**kw, "batch_size": batch_size}, rank=new_rank, world_size=new_world,
                        with_index=True, device="cpu")
    resumed.load_state_dict(state)
    if call_set_epoch:
        resumed.set_epoch(state["epoch"])
    e, position = state["epoch"], state["position"]
    ref = reference_batches(_sampler(resumed).permutation(e, 0, n), batch_size, new_world, new_rank,
                            kw["even"], kw["drop_last"], start=position)
    got = [(b["index"].numpy().copy(), b["x"].numpy().copy()) for b in resumed]
    assert len(got) == len(ref)
    for (ids, x), (want, _) in zip(got, ref):
        assert np.array_equal(ids, want) and np.array_equal(x, want * 3)
    if mode == "same" and k < len(full):
        assert [a.tolist() for a in taken] + [ids.tolist() for ids, _ in got] == [b.tolist() for b, _ in full]
    assert resumed.state_dict()["epoch"] == e + 1 and resumed.state_dict()["position"] == 0
    run.close()
    resumed.close()


# ---------------------------------------------------------------------------- invalid input
DS = fl.Dataset({"x": np.arange(10)})
NOT_INTS = [1.5, "4", None, True, [4], 2.0]
BAD = {
    "batch_size": NOT_INTS + [0, -1, 2**41, 2**63, 2**64, -2**63],
    "seed": [-1, 2**64, 2**100, 1.5, "0", True, None],
    "shuffle": ["False", "True", 0, 1, None, [True]],
    "drop_last": ["False", 0, 1, None],
    "with_index": ["no", 1, None],
    "order": ["sorted", "", 1, "RANDOM"],  # None is valid: the source's default order
    "even": ["wrap", "", 0, None, "PAD"],
    "prefetch": [v for v in NOT_INTS if v is not None] + [0, -1, 65537, 2**31, 2**63],  # None: the default
    "num_threads": [1.5, "4", True, 0, -1, 4097, 2**31, 10**7, 2**64],
    "copy_streams": NOT_INTS + [0, -3, 1025, 2**31],
    "device": ["tpu", 5, "cpu:x", "meta", object()],
    "rank": [("rank", 3, 3), ("rank", -1, 2), ("rank", 2**63, 2), ("rank", 1.0, 2), ("rank", "0", 2),
             ("rank", 0, None), ("world_size", None, 2), ("world_size", 0, 0), ("world_size", 0, 2**62),
             ("world_size", 0, 2**41), ("world_size", 0, -1), ("world_size", 0, 2.0)],
}


@examples("arguments")
@given(argument=st.sampled_from(sorted(BAD)), data=st.data(), valid=loader_arguments())
def test_invalid_loader_arguments_raise_naming_the_argument(argument, data, valid):
    valid = {k: v for k, v in valid.items() if k not in ("world_size", "num_threads", "batch_size")}
    value = data.draw(st.sampled_from(BAD[argument]))
    if argument == "rank":
        name, rank, world = value
        kwargs = {**valid, "rank": rank, "world_size": world}
    else:
        name, kwargs = argument, {**valid, argument: value}
    kwargs.setdefault("batch_size", 4)
    kwargs.setdefault("device", "cpu")
    with pytest.raises((ValueError, TypeError, MemoryError)) as info:
        fl.Loader(DS, **kwargs)
    assert name in str(info.value), (name, value, str(info.value))


BAD_COLUMNS = [  # (bad column, exception type)
    (np.array([object()] * 3), TypeError),
    (np.array(["a", "b", "c"]), TypeError),
    (np.zeros(3, dtype=[("a", "i4"), ("b", "f8")]), TypeError),
    (np.zeros(3, dtype="datetime64[s]"), TypeError),
    (np.zeros(3, dtype=">i4"), TypeError),
    (np.zeros(3, dtype=np.longdouble), TypeError),
    (np.zeros((3, 4), order="F"), ValueError),
    (np.zeros((3, 4))[:, ::2], ValueError),
    (np.array(3.0), ValueError),
    (np.ma.masked_array(np.arange(3)), TypeError),
    ([1, 2, 3], TypeError),
    (torch.zeros(1, dtype=torch.int64).expand(2**62), ValueError),
    (torch.zeros(3, dtype=torch.complex64).conj(), ValueError),
    (torch.zeros(4, 3).t(), ValueError),
    (torch.zeros(3, dtype=torch.float8_e4m3fn), TypeError),
    (torch.zeros(3).to_sparse(), TypeError),
]
names = st.text(alphabet="abcxyz_0123", min_size=1, max_size=6).filter(lambda s: s not in ("index", "valid"))


@examples("sources")
@given(name=names, bad=st.sampled_from(BAD_COLUMNS), extra=st.booleans(), first=st.booleans())
def test_an_invalid_column_is_refused_naming_it(name, bad, extra, first):
    array, exc = bad
    columns = {name: array}
    if extra and name != "ok":
        ok = {"ok": np.arange(len(array) if isinstance(array, np.ndarray) and array.ndim else 3)}
        columns = {**ok, **columns} if first else {**columns, **ok}
    with pytest.raises(exc, match=f"column {name!r}"):
        fl.Dataset(columns)


BAD_SOURCES = [
    (lambda: fl.Dataset({"x": np.arange(10), "y": np.arange(9)}), "equal leading length"),
    (lambda: fl.Dataset({"index": np.arange(3)}), "'index'"),
    (lambda: fl.Dataset({"valid": np.arange(3)}), "'valid'"),
    (lambda: fl.Dataset({"x": np.zeros((0, 2))}), "empty"),
    (lambda: fl.Dataset([np.arange(3)]), "columns"),
    (lambda: fl.Dataset({}), "columns"),
    (lambda: fl.Dataset({3: np.arange(3)}), "names"),
    (lambda: fl.Windows(np.zeros((8, 4), np.uint16)[::2], 2), "tokens"),  # N-D is fine, a gap between rows is not
    (lambda: fl.Windows(np.arange(20, dtype=np.uint16)[::2], 2), "tokens"),
    (lambda: fl.Windows(np.ma.masked_array(np.arange(20)), 2), "tokens"),
    (lambda: fl.Windows(np.array(["a"] * 5), 2), "tokens"),
]


@examples("sources")
@given(case=st.sampled_from(BAD_SOURCES))
def test_invalid_sources_raise_naming_the_problem(case):
    make, name = case
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    assert name in str(info.value), str(info.value)


@examples("sources")
@given(tokens=st.integers(1, 50), length=st.one_of(st.integers(-5, 60), st.just(2**63), st.floats(), st.text(max_size=2)),
       stride=st.one_of(st.none(), st.integers(-5, 60), st.integers(2**59, 2**64), st.floats(), st.booleans()),
       dtype=st.sampled_from(["uint8", "uint16", "int32", "int64"]))
def test_windows_arguments_are_checked(tokens, length, stride, dtype):
    array = np.arange(tokens).astype(dtype)
    itemsize = array.itemsize
    ok_length = isinstance(length, int) and 0 < length <= tokens
    step = length if stride is None else stride
    ok_stride = (isinstance(step, int) and not isinstance(step, bool) and 0 < step
                 and step * itemsize < 2**63)
    if ok_length and ok_stride:
        w = fl.Windows(array, length, stride)
        assert len(w) == (tokens - length) // step + 1
        batch = next(iter(fl.Loader(w, batch_size=len(w), device="cpu", with_index=True)))
        ids = batch["index"].numpy()
        assert np.array_equal(batch["tokens"].numpy(), np.stack([array[i * step:i * step + length] for i in ids]))
        return
    with pytest.raises((ValueError, TypeError)) as info:
        fl.Windows(array, length, stride)
    assert "length" in str(info.value) or "stride" in str(info.value), str(info.value)


BAD_STATE = {
    "version": [0, 2, "1", True, None],
    "num_samples": [99, 101, True, "100", None],
    "seed": [-1, 2**64, 1.5, "3", True, None],
    "shuffle": ["False", "True", 0, 1, None],
    "order": ["sorted", None, 1],
    "epoch": [-1, 2**62 + 1, 2**63, 2**64, 1.5, "2", None, True],
    "position": [-1, 101, 2**63, 1.5, "8", None, True],
    "drop_last": ["False", 0, None],
    "even": ["wrap", None, 0],
    "batch_size": [0, -1, 2**41, 1.5, None],
    "world_size": [0, 2**62, "2", None],
}


@examples("states")
@given(key=st.sampled_from(sorted(BAD_STATE)), data=st.data(), k=st.integers(0, 12))
def test_invalid_states_are_refused_naming_the_key(key, data, k):
    loader = fl.Loader(fl.Dataset({"x": np.arange(100)}), batch_size=8, shuffle=True, device="cpu")
    it = iter(loader)
    for _ in range(k):
        next(it)
    state = {**loader.state_dict(), key: data.draw(st.sampled_from(BAD_STATE[key]))}
    fresh = fl.Loader(fl.Dataset({"x": np.arange(100)}), batch_size=8, shuffle=True, device="cpu")
    with pytest.raises((ValueError, TypeError)) as info:
        fresh.load_state_dict(state)
    word = {"num_samples": "samples", "version": "version"}.get(key, key)
    assert word in str(info.value), str(info.value)
    missing = {k_: v for k_, v in loader.state_dict().items() if k_ != key}
    if key in ("version", "num_samples", "seed", "shuffle", "order", "epoch", "position"):
        with pytest.raises(ValueError, match="missing"):
            fresh.load_state_dict(missing)
    loader.close()
    fresh.close()
