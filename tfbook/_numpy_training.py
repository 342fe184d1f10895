"""NumPy components of the training chapter, re-exported by :mod:`tfbook.numpy` (stub)."""

__all__: list[str] = []
