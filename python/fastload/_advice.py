"""The stall hint's words. The native runtime measures (runtime/run_stats.h, StallFigures: how long
the loop waited, how busy each stage was); the text that names a knob is written here, once, and
logged by `stall_warning` when the bindings call it (the hint is given once per loader)."""
from __future__ import annotations

import logging

# A stage busy more than this share of the time is the bottleneck; when none is, the data came
# but came unevenly, which a deeper window absorbs.
BUSY_SHARE = 0.7
# The loop's own time between batches under this share of the wall time: it does nothing but
# take batches (a benchmark), so it waits for any loader, and which stage looks busiest varies
# from run to run.
IDLE_LOOP_SHARE = 0.05


def step_bound(releasing: float) -> bool:
    """The copies waited most of the time for the consumer's GPU work to release batch memory:
    the loop waits in next() for its own GPU work, not for the loader."""
    return releasing > BUSY_SHARE


def stall_advice(collating: float, copying: float, num_threads: int, copy_streams: int, prefetch: int,
                 user_share: float = -1.0, processes: bool = False, releasing: float = 0.0,
                 fetch_share: float = 0.0) -> str:
    """The knob to turn, from each stage's busy share since the epoch began (collating: the
    collation threads; copying: the busiest GPU's copy streams, 0 on the CPU path), the share of
    collation spent in a Python dataset's own code (user_share, negative for other sources) or
    waiting for object storage (fetch_share), and the share copies waited for the GPU (releasing)."""
    if step_bound(releasing):
        return (f"the copies of the next batches waited {int(releasing * 100)}% of the time for your training step's "
                "GPU work to release batch memory: the training step is the bottleneck, not data loading (no loader "
                "setting helps; a deeper prefetch would only hold more device memory)")
    if collating > BUSY_SHARE and user_share > 0.5:
        also = "" if processes else ", or use workers='processes' if that code is pure Python (threads share one GIL)"
        return (f"the dataset's own code (__getitem__) is the bottleneck ({int(user_share * 100)}% of the workers' "
                f"time): raise num_workers (now {num_threads}){also}")
    if collating > BUSY_SHARE and fetch_share > 0.5:
        return (f"the collation threads waited for object storage {int(fetch_share * 100)}% of their time: downloads "
                "are the bottleneck, not collation (a cache_limit that holds the dataset makes later epochs read the "
                "local cache; more requests in flight: storage_options={'max_concurrency': ...})")
    if collating > BUSY_SHARE:
        return (f"collation is the bottleneck ({num_threads} threads): raise num_threads, or store fewer bytes per "
                "sample (float16, uint16)")
    if copying > BUSY_SHARE:
        return (f"the host-to-device copy is the bottleneck: raise copy_streams (now {copy_streams}), or store fewer "
                "bytes per sample")
    return f"batches arrive irregularly: raise prefetch (now {prefetch})"


def stall_message(*, share: float, collating: float, copying: float, releasing: float, user_share: float,
                  fetch_share: float, processes: bool, num_threads: int, copy_streams: int, prefetch: int,
                  window: int) -> str:
    """The whole hint from the runtime's figures (see StallFigures)."""
    knob = stall_advice(collating, copying, num_threads, copy_streams, prefetch, user_share, processes, releasing,
                        fetch_share)
    waited = f"{int(share * 100)}% of the time over the last {window} batches"
    if step_bound(releasing):
        return f"fastload: next() waited {waited}, for your GPU rather than for data: {knob}. See loader.stats()."
    message = f"fastload: the training loop waited for data {waited}; {knob}."
    if 1.0 - share < IDLE_LOOP_SHARE:
        message += (f" Note: the loop itself took under {int(IDLE_LOOP_SHARE * 100)}% of the time between batches "
                    "(it does nothing but take batches, as a benchmark does): such a loop waits for any loader, and "
                    "which stage looks busiest then varies from run to run; judge this hint with your training step "
                    "in the loop.")
    return message + " See loader.stats()."


def stall_warning(**figures: float) -> None:
    """Called by the bindings (fastload._C hooks) when the hint is due: logs it once."""
    logging.getLogger("fastload").warning(stall_message(**figures))
