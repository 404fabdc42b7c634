"""The README's quick start runs as written."""
from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).parent.parent / "README.md"


def test_quick_start_runs_as_written(capsys):
    text = README.read_text()
    section = text.split("## Quick start", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section.split("## API", 1)[0], re.S)
    assert "torch.utils.data.Dataset" in blocks[0], "the quick start shows a torch Dataset first"
    scope: dict = {"__name__": "__main__"}
    exec(compile(blocks[0], "README quick start", "exec"), scope)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[-1].startswith("2 ")
    arrays: dict = {}  # a scope of its own: the snippet runs as written, imports included
    exec(compile(blocks[1], "README quick start, arrays", "exec"), arrays)
    assert tuple(arrays["batch"]["x"].shape) == (256, 32)


def test_token_example_runs_as_written(tmp_path, monkeypatch):
    text = README.read_text()
    section = text.split("## Quick start", 1)[1].split("## API", 1)[0]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "train.bin" in b]
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)  # it writes train.bin
    scope: dict = {}
    exec(compile(blocks[0], "README token example", "exec"), scope)
    assert tuple(scope["inputs"].shape)[1] == 1024 and scope["t"].dtype.is_floating_point is False
    scope["loader"].close()
