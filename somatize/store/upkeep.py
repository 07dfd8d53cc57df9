"""Upkeep: collecting what is no longer wanted, and checking that what is kept is whole.

Both are written once, for every home, over a handful of file-level primitives
that each home provides (:class:`Shelf`): list a section, read a file, remove
one, move one aside. They are slow operations by nature — they read everything —
so they live apart from the hot path, and take a ``progress`` wrapper (the
command line passes tqdm's).

**Collecting** (:func:`collect`) is least-recently-used by *unit*: a whole answer
(its record and blob) or a pack (its index and blob — the items of a mapped node
were kept together and are used together). When a unit was last used is the
later of its file's time and what the home remembers (a local store touches the
file's time in batches; a bucket cannot, so it writes small ``used/`` logs).
Names pin what they point at and are never collected. A name whose file cannot be read, or
fails its check or signature (a digit of its digest flipped, the file cut short or garbled),
may have been bound to any blob: while one is there, a gc keeps every blob that nothing else
refers to (no record or index, no name it can read), says which names it could not read
(:attr:`Collected.unread_names`), and does the rest of its work as ever; ``check`` with
``quarantine`` moves such a name aside (a name pointing at a missing blob stays: putting its
bytes again mends it), and binding it again replaces it. One whose file is whole and
points at a blob the store holds, though its check or signature fails (bound with another
key or without one in a store that signs, or holding another name's binding), says which
blob it was bound to: it is told, never moved aside, and pins that blob alone, as a name
does. A blob nothing refers to is removed only once it is older than ``grace`` seconds,
because a writer elsewhere may have put it a moment ago and be about to publish the record
that refers to it (the writes of the store object collecting are known to it, and left
alone whatever the grace); and the store is looked at again just before, so a blob a writer put
again (or referred to) while the collection ran is spared — on a bucket, where a put of a
blob already there cannot touch it, only once its record is published. A file in
``blobs/`` not laid out as a blob is (``blobs/<2 hex>/<64 hex>``, the folder its first
two: a ``.DS_Store``, an NFS ``.nfs…`` file) is no blob: nothing can refer to it, so in a
local store it goes as an unreferenced blob does, and checking lists it as stray, not as
damage. Under an object store's prefix such a file is a user's (the prefix is a folder
anyone may write in, and a store may lie inside another's sections), so gc leaves it.
A file in ``names/`` that is no name (a ``.DS_Store``, one whose name is not UTF-8), or in
``answers/`` or ``packs/`` not laid out as a record or an index is, is listed as stray
too, and never collected (an NFS ``.nfs…`` file is one the server keeps for a file still
open); a blob a stray name, record or index (a copy kept by hand) refers to is kept. A
folder in ``names/``, ``answers/`` or ``packs/`` that holds another store (a blob laid out
as one in its ``blobs/`` that is no name, and a file in its ``answers/``, ``packs/`` or
``names/``; in ``names/``, made before this store was opened above it) is none of this store's: its
files are neither read, judged nor collected, and checking lists the folder as stray. A folder or
file that cannot be read (another user's) stops both with :class:`StoreError`: what it
holds would be taken for unused, or the store for whole.

**Signatures do not decide what is kept.** A record, index or name that fails
only its signature check is untrusted by readers, but it is not damaged: it
still pins its blob, and a name is never collected whatever it carries. A name's
file that holds another name's binding (copied over it, or bound for a name
differing only in case where the filesystem does not tell case apart) is untrusted
the same way: checking reports it, and its blob is kept. When *nothing* in the
store passes the signature check, the key is the wrong one (a shell's
``$SOMATIZE_STORE_KEY`` meant for another store, or a key given to an unsigned
store), and upkeep refuses to run (:class:`KeyMismatch`) rather than take every
answer for damage.

**Checking** (:func:`check`) re-hashes every blob from scratch (not trusting what
this process verified before) and reads every record, index and name; what does
not match is reported, and with ``quarantine`` moved to ``quarantine/`` so it is
a miss from then on (and can still be looked at); what could not be moved (a
read-only store) is reported apart, never counted as moved. What it judged damaged
is read again (and its blob looked for again) before it is reported: a gc or a
writer elsewhere may have removed it, or kept it anew, since it was read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, overload

from somatize._numbers import finite
from somatize.store.base import (
    MARKER,
    Answer,
    BadName,
    Corrupt,
    NewerFormat,
    StoreError,
    check_name,
)
from somatize.store.records import (
    KEY_VARIABLE,
    KeyMismatch,
    NameSignedAlone,
    PackIndex,
    Signer,
    decode_name,
    decode_pack,
    decode_record,
    pointed_at,
)

__all__ = [
    "Collected",
    "Damage",
    "Entry",
    "Progress",
    "Shelf",
    "Survey",
    "Verified",
    "check",
    "collect",
    "contents",
    "listing",
    "survey",
]

SECTIONS = ("blobs", "answers", "packs", "names", "tmp", "quarantine")
"""The sections of every home; a bucket adds ``used/`` (when answers were used)."""

Progress = Callable[[Iterable[Any], str, int], Iterable[Any]]
"""Wraps an iterable to show progress: ``progress(items, description, total)``."""


def _quiet(items: Iterable[Any], what: str, total: int) -> Iterable[Any]:
    return items


class Entry(NamedTuple):
    """One file of a section: its name inside the section (``ab/<hex>``), bytes, and time."""

    name: str
    size: int
    mtime: float


class Shelf(Protocol):
    """What upkeep needs of a home: files by section, and its signer."""

    signer: Signer | None
    _sections: tuple[str, ...]
    """The sections the home keeps files in (:data:`SECTIONS`, and those of its own)."""

    @property
    def _where(self) -> str:
        """The store's location, as messages name it."""
        ...

    @property
    def _sweeps_strays(self) -> bool:
        """Whether gc removes the files of ``blobs/`` not laid out as blobs (a local store's
        ``.DS_Store``); not under an object store's prefix, where they are a user's."""
        ...

    _names_looping: Mapping[str, str]
    """Each link in ``names/`` the last listing of it found leading to the store's own
    folder or one holding it (`/`), as ``names/team``, and where it leads: not walked."""

    def _entries(self, section: str) -> list[Entry]: ...

    def _clock_ahead(self) -> float: ...

    def _links_out(self, section: str, names: list[str]) -> dict[str, str]: ...

    def _read_many(self, section: str, names: list[str]) -> dict[str, bytes | None]: ...

    def _remove(self, section: str, names: list[str]) -> None: ...

    def _sweep(
        self, entries: list[Entry], referred: Callable[[], set[str] | None]
    ) -> list[Entry]: ...

    def _put_back_left(self, referred: set[str] | None) -> tuple[int, int]: ...

    def _drop(self, section: str, listed: dict[str, bytes]) -> set[str]: ...

    def _quarantine(self, section: str, name: str, was: bytes | None = None) -> bool | None: ...

    def _rehash(self, digest: str, size: int | None = None) -> str | None: ...

    def _flush_use(self) -> None: ...

    def _uses(self, merge: bool = True) -> dict[tuple[str, str], float]: ...

    def _stamp(self, names: dict[str, list[str]], when: float) -> None: ...

    def _forget_all(self) -> None: ...

    def _own_writes(self) -> set[str]: ...

    def _passed_over(self) -> dict[str, str]: ...

    def _removing_blobs(self, digests: set[str]) -> AbstractContextManager[set[str]]: ...

    def _collecting(self) -> AbstractContextManager[None]: ...


def blob_digest(name: str) -> str:
    """The digest of the blob whose file under ``blobs/`` is ``name`` (``ab/abcd…``)."""
    return "blake3:" + name.rsplit("/", 1)[-1]


_HEX = frozenset("0123456789abcdef")


def _laid_out(section: str, name: str) -> bool:
    """Whether ``name`` is where a file of ``section`` named by a digest lies: ``<2 hex>/<64
    hex>`` in ``blobs/`` and ``answers/`` (the folder the digest's first two), ``<64 hex>``
    in ``packs/``."""
    hexed = name.rsplit("/", 1)[-1]
    if len(hexed) != 64 or not _HEX.issuperset(hexed):
        return False
    return name == (hexed if section == "packs" else f"{hexed[:2]}/{hexed}")


def _blobs_among(entries: list[Entry]) -> tuple[dict[str, Entry], list[Entry]]:
    """The files of ``blobs/`` by the digest they are named by, and those not laid out as a
    blob is (a ``.DS_Store``, an NFS ``.nfs…`` file): no blob, so nothing can refer to them."""
    blobs: dict[str, Entry] = {}
    stray: list[Entry] = []
    for entry in entries:
        if _laid_out("blobs", entry.name):
            blobs[blob_digest(entry.name)] = entry
        else:
            stray.append(entry)
    return blobs, stray


_READ = ("answers", "packs", "names")
"""The sections whose files refer to blobs, read and decoded by upkeep."""


def _decoded(
    section: str, name: str, data: bytes, signer: Signer | None
) -> tuple[Answer | PackIndex | str | Corrupt, Corrupt | None]:
    """What the file ``section/name`` holds (a record, an index, or the digest a name points
    at), or why it cannot be read; and, when it is whole but not trusted, why: it fails the
    signature check, or it is a name's file holding another name's binding. What it holds
    is then read without the key or the check: untrusted, yet not damaged."""

    def decode(trusted: bool) -> Answer | PackIndex | str:
        if section == "names":
            return decode_name(name, data, signer) if trusted else pointed_at(name, data)
        digest = blob_digest(name)
        with_key = signer if trusted else None
        if section == "answers":
            return decode_record(digest, data, with_key)
        return decode_pack(digest, data, with_key)

    try:
        return decode(True), None
    except Corrupt as untrusted:  # damage reads no better untrusted: it is told as damage
        try:
            return decode(False), untrusted
        except NewerFormat:
            # Failing its signature, whatever version it says (a digit of it garbled since
            # it was signed): damage, not a newer somatize's, which upkeep would leave.
            return untrusted, None
        except Corrupt as why:
            return why, None


class _Read(NamedTuple):
    section: str
    entry: Entry
    held: Answer | PackIndex | str | Corrupt
    """What the file holds, or why it cannot be read."""
    untrusted: Corrupt | None
    """Why it is not trusted, when it is otherwise whole (see :func:`_decoded`)."""
    stray: bool = False
    """Whether it is named as no file of its section is (a ``.DS_Store``): listed by
    checking, not judged; what a stray name points at is kept all the same."""
    data: bytes = b""
    """The bytes it held when it was read."""


_NAME_MOST = 1024
"""More bytes than the file of any name holds (a digest, and its signature when signed)."""


def _stores_among(shelf: Shelf, section: str, entries: list[Entry]) -> list[str]:
    """The folders among the files ``entries`` of ``section`` (``old`` for ``old/blobs/…``)
    that hold another store, outermost only: one holding a blob in its ``blobs/``, and a
    file in its ``answers/``, ``packs/`` or ``names/``: one made in ``names/`` before the
    other was opened above it (opening it there after is refused), or one opened in
    ``answers/`` or ``packs/``. Its files are none of the other's. In ``names/``, a file
    laid out as a blob is one only if it is no name (names may be bound as
    ``mirror/blobs/ab/<hex>``, and their blobs must be kept): larger than a name, or bytes
    that read as none."""
    blobs: dict[str, list[Entry]] = {}
    others: set[str] = set()
    for entry in entries:
        parts = entry.name.split("/")
        for at in range(1, len(parts) - 1):
            if parts[at] == "blobs" and _laid_out("blobs", "/".join(parts[at + 1 :])):
                blobs.setdefault("/".join(parts[:at]), []).append(entry)
            elif parts[at] in _READ:
                others.add("/".join(parts[:at]))
    roots = sorted(
        root
        for root in blobs.keys() & others
        if section != "names" or _holds_no_name(shelf, blobs[root])
    )
    return [r for r in roots if not any(r.startswith(f"{o}/") for o in roots)]


def _holds_no_name(shelf: Shelf, entries: list[Entry]) -> bool:
    """Whether a file of ``names/`` among ``entries`` is no name: larger than a name's file,
    or bytes that read as no name (the small ones are read)."""
    if any(entry.size > _NAME_MOST for entry in entries):
        return True
    found = shelf._read_many("names", [entry.name for entry in entries])
    return any(
        data is not None and isinstance(_decoded("names", name, data, None)[0], Corrupt)
        for name, data in found.items()
    )


def _in_store(name: str, roots: list[str]) -> str | None:
    """The folder of ``roots`` whose store ``name`` is a file of (in one of its sections),
    or None. A file beside those sections is no file that store writes: a name bound under
    the folder's name (``old/v1``) since, which is this store's; its marker, and the
    ``.gitignore`` a local store writes beside it (no name starts with a dot), are the
    other's."""
    for root in roots:
        if name.startswith(f"{root}/"):
            inside = name[len(root) + 1 :]
            if inside in (MARKER, ".gitignore"):
                return root
            if inside.split("/", 1)[0] in (*SECTIONS, "used") and "/" in inside:
                return root
    return None


def _own_entries(shelf: Shelf, section: str) -> tuple[list[Entry], list[str]]:
    """The files listed in ``section`` that are this store's, and the folders among them
    that hold another store (see :func:`_stores_among`), whose files are left out."""
    entries = shelf._entries(section)
    roots = _stores_among(shelf, section, entries)
    if roots:
        entries = [e for e in entries if _in_store(e.name, roots) is None]
    return entries, roots


def _read_all(shelf: Shelf, wrap: Progress, check_key: bool = True) -> list[_Read]:
    """Every answer record, pack index and name, read and decoded (one read per section);
    :class:`KeyMismatch` when the store signs with another key than ``shelf``'s (unless
    not ``check_key``). The files of another store that lies in a section (made there
    before this one was opened above it) are not read: each such store is one entry,
    stray, named by its folder and a ``/``."""
    out: list[_Read] = []
    for section in _READ:
        entries, roots = _own_entries(shelf, section)
        for root in roots:
            folder = Entry(f"{root}/", 0, 0.0)
            out.append(_Read(section, folder, Corrupt("another store"), None, True))
        found = shelf._read_many(section, [e.name for e in entries])
        for entry in wrap(entries, f"reading {section}", len(entries)):
            data = found.get(entry.name)
            if data is not None:  # None: removed meanwhile
                held, untrusted = _decoded(section, entry.name, data, shelf.signer)
                stray = not _named(section, entry.name)
                out.append(_Read(section, entry, held, untrusted, stray, data))
    if check_key:
        _check_key(shelf, out)
    return out


def _check_key(shelf: Shelf, read: list[_Read]) -> None:
    """Refuses upkeep by a process whose key signed nothing in the store: its checks would
    take every record and index for damage."""
    if shelf.signer is None:
        return
    read = [r for r in read if not r.stray]
    signed = sum(
        1
        for r in read
        if (r.untrusted is None and not isinstance(r.held, Corrupt))
        or isinstance(r.untrusted, NameSignedAlone)  # this key's, the way names once were
    )
    refused = [r for r in read if r.untrusted is not None]
    if refused and not signed:
        raise KeyMismatch(
            f"none of the {len(refused)} records, pack indexes and names in {shelf._where} is "
            f"signed with this process's key ({KEY_VARIABLE} or signing_key=): it is not this "
            "store's key, or the store does not sign. Upkeep would take every answer for "
            "damage, so nothing was done. Run it with the key the store's writers use, or "
            f"with none (unset {KEY_VARIABLE}): without a key upkeep trusts what it finds"
        )


def _refuse_newer(shelf: Shelf, read: list[_Read]) -> None:
    """Refuses a collection of a store holding records or pack indexes a newer somatize
    wrote: which blobs they refer to cannot be told here, so they would be taken for unused
    and removed from under the somatize that reads them."""
    newer = [r for r in read if isinstance(r.held, NewerFormat) and not r.stray]
    if newer:
        first = newer[0]
        raise StoreError(
            f"nothing was collected in {shelf._where}: {len(newer)} of its records and pack "
            "indexes were written by a newer somatize, and which blobs they refer to cannot "
            "be told here, so they would be removed from under it. Collect it with that "
            "somatize; if none writes here, such a file is damaged (a digit of its version "
            "garbled, in a store that does not sign): move it out of the store by hand. The "
            f"first, {first.section}/{first.entry.name}: {first.held}"
        )


@dataclass
class Collected:
    """What :func:`collect` removed and what it left."""

    answers: int = 0
    """Answer records dropped."""
    packs: int = 0
    """Pack indexes dropped (each with all its items)."""
    blobs: int = 0
    """Blobs removed because nothing referred to them any more."""
    abandoned: int = 0
    """Leftovers of interrupted writes removed: files in ``tmp/``, and on S3 this store's
    multipart uploads left incomplete under ``blobs/``."""
    freed: int = 0
    """Bytes removed."""
    kept: int = 0
    """Bytes of blobs, records, pack indexes and names left, those spared by ``grace``
    (:attr:`young`) included."""
    young: int = 0
    """Bytes of blobs nothing refers to that are left because they are younger than
    ``grace`` (a writer elsewhere may be about to refer to them): a later ``gc`` removes
    them once they are older, unless something refers to them by then."""
    unread_names: list[str] = field(default_factory=list)
    """Names whose file could not be read, or failed its check or signature (a digit of its
    digest flipped, cut short): the blob each was bound to cannot be told, so no blob that
    one of them may point at was removed (:attr:`held_for_names`). ``verify`` says what is
    wrong with each; once each is moved aside by ``verify(quarantine=True)``, or bound
    again, a later ``gc`` removes those blobs as ever."""
    unremoved: dict[str, str] = field(default_factory=dict)
    """``section/name`` → why, of each file this gc would have removed but may not (in a
    folder of another user of a shared store): it is left, and went on past it, so that
    the oldest answers went first and a newer one in its stead, to meet ``max_bytes``. A
    gc run as a user who may write the whole store removes them."""
    held_for_names: int = 0
    """Bytes of blobs that nothing else refers to (no record or pack index, no name that
    could be read), old enough to be removed, left because of :attr:`unread_names`."""
    names_led_out: dict[str, str] = field(default_factory=dict)
    """Each link in ``names/`` (as ``names/team``; ``names`` for the section itself) that
    leads out of the store to a folder some :attr:`unread_names` lie in, and the folder it
    leads to: most likely a user's files, each read as a name. ``verify(quarantine=True)``
    leaves them in place; remove the link (moving the names it holds into ``names/``
    first), and a later ``gc`` removes those blobs."""


@dataclass
class _Unit:
    section: str
    name: str
    size: int
    used: float
    blob: str


def _blob_of(held: Answer | PackIndex | str | Corrupt) -> str | None:
    """The blob a record, index or name refers to; None for one that cannot be read."""
    if isinstance(held, Corrupt):
        return None  # damaged: verify() reports it; it pins nothing
    if isinstance(held, Answer):
        return held.value
    return held.blob if isinstance(held, PackIndex) else held


def _unread_name(
    held: Answer | PackIndex | str | Corrupt,
    untrusted: Corrupt | None,
    here: Callable[[str], bool],
) -> bool:
    """Whether a name's file, read as ``held`` (and not trusted for ``untrusted``), cannot
    say which blob it was bound to: it holds no digest, or its check or signature fails and
    the blob it points at is not ``here``, so the digest it holds may be damaged (a digit
    flipped). One signed over its digest alone (:class:`NameSignedAlone`, as an earlier
    somatize signed names) holds the digest its signature vouches for; one signed with
    another key, or bound without one, in a store that signs, the digest of a blob the
    store holds: a digit flipped names no blob there."""
    if isinstance(held, Corrupt):
        return True
    if untrusted is None or isinstance(untrusted, NameSignedAlone):
        return False
    return not (isinstance(held, str) and here(held))


def _unread_names(read: Iterable[_Read], here: Callable[[str], bool]) -> list[str]:
    """The names among ``read`` (strays aside: no name) that cannot say which blob they
    were bound to (:func:`_unread_name`, a blob ``here`` or not)."""
    return [
        r.entry.name
        for r in read
        if r.section == "names" and not r.stray and _unread_name(r.held, r.untrusted, here)
    ]


def _referred_since(
    shelf: Shelf, seen: dict[tuple[str, str], Entry], here: Callable[[str], bool]
) -> tuple[set[str], list[str]]:
    """The blobs referred to by records, indexes and names written since ``seen`` was
    listed (new files, or files that changed), and those names among them that cannot say
    which blob they were bound to (a blob ``here`` or not)."""
    out: set[str] = set()
    fresh_reads: list[_Read] = []
    for section in _READ:
        entries, _ = _own_entries(shelf, section)
        fresh = [e for e in entries if seen.get((section, e.name)) != e]
        found = shelf._read_many(section, [e.name for e in fresh])
        for entry in fresh:
            data = found.get(entry.name)
            if data is not None:
                held, untrusted = _decoded(section, entry.name, data, shelf.signer)
                stray = not _named(section, entry.name)
                fresh_reads.append(_Read(section, entry, held, untrusted, stray))
                blob = _blob_of(held)
                if blob is not None:
                    out.add(blob)
    return out, _unread_names(fresh_reads, here)


def _by_age(entries: list[Entry], now: float, grace: float) -> tuple[list[Entry], list[Entry]]:
    """Those of ``entries`` ``grace`` seconds old or more at ``now``, and those younger. One
    stamped later than ``now`` (a store copied with its files' times from a machine whose
    clock ran ahead) is as old as one made at ``now``, not younger than any grace until
    that time comes."""
    old: list[Entry] = []
    young: list[Entry] = []
    for entry in entries:
        (old if now - min(entry.mtime, now) >= grace else young).append(entry)
    return old, young


def _stamp_kept(shelf: Shelf, found: set[tuple[str, str]], now: float) -> None:
    """Sets the time of each file ``found`` (section, name), one a gc at ``now`` keeps and
    whose file says a later time, to ``now``, so that it ages from there: a record or
    pack index would otherwise stay the most recently used, and a blob or a write in
    ``tmp/`` younger than the grace, at every gc until that time comes."""
    stamped: dict[str, list[str]] = {}
    for section, name in sorted(found):
        stamped.setdefault(section, []).append(name)
    if stamped:
        shelf._stamp(stamped, now)


def collect(
    shelf: Shelf,
    max_bytes: int | None,
    grace: float,
    progress: Progress | None = None,
    abandoned_after: float | None = None,
    check_key: bool = True,
) -> Collected:
    """Drops least-recently-used answers down to ``max_bytes``, then unreferenced blobs
    older than ``grace`` seconds and abandoned writes older than ``abandoned_after``
    (default ``grace``); see the module docstring. Not ``check_key``: what another key
    signed, or a newer somatize wrote, is not refused (a cache of copies only, emptied
    whatever wrote them)."""
    if max_bytes is not None and not (finite(max_bytes) and max_bytes >= 0):
        raise ValueError(
            "max_bytes is a finite number of bytes ≥ 0 (what is left after the least "
            f"recently used answers are dropped), or None to drop none, got {max_bytes!r}"
        )
    for name, seconds in (("grace", grace), ("abandoned_after", abandoned_after)):
        if seconds is not None and not (finite(seconds) and seconds >= 0):
            raise ValueError(
                f"{name} is finite seconds ≥ 0 (what is younger is left alone: a writer may "
                f"be about to refer to it), got {seconds!r}"
            )
    # The blobs this object's own writes refer to from now on, in records or indexes the
    # listings below may have missed, are left alone (:meth:`_removing_blobs`).
    with shelf._collecting():
        shelf._passed_over()  # what a gc stopped part way went past is not this one's to say
        return _collect(shelf, max_bytes, grace, progress or _quiet, abandoned_after, check_key)


def _collect(
    shelf: Shelf,
    max_bytes: float | None,
    grace: float,
    wrap: Progress,
    abandoned_after: float | None,
    check_key: bool,
) -> Collected:
    """:func:`collect`, its arguments checked."""
    shelf._flush_use()
    now = time.time()
    uses = shelf._uses()
    laid, strays = _blobs_among(shelf._entries("blobs"))
    blobs = {blob_digest(e.name): e for e in strays} if shelf._sweeps_strays else {}
    blobs.update(laid)
    # Ages are measured on the clock that stamped the files (a bucket's server's, that of a
    # directory shared over NFS), which the machine's own may run minutes apart from; where
    # a blob is there to weigh against a grace (with none, a blob put this very second goes
    # too).
    measured = bool(blobs and grace)
    ahead = shelf._clock_ahead() if measured else 0.0
    now -= ahead
    out = Collected()
    pinned: set[str] = set()
    kept = 0
    units: list[_Unit] = []
    ahead_of_clock: set[tuple[str, str]] = set()
    read = _read_all(shelf, wrap, check_key)
    if check_key:
        _refuse_newer(shelf, read)
    for section, entry, held_here, _, stray, _ in read:
        blob = _blob_of(held_here)
        if section == "names" or stray:  # a stray record or index (a copy kept by hand)
            kept += entry.size  # is never collected either, nor what it refers to
            if blob is not None:
                pinned.add(blob)  # whatever its signature: names are never collected
        elif blob is not None:
            used = max(entry.mtime, uses.get((section, entry.name), 0.0))
            if used > now:  # stamped by a clock that ran ahead: a use now, aging from here
                ahead_of_clock.add((section, entry.name))
            units.append(_Unit(section, entry.name, entry.size, min(used, now), blob))
    kept += sum(blobs[d].size for d in pinned if d in blobs)
    units.sort(key=lambda unit: unit.used, reverse=True)
    listed = {(r.section, r.entry.name): r.data for r in read}
    drop = _drop_oldest(shelf, units, listed, max_bytes, kept, pinned, blobs)
    dropped, held, gone = drop.tried, drop.held, drop.gone
    out.unremoved.update(drop.unremoved)
    out.answers, out.packs = len(gone["answers"]), len(gone["packs"])
    out.freed += sum(
        u.size for u in dropped["answers"] + dropped["packs"] if u.name in gone[u.section]
    )
    spared = {unit.name for unit in dropped["answers"]} - gone["answers"]
    sweep, young = _by_age([e for d, e in blobs.items() if d not in held], now, grace)
    out.young = sum(e.size for e in young)
    ahead_of_clock.update(("blobs", e.name) for e in young if e.mtime > now)
    ahead_of_clock -= {(u.section, u.name) for u in dropped["answers"] + dropped["packs"]}
    _stamp_kept(shelf, ahead_of_clock, now)
    unread = _unread_names(read, blobs.__contains__)
    seen = {
        (r.section, r.entry.name): r.entry
        for r in read
        if r.section != "answers" or r.entry.name not in spared
    }

    def referred_now() -> set[str] | None:
        """The blobs records, indexes and names published since the store was read refer
        to; None when a name among them cannot say which (it may point at any blob)."""
        referred, unread_since = _referred_since(shelf, seen, blobs.__contains__)
        return None if unread_since else referred

    if sweep:
        # Look again: a writer may have put one of these again (which touches it) and
        # published a record referring to it since the store was listed (a record spared
        # above is one; it is read again).
        referred, unread_since = _referred_since(shelf, seen, blobs.__contains__)
        held |= referred
        unread += unread_since
        now = time.time() - ahead
        again = {e.name: e for e in shelf._entries("blobs")}
        sweep, _ = _by_age(  # each as this last look found it
            [again[e.name] for e in sweep if blob_digest(e.name) not in held and e.name in again],
            now,
            grace,
        )
    looping = dict(shelf._names_looping)  # as the last look at names/ found them
    # What a gc stopped midway left aside goes back where what was read refers to it (a
    # name that cannot be read, or a link not walked, may refer to any).
    put_back, put_back_bytes = shelf._put_back_left(None if unread or looping else held)
    if unread or looping:
        # A name that cannot be read may point at any blob nothing else refers to: none is
        # removed while it is there (a file in blobs/ laid out as no blob is none it names),
        # nor while a link in names/ that is not walked may hide one.
        out.unread_names = sorted(set(unread))
        out.names_led_out = {**shelf._links_out("names", out.unread_names), **looping}
        out.held_for_names = sum(e.size for e in sweep if _laid_out("blobs", e.name))
        sweep = [e for e in sweep if not _laid_out("blobs", e.name)]
    # Never a blob a keep of this store object is putting now, whatever the grace; one
    # put by another thread of it from now on waits until this removal is done.
    with shelf._removing_blobs({blob_digest(e.name) for e in sweep}) as free:
        sweep = [e for e in sweep if blob_digest(e.name) in free]
        # One a writer touched since the last look is left; one referred to after it, by a
        # writer whose put found it there, is put back where a home cannot touch it.
        sweep = shelf._sweep(sweep, referred_now)
    out.unremoved.update(shelf._passed_over())
    out.blobs = len(sweep)
    out.freed += sum(e.size for e in sweep)
    tmp_grace = grace if abandoned_after is None else abandoned_after
    writes = shelf._entries("tmp")
    own = shelf._own_writes()  # after the listing: every write it lists was noted before
    if writes and tmp_grace and not measured:  # weighed against a grace, on the same clock
        now = time.time() - shelf._clock_ahead()
    stale, left = _by_age([e for e in writes if e.name not in own], now, tmp_grace)
    shelf._remove("tmp", [e.name for e in stale])
    passed = shelf._passed_over()
    out.unremoved.update(passed)
    stale = [e for e in stale if f"tmp/{e.name}" not in passed]
    _stamp_kept(shelf, {("tmp", e.name) for e in left if e.mtime > now}, now)
    out.abandoned = len(stale) + put_back
    out.freed += sum(e.size for e in stale) + put_back_bytes
    # What is left of what was listed: what grace spared, and records kept anew, included.
    removed = sum(e.size for e in sweep)
    removed += sum(
        u.size for u in dropped["answers"] + dropped["packs"] if u.name in gone[u.section]
    )
    out.kept = sum(e.size for e in blobs.values()) + sum(r.entry.size for r in read) - removed
    shelf._forget_all()
    return out


@dataclass
class _Dropped:
    """What :func:`_drop_oldest` did."""

    tried: dict[str, list[_Unit]]
    """The units it dropped or tried to, by section."""
    held: set[str]
    """The blobs what is left refers to."""
    gone: dict[str, set[str]]
    """The names of the units it removed, by section."""
    unremoved: dict[str, str]
    """Those it may not remove (:meth:`Shelf._passed_over`)."""


_DROP_AT_ONCE = 1000
"""How many of the oldest units a gc removes in one go (a bulk delete of a bucket's): what
a gc stopped part way has removed is among the oldest it would."""


def _drop_oldest(
    shelf: Shelf,
    units: list[_Unit],
    listed: dict[tuple[str, str], bytes],
    max_bytes: float | None,
    kept: int,
    pinned: set[str],
    blobs: dict[str, Entry],
) -> _Dropped:
    """Drops the least recently used of ``units`` (most recent first) until what is left
    fits ``max_bytes``, ``kept`` bytes being kept besides (the blobs ``pinned`` and what
    refers to them), oldest first. One the home may not remove, and goes past
    (:meth:`Shelf._passed_over`), is kept: the next newer ones go in its stead, so the
    budget is met where it can be."""
    stuck: set[tuple[str, str]] = set()
    tried: set[tuple[str, str]] = set()
    gone: dict[str, set[str]] = {"answers": set(), "packs": set()}
    unremoved: dict[str, str] = {}
    while True:
        dropping, held = _past_budget(units, max_bytes, kept, pinned, blobs, stuck)
        fresh = [u for u in dropping if (u.section, u.name) not in tried]
        if not fresh:
            break
        for start in range(0, len(fresh), _DROP_AT_ONCE):
            batch = fresh[start : start + _DROP_AT_ONCE]
            tried.update((u.section, u.name) for u in batch)
            # A pack index is named by the hash of its bytes: the file listed is the file
            # removed. A record is published again under its key when the answer is kept
            # anew, so only a record still as it was read is dropped: one a writer kept
            # again since is the writer's.
            packs = [u.name for u in batch if u.section == "packs"]
            shelf._remove("packs", packs)
            answers = {u.name: listed["answers", u.name] for u in batch if u.section == "answers"}
            gone["answers"] |= shelf._drop("answers", answers)
            passed = shelf._passed_over()
            unremoved.update(passed)
            gone["packs"].update(name for name in packs if f"packs/{name}" not in passed)
            stuck.update((u.section, u.name) for u in batch if f"{u.section}/{u.name}" in passed)
    dropped: dict[str, list[_Unit]] = {"answers": [], "packs": []}
    for unit in units:
        if (unit.section, unit.name) in tried:
            dropped[unit.section].append(unit)
    return _Dropped(dropped, held, gone, unremoved)


def _past_budget(
    units: list[_Unit],
    max_bytes: float | None,
    kept: int,
    pinned: set[str],
    blobs: dict[str, Entry],
    stuck: set[tuple[str, str]],
) -> tuple[list[_Unit], set[str]]:
    """Those of ``units`` (most recent first) that do not fit ``max_bytes`` beside ``kept``
    bytes and the newer ones, oldest first, and the blobs of those that do; strictly by
    recency, save that those ``stuck`` (which cannot be removed) are kept first."""
    held = set(pinned)
    ahead = [u for u in units if (u.section, u.name) in stuck]
    dropping: list[_Unit] = []
    for unit in ahead + [u for u in units if (u.section, u.name) not in stuck]:
        cost = unit.size + (
            blobs[unit.blob].size if unit.blob in blobs and unit.blob not in held else 0
        )
        over = max_bytes is not None and kept + cost > max_bytes
        if over and not dropping and (unit.section, unit.name) not in stuck:
            dropping.append(unit)  # everything older goes too
            continue
        if dropping:
            dropping.append(unit)
        else:
            kept += cost
            held.add(unit.blob)
    dropping.reverse()
    return dropping, held


@dataclass(frozen=True)
class Damage:
    """One thing :func:`check` found wrong."""

    section: str
    name: str
    why: str


@dataclass
class Verified:
    """What :func:`check` looked at and what it found."""

    blobs: int = 0
    bytes: int = 0
    records: int = 0
    packs: int = 0
    names: int = 0
    abandoned: int = 0
    """Leftovers of interrupted writes in ``tmp/`` (harmless; ``gc`` removes them)."""
    damaged: list[Damage] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    """``section/name`` of everything moved aside."""
    unmoved: dict[str, str] = field(default_factory=dict)
    """``section/name`` → why it could not be moved aside (a read-only store): it is still
    in place, and still damaged."""
    stray: list[str] = field(default_factory=list)
    """``section/name`` of files that are no blob or name (a ``.DS_Store``), so no damage:
    in ``blobs/``, not named by a digest (nothing refers to them, and ``gc`` removes them);
    in ``names/``, not named as a name can be (nothing resolves them, and ``gc``, which
    collects nothing there, leaves them). A folder that holds another store is one entry,
    ``section/folder/`` (ending in ``/``): none of its files are read, nor collected."""
    newer: list[Damage] = field(default_factory=list)
    """Records and pack indexes a newer somatize wrote, in a format this one does not read
    (:class:`~somatize.store.base.NewerFormat`), and why: no damage, never moved aside.
    That somatize verifies them; ``gc`` refuses to run while they are there."""

    @property
    def ok(self) -> bool:
        """Whether nothing was found wrong."""
        return not self.damaged


def check(shelf: Shelf, quarantine: bool, progress: Progress | None = None) -> Verified:
    """Re-hashes every blob, reads every record, index and name; see the module docstring."""
    wrap = progress or _quiet
    out = Verified()
    read = _read_all(shelf, wrap)  # first: a wrong key is refused before anything moves

    def damaged(
        section: str, name: str, why: str, was: bytes | None = None, aside: bool = True
    ) -> None:
        """Reports ``section/name``; with ``quarantine`` moves it aside, unless not
        ``aside`` — only while it holds ``was``, when that is given."""
        if quarantine and aside:
            try:
                moved = shelf._quarantine(section, name, was)
            except StoreError as unmoved:
                out.unmoved[f"{section}/{name}"] = str(unmoved)
            else:
                if moved is None:
                    return  # kept anew in the instant since it was read again: not judged
                if moved:
                    out.quarantined.append(f"{section}/{name}")
        out.damaged.append(Damage(section, name, why))

    for link, folder in shelf._names_looping.items():
        out.damaged.append(
            Damage("names", link.removeprefix("names").lstrip("/"), _looping(folder))
        )
    blobs, stray = _blobs_among(shelf._entries("blobs"))
    out.stray = [f"blobs/{e.name}" for e in stray]
    whole: set[str] = set()
    for digest, entry in wrap(blobs.items(), "hashing blobs", len(blobs)):
        found = shelf._rehash(digest, entry.size)
        if found is None:
            continue  # removed meanwhile (a gc elsewhere)
        out.blobs += 1
        out.bytes += entry.size
        if found == digest:
            whole.add(digest)
        else:
            damaged("blobs", entry.name, f"hashes to {found}")
    unwhole: set[str] = set()

    def whole_now(blob: str) -> bool:
        """Whether blob ``blob`` is whole, hashing again one that was not when the blobs
        were hashed: a writer may have put it (again) since."""
        if blob in whole:
            return True
        if blob not in unwhole:
            if shelf._rehash(blob) == blob:
                whole.add(blob)
                return True
            unwhole.add(blob)
        return False

    def judged(
        section: str,
        name: str,
        held: Answer | PackIndex | str | Corrupt,
        untrusted: Corrupt | None,
        again: bool = False,
    ) -> str | None:
        """Why the file ``section/name``, holding ``held``, is damage; None if it is whole.
        Judged against the blobs as they were hashed, or ``again`` as they are now."""
        wrong = untrusted if untrusted is not None else held
        if isinstance(wrong, Corrupt):
            return str(wrong)
        blob = _blob_of(held)
        assert blob is not None and not isinstance(held, Corrupt)
        here = whole_now(blob) if again else blob in whole
        if isinstance(held, str):
            return None if here else f"points at blob {blob}, which is missing or damaged"
        entry = blobs.get(blob)
        size = entry.size if entry is not None else None  # None: put since it was listed
        if isinstance(held, Answer) and held.offset is not None:
            end = held.size + held.offset
            if not here or (size is not None and size < end):
                return f"refers past blob {blob}"
        elif not here:
            return f"refers to blob {blob}, which is missing or damaged"
        elif size is not None and size != held.size:
            return f"says blob {blob} holds {held.size} bytes; it holds {size}"
        return None

    for section, entry, held_here, untrusted, stray_here, _ in read:
        if stray_here:
            out.stray.append(f"{section}/{entry.name}")
            continue
        if isinstance(held_here, NewerFormat):
            out.newer.append(Damage(section, entry.name, str(held_here)))
            continue
        whole_file = untrusted is None and not isinstance(held_here, Corrupt)
        if section == "names":
            out.names += 1
        elif whole_file and isinstance(held_here, Answer):
            out.records += 1
        elif whole_file and isinstance(held_here, PackIndex):
            out.packs += 1
        why = judged(section, entry.name, held_here, untrusted)
        if why is None:
            continue
        # Read again before it is told: a gc elsewhere may have removed it and its blob
        # since it was read (no damage: it is gone), or a writer kept it anew, or put its
        # blob again (judged as it is now).
        now = shelf._read_many(section, [entry.name]).get(entry.name)
        if now is None:
            continue
        held_now, untrusted_now = _decoded(section, entry.name, now, shelf.signer)
        why = judged(section, entry.name, held_now, untrusted_now, True)
        if why is not None:
            # A name is moved aside only when it cannot say which blob it was bound to (a
            # gc keeps every blob such a name may point at while it is there); one that
            # points at a missing blob stays, mended by putting those bytes again.
            aside = section != "names" or _unread_name(held_now, untrusted_now, whole_now)
            damaged(section, entry.name, why, now, aside)
    out.abandoned = len(shelf._entries("tmp"))
    shelf._forget_all()
    return out


def _looping(folder: str) -> str:
    """Why a link in ``names/`` leading to ``folder``, the store's own or one holding it, is
    told as damage."""
    return (
        f"a link to {folder}, the store's own folder or one holding it: it is not walked "
        "(it would walk the store again, and every folder beside it), so no name there is "
        "read, and gc keeps every blob nothing else refers to. Remove the link"
    )


@dataclass
class Survey:
    """How many files and bytes each section holds."""

    files: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Bytes in all sections."""
        return sum(self.bytes.values())


def listing(shelf: Shelf, section: str) -> list[Entry]:
    """The files of one section (``answers``, ``packs``, ``names``, ``blobs``, …)."""
    if section not in shelf._sections:
        # A misspelt section holds no file: told as empty, it would pass for one emptied.
        kept = ", ".join(f"`{name}`" for name in shelf._sections)
        raise ValueError(f"{shelf._where} keeps its files in {kept}; got {section!r}")
    return shelf._entries(section)


def _named(section: str, name: str) -> bool:
    """Whether ``name`` is what a file of ``section`` is named: a valid name in ``names/``,
    a digest elsewhere."""
    if section != "names":
        return _laid_out(section, name)
    try:
        check_name(name)
    except BadName:
        return False
    return True


READ_SECTIONS = ("answers", "packs", "names")
"""The sections whose files :func:`contents` reads: records, pack indexes, bindings."""


@overload
def contents(shelf: Shelf, section: Literal["answers"]) -> list[tuple[Entry, Answer | Corrupt]]: ...


@overload
def contents(
    shelf: Shelf, section: Literal["packs"]
) -> list[tuple[Entry, PackIndex | Corrupt]]: ...


@overload
def contents(shelf: Shelf, section: Literal["names"]) -> list[tuple[Entry, str | Corrupt]]: ...


@overload
def contents(
    shelf: Shelf, section: str
) -> list[tuple[Entry, Answer | PackIndex | str | Corrupt]]: ...


def contents(shelf: Shelf, section: str) -> list[tuple[Entry, Any]]:
    """Each record, pack index or name of ``section`` (``answers``, ``packs``, ``names``)
    and what it holds, or why it cannot be read (damaged, or not this user's to read):
    one listing and one read of each file. Each entry's time is when it was last used, as
    a gc weighs it: a bucket keeps a recall's time in its ``used/`` logs, not in the file's.
    Files named as none of them can be (a ``.DS_Store``) are left out. Read without the
    signing key: this says what the store holds, not what a reader would trust."""
    if section not in READ_SECTIONS:
        # Read as pack indexes, a blob would be told as damage, and a misspelt section as
        # holding nothing.
        raise ValueError(
            f"contents reads the files of `answers`, `packs` and `names`, got {section!r}; "
            f"list the files of any section with `listing(store, {section!r})`"
        )
    uses = shelf._uses(merge=False) if section != "names" else {}
    entries = [
        e._replace(mtime=max(e.mtime, uses.get((section, e.name), 0.0)))
        for e in _own_entries(shelf, section)[0]
        if _named(section, e.name)
    ]
    names = [e.name for e in entries]
    unread: dict[str, Corrupt] = {}
    try:
        found = shelf._read_many(section, names)
    except StoreError as why:
        if not isinstance(why.__cause__, PermissionError):
            raise
        found = {}  # one this user may not read (another user's): each is read alone
        for name in names:
            try:
                found.update(shelf._read_many(section, [name]))
            except StoreError as alone:
                if not isinstance(alone.__cause__, PermissionError):
                    raise
                unread[name] = Corrupt(str(alone))
    out: list[tuple[Entry, Answer | PackIndex | str | Corrupt]] = []
    for entry in entries:
        data = found.get(entry.name)
        if entry.name in unread:
            out.append((entry, unread[entry.name]))
        elif data is not None:  # None: removed meanwhile
            out.append((entry, _decoded(section, entry.name, data, None)[0]))
    return out


def survey(shelf: Shelf) -> Survey:
    """Files and bytes per section the home keeps (one listing each)."""
    out = Survey()
    for section in shelf._sections:
        entries = shelf._entries(section)
        out.files[section] = len(entries)
        out.bytes[section] = sum(e.size for e in entries)
    return out
