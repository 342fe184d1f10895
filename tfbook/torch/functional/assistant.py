"""The functions of :mod:`tfbook.numpy.assistant` for ``torch.Tensor`` (chapters 24 and 25).

Same names, arguments and messages; written with tensor operations (the loops of the NumPy
versions become cumulative operations here), so the two are independent computations of the
same definitions.
"""

from __future__ import annotations

import math

import torch

from ... import _validate as V

__all__ = ["answer_targets", "document_mask", "document_positions", "masked_mean_nll", "pass_at_k",
           "wilson_interval", "clopper_pearson_interval", "bootstrap_interval", "ngram_overlap"]

_INT = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _t(x) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def _dt(x) -> str:
    """The dtype's name as NumPy writes it (``float64``, not ``torch.float64``): the twins' messages agree."""
    return str(x.dtype).replace("torch.", "")


def _check_ids_2d(name: str, ids) -> tuple:
    ids = _t(ids)
    shape = tuple(ids.shape)
    if len(shape) != 2:
        raise ValueError(f"{name} must be (B, T) integer ids, got shape {shape}")
    if ids.dtype not in _INT:
        raise ValueError(f"{name} must hold integer ids, got dtype {_dt(ids)} ({name}: {shape})")
    return shape


def answer_targets(ids, doc, assistant_id, end_id, ignore_index=-100):
    """See :func:`tfbook.numpy.assistant.answer_targets`. Here the answer spans come from a
    cumulative count: inside a conversation, a token is in an answer when more ``assistant_id``
    than ``end_id`` tokens come strictly before it (turns alternate, so the difference is 0 or 1)."""
    shape = _check_ids_2d("ids", ids)
    ids, doc = _t(ids).long(), _t(doc)
    if tuple(doc.shape) != shape:
        raise ValueError(f"doc must have the shape of ids, got doc: {tuple(doc.shape)}, ids: {shape}")
    doc = doc.long()
    B, T = shape
    # restart the counts at every new conversation: subtract the count reached at its first token
    opened = torch.cumsum((ids == assistant_id).long(), dim=1)
    closed = torch.cumsum((ids == end_id).long(), dim=1)
    before = torch.zeros_like(opened)  # opened - closed strictly before t
    before[:, 1:] = (opened - closed)[:, :-1]
    new = torch.ones_like(doc, dtype=torch.bool)
    new[:, 1:] = doc[:, 1:] != doc[:, :-1]
    t = torch.arange(T, device=ids.device).expand(B, T)
    start = torch.cummax(torch.where(new, t, torch.zeros_like(t)), dim=1).values
    base = torch.gather(before, 1, start)
    in_answer = (before - base) > 0
    y = torch.full(shape, ignore_index, dtype=torch.long, device=ids.device)
    keep = in_answer[:, 1:] & (doc[:, 1:] == doc[:, :-1]) & (doc[:, 1:] >= 0)
    y[:, :-1] = torch.where(keep, ids[:, 1:], torch.full_like(ids[:, 1:], ignore_index))
    return y


def _check_doc(doc) -> tuple:
    doc = _t(doc)
    shape = tuple(doc.shape)
    if len(shape) < 1 or doc.dtype not in _INT:
        raise ValueError(f"doc must be (..., T) integer document ids, got shape {shape}, dtype {_dt(doc)}")
    return shape


def document_mask(doc):
    """See :func:`tfbook.numpy.assistant.document_mask`."""
    _check_doc(doc)
    doc = _t(doc)
    T = doc.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc.device).tril()
    same = (doc.unsqueeze(-1) == doc.unsqueeze(-2)) & (doc.unsqueeze(-1) >= 0)
    return same & causal


def document_positions(doc):
    """See :func:`tfbook.numpy.assistant.document_positions`."""
    _check_doc(doc)
    doc = _t(doc)
    T = doc.shape[-1]
    t = torch.arange(T, device=doc.device).expand(doc.shape)
    new = torch.ones(doc.shape, dtype=torch.bool, device=doc.device)
    new[..., 1:] = doc[..., 1:] != doc[..., :-1]
    start = torch.cummax(torch.where(new, t, torch.zeros_like(t)), dim=-1).values
    return (t - start).long()


def masked_mean_nll(logits, targets, ignore_index=-100):
    """See :func:`tfbook.numpy.assistant.masked_mean_nll` (a 0-d tensor, differentiable)."""
    logits, targets = _t(logits), _t(targets)
    ls, ts = tuple(logits.shape), tuple(targets.shape)
    if len(ls) < 1 or ls[:-1] != ts:
        raise ValueError(f"targets must have the shape of logits without its last axis, got "
                         f"logits: {ls}, targets: {ts}")
    rows = logits.reshape(-1, ls[-1])
    tgt = targets.reshape(-1).long()
    keep = tgt != ignore_index
    if not bool(keep.any()):
        raise ValueError(f"targets has no scored entry (all equal ignore_index={ignore_index}; targets: {ts})")
    kept = tgt[keep]
    if int(kept.min()) < 0 or int(kept.max()) >= ls[-1]:
        raise ValueError(f"targets must be in [0, {ls[-1]}) or ignore_index, got {int(kept.min())}..{int(kept.max())} "
                         f"(logits: {ls})")
    logp = torch.log_softmax(rows[keep], dim=-1)
    return -logp.gather(1, kept[:, None]).mean()


def _check_counts(n, c, k=None):
    n, c = _t(n), _t(c)
    if n.dtype not in _INT or c.dtype not in _INT:
        raise ValueError(f"n and c must be integers, got n: {_dt(n)} {tuple(n.shape)}, c: {_dt(c)} {tuple(c.shape)}")
    try:
        n, c = torch.broadcast_tensors(n, c)
    except RuntimeError:
        raise ValueError(f"n and c must broadcast, got n: {tuple(n.shape)}, c: {tuple(c.shape)}") from None
    if bool((n < 1).any()) or bool((c < 0).any()) or bool((c > n).any()):
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n: {tuple(n.shape)} in {int(n.min())}..{int(n.max())}, "
                         f"c: {tuple(c.shape)} in {int(c.min())}..{int(c.max())}")
    if k is not None and (k < 1 or bool((k > n).any())):
        raise ValueError(f"k must be in 1..n, got k={k} (n: {tuple(n.shape)} in {int(n.min())}..{int(n.max())})")
    return n.long(), c.long()


def pass_at_k(n, c, k):
    """See :func:`tfbook.numpy.assistant.pass_at_k`. Here as a ratio of binomials in log space:
    ``1 - exp(lgamma-terms of C(n - c, k) - C(n, k))``, zero-probability terms handled."""
    k = int(k)
    n, c = _check_counts(n, c, k)
    nf, cf = n.double(), c.double()
    lg = torch.lgamma
    bad = nf - cf  # incorrect samples
    log_ratio = (lg(bad + 1) - lg(bad - k + 1).where(bad >= k, torch.zeros_like(bad)) - lg(nf + 1) + lg(nf - k + 1))
    ratio = torch.where(bad >= k, torch.exp(log_ratio), torch.zeros_like(nf))
    return 1.0 - ratio


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return float(torch.special.ndtri(torch.tensor(0.5 + confidence / 2, dtype=torch.float64)))


def wilson_interval(c, n, confidence=0.95):
    """See :func:`tfbook.numpy.assistant.wilson_interval`."""
    z = _z(confidence)
    n, c = _check_counts(n, c)
    n, c = n.double(), c.double()
    p = c / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * torch.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def _binom_log_pmf(n, p):
    """``(..., n_max + 1)`` log P(X = j), ``-inf`` for j > n."""
    j = torch.arange(int(n.max()) + 1, dtype=torch.float64)
    nn_ = n.double()[..., None]
    valid = j <= nn_
    logc = torch.lgamma(nn_ + 1) - torch.lgamma(j + 1) - torch.lgamma((nn_ - j).clamp(min=0) + 1)
    logp = logc + j * torch.log(p[..., None]) + (nn_ - j) * torch.log1p(-p[..., None])
    return torch.where(valid, logp, torch.full_like(logp, -math.inf)), j


def clopper_pearson_interval(c, n, confidence=0.95):
    """See :func:`tfbook.numpy.assistant.clopper_pearson_interval`: the same bisection, with
    the binomial tails as log-sum-exps of the log-pmf."""
    _z(confidence)
    n, c = _check_counts(n, c)
    a = (1.0 - confidence) / 2

    def tail_ge(cc, p):  # P(X >= cc | p)
        logpmf, j = _binom_log_pmf(n, p)
        sel = torch.where(j >= cc.double()[..., None], logpmf, torch.full_like(logpmf, -math.inf))
        return torch.exp(torch.logsumexp(sel, dim=-1))

    def bisect(pred):  # pred(mid) True -> the root is left of mid
        lo, hi = torch.zeros(n.shape, dtype=torch.float64), torch.ones(n.shape, dtype=torch.float64)
        for _ in range(60):
            mid = (lo + hi) / 2
            left = pred(mid)
            hi, lo = torch.where(left, mid, hi), torch.where(left, lo, mid)
        return (lo + hi) / 2

    lower = bisect(lambda p: tail_ge(c, p) > a)
    upper = bisect(lambda p: (1.0 - tail_ge(c + 1, p)) < a)
    lower = torch.where(c == 0, torch.zeros_like(lower), lower)
    upper = torch.where(c == n, torch.ones_like(upper), upper)
    return lower, upper


def bootstrap_interval(values, idx, confidence=0.95):
    """See :func:`tfbook.numpy.assistant.bootstrap_interval`."""
    _z(confidence)
    values, idx = _t(values), _t(idx)
    vs, ixs = tuple(values.shape), tuple(idx.shape)
    if len(vs) != 1 or len(ixs) != 2 or ixs[1] != vs[0]:
        raise ValueError(f"values must be (N,) and idx (R, N), got values: {vs}, idx: {ixs}")
    if idx.dtype not in _INT or int(idx.min()) < 0 or int(idx.max()) >= vs[0]:
        raise ValueError(f"idx must hold integer indices in [0, {vs[0]}) (values: {vs}, idx: {ixs})")
    means = values.double()[idx.long()].mean(dim=1)
    q = torch.tensor([(1 - confidence) / 2, (1 + confidence) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(means, q)
    return float(lo), float(hi)


def _ngram_codes(ids, n: int, base: int):
    ids = _t(ids).long()
    if ids.shape[-1] < n:
        return torch.zeros(0, dtype=torch.long)
    win = ids.unfold(0, n, 1)  # (L - n + 1, n)
    powers = base ** torch.arange(n - 1, -1, -1, dtype=torch.long)
    return (win * powers).sum(dim=1)


def ngram_overlap(items, train_ids, n, vocab_size):
    """See :func:`tfbook.numpy.assistant.ngram_overlap`."""
    n = V.check_positive_int("n", n)
    vocab_size = V.check_positive_int("vocab_size", vocab_size)
    if n * math.log2(vocab_size) >= 63:
        raise ValueError(f"vocab_size ** n must fit in int64, got vocab_size={vocab_size}, n={n}")
    train_ids = _t(train_ids)
    if train_ids.ndim != 1:
        raise ValueError(f"train_ids must be (N,), got {tuple(train_ids.shape)}")
    train = torch.unique(_ngram_codes(train_ids, n, vocab_size))
    codes = []
    for i, item in enumerate(items):
        item = _t(item)
        if item.ndim != 1:
            raise ValueError(f"items[{i}] must be (L,), got {tuple(item.shape)}")
        codes.append(_ngram_codes(item, n, vocab_size))
    found = torch.isin(torch.cat(codes + [torch.zeros(0, dtype=torch.long)]), train)  # one search for all items
    out = torch.zeros(len(items), dtype=torch.float64)
    start = 0
    for i, c in enumerate(codes):
        if c.numel():
            out[i] = found[start:start + c.numel()].double().mean()
        start += c.numel()
    return out
