"""What the benchmark scripts share: the name of this machine's CPU.

Imported as ``benchmarks._common`` (each script puts the repository root on ``sys.path``
first), so that it is found whether a script runs as ``python benchmarks/x.py`` or is
loaded from its file by the tests.
"""

from __future__ import annotations

import platform


def cpu_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (Linux); elsewhere what ``platform`` knows."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            cpu = names[0]
    except OSError:
        pass
    return cpu
