"""Time limits: a cell's and a notebook's limits in CPU seconds, the wall-clock backstop for
code that sleeps or blocks (seconds *not spent waiting for a CPU*, so a loaded machine shortens
neither), what a notebook's runs have used of them (:class:`Budget`), and the words that say
them in a row's reason."""

from __future__ import annotations

from dataclasses import dataclass

from tfbook.course import sandbox

GRACE = 3.0  # seconds (of CPU, or of the backstop) a cell gets after its interrupt before the sandbox is killed
# A limit of T CPU seconds also stops code after WALL_FACTOR * T seconds of wall-clock time not
# spent waiting for a CPU (code that sleeps, or blocks, uses no CPU). Honest code waits for
# nothing else, so it never meets the backstop first, at any load; a sleeper holds a job slot
# (not a core) for at most 3 T. Where the kernel does not count the run-queue delay (no
# /proc/<pid>/schedstat), the backstop is plain wall-clock time, PLAIN_WALL_FACTOR * T: fair up
# to a load of about that many times the cores, for code using all of its CPU limit.
WALL_FACTOR = 3.0
PLAIN_WALL_FACTOR = 10.0
SAMPLE = 0.25  # seconds between two readings of a sandbox's meter


def wall_factor() -> float:
    return WALL_FACTOR if sandbox.run_queue_delays_available() else PLAIN_WALL_FACTOR


@dataclass
class Budget:
    """One notebook's overall limits and what its runs have used of them: CPU seconds, and the
    wall-clock backstop (seconds not spent waiting for a CPU, nor for the judge)."""
    cpu: float
    wall: float
    cpu_used: float = 0.0
    wall_used: float = 0.0
    grader_used: float = 0.0  # the grader's own CPU seconds on this notebook's messages

    @classmethod
    def of(cls, total_timeout: float) -> "Budget":
        return cls(cpu=total_timeout, wall=wall_factor() * total_timeout)

    def spent(self, cpu: float = 0.0, wall: float = 0.0) -> bool:
        return self.cpu_used + cpu >= self.cpu or self.wall_used + wall >= self.wall


def limit_words(cpu: float) -> str:
    """A limit of ``cpu`` CPU seconds and its backstop, in words."""
    return (f"{cpu:g} s of CPU time, or {wall_factor() * cpu:g} s of wall-clock time"
            + (" not spent waiting for a CPU" if sandbox.run_queue_delays_available() else ""))


def ran_longer(cpu: float, which: str) -> str:
    """What a cell interrupted by the limit ``which`` ("cpu", "wall" or "": unknown) did."""
    if which == "cpu":
        return f"ran longer than {cpu:g} s of CPU time"
    if which == "wall":
        return (f"ran longer than {wall_factor() * cpu:g} s of wall-clock time (sleeping or "
                "waiting for something?)")
    return f"ran longer than its limit ({limit_words(cpu)})"


__all__ = ["GRACE", "WALL_FACTOR", "PLAIN_WALL_FACTOR", "SAMPLE", "wall_factor", "Budget", "limit_words", "ran_longer"]
