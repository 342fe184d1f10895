"""Context parallelism: one sequence split by position, merged through online-softmax states.

:func:`softmax_state` and :func:`merge_softmax_states` are the exact merge (chapter 17);
:func:`run_context_parallel` gathers every rank's states over its slice of the keys
(:func:`_context_parallel_worker`); :func:`ring_attention` passes the key/value blocks around a
ring so that no rank ever holds the whole sequence (the torchrun engine :func:`_ring_scheme`).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .config import DPConfig
from .launch import _init_group, _launch

__all__ = ["softmax_state", "merge_softmax_states", "run_context_parallel", "ring_data", "ring_attention"]


def softmax_state(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, scale: float | None = None):
    """The online-softmax state of queries ``Q (T_q, D_K)`` over keys ``K (T_k, D_K)``, values ``V``.

    Returns ``(m, l, acc)``: the row maxima ``(T_q, 1)``, ``l = sum_j exp(s_ij - m_i)`` and
    ``acc = sum_j exp(s_ij - m_i) v_j`` ``(T_q, D_V)``. Attention over these keys is ``acc / l``.
    """
    scale = 1.0 / math.sqrt(Q.shape[-1]) if scale is None else scale
    S = (Q @ K.transpose(-1, -2)) * scale  # (T_q, T_k)
    m = S.amax(dim=-1, keepdim=True)
    E = torch.exp(S - m)
    return m, E.sum(dim=-1, keepdim=True), E @ V


def merge_softmax_states(states):
    """Merge online-softmax states computed over disjoint key sets into one, exactly.

    With ``m = max_r m_r``, each part is rescaled by ``exp(m_r - m)``; the merged
    ``acc / l`` is attention over the union of the key sets.
    """
    states = list(states)
    if not states:
        raise ValueError("states is empty: need at least one (m, l, acc) triple")
    m = torch.stack([s[0] for s in states]).amax(dim=0)
    l = sum(torch.exp(s[0] - m) * s[1] for s in states)
    acc = sum(torch.exp(s[0] - m) * s[2] for s in states)
    return m, l, acc


def _attention_data(cfg: DPConfig):
    g = torch.Generator().manual_seed(2000 + cfg.seed)
    shape = (cfg.attn_T, cfg.attn_D)
    return tuple(torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))


def _context_parallel_worker(rank: int, world_size: int, port: int, cfg_dict: dict, out_dir: str,
                             timeout: float) -> None:
    """One rank of context parallelism: attention of every query over this rank's slice of keys.

    Rank ``r`` holds key/value rows ``[lo_k, hi_k)`` of one ``(attn_T, attn_D)`` problem, computes
    the online-softmax states of all queries over them, gathers every rank's states and merges
    them (:func:`merge_softmax_states`); saves ``rank<r>.pt`` with the merged attention.
    """
    dist = _init_group(rank, world_size, port, timeout)
    cfg = DPConfig(**cfg_dict)
    try:
        Q, K, V = _attention_data(cfg)
        bounds = [round(r * cfg.attn_T / world_size) for r in range(world_size + 1)]
        lo_k, hi_k = bounds[rank], bounds[rank + 1]
        state = torch.cat(softmax_state(Q, K[lo_k:hi_k], V[lo_k:hi_k]), dim=-1)  # (T, 2 + D_V)
        gathered = [torch.empty_like(state) for _ in range(world_size)]
        dist.all_gather(gathered, state)
        parts = [(s[:, :1], s[:, 1:2], s[:, 2:]) for s in gathered]
        _, l, acc = merge_softmax_states(parts)
        torch.save({"rank": rank, "world_size": world_size, "attention": acc / l, "key_rows": (lo_k, hi_k),
                    "local_attention": state[:, 2:] / state[:, 1:2]},
                   Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_context_parallel(cfg: DPConfig = DPConfig(), world_size: int = 2, timeout: float = 120.0,
                         start_method: str | None = None) -> list[dict]:
    """Context-parallel attention of one ``(attn_T, attn_D)`` problem over ``world_size`` processes.

    Each result dict has ``attention`` (the merged output, ``(attn_T, attn_D)``, the same on
    every rank), ``local_attention`` (attention over the rank's own key slice only) and
    ``key_rows`` (the rank's slice ``(lo, hi)``). Timeouts and errors as :func:`run_data_parallel`.
    """
    if isinstance(cfg, DPConfig) and isinstance(world_size, int) and world_size > cfg.attn_T:
        raise ValueError(f"world_size={world_size} is more than attn_T={cfg.attn_T} key rows")
    return _launch(_context_parallel_worker, cfg, world_size, timeout, start_method)


def ring_data(cfg: DPConfig, heads: int = 2):
    """Queries, keys, values ``(heads, attn_T, attn_D)`` of the ring-attention check (float64, seeded)."""
    g = torch.Generator().manual_seed(3000 + cfg.seed)
    return tuple(torch.randn(heads, cfg.attn_T, cfg.attn_D, generator=g, dtype=torch.float64) for _ in range(3))


def ring_attention(q, k, v, rank: int, world: int, causal: bool = True, chunks: int = 4):
    """Attention of this rank's queries over the whole sequence; no rank ever holds the whole sequence.

    The sequence is cut into ``world`` equal blocks of ``n`` positions; rank ``r`` holds block
    ``r`` of the queries, keys and values (``q, k, v (..., n, D)``). For ``world`` rounds it
    folds the key/value block it holds into its online-softmax state (chapter 17) and passes
    the block on to rank ``r + 1`` while receiving rank ``r - 1``'s. The passing goes in
    ``chunks`` pieces of ``n / chunks`` rows: a piece is sent once it has been used and the
    incoming piece takes its place, so a rank holds ``n + n / chunks`` key/value rows at most,
    fewer than the ``2 n`` of sending the block whole (which is the whole sequence when
    ``world = 2``). With ``causal``, blocks of later ranks are passed on unused and the own
    block gets the causal mask. Returns ``(Z, rows_held)``: the output rows of this rank's
    queries and the most key/value rows this rank held at once.
    """
    import torch.distributed as dist

    n = q.shape[-2]
    if n % chunks:
        raise ValueError(f"a block of {n} rows does not split into chunks={chunks} pieces")
    c = n // chunks
    scale = 1.0 / math.sqrt(q.shape[-1])
    m = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=q.dtype, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    kv = torch.cat([k, v], dim=-1)  # (..., n, D_K + D_V): the block this rank holds now
    incoming = torch.empty_like(kv[..., :c, :])  # one piece of the next block
    rows_held = kv.shape[-2] + incoming.shape[-2]
    i_q = torch.arange(n, device=q.device)[:, None]
    for step in range(world):
        src = (rank - step) % world  # the rank whose block this is
        for j in range(chunks):
            piece = kv[..., j * c:(j + 1) * c, :]
            if not (causal and src > rank):  # a later rank's block is entirely in the future
                kb, vb = piece[..., :k.shape[-1]], piece[..., k.shape[-1]:]
                S = (q @ kb.transpose(-1, -2)) * scale  # (..., n, c)
                if causal and src == rank:  # key position j * c + t may be seen by queries i >= it
                    S = S.masked_fill(torch.arange(j * c, (j + 1) * c, device=q.device)[None, :] > i_q, -math.inf)
                m_new = torch.maximum(m, S.amax(dim=-1, keepdim=True))
                m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows that saw nothing yet
                E = torch.exp(S - m_safe)
                alpha = torch.exp(m - m_safe)
                l = alpha * l + E.sum(dim=-1, keepdim=True)
                acc = alpha * acc + E @ vb
                m = m_new
            if step < world - 1:  # pass this piece on, take the previous rank's piece in its place
                reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, piece.contiguous(), (rank + 1) % world),
                                               dist.P2POp(dist.irecv, incoming, (rank - 1) % world)])
                for r in reqs:
                    r.wait()
                kv[..., j * c:(j + 1) * c, :] = incoming
    return acc / l, rows_held


def _ring_scheme(cfg: DPConfig, rank: int, world: int, device) -> dict:
    Q, K, V = ring_data(cfg)
    if cfg.attn_T % world:
        raise ValueError(f"attn_T={cfg.attn_T} does not split into world_size={world} blocks")
    n = cfg.attn_T // world
    lo, hi = rank * n, (rank + 1) * n
    q, k, v = (t[..., lo:hi, :].clone().to(device) for t in (Q, K, V))  # this rank's block only
    del Q, K, V
    Z, rows_held = ring_attention(q, k, v, rank, world, causal=True)
    Z_nc, _ = ring_attention(q, k, v, rank, world, causal=False)
    return {"Z": Z.cpu(), "Z_noncausal": Z_nc.cpu(), "rows": (lo, hi), "rows_held": rows_held}
