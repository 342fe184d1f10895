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
``backprop``       the backward passes written out (NumPy only: autograd is PyTorch's twin)
``optim``          SGD with momentum, AdamW, clipping, checkpoints (NumPy only: the PyTorch
                   optimisers are classes in :mod:`tfbook.torch.optim`)
=================  ============================================================================

This package re-exports every public function of the first nine modules (its ``__all__``),
so ``tfbook.numpy.softmax`` is ``tfbook.numpy.attention.softmax``. Private helpers shared by
several modules live in ``_common``.

Conventions (see :mod:`tfbook` for the notation table): row vectors, so a sequence
is ``X (..., T, D)`` and ``Q = X @ W_Q`` with ``W_Q (D, D_K)``; masks are boolean
with ``True`` meaning "may attend"; a query row that may attend to nothing gets a
zero weight row and a zero output row; dtypes are preserved; bad input raises
``ValueError`` naming the argument and showing the shapes.
"""

from __future__ import annotations

from .attention import (  # noqa: F401
    softmax,
    scaled_dot_product_attention,
    additive_attention,
    causal_mask,
    padding_mask,
    attention_mask_from_padding,
    sliding_window_mask,
)
from .heads import (  # noqa: F401
    split_heads,
    merge_heads,
    multi_head_attention,
)
from .positions import (  # noqa: F401
    one_hot,
    embedding_lookup,
    sinusoidal_positional_encoding,
    sinusoidal_shift_matrix,
    sinusoidal_positional_encoding_2d,
    learned_positional_embedding,
    rope,
)
from .norms import (  # noqa: F401
    layer_norm,
    relu,
    gelu,
    feed_forward,
)
from .blocks import (  # noqa: F401
    encoder_block,
    decoder_block,
)
from .vision import (  # noqa: F401
    patchify,
    unpatchify,
    attention_rollout,
)
from .efficient import (  # noqa: F401
    kv_cache_append,
    blocked_attention,
    tiled_attention,
    linear_attention,
)
from .training import (  # noqa: F401
    log_softmax,
    cross_entropy,
    cross_entropy_grad,
)
from .modern import (  # noqa: F401
    rms_norm,
    silu,
    swiglu,
    gelu_tanh,
    rope_rotate_half,
    rope_permutation,
    rope_attention,
    grouped_query_attention,
    llama_block,
    llama_lm,
)
from ._common import _as_float  # noqa: F401  (used by tfbook.torch's twins and the tests)
from .efficient import _check_kv_cache  # noqa: F401
from .norms import _erf  # noqa: F401  (tfbook.numpy.backprop.gelu_backward uses gelu's own erf)
from .positions import _rope_angles  # noqa: F401
from .vision import _check_unpatchify  # noqa: F401

__all__ = [
    "softmax",
    "scaled_dot_product_attention",
    "additive_attention",
    "causal_mask",
    "padding_mask",
    "attention_mask_from_padding",
    "sliding_window_mask",
    "split_heads",
    "merge_heads",
    "multi_head_attention",
    "one_hot",
    "embedding_lookup",
    "sinusoidal_positional_encoding",
    "sinusoidal_shift_matrix",
    "sinusoidal_positional_encoding_2d",
    "learned_positional_embedding",
    "rope",
    "layer_norm",
    "relu",
    "gelu",
    "feed_forward",
    "encoder_block",
    "decoder_block",
    "patchify",
    "unpatchify",
    "attention_rollout",
    "kv_cache_append",
    "blocked_attention",
    "tiled_attention",
    "linear_attention",
    "log_softmax",
    "cross_entropy",
    "cross_entropy_grad",
    "rms_norm",
    "silu",
    "swiglu",
    "gelu_tanh",
    "rope_rotate_half",
    "rope_permutation",
    "rope_attention",
    "grouped_query_attention",
    "llama_block",
    "llama_lm",
]
