"""Thread pools and locks that belong to one process.

A forked child (a DataLoader worker, a multiprocessing worker) inherits the parent's
memory but only the thread that forked. A pool cached for good would hand the child
work queues with no threads behind them, and a lock that a parent's thread held at
the fork would stay held in the child for good. Pools are therefore cached per
process id, and a :class:`ProcessLock` is made unheld in a child as it starts.
"""

from __future__ import annotations

import _thread
import io
import os
import sys
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from queue import SimpleQueue
from typing import Any

import blake3

__all__ = [
    "ProcessLock",
    "StartedPool",
    "hash_read",
    "hash_threads",
    "make_room",
    "process_pool",
    "start_thread",
]

_pools: dict[tuple[str, int], ThreadPoolExecutor] = {}

_HASHING_PID: int | None = None
"""The process whose ``blake3`` hashed on several threads first: its pool of threads is
made once, and a child forked after that inherits the pool without its threads."""


def hash_threads() -> int:
    """``max_threads=`` for ``blake3``: as many as it likes, except in a child forked from
    a process whose hashing started its threads (waiting on a pool whose threads stayed
    behind would never end), where one thread hashes."""
    global _HASHING_PID
    pid = os.getpid()
    if _HASHING_PID is None:
        _HASHING_PID = pid
    return blake3.blake3.AUTO if pid == _HASHING_PID else 1


_HASH_PART = 1 << 20
"""How many bytes of a file :func:`hash_read` reads and hashes at a time: a buffer that
stays in the processor's cache is filled and hashed faster than a larger one."""


def hash_read(handle: io.RawIOBase | io.BufferedIOBase, size: int | None) -> str | None:
    """The BLAKE3 digest (``blake3:…``) of the next ``size`` bytes of ``handle`` (None: of
    all it holds from where it is), read a part at a time into one buffer; None when the
    file ends before ``size`` bytes (it was cut short). Read, not mapped: a file cut short
    while it is hashed is then a short read, where a page of a map past its new end would
    end the process (SIGBUS)."""
    hasher = blake3.blake3(max_threads=hash_threads())
    room = memoryview(bytearray(_HASH_PART if size is None else min(size, _HASH_PART)))
    got = 0
    while size is None or got < size:
        read = handle.readinto(room if size is None else room[: min(len(room), size - got)])
        if not read:
            if size is None:
                break
            return None
        hasher.update(room[:read])
        got += read
    return "blake3:" + hasher.hexdigest()


def make_room(table: dict[Any, Any], most: int) -> None:
    """Drops the oldest entries of ``table``, a dict kept in the order its entries came, until
    it holds fewer than ``most``, for one more: a table of what was seen last, which threads
    add to at once without a lock (one may have taken the oldest already)."""
    while len(table) >= most:
        try:
            table.pop(next(iter(table)), None)
        except (StopIteration, RuntimeError):  # emptied, or changed as it was looked at
            break


def process_pool(name: str, workers: int) -> ThreadPoolExecutor:
    """The pool ``name`` of this process (``workers`` threads, started as it is made:
    :class:`StartedPool`)."""
    key = (name, os.getpid())
    pool = _pools.get(key)
    if pool is None:
        # No lock: one held by another thread when the process forked would stay held in
        # the child. Two threads racing here make two pools; one is kept, and the other's
        # threads end once it is let go of.
        pool = _pools.setdefault(key, StartedPool(workers, name))
    return pool


class StartedPool(ThreadPoolExecutor):
    """A pool whose threads are started as it is made, on the process's starting thread
    (:func:`start_thread`), and whose ``submit`` takes no lock in Python code.

    A plain pool starts its threads from ``submit``, on the caller's thread, and asks its
    count of idle threads there at every call (a ``threading.Semaphore``, whose lock is
    taken in Python code): a Ctrl-C landing there once the lock is taken leaves it held,
    and every later ``submit`` — or the pool's thread, counting itself idle after its
    call — waits on it for ever; one landing as a thread starts leaves ``threading``'s
    own locks held, or the thread running unrecorded, which the process waits for as it
    exits."""

    def __init__(self, workers: int, name: str) -> None:
        super().__init__(max_workers=workers, thread_name_prefix=name)
        for _ in range(workers):
            start_thread(self._start)

    def _start(self) -> None:
        super()._adjust_thread_count()

    def _adjust_thread_count(self) -> None:
        """Nothing: the pool's threads were started as it was made."""


_Start = tuple[Callable[[], object], "_thread.LockType", list[BaseException]]

_STARTERS: dict[int, SimpleQueue[_Start]] = {}
"""Each process's starting thread's queue (:func:`start_thread`), by process id: a forked
child has none of its parent's threads, and starts its own."""

_STARTING: set[tuple[int, int]] = set()
"""The process id and thread id of each process's starting thread (:func:`start_thread`)."""


def start_thread(start: Callable[[], object]) -> None:
    """Runs ``start``, which starts a thread (``threading.Thread.start``), on this process's
    starting thread, and returns once it has, raising what it raised.

    Starting a thread takes locks in Python code (``threading``'s: the new thread's
    ``Event``, a pool's count of idle threads), and one a Ctrl-C lands in, once it is
    taken, stays held: the new thread waits on it for ever, and the process for that
    thread as it exits; one landing just after the thread started leaves it running
    unrecorded, so no one tells it to end. The starting thread is never interrupted (a
    signal's handler runs on the main thread, and no node runs there), so what it starts
    is started and recorded whole. It is started itself by the interpreter's own call
    (``_thread.start_new_thread``, in C), and waited on by a lock taken in C: a Ctrl-C
    landing while this waits leaves nothing held, and the thread is started all the same.
    A thread it starts inherits its being a daemon (it is, to ``threading``): a pool's
    threads are joined as the process exits all the same (``concurrent.futures`` joins
    each of its own).

    Once the interpreter finalizes (code a collection runs as it exits) no thread starts:
    RuntimeError, as a pool's ``submit`` says then, rather than hand the start to a
    starting thread the interpreter stops as it takes the GIL, and wait for ever. Called
    on the starting thread itself (by code a collection runs there, a ``__del__``, as it
    starts a thread), ``start`` runs there and then, rather than wait for that thread."""
    if sys.is_finalizing():
        raise RuntimeError("can't start a thread at interpreter shutdown")
    pid = os.getpid()
    if (pid, _thread.get_ident()) in _STARTING:
        start()  # on the starting thread: a collection there ran this, as it started one
        return
    queue = _STARTERS.get(pid)
    if queue is None:
        made: SimpleQueue[_Start] = SimpleQueue()
        _thread.start_new_thread(_starting, (made,))
        # Started, then noted: a Ctrl-C landing between leaves a starting thread idle for
        # good, not a queue no thread reads. Two racing here start two; one is kept.
        queue = _STARTERS.setdefault(pid, made)
    done = _thread.allocate_lock()
    done.acquire()
    failed: list[BaseException] = []
    queue.put((start, done, failed))
    done.acquire()  # in C: a Ctrl-C ends the wait, and the start goes on there
    if failed:
        raise failed[0]


def _starting(queue: SimpleQueue[_Start]) -> None:
    """The starting thread: runs each start it is handed, noting what it raised."""
    _STARTING.add((os.getpid(), _thread.get_ident()))
    while True:
        start, done, failed = queue.get()
        try:
            start()
        except BaseException as error:  # handed to the caller, who raises it
            failed.append(error)
        finally:
            done.release()
        del start, done, failed


class ProcessLock(_thread.RLock):  # type: ignore[misc]  # final only in the stubs
    """A lock that a forked child gets unheld, unless the thread that forked holds it.

    A thread of the parent (the writer, in the middle of a keep) may hold a lock at the
    moment the process forks; in the child that thread does not exist, and a plain lock
    would stay held there for good. Each is made unheld again as the child starts
    (:func:`_after_fork_in_child`), before any thread of the child can enter it — but
    one held by the thread that forked, which goes on in the child and leaves its block
    there, releasing it.

    Entering and leaving are the lock's own (C), not Python code: an interrupt (Ctrl-C)
    lands before a ``with`` block holds it or inside the block, never between taking
    the lock and the block that gives it back, which would leave it held for good. A
    thread that holds it may enter it again (it is re-entrant) but none does; code a
    garbage collection runs asks :meth:`held_here` first."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__()
        _LOCKS.add(self)

    def held_here(self) -> bool:
        """Whether the calling thread holds the lock: code a garbage collection runs (a
        finalizer) may interrupt its block on that thread, and must not enter it there."""
        return bool(self._is_owned())  # type: ignore[attr-defined]


_LOCKS: weakref.WeakSet[ProcessLock] = weakref.WeakSet()
"""Every :class:`ProcessLock` of this process, which a forked child makes unheld."""


def _after_fork_in_child() -> None:
    """Runs in a forked child, on its only thread, before the fork returns there."""
    for lock in list(_LOCKS):
        if not lock.held_here():
            lock._at_fork_reinit()  # type: ignore[attr-defined]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
