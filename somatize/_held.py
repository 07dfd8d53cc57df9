"""What a node holds: its attributes, in its ``__dict__`` and in slots, and which of them
tell two nodes apart.

What built a node is its declaration; what it holds afterwards can say more. The graph
watches the constructor arguments a node keeps as attributes
(:meth:`~somatize.node.Node.kept_arguments`), and tells apart two nodes built alike by
what they hold (:func:`held_by`): one given another value after it was made
(``plus.offset = 100``) computes other answers, and a copy a worker rebuilds from the
constructor call must hold what the original held — less what the node changed itself
while it ran here (:class:`Holding`). Each reads a node through
:func:`attributes_of`, which sees a class with ``__slots__`` as it sees one without: a
slot holds no less than the ``__dict__`` does. These are re-exported by
:mod:`somatize.node`, their public home.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from somatize import canonical
from somatize._threads import ProcessLock

__all__ = [
    "UNSET",
    "Holding",
    "attributes_of",
    "digest_of",
    "held_by",
    "holding_of",
    "in_slot",
    "running_here",
    "slots_of",
]


_SLOTS: weakref.WeakKeyDictionary[type, tuple[tuple[str, int], ...]] = weakref.WeakKeyDictionary()
"""A class → each of its slots' names, with the place in its MRO of the class that declares
it: its descriptor holds that class, which may be the class itself, and held here it would
never be freed (a notebook's cell run again makes its classes anew)."""


def slots_of(kind: type) -> tuple[tuple[str, Any], ...]:
    """The attributes instances of ``kind`` hold in slots rather than in their ``__dict__``:
    each name a class along its MRO declares in ``__slots__`` (but ``__dict__`` and
    ``__weakref__``), nearest first, with the descriptor that reads it. Worked out once per
    class; empty for most."""
    mro = kind.__mro__
    found = _SLOTS.get(kind)
    if found is None:
        seen: dict[str, int] = {}
        for at, owner in enumerate(mro):
            declared = vars(owner).get("__slots__", ())
            for name in (declared,) if isinstance(declared, str) else declared:
                if name in ("__dict__", "__weakref__"):
                    continue
                if name.startswith("__") and not name.endswith("__"):  # mangled, as Python does
                    name = f"_{owner.__name__.lstrip('_')}{name}"
                slot = vars(owner).get(name)
                if name not in seen and hasattr(slot, "__get__"):
                    seen[name] = at
        found = _SLOTS[kind] = tuple(seen.items())
    if not found:
        return ()
    return tuple((name, vars(mro[at]).get(name)) for name, at in found)


def in_slot(slot: Any, node: Any) -> Any:
    """What ``node`` holds in ``slot`` (a descriptor :func:`slots_of` found), or
    :data:`UNSET` when the slot is not set."""
    try:
        return slot.__get__(node, type(node))
    except AttributeError:
        return UNSET


UNSET: Any = object()
"""What :func:`in_slot` answers for a slot that holds nothing: no value is it."""


def attributes_of(node: Any) -> dict[str, Any]:
    """What ``node`` holds as attributes: its ``__dict__`` and, for a class with
    ``__slots__``, each slot that is set (:func:`slots_of`). The ``__dict__`` itself when
    there are no slots."""
    held: dict[str, Any] = vars(node)
    slots = slots_of(type(node))
    if not slots:
        return held
    held = dict(held)
    for name, slot in slots:
        value = in_slot(slot, node)
        if value is not UNSET:
            held[name] = value
    return held


def held_by(node: Any) -> tuple[tuple[str, str], ...]:
    """What ``node`` holds besides what it was built with, as far as telling two nodes apart
    needs: each public attribute with a canonical form, by that form. Two nodes built alike
    and then given other values (``plus.offset = 100``) compute other answers, and are not
    one node; equal values (an empty dict each, for a cache) are. Other objects — a module
    whose weights are the node's state, a client — are not looked at."""
    held = []
    for name, value in attributes_of(node).items():
        if name.startswith("_"):
            continue  # a node class's own bookkeeping
        digest = digest_of(value)
        if digest is not None:
            held.append((name, digest))
    return tuple(sorted(held))


def digest_of(value: Any) -> str | None:
    """The digest :func:`held_by` tells an attribute holding ``value`` by: that of its
    canonical form, or None when it has none (or is :data:`UNSET`). A memoryview of other
    than bytes in one dimension (typed items, several dimensions), which has none, is told
    by its format, its shape and its bytes."""
    if value is UNSET:
        return None
    try:
        return canonical.hex_of(value)
    except canonical.NotCanonical:
        if type(value) is memoryview:
            view = (value.format, value.shape, value.tobytes())
            return canonical.hex_of(view, b"somatize/memoryview\0")
        return None


_HOLDING = ProcessLock()
"""Held while a :class:`Holding` is made or looked at: unheld in a forked child (a
DataLoader worker forked as another thread runs a node), which runs nodes too."""


class Holding:
    """What a copy of a node, rebuilt elsewhere from its constructor call, must hold (a
    network worker's): what the node held when first looked at, and each public value
    given to it since by whoever holds it (``p.k = 5``, before the graph was built or
    after) — but not what the node changes itself while it runs in this process (a
    counter), which a copy running elsewhere changes on its own, as it runs there.

    Told apart by when a value changes: between the node's runs here, or during one
    (:func:`running_here`); what changes while it runs here, from another thread too, is
    its own. Each start and stop of a run here digests the node's public attributes (a
    node that keeps much data does so best in private ones). One per node, whichever
    graphs it is in (:func:`holding_of`), looked at under one lock for all."""

    def __init__(self, node: Any) -> None:
        self._owed = dict(held_by(node))
        self._seen = dict(self._owed)
        self._running = 0

    def copied(self) -> Holding:
        """This holding, for a copy of its node (``copy.copy``, ``copy.deepcopy``), which
        holds what the node held, and changes on its own from then on."""
        with _HOLDING:
            other = Holding.__new__(Holding)
            other._owed, other._seen, other._running = dict(self._owed), dict(self._seen), 0
            return other

    def owed(self, node: Any, follows: Iterable[str] = ()) -> tuple[tuple[str, str], ...]:
        """What a copy of ``node`` must hold now (:func:`held_by`'s form); the attributes
        in ``follows`` as the node holds them, even as it changed them itself (arguments
        it keeps, which the copy is rebuilt with)."""
        with _HOLDING:
            self._look(node)
            for name in follows:
                if name in self._seen:
                    self._owed[name] = self._seen[name]
                else:
                    self._owed.pop(name, None)
            return tuple(sorted(self._owed.items()))

    def _look(self, node: Any) -> None:
        now = dict(held_by(node))
        if now == self._seen:
            return
        if not self._running:  # given by whoever holds it
            for name in self._seen.keys() | now.keys():
                if name not in now:
                    self._owed.pop(name, None)
                elif now[name] != self._seen.get(name):
                    self._owed[name] = now[name]
        self._seen = now

    def start(self, node: Any) -> None:
        """``node`` starts running here: what changed since it was last looked at was given
        to it; what changes from now on, until it stops, is its own."""
        with _HOLDING:
            self._look(node)
            self._running += 1

    def stop(self, node: Any) -> None:
        """``node`` stopped running here: what it holds now, as far as it changed it, is its
        own."""
        with _HOLDING:
            self._running -= 1
            self._seen = dict(held_by(node))


def holding_of(node: Any) -> Holding:
    """The :class:`Holding` of ``node``, made the first time it is asked for."""
    marks = node._smz
    found: Holding | None = marks.holding
    if found is None:
        with _HOLDING:
            found = marks.holding
            if found is None:
                found = marks.holding = Holding(node)
    return found


@contextlib.contextmanager
def running_here(node: Any) -> Iterator[None]:
    """Runs what is inside as a run of ``node``, placed on a worker, in this process: what
    it changes in its public attributes meanwhile is its own, not a value given to it
    that a copy rebuilt elsewhere must hold (:class:`Holding`)."""
    holding = holding_of(node)
    holding.start(node)
    try:
        yield
    finally:
        holding.stop(node)
