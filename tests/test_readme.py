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
