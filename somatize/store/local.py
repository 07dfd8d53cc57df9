"""The local store: a directory, laid out as :mod:`somatize.store.base` says.

Every write goes to ``tmp/`` under a name no other writer uses and is published
with an atomic rename, so a reader sees a blob or record whole or not at all,
and two processes writing the same content race to publish identical bytes —
whichever rename lands last changes nothing. With ``durable=True`` the file and
its directory are fsynced before and after the rename, so a published answer
survives a power cut too.

Blobs are immutable, so a blob verified once against its digest is trusted for
the life of the process; its size is still checked on every read. Large blobs
are read by memory map, so a recalled tensor or table is not copied.
"""

from __future__ import annotations

import io
import mmap
import os
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path

import blake3

from somatize.store.base import (
    Answer,
    Buffer,
    Corrupt,
    Missing,
    NameNotFound,
    Store,
    StoreError,
    check_digest,
    check_name,
)

__all__ = ["LocalStore"]

_MAP_ABOVE = 1 << 16
"""Blobs larger than this are memory-mapped rather than read."""

_REMEMBERED = 4096
"""How many answer records ``have`` keeps at hand for the ``recall`` that follows."""

_SMALL_BYTES = 32 << 20
"""How many bytes of small verified blobs are kept in memory: blobs never change, and
``have`` still checks that each one is on disk, at its size, before it is recalled."""


def _pieces(data: Buffer | Sequence[Buffer]) -> Sequence[Buffer]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return (data,)
    return data


def _digest(pieces: Sequence[Buffer]) -> str:
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    for piece in pieces:
        hasher.update(piece)
    return "blake3:" + hasher.hexdigest()


class LocalStore(Store):
    """A store in a local directory (created if missing)."""

    def __init__(self, path: str | os.PathLike[str], *, durable: bool = False) -> None:
        self.root = Path(path).expanduser()
        self.durable = durable
        try:
            for part in ("blobs", "names", "answers", "tmp"):
                (self.root / part).mkdir(parents=True, exist_ok=True)
        except OSError as why:
            raise StoreError(f"cannot use {self.root} as a store: {why}") from why
        self._blobs = f"{self.root / 'blobs'}{os.sep}"
        self._answers = f"{self.root / 'answers'}{os.sep}"
        self._verified: set[str] = set()
        self._records: OrderedDict[str, Answer] = OrderedDict()
        self._small: OrderedDict[str, bytes] = OrderedDict()
        self._small_bytes = 0

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # -- paths ------------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        """Where blob ``digest`` lives (whether or not it is there)."""
        return Path(self._blob_file(digest))

    def _blob_file(self, digest: str) -> str:
        hexed = check_digest(digest)[7:]
        return f"{self._blobs}{hexed[:2]}{os.sep}{hexed}"

    def _answer_file(self, key: str) -> str:
        hexed = check_digest(key)[7:]
        return f"{self._answers}{hexed[:2]}{os.sep}{hexed}"

    # -- writing ------------------------------------------------------------------------------

    def _publish(self, target: Path | str, pieces: Sequence[Buffer]) -> None:
        """Writes ``pieces`` to ``target`` through ``tmp/`` and a rename."""
        target = Path(target)
        temporary = self.root / "tmp" / f"{uuid.uuid4().hex}.part"
        try:
            with open(temporary, "wb") as out:
                for piece in pieces:
                    out.write(piece)
                if self.durable:
                    out.flush()
                    os.fsync(out.fileno())
            try:
                os.replace(temporary, target)
            except FileNotFoundError:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(temporary, target)
            if self.durable:
                self._sync_directory(target.parent)
        except OSError as why:
            temporary.unlink(missing_ok=True)
            raise StoreError(f"could not write {target.relative_to(self.root)}: {why}") from why

    @staticmethod
    def _sync_directory(directory: Path) -> None:
        handle = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)

    def put(self, data: Buffer | Sequence[Buffer]) -> str:
        pieces = _pieces(data)
        digest = _digest(pieces)
        target = self._blob_file(digest)
        size = sum(memoryview(p).nbytes for p in pieces)
        try:
            if os.stat(target).st_size == size:
                return digest
        except FileNotFoundError:
            pass
        self._publish(target, pieces)
        self._verified.add(digest)
        return digest

    def bind(self, name: str, digest: str) -> None:
        check_name(name)
        check_digest(digest)
        self._publish(self.root / "names" / name, [digest.encode()])

    def keep(
        self,
        key: str,
        data: Buffer | Sequence[Buffer],
        codec: str,
        fingerprint: str | None = None,
    ) -> Answer:
        check_digest(key)
        pieces = _pieces(data)
        digest = self.put(pieces)
        size = sum(memoryview(p).nbytes for p in pieces)
        answer = self._record(key, digest, codec, size, fingerprint)
        self._publish(self._answer_file(key), [answer.to_json()])
        self._remember(answer)
        return answer

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

    def _read_blob(self, digest: str, size: int | None) -> memoryview:
        held = self._small.get(digest)
        if held is not None and (size is None or len(held) == size):
            return memoryview(held)
        try:
            with open(self._blob_file(digest), "rb") as handle:
                actual = os.fstat(handle.fileno()).st_size
                if size is not None and actual != size:
                    raise Corrupt(
                        f"blob {digest} holds {actual} bytes where its answer says {size}: "
                        "it was truncated or overwritten"
                    )
                if actual > _MAP_ABOVE:
                    data = memoryview(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))
                else:
                    raw = handle.read()
                    data = memoryview(raw)
        except FileNotFoundError:
            raise Missing(f"blob {digest} is not in {self.root}") from None
        if digest not in self._verified:
            found = "blake3:" + blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest()
            if found != digest:
                raise Corrupt(f"blob {digest} in {self.root} hashes to {found}: it is damaged")
            self._verified.add(digest)
        if actual <= _MAP_ABOVE:
            self._hold(digest, raw)
        return data

    def _hold(self, digest: str, raw: bytes) -> None:
        if digest in self._small:
            return
        self._small[digest] = raw
        self._small_bytes += len(raw)
        while self._small_bytes > _SMALL_BYTES:
            _, dropped = self._small.popitem(last=False)
            self._small_bytes -= len(dropped)

    def resolve(self, name: str) -> str:
        check_name(name)
        try:
            text = (self.root / "names" / name).read_text().strip()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NameNotFound(
                f"nothing is bound to `{name}` in {self.root}; bind it first with "
                f"`store.bind({name!r}, store.put(data))`"
            ) from None
        return check_digest(text)

    def answer(self, key: str) -> Answer | None:
        remembered = self._records.get(key)
        if remembered is not None:
            return remembered
        try:
            with open(self._answer_file(key), "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            return None
        answer = Answer.from_json(key, data)
        self._remember(answer)
        return answer

    def _remember(self, answer: Answer) -> None:
        self._records[answer.key] = answer
        if len(self._records) > _REMEMBERED:
            self._records.popitem(last=False)

    def recall(self, key: str) -> tuple[Answer, memoryview]:
        answer = self.answer(key)
        if answer is None:
            raise Missing(f"no answer is kept under {key} in {self.root}")
        try:
            return answer, self._read_blob(answer.value, answer.size)
        except (Missing, Corrupt):
            self._forget(answer)
            raise

    def have(self, keys: Iterable[str]) -> set[str]:
        found = set()
        for key in keys:
            try:
                answer = self.answer(key)
            except Corrupt:
                continue
            if answer is None:
                continue
            try:
                whole = os.stat(self._blob_file(answer.value)).st_size == answer.size
            except FileNotFoundError:
                whole = False
            if whole:
                found.add(key)
            else:
                self._forget(answer)
        return found

    def _forget(self, answer: Answer) -> None:
        """Drops what is held in memory about ``answer``, whose bytes are not as recorded."""
        self._records.pop(answer.key, None)
        self._small.pop(answer.value, None)
        self._verified.discard(answer.value)
