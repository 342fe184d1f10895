"""From a language model to an assistant (chapters 24 and 25), in NumPy.

Chapter 24, instruction tuning:

* :func:`answer_targets`: the next-token targets of chat-formatted rows with every target
  outside an assistant turn set to ``ignore_index`` (the loss on answers only; the
  "completion-only" masking of TRL and of every chat fine-tuning recipe);
* :func:`document_mask` and :func:`document_positions`: several conversations packed into one
  row, each seeing only itself (chapter 4's block-diagonal causal mask) and each counting its
  positions from zero;
* :func:`masked_mean_nll`: the mean negative log-likelihood of the scored targets.

Chapter 25, evaluation:

* :func:`pass_at_k`: the unbiased estimator of Chen et al. (2021), ``1 - C(n - c, k) / C(n, k)``;
* :func:`wilson_interval`, :func:`clopper_pearson_interval`: binomial confidence intervals;
* :func:`bootstrap_interval`: the percentile bootstrap of a mean, from given resampling indices;
* :func:`ngram_overlap`: the share of each test item's n-grams that occur in a training text.

Every function has its twin of the same name in :mod:`tfbook.torch.functional.assistant`.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _validate as V

__all__ = ["answer_targets", "document_mask", "document_positions", "masked_mean_nll", "pass_at_k",
           "wilson_interval", "clopper_pearson_interval", "bootstrap_interval", "ngram_overlap"]


# ----------------------------------------------------------------------------- chapter 24
def _check_ids_2d(name: str, ids) -> tuple:
    shape = V.shape_of(ids)
    if len(shape) != 2:
        raise ValueError(f"{name} must be (B, T) integer ids, got shape {shape}")
    if not np.issubdtype(np.asarray(ids).dtype, np.integer):
        raise ValueError(f"{name} must hold integer ids, got dtype {np.asarray(ids).dtype} ({name}: {shape})")
    return shape


def answer_targets(ids, doc, assistant_id, end_id, ignore_index=-100):
    """Next-token targets scored only inside assistant turns.

    ``ids (B, T)`` are chat-formatted token rows, ``doc (B, T)`` the conversation each token
    belongs to (``-1`` for padding). The target at position ``t`` is ``ids[t + 1]`` when that
    token is part of an answer (after an ``assistant_id`` token, up to and including the
    ``end_id`` that closes the turn) and belongs to the same conversation as ``ids[t]``;
    every other target, and the last position, is ``ignore_index``. Returns ``(B, T)`` int64.
    """
    shape = _check_ids_2d("ids", ids)
    if V.shape_of(doc) != shape:
        raise ValueError(f"doc must have the shape of ids, got doc: {V.shape_of(doc)}, ids: {shape}")
    ids, doc = np.asarray(ids, dtype=np.int64), np.asarray(doc, dtype=np.int64)
    B, T = shape
    in_answer = np.zeros(shape, dtype=bool)  # token t is inside an answer (ASSISTANT excluded, END included)
    state = np.zeros(B, dtype=bool)
    for t in range(T):
        if t > 0:
            state &= doc[:, t] == doc[:, t - 1]  # a new conversation starts outside any answer
        in_answer[:, t] = state
        state = np.where(ids[:, t] == assistant_id, True, np.where(ids[:, t] == end_id, False, state))
    y = np.full(shape, ignore_index, dtype=np.int64)
    same = (doc[:, 1:] == doc[:, :-1]) & (doc[:, 1:] >= 0)
    keep = in_answer[:, 1:] & same
    y[:, :-1] = np.where(keep, ids[:, 1:], ignore_index)
    return y


def _check_doc(doc) -> tuple:
    shape = V.shape_of(doc)
    if len(shape) < 1 or not np.issubdtype(np.asarray(doc).dtype, np.integer):
        raise ValueError(f"doc must be (..., T) integer document ids, got shape {shape}, "
                         f"dtype {np.asarray(doc).dtype}")
    return shape


def document_mask(doc):
    """``(..., T, T)`` boolean, True = may attend: query ``t`` sees key ``s`` when ``s <= t``
    and both belong to the same document (``doc[t] == doc[s] >= 0``). Padding (``-1``)
    attends to nothing and nothing attends to it."""
    _check_doc(doc)
    doc = np.asarray(doc)
    T = doc.shape[-1]
    causal = np.tril(np.ones((T, T), dtype=bool))
    same = (doc[..., :, None] == doc[..., None, :]) & (doc[..., :, None] >= 0)
    return same & causal


def document_positions(doc):
    """``(..., T)`` int64: each token's position inside its document (0 at its first token)."""
    _check_doc(doc)
    doc = np.asarray(doc)
    T = doc.shape[-1]
    t = np.broadcast_to(np.arange(T), doc.shape)
    new = np.ones(doc.shape, dtype=bool)
    new[..., 1:] = doc[..., 1:] != doc[..., :-1]
    start = np.maximum.accumulate(np.where(new, t, 0), axis=-1)  # index of the document's first token
    return (t - start).astype(np.int64)


def masked_mean_nll(logits, targets, ignore_index=-100):
    """Mean of ``-log softmax(logits)[target]`` over targets not equal to ``ignore_index``
    (nats). ``logits (..., V)``, ``targets (...)``. No scored target: ValueError."""
    ls, ts = V.shape_of(logits), V.shape_of(targets)
    if len(ls) < 1 or ls[:-1] != ts:
        raise ValueError(f"targets must have the shape of logits without its last axis, got "
                         f"logits: {ls}, targets: {ts}")
    logits = np.asarray(logits, dtype=np.float64).reshape(-1, ls[-1])
    targets = np.asarray(targets).reshape(-1)
    keep = targets != ignore_index
    if not keep.any():
        raise ValueError(f"targets has no scored entry (all equal ignore_index={ignore_index}; targets: {ts})")
    rows, tgt = logits[keep], targets[keep]
    if tgt.min() < 0 or tgt.max() >= ls[-1]:
        raise ValueError(f"targets must be in [0, {ls[-1]}) or ignore_index, got {tgt.min()}..{tgt.max()} "
                         f"(logits: {ls})")
    m = rows.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(rows - m).sum(axis=1))
    return float(np.mean(lse - rows[np.arange(tgt.size), tgt]))


# ----------------------------------------------------------------------------- chapter 25
def _check_counts(n, c, k=None):
    n_arr, c_arr = np.asarray(n), np.asarray(c)
    if not (np.issubdtype(n_arr.dtype, np.integer) and np.issubdtype(c_arr.dtype, np.integer)):
        raise ValueError(f"n and c must be integers, got n: {n_arr.dtype} {n_arr.shape}, c: {c_arr.dtype} {c_arr.shape}")
    try:
        n_arr, c_arr = np.broadcast_arrays(n_arr, c_arr)
    except ValueError:
        raise ValueError(f"n and c must broadcast, got n: {n_arr.shape}, c: {c_arr.shape}") from None
    if (n_arr < 1).any() or (c_arr < 0).any() or (c_arr > n_arr).any():
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n: {n_arr.shape} in {n_arr.min()}..{n_arr.max()}, "
                         f"c: {c_arr.shape} in {c_arr.min()}..{c_arr.max()}")
    if k is not None and (k < 1 or (k > n_arr).any()):
        raise ValueError(f"k must be in 1..n, got k={k} (n: {n_arr.shape} in {n_arr.min()}..{n_arr.max()})")
    return n_arr.astype(np.int64), c_arr.astype(np.int64)


def pass_at_k(n, c, k):
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (arrays broadcast):
    ``1 - C(n - c, k) / C(n, k)``, computed as ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``
    (no huge binomials). Returns float64 of the broadcast shape."""
    k = int(k)
    n, c = _check_counts(n, c, k)
    out = np.ones(n.shape, dtype=np.float64)
    for idx in np.ndindex(n.shape):
        ni, ci = int(n[idx]), int(c[idx])
        if ni - ci < k:  # every k-subset holds a correct sample
            continue
        i = np.arange(ni - ci + 1, ni + 1, dtype=np.float64)
        out[idx] = 1.0 - np.prod(1.0 - k / i)
    return out


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    from scipy.special import ndtri

    return float(ndtri(0.5 + confidence / 2))


def wilson_interval(c, n, confidence=0.95):
    """Wilson score interval for a success probability from ``c`` successes in ``n`` trials:
    ``(lo, hi)`` arrays of the broadcast shape."""
    z = _z(confidence)
    n, c = _check_counts(n, c)
    p = c / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def _binom_tail_ge(c, n, p):
    """P(X >= c) for X ~ Binomial(n, p); arrays, c >= 1."""
    from scipy.special import gammaln

    j = np.arange(int(n.max()) + 1, dtype=np.float64)
    logc = gammaln(n[..., None] + 1.0) - gammaln(j + 1.0) - gammaln(np.maximum(n[..., None] - j, 0) + 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = (logc + j * np.log(p[..., None]) + (n[..., None] - j) * np.log1p(-p[..., None]))
    valid = (j >= c[..., None]) & (j <= n[..., None])
    return np.where(valid, np.exp(np.where(valid, logp, -np.inf)), 0.0).sum(axis=-1)


def clopper_pearson_interval(c, n, confidence=0.95):
    """The exact (Clopper-Pearson) interval: ``lo`` solves ``P(X >= c | lo) = alpha / 2`` and
    ``hi`` solves ``P(X <= c | hi) = alpha / 2`` (``lo = 0`` when ``c = 0``, ``hi = 1`` when
    ``c = n``), by 60 bisection steps on the binomial tail summed term by term."""
    _z(confidence)
    n, c = _check_counts(n, c)
    a = (1.0 - confidence) / 2
    n_f = n.astype(np.float64)

    def solve(tail, target_c):
        lo_p, hi_p = np.zeros(n.shape), np.ones(n.shape)
        for _ in range(60):  # tail(p) increases with p
            mid = (lo_p + hi_p) / 2
            up = tail(target_c, n_f, mid) > a
            hi_p, lo_p = np.where(up, mid, hi_p), np.where(up, lo_p, mid)
        return (lo_p + hi_p) / 2

    lower = solve(lambda cc, nn, p: _binom_tail_ge(cc, nn, p), c.astype(np.float64))
    # P(X <= c | p) = 1 - P(X >= c + 1 | p) decreases with p; solve P(X >= c + 1 | p) = 1 - a
    upper_tail = lambda cc, nn, p: 1.0 - _binom_tail_ge(cc, nn, p)  # noqa: E731
    lo_p, hi_p = np.zeros(n.shape), np.ones(n.shape)
    for _ in range(60):
        mid = (lo_p + hi_p) / 2
        down = upper_tail(c + 1.0, n_f, mid) < a  # too far right
        hi_p, lo_p = np.where(down, mid, hi_p), np.where(down, lo_p, mid)
    upper = (lo_p + hi_p) / 2
    lower = np.where(c == 0, 0.0, lower)
    upper = np.where(c == n, 1.0, upper)
    return lower, upper


def bootstrap_interval(values, idx, confidence=0.95):
    """Percentile bootstrap interval of the mean of ``values (N,)`` from the resamples
    ``idx (R, N)`` (integer indices into ``values``, drawn with replacement by the caller):
    the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles (linear
    interpolation) of the ``R`` resampled means. Returns ``(lo, hi)`` floats."""
    _z(confidence)
    vs, ixs = V.shape_of(values), V.shape_of(idx)
    if len(vs) != 1 or len(ixs) != 2 or ixs[1] != vs[0]:
        raise ValueError(f"values must be (N,) and idx (R, N), got values: {vs}, idx: {ixs}")
    idx = np.asarray(idx)
    if not np.issubdtype(idx.dtype, np.integer) or idx.min() < 0 or idx.max() >= vs[0]:
        raise ValueError(f"idx must hold integer indices in [0, {vs[0]}) (values: {vs}, idx: {ixs})")
    means = np.asarray(values, dtype=np.float64)[idx].mean(axis=1)  # (R,)
    lo, hi = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)


def _ngram_codes(ids, n: int, base: int):
    """The integer code ``sum_j ids[t + j] base^(n - 1 - j)`` of every n-gram of a 1-D row."""
    ids = np.asarray(ids, dtype=np.int64)
    m = ids.shape[-1] - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.int64)
    code = np.zeros(m, dtype=np.int64)
    for j in range(n):
        code = code * base + ids[j:j + m]
    return code


def ngram_overlap(items, train_ids, n, vocab_size):
    """For each test item (a list of 1-D id arrays), the share of its n-grams that occur
    anywhere in ``train_ids (N,)``; an item shorter than ``n`` gets 0. Returns ``(len(items),)``
    float64. ``vocab_size ** n`` must fit in int64 (the n-grams are coded as integers)."""
    n = V.check_positive_int("n", n)
    vocab_size = V.check_positive_int("vocab_size", vocab_size)
    if n * math.log2(vocab_size) >= 63:
        raise ValueError(f"vocab_size ** n must fit in int64, got vocab_size={vocab_size}, n={n}")
    ts = V.shape_of(train_ids)
    if len(ts) != 1:
        raise ValueError(f"train_ids must be (N,), got {ts}")
    train = np.unique(_ngram_codes(train_ids, n, vocab_size))
    codes = []
    for i, item in enumerate(items):
        if len(V.shape_of(item)) != 1:
            raise ValueError(f"items[{i}] must be (L,), got {V.shape_of(item)}")
        codes.append(_ngram_codes(item, n, vocab_size))
    found = np.isin(np.concatenate(codes + [np.zeros(0, dtype=np.int64)]), train)  # one search for all items
    out = np.zeros(len(items), dtype=np.float64)
    start = 0
    for i, c in enumerate(codes):
        if c.size:
            out[i] = found[start:start + c.size].mean()
        start += c.size
    return out
