"""Coordinates: what a source is handed instead of a batch.

A coordinate is a tiny canonical value, ``{"at": i, "take": n}``: the rows from
position ``i``, ``n`` of them. It names a span of a dataset the way an ISBN names
a book, so keying it costs a microsecond and reads nothing, while the rows it
stands for are named by the span *and* the dataset's version (the source's
settled state) — both known before anything is read.

A span is a position, and a position can be asked for twice: rows 400..500 of a
settled dataset are the same rows tomorrow. A frame shorter than ``take`` means
the dataset ended; a coordinate past the end gives zero rows. That is how
whoever walks a dataset finds out they have arrived without being told how long
it was — :func:`spans` does the walking.

A coordinate is checked strictly — exactly the two keys, non-negative ints,
``take`` at least one — since a malformed one would be keyed as a question of
its own and answered with rows nobody asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from somatize.data.errors import DataError
from somatize.node import Context

__all__ = ["BadCoordinate", "Counted", "NotACoordinate", "span_of", "spans"]

_KEYS = frozenset(("at", "take"))


class BadCoordinate(DataError, ValueError):
    """A coordinate that does not name a span: a missing or extra key, a negative
    position, or ``take`` below one."""


class NotACoordinate(BadCoordinate, TypeError):
    """Something that is not a coordinate at all, or one whose values are not ints."""


_SHAPE = 'a coordinate is `{"at": i, "take": n}` with ints `i >= 0` and `n >= 1`'


def span_of(x: Any, where: str = "the source") -> tuple[int, int]:
    """``(at, take)`` of coordinate ``x``; :class:`BadCoordinate` (or its TypeError
    kind, :class:`NotACoordinate`) saying what is wrong otherwise."""
    if not isinstance(x, dict):
        raise NotACoordinate(
            f"{where} is handed a `{type(x).__name__}` ({_clip(x)}) where it reads a span: "
            f"{_SHAPE}. Hand the graph a coordinate, e.g. `g.forward({{'at': 0, 'take': 64}})`"
        )
    keys = set(x)
    if keys != _KEYS:
        missing = sorted(_KEYS - keys)
        extra = sorted(str(k) for k in keys - _KEYS)
        said = "; ".join(
            part
            for part in (
                f"missing {', '.join(repr(k) for k in missing)}" if missing else "",
                f"unknown {', '.join(repr(k) for k in extra)}" if extra else "",
            )
            if part
        )
        raise BadCoordinate(
            f"{where} is handed {_clip(x)}: {said}. {_SHAPE}, and nothing else — another key "
            "would be keyed as a different question while reading the same rows"
        )
    at, take = x["at"], x["take"]
    for name, value in (("at", at), ("take", take)):
        if type(value) is not int:  # bool is an int to Python, and not a position
            raise NotACoordinate(
                f"{where} is handed {_clip(x)}: `{name}` is a `{type(value).__name__}`, not an "
                f"int. {_SHAPE}"
            )
    if at < 0:
        raise BadCoordinate(
            f"{where} is handed {_clip(x)}: `at` is negative. Positions count from the start "
            f"of the dataset at 0; {_SHAPE}"
        )
    if take < 1:
        raise BadCoordinate(
            f"{where} is handed {_clip(x)}: `take` is {take}, and a span of no rows could not "
            f"tell the end of the dataset from a request for nothing. {_SHAPE}"
        )
    return at, take


def _clip(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


@runtime_checkable
class Counted(Protocol):
    """A source that knows how many rows it has without reading them (a Parquet
    footer, an in-memory table)."""

    def count_rows(self) -> int: ...


def spans(source: Any, take: int = 64, at: int = 0) -> Iterator[dict[str, int]]:
    """The coordinates that walk ``source`` from ``at`` to its end, ``take`` rows each.

    A source that can count its rows cheaply (:class:`Counted`: Parquet,
    ParquetDir, Table) is walked without being read; the last span may be
    short. Any other source is asked for each span in turn, and the walk stops
    after the first frame shorter than ``take`` — so no length is needed, at the
    price of reading each span once here.
    """
    span_of({"at": at, "take": take}, "spans()")
    from somatize.graph import Graph

    if isinstance(source, Graph):
        raise NotACoordinate(
            "spans() walks a source node, and got a Graph: a graph is handed coordinates but "
            "does not say where its dataset ends. Pass the source node the graph reads from "
            "(`spans(source, take)`, the Parquet, ParquetDir or Table you built it with), "
            "and hand each coordinate to the graph (`g.forward(span)`)"
        )
    if isinstance(source, Counted):
        rows = source.count_rows()
        for start in range(at, rows, take):
            yield {"at": start, "take": take}
        return
    forward = getattr(source, "forward", None)
    if forward is None:
        raise NotACoordinate(
            f"spans() walks a source node, and got a `{type(source).__name__}`: pass the node "
            "that is handed coordinates (a Parquet, ParquetDir or Table, or a node of your own)"
        )
    name = getattr(getattr(source, "_smz", None), "name", None) or type(source).__name__
    start = at
    while True:
        coordinate = {"at": start, "take": take}
        got = forward(coordinate, Context(name=name))
        try:
            count = len(got)
        except TypeError:
            raise NotACoordinate(
                f"spans() asked `{name}` for {coordinate} and got a `{type(got).__name__}`, "
                "which has no length: a source handed a span answers with its rows (a Frame, "
                "a table, a list), so that a short answer can say the dataset ended"
            ) from None
        if count == 0:
            return
        yield coordinate
        if count < take:
            return
        start += take
