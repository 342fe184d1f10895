"""The in-context regressor of chapter 22 as an ``nn.Module``: a small decoder-only transformer
that reads a prompt of ``(x, y)`` examples and predicts each ``y_i`` from ``x_i`` and the
examples before it (Garg et al. 2022, "What can transformers learn in context?").

* :class:`InContextConfig`: its sizes (frozen; checked when created);
* :class:`InContextRegressor`: the tokens of :func:`tfbook.torch.functional.incontext.interleave`
  (``x_1, (y_1, 0, ..., 0), x_2, ...``) read in by one linear map ``W_in (d, D)`` plus a bias,
  a learned position table, ``num_layers`` Pre-LN :class:`~tfbook.torch.modules.EncoderBlock`\\ s
  under a causal mask (the book's decoder-only block, as in
  :class:`~tfbook.torch.models.DecoderLM`), a final LayerNorm, and a read-out ``w_out (D,)``
  plus a bias giving one number at every ``x`` token: ``forward(X (B, K, d), y (B, K)) ->
  (B, K)``, entry ``i`` computed from ``x_0..x_i`` and ``y_0..y_{i-1}`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import _validate as V
from .functional import incontext as FI
from .functional.attention import causal_mask
from .models import _causal_block
from .modules import EncoderBlock, LayerNorm, LearnedPositionalEmbedding

__all__ = ["InContextConfig", "InContextRegressor"]


@dataclass(frozen=True)
class InContextConfig:
    """The sizes of an :class:`InContextRegressor`.

    Attributes
    ----------
    d : int
        Dimension of the inputs ``x``.
    n_points : int
        K, the most examples in one prompt (the position table has ``2 K`` rows).
    d_model, num_heads, num_layers, d_ff : int
        D, H, blocks and MLP width of the transformer (Pre-LN, GELU).
    """
    d: int = 5
    n_points: int = 15
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 4
    d_ff: int = 128

    def __post_init__(self):
        for name in ("d", "n_points", "d_model", "num_heads", "num_layers", "d_ff"):
            V.check_positive_int(name, getattr(self, name))
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}")


class InContextRegressor(nn.Module):
    """``forward(X (B, K, d), y (B, K)) -> (B, K)``: the prediction of ``y_i`` at token ``x_i``.

    ``y_i`` itself is never seen by the prediction at ``x_i`` (the token ``(y_i, 0, ...)``
    comes after ``x_i``, and attention is causal); changing ``y_i`` changes only later outputs.
    """

    def __init__(self, config: InContextConfig):
        super().__init__()
        self.config = c = config
        D = c.d_model
        self.W_in = nn.Parameter(torch.randn(c.d, D) / c.d ** 0.5)  # (d, D)
        self.b_in = nn.Parameter(torch.zeros(D))
        self.pos = LearnedPositionalEmbedding(2 * c.n_points, D)
        self.blocks = nn.ModuleList(EncoderBlock(D, c.num_heads, c.d_ff, norm_first=True, activation="gelu")
                                    for _ in range(c.num_layers))
        self.norm = LayerNorm(D)
        self.w_out = nn.Parameter(torch.randn(D) / D ** 0.5)  # (D,)
        self.b_out = nn.Parameter(torch.zeros(()))

    def forward(self, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        c = self.config
        Z = FI.interleave(X, y)  # (B, 2K, d), checks the shapes of X and y
        if Z.shape[-1] != c.d:
            raise ValueError(f"X must have d={c.d} features, got X {tuple(X.shape)}")
        if Z.shape[-2] > 2 * c.n_points:
            raise ValueError(f"X has K={X.shape[-2]} > n_points={c.n_points} examples (X: {tuple(X.shape)})")
        H = self.pos(Z.to(self.W_in.dtype) @ self.W_in + self.b_in)  # (B, 2K, D)
        mask = causal_mask(H.shape[-2], device=H.device)
        for block in self.blocks:
            H = _causal_block(block, H, mask)
        return self.norm(H[..., 0::2, :]) @ self.w_out + self.b_out  # (B, K): at the x tokens
