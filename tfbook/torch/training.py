"""The one training loop of tfbook.

Every model of the book is trained by :func:`train`: chapter 11's character model (through
the short :func:`tfbook.torch.models.train_steps`, which calls :func:`train` with a constant
learning rate and returns only the losses), and every task of :mod:`tfbook.tasks`
(the number words of chapter 12, addition and the corpus of chapter 13, the digits of
chapter 15). A task supplies three things: the model, ``loss_fn(model, *batch) -> scalar``
and ``batch_fn(generator) -> batch``; the loop owns everything else:

* AdamW with decoupled weight decay, gradient clipping, a learning-rate schedule
  (:func:`lr_schedule`);
* periodic evaluation (``eval_fn(model)`` every ``eval_every`` steps, and once before
  the first step), early stopping with ``patience`` and restoring the best weights
  (``keep_best``);
* seeding (one ``torch.Generator`` seeded with ``seed`` is handed to ``batch_fn``) and,
  optionally, thread pinning (``threads``, via :func:`tfbook.measure.threads`) and
  deterministic algorithms, so that the same seed gives the same losses on the same machine;
* a tqdm progress bar (``disable=True`` hides it) and ``callbacks``;
* for longer runs on a GPU: mixed precision (``autocast``), a loss read back only every
  ``loss_every`` steps, and a time budget (``time_budget``) that fixes the number of steps
  from the measured speed (chapter 13's long model, :func:`tfbook.tasks.prose.train_long`);
* the device: by default the model trains where its parameters are (the chapters: the CPU);
  ``device="cuda"`` (or ``"auto"``, :func:`tfbook.device`, which honours ``TFBOOK_DEVICE``)
  moves the model and every tensor of each batch there.

It returns a :class:`History`: the loss and learning rate of every step, the evaluations
with their steps, the best evaluation and its step.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

import torch
from torch import nn

__all__ = ["History", "lr_schedule", "train"]

SCHEDULES = ("constant", "warmup_cosine", "hold_linear", "one_cycle")
# The arguments a bare "warmup_cosine" gets: no warm-up (the first step already uses the peak
# lr) and a cosine all the way down to 0 (the last step uses lr 0, so it changes nothing).
# Pass ("warmup_cosine", warmup, min_lr) to choose them.
WARMUP_COSINE_DEFAULTS = (0, 0.0)
# With a time budget the speed is measured between these two step counts, and the number of
# steps is fixed at the second so that the run ends within 90 % of the budget.
BUDGET_STEPS = (50, 150)
_clock = time.perf_counter  # the time budget's clock (seconds)


@dataclass
class History:
    """What :func:`train` recorded.

    ``loss[i]`` and ``lr[i]`` belong to optimisation step ``i + 1`` (``lr`` is the rate
    that step used). ``eval[j]`` was measured after ``eval_step[j]`` steps (0 = before
    training). ``best_step`` / ``best_eval`` are the best evaluation (lowest, or highest
    with ``maximize``) and the step it was taken at; ``None`` without evaluations.
    ``stopped_early`` says whether ``patience`` or a callback ended training before
    ``steps``. ``extra`` holds whatever a task wants to save with the run (its recipe).
    Item access (``history["loss"]``) works as for a dict.
    """

    loss: list = field(default_factory=list)
    lr: list = field(default_factory=list)
    eval_step: list = field(default_factory=list)
    eval: list = field(default_factory=list)
    best_step: int | None = None
    best_eval: float | None = None
    stopped_early: bool = False
    extra: dict = field(default_factory=dict)

    def __getitem__(self, key):
        if key in self.__dataclass_fields__:
            return getattr(self, key)
        return self.extra[key]

    def __contains__(self, key) -> bool:
        return key in self.__dataclass_fields__ or key in self.extra

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "History":
        """From :meth:`as_dict`, or from an older plain dict (unknown keys go to ``extra``)."""
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "extra"}
        extra = dict(d.get("extra", {}))
        extra.update({k: v for k, v in d.items() if k not in cls.__dataclass_fields__})
        return cls(**known, extra=extra)


def _check_schedule(schedule, steps: int) -> tuple:
    """``"name"`` or ``(name, *args)`` -> ``(name, warmup_hold_or_pct, min_lr)`` (validated);
    a callable ``schedule(step, steps) -> lr`` -> ``("callable", None, None)``."""
    if callable(schedule):
        return "callable", None, None
    spec = (schedule,) if isinstance(schedule, str) else tuple(schedule)
    if not spec or spec[0] not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES} (or a tuple starting with one), "
                         f"got {schedule!r}")
    name, args = spec[0], spec[1:]
    n_args = {"constant": 0, "warmup_cosine": 2, "hold_linear": 1, "one_cycle": 1}[name]
    if len(args) > n_args:
        raise ValueError(f"schedule {name!r} takes at most {n_args} arguments, got {args!r}")
    if name == "one_cycle":
        if len(args) != 1 or not 0.0 < float(args[0]) < 1.0:
            raise ValueError(f"schedule ('one_cycle', pct_start) needs 0 < pct_start < 1, got {args!r}")
        return name, float(args[0]), 0.0
    defaults = WARMUP_COSINE_DEFAULTS if name == "warmup_cosine" else (0, 0.0)
    warmup = int(args[0]) if len(args) > 0 else defaults[0]
    min_lr = float(args[1]) if len(args) > 1 else defaults[1]
    if name == "hold_linear" and not args:
        raise ValueError("schedule ('hold_linear', hold_steps) needs the number of constant steps")
    if not 0 <= warmup <= steps:
        raise ValueError(f"schedule {name!r}: warm-up/hold steps must lie in 0..steps={steps}, got {warmup}")
    if min_lr < 0:
        raise ValueError(f"schedule {name!r}: min_lr must be >= 0, got {min_lr}")
    return name, warmup, min_lr


def lr_schedule(schedule, lr: float, steps: int) -> list[float]:
    """The learning rate of each of ``steps`` steps (``lr`` is the peak).

    * ``"constant"``: ``lr`` throughout.
    * ``("warmup_cosine", warmup, min_lr)``: linear from ``lr / warmup`` to ``lr`` over the
      first ``warmup`` steps (steps count from 0, so step ``warmup - 1`` uses ``lr``), then a
      half cosine from ``lr`` down to ``min_lr`` at the last step, ``steps - 1``
      (``warmup=0`` behaves as ``warmup=1``).
      Defaults (:data:`WARMUP_COSINE_DEFAULTS`): a bare ``"warmup_cosine"`` or
      ``("warmup_cosine", warmup)`` means ``warmup=0`` and ``min_lr=0.0``: **no warm-up**
      (step 0 uses ``lr``) and a **last step at learning rate 0** (it does not move the
      weights). Give both arguments when that is not what you want, e.g.
      ``("warmup_cosine", steps // 10, lr / 10)``.
    * ``("hold_linear", hold)``: ``lr`` for ``hold`` steps, then linearly down towards 0
      (step ``s >= hold`` uses ``lr * (steps - s) / (steps - hold)``).
    * ``("one_cycle", pct_start)``: PyTorch's ``OneCycleLR`` warming up for the fraction
      ``pct_start`` of the steps (cosine up from ``lr / 25``, then down to ``lr / 25e4``; it
      also cycles Adam's ``beta1`` between 0.95 and 0.85, which :func:`train` applies).
    * a callable ``schedule(step, steps) -> lr``: its rate at every step.
    """
    name, warmup, min_lr = _check_schedule(schedule, steps)
    if name == "callable":
        return [float(schedule(s, steps)) for s in range(steps)]
    if name == "constant":
        return [float(lr)] * steps
    if name == "hold_linear":
        return [lr if s < warmup else lr * (steps - s) / (steps - warmup) for s in range(steps)]
    if name == "warmup_cosine":
        out = []
        peak = max(warmup - 1, 0)  # the step that uses lr itself
        for s in range(steps):
            if s < warmup:
                out.append(lr * (s + 1) / warmup)
            else:
                t = (s - peak) / max(1, steps - 1 - peak)  # 0 at the peak .. 1 at the last step
                out.append(min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * t)))
        return out
    opt = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=warmup)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@contextlib.contextmanager
def _settings(threads: int | None, deterministic: bool):
    with contextlib.ExitStack() as stack:
        if threads is not None:
            from ..measure import threads as pin

            stack.enter_context(pin(threads))
        if deterministic:
            before = torch.are_deterministic_algorithms_enabled()
            torch.use_deterministic_algorithms(True)
            stack.callback(torch.use_deterministic_algorithms, before)
        yield


def _check_device(device):
    """``None`` -> None; ``"auto"`` -> :func:`tfbook.device`; else a ``torch.device`` that exists here."""
    if device is None:
        return None
    from .. import device as best_device

    if isinstance(device, str) and device.strip().lower() == "auto":
        return best_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device={device!r} is not a device; use None (where the model is), 'auto' "
                         f"(tfbook.device()), a string such as 'cpu', 'cuda', 'cuda:1', 'mps', or a "
                         f"torch.device ({err})") from None
    available = {"cpu": True, "cuda": torch.cuda.is_available(),
                 "mps": getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()}
    if not available.get(dev.type, False):
        raise ValueError(f"device={device!r} is not available here "
                         f"(available: {[k for k, ok in available.items() if ok]})")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def _state(model: nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(model: nn.Module, loss_fn: Callable, batch_fn: Callable, steps: int, *,
          lr: float = 3e-3, weight_decay: float = 0.0, grad_clip: float | None = 1.0,
          schedule="constant", eval_fn: Callable | None = None, eval_every: int | None = None,
          maximize: bool = False, patience: int | None = None, keep_best: bool = False,
          seed: int = 0, threads: int | None = None, deterministic: bool = False,
          disable: bool = False, desc: str = "training",
          callbacks: Iterable[Callable] = (), device=None,
          optimizer: Callable | None = None, autocast: dict | None = None,
          loss_every: int = 1, eval_first: bool = True, eval_last: bool = False,
          time_budget: float | None = None) -> History:
    """Train ``model`` in place with AdamW for up to ``steps`` steps; return its :class:`History`.

    The one training loop. :func:`tfbook.torch.models.train_steps` is its short form
    (``train_steps(...) == train(..., schedule="constant").loss``) for a constant learning
    rate without evaluation; use :func:`train` for a schedule, evaluation, early stopping,
    callbacks or the full :class:`History`.

    Parameters
    ----------
    model : nn.Module
        Put in train mode for the steps, eval mode for evaluations and at the end.
    loss_fn : callable
        ``loss_fn(model, *batch) -> scalar tensor``.
    batch_fn : callable
        ``batch_fn(generator) -> batch`` (a tuple, or one tensor); it must take all its
        randomness from ``generator``, a ``torch.Generator`` seeded with ``seed``.
    steps : int
        Optimisation steps (fewer if early stopping or a callback ends training).
    lr, weight_decay : float
        AdamW's peak learning rate and decoupled weight decay.
    grad_clip : float or None
        Clip the global gradient norm to this value before each step.
    schedule : str, tuple or callable
        The learning rate per step; see :func:`lr_schedule`. Default ``"constant"``. A bare
        ``"warmup_cosine"`` means no warm-up and a last step at lr 0
        (:data:`WARMUP_COSINE_DEFAULTS`); pass ``("warmup_cosine", warmup, min_lr)``. A
        callable ``schedule(step, steps) -> lr`` gives the rate of step ``step`` (from 0) of a
        run of ``steps`` steps (the number ``time_budget`` has fixed, once it has).
    eval_fn : callable, optional
        ``eval_fn(model) -> float``, the validation metric, called under ``torch.no_grad()``
        with the model in eval mode before the first step and every ``eval_every`` steps.
    eval_every : int, optional
        Required with ``eval_fn``.
    maximize : bool
        The metric is better when higher (accuracy) rather than lower (a loss).
    patience : int, optional
        Stop after this many evaluations in a row without a strict improvement.
    keep_best : bool
        At the end, load the weights of the best evaluation (its step is ``best_step``).
    seed : int
        Seeds the generator given to ``batch_fn``. The model is initialised by the caller.
    threads : int, optional
        Pin PyTorch and BLAS to this many threads while training (restored after).
    deterministic : bool
        ``torch.use_deterministic_algorithms(True)`` while training (restored after).
    disable : bool
        Hide the tqdm progress bar.
    callbacks : iterable of callables
        ``cb(step, model, history)`` after every step (``step`` counts steps taken);
        returning True stops training.
    device : str or torch.device, optional
        Where to train. ``None`` (default): where the model's parameters already are,
        nothing is moved (the book's chapters: the CPU). ``"cpu"``, ``"cuda"``, ``"cuda:1"``,
        ``"mps"`` or a ``torch.device``: the model is moved there (and stays there), and every
        tensor in each batch is moved there before ``loss_fn`` sees it; ``batch_fn``'s
        generator stays on the CPU, so the batches, and with them the run, are the same
        whatever the device. ``"auto"``: :func:`tfbook.device`, i.e. the environment variable
        ``TFBOOK_DEVICE`` if set, else CUDA, then MPS, then the CPU. ``eval_fn`` and
        ``callbacks`` get the model on this device: an ``eval_fn`` with data of its own moves
        it to ``next(model.parameters()).device``. A device that is not there raises
        ``ValueError``.
    optimizer : callable, optional
        ``optimizer(model, lr, weight_decay) -> torch.optim.Optimizer``, called once the model
        is on its device; default ``torch.optim.AdamW(model.parameters(), lr=lr,
        weight_decay=weight_decay)``. The schedule sets every parameter group's ``lr`` to the
        step's rate (chapter 10's Muon with AdamW: :class:`tfbook.torch.optim.MuonAdamW`).
    autocast : dict, optional
        Keyword arguments of ``torch.autocast`` under which ``loss_fn`` runs, e.g.
        ``dict(device_type="cuda", dtype=torch.bfloat16)``; default: no autocast.
    loss_every : int
        Record the loss (``loss.item()``, which makes a GPU wait) and check that it is finite
        every ``loss_every`` steps and at the last step only (default 1: every step);
        ``lr`` is recorded every step.
    eval_first, eval_last : bool
        Evaluate before the first step (default True) / after the last step also when it is not
        a multiple of ``eval_every`` (default False).
    time_budget : float, optional
        Seconds: after :data:`BUDGET_STEPS` ``[1]`` steps the number of steps is lowered (never
        raised) from the speed measured since step :data:`BUDGET_STEPS` ``[0]``, so that the run
        takes about 90 % of the budget; the number fixed is in ``history.extra["steps"]``.

    The same model initialisation, arguments and seed give the same losses on the same
    machine and thread count. A non-finite loss raises ``ValueError``.
    """
    from tqdm.auto import tqdm

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if grad_clip is not None and not grad_clip > 0:
        raise ValueError(f"grad_clip must be > 0 or None, got {grad_clip}")
    if eval_fn is not None and (eval_every is None or eval_every < 1):
        raise ValueError(f"eval_fn needs eval_every >= 1, got eval_every={eval_every!r}")
    if (patience is not None or keep_best) and eval_fn is None:
        raise ValueError("patience and keep_best need eval_fn (and eval_every)")
    if patience is not None and patience < 1:
        raise ValueError(f"patience must be >= 1, got {patience}")
    if isinstance(loss_every, bool) or not isinstance(loss_every, int) or loss_every < 1:
        raise ValueError(f"loss_every must be an integer >= 1, got {loss_every!r}")
    if time_budget is not None and not time_budget > 0:
        raise ValueError(f"time_budget must be > 0 seconds or None, got {time_budget!r}")
    device = _check_device(device)
    name = _check_schedule(schedule, steps)[0]
    rates = lr_schedule(schedule, lr, steps) if name not in ("one_cycle", "callable") else None
    callbacks = list(callbacks)

    history = History()
    best_state = None
    since_best = 0

    def evaluate(step: int) -> bool:
        """Record an evaluation; True when patience has run out."""
        nonlocal best_state, since_best
        model.eval()
        with torch.no_grad():
            value = float(eval_fn(model))
        model.train()
        history.eval_step.append(step)
        history.eval.append(value)
        better = history.best_eval is None or (value > history.best_eval if maximize
                                               else value < history.best_eval)
        if better:
            history.best_eval, history.best_step, since_best = value, step, 0
            if keep_best:
                best_state = _state(model)
        else:
            since_best += 1
        return patience is not None and since_best >= patience

    with _settings(threads, deterministic):
        if device is not None:
            model.to(device)
        generator = torch.Generator().manual_seed(seed)
        if optimizer is None:
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        else:
            opt = optimizer(model, lr, weight_decay)
            if not isinstance(opt, torch.optim.Optimizer):
                raise ValueError(f"optimizer(model, lr, weight_decay) must return a "
                                 f"torch.optim.Optimizer, got {type(opt).__name__}")
        one_cycle = None
        if name == "one_cycle":
            pct_start = _check_schedule(schedule, steps)[1]
            one_cycle = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps,
                                                            pct_start=pct_start)
        model.train()
        stop = eval_fn is not None and eval_first and evaluate(0)
        total, taken = steps, 0  # total: lowered by a time budget
        t0 = t_measure = _clock()
        bar = tqdm(range(1, steps + 1), disable=disable, desc=desc)
        for step in bar:
            if stop or step > total:
                break
            if rates is not None:
                for group in opt.param_groups:
                    group["lr"] = rates[step - 1]
            elif name == "callable":
                for group in opt.param_groups:
                    group["lr"] = schedule(step - 1, total)
            history.lr.append(float(opt.param_groups[0]["lr"]))
            batch = batch_fn(generator)
            if not isinstance(batch, tuple):
                batch = (batch,)
            if device is not None:
                batch = tuple(b.to(device) if isinstance(b, torch.Tensor) else b for b in batch)
            with (torch.autocast(**autocast) if autocast is not None else contextlib.nullcontext()):
                loss = loss_fn(model, *batch)
            read = step % loss_every == 0 or step == total
            if read and not torch.isfinite(loss):
                raise ValueError(f"loss became {loss.item()} after {step - 1} steps; lower lr?")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            if one_cycle is not None:
                one_cycle.step()
            taken = step
            if read:
                history.loss.append(loss.item())
                bar.set_postfix(loss=f"{history.loss[-1]:.3f}", refresh=False)
            if time_budget is not None:
                if step == BUDGET_STEPS[0]:
                    t_measure = _clock()
                if step == BUDGET_STEPS[1]:  # the speed after warming up fixes the number of steps
                    now = _clock()
                    per_step = (now - t_measure) / (BUDGET_STEPS[1] - BUDGET_STEPS[0])
                    total = max(step + 1, min(total, step + int((time_budget - (now - t0)) * 0.9 / per_step)))
                history.extra["steps"] = total
            if eval_fn is not None and (step % eval_every == 0 or (eval_last and step == total)):
                stop = evaluate(step)
            if any([bool(cb(step, model, history)) for cb in callbacks]):  # every callback runs
                stop = True
        if stop and taken < total:
            history.stopped_early = True
        if keep_best and best_state is not None:
            model.load_state_dict(best_state)
    model.eval()
    return history
