"""The canonical encoding: equal values give equal bytes, different values different ones."""

from __future__ import annotations

import array
import math
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from somatize import canonical
from somatize.canonical import NotCanonical

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary()
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(values)
def test_roundtrip(value: object) -> None:
    """Decoding the encoding gives back an equal value of the same type."""
    back = canonical.decode(canonical.encode(value))
    assert back == value
    assert type(back) is type(value)


@given(values)
def test_equal_values_equal_bytes(value: object) -> None:
    """Encoding is a function of the value: a decoded copy encodes to the same bytes."""
    assert canonical.encode(canonical.decode(canonical.encode(value))) == canonical.encode(value)


@given(values, values)
def test_different_values_different_bytes(a: object, b: object) -> None:
    """Values of different types or content never share an encoding."""
    if canonical.encode(a) == canonical.encode(b):
        assert type(a) is type(b) and a == b


@given(st.dictionaries(st.text(max_size=5), st.integers(), min_size=2, max_size=8))
def test_dict_order_irrelevant(entries: dict[str, int]) -> None:
    """A dict filled in another order encodes identically."""
    backwards = dict(reversed(list(entries.items())))
    assert canonical.encode(entries) == canonical.encode(backwards)


def test_numbers_of_different_types_are_distinct() -> None:
    """1, 1.0 and True are three values; so are 0.0 and -0.0, and a list and a tuple."""
    encoded = {canonical.encode(v) for v in (1, 1.0, True)}
    assert len(encoded) == 3
    assert canonical.encode(0.0) != canonical.encode(-0.0)
    assert canonical.encode([1, 2]) != canonical.encode((1, 2))
    assert canonical.encode(b"a") != canonical.encode("a")


def test_golden_bytes() -> None:
    """The bytes of a known value are pinned, so the format changes only on purpose."""
    assert canonical.VERSION == 1
    encoded = canonical.encode({"take": 64, "at": -1, "x": [None, True, 1.5, "é", b"\x00"]})
    assert encoded.hex() == (
        "64"
        "0000000000000003"
        "73"
        "0000000000000002"
        "6174"
        "69"
        "0000000000000001"
        "ff"
        "73"
        "0000000000000004"
        "74616b65"
        "69"
        "0000000000000001"
        "40"
        "73"
        "0000000000000001"
        "78"
        "6c"
        "0000000000000005"
        "4e"
        "54"
        "66"
        "3ff8000000000000"
        "73"
        "0000000000000002"
        "c3a9"
        "62"
        "0000000000000001"
        "00"
    )


def test_a_dict_with_keys_that_are_not_str_is_refused_saying_what_to_pass() -> None:
    """A dict keyed by ints is refused with what to pass instead: its pairs, which keep each
    key's type, since str keys would be another input a node computes otherwise from."""
    with pytest.raises(NotCanonical, match=r"list of \(key, value\) pairs"):
        canonical.encode({"a": {1: "x"}})


def test_nan_is_encoded_by_its_bits() -> None:
    """NaN has a canonical form (its IEEE bits), so it can be keyed."""
    assert canonical.encode(math.nan) == canonical.encode(math.nan)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({1: "a"}, "key 1 of type `int`"),
        (object(), "builtins.object"),
        ({"a": [1, {2, 3}]}, "value['a'][1]"),
        (1 + 2j, "builtins.complex"),
    ],
)
def test_refusals_name_the_offender(value: object, fragment: str) -> None:
    """A value with no canonical form is refused with a message that says where and why."""
    with pytest.raises(NotCanonical) as refused:
        canonical.encode(value)
    assert fragment in str(refused.value)
    assert isinstance(refused.value, TypeError)


def _nested(depth: int) -> list[object]:
    outer: list[object] = []
    inner = outer
    for _ in range(depth):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    return outer


def _contains_itself() -> dict[str, object]:
    loop: list[object] = [1]
    loop.append({"again": (loop,)})
    return {"a": loop}


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (memoryview(b"abcdef")[::2], "memoryview that is not contiguous"),
        (_nested(3000), "nested too deep"),
        (_contains_itself(), "contains itself"),
    ],
    ids=["strided-memoryview", "deep", "cycle"],
)
def test_values_that_cannot_be_written_whole_are_refused(value: object, fragment: str) -> None:
    """A strided memoryview, a value nested past the recursion limit and a value that
    contains itself are refused as NotCanonical, saying which, not with a bare error."""
    with pytest.raises(NotCanonical, match=fragment):
        canonical.encode(value, "input")
    assert not canonical.is_canonical(value)


@pytest.mark.parametrize(
    "view",
    [
        memoryview(array.array("i", [1, 2])),
        memoryview(array.array("f", [1.0])),
        memoryview(b"abcd").cast("B", [2, 2]),
        memoryview(b"\xff").cast("b"),
        memoryview(b"ab").cast("c"),
    ],
    ids=["int32", "float32", "two-dimensional", "signed-bytes", "chars"],
)
def test_a_memoryview_of_other_than_bytes_in_one_dimension_is_refused(view: memoryview) -> None:
    """A memoryview of typed items, of signed bytes or characters, or in several dimensions
    has another length or other items than its bytes, which a node reads of it: it is
    refused, saying to pass the bytes or the items, not keyed as its bytes. Its bytes, or
    a view of them cast to bytes, are keyed as bytes."""
    assert len(view) != len(bytes(view)) or list(view) != list(bytes(view))
    with pytest.raises(NotCanonical, match=rf"input\[0\] is a memoryview of format "
                       rf"'{view.format}' and shape \({view.shape[0]},.* Pass `bytes\(view\)`"
                       r" or `view.cast\('B'\)`"):  # fmt: skip
        canonical.encode([view], "input")
    assert not canonical.is_canonical(view)
    flat = view.cast("B")
    assert canonical.encode(flat) == canonical.encode(bytes(view))
    assert canonical.encode(memoryview(bytearray(b"ab"))) == canonical.encode(b"ab")


@pytest.mark.parametrize(
    "number",
    [np.int64(0), np.float32(0.5), np.bool_(True), np.array(5), np.array(2.5)],
    ids=["int64", "float32", "bool_", "0-d int array", "0-d float array"],
)
def test_a_numpy_number_is_refused_saying_to_pass_the_python_number(number: object) -> None:
    """A numpy scalar or a numpy array of no dimensions, given where a canonical value is
    needed (a graph's input), is refused saying to pass the Python number it holds — not
    to wrap it in ``Opaque``, which no codec writes for it."""
    with pytest.raises(NotCanonical, match=r"input\['at'\] is a `numpy\.\w+`.* pass the Python "
                       r"number, `int\(x\)`, `float\(x\)` or `x.item\(\)`$"):  # fmt: skip
        canonical.parts_of({"at": number}, "input", weighs=True)
    with pytest.raises(NotCanonical, match=r"Opaque"):
        canonical.parts_of({"at": np.arange(2)}, "input", weighs=True)


def test_a_torch_tensor_of_no_dimensions_is_refused_saying_to_pass_the_python_number() -> None:
    """A torch tensor of no dimensions is one number: refused saying to pass it as
    ``x.item()``; one of more dimensions is to be wrapped in ``Opaque``."""
    torch = pytest.importorskip("torch")
    with pytest.raises(NotCanonical, match=r"`torch\.Tensor`.* `x.item\(\)`$"):
        canonical.parts_of({"at": torch.tensor(0)}, "input", weighs=True)
    with pytest.raises(NotCanonical, match=r"`torch\.Tensor`.*Opaque"):
        canonical.parts_of({"at": torch.arange(2)}, "input", weighs=True)


def test_enums_and_subclasses_are_not_silently_accepted() -> None:
    """A subclass of a canonical type is refused rather than guessed at."""

    class Count(int):
        pass

    with pytest.raises(NotCanonical, match="Count"):
        canonical.encode(Count(3))


def test_only_values_that_cannot_change_are_immutable() -> None:
    """None, numbers, str, bytes and tuples of them are immutable; anything that can be
    changed in place, or holds something that can, is not."""
    assert canonical.is_immutable((None, True, 1, 2.5, "s", b"b", (1, ("x",))))
    for value in [bytearray(b"b"), [1], {"a": 1}, (1, [2]), memoryview(b"b"), (bytearray(),)]:
        assert not canonical.is_immutable(value), value


@pytest.mark.parametrize("data", [b"", b"Z", b"i\x00\x00\x00\x00\x00\x00\x00\x05\x01", b"NN"])
def test_decode_refuses_broken_bytes(data: bytes) -> None:
    """Bytes that are not one whole canonical value are refused."""
    with pytest.raises(ValueError):
        canonical.decode(data)


def test_a_value_nested_deeper_than_this_process_reads_is_a_value_error() -> None:
    """Bytes written by a process allowed to nest deeper are refused as bytes that cannot
    be read here (a damaged answer, computed again), not a RecursionError."""
    deep: list[object] = []
    inner = deep
    for _ in range(3000):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)
    try:
        data = canonical.encode(deep)
    finally:
        sys.setrecursionlimit(limit)
    with pytest.raises(ValueError, match="nested deeper than this process can read"):
        canonical.decode(data)


def _sized(tag: bytes, payload: bytes) -> bytes:
    return tag + len(payload).to_bytes(8, "big") + payload


def _counted(tag: bytes, count: int, *items: bytes) -> bytes:
    return tag + count.to_bytes(8, "big") + b"".join(items)


@pytest.mark.parametrize(
    "data",
    [
        _sized(b"i", b""),  # 0, of no bytes: written as one
        _sized(b"i", b"\x00\x05"),  # 5, a leading zero byte
        _sized(b"i", b"\x00\x00"),  # 0, two bytes
        _sized(b"i", b"\xff\xfb"),  # -5, a redundant sign byte
        _sized(b"i", b"\x00\x00\x80"),  # 128, one leading zero byte past the sign's
        _counted(b"d", 2, _sized(b"s", b"a"), b"T", _sized(b"s", b"a"), b"F"),  # a key twice
        _counted(b"l", 1, _counted(b"d", 2, _sized(b"s", b""), b"N", _sized(b"s", b""), b"N")),
    ],
)
def test_decode_refuses_bytes_no_writer_makes(data: bytes) -> None:
    """A value has one canonical form, and decode reads only that one: bytes no writer makes
    (an int of no bytes, or with a byte more than it needs; a dict naming a key twice,
    whose last value would win) are refused as damaged, not read as a value whose bytes
    are others."""
    with pytest.raises(ValueError, match="not canonical"):
        canonical.decode(data)


@given(values)
def test_the_exact_encoding_is_the_one_decode_reads(value: object) -> None:
    """Bytes written exact (an answer: its dicts in their order) decode to a value whose
    exact encoding is those bytes again."""
    data = b"".join(canonical.parts_of(value, exact=True))
    assert b"".join(canonical.parts_of(canonical.decode(data), exact=True)) == data


@pytest.mark.parametrize("kind", [bytes, bytearray, str])
def test_a_large_value_is_decoded_from_its_buffer_not_a_copy_of_it(kind: type) -> None:
    """A store hands a recalled answer's bytes over as a view of the memory it read them
    into: a large value (a bytes answer of 2 GiB) is decoded straight from it, so a recall
    holds the value read and the value made, not a third copy of it besides."""
    size = 8 << 20
    value = kind(b"x" * size) if kind is not str else "x" * size
    read = memoryview(bytearray(b"".join(canonical.parts_of(value, exact=True))))
    tracemalloc.start()
    try:
        back = canonical.decode(read)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert back == value and type(back) is kind
    assert peak < 1.5 * size


@pytest.mark.parametrize("value", [0, 5, -5, 127, 128, -128, -129, 255, 256, 2**64, -(2**64)])
def test_ints_decode_from_their_encoding(value: int) -> None:
    """Every int, at the edges of its byte counts too, still decodes from what is written."""
    assert canonical.decode(canonical.encode(value)) == value
