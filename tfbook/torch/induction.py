"""The attention-only transformer of chapter 21 as an ``nn.Module``.

:class:`AttnOnlyLM` holds the parameters of :func:`tfbook.torch.functional.induction.attn_only_forward`
(token embeddings in the residual stream, learned position embeddings added to the input of
every query and key, as in Press et al. 2021's position-infused attention; ``num_layers`` layers of ``num_heads`` causal heads, no
MLP, no LayerNorm, no biases, an unembedding) and runs that function, so the module, the
PyTorch function and the NumPy function (:func:`tfbook.numpy.induction.attn_only_forward`,
fed :meth:`AttnOnlyLM.numpy_params`) are one computation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import _validate as V
from .functional import induction as FI

__all__ = ["AttnOnlyConfig", "AttnOnlyLM"]


@dataclass
class AttnOnlyConfig:
    """Vocabulary ``V``, longest context ``block_size``, width ``D = d_model``, heads per layer, layers."""

    vocab_size: int = 64
    block_size: int = 64
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2

    def __post_init__(self):
        for n in ("vocab_size", "block_size", "d_model", "num_heads", "num_layers"):
            V.check_positive_int(n, getattr(self, n))
        V.check_heads(self.d_model, self.num_heads, (self.d_model,), name="d_model")


class AttnOnlyLM(nn.Module):
    """An attention-only transformer: ``logits = (W_E[ids] + sum of head outputs) W_U``, positions in the queries and keys."""

    def __init__(self, config: AttnOnlyConfig):
        super().__init__()
        self.config = c = config
        D, H, dk = c.d_model, c.num_heads, c.d_model // c.num_heads
        self.W_E = nn.Parameter(torch.empty(c.vocab_size, D))
        self.W_pos = nn.Parameter(torch.empty(c.block_size, D))
        self.W_U = nn.Parameter(torch.empty(D, c.vocab_size))
        self.layers = nn.ModuleList()
        for _ in range(c.num_layers):
            layer = nn.ParameterDict({k: nn.Parameter(torch.empty(H, D, dk)) for k in ("W_Q", "W_K", "W_V")})
            layer["W_O"] = nn.Parameter(torch.empty(H, dk, D))
            self.layers.append(layer)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, 1) embeddings and normal(0, 1 / fan_in) matrices (each map keeps the scale of
        its input: with no LayerNorm, GPT-2's 0.02 leaves every pattern uniform for thousands of steps)."""
        for name, p in self.named_parameters():
            fan_in = 1 if name in ("W_E", "W_pos") else p.shape[-2]
            nn.init.normal_(p, std=fan_in ** -0.5)

    def params(self) -> dict:
        """The parameter dict :func:`attn_only_forward` takes (the module's own tensors)."""
        return {"W_E": self.W_E, "W_pos": self.W_pos, "W_U": self.W_U,
                "layers": [{k: layer[k] for k in ("W_Q", "W_K", "W_V", "W_O")} for layer in self.layers]}

    def numpy_params(self) -> dict:
        """The same dict as float64 NumPy arrays, for :func:`tfbook.numpy.induction.attn_only_forward`."""
        f = lambda t: t.detach().cpu().double().numpy().copy()  # noqa: E731  (a copy, never a view of the parameter)
        p = self.params()
        return {"W_E": f(p["W_E"]), "W_pos": f(p["W_pos"]), "W_U": f(p["W_U"]),
                "layers": [{k: f(v) for k, v in layer.items()} for layer in p["layers"]]}

    def forward(self, ids: torch.Tensor, ablate=None, return_attention: bool = False, return_outputs: bool = False):
        """Logits ``(B, T, V)`` (and the patterns, the head outputs); ``ablate`` as in the function."""
        params = self.params()
        if ablate:
            dt = self.W_E.dtype
            ablate = {k: None if v is None else torch.as_tensor(v, dtype=dt) for k, v in ablate.items()}
        return FI.attn_only_forward(params, ids, ablate=ablate, return_attention=return_attention,
                                    return_outputs=return_outputs)

    def extra_repr(self) -> str:
        c = self.config
        return f"V={c.vocab_size}, T={c.block_size}, D={c.d_model}, H={c.num_heads}, L={c.num_layers}"
