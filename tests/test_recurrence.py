"""Chapter 23's components: tfbook.numpy.recurrence against its torch twin, the forms of each
recurrence against one another (quadratic == recurrent == chunked, float64 round-off), the delta
rule against a gradient step taken by autograd, and both against independent implementations
with copied inputs: Hugging Face transformers' Qwen3-Next gated-delta-rule functions (chunked and
recurrent) and Mamba-2's ``segment_sum`` and SSD torch path (skipped with the reason where
transformers is absent)."""

import math

import numpy as np
import pytest
import torch

from tfbook.numpy import recurrence as N
from tfbook.torch import recurrence as M
from tfbook.torch.functional import recurrence as T

NAMES = ["segsum", "linear_attention_quadratic", "linear_attention_recurrent", "linear_attention_chunked",
         "delta_rule_recurrent", "delta_rule_chunked"]
EPS = 1e-12  # float64 round-off over sums of at most a few hundred terms of size ~1


def _inputs(seed=0, lead=(2, 3), T_=29, DK=6, DV=4):
    g = np.random.default_rng(seed)
    Q, K, V = g.standard_normal((*lead, T_, DK)), g.standard_normal((*lead, T_, DK)), g.standard_normal((*lead, T_, DV))
    K = K / np.linalg.norm(K, axis=-1, keepdims=True)
    beta = g.uniform(0.05, 1.0, (*lead, T_))
    logdecay = -g.uniform(0.0, 0.4, (*lead, T_))
    return Q, K, V, beta, logdecay


def _t(x):
    return None if x is None else torch.as_tensor(x)


def test_names_are_the_same_in_both_twins():
    assert set(N.__all__) == set(T.__all__) == set(NAMES)
    assert {c[0] for c in CASES} == set(NAMES)


@pytest.mark.parametrize("gated", [False, True])
def test_linear_attention_forms_agree(gated):
    Q, K, V, _, g = _inputs()
    g = g if gated else None
    Zq = N.linear_attention_quadratic(Q, K, V, g)
    Zr, Sr = N.linear_attention_recurrent(Q, K, V, g)
    np.testing.assert_allclose(Zr, Zq, atol=EPS, rtol=0)
    for c in (1, 4, 7, 29, 64):
        Zc, Sc = N.linear_attention_chunked(Q, K, V, g, chunk_size=c)
        np.testing.assert_allclose(Zc, Zr, atol=EPS, rtol=0)
        np.testing.assert_allclose(Sc, Sr, atol=EPS, rtol=0)
    # the last state is the sum of decayed outer products (closed form)
    L = np.exp(N.segsum(g))[..., -1, :] if gated else np.ones(Q.shape[:-1])
    np.testing.assert_allclose(Sr, np.einsum("...t,...ti,...tj->...ij", L, K, V), atol=EPS, rtol=0)


@pytest.mark.parametrize("gated", [False, True])
def test_delta_rule_chunked_equals_recurrent(gated):
    Q, K, V, beta, g = _inputs(1)
    g = g if gated else None
    Zr, Sr = N.delta_rule_recurrent(Q, K, V, beta, g)
    for c in (1, 3, 8, 29, 40):
        Zc, Sc = N.delta_rule_chunked(Q, K, V, beta, g, chunk_size=c)
        np.testing.assert_allclose(Zc, Zr, atol=EPS, rtol=0)
        np.testing.assert_allclose(Sc, Sr, atol=EPS, rtol=0)


@pytest.mark.parametrize("name", ["linear_attention_recurrent", "linear_attention_chunked",
                                  "delta_rule_recurrent", "delta_rule_chunked"])
def test_state_carries_a_sequence_in_two_pieces(name):
    Q, K, V, beta, g = _inputs(2)
    fn = getattr(N, name)
    delta = name.startswith("delta")
    args = (lambda s: (Q[..., s, :], K[..., s, :], V[..., s, :]) + ((beta[..., s],) if delta else ()))
    Z, S = fn(*args(slice(None)), g=g)
    Z1, S1 = fn(*args(slice(0, 11)), g=g[..., :11])
    Z2, S2 = fn(*args(slice(11, None)), g=g[..., 11:], S0=S1)
    np.testing.assert_allclose(np.concatenate([Z1, Z2], axis=-2), Z, atol=EPS, rtol=0)
    np.testing.assert_allclose(S2, S, atol=EPS, rtol=0)


def test_delta_rule_is_a_gradient_step_on_the_squared_error():
    Q, K, V, beta, g = _inputs(3, lead=(), T_=9)
    S = torch.zeros(K.shape[-1], V.shape[-1], dtype=torch.float64)
    for t in range(9):
        S = (math.exp(g[t]) * S).detach().requires_grad_(True)
        loss = 0.5 * ((S.T @ torch.as_tensor(K[t]) - torch.as_tensor(V[t])) ** 2).sum()
        loss.backward()
        S = S - beta[t] * S.grad
    _, S_rule = N.delta_rule_recurrent(Q, K, V, beta, g)
    np.testing.assert_allclose(S_rule, S.detach().numpy(), atol=EPS, rtol=0)


def test_delta_rule_with_beta_one_stores_the_last_pair_exactly():
    Q, K, V, _, _ = _inputs(4, lead=(), T_=5)
    _, S = N.delta_rule_recurrent(Q, K, V, np.ones(5))
    np.testing.assert_allclose(S.T @ K[-1], V[-1], atol=EPS, rtol=0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("gated", [False, True])
def test_numpy_and_torch_twins_agree(name, gated):
    Q, K, V, beta, g = _inputs(5)
    if name == "segsum":
        np.testing.assert_allclose(T.segsum(_t(g)).numpy(), N.segsum(g), atol=EPS, rtol=0)
        return
    args = (Q, K, V) + ((beta,) if name.startswith("delta") else ())
    kw = {"g": g if gated else None}
    a, b = getattr(N, name)(*args, **kw), getattr(T, name)(*map(_t, args), g=_t(kw["g"]))
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        assert y.dtype == torch.float64
        np.testing.assert_allclose(y.numpy(), x, atol=EPS, rtol=0)


@pytest.mark.parametrize("name", NAMES[1:])
def test_dtype_is_kept(name):
    Q, K, V, beta, g = (x.astype(np.float32) for x in _inputs(6))
    args = (Q, K, V) + ((beta,) if name.startswith("delta") else ())
    out = getattr(N, name)(*args, g=g)
    tout = getattr(T, name)(*map(_t, args), g=_t(g))
    assert (out[0] if isinstance(out, tuple) else out).dtype == np.float32
    assert (tout[0] if isinstance(tout, tuple) else tout).dtype == torch.float32


def test_torch_twin_has_gradients_through_the_chunked_form():
    Q, K, V, beta, g = (torch.as_tensor(x).requires_grad_(True) for x in _inputs(7, lead=(2,), T_=12))
    Zc, _ = T.delta_rule_chunked(Q, K, V, beta, g, chunk_size=5)
    Zr, _ = T.delta_rule_recurrent(Q, K, V, beta, g)
    grads_c = torch.autograd.grad(Zc.square().sum(), (Q, K, V, beta, g))
    grads_r = torch.autograd.grad(Zr.square().sum(), (Q, K, V, beta, g))
    for a, b in zip(grads_c, grads_r):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_ssm_scan_is_masked_attention_with_a_semiseparable_mask():
    """Mamba-2's scalar-decay SSM h_t = a_t h_{t-1} + B_t x_t^T, y_t = h_t^T C_t, scanned in a loop,
    equals the quadratic form with L = exp(segsum(log a))."""
    g = np.random.default_rng(8)
    T_, N_, P = 17, 5, 3
    X, B, C = g.standard_normal((T_, P)), g.standard_normal((T_, N_)), g.standard_normal((T_, N_))
    log_a = -g.uniform(0, 1, T_)
    h, Y = np.zeros((N_, P)), []
    for t in range(T_):
        h = np.exp(log_a[t]) * h + np.outer(B[t], X[t])
        Y.append(h.T @ C[t])
    np.testing.assert_allclose(N.linear_attention_quadratic(C, B, X, log_a), np.array(Y), atol=EPS, rtol=0)
    L = np.exp(N.segsum(log_a))
    assert np.allclose(np.triu(L, 1), 0) and np.allclose(np.diag(L), 1)
    i, j = 9, 4
    assert math.isclose(L[i, j], math.prod(math.exp(x) for x in log_a[j + 1:i + 1]), rel_tol=1e-13)


# --- peers: Hugging Face transformers (Qwen3-Next, Mamba-2) -------------------------------------



def _peer(module):
    try:
        return __import__(f"transformers.models.{module}.modeling_{module}", fromlist=["_"])
    except Exception as e:  # pragma: no cover - environment without transformers
        pytest.skip(f"transformers' {module} not importable ({type(e).__name__}: {e})")


@pytest.mark.parametrize("which", ["torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"])
@pytest.mark.parametrize("gated", [False, True])
def test_equals_hugging_face_qwen3_next_gated_delta_rule(which, gated):
    """Qwen3-Next's functions take (B, T, H, D) tensors, L2-normalise q and k when asked, always scale
    q by 1/sqrt(D_K), read g as the log-decay, and compute in float32; with those conventions
    applied to our inputs, the outputs and final states agree to float32 round-off."""
    peer = getattr(_peer("qwen3_next"), which)
    g = np.random.default_rng(9)
    B, T_, H, DK, DV = 2, 45, 3, 8, 5
    q, k, v = g.standard_normal((B, T_, H, DK)), g.standard_normal((B, T_, H, DK)), g.standard_normal((B, T_, H, DV))
    beta = g.uniform(0.05, 1.0, (B, T_, H))
    logdecay = -g.uniform(0.0, 0.5, (B, T_, H)) if gated else np.zeros((B, T_, H))
    kw = {"chunk_size": 16} if "chunk" in which else {}
    out, S = peer(*(torch.tensor(x, dtype=torch.float32) for x in (q, k, v, logdecay, beta)),
                  output_final_state=True, use_qk_l2norm_in_kernel=True, **kw)
    # ours: heads in front, q and k normalised, q scaled (float64)
    qh, kh, vh = (np.moveaxis(x, 2, 1) for x in (q, k, v))
    qh, kh = (x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6) for x in (qh, kh))
    Z, S_ours = N.delta_rule_chunked(qh / np.sqrt(DK), kh, vh, np.moveaxis(beta, 2, 1),
                                     np.moveaxis(logdecay, 2, 1) if gated else None, chunk_size=16)
    np.testing.assert_allclose(np.moveaxis(out.double().numpy(), 1, 2), Z, atol=2e-5, rtol=0)  # float32 round-off
    np.testing.assert_allclose(S.double().numpy(), S_ours, atol=2e-5, rtol=0)


def test_segsum_equals_mamba2_segment_sum():
    peer = _peer("mamba2").segment_sum
    g = -np.random.default_rng(10).uniform(0, 1, (3, 4, 19))
    theirs, ours = peer(torch.tensor(g)).numpy(), N.segsum(g)
    assert (np.isneginf(theirs) == np.isneginf(ours)).all()
    fin = np.isfinite(ours)
    np.testing.assert_allclose(theirs[fin], ours[fin], atol=EPS, rtol=0)


def test_equals_mamba2_chunk_scan():
    """Mamba-2's torch path (``mamba2_chunk_scan``: chunked SSD, what its mixer calls without a
    cache) against our quadratic masked form and our recurrence with copied inputs. Its
    conventions: x (B, T, H, P), dt (B, T, H) discretising both the input (x dt) and the decay
    (a_t = exp(A dt_t), A < 0 per head), B and C (B, T, G, N) shared by the heads of a group,
    float32 inside, final state (B, H, P, N): ours transposed."""
    peer = _peer("mamba2").mamba2_chunk_scan
    g = np.random.default_rng(11)
    Bt, T_, H, P, Nst = 2, 23, 3, 4, 5
    x, dt = g.standard_normal((Bt, T_, H, P)), g.uniform(0.05, 0.8, (Bt, T_, H))
    A = -g.uniform(0.2, 1.5, H)
    Bm, Cm = g.standard_normal((Bt, T_, 1, Nst)), g.standard_normal((Bt, T_, 1, Nst))
    out, state = peer(*(torch.tensor(v, dtype=torch.float32) for v in (x, dt, A, Bm, Cm)), chunk_size=8,
                      return_final_states=True)
    # ours, heads in front: Q = C, K = B, V = x dt, log-decay g = A dt
    Ch, Bh = (np.broadcast_to(np.moveaxis(m, 2, 1), (Bt, H, T_, Nst)) for m in (Cm, Bm))
    V, logdecay = np.moveaxis(x * dt[..., None], 2, 1), np.moveaxis(dt * A, 2, 1)
    Z = N.linear_attention_quadratic(Ch, Bh, V, logdecay)
    _, S = N.linear_attention_recurrent(Ch, Bh, V, logdecay)
    np.testing.assert_allclose(np.moveaxis(out.double().numpy(), 1, 2), Z, atol=2e-5, rtol=0)  # float32 round-off
    np.testing.assert_allclose(state.double().numpy(), np.swapaxes(S, -1, -2), atol=2e-5, rtol=0)


# --- the models ----------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["linear", "delta", "gated_delta", "hybrid"])
def test_recall_stack_chunked_equals_recurrent(model):
    from tfbook.tasks import recurrence as task

    torch.manual_seed(0)
    net = M.RecallStack(M.RecurrenceConfig(layout=task.MODELS[model], chunk_size=5)).double().eval()
    keys, vals, asked = task.batch("base", np.random.default_rng(0), 8)
    with torch.no_grad():
        a, b = net(keys, vals, asked), net(keys, vals, asked, recurrent=True)
    torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_mixer_softmax_equals_torch_sdpa():
    torch.manual_seed(1)
    m = M.Mixer("softmax", 12, 4).double()
    X = torch.randn(3, 7, 12, dtype=torch.float64)
    Q, K, V = m.W_Q(X), m.W_K(X), m.W_V(X)
    ref = m.W_O(torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=True))
    torch.testing.assert_close(m(X), ref, atol=1e-12, rtol=0)


def test_model_rejects_bad_configs_and_inputs():
    with pytest.raises(ValueError, match=r"layout must be a non-empty tuple of kinds"):
        M.RecurrenceConfig(layout=("mamba",))
    with pytest.raises(ValueError, match=r"n_pairs must be <= n_keys"):
        M.RecurrenceConfig(n_keys=4, n_pairs=5)
    with pytest.raises(ValueError, match=r"kind must be one of"):
        M.Mixer("rnn", 4, 2)
    net = M.RecallStack(M.RecurrenceConfig())
    with pytest.raises(ValueError, match=r"keys and vals must be \(B, N\) and asked \(B,\), got keys \(2, 12\), "
                                         r"vals \(2, 11\), asked \(2,\)"):
        net(torch.zeros(2, 12, dtype=torch.long), torch.zeros(2, 11, dtype=torch.long), torch.zeros(2, dtype=torch.long))


def test_retrieval_batch_is_chapter_17s_generator_at_its_sizes():
    from tfbook.tasks import recall
    from tfbook.tasks import recurrence as task

    a = recall.recall_batch(np.random.default_rng(5), 50)
    b = task.retrieval_batch(np.random.default_rng(5), 50, recall.N_KEYS, recall.N_VALS, recall.N_PAIRS)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


# --- bad input: the same ValueError in both twins --------------------------------------------------

_g = np.random.default_rng(0)


def _r(*shape):
    return _g.standard_normal(shape)


CASES: list = [
    ("segsum", (_r(),), {}, r"g must have at least 1 axes \(\.\.\., T\), got shape \(\)"),
    ("linear_attention_quadratic", (_r(2, 5, 4), _r(2, 5, 3), _r(2, 5, 3)), {},
     r"Q and K must have the same shape \(\.\.\., T, D_K\), got Q \(2, 5, 4\) and K \(2, 5, 3\)"),
    ("linear_attention_quadratic", (_r(5), _r(5), _r(5)), {}, r"Q must be \(\.\.\., T, D\), got shape \(5,\)"),
    ("linear_attention_recurrent", (_r(2, 5, 4), _r(2, 5, 4), _r(2, 6, 3)), {},
     r"V must be \(\.\.\., T, D_V\) = \(2, 5\) \+ \(D_V,\) to match K \(2, 5, 4\), got V \(2, 6, 3\)"),
    ("linear_attention_recurrent", (_r(2, 5, 4), _r(2, 5, 4), _r(2, 5, 3)), {"g": _r(2, 4)},
     r"g must be \(\.\.\., T\) = \(2, 5\) to match K \(2, 5, 4\), got g \(2, 4\)"),
    ("linear_attention_chunked", (_r(2, 5, 4), _r(2, 5, 4), _r(2, 5, 3)), {"chunk_size": 0},
     r"chunk_size must be an integer >= 1, got 0"),
    ("linear_attention_chunked", (_r(2, 5, 4), _r(2, 5, 4), _r(2, 5, 3)), {"S0": _r(2, 3, 4)},
     r"S0 must be \(\.\.\., D_K, D_V\) = \(2, 4, 3\) for K \(2, 5, 4\) and V \(2, 5, 3\), got S0 \(2, 3, 4\)"),
    ("delta_rule_recurrent", (_r(2, 5, 4), _r(2, 5, 4), _r(2, 5, 3), _r(2, 5, 1)), {},
     r"beta must be \(\.\.\., T\) = \(2, 5\) to match K \(2, 5, 4\), got beta \(2, 5, 1\)"),
    ("delta_rule_chunked", (_r(2, 5, 4), _r(2, 5, 4), _r(2, 5, 3), _r(2, 5)), {"chunk_size": 2.5},
     r"chunk_size must be an integer, got 2.5"),
    ("delta_rule_chunked", (np.array(["a"]), _r(2, 5, 4), _r(2, 5, 3), _r(2, 5)), {},
     r"Q must be floating point"),
]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("name,args,kwargs,pattern", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_raises_value_error_naming_it(backend, name, args, kwargs, pattern):
    fn = getattr(N if backend == "numpy" else T, name)
    if backend == "torch":
        if any(isinstance(a, np.ndarray) and a.dtype.kind == "U" for a in args):
            args = (torch.tensor([1, 2]),) + tuple(args[1:])
        args = tuple(torch.as_tensor(a) if isinstance(a, np.ndarray) else a for a in args)
        kwargs = {k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=pattern):
        fn(*args, **kwargs)
