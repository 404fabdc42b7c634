"""What reading the consumer stream costs per next(): torch.cuda.current_stream(d).cuda_stream (what
fastload did) against torch._C._cuda_getCurrentRawStream(d) (what it does where torch has it).
Needs a CUDA build of torch and a GPU; prints the median per-call time of each over interleaved
rounds, with the spread, and their ratio.

    python bench/bench_current_stream.py [--rounds 15] [--calls 20000]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def per_call(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a GPU and a CUDA build of torch")
    device = torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        raise SystemExit(f"torch {torch.__version__} has no torch._C._cuda_getCurrentRawStream")
    assert raw(device) == torch.cuda.current_stream(device).cuda_stream
    wrapper = lambda: torch.cuda.current_stream(device).cuda_stream  # noqa: E731
    direct = lambda: raw(device)  # noqa: E731
    times: dict[str, list[float]] = {"current_stream": [], "raw": []}
    for _ in range(args.rounds):
        times["current_stream"].append(per_call(wrapper, args.calls))
        times["raw"].append(per_call(direct, args.calls))
    ratios = [a / b for a, b in zip(times["current_stream"], times["raw"])]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device)}")
    print(f"{'call':<40} {'median µs':>10} {'min':>8} {'max':>8}")
    for name, label in (("current_stream", "torch.cuda.current_stream(d).cuda_stream"),
                        ("raw", "torch._C._cuda_getCurrentRawStream(d)")):
        t = times[name]
        print(f"{label:<40} {statistics.median(t) * 1e6:>10.3f} {min(t) * 1e6:>8.3f} {max(t) * 1e6:>8.3f}")
    print(f"ratio current_stream / raw: median {statistics.median(ratios):.1f}x "
          f"(min {min(ratios):.1f}, max {max(ratios):.1f})")


if __name__ == "__main__":
    main()
