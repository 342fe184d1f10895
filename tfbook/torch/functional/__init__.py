"""The functions of :mod:`tfbook.numpy`, for ``torch.Tensor``.

Same names, same arguments, same semantics, in modules of the same names as
:mod:`tfbook.numpy`'s (``attention``, ``heads``, ``positions``, ``norms``, ``blocks``,
``vision``, ``efficient``, ``training``, ``modern``); this package re-exports every public
function (its ``__all__``). Every function runs on the device of its inputs, supports
autograd and preserves the dtype (float16 and bfloat16 are computed in float32 inside
softmax and cast back). Masks are boolean with ``True`` meaning "may attend"; a fully
masked query row gives zeros, not NaN.
"""

from __future__ import annotations

from . import attention, blocks, efficient, experts, heads, modern, norms, positions, serving, training, vision
from ._common import _common_dtype, _float, _tensor  # noqa: F401  (used by the modules and models)
from .heads import _attend, _multi_head_attention  # noqa: F401

# Names a topic module lists that the package does not re-export: chapter-specific helpers,
# reached by their module (``tfbook.numpy.positions.alibi_bias``).
_MODULE_ONLY = ("tubelets",)

_TOPICS = (attention, heads, positions, norms, blocks, vision, efficient, training, modern, experts, serving)  # the book's order
#: every public function of the topic modules
__all__ = [_n for _m in _TOPICS for _n in _m.__all__ if _n not in _MODULE_ONLY]
globals().update({_n: getattr(_m, _n) for _m in _TOPICS for _n in _m.__all__ if _n not in _MODULE_ONLY})
