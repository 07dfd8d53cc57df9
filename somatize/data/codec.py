"""The ``arrow`` codec: frames, tables and record batches as Arrow IPC.

Arrow IPC is the buffers as they already are, behind a small header, so
writing a frame is no encoding pass and reading one is no decoding pass: the
decoded table's buffers point into the bytes it was read from — the memory a
local store read a blob into, or the bytes that crossed to a worker. Its readers
run no code, which is why a store may hold it. They take the arrays on trust,
though, so what is decoded is checked first: the stream must be the one the
codec writes (uncompressed, ended, nothing after it), and its arrays are
validated in full (offsets and indices in bounds, strings and names UTF-8) —
one pass over the offsets and the strings' bytes, no copy.

What kind of value went in (a :class:`~somatize.data.Frame`, a table or a
record batch) is written into the schema's metadata under ``somatize.kind`` and
taken out again on the way back, so a frame comes back a frame and the bytes
stay plain Arrow IPC any Arrow reader opens.

The digest is BLAKE3 over the IPC bytes of the value with its chunks combined and
its columns laid out one way (:mod:`somatize.data._canonical`): bare validity bitmaps,
nothing under a null, at any depth. Equal content laid out in different chunks (a table
read in two pieces, or in one), sliced from a column that had nulls elsewhere, or left by
a kernel with what it found under a null (``if_else``, ``Array.from_buffers``), has one
digest, which is what a key computed in two processes needs; so do rows whose lists'
items or maps' entries are named otherwise (:func:`_unnamed`: a Parquet reader names
them ``element`` and after the column). Dictionary columns are
written with their dictionaries: a slice of one keeps the whole dictionary, so it digests
apart from the same rows encoded afresh (a cache miss, never a wrong answer), and chunks
whose dictionaries together need more indices than their index type counts, or which
are other dictionaries of nested entries (which Arrow cannot combine), are written one by
one, a dictionary each. Chunks of dictionaries of floats are combined as their bits,
since Arrow takes ``0.0`` and ``-0.0`` for one entry; where they cannot be combined, a chunk
whose dictionary differs from the one written before only by the sign of a zero is
refused: IPC writes a chunk's dictionary again only where Arrow finds it differs.
"""

from __future__ import annotations

import struct
from collections.abc import Hashable, Sequence
from typing import Any

import blake3
import pyarrow
import pyarrow.compute
import pyarrow.ipc

from somatize._threads import hash_threads
from somatize.codecs import Codec, CodecError
from somatize.data._canonical import canonical, rebuilt, type_test
from somatize.data.frame import Frame, python_extensions

__all__ = ["ArrowCodec"]

_KIND = b"somatize.kind"
_OWN = _KIND + b"."
"""What a key of the value's own metadata that starts as :data:`_KIND` is written after,
so that none is taken for the codec's, nor lost under it."""
_OWNED = b"+own"
"""What the kind written under :data:`_KIND` ends with when keys were written after
:data:`_OWN` (so that a key written so before, as it was, is read as it was)."""
_KINDS = (b"frame", b"table", b"batch")
_NO_FIELDS = pyarrow.struct([])
_BATCHES = ("dictionary", "record batch")
_CONTINUATION = b"\xff\xff\xff\xff"
_END = _CONTINUATION + b"\0\0\0\0"


def _tagged(table: pyarrow.Table | pyarrow.RecordBatch, kind: bytes) -> Any:
    metadata = dict(table.schema.metadata or {})
    if any(key.startswith(_KIND) for key in metadata):
        metadata = {
            _OWN + key if key.startswith(_KIND) else key: value for key, value in metadata.items()
        }
        kind += _OWNED
    metadata[_KIND] = kind
    if isinstance(table, pyarrow.Table) and not table.num_columns:
        # Rows and no columns (a frame read with ``columns=[]``): its length is all it says,
        # and Arrow drops it when such a table's metadata is replaced or it is rebuilt from
        # its columns; a batch made from a struct array of no fields keeps it.
        rows = pyarrow.RecordBatch.from_struct_array(pyarrow.nulls(table.num_rows, _NO_FIELDS))
        return pyarrow.Table.from_batches([rows.replace_schema_metadata(metadata)])
    return table.replace_schema_metadata(metadata)


def _untagged(schema: pyarrow.Schema) -> tuple[pyarrow.Schema, bytes]:
    metadata = dict(schema.metadata or {})
    kind = metadata.pop(_KIND, None)
    if isinstance(kind, bytes) and kind.endswith(_OWNED):
        kind = kind[: -len(_OWNED)]
        metadata = {
            key[len(_OWN) :] if key.startswith(_OWN) else key: value
            for key, value in metadata.items()
        }
    if kind not in _KINDS:
        raise CodecError(
            "these bytes are Arrow IPC written by something other than the `arrow` codec (no "
            f"`somatize.kind` in its schema metadata, found {kind!r}): the answer record names "
            "the wrong codec, or the blob was replaced"
        )
    return schema.with_metadata(metadata) if metadata else schema.remove_metadata(), kind


def _combined(table: pyarrow.Table) -> pyarrow.Table:
    """``table`` with each column in one chunk. Arrow combines chunks of dictionaries into
    one dictionary, taking entries that compare equal for one: ``0.0`` and ``-0.0`` would
    become one, so a column holding dictionaries of floats is combined as the same bits seen
    as integers. A column Arrow cannot combine (dictionaries that together need more
    indices than their index type counts, or other dictionaries of nested entries) stays
    in its chunks, the empty ones left out: written with a dictionary per chunk, it digests
    apart from the same rows chunked otherwise (a miss, never a wrong answer)."""
    kinds = [_as_bits(field.type) for field in table.schema]
    if all(kind is None for kind in kinds):
        try:
            return table.combine_chunks()
        except pyarrow.ArrowException:  # combined column by column below
            pass
    columns = []
    for column, bits in zip(table.columns, kinds, strict=True):
        try:
            if bits is None or column.num_chunks < 2:
                chunks = [column.combine_chunks()]
            else:
                chunks = [_combined_as_bits(column, bits)]
        except pyarrow.ArrowException:
            chunks = [chunk for chunk in column.chunks if len(chunk)]
        columns.append(pyarrow.chunked_array(chunks, type=column.type))
    return pyarrow.Table.from_arrays(columns, schema=table.schema)


def _combined_as_bits(column: pyarrow.ChunkedArray, bits: Any) -> pyarrow.Array:
    """The chunks of ``column`` combined as ``bits`` (its type with the floats its
    dictionaries hold seen as integers: combining compares those bit for bit), and seen as
    its type again; what comes out is checked in full."""
    combined = pyarrow.concat_arrays([_seen_as(chunk, bits) for chunk in column.chunks])
    combined = _seen_as(combined, column.type)
    combined.validate(full=True)
    return combined


def _seen_as(array: Any, kind: Any) -> Any:
    """``array`` seen as ``kind``, a type of its layout with other numbers of the same width
    (or an extension type's storage for it, or the other way): its numbers viewed as such,
    its nested columns rebuilt over their buffers level by level. Arrow's view of a whole
    nested column misplaces what lies below a run or a union's slice: it can keep its rows
    yet read other values."""
    if array.type == kind:
        return array
    if isinstance(kind, pyarrow.BaseExtensionType):
        return pyarrow.ExtensionArray.from_storage(kind, _seen_as(array, kind.storage_type))
    if isinstance(array.type, pyarrow.BaseExtensionType):
        return _seen_as(array.storage, kind)
    types = pyarrow.types
    if types.is_dictionary(kind):
        entries = _seen_as(array.dictionary, kind.value_type)
        return pyarrow.DictionaryArray.from_arrays(array.indices, entries, ordered=kind.ordered)
    if type_test("is_run_end_encoded")(kind):
        values = _seen_as(array.values, kind.value_type)
        whole = pyarrow.RunEndEncodedArray.from_arrays(array.run_ends, values, type=kind)
        return whole.slice(array.offset, len(array))
    if types.is_struct(kind):
        children = [_seen_as(array.field(i), kind.field(i).type) for i in range(kind.num_fields)]
        fields = [kind.field(i) for i in range(kind.num_fields)]
        mask = array.is_null() if array.null_count else None
        return pyarrow.StructArray.from_arrays(children, fields=fields, mask=mask)
    if types.is_union(kind) and kind.mode == "sparse":
        array = pyarrow.concat_arrays([array])  # its children from its first row, as its codes
    if types.is_union(kind):
        children = [_seen_as(array.field(i), kind.field(i).type) for i in range(kind.num_fields)]
    elif kind.num_fields:  # lists, large lists, maps, fixed-size lists, list views
        children = [_seen_as(array.values, kind.field(0).type)]
    else:
        return array.view(kind)
    own = array.buffers()[: kind.num_buffers]  # its own, before its children's
    return pyarrow.Array.from_buffers(
        kind, len(array), own, array.null_count, array.offset, children
    )


_BITS = {16: pyarrow.int16(), 32: pyarrow.int32(), 64: pyarrow.int64()}


def _as_bits(kind: pyarrow.DataType, entries: bool = False) -> Any:
    """``kind`` with the floats a dictionary holds (at any depth) as integers of their
    width, laid out alike, an extension type as its storage; None when it holds no
    dictionary of floats. A type it cannot rebuild so is itself seen as bits that Arrow
    refuses to view (its chunks stay apart)."""
    types = pyarrow.types
    if types.is_floating(kind):
        return _BITS[kind.bit_width] if entries else None
    if types.is_dictionary(kind):
        inner = _as_bits(kind.value_type, True)
        return None if inner is None else pyarrow.dictionary(kind.index_type, inner, kind.ordered)
    if isinstance(kind, pyarrow.BaseExtensionType):  # seen as its storage
        return _as_bits(kind.storage_type, entries)
    fields = [kind.field(i) for i in range(kind.num_fields)]
    inner = [_as_bits(field.type, entries) for field in fields]
    if all(one is None for one in inner):
        return None
    made = [
        field if one is None else field.with_type(one)
        for field, one in zip(fields, inner, strict=True)
    ]
    bits = rebuilt(kind, made)
    return pyarrow.null() if bits is None else bits  # none to see it as: its chunks stay apart


def _chunked_entries(table: Any) -> list[tuple[str, pyarrow.ChunkedArray, Any]]:
    """The name, the chunks and the type as bits (:func:`_as_bits`) of each of ``table``'s
    columns that hold dictionaries of floats in more than one chunk."""
    if isinstance(table, pyarrow.RecordBatch):
        return []
    return [
        (field.name, column, bits)
        for field, column in zip(table.schema, table.columns, strict=True)
        if (bits := _as_bits(field.type)) is not None
        and sum(1 for one in column.chunks if len(one)) > 1
    ]


def _misread(column: pyarrow.ChunkedArray, bits: Any) -> bool:
    """Whether a reader would take a float of ``column`` (its type as bits ``bits``) for
    another, written chunk by chunk: Arrow IPC writes a chunk's dictionary again only where
    it differs from the one it wrote before by Arrow's comparison, to which ``-0.0`` is
    ``0.0``; so where that one differs from it bit for bit, it is read in its place."""
    written: dict[int, tuple[pyarrow.Array, pyarrow.Array]] = {}
    for chunk in column.chunks:
        try:
            seen = _seen_as(chunk, bits)
        except pyarrow.ArrowException:  # not seen as bits: not told apart
            return True
        for at, now in enumerate(zip(_dictionaries(chunk), _dictionaries(seen), strict=True)):
            before = written.get(at)
            if before is None or not before[0].equals(now[0]):
                written[at] = now  # written again
            elif not before[1].equals(now[1]):
                return True
    return False


def _dictionaries(array: Any) -> list[pyarrow.Array]:
    """The dictionaries ``array`` holds, at any depth, one for each dictionary of its type,
    in an order its type sets."""
    kind = array.type
    if isinstance(kind, pyarrow.BaseExtensionType):
        return _dictionaries(array.storage)
    if pyarrow.types.is_dictionary(kind):
        return [array.dictionary, *_dictionaries(array.dictionary)]
    if type_test("is_run_end_encoded")(kind):
        return _dictionaries(array.values)
    if pyarrow.types.is_struct(kind) or pyarrow.types.is_union(kind):
        return [one for i in range(kind.num_fields) for one in _dictionaries(array.field(i))]
    return _dictionaries(array.values) if kind.num_fields else []


def _digest(ipc: pyarrow.Buffer, schema: pyarrow.Schema) -> str:
    """BLAKE3 of ``ipc``, the stream written with ``schema``, its schema message written as
    :func:`_unnamed` names its fields: no row read, nor Arrow's type equality and ``equals``
    (but when asked to compare metadata), tells a list's ``item`` from its ``element``, nor a
    map's ``entries`` from the name a Parquet reader gives them, so the same rows read from
    Parquet and made in memory digest alike. Where the stream does not start with that
    message as ``schema`` serializes it, it is hashed as it is (a miss, never a wrong
    answer)."""
    hasher = blake3.blake3(max_threads=hash_threads())
    hasher.update(b"arrow\0")
    written = schema.serialize()
    if ipc.size >= written.size and ipc.slice(0, written.size).equals(written):
        hasher.update(_unnamed_schema(schema).serialize())
        hasher.update(memoryview(ipc)[written.size :])
    else:  # pragma: no cover - an Arrow writing its schema message otherwise
        hasher.update(ipc)
    return "blake3:" + hasher.hexdigest()


def _unnamed_schema(schema: pyarrow.Schema) -> pyarrow.Schema:
    """``schema`` with its columns' types as :func:`_unnamed` makes them."""
    fields = [field.with_type(_unnamed(field.type)) for field in schema]
    return pyarrow.schema(fields, metadata=schema.metadata)


_LISTS = ("is_list", "is_large_list", "is_fixed_size_list", "is_list_view", "is_large_list_view")


def _unnamed(kind: pyarrow.DataType) -> pyarrow.DataType:
    """``kind`` with the items of its lists named ``item`` and the entries of its maps
    ``entries``, at any depth (what Arrow names them when it makes them): names no row read
    tells apart, nor Arrow's comparisons but those that compare metadata. What else a
    field says (the names of a struct's fields or a map's keys and values, nullability,
    metadata) stays; a map whose entries carry metadata, and an extension type, stay as
    they are."""
    types = pyarrow.types
    if types.is_dictionary(kind):
        return pyarrow.dictionary(kind.index_type, _unnamed(kind.value_type), kind.ordered)
    if not kind.num_fields or isinstance(kind, pyarrow.BaseExtensionType):
        return kind
    if types.is_map(kind) and kind.field(0).metadata:
        return kind
    fields = [kind.field(i) for i in range(kind.num_fields)]
    fields = [field.with_type(_unnamed(field.type)) for field in fields]
    if any(type_test(test)(kind) for test in _LISTS):
        fields[0] = fields[0].with_name("item")
    made = rebuilt(kind, fields)
    return kind if made is None else made


def _check_stream(buffer: pyarrow.Buffer) -> None:
    """Refuses (ValueError, OSError or an Arrow error) an IPC stream in ``buffer`` other
    than one this codec writes, from the messages' metadata alone, before any batch is
    read: each message framed as streams are since Arrow 0.15 and in metadata version 5 (in
    version 4, a message can say elsewhere that its buffers are compressed); one schema,
    then dictionaries and record batches whose buffers are not compressed — the codec never
    compresses, and a few bytes compressed can claim gigabytes; then the end-of-stream
    marker, and nothing after it (Arrow stops reading there: a second stream, say)."""
    source = pyarrow.BufferReader(buffer)
    messages = pyarrow.ipc.MessageReader.open_stream(source)
    expected: tuple[str, ...] = ("schema",)
    where = "the schema"
    while True:
        at = source.tell()
        try:
            message = messages.read_next_message()
        except StopIteration:
            break
        if buffer.slice(at, 4).to_pybytes() != _CONTINUATION:
            raise ValueError(f"the message at byte {at} is framed as before Arrow 0.15")
        if message.metadata_version != pyarrow.ipc.MetadataVersion.V5:
            version = pyarrow.ipc.MetadataVersion(message.metadata_version).name
            raise ValueError(f"a {message.type} message is in Arrow metadata {version}, not V5")
        if message.type not in expected:
            raise ValueError(f"a {message.type} message at byte {at}, where {where} goes")
        if message.type in _BATCHES and _compressed(
            memoryview(message.metadata), message.type == "dictionary"
        ):
            raise ValueError(f"a {message.type} message has compressed buffers")
        expected, where = _BATCHES, "a dictionary or record batch"
    if buffer.slice(at, min(len(_END), buffer.size - at)).to_pybytes() != _END:
        raise ValueError(f"the stream stops at byte {at} without its end-of-stream marker")
    if buffer.size > at + len(_END):
        raise ValueError(f"{buffer.size - at - len(_END)} bytes follow the end of the stream")


def _names(kind: pyarrow.DataType | pyarrow.Schema) -> list[str]:
    """The names of the fields in ``kind``, at any depth; UnicodeDecodeError (a ValueError)
    if one is not UTF-8, which Arrow leaves to whoever reads it (every use of it fails)."""
    fields = (
        list(kind) if isinstance(kind, pyarrow.Schema) else map(kind.field, range(kind.num_fields))
    )
    names = []
    for field in fields:
        names.append(field.name)
        names.extend(_names(field.type))
    if isinstance(kind, pyarrow.DictionaryType):
        names.extend(_names(kind.value_type))
    elif isinstance(kind, pyarrow.BaseExtensionType):
        names.extend(_names(kind.storage_type))
    return names


def _compressed(metadata: memoryview, dictionary: bool) -> bool:
    """Whether the flatbuffer ``Message`` in ``metadata`` (verified by Arrow as it was read),
    which heads a record batch (or a dictionary batch, whose data is one), says the batch's
    buffers are compressed: whether its ``RecordBatch`` has a ``compression`` field. Field
    numbers as Arrow's Message.fbs gives them."""
    batch = _child(metadata, _integer(metadata, 0), 2)  # Message.header
    if batch is not None and dictionary:
        batch = _child(metadata, batch, 1)  # DictionaryBatch.data
    return batch is not None and _field(metadata, batch, 3) is not None  # .compression


def _integer(data: memoryview, at: int, layout: str = "<I") -> int:
    if not 0 <= at <= len(data) - struct.calcsize(layout):
        raise ValueError("a message's metadata points outside itself")
    value: int = struct.unpack_from(layout, data, at)[0]
    return value


def _field(data: memoryview, table: int, index: int) -> int | None:
    """Where field ``index`` of the flatbuffer table at ``table`` lies, or None if absent."""
    vtable = table - _integer(data, table, "<i")
    slot = 4 + 2 * index
    if _integer(data, vtable, "<H") < slot + 2:
        return None
    offset = _integer(data, vtable + slot, "<H")
    return table + offset if offset else None


def _child(data: memoryview, table: int, index: int) -> int | None:
    """Where the table that field ``index`` of the table at ``table`` refers to lies."""
    at = _field(data, table, index)
    return None if at is None else at + _integer(data, at)


class ArrowCodec(Codec):
    """Frames, ``pyarrow.Table`` and ``pyarrow.RecordBatch`` as Arrow IPC (stream format)."""

    name = "arrow"
    types = (Frame, pyarrow.Table, pyarrow.RecordBatch)

    def accepts(self, value: Any) -> bool:
        return not python_extensions(value.schema)

    def refusal(self, value: Any) -> str | None:
        """Why a value is not written: a column of an extension type defined in Python,
        which no reader may turn back into Python (:meth:`decode` refuses it)."""
        foreign = python_extensions(value.schema)
        if not foreign:
            return None
        return (
            f"a column is of an extension type defined in Python ({'; '.join(foreign)}), whose "
            "values only the code that registered it turns back into Python, maybe by "
            "unpickling: cast it to its storage type (`column.storage`) first"
        )

    def _ipc(self, value: Any, combined: bool) -> tuple[pyarrow.Buffer, pyarrow.Schema]:
        """The IPC stream of ``value`` (laid out one way when ``combined``), and the schema
        it was written with."""
        if isinstance(value, Frame):
            table, kind = value.to_arrow(), b"frame"
        elif isinstance(value, pyarrow.RecordBatch):
            table, kind = value, b"batch"
        else:
            table, kind = value, b"table"
        tagged = _tagged(table, kind)
        if combined or _chunked_entries(tagged):
            tagged = tagged if kind == b"batch" else _combined(tagged)
        if combined:
            tagged = canonical(tagged)
        apart = [name for name, column, bits in _chunked_entries(tagged) if _misread(column, bits)]
        if apart:
            raise CodecError(
                f"column(s) {', '.join(map(repr, apart))} hold dictionaries of floats in chunks "
                "that cannot be combined, and Arrow IPC would read a chunk's -0.0 as the 0.0 "
                "of the one before: cast such a column to its values "
                "(`column.cast(column.type.value_type)`) or to wider indices first"
            )
        sink = pyarrow.BufferOutputStream()
        with pyarrow.ipc.new_stream(sink, tagged.schema) as writer:
            if kind == b"batch":
                writer.write_batch(tagged)
            else:
                for batch in tagged.to_batches():
                    if combined and batch.num_rows == 0:
                        continue  # an empty table may come with or without an empty chunk
                    writer.write_batch(batch)
        return sink.getvalue(), tagged.schema

    def encode(self, value: Any) -> Sequence[memoryview]:
        return [memoryview(self._ipc(value, combined=False)[0])]

    def decode(self, data: memoryview) -> Any:
        """The value in ``data``; CodecError unless it is an Arrow IPC stream as this codec
        writes them — one schema, its dictionaries and batches, uncompressed, the end of the
        stream and nothing after — whose arrays are whole: every offset, index and length
        in bounds, every string and name UTF-8 (what reading them later takes on trust)."""
        return self._read(pyarrow.py_buffer(data), checked=True)

    def _read(self, buffer: pyarrow.Buffer, checked: bool) -> Any:
        """The value in ``buffer``, checked as :meth:`decode` says when ``checked`` (not
        when this process has just written it)."""
        try:
            if checked:
                _check_stream(buffer)
            reader = pyarrow.ipc.open_stream(buffer)
            batches = list(reader)
            schema, kind = _untagged(reader.schema)
            if checked:
                _names(reader.schema)
                foreign = python_extensions(reader.schema)
                if foreign:
                    raise ValueError(
                        f"a column is of an extension type defined in Python "
                        f"({'; '.join(foreign)}), whose values turn into Python by code "
                        "this process registered, which may unpickle them; the codec "
                        "reads no such column"
                    )
                for batch in batches:
                    batch.validate(full=True)
        except (pyarrow.ArrowException, OSError, ValueError) as why:
            raise CodecError(
                f"these bytes are not the Arrow IPC the `arrow` codec writes ({why}); the answer "
                "is damaged or was written by another codec"
            ) from None
        if kind == b"batch":
            if len(batches) != 1:
                raise CodecError(
                    f"a record batch was written as one batch and {len(batches)} came back: the "
                    "answer is damaged"
                )
            return batches[0].replace_schema_metadata(schema.metadata)
        table = pyarrow.Table.from_batches(batches, schema=schema)
        return Frame(table) if kind == b"frame" else table

    def digest(self, value: Any) -> str:
        return _digest(*self._ipc(value, combined=True))

    def stamp(self, value: Any) -> Hashable | None:
        """None: an Arrow table cannot be changed through Arrow, but its buffers may be
        memory it shares with whatever it was made from (a numpy array, a DataFrame),
        which can be written in place; so it is weighed at every use."""
        return None

    def held(self, value: Any) -> tuple[str, Any]:
        """The digest of ``value`` and ``value`` over memory of its own, read from the bytes
        that were digested (one copy): what was digested is what it holds, whatever
        happens to the memory ``value`` was made over."""
        data, schema = self._ipc(value, combined=True)
        return _digest(data, schema), self._read(_read_only(data), checked=False)


def _read_only(buffer: pyarrow.Buffer) -> pyarrow.Buffer:
    """``buffer``'s memory as a buffer that cannot be written through (no copy): the arrays
    read from it refuse a write through numpy, as those recalled from a store do."""
    return pyarrow.py_buffer(memoryview(buffer).toreadonly())


_HOLDER = ArrowCodec()


def _flat(kind: pyarrow.DataType) -> bool:
    """Whether an array of ``kind`` is its own buffers alone: no children, no dictionary, no
    buffers beyond those its type says."""
    types = pyarrow.types
    return not isinstance(kind, pyarrow.BaseExtensionType) and (
        (types.is_primitive(kind) and not types.is_null(kind))
        or types.is_binary(kind)
        or types.is_string(kind)
        or types.is_large_binary(kind)
        or types.is_large_string(kind)
        or types.is_fixed_size_binary(kind)
        or types.is_decimal(kind)
    )


def read_only(table: pyarrow.Table) -> pyarrow.Table:
    """``table`` over memory that its arrays cannot be written through: what a source keeps
    and hands out slices of (a row group it decoded) is not changed in place by a node that
    writes into the numpy array over a column, which would change the rows handed out for a
    span under the same version. Columns of flat types (numbers, strings, binary) are their
    own buffers seen read-only, with no copy; a table with any other column (nested, a
    dictionary) is copied once."""
    if all(_flat(field.type) for field in table.schema):
        columns = [
            pyarrow.chunked_array(
                [
                    pyarrow.Array.from_buffers(
                        chunk.type,
                        len(chunk),
                        [None if one is None else _read_only(one) for one in chunk.buffers()],
                        chunk.null_count,
                        chunk.offset,
                    )
                    for chunk in column.chunks
                ],
                type=column.type,
            )
            for column in table.columns
        ]
        if columns:
            return pyarrow.Table.from_arrays(columns, schema=table.schema)
    if any(column.num_chunks > 1 for column in table.columns):
        table = _combined(table)
    held = _HOLDER._read(_read_only(_HOLDER._ipc(table, combined=False)[0]), checked=False)
    assert isinstance(held, pyarrow.Table)
    return held
