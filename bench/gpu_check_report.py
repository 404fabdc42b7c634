"""What bench/gpu_check.sh reports: the machine it ran on (`environment`) and the one-screen
summary at the end (`summary`), read from the files the steps left in the output directory
(steps.tsv, environment.json, nvidia_smi.csv, junit_cuda.xml, junit_suite.xml, bench_gpu.json).

    python bench/gpu_check_report.py environment --out DIR
    python bench/gpu_check_report.py summary --out DIR [--mode check|full-bench]

The summary is printed and written to DIR/summary.txt. It reads only what the steps wrote, so a
step that failed, timed out or wrote nothing shows as such, never as a figure.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

RACE_TEST = "test_no_consumer_side_race_over_10000_batches"
BATCH_MIB = (1, 8, 64)


# ----------------------------------------------------------------------------- environment
def environment(out: Path) -> int:
    info: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                            "usable_cpus": len(os.sched_getaffinity(0))}
    smi = out / "nvidia_smi.csv"
    if smi.exists() and smi.read_text().strip():
        name, driver, memory = (smi.read_text().splitlines()[0].split(",") + ["", "", ""])[:3]
        info.update(smi_name=name.strip(), driver=driver.strip(), smi_memory=memory.strip())
    try:
        import numpy
        import torch

        info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, numpy=numpy.__version__,
                    cuda_available=torch.cuda.is_available())
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.update(device=p.name, device_count=torch.cuda.device_count(),
                        device_memory_gib=round(p.total_memory / 2**30, 1),
                        capability=f"sm_{p.major}{p.minor}")
        info["standin"] = bool(getattr(torch.cuda, "is_fastload_standin", False))
    except Exception as e:  # noqa: BLE001 - the environment step reports, it does not stop here
        info["error"] = f"{type(e).__name__}: {e}"
    for key, value in info.items():
        print(f"{key}: {value}")
    (out / "environment.json").write_text(json.dumps(info, indent=2) + "\n")
    return 0 if "error" not in info and info.get("cuda_available") else 1


# ----------------------------------------------------------------------------- inputs
def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_steps(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        name, status, rc, seconds, bound = (line.split("\t") + [""] * 5)[:5]
        rows.append({"name": name, "status": status, "rc": rc, "seconds": seconds, "bound": bound})
    return rows


class Junit:
    """Outcome of each test case in a pytest --junitxml file: passed, failed, error, skipped."""

    def __init__(self, path: Path):
        self.cases: dict[str, tuple[str, float, str]] = {}
        self.readable = False
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError):
            return
        self.readable = True
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            outcome, message = "passed", ""
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = "failed" if child.tag == "failure" else child.tag
                    message = (child.get("message") or "").splitlines()[0][:150] if child.get("message") else ""
                    break
            self.cases[name] = (outcome, float(case.get("time") or 0.0), message)

    def counts(self) -> str:
        if not self.readable:
            return "no report"
        n: dict[str, int] = {}
        for outcome, _, _ in self.cases.values():
            n[outcome] = n.get(outcome, 0) + 1
        order = ("passed", "failed", "error", "skipped")
        return ", ".join(f"{n[k]} {k}" for k in order if n.get(k)) or "no tests"

    def failures(self) -> list[str]:
        return [f"{name} ({outcome}): {message}" for name, (outcome, _, message) in self.cases.items()
                if outcome in ("failed", "error")]


# ----------------------------------------------------------------------------- benchmark figures
def _median(entry: dict[str, Any] | None, key: str) -> float | None:
    if not entry:
        return None
    return (entry.get("median") or {}).get(key)


def _spread(entry: dict[str, Any] | None, key: str) -> str:
    vals = [r[key] for r in (entry or {}).get("rounds", []) if key in r]
    return f" ({min(vals):.3g}-{max(vals):.3g})" if len(vals) > 1 else ""


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}x"


def _fmt(x: float | None, unit: str = "") -> str:
    return "n/a" if x is None else f"{x:.3g}{unit}"


def _copy_streams(cell: dict[str, Any]) -> Any:
    """A fastload cell's copy streams (bench_gpu.py's JSON named them "streams" before)."""
    return cell.get("copy_streams", cell.get("streams"))


def bench_rows(bench: dict[str, Any]) -> list[list[str]]:
    rows = []
    copy = {(c["kind"], c["mib"]): c for c in bench.get("copy", [])}
    fast: dict[int, list[dict[str, Any]]] = {}
    for f in bench.get("fastload", []):
        fast.setdefault(f["batch_mib"], []).append(f)
    for mib in BATCH_MIB:
        pinned = copy.get(("pinned", mib))
        best = max(fast.get(mib, []), key=lambda f: _median(f, "gbps") or -1.0, default=None)
        got = _median(best, "gbps")
        label = f"delivered, {mib} MiB batches" + (f" (best: copy_streams={_copy_streams(best)})" if best and got else "")
        rows.append([label, _fmt(got, " GB/s") + _spread(best, "gbps"),
                     f"pinned copy {mib} MiB: {_fmt(_median(pinned, 'gbps'), ' GB/s')}",
                     _ratio(got, _median(pinned, "gbps"))])
    steps = {(s["config"], s["feeder"]): s for s in bench.get("steps", [])}
    compute = bench.get("compute", {})
    for config, what in (("compute-bound", "synthetic step"), ("loader-bound", "loader-bound step")):
        ms = compute.get(config, {}).get("ms")
        label = f"{what}{'' if ms is None else f' ({ms:.2f} ms GPU work)'}: fastload steps/s"
        f = _median(steps.get((config, "fastload")), "steps_per_s")
        ideal = _median(steps.get((config, "ideal")), "steps_per_s")
        dls = [(_median(steps.get((config, k)), "steps_per_s"), k) for k in ("dataloader", "dataloader+prefetch")]
        best_dl = max(((v, k) for v, k in dls if v is not None), default=(None, "dataloader"))
        rows.append([label, _fmt(f) + _spread(steps.get((config, "fastload")), "steps_per_s"),
                     f"data already on the GPU: {_fmt(ideal)}", _ratio(f, ideal)])
        rows.append([f"{what}: fastload vs pinned DataLoader", _fmt(f),
                     f"{best_dl[1]} (the better loop): {_fmt(best_dl[0])}", _ratio(f, best_dl[0])])
    return rows


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows]


# ----------------------------------------------------------------------------- summary
def summary(out: Path, mode: str) -> int:
    steps = read_steps(out / "steps.tsv")
    env = read_json(out / "environment.json") or {}
    bench = read_json(out / "bench_gpu.json")
    cuda_tests, suite = Junit(out / "junit_cuda.xml"), Junit(out / "junit_suite.xml")
    passed = bool(steps) and all(s["status"] in ("ok", "skipped") for s in steps)
    lines = [f"fastload GPU check ({mode}): {'PASSED' if passed else 'FAILED'}"]
    device = env.get("device") or env.get("smi_name") or "no CUDA device seen"
    lines.append(f"device: {device}"
                 + (f", {env['device_memory_gib']} GiB, {env.get('capability')}" if "device_memory_gib" in env else "")
                 + f"; driver {env.get('driver', 'unknown (no nvidia-smi)')}")
    lines.append(f"torch {env.get('torch', '?')} (CUDA {env.get('torch_cuda', '?')}), python {env.get('python', '?')}, "
                 f"{env.get('usable_cpus', '?')} CPUs")
    if env.get("standin"):
        lines.append("STAND-IN RUN: tests/fake_cuda's driver and a torch.cuda stub, no GPU; no figure below "
                     "measures a GPU")
    rows = []
    for s in steps:
        tests = {"GPU tests": cuda_tests, "rest of the suite": suite}.get(s["name"])
        detail = tests.counts() if tests else ""
        if s["name"] == "benchmark":
            detail = "quick" if mode == "check" else "full"
            if bench is None:
                detail += "; no bench_gpu.json"
            elif not bench.get("measured"):
                detail += f"; nothing measured: {bench.get('reason', '?')}"
        time_s = "-" if s["status"] == "skipped" else f"{s['seconds']} s of {s['bound']} s"
        rows.append([s["name"], s["status"], time_s, detail])
    lines += [""] + table(["step", "status", "time", "result"], rows)

    race = [(name.split("[")[-1].rstrip("]"), outcome, t) for name, (outcome, t, _) in cuda_tests.cases.items()
            if RACE_TEST in name]
    if mode == "check":
        lines.append("")
        lines.append("10,000-batch race check: " + ("; ".join(f"{m} {o} ({t:.1f} s)" for m, o, t in race)
                                                  if race else "no result (the GPU tests did not report it)"))
    if bench and bench.get("measured"):
        lines += [""] + table(["benchmark (medians; min-max over rounds)", "fastload", "against", "ratio"],
                              bench_rows(bench))
        bars = bench.get("bars", {})
        lines.append("bars (issue 6): delivered >= 0.9x ceiling (8 and 64 MiB, worst of copy_streams): "
                     f"{_ratio(bars.get('delivered_worst'), 1.0)}; 5 ms step >= 0.97x ideal: "
                     f"{_ratio(bars.get('compute_bound_vs_ideal'), 1.0)}; loader-bound >= 3x DataLoader: "
                     f"{_ratio(bars.get('loader_bound_vs_dataloader'), 1.0)}")
    failures = cuda_tests.failures() + suite.failures()
    if failures:
        lines += ["", f"failing tests ({len(failures)}; details in gpu_check.log):"]
        lines += [f"  {f}" for f in failures[:8]] + ([f"  ... and {len(failures) - 8} more"] if len(failures) > 8 else [])
    text = "\n".join(lines) + "\n"
    print(text, end="")
    (out / "summary.txt").write_text(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("environment", "summary"))
    ap.add_argument("--out", type=Path, required=True, help="bench/gpu_check.sh's output directory")
    ap.add_argument("--mode", default="check", choices=("check", "full-bench"))
    args = ap.parse_args(argv)
    return environment(args.out) if args.what == "environment" else summary(args.out, args.mode)


if __name__ == "__main__":
    sys.exit(main())
