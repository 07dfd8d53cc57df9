"""What the benchmarks time with: the median of many calls, after a few to warm up."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_us(call: Callable[[], Any], repeats: int, warm: int = 20) -> float:
    """The median time of ``call`` in microseconds, over ``repeats`` calls after ``warm``."""
    for _ in range(warm):
        call()
    taken = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        call()
        taken.append((time.perf_counter_ns() - start) / 1e3)
    return statistics.median(taken)
