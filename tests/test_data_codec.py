"""The `arrow` codec: Arrow IPC in and out, zero-copy on read, digested by content."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy
import pyarrow
import pyarrow.compute
import pyarrow.parquet
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import somatize.data
from somatize import CODECS, CodecError, Graph, Node, Opaque, Store
from somatize.data import ArrowCodec, Frame, Table, to_arrow
from tests.arrow_types import PickledObjects


def _table() -> pyarrow.Table:
    return pyarrow.table(
        {"sms": ["ok later", "win cash", None, "bus"], "label": [0, 1, 0, 0]},
        metadata={"source": "test"},
    )


def _join(pieces: Any) -> bytes:
    return b"".join(bytes(piece) for piece in pieces)


def test_importing_somatize_data_registers_arrow() -> None:
    """After `import somatize.data`, frames, tables and batches are written by `arrow`."""
    assert somatize.data.ArrowCodec is ArrowCodec
    assert "arrow" in CODECS
    table = _table()
    for value in (Frame(table), table, table.to_batches()[0]):
        assert CODECS.for_value(value).name == "arrow"


@pytest.mark.parametrize("kind", ["frame", "table", "batch"])
def test_round_trip_keeps_the_kind_and_the_metadata(kind: str) -> None:
    """What goes in comes back: a frame a frame, a batch a batch, the schema's metadata intact."""
    table = _table()
    value: Any = {"frame": Frame(table), "table": table, "batch": table.to_batches()[0]}[kind]
    codec = CODECS.named("arrow")
    back = codec.decode(memoryview(_join(codec.encode(value))))
    assert type(back) is type(value)
    assert back == value if kind == "frame" else back.equals(value)
    arrow = back.to_arrow() if kind == "frame" else back
    assert arrow.schema.metadata == {b"source": b"test"}


@pytest.mark.parametrize("kind", ["frame", "table", "batch"])
def test_metadata_under_the_codecs_own_key_is_kept(kind: str) -> None:
    """A schema whose metadata holds ``somatize.kind`` (the key the codec writes what kind of
    value it holds under; a table read from a blob by another Arrow reader holds it) comes
    back with it, and digests apart from the same rows without it, whatever the value."""
    codec = ArrowCodec()
    made = _MADE[kind]
    digests = set()
    for metadata in (
        None,
        {b"somatize.kind": b"table"},
        {b"somatize.kind": b"frame"},
        {b"somatize.kind": b"table", b"somatize.kind.": b"table"},
        {b"somatize.kinds": b"x", b"somatize.kind.somatize.kind": b"y"},
    ):
        value = made(pyarrow.array([1, 2]))
        if metadata is not None:
            table = value.to_arrow() if kind == "frame" else value
            table = table.replace_schema_metadata(metadata)
            value = Frame(table) if kind == "frame" else table
        back = codec.decode(memoryview(_join(codec.encode(value))))
        arrow = back.to_arrow() if kind == "frame" else back
        assert type(back) is type(value) and arrow.schema.metadata == metadata
        digest, held = codec.held(value)
        held_arrow = held.to_arrow() if kind == "frame" else held
        assert held_arrow.schema.metadata == metadata
        digests.add(digest)
    assert len(digests) == 5


def test_metadata_under_the_codecs_own_key_written_as_it_was_reads_as_it_was() -> None:
    """A key starting as ``somatize.kind.`` in bytes written without the mark that keys were
    written after it (as they were before such keys were kept) is read as it is."""
    table = pyarrow.table({"n": [1]}, metadata={"somatize.kind.x": "1", "somatize.kind": "table"})
    sink = pyarrow.BufferOutputStream()
    with pyarrow.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    back = ArrowCodec().decode(memoryview(sink.getvalue().to_pybytes()))
    assert back.schema.metadata == {b"somatize.kind.x": b"1"}


def test_the_bytes_are_plain_arrow_ipc() -> None:
    """Any Arrow reader opens what the codec writes."""
    data = _join(ArrowCodec().encode(_table()))
    read = pyarrow.ipc.open_stream(pyarrow.py_buffer(data)).read_all()
    assert read.column("label").to_pylist() == [0, 1, 0, 0]


def test_decoding_is_zero_copy() -> None:
    """Every buffer of the decoded table points into the bytes it was decoded from."""
    table = pyarrow.table({"n": list(range(10_000)), "s": [f"row {i}" for i in range(10_000)]})
    data = _join(ArrowCodec().encode(Frame(table)))
    view = memoryview(data)
    start = pyarrow.py_buffer(view).address
    end = start + len(data)
    back = ArrowCodec().decode(view).to_arrow()
    buffers = [
        buffer
        for column in back.columns
        for chunk in column.chunks
        for buffer in chunk.buffers()
        if buffer is not None and buffer.size > 0
    ]
    assert buffers
    for buffer in buffers:
        assert start <= buffer.address and buffer.address + buffer.size <= end


def test_the_digest_is_of_content_not_of_chunking() -> None:
    """Equal rows in one chunk or several digest alike; one changed value digests otherwise."""
    codec = ArrowCodec()
    whole = pyarrow.table({"n": list(range(100))})
    pieces = pyarrow.concat_tables([whole.slice(0, 30), whole.slice(30, 70)])
    assert pieces.column("n").num_chunks == 2
    assert codec.digest(whole) == codec.digest(pieces)
    assert codec.digest(whole) != codec.digest(pyarrow.table({"n": [*range(99), 100]}))
    assert codec.digest(Frame(whole)) != codec.digest(whole)  # another kind of value
    assert codec.digest(whole).startswith("blake3:") and len(codec.digest(whole)) == 71


_MADE: dict[str, Any] = {
    "table": lambda column: pyarrow.table({"n": column}),
    "frame": lambda column: Frame(pyarrow.table({"n": column})),
    "batch": lambda column: pyarrow.RecordBatch.from_arrays([column], names=["n"]),
}
"""Each kind of value the codec takes, made of one column."""

BARE_AND_SLICED = {
    "no nulls": (pyarrow.array(range(10)), pyarrow.array([*range(10), None]).slice(0, 10)),
    "bits past the end": (pyarrow.array([1, None, 3]), pyarrow.array([1, None, 3, 4]).slice(0, 3)),
    "a child with no nulls": (
        pyarrow.array([{"a": 1}, {"a": 2}]),
        pyarrow.StructArray.from_arrays([pyarrow.array([1, 2, None]).slice(0, 2)], names=["a"]),
    ),
    "a child that is the first rows of a short one": (
        pyarrow.array([{"a": 1}, {"a": 2}]),
        pyarrow.StructArray.from_arrays([pyarrow.array([1, 2, 3, 4]).slice(0, 2)], names=["a"]),
    ),
    "list items with no nulls": (
        pyarrow.array([[1], [2]]),
        pyarrow.ListArray.from_arrays(pyarrow.array([0, 1, 2]), pyarrow.array([1, 2, None])[:2]),
    ),
}


@pytest.mark.parametrize("kind", ["table", "frame", "batch"])
@pytest.mark.parametrize("case", list(BARE_AND_SLICED))
def test_the_digest_ignores_validity_bits_about_no_row(kind: str, case: str) -> None:
    """A column sliced from one with nulls elsewhere keeps their validity bitmap; equal
    rows digest alike whether or not theirs carries one, and whatever it holds past them."""
    bare, sliced = BARE_AND_SLICED[case]
    assert sliced.buffers()[0] is not None or sliced.type.num_fields
    made = _MADE[kind]
    codec = ArrowCodec()
    assert made(bare).equals(made(sliced)) if kind != "frame" else made(bare) == made(sliced)
    assert codec.digest(made(bare)) == codec.digest(made(sliced))
    assert codec.digest(made(bare)) != codec.digest(
        made(pyarrow.array([None] * len(bare), bare.type))
    )


def _filled_under_nulls(column: pyarrow.Array) -> pyarrow.Array:
    """``column`` (of one fixed-width number per row) with 0xAB bytes in the slots under its
    nulls, as a kernel may leave what memory held there."""
    width = column.type.bit_width // 8
    data = bytearray(column.buffers()[1].to_pybytes()[: len(column) * width])
    for at, valid in enumerate(column.is_valid().to_pylist()):
        if not valid:
            data[at * width : (at + 1) * width] = b"\xab" * width
    validity = column.buffers()[0]
    return pyarrow.Array.from_buffers(column.type, len(column), [validity, pyarrow.py_buffer(data)])


LAID_OUT = {
    "numbers with other bytes under their nulls": (
        pyarrow.array([1, None, 3, None]),
        _filled_under_nulls(pyarrow.array([1, None, 3, None])),
    ),
    "the first rows of a longer column with nulls": (
        pyarrow.array([None, *range(1, 8)]),
        pyarrow.array([None, *range(1, 16)]).slice(0, 8),
    ),
    "the first rows of a short column": (
        pyarrow.array([1, 2]),
        pyarrow.array([1, 2, 3, 4]).slice(0, 2),
    ),
    "the first strings of a short column": (
        pyarrow.array(["a", "b"]),
        pyarrow.array(["a", "b", "c", "d"]).slice(0, 2),
    ),
    "strings sliced from further in": (
        pyarrow.array(["b", "c"]),
        pyarrow.array(["a", "b", "c", "d"]).slice(1, 2),
    ),
    "booleans with data bits past the end": (
        pyarrow.array([True] * 3),
        pyarrow.array([True] * 16).slice(0, 3),
    ),
    "views in several data buffers": (
        pyarrow.array(["a" * 20, "b" * 20], pyarrow.string_view()),
        pyarrow.concat_arrays([pyarrow.array([x * 20], pyarrow.string_view()) for x in "ab"]),
    ),
    "views that are all null, sliced": (
        pyarrow.array([None] * 8, pyarrow.string_view()),
        pyarrow.array([None] * 24, pyarrow.string_view()).slice(8, 8),
    ),
}


@pytest.mark.parametrize("kind", ["table", "frame", "batch"])
@pytest.mark.parametrize("case", list(LAID_OUT))
def test_the_digest_ignores_how_the_values_are_laid_out(kind: str, case: str) -> None:
    """Equal rows digest alike whether they are a slice of a longer column, have bits
    set past their end, or keep their strings in one data buffer or several."""
    fresh, laid_out = LAID_OUT[case]
    made = _MADE[kind]
    codec = ArrowCodec()
    assert made(fresh).equals(made(laid_out)) if kind != "frame" else made(fresh) == made(laid_out)
    assert codec.digest(made(fresh)) == codec.digest(made(laid_out))
    last = {pyarrow.bool_(): False, pyarrow.int64(): -1}.get(fresh.type, "z")
    other = pyarrow.array([*fresh.to_pylist()[:-1], last], fresh.type)
    assert codec.digest(made(fresh)) != codec.digest(made(other))


@pytest.mark.parametrize(
    "kind", [pyarrow.float16(), pyarrow.float64(), pyarrow.timestamp("ms"), pyarrow.date32()]
)
def test_the_digest_ignores_what_lies_under_nulls(kind: pyarrow.DataType) -> None:
    """Equal rows of numbers digest alike whatever bytes lie under their nulls, on their own
    or as the values of a run-end-encoded column; a null and a zero digest apart."""
    bits = pyarrow.int16() if kind == pyarrow.float16() else pyarrow.int64()
    bits = pyarrow.int32() if kind == pyarrow.date32() else bits
    fresh = pyarrow.array([1, None, 2, None], bits).view(kind)
    codec = ArrowCodec()
    filled = _filled_under_nulls(fresh)
    assert filled.equals(fresh)
    assert codec.digest(_MADE["table"](filled)) == codec.digest(_MADE["table"](fresh))
    encode = pyarrow.compute.run_end_encode
    runs = [encode(fresh), encode(filled)]
    assert len({codec.digest(_MADE["batch"](one)) for one in runs}) == 1
    zero = pyarrow.array([1, 0, 2, None], bits).view(kind)
    assert codec.digest(_MADE["table"](zero)) != codec.digest(_MADE["table"](fresh))


def _strings_over(kind: pyarrow.DataType, words: list[str], valid: list[bool]) -> pyarrow.Array:
    """A column of ``kind`` whose every slot, null or not, spans the bytes of its word, as
    a kernel may leave a null's slot spanning what was there before."""
    data = "".join(words).encode()
    ends = [0]
    for word in words:
        ends.append(ends[-1] + len(word.encode()))
    layout = "q" if kind in (pyarrow.large_string(), pyarrow.large_binary()) else "i"
    offsets = struct.pack(f"<{len(ends)}{layout}", *ends)
    bits = sum(1 << at for at, one in enumerate(valid) if one).to_bytes(1, "little")
    return pyarrow.Array.from_buffers(
        kind,
        len(words),
        [pyarrow.py_buffer(bits), pyarrow.py_buffer(offsets), pyarrow.py_buffer(data)],
    )


_NO_MASK = pyarrow.array([False, True])
"""The second of two rows null."""
_CODES = pyarrow.array([0, 1], pyarrow.int8())
"""The first of two rows of a union's first child, the second of its second."""
_WORDS = pyarrow.array(["a", "b", "c"])
_LONG_WORDS = pyarrow.array(["x", "a word longer than twelve", "y"], pyarrow.string_view())
_PAIRS = pyarrow.struct([("i", pyarrow.int64()), ("s", pyarrow.string())])
_MAP = pyarrow.map_(pyarrow.string(), pyarrow.int64())


def _a_list_over_a_null(items: Any) -> tuple[pyarrow.Array, pyarrow.Array, pyarrow.Array]:
    """Lists of two rows of one item each, made by ``items`` (which makes a column of items
    from two values, the first under the null): the first row null spanning nothing, the
    same with the null spanning the first item, and the first row not null."""
    first, last = "a word longer than twelve", "z"
    mask = pyarrow.array([True, False])
    ends = pyarrow.array([0, 1, 2], pyarrow.int32())
    return (
        pyarrow.ListArray.from_arrays(
            pyarrow.array([0, 0, 1], pyarrow.int32()), items([last]), mask=mask
        ),
        pyarrow.ListArray.from_arrays(ends, items([first, last]), mask=mask),
        pyarrow.ListArray.from_arrays(ends, items([first, last])),
    )


def _views(words: list[str]) -> pyarrow.Array:
    return pyarrow.array(words, pyarrow.string_view())


def _runs_of(words: list[str]) -> pyarrow.Array:
    return pyarrow.compute.run_end_encode(pyarrow.array(words))


def _rows_of(count: int) -> pyarrow.Array:
    return pyarrow.array(range(count), pyarrow.int32())


_NULL_FIRST = pyarrow.array([True, False])

_DEEPER = {
    "run-end-encoded values of structs": lambda words: pyarrow.StructArray.from_arrays(
        [_runs_of(words)], names=["r"]
    ),
    "run-end-encoded values of lists": lambda words: pyarrow.ListArray.from_arrays(
        pyarrow.array(range(len(words) + 1), pyarrow.int32()), _runs_of(words)
    ),
    "views in a sparse union": lambda words: pyarrow.UnionArray.from_sparse(
        pyarrow.array([0] * len(words), pyarrow.int8()), [_views(words)]
    ),
    "views in a dense union": lambda words: pyarrow.UnionArray.from_dense(
        pyarrow.array([0] * len(words), pyarrow.int8()), _rows_of(len(words)), [_views(words)]
    ),
    "a dictionary of views": lambda words: pyarrow.DictionaryArray.from_arrays(
        pyarrow.array([1 if word == "z" else 0 for word in words], pyarrow.int32()),
        _views(["a word longer than twelve", "z"]),
    ),
    "views in a list view": lambda words: pyarrow.ListViewArray.from_arrays(
        _rows_of(len(words)), pyarrow.array([1] * len(words), pyarrow.int32()), _views(words)
    ),
}
"""Makers of items (from their values) that hold, below their own level, what Arrow takes
no rows of: run-end-encoded columns and views."""

UNDER_NULLS = {
    **{
        f"{kind} over the bytes of the null's word": (
            pyarrow.array(["x", None], kind),
            _strings_over(kind, ["x", "junk"], [True, False]),
            pyarrow.array(["x", "junk"], kind),
        )
        for kind in (
            pyarrow.string(),
            pyarrow.binary(),
            pyarrow.large_string(),
            pyarrow.large_binary(),
        )
    },
    "strings chosen by if_else": (
        pyarrow.array(["x", None]),
        pyarrow.compute.if_else(
            pyarrow.array([True, False]), pyarrow.array(["x", "yyy"]), pyarrow.scalar(None)
        ),
        pyarrow.array(["x", "yyy"]),
    ),
    "views over the bytes of the null's word": (
        pyarrow.array(["x", None], pyarrow.string_view()),
        _strings_over(pyarrow.string(), ["x", "a word longer than twelve"], [True, False]).cast(
            pyarrow.string_view()
        ),
        pyarrow.array(["x", "y"], pyarrow.string_view()),
    ),
    "a list spanning items under its null": (
        pyarrow.array([[1], None]),
        pyarrow.ListArray.from_arrays(
            pyarrow.array([0, 1, 3], pyarrow.int32()), pyarrow.array([1, 2, 3]), mask=_NO_MASK
        ),
        pyarrow.array([[1], [2, 3]]),
    ),
    **{
        f"a list of {name} items spanning items under its null": (
            pyarrow.ListArray.from_arrays(
                pyarrow.array([0, 1, 1], pyarrow.int32()), items.slice(0, 1), mask=_NO_MASK
            ),
            pyarrow.ListArray.from_arrays(
                pyarrow.array([0, 1, 3], pyarrow.int32()), items, mask=_NO_MASK
            ),
            pyarrow.ListArray.from_arrays(pyarrow.array([0, 1, 3], pyarrow.int32()), items),
        )
        for name, items in (
            ("run-end-encoded", pyarrow.compute.run_end_encode(pyarrow.array([1, 2, 2]))),
            ("view", pyarrow.array(["x", "a word longer than twelve", "y"], pyarrow.string_view())),
        )
    },
    "a list of structs of views spanning items under its null": (
        pyarrow.ListArray.from_arrays(
            pyarrow.array([0, 1, 1], pyarrow.int32()),
            pyarrow.StructArray.from_arrays([_LONG_WORDS.slice(0, 1)], names=["v"]),
            mask=_NO_MASK,
        ),
        pyarrow.ListArray.from_arrays(
            pyarrow.array([0, 1, 3], pyarrow.int32()),
            pyarrow.StructArray.from_arrays([_LONG_WORDS], names=["v"]),
            mask=_NO_MASK,
        ),
        pyarrow.ListArray.from_arrays(
            pyarrow.array([0, 1, 3], pyarrow.int32()),
            pyarrow.StructArray.from_arrays([_LONG_WORDS], names=["v"]),
        ),
    ),
    "fixed-size lists of views in fixed-size lists with items under a null": (
        pyarrow.FixedSizeListArray.from_arrays(
            pyarrow.FixedSizeListArray.from_arrays(
                pyarrow.array(["x", None], pyarrow.string_view()), 1
            ),
            1,
            mask=_NO_MASK,
        ),
        pyarrow.FixedSizeListArray.from_arrays(
            pyarrow.FixedSizeListArray.from_arrays(_LONG_WORDS.slice(0, 2), 1), 1, mask=_NO_MASK
        ),
        pyarrow.FixedSizeListArray.from_arrays(
            pyarrow.FixedSizeListArray.from_arrays(_LONG_WORDS.slice(0, 2), 1), 1
        ),
    ),
    "a large list spanning items under its null": (
        pyarrow.array([[1], None], pyarrow.large_list(pyarrow.int64())),
        pyarrow.LargeListArray.from_arrays(
            pyarrow.array([0, 1, 3], pyarrow.int64()), pyarrow.array([1, 2, 3]), mask=_NO_MASK
        ),
        pyarrow.array([[1], [2, 3]], pyarrow.large_list(pyarrow.int64())),
    ),
    "a struct with values under its null": (
        pyarrow.array([{"i": 1, "s": "a"}, None], _PAIRS),
        pyarrow.StructArray.from_arrays(
            [pyarrow.array([1, 2]), pyarrow.array(["a", "b"])], names=["i", "s"], mask=_NO_MASK
        ),
        pyarrow.array([{"i": 1, "s": "a"}, {"i": 2, "s": "b"}], _PAIRS),
    ),
    "a list of structs with values under a null": (
        pyarrow.array([[{"i": 1, "s": "a"}], [None]], pyarrow.list_(_PAIRS)),
        pyarrow.ListArray.from_arrays(
            pyarrow.array([0, 1, 2], pyarrow.int32()),
            pyarrow.StructArray.from_arrays(
                [pyarrow.array([1, 2]), pyarrow.array(["a", "b"])], names=["i", "s"], mask=_NO_MASK
            ),
        ),
        pyarrow.array([[{"i": 1, "s": "a"}], [{"i": 2, "s": "b"}]], pyarrow.list_(_PAIRS)),
    ),
    "a fixed-size list with items under its null": (
        pyarrow.array([["a", "b"], None], pyarrow.list_(pyarrow.string(), 2)),
        pyarrow.FixedSizeListArray.from_arrays(
            pyarrow.array(["a", "b", "c", "d"]), 2, mask=_NO_MASK
        ),
        pyarrow.array([["a", "b"], ["c", "d"]], pyarrow.list_(pyarrow.string(), 2)),
    ),
    "a map spanning entries under its null": (
        pyarrow.array([[("k", 1)], None], _MAP),
        pyarrow.MapArray.from_arrays(
            pyarrow.array([0, 1, 2], pyarrow.int32()),
            pyarrow.array(["k", "q"]),
            pyarrow.array([1, 2]),
            mask=_NO_MASK,
        ),
        pyarrow.array([[("k", 1)], [("q", 2)]], _MAP),
    ),
    "fixed-size binary": (
        pyarrow.array([b"ab", None], pyarrow.binary(2)),
        pyarrow.Array.from_buffers(
            pyarrow.binary(2), 2, [pyarrow.py_buffer(b"\x01"), pyarrow.py_buffer(b"abcd")]
        ),
        pyarrow.array([b"ab", b"cd"], pyarrow.binary(2)),
    ),
    "a sparse union with values in rows another child holds": (
        pyarrow.UnionArray.from_sparse(
            pyarrow.array([0, 1], pyarrow.int8()),
            [pyarrow.array([1, 2]), pyarrow.array(["a", "b"])],
        ),
        pyarrow.UnionArray.from_sparse(
            pyarrow.array([0, 1], pyarrow.int8()),
            [pyarrow.array([1, 99]), pyarrow.array(["zzz", "b"])],
        ),
        pyarrow.UnionArray.from_sparse(
            pyarrow.array([0, 1], pyarrow.int8()),
            [pyarrow.array([1, 2]), pyarrow.array(["a", "c"])],
        ),
    ),
    "a dense union with values no row holds": (
        pyarrow.UnionArray.from_dense(
            _CODES, pyarrow.array([0, 0], pyarrow.int32()), [pyarrow.array([1]), _WORDS[2:]]
        ),
        pyarrow.UnionArray.from_dense(
            _CODES, pyarrow.array([1, 2], pyarrow.int32()), [pyarrow.array([9, 1]), _WORDS]
        ),
        pyarrow.UnionArray.from_dense(
            _CODES, pyarrow.array([0, 0], pyarrow.int32()), [pyarrow.array([1]), _WORDS[1:2]]
        ),
    ),
    "a struct of a dense union with values under its null": (
        pyarrow.StructArray.from_arrays(
            [
                pyarrow.UnionArray.from_dense(
                    _CODES, pyarrow.array([0, 0], pyarrow.int32()), [pyarrow.array([1]), _WORDS]
                )
            ],
            names=["u"],
            mask=_NO_MASK,
        ),
        pyarrow.StructArray.from_arrays(
            [
                pyarrow.UnionArray.from_dense(
                    _CODES, pyarrow.array([0, 1], pyarrow.int32()), [pyarrow.array([1]), _WORDS]
                )
            ],
            names=["u"],
            mask=_NO_MASK,
        ),
        pyarrow.StructArray.from_arrays(
            [
                pyarrow.UnionArray.from_dense(
                    _CODES, pyarrow.array([0, 1], pyarrow.int32()), [pyarrow.array([1]), _WORDS]
                )
            ],
            names=["u"],
        ),
    ),
    **{
        f"{kind} overlapping, out of order, past items no row holds": (
            pyarrow.array([[2], [1, 2]], kind),
            type(pyarrow.array([], kind)).from_arrays(
                [2, 1], [1, 2], pyarrow.array([9, 1, 2]), type=kind
            ),
            pyarrow.array([[2], [1, 3]], kind),
        )
        for kind in (
            pyarrow.list_view(pyarrow.int64()),
            pyarrow.large_list_view(pyarrow.int64()),
        )
    },
    **{
        f"a list of {name} spanning items under its null": _a_list_over_a_null(items)
        for name, items in _DEEPER.items()
    },
    "a struct of runs with values under its null": (
        pyarrow.StructArray.from_arrays([_runs_of([None, "z"])], names=["r"], mask=_NULL_FIRST),
        pyarrow.StructArray.from_arrays([_runs_of(["a", "z"])], names=["r"], mask=_NULL_FIRST),
        pyarrow.StructArray.from_arrays([_runs_of(["a", "z"])], names=["r"]),
    ),
    "a struct of a run over its null and its row": (
        pyarrow.StructArray.from_arrays([_runs_of([None, "z"])], names=["r"], mask=_NULL_FIRST),
        pyarrow.StructArray.from_arrays([_runs_of(["z", "z"])], names=["r"], mask=_NULL_FIRST),
        pyarrow.StructArray.from_arrays([_runs_of(["z", "z"])], names=["r"]),
    ),
    "intervals": (
        pyarrow.Array.from_buffers(
            pyarrow.month_day_nano_interval(),
            2,
            [pyarrow.py_buffer(b"\x01"), pyarrow.py_buffer(bytes(32))],
        ),
        pyarrow.Array.from_buffers(
            pyarrow.month_day_nano_interval(),
            2,
            [pyarrow.py_buffer(b"\x01"), pyarrow.py_buffer(bytes(16) + bytes(range(16)))],
        ),
        pyarrow.array([(0, 0, 0), (1, 2, 3)], pyarrow.month_day_nano_interval()),
    ),
    "booleans": (
        pyarrow.array([True, None]),
        pyarrow.Array.from_buffers(
            pyarrow.bool_(), 2, [pyarrow.py_buffer(b"\x01"), pyarrow.py_buffer(b"\x03")]
        ),
        pyarrow.array([True, True]),
    ),
    "dictionary indices": (
        pyarrow.DictionaryArray.from_arrays(
            pyarrow.array([0, None], pyarrow.int32()), pyarrow.array(["a", "b"])
        ),
        pyarrow.DictionaryArray.from_arrays(
            _filled_under_nulls(pyarrow.array([0, None], pyarrow.int32())),
            pyarrow.array(["a", "b"]),
        ),
        pyarrow.DictionaryArray.from_arrays(
            pyarrow.array([0, 1], pyarrow.int32()), pyarrow.array(["a", "b"])
        ),
    ),
    "a tensor with items under its null": (
        pyarrow.ExtensionArray.from_storage(
            pyarrow.fixed_shape_tensor(pyarrow.int64(), [2]),
            pyarrow.array([[1, 2], None], pyarrow.list_(pyarrow.int64(), 2)),
        ),
        pyarrow.ExtensionArray.from_storage(
            pyarrow.fixed_shape_tensor(pyarrow.int64(), [2]),
            pyarrow.FixedSizeListArray.from_arrays(pyarrow.array([1, 2, 3, 4]), 2, mask=_NO_MASK),
        ),
        pyarrow.ExtensionArray.from_storage(
            pyarrow.fixed_shape_tensor(pyarrow.int64(), [2]),
            pyarrow.array([[1, 2], [3, 4]], pyarrow.list_(pyarrow.int64(), 2)),
        ),
    ),
}


@pytest.mark.parametrize("kind", ["table", "batch"])
@pytest.mark.parametrize("case", list(UNDER_NULLS))
def test_the_digest_ignores_what_a_null_slot_spans(kind: str, case: str) -> None:
    """Equal rows digest alike whatever a null's slot spans or holds (the bytes of a string,
    a list's items, a struct's values, at any depth), also sliced from further in and in
    chunks; rows that differ where the other is null digest apart, and the value held is
    the value given."""
    fresh, laid_out, other = UNDER_NULLS[case]
    made = _MADE[kind]
    codec = ArrowCodec()
    assert made(fresh).equals(made(laid_out))
    assert codec.digest(made(laid_out)) == codec.digest(made(fresh))
    longer = pyarrow.concat_arrays([other, laid_out])
    assert codec.digest(made(longer.slice(2))) == codec.digest(made(fresh))
    chunked = pyarrow.table({"n": pyarrow.chunked_array([laid_out.slice(0, 1), laid_out[1:]])})
    if kind == "table":
        assert codec.digest(chunked) == codec.digest(made(fresh))
    assert not made(other).equals(made(fresh))
    assert codec.digest(made(other)) != codec.digest(made(fresh))
    digest, held = codec.held(made(laid_out))
    assert digest == codec.digest(made(fresh)) and held.equals(made(fresh))


def _spanning_under_nulls(kind: pyarrow.DataType) -> pyarrow.Array:
    """A long column of ``kind`` (strings or binary, or lists or maps of them) whose every
    third row is null over what was there before, sliced from its fourth row."""
    rows = 1000
    keep = pyarrow.array([at % 3 != 1 for at in range(rows)])
    words = pyarrow.array([f"word {at}" * (at % 4) for at in range(rows)])
    if pyarrow.types.is_map(kind):
        ends = pyarrow.array([at * 2 for at in range(rows + 1)], pyarrow.int32())
        column = pyarrow.MapArray.from_arrays(
            ends, pyarrow.concat_arrays([words, words]), pyarrow.array(range(2 * rows))
        )
    elif pyarrow.types.is_list(kind) or pyarrow.types.is_large_list(kind):
        width = pyarrow.int64() if pyarrow.types.is_large_list(kind) else pyarrow.int32()
        ends = pyarrow.array([at * 3 for at in range(rows + 1)], width)
        column = type(pyarrow.array([], kind)).from_arrays(
            ends, pyarrow.concat_arrays([words] * 3).cast(kind.value_type)
        )
    else:
        column = words.cast(kind)
    return pyarrow.compute.if_else(keep, column, pyarrow.scalar(None, kind)).slice(3)


_LONG = {
    str(kind): kind
    for kind in (
        pyarrow.string(),
        pyarrow.large_binary(),
        pyarrow.list_(pyarrow.string()),
        pyarrow.large_list(pyarrow.large_string()),
        _MAP,
    )
}
"""The kinds of long columns whose nulls span something, by name."""


@pytest.mark.parametrize("case", [*UNDER_NULLS, *_LONG])
def test_the_digest_is_the_same_with_or_without_numpy(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What lies under nulls is cleared with numpy where it is installed, and with Arrow's
    kernels alone where it is not: the same rows laid out the same, so the same digest, in
    a process of either kind."""
    column = UNDER_NULLS[case][1] if case in UNDER_NULLS else _spanning_under_nulls(_LONG[case])
    codec = ArrowCodec()
    table = pyarrow.table({"n": column})
    with_numpy = codec.digest(table)
    monkeypatch.setattr(somatize.data._canonical, "numpy", None)
    assert codec.digest(table) == with_numpy
    digest, held = codec.held(table)
    assert digest == with_numpy and held.equals(table)


def _unions_in_a_struct(mode: str, mask: list[bool] | None, word: str = "b") -> pyarrow.Array:
    """A struct of a union (of ``mode``) and numbers, with nulls where ``mask`` says, the
    union's second row ``word``."""
    codes = pyarrow.array([0, 1, 0], pyarrow.int8())
    if mode == "sparse":
        children = [pyarrow.array([1, 2, 3]), pyarrow.array(["a", word, "c"])]
        union = pyarrow.UnionArray.from_sparse(codes, children)
    else:
        offsets = pyarrow.array([0, 0, 1], pyarrow.int32())
        union = pyarrow.UnionArray.from_dense(
            codes, offsets, [pyarrow.array([1, 3]), pyarrow.array([word])]
        )
    return pyarrow.StructArray.from_arrays(
        [union, pyarrow.array([7, 8, 9])],
        names=["u", "n"],
        mask=None if mask is None else pyarrow.array(mask),
    )


@pytest.mark.parametrize("mode", ["sparse", "dense"])
def test_a_struct_of_a_union_with_nulls_is_digested(mode: str) -> None:
    """A struct with nulls whose child is a union (which has no validity bits to take the
    struct's nulls) digests and is held, alike whatever the union holds under the struct's
    nulls and sliced from a longer one, and apart from the same struct without nulls."""
    codec = ArrowCodec()
    column = _unions_in_a_struct(mode, [False, True, False])
    table = pyarrow.table({"s": column})
    digest, held = codec.held(table)
    assert held.equals(table) and digest == codec.digest(table)
    longer = pyarrow.concat_arrays([_unions_in_a_struct(mode, None), column])
    assert codec.digest(pyarrow.table({"s": longer.slice(3)})) == digest
    other = _unions_in_a_struct(mode, [False, True, False], word="something else")
    assert codec.digest(pyarrow.table({"s": other})) == digest
    assert codec.digest(pyarrow.table({"s": _unions_in_a_struct(mode, None)})) != digest


_RUNS = pyarrow.compute.run_end_encode(pyarrow.array([1, 1, 2]))
_VIEWS = pyarrow.array(["a", "b", "a word longer than twelve"], pyarrow.string_view())
_NULL_SECOND = pyarrow.array([False, True, False])

_VIEW_RUNS = pyarrow.RunEndEncodedArray.from_arrays(
    pyarrow.array([1, 2, 3], pyarrow.int16()), _VIEWS
)
"""Runs of views, which Arrow neither decodes nor encodes."""

UNTAKEN = {
    **{
        f"{name} items of lists, a null spanning one": pyarrow.ListArray.from_arrays(
            pyarrow.array([0, 1, 2, 3], pyarrow.int32()), items, mask=_NULL_SECOND
        )
        for name, items in (("run-end-encoded", _RUNS), ("view", _VIEWS))
    },
    **{
        f"{name} items of fixed-size lists with nulls": pyarrow.FixedSizeListArray.from_arrays(
            items, 1, mask=_NULL_SECOND
        )
        for name, items in (("run-end-encoded", _RUNS), ("view", _VIEWS))
    },
    "run-end-encoded and view children of a sparse union": pyarrow.UnionArray.from_sparse(
        pyarrow.array([0, 1, 0], pyarrow.int8()), [_RUNS, _VIEWS]
    ),
    "run-end-encoded values of a map with nulls": pyarrow.MapArray.from_arrays(
        pyarrow.array([0, 1, 2, 3], pyarrow.int32()),
        pyarrow.array(["k", "k", "k"]),
        _RUNS,
        mask=_NULL_SECOND,
    ),
    "runs of views in a fixed-size list with nulls": pyarrow.FixedSizeListArray.from_arrays(
        _VIEW_RUNS, 1, mask=_NULL_SECOND
    ),
    "runs of views in a sparse union": pyarrow.UnionArray.from_sparse(
        pyarrow.array([0, 1, 0], pyarrow.int8()), [_VIEW_RUNS, _RUNS]
    ),
    "runs of views in a list with nulls": pyarrow.ListArray.from_arrays(
        pyarrow.array([0, 1, 2, 3], pyarrow.int32()), _VIEW_RUNS, mask=_NULL_SECOND
    ),
    "runs of views": pyarrow.RunEndEncodedArray.from_arrays(
        pyarrow.array([1, 2, 3], pyarrow.int32()),
        pyarrow.array(["a", "a", "b"], pyarrow.string_view()),
    ),
    "a run of a list view of views over a struct's null": pyarrow.StructArray.from_arrays(
        [
            pyarrow.RunEndEncodedArray.from_arrays(
                pyarrow.array([3], pyarrow.int32()),
                pyarrow.ListViewArray.from_arrays(
                    pyarrow.array([0], pyarrow.int32()), pyarrow.array([3], pyarrow.int32()), _VIEWS
                ),
            )
        ],
        names=["r"],
        mask=_NULL_SECOND,
    ),
    "runs of a dense union sharing a value over a struct's null": pyarrow.StructArray.from_arrays(
        [
            pyarrow.RunEndEncodedArray.from_arrays(
                pyarrow.array([1, 3], pyarrow.int32()),
                pyarrow.UnionArray.from_dense(
                    pyarrow.array([0, 0], pyarrow.int8()),
                    pyarrow.array([0, 0], pyarrow.int32()),
                    [_VIEWS],
                ),
            )
        ],
        names=["r"],
        mask=_NULL_SECOND,
    ),
}


@pytest.mark.parametrize("numpy", ["with numpy", "without numpy"])
@pytest.mark.parametrize("case", list(UNTAKEN))
def test_columns_arrow_takes_no_rows_of_are_digested(
    case: str, numpy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A column holding what Arrow takes no rows of (run-end-encoded columns, views, runs
    of views Arrow neither decodes nor encodes) is digested and held, as its rows, and
    apart from its rows one shorter, in a process with numpy or without."""
    if numpy == "without numpy":
        monkeypatch.setattr(somatize.data._canonical, "numpy", None)
    column = UNTAKEN[case]
    codec = ArrowCodec()
    table = pyarrow.table({"c": column})
    digest, held = codec.held(table)
    assert held.equals(table) and digest == codec.digest(table)
    assert codec.digest(pyarrow.table({"c": column.slice(1)})) != digest


def _sharing_views(case: str) -> pyarrow.Array:
    """A list view whose rows share items: together more items than its 32-bit offsets
    count, or lists of more items than their own 32-bit offsets count."""
    many = 2**30
    if case == "items":
        sizes, items = [many, many, 5], pyarrow.nulls(many)
    else:
        items = pyarrow.ListArray.from_arrays(
            pyarrow.array([0, many], pyarrow.int32()), pyarrow.nulls(many)
        )
        sizes = [1, 1, 1]
    return pyarrow.ListViewArray.from_arrays(
        pyarrow.array([0, 0, 0], pyarrow.int32()), pyarrow.array(sizes, pyarrow.int32()), items
    )


@pytest.mark.parametrize("case", ["items", "items of items"])
def test_list_views_sharing_more_items_than_offsets_count_are_held_whole(case: str) -> None:
    """A list view whose rows share items (three views of the same 2**30 items, or of one
    list of them) is digested and held as the rows it holds, and what is held reads back:
    laying its items out one after another would need an offset past 2**31 - 1."""
    column = _sharing_views(case)
    codec = ArrowCodec()
    table = pyarrow.table({"c": column})
    digest, held = codec.held(table)
    held.validate(full=True)
    lengths = pyarrow.compute.list_value_length(held.column("c").chunk(0))
    assert lengths.equals(pyarrow.compute.list_value_length(column))
    assert held.equals(table) and digest == codec.digest(table)
    assert codec.decode(memoryview(_join(codec.encode(held)))).equals(table)


@pytest.mark.parametrize("kind", [pyarrow.list_view, pyarrow.large_list_view])
def test_list_views_sharing_items_are_held_without_a_copy_per_row(kind: Any) -> None:
    """A list view whose rows view the same items (more in all than it holds) is digested and
    held with its items once, not once per row that views them (a million rows over a
    thousand items would be a billion); laid out afresh, its rows digest apart (a miss)."""
    items = pyarrow.array(range(1000))
    rows = 1000
    column = type(pyarrow.array([], kind(pyarrow.int64()))).from_arrays(
        pyarrow.array([0] * rows), pyarrow.array([1000] * rows), items
    )
    codec = ArrowCodec()
    table = pyarrow.table({"c": column})
    digest, held = codec.held(table)
    assert len(held.column("c").chunk(0).values) == 1000
    assert held.equals(table) and digest == codec.digest(table)


@pytest.mark.parametrize("holder", ["struct", "list", "fixed-size list", "struct in a list"])
def test_a_dense_union_sharing_a_value_in_a_struct_or_list_is_held_without_a_copy_per_row(
    holder: str,
) -> None:
    """A dense union whose thousand rows share one list of a thousand items, in a struct or
    a list with nulls (whose rows are taken to clear what lies under them), at any depth, is
    digested and held with that list once, not once per row (a million items)."""
    shared = pyarrow.array([list(range(1000))], pyarrow.list_(pyarrow.int64()))
    rows = 1000
    union = pyarrow.UnionArray.from_dense(
        pyarrow.array([0] * rows, pyarrow.int8()),
        pyarrow.array([0] * rows, pyarrow.int32()),
        [shared],
    )
    nulls = pyarrow.array([row == 0 for row in range(rows)])
    one_null = pyarrow.array([True, False])
    offsets = pyarrow.array([0, 1, rows], pyarrow.int32())
    if holder == "struct":
        column: Any = pyarrow.StructArray.from_arrays([union], names=["u"], mask=nulls)
    elif holder == "list":
        column = pyarrow.ListArray.from_arrays(offsets, union, mask=one_null)
    elif holder == "fixed-size list":
        column = pyarrow.FixedSizeListArray.from_arrays(union, 1, mask=nulls)
    else:
        inner = pyarrow.StructArray.from_arrays([union], names=["u"])
        column = pyarrow.ListArray.from_arrays(offsets, inner, mask=one_null)
    codec = ArrowCodec()
    table = pyarrow.table({"c": column})
    digest, held = codec.held(table)
    union_held = held.column("c").chunk(0)
    while not pyarrow.types.is_union(union_held.type):
        is_struct = pyarrow.types.is_struct(union_held.type)
        union_held = union_held.field(0) if is_struct else union_held.values
    assert len(union_held.field(0).values) <= 1000
    assert held.equals(table) and digest == codec.digest(table)


def test_run_end_encoded_items_of_a_list_with_nulls_are_cleared_by_their_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run-end-encoded items of a list whose nulls span some are picked by their runs,
    never decoded into a value per item (a run of millions is one value), and digest as the
    same rows laid out afresh."""
    many = 10**6
    items = pyarrow.RunEndEncodedArray.from_arrays(
        pyarrow.array([many, 2 * many, 3 * many], pyarrow.int32()), pyarrow.array([1, 2, 2])
    )
    offsets = pyarrow.array([0, many, 2 * many, 3 * many], pyarrow.int32())
    column = pyarrow.ListArray.from_arrays(offsets, items, mask=pyarrow.array([False, True, False]))
    fresh = pyarrow.ListArray.from_arrays(
        pyarrow.array([0, many, many, 2 * many], pyarrow.int32()),
        pyarrow.RunEndEncodedArray.from_arrays(
            pyarrow.array([many, 2 * many], pyarrow.int32()), pyarrow.array([1, 2])
        ),
        mask=pyarrow.array([False, True, False]),
    )
    codec = ArrowCodec()
    expected = codec.digest(pyarrow.table({"c": fresh}))

    def decoded(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("run-end-encoded items decoded")

    monkeypatch.setattr(pyarrow.compute, "run_end_decode", decoded)
    digest, held = codec.held(pyarrow.table({"c": column}))
    assert digest == expected
    assert held.column("c").chunk(0).values.run_ends.to_pylist() == [many, 2 * many]


_ENDS = st.lists(st.integers(0, 60), max_size=40, unique=True).map(sorted)


@given(_ENDS, _ENDS, st.booleans())
@example([], [], False)
@example([], [3, 5], False)
@example([1, 2, 9], [], False)
@example([1, 2, 9], [1, 2, 9], True)
def test_run_ends_are_merged_as_numpy_unions_them(
    first: list[int], second: list[int], same: bool
) -> None:
    """The ends of two columns' runs (each sorted, each end once) are merged into what
    ``numpy.union1d`` makes of them: every end once, sorted, of the same dtype."""
    left = numpy.array(first, dtype=numpy.int64)
    right = left.copy() if same else numpy.array(second, dtype=numpy.int64)
    merged = somatize.data._canonical._merged(left, right)
    expected = numpy.union1d(left, right)
    assert merged.dtype == expected.dtype
    assert merged.tolist() == expected.tolist()


def test_a_dense_union_sharing_a_list_of_more_items_than_offsets_count_is_held_whole() -> None:
    """A dense union whose rows share one value of its child (a list of 2**30 items) is
    digested and held as the rows it holds: a child holding that value once per row would
    need an offset past 2**31 - 1."""
    many = 2**30
    items = pyarrow.ListArray.from_arrays(
        pyarrow.array([0, many], pyarrow.int32()), pyarrow.nulls(many)
    )
    column = pyarrow.UnionArray.from_dense(
        pyarrow.array([0, 0, 0], pyarrow.int8()), pyarrow.array([0, 0, 0], pyarrow.int32()), [items]
    )
    codec = ArrowCodec()
    table = pyarrow.table({"c": column})
    digest, held = codec.held(table)
    held.validate(full=True)
    assert held.equals(table) and digest == codec.digest(table)


@pytest.mark.parametrize("nulls", [0, 1, 3])
def test_a_struct_of_no_fields_keeps_its_length(nulls: int) -> None:
    """A column of structs with no fields (whose length no child tells) is digested and
    held beside another column, with or without nulls, and digests apart by its nulls."""

    def made(nulls: int) -> pyarrow.Array:
        rows = pyarrow.array([{}, {}, {}], pyarrow.struct([]))
        return rows.take(pyarrow.array([None] * nulls + [0] * (3 - nulls), pyarrow.int64()))

    codec = ArrowCodec()
    column = made(nulls)
    for value in (
        pyarrow.table({"c": column, "n": [1, 2, 3]}),
        pyarrow.RecordBatch.from_arrays([column, pyarrow.array([1, 2, 3])], names=["c", "n"]),
    ):
        digest, held = codec.held(value)
        assert held.equals(value) and digest == codec.digest(value)
    assert len({codec.digest(pyarrow.table({"c": made(n)})) for n in (0, 1, 3)}) == 3


@pytest.mark.parametrize("kind", ["table", "frame", "batch"])
def test_the_digest_ignores_where_runs_are_split(kind: str) -> None:
    """A run-end-encoded column digests by its rows: encoded afresh, sliced from a longer
    one, or in chunks that split a run, equal rows digest alike."""
    encode = pyarrow.compute.run_end_encode
    longer = encode(pyarrow.array([1, 1, 1, 1, 2, 2, None, 3, 3, 3]))
    fresh = encode(pyarrow.array([1, 2, 2, None, 3]))
    split = [longer.slice(3, 2), longer.slice(5, 3)]
    codec = ArrowCodec()
    made = _MADE[kind]
    laid_out = [made(longer.slice(3, 5))]
    if kind == "batch":
        laid_out.append(made(pyarrow.concat_arrays(split)))
    else:
        chunked = pyarrow.table({"n": pyarrow.chunked_array(split)})
        laid_out.append(chunked if kind == "table" else Frame(chunked))
    for one in laid_out:
        assert codec.digest(one) == codec.digest(made(fresh))
    assert codec.digest(made(fresh)) != codec.digest(made(encode(pyarrow.array([1, 2, 2, 3, 3]))))
    zeros = [encode(pyarrow.array([0.0, -0.0])), encode(pyarrow.array([0.0, 0.0]))]
    assert len({codec.digest(made(one)) for one in zeros}) == 2  # -0.0 is a value of its own


@pytest.mark.parametrize("kind", [pyarrow.string_view(), pyarrow.binary_view()])
def test_runs_of_views_split_by_chunks_digest_as_one(kind: pyarrow.DataType) -> None:
    """Runs of views (strings or binary) that chunks split digest as the same runs whole,
    and apart from other rows."""
    word = "a word longer than twelve"
    words: list[Any] = [word, "z"] if kind == pyarrow.string_view() else [word.encode(), b"z"]
    runs = pyarrow.RunEndEncodedArray.from_arrays(
        pyarrow.array([2, 3], pyarrow.int32()), pyarrow.array(words, kind)
    )
    codec = ArrowCodec()
    split = pyarrow.table({"r": pyarrow.chunked_array([runs.slice(0, 1), runs.slice(1)])})
    assert codec.digest(split) == codec.digest(pyarrow.table({"r": runs}))
    assert codec.digest(split) != codec.digest(pyarrow.table({"r": runs.slice(1)}))


def _runs_of_entries(entries: pyarrow.Array, indices: list[int]) -> pyarrow.Table:
    """A table of a run-end-encoded column of one run per row, of a dictionary of
    ``entries`` at ``indices``."""
    values = pyarrow.DictionaryArray.from_arrays(pyarrow.array(indices, pyarrow.int32()), entries)
    ends = pyarrow.array(range(1, len(indices) + 1), pyarrow.int32())
    return pyarrow.table({"r": pyarrow.RunEndEncodedArray.from_arrays(ends, values)})


@pytest.mark.parametrize(
    "entries", [pyarrow.array([0.0, -0.0]), pyarrow.array(["a", "a"])], ids=["zeros", "twice"]
)
def test_runs_of_dictionary_entries_are_joined_only_when_they_are_one_entry(
    entries: pyarrow.Array,
) -> None:
    """Runs of a dictionary's entries that compare equal but are other entries (``0.0`` and
    ``-0.0``, a word the dictionary holds twice) stay apart: the value held is the value
    given, and digests apart from the rows of one entry; runs of one entry are joined."""
    codec = ArrowCodec()
    both = _runs_of_entries(entries, [0, 1])
    digest, held = codec.held(both)
    assert held.equals(both) and held.column("r").to_pylist() == both.column("r").to_pylist()
    assert digest != codec.digest(_runs_of_entries(entries, [1, 1]))
    one = _runs_of_entries(entries, [1, 1])
    fresh = pyarrow.table(
        {
            "r": pyarrow.RunEndEncodedArray.from_arrays(
                pyarrow.array([2], pyarrow.int32()),
                pyarrow.DictionaryArray.from_arrays(pyarrow.array([1], pyarrow.int32()), entries),
            )
        }
    )
    assert codec.digest(one) == codec.digest(fresh)


def test_empty_values_round_trip() -> None:
    """A frame of no rows and an empty batch come back as themselves."""
    codec = ArrowCodec()
    empty = _table().slice(0, 0)
    assert codec.decode(memoryview(_join(codec.encode(Frame(empty))))) == Frame(empty)
    batch = pyarrow.RecordBatch.from_pydict({"n": pyarrow.array([], pyarrow.int64())})
    assert codec.decode(memoryview(_join(codec.encode(batch)))).equals(batch)
    assert codec.digest(empty) == codec.digest(empty.combine_chunks())


def test_rows_of_no_columns_keep_their_length() -> None:
    """A frame read with no columns says only how many rows it has: that comes back, and is
    in its digest (three such rows are not an empty table, nor four)."""
    codec = ArrowCodec()
    rows = _table().select([])
    for value in (rows, Frame(rows), rows.to_batches()[0]):
        back = codec.decode(memoryview(_join(codec.encode(value))))
        assert len(back) == 4 and type(back) is type(value)
    assert back.schema.metadata == {b"source": b"test"}
    fewer = _table().slice(1).select([])
    assert len({codec.digest(t) for t in (rows, fewer, rows.slice(0, 0))}) == 3


def test_bytes_that_are_not_its_own_are_refused() -> None:
    """Garbage, or Arrow IPC another writer made, is a CodecError rather than a value."""
    codec = ArrowCodec()
    with pytest.raises(CodecError, match="not the Arrow IPC the `arrow` codec writes"):
        codec.decode(memoryview(b"\x00" * 64))
    sink = pyarrow.BufferOutputStream()
    with pyarrow.ipc.new_stream(sink, _table().schema) as writer:
        writer.write_table(_table())
    with pytest.raises(CodecError, match=r"no `somatize\.kind`"):
        codec.decode(memoryview(sink.getvalue().to_pybytes()))


def test_bytes_cut_short_or_changed_are_a_codec_error() -> None:
    """Bytes cut short anywhere (between two messages included), or a message's metadata
    changed so that Arrow cannot read it, are the codec's error (which a forward takes for
    a damaged answer), never an OSError."""
    codec = ArrowCodec()
    data = _join(codec.encode(_table()))
    for cut in range(len(data)):
        with pytest.raises(CodecError, match="not the Arrow IPC the `arrow` codec writes"):
            codec.decode(memoryview(data[:cut]))
    changed = bytearray(data)
    changed[75] ^= 0x40  # in the schema's flatbuffer
    with pytest.raises(CodecError, match="Invalid flatbuffers message"):
        codec.decode(memoryview(bytes(changed)))


REPO = Path(__file__).resolve().parent.parent


def _in_a_child(call: str, data: bytes = b"") -> str:
    """What ``call`` (of a function of this module) prints in a fresh interpreter fed
    ``data``: a crash there (a segfault, an abort) fails the test instead of ending it."""
    code = f"import tests.test_data_codec as here; here.{call}"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, input=data, capture_output=True, timeout=120
    )
    assert done.returncode == 0, f"the child ended {done.returncode}: {done.stderr[-3000:]!r}"
    return done.stdout.decode()


def _decode_and_read() -> None:
    """Decodes the bytes on stdin and reads every value that comes back; says which."""
    try:
        value = ArrowCodec().decode(memoryview(sys.stdin.buffer.read()))
    except CodecError as why:
        print(f"refused: {why}")
        return
    table = value.to_arrow() if isinstance(value, Frame) else value
    print(f"value: {table.to_pylist()}")


def _replaced(data: bytes, old: bytes, new: bytes) -> bytes:
    """``data`` with the one place that holds ``old`` holding ``new``."""
    at = data.find(old)
    assert at >= 0 and data.find(old, at + 1) < 0
    return data[:at] + new + data[at + len(old) :]


def _broken(case: str) -> bytes:
    """What the codec writes for a small table, with one of its arrays made not to hold
    together (what a bit or two changed in a store may do)."""
    codec = ArrowCodec()
    offsets = struct.Struct("<4i")
    if case.startswith("dictionary"):
        values = pyarrow.array(["a", "b", "c"])
        column = pyarrow.DictionaryArray.from_arrays(pyarrow.array([0, 1, 0, 2], "int32"), values)
        data = _join(codec.encode(pyarrow.table({"d": column})))
        if case == "dictionary index past its dictionary":
            return _replaced(data, offsets.pack(0, 1, 0, 2), offsets.pack(0, 50_000_000, 0, 2))
        return _replaced(data, offsets.pack(0, 1, 2, 3), offsets.pack(-(1 << 31), 1, 2, 3))
    if case == "list offset past its values":
        data = _join(codec.encode(pyarrow.table({"l": [[1, 2], [], [3], [4, 5]]})))
        return _replaced(data, offsets.pack(0, 2, 2, 3), offsets.pack(0, 2, 1 << 30, 3))
    data = _join(codec.encode(pyarrow.table({"s": ["abcdefgh", "ijklmnop", "qrst"]})))
    if case == "string offset past its data":
        return _replaced(data, offsets.pack(0, 8, 16, 20), offsets.pack(0, 1 << 30, 16, 20))
    if case == "string offsets going back":
        return _replaced(data, offsets.pack(0, 8, 16, 20), offsets.pack(0, 12, 8, 20))
    assert case == "string not UTF-8"
    return _replaced(data, b"abcdefgh", b"abc\xffefgh")


@pytest.mark.parametrize(
    "case",
    [
        "string offset past its data",
        "string offsets going back",
        "string not UTF-8",
        "list offset past its values",
        "dictionary index past its dictionary",
        "dictionary offset before its data",
    ],
)
def test_arrays_that_do_not_hold_together_are_refused(case: str) -> None:
    """Arrays whose offsets, indices or strings do not hold together are refused as they
    are decoded: Arrow reads them on trust, past the end of their buffers (a crash, or
    bytes that are no part of the answer) or into an exception at their first use."""
    said = _in_a_child("_decode_and_read()", _broken(case))
    assert said.startswith("refused: these bytes are not the Arrow IPC"), said


def _stream(table: pyarrow.Table, **options: Any) -> bytes:
    """``table`` as an Arrow IPC stream tagged as the codec tags a table, written with
    ``options`` (of ``pyarrow.ipc.IpcWriteOptions``)."""
    table = table.replace_schema_metadata({b"somatize.kind": b"table"})
    sink = pyarrow.BufferOutputStream()
    with pyarrow.ipc.new_stream(
        sink, table.schema, options=pyarrow.ipc.IpcWriteOptions(**options)
    ) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _messages(data: bytes) -> list[bytes]:
    """The messages of the IPC stream ``data``, each as it is framed in a stream."""
    messages = pyarrow.ipc.MessageReader.open_stream(pyarrow.py_buffer(data))
    return [message.serialize().to_pybytes() for message in messages]


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_compressed_buffers_are_refused_before_they_are_inflated(compression: str) -> None:
    """The codec never compresses, and a few kilobytes compressed can claim gigabytes: a
    stream whose batches (or dictionaries) say their buffers are compressed is refused from
    its metadata, before anything is inflated."""
    codec = ArrowCodec()
    zeros = pyarrow.table({"x": pyarrow.nulls(1 << 23, "int64").fill_null(0)})
    data = _stream(zeros, compression=compression)
    if compression == "zstd":
        assert len(data) < 100_000  # 64 MB of rows
    with pytest.raises(CodecError, match="record batch message has compressed buffers"):
        codec.decode(memoryview(data))
    words = pyarrow.table({"d": pyarrow.array(["a", "b", "a"]).dictionary_encode()})
    schema, squeezed, _ = _messages(_stream(words, compression=compression))
    _, dictionary, batch = _messages(_stream(words))
    end = b"\xff\xff\xff\xff\0\0\0\0"
    with pytest.raises(CodecError, match="dictionary message has compressed buffers"):
        codec.decode(memoryview(schema + squeezed + batch + end))
    assert codec.decode(memoryview(schema + dictionary + batch + end)).equals(words)


def test_metadata_of_another_version_is_refused() -> None:
    """The codec writes metadata version 5; in version 4 a message could say elsewhere
    that its buffers are compressed, so a stream in it is refused."""
    data = _stream(_table(), metadata_version=pyarrow.ipc.MetadataVersion.V4)
    with pytest.raises(CodecError, match="in Arrow metadata V4, not V5"):
        ArrowCodec().decode(memoryview(data))


@pytest.mark.parametrize(
    "case", ["two streams", "bytes after the end", "no end", "framed before 0.15", "two schemas"]
)
def test_only_the_stream_the_codec_writes_is_read(case: str) -> None:
    """One schema, dictionaries and batches, the end-of-stream marker and nothing after:
    anything else is refused, though Arrow would read part of it (up to the first end of
    a stream, say)."""
    codec = ArrowCodec()
    data = _join(codec.encode(_table()))
    other = _join(codec.encode(_table().slice(2)))
    messages = _messages(data)
    changed = {
        "two streams": data + other,
        "bytes after the end": data + bytes(8),
        "no end": data[:-8],
        "framed before 0.15": _stream(_table(), use_legacy_format=True),
        "two schemas": messages[0] + b"".join(messages) + data[-8:],
    }[case]
    said = {
        "two streams": f"{len(other)} bytes follow the end of the stream",
        "bytes after the end": "8 bytes follow the end of the stream",
        "no end": f"stops at byte {len(data) - 8} without its end-of-stream marker",
        "framed before 0.15": "the message at byte 0 is framed as before Arrow 0.15",
        "two schemas": f"a schema message at byte {len(messages[0])}, where a dictionary",
    }[case]
    assert codec.decode(memoryview(data)).equals(_table())
    with pytest.raises(CodecError, match=said):
        codec.decode(memoryview(changed))


@pytest.mark.parametrize("where", ["column", "struct field", "dictionary of structs"])
def test_a_name_that_is_not_utf8_is_refused(where: str) -> None:
    """Arrow reads a field's name as bytes, and only its use fails if they are not UTF-8
    (`column_names`, `to_pylist`): such a name, at any depth, is refused as it is decoded."""
    inner = pyarrow.array([{"label": 1}, {"label": 2}])
    column: Any = {
        "column": pyarrow.array([1, 2]),
        "struct field": inner,
        "dictionary of structs": pyarrow.DictionaryArray.from_arrays(
            pyarrow.array([0, 1], "int32"), inner
        ),
    }[where]
    name = "label" if where == "column" else "x"
    codec = ArrowCodec()
    data = _replaced(_join(codec.encode(pyarrow.table({name: column}))), b"label", b"l\xe4bel")
    with pytest.raises(CodecError, match="can't decode byte 0xe4"):
        codec.decode(memoryview(data))


class MakeTable(Node):
    """A table of strings and numbers."""

    def forward(self, x: int, ctx: Any) -> pyarrow.Table:
        return pyarrow.table({"s": ["abcdefgh", "ijklmnop"], "n": [x, x]})


def _damaged(data: bytes, damage: str) -> bytes:
    if damage == "metadata":
        return data[:75] + bytes([data[75] ^ 0x40]) + data[76:]
    if damage == "two streams":
        return data + _join(ArrowCodec().encode(pyarrow.table({"s": ["other"], "n": [2]})))
    if damage == "compressed":
        return _stream(pyarrow.ipc.open_stream(data).read_all(), compression="zstd")
    offsets = struct.Struct("<3i")
    assert damage == "string offset"
    return _replaced(data, offsets.pack(0, 8, 16), offsets.pack(0, 1 << 30, 16))


def _recompute_damaged(root: str, damage: str) -> None:
    """Keeps the answer of a cached node, replaces its bytes by damaged ones, runs the
    graph again; says which facts it told and what it answered."""
    g = Graph.somatize(MakeTable().named("make").frozen().cached())
    facts: list[dict[str, Any]] = []
    g.forward(1, store=Store(root), watching=facts.append)
    key = next(f["key"] for f in facts if f["fact"] == "kept")
    store = Store(root)
    _, data = store.recall(key)
    store.keep(key, _damaged(bytes(data), damage), "arrow")
    facts.clear()
    again = g.forward(1, store=Store(root), watching=facts.append)
    print(json.dumps({"facts": [f["fact"] for f in facts], "answer": again.to_pylist()}))


@pytest.mark.parametrize("damage", ["metadata", "string offset", "compressed", "two streams"])
def test_a_damaged_table_answer_is_computed_again(tmp_path: Path, damage: str) -> None:
    """A kept table whose bytes are replaced by damaged ones is computed again, with a
    `corrupt` fact, and the forward answers the right table."""
    said = json.loads(_in_a_child(f"_recompute_damaged({str(tmp_path)!r}, {damage!r})"))
    assert said["facts"][:2] == ["corrupt", "ran"]
    assert said["answer"] == [{"s": "abcdefgh", "n": 1}, {"s": "ijklmnop", "n": 1}]


class Upper(Node):
    """A frame in, a frame out."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, frame: Frame, ctx: Any) -> Frame:
        self.calls += 1
        column = [s.upper() if s else s for s in frame.column("sms")]
        return Frame(pyarrow.table({"sms": column}))


def test_a_frame_answer_is_kept_and_recalled(store: Store) -> None:
    """A cached node that answers a frame has it kept as Arrow IPC and recalled as a frame."""
    upper = Upper()
    g = Graph.somatize(
        Table(_table()).named("rows").frozen() >> upper.named("upper").frozen().cached()
    )
    somatize.data.settle(g)
    first = g.forward({"at": 0, "take": 2}, store=store)
    facts: list[dict[str, Any]] = []
    again = g.forward({"at": 0, "take": 2}, store=store, watching=facts.append)
    assert upper.calls == 1
    assert [f["fact"] for f in facts] == ["spared", "recalled", "finished"]
    assert isinstance(again, Frame) and again == first
    assert again.column("sms") == ["OK LATER", "WIN CASH"]


def test_an_opaque_table_is_keyed_by_content(store: Store) -> None:
    """A table handed to a graph as Opaque is weighed by the arrow codec: same rows, same key."""
    count = Upper()
    g = Graph.somatize(count.named("upper").frozen().cached())
    g.forward(Opaque(Frame(_table())), store=store)
    g.forward(Opaque(Frame(_table().combine_chunks())), store=store)
    assert count.calls == 1
    g.forward(Opaque(Frame(_table().slice(1))), store=store)
    assert count.calls == 2


class Total(Node):
    """The sum of a frame's `x` column."""

    def forward(self, frame: Frame, ctx: Any) -> int:
        return sum(frame.column("x"))


def test_an_opaque_table_over_memory_refilled_in_place_is_weighed_again(store: Store) -> None:
    """A table made over a numpy array changes when the array is refilled: the same Opaque
    handed again is weighed again, and the new rows get their own answer."""
    numpy = pytest.importorskip("numpy")

    values = numpy.arange(4, dtype=numpy.int64)
    batch = Opaque(Frame(pyarrow.table({"x": values})))
    g = Graph.somatize(Total().named("total").frozen().cached())
    assert g.forward(batch, store=store) == 6
    values[:] = 10
    assert g.forward(batch, store=store) == 40


class _Objects(Node):
    """Answers a frame with a column of an extension type defined in Python."""

    def forward(self, x: Any, ctx: Any) -> Frame:
        kind = PickledObjects()
        storage = pyarrow.array([b"\x80\x04N."], pyarrow.large_binary())
        return Frame(pyarrow.table({"obj": kind.wrap_array(storage)}))


def test_an_answer_with_an_extension_type_defined_in_python_is_refused(store: Store) -> None:
    """Bytes read back with a column of an extension type registered in the process are a
    CodecError (its values would turn into Python by that code), and such an answer is not
    written: keeping it is refused, naming the column, rather than kept to be refused at
    every recall; pyarrow's own extension types are written and decode."""
    kind = PickledObjects()
    storage = pyarrow.array([b"\x80\x04N."], pyarrow.large_binary())
    codec = ArrowCodec()
    pyarrow.register_extension_type(kind)
    try:
        frame = Frame(pyarrow.table({"obj": kind.wrap_array(storage)}))
        data = _join(codec.encode(frame))
        with pytest.raises(CodecError, match=r"`obj`: somatize\.test\.pickled"):
            codec.decode(memoryview(data))
        g = Graph.somatize(_Objects().named("objects").frozen().cached())
        with pytest.raises(CodecError, match=r"the answer of `objects` is a `somatize\.data\."
                           r"frame\.Frame` and no codec writes it \(a column is of an "
                           r"extension type defined in Python \(`obj`: "
                           r"somatize\.test\.pickled\)"):  # fmt: skip
            g.forward(None, store=store)
        assert g.record is not None
        assert [f["fact"] for f in g.record.facts].count("kept") == 0
    finally:
        pyarrow.unregister_extension_type(PickledObjects.name)
    uuids = Frame(pyarrow.table({"id": pyarrow.array([b"0123456789abcdef"], pyarrow.uuid())}))
    assert codec.decode(memoryview(_join(codec.encode(uuids)))) == uuids


def test_a_column_whose_metadata_names_an_extension_type_is_refused(store: Store) -> None:
    """A column of a plain type whose field metadata names an extension type other than
    pyarrow's own is read as that type where the name is registered, by its code: it is
    neither kept nor read back, whether the name is registered here or not."""
    field = pyarrow.field(
        "a", pyarrow.int64(), metadata={b"ARROW:extension:name": b"somatize.test.named"}
    )
    table = pyarrow.table([pyarrow.array([1, 2, 3])], schema=pyarrow.schema([field]))
    with pytest.raises(CodecError, match=r"`a`: somatize\.test\.named \(named in its metadata\)"):
        CODECS.for_value(table)
    with pytest.raises(CodecError, match=r"`a`: somatize\.test\.named"):
        ArrowCodec().decode(memoryview(_join(ArrowCodec().encode(table))))
    own = pyarrow.field("b", pyarrow.int64(), metadata={b"ARROW:extension:name": b"arrow.x"})
    plain = pyarrow.table([pyarrow.array([1])], schema=pyarrow.schema([own]))
    assert CODECS.for_value(plain).name == "arrow"


def test_read_only_keeps_the_rows_and_refuses_writes() -> None:
    """What a source keeps is its rows as they were, over buffers nothing writes through:
    flat columns (sliced, with nulls) as they are, other columns copied once."""
    from decimal import Decimal

    from somatize.data.codec import read_only

    table = pyarrow.table(
        {
            "n": [1, None, 3, 4],
            "s": ["x", None, "zz", "w"],
            "d": pyarrow.array(
                [Decimal("1.5"), None, Decimal(2), Decimal(3)], pyarrow.decimal128(5, 2)
            ),
            "b": [True, False, None, True],
            "l": [[1], [2], [], None],
            "e": pyarrow.array(["a", "b", "a", "c"]).dictionary_encode(),
        },
        metadata={"k": "v"},
    ).slice(1)
    for one in (table, table.select(["n", "s", "d", "b"])):
        held = read_only(one)
        held.validate(full=True)
        assert held.equals(one) and held.schema.equals(one.schema, check_metadata=True)
        for column in held.columns:
            for chunk in column.chunks:
                assert not any(b.is_mutable for b in chunk.buffers() if b is not None)


def _narrow_dictionaries(words: str) -> pyarrow.ChunkedArray:
    """A column of two chunks, each of a dictionary of a hundred words under 8-bit indices:
    together two hundred, more than such indices count."""
    return pyarrow.chunked_array(
        [
            pyarrow.DictionaryArray.from_arrays(
                pyarrow.array(range(100), pyarrow.int8()),
                pyarrow.array([f"{word} {at}" for at in range(100)]),
            )
            for word in words
        ]
    )


def test_dictionaries_that_cannot_be_combined_are_digested_chunk_by_chunk() -> None:
    """A dictionary column whose chunks' dictionaries together need more indices than its
    index type counts (which Arrow refuses to combine) is digested and held as it is, beside
    a column that is combined; the same rows digest alike, other rows apart."""
    codec = ArrowCodec()
    table = pyarrow.table({"d": _narrow_dictionaries("ab"), "n": range(200)})
    again = pyarrow.table(
        {"d": _narrow_dictionaries("ab"), "n": pyarrow.chunked_array([range(50), range(50, 200)])}
    )
    digest, held = codec.held(table)
    assert held.equals(table) and digest == codec.digest(table) == codec.digest(again)
    assert Table(table).version == digest
    assert codec.digest(pyarrow.table({"d": _narrow_dictionaries("ac"), "n": range(200)})) != digest


def _nested_entries(kind: str, words: str) -> pyarrow.ChunkedArray:
    """A column of a chunk per word in ``words``, each of a dictionary of one entry (a list
    of the word, or a struct of it) of its own: Arrow combines no such dictionaries."""
    made = {"lists": lambda word: [word], "structs": lambda word: {"w": word}}[kind]
    return pyarrow.chunked_array(
        [
            pyarrow.DictionaryArray.from_arrays(
                pyarrow.array([0, 0], pyarrow.int32()), pyarrow.array([made(word)])
            )
            for word in words
        ]
    )


@pytest.mark.parametrize("kind", ["lists", "structs"])
def test_dictionaries_of_entries_arrow_does_not_combine_are_digested_chunk_by_chunk(
    kind: str,
) -> None:
    """Chunks of dictionaries of nested entries, which Arrow does not combine, are digested,
    held and sent chunk by chunk as the rows they hold; other rows digest apart."""
    codec = ArrowCodec()
    table = pyarrow.table({"d": _nested_entries(kind, "ab"), "n": range(4)})
    digest, held = codec.held(table)
    assert held.equals(table) and digest == codec.digest(table)
    assert codec.decode(codec.encode(table)[0]).equals(table)
    assert codec.digest(pyarrow.table({"d": _nested_entries(kind, "ac"), "n": range(4)})) != digest


def _entries_of(values: list[float], holder: str) -> pyarrow.Array:
    """A dictionary of ``values`` at indices 0, 1, ..., as it is, in a list of them, or
    stored in an opaque extension type."""
    column = pyarrow.DictionaryArray.from_arrays(
        pyarrow.array(range(len(values)), pyarrow.int32()), pyarrow.array(values)
    )
    if holder == "column":
        return column
    if holder == "opaque":
        return pyarrow.ExtensionArray.from_storage(
            pyarrow.opaque(column.type, "zeros", "somatize.tests"), column
        )
    return pyarrow.ListArray.from_arrays(pyarrow.array([0, len(values)], pyarrow.int32()), column)


@pytest.mark.parametrize("holder", ["column", "list items", "opaque"])
def test_chunks_of_dictionaries_of_zeros_of_either_sign_stay_apart(holder: str) -> None:
    """Chunks of dictionaries of floats (as they are, in lists, or stored in an extension
    type) are combined entry by entry as their bits: a chunk of ``-0.0`` after one of
    ``0.0`` (which Arrow's combining takes for one entry) is held as it was given, digests
    apart from two chunks of ``0.0``, and as the same rows in one chunk."""
    codec = ArrowCodec()

    def chunked(*signs: float) -> pyarrow.Table:
        chunks = [_entries_of([sign], holder) for sign in signs]
        return pyarrow.table({"f": pyarrow.chunked_array(chunks)})

    both = chunked(0.0, -0.0)
    digest, held = codec.held(both)
    assert str(held.column("f").to_pylist()) == str(both.column("f").to_pylist())
    decoded = codec.decode(codec.encode(both)[0])
    assert str(decoded.column("f").to_pylist()) == str(both.column("f").to_pylist())
    assert digest != codec.digest(chunked(0.0, 0.0))
    if holder == "column":
        one = pyarrow.table({"f": _entries_of([0.0, -0.0], holder)})
        assert digest == codec.digest(one)


def _apart_entries(case: str, zero: float) -> pyarrow.ChunkedArray:
    """Two chunks of dictionaries of floats Arrow cannot combine, the first holding
    ``zero``: of other entries under 8-bit indices that together need more, of a null
    entry, or of lists of floats."""
    if case == "more than 8-bit indices count":
        entries = [[zero, *map(float, range(1, 128))], [float(-at) for at in range(1, 129)]]
        indices = pyarrow.array(range(128), pyarrow.int8())
    elif case == "null entries":
        entries, indices = [[None, zero], [-0.0, None]], pyarrow.array([0, 1], pyarrow.int32())
    else:
        entries = [[[zero]], [[-0.0, 1.0]]]
        indices = pyarrow.array([0, 0], pyarrow.int32())
    return pyarrow.chunked_array(
        [pyarrow.DictionaryArray.from_arrays(indices, pyarrow.array(one)) for one in entries]
    )


@pytest.mark.parametrize("case", ["more than 8-bit indices count", "null entries", "lists"])
def test_chunks_of_dictionaries_of_floats_written_apart_keep_their_entries(case: str) -> None:
    """Chunks of dictionaries of floats Arrow cannot combine, whose dictionaries differ by
    Arrow's comparison too (which Arrow IPC writes each of), are held, sent and digested
    chunk by chunk as given: a ``-0.0`` stays apart from ``0.0``."""
    codec = ArrowCodec()
    table = pyarrow.table({"f": _apart_entries(case, -0.0)})
    given = str(table.column("f").to_pylist())
    digest, held = codec.held(table)
    assert str(held.column("f").to_pylist()) == given and digest == codec.digest(table)
    assert str(codec.decode(codec.encode(table)[0]).column("f").to_pylist()) == given
    assert codec.digest(pyarrow.table({"f": _apart_entries(case, 0.0)})) != digest


def test_chunks_of_dictionaries_of_floats_that_cannot_be_combined_are_refused() -> None:
    """Chunks of dictionaries of floats under 8-bit indices that together hold more entries
    than such indices count cannot be combined, and where they differ only by the sign of a
    zero, written apart a reader would take a chunk's ``-0.0`` for the ``0.0`` before it
    (Arrow IPC writes a dictionary again only where Arrow finds it changed): they are
    refused, saying what to do."""
    chunks = [
        pyarrow.DictionaryArray.from_arrays(
            pyarrow.array(range(128), pyarrow.int8()),
            pyarrow.array([zero, *map(float, range(1, 128))]),
        )
        for zero in (0.0, -0.0)
    ]
    table = pyarrow.table({"f": pyarrow.chunked_array(chunks)})
    codec = ArrowCodec()
    for call in (codec.digest, codec.encode, codec.held):
        with pytest.raises(CodecError, match="cast such a column to its values"):
            call(table)


def _sliced_union_of_entries(sign: float) -> pyarrow.Array:
    """A sparse union of structs of a dictionary of floats and runs of views, sliced from
    its third row: what Arrow's view of a type misplaces the children of."""
    rows = 5
    entries = pyarrow.DictionaryArray.from_arrays(
        pyarrow.array([0] * rows, pyarrow.int32()), pyarrow.array([sign * 0.0])
    )
    runs = pyarrow.RunEndEncodedArray.from_arrays(
        pyarrow.array([rows], pyarrow.int16()), pyarrow.array(["a word"], pyarrow.string_view())
    )
    pairs = pyarrow.StructArray.from_arrays([entries, runs], names=["a", "b"])
    return pyarrow.UnionArray.from_sparse(
        pyarrow.array([0] * rows, pyarrow.int8()), [pairs, pyarrow.array(range(rows))]
    ).slice(2)


def test_sliced_unions_of_dictionaries_of_floats_are_digested_in_one_chunk_or_two() -> None:
    """A slice of a union holding dictionaries of floats and runs is digested and held in
    one chunk and in two (combined as the bits of its floats), as the rows it holds."""
    codec = ArrowCodec()
    one = pyarrow.table({"u": _sliced_union_of_entries(-1.0)})
    two = pyarrow.table(
        {
            "u": pyarrow.chunked_array(
                [_sliced_union_of_entries(1.0), _sliced_union_of_entries(-1.0)]
            )
        }
    )
    for table in (one, two):
        digest, held = codec.held(table)
        assert str(held.column("u").to_pylist()) == str(table.column("u").to_pylist())
        assert digest == codec.digest(table)
    assert codec.digest(one) != codec.digest(pyarrow.table({"u": _sliced_union_of_entries(1.0)}))


def _chunks_of_runs_of_entries(holder: str, indices: list[int | None]) -> pyarrow.ChunkedArray:
    """Two chunks sliced from one column (a dense union, or a list) of runs of a dictionary
    of ``0.0`` and ``-0.0`` at ``indices``: runs below a slice, which Arrow's view of a type
    misplaces."""
    entries = pyarrow.DictionaryArray.from_arrays(
        pyarrow.array(indices, pyarrow.int32()), pyarrow.array([0.0, -0.0])
    )
    runs = pyarrow.RunEndEncodedArray.from_arrays(
        pyarrow.array([1, 2, 3], pyarrow.int32()), entries
    )
    if holder == "dense union":
        column: Any = pyarrow.UnionArray.from_dense(
            pyarrow.array([0, 0, 1], pyarrow.int8()),
            pyarrow.array([0, 1, 0], pyarrow.int32()),
            [runs, pyarrow.array([0])],
        )
        return pyarrow.chunked_array([column.slice(1, 1), column.slice(2, 1)])
    column = pyarrow.ListArray.from_arrays(pyarrow.array([0, 1, 3], pyarrow.int32()), runs)
    return pyarrow.chunked_array([column.slice(1, 1), column.slice(0, 1)])


@pytest.mark.parametrize("holder", ["dense union", "list"])
def test_chunks_of_runs_of_dictionaries_of_floats_keep_their_rows(holder: str) -> None:
    """Chunks sliced from a column holding runs of a dictionary of floats are combined as
    the rows they hold: held and sent as given (``-0.0`` where it was, not a null), digested
    as the same rows in one chunk and apart from those with a null there."""
    codec = ArrowCodec()
    table = pyarrow.table({"c": _chunks_of_runs_of_entries(holder, [None, 1, None])})
    given = str(table.column("c").to_pylist())
    digest, held = codec.held(table)
    assert str(held.column("c").to_pylist()) == given
    assert str(codec.decode(codec.encode(table)[0]).column("c").to_pylist()) == given
    assert digest == codec.digest(pyarrow.table({"c": table.column("c").combine_chunks()}))
    other = pyarrow.table({"c": _chunks_of_runs_of_entries(holder, [None, None, None])})
    assert codec.digest(other) != digest


def _through_parquet(table: pyarrow.Table) -> pyarrow.Table:
    """``table`` written to Parquet and read back, as a Parquet reader names its nested
    fields (a list's items `element`, a map's entries after its column)."""
    sink = pyarrow.BufferOutputStream()
    pyarrow.parquet.write_table(table, sink)
    return pyarrow.parquet.read_table(pyarrow.BufferReader(sink.getvalue()))


_STRING_TO_INT = pyarrow.map_(pyarrow.string(), pyarrow.int64())

NAMED_INSIDE = {
    "list": pyarrow.array([[1], None, [2, None]]),
    "large list": pyarrow.array([[1], None, [2, None]], pyarrow.large_list(pyarrow.int64())),
    "map": pyarrow.array([[("a", 1)], None, [("b", 2), ("c", None)]], _STRING_TO_INT),
    "list in a struct": pyarrow.array([{"a": [1]}, None, {"a": [2, 3]}]),
    "map in a list": pyarrow.array([[[("a", 1)]], None, []], pyarrow.list_(_STRING_TO_INT)),
}


@pytest.mark.parametrize("kind", ["table", "frame", "batch"])
@pytest.mark.parametrize("case", list(NAMED_INSIDE))
def test_the_digest_ignores_the_names_of_list_items_and_map_entries(kind: str, case: str) -> None:
    """No row read tells a list's `item` from its `element`, nor a map's `entries` from the
    name a Parquet reader gives them (its column's), and neither do Arrow's type equality,
    `equals` (but when asked to compare metadata) nor (for a map) Arrow IPC: the same rows
    read from Parquet digest as those made in memory. The names of a map's keys and values,
    which its entries show as a struct, are still told."""
    column = NAMED_INSIDE[case]
    read = _through_parquet(pyarrow.table({"n": column})).column("n").combine_chunks()
    assert str(read.type) != str(column.type)  # named otherwise, yet equal to Arrow
    assert read.equals(column)
    codec = ArrowCodec()
    assert codec.digest(_MADE[kind](read)) == codec.digest(_MADE[kind](column))
    kept = codec.decode(b"".join(bytes(piece) for piece in codec.encode(_MADE[kind](read))))
    assert to_arrow(kept).column("n").combine_chunks().equals(read)
    if "map" not in case:  # kept as it was named (Arrow IPC reads a map's entries `entries`)
        assert str(to_arrow(kept).schema.field("n").type) == str(read.type)
    renamed = pyarrow.map_(
        pyarrow.field("k", pyarrow.string(), nullable=False), pyarrow.field("v", pyarrow.int64())
    )
    pairs = NAMED_INSIDE["map"]
    assert codec.digest(_MADE[kind](pairs)) != codec.digest(_MADE[kind](pairs.cast(renamed)))
