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
from ._common import _common_dtype, _float, _tensor  # noqa: F401  (used by the modules and models)
from .heads import _attend, _multi_head_attention  # noqa: F401

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
