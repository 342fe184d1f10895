"""Chapter 21's components: the attention-only forward pass and the head scores, NumPy against
PyTorch, against loops written out here, and against patterns whose scores are known by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tfbook.numpy.induction as N
import tfbook.torch.functional.induction as F
from tfbook.tasks import induction as task
from tfbook.torch.induction import AttnOnlyConfig, AttnOnlyLM

g = np.random.default_rng(0)


def r(*shape):
    return g.standard_normal(shape)


def _params(V=7, D=8, H=2, L=2, T=9, dk=4):
    return {"W_E": r(V, D), "W_pos": r(T, D), "W_U": r(D, V),
            "layers": [{"W_Q": r(H, D, dk), "W_K": r(H, D, dk), "W_V": r(H, D, dk), "W_O": r(H, dk, D)}
                       for _ in range(L)]}


def _torch(p):
    t = lambda a: torch.tensor(a)  # noqa: E731
    return {k: (t(v) if k != "layers" else [{kk: t(vv) for kk, vv in lay.items()} for lay in v]) for k, v in p.items()}


def _loop_forward(p, ids):
    """The forward pass written with one loop per head and per query (no broadcasting)."""
    T = len(ids)
    X = p["W_E"][ids].copy()
    for lay in p["layers"]:
        Xp = X + p["W_pos"][:T]
        add = np.zeros_like(X)
        for h in range(lay["W_Q"].shape[0]):
            dk = lay["W_Q"].shape[2]
            for t in range(T):
                s = np.array([Xp[t] @ lay["W_Q"][h] @ (Xp[j] @ lay["W_K"][h]) / np.sqrt(dk) for j in range(t + 1)])
                w = np.exp(s - s.max())
                w /= w.sum()
                add[t] += sum(w[j] * X[j] @ lay["W_V"][h] for j in range(t + 1)) @ lay["W_O"][h]
        X = X + add
    return X @ p["W_U"]


def test_forward_numpy_equals_loops_and_torch():
    p = _params()
    ids = g.integers(0, 7, (3, 9))
    ln, Pn = N.attn_only_forward(p, ids, return_attention=True)
    for b in range(3):
        np.testing.assert_allclose(ln[b], _loop_forward(p, ids[b]), atol=1e-10)  # float64 round-off
    lt, Pt = F.attn_only_forward(_torch(p), torch.tensor(ids), return_attention=True)
    np.testing.assert_allclose(lt.numpy(), ln, atol=1e-10)
    for a, b in zip(Pn, Pt):
        np.testing.assert_allclose(b.numpy(), a, atol=1e-12)
        np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-12)
        assert np.all(np.triu(a, 1) == 0)  # causal


def test_ablation_zero_and_mean_in_both_backends():
    p = _params()
    ids = g.integers(0, 7, (2, 9))
    mean = r(9, 8)
    for ab in ({(0, 1): None}, {(1, 0): mean}, {(0, 0): None, (1, 1): None}):
        ln = N.attn_only_forward(p, ids, ablate=ab)
        lt = F.attn_only_forward(_torch(p), torch.tensor(ids), ablate={k: None if v is None else torch.tensor(v)
                                                                      for k, v in ab.items()})
        np.testing.assert_allclose(lt.numpy(), ln, atol=1e-10)
    # zero-ablating a head equals a model whose W_O for that head is zero
    q = _params()
    q2 = {**q, "layers": [dict(lay) for lay in q["layers"]]}
    q2["layers"][1]["W_O"] = q["layers"][1]["W_O"].copy()
    q2["layers"][1]["W_O"][0] = 0.0
    np.testing.assert_allclose(N.attn_only_forward(q, ids, ablate={(1, 0): None}), N.attn_only_forward(q2, ids),
                               atol=1e-12)
    assert not np.allclose(N.attn_only_forward(q, ids), N.attn_only_forward(q2, ids))


def test_module_runs_the_function():
    torch.manual_seed(0)
    m = AttnOnlyLM(AttnOnlyConfig(vocab_size=11, block_size=12, d_model=8, num_heads=2, num_layers=2)).double()
    ids = torch.randint(0, 11, (2, 12))
    np.testing.assert_allclose(m(ids).detach().numpy(), N.attn_only_forward(m.numpy_params(), ids.numpy()),
                               atol=1e-12)


def test_previous_token_score_hand_patterns():
    T = 6
    prev = np.eye(T, k=-1)
    prev[0, 0] = 1.0
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    self_ = np.eye(T)
    P = np.stack([prev, uniform, self_])
    want = [1.0, np.mean(1 / np.arange(2, T + 1)), 0.0]
    np.testing.assert_allclose(N.previous_token_score(P), want, atol=1e-15)
    np.testing.assert_allclose(F.previous_token_score(torch.tensor(P)).numpy(), want, atol=1e-15)


def test_prefix_matching_score_hand_patterns():
    ids = np.array([3, 1, 4, 5, 3, 1, 4, 2])  # 3 1 4 repeated: queries 4, 5, 6 have a match
    T = len(ids)
    ind = np.zeros((T, T))
    for t in range(T):
        js = [j for j in range(1, t) if ids[j - 1] == ids[t]]
        if js:
            ind[t, js] = 1 / len(js)
        else:
            ind[t, t] = 1.0
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    P = np.stack([ind, uniform])
    # uniform: each of the three matched queries t = 4, 5, 6 has one match among t + 1 keys
    want = [1.0, np.mean([1 / 5, 1 / 6, 1 / 7])]
    np.testing.assert_allclose(N.prefix_matching_score(P, ids), want, atol=1e-15)
    np.testing.assert_allclose(F.prefix_matching_score(torch.tensor(P), torch.tensor(ids)).numpy(), want, atol=1e-15)
    # batch and head axes: P (B, H, T, T) with ids (B, T)
    PB = np.stack([P, P[::-1]])
    idsB = np.stack([ids, ids])
    np.testing.assert_allclose(N.prefix_matching_score(PB, idsB), [want, want[::-1]], atol=1e-15)
    # no repeated token: NaN
    assert np.isnan(N.prefix_matching_score(uniform, np.arange(T)))
    assert torch.isnan(F.prefix_matching_score(torch.tensor(uniform), torch.arange(T)))


def test_copying_score_closed_forms_and_full_eigenvalues():
    V, D, dk = 9, 6, 3
    W_E, W_U = r(V, D), r(D, V)
    W_V, W_O = r(4, D, dk), r(4, dk, D)
    got = N.copying_score(W_E, W_V, W_O, W_U)
    for h in range(4):
        M = W_E @ W_V[h] @ W_O[h] @ W_U  # the full (V, V) circuit
        lam = np.linalg.eigvals(M)
        np.testing.assert_allclose(got[h], lam.sum().real / np.abs(lam).sum(), atol=1e-9)  # V - D_K zero eigenvalues
    np.testing.assert_allclose(F.copying_score(*map(torch.tensor, (W_E, W_V, W_O, W_U))).numpy(), got, atol=1e-12)
    # a head that copies (M = W_E W_E^+ restricted: W_V W_O = pinv(W_E) W_E ...) scores 1, its negative -1
    E = np.eye(V)[:, :D]  # W_E picks the first D tokens' directions
    W = np.eye(D)
    assert np.isclose(N.copying_score(E, W[:, :dk], W[:dk], E.T), 1.0)
    assert np.isclose(N.copying_score(E, W[:, :dk], -W[:dk], E.T), -1.0)


def test_composition_score_bounds_and_baseline():
    A, B = r(5, 3), r(3, 4)
    want = np.linalg.norm(A @ B) / (np.linalg.norm(A) * np.linalg.norm(B))
    assert np.isclose(N.composition_score(A, B), want)
    assert np.isclose(F.composition_score(torch.tensor(A), torch.tensor(B)).item(), want)
    u, v, w = r(5, 1), r(3, 1), r(4, 1)
    assert np.isclose(N.composition_score(u @ v.T, v @ w.T), 1.0)  # aligned rank one: Cauchy-Schwarz equality
    assert np.isclose(N.composition_score(u @ v.T, np.linalg.svd(v.T)[2][1:2].T @ w.T), 0.0, atol=1e-12)  # orthogonal
    # random iid square matrices of size k: the score concentrates at 1 / sqrt(k)
    k = 200
    s = N.composition_score(np.random.default_rng(1).standard_normal((k, k)),
                            np.random.default_rng(2).standard_normal((k, k)))
    assert abs(s - k ** -0.5) < 0.1 * k ** -0.5


def test_task_data_repeats_the_span():
    ids, a, b, L = task.batch(200, torch.Generator().manual_seed(0))
    assert ids.shape == (200, 65)
    assert int(L.min()) >= task.SPAN[0] and int(L.max()) <= task.SPAN[1]
    assert bool((b >= a + L).all()) and bool((b + L <= 65).all())
    for i in range(200):
        assert torch.equal(ids[i, a[i]:a[i] + L[i]], ids[i, b[i]:b[i] + L[i]])
    first, second = task.span_masks(a, b, L)
    assert (first.sum(1) == L - 1).all() and (second.sum(1) == L - 1).all()


def test_phase_change_step_on_a_synthetic_curve():
    steps = np.arange(0, 1000, 50)
    second = np.where(steps < 400, 4.0, 1.0)
    second[0] = 9.0
    second[8] = 2.6  # step 400: below half-way (2.5)? no; step 450 is the first below
    assert task.phase_change_step(steps, second) == 450
    assert task.phase_change_step(steps, np.full(20, 4.0)) == -1


ERRORS = [
    ("attn_only_forward", lambda: (_params(), np.zeros((2, 10), dtype=np.int64)), r"ids has T = 10 positions, the model has 1 to 9"),
    ("attn_only_forward", lambda: ({**_params(), "W_U": r(8, 6)}, np.zeros((2, 5), dtype=np.int64)),
     r"W_U \(D, V\) with W_E \(V, D\) \(W_E: \(7, 8\), W_pos: \(9, 8\), W_U: \(8, 6\)\)"),
    ("attn_only_forward", lambda: ({"W_E": r(7, 8)}, np.zeros((2, 5), dtype=np.int64)), r"params must be a dict with W_E"),
    ("previous_token_score", lambda: (r(2, 4, 5),), r"P must be square in its last two axes \(\.\.\., T, T\), got shape \(2, 4, 5\)"),
    ("previous_token_score", lambda: (r(1, 1),), r"P needs T >= 2 positions, got shape \(1, 1\)"),
    ("prefix_matching_score", lambda: (r(2, 3, 5, 5), np.zeros((3, 5), dtype=np.int64)),
     r"ids must have shape \(\.\.\., T\) with T = 5 and leading axes a prefix of P's \(ids: \(3, 5\), P: \(2, 3, 5, 5\)\)"),
    ("copying_score", lambda: (r(7, 8), r(2, 8, 4), r(2, 4, 6), r(8, 7)),
     r"need W_E \(V, D\), W_V \(\.\.\., D, D_K\), W_O \(\.\.\., D_K, D\), W_U \(D, V\) \(W_E: \(7, 8\), W_V: \(2, 8, 4\), W_O: \(2, 4, 6\)"),
    ("composition_score", lambda: (r(4, 3), r(4, 3)), r"A's last axis must equal B's second-to-last \(A: \(4, 3\), B: \(4, 3\)\)"),
]


@pytest.mark.parametrize("name,make,msg", ERRORS, ids=[e[0] for e in ERRORS])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_bad_input_raises_value_error_naming_shapes(name, make, msg, backend):
    args = make()
    if backend == "torch":
        args = tuple(_torch(a) if isinstance(a, dict) and "layers" in a else
                     {k: torch.tensor(v) for k, v in a.items()} if isinstance(a, dict) else torch.tensor(a) for a in args)
    fn = getattr(N if backend == "numpy" else F, name)
    with pytest.raises(ValueError, match=msg):
        fn(*args)


def test_every_public_function_has_an_error_case():
    assert {e[0] for e in ERRORS} == set(N.__all__) == set(F.__all__)


def test_ablate_names_a_head_that_exists():
    with pytest.raises(ValueError, match=r"ablate names head \(2, 0\), the model has 2 layers of 2 heads"):
        N.attn_only_forward(_params(), np.zeros((1, 4), dtype=np.int64), ablate={(2, 0): None})
    with pytest.raises(ValueError, match=r"ablate\[\(0, 1\)\] must be None \(zero\) or a replacement output \(\.\.\., D\) with D = 8"):
        N.attn_only_forward(_params(), np.zeros((1, 4), dtype=np.int64), ablate={(0, 1): r(4, 5)})


def test_head_outputs_sum_to_the_residual_update():
    p = _params()
    ids = g.integers(0, 7, (2, 9))
    logits, outs = N.attn_only_forward(p, ids, return_outputs=True)
    X = p["W_E"][ids] + sum(o.sum(axis=-3) for o in outs)
    np.testing.assert_allclose(X @ p["W_U"], logits, atol=1e-10)
    lt, Pt, ot = F.attn_only_forward(_torch(p), torch.tensor(ids), return_attention=True, return_outputs=True)
    for a, b in zip(outs, ot):
        np.testing.assert_allclose(b.numpy(), a, atol=1e-10)
    # mean-ablating with the head's own output leaves the logits unchanged
    np.testing.assert_allclose(N.attn_only_forward(p, ids, ablate={(1, 1): outs[1][:, 1]}), logits, atol=1e-10)


def test_forward_equals_pytorch_built_in_attention():
    """The same model computed with torch.nn.functional.scaled_dot_product_attention (is_causal)
    per layer: PyTorch's own attention, not the book's."""
    p = _params()
    pt = _torch(p)
    ids = torch.tensor(g.integers(0, 7, (3, 9)))
    X = pt["W_E"][ids]
    for lay in pt["layers"]:
        Xp = (X + pt["W_pos"][:9]).unsqueeze(1)
        Z = torch.nn.functional.scaled_dot_product_attention(Xp @ lay["W_Q"], Xp @ lay["W_K"], X.unsqueeze(1) @ lay["W_V"],
                                                             is_causal=True)
        X = X + (Z @ lay["W_O"]).sum(1)
    np.testing.assert_allclose(F.attn_only_forward(pt, ids).numpy(), (X @ pt["W_U"]).numpy(), atol=1e-10)
