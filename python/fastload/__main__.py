"""``python -m fastload``: the demo job (see ``python -m fastload --help``), and
``python -m fastload tune``: measure and pick loader settings on your data (``tune --help``)."""
import sys


def _main(argv: list[str]) -> int:
    # Ctrl-C anywhere (importing a dataset class, reading its first sample, writing the results)
    # exits with 130 as in the measuring loop, never by the signal with a traceback.
    try:
        if argv[:1] == ["tune"]:
            from fastload.tools.tune import main as tune_main
            return tune_main(argv[1:])
        from fastload.tools._demo import main
        return main(argv)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
