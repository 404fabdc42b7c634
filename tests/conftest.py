"""Shared fixtures and the `cuda` marker: skipped without a GPU, unless FASTLOAD_REQUIRE_CUDA=1
turns the skip into a failure (set it on GPU machines so a broken CUDA setup cannot pass)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch


# The quick subset (`pytest -m quick`, 15-50 s on two cores): the loader, the sampler, bad
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


@pytest.fixture(autouse=True)
def _no_leaked_logging_locks():
    """A test that raises KeyboardInterrupt at random moments (a signal handler) can leave
    logging's locks held by the main thread (tests/ctrl_c.py says how); then every other thread
    that logs, the in-process servers of the object-storage tests included, waits forever.
    Released after each test, so one test's Ctrl-C cannot hang a later one."""
    yield
    from ctrl_c import release_leaked_logging_locks

    release_leaked_logging_locks()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def native_thread_count() -> int:
    """Threads of this process, native ones included (threading.active_count misses those)."""
    return len(os.listdir("/proc/self/task"))


# ---------------------------------------------------------------- object storage (tests/test_storage*.py)
@pytest.fixture(scope="session")
def s3_server():
    """A real S3 HTTP server (moto's server mode) on 127.0.0.1, with test credentials in the
    environment (the loader reads them through boto3's standard chain)."""
    server_mod = pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    env = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": "SECRETsecretSECRET0123456789",
           "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}", port
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_proxy(s3_server):
    """A fault-injecting proxy in front of the S3 server (tests/s3_proxy.py), fresh per test."""
    from s3_proxy import S3Proxy

    proxy = S3Proxy(s3_server[1])
    try:
        yield proxy
    finally:
        proxy.close()


class GcsEmulator:
    """A GCS JSON API server on 127.0.0.1 (gcp-storage-emulator, in memory) and the few calls the
    tests make to fill it."""

    def __init__(self):
        from gcp_storage_emulator.server import create_server

        self.server = create_server("127.0.0.1", 0, in_memory=True)
        self.server.start()
        self.port = self.server._api._httpd.server_port
        self.url = f"http://127.0.0.1:{self.port}"

    def bucket(self) -> str:
        import json
        import urllib.request
        import uuid

        name = f"g-{uuid.uuid4().hex[:12]}"
        req = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", data=json.dumps({"name": name}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req).read()
        return name

    def put(self, bucket: str, name: str, data: bytes) -> None:
        import urllib.parse
        import urllib.request

        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        req = urllib.request.Request(f"{self.url}/upload/storage/v1/b/{bucket}/o?{query}", data=data, method="POST",
                                     headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(req).read()

    def put_dir(self, bucket: str, prefix: str, local) -> None:
        for dirpath, _, names in os.walk(local):
            for n in names:
                full = os.path.join(dirpath, n)
                with open(full, "rb") as f:
                    self.put(bucket, f"{prefix}/{os.path.relpath(full, local)}", f.read())


@pytest.fixture(scope="session")
def gcs_server():
    """A real GCS JSON API server on 127.0.0.1 (gcp-storage-emulator), for the gs:// tests."""
    pytest.importorskip("gcp_storage_emulator")
    emulator = GcsEmulator()
    try:
        yield emulator
    finally:
        emulator.server.stop()


@pytest.fixture
def gcs_proxy(gcs_server):
    """The fault-injecting proxy of tests/s3_proxy.py in front of the GCS emulator."""
    from s3_proxy import S3Proxy

    proxy = S3Proxy(gcs_server.port)
    try:
        yield proxy
    finally:
        proxy.close()
