"""Keys: what goes into them, what does not, and the pinned format."""

from __future__ import annotations

import enum
import os
import subprocess
import sys

import blake3
import pytest

from somatize import CodecError, Graph, Opaque, canonical
from somatize import keys as keying
from somatize.plan import compile
from tests.nodes import Add, Echo, Largest, Rows, Scale, Square


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
    mapped = Graph.somatize(Square().named("square").frozen().mapped().cached())
    assert compile(mapped, [2], store, mapped.outputs).items["square"] == [  # type: ignore[arg-type]
        "blake3:9c10fceffd079d30c980ef334d17908898fe3be1e44decb82e8d8ad658202e7f"
    ]


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


def test_an_opaque_value_no_codec_writes_is_refused_saying_what_to_wrap() -> None:
    """Wrapping a value no codec writes (a numpy array) is refused saying it cannot be
    weighed and what can be wrapped instead, not what a node should return."""
    numpy = pytest.importorskip("numpy")
    with pytest.raises(
        CodecError, match=r"cannot be weighed .*`torch\.from_numpy\(array\)`"
    ) as refused:
        Opaque(numpy.ones(3))
    assert "Return" not in str(refused.value)


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


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"at": 0, "take": 64},
        {"take": 64, "at": 0},
        {"é": -(1 << 70), "a": "x" * 100, "b": 1.5, "c": -0.0, "d": float("nan")},
        {"a": True},
        {"a": None},
        {"a": [1, 2]},
        {"a": {"b": 1}},
        {"a": b"x"},
        {"a": Opaque(b"x" * 10)},
    ],
)
def test_a_dict_input_is_keyed_as_its_encoding(value: dict[str, object]) -> None:
    """A dict input keyed on the short path of a coordinate (str keys; int, str and float
    values) is keyed exactly as the general encoding writes it, and any other dict falls
    to that encoding."""
    parts = canonical.parts_of(value, "the input", weighs=True)
    expected = "blake3:" + blake3.blake3(keying._ROOT + b"".join(parts)).hexdigest()
    assert keying.root_key(value) == expected


def test_a_coordinates_key_tells_its_values_types_apart() -> None:
    """1, 1.0 and True, and 0.0 and -0.0, are other inputs on the short path too."""
    keys = {keying.root_key({"a": v}) for v in (1, 1.0, True, 0.0, -0.0, "1", 0)}
    assert len(keys) == 7


class _Str(str):
    pass


class _Number(enum.IntEnum):
    ONE = 1


def _encoded_key(value: object) -> str:
    parts = canonical.parts_of(value, "the input", weighs=True)
    return "blake3:" + blake3.blake3(keying._ROOT + b"".join(parts)).hexdigest()


def test_a_coordinate_seen_again_is_keyed_by_what_it_holds_now() -> None:
    """A coordinate's key, remembered once seen, is found only for entries of the same
    names, values and types: a dict changed in place is keyed as it is now, and a value
    equal to one seen but of another type (True, 1.0, an IntEnum, a str subclass) is
    keyed, or refused, as the general encoding says."""
    seen = {"at": 1, "take": "x"}
    first = keying.root_key(seen)
    assert keying.root_key(seen) == first == _encoded_key(seen)
    assert keying.root_key({"take": "x", "at": 1}) == first
    seen["at"] = 2
    assert keying.root_key(seen) == _encoded_key(seen) != first
    seen["at"] = 1
    assert keying.root_key(seen) == first
    for other in ({"at": True, "take": "x"}, {"at": 1.0, "take": "x"}):
        assert keying.root_key(other) == _encoded_key(other) != first
    for refused in (
        {"at": _Number.ONE, "take": "x"},
        {"at": 1, "take": _Str("x")},
        {_Str("at"): 1, "take": "x"},
    ):
        with pytest.raises(canonical.NotCanonical):
            keying.root_key(refused)
    for at in range(keying._SEEN_MOST + 10):
        keying.root_key({"at": at})
    assert len(keying._SEEN) == keying._SEEN_MOST


def test_a_dict_with_keys_not_str_is_still_refused() -> None:
    """A dict with a key that is no str is refused, naming it, as before."""
    with pytest.raises(canonical.NotCanonical, match="has a key 1"):
        keying.root_key({1: 2})
    with pytest.raises(canonical.NotCanonical, match="has a key 1"):
        keying.root_key({"a": 1, 1: 2})


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


def test_mapped_is_in_the_key(store: object) -> None:
    """Item v of a mapped node and the same node, unmapped, handed v whole are keyed apart,
    and so is whatever reads them; an unmapped node keeps its key."""
    item = [3, 1, 2]
    mapped = Graph.somatize(Largest().named("top").frozen().mapped().cached())
    plain = Graph.somatize(Largest().named("top").frozen().cached())
    plan = compile(mapped, [item], store, mapped.outputs)  # type: ignore[arg-type]
    assert plan.items["top"][0] != _keys(plain, item, store)["top"]
    above = Graph.somatize(Echo().frozen().mapped() >> Largest().frozen().cached())
    below = Graph.somatize(Echo().frozen() >> Largest().frozen().cached())
    assert _keys(above, item, store)["largest"] != _keys(below, item, store)["largest"]


def test_a_predecessor_read_twice_is_keyed_twice(store: object) -> None:
    """A node fed the same (interned) predecessor twice keys with both, in order: it is
    another question than the node fed it once."""
    rows = Rows().named("rows").frozen()
    twice = Graph.somatize(
        (rows >> Scale(2.0).frozen(), rows >> Scale(2.0).frozen()) >> Add().frozen().cached()
    )
    once = Graph.somatize(rows >> Scale(2.0).frozen() >> Add().frozen().cached())
    x = {"at": 0, "take": 3}
    keys = _keys(twice, x, store)
    assert twice.predecessors("add") == ("scale", "scale")
    assert keys["add"] != _keys(once, x, store)["add"]
    prefix = compile(twice, x, store, twice.outputs).static.prefix["add"]  # type: ignore[arg-type]
    assert keys["add"] == keying.node_key(prefix, [keys["scale"], keys["scale"]])


_TYPED_IN = """
import sys
from somatize import Node
from somatize.catalog import fingerprint_of

class Total(Node):
    def forward(self, xs, ctx):
        kept = [x for x in xs if x not in {"a", "b", "c"}]
        return sum(x * x for x in kept) + OFFSET

print(fingerprint_of(Total))
"""


def _fingerprint_typed_in(offset: int, hash_seed: int) -> str:
    """The fingerprint of a class typed into ``python -c`` (its source cannot be found),
    worked out in a process of its own."""
    code = _TYPED_IN.replace("OFFSET", str(offset))
    environment = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_fingerprint_from_compiled_code_is_the_same_in_every_process() -> None:
    """A class whose source cannot be found (with nested code and a set of constants) has
    one fingerprint in every process, and another once its code changes."""
    first = _fingerprint_typed_in(0, hash_seed=1)
    assert first.startswith("sha256:")
    assert _fingerprint_typed_in(0, hash_seed=2) == first
    assert _fingerprint_typed_in(1, hash_seed=1) != first
