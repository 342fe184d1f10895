"""NumPy reference implementations of every transformer component.

Plain functions with explicit parameters and no hidden state, one module per topic of the
book; :mod:`tfbook.torch.functional` has the same modules with the same names, holding the
twins (same function names and arguments):

=================  ============================================================================
module             what it holds
=================  ============================================================================
``attention``      softmax, scaled dot-product and additive attention, the masks
``heads``          splitting and merging heads, multi-head attention
``positions``      one-hot rows, the embedding lookup, sinusoidal, learned and rotary positions
``norms``          LayerNorm, ReLU, GELU, the position-wise MLP
``blocks``         the 2017 encoder and decoder blocks
``vision``         image patches and attention rollout
``efficient``      the KV cache, blocked (fast reference), tiled and linear attention
``training``       log-softmax, cross-entropy and its gradient
``modern``         RMSNorm, SiLU, SwiGLU, tanh GELU, both rotary layouts, grouped-query
                   attention, the Llama block and model
``experts``        the top-k router, its balance loss, the expert capacity, the sparse and dense
                   mixture-of-experts layer, the LoRA-adapted linear map and its merge
``serving``        rotary frequencies and their extensions (PI, NTK, YaRN), multi-head latent
                   attention, int8 and int4 quantisation, the speculative-sampling rule
``backprop``       the backward passes written out (NumPy only: autograd is PyTorch's twin)
``optim``          SGD with momentum, AdamW, clipping, checkpoints (NumPy only: the PyTorch
                   optimisers are classes in :mod:`tfbook.torch.optim`)
=================  ============================================================================

This package re-exports every public function of the first eleven modules (its ``__all__``),
so ``tfbook.numpy.softmax`` is ``tfbook.numpy.attention.softmax``, except a few chapter-specific
helpers that are reached by their module (chapter 7's schemes in ``positions``, chapter 1's
video ``tubelets`` in ``vision``). Private helpers shared by several modules live in ``_common``.

Conventions (see :mod:`tfbook` for the notation table): row vectors, so a sequence
is ``X (..., T, D)`` and ``Q = X @ W_Q`` with ``W_Q (D, D_K)``; masks are boolean
with ``True`` meaning "may attend"; a query row that may attend to nothing gets a
zero weight row and a zero output row; dtypes are preserved; bad input raises
``ValueError`` naming the argument and showing the shapes.
"""

from __future__ import annotations

from . import attention, blocks, efficient, experts, heads, modern, norms, positions, serving, training, vision
from ._common import _as_float  # noqa: F401  (used by tfbook.torch's twins and the tests)
from .efficient import _check_kv_cache  # noqa: F401
from .norms import _erf  # noqa: F401  (tfbook.numpy.backprop.gelu_backward uses gelu's own erf)
from .positions import _rope_angles  # noqa: F401
from .vision import _check_unpatchify  # noqa: F401

# Names a topic module lists that the package does not re-export: chapter-specific helpers,
# reached by their module (``tfbook.numpy.positions.alibi_bias``).
_MODULE_ONLY = ("interleave_permutation", "rope_self_attention", "alibi_slopes", "alibi_bias", "t5_relative_bucket",
                "tubelets")

_TOPICS = (attention, heads, positions, norms, blocks, vision, efficient, training, modern, experts, serving)  # the book's order
#: every public function of the topic modules
__all__ = [_n for _m in _TOPICS for _n in _m.__all__ if _n not in _MODULE_ONLY]
globals().update({_n: getattr(_m, _n) for _m in _TOPICS for _n in _m.__all__ if _n not in _MODULE_ONLY})
