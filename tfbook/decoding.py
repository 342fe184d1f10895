"""Beam search for the encoder-decoder (chapter 12), and the log-probability of a decoded sequence.

Greedy decoding (``EncoderDecoder.greedy_decode``) keeps one partial output and extends it by
its most likely next token. Beam search keeps the ``beam_width`` partial outputs with the
highest total log-probability ``sum_t log p(y_t | y_<t, source)``: at every step each of them
is extended by every token, and the ``beam_width`` best of all those extensions survive. A
partial output that has produced ``eos`` is finished: it is carried on unchanged (padded,
its score fixed) and competes with the unfinished ones. When every beam is finished, or after
``max_len`` tokens, the beam with the highest score is returned. Scores are plain sums of
log-probabilities (no length normalisation).

With ``beam_width = 1`` beam search *is* greedy decoding: the one surviving extension is the
most likely token. With more beams it returns a sequence whose log-probability is at least
that of some other beam it kept, and in practice at least greedy's (tests/test_decoding.py
checks both on the chapter's model); it is not guaranteed to find the most likely sequence.
"""

from __future__ import annotations

import torch

__all__ = ["beam_search", "sequence_log_prob"]


def _check(model, max_len: int, bos: int, eos: int):
    c = model.config
    if not (isinstance(max_len, int) and max_len >= 1):
        raise ValueError(f"max_len must be a positive int, got {max_len!r}")
    if max_len + 1 > c.max_len:
        raise ValueError(f"max_len={max_len} plus bos exceeds the model's max_len={c.max_len}")
    for name, tok in (("bos", bos), ("eos", eos)):
        if not 0 <= tok < c.tgt_vocab_size:
            raise ValueError(f"{name}={tok} is outside 0..{c.tgt_vocab_size - 1}")


@torch.no_grad()
def beam_search(model, src: torch.Tensor, max_len: int, bos: int, eos: int, beam_width: int = 4,
                src_valid=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Beam search for every source of the batch ``src (B, S)``.

    Returns ``(ids, scores)``: ``ids (B, L)`` are the best beam's tokens after ``bos`` in the
    format of ``greedy_decode`` (a sequence stops at its first ``eos``, kept; later positions
    hold ``config.pad_id``; ``L <= max_len``), ``scores (B,)`` its total log-probability.
    """
    if not (isinstance(beam_width, int) and beam_width >= 1):
        raise ValueError(f"beam_width must be a positive int, got {beam_width!r}")
    _check(model, max_len, bos, eos)
    c = model.config
    B, W, V = src.shape[0], beam_width, c.tgt_vocab_size
    src_valid = model._valid(src, src_valid)
    memory = model.encode(src, src_valid)                                    # (B, S, D)
    memory = memory.repeat_interleave(W, dim=0)                              # (B W, S, D)
    valid = src_valid.repeat_interleave(W, dim=0)
    tgt = torch.full((B * W, 1), bos, dtype=torch.long, device=src.device)
    scores = torch.full((B, W), float("-inf"), dtype=memory.dtype, device=src.device)
    scores[:, 0] = 0.0                                                       # one live beam at the start
    done = torch.zeros(B * W, dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        logits = model.decode(tgt, memory, valid, torch.ones_like(tgt, dtype=torch.bool))
        logp = torch.log_softmax(logits[:, -1].to(scores.dtype), dim=-1)     # (B W, V)
        # a finished beam has exactly one continuation, pad, which leaves its score unchanged
        fin = torch.full_like(logp, float("-inf"))
        fin[:, c.pad_id] = 0.0
        logp = torch.where(done[:, None], fin, logp)
        cand = (scores.reshape(B * W, 1) + logp).reshape(B, W * V)
        top, idx = cand.topk(W, dim=-1)                                      # (B, W), sorted, best first
        parent = idx // V + torch.arange(B, device=src.device)[:, None] * W  # row in the (B W) batch
        tok = (idx % V).reshape(B * W)
        parent = parent.reshape(B * W)
        tgt = torch.cat([tgt[parent], tok[:, None]], dim=1)
        done = done[parent] | (tok == eos)
        scores = top
        if bool(done.all()):
            break
    best = scores.argmax(dim=-1)                                             # (B,)
    rows = torch.arange(B, device=src.device) * W + best
    out = tgt[rows, 1:]
    return out, scores[torch.arange(B, device=src.device), best]


@torch.no_grad()
def sequence_log_prob(model, src: torch.Tensor, ids: torch.Tensor, eos: int, bos: int,
                      src_valid=None) -> torch.Tensor:
    """Total log-probability of the decoded outputs ``ids (B, L)`` (format of ``greedy_decode``).

    Sums ``log p(y_t | bos, y_<t, source)`` over each row's tokens up to and including its
    first ``eos`` (the pads after it are not part of the sequence). Returns ``(B,)``.
    """
    c = model.config
    B, L = ids.shape
    tgt_in = torch.cat([torch.full((B, 1), bos, dtype=torch.long, device=ids.device), ids[:, :-1]], dim=1)
    logits = model(src, tgt_in, src_valid=model._valid(src, src_valid),
                   tgt_valid=torch.ones_like(tgt_in, dtype=torch.bool))
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, :, None])[..., 0]   # (B, L)
    is_eos = ids == eos
    first = torch.where(is_eos.any(dim=1), is_eos.float().argmax(dim=1), torch.full((B,), L - 1))
    keep = torch.arange(L, device=ids.device)[None, :] <= first[:, None]
    return torch.where(keep, logp, torch.zeros_like(logp)).sum(dim=1)
