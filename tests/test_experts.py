"""Chapter 19's components (tfbook.numpy.experts and its torch twin, tfbook.torch.experts), cross-checked.

NumPy == torch (float64); the sparse layer == the dense computation that masks the unchosen
experts; the capacity rule == a token-by-token loop; the balance loss == its closed forms and
Hugging Face's ``load_balancing_loss_func``; the layer == Hugging Face's
``MixtralSparseMoeBlock`` built from a ``MixtralConfig`` with random weights and our weights
copied in (skipped where transformers is absent); LoRA's adapted path == the merged weight to
float64 round-off, on one matrix and on a whole model.
"""

import math

import numpy as np
import pytest
import torch

import tfbook.numpy as tnp
import tfbook.numpy.experts as M
import tfbook.torch as tt
from tfbook.torch import functional as TF
from tfbook.torch.experts import MoE, MoELM, MoELMConfig, LoRALinear, add_lora, lora_parameters, merge_lora
from tfbook.torch.modern import LlamaLM, LlamaLMConfig

import error_cases_experts
from conftest import to_torch

ATOL = 1e-12  # float64 round-off (different summation orders)


def _sw(g, D, F):
    return {"W_gate": g.standard_normal((D, F)) / math.sqrt(D), "W_up": g.standard_normal((D, F)) / math.sqrt(D),
            "W_down": g.standard_normal((F, D)) / math.sqrt(F)}


def _moe(g, D=8, E=4, F=12, shared=0):
    return {"W_router": g.standard_normal((D, E)), "experts": [_sw(g, D, F) for _ in range(E)],
            "shared": _sw(g, D, shared) if shared else None}


def _probs_experts(g, N=40, E=4, k=2):
    w, e, p = tnp.top_k_router(g.standard_normal((N, 6)), g.standard_normal((6, E)), k)
    return p, e


# name -> builders g -> (args, kwargs, torch_extra); the format of tests/test_backends_parity.py
PARITY_CASES = {
    "top_k_router": [lambda g, k=k: ((g.standard_normal((2, 5, 8)), g.standard_normal((8, 4)), k), {}, {})
                     for k in (1, 2, 4)],
    "load_balancing_loss": [lambda g: (_probs_experts(g), {}, {}), lambda g: (_probs_experts(g, 30, 8, 1), {}, {})],
    "router_z_loss": [lambda g: ((3 * g.standard_normal((2, 7, 5)),), {}, {})],
    "biased_top_k_router": [lambda g, k=k: ((g.standard_normal((2, 5, 8)), g.standard_normal((8, 4)), k,
                                             0.3 * g.standard_normal(4)), {}, {}) for k in (1, 2)],
    "balance_bias_update": [lambda g: ((g.standard_normal(6), g.integers(0, 6, (20, 2)), 0.01), {}, {})],
    "expert_capacity": [lambda g: ((64, 8, 2, 1.25), {}, {})],
    "moe": [lambda g, cf=cf, sh=sh: ((g.standard_normal((2, 9, 8)), _moe(g, shared=sh), 2),
                                     {"capacity_factor": cf}, {})
            for cf, sh in ((None, 0), (1.0, 0), (0.5, 10), (None, 10))],
    "moe_dense": [lambda g, sh=sh: ((g.standard_normal((2, 9, 8)), _moe(g, shared=sh), 2), {}, {}) for sh in (0, 6)],
    "lora_linear": [lambda g: ((g.standard_normal((2, 5, 8)), g.standard_normal((8, 6)), g.standard_normal((8, 3)),
                                g.standard_normal((3, 6)), 6.0), {}, {})],
    "lora_merge": [lambda g: ((g.standard_normal((8, 6)), g.standard_normal((8, 3)), g.standard_normal((3, 6)), 1.5),
                              {}, {})],
}
PARITY_IDS = [(n, i) for n, bs in PARITY_CASES.items() for i in range(len(bs))]


def _tensors(x):
    """conftest's to_torch on arrays and parameter dicts; Python scalars (k, a capacity factor, alpha) stay numbers."""
    return x if np.isscalar(x) else to_torch(x)


def _same(a, b, atol=ATOL):
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _same(a[k], b[k], atol)
    elif isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y, atol)
    elif isinstance(a, (int, np.integer)) and not isinstance(a, np.ndarray):
        assert int(a) == int(b)
    else:
        y = b.detach().cpu().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
        assert y.shape == np.shape(a), (y.shape, np.shape(a))
        if np.asarray(a).dtype.kind in "biu":
            np.testing.assert_array_equal(y, a)
        else:
            np.testing.assert_allclose(y, a, rtol=0, atol=atol)


def test_every_component_has_parity_and_error_cases():
    assert set(PARITY_CASES) == set(M.__all__)
    assert {c[0] for c in error_cases_experts.CASES} == set(M.__all__)
    for name in M.__all__:  # re-exported by both backends
        assert getattr(tnp, name) is getattr(M, name) and getattr(tt, name) is getattr(TF, name)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name,i", PARITY_IDS, ids=[f"{n}-{i}" for n, i in PARITY_IDS])
def test_numpy_equals_torch(name, i, seed):
    g = np.random.default_rng(seed)
    args, kwargs, extra = PARITY_CASES[name][i](g)
    out_np = getattr(tnp, name)(*args, **kwargs)
    out_t = getattr(TF, name)(*map(_tensors, args), **{n: _tensors(v) for n, v in kwargs.items()}, **extra)
    _same(out_np, out_t)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("name,args,kwargs,pattern", error_cases_experts.CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(error_cases_experts.CASES)])
def test_bad_input_raises_value_error_naming_it(backend, name, args, kwargs, pattern):
    fn = getattr(tnp if backend == "numpy" else TF, name)
    if backend == "torch":
        args, kwargs = tuple(map(_tensors, args)), {n: _tensors(v) for n, v in kwargs.items()}
    with pytest.raises(ValueError, match=pattern):
        fn(*args, **kwargs)


# ----------------------------------------------------------------------------- the router


@pytest.mark.parametrize("k", [1, 2, 3])
def test_router_keeps_the_k_largest_probabilities_renormalised(k):
    g = np.random.default_rng(k)
    X, W = g.standard_normal((50, 8)), g.standard_normal((8, 5))
    w, e, p = tnp.top_k_router(X, W, k)
    logits = X @ W
    ref_p = np.exp(logits - logits.max(-1, keepdims=True))
    ref_p /= ref_p.sum(-1, keepdims=True)  # softmax written out
    np.testing.assert_allclose(p, ref_p, rtol=0, atol=1e-15)
    order = np.array([sorted(range(5), key=lambda j: -row[j])[:k] for row in logits])  # by logits, not probs
    np.testing.assert_array_equal(e, order)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=0, atol=1e-15)
    top = np.take_along_axis(ref_p, order, -1)
    np.testing.assert_allclose(w, top / top.sum(-1, keepdims=True), rtol=0, atol=1e-15)


def test_router_with_k_equal_E_is_the_softmax_itself():
    g = np.random.default_rng(0)
    w, e, p = tnp.top_k_router(g.standard_normal((7, 4)), g.standard_normal((4, 6)), 6)
    np.testing.assert_allclose(w, np.take_along_axis(p, e, -1), rtol=0, atol=1e-15)


# ----------------------------------------------------------------------------- the layer


@pytest.mark.parametrize("shared", [0, 10])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_sparse_layer_equals_dense_layer_with_unchosen_experts_masked(k, shared):
    g = np.random.default_rng(k + shared)
    X, p = g.standard_normal((3, 11, 8)), _moe(g, shared=shared)
    Y, routing = tnp.moe(X, p, k)
    # a third computation: every expert on every token, gates built from a loop
    ref = np.zeros_like(X)
    for idx in np.ndindex(X.shape[:-1]):
        w, e = routing["weights"][idx], routing["experts"][idx]
        ref[idx] = sum(w[j] * tnp.swiglu(X[idx], p["experts"][e[j]]) for j in range(k))
        if shared:
            ref[idx] += tnp.swiglu(X[idx], p["shared"])
    np.testing.assert_allclose(Y, ref, rtol=0, atol=ATOL)
    np.testing.assert_allclose(tnp.moe_dense(X, p, k), Y, rtol=0, atol=ATOL)
    Yt = TF.moe_dense(to_torch(X), to_torch(p), k)
    np.testing.assert_allclose(Yt.numpy(), Y, rtol=0, atol=ATOL)
    assert routing["dropped"] == 0 and routing["load"].sum() == k * 33


def test_dense_layer_differs_when_an_unchosen_expert_is_not_masked():
    """The check above can fail: gates of one for every expert give another output."""
    g = np.random.default_rng(0)
    X, p = g.standard_normal((2, 5, 8)), _moe(g)
    everything = sum(tnp.swiglu(X, e) for e in p["experts"]) / 4
    assert np.abs(everything - tnp.moe(X, p, 2)[0]).max() > 1e-3


def _keep_loop(experts, E, C):
    """The capacity rule token by token: first choices in token order, then second choices."""
    N, k = experts.shape
    used, kept = [0] * E, np.zeros((N, k), bool)
    for j in range(k):
        for n in range(N):
            e = experts[n, j]
            if used[e] < C:
                used[e] += 1
                kept[n, j] = True
    return kept


@pytest.mark.parametrize("cf", [0.25, 0.5, 1.0, 1.25, 2.0])
def test_capacity_drops_what_a_token_by_token_loop_drops(cf):
    g = np.random.default_rng(int(cf * 100))
    X, p = g.standard_normal((4, 16, 8)), _moe(g)
    p["W_router"][:, 0] += 1.0  # expert 0 popular: some of its assignments must be dropped
    Y, routing = tnp.moe(X, p, 2, capacity_factor=cf)
    C = math.ceil(cf * 2 * 64 / 4)
    assert tnp.expert_capacity(64, 4, 2, cf) == C
    kept = _keep_loop(routing["experts"].reshape(-1, 2), 4, C)
    np.testing.assert_array_equal(routing["kept"].reshape(-1, 2), kept)
    assert routing["dropped"] == 128 - kept.sum()
    assert (routing["load"] <= C).all()
    # the output: the dense computation with the dropped gates set to zero
    G = np.zeros((64, 4))
    e2, w2 = routing["experts"].reshape(-1, 2), routing["weights"].reshape(-1, 2)
    for n in range(64):
        for j in range(2):
            G[n, e2[n, j]] += w2[n, j] * kept[n, j]
    X2 = X.reshape(-1, 8)
    ref = sum(G[:, e:e + 1] * tnp.swiglu(X2, p["experts"][e]) for e in range(4))
    np.testing.assert_allclose(Y.reshape(-1, 8), ref, rtol=0, atol=ATOL)
    Yt, rt = TF.moe(to_torch(X), to_torch(p), 2, capacity_factor=cf)
    _same(routing, rt)
    np.testing.assert_allclose(Yt.numpy(), Y, rtol=0, atol=ATOL)


def test_capacity_examples():
    assert tnp.expert_capacity(64, 8, 2, 1.0) == 16  # k N / E
    assert tnp.expert_capacity(64, 8, 2, 1.25) == 20
    assert tnp.expert_capacity(10, 4, 1, 1.0) == 3  # ceil(2.5)
    g = np.random.default_rng(0)
    X, p = g.standard_normal((64, 8)), _moe(g)
    assert tnp.moe(X, p, 2, capacity_factor=4.0)[1]["dropped"] == 0  # C = k N: nothing can be dropped


# ----------------------------------------------------------------------------- the balance loss


def test_balance_loss_closed_forms():
    E, N = 8, 64
    uniform = np.full((N, E), 1 / E)
    even = np.arange(N)[:, None] % E  # k = 1, every expert N / E tokens
    assert abs(float(tnp.load_balancing_loss(uniform, even)) - 1.0) < 1e-15  # its minimum, 1
    collapsed = np.zeros((N, E))
    collapsed[:, 0] = 1.0
    assert abs(float(tnp.load_balancing_loss(collapsed, np.zeros((N, 1), np.int64))) - E) < 1e-15  # the worst, E
    even2 = np.stack([np.arange(N) % E, (np.arange(N) + 1) % E], 1)  # k = 2: minimum k
    assert abs(float(tnp.load_balancing_loss(uniform, even2)) - 2.0) < 1e-15
    g = np.random.default_rng(0)
    p, e = _probs_experts(g, 100, 6, 2)
    f = np.array([(e == j).sum() for j in range(6)]) / 100
    assert abs(float(tnp.load_balancing_loss(p, e)) - 6 * f @ p.mean(0)) < 1e-14


def test_balance_loss_trains_the_router_through_the_mean_probabilities():
    g = np.random.default_rng(0)
    X, W = torch.tensor(g.standard_normal((32, 8))), torch.tensor(g.standard_normal((8, 4)), requires_grad=True)
    _, e, p = TF.top_k_router(X, W, 2)
    TF.load_balancing_loss(p, e).backward()
    assert W.grad is not None and W.grad.abs().max() > 0


# ----------------------------------------------------------------------------- z-loss, balancing without a loss


def test_router_z_loss_closed_form_and_gradient():
    E = 8
    for c in (0.0, 2.0, -3.0):  # equal logits c: logsumexp = c + ln E
        assert abs(float(tnp.router_z_loss(np.full((5, 3, E), c))) - (c + math.log(E)) ** 2) < 1e-12
    g = np.random.default_rng(1)
    L = g.standard_normal((40, E))
    assert abs(float(tnp.router_z_loss(L)) - np.mean(np.log(np.exp(L).sum(-1)) ** 2)) < 1e-12
    assert np.isfinite(float(tnp.router_z_loss(np.full((2, E), 1e4))))  # no overflow
    Lt = torch.tensor(L, requires_grad=True)  # its gradient shrinks the logits' log-sum-exp
    TF.router_z_loss(Lt).backward()
    lse = torch.logsumexp(Lt.detach(), -1, keepdim=True)
    torch.testing.assert_close(Lt.grad, 2 * lse * torch.softmax(Lt.detach(), -1) / 40, rtol=0, atol=1e-12)


def test_router_z_loss_equals_hugging_face_switch_transformers():
    st = pytest.importorskip("transformers.models.switch_transformers.modeling_switch_transformers",
                             reason="transformers is not installed (peer check only)")
    L = torch.tensor(np.random.default_rng(2).standard_normal((3, 11, 8)))
    torch.testing.assert_close(TF.router_z_loss(L), st.router_z_loss_func(L), rtol=0, atol=1e-12)


def test_biased_router_chooses_by_the_bias_and_gates_without_it():
    g = np.random.default_rng(3)
    X, W = g.standard_normal((50, 6)), g.standard_normal((6, 5))
    w0, e0, p0 = tnp.top_k_router(X, W, 2)
    w1, e1, p1 = tnp.biased_top_k_router(X, W, 2, np.zeros(5))
    np.testing.assert_array_equal(e1, e0)  # bias 0 is the plain router
    np.testing.assert_allclose(w1, w0, rtol=0, atol=1e-15)
    bias = np.array([0.0, 0.0, 10.0, 0.0, 0.0])  # a large bias: expert 2 is everyone's choice
    w2, e2, p2 = tnp.biased_top_k_router(X, W, 2, bias)
    assert (e2 == 2).any(-1).all()
    np.testing.assert_allclose(p2, p0, rtol=0, atol=0)  # the probabilities are untouched
    top = np.take_along_axis(p0, e2, -1)
    np.testing.assert_allclose(w2, top / top.sum(-1, keepdims=True), rtol=0, atol=1e-15)  # gates: unbiased, renormalised


def test_bias_updates_balance_a_skewed_router():
    g = np.random.default_rng(4)
    X = g.standard_normal((512, 8))
    X[:, 0] = 1.0  # a constant feature, whose router row skews every token's logits:
    W = g.standard_normal((8, 6))
    W[0] = [2.0, 0, 0, 0, 0, -1.0]  # expert 0 favoured, expert 5 shunned
    bias = np.zeros(6)
    load0 = np.bincount(tnp.biased_top_k_router(X, W, 2, bias)[1].ravel(), minlength=6)
    for _ in range(300):
        bias = tnp.balance_bias_update(bias, tnp.biased_top_k_router(X, W, 2, bias)[1], 0.002)
    load = np.bincount(tnp.biased_top_k_router(X, W, 2, bias)[1].ravel(), minlength=6)
    assert load0.max() / load0.mean() > 1.5 and load.max() / load.mean() < 1.05, (load0, load)
    np.testing.assert_array_equal(tnp.balance_bias_update(np.zeros(3), np.array([[0], [1], [2]]), 0.5), np.zeros(3))
    np.testing.assert_array_equal(tnp.balance_bias_update(np.zeros(3), np.array([[0], [0], [1]]), 0.5),
                                  [-0.5, 0.0, 0.5])  # mean load 1: expert 0 over, 1 at the mean, 2 under


def test_moe_with_a_bias_routes_by_the_biased_router_in_both_backends():
    g = np.random.default_rng(5)
    p, X = _moe(g, D=8, E=4, F=12), g.standard_normal((3, 7, 8))
    bias = np.array([0.0, 0.3, -0.2, 0.1])
    Y, routing = tnp.moe(X, p, 2, bias=bias)
    w, e, _ = tnp.biased_top_k_router(X, p["W_router"], 2, bias)
    np.testing.assert_array_equal(routing["experts"], e)
    np.testing.assert_allclose(routing["weights"], w, rtol=0, atol=0)
    assert (e != tnp.top_k_router(X, p["W_router"], 2)[1]).any()  # the bias changed some choices
    Yt, rt = TF.moe(to_torch(X), to_torch(p), 2, bias=torch.tensor(bias))
    np.testing.assert_allclose(Yt.numpy(), Y, rtol=0, atol=ATOL)
    np.testing.assert_array_equal(rt["experts"].numpy(), e)
    Y0, _ = tnp.moe(X, p, 2, bias=np.zeros(4))  # bias 0 is the plain layer
    np.testing.assert_allclose(Y0, tnp.moe(X, p, 2)[0], rtol=0, atol=0)


def test_moe_module_z_loss_and_bias_buffer():
    torch.manual_seed(0)
    layer = MoE(8, 12, 4, top_k=2, router_bias=True).double()
    assert torch.equal(layer.bias, torch.zeros(4, dtype=torch.float64)) and "bias" in layer.state_dict()
    assert "bias" not in MoE(8, 12, 4).state_dict()  # old checkpoints load unchanged
    X = torch.randn(5, 6, 8, dtype=torch.float64)
    with torch.no_grad():
        layer.bias.copy_(torch.tensor([0.0, 0.5, -0.5, 0.0]))
    layer.train()
    Y = layer(X)
    Yf, routing = TF.moe(X, layer.params(), 2, bias=layer.bias)
    torch.testing.assert_close(Y, Yf, rtol=0, atol=0)
    torch.testing.assert_close(layer.z_loss, TF.router_z_loss(X @ layer.W_router), rtol=0, atol=0)
    load = torch.bincount(routing["experts"].reshape(-1), minlength=4).double()
    before = layer.bias.clone()
    layer.update_bias(0.01)
    torch.testing.assert_close(layer.bias, before + 0.01 * torch.sign(load.mean() - load), rtol=0, atol=0)
    with pytest.raises(ValueError, match="needs a training forward pass"):
        layer.update_bias(0.01)  # the choices are used once
    with torch.no_grad():
        layer(X)  # an evaluation does not count
    with pytest.raises(ValueError, match="needs a training forward pass"):
        layer.update_bias(0.01)
    with pytest.raises(ValueError, match="needs router_bias=True"):
        MoE(8, 12, 4).update_bias(0.01)
    with pytest.raises(ValueError, match="router_bias must be True or False"):
        MoE(8, 12, 4, router_bias=1)


def test_moelm_bias_and_z_loss():
    cfg = MoELMConfig(vocab_size=11, block_size=8, d_model=8, num_heads=2, num_kv_heads=2, num_layers=2, d_ff=6,
                      num_experts=4, top_k=2, router_bias=True)
    torch.manual_seed(1)
    m = MoELM(cfg).train()
    x = torch.randint(0, 11, (3, 8))
    m(x)
    zs = torch.stack([layer.z_loss for layer in m.moe_layers()])
    torch.testing.assert_close(m.z_loss(), zs.mean(), rtol=0, atol=0)
    m.update_bias(0.5)
    assert all(layer.bias.abs().max() > 0 for layer in m.moe_layers())
    assert all(set(layer.bias.tolist()) <= {-0.5, 0.0, 0.5} for layer in m.moe_layers())


def test_sigmoid_biased_router_equals_hugging_face_deepseek_v3():
    ds = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3",
                             reason="transformers is not installed (peer check only)")
    from transformers import DeepseekV3Config
    cfg = DeepseekV3Config(hidden_size=16, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
                           norm_topk_prob=True, routed_scaling_factor=1.0)
    router = ds.DeepseekV3TopkRouter(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.copy_(torch.randn(8, 16, generator=g))
        router.e_score_correction_bias.copy_(0.3 * torch.randn(8, generator=g))
    X = torch.randn(200, 16, generator=g)
    _, hf_w, hf_e = router(X)  # HF computes in float32 and returns the choices unsorted
    W, bias = router.weight.detach().T.double(), router.e_score_correction_bias.double()
    for backend, (w, e, _) in (("numpy", tnp.biased_top_k_router(X.double().numpy(), W.numpy(), 2, bias.numpy(),
                                                                   score="sigmoid")),
                               ("torch", TF.biased_top_k_router(X.double(), W, 2, bias, score="sigmoid"))):
        e, w = np.asarray(e), np.asarray(w)
        order, hf_order = np.argsort(e, -1), np.argsort(hf_e.numpy(), -1)
        np.testing.assert_array_equal(np.take_along_axis(e, order, -1),
                                      np.take_along_axis(hf_e.numpy(), hf_order, -1), err_msg=backend)
        np.testing.assert_allclose(np.take_along_axis(w, order, -1),
                                   np.take_along_axis(hf_w.detach().numpy(), hf_order, -1), rtol=0, atol=1e-6)  # float32
    plain = np.sort(tnp.biased_top_k_router(X.double().numpy(), W.numpy(), 2, np.zeros(8), score="sigmoid")[1], -1)
    assert (plain != np.sort(hf_e.numpy(), -1)).any()  # the bias mattered


@pytest.mark.parametrize("k", [1, 2])
def test_balance_loss_equals_hugging_face(k):
    mixtral = pytest.importorskip("transformers.models.mixtral.modeling_mixtral",
                                  reason="transformers is not installed (the reader's install has no peers)")
    g = np.random.default_rng(k)
    logits = torch.tensor(g.standard_normal((50, 8)))
    p = torch.softmax(logits, -1)
    e = torch.topk(p, k, -1).indices
    ours = TF.load_balancing_loss(p, e)
    theirs = mixtral.load_balancing_loss_func((logits.float(),), 8, top_k=k)
    assert abs(float(ours) - float(theirs)) < 1e-6  # theirs in float32


# ----------------------------------------------------------------------------- the peer: Mixtral


def _mixtral_block(p, D, E, F, k):
    mixtral = pytest.importorskip("transformers.models.mixtral.modeling_mixtral",
                                  reason="transformers is not installed (the reader's install has no peers)")
    from transformers import MixtralConfig

    cfg = MixtralConfig(hidden_size=D, intermediate_size=F, num_local_experts=E, num_experts_per_tok=k,
                        router_jitter_noise=0.0, num_hidden_layers=1, num_attention_heads=2, vocab_size=11)
    torch.manual_seed(0)
    block = mixtral.MixtralSparseMoeBlock(cfg).double().eval()
    with torch.no_grad():
        block.gate.weight.copy_(torch.tensor(p["W_router"].T))  # nn.Linear layout: (E, D)
        for e, ex in enumerate(p["experts"]):
            block.experts.gate_up_proj[e].copy_(torch.tensor(np.concatenate([ex["W_gate"].T, ex["W_up"].T])))
            block.experts.down_proj[e].copy_(torch.tensor(ex["W_down"].T))
    return block


@pytest.mark.parametrize("k", [1, 2])
def test_moe_equals_hugging_face_mixtral_block_with_copied_weights(k):
    D, E, F = 16, 8, 24
    g = np.random.default_rng(k)
    p, X = _moe(g, D, E, F), g.standard_normal((2, 7, D))
    block = _mixtral_block(p, D, E, F, k)
    with torch.no_grad():
        theirs = block(torch.tensor(X)).numpy()
    ours, routing = tnp.moe(X, p, k)
    # Mixtral's router takes its softmax in float32 (by design), so the gates agree to float32 round-off
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
    _, idx = torch.topk(torch.softmax(torch.tensor(X).reshape(-1, D).float() @ torch.tensor(p["W_router"]).float(), -1), k)
    np.testing.assert_array_equal(routing["experts"].reshape(-1, k), idx.numpy())
    module = MoE(D, F, E, k).double()
    with torch.no_grad():
        module.W_router.copy_(torch.tensor(p["W_router"]))
        for ex, src in zip(module.experts, p["experts"]):
            for name, W in src.items():
                getattr(ex, name).copy_(torch.tensor(W))
        np.testing.assert_allclose(module(torch.tensor(X)).numpy(), ours, rtol=0, atol=ATOL)


def test_mixtral_check_fails_when_a_copied_expert_is_transposed_wrongly():
    D, E, F = 16, 8, 24
    g = np.random.default_rng(0)
    p, X = _moe(g, D, E, F), g.standard_normal((2, 7, D))
    block = _mixtral_block(p, D, E, F, 2)
    with torch.no_grad():
        block.experts.gate_up_proj[3].copy_(torch.tensor(np.concatenate([p["experts"][3]["W_up"].T,
                                                                          p["experts"][3]["W_gate"].T])))
        theirs = block(torch.tensor(X)).numpy()
    assert np.abs(tnp.moe(X, p, 2)[0] - theirs).max() > 1e-3  # gate and up swapped: caught


# ----------------------------------------------------------------------------- modules


def _small_moelm(**kw):
    return MoELM(MoELMConfig(vocab_size=11, block_size=16, d_model=16, num_heads=2, num_kv_heads=2, num_layers=2,
                             d_ff=8, num_experts=4, top_k=2, **kw))


def test_moelm_module_equals_the_functional_layer_and_counts_parameters():
    torch.manual_seed(0)
    m = _small_moelm(shared_d_ff=6).double()
    x = torch.randint(0, 11, (3, 16))
    m.record_routing(True)
    with torch.no_grad():
        m(x)
    layer = m.blocks[0].mlp
    X = torch.randn(3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        Y = layer(X)
    ref, _ = tnp.moe(X.numpy(), layer.numpy_params(), 2)
    np.testing.assert_allclose(Y.numpy(), ref, rtol=0, atol=ATOL)
    D, L, V, E, F, S = 16, 2, 11, 4, 8, 6
    expected = V * D + L * (4 * D * D + 2 * D + D * E + E * 3 * D * F + 3 * D * S) + D
    assert sum(p.numel() for p in m.parameters()) == expected
    assert m.aux_loss().item() >= 2 - 1e-9  # >= k whenever f follows pbar; here near uniform at init


def test_moelm_with_one_expert_and_k_one_is_the_dense_llama():
    torch.manual_seed(0)
    moe = MoELM(MoELMConfig(vocab_size=11, block_size=16, d_model=16, num_heads=2, num_kv_heads=2, num_layers=2,
                            d_ff=8, num_experts=1, top_k=1)).double()
    dense = LlamaLM(LlamaLMConfig(vocab_size=11, block_size=16, d_model=16, num_heads=2, num_kv_heads=2,
                                  num_layers=2, d_ff=8)).double()
    state = {k.replace("mlp.experts.0.", "mlp."): v for k, v in moe.state_dict().items() if "W_router" not in k}
    dense.load_state_dict(state)
    x = torch.randint(0, 11, (2, 16))
    with torch.no_grad():
        np.testing.assert_allclose(moe(x).numpy(), dense(x).numpy(), rtol=0, atol=ATOL)


def test_moe_module_rejects_bad_sizes():
    with pytest.raises(ValueError, match=r"top_k=5 exceeds num_experts=4"):
        MoE(8, 4, 4, 5)
    with pytest.raises(ValueError, match=r"top_k=3 exceeds num_experts=2"):
        _small_moelm().__class__(MoELMConfig(vocab_size=11, d_model=16, num_heads=2, num_kv_heads=2, num_experts=2,
                                             top_k=3))
    with pytest.raises(ValueError, match=r"config must be a MoELMConfig"):
        MoELM(LlamaLMConfig(vocab_size=11))


# ----------------------------------------------------------------------------- LoRA


def test_lora_adapted_equals_merged_to_float64_round_off():
    g = np.random.default_rng(0)
    X, W, A, B = g.standard_normal((4, 9, 32)), g.standard_normal((32, 24)), g.standard_normal((32, 4)), g.standard_normal((4, 24))
    adapted = tnp.lora_linear(X, W, A, B, 8.0)
    merged = X @ tnp.lora_merge(W, A, B, 8.0)
    np.testing.assert_allclose(adapted, merged, rtol=0, atol=1e-12)
    np.testing.assert_allclose(adapted, X @ (W + 2.0 * A @ B), rtol=0, atol=1e-12)  # alpha / r = 2
    assert np.abs(adapted - X @ (W + A @ B)).max() > 1e-3  # the scale matters
    assert np.linalg.matrix_rank(tnp.lora_merge(W, A, B, 8.0) - W) == 4


def test_lora_module_starts_equal_to_the_frozen_weight_and_trains_only_A_and_B():
    torch.manual_seed(0)
    W = torch.randn(16, 12, dtype=torch.float64)
    layer = LoRALinear(W, rank=2, alpha=4.0)
    X = torch.randn(5, 16, dtype=torch.float64)
    assert torch.equal(layer(X), X @ W)  # B = 0 at the start
    with torch.no_grad():
        layer.B.normal_()
    np.testing.assert_allclose(layer(X).detach().numpy(), (X @ layer.merged()).detach().numpy(), rtol=0, atol=1e-12)
    assert [n for n, p in layer.named_parameters() if p.requires_grad] == ["A", "B"]


def test_add_lora_then_merge_gives_the_same_model():
    torch.manual_seed(0)
    cfg = LlamaLMConfig(vocab_size=11, block_size=16, d_model=16, num_heads=2, num_kv_heads=2, num_layers=2, d_ff=24)
    model = LlamaLM(cfg).double()
    x = torch.randint(0, 11, (2, 16))
    with torch.no_grad():
        base = model(x)
    names = ("W_Q", "W_K", "W_V", "W_O", "W_gate", "W_up", "W_down")
    added = add_lora(model, rank=3, names=names)
    with torch.no_grad():
        assert torch.equal(model(x), base)  # B = 0
        for p in lora_parameters(model):
            p.normal_(0, 0.3)
        adapted = model(x)
    assert sum(p.numel() for p in added) == 2 * 3 * (4 * (16 + 16) + 3 * (16 + 24))
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if n.endswith(".A") or n.endswith(".B")}
    assert (adapted - base).abs().max() > 1e-3
    merge_lora(model)
    assert not any("parametrizations" in n for n, _ in model.named_parameters())
    with torch.no_grad():
        np.testing.assert_allclose(model(x).numpy(), adapted.numpy(), rtol=0, atol=1e-12)


def test_add_lora_rejects_bad_input():
    model = LlamaLM(LlamaLMConfig(vocab_size=11, d_model=16, num_heads=2, num_kv_heads=2))
    with pytest.raises(ValueError, match=r"no 2-D parameter named one of \('W_nope',\)"):
        add_lora(model, 2, names=("W_nope",))
    with pytest.raises(ValueError, match=r"rank=17 exceeds min\(D_in, D_out\) of W_Q \(16, 16\)"):
        add_lora(model, 17, names=("W_Q",))
    with pytest.raises(ValueError, match=r"rank must be an integer >= 1"):
        add_lora(model, 0)
