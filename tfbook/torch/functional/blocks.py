"""The 2017 blocks: an encoder block and a decoder block, Post-LN or Pre-LN, equal to
``nn.TransformerEncoderLayer`` and ``nn.TransformerDecoderLayer``.

Part of :mod:`tfbook.torch.functional` (which re-exports every public name); the twins are in
:mod:`tfbook.numpy.blocks`.
"""

from __future__ import annotations

from ... import _validate as _v
from ._common import _float
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
    """Encoder block equal to ``nn.TransformerEncoderLayer(batch_first=True, dropout=0)``.

    ``params = {"attn", "ffn", "norm1", "norm2"}``; ``mask`` True = may attend. Post-LN
    ``X = LN1(X + MHA(X)); X = LN2(X + FFN(X))``, or Pre-LN with ``norm_first``.
    """
    X = _float(X, "X")
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
    """Decoder block equal to ``nn.TransformerDecoderLayer(batch_first=True, dropout=0)``.

    ``params = {"self_attn", "cross_attn", "ffn", "norm1", "norm2", "norm3"}``;
    ``self_mask`` broadcastable to ``(..., T, T)``, ``cross_mask`` to ``(..., T, T_m)``.
    """
    X, memory = _float(X, "X"), _float(memory, "memory")
    _v.check_ndim("X", X, 2, what="(..., T, D)")
    _v.check_ndim("memory", memory, 2, what="(..., T_m, D)")
    if memory.shape[-1] != X.shape[-1]:
        raise ValueError(f"X has D={X.shape[-1]} but memory has D={memory.shape[-1]} "
                         f"(X: {tuple(X.shape)}, memory: {tuple(memory.shape)})")
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
