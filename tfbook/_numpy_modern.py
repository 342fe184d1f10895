"""NumPy components of the modern chapter, re-exported by :mod:`tfbook.numpy` (stub)."""

__all__: list[str] = []
