"""Compaction: many small packs merged into a few large ones, once they are published.

A writer that keeps one batch at a time (a row cache in a Ray worker) leaves a pack per
batch, and a fresh process's first recall reads every index: thousands of small packs
cost seconds that one large pack does not. Compaction writes their items again as packs
of up to :data:`~somatize.store.records.PACK_BYTES`, then removes the small ones — in
two steps, each of which leaves every row readable, so a compaction killed at any point
loses nothing:

1. **Merge.** The items a group of small packs serves are written as one pack: its blob,
   then its signed index, exactly as a writer publishes one. The new pack is stamped just
   after the newest of its members (not now): it replaces them, and nothing newer. Packs
   that share a key with a record, with a pack that is not merged (damaged, unsigned, its
   blob missing, too large), or with a pack of another codec or fingerprint, are left as
   they are: the newest answer to each key is still the one served. So is a group one of
   whose keys was kept again after the listing, found by a look just before the index is
   published: the merged pack, stamped after the newest member, might win over that answer.
   A pack stamped less than ``grace`` seconds ago is not merged yet: a writer that has not
   seen the merged pack stamps a key it keeps again by its own clock, and one behind by less
   than the grace still stamps it after the merged pack.
2. **Remove.** A pack every key of which a newer pack answers serves nothing: a reader
   picks the newer one. Its index is removed once that newer pack's index is older than
   ``grace`` seconds (what gc waits before it removes a file nothing refers to), and gc
   removes its blob, which nothing refers to any more. A reader that adopted the small pack
   before and finds its blob gone looks at ``packs/`` again and reads the item from the
   large one.

Both steps run at each compaction, removal after merging: with ``grace=0`` one run does
both; otherwise the small packs go at a run after the grace. A signed store is compacted
only with its key: without it, what the merge wrote would be unsigned, and the readers
would take its rows for absent once the small packs are gone.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from somatize._numbers import finite
from somatize.store.base import Buffer, Corrupt, Missing, NewerFormat, StoreError
from somatize.store.records import (
    KEY_VARIABLE,
    PACK_BYTES,
    KeyMismatch,
    PackIndex,
    _Packing,
    decode_pack,
    index_pack,
)
from somatize.store.upkeep import Entry, _laid_out, blob_digest

__all__ = ["Compacted", "compact"]


@dataclass
class Compacted:
    """What a compaction did."""

    merged: int = 0
    """Small packs whose items were written into new packs."""
    written: int = 0
    """New packs written."""
    removed: int = 0
    """Pack indexes removed: each answered only keys a newer pack older than ``grace``
    answers (their blobs go at the next gc)."""
    waiting: int = 0
    """Packs a newer pack replaces, left until that one is older than ``grace``."""
    young: int = 0
    """Small packs kept less than ``grace`` ago, not merged: a later compaction merges them."""


class _Compacting(_Packing, Protocol):
    """What compaction needs of a home."""

    def _entries(self, section: str) -> list[Entry]: ...

    def _read_many(self, section: str, names: list[str]) -> dict[str, bytes | None]: ...

    def _remove(self, section: str, names: list[str]) -> None: ...

    def _passed_over(self) -> dict[str, str]: ...

    def _clock_ahead(self) -> float: ...

    def _read_blob(self, digest: str, size: int | None, borrow: bool = False) -> memoryview: ...

    def _forget_all(self) -> None: ...

    def _records_among(self, keys: Sequence[str]) -> dict[str, bytes]: ...


class _Packs:
    """The trusted packs of a store as one listing found them, and what else answers keys."""

    def __init__(self, home: _Compacting) -> None:
        self.listed: dict[str, Entry] = {}
        """Pack id → its index's entry in ``packs/``."""
        self.trusted: dict[str, PackIndex] = {}
        """Pack id → the pack, for each whose index reads and passes its signature check."""
        self.blobs: dict[str, int] = {}
        """Blob digest → its size, for every blob in ``blobs/``."""
        self.recorded: set[str] = set()
        """Keys some record in ``answers/`` answers."""
        self.later: dict[str, frozenset[str] | None] = {}
        """Pack id → the keys it answers, for each pack published since this listing and read
        since (None: one written by a newer somatize, which may answer any key)."""
        for entry in home._entries("packs"):
            if _laid_out("packs", entry.name):
                self.listed[f"blake3:{entry.name}"] = entry
        found = home._read_many("packs", [name[7:] for name in self.listed])
        for pack_id in self.listed:
            data = found.get(pack_id[7:])
            if data is None:
                continue
            if home.signer is None and _signed(data):
                raise KeyMismatch(
                    f"nothing was compacted: pack index {pack_id} is signed, and this store "
                    "object holds no key: the packs it wrote would be unsigned, which the "
                    f"store's readers refuse. Compact with the store's key (in {KEY_VARIABLE} "
                    "or as `signing_key=`)"
                )
            try:
                self.trusted[pack_id] = decode_pack(pack_id, data, home.signer)
            except NewerFormat as why:
                raise StoreError(
                    f"nothing was compacted: pack index {pack_id} was written by a newer "
                    f"somatize ({why}); compact the store with that version"
                ) from None
            except Corrupt:
                continue  # a reader ignores it too: it answers nothing
        for entry in home._entries("blobs"):
            if _laid_out("blobs", entry.name):
                self.blobs[blob_digest(entry.name)] = entry.size
        for entry in home._entries("answers"):
            if _laid_out("answers", entry.name):
                self.recorded.add(f"blake3:{entry.name[3:]}")

    def whole(self, pack: PackIndex) -> bool:
        """Whether the blob of ``pack`` is there, as large as its index says."""
        return self.blobs.get(pack.blob) == pack.size


def _signed(index: bytes) -> bool:
    """Whether pack ``index`` says it carries a signature (its header, nothing checked)."""
    try:
        header = json.loads(index.partition(b"\n")[0])
    except (ValueError, RecursionError):
        return False
    return isinstance(header, dict) and header.get("signed") is True


def compact(home: _Compacting, grace: float) -> Compacted:
    """Merges small packs of ``home`` into large ones, then removes the packs larger ones
    replaced more than ``grace`` seconds ago; see the module docstring."""
    if not (finite(grace) and grace >= 0):
        raise ValueError(
            "grace is finite seconds ≥ 0 (a pack a newer one replaces is removed once that "
            f"one is this old: a reader may have just listed it), got {grace!r}"
        )
    out = Compacted()
    home._passed_over()  # what a gc stopped part way went past is not this one's to say
    packs = _Packs(home)
    before = time.time() - grace
    out.young = sum(
        pack.size < PACK_BYTES // 2 and pack.created >= before for pack in packs.trusted.values()
    )
    for group in _groups(packs, before):
        if _merge(home, packs, group):
            out.merged += len(group)
            out.written += 1
    home._forget_all()  # the packs it holds in memory are looked at again
    _remove_replaced(home, _Packs(home), grace, out)
    home._forget_all()
    return out


def _newest(pack: PackIndex) -> tuple[float, str]:
    """The order in which readers prefer packs: the newer wins."""
    return (pack.created, pack.id)


def _groups(packs: _Packs, before: float) -> list[list[PackIndex]]:
    """The packs to merge, in groups of one codec and fingerprint whose items, one answer a
    key, fit a pack; each key of a group is answered by no pack outside it nor any record.
    Only packs stamped ``before`` are merged: the merged pack is stamped after its newest
    member, and a writer that has not seen it yet stamps a key it keeps again by its own
    clock, which may run behind the one that stamped that member (up to the grace)."""
    parent: dict[str, str] = {}

    def root(pack_id: str) -> str:
        while parent[pack_id] != pack_id:
            parent[pack_id] = parent[parent[pack_id]]
            pack_id = parent[pack_id]
        return pack_id

    holder: dict[str, str] = {}  # key → a pack that holds it
    for pack_id in packs.trusted:
        parent[pack_id] = pack_id
    for pack_id, pack in packs.trusted.items():
        for key in pack.entries:
            other = holder.setdefault(key, pack_id)
            parent[root(other)] = root(pack_id)
    joined: dict[str, list[PackIndex]] = {}
    for pack_id, pack in packs.trusted.items():
        joined.setdefault(root(pack_id), []).append(pack)
    by_kind: dict[tuple[str, str | None], list[tuple[int, list[PackIndex]]]] = {}
    for component in joined.values():
        size = _served_bytes(component)
        kinds = {(pack.codec, pack.fingerprint) for pack in component}
        small = all(
            pack.size < PACK_BYTES // 2 and packs.whole(pack) and pack.created < before
            for pack in component
        )
        recorded = any(key in packs.recorded for pack in component for key in pack.entries)
        # A key in two packs: the older one waits to be removed (a merge not yet settled),
        # or a writer kept the key again; either way it is left as it is.
        once = len(_winners(component)) == sum(len(pack.entries) for pack in component)
        if len(kinds) == 1 and small and once and not recorded and size <= PACK_BYTES:
            by_kind.setdefault(kinds.pop(), []).append((size, component))
    groups: list[list[PackIndex]] = []
    for components in by_kind.values():
        components.sort(key=lambda sized: min(map(_newest, sized[1])))
        filled, group = 0, list[PackIndex]()
        for size, component in components:
            if group and filled + size > PACK_BYTES:
                groups.append(group)
                filled, group = 0, []
            group += component
            filled += size
        groups.append(group)
    return [group for group in groups if len(group) > 1]


def _winners(group: Sequence[PackIndex]) -> dict[str, PackIndex]:
    """Key → the pack of ``group`` a reader would answer it from (the newest)."""
    out: dict[str, PackIndex] = {}
    for pack in sorted(group, key=_newest):
        out.update(dict.fromkeys(pack.entries, pack))
    return out


def _served_bytes(group: Sequence[PackIndex]) -> int:
    return sum(pack.entries[key][1] for key, pack in _winners(group).items())


def _merge(home: _Compacting, packs: _Packs, group: Sequence[PackIndex]) -> bool:
    """Writes the items ``group`` serves as one pack, stamped just after its newest member;
    False where a member's blob is gone or damaged (a gc or verify elsewhere), or where one
    of its keys was kept again since ``packs`` was listed, and no index was written."""
    winners = _winners(group)
    try:
        blobs = {pack.id: home._read_blob(pack.blob, pack.size, True) for pack in group}
    except (Missing, Corrupt):
        return False
    keys = sorted(winners)
    pieces: list[Buffer] = []
    lengths: list[int] = []
    for key in keys:
        pack = winners[key]
        start, length = pack.entries[key]
        pieces.append(blobs[pack.id][start : start + length])
        lengths.append(length)
    newest = max(group, key=_newest)
    created = math.nextafter(newest.created, math.inf)
    with home._keeping() as claims:  # the blob is this compaction's until its index is out
        blob = home._put(pieces, claims)
        if _kept_again_since(home, packs, keys):
            return False  # the blob, referred to by nothing, goes at a gc
        index_pack(home, blob, keys, lengths, newest.codec, newest.fingerprint, created=created)
        home._published(claims)
    return True


def _kept_again_since(home: _Compacting, packs: _Packs, keys: Sequence[str]) -> bool:
    """Whether a record or pack published since ``packs`` was listed answers one of ``keys``.
    The merged pack, stamped after its newest member, would win over it, though it may be
    newer than the member that held its key: kept by a writer whose clock runs behind the
    one that stamped the newest member, or stamped before the listing and published after.
    Looked at once the merged blob is written, just before its index would be."""
    if home._records_among(keys):
        return True  # no key of a group had a record when it was listed
    unread = [
        entry.name
        for entry in home._entries("packs")
        if _laid_out("packs", entry.name)
        and f"blake3:{entry.name}" not in packs.listed
        and f"blake3:{entry.name}" not in packs.later
    ]
    for name, data in home._read_many("packs", unread).items():
        if data is not None:
            packs.later[f"blake3:{name}"] = _keys_of_later(home, name, data)
    wanted = set(keys)
    return any(held is None or not wanted.isdisjoint(held) for held in packs.later.values())


def _keys_of_later(home: _Compacting, name: str, data: bytes) -> frozenset[str] | None:
    """The keys pack index ``data``, published during the compaction, answers: none where it
    is damaged or unsigned, as a reader finds; None where a newer somatize wrote it (it may
    answer any)."""
    try:
        return frozenset(decode_pack(f"blake3:{name}", data, home.signer).entries)
    except NewerFormat:
        return None
    except Corrupt:
        return frozenset()


def _remove_replaced(home: _Compacting, packs: _Packs, grace: float, out: Compacted) -> None:
    """Removes the index of each pack every key of which a newer pack, whole and older than
    ``grace``, answers; counts in ``out`` those left for the grace."""
    now = time.time() - home._clock_ahead()
    settled: dict[str, tuple[float, str]] = {}  # key → the newest settled pack answering it
    fresh: dict[str, tuple[float, str]] = {}  # the same, of packs younger than grace too
    for pack_id, pack in packs.trusted.items():
        if not packs.whole(pack):
            continue
        old = now - min(packs.listed[pack_id].mtime, now) >= grace
        for table in (settled, fresh) if old else (fresh,):
            _note_newest(table, pack.entries, _newest(pack))
    removed: list[str] = []
    for pack in packs.trusted.values():
        order = _newest(pack)
        if _all_newer(settled, pack.entries, order):
            removed.append(pack.id[7:])
        elif _all_newer(fresh, pack.entries, order):
            out.waiting += 1
    home._remove("packs", removed)
    _refuse_passed_over(home)
    out.removed = len(removed)


def _refuse_passed_over(home: _Compacting) -> None:
    """StoreError naming a pack index the home went past for want of permission (in a
    folder of another user of a shared store): a compaction that leaves one says so,
    rather than counting it removed, and leaves it for no later gc to report."""
    passed = home._passed_over()
    if passed:
        where, why = next(iter(passed.items()))
        more = f", nor {len(passed) - 1} more pack indexes" if len(passed) > 1 else ""
        raise StoreError(
            f"could not remove {where} ({why}){more}, left as they are (every row is still "
            "recalled); the other packs a newer one replaces are removed. Run compact as a "
            "user who may write the whole store"
        )


def _note_newest(
    table: dict[str, tuple[float, str]], keys: Iterable[str], order: tuple[float, str]
) -> None:
    for key in keys:
        if table.get(key, (-math.inf, "")) < order:
            table[key] = order


def _all_newer(
    table: dict[str, tuple[float, str]], keys: Iterable[str], order: tuple[float, str]
) -> bool:
    return all(table.get(key, (-math.inf, "")) > order for key in keys)
