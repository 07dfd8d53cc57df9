"""The notebook "Where the data comes from", cell by cell, with a Parquet dataset in a store."""

from __future__ import annotations

import random
from typing import Any

import pyarrow
import pyarrow.parquet
import pytest

from somatize import Graph, Node, NotSettled, Store
from somatize.data import Frame, Parquet, settle, to_arrow
from tests.test_data_parquet import CountingStore, parquet_bytes

SPAM = ["win", "free", "cash", "prize", "claim", "urgent", "winner", "txt"]
HAM = ["dinner", "tomorrow", "bus", "sorry", "meeting", "later", "mum", "ok"]


def messages(rows: int = 2000) -> pyarrow.Table:
    """The notebook's table: an `sms` column of made-up messages and a `label` column."""
    rng = random.Random(0)
    labels = [1 if rng.random() < 0.13 else 0 for _ in range(rows)]
    sms = [
        " ".join(rng.choice(SPAM if one else HAM) for _ in range(rng.randint(4, 12)))
        for one in labels
    ]
    return pyarrow.table({"sms": sms, "label": labels})


class Clean(Node):
    """Rows in, one list of word lengths per message out."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, frame: Frame, ctx: Any) -> list[list[float]]:
        self.calls += 1
        return [[float(len(word)) for word in one.split()] for one in frame.column("sms")]


class Widest(Node):
    """How long the longest message in the batch was."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, counts: list[list[float]], ctx: Any) -> float:
        self.calls += 1
        return float(max(len(one) for one in counts))


def widest_of(table: pyarrow.Table, at: int, take: int) -> float:
    """What the graph should answer for a span, worked out straight from the table."""
    return float(max(len(one.split()) for one in table.column("sms")[at : at + take].to_pylist()))


@pytest.fixture
def table() -> pyarrow.Table:
    return messages()


@pytest.fixture
def counting(store: Store, table: pyarrow.Table) -> CountingStore:
    """The store, with the table bound as `sms/train`, seen through a byte counter."""
    store.bind("sms/train", store.put(parquet_bytes(table)))
    return CountingStore(store)


def graph(store: Store) -> tuple[Graph, Clean, Widest]:
    clean, widest = Clean(), Widest()
    g = Graph.somatize(
        Parquet(store, "sms/train").named("sms").frozen()
        >> clean.named("clean").frozen()
        >> widest.named("widest").frozen().cached()
    )
    return g, clean, widest


def test_a_graph_that_names_a_dataset_has_not_opened_it(counting: CountingStore) -> None:
    """Building, settling and listing the graph reads not one byte of the dataset."""
    g, _, _ = graph(counting)
    settle(g)
    assert "sms     Parquet ← input  [frozen@" in str(g)
    assert (counting.opened, counting.gets, counting.bytes_read) == (0, 0, 0)


def test_it_is_handed_a_coordinate_and_the_last_span_is_short(
    counting: CountingStore, table: pyarrow.Table
) -> None:
    """A coordinate answers for exactly its rows; the last span is short; the source's frame is
    Arrow underneath."""
    g, clean, _ = graph(counting)
    settle(g)
    assert g.forward({"at": 0, "take": 64}) == widest_of(table, 0, 64)
    assert g.forward({"at": 1980, "take": 64}) == widest_of(table, 1980, 64)
    frame = g.forward({"at": 1980, "take": 64}, outputs="sms")
    assert len(frame) == 20
    assert to_arrow(frame).equals(table.slice(1980, 20))
    assert clean.calls == 2  # asking for the source's frame alone runs nothing below it


def test_the_second_forward_spares_the_source_and_recalls(counting: CountingStore) -> None:
    """On the same span again, the dataset and the cleaning node are not touched and the facts
    say so."""
    g, clean, widest = graph(counting)
    settle(g)
    first = g.forward({"at": 0, "take": 64}, store=counting.inner)
    read = counting.bytes_read
    seen: list[dict[str, Any]] = []
    again = g.forward({"at": 0, "take": 64}, store=counting.inner, watching=seen.append)
    assert again == first
    assert [(f["fact"], f.get("node")) for f in seen] == [
        ("spared", "sms"),
        ("spared", "clean"),
        ("recalled", "widest"),
        ("finished", None),
    ]
    assert seen[2]["key"].startswith("blake3:")
    assert (clean.calls, widest.calls) == (1, 1)
    assert counting.bytes_read == read


def test_another_dataset_under_the_name_is_another_version_and_key(
    counting: CountingStore, table: pyarrow.Table
) -> None:
    """Rebinding the name gives a new source another version, so its answers another key."""
    g, _, _ = graph(counting)
    settle(g)
    kept: list[dict[str, Any]] = []
    g.forward({"at": 0, "take": 64}, store=counting.inner, watching=kept.append)
    before = Parquet(counting, "sms/train").version

    counting.bind("sms/train", counting.put(parquet_bytes(table.slice(0, 500))))
    assert Parquet(counting, "sms/train").version != before

    h, _, other = graph(counting)
    settle(h)
    kept_again: list[dict[str, Any]] = []
    h.forward({"at": 0, "take": 64}, store=counting.inner, watching=kept_again.append)
    assert other.calls == 1  # not read back from the first dataset's answer
    keys = [f["key"] for f in kept + kept_again if f["fact"] == "kept"]
    assert len(keys) == 2 and keys[0] != keys[1]


def test_declaring_frozen_without_settling_is_refused_before_anything_runs(
    counting: CountingStore,
) -> None:
    """An unsettled frozen source is refused with the message that says to settle it."""
    widest = Widest()
    g = Graph.somatize(
        Parquet(counting, "sms/train").named("sms").frozen()
        >> widest.named("widest").frozen().cached()
    )
    said = (
        r"`sms` is declared frozen and has state, and nobody has settled it: .* two different "
        r"datasets read by `Parquet` would be kept under one name .* Call "
        r"`somatize\.data\.settle\(g\)` before running"
    )
    with pytest.raises(NotSettled, match=said) as refused:
        g.forward({"at": 0, "take": 8}, store=counting.inner)
    assert isinstance(refused.value, ValueError)
    assert widest.calls == 0
    assert counting.bytes_read == 0


def test_the_figure_is_drawn_from_a_graph_that_has_never_run(counting: CountingStore) -> None:
    """The dataset is a box like any other in the figure of a settled graph, and drawing it
    reads nothing."""
    g, _, _ = graph(counting)
    settle(g)
    figure = g.figure()
    assert [box.name for box in figure.boxes] == ["sms", "clean", "widest"]
    assert len(figure.arrows) == 2
    assert "sms" in figure._repr_svg_()
    assert (counting.opened, counting.gets, counting.bytes_read) == (0, 0, 0)


def test_the_rows_are_read_here_and_the_work_happens_over_there(
    counting: CountingStore, table: pyarrow.Table
) -> None:
    """The notebook's last cell: the source runs where the graph is called, `clean` on a
    network worker that is handed the frame as Arrow bytes, `widest` here again; the answer
    is the one worked out from the table."""
    from somatize import Broker, Worker

    counts = Widest()
    crossing = Graph.somatize(
        Parquet(counting, "sms/train").named("sms")
        >> Clean().named("clean").at("w1")
        >> counts.named("widest")
    )
    worker = Broker.embedded({"w1": Worker.generic(mode="network")})
    seen: list[dict[str, Any]] = []
    assert crossing.forward({"at": 0, "take": 32}, broker=worker, watching=seen.append) == (
        widest_of(table, 0, 32)
    )
    crossed = [(f["from"], f["node"], f["way"]) for f in seen if f["fact"] == "crossed"]
    assert crossed == [("sms", "clean", "out"), ("clean", "widest", "back")]
    assert all(f["bytes"] > 0 and f["worker"] == "w1" for f in seen if f["fact"] == "crossed")
    assert counts.calls == 1
    assert crossing.record is not None and crossing.record.outcome == {
        "sms": "ran",
        "clean": "ran",
        "widest": "ran",
    }
