"""fl.Tar under the sampling contract: ranks disjoint with equal steps and every key once, exact
resume mid-epoch, order="block" and partition="shards" over the tar shards, steps= and fl.Mix.
The reference order is an array dataset with the same shard boundaries (the sampler sees only
lengths and shards), and every delivered key is checked against the tarfile reference."""
from __future__ import annotations

import numpy as np
import pytest

import fastload as fl
from fastload._sources.protocol import declare_shards
from tar_reference import every_kind_sample, reference_samples, write_shard


@pytest.fixture
def shards(tmp_path):
    sizes = [5, 9, 1, 7, 3, 6]
    paths, i = [], 0
    for s, n in enumerate(sizes):
        paths.append(write_shard(tmp_path / f"part-{s:03d}.tar", [every_kind_sample(i + j) for j in range(n)]))
        i += n
    return paths


def keys_of(batches):
    return [k for b in batches for k in b["__key__"]]


def loader(source, **kw):
    kw.setdefault("batch_size", 4)
    return fl.Loader(source, device="cpu", num_threads=2, **kw)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_are_disjoint_with_equal_steps_and_every_key_once(shards, world):
    ref = [r["__key__"] for r in reference_samples(shards)]
    ds = fl.Tar(shards, fields=["__key__", "cls"])
    per_rank, steps = [], set()
    for rank in range(world):
        batches = list(loader(ds, shuffle=True, seed=7, rank=rank, world_size=world, even="mask", with_index=True))
        steps.add(len(batches))
        valid = []
        for b in batches:
            for j, i in enumerate(b["index"].tolist()):
                assert b["__key__"][j] == ref[i]
                assert b["cls"][j].item() == i % 10
                if b["valid"][j]:
                    valid.append(b["__key__"][j])
        per_rank.append(valid)
    assert len(steps) == 1
    everything = [k for keys in per_rank for k in keys]
    assert sorted(everything) == sorted(ref) and len(set(everything)) == len(ref)


@pytest.mark.parametrize("kw", [dict(shuffle=True, order="random"), dict(shuffle=True, order="block"),
                                dict(shuffle=True, partition="shards", world_size=2, rank=1),
                                dict(shuffle=False)])
def test_the_order_is_the_samplers_over_the_tar_shards(shards, kw):
    ds = fl.Tar(shards, fields=["__key__"])
    ref = [r["__key__"] for r in reference_samples(shards)]
    twin = declare_shards(fl.Dataset({"i": np.arange(len(ds))}), ds.shard_rows)
    mine, theirs = loader(ds, seed=3, **kw), loader(twin, seed=3, **kw)
    assert np.array_equal(mine.plan(0), theirs.plan(0))
    assert keys_of(mine) == [ref[i] for b in theirs for i in b["i"].tolist()]


def test_resume_mid_epoch_gives_the_rest_of_the_epoch(shards):
    ds = fl.Tar(shards, fields=["__key__", "npy"])
    whole = keys_of(loader(ds, shuffle=True, seed=11))
    first = loader(ds, shuffle=True, seed=11)
    it = iter(first)
    head = [k for _ in range(3) for k in next(it)["__key__"]]
    state = first.state_dict()
    del it
    second = loader(fl.Tar(shards, fields=["__key__", "npy"]), shuffle=True, seed=11)
    second.load_state_dict(state)
    assert head + keys_of(second) == whole


def test_elastic_resume_from_two_ranks_to_one(shards):
    ds = fl.Tar(shards, fields=["__key__"])
    ranks = [loader(ds, batch_size=2, shuffle=True, seed=4, rank=r, world_size=2) for r in range(2)]
    its = [iter(x) for x in ranks]
    for it in its:
        next(it), next(it)
    state = ranks[0].state_dict()
    single = loader(ds, batch_size=4, shuffle=True, seed=4)
    single.load_state_dict(state)
    whole = keys_of(loader(ds, batch_size=4, shuffle=True, seed=4))
    assert keys_of(single) == whole[8:]


def test_steps_and_mix_read_tar_shards(shards):
    ds = fl.Tar(shards, fields=["__key__", "cls"])
    batches = list(loader(ds, steps=7, shuffle=True, seed=0))
    assert len(batches) == 7 and all(len(b["__key__"]) == 4 for b in batches)
    other = fl.Tar(shards[:2], fields=["__key__", "cls"])
    mix = fl.Mix({"a": ds, "b": other}, weights={"a": 0.5, "b": 0.5})
    got = list(loader(mix, steps=5, shuffle=True, seed=0))
    assert len(got) == 5
    ref = {r["__key__"]: int(r["cls"]) for r in reference_samples(shards)}
    for b in got:
        assert [ref[k] for k in b["__key__"]] == b["cls"].tolist()
