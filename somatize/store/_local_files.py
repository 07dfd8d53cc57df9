"""The files of a local store: where each one lives, how it is published whole, and what
a file that cannot be written or read says.

A local store (:mod:`somatize.store.local`) is a directory of files named by digest
(``blobs/ab/<hex>``, ``answers/ab/<hex>``, ``packs/<hex>``), and every write is the
same move: the bytes go to a new file in ``tmp/``, under a name no other writer uses,
and are published with an atomic rename, so a reader sees the file whole or not at
all (with ``durable=True`` the file and its directory are fsynced too). A large blob
is hashed on another thread while its bytes are written, so the hash costs no time of
its own; a blob already here is touched instead of written again, so a gc running now
spares it for the record about to refer to it.

A write that fails leaves nothing half-written, and says so in the store's terms: no
space left (:class:`~somatize.store.base.StoreFull`), or a store this process may not
change (a read-only disk, another user's files), which can still be read. A file that
cannot be read says which, and that nothing was changed; a damaged one is moved to
``quarantine/``.

:class:`LocalFiles` holds this for :class:`~somatize.store.local.LocalStore`, which
opens the directory and sets what it declares; its reading (:mod:`somatize.store.local`)
and its upkeep (:mod:`somatize.store._local_upkeep`) build on it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import SimpleQueue
from stat import S_ISDIR, S_ISREG
from typing import IO, Any, TypeVar

import blake3

try:
    import fcntl
except ImportError:  # Windows has none, and fsync alone syncs there
    fcntl = None  # type: ignore[assignment]

from somatize._threads import process_pool
from somatize.store._packed import (
    FROZEN_RUN,
    FULL,
    GATHER_BELOW,
    PackedHome,
    digest_of,
    flat_pieces,
    frozen,
    hasher_for,
    nbytes,
    new_hasher,
    pieces_of,
    steady,
    steady_runs,
    taken_below,
)
from somatize.store.base import (
    Answer,
    BadName,
    Buffer,
    JoinedWrite,
    StoreError,
    StoreFull,
    case_clash,
    check_bindable,
    check_digest,
    check_labels,
    names_above,
    nested,
    spelled_otherwise,
    unbacked,
    unbound,
)
from somatize.store.records import (
    PackIndex,
    Signer,
    bound_for,
    encode_name,
    holds_another_name,
)
from somatize.store.upkeep import _READ

T = TypeVar("T")

open_file = io.open
"""What a store opens its files with, not the builtin ``open``: as the interpreter
finalizes, builtins are put back as they were before ``io`` added ``open`` to them, and a
blob put or read then (by code a collection runs) failed with NameError."""

_OVERLAP = 4 << 20
"""Blobs this large are hashed while they are written, not before: a pack of 8 MiB of rows
was kept in 11.8 ms so, 13.8 ms hashed first (12 MiB: 14.8 against 19.2 ms), a pack of
1 MiB in 0.9 ms either way."""
_RUN = 8 << 20
"""A large blob is written and hashed this many bytes at a time, where a run of it that
could change is copied first (see :func:`~somatize.store._packed.steady_runs`)."""
_AHEAD = 2
"""How many runs the writer goes on past the last one hashed: the copies held at once."""
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
"""What the filesystem says when this process may not change the store (a read-only disk,
another user's files)."""

OUT_OF_FILES = (errno.EMFILE, errno.ENFILE)
"""Why a file could not be opened when this process (or the system) has as many open as it
may: no fault of the store's."""
_NO_FOLDER_SYNC = (errno.EINVAL, errno.EBADF, errno.ENOTSUP)
"""What ``fsync`` of a folder raises on a filesystem that syncs no folders."""
_NO_FILE_SYNC = (errno.EINVAL, errno.ENOTSUP)
"""What ``fsync`` of a file raises on a filesystem that syncs no files (some FUSE mounts)."""

_CLOSE_FILES = (
    "this process has as many files open as it may, which is no fault of the store. Raise "
    "its limit (`ulimit -n`, or `resource.setrlimit(resource.RLIMIT_NOFILE, ...)`), or "
    "close files it holds (fewer DataLoader workers, fewer stores or datasets open)"
)
"""What to do where this process has no file left to open."""
_VERIFIED_HELD = 1 << 16
"""How many blobs a store remembers having hashed to their digests (by their files'
stamps), so that one read again is not hashed again: a process that keeps or reads an
answer a sample over a long run would hold an entry for each, about 200 bytes, for as long
as the store lives. The oldest is let go first, and hashed again at its next read. A durable
store remembers as many blobs it synced, found already written by another process."""


ONE_FILESYSTEM = (
    "tmp/ and the folder it is published into are on different filesystems (a folder of "
    "the store, blobs/ say, is a symlink to another disk), and a file cannot be renamed "
    "from one to another. Nothing was changed. A store's folders must all be on one "
    "filesystem: move or link the store's whole directory instead"
)
"""What a write or a move says when a rename would cross filesystems (EXDEV)."""
SECTIONS_WRITTEN = ("blobs", "names", "answers", "packs", "tmp")
"""The folders of a store that files written in ``tmp/`` are renamed into, and ``tmp/``:
a store opened writable makes them where they are missing."""


class NoFileSync(OSError):
    """``fsync`` of a file this store wrote, refused by a filesystem that syncs no files
    (:data:`_NO_FILE_SYNC`): a durable store cannot keep anything there."""


def to_disk(handle: int) -> None:
    """Syncs the file or folder open at ``handle`` to the disk itself. On macOS ``fsync``
    leaves what it wrote in the drive's own cache, which a power cut loses; ``F_FULLFSYNC``
    flushes that too. A filesystem that refuses it (some network mounts) gets ``fsync``, as
    SQLite does; elsewhere (Linux, Windows) ``fsync`` is all there is."""
    full_sync = getattr(fcntl, "F_FULLFSYNC", None)
    if full_sync is not None:
        try:
            fcntl.fcntl(handle, full_sync)
            return
        except OSError:
            pass
    os.fsync(handle)


def sync_file(handle: int) -> None:
    """Syncs the file open at ``handle``; :class:`NoFileSync` where the filesystem syncs no
    files, which "Invalid argument" alone would not tell."""
    try:
        to_disk(handle)
    except OSError as why:
        if why.errno in _NO_FILE_SYNC:
            raise NoFileSync(why.errno, why.strerror, why.filename) from why
        raise


def _hashers() -> ThreadPoolExecutor:
    """A thread that hashes large blobs while they are written, made on first use."""
    return process_pool("somatize-hash", 1)


def _hash_into(
    hashed: SimpleQueue[tuple[str, BaseException | None]],
    runs: SimpleQueue[Buffer | None],
    each: SimpleQueue[None],
    hasher: blake3.blake3,
) -> None:
    """Hashes the runs of bytes the writer hands through ``runs`` (None after the last) on
    the hash thread, saying in ``each`` when each is hashed (the writer holds few runs in
    memory at once), and hands the digest (or what hashing raised) to the writer through
    ``hashed``: queues are taken from in one C call, where the future of a pool's call is
    waited on through a lock taken in Python code, which a Ctrl-C landing there once it
    is taken leaves held, and the hash thread, settling the future, waits on it for ever
    (every later large blob behind it). A hash that fails takes the runs left all the
    same, since the writer waits on them."""
    try:
        hashed.put((digest_of(_taken(runs, each), hasher), None))
    except BaseException as error:  # handed to the writer, who raises it
        while runs.get() is not None:
            each.put(None)
        hashed.put(("", error))


def _taken(runs: SimpleQueue[Buffer | None], each: SimpleQueue[None]) -> Iterator[Buffer]:
    """The runs handed through ``runs`` until None, each said in ``each`` once hashed."""
    while (run := runs.get()) is not None:
        yield run
        each.put(None)


SMALL_FILE = 16 << 20
"""No record or name a store writes is this large: one that is (a file planted there)
is damage, never read whole into memory."""


_WRITES = 3
"""How many times a publish writes its file to ``tmp/`` when a gc elsewhere takes it from
there each time before it is renamed."""


class TakenFromTmp(StoreError):
    """A write taken from ``tmp/`` before it was published, by a gc in another process that
    spares no write in flight older than its grace (with no grace, none): nothing was
    published."""


class LedNowhere(StoreError):
    """A link that leads nowhere in a section whose files refer to blobs: what it held
    cannot be listed, and asking again will not list it (:func:`refuse_led_nowhere`)."""


class NotAFile(OSError):
    """What is at a path is no file a store writes: not a regular file (a FIFO, a device,
    a symlink to ``/dev/zero``), or larger than any file of its kind. Reading it would
    wait, or read, for good; readers take it as damage or absence."""


def refuse_led_nowhere(section: str, path: str, shown: str) -> None:
    """Refuses ``path`` (``shown`` as ``names/team``) where it is a link that leads nowhere
    in a section whose files refer to blobs: a folder moved to another disk and linked,
    that disk not mounted. Listed as nothing, what it holds would refer to nothing, and gc
    take the blobs it refers to for unused and remove them."""
    if section not in _READ or not os.path.islink(path) or os.path.exists(path):
        return
    raise LedNowhere(
        f"{shown} leads nowhere: it is a link to {os.readlink(path)}, which is not there (a "
        "disk not mounted?), and the blobs what it holds refers to would be taken for "
        "unused. Mount that disk, or remove the link if what it held is gone; nothing was "
        "removed or changed"
    )


def new_file(folder: str | os.PathLike[str], prefix: str, suffix: str) -> tuple[int, str]:
    """A descriptor of a new file in ``folder``, open for writing, and its path (named
    ``prefix``, a uuid, ``suffix``). It has the permissions the umask leaves, as every
    file of a store has: ``tempfile.mkstemp`` makes its owner's alone, which another user
    of a store or cache folder shared by a group could not read."""
    path = os.path.join(folder, f"{prefix}{uuid.uuid4().hex}{suffix}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    return os.open(path, flags, 0o666), path


def _open_regular(path: str) -> tuple[int, os.stat_result]:
    """A descriptor of the file at ``path``, opened without blocking (a FIFO would wait for
    a writer for good), and its stat: NotAFile, closed, if it is no regular file. A
    symlink to a regular file is followed, as every read of the store follows it."""
    handle = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        stat = os.fstat(handle)
        if S_ISDIR(stat.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not S_ISREG(stat.st_mode):
            raise NotAFile(errno.EINVAL, "not a regular file (a FIFO, a device)", path)
    except BaseException:
        os.close(handle)
        raise
    return handle, stat


def _read_open(handle: int, size: int) -> bytes:
    """At most ``size`` bytes from ``handle``, from where it is: fewer only if the file ends
    first (truncated meanwhile)."""
    chunks = []
    left = size
    while left > 0 and (chunk := os.read(handle, min(left, 1 << 20))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_file(path: str, cap: int | None = SMALL_FILE) -> bytes:
    """The bytes of the file at ``path`` (a record, a name, a pack index), at most its size
    when opened: two system calls and a copy for a small file, where a Python file object
    costs several times that. NotAFile for what is no regular file, or (``cap``) larger
    than any file of its kind; FileNotFoundError, IsADirectoryError as the system says."""
    handle, stat = _open_regular(path)
    try:
        if cap is not None and stat.st_size > cap:
            raise NotAFile(
                errno.EFBIG, f"{stat.st_size} bytes, more than any such file holds", path
            )
        return _read_open(handle, stat.st_size)
    finally:
        os.close(handle)


def _spelled_otherwise(names: Path, name: str, data: bytes, signer: Signer | None) -> str | None:
    """The name, differing from ``name`` only in case, whose binding ``data`` holds (the
    file ``name`` reached: signed or checked for that name), as the folders under ``names``
    spell it; None if none is."""
    spellings = [""]
    for segment in name.lower().split("/"):
        spellings = [
            f"{at}/{entry}" if at else entry
            for at in spellings
            for entry in _listed(names / at)
            if entry.lower() == segment
        ]
    return next((o for o in spellings if o != name and bound_for(o, data, signer)), None)


def _listed(folder: Path) -> list[str]:
    """What ``folder`` holds; nothing if it cannot be listed."""
    try:
        return os.listdir(folder)
    except OSError:
        return []


Stamp = tuple[int, int, int, int]


def stamp_of(stat: os.stat_result) -> Stamp:
    """What tells a file from itself changed: its inode, size, mtime and ctime. The
    ctime, which no call sets back (``os.utime`` putting an mtime back moves it), moves
    when the file is written in place."""
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


class LocalFiles(PackedHome):
    """The files of a local store: where each lives, and how it is published whole; see
    the module docstring."""

    root: Path
    """The store's directory."""
    durable: bool
    """Whether every publish is fsynced."""
    _blobs: str
    _answers: str
    _packs_dir: str
    _tmp: str
    """Where ``blobs/``, ``answers/``, ``packs/`` and ``tmp/`` are, as strings to join
    names onto (all but ``packs/`` end in a separator)."""
    _verified: dict[str, Stamp]
    """Digest → the :func:`stamp_of` the file had when it was hashed and matched."""
    _synced: dict[str, tuple[int, int]]
    """A durable store's blob file found here and synced (:meth:`_already`) → the inode and
    ctime it had then."""
    _may_write = False
    """Whether a file was once made in ``tmp/`` (see :meth:`_refused_keeping`)."""

    # -- paths ------------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        """Where blob ``digest`` lives (whether or not it is there)."""
        return Path(self._blob_file(digest))

    def answer_path(self, key: str) -> Path:
        """Where the record of ``key`` lives (whether or not it is there)."""
        return Path(self._answer_file(key))

    def _blob_file(self, digest: str) -> str:
        hexed = check_digest(digest)[7:]
        return f"{self._blobs}{hexed[:2]}{os.sep}{hexed}"

    def _answer_file(self, key: str) -> str:
        hexed = check_digest(key)[7:]
        return f"{self._answers}{hexed[:2]}{os.sep}{hexed}"

    def _pack_file(self, pack_id: str) -> str:
        return f"{self._packs_dir}{os.sep}{check_digest(pack_id)[7:]}"

    # -- writing ------------------------------------------------------------------------------

    def _publish(self, target: Path | str, pieces: Sequence[Buffer]) -> None:
        """Writes ``pieces`` to ``target`` through ``tmp/`` and a rename; written again when
        a gc elsewhere took the write from ``tmp/`` before it was renamed
        (:class:`TakenFromTmp`), up to :data:`_WRITES` times."""
        target = os.fspath(target)
        for attempt in range(_WRITES):
            with self._in_tmp(".part") as name:
                temporary = self._tmp + name
                self._write_temporary(pieces, target, temporary)
                try:
                    self._place(temporary, target)
                except TakenFromTmp:
                    if attempt == _WRITES - 1:
                        raise
                    continue
                return

    def _write_temporary(
        self, pieces: Iterable[Buffer], target: str | None, temporary: str
    ) -> os.stat_result:
        """Writes ``pieces`` to ``temporary``, a new file in ``tmp/`` (fsynced when durable);
        its stat. ``target`` names what it is for, in errors."""
        try:
            with self._created(temporary) as out:
                for piece in pieces:
                    out.write(piece)
                out.flush()
                if self.durable:
                    sync_file(out.fileno())
                return os.fstat(out.fileno())
        except OSError as why:
            raise self._unwritten(temporary, target, why) from why

    def _created(self, temporary: str) -> io.BufferedWriter:
        """``temporary``, a new file in ``tmp/``, open for writing."""
        return self._made_in_tmp(lambda: open_file(temporary, "wb"))

    def _spill_file(self) -> IO[bytes]:
        """A file with no name in ``tmp/``, on the store's disk: a gc sees none."""
        self._refuse_writing("write to")
        return self._made_in_tmp(lambda: tempfile.TemporaryFile(dir=self._tmp))

    def _spill_failed(self, why: OSError) -> StoreError:
        if isinstance(why, StoreError):  # said already (a read-only store)
            return why
        return self._unwritten(None, None, why)

    def _made_in_tmp(self, make: Callable[[], T]) -> T:
        """What ``make`` makes in ``tmp/``, which is made first when it is not there (a
        store copied without its empty folders)."""
        try:
            return make()
        except FileNotFoundError:
            self._make_folder(self._tmp)
            return make()

    def _make_folder(self, folder: str) -> None:
        """Makes ``folder`` of the store, missing (a store copied without its empty
        folders); FileNotFoundError when the store's own directory is gone (moved or
        removed since it was opened), which is not made again part by part: a store
        nobody meant would keep what was meant for the one moved."""
        self._refuse_writing("make folders in")
        if not os.path.isdir(self.root):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(self.root))
        os.makedirs(folder, exist_ok=True)

    def writable(self) -> bool:
        """False where the store was opened ``read_only=True``, or :meth:`_unwritable`
        finds a write refused."""
        return not self.read_only and self._unwritable() is None

    def _unwritable(self) -> OSError | None:
        """Why no keep here can succeed: a folder of the store on another filesystem
        (:meth:`_across_filesystems`); or an empty file made in ``tmp/`` (and ``tmp/``
        first where it is missing) and removed, refused as on a read-only disk
        (:data:`_READ_ONLY`), or the store's directory gone (every write is refused then,
        see :meth:`_gone`). None otherwise — another failure (no inode left) says nothing
        of what later writes may do."""
        across = self._across_filesystems()
        if across is not None:
            return across
        with self._in_tmp(".part") as name:
            probe = self._tmp + name
            try:
                with self._created(probe):
                    pass
            except OSError as why:
                if why.errno in _READ_ONLY or not os.path.isdir(self.root):
                    return why
                return None
            with contextlib.suppress(OSError):
                os.unlink(probe)
        return None

    def _across_filesystems(self) -> StoreError | None:
        """The error for a store one of whose folders (:data:`SECTIONS_WRITTEN`) is on
        another filesystem than its directory (a symlink to another disk): no file written
        in ``tmp/`` could be renamed into it (EXDEV), so every keep would fail, after its
        answer was computed. One ``stat`` a folder; a missing one is made when needed, in
        the store's directory."""
        try:
            home = os.stat(self.root).st_dev
        except OSError:
            return None  # gone, or not to be looked at: what a write then says, it says
        for section in SECTIONS_WRITTEN:
            try:
                elsewhere = os.stat(self.root / section).st_dev != home
            except OSError:
                continue
            if elsewhere:
                return StoreError(
                    f"cannot keep answers in {self.root}: its {section}/ is on another "
                    f"filesystem than the store's directory ({section}/ a symlink to another "
                    "disk?), and a file written in tmp/ cannot be renamed from one to the "
                    "other. Nothing was changed; it can still be read. A store's folders "
                    "must all be on one filesystem: move or link the store's whole directory "
                    "instead"
                )
        return None

    def _refused_keeping(self) -> StoreError | None:
        """The error a keep would raise: the store's directory gone (looked for each time,
        one ``stat``), or read-only for this process (found once per store object, by a file
        made in ``tmp/`` and removed), or opened ``read_only=True``."""
        refused = self._only_read("keep answers in")
        if refused is not None:
            return refused
        gone = self._gone("keep answers in")
        if gone is not None:
            return gone
        if not self._may_write:
            why = self._unwritable()
            if isinstance(why, StoreError):  # said already (a folder on another filesystem)
                return why
            if why is not None:
                return self._unwritten(None, None, why)
            self._may_write = True
        return None

    def _place(self, temporary: str, target: str) -> None:
        """Renames a written file of ``tmp/`` to ``target``: it appears whole or not at all.
        Durable, the folder it is renamed into is synced, and where that folder was made for
        it (the first file of a shard), each folder above it up to the store's: a folder made
        is an entry of the one above it, and the rename may be lost with it at a power cut,
        leaving a record whose blob is not there. A folder of ``names/`` made for it may be
        removed before the rename, by a ``verify`` elsewhere moving the last name out of it
        aside (:meth:`_prune_names`): it is made again, up to :data:`_WRITES` times."""
        try:
            made = False
            for attempt in range(_WRITES + 1):
                try:
                    os.replace(temporary, target)
                    break
                except FileNotFoundError:
                    if attempt == _WRITES or not os.path.exists(temporary):
                        raise
                try:
                    self._make_folder(os.path.dirname(target))
                    made = True
                except FileNotFoundError:
                    if not os.path.isdir(self.root):
                        raise
                    # A folder above it was removed while it was made: made again.
            if self.durable:
                self._sync_folders(target, above=made)
        except OSError as why:
            if (
                isinstance(why, FileNotFoundError)
                and why.filename == temporary
                and os.path.isdir(self.root)
                and not os.path.exists(temporary)
            ):
                raise TakenFromTmp(
                    f"could not write {os.path.relpath(target, self.root)} into {self.root}: "
                    "its write was removed from tmp/ before it was published: a gc in "
                    "another process removes writes in flight older than its grace, and "
                    "with no grace (`--grace 0`) all of them. Nothing was published; collect "
                    "with a grace longer than a write stays open (the default is 60 s) while "
                    "writers run"
                ) from why
            raise self._unwritten(temporary, target, why) from why

    def _unwritten(self, temporary: str | None, target: str | None, why: OSError) -> StoreError:
        """The error for a write that failed; the temporary file, if any, is removed first
        (one that cannot be, never written or on a read-only disk, is left to gc)."""
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        where = os.path.relpath(target, self.root) if target is not None else "a blob"
        gone = self._gone(f"write {where} into")
        if gone is not None and isinstance(why, FileNotFoundError):
            return gone
        if why.errno in FULL:
            return StoreFull(
                f"could not write {where} into {self.root}: no space left ({why.strerror}). "
                "Nothing half-written was left and the store is as it was; free space, or "
                "make room with `somatize store gc --max-bytes SIZE`"
            )
        if why.errno == errno.EFBIG:
            return StoreError(
                f"could not write {where} into {self.root}: the file is larger than this "
                f"process may write or the filesystem holds ({why.strerror}): a `ulimit -f` "
                "limit, or a filesystem such as FAT32 that holds at most 4 GiB a file. "
                "Nothing half-written was left and the store is as it was; raise the limit, "
                "or keep the store on a filesystem that holds files this large"
            )
        if why.errno in _READ_ONLY:
            return StoreError(
                f"could not write {where} into {self.root}: the store is read-only for this "
                f"process ({why.strerror}). Nothing was changed; it can still be read. Keep "
                "answers in a store this process may write"
            )
        if why.errno == errno.EXDEV:
            return StoreError(f"could not write {where} into {self.root}: {ONE_FILESYSTEM}")
        if isinstance(why, NoFileSync):
            return StoreError(
                f"could not write {where} into {self.root}: its filesystem cannot sync files "
                f"(`fsync` of a file fails: {why.strerror}), and a store opened with "
                "durable=True syncs every file it writes. Nothing was kept. Open the store "
                "without durable=True, or keep it on a filesystem that syncs files"
            )
        if why.errno in OUT_OF_FILES:
            return StoreError(
                f"could not write {where} into {self.root} ({why.strerror}): {_CLOSE_FILES}. "
                "Nothing half-written was left and the store is as it was"
            )
        return StoreError(f"could not write {where} into {self.root}: {why}")

    def _gone(self, doing: str) -> StoreError | None:
        """The error for a write (``doing``: what it would do) to a store whose directory
        is gone, moved or removed since it was opened; None while it is there."""
        if os.path.isdir(self.root):
            return None
        return StoreError(
            f"could not {doing} {self.root}: the store's directory is gone (moved or "
            "removed since this store was opened), and is not made again for this write. "
            "Nothing was written; open the store where it is now (`Store(path)`), or open "
            "it afresh at this path to start an empty one there"
        )

    def _sync_folders(self, target: str, *, above: bool) -> None:
        """Syncs the folder ``target`` is in and, with ``above``, each folder above it up to
        the store's: a folder made is an entry of the one above it."""
        folder = Path(target).parent
        self._sync_directory(folder)
        while above and folder != self.root and self.root in folder.parents:
            folder = folder.parent
            self._sync_directory(folder)

    @staticmethod
    def _sync_directory(directory: Path) -> None:
        if sys.platform == "win32":
            # Windows opens no folder as a file (PermissionError), so none can be synced
            # from here: the files are synced, and NTFS journals the renames.
            return
        handle = os.open(directory, os.O_RDONLY)
        try:
            to_disk(handle)
        except OSError as why:
            # A filesystem that syncs no folders (some FUSE, network and SMB mounts) says
            # so; its renames are as durable as it makes them, as PostgreSQL takes it.
            if why.errno not in _NO_FOLDER_SYNC:
                raise
        finally:
            os.close(handle)

    def open_joined(self, codec: str, fingerprint: str | None = None) -> JoinedWrite:
        """A joined write that writes each pack to ``tmp/`` as its answers are added, so
        that its close is left only to publish it (:mod:`somatize.store._local_joined`).
        A store whose ``keep_joined`` is its own (a subclass's, or one set on the object)
        gets the default's, which hands everything added to that ``keep_joined``."""
        from somatize.store._local_joined import StreamedJoin  # which builds on this class

        check_labels(codec, fingerprint)
        self._refuse_writing("keep answers in")
        if "keep_joined" in vars(self) or type(self).keep_joined is not PackedHome.keep_joined:
            return JoinedWrite(self, codec, fingerprint)
        return StreamedJoin(self, codec, fingerprint)

    def _put(self, data: Buffer | Sequence[Buffer], claims: list[str]) -> str:
        return self._put_counted(data, claims)[0]

    def _put_counted(self, data: Buffer | Sequence[Buffer], claims: list[str]) -> tuple[str, int]:
        flat = flat_pieces(data)
        if type(flat) is list or type(flat) is tuple:
            return self._put_listed(flat, claims), nbytes(flat)
        return self._put_streamed(iter(flat), claims)

    def _put_streamed(self, pieces: Iterator[Buffer], claims: list[str]) -> tuple[str, int]:
        """Keeps the pieces an iterator (a generator) hands over, each taken as it holds
        then: up to :data:`~somatize.store._packed.FROZEN_RUN` bytes of them are held and
        kept as a list is; past that, each is written straight into ``tmp/`` as it comes,
        hashed as it is written (a piece that may change copied first, a MiB at a time, so
        what is hashed is what is written), and the file renamed to its digest's name once
        the iterator is done: the bytes are written once, on the store's disk, and a crash
        or an error of the iterator leaves nothing visible. Its digest, and how many bytes
        it holds."""
        taken, size, rest = taken_below(pieces, FROZEN_RUN + 1)
        if rest is None:
            return self._put_listed(taken, claims), size
        hasher = new_hasher()
        raised: list[BaseException] = []

        def handed() -> Iterator[Buffer]:
            """The rest of ``pieces``; what the iterator raises is noted as its own: an
            OSError of its source (a file it reads) is no failed write of the store."""
            try:
                yield from rest
            except Exception as why:
                raised.append(why)
                raise

        with self._in_tmp(".part") as name:
            temporary = self._tmp + name
            try:
                with self._created(temporary) as out:
                    for run in taken:
                        hasher.update(run)
                        out.write(run)
                    taken.clear()  # held no longer than it is written
                    for piece in handed():  # copied, where it may change, a MiB at a time
                        for run in steady_runs((piece,), FROZEN_RUN):
                            hasher.update(run)
                            out.write(run)
                            size += len(run)
                    out.flush()
                    if self.durable:
                        sync_file(out.fileno())
            except BaseException as why:  # the iterator raised, or the write failed or stopped
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                if isinstance(why, OSError) and not isinstance(why, StoreError) and not raised:
                    raise self._unwritten(temporary, None, why) from why
                raise
            self._place_written(temporary, "blake3:" + hasher.hexdigest(), size, claims)
        return "blake3:" + hasher.hexdigest(), size

    def _put_listed(self, data: Buffer | Sequence[Buffer], claims: list[str]) -> str:
        pieces = pieces_of(data, self)
        size = nbytes(pieces)
        if size >= _OVERLAP:
            return self._put_large(pieces, size, claims)
        pieces = frozen(pieces)  # what is hashed is what is written
        digest = digest_of(pieces)
        self._claim(digest, claims)
        target = self._blob_file(digest)
        if self._already(target, size, None):
            return digest
        self._publish(target, pieces)
        self._note_verified(digest, target)
        return digest

    def _put_large(self, pieces: Sequence[Buffer], size: int, claims: list[str]) -> str:
        """A large blob is hashed on another thread while its bytes are written to ``tmp/``,
        and renamed to its digest's name once both are done: the hash costs no time of its
        own. Only the write is wasted when the blob turns out to be here already. Both read
        the same runs of bytes (:func:`steady_runs`): a buffer another thread writes into
        meanwhile is copied a run at a time, so what is written is what is hashed.

        At interpreter exit the thread pools take no more work (rows a writer keeps then,
        a flush in an ``atexit`` handler): the blob is then hashed on this thread as it is
        written, and kept all the same. A blob whose hash or write fails, or is
        interrupted, leaves nothing written in ``tmp/``."""
        runs: SimpleQueue[Buffer | None] = SimpleQueue()
        each: SimpleQueue[None] = SimpleQueue()
        answer: SimpleQueue[tuple[str, BaseException | None]] = SimpleQueue()
        hashed: SimpleQueue[tuple[str, BaseException | None]] | None = answer
        # Runs as steady_runs cuts them: steady pieces of GATHER_BELOW or more as they are,
        # the rest in runs of _RUN bytes (the last one of each stretch shorter).
        kept_whole = [p for p in pieces if steady(p) and len(p) >= GATHER_BELOW]
        hasher = hasher_for(kept_whole) if len(kept_whole) == len(pieces) else new_hasher()
        here: blake3.blake3 | None = None

        def written() -> Iterator[Buffer]:
            for count, run in enumerate(steady_runs(pieces, _RUN)):
                if here is not None:
                    here.update(run)
                else:
                    runs.put(run)
                    if count >= _AHEAD:  # the hash is at most _AHEAD runs behind
                        each.get()
                yield run

        try:
            try:  # in the try whose end hands the thread its last run: a Ctrl-C landing in
                # submit once the hash is queued leaves that thread free, not waiting for good
                _hashers().submit(_hash_into, answer, runs, each, hasher)
            except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
                hashed = None
                here = hasher
            with self._in_tmp(".part") as name:
                temporary = self._tmp + name
                try:
                    try:
                        self._write_temporary(written(), None, temporary)
                    finally:
                        if hashed is not None:  # its thread reads the runs: they outlive it
                            runs.put(None)
                            digest, failed = hashed.get()
                            if failed is not None:
                                raise failed
                except BaseException:  # the hash failed, or the write or its wait was stopped
                    with contextlib.suppress(OSError):
                        os.unlink(temporary)
                    raise
                if here is not None:
                    digest = "blake3:" + here.hexdigest()
                self._place_written(temporary, digest, size, claims)
        finally:  # however it ended (stopped before a byte was written, say), the hash
            if hashed is not None:  # thread takes no more runs; a second None is never read
                runs.put(None)
        return digest

    def _place_written(self, temporary: str, digest: str, size: int, claims: list[str]) -> None:
        """Publishes blob ``digest``, written whole to ``temporary`` in ``tmp/`` (``size``
        bytes), claimed for ``claims``: renamed to its digest's name, or removed where that
        blob is here already (which is touched, for a gc elsewhere)."""
        self._claim(digest, claims)
        target = self._blob_file(digest)
        if self._already(target, size, temporary):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            return
        self._place(temporary, target)
        self._note_verified(digest, target)

    def _note_verified(self, digest: str, target: str) -> None:
        """Notes that the blob file at ``target``, just written, holds what ``digest``
        names, so a read of it while it keeps the same :func:`stamp_of` need not hash it
        again. Stamped once it is in place: a rename changes a file's ctime."""
        with contextlib.suppress(FileNotFoundError):  # gone already: a gc of another process
            self._note_stamp(digest, stamp_of(os.stat(target)))

    def _note_stamp(self, digest: str, stamp: Stamp) -> None:
        """Notes that blob ``digest``'s file, as ``stamp`` says it was, hashed to its digest,
        letting go of the blob noted first once :data:`_VERIFIED_HELD` are."""
        self._keep_bounded(self._verified, digest, stamp)

    def _keep_bounded(self, held: dict[str, Any], name: str, value: Any) -> None:
        """``held[name] = value``, letting go of the entry held longest first once
        :data:`_VERIFIED_HELD` are held."""
        if name not in held and len(held) >= _VERIFIED_HELD:
            with self._lock, contextlib.suppress(StopIteration, KeyError, RuntimeError):
                # Another thread may let go of it, or note one, meanwhile: then one more is
                # held until the next one noted.
                del held[next(iter(held))]
        held[name] = value

    def _already(self, target: str, size: int, temporary: str | None) -> bool:
        """Whether the blob at ``target`` is here whole; if so it is touched, so a gc running
        now sees a fresh blob and leaves it for the record about to refer to it. A blob this
        process may not touch (a read-only store, another user's file) is here all the same:
        the touch only guards against a gc, as a bucket's put, which cannot touch, does not.
        One that cannot be looked at (a folder of its path this process may not search, a
        file where a folder should be) is not taken for here: that is StoreError, as the
        write would be, and ``temporary`` (the blob written in ``tmp/``) is removed.

        Durable, the blob found and each folder above it up to the store's are synced before
        it is relied on: another process that does not sync may have written it, and the
        record published next, synced, would outlast a power cut that took the blob."""
        self._refuse_writing("write to")  # nor touched, in a read-only store
        try:
            found = os.stat(target)
        except FileNotFoundError:
            return False
        except OSError as why:
            raise self._unwritten(temporary, target, why) from why
        if found.st_size != size:
            return False
        try:
            os.utime(target)
        except FileNotFoundError:
            return False  # removed by a gc just now: it is written afresh
        except OSError:
            pass  # here, but not this process's to touch
        return self._synced_here(target, found, temporary) if self.durable else True

    def _synced_here(self, target: str, found: os.stat_result, temporary: str | None) -> bool:
        """Whether blob file ``target`` (``found`` as it was before :meth:`_already` touched
        it) is still here once it and each folder above it up to the store's are synced: a
        process that does not sync may have written it. One this store synced before,
        touched since by this store alone, is not synced again; it remembers at most
        :data:`_VERIFIED_HELD` such files, as it does blobs hashed."""
        try:
            if self._synced.get(target) != (found.st_ino, found.st_ctime_ns):
                handle = os.open(target, os.O_RDONLY)
                try:
                    sync_file(handle)
                finally:
                    os.close(handle)
                self._sync_folders(target, above=True)
            touched = os.stat(target)  # its ctime moved with the touch
        except FileNotFoundError:
            return False  # removed by a gc just now: it is written afresh
        except OSError as why:
            raise self._unwritten(temporary, target, why) from why
        self._keep_bounded(self._synced, target, (touched.st_ino, touched.st_ctime_ns))
        return True

    def bind(self, name: str, digest: str) -> None:
        """The blob is touched first, so a gc running now spares it for the name about to
        point at it, and looked for again once the name is written: a gc that removed it
        meanwhile is said, not left as a name pointing at nothing."""
        check_bindable(name)
        self._refuse_writing(f"bind `{name}` in")
        blob = self._blob_file(digest)
        names = self.root / "names"

        def refuse_nested() -> None:
            above = next((n for n in names_above(name) if (names / n).is_file()), None)
            if above is not None or (names / name).is_dir():
                raise nested(name, above) from None

        refuse_nested()
        other = spelled_otherwise(name, lambda at: _listed(names / at))
        if other is not None:
            raise case_clash(name, other, str(self.root), (names / other).is_dir())
        self._refuse_another_names(name)
        try:
            touched = _soon(lambda: _touched(blob))
        except OSError as why:
            raise self._unreadable("blobs", why) from why
        if not touched:
            raise self._gone(f"bind `{name}` in") or unbacked(name, digest, str(self.root))
        try:
            self._publish(names / name, [encode_name(name, digest, self.signer)])
        except StoreError:
            # A name above it or under it, bound meanwhile by another process, makes the
            # rename fail (a file where a folder should be, or a folder in its place).
            refuse_nested()
            raise
        if not _soon(lambda: os.path.exists(blob)):
            raise unbound(name, digest, str(self.root))

    def _refuse_another_names(self, name: str) -> None:
        """BadName when the file of ``name`` holds another name's binding, which binding it
        would replace: on a filesystem that does not tell case apart (macOS, Windows),
        ``sms/train`` is the file of ``sms/Train``. In a store that signs, only a file
        signed for such a name is refused: binding a name again is how a file it does not
        trust (written without the key, or for another name) is replaced."""
        try:
            data = _read_file(str(self.root / "names" / name))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, NotAFile):
            return
        except OSError as why:
            raise self._unreadable("names", why) from why
        if bound_for(name, data, self.signer):
            return
        other = _spelled_otherwise(self.root / "names", name, data, self.signer)
        if other is not None:
            raise BadName(
                f"cannot bind `{name}` in {self.root}: `{other}` is bound, which differs from "
                "it only in case, and this filesystem does not tell case apart, so both are "
                f"one file: binding `{name}` would replace the binding of `{other}`. Name it "
                f"otherwise (or bind `{other}` to change that binding)"
            )
        if self.signer is None and holds_another_name(name, data):
            raise BadName(
                f"cannot bind `{name}` in {self.root}: names/{name} holds another name's "
                "binding (copied over it, or bound for a name differing only in case on a "
                f"filesystem that does not tell case apart), and binding `{name}` would "
                f"replace it. Remove names/{name} if it was copied there, or name it otherwise"
            )

    def _publish_record(self, answer: Answer, data: bytes) -> None:
        self._publish(self._answer_file(answer.key), [data])

    def _take_blob(self, digest: str, pieces: Sequence[Buffer]) -> None:
        """Keeps blob ``digest`` whose bytes were verified elsewhere (a cache in front of a
        bucket fills itself this way, without hashing twice). The caller has claimed it
        (:meth:`_claim`), as a put does, so a gc of this object leaves it until the record
        or index that refers to it is published; one already here is touched, as a put
        touches it, for a gc of another process."""
        target = self._blob_file(digest)
        if self._already(target, nbytes(pieces), None):
            return
        self._publish(target, pieces)
        self._note_verified(digest, target)

    def _take_record(self, answer: Answer, data: bytes) -> None:
        """Keeps ``data``, the record of ``answer`` read or written elsewhere (a cache in
        front of a bucket fills itself this way); it answers its key from now on, unless
        a newer pack does."""
        self._publish(self._answer_file(answer.key), [data])
        self._supersede(answer)

    def _publish_index(self, pack: PackIndex, data: bytes) -> None:
        self._publish(self._pack_file(pack.id), [data])
        self._adopt(pack)

    # -- reading ------------------------------------------------------------------------------

    def _set_aside(self, path: str, section: str, label: str) -> str | None:
        """Moves a damaged file to ``quarantine/<section>/<label>.<time>``, and says where;
        None if it was gone already, OSError if it cannot be moved (a read-only store)."""
        if self.read_only:
            raise OSError(errno.EROFS, "the store was opened with read_only=True", path)
        aside = self.root / "quarantine" / section / f"{label}.{time.time_ns()}"
        try:
            aside.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, aside)
        except FileNotFoundError:
            return None  # already moved or removed by another reader: either way it is gone
        return str(aside)

    def _unreadable(self, section: str, why: OSError) -> StoreError:
        """The error for a file or folder of ``section`` this process cannot read."""
        where = section
        if why.filename is not None:
            where = os.fsdecode(why.filename)
            with contextlib.suppress(ValueError):  # on another drive: named in full
                where = os.path.relpath(where, self.root).replace(os.sep, "/")
        advice = (
            " Run this as a user who may read every file of the store"
            if isinstance(why, PermissionError)
            else f" {_CLOSE_FILES[0].upper()}{_CLOSE_FILES[1:]}"
            if why.errno in OUT_OF_FILES
            else ""
        )
        return StoreError(
            f"cannot read {where} in {self.root} ({why.strerror or why}); nothing was removed "
            f"or changed.{advice}"
        )


_SET_ASIDE_PAUSES = (0.0, 0.01, 0.05, 0.25)
"""How long a bind looks again for a blob it does not find (seconds, one after another): a
gc sets an old blob aside in ``tmp/`` to look at before removing it, and puts one touched
since it listed it back, so a blob put again just before may be away for that moment."""


def _soon(found: Callable[[], bool]) -> bool:
    """Whether ``found()`` holds, now or within :data:`_SET_ASIDE_PAUSES`."""
    for pause in _SET_ASIDE_PAUSES:
        time.sleep(pause)
        if found():
            return True
    return False


def _touched(path: str) -> bool:
    """Touches the file at ``path``, so a gc running now spares it; False when it is not
    there. One here that this process may not touch (a read-only store, another user's)
    counts as touched; OSError when whether it is here cannot be told (a folder of its
    path this process may not search, a file where a folder should be)."""
    try:
        os.utime(path)
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.stat(path)  # here, and only the touch refused? Raises if it cannot be seen
        except FileNotFoundError:
            return False
    return True
