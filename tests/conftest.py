"""Shared fixtures and the `cuda` marker: skipped without a GPU, unless FASTLOAD_REQUIRE_CUDA=1
turns the skip into a failure (set it on GPU machines so a broken CUDA setup cannot pass)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch


# The quick subset (`pytest -m quick`, about a minute on two cores): the loader, the sampler, bad
# input, resume state, the packaging metadata and the documentation's examples. Whole files, less
# their slow, distributed and GPU tests; tests/test_quick.py keeps it small.
QUICK_FILES = frozenset({
    "test_loader.py", "test_sampler.py", "test_errors.py", "test_state.py", "test_metadata.py",
    "test_readme.py", "test_readme_data.py", "test_readme_mix.py", "test_docs.py",
})


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in QUICK_FILES and not {"slow", "distributed", "cuda"} & set(item.keywords):
            item.add_marker(pytest.mark.quick)
    if torch.cuda.is_available():
        return
    require = os.environ.get("FASTLOAD_REQUIRE_CUDA") == "1"
    for item in items:
        if "cuda" in item.keywords:
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
