"""The store's interface, and what every home of it promises.

Layout, whatever the home::

    blobs/ab/<hex>      immutable content, named by the BLAKE3 of its bytes
    names/<name>        name → digest ("sms/train"); names are validated
    answers/ab/<hex>    key → {value digest, codec, fingerprint, bytes, created}
    tmp/                in-flight writes; a crash leaves nothing half-visible

Contracts:

- if ``have`` says yes for a key, ``recall`` of it returns the answer's bytes —
  unless they were damaged since, which ``recall`` reports as :class:`Corrupt`
  and never hands over;
- nothing is visible half-written: blobs and records are published whole;
- equal writes are idempotent: content addressing makes a race between two
  writers of the same thing a non-event;
- names never escape the store (no absolute paths, no ``..``, no control
  characters).

**Addresses.** A store's *address* (:meth:`Store.address`) is what another
process — a worker of a broker — opens the same store from
(:meth:`Store.from_address`): a small dict of canonical values, such as
``{"home": "local", "root": "/shared/features", "durable": False, "signed": None}``
or a bucket's URL and the storage options it was opened with. It is never more
than that: a read-through cache in front of a bucket is a directory of this
process and stays out, and a signing key never appears — only its fingerprint
(``"signed"``), so the process opening the store signs with the key in its own
``$SOMATIZE_STORE_KEY`` and refuses to open it without that key
(:class:`~somatize.store.records.KeyMismatch`), since readers would refuse what it
wrote. A store with no such description has no address (None): one opened with
options that are live objects, or a ``memory://`` bucket, which lives in this
process alone. An address whose storage options hold a cache, a signing key, or the
retrying that lies beside them is refused (:class:`BadAddress`).
"""

from __future__ import annotations

import abc
import io
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from somatize.errors import SomatizeError
from somatize.store._credentials import masked

if TYPE_CHECKING:
    from somatize.store._compact import Compacted
    from somatize.store.upkeep import Collected, Progress, Verified

__all__ = [
    "Answer",
    "BadAddress",
    "BadName",
    "Corrupt",
    "JoinedWrite",
    "Missing",
    "NameNotFound",
    "NewerFormat",
    "Store",
    "StoreError",
    "StoreFull",
    "check_name",
]

Buffer = bytes | bytearray | memoryview

RECORD_VERSION = 1

READ_ONLY_LOCAL = "read-only local"
"""The ``home`` in the address of a local store opened ``read_only=True``, for the reason
:data:`READ_ONLY_BUCKET` says."""
READ_ONLY_BUCKET = "read-only bucket"
"""The ``home`` in the address of a bucket store opened ``read_only=True``. Not ``bucket``
with a flag beside it: a somatize from before ``read_only`` reads the address as its
own and would open the store to write; this home it refuses instead."""

NAME_SEGMENT_BYTES = 255
"""The longest segment of a name: what a file name may hold on common filesystems."""
NAME_BYTES = 1024
"""The longest name: what an object key may hold (a bucket store refuses a name its prefix
makes a key longer than that)."""

LATEST = 253402300799.0
"""The last second of the year 9999: no time a record was written is later, and every
platform's clock can show the times before it."""

_DIGEST = re.compile(r"blake3:[0-9a-f]{64}\Z")
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+@-]*\Z")
_DEVICES = frozenset(
    ["con", "prn", "aux", "nul"] + [f"{port}{n}" for port in ("com", "lpt") for n in range(1, 10)]
)
"""The file names Windows keeps for devices, whatever their case and extension (``NUL.txt``
is the device ``NUL``): no file can be made under them there."""


class StoreError(SomatizeError, OSError):
    """A store could not do what it was asked. What it says shows the password of each URL
    it names as ``***``: a store's own URL may hold one (``ftp://user:password@host/…``),
    as an endpoint's may, and an error is shown, logged and shared."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(masked(arg) if isinstance(arg, str) else arg for arg in args))


class NameNotFound(StoreError, KeyError):
    """A name nobody bound."""

    def __str__(self) -> str:
        return str(self.args[0])


class BadName(StoreError, ValueError):
    """A name or digest that is not allowed: it could escape the store or collide."""


class BadAddress(StoreError, ValueError):
    """An address that does not describe a store (see :meth:`Store.address`), or what a
    store is opened with that could not be in one (a negative count of retries)."""


class Missing(StoreError, KeyError):
    """An answer or blob the store does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


class Corrupt(StoreError):
    """Bytes in the store that are not what their name says: never handed over."""


class NewerFormat(Corrupt):
    """A record or pack index a newer somatize wrote, in a format this one does not read. It
    is no damage: a reader takes it for a miss, as it does damage, but upkeep neither moves
    it aside nor takes the blob it refers to for unused (``gc`` refuses to run, ``verify``
    lists it in :attr:`~somatize.store.upkeep.Verified.newer`): the newer somatize sharing
    the store reads it."""


def check_version(version: Any, known: int, what: str) -> None:
    """Nothing when ``version`` (what a file's ``somatize`` or ``pack`` field holds) is
    ``known``, the version this somatize writes; :class:`NewerFormat` when it is a later
    one; ValueError otherwise (not a version any somatize wrote: damage)."""
    if type(version) is int and version == known:
        return
    if type(version) is int and version > known:
        raise NewerFormat(
            f"{what} was written by a newer somatize, in format version {version} (this one "
            f"reads version {known}): it is no damage, and is a miss here. Read it, verify it "
            "and collect the store with that somatize"
        )
    raise ValueError(f"version {version!r}")


class StoreFull(StoreError):
    """A write found no space (disk or quota full); nothing half-written was left behind."""


@dataclass(frozen=True)
class Answer:
    """What a store says about one kept answer."""

    key: str
    value: str
    """The digest of the blob that holds the answer's bytes."""
    codec: str
    size: int
    """How many bytes the answer's blob holds (``bytes`` in the record)."""
    fingerprint: str | None = None
    created: float = 0.0
    offset: int | None = None
    """Where the answer's bytes begin in blob ``value`` when it is one item of a pack
    (its bytes are ``size`` bytes from there); None when the answer is the whole blob."""

    def to_json(self) -> bytes:
        record: dict[str, Any] = {
            "somatize": RECORD_VERSION,
            "key": self.key,
            "value": self.value,
            "codec": self.codec,
            "bytes": self.size,
            "fingerprint": self.fingerprint,
            "created": self.created,
        }
        if self.offset is not None:
            record["offset"] = self.offset
        return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def from_json(key: str, data: bytes) -> Answer:
        """The record in ``data``; :class:`Corrupt` unless it is whole and about ``key``."""
        try:
            record = json.loads(data)
            check_version(record.pop("somatize"), RECORD_VERSION, f"the answer record of {key}")
            answer = Answer(
                key=str(record["key"]),
                value=str(record["value"]),
                codec=str(record["codec"]),
                size=int(record["bytes"]),
                fingerprint=record.get("fingerprint"),
                created=moment(record.get("created", 0.0)),
                offset=None if record.get("offset") is None else int(record["offset"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as why:
            raise Corrupt(f"the answer record of {key} cannot be read ({why})") from None
        except RecursionError:  # nested deeper than the parser follows: no record is
            raise Corrupt(f"the answer record of {key} cannot be read (nested too deep)") from None
        if (
            answer.key != key
            or not _DIGEST.match(answer.value)
            or answer.size < 0
            or (answer.offset is not None and answer.offset < 0)
        ):
            raise Corrupt(f"the answer record of {key} is not about {key} or names no blob")
        return answer


def moment(value: Any) -> float:
    """``value`` as the time something was written (seconds since the epoch); ValueError
    for one no writer's clock could have given (negative, NaN, infinite, or beyond the
    year 9999), which a platform's clock could not show either."""
    seconds = float(value)
    if not 0.0 <= seconds <= LATEST:  # False for NaN too
        raise ValueError(f"created {seconds!r} is no time a record was written")
    return seconds


def check_digest(digest: str) -> str:
    """``digest`` if it is a well-formed ``blake3:<64 hex>``; BadName otherwise."""
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise BadName(f"{digest!r} is not a digest: expected `blake3:` and 64 lowercase hex digits")
    return digest


_HEX_DIGITS = b"0123456789abcdef"


def check_digests(digests: Sequence[str]) -> None:
    """Refuses the first of ``digests`` that is not a well-formed digest, as
    :func:`check_digest` does. All are looked at in a few passes over them joined, a line
    each, rather than one match each: a pack is keyed by thousands of them."""
    count = len(digests)
    try:
        lines = ("\n".join(digests) + "\n").encode("ascii")
    except (TypeError, UnicodeEncodeError):  # one is not text, or not ASCII
        lines = b""
    # Each line is `blake3:`, 64 lowercase hex digits and its break, at its place: once the
    # hex digits are taken out, only `lk:` and the break are left of each.
    well_formed = (
        len(lines) == 72 * count
        and all(lines[at::72] == bytes((char,)) * count for at, char in enumerate(b"blake3:"))
        and lines[71::72] == b"\n" * count
        and lines.translate(None, _HEX_DIGITS) == b"lk:\n" * count
    )
    if not well_formed:
        for digest in digests:
            check_digest(digest)


def check_labels(codec: object, fingerprint: object) -> None:
    """Refuses, before anything is written, a codec or code fingerprint that is not text:
    a record holding one is what every reader takes for damage (and a codec of None
    would read back as the text 'None')."""
    if not isinstance(codec, str):
        raise TypeError(
            f"an answer's codec is named by a str (the name of the codec its bytes are "
            f"decoded with, 'plain' say), got {codec!r} that is a {type(codec).__name__}"
        )
    if fingerprint is not None and not isinstance(fingerprint, str):
        raise TypeError(
            "an answer's code fingerprint is a str, or None for none, got "
            f"{fingerprint!r} that is a {type(fingerprint).__name__}"
        )


def _utf8(text: str) -> bytes:
    """``text`` in UTF-8, to be measured; a lone surrogate (a byte of a file name that was
    not UTF-8, as ``os.fsdecode`` gives it) is counted, not an error: such a name is refused
    for its characters."""
    return text.encode("utf-8", "surrogatepass")


def check_name(name: str) -> str:
    """``name`` if it is a safe name: ``/``-separated segments of letters, digits and
    ``._=+@-``, none empty, none starting with a dot. BadName otherwise."""
    if not isinstance(name, str) or not name:
        raise BadName(f"a name is a non-empty str, got {name!r}")
    if name.startswith("/"):
        raise BadName(f"name {name!r} is absolute; names are relative, like `sms/train`")
    longest = max(name.split("/"), key=lambda part: len(_utf8(part)))
    if len(_utf8(longest)) > NAME_SEGMENT_BYTES or len(_utf8(name)) > NAME_BYTES:
        raise BadName(
            f"name {name[:60]!r}… is too long: a name is a file in every home, so each "
            f"segment holds at most {NAME_SEGMENT_BYTES} bytes (its longest holds "
            f"{len(_utf8(longest))}) and the whole name {NAME_BYTES} (it holds "
            f"{len(_utf8(name))}); use a shorter name, or a digest of the long one"
        )
    for segment in name.split("/"):
        if segment in ("", ".", ".."):
            raise BadName(
                f"name {name!r} has an empty, `.` or `..` segment, which could reach outside "
                "the store; use plain segments like `sms/train`"
            )
        if not _SEGMENT.match(segment):
            raise BadName(
                f"name {name!r} has segment {segment!r}: segments are ASCII letters, digits and "
                "`._=+@-`, starting with a letter or digit (no spaces or control characters)"
            )
    return name


def check_bindable(name: str) -> str:
    """``name`` if it is a name (:func:`check_name`) that can be a file's path on every
    home a store is copied to; BadName for one with a segment Windows keeps for a device
    (``con``, ``nul.txt``, ``LPT1``), where no name could be bound or read back."""
    check_name(name)
    for segment in name.split("/"):
        if segment.split(".", 1)[0].lower() in _DEVICES:
            raise BadName(
                f"name {name!r} has segment {segment!r}, which Windows keeps for a device "
                "(CON, PRN, AUX, NUL, COM1-COM9 and LPT1-LPT9, in any case and with any "
                "extension): a name is a file, and no file is made under it there. Name it "
                f"otherwise (`{segment.split('.', 1)[0]}-data`, say)"
            )
    return name


def keys_of(keys: Iterable[str], method: str = "have") -> Sequence[str]:
    """``keys`` as a sequence (itself when it is a list or a tuple); TypeError for a single
    key passed bare (a str is iterable, and its characters are no keys) and for no iterable,
    naming ``method``, the store's method they were handed to."""
    if type(keys) is list or type(keys) is tuple:
        return keys
    if isinstance(keys, str):
        raise TypeError(
            f"{method}() takes an iterable of keys, got the single key {keys[:20]!r}…; wrap "
            f"it in a list: {method}([key])"
        )
    if not isinstance(keys, Iterable):
        raise TypeError(
            f"{method}() takes an iterable of keys (a list: {method}([key])), got a "
            f"`{type(keys).__name__}`"
        )
    return list(keys)


def recalled(store: Store, key: str) -> tuple[Answer, memoryview]:
    """``store.recall(key)``; a TypeError naming the fix when it raised a KeyError that is
    no :class:`Missing` (a store of a user's own looking ``key`` up in a dict). It is not
    taken for a miss: a KeyError may as well come from a bug inside the store, which would
    then be passed over, every answer computed again."""
    try:
        return store.recall(key)
    except StoreError:
        raise
    except KeyError as why:
        kind = type(store).__qualname__
        raise TypeError(
            f"`{kind}.recall` raised a KeyError ({why}) for {key}, where a store's recall "
            "raises `somatize.store.Missing` for a key it lacks; a plain KeyError is not "
            f"taken for a miss, since it may come from a bug in the store. Make `{kind}.recall` "
            'raise `Missing(...)` for a key it does not have (docs/store.md, "A store of '
            'your own")'
        ) from why


def unbacked(name: str, digest: str, where: str) -> Missing:
    """The refusal to bind ``name`` to ``digest``, which ``where`` keeps no blob of."""
    return Missing(
        f"cannot bind `{name}` to {digest}: no blob {digest} is kept in {where}, and a name "
        "points at bytes kept in its store. Put them first: "
        f"`store.bind({name!r}, store.put(data))`. Bytes put earlier that nothing refers to "
        "yet are spared by a gc (in any process, this one's too) only for its grace, 60 s "
        "by default: one may have removed them since; put them again and bind at once"
    )


def unbound(name: str, digest: str, where: str) -> Missing:
    """The error for a bind of ``name`` whose blob ``digest`` was removed meanwhile."""
    return Missing(
        f"`{name}` was bound to {digest} in {where}, but the blob was removed meanwhile (a gc "
        "in another process): the name points at nothing until its bytes are put again "
        "(`store.put(data)` restores the blob, and the name with it)"
    )


def section_above(
    parts: Sequence[str],
    sections: Sequence[str],
    holds_store: Callable[[str], bool],
    join: Callable[[Sequence[str]], str],
) -> tuple[str, str] | None:
    """The store (its root, as ``join`` makes it of ``parts``) and the section of it, one
    of ``sections``, that the path of ``parts`` lies inside, nearest first, or None: the
    sections whose upkeep would take another store's files in them for its own (every
    file under ``names/`` is read as a name; a local ``gc`` removes what it did not write
    in ``blobs/`` and ``tmp/``). Only an ancestor so named is looked at (``holds_store``
    of what it lies in): a path that names none costs nothing."""
    for at in range(len(parts) - 1, 0, -1):
        if parts[at] in sections and holds_store(join(parts[:at])):
            return join(parts[:at]), parts[at]
    return None


_REFERRING = ("answers", "packs", "names")
"""The sections whose files refer to blobs: one of them beside ``blobs/`` is a store's."""

MARKER = "somatize-store"
"""The file at a store's root that marks it a store: written, whole, as the store is made,
and never removed by its upkeep, so that a store its gc emptied (a bucket's prefix holding
only ``blobs/`` in their grace) stays one, and a folder that merely holds folders so named
(a user's ``blobs/``) is none. Its presence is the mark; what it holds says what wrote it."""

MARKER_DATA = b'{"somatize": "store", "layout": 1}\n'
"""What :data:`MARKER` holds, as a store writes it."""

PASSED_OVER = frozenset((".DS_Store", ".gitkeep", ".gitignore"))
"""Files a folder meant for a store may hold before it is one, passed over as it is made:
what a file browser leaves in any folder, and what keeps an empty folder, or keeps what
is put in it, out of a git repository."""

MARKER_PART = f".{MARKER}.part"
"""How the name of the file in ``tmp/`` that becomes :data:`MARKER` ends: a directory whose
``tmp/`` holds no more is a store being made by another process, no folder of a user's."""


def store_kind(holds: Callable[[str], bool]) -> str | None:
    """What a folder (a directory, a bucket's prefix) holds, ``holds`` telling whether an
    entry is in it (the file :data:`MARKER`, the folders ``blobs``, ``quarantine/names``):
    ``"marked"``, a store that bears its marker; ``"clear"``, a store an earlier somatize
    made, unmarked (``blobs/``, and ``answers/``, ``packs/`` or ``names/``), marked as it is
    opened; ``"emptied"``, no more than, in ``quarantine/``, a folder of one of its sections
    (what ``verify`` moved aside): all that is left of an earlier store whose every answer a
    gc dropped and every name ``verify`` moved aside where no empty folder is kept (a
    bucket, a directory copied from one), and what a user's folder may hold as well, so it
    is read but never collected nor moved from, and not marked; None, no store
    (``blobs/`` alone is none: a gc would take every file there for unused)."""
    if holds(MARKER):
        return "marked"
    if holds("blobs") and any(holds(section) for section in _REFERRING):
        return "clear"
    if holds("quarantine") and any(
        holds(f"quarantine/{section}") for section in ("blobs", *_REFERRING)
    ):
        return "emptied"
    return None


def holds_store(holds: Callable[[str], bool]) -> bool:
    """Whether a folder holds a store, marked or of an earlier somatize's layout
    (:func:`store_kind`)."""
    return store_kind(holds) is not None


def unmarked(
    where: str, found: str, doing: str, error: type[StoreError] = StoreError
) -> StoreError:
    """The refusal (an ``error``) to ``doing`` at ``where``, which bears no store's marker and
    is not clearly a store: ``found`` says what it holds."""
    return error(
        f"cannot {doing} {where}: {found}, and it bears no store's marker (the file "
        f"`{MARKER}` a store writes at its root as it is made), so it may be a folder of "
        "yours and nothing was changed there. Name a store, or a new or empty folder for a "
        "new one; if this is a store an earlier somatize made and emptied, mark it by "
        f"creating the file `{MARKER}` at its root (an empty file will do)"
    )


def current_directory(where: str) -> str:
    """The current directory, which the relative path ``where`` of a store is taken from;
    BadAddress when it is gone (removed since the program moved into it)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise BadAddress(
            f"the store {where!r} is named by a path from the current directory, which is "
            "gone (removed since the program moved into it): name the store's directory by "
            "an absolute path, or move into one that is there"
        ) from None


def path_text(path: str | os.PathLike[str]) -> str:
    """The text of ``path``; TypeError, saying what to pass, for a path-like object whose
    path is bytes (which every str check of it after would fail on, unclearly)."""
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(
            f"a store's directory is a str path, but the `{type(path).__name__}` given "
            f"gives its path as bytes ({text!r}); pass os.fsdecode(path)"
        )
    return text


def no_directory_to_read(where: str) -> BadAddress:
    """The refusal of a store opened ``read_only=True`` at ``where``, where no directory is:
    a read-only store makes none, and an empty store there would hide a mistyped path."""
    return BadAddress(
        f"cannot open a store at {where} with read_only=True: no directory is there, and a "
        "read-only store makes none. Name the directory the store is in, or open it "
        "without read_only=True to start one there"
    )


_KEPT_IN = {
    "names": "its names: it would read this store's files as names of its own, and its "
    "verify report them as damaged",
    "blobs": "its blobs: its gc removes every other file there",
    "tmp": "writes in progress: its gc removes what lies there",
}


def inside_a_section(where: str, found: tuple[str, str]) -> BadAddress:
    """The refusal of a store at ``where``, inside the section ``found`` names."""
    outer, section = found
    return BadAddress(
        f"cannot open a store at {where}: it lies inside the `{section}/` of the store at "
        f"{outer}, where that store keeps {_KEPT_IN[section]}. Open it beside that store "
        "instead (in another folder or prefix)"
    )


def names_above(name: str) -> list[str]:
    """The names ``name`` lies under (``sms``, ``sms/train`` for ``sms/train/x``)."""
    parts = name.split("/")
    return ["/".join(parts[:depth]) for depth in range(1, len(parts))]


def prune_above(name: str, remove_folder: Callable[[str], None]) -> None:
    """Removes the folder of each name ``name`` lies under (``data`` for ``data/v1``, its
    file moved aside) that holds nothing now, nearest first, by ``remove_folder`` (which
    removes only an empty one, OSError otherwise): a folder left empty refuses a name bound
    at its path, as a folder of names. The first that holds a name (bound since), or is
    gone, stops it; a bind that made one a moment before, and finds it gone as it renames
    its name into it, makes it again."""
    for folder in reversed(names_above(name)):
        try:
            remove_folder(folder)
        except OSError:
            return


def nested(name: str, above: str | None) -> BadName:
    """The refusal of ``name``, which lies under the name ``above`` (or, for None, has
    names under it): a name is one file under ``names/``, in every home alike, so it cannot
    also be a folder of names."""
    if above is not None:
        clash = f"`{above}` is a name, and `{name}` would lie under it"
        # beside that name: `sms/train-x` for `sms/train/x` under `sms/train`
        instead = f"Name it beside `{above}` instead (`{above}-{name[len(above) + 1 :]}`)"
    else:
        clash = f"names are bound under `{name}/`"
        instead = f"Bind it in that folder instead, beside them (`{name}/all`)"
    return BadName(
        f"`{name}` cannot be bound: {clash}. A name is one file under names/ (in every "
        "home, so a store can move between them), so it cannot also hold names under it. "
        f"{instead}, or under a prefix no name uses"
    )


def spelled_otherwise(name: str, listed: Callable[[str], Iterable[str]]) -> str | None:
    """What a folder on the way to ``name``'s file holds under a spelling differing from
    ``name``'s only in case, where it holds none spelled as ``name`` (``Data`` for
    ``data/v2`` with ``Data/v1`` bound), given ``listed`` of a folder under ``names/``
    (``""`` for ``names/`` itself); None when there is none. On a filesystem that does not
    tell case apart (macOS, Windows) that is the file or folder ``name`` would be written
    in, so the rule holds in every home: a store moves between them."""
    at = ""
    for segment in name.split("/"):
        entries = sorted(listed(at))
        if segment not in entries:
            other = next((e for e in entries if e.lower() == segment.lower()), None)
            return None if other is None else f"{at}/{other}" if at else other
        at = f"{at}/{segment}" if at else segment
    return None


def case_clash(name: str, other: str, where: str, folder: bool) -> BadName:
    """The refusal of ``name``, whose file or a folder above it the store holds spelled
    ``other`` (:func:`spelled_otherwise`): a folder of names when ``folder``."""
    if not folder:
        clash = f"`{other}` is bound, which differs from it only in case"
        instead = f"Name it otherwise (or bind `{other}` to change that binding)"
    elif other.count("/") == name.count("/"):
        clash = f"names are bound under `{other}/`, which differs from it only in case"
        instead = "Name it otherwise"
    else:
        clash = f"names are bound under `{other}/`, which differs from its own folder only in case"
        instead = f"Bind it in that folder (`{other}{name[len(other) :]}`) or name it otherwise"
    return BadName(
        f"cannot bind `{name}` in {where}: {clash}. Where the filesystem does not tell case "
        "apart (macOS, Windows), both are one file or folder, so the one would take the "
        f"other's place or be found under the other's spelling. {instead}"
    )


_Method = TypeVar("_Method", bound=Callable[..., Any])


def required(method: _Method) -> _Method:
    """``abc.abstractmethod``, out of a type checker's sight. ``Store(path)`` is how a
    store is opened (``__new__`` picks its home), and a checker refuses any call of a class
    it sees as abstract, whatever its ``__new__`` returns; a home lacking a method marked
    so is still refused when it is made."""
    return abc.abstractmethod(method)


class Store(abc.ABC):  # noqa: B024 (its abstract methods are marked by `required`)
    """A content-addressed store. ``Store(path)`` is a local directory;
    ``Store.on_bucket(url)`` a bucket. See the module docstring for the contracts."""

    shared_by_threads: bool = False
    """Whether one object of the class may be read by one thread while another writes
    through it. Callers that write from a thread of their own (a row cache's writer) ask
    a store that says no only under a lock of theirs, and one that says yes without; so
    does every forward (a graph's, a row cache's) that may run beside such a thread
    (:func:`~somatize.store._serial.store_lock`)."""

    def _held_here(self) -> bool:
        """Whether the calling thread holds a lock of this object that a write through it
        takes: code run on that thread meanwhile (a signal handler, a finalizer) must not
        wait there for a write. A store of this class holds none of its own."""
        return False

    def __new__(cls, *args: Any, **kwargs: Any) -> Store:
        if cls is Store:
            if not args and "path" not in kwargs and "url" not in kwargs:
                raise TypeError(
                    "Store(...) opens the store at a directory or a bucket URL "
                    "(s3://bucket/prefix), and was given neither: pass one, e.g. "
                    "`Store('features/')`"
                )
            where = args[0] if args else kwargs.get("path", kwargs.get("url"))
            if isinstance(where, str) and "://" in where:
                from somatize.store.bucket import BucketStore

                cls = BucketStore
            else:
                from somatize.store.local import LocalStore

                cls = LocalStore
        return super().__new__(cls)

    @staticmethod
    def of(where: Store | str | os.PathLike[str] | None) -> Store | None:
        """The store a ``store=`` argument names: a Store as it is, a bucket URL
        (``s3://bucket/prefix``, through :meth:`on_bucket`) or a directory opened, None as
        None; TypeError for anything else."""
        if where is None or isinstance(where, Store):
            return where
        if isinstance(where, (str, os.PathLike)):
            path = path_text(where)
            if "://" in path:
                return Store.on_bucket(path)
            from somatize.store.local import LocalStore

            return LocalStore(path)
        raise TypeError(
            "store= takes a somatize.Store, a directory, a bucket URL (s3://bucket/prefix) or "
            f"None, got a `{type(where).__name__}`"
        )

    @classmethod
    def on_bucket(
        cls,
        url: str,
        *,
        cache: str | os.PathLike[str] | None = None,
        signing_key: str | bytes | None = None,
        read_only: bool = False,
        **storage_options: Any,
    ) -> Store:
        """A store in a bucket, through fsspec: ``s3://bucket/prefix``, ``gs://…``,
        ``az://…``, ``memory://…``, ``file://…``. ``storage_options`` go to the filesystem
        (for s3: ``key``, ``secret``, ``client_kwargs={"endpoint_url": …}``); ``cache`` is
        a local directory kept in front as a read-through cache of blobs; ``signing_key`` signs
        records (default: ``$SOMATIZE_STORE_KEY``); ``read_only=True`` (credentials that may
        only read) writes and removes nothing, refusing at once, with no request, what would."""
        from somatize.store.bucket import BucketStore

        return BucketStore(
            url, cache=cache, signing_key=signing_key, read_only=read_only, **storage_options
        )

    # -- address ------------------------------------------------------------------------------

    def address(self) -> dict[str, Any] | None:
        """What another process opens this same store from with :meth:`from_address`:
        canonical values only, never a signing key (see the module docstring); None for a
        store that cannot be described so."""
        return None

    @staticmethod
    def from_address(address: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Store:
        """The store ``address`` describes, opened here. A signed one is opened with the key in
        ``environ``'s ``$SOMATIZE_STORE_KEY``, and only when it is the store's key
        (:class:`~somatize.store.records.KeyMismatch` otherwise); an unsigned one does not
        sign, whatever ``environ`` says."""
        from somatize import canonical
        from somatize.store.records import signer_matching

        if not isinstance(address, Mapping) or not canonical.is_canonical(dict(address)):
            raise BadAddress(
                "a store's address is a dict of canonical values, as `store.address()` "
                f"returns, got a `{type(address).__name__}` that is not one"
            )
        signed = address.get("signed")
        if signed is not None and not isinstance(signed, str):
            raise BadAddress(f"`signed` in a store's address is a key fingerprint, got {signed!r}")
        where = address.get("root", address.get("url"))
        signer = signer_matching(signed, str(where), environ)
        home = address.get("home")
        if home in ("local", READ_ONLY_LOCAL):
            from somatize.store.local import LocalStore

            return LocalStore._reopen(address, signer)
        if home in ("bucket", READ_ONLY_BUCKET):
            from somatize.store.bucket import BucketStore

            return BucketStore._reopen(address, signer)
        raise BadAddress(
            f"a store's address names its home, `local`, `bucket`, `{READ_ONLY_LOCAL}` or "
            f"`{READ_ONLY_BUCKET}`, "
            f"got {home!r}; make addresses with `store.address()`"
        )

    # -- blobs --------------------------------------------------------------------------------

    @required
    def put(self, data: Buffer | Sequence[Buffer]) -> str:
        """Keeps ``data`` (bytes, or pieces written one after another); returns its digest."""
        raise NotImplementedError

    @required
    def get(self, digest: str) -> memoryview:
        """The bytes of blob ``digest``, verified; Missing or Corrupt otherwise."""
        raise NotImplementedError

    @required
    def has_blob(self, digest: str) -> bool:
        """Whether blob ``digest`` is here (its bytes are not checked)."""
        raise NotImplementedError

    @required
    def open_blob(self, digest: str) -> io.RawIOBase | io.BufferedIOBase:
        """A seekable, read-only file of blob ``digest``, for readers that want only part
        of it (a Parquet footer and some row groups). Not verified against its digest:
        a reader of parts must check what it reads (Parquet pages carry checksums)."""
        raise NotImplementedError

    def local_blob(self, digest: str) -> memoryview | None:
        """Blob ``digest``, verified and (when large) memory-mapped, privately, rather than
        read into memory, when this store keeps a whole copy of it on a local disk; None
        when it does not, and only :meth:`open_blob` reads it without downloading it
        whole. Missing or Corrupt as :meth:`get`."""
        return None

    # -- names --------------------------------------------------------------------------------

    @required
    def bind(self, name: str, digest: str) -> None:
        """Points ``name`` at blob ``digest`` (replacing what it pointed at); Missing when no
        blob ``digest`` is kept here, or when it was removed (a gc elsewhere) while the name
        was written."""
        raise NotImplementedError

    @required
    def resolve(self, name: str) -> str:
        """The digest ``name`` points at; NameNotFound otherwise."""
        raise NotImplementedError

    # -- answers ------------------------------------------------------------------------------

    @required
    def keep(
        self,
        key: str,
        data: Buffer | Sequence[Buffer],
        codec: str,
        fingerprint: str | None = None,
    ) -> Answer:
        """Keeps ``data`` as the answer under ``key``; returns its record. Published whole."""
        raise NotImplementedError

    @required
    def answer(self, key: str) -> Answer | None:
        """The record kept under ``key``, or None; Corrupt if it cannot be read."""
        raise NotImplementedError

    @required
    def recall(self, key: str) -> tuple[Answer, memoryview]:
        """The answer under ``key`` and its bytes; Missing or Corrupt otherwise."""
        raise NotImplementedError

    @required
    def have(self, keys: Iterable[str]) -> set[str]:
        """Which of ``keys`` have an answer whose bytes are really here — in one call."""
        raise NotImplementedError

    def keep_many(
        self,
        items: Sequence[tuple[str, Buffer | Sequence[Buffer]]],
        codec: str,
        fingerprint: str | None = None,
    ) -> list[Answer]:
        """Keeps many small answers at once (the items of a mapped node), each under its
        key. A home may pack them into one blob with an index; this default keeps
        them one by one."""
        return [self.keep(key, data, codec, fingerprint) for key, data in items]

    def keep_joined(
        self,
        keys: Sequence[str],
        data: Buffer | Sequence[Buffer],
        lengths: Iterable[int],
        codec: str,
        fingerprint: str | None = None,
    ) -> None:
        """Keeps many small answers given end to end, as :meth:`keep_many` keeps them: the
        answer under ``keys[i]`` is the next ``lengths[i]`` bytes of ``data`` (a buffer, or
        pieces written one after another). For a maker of thousands at once (the rows of
        a batch, encoded into one buffer): no record of each is handed back, so a home that
        packs them spends no work of its own on each. ValueError, with nothing kept, unless
        there is a length for each key and the lengths add up to the bytes of ``data``.
        This default splits them into items for :meth:`keep_many`."""
        from somatize.store._packed import joined_items
        from somatize.store.records import split_joined

        listed, pieces, sizes = joined_items(keys, data, lengths)
        items = list(zip(listed, split_joined(pieces, sizes), strict=True))
        self.keep_many(items, codec, fingerprint)

    def open_joined(self, codec: str, fingerprint: str | None = None) -> JoinedWrite:
        """A keep of many small answers given end to end over several calls, for a maker
        that has them a batch at a time (the row writer, gathering a pack's worth):
        :meth:`JoinedWrite.add` takes what :meth:`keep_joined` takes, refused as it refuses
        it, and :meth:`JoinedWrite.close` keeps all that was added as keep_joined keeps
        it. A home may write the answers as they are added (a directory does, so that
        little is left to write at the close); none is found by a lookup before the
        close, unless more than a pack's bytes (64 MiB) were added, each pack being
        published once full, as keep_joined publishes its packs one after another. The
        bytes handed to ``add`` may be read until the close, and must not change until
        then. This default holds them, and hands them all to :meth:`keep_joined` at the
        close."""
        check_labels(codec, fingerprint)
        return JoinedWrite(self, codec, fingerprint)

    def reread(self, key: str) -> None:  # noqa: B027  # a home remembering records overrides it
        """Reads the record of ``key`` afresh: another process (a worker) has just kept an
        answer in place of the one this object read, which it may remember. This default,
        for a home that remembers no record, does nothing."""

    def recall_many(
        self, keys: Sequence[str], *, borrow: bool = False
    ) -> dict[str, tuple[Answer, memoryview] | Exception]:
        """The answers under ``keys``: each one's record and bytes, or the error (Missing,
        Corrupt, or another StoreError: a file this process may not read) that kept it
        from being read. A home that packs items reads each
        pack once. ``borrow`` is for a caller that copies what it keeps and writes into
        nothing it is handed: the bytes may then be memory other reads share (a pack's
        mapping kept between reads, which the next batch's rows do not map again)."""
        out: dict[str, tuple[Answer, memoryview] | Exception] = {}
        for key in keys_of(keys, "recall_many"):
            try:
                out[key] = recalled(self, key)
            except StoreError as why:
                out[key] = why
        return out

    # -- upkeep -------------------------------------------------------------------------------

    @required
    def gc(
        self,
        max_bytes: int | None = None,
        *,
        grace: float = 60.0,
        progress: Progress | None = None,
    ) -> Collected:
        """Drops the least recently used answers until what is left holds at most
        ``max_bytes`` (None: drop no answer), then every blob nothing refers to and every
        abandoned write older than ``grace`` seconds. Names are never collected, nor what
        they point at; while a name cannot be read (or fails its check), no blob that
        nothing else refers to is removed, and the result says which names
        (:attr:`Collected.unread_names`)."""
        raise NotImplementedError

    @required
    def compact(self, *, grace: float = 60.0) -> Compacted:
        """Merges small packs older than ``grace`` seconds into large ones, published whole
        before any small one is removed; removes a small pack once the pack replacing it is
        older than ``grace`` seconds (a later gc removes its blob). Every kept row is
        recalled whenever it stops, and the newest answer to each key is still the one
        served."""
        raise NotImplementedError

    @required
    def verify(self, *, quarantine: bool = False, progress: Progress | None = None) -> Verified:
        """Re-hashes every blob and reads every record, index and name; reports what does
        not match, and with ``quarantine`` moves it aside so it is a miss from now on."""
        raise NotImplementedError

    def close(self) -> None:  # noqa: B027 (optional for a home that holds nothing)
        """Writes down what is held in memory (when answers were last used)."""

    def writable(self) -> bool:
        """Whether this process may write into the store, as far as can be told without
        keeping anything: False for a local store on a read-only disk (or in a directory
        this process may not write to, or one moved or removed since it was opened), for
        a bucket that does not exist, and for one that refused this object a write for want
        of permission; True where it cannot be told (a bucket's permissions show only when
        something is written)."""
        return True

    def _refused_keeping(self) -> StoreError | None:
        """The error keeping an answer here would raise, where that can be told before the
        answer is computed; None where a keep may succeed. A forward asks before it runs a
        node whose answer it keeps, so that the work is not done only to be lost."""
        return None

    # -- helpers shared by homes ---------------------------------------------------------------

    @staticmethod
    def _record(key: str, digest: str, codec: str, size: int, fingerprint: str | None) -> Answer:
        return Answer(
            key=key,
            value=digest,
            codec=codec,
            size=size,
            fingerprint=fingerprint,
            created=time.time(),
        )


class JoinedWrite:
    """Answers given end to end over several calls (:meth:`Store.open_joined`), kept when
    it closes. In a ``with`` block it is closed at the block's end, or aborted where the
    block raised. This one holds what it is given and hands it to the store's
    :meth:`~Store.keep_joined` at the close; a home's own may write as it goes."""

    def __init__(self, store: Store, codec: str, fingerprint: str | None) -> None:
        self.store = store
        self.codec = codec
        self.fingerprint = fingerprint
        self.closed = False
        self._keys: list[str] = []
        self._pieces: list[Buffer] = []
        self._lengths: list[int] = []

    def add(
        self, keys: Sequence[str], data: Buffer | Sequence[Buffer], lengths: Iterable[int]
    ) -> None:
        """Takes the answers under ``keys``, the next ``lengths[i]`` bytes of ``data`` each,
        to be kept at the close; refused, with none of them taken, as :meth:`Store.keep_joined`
        refuses them (a length for each key, adding up to the data's bytes; keys that are
        digests)."""
        from somatize.store._packed import Spills, joined_items

        self._still_open()
        store = self.store
        spills = store if isinstance(store, Spills) else None
        listed, pieces, sizes = joined_items(keys, data, lengths, spills)
        check_digests(listed)
        self._taken(listed, pieces, sizes)

    def _taken(self, keys: list[str], pieces: Sequence[Buffer], lengths: list[int]) -> None:
        """Takes answers checked by :meth:`add`; this one holds them for the close."""
        self._keys += keys
        self._pieces += pieces
        self._lengths += lengths

    def close(self) -> None:
        """Keeps every answer added; raises what the store raised if it could not (a full
        disk: :class:`StoreFull` or an OSError), having kept none of them or only whole packs
        of them. Closing again does nothing."""
        if self.closed:
            return
        self.closed = True
        keys, pieces, lengths = self._keys, self._pieces, self._lengths
        self._keys, self._pieces, self._lengths = [], [], []
        if keys:
            self.store.keep_joined(keys, pieces, lengths, self.codec, self.fingerprint)

    def abort(self) -> None:
        """Lets go of what was added and not yet kept, keeping none of it; what a home wrote
        of it so far is removed. Aborting a closed one does nothing."""
        self.closed = True
        self._keys, self._pieces, self._lengths = [], [], []

    def _still_open(self) -> None:
        if self.closed:
            raise ValueError(
                f"this joined write to {self.store!r} is closed (or aborted): what was added "
                "to it is kept (or let go of); open another with `store.open_joined(...)`"
            )

    def __enter__(self) -> JoinedWrite:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()
