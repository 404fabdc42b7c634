"""The Loader's configuration resolved once (fastload._config), its modes as schedule objects
(fastload._schedules), and the renamed arguments: what the Loader, stats(), tune and the engine
read is one LoaderConfig; the memory bound is the native side's; copy_streams= replaces streams=."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload as fl
from fastload import _C
from fastload.tools import tune as _tune
from fastload._config import LoaderConfig, default_config
from fastload._schedules import EpochSchedule, MixEpochSchedule, Schedule, StepSchedule

sys.path.insert(0, str(Path(__file__).parent))
from fake_cuda import build as fake_build  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def ds(n: int = 1000, width: int = 4096) -> fl.Dataset:
    return fl.Dataset({"x": np.zeros((n, width), np.uint8), "y": np.arange(n)})


# ---------------------------------------------------------------------------- one configuration
def test_the_loader_reads_one_immutable_config_that_stats_and_properties_agree_with():
    loader = fl.Loader(ds(), 64, device="cpu", num_threads=3, rank=1, world_size=2, with_index=True)
    c = loader.config
    assert isinstance(c, LoaderConfig)
    with pytest.raises(AttributeError):
        c.prefetch = 3  # frozen
    stats = loader.stats()
    assert (stats.num_threads, stats.prefetch, stats.copy_streams) == (c.num_threads, c.prefetch, c.copy_streams)
    assert (loader.batch_size, loader.rank, loader.world_size, loader.device, loader.num_threads) == \
        (c.batch_size, c.rank, c.world_size, c.device, c.num_threads) == (64, 1, 2, torch.device("cpu"), 3)
    assert c.replicas() == 2 and c.replicas(3) == 6 and c.global_batch(3) == 64 * 6
    assert c.max_rows == 64 and c.names == ["x", "y", "index"]
    # The layout the engine sizes its buffers from is the one the config holds.
    assert c.batch_bytes == 64 * (4096 + 8 + 8) == loader._engine.layout.batch_bytes(64)


def test_max_rows_is_the_dataset_when_smaller_except_for_steps():
    assert fl.Loader(ds(10), 64, device="cpu").config.max_rows == 10
    assert fl.Loader(ds(10), 64, device="cpu", steps=3).config.max_rows == 64


def test_the_memory_bound_is_the_native_one():
    # One owner (csrc/core/memory_bound.h): the window and the batch in use, plus the hand-over.
    for p in (1, 2, 7, 65536):
        assert _C.batches_in_use(p) == p + 1
        assert _C.batches_held(p) == p + 2
    loader = fl.Loader(ds(), 64, device="cpu", prefetch=3, num_threads=1)
    assert loader.config.memory_bound == loader.config.batch_bytes * 5
    for _ in loader:  # a loop that drops each batch stays within the bound
        pass
    assert loader._memory()["host_bytes"] <= loader.config.memory_bound
    assert _C.MAX_GLOBAL_BATCH == 2**40


@pytest.mark.parametrize("device, copy_streams", [("cpu", 1), ("cuda:0", 1), ("cuda:0", 3)])
def test_the_default_prefetch_counts_copy_streams_only_on_a_gpu(device, copy_streams):
    # Constructing a GPU loader touches no driver: the stand-in is not needed to resolve it.
    source = fl.Dataset({"x": np.zeros((1000, 40_000), np.float32)})  # 10 MB batches of 64
    c = fl.Loader(source, 64, device=device, num_threads=2, copy_streams=copy_streams).config
    assert c.active_copy_streams == (copy_streams if device != "cpu" else 0)
    assert c.prefetch == max(2, 2 + c.active_copy_streams)


# ---------------------------------------------------------------------------- tune's defaults
@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_tunes_defaults_are_the_loaders(device):
    source = fl.Dataset({"x": np.zeros((1000, 40_000), np.float32)})
    stats = fl.Loader(source, 64, device=device).stats()
    assert _tune.defaults_of(default_config(source, 64, device)) == {
        "num_threads": stats.num_threads, "prefetch": stats.prefetch, "copy_streams": stats.copy_streams}


def test_tune_on_the_cpu_reports_the_loaders_defaults():
    source = fl.Dataset({"x": np.zeros((500, 256), np.float32)})
    result = fl.tune(source, 16, threads=[1], prefetch=[2], seconds=0.05, repeats=1, progress=False, device="cpu")
    stats = fl.Loader(source, 16, device="cpu").stats()
    assert result.defaults == {"num_threads": stats.num_threads, "prefetch": stats.prefetch, "copy_streams": 1}


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a real GPU is present: the stand-in is for CPU machines")
def test_tune_on_the_stand_in_gpu_reports_the_loaders_defaults(tmp_path):
    # A process that sees the stand-in driver as its GPU (tests/gpu_standin): tune measures on
    # "cuda:0" and its default must be what fl.Loader picks there (copy streams included).
    driver = fake_build.build(tmp_path / "fake_cuda")
    code = textwrap.dedent("""
        import json, numpy as np, fastload as fl
        source = fl.Dataset({"x": np.zeros((2000, 40_000), np.uint8)})
        result = fl.tune(source, 64, threads=[1], prefetch=[2], copy_streams=[1], seconds=0.05, repeats=1,
                         progress=False)
        loader = fl.Loader(source, 64)
        stats = loader.stats()
        print(json.dumps({"device": result.device, "defaults": result.defaults, "loader": str(loader.device),
                          "stats": [stats.num_threads, stats.prefetch, stats.copy_streams]}))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTLOAD_", "FAKE_CUDA_"))
           and k != "CUDA_VISIBLE_DEVICES"}
    env.update({"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests" / "gpu_standin"),
                                                            os.environ.get("PYTHONPATH", "")])),
                "FASTLOAD_GPU_STANDIN": str(driver), "FAKE_CUDA_DEVICE_COUNT": "1", "FAKE_CUDA_MAX_DELAY_US": "20"})
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["device"] == out["loader"] == "cuda:0"
    threads, prefetch, copy_streams = out["stats"]
    assert out["defaults"] == {"num_threads": threads, "prefetch": prefetch, "copy_streams": copy_streams}
    assert prefetch >= threads + copy_streams  # the GPU's default counts its copy stream


# ---------------------------------------------------------------------------- renames
def test_streams_is_the_old_name_of_copy_streams():
    with pytest.warns(FutureWarning, match="copy_streams"):
        loader = fl.Loader(ds(), 8, device="cuda:0", streams=3)
    assert loader.config.copy_streams == 3 and loader.stats().copy_streams == 3
    with pytest.warns(FutureWarning, match="copy_streams"):
        assert loader.stats().streams == 3
    with pytest.raises(ValueError, match="streams is the old name of copy_streams"):
        fl.Loader(ds(), 8, device="cpu", streams=2, copy_streams=2)
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="streams must be positive, got 0"):
        fl.Loader(ds(), 8, device="cpu", streams=0)
    assert "copy_streams" in fl.Loader.__doc__


def test_num_workers_stays_an_alias_of_num_threads():
    assert fl.Loader(ds(), 8, device="cpu", num_workers=3).num_threads == 3
    with pytest.raises(ValueError, match="name the same thing"):
        fl.Loader(ds(), 8, device="cpu", num_workers=3, num_threads=3)
    assert "alias" in fl.Loader.__doc__


# ---------------------------------------------------------------------------- modes as objects
def test_each_mode_is_one_schedule_object():
    mix = fl.Mix({"a": ds(30), "b": ds(20)}, [1, 1])
    cases = [(fl.Loader(ds(100), 8, device="cpu"), EpochSchedule, 13),
             (fl.Loader(ds(100), 8, device="cpu", steps=5), StepSchedule, 5),
             (fl.Loader(mix, 8, device="cpu"), MixEpochSchedule, 7),
             (fl.Loader(mix, 8, device="cpu", steps=4), StepSchedule, 4)]
    for loader, kind, length in cases:
        assert type(loader._schedule) is kind and isinstance(loader._schedule, Schedule)
        assert len(loader) == length
        state = loader.state_dict()
        batches = [b["y"].clone() for b in loader]
        assert len(batches) == length
        loader.load_state_dict(state)  # the same state back: the same batches again
        again = [b["y"] for b in loader]
        assert all(torch.equal(a, b) for a, b in zip(batches, again))


def test_the_loader_module_has_no_mode_branches():
    text = (ROOT / "python" / "fastload" / "_loader.py").read_text()
    for branch in ("self._runs", "self._steps", "self._pending", "self._run "):
        assert branch not in text, branch


# ---------------------------------------------------------------------------- Python-dataset options
class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> dict:
        return {"x": np.int64(i * i)}


def test_a_python_sources_own_workers_and_timeout_apply_where_the_loader_gives_none():
    loader = fl.Loader(fl.PythonSource(Squares(), timeout=5.0), 4, device="cpu")
    assert (loader.config.workers, loader.config.timeout) == ("threads", 5.0)
    np.testing.assert_array_equal(np.concatenate([b["x"].numpy() for b in loader]), np.arange(20) ** 2)
    procs = fl.Loader(fl.PythonSource(Squares(), workers="processes"), 4, device="cpu", num_workers=1)
    assert procs.config.workers == "processes" and procs._workers is not None  # no process before iter()
    procs.close()
    assert fl.Loader(Squares(), 4, device="cpu", workers="processes", num_workers=1).config.workers == "processes"
    with pytest.raises(ValueError, match="workers is given twice"):
        fl.Loader(fl.PythonSource(Squares(), workers="processes"), 4, device="cpu", workers="threads")
    with pytest.raises(ValueError, match="timeout is given twice"):
        fl.Loader(fl.PythonSource(Squares(), timeout=1.0), 4, device="cpu", timeout=2.0)
    with pytest.raises(ValueError, match="workers must be one of"):
        fl.PythonSource(Squares(), workers="fork")
    with pytest.raises(ValueError, match="timeout must be a non-negative number"):
        fl.PythonSource(Squares(), timeout=-1)


def test_the_machine_facts_module_is_a_leaf():
    import ast

    tree = ast.parse((ROOT / "python" / "fastload" / "_machine.py").read_text())
    imported = [n.module or "." for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.level or 0) > 0]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                 for a in n.names if a.name.startswith("fastload")]
    imported += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("fastload")]
    assert imported == []
