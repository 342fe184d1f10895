"""Chapter 27's GRPO loss against TRL's own (the peer).

TRL's ``GRPOTrainer._compute_loss`` (trl 1.16.0, ``trl/trainer/grpo_trainer.py``) is called
unbound on a minimal stand-in for the trainer that carries only the attributes it reads, with
its log-probability hook returning given per-token log-probabilities (so no model is run):
``loss_type="grpo"`` (each sequence's tokens averaged, then the sequences),
``importance_sampling_level="token"``, ``epsilon_low = epsilon_high = epsilon`` (0.2 and 0.1),
``beta`` 0 (no reference model) and 0.04 (the k3 term ``exp(ref - logp) - (ref - logp) - 1``),
old log-probabilities given (off-policy ratios, some clipped) and absent (TRL then uses
``logp.detach()``: ratio 1). On the same tensors, ``tfbook``'s ``grpo_loss`` (NumPy and torch)
must give TRL's loss, and the torch one TRL's gradient with respect to the log-probabilities.
The group advantages are compared with TRL's own standard deviation helper (``nanstd``, with
Bessel's correction, computed in float32 there: 1e-7) and the ``+ 1e-4`` of its ``_generate_and_score_completions``.

Two of these settings are **not TRL 1.16's defaults**, and the match holds only with them:
``loss_type="grpo"`` (the default is ``"dapo"``: tokens averaged over the whole batch; with
chapter 27's fixed 4-token answers the two differ only by a constant factor) and
``args.use_bias_correction_kl=False`` (the default ``True`` multiplies the k3 term by the
probability ratio, so that its gradient is the reverse KL's; ``tfbook``'s ``grpo_loss`` keeps the
original DeepSeekMath form by default, whose gradient is the forward KL's per token, as chapter 27
shows). ``grpo_loss(..., kl_correction=True)`` is compared with TRL's ``use_bias_correction_kl=True``
too (``correction``).
"""

from __future__ import annotations

import types
from collections import defaultdict

import numpy as np
import pytest
import torch

trl = pytest.importorskip("trl", reason="trl is not installed (requirements.txt pins it; the peer check "
                                        "of chapter 27's GRPO loss needs it)")

from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402
from trl.trainer.utils import nanstd  # noqa: E402

import tfbook.numpy.rl as N  # noqa: E402
import tfbook.torch.functional.rl as TF  # noqa: E402


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def reduce(self, x, reduction="sum"):
        return x

    def gather(self, x):
        return x

    gather_for_metrics = gather


def _trainer(logp, epsilon, beta, correction=False):
    """The attributes ``GRPOTrainer._compute_loss`` reads for ``loss_type='grpo'`` and no extras."""
    owner = types.SimpleNamespace(
        loss_type="grpo", beta=beta, epsilon_low=epsilon, epsilon_high=epsilon, top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, importance_sampling_level="token", use_vllm=False,
        vllm_importance_sampling_correction=False, aux_loss_enabled=False, _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1, model=types.SimpleNamespace(training=True),
        args=types.SimpleNamespace(use_bias_correction_kl=correction, delta=None),
        accelerator=_Accelerator(), _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    owner._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
    return owner


def _case(seed, B=8, L=6):
    g = torch.Generator().manual_seed(seed)
    logp = torch.log(torch.rand(B, L, generator=g, dtype=torch.float64) * 0.9 + 0.05)
    old = logp + 0.3 * torch.randn(B, L, generator=g, dtype=torch.float64)
    ref = logp + 0.5 * torch.randn(B, L, generator=g, dtype=torch.float64)
    rewards = torch.randint(0, 2, (B // 4, 4), generator=g).double()
    mask = (torch.rand(B, L, generator=g) < 0.8).long()
    mask[:, 0] = 1
    return logp, old, ref, rewards, mask


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("epsilon", [0.2, 0.1])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("on_policy", [False, True])
@pytest.mark.parametrize("correction", [False, True])
def test_grpo_loss_and_gradient_equal_trls(seed, epsilon, beta, on_policy, correction):
    logp, old, ref, rewards, mask = _case(seed)
    G = rewards.shape[1]
    std = nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G)
    trl_adv = (rewards.view(-1) - rewards.mean(dim=1).repeat_interleave(G)) / (std + 1e-4)
    adv = TF.group_advantages(rewards).reshape(-1)
    # nanstd's Bessel factor count / (count - 1) is a float32 tensor (int64 counts): 1e-7 relative
    assert torch.allclose(adv, trl_adv, atol=1e-7, rtol=0)
    adv = trl_adv  # from here the same tensors go to both losses
    old_used = logp.detach() if on_policy else old

    x_trl = logp.clone().requires_grad_()
    inputs = dict(prompt_ids=torch.zeros(8, 2, dtype=torch.long), prompt_mask=torch.ones(8, 2, dtype=torch.long),
                  completion_ids=torch.zeros_like(mask), completion_mask=mask, advantages=trl_adv)
    if not on_policy:
        inputs["old_per_token_logps"] = old
    if beta:
        inputs["ref_per_token_logps"] = ref
    loss_trl = GRPOTrainer._compute_loss(_trainer(x_trl, epsilon, beta, correction), None, inputs)
    loss_trl.backward()

    x = logp.clone().requires_grad_()
    loss = TF.grpo_loss(x, old_used, adv, mask, ref_logp=ref, epsilon=epsilon, beta=beta, kl_correction=correction)
    loss.backward()
    assert abs(loss.item() - loss_trl.item()) < 1e-14
    assert torch.allclose(x.grad, x_trl.grad, atol=1e-15, rtol=0)
    n = N.grpo_loss(logp.numpy(), old_used.numpy(), adv.numpy(), mask.numpy(), ref_logp=ref.numpy(),
                    epsilon=epsilon, beta=beta, kl_correction=correction)
    assert abs(n - loss_trl.item()) < 1e-14
