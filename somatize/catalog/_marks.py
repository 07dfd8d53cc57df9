"""Marks: an object named by which object it is, the same for no other in any process.

An object whose state no name says (:mod:`~somatize.catalog._held`) is marked
(:func:`_token_of`), and given a new mark once it changed in place (:func:`_moved_on`), so
that what was computed with it before is never recalled for it. The tables here hold the
marks and what each object was named, by address, weakly where the object can be
referenced weakly; :func:`_let_go` frees those kept alive for it once nothing else holds
them.
"""

from __future__ import annotations

import itertools
import os
import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from somatize.catalog._marked import _Marked


_NONCE = os.urandom(16)


_TOKENS: dict[int, tuple[Callable[[], Any], bytes]] = {}
"""An object, by its address (not by ``==``, which may call two objects equal), → a weak
reference to it, which tells it from another at the same address later (a :class:`_Kept`
where it cannot be referenced weakly), and its mark."""


_COUNT = itertools.count()


def _token_of(held: Any) -> bytes:
    """A mark of the object ``held`` that no other object is given, in this process or any
    other: the same for it while it lives. One that cannot be referenced weakly (a class
    with ``__slots__`` and no ``__weakref__``, a bare list or dict) is kept alive for it
    (:class:`_Kept`), so that it keeps its mark and can be watched."""
    found = _TOKENS.get(id(held))
    if found is not None and found[0]() is held:
        return found[1]
    token = b"object " + _NONCE + next(_COUNT).to_bytes(8, "little")
    _TOKENS[id(held)] = (_reference(held), token)
    return token


class _Kept:
    """A reference to an object that cannot be referenced weakly, called as a weak one is:
    it answers the object, which it keeps alive, so that its address is never another's."""

    __slots__ = ("held",)

    def __init__(self, held: Any) -> None:
        self.held = held

    def __call__(self) -> Any:
        return self.held


def _reference(held: Any, forget: Any = None) -> Any:
    """A weak reference to ``held`` (calling ``forget`` once it is gone), or a
    :class:`_Kept` where it cannot be referenced weakly."""
    try:
        return weakref.ref(held, forget)
    except TypeError:
        pass
    _KEPT[0] += 1
    if _KEPT[0] > _KEPT[1]:
        _let_go()
    return _Kept(held)


_KEPT = [0, 64]
"""How many :class:`_Kept` were made since the last :func:`_let_go`, and how many more
call for the next (twice as many as it left, at least 64: a sweep now and then, never
one for each)."""


def _let_go() -> None:
    """Forgets each object kept alive by a :class:`_Kept` that nothing else holds any more
    (a table a class held, replaced since, no graph watching it): it is freed, and nothing
    can ask for its mark again — so that graphs built in a loop, each of a class given a
    new one, do not keep every one for the whole process."""
    places: dict[int, list[tuple[dict[int, Any], int]]] = {}
    wrappers: dict[int, set[int]] = {}
    tables: tuple[dict[int, Any], ...] = (_TOKENS, _HELD, _MARKED)
    for table in tables:
        for at, entry in list(table.items()):
            kept = entry[0]
            if type(kept) is _Kept:
                places.setdefault(id(kept.held), []).append((table, at))
                wrappers.setdefault(id(kept.held), set()).add(id(kept))
    left = 0
    for key, found in places.items():
        first: Any = found[0][0].get(found[0][1])
        if first is None or type(first[0]) is not _Kept:
            continue
        held = first[0].held
        del first
        # held by its wrappers, `held` here and getrefcount's argument, and nothing else
        if sys.getrefcount(held) - 2 <= len(wrappers[key]):
            for table, at in found:
                there = table.get(at)
                if there is not None and type(there[0]) is _Kept and there[0].held is held:
                    table.pop(at, None)  # another thread may have let it go
        else:
            left += 1
        del held
    _KEPT[:] = [0, max(64, 2 * left)]


def _version_of(held: Any) -> bytes | None:
    """The mark ``held`` is given now (:func:`_token_of`), or None where it has none kept."""
    found = _TOKENS.get(id(held))
    return found[1] if found is not None and found[0]() is held else None


def _moved_on(held: Any) -> None:
    """Gives ``held``, marked by which object it is, a new mark: it was changed in place
    since, and what it computes now is never taken for what it computed before."""
    found = _TOKENS.get(id(held))
    if found is not None and found[0]() is held:
        _TOKENS[id(held)] = (found[0], b"object " + _NONCE + next(_COUNT).to_bytes(8, "little"))


_HELD: dict[int, tuple[weakref.ref[Any], bytes | None]] = {}
"""An object named by what it holds, by its address → a weak reference to it and the name
it was first given (None: it is marked by which object it is, :func:`_token_of`); nothing
it holds, so that an object is never kept alive by having been named (:func:`_held_bytes`)."""


def _forget_held(at: int, reference: weakref.ref[Any], held: dict[int, Any] = _HELD) -> None:
    """Forgets what :data:`_HELD` says of an object gone (not of another made since at its
    address). Reads no global: it may be called as the process ends."""
    found = held.get(at)
    if found is not None and found[0] is reference:
        del held[at]


_MARKED: dict[int, tuple[Callable[[], Any], weakref.ref[_Marked], list[Any] | None]] = {}
"""An object marked by which object it is and watched, by its address → a weak reference to
it (a :class:`_Kept` where it cannot be referenced weakly, which its mark keeps alive
anyway) and to what is noted of it (:class:`_Marked`), which the graphs' watches hold: what
is read of an object (its ``__dict__``, which may hold a method bound to it) never keeps it
alive once no graph watches it. For a table first seen as its text writes it
(:func:`_sighted`), also the copies of what was read of it, kept as no graph watches it, to
tell whether it changed meanwhile."""
