"""What every home of the store does the same way, whatever it keeps its files on.

A home (a local directory, a bucket) differs in how it reads a blob, publishes a
file and lists a folder; what it does with them is one piece of logic: an answer
is kept by putting its blob and then publishing its record; packed item answers
are found through a table of every pack index, refreshed from a listing of
``packs/`` and dropped when their blob is gone; records and small verified blobs
read once are held in memory, and when an answer was last used is remembered and
written down in batches.

**The newest answer wins.** A key can be kept more than once: packed under one
fingerprint and kept again alone under another (a strict run whose code changed),
or packed in two packs. Whatever the order a listing gives, the answer created
last is the one served: of two packs the newer one (by ``created``, then id), and
between a pack and a record the newer of the two — a record read supersedes an
older pack's entry, and packs adopted are checked against the records of their
keys (:meth:`PackedHome._records_among`, one listing, never a read per item). That
is what a store opened afresh finds; an object answers a key it already holds from
memory, without looking again (a recall stays a lookup and a read), so an answer
kept later by another object or process reaches it only once it lets go of what it
holds (its gc, a miss that lists ``packs/`` again, the record pushed out of memory).

What a read hands out is the caller's own memory (a held blob as a copy), so a
recalled value written in place changes no later recall. :class:`PackedHome` holds
that logic once; a home gives it the primitives that really differ (``_read_blob``,
``_publish_record``, ``_listed_packs``, ``_read_indexes``, ``_records_among``,
``_flush_use``).

**Threads.** One store object may be shared by threads that read, write and look
after it at once. The tables it holds in memory (pack indexes, records, small blobs)
are changed, and walked, only under one lock (``_lock``), never held while a file is
read or written; they are read by single lookups, which need none. When answers were
used is noted by single stores into a dict and drained item by item when it is
written down, so a recall that finds its answer in memory takes no lock at all. A
forked child (a DataLoader worker) starts each store object afresh: its own lock, and
none of its parent's writes in flight (:func:`_after_fork_in_child`).

**Writes in flight.** A store object knows its own writes while they are made: the
files it writes in ``tmp/``, and the blob a ``keep`` puts until the record or index
that refers to it is published. Its ``gc`` leaves them alone whatever its ``grace``
(which is for the writes of other processes), and a ``keep`` that puts a blob its
``gc`` is removing at that moment waits until it is gone, and writes it afresh.
"""

from __future__ import annotations

import abc
import array
import contextlib
import dataclasses
import errno
import itertools
import math
import mmap
import os
import re
import tempfile
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from types import MappingProxyType
from typing import IO, Any, SupportsIndex, cast

import blake3

from somatize._threads import hash_threads
from somatize.store import records
from somatize.store._compact import Compacted, compact
from somatize.store.base import (
    Answer,
    BadAddress,
    Buffer,
    Corrupt,
    Missing,
    Store,
    StoreError,
    StoreFull,
    check_digest,
    check_labels,
    keys_of,
    recalled,
    unmarked,
)
from somatize.store.records import (
    PACK_ITEM_BELOW,
    Fingerprinted,
    PackIndex,
    Signer,
    decode_pack,
    decode_record,
    encode_record,
    keep_packed,
    keep_packed_joined,
)
from somatize.store.upkeep import (
    SECTIONS,
    Collected,
    Entry,
    Progress,
    Verified,
    check,
    collect,
)

REMEMBERED = 4096
"""How many answer records a home keeps at hand for the ``recall`` that follows."""

HELD_BYTES = 32 << 20
"""How many bytes of small verified blobs a home keeps in memory: blobs never change."""

FLUSH_USES = 1024
"""How many recalls are remembered before their times are written down."""

FLUSH_EVERY = 60.0
"""How many seconds the first use not yet written down waits at most, while recalls go on:
a process that recalls a few answers over and over and never closes its store (a notebook,
a server) would otherwise never write them down, and a gc elsewhere would take the answers
it uses all along for the least recently used."""


_KEPT = (
    "a store keeps bytes, or an iterable of pieces that are each bytes (any contiguous "
    "buffer: bytearray, memoryview, array.array)"
)
"""What a put or keep takes, said when it is given something else."""


def pieces_of(
    data: Buffer | Sequence[Buffer], spills: Spills | Spool | None = None
) -> Sequence[Buffer]:
    """``data`` as the pieces written one after another, each a flat run of bytes (a
    typed or shaped buffer, of float64 values say, is taken as its bytes). Any object
    with the buffer protocol (bytes, an ``array.array``, a numpy array, an ``mmap``) is
    one piece, never iterated (an mmap would be one byte per piece); anything else is
    an iterable of pieces. The pieces of an iterable other than a list or tuple (a
    generator), which may fill one buffer again for each (``f.readinto(buf)``), are
    taken as each holds when it is handed over, before the next is asked for, and held
    in ``spills`` past the first :data:`FROZEN_RUN` bytes (see :func:`spooled`), or in
    the file of a :class:`Spool` that holds those of other items too."""
    pieces = _listed(data)
    if isinstance(pieces, (list, tuple)):
        return pieces
    if isinstance(spills, Spool):
        return spills.take(pieces)
    return spooled(pieces, SPILLS if spills is None else spills)


def flat_pieces(data: Buffer | Sequence[Buffer]) -> Iterable[Buffer]:
    """The flat pieces of ``data``, as :func:`pieces_of` takes them, not yet held: a list
    or tuple of them, or an iterator that flattens each as it is handed over."""
    return _listed(data)


def _by_key(answers: Iterable[Answer]) -> Iterator[tuple[str, Answer]]:
    return ((answer.key, answer) for answer in answers)


def _listed(data: Buffer | Sequence[Buffer]) -> Sequence[Buffer] | Iterator[Buffer]:
    """The flat pieces of ``data`` (see :func:`pieces_of`): a list or tuple of them, or,
    for an iterable other than a list or tuple, an iterator that flattens each as it is
    handed over."""
    if type(data) is list or type(data) is tuple:  # the usual: a few pieces, a row's one
        return [_flat(piece) for piece in data]
    if isinstance(data, (bytes, bytearray, memoryview)):
        return (_flat(data),)
    try:
        view = memoryview(data)  # type: ignore[arg-type]  # a buffer the types do not name
    except TypeError:
        pass
    except (ValueError, BufferError) as why:
        raise _unexported(data, why) from None
    else:
        return (_flat(view),)
    if isinstance(data, str):
        raise TypeError("a store keeps bytes, got a `str`: encode the text first (`text.encode()`)")
    if isinstance(data, (Mapping, Set)):
        raise TypeError(
            f"{_KEPT}, got a `{type(data).__name__}` (a mapping would be written as its "
            "keys, a set in no fixed order): pass the pieces as a list or tuple"
        )
    try:
        listed = iter(data)
    except TypeError:
        raise TypeError(f"{_KEPT}, got a `{type(data).__name__}`") from None
    return map(_flat, listed)


class Spills:
    """Where a store holds the bytes an iterator (a generator) hands it past the first
    :data:`FROZEN_RUN` until they are kept (see :func:`spooled`): a file with no name in
    the system's temporary folder, gone once they are let go of, or the process ends. A
    home on a local disk makes it in its own ``tmp/``."""

    def _spill_file(self) -> IO[bytes]:
        """A new file with no name, open for writing and reading."""
        return tempfile.TemporaryFile()

    def _spill_failed(self, why: OSError) -> StoreError:
        """The error for ``why``, what a write to a file of :meth:`_spill_file` raised."""
        where = f"a temporary file in {tempfile.gettempdir()}"
        if why.errno in FULL:
            return StoreFull(
                f"could not hold the bytes an iterator handed over in {where}: no space left "
                f"({why.strerror}). Nothing was kept; free space there, or point TMPDIR at "
                "a folder with room"
            )
        return StoreError(
            f"could not hold the bytes an iterator handed over in {where}: {why}. Nothing was kept"
        )


SPILLS = Spills()
"""Where a store that names no place of its own holds what an iterator hands it."""

WRITE_NAME = re.compile(r"[0-9]+-[0-9a-f]{32}\.[a-z]+")
"""How a file in ``tmp/`` that a write makes is named (the process, a uuid, what it is)."""

FULL = (errno.ENOSPC, errno.EDQUOT)
"""What the filesystem says when it has no room left for this process (a full disk, a
quota reached)."""


class _Spilled(mmap.mmap):
    """A file :func:`spooled` wrote, mapped: no one else has it, and it never changes."""


def spooled(pieces: Iterable[Buffer], spills: Spills) -> list[Buffer]:
    """``pieces``, flat, handed over one at a time by an iterable that may write into each
    once asked for the next (``f.readinto(buf)``), as runs that cannot change, each taken
    as it held when it was handed over (see :meth:`Spool.take`). A home hashes the pieces,
    then writes them (and may upload them again): an iterator is not asked twice, and
    however much it streams, a put holds about :data:`FROZEN_RUN` bytes of it in memory."""
    with Spool(spills) as spool:
        taken = spool.take(pieces)
    return taken


class Spool(contextlib.AbstractContextManager["Spool"]):
    """One file of a :class:`Spills` that holds what iterators hand over past the first
    :data:`FROZEN_RUN` bytes of each (the items a generator hands ``keep_many``), mapped
    once, as the spool is closed: a file and a map per item would keep a descriptor open
    for each (the map's own) until all are kept, and a generator of a thousand items of
    2 MiB would run a process allowed 1,024 open files out of them. Left with an error (the
    iterator raised), the file goes, holding nothing anyone sees."""

    def __init__(self, spills: Spills) -> None:
        self._spills = spills
        self._stack = contextlib.ExitStack()
        self._out: IO[bytes] | None = None
        self._size = 0
        self._spilled: list[tuple[list[Buffer], int, int]] = []
        """Each list :meth:`take` handed back empty, where its bytes start in the file, how
        many there are: filled with views of the file as the spool is closed."""

    def take(self, pieces: Iterable[Buffer]) -> list[Buffer]:
        """``pieces``, flat, as runs that cannot change, each taken as it held when it was
        handed over: held in memory while they add up to :data:`FROZEN_RUN` bytes at most
        (a steady one as it is, any other copied); past that, every one is written to the
        spool's file as it comes, and the list handed back is empty until the spool is
        closed, then holds views of the file mapped, :data:`FROZEN_RUN` bytes each."""
        held: list[Buffer] = []
        size = 0
        start: int | None = None
        for piece in pieces:
            size += len(piece)
            if start is None and size <= FROZEN_RUN:
                held.append(piece if steady(piece) else bytes(piece))
                continue
            try:
                if self._out is None:
                    self._out = self._stack.enter_context(self._spills._spill_file())
                if start is None:
                    start = self._size
                    self._out.writelines(held)
                    held = []
                self._out.write(piece)
            except OSError as why:
                raise self._spills._spill_failed(why) from why
        if start is not None:
            self._size += size
            self._spilled.append((held, start, size))
        return held

    def __exit__(self, *raised: object) -> None:
        with self._stack:
            if raised[0] is not None or self._out is None:
                return
            try:
                self._out.flush()
                mapped = _Spilled(self._out.fileno(), self._size, access=mmap.ACCESS_READ)
            except OSError as why:
                raise self._spills._spill_failed(why) from why
            view = memoryview(mapped)
            for into, start, size in self._spilled:
                end = start + size
                into += (
                    view[at : min(at + FROZEN_RUN, end)] for at in range(start, end, FROZEN_RUN)
                )


def taken_below(
    pieces: Iterator[Buffer], limit: int
) -> tuple[list[Buffer], int, Iterator[Buffer] | None]:
    """The first of ``pieces`` (flat, handed over by an iterator) while they hold fewer than
    ``limit`` bytes, as runs that cannot change, each taken as it held when it was handed
    over (a steady one as it is, any other copied); how many bytes they hold; and the rest
    of ``pieces``, from the one that reaches ``limit``, not copied (a buffer of a GiB is
    never copied whole), or None where ``pieces`` ended below it."""
    held: list[Buffer] = []
    size = 0
    for piece in pieces:
        if size + len(piece) >= limit:
            return held, size, itertools.chain((piece,), pieces)
        held.append(piece if steady(piece) else bytes(piece))
        size += len(piece)
    return held, size, None


def joined_items(
    keys: Sequence[str],
    data: Buffer | Sequence[Buffer],
    lengths: Iterable[int],
    spills: Spills | None = None,
) -> tuple[list[str], Sequence[Buffer], list[int]]:
    """The keys, flat pieces and lengths of items given end to end (see
    :meth:`~somatize.store.Store.keep_joined`), checked before anything is written: a
    length for each key, none negative, adding up to the bytes ``data`` holds (what an
    iterator hands over held in ``spills``, see :func:`pieces_of`)."""
    listed = list(keys)
    try:
        sizes = array.array("q", lengths)  # ints, in one pass in C
    except (TypeError, OverflowError) as why:
        raise TypeError(f"item lengths are counts of bytes, ints from 0: {why}") from None
    if len(sizes) != len(listed):
        raise ValueError(f"{len(listed)} keys for {len(sizes)} item lengths: one each")
    if sizes and min(sizes) < 0:
        raise ValueError(f"an item length is a count of bytes, got {min(sizes)}")
    pieces = pieces_of(data, spills)
    held, asked = sum(map(len, pieces)), sum(sizes)
    if held != asked:
        raise ValueError(
            f"the {len(sizes)} item lengths add up to {asked} bytes; the data holds {held}: "
            "nothing was kept"
        )
    return listed, pieces, sizes.tolist()


def _flat(piece: Buffer) -> Buffer:
    try:
        if type(piece) is memoryview and piece.ndim == 1 and piece.format == "B":
            if piece.c_contiguous:  # flat already: a view of part of one bytes, say
                return piece
        elif isinstance(piece, (bytes, bytearray)):
            return piece
        view = memoryview(piece)
    except TypeError:
        raise TypeError(f"{_KEPT}, got a piece that is a `{type(piece).__name__}`") from None
    except (ValueError, BufferError) as why:
        raise _unexported(piece, why) from None
    if _holds_references(view.format):
        raise TypeError(
            f"a store keeps bytes, got a buffer of references to Python objects (format "
            f"{view.format!r}: a numpy array of dtype object, a ctypes `py_object` array), "
            "which are addresses in this process, not the values: encode the values as "
            "bytes first (with a codec, or as an array of a fixed dtype)"
        )
    if not view.c_contiguous:
        raise TypeError(
            "a store keeps contiguous bytes, got a buffer that is not contiguous "
            f"(shape {view.shape}, strides {view.strides}); pass a contiguous copy "
            "(`bytes(view)`, or `.contiguous()` for a tensor)"
        )
    if view.format == "B" and view.ndim == 1:
        return view
    return view.cast("B")


def _unexported(data: object, why: Exception) -> TypeError:
    """The error for ``data``, a buffer that will not hand over its bytes (a numpy array of
    ``datetime64`` or ``timedelta64``, a released memoryview): ``why`` is what it said."""
    return TypeError(
        f"a store keeps bytes, got a `{type(data).__name__}` whose buffer hands over no bytes "
        f"({why}): pass its bytes another way (`array.view('int64')` for numpy times, "
        "`bytes(...)` of what a buffer holds)"
    )


def _holds_references(form: str) -> bool:
    """Whether a buffer of struct format ``form`` holds references to Python objects
    (``O``), alone or as a field of a record (``T{<d:price:O:label:}``, whose field names
    between colons are not codes)."""
    return "O" in form and "O" in re.sub(r":[^:]*:", "", form)


_STEADY_KINDS: set[type] = {bytes, _Spilled}
"""The classes whose buffers never change once made: ``bytes``, a file :func:`spooled`
mapped, and those taken in by :func:`take_as_steady`."""


def take_as_steady(kind: type) -> None:
    """Takes the buffers of ``kind``'s instances as ``bytes`` are taken: as never changing
    once made, so a store hashes and writes them (or a view of them) as they are, with no
    copy of its own. For a maker that fills such a buffer once, where it holds the GIL
    for no copy (the row writer's encoded batches), and never writes into it again: a
    store may hash a buffer and write it later, and a store of the user's may keep it."""
    _STEADY_KINDS.add(kind)


def steady(piece: Buffer) -> bool:
    """Whether ``piece`` cannot change while it is kept: ``bytes``, a view of bytes, or a
    buffer (or a view of one) of a kind :func:`take_as_steady` took. Any other buffer (a
    bytearray, a numpy array, an mmap) may be written into by another thread between the
    hash that names it and the write that keeps it."""
    kind = type(piece.obj) if isinstance(piece, memoryview) else type(piece)
    return kind in _STEADY_KINDS


GATHER_BELOW = 64 << 10
"""Pieces smaller than this are joined with those next to them into runs of one ``bytes``:
a blob of many small pieces (the items of a pack, a row each) is then hashed many chunks
at a time and written in a few calls, not a call of each per piece."""

FROZEN_RUN = 1 << 20
"""How many bytes :func:`frozen` gathers small pieces into, at most."""


def frozen(pieces: Sequence[Buffer]) -> Sequence[Buffer]:
    """``pieces`` as runs that cannot change (see :func:`steady_runs`), so what is hashed is
    what is written; ``pieces`` itself when each is steady and none is small."""
    if all(steady(piece) and len(piece) >= GATHER_BELOW for piece in pieces):
        return pieces
    return list(steady_runs(pieces, FROZEN_RUN))


def steady_runs(pieces: Sequence[Buffer], run: int) -> Iterator[Buffer]:
    """The bytes of ``pieces`` (flat, as :func:`pieces_of` makes them) as runs that cannot
    change: pieces smaller than :data:`GATHER_BELOW` joined with those next to them into one
    ``bytes`` of about ``run`` bytes at most, each other :func:`steady` piece as it is, each
    other one copied ``run`` bytes at a time, so a large buffer is hashed and written from
    the same copy without ever being copied whole."""
    gathered: list[Buffer] = []
    held = 0
    for piece in pieces:
        size = len(piece)
        if size < GATHER_BELOW:
            gathered.append(piece)
            held += size
            if held >= run:
                yield b"".join(gathered)
                gathered, held = [], 0
            continue
        if gathered:
            yield b"".join(gathered)
            gathered, held = [], 0
        if steady(piece):
            yield piece
            continue
        view = memoryview(piece)
        for start in range(0, view.nbytes, run):
            yield bytes(view[start : start + run])
    if gathered:
        yield b"".join(gathered)


def new_hasher() -> blake3.blake3:
    """A BLAKE3 hasher, updated piece by piece."""
    return blake3.blake3(max_threads=hash_threads())


def nbytes(pieces: Sequence[Buffer]) -> int:
    """How many bytes ``pieces`` hold together."""
    return sum(memoryview(p).nbytes for p in pieces)


THREADED_FROM = 128 << 10
"""Runs of a blob's bytes smaller than this are hashed on the calling thread alone: handing
each to hashing threads costs more than it saves (64 pieces of 72 KiB, a batch of rows
each, took 3.3 ms so, 2.0 ms on one thread)."""


def hasher_for(runs: Sequence[Buffer]) -> blake3.blake3:
    """A hasher for a blob hashed a run of ``runs`` at a time: one that hashes on this
    thread alone where every run is smaller than :data:`THREADED_FROM`, else
    :func:`new_hasher`'s."""
    if all(len(run) < THREADED_FROM for run in runs):
        return blake3.blake3()
    return new_hasher()


def digest_of(pieces: Iterable[Buffer], hasher: blake3.blake3 | None = None) -> str:
    """The digest of ``pieces`` written one after another, hashed by ``hasher`` (by default
    :func:`hasher_for` the pieces, where they are a list or tuple; :func:`new_hasher`'s for
    pieces handed one at a time)."""
    if hasher is None:
        hasher = hasher_for(pieces) if isinstance(pieces, (list, tuple)) else new_hasher()
    for piece in pieces:
        hasher.update(piece)
    return "blake3:" + hasher.hexdigest()


def hash_bytes(data: Buffer | mmap.mmap) -> str:
    """The digest of ``data``."""
    return "blake3:" + blake3.blake3(data, max_threads=hash_threads()).hexdigest()


class Claims(list[str]):
    """The blobs a write claimed (:meth:`PackedHome._claim`), and the bytes of those its put
    found in the store already and did not write (a bucket's): once what refers to them is
    published, a blob removed meanwhile is written again from them
    (:meth:`PackedHome._published`)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, Sequence[Buffer]] = {}
        """Blob → its bytes, for each blob the put found there and did not write."""


@dataclasses.dataclass(slots=True)
class _Sweeps:
    """What the gcs of one store object running now are doing, guarded by its lock."""

    removing: dict[str, int] = dataclasses.field(default_factory=dict)
    """Blob → how many gcs of this object are removing it now: a put of it waits."""
    released: list[set[str]] = dataclasses.field(default_factory=list)
    """For each gc of this object running now, the blobs its writes claimed and let go of
    since that gc began: what refers to them was published meanwhile, maybe after that gc
    read the records, so it leaves them."""
    passed: dict[str, str] = dataclasses.field(default_factory=dict)
    """``section/name`` → why, of each file a gc of this object could not remove for want
    of permission and went past (:meth:`PackedHome._passed_over`)."""


def _read_only_store(kind: type[PackedHome]) -> PackedHome:
    """A store opened ``read_only=True``, made empty for its pickle's state
    (:meth:`PackedHome.__reduce_ex__`)."""
    return cast("PackedHome", kind.__new__(kind))


class PackedHome(Spills, Store):
    """A home of the store, less the primitives that depend on where its files are."""

    signer: Signer | None
    shared_by_threads = True  # its tables change only under a lock of its own: see "Threads"
    _sections: tuple[str, ...] = SECTIONS
    """The sections the home keeps files in."""
    _forgets: int = 0
    """How many times this object has let go of all it holds (:meth:`_forget_all`); 0 for
    one unpickled from a state that did not count them."""
    read_only = False
    """Whether the store was opened ``read_only=True``: it then writes and removes nothing,
    refusing at once what would (see :meth:`_only_read`). Set on the object only where
    True, so that a store keeps fewer attributes than objects share."""
    _may_write_as = ""
    """Who may write the store, as the error of a read-only one says it (a bucket: its
    credentials)."""

    _read_so_far: tuple[str, ...] = (
        "_records",
        "_small",
        "_small_bytes",
        "_packs",
        "_items",
        "_used",
        "_used_packs",
        "_forgets",
    )
    """What this object holds in memory of what it read and used (:meth:`_hold_nothing`
    makes it), which a copy does not carry."""

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a pickled model holding the store, a deepcopy) gets a lock of its own, has
        # no writes in flight, and holds nothing of what this one read: a blob mapped for a
        # per-row cache pickles not at all, and the rest would grow the pickle with every
        # answer read (the indexes of its packs, its small blobs). The copy reads afresh.
        state = dict(self.__dict__)
        for name in (
            "_lock",
            "_looking",
            "_swept",
            "_writing",
            "_claims",
            "_sweeps",
            "_uses_since",
            *self._read_so_far,
        ):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        signer: Signer | Fingerprinted | None = self.signer
        if isinstance(signer, Fingerprinted):  # pickled without its key: this process's
            self.signer = signer.signer(self._where)
        self._hold_nothing()

    def _in_flight_nothing(self) -> None:
        """Starts with a lock of its own, and no writes or removals in flight."""
        self._uses_since: float | None = None
        """When the first use not yet written down was noted, on the monotonic clock (None:
        none is); None afresh in a copy or a forked child, whose first use is then handed to
        its exit."""
        self._lock = threading.RLock()
        """Guards the tables that follow against threads sharing the store: taken for every
        change and every walk over them, never across a read or write of a file. (When
        answers were used needs none: see :meth:`_take_uses`.)"""
        self._looking = threading.Lock()
        """Held by the one thread looking at ``packs/`` (:meth:`_refresh_packs`): another
        that looks meanwhile waits for the packs that look takes in, rather than finding
        the listing unchanged and the table not yet filled."""
        self._swept = threading.Condition(self._lock)
        """Said when a gc of this object has removed the blobs it was removing."""
        self._writing: set[str] = set()
        """Names in ``tmp/`` of files this object is writing now: its gc leaves them."""
        self._claims: dict[str, int] = {}
        """Blob → how many keeps of this object put it and have yet to publish what refers
        to it: its gc leaves it."""
        self._sweeps = _Sweeps()
        """What the gcs of this object running now are removing, let go of and went past."""
        _HOMES.add(self)

    def _held_here(self) -> bool:
        # A write publishes under ``_lock``: a thread interrupted inside a block holding it
        # (by a signal handler or a finalizer) that waited for a write would wait for ever.
        return bool(self._lock._is_owned())  # type: ignore[attr-defined]

    def _not_kept(self, said: str) -> Missing:
        """The error for what this home was asked and does not hold, ``said`` saying what;
        a home that can tell why (no bucket there) says so too."""
        return Missing(said)

    @property
    @abc.abstractmethod
    def _where(self) -> str:
        """The store's location, as messages name it."""

    def _only_read(self, doing: str) -> StoreError | None:
        """The error for a write or a removal (``doing``: what it would do) where the store
        was opened ``read_only=True`` or may not be written for a reason of its home's
        (:meth:`_cannot_write`); None where it may be tried."""
        if not self.read_only:
            return self._cannot_write(doing)
        return StoreError(
            f"cannot {doing} {self._where}: the store was opened with read_only=True, so it "
            "writes and removes nothing. Nothing was changed; it can still be read. Open it "
            f"without read_only=True{self._may_write_as} to keep answers there"
        )

    def _open_read_only(self, read_only: bool) -> None:
        """Takes the ``read_only=`` a store is opened with, set on the object only where
        True."""
        if not isinstance(read_only, bool):
            raise BadAddress(f"read_only is True or False, got {read_only!r}")
        if read_only:
            self.read_only = True

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        # A read-only store is loaded through a function of its own: a somatize from before
        # `read_only` has none of that name, and refuses the pickle, where it would load
        # the store as its own and write to it.
        reduced = super().__reduce_ex__(protocol)
        if not self.read_only or isinstance(reduced, str):
            return reduced
        return (_read_only_store, (type(self),), *reduced[2:])

    def _refuse_writing(self, doing: str) -> None:
        """Raises :meth:`_only_read`'s error, where there is one."""
        refused = self._only_read(doing)
        if refused is not None:
            raise refused

    def _cannot_write(self, doing: str) -> StoreError | None:
        """The error for a write (``doing``: what it would do) to a store its home never
        writes, opened as it may be; None where it may be tried."""
        return None

    @property
    def _sweeps_strays(self) -> bool:
        """Whether gc removes the files of ``blobs/`` not laid out as blobs (see
        :mod:`somatize.store.upkeep`)."""
        return True

    def _hold_nothing(self) -> None:
        """Starts with nothing held in memory."""
        self._in_flight_nothing()
        self._records: OrderedDict[str, Answer] = OrderedDict()
        self._small: OrderedDict[str, bytes] = OrderedDict()
        self._small_bytes = 0
        self._packs: dict[str, PackIndex] = {}
        self._items: dict[str, PackIndex] = {}
        """Key of a packed item → the index that holds it."""
        self._used: dict[str, float] = {}
        """Key of a recalled answer → when, not yet written down."""
        self._used_packs: dict[str, float] = {}
        """Id of a pack with recalled items → when, likewise."""
        self._forgets = 0

    # -- what a home provides ---------------------------------------------------------------

    @abc.abstractmethod
    def _put(self, data: Buffer | Sequence[Buffer], claims: list[str]) -> str:
        """Keeps ``data`` as a blob; its digest. The digest is claimed (:meth:`_claim`, into
        ``claims``) as soon as it is known, before the blob is looked for."""

    def _put_counted(self, data: Buffer | Sequence[Buffer], claims: list[str]) -> tuple[str, int]:
        """:meth:`_put` of ``data``: its digest, and how many bytes it holds."""
        pieces = pieces_of(data, self)
        return self._put(pieces, claims), nbytes(pieces)

    @abc.abstractmethod
    def _read_blob(self, digest: str, size: int | None, borrow: bool = False) -> memoryview:
        """Blob ``digest``, verified and (unless ``size`` is None) ``size`` bytes long, in
        memory of the caller's own (writing into it changes nothing another read returns),
        or, to a caller that only ``borrow``s it, memory other reads may share; Missing or
        Corrupt otherwise."""

    @abc.abstractmethod
    def _publish_record(self, answer: Answer, data: bytes) -> None:
        """Publishes ``data``, the record of ``answer``, whole."""

    @abc.abstractmethod
    def _publish_index(self, pack: PackIndex, data: bytes) -> None:
        """Publishes pack index ``data`` whole, then adopts ``pack``."""

    def _published(self, claims: list[str]) -> None:
        """Called once the record or index referring to the blobs ``claims`` holds is
        published. A home whose put of a blob found there already neither wrote nor touched
        it (a bucket) looks for each such blob again, and writes it again if a gc elsewhere
        removed it meanwhile; here nothing is to be done: a put touched the blob, and a gc
        that took it after that was told by its time (see :meth:`_sweep`)."""

    @abc.abstractmethod
    def _listed_packs(self) -> dict[str, str] | None:
        """Pack id → where its index is, for every index in ``packs/``; None when the
        listing cannot have changed since the last look."""

    @abc.abstractmethod
    def _read_indexes(self, wanted: dict[str, str]) -> dict[str, bytes | None]:
        """Pack id → the bytes of its index (None if it cannot be read), for ``wanted``
        (pack id → where, as :meth:`_listed_packs` says)."""

    @abc.abstractmethod
    def _records_among(self, keys: Sequence[str]) -> dict[str, bytes]:
        """Key → the bytes of its record file, for those of ``keys`` that have one (packed
        keys almost never do, so this lists rather than reads per key)."""

    @abc.abstractmethod
    def _flush_use(self) -> None:
        """Writes down when the answers recalled since the last time were used."""

    @abc.abstractmethod
    def _entries(self, section: str) -> list[Entry]:
        """Every file under ``section``: its name there, size and time."""

    def _clock_ahead(self) -> float:
        """Seconds this machine's clock runs ahead of the one that stamps the times of the
        store's files (behind, where negative): a gc measures its grace on that one. 0
        here: a home that cannot tell takes them for stamped by this machine's."""
        return 0.0

    _names_looping: Mapping[str, str] = MappingProxyType({})
    """Each link in ``names/`` (as ``names/team``; ``names`` for the section itself) the last
    listing of ``names/`` found leading to the store's own folder or one holding it (`/`),
    and where it leads: not walked, so what lies there is not read as names."""

    def _links_out(self, section: str, names: list[str]) -> dict[str, str]:
        """Each link, as ``names/team``, that leads out of the store on the way to a folder
        ``names`` of ``section`` lie in, and the folder it leads to: none, in a home that
        holds no links."""
        return {}

    @abc.abstractmethod
    def _read_many(self, section: str, names: list[str]) -> dict[str, bytes | None]:
        """The bytes of each of ``names`` under ``section``; None for each that is absent."""

    @abc.abstractmethod
    def _remove(self, section: str, names: list[str]) -> None:
        """Removes ``names`` from ``section``."""

    def _sweep(self, entries: list[Entry], referred: Callable[[], set[str] | None]) -> list[Entry]:
        """Removes the unreferenced blobs ``entries`` (as a gc's last look listed them);
        those removed. A home that can tell a blob touched since (a local store) leaves it;
        one that cannot (a bucket) asks ``referred()`` once they are removed which blobs
        what was published since refers to (None: any may be), and puts those back."""
        self._remove("blobs", [entry.name for entry in entries])
        return entries

    def _put_back_left(self, referred: set[str] | None) -> tuple[int, int]:
        """Puts back each blob ``referred`` to (None: any may be) that a gc stopped midway
        removed and left a copy of, once the gc has read the store; removes the copies no
        longer needed: how many, and their bytes. A home whose gc leaves no copies (a
        local store puts each blob back as it goes) has none."""
        return 0, 0

    @abc.abstractmethod
    def _drop(self, section: str, listed: dict[str, bytes]) -> set[str]:
        """Removes each file of ``section`` named in ``listed`` that still holds the bytes
        listed with it, leaving one published again since (a record of an answer a writer
        kept anew under its key); the names of those removed."""

    @abc.abstractmethod
    def _quarantine(self, section: str, name: str, was: bytes | None = None) -> bool | None:
        """Moves ``section/name`` aside, so it is a miss from now on; False if it was gone
        already, StoreError if it could not be moved (a read-only store). Given ``was``
        (what it held when it was judged), one that holds other bytes now (kept anew
        since) is left in place, and None said."""

    @abc.abstractmethod
    def _rehash(self, digest: str, size: int | None = None) -> str | None:
        """What blob ``digest`` hashes to now; None if it is gone. ``size`` is what a
        listing said it holds, where one did."""

    @abc.abstractmethod
    def _uses(self, merge: bool = True) -> dict[tuple[str, str], float]:
        """(section, name) → when last used, where that is not the file's own time; with
        ``merge``, for a gc, which may write what it read down anew once it is done."""

    def _stamp(self, names: dict[str, list[str]], when: float) -> None:
        """Sets the time of the files ``names`` (section → names there: records, pack
        indexes, blobs, writes in ``tmp/``), which say a time later than a gc's clock, to
        ``when``, the gc's time, so that they age from there. A home whose files are stamped
        by its server, and whose logs of uses are taken at the gc's time as they are merged
        (an object store), sets none."""

    def _copy_index(self, pack: PackIndex, data: bytes) -> None:
        """Keeps a copy of index ``data``, read from the home (a cache in front does)."""

    def _index_damaged(self, pack_id: str) -> None:
        """Notes that the index of ``pack_id``, as the look now going on listed and read
        it, is damaged or unsigned (its items are misses). A home that can tell that index
        from one written over it later (a bucket) need not read it at the next look."""

    def _blob_damaged(self, pack: PackIndex) -> None:
        """Notes that the blob of ``pack`` was found damaged (its items are misses, computed
        and kept again). A home whose next look would adopt that pack again and read its
        blob once more at every miss, having no cheap way to see the blob is not whole
        (a bucket; a local store sees it by a stat), need not adopt it while its index is
        the one read now."""

    def _forget_blob(self, digest: str) -> None:
        """Drops what is held in memory about blob ``digest``."""
        with self._lock:
            dropped = self._small.pop(digest, None)
            if dropped is not None:
                self._small_bytes -= len(dropped)

    def _take_uses(self) -> tuple[dict[str, float], dict[str, float]]:
        """When answers and packs were used since the last time (key or id → time), taken
        out of memory to be written down. They are drained one item at a time, never
        walked: a recall in another thread noting a use meanwhile neither breaks this nor
        is lost (it is taken now, or the next time)."""
        self._uses_since = None
        taken: list[dict[str, float]] = []
        for used in (self._used, self._used_packs):
            out: dict[str, float] = {}
            while used:
                try:
                    key, when = used.popitem()
                except KeyError:  # drained by another thread meanwhile
                    break
                out[key] = when
            taken.append(out)
        return taken[0], taken[1]

    # -- writes in flight ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _in_tmp(self, suffix: str) -> Iterator[str]:
        """A name for a file in ``tmp/`` that no other writer uses (laid out as
        :data:`WRITE_NAME`); a gc of this object leaves the file alone until the block ends.
        Every write goes through one, so a read-only store refuses it here."""
        self._refuse_writing("write to")
        name = f"{os.getpid()}-{uuid.uuid4().hex}{suffix}"
        with self._lock:
            self._writing.add(name)
        try:
            yield name
        finally:
            with self._lock:
                self._writing.discard(name)

    @contextlib.contextmanager
    def _keeping(self) -> Iterator[Claims]:
        """The blobs claimed in the block (by :meth:`_put`), which a gc of this object
        leaves alone until the block ends: a keep publishes what refers to them in it."""
        claims = Claims()
        try:
            yield claims
        finally:
            self._unclaim(claims)

    def _claim(self, digest: str, claims: list[str]) -> None:
        """Claims blob ``digest`` for a write of this object (released where ``claims`` was
        made); waits while a gc of this object is removing it, so the put that follows
        finds it gone and writes it afresh."""
        with self._lock:
            while digest in self._sweeps.removing:
                self._swept.wait()
            self._claims[digest] = self._claims.get(digest, 0) + 1
        claims.append(digest)

    def _unclaim(self, claims: list[str]) -> None:
        """Lets go of ``claims``, made by :meth:`_claim`: a gc of this object may remove
        those blobs again once nothing refers to them."""
        if claims:
            with self._lock:
                _let_go(self._claims, claims)
                for released in self._sweeps.released:
                    released.update(claims)

    @contextlib.contextmanager
    def _collecting(self) -> Iterator[None]:
        """A gc of this object runs in the block: the blobs its writes let go of meanwhile
        (:meth:`_unclaim`), once their record or index is out, are not removed by it."""
        released: set[str] = set()
        with self._lock:
            self._sweeps.released.append(released)
        try:
            yield
        finally:
            with self._lock:  # by identity: another gc's set may hold the same blobs
                self._sweeps.released = [
                    other for other in self._sweeps.released if other is not released
                ]

    def _passed_over(self) -> dict[str, str]:
        """The files a gc could not remove for want of permission and went past since it
        last asked (``section/name`` → why), forgotten as they are handed over. A home that
        stops at such a file (a bucket whose deletes are refused) hands over none."""
        with self._lock:
            passed, self._sweeps.passed = self._sweeps.passed, {}
        return passed

    def _own_writes(self) -> set[str]:
        """Names in ``tmp/`` of the files this object is writing now."""
        with self._lock:
            return set(self._writing)

    @contextlib.contextmanager
    def _removing_blobs(self, digests: set[str]) -> Iterator[set[str]]:
        """Those of ``digests`` no write of this object has claimed, or let go of since a gc
        of it began (:meth:`_collecting`): a gc removes them in the block, and a put of one
        of them waits until it ends."""
        with self._lock:
            released = set().union(*self._sweeps.released)
            free = {d for d in digests if d not in self._claims and d not in released}
            for digest in free:
                self._sweeps.removing[digest] = self._sweeps.removing.get(digest, 0) + 1
        try:
            yield free
        finally:
            with self._lock:
                _let_go(self._sweeps.removing, free)
                self._swept.notify_all()

    # -- writing ------------------------------------------------------------------------------

    def put(self, data: Buffer | Sequence[Buffer]) -> str:
        with self._keeping() as claims:
            return self._put(data, claims)

    def keep(
        self,
        key: str,
        data: Buffer | Sequence[Buffer],
        codec: str,
        fingerprint: str | None = None,
    ) -> Answer:
        check_digest(key)
        check_labels(codec, fingerprint)
        with self._keeping() as claims:  # the blob is this keep's until its record is out
            digest, size = self._put_counted(data, claims)
            answer = self._record(key, digest, codec, size, fingerprint)
            created = self._created_after([key], answer.created)
            if created != answer.created:
                answer = dataclasses.replace(answer, created=created)
            self._publish_record(answer, encode_record(answer, self.signer))
            self._published(claims)
        self._supersede(answer)
        return answer

    def keep_many(
        self,
        items: Sequence[tuple[str, Buffer | Sequence[Buffer]]],
        codec: str,
        fingerprint: str | None = None,
    ) -> list[Answer]:
        """Keeps item answers packed: one blob and one index per up to 64 MiB of small
        items; an item of 1 MiB or more is kept on its own."""
        check_labels(codec, fingerprint)
        # Listed, and each item's pieces too, before anything is measured or written: an
        # item given as an iterator of pieces (a generator) would be used up by measuring it.
        # Items an iterator hands over (a generator filling one buffer again for each) are
        # taken as they are then, as the pieces of one are (see pieces_of).
        # Those past a MiB are held in one file for all (see Spool), mapped once all are in.
        if type(items) is not list and type(items) is not tuple:
            return self._keep_handed(items, codec, fingerprint)
        with Spool(self) as spool:
            listed = [(key, pieces_of(data, spool)) for key, data in items]
        return keep_packed(self, listed, codec, fingerprint)

    def _keep_handed(
        self,
        items: Iterable[tuple[str, Buffer | Sequence[Buffer]]],
        codec: str,
        fingerprint: str | None,
    ) -> list[Answer]:
        """:meth:`keep_many` of items an iterable other than a list or tuple hands over (a
        generator, which may fill one buffer again for each), each taken as it holds then:
        small ones are held until the next would overflow a pack (:data:`PACK_BYTES`), which
        is then kept before another is asked for, so what is held stays bounded; one of
        :data:`PACK_ITEM_BELOW` or more is kept on its own as it is handed over, its bytes
        streamed as a put streams them. Each key is checked as its item comes: the items
        before a key that is no digest, or before the iterable (or an item's pieces)
        raises, are kept, those held for a pack too."""
        keys: list[str] = []
        out: dict[str, Answer] = {}
        small: list[tuple[str, Sequence[Buffer]]] = []
        held = 0
        try:
            for key, data in items:
                check_digest(key)
                keys.append(key)
                taken, size, rest = taken_below(iter(flat_pieces(data)), PACK_ITEM_BELOW)
                if rest is not None:  # kept on its own, the rest of its pieces streamed
                    streamed = itertools.chain(taken, rest)  # an iterable of pieces, as put takes
                    out[key] = self.keep(key, cast(Sequence[Buffer], streamed), codec, fingerprint)
                    continue
                if small and held + size > records.PACK_BYTES:  # as keep_packed reads it
                    pack, small, held = small, [], 0
                    out.update(_by_key(keep_packed(self, pack, codec, fingerprint)))
                small.append((key, taken))
                held += size
        except Exception:  # a key that is no digest, or the iterable or an item's pieces raised
            if small:  # the items before it held for a pack are kept, as those kept already
                keep_packed(self, small, codec, fingerprint)
            raise
        if small:
            out.update(_by_key(keep_packed(self, small, codec, fingerprint)))
        return [out[key] for key in keys]

    def keep_joined(
        self,
        keys: Sequence[str],
        data: Buffer | Sequence[Buffer],
        lengths: Iterable[int],
        codec: str,
        fingerprint: str | None = None,
    ) -> None:
        """Keeps items given end to end as :meth:`keep_many` keeps them — packed, an item
        of 1 MiB or more on its own — each pack's blob written from views of ``data``."""
        check_labels(codec, fingerprint)
        listed, pieces, sizes = joined_items(keys, data, lengths, self)
        keep_packed_joined(self, listed, pieces, sizes, codec, fingerprint)

    def _created_after(self, keys: Sequence[str], now: float) -> float:
        """``now``, or just after the newest answer this object knows for ``keys`` when
        that one is stamped later (by a writer whose clock runs ahead): an answer kept now
        replaces it, and the newer ``created`` is what says so to every reader."""
        with self._lock:  # found with lookups in C: a pack's keys are new, as a rule
            items, records = self._items, self._records
            known = [now]
            known += [items[key].created for key in filter(items.__contains__, keys)]
            known += [records[key].created for key in filter(records.__contains__, keys)]
        newest = max(known)
        return now if newest < now else math.nextafter(newest, math.inf)

    def _adopt(self, pack: PackIndex) -> Iterable[str]:
        """Takes ``pack`` into the table: each of its keys is found in it, unless a newer
        pack or record already answers that key; the keys it answers now."""
        with self._lock:
            self._packs[pack.id] = pack
            items, records = self._items, self._records
            keys: Iterable[str] = pack.entries
            # Keys answered already are weighed one by one; the rest (as a rule, all: a
            # pack's keys are new) are taken in one update.
            known = {*filter(items.__contains__, keys), *filter(records.__contains__, keys)}
            if known:
                newer = (pack.created, pack.id)
                keys = [key for key in keys if key not in known or self._answers_after(key, newer)]
            items.update(dict.fromkeys(keys, pack))
        return keys

    def _answers_after(self, key: str, newer: tuple[float, str]) -> bool:
        """Whether a pack of ``newer`` (created, id) is to answer ``key`` rather than what
        answers it now: a pack or a whole record created later keeps it."""
        held = self._items.get(key)
        if held is not None and (held.created, held.id) > newer:
            return False
        record = self._records.get(key)
        return record is None or record.offset is not None or record.created <= newer[0]

    def _supersede(self, answer: Answer) -> None:
        """Remembers the record ``answer``, read or written, and lets it answer its key in
        place of an older pack's entry."""
        with self._lock:
            self._remember(answer)
            pack = self._items.get(answer.key)
            if pack is not None and pack.created < answer.created:
                del self._items[answer.key]

    def _prefer_newer_records(self, keys: Sequence[str]) -> None:
        """Lets the records of ``keys``, which packs just adopted answer, that are newer than
        the pack that answers them now answer those keys instead."""
        if not keys:
            return
        for key, data in self._records_among(keys).items():
            try:
                answer = decode_record(key, data, self.signer)
            except Corrupt:
                continue  # unreadable or unsigned: the pack answers
            self._supersede(answer)

    # -- reading ------------------------------------------------------------------------------

    def _known_answer(self, key: str) -> Answer | None:
        """The answer to ``key`` this object already knows, read nothing: its entry in a pack
        taken into the table, else the record remembered; None when it knows neither."""
        pack = self._items.get(key)
        if pack is not None:
            return pack.answer(key)
        return self._records.get(key)

    def _remember(self, answer: Answer) -> None:
        with self._lock:
            self._records[answer.key] = answer
            if len(self._records) > REMEMBERED:
                self._records.popitem(last=False)

    def _held(self, digest: str, size: int | None, borrow: bool = False) -> memoryview | None:
        """A copy of blob ``digest`` if it is held (``size`` bytes long, unless None): the
        caller's own memory, which it may write into without changing what is held; what
        is held itself to a caller that only ``borrow``s it."""
        held = self._small.get(digest)
        if held is None or (size is not None and len(held) != size):
            return None
        return memoryview(held) if borrow else memoryview(bytearray(held))

    def _hold(self, digest: str, raw: bytes) -> None:
        with self._lock:
            if digest in self._small:
                return
            self._small[digest] = raw
            self._small_bytes += len(raw)
            while self._small_bytes > HELD_BYTES and self._small:
                _, dropped = self._small.popitem(last=False)
                self._small_bytes -= len(dropped)

    def recall(self, key: str) -> tuple[Answer, memoryview]:
        answer = self.answer(key)
        if answer is None:
            raise self._not_kept(f"no answer is kept under {key} in {self._where}")
        try:
            return self._recall_answer(key, answer)
        except Missing:
            # What this object knew of the key may be older than the store: a gc elsewhere
            # evicted its blob, and a writer elsewhere may have kept the key anew since
            # (packed, where it was whole). Looked for once more, afresh.
            self._list_again()
            again = self.answer(key)
            if again is None or again == answer:
                raise
            return self._recall_answer(key, again)

    def _recall_answer(self, key: str, answer: Answer) -> tuple[Answer, memoryview]:
        """The bytes of ``answer``, the answer to ``key``; Missing or Corrupt (the answer
        forgotten, its pack dropped) when its blob is not here whole."""
        offset = answer.offset
        now = time.time()
        try:
            if offset is None:
                data = self._read_blob(answer.value, answer.size)
                self._used[key] = now
            else:
                pack = self._items.get(key)
                if pack is not None and pack.blob != answer.value:
                    pack = None  # another thread adopted a newer pack since: not this answer's
                whole = self._read_blob(answer.value, pack.size if pack else None)
                if offset + answer.size > len(whole):
                    raise Corrupt(f"item {key} lies past the end of blob {answer.value}")
                data = whole[offset : offset + answer.size]
                if pack is not None:
                    self._used_packs[pack.id] = now
        except (Missing, Corrupt) as why:
            self._forget(answer)
            pack = self._items.get(key)
            if pack is not None and pack.blob == answer.value:
                self._drop_pack(pack)
                if isinstance(why, Corrupt):
                    self._blob_damaged(pack)
            raise
        self._write_down_uses()
        return answer, data

    def recall_many(
        self, keys: Sequence[str], *, borrow: bool = False
    ) -> dict[str, tuple[Answer, memoryview] | Exception]:
        """Reads each pack's blob once for all the items asked of it."""
        keys = keys_of(keys, "recall_many")
        out: dict[str, tuple[Answer, memoryview] | Exception] = {}
        # Each pack as it was found: another thread (a gc) may drop it from the table meanwhile.
        by_pack: dict[str, tuple[PackIndex, list[str]]] = {}
        rest: list[str] = []
        items, records = self._items, self._records
        if any(key not in items and key not in records for key in keys):
            self._refresh_packs()  # a listing: only for keys found in no pack or record yet
        items = self._items
        for key in keys:
            pack = items.get(key)
            if pack is None:
                rest.append(key)
                continue
            group = by_pack.get(pack.id)
            if group is None:
                group = by_pack[pack.id] = (pack, [])
            group[1].append(key)
        now = time.time()
        gone: dict[str, tuple[str, Missing]] = {}  # key → its pack's blob, found gone, and why
        for pack, members in by_pack.values():
            try:
                whole = self._read_blob(pack.blob, pack.size, borrow)
            except Missing as why:
                self._drop_pack(pack)
                gone.update(dict.fromkeys(members, (pack.blob, why)))
                continue
            except Corrupt as why:
                self._drop_pack(pack)
                self._blob_damaged(pack)
                for key in members:
                    out[key] = why
                continue
            except StoreError as why:  # here, but not for this process to read
                for key in members:
                    out[key] = why
                continue
            self._used_packs[pack.id] = now
            entries = pack.entries
            for key in members:
                start, length = entries[key]
                out[key] = (pack.answer(key), whole[start : start + length])
        if gone:
            rest.extend(self._kept_anew(gone, out))
        for key in rest:
            try:
                out[key] = recalled(self, key)
            except StoreError as why:
                out[key] = why
        self._write_down_uses()
        return out

    def _kept_anew(
        self,
        gone: dict[str, tuple[str, Missing]],
        out: dict[str, tuple[Answer, memoryview] | Exception],
    ) -> list[str]:
        """Of the keys in ``gone``, whose pack's blob was gone (a gc elsewhere evicted it),
        those to be looked for afresh, as a writer elsewhere may have kept them anew since;
        the rest, still answered by that blob after one look at the store, are Missing in
        ``out`` (each is not looked for on its own: the look reads the packs again)."""
        self._list_again()
        packed = self._packed_after_a_look(list(gone))
        again = []
        for key, (blob, why) in gone.items():
            pack = packed.get(key)
            if pack is not None and pack.blob == blob:
                out[key] = why
            else:
                again.append(key)
        return again

    def _write_down_uses(self) -> None:
        """Writes down when answers were used once :data:`FLUSH_USES` of them are noted,
        or once the first of them was noted :data:`FLUSH_EVERY` seconds ago."""
        # Measured on a clock no one sets: a wall clock set back (NTP correcting one that
        # ran ahead) would hold the uses back until it passed the first one's time again.
        now = time.monotonic()
        since = self._uses_since
        if since is None:
            self._uses_since = since = now
            self._written_down_at_exit()
        if len(self._used) + len(self._used_packs) >= FLUSH_USES or now - since >= FLUSH_EVERY:
            self._flush_use()

    def _written_down_at_exit(self) -> None:
        """Has the uses noted from now on written down when this process ends, however it
        ends short of being killed; called at the first use noted since they were last
        written. A home that writes them nowhere (or only when asked) does nothing."""

    def _refresh_packs(self) -> bool:
        """Loads pack indexes written since the last look, and drops those gone; True if
        anything changed."""
        with self._looking:
            with self._lock:
                known = set(self._packs)
            listed = self._listed_packs()
            if listed is None:
                return False
            try:
                return self._take_listing(listed, known)
            except BaseException:
                self._list_again()  # what this look could not take is looked for at the next
                raise

    def _packed_after_a_look(self, keys: Sequence[str]) -> dict[str, PackIndex]:
        """Key → the pack that answers it, for those of ``keys`` a pack answers once
        ``packs/`` is looked at. A gc or verify of this object in another thread lets go of
        the table as it ends: one that ends between the look and what it found there has
        the look made again, so a key kept is no miss for it."""
        while True:
            forgets = self._forgets
            self._refresh_packs()
            items = self._items
            found = {key: pack for key in keys if (pack := items.get(key)) is not None}
            if len(found) == len(keys) or self._forgets == forgets:
                return found

    def _list_again(self) -> None:
        """Has the next look list ``packs/`` afresh, though the listing may not have
        changed since this one (as :meth:`_listed_packs` would say)."""

    def _take_listing(self, listed: dict[str, str], known: set[str]) -> bool:
        """Adopts the packs of ``listed`` (:meth:`_listed_packs`) not adopted yet, and drops
        those of ``known`` (the packs adopted before the listing) gone from it; True if
        anything changed. A pack this object published since the listing is in the table
        but not the listing, and stays."""
        # In set operations, not a loop over every pack: a first epoch takes a listing of
        # thousands at every batch.
        with self._lock:
            packs = self._packs
            gone = [packs[pack_id] for pack_id in (known & packs.keys()) - listed.keys()]
            for pack in gone:
                self._drop_pack(pack)
            unknown = listed.keys() - packs.keys()
        changed = bool(gone)
        if not unknown:
            return changed
        new = {pack_id: listed[pack_id] for pack_id in unknown}
        adopted = []
        taken: list[str] = []  # the keys they answer, as they were adopted
        for pack_id, data in sorted(self._read_indexes(new).items()):
            if data is None:
                continue
            try:
                pack = decode_pack(pack_id, data, self.signer)
            except Corrupt:
                self._index_damaged(pack_id)
                continue  # damaged or unsigned: its items are misses
            taken.extend(self._adopt(pack))
            self._copy_index(pack, data)
            adopted.append(pack)
            changed = True
        try:
            self._prefer_newer_records(taken)
        except BaseException:
            # Adopted again at the next look, when newer records can be read (until
            # then a pack could answer a key a newer record answers).
            for pack in adopted:
                self._drop_pack(pack)
            raise
        return changed

    def _drop_pack(self, pack: PackIndex) -> None:
        with self._lock:
            self._packs.pop(pack.id, None)
            items = self._items
            for key in pack.entries:
                if items.get(key) is pack:
                    del items[key]
            self._forget_blob(pack.blob)

    def _forget(self, answer: Answer) -> None:
        """Drops what is held in memory about ``answer``, whose bytes are not as recorded."""
        with self._lock:
            self._records.pop(answer.key, None)
            self._forget_blob(answer.value)

    # -- upkeep -------------------------------------------------------------------------------

    def close(self) -> None:
        self._flush_use()

    def gc(
        self,
        max_bytes: int | None = None,
        *,
        grace: float = 60.0,
        progress: Progress | None = None,
    ) -> Collected:
        # Refused before anything is listed, removed or written (the file that reads the
        # store's clock).
        self._refuse_writing("collect garbage in")
        self._refuse_unmarked("collect")
        result = collect(self, max_bytes, grace, progress)
        self._collected(grace)
        return result

    def compact(self, *, grace: float = 60.0) -> Compacted:
        """Merges small packs older than ``grace`` seconds into packs of up to
        :data:`~somatize.store.records.PACK_BYTES` (their blob, then their signed index),
        then removes the index of each pack a newer one replaces once that one is older than
        ``grace`` seconds; a gc removes their blobs. Every row stays readable whenever it
        stops (see :mod:`somatize.store._compact`)."""
        self._refuse_writing("compact")
        self._refuse_unmarked("compact")
        return compact(self, grace)

    def _store_kind(self) -> str | None:
        """What the store's root holds (:func:`~somatize.store.base.store_kind`)."""
        return "marked"

    def _fresh(self) -> bool:
        """Whether the store's root holds nothing a store did not make, and none of it."""
        return False

    def _mark(self) -> bool:
        """Writes the store's marker at its root; False where it cannot be written."""
        return False

    def _refuse_unmarked(self, doing: str) -> None:
        """Refuses upkeep that removes or moves files (``doing``: what it would do) at a
        root that bears no store's marker and is not clearly a store, where the files it
        would take for unused or damaged may be a user's; marks one an earlier somatize
        made (as far as it may be written: a read-only one is looked after as ever)."""
        kind = self._store_kind()
        if kind == "clear":
            self._mark()
        elif kind != "marked" and not self._fresh():
            found = (
                "it holds no more than what verify moves aside in quarantine/"
                if kind == "emptied"
                else "it holds no store"
            )
            raise unmarked(self._where, found, doing)

    def _collected(self, grace: float) -> None:
        """What a home does after a collection (a bucket tidies its cache and its logs)."""

    def verify(self, *, quarantine: bool = False, progress: Progress | None = None) -> Verified:
        # "no" would move what is damaged aside; refused before the store is marked.
        if not isinstance(quarantine, bool):
            raise TypeError(f"quarantine= is True or False, got {quarantine!r}")
        if quarantine:
            # Opened read-only, asked to move files: refused. A store in an archive is
            # checked, and says of each file it would move that it is only read.
            if self.read_only:
                self._refuse_writing("move damaged files aside in")
            self._refuse_unmarked("move damaged files aside in")
        return check(self, quarantine, progress)

    def _forget_all(self) -> None:
        """Drops everything held in memory (after something was moved aside)."""
        with self._lock:
            self._forgets += 1
            self._records.clear()
            self._small.clear()
            self._small_bytes = 0
            self._packs.clear()
            self._items.clear()


_HOMES: weakref.WeakSet[PackedHome] = weakref.WeakSet()
"""Every store object of this process, which a forked child starts afresh."""


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) has only the thread that forked: a lock another
    thread of its parent held (a writer adopting the pack it published) would stay held in
    it for good, and a removal that thread was making (a gc) would be waited for for good.
    So each store object starts afresh there: a lock of its own, and no writes or removals
    in flight (the parent's are another process's now); one whose lock was held, or whose
    packs that thread was taking in, also lets go of what it holds in memory, which that
    thread may have left half changed."""
    homes = list(_HOMES)
    torn = [home for home in homes if not (_free(home._lock) and _free(home._looking))]
    for home in homes:
        home._in_flight_nothing()
    for home in torn:  # after every lock is afresh: a bucket's forgets its cache's too
        home._forget_all()


def _free(lock: threading.RLock | threading.Lock) -> bool:
    """Whether ``lock`` is held by no other thread."""
    if not lock.acquire(blocking=False):
        return False
    lock.release()
    return True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _let_go(held: dict[str, int], digests: Iterable[str]) -> None:
    """Takes one hold of each of ``digests`` off ``held`` (digest → holds), forgetting a
    digest no one holds any more; the caller holds the store's lock."""
    for digest in digests:
        left = held[digest] - 1
        if left:
            held[digest] = left
        else:
            del held[digest]
