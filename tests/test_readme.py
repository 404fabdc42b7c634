"""The README's quick start runs as written: every Python block in it."""
from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).parent.parent / "README.md"


def quick_start_blocks() -> list[str]:
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def opening_block() -> str:
    """The three lines of use before the first section."""
    head = README.read_text().split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", head, re.S)
    assert len(blocks) == 1
    return blocks[0]


def test_every_python_block_of_the_readme_is_run():
    # the opening's block and each quick-start block are run below, so every snippet of the README is
    assert len(re.findall(r"```python\n", README.read_text())) == 1 + len(quick_start_blocks()) == 5


def test_the_opening_three_lines_run_as_written():
    code = opening_block()
    assert len(code.strip().splitlines()) == 3
    scope: dict = {}
    exec(compile(code, "README opening", "exec"), scope)
    assert scope["shapes"] == [(100, 8)] * 10


def test_quick_start_runs_as_written(capsys):
    blocks = quick_start_blocks()
    assert "torch.utils.data.Dataset" in blocks[0], "the quick start shows a torch Dataset first"
    scope: dict = {"__name__": "__main__"}
    exec(compile(blocks[0], "README quick start", "exec"), scope)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[-1].startswith("2 ")
    arrays: dict = {}  # a scope of its own: the snippet runs as written, imports included
    exec(compile(blocks[1], "README quick start, arrays", "exec"), arrays)
    assert tuple(arrays["batch"]["x"].shape) == (256, 32)


def test_token_example_runs_as_written(tmp_path, monkeypatch):
    blocks = [b for b in quick_start_blocks() if "train.bin" in b]
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)  # it writes train.bin
    scope: dict = {}
    exec(compile(blocks[0], "README token example", "exec"), scope)
    assert tuple(scope["inputs"].shape)[1] == 1024 and scope["t"].dtype.is_floating_point is False
    scope["loader"].close()


def test_dataset_directory_example_runs_as_written(tmp_path, monkeypatch):
    blocks = [b for b in quick_start_blocks() if "write_dataset" in b]
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)  # it writes train_dir
    scope: dict = {}
    exec(compile(blocks[0], "README dataset directory example", "exec"), scope)
    assert (tmp_path / "train_dir" / "manifest.json").exists()
    batch = scope["batch"]  # the loop's last batch: 10,000 = 39 x 256 + 16
    assert tuple(batch["x"].shape) == (16, 32) and str(batch["y"].dtype) == "torch.int64"
