"""The CUDA layer's tests. Those marked `cuda` (the GPU tests) are skipped without a usable CUDA
GPU; with FASTLOAD_REQUIRE_CUDA=1 a missing GPU is a failure instead, so a GPU machine whose CUDA
setup is broken cannot report a green run. The stand-in driver's tests (test_standin_*.py, not
marked) run everywhere, as CI runs them without a GPU.

The decision is made here, in pytest_runtest_setup, before the skip and xfail markers are
evaluated: tests/conftest.py's collection hook turns the missing GPU into an xfail(run=False)
under FASTLOAD_REQUIRE_CUDA=1, which pytest reports as "xfailed" with exit status 0.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

REQUIRE_ENV = "FASTLOAD_REQUIRE_CUDA"


def cuda_required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def cuda_missing_reason() -> str | None:
    """Why this process cannot run the GPU tests, or None if it can."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a build without CUDA"
    if not torch.cuda.is_available():
        return f"torch.cuda.is_available() is False (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # A conftest's runtest hooks see only the items below its directory: every test here.
    if item.get_closest_marker("cuda") is None:
        return  # a stand-in driver test: needs no GPU
    reason = cuda_missing_reason()
    if reason is None:
        return
    if cuda_required():
        pytest.fail(f"{REQUIRE_ENV}=1 but no usable CUDA GPU: {reason}", pytrace=False)
    pytest.skip(f"needs a CUDA GPU: {reason}")


# tests/test_*.py do `from conftest import ...` meaning tests/conftest.py. Both conftests are
# imported as the module "conftest" (tests/ is not a package), so after this one is collected
# that name is this module: forward what it does not define to tests/conftest.py.
_parent: ModuleType | None = None


def __getattr__(name: str) -> Any:
    global _parent
    if name.startswith(("_", "pytest")):  # pytest's probes of a conftest (pytest_plugins, ...)
        raise AttributeError(f"module 'conftest' has no attribute {name!r}")
    if _parent is None:
        path = Path(__file__).resolve().parent.parent / "conftest.py"
        spec = importlib.util.spec_from_file_location("_fastload_tests_conftest", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _parent = module
    try:
        return getattr(_parent, name)
    except AttributeError:
        raise AttributeError(f"module 'conftest' has no attribute {name!r}") from None
