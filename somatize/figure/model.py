"""What a figure is made of: one :class:`Box` per node and one :class:`Arrow` per edge.

The description is neutral on purpose: it names nodes, their memory marks and what
happened to them in a run, and nothing about pixels, so that a graph can be described
without knowing how it will be laid out or drawn. The layout and both renderers read it;
it depends on nothing else in the figure package.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The memory marks a box may carry.
MARKS: tuple[str, ...] = ("frozen", "cached", "mapped", "at")
#: What can have happened to a node in a run; ``unreached``: nothing, as the run ended (a
#: node failed) before it came to this one.
OUTCOMES: tuple[str, ...] = ("ran", "recalled", "spared", "drifted", "failed", "unreached")

Point = tuple[float, float]


@dataclass(frozen=True)
class Box:
    """One node of the graph, as it is drawn."""

    name: str
    kind: str
    marks: tuple[str, ...] = ()
    state: str | None = None
    salt: str | None = None
    worker: str | None = None
    outcome: str | None = None
    took_us: int | None = None
    group: str | None = None


@dataclass(frozen=True)
class Arrow:
    """One edge of the graph: the value of ``source`` flows into ``target``.

    ``crossed_bytes`` is what that value crossed to or from a worker, if anything did;
    ``reads`` how many times ``target`` reads it (``(r, r) >> pair`` reads ``r`` twice).
    Arrows with the same ends are drawn as one, their reads and bytes added up.
    """

    source: str
    target: str
    crossed_bytes: int | None = None
    reads: int = 1
