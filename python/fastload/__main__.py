"""``python -m fastload``: a self-contained demo and smoke test. See ``python -m fastload --help``."""
from fastload._demo import main

if __name__ == "__main__":
    raise SystemExit(main())
