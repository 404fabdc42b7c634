"""Tests of the stand-in CUDA driver (tests/fake_cuda) itself, through ctypes: the driver behaviour
fastload's transfer engine relies on, and every misuse detector caught in the act."""
from __future__ import annotations

import ctypes
import itertools
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from ctypes import POINTER, byref, c_char, c_char_p, c_float, c_int, c_longlong, c_size_t, c_uint, c_ulonglong, c_void_p

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # tests/: fake_cuda
from fake_cuda.build import build  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
TESTS_DIR = HERE.parent
SMOKE_SOURCE = TESTS_DIR / "fake_cuda" / "smoke.cpp"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the fake driver")

SUCCESS = 0
INVALID_VALUE = 1
OUT_OF_MEMORY = 2
NOT_INITIALIZED = 3
STUB_LIBRARY = 34
NO_DEVICE = 100
INVALID_DEVICE = 101
INVALID_CONTEXT = 201
INVALID_HANDLE = 400
NOT_FOUND = 500
NOT_READY = 600
ILLEGAL_ADDRESS = 700
HOST_MEMORY_ALREADY_REGISTERED = 712
HOST_MEMORY_NOT_REGISTERED = 713
LAUNCH_FAILED = 719
CAPTURE_UNSUPPORTED = 900
CAPTURE_INVALIDATED = 901
ILLEGAL_STATE = 401

CAPTURE_GLOBAL, CAPTURE_THREAD_LOCAL, CAPTURE_RELAXED = 0, 1, 2
STREAM_LEGACY, STREAM_PER_THREAD = 0x1, 0x2

NON_BLOCKING = 0x1
HOSTALLOC_PORTABLE = 0x1
EVENT_DISABLE_TIMING = 0x2

_R = c_int  # CUresult
SIGNATURES = {
    "cuGetErrorString": ctypes.CFUNCTYPE(_R, c_int, POINTER(c_char_p)),
    "cuGetErrorName": ctypes.CFUNCTYPE(_R, c_int, POINTER(c_char_p)),
    "cuInit": ctypes.CFUNCTYPE(_R, c_uint),
    "cuDriverGetVersion": ctypes.CFUNCTYPE(_R, POINTER(c_int)),
    "cuDeviceGetCount": ctypes.CFUNCTYPE(_R, POINTER(c_int)),
    "cuDeviceGet": ctypes.CFUNCTYPE(_R, POINTER(c_int), c_int),
    "cuDeviceGetName": ctypes.CFUNCTYPE(_R, POINTER(c_char), c_int, c_int),
    "cuDevicePrimaryCtxRetain": ctypes.CFUNCTYPE(_R, POINTER(c_void_p), c_int),
    "cuDevicePrimaryCtxRelease": ctypes.CFUNCTYPE(_R, c_int),
    "cuCtxSetCurrent": ctypes.CFUNCTYPE(_R, c_void_p),
    "cuCtxGetCurrent": ctypes.CFUNCTYPE(_R, POINTER(c_void_p)),
    "cuCtxSynchronize": ctypes.CFUNCTYPE(_R),
    "cuStreamCreate": ctypes.CFUNCTYPE(_R, POINTER(c_void_p), c_uint),
    "cuStreamDestroy": ctypes.CFUNCTYPE(_R, c_void_p),
    "cuStreamWaitEvent": ctypes.CFUNCTYPE(_R, c_void_p, c_void_p, c_uint),
    "cuStreamSynchronize": ctypes.CFUNCTYPE(_R, c_void_p),
    "cuStreamQuery": ctypes.CFUNCTYPE(_R, c_void_p),
    "cuEventCreate": ctypes.CFUNCTYPE(_R, POINTER(c_void_p), c_uint),
    "cuEventRecord": ctypes.CFUNCTYPE(_R, c_void_p, c_void_p),
    "cuEventQuery": ctypes.CFUNCTYPE(_R, c_void_p),
    "cuEventSynchronize": ctypes.CFUNCTYPE(_R, c_void_p),
    "cuEventDestroy": ctypes.CFUNCTYPE(_R, c_void_p),
    "cuEventElapsedTime": ctypes.CFUNCTYPE(_R, POINTER(c_float), c_void_p, c_void_p),
    "cuMemAlloc": ctypes.CFUNCTYPE(_R, POINTER(c_ulonglong), c_size_t),
    "cuMemFree": ctypes.CFUNCTYPE(_R, c_ulonglong),
    "cuMemHostAlloc": ctypes.CFUNCTYPE(_R, POINTER(c_void_p), c_size_t, c_uint),
    "cuMemFreeHost": ctypes.CFUNCTYPE(_R, c_void_p),
    "cuMemHostRegister": ctypes.CFUNCTYPE(_R, c_void_p, c_size_t, c_uint),
    "cuMemHostUnregister": ctypes.CFUNCTYPE(_R, c_void_p),
    "cuMemcpyHtoDAsync": ctypes.CFUNCTYPE(_R, c_ulonglong, c_void_p, c_size_t, c_void_p),
    "cuMemcpyDtoHAsync": ctypes.CFUNCTYPE(_R, c_void_p, c_ulonglong, c_size_t, c_void_p),
    "cuMemcpyDtoH": ctypes.CFUNCTYPE(_R, c_void_p, c_ulonglong, c_size_t),
    "cuMemGetInfo": ctypes.CFUNCTYPE(_R, POINTER(c_size_t), POINTER(c_size_t)),
    "cuThreadExchangeStreamCaptureMode": ctypes.CFUNCTYPE(_R, POINTER(c_int)),
    "cuStreamBeginCapture": ctypes.CFUNCTYPE(_R, c_void_p, c_int),
    "cuStreamEndCapture": ctypes.CFUNCTYPE(_R, c_void_p, POINTER(c_void_p)),
    "cuStreamIsCapturing": ctypes.CFUNCTYPE(_R, c_void_p, POINTER(c_int)),
}

# Every configuration key at its documented default, restored before each test.
DEFAULTS = {
    "device_count": 2,
    "stub": 0,
    "max_delay_us": 200,
    "seed": 0x5EED,
    "abort_on_misuse": 0,
    "fail_alloc_after": -1,
    "fail_copy_after": -1,
    "fail_event_sync_after": -1,
    "fail_event_record_after": -1,
    "fail_event_record_on": 0,
    "total_memory": 16 << 30,
    "other_allocator_bytes": 0,
    "driver_version": 12040,
    "paused": 0,
}


class FakeCuda:
    """One loaded copy of the library: driver entry points fetched through cuGetProcAddress_v2, as
    fastload fetches them, plus the fake_cuda_* controls and a few shorthands for tests."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self.lib = lib = ctypes.CDLL(str(self.path))
        lib.cuGetProcAddress_v2.argtypes = [c_char_p, POINTER(c_void_p), c_int, c_ulonglong, POINTER(c_int)]
        lib.cuGetProcAddress_v2.restype = c_int
        lib.cuGetProcAddress.argtypes = [c_char_p, POINTER(c_void_p), c_int, c_ulonglong]
        lib.cuGetProcAddress.restype = c_int
        lib.fake_cuda_misuse_count.argtypes = []
        lib.fake_cuda_misuse_count.restype = c_int
        lib.fake_cuda_misuse_message.argtypes = [c_int, POINTER(c_char), c_int]
        lib.fake_cuda_misuse_message.restype = c_int
        lib.fake_cuda_reset_misuses.argtypes = []
        lib.fake_cuda_reset_misuses.restype = None
        lib.fake_cuda_configure.argtypes = [c_char_p, c_longlong]
        lib.fake_cuda_configure.restype = c_int
        lib.fake_cuda_stat.argtypes = [c_char_p]
        lib.fake_cuda_stat.restype = c_longlong
        for name in ("fake_cuda_calls", "fake_cuda_thread_calls"):
            getattr(lib, name).argtypes = [c_char_p]
            getattr(lib, name).restype = c_longlong
        lib.fake_cuda_stream_sleep.argtypes = [c_void_p, c_longlong]
        lib.fake_cuda_stream_sleep.restype = c_int
        lib.fake_cuda_fault.argtypes = [c_void_p, c_int]
        lib.fake_cuda_fault.restype = c_int
        lib.fake_cuda_clear_fault.argtypes = [c_int]
        lib.fake_cuda_clear_fault.restype = c_int
        for name, prototype in SIGNATURES.items():
            setattr(self, name, prototype(self.proc(name)))

    def proc(self, name: str) -> int:
        pfn, status = c_void_p(), c_int(-1)
        rc = self.lib.cuGetProcAddress_v2(name.encode(), byref(pfn), 12000, 0, byref(status))
        assert (rc, status.value) == (SUCCESS, 0) and pfn.value, name
        return pfn.value

    # -- controls
    def configure(self, key: str, value: int) -> int:
        return self.lib.fake_cuda_configure(key.encode(), value)

    def stat(self, key: str) -> int:
        return self.lib.fake_cuda_stat(key.encode())

    def misuses(self) -> list[str]:
        buf = ctypes.create_string_buffer(2048)
        out = []
        for i in range(self.lib.fake_cuda_misuse_count()):
            if self.lib.fake_cuda_misuse_message(i, buf, len(buf)) < 0:
                break
            out.append(buf.value.decode())
        return out

    def reset_misuses(self) -> None:
        self.lib.fake_cuda_reset_misuses()

    def calls(self, name: str) -> int:
        return self.lib.fake_cuda_calls(name.encode())

    def thread_calls(self, name: str) -> int:
        return self.lib.fake_cuda_thread_calls(name.encode())

    def sleep(self, stream: int, us: int) -> None:
        self.ok(self.lib.fake_cuda_stream_sleep(stream, us), "fake_cuda_stream_sleep")

    def capture_mode(self, mode: int) -> int:
        """Sets this thread's capture mode; returns the previous one."""
        m = c_int(mode)
        self.ok(self.cuThreadExchangeStreamCaptureMode(byref(m)), "cuThreadExchangeStreamCaptureMode")
        return m.value

    # -- shorthands
    def ok(self, rc: int, what: str = "call") -> None:
        assert rc == SUCCESS, f"{what} returned {rc}; misuses: {self.misuses()}"

    def retain(self, device: int) -> int:
        ctx = c_void_p()
        self.ok(self.cuDevicePrimaryCtxRetain(byref(ctx), device), "cuDevicePrimaryCtxRetain")
        return ctx.value

    def stream(self, flags: int = NON_BLOCKING) -> int:
        h = c_void_p()
        self.ok(self.cuStreamCreate(byref(h), flags), "cuStreamCreate")
        return h.value

    def event(self, flags: int = EVENT_DISABLE_TIMING) -> int:
        h = c_void_p()
        self.ok(self.cuEventCreate(byref(h), flags), "cuEventCreate")
        return h.value

    def device_alloc(self, size: int) -> int:
        p = c_ulonglong()
        self.ok(self.cuMemAlloc(byref(p), size), "cuMemAlloc")
        return p.value

    def host_alloc(self, size: int, flags: int = 0) -> int:
        p = c_void_p()
        self.ok(self.cuMemHostAlloc(byref(p), size, flags), "cuMemHostAlloc")
        return p.value

    def recorded(self, stream: int) -> int:
        e = self.event()
        self.ok(self.cuEventRecord(e, stream), "cuEventRecord")
        return e

    @staticmethod
    def fill(ptr: int, data: bytes) -> None:
        ctypes.memmove(ptr, data, len(data))

    @staticmethod
    def read(ptr: int, size: int) -> bytes:
        return ctypes.string_at(ptr, size)


def pattern(tag: int, size: int) -> bytes:
    return bytes((tag * 37 + i) % 251 for i in range(256)) * (size // 256)


def assert_one_misuse(fake: FakeCuda, phrase: str) -> str:
    found = fake.misuses()
    assert len(found) == 1 and phrase in found[0], found
    fake.reset_misuses()
    return found[0]


_copies = itertools.count()


def fresh_copy(lib_path: pathlib.Path, directory: pathlib.Path) -> FakeCuda:
    """A private instance in pristine state: another file name is another dlopen handle."""
    target = directory / f"libfake_cuda_copy{next(_copies)}.so"
    shutil.copyfile(lib_path, target)
    return FakeCuda(target)


@pytest.fixture(scope="session")
def lib_path(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return build(tmp_path_factory.mktemp("fake_cuda"))


@pytest.fixture(scope="session")
def driver(lib_path: pathlib.Path) -> FakeCuda:
    fake = FakeCuda(lib_path)
    fake.ok(fake.cuInit(0), "cuInit")
    fake.contexts = [fake.retain(0), fake.retain(1)]
    return fake


@pytest.fixture
def cuda(driver: FakeCuda):
    """The shared instance with default settings, no misuses, device 0 current on this thread."""
    for key, value in DEFAULTS.items():
        assert driver.configure(key, value) == 0, key
    driver.reset_misuses()
    driver.ok(driver.cuCtxSetCurrent(driver.contexts[0]))
    yield driver
    driver.configure("paused", 0)  # never leave the workers of later tests stopped
    for device in (0, 1):
        driver.lib.fake_cuda_clear_fault(device)


@pytest.fixture
def fresh(lib_path: pathlib.Path, tmp_path: pathlib.Path) -> FakeCuda:
    return fresh_copy(lib_path, tmp_path)


def run_in_thread(fn, *args):
    """Runs fn on a new thread (which has no current context) and re-raises what it raised."""
    result: dict = {}

    def body():
        try:
            result["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed back to the test thread
            result["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive()
    if "error" in result:
        raise result["error"]
    return result.get("value")


# ---- Build and lookup


def test_build_reuses_an_up_to_date_library(lib_path: pathlib.Path):
    before = lib_path.stat().st_mtime_ns
    assert build(lib_path.parent) == lib_path
    assert lib_path.stat().st_mtime_ns == before
    with pytest.raises(ValueError, match="sanitize"):
        build(lib_path.parent, sanitize="thread -O0")  # one sanitizer name, no extra flags


def test_build_script_prints_the_library_path(lib_path: pathlib.Path):
    script = TESTS_DIR / "fake_cuda" / "build.py"
    out = subprocess.run(
        [sys.executable, str(script), str(lib_path.parent)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(lib_path)


def test_entry_points_are_found_by_base_name(driver: FakeCuda):
    lib = driver.lib
    for name in SIGNATURES:
        pfn = c_void_p()
        assert lib.cuGetProcAddress(name.encode(), byref(pfn), 12000, 0) == SUCCESS, name
        assert pfn.value == driver.proc(name)
    for unknown in (b"cuLaunchKernel", b"cuMemAlloc_v2", b""):
        pfn, status = c_void_p(0x1234), c_int(-1)
        assert lib.cuGetProcAddress_v2(unknown, byref(pfn), 12000, 0, byref(status)) == NOT_FOUND
        assert pfn.value is None and status.value == 1
        pfn = c_void_p(0x1234)
        assert lib.cuGetProcAddress(unknown, byref(pfn), 12000, 0) == NOT_FOUND and pfn.value is None


def test_error_names_and_strings(driver: FakeCuda):
    text = c_char_p()
    assert driver.cuGetErrorName(INVALID_VALUE, byref(text)) == SUCCESS
    assert text.value == b"CUDA_ERROR_INVALID_VALUE"
    assert driver.cuGetErrorString(ILLEGAL_ADDRESS, byref(text)) == SUCCESS
    assert text.value == b"an illegal memory access was encountered"
    for code in (SUCCESS, OUT_OF_MEMORY, STUB_LIBRARY, NOT_READY, LAUNCH_FAILED, 999):
        assert driver.cuGetErrorName(code, byref(text)) == SUCCESS and text.value.startswith(b"CUDA_")
    assert driver.cuGetErrorString(123456, byref(text)) == INVALID_VALUE and text.value is None


def test_controls_reject_unknown_keys_and_bad_values(driver: FakeCuda):
    assert driver.configure("no_such_key", 1) == -1
    assert driver.configure("device_count", -1) == -1
    assert driver.configure("max_delay_us", -5) == -1
    assert driver.stat("no_such_stat") == -1
    assert driver.lib.fake_cuda_misuse_message(10**6, None, 0) == -1


# ---- Initialisation, devices, contexts


def test_nothing_works_before_cuinit(fresh: FakeCuda):
    count, version = c_int(), c_int()
    assert fresh.cuDeviceGetCount(byref(count)) == NOT_INITIALIZED
    assert fresh.cuDevicePrimaryCtxRetain(byref(c_void_p()), 0) == NOT_INITIALIZED
    assert fresh.cuDriverGetVersion(byref(version)) == SUCCESS and version.value >= 12000
    fresh.ok(fresh.cuInit(0))
    fresh.ok(fresh.cuDeviceGetCount(byref(count)))
    assert count.value == 2
    assert fresh.misuses() == []


def test_stub_library_and_no_device(fresh: FakeCuda):
    assert fresh.configure("stub", 1) == 0
    assert fresh.cuInit(0) == STUB_LIBRARY
    assert fresh.cuDeviceGetCount(byref(c_int())) == NOT_INITIALIZED
    assert fresh.configure("stub", 0) == 0
    assert fresh.configure("device_count", 0) == 0
    assert fresh.cuInit(0) == NO_DEVICE
    assert fresh.configure("device_count", 3) == 0
    fresh.ok(fresh.cuInit(0))
    count = c_int()
    fresh.ok(fresh.cuDeviceGetCount(byref(count)))
    assert count.value == 3


def test_environment_sets_defaults(lib_path: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FAKE_CUDA_DEVICE_COUNT", "5")
    monkeypatch.setenv("FAKE_CUDA_MAX_DELAY_US", "7")
    monkeypatch.setenv("FAKE_CUDA_ABORT_ON_MISUSE", "0")
    fake = fresh_copy(lib_path, tmp_path)
    fake.ok(fake.cuInit(0))
    count = c_int()
    fake.ok(fake.cuDeviceGetCount(byref(count)))
    assert count.value == 5
    assert fake.stat("max_delay_us") == 7


def test_devices_and_primary_contexts(fresh: FakeCuda):
    fresh.ok(fresh.cuInit(0))
    dev = c_int()
    fresh.ok(fresh.cuDeviceGet(byref(dev), 1))
    assert dev.value == 1
    assert fresh.cuDeviceGet(byref(dev), 2) == INVALID_DEVICE
    name = ctypes.create_string_buffer(64)
    fresh.ok(fresh.cuDeviceGetName(name, len(name), 1))
    assert name.value.endswith(b"1")

    ctx = fresh.retain(0)
    assert fresh.retain(0) == ctx != fresh.retain(1)
    assert fresh.stat("contexts_retained") == 3
    fresh.ok(fresh.cuCtxSetCurrent(ctx))
    current = c_void_p()
    fresh.ok(fresh.cuCtxGetCurrent(byref(current)))
    assert current.value == ctx

    def current_elsewhere():
        other = c_void_p(1)
        fresh.ok(fresh.cuCtxGetCurrent(byref(other)))
        return other.value

    assert run_in_thread(current_elsewhere) is None  # current context is per thread
    fresh.ok(fresh.cuDevicePrimaryCtxRelease(1))
    fresh.ok(fresh.cuDevicePrimaryCtxRelease(0))
    fresh.ok(fresh.cuDevicePrimaryCtxRelease(0))
    assert fresh.stat("contexts_retained") == 0
    assert fresh.misuses() == []

    # Released to zero: the context is destroyed until retained again.
    assert fresh.cuCtxSetCurrent(ctx) == INVALID_CONTEXT
    assert_one_misuse(fresh, "handle used after destroy")
    assert fresh.cuStreamCreate(byref(c_void_p()), NON_BLOCKING) == INVALID_CONTEXT  # still current here
    assert_one_misuse(fresh, "handle used after destroy")
    assert fresh.cuDevicePrimaryCtxRelease(0) == INVALID_CONTEXT
    assert_one_misuse(fresh, "not retained")
    assert fresh.retain(0) == ctx
    fresh.ok(fresh.cuCtxSetCurrent(ctx))
    assert fresh.cuCtxSetCurrent(0xDEAD0) == INVALID_CONTEXT
    assert_one_misuse(fresh, "invalid context handle")


def test_creating_anything_needs_a_current_context(cuda: FakeCuda):
    def without_context():
        out = c_void_p()
        return [
            cuda.cuStreamCreate(byref(out), NON_BLOCKING),
            cuda.cuEventCreate(byref(out), 0),
            cuda.cuMemAlloc(byref(c_ulonglong()), 256),
            cuda.cuMemHostAlloc(byref(out), 256, 0),
        ]

    assert run_in_thread(without_context) == [INVALID_CONTEXT] * 4
    found = cuda.misuses()
    assert len(found) == 4 and all(m.startswith("no current context") for m in found), found


def test_misuse_lines_go_to_stderr_and_messages_truncate(cuda: FakeCuda, capfd: pytest.CaptureFixture):
    assert cuda.cuStreamDestroy(0) == INVALID_HANDLE
    err = capfd.readouterr().err
    assert err.startswith("fake_libcuda MISUSE: cuStreamDestroy of a default stream"), err
    full = cuda.misuses()[0]
    buf = ctypes.create_string_buffer(8)
    assert cuda.lib.fake_cuda_misuse_message(0, buf, 8) == len(full)
    assert buf.value == full[:7].encode()
    assert cuda.lib.fake_cuda_misuse_message(1, buf, 8) == -1
    cuda.reset_misuses()
    assert cuda.lib.fake_cuda_misuse_count() == 0


# ---- Correct use: asynchronous, ordered, and silent


def round_trips(fake: FakeCuda, ctx: int, tag: int, iterations: int = 10, size: int = 4096) -> None:
    """The engine's pattern: pinned staging slots and device slots reused only behind events."""
    fake.ok(fake.cuCtxSetCurrent(ctx))
    copy, consume = fake.stream(), fake.stream()
    staging = [fake.host_alloc(size) for _ in range(2)]
    slots = [fake.device_alloc(size) for _ in range(2)]
    copied = [fake.event() for _ in range(2)]
    released = [fake.event() for _ in range(2)]
    out = fake.host_alloc(size)
    for it in range(iterations):
        k = it % 2
        if it >= 2:
            fake.ok(fake.cuEventSynchronize(copied[k]))
            fake.ok(fake.cuStreamWaitEvent(copy, released[k], 0))
        data = pattern(tag * 100 + it, size)
        fake.fill(staging[k], data)
        fake.ok(fake.cuMemcpyHtoDAsync(slots[k], staging[k], size, copy))
        fake.ok(fake.cuEventRecord(copied[k], copy))
        fake.ok(fake.cuStreamWaitEvent(consume, copied[k], 0))
        fake.ok(fake.cuMemcpyDtoHAsync(out, slots[k], size, consume))
        fake.ok(fake.cuEventRecord(released[k], consume))
        while (rc := fake.cuEventQuery(released[k])) == NOT_READY:
            time.sleep(0.0001)
        fake.ok(rc)
        assert fake.read(out, size) == data
        assert fake.read(slots[k], size) == data  # "device" memory is readable by address
    fake.ok(fake.cuStreamSynchronize(copy))
    fake.ok(fake.cuStreamSynchronize(consume))
    for k in range(2):
        fake.ok(fake.cuMemFree(slots[k]))
        fake.ok(fake.cuMemFreeHost(staging[k]))
        fake.ok(fake.cuEventDestroy(copied[k]))
        fake.ok(fake.cuEventDestroy(released[k]))
    fake.ok(fake.cuMemFreeHost(out))
    fake.ok(fake.cuStreamDestroy(copy))
    fake.ok(fake.cuStreamDestroy(consume))


def test_correct_transfers_from_several_threads_report_no_misuse(cuda: FakeCuda):
    baseline = {k: cuda.stat(k) for k in ("device_bytes", "pinned_bytes", "live_streams", "live_events")}
    copies = cuda.stat("copies")
    errors: list[BaseException] = []

    def worker(tag: int) -> None:
        try:
            round_trips(cuda, cuda.contexts[tag % 2], tag)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(tag,)) for tag in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert cuda.misuses() == []
    assert cuda.stat("copies") == copies + 40
    assert {k: cuda.stat(k) for k in baseline} == baseline


def test_streams_are_asynchronous_and_events_report_progress(cuda: FakeCuda):
    size = 4096
    s = cuda.stream()
    src, dst = cuda.host_alloc(size), cuda.device_alloc(size)
    never_recorded = cuda.event()
    cuda.ok(cuda.cuEventQuery(never_recorded))
    cuda.ok(cuda.cuEventSynchronize(never_recorded))

    cuda.fill(src, pattern(1, size))
    assert cuda.configure("paused", 1) == 0
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, s))
    done = cuda.recorded(s)
    time.sleep(0.01)
    assert cuda.cuEventQuery(done) == NOT_READY
    assert cuda.cuStreamQuery(s) == NOT_READY
    assert cuda.stat("pending_ops") == 1
    assert cuda.read(dst, size) != pattern(1, size)
    assert cuda.configure("paused", 0) == 0
    cuda.ok(cuda.cuEventSynchronize(done))
    assert cuda.read(dst, size) == pattern(1, size)
    cuda.ok(cuda.cuStreamQuery(s))
    assert cuda.stat("pending_ops") == 0

    # Re-recording moves the event to the new work.
    assert cuda.configure("paused", 1) == 0
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, s))
    cuda.ok(cuda.cuEventRecord(done, s))
    assert cuda.cuEventQuery(done) == NOT_READY
    assert cuda.configure("paused", 0) == 0
    cuda.ok(cuda.cuCtxSynchronize())
    cuda.ok(cuda.cuEventQuery(done))
    for e in (done, never_recorded):
        cuda.ok(cuda.cuEventDestroy(e))
    cuda.ok(cuda.cuMemFree(dst))
    cuda.ok(cuda.cuMemFreeHost(src))
    cuda.ok(cuda.cuStreamDestroy(s))
    assert cuda.misuses() == []


def test_a_stream_waits_for_the_event_it_was_told_to(cuda: FakeCuda):
    size = 64 * 1024
    cuda.configure("max_delay_us", 3000)
    producer, consumer = cuda.stream(), cuda.stream()
    src, out, dst = cuda.host_alloc(size), cuda.host_alloc(size), cuda.device_alloc(size)
    for tag in range(3):
        cuda.fill(src, pattern(tag, size))
        cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, producer))
        copied = cuda.recorded(producer)
        cuda.ok(cuda.cuStreamWaitEvent(consumer, copied, 0))
        cuda.ok(cuda.cuMemcpyDtoHAsync(out, dst, size, consumer))
        cuda.ok(cuda.cuStreamSynchronize(consumer))
        assert cuda.read(out, size) == pattern(tag, size)
        cuda.ok(cuda.cuEventDestroy(copied))
        cuda.ok(cuda.cuStreamSynchronize(producer))
    for p in (src, out):
        cuda.ok(cuda.cuMemFreeHost(p))
    cuda.ok(cuda.cuMemFree(dst))
    for s in (producer, consumer):
        cuda.ok(cuda.cuStreamDestroy(s))
    assert cuda.misuses() == []


def test_default_stream_handles_and_synchronous_copy(cuda: FakeCuda):
    size = 4096
    src, dst = cuda.host_alloc(size), cuda.device_alloc(size)
    cuda.fill(src, pattern(5, size))
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, 0x2))  # per-thread default stream
    assert_one_misuse(cuda, "copy on a blocking stream")
    e = cuda.recorded(0x1)  # legacy: the same stream in this fake
    cuda.ok(cuda.cuEventSynchronize(e))
    host = ctypes.create_string_buffer(size)
    cuda.ok(cuda.cuMemcpyDtoH(host, dst, size))
    assert host.raw == pattern(5, size)
    cuda.ok(cuda.cuStreamSynchronize(0))
    cuda.ok(cuda.cuEventDestroy(e))
    cuda.ok(cuda.cuMemFree(dst))
    cuda.ok(cuda.cuMemFreeHost(src))
    assert cuda.misuses() == []


def test_memory_accounting_and_alignment(cuda: FakeCuda):
    before = {k: cuda.stat(k) for k in ("device_bytes", "device_allocations", "pinned_bytes", "pinned_allocations")}
    free0, total = c_size_t(), c_size_t()
    cuda.ok(cuda.cuMemGetInfo(byref(free0), byref(total)))
    assert total.value == 16 << 30
    d = cuda.device_alloc(1000)
    h = cuda.host_alloc(1000, HOSTALLOC_PORTABLE | 0x2 | 0x4)
    assert d % 256 == 0 and h % os.sysconf("SC_PAGE_SIZE") == 0
    free1 = c_size_t()
    cuda.ok(cuda.cuMemGetInfo(byref(free1), byref(total)))
    assert free0.value - free1.value == 1000
    assert cuda.stat("device_bytes") == before["device_bytes"] + 1000
    assert cuda.stat("device_allocations") == before["device_allocations"] + 1
    assert cuda.stat("pinned_bytes") == before["pinned_bytes"] + 1000
    assert cuda.stat("pinned_allocations") == before["pinned_allocations"] + 1
    assert cuda.cuMemHostAlloc(byref(c_void_p()), 16, 0x8) == INVALID_VALUE
    assert cuda.cuMemAlloc(byref(c_ulonglong()), 0) == INVALID_VALUE
    cuda.ok(cuda.cuMemFree(d))
    cuda.ok(cuda.cuMemFreeHost(h))
    assert {k: cuda.stat(k) for k in before} == before
    assert cuda.misuses() == []


# ---- Injected failures


def test_allocation_failures(cuda: FakeCuda):
    assert cuda.configure("fail_alloc_after", 1) == 0
    d = cuda.device_alloc(256)
    assert cuda.cuMemHostAlloc(byref(c_void_p()), 256, 0) == OUT_OF_MEMORY
    h = cuda.host_alloc(256)  # once only
    cuda.ok(cuda.cuMemFree(d))
    cuda.ok(cuda.cuMemFreeHost(h))

    assert cuda.configure("total_memory", 1 << 20) == 0
    d = cuda.device_alloc(768 << 10)
    assert cuda.cuMemAlloc(byref(c_ulonglong()), 512 << 10) == OUT_OF_MEMORY
    free, total = c_size_t(), c_size_t()
    cuda.ok(cuda.cuMemGetInfo(byref(free), byref(total)))
    assert (free.value, total.value) == (256 << 10, 1 << 20)
    cuda.ok(cuda.cuMemFree(d))
    assert cuda.misuses() == []


def test_copy_and_event_failures(cuda: FakeCuda):
    size = 256
    s = cuda.stream()
    src, dst = cuda.host_alloc(size), cuda.device_alloc(size)
    assert cuda.configure("fail_copy_after", 1) == 0
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, s))
    assert cuda.cuMemcpyHtoDAsync(dst, src, size, s) == 999  # CUDA_ERROR_UNKNOWN, not sticky
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, s))

    assert cuda.configure("fail_event_record_after", 0) == 0
    e = cuda.event()
    assert cuda.cuEventRecord(e, s) == OUT_OF_MEMORY  # once, and not sticky
    cuda.ok(cuda.cuEventRecord(e, s))
    assert cuda.configure("fail_event_record_on", s) == 0  # every record on that stream
    assert cuda.cuEventRecord(e, s) == OUT_OF_MEMORY
    cuda.ok(cuda.cuEventRecord(e, 0))
    assert cuda.configure("fail_event_record_on", 0) == 0
    cuda.ok(cuda.cuEventRecord(e, s))

    # An injected illegal address stands for a kernel that faulted: the error is sticky.
    assert cuda.configure("fail_event_sync_after", 1) == 0
    cuda.ok(cuda.cuEventSynchronize(e))
    assert cuda.cuEventSynchronize(e) == ILLEGAL_ADDRESS
    assert cuda.cuEventQuery(e) == ILLEGAL_ADDRESS
    assert cuda.cuStreamSynchronize(s) == ILLEGAL_ADDRESS
    assert cuda.cuMemcpyHtoDAsync(dst, src, size, s) == ILLEGAL_ADDRESS
    assert cuda.cuMemAlloc(byref(c_ulonglong()), 256) == ILLEGAL_ADDRESS
    assert run_in_thread(lambda: cuda.cuEventQuery(e)) == ILLEGAL_ADDRESS  # any thread, by handle
    cuda.ok(cuda.cuCtxSetCurrent(cuda.contexts[1]))  # the other device's context is fine
    cuda.ok(cuda.cuEventDestroy(cuda.event()))
    cuda.ok(cuda.cuCtxSetCurrent(cuda.contexts[0]))
    assert cuda.lib.fake_cuda_clear_fault(0) == 0
    cuda.ok(cuda.cuStreamSynchronize(s))
    cuda.ok(cuda.cuEventDestroy(e))
    cuda.ok(cuda.cuMemFree(dst))
    cuda.ok(cuda.cuMemFreeHost(src))
    cuda.ok(cuda.cuStreamDestroy(s))
    assert cuda.stat("copies") > 0
    assert cuda.misuses() == []


# ---- Driver behaviour a transfer engine meets on a real GPU, modelled


def test_a_faulting_kernel_makes_the_error_sticky(cuda: FakeCuda):
    s = cuda.stream()
    before = cuda.recorded(s)
    assert cuda.configure("paused", 1) == 0
    assert cuda.lib.fake_cuda_fault(s, ILLEGAL_ADDRESS) == SUCCESS
    after = cuda.recorded(s)
    cuda.ok(cuda.cuEventQuery(before))  # nothing has faulted yet
    assert cuda.cuEventQuery(after) == NOT_READY
    assert cuda.configure("paused", 0) == 0
    assert cuda.cuEventSynchronize(after) == ILLEGAL_ADDRESS
    for rc in (cuda.cuEventQuery(before), cuda.cuStreamSynchronize(s), cuda.cuEventRecord(before, s),
               cuda.cuEventDestroy(before), cuda.cuStreamQuery(0), cuda.cuMemAlloc(byref(c_ulonglong()), 64)):
        assert rc == ILLEGAL_ADDRESS
    assert cuda.lib.fake_cuda_clear_fault(0) == 0
    cuda.ok(cuda.cuStreamSynchronize(s))
    for e in (before, after):
        cuda.ok(cuda.cuEventDestroy(e))
    cuda.ok(cuda.cuStreamDestroy(s))
    assert cuda.misuses() == []


def test_global_capture_refuses_unsafe_calls_from_other_threads(cuda: FakeCuda):
    s, other = cuda.stream(), cuda.stream()
    e = cuda.recorded(other)
    src, dst = cuda.host_alloc(256), cuda.device_alloc(256)

    def elsewhere(mode: int | None):
        cuda.ok(cuda.cuCtxSetCurrent(cuda.contexts[0]))
        if mode is not None:
            cuda.capture_mode(mode)
        # Safe calls: enqueueing on a stream that is not in capture.
        safe = [cuda.cuMemcpyHtoDAsync(dst, src, 256, other), cuda.cuEventRecord(e, other),
                cuda.cuStreamWaitEvent(other, e, 0)]
        query = cuda.cuEventQuery(e)
        p = c_ulonglong()
        alloc = cuda.cuMemAlloc(byref(p), 256)
        if alloc == SUCCESS:
            cuda.ok(cuda.cuMemFree(p.value))
        return safe, SUCCESS if query == NOT_READY else query, alloc

    def capture(mode: int, thread_mode: int | None) -> tuple[tuple, int]:
        cuda.ok(cuda.cuStreamBeginCapture(s, mode))
        status = c_int()
        cuda.ok(cuda.cuStreamIsCapturing(s, byref(status)))
        assert status.value == 1
        got = run_in_thread(elsewhere, thread_mode)
        graph = c_void_p()
        return got, cuda.cuStreamEndCapture(s, byref(graph))

    # A global-mode capture and a thread in the default (global) mode: refused, capture broken.
    (safe, query, alloc), end = capture(CAPTURE_GLOBAL, None)
    assert safe == [SUCCESS] * 3 and (query, alloc) == (CAPTURE_UNSUPPORTED, CAPTURE_UNSUPPORTED)
    assert end == CAPTURE_INVALIDATED
    found = cuda.misuses()
    assert len(found) == 2 and all("during a stream capture" in m for m in found), found
    cuda.reset_misuses()
    # The same thread in relaxed (or thread-local) mode disturbs nothing.
    for thread_mode in (CAPTURE_RELAXED, CAPTURE_THREAD_LOCAL):
        (safe, query, alloc), end = capture(CAPTURE_GLOBAL, thread_mode)
        assert (query, alloc, end) == (SUCCESS, SUCCESS, SUCCESS), thread_mode
    # Thread-local and relaxed captures ignore other threads.
    for mode in (CAPTURE_THREAD_LOCAL, CAPTURE_RELAXED):
        (safe, query, alloc), end = capture(mode, None)
        assert (query, alloc, end) == (SUCCESS, SUCCESS, SUCCESS), mode
    # The capturing thread itself: refused unless relaxed.
    cuda.ok(cuda.cuStreamBeginCapture(s, CAPTURE_THREAD_LOCAL))
    assert cuda.cuEventQuery(e) == CAPTURE_UNSUPPORTED
    assert cuda.cuStreamEndCapture(s, byref(c_void_p())) == CAPTURE_INVALIDATED
    assert_one_misuse(cuda, "during a stream capture")
    cuda.ok(cuda.cuStreamBeginCapture(s, CAPTURE_GLOBAL))
    previous = cuda.capture_mode(CAPTURE_RELAXED)
    assert cuda.cuEventQuery(e) in (SUCCESS, NOT_READY)
    assert cuda.capture_mode(previous) == CAPTURE_RELAXED
    graph = c_void_p()
    cuda.ok(cuda.cuStreamEndCapture(s, byref(graph)))
    assert graph.value
    assert cuda.cuStreamBeginCapture(0, CAPTURE_GLOBAL) == CAPTURE_UNSUPPORTED  # not the legacy stream
    assert cuda.cuStreamEndCapture(s, byref(graph)) == ILLEGAL_STATE
    cuda.ok(cuda.cuStreamSynchronize(other))
    cuda.ok(cuda.cuMemFree(dst))
    cuda.ok(cuda.cuMemFreeHost(src))
    assert cuda.misuses() == []


def test_entry_points_need_a_recent_enough_version(driver: FakeCuda, fresh: FakeCuda):
    lib = driver.lib
    for version, rc, status in ((10000, NOT_FOUND, 2), (10010, SUCCESS, 0), (12000, SUCCESS, 0)):
        pfn, st = c_void_p(), c_int(-1)
        assert lib.cuGetProcAddress_v2(b"cuThreadExchangeStreamCaptureMode", byref(pfn), version, 0, byref(st)) == rc
        assert st.value == status and bool(pfn.value) == (rc == SUCCESS), version
    # An older driver lacks what later CUDA versions added, whatever version is asked for.
    assert fresh.configure("driver_version", 10000) == 0
    pfn, st = c_void_p(), c_int(-1)
    assert fresh.lib.cuGetProcAddress_v2(b"cuThreadExchangeStreamCaptureMode", byref(pfn), 12000, 0, byref(st)) \
        == NOT_FOUND
    assert pfn.value is None and st.value == 1
    version = c_int()
    fresh.ok(fresh.cuDriverGetVersion(byref(version)))
    assert version.value == 10000


def test_legacy_and_per_thread_default_streams(cuda: FakeCuda):
    blocking, non_blocking = cuda.stream(flags=0), cuda.stream()
    # The legacy stream waits for blocking streams, not for non-blocking ones.
    cuda.sleep(non_blocking, 300_000)
    e = cuda.recorded(STREAM_LEGACY)
    assert cuda.cuEventQuery(e) == SUCCESS
    cuda.sleep(blocking, 50_000)
    cuda.ok(cuda.cuEventRecord(e, 0))
    assert cuda.cuEventQuery(e) == NOT_READY
    cuda.ok(cuda.cuEventSynchronize(e))
    assert cuda.cuStreamQuery(blocking) == SUCCESS
    # ... and blocking streams wait for the legacy stream.
    cuda.sleep(0, 50_000)
    cuda.ok(cuda.cuEventRecord(e, blocking))
    assert cuda.cuEventQuery(e) == NOT_READY
    cuda.ok(cuda.cuEventSynchronize(e))

    # CU_STREAM_PER_THREAD names a different stream on every thread; each is blocking.
    cuda.sleep(STREAM_PER_THREAD, 50_000)
    mine = cuda.recorded(STREAM_PER_THREAD)

    def other_thread():
        cuda.ok(cuda.cuCtxSetCurrent(cuda.contexts[0]))
        theirs = cuda.recorded(STREAM_PER_THREAD)
        on_legacy = cuda.recorded(STREAM_LEGACY)
        return cuda.cuEventQuery(theirs), cuda.cuEventQuery(on_legacy), on_legacy

    theirs, legacy, on_legacy = run_in_thread(other_thread)
    assert theirs == SUCCESS  # not behind this thread's sleep
    assert legacy == NOT_READY and cuda.cuEventQuery(mine) == NOT_READY  # the legacy stream is
    cuda.ok(cuda.cuEventSynchronize(on_legacy))
    cuda.ok(cuda.cuEventQuery(mine))
    cuda.ok(cuda.cuStreamSynchronize(non_blocking))
    for s in (blocking, non_blocking):
        cuda.ok(cuda.cuStreamDestroy(s))
    assert cuda.misuses() == []


def test_a_release_on_another_threads_per_thread_stream_protects_nothing(cuda: FakeCuda):
    # A batch read on thread A's per-thread stream and released from thread B: only an event on
    # the legacy stream (which waits for every blocking stream) orders the next write after the read.
    size = 4096
    producer = cuda.stream()
    src, out, dst = cuda.host_alloc(size), cuda.host_alloc(size), cuda.device_alloc(size)

    def read_on_my_per_thread_stream():
        cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, producer))
        cuda.ok(cuda.cuStreamWaitEvent(STREAM_PER_THREAD, cuda.recorded(producer), 0))
        cuda.sleep(STREAM_PER_THREAD, 20_000)
        cuda.ok(cuda.cuMemcpyDtoHAsync(out, dst, size, STREAM_PER_THREAD))

    for release_on, caught in ((STREAM_PER_THREAD, True), (STREAM_LEGACY, False)):
        t = threading.Thread(target=lambda: (cuda.ok(cuda.cuCtxSetCurrent(cuda.contexts[0])),
                                             read_on_my_per_thread_stream()))
        t.start()
        t.join()
        released = cuda.recorded(release_on)  # this thread: not the reader's
        cuda.ok(cuda.cuStreamWaitEvent(producer, released, 0))
        cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, producer))
        if caught:
            assert_one_misuse(cuda, "overwritten before the release event")
        else:
            assert cuda.misuses() == []
        cuda.ok(cuda.cuCtxSynchronize())
    cuda.ok(cuda.cuMemFree(dst))
    for p in (src, out):
        cuda.ok(cuda.cuMemFreeHost(p))
    cuda.ok(cuda.cuStreamDestroy(producer))


def test_timing_events_measure_the_time_between_them(cuda: FakeCuda):
    s = cuda.stream()
    start, end, untimed = cuda.event(flags=0), cuda.event(flags=0), cuda.event()
    ms = c_float()
    assert cuda.cuEventElapsedTime(byref(ms), start, end) == INVALID_HANDLE  # not recorded
    cuda.ok(cuda.cuEventRecord(start, s))
    cuda.sleep(s, 30_000)
    cuda.ok(cuda.cuEventRecord(end, s))
    cuda.ok(cuda.cuEventRecord(untimed, s))
    assert cuda.cuEventElapsedTime(byref(ms), start, end) == NOT_READY
    cuda.ok(cuda.cuEventSynchronize(end))
    cuda.ok(cuda.cuEventElapsedTime(byref(ms), start, end))
    assert 30 <= ms.value < 1000, ms.value
    assert cuda.cuEventElapsedTime(byref(ms), start, untimed) == INVALID_HANDLE
    cuda.ok(cuda.cuStreamSynchronize(s))


def test_registered_host_memory_is_page_locked(cuda: FakeCuda):
    size = 8192
    s = cuda.stream()
    dst = cuda.device_alloc(size)
    buf = ctypes.create_string_buffer(size)
    p = ctypes.addressof(buf)
    assert cuda.cuMemcpyHtoDAsync(dst, p, size, s) == INVALID_VALUE  # pageable
    assert_one_misuse(cuda, "source not page-locked")
    before = cuda.stat("registered_bytes")
    cuda.ok(cuda.cuMemHostRegister(p, size, HOSTALLOC_PORTABLE))
    assert cuda.stat("registered_bytes") == before + size
    assert cuda.cuMemHostRegister(p + 16, 16, 0) == HOST_MEMORY_ALREADY_REGISTERED
    cuda.fill(p, pattern(7, size))
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, p, size, s))
    cuda.ok(cuda.cuMemHostUnregister(p))  # the copy was never waited for
    assert_one_misuse(cuda, "unregistered while in use by a queued copy")
    assert cuda.read(dst, size) == pattern(7, size)  # it waited for the copy, as CUDA does
    assert cuda.cuMemcpyHtoDAsync(dst, p, size, s) == INVALID_VALUE
    assert_one_misuse(cuda, "source not page-locked")
    assert cuda.cuMemHostUnregister(p) == HOST_MEMORY_NOT_REGISTERED
    assert_one_misuse(cuda, "did not page-lock")
    cuda.ok(cuda.cuMemHostRegister(p, size, 0))  # the same address again
    assert cuda.cuMemFreeHost(p) == INVALID_VALUE
    assert_one_misuse(cuda, "of memory from cuMemHostRegister")
    cuda.ok(cuda.cuMemHostUnregister(p))
    assert cuda.stat("registered_bytes") == before
    cuda.ok(cuda.cuMemFree(dst))
    cuda.ok(cuda.cuStreamDestroy(s))


def test_memory_held_by_another_allocator(cuda: FakeCuda):
    used = cuda.stat("device_bytes")
    assert cuda.configure("total_memory", used + (1 << 20)) == 0
    assert cuda.configure("other_allocator_bytes", 768 << 10) == 0
    free, total = c_size_t(), c_size_t()
    cuda.ok(cuda.cuMemGetInfo(byref(free), byref(total)))
    assert free.value == 256 << 10
    assert cuda.cuMemAlloc(byref(c_ulonglong()), 512 << 10) == OUT_OF_MEMORY
    assert cuda.configure("other_allocator_bytes", 0) == 0  # the other allocator emptied its cache
    cuda.ok(cuda.cuMemFree(cuda.device_alloc(512 << 10)))


def test_calls_are_counted_per_entry_point_and_thread(cuda: FakeCuda):
    before = {k: cuda.calls(k) for k in ("cuMemAlloc", "cuMemFree", "cuEventRecord", "implicit_syncs")}
    mine = cuda.thread_calls("cuMemAlloc")

    def work():
        cuda.ok(cuda.cuCtxSetCurrent(cuda.contexts[0]))
        cuda.ok(cuda.cuMemFree(cuda.device_alloc(64)))
        return cuda.thread_calls("cuMemAlloc")

    assert run_in_thread(work) == 1
    cuda.ok(cuda.cuEventRecord(cuda.event(), 0))
    assert cuda.thread_calls("cuMemAlloc") == mine
    after = {k: cuda.calls(k) for k in before}
    assert after["cuMemAlloc"] - before["cuMemAlloc"] == 1 and after["cuMemFree"] - before["cuMemFree"] == 1
    assert after["cuEventRecord"] - before["cuEventRecord"] == 1
    assert after["implicit_syncs"] - before["implicit_syncs"] == 2  # alloc and free; a record is none
    assert cuda.calls("cuNoSuchCall") == 0


# ---- Misuse detectors, each caught in the act


def test_detects_pageable_source(cuda: FakeCuda):
    size = 4096
    s = cuda.stream()
    dst = cuda.device_alloc(size)
    pageable = ctypes.create_string_buffer(size)
    assert cuda.cuMemcpyHtoDAsync(dst, ctypes.addressof(pageable), size, s) == INVALID_VALUE
    assert_one_misuse(cuda, "source not page-locked")
    pinned = cuda.host_alloc(size)
    assert cuda.cuMemcpyHtoDAsync(dst, pinned + 16, size, s) == INVALID_VALUE  # runs off the block
    assert_one_misuse(cuda, "source not page-locked")
    # Pinned in device 0's context only: not page-locked as far as device 1 is concerned.
    cuda.ok(cuda.cuCtxSetCurrent(cuda.contexts[1]))
    s1, dst1 = cuda.stream(), cuda.device_alloc(size)
    assert cuda.cuMemcpyHtoDAsync(dst1, pinned, size, s1) == INVALID_VALUE
    assert_one_misuse(cuda, "without CU_MEMHOSTALLOC_PORTABLE")
    cuda.ok(cuda.cuCtxSetCurrent(cuda.contexts[0]))
    portable = cuda.host_alloc(size, HOSTALLOC_PORTABLE)
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst1, portable, size, s1))
    cuda.ok(cuda.cuStreamSynchronize(s1))
    assert cuda.misuses() == []


def test_detects_pinned_source_rewritten_before_its_copy(cuda: FakeCuda):
    size = 4096
    s = cuda.stream()
    src, dst = cuda.host_alloc(size), cuda.device_alloc(size)
    cuda.fill(src, pattern(1, size))
    assert cuda.configure("paused", 1) == 0
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, s))
    cuda.fill(src, pattern(2, size))  # the engine's bug: slot reused before the copy's event
    assert cuda.configure("paused", 0) == 0
    cuda.ok(cuda.cuStreamSynchronize(s))
    assert_one_misuse(cuda, "pinned source rewritten before its copy ran")


def test_random_delays_catch_a_slot_recycled_without_waiting(cuda: FakeCuda):
    size, n = 4096, 8
    assert cuda.configure("max_delay_us", 3000) == 0
    s = cuda.stream()
    slot, dst = cuda.host_alloc(size), cuda.device_alloc(size * n)
    for it in range(n):  # the bug: no cuEventSynchronize on the previous copy before refilling
        cuda.fill(slot, pattern(it, size))
        cuda.ok(cuda.cuMemcpyHtoDAsync(dst + it * size, slot, size, s))
    cuda.ok(cuda.cuStreamSynchronize(s))
    found = cuda.misuses()
    assert found and all("pinned source rewritten" in m for m in found), found
    cuda.reset_misuses()
    for it in range(n):  # fixed: wait for the previous copy's event first
        cuda.fill(slot, pattern(it, size))
        cuda.ok(cuda.cuMemcpyHtoDAsync(dst + it * size, slot, size, s))
        e = cuda.recorded(s)
        cuda.ok(cuda.cuEventSynchronize(e))
        cuda.ok(cuda.cuEventDestroy(e))
    assert cuda.misuses() == []


def test_detects_read_before_the_consumer_waited(cuda: FakeCuda):
    size = 4096
    producer, consumer = cuda.stream(), cuda.stream()
    src, out, dst = cuda.host_alloc(size), cuda.host_alloc(size), cuda.device_alloc(size)
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, producer))
    while cuda.stat("pending_ops"):  # finished, but nothing ordered the read after it
        time.sleep(0.001)
    cuda.ok(cuda.cuMemcpyDtoHAsync(out, dst, size, consumer))
    assert_one_misuse(cuda, "device memory read before the consumer stream waited for its copy")
    host = ctypes.create_string_buffer(size)
    cuda.ok(cuda.cuMemcpyDtoH(host, dst, size))  # the legacy stream did not wait either
    assert_one_misuse(cuda, "device memory read before the consumer stream waited for its copy")
    cuda.ok(cuda.cuStreamSynchronize(consumer))

    # Each way of ordering the read after the copy is accepted.
    def wait_on_event():
        cuda.ok(cuda.cuStreamWaitEvent(consumer, cuda.recorded(producer), 0))

    def poll_event():
        e = cuda.recorded(producer)
        while cuda.cuEventQuery(e) == NOT_READY:
            time.sleep(0.0001)

    def poll_stream():
        while cuda.cuStreamQuery(producer) == NOT_READY:
            time.sleep(0.0001)

    orderings = [
        wait_on_event,
        lambda: cuda.ok(cuda.cuEventSynchronize(cuda.recorded(producer))),
        lambda: cuda.ok(cuda.cuStreamSynchronize(producer)),
        lambda: cuda.ok(cuda.cuCtxSynchronize()),
        poll_event,
        poll_stream,
    ]
    for order in orderings:
        cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, producer))
        order()
        cuda.ok(cuda.cuMemcpyDtoHAsync(out, dst, size, consumer))
        cuda.ok(cuda.cuStreamSynchronize(consumer))
        assert cuda.misuses() == [], order
        cuda.ok(cuda.cuStreamSynchronize(producer))


def test_detects_device_buffer_overwritten_before_release(cuda: FakeCuda):
    size = 4096
    producer, consumer, other = cuda.stream(), cuda.stream(), cuda.stream()
    src, out, dst = cuda.host_alloc(size), cuda.host_alloc(size), cuda.device_alloc(size)

    def produce_and_consume():
        cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, producer))
        cuda.ok(cuda.cuStreamWaitEvent(consumer, cuda.recorded(producer), 0))
        cuda.ok(cuda.cuMemcpyDtoHAsync(out, dst, size, consumer))
        return cuda.recorded(consumer)

    produce_and_consume()
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, producer))  # without waiting for the read
    assert_one_misuse(cuda, "device buffer overwritten before the release event of its previous use completed")

    released = produce_and_consume()
    cuda.ok(cuda.cuStreamWaitEvent(producer, released, 0))  # correct: wait for the release event
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, producer))
    assert cuda.misuses() == []

    # Two streams writing the same bytes unordered; disjoint halves are fine.
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size // 2, other))
    assert_one_misuse(cuda, "device buffer overwritten")
    cuda.ok(cuda.cuStreamSynchronize(producer))
    cuda.ok(cuda.cuStreamSynchronize(other))
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size // 2, producer))
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst + size // 2, src, size // 2, other))
    assert cuda.misuses() == []
    cuda.ok(cuda.cuCtxSynchronize())


def test_detects_use_after_destroy(cuda: FakeCuda):
    size = 256
    s = cuda.stream()
    cuda.ok(cuda.cuStreamDestroy(s))
    assert cuda.cuStreamDestroy(s) == INVALID_HANDLE
    assert_one_misuse(cuda, "handle used after destroy")
    assert cuda.cuStreamSynchronize(s) == INVALID_HANDLE
    assert_one_misuse(cuda, "handle used after destroy")

    s = cuda.stream()
    e = cuda.event()
    cuda.ok(cuda.cuEventDestroy(e))
    assert cuda.cuEventRecord(e, s) == INVALID_HANDLE
    assert_one_misuse(cuda, "handle used after destroy")
    assert cuda.cuEventSynchronize(e) == INVALID_HANDLE
    assert_one_misuse(cuda, "handle used after destroy")
    assert cuda.cuStreamWaitEvent(s, e, 0) == INVALID_HANDLE
    assert_one_misuse(cuda, "handle used after destroy")

    src, dst = cuda.host_alloc(size), cuda.device_alloc(size)
    cuda.ok(cuda.cuMemFree(dst))
    assert cuda.cuMemFree(dst) == INVALID_VALUE
    assert_one_misuse(cuda, "handle used after destroy: double free")
    assert cuda.cuMemcpyHtoDAsync(dst, src, size, s) == INVALID_VALUE
    assert_one_misuse(cuda, "handle used after destroy")
    cuda.ok(cuda.cuMemFreeHost(src))
    assert cuda.cuMemFreeHost(src) == INVALID_VALUE
    assert_one_misuse(cuda, "handle used after destroy: double free")
    dst = cuda.device_alloc(size)
    assert cuda.cuMemcpyHtoDAsync(dst, src, size, s) == INVALID_VALUE
    assert_one_misuse(cuda, "handle used after destroy")
    assert cuda.cuStreamSynchronize(0xBAD0) == INVALID_HANDLE
    assert_one_misuse(cuda, "invalid stream handle")
    assert cuda.cuMemFree(dst + 16) == INVALID_VALUE
    assert_one_misuse(cuda, "did not return")
    cuda.ok(cuda.cuMemFree(dst))
    cuda.ok(cuda.cuStreamDestroy(s))


def test_detects_destroy_and_free_while_work_is_queued(cuda: FakeCuda):
    size = 4096
    s = cuda.stream()
    src, dst = cuda.host_alloc(size), cuda.device_alloc(size)
    cuda.fill(src, pattern(3, size))
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, s))
    live = cuda.stat("live_streams")
    cuda.ok(cuda.cuStreamDestroy(s))  # drained, then destroyed anyway
    assert_one_misuse(cuda, "stream not idle at destroy")
    assert cuda.stat("live_streams") == live - 1
    cuda.ok(cuda.cuCtxSynchronize())  # covers the destroyed stream's work too
    assert cuda.read(dst, size) == pattern(3, size)

    s = cuda.stream()
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, s))
    cuda.ok(cuda.cuMemFree(dst))  # waits for the copy, then frees
    assert_one_misuse(cuda, "freed while in use by a queued copy")
    dst = cuda.device_alloc(size)
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, s))
    cuda.ok(cuda.cuMemFreeHost(src))
    assert_one_misuse(cuda, "freed while in use by a queued copy")
    cuda.ok(cuda.cuStreamSynchronize(s))
    cuda.ok(cuda.cuMemFree(dst))
    cuda.ok(cuda.cuStreamDestroy(s))
    assert cuda.misuses() == []


def test_detects_copy_on_a_blocking_stream(cuda: FakeCuda):
    size = 4096
    s = cuda.stream(flags=0)
    src, dst = cuda.host_alloc(size), cuda.device_alloc(size)
    cuda.fill(src, pattern(4, size))
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, s))  # still runs
    assert_one_misuse(cuda, "copy on a blocking stream")
    cuda.ok(cuda.cuStreamSynchronize(s))
    assert cuda.read(dst, size) == pattern(4, size)
    cuda.ok(cuda.cuMemcpyHtoDAsync(dst, src, size, 0))
    assert_one_misuse(cuda, "copy on a blocking stream")
    cuda.ok(cuda.cuStreamSynchronize(0))
    cuda.ok(cuda.cuStreamDestroy(s))


def test_detects_wrong_device_and_out_of_range_copies(cuda: FakeCuda):
    size = 4096
    s0 = cuda.stream()
    src, out, dst0 = cuda.host_alloc(size, HOSTALLOC_PORTABLE), cuda.host_alloc(size), cuda.device_alloc(size)
    cuda.ok(cuda.cuCtxSetCurrent(cuda.contexts[1]))
    dst1 = cuda.device_alloc(size)
    cuda.ok(cuda.cuCtxSetCurrent(cuda.contexts[0]))
    assert cuda.cuMemcpyHtoDAsync(dst1, src, size, s0) == INVALID_VALUE
    assert_one_misuse(cuda, "is memory of device 1")
    assert cuda.cuMemcpyHtoDAsync(dst0 + 8, src, size - 4, s0) == INVALID_VALUE
    assert_one_misuse(cuda, "copy range past the end of an allocation")
    assert cuda.cuMemcpyDtoHAsync(out, dst0 + 8, size - 4, s0) == INVALID_VALUE
    assert_one_misuse(cuda, "copy range past the end of an allocation")
    assert cuda.cuMemcpyHtoDAsync(src, src, size, s0) == INVALID_VALUE
    assert_one_misuse(cuda, "not device memory")
    cuda.ok(cuda.cuMemFree(dst1))


# ---- Abort, exit, unload, ThreadSanitizer


def run_python(code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    prelude = f"import sys; sys.path[:0] = [{str(HERE)!r}, {str(TESTS_DIR)!r}]\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code, *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )


def test_abort_on_misuse(lib_path: pathlib.Path):
    code = (
        "import ctypes\n"
        "from test_standin_driver import FakeCuda\n"
        "fake = FakeCuda(sys.argv[1])\n"
        "fake.ok(fake.cuInit(0))\n"
        "fake.cuStreamCreate(ctypes.byref(ctypes.c_void_p()), 1)\n"  # no current context
        "print('still running')\n"
    )
    result = run_python(code, str(lib_path), env={"FAKE_CUDA_ABORT_ON_MISUSE": "1"})
    assert result.returncode == -signal.SIGABRT, result
    assert "fake_libcuda MISUSE: no current context" in result.stderr
    assert "still running" not in result.stdout


def test_unload_and_exit_with_busy_streams(lib_path: pathlib.Path, tmp_path: pathlib.Path):
    copy = tmp_path / "libfake_cuda_unloaded.so"
    shutil.copyfile(lib_path, copy)
    # libstdc++ is loaded first, as it is in any process running fastload: otherwise it gets
    # loaded with the fake and binds to template code in it, which makes glibc refuse to unload.
    code = (
        "import _ctypes, ctypes\n"
        "ctypes.CDLL('libstdc++.so.6')\n"
        "from test_standin_driver import FakeCuda\n"
        "def leave_work_queued(fake):\n"
        "    fake.ok(fake.cuInit(0))\n"
        "    fake.ok(fake.cuCtxSetCurrent(fake.retain(0)))\n"
        "    src, dst = fake.host_alloc(1 << 20), fake.device_alloc(2 << 20)\n"
        "    fake.ok(fake.cuMemcpyHtoDAsync(dst, src, 1 << 20, fake.stream()))\n"
        "    busy = fake.stream()\n"
        "    fake.configure('paused', 1)\n"
        "    for _ in range(3):\n"
        "        fake.ok(fake.cuMemcpyHtoDAsync(dst + (1 << 20), src, 1 << 20, busy))\n"
        "unloaded = FakeCuda(sys.argv[2])\n"
        "leave_work_queued(unloaded)\n"
        "_ctypes.dlclose(unloaded.lib._handle)\n"
        "assert sys.argv[2] not in open('/proc/self/maps').read(), 'library still mapped'\n"
        "leave_work_queued(FakeCuda(sys.argv[1]))\n"
        "print('exiting', flush=True)\n"
    )
    t0 = time.monotonic()
    result = run_python(code, str(lib_path), str(copy))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "exiting"
    assert "MISUSE" not in result.stderr
    assert time.monotonic() - t0 < 30


def test_fork_child_of_a_user_gets_errors_and_exits_cleanly(lib_path: pathlib.Path):
    code = (
        "import ctypes, os\n"
        "from test_standin_driver import FakeCuda\n"
        "fake = FakeCuda(sys.argv[1])\n"
        "fake.ok(fake.cuInit(0))\n"
        "fake.ok(fake.cuCtxSetCurrent(fake.retain(0)))\n"
        "fake.stream()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print('child', fake.cuDeviceGetCount(ctypes.byref(ctypes.c_int())), flush=True)\n"
        "    sys.exit(0)\n"  # runs the library's exit path in the child
        "_, status = os.waitpid(pid, 0)\n"
        "print('parent', os.waitstatus_to_exitcode(status), fake.cuDeviceGetCount(ctypes.byref(ctypes.c_int())))\n"
    )
    result = run_python(code, str(lib_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == [f"child {NOT_INITIALIZED}", "parent 0 0"], result.stdout


def compile_smoke(out_dir: pathlib.Path, sanitize: str | None) -> pathlib.Path:
    exe = out_dir / ("smoke" if sanitize is None else f"smoke_{sanitize}")
    flags = ["-std=c++17", "-O1", "-g", "-pthread"] + ([f"-fsanitize={sanitize}"] if sanitize else [])
    result = subprocess.run(["g++", *flags, str(SMOKE_SOURCE), "-o", str(exe), "-ldl"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return exe


def run_smoke(exe: pathlib.Path, library: pathlib.Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(exe), str(library)], capture_output=True, text=True, timeout=120,
        env={**os.environ, "FAKE_CUDA_MAX_DELAY_US": "50", **(env or {})},
    )


def test_smoke_program_runs_clean_and_exits_with_work_queued(lib_path: pathlib.Path, tmp_path: pathlib.Path):
    result = run_smoke(compile_smoke(tmp_path, None), lib_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "smoke: ok" in result.stdout


@pytest.mark.slow
def test_smoke_program_under_thread_sanitizer(tmp_path: pathlib.Path):
    probe = subprocess.run(
        ["g++", "-fsanitize=thread", "-x", "c++", "-", "-o", str(tmp_path / "probe")],
        input="int main() { return 0; }\n", capture_output=True, text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"g++ cannot link with -fsanitize=thread: {probe.stderr.strip()[:200]}")
    library = build(tmp_path, sanitize="thread")
    result = run_smoke(
        compile_smoke(tmp_path, "thread"), library,
        env={"TSAN_OPTIONS": "halt_on_error=1 exitcode=66 second_deadlock_stack=1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    assert "ThreadSanitizer" not in result.stderr, result.stderr[-6000:]
    assert "smoke: ok" in result.stdout
