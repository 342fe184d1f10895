"""The memory of training, counted and measured (chapter 10).

A training step holds four kinds of tensors at once: the parameters, their gradients, the
optimiser's state (AdamW: two moments per parameter) and the *activations* that autograd
saves during the forward pass for the backward pass. The first three are fixed multiples of
the parameter count; the last grows with the batch and the length, and is what activation
checkpointing trades for a second forward pass.

- :func:`state_bytes`: parameters, gradients and AdamW state, from the parameter count.
- :func:`decoder_lm_activation_bytes`: the tensors autograd saves in one training step of
  :class:`~tfbook.torch.models.DecoderLM` (Pre-LN, tied or untied, fused attention), layer by
  layer, each term named; with ``checkpoint=True``, what
  :func:`forward_checkpointed` keeps instead.
- :func:`saved_tensor_bytes`: the same, measured: every tensor autograd saves, seen through
  ``torch.autograd.graph.saved_tensors_hooks`` and counted once per storage (views and
  parameters excluded). Exact, and the same on every machine.
- :func:`profiled_peak_bytes`: the most memory PyTorch's CPU allocator held at once during a
  call, read from ``torch.profiler``'s memory events.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .cost import dtype_bytes

__all__ = ["state_bytes", "decoder_lm_activation_bytes", "saved_tensor_bytes", "profiled_peak_bytes",
           "forward_checkpointed"]


def state_bytes(n_params: int, dtype="float32", optimizer: str = "adamw") -> dict:
    """Bytes of parameters, gradients and optimiser state for ``n_params`` numbers of ``dtype``.

    AdamW keeps two moments (``m``, ``v``) per parameter, SGD with momentum one, plain SGD none
    (the step counter is one scalar per tensor and left out)."""
    if not isinstance(n_params, int) or n_params < 0:
        raise ValueError(f"n_params must be a non-negative int, got {n_params!r}")
    moments = {"adamw": 2, "adam": 2, "sgd_momentum": 1, "sgd": 0}
    if optimizer not in moments:
        raise ValueError(f"optimizer must be one of {sorted(moments)}, got {optimizer!r}")
    b = dtype_bytes(dtype)
    out = {"parameters": n_params * b, "gradients": n_params * b, "optimizer": moments[optimizer] * n_params * b}
    out["total"] = sum(out.values())
    return out


def decoder_lm_activation_bytes(B: int, T: int, D: int, H: int, D_ff: int, L: int, V: int,
                                checkpoint: bool = False, dtype="float32") -> dict:
    """The bytes autograd saves in one forward pass of ``DecoderLM`` + cross-entropy.

    Per layer (Pre-LN block, fused attention, elements):

    - ``8 B T D``: the block input and the residual stream after attention (LayerNorm's
      inputs), the two LayerNorm outputs (inputs of the QKV and first MLP products), ``Q, K, V``
      (one ``3D``-wide product, ``3 B T D``), and the attention output ``Z`` (input of ``W_O``);
    - ``2 B T D_ff``: the MLP's pre-activation (the activation's derivative needs it) and its
      output (input of ``W_2``);
    - ``4 B T``: mean and reciprocal standard deviation of the two LayerNorms;
    - ``B H T``: the fused attention kernel's log-sum-exp per row (it recomputes ``P`` in the
      backward pass instead of storing ``H T^2``);
    - ``3 D^2``: the concatenated ``[W_Q W_K W_V]``, a new tensor that its product saves.

    The head: the final LayerNorm's input, output and statistics (``2 B T D + 2 B T``), the log-
    softmax over the vocabulary (``B T V``), and the token ids and targets (``2 B T`` int64)
    plus the loss (one element). With ``checkpoint=True`` a layer keeps only its input
    (``B T D``), and the boolean causal mask (``T^2`` bytes) is kept once; the activations are
    recomputed, one layer at a time, during the backward pass (``recomputed_layer``).
    Returns ``{"per_layer", "layers", "head", "total"}`` in bytes.
    """
    for name, v in dict(B=B, T=T, D=D, H=H, D_ff=D_ff, L=L, V=V).items():
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    b = dtype_bytes(dtype)
    full = (8 * B * T * D + 2 * B * T * D_ff + 4 * B * T + B * H * T + 3 * D * D) * b
    per_layer = B * T * D * b if checkpoint else full
    head = (2 * B * T * D + 2 * B * T + B * T * V) * b + 2 * B * T * 8 + b
    if checkpoint:
        head += T * T  # the boolean causal mask, an input of every checkpointed block, saved once
    out = {"per_layer": per_layer, "layers": L * per_layer, "head": head, "recomputed_layer": full}
    out["total"] = out["layers"] + out["head"]
    return out


def saved_tensor_bytes(fn: Callable[[], Any], exclude=()) -> tuple[Any, int]:
    """Run ``fn()`` (a forward pass and its loss) and count the bytes autograd saves for the
    backward pass: each saved tensor once per storage (a view shares its base's), the tensors
    of ``exclude`` (pass the model's parameters: they exist anyway) left out.

    The count goes through ``torch.autograd.graph.saved_tensors_hooks``, which changes nothing
    in the computation (no module hooks, which would change the path some models take). It is
    exact, and the same on every machine that runs the same operators.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            seen.setdefault(s.data_ptr(), s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    return result, sum(seen.values())


def profiled_peak_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """Call ``fn()`` under ``torch.profiler`` with memory profiling; return ``(result, peak)``:
    the most bytes PyTorch's CPU allocator held at once beyond what it held before the call
    (tensors that existed before, such as the parameters, are not counted). Allocations are
    summed in time order from each event's own (self) memory, so peaks inside one operator
    (a kernel's scratch space) are seen at the operator's granularity."""
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    held = peak = 0
    for e in events:
        held += e.self_cpu_memory_usage
        peak = max(peak, held)
    return result, peak


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (the profiler's C++ start/stop lines, with timestamps, would
    otherwise reach a notebook's output); Python's own ``sys.stderr`` is left alone."""
    try:
        fd = sys.__stderr__.fileno()
    except (AttributeError, ValueError, OSError):  # no real stderr: nothing to silence
        yield
        return
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def forward_checkpointed(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """``model(idx)`` for a :class:`~tfbook.torch.models.DecoderLM`, each block run under
    ``torch.utils.checkpoint`` (non-reentrant): the forward pass keeps only each block's
    input, and the backward pass runs each block again to get its activations back. Same
    logits, same gradients, less memory, one more forward pass of the blocks."""
    from .torch import functional as Fn
    from .torch.models import _causal_block

    T = idx.shape[1]
    if T > model.config.block_size:
        raise ValueError(f"idx has T={T} > block_size={model.config.block_size} (idx: {tuple(idx.shape)})")
    X = model._embed(idx, offset=0)
    mask = Fn.causal_mask(T, device=idx.device)
    for block in model.blocks:
        X = checkpoint(_causal_block, block, X, mask, use_reentrant=False)
    return model._unembed(X)
