"""``nn.Module`` wrappers around :mod:`tfbook.torch.functional`.

The modules hold parameters; the math lives in the functional layer. Each module calls
the functional version of its idea (``multi_head_attention``, ``layer_norm``,
``feed_forward``, ``patchify``, ...); the blocks wire those calls together the way the
text writes the block, ``X = X + attn(norm1(X))``, so that they can also hand back the
attention weights and use a KV cache. The tests check every block against
``tfbook.torch.encoder_block`` / ``decoder_block``, ``tfbook.numpy`` and PyTorch's own
layers. Parameters use the book's row-vector layout: ``W_Q`` has shape
``(D, D)`` and ``Q = X @ W_Q``, exactly as in the text (``nn.Linear`` stores the
transpose; :meth:`MultiHeadAttention.from_torch` and friends deal with that).

Classes, in the order a block uses them: :class:`LayerNorm`, :class:`FeedForward`,
:class:`MultiHeadAttention` (with an optional :class:`KVCache`), :class:`EncoderBlock`,
:class:`DecoderBlock`, then the input layers :class:`LearnedPositionalEmbedding`,
:class:`SinusoidalPositionalEncoding` and :class:`PatchEmbedding`.

Masks are boolean with ``True`` meaning "may attend". PyTorch's ``nn.MultiheadAttention``
and ``nn.Transformer*Layer`` use the opposite convention (True = blocked); when
comparing with them, pass ``~mask``.

None of these modules has dropout: the book's models are small and trained briefly, and
without dropout every output is a deterministic function of the parameters.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import _validate as V
from . import functional as F

__all__ = [
    "LayerNorm",
    "FeedForward",
    "KVCache",
    "MultiHeadAttention",
    "EncoderBlock",
    "DecoderBlock",
    "LearnedPositionalEmbedding",
    "SinusoidalPositionalEncoding",
    "PatchEmbedding",
]

_ACTIVATIONS = ("relu", "gelu")


def _to_numpy(t: torch.Tensor | None):
    return None if t is None else t.detach().cpu().to(torch.float64).numpy()


def _copy_(dst: torch.Tensor, src: torch.Tensor | None) -> None:
    """Copy ``src`` into ``dst`` in place; a missing ``src`` (bias=False) becomes zeros."""
    with torch.no_grad():
        if src is None:
            dst.zero_()
        else:
            if tuple(dst.shape) != tuple(src.shape):
                raise ValueError(f"cannot copy shape {tuple(src.shape)} into {tuple(dst.shape)}")
            dst.copy_(src)


def _activation_name(layer: nn.Module) -> str:
    """Read ``"relu"`` or ``"gelu"`` off a ``nn.Transformer*Layer``; anything else is an error."""
    act = layer.activation
    if act is nn.functional.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is nn.functional.gelu:
        return "gelu"
    if isinstance(act, nn.GELU):
        if act.approximate != "none":
            raise ValueError(
                f"activation GELU(approximate={act.approximate!r}) is not supported; "
                "tfbook uses the exact (erf) GELU"
            )
        return "gelu"
    raise ValueError(f"activation {act!r} is not supported; use 'relu' or 'gelu'")


def _affine(X: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``X @ W + b`` in the row-vector layout (``b`` may be None)."""
    Y = X @ W
    return Y if b is None else Y + b


class LayerNorm(nn.Module):
    """Layer normalisation over the last axis: ``gamma * (X - mean) / sqrt(var + eps) + beta``."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.d_model = V.check_positive_int("d_model", d_model)
        self.eps = float(eps)
        self.gamma = nn.Parameter(torch.ones(d_model))  # (D,)
        self.beta = nn.Parameter(torch.zeros(d_model))  # (D,)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        V.check_last_dim("X", X, self.d_model, "d_model")
        # PyTorch's fused kernel: the same arithmetic as tfbook.torch.layer_norm (the textbook
        # formula, tested equal), in one pass instead of six.
        return torch.nn.functional.layer_norm(X, (self.d_model,), self.gamma, self.beta, self.eps)

    @classmethod
    def from_torch(cls, norm: nn.LayerNorm) -> "LayerNorm":
        if len(norm.normalized_shape) != 1:
            raise ValueError(f"only 1-D normalized_shape is supported, got {norm.normalized_shape}")
        ours = cls(norm.normalized_shape[0], eps=norm.eps)
        if norm.weight is not None:
            ours = ours.to(dtype=norm.weight.dtype, device=norm.weight.device)
        _copy_norm(ours, norm)
        return ours

    def numpy_params(self) -> dict:
        return {"gamma": _to_numpy(self.gamma), "beta": _to_numpy(self.beta)}

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


class FeedForward(nn.Module):
    """Position-wise MLP ``act(X @ W_1 + b_1) @ W_2 + b_2`` with ``W_1 (D, D_ff)``."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu"):
        super().__init__()
        self.d_model = V.check_positive_int("d_model", d_model)
        self.d_ff = V.check_positive_int("d_ff", d_ff)
        V.check_choice("activation", activation, _ACTIVATIONS)
        self.activation = activation
        self.W_1 = nn.Parameter(torch.empty(d_model, d_ff))  # (D, D_ff)
        self.b_1 = nn.Parameter(torch.empty(d_ff))  # (D_ff,)
        self.W_2 = nn.Parameter(torch.empty(d_ff, d_model))  # (D_ff, D)
        self.b_2 = nn.Parameter(torch.empty(d_model))  # (D,)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # The same ranges as nn.Linear: uniform in +-1/sqrt(fan_in).
        for W, b in ((self.W_1, self.b_1), (self.W_2, self.b_2)):
            bound = 1.0 / math.sqrt(W.shape[0])
            nn.init.uniform_(W, -bound, bound)
            nn.init.uniform_(b, -bound, bound)

    def params(self) -> dict:
        return {"W_1": self.W_1, "b_1": self.b_1, "W_2": self.W_2, "b_2": self.b_2}

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        V.check_last_dim("X", X, self.d_model, "d_model")
        return F.feed_forward(X, self.params(), activation=self.activation)

    def numpy_params(self) -> dict:
        return {k: _to_numpy(v) for k, v in self.params().items()}

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_ff={self.d_ff}, activation={self.activation!r}"


class KVCache:
    """Keys and values of the tokens seen so far, for one attention layer.

    ``K`` and ``V`` have shape ``(B, H, T_past, D_K)`` (``None`` before the first call).
    Each incremental step appends the new tokens' keys and values
    (:func:`tfbook.torch.kv_cache_append`), so a new query costs ``O(T_past)`` instead
    of recomputing every earlier projection.
    """

    def __init__(self):
        self.K: torch.Tensor | None = None
        self.V: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.K is None else int(self.K.shape[-2])

    def append(self, K_new: torch.Tensor, V_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``(B, H, T_new, D_K)`` keys and values; return the full ``K`` and ``V``."""
        state = None if self.K is None else (self.K, self.V)
        self.K, self.V = F.kv_cache_append(state, K_new, V_new)  # (B, H, T_past + T_new, D_K)
        return self.K, self.V


class MultiHeadAttention(nn.Module):
    """Multi-head attention with the book's parameters ``W_Q, W_K, W_V, W_O`` of shape ``(D, D)``.

    ``forward(X_q, X_kv=None, mask=None)`` returns ``(Z, P)`` with ``Z (B, T_q, D)`` and
    the per-head weights ``P (B, H, T_q, T_kv)``. ``X_kv=None`` means self-attention.
    ``return_attention=False`` returns ``(Z, None)``: the heads are then computed by
    PyTorch's fused ``scaled_dot_product_attention``, which never materialises ``P``
    (the blocks and models ask for ``P`` only when their caller does).

    With ``kv_cache`` (a :class:`KVCache`, self-attention only) ``X_q`` holds just the new
    tokens: their keys and values are appended to the cache and the queries attend to
    all of it. ``mask`` is then ``(T_new, T_past + T_new)`` (None lets every new token see
    every cached one, right for one token at a time).
    """

    def __init__(self, d_model: int, num_heads: int, bias: bool = True):
        super().__init__()
        self.d_model = V.check_positive_int("d_model", d_model)
        self.num_heads = V.check_heads(self.d_model, num_heads, (self.d_model,), name="d_model")
        self.bias = bool(bias)
        D = d_model
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            setattr(self, name, nn.Parameter(torch.empty(D, D)))  # (D, D)
        for name in ("b_Q", "b_K", "b_V", "b_O"):
            if bias:
                setattr(self, name, nn.Parameter(torch.zeros(D)))  # (D,)
            else:
                self.register_parameter(name, None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            nn.init.xavier_uniform_(getattr(self, name))
        if self.bias:
            for name in ("b_Q", "b_K", "b_V", "b_O"):
                nn.init.zeros_(getattr(self, name))

    def params(self) -> dict:
        """The parameters as the functional layer's mha dict (torch tensors; biases may be None)."""
        return {k: getattr(self, k) for k in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")}

    def forward(self, X_q: torch.Tensor, X_kv: torch.Tensor | None = None, mask=None,
                kv_cache: KVCache | None = None, return_attention: bool = True):
        V.check_ndim("X_q", X_q, 2, what="(..., T_q, D)")
        V.check_last_dim("X_q", X_q, self.d_model, "d_model")
        if X_kv is None:
            X_kv = X_q
        elif kv_cache is not None:
            raise ValueError("kv_cache is for self-attention (X_kv=None): it appends the keys "
                             "and values of each new X_q")
        else:
            V.check_ndim("X_kv", X_kv, 2, what="(..., T_kv, D)")
            V.check_last_dim("X_kv", X_kv, self.d_model, "d_model", "X_q", X_q.shape)
        if kv_cache is None:
            return F._multi_head_attention(X_q, X_kv, self.params(), self.num_heads, mask=mask,
                                           return_attention=return_attention)
        return self._forward_cached(X_q, X_kv, mask, kv_cache, return_attention)

    def _forward_cached(self, X_q, X_kv, mask, cache: KVCache, return_attention: bool = True):
        # Only the new tokens are projected; earlier keys and values come from the cache.
        H = self.num_heads
        Q = F.split_heads(_affine(X_q, self.W_Q, self.b_Q), H)  # (B, H, T_q, D_K)
        K_new = F.split_heads(_affine(X_kv, self.W_K, self.b_K), H)  # (B, H, T_new, D_K)
        V_new = F.split_heads(_affine(X_kv, self.W_V, self.b_V), H)  # (B, H, T_new, D_V)
        K, V_all = cache.append(K_new, V_new)  # (B, H, T_past + T_new, D_K)
        if mask is not None and mask.ndim == X_q.ndim:
            mask = mask[..., None, :, :]  # shared by the heads: (B, 1, T_q, T_k)
        Z, P = F._attend(Q, K, V_all, mask, return_attention)  # (B, H, T_q, D_V); P None if fused
        Z = _affine(F.merge_heads(Z), self.W_O, self.b_O)  # (B, T_q, D)
        return Z, P

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> "MultiHeadAttention":
        """Copy an ``nn.MultiheadAttention`` (same ``embed_dim`` for queries, keys, values).

        ``nn.MultiheadAttention`` stacks the three input projections as
        ``in_proj_weight (3D, D)`` and applies them as ``X @ W.T``; the book's ``W_Q`` is
        the transpose of the first ``D`` rows, and so on.
        """
        if not isinstance(m, nn.MultiheadAttention):
            raise ValueError(f"expected nn.MultiheadAttention, got {type(m).__name__}")
        if not m._qkv_same_embed_dim:
            raise ValueError(
                f"kdim={m.kdim} and vdim={m.vdim} must equal embed_dim={m.embed_dim}"
            )
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn are not supported")
        D = m.embed_dim
        W_in = m.in_proj_weight  # (3D, D): rows are the output units
        b_in = m.in_proj_bias
        ours = cls(D, m.num_heads, bias=b_in is not None).to(dtype=W_in.dtype, device=W_in.device)
        for i, (w, b) in enumerate((("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V"))):
            _copy_(getattr(ours, w), W_in[i * D:(i + 1) * D].T)  # (D, D)
            if b_in is not None:
                _copy_(getattr(ours, b), b_in[i * D:(i + 1) * D])
        _copy_(ours.W_O, m.out_proj.weight.T)
        if ours.bias:
            _copy_(ours.b_O, m.out_proj.bias)
        return ours

    def numpy_params(self) -> dict:
        """The mha dict of API.md as float64 NumPy arrays (biases ``None`` when ``bias=False``)."""
        return {k: _to_numpy(v) for k, v in self.params().items()}

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, bias={self.bias}"


def _check_block_args(d_model, num_heads, d_ff, activation):
    V.check_positive_int("d_model", d_model)
    V.check_heads(int(d_model), num_heads, (d_model,), name="d_model")
    V.check_positive_int("d_ff", d_ff)
    V.check_choice("activation", activation, _ACTIVATIONS)


class EncoderBlock(nn.Module):
    """Self-attention and MLP sublayers, each with a residual connection and LayerNorm.

    Post-LN (``norm_first=False``, the 2017 paper)::

        X = norm1(X + attn(X));        X = norm2(X + ffn(X))

    Pre-LN (``norm_first=True``)::

        X = X + attn(norm1(X));        X = X + ffn(norm2(X))

    Equals ``nn.TransformerEncoderLayer(batch_first=True, dropout=0.0)`` with the same
    weights (see :meth:`from_torch`) and ``tfbook.numpy.encoder_block`` with
    :meth:`numpy_params`.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, norm_first: bool = False,
                 activation: str = "relu", eps: float = 1e-5):
        super().__init__()
        _check_block_args(d_model, num_heads, d_ff, activation)
        self.d_model, self.num_heads, self.d_ff = int(d_model), int(num_heads), int(d_ff)
        self.norm_first = bool(norm_first)
        self.activation = activation
        self.eps = float(eps)
        self.attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.norm1 = LayerNorm(d_model, eps)
        self.norm2 = LayerNorm(d_model, eps)

    def forward(self, X: torch.Tensor, mask=None, return_attention: bool = False,
                kv_cache: KVCache | None = None):
        """``X (B, T, D)`` -> ``(B, T, D)``; with ``return_attention`` also ``P (B, H, T, T)``
        (without it, attention runs in PyTorch's fused kernel and ``P`` is never formed).

        ``kv_cache`` (decoder-only use) makes ``X`` the new tokens only; ``mask`` must then
        be shaped ``(..., T_new, T_past + T_new)``.
        """
        need = return_attention  # materialise P only when the caller wants it
        if self.norm_first:
            Z, P = self.attn(self.norm1(X), mask=mask, kv_cache=kv_cache, return_attention=need)
            X = X + Z
            X = X + self.ffn(self.norm2(X))
        else:
            Z, P = self.attn(X, mask=mask, kv_cache=kv_cache, return_attention=need)
            X = self.norm1(X + Z)
            X = self.norm2(X + self.ffn(X))
        return (X, P) if return_attention else X

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> "EncoderBlock":
        """Copy an ``nn.TransformerEncoderLayer``, reading norm_first, activation and eps off it.

        Biases the torch layer lacks (``bias=False``) are copied as zeros. Dropout is not
        copied: outputs agree with the torch layer in eval mode or with ``dropout=0``.
        """
        if not isinstance(layer, nn.TransformerEncoderLayer):
            raise ValueError(f"expected nn.TransformerEncoderLayer, got {type(layer).__name__}")
        attn = MultiHeadAttention.from_torch(layer.self_attn)
        D, D_ff = layer.linear1.in_features, layer.linear1.out_features
        ours = cls(D, attn.num_heads, D_ff, norm_first=layer.norm_first,
                   activation=_activation_name(layer), eps=layer.norm1.eps)
        ours = ours.to(dtype=layer.linear1.weight.dtype, device=layer.linear1.weight.device)
        _copy_mha(ours.attn, attn)
        _copy_ffn(ours.ffn, layer.linear1, layer.linear2)
        _copy_norm(ours.norm1, layer.norm1)
        _copy_norm(ours.norm2, layer.norm2)
        return ours

    def numpy_params(self) -> dict:
        """The encoder-block dict of API.md as float64 NumPy arrays."""
        return {
            "attn": self.attn.numpy_params(),
            "ffn": self.ffn.numpy_params(),
            "norm1": self.norm1.numpy_params(),
            "norm2": self.norm2.numpy_params(),
        }

    def params(self) -> dict:
        """The same dict with the torch parameters, for ``tfbook.torch.encoder_block``."""
        return {
            "attn": self.attn.params(),
            "ffn": self.ffn.params(),
            "norm1": {"gamma": self.norm1.gamma, "beta": self.norm1.beta},
            "norm2": {"gamma": self.norm2.gamma, "beta": self.norm2.beta},
        }


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention over ``memory``, then the MLP.

    Post-LN (``norm_first=False``)::

        X = norm1(X + self_attn(X));  X = norm2(X + cross_attn(X, memory));  X = norm3(X + ffn(X))

    Pre-LN (``norm_first=True``) normalises the input of each sublayer instead. Equals
    ``nn.TransformerDecoderLayer(batch_first=True, dropout=0.0)`` with copied weights.
    The causal mask is not added for you: pass ``self_mask=causal_mask(T)``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, norm_first: bool = False,
                 activation: str = "relu", eps: float = 1e-5):
        super().__init__()
        _check_block_args(d_model, num_heads, d_ff, activation)
        self.d_model, self.num_heads, self.d_ff = int(d_model), int(num_heads), int(d_ff)
        self.norm_first = bool(norm_first)
        self.activation = activation
        self.eps = float(eps)
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.norm1 = LayerNorm(d_model, eps)
        self.norm2 = LayerNorm(d_model, eps)
        self.norm3 = LayerNorm(d_model, eps)

    def forward(self, X: torch.Tensor, memory: torch.Tensor, self_mask=None, cross_mask=None,
                return_attention: bool = False):
        """``X (B, T, D)``, ``memory (B, S, D)`` -> ``(B, T, D)``.

        With ``return_attention`` also returns ``(P_self (B, H, T, T), P_cross (B, H, T, S))``;
        without it, attention runs in PyTorch's fused kernel and no ``P`` is formed.
        """
        V.check_ndim("memory", memory, 2, what="(..., S, D)")
        V.check_last_dim("memory", memory, self.d_model, "d_model", "X", X.shape)
        need = return_attention  # materialise P only when the caller wants it
        if self.norm_first:
            Z, P_self = self.self_attn(self.norm1(X), mask=self_mask, return_attention=need)
            X = X + Z
            Z, P_cross = self.cross_attn(self.norm2(X), memory, mask=cross_mask, return_attention=need)
            X = X + Z
            X = X + self.ffn(self.norm3(X))
        else:
            Z, P_self = self.self_attn(X, mask=self_mask, return_attention=need)
            X = self.norm1(X + Z)
            Z, P_cross = self.cross_attn(X, memory, mask=cross_mask, return_attention=need)
            X = self.norm2(X + Z)
            X = self.norm3(X + self.ffn(X))
        return (X, (P_self, P_cross)) if return_attention else X

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> "DecoderBlock":
        """Copy an ``nn.TransformerDecoderLayer`` (see :meth:`EncoderBlock.from_torch`)."""
        if not isinstance(layer, nn.TransformerDecoderLayer):
            raise ValueError(f"expected nn.TransformerDecoderLayer, got {type(layer).__name__}")
        self_attn = MultiHeadAttention.from_torch(layer.self_attn)
        cross_attn = MultiHeadAttention.from_torch(layer.multihead_attn)
        D, D_ff = layer.linear1.in_features, layer.linear1.out_features
        ours = cls(D, self_attn.num_heads, D_ff, norm_first=layer.norm_first,
                   activation=_activation_name(layer), eps=layer.norm1.eps)
        ours = ours.to(dtype=layer.linear1.weight.dtype, device=layer.linear1.weight.device)
        _copy_mha(ours.self_attn, self_attn)
        _copy_mha(ours.cross_attn, cross_attn)
        _copy_ffn(ours.ffn, layer.linear1, layer.linear2)
        _copy_norm(ours.norm1, layer.norm1)
        _copy_norm(ours.norm2, layer.norm2)
        _copy_norm(ours.norm3, layer.norm3)
        return ours

    def numpy_params(self) -> dict:
        """The decoder-block dict of API.md as float64 NumPy arrays."""
        return {
            "self_attn": self.self_attn.numpy_params(),
            "cross_attn": self.cross_attn.numpy_params(),
            "ffn": self.ffn.numpy_params(),
            "norm1": self.norm1.numpy_params(),
            "norm2": self.norm2.numpy_params(),
            "norm3": self.norm3.numpy_params(),
        }

    def params(self) -> dict:
        """The same dict with the torch parameters, for ``tfbook.torch.decoder_block``."""
        return {
            "self_attn": self.self_attn.params(),
            "cross_attn": self.cross_attn.params(),
            "ffn": self.ffn.params(),
            **{f"norm{i}": {"gamma": n.gamma, "beta": n.beta}
               for i, n in ((1, self.norm1), (2, self.norm2), (3, self.norm3))},
        }


def _copy_mha(dst: MultiHeadAttention, src: MultiHeadAttention) -> None:
    for k, v in src.params().items():
        if getattr(dst, k) is not None:
            _copy_(getattr(dst, k), v)


def _copy_ffn(dst: FeedForward, linear1: nn.Linear, linear2: nn.Linear) -> None:
    _copy_(dst.W_1, linear1.weight.T)  # nn.Linear stores (D_ff, D); ours is (D, D_ff)
    _copy_(dst.b_1, linear1.bias)
    _copy_(dst.W_2, linear2.weight.T)
    _copy_(dst.b_2, linear2.bias)


def _copy_norm(dst: LayerNorm, norm: nn.LayerNorm) -> None:
    if norm.weight is not None:
        _copy_(dst.gamma, norm.weight)
    _copy_(dst.beta, getattr(norm, "bias", None))


class LearnedPositionalEmbedding(nn.Module):
    """A trained table ``E (max_len, D)``: position ``p`` adds row ``E[p]`` to its token."""

    def __init__(self, max_len: int, d_model: int):
        super().__init__()
        self.max_len = V.check_positive_int("max_len", max_len)
        self.d_model = V.check_positive_int("d_model", d_model)
        self.weight = nn.Parameter(torch.empty(max_len, d_model))  # (max_len, D)
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, X: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``X (..., T, D)`` plus the rows for positions ``offset .. offset + T - 1``."""
        V.check_ndim("X", X, 2, what="(..., T, D)")
        V.check_last_dim("X", X, self.d_model, "d_model")
        T = X.shape[-2]
        if offset + T > self.max_len:
            raise ValueError(
                f"positions {offset}..{offset + T - 1} exceed max_len={self.max_len} "
                f"(X: {tuple(X.shape)}, offset={offset})"
            )
        return F.learned_positional_embedding(X, self.weight[offset:])

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}"


class SinusoidalPositionalEncoding(nn.Module):
    """The fixed interleaved sin/cos table of the 2017 paper, kept as a buffer ``PE (max_len, D)``."""

    def __init__(self, d_model: int, max_len: int, base: float = 10000.0):
        super().__init__()
        self.d_model = V.check_positive_int("d_model", d_model)
        self.max_len = V.check_positive_int("max_len", max_len)
        self.base = float(base)
        # Kept in float64 (cast to the input's dtype in forward) so that a model moved to
        # float64 gets the exact table. Not persistent: it is a function of
        # (max_len, d_model, base), not a learned state.
        PE = F.sinusoidal_positional_encoding(max_len, d_model, base=base, dtype=torch.float64)
        self.register_buffer("PE", PE, persistent=False)  # (max_len, D)

    def forward(self, X: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``X (..., T, D)`` plus ``PE[offset : offset + T]``."""
        V.check_ndim("X", X, 2, what="(..., T, D)")
        V.check_last_dim("X", X, self.d_model, "d_model")
        T = X.shape[-2]
        if offset + T > self.max_len:
            raise ValueError(
                f"positions {offset}..{offset + T - 1} exceed max_len={self.max_len} "
                f"(X: {tuple(X.shape)}, offset={offset})"
            )
        return X + self.PE[offset:offset + T].to(X.dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}, base={self.base}"


class PatchEmbedding(nn.Module):
    """Cut images into ``p x p`` patches and map each flattened patch to ``D`` numbers.

    ``forward(images (B, C, H, W)) -> (B, N, D)`` with ``N = (H/p)(W/p)``, computed as
    ``patchify(images, p) @ W + b`` with ``W (C p p, D)``. This is exactly a convolution
    with kernel size and stride ``p``; :meth:`from_conv` copies one.
    """

    def __init__(self, in_channels: int, patch_size: int, d_model: int):
        super().__init__()
        self.in_channels = V.check_positive_int("in_channels", in_channels)
        self.patch_size = V.check_positive_int("patch_size", patch_size)
        self.d_model = V.check_positive_int("d_model", d_model)
        fan_in = in_channels * patch_size * patch_size
        self.W = nn.Parameter(torch.empty(fan_in, d_model))  # (C p p, D)
        self.b = nn.Parameter(torch.empty(d_model))  # (D,)
        bound = 1.0 / math.sqrt(fan_in)  # nn.Conv2d's default range
        nn.init.uniform_(self.W, -bound, bound)
        nn.init.uniform_(self.b, -bound, bound)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        V.check_ndim("images", images, 4, 4, what="(B, C, H, W)")
        if images.shape[1] != self.in_channels:
            raise ValueError(
                f"images has C={images.shape[1]} channels but in_channels={self.in_channels} "
                f"(images: {tuple(images.shape)})"
            )
        patches = F.patchify(images, self.patch_size)  # (B, N, C p p)
        return _affine(patches, self.W, self.b)  # (B, N, D)

    @classmethod
    def from_conv(cls, conv: nn.Conv2d) -> "PatchEmbedding":
        """Copy a ``Conv2d`` whose kernel size equals its stride (no padding, dilation or groups)."""
        if not isinstance(conv, nn.Conv2d):
            raise ValueError(f"expected nn.Conv2d, got {type(conv).__name__}")
        k, s = tuple(conv.kernel_size), tuple(conv.stride)
        if k[0] != k[1] or k != s:
            raise ValueError(f"kernel_size={k} and stride={s} must be equal and square")
        if tuple(conv.padding) != (0, 0) or tuple(conv.dilation) != (1, 1) or conv.groups != 1:
            raise ValueError(
                f"padding={conv.padding}, dilation={conv.dilation}, groups={conv.groups} "
                "must be 0, 1 and 1"
            )
        ours = cls(conv.in_channels, k[0], conv.out_channels)
        ours = ours.to(dtype=conv.weight.dtype, device=conv.weight.device)
        # conv.weight is (D, C, p, p); flattening (C, p, p) matches patchify's order.
        _copy_(ours.W, conv.weight.reshape(conv.out_channels, -1).T)
        _copy_(ours.b, conv.bias)
        return ours

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, patch_size={self.patch_size}, d_model={self.d_model}"
