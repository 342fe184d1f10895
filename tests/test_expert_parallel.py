"""Expert parallelism (tfbook.parallel.expert): a mixture-of-experts layer with its experts on two gloo
ranks, tokens dispatched and combined with all_to_all_single, against the one-process layer."""

import pytest
import torch

from tfbook import parallel
from tfbook.parallel import expert as ex
from tfbook.torch.functional import experts as FE

CFG = parallel.DPConfig()


@pytest.fixture(scope="module")
def ref():
    return ex.single_process_moe(CFG)


@pytest.fixture(scope="module")
def runs():
    return parallel.run_engines(["expert"], CFG, world_size=2, timeout=120)


def test_owner_and_dispatch_plan():
    assert ex.expert_owner(4, 2).tolist() == [0, 0, 1, 1]
    assert ex.expert_owner(4, 1).tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="world"):
        ex.expert_owner(4, 3)
    experts = torch.tensor([[3, 0], [1, 3], [0, 2]])               # (n=3, k=2)
    order, counts = ex.dispatch_plan(experts, 4, 2)
    assert order.tolist() == [1, 4, 2, 5, 0, 3]                   # by expert, token order within one
    assert counts.tolist() == [2, 1, 1, 2]
    with pytest.raises(ValueError, match="experts must be"):
        ex.dispatch_plan(experts.reshape(-1), 4, 2)


def test_reference_is_the_dense_layer(ref):
    """The one-process reference is MoE's sparse layer; cross-checked against the dense computation."""
    moe = ex.make_moe(CFG)
    X, _ = ex.moe_data(CFG)
    torch.testing.assert_close(ref["Y"], FE.moe_dense(X, moe.params(), moe.top_k), atol=1e-13, rtol=0)


def test_two_ranks_equal_one_process(ref, runs):
    got = [r["expert"] for r in runs]
    for name in ("Y", "dX"):                                      # each rank's rows, in rank order
        torch.testing.assert_close(torch.cat([g[name] for g in got]), ref[name], atol=1e-12, rtol=0, msg=name)
    assert [g["experts_held"] for g in got] == [[0, 1], [2, 3]]
    held = [set(g["grads"]) - {"W_router"} for g in got]
    assert not held[0] & held[1] and held[0] | held[1] | {"W_router"} == set(ref["grads"])
    for g in got:
        assert g["none_elsewhere"]                                # the other rank's experts never ran here
        for n, t in g["grads"].items():                           # the router's summed over ranks
            torch.testing.assert_close(t, ref["grads"][n], atol=1e-12, rtol=0, msg=n)


def test_counts_and_bytes_follow_the_routing(runs):
    """What each rank sent, from the one-process routing of its tokens: k rows per token, 8 bytes a number."""
    moe = ex.make_moe(CFG)
    X, _ = ex.moe_data(CFG)
    _, experts, _ = FE.top_k_router(X, moe.W_router, moe.top_k)
    n, D = X.shape[0] // 2, CFG.d_model
    got = [r["expert"] for r in runs]
    for r, g in enumerate(got):
        mine = experts[r * n:(r + 1) * n]
        assert g["sent"].tolist() == torch.bincount(mine.reshape(-1), minlength=4).tolist()
        away = int(((mine // 2) != r).sum())                      # assignments to the other rank's experts
        assert g["dispatch_bytes"] == away * D * 8 and g["count_bytes"] == 2 * 8
        assert g["combine_bytes"] == got[1 - r]["dispatch_bytes"]  # the outputs go back where they came from
        assert g["received"].tolist() == [got[j]["sent"][2 * r:2 * r + 2].tolist() for j in range(2)]
    assert sum(g["sent"].sum().item() for g in got) == 2 * n * moe.top_k
    assert got[0]["dispatch_bytes"] != got[1]["dispatch_bytes"]     # unequal loads: the counts must travel first


def test_a_wrong_dispatch_order_is_caught(ref):
    """With fork, the workers run this process's code: rows sent unsorted reach the wrong experts."""
    if parallel.default_start_method() != "fork":
        pytest.skip("needs fork to put a bug into the workers")
    mp = pytest.MonkeyPatch()
    real = ex.dispatch_plan
    mp.setattr(ex, "dispatch_plan", lambda e, E, w: (torch.arange(e.numel()), real(e, E, w)[1]))
    try:
        bad = parallel.run_engines(["expert"], CFG, world_size=2, timeout=120)
    finally:
        mp.undo()
    Y = torch.cat([r["expert"]["Y"] for r in bad])
    assert (Y - ref["Y"]).abs().max() > 1e-3


def test_torchrun_runs_the_expert_scheme(runs):
    assert "expert" in parallel.KNOWN_SCHEMES and "expert" not in parallel.SCHEMES   # chapter 18's default set
    tr = parallel.run_torchrun(["expert"], CFG, nproc=2, timeout=180)
    for a, b in zip(tr, runs):
        assert a["backend"] == "gloo" or a["backend"] == "nccl"
        torch.testing.assert_close(a["expert"]["Y"], b["expert"]["Y"], atol=1e-12, rtol=0)


def test_bad_arguments():
    moe = ex.make_moe(CFG)
    with pytest.raises(ValueError, match="world"):
        ex.expert_parallel_moe(torch.zeros(2, CFG.d_model, dtype=torch.float64), moe, 0, 3)
    capped = parallel.expert.MoE(CFG.d_model, CFG.d_ff, 4, 2, capacity_factor=1.0).double()
    with pytest.raises(ValueError, match="dropless"):
        ex.expert_parallel_moe(torch.zeros(2, CFG.d_model, dtype=torch.float64), capped, 0, 2)
