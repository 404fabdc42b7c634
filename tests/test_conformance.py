"""Every kind of source through the same contract (shared/DESIGN.md, "Sampling contract"), against
the brute-force reference (tests/reference.py): each rank's batches are the reference's, for any
world size, `even` and `drop_last`; ranks are disjoint and cover every sample with equal step
counts; the order does not depend on the thread count; resume is exact mid-epoch and elastic
(a state saved at world size 4 continues at world size 2 with the same global batch).

A kind is a factory of fresh sources over the same data, and the reference values of any sample
ids (what each batch must hold). The global order P is the loader's own at world size 1 (the
contract says how P is cut; how P is drawn is the sampler's own test, tests/test_sampler.py)."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np
import pytest

import fastload as fl
from elastic import four_to_two
from reference import reference_batches
from remote_helpers import opts, upload_dir

N = 701  # prime: no world size or batch divides it
B = 16
SEED = 7
ROWS = [90, 201, 3, 180, 227]  # uneven shards (file, row group, chunk) where the kind has them


class Kind(NamedTuple):
    make: Callable[[], Any]  # a fresh source over the same data
    expect: Callable[[np.ndarray], dict[str, np.ndarray]]  # the batch parts' values for these ids
    order: str = "random"


def _x(n: int = N) -> np.ndarray:
    return (np.arange(n, dtype=np.int64)[:, None] * 10 + np.arange(3)).astype(np.float32)


def _ragged_parts(n: int = N) -> tuple[np.ndarray, np.ndarray]:
    lengths = (np.arange(n) * 7) % 5
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return np.arange(offsets[-1], dtype=np.int32), offsets


def _padded(values: np.ndarray, offsets: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lengths = offsets[ids + 1] - offsets[ids]
    width = max(1, int(lengths.max())) if len(ids) else 1
    out = np.zeros((len(ids), width), values.dtype)
    for k, i in enumerate(ids):
        out[k, :lengths[k]] = values[offsets[i]:offsets[i + 1]]
    return out, lengths


def _fixed(ids: np.ndarray) -> dict[str, np.ndarray]:
    return {"x": _x()[ids], "y": ids.astype(np.int64)}


class _Points:
    """A map-style Python dataset."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        return {"x": _x()[i], "y": np.int64(i)}


def _parquet_file(path: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = np.arange(N, dtype=np.int64)
    table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(_x().reshape(-1)), 3), "y": ids})
    with pq.ParquetWriter(path, table.schema) as w:
        at = 0
        for rows in ROWS:
            w.write_table(table.slice(at, rows))
            at += rows


@pytest.fixture(scope="module")
def kinds(tmp_path_factory, s3_server) -> dict[str, Kind]:
    """Every kind of source, built once per module (the remote ones upload to the S3 server)."""
    tmp = tmp_path_factory.mktemp("kinds")
    out: dict[str, Kind] = {}
    x, y = _x(), np.arange(N, dtype=np.int64)
    out["arrays"] = Kind(lambda: fl.Dataset({"x": x, "y": y}), _fixed)

    fl.write_dataset(tmp / "dir", {"x": x, "y": y}, rows_per_shard=150, fsync=False)
    out["directory"] = Kind(lambda: fl.Dataset.open(tmp / "dir"), _fixed)
    out["directory, block order"] = Kind(lambda: fl.Dataset.open(tmp / "dir"), _fixed, "block")

    tokens = np.arange(N * 8 + 3, dtype=np.uint16)
    out["windows"] = Kind(lambda: fl.Windows(tokens, length=9, stride=8),
                          lambda ids: {"tokens": np.stack([tokens[i * 8:i * 8 + 9] for i in ids])})

    values, offsets = _ragged_parts()

    def ragged(ids: np.ndarray) -> dict[str, np.ndarray]:
        padded, lengths = _padded(values, offsets, ids)
        return {"v": padded, "v_lengths": lengths, "y": ids}

    out["ragged"] = Kind(lambda: fl.Dataset({"v": fl.Ragged(values, offsets), "y": y}), ragged)
    out["python"] = Kind(lambda: _Points(), _fixed)

    pa = pytest.importorskip("pyarrow")
    table = pa.Table.from_batches([pa.record_batch({"x": pa.FixedSizeListArray.from_arrays(
        pa.array(x[a:a + r].reshape(-1)), 3), "y": pa.array(y[a:a + r])}) for a, r in zip(np.cumsum([0] + ROWS), ROWS)])
    out["arrow"] = Kind(lambda: fl.Arrow(table), _fixed)

    _parquet_file(tmp / "t.parquet")
    out["parquet"] = Kind(lambda: fl.Parquet(tmp / "t.parquet"), _fixed)
    out["parquet, block order"] = Kind(lambda: fl.Parquet(tmp / "t.parquet"), _fixed, "block")

    import boto3

    endpoint = s3_server[0]
    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket="conformance")
    upload_dir(s3, "conformance", "dir", tmp / "dir")
    with open(tmp / "t.parquet", "rb") as f:
        s3.put_object(Bucket="conformance", Key="pq/t.parquet", Body=f.read())
    options = opts(endpoint)
    out["remote directory"] = Kind(lambda: fl.Dataset.open("s3://conformance/dir", storage_options=options,
                                                           cache_dir=tmp / "cache"), _fixed)
    out["remote parquet"] = Kind(lambda: fl.Parquet("s3://conformance/pq", storage_options=options,
                                                    cache_dir=tmp / "cache"), _fixed)
    return out


KINDS = ["arrays", "directory", "directory, block order", "windows", "ragged", "python", "arrow", "parquet",
         "parquet, block order", "remote directory", "remote parquet"]


def _loader(kind: Kind, batch_size: int = B, rank: int = 0, world_size: int = 1, **kw: Any) -> fl.Loader:
    kw.setdefault("num_threads", 2)
    return fl.Loader(kind.make(), batch_size, shuffle=True, seed=SEED, order=kind.order, rank=rank,
                     world_size=world_size, with_index=True, device="cpu", **kw)


def _take(loader: fl.Loader, epoch: int | None = None) -> list[dict[str, np.ndarray]]:
    try:
        if epoch is not None:
            loader.set_epoch(epoch)
        return [{k: v.numpy().copy() for k, v in b.items()} for b in loader]
    finally:
        loader.close()


def _order(kind: Kind, epoch: int) -> np.ndarray:
    """P: the epoch's order of every sample (world size 1, every sample once)."""
    with _loader(kind) as loader:
        return loader.plan(epoch)


def _check_values(kind: Kind, batch: dict[str, np.ndarray]) -> None:
    for name, want in kind.expect(batch["index"]).items():
        np.testing.assert_array_equal(batch[name], want, err_msg=name)


@pytest.mark.parametrize("world_size, even, drop_last", [(1, "pad", False), (2, "drop", True), (3, "mask", False),
                                                         (3, "pad", True)])
@pytest.mark.parametrize("name", KINDS)
def test_each_rank_gets_the_references_batches(kinds, name, world_size, even, drop_last):
    kind = kinds[name]
    perm = _order(kind, 1)
    assert np.array_equal(np.sort(perm), np.arange(N))
    counts, seen = [], []
    for rank in range(world_size):
        got = _take(_loader(kind, rank=rank, world_size=world_size, even=even, drop_last=drop_last), epoch=1)
        want = reference_batches(perm, B, world_size, rank, even, drop_last)
        assert len(got) == len(want)
        for batch, (ids, valid) in zip(got, want):
            np.testing.assert_array_equal(batch["index"], ids)
            if even == "mask":
                np.testing.assert_array_equal(batch["valid"], valid)
            _check_values(kind, batch)
        counts.append(len(got))
        seen.append(np.concatenate([b["index"][b["valid"]] if even == "mask" else b["index"] for b in got]))
    assert len(set(counts)) == 1  # equal steps on every rank
    every = np.concatenate(seen)
    if even != "drop" and not drop_last:
        assert np.array_equal(np.unique(every), np.arange(N))  # every sample
    if even in ("drop", "mask"):
        assert len(np.unique(every)) == len(every)  # disjoint (no padding counted)


@pytest.mark.parametrize("name", KINDS)
def test_the_order_does_not_depend_on_the_thread_count(kinds, name):
    kind = kinds[name]
    one = _take(_loader(kind, num_threads=1, prefetch=2), epoch=2)
    three = _take(_loader(kind, num_threads=3, prefetch=9), epoch=2)
    assert len(one) == len(three)
    for a, b in zip(one, three):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("name", KINDS)
def test_resume_mid_epoch_is_exact(kinds, name):
    kind = kinds[name]
    run = _loader(kind, rank=1, world_size=2)
    run.set_epoch(3)
    it = iter(run)
    first = [{k: v.numpy().copy() for k, v in next(it).items()} for _ in range(5)]
    state = run.state_dict()
    run.close()
    resumed = _loader(kind, rank=1, world_size=2)
    resumed.load_state_dict(state)
    rest = _take(resumed)
    whole = _take(_loader(kind, rank=1, world_size=2), epoch=3)
    assert len(first) + len(rest) == len(whole)
    for a, b in zip(first + rest, whole):
        for k in b:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("name", KINDS)
def test_elastic_resume_continues_the_global_steps(kinds, name):
    kind = kinds[name]
    perm = _order(kind, 0)
    steps = 3

    def loader(batch_size: int, rank: int, world_size: int) -> fl.Loader:
        return _loader(kind, batch_size, rank, world_size)

    state, rest = four_to_two(loader, B, steps, saved_rank=2)
    assert (state["epoch"], state["position"]) == (0, steps * 4 * B)
    for rank in range(2):
        want = reference_batches(perm, 2 * B, 2, rank, "pad", False, start=steps * 4 * B)
        assert len(rest[rank]) == len(want)
        for ids, (want_ids, _) in zip(rest[rank], want):
            np.testing.assert_array_equal(ids, want_ids)


# ---------------------------------------------------------------- a Mix: its own schedule
def _mix() -> fl.Mix:
    return fl.Mix({"a": fl.Dataset({"x": _x(300)}), "b": fl.Dataset({"x": _x(N)[300:]})}, weights={"a": 1, "b": 2})


@pytest.mark.parametrize("world_size", [1, 3])
def test_a_mix_keeps_the_contract(world_size):
    """A Mix is sampled by its schedule (tests/test_mix.py checks it against tests/mix_reference.py);
    here the contract every source shares: ranks that split each global step, equal steps, thread
    independence, exact resume."""
    def loader(rank: int, **kw: Any) -> fl.Loader:
        kw.setdefault("num_threads", 2)
        return fl.Loader(_mix(), B, shuffle=True, seed=SEED, rank=rank, world_size=world_size, with_index=True,
                         device="cpu", **kw)

    runs = [_take(loader(r)) for r in range(world_size)]
    assert len({len(r) for r in runs}) == 1
    for run in runs:
        for b in run:
            np.testing.assert_array_equal(b["x"], _x()[b["index"]])
    # The ranks split each global step: together they hold what one rank with the whole global
    # batch holds (a part's samples repeat only where its own epoch ends inside a step).
    whole = fl.Loader(_mix(), B * world_size, shuffle=True, seed=SEED, with_index=True, device="cpu")
    for s, step in enumerate(_take(whole)):
        ids = np.concatenate([r[s]["index"] for r in runs])
        np.testing.assert_array_equal(np.sort(ids), np.sort(step["index"]))
    again = _take(loader(0, num_threads=3, prefetch=9))
    for a, b in zip(runs[0], again, strict=True):
        np.testing.assert_array_equal(a["index"], b["index"])
    run = loader(0)
    it = iter(run)
    first = [next(it)["index"].numpy().copy() for _ in range(4)]
    state = run.state_dict()
    run.close()
    resumed = loader(0)
    resumed.load_state_dict(state)
    rest = [b["index"] for b in _take(resumed)]
    for a, b in zip(first + rest, runs[0], strict=True):
        np.testing.assert_array_equal(a, b["index"])
