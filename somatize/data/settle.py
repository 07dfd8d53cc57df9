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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from somatize.graph import Graph

__all__ = ["Settles", "settle"]


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
    done: dict[str, str] = {}
    memory = g.memory
    for name, node in g.items():
        if memory.is_frozen(name) and isinstance(node, Settles):
            state = node.settled_state()
            memory.freeze(name, state)
            done[name] = state
    return done
