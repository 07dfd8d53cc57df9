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
place changes itself only. A large blob is memory-mapped afresh for each read,
privately (copy on write), so it is not copied: a write into it copies the pages
written, never reaching the file or another read. A small blob is held in memory
once read and handed out as a copy. A reader that copies what it keeps and writes
into nothing (a per-row cache decoding rows) may borrow instead: it is handed the
held bytes, or a read-only mapping kept for the next such read.

Packed item answers are found through an in-memory table of every pack index,
loaded once and refreshed from a listing of ``packs/`` only when a key is not
found and the directory changed. When an answer was last used is recorded in
memory and written as the file time of its record or index in batches, so a
recall costs no extra system call; ``gc`` evicts by it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import mmap
import os
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import blake3

from somatize._threads import process_pool
from somatize.store._packed import PackedHome, digest_of, hash_bytes, nbytes, pieces_of
from somatize.store.base import (
    Answer,
    BadAddress,
    Buffer,
    Corrupt,
    Missing,
    NameNotFound,
    StoreError,
    StoreFull,
    check_digest,
    check_name,
    keys_of,
    names_above,
    nested,
    unbacked,
    unbound,
)
from somatize.store.records import (
    PackIndex,
    Signer,
    decode_name,
    decode_record,
    encode_name,
    signer_from,
)
from somatize.store.upkeep import Entry

__all__ = ["LocalStore"]

_MAP_ABOVE = 1 << 16
"""Blobs larger than this are memory-mapped rather than read."""
_MAPS_SHARED = 16
"""How many read-only mappings of large blobs a store keeps between reads that only
borrow them (``recall_many(..., borrow=True)``: a per-row cache reading the pack its next
batch's rows are in again), so their pages are not mapped and faulted in again. Each
holds a file descriptor, so few are kept."""
_OVERLAP = 16 << 20
"""Blobs this large are hashed while they are written, not before."""
_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
"""What the filesystem says when this process may not change the store (a read-only disk,
another user's files)."""


def _hashers() -> ThreadPoolExecutor:
    """A thread that hashes large blobs while they are written, made on first use."""
    return process_pool("somatize-hash", 1)


def _read_file(path: str) -> bytes:
    """The bytes of the file at ``path``: two system calls and a copy for a small file
    (a record), where a Python file object costs several times that."""
    handle = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        chunks = []
        while chunk := os.read(handle, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(handle)


def _write_uses(root: str, answers: dict[str, float], packs: dict[str, float]) -> None:
    """Sets the file time of each record (``answers``: key → time) and pack index (``packs``:
    id → time) to when it was last used; files gone meanwhile are skipped."""
    sep = os.sep
    for section, used in (("answers", answers), ("packs", packs)):
        for digest, when in used.items():
            hexed = digest[7:]
            shard = f"{hexed[:2]}{sep}" if section == "answers" else ""
            # Gone meanwhile, or read-only: recency is advice, never an error.
            with contextlib.suppress(OSError):
                os.utime(f"{root}{sep}{section}{sep}{shard}{hexed}", (when, when))


class LocalStore(PackedHome):
    """A store in a local directory (created if missing).

    ``durable`` fsyncs every publish; ``signing_key`` (default ``$SOMATIZE_STORE_KEY``) signs
    records, names and pack indexes, and refuses any that are not signed with it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durable: bool = False,
        signing_key: str | bytes | Signer | None = None,
    ) -> None:
        self.root = Path(path).expanduser()
        self.durable = durable
        self._resolved: str | None = None
        """The root, resolved the first time an address was asked for (once, not per job)."""
        self.signer: Signer | None = signer_from(signing_key)
        for part in ("blobs", "names", "answers", "packs", "tmp"):
            try:
                (self.root / part).mkdir(parents=True, exist_ok=True)
            except OSError as why:
                if why.errno in _READ_ONLY and self.root.is_dir():
                    # A store this process may not write, copied without its empty folders
                    # (`aws s3 sync`, git): it is read as it is, and a write that needs a
                    # folder makes it then, or says the store is read-only.
                    continue
                raise StoreError(f"cannot use {self.root} as a store: {why}") from why
        self._blobs = f"{self.root / 'blobs'}{os.sep}"
        self._answers = f"{self.root / 'answers'}{os.sep}"
        self._packs_dir = str(self.root / "packs")
        self._tmp = f"{self.root / 'tmp'}{os.sep}"
        self._verified: dict[str, tuple[int, int]] = {}
        """Digest → (inode, mtime) of the file that was hashed and matched."""
        self._maps: dict[str, tuple[tuple[int, int], memoryview]] = {}
        """Digest → (inode, mtime) of a verified large blob, and its shared read-only map."""
        self._packs_stamp = -1
        self._hold_nothing(str(self.root))
        self._finalizer = weakref.finalize(
            self, _write_uses, str(self.root), self._used, self._used_packs
        )

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # -- address ------------------------------------------------------------------------------

    def address(self) -> dict[str, Any]:
        """The directory (resolved), whether publishes are fsynced, and the fingerprint of
        the signing key: another process on a machine that sees the same directory opens
        this store from it (:meth:`Store.from_address`)."""
        if self._resolved is None:
            self._resolved = str(self.root.resolve())
        return {
            "home": "local",
            "root": self._resolved,
            "durable": self.durable,
            "signed": None if self.signer is None else self.signer.fingerprint,
        }

    @classmethod
    def _reopen(cls, address: Mapping[str, Any], signer: Signer | None) -> LocalStore:
        """The store at ``address`` (a local one), signing with ``signer`` (None: unsigned)."""
        root, durable = address.get("root"), address.get("durable", False)
        if not isinstance(root, str) or not os.path.isabs(root) or not isinstance(durable, bool):
            raise BadAddress(
                "a local store's address holds its directory as an absolute path (`root`) and "
                f"`durable` as a bool, got root={root!r}, durable={durable!r}"
            )
        store = cls(root, durable=durable, signing_key=signer)
        store.signer = signer  # None means unsigned here, not the environment's key
        return store

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

    def _publish(self, target: Path | str, pieces: Sequence[Buffer]) -> tuple[int, int]:
        """Writes ``pieces`` to ``target`` through ``tmp/`` and a rename; returns the new
        file's (inode, mtime)."""
        target = os.fspath(target)
        with self._in_tmp(".part") as name:
            temporary = self._tmp + name
            stat = self._write_temporary(pieces, target, temporary)
            self._place(temporary, target)
        return stat.st_ino, stat.st_mtime_ns

    def _write_temporary(
        self, pieces: Sequence[Buffer], target: str | None, temporary: str
    ) -> os.stat_result:
        """Writes ``pieces`` to ``temporary``, a new file in ``tmp/`` (fsynced when durable);
        its stat. ``target`` names what it is for, in errors."""
        try:
            with self._created(temporary) as out:
                for piece in pieces:
                    out.write(piece)
                out.flush()
                if self.durable:
                    os.fsync(out.fileno())
                return os.fstat(out.fileno())
        except OSError as why:
            raise self._unwritten(temporary, target, why) from why

    def _created(self, temporary: str) -> io.BufferedWriter:
        """``temporary``, a new file in ``tmp/``, open for writing; ``tmp/`` is made first
        when it is not there (a store copied without its empty folders)."""
        try:
            return open(temporary, "wb")
        except FileNotFoundError:
            os.makedirs(self._tmp, exist_ok=True)
            return open(temporary, "wb")

    def writable(self) -> bool:
        """An empty file is made in ``tmp/`` (and ``tmp/`` first where it is missing) and
        removed: False if that is refused as on a read-only disk (:data:`_READ_ONLY`);
        another failure (no inode left) says nothing of what later writes may do."""
        with self._in_tmp(".part") as name:
            probe = self._tmp + name
            try:
                with self._created(probe):
                    pass
            except OSError as why:
                return why.errno not in _READ_ONLY
            with contextlib.suppress(OSError):
                os.unlink(probe)
        return True

    def _place(self, temporary: str, target: str) -> None:
        """Renames a written file of ``tmp/`` to ``target``: it appears whole or not at all."""
        try:
            try:
                os.replace(temporary, target)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.replace(temporary, target)
            if self.durable:
                self._sync_directory(Path(target).parent)
        except OSError as why:
            raise self._unwritten(temporary, target, why) from why

    def _unwritten(self, temporary: str, target: str | None, why: OSError) -> StoreError:
        """The error for a write that failed; the temporary file is removed first (one that
        cannot be, never written or on a read-only disk, is left to gc)."""
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        where = os.path.relpath(target, self.root) if target is not None else "a blob"
        if why.errno in (errno.ENOSPC, errno.EDQUOT):
            return StoreFull(
                f"could not write {where} into {self.root}: no space left ({why.strerror}). "
                "Nothing half-written was left and the store is as it was; free space, or "
                "make room with `somatize store gc --max-bytes SIZE`"
            )
        if why.errno in _READ_ONLY:
            return StoreError(
                f"could not write {where} into {self.root}: the store is read-only for this "
                f"process ({why.strerror}). Nothing was changed; it can still be read. Keep "
                "answers in a store this process may write"
            )
        return StoreError(f"could not write {where} into {self.root}: {why}")

    @staticmethod
    def _sync_directory(directory: Path) -> None:
        handle = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)

    def _put(self, data: Buffer | Sequence[Buffer], claims: list[str]) -> str:
        pieces = pieces_of(data)
        size = nbytes(pieces)
        if size >= _OVERLAP:
            return self._put_large(pieces, size, claims)
        digest = digest_of(pieces)
        self._claim(digest, claims)
        target = self._blob_file(digest)
        if self._already(target, size):
            return digest
        self._verified[digest] = self._publish(target, pieces)
        return digest

    def _put_large(self, pieces: Sequence[Buffer], size: int, claims: list[str]) -> str:
        """A large blob is hashed on another thread while its bytes are written to ``tmp/``,
        and renamed to its digest's name once both are done: the hash costs no time of its
        own. Only the write is wasted when the blob turns out to be here already."""
        hashing = _hashers().submit(digest_of, pieces)
        with self._in_tmp(".part") as name:
            temporary = self._tmp + name
            try:
                stat = self._write_temporary(pieces, None, temporary)
            finally:
                digest = hashing.result()
            self._claim(digest, claims)
            target = self._blob_file(digest)
            if self._already(target, size):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary)
                return digest
            self._place(temporary, target)
        self._verified[digest] = (stat.st_ino, stat.st_mtime_ns)
        return digest

    @staticmethod
    def _already(target: str, size: int) -> bool:
        """Whether the blob at ``target`` is here whole; if so it is touched, so a gc running
        now sees a fresh blob and leaves it for the record about to refer to it. A blob this
        process may not touch (a read-only store, another user's file) is here all the same:
        the touch only guards against a gc, as a bucket's put, which cannot touch, does not."""
        try:
            if os.stat(target).st_size != size:
                return False
            os.utime(target)
        except FileNotFoundError:
            return False  # not here, or removed by a gc just now: it is written afresh
        except OSError:
            pass
        return True

    def bind(self, name: str, digest: str) -> None:
        """The blob is touched first, so a gc running now spares it for the name about to
        point at it, and looked for again once the name is written: a gc that removed it
        meanwhile is said, not left as a name pointing at nothing."""
        check_name(name)
        blob = self._blob_file(digest)
        names = self.root / "names"
        above = next((n for n in names_above(name) if (names / n).is_file()), None)
        if above is not None or (names / name).is_dir():
            raise nested(name, above)
        try:
            os.utime(blob)
        except FileNotFoundError:
            raise unbacked(name, digest, str(self.root)) from None
        except OSError:
            pass  # here, and not this process's to touch (a read-only store, another user's)
        self._publish(names / name, [encode_name(name, digest, self.signer)])
        if not os.path.exists(blob):
            raise unbound(name, digest, str(self.root))

    def _publish_record(self, answer: Answer, data: bytes) -> None:
        self._publish(self._answer_file(answer.key), [data])

    def _take_blob(self, digest: str, pieces: Sequence[Buffer]) -> None:
        """Keeps blob ``digest`` whose bytes were verified elsewhere (a cache in front of a
        bucket fills itself this way, without hashing twice)."""
        target = self._blob_file(digest)
        try:
            if os.stat(target).st_size == nbytes(pieces):
                return
        except FileNotFoundError:
            pass
        self._verified[digest] = self._publish(target, pieces)

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

    def has_blob(self, digest: str) -> bool:
        return os.path.exists(self._blob_file(digest))

    def open_blob(self, digest: str) -> io.BufferedReader:
        try:
            return open(self._blob_file(digest), "rb")  # the caller closes it
        except FileNotFoundError:
            raise Missing(f"blob {digest} is not in {self.root}") from None

    def get(self, digest: str) -> memoryview:
        return self._read_blob(digest, None)

    def local_blob(self, digest: str) -> memoryview:
        return self._read_blob(digest, None)

    def _read_blob(self, digest: str, size: int | None, borrow: bool = False) -> memoryview:
        held = self._held(digest, size, borrow)
        if held is not None:
            return held
        path = self._blob_file(digest)
        try:
            with open(path, "rb") as handle:
                stat = os.fstat(handle.fileno())
                actual = stat.st_size
                if size is not None and actual != size:
                    raise Corrupt(
                        f"blob {digest} holds {actual} bytes where its answer says {size}: "
                        "it was truncated or overwritten"
                    )
                stamp = (stat.st_ino, stat.st_mtime_ns)
                if actual > _MAP_ABOVE and borrow:
                    shared = self._maps.get(digest)
                    if shared is not None and shared[0] == stamp:
                        return shared[1]  # the file hashed to its name when it was mapped
                    data = memoryview(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))
                elif actual > _MAP_ABOVE:
                    # A private mapping per read: one shared between reads would carry what
                    # one caller wrote into it to the next.
                    data = memoryview(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY))
                else:
                    raw = handle.read()
                    data = memoryview(raw)
        except FileNotFoundError:
            raise Missing(f"blob {digest} is not in {self.root}") from None
        if self._verified.get(digest) != stamp:
            found = hash_bytes(data)
            if found != digest:
                try:
                    self._set_aside(path, "blobs", digest[7:])
                    fate = "was moved to quarantine/ so that it is written afresh"
                except OSError as why:
                    fate = f"could not be moved to quarantine/ ({why.strerror})"
                raise Corrupt(
                    f"blob {digest} in {self.root} hashes to {found}: it is damaged, and {fate}"
                )
            self._verified[digest] = stamp
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
            data = (self.root / "names" / name).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NameNotFound(
                f"nothing is bound to `{name}` in {self.root}; bind it first with "
                f"`store.bind({name!r}, store.put(data))`"
            ) from None
        return decode_name(name, data, self.signer)

    def answer(self, key: str) -> Answer | None:
        pack = self._items.get(key)
        if pack is not None:
            return pack.answer(key)
        remembered = self._records.get(key)
        if remembered is not None:
            return remembered
        # Packs first (a stat when none changed): one newer than the record answers.
        self._refresh_packs()
        pack = self._items.get(key)
        if pack is not None:
            return pack.answer(key)
        return self._read_record(key)

    def _read_record(self, key: str) -> Answer | None:
        """The record file of ``key``, read and checked; None if there is none, StoreError
        if this process may not read it."""
        path = self._answer_file(key)
        try:
            data = _read_file(path)
        except FileNotFoundError:
            return None
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
        for key in keys:
            pack = items.get(key)
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
            else:
                self._forget(answer)
        if unresolved:
            self._refresh_packs()
            for key in unresolved:
                pack = items.get(key)
                try:
                    answer = pack.answer(key) if pack is not None else self._read_record(key)
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

    def _listed_packs(self) -> dict[str, str] | None:
        try:
            stamp = os.stat(self._packs_dir).st_mtime_ns
        except FileNotFoundError:
            return None
        # A directory time only moves on the clock's tick: trust it only once it is old.
        if stamp == self._packs_stamp and time.time_ns() - stamp > 2_000_000_000:
            return None
        self._packs_stamp = stamp
        return {"blake3:" + name: name for name in os.listdir(self._packs_dir)}

    def _records_among(self, keys: Sequence[str]) -> dict[str, bytes]:
        """One listing per shard the keys fall in; reads only the records found there."""
        shards: dict[str, set[str]] = {}
        out: dict[str, bytes] = {}
        for key in keys:
            hexed = key[7:]
            listed = shards.get(hexed[:2])
            if listed is None:
                try:
                    listed = set(os.listdir(f"{self._answers}{hexed[:2]}"))
                except (FileNotFoundError, NotADirectoryError):
                    listed = set()
                shards[hexed[:2]] = listed
            if hexed in listed:
                try:
                    with open(self._answer_file(key), "rb") as handle:
                        out[key] = handle.read()
                except FileNotFoundError:
                    continue  # removed meanwhile
        return out

    def _read_indexes(self, wanted: dict[str, str]) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}
        for pack_id in wanted:
            try:
                with open(self._pack_file(pack_id), "rb") as handle:
                    out[pack_id] = handle.read()
            except (FileNotFoundError, ValueError):
                out[pack_id] = None  # gone meanwhile, or not an index's name: a miss
        return out

    def _forget_blob(self, digest: str) -> None:
        with self._lock:
            super()._forget_blob(digest)
            self._verified.pop(digest, None)
            self._maps.pop(digest, None)

    def _set_aside(self, path: str, section: str, label: str) -> bool:
        """Moves a damaged file to ``quarantine/<section>/<label>.<time>``; False if it was
        gone already, OSError if it cannot be moved (a read-only store)."""
        aside = self.root / "quarantine" / section / f"{label}.{time.time_ns()}"
        try:
            aside.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, aside)
        except FileNotFoundError:
            return False  # already moved or removed by another reader: either way it is gone
        return True

    # -- upkeep -------------------------------------------------------------------------------

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

        for folder, _, files in os.walk(base, onerror=unlisted):
            inside = folder[len(base) + 1 :].replace(os.sep, "/")  # "ab" in answers/ab/
            lead = f"{inside}/" if inside else ""
            for name in files:
                try:
                    stat = os.stat(f"{folder}{os.sep}{name}")
                except FileNotFoundError:
                    continue
                except OSError as why:
                    raise self._unreadable(section, why) from why
                out.append(Entry(lead + name, stat.st_size, stat.st_mtime))
        return out

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
            else ""
        )
        return StoreError(
            f"cannot read {where} in {self.root} ({why.strerror or why}); nothing was removed "
            f"or changed.{advice}"
        )

    def _read_many(self, section: str, names: list[str]) -> dict[str, bytes | None]:
        base = f"{self._section(section)}{os.sep}"
        out: dict[str, bytes | None] = {}
        for name in names:
            try:
                out[name] = _read_file(base + name)
            except (FileNotFoundError, IsADirectoryError):
                out[name] = None
            except OSError as why:
                raise self._unreadable(section, why) from why
        return out

    def _remove(self, section: str, names: list[str]) -> None:
        base = self._section(section)
        for name in names:
            try:
                (base / name).unlink(missing_ok=True)
            except OSError as why:
                raise self._unremoved(section, name, why) from why

    def _unremoved(self, section: str, name: str, why: OSError) -> StoreError:
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
        try:
            os.makedirs(self._tmp, exist_ok=True)
        except OSError as why:
            raise self._unremoved(section, next(iter(listed)), why) from why
        for name, was in listed.items():
            with self._in_tmp(".dropped") as aside:
                if self._drop_one(section, name, was, self._tmp + aside):
                    gone.add(name)
        return gone

    def _drop_one(self, section: str, name: str, was: bytes, aside: str) -> bool:
        """Drops ``section/name`` if it holds ``was``, setting it ``aside`` (a path in
        ``tmp/``) first, as :meth:`_drop` says; whether it is gone."""
        path = f"{self._section(section)}{os.sep}{name}"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False  # removed meanwhile (a gc elsewhere)
        except OSError as why:
            raise self._unremoved(section, name, why) from why
        try:
            # Fresh in tmp/, where a gc elsewhere removes only what is old.
            with contextlib.suppress(OSError):
                os.utime(aside)
            unchanged = _read_file(aside) == was
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
                    f"while gc ran ({why.strerror}); it is at {aside}, and is a miss until it "
                    "is moved back or the answer is kept again"
                ) from why
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside)

    def _quarantine(self, section: str, name: str) -> bool:
        try:
            return self._set_aside(
                str(self._section(section) / name), section, name.replace("/", "_")
            )
        except OSError as why:
            raise StoreError(
                f"could not move {section}/{name} to quarantine/ in {self.root} "
                f"({why.strerror}): it is still in place"
            ) from why
        finally:
            self._forget_all()

    def _rehash(self, digest: str) -> str | None:
        path = self._blob_file(digest)
        try:
            with open(path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size == 0:
                    return "blake3:" + blake3.blake3(b"").hexdigest()
                with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    return hash_bytes(mapped)
        except FileNotFoundError:
            return None
        except OSError as why:
            raise self._unreadable("blobs", why) from why

    def _flush_use(self) -> None:
        _write_uses(str(self.root), *self._take_uses())

    def _uses(self) -> dict[tuple[str, str], float]:
        return {}

    def _forget_all(self) -> None:
        with self._lock:
            super()._forget_all()
            self._verified.clear()
            self._maps.clear()
            self._packs_stamp = -1
