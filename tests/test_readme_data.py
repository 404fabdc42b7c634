"""The "Data on disk" page's examples (docs/data-on-disk.md) run as written (in a scratch directory)."""
from __future__ import annotations

import pathlib
import re

PAGE = pathlib.Path(__file__).parent.parent / "docs" / "data-on-disk.md"


def test_data_on_disk_examples_run_as_written(tmp_path, monkeypatch, capsys):
    section = PAGE.read_text()
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 4
    monkeypatch.chdir(tmp_path)
    for k, code in enumerate(blocks):
        exec(compile(code, f"README data on disk example {k}", "exec"), {})
    out = capsys.readouterr().out
    assert "[2500, 2500, 2500, 2500]" in out and "torch.Size([16, 48, 2, 8, 8])" in out
