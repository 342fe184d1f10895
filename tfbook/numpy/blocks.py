"""The 2017 blocks: an encoder block and a decoder block, Post-LN or Pre-LN, equal to
``nn.TransformerEncoderLayer`` and ``nn.TransformerDecoderLayer``.

Part of :mod:`tfbook.numpy` (which re-exports every public name); the twins are in
:mod:`tfbook.torch.functional.blocks`.
"""

from __future__ import annotations

from .. import _validate as _v
from ._common import _as_float
from .heads import multi_head_attention
from .norms import _ACTIVATIONS, feed_forward, layer_norm

__all__ = [
    "encoder_block",
    "decoder_block",
]


# ---------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------


def _norm(X, p, eps):
    return layer_norm(X, p.get("gamma"), p.get("beta"), eps)


def encoder_block(X, params, num_heads, norm_first=False, activation="relu", mask=None, eps=1e-5):
    """One encoder block, equal to ``nn.TransformerEncoderLayer(batch_first=True, dropout=0)``.

    Post-LN (``norm_first=False``, the original paper)::

        X = LN1(X + MHA(X));  X = LN2(X + FFN(X))

    Pre-LN (``norm_first=True``)::

        X = X + MHA(LN1(X));  X = X + FFN(LN2(X))

    Parameters
    ----------
    X : (..., T, D) ndarray
    params : dict
        ``{"attn": mha, "ffn": ffn, "norm1": norm, "norm2": norm}``.
    mask : bool ndarray, optional
        True = may attend, broadcastable to ``(..., T, T)``.

    Returns
    -------
    (..., T, D) ndarray
    """
    X = _as_float(X, "X")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    _v.check_params("params", params, ("attn", "ffn", "norm1", "norm2"))
    _v.check_choice("activation", activation, _ACTIVATIONS)

    def sa(Y):
        return multi_head_attention(Y, Y, params["attn"], num_heads, mask=mask)[0]

    def ff(Y):
        return feed_forward(Y, params["ffn"], activation)

    if norm_first:
        X = X + sa(_norm(X, params["norm1"], eps))
        X = X + ff(_norm(X, params["norm2"], eps))
    else:
        X = _norm(X + sa(X), params["norm1"], eps)
        X = _norm(X + ff(X), params["norm2"], eps)
    return X


def decoder_block(X, memory, params, num_heads, norm_first=False, activation="relu",
                  self_mask=None, cross_mask=None, eps=1e-5):
    """One decoder block, equal to ``nn.TransformerDecoderLayer(batch_first=True, dropout=0)``.

    Self-attention over ``X`` (usually with a causal ``self_mask``), cross-attention
    from ``X`` to ``memory``, then the MLP; each with a residual and a LayerNorm,
    placed after (Post-LN) or before (Pre-LN, ``norm_first=True``) the sublayer.

    Parameters
    ----------
    X : (..., T, D) ndarray
        Decoder input.
    memory : (..., T_m, D) ndarray
        Encoder output.
    params : dict
        ``{"self_attn", "cross_attn", "ffn", "norm1", "norm2", "norm3"}``.
    self_mask : bool ndarray, optional
        Broadcastable to ``(..., T, T)``.
    cross_mask : bool ndarray, optional
        Broadcastable to ``(..., T, T_m)``.

    Returns
    -------
    (..., T, D) ndarray
    """
    X, memory = _as_float(X, "X"), _as_float(memory, "memory")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    _v.check_ndim("memory", memory, 2, what="(..., T_m, D)")
    if memory.shape[-1] != X.shape[-1]:
        raise ValueError(f"X has D={X.shape[-1]} but memory has D={memory.shape[-1]} "
                         f"(X: {X.shape}, memory: {memory.shape})")
    _v.check_params("params", params, ("self_attn", "cross_attn", "ffn", "norm1", "norm2", "norm3"))
    _v.check_choice("activation", activation, _ACTIVATIONS)

    def sa(Y):
        return multi_head_attention(Y, Y, params["self_attn"], num_heads, mask=self_mask)[0]

    def ca(Y):
        return multi_head_attention(Y, memory, params["cross_attn"], num_heads, mask=cross_mask)[0]

    def ff(Y):
        return feed_forward(Y, params["ffn"], activation)

    if norm_first:
        X = X + sa(_norm(X, params["norm1"], eps))
        X = X + ca(_norm(X, params["norm2"], eps))
        X = X + ff(_norm(X, params["norm3"], eps))
    else:
        X = _norm(X + sa(X), params["norm1"], eps)
        X = _norm(X + ca(X), params["norm2"], eps)
        X = _norm(X + ff(X), params["norm3"], eps)
    return X
