"""Placement: where each node runs.

``node.at("w1")`` places a node on the worker a broker knows as ``w1``; a node
placed nowhere runs where the graph is called. Placement is a fact of its own —
the same graph runs on a laptop with no broker and on a cluster with one, and
neither its keys nor its answers change.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["Placement"]


class Placement:
    """Node → worker name. Nodes not listed run where the graph is called."""

    __slots__ = ("_at",)

    def __init__(self) -> None:
        self._at: dict[str, str] = {}

    def place(self, node: str, worker: str) -> None:
        """Says ``node`` runs on ``worker``."""
        self._at[node] = worker

    def worker_of(self, node: str) -> str | None:
        """Where ``node`` runs, or None for where the graph is called."""
        return self._at.get(node)

    def workers(self) -> set[str]:
        """Every worker something is placed on."""
        return set(self._at.values())

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._at.items())

    def __len__(self) -> int:
        return len(self._at)
