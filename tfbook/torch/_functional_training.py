"""PyTorch twins of :mod:`tfbook._numpy_training`, re-exported by :mod:`tfbook.torch.functional` (stub)."""

__all__: list[str] = []
