"""What the benchmarks time with: medians of many calls, after a few to warm up."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
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


def interleaved_s(calls: Sequence[Callable[[], Any]], repeats: int, warm: int = 1) -> list[float]:
    """The median time of each of ``calls`` in seconds, over ``repeats`` rounds in which
    each is called once in turn (after ``warm`` such rounds): load that comes and goes on
    the machine falls on all of them alike, as it cannot when each is timed in a block
    of its own."""
    for _ in range(warm):
        for call in calls:
            call()
    taken: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for call, into in zip(calls, taken, strict=True):
            start = time.perf_counter()
            call()
            into.append(time.perf_counter() - start)
    return [statistics.median(times) for times in taken]
