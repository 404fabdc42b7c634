"""Shared fixtures and the `cuda` marker: skipped without a GPU, unless FASTLOAD_REQUIRE_CUDA=1
turns the skip into a failure (set it on GPU machines so a broken CUDA setup cannot pass)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    require = os.environ.get("FASTLOAD_REQUIRE_CUDA") == "1"
    for item in items:
        # The marker, not the keyword: every test under tests/cuda has the keyword "cuda" (its
        # directory's name), the stand-in driver's tests there too, which must run without a GPU.
        if item.get_closest_marker("cuda") is not None:
            if require:  # a failure, not a skip: a broken GPU machine must not pass
                item.add_marker(pytest.mark.usefixtures("_fail_without_cuda"))
            else:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture
def _fail_without_cuda():
    pytest.fail("FASTLOAD_REQUIRE_CUDA=1 but no usable CUDA GPU", pytrace=False)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def native_thread_count() -> int:
    """Threads of this process, native ones included (threading.active_count misses those)."""
    return len(os.listdir("/proc/self/task"))
