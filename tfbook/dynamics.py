"""Old path of :mod:`tfbook.tasks.dynamics` (the training-dynamics experiments of chapters 3
and 8), kept for the chapters that import it; ``python -m tfbook.dynamics warmup [--out FILE]``
still writes the warm-up curves (the task's own command is ``python -m tfbook.tasks.dynamics``).
"""

from __future__ import annotations

from pathlib import Path

from .tasks import dynamics as _task
from .tasks._common import write_json
from .tasks.dynamics import *  # noqa: F401,F403
from .tasks.dynamics import WARMUP_CURVES, __all__  # noqa: F401


def main(argv=None) -> None:
    """``python -m tfbook.dynamics warmup [--out FILE]``: the experiment's first command line."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["warmup"])
    parser.add_argument("--out", default=str(WARMUP_CURVES))
    args = parser.parse_args(argv)
    result = _task.train()
    write_json(Path(args.out), {k: v for k, v in result.items() if k != "models"})
    _task._print_finals(result)


if __name__ == "__main__":
    main()
