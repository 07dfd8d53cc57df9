"""Memory: four independent maps, and the refusals cacheable() makes, nearest first."""

from __future__ import annotations

from typing import Any

import pytest

from somatize import Graph, Memory, Nameless, Node, NotSettled, Unsettled, cacheable
from tests.nodes import Largest, Rows, Scale


def test_maps_are_independent() -> None:
    """Frozen, cached, mapped and identified are said separately and read back separately."""
    memory = Memory()
    assert memory.is_empty()
    memory.freeze("a")
    memory.cache("b", "salt")
    memory.map("c")
    memory.identify("d", "m:D")
    assert memory.is_frozen("a") and not memory.is_cached("a")
    assert memory.is_cached("b") and not memory.is_frozen("b") and memory.salt_of("b") == "salt"
    assert memory.is_mapped("c") and not memory.is_frozen("c")
    assert memory.identity_of("d") == "m:D" and memory.identity_of("a") is None
    assert len(memory) == 4


def test_freeze_twice_keeps_the_state() -> None:
    """`.frozen()` says it with no digest and settling says it again with one; a later
    plain freeze does not forget the digest."""
    memory = Memory()
    memory.freeze("a")
    assert memory.state_of("a") is None
    memory.freeze("a", "blake3:" + "1" * 64)
    memory.freeze("a")
    assert memory.state_of("a") == "blake3:" + "1" * 64


def test_fingerprint_is_noted_apart() -> None:
    """Fingerprints are kept and returned, replacing the old one."""
    memory = Memory()
    assert memory.written_as("a", "f1") is None
    assert memory.written_as("a", "f2") == "f1"
    assert memory.fingerprint_of("a") == "f2"


def test_unsettled_names_the_cached_node_itself() -> None:
    """A cached node that is not frozen is refused, naming itself."""
    g = Graph.somatize(Rows().named("rows").frozen() >> Largest().named("top").cached())
    with pytest.raises(Unsettled, match="`top` keeps its output and is not frozen"):
        cacheable(g, g.memory)


def test_unsettled_names_the_nearest_offender() -> None:
    """Of several moving nodes upstream, the nearest is named."""
    g = Graph.somatize(
        Rows().named("rows") >> Scale().named("scale") >> Largest().named("top").frozen().cached()
    )
    with pytest.raises(Unsettled, match="`scale`, which it reads, is not frozen") as refused:
        cacheable(g, g.memory)
    assert refused.value.moving == "scale"
    assert isinstance(refused.value, ValueError)


def test_nameless_upstream_refused() -> None:
    """A node with no identity upstream of a cached node is refused with advice."""

    class Local(Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            return x

    g = Graph.somatize(Local().named("local").frozen() >> Largest().named("top").frozen().cached())
    with pytest.raises(Nameless, match=r"nobody said what implements `local`.*identified"):
        cacheable(g, g.memory)
    g2 = Graph.somatize(
        Local().named("local").frozen().identified("tests.local:Local")
        >> Largest().named("top").frozen().cached()
    )
    cacheable(g2, g2.memory)


def test_refusal_happens_before_anything_runs(store: Any) -> None:
    """With a store, an unsettled graph is refused and nothing runs or is kept."""
    rows = Rows().named("rows")
    g = Graph.somatize(rows >> Largest().named("top").frozen().cached())
    with pytest.raises(Unsettled):
        g.forward({"at": 0, "take": 4}, store=store)
    assert rows.calls == 0
    assert not any((store.root / "answers").iterdir())


def test_without_a_store_the_graph_simply_runs() -> None:
    """With no store nothing is kept, so nothing is refused."""
    g = Graph.somatize(Rows().named("rows") >> Largest().named("top").cached())
    assert g.forward({"at": 0, "take": 4}) == 3.0


class Stateful(Node):
    """Holds state that must be settled before it can be keyed."""

    holds_state = True

    def forward(self, x: Any, ctx: Any) -> Any:
        return x


def test_frozen_state_nobody_settled_is_refused(store: Any) -> None:
    """A frozen node holding state with no digest is refused, saying to freeze or settle."""
    g = Graph.somatize(Stateful().named("weights").frozen() >> Largest().frozen().cached())
    with pytest.raises(NotSettled, match=r"`weights` is declared frozen.*somatize.torch.freeze"):
        g.forward([1, 2], store=store)
    g.memory.freeze("weights", "blake3:" + "2" * 64)
    assert g.forward([1, 2], store=store) == 2.0


def test_a_long_chain_of_cached_nodes_is_checked_in_one_walk(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph of many cached nodes, each reading the one before, is checked and planned
    with a look at each node's predecessors a few times, not once per cached node below
    it: a chain of a thousand cached nodes took seconds before its first forward ran."""
    length = 300
    chain: Any = Rows().named("rows").frozen()
    for i in range(length):
        chain = chain >> Scale(1.0 + i).named(f"scale{i}").frozen().cached()
    g = Graph.somatize(chain >> Largest().named("top").frozen().cached())
    looks = 0
    predecessors = Graph.predecessors

    def counted(self: Graph, name: str) -> tuple[str, ...]:
        nonlocal looks
        looks += 1
        return predecessors(self, name)

    monkeypatch.setattr(Graph, "predecessors", counted)
    assert g.forward({"at": 0, "take": 2}, store=store) > 0
    assert looks < 20 * length, looks  # one walk per cached node looked 90,000 times


def test_of_many_cached_nodes_the_first_with_an_offender_names_its_nearest() -> None:
    """With many cached nodes, the refusal names the first cached node (in the graph's
    order) that reads an unfrozen one, and the unfrozen node nearest to it."""
    chain: Any = Rows().named("rows").frozen()
    for i in range(5):
        chain = chain >> Scale(1.0 + i).named(f"kept{i}").frozen().cached()
    chain = chain >> Scale(9.0).named("moving") >> Scale(10.0).named("mid").frozen()
    g = Graph.somatize(chain >> Largest().named("top").frozen().cached())
    with pytest.raises(Unsettled, match="`moving`, which it reads, is not frozen") as refused:
        cacheable(g, g.memory)
    assert refused.value.moving == "moving"
