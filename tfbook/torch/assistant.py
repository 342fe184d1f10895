"""A :class:`~tfbook.torch.models.DecoderLM` as a chat model (chapters 24 and 25).

* :func:`extend_vocab`: a copy of a model with new token ids (the chat template's role and
  end-of-turn tokens), their embedding rows started at the mean of the old rows;
* :func:`packed_logits`: the forward pass over rows that hold several conversations, each
  attending only to itself (:func:`tfbook.torch.functional.assistant.document_mask`) and
  counting positions from zero (:func:`~tfbook.torch.functional.assistant.document_positions`);
* :func:`answer_loss`: the mean loss on the answer tokens only;
* :func:`answer_scores`: per conversation, whether greedy decoding writes exactly its answer
  (every answer token, and the end of turn, the argmax given the reference prefix) and the
  log-probability of sampling it, from one teacher-forced pass;
* :func:`complete`: greedy or sampled answers to a batch of prompts, stopped at end of turn;
* :func:`freeze_rows`: keep chosen embedding rows fixed while the others train (the old
  vocabulary under LoRA, which trains only the new rows and the adapters).
"""

from __future__ import annotations

import torch
from torch import nn

from .. import _validate as V
from .functional import assistant as FA
from .functional.positions import embedding_lookup
from .models import DecoderLM, DecoderLMConfig

__all__ = ["extend_vocab", "packed_logits", "answer_loss", "answer_scores", "complete", "freeze_rows"]


def extend_vocab(model: DecoderLM, n_new: int) -> DecoderLM:
    """A new :class:`DecoderLM` with ``n_new`` more token ids: every weight copied, the new
    rows of ``W_E`` set to the mean of the old rows (so a new token starts as an average
    token, not a random one). Learned positions and tied weights are required."""
    n_new = V.check_positive_int("n_new", n_new)
    c = model.config
    if c.pos != "learned" or not c.tie_weights:
        raise ValueError(f"extend_vocab needs learned positions and tied weights, got pos={c.pos!r}, "
                         f"tie_weights={c.tie_weights}")
    cfg = DecoderLMConfig(**{**c.__dict__, "vocab_size": c.vocab_size + n_new})
    new = DecoderLM(cfg).to(model.W_E.dtype)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    W = state["W_E"]
    state["W_E"] = torch.cat([W, W.mean(dim=0, keepdim=True).expand(n_new, -1)], dim=0)
    new.load_state_dict(state)
    return new.eval() if not model.training else new


def packed_logits(model: DecoderLM, ids: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """Logits ``(B, T, V)`` of rows ``ids (B, T)`` packed with the conversations ``doc (B, T)``
    (``-1``: padding). Each token attends only to earlier tokens of its own conversation and
    gets the learned position of its place inside it, so a packed conversation gets the
    logits it would get alone."""
    c = model.config
    if ids.ndim != 2 or tuple(doc.shape) != tuple(ids.shape):
        raise ValueError(f"ids and doc must be (B, T) of one shape, got ids: {tuple(ids.shape)}, "
                         f"doc: {tuple(doc.shape)}")
    if ids.shape[1] > c.block_size:
        raise ValueError(f"ids has T={ids.shape[1]} > block_size={c.block_size} (ids: {tuple(ids.shape)})")
    if int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size:
        raise ValueError(f"ids must be in [0, {c.vocab_size}), got {int(ids.min())}..{int(ids.max())} "
                         f"(ids: {tuple(ids.shape)})")
    mask = FA.document_mask(doc)[:, None]  # (B, 1, T, T), True = may attend
    pos = FA.document_positions(doc)  # (B, T)
    X = embedding_lookup(ids, model.W_E) + model.pos.weight[pos]  # (B, T, D)
    for block in model.blocks:
        X = block(X, mask=mask)
    return model._unembed(X)


def answer_loss(model: DecoderLM, ids: torch.Tensor, doc: torch.Tensor, assistant_id: int, end_id: int
                ) -> torch.Tensor:
    """Mean cross-entropy (nats) on the answer tokens of packed rows (the loss of chapter 24)."""
    y = FA.answer_targets(ids, doc, assistant_id, end_id)
    return FA.masked_mean_nll(packed_logits(model, ids, doc), y)


@torch.no_grad()
def answer_scores(model: DecoderLM, ids: torch.Tensor, doc: torch.Tensor, assistant_id: int, end_id: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(exact, logprob)``, one entry per conversation in row-major order (row by row, then by
    ``doc`` within a row): ``exact`` is True when, at every answer position, the reference
    token (the answer's characters, then ``end_id``) is the argmax of the logits, which is
    exactly when greedy decoding from the prompt writes the reference answer and stops (each
    greedy step then sees the reference prefix); ``logprob`` is the sum of the reference
    tokens' log-probabilities, ``ln`` of the probability that sampling at temperature 1 writes
    exactly the answer and stops. Computed in the model's dtype."""
    y = FA.answer_targets(ids, doc, assistant_id, end_id)  # (B, T)
    logits = packed_logits(model, ids, doc)
    logp = torch.log_softmax(logits, dim=-1)
    scored = y != -100
    tgt = y.clamp(min=0)
    hit = (logits.argmax(dim=-1) == tgt) | ~scored  # (B, T)
    lp = torch.where(scored, logp.gather(-1, tgt[..., None])[..., 0], torch.zeros_like(logp[..., 0]))
    exact, total = [], []
    for b in range(ids.shape[0]):
        for d in range(int(doc[b].max()) + 1):
            sel = doc[b] == d
            if not bool(scored[b][sel].any()):
                raise ValueError(f"conversation {d} of row {b} has no answer token (ids: {tuple(ids.shape)})")
            exact.append(bool(hit[b][sel].all()))
            total.append(lp[b][sel].sum())
    return torch.tensor(exact), torch.stack(total)


@torch.no_grad()
def complete(model: DecoderLM, prompts: list, end_id: int, max_new: int = 8, temperature: float = 0.0,
             generator: torch.Generator | None = None, pad_id: int = 0) -> list:
    """The answers (lists of ids, ``end_id`` excluded) the model writes after each prompt (a
    list of id lists ending with the assistant token): greedy when ``temperature == 0``,
    sampled from ``softmax(logits / temperature)`` otherwise. The prompts are left-padded
    into one batch (the padding is a document of its own that nothing attends to)."""
    if len(prompts) == 0:
        return []
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    L = max(len(p) for p in prompts)
    if L + max_new > model.config.block_size:
        raise ValueError(f"longest prompt {L} + max_new {max_new} exceeds block_size={model.config.block_size}")
    B = len(prompts)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    doc = torch.full((B, L), -1, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = torch.as_tensor(p, dtype=torch.long)
        doc[i, L - len(p):] = 0
    done = torch.zeros(B, dtype=torch.bool)
    out = [[] for _ in range(B)]
    for _ in range(max_new):
        logits = packed_logits(model, ids, doc)[:, -1].double()  # (B, V)
        if temperature == 0:
            nxt = logits.argmax(dim=-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)[:, 0]
        for i in range(B):
            if not done[i]:
                if int(nxt[i]) == end_id:
                    done[i] = True
                else:
                    out[i].append(int(nxt[i]))
        if bool(done.all()):
            break
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        doc = torch.cat([doc, torch.zeros(B, 1, dtype=torch.long)], dim=1)
    return out


def freeze_rows(param: nn.Parameter, rows: int):
    """Zero the gradient of the first ``rows`` rows of ``param`` at every backward pass (with
    no weight decay, AdamW then leaves them exactly unchanged). Returns the hook's handle."""
    rows = V.check_positive_int("rows", rows)
    if rows > param.shape[0]:
        raise ValueError(f"rows={rows} exceeds the {param.shape[0]} rows of the parameter {tuple(param.shape)}")

    def hook(grad):
        grad = grad.clone()
        grad[:rows] = 0
        return grad

    return param.register_hook(hook)
