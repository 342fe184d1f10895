"""Chapter 23's models as ``nn.Module`` classes: a small stack of token mixers, each softmax attention or
one of the recurrences of :mod:`tfbook.torch.functional.recurrence`, for the associative-recall task.

* :class:`RecurrenceConfig`: the sizes and the layout, one kind per layer (frozen; checked when
  created). Kinds: ``"softmax"`` (causal softmax attention), ``"linear"`` (causal linear
  attention, ``S_t = S_{t-1} + k_t v_t^T``), ``"delta"`` (DeltaNet) and ``"gated_delta"``
  (Gated DeltaNet). A 3:1 hybrid is ``("gated_delta",) * 3 + ("softmax",)``, the layout of
  Qwen3-Next.
* :class:`Mixer`: one head of one kind. Queries, keys and values are ``x W_Q``, ``x W_K``,
  ``x W_V``; for the recurrent kinds ``q`` and ``k`` are L2-normalised and ``q`` scaled by
  ``1/sqrt(D_K)`` (Qwen3-Next's convention), ``beta_t = sigmoid(x_t w_beta + b_beta)`` and the
  log-decay ``g_t = -exp(A_log) softplus(x_t w_a + dt_bias)`` (Qwen3-Next's parametrisation).
  ``forward(X, recurrent=False)``: the chunked form by default (what training uses), the
  token-by-token recurrence with ``recurrent=True``.
* :class:`RecallStack`: pair tokens ``E_key[k] + E_val[v]`` and a query token ``E_query[k]``,
  ``n_layers`` Pre-RMSNorm residual mixers, a final RMSNorm and a read-out of the value at the
  last (query) token: ``forward(keys (B, N), vals (B, N), asked (B,)) -> logits (B, n_vals)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .functional import recurrence as FR

__all__ = ["KINDS", "RecurrenceConfig", "Mixer", "RecallStack"]

KINDS: tuple = ("softmax", "linear", "delta", "gated_delta")


@dataclass(frozen=True)
class RecurrenceConfig:
    n_keys: int = 32
    n_vals: int = 8
    n_pairs: int = 12
    d_model: int = 32
    d_head: int = 16
    layout: tuple = ("delta",) * 4
    chunk_size: int = 64

    def __post_init__(self):
        object.__setattr__(self, "layout", tuple(self.layout))
        for name in ("n_keys", "n_vals", "n_pairs", "d_model", "d_head", "chunk_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.n_pairs > self.n_keys:
            raise ValueError(f"n_pairs must be <= n_keys (keys are drawn without repetition), got "
                             f"n_pairs={self.n_pairs}, n_keys={self.n_keys}")
        if not self.layout or any(k not in KINDS for k in self.layout):
            raise ValueError(f"layout must be a non-empty tuple of kinds from {KINDS}, got {self.layout!r}")


class Mixer(nn.Module):
    """One head of causal token mixing of ``kind`` (see the module docstring)."""

    def __init__(self, kind: str, d_model: int, d_head: int, chunk_size: int = 64):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind, self.d_head, self.chunk_size = kind, d_head, chunk_size
        self.W_Q, self.W_K, self.W_V = (nn.Linear(d_model, d_head, bias=False) for _ in range(3))
        self.W_O = nn.Linear(d_head, d_model, bias=False)
        if kind in ("delta", "gated_delta"):
            self.w_beta = nn.Linear(d_model, 1)
        if kind == "gated_delta":
            self.w_a = nn.Linear(d_model, 1, bias=False)
            self.dt_bias = nn.Parameter(torch.full((1,), -4.0))        # softplus(-4) = 0.018: decay near 1
            self.A_log = nn.Parameter(torch.zeros(1))

    def qkv(self, X):
        """``(Q, K, V, beta, g)`` as the recurrence reads them (``beta``, ``g`` None where unused)."""
        Q, K, V = self.W_Q(X), self.W_K(X), self.W_V(X)
        beta = g = None
        if self.kind != "softmax":
            Q, K = F.normalize(Q, dim=-1, eps=1e-6) / math.sqrt(self.d_head), F.normalize(K, dim=-1, eps=1e-6)
        if self.kind in ("delta", "gated_delta"):
            beta = torch.sigmoid(self.w_beta(X))[..., 0]
        if self.kind == "gated_delta":
            g = -self.A_log.exp() * F.softplus(self.w_a(X)[..., 0] + self.dt_bias)
        return Q, K, V, beta, g

    def forward(self, X, recurrent: bool = False):
        Q, K, V, beta, g = self.qkv(X)
        if self.kind == "softmax":
            T = X.shape[-2]
            S = (Q @ K.transpose(-1, -2)) / math.sqrt(self.d_head)
            S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=X.device).tril(), float("-inf"))
            Z = torch.softmax(S, dim=-1) @ V
        elif self.kind == "linear":
            Z = (FR.linear_attention_recurrent(Q, K, V) if recurrent
                 else FR.linear_attention_chunked(Q, K, V, chunk_size=self.chunk_size))[0]
        else:
            Z = (FR.delta_rule_recurrent(Q, K, V, beta, g) if recurrent
                 else FR.delta_rule_chunked(Q, K, V, beta, g, chunk_size=self.chunk_size))[0]
        return self.W_O(Z)


class RecallStack(nn.Module):
    """Pair tokens and a query token through ``len(layout)`` Pre-RMSNorm residual mixers."""

    def __init__(self, config: RecurrenceConfig):
        super().__init__()
        c = self.config = config
        self.E_key = nn.Embedding(c.n_keys, c.d_model)
        self.E_val = nn.Embedding(c.n_vals, c.d_model)
        self.E_query = nn.Embedding(c.n_keys, c.d_model)
        self.norms = nn.ModuleList(nn.RMSNorm(c.d_model, eps=1e-6) for _ in c.layout)
        self.mixers = nn.ModuleList(Mixer(k, c.d_model, c.d_head, c.chunk_size) for k in c.layout)
        self.norm_f = nn.RMSNorm(c.d_model, eps=1e-6)
        self.readout = nn.Linear(c.d_model, c.n_vals)

    def tokens(self, keys, vals, asked):
        """``X (B, N + 1, d_model)``: one token per pair, then the query."""
        B, N = keys.shape
        if vals.shape != keys.shape or asked.shape != (B,):
            raise ValueError(f"keys and vals must be (B, N) and asked (B,), got keys {tuple(keys.shape)}, "
                             f"vals {tuple(vals.shape)}, asked {tuple(asked.shape)}")
        pairs = self.E_key(keys) + self.E_val(vals)
        query = self.E_query(keys.gather(1, asked[:, None]))
        return torch.cat([pairs, query], dim=1)

    def forward(self, keys, vals, asked, recurrent: bool = False):
        X = self.tokens(keys, vals, asked)
        for norm, mixer in zip(self.norms, self.mixers):
            X = X + mixer(norm(X), recurrent=recurrent)
        return self.readout(self.norm_f(X[:, -1]))
