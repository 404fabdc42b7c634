"""Facts with one owner (issue 36): order="block"'s block size and window come from the sampler
(fastload._C), the global batch from LoaderConfig, the CPU budget and GPU presence from
_machine; each is checked against what the code that uses it does."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import fastload as fl
from fastload import _C, _machine

import shard_reference as R

PACKAGE = Path(fl.__file__).resolve().parent


def test_block_size_and_window_are_the_samplers_own():
    assert (_C.BLOCK_SIZE, _C.WINDOW_SHARDS) == (4096, 4)
    # The Sampler's defaults are those constants: a plan made without them is the plan made with them.
    n, rows = 40_000, [3000, 100, 2500, 700] * 4
    for shard_rows in ([], rows + [n - sum(rows)]):
        default = _C.Sampler(n, 64, 1, 0, 5, True, "block", "pad", False, partition="samples",
                             shard_rows=shard_rows)
        given = _C.Sampler(n, 64, 1, 0, 5, True, "block", "pad", False, _C.BLOCK_SIZE, "samples", shard_rows,
                           _C.WINDOW_SHARDS)
        other = _C.Sampler(n, 64, 1, 0, 5, True, "block", "pad", False, 1024, "samples", shard_rows, 2)
        np.testing.assert_array_equal(default.plan(0, 0), given.plan(0, 0))
        assert not np.array_equal(default.plan(0, 0), other.plan(0, 0))
    # No module keeps a copy of its own.
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert "BLOCK_SIZE =" not in text and "WINDOW_SHARDS =" not in text, path


@pytest.mark.parametrize("seed", range(6))
def test_block_window_shards_is_the_most_any_window_holds(seed):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 3000, size=int(rng.integers(1, 40))).tolist()
    rows[int(rng.integers(0, len(rows)))] += 1  # at least one row
    bound = _C.block_window_shards(rows)
    segs = R.segments(rows)
    # Every window of many epochs' shard orders (the sampler's own grouping, tests/shard_reference.py).
    seen = max(len(g) for epoch in range(30) for g in R.block_windows(rows, seed, epoch, _C.WINDOW_SHARDS,
                                                                      _C.BLOCK_SIZE))
    assert seen <= bound
    # The worst order (the smallest shards first) reaches it.
    worst = sorted(segs, key=lambda s: s[1])
    assert max(len(g) for g in R.windows(worst, _C.WINDOW_SHARDS, _C.BLOCK_SIZE)) == bound
    assert _C.block_window_shards([0, 0, 7]) == 1 and _C.block_window_shards([4096] * 10) == 4


def test_the_global_batch_of_a_state_is_the_configs(tmp_path):
    x = np.arange(100)
    loader = fl.Loader(fl.Dataset({"x": x}), 6, rank=1, world_size=3, device="cpu")
    assert loader.config.global_batch() == 18 == loader.state_dict()["global_batch_size"]
    its = loader.split(["cpu", "cpu"])
    next(its[0]), next(its[1])
    assert loader.state_dict()["global_batch_size"] == loader.config.global_batch(2) == 36
    stepped = fl.Loader(fl.Dataset({"x": x}), 6, rank=0, world_size=2, device="cpu", steps=3)
    assert stepped.state_dict()["global_batch_size"] == stepped.config.global_batch() == 12
    loader.close()
    with pytest.raises(ValueError, match=r"batch_size \* world_size must be at most 2\*\*40"):
        fl.Loader(fl.Dataset({"x": x}), 2**21, rank=0, world_size=2**20, device="cpu")


def test_threads_are_sized_from_one_cpu_budget(monkeypatch, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    from fastload._environment import default_num_threads

    pq.write_table(pa.table({"x": np.arange(100)}), tmp_path / "a.parquet", row_group_size=10)
    for cpus, local, threads, decode, scan in ((16, 1, 16, 4, 8), (16, 4, 4, 4, 4), (6, 2, 3, 3, 3), (1, 8, 1, 1, 1)):
        monkeypatch.setattr(_machine, "usable_cpus", lambda c=cpus: c)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
        assert _machine.cpu_share() == threads == default_num_threads()
        assert fl.Parquet(tmp_path / "a.parquet").decode_threads == decode
        assert _machine.helper_threads(8) == scan
        assert fl.Loader(fl.Dataset({"x": np.zeros(10)}), 2, device="cpu").num_threads == threads


def test_gpu_presence_is_asked_only_in_machine():
    asked = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "_machine.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("is_available", "device_count") and \
                    isinstance(node.value, ast.Attribute) and node.value.attr == "cuda":
                asked.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not asked, asked
    assert _machine.torch_gpu_count() == (__import__("torch").cuda.device_count() if _machine.torch_sees_gpu() else 0)


def test_the_stall_hint_is_written_in_python_from_the_runtimes_numbers():
    # The bindings hand _advice.stall_warning figures only; no C++ file writes a knob's advice.
    csrc = Path(__file__).resolve().parents[1] / "csrc"
    for path in list(csrc.rglob("*.cpp")) + list(csrc.rglob("*.h")):
        text = path.read_text()
        for words in ("raise num_threads", "raise prefetch", "raise copy_streams", "is the bottleneck"):
            assert words not in text, (path, words)
    from fastload._advice import stall_message

    text = stall_message(share=0.5, collating=0.1, copying=0.9, releasing=0.0, user_share=-1.0, fetch_share=0.0,
                         processes=False, num_threads=2, copy_streams=1, prefetch=4, window=256)
    assert "raise copy_streams (now 1)" in text and "streams (now" not in text.replace("copy_streams (now", "")
