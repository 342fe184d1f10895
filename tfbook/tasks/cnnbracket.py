"""Chapter 15's CNN learning-rate bracket: :mod:`tfbook.tasks.datasize` one rate above its grid.

:mod:`tfbook.tasks.datasize` chooses each model's peak learning rate on validation from
``datasize.LRS`` (1e-3, 3e-3, 1e-2), and the CNN chose the largest, 1e-2, at every size, so its
grid was not bracketed. This command trains the CNN once more at :data:`LR` = 3e-2, seed 0, on
each of the three sizes (150, 400 and all 1,211 fitting images; the same subsets, recipe,
schedule, augmentation and stopping rule as the grid: :func:`tfbook.tasks.datasize.train`
unchanged), and ships the three runs' records and weights in ``cnnbracket.pt``. The chapter
re-evaluates the three shipped models live and asks whether validation would have chosen 3e-2
over the grid's 1e-2 at any size. Three runs of about ten CPU-seconds each (28 s in all on one core)::

    python -m tfbook.tasks.cnnbracket          # or --out DIR
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import datasize as DS
from ._common import cli, load_blob, load_state, shipped

__all__ = ["LR", "SIZES", "FILE", "experiment", "load_pretrained", "main"]

#: the rate above datasize.LRS's largest (the grid's steps are a factor of about 3)
LR: float = 3e-2
SIZES: tuple = DS.SIZES
FILE = "cnnbracket.pt"


def experiment(log=print) -> dict:
    """Train the CNN at :data:`LR`, seed 0, on each size; ``{"runs": [record, ...], "states": [...]}``."""
    torch.set_num_threads(1)
    runs, states = [], []
    for n in SIZES:
        net, run = DS.train("cnn", n, 0, lr=LR)
        log(f"cnn n={run['n']} lr={LR:g}: validation {run['val_correct']}/{run['val_total']}, "
            f"test {run['test_correct']}/{run['test_total']} (step {run['best_step']})")
        runs.append(run)
        states.append({k: v.detach().to(torch.float32).clone() for k, v in net.state_dict().items()})
    return {"lr": LR, "runs": runs, "states": states}


def load_pretrained(folder=None) -> list:
    """``[(SmallCNN in eval mode, its run record), ...]`` for the three sizes, from the shipped file."""
    blob = load_blob(shipped(FILE, folder))
    return [(load_state(DS.SmallCNN(), s), r) for s, r in zip(blob["states"], blob["runs"])]


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped file
    def run(out, args):
        result = experiment()
        path = Path(out) / FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(result, path)
        print(f"wrote {path}")

    cli(__doc__, run, argv=argv)


if __name__ == "__main__":  # pragma: no cover
    main()
