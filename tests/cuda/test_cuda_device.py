"""A GPU Loader's device on a real GPU: "cuda" resolved to an index at construction without
initialising CUDA (tests/test_device.py covers every branch with a stubbed torch.cuda), and CUDA
tensors refused as dataset columns."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.cuda

STANDIN = bool(getattr(torch.cuda, "is_fastload_standin", False))  # see tests/gpu_standin

RESOLVE = textwrap.dedent("""
    import json, sys
    import numpy as np, torch, fastload as fl
    if sys.argv[1] == "set_device":  # what a script does before building its loader
        torch.cuda.set_device(torch.cuda.device_count() - 1)
    loader = fl.Loader(fl.Dataset({"x": np.arange(10, dtype=np.int64)}), batch_size=5, device="cuda")
    out = {"device": str(loader.device), "initialised_by_the_loader": torch.cuda.is_initialized(),
           "count": torch.cuda.device_count()}
    batch = next(iter(loader))
    tensor_device = getattr(torch.cuda, "STANDIN_TENSOR_DEVICE", loader.device)
    out["batch_on_the_loader_device"] = batch["x"].device == tensor_device
    out["values"] = batch["x"].cpu().tolist()
    loader.close()
    print(json.dumps(out))
""")


def _resolve(how: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    result = subprocess.run([sys.executable, "-c", RESOLVE, how], capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_cuda_is_resolved_at_construction_without_initialising_cuda():
    out = _resolve("fresh")
    assert out["device"] == "cuda:0"
    assert out["initialised_by_the_loader"] is False
    assert out["batch_on_the_loader_device"] is True
    assert out["values"] == [0, 1, 2, 3, 4]


def test_cuda_after_set_device_is_pytorchs_current_device():
    out = _resolve("set_device")
    assert out["device"] == f"cuda:{out['count'] - 1}"
    assert out["batch_on_the_loader_device"] is True
    assert out["values"] == [0, 1, 2, 3, 4]


@pytest.mark.skipif(STANDIN, reason="the stand-in GPU has no CUDA tensors")
def test_gpu_tensor_columns_are_refused():
    import fastload as fl

    with pytest.raises(ValueError, match="must be a CPU tensor"):
        fl.Dataset({"x": torch.zeros(3, device="cuda")})
