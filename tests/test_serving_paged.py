"""Chapter 20's paged KV cache, continuous batching and GPTQ, cross-checked.

Paged attention over interleaved block tables equals attention over each sequence's contiguous
cache (NumPy and torch, grouped-query); the allocator wastes less than one block per sequence
and reuses freed blocks; the chapter's model served on the paged cache, with continuous and
static batching, gives token for token (and logit for logit) what each request decoded alone
without a cache gives; GPTQ with H = I is round-to-nearest, its first update is the
least-squares correction of the remaining rows, and it lowers the calibration objective.
"""

import numpy as np
import pytest
import torch

import tfbook.numpy as tnp
import tfbook.numpy.serving as S
from tfbook.tasks import prose
from tfbook.tasks import serving as sv
from tfbook.torch import functional as TF

ATOL = 1e-13  # float64 round-off


def _fill(g, lens, num_blocks=16, block_size=4, H_kv=2, D=5):
    alloc = S.BlockAllocator(num_blocks, block_size)
    kc, vc = np.zeros((num_blocks, block_size, H_kv, D)), np.zeros((num_blocks, block_size, H_kv, D + 1))
    K = {s: g.standard_normal((n, H_kv, D)) for s, n in lens.items()}
    V = {s: g.standard_normal((n, H_kv, D + 1)) for s, n in lens.items()}
    for t in range(max(lens.values())):
        for s, n in lens.items():
            if t < n:
                pos = alloc.append(s, 1)
                tnp.paged_write(kc, K[s][t: t + 1], alloc.block_tables([s]), pos)
                tnp.paged_write(vc, V[s][t: t + 1], alloc.block_tables([s]), pos)
    return alloc, kc, vc, K, V


@pytest.mark.parametrize("H", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_paged_attention_equals_contiguous(H, seed):
    g = np.random.default_rng(seed)
    lens = {"a": 7, "b": 10, "c": 1, "d": 4}
    alloc, kc, vc, K, V = _fill(g, lens)
    seqs = list(lens)
    Q = g.standard_normal((4, H, 5))
    Z = tnp.paged_attention(Q, kc, vc, alloc.block_tables(seqs), [lens[s] for s in seqs])
    Zt = TF.paged_attention(torch.as_tensor(Q), torch.as_tensor(kc), torch.as_tensor(vc),
                            torch.as_tensor(alloc.block_tables(seqs)), torch.as_tensor([lens[s] for s in seqs]))
    np.testing.assert_allclose(Zt.numpy(), Z, atol=ATOL, rtol=0)
    for i, s in enumerate(seqs):
        Kc = torch.as_tensor(np.swapaxes(K[s], 0, 1))[:, None]  # (H_kv, 1, n, D)
        Vc = torch.as_tensor(np.swapaxes(V[s], 0, 1))[:, None]
        q = torch.as_tensor(Q[i]).reshape(2, H // 2, 1, 5)  # query heads grouped by their cached head
        ref = torch.nn.functional.scaled_dot_product_attention(q, Kc.expand(-1, H // 2, -1, -1),
                                                               Vc.expand(-1, H // 2, -1, -1))
        np.testing.assert_allclose(Z[i], ref.reshape(H, 6).numpy(), atol=ATOL, rtol=0)


def test_paged_write_torch_equals_numpy():
    g = np.random.default_rng(3)
    tables, pos = np.array([[4, 1, -1], [0, 2, 3], [4, 1, -1]]), np.array([5, 9, 0])
    K = g.standard_normal((3, 2, 3))
    a = tnp.paged_write(np.zeros((5, 4, 2, 3)), K, tables, pos)
    b = TF.paged_write(torch.zeros((5, 4, 2, 3), dtype=torch.float64), torch.as_tensor(K), tables, pos)
    np.testing.assert_array_equal(a, b.numpy())
    np.testing.assert_array_equal(a[1, 1], K[0])  # position 5 -> table[1] = block 1, slot 1
    np.testing.assert_array_equal(a[3, 1], K[1])  # position 9 -> table[2] = block 3, slot 1


def test_allocator_fragmentation_and_reuse():
    A = S.BlockAllocator(10, 4)
    for s, n in (("a", 5), ("b", 8), ("c", 1)):
        A.append(s, n)
    assert A.blocks_in_use() == 2 + 2 + 1 and A.tokens_stored() == 14
    assert 0 <= 4 * A.blocks_in_use() - A.tokens_stored() < 3 * 4
    held = set(A.tables["b"])
    A.release("b")
    A.append("d", 8)
    assert set(A.tables["d"]) == held  # freed blocks are handed out again
    with pytest.raises(ValueError, match="out of blocks"):
        A.append("e", 4 * 6)
    with pytest.raises(ValueError, match="unknown sequence"):
        A.release("zz")


@pytest.fixture(scope="module")
def model():
    return sv.llama_params()


@pytest.mark.parametrize("block_size,max_batch", [(8, 4), (3, 2), (64, 5)])
def test_serving_equals_decoding_alone(model, block_size, max_batch):
    params, cfg = model
    text = prose.data().test.numpy()
    reqs = sv.paged_requests(text, n=6, seed=block_size)
    cont = sv.serve(reqs, params, cfg, max_batch=max_batch, block_size=block_size)
    stat = sv.serve(reqs, params, cfg, max_batch=max_batch, block_size=block_size, static=True)
    for i, r in enumerate(reqs):
        toks, lg = sv.decode_alone(r, params, cfg)
        assert cont["outputs"][i] == toks == stat["outputs"][i]
        np.testing.assert_allclose(np.array(cont["logits"][i]), np.array(lg), atol=1e-10, rtol=0)
    slots, tokens, active = (np.array(cont[k]) for k in ("slots", "tokens", "active"))
    assert np.all((slots - tokens >= 0) & (slots - tokens < active * block_size))
    assert cont["passes"] <= stat["passes"]
    assert max(cont["active"]) <= max_batch


def test_static_pass_count_is_the_sum_of_batch_maxima(model):
    params, cfg = model
    reqs = [dict(arrival=0, prompt=[1, 2, 3], n_out=n) for n in (5, 2, 7, 3, 4)]
    stat = sv.serve(reqs, params, cfg, max_batch=2, block_size=4, static=True)
    cont = sv.serve(reqs, params, cfg, max_batch=2, block_size=4)
    assert stat["passes"] == 5 + 7 + 4  # batches (5, 2), (7, 3), (4)
    # continuous: passes 1-2 hold (5, 2); 7 joins at 3 (ends 9); 3 joins at 6 (ends 8); 4 joins at 9 (ends 12)
    assert cont["passes"] == 12


def _gptq_by_inverses(W, H, bits, g, damp):
    """GPTQ as its derivation states it (the optimal brain surgeon update over the rows not yet
    rounded, with the inverse of H restricted to them recomputed at every row), no Cholesky."""
    W, maxq = W.copy(), 2 ** (bits - 1) - 1
    D = W.shape[0]
    H = H + damp * np.mean(np.diag(H)) * np.eye(D)
    q, scale = np.zeros(W.shape, dtype=np.int8), np.zeros((D // g, W.shape[1]))
    for i in range(D):
        if i % g == 0:
            amax = np.abs(W[i: i + g]).max(axis=0)
            scale[i // g] = np.where(amax > 0, amax / maxq, 1.0)
        q[i] = np.clip(np.rint(W[i] / scale[i // g]), -maxq, maxq)
        e = W[i] - q[i] * scale[i // g]
        Hinv = np.linalg.inv(H[i:, i:])
        W[i + 1:] -= np.outer(Hinv[1:, 0] / Hinv[0, 0], e)
    return q, scale


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gptq_equals_the_obs_update_and_beats_rtn(seed):
    g = np.random.default_rng(seed)
    X = g.standard_normal((200, 16)) @ g.standard_normal((16, 16))
    W, H = g.standard_normal((16, 6)), X.T @ X
    q, s = tnp.gptq_quantize(W, H, bits=3, group_size=8, damp=0.01)
    q2, s2 = _gptq_by_inverses(W, H, 3, 8, 0.01)
    assert np.mean(q == q2) > 0.98  # a rounding boundary may fall either way
    if np.array_equal(q, q2):
        np.testing.assert_allclose(s, s2, atol=1e-10, rtol=0)
    qr, sr = tnp.gptq_quantize(W, np.eye(16), bits=3, group_size=8, damp=0.0)
    loss = lambda Wq: np.sum((X @ (Wq - W)) ** 2)  # noqa: E731
    assert loss(tnp.dequantize(q, s, 8)) < loss(tnp.dequantize(qr, sr, 8))
    qt, st = TF.gptq_quantize(torch.as_tensor(W), torch.as_tensor(H), bits=3, group_size=8)
    assert np.mean(qt.numpy() == q) > 0.98


def test_gptq_with_identity_is_round_to_nearest():
    W = np.random.default_rng(5).standard_normal((64, 9))
    q, s = tnp.gptq_quantize(W, np.eye(64), bits=4, group_size=32, damp=0.0)
    q0, s0 = tnp.quantize_int4(W, 32)
    np.testing.assert_array_equal(q, q0)
    np.testing.assert_array_equal(s, s0)
