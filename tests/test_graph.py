"""Graphs: building from expressions, names, cycles, and hash-consing."""

from __future__ import annotations

import asyncio
import functools
import gc
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from somatize import Cycle, Expr, Graph, GraphError, Node, NodeFailed, UnknownNode
from somatize.plan import compile
from tests.broker_nodes import Weighted
from tests.nodes import Add, Echo, Largest, Rows, Scale, Slotted


def test_chain_builds_nodes_in_order() -> None:
    """A chain gives its nodes in order, each reading the one before."""
    g = Graph.somatize(Rows().named("r") >> Scale().named("s") >> Largest().named("l"))
    assert g.nodes() == ("r", "s", "l")
    assert g.predecessors("l") == ("s",)
    assert g.roots() == ("r",)
    assert g.outputs == ("l",)


def test_derived_names_are_unique() -> None:
    """Unnamed nodes are named after their class, numbered when the class repeats."""
    g = Graph.somatize(Rows() >> (Scale(1.0), Scale(2.0)))
    assert set(g.nodes()) == {"rows", "scale", "scale_2"}


def test_duplicate_explicit_names_refused() -> None:
    """Two different nodes may not share a name."""
    with pytest.raises(GraphError, match="two different nodes are named `x`"):
        Graph.somatize(Rows().named("x") >> Scale().named("x"))
    rows = Rows().named("rows").frozen()
    for other_first in (False, True):  # `b` is interned into `a`, and another node is `b`
        twins = [Scale(2.0).named("a").frozen(), Scale(2.0).named("b").frozen()]
        other = Scale(3.0).named("b")
        branches = (other, *twins) if other_first else (*twins, other)
        with pytest.raises(GraphError, match="two different nodes are named `b`"):
            Graph.somatize(rows >> branches)


def test_fan_in_hands_inputs_in_order() -> None:
    """A node reading two predecessors gets their outputs as positional arguments, in order."""
    add = Add()
    g = Graph.somatize((Echo("a").named("a"), Echo("b").named("b")) >> add.named("add"))
    assert g.predecessors("add") == ("a", "b")
    assert g.forward(2.0) == 4.0


def test_several_outputs_come_back_as_a_tuple() -> None:
    """A graph with several outputs returns a tuple, in the expression's order."""
    g = Graph.somatize(Rows() >> (Largest().named("top"), Scale(10.0).named("big")))
    top, big = g.forward({"at": 0, "take": 3})
    assert top == 2.0
    assert big == [0.0, 10.0, 20.0]


def test_cycle_refused() -> None:
    """A graph that feeds a node into itself is refused, naming the nodes."""
    a, b = Echo("a").named("a"), Echo("b").named("b")
    a >> b
    with pytest.raises(Cycle, match="feeds a node into itself"):
        Graph.somatize((a >> b) >> a)


def test_cycle_refused_names_the_nodes_on_it_in_order() -> None:
    """The refusal names the nodes on the cycle, in the order values would flow round
    it, and says how many more wait below it, rather than take those for part of it."""
    b, c = Echo("b").named("b"), Echo("c").named("c")
    below = Echo("d").named("d")
    with pytest.raises(Cycle) as refused:
        Graph.somatize(Echo("a").named("a") >> b >> c >> b >> below >> Echo("e").named("e"))
    said = str(refused.value)
    assert "<Echo 'b'> → <Echo 'c'> → <Echo 'b'>" in said
    assert "2 nodes below it wait on it" in said
    assert "'d'" not in said and "'a'" not in said
    one = Echo("x").named("x")
    with pytest.raises(Cycle, match="<Echo 'x'> → <Echo 'x'>") as itself:
        Graph.somatize(one >> one)
    assert "below it" not in str(itself.value)
    with pytest.raises(Cycle, match=r"\(1 node below it waits on it\)"):
        Graph.somatize(one >> one >> Echo("y").named("y"))


class _Awaited(Node):
    async def forward(self, x: Any, ctx: Any) -> Any:
        return x


class _AwaitedCall:
    async def __call__(self, x: Any, ctx: Any) -> Any:
        return x


class _AwaitedObject(Node):
    forward = _AwaitedCall()


class _Streamed(Node):
    async def forward(self, x: Any, ctx: Any) -> Any:
        yield x


class _Drained(Node):
    def forward(self, stream: Any, ctx: Any) -> Any:
        async def drained() -> list[Any]:
            return [x async for x in stream]

        return asyncio.run(drained())


class _Promised(Node):
    def forward(self, x: Any, ctx: Any) -> Any:
        async def later() -> Any:
            return x

        return later()


class _Kept(Node):
    def forward(self, promise: Any, ctx: Any) -> Any:
        return asyncio.run(promise)


def test_a_node_with_an_async_forward_is_refused_when_the_graph_is_built() -> None:
    """A forward is called and what it returns handed on, never awaited: a node whose
    forward is `async def`, or an object whose `__call__` is, would hand on a coroutine,
    so the graph is refused, naming it."""
    for kind in (_Awaited, _AwaitedObject):
        with pytest.raises(GraphError, match=r"`late` \(_\w+\) has an `async def forward`"):
            Graph.somatize(Echo() >> kind().named("late"))


def _called_plainly(forward: Any) -> Any:
    """A decorator that hides an `async def` from `inspect` (as one timing or logging a
    call does, or `torch.no_grad()`): its wrapper is a plain function."""

    @functools.wraps(forward)
    def plainly(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    return plainly


class _AwaitedUnderDecorator(Node):
    @_called_plainly
    async def forward(self, x: Any, ctx: Any) -> Any:
        return x


def test_an_async_forward_under_a_decorator_is_refused_when_it_runs(tmp_path: Path) -> None:
    """An `async def forward` a decorator hides is seen as it answers its own coroutine: it
    is refused naming it, never handed on to the caller nor to a codec, and the coroutine
    is closed, so Python does not warn it was never awaited."""
    for store in (None, tmp_path):
        g = Graph.somatize(
            Echo().frozen() >> _AwaitedUnderDecorator().named("late").frozen().cached()
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            with pytest.raises(NodeFailed, match=r"`late` .*its own `async def forward`"):
                g.forward(3, store=store)
            gc.collect()
        assert g.record.outcome["late"] == "failed"


def test_a_forward_handing_on_an_async_stream_or_an_awaitable_is_taken() -> None:
    """An `async def` forward that yields hands on its stream, as one that yields hands on
    its generator, and a plain forward may hand on an awaitable it made: what reads them
    is handed that very object."""
    g = Graph.somatize(_Streamed() >> _Drained())
    assert g.forward(3) == [3]
    assert Graph.somatize(_Promised() >> _Kept()).forward(4) == 4


def test_a_graph_iterates_over_its_node_names_in_order() -> None:
    """A graph is looked into by name (`g["scale"]`, `"scale" in g`, `len(g)`), so going
    over it gives the names, in order, as `g.nodes()` does, and not an error about a
    node named `0`."""
    g = Graph.somatize(Rows().named("rows") >> (Scale(1.0), Scale(2.0)) >> Add())
    assert list(g) == list(g.nodes()) == ["rows", "scale", "scale_2", "add"]
    assert [g[name].kind_name() for name in g] == ["Rows", "Scale", "Scale", "Add"]


def test_unknown_node_name() -> None:
    """Asking for a node the graph does not have lists the ones it has."""
    g = Graph.somatize(Rows().named("r") >> Largest().named("l"))
    with pytest.raises(UnknownNode, match="no node named `nope`; it has `r`, `l`"):
        g.node("nope")
    with pytest.raises(UnknownNode):
        g.forward({"at": 0, "take": 2}, outputs="nope")


def test_a_node_asked_for_by_itself_or_by_what_is_no_name_is_refused_saying_so() -> None:
    """A graph is asked about a node by its name: given the node itself it says to pass
    its name (`node in g` was False for a node in it), and a value that cannot be a name
    (a list) is no node of it, not a bare TypeError about hashing."""
    rows = Rows().named("r")
    g = Graph.somatize(rows >> Largest().named("l"))
    with pytest.raises(UnknownNode, match=r"got the node <Rows 'r'> itself: pass its name, `'r'`"):
        g.predecessors(rows)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"pass its name, `'r'`"):
        rows in g  # noqa: B015
    assert [1] not in g
    with pytest.raises(UnknownNode, match=r"no node named `\[1\]`"):
        g.node([1])  # type: ignore[arg-type]


def test_hash_consing_same_frozen_computation_is_one_node() -> None:
    """The same frozen computation composed twice is one node, computed once."""
    rows = Rows().named("rows").frozen()
    first, second = Scale(2.0).frozen(), Scale(2.0).frozen()
    add = Add().named("add")
    g = Graph.somatize((rows >> first, rows >> second) >> add)
    assert len(g) == 3
    assert g.predecessors("add") == ("scale", "scale")
    assert g.forward({"at": 0, "take": 3}) == 2 * (0.0 + 2.0 + 4.0)
    assert first.calls + second.calls == 1


def test_hash_consing_keeps_distinct_computations_apart() -> None:
    """Different declarations, unfrozen nodes and different inputs are not merged."""
    rows = Rows().named("rows").frozen()
    g = Graph.somatize((rows >> Scale(2.0).frozen(), rows >> Scale(3.0).frozen()) >> Add())
    assert len(g) == 4
    g = Graph.somatize((rows >> Scale(2.0), rows >> Scale(2.0)) >> Add())
    assert len(g) == 4


def test_interned_node_answers_to_both_names() -> None:
    """A merged node's second name resolves to the first."""
    rows = Rows().named("rows").frozen()
    g = Graph.somatize(
        (rows >> Scale(2.0).named("one").frozen(), rows >> Scale(2.0).named("two").frozen())
        >> Add()
    )
    assert g.resolve("two") == "one"
    assert "two" in g


def test_asking_about_a_node_takes_either_name_of_an_interned_one() -> None:
    """What reads a node, what it reads and what it is are asked by either name of an
    interned node, as `g.node` is; a name the graph does not have is an UnknownNode
    listing those it has, for every question, rather than a bare KeyError or None."""
    rows = Rows().named("rows").frozen()
    g = Graph.somatize(
        (rows >> Scale(2.0).named("one").frozen(), rows >> Scale(2.0).named("two").frozen())
        >> Add().named("add")
    )
    assert g.predecessors("two") == g.predecessors("one") == ("rows",)
    assert g.successors("two") == ("add",)
    assert g.kind_of("two") == "Scale"
    assert g.holds_state("two") is False and g.settles("two") is False
    assert g.state_held("two") is None and g.undeclared("two") is None
    for ask in (
        g.predecessors,
        g.successors,
        g.kind_of,
        g.holds_state,
        g.state_held,
        g.settles,
        g.undeclared,
    ):
        with pytest.raises(UnknownNode, match="no node named `nope`; it has `rows`"):
            ask("nope")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([1.0, 2.0, 3.0]), min_size=1, max_size=6), st.booleans())
def test_hash_consing_property(factors: list[float], frozen: bool) -> None:
    """Frozen branches intern to exactly one node per distinct declaration; unfrozen
    branches never merge; the answer is the same either way."""
    rows = Rows().named("rows").frozen()
    branches = []
    for factor in factors:
        scale = Scale(factor)
        branches.append(rows >> (scale.frozen() if frozen else scale))
    g = Graph.somatize(tuple(branches) >> Add().named("add"))
    expected_branches = len(set(factors)) if frozen else len(factors)
    assert len(g) == expected_branches + 2
    total = g.forward({"at": 0, "take": 4})
    assert total == sum(sum(i * f for i in range(4)) for f in factors)


class Pair(Node):
    """Its two inputs, as a list."""

    def forward(self, first: Any, second: Any, ctx: Any) -> list[Any]:
        return [first, second]


def test_frozen_nodes_built_with_equal_lists_are_not_interned() -> None:
    """Two frozen nodes built with equal lists stay two nodes: changing one list afterwards
    changes one of them, with or without a store."""
    one, two = [2.0], [2.0]
    rows = Rows().named("rows").frozen()
    g = Graph.somatize(
        rows >> (Weighted(one).named("a").frozen(), Weighted(two).named("b").frozen())
    )
    assert g.nodes() == ("rows", "a", "b")
    x = {"at": 1, "take": 2}
    assert g.forward(x) == ([2.0, 4.0], [2.0, 4.0])
    two[0] = 3.0
    assert g.forward(x) == ([2.0, 4.0], [3.0, 6.0])


def test_frozen_nodes_given_other_attributes_after_building_are_not_interned() -> None:
    """Two frozen nodes built alike and then given other attributes compute other answers:
    they stay two nodes; given equal values, they are one — but where a value is given to an
    argument the node keeps, taken as that argument at the first forward: such nodes are
    never interned, as one whose declaration is derived again is not."""
    rows = Rows().named("rows").frozen()
    low, high = Scale(2.0).named("low").frozen(), Scale(2.0).named("high").frozen()
    high.by = 10.0
    g = Graph.somatize(rows >> (low, high))
    assert g.nodes() == ("rows", "low", "high")
    assert g.forward({"at": 1, "take": 2}) == ([2.0, 4.0], [10.0, 20.0])
    one, two = Scale(2.0).named("one").frozen(), Scale(2.0).named("two").frozen()
    one.by = two.by = 3.0
    g = Graph.somatize(rows >> (one, two))
    assert g.nodes() == ("rows", "one", "two")
    assert g.forward({"at": 1, "take": 2}) == ([3.0, 6.0], [3.0, 6.0])
    one, two = Slotted().named("one").frozen(), Slotted().named("two").frozen()
    one.offset = two.offset = 100.0
    assert Graph.somatize(Echo().named("echo").frozen() >> (one, two)).nodes() == ("echo", "one")


def _adding(k: int) -> type[Node]:
    """A class of nodes adding ``k``, made anew at each call, so it has no name of its own."""

    class Adds(Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            return x + k

    return Adds


def test_frozen_nodes_of_two_classes_given_one_identity_are_not_interned() -> None:
    """Two classes a factory made, each given the one stable name a refusal advises
    (`.identified(...)`), compute other answers: built alike and frozen, they stay two
    nodes, each running its own code, with or without a store — where one was interned into
    the other, and both answered what the first computes."""
    one = _adding(1)().named("one").identified("tests.factory:Adds").frozen()
    hundred = _adding(100)().named("hundred").identified("tests.factory:Adds").frozen()
    g = Graph.somatize(Echo().named("x").frozen() >> (one, hundred) >> Pair().frozen())
    assert g.nodes() == ("x", "one", "hundred", "pair")
    assert g.forward(1) == [2, 101]


def test_frozen_nodes_differing_in_a_slot_are_not_interned() -> None:
    """Two frozen nodes built alike whose class holds its attributes in ``__slots__``, given
    other values there after building, compute other answers: they stay two nodes."""
    rows = Echo().named("rows").frozen()
    low, high = Slotted().named("low").frozen(), Slotted().named("high").frozen()
    high.offset = 100.0
    g = Graph.somatize(rows >> (low, high))
    assert g.nodes() == ("rows", "low", "high")
    assert g.forward(1.0) == (2.0, 102.0)


def test_interned_nodes_still_hand_one_argument_per_edge() -> None:
    """Two edges from nodes interned to one are two arguments, in order: the computation is
    shared, what reads it is not changed."""
    rows = Rows().named("rows").frozen()
    g = Graph.somatize(rows >> (Scale(2.0).frozen(), Scale(2.0).frozen()) >> Pair().frozen())
    assert len(g) == 3
    assert g.predecessors("pair") == ("scale", "scale")
    assert g.successors("scale") == ("pair",)
    assert g.forward({"at": 0, "take": 2}) == [[0.0, 2.0], [0.0, 2.0]]


def test_a_node_given_twice_is_two_arguments() -> None:
    """`(a, a) >> j` hands `j` two arguments, as two nodes interned to one do, with the same
    key; a piece of graph written twice is still one (its edges are not doubled)."""
    rows = Rows().named("rows").frozen()
    scale = Scale(2.0).frozen()
    g = Graph.somatize(rows >> (scale, scale) >> Pair().frozen())
    twins = Graph.somatize(rows >> (Scale(2.0).frozen(), Scale(2.0).frozen()) >> Pair().frozen())
    assert g.predecessors("pair") == ("scale", "scale")
    assert g.forward({"at": 0, "take": 2}) == [[0.0, 2.0], [0.0, 2.0]]
    at = {"at": 0, "take": 2}
    assert compile(g, at, None, g.outputs).keys == compile(twins, at, None, twins.outputs).keys

    add = Add().named("add")
    a, b = Echo("a").named("a"), Echo("b").named("b")
    chain = a >> b
    assert Graph.somatize((chain, chain >> add)).predecessors("add") == ("b",)
    assert Graph.somatize(((a, a) >> add, (a, a) >> add)).predecessors("add") == ("a", "a")
    fan_in = Graph.somatize((a >> add, b >> add))
    assert fan_in.predecessors("add") == ("a", "b")
    assert fan_in.outputs == ("add",)  # written twice among the outputs: one output


def test_interned_outputs_keep_one_slot_each() -> None:
    """Two declared outputs interned to one node still come back as two values."""
    rows = Rows().named("rows").frozen()
    g = Graph.somatize(rows >> (Scale(2.0).named("a").frozen(), Scale(2.0).named("b").frozen()))
    assert g.outputs == ("a", "a")
    assert g.forward({"at": 0, "take": 2}) == ([0.0, 2.0], [0.0, 2.0])


def test_listing_shows_nodes_edges_and_declarations() -> None:
    """print(g) lists each node with what it reads and what is declared about it."""
    g = Graph.somatize(
        Rows().named("sms").frozen() >> Largest().named("widest").frozen().cached("v1").at("w1")
    )
    text = str(g)
    assert "sms" in text and "Rows ← input" in text
    assert "widest  Largest ← sms  [frozen, cached(salt='v1'), at w1]  → output" in text


class Patches(Node):
    """Sets another forward on :class:`PatchedAsItRuns` as it runs, as another thread
    patching it meanwhile would."""

    def forward(self, x: int, ctx: Any) -> int:
        PatchedAsItRuns.forward = lambda self, x, ctx: x + 1000  # type: ignore[method-assign]
        return x


class PatchedAsItRuns(Node):
    """Adds one, until patched."""

    def forward(self, x: int, ctx: Any) -> int:
        return x + 1


def test_an_answer_computed_while_its_code_was_changed_is_not_kept(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node whose class is given another method while the forward runs computes with the
    new code, after the old code's fingerprint was taken: its answer is not kept, so the
    old code, set back, computes its own answer rather than recall the new code's."""
    from somatize import Store

    store = Store(tmp_path)
    written = PatchedAsItRuns.forward
    monkeypatch.setattr(PatchedAsItRuns, "forward", written)
    graph = Graph.somatize(
        Patches().named("a").frozen() >> PatchedAsItRuns().named("b").frozen().cached()
    )
    assert graph.forward(1, store=store) == 1001
    assert graph.record is not None and "kept" not in [f["fact"] for f in graph.record.facts]
    PatchedAsItRuns.forward = written  # type: ignore[method-assign]
    monkeypatch.setattr(Patches, "forward", lambda self, x, ctx: x)
    fresh = Graph.somatize(
        Patches().named("a").frozen() >> PatchedAsItRuns().named("b").frozen().cached()
    )
    assert fresh.forward(1, store=store, strict=True) == 2


class PatchesItems(Node):
    """Sets another forward on :class:`ItemsPatchedAsItRuns` as it runs, as another thread
    patching it meanwhile would."""

    def forward(self, x: list[int], ctx: Any) -> list[int]:
        ItemsPatchedAsItRuns.forward = lambda self, xs, ctx: [x + 1000 for x in xs]  # type: ignore[method-assign]
        return x


class ItemsPatchedAsItRuns(Node):
    """Adds one to each item, until patched."""

    def forward(self, xs: list[int], ctx: Any) -> list[int]:
        return [x + 1 for x in xs]


def test_item_answers_computed_while_their_code_was_changed_are_not_kept_nor_said_kept(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mapped node whose class is given another method while the forward runs has its
    item answers not kept, as an unmapped node's answer is not, and says no ``kept``: the
    fact said they were, of 0 bytes, and the old code, set back, found nothing kept."""
    from somatize import Store

    store = Store(tmp_path)
    written = ItemsPatchedAsItRuns.forward
    monkeypatch.setattr(ItemsPatchedAsItRuns, "forward", written)
    graph = Graph.somatize(
        PatchesItems().named("a").frozen()
        >> ItemsPatchedAsItRuns().named("b").frozen().cached().mapped()
    )
    assert graph.forward([1, 2], store=store) == [1001, 1002]
    assert graph.record is not None and "kept" not in [f["fact"] for f in graph.record.facts]
    assert graph.record.outcome["b"] == "ran"
    ItemsPatchedAsItRuns.forward = written  # type: ignore[method-assign]
    monkeypatch.setattr(PatchesItems, "forward", lambda self, x, ctx: x)
    fresh = Graph.somatize(
        PatchesItems().named("a").frozen()
        >> ItemsPatchedAsItRuns().named("b").frozen().cached().mapped()
    )
    assert fresh.forward([1, 2], store=store, strict=True) == [2, 3]
    assert fresh.record is not None and "kept" in [f["fact"] for f in fresh.record.facts]


def _steps(build: Any) -> int:
    """How many lines of graph.py and node.py run while ``build()`` runs: a count of the
    work done, the same on every machine."""
    count = 0

    def inside(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        count += 1
        return inside

    def called(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename.endswith(("somatize/graph.py", "somatize/node.py")):
            return inside(frame, event, arg)
        return None

    sys.settrace(called)
    try:
        build()
    finally:
        sys.settrace(None)
    return count


def test_building_a_wide_graph_takes_work_in_proportion_to_its_nodes() -> None:
    """A fan-in or fan-out of many nodes of one class, written as one tuple, is put
    together, ordered and named in work that grows as the number of nodes does: twice
    the nodes, about twice the work, not four times."""

    def fan_in(n: int) -> Any:
        return lambda: Graph.somatize(tuple(Echo() for _ in range(n)) >> Add())

    def fan_out(n: int) -> Any:
        return lambda: Graph.somatize(Echo() >> tuple(Echo() for _ in range(n)))

    for shape in (fan_in, fan_out):
        small, large = _steps(shape(300)), _steps(shape(600))
        assert large < 2.3 * small, (shape.__name__, small, large)
    g = Graph.somatize(tuple(Echo() for _ in range(300)) >> Add())
    assert g.nodes() == ("echo", *(f"echo_{i}" for i in range(2, 301)), "add")


class _Plain(Node):
    def forward(self, x: Any, ctx: Any) -> Any:
        return x


def _beside_one_by_one(first: Expr, other: Expr) -> Expr:
    """Two pieces of graph side by side, as `beside` is documented to put them."""
    nodes = list(first.nodes)
    known = {id(n) for n in nodes}
    nodes.extend(n for n in other.nodes if id(n) not in known)
    held = Counter((id(s), id(t)) for s, t in first.edges)
    edges = list(first.edges)
    for source, target in other.edges:
        pair = (id(source), id(target))
        if held[pair]:
            held[pair] -= 1
        else:
            edges.append((source, target))
    return Expr(nodes, edges, first.outputs + other.outputs)


def _then_one_by_one(first: Expr, other: Expr) -> Expr:
    """``first >> other`` as `>>` is documented to put them: side by side, each output of
    ``first`` feeding each head of ``other``, whose outputs are the outputs."""
    joined = _beside_one_by_one(first, other)
    bridges = [(tail, head) for head in other.heads() for tail in first.outputs]
    return Expr(joined.nodes, joined.edges + bridges, list(other.outputs))


def _said(expr: Expr) -> tuple[list[int], list[tuple[int, int]], list[int]]:
    return (
        [id(n) for n in expr.nodes],
        [(id(s), id(t)) for s, t in expr.edges],
        [id(n) for n in expr.outputs],
    )


def test_an_edge_a_chain_holds_already_is_not_doubled_by_a_later_link() -> None:
    """An edge a link of a chain brings that the chain holds already, as an edge of an
    earlier link or as a bridge between two, is kept once, as `beside` keeps it."""
    a, b, c = _Plain(), _Plain(), _Plain()
    first = a >> Expr([b, c], [(b, c)], [b])  # a -> b bridges the link holding b -> c
    chained = first >> Expr([a, b], [(a, b), (b, c)], [b]) >> c
    expected = _then_one_by_one(
        _then_one_by_one(
            _then_one_by_one(Expr.of(a), Expr([b, c], [(b, c)], [b])),
            Expr([a, b], [(a, b), (b, c)], [b]),
        ),
        Expr.of(c),
    )
    assert _said(chained) == _said(expected)
    assert [(id(s), id(t)) for s, t in chained.edges].count((id(a), id(b))) == 1


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_chain_is_its_links_put_one_after_another(data: st.DataObject) -> None:
    """Pieces of graph chained with `>>` one at a time, from any expression made before
    (one read already or not, one chained on twice), hold the nodes, edges and outputs
    that putting each link after the one before gives, whichever of them is read first."""
    pool = [_Plain() for _ in range(3)]
    picks = st.sampled_from(range(3))
    made = [Expr.of(pool[0])]
    expected = [Expr.of(pool[0])]
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(made) - 1))
        nodes = data.draw(st.lists(picks, min_size=1, max_size=3, unique=True))
        edges = data.draw(st.lists(st.tuples(picks, picks), max_size=3))
        outputs = data.draw(st.lists(picks, max_size=2))
        part = Expr(
            [pool[i] for i in nodes],
            [(pool[s], pool[t]) for s, t in edges],
            [pool[i] for i in outputs],
        )
        after: Node | Expr = pool[nodes[0]] if data.draw(st.booleans()) else part
        made.append(made[at] >> after)
        expected.append(_then_one_by_one(expected[at], Expr.of(after)))
        if data.draw(st.booleans()):
            _said(made[data.draw(st.integers(0, len(made) - 1))])
    for got, want in zip(reversed(made), reversed(expected), strict=True):
        assert _said(got) == _said(want)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_tuple_is_its_parts_put_side_by_side_one_by_one(data: st.DataObject) -> None:
    """A tuple of pieces of graph holds the nodes, edges (each as often as the part
    holding it most often has it, in the order it first comes that often) and outputs
    that putting its parts side by side one after another gives."""
    pool = [_Plain() for _ in range(4)]
    picks = st.sampled_from(range(4))
    parts = []
    for _ in range(data.draw(st.integers(1, 5))):
        nodes = data.draw(st.lists(picks, min_size=1, max_size=4, unique=True))
        edges = data.draw(st.lists(st.tuples(picks, picks), max_size=5))
        outputs = data.draw(st.lists(picks, max_size=3))
        parts.append(
            Expr(
                [pool[i] for i in nodes],
                [(pool[s], pool[t]) for s, t in edges],
                [pool[i] for i in outputs],
            )
        )
    expected = Expr()
    for part in parts:
        expected = _beside_one_by_one(expected, part)
    got = Expr.of(tuple(parts))
    assert [id(n) for n in got.nodes] == [id(n) for n in expected.nodes]
    assert [(id(s), id(t)) for s, t in got.edges] == [(id(s), id(t)) for s, t in expected.edges]
    assert [id(n) for n in got.outputs] == [id(n) for n in expected.outputs]
