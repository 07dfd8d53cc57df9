"""What a store writes besides blobs: answer records, names and pack indexes — and
how a store that shares a secret signs them.

An **answer record** is a line of JSON (:meth:`Answer.to_json`) naming the blob
that holds the answer. A **name** is a digest on one line, and on a second what
ties it to the name (below). Both are small,
rewritten rarely, and read often, so they are plain text anyone can inspect.

A name bound without a key carries, after its digest, a check that is no signature —
``unkeyed:`` and the BLAKE3 of the name and its digest, which anyone can make — so that a
name's file holding another name's binding is refused, not followed: one copied over it
by hand, or one bound for a name differing only in case on a filesystem that does not tell
case apart (macOS, Windows), where both names are one file. It follows the same mark a
signature does, so a reader that knows no such check reads the digest and ignores it, and
a reader with a key takes it for what it is: no signature.

A **pack index** lists the item answers of a mapped node that were kept together
in one blob (their bytes one after another), so that 100,000 items are a
handful of files, not 100,000::

    {"somatize": 1, "pack": 1, "blob": "blake3:…", "bytes": N, "codec": …,
     "fingerprint": …, "created": …, "count": n, "signed": false}\\n
    n × (32-byte item key, 8-byte offset, 8-byte length), big-endian
    [32-byte HMAC-SHA256 of everything above, when signed]

An index is itself named by the BLAKE3 of its bytes (``packs/<hex>``), so a
damaged one is caught when it is loaded and two writers of the same pack write
the same file. Looking up an item is one dictionary lookup once the indexes are
in memory; loading a 100,000-item index is one read and one ``iter_unpack``.

**Signing.** With a key (passed in, or ``SOMATIZE_STORE_KEY``), records, names
and indexes carry an HMAC-SHA256 of their bytes, and a reader refuses any that
lacks a valid one (:class:`Unsigned`, a kind of :class:`Corrupt`: a miss that is
recomputed, never an answer handed over). Blobs need no signature: a signed
record names the blob by its digest, and the blob is checked against it.

The key itself never leaves the process that holds it, but for the children that
``multiprocessing`` starts from it. What another process is told about it (a store's
address, :meth:`Store.address`, and a store pickled) is its **fingerprint**:
the hash of an HMAC of a fixed label under the key, which says whether two keys
are the same and nothing else — a process with the same key in its own
``SOMATIZE_STORE_KEY`` finds the same fingerprint (:func:`signer_matching`); one
without it cannot sign, so it does not open the store (:class:`KeyMismatch`).
"""

from __future__ import annotations

import bisect
import hashlib
import hmac
import itertools
import json
import os
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Protocol

import blake3

from somatize.store.base import (
    RECORD_VERSION,
    Answer,
    Buffer,
    Corrupt,
    StoreError,
    check_digest,
    check_digests,
    check_version,
    moment,
)

__all__ = [
    "KEY_VARIABLE",
    "Fingerprinted",
    "KeyMismatch",
    "NameSignedAlone",
    "PackIndex",
    "Signer",
    "Unsigned",
    "bound_for",
    "decode_name",
    "decode_pack",
    "decode_record",
    "encode_name",
    "encode_pack",
    "encode_record",
    "holds_another_name",
    "index_pack",
    "keep_packed",
    "keep_packed_joined",
    "pack_entries",
    "pointed_at",
    "signer_from",
    "signer_matching",
    "span_of",
    "split_joined",
]

PACK_ITEM_BELOW = 1 << 20
"""Item answers smaller than this are packed; larger ones are kept as blobs of their own."""

PACK_BYTES = 64 << 20
"""A pack's blob is closed once it holds this many bytes."""

KEY_VARIABLE = "SOMATIZE_STORE_KEY"
"""The environment variable a store reads its signing key from when none is passed."""

PACK_VERSION = 1
_ENTRY = struct.Struct(">32sQQ")
_MAC = b"\nmac:"
_MAC_BYTES = 32
_UNKEYED = b"unkeyed:"
"""What follows :data:`_MAC` in a name bound without a key, before its check: a signature is
hex alone, so neither is taken for the other."""
_FINGERPRINT = b"somatize: the fingerprint of a store signing key\n"
"""What the fingerprint is an HMAC of. It ends in a line break no record, name or index
body does, and the fingerprint is a hash of that HMAC, so it signs nothing a store holds."""


class Unsigned(Corrupt):
    """A record, name or index without a valid signature, in a store that signs: nobody
    holding the key wrote it, so it is not trusted."""


class NameSignedAlone(Unsigned):
    """A name signed with the store's key over its digest alone, as somatize signed names
    before a name's signature covered the name: it is not trusted (the file of another
    name could have been copied over it), and is bound again to be."""


class KeyMismatch(StoreError):
    """A process whose signing key is not the store's: opened from the store's address, it
    could read, but anything it wrote would be refused, so it does not open the store; asked
    for upkeep (gc, verify) of a store its key signed nothing of, it would take every answer
    for damage, so it does nothing."""


class Signer:
    """HMAC-SHA256 under one secret key."""

    __slots__ = ("_key",)

    def __init__(self, key: str | bytes) -> None:
        if isinstance(key, str):
            try:  # bytes no text spells, set in the environment, are held as surrogates
                raw = key.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raise ValueError(
                    "a store signing key holds a lone surrogate, which no bytes spell; pass "
                    "the secret's text, or its bytes"
                ) from None
        elif isinstance(key, (bytes, bytearray, memoryview)):
            raw = bytes(key)
        else:  # bytes(5) would be five zero bytes, bytes(True) one: a key nobody meant
            raise TypeError(
                f"a store signing key is a str or bytes, got {type(key).__name__}; pass the "
                "secret itself (quote a number read from a config file)"
            )
        if not raw:
            raise ValueError(
                "a store signing key is empty; pass a non-empty secret (or unset "
                f"{KEY_VARIABLE} to keep an unsigned store)"
            )
        self._key = raw

    def mac(self, data: Buffer) -> bytes:
        """The signature of ``data``."""
        return hmac.new(self._key, data, hashlib.sha256).digest()

    def check(self, data: Buffer, mac: bytes) -> bool:
        """Whether ``mac`` is the signature of ``data``."""
        return hmac.compare_digest(self.mac(data), mac)

    @property
    def fingerprint(self) -> str:
        """Hex that is the same for the same key and tells nothing about it: what a store's
        address carries instead of the key."""
        return hashlib.sha256(self.mac(_FINGERPRINT)).hexdigest()

    def __repr__(self) -> str:
        return "Signer(<secret>)"

    def __reduce__(self) -> tuple[type[Fingerprinted], tuple[str]]:
        # Pickled (`torch.save` of a model holding a store, `pickle.dumps`) as its
        # fingerprint alone, never the key, which a file would carry to whoever reads it.
        return Fingerprinted, (self.fingerprint,)

    def __copy__(self) -> Signer:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Signer:
        return self  # a copy in this process (an EMA of a model holding a store) signs on


def _with_key(signer: Signer) -> tuple[type[Signer], tuple[bytes]]:
    """How a signer travels to a process that ``multiprocessing`` starts from this one (a
    spawned DataLoader worker, a rank of ``ddp_spawn``): with its key, through the pipe to
    that child, as the store handed to it was opened here."""
    return Signer, (signer._key,)


ForkingPickler.register(Signer, _with_key)


@dataclass(frozen=True)
class Fingerprinted:
    """What an unpickled store holds of its signer until it is set up: the fingerprint of
    the key it signed with, which the store exchanges for ``$SOMATIZE_STORE_KEY`` where
    that is the same key (:meth:`signer`)."""

    fingerprint: str

    def signer(self, where: str) -> Signer:
        """The signer of ``$SOMATIZE_STORE_KEY`` for the store at ``where``; KeyMismatch
        when this process holds no such key, so it cannot sign what the store's readers
        accept, as when the store is opened from its address."""
        try:
            found = signer_matching(self.fingerprint, where)
        except KeyMismatch as why:
            raise KeyMismatch(
                f"{why}. A store is pickled (`torch.save` of a model holding it) with the "
                "fingerprint of its signing key, never the key itself"
            ) from None
        assert found is not None  # a fingerprint is set
        return found


def signer_from(
    key: str | bytes | Signer | None, environ: Mapping[str, str] = os.environ
) -> Signer | None:
    """The signer for ``key``, or for ``$SOMATIZE_STORE_KEY`` when ``key`` is None; None if
    neither is set (the store does not sign)."""
    if isinstance(key, Signer):
        return key
    if key is None:
        key = environ.get(KEY_VARIABLE) or None
    return Signer(key) if key is not None else None


def signer_matching(
    fingerprint: str | None, where: str, environ: Mapping[str, str] = os.environ
) -> Signer | None:
    """The signer this process opens the store at ``where`` with, when its signing key has
    ``fingerprint``: None when the store does not sign (whatever ``$SOMATIZE_STORE_KEY``
    says here); the signer of ``$SOMATIZE_STORE_KEY`` when its fingerprint is the same.
    :class:`KeyMismatch` when this process holds no such key, so it cannot write what the
    store's readers accept."""
    if fingerprint is None:
        return None
    mine = signer_from(None, environ)
    if mine is None:
        raise KeyMismatch(
            f"the store at {where} signs its records, and {KEY_VARIABLE} is not set in this "
            "process: what it wrote would be refused by the store's readers. Set "
            f"{KEY_VARIABLE} here to the store's signing key"
        )
    if not hmac.compare_digest(mine.fingerprint, fingerprint):
        raise KeyMismatch(
            f"the store at {where} signs its records with another key than {KEY_VARIABLE} "
            f"holds in this process (fingerprint {mine.fingerprint[:12]}…, the store's "
            f"{fingerprint[:12]}…): what it wrote would be refused by the store's readers. "
            f"Set {KEY_VARIABLE} here to the store's signing key"
        )
    return mine


def _sealed(body: bytes, signer: Signer | None, about: bytes = b"") -> bytes:
    """``body`` and, when ``signer`` is set, its signature; ``about`` is signed with it but
    not written (what the file is, which its place says: a name)."""
    if signer is None:
        return body
    return body + _MAC + signer.mac(about + body).hex().encode()


def _opened(what: str, data: bytes, signer: Signer | None, about: bytes = b"") -> bytes:
    """The body of a line-and-signature file, its signature checked when ``signer`` is set
    (over ``about`` and the body, as :func:`_sealed` made it)."""
    body, mark, mac = data.partition(_MAC)
    if signer is None:
        return body
    if not mark or mac.startswith(_UNKEYED):
        raise Unsigned(
            f"{what} carries no signature, and this store signs: it was written without the "
            "key, so it is not trusted and is treated as absent (write it again with the "
            f"store's key, given as `signing_key=` or in {KEY_VARIABLE})"
        )
    try:
        good = signer.check(about + body, bytes.fromhex(mac.decode("ascii")))
    except ValueError:
        good = False
    if not good:
        raise Unsigned(
            f"{what} has a signature that does not match this store's key: it was written "
            "with another key or altered since, so it is not trusted and is treated as absent"
        )
    return body


def encode_record(answer: Answer, signer: Signer | None) -> bytes:
    """The bytes of ``answer``'s record, signed when ``signer`` is set."""
    return _sealed(answer.to_json(), signer)


def decode_record(key: str, data: bytes, signer: Signer | None) -> Answer:
    """The record of ``key`` in ``data``; Corrupt (or Unsigned) unless it is whole, about
    ``key`` and, in a signing store, signed."""
    answer = Answer.from_json(key, _opened(f"the answer record of {key}", data, signer))
    try:
        _fingerprint(answer.fingerprint)
    except ValueError as why:
        raise Corrupt(f"the answer record of {key} cannot be read ({why})") from None
    return answer


def _fingerprint(value: object) -> str | None:
    """``value`` if it is a code fingerprint as a writer records one (text, or None when
    none was given); ValueError otherwise (a list, an object, a number), which a reader
    would take for one and fail on."""
    if value is not None and not isinstance(value, str):
        raise ValueError(f"its code fingerprint is a {type(value).__name__}, not text")
    return value


def _bound_to(name: str) -> bytes:
    """What a name's signature covers besides the digest: the name itself, so that the file
    of one name copied over another's is refused, not trusted. (A file in ``names/`` whose
    name is not UTF-8 is no name, but upkeep reads it all the same: it is not an error.)"""
    return b"somatize/name\0" + name.encode("utf-8", "surrogatepass") + b"\0"


def _name_check(name: str, body: bytes) -> bytes:
    """The check a name bound without a key carries: what ties its file to the name."""
    return _UNKEYED + blake3.blake3(_bound_to(name) + body).hexdigest().encode()


def encode_name(name: str, digest: str, signer: Signer | None) -> bytes:
    """The bytes of ``name`` pointing at ``digest``: signed with the name when signed,
    checked with it otherwise."""
    body = check_digest(digest).encode()
    if signer is None:
        return body + _MAC + _name_check(name, body)
    return _sealed(body, signer, _bound_to(name))


def bound_for(name: str, data: bytes, signer: Signer | None) -> bool:
    """Whether the bytes of a name's file say they were bound for ``name``: signed with it
    under ``signer``, or, without one, checked with it."""
    body, _, seal = data.partition(_MAC)
    seal = seal.strip()
    if signer is None:
        return seal == _name_check(name, body)
    try:
        return signer.check(_bound_to(name) + body, bytes.fromhex(seal.decode("ascii")))
    except ValueError:
        return False


def holds_another_name(name: str, data: bytes) -> bool:
    """Whether the bytes of a name's file, bound without a key, carry the check of another
    name than ``name``. A signed file, or one bound before names were checked, says nothing
    of the sort: False."""
    check = data.partition(_MAC)[2].strip()
    return check.startswith(_UNKEYED) and not bound_for(name, data, None)


def decode_name(name: str, data: bytes, signer: Signer | None) -> str:
    """The digest a name's bytes point at; Corrupt (or Unsigned) otherwise — a file written
    for another name included (signed, or checked when bound without a key), and one signed
    before names were signed with the name (:class:`NameSignedAlone`)."""
    if signer is None and holds_another_name(name, data):
        raise Corrupt(
            f"the name `{name}` holds another name's binding, so it is not followed: its file "
            "was copied over this one, or it was bound for a name differing only in case on a "
            "filesystem that does not tell case apart (macOS, Windows), where both are one "
            f"file. Remove names/{name} if it was copied there, and bind `{name}` again; "
            "names differing only in case cannot both be bound there: name it otherwise"
        )
    try:
        body = _opened(f"the name `{name}`", data, signer, _bound_to(name))
    except Unsigned:
        try:
            _opened(f"the name `{name}`", data, signer)
        except Unsigned:
            raise
        except Corrupt:
            pass
        else:
            raise NameSignedAlone(
                f"the name `{name}` was signed with this store's key over its digest alone, as "
                "an earlier somatize signed names: its signature does not cover the name, so "
                "another name's file copied over it would pass. It is not trusted until it is "
                f"bound again with the key (`store.bind({name!r}, digest)`)"
            ) from None
        raise
    return _digest_in(name, body)


def pointed_at(name: str, data: bytes) -> str:
    """The digest a name's bytes point at, whatever signature or check they carry: what
    upkeep keeps the blob of for a name it does not trust. Corrupt if they hold none."""
    return _digest_in(name, data.partition(_MAC)[0])


def _digest_in(name: str, body: bytes) -> str:
    """The digest the body of ``name``'s file holds; Corrupt if it holds none."""
    text = body.decode("ascii", "replace").strip()
    try:
        return check_digest(text)
    except ValueError:
        raise Corrupt(
            f"the name `{name}` does not hold a digest ({text[:80]!r}); bind it again"
        ) from None


@dataclass(frozen=True)
class PackIndex:
    """One pack: its blob and where each item's bytes lie in it."""

    id: str
    """``blake3:<hex>`` of the index's own bytes; the index lives at ``packs/<hex>``."""
    blob: str
    size: int
    """How many bytes the pack's blob holds."""
    codec: str
    fingerprint: str | None
    created: float
    entries: dict[str, tuple[int, int]]
    """Item key → (offset, length) in the blob."""

    def answer(self, key: str) -> Answer:
        """The record of item ``key`` of this pack, made anew at each call and kept by
        nobody: a store holds a table of every pack's items, and a record kept for each
        item recalled would more than double what that table holds (about 370 bytes an
        item: 370 MB for a million rows of eight floats). It is filled in whole, not
        field by field as a frozen dataclass's ``__init__`` does: a pack just kept hands
        back the records of thousands of items, and a recall of many rows asks for many
        records every step."""
        offset, length = self.entries[key]
        found = object.__new__(Answer)
        object.__setattr__(
            found,
            "__dict__",
            {
                "key": key,
                "value": self.blob,
                "codec": self.codec,
                "size": length,
                "fingerprint": self.fingerprint,
                "created": self.created,
                "offset": offset,
            },
        )
        return found


def encode_pack(
    blob: str,
    size: int,
    codec: str,
    fingerprint: str | None,
    created: float,
    keys: Sequence[str],
    offsets: Sequence[int],
    lengths: Sequence[int],
    signer: Signer | None,
    entries: bytes | None = None,
) -> tuple[str, bytes]:
    """The id and bytes of the index of a pack whose items are ``keys``, each ``lengths``
    bytes long from ``offsets`` in its blob. Made from the columns in a few calls over all
    of them, not a few per item: a pack holds thousands. ``entries`` is what
    :func:`pack_entries` made of those columns, where a maker had it made already."""
    header = {
        "somatize": RECORD_VERSION,
        "pack": PACK_VERSION,
        "blob": check_digest(blob),
        "bytes": size,
        "codec": codec,
        "fingerprint": fingerprint,
        "created": created,
        "count": len(keys),
        "signed": signer is not None,
    }
    if entries is None:
        check_digests(keys)
        entries = pack_entries(keys, offsets, lengths)
    elif len(entries) != _ENTRY.size * len(keys):
        raise ValueError(f"index entries of {len(entries)} bytes for {len(keys)} keys")
    body = bytearray(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    body += b"\n"
    body += entries
    if signer is not None:
        body += signer.mac(body)
    data = bytes(body)
    return "blake3:" + blake3.blake3(data).hexdigest(), data


def pack_entries(keys: Sequence[str], offsets: Sequence[int], lengths: Sequence[int]) -> bytes:
    """The entries of a pack index for the items under ``keys`` (each a digest, checked by
    :func:`check_digests`), each ``lengths`` bytes from ``offsets`` in the pack's blob: one
    a key, in the order given."""
    raw = bytes.fromhex("".join(keys).replace("blake3:", ""))  # well formed: 32 bytes each
    raws = map(raw.__getitem__, map(slice, range(0, len(raw), 32), range(32, len(raw) + 32, 32)))
    return b"".join(itertools.starmap(_ENTRY.pack, zip(raws, offsets, lengths, strict=True)))


PACK_HEAD = 4096
"""How many bytes of a pack index :func:`pack_created` is handed: more than its first line
(its header) holds."""


def pack_created(head: bytes) -> float | None:
    """The ``created`` of the pack index whose first bytes are ``head``, read from its
    header alone, nothing checked (its digest needs the whole): None where the header
    cannot be read there. It orders a record against the pack, no more: a pack whose
    header lies is damaged, and answers nothing when its whole index is read."""
    line, newline, _ = head.partition(b"\n")
    if not newline:
        return None
    try:
        return moment(json.loads(line)["created"])
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
        return None


def decode_pack(pack_id: str, data: bytes, signer: Signer | None) -> PackIndex:
    """The index ``pack_id`` in ``data``; Corrupt (or Unsigned) unless it hashes to its id,
    is whole and, in a signing store, signed."""
    if "blake3:" + blake3.blake3(data).hexdigest() != pack_id:
        raise Corrupt(f"pack index {pack_id} does not hash to its name: it is damaged")
    line, _, rest = data.partition(b"\n")
    try:
        header = json.loads(line)
        check_version(header["somatize"], RECORD_VERSION, f"pack index {pack_id}")
        check_version(header["pack"], PACK_VERSION, f"pack index {pack_id}")
        count = int(header["count"])
        signed = bool(header["signed"])
        blob = check_digest(str(header["blob"]))
        size = int(header["bytes"])
        codec = str(header["codec"])
        fingerprint = _fingerprint(header["fingerprint"])
        created = moment(header["created"])
    except (ValueError, KeyError, TypeError, OverflowError) as why:
        raise Corrupt(f"pack index {pack_id} has a header that cannot be read ({why})") from None
    except RecursionError:  # nested deeper than the parser follows
        raise Corrupt(f"pack index {pack_id} has a header that cannot be read (nested)") from None
    table = count * _ENTRY.size
    if len(rest) != table + (_MAC_BYTES if signed else 0):
        raise Corrupt(
            f"pack index {pack_id} is {len(data)} bytes, which does not fit {count} items"
        )
    if signer is not None:
        if not signed:
            raise Unsigned(
                f"pack index {pack_id} carries no signature, and this store signs: it was "
                "written without the key, so its items are treated as absent"
            )
        if not signer.check(memoryview(data)[: len(data) - _MAC_BYTES], rest[table:]):
            raise Unsigned(
                f"pack index {pack_id} has a signature that does not match this store's key; "
                "its items are treated as absent"
            )
    entries = {
        "blake3:" + raw.hex(): (offset, length)
        for raw, offset, length in _ENTRY.iter_unpack(rest[:table])
    }
    for offset, length in entries.values():
        if offset + length > size:
            raise Corrupt(f"pack index {pack_id} points past the end of its blob")
    return PackIndex(pack_id, blob, size, codec, fingerprint, created, entries)


class _Packing(Protocol):
    """What :func:`keep_packed` needs of a home."""

    signer: Signer | None

    def _keeping(self) -> AbstractContextManager[list[str]]: ...

    def _put(self, data: Buffer | Sequence[Buffer], claims: list[str]) -> str: ...

    def keep(
        self, key: str, data: Buffer | Sequence[Buffer], codec: str, fingerprint: str | None = None
    ) -> Answer: ...

    def _publish_index(self, pack: PackIndex, data: bytes) -> None: ...

    def _published(self, claims: list[str]) -> None: ...

    def _created_after(self, keys: Sequence[str], now: float) -> float: ...


def keep_packed(
    home: _Packing,
    items: Sequence[tuple[str, Sequence[Buffer]]],
    codec: str,
    fingerprint: str | None,
) -> list[Answer]:
    """Keeps ``items`` (key, its bytes as the flat pieces ``pieces_of`` makes of them, in
    a list: they are measured before they are written) in ``home`` as packs: small items
    together, one blob and one index per up to :data:`PACK_BYTES`; large or lone items as
    plain answers. The blob is published before the index that refers to it."""
    keys = [key for key, _ in items]
    check_digests(keys)  # every key, before any item is written
    sizes = [sum(map(len, pieces)) for _, pieces in items]  # flat: a piece's len is its bytes
    chunks: list[list[int]] = [[]]
    """The place in ``items`` of each item of each pack."""
    filled = 0
    out: dict[str, Answer] = {}
    for at, size in enumerate(sizes):
        if size >= PACK_ITEM_BELOW:
            key, pieces = items[at]
            out[key] = home.keep(key, pieces, codec, fingerprint)
            continue
        if filled + size > PACK_BYTES and chunks[-1]:
            chunks.append([])
            filled = 0
        chunks[-1].append(at)
        filled += size
    for chunk in chunks:
        if len(chunk) == 1:
            key, pieces = items[chunk[0]]
            out[key] = home.keep(key, pieces, codec, fingerprint)
        elif chunk:
            joined = [piece for at in chunk for piece in items[at][1]]
            packed, lengths = [keys[at] for at in chunk], [sizes[at] for at in chunk]
            pack = _pack(home, packed, joined, lengths, codec, fingerprint)
            out.update((key, pack.answer(key)) for key in pack.entries)
    return [out[key] for key in keys]


def keep_packed_joined(
    home: _Packing,
    keys: Sequence[str],
    pieces: Sequence[Buffer],
    lengths: Sequence[int],
    codec: str,
    fingerprint: str | None,
) -> None:
    """:func:`keep_packed` of items given end to end: the item under ``keys[i]`` is the
    next ``lengths[i]`` bytes of ``pieces`` (flat, as ``pieces_of`` makes them; their
    bytes add up to the lengths'). Packs are cut where their bytes reach
    :data:`PACK_BYTES`, each written from views of ``pieces`` — no item is copied, no
    record made, and nothing done in Python once per item. Where any item is large
    enough to be kept on its own, the items are kept as :func:`keep_packed` keeps them."""
    if max(lengths, default=0) >= PACK_ITEM_BELOW:  # which checks the keys itself
        keep_packed(
            home, list(zip(keys, split_joined(pieces, lengths), strict=True)), codec, fingerprint
        )
        return
    check_digests(keys)  # every key, before any item is written
    offsets = list(itertools.accumulate(lengths, initial=0))
    starts = list(itertools.accumulate(map(len, pieces), initial=0))
    first = 0
    while first < len(keys):
        # As many items from `first` as fit in a pack; at least one.
        last = max(first + 1, bisect.bisect_right(offsets, offsets[first] + PACK_BYTES) - 1)
        span = span_of(pieces, starts, offsets[first], offsets[last])
        if last - first == 1:
            home.keep(keys[first], span, codec, fingerprint)
        else:
            _pack(home, keys[first:last], span, lengths[first:last], codec, fingerprint)
        first = last


def _pack(
    home: _Packing,
    keys: Sequence[str],
    pieces: Sequence[Buffer],
    lengths: Sequence[int],
    codec: str,
    fingerprint: str | None,
) -> PackIndex:
    """Keeps the items under ``keys``, whose bytes ``pieces`` hold end to end (``lengths``
    each), as one pack: its blob, then the index that refers to it."""
    with home._keeping() as claims:  # the blob is this keep's until its index is out
        blob = home._put(pieces, claims)
        pack = index_pack(home, blob, keys, lengths, codec, fingerprint)
        home._published(claims)
        return pack


def index_pack(
    home: _Packing,
    blob: str,
    keys: Sequence[str],
    lengths: Sequence[int],
    codec: str,
    fingerprint: str | None,
    entries: bytes | None = None,
    created: float | None = None,
) -> PackIndex:
    """Publishes the index of a pack whose blob ``blob`` holds the items under ``keys`` end
    to end (``lengths`` bytes each; ``entries``, where given, made of them by
    :func:`pack_entries`); called while the blob is claimed, before a gc of this object
    may take it. It is stamped ``created``, or now where None (just after any answer this
    object knows for ``keys``, where that one is stamped later)."""
    offsets = list(itertools.accumulate(lengths, initial=0))
    size = offsets.pop()
    if created is None:
        created = home._created_after(keys, time.time())
    pack_id, index = encode_pack(
        blob, size, codec, fingerprint, created, keys, offsets, lengths, home.signer, entries
    )
    table = dict(zip(keys, zip(offsets, lengths, strict=True), strict=True))
    pack = PackIndex(pack_id, blob, size, codec, fingerprint, created, table)
    home._publish_index(pack, index)
    return pack


def span_of(pieces: Sequence[Buffer], starts: Sequence[int], begin: int, end: int) -> list[Buffer]:
    """Views of the bytes ``begin`` to ``end`` of ``pieces`` joined, where piece ``i``
    begins at ``starts[i]``."""
    out: list[Buffer] = []
    at = bisect.bisect_right(starts, begin) - 1
    while begin < end:
        start = starts[at]
        piece = memoryview(pieces[at])
        out.append(piece[begin - start : min(end, start + len(piece)) - start])
        begin = start + len(piece)
        at += 1
    return out


def split_joined(pieces: Sequence[Buffer], lengths: Sequence[int]) -> Iterator[list[Buffer]]:
    """The pieces of each item of ``lengths`` bytes that ``pieces`` hold end to end."""
    starts = list(itertools.accumulate(map(len, pieces), initial=0))
    offsets = itertools.accumulate(lengths, initial=0)
    begin = next(offsets)
    for end in offsets:
        yield span_of(pieces, starts, begin, end)
        begin = end
