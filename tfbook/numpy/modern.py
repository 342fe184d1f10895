"""NumPy components of the modern decoder (chapter 14), re-exported by :mod:`tfbook.numpy`.

The pieces that separate a Llama-style decoder from the 2017 one: RMSNorm instead of
LayerNorm, the gated SwiGLU MLP (with its SiLU), the tanh approximation of GELU (GPT-2's
MLP), rotary positions applied inside attention in either of the two layouts in use, and
grouped-query attention, where ``H`` query heads share ``H_kv`` key/value heads.

The conventions of :mod:`tfbook.numpy` hold: row vectors, boolean masks with ``True``
meaning "may attend", a fully masked query row gives zeros, dtypes are preserved, and bad
input raises ``ValueError`` naming the argument and showing the shapes.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as _v
from ._common import _as_float
from .attention import scaled_dot_product_attention
from .heads import merge_heads, split_heads
from .positions import _rope_angles, rope

__all__ = [
    "rms_norm",
    "silu",
    "swiglu",
    "gelu_tanh",
    "rope_rotate_half",
    "rope_permutation",
    "rope_attention",
    "grouped_query_attention",
    "llama_block",
    "llama_lm",
]


# ---------------------------------------------------------------------------
# Norm and activations
# ---------------------------------------------------------------------------


def rms_norm(X, gamma, eps=1e-6):
    """RMSNorm over the last axis: ``X / sqrt(mean(X**2) + eps) * gamma``, as ``F.rms_norm``.

    LayerNorm without the mean: no centring and no shift ``beta``, only the division by
    the root mean square of the row and a learned gain.

    Parameters
    ----------
    X : (..., D) ndarray
    gamma : (D,) ndarray or None
        The gain (``None``: 1).
    eps : float
        Added to the mean square; keeps an all-zero row finite.

    Returns
    -------
    (..., D) ndarray
    """
    X = _as_float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., D)")
    if gamma is not None:
        _v.check_vector("gamma", np.asarray(gamma), X.shape[-1], "D")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r} (X: {X.shape})")
    ms = np.mean(X * X, axis=-1, keepdims=True)  # (..., 1) mean square of each row
    Y = X / np.sqrt(ms + eps)
    if gamma is not None:
        Y = Y * gamma
    return Y.astype(X.dtype, copy=False)


def silu(x):
    """SiLU (also called swish): ``x * sigmoid(x) = x / (1 + exp(-x))``."""
    x = _as_float(x, "x")
    # sigmoid written so that exp never overflows: for x < 0 use exp(x) / (1 + exp(x))
    e = np.exp(-np.abs(x))
    sig = np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return (x * sig).astype(x.dtype, copy=False)


_SWIGLU_KEYS = ("W_gate", "W_up", "W_down")


def _check_swiglu_params(params, D, name="params"):
    _v.check_params(name, params, _SWIGLU_KEYS)
    _v.check_matrix(f"{name}['W_gate']", params["W_gate"], D, None, "(D, D_ff)")
    D_ff = params["W_gate"].shape[1]
    _v.check_matrix(f"{name}['W_up']", params["W_up"], D, D_ff, "(D, D_ff)")
    _v.check_matrix(f"{name}['W_down']", params["W_down"], D_ff, D, "(D_ff, D)")
    return D_ff


def swiglu(X, params):
    """The gated MLP of Llama: ``(silu(X W_gate) * (X W_up)) W_down``, no biases.

    Three matrices instead of two: at the same parameter count as a ``4D`` MLP the hidden
    width is ``D_ff = 8D/3``.

    Parameters
    ----------
    X : (..., T, D) ndarray
    params : dict
        ``W_gate (D, D_ff)``, ``W_up (D, D_ff)``, ``W_down (D_ff, D)``.

    Returns
    -------
    (..., T, D) ndarray
    """
    X = _as_float(X, "X")
    _v.check_ndim("X", X, 1, what="(..., D)")
    _check_swiglu_params(params, X.shape[-1])
    gate = silu(X @ params["W_gate"])  # (..., T, D_ff)
    up = X @ params["W_up"]  # (..., T, D_ff)
    return (gate * up) @ params["W_down"]  # (..., T, D)


def gelu_tanh(x):
    """GELU with the tanh approximation (GPT-2, BERT):
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))``, as ``F.gelu(x, approximate="tanh")``."""
    x = _as_float(x, "x")
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
    return (0.5 * x * (1.0 + np.tanh(inner))).astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------
# Rotary positions: the two layouts
# ---------------------------------------------------------------------------


def _check_rope_input(X, name="X"):
    X = _as_float(X, name)
    _v.check_ndim(name, X, 2, what="(..., T, D)")
    if X.shape[-1] % 2:
        raise ValueError(f"{name} has D={X.shape[-1]}, which must be even for rope ({name}: {X.shape})")
    return X


def _angles(T, D, positions, base, X_shape, name="positions"):
    """``positions[..., t] * omega_i``: ``(..., T, D/2)`` (positions default to ``0..T-1``).

    The angles of :func:`tfbook.numpy.rope`, checks and messages included: its helper reads
    only the shape of ``X``, so a zero-copy stand-in of shape ``X_shape`` serves.
    """
    return _rope_angles(np.broadcast_to(np.float64(0), X_shape), positions, base, name)


def rope_rotate_half(X, positions=None, base=10000.0):
    """Rotary positions in the "rotate-half" layout (GPT-NeoX, Hugging Face's Llama).

    Pair ``i`` is the coordinates ``(i, i + D/2)`` instead of ``(2i, 2i+1)``
    (:func:`tfbook.numpy.rope`); it turns by the same angle ``position * base**(-2i/D)``::

        out = X * cos + rotate_half(X) * sin,   rotate_half(X) = [-X[D/2:], X[:D/2]]

    with ``cos`` and ``sin`` repeated over the two halves. The two layouts are the same
    rotation in different coordinates: ``rope_rotate_half(X[..., p]) == rope(X)[..., p]``
    with ``p = rope_permutation(D)``.

    Parameters
    ----------
    X : (..., T, D) ndarray
        ``D`` even.
    positions : (..., T) array, optional
        Position of each row; defaults to ``0 .. T-1``.
    base : float

    Returns
    -------
    (..., T, D) ndarray
    """
    X = _check_rope_input(X)
    T, D = X.shape[-2:]
    theta = _angles(T, D, positions, base, X.shape)  # (..., T, D/2)
    c, s = np.cos(theta).astype(X.dtype), np.sin(theta).astype(X.dtype)
    x1, x2 = X[..., : D // 2], X[..., D // 2:]  # the two halves (..., T, D/2)
    return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)


def rope_permutation(D):
    """The column order that turns the interleaved layout into the rotate-half one.

    ``p = [0, 2, 4, ..., D-2, 1, 3, ..., D-1]``: the first coordinates of every pair,
    then the second ones. For every ``X``, ``rope_rotate_half(X[..., p]) == rope(X)[..., p]``,
    and because ``q[p] . k[p] == q . k`` the attention scores of the two layouts agree when
    the columns of ``W_Q`` and ``W_K`` of every head are permuted by ``p`` (how checkpoints
    are converted from one layout to the other).

    Returns
    -------
    (D,) int64 ndarray
    """
    D = _v.check_positive_int("D", D)
    if D % 2:
        raise ValueError(f"D={D} must be even (rope rotates pairs of coordinates)")
    return np.concatenate([np.arange(0, D, 2), np.arange(1, D, 2)]).astype(np.int64)


_ROPE_LAYOUTS = ("interleaved", "half")


def _rope(X, positions, base, layout, name):
    try:
        return rope(X, positions, base) if layout == "interleaved" else rope_rotate_half(X, positions, base)
    except ValueError as e:
        msg = str(e).replace("positions", name).replace("X:", f"{name[0].upper()}:")
        raise ValueError(msg) from None


def _attention_positions(Q, K, q_positions, k_positions):
    """Default positions: keys at ``0..T_k-1``, queries the last ``T_q`` of the keys'."""
    T_q, T_k = Q.shape[-2], K.shape[-2]
    if k_positions is None:
        k_positions = np.arange(T_k, dtype=np.float64)
    k_positions = np.asarray(k_positions, dtype=np.float64)
    if q_positions is None:
        if k_positions.ndim == 0 or k_positions.shape[-1] != T_k:
            raise ValueError(f"k_positions must have shape (..., T_k) with T_k={T_k}, got {k_positions.shape} "
                             f"(K: {K.shape})")
        if T_q > T_k:
            raise ValueError(f"q_positions is required when T_q={T_q} > T_k={T_k}: queries default to the "
                             f"last T_q key positions (Q: {Q.shape}, K: {K.shape})")
        q_positions = k_positions[..., T_k - T_q:]
    return q_positions, k_positions


def rope_attention(Q, K, V, mask=None, layout="interleaved", q_positions=None, k_positions=None,
                   base=10000.0, scale=None):
    """Attention with rotary positions: rotate ``Q`` and ``K``, then scaled dot-product attention.

    ``S[m, n] = rope(q_m, m) . rope(k_n, n) * scale`` depends on the positions only
    through ``m - n``; ``V`` is not rotated.

    Parameters
    ----------
    Q : (..., T_q, D_K) ndarray
    K : (..., T_k, D_K) ndarray
    V : (..., T_k, D_V) ndarray
    mask : bool ndarray, optional
        Broadcastable to ``(..., T_q, T_k)``; True = may attend.
    layout : {"interleaved", "half"}
        Pairs ``(2i, 2i+1)`` (:func:`tfbook.numpy.rope`) or ``(i, i + D_K/2)``
        (:func:`rope_rotate_half`).
    q_positions : (..., T_q) array, optional
        Defaults to the last ``T_q`` key positions (the queries are the newest tokens, as
        in a decoder reading a KV cache).
    k_positions : (..., T_k) array, optional
        Defaults to ``0 .. T_k-1``.
    base : float
    scale : float, optional
        Defaults to ``1 / sqrt(D_K)``.

    Returns
    -------
    Z : (..., T_q, D_V) ndarray
    P : (..., T_q, T_k) ndarray
    """
    Q, K, V = _as_float(Q, "Q"), _as_float(K, "K"), _as_float(V, "V")
    _v.check_qkv(Q, K, V)
    _v.check_choice("layout", layout, _ROPE_LAYOUTS)
    if Q.shape[-1] % 2:
        raise ValueError(f"Q has D_K={Q.shape[-1]}, which must be even for rope (Q: {Q.shape}, K: {K.shape})")
    q_positions, k_positions = _attention_positions(Q, K, q_positions, k_positions)
    Q = _rope(Q, q_positions, base, layout, "q_positions")
    K = _rope(K, k_positions, base, layout, "k_positions")
    return scaled_dot_product_attention(Q, K, V, mask=mask, scale=scale)


# ---------------------------------------------------------------------------
# Grouped-query attention
# ---------------------------------------------------------------------------


def _check_gqa_params(params, D, D_kv, name="params"):
    _v.check_params(name, params, ("W_Q", "W_K", "W_V", "W_O"))
    sizes = {"Q": (D, "(D, D)"), "K": (D_kv, "(D, H_kv * D_K)"), "V": (D_kv, "(D, H_kv * D_K)"),
             "O": (D, "(D, D)")}
    for k, (cols, label) in sizes.items():
        _v.check_matrix(f"{name}['W_{k}']", params[f"W_{k}"], D, cols, label)
        b = params.get(f"b_{k}")
        if b is not None:
            _v.check_vector(f"{name}['b_{k}']", b, cols, "D" if cols == D else "H_kv * D_K")


def _check_gqa_heads(D, num_heads, num_kv_heads, X_shape):
    """``H`` divides ``D`` and ``H_kv`` divides ``H``; returns ``(H, H_kv, D_K)``."""
    H = _v.check_heads(D, num_heads, X_shape)
    H_kv = _v.check_positive_int("num_kv_heads", num_kv_heads)
    if H % H_kv:
        raise ValueError(f"num_kv_heads={H_kv} does not divide num_heads={H} (X_q: {tuple(X_shape)})")
    return H, H_kv, D // H


def _head_mask(mask, X_q_ndim, batch, T_q, T_kv, H, check):
    """A mask shared by the heads ``(..., T_q, T_kv)`` gets a head axis; one with one more
    axis than ``X_q`` already has it. Checked against ``batch + (H, T_q, T_kv)``."""
    m = mask[..., None, :, :] if 3 <= mask.ndim <= X_q_ndim else mask
    try:
        check(m, T_q, T_kv, batch + (H,))
    except ValueError:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (..., T_q, T_kv) = "
            f"{batch + (T_q, T_kv)} (or (..., H, T_q, T_kv) with H={H})"
        ) from None
    return m


def _check_qk_norm(params, D_K, name="params"):
    """QK-norm's gains ``params['q_norm'], params['k_norm'] (D_K,)``: both or neither; returns
    whether they are there."""
    q, k = params.get("q_norm"), params.get("k_norm")
    if (q is None) != (k is None):
        raise ValueError(f"{name} must hold both 'q_norm' and 'k_norm' (QK-norm) or neither, got "
                         f"q_norm {_v.shape_of(q) if q is not None else None}, "
                         f"k_norm {_v.shape_of(k) if k is not None else None}")
    if q is None:
        return False
    _v.check_vector(f"{name}['q_norm']", q, D_K, "D_K")
    _v.check_vector(f"{name}['k_norm']", k, D_K, "D_K")
    return True


def grouped_query_attention(X_q, X_kv, params, num_heads, num_kv_heads, mask=None, rope=None,
                            base=10000.0, eps=1e-6):
    """Grouped-query attention: ``H`` query heads share ``H_kv`` key/value heads.

    Query head ``h`` reads key/value head ``h // (H / H_kv)`` (consecutive query heads form
    a group, as ``repeat_interleave`` and ``F.scaled_dot_product_attention(enable_gqa=True)``
    arrange them). ``H_kv = H`` is multi-head attention; ``H_kv = 1`` is multi-query
    attention. ``W_K`` and ``W_V`` have ``H_kv * D_K`` columns instead of ``D``, so the KV
    cache holds ``2 * H_kv * D_K`` numbers per token and layer instead of ``2 D``.

    Parameters
    ----------
    X_q : (..., T_q, D) ndarray
    X_kv : (..., T_kv, D) ndarray
    params : dict
        ``W_Q (D, D)``, ``W_K, W_V (D, H_kv * D_K)``, ``W_O (D, D)`` with ``D_K = D / H``;
        optional biases ``b_Q, b_O (D,)``, ``b_K, b_V (H_kv * D_K,)`` (missing or None: none);
        optional QK-norm gains ``q_norm, k_norm (D_K,)`` (both or neither): each head's query
        and key rows are RMS-normalised (:func:`rms_norm`, over ``D_K``) and scaled by them
        before the rotation, as in Qwen3 and Gemma 3 (OLMo 2 normalises the whole ``D``-wide
        projection instead), so that a score is at most ``max|q_norm| max|k_norm| sqrt(D_K)``
        whatever the weights.
    num_heads : int
        ``H``, divides ``D``.
    num_kv_heads : int
        ``H_kv``, divides ``H``.
    mask : bool ndarray, optional
        Broadcastable to ``(..., T_q, T_kv)`` (shared by heads) or, with one more axis than
        ``X_q``, to ``(..., H, T_q, T_kv)``.
    rope : {None, "interleaved", "half"}
        Rotate queries and keys of every head (positions as in :func:`rope_attention`:
        keys at ``0..T_kv-1``, queries at the last ``T_q`` of those).
    base : float
        The rope base.
    eps : float
        QK-norm's RMSNorm epsilon (used only with ``q_norm``, ``k_norm``).

    Returns
    -------
    Z : (..., T_q, D) ndarray
    P : (..., H, T_q, T_kv) ndarray
    """
    X_q, X_kv = _as_float(X_q, "X_q"), _as_float(X_kv, "X_kv")
    D = _v.check_x_q_x_kv(X_q, X_kv)
    H, H_kv, D_K = _check_gqa_heads(D, num_heads, num_kv_heads, X_q.shape)
    _check_gqa_params(params, D, H_kv * D_K)
    qk_norm = _check_qk_norm(params, D_K)
    if rope is not None:
        _v.check_choice("rope", rope, _ROPE_LAYOUTS)
        if D_K % 2:
            raise ValueError(f"rope needs an even head width, got D_K = D / H = {D_K} (X_q: {X_q.shape})")
    T_q, T_kv = X_q.shape[-2], X_kv.shape[-2]
    if rope is not None and T_q > T_kv:
        raise ValueError(f"rope places the queries at the last T_q key positions, so T_q={T_q} must be <= "
                         f"T_kv={T_kv} (X_q: {X_q.shape}, X_kv: {X_kv.shape})")
    batch = _v.broadcast_batch({"X_q": X_q.shape[:-2], "X_kv": X_kv.shape[:-2]})
    if mask is not None:
        mask = _head_mask(np.asarray(mask), X_q.ndim, batch, T_q, T_kv, H, _v.check_mask)

    def lin(X, k):
        b = params.get(f"b_{k}")
        Y = X @ params[f"W_{k}"]
        return Y if b is None else Y + b

    Q = split_heads(lin(X_q, "Q"), H)  # (..., H, T_q, D_K)
    K = split_heads(lin(X_kv, "K"), H_kv)  # (..., H_kv, T_kv, D_K)
    V = split_heads(lin(X_kv, "V"), H_kv)  # (..., H_kv, T_kv, D_K)
    if qk_norm:  # each head's rows to unit RMS, times a learned gain, before the rotation
        Q = rms_norm(Q, params["q_norm"], eps)
        K = rms_norm(K, params["k_norm"], eps)
    if rope is not None:
        pos_k = np.arange(T_kv, dtype=np.float64)
        Q = _rope(Q, pos_k[T_kv - T_q:], base, rope, "q_positions")
        K = _rope(K, pos_k, base, rope, "k_positions")
    G = H // H_kv  # query heads per key/value head
    K = np.repeat(K, G, axis=-3)  # (..., H, T_kv, D_K): head h reads K head h // G
    V = np.repeat(V, G, axis=-3)
    Z, P = scaled_dot_product_attention(Q, K, V, mask=mask)  # (..., H, T_q, D_K), (..., H, T_q, T_kv)
    return lin(merge_heads(Z), "O"), P


# ---------------------------------------------------------------------------
# The Llama block and the whole model
# ---------------------------------------------------------------------------


_LLAMA_BLOCK_KEYS = ("norm_attn", "attn", "norm_mlp", "mlp")


def _check_llama_block(params, D, num_heads, num_kv_heads, X_shape, name):
    """The block's parameters, each checked under its full name (``params['attn']['W_K']``)."""
    _v.check_params(name, params, _LLAMA_BLOCK_KEYS)
    _, H_kv, D_K = _check_gqa_heads(D, num_heads, num_kv_heads, X_shape)
    for k in ("norm_attn", "norm_mlp"):
        _v.check_params(f"{name}['{k}']", params[k], ("gamma",))
        _v.check_vector(f"{name}['{k}']['gamma']", params[k]["gamma"], D, "D")
    _check_gqa_params(params["attn"], D, H_kv * D_K, name=f"{name}['attn']")
    _check_qk_norm(params["attn"], D_K, name=f"{name}['attn']")
    _check_swiglu_params(params["mlp"], D, name=f"{name}['mlp']")


def _llama_block(X, params, num_heads, num_kv_heads, mask, rope, base, eps):
    Y = rms_norm(X, params["norm_attn"]["gamma"], eps)  # (..., T, D)
    Z, _ = grouped_query_attention(Y, Y, params["attn"], num_heads, num_kv_heads, mask=mask, rope=rope, base=base,
                                   eps=eps)
    X = X + Z  # (..., T, D)
    return X + swiglu(rms_norm(X, params["norm_mlp"]["gamma"], eps), params["mlp"])


def llama_block(X, params, num_heads, num_kv_heads, mask=None, rope="half", base=10000.0, eps=1e-6):
    """The pre-norm block of Llama: ``X = X + gqa(rms_norm(X))``, then ``X = X + swiglu(rms_norm(X))``.

    Self-attention is :func:`grouped_query_attention` (no biases, rotary positions on queries
    and keys, keys at ``0..T-1``), the MLP :func:`swiglu`; equal to
    :class:`tfbook.torch.modern.LlamaBlock` with its ``numpy_params()``.

    Parameters
    ----------
    X : (..., T, D) ndarray
    params : dict
        ``{"norm_attn": {"gamma": (D,)}, "attn": {"W_Q", "W_K", "W_V", "W_O"},
        "norm_mlp": {"gamma": (D,)}, "mlp": {"W_gate", "W_up", "W_down"}}`` with the shapes of
        :func:`grouped_query_attention` and :func:`swiglu` (``attn`` may hold QK-norm's
        ``q_norm``, ``k_norm``).
    num_heads, num_kv_heads : int
        ``H`` (divides ``D``) and ``H_kv`` (divides ``H``).
    mask : bool ndarray, optional
        Broadcastable to ``(..., T, T)``, True = may attend (a decoder passes the causal mask).
    rope : {"half", "interleaved", None}
        The rotary layout (Llama as in Hugging Face: ``"half"``); None: no positions.
    base : float
    eps : float
        The RMSNorm epsilon (of QK-norm too).

    Returns
    -------
    (..., T, D) ndarray
    """
    X = _as_float(X, "X")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    _check_llama_block(params, X.shape[-1], num_heads, num_kv_heads, X.shape, "params")
    return _llama_block(X, params, num_heads, num_kv_heads, mask, rope, base, eps)


def _check_llama_params(params):
    """The model's parameters, checked by shape only (both backends use it): returns ``(V, D)``."""
    _v.check_params("params", params, ("W_E", "blocks", "norm"))
    _v.check_matrix("params['W_E']", params["W_E"], None, None, "(V, D)")
    V, D = _v.shape_of(params["W_E"])
    if not isinstance(params["blocks"], (list, tuple)):
        raise ValueError(f"params['blocks'] must be a list of block dicts, got {type(params['blocks']).__name__}")
    _v.check_params("params['norm']", params["norm"], ("gamma",))
    _v.check_vector("params['norm']['gamma']", params["norm"]["gamma"], D, "D")
    if params.get("W_U") is not None:
        _v.check_matrix("params['W_U']", params["W_U"], D, V, "(D, V)")
    return V, D


def _check_ids_range(ids, V, ids_min, ids_max, W_E_shape):
    if ids_min < 0 or ids_max >= V:
        raise ValueError(f"ids must lie in [0, V={V}), got values in [{ids_min}, {ids_max}] "
                         f"(ids: {_v.shape_of(ids)}, params['W_E']: {tuple(W_E_shape)})")


def llama_lm(ids, params, num_heads, num_kv_heads, rope="half", base=10000.0, eps=1e-6):
    """The whole Llama-style language model's forward pass: token ids -> logits.

    ``X = W_E[ids]`` (no position table: positions enter as rotations inside attention), one
    :func:`llama_block` per entry of ``params["blocks"]`` under the causal mask, a final
    :func:`rms_norm` and the output head ``W_U`` (``W_E^T`` when tied). Equal to
    :class:`tfbook.torch.modern.LlamaLM` given ``model.numpy_params()``.

    Parameters
    ----------
    ids : (..., T) int ndarray
        Token ids in ``[0, V)``.
    params : dict
        ``{"W_E": (V, D), "blocks": [block params of llama_block], "norm": {"gamma": (D,)},
        "W_U": (D, V) or None}`` (``LlamaLM.numpy_params()``).
    num_heads, num_kv_heads, rope, base, eps
        As in :func:`llama_block` (``LlamaLMConfig``'s ``num_heads``, ``num_kv_heads``,
        ``rope``, ``rope_base``, ``eps``).

    Returns
    -------
    (..., T, V) ndarray
    """
    V, D = _check_llama_params(params)
    W_E, W_U = _as_float(params["W_E"], "params['W_E']"), params.get("W_U")
    ids = np.asarray(ids)
    _v.check_ndim("ids", ids, 1, what="(..., T)")
    if ids.dtype.kind not in "iu":
        raise ValueError(f"ids must be integers, got dtype {ids.dtype} (ids: {ids.shape})")
    if ids.size:
        _check_ids_range(ids, V, int(ids.min()), int(ids.max()), W_E.shape)
    X = W_E[ids]  # (..., T, D)
    for i, block in enumerate(params["blocks"]):
        _check_llama_block(block, D, num_heads, num_kv_heads, X.shape, f"params['blocks'][{i}]")
    mask = np.tril(np.ones((ids.shape[-1], ids.shape[-1]), dtype=bool))  # (T, T) causal
    for block in params["blocks"]:
        X = _llama_block(X, block, num_heads, num_kv_heads, mask, rope, base, eps)
    X = rms_norm(X, params["norm"]["gamma"], eps)
    return X @ (W_E.T if W_U is None else W_U)  # (..., T, V)
