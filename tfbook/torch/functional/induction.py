"""PyTorch twins of :mod:`tfbook.numpy.induction`, re-exported by :mod:`tfbook.torch.functional`.

Same names, arguments and semantics: the attention-only transformer's forward pass (with head
ablations), the previous-token and prefix-matching scores of attention patterns, the OV
copying score and the composition score. The forward pass supports autograd (the model of
:mod:`tfbook.torch.induction` trains through it).
"""

from __future__ import annotations

import math

import torch

from ...numpy.induction import _check_ablate, _check_composition, _check_ids_for, _check_model, _check_ov, _check_pattern
from ._common import _tensor

__all__ = ["attn_only_forward", "previous_token_score", "prefix_matching_score", "copying_score",
           "composition_score"]


def attn_only_forward(params, ids, ablate=None, return_attention=False, return_outputs=False):
    """Logits ``(..., T, V)`` of the attention-only transformer; see the NumPy twin."""
    _tensor(ids, "ids")
    _, D = _check_model(params, ids)
    ablate = _check_ablate(ablate, params, D)
    T = ids.shape[-1]
    X = params["W_E"][ids]
    pos = params["W_pos"][:T]
    causal = torch.ones(T, T, dtype=torch.bool, device=X.device).tril()
    patterns, outputs = [], []
    for i, layer in enumerate(params["layers"]):
        Xh, Xp = X.unsqueeze(-3), (X + pos).unsqueeze(-3)  # (..., 1, T, D)
        Q, K, Vv = Xp @ layer["W_Q"], Xp @ layer["W_K"], Xh @ layer["W_V"]  # (..., H, T, D_K)
        S = Q @ K.transpose(-1, -2) / math.sqrt(Q.shape[-1])
        P = torch.softmax(S.masked_fill(~causal, float("-inf")), dim=-1)
        out = (P @ Vv) @ layer["W_O"]  # (..., H, T, D)
        mine = {h: v for (li, h), v in ablate.items() if li == i}
        if mine:
            heads = []
            for h in range(out.shape[-3]):
                o = out[..., h, :, :]
                if h in mine:
                    o = torch.zeros_like(o) if mine[h] is None else mine[h].to(o.dtype).expand_as(o)
                heads.append(o)
            out = torch.stack(heads, dim=-3)
        X = X + out.sum(dim=-3)
        patterns.append(P)
        outputs.append(out)
    logits = X @ params["W_U"]
    extra = ([patterns] if return_attention else []) + ([outputs] if return_outputs else [])
    return (logits, *extra) if extra else logits


def previous_token_score(P):
    """Mean weight on the previous position, shape ``P.shape[:-2]``; see the NumPy twin."""
    _tensor(P, "P")
    _check_pattern(P)
    T = P.shape[-1]
    return torch.diagonal(P, offset=-1, dim1=-2, dim2=-1).mean(dim=-1)


def prefix_matching_score(P, ids):
    """Mean weight on the positions after earlier occurrences of the query's token; see the NumPy twin."""
    _tensor(P, "P")
    _tensor(ids, "ids")
    _check_pattern(P)
    extra = _check_ids_for(ids, P)
    T = P.shape[-1]
    j = torch.arange(T, device=P.device)
    prev = torch.cat([torch.full(ids.shape[:-1] + (1,), -1, dtype=ids.dtype, device=ids.device), ids[..., :-1]], -1)
    match = (prev.unsqueeze(-2) == ids.unsqueeze(-1)) & (j[None, :] >= 1) & (j[None, :] < j[:, None])
    match = match.reshape(match.shape[:-2] + (1,) * extra + (T, T))
    rows = match.any(dim=-1)
    per_row = torch.where(match, P, torch.zeros((), dtype=P.dtype, device=P.device)).sum(dim=-1)
    n = rows.expand_as(per_row).sum(dim=-1)
    total = torch.where(rows, per_row, torch.zeros((), dtype=P.dtype, device=P.device)).sum(dim=-1)
    return torch.where(n > 0, total / n.clamp(min=1), torch.full_like(total, float("nan")))


def copying_score(W_E, W_V, W_O, W_U):
    """``trace(M) / sum |lambda_i(M)|`` of the OV circuit ``M = W_E W_V W_O W_U``; see the NumPy twin."""
    for n, w in (("W_E", W_E), ("W_V", W_V), ("W_O", W_O), ("W_U", W_U)):
        _tensor(w, n)
    _check_ov(W_E, W_V, W_O, W_U)
    small = W_O @ W_U @ W_E @ W_V
    lam = torch.linalg.eigvals(small)
    return torch.diagonal(small, dim1=-2, dim2=-1).sum(-1) / lam.abs().sum(-1).to(small.dtype)


def composition_score(A, B):
    """``||A @ B||_F / (||A||_F ||B||_F)``; see the NumPy twin."""
    _tensor(A, "A")
    _tensor(B, "B")
    _check_composition(A, B)
    fro = lambda M: torch.linalg.matrix_norm(M)  # noqa: E731  (Frobenius)
    return fro(A @ B) / (fro(A) * fro(B))
