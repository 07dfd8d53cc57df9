"""The ``somatize`` command line: looking after a store.

::

    somatize store ls      [--store PATH_OR_URL]      answers, packs and names, and their bytes
    somatize store du      [--store PATH_OR_URL]      files and bytes per section
    somatize store gc      [--store …] [--max-bytes SIZE] [--grace SECONDS]
    somatize store compact [--store …] [--grace SECONDS]
    somatize store verify  [--store …] [--quarantine]
    somatize store show KEY_OR_NAME [--store …]

``--store`` defaults to ``$SOMATIZE_STORE`` (when set and not empty) or ``./store``, and
an empty one is refused; a URL (``s3://…``) opens a bucket store. A directory (a path,
or a ``file://`` or ``local://`` URL) must hold a store already, and a bucket must
exist: one that does not is refused (status 2), and nothing is created; so is
``memory://``, which no other process can see. ``ls``, ``du``, ``show`` and ``verify``
open the store read-only, writing nothing there; ``gc``, ``compact`` and ``verify
--quarantine`` open it to write. Sizes are printed and read in human units
(``10G``, ``512M``). Long operations show a progress bar when tqdm is installed and the
output is a terminal. Exit status: 0 when all is well, 1 when ``verify`` found damage, 2
on a usage or store error (a closed output, ``>&-``, too), and 141 (quietly) when the
reader of the output went away (``somatize store ls | head``), as for a tool stopped by
SIGPIPE, and 130, with a line saying so, when it was interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from somatize.errors import SomatizeError
from somatize.store import BucketStore, LocalStore, StoreError
from somatize.store._compact import Compacted
from somatize.store.base import Answer, Corrupt, Missing, NewerFormat, check_digest, check_name
from somatize.store.bucket import _anchored, file_path
from somatize.store.local import _holds_store
from somatize.store.records import KEY_VARIABLE, PackIndex, Unsigned, decode_pack
from somatize.store.upkeep import Collected, Progress, contents, listing, survey

__all__ = ["main", "parse_size", "size_of"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

BROKEN_PIPE = 141
"""The exit status when the reader of the output went away (``| head``): what a shell
shows for a tool stopped by SIGPIPE (128 + 13), as ``ls`` or ``cat`` would be."""

INTERRUPTED = 130
"""The exit status when the command was interrupted (Ctrl-C): what a shell shows for a tool
stopped by SIGINT (128 + 2)."""


def size_of(count: float) -> str:
    """``count`` bytes in a human unit: ``1.5 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        rounded = f"{count:.0f}" if unit == "B" else f"{count:.1f}"
        if abs(float(rounded)) < 1024 or unit == "TiB":  # as printed: 1023.97 KiB is 1.0 MiB
            return f"{rounded} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def _printable(text: str) -> str:
    """``text`` safe to print on a terminal: every character that is not printable (a
    control character, an escape sequence's start, a line break) written as its escape
    (``\\x1b``, ``\\n``), and a byte of a file name that was not UTF-8 as ``\\xff``. What a
    store holds (file names, a record's codec) may have been planted by anyone who can
    write it, so it is never printed raw."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable():
            out.append(char)
        elif "\udc80" <= char <= "\udcff":  # a byte os.fsdecode could not decode
            out.append(f"\\x{ord(char) - 0xDC00:02x}")
        else:
            out.append(repr(char)[1:-1])
    return "".join(out)


def parse_size(text: str) -> int:
    """Bytes in ``text``: ``1000``, ``512K``, ``1.5G``, ``10GiB``."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: write a number with an optional unit, like 500M or 10G"
        )
    return int(float(found.group(1)) * _UNITS[found.group(2).upper()])


def _progress(enabled: bool) -> Progress | None:
    """tqdm's bar when it is installed and wanted; otherwise none."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None

    def bar(items: Iterable[Any], what: str, total: int) -> Iterable[Any]:
        return tqdm(items, desc=what, total=total, leave=False, file=sys.stderr)  # type: ignore[no-any-return]

    return bar


def _protocols_of(where: str) -> set[str]:
    """Every name of the filesystem the store at URL ``where`` lies in (``local://`` is
    fsspec's other name for ``file://``): the first of a chain that is no cache in front of
    the next (``file`` in ``simplecache::file://…``, ``zip`` in ``zip://store::file://…``,
    whose store lies in the archive, not in the directory the archive is in); empty when
    fsspec does not know it (opening it says why)."""
    try:
        from fsspec.implementations.cached import CachingFileSystem
        from fsspec.registry import get_filesystem_class
    except ImportError:
        return set()
    for link in where.split("::"):
        try:
            kind = get_filesystem_class(link.split("://", 1)[0])
        except (ImportError, ValueError):
            return set()
        if not issubclass(kind, CachingFileSystem):
            protocol = kind.protocol
            return {protocol} if isinstance(protocol, str) else set(protocol)
    return set()


_LEFT_AS_IT_WAS = {
    "ls": "nothing is listed",
    "du": "nothing is measured",
    "gc": "nothing was changed there: what lies there is not a store's to collect",
    "compact": "nothing was changed there: what lies there is not a store's to compact",
    "verify": "nothing is checked, and nothing was changed there",
    "show": "nothing is shown",
}
"""What each command did not do at a bucket prefix holding no store, as its refusal says."""

_A_STORE_HOLDS = (
    "its marker, the file somatize-store, or, made by an earlier somatize, blobs/, and "
    "answers/, packs/ or names/, or, once its upkeep emptied those, what verify moved aside "
    "in quarantine/"
)
"""What a store's directory or prefix holds (:func:`somatize.store.base.holds_store`), as a
refusal of one holding none says."""


def _say_held_for_names(done: Collected, out: TextIO) -> None:
    """Says what blobs a gc kept for names that cannot be read, and what to do: a link in
    names/ leading out of the store is named, since verify --quarantine leaves its files."""
    held = size_of(done.held_for_names)
    for link, folder in done.names_led_out.items():
        print(
            f"kept {held} of blobs nothing else refers to, since {_printable(link)} leads out "
            f"of the store, to {_printable(folder)}: each file there reads as a name that "
            "cannot be read, which may point at any blob. If that folder holds no names of "
            "this store, remove the link (move the names it holds into names/ first), and gc "
            "removes them",
            file=out,
        )
    led = tuple(f"{link}/" for link in done.names_led_out)
    here = [n for n in done.unread_names if not f"names/{n}".startswith(led)]
    if here:
        listed = ", ".join(_printable(f"names/{n}") for n in here)
        print(
            f"kept {held} of blobs nothing else refers to, for the names that cannot be read "
            f"or fail their check ({listed}): which blob each was bound to cannot be told, "
            "so none it may point at was removed. `somatize store verify` says what is "
            "wrong; move each aside with `verify --quarantine` (or bind it again), and gc "
            "removes them",
            file=out,
        )


def _say_unremoved(unremoved: dict[str, str]) -> None:
    """Says on stderr which files a gc may not remove and went past (a few of them)."""
    shown = [f"{_printable(where)} ({_printable(why)})" for where, why in unremoved.items()]
    more = f", and {len(shown) - 3} more" if len(shown) > 3 else ""
    print(
        f"could not remove {len(shown)} files, left as they are: {', '.join(shown[:3])}{more}. "
        "gc went on past them, oldest first; run it as a user who may write the whole store",
        file=sys.stderr,
    )


def _writes(args: argparse.Namespace) -> bool:
    """Whether the command ``args`` name changes the store: gc, compact and ``verify
    --quarantine`` do; the others only read it, so they open it ``read_only=True``, which
    makes no folder and no marker in it (a store on a read-only disk, or one shared with
    others, is read as it lies)."""
    return args.command in ("gc", "compact") or (args.command == "verify" and args.quarantine)


def _open(where: str, command: str, *, read_only: bool) -> LocalStore | BucketStore:
    """The store at ``where``; a directory (a path, or a ``file://`` or ``local://`` URL)
    must hold one already (``blobs/``, and ``answers/``, ``packs/`` or ``names/``: a store
    made through a ``file://`` bucket that holds only names has no ``answers/``; or, once
    its upkeep emptied those, what ``verify`` moved aside in ``quarantine/``), and so
    must a bucket's prefix, in a bucket that exists, since every command reads a store and
    a mistyped path should not become an empty store reported healthy (nor a gc remove a
    user's files). A ``memory://`` store lives in one process, so
    a command line never finds one there. ``read_only``: it is opened so, and nothing is
    written to it."""
    if not where:
        raise StoreError(
            "--store names no directory (it is empty): name the store's directory, or `.` "
            "for the current one; nothing was opened or created"
        )
    protocols = _protocols_of(where) if "://" in where else {"file"}
    if "memory" in protocols:
        raise StoreError(
            f"{where} is not a store: memory:// lives in the process that made it, so a "
            "command line finds none there, and nothing was created. Name a directory or a "
            "bucket with --store or $SOMATIZE_STORE"
        )
    if not protocols & {"file", "local"}:
        bucket = BucketStore(where, read_only=read_only)
        missing = bucket._missing_bucket()
        if missing is not None:
            raise StoreError(
                f"{where} is not a store: the bucket `{missing}` does not exist, and nothing "
                "was created. Name an existing bucket with --store or $SOMATIZE_STORE"
            )
        if not bucket._holds_store():
            raise StoreError(
                f"{where} is not a store: it holds no store (a store's prefix holds "
                f"{_A_STORE_HOLDS}), so {_LEFT_AS_IT_WAS[command]}. Name an existing store "
                "with --store or $SOMATIZE_STORE"
            )
        return bucket
    where = _anchored(where) if "://" in where else where
    path = where.rsplit("::", 1)[-1]
    path = file_path(path.split("://", 1)[1]) if "://" in path else path
    try:
        root = Path(path).expanduser()
    except RuntimeError:  # ~user names no user this system knows, or no home is known
        raise StoreError(
            f"{where} is not a store: `{path.split('/', 1)[0]}` names no home directory "
            "this system knows, and nothing was created. Name an existing store with "
            "--store or $SOMATIZE_STORE"
        ) from None
    if not _holds_store(str(root)):
        if not root.exists():
            found = "there is no such directory"
        elif not root.is_dir():
            found = "it is a file, not a directory"
        else:
            found = "it holds no store"
        raise StoreError(
            f"{where} is not a store: {found} (a store's directory holds {_A_STORE_HOLDS}), "
            "and nothing was created there. Name an existing store with --store or "
            "$SOMATIZE_STORE; a store is made by the program that first keeps an answer in it "
            "(`Store(path)`)"
        )
    if "://" in where:
        return BucketStore(where, read_only=read_only)
    return LocalStore(root, read_only=read_only)


def _when(seconds: float, shape: str = "%Y-%m-%d %H:%M") -> str:
    """``seconds`` since the epoch as local time; as a number when they lie outside what
    the platform's clock can show (a file's time set far off)."""
    try:
        return time.strftime(shape, time.localtime(seconds))
    except (OverflowError, OSError, ValueError):
        return f"{seconds!r}s"


def _ls(store: LocalStore | BucketStore, out: Any) -> None:
    """Each answer, pack and name, least recently used first in each section (as a gc
    drops them): the bytes it holds (an answer's, a pack's blob's, the blob a name points
    at; ``-`` when that cannot be told, or its blob is not there), when it was last used
    (a bucket's ``used/`` logs say when its answers were) or written, and what ``show``
    takes to show it. Every record and index is read (a small file each), and ``blobs/`` listed
    once, for the blobs they refer to."""
    blobs = {f"blake3:{e.name.rsplit('/', 1)[-1]}": e.size for e in listing(store, "blobs")}
    labels = {"answers": "answer", "packs": "pack", "names": "name"}
    for section, label in labels.items():
        for entry, held in sorted(contents(store, section), key=lambda found: found[0].mtime):
            shown = entry.name if section == "names" else f"blake3:{entry.name[-64:]}"
            size = _size_held(blobs, held)
            printed = "-" if size is None else size_of(size)
            print(f"{label:6} {printed:>10}  {_when(entry.mtime)}  {_printable(shown)}", file=out)


def _size_held(blobs: dict[str, int], held: Answer | PackIndex | str | Corrupt) -> int | None:
    """The bytes an answer holds, a pack's blob holds, or the blob a name points at does,
    ``blobs`` being the size of each blob listed; None for a file that cannot be read, or
    one whose blob is not there."""
    if isinstance(held, Corrupt):
        return None
    if isinstance(held, Answer):
        return held.size if held.value in blobs else None
    if isinstance(held, PackIndex):
        return held.size if held.blob in blobs else None
    return blobs.get(held)


def _du(store: LocalStore | BucketStore, out: Any) -> None:
    found = survey(store)
    for section, files in found.files.items():
        print(f"{section:10} {files:8} files {size_of(found.bytes[section]):>12}", file=out)
    print(f"{'total':10} {sum(found.files.values()):8} files {size_of(found.total):>12}", file=out)


def _show(store: LocalStore | BucketStore, what: str, out: Any) -> int:
    """Prints what is kept under ``what``; status 1 where it, or its blob, is damaged or
    missing (a record that cannot be read is damage, as ``verify`` says)."""
    try:
        return _show_kept(store, what, out)
    except Unsigned as why:
        # Another key than the writers' refuses what they signed as it refuses an altered
        # file, and verify refuses to run with it: the advice starts from the key.
        print(
            f"somatize store show: NOT TRUSTED: {_printable(str(why))}. Show it with the key "
            f"the store's writers sign with ({KEY_VARIABLE}); where this process holds that "
            "key, it was altered, and `somatize store verify --quarantine` with it moves it "
            "aside",
            file=sys.stderr,
        )
        return 1
    except NewerFormat as why:
        print(f"somatize store show: NEWER: {_printable(str(why))}", file=sys.stderr)
        return 1
    except Corrupt as why:
        print(
            f"somatize store show: DAMAGED: {_printable(str(why))}; `somatize store verify "
            "--quarantine` moves it aside",
            file=sys.stderr,
        )
        return 1


def _show_kept(store: LocalStore | BucketStore, what: str, out: Any) -> int:
    if what.startswith("blake3:"):
        check_digest(what)
        answer = store.answer(what)
        if answer is not None:
            where = "" if answer.offset is None else f" at offset {answer.offset} (packed)"
            wrong = _blob_wrong(store, answer.value) or _span_wrong(store, answer)
            print(f"answer   {answer.key}", file=out)
            print(f"blob     {answer.value}{where}{wrong}", file=out)
            _describe(answer.codec, answer.size, answer.fingerprint, answer.created, out)
            return 1 if wrong else 0
        index = store._read_many("packs", [what[7:]]).get(what[7:])
        if index is not None:
            pack = decode_pack(what, index, store.signer)
            wrong = _blob_wrong(store, pack.blob)
            print(f"pack     {pack.id}", file=out)
            print(f"blob     {pack.blob}{wrong}", file=out)
            print(f"items    {len(pack.entries)}", file=out)
            _describe(pack.codec, pack.size, pack.fingerprint, pack.created, out)
            return 1 if wrong else 0
        if store.has_blob(what):
            with store.open_blob(what) as handle:
                size = handle.seek(0, os.SEEK_END)
            wrong = _blob_wrong(store, what)
            print(f"blob     {what}  {size_of(size)}{wrong}", file=out)
            return 1 if wrong else 0
        print(
            f"nothing is kept under {what} (neither an answer, a pack nor a blob)",
            file=sys.stderr,
        )
        return 1
    check_name(what)
    digest = store.resolve(what)
    wrong = _blob_wrong(store, digest)
    print(f"name     {what} → {digest}{wrong}", file=out)
    return 1 if wrong else 0


def _blob_wrong(store: LocalStore | BucketStore, digest: str) -> str:
    """What is wrong with blob ``digest``, as ``show`` says it after the digest: "" when
    it is whole. A local store's blob is hashed (one read of a local file); a bucket's is
    only looked for, since hashing it would download it whole (`verify` hashes it)."""
    if isinstance(store, LocalStore):
        found = store._rehash(digest)
    else:
        found = digest if store.has_blob(digest) else None
    if found is None:
        return "  MISSING: no blob is kept under it"
    if found != digest:
        return (
            f"  DAMAGED: its bytes hash to {found}; `somatize store verify --quarantine` "
            "moves it aside"
        )
    return ""


def _span_wrong(store: LocalStore | BucketStore, answer: Answer) -> str:
    """What is wrong with the bytes ``answer`` says its blob, here and whole, holds for it,
    as ``show`` says it after the digest: "" when the blob holds them. A record is not named
    by its bytes, so one damaged to say another size (a digit flipped) still reads whole:
    a recall refuses it, and ``verify`` reports it and moves it aside."""
    try:
        with store.open_blob(answer.value) as handle:
            size = handle.seek(0, os.SEEK_END)
    except Missing:  # removed since it was looked for (a gc elsewhere)
        return "  MISSING: no blob is kept under it"
    end = answer.size + (answer.offset or 0)
    if size == end or (answer.offset is not None and size > end):
        return ""
    said = "" if answer.offset is None else " the answer ends at"
    return (
        f"  DAMAGED: it holds {size} bytes, not the {end} its record says{said}; "
        "`somatize store verify --quarantine` moves the record aside"
    )


def _describe(codec: str, size: int, code: str | None, created: float, out: Any) -> None:
    """The lines ``show`` prints alike for an answer and a pack."""
    print(f"codec    {_printable(codec)}", file=out)
    print(f"bytes    {size} ({size_of(size)})", file=out)
    print(f"code     {_printable(str(code or '-'))}", file=out)
    print(f"created  {_when(created, '%Y-%m-%d %H:%M:%S')}", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="somatize", description="somatize: look after stores")
    # metavar: a missing command is said by the words that may be given, not by its dest
    parts = parser.add_subparsers(dest="area", required=True, metavar="{store}")
    store_parser = parts.add_parser("store", help="look after a store")
    commands = store_parser.add_subparsers(
        dest="command", required=True, metavar="{ls,du,gc,compact,verify,show}"
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        default=None,  # not named: told apart from a store named, then filled in below
        help="a directory or a bucket URL (default: $SOMATIZE_STORE or ./store)",
    )
    common.add_argument("--no-progress", action="store_true", help="never draw a progress bar")
    commands.add_parser("ls", parents=[common], help="list answers, packs and names")
    commands.add_parser("du", parents=[common], help="files and bytes per section")
    gc = commands.add_parser("gc", parents=[common], help="drop least recently used answers")
    gc.add_argument("--max-bytes", type=parse_size, default=None, help="keep at most this much")
    gc.add_argument(
        "--grace", type=float, default=60.0, help="spare unreferenced files younger than this (s)"
    )
    compact = commands.add_parser(
        "compact", parents=[common], help="merge small packs into large ones"
    )
    compact.add_argument(
        "--grace",
        type=float,
        default=60.0,
        help="merge packs older than this, and remove a replaced pack once its replacement "
        "is this old (s)",
    )
    verify = commands.add_parser("verify", parents=[common], help="re-hash and check everything")
    verify.add_argument("--quarantine", action="store_true", help="move what is damaged aside")
    show = commands.add_parser("show", parents=[common], help="what is kept under a key or name")
    show.add_argument("key", help="an answer key, a pack id, a blob digest, or a name")
    words = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(words)
    if extra:
        return _refuse_extra(parser, words, args, extra)
    if args.store is None:
        args.store = os.environ.get("SOMATIZE_STORE") or "store"  # set empty: as if unset
    out = sys.stdout
    if out is None:  # started with its output closed (`>&-`): nothing could be said
        print(
            f"somatize store {args.command}: the standard output is closed, so nothing "
            "could be printed; nothing was done",
            file=sys.stderr,
        )
        return 2
    bar = _progress(not args.no_progress and sys.stderr.isatty())
    try:
        status = _run(args, out, bar)
        out.flush()  # here, so that a reader gone away is found while it can be said
        return status
    except BrokenPipeError:
        _stop_writing(out)
        return BROKEN_PIPE
    except KeyboardInterrupt:  # Ctrl-C: said in a line, as a shell tool stopped by it ends
        print(
            f"somatize store {args.command}: interrupted; what it changed so far "
            "stands (run it again to finish)",
            file=sys.stderr,
        )
        return INTERRUPTED
    except (SomatizeError, ValueError, OSError) as why:  # OSError: a file it may not read
        print(f"somatize store {args.command}: {_printable(str(why))}", file=sys.stderr)
        return 2


def _refuse_extra(
    parser: argparse.ArgumentParser, words: list[str], args: argparse.Namespace, extra: list[str]
) -> int:
    """Says what the command line (``words``) had that ``args.command`` takes none of; one
    word that is no option is most often the store, named as ``du`` would take it: the
    command line to run is said, the word given to --store and the rest kept as it was."""
    command = args.command
    said = f"somatize store {command}: unrecognized arguments: {' '.join(extra)}"
    named = _store_named(parser, words, extra[0]) if len(extra) == 1 else None
    if named is not None:
        said += (
            "; a store is named with --store (or $SOMATIZE_STORE): "
            f"`{shlex.join(['somatize', *named])}`"
        )
    print(_printable(said), file=sys.stderr)
    return 2


def _store_named(parser: argparse.ArgumentParser, words: list[str], word: str) -> list[str] | None:
    """``words`` with ``word``, left over by the parse, given to --store right after the
    command, where that is what the rest of them take (the word that was left over, of
    those equal to it, is the one whose move parses); None where ``word`` is an option or
    the store is named already."""
    if word.startswith("-"):
        return None
    area = words.index("store") if "store" in words else len(words)
    at = next((i for i in range(area + 1, len(words)) if words[i] in _COMMANDS), None)
    if at is None:
        return None
    for i in reversed(range(at + 1, len(words))):
        if words[i] != word:
            continue
        rest = words[:i] + words[i + 1 :]
        given = _parsed(parser, rest)
        if given is None or given[1] or given[0].store is not None:
            continue  # no parse, or one with the store named already
        named = [*words[: at + 1], "--store", word, *words[at + 1 : i], *words[i + 1 :]]
        moved = _parsed(parser, named)
        if moved is not None and not moved[1] and moved[0].store == word:
            return named
    return None


_COMMANDS = ("ls", "du", "gc", "compact", "verify", "show")


def _parsed(
    parser: argparse.ArgumentParser, words: list[str]
) -> tuple[argparse.Namespace, list[str]] | None:
    """``words`` parsed, saying nothing; None where argparse refuses them."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return parser.parse_known_args(words)
        except SystemExit:
            return None


def _stop_writing(out: Any) -> None:
    """Points ``out`` at the null device: its reader went away (``| head``), and what is
    still buffered would fail again when the interpreter flushes it at exit."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, out.fileno())
        finally:
            os.close(null)
    except (OSError, ValueError, AttributeError):
        pass  # not a file of this process (a test's capture): nothing is flushed to it


def _say_compacted(done: Compacted, grace: float, out: Any) -> None:
    """Says what a compaction did, and what waits for the grace."""
    print(
        f"merged {done.merged} packs into {done.written}, removed {done.removed} packs "
        "newer ones replace (a gc removes their blobs)",
        file=out,
    )
    if done.young:
        print(
            f"{done.young} packs kept within --grace {grace:g}s are not merged yet: "
            "compact again later",
            file=out,
        )
    if done.waiting:
        print(
            f"{done.waiting} replaced packs are left until their replacement is older than "
            f"--grace {grace:g}s: compact again then",
            file=out,
        )


def _run(args: argparse.Namespace, out: Any, bar: Progress | None) -> int:
    """Runs the command ``args`` name; its exit status."""
    store: LocalStore | BucketStore | None = None
    try:
        store = _open(args.store, args.command, read_only=not _writes(args))
        if args.command == "ls":
            _ls(store, out)
        elif args.command == "du":
            _du(store, out)
        elif args.command == "gc":
            done = store.gc(args.max_bytes, grace=args.grace, progress=bar)
            young = ""
            if done.young:
                young = (
                    f" ({size_of(done.young)} of it blobs younger than --grace "
                    f"{args.grace:g}s that nothing refers to, which a later gc removes)"
                )
            print(
                f"dropped {done.answers} answers and {done.packs} packs, removed {done.blobs} "
                f"blobs and {done.abandoned} abandoned writes: freed {size_of(done.freed)}, "
                f"{size_of(done.kept)} kept{young}",
                file=out,
            )
            _say_held_for_names(done, out)
            if done.unremoved:
                _say_unremoved(done.unremoved)
                return 2
        elif args.command == "compact":
            _say_compacted(store.compact(grace=args.grace), args.grace, out)
        elif args.command == "verify":
            found = store.verify(quarantine=args.quarantine, progress=bar)
            print(
                f"checked {found.blobs} blobs ({size_of(found.bytes)}), {found.records} "
                f"records, {found.packs} packs, {found.names} names",
                file=out,
            )
            for damage in found.damaged:
                where = _printable(f"{damage.section}/{damage.name}")
                print(f"DAMAGED {where}: {_printable(damage.why)}", file=out)
            for newer in found.newer:
                where = _printable(f"{newer.section}/{newer.name}")
                print(f"newer   {where}: {_printable(newer.why)}", file=out)
            for where in found.stray:
                if where.endswith("/"):
                    why = (
                        "holds another store (one made in names/ before this one was "
                        "opened above it, or one opened in answers/ or packs/): none of its "
                        "files are this store's, and verify and gc leave them"
                    )
                elif where.startswith("names/"):
                    why = (
                        "not a name (a name's segments are ASCII letters, digits and `._=+@-`), "
                        "so nothing resolves it; gc leaves it"
                    )
                elif where.startswith("blobs/"):
                    swept = "removes" if store._sweeps_strays else "leaves (a bucket's prefix)"
                    why = f"not named by a digest where it lies, so no blob; gc {swept} it"
                else:
                    kind = "record" if where.startswith("answers/") else "pack index"
                    why = f"not named by a digest where it lies, so no {kind}; gc leaves it"
                print(f"stray   {_printable(where)}: {why}", file=out)
            if found.abandoned:
                writes = "write" if found.abandoned == 1 else "writes"
                print(
                    f"{found.abandoned} abandoned {writes} in tmp/: left by writes that were "
                    "interrupted (or are going on now), no damage; gc removes them once older "
                    "than --grace",
                    file=out,
                )
            if found.quarantined:
                print(f"moved {len(found.quarantined)} aside into quarantine/", file=out)
            for why in found.unmoved.values():
                print(_printable(why), file=out)
            return 0 if found.ok else 1
        else:
            return _show(store, args.key, out)
    finally:
        if store is not None:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
