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

The digest is BLAKE3 over the IPC bytes of the value with its chunks combined
and its validity bitmaps bare (none on a column with no nulls, no bits set past
a column's end), with nothing under a null: zeros under the nulls of a column of
numbers, booleans, decimals, intervals or fixed-size binary, no bytes under those of a column
of strings, no items under those of a list or a map, and nulls in a struct's
children (or a fixed-size list's items) under its own, and a sparse union's
children null in the rows another child holds, at any depth. Equal
content laid out in different chunks (a table read in two pieces, or in one),
sliced from a column that had nulls elsewhere, or left by a kernel with what it
found under a null (``if_else``, ``Array.from_buffers``), has one digest, which is
what a key computed in two processes needs; a run-end-encoded column keeps only the
runs of its rows, and a run split at a chunk's end is joined again. Dictionary
and dense union columns are written as they are: a slice of one keeps the whole
dictionary, or its union's children whole, so it digests apart from the same rows
laid out otherwise (a cache miss, never a wrong answer); so are run-end-encoded and view
columns (whose rows Arrow does not take) in a list, a map or a union, with what lies under
the nulls around them.
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
from somatize.data.frame import Frame, python_extensions

__all__ = ["ArrowCodec"]

_KIND = b"somatize.kind"
_KINDS = (b"frame", b"table", b"batch")
_NO_FIELDS = pyarrow.struct([])
_BATCHES = ("dictionary", "record batch")
_CONTINUATION = b"\xff\xff\xff\xff"
_END = _CONTINUATION + b"\0\0\0\0"


def _tagged(table: pyarrow.Table | pyarrow.RecordBatch, kind: bytes) -> Any:
    metadata = dict(table.schema.metadata or {})
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
    if kind not in _KINDS:
        raise CodecError(
            "these bytes are Arrow IPC written by something other than the `arrow` codec (no "
            f"`somatize.kind` in its schema metadata, found {kind!r}): the answer record names "
            "the wrong codec, or the blob was replaced"
        )
    return schema.with_metadata(metadata) if metadata else schema.remove_metadata(), kind


def _bare(column: pyarrow.Array) -> pyarrow.Array:
    """``column`` with no validity bits that say nothing about its rows: no bitmap when
    nothing is null, no bits set past its end, nothing under a null, at any depth. A slice
    of a column keeps the bitmap of the whole, and IPC writes what it finds; rebuilding
    (one copy) writes them the one way."""
    kind = column.type
    if getattr(pyarrow.types, "is_run_end_encoded", lambda _: False)(kind):
        return _runs(column)
    if _is_view(kind):  # its strings are in whichever data buffers the chunks put them
        base = (
            pyarrow.large_binary() if pyarrow.types.is_binary_view(kind) else pyarrow.large_string()
        )
        column = pyarrow.concat_arrays([column.cast(base).cast(kind)])
    if isinstance(kind, pyarrow.BaseExtensionType):
        return pyarrow.ExtensionArray.from_storage(kind, _bare(column.storage))
    if pyarrow.types.is_dictionary(kind):
        column = pyarrow.concat_arrays([column])  # its indices from its first row
        return pyarrow.DictionaryArray.from_arrays(
            _bare(column.indices), _bare(column.dictionary), ordered=kind.ordered
        )
    if pyarrow.types.is_union(kind) and kind.mode == "sparse":
        return _sparse_bare(column)
    if column.null_count and (pyarrow.types.is_integer(kind) or _plain_number(kind)):
        column = _nulls_cleared(column)
    elif _nests(kind):
        return _nested_bare(column)
    elif column.null_count and _taken_bare(kind) and _spans_under_nulls(column):
        column = column.take(_every(len(column)))
    if (
        pyarrow.types.is_nested(kind)  # whose children hold bitmaps of their own
        or pyarrow.types.is_dictionary(kind)
        or pyarrow.types.is_boolean(kind)  # data bits past the end may be set
        or column.offset  # a slice: IPC writes it with what lies around it
    ):
        return pyarrow.concat_arrays([column])
    if _longer_than_its_rows(column):
        return pyarrow.concat_arrays([column])
    validity = column.buffers()[0] if column.buffers() else None
    if validity is None:
        return column
    length = len(column)
    used = (length + 7) // 8
    if (
        column.null_count == 0
        or validity.size > used  # a prefix of a longer column: IPC writes the rest too
        or (length % 8 and memoryview(validity)[length // 8] >> length % 8)
    ):
        return pyarrow.concat_arrays([column])
    return column  # sliced at an offset, IPC copies the bits it needs into a cleared buffer


def _longer_than_its_rows(column: Any) -> bool:
    """Whether a buffer of ``column`` (of a flat type, at no offset) holds more than its
    rows: a prefix of a longer column, whose buffers IPC writes up to a multiple of 64
    bytes, with the rows after it, where the same rows made afresh are written alone."""
    kind = column.type
    buffers = column.buffers()
    length = len(column)
    types = pyarrow.types
    if types.is_string(kind) or types.is_binary(kind):
        layout = "<i"
    elif types.is_large_string(kind) or types.is_large_binary(kind):
        layout = "<q"
    else:
        try:
            width = kind.bit_width
        except ValueError:  # of no fixed width
            return False
        data = buffers[1] if len(buffers) > 1 else None
        return bool(width % 8 == 0 and data is not None and data.size > length * width // 8)
    offsets, data = buffers[1], buffers[2]
    width = struct.calcsize(layout)
    if offsets is None:
        return False
    first = struct.unpack_from(layout, offsets, 0)[0]
    last = struct.unpack_from(layout, offsets, length * width)[0]
    held = 0 if data is None else data.size
    return bool(offsets.size > (length + 1) * width or first != 0 or held > last)


def _taken(column: Any, rows: pyarrow.Array) -> pyarrow.Array:
    """``column.take(rows)``, or ``column`` as it is (from its first row) when it holds what
    Arrow takes no rows of (see :func:`_takes`): what lies under its nulls then stays, which
    digests it apart from the same rows laid out afresh (a miss, never a wrong answer)."""
    if not _takes(column.type):
        return pyarrow.concat_arrays([column])
    return column.take(rows)


def _takes(kind: pyarrow.DataType) -> bool:
    """Whether Arrow takes (and filters) rows of ``kind``: not of a run-end-encoded column
    or a view, nor of any type holding one."""
    if isinstance(kind, pyarrow.BaseExtensionType):
        kind = kind.storage_type
    if _is_view(kind) or getattr(pyarrow.types, "is_run_end_encoded", lambda _: False)(kind):
        return False
    if pyarrow.types.is_dictionary(kind):
        return _takes(kind.value_type)
    return all(_takes(kind.field(i).type) for i in range(kind.num_fields))


def _every(count: int) -> pyarrow.Array:
    """The row numbers ``0 .. count - 1``, made by Arrow (a Python ``range`` is slow)."""
    return pyarrow.compute.indices_nonzero(pyarrow.nulls(count, pyarrow.bool_()).fill_null(True))


def _spans_under_nulls(column: Any) -> bool:
    """Whether a null of ``column`` may span something (bytes, items) that taking its rows
    leaves out: for strings, binary and lists, whether the offsets of its rows span more
    than the lengths of its valid rows add up to (one pass over the offsets, where taking
    its rows copies them); True for a column of any other kind."""
    kind = column.type
    types = pyarrow.types
    if types.is_string(kind) or types.is_binary(kind):
        lengths, layout = pyarrow.compute.binary_length, "<i"
    elif types.is_large_string(kind) or types.is_large_binary(kind):
        lengths, layout = pyarrow.compute.binary_length, "<q"
    elif types.is_list(kind):
        lengths, layout = pyarrow.compute.list_value_length, "<i"
    elif types.is_large_list(kind):
        lengths, layout = pyarrow.compute.list_value_length, "<q"
    else:
        return True
    width = struct.calcsize(layout)
    offsets = column.buffers()[1]
    first = struct.unpack_from(layout, offsets, column.offset * width)[0]
    last = struct.unpack_from(layout, offsets, (column.offset + len(column)) * width)[0]
    used = pyarrow.compute.sum(lengths(column)).as_py() or 0
    return bool(last - first != used)


def _taken_bare(kind: pyarrow.DataType) -> bool:
    """Whether ``kind``'s slots under a null may hold bytes that taking its rows (one copy)
    leaves out: strings and binary (bytes a null's offsets still span), booleans,
    decimals, fixed-size binary and intervals (whatever the slot held)."""
    types = pyarrow.types
    return bool(
        types.is_string(kind)
        or types.is_binary(kind)
        or types.is_large_string(kind)
        or types.is_large_binary(kind)
        or types.is_boolean(kind)
        or types.is_decimal(kind)
        or types.is_fixed_size_binary(kind)
        or types.is_interval(kind)
    )


def _nests(kind: pyarrow.DataType) -> bool:
    """Whether ``kind`` is a struct, a list, a large list, a fixed-size list or a map: a
    column with children whose slots under the column's own nulls say nothing of its rows."""
    types = pyarrow.types
    return bool(
        types.is_struct(kind)
        or types.is_list(kind)
        or types.is_large_list(kind)
        or types.is_fixed_size_list(kind)
        or types.is_map(kind)
    )


def _nested_bare(column: Any) -> pyarrow.Array:
    """``column`` (of a type :func:`_nests` names) with its children bare and nothing in them
    under its nulls: a struct's children null where it is, a list's rows taken afresh, so a
    null row spans no items (whatever it spanned before, as a kernel may leave it) and the
    items are only those of its rows. Two columns equal by value have one layout, at any
    depth."""
    kind = column.type
    mask = column.is_null() if column.null_count else None
    if pyarrow.types.is_struct(kind) and not kind.num_fields:
        return pyarrow.concat_arrays([column])  # no children, and none tell its length
    if pyarrow.types.is_struct(kind):
        children = [_bare(child) for child in _under_its_nulls(column, mask)]
        return pyarrow.StructArray.from_arrays(
            children, fields=[kind.field(i) for i in range(kind.num_fields)], mask=mask
        )
    if mask is None or not _spans_under_nulls(column):  # one pass over the offsets
        column = pyarrow.concat_arrays([column])  # from its first row, items only its own
    else:
        column = _taken(column, _every(len(column)))
    if pyarrow.types.is_fixed_size_list(kind):
        size = kind.list_size
        if not size:  # no items at all (and Arrow builds no such list from its items)
            return column
        values = column.values
        if mask is not None:  # its items under a null made null, as a struct's children are
            items = _every(len(values))
            rows = pyarrow.compute.divide(items, size)
            kept = pyarrow.compute.is_valid(column).take(rows)
            values = _taken(values, pyarrow.compute.if_else(kept, items, None))
        return pyarrow.FixedSizeListArray.from_arrays(_bare(values), type=kind, mask=mask)
    values = _bare(column.values)
    if pyarrow.types.is_map(kind):
        return pyarrow.MapArray.from_arrays(
            column.offsets, values.field(0), values.field(1), type=kind, mask=mask
        )
    return type(column).from_arrays(column.offsets, values, type=kind, mask=mask)


def _under_its_nulls(column: Any, mask: pyarrow.Array | None) -> list[pyarrow.Array]:
    """The children of struct ``column`` (of its rows), null where it is (``mask``). A union
    child has no validity bits to take them (Arrow's ``flatten`` aborts the process on one):
    it is left as it is, so what lies in it under the struct's nulls stays, which digests it
    apart from the same rows laid out otherwise (a miss, never a wrong answer)."""
    kind = column.type
    fields = [kind.field(i) for i in range(kind.num_fields)]
    children = [column.field(i) for i in range(kind.num_fields)]
    plain = [i for i, one in enumerate(fields) if not _is_union(one.type)]
    if mask is None or not plain:
        return children
    if len(plain) == len(fields):
        return list(column.flatten())
    pushed = pyarrow.StructArray.from_arrays(
        [children[i] for i in plain], fields=[fields[i] for i in plain], mask=mask
    ).flatten()
    for at, child in zip(plain, pushed, strict=True):
        children[at] = child
    return children


def _is_union(kind: pyarrow.DataType) -> bool:
    """Whether ``kind`` is a union, or an extension type stored as one."""
    if isinstance(kind, pyarrow.BaseExtensionType):
        kind = kind.storage_type
    return bool(pyarrow.types.is_union(kind))


def _sparse_bare(column: Any) -> pyarrow.Array:
    """Sparse union ``column`` with its children bare and null in each row another child
    holds: every child spans every row, and what it holds in a row it does not hold says
    nothing of the rows."""
    kind = column.type
    column = pyarrow.concat_arrays([column])  # its type codes from its first row
    codes = column.type_codes
    rows = _every(len(column))
    children = []
    for index, code in enumerate(kind.type_codes):
        held = pyarrow.compute.equal(codes, pyarrow.scalar(code, codes.type))
        children.append(
            _bare(_taken(column.field(index), pyarrow.compute.if_else(held, rows, None)))
        )
    return pyarrow.Array.from_buffers(
        kind, len(column), [None, codes.buffers()[1]], children=children
    )


def _runs(column: Any) -> pyarrow.Array:
    """Run-end-encoded ``column`` with its runs laid out one way: only the runs of its
    rows, their ends counted from its first row, and a run that chunks split joined again.
    A slice keeps the run ends of the column it was cut from, and combining chunks keeps
    a run split at a chunk's end as two, where encoding the rows afresh makes one."""
    kind = column.type
    first, count = column.find_physical_offset(), column.find_physical_length()
    ends = column.run_ends.slice(first, count)
    values = column.values.slice(first, count)
    ends = pyarrow.compute.min_element_wise(
        pyarrow.compute.subtract(ends.cast(pyarrow.int64()), column.offset), len(column)
    )
    if count > 1 and _takes(values.type):
        same = _same_as_next(values)
        if same is not None:
            last = pyarrow.concat_arrays([pyarrow.compute.invert(same), pyarrow.array([True])])
            ends, values = ends.filter(last), values.filter(last)
    return pyarrow.RunEndEncodedArray.from_arrays(
        ends.cast(kind.run_end_type), _bare(values), type=kind
    )


_AS_BITS = {8: pyarrow.int8(), 16: pyarrow.int16(), 32: pyarrow.int32(), 64: pyarrow.int64()}


def _plain_number(kind: pyarrow.DataType) -> bool:
    """Whether ``kind`` is a float, a date, a time, a timestamp or a duration: one number of
    8 to 64 bits per row, as an integer is."""
    if not (pyarrow.types.is_floating(kind) or pyarrow.types.is_temporal(kind)):
        return False
    try:
        return kind.bit_width in _AS_BITS
    except ValueError:  # of no fixed width
        return False


def _nulls_cleared(column: pyarrow.Array) -> pyarrow.Array:
    """``column`` (of one number per row, with nulls) with zeros in the slots under its
    nulls. What a slot under a null holds says nothing of the rows, and kernels leave what
    they find there (a concatenation, a filter): written as it is, equal rows would digest
    apart by what memory held before."""
    kind = column.type
    plain = column.view(_AS_BITS[kind.bit_width])
    data = pyarrow.compute.fill_null(plain, 0)
    valid = pyarrow.compute.is_valid(column)
    if data.offset or valid.offset:  # fresh arrays start at their buffers' start
        data, valid = pyarrow.concat_arrays([data]), pyarrow.concat_arrays([valid])
    return pyarrow.Array.from_buffers(kind, len(column), [valid.buffers()[1], data.buffers()[1]])


def _same_as_next(values: pyarrow.Array) -> pyarrow.Array | None:
    """Whether each of ``values`` but the last is the one after it: both null, or equal bit
    for bit, as encoding compares them (a float ``-0.0`` is not ``0.0``, a NaN is itself).
    None for values that cannot be compared (nested ones): their runs stay as they are,
    which digests apart from the rows encoded afresh (a miss, never a wrong answer)."""
    if pyarrow.types.is_floating(values.type):
        values = values.view(_AS_BITS[values.type.bit_width])
    before, after = values.slice(0, len(values) - 1), values.slice(1)
    try:
        equal = pyarrow.compute.equal(before, after)
    except pyarrow.ArrowNotImplementedError:
        return None
    both_null = pyarrow.compute.and_(before.is_null(), after.is_null())
    return pyarrow.compute.or_(equal.fill_null(False), both_null)


def _is_view(kind: pyarrow.DataType) -> bool:
    """Whether ``kind`` is a view type (``string_view``, ``binary_view``), on an Arrow that
    has them."""
    return any(
        getattr(pyarrow.types, name, lambda _: False)(kind)
        for name in ("is_string_view", "is_binary_view")
    )


def _bared(table: Any) -> Any:
    """``table`` (a Table of one chunk per column, or a RecordBatch) with its columns bare."""
    if not table.num_columns:
        return table  # nothing to bare, and rebuilding it would drop its length
    if isinstance(table, pyarrow.RecordBatch):
        columns: list[Any] = [_bare(column) for column in table.columns]
    else:
        columns = [
            pyarrow.chunked_array([_bare(chunk) for chunk in column.chunks], type=column.type)
            for column in table.columns
        ]
    return type(table).from_arrays(columns, schema=table.schema)


def _digest(ipc: pyarrow.Buffer) -> str:
    hasher = blake3.blake3(max_threads=hash_threads())
    hasher.update(b"arrow\0")
    hasher.update(ipc)
    return "blake3:" + hasher.hexdigest()


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

    def _ipc(self, value: Any, combined: bool) -> pyarrow.Buffer:
        if isinstance(value, Frame):
            table, kind = value.to_arrow(), b"frame"
        elif isinstance(value, pyarrow.RecordBatch):
            table, kind = value, b"batch"
        else:
            table, kind = value, b"table"
        tagged = _tagged(table, kind)
        if combined:
            tagged = _bared(tagged if kind == b"batch" else tagged.combine_chunks())
        sink = pyarrow.BufferOutputStream()
        with pyarrow.ipc.new_stream(sink, tagged.schema) as writer:
            if kind == b"batch":
                writer.write_batch(tagged)
            else:
                for batch in tagged.to_batches():
                    if combined and batch.num_rows == 0:
                        continue  # an empty table may come with or without an empty chunk
                    writer.write_batch(batch)
        return sink.getvalue()

    def encode(self, value: Any) -> Sequence[memoryview]:
        return [memoryview(self._ipc(value, combined=False))]

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
        return _digest(self._ipc(value, combined=True))

    def stamp(self, value: Any) -> Hashable | None:
        """None: an Arrow table cannot be changed through Arrow, but its buffers may be
        memory it shares with whatever it was made from (a numpy array, a DataFrame),
        which can be written in place; so it is weighed at every use."""
        return None

    def held(self, value: Any) -> tuple[str, Any]:
        """The digest of ``value`` and ``value`` over memory of its own, read from the bytes
        that were digested (one copy): what was digested is what it holds, whatever
        happens to the memory ``value`` was made over."""
        data = self._ipc(value, combined=True)
        return _digest(data), self._read(_read_only(data), checked=False)


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
        table = table.combine_chunks()
    held = _HOLDER._read(_read_only(_HOLDER._ipc(table, combined=False)), checked=False)
    assert isinstance(held, pyarrow.Table)
    return held
