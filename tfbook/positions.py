"""Old path of chapter 7's position schemes and chapter 1's video tubelets, kept for the
chapters that import it: the functions live in :mod:`tfbook.numpy.positions`,
:mod:`tfbook.numpy.vision` and :mod:`tfbook.torch.functional.vision`.
"""

from .numpy.positions import alibi_bias, alibi_slopes, interleave_permutation, t5_relative_bucket
from .numpy.positions import rope_self_attention as rope_attention
from .numpy.vision import tubelets
from .torch.functional.vision import tubelets as tubelets_torch

__all__ = [
    "interleave_permutation",
    "rope_attention",
    "alibi_slopes",
    "alibi_bias",
    "t5_relative_bucket",
    "tubelets",
    "tubelets_torch",
]
