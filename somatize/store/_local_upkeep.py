"""What upkeep asks of a local store: its files listed, read, removed and moved aside,
section by section — and when answers were used, written as the times of their files.

Collecting and checking are written once for every home (:mod:`somatize.store.upkeep`),
over the primitives of a :class:`~somatize.store.upkeep.Shelf`; in a local store they
are plain file operations on the directory. A folder or file this process may not
read is an error, never left out: upkeep would take what it holds for unused, or the
store for whole. A record is dropped by renaming it into ``tmp/`` first and comparing
it there, so one a writer publishes again under its name from that moment on is a new
file, never removed. On a disk too full to make ``tmp/`` where it is missing (a store
copied without its empty folders), gc still removes: a blob is set aside in its own
folder instead, and a record compared and removed in place.

When an answer was last used is written as the file time of its record or pack index
(:func:`_write_uses`), in batches, on close, when the store is let go and as its process
ends (a multiprocessing child too), so a recall costs no extra system call; ``gc`` evicts
by it.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import multiprocessing.util
import os
import re
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from stat import S_ISREG

import blake3

from somatize._threads import hash_read
from somatize.store._local_files import (
    _READ_ONLY,
    ONE_FILESYSTEM,
    SMALL_FILE,
    LocalFiles,
    NotAFile,
    _open_regular,
    _read_file,
    refuse_led_nowhere,
)
from somatize.store._packed import FULL, WRITE_NAME, hash_bytes
from somatize.store.base import MARKER, StoreError, holds_store, prune_above
from somatize.store.upkeep import Entry, _laid_out, blob_digest


def _write_uses(root: str, answers: dict[str, float], packs: dict[str, float]) -> None:
    """Sets the file time of each record (``answers``: key → time) and pack index (``packs``:
    id → time) to when it was last used; files gone meanwhile are skipped."""
    records = {f"{key[7:9]}/{key[7:]}": when for key, when in answers.items()}
    indexes = {pack[7:]: when for pack, when in packs.items()}
    _set_times(root, {"answers": records, "packs": indexes})


def _set_times(root: str, times: dict[str, dict[str, float]]) -> None:
    """Sets the time of each file of the store at ``root`` named in ``times`` (section → its
    name there → time); files gone meanwhile are skipped."""
    for section, named in times.items():
        base = f"{root}{os.sep}{section}{os.sep}"
        for name, when in named.items():
            _set_time(base + name.replace("/", os.sep), when)


def _set_time(path: str, when: float) -> None:
    """Sets the time of the file at ``path`` to ``when``. Only a file's owner may set a
    time of their choosing: a file another user of a shared store made, which this user
    may write, is stamped with the time now instead, which anyone who may write it may
    set (``when`` lies a moment before: uses are written down in batches). Else a gc would
    take an answer other users recall all day for one nobody used since its owner did."""
    # Gone meanwhile, or read-only: a time is advice, never an error.
    with contextlib.suppress(OSError):
        try:
            os.utime(path, (when, when))
        except PermissionError as why:
            if why.errno != errno.EPERM:
                raise
            os.utime(path)


_USERS: tuple[int, weakref.WeakSet[LocalShelf]] | None = None
"""This process's id, and the local stores that noted uses in it: each writes them down as
the process ends (:meth:`LocalShelf._written_down_at_exit`)."""


def _write_down_at_exit(stores: weakref.WeakSet[LocalShelf]) -> None:
    """Writes down when the answers ``stores`` recalled were used; advice, never an error."""
    for store in list(stores):
        with contextlib.suppress(Exception):
            store._flush_use()


def _hash_at(path: str) -> str:
    """The digest of the bytes of the file at ``path``; OSError (NotAFile for what is no
    regular file) if it cannot be read."""
    handle, stat = _open_regular(path)
    try:
        if stat.st_size == 0:
            return "blake3:" + blake3.blake3(b"").hexdigest()
        try:
            mapped = mmap.mmap(handle, 0, access=mmap.ACCESS_READ)
        except OSError:
            # A filesystem that maps no files (FUSE with direct_io, some network mounts:
            # ENODEV) is read instead.
            with open(handle, "rb", buffering=0, closefd=False) as reader:
                read = hash_read(reader, None)
            assert read is not None  # read to its end, never cut short
            return read
        with mapped:
            return hash_bytes(mapped)
    finally:
        os.close(handle)


class LocalShelf(LocalFiles):
    """The files of a local store as upkeep sees them (a
    :class:`~somatize.store.upkeep.Shelf`); see the module docstring."""

    def _section(self, section: str) -> Path:
        return self.root / section

    def _entries(self, section: str) -> list[Entry]:
        """Every file of ``section``. A folder or file this process may not read (another
        user's, made with umask 077) is a StoreError, never left out: upkeep would take what
        it holds for unused (gc removing the blobs it refers to) or the store for whole."""
        base = str(self._section(section))
        out = []

        def unlisted(why: OSError) -> None:
            if not isinstance(why, FileNotFoundError):  # absent: nothing written there yet
                raise self._unreadable(section, why) from why

        # A folder symlinked elsewhere (a shard moved to make room) is walked, as readers
        # follow it; one reached twice (a link to a folder already walked) is not. In one
        # a link leads to out of the store (the section itself a link included), only the
        # store's files are listed, and only the folders it writes walked: gc removes what
        # it lists in blobs/ and tmp/, and a link to `/` would walk the whole filesystem.
        walked: set[tuple[int, int]] = set()
        home = (os.path.realpath(self.root),)
        looping: dict[str, str] = {}
        refuse_led_nowhere(section, base, section)
        for folder, folders, files in os.walk(base, onerror=unlisted, followlinks=True):
            try:
                here = os.stat(folder)
            except FileNotFoundError:
                folders[:] = []
                continue
            except OSError as why:
                raise self._unreadable(section, why) from why
            if (here.st_dev, here.st_ino) in walked:
                folders[:] = []
                continue
            walked.add((here.st_dev, here.st_ino))
            if folder != base and section in ("blobs", "tmp") and _a_store(folder, folders):
                # Another store, made here before this one was opened above it: none of
                # this one's files, which gc would remove.
                folders[:] = []
                continue
            inside = folder[len(base) + 1 :].replace(os.sep, "/")  # "ab" in answers/ab/
            lead = f"{inside}/" if inside else ""
            if section == "names" and holding_the_store(home[0], folder, looping, inside):
                folders[:] = []
                continue
            if section in _LAID_OUT and not _within(os.path.realpath(folder), home):
                # A store writes no folder in tmp/ or packs/, nor in a shard.
                shards = section in _SHARDED and folder == base
                folders[:] = [n for n in folders if shards and _SHARD.fullmatch(n)]
                files = [n for n in files if _ours(section, lead + n)]
            for name in files:
                try:
                    stat = os.stat(f"{folder}{os.sep}{name}")
                except FileNotFoundError:  # removed meanwhile, or a link leading nowhere
                    refuse_led_nowhere(
                        section, f"{folder}{os.sep}{name}", f"{section}/{lead}{name}"
                    )
                    continue
                except OSError as why:
                    raise self._unreadable(section, why) from why
                if not S_ISREG(stat.st_mode):  # a FIFO, a device: no file of a store, and
                    continue  # reading one would wait, or read, for good
                out.append(Entry(lead + name, stat.st_size, stat.st_mtime))
        if section == "names":
            self._names_looping = looping
        return out

    def _links_out(self, section: str, names: list[str]) -> dict[str, str]:
        return links_led_out(str(self.root), section, names)

    def _read_many(self, section: str, names: list[str]) -> dict[str, bytes | None]:
        base = f"{self._section(section)}{os.sep}"
        cap = None if section == "packs" else SMALL_FILE
        out: dict[str, bytes | None] = {}
        for name in names:
            try:
                out[name] = _read_file(base + name, cap)
            except (FileNotFoundError, IsADirectoryError):
                out[name] = None
            except NotAFile:
                # No file a store writes (one larger than any record, a FIFO put there
                # since it was listed): read as nothing, which is damage.
                out[name] = b""
            except OSError as why:
                raise self._unreadable(section, why) from why
        return out

    def _remove(self, section: str, names: list[str]) -> None:
        base = self._section(section)
        for name in names:
            try:
                (base / name).unlink(missing_ok=True)
            except OSError as why:
                self._pass_over(section, name, why)

    def _sweep(self, entries: list[Entry], referred: Callable[[], set[str] | None]) -> list[Entry]:
        """Each blob is renamed into ``tmp/`` first and looked at there: one whose time moved
        since ``entries`` listed it — a writer put it again (:meth:`_already` touches it),
        about to refer to it — is put back; only one left as listed is removed. A writer
        that touches it from the rename on finds it gone, and writes it afresh. What
        remains: while a blob is aside, a recall of a record published in that instant
        referring to it is a miss, recomputed — never a record left pointing at nothing."""
        gone: list[Entry] = []
        if not entries:
            return gone
        staged = self._staging("blobs", entries[0].name)
        for entry in entries:
            with self._in_tmp(".swept") as aside:
                # Without tmp/, set aside in its own folder, named as no blob is: a gc
                # killed meanwhile leaves a stray there, which a later gc removes.
                folder = self._tmp if staged else self._blob_folder(entry.name)
                if self._sweep_one(entry, folder + aside):
                    gone.append(entry)
        return gone

    def _blob_folder(self, name: str) -> str:
        """The folder the blob named ``name`` in ``blobs/`` (``ab/abcd…``) lies in."""
        return f"{self._blobs}{name.rsplit('/', 1)[0].replace('/', os.sep)}{os.sep}"

    def _staging(self, section: str, name: str) -> bool:
        """Whether files of ``section`` (the first to go, ``name``) are set aside in ``tmp/``
        to be removed, made first where it is missing (a store copied without its empty
        folders): False where it cannot be made for want of space, on a full disk, where
        gc is needed most (:meth:`_drop` and :meth:`_sweep` then do without it)."""
        try:
            os.makedirs(self._tmp, exist_ok=True)
        except OSError as why:
            if why.errno in FULL:
                return False
            raise self._unremoved(section, name, why) from why
        return True

    def _sweep_one(self, entry: Entry, aside: str) -> bool:
        """Removes the blob ``entry`` names unless its time moved since it was listed,
        setting it ``aside`` (a path in ``tmp/``) first, as :meth:`_sweep` says."""
        path = f"{self._blobs}{entry.name.replace('/', os.sep)}"
        if not self._into_tmp("blobs", entry.name, path, aside):
            return False
        try:
            # The rename moved its ctime; its mtime moves only when a writer touches it.
            touched = os.stat(aside).st_mtime != entry.mtime
        except FileNotFoundError:
            return True  # removed from tmp/ meanwhile by a gc elsewhere with no grace
        if not touched:
            try:
                os.unlink(aside)
            except FileNotFoundError:
                pass
            except OSError as why:
                # Renamed, yet not removable: it goes back where it was (the same bytes as
                # any a writer put there since, since a blob is named by them).
                with contextlib.suppress(OSError):
                    os.replace(aside, path)
                self._pass_over("blobs", entry.name, why)
                return False
            return True
        self._put_back(aside, path, f"blobs/{entry.name}")
        return False

    def _into_tmp(self, section: str, name: str, path: str, aside: str) -> bool:
        """Renames ``section/name`` (at ``path``) to ``aside`` in ``tmp/``, to be looked at
        there before it is removed; False when it was gone already (removed meanwhile, by a
        gc elsewhere)."""
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        except OSError as why:
            self._pass_over(section, name, why)
            return False
        return True

    def _pass_over(self, section: str, name: str, why: OSError) -> None:
        """Notes ``section/name`` as a file this process may not remove (in a folder of
        another user of a shared store), for the gc to go on past it, so that what else it
        would remove still goes, oldest first, and a budget is met where it can be. Any
        other failure (a read-only disk, a section on another filesystem) stops it
        (StoreError): every file would fail so."""
        if why.errno not in (errno.EACCES, errno.EPERM):
            raise self._unremoved(section, name, why) from why
        with self._lock:
            self._sweeps.passed[f"{section}/{name}"] = os.strerror(why.errno)

    def _unremoved(self, section: str, name: str, why: OSError) -> StoreError:
        if why.errno == errno.EXDEV:
            return StoreError(
                f"could not remove {section}/{name} from {self.root} through tmp/: "
                f"{ONE_FILESYSTEM}; what was removed before is gone"
            )
        readonly = why.errno in _READ_ONLY
        return StoreError(
            f"could not remove {section}/{name} from {self.root}"
            + (": the store is read-only for this process" if readonly else "")
            + f" ({why.strerror}). What was removed before is gone, the rest is as it "
            "was; run gc where the store can be written"
        )

    def _drop(self, section: str, listed: dict[str, bytes]) -> set[str]:
        """Each file is first renamed into ``tmp/`` — atomically, so that a record a writer
        publishes under its name from that moment on is a new file, never removed — and
        compared there with what was listed: only one still as listed is removed. One
        published again between the listing and the rename is put back, unless a writer
        published a newer one meanwhile, which stays. What remains: while a record is set
        aside its key is a miss to readers, and a gc killed in that instant leaves it in
        ``tmp/`` (removed by a later gc) — a miss either way, recomputed, never a wrong
        answer."""
        gone: set[str] = set()
        if not listed:
            return gone
        if not self._staging(section, next(iter(listed))):
            return {name for name, was in listed.items() if self._drop_here(section, name, was)}
        for name, was in listed.items():
            with self._in_tmp(".dropped") as aside:
                if self._drop_one(section, name, was, self._tmp + aside):
                    gone.add(name)
        return gone

    def _drop_here(self, section: str, name: str, was: bytes) -> bool:
        """Drops ``section/name`` if it holds ``was``, where it lies: without ``tmp/`` to set
        it aside in (:meth:`_staging`). A record set aside in its own folder, under another
        name, would be a stray for good if gc were killed meanwhile (one kept by hand, never
        collected), so it is compared and removed in place: one a writer publishes again in
        that instant is removed with it, a miss, recomputed, never a wrong answer."""
        path = f"{self._section(section)}{os.sep}{name}"
        try:
            unchanged = _read_file(path, None) == was
        except OSError:
            unchanged = False  # removed meanwhile (a gc elsewhere), or it cannot be told
        if not unchanged:
            return False
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        except OSError as why:
            self._pass_over(section, name, why)
            return False
        return True

    def _drop_one(self, section: str, name: str, was: bytes, aside: str) -> bool:
        """Drops ``section/name`` if it holds ``was``, setting it ``aside`` (a path in
        ``tmp/``) first, as :meth:`_drop` says; whether it is gone."""
        path = f"{self._section(section)}{os.sep}{name}"
        if not self._into_tmp(section, name, path, aside):
            return False
        try:
            # Fresh in tmp/, where a gc elsewhere removes only what is old.
            with contextlib.suppress(OSError):
                os.utime(aside)
            unchanged = _read_file(aside, None) == was
        except FileNotFoundError:
            # A gc in another process with no grace removed it from tmp/ meanwhile: it is
            # gone, as this one meant it to be.
            return True
        except OSError:
            unchanged = False  # it cannot be told: it is put back
        if unchanged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(aside)
            return True
        self._put_back(aside, path, f"{section}/{name}")
        return False

    def _put_back(self, aside: str, path: str, what: str) -> None:
        """Puts a file :meth:`_drop` set aside back at ``path``, unless one was published
        there meanwhile: that one is newer, and stays."""
        try:
            os.link(aside, path)  # never over a file: FileExistsError if one is there
        except FileExistsError:
            pass
        except OSError:
            # No hard links on this filesystem (some network ones): a rename puts it back,
            # over a record a writer published in the instant since, if any — a record of
            # the same key, so at worst an older answer, never a wrong one.
            try:
                os.replace(aside, path)
            except FileNotFoundError:
                return  # removed from tmp/ meanwhile (a gc elsewhere, with no grace): gone
            except OSError as why:
                raise StoreError(
                    f"could not put {what} back in {self.root} after finding it kept again "
                    f"meanwhile ({why.strerror}); it is at {aside}, and is a miss until it "
                    "is moved back or the answer is kept again"
                ) from why
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside)

    def _quarantine(self, section: str, name: str, was: bytes | None = None) -> bool | None:
        """Given ``was``, the file is moved aside and compared there: one a writer published
        anew since it was judged is put back (never over one published since), and None
        said. A name moved aside takes the folders of ``names/`` it leaves empty with it.
        A name in a folder a link leads to out of the store is left in place (StoreError):
        every file there reads as a name, and is most likely a file of someone's own."""
        if section == "names":
            refuse_name_led_out(str(self.root), name)
        moved = self._set_aside_as_judged(section, name, was)
        if moved and section == "names":
            self._prune_names(name)
        return moved

    def _prune_names(self, name: str) -> None:
        """Removes the folders of ``names/`` above ``name`` left empty (:func:`prune_above`);
        a bind that finds one gone as it renames its name into it makes it again
        (:meth:`_place`)."""
        names = self._section("names")
        prune_above(name, lambda folder: os.rmdir(names / folder))

    def _set_aside_as_judged(
        self, section: str, name: str, was: bytes | None = None
    ) -> bool | None:
        """Moves ``section/name`` aside, as :meth:`_quarantine` says."""
        path = str(self._section(section) / name)
        try:
            moved = self._set_aside(path, section, name.replace("/", "_"))
        except OSError as why:
            raise StoreError(
                f"could not move {section}/{name} to quarantine/ in {self.root} "
                f"({why.strerror}): it is still in place"
            ) from why
        finally:
            self._forget_all()
        if moved is None:
            return False
        if section == "blobs" and was is None:
            # Judged damaged when it was hashed: a reader may have moved that one aside
            # since, and a writer put the blob afresh, whole, which is put back.
            try:
                whole = _hash_at(moved) == blob_digest(name)
            except OSError:
                whole = False  # it cannot be told: it stays aside, as judged
            if not whole:
                return True
            self._put_back(moved, path, f"{section}/{name}")
            return None
        if was is None:
            return True
        try:
            unchanged = _read_file(moved, None) == was
        except FileNotFoundError:
            return True  # moved on from quarantine/ by hand meanwhile
        except OSError:
            unchanged = False  # it cannot be told: it is put back
        if unchanged:
            return True
        self._put_back(moved, path, f"{section}/{name}")
        return None

    def _rehash(self, digest: str, size: int | None = None) -> str | None:
        try:
            return _hash_at(self._blob_file(digest))
        except (FileNotFoundError, NotAFile, IsADirectoryError):
            # Removed meanwhile, or no file (a FIFO put there since it was listed, which
            # a listing leaves out too): no blob is here.
            return None
        except OSError as why:
            raise self._unreadable("blobs", why) from why

    def _clock_ahead(self) -> float:
        """How far this machine's clock runs ahead of the one that stamps the store's files,
        which a gc weighs against its grace: a directory shared over a network filesystem
        (NFS) has its files stamped by its server, and a gc on a machine minutes ahead would
        take a blob another machine put a moment ago, not yet bound or referred to, or a
        write it has in ``tmp/``, for one made minutes ago. Found from a file made in
        ``tmp/`` and removed: the filesystem stamped it before this clock is read, so what
        is found is never less than the lead, nor the grace shorter than asked. 0 where
        ``tmp/`` cannot be written (a read-only store): the ages are then this machine's."""
        with self._in_tmp(".clock") as name:
            try:
                with self._created(self._tmp + name) as probe:
                    stamped = os.fstat(probe.fileno()).st_mtime
            except OSError:
                return 0.0
            now = time.time()
            with contextlib.suppress(OSError):
                os.unlink(self._tmp + name)
        return now - stamped

    def _flush_use(self) -> None:
        taken = self._take_uses()
        if not self.read_only:  # dropped: a time is advice, and this store sets none
            _write_uses(str(self.root), *taken)

    def _written_down_at_exit(self) -> None:
        """The store is let go of at exit (a finalizer writes its uses down then), but a
        multiprocessing child (a DataLoader worker) ends with os._exit, which runs no
        atexit handler, and a store unpickled (the worker's copy of a dataset holding it)
        was never handed to one: what such a worker recalled every epoch kept the time it
        was last written, and a gc elsewhere took it for the least recently used. So the
        first process to note a use registers a finalizer given an exit priority, which
        multiprocessing runs as a child's target returns, as the interpreter does at exit."""
        global _USERS
        users = _USERS
        if users is None or users[0] != os.getpid():  # a forked child forgot its parent's
            users = _USERS = (os.getpid(), weakref.WeakSet())
            multiprocessing.util.Finalize(None, _write_down_at_exit, (users[1],), exitpriority=0)
        users[1].add(self)

    def _uses(self, merge: bool = True) -> dict[tuple[str, str], float]:
        return {}

    def _stamp(self, names: dict[str, list[str]], when: float) -> None:
        """A file's time is when a record or pack index was last used, or a blob or a write
        in ``tmp/`` made, so one later than a gc's clock (a store copied with its times, by
        ``rsync -a`` or tar, from a machine whose clock ran ahead) is set to the gc's."""
        _set_times(str(self.root), {s: dict.fromkeys(listed, when) for s, listed in names.items()})


_SHARD = re.compile("[0-9a-f]{2}")
_SHARDED = ("blobs", "answers")
"""The sections whose files lie in a folder named by their digest's first two hex digits."""
_LAID_OUT = (*_SHARDED, "packs", "tmp")
"""The sections each of whose files the store names by a fixed layout (:func:`_ours`)."""


def _ours(section: str, name: str) -> bool:
    """Whether ``name``, in a section of :data:`_LAID_OUT`, is laid out as the store lays its
    files out there: a blob, a record, a pack index, or a write in flight (a crash may have
    left)."""
    return WRITE_NAME.fullmatch(name) is not None if section == "tmp" else _laid_out(section, name)


def refuse_name_led_out(root: str, name: str) -> None:
    """StoreError when the name ``name`` of the store in the directory ``root`` lies in a
    folder a link in ``names/`` leads to out of it: every file there reads as a name, and is
    most likely a file of someone's own, never to be moved into the store's quarantine."""
    folder = os.path.realpath(os.path.dirname(os.path.join(root, "names", name)))
    if not _within(folder, (os.path.realpath(root),)):
        raise StoreError(
            f"names/{name} lies in {folder}, a folder a link in names/ leads to out of "
            f"{root}: it is left in place. Remove the link if that folder holds no names of "
            "this store"
        )


def holding_the_store(home: str, folder: str, looping: dict[str, str], inside: str) -> bool:
    """Whether ``folder`` of ``names/`` (``inside`` it, as ``team``; "" for the section) is,
    links followed, the store's own real folder ``home`` or one holding it (a link to `/`):
    walking it would walk the store again, and every folder beside it, to any depth. It is
    noted in ``looping``, as ``names/team``, with the folder it leads to."""
    real = os.path.realpath(folder)
    if not _within(home, (real,)):
        return False
    looping["/".join(filter(None, ("names", inside)))] = real
    return True


def links_led_out(root: str, section: str, names: list[str]) -> dict[str, str]:
    """Of the folders ``names`` of ``section`` lie in, in the store in the directory ``root``,
    the first on each one's way (the section itself included) that a link leads out of the
    store by, as ``names/team``, and the real folder it leads to."""
    home = (os.path.realpath(root),)
    real: dict[str, str] = {}  # by folder: the names of a folder share its way
    out: dict[str, str] = {}
    for name in names:
        way = section
        for part in ["", *name.split("/")[:-1]]:
            way = f"{way}/{part}" if part else way
            if way not in real:
                real[way] = os.path.realpath(os.path.join(root, way))
            if not _within(real[way], home):
                out[way] = real[way]
                break
    return out


def only_ours_led_out(root: str, section: str, names: list[str]) -> list[str]:
    """Of ``names`` in ``section`` (``blobs`` or ``tmp``) of the store in the directory
    ``root``, those that lie in it, links followed, and those laid out as the store's own
    files where a link leads out of it: gc removes what else lies there as stray."""
    home = (os.path.realpath(root),)
    inside: dict[str, bool] = {}  # by folder: a few hundred shards, not one a blob
    out = []
    for name in names:
        folder = os.path.dirname(os.path.join(root, section, name))
        if folder not in inside:
            inside[folder] = _within(os.path.realpath(folder), home)
        if inside[folder] or _ours(section, name):
            out.append(name)
    return out


def _within(path: str, homes: tuple[str, ...]) -> bool:
    """Whether the real ``path`` of a folder lies in one of the real folders ``homes``."""
    return any(path == home or path.startswith(home.rstrip(os.sep) + os.sep) for home in homes)


def _a_store(folder: str, folders: list[str]) -> bool:
    """Whether ``folder``, holding ``folders``, holds a store (:func:`holds_store`)."""

    def holds(at: str) -> bool:
        if at == MARKER:
            return os.path.lexists(os.path.join(folder, at))
        return at in folders if "/" not in at else os.path.isdir(os.path.join(folder, at))

    return holds_store(holds)
