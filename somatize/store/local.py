"""The local store: a directory, laid out as :mod:`somatize.store.base` says, plus
``packs/`` (indexes of packed item answers, :mod:`somatize.store.records`) and
``quarantine/`` (what ``verify`` moved aside).

Every write goes to ``tmp/`` under a name no other writer uses and is published
with an atomic rename, so a reader sees a blob or record whole or not at all,
and two processes writing the same content race to publish identical bytes —
whichever rename lands last changes nothing. A blob is published before the
record or index that refers to it, so a crash at any point leaves at worst an
unreferenced blob or a file in ``tmp/`` (``gc`` removes both). With
``durable=True`` the file and its directory are fsynced before and after the
rename, so a published answer survives a power cut too.

Reading trusts nothing it has not checked: a blob's size is compared with its
record on every read, and its content is hashed against its digest before its
first use in the process. Blobs are immutable, so one verified stays trusted —
unless its file changed since (another inode or modification time), which is
caught by the ``fstat`` every read already does. A blob found damaged is moved
to ``quarantine/`` at once, so the recompute that follows writes it afresh
instead of trusting the damaged file.

Every read hands out memory of the caller's own, so a recalled tensor written in
place changes itself only. A large blob is read afresh for each read, into memory
that starts aligned as torch's own tensors do (:func:`_read_privately`), never a map
of its file, which a write into the file in place would change under the reader; a
whole dataset read in parts (:meth:`LocalStore.local_blob`, a Parquet source) is the
exception, mapped privately (copy on write), so that it is not read whole into
memory, and verified through reads of its file, not the map, so that one cut short
meanwhile is Corrupt, not a fault that ends the process. A small blob is held in
memory once read and handed out as a copy. A reader that copies what it keeps and
writes into nothing (a per-row cache decoding rows) may borrow instead: it is handed
the held bytes, or a read-only mapping kept for the next such read.

Packed item answers are found through an in-memory table of every pack index,
loaded once and refreshed from a listing of ``packs/`` only when a key is not
found and the directory changed. When an answer was last used is recorded in
memory and written as the file time of its record or index in batches, so a
recall costs no extra system call; ``gc`` evicts by it.

This module holds the store itself: how it is opened and addressed, and how it reads —
what it verifies, maps and holds, and how it finds an answer. Its parts are its files
(where each lives, how one is published whole, what a failure says) in
:mod:`somatize.store._local_files`, and what upkeep asks of it, with the file times
that say when answers were used, in :mod:`somatize.store._local_upkeep`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import math
import mmap
import os
import re
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from somatize._threads import hash_read
from somatize.store._local_files import (
    _READ_ONLY,
    SECTIONS_WRITTEN,
    NotAFile,
    Stamp,
    _open_regular,
    _read_file,
    _read_open,
    new_file,
    open_file,
    stamp_of,
    to_disk,
)
from somatize.store._local_upkeep import LocalShelf, _write_uses
from somatize.store._packed import FULL, hash_bytes
from somatize.store.base import (
    MARKER,
    MARKER_DATA,
    MARKER_PART,
    PASSED_OVER,
    READ_ONLY_LOCAL,
    Answer,
    BadAddress,
    Corrupt,
    Missing,
    NameNotFound,
    StoreError,
    check_digests,
    check_name,
    current_directory,
    inside_a_section,
    keys_of,
    no_directory_to_read,
    path_text,
    section_above,
    store_kind,
    unmarked,
)
from somatize.store.records import (
    PACK_HEAD,
    Signer,
    decode_name,
    decode_record,
    pack_created,
    signer_from,
)

__all__ = ["LocalStore", "Stamp", "no_home", "stamp_of"]

_MAP_ABOVE = 1 << 16
"""Blobs larger than this are read into aligned memory of their own (or, borrowed,
memory-mapped) rather than read into bytes."""
_ALIGN = 64
"""Where a large blob read into memory starts: aligned as torch's CPU allocator aligns."""
_TICK = 2_000_000_000
"""Nanoseconds past which a directory's time is surely a tick of the filesystem's clock
behind, where it keeps times of whole seconds (FAT's tick is two)."""
_FINE_TICK = 50_000_000
"""The same, where it keeps times finer than a second (ext4, xfs, btrfs, APFS, NTFS): they
take them from a clock of the kernel's that moves at least every 10 ms."""

_LONGEST_MADE = os.path.join("quarantine", "answers", f"ab_{'0' * 64}.{2**63}")
"""The longest path under its directory of a file a store makes: a record ``verify`` sets
aside, stamped with the time in nanoseconds. A name bound is as long as its caller makes it."""

_LONGEST_READ = os.path.join("answers", "ab", "0" * 64)
"""The longest path under its directory of a file a store opened read-only opens: a record
(a blob's is as long). It makes none, nor sets any aside."""

_MAPS_SHARED = 16
"""How many read-only mappings of large blobs a store keeps between reads that only
borrow them (``recall_many(..., borrow=True)``: a per-row cache reading the pack its next
batch's rows are in again), so their pages are not mapped and faulted in again. Each
holds a file descriptor, so few are kept."""


class _PacksLook:
    """What a local store's last look at ``packs/`` saw: the folder's time, as
    :func:`_to_trust` takes it (-1: list it again); the names listed and the listing made
    of them (pack id → name); and the indexes found damaged, by the stamp of the file read
    (:func:`stamp_of`), read again only once that file is another, not at every look at a
    changed ``packs/``. Beside it, what the looks for :meth:`LocalStore._newest_pack` saw
    (``newest``, ``created``), and the last look at ``answers/`` (``answers``). One
    attribute of the store (a store holds few: see :class:`LocalStore`)."""

    __slots__ = ("answers", "created", "damaged", "found", "names", "newest", "stamp")

    def __init__(self) -> None:
        self.stamp = -1
        self.names: frozenset[str] = frozenset()
        self.found: dict[str, str] = {}
        self.damaged: dict[str, Stamp] = {}
        self.newest: tuple[int, float] = (-1, math.inf)
        """The time of ``packs/`` when it was last listed for the newest pack (-1: to be
        listed again), and the latest ``created`` of the packs it held."""
        self.created: dict[str, float] = {}
        """The name of each pack index in that listing → the ``created`` its first line
        says."""
        self.answers: tuple[int, frozenset[str]] = (-1, frozenset())
        """The time of ``answers/`` when it was last listed (-1: to be listed again), and
        the shard folders that listing held."""


def _to_trust(stamp: int) -> int:
    """``stamp``, the time of a directory just listed, as the one a later look compares its
    own with to tell nothing changed since: -1 (list it again) while it is within a tick of
    now. A directory's time only moves on the clock's tick (coarse: milliseconds, or two
    seconds on FAT), so an entry made later in the tick the listing was made in leaves it
    as it was. A time of whole seconds is taken for one of such a coarse filesystem; a
    finer one is trusted once a few milliseconds old, so a store whose ``packs/`` a
    writer adds to every second (a first epoch) is listed again about once a pack, not
    at every lookup for two seconds after each."""
    return stamp if time.time_ns() - stamp > _tick_of(stamp) else -1


def _in_shards(keys: list[str], shards: frozenset[str] | None) -> list[str]:
    """Those of ``keys`` whose shard folder (the first two hex digits of the key) is among
    ``shards``, the listing of ``answers/`` (None: it could not be listed, so any may be
    there). Where it holds none (a store of rows alone: every lookup of a first epoch), no
    key is looked at one by one."""
    if shards is None:
        return keys
    if not shards:
        return []
    return [key for key in keys if key[7:9] in shards]


def _tick_of(stamp: int) -> int:
    """How far behind the real time of a change ``stamp``, a directory's time, may lie: a
    time of whole seconds is taken for one of a coarse filesystem's (FAT's tick is two)."""
    return _TICK if stamp % 1_000_000_000 == 0 else _FINE_TICK


def _read_privately(handle: io.BufferedReader, size: int, digest: str) -> memoryview:
    """The ``size`` bytes of a large blob, read into memory of the reader's own that
    starts :data:`_ALIGN`-aligned, as torch's own tensors do (so a tensor answer, whose
    data is written so aligned, decodes in place). Not a map of the file: a write into
    the file in place after it was hashed (a sync that rewrites files in place) would
    change the answer under its reader, and a truncation make reading it a fault that
    ends the process. Nor an anonymous map: fresh pages cost a fault each, where the
    heap hands back memory a read before let go of, at several times the speed."""
    room = bytearray(size + _ALIGN - 1)
    lead = -ctypes.addressof(ctypes.c_char.from_buffer(room)) % _ALIGN
    data = memoryview(room)[lead : lead + size]
    got = 0
    while got < size:
        read = handle.readinto(data[got:])
        if not read:
            raise Corrupt(
                f"blob {digest} ended after {got} of its {size} bytes as it was read: it was "
                "truncated or overwritten"
            )
        got += read
    return data


_SCHEME_FIRST = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:(?:/|$)")
"""A relative path whose first segment is a URL's scheme (``s3:``, ``gs:``, ``file:``): a
bucket URL that lost a slash of its ``://``. A drive letter (one character) is not one."""


def _check_not_a_url(path: str | bytes) -> None:
    """Refuses a directory named like a bucket URL missing its ``://`` (``s3:/bucket/x``):
    the filesystem takes it as a relative path, and the answers meant for a bucket would be
    kept in a folder named ``s3:`` under the working directory, seen by no other machine."""
    if isinstance(path, str) and _SCHEME_FIRST.match(path):
        scheme = path.split(":", 1)[0]
        raise BadAddress(
            f"{path!r} reads as a bucket URL missing a slash: opened as a directory it would "
            f"be a folder named `{scheme}:` under the working directory, seen by no other "
            f"machine. Spell a bucket `{scheme}://bucket/prefix`; for a directory of that "
            f"name, say so with `./{path}`"
        )


GITIGNORE = "# made by somatize: a store is kept out of git\n*\n"
"""What a new store's ``.gitignore`` holds: every file of the store, itself included."""

_VARIABLE = re.compile(r"\$(?:\w+|\{[^}]*\})")
"""A shell variable (``$HOME``, ``${SCRATCH}``): the filesystem takes it as it is written."""

_CONTROL = re.compile(r"[\x01-\x1f\x7f]")
"""A control character (a line end, a tab): no directory a user types holds one."""


def _check_spelled_as_meant(path: str, root: Path) -> None:
    """Refuses to make a store at a path that names a shell variable left unexpanded (from
    a config or env file) or holds a control character (a line end kept from a file it was
    read from): the directory made would be named so, under the working directory, and no
    run spelling the path as meant would find its answers. Only the folders to be made
    (of ``root``, the path anchored) are looked at: one there already is what is meant."""
    made = _unmade(root)
    variable = _VARIABLE.search(made)
    if variable is not None:
        raise BadAddress(
            f"a store's directory {path!r} names `{variable.group()}`, which is not "
            "expanded here: it would be made as a folder of that name. Expand it "
            "(os.path.expandvars(path)), or make the directory first to mean that name"
        )
    if _CONTROL.search(made) is not None:
        raise BadAddress(
            f"a store's directory {path!r} holds a control character (a line end, a tab), "
            "most likely kept from the file or variable it was read from: strip it, or "
            "make the directory first to mean that name"
        )


def _unmade(root: Path) -> str:
    """The part of ``root`` below the deepest folder of it that is there: the folders a
    store made at ``root`` would make."""
    there = root
    while not os.path.lexists(there) and there != there.parent:
        there = there.parent
    return str(root.relative_to(there))


def no_home(where: str, path: str) -> BadAddress:
    """What opening a store at ``where`` raises when its directory, ``path``, starts in the
    home of a user this system does not know (``~nosuchuser/x``), or no home is known."""
    home = path.replace(os.sep, "/").split("/", 1)[0]
    return BadAddress(
        f"cannot open a store at {where!r}: `{home}` names no home directory this system "
        "knows; pass the directory's full path"
    )


class LocalStore(LocalShelf):
    """A store in a local directory (created if missing).

    ``durable`` fsyncs every publish; ``signing_key`` (default ``$SOMATIZE_STORE_KEY``) signs
    records, names and pack indexes, and refuses any that are not signed with it.
    ``read_only=True`` writes and removes nothing (no folder made, no marker, no file
    time set), refusing at once what would; a missing directory is refused, not made."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durable: bool = False,
        signing_key: str | bytes | Signer | None = None,
        read_only: bool = False,
    ) -> None:
        self._open_read_only(read_only)
        if not isinstance(path, (str, os.PathLike)):
            none = (
                "; to keep and recall nothing, run the graph without a store (store=None)"
                if path is None
                else ""
            )
            raise TypeError(
                "a store is opened at a directory, named by a str or an os.PathLike, or at a "
                f"bucket URL (s3://bucket/prefix), got a `{type(path).__name__}`{none}"
            )
        if isinstance(path, str) and not path:
            # Path("") is the current directory: a store there would mix its folders with
            # whatever else the directory holds, wherever the program happens to run.
            raise BadAddress(
                "a store's directory is named by a non-empty path, got '' (which would open "
                "a store in the current directory); pass the directory, `'.'` if that is "
                "what you mean, or `store=None` to keep and recall nothing"
            )
        text = path_text(path)
        _check_not_a_url(text)
        if "\x00" in text:
            raise BadAddress(
                f"a store's directory {text!r} holds a NUL character, which no "
                "file name can: pass the directory's path as it is written"
            )
        # Anchored now: a relative path would otherwise follow a later `os.chdir`, and
        # keep answers in (and look for them in) another directory from then on.
        try:
            root = Path(path).expanduser()
            self.root = root if root.is_absolute() else Path(current_directory(text), root)
        except RuntimeError:  # ~user names no user this system knows, or no home is known
            raise no_home(os.fspath(path), os.fspath(path)) from None
        _check_room_below(self.root, _LONGEST_READ if self.read_only else _LONGEST_MADE)
        # Where the path leads, `..` and links followed: the folders it names may pass
        # through another store's section on the way out, or reach into one by a link.
        real = Path(os.path.realpath(self.root))  # a link loop is left for mkdir to report
        found = section_above(
            real.parts, ("blobs", "names", "tmp"), _holds_store, lambda at: str(Path(*at))
        )
        if found is not None:
            where = str(self.root) if real == self.root else f"{self.root} (which is {real})"
            raise inside_a_section(where, found)
        if not os.path.exists(self.root):
            _check_links_lead_somewhere(self.root)
        if self.read_only and not self.root.is_dir():
            raise no_directory_to_read(str(self.root))
        if not self.read_only and not os.path.lexists(self.root):
            _check_spelled_as_meant(text, self.root)
        self.durable = durable
        self._resolved: tuple[tuple[int, int] | None, str] | None = None
        """The root's directory (device, inode) and the root resolved when an address was
        last asked for: resolved again only where the directory is another since."""
        self.signer: Signer | None = signer_from(signing_key)
        kind = _kind_at(str(self.root))
        if kind is None and not _fresh(str(self.root)):
            # Looked at again: what made it no fresh folder may be a store that another
            # process opening it at once (a worker, a rank) made since it was looked at.
            kind = _kind_at(str(self.root))
            if kind is None:
                raise unmarked(
                    str(self.root), "it holds files but no store", "open a store at", BadAddress
                )
        # What is left of an earlier store emptied by its upkeep is read as it is, its
        # folders made as a write needs them: made now, they would make a user's folder
        # that holds the same look like a store to a later gc.
        made = () if kind == "emptied" or self.read_only else SECTIONS_WRITTEN
        for part in made:
            try:
                (self.root / part).mkdir(parents=True, exist_ok=True)
            except OSError as why:
                if why.errno in (*_READ_ONLY, *FULL) and self.root.is_dir():
                    # A store this process may not write, or on a disk with no room for a
                    # folder, copied without its empty folders (`aws s3 sync`, git): it is
                    # read (and collected) as it is, and a write that needs a folder makes it
                    # then, or says the store is read-only, or full.
                    continue
                above = next((at for at in (self.root, *self.root.parents) if at.exists()), None)
                if above is not None and not above.is_dir():
                    # `mkdir` names the folder it would make under a file, not the file.
                    raise StoreError(
                        f"cannot use {self.root} as a store: {above} is a file, not a "
                        "directory; name a directory (made if missing) for the store"
                    ) from why
                raise StoreError(f"cannot use {self.root} as a store: {why}") from why
        self._blobs = f"{self.root / 'blobs'}{os.sep}"
        self._answers = f"{self.root / 'answers'}{os.sep}"
        self._packs_dir = str(self.root / "packs")
        self._tmp = f"{self.root / 'tmp'}{os.sep}"
        if kind != "marked" and kind != "emptied" and not self.read_only:
            self._mark()  # a new store, or one an earlier somatize made
        if self.durable:  # kept only where it is used: a store's few attributes stay shared
            self._synced: dict[str, tuple[int, int]] = {}
        self._hold_nothing()
        # Kept alive by weakref's own registry, not by an attribute: a store is asked a
        # dozen things on every recalled forward, and CPython (3.11 on) makes those calls
        # fast only on an object of fewer than 30 attributes, whose keys its class's
        # objects share (tests/test_engine.py counts them).
        if not self.read_only:  # which sets no file's time
            weakref.finalize(self, _write_uses, str(self.root), self._used, self._used_packs)

    def _mark(self) -> bool:
        """Writes the store's marker at its root, whole (written in ``tmp/``, then renamed);
        False where it cannot be written (a store this process may not write, or a full
        disk), which leaves the store as it was. Its ``.gitignore`` is written first: a
        process killed in between leaves a store not yet marked, which the next one to open
        it marks, rather than a marked one that git would add for good."""
        self._keep_out_of_git()
        try:
            part = self._written_in_tmp(MARKER_DATA)
        except OSError:
            return False
        try:
            os.replace(part, self.root / MARKER)  # the same bytes, whoever writes them
            if self.durable:
                self._sync_directory(self.root)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(part)
            return False
        return True

    def _keep_out_of_git(self) -> None:
        """Writes a ``.gitignore`` of ``*`` at a store's root, where there is none: a store
        made inside a project's checkout (``./store``) is then no part of what ``git add -A``
        adds, as a virtual environment or a tool's cache is not. It is written in ``tmp/``
        and linked into place, so it is whole or absent, and never over one: one of the
        user's own is left as it is. One that cannot be written is left out: git ignoring is
        a courtesy."""
        try:
            part = self._written_in_tmp(GITIGNORE.encode())
        except OSError:
            return
        try:
            os.link(part, self.root / ".gitignore")
        except FileExistsError:
            pass
        except OSError:
            _gitignore_in_place(self.root)  # a filesystem with no hard links
        with contextlib.suppress(OSError):
            os.unlink(part)

    def _written_in_tmp(self, data: bytes) -> str:
        """A new file in ``tmp/`` holding ``data`` (synced, where the store is durable), named
        as a marker being written is: what a store's making leaves there if it is killed."""
        fd, part = new_file(self._tmp, f"{os.getpid()}-", MARKER_PART)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                if self.durable:
                    handle.flush()
                    to_disk(handle.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(part)
            raise
        return part

    def _store_kind(self) -> str | None:
        return _kind_at(str(self.root))

    def _fresh(self) -> bool:
        return _fresh(str(self.root))

    _read_so_far = (
        *LocalShelf._read_so_far,
        "_verified",
        "_maps",
        "_packs_look",
        "_may_write",
    )

    def _hold_nothing(self) -> None:
        self._verified: dict[str, Stamp] = {}
        """Digest → (inode, mtime) of the file that was hashed and matched."""
        self._maps: dict[str, tuple[Stamp, memoryview]] = {}
        """Digest → (inode, mtime) of a verified large blob, and its shared read-only map."""
        self._packs_look = _PacksLook()
        super()._hold_nothing()

    def __getstate__(self) -> dict[str, Any]:
        # The root as resolved is this process's view of the directory: a copy (on another
        # machine, or after a link was repointed) resolves it again. It travels as None, not
        # left out: the release before this one reads it as the resolved path itself.
        return {**super().__getstate__(), "_resolved": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._resolved = None  # one a release before carries is the path alone, no pair

    def __repr__(self) -> str:
        read_only = ", read_only=True" if self.read_only else ""
        return f"Store({str(self.root)!r}{read_only})"

    @property
    def _where(self) -> str:
        return str(self.root)

    # -- address ------------------------------------------------------------------------------

    def address(self) -> dict[str, Any]:
        """The directory (resolved), whether publishes are fsynced, and the fingerprint of
        the signing key: another process on a machine that sees the same directory opens
        this store from it (:meth:`Store.from_address`)."""
        # Resolved again where the root is another directory than when it was resolved (a
        # link to the store repointed since, which this process now writes through): one
        # stat, not a walk of every link on the path, for each job that asks.
        directory = _identity(self.root)
        if self._resolved is None or self._resolved[0] != directory:
            self._resolved = (directory, str(self.root.resolve()))
        return {
            "home": READ_ONLY_LOCAL if self.read_only else "local",
            "root": self._resolved[1],
            "durable": self.durable,
            "signed": None if self.signer is None else self.signer.fingerprint,
        }

    @classmethod
    def _reopen(cls, address: Mapping[str, Any], signer: Signer | None) -> LocalStore:
        """The store at ``address`` (a local one), signing with ``signer`` (None: unsigned)."""
        root, durable = address.get("root"), address.get("durable", False)
        # Read-only by its home; a flag beside `local` (an address written by hand, as a
        # bucket's once was) is honoured too, never dropped to open the store to write.
        flagged = address.get("read_only", False)
        if (
            not isinstance(root, str)
            or not os.path.isabs(root)
            or not isinstance(durable, bool)
            or not isinstance(flagged, bool)
        ):
            raise BadAddress(
                "a local store's address holds its directory as an absolute path (`root`), "
                "`durable` as a bool and, where it is given, `read_only` as a bool; got "
                f"root={root!r}, durable={durable!r}, read_only={flagged!r}"
            )
        read_only = flagged or address.get("home") == READ_ONLY_LOCAL
        store = cls(root, durable=durable, signing_key=signer, read_only=read_only)
        store.signer = signer  # None means unsigned here, not the environment's key
        return store

    # -- reading ------------------------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        return os.path.exists(self._blob_file(digest))

    def open_blob(self, digest: str) -> io.BufferedReader:
        try:
            handle, _ = _open_regular(self._blob_file(digest))
        except FileNotFoundError:
            raise Missing(f"blob {digest} is not in {self.root}") from None
        except (NotAFile, IsADirectoryError) as why:
            raise self._no_blob(digest, why) from None
        except OSError as why:
            raise self._unreadable("blobs", why) from why
        return open_file(handle, "rb")  # the caller closes it

    def _no_blob(self, digest: str, why: OSError) -> Corrupt:
        """What a read of blob ``digest`` says when what is at its path is no file (a FIFO,
        a device): damage, never read, moved to ``quarantine/`` as a damaged blob is."""
        try:
            self._set_aside(self._blob_file(digest), "blobs", digest[7:])
            fate = "was moved to quarantine/ so that it is written afresh"
        except OSError as unmoved:
            fate = f"could not be moved to quarantine/ ({unmoved.strerror})"
        return Corrupt(
            f"blob {digest} in {self.root} is no file a store writes ({why.strerror}): it "
            f"is damaged, was not read, and {fate}"
        )

    def get(self, digest: str) -> memoryview:
        return self._read_blob(digest, None)

    def local_blob(self, digest: str) -> memoryview:
        return self._read_blob(digest, None, mapped=True)

    def verified_stamp(self, digest: str) -> Stamp | None:
        """What the file of blob ``digest`` was (``stamp_of``: its inode, size and times)
        when this object last hashed it to its digest; None if it has not, or has let go
        of it since. A reader holding the file open (:meth:`open_blob`) tells it changed
        since by ``stamp_of(os.fstat(fd))``."""
        return self._verified.get(digest)

    def _read_blob(
        self, digest: str, size: int | None, borrow: bool = False, mapped: bool = False
    ) -> memoryview:
        held = self._held(digest, size, borrow)
        if held is not None:
            return held
        path = self._blob_file(digest)
        found = ""
        try:
            opened, stat = _open_regular(path)
        except FileNotFoundError:
            raise Missing(f"blob {digest} is not in {self.root}") from None
        except (NotAFile, IsADirectoryError) as why:
            raise self._no_blob(digest, why) from None
        except OSError as why:  # another user's (EACCES), a file where a folder should be
            raise self._unreadable("blobs", why) from why
        try:
            with open_file(opened, "rb") as handle:
                actual = stat.st_size
                if size is not None and actual != size:
                    raise Corrupt(
                        f"blob {digest} holds {actual} bytes where its answer says {size}: "
                        "it was truncated or overwritten"
                    )
                stamp = stamp_of(stat)
                if actual > _MAP_ABOVE and borrow:
                    shared = self._maps.get(digest)
                    if shared is not None and shared[0] == stamp:
                        return shared[1]  # the file hashed to its name when it was mapped
                if actual > _MAP_ABOVE and (borrow or mapped):
                    if self._verified.get(digest) != stamp:
                        # Hashed through reads, not the map: a blob cut short meanwhile is
                        # then Corrupt, not a fault that ends the process.
                        read = hash_read(handle, actual)
                        if read is None:
                            raise Corrupt(
                                f"blob {digest} ended before its {actual} bytes as it was "
                                "hashed: it was truncated or overwritten"
                            )
                        found = read
                    # Borrowed: one read-only map, kept for the next such read. Mapped: a
                    # private map per read, as one shared between reads would carry what
                    # one caller wrote into it to the next.
                    access = mmap.ACCESS_READ if borrow else mmap.ACCESS_COPY
                    try:
                        data = memoryview(mmap.mmap(handle.fileno(), 0, access=access))
                    except OSError:
                        # A filesystem that maps no files (FUSE with direct_io, some
                        # network mounts: ENODEV): read, and hashed as read, not as hashed
                        # before. Kept by no map between reads: it is memory of its own.
                        handle.seek(0)
                        data = _read_privately(handle, actual, digest)
                        found, borrow = "", False
                elif actual > _MAP_ABOVE:
                    data = _read_privately(handle, actual, digest)
                else:
                    raw = _read_open(opened, actual)
                    if len(raw) != actual:
                        raise Corrupt(
                            f"blob {digest} ended after {len(raw)} of its {actual} bytes as "
                            "it was read: it was truncated or overwritten"
                        )
                    data = memoryview(raw)
        except FileNotFoundError:
            raise Missing(f"blob {digest} is not in {self.root}") from None
        except StoreError:  # Corrupt, a blob cut short: said above, and no failing disk
            raise
        except OSError as why:  # failing as it is read (EIO), not only as it is opened
            why.filename = why.filename or path
            raise self._unreadable("blobs", why) from why
        if self._verified.get(digest) != stamp:
            found = found or hash_bytes(data)
            if found != digest:
                try:
                    self._set_aside(path, "blobs", digest[7:])
                    fate = "was moved to quarantine/ so that it is written afresh"
                except OSError as why:
                    fate = f"could not be moved to quarantine/ ({why.strerror})"
                raise Corrupt(
                    f"blob {digest} in {self.root} hashes to {found}: it is damaged, and {fate}"
                )
            self._note_stamp(digest, stamp)
        if actual <= _MAP_ABOVE:
            self._hold(digest, raw)
            return data if borrow else memoryview(bytearray(raw))  # the caller's own
        if borrow:
            with self._lock:
                if len(self._maps) >= _MAPS_SHARED:
                    del self._maps[next(iter(self._maps))]
                self._maps[digest] = (stamp, data)
        return data

    def resolve(self, name: str) -> str:
        check_name(name)
        try:
            data = _read_file(str(self.root / "names" / name))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, NotAFile) as why:
            planted = (
                f" (names/{name} is no file a store writes: {why.strerror})"
                if isinstance(why, NotAFile)
                else ""
            )
            raise NameNotFound(
                f"nothing is bound to `{name}` in {self.root}{planted}; bind it first with "
                f"`store.bind({name!r}, store.put(data))`"
            ) from None
        except OSError as why:
            raise self._unreadable("names", why) from why
        return decode_name(name, data, self.signer)

    def answer(self, key: str) -> Answer | None:
        known = self._known_answer(key)
        if known is not None:
            return known
        # The record first: one kept after every pack answers with no index read (a
        # wrapped model's first answer need not load the indexes of a million rows).
        record, unread = None, None
        try:
            record = self._read_record(key)
        except StoreError as why:
            unread = why  # said unless a pack answers the key
        if record is not None and self._after_every_pack()(record):
            return record
        # Else the packs (a stat when none changed): one newer than the record answers.
        pack = self._packed_after_a_look([key]).get(key)
        if pack is not None:
            return pack.answer(key)
        if unread is not None:
            raise unread
        return record

    def reread(self, key: str) -> None:
        with contextlib.suppress(StoreError):  # unread: the next recall says why
            self._read_record(key)

    def _read_record(self, key: str) -> Answer | None:
        """The record file of ``key``, read and checked; None if there is none, StoreError
        if this process may not read it."""
        path = self._answer_file(key)
        try:
            data = _read_file(path)
        except FileNotFoundError:
            return None
        except (NotAFile, IsADirectoryError) as why:
            raise Corrupt(
                f"the answer record of {key} in {self.root} is no file a store writes "
                f"({why.strerror}): it is damaged, and was not read"
            ) from None
        except OSError as why:
            raise self._unreadable("answers", why) from why
        answer = decode_record(key, data, self.signer)
        self._supersede(answer)
        return answer

    def have(self, keys: Iterable[str]) -> set[str]:
        keys = keys_of(keys)
        found = set()
        items = self._items
        records = self._records
        unresolved = []
        packs: dict[str, bool] = {}
        # Keys held in neither table (every lookup of a first epoch) are told by two passes
        # mapped in C, not a Python step a key.
        held = list(map(items.get, keys))
        if held.count(None) == len(keys) and records.keys().isdisjoint(keys):
            unresolved = list(keys)
        else:
            for key, pack in zip(keys, held, strict=True):
                if pack is not None:
                    whole = packs.get(pack.id)
                    if whole is None:
                        whole = packs[pack.id] = self._whole(pack.blob, pack.size)
                    if whole:
                        found.add(key)
                        continue
                answer = records.get(key)
                if answer is None:
                    unresolved.append(key)
                elif self._whole(answer.value, answer.size):
                    found.add(key)
                else:  # evicted by a gc elsewhere: perhaps kept anew since, so read afresh
                    self._forget(answer)
                    unresolved.append(key)
        # `answers/` looked at once a lookup (a stat): a record kept after the look, as
        # the lookup runs, is one kept after it, as a record kept just after its end. A key
        # whose shard folder it does not hold has no record, and none is opened for it: a
        # store of packed rows holding one loose answer reads no record per row.
        shards = self._record_shards() if unresolved else None
        recorded = _in_shards(unresolved, shards)
        read = self._records_alone(recorded, found) if recorded else {}
        unresolved = [key for key in unresolved if key not in found]
        if unresolved:
            packed = self._packed_after_a_look(unresolved)
            todo = unresolved
            if shards is not None and len(packed) < len(unresolved):
                # Only the packed ones have an answer where `answers/` holds no record of
                # theirs; the others are refused as a read of their records would refuse them.
                may = set(recorded)
                todo = [key for key in unresolved if key in packed or key in may]
                check_digests([key for key in unresolved if key not in packed and key not in may])
            for key in todo:
                pack = packed.get(key)
                try:
                    if pack is not None:
                        answer = pack.answer(key)
                    else:
                        answer = read[key] if key in read else self._read_record(key)
                except Corrupt:
                    continue
                if answer is None:
                    continue
                if pack is not None:
                    whole = packs.get(pack.id)
                    if whole is None:
                        whole = packs[pack.id] = self._whole(pack.blob, pack.size)
                else:
                    whole = self._whole(answer.value, answer.size)
                if whole:
                    found.add(key)
                else:
                    self._forget(answer)
        return found

    def _records_alone(self, keys: list[str], found: set[str]) -> dict[str, Answer | None]:
        """Reads the record of each of ``keys`` before any pack index: adds to ``found`` each
        whose record answers it whatever ``packs/`` holds (see :meth:`_after_every_pack`)
        and whose blob is whole. Key → its record (None: it has none), for each read; one
        that cannot be read is left out, to be read again, and its failure said, unless a
        pack answers its key. Asked only of keys whose shard folder ``answers/`` holds
        (:meth:`_record_shards`), which :meth:`have` looks at once a lookup."""
        read: dict[str, Answer | None] = {}
        alone = None  # weighed once a record is found: a first epoch's rows have none
        for key in keys:
            try:
                answer = read[key] = self._read_record(key)
            except StoreError:
                continue
            if answer is None:
                continue
            alone = alone or self._after_every_pack()
            if alone(answer) and self._whole(answer.value, answer.size):
                found.add(key)
        return read

    def _after_every_pack(self) -> Callable[[Answer], bool]:
        """Whether a record surely answers its key whatever ``packs/`` holds, so that no
        index is read for it: created after every pack there, by the ``created`` each
        carries, as a lookup against the packs would weigh them. No folder's time says so:
        a pack may be stamped after its file went in (by a writer whose clock runs fast, or
        just after an answer stamped so), and a network filesystem stamps files by its
        server's clock, not the writers'."""
        newest = self._newest_pack()
        return lambda answer: answer.created > newest

    def _newest_pack(self) -> float:
        """The latest ``created`` of the packs in ``packs/``, each read from the first line
        of its index, not the whole (an index of a pack of rows holds thousands); infinite
        where one cannot be read there (a lookup against the packs then says what is
        wrong). Listed again only once the folder's time moved, as :meth:`_listed_packs`
        does; an index's ``created`` is read once, its name being the digest of its bytes."""
        look = self._packs_look
        try:
            stamp = os.stat(self._packs_dir).st_mtime_ns
            listed, newest = look.newest
            if stamp == listed:
                return newest
            names = os.listdir(self._packs_dir)
        except FileNotFoundError:
            return -math.inf  # no folder: no pack
        except OSError:  # not for this process to look at: said by the look at the packs
            return math.inf
        known = look.created
        look.created = {
            name: was if (was := known.get(name, math.inf)) < math.inf else self._pack_created(name)
            for name in names
        }
        newest = max(look.created.values(), default=-math.inf)
        look.newest = (_to_trust(stamp), newest)
        return newest

    def _pack_created(self, name: str) -> float:
        """The ``created`` the index ``name`` in ``packs/`` says in its first line; infinite
        where that cannot be read (gone meanwhile, damaged, no index)."""
        try:
            handle, _ = _open_regular(f"{self._packs_dir}{os.sep}{name}")
        except OSError:
            return math.inf
        try:
            head = os.read(handle, PACK_HEAD)
        except OSError:
            return math.inf
        finally:
            os.close(handle)
        created = pack_created(head)
        return math.inf if created is None else created

    def _whole(self, digest: str, size: int) -> bool:
        """Whether recall would find blob ``digest`` whole: held in memory (its bytes
        matched their digest when read, and recall serves them from there, whatever
        befalls the file since), or a file of the size recorded."""
        held = self._small.get(digest)
        if held is not None and len(held) == size:
            return True
        # ``digest`` comes from a record that was checked when it was read.
        hexed = digest[7:]
        try:
            return os.stat(f"{self._blobs}{hexed[:2]}{os.sep}{hexed}").st_size == size
        except FileNotFoundError:
            return False
        except OSError as why:  # its folder another user's (EACCES), or a file (ENOTDIR)
            raise self._unreadable("blobs", why) from why

    def _listed_packs(self) -> dict[str, str] | None:
        try:
            stamp = os.stat(self._packs_dir).st_mtime_ns
            look = self._packs_look
            if stamp == look.stamp:
                return None
            listed = os.listdir(self._packs_dir)
        except FileNotFoundError:
            return None
        except OSError as why:  # another user's folder (EACCES), a file (ENOTDIR)
            raise self._unreadable("packs", why) from why
        look.stamp = _to_trust(stamp)
        # Made and compared in C, and made again only when the names differ: a first epoch
        # looks at a folder of thousands of packs at every batch, the folder changing with
        # each pack its writer publishes, and a look while its time is still within a tick
        # lists it again to find, as a rule, the names it found before.
        names = frozenset(listed)
        if names != look.names:
            look.names = names
            look.found = dict(zip(map("blake3:".__add__, listed), listed, strict=True))
        found = look.found.copy()
        damaged = look.damaged
        for pack_id, was in list(damaged.items()):
            try:
                same = pack_id in found and stamp_of(os.stat(self._pack_file(pack_id))) == was
            except OSError:
                same = False
            if same:
                del found[pack_id]  # read as damaged before, and not written since
            else:
                del damaged[pack_id]  # gone, or written over (a repair): read it afresh
        return found

    def _index_damaged(self, pack_id: str) -> None:
        with contextlib.suppress(OSError):  # gone or unreadable now: read at the next look
            self._packs_look.damaged[pack_id] = stamp_of(os.stat(self._pack_file(pack_id)))

    def _list_again(self) -> None:
        self._packs_look.stamp = -1

    def _holds_no_records(self) -> bool:
        """Whether ``answers/`` holds nothing, so no record (:meth:`_record_shards`)."""
        return self._record_shards() == frozenset()

    def _record_shards(self) -> frozenset[str] | None:
        """The shard folders ``answers/`` holds, each named by the first two hex digits of
        its records' keys; None where it cannot be listed (records are read as before).
        Listed again only once its time moved (a record goes into a shard folder, and a
        shard made moves it), as ``packs/`` is (:meth:`_listed_packs`). A store of rows
        keeps them in packs: a lookup of rows (a first epoch's, or a fresh process's
        recall) then costs one stat, not a read per row, whatever few loose answers it
        holds beside them."""
        try:
            stamp = os.stat(self._answers).st_mtime_ns
            listed, shards = self._packs_look.answers
            if stamp == listed:
                return shards
            shards = frozenset(os.listdir(self._answers))
        except OSError:  # none there, or not for this process to list: read as before
            return None
        # A shard made later in the tick of this listing would leave the time as it is.
        self._packs_look.answers = (_to_trust(stamp), shards)
        return shards

    def _records_among(self, keys: Sequence[str]) -> dict[str, bytes]:
        """One listing per shard the keys fall in; reads only the records found there."""
        shards: dict[str, set[str]] = {}
        out: dict[str, bytes] = {}
        if self._holds_no_records():
            return out
        for key in keys:
            hexed = key[7:]
            listed = shards.get(hexed[:2])
            if listed is None:
                try:
                    listed = set(os.listdir(f"{self._answers}{hexed[:2]}"))
                except (FileNotFoundError, NotADirectoryError):
                    listed = set()
                except OSError as why:  # another user's folder (EACCES)
                    raise self._unreadable("answers", why) from why
                shards[hexed[:2]] = listed
            if hexed in listed:
                try:
                    out[key] = _read_file(self._answer_file(key))
                except (FileNotFoundError, IsADirectoryError, NotAFile):
                    continue  # removed meanwhile, or no record (a FIFO planted there)
                except OSError as why:
                    raise self._unreadable("answers", why) from why
        return out

    def _read_indexes(self, wanted: dict[str, str]) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}
        for pack_id in wanted:
            try:
                out[pack_id] = _read_file(self._pack_file(pack_id), None)
            except (FileNotFoundError, IsADirectoryError, NotAFile, ValueError):
                # Gone meanwhile, not an index's name, or no index (a FIFO): a miss.
                out[pack_id] = None
            except OSError as why:
                raise self._unreadable("packs", why) from why
        return out

    def _forget_blob(self, digest: str) -> None:
        with self._lock:
            super()._forget_blob(digest)
            self._verified.pop(digest, None)
            self._maps.pop(digest, None)

    # -- upkeep -------------------------------------------------------------------------------

    def _forget_all(self) -> None:
        with self._lock:
            super()._forget_all()
            self._verified.clear()
            self._maps.clear()
            # Each index's `created` is kept: its name is the digest of its bytes, so what
            # its head said stands, and a store of many packs reads none of them again.
            created = self._packs_look.created
            self._packs_look = _PacksLook()
            self._packs_look.created = created


def _gitignore_in_place(root: Path) -> None:
    """Writes a store's ``.gitignore`` where it lies, where there is none, on a filesystem
    that cannot link one written in ``tmp/`` into place."""
    try:
        with open(root / ".gitignore", "x") as handle:
            handle.write(GITIGNORE)
    except OSError:
        pass


def _check_room_below(root: Path, longest: str) -> None:
    """Refuses a store's ``root`` whose path fits the system's limit on a path's length, but
    leaves no room below it for ``longest``, the longest path below it the store opens:
    every keep (or read) would fail then, with "File name too long" and no word of why."""
    limit = _path_limit(root)
    if limit is None:
        return
    below = len(os.fsencode(os.sep + longest))
    length = len(os.fsencode(root))
    most = limit - 1 - below  # the limit counts the NUL that ends a path
    if length <= most:
        return
    raise BadAddress(
        f"cannot open a store at {root}: its path is too long for the files the store makes "
        f"in it. This system takes paths of at most {limit - 1} bytes (PATH_MAX is {limit}), "
        f"and a store's files lie up to {below} bytes below its directory, so that "
        f"directory's path may be at most {most} bytes long; this one is {length}. Open the "
        "store at a shorter path (a symlink to the directory placed higher up will do)"
    )


def _path_limit(root: Path) -> int | None:
    """The longest path the system takes, in bytes with the NUL that ends it (PATH_MAX),
    asked of the folder nearest ``root`` that is there; None where it sets none, or cannot
    be asked (Windows)."""
    if not hasattr(os, "pathconf"):
        return None
    for at in (root, *root.parents):
        try:
            limit = os.pathconf(at, "PC_PATH_MAX")
        except (FileNotFoundError, NotADirectoryError):
            continue
        except (OSError, ValueError):
            return None
        return limit if limit > 0 else None
    return None


def _check_links_lead_somewhere(root: Path) -> None:
    """Refuses a store's ``root`` reached through a link that leads nowhere (a disk not
    mounted, a folder moved) or round in a loop, naming the link and where it leads: what
    the filesystem says of it ("File exists", or a folder that holds files) names neither."""
    for at in (*reversed(root.parents), root):
        if not os.path.islink(at) or os.path.exists(at):
            continue
        target = os.readlink(at)
        try:
            os.stat(at)
        except OSError as why:
            what = "goes round in a loop" if why.errno == errno.ELOOP else "leads to nothing there"
        else:  # there since it was looked at: what else is wrong is for mkdir to say
            continue
        raise BadAddress(
            f"cannot open a store at {root}: `{at}` is a link to {target!r}, which {what} "
            "(a disk not mounted, a folder moved?); mount or make what it leads to, or "
            "point the link at the store's directory"
        )


def _identity(path: Path) -> tuple[int, int] | None:
    """The directory ``path`` leads to now, as (device, inode); None where it is gone."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _kind_at(root: str) -> str | None:
    """What the directory ``root`` holds (:func:`~somatize.store.base.store_kind`)."""

    def holds(entry: str) -> bool:
        path = os.path.join(root, entry)
        return os.path.lexists(path) if entry == MARKER else os.path.isdir(path)

    return store_kind(holds)


def _holds_store(root: str) -> bool:
    """Whether the directory ``root`` holds a store, marked or of an earlier layout."""
    return _kind_at(root) is not None


_OWN_FOLDERS = frozenset(("blobs", "names", "answers", "packs", "tmp", "quarantine"))


def _fresh(root: str) -> bool:
    """Whether a new store may be made at ``root``: no such directory (yet), or one holding
    nothing but empty folders a store makes (a store's making, stopped before its marker,
    or another process's, its marker being written in ``tmp/``), and the files a file
    browser or git keeps in such a folder (:data:`PASSED_OVER`)."""
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                if entry.name in PASSED_OVER:
                    continue
                if entry.name not in _OWN_FOLDERS or not entry.is_dir(follow_symlinks=False):
                    return False
                with os.scandir(entry.path) as inside:
                    for found in inside:
                        if entry.name != "tmp" or not found.name.endswith(MARKER_PART):
                            return False
    except FileNotFoundError:
        return True
    except NotADirectoryError:
        return True  # said as the folders are made: a file, not a directory
    except OSError:
        return False
    return True
