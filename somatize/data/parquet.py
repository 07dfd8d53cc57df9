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
however many files it reads. ``close()`` lets go of its open files and of the groups
it keeps, and the next span opens them again; a span being read in another thread
meanwhile is read to its end first (``close()`` waits for it), never from a closed file.
Write datasets with row groups near the size of the spans you read them by:
a span never reads less than one whole row group of the columns it asks for.

A dataset kept whole on a local disk — in a local store, or in the cache in front
of a bucket — is verified against its digest the first time a process opens it
(:meth:`~somatize.store.Store.local_blob`; the store remembers it), so a damaged
byte is :class:`~somatize.store.Corrupt`, the blob is moved to quarantine, and no
rows of it are read. The open file is checked against the stamp it was verified at
around each row group read (:class:`_Unchanged`), so one written in place later is
hashed again, and Corrupt when damaged, rather than read unchecked for as long as
the source lives. Its row groups are read through a file, not a memory map,
so a blob cut short on disk while it is open is a short read (Corrupt), not a
crash (SIGBUS). From any other store (a bucket with no
copy in a cache) it is read in ranges through ``store.open_blob`` and is not
hashed whole: only pages that carry checksums are checked, so write a dataset
meant for a bucket with ``write_page_checksum=True``. A store that may not be read while
another thread writes through it (``shared_by_threads`` False: a row cache's writer) is
called under its lock (:func:`~somatize.store._serial.reading`), and the file it opened
is read and closed under it too.

``ParquetDir(path)`` is the same over a directory of ``.parquet`` files, for data
that does not live in a store; it is defined in :mod:`somatize.data.parquet_dir`
and held here too, under the identity it has always had
(``somatize.data.parquet:ParquetDir``).

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

import contextlib
import io
import mmap
import os
from collections.abc import Sequence
from typing import Any

import pyarrow

from somatize._threads import hash_read
from somatize.catalog import Unbuildable, identity_of, nameless_because
from somatize.data._parquet_base import (
    NotParquet,
    _columns_of,
    _File,
    _Footer,
    _Held,
    _OpenFiles,
    _parquet_file,
    _Positioned,
    _Versioned,
)
from somatize.data.coordinate import span_of
from somatize.data.frame import Frame
from somatize.data.parquet_dir import DatasetChanged, ParquetDir
from somatize.node import Context
from somatize.store import Corrupt, LocalStore, Missing, Store
from somatize.store._serial import reading
from somatize.store.local import Stamp, stamp_of

__all__ = ["DatasetChanged", "NotParquet", "Parquet", "ParquetDir"]


def _stamp_of(fd: int) -> Stamp:
    """What tells the file open as ``fd`` from itself changed, as a local store stamps a blob
    it verified: its inode, size, mtime and ctime (which moves whenever it is written)."""
    return stamp_of(os.fstat(fd))


def _let_go(whole: memoryview) -> None:
    """Releases a blob :meth:`~somatize.store.Store.local_blob` handed over, and its map."""
    mapped = whole.obj
    whole.release()
    if isinstance(mapped, mmap.mmap):
        with contextlib.suppress(BufferError):  # a view of it still held elsewhere
            mapped.close()


class _Unchanged:
    """Whether a dataset's blob, open for reading, is still the file the store verified.

    A source reads row groups from its open blob for as long as it lives, long after the
    store hashed it: a blob written in place meanwhile (same size) would hand over rows
    its digest does not name, and the answers below would be kept under the version's key.
    So each read is checked against the stamp the store verified the blob at (one
    ``fstat``). A blob whose stamp moved is hashed again through the open file: intact (a
    ``put`` of the same bytes touches it), it is read on under its new stamp; damaged, it is
    Corrupt, and the store is asked to verify it again, which moves it to quarantine."""

    def __init__(self, source: Parquet, holder: Store, fd: int) -> None:
        self.source = source
        self.fd = fd
        # The stamp the store hashed the blob at. A store that keeps none has the open
        # file hashed at the first check.
        self.stamp = (
            holder.verified_stamp(source.version) if isinstance(holder, LocalStore) else None
        )

    def __call__(self) -> bool:
        """False when the file is as verified; True when it changed and hashed to its
        digest again; Corrupt when it does not."""
        now = _stamp_of(self.fd)
        if now == self.stamp:
            return False
        # At positions, as the rows are read: the descriptor's offset is left alone.
        with _Positioned(io.FileIO(self.fd, "rb", closefd=False)) as reader:
            found = hash_read(reader, now[1])
        steady = _stamp_of(self.fd) == now
        if found == self.source.version and steady:
            self.stamp = now
            return True
        self.source._verify_again()
        said = (
            "was cut short"
            if found is None
            else "kept changing while it was hashed again"
            if found == self.source.version
            else f"hashes to {found}"
        )
        raise Corrupt(
            f"`{self.source.dataset}` ({self.source.version}) changed on disk after it was "
            f"verified and opened, and {said}: no rows of it are handed over, and nothing "
            "below the source is kept. Put the dataset's bytes again (`store.put`): they "
            "are kept under the same digest, so the name needs no rebinding"
        )


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
        self._columns = _columns_of(columns)
        with reading(store):  # a row cache's writer may be writing through it meanwhile
            self._version = store.resolve(name)
        """The digest ``name`` resolved to when this source was built: its state."""
        self._fresh()

    def _fresh(self) -> None:
        self._files = _OpenFiles(1)
        """The dataset's file, as file 0, while it is open."""
        self._held = _Held()

    def declare(self) -> dict[str, Any]:
        """Which columns it reads: with the version (its state), all that decides its rows.
        A subclass that takes arguments of its own adds them to this."""
        return self._declared_columns()

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
            why, fix = nameless_because(type(self))
            raise Unbuildable(
                f"`{type(self).__qualname__}` {why}, so no other process can find it. {fix}"
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
        # The store as its repr names it: a password in a bucket's URL masked.
        return (
            f"`{self.dataset}` is bound to {self.version} in {self.store}, and the "
            f"graph is settled at {sent}, the version the source was built at: the name was "
            "rebound to other bytes since, so reading it here would answer from a version the "
            "key does not name. Nothing ran and nothing was kept. Build the source again "
            f"(`Parquet(store, {self.dataset!r})`) and settle the graph "
            "(`somatize.data.settle(g)`) to read the new version, or run the source where the "
            "graph is called, which reads the version it was built at"
        )

    def count_rows(self) -> int:
        """How many rows the dataset has, from its footer (the rows are not read)."""
        with self._files.using(0, self._opened) as one:
            return one.footer.rows

    def forward(self, span: Any, ctx: Context) -> Frame:
        at, take = span_of(span, f"`{ctx.name}` (Parquet)")
        try:
            with self._files.using(0, self._opened) as one:
                return Frame(one.read(at, take, self._held, 0))
        except Corrupt:
            # The file open is damaged, or gone to quarantine: the next span opens the
            # dataset afresh, and finds whether it was put again.
            self._files.close()
            raise

    def _opened(self) -> _File:
        """The dataset's file, opened: verified and read through a file when the store
        keeps it whole on a local disk (in memory when it is small), read in ranges
        otherwise. A store that may not be read while another thread writes through it (a
        row cache's writer) is called under its lock, and so is the file it hands over,
        whenever it is read or closed: that file may be the store's own object."""
        with reading(self.store):
            return self._opened_here()

    def _opened_here(self) -> _File:
        where = f"`{self.dataset}` ({self.version})"
        store = self.store
        try:
            whole = store.local_blob(self.version)
        except Missing:
            raise Missing(self._removed()) from None
        except Corrupt as why:
            raise Corrupt(
                f"`{self.dataset}` cannot be read, and no rows of it are handed over: "
                f"{why}. Put the dataset's bytes again (`store.put`): they are kept "
                "under the same digest, so the name needs no rebinding"
            ) from None
        if whole is not None and isinstance(whole.obj, mmap.mmap):
            # Verified; read through a file rather than the map: a blob cut short on disk
            # while it is open (another tool, a full disk) is then a short read, Corrupt,
            # where a page of the map past its new end would kill the process (SIGBUS).
            _let_go(whole)
            holder = getattr(store, "cache", None)
            holder = holder if isinstance(holder, Store) else store  # where the copy is
            # Read at positions: a process forked while it is open (a DataLoader worker)
            # shares the descriptor's offset, never this file's.
            positioned = _Positioned(holder.open_blob(self.version))
            source: Any = pyarrow.PythonFile(positioned, mode="r")
            unchanged: _Unchanged | None = _Unchanged(self, holder, positioned.fd)
        elif whole is not None:
            source = pyarrow.BufferReader(pyarrow.py_buffer(whole))  # read into memory
            unchanged = None
        else:
            source = store.open_blob(self.version)
            unchanged = None
        try:
            if unchanged is not None:
                unchanged()  # the file opened is the one verified
            file = _parquet_file(source, where)
            footer = _Footer(file, where, self.columns)
            if unchanged is not None:
                unchanged()  # and the footer was read from it
            return _File(file, source, footer, unchanged, reading(store))
        except BaseException:
            source.close()
            raise

    def _verify_again(self) -> None:
        """Has the store verify the dataset's blob again, so that it moves a damaged one to
        quarantine as it does any damaged blob; what it finds is not raised here."""
        with contextlib.suppress(Missing, Corrupt, OSError), reading(self.store):
            whole = self.store.local_blob(self.version)
            if whole is not None:
                _let_go(whole)

    def _removed(self) -> str:
        """Why the blob this source was built at cannot be read, and the two ways on."""
        try:
            with reading(self.store):
                now = self.store.resolve(self.dataset)
        except (KeyError, OSError, ValueError):
            now = None
        bound = (
            "is still bound to it"
            if now == self.version
            else "is bound to nothing now"
            if now is None
            else f"is bound to {now} now"
        )
        return (
            f"`{self.dataset}` was bound to {self.version} when this source was built, and "
            f"that blob is not in {self.store}: it was removed (the name {bound}). To read "
            "that version, put the same bytes again (`store.put(data)`: they are kept under "
            "the same digest, and the graph needs nothing else); to read what the name is "
            f"bound to now, build the source again (`Parquet(store, {self.dataset!r})`) and "
            "settle the graph on it (`somatize.data.settle(g)`)"
        )

    def __repr__(self) -> str:
        name = self._smz.name
        return f"<Parquet{f' {name!r}' if name else ''} {self.dataset} @ {self.version[7:15]}>"
