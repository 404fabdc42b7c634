"""fastload's commands and what they share: `tune` (tune.py: tune, TuneResult, TunePoint, also
exported as fastload.tune and friends; `python -m fastload tune`), the demo job (`python -m
fastload`), their argument types and progress line, and datasets named as `module:Class`."""
