"""Backward passes of the transformer in NumPy (chapter 10), each the chain rule written out.

NumPy only: PyTorch's twin of this module is autograd, which the tests compare every function
with.

Every ``*_backward`` function takes the gradient of the loss with respect to a layer's
output (``dY``, ``dZ``: same shape as the output) and the layer's forward inputs, recomputes
what it needs of the forward pass, and returns the gradients with respect to the inputs and
parameters, in the shapes of those inputs and parameters:

* :func:`softmax_backward` ``dS = P * (dP - sum(dP * P))`` (row-wise Jacobian-vector product);
* :func:`layer_norm_backward`, :func:`relu_backward`, :func:`gelu_backward`,
  :func:`feed_forward_backward`;
* :func:`attention_backward` (scaled dot-product attention), :func:`multi_head_attention_backward`;
* :func:`encoder_block_backward` (the residual block, Post-LN or Pre-LN; a decoder-only block
  is this block with a causal mask);
* :func:`embedding_backward` (a scatter-add into the rows that were looked up).

On top of them, a tiny decoder-only language model in pure NumPy with the parameters and
arithmetic of :class:`tfbook.torch.DecoderLM` (Pre-LN or Post-LN, learned positions, tied or
untied output): :func:`lm_params_from_torch` copies a model's parameters into a flat dict
keyed by the names of ``model.named_parameters()``, :func:`lm_forward` gives the logits and
:func:`lm_loss_and_grads` the loss and every parameter's gradient. One optimisation step is
:func:`tfbook.numpy.optim.adamw_step` on those gradients; the chapter writes the loop.

Everything is checked against autograd in float64 (``tests/test_training_from_scratch.py``).
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as _v
from .. import numpy as tnp  # the package: the forward functions, by their public names

__all__ = [
    "softmax_backward",
    "layer_norm_backward",
    "relu_backward",
    "gelu_backward",
    "linear_backward",
    "feed_forward_backward",
    "attention_backward",
    "multi_head_attention_backward",
    "encoder_block_backward",
    "embedding_backward",
    "lm_params_from_torch",
    "lm_forward",
    "lm_loss_and_grads",
]


def _same_shape(name_a, a, name_b, b):
    if np.shape(a) != np.shape(b):
        raise ValueError(f"{name_a} must have the shape of {name_b}: {name_a}: {np.shape(a)}, "
                         f"{name_b}: {np.shape(b)}")


def _sum_to(x, shape):
    """Sum ``x`` over the leading axes it has beyond ``shape`` (undo broadcasting)."""
    return x.reshape(-1, *shape).sum(axis=0) if x.shape != tuple(shape) else x


# ---------------------------------------------------------------------------------------
# Softmax, LayerNorm, activations, linear maps, the MLP
# ---------------------------------------------------------------------------------------


def softmax_backward(dP, P, axis=-1):
    """Given ``P = softmax(S)`` along ``axis`` and ``dP = dL/dP``, return ``dS = dL/dS``.

    The Jacobian of one row is ``diag(p) - p p^T``, so
    ``dS = P * (dP - sum(dP * P, axis))``: never forms the ``(V, V)`` matrix.
    """
    dP, P = np.asarray(dP), np.asarray(P)
    _same_shape("dP", dP, "P", P)
    return P * (dP - np.sum(dP * P, axis=axis, keepdims=True))


def layer_norm_backward(dY, X, gamma, eps=1e-5):
    """Backward of ``Y = gamma * (X - mu) / sqrt(var + eps) + beta`` over the last axis.

    With ``Xhat = (X - mu) * r``, ``r = 1 / sqrt(var + eps)`` and ``G = dY * gamma``::

        dX = r * (G - mean(G) - Xhat * mean(G * Xhat))     # means over the last axis
        dgamma = sum(dY * Xhat),   dbeta = sum(dY)         # sums over every leading axis

    Returns ``(dX, dgamma, dbeta)``; with ``gamma=None`` (no gain) ``dgamma`` is None.
    """
    dY, X = np.asarray(dY), np.asarray(X)
    _same_shape("dY", dY, "X", X)
    _v.check_ndim("X", X, 1, what="(..., D)")
    D = X.shape[-1]
    if gamma is not None:
        _v.check_vector("gamma", np.asarray(gamma), D, "D")
    mu = X.mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(((X - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    Xhat = (X - mu) * r
    G = dY if gamma is None else dY * gamma
    dX = r * (G - G.mean(axis=-1, keepdims=True) - Xhat * (G * Xhat).mean(axis=-1, keepdims=True))
    dgamma = None if gamma is None else (dY * Xhat).reshape(-1, D).sum(axis=0)
    dbeta = dY.reshape(-1, D).sum(axis=0)
    return dX, dgamma, dbeta


def relu_backward(dY, X):
    """``relu'(x) = 1`` where ``x > 0``, else 0 (PyTorch's choice at exactly 0)."""
    _same_shape("dY", dY, "X", X)
    return dY * (np.asarray(X) > 0)


def gelu_backward(dY, X):
    """``gelu(x) = x Phi(x)``, so ``gelu'(x) = Phi(x) + x phi(x)`` (``phi`` the normal density)."""
    _same_shape("dY", dY, "X", X)
    X = np.asarray(X)
    Phi = 0.5 * (1.0 + tnp._erf(X / math.sqrt(2.0)))  # the normal CDF, with gelu's own erf
    phi = np.exp(-0.5 * X * X) / math.sqrt(2 * math.pi)
    return dY * (Phi + X * phi)


def linear_backward(dY, X, W):
    """Backward of ``Y = X @ W + b`` with ``X (..., D_in)``, ``W (D_in, D_out)``.

    ``dX = dY @ W^T``; ``dW = X^T dY`` and ``db = sum(dY)``, summed over every leading axis
    (the same ``W`` serves every position of every sequence). Returns ``(dX, dW, db)``.
    """
    dY, X, W = np.asarray(dY), np.asarray(X), np.asarray(W)
    _v.check_ndim("W", W, 2, 2, what="(D_in, D_out)")
    if X.shape[-1] != W.shape[0] or dY.shape != X.shape[:-1] + (W.shape[1],):
        raise ValueError(f"dY must have shape X.shape[:-1] + (D_out,) with X @ W defined "
                         f"(dY: {dY.shape}, X: {X.shape}, W: {W.shape})")
    dX = dY @ W.T
    dW = X.reshape(-1, X.shape[-1]).T @ dY.reshape(-1, dY.shape[-1])
    db = dY.reshape(-1, dY.shape[-1]).sum(axis=0)
    return dX, dW, db


_ACT_BACKWARD = {"relu": relu_backward, "gelu": gelu_backward}


def feed_forward_backward(dY, X, params, activation="relu"):
    """Backward of ``Y = act(X @ W_1 + b_1) @ W_2 + b_2``; returns ``(dX, grads)``,
    ``grads`` with the keys of ``params`` (``W_1, b_1, W_2, b_2``)."""
    _v.check_choice("activation", activation, tuple(_ACT_BACKWARD))
    Y = tnp.feed_forward(X, params, activation)  # validates X and params
    _same_shape("dY", dY, "the output", Y)
    Hpre = X @ params["W_1"] + params["b_1"]  # (..., D_ff)
    H = tnp.relu(Hpre) if activation == "relu" else tnp.gelu(Hpre)
    dH, dW_2, db_2 = linear_backward(dY, H, params["W_2"])
    dHpre = _ACT_BACKWARD[activation](dH, Hpre)
    dX, dW_1, db_1 = linear_backward(dHpre, X, params["W_1"])
    return dX, {"W_1": dW_1, "b_1": db_1, "W_2": dW_2, "b_2": db_2}


# ---------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------


def attention_backward(dZ, Q, K, V, mask=None, scale=None):
    """Backward of ``Z, P = scaled_dot_product_attention(Q, K, V, mask, scale)``.

    ``Z = P V`` and ``P = softmax(S)``, ``S = scale * Q K^T`` (masked entries ``-inf``)::

        dV = P^T dZ,   dP = dZ V^T,   dS = P * (dP - rowsum(dP * P)),
        dQ = scale * dS K,   dK = scale * dS^T Q

    A masked entry has ``P = 0``, hence ``dS = 0``: no gradient flows through it.
    Returns ``(dQ, dK, dV)`` in the shapes of ``Q, K, V`` (batch axes broadcast by the
    forward pass are summed back).
    """
    Z, P = tnp.scaled_dot_product_attention(Q, K, V, mask=mask, scale=scale)  # validates
    _same_shape("dZ", dZ, "Z", Z)
    Q, K, V = np.asarray(Q), np.asarray(K), np.asarray(V)
    if scale is None:
        scale = 1.0 / math.sqrt(Q.shape[-1])
    dV = np.swapaxes(P, -1, -2) @ dZ
    dP = dZ @ np.swapaxes(V, -1, -2)
    dS = softmax_backward(dP, P)
    dQ = scale * (dS @ K)
    dK = scale * (np.swapaxes(dS, -1, -2) @ Q)
    return _sum_to(dQ, Q.shape), _sum_to(dK, K.shape), _sum_to(dV, V.shape)


def multi_head_attention_backward(dZ, X_q, X_kv, params, num_heads, mask=None):
    """Backward of ``Z, P = multi_head_attention(X_q, X_kv, params, num_heads, mask)``.

    Undo the output projection (a linear map), merge the heads' gradients back through
    :func:`attention_backward`, then the three input projections. For self-attention
    (``X_kv`` is ``X_q``) the gradient with respect to the input is ``dX_q + dX_kv``: the
    input reaches the output along two paths and their gradients add.
    Returns ``(dX_q, dX_kv, grads)``, ``grads`` with the keys of ``params`` (None for a
    bias that is None).
    """
    Z, _ = tnp.multi_head_attention(X_q, X_kv, params, num_heads, mask=mask)  # validates
    _same_shape("dZ", dZ, "Z", Z)
    X_q, X_kv = np.asarray(X_q), np.asarray(X_kv)
    if X_q.shape[:-2] != X_kv.shape[:-2]:
        raise ValueError(f"X_q and X_kv must have the same batch axes (X_q: {X_q.shape}, X_kv: {X_kv.shape})")
    H = int(num_heads)

    def lin(X, k):
        b = params.get("b" + k[1:])
        return X @ params[k] + (0 if b is None else b)

    Q, K, V = (tnp.split_heads(lin(X, k), H) for X, k in ((X_q, "W_Q"), (X_kv, "W_K"), (X_kv, "W_V")))
    if mask is not None:
        mask = np.asarray(mask)
        if 3 <= mask.ndim <= X_q.ndim:
            mask = mask[..., None, :, :]  # shared by the heads
    Zh, _ = tnp.scaled_dot_product_attention(Q, K, V, mask=mask)  # (..., H, T_q, D/H)
    grads = {}
    dM, grads["W_O"], grads["b_O"] = linear_backward(dZ, tnp.merge_heads(Zh), params["W_O"])
    dQ, dK, dV = attention_backward(tnp.split_heads(dM, H), Q, K, V, mask=mask)
    dX_q, grads["W_Q"], grads["b_Q"] = linear_backward(tnp.merge_heads(dQ), X_q, params["W_Q"])
    dX_k, grads["W_K"], grads["b_K"] = linear_backward(tnp.merge_heads(dK), X_kv, params["W_K"])
    dX_v, grads["W_V"], grads["b_V"] = linear_backward(tnp.merge_heads(dV), X_kv, params["W_V"])
    for k in ("b_Q", "b_K", "b_V", "b_O"):
        if params.get(k) is None:
            grads[k] = None
    return dX_q, dX_k + dX_v, grads


# ---------------------------------------------------------------------------------------
# The residual block, the embedding
# ---------------------------------------------------------------------------------------


def encoder_block_backward(dY, X, params, num_heads, norm_first=False, activation="relu", mask=None,
                           eps=1e-5):
    """Backward of ``Y = encoder_block(X, params, num_heads, norm_first, activation, mask, eps)``.

    A residual ``Y = X + f(X)`` passes ``dY`` through unchanged and adds ``f``'s share:
    ``dX = dY + J_f^T dY``. Pre-LN (``norm_first=True``)::

        X1 = X + attn(norm1(X)),        Y = X1 + ffn(norm2(X1))

    Post-LN::

        X1 = norm1(X + attn(X)),        Y = norm2(X1 + ffn(X1))

    Returns ``(dX, grads)``, ``grads`` nested as ``params`` (``attn``, ``ffn``, ``norm1``, ``norm2``).
    """
    Y = tnp.encoder_block(X, params, num_heads, norm_first, activation, mask, eps)  # validates
    _same_shape("dY", dY, "Y", Y)
    X = np.asarray(X)
    a, f, n1, n2 = params["attn"], params["ffn"], params["norm1"], params["norm2"]

    def norm(Z, p):
        return tnp.layer_norm(Z, p.get("gamma"), p.get("beta"), eps)

    def norm_back(dZ, Z, p):
        dZin, dg, db = layer_norm_backward(dZ, Z, p.get("gamma"), eps)
        return dZin, {"gamma": dg, "beta": db}

    def attn_back(dZ, Z):  # self-attention: both paths into the input
        dq, dkv, g = multi_head_attention_backward(dZ, Z, Z, a, num_heads, mask)
        return dq + dkv, g

    grads = {}
    if norm_first:
        A = norm(X, n1)
        X1 = X + tnp.multi_head_attention(A, A, a, num_heads, mask)[0]
        F = norm(X1, n2)
        dF, grads["ffn"] = feed_forward_backward(dY, F, f, activation)
        dX1_norm, grads["norm2"] = norm_back(dF, X1, n2)
        dX1 = dY + dX1_norm  # the residual path plus the MLP path
        dA, grads["attn"] = attn_back(dX1, A)
        dX_norm, grads["norm1"] = norm_back(dA, X, n1)
        dX = dX1 + dX_norm
    else:
        U = X + tnp.multi_head_attention(X, X, a, num_heads, mask)[0]
        X1 = norm(U, n1)
        W = X1 + tnp.feed_forward(X1, f, activation)
        dW, grads["norm2"] = norm_back(dY, W, n2)
        dX1_ffn, grads["ffn"] = feed_forward_backward(dW, X1, f, activation)
        dU, grads["norm1"] = norm_back(dW + dX1_ffn, U, n1)
        dX_attn, grads["attn"] = attn_back(dU, X)
        dX = dU + dX_attn
    return dX, grads


def embedding_backward(dX, ids, vocab_size):
    """Backward of ``X = W_E[ids]``: row ``v`` of ``dW_E`` is the sum of ``dX`` over every
    position whose token is ``v`` (a token used twice gets both gradients).
    Returns ``dW_E (vocab_size, D)``."""
    dX, ids = np.asarray(dX), np.asarray(ids)
    vocab_size = _v.check_positive_int("vocab_size", vocab_size)
    if ids.dtype.kind not in "iu" or dX.shape[:-1] != ids.shape:
        raise ValueError(f"ids must be integers of shape dX.shape[:-1] (dX: {dX.shape}, ids: {ids.shape}, "
                         f"dtype {ids.dtype})")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"ids must lie in [0, {vocab_size}), got {ids.min()}..{ids.max()} (ids: {ids.shape})")
    dW = np.zeros((vocab_size, dX.shape[-1]), dtype=dX.dtype)
    np.add.at(dW, ids.reshape(-1), dX.reshape(-1, dX.shape[-1]))
    return dW


# ---------------------------------------------------------------------------------------
# A tiny decoder-only language model in NumPy
# ---------------------------------------------------------------------------------------

_MHA = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
_FFN = ("W_1", "b_1", "W_2", "b_2")


def lm_params_from_torch(model) -> dict:
    """A :class:`tfbook.torch.DecoderLM`'s parameters as float64 NumPy arrays, keyed by the
    names of ``model.named_parameters()`` (``W_E``, ``pos.weight``, ``blocks.0.attn.W_Q``, ...)."""
    c = getattr(model, "config", None)
    if c is None or not hasattr(c, "num_layers") or getattr(c, "pos", None) != "learned":
        raise ValueError("model must be a tfbook.torch.DecoderLM with pos='learned', got "
                         f"{type(model).__name__} (pos={getattr(c, 'pos', None)!r})")
    return {k: p.detach().cpu().double().numpy().copy() for k, p in model.named_parameters()}


def _block(params, i):
    b = f"blocks.{i}."
    return {
        "attn": {k: params.get(b + "attn." + k) for k in _MHA},
        "ffn": {k: params[b + "ffn." + k] for k in _FFN},
        "norm1": {"gamma": params[b + "norm1.gamma"], "beta": params[b + "norm1.beta"]},
        "norm2": {"gamma": params[b + "norm2.gamma"], "beta": params[b + "norm2.beta"]},
    }


def _check_lm(params, idx, config):
    for attr in ("vocab_size", "num_layers", "num_heads", "norm_first", "activation", "eps", "tie_weights"):
        if not hasattr(config, attr):
            raise ValueError(f"config must be a DecoderLMConfig (missing {attr!r}), got {type(config).__name__}")
    if config.pos != "learned":
        raise ValueError(f"config.pos must be 'learned', got {config.pos!r}")
    need = ["W_E", "pos.weight"] + (["norm.gamma", "norm.beta"] if config.norm_first else [])
    need += [] if config.tie_weights else ["W_U"]
    _v.check_params("params", params, need + [f"blocks.{i}.ffn.W_1" for i in range(config.num_layers)])
    idx = np.asarray(idx)
    _v.check_ndim("idx", idx, 2, 2, what="(B, T)")
    if idx.dtype.kind not in "iu":
        raise ValueError(f"idx must be integers, got dtype {idx.dtype} (idx: {idx.shape})")
    T_max, V = params["pos.weight"].shape[0], params["W_E"].shape[0]
    if idx.shape[1] > T_max:
        raise ValueError(f"idx has T={idx.shape[1]} > block_size={T_max} (idx: {idx.shape})")
    if idx.size and (idx.min() < 0 or idx.max() >= V):
        raise ValueError(f"idx must lie in [0, {V}), got {idx.min()}..{idx.max()} (idx: {idx.shape})")
    return idx


def _lm_forward(params, idx, config):
    """Logits and what the backward pass needs: the inputs of every block and the final norm."""
    T = idx.shape[1]
    X = params["W_E"][idx] + params["pos.weight"][:T]  # (B, T, D)
    mask = tnp.causal_mask(T)
    inputs = []
    for i in range(config.num_layers):
        inputs.append(X)
        X = tnp.encoder_block(X, _block(params, i), config.num_heads, config.norm_first, config.activation,
                              mask, config.eps)
    Xf = tnp.layer_norm(X, params["norm.gamma"], params["norm.beta"], config.eps) if config.norm_first else X
    W_U = params["W_E"].T if config.tie_weights else params["W_U"]  # (D, V)
    return Xf @ W_U, (inputs, X, Xf, mask)


def lm_forward(params, idx, config):
    """Logits ``(B, T, V)`` of the NumPy decoder-only model for token ids ``idx (B, T)``.

    ``params`` as :func:`lm_params_from_torch` gives them; ``config`` a
    :class:`tfbook.torch.DecoderLMConfig` (learned positions). Equals ``DecoderLM(config)(idx)``
    with the same parameters.
    """
    idx = _check_lm(params, idx, config)
    return _lm_forward(params, idx, config)[0]


def lm_loss_and_grads(params, idx, targets, config, ignore_index=-100):
    """Mean cross-entropy of :func:`lm_forward` against ``targets (B, T)`` and its gradient
    with respect to every parameter: ``(loss, grads)``, ``grads`` keyed as ``params``.

    The backward pass runs the forward in reverse: the loss gives ``dlogits``
    (:func:`tfbook.numpy.cross_entropy_grad`); the output projection gives ``dW_U`` (added
    to ``dW_E`` when the weights are tied: one matrix used twice gets two gradients) and the
    gradient of the last hidden state; then the final norm, each block from the last to
    the first (:func:`encoder_block_backward`), the positions and the embedding rows.
    """
    idx = _check_lm(params, idx, config)
    logits, (inputs, X, Xf, mask) = _lm_forward(params, idx, config)
    loss = tnp.cross_entropy(logits, targets, ignore_index)
    dlogits = tnp.cross_entropy_grad(logits, targets, ignore_index)  # (B, T, V)
    W_U = params["W_E"].T if config.tie_weights else params["W_U"]
    grads = {}
    dXf, dW_U, _ = linear_backward(dlogits, Xf, W_U)
    if config.norm_first:
        dX, grads["norm.gamma"], grads["norm.beta"] = layer_norm_backward(dXf, X, params["norm.gamma"], config.eps)
    else:
        dX = dXf
    for i in reversed(range(config.num_layers)):
        dX, g = encoder_block_backward(dX, inputs[i], _block(params, i), config.num_heads, config.norm_first,
                                       config.activation, mask, config.eps)
        for part, sub in g.items():
            for k, v in sub.items():
                if v is not None:
                    grads[f"blocks.{i}.{part}.{k}"] = v
    dpos = np.zeros_like(params["pos.weight"])
    dpos[: idx.shape[1]] = dX.sum(axis=0)
    grads["pos.weight"] = dpos
    dW_E = embedding_backward(dX, idx, params["W_E"].shape[0])
    if config.tie_weights:
        dW_E = dW_E + dW_U.T
    else:
        grads["W_U"] = dW_U
    grads["W_E"] = dW_E
    return loss, {k: grads[k] for k in params}
