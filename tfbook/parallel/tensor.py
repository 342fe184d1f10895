"""Tensor parallelism: one transformer block split Megatron-style with DTensor's column/row styles."""

from __future__ import annotations

import torch

from ._report import _local
from .config import DPConfig

__all__ = ["MegatronBlock", "tp_plan", "tp_data"]


class MegatronBlock(torch.nn.Module):
    """A Pre-LN transformer block with ``nn.Linear`` projections (what DTensor's parallel styles shard).

    ``attn_q, attn_k, attn_v (D -> D)``, ``attn_o (D -> D)``, ``mlp_up (D -> 4D)``, ``mlp_down (4D -> D)``.
    The number of heads a rank computes is read off the width of its ``attn_q`` output, so the
    same code runs whole (all ``H`` heads) and column-sharded (``H / N_w`` heads per rank).
    """

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        D = d_model
        self.head_dim = D // num_heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.attn_q, self.attn_k, self.attn_v, self.attn_o = (torch.nn.Linear(D, D) for _ in range(4))
        self.mlp_up, self.mlp_down = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

    def forward(self, X):
        B, T, _ = X.shape
        Y = self.norm1(X)
        q, k, v = (lin(Y) for lin in (self.attn_q, self.attn_k, self.attn_v))  # (B, T, D or D / N_w)
        h = q.shape[-1] // self.head_dim  # the heads this rank holds
        q, k, v = (z.view(B, T, h, self.head_dim).transpose(1, 2) for z in (q, k, v))
        Z = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        X = X + self.attn_o(Z.transpose(1, 2).reshape(B, T, h * self.head_dim))
        return X + self.mlp_down(torch.nn.functional.gelu(self.mlp_up(self.norm2(X))))


def tp_plan():
    """Megatron's split as DTensor styles: Q, K, V and the MLP's first layer by columns (whole
    heads, whole hidden units per rank), the output projections by rows (their sum is all-reduced)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"attn_q": ColwiseParallel(), "attn_k": ColwiseParallel(), "attn_v": ColwiseParallel(),
            "attn_o": RowwiseParallel(), "mlp_up": ColwiseParallel(), "mlp_down": RowwiseParallel()}


def tp_data(cfg: DPConfig):
    """The tensor-parallel check's block (float64, seeded) and input ``(2, block_size, d_model)``."""
    torch.manual_seed(cfg.seed + 7)
    block = MegatronBlock(cfg.d_model, cfg.num_heads).double()
    X = torch.randn(2, cfg.block_size, cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    return block, X


def _tp_scheme(cfg: DPConfig, rank: int, world: int, device) -> dict:
    """Tensor parallelism: one block split Megatron-style over the ranks; outputs, gradients, collectives."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(device.type, (world,))
    block, X = tp_data(cfg)
    block, X = block.to(device), X.to(device).requires_grad_(True)
    parallelize_module(block, mesh, tp_plan())
    G = torch.randn((2, cfg.block_size, cfg.d_model), dtype=torch.float64,
                    generator=torch.Generator().manual_seed(9)).to(device)  # dL/dY of a random linear loss
    comm = CommDebugMode()  # counts the collectives DTensor issues
    with comm:
        Y = block(X)
        fwd = {str(k): v for k, v in comm.get_comm_counts().items()}
        Y.backward(G)
        total = {str(k): v for k, v in comm.get_comm_counts().items()}
    bwd = {k: v - fwd.get(k, 0) for k, v in total.items() if v - fwd.get(k, 0)}
    return {"Y": Y.detach().cpu(), "dX": X.grad.detach().cpu(),
            "grads": {n: p.grad.full_tensor().detach().cpu() if hasattr(p.grad, "full_tensor") else p.grad.detach().cpu()
                      for n, p in block.named_parameters()},
            "local_numel": {n: _local(p).numel() for n, p in block.named_parameters()},
            "comm_forward": fwd, "comm_backward": bwd}
