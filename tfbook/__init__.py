"""tfbook: the support package of *Transformers, Derived and Checked*.

Every transformer component is implemented twice, with the same names and
arguments:

* :mod:`tfbook.numpy` -- NumPy reference implementations (plain functions,
  explicit parameter dicts, no hidden state);
* :mod:`tfbook.torch` -- the same functions for ``torch.Tensor`` (autograd, any
  device) plus ``nn.Module`` classes and small models for training.

Notation (the same in the text, the code and the tests)
-------------------------------------------------------
=========  ==============================================================
symbol     meaning
=========  ==============================================================
``X``      a sequence of token vectors, shape ``(..., T, D)`` (row vectors)
``...``    any number of leading batch axes (batch ``B``, heads ``H``)
``T``      sequence length (``T_q`` queries, ``T_k`` keys/values)
``D``      model width; ``D_K`` query/key width; ``D_V`` value width
``H``      number of heads, ``D_K = D_V = D / H`` in multi-head attention
``D_ff``   hidden width of the position-wise MLP (usually ``4 D``)
``W_Q``    projection ``(D, D_K)``, so ``Q = X @ W_Q`` (likewise K, V, O)
``S``      scores ``Q K^T * scale``, shape ``(..., T_q, T_k)``
``P``      attention weights ``softmax(S)``, rows sum to one
``Z``      attention output ``P V``, shape ``(..., T_q, D_V)``
mask       boolean, ``True`` means "may attend", broadcast to ``(..., T_q, T_k)``
=========  ==============================================================
"""

__version__ = "0.1.0"

__all__ = ["device", "__version__"]


def device(prefer: str | None = None):
    """Return the best available ``torch.device``: cuda, then mps, then cpu.

    ``prefer`` forces a device type (``"cpu"``, ``"cuda"``, ``"mps"``); a
    ``ValueError`` is raised if that type is not available here.
    """
    import torch

    available = ["cpu"]
    if torch.cuda.is_available():
        available.insert(0, "cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        available.insert(len(available) - 1, "mps")
    if prefer is not None:
        if prefer not in available:
            raise ValueError(f"prefer={prefer!r} is not available here (available: {available})")
        return torch.device(prefer)
    return torch.device(available[0])
