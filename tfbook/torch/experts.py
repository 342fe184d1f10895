"""Mixture-of-experts layers and low-rank adapters as ``nn.Module``s: chapter 19.

* :class:`MoE`: a router ``W_router (D, E)``, ``E`` SwiGLU experts, ``top_k`` experts per
  token, an optional shared expert and an optional capacity factor; ``forward`` is
  :func:`tfbook.torch.moe` and leaves the balance loss of the batch in ``aux_loss``, its
  router z-loss in ``z_loss`` (and, with ``record = True``, the routing in ``routing``); with
  ``router_bias=True`` it routes as DeepSeek-V3 (a per-expert bias, a buffer nudged by
  :meth:`MoE.update_bias`, chooses the experts; the gates stay the unbiased probabilities).
* :class:`MoELMConfig` and :class:`MoELM`: the Llama-style model of chapter 14 with a
  :class:`MoE` in place of every block's MLP; :meth:`MoELM.aux_loss` is the mean balance
  loss of its layers, which a training loss adds with a small coefficient; :meth:`MoELM.z_loss`
  the mean router z-loss; :meth:`MoELM.update_bias` one bias step of every layer.
* :class:`LoRALinear`: a frozen weight plus a trainable low-rank update
  (:func:`tfbook.torch.lora_linear`); :func:`add_lora` puts such an update on named weight
  matrices of any model (a parametrization: the weight the model reads is
  ``W + (alpha / r) A B``) and freezes everything else; :func:`merge_lora` folds the
  updates in and leaves a plain model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parametrize

from .. import _validate as V
from .functional import experts as FE
from .modern import LlamaLM, LlamaLMConfig, SwiGLU

__all__ = ["MoE", "MoELMConfig", "MoELM", "LoRALinear", "LoRAUpdate", "add_lora", "merge_lora", "lora_parameters"]


def _to_numpy(t):
    return None if t is None else t.detach().cpu().numpy()


class MoE(nn.Module):
    """A sparse mixture-of-experts MLP: ``Y = sum_j w_j expert_{e_j}(X) + shared(X)``.

    ``forward(X (..., D)) -> Y (..., D)``; after each call ``aux_loss`` holds the balance loss
    of that batch (:func:`tfbook.torch.load_balancing_loss`, differentiable through the router
    probabilities), ``z_loss`` its router z-loss (:func:`tfbook.torch.router_z_loss` of the
    logits ``X W_router``, differentiable; only when gradients are on, None otherwise, so that an
    evaluation pays for no extra product) and, when ``record`` is True, ``routing`` holds the
    routing dict of :func:`tfbook.torch.moe` (detached).

    ``router_bias=True`` adds the buffer ``bias (E,)`` (zeros at the start, never trained by
    gradients): the experts are chosen by ``probs + bias`` and gated by ``probs``
    (:func:`tfbook.torch.biased_top_k_router`); :meth:`update_bias` moves it by ``rate`` towards
    the experts the last training batch under-used (:func:`tfbook.torch.balance_bias_update`).
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, top_k: int = 2, shared_d_ff: int = 0,
                 capacity_factor: float | None = None, router_bias: bool = False):
        super().__init__()
        self.d_model = V.check_positive_int("d_model", d_model)
        self.d_ff = V.check_positive_int("d_ff", d_ff)
        self.num_experts = V.check_positive_int("num_experts", num_experts)
        self.top_k = V.check_positive_int("top_k", top_k)
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k={top_k} exceeds num_experts={num_experts}")
        self.shared_d_ff = V.check_positive_int("shared_d_ff", shared_d_ff, minimum=0)
        self.capacity_factor = FE._check_capacity_factor(capacity_factor)
        self.W_router = nn.Parameter(torch.empty(d_model, num_experts))  # (D, E)
        self.experts = nn.ModuleList(SwiGLU(d_model, d_ff) for _ in range(num_experts))
        self.shared = SwiGLU(d_model, shared_d_ff) if shared_d_ff else None
        self.aux_loss: torch.Tensor | None = None
        self.z_loss: torch.Tensor | None = None
        self.record = False
        self.routing: dict | None = None
        if not isinstance(router_bias, bool):
            raise ValueError(f"router_bias must be True or False, got {router_bias!r}")
        self.router_bias = router_bias
        self.register_buffer("bias", torch.zeros(num_experts) if router_bias else None)
        self._last_experts: torch.Tensor | None = None  # the last training batch's choices (for update_bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.W_router, std=0.02)  # a near-uniform router at the start

    def params(self) -> dict:
        return {"W_router": self.W_router, "experts": [e.params() for e in self.experts],
                "shared": None if self.shared is None else self.shared.params()}

    def numpy_params(self) -> dict:
        return {"W_router": _to_numpy(self.W_router), "experts": [e.numpy_params() for e in self.experts],
                "shared": None if self.shared is None else self.shared.numpy_params()}

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        Y, routing = FE.moe(X, self.params(), self.top_k, self.capacity_factor, bias=self.bias)
        self.aux_loss = FE.load_balancing_loss(routing["probs"], routing["experts"])
        # the z-loss costs one more router product: only where it can be trained (gradients on)
        self.z_loss = FE.router_z_loss(X @ self.W_router) if torch.is_grad_enabled() else None
        if self.bias is not None and self.training and torch.is_grad_enabled():
            self._last_experts = routing["experts"].detach()
        if self.record:
            self.routing = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in routing.items()}
        return Y

    @torch.no_grad()
    def update_bias(self, rate: float) -> None:
        """DeepSeek-V3's step ``bias += rate * sign(mean load - load)``, the load counted on the
        last forward pass in training mode with gradients on (a training batch, not an evaluation)."""
        if self.bias is None:
            raise ValueError("update_bias needs router_bias=True")
        if self._last_experts is None:
            raise ValueError("update_bias needs a training forward pass first")
        self.bias.copy_(FE.balance_bias_update(self.bias, self._last_experts, rate))
        self._last_experts = None

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, num_experts={self.num_experts}, top_k={self.top_k}, "
                f"shared_d_ff={self.shared_d_ff}, capacity_factor={self.capacity_factor}, "
                f"router_bias={self.router_bias}")


@dataclass(frozen=True)
class MoELMConfig(LlamaLMConfig):
    """A :class:`~tfbook.torch.modern.LlamaLMConfig` whose blocks have a :class:`MoE` MLP.

    ``d_ff`` is the width of each expert. Additional attributes: ``num_experts`` (E),
    ``top_k`` (k, experts per token), ``shared_d_ff`` (width of a shared expert, 0 for none),
    ``capacity_factor`` (None: dropless), ``router_bias`` (DeepSeek-V3's balancing bias in
    every layer, :class:`MoE`).
    """
    num_experts: int = 8  # E
    top_k: int = 2  # k experts per token
    shared_d_ff: int = 0  # width of the shared expert every token passes (0: none)
    capacity_factor: float | None = None  # None: every assignment computed (dropless)
    router_bias: bool = False  # True: a per-expert bias chooses the experts (DeepSeek-V3)

    def __post_init__(self):
        super().__post_init__()
        V.check_positive_int("num_experts", self.num_experts)
        V.check_positive_int("top_k", self.top_k)
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} exceeds num_experts={self.num_experts}")
        V.check_positive_int("shared_d_ff", self.shared_d_ff, minimum=0)
        FE._check_capacity_factor(self.capacity_factor)
        if not isinstance(self.router_bias, bool):
            raise ValueError(f"router_bias must be True or False, got {self.router_bias!r}")


class MoELM(LlamaLM):
    """:class:`~tfbook.torch.modern.LlamaLM` with a :class:`MoE` in place of each block's SwiGLU MLP."""

    def __init__(self, config: MoELMConfig):
        if not isinstance(config, MoELMConfig):
            raise ValueError(f"config must be a MoELMConfig, got {type(config).__name__}")
        super().__init__(config)
        c = config
        for block in self.blocks:
            block.mlp = MoE(c.d_model, c.d_ff, c.num_experts, c.top_k, c.shared_d_ff, c.capacity_factor,
                            router_bias=c.router_bias)

    def moe_layers(self) -> list:
        return [b.mlp for b in self.blocks]

    def aux_loss(self) -> torch.Tensor:
        """The mean balance loss of the layers, from the last forward pass."""
        losses = [m.aux_loss for m in self.moe_layers()]
        if any(x is None for x in losses):
            raise ValueError("aux_loss needs a forward pass first")
        return torch.stack(losses).mean()

    def z_loss(self) -> torch.Tensor:
        """The mean router z-loss of the layers, from the last forward pass."""
        losses = [m.z_loss for m in self.moe_layers()]
        if any(x is None for x in losses):
            raise ValueError("z_loss needs a forward pass with gradients on first")
        return torch.stack(losses).mean()

    def update_bias(self, rate: float) -> None:
        """One bias step (:meth:`MoE.update_bias`) in every layer (``router_bias=True`` only)."""
        for m in self.moe_layers():
            m.update_bias(rate)

    def record_routing(self, on: bool = True) -> None:
        """Keep (``on``) or stop keeping each layer's routing of the last forward pass."""
        for m in self.moe_layers():
            m.record, m.routing = bool(on), None


class LoRALinear(nn.Module):
    """``X W + (alpha / r) (X A) B`` with ``W (D_in, D_out)`` frozen and ``A (D_in, r)``,
    ``B (r, D_out)`` trained. ``A`` starts random (variance ``1 / D_in``), ``B`` at zero, so
    the adapted layer starts equal to ``W``. :meth:`merged` is ``W + (alpha / r) A B``."""

    def __init__(self, W: torch.Tensor, rank: int, alpha: float | None = None, generator=None):
        super().__init__()
        V.check_ndim("W", W, 2, 2, what="(D_in, D_out)")
        self.rank = r = V.check_positive_int("rank", rank)
        D_in, D_out = W.shape
        self.alpha = float(r if alpha is None else alpha)
        self.W = nn.Parameter(W.detach().clone(), requires_grad=False)  # (D_in, D_out), frozen
        self.A = nn.Parameter(torch.randn(D_in, r, generator=generator, dtype=W.dtype) / math.sqrt(D_in))
        self.B = nn.Parameter(torch.zeros(r, D_out, dtype=W.dtype))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return FE.lora_linear(X, self.W, self.A, self.B, self.alpha)

    def merged(self) -> torch.Tensor:
        return FE.lora_merge(self.W, self.A, self.B, self.alpha)

    def extra_repr(self) -> str:
        return f"D_in={self.W.shape[0]}, D_out={self.W.shape[1]}, rank={self.rank}, alpha={self.alpha}"


class LoRAUpdate(nn.Module):
    """The parametrization :func:`add_lora` registers: ``W -> W + (alpha / r) A B``."""

    def __init__(self, D_in: int, D_out: int, rank: int, alpha: float, generator=None, dtype=torch.float32):
        super().__init__()
        self.rank, self.alpha = rank, float(alpha)
        self.A = nn.Parameter(torch.randn(D_in, rank, generator=generator, dtype=dtype) / math.sqrt(D_in))
        self.B = nn.Parameter(torch.zeros(rank, D_out, dtype=dtype))

    def forward(self, W: torch.Tensor) -> torch.Tensor:
        return FE.lora_merge(W, self.A, self.B, self.alpha)


def add_lora(model: nn.Module, rank: int, alpha: float | None = None, names=("W_Q", "W_K", "W_V", "W_O"),
             seed: int = 0) -> list:
    """Freeze every parameter of ``model`` and add a trainable rank-``rank`` update to each
    2-D parameter whose name is in ``names`` (in every submodule); returns the updates'
    parameters (the ones to train). ``alpha`` defaults to ``rank`` (scale 1)."""
    r = V.check_positive_int("rank", rank)
    alpha = float(r if alpha is None else alpha)
    for p in model.parameters():
        p.requires_grad_(False)
    g = torch.Generator().manual_seed(int(seed))
    added = []
    for module in list(model.modules()):
        for name in names:
            W = module._parameters.get(name) if hasattr(module, "_parameters") else None
            if W is None or W.ndim != 2:
                continue
            if r > min(W.shape):
                raise ValueError(f"rank={r} exceeds min(D_in, D_out) of {name} {tuple(W.shape)}")
            upd = LoRAUpdate(W.shape[0], W.shape[1], r, alpha, generator=g, dtype=W.dtype)
            parametrize.register_parametrization(module, name, upd)
            added += [upd.A, upd.B]
    if not added:
        raise ValueError(f"no 2-D parameter named one of {tuple(names)} in the model")
    return added


def lora_parameters(model: nn.Module) -> list:
    """The ``A`` and ``B`` of every :class:`LoRAUpdate` in ``model``."""
    return [p for m in model.modules() if isinstance(m, LoRAUpdate) for p in (m.A, m.B)]


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every LoRA update into its weight (``W <- W + (alpha / r) A B``) and remove the
    parametrizations: a plain model of the original shape, as fast as the original."""
    for module in list(model.modules()):
        if parametrize.is_parametrized(module):
            for name in list(module.parametrizations.keys()):
                parametrize.remove_parametrizations(module, name, leave_parametrized=True)
    return model
