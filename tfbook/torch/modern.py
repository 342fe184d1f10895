"""The modern (Llama-style) decoder as ``nn.Module``s: chapter 14.

In the order of the block: :class:`RMSNorm`, :class:`SwiGLU`, :class:`GroupedQueryAttention`
(rotary positions inside, ``num_kv_heads`` key/value heads, a KV cache),
:class:`LlamaBlock` (pre-norm: ``X = X + attn(norm(X))``, ``X = X + mlp(norm(X))``), and the
language model :class:`LlamaLM` with its :class:`LlamaLMConfig`, a sibling of
:class:`~tfbook.torch.models.DecoderLM` with the same interface (``forward``,
``forward_cached``, ``generate``), so the training loop, :func:`~tfbook.torch.models.lm_loss`
and the tasks' evaluations take either.

What differs from the 2017 decoder, piece by piece: RMSNorm instead of LayerNorm (no
centring, no shift); a gated MLP with SiLU instead of ``GELU(X W_1 + b_1) W_2 + b_2``; no
biases anywhere; no position table, since positions enter as rotations of queries and
keys in every layer; and optionally fewer key/value heads than query heads.

Every module exposes its parameters as the dicts of the functions in
:mod:`tfbook.torch.functional` (``params()``) and as NumPy arrays (``numpy_params()``);
the tests check each module against those functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as TNF

from .. import _validate as V
from .functional import modern as FM
from . import functional as F
from .models import DecoderLM, _no_hooks, _sdpa_causal
from .modules import KVCache

__all__ = [
    "RMSNorm",
    "SwiGLU",
    "GroupedQueryAttention",
    "LlamaBlock",
    "LlamaLMConfig",
    "LlamaLM",
    "kv_cache_bytes_per_token",
    "swiglu_d_ff",
]


def _to_numpy(t):
    return None if t is None else t.detach().cpu().numpy()


def kv_cache_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype=torch.float32) -> int:
    """Bytes a KV cache holds per token: ``2 (K and V) * L * H_kv * D_K * bytes per number``.

    Multi-head attention has ``H_kv = H``, so ``H_kv * D_K = D``; grouped-query attention
    divides the cache by ``H / H_kv``, multi-query (``H_kv = 1``) by ``H``.
    """
    L = V.check_positive_int("num_layers", num_layers)
    H_kv = V.check_positive_int("num_kv_heads", num_kv_heads)
    D_K = V.check_positive_int("head_dim", head_dim)
    return 2 * L * H_kv * D_K * torch.empty((), dtype=dtype).element_size()


def swiglu_d_ff(d_model: int, d_ff: int, multiple_of: int = 1) -> int:
    """The SwiGLU width with (about) the parameters of a 2-matrix MLP of width ``d_ff``:
    ``3 D d_ff' ~= 2 D d_ff``, so ``d_ff' = 2 d_ff / 3`` (``8D/3`` for ``d_ff = 4D``),
    rounded to the nearest multiple of ``multiple_of``."""
    V.check_positive_int("d_model", d_model)
    d_ff = V.check_positive_int("d_ff", d_ff)
    m = V.check_positive_int("multiple_of", multiple_of)
    return max(m, m * round(2 * d_ff / 3 / m))


class RMSNorm(nn.Module):
    """RMSNorm over the last axis with a learned gain ``gamma (D,)`` (initialised to 1).

    ``forward`` calls PyTorch's fused ``F.rms_norm``; :func:`tfbook.torch.rms_norm` spells the
    formula out, and the tests check the two are equal.
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.d_model = V.check_positive_int("d_model", d_model)
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        self.eps = float(eps)
        self.gamma = nn.Parameter(torch.ones(d_model))  # (D,)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        V.check_last_dim("X", X, self.d_model, "d_model")
        return TNF.rms_norm(X, (self.d_model,), self.gamma, self.eps)

    def params(self) -> dict:
        return {"gamma": self.gamma}

    def numpy_params(self) -> dict:
        return {"gamma": _to_numpy(self.gamma)}

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


class SwiGLU(nn.Module):
    """The gated MLP ``(silu(X W_gate) * (X W_up)) W_down``: ``W_gate, W_up (D, D_ff)``,
    ``W_down (D_ff, D)``, no biases (:func:`tfbook.torch.swiglu`)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.d_model = V.check_positive_int("d_model", d_model)
        self.d_ff = V.check_positive_int("d_ff", d_ff)
        self.W_gate = nn.Parameter(torch.empty(d_model, d_ff))  # (D, D_ff)
        self.W_up = nn.Parameter(torch.empty(d_model, d_ff))  # (D, D_ff)
        self.W_down = nn.Parameter(torch.empty(d_ff, d_model))  # (D_ff, D)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for W in (self.W_gate, self.W_up, self.W_down):
            nn.init.xavier_uniform_(W)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        V.check_last_dim("X", X, self.d_model, "d_model")
        return (TNF.silu(X @ self.W_gate) * (X @ self.W_up)) @ self.W_down  # (..., T, D)

    def params(self) -> dict:
        return {"W_gate": self.W_gate, "W_up": self.W_up, "W_down": self.W_down}

    def numpy_params(self) -> dict:
        return {k: _to_numpy(v) for k, v in self.params().items()}

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_ff={self.d_ff}"


class GroupedQueryAttention(nn.Module):
    """Self-attention with ``num_heads`` query heads sharing ``num_kv_heads`` key/value heads,
    rotary positions applied to queries and keys inside, no biases (Llama).

    ``forward(X, mask=None, kv_cache=None, return_attention=False) -> (Z, P)``: ``Z (B, T, D)``
    and, with ``return_attention``, ``P (B, H, T, T_kv)`` (else ``None``; the heads then use
    PyTorch's fused kernel with ``enable_gqa=True``). Equal to
    :func:`tfbook.torch.grouped_query_attention` with ``params()``.

    With ``kv_cache`` (a :class:`~tfbook.torch.modules.KVCache`), ``X`` holds only the new
    tokens, at positions ``len(cache) ..``; their keys are rotated *before* they are cached
    (a key's rotation depends on its own position only), and the cache holds
    ``(B, H_kv, T, D_K)`` keys and values: ``H / H_kv`` times fewer than multi-head attention.
    """

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None,
                 rope: str | None = "half", base: float = 10000.0, qk_norm: bool = False, eps: float = 1e-6):
        super().__init__()
        self.d_model = V.check_positive_int("d_model", d_model)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.num_heads, self.num_kv_heads, self.head_dim = FM._check_gqa_heads(
            d_model, num_heads, num_kv_heads, (d_model,))
        if rope is not None:
            V.check_choice("rope", rope, FM._ROPE_LAYOUTS)
            if self.head_dim % 2:
                raise ValueError(f"rope needs an even head width, got D_K = d_model / num_heads = {self.head_dim}")
        self.rope, self.base = rope, float(base)
        self._tables: dict = {}  # (dtype, device) -> cos, sin tables of the rotary angles
        D, D_kv = d_model, self.num_kv_heads * self.head_dim
        self.W_Q = nn.Parameter(torch.empty(D, D))  # (D, H * D_K)
        self.W_K = nn.Parameter(torch.empty(D, D_kv))  # (D, H_kv * D_K)
        self.W_V = nn.Parameter(torch.empty(D, D_kv))  # (D, H_kv * D_K)
        self.W_O = nn.Parameter(torch.empty(D, D))  # (H * D_K, D)
        self.qk_norm = bool(qk_norm)
        if self.qk_norm:  # RMSNorm of each head's query and key rows (over D_K), gains shared by the heads
            self.q_norm, self.k_norm = RMSNorm(self.head_dim, eps), RMSNorm(self.head_dim, eps)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for W in (self.W_Q, self.W_K, self.W_V, self.W_O):
            nn.init.xavier_uniform_(W)

    def params(self) -> dict:
        p = {"W_Q": self.W_Q, "W_K": self.W_K, "W_V": self.W_V, "W_O": self.W_O}
        if self.qk_norm:
            p.update(q_norm=self.q_norm.gamma, k_norm=self.k_norm.gamma)
        return p

    def numpy_params(self) -> dict:
        return {k: _to_numpy(v) for k, v in self.params().items()}

    def qk(self, X: torch.Tensor, offset: int = 0):
        """The queries ``(B, H, T, D_K)`` and keys ``(B, H_kv, T, D_K)`` of ``X`` at positions
        ``offset ..``, as attention scores them: projected, QK-normalised (with ``qk_norm``) and
        rotated. ``Q[h] @ K[h // G].T / sqrt(D_K)`` are the attention logits."""
        Q = F.split_heads(X @ self.W_Q, self.num_heads)  # (B, H, T, D_K)
        K = F.split_heads(X @ self.W_K, self.num_kv_heads)  # (B, H_kv, T, D_K)
        if self.qk_norm:
            Q, K = self.q_norm(Q), self.k_norm(K)
        return self._rotate(Q, offset), self._rotate(K, offset)

    def kv_cache_bytes_per_token(self, dtype=torch.float32) -> int:
        """Bytes this layer's cache grows by per token: ``2 H_kv D_K`` numbers."""
        return kv_cache_bytes_per_token(1, self.num_kv_heads, self.head_dim, dtype)

    def _cos_sin(self, offset: int, T: int, X: torch.Tensor):
        """``cos`` and ``sin`` of the angles of positions ``offset .. offset + T - 1``: ``(T, D_K/2)``,
        from a table kept per dtype and device (computed in float64, grown when needed)."""
        key = (X.dtype, X.device)
        table = self._tables.get(key)
        if table is None or table[0].shape[0] < offset + T:
            n = max(offset + T, 2 * (0 if table is None else table[0].shape[0]), 64)
            D_K = self.head_dim
            omega = self.base ** (-torch.arange(0, D_K, 2, dtype=torch.float64, device=X.device) / D_K)
            theta = torch.arange(n, dtype=torch.float64, device=X.device)[:, None] * omega  # (n, D_K/2)
            table = self._tables[key] = (torch.cos(theta).to(X.dtype), torch.sin(theta).to(X.dtype))
        return table[0][offset:offset + T], table[1][offset:offset + T]

    def _rotate(self, X: torch.Tensor, offset: int) -> torch.Tensor:
        """Rotary positions for ``X (B, H, T, D_K)`` at positions ``offset ..``: the functions
        :func:`tfbook.torch.rope` / :func:`tfbook.torch.rope_rotate_half` with their angles
        cached (the tests check the two agree)."""
        if self.rope is None:
            return X
        c, s = self._cos_sin(offset, X.shape[-2], X)  # (T, D_K/2)
        if self.rope == "half":
            x1, x2 = X.chunk(2, dim=-1)
            return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)
        x0, x1 = X[..., 0::2], X[..., 1::2]
        return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)

    def forward(self, X: torch.Tensor, mask=None, kv_cache: KVCache | None = None,
                return_attention: bool = False):
        V.check_ndim("X", X, 2, what="(..., T, D)")
        V.check_last_dim("X", X, self.d_model, "d_model")
        H, H_kv = self.num_heads, self.num_kv_heads
        T_past = 0 if kv_cache is None else len(kv_cache)
        T, T_kv = X.shape[-2], T_past + X.shape[-2]
        if mask is not None:
            F._tensor(mask, "mask")
            batch = tuple(X.shape[:-2])
            mask = FM._head_mask(mask, X.ndim, batch, T, T_kv, H, V.check_mask)
        Q, K = self.qk(X, T_past)  # (B, H, T, D_K), (B, H_kv, T, D_K): normalised (qk_norm) and rotated
        Vh = F.split_heads(X @ self.W_V, H_kv)  # (B, H_kv, T, D_K)
        if kv_cache is not None:
            K, Vh = kv_cache.append(K, Vh)  # (B, H_kv, T_past + T, D_K)
        Z, P = FM._gqa_attend(Q, K, Vh, mask=mask, return_attention=return_attention)
        return F.merge_heads(Z) @ self.W_O, P  # (B, T, D)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"rope={self.rope!r}" + (", qk_norm=True" if self.qk_norm else ""))


class LlamaBlock(nn.Module):
    """The pre-norm block of Llama: ``X = X + attn(rms_norm(X))``, then ``X = X + swiglu(rms_norm(X))``."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, d_ff: int, rope: str | None = "half",
                 base: float = 10000.0, eps: float = 1e-6, qk_norm: bool = False):
        super().__init__()
        self.norm_attn = RMSNorm(d_model, eps)
        self.attn = GroupedQueryAttention(d_model, num_heads, num_kv_heads, rope, base, qk_norm=qk_norm, eps=eps)
        self.norm_mlp = RMSNorm(d_model, eps)
        self.mlp = SwiGLU(d_model, d_ff)

    def forward(self, X: torch.Tensor, mask=None, kv_cache: KVCache | None = None,
                return_attention: bool = False):
        Z, P = self.attn(self.norm_attn(X), mask=mask, kv_cache=kv_cache, return_attention=return_attention)
        X = X + Z
        X = X + self.mlp(self.norm_mlp(X))
        return (X, P) if return_attention else X

    def _causal_applies(self) -> bool:
        """Whether :meth:`_causal_forward` computes this block (a plain ``LlamaBlock``, no hooks)."""
        return (type(self) is LlamaBlock and type(self.attn) is GroupedQueryAttention
                and _no_hooks(self, self.attn))

    def _causal_forward(self, X: torch.Tensor) -> torch.Tensor | None:
        """``self(X, mask=causal)`` for DecoderLM's path without ``P`` (``models._causal_block``):
        the same operations as :meth:`GroupedQueryAttention.forward`, with the fused kernel told
        ``is_causal=True`` (and ``enable_gqa``) instead of given a mask; ``None`` where it does not
        apply (:meth:`_causal_applies`), and the caller then calls the block."""
        if not self._causal_applies():
            return None
        attn = self.attn
        V.check_last_dim("X", X, attn.d_model, "d_model")
        Y = self.norm_attn(X)
        Q, K = attn.qk(Y, 0)  # (B, H, T, D_K), (B, H_kv, T, D_K)
        Vh = F.split_heads(Y @ attn.W_V, attn.num_kv_heads)  # (B, H_kv, T, D_K)
        Z = _sdpa_causal(Q, K, Vh, enable_gqa=True)
        X = X + F.merge_heads(Z) @ attn.W_O
        return X + self.mlp(self.norm_mlp(X))

    def numpy_params(self) -> dict:
        return {"norm_attn": self.norm_attn.numpy_params(), "attn": self.attn.numpy_params(),
                "norm_mlp": self.norm_mlp.numpy_params(), "mlp": self.mlp.numpy_params()}


@dataclass(frozen=True)
class LlamaLMConfig:
    """The sizes and choices of a :class:`LlamaLM`, a Llama-style model (frozen; checked when created).

    Attributes
    ----------
    vocab_size : int
        Number of token ids (required).
    block_size : int, default 128
        Longest context used in training and by the KV cache (rotary positions themselves
        have no limit).
    d_model : int, default 64
        D, the width of the residual stream; must be divisible by ``num_heads``.
    num_heads : int, default 4
        H, query heads; D_K = D / H must be even (rotary positions turn pairs).
    num_kv_heads : int, default 4
        H_KV, key/value heads; must divide H. H_KV = H is multi-head attention, 1 is
        multi-query, in between grouped-query with group size G = H / H_KV.
    num_layers : int, default 2
        Blocks.
    d_ff : int, default 171
        SwiGLU hidden width, about 8D/3 (the parameter count of a 4D two-matrix MLP);
        see :func:`swiglu_d_ff`.
    rope : str, default "half"
        Rotary layout: ``"half"`` (Llama as in Hugging Face: dimension i pairs with
        i + D_K/2) or ``"interleaved"`` (pairs 2i, 2i+1, as in the RoFormer paper).
    rope_base : float, default 10000.0
        The angle of pair i at position p is p * rope_base**(-2i/D_K).
    tie_weights : bool, default True
        The output head reuses the token embedding W_E (transposed).
    eps : float, default 1e-6
        RMSNorm's epsilon.
    qk_norm : bool, default False
        QK-norm (OLMo 2, Qwen3, Gemma 3): RMSNorm with a learned gain of each head's query
        and key rows before the rotation.
    """
    vocab_size: int  # number of token ids
    block_size: int = 128  # longest context (rope itself has no limit; the cache and training do)
    d_model: int = 64  # D, the width of the residual stream
    num_heads: int = 4  # H query heads; D_K = D / H
    num_kv_heads: int = 4  # H_kv key/value heads (H: multi-head, 1: multi-query), divides H
    num_layers: int = 2  # blocks
    d_ff: int = 171  # SwiGLU width, about 8D/3 (the parameters of a 4D two-matrix MLP)
    rope: str = "half"  # rotary layout: "half" (Llama as in Hugging Face) or "interleaved"
    rope_base: float = 10000.0  # angle of pair i at position p: p * base**(-2i/D_K)
    tie_weights: bool = True  # the output head reuses the token embedding W_E (transposed)
    eps: float = 1e-6  # RMSNorm epsilon
    qk_norm: bool = False  # RMSNorm of each head's queries and keys before the rotation

    def __post_init__(self):
        V.check_positive_int("vocab_size", self.vocab_size)
        V.check_positive_int("block_size", self.block_size)
        V.check_positive_int("d_model", self.d_model)
        V.check_positive_int("d_ff", self.d_ff)
        V.check_positive_int("num_layers", self.num_layers)
        _, _, D_K = FM._check_gqa_heads(self.d_model, self.num_heads, self.num_kv_heads, (self.d_model,))
        V.check_choice("rope", self.rope, FM._ROPE_LAYOUTS)
        if D_K % 2:
            raise ValueError(f"rope needs an even head width, got D_K = d_model / num_heads = {D_K}")


class LlamaLM(nn.Module):
    """A Llama-style decoder-only language model, the sibling of :class:`~tfbook.torch.models.DecoderLM`.

    Token embedding (no position table), ``num_layers`` :class:`LlamaBlock` s with a causal
    mask, a final :class:`RMSNorm` and the (tied) output head. ``forward(idx (B, T))``
    returns logits ``(B, T, vocab_size)``; :meth:`forward`, :meth:`forward_cached` and
    :meth:`generate` are ``DecoderLM``'s own methods.
    """

    def __init__(self, config: LlamaLMConfig):
        super().__init__()
        self.config = c = config
        D = c.d_model
        self.W_E = nn.Parameter(0.02 * torch.randn(c.vocab_size, D))  # (V, D), as DecoderLM
        self.blocks = nn.ModuleList(
            LlamaBlock(D, c.num_heads, c.num_kv_heads, c.d_ff, c.rope, c.rope_base, c.eps, qk_norm=c.qk_norm)
            for _ in range(c.num_layers)
        )
        self.norm = RMSNorm(D, c.eps)
        if c.tie_weights:
            self.register_parameter("W_U", None)
        else:
            self.W_U = nn.Parameter(0.02 * torch.randn(D, c.vocab_size))  # (D, V)

    def _embed(self, idx: torch.Tensor, offset: int) -> torch.Tensor:
        return F.embedding_lookup(idx, self.W_E)  # (B, T, D); positions enter in attention (rope)

    # DecoderLM's methods serve as they are: they reach the model only through _embed, the
    # blocks (LlamaBlock takes the same mask, kv_cache and return_attention arguments and
    # uses the fused kernel when no P is asked for), self.norm and the output head.
    _unembed = DecoderLM._unembed
    forward = DecoderLM.forward
    forward_cached = DecoderLM.forward_cached
    generate = DecoderLM.generate  # the same sampling loop: it only calls forward and forward_cached

    def kv_cache_bytes_per_token(self, dtype=torch.float32) -> int:
        c = self.config
        return kv_cache_bytes_per_token(c.num_layers, c.num_kv_heads, c.d_model // c.num_heads, dtype)

    def numpy_params(self) -> dict:
        """``{"W_E", "blocks": [block dicts], "norm", "W_U"}`` as NumPy arrays (``W_U`` None when tied)."""
        return {"W_E": _to_numpy(self.W_E), "blocks": [b.numpy_params() for b in self.blocks],
                "norm": self.norm.numpy_params(), "W_U": _to_numpy(self.W_U)}
