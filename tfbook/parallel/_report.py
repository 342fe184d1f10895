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
    a context that counts nothing; ``_counts`` reads its calls, ``_bytes`` the bytes they carried."""
    import contextlib

    from torch.distributed.tensor.debug import CommDebugMode

    class _CommBytes(CommDebugMode):
        """CommDebugMode that also sums, per collective, the bytes of the whole tensor it works on: the
        tensor(s) all-reduced or broadcast, an all-gather's output, a reduce-scatter's input."""

        def __init__(self):
            super().__init__()
            self.comm_bytes = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(getattr(func, "_overloadpacket", ""))
            if name.startswith("c10d.") and args:
                def size(a):
                    ts = a if isinstance(a, (list, tuple)) else [a]
                    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))
                whole = max(size(args[0]), size(args[1]) if len(args) > 1 else 0)
                self.comm_bytes[name] = self.comm_bytes.get(name, 0) + whole
            return super().__torch_dispatch__(func, types, args, kwargs)

    return _CommBytes() if last else contextlib.nullcontext()


def _counts(mode) -> dict:
    """``{collective: calls}`` that a ``CommDebugMode`` counted (``c10d.allreduce_``, ``c10d.broadcast_``, ...)."""
    return {str(k): v for k, v in mode.get_comm_counts().items() if v}


def _bytes(mode) -> dict:
    """``{collective: bytes}``: the whole tensors the counted collectives worked on, summed (see ``_collectives``)."""
    return {k: v for k, v in mode.comm_bytes.items() if v}


def _optimizer_state_bytes(opt) -> int:
    return _tensor_bytes(_local(v) for st in opt.state.values() for v in st.values())
