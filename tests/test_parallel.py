"""tfbook.parallel: two gloo processes on 127.0.0.1 give the single-process gradients (chapter 18).

One real two-process run with the default start method (fork on CPU-only Linux, spawn where
CUDA is present; module fixture) is shared by most tests below; one more run takes the path of
a CUDA machine, forced (``torch.cuda.is_available`` patched to True: the launcher spawns, each
child imports torch, 5-30 s on 2 busy cores). The rest are in-process.
"""

from __future__ import annotations

import math
import multiprocessing
import sys

import pytest
import torch
import torch.nn.functional as F

from tfbook import parallel

CFG = parallel.DPConfig()


@pytest.fixture(scope="module")
def runs():
    ref = parallel.single_process_run(CFG)
    results = parallel.run_data_parallel(CFG, world_size=2, timeout=240)
    return ref, results


def test_allreduced_gradients_equal_single_process_gradients(runs):
    ref, results = runs
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["grads"].keys() == ref["grads"].keys()
        for n, g in ref["grads"].items():
            assert r["grads"][n].dtype == torch.float64
            # float64 round-off: (a + b) / 2 against autograd's mean over the whole batch
            torch.testing.assert_close(r["grads"][n], g, atol=1e-12, rtol=0, msg=n)
    # the shard losses differ from each other (the shards are different data) ...
    assert abs(results[0]["local_losses"][0] - results[1]["local_losses"][0]) > 1e-3
    # ... and their mean is the full-batch loss
    for step, loss in enumerate(ref["losses"]):
        assert abs(results[0]["losses"][step] - loss) < 1e-12  # float64 round-off


def test_parameters_stay_in_sync_and_match_single_process_training(runs):
    ref, (r0, r1) = runs
    for n, p in ref["params"].items():
        torch.testing.assert_close(r0["params"][n], r1["params"][n], atol=1e-15, rtol=0, msg=n)
        # CFG.steps SGD steps: round-off can grow a little through the updates
        torch.testing.assert_close(r0["params"][n], p, atol=1e-11, rtol=0, msg=n)
    # and training moved them: the check is not comparing two initialisations
    init = parallel.make_model(CFG)
    moved = max((p.detach() - ref["params"][n]).abs().max().item() for n, p in init.named_parameters())
    assert moved > 1e-3


def test_communication_is_timed_apart_from_the_step(runs):
    _, results = runs
    assert {r["start_method"] for r in results} == {parallel.default_start_method()}
    for r in results:
        assert r["world_size"] == 2
        assert 0 < r["comm_seconds"] < r["seconds"]  # the all-reduce takes time, and is part of the step


@pytest.mark.parametrize("world_size", [2, 3])
def test_context_parallel_attention_equals_full_attention(world_size):
    results = parallel.run_context_parallel(CFG, world_size=world_size, timeout=240)
    Q, K, V = parallel.context._attention_data(CFG)
    expected = F.scaled_dot_product_attention(Q, K, V)
    n = CFG.attn_T // world_size
    assert [r["key_rows"] for r in results] == [(k * n, (k + 1) * n) for k in range(world_size)]
    for r in results:
        torch.testing.assert_close(r["attention"], expected, atol=1e-12, rtol=0)  # float64 round-off
        # one rank's keys alone give a different answer: the merge does the work
        assert (r["local_attention"] - expected).abs().max() > 0.1
        assert "grads" not in r  # the context-parallel worker does no data-parallel training


def test_data_parallel_worker_does_no_context_parallelism(runs):
    _, results = runs
    assert all("attention" not in r for r in results)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_gradient_accumulation_equals_the_large_batch(k):
    x, y = parallel.make_batches(CFG)[0]
    big = parallel.make_model(CFG)
    parallel.config._loss(big, x, y).backward()
    acc = parallel.make_model(CFG)
    parallel.accumulate_gradients(acc, x, y, micro_batches=k)
    for (n, p), q in zip(big.named_parameters(), acc.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-12, rtol=0, msg=n)  # float64 round-off
    with pytest.raises(ValueError, match="micro_batches=3"):
        parallel.accumulate_gradients(acc, x, y, micro_batches=3)


def test_gradient_accumulation_without_the_division_is_k_times_too_large():
    x, y = parallel.make_batches(CFG)[0]
    big = parallel.make_model(CFG)
    parallel.config._loss(big, x, y).backward()
    summed = parallel.make_model(CFG)
    for k in range(4):
        parallel.config._loss(summed, parallel.shard(x, k, 4), parallel.shard(y, k, 4)).backward()
    g_big = torch.cat([p.grad.flatten() for p in big.parameters()])
    g_sum = torch.cat([p.grad.flatten() for p in summed.parameters()])
    torch.testing.assert_close(g_sum, 4 * g_big, atol=1e-12, rtol=0)


def test_start_method_is_spawn_wherever_cuda_is_present(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if getattr(torch, "accelerator", None) is not None:
        monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert parallel.default_start_method() == "fork"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert parallel.default_start_method() == "spawn"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert parallel.default_start_method() == "spawn"


def test_default_launcher_on_a_cuda_machine_spawns_and_gives_the_same_gradients(monkeypatch):
    """The path every CUDA machine takes, forced here: this process 'sees' a GPU and has run autograd."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ref = parallel.single_process_run(parallel.DPConfig(steps=1))  # autograd has run in the parent
    results = parallel.run_data_parallel(parallel.DPConfig(steps=1), world_size=2, timeout=240)
    assert [r["start_method"] for r in results] == ["spawn", "spawn"]
    for r in results:
        for n, g in ref["grads"].items():
            torch.testing.assert_close(r["grads"][n], g, atol=1e-12, rtol=0, msg=n)  # float64 round-off


def test_merge_softmax_states_is_exact_for_uneven_splits():
    g = torch.Generator().manual_seed(3)
    Q, K, V = (torch.randn(7, 5, generator=g, dtype=torch.float64) * 4 for _ in range(3))
    K, V = torch.randn(11, 5, generator=g, dtype=torch.float64) * 4, torch.randn(11, 3, generator=g, dtype=torch.float64)
    parts = [parallel.softmax_state(Q, K[a:b], V[a:b]) for a, b in ((0, 1), (1, 7), (7, 11))]
    _, l, acc = parallel.merge_softmax_states(parts)
    torch.testing.assert_close(acc / l, F.scaled_dot_product_attention(Q, K, V), atol=1e-12, rtol=0)
    # a single part is returned unchanged
    m1, l1, a1 = parallel.softmax_state(Q, K, V)
    m2, l2, a2 = parallel.merge_softmax_states([(m1, l1, a1)])
    assert torch.equal(l1, l2) and torch.equal(a1, a2)


def test_shard_splits_contiguously_and_rejects_uneven_batches():
    x = torch.arange(12).reshape(6, 2)
    assert torch.equal(torch.cat([parallel.shard(x, r, 3) for r in range(3)]), x)
    with pytest.raises(ValueError, match="world_size=4"):
        parallel.shard(x, 0, 4)
    with pytest.raises(ValueError, match="rank"):
        parallel.shard(x, 3, 3)


def test_bad_arguments_raise_value_errors():
    with pytest.raises(ValueError, match="batch_size=8"):
        parallel.run_data_parallel(CFG, world_size=3)
    with pytest.raises(ValueError, match="world_size"):
        parallel.run_data_parallel(CFG, world_size=0)
    with pytest.raises(ValueError, match="lr"):
        parallel.DPConfig(lr=0.0)
    with pytest.raises(ValueError, match="batch_size"):
        parallel.DPConfig(batch_size=0)
    with pytest.raises(ValueError, match="start_method"):
        parallel.run_data_parallel(CFG, start_method="thread")
    with pytest.raises(ValueError, match="states"):
        parallel.merge_softmax_states([])
    with pytest.raises(ValueError, match="attn_T"):
        parallel.run_context_parallel(CFG, world_size=CFG.attn_T + 1)
    with pytest.raises(ValueError, match="micro_batches"):
        parallel.accumulate_gradients(parallel.make_model(CFG), *parallel.make_batches(CFG)[0], micro_batches=0)


def test_timeout_kills_every_worker():
    with pytest.raises(TimeoutError):
        parallel.run_data_parallel(CFG, world_size=2, timeout=0.2, start_method="spawn")  # cannot import torch in time
    assert not [p for p in multiprocessing.active_children() if p.is_alive()]


# ---------------------------------------------------------------------------------------
# PyTorch's engines under torchrun (one launch of two processes, every scheme; 15-40 s)
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engines():
    return parallel.run_torchrun(parallel.SCHEMES, CFG, nproc=2, timeout=300)


def test_ddp_equals_one_process_and_the_hand_written_all_reduce(engines, runs):
    ref, hand = runs
    for r in engines:
        d = r["ddp"]
        for n, g in ref["grads"].items():
            torch.testing.assert_close(d["grads"][n], g, atol=1e-12, rtol=0, msg=n)  # float64 round-off
            torch.testing.assert_close(d["grads"][n], hand[r["rank"]]["grads"][n], atol=1e-12, rtol=0, msg=n)
        for n, p in ref["params"].items():
            torch.testing.assert_close(d["params"][n], p, atol=1e-11, rtol=0, msg=n)
        assert len(d["buckets"]) >= 3 and sum(b["tensors"] for b in d["buckets"]) == d["num_tensors"]
        assert sum(b["numel"] for b in d["buckets"]) == sum(g.numel() for g in ref["grads"].values())
        assert d["overlap"]  # the first bucket left before the last gradient was computed
        assert d["no_sync_sent"] == 0 and d["no_sync_buckets_after"] >= 1  # nothing sent under no_sync
        for n, g in ref["grads"].items():  # two micro-batches under no_sync = the whole batch
            torch.testing.assert_close(d["no_sync_grads"][n], g, atol=1e-12, rtol=0, msg=n)


def test_zero1_and_fsdp_train_as_one_process_with_sharded_state(engines):
    ref = parallel.single_process_adamw(CFG)
    n_theta = sum(p.numel() for p in ref["params"].values())
    owned = [r["zero1"]["owned_numel"] for r in engines]
    assert sum(owned) == n_theta and max(owned) < n_theta
    for r in engines:
        for scheme in ("zero1", "fsdp"):
            for n, p in ref["params"].items():  # Adam divides by sqrt(v): round-off of 1e-16 grows to ~1e-12
                torch.testing.assert_close(r[scheme]["params"][n], p, atol=1e-10, rtol=0, msg=f"{scheme} {n}")
        z, f = r["zero1"], r["fsdp"]
        assert z["state_bytes"] == 2 * 8 * z["owned_numel"]  # exp_avg and exp_avg_sq of its own parameters
        assert z["param_bytes"] == z["grad_bytes"] == 8 * n_theta  # ZeRO-1 keeps these whole
        local = sum(f["local_numel"].values())
        bound = sum(math.ceil(s[0] / 2) * math.prod(s[1:]) for s in f["shapes"].values())
        assert local <= bound and f["param_bytes"] == f["grad_bytes"] == 8 * local
        assert f["state_bytes"] == 2 * 8 * local
    assert sum(sum(r["fsdp"]["local_numel"].values()) for r in engines) == n_theta


def test_tensor_parallel_block_equals_the_whole_block(engines):
    block, X = parallel.tp_data(CFG)
    X.requires_grad_(True)
    G = torch.randn((2, CFG.block_size, CFG.d_model), dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    Y = block(X)
    Y.backward(G)
    for r in engines:
        t = r["tp"]
        torch.testing.assert_close(t["Y"], Y, atol=1e-12, rtol=0)
        torch.testing.assert_close(t["dX"], X.grad, atol=1e-12, rtol=0)
        for n, p in block.named_parameters():
            torch.testing.assert_close(t["grads"][n], p.grad, atol=1e-12, rtol=0, msg=n)
        assert t["local_numel"]["attn_q.weight"] * 2 == block.attn_q.weight.numel()
        assert t["comm_forward"] == {"c10d_functional.all_reduce": 2}
        assert t["comm_backward"] == {"c10d_functional.all_reduce": 4}


def test_ring_attention_equals_full_attention_without_holding_the_sequence(engines):
    Q, K, V = parallel.ring_data(CFG)
    full = {"Z": F.scaled_dot_product_attention(Q, K, V, is_causal=True),
            "Z_noncausal": F.scaled_dot_product_attention(Q, K, V)}
    for r in engines:
        lo, hi = r["ring"]["rows"]
        assert hi - lo == CFG.attn_T // 2 and r["ring"]["rows_held"] < CFG.attn_T
        for key, Z in full.items():
            torch.testing.assert_close(r["ring"][key], Z[..., lo:hi, :], atol=1e-12, rtol=0, msg=key)


def test_run_torchrun_rejects_bad_arguments():
    with pytest.raises(ValueError, match="schemes"):
        parallel.run_torchrun(["zero3"])
    with pytest.raises(ValueError, match="nproc"):
        parallel.run_torchrun(["ddp"], nproc=0)
    cmd = parallel.torchrun_command(["ddp", "tp"], "/tmp/x", CFG, nproc=2)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert cmd[cmd.index("--schemes") + 1] == "ddp,tp"


def test_run_engines_gives_torchrun_results_and_runs_this_process_code(engines, monkeypatch):
    """The launcher the chapter's mutations rerun a scheme with: same results as torchrun; with fork,
    a function redefined in its engine's module (tfbook.parallel.context) is the one the workers run (the ring scheme: 0.2 s)."""
    mine = parallel.run_engines(["ring"], CFG, world_size=2, timeout=120)
    for r, t in zip(mine, engines):
        assert r["rank"] == t["rank"] and r["ring"]["rows"] == t["ring"]["rows"]
        torch.testing.assert_close(r["ring"]["Z"], t["ring"]["Z"], atol=1e-12, rtol=0)
    if parallel.default_start_method() == "fork":
        monkeypatch.setattr(parallel.context, "ring_attention", lambda q, k, v, rank, world, causal=True, chunks=4:
                            (torch.zeros_like(q), -1))
        assert all(r["ring"]["rows_held"] == -1 for r in parallel.run_engines(["ring"], CFG, 2, timeout=120))
    with pytest.raises(ValueError, match="schemes"):
        parallel.run_engines(["zero3"])


def test_ddp_buckets_follow_the_documented_rule_on_the_order_they_were_filled(engines):
    cap = int(0.01 * 2**20)  # _ddp_scheme's bucket_cap_mb=0.01, in bytes
    for r in engines:
        buckets = r["ddp"]["buckets"]
        arrival = [8 * n for b in buckets for n in b["sizes"]]  # float64 gradients, in bucketing order
        assert [len(b) for b in parallel.ddp_buckets(arrival[::-1], cap)] == [b["tensors"] for b in buckets]


def test_collectives_of_one_step_are_counted(engines):
    """DDP: one all-reduce per bucket; ZeRO-1 (ZeroRedundancyOptimizer under DDP): one all-reduce and a
    broadcast per parameter tensor; FSDP2: all-gathers of the L blocks twice and the root once, a
    reduce-scatter per group."""
    n_tensors = len(list(parallel.make_model(CFG).parameters()))
    for r in engines:
        assert r["ddp"]["step_comm"] == {"c10d.allreduce_": len(r["ddp"]["buckets"])}
        assert r["zero1"]["step_comm"] == {"c10d.allreduce_": 1, "c10d.broadcast_": n_tensors}
        assert r["fsdp"]["step_comm"] == {"c10d._allgather_base_": 2 * CFG.num_layers + 1,
                                          "c10d._reduce_scatter_base_": CFG.num_layers + 1}


def test_bytes_of_one_step_are_measured(engines):
    """The bytes the counted collectives carry (the whole tensor each works on): DDP's all-reduces
    and ZeRO-1's broadcasts each carry every parameter once (ZeRO-1: 1.5 x DDP's ring traffic);
    FSDP2 gathers the blocks twice and the root once, its shards padded to whole rows per rank."""
    model = parallel.make_model(CFG)
    b8 = 8 * sum(p.numel() for p in model.parameters())
    for r in engines:
        assert r["ddp"]["step_bytes"] == {"c10d.allreduce_": b8}
        assert r["zero1"]["step_bytes"] == {"c10d.allreduce_": b8, "c10d.broadcast_": b8}
        padded = {n: -(-s[0] // 2) * 2 * math.prod(s[1:]) * 8 for n, s in r["fsdp"]["shapes"].items()}
        blocks = sum(v for n, v in padded.items() if n.startswith("blocks."))
        root = sum(padded.values()) - blocks
        assert r["fsdp"]["step_bytes"] == {"c10d._allgather_base_": 2 * blocks + root,
                                           "c10d._reduce_scatter_base_": blocks + root}
        assert r["fsdp"]["step_bytes"]["c10d._reduce_scatter_base_"] >= b8


_CP_SCRIPT = '''
import torch, torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
q, k, v = (torch.randn(1, 2, 24, 8, dtype=torch.float64) for _ in range(3))
try:
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    print("CP-RAN")
except NotImplementedError as e:
    print("CP-NOT-IMPLEMENTED", str(e).split(" does not")[0])
dist.destroy_process_group()
'''


def test_context_parallel_does_not_run_on_the_cpu(tmp_path):
    """Chapter 18 (c066) says PyTorch's context_parallel raises NotImplementedError on two gloo CPU
    ranks (the CPU attention kernel has no sharding strategy): when a release supports it, this
    fails, and the page should check the ring against it."""
    import os
    import subprocess
    import sys

    script = tmp_path / "cp.py"
    script.write_text(_CP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHELASTIC_ERROR_FILE": ""}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script)], capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CP-")]
    assert lines == ["CP-NOT-IMPLEMENTED Operator aten._scaled_dot_product_flash_attention_for_cpu.default"] * 2, lines


def test_steptime_scheme_times_real_data_parallel_steps(monkeypatch):
    """Chapter 18's step-time measurement (scheme 'steptime'): every figure present and positive, one
    per batch size, and the timed data-parallel steps train as the one-process steps do (float64)."""
    if parallel.default_start_method() == "fork":  # the workers run this process's code: two small batches
        monkeypatch.setattr(parallel.ddp, "STEPTIME_BATCHES", (2, 4))
    batches = parallel.ddp.STEPTIME_BATCHES
    out = parallel.run_engines(["steptime"], CFG, world_size=2, timeout=180)
    for r in out:
        s = r["steptime"]
        assert s["tokens"] == [b * CFG.block_size for b in batches]
        assert s["num_params"] == sum(p.numel() for p in parallel.make_model(CFG).parameters())
        for k in ("full_cpu", "full_wall", "shard_cpu", "step_wall", "allreduce"):
            assert len(s[k]) == len(batches) and all(v > 0 for v in s[k]), k
        assert max(s["param_gap"]) < 1e-12  # float64 round-off of a sum in another order, over 3 steps
    assert "steptime" in parallel.KNOWN_SCHEMES and "steptime" not in parallel.SCHEMES
