"""Chapter 20's components (tfbook.numpy.serving and its torch twin), cross-checked.

NumPy == torch (float64); multi-head latent attention against Hugging Face's DeepSeek-V3
attention with copied weights (skipped where transformers is absent), absorbed == unabsorbed,
the cache shapes; the rotary frequencies against closed forms and against Hugging Face's YaRN;
quantisation error within half a step of its scale; the speculative rule's output
distribution equal to the target's exactly, one token by the closed form and several tokens
by enumerating every draft and every accept/reject outcome; bad input.
"""

import math

import numpy as np
import pytest
import torch

import tfbook.numpy as tnp
import tfbook.numpy.serving as S
from tfbook.tasks import serving as sv
from tfbook.torch import functional as TF

ATOL = 1e-12  # float64 round-off (different summation orders)


def mla_params(g, D=32, H=4, D_c=8, D_R=4, D_nope=6, D_V=5, D_cq=None):
    n = lambda *s: g.standard_normal(s) / math.sqrt(s[0])  # noqa: E731
    p = {"W_DKV": n(D, D_c), "gamma_KV": 1 + 0.1 * g.standard_normal(D_c), "W_KR": n(D, D_R),
         "W_UK": n(D_c, H * D_nope), "W_UV": n(D_c, H * D_V), "W_O": n(H * D_V, D)}
    if D_cq is None:
        p["W_Q"] = n(D, H * (D_nope + D_R))
    else:
        p.update(W_DQ=n(D, D_cq), gamma_Q=1 + 0.1 * g.standard_normal(D_cq), W_UQ=n(D_cq, H * (D_nope + D_R)))
    return p


def _t(x):
    if isinstance(x, dict):
        return {k: _t(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_t(v) for v in x]
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def _np(x):
    if isinstance(x, (tuple, list)):
        return [_np(v) for v in x]
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _pq(g, shape, V):
    p, q = g.dirichlet(np.ones(V), size=shape), g.dirichlet(np.ones(V) * 0.5, size=shape)
    return p, q


PARITY_CASES = {
    "rope_frequencies": lambda g: ((16,), dict(scaling="yarn", factor=4.0, original_length=64)),
    "rope_rotate": lambda g: ((g.standard_normal((2, 3, 7, 8)), g.uniform(0.01, 1, 4)),
                              dict(positions=np.arange(7) * 3.0, layout="interleaved")),
    "mla_cache": lambda g: ((g.standard_normal((2, 7, 32)), mla_params(g)), {}),
    "mla_attention": lambda g: ((g.standard_normal((2, 7, 32)), mla_params(g, D_cq=12), 4),
                                dict(mask=np.tril(np.ones((7, 7), dtype=bool)), absorb=True)),
    "quantize_int8": lambda g: ((g.standard_normal((6, 5)),), dict(axis=-1)),
    "quantize_int4": lambda g: ((g.standard_normal((8, 5)),), dict(group_size=4)),
    "dequantize": lambda g: ((g.integers(-7, 8, (8, 5)).astype(np.int8), g.uniform(0.1, 1, (2, 5))),
                             dict(group_size=4)),
    "speculative_accept": lambda g: (_pq(g, (6,), 5) + (g.integers(0, 5, 6), g.uniform(size=6)), {}),
    "speculative_distribution": lambda g: (_pq(g, (3, 4), 6), {}),
    "paged_write": lambda g: ((np.zeros((5, 4, 2, 3)), g.standard_normal((3, 2, 3)),
                               np.array([[4, 1, -1], [0, 2, 3], [4, 1, -1]]), np.array([5, 9, 0])), {}),
    "paged_attention": lambda g: ((g.standard_normal((3, 4, 3)), g.standard_normal((5, 4, 2, 3)),
                                   g.standard_normal((5, 4, 2, 6)), np.array([[4, 1, -1], [0, 2, 3], [3, -1, -1]]),
                                   np.array([6, 12, 1])), {}),
    "gptq_quantize": lambda g: (_gptq_case(g), dict(bits=3, group_size=4)),
}


def _gptq_case(g):
    X = g.standard_normal((40, 8)) @ g.standard_normal((8, 8))
    return g.standard_normal((8, 5)), X.T @ X


#: the same cases in the form of tests/test_backends_parity.py: name -> [builder(g) -> (args, kwargs, torch_extra)]
BACKEND_PARITY_CASES = {name: [lambda g, b=b: (*b(g), {})] for name, b in PARITY_CASES.items()}


def test_every_component_has_a_parity_case():
    assert set(PARITY_CASES) == set(S.__all__)
    # the block allocator is plain Python bookkeeping, one class (not re-exported) shared by both backends
    assert TF.serving.BlockAllocator is S.BlockAllocator


@pytest.mark.parametrize("name", sorted(PARITY_CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_numpy_equals_torch(name, seed):
    args, kwargs = PARITY_CASES[name](np.random.default_rng(seed))
    a = getattr(tnp, name)(*args, **kwargs)
    b = getattr(TF, name)(*_t(list(args)), **{k: _t(v) for k, v in kwargs.items()})
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    for x, y in zip(a, b):
        if isinstance(x, float):
            assert abs(x - y) <= ATOL
            continue
        y = _np(y)
        assert x.shape == y.shape and (x.dtype == y.dtype), (x.dtype, y.dtype)
        np.testing.assert_allclose(x.astype(np.float64), y.astype(np.float64), atol=ATOL, rtol=0)


# ------------------------------------------------------------------ multi-head latent attention


@pytest.mark.parametrize("D_cq", [None, 12])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_absorbed_equals_unabsorbed(D_cq, layout):
    g = np.random.default_rng(3)
    X, p = g.standard_normal((2, 9, 32)), mla_params(g, D_cq=D_cq)
    mask = np.tril(np.ones((9, 9), dtype=bool))
    for backend, conv in ((tnp, lambda x: x), (TF, _t)):
        Z0, P0 = _np(backend.mla_attention(conv(X), conv(p), 4, mask=conv(mask), layout=layout))
        Z1, P1 = _np(backend.mla_attention(conv(X), conv(p), 4, mask=conv(mask), layout=layout, absorb=True))
        np.testing.assert_allclose(Z1, Z0, atol=ATOL, rtol=0)
        np.testing.assert_allclose(P1, P0, atol=ATOL, rtol=0)
    # and a change of the latent's weights changes the output (the check can fail)
    q = dict(p, W_UK=p["W_UK"] * (1 + 1e-6))
    assert not np.allclose(tnp.mla_attention(X, q, 4, mask=mask)[0],
                           tnp.mla_attention(X, p, 4, mask=mask)[0], atol=1e-12, rtol=0)


def test_mla_cache_is_what_attention_reads():
    g = np.random.default_rng(4)
    X, p = g.standard_normal((9, 32)), mla_params(g)
    C, K_R = tnp.mla_cache(X, p)
    assert C.shape == (9, 8) and K_R.shape == (9, 4)
    # the rms of each latent row times gamma: rms_norm's definition
    np.testing.assert_allclose(C, (X @ p["W_DKV"]) / np.sqrt(np.mean((X @ p["W_DKV"]) ** 2, -1, keepdims=True) + 1e-6)
                               * p["gamma_KV"], atol=ATOL)
    # the first token's rotary key is unrotated (position 0)
    np.testing.assert_allclose(K_R[0], X[0] @ p["W_KR"], atol=ATOL)


def test_mla_scores_depend_on_positions_only_through_offsets():
    g = np.random.default_rng(5)
    X, p = g.standard_normal((6, 32)), mla_params(g)
    a = tnp.mla_attention(X, p, 4, positions=np.arange(6.0))[1]
    b = tnp.mla_attention(X, p, 4, positions=np.arange(6.0) + 17)[1]
    np.testing.assert_allclose(a, b, atol=ATOL)
    c = tnp.mla_attention(X, p, 4, positions=np.arange(6.0) * 2)[1]
    assert np.abs(a - c).max() > 1e-3


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("B", [3, 4])  # B = H = 4 once: a rotation along the heads axis would not raise there
def test_mla_per_sequence_positions_equal_per_sequence_calls(B, absorb):
    """Positions of shape (B, T) give each sequence its own offsets: the batched call equals B calls."""
    g = np.random.default_rng(6)
    X, p = g.standard_normal((B, 6, 32)), mla_params(g, D_cq=12)
    pos = np.arange(6.0) * (1 + np.arange(B)[:, None]) + 5.0 * np.arange(B)[:, None]  # (B, T): own start and stride
    mask = np.tril(np.ones((6, 6), dtype=bool))
    for backend, conv in ((tnp, lambda x: x), (TF, _t)):
        Z, P = _np(backend.mla_attention(conv(X), conv(p), 4, mask=conv(mask), positions=conv(pos), absorb=absorb))
        C, K_R = _np(backend.mla_cache(conv(X), conv(p), positions=conv(pos)))
        for b in range(B):
            Zb, Pb = _np(backend.mla_attention(conv(X[b]), conv(p), 4, mask=conv(mask), positions=conv(pos[b]),
                                               absorb=absorb))
            np.testing.assert_allclose(Z[b], Zb, atol=ATOL, rtol=0)
            np.testing.assert_allclose(P[b], Pb, atol=ATOL, rtol=0)
            Cb, K_Rb = _np(backend.mla_cache(conv(X[b]), conv(p), positions=conv(pos[b])))
            np.testing.assert_allclose(K_R[b], K_Rb, atol=ATOL, rtol=0)
        # the positions matter: sequence 1 with sequence 0's strides attends differently
        P0 = _np(backend.mla_attention(conv(X[1]), conv(p), 4, mask=conv(mask), positions=conv(pos[0]))[1])
        assert np.abs(P0 - P[1]).max() > 1e-3


@pytest.mark.parametrize("q_lora_rank", [None, 12])
def test_mla_equals_hugging_face_deepseek_v3_attention(q_lora_rank):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (peer check only)")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as M

    D, H, D_c, D_R, D_nope, D_V, T = 32, 4, 8, 4, 6, 5, 9
    cfg = transformers.DeepseekV3Config(hidden_size=D, num_attention_heads=H, num_key_value_heads=H,
                                        q_lora_rank=q_lora_rank, kv_lora_rank=D_c, qk_rope_head_dim=D_R,
                                        qk_nope_head_dim=D_nope, v_head_dim=D_V, num_hidden_layers=1,
                                        vocab_size=11, attention_bias=False, rope_interleave=True)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    attn = M.DeepseekV3Attention(cfg, layer_idx=0).double().eval()
    with torch.no_grad():
        for prm in attn.parameters():
            prm.normal_(0, 0.3)
    W = lambda lin: lin.weight.detach().numpy().T  # noqa: E731  (nn.Linear stores the transpose)
    kv_a, kv_b = W(attn.kv_a_proj_with_mqa), W(attn.kv_b_proj).reshape(D_c, H, D_nope + D_V)
    p = {"W_DKV": kv_a[:, :D_c], "W_KR": kv_a[:, D_c:], "gamma_KV": attn.kv_a_layernorm.weight.detach().numpy(),
         "W_UK": kv_b[:, :, :D_nope].reshape(D_c, H * D_nope), "W_UV": kv_b[:, :, D_nope:].reshape(D_c, H * D_V),
         "W_O": W(attn.o_proj)}
    if q_lora_rank is None:
        p["W_Q"] = W(attn.q_proj)
    else:
        p.update(W_DQ=W(attn.q_a_proj), gamma_Q=attn.q_a_layernorm.weight.detach().numpy(), W_UQ=W(attn.q_b_proj))
    X = np.random.default_rng(6).standard_normal((2, T, D))
    omega = tnp.rope_frequencies(D_R, cfg.rope_parameters["rope_theta"])
    ang = np.arange(T)[:, None] * omega  # the rotary table in float64 (HF builds it in float32)
    emb = torch.from_numpy(np.concatenate([ang, ang], -1))[None]
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    eps = attn.kv_a_layernorm.variance_epsilon
    with torch.no_grad():
        Z_hf, P_hf = attn(torch.from_numpy(X), (emb.cos(), emb.sin()), causal)
    mask = np.tril(np.ones((T, T), dtype=bool))
    for absorb in (False, True):
        Z, P = tnp.mla_attention(X, p, H, mask=mask, absorb=absorb, eps=eps)
        # HF's RMSNorm computes in float32 whatever the weights' dtype: float32 round-off, not float64's
        np.testing.assert_allclose(Z, Z_hf.numpy(), atol=1e-6, rtol=0)
        np.testing.assert_allclose(P, P_hf.numpy(), atol=1e-6, rtol=0)
    # a swapped split of kv_b (values first) is caught
    bad = dict(p, W_UK=kv_b[:, :, D_nope - D_V:].reshape(D_c, H, -1)[:, :, :D_nope].reshape(D_c, H * D_nope)
               if D_nope <= D_V else np.roll(p["W_UK"], 1, axis=1))
    assert np.abs(tnp.mla_attention(X, bad, H, mask=mask, eps=eps)[0] - Z_hf.numpy()).max() > 1e-3


# ------------------------------------------------------------------ rotary frequencies


def test_rope_rotate_equals_the_books_two_rope_layouts():
    g = np.random.default_rng(7)
    X = g.standard_normal((3, 10, 8))
    omega = tnp.rope_frequencies(8, 500.0)
    np.testing.assert_allclose(tnp.rope_rotate(X, omega, layout="interleaved"), tnp.rope(X, base=500.0), atol=ATOL)
    np.testing.assert_allclose(tnp.rope_rotate(X, omega, layout="half"), tnp.rope_rotate_half(X, base=500.0),
                               atol=ATOL)


def test_frequency_closed_forms():
    D_K, base, s = 16, 10000.0, 4.0
    w = tnp.rope_frequencies(D_K, base)
    np.testing.assert_allclose(w, base ** (-np.arange(0, D_K, 2) / D_K), rtol=1e-15)
    pi = tnp.rope_frequencies(D_K, base, "pi", s)
    np.testing.assert_allclose(pi, w / s, rtol=1e-15)
    ntk = tnp.rope_frequencies(D_K, base, "ntk", s)
    assert ntk[0] == 1.0 and abs(ntk[-1] - w[-1] / s) <= 1e-15 * w[-1]  # fastest kept, slowest / factor
    assert np.all((ntk <= w) & (ntk >= w / s - 1e-18))
    y = tnp.rope_frequencies(D_K, base, "yarn", s, original_length=64)
    assert y[0] == w[0] and abs(y[-1] - w[-1] / s) <= 1e-15 * w[-1]


@pytest.mark.parametrize("factor,length", [(4.0, 64), (8.0, 4096), (2.0, 256)])
def test_yarn_equals_hugging_face(factor, length):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (peer check only)")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    D_K = 64
    cfg = transformers.LlamaConfig(hidden_size=D_K * 2, num_attention_heads=2, max_position_embeddings=int(length * factor),
                                   rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": factor,
                                                    "original_max_position_embeddings": length})
    inv, att = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    omega = tnp.rope_frequencies(D_K, 10000.0, "yarn", factor, original_length=length)
    np.testing.assert_allclose(omega, inv.double().numpy(), rtol=2e-6)  # HF computes in float32
    from tfbook.tasks.serving import yarn_attention_factor
    assert abs(yarn_attention_factor(factor) - att) < 1e-6
    lin, _ = ROPE_INIT_FUNCTIONS["linear"](transformers.LlamaConfig(
        hidden_size=D_K * 2, num_attention_heads=2,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": factor}), "cpu")
    np.testing.assert_allclose(tnp.rope_frequencies(D_K, 10000.0, "pi", factor), lin.double().numpy(), rtol=2e-6)


# ------------------------------------------------------------------ quantisation


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quantisation_error_within_half_a_step(seed):
    g = np.random.default_rng(seed)
    W = g.standard_normal((64, 24)) * g.uniform(0.1, 3, 24)
    q, s = tnp.quantize_int8(W)
    assert q.dtype == np.int8 and s.shape == (1, 24) and np.abs(q).max() == 127
    err = np.abs(tnp.dequantize(q, s) - W)
    assert np.all(err <= s / 2 * (1 + 1e-12))
    assert err.max() > 0.3 * s.max() / 2  # the bound is nearly reached on 64 rows
    q4, s4 = tnp.quantize_int4(W, 16)
    assert s4.shape == (4, 24) and np.abs(q4).max() == 7
    err4 = np.abs(tnp.dequantize(q4, s4, 16) - W)
    assert np.all(err4 <= np.repeat(s4, 16, axis=0) / 2 * (1 + 1e-12))
    assert err4.mean() > err.mean() * 8  # 4 bits: a step about 127 / 7 = 18 times coarser (groups help a little)


def test_int8_kv_cache_per_token():
    g = np.random.default_rng(8)
    K = g.standard_normal((2, 4, 10, 16)) * np.arange(1, 11)[:, None]  # tokens of very different norms
    q, s = tnp.quantize_int8(K, axis=-1)
    assert s.shape == (2, 4, 10, 1)
    assert np.all(np.abs(tnp.dequantize(q, s) - K) <= s / 2 * (1 + 1e-12))


# ------------------------------------------------------------------ speculative decoding


def test_one_step_distribution_is_the_targets():
    g = np.random.default_rng(9)
    p, q = _pq(g, (50,), 7)
    np.testing.assert_allclose(tnp.speculative_distribution(p, q), p, atol=1e-15)
    np.testing.assert_allclose(_np(TF.speculative_distribution(_t(p), _t(q))), p, atol=1e-15)
    np.testing.assert_allclose(tnp.speculative_distribution(p, p), p, atol=1e-15)  # nothing rejected


def test_accept_rule_frequency():
    g = np.random.default_rng(10)
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.6, 0.2])
    u = np.linspace(0, 1, 10_000, endpoint=False)
    acc, r = tnp.speculative_accept(np.broadcast_to(p, (10_000, 3)), np.broadcast_to(q, (10_000, 3)),
                                    np.ones(10_000, dtype=np.int64), u)
    assert acc.mean() == 0.5  # exactly min(1, 0.3 / 0.6) on an even grid of u
    np.testing.assert_allclose(r[0], [1.0, 0.0, 0.0])
    del g


_enumerate = sv.speculative_sequence_distribution


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_speculative_sequences_are_distributed_as_the_target_exactly(gamma):
    g = np.random.default_rng(11)
    V, n = 3, 4
    p_tab, q_tab = g.dirichlet(np.ones(V), V), g.dirichlet(np.ones(V), V)
    dist = _enumerate(p_tab, q_tab, 0, gamma, n + 1)
    assert len(dist) == V ** n and abs(sum(dist.values()) - 1) < 1e-14
    for seq, pr in dist.items():
        target = np.prod([p_tab[a, b] for a, b in zip(seq[:-1], seq[1:])])
        assert abs(pr - target) <= 1e-14, (seq, pr, target)  # float64 round-off over thousands of paths
    # the rule written the wrong way round (accept with min(1, q/p)) gives another distribution
    wrong = _enumerate(p_tab, q_tab, 0, gamma, n + 1, accept=lambda px, qx: min(1.0, qx / px))
    assert max(abs(wrong[k] - dist[k]) for k in dist) > 1e-3


@pytest.mark.parametrize("gamma,alpha,rounds", [(2, 0.71, 550), (4, 0.73, 420), (8, 0.73, 350)])
def test_tokens_per_pass_standard_error_against_a_simulation(gamma, alpha, rounds):
    """The delta-method standard error of (measured - closed form) against 4,000 simulated runs of
    the closed form's own model (independent acceptances): equal within 5% (the simulated standard
    deviation itself has a relative error of about 1 / sqrt(2 * 4000) = 1.1%)."""
    g = np.random.default_rng(12)
    gaps = []
    for _ in range(4000):
        ok = g.random((rounds, gamma)) < alpha
        acc = np.where(ok.all(1), gamma, np.argmin(ok, 1))  # proposals kept before the first rejection
        tried = np.minimum(acc + 1, gamma)
        gaps.append(1 + acc.mean() - float(sv.expected_tokens_per_pass(acc.sum() / tried.sum(), gamma)))
    se = sv.tokens_per_pass_standard_error(alpha, gamma, rounds)
    assert abs(np.std(gaps) / se - 1) < 0.05, (np.std(gaps), se)
    assert abs(np.mean(gaps)) < 3 * se / math.sqrt(4000) + 2 * se ** 2  # no first-order bias
    assert sv.tokens_per_pass_standard_error(alpha, 1, rounds) == 0  # T_d = 1: an identity


@pytest.mark.parametrize("gamma", [2, 4, 8])
def test_closed_form_runs_ahead_when_the_rate_varies(gamma):
    """Half the rounds at rate 0.9, half at 0.5 (exact expectations, no sampling): the closed form
    at the pooled rate (accepted over tested) exceeds the mean tokens per pass, the sign chapter 20
    measures."""
    f = lambda a: float(sv.expected_tokens_per_pass(a, gamma))  # noqa: E731
    rates = (0.9, 0.5)
    accepted = np.mean([f(a) - 1 for a in rates])  # E k = a + ... + a^gamma
    tested = np.mean([(1 - a ** gamma) / (1 - a) for a in rates])  # E t = 1 + a + ... + a^(gamma-1)
    assert f(accepted / tested) > 1 + accepted + 0.01


def test_tokens_per_pass_standard_error_bad_input():
    with pytest.raises(ValueError, match="0 <= alpha < 1"):
        sv.tokens_per_pass_standard_error(1.0, 2, 10)


# ------------------------------------------------------------------ bad input


BAD = [
    (lambda B: B.rope_frequencies(7), "D_K=7 must be even"),
    (lambda B: B.rope_frequencies(8, scaling="linear"), "scaling must be one of"),
    (lambda B: B.rope_frequencies(8, scaling="yarn", factor=2.0), "original_length"),
    (lambda B: B.rope_frequencies(8, factor=0.5), "factor must be >= 1"),
    (lambda B: B.quantize_int4(_z(B, (10, 4)), 4), "group_size=4 does not divide D_in=10"),
    (lambda B: B.quantize_int8(_z(B, (3, 4)), axis=2), "axis=2 is out of range"),
    (lambda B: B.dequantize(_z(B, (8, 4)), _z(B, (2, 4)), 4), "q must hold integers"),
    (lambda B: B.speculative_distribution(_z(B, (3,)) + 1 / 3, _z(B, (4,)) + 0.25), "same shape"),
    (lambda B: B.speculative_distribution(_z(B, (3,)) + 0.5, _z(B, (3,)) + 1 / 3), "p must be probability"),
    (lambda B: B.mla_attention(_z(B, (5, 30)), _conv(B, mla_params(np.random.default_rng(0))), 4),
     "params['W_DKV'] must have shape (D, D_c) = (30, ?)"),
    (lambda B: B.mla_attention(_z(B, (5, 32)), _conv(B, mla_params(np.random.default_rng(0))), 3),
     "num_heads=3 does not divide"),
    (lambda B: B.mla_attention(_z(B, (5, 32)), _conv(B, {k: v for k, v in mla_params(np.random.default_rng(0)).items()
                                                        if k != "W_Q"}), 4), "missing keys"),
    (lambda B: B.paged_attention(_z(B, (2, 4, 3)), _z(B, (5, 4, 2, 3)), _z(B, (5, 4, 2, 3)), np.zeros((3, 2), int),
                                 np.ones(3, int)), "block_tables must have shape (N, max_blocks) with N = 2"),
    (lambda B: B.paged_attention(_z(B, (2, 4, 3)), _z(B, (5, 4, 2, 3)), _z(B, (5, 4, 2, 3)), np.zeros((2, 2), int),
                                 np.array([1, 9])), "lengths must lie in [1, max_blocks * block_size = 8]"),
    (lambda B: B.paged_attention(_z(B, (2, 3, 3)), _z(B, (5, 4, 2, 3)), _z(B, (5, 4, 2, 3)), np.zeros((2, 2), int),
                                 np.ones(2, int)), "Q's H = 3 heads must be a multiple of the cache's H_kv = 2"),
    (lambda B: B.paged_attention(_z(B, (2, 4, 3)), _z(B, (5, 4, 2, 3)), _z(B, (5, 4, 2, 3)), np.array([[0, 7], [1, 2]]),
                                 np.array([8, 8])), "block_tables must name blocks in [0, num_blocks=5)"),
    (lambda B: B.paged_attention(_z(B, (2, 4, 3)), _z(B, (5, 4, 2, 3)), _z(B, (5, 3, 2, 3)), np.zeros((2, 2), int),
                                 np.ones(2, int)), "v_cache must have shape (num_blocks, block_size, H_kv, D_V)"),
    (lambda B: B.paged_write(_z(B, (5, 4, 2, 3)), _z(B, (2, 3, 3)), np.zeros((2, 2), int), np.zeros(2, int)),
     "K_new must have H_kv = 2 heads"),
    (lambda B: B.paged_write(_z(B, (5, 4, 2, 3)), _z(B, (2, 2, 3)), np.zeros((2, 2), int), np.zeros(3, int)),
     "lengths (or positions) must have shape (N,) = (2,)"),
    (lambda B: B.gptq_quantize(_z(B, (8, 4)), _z(B, (4, 4))), "H must have shape (D_in, D_in) = (8, 8)"),
    (lambda B: B.gptq_quantize(_z(B, (10, 4)), _z(B, (10, 10)), group_size=4), "group_size=4 does not divide D_in=10"),
    (lambda B: B.gptq_quantize(_z(B, (8, 4)), _z(B, (8, 8)), bits=1), "bits"),
]


def _z(B, shape):
    return np.zeros(shape) if B is tnp else torch.zeros(shape, dtype=torch.float64)


def _conv(B, p):
    return p if B is tnp else _t(p)


@pytest.mark.parametrize("backend", [tnp, TF], ids=["numpy", "torch"])
@pytest.mark.parametrize("i", range(len(BAD)))
def test_bad_input_raises_value_error(backend, i):
    fn, words = BAD[i]
    with pytest.raises(ValueError, match=None) as e:
        fn(backend)
    assert words in str(e.value), str(e.value)
