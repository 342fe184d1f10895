"""Expert parallelism: a mixture-of-experts layer whose experts are split over the ranks, tokens
sent to their experts' ranks with ``all_to_all_single`` and back.

Every rank holds the router (replicated) and ``E / world`` of the ``E`` experts (rank ``r``
the experts ``r E / world .. (r + 1) E / world - 1``), and its shard of the tokens. One layer
call (:func:`expert_parallel_moe`):

1. route locally: ``weights, experts = top_k_router(X, W_router, k)``, ``(n, k)`` each;
2. sort the ``n k`` assignments by expert (:func:`dispatch_plan`): the rows for rank 0's
   experts first, then rank 1's, ...; each expert's rows together, in token order;
3. exchange the counts (``all_to_all_single`` of the ``(world, E / world)`` table of how many
   rows this rank sends to each expert), so each rank knows how many rows it receives, from
   whom, for which of its experts;
4. dispatch the rows (``all_to_all_single`` with those split sizes), run each local expert
   on its rows, send the outputs back the same way with the split sizes swapped (combine);
5. weight each returned row by its gate and add it into its token's row (``index_add``).

The exchange is differentiable (:class:`_AllToAll`: the backward of an all-to-all is the
all-to-all with send and receive sizes swapped), so the gradient of each expert reaches the
rank holding it from every rank's tokens; the router's gradient is summed over the ranks
(``all_reduce``), as data parallelism does. Dropless (no capacity factor): every assignment
is computed, as :class:`tfbook.torch.experts.MoE` with ``capacity_factor=None``, which is the
one-process reference (:func:`single_process_moe`). ``_expert_scheme`` is the scheme
``"expert"`` of :mod:`~tfbook.parallel.torchrun`.
"""

from __future__ import annotations

import torch

from ..torch.experts import MoE
from ..torch.functional import experts as FE
from ..torch.functional.modern import swiglu
from .config import DPConfig, shard

__all__ = ["NUM_EXPERTS", "TOP_K", "make_moe", "moe_data", "expert_owner", "dispatch_plan",
           "expert_parallel_moe", "single_process_moe"]

NUM_EXPERTS = 4  # E, split over the ranks
TOP_K = 2  # experts per token


def make_moe(cfg: DPConfig, num_experts: int = NUM_EXPERTS, top_k: int = TOP_K) -> MoE:
    """The float64 :class:`~tfbook.torch.experts.MoE` (``d_model``, ``d_ff`` of ``cfg``), seeded by
    ``cfg.seed``: the same on every rank. The router is drawn with std 1 (not MoE's 0.02), so
    that the routing is far from uniform and the ranks receive unequal loads."""
    torch.manual_seed(cfg.seed)
    moe = MoE(cfg.d_model, cfg.d_ff, num_experts, top_k).double()
    with torch.no_grad():
        moe.W_router.normal_(0.0, 1.0)
    return moe


def moe_data(cfg: DPConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X, G)``, both ``(batch_size * block_size, d_model)`` float64, seeded: the tokens and the
    upstream gradient; the loss is ``(Y * G).sum()`` so that ``dL/dY = G``."""
    g = torch.Generator().manual_seed(2000 + cfg.seed)
    N = cfg.batch_size * cfg.block_size
    X = torch.randn(N, cfg.d_model, generator=g, dtype=torch.float64)
    G = torch.randn(N, cfg.d_model, generator=g, dtype=torch.float64)
    return X, G


def expert_owner(num_experts: int, world: int) -> torch.Tensor:
    """``(E,)`` int64: the rank holding each expert (contiguous blocks of ``E / world``)."""
    if not (isinstance(world, int) and world >= 1) or num_experts % world:
        raise ValueError(f"world={world!r} must be a positive int dividing num_experts={num_experts}")
    return torch.arange(num_experts) // (num_experts // world)


def dispatch_plan(experts: torch.Tensor, num_experts: int, world: int):
    """``(order (n k,), counts (E,))`` for the assignments ``experts (n, k)`` of one rank.

    ``order`` lists the flat assignment indices (``i = token * k + choice``) sorted by expert,
    stable (token order within an expert); since experts are held in contiguous blocks, it
    is also sorted by destination rank. ``counts[e]`` is the number of rows sent to expert ``e``.
    """
    if experts.ndim != 2:
        raise ValueError(f"experts must be (n, k), got shape {tuple(experts.shape)}")
    expert_owner(num_experts, world)
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return order, counts


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of the rows of ``x``: ``send[j]`` rows to rank ``j``, ``recv[j]`` from it.
    The backward sends the gradients back: the same exchange with the sizes swapped."""

    @staticmethod
    def forward(ctx, x, send, recv):
        import torch.distributed as dist

        ctx.send, ctx.recv = send, recv
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send)
        return out

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist

        out = grad.new_empty((sum(ctx.send),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=ctx.send, input_split_sizes=ctx.recv)
        return out, None, None


def expert_parallel_moe(X: torch.Tensor, moe: MoE, rank: int, world: int):
    """The layer on this rank's tokens ``X (n, D)`` with only this rank's experts computed here.

    Returns ``(Y (n, D), info)``; ``info`` holds the per-expert counts this rank sent
    (``sent (E,)``) and received (``received (world, E / world)``: row ``j`` from rank ``j``)
    and the bytes this rank sent to other ranks in the forward pass: ``count_bytes`` (the
    counts), ``dispatch_bytes`` (token rows), ``combine_bytes`` (output rows). The backward
    pass sends as many bytes again as dispatch and combine (the gradients of both exchanges).
    Needs the process group; the experts of other ranks are not used.
    """
    import torch.distributed as dist

    E, k = moe.num_experts, moe.top_k
    if moe.capacity_factor is not None or moe.shared is not None:
        raise ValueError("expert_parallel_moe computes the dropless layer without a shared expert "
                         f"(capacity_factor={moe.capacity_factor}, shared_d_ff={moe.shared_d_ff})")
    expert_owner(E, world)  # checks that world divides E
    E_local = E // world
    weights, experts, _ = FE.top_k_router(X, moe.W_router, k)  # (n, k) each
    order, counts = dispatch_plan(experts, E, world)
    # 1. the counts: how many rows this rank sends to each expert, as a (world, E_local) table
    recv_counts = torch.empty(world * E_local, dtype=torch.int64, device=X.device)
    dist.all_to_all_single(recv_counts, counts.to(torch.int64).contiguous())  # equal splits: E_local each
    recv_counts = recv_counts.reshape(world, E_local)  # row j: what rank j sends to each of my experts
    send = [int(c) for c in counts.reshape(world, E_local).sum(dim=1)]
    recv = [int(c) for c in recv_counts.sum(dim=1)]
    # 2. dispatch: the token rows, sorted by expert (so by destination rank)
    tokens = order // k  # the token of each sorted assignment
    rows = _AllToAll.apply(X[tokens], send, recv)  # (sum recv, D)
    # 3. the local experts on their rows: received rows are by source rank, then by expert
    local = torch.arange(E_local, device=X.device).repeat(world)  # the local expert of each (source, expert) block
    which = torch.repeat_interleave(local, recv_counts.reshape(-1))  # (sum recv,)
    out = torch.zeros_like(rows)
    for j in range(E_local):
        idx = torch.nonzero(which == j, as_tuple=True)[0]
        if idx.numel():
            out = out.index_copy(0, idx, swiglu(rows[idx], moe.experts[rank * E_local + j].params()))
    # 4. combine: the outputs back to the ranks they came from, in the order they were sent
    back = _AllToAll.apply(out, recv, send)  # (n k, D), in ``order``
    gate = weights.reshape(-1)[order]  # (n k,)
    Y = torch.zeros_like(X).index_add(0, tokens, gate[:, None] * back)
    row_bytes = X.shape[1] * X.element_size()
    info = {"sent": counts.cpu(), "received": recv_counts.cpu(),
            "count_bytes": (world - 1) * E_local * 8,
            "dispatch_bytes": (sum(send) - send[rank]) * row_bytes,
            "combine_bytes": (sum(recv) - recv[rank]) * row_bytes}
    return Y, info


def single_process_moe(cfg: DPConfig) -> dict:
    """The reference: the whole layer in one process on all tokens; ``Y``, ``dX`` and every
    parameter's gradient of ``(Y * G).sum()``."""
    moe = make_moe(cfg)
    X, G = moe_data(cfg)
    X = X.clone().requires_grad_(True)
    Y = moe(X)
    (Y * G).sum().backward()
    return {"Y": Y.detach(), "dX": X.grad.detach(),
            "grads": {n: p.grad.detach().clone() for n, p in moe.named_parameters()}}


def _expert_scheme(cfg: DPConfig, rank: int, world: int, device) -> dict:
    """Expert parallelism on ``world`` ranks (gloo on the CPU, NCCL on GPUs): this rank's rows of
    ``Y`` and ``dX``, the gradients it holds (the router's summed over ranks, its own experts'),
    what it sent and received, and the bytes."""
    import torch.distributed as dist

    moe = make_moe(cfg).to(device)
    X, G = moe_data(cfg)
    X = shard(X, rank, world).to(device, copy=True).requires_grad_(True)
    G = shard(G, rank, world).to(device)
    Y, info = expert_parallel_moe(X, moe, rank, world)
    (Y * G).sum().backward()
    dist.all_reduce(moe.W_router.grad)  # the replicated router: sum its gradient over the ranks
    E_local = moe.num_experts // world
    held = {"W_router"} | {f"experts.{e}." for e in range(rank * E_local, (rank + 1) * E_local)}
    grads = {n: p.grad.detach().cpu() for n, p in moe.named_parameters()
             if n in held or any(n.startswith(h) for h in held if h.endswith("."))}
    return {"Y": Y.detach().cpu(), "dX": X.grad.detach().cpu(), "grads": grads,
            "experts_held": list(range(rank * E_local, (rank + 1) * E_local)),
            "none_elsewhere": all(p.grad is None for n, p in moe.named_parameters() if n not in grads),
            **info}
