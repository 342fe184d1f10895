"""Chapter 10's components: cross-entropy, the backward passes, the optimisers, clipping, checkpoints.

Tolerances and their reasons:

* ``BACKWARD_ATOL = 1e-10``: a hand-written backward pass and autograd compute the same float64
  sums in different orders; entries here are O(1) to O(10), so round-off is ~1e-14 and 1e-10
  leaves four orders of margin while any wrong term (a missing mean, a transposed matrix)
  gives errors of order 1e-2 or more.
* ``TRAIN_ATOL = 1e-10``: 50 training steps of the NumPy model and of the PyTorch model from
  the same weights and batches; each step adds float64 round-off (~1e-15) that the next steps
  can amplify, measured at ~1e-15 on the loss, so 1e-10 still has a wide margin.
* ``OPT_ATOL = 1e-12``: 100 optimiser steps fed the same gradients: the only difference is the
  rounding of a few elementwise operations per step (~1e-16 relative, parameters O(1)).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tfbook.numpy as tnp
import tfbook.numpy.backprop as bp
import tfbook.numpy.optim as nopt
import tfbook.torch as tt
from tfbook.torch import functional as TF
from tfbook.torch.models import DecoderLM, DecoderLMConfig, lm_loss
from tfbook.torch.training import lr_schedule

from conftest import random_encoder_params, random_ffn_params, random_mha_params

BACKWARD_ATOL = 1e-10
TRAIN_ATOL = 1e-10
OPT_ATOL = 1e-12


def _leaf(x):
    return torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=True)


def _leaves(d):
    """Nested dict of arrays -> the same of float64 leaf tensors (None stays None)."""
    if isinstance(d, dict):
        return {k: _leaves(v) for k, v in d.items()}
    return None if d is None else _leaf(d)


def _grads(d):
    if isinstance(d, dict):
        return {k: _grads(v) for k, v in d.items()}
    return None if d is None else d.grad.numpy()


def _max_err(a, b):
    if isinstance(a, (tuple, list)):
        return max(_max_err(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return max(_max_err(a[k], b[k]) for k in a)
    if a is None:
        assert b is None
        return 0.0
    assert np.shape(a) == np.shape(b), (np.shape(a), np.shape(b))
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) if np.size(a) else 0.0


# ---------------------------------------------------------------------------------------
# Cross-entropy
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_cross_entropy_equals_torch_and_is_stable(scale):
    g = np.random.default_rng(0)
    logits = g.standard_normal((3, 5, 7)) * scale
    targets = g.integers(0, 7, (3, 5))
    targets[0, :2] = -100  # padding
    ref = F.cross_entropy(torch.tensor(logits).reshape(-1, 7), torch.tensor(targets).reshape(-1))
    for ce in (tnp.cross_entropy(logits, targets), TF.cross_entropy(torch.tensor(logits), torch.tensor(targets))):
        assert np.isfinite(float(ce))
        assert abs(float(ce) - ref.item()) <= 1e-12 * max(1.0, abs(ref.item()))  # float64 round-off, relative
    lsm = tnp.log_softmax(logits)
    assert np.all(np.isfinite(lsm))
    np.testing.assert_allclose(lsm, torch.log_softmax(torch.tensor(logits), -1).numpy(), rtol=1e-12, atol=1e-12 * scale)


def test_naive_cross_entropy_overflows_at_1e4():
    """The check above can fail: log(softmax) computed naively is -inf or nan at +-1e4."""
    logits = np.array([[1e4, -1e4, 0.0]])
    with np.errstate(all="ignore"):
        naive = np.log(np.exp(logits) / np.exp(logits).sum(-1, keepdims=True))
    assert not np.all(np.isfinite(naive))
    assert np.all(np.isfinite(tnp.log_softmax(logits)))


@pytest.mark.parametrize("scale", [1.0, 1e4])
def test_cross_entropy_grad_equals_autograd(scale):
    g = np.random.default_rng(1)
    logits = g.standard_normal((4, 6, 9)) * scale
    targets = g.integers(0, 9, (4, 6))
    targets[1] = -100
    targets[2, 3] = -100
    t = _leaf(logits)
    F.cross_entropy(t.reshape(-1, 9), torch.tensor(targets).reshape(-1), ignore_index=-100).backward()
    for grad in (tnp.cross_entropy_grad(logits, targets),
                 TF.cross_entropy_grad(torch.tensor(logits), torch.tensor(targets)).numpy()):
        assert np.all(np.isfinite(grad))
        np.testing.assert_allclose(grad, t.grad.numpy(), rtol=0, atol=BACKWARD_ATOL)
        assert np.all(grad[1] == 0)  # ignored rows get no gradient
    # and the torch twin differentiates to the same through autograd
    t2 = _leaf(logits)
    TF.cross_entropy(t2, torch.tensor(targets)).backward()
    np.testing.assert_allclose(t2.grad.numpy(), t.grad.numpy(), rtol=0, atol=BACKWARD_ATOL)


def test_ignore_index_other_value_and_all_ignored():
    g = np.random.default_rng(2)
    logits = g.standard_normal((2, 4, 5))
    targets = g.integers(0, 5, (2, 4))
    targets[0, 0] = 0
    t = targets.copy()
    t[:, -1] = 0  # pad id 0
    ref = F.cross_entropy(torch.tensor(logits).reshape(-1, 5), torch.tensor(t).reshape(-1), ignore_index=0)
    assert abs(float(tnp.cross_entropy(logits, t, ignore_index=0)) - ref.item()) < 1e-12
    allpad = np.full((2, 4), -100)
    assert float(tnp.cross_entropy(logits, allpad)) == 0.0
    assert np.all(tnp.cross_entropy_grad(logits, allpad) == 0)
    assert float(TF.cross_entropy(torch.tensor(logits), torch.tensor(allpad))) == 0.0


def test_ce_grad_without_division_by_counted_fails():
    """Mutation: dividing by all positions instead of the counted ones is caught."""
    g = np.random.default_rng(3)
    logits, targets = g.standard_normal((2, 5, 4)), g.integers(0, 4, (2, 5))
    targets[0] = -100
    t = _leaf(logits)
    F.cross_entropy(t.reshape(-1, 4), torch.tensor(targets).reshape(-1)).backward()
    wrong = tnp.cross_entropy_grad(logits, targets) * (targets != -100).sum() / targets.size
    assert np.max(np.abs(wrong - t.grad.numpy())) > 1e-3


# ---------------------------------------------------------------------------------------
# Backward passes vs autograd
# ---------------------------------------------------------------------------------------


def test_softmax_and_layer_norm_backward():
    g = np.random.default_rng(0)
    S, dP = g.standard_normal((3, 4, 6)) * 3, g.standard_normal((3, 4, 6))
    tS = _leaf(S)
    (TF.softmax(tS) * torch.tensor(dP)).sum().backward()
    assert _max_err(bp.softmax_backward(dP, tnp.softmax(S)), tS.grad.numpy()) < BACKWARD_ATOL
    X, dY = g.standard_normal((2, 5, 6)) * 3 + 1, g.standard_normal((2, 5, 6))
    gamma, beta = g.standard_normal(6), g.standard_normal(6)
    tX, tg, tb = _leaf(X), _leaf(gamma), _leaf(beta)
    (torch.nn.functional.layer_norm(tX, (6,), tg, tb, 1e-5) * torch.tensor(dY)).sum().backward()
    dX, dg, db = bp.layer_norm_backward(dY, X, gamma)
    assert _max_err((dX, dg, db), (tX.grad.numpy(), tg.grad.numpy(), tb.grad.numpy())) < BACKWARD_ATOL
    # mutation: dropping the term through the variance is caught
    r = 1 / np.sqrt(X.var(-1, keepdims=True) + 1e-5)
    G = dY * gamma
    wrong = r * (G - G.mean(-1, keepdims=True))
    assert np.max(np.abs(wrong - tX.grad.numpy())) > 1e-2


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward_backward(activation):
    g = np.random.default_rng(1)
    p = random_ffn_params(g, 6, 12)
    X, dY = g.standard_normal((2, 5, 6)), g.standard_normal((2, 5, 6))
    tp, tX = _leaves(p), _leaf(X)
    (TF.feed_forward(tX, tp, activation) * torch.tensor(dY)).sum().backward()
    dX, grads = bp.feed_forward_backward(dY, X, p, activation)
    assert _max_err(dX, tX.grad.numpy()) < BACKWARD_ATOL
    assert _max_err(grads, _grads(tp)) < BACKWARD_ATOL


def test_attention_backward_with_mask():
    g = np.random.default_rng(2)
    Q, K, V = g.standard_normal((2, 3, 5, 4)), g.standard_normal((2, 3, 7, 4)), g.standard_normal((2, 3, 7, 6))
    mask = g.random((5, 7)) < 0.7
    mask[1] = False  # a query that may attend to nothing: zero output, zero gradient
    dZ = g.standard_normal((2, 3, 5, 6))
    tQ, tK, tV = _leaf(Q), _leaf(K), _leaf(V)
    (TF.scaled_dot_product_attention(tQ, tK, tV, mask=torch.tensor(mask))[0] * torch.tensor(dZ)).sum().backward()
    got = bp.attention_backward(dZ, Q, K, V, mask=mask)
    assert _max_err(got, (tQ.grad.numpy(), tK.grad.numpy(), tV.grad.numpy())) < BACKWARD_ATOL
    # mutation: forgetting the scale in dQ is caught
    assert _max_err(got[0] * math.sqrt(4), tQ.grad.numpy()) > 1e-2


@pytest.mark.parametrize("bias,mask_shape", [(True, (2, 5, 7)), (False, (5, 7)), (True, (2, 2, 5, 7))])
def test_multi_head_attention_backward(bias, mask_shape):
    g = np.random.default_rng(3)
    p = random_mha_params(g, 8, bias)
    X_q, X_kv, dZ = g.standard_normal((2, 5, 8)), g.standard_normal((2, 7, 8)), g.standard_normal((2, 5, 8))
    mask = g.random(mask_shape) < 0.7
    tp, tq, tkv = _leaves(p), _leaf(X_q), _leaf(X_kv)
    (TF.multi_head_attention(tq, tkv, tp, 2, mask=torch.tensor(mask))[0] * torch.tensor(dZ)).sum().backward()
    dq, dkv, grads = bp.multi_head_attention_backward(dZ, X_q, X_kv, p, 2, mask=mask)
    assert _max_err((dq, dkv), (tq.grad.numpy(), tkv.grad.numpy())) < BACKWARD_ATOL
    assert _max_err(grads, _grads(tp)) < BACKWARD_ATOL


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_block_backward(norm_first, activation):
    g = np.random.default_rng(4)
    p = random_encoder_params(g, 8, 16)
    X, dY = g.standard_normal((2, 5, 8)), g.standard_normal((2, 5, 8))
    tp, tX = _leaves(p), _leaf(X)
    out = TF.encoder_block(tX, tp, 2, norm_first, activation, TF.causal_mask(5))
    (out * torch.tensor(dY)).sum().backward()
    dX, grads = bp.encoder_block_backward(dY, X, p, 2, norm_first, activation, tnp.causal_mask(5))
    assert _max_err(dX, tX.grad.numpy()) < BACKWARD_ATOL
    assert _max_err(grads, _grads(tp)) < BACKWARD_ATOL


def test_residual_path_matters():
    """Mutation: a block backward that forgets the residual's identity path is caught."""
    g = np.random.default_rng(5)
    p = random_encoder_params(g, 8, 16)
    X, dY = g.standard_normal((1, 4, 8)), g.standard_normal((1, 4, 8))
    tX = _leaf(X)
    (TF.encoder_block(tX, _leaves(p), 2, True, "gelu") * torch.tensor(dY)).sum().backward()
    dX, _ = bp.encoder_block_backward(dY, X, p, 2, True, "gelu")
    assert _max_err(dX - dY, tX.grad.numpy()) > 1e-2  # minus the identity path: wrong


def test_embedding_backward_adds_repeated_tokens():
    g = np.random.default_rng(6)
    W = g.standard_normal((7, 3))
    ids = np.array([[1, 2, 1], [6, 1, 0]])  # token 1 three times
    dX = g.standard_normal((2, 3, 3))
    tW = _leaf(W)
    (TF.embedding_lookup(torch.tensor(ids), tW) * torch.tensor(dX)).sum().backward()
    assert _max_err(bp.embedding_backward(dX, ids, 7), tW.grad.numpy()) < BACKWARD_ATOL
    wrong = np.zeros_like(W)
    wrong[ids.reshape(-1)] = dX.reshape(-1, 3)  # assignment keeps only the last occurrence
    assert _max_err(wrong, tW.grad.numpy()) > 1e-2


def _lm(norm_first=True, tie=True, activation="gelu", seed=0):
    cfg = DecoderLMConfig(vocab_size=11, block_size=8, d_model=16, num_heads=2, num_layers=2, d_ff=32,
                          norm_first=norm_first, tie_weights=tie, activation=activation)
    torch.manual_seed(seed)
    return cfg, DecoderLM(cfg).double()


@pytest.mark.parametrize("norm_first,tie,activation", [(True, True, "gelu"), (False, False, "relu")])
def test_lm_loss_and_grads_equal_autograd(norm_first, tie, activation):
    cfg, model = _lm(norm_first, tie, activation)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 11, (3, 8), generator=g), torch.randint(0, 11, (3, 8), generator=g)
    loss = lm_loss(model, x, y)
    loss.backward()
    params = bp.lm_params_from_torch(model)
    np.testing.assert_allclose(bp.lm_forward(params, x.numpy(), cfg), model(x).detach().numpy(), rtol=0,
                               atol=BACKWARD_ATOL)
    l, grads = bp.lm_loss_and_grads(params, x.numpy(), y.numpy(), cfg)
    assert abs(float(l) - loss.item()) < BACKWARD_ATOL
    assert list(grads) == [n for n, _ in model.named_parameters()]
    for name, p in model.named_parameters():
        assert _max_err(grads[name], p.grad.numpy()) < BACKWARD_ATOL, name


# ---------------------------------------------------------------------------------------
# Training: NumPy == PyTorch, optimisers == torch.optim, clipping, schedule, checkpoints
# ---------------------------------------------------------------------------------------


def _batches(n, B=4, T=8, V=11, seed=1):
    """Learnable batches: the target of each token is the next id, ``(x + 1) mod V``."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randint(0, V, (B, T), generator=g) for _ in range(n)]
    return [(x, (x + 1) % V) for x in xs]


def test_numpy_training_equals_torch_over_50_steps():
    steps = 50
    batches = _batches(steps)
    rates = lr_schedule(("warmup_cosine", 10, 1e-4), 1e-2, steps)
    cfg, model = _lm()
    params = bp.lm_params_from_torch(model)
    opt = torch.optim.AdamW(model.parameters(), lr=rates[0], weight_decay=0.1)
    state = nopt.adamw_init(params)
    loss_t, loss_n = [], []
    for (x, y), lr in zip(batches, rates):
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        loss = lm_loss(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_t.append(loss.item())
        loss, grads = bp.lm_loss_and_grads(params, x.numpy(), y.numpy(), cfg)
        nopt.clip_grad_norm(grads, 1.0)
        nopt.adamw_step(params, grads, state, lr, weight_decay=0.1)
        loss_n.append(float(loss))
    assert np.max(np.abs(np.array(loss_t) - loss_n)) < TRAIN_ATOL
    assert loss_t[-1] < loss_t[0] - 0.1  # it trained (a frozen model would pass equality too)
    for name, p in model.named_parameters():
        # b_K's true gradient is 0 (it shifts every score of a row equally); both sides compute
        # round-off there (~1e-18), which Adam divides by eps: up to ~lr * 1e-16 / eps per step
        tol = 1e-7 if name.endswith("b_K") else TRAIN_ATOL
        assert _max_err(params[name], p.detach().numpy()) < tol, name
        if name.endswith("b_K"):
            assert np.abs(p.grad.numpy()).max() < 1e-14  # the last step's gradient: round-off only


def _fixed_gradients(steps=100, seed=0):
    g = np.random.default_rng(seed)
    shapes = {"W": (5, 4), "b": (7,)}
    p0 = {k: g.standard_normal(s) for k, s in shapes.items()}
    return p0, [{k: g.standard_normal(s) for k, s in shapes.items()} for _ in range(steps)]


def _torch_opt_run(make_opt, p0, grads):
    ps = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in p0.items()}
    opt = make_opt(list(ps.values()))
    for gr in grads:
        for k, p in ps.items():
            p.grad = torch.tensor(gr[k])
        opt.step()
    return {k: v.detach().numpy() for k, v in ps.items()}


def _numpy_opt_run(init, step, p0, grads):
    p = {k: v.copy() for k, v in p0.items()}
    state = init(p)
    for gr in grads:
        step(p, {k: v.copy() for k, v in gr.items()}, state)
    return p


OPTIMISERS = {
    "adamw": (lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
              lambda ps: tt.AdamW(ps, lr=1e-2, weight_decay=0.1),
              nopt.adamw_init, lambda p, g, s: nopt.adamw_step(p, g, s, 1e-2, weight_decay=0.1)),
    "adam-l2": (lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1),
                lambda ps: tt.AdamW(ps, lr=1e-2, weight_decay=0.1, decoupled=False),
                nopt.adamw_init, lambda p, g, s: nopt.adamw_step(p, g, s, 1e-2, weight_decay=0.1, decoupled=False)),
    "sgd": (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-2),
            lambda ps: tt.SGDMomentum(ps, lr=0.05, momentum=0.9, weight_decay=1e-2),
            nopt.sgd_init, lambda p, g, s: nopt.sgd_step(p, g, s, 0.05, momentum=0.9, weight_decay=1e-2)),
}


@pytest.mark.parametrize("name", list(OPTIMISERS))
def test_optimisers_equal_torch_optim_over_100_steps(name):
    ref_opt, ours_t, init, step = OPTIMISERS[name]
    p0, grads = _fixed_gradients()
    ref = _torch_opt_run(ref_opt, p0, grads)
    assert _max_err(_torch_opt_run(ours_t, p0, grads), ref) < OPT_ATOL
    assert _max_err(_numpy_opt_run(init, step, p0, grads), ref) < OPT_ATOL
    assert _max_err(ref, p0) > 0.1  # the parameters moved


def test_adamw_mutations_are_caught():
    p0, grads = _fixed_gradients()
    ref = _torch_opt_run(OPTIMISERS["adamw"][0], p0, grads)

    def no_bias_correction(p, g, s):
        s["step"] = 0  # so 1 - beta**t is 1 - beta**1 ... every step: wrong after step 1
        return nopt.adamw_step(p, g, s, 1e-2, weight_decay=0.1)

    coupled = _numpy_opt_run(nopt.adamw_init, OPTIMISERS["adam-l2"][3], p0, grads)
    assert _max_err(coupled, ref) > 1e-4  # L2 in Adam is not AdamW
    assert _max_err(_numpy_opt_run(nopt.adamw_init, no_bias_correction, p0, grads), ref) > 1e-4


def test_clip_grad_norm_equals_torch():
    g = np.random.default_rng(0)
    for scale, max_norm in ((10.0, 1.0), (0.01, 1.0)):  # clipped, and left alone
        grads = {"a": g.standard_normal((4, 3)) * scale, "b": g.standard_normal(5) * scale}
        ps = [torch.nn.Parameter(torch.zeros_like(torch.tensor(v))) for v in grads.values()]
        for p, v in zip(ps, grads.values()):
            p.grad = torch.tensor(v)
        ps2 = [torch.nn.Parameter(p.detach().clone()) for p in ps]
        for p2, p in zip(ps2, ps):
            p2.grad = p.grad.clone()
        ref = torch.nn.utils.clip_grad_norm_(ps, max_norm)
        ours_t = tt.clip_grad_norm(ps2, max_norm)
        mine = {k: v.copy() for k, v in grads.items()}
        norm = nopt.clip_grad_norm(mine, max_norm)
        assert abs(norm - ref.item()) < 1e-12 and abs(ours_t.item() - ref.item()) < 1e-12
        for p, p2, v in zip(ps, ps2, mine.values()):
            assert _max_err(v, p.grad.numpy()) < 1e-15  # one multiplication by the same factor
            assert _max_err(p2.grad.numpy(), p.grad.numpy()) < 1e-15
        clipped = nopt.global_grad_norm(mine)
        assert clipped <= max_norm + 1e-12 if scale > 1 else abs(clipped - norm) < 1e-15


def test_lr_schedule_equals_torch_schedulers():
    steps, warmup, lr, min_lr = 50, 10, 1e-2, 1e-3
    ours = lr_schedule(("warmup_cosine", warmup, min_lr), lr, steps)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    s1 = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / warmup, end_factor=1.0, total_iters=warmup - 1)
    s2 = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps - warmup, eta_min=min_lr)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [s1, s2], milestones=[warmup - 1])
    ref = []
    for _ in range(steps):  # optimizer.step() before scheduler.step(): no warning to silence
        ref.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert max(abs(a - b) for a, b in zip(ours, ref)) < 1e-15
    assert ours[warmup - 1] == lr and abs(ours[-1] - min_lr) < 1e-15  # peak at W - 1, floor at S - 1
    # the chapter's claim: W = 0 behaves as W = 1 (step 0 at the peak, then the cosine)
    w0, w1 = lr_schedule(("warmup_cosine", 0, min_lr), lr, steps), lr_schedule(("warmup_cosine", 1, min_lr), lr, steps)
    assert max(abs(a - b) for a, b in zip(w0, w1)) < 1e-15  # float64 round-off (step 0: the cosine at 0 vs lr * 1/1)


def _torch_train(model, opt, steps, gen):
    """``steps`` steps on batches drawn from ``gen``; the recorded loss also draws from the global
    RNG (as dropout would), so both generators' states matter to the losses."""
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 11, (4, 8), generator=gen)
        opt.zero_grad()
        loss = lm_loss(model, x, (x + 1) % 11)
        loss.backward()
        tt.clip_grad_norm(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item() + 1e-3 * torch.rand(()).item())
    return losses


@pytest.mark.parametrize("opt_cls", [torch.optim.AdamW, tt.AdamW])
def test_checkpoint_resume_is_exact_torch(tmp_path, opt_cls):
    _, model = _lm()
    opt = opt_cls(model.parameters(), lr=3e-3)
    torch.manual_seed(11)
    straight = _torch_train(model, opt, 20, torch.Generator().manual_seed(5))
    _, m2 = _lm()
    o2 = opt_cls(m2.parameters(), lr=3e-3)
    g2 = torch.Generator().manual_seed(5)
    torch.manual_seed(11)
    first = _torch_train(m2, o2, 10, g2)
    tt.save_checkpoint(tmp_path / "ck.pt", m2, o2, 10, generator=g2)

    def resume(load=tt.load_checkpoint, fresh_optimiser=False):
        _, m3 = _lm(seed=99)  # other weights, other generators: everything must come from the file
        o3 = opt_cls(m3.parameters(), lr=3e-3)
        g3 = torch.Generator().manual_seed(123)
        torch.manual_seed(0)
        step, _ = load(tmp_path / "ck.pt", m3, o3, generator=g3)
        assert step == 10
        if fresh_optimiser:
            o3 = opt_cls(m3.parameters(), lr=3e-3)
        return m3, first + _torch_train(m3, o3, 10, g3)

    m3, resumed = resume()
    assert resumed == straight  # bit for bit
    for (n, a), (_, b) in zip(model.named_parameters(), m3.named_parameters()):
        assert torch.equal(a, b), n
    # mutations: resuming without the optimiser state, without the batch generator's state, or
    # without the global RNG state is not exact
    assert resume(fresh_optimiser=True)[1] != straight

    def without_generator(path, m, o, generator=None):
        return tt.load_checkpoint(path, m, o)  # generator left as it was

    def without_global_rng(path, m, o, generator=None):
        state = torch.get_rng_state()
        out = tt.load_checkpoint(path, m, o, generator=generator)
        torch.set_rng_state(state)
        return out

    with pytest.raises(ValueError, match="holds no generator state"):
        tt.save_checkpoint(tmp_path / "nogen.pt", m2, o2, 10)
        tt.load_checkpoint(tmp_path / "nogen.pt", m2, o2, generator=torch.Generator())
    assert resume(without_generator)[1] != straight
    assert resume(without_global_rng)[1] != straight


def test_checkpoint_resume_is_exact_numpy(tmp_path):
    cfg, model = _lm()
    batches = _batches(12)

    def run(params, state, start, stop, rng):
        out = []
        for step in range(start, stop):
            x, y = batches[step]
            loss, grads = bp.lm_loss_and_grads(params, x.numpy(), y.numpy(), cfg)
            nopt.clip_grad_norm(grads, 1.0)
            nopt.adamw_step(params, grads, state, 3e-3 * (1 + rng.random()))  # the rng matters
            out.append(float(loss))
        return out

    p = bp.lm_params_from_torch(model)
    straight = run(p, nopt.adamw_init(p), 0, 12, np.random.default_rng(7))
    p2 = bp.lm_params_from_torch(model)
    s2, r2 = nopt.adamw_init(p2), np.random.default_rng(7)
    first = run(p2, s2, 0, 6, r2)
    nopt.save_checkpoint(tmp_path / "ck.npz", p2, s2, 6, rng=r2)
    r3 = np.random.default_rng(0)
    p3, s3, step = nopt.load_checkpoint(tmp_path / "ck.npz", rng=r3)
    assert step == 6 and list(p3) == list(p2)
    assert first + run(p3, s3, 6, 12, r3) == straight
    for k in p:
        assert np.array_equal(p[k], p3[k])


# ---------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------


def test_backward_and_optimiser_errors():
    g = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"dP must have the shape of P: dP: \(2, 3\), P: \(2, 4\)"):
        bp.softmax_backward(np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"dY must have the shape of X: dY: \(2, 5\), X: \(2, 6\)"):
        bp.layer_norm_backward(np.ones((2, 5)), np.ones((2, 6)), None)
    with pytest.raises(ValueError, match=r"gamma must have shape \(D,\) = \(6,\)"):
        bp.layer_norm_backward(np.ones((2, 6)), np.ones((2, 6)), np.ones(5))
    with pytest.raises(ValueError, match=r"dY.*\(dY: \(2, 4\), X: \(2, 3\), W: \(3, 5\)\)"):
        bp.linear_backward(np.ones((2, 4)), np.ones((2, 3)), np.ones((3, 5)))
    with pytest.raises(ValueError, match=r"dZ must have the shape of Z: dZ: \(2, 5, 3\), Z: \(2, 5, 4\)"):
        bp.attention_backward(np.ones((2, 5, 3)), *(g.standard_normal((2, 5, 4)) for _ in range(3)))
    with pytest.raises(ValueError, match=r"Q has D_K=4 but K has D_K=3"):
        bp.attention_backward(np.ones((2, 5, 4)), g.standard_normal((2, 5, 4)), g.standard_normal((2, 5, 3)),
                              g.standard_normal((2, 5, 4)))
    with pytest.raises(ValueError, match=r"activation must be one of"):
        bp.feed_forward_backward(np.ones((2, 6)), np.ones((2, 6)), random_ffn_params(g, 6, 8), "tanh")
    with pytest.raises(ValueError, match=r"ids must be integers of shape dX.shape\[:-1\].*\(dX: \(2, 3, 4\), ids: \(2, 2\)"):
        bp.embedding_backward(np.ones((2, 3, 4)), np.ones((2, 2), int), 5)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 5\)"):
        bp.embedding_backward(np.ones((1, 2, 4)), np.array([[0, 5]]), 5)
    cfg, model = _lm()
    params = bp.lm_params_from_torch(model)
    with pytest.raises(ValueError, match=r"idx has T=9 > block_size=8 \(idx: \(2, 9\)\)"):
        bp.lm_forward(params, np.zeros((2, 9), int), cfg)
    with pytest.raises(ValueError, match=r"idx must have exactly 2 axes.*\(8,\)"):
        bp.lm_forward(params, np.zeros(8, int), cfg)
    with pytest.raises(ValueError, match=r"targets must have shape logits.shape\[:-1\] = \(2, 8\), got \(2, 7\)"):
        bp.lm_loss_and_grads(params, np.zeros((2, 8), int), np.zeros((2, 7), int), cfg)
    p = {"W": np.ones((2, 3))}
    with pytest.raises(ValueError, match=r"grads\['W'\] must have the shape of params\['W'\]: \(3, 2\) vs \(2, 3\)"):
        nopt.adamw_step(p, {"W": np.ones((3, 2))}, nopt.adamw_init(p), 1e-3)
    with pytest.raises(ValueError, match=r"grads must have the keys of params; missing \['W'\]"):
        nopt.sgd_step(p, {"V": np.ones((2, 3))}, nopt.sgd_init(p), 1e-3)
    with pytest.raises(ValueError, match=r"lr must be a number >= 0"):
        nopt.adamw_step(p, {"W": np.ones((2, 3))}, nopt.adamw_init(p), -1.0)
    with pytest.raises(ValueError, match=r"max_norm must be a number > 0, got 0"):
        nopt.clip_grad_norm({"W": np.ones(3)}, 0)
    with pytest.raises(ValueError, match=r"max_norm must be a number > 0"):
        tt.clip_grad_norm([torch.nn.Parameter(torch.ones(2))], -1.0)
    with pytest.raises(ValueError, match=r"betas must be two numbers in \[0, 1\)"):
        tt.AdamW([torch.nn.Parameter(torch.ones(2))], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match=r"momentum must lie in \[0, 1\)"):
        tt.SGDMomentum([torch.nn.Parameter(torch.ones(2))], momentum=1.5)


def test_torch_optim_names_are_exported():
    for name in ("SGDMomentum", "AdamW", "clip_grad_norm", "save_checkpoint", "load_checkpoint"):
        assert name in tt.__all__ and getattr(tt, name) is getattr(__import__("tfbook.torch.optim").torch.optim, name)


def test_numpy_equals_torch_components():
    """The parity builders of error_cases_training (also meant for test_backends_parity)."""
    import error_cases_training

    for name, builders in error_cases_training.PARITY_CASES.items():
        for build in builders:
            for seed in (0, 1):
                args, kwargs, _ = build(np.random.default_rng(seed))
                a = getattr(tnp, name)(*args, **kwargs)
                b = getattr(TF, name)(*(torch.as_tensor(x) for x in args), **kwargs)
                assert a.dtype == np.float64 and b.dtype == torch.float64
                np.testing.assert_allclose(b.numpy(), a, rtol=0, atol=1e-12)  # float64 round-off
