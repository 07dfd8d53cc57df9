"""Keys: what goes into them, what does not, and the pinned format."""

from __future__ import annotations

import blake3
import pytest

from somatize import Graph, Opaque, canonical
from somatize import keys as keying
from somatize.plan import compile
from tests.nodes import Largest, Rows, Scale


def _keys(graph: Graph, x: object, store: object) -> dict[str, str]:
    return compile(graph, x, store, graph.outputs).keys  # type: ignore[arg-type]


def _chain(by: float = 2.0, salt: str | None = None) -> Graph:
    return Graph.somatize(
        Rows().named("rows").frozen()
        >> Scale(by).named("scale").frozen()
        >> Largest().named("largest").frozen().cached(salt)
    )


def test_golden_key(store: object) -> None:
    """The keys of a known input and of a known node on it are pinned: they change only
    on purpose, with KEY_VERSION bumped."""
    assert keying.KEY_VERSION == 1
    assert keying.root_key({"at": 0, "take": 64}) == (
        "blake3:fde2817e76e3a89b2dad86b6f0ff1465241779eb5f41924a67729ac04fed1ab1"
    )
    assert _keys(_chain(), {"at": 0, "take": 64}, store)["largest"] == (
        "blake3:b563cbb2943c61944bf367a87d9a0eec7a942b2b23e1c975e87db41286dc6a12"
    )


def test_node_key_matches_its_definition() -> None:
    """The hand-written node key equals H(prefix + canonical list of input keys)."""
    prefix = keying.node_prefix("m:C", "blake3:" + "1" * 64, None, "s")
    inputs = ["blake3:" + "a" * 64, "blake3:" + "b" * 64]
    expected = "blake3:" + blake3.blake3(prefix + canonical.encode(inputs)).hexdigest()
    assert keying.node_key(prefix, inputs) == expected


def test_name_is_not_in_the_key(store: object) -> None:
    """One computation under two names has one key."""
    a = Graph.somatize(Rows().named("a").frozen() >> Largest().named("b").frozen().cached())
    b = Graph.somatize(Rows().named("x").frozen() >> Largest().named("y").frozen().cached())
    assert _keys(a, {"at": 0, "take": 3}, store)["b"] == _keys(b, {"at": 0, "take": 3}, store)["y"]


@pytest.mark.parametrize(
    "change",
    [
        lambda: (_chain(by=3.0), {"at": 0, "take": 64}),
        lambda: (_chain(salt="v2"), {"at": 0, "take": 64}),
        lambda: (_chain(), {"at": 64, "take": 64}),
        lambda: (_chain(), {"at": 0, "take": 64.0}),
    ],
    ids=["declaration", "salt", "input", "input-type"],
)
def test_what_changes_the_key(change, store: object) -> None:  # type: ignore[no-untyped-def]
    """Declaration, salt and input each change the key of everything below them."""
    base = _keys(_chain(), {"at": 0, "take": 64}, store)["largest"]
    graph, x = change()
    assert _keys(graph, x, store)["largest"] != base


def test_state_changes_the_key(store: object) -> None:
    """A settled state is part of the key."""
    one, two = _chain(), _chain()
    two.memory.freeze("rows", "blake3:" + "7" * 64)
    x = {"at": 0, "take": 64}
    assert _keys(one, x, store)["largest"] != _keys(two, x, store)["largest"]


def test_fingerprint_is_not_in_the_key(store: object) -> None:
    """The code fingerprint is metadata: changing it keeps the key."""
    one, two = _chain(), _chain()
    two.memory.written_as("largest", "sha256:something-else")
    x = {"at": 0, "take": 64}
    assert _keys(one, x, store)["largest"] == _keys(two, x, store)["largest"]


def test_opaque_is_keyed_by_content() -> None:
    """Opaque inputs are keyed by their codec's digest of their content."""
    same = keying.root_key(Opaque(b"x" * 1000))
    assert same == keying.root_key(Opaque(b"x" * 1000))
    assert same != keying.root_key(Opaque(b"y" * 1000))
    assert same != keying.root_key(b"x" * 1000)


def test_large_bytes_weighed_with_every_core() -> None:
    """A large bytes input is keyed the same as by a single-threaded pass of its encoding."""
    data = bytes(range(256)) * 8192
    prefix = keying._ROOT
    expected = "blake3:" + blake3.blake3(prefix + canonical.encode(data)).hexdigest()
    assert keying.root_key(data) == expected


def test_key_after_a_head_is_the_node_key() -> None:
    """The precomputed-head path gives exactly the node key, for one input or several."""
    prefix = keying.node_prefix("m:C", "blake3:" + "1" * 64, "blake3:" + "2" * 64, None)
    for inputs in (["blake3:" + "a" * 64], ["blake3:" + "a" * 64, "blake3:" + "b" * 64]):
        head = keying.node_head(prefix, len(inputs))
        assert keying.key_after(head, inputs) == keying.node_key(prefix, inputs)


def test_an_input_seen_again_gets_the_same_keys_until_the_graph_changes(store: object) -> None:
    """Keys remembered for an input are the ones computed afresh; a state settled on the
    same graph afterwards gives that input new keys; and only so many inputs are kept."""
    from somatize.plan import _KNOWN_INPUTS, static_of

    graph, x = _chain(), {"at": 0, "take": 64}
    first = _keys(graph, x, store)
    assert _keys(graph, x, store) == first == _keys(_chain(), x, store)

    graph.memory.freeze("rows", "blake3:" + "7" * 64)
    changed = _keys(graph, x, store)
    fresh = _chain()
    fresh.memory.freeze("rows", "blake3:" + "7" * 64)
    assert changed["largest"] != first["largest"]
    assert changed == _keys(fresh, x, store)

    for at in range(_KNOWN_INPUTS + 10):
        _keys(graph, {"at": at, "take": 1}, store)
    assert len(static_of(graph).known) == _KNOWN_INPUTS
