"""PyTorch backend of tfbook: the functions of :mod:`tfbook.numpy` for ``torch.Tensor``
(autograd, any device), plus ``nn.Module`` classes and small models.

``tfbook.torch.functional`` holds the functions; ``tfbook.torch.modules`` and
``tfbook.torch.models`` the classes; ``tfbook.torch.training`` the one training loop
(``train``, ``History``). Everything is re-exported here.
"""

import importlib as _importlib

from . import functional
from .functional import *  # noqa: F401,F403
from .functional import __all__ as _functional_all

__all__ = list(_functional_all)

# The classes live in files written separately. Re-export them when present, but
# never hide a real import error from inside an existing file: only "this very
# submodule does not exist" is tolerated.
for _sub in ("modules", "models", "training", "optim", "modern", "experts"):
    try:
        _mod = _importlib.import_module(f"{__name__}.{_sub}")
    except ImportError as e:  # pragma: no cover - only while the file does not exist
        if e.name not in (f"{__name__}.{_sub}",):
            raise
        continue
    _names = getattr(_mod, "__all__", [n for n in vars(_mod) if not n.startswith("_")])
    globals().update({n: getattr(_mod, n) for n in _names})
    __all__ += [n for n in _names if n not in __all__]
del _sub
