"""Running a function in a forked child, as a DataLoader worker runs: for tests that a
process forked from one using somatize does not hang on what it inherited."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import pytest


def in_forked_child(target: Callable[..., Any], *args: Any, timeout: float = 120) -> Any:
    """What ``target(*args)`` returns in a forked child; fails the test if the child hangs
    past ``timeout`` seconds or dies. ``target`` must be a module-level function."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_run, args=(target, args, results))
    child.start()
    child.join(timeout=timeout)
    if child.is_alive():
        child.kill()
        pytest.fail(f"the forked child running {target.__name__} hung")
    assert child.exitcode == 0, f"the forked child running {target.__name__} failed"
    return results.get(timeout=5)


def _run(target: Callable[..., Any], args: tuple[Any, ...], results: Any) -> None:
    import torch

    torch.set_num_threads(1)  # as a DataLoader worker does: torch's own pool stays behind
    results.put(target(*args))
