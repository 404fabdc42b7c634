"""A slow statement of fl.Pack in Python, for comparison with the native packer: the same packing
rule (csrc/core/packing_plan.h), the same dealing of an epoch's packed rows to ranks (the
sampling contract over rows, tests/reference.py's rule with empty rows as padding), and each
batch built token by token from the documents."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

import fastload as fl


def document_order(n: int, seed: int, epoch: int, shuffle: bool = True, order: str = "random",
                   shard_rows: Sequence[int] = ()) -> np.ndarray:
    """The epoch's order of documents: the loader's own permutation (tested in test_sampler.py)."""
    s = fl._C.Sampler(n, 1, 1, 0, seed, shuffle, order, "pad", False, fl._C.BLOCK_SIZE, "samples", list(shard_rows),
                      fl._C.WINDOW_SHARDS)
    return s.permutation(epoch, 0, n)


def pack_window(docs: Sequence[int], lengths: Sequence[int], length: int, split: str = "truncate",
                max_segments: int | None = None) -> list[list[tuple[int, int, int]]]:
    """Rows of (document, start, count) of one window, by the rule of packing_plan.h."""
    bound = min(length, max_segments) if max_segments else length
    rows: list[list[tuple[int, int, int, int]]] = []  # (pos, start, count, doc) per segment
    room: list[int] = []
    items = []  # (count, pos, start)
    for pos, (doc, n) in enumerate(zip(docs, lengths)):
        if n == 0:
            continue
        rest, first = n, 0
        if n > length:
            if split == "error":
                raise ValueError(f"document {doc} is longer than {length}")
            if split == "truncate":
                rest = length
            else:
                for k in range(n // length):
                    rows.append([(pos, k * length, length, doc)])
                    room.append(0)
                rest = n - (n // length) * length
                first = n - rest
        if rest:
            items.append((rest, pos, first))
    stacks: dict[int, list[int]] = {}  # room -> rows that reached it, in order
    for count, pos, start in sorted(items, key=lambda it: (-it[0], it[1], it[2])):
        fits = sorted(r for r, s in stacks.items() if s and r >= count)
        if fits:
            row = stacks[fits[0]].pop()
        else:
            row = len(rows)
            rows.append([])
            room.append(length)
        rows[row].append((pos, start, count, docs[pos]))
        room[row] -= count
        if room[row] > 0 and len(rows[row]) < bound:
            stacks.setdefault(room[row], []).append(row)
    laid = [sorted(r) for r in rows]
    laid.sort(key=lambda r: r[0][:2])
    return [[(doc, start, count) for _, start, count, doc in r] for r in laid]


def epoch_rows(lengths: np.ndarray, length: int, window: int, order: np.ndarray, split: str = "truncate",
               max_segments: int | None = None) -> list[list[tuple[int, int, int]]]:
    """The epoch's packed rows: each window of `order` packed alone, windows in order."""
    rows = []
    for w in range(0, len(order), window):
        docs = [int(d) for d in order[w:w + window]]
        rows += pack_window(docs, [int(lengths[d]) for d in docs], length, split, max_segments)
    return rows


def deal(num_rows: int, batch_size: int, world_size: int, rank: int, even: str, drop_last: bool,
         start: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """This rank's batches as (row positions, valid): positions >= num_rows are empty rows."""
    remaining = max(num_rows - start, 0)
    rounded = remaining // world_size * world_size if even == "drop" else -(-remaining // world_size) * world_size
    positions = np.arange(start, start + rounded)
    g = batch_size * world_size
    full = rounded // g
    out = []
    for s in range(full):
        lo = s * g + rank * batch_size
        p = positions[lo:lo + batch_size]
        out.append((p, p < num_rows))
    tail = rounded - full * g
    if tail and not drop_last:
        share = tail // world_size
        lo = full * g + rank * share
        p = positions[lo:lo + share]
        out.append((p, p < num_rows))
    return out


def build_batch(rows: Sequence[list[tuple[int, int, int]] | None], columns: dict[str, Sequence[np.ndarray]],
                length: int, pads: dict[str, Any], max_segments: int | None = None) -> dict[str, Any]:
    """A batch of `rows` (None: an empty row) from each column's documents, token by token."""
    out: dict[str, Any] = {}
    b = len(rows)
    for name, docs in columns.items():
        sample = np.asarray(docs[0])
        arr = np.full((b, length) + sample.shape[1:], pads.get(name, 0), dtype=sample.dtype)
        for i, row in enumerate(rows):
            at = 0
            for doc, start, count in row or []:
                arr[i, at:at + count] = np.asarray(docs[doc])[start:start + count]
                at += count
        out[name] = arr
    seg = np.zeros((b, length), dtype=np.int32)
    pos = np.zeros((b, length), dtype=np.int64)
    bound = min(length, max_segments) if max_segments else length
    documents = np.full((b, bound), -1, dtype=np.int64)
    cu = [0]
    longest = 0
    for i, row in enumerate(rows):
        at = 0
        for k, (doc, _, count) in enumerate(row or []):
            seg[i, at:at + count] = k + 1
            pos[i, at:at + count] = np.arange(count)
            documents[i, k] = doc
            at += count
            cu.append(cu[-1] + count)
            longest = max(longest, count)
        if at < length:
            pos[i, at:] = np.arange(length - at)
            cu.append(cu[-1] + length - at)
            longest = max(longest, length - at)
    out.update(segment_ids=seg, position_ids=pos, cu_seqlens=np.array(cu, dtype=np.int32), max_seqlen=longest,
               documents=documents)
    return out


def reference_epoch(lengths: np.ndarray, columns: dict[str, Sequence[np.ndarray]], *, length: int, window: int,
                    batch_size: int, seed: int = 0, epoch: int = 0, shuffle: bool = True, world_size: int = 1,
                    rank: int = 0, even: str = "pad", drop_last: bool = False, start: int = 0,
                    split: str = "truncate", max_segments: int | None = None, pads: dict[str, Any] | None = None,
                    order: str = "random", shard_rows: Sequence[int] = ()) -> list[dict[str, Any]]:
    """This rank's batches of one epoch, each as build_batch makes it, plus "index" (row positions)
    and "valid"."""
    perm = document_order(len(lengths), seed, epoch, shuffle, order, shard_rows)
    rows = epoch_rows(lengths, length, window, perm, split, max_segments)
    batches = []
    for positions, valid in deal(len(rows), batch_size, world_size, rank, even, drop_last, start):
        batch = build_batch([rows[p] if p < len(rows) else None for p in positions], columns, length, pads or {},
                            max_segments)
        batch["index"], batch["valid"] = positions, valid
        batches.append(batch)
    return batches
