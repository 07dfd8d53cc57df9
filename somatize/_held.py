"""What a node holds: its attributes, in its ``__dict__`` and in slots, and which of them
tell two nodes apart.

What built a node is its declaration; what it holds afterwards can say more. The graph
watches the constructor arguments a node keeps as attributes
(:meth:`~somatize.node.Node.kept_arguments`), and tells apart two nodes built alike by
what they hold (:func:`held_by`): one given another value after it was made
(``plus.offset = 100``) computes other answers, and a copy a worker rebuilds from the
constructor call must hold what the original held. Each reads a node through
:func:`attributes_of`, which sees a class with ``__slots__`` as it sees one without: a
slot holds no less than the ``__dict__`` does. These are re-exported by
:mod:`somatize.node`, their public home.
"""

from __future__ import annotations

from typing import Any

from somatize import canonical

__all__ = ["UNSET", "attributes_of", "held_by", "in_slot", "slots_of"]


_SLOTS: dict[type, tuple[tuple[str, Any], ...]] = {}


def slots_of(kind: type) -> tuple[tuple[str, Any], ...]:
    """The attributes instances of ``kind`` hold in slots rather than in their ``__dict__``:
    each name a class along its MRO declares in ``__slots__`` (but ``__dict__`` and
    ``__weakref__``), nearest first, with the descriptor that reads it. Worked out once per
    class; empty for most."""
    found = _SLOTS.get(kind)
    if found is None:
        seen: dict[str, Any] = {}
        for owner in kind.__mro__:
            declared = vars(owner).get("__slots__", ())
            for name in (declared,) if isinstance(declared, str) else declared:
                if name in ("__dict__", "__weakref__"):
                    continue
                if name.startswith("__") and not name.endswith("__"):  # mangled, as Python does
                    name = f"_{owner.__name__.lstrip('_')}{name}"
                slot = vars(owner).get(name)
                if name not in seen and hasattr(slot, "__get__"):
                    seen[name] = slot
        found = _SLOTS[kind] = tuple(seen.items())
    return found


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
        try:
            held.append((name, canonical.hex_of(value)))
        except canonical.NotCanonical:
            continue
    return tuple(sorted(held))
