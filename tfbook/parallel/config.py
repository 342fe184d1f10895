"""The shared ground of chapter 18's parallel runs: the config, the model, the data, the shard.

Every rank of every engine builds the same float64 model from :class:`DPConfig` (:func:`make_model`),
draws the same global batches (:func:`make_batches`) and takes its rows of them (:func:`shard`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DPConfig", "make_model", "make_batches", "shard"]


@dataclass(frozen=True)
class DPConfig:
    """A tiny decoder-only LM and its training run (float64, plain SGD)."""

    vocab_size: int = 13  # token ids 0..12
    block_size: int = 12  # T of every training window
    d_model: int = 16  # D
    num_heads: int = 2  # H
    num_layers: int = 2  # blocks
    d_ff: int = 32  # MLP hidden width
    batch_size: int = 8  # the GLOBAL batch; every rank gets batch_size / world_size rows
    steps: int = 4  # SGD steps
    lr: float = 0.2  # SGD learning rate
    seed: int = 0  # model init and data
    attn_T: int = 24  # context-parallel attention: sequence length
    attn_D: int = 8  # context-parallel attention: D_K = D_V

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "d_model", "num_heads", "num_layers", "d_ff",
                     "batch_size", "steps", "seed", "attn_T", "attn_D"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "seed" else 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr!r}")


def make_model(cfg: DPConfig):
    """The float64 DecoderLM of ``cfg``, initialised from ``cfg.seed`` (identical on every rank)."""
    from ..torch.models import DecoderLM, DecoderLMConfig

    torch.manual_seed(cfg.seed)
    lm_cfg = DecoderLMConfig(vocab_size=cfg.vocab_size, block_size=cfg.block_size, d_model=cfg.d_model,
                             num_heads=cfg.num_heads, num_layers=cfg.num_layers, d_ff=cfg.d_ff)
    return DecoderLM(lm_cfg).double()


def make_batches(cfg: DPConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``cfg.steps`` global batches ``(x, y)``, each ``(batch_size, block_size)`` int64, seeded by
    ``cfg.seed`` (the same on every rank).

    Each row counts modulo ``vocab_size`` from a random start with a random stride of 1, 2
    or 3, so there is something to learn: the next token follows from the previous two.
    """
    g = torch.Generator().manual_seed(1000 + cfg.seed)
    k = torch.arange(cfg.block_size + 1)
    out = []
    for _ in range(cfg.steps):
        start = torch.randint(0, cfg.vocab_size, (cfg.batch_size, 1), generator=g)
        stride = torch.randint(1, 4, (cfg.batch_size, 1), generator=g)
        w = (start + stride * k) % cfg.vocab_size  # (B, T + 1)
        out.append((w[:, :-1], w[:, 1:]))
    return out


def shard(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rows ``rank * n .. (rank + 1) * n - 1`` of ``x``, ``n = len(x) / world_size`` (must divide)."""
    if not (isinstance(world_size, int) and world_size >= 1):
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if not (isinstance(rank, int) and 0 <= rank < world_size):
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank!r}")
    if x.shape[0] % world_size:
        raise ValueError(f"the batch of {x.shape[0]} rows (x: {tuple(x.shape)}) does not split evenly "
                         f"into world_size={world_size} shards")
    n = x.shape[0] // world_size
    return x[rank * n:(rank + 1) * n]


def _loss(model, x, y):
    from ..torch.models import lm_loss

    return lm_loss(model, x, y)


def _sgd_step(model, lr: float) -> None:
    """Plain SGD, ``p <- p - lr * grad`` (by hand: importing ``torch.optim`` costs seconds)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-lr)
