"""On a real GPU: a batch read on a side stream (fastload.record_stream), a CUDA graph captured in
global mode while the loader's threads work, and worker processes feeding the GPU through
page-locked shared memory. Each compares device results with a numpy reference. Skipped without a
GPU (see conftest.py); fastload is imported inside the tests, as in test_cuda_engine.py.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.cuda

DEV = torch.device("cuda", 0)
# tests/test_gpu_check.py runs these on a stand-in GPU machine (tests/gpu_standin: a torch.cuda
# stub, GPU batches arrive as CPU tensors): what needs torch's own CUDA is skipped there.
STANDIN = getattr(torch.cuda, "is_fastload_standin", False)


def fl() -> Any:
    import fastload

    return fastload


def test_a_batch_read_on_a_busy_side_stream_with_record_stream():
    # Each batch is summed on a side stream behind a ~1 ms kernel and dropped at once: without
    # record_stream the next copies could overwrite it before the sum reads it.
    x = np.random.default_rng(0).integers(0, 1000, (20_000, 64)).astype(np.int64)
    loader = fl().Loader(fl().Dataset({"x": x}), 256, device=DEV, with_index=True, prefetch=2, copy_streams=2)
    side = torch.cuda.Stream(DEV)
    sums, ids = [], []
    for batch in loader:
        side.wait_stream(torch.cuda.current_stream(DEV))
        with torch.cuda.stream(side):
            torch.cuda._sleep(1_000_000)
            sums.append(batch["x"].sum(dim=1))
            ids.append(batch["index"].clone())
        fl().record_stream(batch, side)
        del batch
    torch.cuda.synchronize(DEV)
    got = torch.cat(sums).cpu().numpy()
    np.testing.assert_array_equal(got, x[torch.cat(ids).cpu().numpy()].sum(axis=1))


def test_a_global_capture_while_the_loader_works_and_batches_fed_through_a_static_input():
    # The loader's threads collate and copy while a graph is captured in global mode (any unsafe
    # call of theirs would break the capture), then every batch feeds the graph through its
    # static input. On the stand-in GPU machine (no CUDA graphs in a CPU torch) only the feeding
    # runs, eagerly.
    x = np.arange(64_000, dtype=np.float32).reshape(1000, 64)
    loader = fl().Loader(fl().Dataset({"x": x}), 50, device=DEV, with_index=True, prefetch=4)
    it = iter(loader)
    first = next(it)  # the loader's threads are collating and copying from here on
    static_x = torch.zeros((50, 64), device=first["x"].device)
    if STANDIN:
        def replay():
            static_y.copy_(static_x * 2)
        static_y = static_x * 2
    else:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream(DEV)
        s.wait_stream(torch.cuda.current_stream(DEV))
        with torch.cuda.stream(s):
            static_y = static_x * 2  # warm-up outside the capture
        torch.cuda.current_stream(DEV).wait_stream(s)
        with torch.cuda.graph(g):  # global mode
            static_y = static_x * 2
        replay = g.replay
    for batch in [first, *it]:
        static_x[: len(batch["x"])].copy_(batch["x"], non_blocking=True)
        replay()
        want = x[batch["index"].cpu().numpy()] * 2
        np.testing.assert_array_equal(static_y[: len(want)].cpu().numpy(), want)


def test_process_workers_feed_the_gpu(tmp_path):
    # A script file: spawned workers unpickle the dataset by importing the main module.
    script = tmp_path / "feed.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, torch, fastload as fl
        DEVICE_TYPE = getattr(torch.cuda, "STANDIN_TENSOR_DEVICE", torch.device("cuda")).type

        class Squares:
            def __len__(self):
                return 500

            def __getitem__(self, i):
                return {"x": np.full(8, i * i, np.int64), "i": i}

        if __name__ == "__main__":
            loader = fl.Loader(Squares(), 32, device="cuda:0", shuffle=True, workers="processes", num_workers=2)
            seen = []
            for batch in loader:
                assert batch["x"].device.type == DEVICE_TYPE
                i = batch["i"].cpu().numpy()
                assert (batch["x"].cpu().numpy() == (i * i)[:, None]).all()
                seen += i.tolist()
            assert sorted(seen) == list(range(500))
            print("ok")
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                       env={**os.environ})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ok" in r.stdout


def test_tune_measures_worker_processes_feeding_the_gpu_by_default():
    import tune_datasets  # tests/: importable here and by the worker processes (spawn passes sys.path)

    result = fl().tune(tune_datasets.Points(200, 4), batch_size=16, device=DEV, threads=1, prefetch=2, copy_streams=1,
                       seconds=0.05, repeats=1, progress=False)
    assert [r.workers for r in result.rows] == ["threads", "processes"]
    assert all(r.samples_per_s > 0 for r in result.rows)
    assert result.args["device"] == str(DEV) and result.args["workers"] in ("threads", "processes")
