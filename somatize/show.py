"""Showing a graph: a text listing for ``print(g)`` and a figure for ``g.figure()``.

Both are drawn from the same facts the engine knows — memory (frozen with its
state, cached with its salt, mapped), placement, and, after a run, the record —
so what is shown is what will happen, not a separate description of it.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from somatize.engine import Record
    from somatize.figure import Figure
    from somatize.graph import Graph

__all__ = ["figure_of", "listing", "marks_of"]


def _short(digest: str | None) -> str | None:
    if digest is None:
        return None
    return digest.split(":", 1)[-1][:8]


def marks_of(graph: Graph, node: str) -> list[str]:
    """What memory and placement say about ``node``, as short words."""
    memory = graph.memory
    marks = []
    if memory.is_frozen(node):
        state = _short(memory.state_of(node))
        marks.append(f"frozen@{state}" if state else "frozen")
    if memory.is_cached(node):
        salt = memory.salt_of(node)
        marks.append(f"cached(salt={salt!r})" if salt else "cached")
    if memory.is_mapped(node):
        marks.append("mapped")
    worker = graph.placement.worker_of(node)
    if worker is not None:
        marks.append(f"at {worker}")
    return marks


def listing(graph: Graph) -> str:
    """A compact listing: one line per node with what it reads and what is declared."""
    lines = [f"Graph of {len(graph)} node{'s' if len(graph) != 1 else ''}"]
    width = max((len(name) for name in graph.nodes()), default=0)
    for name in graph.nodes():
        preds = graph.predecessors(name)
        source = ", ".join(preds) if preds else "input"
        marks = marks_of(graph, name)
        output = "  → output" if name in graph.outputs else ""
        lines.append(
            f"  {name:<{width}}  {graph.kind_of(name)} ← {source}"
            + (f"  [{', '.join(marks)}]" if marks else "")
            + output
        )
    return "\n".join(lines)


def _check_record(graph: Graph, record: object) -> None:
    """Refuse what is no record of ``graph``: another object, or the record of a graph
    with nodes this one does not have (its colours would be another run's)."""
    from somatize._record import Record

    if not isinstance(record, Record):
        raise TypeError(
            f"g.figure(record) takes a Record (g.record, after a forward) or None, "
            f"not {type(record).__name__} {record!r}"
        )
    named = {fact[key] for fact in record.facts for key in ("node", "from") if key in fact}
    strangers = sorted(name for name in named if name not in graph)
    if strangers:
        raise ValueError(
            f"this record speaks of node(s) {strangers} that this graph does not have: "
            "it is the record of another graph; draw that graph with it, or this one with "
            "its own record (g.record)"
        )


def figure_of(graph: Graph, record: Record | None = None) -> Figure:
    """The figure of ``graph``, coloured by ``record`` when one is given.

    ``record`` must be a record of this graph (from any of its forwards): anything else
    is a ``TypeError``, and a record naming nodes the graph does not have a
    ``ValueError``. A node the record says nothing of is drawn not reached where the run
    stopped short, and without an outcome where it finished (a wrapped model's record).
    """
    from somatize.figure import Arrow, Box, Figure

    if record is not None:
        _check_record(graph, record)
    # read from the facts each time they are asked for: asked once, not once per node
    outcome = record.outcome if record is not None else None
    # A node the record says nothing of was never reached where the run stopped short (a
    # node failed, or it was interrupted). In a forward that finished every node has its
    # outcome; a record that finished and says nothing of a node is one of calls of some
    # nodes only (a wrapped model's, which runs the rest itself), and the node is drawn
    # without one.
    unsaid = "unreached" if record is not None and not record.count("finished") else None
    took_us = record.took_us if record is not None else {}
    crossed = record.crossed if record is not None else {}
    memory = graph.memory
    boxes = []
    for name in graph.nodes():
        marks: list[str] = []
        if memory.is_frozen(name):
            marks.append("frozen")
        if memory.is_cached(name):
            marks.append("cached")
        if memory.is_mapped(name):
            marks.append("mapped")
        worker = graph.placement.worker_of(name)
        if worker is not None:
            marks.append("at")
        node = graph.node(name)
        boxes.append(
            Box(
                name=name,
                kind=graph.kind_of(name),
                marks=tuple(marks),
                state=_short(memory.state_of(name)),
                salt=memory.salt_of(name),
                worker=worker,
                outcome=outcome.get(name, unsaid) if outcome is not None else None,
                took_us=took_us.get(name),
                group=_group_of(node),
            )
        )
    arrows = [
        # one arrow per edge, however many times its reader reads it: the record's bytes
        # for the edge are already those of every read
        Arrow(source=pred, target=name, crossed_bytes=crossed.get((pred, name)), reads=reads)
        for name in graph.nodes()
        for pred, reads in Counter(graph.predecessors(name)).items()
    ]
    return Figure(boxes, arrows)


def _group_of(node: object) -> str | None:
    """The group a node's box is drawn in: its ``figure_group``, when that is a str. The
    attribute is the figure's own, not a declaration; anything else a node holds under that
    name (a list of its own) is its business, and draws no group."""
    group = getattr(node, "figure_group", None)
    return group if isinstance(group, str) else None
