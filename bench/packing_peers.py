"""The peers bench/bench_packing.py measures beside fl.Pack, each run in a process of its own by a
Python that has them (they do not install beside fastload's test extras; see the driver):
  python bench/packing_peers.py efficiency <data dir> <out.json> <n>  Grain's FirstFit and BestFit
      packing (num_packing_bins 8 and 128) over the first n documents, and torchtune's PackedDataset
      checked against bench_packing.next_fit_rows on the first documents
  python bench/packing_peers.py <peer> <data dir> <seconds> <out.json>   tokens/s of one peer:
      grain_bestfit  Grain's BestFitPackIterDataset (128 bins) over the shuffled HF dataset, read
                     by 2 threads, batches of 8 rows of LENGTH
      hf_flatten     HF transformers' DataCollatorWithFlattening over a torch DataLoader (2
                     workers), batches of ~8 x LENGTH tokens (it pads nothing, fixes no shape)
Documents are cut to LENGTH tokens first, as fl.Pack's split="truncate" does."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

LENGTH = 4096
BATCH = 8
BINS = (8, 128)


def _lengths(root: Path) -> np.ndarray:
    return np.minimum(np.load(root / "lengths.npy"), LENGTH)


def grain_efficiency(lengths: np.ndarray, bins: int, best: bool) -> dict:
    """Grain's packing over documents of these lengths (in this order): its rows and tokens."""
    import grain.python as gp

    source = gp.MapDataset.source(lengths).map(lambda n: {"input_ids": np.ones(int(n), np.int32)})
    kind = gp.experimental.BestFitPackIterDataset if best else gp.experimental.FirstFitPackIterDataset
    # No read-ahead threads: the rows are all that is counted here (grain's prefetch checks every
    # buffered future per element: most of the time of a pass at its default depth).
    packed = kind(source.to_iter_dataset(gp.ReadOptions(num_threads=0, prefetch_buffer_size=0)),
                  length_struct={"input_ids": LENGTH}, num_packing_bins=bins, shuffle_bins=False)
    rows = tokens = 0
    t = time.perf_counter()
    for row in packed:
        rows += 1
        tokens += int((row["input_ids_segment_ids"] > 0).sum())
    return {"rows": rows, "tokens": tokens, "efficiency": tokens / (rows * LENGTH), "seconds": time.perf_counter() - t}


def torchtune_rows(lengths: np.ndarray) -> dict:
    """torchtune's PackedDataset (0.6.1) over documents of these lengths: the packs it makes."""
    from torchtune.datasets import PackedDataset

    ds = [{"tokens": [1] * int(n), "labels": [1] * int(n)} for n in lengths]
    t = time.perf_counter()
    packed = PackedDataset(ds, max_seq_len=LENGTH, split_across_pack=False)
    return {"rows": len(packed), "tokens": int(lengths.sum()), "seconds": time.perf_counter() - t}


def efficiency(root: Path, out: Path, subset: int) -> None:
    order = np.load(root / "order.npy")  # the same shuffled order of documents as the others
    lengths = _lengths(root)[order][:subset]
    result = {}
    for bins in BINS:
        for best in (False, True):
            result[f"grain_{'bestfit' if best else 'firstfit'}_{bins}"] = grain_efficiency(lengths, bins, best)
    first = lengths[:20_000]
    result["torchtune_first_20k"] = torchtune_rows(first)
    out.write_text(json.dumps(result))


def grain_batches(root: Path):
    import datasets
    import grain.python as gp

    # HF's default (Python) format: a row as lists reads ~6x faster than with_format("numpy") here.
    ds = datasets.load_from_disk(str(root / "hf"))
    source = gp.MapDataset.source(ds).shuffle(seed=0).map(
        lambda x: {"input_ids": np.asarray(x["input_ids"][:LENGTH], np.int32)})
    packed = gp.experimental.BestFitPackIterDataset(
        # 2 read threads; a short read-ahead (grain checks every buffered future per element, so
        # its default depth of 500 costs more than the reads: 16 measured fastest here).
        source.to_iter_dataset(gp.ReadOptions(num_threads=2, prefetch_buffer_size=16)),
        length_struct={"input_ids": LENGTH}, num_packing_bins=128, shuffle_bins=True)
    for batch in packed.batch(BATCH):
        yield int((batch["input_ids_segment_ids"] > 0).sum())


def hf_batches(root: Path):
    import datasets
    import torch
    from transformers import DataCollatorWithFlattening

    ds = datasets.load_from_disk(str(root / "hf"))
    per_batch = max(1, int(BATCH * LENGTH / float(_lengths(root).mean())))  # ~8 rows' worth of tokens
    collate = DataCollatorWithFlattening(return_tensors="pt")

    def cut(samples):
        return collate([{"input_ids": s["input_ids"][:LENGTH]} for s in samples])

    loader = torch.utils.data.DataLoader(ds, batch_size=per_batch, shuffle=True, num_workers=2, collate_fn=cut,
                                         persistent_workers=True, prefetch_factor=4)
    while True:
        for batch in loader:
            yield int(batch["input_ids"].numel())


def throughput(peer: str, root: Path, seconds: float, out: Path) -> None:
    batches = {"grain_bestfit": grain_batches, "hf_flatten": hf_batches}[peer](root)
    t0 = time.perf_counter()
    next(batches)
    first = time.perf_counter() - t0
    tokens = n = 0
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        tokens += next(batches)
        n += 1
    dt = time.perf_counter() - t
    out.write_text(json.dumps({"tokens_per_s": tokens / dt, "batches_per_s": n / dt, "first_batch_s": first}))


if __name__ == "__main__":
    if sys.argv[1] == "efficiency":
        efficiency(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
    else:
        throughput(sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4]))
