"""Parquet sources: a dataset in a store, or a directory of files, read by span.

``Parquet(store, name)`` resolves the name to a digest when it is built and
reads nothing: a graph that names a dataset has not opened it. That digest is
the source's ``version`` — the hash of the dataset's bytes, which the store
worked out when the bytes were put — and ``settle(g)`` makes it the source's
frozen state, so it is in the key of everything below. Rebinding the name to
other bytes gives a new source another version, and every answer below it
another key; a source already built keeps reading the bytes it was versioned at,
since blobs never change.

What decides the rows a span brings is the content (the state) and which
columns are read (the declaration). Where the bytes are found — which store,
under which name, at which path — decides nothing, so it is in no key: two
sources over the same bytes share answers.

Reading is by row group, the unit a Parquet file can be read in: a span reads
the footer once, then only the row groups it overlaps, and keeps the last ones
it decoded so that walking a dataset span by span decodes each group once. What
a source keeps is bounded per source (``_HELD_BYTES``, and always the last group),
however many files it reads.
Write datasets with row groups near the size of the spans you read them by:
a span never reads less than one whole row group of the columns it asks for.

A dataset kept whole on a local disk — in a local store, or in the cache in front
of a bucket — is memory-mapped and verified against its digest the first time a
process opens it (:meth:`~somatize.store.Store.local_blob`; the store remembers
it), so a damaged byte is :class:`~somatize.store.Corrupt`, the blob is moved to
quarantine, and no rows of it are read. From any other store (a bucket with no
copy in a cache) it is read in ranges through ``store.open_blob`` and is not
hashed whole: only pages that carry checksums are checked, so write a dataset
meant for a bucket with ``write_page_checksum=True``.

``ParquetDir(path)`` is the same over a directory of ``.parquet`` files, in
path order, for data that does not live in a store. Its version is worked out
from the files' names, sizes and content digests, so any changed byte changes
it; a file that changes after that is refused rather than read under the old
version. It reads each file's footer once and then holds only a few files open
(``_OPEN_FILES``), opening one again when a span reaches it, so a directory may
hold more files than a process may have open or memory-mapped; a file opened
again is checked to be the very file its digest was taken from.

**On a network worker** (``.frozen().at("w1")``, settled), a source crosses by
reference. The worker rebuilds it from where its bytes are found — a
``Parquet`` from its store's address (:meth:`~somatize.store.Store.address`) and
the name, resolved there anew; a ``ParquetDir`` from its absolute path — and is
sent only the version the client's source was built at, never rows. The version
the worker finds must be that one (:class:`~somatize.broker.StateMismatch`
otherwise: a name rebound since, files changed), so a worker never reads another
version than the key names. A store with no address (a ``memory://`` bucket) is
one no worker can open, and such a source is refused before anything runs.
"""

from __future__ import annotations

import bisect
import collections
import mmap
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import blake3
import pyarrow
import pyarrow.parquet

from somatize import canonical
from somatize._threads import hash_threads
from somatize.broker import StateMismatch
from somatize.catalog import Unbuildable, identity_of
from somatize.data.coordinate import span_of
from somatize.data.errors import DataError
from somatize.data.frame import Frame, UnknownColumn
from somatize.node import Context, Node
from somatize.store import Corrupt, Missing, Store

__all__ = ["DatasetChanged", "NotParquet", "Parquet", "ParquetDir"]

_HELD_BYTES = 64 << 20
"""How many bytes of decoded row groups a source keeps for the spans that follow, from
all its files together (always at least the last group it read)."""

_OPEN_FILES = 8
"""How many files of a ``ParquetDir`` stay open between spans. The others are opened
again when a span reaches them: a directory may hold more files than a process may
have open or memory-mapped."""


class NotParquet(DataError, ValueError):
    """Bytes, a file or a directory that hold no Parquet dataset to read."""


class DatasetChanged(DataError, RuntimeError):
    """A file of a ``ParquetDir`` changed after its version was worked out."""


def _columns_of(columns: Sequence[str] | None) -> list[str] | None:
    if columns is None:
        return None
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise TypeError(
            f"columns= is a list of column names, got {columns!r}; e.g. `columns=['sms']`"
        )
    twice = sorted(name for name, times in collections.Counter(columns).items() if times > 1)
    if twice:
        raise ValueError(
            f"columns= names {', '.join(map(repr, twice))} more than once; a frame has each "
            "column once: name it once"
        )
    return list(columns)


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
    source: Any, where: str, metadata: pyarrow.parquet.FileMetaData | None = None
) -> pyarrow.parquet.ParquetFile:
    """``source`` opened as Parquet (its footer read, unless ``metadata`` is it already);
    NotParquet when it is not Parquet."""
    try:
        return pyarrow.parquet.ParquetFile(
            source, metadata=metadata, page_checksum_verification=True
        )
    except (pyarrow.ArrowException, OSError) as why:
        raise NotParquet(
            f"{where} is not a Parquet file ({why}). A Parquet source reads files written "
            "by `pyarrow.parquet.write_table` or any other Parquet writer; bind the name to "
            "the bytes of one"
        ) from None


class _Footer:
    """What a Parquet file's footer says, read once: the schema of the columns a source
    reads from it, and the row each row group starts at. It holds no file open."""

    def __init__(
        self, file: pyarrow.parquet.ParquetFile, where: str, columns: list[str] | None
    ) -> None:
        self.where = where
        self.columns = columns
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
        if columns is not None:
            schema = pyarrow.schema([schema.field(name) for name in columns], schema.metadata)
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

    def __init__(self, file: pyarrow.parquet.ParquetFile, handle: Any, footer: _Footer) -> None:
        self.file = file
        self.handle = handle
        self.footer = footer
        self.lock = threading.Lock()
        self.users = 0
        """How many reads are using it (guarded by its source's lock): it is not closed
        under them."""

    def read(self, at: int, take: int, held: _Held, number: int) -> pyarrow.Table:
        """Rows ``at`` to ``at + take`` of this file (fewer at its end, none past it), the
        source's file ``number``: row groups ``held`` keeps are not decoded again."""
        footer = self.footer
        end = min(at + take, footer.rows)
        if at >= end:
            return footer.schema.empty_table()
        first = bisect.bisect_right(footer.starts, at) - 1
        last = bisect.bisect_left(footer.starts, end) - 1
        with self.lock:
            groups = [self._group(index, held, number) for index in range(first, last + 1)]
        table = _joined(groups)
        return table.slice(at - footer.starts[first], end - at)

    def _group(self, index: int, held: _Held, number: int) -> pyarrow.Table:
        found = held.get((number, index))
        if found is not None:
            return found
        try:
            table = self.file.read_row_group(index, columns=self.footer.columns)
        except (pyarrow.ArrowException, OSError) as why:
            raise Corrupt(
                f"row group {index} of {self.footer.where} cannot be read ({why}): its bytes "
                "are damaged (a page checksum failed, or the file was cut short), and no rows "
                "of it are handed over. Write the dataset again"
            ) from None
        held.keep((number, index), table)
        return table

    def close(self) -> None:
        self.file.close()
        self.handle.close()


class _Versioned(Node):
    """A source whose rows are decided by its version (its state) and the columns it reads."""

    holds_state = True
    columns: list[str] | None
    version: str

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


class Parquet(_Versioned):
    """A Parquet dataset bound to ``name`` in ``store``, handed ``{"at": i, "take": n}``
    and answering a :class:`~somatize.data.Frame` of those rows.

    ``columns`` reads only those columns (and is the source's declaration).
    """

    def __init__(self, store: Store, name: str, columns: Sequence[str] | None = None) -> None:
        if not isinstance(store, Store):
            raise TypeError(
                f"Parquet(store, name) reads from a somatize.Store, got a `{type(store).__name__}`"
                "; for files in a directory use `ParquetDir(path)`, for a table in memory "
                "`Table(table)`"
            )
        self.store = store
        self.dataset = name
        self.columns = _columns_of(columns)
        self.version: str = store.resolve(name)
        """The digest ``name`` resolved to when this source was built: its state."""
        self._file: _File | None = None
        self._held = _Held()
        self._opening = threading.Lock()

    def declare(self) -> dict[str, Any]:
        """Which columns it reads: with the version (its state), all that decides its rows.
        A subclass that takes arguments of its own adds them to this."""
        return {"columns": self.columns}

    @classmethod
    def reopened(
        cls, kind: type[Parquet], address: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Parquet:
        """The source a worker rebuilds from :meth:`recipe`: a ``kind`` (the class the
        source's identity names) over the store opened from ``address``
        (:meth:`~somatize.store.Store.from_address`), called with the rest of the call that
        made it — the name, resolved there, the columns, and what a subclass takes."""
        if not (isinstance(kind, type) and issubclass(kind, Parquet)):
            raise TypeError(f"Parquet.reopened builds a Parquet source, not a `{kind!r}`")
        return kind(Store.from_address(address), *args, **kwargs)

    def recipe(self) -> tuple[str | None, tuple[Any, ...], dict[str, Any]]:
        """Rebuilt from its store's address and the rest of the call that made it
        (:meth:`reopened`); Unbuildable when the store has no address another process
        could open it from, or the call did not hand the store first or as ``store=``."""
        address = self.store.address()
        if address is None:
            raise Unbuildable(
                f"it reads `{self.dataset}` from a `{type(self.store).__name__}` that has no "
                "address another process could open it from (a `memory://` bucket lives in "
                "this process alone; a bucket opened with live objects in its options cannot "
                "be described), so the worker could not read the dataset. Keep the dataset in "
                "a local directory (`Store(path)`) or a bucket opened with plain options, or "
                'place the source on a `Worker.generic(mode="local")` worker'
            )
        maker = identity_of(type(self))
        if maker is None:
            raise Unbuildable(
                f"`{type(self).__qualname__}` is defined inside a function, so no other "
                "process can find it. Define it at module level"
            )
        args, kwargs = self._smz.call
        if args and args[0] is self.store:
            args = args[1:]
        elif kwargs.get("store") is self.store:
            kwargs = {k: v for k, v in kwargs.items() if k != "store"}
        else:
            kind = type(self).__qualname__
            raise Unbuildable(
                f"`{kind}` was not handed its store first or as `store=`, so a worker, which "
                "opens the store from its address, cannot tell which argument to put it in. "
                f"Make `{kind}` take the store first, as `Parquet(store, name)` does"
            )
        return f"{maker}.reopened", (address, *args), dict(kwargs)

    def _moved(self, sent: str) -> str:
        address = self.store.address() or {}
        where = address.get("root", address.get("url", type(self.store).__name__))
        return (
            f"`{self.dataset}` is bound to {self.version} in the store at {where}, and the "
            f"graph is settled at {sent}, the version the source was built at: the name was "
            "rebound to other bytes since, so reading it here would answer from a version the "
            "key does not name. Nothing ran and nothing was kept. Build the source again "
            f"(`Parquet(store, {self.dataset!r})`) and settle the graph "
            "(`somatize.data.settle(g)`) to read the new version, or run the source where the "
            "graph is called, which reads the version it was built at"
        )

    def count_rows(self) -> int:
        """How many rows the dataset has, from its footer (the rows are not read)."""
        return self._open().footer.rows

    def forward(self, span: Any, ctx: Context) -> Frame:
        at, take = span_of(span, f"`{ctx.name}` (Parquet)")
        return Frame(self._open().read(at, take, self._held, 0))

    def _open(self) -> _File:
        if self._file is not None:
            return self._file
        with self._opening:
            if self._file is None:
                where = f"`{self.dataset}` ({self.version})"
                store = self.store
                try:
                    whole = store.local_blob(self.version)
                except Missing:
                    raise Missing(
                        f"`{self.dataset}` is bound to {self.version}, and that blob is not "
                        f"in {store}: it was removed. Put the dataset again and rebind the name"
                    ) from None
                except Corrupt as why:
                    raise Corrupt(
                        f"`{self.dataset}` cannot be read, and no rows of it are handed over: "
                        f"{why}. Put the dataset's bytes again (`store.put`): they are kept "
                        "under the same digest, so the name needs no rebinding"
                    ) from None
                if whole is not None:
                    source: Any = pyarrow.BufferReader(pyarrow.py_buffer(whole))
                else:
                    source = store.open_blob(self.version)
                try:
                    file = _parquet_file(source, where)
                    self._file = _File(file, source, _Footer(file, where, self.columns))
                except BaseException:
                    source.close()
                    raise
        return self._file

    def close(self) -> None:
        """Lets go of the open file and the row groups it decoded (it is opened again on
        the next read)."""
        with self._opening:
            if self._file is not None:
                self._file.close()
            self._file = None
            self._held.clear()

    def __repr__(self) -> str:
        name = self._smz.name
        return f"<Parquet{f' {name!r}' if name else ''} {self.dataset} @ {self.version[7:15]}>"


# ---------------------------------------------------------------- a directory of files

_SAFE_AFTER_NS = 2_000_000_000
"""A file's digest is remembered only once its last change is this far in the past,
so a change within the file system's timestamp granularity cannot hide behind an
unchanged size and time (the "racy" case)."""

_DIGESTS: dict[tuple[Any, ...], str] = {}
"""(path, device, inode, size, mtime, ctime) → content digest, for files that were
digested long enough after their last change."""


def _stat_of(path: Path, fd: int | None = None) -> tuple[Any, ...]:
    """What says which file is at ``path`` and whether it changed; of the file open as
    ``fd`` (opened from ``path``) when one is given."""
    found = os.stat(path) if fd is None else os.fstat(fd)
    return (str(path), found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns,
            found.st_ctime_ns)  # fmt: skip


def _content_digest(data: mmap.mmap) -> str:
    return "blake3:" + blake3.blake3(data, max_threads=hash_threads()).hexdigest()


def _file_digest(path: Path, relative: str) -> tuple[str, tuple[Any, ...]]:
    """The content digest of ``path`` and the stat it was taken at; NotParquet when the
    file does not begin and end with Parquet's magic bytes."""
    before = _stat_of(path)
    known = _DIGESTS.get(before)
    if known is not None:
        return known, before
    started = time.time_ns()
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < 12:
            raise NotParquet(
                f"`{relative}` holds {size} bytes, too few to be a Parquet file; remove it from "
                "the directory or write it again"
            )
        data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            if data[:4] != b"PAR1" or data[-4:] != b"PAR1":
                raise NotParquet(
                    f"`{relative}` is named like a Parquet file and is not one (no `PAR1` magic "
                    "at its start and end): it is another format, or was cut short while being "
                    "written. Remove it from the directory or write it again"
                )
            digest = _content_digest(data)
        finally:
            data.close()
    after = _stat_of(path)
    if after != before:
        raise DatasetChanged(
            f"`{relative}` changed while its digest was being worked out; wait until whatever "
            "writes it has finished, then build the ParquetDir again"
        )
    if started - after[4] > _SAFE_AFTER_NS and started - after[5] > _SAFE_AFTER_NS:
        _DIGESTS[after] = digest
    return digest, after


def _is_path(value: Any, absolute: Path) -> bool:
    """Whether ``value`` names the directory at ``absolute``."""
    if not isinstance(value, (str, os.PathLike)):
        return False
    return Path(value).expanduser().absolute() == absolute


class ParquetDir(_Versioned):
    """The ``.parquet`` files under directory ``path`` (recursively, in path order,
    skipping names that start with ``.`` or ``_``) as one dataset, read by span."""

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str] | None = None) -> None:
        root = Path(path).expanduser()
        if not root.is_dir():
            raise NotParquet(
                f"{str(root)!r} is not a directory: ParquetDir reads a directory of `.parquet` "
                "files; for one file, put it in a store and use `Parquet(store, name)`"
            )
        root = root.absolute()
        self.root = root
        """The directory, made absolute when the source was built: a later change of the
        working directory does not move it."""
        args, kwargs = self._smz.call
        self._path_first = bool(args) and _is_path(args[0], root)
        """Whether the call that made it handed the directory first (else as ``path=``, or
        neither): told while the working directory is the one the call meant."""
        self._path_named = _is_path(kwargs.get("path"), root)
        self.columns = _columns_of(columns)
        found = sorted(
            one
            for one in root.rglob("*.parquet")
            if one.is_file()
            and not any(part.startswith((".", "_")) for part in one.relative_to(root).parts)
        )
        if not found:
            raise NotParquet(
                f"there are no `.parquet` files under {str(root)!r}, so there is no dataset to "
                "read; write some with `pyarrow.parquet.write_table`"
            )
        self.files = [one.relative_to(root).as_posix() for one in found]
        entries = []
        self._stats: list[tuple[Any, ...]] = []
        for one, relative in zip(found, self.files, strict=True):
            digest, stat = _file_digest(one, relative)
            self._stats.append(stat)
            entries.append([relative, stat[3], digest])
        self.version: str = canonical.hex_of(entries, b"somatize/parquet-dir\0")
        """A digest of the files' names, sizes and contents: its state."""
        self._footers: list[_Footer] | None = None
        self._starts: list[int] = []
        self._files: OrderedDict[int, _File] = OrderedDict()
        """The files open now, used least recently first: at most ``_OPEN_FILES`` of them
        between reads."""
        self._held = _Held()
        self._opening = threading.Lock()

    def declare(self) -> dict[str, Any]:
        """Which columns it reads: with the version (its state), all that decides its rows.
        A subclass that takes arguments of its own adds them to this."""
        return {"columns": self.columns}

    def recipe(self) -> tuple[str | None, tuple[Any, ...], dict[str, Any]]:
        """Rebuilt from the call that made it with its absolute path, on a worker that sees
        the same files (this machine, or a shared filesystem); Unbuildable when the call did
        not hand the path first or as ``path=``."""
        args, kwargs = self._smz.call
        where = str(self.root)
        if self._path_first:
            args = (where, *args[1:])
        elif self._path_named:
            kwargs = {**kwargs, "path": where}
        else:
            kind = type(self).__qualname__
            raise Unbuildable(
                f"`{kind}` was not handed its directory first or as `path=`, so a worker "
                "cannot tell which argument to put the absolute path in. Make "
                f"`{kind}` take the path first, as `ParquetDir(path)` does"
            )
        return None, tuple(args), dict(kwargs)

    def _moved(self, sent: str) -> str:
        return (
            f"the files under {str(self.root)!r}, as this worker finds them, are at "
            f"version {self.version}, and the graph is settled at {sent}, the version of the "
            "files the source was built from: they changed since, or the worker sees other "
            "files at that path. Nothing ran and nothing was kept. After changing the files, "
            "build the `ParquetDir` again and settle the graph (`somatize.data.settle(g)`); "
            "give the workers the same files (this machine, or a shared filesystem)"
        )

    def count_rows(self) -> int:
        """How many rows the files hold together, from their footers."""
        self._read_footers()
        return self._starts[-1]

    def forward(self, span: Any, ctx: Context) -> Frame:
        at, take = span_of(span, f"`{ctx.name}` (ParquetDir)")
        footers = self._read_footers()
        starts = self._starts
        end = min(at + take, starts[-1])
        if at >= end:
            return Frame(footers[0].schema.empty_table())
        first = bisect.bisect_right(starts, at) - 1
        pieces = []
        index = first
        while index < len(footers) and starts[index] < end:
            self._check(index)
            offset = starts[index]
            one = self._using(index)
            try:
                piece = one.read(max(at - offset, 0), end - max(at, offset), self._held, index)
            finally:
                self._done(one)
            if piece.num_rows:
                pieces.append(piece)
            index += 1
        return Frame(_joined(pieces))

    def _changed(self, index: int) -> DatasetChanged:
        return DatasetChanged(
            f"`{self.files[index]}` under {str(self.root)!r} changed after this source's "
            "version was worked out, so its rows are no longer the ones the version names. "
            "Build a new `ParquetDir` (and settle the graph again) to read it at its new "
            "version"
        )

    def _check(self, index: int) -> None:
        try:
            now = _stat_of(self.root / self.files[index])
        except FileNotFoundError:
            now = None
        if now != self._stats[index]:
            raise self._changed(index)

    def _opened(self, index: int, footer: _Footer | None) -> _File:
        """File ``index`` opened, checked to be the very file its digest was taken from (a
        file put in its place since is refused, however alike)."""
        relative = self.files[index]
        path = self.root / relative
        try:
            handle = pyarrow.memory_map(str(path), "r")
        except FileNotFoundError:
            raise self._changed(index) from None
        try:
            if _stat_of(path, handle.fileno()) != self._stats[index]:
                raise self._changed(index)
            where = f"`{relative}`"
            file = _parquet_file(handle, where, None if footer is None else footer.metadata)
            if footer is None:
                footer = _Footer(file, where, self.columns)
            return _File(file, handle, footer)
        except BaseException:
            handle.close()
            raise

    def _read_footers(self) -> list[_Footer]:
        """Every file's footer, each read once with the file open only while it is read."""
        if self._footers is not None:
            return self._footers
        with self._opening:
            if self._footers is None:
                footers = []
                for index in range(len(self.files)):
                    one = self._opened(index, None)
                    one.close()
                    footers.append(one.footer)
                self._check_schemas(footers)
                starts = [0]
                for footer in footers:
                    starts.append(starts[-1] + footer.rows)
                self._starts = starts
                self._footers = footers
        return self._footers

    def _using(self, index: int) -> _File:
        """File ``index`` open, and counted as used until :meth:`_done`."""
        footers = self._read_footers()
        with self._opening:
            one = self._files.get(index)
            if one is None:
                one = self._opened(index, footers[index])
                self._files[index] = one
            self._files.move_to_end(index)
            one.users += 1
            return one

    def _done(self, one: _File) -> None:
        """Ends a use of ``one``; closes the files used least recently beyond
        ``_OPEN_FILES`` that no read is using."""
        with self._opening:
            one.users -= 1
            idle = [index for index, open_ in self._files.items() if not open_.users]
            for index in idle[: max(len(self._files) - _OPEN_FILES, 0)]:
                self._files.pop(index).close()

    def _check_schemas(self, footers: list[_Footer]) -> None:
        # The files' own metadata (the writer, a pandas index) may differ; what a
        # column says of itself (its unit, say) goes with its rows, so it may not.
        schema = footers[0].schema.remove_metadata()
        for one, relative in zip(footers, self.files, strict=True):
            if not one.schema.remove_metadata().equals(schema, check_metadata=True):
                raise NotParquet(
                    f"`{relative}` has columns {one.schema.remove_metadata()} where "
                    f"`{self.files[0]}` has {schema}: the files of one dataset share "
                    "one schema. Write them with the same columns and types, or read "
                    "the shared ones with columns=[...]"
                )

    def close(self) -> None:
        """Lets go of the open files and the row groups they decoded (they are opened
        again on the next read)."""
        with self._opening:
            for one in self._files.values():
                one.close()
            self._files.clear()
            self._held.clear()

    def __repr__(self) -> str:
        name = self._smz.name
        return f"<ParquetDir{f' {name!r}' if name else ''} {self.root} @ {self.version[7:15]}>"
