"""The store writer: how rows computed in a forward get to the store, behind the step.

Rows computed in a forward are staged device → pinned host memory
(``somatize_torch._native.PinnedPool`` where it is built, ``pin_memory()`` where
CUDA is, plain host memory otherwise) and handed to a background thread (a
:class:`Writer`'s) that keeps them in the store through ``store.open_joined``, a batch
at a time as they come and published a pack at a time — so the forward never waits on
the disk (it waits only when more than ``pending_bytes``
are still unwritten, the thread then writing what it gathers at once, each row counted
with its key, :data:`KEY_BYTES`, which bounds the memory the writer holds). ``flush()`` waits
for every row to be written; so do interpreter exit (first before its thread
pools stop taking work, then once more as an ``atexit`` handler) and the end of
a worker process, and once every writer of a store is dropped its thread writes
every row it was given, then ends. A write that fails — a full disk, a store that refuses, a call
cancelled — is logged when it happens and raised as :class:`WriteFailed` at the
next forward (once) and at every flush that waited for its rows (on any thread), or
the next flush if none did; a flush after that, waiting for no rows that failed,
returns. The store publishes a pack whole or not at all, so a failure
or a killed process never leaves a visible half-answer, only rows that a later run
recomputes.

A forward that must ask the store (rows in no memory tier) asks it while the writer
thread writes, without waiting, where one thread may read the store while another
writes through it (:attr:`~somatize.Store.shared_by_threads`: a directory's or a
bucket's). Calls into any other store are serialised between the forward and the
writer thread by one lock per store object (:func:`store_lock`), so that a forward
asking it may wait for the one write in progress — at most ``pack_bytes`` (16 MiB) of
rows — never for the queue behind it (:func:`reading`). Rows in no memory tier that
are still staged here, their write not ended, a forward recalls from their staged copy
(:meth:`Writer.recall`) without asking the store; the writer lets go of them only once
the store has them, so a forward asking here first and the store next finds them.

Every writer of one store in a process — each cache over it has one — works through
one backlog, with one thread (:func:`_backlog_of`; the same store opened twice, at one
:meth:`~somatize.Store.address`, is one store here): rows one cache staged, another of
the same code (fingerprint) recalls. Each writer counts the rows it submitted, and is
told of the failures of those rows and of the rows it recalled from another's staged
copy (they answered right, but never reached the store); a flush of any waits for
every row queued before it, and so cannot run on that thread itself
(:class:`WaitsForItself`). Each
writer's rows are written through its own store object, under that object's lock
(:func:`store_lock`): a store opened twice, or a subclass of a store at the same
address, writes what its caches computed as it would alone.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import math
import multiprocessing.util
import numbers
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from somatize import Store, canonical
from somatize._numbers import finite
from somatize._threads import ProcessLock
from somatize.errors import SomatizeError
from somatize.store import JoinedWrite, StoreFull
from somatize.store._serial import holds_lock, reading, store_lock
from somatize_torch._row_codec import empty_rows, encode_batch_viewed, row_order, select_rows
from somatize_torch.codec import TENSOR, inverse_order

__all__ = ["KEY_BYTES", "WaitsForItself", "WriteFailed", "Writer", "reading", "store_lock"]

log = logging.getLogger("somatize.torch")


class WriteFailed(SomatizeError, OSError):
    """Answers computed in a forward could not be written to the store."""


class WaitsForItself(SomatizeError, RuntimeError):
    """A flush was called on the writer thread it would wait for (from inside a write), or
    on a thread holding the store lock that writer thread takes."""


# ------------------------------------------------------------------------------ the writer


class _Staged(Protocol):
    def wait(self) -> torch.Tensor: ...

    def release(self) -> None: ...


class _Plain:
    """A host copy made without the pinned pool: pinned when CUDA is, plain otherwise."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.event: Any = None
        if rows.is_cuda:
            self.host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
            self.host.copy_(rows, non_blocking=True)
            self.event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self.event.record()
        else:
            self.host = rows.detach().clone()

    def wait(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.host

    def release(self) -> None:
        self.event = None


class _FromEncoding:
    """Rows staged no more: read from the buffer their batch was encoded into, which the
    tensor viewing it keeps."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows

    def wait(self) -> torch.Tensor:
        return self.rows

    def release(self) -> None:
        pass


def _pool(max_bytes: int) -> Any:
    try:
        from somatize_torch._native import PinnedPool
    except ImportError:
        return None
    return PinnedPool(max_bytes)


KEY_BYTES = 320
"""What an unwritten row counts beside its own bytes: its store key (about 130 bytes) and
the entry a lookup finds it by (:meth:`Writer.recall`: up to about 130 more, as the dict
grows), held until the row is written. Rows of a few bytes (or none) are mostly their
keys, and counted by their bytes alone a queue of them behind a slow store would grow
without bound."""


_WAKE = "wake"
"""Put in the queue to end the writer's lingering at once (a flush is waiting)."""

_LET_GO = "let go"
"""Put in the queue when a writer is collected: the thread ends if it was the last."""


@dataclass
class _Job:
    keys: list[str]
    staged: _Staged
    nbytes: int
    account: _Account
    """The writer that submitted it: its counts, and where a failure of its rows is told."""
    store: Store
    """The writer's store object, which its rows are written through."""
    fingerprint: str | None = None
    seq: int = 0  # its place among the jobs submitted (from 1), given as it is queued
    order: list[int] | None = None
    """The order of the batch's dims in its memory, staged as it lies (None: C order)."""
    recalled_by: dict[int, tuple[_Account, set[int]]] = field(default_factory=dict)
    """The other writers that recalled rows of it from its staged copy (by their account's
    id): their accounts and the rows they took, told too if the write fails."""


@dataclass
class _Failure:
    """One write that failed: its jobs (``first`` to ``last``, consecutive, since one
    thread writes them in order), how many rows, why, and whether a forward or a flush
    has raised it yet."""

    first: int
    last: int
    rows: int
    error: BaseException
    reported: bool = False
    recalled: bool = False
    """Rows another writer submitted and this one recalled from their staged copy."""


@dataclass
class _Group:
    """The jobs of one write kept through one store object under one fingerprint (one
    group a write, unless writers of several modules, or of the store opened twice, share
    the thread): the joined write they go through, the bytes each row of each job is kept
    as (by the job's id), what failed them if anything did, the keys of theirs the store
    has all the same (:meth:`look_for_landed`), and the seconds spent writing them."""

    store: Store
    jobs: list[_Job] = field(default_factory=list)
    joined: JoinedWrite | None = None
    kept: dict[int, int] = field(default_factory=dict)
    error: BaseException | None = None
    landed: set[str] = field(default_factory=set)
    took: float = 0.0

    def failed(self, why: BaseException) -> None:
        """Fails the group's rows, all of them, for ``why``: what its joined write wrote
        so far is let go of, and none of it kept."""
        self.error = why
        if self.joined is None:
            return
        try:
            with store_lock(self.store):
                self.joined.abort()
        except BaseException as also:  # the thread goes on; what is left in tmp/ a gc sweeps
            log.error("somatize: a failed write could not be let go of: %s", _said(also))

    def look_for_landed(self) -> None:
        """Notes which rows of the group the store has though its write failed: a joined
        write cut into packs (where one fills) publishes each whole as it goes, so the
        packs published before the failure (a disk that filled on the last) are kept, and
        their rows are counted kept, not failed. None is, where the store cannot say."""
        if self.error is None or self.joined is None:  # never begun: nothing was written
            return
        keys = [key for job in self.jobs for key in job.keys]
        try:
            with store_lock(self.store):
                self.landed = set(self.store.have(keys))
        except BaseException as also:  # the thread goes on; the rows are counted failed
            log.error("somatize: which rows a failed write kept could not be told: %s", _said(also))


class _Account:
    """One writer's share of a backlog it may share with other writers of its store: the
    rows it kept or lost, and the failures of its rows (and of rows it recalled from
    another's staged copy) still to raise. Read and changed under the backlog's
    ``changed``."""

    def __init__(self) -> None:
        self.kept_rows = 0
        self.kept_bytes = 0
        self.failed_rows = 0
        self.took_s = 0.0
        # Writes of its rows that failed, until every flush that waited for them raised them.
        self.failures: list[_Failure] = []
        self.flushing: list[int] = []  # for each flush waiting: the jobs done as it began

    def afresh(self) -> _Account:
        """This account in a forked child: the counts so far, no failure to raise (the
        parent's writes are the parent's to report)."""
        fresh = _Account()
        fresh.kept_rows, fresh.kept_bytes = self.kept_rows, self.kept_bytes
        fresh.failed_rows, fresh.took_s = self.failed_rows, self.took_s
        return fresh


class Writer:
    """Keeps rows in a store from a background thread; see the module docstring.

    ``submit`` stages rows to host memory and returns at once; ``flush`` waits for
    everything submitted and raises :class:`WriteFailed` if any of it could not be
    written; ``check`` raises that without waiting.

    The writers of one store in a process share one backlog and one thread
    (:func:`_backlog_of`): rows one has staged and not yet written, the others recall
    (:meth:`recall`); each counts only the rows it submitted, and is told only of
    failures of its own rows and of those it recalled. ``pack_bytes`` and ``linger`` are
    that backlog's, so they are the same for every writer of the store: None keeps what
    they are (at first :data:`PACK_BYTES` and :data:`LINGER`), and a value other than
    one a live writer asked for is refused (``ValueError``); setting
    :attr:`linger` or :attr:`pack_bytes` on a writer changes them for all. Each writer's
    ``pending_bytes`` is its own: a submit of it waits while more than that many bytes
    of the store's rows (every writer's) are unwritten.

    The thread gathers what is submitted for up to ``linger`` seconds, or until
    ``pack_bytes`` have come, through one joined write of the store
    (:meth:`~somatize.Store.open_joined`): rows computed over many steps land in few
    packs, so a later recall of a shuffled batch opens few blobs, and a store that
    writes each batch as it comes (a directory) has only the pack to publish once the
    gathering ends. Rows staged and not yet kept are in memory only — a process killed then
    loses them (they are computed again next time), never anything published. A submit
    interrupted before it queued its rows (Ctrl-C during the copy) raises that and
    leaves them out: nothing waits for them, and nothing of them is published.

    Nothing that was submitted is lost when the writer is not closed: interpreter exit
    closes it, so does the end of a ``multiprocessing`` child (a DataLoader worker),
    which runs no ``atexit`` handler, and once every writer of a backlog is dropped its
    thread writes what it was given and ends (see :class:`_Backlog`).
    """

    def __init__(
        self,
        store: Store,
        fingerprint: str | None = None,
        *,
        pending_bytes: int = 512 << 20,
        pack_bytes: int | None = None,
        linger: float | None = None,
    ) -> None:
        self.store = store
        self.fingerprint = fingerprint
        self.pending_bytes = _bytes_setting("pending_bytes", pending_bytes)
        self._account = _Account()
        self._dropped: weakref.finalize[[_Backlog], Writer] | None = None
        backlog = _backlog_of(store, min(self.pending_bytes, 64 << 20))
        asked = {
            "pack_bytes": None if pack_bytes is None else _bytes_setting("pack_bytes", pack_bytes),
            "linger": None if linger is None else _linger_setting(linger),
        }
        backlog.agree(self, asked)
        self._begin(backlog)

    def _begin(self, backlog: _Backlog) -> None:
        """Works through ``backlog`` from now on: at creation, and in a forked child, which
        has none of its parent's threads and writes only what it submits itself (what the
        parent staged is the parent's to write)."""
        if self._dropped is not None:
            self._dropped.detach()  # the parent's backlog, which this process never writes
        self._backlog = backlog
        # Not at exit: the writer may still be used there, and _close_at_exit closes it
        # instead (a stop signal queued then would strand what is submitted after it).
        self._dropped = weakref.finalize(self, _let_go, backlog)
        self._dropped.atexit = False
        backlog.joined(self)

    def _own(self) -> None:
        """Starts afresh if this is a forked child of the process that made the backlog:
        with the backlog of this process for the store, its counts so far kept."""
        if self._backlog.pid == os.getpid():
            return
        # Once, for every thread of the child: two threads taking it up at once would each
        # make an account, and the rows (and failures) of the one replaced would be lost.
        with _BACKLOGS_LOCK:
            if self._backlog.pid != os.getpid():
                self._account = self._account.afresh()
                self._begin(_backlog_of(self.store, self._backlog.pool_bytes, self._backlog))

    # Settings live on the backlog, which the thread reads; counts on the account.

    @property
    def pack_bytes(self) -> int:
        """Bytes of rows the thread gathers, at most, into one joined write: the store's, for
        all its writers."""
        return self._backlog.pack_bytes

    @pack_bytes.setter
    def pack_bytes(self, value: int) -> None:
        self._backlog.pack_bytes = _bytes_setting("pack_bytes", value)
        self._backlog.asked["pack_bytes"] = weakref.WeakSet([self])

    @property
    def linger(self) -> float:
        """Seconds the thread waits for more rows before it keeps what it has: at most
        :data:`WORKER_LINGER` in a multiprocessing child, none in a Ray worker
        (:attr:`_Backlog.gathering`). The store's, for all its writers."""
        return self._backlog.gathering

    @linger.setter
    def linger(self, value: float) -> None:
        self._backlog.linger = _linger_setting(value)
        self._backlog.asked["linger"] = weakref.WeakSet([self])

    @property
    def kept_rows(self) -> int:
        """Rows this writer submitted that were written to the store."""
        return self._account.kept_rows

    @property
    def kept_bytes(self) -> int:
        """Bytes of the answers this writer submitted that were written to the store."""
        return self._account.kept_bytes

    @property
    def failed_rows(self) -> int:
        """Rows this writer submitted whose write failed."""
        return self._account.failed_rows

    @property
    def took_s(self) -> float:
        """Seconds the thread spent writing rows of this writer's (with any other rows
        written in the same calls)."""
        return self._account.took_s

    def submit(self, keys: Sequence[str], rows: torch.Tensor) -> None:
        """Stages ``rows`` (kept under ``keys``, one row each) and queues them for the store;
        a writer closed before starts its thread again."""
        if not keys:
            return
        self._own()
        backlog = self._backlog
        rows = rows.detach()
        # A batch in another order of its dims (channels_last) is staged and written as
        # its memory holds it: with no copy, and recalled with the strides it has.
        order = row_order(rows)
        if order is not None:
            rows = rows.permute(order)
        nbytes = rows.numel() * rows.element_size() + len(keys) * KEY_BYTES
        # The job is counted (what a flush waits for) in the same step that queues it:
        # an exception before that — Ctrl-C during the copy, a thread that cannot start —
        # gives back the bytes it reserved and its staging buffer, and leaves no job that
        # would never be done for a flush, or the interpreter's exit, to wait on.
        reserved = queued = False
        staged: _Staged | None = None
        try:
            with backlog.changed:
                # Past the budget rather than wait for ever where the thread writes through
                # a store lock this thread holds (a forward that code a collection ran).
                woken_after: int | None = None  # how many jobs were queued before its wake
                while (
                    backlog.pending > 0
                    and backlog.pending + nbytes > self.pending_bytes
                    and not backlog.locked_here()
                ):
                    if woken_after != backlog.submitted:
                        # The thread may be gathering what this waits for (until a flush,
                        # where linger is math.inf): it writes them now, as for a flush.
                        # Again for rows another thread queued meanwhile, behind the wake.
                        backlog.queue.put(_WAKE)
                        woken_after = backlog.submitted
                    backlog.changed.wait()
                backlog.pending += nbytes
                reserved = True
            pool = backlog.pool
            staged = pool.to_host(rows) if pool is not None else _Plain(rows)
            job = _Job(
                list(keys), staged, nbytes, self._account, self.store, self.fingerprint, order=order
            )
            held = {key: (job, i) for i, key in enumerate(job.keys)}
            with backlog.life:
                backlog.closed = False
                self._start()
                with backlog.changed:
                    job.seq = backlog.submitted + 1
                    # No Python code runs between these three: an interrupt lands before
                    # them or after the put.
                    backlog.submitted += 1
                    queued = True
                    backlog.queue.put(job)
                    # Found by a lookup from here until the thread is done with it.
                    backlog.unwritten.update(held)
        except BaseException:
            if not queued:
                if staged is not None:
                    staged.release()
                if reserved:
                    with backlog.changed:
                        backlog.pending -= nbytes
                        backlog.changed.notify_all()
            raise

    def recall(self, keys: dict[int, str]) -> tuple[list[int], torch.Tensor] | None:
        """The rows submitted under ``keys`` (batch position → key) and not written yet — by
        this writer or another of its store (or of the same store opened again) — read
        from their staged host copies: the positions found and their rows, in one host
        tensor laid out as the module laid them out; None if none is found.

        Answers are immutable, so a staged copy is as current as the store's will be. A row
        is found from its submit until its write has ended, kept or failed: once it failed
        it is no longer found, since its copy is let go, and a lookup computes it again (and
        submits it again); the failure itself is raised as it would be otherwise. Only rows
        a writer of the same ``fingerprint`` staged are found: rows under the same keys that
        other code computed (a class patched or redefined since) are computed again."""
        backlog = self._backlog
        if backlog.pid != os.getpid():
            return None  # a forked child's: what its parent staged is the parent's
        return _joined(backlog.recall(keys, self.fingerprint, self._account))

    def check(self) -> None:
        """Raises :class:`WriteFailed` for writes of this writer's rows that failed and that
        no forward or flush has raised yet."""
        self._own()
        self._backlog.check(self._account)

    def drain(self) -> None:
        """Waits until every row submitted so far has been written or has failed."""
        self._own()
        self._backlog.drain()

    def flush(self) -> None:
        """Waits until every row submitted so far (by every writer of the store) is in the
        store; raises :class:`WriteFailed` if a row of this writer's it waited for failed,
        or a failure of its rows no forward or flush raised yet. Each flush waiting for
        rows that failed raises, on every thread; a later flush, waiting for none that
        failed, does not."""
        self._own()
        self._backlog.flush(self._account)

    def close(self) -> None:
        """Flushes, then stops the thread (another writer of the store starts it again at
        its next submit)."""
        try:
            self.flush()
        finally:
            self._backlog.stop()

    def _start(self) -> None:
        self._backlog.start()


def _bytes_setting(name: str, value: object) -> int:
    """``value`` as a writer's setting ``name``, a count of bytes: a finite number, 0 or
    more, as a cache's memory budgets are (numpy's ints too); anything else is a ValueError
    saying so."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)  # numpy's int64 is no int, and is a number of bytes all the same
    if not finite(value) or value < 0:
        raise ValueError(
            f"{name}= is a number of bytes, 0 or more (16 MiB is 16 << 20), got {value!r}"
        )
    return int(value)


def _linger_setting(value: object) -> float:
    """``value`` as a writer's ``linger``: seconds, 0 or more, ``math.inf`` to gather until
    a flush or a full pack; anything else (NaN, a negative number, a string) is a ValueError
    saying so, not a thread that gathers nothing or dies."""
    # A number only (numpy's floats too): float() would read the string "1" as seconds,
    # where the byte counts beside it refuse "16M"
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    seconds = float(value) if number else math.nan  # type: ignore[arg-type]
    if not seconds >= 0:
        raise ValueError(
            f"linger= is how many seconds rows are gathered, 0 or more (math.inf to gather "
            f"until a flush or a full pack), got {value!r}"
        )
    return seconds


PACK_BYTES = 16 << 20
"""Bytes of rows a store's writer thread gathers, at most, into one joined write."""

LINGER = 1.0
"""Seconds a store's writer thread waits for more rows before it keeps what it has."""

WORKER_LINGER = 0.2
"""Seconds, at most, a multiprocessing child's writer thread (a DataLoader worker's) waits
for more rows. A child that ends on its own writes what it gathered as it ends (a
finalizer with an exit priority), so a Dataset caching a sample at a time in
``__getitem__`` writes a pack of many rows, not a file a sample. A worker terminated
(``SIGTERM``: persistent workers at their parent's exit, ``with Pool()``) runs nothing,
and loses at most this much of its rows, computed again next time."""

_BACKLOGS: dict[tuple[str, object], weakref.ref[_Backlog]] = {}
"""The backlog of each store in this process: by the store's address where it has one (the
same store opened twice shares it), else by the store object (its id, while it lives)."""

_BACKLOGS_LOCK = ProcessLock()


def _place(store: Store) -> tuple[str, object]:
    """What tells ``store`` from others for :data:`_BACKLOGS`: its address (which names its
    kind, its place and its signing key), else the object itself."""
    try:
        address = store.address()
        if address is not None:
            return ("at", canonical.encode(address))
    except Exception:  # a store that cannot describe itself: known by its object
        pass
    return ("object", id(store))


def _backlog_of(store: Store, pool_bytes: int, like: _Backlog | None = None) -> _Backlog:
    """The backlog of ``store`` in this process, made if it has none (with ``like``'s
    settings, the backlog a forked child's writer served in its parent); its staging pool
    holds ``pool_bytes`` at least."""
    place = _place(store)
    pid = os.getpid()
    with _BACKLOGS_LOCK:
        held = _BACKLOGS.get(place)
        backlog = held() if held is not None else None
        if (
            backlog is not None
            and backlog.pid == pid
            and (place[0] == "at" or backlog.store is store)
        ):
            if pool_bytes > backlog.pool_bytes:  # as large as the largest writer asks
                backlog.pool_bytes = pool_bytes
                if backlog.pool is not None:
                    backlog.pool.max_bytes = pool_bytes
            return backlog
        backlog = _Backlog(
            store,
            pack_bytes=PACK_BYTES if like is None else like.pack_bytes,
            linger=LINGER if like is None else like.linger,
            pool_bytes=pool_bytes,
        )
        for gone in [at for at, ref in _BACKLOGS.items() if ref() is None]:
            del _BACKLOGS[gone]
        _BACKLOGS[place] = weakref.ref(backlog)
    _at_exit(_close_at_exit, weakref.ref(backlog))
    return backlog


class _Backlog:
    """What a store's writer thread works through: the rows queued for it, what is still to
    be written, and the thread itself; shared by the writers of that store in one process
    (:func:`_backlog_of`), each with an :class:`_Account` of its own.

    The thread holds this and never a :class:`Writer`, so a writer nobody uses any more
    is collected; its finalizer (:func:`_let_go`) queues a signal behind every row it was
    given, and once that signal finds no writer of this backlog alive and nothing left to
    write, the thread ends and lets this backlog and its staging pool go. A backlog serves
    the process that made it: a forked child makes its own, since it inherits neither
    the thread nor a usable lock.
    """

    def __init__(
        self,
        store: Store,
        *,
        pack_bytes: int,
        linger: float,
        pool_bytes: int,
    ) -> None:
        self.pid = os.getpid()
        self.store = store
        self.pack_bytes = pack_bytes
        self.linger = linger  # as asked; see `gathering`
        self.pool_bytes = pool_bytes
        self.pool = _pool(pool_bytes)
        self.queue: queue.SimpleQueue[_Job | str | None] = queue.SimpleQueue()
        self.changed = threading.Condition()
        self.submitted = 0
        self.done = 0
        self.pending = 0
        # Each row submitted and not yet written or failed, by key: its job and its place
        # in it. Read and changed under `changed`; a job's entries go before its staging
        # buffer is let go, so a lookup holding `changed` reads a buffer still its own.
        self.unwritten: dict[str, tuple[_Job, int]] = {}
        self.thread: threading.Thread | None = None
        self.ended: threading.Thread | None = None  # a thread that ended on its own, last
        # Held while the thread is started and a job queued, and while it is stopped: a
        # job is never queued behind the stop signal of a thread that is going away.
        self.life = threading.Lock()
        self.closed = False
        self.hooked_to_child_exit = False
        # The writers working through it (weakly): the thread ends once none is left.
        self.users: list[weakref.ref[Writer]] = []
        # The writers that asked for each setting as it is now (weakly), while they live.
        self.asked: dict[str, weakref.WeakSet[Writer]] = {}

    def agree(self, writer: Writer, asked: dict[str, int | float | None]) -> None:
        """Takes the settings ``writer`` asks for (None: none asked), or refuses them, all,
        where one differs from what a live writer of this backlog asked for: they are the
        store's, for all its writers, and taking them would change that writer's under it."""
        with _BACKLOGS_LOCK:
            for name, value in asked.items():
                others = [other for other in self.asked.get(name, ()) if other is not writer]
                now = getattr(self, name)
                if value is not None and others and value != now:
                    raise ValueError(
                        f"a writer of {self.store!r} asked for {name}={now!r}, and this one for "
                        f"{name}={value!r}: the writers of one store share one thread, and its "
                        f"{name}. Ask for the same {name} (or none, to take the store's), or "
                        f"set `writer.{name}` on one writer to change it for every writer of "
                        "the store"
                    )
            for name, value in asked.items():
                if value is None:
                    continue
                if value != getattr(self, name):  # no live writer asked for what it was
                    setattr(self, name, value)
                    self.asked[name] = weakref.WeakSet()
                self.asked.setdefault(name, weakref.WeakSet()).add(writer)

    def joined(self, writer: Writer) -> None:
        """Counts ``writer`` among those working through this backlog."""
        with _BACKLOGS_LOCK:
            self.users = [ref for ref in self.users if ref() is not None]
            self.users.append(weakref.ref(writer))

    @property
    def gathering(self) -> float:
        """Seconds rows are gathered before they are written: ``linger``; in a
        multiprocessing child (a DataLoader worker) at most :data:`WORKER_LINGER`, and
        none in a Ray worker (:func:`_in_a_ray_worker`), so that little is left unwritten
        when it is ended with no chance to flush. Asked as the thread runs: a child started
        by spawn or a forkserver makes the caches it is handed before it knows it has a
        parent."""
        if _in_a_ray_worker():
            return 0.0
        if multiprocessing.parent_process() is not None:
            return min(self.linger, WORKER_LINGER)
        return self.linger

    def start(self) -> None:
        """Starts the thread if none runs; called with ``life`` held."""
        if self.thread is None:
            if not self.hooked_to_child_exit:
                # A multiprocessing child (a DataLoader worker) ends with os._exit, which
                # runs no atexit handler, only the finalizers given an exit priority, as its
                # target returns. Registered with the first thread rather than at creation:
                # a child started by spawn or a forkserver unpickles its target's arguments
                # (a cache among them) before it forgets the finalizers registered so far.
                closing = weakref.ref(self)
                multiprocessing.util.Finalize(
                    self, _close_at_exit, args=(closing,), exitpriority=10
                )
                self.hooked_to_child_exit = True
            thread = threading.Thread(
                target=_run, args=(self,), name="somatize-writer", daemon=True
            )
            self.thread = thread
            thread.start()

    def unused(self) -> bool:
        """Whether the thread may end now, no writer of this backlog being alive and nothing
        left to write; if so, it is marked ended, so that a writer made from here on starts
        another. Never waits: a submit or a stop under way (holding ``life``) means it may
        not (a live writer), or that a stop signal follows."""
        if not self.life.acquire(blocking=False):
            return False
        try:
            if any(ref() is not None for ref in list(self.users)):
                return False
            with self.changed:
                if self.done < self.submitted:
                    return False
            self.ended, self.thread = self.thread, None
            return True
        finally:
            self.life.release()

    def recall(
        self, keys: dict[int, str], fingerprint: str | None, account: _Account
    ) -> list[tuple[list[int], torch.Tensor]]:
        """:meth:`Writer.recall`, from this backlog alone: the rows found that writers of
        ``fingerprint`` staged, a piece per job; each job found notes ``account`` (when it
        is another writer's) among those told if its write fails. Read under ``changed``,
        which a write holds while it lets go of its rows' entries, before it lets go of
        their staging buffers, and while it counts what failed."""
        with self.changed:
            unwritten = self.unwritten
            # As a rule none is staged (rows computed now): told in one pass mapped in C.
            if unwritten.keys().isdisjoint(keys.values()):
                return []
            found: dict[int, tuple[_Job, list[int], list[int]]] = {}
            for position, key in keys.items():
                held = unwritten.get(key)
                if held is not None and held[0].fingerprint == fingerprint:
                    job, slot = held
                    place = found.get(id(job))
                    if place is None:
                        place = found[id(job)] = (job, [], [])
                    place[1].append(position)
                    place[2].append(slot)
            pieces: list[tuple[list[int], torch.Tensor]] = []
            for job, positions, slots in found.values():
                if job.account is not account:
                    job.recalled_by.setdefault(id(account), (account, set()))[1].update(slots)
                # As staged: the batch permuted into the order of its dims in memory, dim
                # 0 first, so its rows are taken along dim 0 and put back as they lay.
                staged = job.staged.wait()
                taken = select_rows(staged, torch.tensor(slots, dtype=torch.long))
                if job.order is not None:
                    taken = taken.permute(inverse_order(job.order))
                pieces.append((positions, taken))
        return pieces

    def check(self, account: _Account) -> None:
        """Raises :class:`WriteFailed` for writes of ``account``'s rows that failed and that
        no forward or flush has raised yet."""
        if not account.failures:
            # As a rule none failed: asked at every forward, that costs no lock. A failure
            # noted just after this look is raised by the next forward, as one noted just
            # after the lock's look would be.
            return
        with self.changed:
            failed = [failure for failure in account.failures if not failure.reported]
            self._reported(account, failed)
        self._raise(failed)

    def flush(self, account: _Account) -> None:
        """Waits for every job submitted so far, then raises :class:`WriteFailed` for those
        of ``account``'s that failed and for its failures not raised yet. Two flushes
        waiting for the same failed rows (on two threads) both raise; a flush after one
        that raised, and waiting for no failed rows itself, does not."""
        with self.changed:
            began = self.done  # jobs 1..began were through before this flush began
            target = self.submitted
            unreported = [failure for failure in account.failures if not failure.reported]
            account.flushing.append(began)
        try:
            self._wait_for(target)
        finally:
            with self.changed:
                account.flushing.remove(began)
                waited = [
                    failure
                    for failure in account.failures
                    if failure.last > began and failure.first <= target
                ]
                failed = [*unreported, *(f for f in waited if f not in unreported)]
                self._reported(account, failed)
        self._raise(failed)

    def _reported(self, account: _Account, failed: list[_Failure]) -> None:
        """Marks ``failed`` raised, and forgets the failures raised that no flush under way
        waited for; called with ``changed`` held."""
        for failure in failed:
            failure.reported = True
        oldest = min(account.flushing, default=None)
        account.failures = [
            failure
            for failure in account.failures
            if not failure.reported or (oldest is not None and failure.last > oldest)
        ]

    def _raise(self, failed: list[_Failure]) -> None:
        if not failed:
            return
        error = failed[0].error
        computed = sum(failure.rows for failure in failed if not failure.recalled)
        recalled = sum(failure.rows for failure in failed if failure.recalled)
        lost = " and ".join(
            [
                *([f"{computed} computed rows"] if computed else []),
                *(
                    [
                        f"{recalled} rows recalled from another cache's staged write "
                        "(answered right, from its copy)"
                    ]
                    if recalled
                    else []
                ),
            ]
        )
        full = isinstance(error, StoreFull) or (
            isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
        )
        remedy = "Free space (or fix the store)" if full else "Fix what it says"
        raise WriteFailed(
            f"{lost} could not be written to {self.store!r}: "
            f"{_said(error)}. Those a memory tier holds are answered from it for the rest "
            "of this process and computed again by a later run; those in no memory tier "
            f"are computed and written again when next looked up. {remedy} and go on; "
            "`flush()` reports whether later writes succeed"
        ) from error

    def drain(self) -> None:
        """Waits until every job submitted so far has been written or has failed."""
        with self.changed:
            target = self.submitted
        self._wait_for(target)

    def _wait_for(self, target: int) -> None:
        """Waits until jobs 1 to ``target`` have been written or have failed; refuses to
        on the writer thread, which is in the middle of writing some of them."""
        with self.changed:
            if self.done < target and self.thread is threading.current_thread():
                raise WaitsForItself(
                    f"a flush of a cache over {self.store!r} ran on the store's writer thread, "
                    "inside a write (a store's joined write, or a finalizer the garbage "
                    "collector ran there), and would wait for that write, and so for ever. "
                    "Flush from another thread; the rows are written as the thread goes on"
                )
            if self.done < target and self.locked_here():
                raise WaitsForItself(
                    f"a flush of a cache over {self.store!r} ran while this thread holds the "
                    "lock the store's writer thread takes to write (code run inside a call into "
                    "the store: a finalizer, or a signal handler), and would wait for that "
                    "thread, which waits for it, for ever. Flush from ordinary code (a signal "
                    "handler may raise SystemExit: exit flushes); the rows are written as the "
                    "thread goes on"
                )
            if self.done < target:
                self.queue.put(_WAKE)
            while self.done < target:
                self.changed.wait()

    def locked_here(self) -> bool:
        """Whether the calling thread holds a lock this backlog's thread takes to write
        through one of its stores (:func:`store_lock`, or the store's own), which the thread
        would wait for."""
        for ref in list(self.users):
            writer = ref()
            if writer is None:
                continue
            if holds_lock(writer.store) or writer.store._held_here():
                return True
        return False

    def stop(self) -> None:
        """Stops the thread once it has written what is queued; it starts again at the
        next submit. On the writer thread itself (a close inside a write, whose flush
        refused), or on a thread holding a store lock it writes through, it leaves the
        thread running: it cannot wait for its own end, nor for one that waits for it."""
        if self.thread is threading.current_thread() or self.locked_here():
            return
        with self.life:
            self.closed = True
            if self.thread is not None:
                self.queue.put(None)
                self.thread.join()
                self.thread = None
            # One that ended as its last writer was let go may still be on its way out:
            # at exit, a thread still running as the interpreter finalizes can abort it.
            ended, self.ended = self.ended, None
            if ended is not None and ended is not threading.current_thread():
                ended.join()

    def take(self, gathered: dict[tuple[int, str | None], _Group], job: _Job) -> None:
        """Adds ``job`` to the write being gathered: its rows encoded into one buffer and
        handed to the joined write of its group (of one store object and fingerprint),
        begun with the group's first job. A directory writes them to ``tmp/`` there and
        then, so that once the gathering ends little is left to write. Once a job of the
        group has failed, the rest of its jobs join it unwritten, and fail with it."""
        group = gathered.get((id(job.store), job.fingerprint))
        if group is None:
            group = gathered[(id(job.store), job.fingerprint)] = _Group(job.store)
        group.jobs.append(job)
        if group.error is not None:
            return
        start = time.perf_counter()
        try:
            # Nothing is done a row at a time here, nor by a store that packs them.
            batch, step, viewed = encode_batch_viewed(job.staged.wait(), job.order)
            with store_lock(group.store):
                if group.joined is None:
                    group.joined = group.store.open_joined(TENSOR.name, job.fingerprint)
                group.joined.add(job.keys, batch, [step] * len(job.keys))
            group.kept[id(job)] = step
            if viewed is not None:
                # Recalled from the encoded buffer until they are published: the staging
                # buffer goes back to the pool now, for the next batch, rather than once
                # the pack is out (a first epoch would page-lock a new one every batch).
                with self.changed:
                    staged, job.staged = job.staged, _FromEncoding(viewed)
                staged.release()
        except BaseException as why:  # reported at the next forward or flush, never swallowed
            group.failed(why)
        finally:
            group.took += time.perf_counter() - start

    def write(self, groups: list[_Group]) -> None:
        """Keeps what was gathered, closing each group's joined write, and counts what was
        kept or failed, for the writer of each job."""
        for group in groups:
            self._keep(group)
        # Counted done only once all of them are through: jobs 1..done are written.
        with self.changed:
            for group in groups:
                jobs, error = group.jobs, group.error
                for account in {id(job.account): job.account for job in jobs}.values():
                    mine = [job for job in jobs if job.account is account]
                    rows = sum(len(job.keys) for job in mine)
                    account.took_s += group.took
                    kept = {id(job): _landed_in(group, job) for job in mine}
                    kept_rows = sum(kept.values())
                    account.kept_rows += kept_rows
                    account.kept_bytes += sum(
                        group.kept.get(id(job), 0) * kept[id(job)] for job in mine
                    )
                    if error is not None and kept_rows < rows:
                        account.failed_rows += rows - kept_rows
                        failed = _Failure(mine[0].seq, mine[-1].seq, rows - kept_rows, error)
                        account.failures.append(failed)
                if error is not None:
                    # Rows other writers recalled from these jobs' staged copies answered
                    # right but never reached the store: those writers are told too.
                    _tell_recallers(jobs, error, group.landed)
            self.pending -= sum(job.nbytes for group in groups for job in group.jobs)
            self.done += sum(len(group.jobs) for group in groups)
            self.changed.notify_all()

    def _keep(self, group: _Group) -> None:
        """Closes ``group``'s joined write, keeping its rows (or notes why they were not),
        then lets go of them: no lookup finds them staged here any more."""
        start = time.perf_counter()
        try:
            if group.error is None and group.joined is not None:
                with store_lock(group.store):
                    group.joined.close()
        except BaseException as why:
            # Whatever ended the write — an error, an async store's CancelledError, a
            # KeyboardInterrupt or SystemExit raised by a store (no signal reaches this
            # thread) — fails these rows only: the thread goes on, or every flush and the
            # interpreter's exit would wait for rows no thread writes.
            group.failed(why)
        finally:
            group.took += time.perf_counter() - start
            group.look_for_landed()
            rows = sum(len(job.keys) - _landed_in(group, job) for job in group.jobs)
            if group.error is not None and rows:
                log.error(
                    "somatize: %d computed rows could not be written: %s",
                    rows,
                    _said(group.error),
                )
            with self.changed:  # no lookup finds these rows here any more, then let go
                unwritten = self.unwritten
                for job in group.jobs:
                    for key in job.keys:
                        held = unwritten.get(key)
                        if held is not None and held[0] is job:
                            del unwritten[key]
            for job in group.jobs:
                job.staged.release()


def _landed_in(group: _Group, job: _Job) -> int:
    """How many rows of ``job`` (of ``group``) are in the store: all of them where the
    group's write did not fail, else those it kept all the same
    (:meth:`_Group.look_for_landed`)."""
    if group.error is None:
        return len(job.keys)
    return sum(key in group.landed for key in job.keys)


def _tell_recallers(jobs: list[_Job], error: BaseException, landed: set[str]) -> None:
    """Adds to each account that recalled rows of ``jobs`` (failed with ``error``) a failure
    of the rows it recalled that the store does not have (``landed`` it has); called with
    the backlog's ``changed`` held."""
    told: dict[int, _Failure] = {}
    for job in jobs:
        for key, (account, taken) in job.recalled_by.items():
            slots = [slot for slot in taken if job.keys[slot] not in landed]
            if not slots:
                continue
            failure = told.get(key)
            if failure is None:
                failure = told[key] = _Failure(job.seq, job.seq, 0, error, recalled=True)
                account.failures.append(failure)
            failure.first, failure.last = min(failure.first, job.seq), max(failure.last, job.seq)
            failure.rows += len(slots)


def _joined(pieces: list[tuple[list[int], torch.Tensor]]) -> tuple[list[int], torch.Tensor] | None:
    """The rows of ``pieces`` (positions and rows, as :meth:`_Backlog.recall` finds them) in
    one tensor, laid out as the first; pieces of another shape or dtype (never under one
    key) are left out, and their rows computed."""
    pieces = [piece for piece in pieces if piece[0]]
    if not pieces:
        return None
    if len(pieces) == 1:
        return pieces[0]
    first = pieces[0][1]
    pieces = [
        (at, rows)
        for at, rows in pieces
        if (rows.shape[1:], rows.dtype) == (first.shape[1:], first.dtype)
    ]
    at = [p for positions, _ in pieces for p in positions]
    out = empty_rows((len(at), *first.shape[1:]), row_order(first), first.dtype, first.device)
    start = 0
    for _, rows in pieces:
        out[start : start + rows.shape[0]].copy_(rows)
        start += rows.shape[0]
    return at, out


def _said(error: BaseException) -> str:
    """``error`` in a message: its kind, and what it says if anything (a CancelledError or
    a KeyboardInterrupt usually says nothing)."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _run(backlog: _Backlog) -> None:
    """The writer thread: takes jobs from the queue and writes them until the stop signal,
    or until a writer let go finds none left (:meth:`_Backlog.unused`)."""
    stop = False
    while not stop:
        job = backlog.queue.get()
        if not isinstance(job, _Job):
            stop = job is None or (job == _LET_GO and backlog.unused())
            continue
        gathered: dict[tuple[int, str | None], _Group] = {}
        backlog.take(gathered, job)
        size = job.nbytes
        let_go = False
        # Linger a little for more rows, so that rows computed in many steps are packed
        # into few blobs (a recall then reads few); a flush or close cuts it short.
        until = time.monotonic() + backlog.gathering
        while size < backlog.pack_bytes:
            # At most the longest wait a lock takes: a linger of hours, or math.inf, gathers
            # until a flush or a full pack, where a longer timeout would end the thread.
            left = min(until - time.monotonic(), threading.TIMEOUT_MAX)
            try:
                more = backlog.queue.get(timeout=left) if left > 0 else backlog.queue.get_nowait()
            except queue.Empty:
                break
            if not isinstance(more, _Job):
                stop = more is None
                let_go = more == _LET_GO
                break
            backlog.take(gathered, more)
            size += more.nbytes
        backlog.write(list(gathered.values()))
        if let_go and not stop:
            stop = backlog.unused()


def _in_a_ray_worker() -> bool:
    """Whether this process is a Ray worker, which writes rows as they come: an actor is
    ended by ``ray.kill``, and a job's driver goes on, reading the store, while the actors
    it let go of still exit (gathering for 0.2 s left 11% of a 4,096-row job's rows
    unwritten as it returned, for 1 s all of them; a pack a batch is the price). Ray is
    looked for only where it is imported already: a Ray worker imports it before it runs
    anything."""
    ray = sys.modules.get("ray")
    # Only a process connected to Ray is asked: `get_runtime_context` starts a cluster in
    # one that is not. Ray still being imported has neither name yet.
    connected = getattr(ray, "is_initialized", None)
    if ray is None or connected is None or not connected():
        return False
    worker = getattr(ray.get_runtime_context(), "worker", None)
    return getattr(worker, "mode", None) == getattr(ray, "WORKER_MODE", object())


def _let_go(backlog: _Backlog) -> None:
    """Called when a writer is collected: queues a signal behind every job it submitted,
    at which its thread, having written them all, ends if no other writer of the backlog
    is left. Only a put, which never waits: a collection may run on any thread, the
    writer's own included, and at any point, locks of this module held or not."""
    backlog.queue.put(_LET_GO)


def _at_exit(call: Callable[[weakref.ref[_Backlog]], None], ref: weakref.ref[_Backlog]) -> None:
    """Has ``call(ref)`` run at interpreter exit twice: first before the interpreter's
    thread pools stop taking work — ``atexit`` handlers run after, where a store that hashes
    a large pack on a pool could not keep it and the rows would be lost — then once more
    as an ``atexit`` handler, for rows a later handler or a thread still running submits."""
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        with contextlib.suppress(RuntimeError):  # the interpreter is exiting already
            register(call, ref)
    atexit.register(call, ref)


def _close_at_exit(ref: weakref.ref[_Backlog]) -> None:
    """Writes what is staged and stops the thread: a daemon thread still running when the
    interpreter finalizes is stopped wherever it is, which inside native code (torch, a
    hasher) can abort the process, and one in a multiprocessing child is lost with it.
    A backlog a forked child inherited is its parent's to write."""
    backlog = ref()
    if backlog is None or backlog.pid != os.getpid() or backlog.closed:
        return
    try:
        backlog.drain()
    finally:
        backlog.stop()
    for user in list(backlog.users):
        writer = user()
        if writer is not None:
            try:
                backlog.check(writer._account)
            except WriteFailed as why:
                log.error("somatize: at exit, %s", why)
