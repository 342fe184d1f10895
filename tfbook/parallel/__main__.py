"""``python -m tfbook.parallel``: the command line of :mod:`tfbook.parallel.cli` (also what torchrun runs)."""

from .cli import main

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
