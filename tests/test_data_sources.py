"""Tables in memory, streams, and settling: which sources can be frozen, and how."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import blake3
import pyarrow
import pytest

from somatize import Graph, Node, NotSettled, Store, Unbuildable, Unsettled
from somatize.broker import Broker, StateMismatch, Worker
from somatize.data import (
    BadCoordinate,
    Frame,
    NotACoordinate,
    NotADigest,
    Stream,
    Table,
    TooManyRows,
    Unfreezable,
    settle,
)
from somatize.node import Context
from tests.nodes import Echo, Total, matmul_in_tf32


class Count(Node):
    """How many rows a frame brought."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, frame: Frame, ctx: Any) -> int:
        self.calls += 1
        return len(frame)


def _numbers(rows: int) -> pyarrow.Table:
    return pyarrow.table({"n": list(range(rows))})


# ---------------------------------------------------------------- Table


def test_a_table_is_read_by_span_without_copying() -> None:
    """A span of a Table is a slice of the table it holds: the same buffers, the right rows,
    short at the end."""
    source = Table(_numbers(100))
    frame = source.forward({"at": 90, "take": 64}, Context(name="t"))
    assert frame.column("n") == list(range(90, 100))
    head = frame.to_arrow().column("n").chunks[0].buffers()[1]
    assert head.address == source.table.column("n").chunks[0].buffers()[1].address
    assert len(source.forward({"at": 500, "take": 64}, Context(name="t"))) == 0
    assert source.count_rows() == 100


def test_a_table_over_memory_written_in_place_keeps_what_it_was_made_from(
    store: Store,
) -> None:
    """A table made over a numpy array shares its memory: the source holds the rows its
    version names, however the array is refilled afterwards, and a new source made then
    has the new rows under a new version."""
    numpy = pytest.importorskip("numpy")
    values = numpy.arange(8, dtype=numpy.int64)
    made = Table(pyarrow.table({"n": values}))
    values[:] = 100
    assert made.forward({"at": 0, "take": 8}, Context(name="t")).column("n") == list(range(8))
    assert made.version == Table(_numbers(8)).version
    again = Table(pyarrow.table({"n": values}))
    assert again.version != made.version

    answers = []
    for source in (made, again):
        g = Graph.somatize(source.named("t").frozen() >> Total().named("total").frozen().cached())
        settle(g)
        answers.append(g.forward({"at": 0, "take": 8}, store=store))
    assert answers == [28, 800]


def test_an_unsettled_source_is_told_to_settle_not_to_freeze(store: Store) -> None:
    """The refusal of a data source nobody settled leads with ``somatize.data.settle``, and
    says nothing of torch, which a pipeline of data alone may not have."""
    g = Graph.somatize(Table(_numbers(10)).named("t").frozen() >> Count().frozen().cached())
    with pytest.raises(NotSettled) as refused:
        g.forward({"at": 0, "take": 8}, store=store)
    said = str(refused.value)
    assert "Call `somatize.data.settle(g)` before running" in said
    assert "torch" not in said


class Words(Node):
    """A source of one's own: the words of a file, by span, with the digest of the file's
    bytes as its state — a `settled_state()`, and no `holds_state` said."""

    def __init__(self, path: str) -> None:
        self.path = path

    def settled_state(self) -> str:
        return "blake3:" + blake3.blake3(Path(self.path).read_bytes()).hexdigest()

    def forward(self, span: Any, ctx: Any) -> list[str]:
        return Path(self.path).read_text().split()[span["at"] : span["at"] + span["take"]]


class Many(Node):
    """How many items it is handed."""

    def forward(self, items: Any, ctx: Any) -> int:
        return len(items)


def test_a_source_saying_its_state_is_refused_until_settled(store: Store, tmp_path: Path) -> None:
    """A node of one's own with a `settled_state()`, frozen above a cached node, was run
    unsettled, its answers keyed without its state: the file written again, a graph on it
    recalled what the old file made. It is refused as a data source is until `settle(g)`,
    which puts its state in the key."""
    words = tmp_path / "words.txt"
    words.write_text("a b c")
    answers = []
    for text in ("a b c", "a b c d e"):
        words.write_text(text)
        g = Graph.somatize(
            Words(str(words)).named("words").frozen() >> Many().named("many").frozen().cached()
        )
        with pytest.raises(NotSettled, match=r"`words` is declared frozen.*settle\(g\)"):
            g.forward({"at": 0, "take": 8}, store=store)
        settle(g)
        answers.append(g.forward({"at": 0, "take": 8}, store=store))
    assert answers == [3, 5]


class Snapshot(Node):
    """A source of one's own holding the words of a file as they were when it was made,
    with their digest as its state: a `settled_state()`, and no `holds_state` said."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._words = Path(path).read_text().split()

    def settled_state(self) -> str:
        return "blake3:" + blake3.blake3(" ".join(self._words).encode()).hexdigest()

    def forward(self, span: Any, ctx: Any) -> list[str]:
        return self._words[span["at"] : span["at"] + span["take"]]


class Both(Node):
    """Its two inputs, as a list."""

    def forward(self, first: Any, second: Any, ctx: Any) -> list[Any]:
        return [first, second]


def test_sources_saying_other_states_are_not_interned(tmp_path: Path) -> None:
    """Two sources of one's own built alike over one file, written again between them,
    say other states: they were interned into one when the graph was built, before
    anybody settled them, and both answered what the first holds. They stay two nodes,
    each settled at its own state, as a source whose class says `holds_state` does."""
    words = tmp_path / "words.txt"
    words.write_text("a b c")
    old = Snapshot(str(words)).named("old").frozen()
    words.write_text("a b c d e")
    new = Snapshot(str(words)).named("new").frozen()
    g = Graph.somatize((old, new) >> Both().named("both").frozen())
    assert g.nodes() == ("old", "new", "both")
    assert settle(g).keys() == {"old", "new"}
    assert g.forward({"at": 0, "take": 8}) == [["a", "b", "c"], ["a", "b", "c", "d", "e"]]


def test_a_source_saying_its_state_is_checked_on_a_network_worker(
    store: Store, tmp_path: Path
) -> None:
    """A source of one's own that says its state, rebuilt on a network worker from its
    constructor, read the file as it is there: written again after `settle(g)`, it answered
    5 where the graph's own copy answers 3, and the 5 was kept under the old state's key.
    The copy is checked against the state the graph is settled at, and refused when it
    says another; unsettled, it is refused before anything runs."""
    words = tmp_path / "words.txt"
    words.write_text("a b c")
    g = Graph.somatize(
        Snapshot(str(words)).named("snap").frozen().at("w1")
        >> Many().named("many").frozen().cached()
    )
    with Broker.embedded({"w1": Worker.generic(mode="network")}) as network:
        with pytest.raises(Unbuildable, match=r"`snap` \(Snapshot\).*not settled.*settle\(g\)"):
            g.forward({"at": 0, "take": 8}, broker=network)
        settle(g)
        assert g.forward({"at": 0, "take": 8}, broker=network) == 3
    words.write_text("a b c d e")
    with (
        Broker.embedded({"w1": Worker.generic(mode="network")}) as network,
        pytest.raises(StateMismatch, match=r"`snap` on worker `w1`.*says its state is"),
    ):
        g.forward({"at": 0, "take": 8}, broker=network, store=store)
    with Broker.embedded({"w1": Worker.generic(mode="local")}) as local:
        assert g.forward({"at": 0, "take": 8}, broker=local, store=store) == 3


def test_a_tables_version_is_its_content() -> None:
    """Equal tables have one version however they are chunked; other rows, another."""
    table = _numbers(100)
    chunked = pyarrow.concat_tables([table.slice(0, 10), table.slice(10)])
    assert Table(table).version == Table(chunked).version == Table(Frame(table)).version
    assert Table(table).version != Table(_numbers(101)).version
    assert Table(table).declaration() == Table(_numbers(5)).declaration()


def test_a_table_source_is_settled_and_cached(store: Store) -> None:
    """A frozen Table is refused until settled, then answers below it are kept and recalled."""
    count = Count()
    g = Graph.somatize(
        Table(_numbers(100)).named("t").frozen() >> count.named("c").frozen().cached()
    )
    with pytest.raises(NotSettled, match=r"`somatize.data.settle\(g\)`"):
        g.forward({"at": 0, "take": 8}, store=store)
    assert count.calls == 0
    settle(g)
    assert g.forward({"at": 96, "take": 8}, store=store) == 4
    assert g.forward({"at": 96, "take": 8}, store=store) == 4
    assert count.calls == 1


def test_a_table_is_refused_on_a_network_worker_saying_why() -> None:
    """A table in memory has nothing another process could rebuild it from: refused before
    anything runs, saying to put it in a store and read it with Parquet; a local worker
    runs it."""
    count = Count()
    g = Graph.somatize(Table(_numbers(10)).named("t").frozen().at("w1") >> count.named("c"))
    settle(g)
    network = Broker.embedded({"w1": Worker.generic(mode="network")})
    seen: list[dict[str, Any]] = []
    refused = r"`t` cannot be sent to worker `w1`.*Arrow table in this process's memory.*"
    refused += r"nothing to rebuild it from.*`Parquet\(store, name\)`.*mode=\"local\""
    with pytest.raises(Unbuildable, match=refused):
        g.forward({"at": 0, "take": 4}, broker=network, watching=seen.append)
    assert seen == [] and count.calls == 0
    local = Broker.embedded({"w1": Worker.generic(mode="local")})
    assert g.forward({"at": 0, "take": 4}, broker=local) == 4


# ---------------------------------------------------------------- Stream


def _stream() -> Stream:
    arrived = iter(range(1000))
    return Stream(lambda take: pyarrow.table({"n": [next(arrived) for _ in range(take)]}))


def test_a_stream_answers_whatever_is_newest() -> None:
    """The same question asked twice gets different rows: that is what a stream is."""
    source = _stream()
    g = Graph.somatize(source.named("stream") >> Count().named("count"))
    assert g.forward({"take": 3}) == 3
    assert source.forward({"take": 2}, Context(name="s")).column("n") == [3, 4]
    assert source.forward({"take": 2}, Context(name="s")).column("n") == [5, 6]


def test_a_stream_cannot_be_frozen_and_says_why() -> None:
    """`.frozen()` on a stream is refused: its answer cannot be asked for twice."""
    said = "`events` is a Stream and cannot be frozen: it answers whatever is newest"
    with pytest.raises(Unfreezable, match=said) as refused:
        _stream().named("events").frozen()
    assert isinstance(refused.value, ValueError)
    assert "nothing that reads it can be cached" in str(refused.value)
    with pytest.raises(Unfreezable, match="cannot be cached"):
        _stream().cached()


def test_nothing_under_a_stream_can_be_cached(store: Store) -> None:
    """A cached node below a stream is refused before anything runs, naming the stream."""
    echo = Echo()
    g = Graph.somatize(_stream().named("events") >> echo.named("echo").frozen().cached())
    said = (
        "`echo` keeps its output and `events`, which it reads, is not frozen: an output is "
        "only reusable if nothing above it can change"
    )
    with pytest.raises(Unsettled, match=said):
        g.forward({"take": 1}, store=store)
    assert echo.calls == 0


def test_a_cached_node_under_a_stream_is_not_told_to_freeze_the_stream(store: Store) -> None:
    """The refusal of a cached node under a stream told to declare the stream `.frozen()`,
    which a stream refuses (`Unfreezable`): it says the stream can never be frozen, and to
    drop `.cached()` from what reads it."""
    g = Graph.somatize(_stream().named("events") >> Echo().named("echo").frozen().cached())
    with pytest.raises(Unsettled) as refused:
        g.forward({"take": 1}, store=store)
    said = str(refused.value)
    assert "Declare `events` `.frozen()`" not in said
    assert "`events` (a `Stream`) can never be frozen" in said
    assert "Drop `.cached()` from `echo`" in said


def test_settle_refuses_a_stream_frozen_behind_its_back() -> None:
    """Freezing a stream in memory directly is still refused when the graph is settled."""
    g = Graph.somatize(_stream().named("events") >> Echo().named("echo"))
    g.memory.freeze("events")
    with pytest.raises(Unfreezable, match="cannot be settled"):
        settle(g)


@pytest.mark.parametrize(
    ("ask", "error", "fragment"),
    [
        ({"at": 0, "take": 1}, NotACoordinate, "a stream has no positions"),
        ({"take": 0}, BadCoordinate, "`take` is 0"),
        (5, NotACoordinate, r'a stream is handed `\{"take": n\}`'),
    ],
)
def test_a_stream_is_handed_how_many(ask: Any, error: type[Exception], fragment: str) -> None:
    """A stream takes `{"take": n}` and nothing else."""
    with pytest.raises(error, match=fragment):
        _stream().forward(ask, Context(name="s"))


def test_a_stream_that_brings_too_much_is_refused() -> None:
    """A pull function returning more rows than asked for is an error, not a bigger frame."""
    source = Stream(lambda take: _numbers(take + 1))
    with pytest.raises(TooManyRows, match="at most 2 rows and got 3"):
        source.forward({"take": 2}, Context(name="s"))
    with pytest.raises(TypeError, match="a function of how many rows"):
        Stream(42)  # type: ignore[arg-type]


def _feed(size: int, batches: int | None) -> pyarrow.RecordBatchReader:
    """A reader of ``batches`` batches of ``size`` numbers each (None: one that never ends)."""
    sent = itertools.count() if batches is None else range(batches)
    schema = pyarrow.schema([("n", pyarrow.int64())])
    numbers = (pyarrow.record_batch({"n": [i] * size}, schema=schema) for i in sent)
    return pyarrow.RecordBatchReader.from_batches(schema, numbers)


def test_a_stream_reading_a_reader_stops_once_it_brings_too_much() -> None:
    """A pull function answering a record batch reader is read batch by batch: one within
    the rows asked for is a frame of all it brings, and one that never ends (a live feed)
    is refused once it has brought more, not read for ever."""
    frame = Stream(lambda take: _feed(2, 2)).forward({"take": 4}, Context(name="s"))
    assert frame.column("n") == [0, 0, 1, 1]
    endless = Stream(lambda take: _feed(3, None))
    with pytest.raises(TooManyRows, match=r"at most 4 rows and got at least 6 \(from a reader"):
        endless.forward({"take": 4}, Context(name="s"))


# ---------------------------------------------------------------- settle


class Weights(Node):
    """A node that holds state and can say its digest, the way torch nodes will."""

    holds_state = True

    def __init__(self, digest: str) -> None:
        self.digest = digest

    def settled_state(self) -> str:
        return self.digest

    def forward(self, x: Any, ctx: Any) -> Any:
        return x


def test_settle_freezes_only_frozen_nodes_that_can_say_their_state() -> None:
    """settle() writes each frozen settling node's state into memory and leaves others alone."""
    table = Table(_numbers(10))
    loose = Weights("blake3:" + "1" * 64)
    g = Graph.somatize(table.named("t").frozen() >> loose.named("w") >> Echo().named("e").frozen())
    assert settle(g) == {"t": table.version}
    assert g.memory.state_of("t") == table.version
    assert not g.memory.is_frozen("w")
    assert g.memory.state_of("e") is None


def test_settle_uses_one_protocol_for_every_kind_of_state() -> None:
    """Any node with settled_state() is settled the same way a dataset is."""
    digest = "blake3:" + "2" * 64
    g = Graph.somatize(Weights(digest).named("w").frozen())
    assert settle(g) == {"w": digest}
    assert g.memory.state_of("w") == digest


def test_settle_refuses_what_is_not_a_graph() -> None:
    """settle() of an expression or a node is a TypeError that says to build the graph."""
    expr = Table(_numbers(3)).named("t").frozen() >> Echo().named("e")
    for wrong in (expr, Table(_numbers(3)), None):
        with pytest.raises(TypeError, match="settle takes a somatize Graph, got a `"):
            settle(wrong)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "state", [None, "", 123, "not-a-digest", "blake3:" + "A" * 64, ("blake3:" + "0" * 64).encode()]
)
def test_a_state_that_is_not_a_digest_is_refused_naming_the_node(state: Any) -> None:
    """A settled_state() answering anything but a `blake3:<64 hex>` str is refused, naming
    the node, and settles nothing."""
    good = Table(_numbers(3))
    g = Graph.somatize(good.named("t").frozen() >> Weights(state).named("w").frozen())
    with pytest.raises(NotADigest, match=r"`w`\.settled_state\(\) \(a `Weights`\) answered"):
        settle(g)
    assert g.memory.state_of("t") is None
    assert g.memory.state_of("w") is None


def test_a_tables_rows_cannot_be_written_in_place() -> None:
    """The copy a Table source holds, and hands out slices of, is in memory a write through
    numpy is refused on: a node cannot change the rows its version names."""
    import numpy

    source = Table(pyarrow.table({"n": list(range(8))}))
    chunk = source.forward({"at": 0, "take": 4}, Context(name="t")).to_arrow().column("n").chunks[0]
    values = numpy.frombuffer(chunk.buffers()[1], dtype=numpy.int64)
    with pytest.raises(ValueError, match="read-only"):
        values[chunk.offset : chunk.offset + len(chunk)] *= 10
    assert source.forward({"at": 0, "take": 4}, Context(name="t")).column("n") == [0, 1, 2, 3]


def test_a_tables_rows_and_version_are_fixed_when_it_is_built() -> None:
    """Neither the table a Table source reads nor its version can be set after it is built:
    the key of what is kept below it would no longer name the rows read."""
    source = Table(pyarrow.table({"n": list(range(8))}))
    with pytest.raises(AttributeError, match=r"is fixed when it is built.*Build a new"):
        source.table = pyarrow.table({"n": [9]})
    with pytest.raises(AttributeError, match=r"is fixed when it is built.*Build a new"):
        source.version = "blake3:" + "1" * 64
    assert source.forward({"at": 0, "take": 2}, Context(name="t")).column("n") == [0, 1]


def test_a_table_and_the_plain_node_below_it_keep_their_keys_under_tf32(store: Store) -> None:
    """A graph of a Table and a cached node that computes nothing with torch (which says so:
    ``ignores_precision``), called with float32 products in TF32 as Lightning's warning
    asks, recalls what the same graph kept in torch's default precision: neither key names
    the precision, so a store filled before keeps answering (every key was new)."""
    g = Graph.somatize(
        Table(_numbers(8)).named("t").frozen() >> Total().named("total").frozen().cached()
    )
    settle(g)
    assert g.forward({"at": 0, "take": 8}, store=store) == 28
    with matmul_in_tf32():
        assert g.forward({"at": 0, "take": 8}, store=store) == 28
    assert g.record is not None and g.record.outcome["total"] == "recalled"
