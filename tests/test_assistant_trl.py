"""Chapter 24's masking, packing and loss against TRL's own (the peer).

TRL's ``SFTTrainer`` turns prompt-completion examples into labels with every prompt token set
to -100 (``completion_only_loss``), packs them into rows of ``max_length`` (best-fit
decreasing, keeping each conversation whole), and its padding-free collator flattens the rows,
restarts the position ids at every conversation and masks the label at each conversation's
first token; the loss is transformers' causal-LM loss (labels shifted by one, -100 ignored).
Here the same conversations go through TRL's own preparation code and through
:mod:`tfbook`'s ``answer_targets`` / ``document_positions`` / ``masked_mean_nll``, on the same
packed rows and the same logits: the targets, the positions and the loss must agree.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

trl = pytest.importorskip("trl", reason="trl is not installed (requirements.txt pins it; the peer check "
                                        "of chapter 24's masking needs it)")
datasets = pytest.importorskip("datasets", reason="trl's dataset preparation needs datasets")

from trl import SFTConfig, SFTTrainer  # noqa: E402
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling  # noqa: E402
from transformers.loss.loss_utils import ForCausalLMLoss  # noqa: E402

import tfbook.numpy.assistant as N  # noqa: E402
import tfbook.torch.functional.assistant as TF  # noqa: E402
from tfbook.tasks import instruct  # noqa: E402
from tfbook.torch import assistant as A  # noqa: E402
from tfbook.torch.models import DecoderLM  # noqa: E402


def conversations(n=40, seed=0):
    """Chapter 24's own conversations (the instruction set's training items), as ids, with the
    prompt length (``<|user|> ... <|assistant|>``) of each."""
    tok = instruct.tokenizer()
    rng = np.random.default_rng(seed)
    items = [(t, i) for t in instruct.TASKS for i in range(len(instruct.data().train[t]))]
    out = []
    for j in rng.permutation(len(items))[:n]:
        t, i = items[j]
        prompt, answer = instruct.data().train[t][i]
        out.append((instruct.encode_conversation(tok, prompt, answer), len(instruct.prompt_ids(tok, prompt))))
    return tok, out


def trl_prepare(convs, tmp_path, max_length=64):
    """TRL's preparation of already-tokenized prompt-completion examples: labels from the
    completion mask, then packing (bfd); returns the packed examples."""
    ds = datasets.Dataset.from_dict({
        "input_ids": [c for c, _ in convs],
        "completion_mask": [[0] * p + [1] * (len(c) - p) for c, p in convs],
    })
    args = SFTConfig(output_dir=str(tmp_path), max_length=max_length, packing=True, packing_strategy="bfd",
                     completion_only_loss=True, shuffle_dataset=False, dataset_num_proc=None, report_to="none",
                     bf16=False, use_cpu=True)
    owner = types.SimpleNamespace(completion_only_loss=True)  # what _prepare_dataset reads from the trainer
    packed = SFTTrainer._prepare_dataset(owner, ds, None, args, True, None, "train")
    return [packed[i] for i in range(len(packed))]


def test_answer_targets_and_loss_equal_trl(tmp_path):
    tok, convs = conversations()
    packed = trl_prepare(convs, tmp_path)
    assert len(packed) < len(convs)  # several conversations per row
    T = 64
    # the same packed rows in tfbook's layout: ids and a conversation index per token
    ids = np.zeros((len(packed), T), dtype=np.int64)
    doc = np.full((len(packed), T), -1, dtype=np.int64)
    for r, ex in enumerate(packed):
        L = len(ex["input_ids"])
        ids[r, :L] = ex["input_ids"]
        doc[r, :L] = np.repeat(np.arange(len(ex["seq_lengths"])), ex["seq_lengths"])
    y = N.answer_targets(ids, doc, tok.assistant_id, tok.end_id)
    assert np.array_equal(y, TF.answer_targets(torch.from_numpy(ids), torch.from_numpy(doc),
                                               tok.assistant_id, tok.end_id).numpy())

    # TRL's collator, padding free: one flat row, position ids restarting per conversation
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(packed)
    flat_ids, labels, pos = batch["input_ids"][0], batch["labels"][0], batch["position_ids"][0]
    real = doc >= 0
    assert torch.equal(flat_ids, torch.from_numpy(ids[real]))
    assert torch.equal(pos, torch.from_numpy(N.document_positions(doc)[real]))
    # TRL's labels are unshifted (label t is predicted at t - 1): tfbook's target at t is TRL's label at t + 1
    trl_next = torch.full_like(labels, -100)
    trl_next[:-1] = labels[1:]
    ours = torch.from_numpy(y[real])
    # the last token of a row has no next token in the row; in the flat row TRL's next label is the
    # next conversation's first token, which the collator masks: the two agree everywhere
    assert torch.equal(ours, trl_next), (ours != trl_next).nonzero()
    assert int((ours != -100).sum()) == sum(len(c) - p for c, p in convs)  # every answer token and <|end|>

    # the loss: tfbook's masked mean over the packed logits == transformers' causal-LM loss
    torch.manual_seed(0)
    cfg = instruct.base_model().config
    model = DecoderLM(cfg).double().eval()
    logits = A.packed_logits(model, torch.from_numpy(ids), torch.from_numpy(doc))
    ours_loss = TF.masked_mean_nll(logits, torch.from_numpy(y))
    theirs = ForCausalLMLoss(logits[torch.from_numpy(real)][None], labels[None], vocab_size=cfg.vocab_size)
    # transformers computes its loss in float32 (it upcasts the logits with .float()): 1e-6
    assert abs(ours_loss.item() - theirs.item()) < 1e-6, (ours_loss.item(), theirs.item())
    assert abs(N.masked_mean_nll(logits.detach().numpy(), y) - ours_loss.item()) < 1e-12  # float64 twins
