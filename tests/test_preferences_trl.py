"""Chapter 26's DPO loss against TRL's own (the peer).

TRL 1.16's ``DPOTrainer._compute_loss`` takes a batch ``[chosen; rejected]`` with a completion
mask, asks the model for per-token log-probabilities of the completion tokens (its fused LM
head), sums them per sequence, subtracts the reference's (precomputed here, as with
``precompute_ref_log_probs=True``) and applies ``-logsigmoid(beta * delta)``. Here that method
itself runs, on a stand-in for ``self`` holding the attributes it reads and a model that returns
the per-token log-probabilities of one of the book's models; the same log-probabilities go
through :func:`tfbook.numpy.preferences.dpo_loss` and its PyTorch twin. The losses, and their
gradients with respect to the policy's logits, must agree.
"""

from __future__ import annotations

import collections
import types

import numpy as np
import pytest
import torch

trl = pytest.importorskip("trl", reason="trl is not installed (requirements.txt pins it; the peer check "
                                        "of chapter 26's DPO loss needs it)")

from trl.trainer.dpo_trainer import DPOTrainer  # noqa: E402

import tfbook.numpy.preferences as N  # noqa: E402
import tfbook.torch.functional.preferences as TF  # noqa: E402


def trl_owner(beta):
    """What ``_compute_loss`` reads from the trainer, for one process on the CPU, standard DPO."""
    acc = types.SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x, gather=lambda x: x)
    return types.SimpleNamespace(
        model=types.SimpleNamespace(training=True), accelerator=acc, aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=["sigmoid"], loss_weights=[1.0],
        beta=beta, use_weighting=False, label_smoothing=0.0, _metrics=collections.defaultdict(lambda: collections.defaultdict(list)),
        _total_train_tokens=0, _tp_size=1)


class TokenLogps(torch.nn.Module):
    """Stands in for a model with TRL's fused LM head: given ``input_ids`` and ``labels`` (prompt
    tokens -100), returns ``log_probs (B, T-1)`` of each next token, 0 where not a label."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits  # (B, T, V), the policy's, with gradient

    def forward(self, input_ids, labels, attention_mask=None, fused_lm_head=True, use_cache=False, **kw):
        logp = torch.log_softmax(self.logits[:, :-1], dim=-1)
        nxt = labels[:, 1:]
        keep = nxt != -100
        lp = logp.gather(-1, nxt.clamp(min=0)[..., None])[..., 0]
        lp = torch.where(keep, lp, torch.zeros_like(lp))
        top1 = self.logits[:, :-1].argmax(-1) == nxt.clamp(min=0)
        return types.SimpleNamespace(log_probs=lp, entropy=torch.zeros_like(lp), mean_logits=self.logits[:, :-1].mean(-1),
                                     is_top1=top1)


@pytest.mark.parametrize("beta", [0.05, 0.5, 2.0])
def test_dpo_loss_equals_trl(beta):
    g = torch.Generator().manual_seed(0)
    n, T, V = 6, 12, 11
    ids = torch.randint(0, V, (2 * n, T), generator=g)
    prompt = torch.randint(3, 7, (2 * n,), generator=g)  # prompt lengths
    length = prompt + torch.randint(2, 5, (2 * n,), generator=g)  # then the completion, then padding
    t = torch.arange(T)
    completion_mask = ((t >= prompt[:, None]) & (t < length[:, None])).long()
    attention_mask = (t < length[:, None]).long()
    logits = torch.randn(2 * n, T, V, generator=g, dtype=torch.float64, requires_grad=True)
    ref_logits = torch.randn(2 * n, T, V, generator=g, dtype=torch.float64)

    # tfbook: targets at t are the tokens at t + 1 that are completion tokens
    targets = torch.full((2 * n, T), -100, dtype=torch.long)
    targets[:, :-1] = torch.where(completion_mask[:, 1:] == 1, ids[:, 1:], torch.full_like(ids[:, 1:], -100))
    lp = TF.sequence_logprob(logits, targets)
    ref_lp = TF.sequence_logprob(ref_logits, targets)
    ours = TF.dpo_loss(lp[:n], lp[n:], ref_lp[:n], ref_lp[n:], beta)
    (g_ours,) = torch.autograd.grad(ours, logits)

    inputs = {"input_ids": ids, "attention_mask": attention_mask, "completion_mask": completion_mask,
              "ref_chosen_logps": ref_lp[:n].detach(), "ref_rejected_logps": ref_lp[n:].detach()}
    theirs = DPOTrainer._compute_loss(trl_owner(beta), TokenLogps(logits), inputs, False)
    (g_theirs,) = torch.autograd.grad(theirs, logits)
    assert abs(ours.item() - theirs.item()) < 1e-12, (ours.item(), theirs.item())
    assert torch.allclose(g_ours, g_theirs, atol=1e-14)
    numpy_loss = N.dpo_loss(lp[:n].detach().numpy(), lp[n:].detach().numpy(), ref_lp[:n].numpy(), ref_lp[n:].numpy(), beta)
    assert abs(numpy_loss - ours.item()) < 1e-12
