"""PyTorch backend of tfbook: the functions of :mod:`tfbook.numpy` for ``torch.Tensor``
(autograd, any device), plus ``nn.Module`` classes and small models.

``tfbook.torch.functional`` holds the functions; ``tfbook.torch.modules`` and
``tfbook.torch.models`` the classes. Everything is re-exported here.
"""

from . import functional
from .functional import *  # noqa: F401,F403
from .functional import __all__ as _functional_all

__all__ = list(_functional_all)

# The module classes live in files written separately; import them when present,
# but never hide a real import error from inside an existing file.
try:
    from . import modules as _modules
    from .modules import *  # noqa: F401,F403
except ImportError as e:  # pragma: no cover - only while modules.py does not exist
    if e.name not in (__name__ + ".modules",):
        raise
else:
    __all__ += list(getattr(_modules, "__all__", []))

try:
    from . import models as _models
    from .models import *  # noqa: F401,F403
except ImportError as e:  # pragma: no cover - only while models.py does not exist
    if e.name not in (__name__ + ".models",):
        raise
else:
    __all__ += list(getattr(_models, "__all__", []))
