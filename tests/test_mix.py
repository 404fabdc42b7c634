"""fastload.Mix: several sources read in set proportions of every batch, each in its own epochs.
Checked against the brute-force stream of tests/mix_reference.py (which walks every step and
builds whole orders) and against numpy indexing of the sources' arrays."""
from __future__ import annotations

import math
import pickle
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload as fl
from fastload import _C

import mix_reference as ref
from elastic import four_to_two


# ---------------------------------------------------------------- helpers
def columns(n: int, base: int, shards: int = 1):
    """A source whose x is base + id (int64) and y a float32 row of 3 derived values."""
    x = np.arange(n, dtype=np.int64) + base
    y = np.stack([x * 0.5, x * 2.0, -x], axis=1).astype(np.float32)
    if shards > 1:
        return fl.Dataset({"x": [a.copy() for a in np.array_split(x, shards)],
                           "y": [a.copy() for a in np.array_split(y, shards)]}), x, y
    return fl.Dataset({"x": x, "y": y}), x, y


def make_mix(lengths, weights=None, shards=None, **kw):
    parts = {}
    xs, ys = [], []
    for j, n in enumerate(lengths):
        ds, x, y = columns(n, 1000 * (j + 1), (shards or [1] * len(lengths))[j])
        parts[f"s{j}"] = ds
        xs.append(x)
        ys.append(y)
    if weights is not None and not isinstance(weights, dict):
        weights = {f"s{j}": w for j, w in enumerate(weights)}
    return fl.Mix(parts, weights, **kw), np.concatenate(xs), np.concatenate(ys)


def reference(lengths, raw_weights, *, seed, shuffle=True, order="random", batch_size, world, rank, first, end,
              shard_rows=None, origin=0, base_positions=None):
    """The brute-force batches (global ids, sources) of one rank, from the definition."""
    n = len(lengths)
    g = batch_size * world
    base, shares = ref.ref_quotas(raw_weights, g)
    shard_rows = shard_rows or [[] for _ in lengths]
    offsets = list(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int))
    seeds = _C.StreamSampler(list(lengths), offsets, shard_rows, seed, shuffle, order, 4096, 4, 1, 1, 0,
                             [1] + [0] * (n - 1), [0] * n, 0, [0] * n).seeds
    samplers = [_C.Sampler(lengths[j], 1, 1, 0, seeds[j], shuffle, order, "pad", False, 4096, "samples",
                           shard_rows[j], 4) for j in range(n)]
    orderings = [(lambda e, s=s, N=lengths[j]: s.permutation(e, 0, N)) for j, s in enumerate(samplers)]
    return ref.ref_stream_batches(lengths, orderings, base, shares, _C.mix_phase(seed), batch_size, world, rank,
                                  first, end, origin, base_positions)


def per_source_sequences(ids: np.ndarray, sources: np.ndarray, n: int) -> list[np.ndarray]:
    return [ids[sources == j] for j in range(n)]


# ---------------------------------------------------------------- the stream against the reference
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 25), min_size=1, max_size=4),
       data=st.data(), batch_size=st.integers(1, 7), world=st.integers(1, 3), seed=st.integers(0, 2**64 - 1))
def test_every_batch_matches_the_reference_and_holds_each_share(lengths, data, batch_size, world, seed):
    weights = data.draw(st.lists(st.integers(0, 9), min_size=len(lengths), max_size=len(lengths))
                        .filter(lambda w: sum(w) > 0))
    mix, x, y = make_mix(lengths, weights, with_source=True)
    steps = 9
    total = Fraction(sum(weights))
    for r in range(world):
        loader = fl.Loader(mix, batch_size, steps=steps, shuffle=True, seed=seed, rank=r, world_size=world,
                           with_index=True, num_threads=1)
        batches = list(loader)
        expected = reference(lengths, weights, seed=seed, batch_size=batch_size, world=world, rank=r, first=0,
                             end=steps)
        assert len(batches) == steps
        for b, (ids, src) in zip(batches, expected):
            np.testing.assert_array_equal(b["index"].numpy(), ids)
            np.testing.assert_array_equal(b["source"].numpy(), src)
            np.testing.assert_array_equal(b["x"].numpy(), x[ids])  # the gather, against numpy indexing
            np.testing.assert_array_equal(b["y"].numpy(), y[ids])
            counts = np.bincount(src, minlength=len(lengths))
            for j, w in enumerate(weights):
                assert abs(counts[j] - batch_size * Fraction(w) / total) < 1  # this rank's share, within one


@pytest.mark.parametrize("order,shards", [("random", None), ("block", [1, 3, 2]), ("random", [2, 1, 4])])
def test_orders_and_shards_of_each_source(order, shards):
    lengths = [30, 11, 17]
    mix, x, _ = make_mix(lengths, [3, 1, 2], shards=shards)
    shard_rows = [mix._parts[j].shard_rows or [] for j in range(3)]
    loader = fl.Loader(mix, 6, steps=12, shuffle=True, order=order, seed=4, with_index=True)
    got = np.concatenate([b["index"].numpy() for b in loader])
    expected = reference(lengths, [3, 1, 2], seed=4, order=order, batch_size=6, world=1, rank=0, first=0, end=12,
                         shard_rows=shard_rows)
    np.testing.assert_array_equal(got, np.concatenate([e[0] for e in expected]))


def test_each_source_is_read_once_per_its_own_epoch_and_small_ones_are_upsampled():
    lengths = [40, 5, 13]
    mix, _, _ = make_mix(lengths, [1, 1, 1], with_source=True)
    loader = fl.Loader(mix, 9, steps=30, shuffle=True, seed=2, with_index=True)
    batches = list(loader)
    ids = np.concatenate([b["index"].numpy() for b in batches])
    src = np.concatenate([b["source"].numpy() for b in batches])
    offsets = [0, 40, 45]
    seqs = per_source_sequences(ids, src, 3)
    assert [len(s) for s in seqs] == [90, 90, 90]
    for j, (seq, n) in enumerate(zip(seqs, lengths)):
        whole = len(seq) // n
        for e in range(whole):  # every complete epoch of the source: each sample exactly once
            assert sorted(seq[e * n:(e + 1) * n]) == list(range(offsets[j], offsets[j] + n))
        assert len(set(seq[whole * n:].tolist())) == len(seq) - whole * n  # the epoch under way: no repeat
    stats = loader.stats().sources
    assert [stats[f"s{j}"].epochs for j in range(3)] == [90 // 40, 90 // 5, 90 // 13]  # 5-sample source: 18 epochs
    assert [stats[f"s{j}"].samples for j in range(3)] == [90, 90, 90]


def test_epochs_gives_weights_by_passes_times_length():
    mix, _, _ = make_mix([100, 10, 30], epochs={"s1": 3})
    assert mix.weights == pytest.approx({"s0": 100 / 160, "s1": 30 / 160, "s2": 30 / 160})
    assert len(mix) == 160
    loader = fl.Loader(mix, 16, shuffle=True)
    assert len(loader) == 10
    batches = list(loader)
    counts = np.bincount(np.concatenate([b["x"].numpy() // 1000 - 1 for b in batches]), minlength=3)
    np.testing.assert_array_equal(counts, [100, 30, 30])  # an epoch of the Mix: 3 passes over s1
    by_length = make_mix([100, 10, 30])[0]
    assert len(by_length) == 140 and by_length.weights["s0"] == pytest.approx(100 / 140)


# ---------------------------------------------------------------- epochs of a Mix (no steps=)
def test_epochs_of_a_mix_are_consecutive_ranges_of_one_stream():
    mix, _, _ = make_mix([20, 7], [2, 1])
    loader = fl.Loader(mix, 4, shuffle=True, seed=5, with_index=True)
    spe = math.ceil(27 / 4)
    assert len(loader) == spe
    stream = fl.Loader(mix, 4, steps=3 * spe, shuffle=True, seed=5).plan().reshape(3 * spe, 4)
    for e in range(3):
        got = np.stack([b["index"].numpy() for b in loader])  # each iter(): the next epoch
        np.testing.assert_array_equal(got, stream[e * spe:(e + 1) * spe])
        np.testing.assert_array_equal(loader.plan(e), stream[e * spe:(e + 1) * spe].ravel())
    loader.set_epoch(1)
    np.testing.assert_array_equal(np.stack([b["index"].numpy() for b in loader]), stream[spe:2 * spe])
    assert loader.state_dict()["epoch"] == 2


def test_epoch_mode_resume_mid_epoch():
    mix, _, _ = make_mix([20, 7], [2, 1])
    kw = dict(shuffle=True, seed=5, with_index=True)
    a = fl.Loader(mix, 4, **kw)
    list(a)
    it = iter(a)
    head = [next(it)["index"].numpy() for _ in range(3)]
    state = a.state_dict()
    assert state["epoch"] == 1
    b = fl.Loader(mix, 4, **kw)
    b.load_state_dict(state)
    tail = [x["index"].numpy() for x in b]
    np.testing.assert_array_equal(np.concatenate(head + tail), a.plan(1))
    assert len(list(b)) == len(b)  # then epoch 2 in full


# ---------------------------------------------------------------- resume
def test_resume_at_every_step():
    mix, _, _ = make_mix([9, 4, 6], [2, 1, 1], with_source=True)
    kw = dict(steps=10, shuffle=True, seed=11, with_index=True)
    whole = np.concatenate([b["index"].numpy() for b in fl.Loader(mix, 5, **kw)])
    for k in range(11):
        a = fl.Loader(mix, 5, **kw)
        it = iter(a)
        head = [next(it)["index"].numpy() for _ in range(k)]
        state = pickle.loads(pickle.dumps(a.state_dict()))
        b = fl.Loader(mix, 5, **kw)
        b.load_state_dict(state)
        tail = [x["index"].numpy() for x in b]
        np.testing.assert_array_equal(np.concatenate(head + tail) if head + tail else np.zeros(0), whole)


def test_elastic_resume_from_four_ranks_to_two_with_the_same_global_batch():
    mix, _, _ = make_mix([23, 9, 14], [5, 2, 3])
    kw = dict(steps=12, shuffle=True, seed=7, with_index=True)
    _, rest = four_to_two(lambda b, r, w: fl.Loader(mix, b, rank=r, world_size=w, **kw), 3, steps=4,
                          saved_rank=2)
    assert [len(r) for r in rest] == [8, 8]
    for r in range(2):
        expected = reference([23, 9, 14], [5, 2, 3], seed=7, batch_size=6, world=2, rank=r, first=4, end=12)
        for got, (ids, _) in zip(rest[r], expected):
            np.testing.assert_array_equal(got, ids)


def test_weights_changed_on_resume_continue_every_source_where_it_stopped():
    lengths = [13, 6, 9]
    old, _, _ = make_mix(lengths, [1, 1, 1], with_source=True)
    new, _, _ = make_mix(lengths, [6, 1, 3], with_source=True)
    kw = dict(steps=20, shuffle=True, seed=3, with_index=True)
    a = fl.Loader(old, 6, **kw)
    it = iter(a)
    head = [next(it) for _ in range(7)]
    state = a.state_dict()
    b = fl.Loader(new, 4, **kw)  # other weights and another batch size: the schedule is re-anchored
    b.load_state_dict(state)
    tail = list(b)
    assert len(tail) == 13
    assert b.state_dict()["schedule"]["origin"] == 7
    assert b.state_dict()["schedule"]["base_positions"] == state["positions"]
    for bt in tail:  # the new proportions hold in every batch
        counts = np.bincount(bt["source"].numpy(), minlength=3)
        assert all(abs(c - 4 * w / 10) < 1 for c, w in zip(counts, [6, 1, 3]))
    ids = np.concatenate([x["index"].numpy() for x in head + tail])
    src = np.concatenate([x["source"].numpy() for x in head + tail])
    # Each source's samples, in order, are exactly its stream: its epochs one after another.
    stream = fl.Loader(fl.Mix({f"s{j}": make_mix([n])[0]._parts[0] for j, n in enumerate(lengths)}, [1, 1, 1]),
                       3, steps=1, shuffle=True, seed=3)
    seeds = stream._schedule.stream.sampler(stream._schedule.stream.default_anchor(3), 3, 1, 0).seeds
    offsets = [0, 13, 19]
    for j, n in enumerate(lengths):
        seq = ids[src == j] - offsets[j]
        perm = _C.Sampler(n, 1, 1, 0, seeds[j], True, "random", "pad", False)
        epochs = -(-len(seq) // n)
        np.testing.assert_array_equal(seq, np.concatenate([perm.permutation(e, 0, n) for e in range(epochs)])[:len(seq)])


def test_states_from_other_sources_are_refused():
    mix, _, _ = make_mix([9, 4], [1, 1])
    state = fl.Loader(mix, 2, steps=3).state_dict()
    with pytest.raises(ValueError, match="refusing to resume on other data"):
        fl.Loader(make_mix([9, 5], [1, 1])[0], 2, steps=3).load_state_dict(state)
    with pytest.raises(ValueError, match="sources"):
        fl.Loader(make_mix([9, 4, 3], [1, 1, 1])[0], 2, steps=3).load_state_dict(state)
    renamed = fl.Mix({"a": mix._parts[0], "b": mix._parts[1]})
    with pytest.raises(ValueError, match="refusing to resume on other sources"):
        fl.Loader(renamed, 2, steps=3).load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        fl.Loader(mix, 2, steps=3).load_state_dict({**state, "version": 1})


# ---------------------------------------------------------------- ranks
def test_ranks_are_disjoint_and_equal_in_steps():
    mix, _, _ = make_mix([31, 8, 12], [0.6, 0.3, 0.1])
    world = 4
    per_rank = [[b["index"].numpy() for b in fl.Loader(mix, 5, rank=r, world_size=world, shuffle=True,
                                                       with_index=True)] for r in range(world)]
    assert len({len(p) for p in per_rank}) == 1 and len(per_rank[0]) == math.ceil(51 / 20)
    single = fl.Loader(mix, 20, shuffle=True, steps=len(per_rank[0])).plan().reshape(-1, 20)
    for s in range(len(per_rank[0])):
        # the ranks deal the global step's positions round robin: together they are that step, once
        for r in range(world):
            np.testing.assert_array_equal(per_rank[r][s], single[s][r::world])
        assert sorted(np.concatenate([p[s] for p in per_rank])) == sorted(single[s])


# ---------------------------------------------------------------- arguments and schemas
def test_weights_are_checked():
    parts = {"a": columns(5, 0)[0], "b": columns(6, 100)[0]}
    cases = [({"a": -1, "b": 1}, ValueError, "non-negative"), ({"a": float("nan"), "b": 1}, ValueError, "finite"),
             ({"a": float("inf"), "b": 1}, ValueError, "finite"), ({"a": 0, "b": 0}, ValueError, "not all be 0"),
             ({"a": 1, "c": 1}, ValueError, r"unknown source\(s\) \['c'\]"),
             ({"a": 1}, ValueError, r"no weight for \['b'\]"), ({"a": "1", "b": 1}, TypeError, "must be a number"),
             ({"a": True, "b": 1}, TypeError, "must be a number"), ([1, 2, 3], ValueError, "one value per source"),
             (0.5, TypeError, "weights must be a dict")]
    for weights, exc, match in cases:
        with pytest.raises(exc, match=match):
            fl.Mix(parts, weights)
    with pytest.raises(ValueError, match="not both"):
        fl.Mix(parts, {"a": 1, "b": 1}, epochs={"a": 2})
    with pytest.raises(ValueError, match="positive"):
        fl.Mix(parts, epochs={"a": 0})
    with pytest.raises(ValueError, match=r"unknown source\(s\) \['z'\]"):
        fl.Mix(parts, epochs={"z": 2})
    assert fl.Mix([parts["a"], parts["b"]], [1, 3]).weights == {"0": 0.25, "1": 0.75}
    assert fl.Mix(parts, {"a": Fraction(1, 3), "b": np.float32(2 / 3)}).weights["a"] == pytest.approx(1 / 3)


def test_sources_are_checked():
    a = columns(5, 0)[0]
    with pytest.raises(ValueError, match="at least one source"):
        fl.Mix({})
    with pytest.raises(TypeError, match="must be a dict of name -> source or a list"):
        fl.Mix(a)
    with pytest.raises(TypeError, match="an array|must be a fastload source"):
        fl.Mix([a, np.arange(4)])
    with pytest.raises(TypeError, match="a Mix of Mixes"):
        fl.Mix([a, fl.Mix([a])])

    class Py:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {"x": np.int64(i)}

    with pytest.raises(TypeError, match=r"native sources .*\['0'\].* or Python datasets \(\['1'\]\), not both"):
        fl.Mix([a, Py()])


def test_schema_mismatches_name_the_source_and_the_column():
    a = fl.Dataset({"x": np.zeros(4, np.int64), "y": np.zeros((4, 3), np.float32)})
    cases = [
        (fl.Dataset({"x": np.zeros(4, np.int32), "y": np.zeros((4, 3), np.float32)}),
         r"Mix source 'b': column 'x' is int32\[\] \(4 bytes a row\), but source 'a' has int64\[\] \(8 bytes a row\)"),
        (fl.Dataset({"x": np.zeros(4, np.int64), "y": np.zeros((4, 2), np.float32)}),
         r"Mix source 'b': column 'y' is float32\[2\] .* but source 'a' has float32\[3\]"),
        (fl.Dataset({"x": np.zeros(4, np.int64)}),
         r"Mix source 'b' has columns \['x'\], source 'a' has \['x', 'y'\]: 'b' lacks \['y'\]"),
        (fl.Dataset({"x": np.zeros(4, np.int64), "y": np.zeros((4, 3), np.float32), "z": np.zeros(4)}),
         r"'b' adds \['z'\]"),
    ]
    for b, match in cases:
        with pytest.raises(ValueError, match=match):
            fl.Mix({"a": a, "b": b})
    with pytest.raises(ValueError, match="'source' is reserved"):
        fl.Mix([fl.Dataset({"source": np.zeros(3)})], with_source=True)
    assert fl.Mix([fl.Dataset({"source": np.zeros(3)})]).names == ["source"]  # only reserved where added


def test_windows_and_dataset_directories_mix(tmp_path):
    tokens = [np.arange(k * 1000, k * 1000 + 200, dtype=np.uint16) for k in range(3)]
    fl.write_dataset(tmp_path / "d", {"tokens": np.stack([tokens[2][i:i + 9] for i in range(0, 180, 8)])})
    disk = fl.Dataset.open(tmp_path / "d")
    mix = fl.Mix({"web": fl.Windows(tokens[0], 9, 8), "code": fl.Windows(tokens[1], 9, 8), "disk": disk},
                 {"web": 2, "code": 1, "disk": 1}, with_source=True)
    loader = fl.Loader(mix, 8, steps=10, shuffle=True, with_index=True)
    for b in loader:
        t, src, idx = b["tokens"].numpy(), b["source"].numpy(), b["index"].numpy()
        np.testing.assert_array_equal(np.bincount(src, minlength=3), [4, 2, 2])
        for row, j, i in zip(t, src, idx):
            local = i - [0, 24, 48][j]
            assert row[0] == j * 1000 + local * 8 and len(row) == 9
    assert pickle.loads(pickle.dumps(mix)).weights == mix.weights


def test_fingerprint_names_the_source():
    x = np.zeros(10, np.int64)
    mix = fl.Mix({"a": fl.Dataset({"x": x}), "b": fl.Dataset({"x": np.ones(5, np.int64)})})
    loader = fl.Loader(mix, 2, steps=2)
    fp = mix.fingerprint()
    mix.check_fingerprint(fp)
    mix._parts[0]._columns["x"] = np.zeros(11, np.int64)  # resized behind the loader's back
    with pytest.raises(ValueError, match="Mix source 'a'"):
        iter(loader)


# ---------------------------------------------------------------- Python datasets
class Rows:
    def __init__(self, n, base, shape=(2,), dtype=np.float32):
        self.n, self.base, self.shape, self.dtype = n, base, shape, dtype

    def __len__(self):
        return self.n

    def row(self, i, rng):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"v": np.full(self.shape, self.base + i, self.dtype), "k": self.base + i, "r": rng.integers(1 << 40)}

    def __getitem__(self, i):
        return self.row(i, fl.sample_rng())


class BatchedRows(Rows):
    def __getitems__(self, ids):
        return [self.row(i, fl.sample_rng(i)) for i in ids]


@pytest.mark.parametrize("kind", [Rows, BatchedRows])
def test_python_datasets_mix(kind):
    lengths = [7, 3, 5]
    parts = {f"p{j}": kind(n, 100 * j) for j, n in enumerate(lengths)}
    mix = fl.Mix(parts, [1, 2, 1], with_source=True)
    loader = fl.Loader(mix, 4, steps=6, shuffle=True, seed=9, with_index=True, num_workers=2)
    batches = list(loader)
    expected = reference(lengths, [1, 2, 1], seed=9, batch_size=4, world=1, rank=0, first=0, end=6)
    offsets = np.array([0, 7, 10])
    for b, (ids, src) in zip(batches, expected):
        np.testing.assert_array_equal(b["index"].numpy(), ids)
        np.testing.assert_array_equal(b["source"].numpy(), src)
        local = ids - offsets[src]
        np.testing.assert_array_equal(b["k"].numpy(), 100 * src + local)
        np.testing.assert_array_equal(b["v"].numpy(), np.repeat((100 * src + local)[:, None], 2, 1).astype(np.float32))
    # sample_rng is keyed by (seed, global step, id in the Mix): the same for __getitem__ and
    # __getitems__ parts, and for any number of workers
    other = Rows if kind is BatchedRows else BatchedRows
    again = list(fl.Loader(fl.Mix({f"p{j}": other(n, 100 * j) for j, n in enumerate(lengths)}, [1, 2, 1]), 4,
                           steps=6, shuffle=True, seed=9, num_workers=1))
    np.testing.assert_array_equal(np.concatenate([b["r"].numpy() for b in batches]),
                                  np.concatenate([b["r"].numpy() for b in again]))


def test_python_mix_structure_mismatch_is_named():
    with pytest.raises(ValueError, match=r"Mix source 'b': field 'v' is a array float32\[3\], but source 'a'"):
        fl.Loader(fl.Mix({"a": Rows(4, 0), "b": Rows(4, 0, shape=(3,))}), 2, steps=1)
    with pytest.raises(ValueError, match=r"field 'v' is a array float64\[2\]"):
        fl.Loader(fl.Mix({"a": Rows(4, 0), "b": Rows(4, 0, dtype=np.float64)}), 2, steps=1)


def test_python_mix_in_worker_processes():
    mix = fl.Mix({"a": Rows(6, 0), "b": Rows(4, 100)}, [1, 1], with_source=True)
    threads = [b["k"].numpy() for b in fl.Loader(mix, 4, steps=4, shuffle=True, seed=2)]
    with fl.Loader(mix, 4, steps=4, shuffle=True, seed=2, num_workers=2, workers="processes") as loader:
        procs = [b["k"].numpy() for b in loader]
    np.testing.assert_array_equal(np.concatenate(threads), np.concatenate(procs))


# ---------------------------------------------------------------- stats and plan
def test_stats_per_source_match_the_plan():
    lengths = [17, 5, 9]
    mix, _, _ = make_mix(lengths, [3, 2, 1])
    for world, rank in [(1, 0), (3, 2)]:
        loader = fl.Loader(mix, 4, steps=11, shuffle=True, seed=1, rank=rank, world_size=world, with_index=True)
        it = iter(loader)
        got = [next(it)["index"].numpy() for _ in range(7)]
        plan = loader.plan(steps=(0, 7))
        np.testing.assert_array_equal(np.concatenate(got), plan)
        src = np.searchsorted([0, 17, 22, 31], plan, side="right") - 1
        stats = loader.stats().sources
        assert [stats[f"s{j}"].samples for j in range(3)] == np.bincount(src, minlength=3).tolist()
        sampler = loader._schedule.stream.sampler(loader._schedule.run_anchor, 4 * world, 1, 0)
        positions = sampler.positions(7)
        assert [stats[f"s{j}"].position for j in range(3)] == positions
        assert [stats[f"s{j}"].epochs for j in range(3)] == [p // n for p, n in zip(positions, lengths)]
        assert "source s1" in str(loader.stats())


def test_plan_of_a_mix_matches_its_batches_and_checks_memory():
    mix, _, _ = make_mix([10, 10], [1, 1])
    loader = fl.Loader(mix, 3, steps=5, with_index=True)
    np.testing.assert_array_equal(np.concatenate([b["index"].numpy() for b in loader]), loader.plan())
    with pytest.raises(MemoryError):
        fl.Loader(mix, 2**30, steps=2**30).plan()


# ---------------------------------------------------------------- scale
def test_a_mix_of_a_trillion_samples_starts_at_once():
    def huge(n, v):
        col = np.lib.stride_tricks.as_strided(np.full(1, v, np.int64), shape=(n,), strides=(0,))
        return fl.Dataset({"x": col})

    mix = fl.Mix({"a": huge(5 * 10**11, 0), "b": huge(3 * 10**11, 1), "c": huge(2 * 10**11, 2)}, [0.5, 0.3, 0.2])
    assert len(mix) == 10**12
    times = []
    for _ in range(5):
        loader = fl.Loader(mix, 64, shuffle=True, seed=3, num_threads=2)
        t0 = time.perf_counter()
        batch = next(iter(loader))
        times.append(time.perf_counter() - t0)
        np.testing.assert_array_equal(np.bincount(batch["x"].numpy()), [32, 19, 13])
        loader.close()
    assert min(times) < 0.010, times
    far = fl.Loader(mix, 64, steps=10**10, shuffle=True, seed=3)
    assert len(far.plan(steps=(10**10 - 2, 10**10))) == 128


# ---------------------------------------------------------------- re-anchoring within one loader
def test_split_over_another_device_count_continues_each_source():
    lengths = [11, 4]
    mix, _, _ = make_mix(lengths, [3, 1], with_source=True)
    loader = fl.Loader(mix, 3, shuffle=True, seed=5, with_index=True)
    first = list(loader)  # epoch 0 at G = 3: 5 steps
    its = loader.split(["cpu", "cpu"])  # epoch 1 at G = 6: re-anchored where epoch 0 stopped
    steps = []  # each global step's rows in order: device d holds positions d, d + 2, ...
    for a, b in zip(*its):
        step = {k: np.empty(6, np.int64) for k in ("index", "source")}
        for k in step:
            step[k][0::2], step[k][1::2] = a[k].numpy(), b[k].numpy()
        steps.append(step)
    ids = np.concatenate([b["index"].numpy() for b in first] + [s["index"] for s in steps])
    src = np.concatenate([b["source"].numpy() for b in first] + [s["source"] for s in steps])
    offsets = [0, 11]
    for j, n in enumerate(lengths):
        seq = ids[src == j] - offsets[j]
        for e in range(len(seq) // n):  # each epoch of each source still holds every sample once
            assert sorted(seq[e * n:(e + 1) * n]) == list(range(n))
        assert len(set(seq[len(seq) // n * n:].tolist())) == len(seq) % n
    with pytest.raises(ValueError, match="re-anchored"):
        loader.set_epoch(0)
        iter(loader.split(["cpu", "cpu"])[0])


def test_with_source_needs_dict_samples_from_python_datasets():
    class Pairs:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return np.float32(i), np.int64(i)

    with pytest.raises(ValueError, match=r"Mix\(with_source=True\) adds"):
        fl.Loader(fl.Mix([Pairs(), Pairs()], with_source=True), 2)
    tuples = fl.Loader(fl.Mix([Pairs(), Pairs()]), 2, steps=2)
    assert [len(b) for b in tuples] == [2, 2]


# ---------------------------------------------------------------- issue 26, item 7: one check for Loader and Mix
class Feat:
    """A map-style dataset that happens to have a `dim` attribute (not a tensor)."""

    dim = 3

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"f": np.full(self.dim, i, np.float32)}


def test_mix_takes_a_dataset_with_a_dim_attribute_as_the_loader_does():
    rows = [b["f"][:, 0] for b in fl.Loader(Feat(), 4, num_threads=1, device="cpu")]
    assert sorted(float(v) for r in rows for v in r) == list(range(8))
    loader = fl.Loader(fl.Mix({"a": Feat(), "b": Feat()}), 4, num_threads=1, device="cpu")
    assert sum(len(b["f"]) for b in loader) == len(loader) * 4


def test_mix_refuses_what_the_loader_refuses_with_the_same_words():
    import torch

    class Both(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from range(3)

        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {"v": i}

    for bad, said in ((Feat, "the class Feat itself: construct it first"),
                      (Both(), "is a torch IterableDataset \\(Both\\)"),
                      (np.zeros(3), "an array is not a dataset"),
                      (torch.zeros(3), "an array is not a dataset")):
        with pytest.raises(TypeError, match=said):
            fl.Loader(bad, 2, device="cpu")
        with pytest.raises(TypeError, match=f"Mix source 'b' .*{said}"):
            fl.Mix({"a": Feat(), "b": bad})
