"""tfbook.torch.training: the one training loop (fast: tiny models, a few steps each).

Exact comparisons (``==``) where two runs do the same float operations in the same order
on the same machine (a seeded loop is deterministic); ``1e-12`` for learning rates that
are closed forms evaluated in two ways (float64 round-off).
"""

import math

import pytest
import torch
from torch import nn

from tfbook.torch.models import DecoderLM, DecoderLMConfig, lm_loss, train_steps
from tfbook.torch.training import History, lr_schedule, train

DATA = torch.arange(200) % 7


def tiny(seed=0):
    torch.manual_seed(seed)
    return DecoderLM(DecoderLMConfig(vocab_size=7, block_size=8, d_model=8, num_heads=2,
                                     num_layers=1, d_ff=16))


def batch_fn(g):
    start = torch.randint(0, DATA.numel() - 9, (4,), generator=g)
    w = DATA[start[:, None] + torch.arange(9)]
    return w[:, :-1], w[:, 1:]


def reference_loop(model, steps, lr, seed, weight_decay=0.0, clip=1.0):
    """AdamW written out independently of tfbook: what the loop must do, step by step."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for _ in range(steps):
        x, y = batch_fn(g)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses


def test_train_equals_an_independent_adamw_loop(one_thread):
    h = train(tiny(), lm_loss, batch_fn, 6, lr=1e-2, weight_decay=0.1, seed=3, disable=True)
    assert h.loss == reference_loop(tiny(), 6, 1e-2, 3, weight_decay=0.1)
    assert h.lr == [1e-2] * 6 and h.eval == [] and h.best_step is None and not h.stopped_early
    # train_steps is the same loop
    assert train_steps(tiny(), lm_loss, batch_fn, 6, lr=1e-2, weight_decay=0.1, seed=3,
                       disable=True) == h.loss
    # the check can fail: another seed draws other batches
    assert reference_loop(tiny(), 6, 1e-2, 4, weight_decay=0.1) != h.loss


def test_same_seed_same_losses(one_thread):
    runs = [train(tiny(), lm_loss, batch_fn, 5, seed=1, disable=True).loss for _ in range(2)]
    assert runs[0] == runs[1]
    assert train(tiny(), lm_loss, batch_fn, 5, seed=2, disable=True).loss != runs[0]


def test_schedules_closed_forms():
    lr, steps = 0.1, 11
    assert lr_schedule("constant", lr, steps) == [lr] * steps
    wc = lr_schedule(("warmup_cosine", 3, 0.01), lr, steps)
    assert wc[:3] == pytest.approx([lr / 3, 2 * lr / 3, lr], abs=1e-12)
    assert wc[-1] == pytest.approx(0.01, abs=1e-12)  # reaches min_lr at the last step
    mid = 2 + (steps - 1 - 2) // 2  # half way from the peak (index 2) to the end: the mean
    assert wc[mid] == pytest.approx((lr + 0.01) / 2, abs=1e-12)
    assert all(a >= b for a, b in zip(wc[2:], wc[3:]))  # non-increasing after warm-up
    hl = lr_schedule(("hold_linear", 6), lr, 10)
    assert hl == pytest.approx([lr] * 6 + [lr * (10 - s) / 4 for s in range(6, 10)], abs=1e-12)
    # one_cycle is PyTorch's OneCycleLR
    opt = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=lr)
    ref = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.3)
    expected = []
    for _ in range(steps):
        expected.append(opt.param_groups[0]["lr"])
        opt.step()
        ref.step()
    assert lr_schedule(("one_cycle", 0.3), lr, steps) == expected


@pytest.mark.parametrize("schedule", ["constant", ("warmup_cosine", 2, 1e-4), ("hold_linear", 3),
                                      ("one_cycle", 0.3)])
def test_history_records_the_rate_each_step_used(schedule, one_thread):
    h = train(tiny(), lm_loss, batch_fn, 6, lr=5e-3, schedule=schedule, disable=True)
    assert h.lr == pytest.approx(lr_schedule(schedule, 5e-3, 6), abs=1e-12)
    assert len(h.loss) == 6


def test_schedule_changes_the_steps(one_thread):
    flat = train(tiny(), lm_loss, batch_fn, 4, lr=1e-2, disable=True).loss
    warm = train(tiny(), lm_loss, batch_fn, 4, lr=1e-2, schedule=("warmup_cosine", 3, 0.0),
                 disable=True).loss
    assert flat[0] == warm[0] and flat[1:] != warm[1:]  # same first loss, other updates


def test_evaluations_early_stopping_and_keep_best(one_thread):
    scores = iter([5.0, 4.0, 3.0, 3.5, 3.2, 3.9, 1.0])  # best at the 3rd evaluation (step 4)
    states = {}

    def remember(step, model, history):
        states[step] = {k: v.clone() for k, v in model.state_dict().items()}

    model = tiny()
    h = train(model, lm_loss, batch_fn, 20, eval_fn=lambda m: next(scores), eval_every=2,
              patience=3, keep_best=True, disable=True, callbacks=[remember])
    assert h.eval_step == [0, 2, 4, 6, 8, 10] and h.eval == [5.0, 4.0, 3.0, 3.5, 3.2, 3.9]
    assert h.best_step == 4 and h.best_eval == 3.0 and h.stopped_early and len(h.loss) == 10
    for k, v in model.state_dict().items():  # the weights after step 4, restored
        assert torch.equal(v, states[4][k]), k
    assert any(not torch.equal(v, states[10][k]) for k, v in model.state_dict().items())
    # maximize: the highest score wins; without keep_best the last weights stay
    scores = iter([0.1, 0.5, 0.3])
    model = tiny()
    h = train(model, lm_loss, batch_fn, 4, eval_fn=lambda m: next(scores), eval_every=2,
              maximize=True, disable=True, callbacks=[remember])
    assert h.best_step == 2 and h.best_eval == 0.5 and not h.stopped_early
    assert all(torch.equal(v, states[4][k]) for k, v in model.state_dict().items())


def test_eval_runs_in_eval_mode_without_grad(one_thread):
    seen = []

    def probe(m):
        seen.append((m.training, torch.is_grad_enabled()))
        return 0.0

    model = tiny()
    train(model, lm_loss, batch_fn, 2, eval_fn=probe, eval_every=1, disable=True)
    assert seen == [(False, False)] * 3 and not model.training


def test_callback_can_stop():
    h = train(tiny(), lm_loss, batch_fn, 10, disable=True, callbacks=[lambda s, m, h: s == 3])
    assert len(h.loss) == 3 and h.stopped_early


def test_threads_and_determinism_are_pinned_and_restored():
    n, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    inside = []
    train(tiny(), lm_loss, batch_fn, 1, threads=1, deterministic=True, disable=True,
          callbacks=[lambda *a: inside.append((torch.get_num_threads(),
                                               torch.are_deterministic_algorithms_enabled()))])
    assert inside == [(1, True)]
    assert torch.get_num_threads() == n and torch.are_deterministic_algorithms_enabled() == det


def test_history_dict_round_trip():
    h = History(loss=[1.0, 0.5], lr=[0.1, 0.1], eval_step=[0], eval=[2.0], best_step=0, best_eval=2.0,
                extra={"recipe": {"steps": 2}})
    assert History.from_dict(h.as_dict()) == h
    old = {"loss": [1.0], "eval_step": [], "eval": [], "best_step": 0, "recipe": {"a": 1}}
    h2 = History.from_dict(old)  # the format the chapter-12 weights were saved in
    assert h2["loss"] == [1.0] and h2["recipe"] == {"a": 1} and h2.best_step == 0 and "recipe" in h2


def test_bad_arguments():
    m = tiny()
    with pytest.raises(ValueError, match="steps"):
        train(m, lm_loss, batch_fn, 0)
    with pytest.raises(ValueError, match="schedule"):
        train(m, lm_loss, batch_fn, 3, schedule="cosine")
    with pytest.raises(ValueError, match="schedule 'warmup_cosine'"):
        train(m, lm_loss, batch_fn, 3, schedule=("warmup_cosine", 5, 0.0))
    with pytest.raises(ValueError, match="eval_every"):
        train(m, lm_loss, batch_fn, 3, eval_fn=lambda m: 0.0)
    with pytest.raises(ValueError, match="need eval_fn"):
        train(m, lm_loss, batch_fn, 3, patience=2)
    with pytest.raises(ValueError, match="pct_start"):
        train(m, lm_loss, batch_fn, 3, schedule=("one_cycle", 2))
    with pytest.raises(ValueError, match="lr"):
        train(m, lm_loss, batch_fn, 3, lr=0.0)
    with pytest.raises(ValueError, match="loss became nan after 0 steps"):
        train(m, lambda model, x, y: torch.tensor(math.nan), batch_fn, 3, disable=True)


# ---------------------------------------------------------------------------------------
# What the long runs of the tasks need (tfbook.tasks.prose.train_long): a schedule as a
# function, autocast, a loss read every few steps, evaluation only during/after training,
# a time budget
# ---------------------------------------------------------------------------------------


def test_callable_schedule_sets_each_step_and_equals_a_named_one(one_thread):
    rates = lr_schedule(("warmup_cosine", 2, 1e-4), 1e-2, 6)
    h = train(tiny(), lm_loss, batch_fn, 6, lr=1e-2, schedule=lambda s, n: rates[s], disable=True)
    named = train(tiny(), lm_loss, batch_fn, 6, lr=1e-2, schedule=("warmup_cosine", 2, 1e-4), disable=True)
    assert h.lr == rates and h.loss == named.loss
    assert lr_schedule(lambda s, n: 0.1 * (n - s), 1.0, 3) == [0.30000000000000004, 0.2, 0.1]
    # the schedule sees the run's length
    seen = []
    train(tiny(), lm_loss, batch_fn, 3, schedule=lambda s, n: seen.append((s, n)) or 1e-3, disable=True)
    assert seen == [(0, 3), (1, 3), (2, 3)]


def test_loss_every_reads_fewer_losses_and_changes_nothing_else(one_thread):
    every = train(tiny(), lm_loss, batch_fn, 7, lr=1e-2, seed=3, disable=True)
    m = tiny()
    some = train(m, lm_loss, batch_fn, 7, lr=1e-2, seed=3, disable=True, loss_every=3)
    assert some.loss == [every.loss[2], every.loss[5], every.loss[6]]  # steps 3, 6 and the last
    assert some.lr == every.lr and len(some.lr) == 7 and not some.stopped_early
    with pytest.raises(ValueError, match="loss_every"):
        train(m, lm_loss, batch_fn, 3, loss_every=0)


def test_eval_first_and_eval_last(one_thread):
    h = train(tiny(), lm_loss, batch_fn, 5, eval_fn=lambda m: 1.0, eval_every=2, disable=True,
              eval_first=False, eval_last=True)
    assert h.eval_step == [2, 4, 5]
    h = train(tiny(), lm_loss, batch_fn, 5, eval_fn=lambda m: 1.0, eval_every=2, disable=True)
    assert h.eval_step == [0, 2, 4]  # the defaults: before the first step, every eval_every steps


def test_autocast_runs_the_loss_under_it(one_thread):
    dtypes = []

    def loss_fn(model, x, y):
        logits = model(x)
        dtypes.append(logits.dtype)
        return lm_loss(model, x, y)

    train(tiny(), loss_fn, batch_fn, 1, disable=True, autocast=dict(device_type="cpu", dtype=torch.bfloat16))
    train(tiny(), loss_fn, batch_fn, 1, disable=True)
    assert dtypes == [torch.bfloat16, torch.float32]


def test_time_budget_fixes_the_steps_from_the_measured_speed(one_thread, monkeypatch):
    import tfbook.torch.training as training

    clock = iter(range(10**6))  # every reading of the loop's clock is one second later
    monkeypatch.setattr(training, "_clock", lambda: float(next(clock)))
    monkeypatch.setattr(training, "BUDGET_STEPS", (2, 4))
    h = train(tiny(), lm_loss, batch_fn, 100, disable=True, time_budget=8.0)
    # start at 0 s, step 2 at 1 s, step 4 at 2 s: 1/2 s a step, 6 s left, 0.9 * 6 / 0.5 = 10.8 -> 10 steps more
    assert h.extra["steps"] == 14 and len(h.lr) == 14 and len(h.loss) == 14 and not h.stopped_early
    # never more than the steps asked for, and at least one step after the measurement
    assert train(tiny(), lm_loss, batch_fn, 6, disable=True, time_budget=1e9).extra["steps"] == 6
    with pytest.raises(ValueError, match="time_budget"):
        train(tiny(), lm_loss, batch_fn, 3, time_budget=0)


# Where an optimizer may step (issue 39): the one loop (and lr_schedule's OneCycleLR trace), the
# optimiser classes (MuonAdamW steps its inner AdamW), the parallel engines that step per process,
# and chapter 13's dynamic evaluation (one Adam step per segment while it scores).
STEP_ALLOWED = {"tfbook/torch/training.py": None, "tfbook/torch/optim.py": {"step"},
                "tfbook/parallel/": None, "tfbook/tasks/prose.py": {"dynamic_bits"}}


def optimizer_steps(root):
    """``(path, enclosing function)`` of every ``X.step()`` call without arguments under ``root``."""
    import ast
    from pathlib import Path

    found = []
    for path in sorted(Path(root).rglob("*.py")):
        rel = path.relative_to(Path(root).parent).as_posix()

        def visit(node, func):
            for child in ast.iter_child_nodes(node):
                name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
                if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                        and child.func.attr == "step" and not child.args and not child.keywords):
                    found.append((rel, func))
                visit(child, name)

        visit(ast.parse(path.read_text()), None)
    return found


def allowed_step(rel, func):
    for prefix, funcs in STEP_ALLOWED.items():
        if rel == prefix or (prefix.endswith("/") and rel.startswith(prefix)):
            return funcs is None or func in funcs
    return False


def test_optimizer_steps_only_in_the_loop_the_engines_and_dynamic_evaluation(tmp_path):
    from pathlib import Path

    import tfbook

    root = Path(tfbook.__file__).parent
    found = optimizer_steps(root)
    assert {rel for rel, _ in found} >= {"tfbook/torch/training.py", "tfbook/tasks/prose.py"}  # the scan sees them
    assert [(rel, func) for rel, func in found if not allowed_step(rel, func)] == []
    # the check can fail: a task with its own loop (what tfbook/tasks/modern.py had before issue 39)
    (tmp_path / "tfbook" / "tasks").mkdir(parents=True)
    (tmp_path / "tfbook" / "tasks" / "loop.py").write_text(
        "def tokens_per_second(model, opt):\n    for _ in range(3):\n        opt.step()\n")
    assert optimizer_steps(tmp_path / "tfbook") == [("tfbook/tasks/loop.py", "tokens_per_second")]
    assert not allowed_step("tfbook/tasks/loop.py", "tokens_per_second")
    assert not allowed_step("tfbook/tasks/prose.py", "train_long")  # prose's training goes through the loop
