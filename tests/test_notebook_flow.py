"""End to end: the notebook's flow with plain Python nodes (everything but Parquet).

A source handed a coordinate, a cleaning node, a cached node below; the first
forward runs everything, the second recalls the cached node and spares the rest.
"""

from __future__ import annotations

import copy
import gc
import sys
import types
import warnings
import weakref
from typing import Any

import pytest

from somatize import (
    Broker,
    Drifted,
    Graph,
    Nameless,
    Node,
    NodeFailed,
    NotSettled,
    Store,
    Worker,
)
from tests.nodes import Rows

SPAM = ["win", "free", "cash", "prize"]
HAM = ["dinner", "tomorrow", "bus", "sorry"]


class Messages(Node):
    """A dataset source that holds state (its version) and is handed coordinates."""

    holds_state = True

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.calls = 0

    def forward(self, span: dict[str, int], ctx: Any) -> list[str]:
        self.calls += 1
        end = min(span["at"] + span["take"], self.rows)
        return [
            " ".join((SPAM if i % 7 == 0 else HAM)[j % 4] for j in range(3 + i % 10))
            for i in range(span["at"], end)
        ]


class Clean(Node):
    """Rows in, one list of word lengths per message out."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, messages: list[str], ctx: Any) -> list[list[float]]:
        self.calls += 1
        return [[float(len(word)) for word in one.split()] for one in messages]


class Widest(Node):
    """How long the longest message in the batch was."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, counts: list[list[float]], ctx: Any) -> float:
        self.calls += 1
        return float(max(len(one) for one in counts))


def _graph() -> tuple[Graph, Messages, Clean, Widest]:
    source, clean, widest = Messages(2000), Clean(), Widest()
    g = Graph.somatize(
        source.named("sms").frozen()
        >> clean.named("clean").frozen()
        >> widest.named("widest").frozen().cached()
    )
    return g, source, clean, widest


def test_notebook_flow(store: Store) -> None:
    """Runs with no store, refuses an unsettled source, then keeps, then recalls and spares."""
    g, source, clean, widest = _graph()
    assert g.forward({"at": 0, "take": 64}) == 12.0
    assert g.forward({"at": 1980, "take": 64}) == 12.0  # a short span at the end

    with pytest.raises(NotSettled, match="`sms` is declared frozen and has state"):
        g.forward({"at": 0, "take": 64}, store=store)

    g.memory.freeze("sms", store.put(b"the dataset's bytes"))  # what settle(g) does
    clean.calls = widest.calls = source.calls = 0
    seen: list[dict[str, Any]] = []
    g.forward({"at": 0, "take": 64}, store=store.root)
    assert g.forward({"at": 0, "take": 64}, store=store.root, watching=seen.append) == 12.0
    assert [f["fact"] for f in seen] == ["spared", "spared", "recalled", "finished"]
    assert [f.get("node") for f in seen[:3]] == ["sms", "clean", "widest"]
    assert seen[2]["key"].startswith("blake3:") and len(seen[2]["key"]) == 71
    assert isinstance(seen[3]["took_us"], int)
    assert (source.calls, clean.calls, widest.calls) == (1, 1, 1)


def test_another_version_is_another_answer(store: Store) -> None:
    """Settling the source at another state misses instead of returning the old answer."""
    g, _, _, widest = _graph()
    g.memory.freeze("sms", store.put(b"version one"))
    g.forward({"at": 0, "take": 64}, store=store)
    g.memory.freeze("sms", store.put(b"version two"))
    g.forward({"at": 0, "take": 64}, store=store)
    assert widest.calls == 2


def test_mutable_counter_does_not_change_keys(store: Store) -> None:
    """Counting calls on self does not make two forwards ask different questions."""
    rows = Rows()
    g = Graph.somatize(rows.named("rows").frozen().cached())
    g.forward({"at": 0, "take": 2}, store=store)
    g.forward({"at": 0, "take": 2}, store=store)
    assert rows.calls == 1


_CLEAN = """
class Clean(Node):
    def forward(self, messages, ctx):
        return [[float(len(word)) for word in one.split()]TAIL for one in messages]
"""


def _cell(tail: str, monkeypatch: pytest.MonkeyPatch) -> type[Node]:
    """A ``Clean`` class defined by running a notebook cell, as it reads with ``tail``: the
    same name and module whatever its body, as when the cell is edited and run again (the
    notebook's namespace then holds the new class under the name)."""
    cell = types.ModuleType("tests.notebook_cell")
    cell.Node = Node  # type: ignore[attr-defined]
    exec(compile(_CLEAN.replace("TAIL", tail), "<cell>", "exec"), cell.__dict__)
    monkeypatch.setitem(sys.modules, cell.__name__, cell)
    kind: type[Node] = cell.Clean
    return kind


def test_an_edited_node_above_makes_a_recalled_answer_drifted(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the cell defining ``clean`` is edited and run again, ``widest`` below it, whose
    key is unchanged, is recalled with a drifted fact naming ``clean`` and a warning; strict
    mode recomputes it, and the answer kept then is recalled as it is."""

    def graph(clean: type[Node]) -> Graph:
        g = Graph.somatize(
            Messages(2000).named("sms").frozen()
            >> clean().named("clean").frozen()
            >> Widest().named("widest").frozen().cached()
        )
        g.memory.freeze("sms", store.put(b"the dataset's bytes"))
        return g

    span = {"at": 0, "take": 64}
    first: list[dict[str, Any]] = []
    assert graph(_cell("", monkeypatch)).forward(span, store=store, watching=first.append) == 12.0
    edited = graph(_cell(" * 2", monkeypatch))
    seen: list[dict[str, Any]] = []
    with pytest.warns(Drifted, match=r"`widest` was recalled .* the code of `clean` \(`Clean`\)"):
        assert edited.forward(span, store=store, watching=seen.append) == 12.0
    assert [f["fact"] for f in seen] == ["spared", "spared", "recalled", "drifted", "finished"]
    assert seen[2]["key"] == first[-2]["key"]  # the code is not in the key
    assert seen[3]["changed"] == ["clean"]
    assert edited.forward(span, store=store, strict=True) == 24.0
    assert edited.record is not None and edited.record.outcome["widest"] == "ran"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert edited.forward(span, store=store) == 24.0
    assert edited.record.outcome["widest"] == "recalled"


def test_a_node_made_before_its_cell_ran_again_is_refused_for_what_it_is(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node made, then its class's cell run again (unchanged), is of a class its name no
    longer leads to: caching it is refused saying so, and what to do — not that its class
    is defined inside a function, which it is not. Made again, it is keyed and kept."""
    made = _cell("", monkeypatch)()
    again = _cell("", monkeypatch)

    def graph(clean: Node) -> Graph:
        g = Graph.somatize(
            Messages(2000).named("sms").frozen() >> clean.named("clean").frozen().cached()
        )
        g.memory.freeze("sms", store.put(b"the dataset's bytes"))
        return g

    span = {"at": 0, "take": 8}
    with pytest.raises(Nameless, match=r"class was defined again after `clean` was made") as why:
        graph(made).forward(span, store=store)
    assert "inside a function" not in str(why.value)
    assert why.value.again
    assert graph(again()).forward(span, store=store) == graph(again()).forward(span, store=store)


class NoContext(Node):
    """A forward written without ``ctx``, as one is easily written at first."""

    def forward(self, messages: list[str]) -> int:  # type: ignore[override]
        return len(messages)


class ReadsTwo(Node):
    """A forward that reads two inputs, chained below one node."""

    def forward(self, a: Any, b: Any, ctx: Any) -> Any:
        return a


@pytest.mark.parametrize(
    ("node", "said"),
    [
        (
            NoContext(),
            r"its 1 input \(the graph's input\) and then ctx: `def forward\(self, x, ctx\)`",
        ),
        (
            ReadsTwo(),
            r"its 1 input \(the graph's input\) and then ctx: `def forward\(self, x, ctx\)`",
        ),
    ],
    ids=["no-ctx", "two-inputs"],
)
def test_a_forward_that_cannot_take_its_inputs_and_ctx_says_how_it_is_called(
    node: Node, said: str
) -> None:
    """A forward whose signature cannot take what a node is handed (its inputs, then ctx)
    fails saying how a node's forward is called, not only Python's count of arguments."""
    with pytest.raises(NodeFailed, match=said):
        Graph.somatize(node.named("n")).forward(["a", "b"])
    for mode in ("local", "network"):
        on = Graph.somatize(copy.copy(node).named("n").at("w1"))
        with pytest.raises(NodeFailed, match=said):
            on.forward(["a", "b"], broker=Broker.embedded({"w1": Worker.generic(mode=mode)}))


def test_a_forward_raising_typeerror_inside_is_not_said_to_be_called_wrongly() -> None:
    """A TypeError raised inside a forward that takes its inputs and ctx is the forward's
    own, and is said as it is."""

    class Inside(Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            return x + "text"

    with pytest.raises(NodeFailed, match="unsupported operand") as failed:
        Graph.somatize(Inside().named("n")).forward(1)
    assert "def forward" not in str(failed.value)


_KINDS = """
class Lengths(Node):
    def __init__(self, scale):
        self.scale = scale

    def forward(self, messages, ctx):
        return [len(one) * self.scale for one in messages]


class Kept(Node):
    __slots__ = ("floor",)

    def __new__(cls, *args, **kwargs):
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, floor=0):
        self.floor = floor

    def declare(self):
        return {"floor": self.floor}

    def forward(self, lengths, ctx):
        return max([self.floor, *lengths])
"""


def test_classes_of_a_cell_run_again_are_freed_with_their_graphs(store: Store) -> None:
    """Classes of nodes a notebook's cell defined, run again (the namespace holding the new
    ones) and built into graphs that ran and were dropped, are freed: what somatize works
    out once per class holds none of them alive, so a cell run a hundred times holds one
    set of classes, not a hundred."""
    made: list[weakref.ref[type]] = []
    for scale in range(3):
        cell = types.ModuleType("tests.notebook_cell")
        cell.Node = Node  # type: ignore[attr-defined]
        exec(compile(_KINDS, "<cell>", "exec"), cell.__dict__)
        with pytest.MonkeyPatch.context() as patch:
            patch.setitem(sys.modules, cell.__name__, cell)
            g = Graph.somatize(
                Messages(2000).named("sms").frozen()
                >> cell.Lengths(scale).named("lengths").frozen()
                >> cell.Kept(1).named("kept").frozen().cached()
            )
            g.memory.freeze("sms", store.put(b"the dataset's bytes"))
            span = {"at": 0, "take": 16}
            assert g.forward(span, store=store) == g.forward(span, store=store) > 0
        made += [weakref.ref(cell.Lengths), weakref.ref(cell.Kept)]
        del g, cell
    gc.collect()
    assert [kind.__name__ for kind in (ref() for ref in made) if kind is not None] == []
