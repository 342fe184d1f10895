"""Measuring time and memory, one helper per job.

The chapters on cost and efficient attention, the benchmarks (``benchmarks/run.py``) and
the training tasks all measure with these, so a number means the same thing everywhere:

- :func:`threads` -- a context manager that pins the thread count of PyTorch *and* of the
  BLAS library NumPy calls (through ``threadpoolctl``), and restores both on exit.
- :func:`peak_extra_bytes` -- the most memory a call held at once beyond what existed
  before it, with ``tracemalloc`` (NumPy and Python allocations only).
- :func:`cpu_seconds` -- median (or minimum) CPU time of the calling thread (robust on a busy
  machine, for single-threaded code).
- :func:`median_seconds` and :func:`best_time` -- wall-clock time, for code that runs on
  several threads (CPU time of one thread would miss the others' work).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
import tracemalloc
from typing import Any, Callable, Iterator

__all__ = ["threads", "peak_extra_bytes", "cpu_seconds", "median_seconds", "best_time"]


def _check_repeats(repeats) -> int:
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    return repeats


_CONTROLLER: list = [None, -1]  # a cached threadpoolctl controller and len(sys.modules) when made


def _blas_limit(n: int):
    """A context limiting every loaded BLAS library to ``n`` threads (a no-op without threadpoolctl).

    Finding the loaded libraries takes about half a millisecond, so the controller is
    cached and made again only when modules (and with them, maybe, libraries) were
    imported since; limiting with it takes microseconds.
    """
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency of the book
        return contextlib.nullcontext()
    if _CONTROLLER[0] is None or _CONTROLLER[1] != len(sys.modules):
        _CONTROLLER[:] = [ThreadpoolController(), len(sys.modules)]
    return _CONTROLLER[0].limit(limits=n, user_api="blas")


@contextlib.contextmanager
def threads(n: int, *, include_torch: bool = True) -> Iterator[None]:
    """Run the body with ``n`` threads in PyTorch and in NumPy's BLAS; restore both after.

    Sets ``torch.set_num_threads(n)`` (PyTorch's intra-op pool) if PyTorch is imported,
    and limits every BLAS library loaded in the process (OpenBLAS, MKL, BLIS: what
    ``np.matmul`` uses) to ``n`` threads with ``threadpoolctl``. On exit, also after an
    exception, PyTorch gets back the thread count it had on entry and the BLAS
    libraries theirs. Nested uses restore in order. Without ``threadpoolctl`` installed
    only PyTorch is pinned. It does not import PyTorch (so NumPy-only code stays light);
    import it before entering if the body is the first to use it.

    Typical uses: ``with threads(1):`` around a timing, so it measures arithmetic and not
    how well work is shared between cores, or around training, so that results do not
    depend on the number of cores (reductions split across threads add in a different
    order).

    Parameters
    ----------
    n : int
        Threads, ``>= 1``.
    include_torch : bool
        ``False`` pins BLAS only (what :func:`tfbook.numpy.blocked_attention` uses while
        its own threads run, so that PyTorch elsewhere in the process is left alone).

    Raises
    ------
    ValueError
        If ``n`` is not an integer ``>= 1``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1 (threads), got {n!r}")
    torch = sys.modules.get("torch") if include_torch else None
    before = torch.get_num_threads() if torch is not None else None
    with _blas_limit(n):
        if torch is not None:
            torch.set_num_threads(n)
        try:
            yield
        finally:
            if torch is not None:
                torch.set_num_threads(before)


def peak_extra_bytes(fn: Callable[..., Any], *args, **kwargs) -> tuple[Any, int]:
    """Call ``fn(*args, **kwargs)``; return ``(result, bytes)``.

    ``bytes`` is the most memory held at once during the call beyond what was already
    held before it, as traced by ``tracemalloc``. It *includes* the result (which is
    alive when the call returns); subtract ``result.nbytes`` for the working memory
    alone. Inputs, which existed before, are not counted.

    What it sees: every allocation made through Python's and NumPy's allocators, from
    any thread. What it does not see: PyTorch tensors (their own allocator), BLAS
    scratch buffers, memory of other processes. So use it for NumPy code.

    Works whether or not ``tracemalloc`` is already tracing (then the peak is reset,
    and tracing is left on).
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = fn(*args, **kwargs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return result, peak - before


def cpu_seconds(fn: Callable[[], Any], repeats: int = 3, min_seconds: float = 0.005, stat: str = "median") -> float:
    """Median CPU time (seconds, of the calling thread) of one call ``fn()``.

    After one untimed warm-up call (the first call allocates memory and sets up
    kernels), each of ``repeats`` runs loops ``fn()`` until it has taken about
    ``min_seconds`` and records the time per call. ``time.thread_time`` advances only
    while this thread runs on a core, so on a machine shared with other programs the
    figure does not count their time. Work done by *other* threads is not counted
    either: time single-threaded code (see :func:`threads`).

    ``stat="min"`` returns the minimum over the repeats instead of the median: the run
    least disturbed by other programs (which can still slow a thread down while it runs,
    through shared caches and clock speeds), the usual estimate of what the code costs.
    """
    _check_repeats(repeats)
    if stat not in ("median", "min"):
        raise ValueError(f"stat must be 'median' or 'min', got {stat!r}")
    t0 = time.thread_time()
    fn()  # warm-up; also sizes the inner loop
    n = max(1, math.ceil(min_seconds / max(time.thread_time() - t0, 1e-6)))
    runs = []
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        runs.append((time.thread_time() - t0) / n)
    return min(runs) if stat == "min" else statistics.median(runs)


def _wall_times(fn, repeats, warm_up):
    _check_repeats(repeats)
    if warm_up:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median_seconds(fn: Callable[[], Any], repeats: int = 3, warm_up: bool = True) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` calls, after an untimed warm-up
    call unless ``warm_up=False``. Wall-clock time counts every thread's work (and, on a
    busy machine, time given to other programs)."""
    return statistics.median(_wall_times(fn, repeats, warm_up))


def best_time(fn: Callable[[], Any], repeats: int = 3, warm_up: bool = False) -> float:
    """Shortest wall-clock seconds of ``fn()`` over ``repeats`` calls: the run least
    disturbed by other programs."""
    return min(_wall_times(fn, repeats, warm_up))
