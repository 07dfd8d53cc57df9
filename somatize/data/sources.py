"""Sources that need no store: a table in memory, and a stream.

``Table(table)`` is an Arrow table already in memory, read by span like a
Parquet dataset (each span a zero-copy slice). Its version is the content
digest of the table, worked out once when it is built — small data need not
be put in a store to be settled.

``Stream(pull)`` answers *whatever is newest*: handed ``{"take": n}``, it hands
on up to ``n`` rows of what has arrived. Its answer cannot be asked for twice,
so it has no state to settle and cannot be frozen — and since a cached node
needs everything above it frozen, nothing under a stream can be cached. Nobody
wrote that rule for streams; it falls out of ``.frozen()`` meaning what it
always meant. Refusing ``.frozen()`` here says so where it is tried.

The difference between training and serving is how many rows the frame brings:
thousands from a dataset read by span, one from a stream. The nodes below the
source are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import pyarrow

from somatize.catalog import Unbuildable
from somatize.data.codec import ArrowCodec
from somatize.data.coordinate import NotACoordinate, span_of
from somatize.data.errors import DataError
from somatize.data.frame import Frame, _ambiguous, to_arrow, twice_named
from somatize.node import Context, Node

__all__ = ["Stream", "Table", "TooManyRows", "Unfreezable"]


class Unfreezable(DataError, ValueError):
    """A stream was declared frozen, settled or cached: its answer changes between any
    two calls, so nothing kept under it could be asked for again."""


class TooManyRows(DataError, ValueError):
    """A stream's pull function brought more rows than it was asked for."""


_DIGESTER = ArrowCodec()


class Table(Node):
    """An Arrow table (or record batch, or Frame) in memory, handed
    ``{"at": i, "take": n}`` and answering a Frame of those rows (a slice of the copy it
    made of the table, so its rows stay the ones its version names)."""

    holds_state = True
    ignores_precision = True  # it slices rows, and computes nothing with torch

    def __init__(self, table: Any) -> None:
        twice = twice_named(to_arrow(table))
        if twice:
            raise _ambiguous(twice, to_arrow(table).column_names)
        version, held = _DIGESTER.held(to_arrow(table))
        self._table: pyarrow.Table = to_arrow(held)
        self._version: str = version

    @property
    def table(self) -> pyarrow.Table:
        """A copy of the table as it was when this source was made: the memory of the one
        handed in may be shared with a numpy array or a DataFrame, and written in place."""
        return self._table

    @table.setter
    def table(self, value: Any) -> None:
        raise AttributeError(self._fixed("table"))

    @property
    def version(self) -> str:
        """The content digest of the table: its state."""
        return self._version

    @version.setter
    def version(self, value: Any) -> None:
        raise AttributeError(self._fixed("version"))

    def _fixed(self, what: str) -> str:
        return (
            f"the `{what}` of a Table source is fixed when it is built: a graph keys what it "
            "keeps below the source by its version, so changing it in place would read other "
            "rows under the keys of these. Build a new `Table(table)` and a graph on it, and "
            "settle that (`somatize.data.settle(g)`)"
        )

    def declare(self) -> dict[str, Any]:
        """Nothing: what decides its rows is its content, which is its state."""
        return {}

    def settled_state(self) -> str:
        """Its version, for ``somatize.data.settle``."""
        return self.version

    def recipe(self) -> tuple[str | None, tuple[Any, ...], dict[str, Any]]:
        """None: a table in memory has nothing another process could rebuild it from."""
        raise Unbuildable(
            "it holds an Arrow table in this process's memory, and another process has "
            "nothing to rebuild it from. Write the table as Parquet into a store the worker "
            "can open (`store.bind(name, store.put(parquet_bytes))`) and read it with "
            '`Parquet(store, name)`, or place the source on a `Worker.generic(mode="local")` '
            "worker"
        )

    def count_rows(self) -> int:
        """How many rows the table has."""
        return int(self.table.num_rows)

    def forward(self, span: Any, ctx: Context) -> Frame:
        at, take = span_of(span, f"`{ctx.name}` (Table)")
        rows = self.table.num_rows
        at = min(at, rows)
        return Frame(self.table.slice(at, min(take, rows - at)))

    def __repr__(self) -> str:
        name = self._smz.name
        return f"<Table{f' {name!r}' if name else ''} of {self.count_rows()} rows>"


class Stream(Node):
    """Whatever is newest: handed ``{"take": n}``, calls ``pull(n)`` and answers a Frame of
    the (at most ``n``) rows it returns — a table, a record batch, a Frame, or anything
    ``somatize.data.to_arrow`` takes. Cannot be frozen, so nothing under it is cached."""

    freezable = False
    """Never frozen: a refusal of a cached node under it says so, rather than to freeze it."""

    def __init__(self, pull: Callable[[int], Any]) -> None:
        if not callable(pull):
            raise TypeError(
                f"Stream(pull) takes a function of how many rows to bring, got a "
                f"`{type(pull).__name__}`"
            )
        self.pull = pull

    def declare(self) -> dict[str, Any]:
        """Nothing to say: a stream is never keyed, since it cannot be frozen."""
        return {}

    def _refuse(self, what: str) -> Unfreezable:
        name = self._smz.name or "the stream"
        return Unfreezable(
            f"`{name}` is a Stream and cannot be {what}: it answers whatever is newest, so the "
            "same question asked twice gets different rows, and an answer kept under it could "
            "never be asked for again — nothing that reads it can be cached. Read a dataset by "
            "span (Parquet, ParquetDir, Table) where answers should be kept; leave the nodes "
            "under a stream un-cached"
        )

    def frozen(self) -> NoReturn:
        """Refused: see :class:`Unfreezable`."""
        raise self._refuse("frozen")

    def cached(self, salt: str | None = None) -> NoReturn:
        """Refused: see :class:`Unfreezable`."""
        raise self._refuse("cached")

    def settled_state(self) -> str:
        """Refused: a stream has no state to settle at."""
        raise self._refuse("settled")

    def forward(self, ask: Any, ctx: Context) -> Frame:
        where = f"`{ctx.name}` (Stream)"
        if isinstance(ask, dict) and "at" in ask:
            raise NotACoordinate(
                f"{where} is handed {ask!r}: a stream has no positions, only what is newest. "
                'Hand it `{"take": n}` — how many rows to bring'
            )
        if not isinstance(ask, dict) or set(ask) != {"take"}:
            raise NotACoordinate(
                f'{where} is handed {ask!r}; a stream is handed `{{"take": n}}` with an int n >= 1'
            )
        _, take = span_of({"at": 0, "take": ask["take"]}, where)
        return Frame(_at_most(self.pull(take), take, where))


def _at_most(pulled: Any, take: int, where: str) -> pyarrow.Table:
    """What a stream's pull function answered, as a table of at most ``take`` rows; more is
    :class:`TooManyRows`. A record batch reader is read batch by batch and let go as soon
    as it has brought more: one that never ends (a live feed) is refused, not read for
    ever."""
    got = "{}"
    if isinstance(pulled, pyarrow.RecordBatchReader):
        got = "at least {} (from a reader, read no further)"
        batches, brought = [], 0
        with pulled:
            for batch in pulled:
                batches.append(batch)
                brought += batch.num_rows
                if brought > take:
                    break
        table = pyarrow.Table.from_batches(batches, schema=pulled.schema)
    else:
        table = to_arrow(pulled)
    if table.num_rows > take:
        raise TooManyRows(
            f"{where} asked its pull function for at most {take} rows and got "
            f"{got.format(table.num_rows)}; return no more than you are asked for"
        )
    return table
