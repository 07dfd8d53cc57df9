"""What the two Parquet sources share: a Parquet file read by row group.

:class:`~somatize.data.Parquet` (a dataset in a store) and
:class:`~somatize.data.ParquetDir` (a directory of files) read their files alike: a
file's footer once (:class:`_Footer`), then only the row groups a span overlaps
(:class:`_File`), keeping the groups decoded last within one budget per source
(:class:`_Held`, ``_HELD_BYTES``), and they hold their files open in an
:class:`_OpenFiles`, which closes a file only once no read uses it. Open files and kept
groups belong to the process that opened them: a forked child (a DataLoader worker)
starts with none and opens its own, so no two processes read through one file position,
and no lock another thread held at the fork is waited on. Both are
:class:`_Versioned`: their rows are decided by their version and the columns they
read. :class:`NotParquet` is public in :mod:`somatize.data.parquet`.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import io
import os
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import pyarrow
import pyarrow.parquet

from somatize.broker import StateMismatch
from somatize.data.codec import read_only
from somatize.data.errors import DataError
from somatize.data.frame import UnknownColumn, python_extensions
from somatize.node import Node
from somatize.store import Corrupt

__all__ = ["NotParquet"]

_HELD_BYTES = 64 << 20
"""How many bytes of decoded row groups a source keeps for the spans that follow, from
all its files together (always at least the last group it read)."""


_PER_PROCESS: weakref.WeakSet[_Held | _OpenFiles] = weakref.WeakSet()
"""Every holder of open files and decoded groups in this process, for a forked child to
forget (:func:`_forget_in_child`)."""


def _forget_in_child() -> None:
    """Run in a forked child: every holder lets go of what the parent held, without closing
    the parent's files, so the child opens files of its own and takes locks of its own."""
    for holder in list(_PER_PROCESS):
        holder.forget()


if hasattr(os, "register_at_fork"):  # no fork where there is none (Windows)
    os.register_at_fork(after_in_child=_forget_in_child)


class NotParquet(DataError, ValueError):
    """Bytes, a file or a directory that hold no Parquet dataset to read."""


def _columns_of(columns: Sequence[str] | None) -> tuple[str, ...] | None:
    """The names in ``columns``, in order, as plain str (they go into keys); None for all.
    Any ordered collection of names is taken (a list, a tuple, a numpy array); a set is
    refused, since the order it hands its names in is not the same in every process; so
    is a mapping, whose values would be passed over (a rename reads as one), and an
    iterator (a generator), which can be read only once: the call that made the source,
    which a copy, a pickle and a worker make it again from, would hold it used up."""
    if columns is None:
        return None
    if isinstance(columns, AbstractSet):
        raise TypeError(
            f"columns= is a list of column names, in the order a frame holds them, got a "
            f"`{type(columns).__name__}`, which has no order (another process may take its "
            f"names in another); e.g. `columns={sorted(map(str, columns))!r}`"
        )
    if isinstance(columns, Mapping):
        raise TypeError(
            f"columns= is a list of column names, got a `{type(columns).__name__}`, whose "
            "values would be passed over: a source reads columns and renames none. Pass "
            f"their names (`columns={list(map(str, columns))!r}`), and rename them below"
        )
    if isinstance(columns, Iterator):
        raise TypeError(
            f"columns= is a list of column names, got a `{type(columns).__name__}`, which can "
            "be read only once, and a copy of the source (a pickle, a worker) is made again "
            "from the call that made it: pass a list (`columns=list(...)`)"
        )
    named = list(columns) if isinstance(columns, Iterable) and not _is_text(columns) else None
    if named is None or not all(isinstance(c, str) for c in named):
        example = (
            f"one name: `columns=[{columns!r}]`"
            if isinstance(columns, str)
            else "e.g. `columns=['sms']`"
        )
        raise TypeError(f"columns= is a list of column names, got {columns!r}; {example}")
    columns = [str(name) for name in named]  # a numpy or other str subclass: a plain str
    twice = sorted(name for name, times in collections.Counter(columns).items() if times > 1)
    if twice:
        raise ValueError(
            f"columns= names {', '.join(map(repr, twice))} more than once; a frame has each "
            "column once: name it once"
        )
    return tuple(columns)


def _is_text(value: Any) -> bool:
    return isinstance(value, (str, bytes, bytearray, memoryview))


def _joined(tables: list[pyarrow.Table]) -> pyarrow.Table:
    """The tables one after another. Tables of no columns (read with ``columns=[]``) say
    only how many rows they hold, and Arrow's concatenation drops that; a batch made from
    a struct array of no fields keeps it."""
    if len(tables) == 1:
        return tables[0]
    if tables[0].num_columns:
        return pyarrow.concat_tables(tables)
    rows = sum(table.num_rows for table in tables)
    batch = pyarrow.RecordBatch.from_struct_array(pyarrow.nulls(rows, pyarrow.struct([])))
    return pyarrow.Table.from_batches([batch.replace_schema_metadata(tables[0].schema.metadata)])


def _parquet_file(
    source: Any,
    where: str,
    metadata: pyarrow.parquet.FileMetaData | None = None,
    pre_buffer: bool = True,
) -> pyarrow.parquet.ParquetFile:
    """``source`` opened as Parquet (its footer read, unless ``metadata`` is it already),
    reading ahead on pyarrow's threads when ``pre_buffer``; NotParquet when it is not
    Parquet."""
    try:
        return pyarrow.parquet.ParquetFile(
            source, metadata=metadata, page_checksum_verification=True, pre_buffer=pre_buffer
        )
    except (pyarrow.ArrowException, OSError) as why:
        raise NotParquet(
            f"{where} is not a Parquet file ({why}). A Parquet source reads files written "
            "by `pyarrow.parquet.write_table` or any other Parquet writer; bind the name to "
            "the bytes of one"
        ) from None


_READ_MOST = 64 << 20
"""The most bytes asked of one read at a position. A read may hand over fewer than it was
asked for though the file goes on (Linux hands over at most 2 GiB less 4 KiB a call, less
than a column of a row group of images can hold): :class:`_Positioned` reads on until it has
them all, a part at a time into one buffer, so a large read holds little more than itself."""


class _Positioned(io.RawIOBase):
    """A file read only at positions (``pread``), for ``pyarrow.PythonFile``: where it is
    is this object's own, not the descriptor's offset, which a forked process shares."""

    def __init__(self, handle: io.RawIOBase | io.BufferedIOBase) -> None:
        super().__init__()
        self.handle = handle
        self.fd = handle.fileno()
        self.size = os.fstat(self.fd).st_size
        self.at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def tell(self) -> int:
        return self.at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.at, io.SEEK_END: self.size}[whence]
        self.at = base + offset
        return self.at

    def read(self, size: int = -1) -> bytes | bytearray:
        if size < 0:
            size = max(self.size - self.at, 0)
        first = os.pread(self.fd, min(size, _READ_MOST), self.at)
        # More than one read hands over: read on, into one buffer.
        data = self._read_on(first, size) if 0 < len(first) < size else first
        self.at += len(data)
        return data

    def _read_on(self, first: bytes, size: int) -> bytearray:
        """The ``size`` bytes from here, of which one read handed over ``first``, read on a
        part at a time until they are all read or the file ends (fewer, then)."""
        whole = bytearray(size)
        got = len(first)
        whole[:got] = first
        while got < size:
            part = os.pread(self.fd, min(size - got, _READ_MOST), self.at + got)
            if not part:
                del whole[got:]
                break
            whole[got : got + len(part)] = part
            got += len(part)
        return whole

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self.handle.close()
        super().close()


def _leaf_count(kind: pyarrow.DataType) -> int:
    """How many Parquet leaf columns a column of type ``kind`` is written as."""
    if pyarrow.types.is_dictionary(kind):
        return 1
    if isinstance(kind, pyarrow.BaseExtensionType):  # pyarrow's own too: `arrow.opaque`
        return _leaf_count(kind.storage_type)
    if pyarrow.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    if pyarrow.types.is_nested(kind):  # a struct, a list of any kind: its children's leaves
        return sum(_leaf_count(kind.field(index).type) for index in range(kind.num_fields))
    return 1


def _leaves_of(
    file: pyarrow.parquet.ParquetFile,
    schema: pyarrow.Schema,
    columns: Sequence[str],
    where: str,
) -> list[int]:
    """The leaf columns of ``file`` (whose Arrow schema is ``schema``) that hold the
    top-level ``columns``, in their order."""
    starts = [0]
    for field in schema:
        starts.append(starts[-1] + _leaf_count(field.type))
    if starts[-1] != file.metadata.num_columns:
        raise NotParquet(
            f"{where} has {file.metadata.num_columns} leaf columns where its Arrow schema "
            f"({', '.join(schema.names)}) makes {starts[-1]}, so which of them hold a column "
            "cannot be told. Read it whole (columns=None), or write it again with pyarrow"
        )
    leaves: list[int] = []
    for name in columns:
        index = schema.get_field_index(name)
        leaves.extend(range(starts[index], starts[index + 1]))
    return leaves


class _Footer:
    """What a Parquet file's footer says, read once: the schema of the columns a source
    reads from it, and the row each row group starts at. It holds no file open."""

    def __init__(
        self, file: pyarrow.parquet.ParquetFile, where: str, columns: Sequence[str] | None
    ) -> None:
        self.where = where
        self.metadata = file.metadata
        schema = file.schema_arrow
        times = collections.Counter(schema.names)
        for name in schema.names if columns is None else columns:
            if not times[name]:
                raise UnknownColumn(
                    f"{where} has no column `{name}`; it has "
                    f"{', '.join(f'`{n}`' for n in schema.names)}. Ask for those in columns="
                )
            if times[name] > 1:
                others = [n for n in schema.names if times[n] == 1]
                raise NotParquet(
                    f"{where} has {times[name]} columns named `{name}`, so the name is "
                    "ambiguous, and a frame has each column once. Write the file with one "
                    "name for each column"
                    + (f", or read only the others (columns={others!r})" if others else "")
                )
        self.leaves = None if columns is None else _leaves_of(file, schema, columns, where)
        """The file's leaf columns that hold ``columns``, in their order (None: all). A read
        selects by them, not by name: Parquet names a leaf by its dotted path, so a name such
        as ``a.b`` also picks out field ``b`` of a struct column ``a``."""
        if columns is not None:
            schema = pyarrow.schema([schema.field(name) for name in columns], schema.metadata)
        foreign = python_extensions(schema)
        if foreign:
            raise NotParquet(
                f"{where} has a column of an extension type defined in Python "
                f"({'; '.join(foreign)}): its values turn into Python by code this process "
                "registered, which may unpickle them, so a source reads no such column. "
                "Leave it out (columns=[...]), or write it as its plain Arrow type "
                "(`column.storage`)"
            )
        self.schema = schema
        self.starts = [0]
        for index in range(self.metadata.num_row_groups):
            self.starts.append(self.starts[-1] + self.metadata.row_group(index).num_rows)
        self.rows = self.starts[-1]


class _Held:
    """The row groups a source decoded last, from any of its files, kept for the spans
    that follow: at most ``_HELD_BYTES`` of them together, and always the last one, so a
    source over many files holds no more than one over a single file."""

    def __init__(self) -> None:
        self.forget()
        _PER_PROCESS.add(self)

    def forget(self) -> None:
        """Starts empty, with a lock of its own (also in a forked child)."""
        self.tables: OrderedDict[tuple[int, int], pyarrow.Table] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    def get(self, key: tuple[int, int]) -> pyarrow.Table | None:
        """Row group ``key`` (file, group), when it is kept."""
        with self.lock:
            found = self.tables.get(key)
            if found is not None:
                self.tables.move_to_end(key)
            return found

    def keep(self, key: tuple[int, int], table: pyarrow.Table) -> None:
        """Keeps row group ``key``, letting go of the ones used least recently beyond the
        budget."""
        with self.lock:
            replaced = self.tables.pop(key, None)
            if replaced is not None:
                self.bytes -= replaced.nbytes
            self.tables[key] = table
            self.bytes += table.nbytes
            while len(self.tables) > 1 and self.bytes > _HELD_BYTES:
                _, dropped = self.tables.popitem(last=False)
                self.bytes -= dropped.nbytes

    def clear(self) -> None:
        with self.lock:
            self.tables.clear()
            self.bytes = 0


class _File:
    """One open Parquet file of a source: what its footer says, the file and the handle
    under it, and a lock its reads take turns on."""

    def __init__(
        self,
        file: pyarrow.parquet.ParquetFile,
        handle: Any,
        footer: _Footer,
        unchanged: Callable[[], bool] | None = None,
        guard: contextlib.AbstractContextManager[object] | None = None,
    ) -> None:
        self.file = file
        self.handle = handle
        self.footer = footer
        self.guard = contextlib.nullcontext() if guard is None else guard
        """Held while the handle is read or closed: the lock of a store that may not be read
        while another thread writes through it (the handle may be its own); else nothing."""
        self.unchanged = unchanged
        """Checks, around each row group read, that the file is still the one that was
        verified: False when it is, True when it had changed and was verified again (what
        was read meanwhile is read again), Corrupt when it is damaged. None where the
        source checks the file itself (a ``ParquetDir``)."""
        self.lock = threading.Lock()
        self.users = 0
        """How many reads are using it (guarded by the lock of the :class:`_OpenFiles` that
        holds it): it is not closed under them."""

    def read(
        self,
        at: int,
        take: int,
        held: _Held,
        number: int,
        shaped: Callable[[pyarrow.Table], pyarrow.Table] | None = None,
    ) -> pyarrow.Table:
        """Rows ``at`` to ``at + take`` of this file (fewer at its end, none past it), the
        source's file ``number``: row groups ``held`` keeps are not decoded again. Each group
        is ``shaped`` as it is decoded, whole: Arrow's cast of a slice of some columns (a
        map of null values) makes arrays that do not hold together."""
        footer = self.footer
        end = min(at + take, footer.rows)
        if at >= end:
            return footer.schema.empty_table()
        first = bisect.bisect_right(footer.starts, at) - 1
        last = bisect.bisect_left(footer.starts, end) - 1
        with self.lock:
            groups = [self._group(index, held, number, shaped) for index in range(first, last + 1)]
        table = _joined(groups)
        return table.slice(at - footer.starts[first], end - at)

    def _group(
        self,
        index: int,
        held: _Held,
        number: int,
        shaped: Callable[[pyarrow.Table], pyarrow.Table] | None,
    ) -> pyarrow.Table:
        found = held.get((number, index))
        if found is not None:
            return found
        table = self._read_group(index)
        if shaped is not None:
            table = shaped(table)
        table = read_only(table)  # a node writing into a column cannot change the rows kept
        held.keep((number, index), table)
        return table

    def _read_group(self, index: int) -> pyarrow.Table:
        """Row group ``index`` decoded, read between two checks that the file is unchanged:
        a file written in place while it was read may have handed over some new bytes."""
        with self.guard:
            return self._read_group_checked(index)

    def _read_group_checked(self, index: int) -> pyarrow.Table:
        unchanged = self.unchanged
        for _ in range(3):
            if unchanged is not None:
                unchanged()
            try:
                table = self._decode(index)
            except (pyarrow.ArrowException, OSError) as why:
                if unchanged is not None:
                    unchanged()  # damage the file's own checks could not name: say that
                raise Corrupt(
                    f"row group {index} of {self.footer.where} cannot be read ({why}): its "
                    "bytes are damaged (a page checksum failed, or the file was cut short), "
                    "and no rows of it are handed over. Write the dataset again"
                ) from None
            if unchanged is None or not unchanged():
                return self._declared(table, index)
        raise Corrupt(
            f"{self.footer.where} kept changing on disk while row group {index} was read, so "
            "no rows of it are handed over. Stop whatever writes into the store's files"
        )

    def _decode(self, index: int) -> pyarrow.Table:
        """Row group ``index``, its columns picked out by their leaves. On this thread alone
        as the interpreter finalizes: a file read through Python code (a ``PythonFile``) is
        read holding the GIL, which pyarrow's threads (its reads ahead, its decoders) cannot
        take then, and the read would wait for them for ever."""
        file, alone = self.file, sys.is_finalizing()
        if alone:
            file = _parquet_file(self.handle, self.footer.where, file.metadata, pre_buffer=False)
        return file.reader.read_row_group(
            index, column_indices=self.footer.leaves, use_threads=not alone
        )

    def _declared(self, table: pyarrow.Table, index: int) -> pyarrow.Table:
        """``table``, read from row group ``index``, when it has the columns and as many rows
        as the footer declares; NotParquet when it has others."""
        footer = self.footer
        schema = footer.schema
        if not table.schema.equals(schema, check_metadata=True):
            raise NotParquet(
                f"row group {index} of {footer.where} was read as columns "
                f"{table.schema} where the file's schema, for the columns asked for, says "
                f"{schema}: no rows of it are handed over. Read it whole (columns=None), or "
                "write it again with pyarrow"
            )
        # Where each row is comes from the footer's counts: pyarrow reads a group whose
        # pages hold fewer rows than its count short, which would hand over the rows after
        # it at other positions, and a span short in the middle, which says the end.
        rows = footer.starts[index + 1] - footer.starts[index]
        if table.num_rows != rows:
            raise NotParquet(
                f"row group {index} of {footer.where} was read as {table.num_rows} rows where "
                f"the file's footer says it holds {rows}, so where its rows and those after "
                "it are in the dataset cannot be told: no rows of it are handed over. Its "
                "writer wrote a footer its pages do not match: write the dataset again"
            )
        return table

    def close(self) -> None:
        with self.guard:
            self.file.close()
            self.handle.close()


class _OpenFiles:
    """The files a source holds open, by number, used least recently first: at most
    ``keep`` of them between reads. A read uses a file within :meth:`using`, and a file is
    closed only once no read uses it, by :meth:`close` too: a read in flight in another
    thread finishes with the rows it was reading, never with a file closed under it."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.forget()
        _PER_PROCESS.add(self)

    def forget(self) -> None:
        """Holds no file, with a lock of its own. The files held before are dropped without
        waiting for the reads using them: in a forked child those are the parent's threads'
        reads, which never end there, and dropping a file closes only the child's copy of its
        descriptor."""
        self.files: OrderedDict[int, _File] = OrderedDict()
        self.lock = threading.Condition(threading.Lock())
        """Guards :attr:`files` and each file's ``users``; notified when a file that
        :meth:`close` let go of is closed by the last read that used it."""

    @contextlib.contextmanager
    def using(self, number: int, opened: Callable[[], _File]) -> Iterator[_File]:
        """File ``number``, made by ``opened`` when it is not open, for the ``with`` block
        to read; when the block ends, the files used least recently beyond ``keep`` that no
        read uses are closed."""
        with self.lock:
            one = self.files.get(number)
            if one is None:
                one = self.files[number] = opened()
            self.files.move_to_end(number)
            one.users += 1
        try:
            yield one
        finally:
            with self.lock:
                one.users -= 1
                if not one.users and self.files.get(number) is not one:
                    one.close()  # let go of by close() while it was being read
                    self.lock.notify_all()
                idle = [index for index, open_ in self.files.items() if not open_.users]
                for index in idle[: max(len(self.files) - self.keep, 0)]:
                    self.files.pop(index).close()

    def let_go(self, number: int) -> None:
        """Lets go of file ``number``: closes it when no read uses it, else the last read
        that does closes it. A read that starts meanwhile opens it again."""
        with self.lock:
            one = self.files.pop(number, None)
            if one is not None and not one.users:
                one.close()

    def close(self) -> None:
        """Lets go of every file: closes those no read uses now, and waits for the reads
        using the others to end, the last of which closes each. A read that starts
        meanwhile opens its file again."""
        with self.lock:
            closing = list(self.files.values())
            self.files.clear()
            for one in closing:
                if not one.users:
                    one.close()
            while any(one.users for one in closing):
                self.lock.wait()


class _Versioned(Node):
    """A source whose rows are decided by its version (its state) and the columns it reads."""

    holds_state = True
    ignores_precision = True  # it reads rows, and computes nothing with torch
    _columns: tuple[str, ...] | None
    _version: str
    _files: _OpenFiles
    _held: _Held

    @property
    def columns(self) -> tuple[str, ...] | None:
        """The columns it reads (None: all of them), fixed when it is built: they are in the
        key of every answer below it."""
        return self._columns

    @columns.setter
    def columns(self, value: Any) -> None:
        raise AttributeError(self._fixed("columns", "columns=[...]"))

    @property
    def version(self) -> str:
        """The version it reads, worked out when it is built: its state."""
        return self._version

    @version.setter
    def version(self, value: Any) -> None:
        raise AttributeError(self._fixed("version", "the dataset as it is now"))

    def _fixed(self, what: str, how: str) -> str:
        kind = type(self).__name__
        return (
            f"the `{what}` of a {kind} source is fixed when it is built: a graph keys what it "
            f"keeps below the source by it, so changing it in place would read other rows "
            f"under the keys of these. Build a new `{kind}` (with {how}) and a graph on it, "
            "and settle that (`somatize.data.settle(g)`)"
        )

    def _declared_columns(self) -> dict[str, Any]:
        columns = self._columns
        # A list, as the columns always were: a tuple has another canonical form, so
        # another key.
        return {"columns": None if columns is None else list(columns)}

    _UNSHARED: tuple[str, ...] = ("_files", "_held")
    """What a copy does not take: open files, the row groups decoded from them, and locks.
    A copy (``copy.copy``, ``copy.deepcopy``, a pickled source) starts with none
    (:meth:`_fresh`), and opens its files again when it reads them."""

    def _fresh(self) -> None:
        """Makes the holders a source starts with: no file open, no row group kept."""
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        for name in self._UNSHARED:
            state.pop(name, None)
        return state

    def __setstate__(self, state: Any) -> None:
        super().__setstate__(state)
        self._fresh()

    def close(self) -> None:
        """Lets go of the open files and the row groups they decoded; they are opened again
        on the next read. A read in flight in another thread finishes with its rows first:
        this waits for it, and closes no file under it."""
        self._files.close()
        self._held.clear()

    def settled_state(self) -> str:
        """Its version, for ``somatize.data.settle``."""
        return self.version

    def state_bytes(self) -> bytes:
        """Its version: a worker rebuilds the source by reference and reads the dataset
        itself, so no rows cross."""
        return self.version.encode()

    def load_state(self, data: memoryview) -> str:
        """Checks that this source, rebuilt on a worker, found the version the client's was
        built at (the bytes :meth:`state_bytes` wrote), and answers it;
        :class:`~somatize.broker.StateMismatch` when it found another."""
        sent = bytes(data).decode("ascii", "replace")
        if sent != self.version:
            raise StateMismatch(self._moved(sent))
        return self.version

    def _moved(self, sent: str) -> str:
        """Why this source, rebuilt here at its own version, is not at ``sent``."""
        raise NotImplementedError
