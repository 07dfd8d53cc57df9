"""Thread pools kept for the life of a process, and only of that process.

A pool made on first use and cached for good is inherited by a forked child (a
DataLoader worker, a multiprocessing worker) without the threads behind it: work
submitted there would wait for threads that do not exist. Pools are therefore
cached per process id, and a child makes its own.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

__all__ = ["process_pool"]

_pools: dict[tuple[str, int], ThreadPoolExecutor] = {}


def process_pool(name: str, workers: int) -> ThreadPoolExecutor:
    """The pool ``name`` of this process (``workers`` threads, started as they are needed)."""
    key = (name, os.getpid())
    pool = _pools.get(key)
    if pool is None:
        # No lock: one held by another thread when the process forked would stay held in
        # the child. Two threads racing here make two pools; one is kept, and the other
        # never started a thread.
        pool = _pools.setdefault(key, ThreadPoolExecutor(workers, thread_name_prefix=name))
    return pool
