"""Induction heads (chapter 21): the attention-only transformer and the scores that find its heads.

* :func:`attn_only_forward`: a transformer with no MLPs and no LayerNorm: token embeddings in
  the residual stream, learned position embeddings added to the input of every query and key
  (position-infused attention, Press et al. 2021's Shortformer: positions decide *where* a head
  looks, never *what* it moves), ``L`` layers of causal multi-head attention added to the
  residual stream, an unembedding. Any head's output can be replaced (``ablate``): by zeros, or by a given
  vector (its mean, for a mean ablation).
* :func:`previous_token_score`: the mean attention a query at ``t`` pays to ``t - 1``.
* :func:`prefix_matching_score`: the mean attention a query holding token ``A`` pays to the
  positions just after earlier occurrences of ``A``.
* :func:`copying_score`: ``trace(M) / sum |lambda_i(M)|`` for a head's OV circuit
  ``M = W_E W_V W_O W_U`` (Elhage et al. 2021's positive-eigenvalue measure).
* :func:`composition_score`: ``||A B||_F / (||A||_F ||B||_F)``, with ``A = W_QK`` of a later
  head and ``B = W_OV^T`` of an earlier one, the K-composition of Elhage et al. 2021.

Row vectors throughout: a head reads ``X W_Q``, ``X W_K``, ``X W_V`` with ``W_Q (D, D_K)`` and
writes ``Z W_O`` with ``W_O (D_K, D)``; a model's layer holds ``W_Q, W_K, W_V (H, D, D_K)`` and
``W_O (H, D_K, D)``. :mod:`tfbook.torch.functional.induction` holds the twins.
"""

from __future__ import annotations

import numpy as np

from .. import _validate as _v

__all__ = ["attn_only_forward", "previous_token_score", "prefix_matching_score", "copying_score",
           "composition_score"]


def _arr(x, name):
    if not hasattr(x, "shape") or not hasattr(x, "ndim"):
        raise ValueError(f"{name} must be an array, got {type(x).__name__}")
    return x


def _check_pattern(P, name="P"):
    _arr(P, name)
    _v.check_ndim(name, P, 2, what="(..., T, T)")
    if P.shape[-1] != P.shape[-2]:
        raise ValueError(f"{name} must be square in its last two axes (..., T, T), got shape {_v.shape_of(P)}")
    if P.shape[-1] < 2:
        raise ValueError(f"{name} needs T >= 2 positions, got shape {_v.shape_of(P)}")


def _check_ids_for(ids, P):
    _arr(ids, "ids")
    _v.check_ndim("ids", ids, 1, what="(..., T)")
    T = P.shape[-1]
    lead, plead = _v.shape_of(ids)[:-1], _v.shape_of(P)[:-2]
    if ids.shape[-1] != T or lead != plead[:len(lead)]:
        raise ValueError(f"ids must have shape (..., T) with T = {T} and leading axes a prefix of P's "
                         f"(ids: {_v.shape_of(ids)}, P: {_v.shape_of(P)})")
    return len(plead) - len(lead)


def _check_model(params, ids):
    if not isinstance(params, dict) or not {"W_E", "W_pos", "W_U", "layers"} <= set(params):
        raise ValueError("params must be a dict with W_E (V, D), W_pos (T_max, D), W_U (D, V) and layers")
    W_E, W_pos, W_U = params["W_E"], params["W_pos"], params["W_U"]
    for n, w in (("W_E", W_E), ("W_pos", W_pos), ("W_U", W_U)):
        _v.check_ndim(n, _arr(w, n), 2, 2)
    V, D = W_E.shape
    if W_pos.shape[1] != D or tuple(W_U.shape) != (D, V):
        raise ValueError(f"W_pos must be (T_max, D) and W_U (D, V) with W_E (V, D) "
                         f"(W_E: {_v.shape_of(W_E)}, W_pos: {_v.shape_of(W_pos)}, W_U: {_v.shape_of(W_U)})")
    _v.check_ndim("ids", _arr(ids, "ids"), 1, what="(..., T)")
    if ids.shape[-1] > W_pos.shape[0] or ids.shape[-1] < 1:
        raise ValueError(f"ids has T = {ids.shape[-1]} positions, the model has 1 to {W_pos.shape[0]} "
                         f"(ids: {_v.shape_of(ids)}, W_pos: {_v.shape_of(W_pos)})")
    for i, layer in enumerate(params["layers"]):
        shapes = {k: _v.shape_of(_arr(layer[k], f"layers[{i}][{k!r}]")) for k in ("W_Q", "W_K", "W_V", "W_O")}
        H, _, dk = shapes["W_Q"] if len(shapes["W_Q"]) == 3 else (0, 0, 0)
        if (len(shapes["W_Q"]) != 3 or shapes["W_Q"][1] != D or shapes["W_K"] != shapes["W_Q"]
                or shapes["W_V"] != shapes["W_Q"] or shapes["W_O"] != (H, dk, D)):
            raise ValueError(f"layers[{i}] must hold W_Q, W_K, W_V (H, D, D_K) and W_O (H, D_K, D) with D = {D}, "
                             f"got {shapes}")
    return V, D


def _check_ablate(ablate, params, D):
    out = {}
    for key, value in (ablate or {}).items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise ValueError(f"ablate keys must be (layer, head) pairs, got {key!r}")
        layer, head = int(key[0]), int(key[1])
        if not (0 <= layer < len(params["layers"]) and 0 <= head < params["layers"][layer]["W_Q"].shape[0]):
            raise ValueError(f"ablate names head {key!r}, the model has {len(params['layers'])} layers of "
                             f"{params['layers'][0]['W_Q'].shape[0] if params['layers'] else 0} heads")
        if value is not None and (value.ndim < 1 or value.shape[-1] != D):
            raise ValueError(f"ablate[{key!r}] must be None (zero) or a replacement output (..., D) with D = {D}, "
                             f"got shape {_v.shape_of(value)}")
        out[(layer, head)] = value
    return out


def attn_only_forward(params, ids, ablate=None, return_attention=False, return_outputs=False):
    """Logits ``(..., T, V)`` of the attention-only transformer on token ids ``(..., T)``.

    ``params``: ``W_E (V, D)``, ``W_pos (T_max, D)``, ``W_U (D, V)`` and ``layers``, a list of
    dicts ``W_Q, W_K, W_V (H, D, D_K)``, ``W_O (H, D_K, D)``. The residual stream starts as
    ``X = W_E[ids]``: positions never enter it. With ``X_p = X + W_pos[:T]``, each layer adds
    ``sum_h softmax(mask(X_p W_Q^h (X_p W_K^h)^T / sqrt(D_K))) X W_V^h W_O^h``: positions in the
    queries and keys only, the values read ``X``. The logits are ``X W_U``.
    ``ablate`` maps ``(layer, head)`` to ``None`` (the head writes
    zeros) or an array broadcasting to ``(..., T, D)`` (the head writes that instead: its mean
    output for a mean ablation). With ``return_attention`` also returns ``[P per layer]``, each
    ``P (..., H, T, T)``; with ``return_outputs`` also ``[what each head writes, per layer]``,
    each ``(..., H, T, D)`` (after any ablation).
    """
    _, D = _check_model(params, ids)
    ablate = _check_ablate(ablate, params, D)
    T = ids.shape[-1]
    X = params["W_E"][ids]
    pos = params["W_pos"][:T]
    causal = np.tril(np.ones((T, T), dtype=bool))
    patterns, outputs = [], []
    for i, layer in enumerate(params["layers"]):
        Xh, Xp = X[..., None, :, :], (X + pos)[..., None, :, :]  # (..., 1, T, D)
        Q, K, Vv = Xp @ layer["W_Q"], Xp @ layer["W_K"], Xh @ layer["W_V"]  # (..., H, T, D_K)
        S = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
        S = np.where(causal, S, -np.inf)
        S = S - S.max(axis=-1, keepdims=True)
        P = np.exp(S)
        P = P / P.sum(axis=-1, keepdims=True)
        out = (P @ Vv) @ layer["W_O"]  # (..., H, T, D): what each head writes
        for (li, h), value in ablate.items():
            if li == i:
                out[..., h, :, :] = 0.0 if value is None else value
        X = X + out.sum(axis=-3)
        patterns.append(P)
        outputs.append(out)
    logits = X @ params["W_U"]
    extra = ([patterns] if return_attention else []) + ([outputs] if return_outputs else [])
    return (logits, *extra) if extra else logits


def previous_token_score(P):
    """``(1 / (T - 1)) sum_{t=1}^{T-1} P[..., t, t-1]``: the mean weight a query pays to the
    position just before it, shape ``P.shape[:-2]``. A pure previous-token pattern scores 1;
    the uniform causal pattern scores the mean of ``1 / (t + 1)``."""
    _check_pattern(P)
    T = P.shape[-1]
    return P[..., np.arange(1, T), np.arange(T - 1)].mean(axis=-1)


def prefix_matching_score(P, ids):
    """The mean, over queries ``t`` whose token occurred before, of the weight ``t`` pays to the
    positions ``j`` (``1 <= j < t``) right after an earlier occurrence (``ids[j-1] == ids[t]``).

    ``P (..., T, T)``; ``ids (..., T)`` with leading axes a prefix of ``P``'s (``P (B, H, T, T)``
    and ``ids (B, T)``); returns ``P.shape[:-2]``. A query with no earlier occurrence does not
    count; NaN where no query counts.
    """
    _check_pattern(P)
    extra = _check_ids_for(ids, P)
    T = P.shape[-1]
    j = np.arange(T)
    prev = np.concatenate([np.full(ids.shape[:-1] + (1,), -1), ids[..., :-1]], axis=-1)  # ids[j-1]
    match = (prev[..., None, :] == ids[..., :, None]) & (j[None, :] >= 1) & (j[None, :] < j[:, None])
    match = match.reshape(match.shape[:-2] + (1,) * extra + (T, T))  # (..., T_q, T_k) against P
    rows = match.any(axis=-1)  # queries that count
    per_row = np.where(match, P, 0.0).sum(axis=-1)
    n = np.broadcast_to(rows, per_row.shape).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, np.where(rows, per_row, 0.0).sum(axis=-1) / np.maximum(n, 1), np.nan)


def _check_ov(W_E, W_V, W_O, W_U):
    for n, w in (("W_E", W_E), ("W_V", W_V), ("W_O", W_O), ("W_U", W_U)):
        _arr(w, n)
    _v.check_ndim("W_E", W_E, 2, 2, what="(V, D)")
    _v.check_ndim("W_U", W_U, 2, 2, what="(D, V)")
    _v.check_ndim("W_V", W_V, 2, what="(..., D, D_K)")
    V, D = W_E.shape
    if (tuple(W_U.shape) != (D, V) or W_V.shape[-2] != D or W_O.ndim != W_V.ndim
            or tuple(W_O.shape[-2:]) != (W_V.shape[-1], D) or W_O.shape[:-2] != W_V.shape[:-2]):
        raise ValueError(f"need W_E (V, D), W_V (..., D, D_K), W_O (..., D_K, D), W_U (D, V) "
                         f"(W_E: {_v.shape_of(W_E)}, W_V: {_v.shape_of(W_V)}, W_O: {_v.shape_of(W_O)}, "
                         f"W_U: {_v.shape_of(W_U)})")


def copying_score(W_E, W_V, W_O, W_U):
    """``trace(M) / sum_i |lambda_i(M)|`` for the OV circuit ``M = W_E W_V W_O W_U (V, V)``.

    Row ``a`` of ``M`` is what attending to a token ``a`` does to every logit. The score is the
    sum of the eigenvalues over the sum of their moduli (Elhage et al. 2021): 1 when every
    eigenvalue is positive (the head raises the logit of what it attends to: ``M = I`` scores
    1), -1 when every eigenvalue is negative, near 0 for a random map. The nonzero eigenvalues
    of ``M`` are those of ``W_O W_U W_E W_V (D_K, D_K)``, which is what is decomposed. Batched
    over the leading (head) axes of ``W_V`` and ``W_O``."""
    _check_ov(W_E, W_V, W_O, W_U)
    small = W_O @ W_U @ W_E @ W_V  # (..., D_K, D_K)
    lam = np.linalg.eigvals(small)
    return np.trace(small, axis1=-2, axis2=-1) / np.abs(lam).sum(axis=-1)


def _check_composition(A, B):
    _arr(A, "A")
    _arr(B, "B")
    _v.check_ndim("A", A, 2, what="(..., n, k)")
    _v.check_ndim("B", B, 2, what="(..., k, m)")
    if A.shape[-1] != B.shape[-2]:
        raise ValueError(f"A's last axis must equal B's second-to-last (A: {_v.shape_of(A)}, B: {_v.shape_of(B)})")


def composition_score(A, B):
    """``||A @ B||_F / (||A||_F ||B||_F)``, in ``[0, 1]`` (Cauchy-Schwarz), batched.

    K-composition of an earlier head's ``W_OV = W_V W_O`` into a later head's
    ``W_QK = W_Q W_K^T`` (row vectors: a key that reads the earlier head's output scores
    ``x_q W_QK (x_k W_OV)^T``): ``composition_score(W_QK, W_OV.T)``."""
    _check_composition(A, B)
    fro = lambda M: np.sqrt((M * M).sum(axis=(-2, -1)))  # noqa: E731
    return fro(A @ B) / (fro(A) * fro(B))
