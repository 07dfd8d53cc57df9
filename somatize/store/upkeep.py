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
Names pin what they point at and are never collected. A blob nothing refers to
is removed only once it is older than ``grace`` seconds, because a writer may
have put it a moment ago and be about to publish the record that refers to it.

**Checking** (:func:`check`) re-hashes every blob from scratch (not trusting what
this process verified before) and reads every record, index and name; what does
not match is reported, and with ``quarantine`` moved to ``quarantine/`` so it is
a miss from then on (and can still be looked at).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from somatize.store.base import Answer, Corrupt
from somatize.store.records import PackIndex, Signer, decode_name, decode_pack, decode_record

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
    "listing",
    "survey",
]

SECTIONS = ("blobs", "answers", "packs", "names", "tmp", "quarantine")

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

    def _entries(self, section: str) -> list[Entry]: ...

    def _read_many(self, section: str, names: list[str]) -> dict[str, bytes | None]: ...

    def _remove(self, section: str, names: list[str]) -> None: ...

    def _quarantine(self, section: str, name: str) -> None: ...

    def _rehash(self, digest: str) -> str | None: ...

    def _flush_use(self) -> None: ...

    def _uses(self) -> dict[tuple[str, str], float]: ...

    def _forget_all(self) -> None: ...


def _digest_of(name: str) -> str:
    return "blake3:" + name.rsplit("/", 1)[-1]


def _records(
    shelf: Shelf, wrap: Progress
) -> Iterator[tuple[str, Entry, Answer | PackIndex | Corrupt]]:
    """Every answer record and pack index, read and decoded (or why it could not be):
    ``(section, entry, what it holds)``. One read per section."""
    for section in ("answers", "packs"):
        entries = shelf._entries(section)
        found = shelf._read_many(section, [e.name for e in entries])
        for entry in wrap(entries, f"reading {section}", len(entries)):
            data = found.get(entry.name)
            if data is None:
                continue  # removed meanwhile
            digest = _digest_of(entry.name)
            try:
                if section == "answers":
                    yield section, entry, decode_record(digest, data, shelf.signer)
                else:
                    yield section, entry, decode_pack(digest, data, shelf.signer)
            except Corrupt as why:
                yield section, entry, why


def _names(shelf: Shelf) -> Iterator[tuple[Entry, str | Corrupt]]:
    """Every name and the blob it points at (or why it could not be read)."""
    for entry in shelf._entries("names"):
        data = shelf._read_many("names", [entry.name]).get(entry.name)
        if data is None:
            continue
        try:
            yield entry, decode_name(entry.name, data, shelf.signer)
        except Corrupt as why:
            yield entry, why


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
    """Leftovers of interrupted writes removed from ``tmp/``."""
    freed: int = 0
    """Bytes removed."""
    kept: int = 0
    """Bytes of blobs and records left."""


@dataclass
class _Unit:
    section: str
    name: str
    size: int
    used: float
    blob: str


def collect(
    shelf: Shelf,
    max_bytes: int | None,
    grace: float,
    progress: Progress | None = None,
) -> Collected:
    """Drops least-recently-used answers down to ``max_bytes``, then unreferenced blobs
    and abandoned writes older than ``grace`` seconds; see the module docstring."""
    if max_bytes is not None and max_bytes < 0:
        raise ValueError(f"max_bytes is a number of bytes ≥ 0, got {max_bytes}")
    wrap = progress or _quiet
    shelf._flush_use()
    now = time.time()
    uses = shelf._uses()
    blobs = {_digest_of(e.name): e for e in shelf._entries("blobs")}
    out = Collected()
    pinned: set[str] = set()
    kept = 0
    for entry, pointed in _names(shelf):
        kept += entry.size
        if not isinstance(pointed, Corrupt):
            pinned.add(pointed)
    units: list[_Unit] = []
    for section, entry, held_here in _records(shelf, wrap):
        if isinstance(held_here, Corrupt):
            continue  # damaged: verify() reports it; it pins nothing
        blob = held_here.value if isinstance(held_here, Answer) else held_here.blob
        used = max(entry.mtime, uses.get((section, entry.name), 0.0))
        units.append(_Unit(section, entry.name, entry.size, used, blob))
    held: set[str] = set(pinned)
    kept += sum(blobs[d].size for d in pinned if d in blobs)
    units.sort(key=lambda unit: unit.used, reverse=True)
    dropping = False
    dropped: dict[str, list[str]] = {"answers": [], "packs": []}
    for unit in units:
        cost = unit.size + (
            blobs[unit.blob].size if unit.blob in blobs and unit.blob not in held else 0
        )
        if max_bytes is not None and not dropping and kept + cost > max_bytes:
            dropping = True  # strictly by recency: everything older goes too
        if dropping:
            dropped[unit.section].append(unit.name)
            out.freed += unit.size
        else:
            kept += cost
            held.add(unit.blob)
    for section, names in dropped.items():
        shelf._remove(section, names)
    out.answers, out.packs = len(dropped["answers"]), len(dropped["packs"])
    sweep = [e for d, e in blobs.items() if d not in held and now - e.mtime >= grace]
    shelf._remove("blobs", [e.name for e in sweep])
    out.blobs = len(sweep)
    out.freed += sum(e.size for e in sweep)
    stale = [e for e in shelf._entries("tmp") if now - e.mtime >= grace]
    shelf._remove("tmp", [e.name for e in stale])
    out.abandoned = len(stale)
    out.freed += sum(e.size for e in stale)
    out.kept = kept
    shelf._forget_all()
    return out


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

    @property
    def ok(self) -> bool:
        """Whether nothing was found wrong."""
        return not self.damaged


def check(shelf: Shelf, quarantine: bool, progress: Progress | None = None) -> Verified:
    """Re-hashes every blob, reads every record, index and name; see the module docstring."""
    wrap = progress or _quiet
    out = Verified()

    def damaged(section: str, name: str, why: str, aside: bool = True) -> None:
        out.damaged.append(Damage(section, name, why))
        if quarantine and aside:
            shelf._quarantine(section, name)
            out.quarantined.append(f"{section}/{name}")

    blobs = {_digest_of(e.name): e for e in shelf._entries("blobs")}
    whole: set[str] = set()
    for digest, entry in wrap(blobs.items(), "hashing blobs", len(blobs)):
        found = shelf._rehash(digest)
        if found is None:
            continue  # removed meanwhile (a gc elsewhere)
        out.blobs += 1
        out.bytes += entry.size
        if found == digest:
            whole.add(digest)
        else:
            damaged("blobs", entry.name, f"hashes to {found}")

    def refers(section: str, name: str, blob: str, size: int) -> None:
        entry = blobs.get(blob)
        if blob not in whole or entry is None:
            damaged(section, name, f"refers to blob {blob}, which is missing or damaged")
        elif entry.size != size:
            damaged(section, name, f"says blob {blob} holds {size} bytes; it holds {entry.size}")

    for section, entry, held_here in _records(shelf, wrap):
        if isinstance(held_here, Corrupt):
            damaged(section, entry.name, str(held_here))
        elif isinstance(held_here, Answer):
            out.records += 1
            end = held_here.size + (held_here.offset or 0)
            if held_here.offset is None:
                refers(section, entry.name, held_here.value, held_here.size)
            elif held_here.value not in whole or blobs[held_here.value].size < end:
                damaged(section, entry.name, f"refers past blob {held_here.value}")
        else:
            out.packs += 1
            refers(section, entry.name, held_here.blob, held_here.size)
    for entry, pointed in _names(shelf):
        out.names += 1
        if isinstance(pointed, Corrupt):
            damaged("names", entry.name, str(pointed), aside=False)
        elif pointed not in whole:
            damaged(
                "names", entry.name, f"points at blob {pointed}, which is missing or damaged", False
            )
    out.abandoned = len(shelf._entries("tmp"))
    shelf._forget_all()
    return out


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
    return shelf._entries(section)


def survey(shelf: Shelf) -> Survey:
    """Files and bytes per section (one listing each)."""
    out = Survey()
    for section in SECTIONS:
        entries = shelf._entries(section)
        out.files[section] = len(entries)
        out.bytes[section] = sum(e.size for e in entries)
    return out
