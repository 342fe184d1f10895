"""Old path of :mod:`tfbook.numpy.optim` (the NumPy optimisers), kept for the chapters that import it.

``import tfbook.optim`` gives the very module ``tfbook.numpy.optim``.
"""

import sys

from .numpy import optim as _moved

sys.modules[__name__] = _moved
