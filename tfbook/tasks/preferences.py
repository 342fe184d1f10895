"""Learning from preferences on chapter 24's instruction-tuned models (chapter 26).

The policy to improve, and the reference of every KL term, is chapter 24's fully fine-tuned
model (``instruct_full_seed{s}.pt``, the "SFT" model). The task is chapter 24's reversal
(``reverse: abram`` -> ``marba``), which the SFT models get right about half the time, and
whose answers a program checks.

**Pairs.** For each prompt, four answers (``RECIPE['samples']``) are sampled from the SFT model of seed ``s`` at
temperature 1 (:func:`sample`, float64, inverse-CDF draws from NumPy uniforms); the *chosen*
answer is the correct reversal (what the verifier accepts), the *rejected* one the first
sampled answer that is wrong (and ended with ``<|end|>``); a prompt whose four samples are
all right (or whose wrong ones never ended) gives no pair. Rejected answers are the model's own mistakes, not corruptions
made by a rule, so the pairs show the model what it actually gets wrong (a rule-made
corruption, such as two letters swapped, would be easy to tell apart from a model's answer
without learning anything about reversal).

**Prompts.** Training pairs use the first :data:`RECIPE` ``n_train`` words of chapter 24's
reversal training words (the SFT model has seen their reversals: preference data is
usually collected on prompts like those of fine-tuning); validation and test use the words
of chapter 24's validation and test sets (its reversal and counting items, 200 words each),
which no model here or in chapter 24 was trained to reverse.

**Models**, per seed ``s`` (trained on the pairs of seed ``s``, from the SFT model of seed ``s``):

* a Bradley-Terry reward model (:class:`RewardModel`): the SFT model with a scalar head on the
  final hidden state of ``<|end|>``, every weight trained on ``-log sigmoid(r(chosen) -
  r(rejected))``, its learning rate chosen from :data:`RM_LR_GRID` on validation pair accuracy
  (seed 0);
* DPO (:func:`tfbook.torch.functional.preferences.dpo_loss`) from the SFT model, reference =
  the SFT model: ``beta`` swept over :data:`BETAS` at the recipe's learning rate, chosen on
  validation exact match at seed 0; then the learning rate chosen from :data:`DPO_LR_GRID` on
  validation exact match at the chosen ``beta`` (seed 0); seeds 1 and 2 at the chosen
  ``beta`` and learning rate. The sweep over ``beta`` is also trained for seeds 1 and 2 (at the
  recipe's learning rate), so that its pattern has three seeds; no choice reads seeds 1-2.

Shipped (``tfbook/weights/``, float16): ``prefs_dpo_beta{b}_seed{s}.pt`` (the sweep; at seeds 1
and 2 the chosen ``beta`` is ``prefs_dpo_chosen_seed{s}.pt``), ``prefs_dpo_lr{lr}_seed0.pt``
(the learning-rate grid at the chosen ``beta``, the recipe's rate being the sweep's file),
``prefs_rm_seed{0,1,2}.pt`` and ``prefs_results.json`` (recipe, pair counts, the sweeps'
validation figures, the choices, training losses). Regenerated, in about three CPU-minutes, by::

    python -m tfbook.tasks.preferences                 # or --out DIR; --quick: 20 steps, seed 0
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..torch import assistant as A
from ..torch.functional import assistant as FA
from ..torch.functional import preferences as FP
from ..torch.functional.positions import embedding_lookup
from ..torch.models import DecoderLM, DecoderLMConfig
from ..torch.training import History
from ..torch.training import train as train_loop
from . import instruct
from ._common import Splits, cli, load_blob, load_decoder_lm, load_json, load_state, save_model, shipped, write_json

__all__ = ["RECIPE", "BETAS", "RM_LR_GRID", "DPO_LR_GRID", "SEEDS", "pair_accuracy", "ARTIFACTS", "RewardModel", "words", "data", "sample", "verify", "drawn",
           "pairs_from", "pairs", "exact_and_logprob",
           "encode", "sequence_logprobs", "sft_model", "train", "train_reward_model", "evaluate", "load_pretrained",
           "load_reward_model", "load_results", "save", "main"]

#: the shipped models' recipe; changing a number changes the weights (rerun the command).
#: ``lr`` (DPO's) and ``rm_lr`` are the values the grids chose (the command re-chooses them from
#: :data:`DPO_LR_GRID` and :data:`RM_LR_GRID`); the sweep over ``beta`` runs at ``lr``
RECIPE = dict(n_train=800, samples=4, max_new=12, T=32, steps=150, pairs=16, lr=1e-4, warmup=20,
              min_lr_ratio=0.1, grad_clip=1.0, rm_lr=1e-3, seed=0)
BETAS = (0.1, 0.3, 1.0, 3.0, 10.0)
RM_LR_GRID = (1e-4, 3e-4, 1e-3, 3e-3)  # the reward model's learning rate, chosen on validation pairs (seed 0)
DPO_LR_GRID = (3e-5, 1e-4, 3e-4, 1e-3)  # DPO's learning rate at the chosen beta, chosen on validation exact match (seed 0)
# (3e-3 was also tried once, seed 0 at beta = 1: validation exact match 0.020; not in the grid, not shipped)
SEEDS = (0, 1, 2)
ARTIFACTS = (tuple(f"prefs_dpo_beta{b:g}_seed0.pt" for b in BETAS)
             + tuple(f"prefs_dpo_chosen_seed{s}.pt" for s in (1, 2))
             + tuple(f"prefs_dpo_beta{b:g}_seed{s}.pt" for s in (1, 2) for b in BETAS if b != 1.0)
             + tuple(f"prefs_dpo_lr{lr:g}_seed0.pt" for lr in DPO_LR_GRID if lr != 1e-4)
             + tuple(f"prefs_rm_seed{s}.pt" for s in SEEDS) + ("prefs_results.json",))
_SPLIT_CODE = {"train": 0, "validation": 1, "test": 2}


# ----------------------------------------------------------------------------- data
def words(split: str) -> list[str]:
    """The words to reverse: ``train``, the first ``n_train`` of chapter 24's reversal training
    words; ``validation`` and ``test``, the words of chapter 24's reversal and counting items of
    that split (200; disjoint from every training word)."""
    if split not in _SPLIT_CODE:
        raise ValueError(f"split must be one of {tuple(_SPLIT_CODE)}, got {split!r}")
    d = instruct.data()
    if split == "train":
        return [p[len("reverse: "):] for p, _ in d.train["reverse"][:RECIPE["n_train"]]]
    part = getattr(d, split)
    return [p[len("reverse: "):] for p, _ in part["reverse"]] + [p.rsplit(" in ", 1)[1] for p, _ in part["count"]]


def data() -> Splits:
    """``Splits(train, validation, test)`` of the words to reverse (:func:`words`)."""
    return Splits(words("train"), words("validation"), words("test"))


def verify(answer: str, word: str) -> bool:
    """The verifier: the answer is exactly the word reversed."""
    return answer == word[::-1]


def sft_model(seed: int = 0) -> DecoderLM:
    """Chapter 24's shipped fully fine-tuned model of ``seed``: the reference and starting policy."""
    return instruct.load_pretrained("full", seed)[0]


@torch.no_grad()
def sample(model: DecoderLM, words_: list[str], n: int, seed: int, max_new: int = RECIPE["max_new"],
           batch: int = 2048) -> list[list[tuple[str, bool]]]:
    """``n`` answers per word at temperature 1, as ``(text, ended)`` (``ended``: the model wrote
    ``<|end|>`` within ``max_new`` tokens; template tokens inside an answer are dropped from the
    text and make it not ended). Computed in float64; each draw is ``searchsorted`` of a NumPy
    uniform (``default_rng(seed)``) in the cumulative probabilities, so the same weights give the
    same answers on any machine (up to float64 rounding at a draw's boundary)."""
    tok = instruct.tokenizer()
    rng = np.random.default_rng(seed)
    dtype0 = next(model.parameters()).dtype
    m = model.to(torch.float64)
    prompts = [instruct.prompt_ids(tok, f"reverse: {w}") for w in words_ for _ in range(n)]
    out = []
    try:
        for i in range(0, len(prompts), batch):
            chunk = prompts[i:i + batch]
            B, L = len(chunk), max(len(p) for p in chunk)
            ids = torch.zeros((B, L), dtype=torch.long)
            doc = torch.full((B, L), -1, dtype=torch.long)
            for j, p in enumerate(chunk):
                ids[j, L - len(p):] = torch.as_tensor(p)
                doc[j, L - len(p):] = 0
            written = [[] for _ in range(B)]
            ended = np.zeros(B, dtype=bool)
            live = torch.arange(B)                   # rows still writing: only they are run
            for _ in range(max_new):
                probs = torch.softmax(A.packed_logits(m, ids, doc)[:, -1], dim=-1)
                cdf = torch.cumsum(probs, dim=-1)
                u = torch.from_numpy(rng.random(B))[live][:, None] * cdf[:, -1:]  # one uniform per row and step
                nxt = torch.searchsorted(cdf, u).clamp(max=probs.shape[-1] - 1)[:, 0]
                for k, j in enumerate(live.tolist()):
                    t = int(nxt[k])
                    if t == tok.end_id:
                        ended[j] = True
                    else:
                        written[j].append(t)
                keep = torch.from_numpy(~ended[live.numpy()])
                if not bool(keep.any()):
                    break
                ids = torch.cat([ids, nxt[:, None]], dim=1)[keep]
                doc = torch.cat([doc, torch.zeros(len(live), 1, dtype=torch.long)], dim=1)[keep]
                live = live[keep]
            for j in range(B):
                clean = all(t < tok.chars.vocab_size for t in written[j])
                out.append((tok.decode([t for t in written[j] if t < tok.chars.vocab_size]), bool(ended[j] and clean)))
    finally:
        model.to(dtype0)
    return [out[k * n:(k + 1) * n] for k in range(len(words_))]


_DRAWN: dict = {}


def drawn(split: str, seed: int = 0) -> list[list[tuple[str, bool]]]:
    """The ``samples`` answers of the SFT model of ``seed`` to each word of ``split``
    (:func:`sample`, draws seeded by ``26000 + 10 * split + seed``)."""
    key = (split, seed)
    if key not in _DRAWN:
        if seed not in SEEDS:
            raise ValueError(f"seed must be one of {SEEDS}, got {seed!r}")
        _DRAWN[key] = sample(sft_model(seed), words(split), RECIPE["samples"],
                             seed=1000 * 26 + 10 * _SPLIT_CODE[split] + seed)
    return _DRAWN[key]


def pairs_from(words_: list[str], answers: list) -> list[tuple[str, str, str]]:
    """``(word, chosen, rejected)`` for each word with a wrong ended answer among ``answers``."""
    out = []
    for w, drawn_ in zip(words_, answers):
        wrong = [a for a, ended in drawn_ if ended and not verify(a, w)]
        if wrong:
            out.append((w, w[::-1], wrong[0]))
    return out


def pairs(split: str, seed: int = 0) -> list[tuple[str, str, str]]:
    """``(word, chosen, rejected)`` for each word of ``split`` on which the SFT model of
    ``seed`` wrote a wrong (ended) answer among its ``samples`` draws (:func:`drawn`): chosen =
    the correct reversal, rejected = the first wrong answer."""
    return pairs_from(words(split), drawn(split, seed))


def encode(word_answers: list[tuple[str, str]], T: int = RECIPE["T"]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(word, answer)`` conversations, one per row of ``T`` tokens: ``ids (B, T)`` and
    ``doc (B, T)`` (0 on the conversation, -1 on the padding)."""
    tok = instruct.tokenizer()
    convs = [instruct.encode_conversation(tok, f"reverse: {w}", a) for w, a in word_answers]
    if max(len(c) for c in convs) > T:
        raise ValueError(f"a conversation of {max(len(c) for c in convs)} tokens does not fit in rows of T={T}")
    ids = torch.zeros((len(convs), T), dtype=torch.long)
    doc = torch.full((len(convs), T), -1, dtype=torch.long)
    for i, c in enumerate(convs):
        ids[i, :len(c)] = torch.as_tensor(c)
        doc[i, :len(c)] = 0
    return ids, doc


def sequence_logprobs(model: DecoderLM, ids: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """``log pi(answer | prompt)`` per row (answer tokens and ``<|end|>``; the model's dtype)."""
    tok = instruct.tokenizer()
    y = FA.answer_targets(ids, doc, tok.assistant_id, tok.end_id)
    return FP.sequence_logprob(A.packed_logits(model, ids, doc), y)


# ----------------------------------------------------------------------------- models
class RewardModel(nn.Module):
    """A :class:`DecoderLM` with a scalar head: the reward of a conversation is
    ``w . h + b``, ``h`` the final (normed) hidden state at its last token (``<|end|>``)."""

    def __init__(self, lm: DecoderLM):
        super().__init__()
        self.lm = lm
        self.head = nn.Linear(lm.config.d_model, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
        m = self.lm
        mask = FA.document_mask(doc)[:, None]
        pos = FA.document_positions(doc).clamp(min=0)
        X = embedding_lookup(ids, m.W_E) + m.pos.weight[pos]
        for block in m.blocks:
            X = block(X, mask=mask)
        X = m.norm(X)
        last = (doc >= 0).sum(dim=1) - 1
        return self.head(X[torch.arange(ids.shape[0]), last])[:, 0]


def _pair_tensors(seed: int):
    P = pairs("train", seed)
    ids_c, doc_c = encode([(w, c) for w, c, _ in P])
    ids_r, doc_r = encode([(w, r) for w, _, r in P])
    return ids_c, doc_c, ids_r, doc_r


def _batch_fn(n_pairs: int):
    def batch_fn(generator):
        return (torch.randint(0, n_pairs, (RECIPE["pairs"],), generator=generator),)
    return batch_fn


def _schedule(lr: float, steps: int):
    return ("warmup_cosine", min(RECIPE["warmup"], steps), lr * RECIPE["min_lr_ratio"])


def train(beta: float = 0.1, seed: int = 0, steps: int | None = None, disable: bool = True,
          lr: float | None = None) -> tuple[DecoderLM, History]:
    """DPO from the SFT model of ``seed`` on the training pairs of ``seed``; reference = that
    SFT model (its log-probabilities computed once, in float64); ``lr`` defaults to the
    recipe's."""
    steps = RECIPE["steps"] if steps is None else int(steps)
    lr = RECIPE["lr"] if lr is None else float(lr)
    ids_c, doc_c, ids_r, doc_r = _pair_tensors(seed)
    ref = sft_model(seed).double()
    with torch.no_grad():
        ref_c, ref_r = sequence_logprobs(ref, ids_c, doc_c), sequence_logprobs(ref, ids_r, doc_r)
    torch.manual_seed(seed)
    policy = sft_model(seed).train()

    def loss_fn(m, idx):
        n = len(idx)
        ids, doc = torch.cat([ids_c[idx], ids_r[idx]]), torch.cat([doc_c[idx], doc_r[idx]])
        lp = sequence_logprobs(m, ids, doc)
        return FP.dpo_loss(lp[:n], lp[n:], ref_c[idx].float(), ref_r[idx].float(), beta)

    history = train_loop(policy, loss_fn, _batch_fn(len(ids_c)), steps, lr=lr, grad_clip=RECIPE["grad_clip"],
                         schedule=_schedule(lr, steps), seed=seed, threads=1, deterministic=True,
                         disable=disable, desc=f"dpo-beta{beta:g}")
    history.extra["recipe"] = dict(RECIPE, lr=lr, beta=beta, seed=seed, steps=steps, pairs_train=len(ids_c))
    return policy.eval(), history


def train_reward_model(seed: int = 0, steps: int | None = None, disable: bool = True, lr: float | None = None
                       ) -> tuple[RewardModel, History]:
    """The Bradley-Terry reward model of ``seed``: the SFT model of ``seed`` with a scalar head,
    every weight trained on the training pairs of ``seed``."""
    steps = RECIPE["steps"] if steps is None else int(steps)
    ids_c, doc_c, ids_r, doc_r = _pair_tensors(seed)
    torch.manual_seed(seed)
    rm = RewardModel(sft_model(seed)).train()

    def loss_fn(m, idx):
        n = len(idx)
        r = m(torch.cat([ids_c[idx], ids_r[idx]]), torch.cat([doc_c[idx], doc_r[idx]]))
        return FP.bradley_terry_loss(r[:n], r[n:])

    lr = RECIPE["rm_lr"] if lr is None else float(lr)
    history = train_loop(rm, loss_fn, _batch_fn(len(ids_c)), steps, lr=lr, grad_clip=RECIPE["grad_clip"],
                         schedule=_schedule(lr, steps), seed=seed, threads=1, deterministic=True,
                         disable=disable, desc="reward-model")
    history.extra["recipe"] = dict(RECIPE, rm_lr=lr, seed=seed, steps=steps, pairs_train=len(ids_c))
    return rm.eval(), history


@torch.no_grad()
def pair_accuracy(rm: RewardModel, pairs_: list[tuple[str, str, str]]) -> float:
    """The share of ``(word, chosen, rejected)`` pairs whose chosen answer gets the higher reward."""
    rc = rm(*encode([(w, c) for w, c, _ in pairs_]))
    rr = rm(*encode([(w, r) for w, _, r in pairs_]))
    return float((rc > rr).double().mean())


@torch.no_grad()
def exact_and_logprob(model: DecoderLM, words_: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Greedy exact match (0/1) and ``log pi(correct answer)`` per word, float64, teacher forced
    (:func:`tfbook.tasks.instruct.scores`)."""
    return instruct.scores(model, [(f"reverse: {w}", w[::-1]) for w in words_])


def evaluate(model: DecoderLM, split: str = "validation") -> float:
    """Greedy exact match of ``model`` on the reversal of ``split``'s words."""
    return float(np.mean(exact_and_logprob(model, words(split))[0]))


def load_results(folder=None) -> dict:
    """The shipped ``prefs_results.json``."""
    return load_json("prefs_results.json", folder)


def load_pretrained(seed: int = 0, beta: float | None = None, folder=None, lr: float | None = None
                    ) -> tuple[DecoderLM, History]:
    """A shipped DPO policy (float32, eval mode): ``beta`` one of :data:`BETAS` (the sweep, every
    seed, at the recipe's learning rate), or ``None`` for the chosen ``beta``; ``lr`` one of
    :data:`DPO_LR_GRID` (seed 0 at the chosen ``beta`` only), or ``None`` for the recipe's rate,
    which is the chosen one."""
    if seed not in SEEDS:
        raise ValueError(f"seed must be one of {SEEDS}, got {seed!r}")
    chosen_beta = load_results(folder)["chosen_beta"]
    beta = chosen_beta if beta is None else beta
    lr = RECIPE["lr"] if lr is None else lr          # the chosen rate (the command checks it is the recipe's)
    if beta not in BETAS:
        raise ValueError(f"the sweep has beta in {BETAS}, got beta={beta!r}")
    if lr not in DPO_LR_GRID or (lr != RECIPE["lr"] and (seed != 0 or beta != chosen_beta)):
        raise ValueError(f"the learning-rate grid has lr in {DPO_LR_GRID} at seed 0 and beta={chosen_beta:g}; "
                         f"every other run uses lr={RECIPE['lr']:g}; got lr={lr!r}, beta={beta!r}, seed={seed!r}")
    if seed != 0 and beta == chosen_beta:
        name = f"prefs_dpo_chosen_seed{seed}.pt"
    elif lr != RECIPE["lr"]:
        name = f"prefs_dpo_lr{lr:g}_seed0.pt"
    else:
        name = f"prefs_dpo_beta{beta:g}_seed{seed}.pt"
    return load_decoder_lm(name, None if folder is None else Path(folder) / name)


def load_reward_model(seed: int = 0, folder=None) -> tuple[RewardModel, History]:
    """A shipped reward model (float32, eval mode)."""
    if seed not in SEEDS:
        raise ValueError(f"seed must be one of {SEEDS}, got {seed!r}")
    name = f"prefs_rm_seed{seed}.pt"
    blob = load_blob(shipped(name) if folder is None else Path(folder) / name)
    rm = RewardModel(DecoderLM(DecoderLMConfig(**blob["config"])))
    return load_state(rm, blob["state_dict"]), History.from_dict(blob["history"])


def save(model, history: History, folder, name: str) -> Path:
    """Write ``model`` (a DPO policy or a :class:`RewardModel`) as ``folder/name`` (float16)."""
    if isinstance(model, RewardModel):
        path = Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().half().clone() for k, v in model.state_dict().items()}
        from dataclasses import asdict
        torch.save({"config": asdict(model.lm.config), "state_dict": state, "history": history.as_dict()}, path)
        return path
    return save_model(Path(folder) / name, model, history)


def main(argv=None) -> None:  # pragma: no cover - the command that writes the shipped artifacts
    def add(parser):
        parser.add_argument("--quick", action="store_true", help="20 steps, seed 0 only (needs --out)")

    def run(out: Path, args):
        steps = 20 if args.quick else RECIPE["steps"]
        seeds = (0,) if args.quick else SEEDS
        t0 = time.process_time()
        res = {"recipe": RECIPE, "betas": list(BETAS), "pairs": {}, "sweep": {}, "runs": {}}
        for s in seeds:
            res["pairs"][str(s)] = {sp: len(pairs(sp, s)) for sp in ("train", "validation", "test")}
            print(f"seed {s}: pairs {res['pairs'][str(s)]} ({time.process_time() - t0:.0f} s CPU)", flush=True)
        # the held-out draws ship: the chapter builds its pairs and best-of-N from them
        res["drawn"] = {str(s): {sp: drawn(sp, s) for sp in ("validation", "test")} for s in seeds}
        sft_val = evaluate(sft_model(0))
        res["sft_val_exact"] = sft_val

        def run_dpo(b, s, lr, name):
            m, h = train(b, s, steps, lr=lr)
            save(m, h, out, name)
            m = load_decoder_lm("x", out / name)[0]
            fig = {"val_exact": evaluate(m), "final_loss": float(np.mean(h.loss[-20:]))}
            print(f"{name}: {fig} ({time.process_time() - t0:.0f} s CPU)", flush=True)
            return fig

        for b in BETAS:
            res["sweep"][f"{b:g}"] = run_dpo(b, 0, RECIPE["lr"], f"prefs_dpo_beta{b:g}_seed0.pt")
        chosen = max(BETAS, key=lambda b: res["sweep"][f"{b:g}"]["val_exact"])  # ties: the smaller beta
        res["chosen_beta"] = chosen
        # DPO's learning rate at the chosen beta (seed 0): the recipe's rate is the sweep's run
        res["dpo_lr_grid"] = {f"{lr:g}": (res["sweep"][f"{chosen:g}"]["val_exact"] if lr == RECIPE["lr"] else
                                          run_dpo(chosen, 0, lr, f"prefs_dpo_lr{lr:g}_seed0.pt")["val_exact"])
                              for lr in DPO_LR_GRID}
        dpo_lr = max(DPO_LR_GRID, key=lambda lr: res["dpo_lr_grid"][f"{lr:g}"])   # ties: the smaller rate
        res["dpo_lr"] = dpo_lr
        if dpo_lr != RECIPE["lr"]:
            raise SystemExit(f"validation chose DPO's lr {dpo_lr:g}: set RECIPE['lr'] to it and rerun")
        # the sweep at seeds 1 and 2 (its pattern with three seeds; no choice reads it)
        res["sweep_seeds"] = {"0": res["sweep"]}
        for s in seeds:
            if s != 0:
                res["sweep_seeds"][str(s)] = {
                    f"{b:g}": run_dpo(b, s, RECIPE["lr"], f"prefs_dpo_chosen_seed{s}.pt" if b == chosen
                                      else f"prefs_dpo_beta{b:g}_seed{s}.pt") for b in BETAS}
                res["runs"][f"dpo_seed{s}"] = {"final_loss": res["sweep_seeds"][str(s)][f"{chosen:g}"]["final_loss"]}
        for s in seeds:
            if s == 0:  # the reward model's learning rate, chosen on validation pair accuracy
                grid = {lr: train_reward_model(0, steps, lr=lr) for lr in RM_LR_GRID}
                res["rm_grid"] = {f"{lr:g}": pair_accuracy(m.double(), pairs("validation", 0)) for lr, (m, _) in grid.items()}
                rm_lr = max(RM_LR_GRID, key=lambda lr: res["rm_grid"][f"{lr:g}"])
                res["rm_lr"] = rm_lr
                print(f"reward model grid {res['rm_grid']} ({time.process_time() - t0:.0f} s CPU)", flush=True)
                rm, h = grid[rm_lr]
                rm.float()
            else:
                rm, h = train_reward_model(s, steps, lr=rm_lr)
            save(rm, h, out, f"prefs_rm_seed{s}.pt")
            res["runs"][f"rm_seed{s}"] = {"final_loss": float(np.mean(h.loss[-20:]))}
            print(f"seed {s} done ({time.process_time() - t0:.0f} s CPU)", flush=True)
        res["cpu_seconds"] = time.process_time() - t0
        write_json(out / "prefs_results.json", res)

    cli(__doc__, run, add, argv)


if __name__ == "__main__":  # pragma: no cover
    main()
