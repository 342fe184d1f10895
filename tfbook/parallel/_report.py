"""What a rank reports about itself: the collectives it issued and the bytes it holds."""

from __future__ import annotations

import torch


def _tensor_bytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor) and t.dim() > 0)


def _local(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this rank stores: a DTensor's local shard, else ``t`` itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole of ``t``: a DTensor gathered from every rank, else ``t`` itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _collectives(last: bool):
    """A ``CommDebugMode`` (it counts every collective issued while it is active) on the last step, else
    a context that counts nothing; ``_counts`` reads it."""
    import contextlib

    from torch.distributed.tensor.debug import CommDebugMode

    return CommDebugMode() if last else contextlib.nullcontext()


def _counts(mode) -> dict:
    """``{collective: calls}`` that a ``CommDebugMode`` counted (``c10d.allreduce_``, ``c10d.broadcast_``, ...)."""
    return {str(k): v for k, v in mode.get_comm_counts().items() if v}


def _optimizer_state_bytes(opt) -> int:
    return _tensor_bytes(_local(v) for st in opt.state.values() for v in st.values())
