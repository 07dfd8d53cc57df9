"""A directory of Parquet files as one source, read by span.

``ParquetDir(path)`` reads a directory of ``.parquet`` files, in path order, as
:class:`~somatize.data.Parquet` reads a dataset in a store, for data that does not
live in one. Its version is worked out from the files' names, sizes and content
digests, so any changed byte changes it; a file that changes after that is refused
rather than read under the old version (one written again with the same bytes, its stat
moved, is hashed again and read on). It reads each file's footer once and then
holds only a few files open (``_OPEN_FILES``), opening one again when a span reaches
it, so a directory may hold more files than a process may have open; it reads them
through files, not memory maps, so a file cut short while open is a short read; a
file opened again is checked to be the very file its digest was
taken from. A file changed too recently for its stat to vouch for it (``_RACY_NS``) is
read only through blocks checked against digests taken when the version was worked out
(:class:`_Checked`).

On a network worker it crosses by reference, as a :class:`~somatize.data.Parquet`
does (:mod:`somatize.data.parquet`): the worker rebuilds it from its absolute path, on
a machine that sees the same files, and is sent only its version.

The class is defined here and keeps the identity it was first given,
``somatize.data.parquet:ParquetDir``: :mod:`somatize.data.parquet` holds it under that
name, so the answers kept under that identity keep their keys and a worker finds the
class where the identity says.
"""

from __future__ import annotations

import bisect
import errno
import io
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import blake3
import pyarrow

from somatize import canonical
from somatize._threads import ProcessLock, hash_read, hash_threads
from somatize.catalog import Unbuildable
from somatize.data._parquet_base import (
    NotParquet,
    _columns_of,
    _File,
    _Footer,
    _Held,
    _joined,
    _OpenFiles,
    _parquet_file,
    _Positioned,
    _Versioned,
)
from somatize.data.coordinate import span_of
from somatize.data.errors import DataError
from somatize.data.frame import Frame
from somatize.node import Context
from somatize.store import Store
from somatize.store._local_files import NotAFile, _open_regular, open_file

__all__ = ["DatasetChanged", "ParquetDir"]

_OPEN_FILES = 8
"""How many files of a ``ParquetDir`` stay open between spans. The others are opened
again when a span reaches them: a directory may hold more files than a process may
have open."""


_RACY_NS = 2_000_000_000
"""How long after a file's last change its stat vouches for it. A filesystem stamps times
from a clock that ticks coarsely (every few milliseconds on Linux before 6.13, every second
or two on some filesystems), so a file written again in place, at its size, within the tick
it changed in keeps its size, inode and times: such a file is read only through blocks
checked against the digests taken of them when the version was worked out
(:class:`_Checked`)."""

_BLOCK = 1 << 20
"""How many bytes of a file its stat cannot vouch for are hashed, and checked, as one."""


def _racy(stat: tuple[Any, ...]) -> bool:
    """Whether a file last changed (``stat``'s ctime) too recently for a change within the
    same tick to move its times."""
    changed: int = stat[5]
    return time.time_ns() - changed < _RACY_NS


class DatasetChanged(DataError, RuntimeError):
    """A file of a ``ParquetDir`` changed after its version was worked out."""


def _stat_of(path: Path, fd: int | None = None) -> tuple[Any, ...]:
    """What says which file is at ``path`` and whether it changed; of the file open as
    ``fd`` (opened from ``path``) when one is given."""
    found = os.stat(path) if fd is None else os.fstat(fd)
    return (str(path), found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns,
            found.st_ctime_ns)  # fmt: skip


def _vanished(relative: str) -> DatasetChanged:
    return DatasetChanged(
        f"`{relative}` disappeared while the version was being worked out (something is "
        "rewriting the directory); wait until it has finished, then build the ParquetDir again"
    )


def _cut_short(relative: str) -> DatasetChanged:
    return DatasetChanged(
        f"`{relative}` changed while its digest was being worked out; wait until whatever "
        "writes it has finished, then build the ParquetDir again"
    )


def _regular(path: Path) -> io.BufferedReader:
    """The regular file at ``path``, opened without waiting: NotAFile for a FIFO (whose open
    would wait for a writer for good) or a device, put in a listed file's place."""
    fd, _ = _open_regular(str(path))
    return open_file(fd, "rb")


def _file_digest(path: Path, relative: str) -> tuple[str, tuple[Any, ...], list[bytes] | None]:
    """The content digest of ``path``, the stat it was taken at, and, when the file changed
    too recently for that stat to vouch for it (``_RACY_NS``), the digest of each of its
    ``_BLOCK``-byte blocks; NotParquet when the file does not begin and end with Parquet's
    magic bytes, DatasetChanged when it changes or disappears meanwhile.

    Every build hashes every file afresh: a file written in place through a shared memory
    map may keep its size and times, so a digest remembered by its stat could name bytes
    it no longer holds. The file is read, not mapped: one cut short while it is hashed is
    a short read (DatasetChanged), where a page of a map past its new end would kill the
    process (SIGBUS)."""
    try:
        before = _stat_of(path)
        handle = _regular(path)  # closed by the `with` below
    except FileNotFoundError:
        raise _vanished(relative) from None
    except (NotAFile, IsADirectoryError):  # put in its place since it was listed
        raise _cut_short(relative) from None
    with handle:
        fd = handle.fileno()
        size = os.fstat(fd).st_size
        if size < 12:
            raise NotParquet(
                f"`{relative}` holds {size} bytes, too few to be a Parquet file; remove it from "
                "the directory or write it again"
            )
        if os.pread(fd, 4, 0) != b"PAR1" or os.pread(fd, 4, size - 4) != b"PAR1":
            raise NotParquet(
                f"`{relative}` is named like a Parquet file and is not one (no `PAR1` magic "
                "at its start and end): it is another format, or was cut short while being "
                "written. Remove it from the directory or write it again"
            )
        blocks: list[bytes] | None = None
        if _racy(before):
            digest, blocks = _blocks_of(fd, size)
        else:
            digest = hash_read(handle, size)
        if digest is None:
            raise _cut_short(relative)
    try:
        after = _stat_of(path)
    except FileNotFoundError:
        raise _vanished(relative) from None
    if after != before:
        raise _cut_short(relative)
    return digest, after, blocks


def _blocks_of(fd: int, size: int) -> tuple[str | None, list[bytes]]:
    """The digest of the ``size`` bytes of the file open as ``fd`` (None when it ends sooner)
    and the digest of each of its ``_BLOCK``-byte blocks, from one read."""
    whole = blake3.blake3(max_threads=hash_threads())
    blocks: list[bytes] = []
    for start in range(0, size, _BLOCK):
        block = os.pread(fd, min(_BLOCK, size - start), start)
        if len(block) < min(_BLOCK, size - start):
            return None, blocks
        whole.update(block)
        blocks.append(blake3.blake3(block).digest())
    return "blake3:" + whole.hexdigest(), blocks


class _Checked(_Positioned):
    """A file its stat cannot vouch for, read only through its ``_BLOCK``-byte blocks, each
    checked, as it is read, against the digest taken of it when the version was worked out:
    the bytes handed over are bytes that were hashed, however the file is written meanwhile
    (even in place and back again within one tick of its clock). ``changed`` makes what is
    raised for a block that no longer hashes to its digest."""

    def __init__(
        self, handle: io.BufferedReader, blocks: list[bytes], changed: Callable[[], Exception]
    ) -> None:
        super().__init__(handle)
        self.blocks = blocks
        self.changed = changed
        self.last: tuple[int, bytes] | None = None
        """The block checked last: a reader reads a few small pieces of one block in turn."""

    def read(self, size: int = -1) -> bytes:
        end = self.size if size < 0 else min(self.at + size, self.size)
        pieces = []
        while self.at < end:
            number, within = divmod(self.at, _BLOCK)
            piece = self._block(number)[within : within + end - self.at]
            pieces.append(piece)
            self.at += len(piece)
        return b"".join(pieces)

    def _block(self, number: int) -> bytes:
        if self.last is not None and self.last[0] == number:
            return self.last[1]
        start = number * _BLOCK
        block = os.pread(self.fd, min(_BLOCK, self.size - start), start)
        if number >= len(self.blocks) or blake3.blake3(block).digest() != self.blocks[number]:
            raise self.changed()
        self.last = (number, block)
        return block


_FIELD_ID = b"PARQUET:field_id"


def _alike(one: pyarrow.Schema, other: pyarrow.Schema) -> bool:
    """Whether two files' schemas are one dataset's: the same names and types, and what
    each column, and each field within one, says of itself the same, but for the field ids
    a writer numbered them by."""
    if not one.equals(other, check_metadata=False):
        return False
    return all(_said_alike(mine, theirs) for mine, theirs in zip(one, other, strict=True))


def _said_alike(mine: pyarrow.Field, theirs: pyarrow.Field) -> bool:
    """Whether two fields of one type say the same of themselves, and so do the fields
    within them (of a struct, a list, a map; of a dictionary's values, an extension's
    storage), but for their field ids."""
    said = {k: v for k, v in (mine.metadata or {}).items() if k != _FIELD_ID}
    if said != {k: v for k, v in (theirs.metadata or {}).items() if k != _FIELD_ID}:
        return False
    return all(
        _said_alike(inner, outer)
        for inner, outer in zip(_within(mine.type), _within(theirs.type), strict=True)
    )


def _within(kind: pyarrow.DataType) -> list[pyarrow.Field]:
    """The fields within a column of type ``kind``."""
    if pyarrow.types.is_dictionary(kind):
        return _within(kind.value_type)
    if isinstance(kind, pyarrow.BaseExtensionType):
        return _within(kind.storage_type)
    return [kind.field(index) for index in range(kind.num_fields)]


def _unalike(
    other: pyarrow.Schema, relative: str, first: pyarrow.Schema, first_file: str
) -> NotParquet:
    """Why file ``relative``'s columns (``other``) are not those of ``first_file``
    (``first``), naming each column that differs rather than printing both schemas, which
    hide it among the alike ones; and the alike ones, which ``columns=`` may read."""
    said: list[str] = []
    alike: list[str] = []
    for field in first:
        if field.name not in other.names:
            said.append(f"`{field.name}` is missing from it")
            continue
        theirs = other.field(field.name)
        if not theirs.type.equals(field.type) or theirs.nullable != field.nullable:
            said.append(
                f"`{field.name}` is {_typed(theirs)} there and {_typed(field)} in `{first_file}`"
            )
        elif not _said_alike(theirs, field):
            said.append(
                f"`{field.name}` (or a field within it) says {_metadata_of(theirs)} of "
                f"itself there and {_metadata_of(field)} in `{first_file}`"
            )
        else:
            alike.append(field.name)
    said += [f"`{name}` is in it alone" for name in other.names if name not in first.names]
    if not said:  # the same columns, in another order
        said.append(f"its columns are in another order: {other.names}, not {first.names}")
    return NotParquet(
        f"`{relative}` has columns other than `{first_file}`'s: {'; '.join(said)}. The files "
        "of one dataset share one schema: write them with the same columns and types"
        + (f", or read the columns they share alike (columns={alike!r})" if alike else "")
    )


def _shared(schemas: list[pyarrow.Schema]) -> pyarrow.Schema:
    """The schema of every frame of rows from files of ``schemas`` (alike, see
    :func:`_alike`): the first's columns, and of the files' own metadata only what they all
    say alike, so that a frame's metadata is the dataset's, not that of the file its span
    starts in (a pandas index over one file's rows, the writer of one file). The field
    ids, which may differ, are the first file's."""
    first = schemas[0]
    agreed = {
        key: value
        for key, value in (first.metadata or {}).items()
        if all((other.metadata or {}).get(key) == value for other in schemas[1:])
    }
    return first.with_metadata(agreed) if agreed else first.remove_metadata()


def _as_shared(table: pyarrow.Table, schema: pyarrow.Schema) -> pyarrow.Table:
    """``table``, rows of one file, under ``schema`` (:func:`_shared`): its metadata
    replaced, and its columns (whose field ids may differ from the first file's) cast to
    the same types as numbered there. A table of no columns says only how many rows it
    holds, which Arrow drops when its metadata is replaced; a batch made from a struct
    array of no fields keeps it."""
    if table.schema.equals(schema, check_metadata=True):
        return table
    if not table.num_columns:
        rows = pyarrow.RecordBatch.from_struct_array(
            pyarrow.nulls(table.num_rows, pyarrow.struct([]))
        )
        return pyarrow.Table.from_batches([rows.replace_schema_metadata(schema.metadata)])
    if table.schema.remove_metadata().equals(schema.remove_metadata(), check_metadata=True):
        return table.replace_schema_metadata(schema.metadata)
    return table.cast(schema)


def _typed(field: pyarrow.Field) -> str:
    return f"{field.type}{'' if field.nullable else ' not null'}"


def _metadata_of(field: pyarrow.Field) -> dict[bytes, bytes]:
    """What ``field`` says of itself, but for its field id, which is no part of it."""
    return {k: v for k, v in (field.metadata or {}).items() if k != _FIELD_ID}


_NOT_THERE = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)
"""What a link that leads to no file nor directory fails with: to nothing, or through a
loop of links (one that points at itself)."""


def _is(test: Callable[[], bool]) -> bool:
    """What ``test`` (a directory entry's ``is_dir`` or ``is_file``) says, False for an
    entry that leads to nothing (:data:`_NOT_THERE`), as ``pathlib`` and pyarrow take it."""
    try:
        return test()
    except OSError as error:
        if error.errno in _NOT_THERE:
            return False
        raise


_LOGS = {"_delta_log": "Delta", ".hoodie": "Hudi"}
"""The directory a table format keeps its log in, beside its data, and the format's name.
(Iceberg's, ``metadata``, is told by the ``*.metadata.json`` files it holds.)"""


def _logged_format(log: Path) -> str | None:
    """The table format (Delta, Hudi, Iceberg) whose log ``log`` is, or None. Such a table
    keeps the ``.parquet`` files of its past versions beside those of its present one, and
    only its log says which hold its rows now."""
    named = _LOGS.get(log.name)
    if named is None and log.name != "metadata":
        return None
    if not os.path.isdir(log):
        return None
    if named is not None:
        return named
    try:
        return "Iceberg" if any(n.endswith(".metadata.json") for n in os.listdir(log)) else None
    except OSError:  # gone meanwhile, or not ours to list: its files are no rows anyway
        return None


def _check_not_in_a_table(root: Path) -> None:
    """NotParquet when ``root`` lies in a Delta, Hudi or Iceberg table (a partition of one,
    or Iceberg's ``data/``), whose log is beside a directory above it."""
    for above in root.parents:
        for name in (*_LOGS, "metadata"):
            format_ = _logged_format(above / name)
            if format_ is not None:
                raise _logged_table(above / name, format_, root)


def _logged_table(log: Path, format_: str, root: Path) -> NotParquet:
    table = log.parent
    if table == root:
        where = f"{str(root)!r} is"
    elif table.is_relative_to(root):
        where = f"`{table.relative_to(root).as_posix()}` under {str(root)!r} is"
    else:
        where = f"{str(root)!r} lies in {str(table)!r}, which is"
    return NotParquet(
        f"{where} a {format_} table (it holds `{log.name}`): its `.parquet` files are "
        "those of every version it has had, and only its log says which hold its rows now; "
        "read file by file, the rows deleted or replaced since would come back. Read the "
        f"table with a {format_} reader, as of one version, into a `Table(...)`, or write its "
        "rows as plain Parquet files into a directory of their own"
    )


def _parquet_files(root: Path) -> list[Path]:
    """The ``.parquet`` files under ``root``, in path order, but those whose path below it
    has a name starting with ``.`` or ``_``; NotParquet for a Delta, Hudi or Iceberg table
    under it or around it (:func:`_logged_format`), whose files are not all its rows, and
    whose log would be passed over unseen. A link to a directory is walked as one, as
    pyarrow walks it (``pyarrow.parquet.read_table(path)``), but for a link back up to a
    directory being walked, which would never end; a directory gone meanwhile, and a link
    that leads nowhere (to nothing, or to itself), are passed over. PermissionError for a
    directory this process may not list: its files would be left out unseen."""
    _check_not_in_a_table(root)
    found: list[Path] = []

    def walk(directory: Path, above: frozenset[tuple[int, int]]) -> None:
        try:
            here = os.stat(directory)
            entries = list(os.scandir(directory))
        except PermissionError as error:
            relative = directory.relative_to(root).as_posix()
            where = repr(str(root)) if relative == "." else f"`{relative}` under {str(root)!r}"
            raise PermissionError(
                error.errno,
                f"{where} cannot be listed by this process "
                f"({error.strerror}), so which `.parquet` files it holds cannot be told, and "
                "read without them the dataset would lack their rows. Let this process read "
                "it, or move it out of the directory (or give it a name that starts with `_`, "
                "which is passed over)",
            ) from None
        except OSError as error:  # gone meanwhile
            if error.errno in _NOT_THERE:
                return
            raise
        at = (here.st_dev, here.st_ino)
        if at in above:
            return
        for entry in entries:
            format_ = _logged_format(Path(entry.path))
            if format_ is not None:
                raise _logged_table(Path(entry.path), format_, root)
            if entry.name.startswith((".", "_")):
                continue
            if _is(entry.is_dir):
                walk(Path(entry.path), above | {at})
            elif entry.name.endswith(".parquet") and _is(entry.is_file):
                found.append(Path(entry.path))

    walk(root, frozenset())
    return sorted(found)


def _is_path(value: Any, absolute: Path) -> bool:
    """Whether ``value`` names the directory at ``absolute``."""
    if not isinstance(value, (str, os.PathLike)):
        return False
    return Path(value).expanduser().absolute() == absolute


class ParquetDir(_Versioned):
    """The ``.parquet`` files under directory ``path`` (recursively, through links to
    directories, in path order, skipping names that start with ``.`` or ``_``) as one
    dataset, read by span; a Delta, Hudi or Iceberg table is refused, as only its log
    says which of its files hold its rows."""

    identity = "somatize.data.parquet:ParquetDir"
    """What names the class in keys and to workers (:func:`~somatize.catalog.identity_of`):
    the module it was defined in first, which holds it still. Answers kept under it keep
    their keys, and a worker rebuilding the source imports it from there. A subclass has
    an identity of its own."""

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str] | None = None) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"ParquetDir(path) reads a directory of `.parquet` files named by a str or an "
                f"os.PathLike, got a `{type(path).__name__}`"
                + (
                    "; for a dataset bound to a name in a store, use `Parquet(store, name)`"
                    if isinstance(path, Store)
                    else ""
                )
            )
        root = Path(path).expanduser()
        if not root.exists():
            taken = "" if root.is_absolute() else f", taken from {os.getcwd()!r},"
            raise NotParquet(
                f"{str(root)!r}{taken} does not exist (or is a link to nothing): ParquetDir "
                "reads a directory of `.parquet` files. Check the path"
            )
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
        self._columns = _columns_of(columns)
        found = _parquet_files(root)
        if not found:
            raise NotParquet(
                f"there are no `.parquet` files under {str(root)!r}, so there is no dataset to "
                "read; write some with `pyarrow.parquet.write_table`"
            )
        self.files = [one.relative_to(root).as_posix() for one in found]
        entries = []
        self._stats: list[tuple[Any, ...]] = []
        self._digests: list[str] = []
        self._blocks: list[list[bytes] | None] = []
        """For each file changed too recently for its stat to vouch for it (``_RACY_NS``),
        the digests of its blocks, which every read from it is checked against
        (:class:`_Checked`) until its stat can (:meth:`_vouched`); None for the others."""
        for one, relative in zip(found, self.files, strict=True):
            digest, stat, blocks = _file_digest(one, relative)
            self._stats.append(stat)
            self._digests.append(digest)
            self._blocks.append(blocks)
            entries.append([relative, stat[3], digest])
        self._version = canonical.hex_of(entries, b"somatize/parquet-dir\0")
        """A digest of the files' names, sizes and contents: its state."""
        self._fresh()

    _UNSHARED = ("_files", "_held", "_opening", "_footers", "_starts", "_schema")
    """What a copy does not take; it keeps ``_stats``, so it checks that its files are
    still the ones its version was worked out from, as the original does."""

    def _fresh(self) -> None:
        self._footers: list[_Footer] | None = None
        self._starts: list[int] = []
        self._schema: pyarrow.Schema | None = None
        """The schema every frame is handed over with (:func:`_shared`), once the footers
        are read."""
        self._files = _OpenFiles(_OPEN_FILES)
        """The files open now: at most ``_OPEN_FILES`` of them between reads."""
        self._held = _Held()
        self._opening = ProcessLock()  # afresh in a forked child, unheld

    def declare(self) -> dict[str, Any]:
        """Which columns it reads: with the version (its state), all that decides its rows.
        A subclass that takes arguments of its own adds them to this."""
        return self._declared_columns()

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
        starts, schema = self._starts, self._schema
        assert schema is not None  # read with the footers
        end = min(at + take, starts[-1])
        if at >= end:
            return Frame(schema.empty_table())
        first = bisect.bisect_right(starts, at) - 1
        pieces = []
        index = first
        while index < len(footers) and starts[index] < end:
            self._check(index)
            offset = starts[index]
            with self._files.using(index, partial(self._opened, index, footers[index])) as one:
                shaped = partial(_as_shared, schema=schema)
                piece = one.read(
                    max(at - offset, 0), end - max(at, offset), self._held, index, shaped
                )
            # Again after the read: a file rewritten in place while it was being read (its
            # time moves before its bytes do) may have handed over some of its new rows,
            # even where it was written back as it was by now.
            self._check(index, read=True)
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

    def _check(self, index: int, *, read: bool = False) -> None:
        """DatasetChanged when file ``index``'s stat is not the one its digest was taken at;
        before a span is read from it, unless the file, hashed again, holds the bytes of that
        digest (:meth:`_same_bytes`), but not after: what was ``read`` meanwhile may be
        other bytes."""
        try:
            now = _stat_of(self.root / self.files[index])
        except FileNotFoundError:
            now = None
        if now != self._stats[index]:
            if read or now is None or now[3] != self._stats[index][3]:
                raise self._changed(index)
            self._same_bytes(index)
        elif self._blocks[index] is not None and not _racy(now):
            self._vouched(index)

    def _same_bytes(self, index: int) -> None:
        """File ``index``, whose stat moved since its digest was taken, hashed again: written
        again with the same bytes (a job that writes its dataset anew each run, a copy of a
        worker that built the source before that), it holds the rows the version names and
        is read on under its new stat, opened afresh (a file put in its place is another
        file); DatasetChanged when it does not hash to its digest."""
        relative = self.files[index]
        try:
            digest, stat, blocks = _file_digest(self.root / relative, relative)
        except (NotParquet, DatasetChanged, OSError):
            raise self._changed(index) from None
        if digest != self._digests[index]:
            raise self._changed(index)
        self._stats[index], self._blocks[index] = stat, blocks
        self._files.let_go(index)

    def _vouched(self, index: int) -> None:
        """File ``index``, read through checked blocks until its stat could vouch for it,
        hashed once more now that it can: whatever changes it from now on moves its stat, so
        it is read as the others are (the checked file open is let go of), not through
        Python code and a hash of every block read; DatasetChanged when it no longer hashes
        to its digest."""
        relative = self.files[index]
        try:
            digest, stat, _ = _file_digest(self.root / relative, relative)
        except (NotParquet, DatasetChanged):
            raise self._changed(index) from None
        if digest != self._digests[index] or stat != self._stats[index]:
            raise self._changed(index)
        self._blocks[index] = None
        self._files.let_go(index)

    def _opened(self, index: int, footer: _Footer | None) -> _File:
        """File ``index`` opened, checked to be the very file its digest was taken from (a
        file put in its place since is refused, however alike); read through its checked
        blocks when its stat cannot vouch for it."""
        relative = self.files[index]
        path = self.root / relative
        blocks = self._blocks[index]
        try:
            # Not opened unless it is still the file: one put in its place may be a FIFO,
            # whose open would wait for a writer for good.
            if _stat_of(path) != self._stats[index]:
                raise self._changed(index)
            # A file, not a memory map: one cut short while it is open is then a short
            # read (Corrupt, or DatasetChanged when its stat is checked), where a page of a
            # map past its new end would kill the process (SIGBUS).
            if blocks is None:
                handle: Any = pyarrow.OSFile(str(path), "r")
                fd = handle.fileno()
            else:
                checked = _Checked(_regular(path), blocks, partial(self._changed, index))
                handle, fd = pyarrow.PythonFile(checked, mode="r"), checked.fd
        except (FileNotFoundError, NotAFile, IsADirectoryError):
            raise self._changed(index) from None
        try:
            if _stat_of(path, fd) != self._stats[index]:
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
                    self._check(index)  # written again since, with the same bytes: read on
                    one = self._opened(index, None)
                    one.close()
                    footers.append(one.footer)
                self._check_schemas(footers)
                starts = [0]
                for footer in footers:
                    starts.append(starts[-1] + footer.rows)
                self._starts = starts
                self._schema = _shared([footer.schema for footer in footers])
                self._footers = footers
        return self._footers

    def _check_schemas(self, footers: list[_Footer]) -> None:
        # The files' own metadata (the writer, a pandas index) may differ; what a
        # column says of itself (its unit, say) goes with its rows, so it may not. The
        # field ids a Parquet writer numbers columns by (Spark's, Iceberg's) say nothing
        # of the rows, and may.
        schema = footers[0].schema.remove_metadata()
        for one, relative in zip(footers, self.files, strict=True):
            if not _alike(one.schema.remove_metadata(), schema):
                raise _unalike(one.schema.remove_metadata(), relative, schema, self.files[0])
        if self.columns is None:
            self._check_partitions(schema)

    def _check_partitions(self, schema: pyarrow.Schema) -> None:
        """NotParquet when a file lies under a directory named as a Hive partition
        (``year=2020``) after a column its files do not hold: read whole, its rows would
        come without the column the directory names (``columns=[...]`` reads them so)."""
        for relative in self.files:
            for part in relative.split("/")[:-1]:
                escaped, equals, _ = part.partition("=")
                # `a%3Ab=1` names `a:b`, as Spark writes it; pyarrow writes a name as it is
                name = unquote(escaped)
                if equals and name and not {name, escaped} & set(schema.names):
                    raise NotParquet(
                        f"`{relative}` lies under `{part}`, a directory that names a value "
                        f"of a column `{name}` its files do not hold (a dataset partitioned "
                        "by it, as `pyarrow.parquet.write_to_dataset` or Spark write one): "
                        "ParquetDir reads the columns the files hold, so its rows would come "
                        f"without `{name}`. Write `{name}` into the files too, or read the "
                        f"files' own columns (columns={schema.names!r})"
                    )

    def __repr__(self) -> str:
        name = self._smz.name
        return f"<ParquetDir{f' {name!r}' if name else ''} {self.root} @ {self.version[7:15]}>"
