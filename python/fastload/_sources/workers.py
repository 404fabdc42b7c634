"""Worker processes for workers="processes": N spawned processes (spawn: fork from a threaded
process can deadlock), persistent across epochs, each paired with one collation thread of the
loader. The dataset is pickled once. Batches live in shared memory the main process owns
(fastload._C.SharedMemory); see worker_process.py for the worker's side."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import struct
import time
from typing import Any

from .. import _C

# How long close() waits for workers to leave after their socket closed, then for a terminate.
_JOIN_S = 2.0
# How long a worker may take to start (spawn, import torch and fastload, unpickle the dataset).
_START_S = 120.0


def _read(conn: Any, n: int) -> bytes:
    s = socket.socket(fileno=conn.fileno())
    try:
        data = s.recv(n, socket.MSG_WAITALL)
    finally:
        s.detach()
    if len(data) < n:
        raise RuntimeError("a fastload worker process closed its socket while starting")
    return data


class WorkerProcesses:
    def __init__(self, source: Any, count: int):
        self._source = source
        self._count = count
        self._owner = os.getpid()  # a forked child must leave the parent's workers alone
        self.memory = _C.SharedMemory()
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        try:
            self._payload = pickle.dumps(source.worker_payload(), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - any pickling failure says the same thing
            raise TypeError(f"workers='processes' sends the dataset to each worker process by pickling it once, and "
                            f"{type(source.dataset).__name__} cannot be pickled ({type(e).__name__}: {e}); make it "
                            "picklable (open files and connections lazily in __getitem__), or use workers='threads'") from e

    @property
    def started(self) -> bool:
        return bool(self._procs)

    def start(self) -> tuple[list[int], list[int]]:
        """Starts the workers (once); returns the main process's socket descriptors and their pids."""
        if not self._procs:
            from .worker_process import main

            ctx = multiprocessing.get_context("spawn")
            for k in range(self._count):
                here, there = ctx.Pipe(duplex=True)
                proc = ctx.Process(target=main, args=(there, k), daemon=True, name=f"fastload-worker-{k}")
                proc.start()
                there.close()
                self._procs.append(proc)
                self._conns.append(here)
            # The dataset goes over the socket, not as a Process argument: the worker can then
            # free the pickled bytes (an argument stays referenced for the worker's lifetime).
            for conn in self._conns:
                try:
                    conn.send_bytes(self._payload)
                except OSError:
                    pass  # the worker is gone already: _wait_ready says how it ended
            for k, (proc, conn) in enumerate(zip(self._procs, self._conns)):
                self._wait_ready(k, proc, conn)
            self._payload = b""  # workers persist for the loader's lifetime: no second start needs it
        return [c.fileno() for c in self._conns], [p.pid for p in self._procs]

    def _wait_ready(self, k: int, proc: Any, conn: Any) -> None:
        """Waits until worker k has imported everything and unpickled the dataset; raises what went
        wrong if it could not."""
        deadline = time.monotonic() + _START_S

        def exited() -> RuntimeError:
            proc.join(_JOIN_S)  # its socket closes a moment before it can be reaped
            self.stop()
            how = f"exited with code {proc.exitcode}" if proc.exitcode is not None else "closed its socket"
            return RuntimeError(f"fastload worker process {k} (pid {proc.pid}) {how} while starting; see its output "
                                "above (a script that starts workers needs an `if __name__ == '__main__':` guard)")

        while not conn.poll(0.1):
            if not proc.is_alive():
                raise exited()
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"fastload worker process {k} did not start within {_START_S:.0f} s")
        try:
            head = _read(conn, 16)
            length, status, message_bytes = struct.unpack("=QII", head)
            rest = _read(conn, length - 16)
        except (RuntimeError, OSError):
            raise exited() from None
        if status == 2:
            return
        message, payload = rest[:message_bytes].decode(errors="replace"), rest[message_bytes:]
        self.stop()
        cause, tb = pickle.loads(payload) if payload else (None, "")
        error = RuntimeError(f"fastload worker process {k}: {message}\n\nThe worker's traceback:\n{tb}")
        raise error from cause

    def shutdown_sockets(self) -> None:
        """Wakes every collation thread waiting on a worker (they see end of file) without closing
        a descriptor a thread may still be polling."""
        if os.getpid() != self._owner:
            return
        for c in self._conns:
            try:
                _shutdown(c.fileno())
            except OSError:
                pass

    def stop(self) -> None:
        """Ends the workers and reaps them: their sockets close (each worker leaves its loop), then
        terminate, then kill, so no process is left behind."""
        if os.getpid() != self._owner:
            return
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass
        for p in self._procs:
            p.join(_JOIN_S)
            if p.is_alive():
                p.terminate()
                p.join(_JOIN_S)
            if p.is_alive():
                p.kill()
                p.join(_JOIN_S)
        self._procs, self._conns = [], []

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]


def _shutdown(fd: int) -> None:
    s = socket.socket(fileno=fd)
    try:
        s.shutdown(socket.SHUT_RDWR)
    finally:
        s.detach()  # the descriptor stays the Connection's
