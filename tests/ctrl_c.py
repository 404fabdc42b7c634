"""Ctrl-C at random moments, for the interrupt tests and bench/bench_ctrl_c_losses.py: a SIGALRM
timer that raises KeyboardInterrupt in the main thread while armed, and the step loop
(`batch = next(it)`) that catches it and goes on with the same iterator."""
from __future__ import annotations

import gc
import signal


class Interrupts:
    """Raises KeyboardInterrupt from SIGALRM every `interval` s while `armed`, as a user pressing
    Ctrl-C at random moments would; `count` says how many were raised. Disarmed, a signal is
    ignored: the caller's own bookkeeping outside its try blocks is never interrupted."""

    def __init__(self, interval: float):
        self.interval, self.armed, self.count = interval, False, 0

    def __enter__(self):
        # A handler runs wherever the interpreter is: with gc on, inside a gc callback that another
        # library registered (hypothesis does), where a raise is "ignored" and fails the test.
        self.gc_was_enabled = gc.isenabled()
        gc.disable()

        def handler(signum, frame):
            if self.armed:  # disarmed before raising: a second signal cannot hit the except block
                self.armed = False
                self.count += 1
                raise KeyboardInterrupt
        self.old = signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, self.interval, self.interval)
        return self

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, self.old)
        if self.gc_was_enabled:
            gc.enable()
        release_leaked_logging_locks()


def release_leaked_logging_locks() -> None:
    """Before Python 3.13, logging takes its module lock (and a handler's) with one call and enters
    the try whose finally releases it only after that call returns: a KeyboardInterrupt raised in
    between leaves the lock held by this thread. This thread does not notice (the locks are
    reentrant), but every other thread that logs then waits forever (the in-process test servers
    did). Measured: after the interrupt tests the main thread held logging's module lock. Release
    what the interrupts leaked; nothing else holds these locks while the test body runs."""
    import logging

    locks = [getattr(logging, "_lock", None)]
    locks += [h.lock for h in (ref() for ref in list(logging._handlerList)) if h is not None]
    for lock in locks:
        while lock is not None and lock._is_owned():
            lock.release()


def step_loop(it, irq: Interrupts, steps: int) -> list:
    """The batches of at most `steps` steps of `batch = next(it)`, each step interruptible; an
    interrupted step is not retried (the next step asks for the next batch)."""
    got: list = []
    for _ in range(steps):
        try:
            irq.armed = True
            batch = next(it, None)  # the end is None, not StopIteration: no except block to interrupt
            if batch is None:
                irq.armed = False
                break
            got.append(batch)  # a signal during append is handled after it: the loop keeps every batch
            irq.armed = False
        except KeyboardInterrupt:
            pass  # the handler disarmed itself
    return got


def index_ids(batches: list) -> list[int]:
    """Every sample id of the batches' "index" parts, in order."""
    return [int(i) for b in batches for i in b["index"]]
