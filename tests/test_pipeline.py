"""Pipeline parallelism (tfbook.parallel.pipeline): the stage split, the schedule grid and the bubble,
and two gloo ranks under GPipe and 1F1B against one process."""

import pytest
import torch

from tfbook import parallel
from tfbook.parallel import pipeline as pp
from tfbook.torch.models import lm_loss

CFG = parallel.DPConfig()


def _gpipe(p, m):
    """GPipe's order on each of p stages: all forwards, then the backwards in the same order."""
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]


def _one_f_one_b(p, m):
    """1F1B's order: p - 1 - s warm-up forwards on stage s, then one forward, one backward."""
    logs = []
    for s in range(p):
        w = min(p - 1 - s, m)
        log = [("F", i) for i in range(w)]
        for i in range(m - w):
            log += [("F", w + i), ("B", i)]
        log += [("B", i) for i in range(m - w, m)]
        logs.append(log)
    return logs


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (3, 4), (4, 8), (4, 2)])
def test_bubble_is_the_formula(p, m):
    for logs in (_gpipe(p, m), _one_f_one_b(p, m)):
        grid = pp.timeline(logs)
        assert len(grid[0]) == 2 * (m + p - 1)                   # forward and backward fill, then drain
        assert pp.bubble_fraction(grid) == pytest.approx((p - 1) / (m + p - 1), abs=1e-15)
    assert [pp.in_flight(log) for log in _gpipe(p, m)] == [m] * p
    assert [pp.in_flight(log) for log in _one_f_one_b(p, m)] == [min(p - s, m) for s in range(p)]


def test_timeline_respects_dependencies():
    grid = pp.timeline(_gpipe(2, 2))
    assert grid == [[("F", 0), ("F", 1), None, None, ("B", 0), ("B", 1)],
                    [None, ("F", 0), ("F", 1), ("B", 0), ("B", 1), None]]
    with pytest.raises(ValueError, match="deadlock"):                 # a backward before its forward
        pp.timeline([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]])


def test_split_stages_compose_to_the_model():
    model = parallel.make_model(CFG)
    first, last = pp.split_stages(model)
    x, y = parallel.make_batches(CFG)[0]
    torch.testing.assert_close(last(first(x)), model(x), atol=1e-13, rtol=0)
    with pytest.raises(ValueError, match="k must be"):
        pp.split_stages(model, k=2)
    with pytest.raises(ValueError, match="k must be"):
        pp.split_stages(model, k=0)


def test_two_ranks_equal_one_process():
    ref = parallel.single_process_run(CFG)
    x, y = parallel.make_batches(CFG)[0]
    loss = lm_loss(parallel.make_model(CFG), x, y).item()
    runs = parallel.run_engines(["pipeline"], CFG, world_size=2, timeout=120)
    for name in pp.PIPELINE_SCHEDULES:
        got = [r["pipeline"][name] for r in runs]
        assert set(got[0]["grads"]) | set(got[1]["grads"]) == set(ref["grads"])
        assert got[0]["num_params"] + got[1]["num_params"] - CFG.vocab_size * CFG.d_model == sum(
            g.numel() for g in ref["grads"].values())                     # W_E held twice
        for g in got:
            for n, t in g["grads"].items():
                torch.testing.assert_close(t, ref["grads"][n], atol=1e-12, rtol=0, msg=f"{name} {n}")
        assert abs(got[1]["loss"] - loss) < 1e-12
        grid = pp.timeline([g["log"] for g in got])
        assert pp.bubble_fraction(grid) == pytest.approx(1 / (runs[0]["pipeline"]["m"] + 1), abs=1e-15)
    assert [pp.in_flight(r["pipeline"]["gpipe"]["log"]) for r in runs] == [4, 4]
    assert [pp.in_flight(r["pipeline"]["1f1b"]["log"]) for r in runs] == [2, 1]
