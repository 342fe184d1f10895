"""Old path of :mod:`tfbook.numpy.backprop` (the backward passes), kept for the chapters that import it.

``import tfbook.backprop`` gives the very module ``tfbook.numpy.backprop``.
"""

import sys

from .numpy import backprop as _moved

sys.modules[__name__] = _moved
