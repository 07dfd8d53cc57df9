"""Coordinates: strictly checked, and walked by spans() without asking for a length."""

from __future__ import annotations

from typing import Any

import pyarrow
import pytest

from somatize import Graph, Node, Store
from somatize.data import BadCoordinate, NotACoordinate, Table, span_of, spans
from tests.nodes import Rows


def test_a_coordinate_is_at_and_take() -> None:
    """A well-formed coordinate gives its position and length."""
    assert span_of({"at": 4096, "take": 64}) == (4096, 64)
    assert span_of({"take": 1, "at": 0}) == (0, 1)


@pytest.mark.parametrize(
    ("x", "error", "fragment"),
    [
        ({"at": -1, "take": 4}, BadCoordinate, "`at` is negative"),
        ({"at": 0, "take": 0}, BadCoordinate, "`take` is 0, and a span of no rows"),
        ({"at": 0, "take": -3}, BadCoordinate, "`take` is -3"),
        ({"at": True, "take": 4}, NotACoordinate, "`at` is a `bool`, not an int"),
        ({"at": 0, "take": 4.0}, NotACoordinate, "`take` is a `float`, not an int"),
        ({"at": "0", "take": 4}, NotACoordinate, "`at` is a `str`"),
        ({"at": 0}, BadCoordinate, "missing 'take'"),
        ({"at": 0, "take": 4, "columns": ["sms"]}, BadCoordinate, "unknown 'columns'"),
        ({}, BadCoordinate, "missing 'at', 'take'"),
        ([0, 64], NotACoordinate, "is handed a `list`"),
        (None, NotACoordinate, "is handed a `NoneType`"),
    ],
)
def test_bad_coordinates_are_refused(x: Any, error: type[Exception], fragment: str) -> None:
    """Each malformed coordinate is refused with the reason, never read as some other span."""
    with pytest.raises(error, match=fragment):
        span_of(x)


def test_type_errors_are_type_errors_and_value_errors_are_value_errors() -> None:
    """A wrongly typed coordinate is a TypeError; a wrong value a ValueError; both BadCoordinate."""
    with pytest.raises(TypeError):
        span_of({"at": 0.5, "take": 1})
    with pytest.raises(ValueError):
        span_of({"at": -5, "take": 1})


def test_a_source_in_a_graph_refuses_a_bad_coordinate(store: Store) -> None:
    """The refusal reaches the caller of forward as itself, naming the source."""
    g = Graph.somatize(Table(pyarrow.table({"n": [1, 2, 3]})).named("numbers"))
    with pytest.raises(BadCoordinate, match=r"`numbers` \(Table\) is handed"):
        g.forward({"at": 0, "take": 0})


def test_spans_of_a_counted_source_reads_nothing() -> None:
    """A source that knows its length is walked from its count: the last span is short."""
    source = Table(pyarrow.table({"n": list(range(10))}))
    assert list(spans(source, take=4)) == [
        {"at": 0, "take": 4},
        {"at": 4, "take": 4},
        {"at": 8, "take": 4},
    ]
    assert list(spans(source, take=4, at=9)) == [{"at": 9, "take": 4}]
    assert list(spans(source, take=4, at=10)) == []


def test_spans_of_a_source_that_cannot_count_stop_at_a_short_answer() -> None:
    """A source with no count is asked span by span until a short one."""
    rows = Rows(size=10)
    assert list(spans(rows, take=4)) == [
        {"at": 0, "take": 4},
        {"at": 4, "take": 4},
        {"at": 8, "take": 4},
    ]
    assert rows.calls == 3


def test_spans_stop_at_an_empty_answer() -> None:
    """When the length is a multiple of take, the empty span after it ends the walk unyielded."""
    rows = Rows(size=8)
    assert list(spans(rows, take=4)) == [{"at": 0, "take": 4}, {"at": 4, "take": 4}]


class NoLength(Node):
    def forward(self, span: Any, ctx: Any) -> float:
        return 1.0


def test_spans_refuses_what_it_cannot_walk() -> None:
    """A bad take, a non-node, or a source whose answer has no length is refused."""
    with pytest.raises(BadCoordinate, match="`take` is 0"):
        list(spans(Rows(), take=0))
    with pytest.raises(NotACoordinate, match="spans\\(\\) walks a source node"):
        list(spans(42))
    with pytest.raises(NotACoordinate, match="which has no length"):
        list(spans(NoLength()))


def test_spans_refuses_a_graph_and_says_to_pass_its_source() -> None:
    """A graph is handed coordinates but is not the source: spans() says to pass the node."""
    g = Graph.somatize(Table(pyarrow.table({"n": list(range(10))})).named("t"))
    with pytest.raises(NotACoordinate, match=r"got a Graph.*Pass the source node"):
        list(spans(g, take=4))
