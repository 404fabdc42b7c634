"""Bad input: a clear exception naming the argument and the value, never a crash or wrong data."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload as fl

DS = fl.Dataset({"x": np.arange(10)})


@pytest.mark.parametrize("columns,exc,match", [
    ({"x": np.arange(10), "y": np.arange(9)}, ValueError, r"equal leading length.*'x': 10.*'y': 9"),
    ({"x": np.zeros((0, 3))}, ValueError, "empty"),
    ({}, ValueError, "at least one column"),
    ({"x": np.array(["a", "b"])}, TypeError, r"unsupported dtype <U1"),
    ({"x": np.array([object(), object()])}, TypeError, "unsupported dtype object"),
    ({"x": np.zeros(3, dtype="datetime64[s]")}, TypeError, "unsupported dtype"),
    ({"x": [1, 2, 3]}, TypeError, "must be a numpy array.*got list"),
    ({"x": np.float32(3.0)}, TypeError, "must be a numpy array"),
    ({"x": np.array(3.0)}, ValueError, "at least one dimension"),
    ({"index": np.arange(3)}, ValueError, "'index' is reserved"),
    ({"valid": np.arange(3)}, ValueError, "'valid' is reserved"),
    ({1: np.arange(3)}, TypeError, "names must be strings"),
    ({"x": np.zeros((4, 3), order="F")}, ValueError, "not contiguous"),
    ({"x": np.arange(5).astype(">i4")}, TypeError, "unsupported dtype"),
])
def test_dataset_rejects(columns, exc, match):
    with pytest.raises(exc, match=match):
        fl.Dataset(columns)


def test_dataset_rejects_non_mapping():
    with pytest.raises(TypeError, match="mapping"):
        fl.Dataset([np.arange(3)])


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(batch_size=0), ValueError, "batch_size must be positive, got 0"),
    (dict(batch_size=-3), ValueError, "batch_size must be positive, got -3"),
    (dict(batch_size=2.5), TypeError, "batch_size must be an integer, got 2.5"),
    (dict(batch_size=True), TypeError, "batch_size must be an integer, got True"),
    (dict(seed=-1), ValueError, r"seed must be in \[0, 2\*\*64\), got -1"),
    (dict(seed=1.5), TypeError, "seed must be an integer, got 1.5"),
    (dict(seed="0"), TypeError, "seed must be an integer, got '0'"),
    (dict(seed=2**64), ValueError, "seed must be in"),
    (dict(even="wrap"), ValueError, "even must be one of .*got 'wrap'"),
    (dict(order="sorted"), ValueError, "order must be one of .*got 'sorted'"),
    (dict(rank=3, world_size=3), ValueError, r"rank must be in \[0, world_size=3\), got 3"),
    (dict(rank=-1, world_size=2), ValueError, r"rank must be in \[0, world_size=2\), got -1"),
    (dict(rank=0, world_size=0), ValueError, "world_size must be positive, got 0"),
    (dict(rank=1), ValueError, "rank and world_size must be given together"),
    (dict(world_size=2), ValueError, "rank and world_size must be given together"),
    (dict(prefetch=0), ValueError, "prefetch must be positive, got 0"),
    (dict(num_threads=0), ValueError, "num_threads must be positive, got 0"),
    (dict(copy_streams=0), ValueError, "copy_streams must be positive, got 0"),
    (dict(shuffle="yes"), TypeError, "shuffle must be a bool, got 'yes'"),
    (dict(device="tpu"), ValueError, "device must be"),
])
def test_loader_rejects(kwargs, exc, match):
    kwargs.setdefault("batch_size", 4)
    with pytest.raises(exc, match=match):
        fl.Loader(DS, **kwargs)


def test_loader_rejects_a_non_source():
    with pytest.raises(TypeError, match=r"an array is not a dataset: wrap it, fl.Dataset\(\{'x': x\}\)"):
        fl.Loader(np.arange(10), batch_size=2)
    with pytest.raises(TypeError, match=r"an array is not a dataset"):
        fl.Loader(torch.arange(10), batch_size=2)
    with pytest.raises(TypeError, match="source must be a fastload source .* or a map-style dataset .*, got int"):
        fl.Loader(3, batch_size=2)


class _IndexedStream(torch.utils.data.IterableDataset):
    """An IterableDataset that also has __len__ and __getitem__: still only promises iteration."""

    def __iter__(self):
        yield from range(10)

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        return i


class _Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        return i * i


def test_loader_refuses_a_torch_iterable_dataset_and_a_dataset_class_by_name():
    with pytest.raises(TypeError, match=r"source is a torch IterableDataset \(_IndexedStream\); fastload reads "
                                        r"map-style datasets by index .*torch.utils.data.Dataset"):
        fl.Loader(_IndexedStream(), batch_size=2)
    with pytest.raises(TypeError, match="got the class _Squares itself: construct it first"):
        fl.Loader(_Squares, batch_size=2)
    assert [int(v) for v in next(iter(fl.Loader(_Squares(), batch_size=4, device="cpu")))] == [0, 1, 4, 9]


@pytest.mark.parametrize("args,kwargs,exc,match", [
    ((np.arange(10, dtype=np.uint16),), dict(length=11), ValueError, r"length must be at most the number of tokens \(10\), got 11"),
    ((np.arange(10, dtype=np.uint16),), dict(length=0), ValueError, "length must be positive, got 0"),
    ((np.arange(10, dtype=np.uint16),), dict(length=4, stride=0), ValueError, "stride must be positive, got 0"),
    # N-D arrays are time series (windows along the first axis) but need contiguous rows.
    ((np.zeros((8, 4), np.uint16)[::2],), dict(length=2), ValueError, "tokens must be contiguous along the first axis"),
    ((np.arange(20, dtype=np.uint16)[::2],), dict(length=2), ValueError, "tokens must be contiguous"),
    ((np.array(["a"] * 4),), dict(length=2), TypeError, "unsupported dtype"),
])
def test_windows_rejects(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        fl.Windows(*args, **kwargs)


def test_environment_rank_is_checked(monkeypatch):
    monkeypatch.setenv("RANK", "4")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=4\), got 4 \(from RANK/WORLD_SIZE\)"):
        fl.Loader(DS, batch_size=2)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK must be an integer, got 'x'"):
        fl.Loader(DS, batch_size=2)


def test_set_epoch_and_plan_reject_bad_epochs():
    loader = fl.Loader(DS, batch_size=2)
    with pytest.raises(ValueError, match="epoch must be non-negative, got -1"):
        loader.set_epoch(-1)
    with pytest.raises(TypeError, match="epoch must be an integer"):
        loader.set_epoch(1.0)
    with pytest.raises(ValueError, match="epoch must be non-negative"):
        loader.plan(-2)


def test_lazy_conjugate_and_negative_views_are_refused():
    z = torch.tensor([1 + 2j, 3 + 4j])
    with pytest.raises(ValueError, match="lazily conjugated or negated"):
        fl.Dataset({"z": z.conj()})
    with pytest.raises(ValueError, match="lazily conjugated or negated"):
        fl.Dataset({"z": z.conj().imag})


@pytest.mark.parametrize("array", [
    np.zeros(4, dtype=np.longdouble),
    np.zeros(4, dtype=np.clongdouble),
    torch.zeros(4, dtype=torch.float8_e4m3fn),
])
def test_dtypes_torch_cannot_take_are_refused_at_construction(array):
    with pytest.raises(TypeError, match="unsupported dtype"):
        fl.Dataset({"x": array})


def test_a_huge_batch_size_over_a_small_dataset_allocates_only_what_a_batch_can_hold():
    loader = fl.Loader(DS, batch_size=2**40)
    assert [len(b["x"]) for b in loader] == [10]
    assert loader._memory()["host_bytes"] < 4096 * 2
