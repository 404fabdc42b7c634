"""Worker processes for workers="processes": N spawned processes (spawn: fork from a threaded
process can deadlock), persistent across epochs, each paired with one collation thread of the
loader. The dataset is pickled once. Batches live in shared memory the main process owns
(fastload._C.SharedMemory); see process.py for the worker's side."""
from __future__ import annotations

import multiprocessing
import multiprocessing.process
import os
import pickle
import signal
import socket
import struct
import time
import weakref
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
        self._payload = _pickled(source)
        self._ready = False
        _all.add(self)

    @property
    def started(self) -> bool:
        """Whether the workers are up and ready (a start that was interrupted left none)."""
        return self._ready

    def start(self) -> tuple[list[int], list[int]]:
        """Starts the workers (once), all at the same time; returns the main process's socket
        descriptors and their pids. If anything interrupts it (Ctrl-C included), no worker is left
        and the next call starts them afresh."""
        if not self._ready:
            try:
                self._start_all()
            except BaseException:
                self.stop(at_once=True)
                raise
            self._ready = True
            self._payload = b""  # workers persist for the loader's lifetime: no second start needs it
        return [c.fileno() for c in self._conns], [p.pid for p in self._procs]

    def restart(self) -> tuple[list[int], list[int]]:
        """Ends every worker (a stuck one included) and starts fresh ones (the dataset is pickled
        again). The collation threads must not be using the sockets."""
        self.stop(at_once=True)
        self._payload = _pickled(self._source)
        return self.start()

    def _start_all(self) -> None:
        from .process import main

        ctx = multiprocessing.get_context("spawn")
        # Ctrl-C reaches the whole process group: a worker that is still starting (before it can
        # ignore SIGINT itself) would print a KeyboardInterrupt traceback. It inherits a blocked
        # SIGINT across the exec instead, and ignores it; here the signal stays pending until
        # the workers are spawned, then interrupts as usual.
        # multiprocessing starts its resource tracker at the first spawn, and unblocks SIGINT in
        # this thread after doing so: start it first.
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for k in range(self._count):
                here, there = ctx.Pipe(duplex=True)
                proc = ctx.Process(target=main, args=(there, k), daemon=True, name=f"fastload-worker-{k}")
                try:
                    proc.start()
                finally:
                    there.close()
                self._procs.append(proc)
                self._conns.append(here)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        # The dataset goes over the socket, not as a Process argument: the worker can then
        # free the pickled bytes (an argument stays referenced for the worker's lifetime).
        for conn in self._conns:
            try:
                conn.send_bytes(self._payload)
            except OSError:
                pass  # the worker is gone already: _wait_ready says how it ended
        for k, (proc, conn) in enumerate(zip(self._procs, self._conns)):
            self._wait_ready(k, proc, conn)

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

    def stop(self, at_once: bool = False) -> None:
        """Ends the workers and reaps them: their sockets close (each worker leaves its loop), then
        terminate, then kill, so no process is left behind. at_once: terminate without waiting
        (workers interrupted while starting, or stuck in the dataset)."""
        if os.getpid() != self._owner:
            return
        self._ready = False
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass
        for p in self._procs:
            if p.pid is None:
                continue  # never started
            if at_once:
                p.terminate()
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


def _pickled(source: Any) -> bytes:
    """The worker payload, pickled; a TypeError naming the part that cannot be pickled."""
    payload = source.worker_payload()
    try:
        return pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - any pickling failure says the same thing
        error = e
    dataset, _, collate, worker_init = payload[:4]
    for name, fn in (("collate_fn", collate), ("worker_init_fn", worker_init)):
        if fn is None:
            continue
        try:
            pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001
            raise TypeError(f"workers='processes' sends {name} to each worker process by pickling it, and {name}="
                            f"{fn!r} cannot be pickled ({type(e).__name__}: {e}); define it with `def` at module "
                            "level (a lambda or a nested function cannot be pickled), or use workers='threads'") from e
    raise TypeError(f"workers='processes' sends the dataset to each worker process by pickling it once, and "
                    f"{type(dataset).__name__} cannot be pickled ({type(error).__name__}: {error}); make it "
                    "picklable (open files and connections lazily in __getitem__), or use workers='threads'") from error


# Every WorkerProcesses of this process. A child made by os.fork() inherits multiprocessing's
# record of the parent's worker processes, and multiprocessing's exit handler would terminate
# them when the child exits (they are daemons): the child forgets them instead.
_all: "weakref.WeakSet[WorkerProcesses]" = weakref.WeakSet()


def _forget_parents_workers() -> None:
    children = getattr(multiprocessing.process, "_children", None)
    for workers in list(_all):
        for p in workers._procs:
            if children is not None:
                children.discard(p)


os.register_at_fork(after_in_child=_forget_parents_workers)


def _shutdown(fd: int) -> None:
    s = socket.socket(fileno=fd)
    try:
        s.shutdown(socket.SHUT_RDWR)
    finally:
        s.detach()  # the descriptor stays the Connection's
