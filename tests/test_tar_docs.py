"""The "Tar shards (WebDataset)" page's quick start (docs/tar.md) runs as written, and what it
prints is what its shards hold."""
from __future__ import annotations

import pathlib
import re

PAGE = pathlib.Path(__file__).parent.parent / "docs" / "tar.md"


def test_tar_quick_start_runs_as_written(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "docs/tar.md quick start", "exec"), {})
    out = capsys.readouterr().out
    assert "30 samples in 3 shards; 4 batches per epoch" in out
    keys, labels, meta = re.search(r"\[(.*?)\] \[(.*?)\] \[(.*?)\]\n", out).groups()
    ids = [int(k.strip(" '")[len("sample"):]) for k in keys.split(",")]
    assert [int(v) for v in labels.split(",")] == [i % 4 for i in ids]
    assert meta == ", ".join(f"{{'id': {i}}}" for i in ids)
