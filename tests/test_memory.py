"""tfbook.memory: the counted memory of training equals what autograd saves, and bounds the measured peak."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tfbook import memory as mem
from tfbook.torch.models import DecoderLM, DecoderLMConfig

CONFIGS = [(3, 5, 12, 2, 40, 1, 7, True), (2, 16, 24, 3, 48, 3, 30, False), (4, 32, 32, 4, 128, 2, 65, True)]


def _setup(B, T, D, H, D_ff, L, V, tie):
    torch.manual_seed(0)
    cfg = DecoderLMConfig(vocab_size=V, block_size=T, d_model=D, num_heads=H, num_layers=L, d_ff=D_ff,
                          tie_weights=tie)
    model = DecoderLM(cfg)
    x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    return model, x, y


@pytest.mark.parametrize("ck", [False, True])
@pytest.mark.parametrize("shape", CONFIGS)
def test_counted_activations_equal_saved_tensors_exactly(shape, ck):
    B, T, D, H, D_ff, L, V, tie = shape
    model, x, y = _setup(*shape)

    def f():
        logits = mem.forward_checkpointed(model, x) if ck else model(x)
        return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))

    _, saved = mem.saved_tensor_bytes(f, exclude=list(model.parameters()))
    assert saved == mem.decoder_lm_activation_bytes(B, T, D, H, D_ff, L, V, checkpoint=ck)["total"]


@pytest.mark.parametrize("shape", CONFIGS)
def test_checkpointed_forward_gives_the_same_logits_and_gradients(shape):
    model, x, y = _setup(*shape)
    model = model.double()
    V = model.config.vocab_size
    grads = []
    for fwd in (model, lambda i: mem.forward_checkpointed(model, i)):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(fwd(x).reshape(-1, V), y.reshape(-1)).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert max((a - b).abs().max().item() for a, b in zip(*grads)) < 1e-12   # float64 round-off


@pytest.mark.parametrize("ck", [False, True])
@pytest.mark.parametrize("shape", CONFIGS)
def test_profiled_peak_lies_between_the_counted_bounds(shape, ck):
    B, T, D, H, D_ff, L, V, tie = shape
    model, x, y = _setup(*shape)
    n = sum(p.numel() for p in model.parameters())
    c = mem.decoder_lm_activation_bytes(B, T, D, H, D_ff, L, V, checkpoint=ck)

    def step():
        logits = mem.forward_checkpointed(model, x) if ck else model(x)
        F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)).backward()

    _, peak = mem.profiled_peak_bytes(step)
    low = c["recomputed_layer"] if ck else c["total"]
    high = c["total"] + (c["recomputed_layer"] if ck else 0) + 4 * n + 4 * B * T * V
    assert low <= peak <= high


def test_state_bytes_adamw_is_16_bytes_per_float32_parameter():
    assert mem.state_bytes(10)["total"] == 160
    assert mem.state_bytes(10, "bfloat16", "sgd")["total"] == 40


@pytest.mark.parametrize("call,arg", [
    (lambda: mem.state_bytes(-1), "n_params"),
    (lambda: mem.state_bytes(3, optimizer="lion"), "optimizer"),
    (lambda: mem.decoder_lm_activation_bytes(2, 0, 8, 2, 16, 1, 5), "T"),
    (lambda: mem.saved_tensor_bytes(3), "fn"),
    (lambda: mem.profiled_peak_bytes(None), "fn"),
])
def test_bad_input_names_the_argument(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()
