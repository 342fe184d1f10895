"""Small transformer models built from :mod:`tfbook.torch.modules`.

Three families, each a frozen configuration dataclass plus an ``nn.Module``:

* :class:`EncoderDecoderConfig`, :class:`EncoderDecoder` -- sequence to sequence
  (chapter 12: number words to digits), decoded greedily (``greedy_decode``) or by
  :func:`beam_search`, outputs scored by :func:`sequence_log_prob`;
* :class:`DecoderLMConfig`, :class:`DecoderLM` -- a decoder-only language model with a
  KV cache for generation (chapters 11 and 13);
* :class:`ViTConfig`, :class:`VisionTransformer` -- an image classifier over patches
  (chapter 15).

The defaults are sized to train on a 2-core CPU in well under a minute. Training helpers
at the end (:func:`train_steps`, a short form of the one loop
:func:`tfbook.torch.training.train`, and :func:`lm_batch`, :func:`lm_loss`,
:func:`seq2seq_loss`) keep the notebooks short and their runs deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .. import _validate as V
from . import functional as F
from .modules import (
    DecoderBlock,
    EncoderBlock,
    KVCache,
    LayerNorm,
    LearnedPositionalEmbedding,
    PatchEmbedding,
    SinusoidalPositionalEncoding,
)

__all__ = [
    "EncoderDecoderConfig",
    "EncoderDecoder",
    "beam_search",
    "sequence_log_prob",
    "DecoderLMConfig",
    "DecoderLM",
    "ViTConfig",
    "VisionTransformer",
    "train_steps",
    "lm_batch",
    "lm_loss",
    "seq2seq_loss",
    "num_params",
]


def _check_config(d_model, num_heads, d_ff, activation):
    V.check_positive_int("d_model", d_model)
    V.check_heads(int(d_model), num_heads, (d_model,), name="d_model")
    V.check_positive_int("d_ff", d_ff)
    V.check_choice("activation", activation, ("relu", "gelu"))


def _check_ids(name: str, ids: torch.Tensor, vocab_size: int, max_len: int | None = None) -> None:
    """``ids`` must be an integer ``(B, T)`` tensor with values in ``0..vocab_size-1``."""
    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
    V.check_ndim(name, ids, 2, 2, what="(B, T)")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype} (shape {tuple(ids.shape)})")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(
            f"{name} has ids in {int(ids.min())}..{int(ids.max())} but vocab_size={vocab_size} "
            f"({name}: {tuple(ids.shape)})"
        )
    if max_len is not None and ids.shape[1] > max_len:
        raise ValueError(f"{name} has T={ids.shape[1]} > max_len={max_len} ({name}: {tuple(ids.shape)})")


def _check_valid(name: str, valid, ids: torch.Tensor) -> None:
    if valid is None:
        return
    if not isinstance(valid, torch.Tensor) or valid.dtype != torch.bool:
        raise ValueError(f"{name} must be a boolean tensor (True = real token)")
    if tuple(valid.shape) != tuple(ids.shape):
        raise ValueError(f"{name} must have the shape of the ids: {tuple(valid.shape)} vs {tuple(ids.shape)}")


def _positions(kind: str, max_len: int, d_model: int) -> nn.Module:
    if kind == "learned":
        return LearnedPositionalEmbedding(max_len, d_model)
    return SinusoidalPositionalEncoding(d_model, max_len)


def num_params(model: nn.Module) -> int:
    """Number of trainable scalars (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ---------------------------------------------------------------------------------------
# Encoder-decoder
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncoderDecoderConfig:
    """The sizes and choices of an :class:`EncoderDecoder` (frozen; checked when created).

    Attributes
    ----------
    src_vocab_size : int
        Number of source token ids (required).
    tgt_vocab_size : int
        Number of target token ids, bos, eos and pad included (required).
    d_model : int, default 64
        D, the width of every token vector; must be divisible by ``num_heads``.
    num_heads : int, default 4
        H, attention heads per layer; D_K = D / H (16 with the defaults).
    d_ff : int, default 128
        Hidden width of each block's MLP.
    num_encoder_layers : int, default 2
        Encoder blocks.
    num_decoder_layers : int, default 2
        Decoder blocks (self-attention, cross-attention, MLP).
    max_len : int, default 64
        Longest source or target sequence (positions 0..max_len-1).
    pos : str, default "sinusoidal"
        Position encoding: ``"sinusoidal"`` (fixed, as in the 2017 paper) or ``"learned"``.
    norm_first : bool, default True
        Pre-LN (LayerNorm before each sub-layer), which trains at a fixed learning rate
        without warm-up; False gives the paper's Post-LN.
    activation : str, default "relu"
        The MLP's non-linearity, ``"relu"`` (the paper's) or ``"gelu"``.
    pad_id : int, default 0
        Id of padding in both vocabularies; marks the invalid positions when no validity
        mask is passed to ``forward`` or :func:`seq2seq_loss`.
    eps : float, default 1e-5
        LayerNorm's epsilon.
    """
    src_vocab_size: int  # number of source token ids
    tgt_vocab_size: int  # number of target token ids (bos, eos and pad included)
    d_model: int = 64  # D, the width of every token vector
    num_heads: int = 4  # H; D_K = D / H = 16
    d_ff: int = 128  # hidden width of each MLP
    num_encoder_layers: int = 2  # encoder blocks
    num_decoder_layers: int = 2  # decoder blocks
    max_len: int = 64  # longest source or target sequence (positions 0..max_len-1)
    pos: str = "sinusoidal"  # "sinusoidal" (fixed, as in the 2017 paper) or "learned"
    norm_first: bool = True  # Pre-LN: trains at a fixed learning rate without warm-up
    activation: str = "relu"  # MLP non-linearity, "relu" or "gelu"
    pad_id: int = 0  # id of padding in both vocabularies; used when no validity mask is given
    eps: float = 1e-5  # LayerNorm epsilon

    def __post_init__(self):
        V.check_positive_int("src_vocab_size", self.src_vocab_size)
        V.check_positive_int("tgt_vocab_size", self.tgt_vocab_size)
        _check_config(self.d_model, self.num_heads, self.d_ff, self.activation)
        V.check_positive_int("num_encoder_layers", self.num_encoder_layers)
        V.check_positive_int("num_decoder_layers", self.num_decoder_layers)
        V.check_positive_int("max_len", self.max_len)
        V.check_choice("pos", self.pos, ("sinusoidal", "learned"))


class EncoderDecoder(nn.Module):
    """The encoder-decoder transformer of the 2017 paper, small.

    ``forward(src (B, S), tgt_in (B, T)) -> logits (B, T, tgt_vocab_size)``: the logits
    at position ``t`` predict target token ``t + 1`` from ``tgt_in[:, :t+1]`` (causal
    self-attention) and the whole source (cross-attention).

    Padding: ``src_valid`` and ``tgt_valid`` are boolean ``(B, S)`` and ``(B, T)``, True at
    real tokens; when omitted they are ``ids != config.pad_id``. Padded keys are masked
    everywhere, so the ids at padded positions do not change the logits at valid ones.

    Embeddings are multiplied by ``sqrt(D)``, as in the paper, so that tokens and the
    sinusoidal positions (entries of size about 1) have comparable scale.
    """

    def __init__(self, config: EncoderDecoderConfig):
        super().__init__()
        self.config = c = config
        D = c.d_model
        self.W_src = nn.Parameter(torch.randn(c.src_vocab_size, D) / math.sqrt(D))  # (V_src, D)
        self.W_tgt = nn.Parameter(torch.randn(c.tgt_vocab_size, D) / math.sqrt(D))  # (V_tgt, D)
        self.src_pos = _positions(c.pos, c.max_len, D)
        self.tgt_pos = _positions(c.pos, c.max_len, D)
        block = dict(norm_first=c.norm_first, activation=c.activation, eps=c.eps)
        self.encoder = nn.ModuleList(
            EncoderBlock(D, c.num_heads, c.d_ff, **block) for _ in range(c.num_encoder_layers)
        )
        self.decoder = nn.ModuleList(
            DecoderBlock(D, c.num_heads, c.d_ff, **block) for _ in range(c.num_decoder_layers)
        )
        # Pre-LN leaves the residual stream unnormalised; nn.Transformer adds these too.
        self.enc_norm = LayerNorm(D, c.eps) if c.norm_first else nn.Identity()
        self.dec_norm = LayerNorm(D, c.eps) if c.norm_first else nn.Identity()
        self.W_out = nn.Parameter(torch.randn(D, c.tgt_vocab_size) / math.sqrt(D))  # (D, V_tgt)
        self.b_out = nn.Parameter(torch.zeros(c.tgt_vocab_size))

    def _valid(self, ids, valid):
        return ids != self.config.pad_id if valid is None else valid

    def encode(self, src: torch.Tensor, src_valid=None, return_attention: bool = False):
        """``src (B, S)`` -> ``memory (B, S, D)`` (and the encoder's ``P`` per layer)."""
        c = self.config
        _check_ids("src", src, c.src_vocab_size, c.max_len)
        _check_valid("src_valid", src_valid, src)
        mask = F.attention_mask_from_padding(self._valid(src, src_valid))  # (B, 1, S)
        X = self.src_pos(F.embedding_lookup(src, self.W_src) * math.sqrt(c.d_model))  # (B, S, D)
        attn = []
        for block in self.encoder:
            if return_attention:
                X, P = block(X, mask=mask, return_attention=True)
                attn.append(P)  # (B, H, S, S)
            else:
                X = block(X, mask=mask)  # fused attention, no P
        X = self.enc_norm(X)
        return (X, attn) if return_attention else X

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src_valid=None, tgt_valid=None,
               return_attention: bool = False):
        """Target ids ``(B, T)`` and ``memory (B, S, D)`` -> logits ``(B, T, V_tgt)``.

        ``src_valid (B, S)`` says which memory rows are real (None: all of them).
        """
        c = self.config
        _check_ids("tgt_in", tgt_in, c.tgt_vocab_size, c.max_len)
        _check_valid("tgt_valid", tgt_valid, tgt_in)
        T = tgt_in.shape[1]
        self_mask = F.causal_mask(T, device=tgt_in.device) & F.attention_mask_from_padding(
            self._valid(tgt_in, tgt_valid)
        )  # (B, T, T)
        if src_valid is None:
            src_valid = torch.ones(memory.shape[:2], dtype=torch.bool, device=memory.device)
        cross_mask = F.attention_mask_from_padding(src_valid)  # (B, 1, S)
        X = self.tgt_pos(F.embedding_lookup(tgt_in, self.W_tgt) * math.sqrt(c.d_model))  # (B, T, D)
        self_attn, cross_attn = [], []
        for block in self.decoder:
            if return_attention:
                X, (P_self, P_cross) = block(X, memory, self_mask=self_mask, cross_mask=cross_mask,
                                             return_attention=True)
                self_attn.append(P_self)  # (B, H, T, T)
                cross_attn.append(P_cross)  # (B, H, T, S)
            else:
                X = block(X, memory, self_mask=self_mask, cross_mask=cross_mask)  # fused
        logits = self.dec_norm(X) @ self.W_out + self.b_out  # (B, T, V_tgt)
        if return_attention:
            return logits, {"decoder_self": self_attn, "cross": cross_attn}
        return logits

    def forward(self, src, tgt_in, src_valid=None, tgt_valid=None, return_attention: bool = False):
        """Logits ``(B, T, V_tgt)``; with ``return_attention`` also a dict of weights per layer:
        ``"encoder"`` ``(B, H, S, S)``, ``"decoder_self"`` ``(B, H, T, T)``, ``"cross"`` ``(B, H, T, S)``.
        """
        src_valid = self._valid(src, src_valid)
        if not return_attention:  # PyTorch's fused attention throughout; no P is formed
            return self.decode(tgt_in, self.encode(src, src_valid), src_valid, tgt_valid)
        memory, enc_attn = self.encode(src, src_valid, return_attention=True)
        logits, attn = self.decode(tgt_in, memory, src_valid, tgt_valid, return_attention=True)
        return logits, {"encoder": enc_attn, **attn}

    @torch.no_grad()
    def greedy_decode(self, src, max_len: int, bos: int, eos: int, src_valid=None) -> torch.Tensor:
        """Decode by always taking the most likely next token.

        Returns ``(B, L)`` ids after ``bos``, ``L <= max_len``. A sequence stops at its
        first ``eos`` (kept in the output); later positions hold ``config.pad_id``.
        Decoding stops early once every sequence has produced ``eos``.
        """
        c = self.config
        V.check_positive_int("max_len", max_len)
        if max_len + 1 > c.max_len:
            raise ValueError(f"max_len={max_len} plus bos exceeds the model's max_len={c.max_len}")
        for name, tok in (("bos", bos), ("eos", eos)):
            if not 0 <= tok < c.tgt_vocab_size:
                raise ValueError(f"{name}={tok} is outside 0..{c.tgt_vocab_size - 1}")
        src_valid = self._valid(src, src_valid)
        memory = self.encode(src, src_valid)
        B = src.shape[0]
        tgt = torch.full((B, 1), bos, dtype=torch.long, device=src.device)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)
        for _ in range(max_len):
            # every position of tgt is real (pad only follows eos), hence the all-True mask
            logits = self.decode(tgt, memory, src_valid, torch.ones_like(tgt, dtype=torch.bool))
            nxt = logits[:, -1].argmax(dim=-1)  # (B,)
            nxt = torch.where(done, torch.full_like(nxt, c.pad_id), nxt)
            tgt = torch.cat([tgt, nxt[:, None]], dim=1)
            done = done | (nxt == eos)
            if bool(done.all()):
                break
        return tgt[:, 1:]


# ---------------------------------------------------------------------------------------
# Beam search and the log-probability of a decoded output (chapter 12)
# ---------------------------------------------------------------------------------------


def _check_decode(model, max_len: int, bos: int, eos: int):
    c = model.config
    if not (isinstance(max_len, int) and max_len >= 1):
        raise ValueError(f"max_len must be a positive int, got {max_len!r}")
    if max_len + 1 > c.max_len:
        raise ValueError(f"max_len={max_len} plus bos exceeds the model's max_len={c.max_len}")
    for name, tok in (("bos", bos), ("eos", eos)):
        if not 0 <= tok < c.tgt_vocab_size:
            raise ValueError(f"{name}={tok} is outside 0..{c.tgt_vocab_size - 1}")


@torch.no_grad()
def beam_search(model, src: torch.Tensor, max_len: int, bos: int, eos: int, beam_width: int = 4,
                src_valid=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Beam search of the encoder-decoder ``model`` for every source of the batch ``src (B, S)``.

    Returns ``(ids, scores)``: ``ids (B, L)`` are the best beam's tokens after ``bos`` in the
    format of :meth:`EncoderDecoder.greedy_decode` (a sequence stops at its first ``eos``, kept;
    later positions hold ``config.pad_id``; ``L <= max_len``), ``scores (B,)`` its total
    log-probability.

    Greedy decoding keeps one partial output and extends it by its most likely next token. Beam
    search keeps the ``beam_width`` partial outputs with the highest total log-probability
    ``sum_t log p(y_t | y_<t, source)``: at every step each of them is extended by every token,
    and the ``beam_width`` best of all those extensions survive. A partial output that has
    produced ``eos`` is finished: it is carried on unchanged (padded, its score fixed) and
    competes with the unfinished ones. When every beam is finished, or after ``max_len`` tokens,
    the beam with the highest score is returned. Scores are plain sums of log-probabilities (no
    length normalisation). With ``beam_width = 1`` beam search *is* greedy decoding; with more
    beams it is not guaranteed to find the most likely sequence (``tests/test_decoding.py``
    checks both on chapter 12's model).
    """
    if not (isinstance(beam_width, int) and beam_width >= 1):
        raise ValueError(f"beam_width must be a positive int, got {beam_width!r}")
    _check_decode(model, max_len, bos, eos)
    c = model.config
    B, W, V = src.shape[0], beam_width, c.tgt_vocab_size
    src_valid = model._valid(src, src_valid)
    memory = model.encode(src, src_valid)                                    # (B, S, D)
    memory = memory.repeat_interleave(W, dim=0)                              # (B W, S, D)
    valid = src_valid.repeat_interleave(W, dim=0)
    tgt = torch.full((B * W, 1), bos, dtype=torch.long, device=src.device)
    scores = torch.full((B, W), float("-inf"), dtype=memory.dtype, device=src.device)
    scores[:, 0] = 0.0                                                       # one live beam at the start
    done = torch.zeros(B * W, dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        logits = model.decode(tgt, memory, valid, torch.ones_like(tgt, dtype=torch.bool))
        logp = torch.log_softmax(logits[:, -1].to(scores.dtype), dim=-1)     # (B W, V)
        # a finished beam has exactly one continuation, pad, which leaves its score unchanged
        fin = torch.full_like(logp, float("-inf"))
        fin[:, c.pad_id] = 0.0
        logp = torch.where(done[:, None], fin, logp)
        cand = (scores.reshape(B * W, 1) + logp).reshape(B, W * V)
        top, idx = cand.topk(W, dim=-1)                                      # (B, W), sorted, best first
        parent = idx // V + torch.arange(B, device=src.device)[:, None] * W  # row in the (B W) batch
        tok = (idx % V).reshape(B * W)
        parent = parent.reshape(B * W)
        tgt = torch.cat([tgt[parent], tok[:, None]], dim=1)
        done = done[parent] | (tok == eos)
        scores = top
        if bool(done.all()):
            break
    best = scores.argmax(dim=-1)                                             # (B,)
    rows = torch.arange(B, device=src.device) * W + best
    out = tgt[rows, 1:]
    return out, scores[torch.arange(B, device=src.device), best]


@torch.no_grad()
def sequence_log_prob(model, src: torch.Tensor, ids: torch.Tensor, eos: int, bos: int,
                      src_valid=None) -> torch.Tensor:
    """Total log-probability of the decoded outputs ``ids (B, L)`` (format of ``greedy_decode``).

    Sums ``log p(y_t | bos, y_<t, source)`` over each row's tokens up to and including its
    first ``eos`` (the pads after it are not part of the sequence). Returns ``(B,)``.
    """
    c = model.config
    B, L = ids.shape
    tgt_in = torch.cat([torch.full((B, 1), bos, dtype=torch.long, device=ids.device), ids[:, :-1]], dim=1)
    logits = model(src, tgt_in, src_valid=model._valid(src, src_valid),
                   tgt_valid=torch.ones_like(tgt_in, dtype=torch.bool))
    logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, :, None])[..., 0]   # (B, L)
    is_eos = ids == eos
    first = torch.where(is_eos.any(dim=1), is_eos.float().argmax(dim=1), torch.full((B,), L - 1))
    keep = torch.arange(L, device=ids.device)[None, :] <= first[:, None]
    return torch.where(keep, logp, torch.zeros_like(logp)).sum(dim=1)


# ---------------------------------------------------------------------------------------
# Decoder-only language model
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecoderLMConfig:
    """The sizes and choices of a :class:`DecoderLM`, a GPT-style model (frozen; checked when created).

    Attributes
    ----------
    vocab_size : int
        Number of token ids (required).
    block_size : int, default 128
        Longest context, positions 0..block_size-1 (the size of the learned position table).
    d_model : int, default 64
        D, the width of the residual stream; must be divisible by ``num_heads``.
    num_heads : int, default 4
        H, attention heads per layer; D_K = D / H (16 with the defaults).
    num_layers : int, default 2
        Decoder blocks.
    d_ff : int, default 256
        Hidden width of each block's MLP (4 D with the defaults, as in the paper).
    norm_first : bool, default True
        Pre-LN, as in GPT-2 and later (with a final LayerNorm); False gives Post-LN.
    activation : str, default "gelu"
        The MLP's non-linearity, ``"relu"`` or ``"gelu"`` (exact, erf-based).
    pos : str, default "learned"
        Position encoding: a ``"learned"`` table (GPT style) or ``"sinusoidal"``.
    tie_weights : bool, default True
        The output head reuses the token embedding W_E (transposed) instead of a matrix of its own.
    eps : float, default 1e-5
        LayerNorm's epsilon.
    """
    vocab_size: int  # number of token ids
    block_size: int = 128  # longest context (positions 0..block_size-1)
    d_model: int = 64  # D, the width of the residual stream
    num_heads: int = 4  # H; D_K = D / H = 16
    num_layers: int = 2  # blocks
    d_ff: int = 256  # MLP hidden width, 4 D as in the paper
    norm_first: bool = True  # Pre-LN, as in GPT-2 and later
    activation: str = "gelu"  # MLP non-linearity, "relu" or "gelu"
    pos: str = "learned"  # "learned" table (GPT style) or "sinusoidal"
    tie_weights: bool = True  # the output head reuses the token embedding W_E (transposed)
    eps: float = 1e-5  # LayerNorm epsilon

    def __post_init__(self):
        V.check_positive_int("vocab_size", self.vocab_size)
        V.check_positive_int("block_size", self.block_size)
        _check_config(self.d_model, self.num_heads, self.d_ff, self.activation)
        V.check_positive_int("num_layers", self.num_layers)
        V.check_choice("pos", self.pos, ("sinusoidal", "learned"))


def _autocast_on(X: torch.Tensor) -> bool:
    try:
        return torch.is_autocast_enabled(X.device.type)
    except TypeError:  # pragma: no cover - torch < 2.4 takes no device type (and means CUDA)
        return X.is_cuda and torch.is_autocast_enabled()


def _affine(X: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``X @ W + b``. Under autocast this is ``linear(X, W.T, b)`` instead: the bias is added
    inside the (bf16/fp16) matrix product. Spelled ``X @ W + b`` there, the product is bf16
    but the float32 bias promotes the sum, and every activation would be written in float32
    and cast back to bf16 by the next product (an extra elementwise pass, twice the bytes).
    Without autocast it is the book's ``X @ W + b`` (the same arithmetic as the blocks)."""
    if b is None:
        return X @ W
    if _autocast_on(X):
        return nn.functional.linear(X, W.T, b)
    return X @ W + b


def _no_hooks(*modules) -> bool:
    """No forward or backward hook on these modules, nor a global one (hooks add dropout, record
    inputs...: a module that has one is called as a module, so that the hook runs)."""
    from torch.nn.modules import module as _m

    if any(getattr(_m, name, None) for name in ("_global_forward_hooks", "_global_forward_pre_hooks",
                                                 "_global_backward_hooks", "_global_backward_pre_hooks")):
        return False
    return not any(getattr(m, name, None) for m in modules
                   for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"))


def _causal_block_applies(block) -> bool:
    """Whether :func:`_causal_block` computes ``block`` (a plain :class:`EncoderBlock`, no hooks)."""
    from .modules import FeedForward, MultiHeadAttention

    return (type(block) is EncoderBlock and type(block.attn) is MultiHeadAttention
            and type(block.ffn) is FeedForward and _no_hooks(block, block.attn, block.ffn))


#: what PyTorch's fused CPU attention says where its bf16 kernel cannot run on this CPU (the
#: kernels forced to the portable level, ATEN_CPU_CAPABILITY=default, on a CPU with AVX-512 BF16)
_CPU_KERNEL_REFUSALS = ("pack_vnni2", "avx512")


def _sdpa_causal(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, **kwargs) -> torch.Tensor:
    """``scaled_dot_product_attention(Q, K, V, is_causal=True, **kwargs)``, falling back to
    PyTorch's math kernel (the same function, written as its equation) where the fused CPU kernel
    refuses the CPU it runs on, so that no reader's machine sees a cell fail for its processor."""
    try:
        return nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=True, **kwargs)
    except RuntimeError as err:
        if Q.device.type != "cpu" or not any(s in str(err) for s in _CPU_KERNEL_REFUSALS):
            raise
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=True, **kwargs)


def _causal_block(block, X: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``block(X, mask=mask)`` with ``mask`` the causal mask, for :class:`DecoderLM`'s path without ``P``.

    ``mask=None`` means the causal mask of ``X``'s length: it is then built only for a block
    that must be called as a module, so the fused path builds no ``(T, T)`` tensor per call.

    A block class that has its own fused causal path (``LlamaBlock._causal_forward``, in
    :mod:`tfbook.torch.modern`) computes itself that way when the method applies (it returns
    ``None`` where it does not: a subclass, a replaced part, hooks); any other block, or one
    with hooks, is simply called. This module never imports :mod:`tfbook.torch.modern`, which
    builds on it. For a plain :class:`EncoderBlock` this is the block's computation written out here, with the
    same parameters and the same operations as :class:`EncoderBlock` (tested bitwise equal on
    the CPU), and three differences that only the speed sees: attention is PyTorch's fused
    kernel told ``is_causal=True`` instead of given ``mask`` (``mask`` must be the causal
    one; it is neither read nor checked, so the fastest kernel, flash attention, may run, and
    no row of the mask is checked on the host, a GPU-to-CPU synchronisation per layer); the
    heads are views of one ``(B, T, 3D)`` projection, laid out as nanoGPT lays them out
    (``(B, H, T, D_h)`` with unit stride in ``D_h``); and under autocast the biases are
    added inside the products (:func:`_affine`).
    """
    if not _causal_block_applies(block):
        fused = getattr(block, "_causal_forward", None)  # LlamaLM's blocks: the same change, their layout
        Y = fused(X) if fused is not None else None
        if Y is not None:
            return Y
        if mask is None:
            mask = F.causal_mask(X.shape[-2], device=X.device)  # (T, T)
        return block(X, mask=mask)
    attn, ffn = block.attn, block.ffn
    H, D = attn.num_heads, attn.d_model

    def attention(Y):
        *lead, T, _ = Y.shape
        W = torch.cat([attn.W_Q, attn.W_K, attn.W_V], dim=1)  # (D, 3D): one product for Q, K, V
        b = torch.cat([attn.b_Q, attn.b_K, attn.b_V]) if attn.bias else None
        Q, K, V = (Z.reshape(*lead, T, H, D // H).transpose(-2, -3)  # (B, H, T, D_h), views
                   for Z in _affine(Y, W, b).split(D, dim=-1))
        Z = _sdpa_causal(Q, K, V)  # (B, H, T, D_h), fused kernel told is_causal
        return _affine(Z.transpose(-2, -3).reshape(*lead, T, D), attn.W_O, attn.b_O)  # (B, T, D)

    def mlp(Y):
        act = nn.functional.gelu if ffn.activation == "gelu" else torch.relu
        return _affine(act(_affine(Y, ffn.W_1, ffn.b_1)), ffn.W_2, ffn.b_2)

    V.check_last_dim("X", X, D, "d_model")
    if block.norm_first:
        X = X + attention(block.norm1(X))
        return X + mlp(block.norm2(X))
    X = block.norm1(X + attention(X))
    return block.norm2(X + mlp(X))


class DecoderLM(nn.Module):
    """A decoder-only (GPT-style) language model.

    A decoder-only block is an :class:`EncoderBlock` with a causal mask: there is no
    memory to cross-attend to. ``forward(idx (B, T)) -> logits (B, T, vocab_size)``,
    where the logits at ``t`` predict token ``t + 1`` from tokens ``0..t`` only.

    :meth:`generate` extends a prompt one token at a time, with a KV cache by default;
    the cache changes the cost, not the result.
    """

    def __init__(self, config: DecoderLMConfig):
        super().__init__()
        self.config = c = config
        D = c.d_model
        # GPT-2's initialisation: small embeddings (std 0.02), no sqrt(D) factor. With
        # tied weights the logit of the input token itself starts at about 0.02^2 D / 0.02
        # = 0.02 D (LayerNorm rescales the row), small enough not to bias the first steps.
        self.W_E = nn.Parameter(0.02 * torch.randn(c.vocab_size, D))  # (V, D)
        self.pos = _positions(c.pos, c.block_size, D)
        self.blocks = nn.ModuleList(
            EncoderBlock(D, c.num_heads, c.d_ff, norm_first=c.norm_first,
                         activation=c.activation, eps=c.eps)
            for _ in range(c.num_layers)
        )
        self.norm = LayerNorm(D, c.eps) if c.norm_first else nn.Identity()
        if c.tie_weights:
            self.register_parameter("W_U", None)
        else:
            self.W_U = nn.Parameter(0.02 * torch.randn(D, c.vocab_size))  # (D, V)

    def _embed(self, idx: torch.Tensor, offset: int) -> torch.Tensor:
        X = F.embedding_lookup(idx, self.W_E)  # (B, T, D)
        return self.pos(X, offset=offset)

    def _unembed(self, X: torch.Tensor) -> torch.Tensor:
        X = self.norm(X)
        W_U = self.W_E.T if self.W_U is None else self.W_U  # (D, V)
        return X @ W_U  # (B, T, V)

    def forward(self, idx: torch.Tensor, return_attention: bool = False):
        """``idx (B, T)`` with ``T <= block_size`` -> logits ``(B, T, vocab_size)``
        (and, with ``return_attention``, ``P (B, H, T, T)`` per layer).

        Without ``return_attention`` the blocks use PyTorch's fused attention kernel, which
        never forms ``P``: the same logits to round-off, faster to train.
        """
        c = self.config
        _check_ids("idx", idx, c.vocab_size)
        T = idx.shape[1]
        if T > c.block_size:
            raise ValueError(f"idx has T={T} > block_size={c.block_size} (idx: {tuple(idx.shape)})")
        X = self._embed(idx, offset=0)
        # the (T, T) causal mask only where P is asked for: the fused path tells the kernel
        # is_causal=True and builds no mask per call (_causal_block builds one for a block it must call)
        mask = F.causal_mask(T, device=idx.device) if return_attention else None  # (T, T)
        attn = []
        for block in self.blocks:
            if return_attention:
                X, P = block(X, mask=mask, return_attention=True)
                attn.append(P)  # (B, H, T, T)
            else:
                X = _causal_block(block, X)  # = block(X, mask=causal), fused attention told is_causal
        logits = self._unembed(X)
        return (logits, attn) if return_attention else logits

    def forward_cached(self, idx_new: torch.Tensor, caches: list[KVCache]) -> torch.Tensor:
        """Logits for ``idx_new (B, T_new)``, the tokens that follow those already in ``caches``.

        Each block attends to its cached keys and values plus the new ones; the caches
        grow by ``T_new``. Position ``p`` of a new token is its index in the whole text.
        """
        c = self.config
        _check_ids("idx_new", idx_new, c.vocab_size)
        if len(caches) != len(self.blocks):
            raise ValueError(f"need one KVCache per block: {len(caches)} given, {len(self.blocks)} blocks")
        T_past, T_new = len(caches[0]), idx_new.shape[1]
        if T_past + T_new > c.block_size:
            raise ValueError(
                f"cache holds {T_past} tokens; {T_new} more exceed block_size={c.block_size}"
            )
        X = self._embed(idx_new, offset=T_past)
        # new query i sits at position T_past + i and may see keys 0..T_past + i
        mask = torch.ones(T_new, T_past + T_new, dtype=torch.bool, device=idx_new.device)
        mask = mask.tril(diagonal=T_past)  # (T_new, T_past + T_new)
        for block, cache in zip(self.blocks, caches):
            X = block(X, mask=mask, kv_cache=cache)
        return self._unembed(X)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 greedy: bool = False, use_cache: bool = True,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Append ``max_new_tokens`` tokens to ``idx (B, T)``; returns ``(B, T + max_new_tokens)``.

        Each step samples from ``softmax(logits / temperature)`` of the last position
        (``greedy=True`` takes the argmax instead). The context is the last
        ``block_size`` tokens. With ``use_cache`` the keys and values of earlier tokens
        are kept, so each step processes one token; when the text outgrows
        ``block_size`` the cache is rebuilt from the cropped context, which is exactly
        what the uncached path computes. Both paths give the same tokens.
        """
        c = self.config
        _check_ids("idx", idx, c.vocab_size)
        if idx.shape[1] == 0:
            raise ValueError("idx must hold at least one token (B, T >= 1)")
        V.check_positive_int("max_new_tokens", max_new_tokens, minimum=0)
        if not greedy and not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        out = idx
        caches: list[KVCache] | None = None
        for _ in range(max_new_tokens):
            if not use_cache:
                logits = self(out[:, -c.block_size:])
            elif caches is None or len(caches[0]) + 1 > c.block_size:
                caches = [KVCache() for _ in self.blocks]
                logits = self.forward_cached(out[:, -c.block_size:], caches)
            else:
                logits = self.forward_cached(out[:, -1:], caches)
            last = logits[:, -1]  # (B, V)
            if greedy:
                nxt = last.argmax(dim=-1, keepdim=True)
            else:
                probs = torch.softmax(last / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            out = torch.cat([out, nxt], dim=1)
        return out


# ---------------------------------------------------------------------------------------
# Vision Transformer
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ViTConfig:
    """The sizes and choices of a :class:`VisionTransformer` (frozen; checked when created).

    Attributes
    ----------
    image_size : int, default 8
        Images are ``image_size`` x ``image_size`` pixels (8 for scikit-learn's digits).
    patch_size : int, default 2
        p, the side of a square patch; must divide ``image_size``. There are
        N_p = (image_size / p)^2 patches (:attr:`num_patches`; :attr:`grid` per side).
    in_channels : int, default 1
        C, colour channels (1 for grey-scale).
    num_classes : int, default 10
        Output classes.
    d_model : int, default 64
        D, the width of each patch token; must be divisible by ``num_heads``.
    num_heads : int, default 4
        H, attention heads per layer.
    num_layers : int, default 2
        Encoder blocks.
    d_ff : int, default 128
        Hidden width of each block's MLP.
    pooling : str, default "cls"
        ``"cls"``: classify from a learned class token; ``"mean"``: from the average of the
        patch tokens.
    pos : str, default "1d"
        Position encoding: ``"1d"`` a learned table over the patch sequence, ``"2d"`` fixed 2D
        sinusoids (needs ``d_model`` divisible by 4), ``"2d-learned"`` a row table plus a
        column table, ``"none"`` no positions at all.
    norm_first : bool, default True
        Pre-LN, as in the ViT paper.
    activation : str, default "gelu"
        The MLP's non-linearity, ``"relu"`` or ``"gelu"``.
    eps : float, default 1e-5
        LayerNorm's epsilon.
    """
    image_size: int = 8  # images are image_size x image_size (8 for sklearn's digits)
    patch_size: int = 2  # p; N = (image_size / p)^2 patches
    in_channels: int = 1  # C (1 for grey-scale)
    num_classes: int = 10  # output classes
    d_model: int = 64  # D, the width of each patch token
    num_heads: int = 4  # H
    num_layers: int = 2  # encoder blocks
    d_ff: int = 128  # MLP hidden width
    pooling: str = "cls"  # "cls": read a learned class token; "mean": average the patch tokens
    pos: str = "1d"  # "1d" learned table, "2d" fixed 2D sinusoids, "2d-learned" row + column tables, "none"
    norm_first: bool = True  # Pre-LN, as in the ViT paper
    activation: str = "gelu"  # MLP non-linearity
    eps: float = 1e-5  # LayerNorm epsilon

    def __post_init__(self):
        V.check_positive_int("image_size", self.image_size)
        V.check_positive_int("patch_size", self.patch_size)
        if self.image_size % self.patch_size:
            raise ValueError(f"patch_size={self.patch_size} does not divide image_size={self.image_size}")
        V.check_positive_int("in_channels", self.in_channels)
        V.check_positive_int("num_classes", self.num_classes)
        _check_config(self.d_model, self.num_heads, self.d_ff, self.activation)
        V.check_positive_int("num_layers", self.num_layers)
        V.check_choice("pooling", self.pooling, ("cls", "mean"))
        V.check_choice("pos", self.pos, ("1d", "2d", "2d-learned", "none"))
        if self.pos == "2d" and self.d_model % 4:
            raise ValueError(f"pos='2d' needs d_model divisible by 4, got {self.d_model}")

    @property
    def grid(self) -> int:
        """Patches per side."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid**2


class VisionTransformer(nn.Module):
    """A Vision Transformer: patches -> tokens -> encoder blocks -> pooled vector -> classes.

    ``forward(images (B, C, H, W)) -> logits (B, num_classes)``; with
    ``return_attention=True`` also the weights ``P (B, H, T, T)`` of each layer
    (``T = N + 1`` with a class token, at index 0), ready for ``attention_rollout``.
    """

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = c = config
        D = c.d_model
        self.patch_embed = PatchEmbedding(c.in_channels, c.patch_size, D)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if c.pooling == "cls" else None
        T = c.num_patches + (1 if c.pooling == "cls" else 0)
        if c.pos == "1d":
            self.pos = LearnedPositionalEmbedding(T, D)  # the class token gets a row too
        else:
            self.pos = None
        if c.pos == "2d":
            PE = F.sinusoidal_positional_encoding_2d(c.grid, c.grid, D, dtype=torch.float64)
            self.register_buffer("PE_2d", PE, persistent=False)  # (N, D), patches only
        else:
            self.PE_2d = None
        if c.pos == "2d-learned":  # patch (r, c) gets row[r] + col[c]: 2 * grid * D numbers, patches only
            self.pos_row = nn.Parameter(torch.randn(c.grid, D) * 0.02)
            self.pos_col = nn.Parameter(torch.randn(c.grid, D) * 0.02)
        else:
            self.pos_row = self.pos_col = None
        self.blocks = nn.ModuleList(
            EncoderBlock(D, c.num_heads, c.d_ff, norm_first=c.norm_first,
                         activation=c.activation, eps=c.eps)
            for _ in range(c.num_layers)
        )
        self.norm = LayerNorm(D, c.eps) if c.norm_first else nn.Identity()
        self.W_C = nn.Parameter(torch.zeros(D, c.num_classes))  # (D, classes); zero init, as in ViT
        self.b_C = nn.Parameter(torch.zeros(c.num_classes))

    def forward(self, images: torch.Tensor, return_attention: bool = False):
        c = self.config
        V.check_ndim("images", images, 4, 4, what="(B, C, H, W)")
        expected = (c.in_channels, c.image_size, c.image_size)
        if tuple(images.shape[1:]) != expected:
            raise ValueError(f"images must be (B, {expected[0]}, {expected[1]}, {expected[2]}), "
                             f"got {tuple(images.shape)}")
        X = self.patch_embed(images)  # (B, N, D)
        if self.PE_2d is not None:
            X = X + self.PE_2d.to(X.dtype)
        if self.pos_row is not None:  # patches are numbered row by row: index r * grid + c
            X = X + (self.pos_row[:, None, :] + self.pos_col[None, :, :]).reshape(-1, X.shape[-1])
        if self.cls_token is not None:
            cls = self.cls_token.expand(X.shape[0], -1, -1)  # (B, 1, D)
            X = torch.cat([cls, X], dim=1)  # (B, 1 + N, D)
        if self.pos is not None:
            X = self.pos(X)
        attn = []
        for block in self.blocks:
            if return_attention:
                X, P = block(X, return_attention=True)
                attn.append(P)  # (B, H, T, T)
            else:
                X = block(X)  # fused attention, no P
        X = self.norm(X)
        pooled = X[:, 0] if c.pooling == "cls" else X.mean(dim=1)  # (B, D)
        logits = pooled @ self.W_C + self.b_C  # (B, classes)
        return (logits, attn) if return_attention else logits


# ---------------------------------------------------------------------------------------
# Training helpers
# ---------------------------------------------------------------------------------------


def lm_batch(data: torch.Tensor, block_size: int, batch_size: int,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of a 1-D id tensor: inputs ``x (B, T)`` and targets ``y = x`` shifted by one.

    Teacher forcing: one window of ``T + 1`` tokens gives ``T`` training examples, one
    per position.
    """
    V.check_ndim("data", data, 1, 1, what="(N,)")
    if data.shape[0] < block_size + 1:
        raise ValueError(f"data has {data.shape[0]} tokens, need at least block_size + 1 = {block_size + 1}")
    start = torch.randint(0, data.shape[0] - block_size, (batch_size,), generator=generator)
    offsets = torch.arange(block_size + 1)
    windows = data[start[:, None] + offsets]  # (B, T + 1)
    return windows[:, :-1], windows[:, 1:]


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats per token) of ``model(x)`` against targets ``y``."""
    logits = model(x)  # (B, T, V)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def seq2seq_loss(model: EncoderDecoder, src, tgt, src_valid=None, tgt_valid=None) -> torch.Tensor:
    """Teacher-forced cross-entropy for ``tgt = [bos, y_1, ..., y_n, eos, pad...]``.

    The decoder reads ``tgt[:, :-1]`` and predicts ``tgt[:, 1:]``; padded targets are
    left out of the mean.
    """
    if tgt_valid is None:
        tgt_valid = tgt != model.config.pad_id
    logits = model(src, tgt[:, :-1], src_valid, tgt_valid[:, :-1])  # (B, T - 1, V)
    target = tgt[:, 1:].masked_fill(~tgt_valid[:, 1:], -100)  # -100: ignored by cross_entropy
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                       ignore_index=-100)


def train_steps(model: nn.Module, loss_fn: Callable, batch_fn: Callable, steps: int,
                lr: float = 3e-3, weight_decay: float = 0.0, grad_clip: float | None = 1.0,
                seed: int = 0, disable: bool = False, desc: str = "training",
                device=None) -> list[float]:
    """Train ``model`` for ``steps`` AdamW steps at a constant ``lr``; return the loss of every step.

    The short form of :func:`tfbook.torch.training.train` (the one training loop): it returns
    ``train(model, loss_fn, batch_fn, steps, lr=lr, weight_decay=weight_decay,
    grad_clip=grad_clip, seed=seed, disable=disable, desc=desc, device=device).loss``, for
    chapters that need no schedule or evaluation; call :func:`~tfbook.torch.training.train`
    itself for a learning-rate schedule, evaluation, early stopping or the full
    :class:`~tfbook.torch.training.History`. ``device``: as in
    :func:`~tfbook.torch.training.train` (``None``, the default, trains where the model is). ``batch_fn(generator)`` draws a batch
    (using the given ``torch.Generator``, seeded with ``seed``, for its randomness);
    ``loss_fn(model, *batch)`` returns a scalar loss. The same model initialisation, seed
    and arguments give the same losses on CPU. ``disable=True`` hides the progress bar.
    """
    from .training import train

    return train(model, loss_fn, batch_fn, steps, lr=lr, weight_decay=weight_decay,
                 grad_clip=grad_clip, seed=seed, disable=disable, desc=desc, device=device).loss
