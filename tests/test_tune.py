"""`python -m fastload tune` and fl.tune(): the grid is measured, the table and the Loader
arguments are printed, JSON and plots are written, and bad arguments are refused by name."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload as fl
from fastload.tools import _tune_cli, tune as _tune

# Tiny grids and short measurements: these tests check behaviour, not speed.
FAST = ["--seconds", "0.05", "--repeats", "2", "--threads", "1,2", "--prefetch", "2,4"]


@pytest.fixture(scope="module")
def npy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tune") / "rows.npy"
    np.save(path, np.random.default_rng(0).integers(0, 255, (4096, 32), dtype=np.uint8))
    return path


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tune") / "train.bin"
    np.random.default_rng(0).integers(0, 50_000, 20_000, dtype=np.uint16).tofile(path)
    return path


def run_tune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fastload", "tune", *args], capture_output=True, text=True,
                          timeout=120)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command in this process (no torch import per call): (exit status, stdout, stderr)."""
    try:
        code = _tune.main(list(args))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_on_a_npy_prints_the_table_and_the_arguments_and_writes_json(npy: Path, tmp_path: Path) -> None:
    out_json = tmp_path / "tune.json"
    done = run_tune(str(npy), "--batch-size", "64", *FAST, "--json", str(out_json))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["threads", "prefetch", "samples/s"])
    rows = [line.split() for line in lines[header + 1:header + 5]]
    assert [(r[0], r[1]) for r in rows] == [("1", "2"), ("1", "4"), ("2", "2"), ("2", "4")]
    assert "recommended:" in done.stdout and "fastest:" in done.stdout
    assert "fl.Loader(source, batch_size=64, num_threads=" in done.stdout
    assert "round 2/2 done" in done.stderr  # progress, one line per round when not a terminal
    assert "waited for data" not in done.stderr  # tune keeps the stall hint quiet

    data = json.loads(out_json.read_text())
    assert data["args"]["batch_size"] == 64
    assert {(r["num_threads"], r["prefetch"]) for r in data["rows"]} == {(1, 2), (1, 4), (2, 2), (2, 4)}
    assert all(len(r["rounds"]) == 2 and r["samples_per_s"] > 0 and 0 <= r["wait_share"] <= 1 for r in data["rows"])
    rec = data["recommended"]
    assert (data["args"]["num_threads"], data["args"]["prefetch"]) == (rec["num_threads"], rec["prefetch"])
    assert data["loader_call"].startswith("fl.Loader(source, batch_size=64")


def test_cli_on_a_token_bin_with_a_window(tokens: Path) -> None:
    done = run_tune(str(tokens), "--window", "33:32", "--dtype", "uint16", "--batch-size", "16", "--seconds", "0.05",
                    "--repeats", "1", "--threads", "1", "--prefetch", "2,8", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "624 samples of 66 B" in done.stdout  # (20000 - 33) // 32 + 1 windows of 33 uint16
    assert "fl.Loader(source, batch_size=16, num_threads=1, prefetch=" in done.stdout
    assert done.stderr == ""


def test_plot_writes_a_png_or_says_matplotlib_is_missing(npy: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "tune.png"
    code, out, err = cli(capsys, str(npy), "--batch-size", "64", *FAST, "--no-progress", "--plot", str(png))
    if _tune.matplotlib_missing():
        assert code == 2 and "--plot" in err and "pip install matplotlib" in err
        assert not png.exists()
    else:
        assert code == 0, err
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"wrote {png}" in out


@pytest.mark.parametrize("args, named", [
    (["--threads", "1,x"], "argument --threads"),
    (["--threads", "0"], "argument --threads"),
    (["--prefetch", ""], "argument --prefetch"),
    (["--window", "0"], "argument --window"),
    (["--window", "8:4:2"], "argument --window"),
    (["--seconds", "-1"], "argument --seconds"),
    (["--repeats", "0"], "argument --repeats"),
    (["--dtype", "float32"], "argument --dtype"),
    (["--copy-streams", "2"], "--copy-streams"),  # no GPU on the CPU path
    (["--streams", "2"], "--copy-streams"),     # its old name, still accepted
    (["--device", "tpu"], "--device"),
])
def test_bad_arguments_are_named(npy: Path, capsys: pytest.CaptureFixture[str], args: list[str], named: str) -> None:
    if args[0] in ("--copy-streams", "--streams") and fl.Loader(fl.Dataset({"x": np.zeros(4)}), 1).device.type == "cuda":
        pytest.skip("streams apply on a GPU machine")
    code, _, err = cli(capsys, str(npy), "--batch-size", "8", *args)
    assert code == 2 and named in err, err


def test_bad_sources_are_explained(npy: Path, tokens: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "--batch-size", "8")
    assert code == 2 and "SOURCE" in err
    code, _, err = cli(capsys, str(npy))
    assert code == 2 and "--batch-size" in err
    code, _, err = cli(capsys, str(tmp_path / "missing.npy"), "--batch-size", "8")
    assert code == 2 and "no such file" in err
    code, _, err = cli(capsys, str(tokens), "--batch-size", "8")
    assert code == 2 and "--window" in err
    code, _, err = cli(capsys, str(npy), "--batch-size", "8", "--dtype", "uint16")
    assert code == 2 and "--dtype" in err and ".npy" in err
    code, _, err = cli(capsys, str(npy), "--batch-size", "8", "--window", "4")
    assert code == 2 and "1-D" in err
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\0" * 101)
    code, _, err = cli(capsys, str(odd), "--batch-size", "8", "--window", "4")
    assert code == 2 and "uint16" in err


def test_a_dataset_directory_is_tuned_through_dataset_open(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(1)
    fl.write_dataset(tmp_path / "ds", {"x": rng.standard_normal((3000, 4)).astype(np.float32),
                                       "y": rng.integers(0, 10, 3000)}, rows_per_shard=700)
    code, out, err = cli(capsys, str(tmp_path / "ds"), "--batch-size", "32", *FAST, "--no-progress")
    assert code == 0, err
    assert "3,000 samples of 24 B" in out  # 4 float32 + one int64 per row, over 5 shards
    assert "fl.Loader(source, batch_size=32, num_threads=" in out
    code, _, err = cli(capsys, str(tmp_path / "ds"), "--batch-size", "32", "--window", "4")
    assert code == 2 and "--window applies to a token file" in err
    result = fl.tune(tmp_path / "ds", batch_size=32, threads=[1], prefetch=[2], seconds=0.05, repeats=1,
                     progress=False)
    assert result.args["batch_size"] == 32 and result.args["num_threads"] == 1


def test_tune_returns_arguments_that_construct_a_loader() -> None:
    x = np.random.default_rng(0).standard_normal((2000, 8)).astype(np.float32)
    source = fl.Dataset({"x": x})
    result = fl.tune(source, batch_size=32, threads=[1, 2], prefetch=[2, 4], seconds=0.05, repeats=2, progress=False)
    assert isinstance(result, fl.TuneResult)
    assert len(result.rows) == 4 and all(len(r.rounds) == 2 for r in result.rows)
    assert result.recommended in result.rows and result.fastest in result.rows
    assert result.args == {"batch_size": 32, "num_threads": result.recommended.num_threads,
                           "prefetch": result.recommended.prefetch}
    with fl.Loader(source, **result.args) as loader:
        assert next(iter(loader))["x"].shape == (32, 8)
    text = str(result)
    assert "threads" in text and result.loader_call() in text
    # A numpy array and windows over it work as sources too.
    tokens = np.arange(5000, dtype=np.uint16)
    windows = fl.tune(tokens, batch_size=8, window=(65, 64), threads=1, prefetch=2, seconds=0.05, repeats=1,
                      progress=False)
    assert windows.row_bytes == 130 and windows.rows[0].samples_per_s > 0


def test_tune_checks_its_arguments() -> None:
    x = np.zeros((100, 4), np.float32)
    with pytest.raises(ValueError, match="batch_size"):
        fl.tune(x, batch_size=0)
    with pytest.raises(ValueError, match="threads"):
        fl.tune(x, batch_size=4, threads=[0])
    with pytest.raises(ValueError, match="repeats"):
        fl.tune(x, batch_size=4, repeats=0)
    with pytest.raises(ValueError, match="seconds"):
        fl.tune(x, batch_size=4, seconds=float("nan"))
    with pytest.raises(TypeError, match="source"):
        fl.tune({1, 2, 3}, batch_size=4)
    import tune_datasets

    # Objects are read as fl.Loader reads them (fastload._sources.protocol.as_source), refusals included.
    with pytest.raises(TypeError, match=r"Stream: source is a torch IterableDataset \(Stream\)"):
        fl.tune(tune_datasets.Stream(), batch_size=4)
    with pytest.raises(TypeError, match="got the class Points itself"):
        fl.tune(tune_datasets.Points, batch_size=4)
    with pytest.raises(ValueError, match="Empty: dataset is empty"):
        fl.tune(tune_datasets.Empty(), batch_size=4)
    with pytest.raises(ValueError, match="window and dtype apply to a path or an array, not to a Dataset or Windows"):
        fl.tune(fl.Dataset({"x": x}), batch_size=4, window=4)


def test_recommendation_prefers_fewer_threads_then_smaller_prefetch_within_3_percent() -> None:
    def point(t: int, p: int, rate: float) -> fl.TunePoint:
        return fl.TunePoint(t, p, 1, rate, 0.5, (rate,))

    rows = [point(1, 2, 90.0), point(1, 8, 97.5), point(1, 16, 97.2), point(2, 4, 100.0), point(2, 2, 99.0)]
    fastest, recommended = _tune.recommend(rows)
    assert fastest.knobs == (2, 4, 1)
    assert recommended.knobs == (1, 8, 1)  # 97.5 and 97.2 are both within 3%; prefetch 8 < 16
    fastest, recommended = _tune.recommend([point(1, 2, 90.0), point(2, 2, 100.0)])
    assert recommended.knobs == fastest.knobs == (2, 2, 1)


def test_a_gpu_result_reports_and_plots_its_streams(tmp_path: Path) -> None:
    # No GPU here to measure on, so a result as tune builds it on one: the streams axis must show
    # in the table, the summary, the arguments and the plot, and fewer streams win within 3%.
    def point(t: int, p: int, s: int, rate: float) -> fl.TunePoint:
        return fl.TunePoint(t, p, s, rate, 0.1, (rate, rate * 1.01))

    rows = [point(1, 2, 1, 100.0), point(1, 2, 2, 150.0), point(2, 2, 1, 200.0), point(2, 2, 2, 205.0),
            point(2, 4, 1, 216.0), point(2, 4, 2, 221.0)]
    fastest, recommended = _tune.recommend(rows)
    assert fastest.knobs == (2, 4, 2)
    assert recommended.knobs == (2, 4, 1)  # 216 is within 3% of 221 with one stream fewer
    result = fl.TuneResult(args=_tune.loader_args(recommended, 8, "cuda:0"), recommended=recommended, fastest=fastest, rows=rows, source="x.npy", batch_size=8,
                           row_bytes=1024, device="cuda:0", seconds=1.0, repeats=2, elapsed_s=12.0)
    table = result.table().splitlines()
    assert table[0].split()[:3] == ["threads", "prefetch", "copy_streams"]
    assert table[6].split()[:3] == ["2", "4", "2"] and table[6].endswith("<- fastest")
    assert table[5].split()[:3] == ["2", "4", "1"] and table[5].endswith("<- recommended")
    assert "recommended: num_threads=2 prefetch=4 copy_streams=1" in result.summary()
    assert _tune.loader_args(recommended, 8, "cpu") == {"batch_size": 8, "num_threads": 2, "prefetch": 4}
    assert "fl.Loader(source, batch_size=8, num_threads=2, prefetch=4, device='cuda:0', copy_streams=1)" in str(result)
    if not _tune.matplotlib_missing():
        result.plot(tmp_path / "gpu.png")  # one panel per stream count
        assert (tmp_path / "gpu.png").read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------------------- bad input, before measuring
def _bad_npys(root: Path) -> dict[str, tuple[Path, str]]:
    root.mkdir(exist_ok=True)
    made = {}

    def save(name: str, array: np.ndarray, says: str, pickle: bool = False) -> None:
        np.save(root / name, array, allow_pickle=pickle)
        made[name] = (root / name, says)

    (root / "empty.npy").write_bytes(b"")
    made["empty.npy"] = (root / "empty.npy", "not a readable .npy array")
    (root / "garbage.npy").write_bytes(b"this is not numpy at all")
    made["garbage.npy"] = (root / "garbage.npy", "not a readable .npy array")
    save("strings.npy", np.array(["a", "bb", "ccc"]), "holds <U3 values")
    save("bytes.npy", np.array([b"a", b"b"]), "holds |S1 values")
    save("dates.npy", np.array(["2020-01-01"], dtype="datetime64[D]"), "holds datetime64[D] values")
    save("objects.npy", np.array([1, "a"], dtype=object), "not a readable .npy array", pickle=True)
    save("no_rows.npy", np.zeros((0, 4), np.float32), "no samples")
    save("scalar.npy", np.float32(3), "no samples")
    return made


BAD_NPYS = ["empty.npy", "garbage.npy", "strings.npy", "bytes.npy", "dates.npy", "objects.npy", "no_rows.npy",
            "scalar.npy"]


def one_error_line(err: str) -> str:
    """argparse's usage then exactly one `error:` line; never a traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("python -m fastload tune: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    return errors[0]


@pytest.mark.parametrize("name", BAD_NPYS)
def test_a_bad_npy_is_a_usage_error_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     name: str) -> None:
    path, says = _bad_npys(tmp_path / "bad")[name]
    code, out, err = cli(capsys, str(path), "--batch-size", "8", *FAST)
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert name in line and says in line, line
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        fl.tune(path, batch_size=8, seconds=0.01, repeats=1, progress=False)


def test_bad_npys_exit_2_with_one_line_from_the_command_line(tmp_path: Path) -> None:
    made = _bad_npys(tmp_path / "bad")
    for name in ("empty.npy", "strings.npy"):
        proc = run_tune(str(made[name][0]), "--batch-size", "8", *FAST)
        assert proc.returncode == 2 and proc.stdout == "", proc
        assert made[name][1] in one_error_line(proc.stderr)


@pytest.mark.parametrize("option,where,says", [
    ("--json", "missing/out.json", "the directory"),
    ("--json", "", "is a directory"),
    ("--plot", "missing/out.png", "the directory"),
    ("--plot", "out.xyz", "cannot write .xyz files"),
])
def test_outputs_are_checked_before_measuring(npy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              option: str, where: str, says: str) -> None:
    if option == "--plot" and _tune.matplotlib_missing():
        says = "matplotlib"
    import time
    began = time.perf_counter()
    # A run that measured first would take 100 s (--seconds 50 x 2 configurations): it must stop at once.
    code, out, err = cli(capsys, str(npy), "--batch-size", "8", "--seconds", "50", "--repeats", "1", "--threads", "1",
                         "--prefetch", "2,4", option, str(tmp_path / where))
    assert time.perf_counter() - began < 20
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert option in line and says in line, line


def test_json_and_plot_naming_one_file_are_refused(npy: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    if _tune.matplotlib_missing():
        pytest.skip("needs matplotlib")
    code, _, err = cli(capsys, str(npy), "--batch-size", "8", *FAST, "--json", str(tmp_path / "a.png"),
                       "--plot", str(tmp_path / "a.png"))
    assert code == 2 and "same file" in one_error_line(err)


@pytest.mark.parametrize("case", ["not-a-dataset", "dtype-on-a-directory", "device-file", "fifo"])
def test_other_bad_sources_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    import os
    extra: list[str] = []
    if case == "not-a-dataset":
        source, says = tmp_path, "manifest.json is missing"
    elif case == "dtype-on-a-directory":
        fl.write_dataset(tmp_path / "d", {"x": np.arange(100)})
        source, says, extra = tmp_path / "d", "--dtype applies to a raw token file", ["--dtype", "uint16"]
    elif case == "device-file":
        source, says, extra = Path("/dev/null"), "neither a regular file nor a directory", ["--window", "4"]
    else:
        os.mkfifo(tmp_path / "f.npy")
        source, says = tmp_path / "f.npy", "neither a regular file nor a directory"
    code, _, err = cli(capsys, str(source), "--batch-size", "8", *FAST, *extra)
    assert code == 2 and says in one_error_line(err), err


# ---------------------------------------------------------------------------- Python datasets (module:Class)
TESTS = Path(__file__).resolve().parent


@pytest.mark.slow
def test_cli_tunes_a_dataset_class_over_workers_threads_and_processes(tmp_path: Path) -> None:
    out_json = tmp_path / "tune.json"
    done = subprocess.run([sys.executable, "-m", "fastload", "tune", "tune_datasets:Points", "--dataset-args",
                           '{"n": 400, "width": 4}', "--batch-size", "32", "--threads", "1,2", "--prefetch", "2",
                           "--seconds", "0.05", "--repeats", "1", "--no-progress", "--json", str(out_json)],
                          capture_output=True, text=True, timeout=300, cwd=TESTS)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("fastload tune: tune_datasets:Points, 400 samples of 24 B, batch 32")  # 4 float32 + int64
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["num_workers", "workers", "prefetch"])
    rows = [line.split()[:3] for line in lines[header + 1:header + 5]]
    assert rows == [["1", "threads", "2"], ["2", "threads", "2"], ["1", "processes", "2"], ["2", "processes", "2"]]
    data = json.loads(out_json.read_text())
    assert {(r["num_threads"], r["workers"]) for r in data["rows"]} == {(1, "threads"), (2, "threads"),
                                                                       (1, "processes"), (2, "processes")}
    rec = data["recommended"]
    assert data["args"] == {"batch_size": 32, "num_workers": rec["num_threads"], "workers": rec["workers"],
                            "prefetch": 2}
    assert f"fl.Loader(source, batch_size=32, num_workers={rec['num_threads']}, workers={rec['workers']!r}" in done.stdout
    assert "waited for data" not in done.stderr and "Traceback" not in done.stderr


def test_fl_tune_takes_a_dataset_object_or_a_module_class_and_its_args_build_a_loader() -> None:
    import tune_datasets

    dataset = tune_datasets.Points(300)
    result = fl.tune(dataset, batch_size=16, threads=[1, 2], prefetch=[2, 4], workers="threads", seconds=0.05,
                     repeats=1, progress=False)
    assert {(r.num_threads, r.prefetch, r.workers) for r in result.rows} == {(1, 2, "threads"), (1, 4, "threads"),
                                                                            (2, 2, "threads"), (2, 4, "threads")}
    assert result.args == {"batch_size": 16, "num_workers": result.recommended.num_threads, "workers": "threads",
                           "prefetch": result.recommended.prefetch}
    with fl.Loader(dataset, device="cpu", **result.args) as loader:
        batch = next(iter(loader))
        assert batch["x"].shape == (16, 8) and batch["y"].dtype == torch.int64
    assert result.table().splitlines()[0].split()[:3] == ["num_workers", "workers", "prefetch"]
    assert "workers='threads'" in result.summary()
    by_name = fl.tune("tune_datasets:make_points", batch_size=8, dataset_args={"n": 50}, threads=1, prefetch=2,
                      workers=["threads"], seconds=0.05, repeats=1, progress=False)
    assert by_name.source == "tune_datasets:make_points" and by_name.rows[0].samples_per_s > 0
    positional = fl.tune("tune_datasets:Points", batch_size=8, dataset_args=[40, 2], threads=1, prefetch=2,
                         workers="threads", seconds=0.05, repeats=1, progress=False)
    assert positional.row_bytes == 2 * 4 + 8
    with pytest.raises(ValueError, match="workers must hold"):
        fl.tune(dataset, batch_size=8, workers=["fibers"])
    with pytest.raises(ValueError, match="workers applies to Python datasets"):
        fl.tune(np.zeros((10, 2)), batch_size=8, workers="threads")
    with pytest.raises(TypeError, match="cannot be pickled"):
        fl.tune(tune_datasets.Unpicklable(), batch_size=8, threads=1, prefetch=2, seconds=0.05, repeats=1,
                progress=False)


def test_a_measurement_reads_the_whole_source_also_under_a_launchers_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every batch counts min(batch_size, len(source)) samples: true of one loader over the whole
    # source, not of rank 1 of 2 (5 of these 10 samples: no full batch of 8 at all).
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    source = fl.Dataset({"x": np.arange(20, dtype=np.float32).reshape(10, 2)})
    for batch_size in (8, 16):  # full batches (the short last one dropped); one short batch per epoch
        rate, wait_share, _ = _tune.measure_one(source, batch_size, torch.device("cpu"), (1, 2, 1, None), 0.01, 0.05, 0)
        assert rate > 0 and 0 <= wait_share <= 1


def test_the_workers_axis_is_threads_and_processes_by_default_on_any_device() -> None:
    # Worker processes feed a GPU too (registered shared memory): no device narrows the default.
    assert _tune.worker_values(None, python=True) == ["threads", "processes"]
    assert _tune.worker_values("processes", python=True) == ["processes"]
    assert _tune.worker_values(["processes", "threads", "threads"], python=True) == ["threads", "processes"]
    assert _tune.worker_values(None, python=False) == [None]
    with pytest.raises(ValueError, match="workers must hold 'threads' and/or 'processes'"):
        _tune.worker_values([], python=True)
    # --workers parses to the same values, and refuses what fl.tune refuses in the option's words.
    import argparse
    assert _tune_cli._workers("processes, threads,processes") == ["threads", "processes"]
    for bad in ("fibers", "threads,fibers", ",", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="expected threads, processes or threads,processes"):
            _tune_cli._workers(bad)


def test_recommendation_prefers_threads_to_processes_within_3_percent() -> None:
    def point(t: int, kind: str, rate: float) -> fl.TunePoint:
        return fl.TunePoint(t, 2, 1, rate, 0.5, (rate,), workers=kind)

    fastest, recommended = _tune.recommend([point(2, "processes", 100.0), point(2, "threads", 97.5),
                                            point(1, "threads", 90.0)])
    assert (fastest.workers, recommended.workers, recommended.num_threads) == ("processes", "threads", 2)
    fastest, recommended = _tune.recommend([point(2, "processes", 100.0), point(2, "threads", 96.0)])
    assert recommended is fastest


def test_a_python_dataset_result_reports_and_plots_its_workers(tmp_path: Path) -> None:
    def point(t: int, p: int, kind: str, rate: float) -> fl.TunePoint:
        return fl.TunePoint(t, p, 1, rate, 0.2, (rate, rate * 1.02), workers=kind)

    rows = [point(1, 2, "threads", 50.0), point(2, 2, "threads", 60.0), point(1, 2, "processes", 55.0),
            point(2, 2, "processes", 100.0)]
    fastest, recommended = _tune.recommend(rows)
    result = fl.TuneResult(args=_tune.loader_args(recommended, 8, "cpu"), recommended=recommended, fastest=fastest,
                           rows=rows, source="data:Images", batch_size=8, row_bytes=1024, device="cpu", seconds=1.0,
                           repeats=2, elapsed_s=12.0, defaults={"num_threads": 2, "prefetch": 2})
    table = result.table().splitlines()
    assert table[0].split()[:3] == ["num_workers", "workers", "prefetch"]
    assert table[4].split()[:3] == ["2", "processes", "2"] and table[4].endswith("<- fastest, recommended")
    assert result.args == {"batch_size": 8, "num_workers": 2, "workers": "processes", "prefetch": 2}
    summary = result.summary()
    assert "recommended: num_workers=2 workers='processes' prefetch=2" in summary
    assert "defaults:    num_workers=2 workers='threads' prefetch=2: 60 samples/s" in summary
    if not _tune.matplotlib_missing():
        result.plot(tmp_path / "workers.png")  # one panel per kind of workers
        assert (tmp_path / "workers.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("source, extra, says", [
    ("no_such_module_xyz:Data", [], "cannot import module 'no_such_module_xyz'"),
    ("tune_datasets:Pionts", [], "module 'tune_datasets' has no attribute 'Pionts' (did you mean Points"),
    ("tune_datasets:NotADataset", [], "gave a NotADataset, not a map-style dataset"),
    ("tune_datasets:Stream", [], "is a torch IterableDataset"),
    ("tune_datasets:Unpicklable", [], "Unpicklable cannot be pickled"),
    ("tune_datasets:Empty", [], "is empty"),
    ("tune_datasets:Broken", [], "reading sample 0 (to learn the batch's structure) raised KeyError"),
    ("tune_datasets:FailsToBuild", [], "tune_datasets:FailsToBuild() raised RuntimeError: cannot open the database"),
    ("tune_datasets:IntKeys", [], "tune_datasets:IntKeys: sample field '<sample>': dict keys must be strings"),
    ("tune_datasets:Points", ["--dataset-args", '{"n": '], "argument --dataset-args: not JSON"),
    ("tune_datasets:Points", ["--dataset-args", '"n"'], "argument --dataset-args: expected a JSON object"),
    ("tune_datasets:Points", ["--dataset-args", '{"size": 3}'], "unexpected keyword argument 'size'"),
    ("tune_datasets:points", ["--dataset-args", '{"n": 3}'], "not a class or function"),
    ("tune_datasets:Points", ["--workers", "fibers"], "argument --workers"),
    ("tune_datasets:Points", ["--window", "4"], "window and dtype apply to a path or an array"),
    ("NPY", ["--dataset-args", '{"n": 3}'], "--dataset-args"),
    ("NPY", ["--workers", "processes"], "--workers applies to a Python dataset"),
])
def test_bad_dataset_classes_are_usage_errors_before_measuring(npy: Path, capsys: pytest.CaptureFixture[str],
                                                               source: str, extra: list[str], says: str) -> None:
    import time
    source = str(npy) if source == "NPY" else source
    began = time.perf_counter()
    # A run that measured first would take minutes (--seconds 50): it must stop at once.
    code, out, err = cli(capsys, source, "--batch-size", "8", "--seconds", "50", "--repeats", "1", "--threads", "1",
                         "--prefetch", "2", *extra)
    assert time.perf_counter() - began < 20
    assert code == 2 and out == ""
    assert says in one_error_line(err), err


def test_ctrl_c_while_tune_builds_a_dataset_exits_with_130():
    import os
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "fastload", "tune", "tune_datasets:SlowToBuild", "--batch-size", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TESTS)
    try:
        assert proc.stderr.readline().strip() == "building"  # inside the dataset's constructor now
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err


# ---------------------------------------------------------------------------- every source kind tunes
def _parquet_rows(path: Path, rows: int, start: int = 0, row_group_size: int = 100) -> np.ndarray:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    x = np.random.default_rng(start).standard_normal((rows, 4)).astype(np.float32)
    table = pa.table({"id": pa.array(np.arange(start, start + rows), pa.int64()),
                      "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4)})
    pq.write_table(table, path, row_group_size=row_group_size)
    return x


def test_a_parquet_file_and_a_parquet_folder_tune_through_fl_parquet(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from fastload.tools._tune_source import open_source

    one = tmp_path / "one.parquet"
    _parquet_rows(one, 1000)
    folder = tmp_path / "parts" / "day=1"
    folder.mkdir(parents=True)
    for k in range(3):
        _parquet_rows(folder / f"part-{k}.parquet", 300, start=300 * k)
    # What tune measures is what fl.Parquet opens: the same rows, shards and default order.
    for path, rows in ((one, 1000), (tmp_path / "parts", 900)):
        source = open_source(path)
        assert isinstance(source, fl.Parquet) and len(source) == rows
        assert source.shard_rows == fl.Parquet(path).shard_rows
    # On the command line, without --window (a .parquet is not raw tokens): 8 B of id + 16 B of x.
    code, out, err = cli(capsys, str(one), "--batch-size", "32", *FAST, "--no-progress")
    assert code == 0, err
    assert "1,000 samples of 24 B" in out and "fl.Loader(source, batch_size=32, num_threads=" in out
    code, out, err = cli(capsys, str(tmp_path / "parts"), "--batch-size", "32", *FAST, "--no-progress")
    assert code == 0, err
    assert "900 samples of 28 B" in out  # the partition column day= (inferred as int32) is read too
    code, _, err = cli(capsys, str(one), "--batch-size", "8", "--window", "4")
    assert code == 2 and "--window applies to a token file, not to Parquet" in err
    result = fl.tune(str(one), batch_size=16, threads=[1], prefetch=[2], seconds=0.05, repeats=1, progress=False)
    assert result.rows[0].samples_per_s > 0 and result.source == str(one)


def test_a_hugging_face_saved_dataset_folder_tunes_through_fl_arrow(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    datasets = pytest.importorskip("datasets")
    from fastload.tools._tune_source import open_source

    x = np.random.default_rng(3).standard_normal((500, 3)).astype(np.float32)
    ds = datasets.Dataset.from_dict({"x": x.tolist(), "y": list(range(500))}).with_format("numpy")
    ds.save_to_disk(str(tmp_path / "hf"))
    source = open_source(tmp_path / "hf")
    assert isinstance(source, fl.Arrow) and len(source) == 500
    with fl.Loader(source, batch_size=500, device="cpu") as loader:  # the rows as saved
        batch = next(iter(loader))
    np.testing.assert_array_equal(batch["y"].numpy(), np.arange(500))
    np.testing.assert_allclose(batch["x"].numpy(), x)
    code, out, err = cli(capsys, str(tmp_path / "hf"), "--batch-size", "32", *FAST, "--no-progress")
    assert code == 0, err
    assert "500 samples of " in out and "fl.Loader(source, batch_size=32, num_threads=" in out
    # A DatasetDict's folder names its splits instead.
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dict"))
    code, _, err = cli(capsys, str(tmp_path / "dict"), "--batch-size", "8")
    assert code == 2 and "DatasetDict: name one split's folder" in one_error_line(err), err
    code, out, err = cli(capsys, str(tmp_path / "dict" / "train"), "--batch-size", "32", *FAST, "--no-progress")
    assert code == 0 and "500 samples of " in out, err


def test_tunes_baseline_reads_a_parquet_source_in_its_own_order(tmp_path: Path) -> None:
    # The defaults row is what fl.Loader(source, batch_size) resolves, its order included: the
    # source's ("block" for Parquet), decided in one place for the Loader and tune alike.
    from fastload._config import default_config

    _parquet_rows(tmp_path / "a.parquet", 600)
    source = fl.Parquet(tmp_path / "a.parquet")
    assert default_config(source, 8, "cpu").order == "block" == fl.Loader(source, 8, device="cpu").config.order
    assert default_config(fl.Dataset({"x": np.zeros(10)}), 8, "cpu").order == "random"
    assert fl.Loader(source, 8, device="cpu", order="random").config.order == "random"  # given, it wins


def test_copy_streams_is_the_one_name_and_streams_still_works() -> None:
    point = fl.TunePoint(2, 4, 3, 100.0, 0.1)
    assert point.copy_streams == 3 and point.describe(gpu=True).endswith("copy_streams=3")
    with pytest.warns(FutureWarning, match="copy_streams"):
        assert point.streams == 3
    x = np.zeros((200, 4), np.float32)
    with pytest.warns(FutureWarning, match="copy_streams"):
        result = fl.tune(x, batch_size=8, threads=[1], prefetch=[2], streams=[1], seconds=0.02, repeats=1,
                         progress=False)
    assert [r.copy_streams for r in result.rows] == [1] and "copy_streams" in result.to_json()["rows"][0]
    with pytest.raises(ValueError, match="streams is the old name of copy_streams"):
        fl.tune(x, batch_size=8, streams=[1], copy_streams=[1])


def test_urls_tune_through_the_same_constructors(s3_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # The S3 server of the tests, found through the environment as a user's bucket would be.
    boto3 = pytest.importorskip("boto3")
    import uuid

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server[0])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    s3 = boto3.client("s3", endpoint_url=s3_server[0], region_name="us-east-1")
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    (tmp_path / "pq").mkdir()
    for k in range(2):
        _parquet_rows(tmp_path / "pq" / f"part-{k}.parquet", 400, start=400 * k)
        s3.upload_file(str(tmp_path / "pq" / f"part-{k}.parquet"), bucket, f"pq/part-{k}.parquet")
    fl.write_dataset(tmp_path / "ds", {"x": np.zeros((700, 3), np.float32)}, rows_per_shard=100)
    for f in sorted(p for p in (tmp_path / "ds").rglob("*") if p.is_file()):
        s3.upload_file(str(f), bucket, f"ds/{f.relative_to(tmp_path / 'ds').as_posix()}")
    for url, extra, says in ((f"s3://{bucket}/pq/part-0.parquet", [], "400 samples of 24 B"),
                             (f"s3://{bucket}/pq/", ["--format", "parquet"], "800 samples of 24 B"),
                             (f"s3://{bucket}/ds", [], "700 samples of 12 B")):
        code, out, err = cli(capsys, url, "--batch-size", "16", "--seconds", "0.05", "--repeats", "1", "--threads", "1",
                             "--prefetch", "2", "--no-progress", *extra)
        assert code == 0, err
        assert says in out, out
    # A prefix of Parquet files read as a dataset directory says what to pass.
    code, _, err = cli(capsys, f"s3://{bucket}/pq/", "--batch-size", "16")
    assert code == 2 and "manifest.json" in err and "--format parquet" in err, err
