"""Chapter 13: the transformer mixed with a count model that learns as it reads.

zpaq and PPMd beat the chapter's transformer partly because they *count*: every string of the
text they have coded so far, the test text included, is remembered exactly. A transformer
remembers through its weights, and dynamic evaluation (``prose.dynamic_bits``) moves them only a
little. The cheapest way to give it a memory is to average its prediction with a counting
model's (the idea of kNN-LM, Khandelwal et al. 2020, and of infini-gram, Liu et al. 2024, with
exact string counts in place of a nearest-neighbour search):

* :func:`count_probs`: an interpolated absolute-discounting character model of contexts of
  0 to ``K`` characters whose counts are taken over *all the text before each character*: the
  training text and, when ``online=True``, the test text read so far (the way a compressor learns
  from what it codes). Vectorised: one stable sort per context length, over the whole text.
* :func:`fit_weights` and :func:`mix`: the linear mixture ``lam p_T + (1 - lam) p_C`` of two
  models' probabilities of the character that occurs, with one weight per context class (the
  count model's longest seen context, :func:`classes`), fitted by EM on the validation slice.

``python -m tfbook.tasks.mixing`` chooses the count model's order and discount, the classes and
the weights on the validation slice, codes the test slice once with seed 0's shipped transformer
(frozen and adapting), and writes ``prose_mix.json``. Only seed 0's weights ship, so the
mixture is measured for seed 0 alone.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from tfbook.tasks._common import WEIGHTS, load_json

ARTIFACTS = ("prose_mix.json",)
ORDERS = (12, 16, 24, 32)                     # longest context K, chosen on validation
DISCOUNTS = (0.8, 0.9, 0.95, 1.0)                 # absolute discount D, chosen on validation
STRENGTHS = (0.0, 0.5, 1.0, 2.0)                 # strength s, chosen on validation
EDGES = (1, 3, 5, 7, 9, 12, 16)                # class c: longest seen context in [EDGES[c-1], EDGES[c])
RECIPE = dict(orders=ORDERS, discounts=DISCOUNTS, strengths=STRENGTHS, edges=EDGES, em_iters=100)
_B = np.uint64(0x9E3779B97F4A7C15)             # odd multiplier of the rolling hash (mod 2**64)


def _ids(name: str, x) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 1 or x.size < 1 or not np.issubdtype(x.dtype, np.integer):
        raise ValueError(f"{name} must be a non-empty 1-D integer array, got shape {x.shape}, dtype {x.dtype}")
    return x.astype(np.int64)


def earlier_sums(keys: np.ndarray, weights: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """For every position e, the sum of ``weights`` over the positions *before* e with the same key
    (an exclusive running sum within each group of equal keys, in reading order). ``order``: the
    stable argsort of ``keys``, when already known."""
    if order is None:
        order = np.argsort(keys, kind="stable")        # groups of equal keys, each in reading order
    k, w = keys[order], weights[order].astype(np.int64)
    csum = np.cumsum(w) - w                             # exclusive running sum over the sorted array
    first = np.r_[True, k[1:] != k[:-1]]
    start = np.flatnonzero(first)
    group = np.cumsum(first) - 1
    out = np.empty_like(csum)
    out[order] = csum - csum[start][group]              # minus the running sum at the group's start
    return out


def count_probs(train_ids, ids, K: int, discount: float, vocab_size: int, online: bool = True,
                strength: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Probability of each character of ``ids`` after ``train_ids`` and the characters of ``ids``
    before it, under interpolated absolute discounting over contexts of 0..K characters:

        p_k(c | h) = (max(a(hc) - D, 0) + (D N(h) + s) p_(k-1)(c | h')) / (A(h) + s)   if A(h) > 0,
        p_k(c | h) = p_(k-1)(c | h')                                                   otherwise,

    from p_(-1) = 1/V, with a(hc) the count of h followed by c, A(h) = sum_c a(hc), N(h) the number
    of distinct c with a(hc) > 0, h' the context h without its oldest character and s >= 0 a
    strength that passes more mass to the shorter context (the predictive rule of a hierarchical
    Pitman-Yor process with at most one table per character type, t_hc = min(1, a(hc)): Teh 2006's
    approximation that recovers interpolated Kneser-Ney, D his discount and s his strength theta;
    one customer per table, t_hc = a(hc), would give a(hc)(1 - D) instead). Below the longest context the
    counts are Kneser-Ney's continuation counts (an occurrence of hc counts once per distinct
    character x before it). The counts are taken over the text before the character: the
    training text and, with ``online=True``, the characters of ``ids`` already read. Returns
    ``(p, longest)``, both (len(ids),): the probabilities and the longest context length with
    A(h) > 0 (-1 if none)."""
    if not 0 < discount <= 1:
        raise ValueError(f"discount must be in (0, 1], got {discount}")
    if strength < 0:
        raise ValueError(f"strength must be >= 0, got {strength}")
    levels = level_counts(train_ids, ids, K, vocab_size, online, every=False)
    return combine(levels, K, discount, vocab_size, strength)


def level_counts(train_ids, ids, K: int, vocab_size: int, online: bool = True, every: bool = True) -> dict:
    """The counts :func:`count_probs` combines, for every context length 0..K: ``raw[k]`` and
    ``cont[k]``, each a tuple (a, A, N) of arrays (len(ids),) (raw counts; continuation counts).
    They do not depend on D or s, so a search over those (and over K, with ``every=True``)
    reuses them; ``every=False`` computes only those a model of longest context K uses."""
    tr, x = _ids("train_ids", train_ids), _ids("ids", ids)
    if not 0 <= K < tr.size:
        raise ValueError(f"K must be in 0..len(train_ids) - 1 = {tr.size - 1}, got {K}")
    if max(tr.max(), x.max()) >= vocab_size or min(tr.min(), x.min()) < 0:
        raise ValueError(f"ids must be in 0..vocab_size - 1 = {vocab_size - 1}")
    S = np.concatenate([tr, x])
    n, n_tr = S.size, tr.size
    pos = np.arange(n)
    # an occurrence of "hc" ending at e is counted for the characters after e; with online=False
    # only the occurrences inside the training text are
    counted = np.ones(n, bool) if online else pos < n_tr
    key = np.zeros(n, np.uint64)                        # the empty string, ending everywhere
    keys = [key]                                        # keys[m][e]: hash of S[e - m + 1 : e + 1]
    with np.errstate(over="ignore"):
        for m in range(1, K + 3):
            nxt = np.zeros(n, np.uint64)
            nxt[1:] = key[:-1] * _B
            key = nxt + (S + 1).astype(np.uint64)
            keys.append(key)
    orders = [np.argsort(kk, kind="stable") for kk in keys]   # one sort per string length
    at = pos[n_tr:]                                     # the positions scored
    out = {"raw": [], "cont": []}
    for k in range(K + 1):
        for kind in ("raw", "cont"):
            if not every and (kind == "raw") != (k == K):
                out[kind].append(None)
                continue
            # "hc" (k + 1 characters) ending at e, inside S and counted; for continuation counts an
            # occurrence counts only if it is the first of "xhc" for the character x before it
            occ = counted & (pos >= k)
            if kind == "cont":
                occ = occ & (pos >= k + 1)
                occ = occ & (earlier_sums(keys[k + 2], occ, orders[k + 2]) == 0)
            a_all = earlier_sums(keys[k + 1], occ, orders[k + 1])
            new = occ & (a_all == 0)                    # the first counted occurrence of hc
            # the context h (k characters) of "hc" ending at e ends at e - 1: sums over the contexts
            # ending before the current one, weighted by whether its "hc" counts (or is new)
            ctx_w, ctx_new = np.zeros(n, np.int64), np.zeros(n, np.int64)
            ctx_w[:-1], ctx_new[:-1] = occ[1:], new[1:]
            A = earlier_sums(keys[k], ctx_w, orders[k])[at - 1]
            N = earlier_sums(keys[k], ctx_new, orders[k])[at - 1]
            if k == 0:                                  # the empty context before the first character
                A, N = A + int(occ[0]), N + int(new[0])
            out[kind].append((a_all[at], A, N))
    return out


def combine(levels: dict, K: int, discount: float, vocab_size: int, strength: float = 0.0
            ) -> tuple[np.ndarray, np.ndarray]:
    """The recursion of :func:`count_probs` on counts from :func:`level_counts` (raw counts at
    the longest context K, continuation counts below it)."""
    p = np.full(levels["raw"][K][0].size, 1.0 / vocab_size)
    longest = np.full(p.size, -1)
    for k in range(K + 1):
        a, A, N = levels["raw" if k == K else "cont"][k]
        seen = A > 0
        p = np.where(seen, (np.maximum(a - discount, 0) + (discount * N + strength) * p)
                     / np.where(seen, A + strength, 1), p)
        longest = np.where(seen, k, longest)
    return p, longest


def classes(longest: np.ndarray, edges=EDGES) -> np.ndarray:
    """The context class of each position: the bucket of the count model's longest seen context."""
    return np.searchsorted(np.asarray(edges), np.asarray(longest), side="right")


def mix(p_model: np.ndarray, p_counts: np.ndarray, cls: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """lam[cls] p_model + (1 - lam[cls]) p_counts: a mixture of two normalised distributions, so
    normalised; only the probabilities of the characters that occur are needed."""
    lam = np.asarray(lam)[cls]
    return lam * p_model + (1 - lam) * p_counts


def fit_weights(p_model, p_counts, cls, n_classes: int, iters: int = RECIPE["em_iters"]) -> np.ndarray:
    """The weight of the model in each class that maximises the mixture's likelihood, by EM
    (each step: the mean posterior responsibility of the model in the class)."""
    lam = np.full(n_classes, 0.5)
    for _ in range(iters):
        w = mix(p_model, p_counts, cls, lam)
        r = lam[cls] * p_model / w
        tot = np.bincount(cls, minlength=n_classes)
        lam = np.where(tot > 0, np.bincount(cls, r, minlength=n_classes) / np.maximum(tot, 1), 0.5)
    return lam


def bits(p: np.ndarray) -> float:
    return float(-np.log2(p).mean())


def load_pretrained(path=None) -> dict:
    """The shipped ``prose_mix.json``."""
    return load_json("prose_mix.json") if path is None else json.loads(Path(path).read_text())


def train(log=print, t_bits: dict | None = None) -> dict:  # pragma: no cover - minutes of one core
    """The whole experiment: the count model's (K, D) and the mixture's weights on the validation
    slice, then the test slice coded once (seed 0's transformer, frozen and adapting)."""
    import torch

    from tfbook.tasks import prose
    torch.set_num_threads(1)
    c_train, c_val, c_test = prose.data()
    tr, va, te = c_train.numpy(), c_val.numpy(), c_test.numpy()
    V = prose.tokenizer().vocab_size
    lr = prose.load_long_scores()["dynamic"]["lr"]
    if t_bits is None:
        lm, _ = prose.load_long()
        t_bits = {}
        for split, ctx, ids in (("validation", c_train, c_val), ("test", c_val, c_test)):
            for name, r in (("frozen", 0.0), ("adapting", lr)):
                t_bits[f"{split}_{name}"] = prose.dynamic_bits(lm, ctx, ids, lr=r).numpy()
    t0 = time.process_time()
    search = {}
    levels = level_counts(tr, va, max(ORDERS), V)
    for K in ORDERS:
        for D in DISCOUNTS:
            for st in STRENGTHS:
                pc, _ = combine(levels, K, D, V, st)
                search[f"{K}:{D}:{st}"] = bits(pc)
                log(f"count model K={K} D={D} s={st}: validation {search[f'{K}:{D}:{st}']:.4f}", flush=True)
    best = min(search, key=search.get)
    K, D, st = int(best.split(":")[0]), float(best.split(":")[1]), float(best.split(":")[2])
    pc_val, long_val = count_probs(tr, va, K, D, V, strength=st)
    pc_test, long_test = count_probs(tr, te, K, D, V, strength=st)
    pc_test_static, _ = count_probs(tr, te, K, D, V, online=False, strength=st)
    pc_val_static, _ = count_probs(tr, va, K, D, V, online=False, strength=st)
    n_cls = len(EDGES) + 1
    cv, ct = classes(long_val), classes(long_test)
    out = dict(recipe=dict(RECIPE), K=K, discount=D, strength=st, search=search, lr=lr,
               counts=dict(validation=bits(pc_val), test=bits(pc_test), validation_static=bits(pc_val_static),
                           test_static=bits(pc_test_static), test_first_10000=bits(pc_test[:10_000])),
               mixtures={})
    half = va.size // 2
    for name in ("frozen", "adapting"):
        pt_val = 2.0 ** -t_bits[f"validation_{name}"]
        pt_test = 2.0 ** -t_bits[f"test_{name}"]
        # the rule (one weight, or one per class) chosen on validation by two-fold cross-fitting
        cross = {}
        for rule, c_v in (("one weight", np.zeros_like(cv)), ("per class", cv)):
            tot = 0.0
            for fit, ev in ((slice(0, half), slice(half, None)), (slice(half, None), slice(0, half))):
                lam = fit_weights(pt_val[fit], pc_val[fit], c_v[fit], n_cls)
                tot += -np.log2(mix(pt_val[ev], pc_val[ev], c_v[ev], lam)).sum()
            cross[rule] = tot / va.size
        rule = min(cross, key=cross.get)
        c_v, c_t = (cv, ct) if rule == "per class" else (np.zeros_like(cv), np.zeros_like(ct))
        lam = fit_weights(pt_val, pc_val, c_v, n_cls)
        p_test = mix(pt_test, pc_test, c_t, lam)
        out["mixtures"][name] = dict(
            rule=rule, cross_validation=cross, weights=lam.tolist(),
            class_share_validation=(np.bincount(cv, minlength=n_cls) / cv.size).tolist(),
            transformer=dict(validation=bits(pt_val), test=bits(pt_test), test_first_10000=bits(pt_test[:10_000])),
            validation=bits(mix(pt_val, pc_val, c_v, lam)),
            test=bits(p_test), test_first_10000=bits(p_test[:10_000]),
            test_static_counts=bits(mix(pt_test, pc_test_static, c_t, lam)))
        log(f"{name}: rule {rule} {cross}; weights {np.round(lam, 3).tolist()}; validation "
            f"{out['mixtures'][name]['validation']:.4f}; test {out['mixtures'][name]['test']:.4f}")
    out["seconds_cpu_counts_and_mixing"] = time.process_time() - t0
    return out


def save(result: dict, folder) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / "prose_mix.json").write_text(json.dumps(result, indent=1))


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped artifact
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(WEIGHTS))
    parser.add_argument("--bits", default=None, help="an .npz of the transformer's per-character bits "
                        "(validation_/test_ + frozen/adapting), to skip recomputing them")
    args = parser.parse_args(argv)
    t_bits = dict(np.load(args.bits)) if args.bits else None
    save(train(t_bits=t_bits), args.out)


if __name__ == "__main__":  # pragma: no cover
    main()
