"""Chapter 13's long model, one seed, retrained on a GPU and scored beside the shipped record.

    python tools/gpu_long.py --seed 0 --out DIR     # (tools/gpu_check.sh runs the three seeds at once)

Trains the chosen candidate (:data:`tfbook.tasks.prose.LONG_NAME`) for the step count recorded
for that seed in ``prose_long_scores.json`` (the search over candidates is not rerun), on
``--device`` (default cuda), then scores it on the CPU in float32 as the shipped record was
scored: validation and test bits per character (every character after its preceding text) and
the test slice under dynamic evaluation at the shipped rate. Writes ``DIR/long_s<seed>.json``
with the retrained and the shipped figures side by side. GPU training is not bitwise
reproducible: compare the differences with the spread over the three shipped seeds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main(argv=None) -> None:
    from tfbook.tasks import prose

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=None, help="default: the shipped run's recorded count")
    ap.add_argument("--limit", type=int, default=None, help="score only the first LIMIT characters (a dry run)")
    args = ap.parse_args(argv)
    shipped = prose.load_long_scores()
    name = shipped["chosen"]
    steps = args.steps or shipped["candidates"][f"{name}_s{args.seed}"]["steps"]
    t0 = time.time()
    model, history = prose.train_long(name, args.seed, steps=steps, device=args.device, log=print)
    train_s = time.time() - t0
    splits = prose._limited(prose.data(), args.limit)
    model = model.float().eval()
    val = float(prose.bits_after(model, splits.train, splits.validation, dtype=torch.float32).mean())
    test = float(prose.bits_after(model, splits.validation, splits.test, dtype=torch.float32).mean())
    lr = shipped["dynamic"]["lr"]
    dyn = float(prose.dynamic_bits(model, splits.validation, splits.test, lr).mean())
    s = str(args.seed)
    result = dict(seed=args.seed, candidate=name, steps=steps, device=args.device, train_seconds=round(train_s, 1),
                  limit=args.limit, best_eval=history.best_eval, best_step=history.best_step,
                  retrained=dict(validation=val, test=test, dynamic_test=dyn, dynamic_lr=lr),
                  shipped=dict(validation=shipped["seeds"][s]["validation"], test=shipped["seeds"][s]["test"],
                               dynamic_test=shipped["dynamic"]["test_seeds"][s]),
                  shipped_seed_spread={k: max(v[k] for v in shipped["seeds"].values())
                                       - min(v[k] for v in shipped["seeds"].values()) for k in ("validation", "test")})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"long_s{args.seed}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
