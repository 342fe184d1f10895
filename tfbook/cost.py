"""FLOPs and bytes of each transformer component, for one sequence of length ``T``.

Backend-free arithmetic used by the cost chapter. Conventions:

* A multiply-add counts as **2 FLOPs**, so ``A (m, k) @ B (k, n)`` costs ``2 m k n``
  (the convention of ``torch.utils.flop_counter`` and of most papers).
* Bias additions, residual additions, LayerNorm and activations are ignored: they
  are ``O(T D)`` or ``O(T D_ff)``, small next to the matrix products.
* Softmax is counted as **one FLOP per score** (``H T_q T_k``): it stands for the
  exponential, which dominates. A literal count of max, subtract, exp, sum and
  divide would be about 5 per score; pass ``ops_per_score=5`` for that.
* Multi-head attention uses ``H`` heads of width ``D_K = D_V = D / H`` unless given.
"""

from __future__ import annotations

__all__ = [
    "matmul_flops",
    "projection_flops",
    "score_flops",
    "softmax_flops",
    "pv_flops",
    "attention_flops",
    "mlp_flops",
    "layer_flops",
    "attention_mlp_crossover_T",
    "dtype_bytes",
    "score_matrix_bytes",
    "layer_activation_bytes",
    "decoder_lm_flops",
    "non_embedding_params",
    "kaplan_forward_flops_per_token",
    "step_traffic",
]


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of ``(m, k) @ (k, n)``: ``2 m k n`` (one multiply and one add per term)."""
    return 2 * m * k * n


def _head_dims(D, H, D_K, D_V):
    if D_K is None or D_V is None:
        if D % H:
            raise ValueError(f"H={H} does not divide D={D}; give D_K and D_V explicitly")
    return (D // H if D_K is None else D_K), (D // H if D_V is None else D_V)


def projection_flops(T: int, D: int, H: int = 1, D_K: int | None = None, D_V: int | None = None) -> dict:
    """FLOPs of the four projections of multi-head attention.

    ``Q = X W_Q`` with ``W_Q (D, H D_K)``: ``2 T D (H D_K)``; the same for ``K``;
    ``V``: ``2 T D (H D_V)``; output ``Z W_O`` with ``W_O (H D_V, D)``: ``2 T (H D_V) D``.
    With ``H D_K = H D_V = D`` each is ``2 T D^2`` and the four together ``8 T D^2``.

    Returns
    -------
    dict
        ``{"Q", "K", "V", "O"}``.
    """
    D_K, D_V = _head_dims(D, H, D_K, D_V)
    return {
        "Q": matmul_flops(T, D, H * D_K),
        "K": matmul_flops(T, D, H * D_K),
        "V": matmul_flops(T, D, H * D_V),
        "O": matmul_flops(T, H * D_V, D),
    }


def score_flops(T: int, D_K: int, H: int = 1, T_k: int | None = None) -> int:
    """FLOPs of ``S = Q K^T`` over ``H`` heads: ``2 H T_q T_k D_K`` (``2 H T^2 D_K`` for self-attention)."""
    T_k = T if T_k is None else T_k
    return H * matmul_flops(T, D_K, T_k)


def softmax_flops(T: int, H: int = 1, T_k: int | None = None, ops_per_score: int = 1) -> int:
    """FLOPs charged to the softmax: ``ops_per_score * H T_q T_k`` (default one exp per score)."""
    T_k = T if T_k is None else T_k
    return ops_per_score * H * T * T_k


def pv_flops(T: int, D_V: int, H: int = 1, T_k: int | None = None) -> int:
    """FLOPs of ``Z = P V`` over ``H`` heads: ``2 H T_q T_k D_V``."""
    T_k = T if T_k is None else T_k
    return H * matmul_flops(T, T_k, D_V)


def attention_flops(T: int, D: int, H: int = 1, include_projections: bool = True) -> int:
    """Total FLOPs of one self-attention sublayer (heads of width ``D / H``)."""
    D_K, D_V = _head_dims(D, H, None, None)
    core = score_flops(T, D_K, H) + softmax_flops(T, H) + pv_flops(T, D_V, H)
    return core + (sum(projection_flops(T, D, H).values()) if include_projections else 0)


def mlp_flops(T: int, D: int, D_ff: int) -> int:
    """FLOPs of the position-wise MLP: two products, ``2 * 2 T D D_ff``."""
    return matmul_flops(T, D, D_ff) + matmul_flops(T, D_ff, D)


def layer_flops(T: int, D: int, H: int, D_ff: int) -> dict:
    """Per-component FLOPs of one encoder layer (self-attention + MLP) on one sequence.

    Returns
    -------
    dict
        ``q_proj, k_proj, v_proj, scores, softmax, pv, o_proj, mlp`` and ``total``.
    """
    D_K, D_V = _head_dims(D, H, None, None)
    proj = projection_flops(T, D, H)
    out = {
        "q_proj": proj["Q"],
        "k_proj": proj["K"],
        "v_proj": proj["V"],
        "scores": score_flops(T, D_K, H),
        "softmax": softmax_flops(T, H),
        "pv": pv_flops(T, D_V, H),
        "o_proj": proj["O"],
        "mlp": mlp_flops(T, D, D_ff),
    }
    out["total"] = sum(out.values())
    return out


def attention_mlp_crossover_T(D: int, D_ff: int, include_projections: bool = False) -> float:
    """Length ``T`` at which attention's FLOPs equal the MLP's.

    Scores plus ``P V`` cost ``2 T^2 (H D_K) + 2 T^2 (H D_V) = 4 T^2 D``; the MLP
    costs ``4 T D D_ff``. They are equal at ``T = D_ff`` (e.g. 2048 for ``D = 512``,
    ``D_ff = 2048``). With the projections (``8 T D^2``) on attention's side,
    ``4 T^2 D + 8 T D^2 = 4 T D D_ff`` gives ``T = D_ff - 2 D``. The softmax term
    (``H T^2``) is left out of this comparison.
    """
    if D <= 0 or D_ff <= 0:
        raise ValueError(f"D and D_ff must be positive, got D={D}, D_ff={D_ff}")
    return float(D_ff - 2 * D) if include_projections else float(D_ff)


_ITEMSIZE = {"float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4, "float64": 8, "double": 8}


def dtype_bytes(dtype) -> int:
    """Bytes per element of a NumPy or torch dtype, a name like ``"float32"``, or an int itemsize."""
    if isinstance(dtype, int):
        return dtype
    size = getattr(dtype, "itemsize", None)
    if isinstance(size, int):
        return size
    name = str(dtype).replace("torch.", "").replace("<class 'numpy.", "").rstrip("'>")
    if name in _ITEMSIZE:
        return _ITEMSIZE[name]
    raise ValueError(f"unknown dtype {dtype!r}")


def score_matrix_bytes(T: int, H: int = 1, dtype="float32", T_k: int | None = None) -> int:
    """Bytes of the score (or weight) matrix of one sequence: ``H T_q T_k`` elements."""
    T_k = T if T_k is None else T_k
    return H * T * T_k * dtype_bytes(dtype)


def layer_activation_bytes(T: int, D: int, H: int, D_ff: int, dtype="float32") -> dict:
    """Bytes of the activations one encoder layer creates for one sequence (what training keeps).

    ``X``-sized tensors (``Q, K, V, Z``, attention output, MLP output) take ``T D``
    elements each; ``S`` and ``P`` take ``H T^2`` each; the MLP hidden layer ``T D_ff``.
    """
    b = dtype_bytes(dtype)
    out = {
        "qkv": 3 * T * D * b,
        "scores": score_matrix_bytes(T, H, dtype),
        "weights": score_matrix_bytes(T, H, dtype),
        "attn_out": 2 * T * D * b,  # Z and Z W_O
        "mlp_hidden": T * D_ff * b,
        "mlp_out": T * D * b,
    }
    out["total"] = sum(out.values())
    return out


# --------------------------------------------------------------------------------------
# A whole decoder-only language model, under the book's and other papers' conventions
# --------------------------------------------------------------------------------------

_CONVENTIONS = ("book", "causal", "kaplan", "chinchilla")


def decoder_lm_flops(T: int, D: int, L: int, H: int, D_ff: int, V: int, convention: str = "book") -> dict:
    """Forward FLOPs of a decoder-only LM (``L`` blocks, vocabulary ``V``) on one sequence of ``T`` tokens.

    Entries ``embed, qkv_proj, scores, softmax, pv, o_proj, mlp, head`` and ``total``
    (summed over the ``L`` blocks where they occur). ``convention``:

    * ``"book"``: this module's per-layer counts (:func:`layer_flops`) times ``L``; the
      embedding is a row lookup (0 FLOPs); the output head ``(T, D) @ (D, V)`` costs
      ``2 T D V``. Scores and ``P V`` over the full ``T x T`` square, as a kernel that
      computes the masked entries and discards them does.
    * ``"causal"``: the same, but query ``t`` (1-based) meets only ``t`` keys, so scores,
      ``P V`` and softmax cover ``T (T + 1) / 2`` pairs: ``2 D T (T + 1) / 2`` each per layer.
    * ``"kaplan"``: Kaplan et al. (2020), Table 1, times ``T``: embedding ``4 D`` per token,
      ``2 n_ctx d_attn`` per layer and token for the attention core with ``n_ctx = T``
      (split evenly here between scores and ``P V``; it is the causal half of the book's
      ``4 T D``), no softmax, de-embedding ``2 D V``.
    * ``"chinchilla"``: Hoffmann et al. (2022), Appendix F: embeddings ``2 T V D`` (a
      one-hot product), softmax ``3 H T^2`` per layer, full square, output head ``2 T D V``.
    """
    if convention not in _CONVENTIONS:
        raise ValueError(f"convention must be one of {_CONVENTIONS}, got {convention!r}")
    for name, val in (("T", T), ("D", D), ("L", L), ("H", H), ("D_ff", D_ff), ("V", V)):
        if int(val) != val or val <= 0:
            raise ValueError(f"{name} must be a positive integer, got {val!r}")
    layer = layer_flops(T, D, H, D_ff)
    out = {
        "embed": 0,
        "qkv_proj": L * (layer["q_proj"] + layer["k_proj"] + layer["v_proj"]),
        "scores": L * layer["scores"],
        "softmax": L * layer["softmax"],
        "pv": L * layer["pv"],
        "o_proj": L * layer["o_proj"],
        "mlp": L * layer["mlp"],
        "head": matmul_flops(T, D, V),
    }
    if convention == "causal":
        pairs = T * (T + 1) // 2
        out["scores"] = out["pv"] = L * 2 * D * pairs
        out["softmax"] = L * H * pairs
    elif convention == "kaplan":
        out["embed"] = 4 * D * T
        out["scores"] = out["pv"] = L * T * T * D          # 2 n_ctx d_attn per token, in two halves
        out["softmax"] = 0
    elif convention == "chinchilla":
        out["embed"] = matmul_flops(T, V, D)
        out["softmax"] = L * 3 * H * T * T
    out["total"] = sum(out.values())
    return out


def non_embedding_params(D: int, L: int, D_ff: int) -> int:
    """Weights in the blocks' matrices, ``L (4 D^2 + 2 D D_ff)``: Kaplan et al.'s ``N``
    (``12 L D^2`` with ``D_ff = 4 D``), without biases, LayerNorms, embeddings or head."""
    return L * (4 * D * D + 2 * D * D_ff)


def kaplan_forward_flops_per_token(N: int, L: int, n_ctx: int, d_attn: int) -> int:
    """Kaplan et al. (2020), eq. 2.2: ``C_forward = 2 N + 2 n_layer n_ctx d_attn`` per token
    (training, forward plus backward, is three times that: ``6 N`` and more)."""
    return 2 * N + 2 * L * n_ctx * d_attn


def step_traffic(T_new: int, t: int, D: int, L: int, D_ff: int, b: int = 2, V: int = 0) -> dict:
    """FLOPs and the least bytes moved by one forward step of a decoder with a KV cache.

    ``T_new`` tokens enter (``T_new = t``: prefill of a prompt of ``t`` tokens; ``T_new = 1``:
    one decoding step) and the context holds ``t`` tokens afterwards (``T_new <= t``). FLOPs:
    ``L (T_new (8 D^2 + 4 D D_ff) + 4 T_new t D)`` (every new query meets all ``t`` keys, the
    full square for prefill) plus ``2 T_new D V`` for an output head of width ``V``. Bytes:
    every weight matrix read once, ``L (4 D^2 + 2 D D_ff)`` numbers (``+ D V`` for the head),
    and the cache, ``2 L t D`` numbers (read by a decoding step, written by a prefill), at
    ``b`` bytes each. Activations are left out, so the bytes are a lower bound and the
    intensity an upper bound. Returns ``flops``, ``bytes`` and ``intensity`` (FLOPs per byte).
    """
    if not 1 <= T_new <= t:
        raise ValueError(f"need 1 <= T_new <= t, got T_new={T_new}, t={t}")
    flops = L * (T_new * (8 * D * D + 4 * D * D_ff) + 4 * T_new * t * D) + 2 * T_new * D * V
    numbers = L * (4 * D * D + 2 * D * D_ff) + D * V + 2 * L * t * D
    nbytes = numbers * dtype_bytes(b)
    return {"flops": flops, "bytes": nbytes, "intensity": flops / nbytes}
