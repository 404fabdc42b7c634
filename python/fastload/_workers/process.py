"""The worker process of workers="processes" (spawned, persistent across epochs). It receives the
dataset once, then batch requests from its collation thread in the main process (the wire format
is in csrc/bindings/process_workers.h): the sample ids, and where each part of the batch lives in
the main process's shared memory. It calls the dataset and writes every sample straight into those
parts with the same native writer the thread workers use, and replies with only what is not an
array (lists of strings and the like, pickled) or the error."""
from __future__ import annotations

import ctypes
import mmap
import os
import pickle
import signal
import socket
import struct
import traceback
from typing import Any

_HEAD = struct.Struct("=IIQqqqII")  # kind, parts, seed, epoch, step, count, new, freed
_REPLY = struct.Struct("=QII")      # length, status, message bytes
_MAX_FDS = 4096


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        data = sock.recv(n - got)
        if not data:
            return None
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def _reply(sock: socket.socket, status: int, message: bytes, payload: bytes) -> None:
    sock.sendall(_REPLY.pack(_REPLY.size + len(message) + len(payload), status, len(message)) + message + payload)


def _failure(e: BaseException) -> tuple[bytes, bytes]:
    cause = e.__cause__ if e.__cause__ is not None else e
    text = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
    try:
        pickled = pickle.dumps((cause, text))
        pickle.loads(pickled)  # an exception that pickles but cannot be rebuilt is sent as text only
    except Exception:  # noqa: BLE001
        pickled = pickle.dumps((None, text))
    return str(e).encode(errors="replace"), pickled


# ---------------------------------------------------------------------------- global generators
_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: nearby inputs give unrelated outputs."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of torch's and Python's global generators for one sample (63 bits)."""
    return _mix64(_mix64(_mix64(seed & _MASK) ^ (epoch & _MASK)) ^ (index & _MASK)) >> 1


class _Seeded:
    """The dataset as a worker process calls it: torch's global generator and Python's `random`
    are seeded from (seed, epoch, sample index) before each __getitem__ (before each
    __getitems__, from its first index), so augmentations that draw from them (torchvision's
    random transforms) are the same for any number of workers and after a resume. A worker
    process runs one sample at a time, so the global generators are its sample's alone."""

    def __init__(self, dataset: Any, getitems: Any):
        import random

        import torch

        self._dataset, self._getitems = dataset, getitems
        self._torch_seed, self._random_seed = torch.default_generator.manual_seed, random.seed
        from .. import _C

        self._context = _C._sample_context

    def _seed(self, index: int) -> None:
        context = self._context()
        if context is None:
            return
        seed, epoch, _ = context
        s = sample_seed(seed, epoch, index)
        self._torch_seed(s)
        self._random_seed(s)

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, index: int) -> Any:
        self._seed(index)
        return self._dataset[index]

    def getitems(self, indices: list) -> Any:
        self._seed(indices[0] if len(indices) else 0)
        return self._getitems(indices)


def _seeding(dataset: Any, getitems: Any) -> tuple[Any, Any]:
    seeded = _Seeded(dataset, getitems)
    return seeded, (seeded.getitems if getitems is not None else None)


def main(conn: Any, index: int) -> None:
    # Ctrl-C goes to the whole process group: it is the training loop's to handle; this worker
    # ends when the main process closes its socket (or dies).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Started with SIGINT blocked (see WorkerProcesses._start_all): ignored now, so unblock it, and
    # what the dataset starts itself gets the usual mask.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    import torch

    torch.set_num_threads(1)  # as DataLoader workers: N workers must not each start N compute threads
    from .. import _C

    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        payload = conn.recv_bytes()  # the dataset, pickled once by the main process
    except (EOFError, OSError):
        return  # the loader closed before this worker started
    conn.close()
    try:
        dataset, use_getitems, collate, worker_init, leaves, tree, size = pickle.loads(payload)
        del payload  # a large dataset would otherwise be held twice, pickled and unpickled
        getitems = getattr(dataset, "__getitems__", None) if use_getitems else None
        dataset, getitems = _seeding(dataset, getitems)
        native = _C._python_source_native(_C.PythonSource(dataset, getitems, collate, worker_init, leaves, tree, size))
    except BaseException as e:  # noqa: BLE001 - reported to start(), which raises it
        message, pickled = _failure(e)
        _reply(sock, 1, b"the dataset could not be set up in the worker: " + message, pickled)
        return
    _reply(sock, 2, b"", b"")  # ready: the loader's timeout counts from here, not from interpreter start
    maps: dict[int, tuple[mmap.mmap, int]] = {}
    while True:
        try:
            head, fds, _, _ = socket.recv_fds(sock, 8, _MAX_FDS, socket.MSG_WAITALL)
        except OSError:
            return
        if len(head) < 8:
            for fd in fds:
                os.close(fd)
            return  # the main process closed the socket: done
        (length,) = struct.unpack("=Q", head)
        body = _recv_exact(sock, length - 8)
        if body is None:
            return
        kind, parts, seed, epoch, step, count, new, freed = _HEAD.unpack_from(body, 0)
        at = _HEAD.size
        import numpy as np

        ids = np.frombuffer(body, np.int64, count, at)
        at += 8 * count
        where = np.frombuffer(body, np.uint64, 2 * parts, at).reshape(parts, 2)
        at += 16 * parts
        fresh = np.frombuffer(body, np.uint64, 2 * new, at).reshape(new, 2)
        at += 16 * new
        gone = np.frombuffer(body, np.uint64, freed, at)
        for (segment, size_bytes), fd in zip(fresh.tolist(), fds):
            mm = mmap.mmap(fd, size_bytes)
            os.close(fd)
            maps[segment] = (mm, ctypes.addressof(ctypes.c_char.from_buffer(mm)))
        for segment in gone.tolist():
            maps.pop(segment, None)  # unmapped once nothing refers to it (the exported buffer dies with it)
        try:
            addresses = [maps[segment][1] + offset for segment, offset in where.tolist()]
            extras = native.fill_rows(ids, addresses, seed, epoch, step, index)
            status, message = 0, b""
            out = b"" if extras is None else pickle.dumps(extras, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the training loop
            status = 1
            message, out = _failure(e)
        try:
            _reply(sock, status, message, out)
        except OSError:
            return  # the loader closed while this batch was built (close(), break, exit): nobody waits for it
