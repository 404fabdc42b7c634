"""The "Blending datasets" page's examples (docs/blending.md) run as written, and say what they print."""
from __future__ import annotations

import pathlib
import re

import torch

PAGE = pathlib.Path(__file__).parent.parent / "docs" / "blending.md"


def test_blending_examples_run_as_written(capsys):
    section = PAGE.read_text()
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    scope: dict = {"__name__": "__main__"}
    for k, code in enumerate(blocks):
        exec(compile(code, f"README blending example {k}", "exec"), scope)
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("100 100 SourceStats(samples=320")
    # the comment's claim: every batch holds 19-20 web, 9-10 code and 3-4 math windows
    loader = scope["loader"]
    for batch in type(loader)(scope["mix"], batch_size=32, steps=100, shuffle=True, seed=0):
        c = batch["source"].bincount(minlength=3)
        assert 19 <= c[0] <= 20 and 9 <= c[1] <= 10 and 3 <= c[2] <= 4 and int(c.sum()) == 32
    assert isinstance(scope["inputs"], torch.Tensor) and tuple(scope["inputs"].shape) == (32, 1024)
