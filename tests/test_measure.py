"""tfbook.measure: thread pinning restores state; peak memory counts what it says."""

import tracemalloc

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

from tfbook import measure


def _blas_threads():
    return sorted(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")


def test_threads_pins_torch_and_blas_and_restores():
    before_torch, before_blas = torch.get_num_threads(), _blas_threads()
    assert before_blas, "no BLAS library found by threadpoolctl"
    with measure.threads(1):
        assert torch.get_num_threads() == 1
        assert _blas_threads() == [1] * len(before_blas)
    assert torch.get_num_threads() == before_torch
    assert _blas_threads() == before_blas


def test_threads_restores_after_exception_and_nests():
    before_torch, before_blas = torch.get_num_threads(), _blas_threads()
    with pytest.raises(RuntimeError, match="inside"):
        with measure.threads(1):
            with measure.threads(2):
                assert torch.get_num_threads() == 2
            assert torch.get_num_threads() == 1 and _blas_threads() == [1] * len(before_blas)
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before_torch and _blas_threads() == before_blas


@pytest.mark.parametrize("n", [0, -1, 1.5, "2", True])
def test_threads_rejects_bad_n(n):
    with pytest.raises(ValueError, match=r"n must be an integer >= 1"):
        with measure.threads(n):
            pass


def test_peak_extra_bytes_counts_temporaries_and_result():
    n = 1 << 20  # 8 MiB of float64: bookkeeping of a few hundred bytes is negligible against it

    def two_temporaries_then_result(x):
        a = x + 1.0  # n numbers
        b = a * 2.0  # n more, both alive
        del a, b
        return np.zeros(n // 2)  # result: n / 2 numbers

    x = np.ones(n)
    result, extra = measure.peak_extra_bytes(two_temporaries_then_result, x)
    assert result.shape == (n // 2,)
    assert abs(extra - 2 * 8 * n) < 4096  # the peak is the two temporaries; the inputs are not counted

    def grows(x):
        return np.concatenate([x, x])  # the result itself is the peak

    _, extra = measure.peak_extra_bytes(grows, x)
    assert abs(extra - 2 * 8 * n) < 4096


def test_peak_extra_bytes_inside_running_trace():
    tracemalloc.start()
    try:
        np.ones(1 << 20)  # an earlier peak must not leak into the measurement
        _, extra = measure.peak_extra_bytes(lambda: np.ones(1000))
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()
    assert 8000 <= extra < 8000 + 4096
    with pytest.raises(ValueError, match="fn must be callable"):
        measure.peak_extra_bytes(3)


def test_timers_return_positive_seconds_and_check_repeats():
    calls = []
    f = lambda: calls.append(sum(range(1000)))  # noqa: E731
    assert measure.cpu_seconds(f, repeats=2, min_seconds=0.001) > 0
    n = len(calls)
    assert measure.median_seconds(f, repeats=3) > 0 and len(calls) == n + 4  # warm-up + 3
    assert measure.best_time(f, repeats=2) > 0 and len(calls) == n + 6  # no warm-up by default
    with pytest.raises(ValueError, match="repeats must be an integer >= 1"):
        measure.best_time(f, repeats=0)


def test_threads_restores_torch_by_itself(monkeypatch):
    # threadpoolctl's own restore happens to reset the OpenMP pool torch reads its count from;
    # without it (not installed, or a torch built on another thread pool) threads() must still restore
    import contextlib

    monkeypatch.setattr(measure, "_blas_limit", lambda n: contextlib.nullcontext())
    before = torch.get_num_threads()
    other = 1 if before > 1 else 2
    with measure.threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before


def test_cpu_seconds_stat_min_and_a_bad_stat():
    calls = []

    def f():
        calls.append(1)
        sum(range(2000))

    assert 0 < measure.cpu_seconds(f, repeats=3, min_seconds=0.001, stat="min")
    with pytest.raises(ValueError, match="stat"):
        measure.cpu_seconds(f, stat="mean")
