"""One lock per store object, for the stores that may not be read while written.

A store class says whether one object of it may be read by one thread while another
writes through it (:attr:`~somatize.Store.shared_by_threads`): a directory's and a
bucket's may. A store of a class of a user's own says no unless it says otherwise, and
then every caller that may run beside a thread writing through it — a row cache's
writer thread, a forward of a graph, a forward of a row cache — calls it under this
one lock of the object's, so that its calls never overlap. The lock lives here, in the
core, because both the core's forwards and the torch package's writer take it.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from somatize._threads import ProcessLock
from somatize.store.base import Store

__all__ = ["holds_lock", "reading", "serially", "store_lock"]

_T = TypeVar("_T")

_LOCKS: dict[int, tuple[weakref.ref[Store], ProcessLock]] = {}
"""A live store object's ``id`` → the object (weakly) and its lock. Keyed by identity, not
by the store's hash: a store of a user's own may compare by value (a dataclass), which
leaves it unhashable, and two equal stores are two objects, each with its own calls."""
_LOCKS_LOCK = ProcessLock()


def store_lock(store: Store) -> ProcessLock:
    """The lock held around every call into ``store`` that may overlap a write through it
    on another thread (one per store object)."""
    with _LOCKS_LOCK:
        lock = _lock_of(store)
        if lock is None:
            lock = ProcessLock()
            key = id(store)
            _LOCKS[key] = (weakref.ref(store, lambda ref: _forget(key, ref)), lock)
        return lock


def _lock_of(store: Store) -> ProcessLock | None:
    """The lock :func:`store_lock` made for ``store``, if it made one (caller holds
    ``_LOCKS_LOCK``): not one of a collected object whose ``id`` it now has."""
    found = _LOCKS.get(id(store))
    return found[1] if found is not None and found[0]() is store else None


def _forget(key: int, ref: weakref.ref[Store]) -> None:
    """Drops the lock of a store object just collected, unless its ``id`` already names
    another's."""
    with _LOCKS_LOCK:
        found = _LOCKS.get(key)
        if found is not None and found[0] is ref:
            del _LOCKS[key]


def reading(store: Store) -> contextlib.AbstractContextManager[object]:
    """What a caller holds while it calls ``store``: nothing where one thread may read it
    while another writes through it, so that a forward never waits for a write in
    progress; else :func:`store_lock`, which a writer thread holds as it writes."""
    return contextlib.nullcontext() if store.shared_by_threads else store_lock(store)


def serially(store: Store, call: Callable[..., _T], *args: Any) -> _T:
    """``call(*args)``, a call into ``store``, made as :func:`reading` says: under
    :func:`store_lock` where ``store`` may not be read while another thread writes through
    it, else straight. A recalled forward of a graph calls its store this way, and enters
    no context for a store shared by threads: each costs as much as the store's lookup."""
    if store.shared_by_threads:
        return call(*args)
    with store_lock(store):
        return call(*args)


def holds_lock(store: Store) -> bool:
    """Whether the calling thread holds :func:`store_lock` of ``store`` (which a thread
    writing through it would wait for)."""
    with _LOCKS_LOCK:
        lock = _lock_of(store)
    return lock is not None and lock.held_here()
