"""A brute-force statement of the shard-aware orders (order="block" over shards, partition="shards"),
for comparison with the native sampler: whole index arrays, Python loops, an independent numpy
copy of the keyed Feistel permutation. Mirrors csrc/core/shard_order.h and sampler.cpp."""
from __future__ import annotations

import heapq

import numpy as np

M64 = (1 << 64) - 1
SHARD_ORDER_SALT, WINDOW_SALT, RELABEL_SALT, RANK_SALT = 0x5BA4D0001, 0x5BA4D0002, 0x5BA4D0003, 0x5BA4D0004


def mix64(x: int) -> int:
    x &= M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    x ^= x >> 31
    return x


def _mix32(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def permutation(n: int, seed: int, stream: int) -> np.ndarray:
    """P[0..n): six Feistel rounds on ceil(log2 n) bits, cycle-walked into [0, n)."""
    bits = 0
    while (1 << bits) < n:
        bits += 1
    rb = bits // 2
    rmask, lmask = np.uint32((1 << rb) - 1), np.uint32((1 << (bits - rb)) - 1)
    k = mix64(seed ^ 0x6A09E667F3BCC909) ^ mix64(stream + 0x3C6EF372FE94F82B)
    keys = []
    for _ in range(6):
        k = mix64(k + 0x9E3779B97F4A7C15)
        keys.append(np.uint32(k >> 32))

    def forward(x: np.ndarray) -> np.ndarray:
        left = (x >> np.uint64(rb)).astype(np.uint32)
        right = x.astype(np.uint32) & rmask
        for r in range(0, 6, 2):
            left = left ^ (_mix32(right ^ keys[r]) & lmask)
            right = right ^ (_mix32(left ^ keys[r + 1]) & rmask)
        return (left.astype(np.uint64) << np.uint64(rb)) | right.astype(np.uint64)

    x = forward(np.arange(n, dtype=np.uint64))
    out = x >= n
    while out.any():
        x[out] = forward(x[out])
        out = x >= n
    return x.astype(np.int64)


def segments(shard_rows: list[int]) -> list[tuple[int, int]]:
    """(first id, rows) of each non-empty shard."""
    starts = np.concatenate([[0], np.cumsum(shard_rows)])
    return [(int(starts[i]), int(r)) for i, r in enumerate(shard_rows) if r > 0]


def permuted(segs: list, seed: int, key: int) -> list:
    p = permutation(len(segs), seed, key)
    return [segs[j] for j in p]


def windows(segs: list, window_shards: int, window_rows: int) -> list[list]:
    out, cur = [], []
    for s in segs:
        cur.append(s)
        if len(cur) >= window_shards and sum(r for _, r in cur) >= window_rows:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def concat(segs: list) -> np.ndarray:
    return np.concatenate([np.arange(b, b + r) for b, r in segs]) if segs else np.zeros(0, np.int64)


def segment_order(segs: list, mode: str, seed: int, key: int, window_shards: int, window_rows: int) -> np.ndarray:
    c = concat(segs)
    if mode == "identity":
        return c
    if mode == "random":
        return c[permutation(len(c), seed, key)]
    parts = []
    for w, group in enumerate(windows(segs, window_shards, window_rows)):
        cw = concat(group)
        parts.append(cw[permutation(len(cw), seed, mix64(key ^ mix64(w + 1)))])
    return np.concatenate(parts)


def block_order(shard_rows: list[int], seed: int, epoch: int, window_shards: int, window_rows: int) -> np.ndarray:
    """order="block", shuffle=True, partition="samples" on a sharded source: the epoch's P."""
    e = mix64(epoch)
    segs = permuted(segments(shard_rows), seed, e ^ SHARD_ORDER_SALT)
    return segment_order(segs, "windows", seed, e ^ WINDOW_SALT, window_shards, window_rows)


def block_windows(shard_rows: list[int], seed: int, epoch: int, window_shards: int, window_rows: int) -> list[list]:
    segs = permuted(segments(shard_rows), seed, mix64(epoch) ^ SHARD_ORDER_SALT)
    return windows(segs, window_shards, window_rows)


def assign(shard_rows: list[int], world: int, shuffle: bool, seed: int, epoch: int) -> list[list]:
    """partition="shards": each rank's shards, in the epoch's order."""
    e = mix64(epoch)
    segs = segments(shard_rows)
    ordered = permuted(segs, seed, e ^ SHARD_ORDER_SALT) if shuffle else segs
    relabel = permutation(world, seed, e ^ RELABEL_SALT) if shuffle else np.arange(world)
    by_size = sorted(range(len(ordered)), key=lambda j: -ordered[j][1])  # sorted() is stable
    heap = [(0, b) for b in range(world)]
    owner = [0] * len(ordered)
    for j in by_size:
        load, b = heapq.heappop(heap)
        owner[j] = int(relabel[b])
        heapq.heappush(heap, (load + ordered[j][1], b))
    return [[ordered[j] for j in range(len(ordered)) if owner[j] == r] for r in range(world)]


def rank_order(shard_rows: list[int], world: int, rank: int, shuffle: bool, order: str, seed: int, epoch: int,
               window_shards: int, window_rows: int) -> np.ndarray:
    mine = assign(shard_rows, world, shuffle, seed, epoch)[rank]
    mode = "identity" if not shuffle else ("random" if order == "random" else "windows")
    key = mix64(mix64(epoch) ^ RANK_SALT ^ mix64(rank + 1))
    return segment_order(mine, mode, seed, key, window_shards, window_rows)


def shard_batches(shard_rows: list[int], world: int, rank: int, batch_size: int, shuffle: bool, order: str,
                  seed: int, epoch: int, even: str, drop_last: bool, window_shards: int, window_rows: int,
                  start: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """partition="shards": this rank's batches as (ids, valid). Every rank's sequence is L long
    (pad/mask: the largest rank's rows, wrapping around its own order; drop: the smallest's),
    cut into batches of batch_size from local position start / world."""
    rows = [sum(r for _, r in m) for m in assign(shard_rows, world, shuffle, seed, epoch)]
    length = min(rows) if even == "drop" else max(rows)
    own = rank_order(shard_rows, world, rank, shuffle, order, seed, epoch, window_shards, window_rows)
    local = np.arange(start // world, length)
    ids, valid = own[local % len(own)], local < len(own)
    out = []
    for lo in range(0, len(local), batch_size):
        if lo + batch_size > len(local) and drop_last:
            break
        out.append((ids[lo:lo + batch_size], valid[lo:lo + batch_size]))
    return out
