"""Settling: putting the state a frozen node is frozen at into its key.

A graph *declares* that a node's state does not change (``.frozen()``); whoever
knows what is inside the node makes that true and says which state it is. For
weights that means hashing them (``somatize.torch.freeze(g)``); for a dataset it
means repeating what the store already knew — the version, which is the digest
the name resolved to.

The shape is one method. A node that can say the digest of its state has
``settled_state()``; :func:`settle` asks every frozen node of a graph that has
one and writes the answer into the graph's memory. A frozen node that holds
state and was never settled is refused before anything runs (``NotSettled``),
because without the digest two states would be kept under one key and one of
them handed back for the other.

``settled_state()`` is heard only here, and what a node holds may change after (a torch
module it keeps, stepped by an optimizer). A library that can watch such state cheaply
(:func:`~somatize.node.watches_settled`: ``somatize.torch`` watches the modules a node
keeps) has it watched from here on. A forward that finds it touched asks the node's
``settled_state()`` once: the same digest, and it is watched afresh and goes on; another (or
an error), and the digest is taken back and the node is refused where its key is needed
(``NotSettled``, saying what changed) until it is settled again. Its key never names a state
it no longer holds, and settling stays the user's act.
"""

from __future__ import annotations

import re
from typing import Any, Protocol, runtime_checkable

from somatize.data.errors import DataError
from somatize.graph import Graph
from somatize.node import settled_watch

__all__ = ["NotADigest", "SameDigestOtherValues", "Settles", "settle"]

_DIGEST = re.compile(r"blake3:[0-9a-f]{64}")


class NotADigest(DataError, TypeError):
    """A ``settled_state()`` that answered something other than a ``blake3:<64 hex>``
    digest."""


class SameDigestOtherValues(DataError, ValueError):
    """A ``settled_state()`` that says the digest it was settled at before while the weights
    the node keeps hold other values: settled so, the answers of the old values would be
    recalled for the new ones."""


@runtime_checkable
class Settles(Protocol):
    """A node that can say the digest of the state it is frozen at."""

    def settled_state(self) -> str:
        """``blake3:<hex>`` of its state: a dataset version, the digest of its weights.
        Raises when the node cannot be settled at all (a stream)."""
        ...


def settle(g: Graph) -> dict[str, str]:
    """Settles every frozen node of ``g`` that can say its state (each source's version);
    returns ``{node name: state digest}`` for the ones it settled.

    Nodes that are not frozen are left alone: their state is in no key, and
    declaring them frozen is the graph's half. Settling changes the graph's
    memory, so the keys of its next forward are worked out again.
    """
    if not isinstance(g, Graph):
        raise TypeError(
            f"settle takes a somatize Graph, got a `{type(g).__name__}`. Build the graph "
            "first: `g = Graph.somatize(source.named(...).frozen() >> ...)`, then "
            "`settle(g)`"
        )
    done: dict[str, str] = {}
    watches = {}
    memory = g.memory
    for name, node in g.items():
        if memory.is_frozen(name) and isinstance(node, Settles):
            # Taken first: a change made while its state is worked out is seen next.
            watches[name] = settled_watch(node)
            done[name] = _checked(name, node, node.settled_state())
            _refuse_unheard(g, name, done[name], watches[name])
    for name, state in done.items():  # all or nothing: none is settled if one answers wrong
        memory.freeze(name, state)
        g.watch_settled(name, watches[name])
    return done


def _refuse_unheard(g: Graph, name: str, state: str, watch: Any) -> None:
    """Raises SameDigestOtherValues where ``name``'s ``settled_state()`` says the digest it was
    settled at before while what it keeps, as ``watch`` finds it, holds other values than
    then: a buffer left out of ``state_dict()`` (``persistent=False``), or a digest worked
    out once, does not hear the change, and its old answers would be recalled."""
    before, watched = g.settled_with(name)
    holds_as = getattr(watched, "holds_as", None)
    if before != state or holds_as is None or holds_as(watch):
        return
    differs = getattr(watched, "differs_from", None)
    what = differs(watch) if differs is not None else "Its weights or buffers hold other values."
    raise SameDigestOtherValues(
        f"`{name}`.settled_state() says {state}, the digest it was settled at before, yet "
        "what it keeps differs from then: settled so, the answers kept for what it held "
        f"would be recalled for what it holds now. {what} Make `settled_state()` say another "
        "digest where the forward reads another value (as "
        '`"blake3:" + blake3.blake3(data).hexdigest()` of all it names).'
    )


def _checked(name: str, node: Any, state: Any) -> str:
    """``state``, when it is a digest as keys write them; NotADigest naming ``name``
    otherwise."""
    if isinstance(state, str) and _DIGEST.fullmatch(state):
        return state
    raise NotADigest(
        f"`{name}`.settled_state() (a `{type(node).__qualname__}`) answered {state!r}, a "
        f"`{type(state).__name__}`, where the digest of its state is expected: a str "
        "`blake3:` and 64 lowercase hex digits. The digest goes into the key of everything "
        "below the node, so anything else would key two states alike. Make "
        "`settled_state()` return the blake3 digest of the state, e.g. "
        '`"blake3:" + blake3.blake3(data).hexdigest()`'
    )
