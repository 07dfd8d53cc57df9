"""Frames: the rows a source answers a span with.

A frame is an Arrow table underneath and is never copied to become one: it is
how rows travel between nodes, into a store and across to a worker (through the
``arrow`` codec, as Arrow IPC). It speaks three ways, so that nothing forces a
dataframe library on a node that has none:

- ``column(name)`` — plain Python values, for a node (or a worker) with no
  dataframe library in it;
- ``to_arrow()`` — the table itself, no copy;
- ``to_polars()`` — when polars is installed; it is not a dependency.

``len(frame)`` is how many rows came back. Fewer than the span asked for means
the dataset ended; none means the span began past its end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow
import pyarrow.compute

from somatize.data._canonical import numbers_below, pick_rows, type_test
from somatize.data.errors import DataError

__all__ = [
    "AmbiguousColumn",
    "Frame",
    "NoPolars",
    "NotArrow",
    "NotPlain",
    "UnknownColumn",
    "to_arrow",
]


def python_extensions(schema: pyarrow.Schema) -> list[str]:
    """The fields of ``schema``, at any depth, whose type is an extension type defined in
    Python (a ``pyarrow.ExtensionType`` registered in this process), each as
    ``field: extension name``. Such a type's values turn into Python by whatever code
    registered it, which may be ``pickle.load``: what is read from a store may have none.
    pyarrow's own extension types (``arrow.uuid``, ``arrow.fixed_shape_tensor`` ...) are
    not among them, nor is a field of a plain type — but one that carries the metadata
    naming an extension type other than pyarrow's own (``ARROW:extension:name``), which a
    reader where that name is registered reads as that type, is among them too."""
    found: list[str] = []

    def walk(kind: pyarrow.DataType, where: str, metadata: Any = None) -> None:
        named = (metadata or {}).get(b"ARROW:extension:name")
        if named is not None and not named.startswith(b"arrow."):
            found.append(f"`{where}`: {named.decode(errors='replace')} (named in its metadata)")
            return
        if isinstance(kind, pyarrow.ExtensionType):
            found.append(f"`{where}`: {kind.extension_name}")
            return
        if isinstance(kind, pyarrow.BaseExtensionType):
            walk(kind.storage_type, where)
        elif isinstance(kind, pyarrow.DictionaryType):
            walk(kind.index_type, where)
            walk(kind.value_type, where)
        else:
            for index in range(kind.num_fields):
                field = kind.field(index)
                walk(field.type, f"{where}.{field.name}", field.metadata)

    for field in schema:
        walk(field.type, field.name, field.metadata)
    return found


class AmbiguousColumn(DataError, ValueError):
    """A column name a table holds more than once, asked for by name (or the table handed to
    a source that reads columns by name)."""


def twice_named(table: pyarrow.Table | pyarrow.Schema) -> list[str]:
    """The column names ``table`` holds more than once, in order."""
    names = table.names if isinstance(table, pyarrow.Schema) else table.column_names
    seen: set[str] = set()
    twice: list[str] = []
    for name in names:
        if name in seen and name not in twice:
            twice.append(name)
        seen.add(name)
    return twice


def _ambiguous(twice: list[str], names: list[str]) -> AmbiguousColumn:
    others = [name for name in names if name not in twice]
    return AmbiguousColumn(
        f"this table has more than one column named {', '.join(f'`{n}`' for n in twice)}, "
        "so the name is ambiguous, and a frame has each column once. Rename them "
        "(`table.rename_columns([...])`)"
        + (f" or keep only the others (`table.select({others!r})`)" if others else "")
    )


class UnknownColumn(DataError, KeyError):
    """A column the frame does not have."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class NotArrow(DataError, TypeError):
    """A value that cannot be turned into an Arrow table."""


class NoPolars(DataError, ImportError):
    """``to_polars()`` was asked for and polars is not installed."""


class NotPlain(DataError, ValueError):
    """Values asked for as plain Python (``column``, ``rows``) that have none: a time or a
    duration to the nanosecond, or beyond the years 1 to 9999, which Python's ``datetime``
    and ``timedelta`` cannot hold, a time in a time zone Python cannot load, or an interval
    of months, days and nanoseconds."""


def _within(kind: pyarrow.DataType) -> Iterator[pyarrow.DataType]:
    """``kind`` and the type of every value its values hold, at any depth."""
    yield kind
    if isinstance(kind, pyarrow.BaseExtensionType):
        yield from _within(kind.storage_type)
    elif isinstance(kind, pyarrow.DictionaryType):
        yield from _within(kind.value_type)
    else:
        for index in range(kind.num_fields):
            yield from _within(kind.field(index).type)


def _holds(kind: pyarrow.DataType, test: Callable[[pyarrow.DataType], bool]) -> bool:
    """Whether values of type ``kind`` hold, at any depth, values of a type ``test`` says
    yes of."""
    return any(test(inner) for inner in _within(kind))


def _unknown_zones(kind: pyarrow.DataType) -> list[str]:
    """The time zones of the times ``kind`` holds, at any depth, that Python cannot load
    (a name its ``zoneinfo`` does not know, or any name where there is no time zone
    database), in order: pyarrow hands such a time over as Python's ``datetime`` in its
    zone, and fails for want of one, saying ``zoneinfo`` or ``pytz`` must be installed."""
    zones = {
        inner.tz
        for inner in _within(kind)
        if isinstance(inner, pyarrow.TimestampType) and inner.tz is not None
    }
    return sorted(zone for zone in zones if not _loads(zone))


def _loads(zone: str) -> bool:
    """Whether pyarrow hands a time in ``zone`` over as a Python ``datetime``: asked as it
    asks it, of one time, which loads the zone."""
    try:
        pyarrow.scalar(0, pyarrow.timestamp("s", tz=zone)).as_py()
    except (ValueError, LookupError):  # pytz, where it is installed, raises a KeyError
        return False
    return True


def _in_nanoseconds(kind: pyarrow.DataType) -> bool:
    """Whether ``kind`` is of times or durations counted in nanoseconds."""
    timed = isinstance(kind, (pyarrow.TimestampType, pyarrow.Time64Type, pyarrow.DurationType))
    return timed and kind.unit == "ns"


def _plain(values: pyarrow.Table | pyarrow.ChunkedArray, what: str) -> list[Any]:
    """``values`` as plain Python values; NotPlain when a time or duration among them is finer
    than a microsecond (pyarrow hands those over as pandas values, and only where pandas is
    installed), or beyond the years Python's ``datetime`` holds, or in a time zone Python
    cannot load, or when they hold intervals
    of months, days and nanoseconds (pyarrow hands those over as a ``MonthDayNano`` of its
    own, which no other process can unpickle)."""
    kinds = values.schema.types if isinstance(values, pyarrow.Table) else [values.type]
    if any(_holds(kind, pyarrow.types.is_interval) for kind in kinds):
        raise NotPlain(
            f"{what} holds intervals of months, days and nanoseconds, which have no plain "
            "Python value (a month is no fixed length of time): pyarrow hands over a "
            "`MonthDayNano` of its own, which no other process can read back. Read it "
            "through `to_arrow()`"
        )
    try:
        plain: list[Any] = values.to_pylist()
    except OverflowError:
        if not any(_holds(kind, pyarrow.types.is_temporal) for kind in kinds):
            raise
        raise NotPlain(
            f"{what} holds a time, date or duration beyond what Python's `datetime`, `date` "
            "and `timedelta` hold (the years 1 to 9999, durations under a billion days; a "
            'time written as the largest number, as some databases write "forever", is '
            "beyond them), so it has no "
            "plain Python value. Read it through `to_arrow()`, where it is the number Arrow "
            "holds"
        ) from None
    except (ValueError, LookupError) as error:  # pytz's unknown zone is a KeyError
        _refuse_unknown_zones(values, what)
        if isinstance(error, LookupError) or not any(_holds(k, _in_nanoseconds) for k in kinds):
            raise
        raise NotPlain(
            f"{what} holds a time or duration to the nanosecond, not a whole number of "
            "microseconds, and Python's `datetime` and `timedelta` count microseconds, so it "
            "has no plain Python value. "
            "Read it through `to_arrow()` (or `to_polars()`), or write it in microseconds "
            "(`column.cast(pyarrow.timestamp('us', tz=...))`)"
        ) from None
    return plain


def _refuse_unknown_zones(values: pyarrow.Table | pyarrow.ChunkedArray, what: str) -> None:
    """NotPlain where ``values`` hold times in a time zone Python cannot load
    (:func:`_unknown_zones`), naming the zones, and the columns holding them."""
    if isinstance(values, pyarrow.Table):
        held = {field.name: _unknown_zones(field.type) for field in values.schema}
        columns = [name for name, zones in held.items() if zones]
        if not columns:
            return
        unknown = sorted({zone for zones in held.values() for zone in zones})
        what = f"{what} ({_listed('column', columns)})"
    else:
        unknown = _unknown_zones(values.type)
        if not unknown:
            return
    raise NotPlain(
        f"{what} holds times in the {_listed('time zone', unknown)}, "
        "which Python cannot load: its `zoneinfo` knows no zone of that name, or finds no "
        "time zone database on this machine (`pip install tzdata`), so they have no plain "
        "Python value. Read them through `to_arrow()`, where they are the instants Arrow "
        "holds, or cast them to a zone Python knows "
        "(`column.cast(pyarrow.timestamp('us', tz='UTC'))`)"
    ) from None


def _listed(noun: str, names: list[str]) -> str:
    """``noun`` and ``names``, as a message lists them: "column `a`", "columns `a`, `b`"."""
    return f"{noun}{'s' if len(names) > 1 else ''} {', '.join(f'`{name}`' for name in names)}"


class Frame:
    """Rows, as an Arrow table. Build one from a ``pyarrow.Table`` or a
    ``pyarrow.RecordBatch``; sources build them for you."""

    __slots__ = ("_table",)

    def __init__(self, table: pyarrow.Table | pyarrow.RecordBatch) -> None:
        if isinstance(table, pyarrow.RecordBatch):
            table = pyarrow.Table.from_batches([table])
        if not isinstance(table, pyarrow.Table):
            raise NotArrow(
                f"a Frame holds an Arrow table, got a `{type(table).__name__}`: pass a "
                "`pyarrow.Table` or `pyarrow.RecordBatch`, or use `somatize.data.to_arrow(x)` "
                "to turn other tabular values into one"
            )
        self._table = table

    def __len__(self) -> int:
        return int(self._table.num_rows)

    @property
    def columns(self) -> list[str]:
        """The names of its columns, in order."""
        return list(self._table.column_names)

    @property
    def schema(self) -> pyarrow.Schema:
        """Its Arrow schema."""
        return self._table.schema

    def column(self, name: str) -> list[Any]:
        """Column ``name`` as plain Python values (str, int, float, None, lists ...)."""
        if name not in self._table.column_names:
            known = ", ".join(f"`{n}`" for n in self._table.column_names) or "none"
            raise UnknownColumn(
                f"this frame has no column `{name}`; it has {known}. A source that reads only "
                "some columns (`Parquet(..., columns=[...])`) hands on only those"
            )
        twice = twice_named(self._table)
        if name in twice:
            raise _ambiguous([name], self._table.column_names)
        return _plain(self._table.column(name), f"column `{name}`")

    def rows(self) -> Iterator[dict[str, Any]]:
        """Each row as a dict of plain Python values."""
        twice = twice_named(self._table)
        if twice:
            raise _ambiguous(twice, self._table.column_names)
        return iter(_plain(self._table, "this frame"))

    def to_arrow(self) -> pyarrow.Table:
        """The Arrow table underneath, not copied."""
        return self._table

    def to_polars(self) -> Any:
        """A ``polars.DataFrame`` of the rows (zero-copy where polars allows).
        :class:`NoPolars` when polars is not installed."""
        try:
            import polars
        except ImportError:
            raise NoPolars(
                "`to_polars()` needs polars, which is not installed here and is not a dependency "
                "of somatize: install its extra, `pip install 'somatize[polars]'` (or `pip "
                "install 'polars>=1.0'`), or use `to_arrow()` (Arrow, no copy) or "
                "`column(name)` (plain Python values)"
            ) from None
        return polars.from_arrow(self._table)

    def __eq__(self, other: object) -> bool:
        """Whether ``other`` is a frame of the same columns, of the same types, holding the
        same rows: a NaN is the same as a NaN in the same place (Arrow's ``equals`` calls
        such tables apart), however the rows are split into chunks."""
        if not isinstance(other, Frame):
            return NotImplemented
        mine, theirs = self._table, other._table
        if mine.equals(theirs):
            return True
        if mine.num_rows != theirs.num_rows or not mine.schema.equals(theirs.schema):
            return False
        return all(
            _same_values(one.combine_chunks(), two.combine_chunks())
            for one, two in zip(mine.columns, theirs.columns, strict=True)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Frame of {len(self)} rows: {', '.join(self.columns)}>"


def _same_values(one: pyarrow.Array, other: pyarrow.Array) -> bool:
    """Whether ``one`` and ``other``, of one type and length, hold the same values, a NaN at
    any depth the same as a NaN in the same place. Told by Arrow where no float is nested
    in their type; else compared in Arrow, part by part, down to the floats: a dictionary
    by its indices and its dictionary (as Arrow's ``equals`` compares it), runs by their
    rows, a union by which child holds each row and the rows each child holds, a struct by
    its fields, a list (a map is a list of its entries) by its lengths and its items. Never
    by their Python values, which are looser (``1 == 1.0``) and which a time to the
    nanosecond has none of."""
    if one.equals(other):
        return True
    kind = one.type
    if not _holds(kind, pyarrow.types.is_floating):
        return False
    if pyarrow.types.is_float16(kind):  # which Arrow compares not: as floats of 32 bits
        return _same_values(one.cast(pyarrow.float32()), other.cast(pyarrow.float32()))
    if isinstance(kind, pyarrow.BaseExtensionType):
        return _same_values(one.storage, other.storage)
    if pyarrow.types.is_dictionary(kind):  # its dictionary is part of it, as to `equals`
        same_indices = one.indices.equals(other.indices)
        return bool(same_indices) and _same_values(one.dictionary, other.dictionary)
    if type_test("is_run_end_encoded")(kind):
        return _same_values(_decoded(one), _decoded(other))
    if pyarrow.types.is_union(kind):  # which has no nulls of its own: its children hold them
        return _same_union(one, other)
    if not pyarrow.compute.is_null(one).equals(pyarrow.compute.is_null(other)):
        return False
    if pyarrow.types.is_floating(kind):  # equal where not null, or NaN in both
        nans = pyarrow.compute.and_(pyarrow.compute.is_nan(one), pyarrow.compute.is_nan(other))
        same = pyarrow.compute.or_(pyarrow.compute.equal(one, other), nans)
        return bool(pyarrow.compute.all(same.fill_null(True)).as_py())
    if pyarrow.types.is_struct(kind):  # its fields where it is not null
        return _same_fields(one, other)
    if pyarrow.types.is_map(kind):
        one, other = _entries(one), _entries(other)
    lengths = pyarrow.compute.list_value_length  # of a list of any kind: all that is left
    return bool(lengths(one).equals(lengths(other))) and _same_values(
        one.flatten(), other.flatten()
    )


def _same_union(one: pyarrow.Array, other: pyarrow.Array) -> bool:
    """:func:`_same_values` of two unions: the same child holds each row in both, and each
    child's rows (not those it holds in the rows of another child, for a sparse union, nor
    values no row points at, for a dense one) are the same."""
    kind = one.type
    # from their first row: the type codes and offsets of a slice may leave out where it starts
    one, other = pyarrow.concat_arrays([one]), pyarrow.concat_arrays([other])
    codes = one.type_codes
    if not codes.equals(other.type_codes):
        return False
    for index, code in enumerate(kind.type_codes):
        held = pyarrow.compute.equal(codes, pyarrow.scalar(code, codes.type))
        if kind.mode == "dense":
            mine = _rows_of(one.field(index), one.offsets.filter(held))
            yours = _rows_of(other.field(index), other.offsets.filter(held))
        else:
            mine, yours = _rows_of(one.field(index), held), _rows_of(other.field(index), held)
        if not _same_values(mine, yours):
            return False
    return True


def _same_fields(one: pyarrow.Array, other: pyarrow.Array) -> bool:
    """:func:`_same_values` of two structs null in the same rows: their fields' values in
    the other rows. Picked, not flattened: Arrow's ``flatten`` aborts the process on a
    union field of a struct with nulls."""
    valid = pyarrow.compute.is_valid(one) if one.null_count else None
    for index in range(one.type.num_fields):
        mine, yours = one.field(index), other.field(index)
        if valid is not None:
            mine, yours = _rows_of(mine, valid), _rows_of(yours, valid)
        if not _same_values(mine, yours):
            return False
    return True


def _rows_of(column: pyarrow.Array, rows: pyarrow.Array) -> pyarrow.Array:
    """The rows of ``column`` at ``rows`` (row numbers, or booleans keeping them), of any
    type: picked as the ``arrow`` codec lays rows out, or by Arrow where that picks none (a
    dense union whose rows share a value, list views that overlap)."""
    picked = pick_rows(column, rows)
    if picked is not None:
        return picked
    return column.take(rows) if pyarrow.types.is_integer(rows.type) else column.filter(rows)


def _decoded(runs: pyarrow.Array) -> pyarrow.Array:
    """Run-end-encoded ``runs`` as the value of each row: decoded by Arrow or, of values it
    decodes none of (a union, a dictionary), picked by the run each row is in (the numbers
    of the runs, so encoded, decoded)."""
    try:
        return pyarrow.compute.run_end_decode(runs)
    except pyarrow.ArrowNotImplementedError:
        numbers = numbers_below(len(runs.values))
        numbered = pyarrow.RunEndEncodedArray.from_arrays(runs.run_ends, numbers)
        which = pyarrow.compute.run_end_decode(numbered.slice(runs.offset, len(runs)))
        return _rows_of(runs.values, which)


def _entries(column: pyarrow.Array) -> pyarrow.Array:
    """Map ``column`` as the list of its entries (a struct of a key and a value) it is laid
    out as, so that it is compared as a list is."""
    entries = pyarrow.list_(column.type.field(0))
    return pyarrow.Array.from_buffers(
        entries,
        len(column),
        column.buffers()[:2],  # its validity bits and its offsets
        column.null_count,
        column.offset,
        [column.values],
    )


def _polars_objects(x: Any) -> list[str]:
    """The columns of ``x``, when it is a polars frame, of polars' ``Object`` type (which
    polars nests in no other)."""
    if not type(x).__module__.startswith("polars."):
        return []
    import polars

    schema = getattr(x, "schema", None)
    if not isinstance(schema, Mapping):
        return []
    return [name for name, kind in schema.items() if kind == polars.Object]


def to_arrow(x: Any) -> pyarrow.Table:
    """``x`` as a ``pyarrow.Table``: a Frame's own table, a table as is, a record batch
    as a one-batch table, or anything that exports the Arrow C stream interface (a
    polars or pandas frame, with no copy where it allows). :class:`NotArrow` otherwise."""
    if isinstance(x, Frame):
        return x.to_arrow()
    if isinstance(x, pyarrow.Table):
        return x
    if isinstance(x, pyarrow.RecordBatch):
        return pyarrow.Table.from_batches([x])
    if hasattr(x, "__arrow_c_stream__") or hasattr(x, "__arrow_c_array__"):
        objects = _polars_objects(x)
        if objects:
            raise NotArrow(
                f"column {', '.join(f'`{name}`' for name in objects)} of this polars frame holds "
                "Python objects (polars' `Object` type), which polars hands to Arrow as their "
                "addresses in memory, not their values: rows read so would be those addresses, "
                "and other objects at the same addresses would be taken for the same rows. "
                "Turn the column into values Arrow holds (numbers, text, lists, bytes) first"
            )
        try:
            return pyarrow.table(x)
        except (pyarrow.ArrowException, TypeError, ValueError) as why:
            raise NotArrow(
                f"a `{type(x).__module__}.{type(x).__qualname__}` exports Arrow data that is "
                f"not a table ({why}): `to_arrow` takes rows of named columns — a frame, not "
                "one column or array. Make a table of it first, e.g. `pyarrow.table({'x': "
                "column})`"
            ) from None
    raise NotArrow(
        f"cannot turn a `{type(x).__module__}.{type(x).__qualname__}` into an Arrow table: "
        "`to_arrow` takes a Frame, a pyarrow Table or RecordBatch, or an object that exports "
        "the Arrow C stream interface (polars, pandas >= 2.2). Build a table with "
        "`pyarrow.table({...})` first"
    )
