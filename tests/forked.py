"""Running a function in a forked child, as a DataLoader worker runs: for tests that a
process forked from one using somatize does not hang on what it inherited, and that a
file cut short as it is hashed is an error, not a crash (SIGBUS) of the process."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


def in_forked_child(target: Callable[..., Any], *args: Any, timeout: float = 120) -> Any:
    """What ``target(*args)`` returns in a forked child; fails the test if the child hangs
    past ``timeout`` seconds or dies. ``target`` must be a module-level function."""
    return in_child("fork", target, *args, timeout=timeout)


def in_child(method: str, target: Callable[..., Any], *args: Any, timeout: float = 120) -> Any:
    """:func:`in_forked_child`, the child started by ``method`` (``fork``, ``spawn``,
    ``forkserver``): a spawned child imports ``target``'s module and unpickles ``args``."""
    context = multiprocessing.get_context(method)
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


@contextlib.contextmanager
def held_elsewhere(lock: Any) -> Iterator[None]:
    """While in the block, ``lock`` is held by another thread of this process, as one of
    its threads may hold it as the process forks (a thread that stays behind in the
    parent)."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        yield
    finally:
        done.set()
        holder.join()


needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def forked(target: Callable[[], str]) -> tuple[int, int]:
    """Starts ``target`` in a forked child; returns its pid and the pipe its answer (or the
    error it raised, as ``raised <type>: <message>``) comes back on."""
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(reading)
        try:
            said = target()
        except BaseException as why:  # every failure goes to the parent
            said = f"raised {type(why).__name__}: {why}"
        os.write(writing, said.encode())
        os._exit(0)
    os.close(writing)
    return pid, reading


def answer_of(pid: int, reading: int) -> str:
    """What the child ``pid`` said; how it ended, when it was killed or failed."""
    with os.fdopen(reading, "rb") as pipe:
        said = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return said if os.WEXITSTATUS(status) == 0 else f"exited {os.WEXITSTATUS(status)}"


def cut_short_when_hashed(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """The next blake3 hasher made for the file — handed no bytes yet (they are fed as the
    file is read) or more than 64 KiB of them (a map of it) — cuts ``path`` to 4096 bytes
    first: the file is cut short while it is being hashed. Hashers of small records made
    before it are left alone."""
    import blake3

    real = blake3.blake3

    def cutting(*args: Any, **kwargs: Any) -> Any:
        if not args or memoryview(args[0]).nbytes > 1 << 16:
            monkeypatch.setattr(blake3, "blake3", real)
            os.truncate(path, 4096)
        return real(*args, **kwargs)

    cutting.AUTO = real.AUTO  # type: ignore[attr-defined]
    monkeypatch.setattr(blake3, "blake3", cutting)
