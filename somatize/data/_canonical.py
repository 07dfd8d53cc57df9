"""One layout for equal content: a table's columns rebuilt so that the bytes Arrow IPC
writes of them depend only on their rows, which is what the ``arrow`` codec digests.

Kernels and slices leave a column laid out by how it was made: chunks, offsets into a
longer column, validity bits past its end, and whatever lies under a null (a filter or
``if_else`` leaves what it found there). IPC writes what it finds, so equal rows would
digest apart by their history. :func:`canonical` lays them out one way: no validity bitmap
on a column with no nulls and no bits set past a column's end; zeros under the nulls of a
column of numbers, booleans, decimals, intervals or fixed-size binary; no bytes under those
of a column of strings; no items under those of a list or a map; nulls in a struct's
children (or a fixed-size list's items) under its own, a null of a union's first child; a
sparse union's children null in the rows another child holds; a dense union's children
the values of its rows in their order, and a list view's items those of its rows; a
run-end-encoded column with only the runs of its rows, a run split at a chunk's end joined
again. Rows of run-end-encoded columns and views, which Arrow does not take, are picked
child by child (:func:`pick_rows`), runs by their runs. Dictionaries (with their whole
dictionary), dense unions whose rows share a value and list views whose views overlap, at
any depth, are kept as they are, and the runs of nested values picked row by row are not
joined again: they digest apart from the same rows laid out otherwise (a cache miss,
never a wrong answer).
"""

from __future__ import annotations

import struct
from typing import Any

import pyarrow
import pyarrow.compute

try:  # offsets and validity bits are worked out over their buffers at once with numpy
    import numpy
except ImportError:  # pragma: no cover - pyarrow from 16 on runs without it
    numpy = None  # type: ignore[assignment]

__all__ = ["canonical"]


def canonical(table: Any) -> Any:
    """``table`` (a Table of one chunk per column, or a RecordBatch) with each column laid out
    one way, as the module says: equal rows, equal IPC bytes."""
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
    if pyarrow.types.is_union(kind):
        return _dense_bare(column)
    if _is_list_view(kind):
        return _views_bare(column)
    if column.null_count and _in_slots(kind):
        column = _nulls_cleared(column)
    elif _nests(kind):
        return _nested_bare(column)
    elif column.null_count and _of_bytes(kind):
        column = _bytes_cleared(column)
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
    buffers = column.buffers()
    length = len(column)
    layout = _offsets_layout(column.type)
    if layout is None:
        try:
            width = column.type.bit_width
        except ValueError:  # of no fixed width
            return False
        data = buffers[1] if len(buffers) > 1 else None
        return bool(width % 8 == 0 and data is not None and data.size > length * width // 8)
    offsets, data = buffers[1], buffers[2]
    if offsets is None:
        return False
    first, last = _row_span(column, layout)
    held = 0 if data is None else data.size
    return bool(offsets.size > (length + 1) * struct.calcsize(layout) or first != 0 or held > last)


def _offsets_layout(kind: pyarrow.DataType) -> str | None:
    """How ``kind`` stores its offsets (a :mod:`struct` layout): 32 bits for strings, binary
    and lists, 64 for their large kinds; None for any other type (a map's are not read)."""
    types = pyarrow.types
    if types.is_string(kind) or types.is_binary(kind) or types.is_list(kind):
        return "<i"
    if types.is_large_string(kind) or types.is_large_binary(kind) or types.is_large_list(kind):
        return "<q"
    return None


def _row_span(column: Any, layout: str) -> tuple[int, int]:
    """The first and the last offset of ``column``'s rows (its offsets stored as
    ``layout``): the bytes or items of its rows lie between them."""
    offsets = column.buffers()[1]
    width = struct.calcsize(layout)
    first = struct.unpack_from(layout, offsets, column.offset * width)[0]
    last = struct.unpack_from(layout, offsets, (column.offset + len(column)) * width)[0]
    return int(first), int(last)


def _taken(column: Any, rows: pyarrow.Array) -> pyarrow.Array:
    """``column.take(rows)``, or ``column`` as it is (from its first row) when its rows are
    not picked (see :func:`pick_rows`): what lies under its nulls then stays, which digests it
    apart from the same rows laid out afresh (a miss, never a wrong answer)."""
    taken = pick_rows(column, rows)
    return pyarrow.concat_arrays([column]) if taken is None else taken


def pick_rows(column: Any, rows: pyarrow.Array) -> pyarrow.Array | None:
    """``column.take(rows)`` (row numbers, a null one taking a null) or
    ``column.filter(rows)`` (booleans, maybe run-end-encoded), the rows laid out afresh. Of a
    type Arrow takes rows of, Arrow's own; of views (at any depth) through strings and
    binary; of one holding what Arrow takes no rows of (run-end-encoded columns, views in a
    union, a dictionary or a list view) or a dense union below it, child by child
    (:func:`_picked_within`). None when a dense union's rows share a value (taking them would
    copy it once per row) or a list view's views overlap, or for a fixed-size list of no
    items holding such a column."""
    pick = pyarrow.Array.take if pyarrow.types.is_integer(rows.type) else _filtered
    kind = column.type
    if _takes(kind) and not _holds_dense(kind):
        return pick(column, rows)
    plain = _unviewed(kind)
    if plain is not None and plain != kind:  # views, at any depth: as strings and binary
        try:
            return pick(column.cast(plain), rows).cast(kind)
        except (pyarrow.ArrowNotImplementedError, pyarrow.ArrowInvalid):  # a cast Arrow lacks
            pass
    if type_test("is_run_end_encoded")(kind):
        if numpy is not None:
            integer = pyarrow.types.is_integer(rows.type)
            return _runs_taken(column, rows) if integer else _runs_filtered(column, rows)
        try:
            values = pick_rows(pyarrow.compute.run_end_decode(column), rows)
            if values is None:
                return None
            return pyarrow.compute.run_end_encode(values, run_end_type=kind.run_end_type)
        except pyarrow.ArrowNotImplementedError:  # values Arrow decodes or encodes no runs of
            return None
    return _picked_within(column, rows)


def _holds_dense(kind: pyarrow.DataType) -> bool:
    """Whether ``kind`` is or holds (at any depth) a dense union: Arrow takes rows of one by
    copying each row's value, once per row that points at it."""
    if isinstance(kind, pyarrow.BaseExtensionType):
        kind = kind.storage_type
    if pyarrow.types.is_dictionary(kind):
        return _holds_dense(kind.value_type)
    if pyarrow.types.is_union(kind) and kind.mode == "dense":
        return True
    return any(_holds_dense(kind.field(i).type) for i in range(kind.num_fields))


def _picked_within(column: Any, rows: pyarrow.Array) -> pyarrow.Array | None:
    """:func:`pick_rows` of a nested ``column`` (or a dictionary, or an extension type) child
    by child: a struct's children by the same rows, a list's (a map's, a list view's) items
    by the items of the rows, worked out by taking the rows of a list of item numbers, a
    dictionary's indices. None where a child is (see :func:`pick_rows`)."""
    kind = column.type
    types = pyarrow.types
    pick = pyarrow.Array.take if types.is_integer(rows.type) else _filtered
    if isinstance(kind, pyarrow.BaseExtensionType):
        storage = pick_rows(column.storage, rows)
        return None if storage is None else pyarrow.ExtensionArray.from_storage(kind, storage)
    if types.is_dictionary(kind):
        indices = pick(column.indices, rows)
        return pyarrow.DictionaryArray.from_arrays(indices, column.dictionary, ordered=kind.ordered)
    if types.is_union(kind):
        return _union_picked(column, rows)
    valid = pick(pyarrow.compute.is_valid(column), rows).fill_null(False)
    mask = pyarrow.compute.invert(valid) if not pyarrow.compute.all(valid).as_py() else None
    if types.is_struct(kind):
        children = []
        for index in range(kind.num_fields):
            child = pick_rows(column.field(index), rows)
            if child is None:
                return None
            children.append(child)
        fields = [kind.field(i) for i in range(kind.num_fields)]
        return pyarrow.StructArray.from_arrays(children, fields=fields, mask=mask)
    if types.is_fixed_size_list(kind):
        return _fixed_picked(column, _row_numbers(rows), valid, mask)
    if _is_list_view(kind) or _nests(kind):
        return _lists_picked(column, rows, pick, mask)
    return None


def _row_numbers(rows: pyarrow.Array) -> pyarrow.Array:
    """``rows`` as row numbers: themselves, or those of the true ones of booleans."""
    if pyarrow.types.is_integer(rows.type):
        return rows.cast(pyarrow.int64())
    if type_test("is_run_end_encoded")(rows.type):
        rows = pyarrow.compute.run_end_decode(rows)
    return pyarrow.compute.indices_nonzero(rows).cast(pyarrow.int64())


def _lists_picked(column: Any, rows: pyarrow.Array, pick: Any, mask: Any) -> Any:
    """:func:`_picked_within` of a list, a large list, a map or a list view: the rows of a
    column laid out as ``column`` is with the numbers of its items for items, taken by
    Arrow, say which items to pick, and their sizes the new offsets."""
    kind = column.type
    large = _offsets_layout(kind) == "<q" or type_test("is_large_list_view")(kind)
    view = _is_list_view(kind)
    numbers = pyarrow.field("item", pyarrow.int64())
    if view:
        made = pyarrow.large_list_view(numbers) if large else pyarrow.list_view(numbers)
    else:
        made = pyarrow.large_list(numbers) if large else pyarrow.list_(numbers)
    values = column.values
    buffers = column.buffers()[: 3 if view else 2]
    items = pyarrow.Array.from_buffers(
        made, len(column), buffers, column.null_count, column.offset, [numbers_below(len(values))]
    )
    taken = pick(items, rows)
    sizes = pyarrow.compute.list_value_length(taken).fill_null(0).cast(pyarrow.int64())
    total = pyarrow.compute.sum(sizes).as_py() or 0
    if view and (total > len(values) or (not large and total > _MOST_INT32)):
        return None  # overlapping views, their items held once per view of them
    picked = pick_rows(values, pyarrow.compute.list_flatten(taken))
    if picked is None:
        return None
    width = pyarrow.int64() if large else pyarrow.int32()
    through = pyarrow.compute.cumulative_sum(sizes).cast(width)
    if view:
        before = pyarrow.compute.subtract(through, sizes.cast(width))
        return type(column).from_arrays(before, sizes.cast(width), picked, type=kind, mask=mask)
    offsets = pyarrow.concat_arrays([pyarrow.array([0], width), through])
    return _listed(kind, offsets, picked, mask)


def _fixed_picked(column: Any, rows: pyarrow.Array, valid: Any, mask: Any) -> Any:
    """:func:`_picked_within` of a fixed-size list at row numbers ``rows``: the items of
    each row (null under a null row), ``valid`` and ``mask`` those of the rows."""
    kind = column.type
    size = kind.list_size
    if not size:
        return None  # no items, and Arrow builds no such list from its items
    places = numbers_below(len(rows) * size)
    at = pyarrow.compute.divide(places, size)  # which row each item is of
    within = pyarrow.compute.subtract(places, pyarrow.compute.multiply(at, size))
    start = pyarrow.compute.multiply(rows.take(at), size)
    items = pyarrow.compute.add(pyarrow.compute.add(start, within), column.offset * size)
    items = pyarrow.compute.if_else(valid.take(at), items, None)
    values = pick_rows(column.values, items)
    if values is None:
        return None
    return pyarrow.FixedSizeListArray.from_arrays(values, type=kind, mask=mask)


def _union_picked(column: Any, rows: pyarrow.Array) -> pyarrow.Array | None:
    """:func:`_picked_within` of a union: its type codes taken (a null row a null of its
    first child, as Arrow takes it), a sparse union's children by the same rows, a dense
    union's by the offsets of the rows of each. None for a dense union whose rows share a
    value."""
    kind = column.type
    pick = pyarrow.Array.take if pyarrow.types.is_integer(rows.type) else _filtered
    if kind.mode == "dense":
        if _dense_shares(column):
            return None
        codes, offsets = _codes_and_offsets(column)
        offsets = pick(offsets, rows)
    else:
        column = pyarrow.concat_arrays([column])  # its type codes from its first row
        codes = column.type_codes
    first = pyarrow.scalar(kind.type_codes[0], pyarrow.int8())
    codes = pyarrow.concat_arrays([pick(codes, rows).fill_null(first)])
    children = []
    counted = pyarrow.nulls(len(codes), pyarrow.int32()).fill_null(0)
    for index, code in enumerate(kind.type_codes):
        if kind.mode != "dense":
            child = pick_rows(column.field(index), rows)
        else:
            held = pyarrow.compute.equal(codes, pyarrow.scalar(code, pyarrow.int8()))
            child = pick_rows(column.field(index), offsets.filter(held))
            through = pyarrow.compute.cumulative_sum(held.cast(pyarrow.int32()))
            before = pyarrow.compute.subtract(through, pyarrow.scalar(1, pyarrow.int32()))
            counted = pyarrow.compute.if_else(held, before, counted)
        if child is None:
            return None
        children.append(child)
    buffers = [None, codes.buffers()[1]]
    if kind.mode == "dense":
        buffers.append(pyarrow.concat_arrays([counted.cast(pyarrow.int32())]).buffers()[1])
    return pyarrow.Array.from_buffers(kind, len(codes), buffers, children=children)


def _runs_filtered(column: Any, kept: pyarrow.Array) -> pyarrow.Array | None:
    """Run-end-encoded ``column`` filtered by ``kept`` (booleans, maybe run-end-encoded) by
    its runs, never decoded: the runs of both split where either ends, those kept counted
    again. Runs it splits that :func:`_runs` joins again."""
    kind = column.type
    if not type_test("is_run_end_encoded")(kept.type):
        kept = pyarrow.compute.run_end_encode(kept)
    ends, values = _run_ends(column)
    kept_ends, kept_values = _run_ends(kept)
    every = _merged(ends, kept_ends)
    which = numpy.searchsorted(ends, every)  # the run of ``column`` each piece is of
    held = numpy.asarray(kept_values.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)[
        numpy.searchsorted(kept_ends, every)
    ]
    lengths = numpy.diff(every, prepend=0)[held]
    picked = pick_rows(values, pyarrow.array(which[held], pyarrow.int64()))
    if picked is None:
        return None
    stops = pyarrow.array(numpy.cumsum(lengths, dtype=numpy.int64)).cast(kind.run_end_type)
    return pyarrow.RunEndEncodedArray.from_arrays(stops, picked, type=kind)


def _runs_taken(column: Any, rows: pyarrow.Array) -> pyarrow.Array | None:
    """Run-end-encoded ``column`` at row numbers ``rows`` (a null one taking a null), never
    decoded: the value of each row's run, a run of one row each, which :func:`_runs` joins
    again where it can compare the values."""
    kind = column.type
    ends, values = _run_ends(column)
    numbers = rows.cast(pyarrow.int64())
    which = numpy.searchsorted(ends, numbers.fill_null(0).to_numpy(), side="right")
    runs = pyarrow.compute.if_else(numbers.is_valid(), pyarrow.array(which), None)
    picked = pick_rows(values, runs)
    if picked is None:
        return None
    stops = pyarrow.array(numpy.arange(1, len(rows) + 1, dtype=numpy.int64))
    return pyarrow.RunEndEncodedArray.from_arrays(stops.cast(kind.run_end_type), picked, type=kind)


def _merged(first: Any, second: Any) -> Any:
    """The numbers in either of ``first`` and ``second`` (numpy), sorted, each once:
    ``numpy.union1d``'s answer. Run ends come sorted, and a stable sort of two sorted runs
    one after the other merges them in one pass, where ``union1d`` sorts them afresh."""
    both = numpy.concatenate((first, second))
    both.sort(kind="stable")
    kept = numpy.empty(len(both), dtype=bool)
    kept[:1] = True
    numpy.not_equal(both[1:], both[:-1], out=kept[1:])
    return both[kept]


def _run_ends(column: Any) -> tuple[Any, pyarrow.Array]:
    """The ends of the runs of run-end-encoded ``column``'s rows (numpy, counted from its
    first row) and their values."""
    first, count = column.find_physical_offset(), column.find_physical_length()
    ends = column.run_ends.slice(first, count).to_numpy().astype(numpy.int64)
    ends = numpy.minimum(ends - column.offset, len(column))
    return ends, column.values.slice(first, count)


def _filtered(column: Any, kept: pyarrow.Array) -> pyarrow.Array:
    """``column.filter(kept)``, ``kept`` booleans or runs of them (run-end-encoded: copied by
    the run, where Arrow filters by runs; else decoded first)."""
    try:
        return column.filter(kept)
    except pyarrow.ArrowNotImplementedError:
        if not type_test("is_run_end_encoded")(kept.type):
            raise
        return column.filter(pyarrow.compute.run_end_decode(kept))


def _unviewed(kind: pyarrow.DataType) -> pyarrow.DataType | None:
    """``kind`` with its views (at any depth, in lists, maps and structs) made large strings
    or large binary, which Arrow takes rows of and casts to and from; None when it holds
    something else Arrow takes no rows of (run-end-encoded columns) or that is cast only as
    a whole (unions, dictionaries, extension types)."""
    types = pyarrow.types
    if _is_view(kind):
        return pyarrow.large_binary() if types.is_binary_view(kind) else pyarrow.large_string()
    if not kind.num_fields:
        return None if types.is_dictionary(kind) or _is_extension_or_runs(kind) else kind
    if types.is_union(kind) or _is_extension_or_runs(kind):
        return None
    fields = []
    for index in range(kind.num_fields):
        field = kind.field(index)
        inner = _unviewed(field.type)
        if inner is None:
            return None
        fields.append(field.with_type(inner))
    return rebuilt(kind, fields)


def rebuilt(kind: pyarrow.DataType, fields: list[pyarrow.Field]) -> pyarrow.DataType | None:
    """A type like nested ``kind`` (a struct, a union, a map, a list of any kind, or
    run-end-encoded) with ``fields`` for its children's; None for a type of none of these."""
    types = pyarrow.types
    if types.is_struct(kind):
        return pyarrow.struct(fields)
    if types.is_union(kind):
        return pyarrow.union(fields, kind.mode, list(kind.type_codes))
    if types.is_map(kind):
        entries = fields[0].type
        return pyarrow.map_(entries.field(0), entries.field(1), keys_sorted=kind.keys_sorted)
    if types.is_fixed_size_list(kind):
        return pyarrow.list_(fields[0], kind.list_size)
    if type_test("is_run_end_encoded")(kind):
        return pyarrow.run_end_encoded(kind.run_end_type, fields[1].type)
    made = {
        types.is_list: pyarrow.list_,
        types.is_large_list: pyarrow.large_list,
        type_test("is_list_view"): getattr(pyarrow, "list_view", None),
        type_test("is_large_list_view"): getattr(pyarrow, "large_list_view", None),
    }
    for test, make in made.items():
        if make is not None and test(kind):
            return make(fields[0])
    return None


def type_test(name: str) -> Any:
    """``pyarrow.types.<name>``, or a test no type passes on an Arrow without it."""
    return getattr(pyarrow.types, name, lambda _: False)


def _is_extension_or_runs(kind: pyarrow.DataType) -> bool:
    """Whether ``kind`` is an extension type or run-end-encoded."""
    return isinstance(kind, pyarrow.BaseExtensionType) or type_test("is_run_end_encoded")(kind)


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


def numbers_below(count: int) -> pyarrow.Array:
    """The row numbers ``0 .. count - 1``, made by numpy or by Arrow (a Python ``range`` is
    slow)."""
    if numpy is not None:
        return pyarrow.array(numpy.arange(count, dtype=numpy.int64))
    every = pyarrow.compute.indices_nonzero(pyarrow.nulls(count, pyarrow.bool_()).fill_null(True))
    return every.cast(pyarrow.int64())


def _in_slots(kind: pyarrow.DataType) -> bool:
    """Whether ``kind`` holds one value of a fixed width per row, in a slot that is there
    under a null too: integers, floats, dates, times, timestamps, durations, booleans,
    decimals, fixed-size binary and intervals."""
    types = pyarrow.types
    return bool(
        types.is_integer(kind)
        or _plain_number(kind)
        or types.is_boolean(kind)
        or types.is_decimal(kind)
        or types.is_fixed_size_binary(kind)
        or types.is_interval(kind)
    )


def _of_bytes(kind: pyarrow.DataType) -> bool:
    """Whether ``kind`` is strings or binary, whose nulls may span bytes that taking its rows
    (one copy) leaves out."""
    types = pyarrow.types
    return bool(
        types.is_string(kind)
        or types.is_binary(kind)
        or types.is_large_string(kind)
        or types.is_large_binary(kind)
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
    under its nulls: a struct's children null where it is, a list's items those of its
    valid rows (worked out over its offsets and validity bits at once), so a null row spans
    no items (whatever it spanned before, as a kernel may leave it) and the items are only
    those of its rows. Two columns equal by value have one layout, at any depth."""
    kind = column.type
    mask = column.is_null() if column.null_count else None
    if pyarrow.types.is_struct(kind) and not kind.num_fields:
        return pyarrow.concat_arrays([column])  # no children, and none tell its length
    if pyarrow.types.is_struct(kind):
        children = [_bare(child) for child in _under_its_nulls(column, mask)]
        return pyarrow.StructArray.from_arrays(
            children, fields=[kind.field(i) for i in range(kind.num_fields)], mask=mask
        )
    if mask is not None and not pyarrow.types.is_fixed_size_list(kind):
        spanned = _spanned(column)
        if spanned is not None:  # its rows' items, those under its nulls left out
            kept, offsets, first = spanned
            values = pick_rows(column.values.slice(first, len(kept)), kept)
            if values is not None:  # else as they are (a miss)
                return _listed(kind, offsets, _bare(values), mask)
    if mask is None or not pyarrow.types.is_fixed_size_list(kind):
        column = pyarrow.concat_arrays([column])  # from its first row, items only its own
    else:
        column = _taken(column, numbers_below(len(column)))
    if pyarrow.types.is_fixed_size_list(kind):
        size = kind.list_size
        if not size:  # no items at all (and Arrow builds no such list from its items)
            return column
        values = column.values
        if mask is not None:  # its items under a null made null, as a struct's children are
            items = numbers_below(len(values))
            rows = pyarrow.compute.divide(items, size)
            kept = pyarrow.compute.is_valid(column).take(rows)
            values = _taken(values, pyarrow.compute.if_else(kept, items, None))
        return pyarrow.FixedSizeListArray.from_arrays(_bare(values), type=kind, mask=mask)
    return _listed(kind, column.offsets, _bare(column.values), mask)


def _listed(
    kind: pyarrow.DataType, offsets: pyarrow.Array, values: pyarrow.Array, mask: Any
) -> pyarrow.Array:
    """A column of lists, large lists or maps of ``kind``: ``offsets`` into ``values``,
    null where ``mask`` is true."""
    if pyarrow.types.is_map(kind):
        return pyarrow.MapArray.from_arrays(
            offsets, values.field(0), values.field(1), type=kind, mask=mask
        )
    made = pyarrow.LargeListArray if pyarrow.types.is_large_list(kind) else pyarrow.ListArray
    return made.from_arrays(offsets, values, type=kind, mask=mask)


def _bytes_cleared(column: Any) -> pyarrow.Array:
    """Strings or binary ``column`` (with nulls) with no bytes under its nulls: the bytes of
    its rows only, a null spanning none. A kernel may leave a null's slot spanning what it
    spanned before (``if_else`` does). Its offsets and bytes are worked out over its buffers
    at once, in a few passes, where taking its rows would copy them one by one."""
    spanned = _spanned(column)
    if spanned is None:
        return column
    kept, offsets, first = spanned
    data = _filtered(
        pyarrow.Array.from_buffers(
            pyarrow.uint8(), len(kept), [None, column.buffers()[2]], 0, first
        ),
        kept,
    )
    valid = pyarrow.compute.is_valid(column)  # a fresh bitmap
    if valid.offset:  # from its first row
        valid = pyarrow.concat_arrays([valid])
    buffers = [valid.buffers()[1], offsets.buffers()[1], data.buffers()[1]]
    return pyarrow.Array.from_buffers(column.type, len(column), buffers, column.null_count)


def _spanned(column: Any) -> tuple[pyarrow.Array, pyarrow.Array, int] | None:
    """For ``column`` (strings, binary, lists, large lists or maps, with nulls) whose nulls
    span some bytes or items: which of the bytes or items its rows span are a valid row's
    (run-end-encoded, a run of them for each run of valid or null rows),
    its offsets laid out afresh (each null spanning nothing), and where the bytes or items
    of its first row start. None when its nulls span nothing. Worked out over its offsets
    and validity bits at once: with numpy by runs of valid or null rows, else with Arrow's
    kernels (slower, the same answer)."""
    kind = column.type
    length = len(column)
    wide = _offsets_layout(kind) == "<q"
    width = pyarrow.int64() if wide else pyarrow.int32()
    buffer = column.buffers()[1]
    if numpy is None:
        return _spanned_by_arrow(column, width)
    layout = numpy.int64 if wide else numpy.int32
    at = column.offset * numpy.dtype(layout).itemsize
    offsets = numpy.frombuffer(buffer, layout, length + 1, at)
    bits = numpy.frombuffer(column.buffers()[0], numpy.uint8)
    start = column.offset
    valid = numpy.unpackbits(bits, count=start + length, bitorder="little")[start:].view(bool)
    turns = numpy.flatnonzero(valid[1:] != valid[:-1]) + 1
    starts = numpy.concatenate(([0], turns))
    ends = numpy.concatenate((turns, [length]))
    held = valid[starts]
    spans = offsets[ends] - offsets[starts]  # what each run of valid or null rows spans
    if not spans[~held].any():
        return None
    some = spans > 0  # runs of rows that span something, as runs of bytes or items
    stops = (offsets[ends] - offsets[0])[some]
    kept_rows = pyarrow.RunEndEncodedArray.from_arrays(
        pyarrow.array(stops.astype(numpy.int64)), pyarrow.array(held[some])
    )
    sizes = numpy.diff(offsets)
    sizes *= valid  # a null spans nothing
    fresh = numpy.zeros(length + 1, layout)
    numpy.cumsum(sizes, out=fresh[1:])
    return kept_rows, pyarrow.array(fresh), int(offsets[0])


def _spanned_by_arrow(
    column: Any, width: pyarrow.DataType
) -> tuple[pyarrow.Array, pyarrow.Array, int] | None:
    """:func:`_spanned` with Arrow's kernels alone, its offsets of ``width``: which bytes or
    items are a valid row's, a run of them for each row that spans some."""
    length = len(column)
    offsets = pyarrow.Array.from_buffers(
        width, length + 1, [None, column.buffers()[1]], 0, column.offset
    )
    first, last = offsets[0].as_py(), offsets[length].as_py()
    valid = pyarrow.compute.is_valid(column)
    spans = pyarrow.compute.subtract(offsets.slice(1), offsets.slice(0, length))
    sizes = pyarrow.compute.if_else(valid, spans, pyarrow.scalar(0, width))
    through = pyarrow.compute.cumulative_sum(sizes).cast(width)
    if (through[length - 1].as_py() if length else 0) == last - first:
        return None
    fresh = pyarrow.concat_arrays([pyarrow.array([0], width), through])
    spanning = pyarrow.compute.greater(spans, pyarrow.scalar(0, width))
    ends = pyarrow.compute.subtract(offsets.slice(1), pyarrow.scalar(first, width))
    runs = pyarrow.RunEndEncodedArray.from_arrays(ends.filter(spanning), valid.filter(spanning))
    return runs, fresh, first


def _under_its_nulls(column: Any, mask: pyarrow.Array | None) -> list[pyarrow.Array]:
    """The children of struct ``column`` (of its rows), null where it is (``mask``). A union
    or run-end-encoded child has no validity bits to take them (Arrow's ``flatten`` aborts
    the process on a union, and leaves the values of runs as they are): a union's rows under
    the struct's nulls are taken as null, which Arrow lays out as a null of its first child,
    and the runs of a run-end-encoded child split where the struct's nulls start and end,
    null under them. A union Arrow takes no rows of (see :func:`pick_rows`) is left as it
    is, so what lies in it under the struct's nulls stays (a miss, never a wrong answer)."""
    kind = column.type
    fields = [kind.field(i) for i in range(kind.num_fields)]
    children = [column.field(i) for i in range(kind.num_fields)]
    if mask is None:
        return children
    plain = [i for i, one in enumerate(fields) if not _unbitmapped(one.type)]
    if len(plain) == len(fields):
        return list(column.flatten())
    rows = pyarrow.compute.if_else(mask, None, numbers_below(len(column)))
    for at in sorted(set(range(len(fields))) - set(plain)):
        child = children[at]
        runs = type_test("is_run_end_encoded")(child.type) and numpy is not None
        children[at] = _runs_nulled(child, mask) if runs else _taken(child, rows)
    if plain:
        pushed = pyarrow.StructArray.from_arrays(
            [children[i] for i in plain], fields=[fields[i] for i in plain], mask=mask
        ).flatten()
        for at, child in zip(plain, pushed, strict=True):
            children[at] = child
    return children


def _unbitmapped(kind: pyarrow.DataType) -> bool:
    """Whether ``kind`` (or the storage of an extension type) has no validity bits of its
    own: a union or a run-end-encoded column."""
    if isinstance(kind, pyarrow.BaseExtensionType):
        kind = kind.storage_type
    return bool(pyarrow.types.is_union(kind) or type_test("is_run_end_encoded")(kind))


def _runs_nulled(column: Any, mask: pyarrow.Array) -> pyarrow.Array:
    """Run-end-encoded ``column`` null where ``mask`` is true, worked out by its runs and
    those of ``mask`` (never a value per row): its runs split where ``mask`` turns, the
    pieces under it null. :func:`_runs` joins again the pieces left equal. ``column`` as it
    is when the values of its pieces are not picked (see :func:`pick_rows`; a miss)."""
    ends, values = _run_ends(column)
    nulls = pyarrow.compute.run_end_encode(mask)
    null_ends, null_values = _run_ends(nulls)
    every = _merged(ends, null_ends)
    which = pyarrow.array(numpy.searchsorted(ends, every), pyarrow.int64())
    hidden = numpy.asarray(null_values.fill_null(True).to_numpy(zero_copy_only=False), dtype=bool)[
        numpy.searchsorted(null_ends, every)
    ]
    picked = pick_rows(values, pyarrow.compute.if_else(pyarrow.array(hidden), None, which))
    if picked is None:  # its values as they are hold no value per piece: kept whole
        return pyarrow.concat_arrays([column])
    stops = pyarrow.array(every.astype(numpy.int64)).cast(column.type.run_end_type)
    return pyarrow.RunEndEncodedArray.from_arrays(stops, picked, type=column.type)


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
    rows = numbers_below(len(column))
    children = []
    for index, code in enumerate(kind.type_codes):
        held = pyarrow.compute.equal(codes, pyarrow.scalar(code, codes.type))
        children.append(
            _bare(_taken(column.field(index), pyarrow.compute.if_else(held, rows, None)))
        )
    return pyarrow.Array.from_buffers(
        kind, len(column), [None, codes.buffers()[1]], children=children
    )


def _dense_bare(column: Any) -> pyarrow.Array:
    """Dense union ``column`` laid out as one built afresh: each child holds the values of
    its rows in their order, bare, and nothing else, and each row's offset counts the rows
    of its child before it. A slice keeps its children whole, and offsets may point
    anywhere or skip a value. A child holding what Arrow takes no rows of, or whose rows
    share a value or come out of order, keeps the column as it is (a miss, never a wrong
    answer): a value shared by many rows, held once per row, could be more than the
    column's memory many times over, or than its offsets count."""
    kind = column.type
    if _dense_shares(column):
        return pyarrow.concat_arrays([column])
    codes, offsets = _codes_and_offsets(column)
    counted = pyarrow.nulls(len(column), offsets.type).fill_null(0)
    children = []
    for index, code in enumerate(kind.type_codes):
        held = pyarrow.compute.equal(codes, pyarrow.scalar(code, codes.type))
        child = pick_rows(column.field(index), offsets.filter(held))
        if child is None:
            return pyarrow.concat_arrays([column])
        children.append(_bare(child))
        through = pyarrow.compute.cumulative_sum(held.cast(offsets.type))  # its rows so far
        before = pyarrow.compute.subtract(through, pyarrow.scalar(1, offsets.type))
        counted = pyarrow.compute.if_else(held, before, counted)
    codes = pyarrow.concat_arrays([codes])  # from their buffers' start
    counted = pyarrow.concat_arrays([counted.cast(offsets.type)])
    return pyarrow.Array.from_buffers(
        kind, len(column), [None, codes.buffers()[1], counted.buffers()[1]], children=children
    )


_MOST_INT32 = 2**31 - 1
"""The most items a list view's 32-bit offsets count."""


def _codes_and_offsets(column: Any) -> tuple[pyarrow.Array, pyarrow.Array]:
    """The type codes and the offsets of dense union ``column``'s rows."""
    _, codes, offsets = column.buffers()[:3]  # the arrays of them leave out the slice's offset
    return (
        pyarrow.Array.from_buffers(pyarrow.int8(), len(column), [None, codes], 0, column.offset),
        pyarrow.Array.from_buffers(pyarrow.int32(), len(column), [None, offsets], 0, column.offset),
    )


def _dense_shares(column: Any) -> bool:
    """Whether ``column`` is a dense union (or an extension type stored as one) whose rows
    point at a value of a child more than once, or out of order: taking its rows (as Arrow
    does, and as laying it out afresh does) copies such a value once per row, which could be
    more than the column's memory many times over, or than a child's offsets count."""
    if isinstance(column.type, pyarrow.BaseExtensionType):
        column = column.storage
    kind = column.type
    if not pyarrow.types.is_union(kind) or kind.mode != "dense" or len(column) < 2:
        return False
    codes, offsets = _codes_and_offsets(column)
    for code in kind.type_codes:
        rows = offsets.filter(pyarrow.compute.equal(codes, pyarrow.scalar(code, codes.type)))
        if len(rows) > 1:
            before, after = rows.slice(0, len(rows) - 1), rows.slice(1)
            if pyarrow.compute.any(pyarrow.compute.less_equal(after, before)).as_py():
                return True
    return False


def _views_bare(column: Any) -> pyarrow.Array:
    """List-view ``column`` laid out as one built afresh: its items those of its rows in
    their order, each row's offset the sizes of the rows before it (0 for a null or an empty
    row, of size 0, as joining columns lays them out). Views
    may overlap, come in any order, or span items under a null. Items Arrow takes no rows
    of, or views that together span more items than it holds (laid out one after another,
    they would take its memory many times over) or than its offsets (or theirs) count, keep
    the column as it is (a miss, never a wrong answer)."""
    kind = column.type
    large = pyarrow.types.is_large_list_view(kind)
    width = pyarrow.int64() if large else pyarrow.int32()
    sizes = pyarrow.compute.list_value_length(column).fill_null(0)
    total = pyarrow.compute.sum(sizes.cast(pyarrow.int64())).as_py() or 0
    if total > len(column.values) or (not large and total > _MOST_INT32):
        return pyarrow.concat_arrays([column])  # its items held once per view of them
    try:
        items = pyarrow.compute.list_flatten(column)
    except pyarrow.ArrowNotImplementedError:
        return pyarrow.concat_arrays([column])
    except pyarrow.ArrowInvalid:  # shared items whose own offsets overflow, laid out anew
        return pyarrow.concat_arrays([column])
    sizes = sizes.cast(width)
    before = pyarrow.compute.subtract(pyarrow.compute.cumulative_sum(sizes), sizes)
    empty = pyarrow.compute.equal(sizes, pyarrow.scalar(0, width))
    offsets = pyarrow.compute.if_else(empty, pyarrow.scalar(0, width), before)  # as Arrow joins
    mask = column.is_null() if column.null_count else None
    return type(column).from_arrays(offsets, sizes, _bare(items), type=kind, mask=mask)


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
    same = _same_as_next(values) if count > 1 else None
    if same is not None:
        last = pyarrow.concat_arrays([pyarrow.compute.invert(same), pyarrow.array([True])])
        joined = pick_rows(values, last)
        if joined is not None:
            ends, values = ends.filter(last), joined
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
    """``column`` (of a type :func:`_in_slots` names, with nulls) with zeros in the slots
    under its nulls. What a slot under a null holds says nothing of the rows, and kernels
    leave what they find there (a concatenation, a filter): written as it is, equal rows
    would digest apart by what memory held before. One pass over the values, where taking
    the rows would copy them one by one."""
    kind = column.type
    if pyarrow.types.is_boolean(kind):
        data = pyarrow.compute.fill_null(column, False)
    elif pyarrow.types.is_integer(kind) or _plain_number(kind):
        data = pyarrow.compute.fill_null(column.view(_AS_BITS[kind.bit_width]), 0)
    else:  # decimals, fixed-size binary, intervals: as many zero bytes as a slot holds
        slot = pyarrow.binary(kind.byte_width)
        data = pyarrow.compute.fill_null(
            column.view(slot), pyarrow.scalar(bytes(slot.byte_width), slot)
        )
    valid = pyarrow.compute.is_valid(column)
    if data.offset or valid.offset:  # fresh arrays start at their buffers' start
        data, valid = pyarrow.concat_arrays([data]), pyarrow.concat_arrays([valid])
    return pyarrow.Array.from_buffers(kind, len(column), [valid.buffers()[1], data.buffers()[1]])


def _same_as_next(values: pyarrow.Array) -> pyarrow.Array | None:
    """Whether each of ``values`` but the last is the one after it: both null, or equal bit
    for bit, as encoding compares them (a float ``-0.0`` is not ``0.0``, a NaN is itself).
    None for values that cannot be compared (nested ones): their runs stay as they are,
    which digests apart from the rows encoded afresh (a miss, never a wrong answer). An
    extension type's values are compared by their storage, and a dictionary's by their
    indices into the one dictionary they share: Arrow compares the entries, and ``0.0`` is
    ``-0.0`` to it, as a word the dictionary holds twice is to itself."""
    if isinstance(values.type, pyarrow.BaseExtensionType):
        values = values.storage
    if pyarrow.types.is_dictionary(values.type):
        values = values.indices
    if pyarrow.types.is_floating(values.type):
        values = values.view(_AS_BITS[values.type.bit_width])
    before, after = values.slice(0, len(values) - 1), values.slice(1)
    try:
        equal = pyarrow.compute.equal(before, after)
    except pyarrow.ArrowNotImplementedError:
        return None
    both_null = pyarrow.compute.and_(before.is_null(), after.is_null())
    return pyarrow.compute.or_(equal.fill_null(False), both_null)


def _is_list_view(kind: pyarrow.DataType) -> bool:
    """Whether ``kind`` is a list view or a large list view, on an Arrow that has them."""
    return any(
        getattr(pyarrow.types, name, lambda _: False)(kind)
        for name in ("is_list_view", "is_large_list_view")
    )


def _is_view(kind: pyarrow.DataType) -> bool:
    """Whether ``kind`` is a view type (``string_view``, ``binary_view``), on an Arrow that
    has them."""
    return any(
        getattr(pyarrow.types, name, lambda _: False)(kind)
        for name in ("is_string_view", "is_binary_view")
    )
