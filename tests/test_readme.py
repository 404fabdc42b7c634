"""The README's quick start runs as written."""
from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).parent.parent / "README.md"


def test_quick_start_runs_as_written(capsys):
    text = README.read_text()
    section = text.split("## Quick start", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README quick start", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[-1].startswith("2 ")


def test_token_example_runs_as_written(tmp_path, monkeypatch):
    text = README.read_text()
    section = text.split("## Quick start", 1)[1].split("## API", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 2 and "train.bin" in blocks[1]
    monkeypatch.chdir(tmp_path)  # it writes train.bin
    scope: dict = {}
    exec(compile(blocks[1], "README token example", "exec"), scope)
    assert tuple(scope["inputs"].shape)[1] == 1024 and scope["t"].dtype.is_floating_point is False
    scope["loader"].close()
