"""tfbook: the support package of *Transformers, Derived and Checked*.

Every transformer component is implemented twice, with the same names and
arguments:

* :mod:`tfbook.numpy` -- NumPy reference implementations (plain functions,
  explicit parameter dicts, no hidden state), one module per topic;
* :mod:`tfbook.torch` -- the same functions for ``torch.Tensor`` (autograd, any
  device; :mod:`tfbook.torch.functional`, in modules of the same names) plus
  ``nn.Module`` classes and small models for training.

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
``B``      batch size; ``V`` vocabulary size; ``L`` number of blocks
``H_kv``   key/value heads of grouped-query attention (``num_kv_heads``)
``W_E``    token embedding table ``(V, D)``; ``PE`` positional encoding
``W_1``    MLP weights ``(D, D_ff)`` and ``W_2`` ``(D_ff, D)``, biases ``b_1, b_2``
``W_up``   SwiGLU: ``(silu(X W_gate) * (X W_up)) W_down``
``gamma``  LayerNorm/RMSNorm gain (``beta`` the shift, ``eps`` the guard)
=========  ==============================================================
"""

import os

#: The package version.
__version__ = "0.1.0"

__all__ = ["device", "DEVICE_ENV", "glue", "__version__"]

from tfbook._glue import glue  # noqa: E402  (numbers in the prose come from the code)


#: The environment variable that overrides :func:`device` (``cpu``, ``cuda`` or ``mps``).
DEVICE_ENV = "TFBOOK_DEVICE"
_DEVICE_TYPES = ("cpu", "cuda", "mps")


def _available_devices() -> list[str]:
    """Device types PyTorch can use here, best first (cuda, then mps, then cpu)."""
    import torch

    available = ["cpu"]
    if torch.cuda.is_available():
        available.insert(0, "cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        available.insert(len(available) - 1, "mps")
    return available


def device(prefer: str | None = None):
    """Return the ``torch.device`` the book's PyTorch code runs on.

    In order: ``prefer`` if given; else the environment variable ``TFBOOK_DEVICE``
    (``cpu``, ``cuda`` or ``mps``) if set and not empty; else the best available
    device type: cuda, then mps, then cpu. A requested type that is not a device type,
    or that is not available here, raises ``ValueError`` naming where the request came
    from (the argument or the variable) and what is available.
    """
    import torch

    source = "prefer"
    if prefer is None:
        env = os.environ.get(DEVICE_ENV, "").strip().lower()
        if env:
            prefer, source = env, f"the environment variable {DEVICE_ENV}"
    available = _available_devices()
    if prefer is not None:
        if prefer not in _DEVICE_TYPES:
            raise ValueError(f"{source}={prefer!r} is not a device type; use one of {list(_DEVICE_TYPES)}")
        if prefer not in available:
            raise ValueError(f"{source}={prefer!r} is not available here (available: {available})")
        return torch.device(prefer)
    return torch.device(available[0])
