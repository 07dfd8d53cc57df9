"""Frames: Arrow underneath, plain values out, polars optional."""

from __future__ import annotations

import datetime
import sys
from typing import Any

import numpy
import pyarrow
import pytest

from somatize.data import (
    ArrowCodec,
    Frame,
    NoPolars,
    NotArrow,
    NotPlain,
    Table,
    UnknownColumn,
    to_arrow,
)
from tests.forked import answer_of, forked, needs_fork


def _table() -> pyarrow.Table:
    return pyarrow.table({"sms": ["ok later", "win cash", None], "label": [0, 1, 0]})


def test_columns_are_plain_python_values() -> None:
    """column() hands over lists of str/int/None, which a worker with no dataframe library reads."""
    frame = Frame(_table())
    assert len(frame) == 3
    assert frame.columns == ["sms", "label"]
    assert frame.column("sms") == ["ok later", "win cash", None]
    assert [type(v) for v in frame.column("label")] == [int, int, int]
    assert list(frame.rows())[1] == {"sms": "win cash", "label": 1}


def test_an_unknown_column_names_the_ones_there() -> None:
    """Asking for a column the frame lacks is a KeyError that lists its columns."""
    with pytest.raises(UnknownColumn, match="no column `text`; it has `sms`, `label`") as refused:
        Frame(_table()).column("text")
    assert isinstance(refused.value, KeyError)


@pytest.mark.parametrize(
    "column",
    [
        pyarrow.array([1_000, 1_001], pyarrow.timestamp("ns", tz="Europe/Paris")),
        pyarrow.array([[1_000, 1_001]], pyarrow.list_(pyarrow.duration("ns"))),
        pyarrow.array([1_001], pyarrow.time64("ns")),
    ],
)
def test_a_time_finer_than_a_microsecond_is_refused_as_plain_values_saying_how_to_read_it(
    column: pyarrow.Array,
) -> None:
    """A time or duration to the nanosecond, at any depth, has no plain Python value
    (``datetime`` counts microseconds): column() and rows() refuse it, saying to read it
    through Arrow, rather than fail telling to install pandas; the same column in whole
    microseconds is read."""
    frame = Frame(pyarrow.table({"t": column, "n": list(range(len(column)))}))
    with pytest.raises(
        NotPlain, match=r"column `t` holds a time or duration to the nano.*to_arrow"
    ):
        frame.column("t")
    with pytest.raises(NotPlain, match=r"this frame holds a time or duration to the nano"):
        list(frame.rows())
    assert frame.column("n") == list(range(len(column)))
    whole = Frame(pyarrow.table({"t": pyarrow.array([1_000], pyarrow.timestamp("ns"))}))
    assert whole.column("t") == [datetime.datetime(1970, 1, 1, microsecond=1)]


@pytest.mark.parametrize(
    "column",
    [
        pyarrow.array([0, 2**62], pyarrow.timestamp("us")),  # the year 146 thousand and more
        pyarrow.array([0, 2**62], pyarrow.timestamp("ms", tz="UTC")),
        pyarrow.array([0, -(2**40)], pyarrow.timestamp("s")),  # before the year 1
        pyarrow.array([0, 2**30], pyarrow.date32()),
        pyarrow.array([0, 2**60], pyarrow.date64()),
        pyarrow.array([0, 2**60], pyarrow.duration("s")),
        pyarrow.array([[0, 2**62]], pyarrow.list_(pyarrow.timestamp("us"))),
    ],
    ids=["timestamp", "timestamp with a time zone", "before year 1", "date32", "date64",
         "duration", "in a list"],
)  # fmt: skip
def test_a_time_beyond_what_python_can_hold_is_refused_as_plain_values(
    column: pyarrow.Array,
) -> None:
    """A time, date or duration Arrow holds beyond the years 1 to 9999 (a "forever" written
    as the largest number, as some databases write it) has no plain Python value: column()
    and rows() refuse it, saying to read it through Arrow, rather than raising Python's own
    OverflowError."""
    frame = Frame(pyarrow.table({"t": column, "n": [1] * len(column)}))
    with pytest.raises(NotPlain, match=r"column `t` holds a time, date or duration .*to_arrow"):
        frame.column("t")
    with pytest.raises(NotPlain, match=r"this frame holds a time, date or duration"):
        list(frame.rows())
    assert frame.column("n") == [1] * len(column)


@pytest.mark.parametrize(
    "column",
    [
        pyarrow.array([0], pyarrow.timestamp("us", tz="Mars/Olympus")),
        pyarrow.array([0], pyarrow.timestamp("ns", tz="Mars/Olympus")),
        pyarrow.array([[0]], pyarrow.list_(pyarrow.timestamp("s", tz="Mars/Olympus"))),
    ],
    ids=["timestamp", "to the nanosecond", "in a list"],
)
@pytest.mark.parametrize("pytz", [False, True], ids=["zoneinfo", "pytz installed"])
def test_a_time_in_a_zone_python_cannot_load_is_refused_as_plain_values(
    column: pyarrow.Array, pytz: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A time in a time zone Python cannot load (a name its zoneinfo does not know, or no
    time zone database) has no plain Python value: column() and rows() refuse it, naming the
    column and the zone and saying to read it through Arrow, rather than raising pyarrow's
    ArrowInvalid saying zoneinfo or pytz must be installed (or pytz's KeyError, where it is
    installed). A time in a zone it loads reads as before."""
    if pytz:

        class UnknownTimeZoneError(KeyError):
            pass

        def timezone(zone: str) -> Any:
            raise UnknownTimeZoneError(zone)

        monkeypatch.setitem(sys.modules, "pytz", type(sys)("pytz"))
        monkeypatch.setattr(sys.modules["pytz"], "timezone", timezone, raising=False)
    paris = pyarrow.array([0] * len(column), pyarrow.timestamp("us", tz="Europe/Paris"))
    frame = Frame(pyarrow.table({"t": column, "paris": paris}))
    with pytest.raises(
        NotPlain, match=r"column `t` holds times in the time zone `Mars/Olympus`.*to_arrow"
    ):
        frame.column("t")
    with pytest.raises(NotPlain, match=r"this frame \(column `t`\) holds times in the time zone"):
        list(frame.rows())
    assert frame.column("paris")[0].utcoffset() == datetime.timedelta(hours=1)


@pytest.mark.parametrize("nested", [False, True], ids=["column", "in a list"])
def test_an_interval_of_months_days_and_nanoseconds_is_refused_as_plain_values(
    nested: bool,
) -> None:
    """An interval of months, days and nanoseconds, at any depth, has no plain Python value:
    pyarrow hands over a `MonthDayNano` of its own, which pickle cannot write (a worker could
    not be handed it), so column() and rows() refuse it, saying to read it through Arrow."""
    kind = pyarrow.month_day_nano_interval()
    one = pyarrow.MonthDayNano([1, 2, 3])
    column = pyarrow.array([[one]], pyarrow.list_(kind)) if nested else pyarrow.array([one], kind)
    frame = Frame(pyarrow.table({"gap": column, "n": [1]}))
    with pytest.raises(NotPlain, match=r"column `gap` holds intervals of months.*to_arrow"):
        frame.column("gap")
    with pytest.raises(NotPlain, match=r"this frame holds intervals of months"):
        list(frame.rows())
    assert frame.column("n") == [1]
    assert frame.to_arrow().column("gap").to_pylist()[0] in ([one], one)


def test_to_arrow_is_the_table_itself() -> None:
    """to_arrow() hands over the table underneath, not a copy."""
    table = _table()
    assert Frame(table).to_arrow() is table


def test_to_polars_without_polars_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """With polars missing, to_polars() is an ImportError naming the extra that brings it
    (`pip install 'somatize[polars]'`), which it named none of."""
    monkeypatch.setitem(sys.modules, "polars", None)
    with pytest.raises(NoPolars, match=r"`pip install 'somatize\[polars\]'`") as refused:
        Frame(_table()).to_polars()
    assert isinstance(refused.value, ImportError)


def test_to_polars_with_polars() -> None:
    """Where polars is installed, to_polars() gives a polars frame of the same rows."""
    polars = pytest.importorskip("polars")
    frame = Frame(_table()).to_polars()
    assert isinstance(frame, polars.DataFrame)
    assert frame["label"].to_list() == [0, 1, 0]


def test_frames_from_batches_and_equality() -> None:
    """A record batch makes a frame too; frames of equal rows are equal."""
    batch = pyarrow.RecordBatch.from_pydict({"n": [1, 2]})
    assert Frame(batch) == Frame(pyarrow.table({"n": [1, 2]}))
    assert Frame(batch) != Frame(pyarrow.table({"n": [1, 3]}))
    assert repr(Frame(batch)) == "<Frame of 2 rows: n>"


_NAN = float("nan")


def _column(values: list[Any], kind: pyarrow.DataType | None = None) -> Frame:
    """A frame of one column, ``x``, of ``values`` (of type ``kind``)."""
    return Frame(pyarrow.table({"x": pyarrow.array(values, kind)}))


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        pytest.param([1.0, _NAN, None], None, id="float64"),
        pytest.param([_NAN, 1.0], pyarrow.float32(), id="float32"),
        pytest.param([_NAN, 1.0], pyarrow.float16(), id="float16"),
        pytest.param([[1.0, _NAN], None, []], None, id="list"),
        pytest.param([[_NAN, 1.0]], pyarrow.list_(pyarrow.float64(), 2), id="fixed-size-list"),
        pytest.param([{"a": _NAN, "b": "s"}, None], None, id="struct"),
        pytest.param([[("a", _NAN)]], pyarrow.map_(pyarrow.string(), pyarrow.float64()), id="map"),
    ],
)
def test_frames_holding_nan_in_the_same_places_are_equal(
    values: list[Any], kind: pyarrow.DataType | None
) -> None:
    """Two frames of the same rows holding a NaN, at any depth, are equal, as are a frame and
    itself; a NaN where the other holds a number or a null is a difference."""
    if kind == pyarrow.float16():
        values = [numpy.float16(v) for v in values]
    frame = _column(values, kind)
    assert frame == frame
    assert frame == _column(values, kind)
    other = [[2.0, 2.0]] if kind == pyarrow.list_(pyarrow.float64(), 2) else [None] * len(values)
    assert frame != _column(other, kind)


@pytest.mark.parametrize(
    "column",
    [
        lambda zero: pyarrow.array([zero]),
        lambda zero: pyarrow.array([[zero]]),
        lambda zero: pyarrow.array([{"a": zero}]),
        lambda zero: pyarrow.array([zero]).dictionary_encode(),
        lambda zero: pyarrow.array([zero]).cast(pyarrow.float16()),
    ],
    ids=["flat", "list", "struct", "dictionary", "float16"],
)
def test_a_zero_and_a_negative_zero_are_equal_values_that_key_apart(column: Any) -> None:
    """Frame equality is of values, as Python's and Arrow's are, at every depth: ``0.0`` is
    ``-0.0``. The digest (and so a key) follows the bytes, which tell them apart: frames
    equal by ``==`` may key apart, a miss, never one answer for the other."""
    zero, negative = (Frame(pyarrow.table({"x": column(value)})) for value in (0.0, -0.0))
    assert zero == negative
    assert ArrowCodec().digest(zero) != ArrowCodec().digest(negative)


def test_frames_holding_nan_are_equal_however_they_are_chunked_or_encoded() -> None:
    """Rows holding a NaN split into other chunks, or dictionary-encoded alike in both, are
    equal; rows of equal values in other places, of another type, or encoded with another
    dictionary (which Arrow's ``equals`` and the digest tell apart too), are not."""
    chunked = Frame(
        pyarrow.Table.from_batches(
            [pyarrow.record_batch({"x": [_NAN]}), pyarrow.record_batch({"x": [1.0]})]
        )
    )
    assert chunked == _column([_NAN, 1.0])
    assert chunked != _column([1.0, _NAN])
    assert chunked != _column([_NAN, 1.0], pyarrow.float32())
    encoded = pyarrow.array([_NAN, 1.0, _NAN]).dictionary_encode()
    assert Frame(pyarrow.table({"x": encoded})) == Frame(pyarrow.table({"x": encoded}))
    reordered = pyarrow.DictionaryArray.from_arrays([1, 0, 1], [1.0, _NAN])
    assert Frame(pyarrow.table({"x": encoded})) != Frame(pyarrow.table({"x": reordered}))


def test_a_frame_refuses_what_is_not_arrow() -> None:
    """A Frame of a dict is refused with a pointer to to_arrow."""
    with pytest.raises(NotArrow, match=r"somatize\.data\.to_arrow"):
        Frame({"n": [1]})  # type: ignore[arg-type]


def test_to_arrow_takes_tabular_values() -> None:
    """to_arrow() turns frames, tables and batches into tables, and refuses anything else."""
    table = _table()
    assert to_arrow(Frame(table)) is table
    assert to_arrow(table) is table
    assert to_arrow(table.to_batches()[0]).equals(table)
    with pytest.raises(NotArrow, match=r"cannot turn a `builtins\.list` into an Arrow table"):
        to_arrow([1, 2, 3])
    column = pyarrow.array([1, 2, 3])  # exports Arrow data, but not a table
    for one in (column, pyarrow.chunked_array([column])):
        with pytest.raises(NotArrow, match=r"not a table .*pyarrow\.table\(\{'x': column\}\)"):
            to_arrow(one)


def test_a_column_name_held_twice_is_refused_clearly() -> None:
    """A frame over a table holding a name twice refuses that name, and its rows, by saying
    so; a Table source refuses such a table when it is built."""
    from somatize.data import AmbiguousColumn, Table

    table = pyarrow.Table.from_arrays(
        [pyarrow.array([1]), pyarrow.array([2]), pyarrow.array([3])], names=["a", "a", "b"]
    )
    frame = Frame(table)
    with pytest.raises(AmbiguousColumn, match="more than one column named `a`"):
        frame.column("a")
    with pytest.raises(AmbiguousColumn, match="more than one column named `a`"):
        list(frame.rows())
    assert frame.column("b") == [3]
    with pytest.raises(AmbiguousColumn, match=r"keep only the others \(`table.select\(\['b'\]\)`"):
        Table(table)
    assert issubclass(AmbiguousColumn, ValueError)


def test_a_polars_column_of_python_objects_is_refused_rather_than_read_as_addresses() -> None:
    """A polars frame's column of Python objects (polars' ``Object`` type) reaches Arrow as
    the objects' addresses in memory: ``to_arrow`` (and a Table source, which would digest
    them as its version) refuses it naming the column, rather than hand over the addresses
    as its rows."""
    polars = pytest.importorskip("polars")

    class Thing:
        pass

    frame = polars.DataFrame(
        {"o": [Thing(), Thing()], "n": [1, 2]}, schema={"o": polars.Object, "n": polars.Int64}
    )
    with pytest.raises(NotArrow, match=r"column `o` of this polars frame holds Python objects"):
        to_arrow(frame)
    with pytest.raises(NotArrow, match="addresses in memory"):
        Table(frame)
    assert to_arrow(frame.select("n")).column("n").to_pylist() == [1, 2]


_NS = pyarrow.timestamp("ns")


def _timed(kind: str, times: list[int], floats: list[float], codes: list[int]) -> pyarrow.Array:
    """A column of ``kind`` nesting, in row ``i``, the time ``times[i]`` (in nanoseconds)
    beside the float ``floats[i]``; a union's row ``i`` holds the time when ``codes[i]`` is
    0, else the float."""
    stamps, numbers = pyarrow.array(times, _NS), pyarrow.array(floats)
    every = pyarrow.array(range(len(times) + 1), pyarrow.int32())
    if kind == "map":
        entries = pyarrow.StructArray.from_arrays([stamps, numbers], names=["t", "x"])
        keys = pyarrow.array(["k"] * len(times))
        return pyarrow.MapArray.from_arrays(every, keys, entries)
    if kind == "list-view":
        entries = pyarrow.StructArray.from_arrays([stamps, numbers], names=["t", "x"])
        ones = pyarrow.array([1] * len(times), pyarrow.int32())
        return pyarrow.ListViewArray.from_arrays(every.slice(0, len(times)), ones, entries)
    held = pyarrow.array(codes, pyarrow.int8())
    if kind == "sparse-union":
        return pyarrow.UnionArray.from_sparse(held, [stamps, numbers])
    if kind == "runs-of-a-union":  # which Arrow decodes not
        union = pyarrow.UnionArray.from_sparse(held, [stamps, numbers])
        return pyarrow.RunEndEncodedArray.from_arrays(every.slice(1), union)
    return pyarrow.UnionArray.from_dense(held, every.slice(0, len(times)), [stamps, numbers])


@pytest.mark.parametrize(
    "kind", ["map", "list-view", "sparse-union", "dense-union", "runs-of-a-union"]
)
def test_frames_nesting_times_to_the_nanosecond_beside_nan_are_compared_exactly(kind: str) -> None:
    """Frames of maps, list views, unions and runs nesting times to the nanosecond beside a
    NaN are compared by their values, never raising: equal to themselves, to the same rows
    built again or sliced out of longer ones, and not to rows a nanosecond or a float
    apart."""
    times, floats, codes = [1, 2_000_000_001, 3], [_NAN, 1.0, _NAN], [0, 0, 1]

    def frame(column: pyarrow.Array) -> Frame:
        return Frame(pyarrow.table({"x": column}))

    made = frame(_timed(kind, times, floats, codes))
    assert made == made
    assert made == frame(_timed(kind, times, floats, codes))
    sliced = frame(_timed(kind, [0, *times], [0.0, *floats], [0, *codes]).slice(1))
    assert sliced == made
    assert made != frame(_timed(kind, [1, 2_000_000_002, 3], floats, codes))
    assert made != frame(_timed(kind, [2, 2_000_000_001, 3], floats, codes))
    assert made != frame(_timed(kind, times, [_NAN, 1.0, 0.0], codes))


def test_unions_holding_nan_are_told_apart_by_the_child_holding_each_row() -> None:
    """Rows of a union held by children of other types are different rows, however alike
    their Python values (``1 == 1.0``)."""
    whole, fractional = pyarrow.array([1], pyarrow.int64()), pyarrow.array([1.0, _NAN])
    held = pyarrow.array([0, 1], pyarrow.int8())
    as_integer = pyarrow.UnionArray.from_dense(
        held, pyarrow.array([0, 1], pyarrow.int32()), [whole, fractional]
    )
    as_float = pyarrow.UnionArray.from_dense(
        pyarrow.array([1, 1], pyarrow.int8()),
        pyarrow.array([0, 1], pyarrow.int32()),
        [whole, fractional],
    )
    assert Frame(pyarrow.table({"x": as_integer})) == Frame(pyarrow.table({"x": as_integer}))
    assert Frame(pyarrow.table({"x": as_integer})) != Frame(pyarrow.table({"x": as_float}))


def _struct_of_a_union_equals_itself() -> str:
    """Whether a frame of structs, one null, whose field is a union holding a NaN, equals
    itself."""
    held = pyarrow.UnionArray.from_sparse(
        pyarrow.array([1, 0], pyarrow.int8()),
        [pyarrow.array([5, 6], _NS), pyarrow.array([_NAN, 1.0])],
    )
    rows = pyarrow.StructArray.from_arrays([held], names=["u"], mask=pyarrow.array([False, True]))
    frame = Frame(pyarrow.table({"x": rows}))
    return str(frame == frame)


@needs_fork
def test_a_frame_of_structs_with_a_null_holding_a_union_is_compared_without_a_crash() -> None:
    """A struct column with a null row and a union field holding a NaN is compared field by
    field in its other rows, in a child process: Arrow's own flattening of it ends the
    process."""
    assert answer_of(*forked(_struct_of_a_union_equals_itself)) == "True"
