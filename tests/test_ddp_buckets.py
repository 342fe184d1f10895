"""``tfbook.parallel.ddp_buckets`` (the rule exercise 18.1 is graded by) equals what DDP does.

The rule is written from DDP's documented behaviour (reverse parameter order, a bucket closes
once it holds the cap, a smaller first bucket under the default caps). Here a real
``DistributedDataParallel`` model (one gloo process: the assignment is computed by each rank from
its own parameters, so one rank shows it) gets a communication hook through the public
``register_comm_hook``; the hook records, for every bucket DDP all-reduces, its index, its
parameters (``GradBucket.parameters()``, mapped to their positions in ``model.parameters()``)
and the size of its flat buffer. From the second step on (after DDP rebuilds its buckets in the
order gradients became ready) that must equal the rule's buckets, in the same order.

The comparison is shown to fail: four plausible wrong rules (forward order, the first bucket's
cap ignored, a bucket closed before the tensor that passes the cap, the cap counted in numbers
rather than bytes) each disagree with DDP on at least one of the models.

The models are stacks of ``nn.Linear``, whose gradients become ready in exactly the reverse of
the definition order; in a model where that is not so (a tied embedding, a parameter used
twice), DDP follows the real order and the rule is only the approximation its text says.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tfbook.parallel import ddp_buckets

ROOT = Path(__file__).resolve().parents[1]

# (name, layer widths, dtype, bucket_cap_mb or None for DDP's defaults)
CASES = [
    # default caps, 1 MiB then 25 MiB: a first bucket closed by a 10.6 MB weight, a 27 MB weight alone
    ("default caps, float32", [16, 1024, 2600, 2600, 1024, 10], "float32", None),
    # the exercise's setting: float64, a cap of 200 bytes
    ("200 B cap, float64", [6, 4, 8, 4, 3], "float64", 200 / 2**20),
    # a cap that a bucket passes by its last tensor, and tensors larger than the cap alone
    ("300 B cap, float32", [20, 16, 3, 30, 2], "float32", 300 / 2**20),
]

SCRIPT = r"""
import json, os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
cases, port = json.loads(sys.argv[1]), sys.argv[2]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=0, world_size=1)
out = []
for name, dims, dtype, cap_mb in cases:
    torch.manual_seed(0)
    layers = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers).to(getattr(torch, dtype))
    index = {id(p): i for i, p in enumerate(model.parameters())}
    seen = []
    def hook(state, bucket):   # called once per bucket, when all its gradients are ready
        seen.append({"index": bucket.index(), "params": [index[id(p)] for p in bucket.parameters()],
                     "buffer_bytes": bucket.buffer().numel() * bucket.buffer().element_size()})
        return default_hooks.allreduce_hook(None, bucket)
    ddp = DDP(model) if cap_mb is None else DDP(model, bucket_cap_mb=cap_mb)
    ddp.register_comm_hook(None, hook)
    x = torch.randn(4, dims[0], dtype=getattr(torch, dtype))
    steps = []
    for step in range(3):
        seen.clear()
        ddp(x).square().sum().backward()
        steps.append(list(seen))
    out.append({"name": name, "nbytes": [p.numel() * p.element_size() for p in model.parameters()],
                "steps": steps})
dist.destroy_process_group()
print(json.dumps(out))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def observed() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CASES), str(_free_port())],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {case["name"]: case for case in json.loads(proc.stdout.strip().splitlines()[-1])}


def _caps(cap_mb):
    """(cap_bytes, first_cap_bytes) as DDP sets them: defaults 25 MiB and 1 MiB; an explicit cap for both."""
    return (25 * 2**20, 2**20) if cap_mb is None else (int(cap_mb * 2**20), None)


def _ddp_buckets_seen(case) -> list[list[int]]:
    """The buckets the hook saw at step 2, in the order DDP all-reduced them; checks they are stable."""
    steps = case["steps"]
    assert steps[1] == steps[2], f"{case['name']}: DDP's buckets changed between steps 2 and 3"
    assert [b["index"] for b in steps[2]] == list(range(len(steps[2]))), "buckets not sent in index order"
    return [b["params"] for b in steps[2]]


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_rule_equals_the_buckets_ddp_all_reduces(name, observed):
    case = observed[name]
    cap_mb = {c[0]: c[3] for c in CASES}[name]
    want = _ddp_buckets_seen(case)
    got = ddp_buckets(case["nbytes"], *_caps(cap_mb))
    assert got == want, f"{name}: rule {got} vs DDP {want}"
    # each flat buffer holds exactly the bucket's gradients
    assert [b["buffer_bytes"] for b in case["steps"][2]] == [sum(case["nbytes"][i] for i in b) for b in want]
    # the first step, before DDP rebuilds, sends a single bucket (find_unused_parameters=False)
    assert len(case["steps"][0]) == 1 and sorted(case["steps"][0][0]["params"]) == list(range(len(case["nbytes"])))
    assert len(want) >= 2, f"{name}: a case that shows bucketing needs at least two buckets"


def _forward_order(nbytes, cap, first=None):
    n = len(nbytes)
    return [[n - 1 - i for i in b] for b in ddp_buckets(nbytes[::-1], cap, first)]


def _close_before(nbytes, cap, first=None):
    buckets, current, size, limit = [], [], 0, first or cap
    for i in reversed(range(len(nbytes))):
        if current and size + nbytes[i] > limit:
            buckets, current, size, limit = buckets + [current], [], 0, cap
        current, size = current + [i], size + nbytes[i]
    return buckets + [current]


WRONG_RULES = {
    "forward order": _forward_order,
    "first bucket's cap ignored": lambda nbytes, cap, first=None: ddp_buckets(nbytes, cap),
    "closed before the tensor that passes the cap": _close_before,
    "cap counted in numbers, not bytes": lambda nbytes, cap, first=None: ddp_buckets(
        nbytes, 4 * cap, None if first is None else 4 * first),
}


@pytest.mark.parametrize("wrong", WRONG_RULES)
def test_a_wrong_rule_disagrees_with_ddp(wrong, observed):
    """The mutation side: the comparison above fails for each wrong rule on some model."""
    differs = [c[0] for c in CASES
               if WRONG_RULES[wrong](observed[c[0]]["nbytes"], *_caps(c[3])) != _ddp_buckets_seen(observed[c[0]])]
    assert differs, f"the wrong rule ({wrong}) agrees with DDP on every model: the cases cannot tell them apart"


def test_bad_input():
    with pytest.raises(ValueError, match="cap_bytes"):
        ddp_buckets([8, 8], 0)
    with pytest.raises(ValueError, match="first_cap_bytes"):
        ddp_buckets([8, 8], 16, -1)
    with pytest.raises(ValueError, match="nbytes"):
        ddp_buckets([8, -8], 16)
