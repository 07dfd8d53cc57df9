"""The ``somatize`` command line: looking after a store.

::

    somatize store ls      [--store PATH_OR_URL]      answers, packs and names
    somatize store du      [--store PATH_OR_URL]      files and bytes per section
    somatize store gc      [--store …] [--max-bytes SIZE] [--grace SECONDS]
    somatize store verify  [--store …] [--quarantine]
    somatize store show KEY_OR_NAME [--store …]

``--store`` defaults to ``$SOMATIZE_STORE`` or ``./store``; a URL (``s3://…``)
opens a bucket store. A directory (a path or a ``file://`` URL) must hold a store
already, and a bucket must exist: one that does not is refused (status 2), and
nothing is created. Sizes are printed and read in human units (``10G``, ``512M``).
Long operations show a progress bar when tqdm is installed and the output is a
terminal. Exit status: 0 when all is well, 1 when ``verify`` found damage, 2 on a
usage or store error, and 141 (quietly) when the reader of the output went away
(``somatize store ls | head``), as for a tool stopped by SIGPIPE.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from somatize.errors import SomatizeError
from somatize.store import BucketStore, LocalStore, Store, StoreError
from somatize.store.base import check_digest, check_name
from somatize.store.upkeep import Progress, listing, survey

__all__ = ["main", "parse_size", "size_of"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

BROKEN_PIPE = 141
"""The exit status when the reader of the output went away (``| head``): what a shell
shows for a tool stopped by SIGPIPE (128 + 13), as ``ls`` or ``cat`` would be."""


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


def _open(where: str) -> LocalStore | BucketStore:
    """The store at ``where``; a directory (a path, or a ``file://`` URL) must hold one
    already (``blobs/`` and ``answers/``), and a bucket must exist, since every command
    reads a store and a mistyped path should not become an empty store reported healthy."""
    if "://" in where and not where.startswith("file://"):
        bucket = BucketStore(where)
        missing = bucket._missing_bucket()
        if missing is not None:
            raise StoreError(
                f"{where} is not a store: the bucket `{missing}` does not exist, and nothing "
                "was created. Name an existing bucket with --store or $SOMATIZE_STORE"
            )
        return bucket
    root = Path(where.removeprefix("file://")).expanduser()
    if not all((root / part).is_dir() for part in ("blobs", "answers")):
        found = "there is no such directory" if not root.exists() else "it holds no store"
        raise StoreError(
            f"{where} is not a store: {found} (a store's directory holds blobs/ and "
            "answers/), and nothing was created there. Name an existing store with --store "
            "or $SOMATIZE_STORE; a store is made by the program that first keeps an answer "
            "in it (`Store(path)`)"
        )
    return BucketStore(where) if "://" in where else LocalStore(root)


def _ls(store: LocalStore | BucketStore, out: Any) -> None:
    for section in ("answers", "packs", "names"):
        entries = sorted(listing(store, section), key=lambda e: e.mtime)
        for entry in entries:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.mtime))
            name = entry.name.rsplit("/", 1)[-1] if section != "names" else entry.name
            label = {"answers": "answer", "packs": "pack", "names": "name"}[section]
            shown = f"blake3:{name}" if section != "names" else name
            print(f"{label:6} {size_of(entry.size):>10}  {when}  {_printable(shown)}", file=out)


def _du(store: LocalStore | BucketStore, out: Any) -> None:
    found = survey(store)
    for section, files in found.files.items():
        print(f"{section:10} {files:8} files {size_of(found.bytes[section]):>12}", file=out)
    print(f"{'total':10} {sum(found.files.values()):8} files {size_of(found.total):>12}", file=out)


def _show(store: Store, what: str, out: Any) -> int:
    if what.startswith("blake3:"):
        check_digest(what)
        answer = store.answer(what)
        if answer is not None:
            where = "" if answer.offset is None else f" at offset {answer.offset} (packed)"
            print(f"answer   {answer.key}", file=out)
            print(f"blob     {answer.value}{where}", file=out)
            print(f"codec    {_printable(answer.codec)}", file=out)
            print(f"bytes    {answer.size} ({size_of(answer.size)})", file=out)
            print(f"code     {_printable(str(answer.fingerprint or '-'))}", file=out)
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(answer.created))
            print(f"created  {created}", file=out)
            return 0
        if store.has_blob(what):
            with store.open_blob(what) as handle:
                size = handle.seek(0, os.SEEK_END)
            print(f"blob     {what}  {size_of(size)}", file=out)
            return 0
        print(f"nothing is kept under {what} (neither an answer nor a blob)", file=sys.stderr)
        return 1
    check_name(what)
    print(f"name     {what} → {store.resolve(what)}", file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="somatize", description="somatize: look after stores")
    parts = parser.add_subparsers(dest="area", required=True)
    store_parser = parts.add_parser("store", help="look after a store")
    commands = store_parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        default=os.environ.get("SOMATIZE_STORE", "store"),
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
    verify = commands.add_parser("verify", parents=[common], help="re-hash and check everything")
    verify.add_argument("--quarantine", action="store_true", help="move what is damaged aside")
    show = commands.add_parser("show", parents=[common], help="what is kept under a key or name")
    show.add_argument("key", help="an answer key, a blob digest, or a name")
    args = parser.parse_args(argv)
    out = sys.stdout
    bar = _progress(not args.no_progress and sys.stderr.isatty())
    try:
        status = _run(args, out, bar)
        out.flush()  # here, so that a reader gone away is found while it can be said
        return status
    except BrokenPipeError:
        _stop_writing(out)
        return BROKEN_PIPE
    except (SomatizeError, ValueError, OSError) as why:  # OSError: a file it may not read
        print(f"somatize store {args.command}: {_printable(str(why))}", file=sys.stderr)
        return 2


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


def _run(args: argparse.Namespace, out: Any, bar: Progress | None) -> int:
    """Runs the command ``args`` name; its exit status."""
    store: LocalStore | BucketStore | None = None
    try:
        store = _open(args.store)
        if args.command == "ls":
            _ls(store, out)
        elif args.command == "du":
            _du(store, out)
        elif args.command == "gc":
            done = store.gc(args.max_bytes, grace=args.grace, progress=bar)
            print(
                f"dropped {done.answers} answers and {done.packs} packs, removed {done.blobs} "
                f"blobs and {done.abandoned} abandoned writes: freed {size_of(done.freed)}, "
                f"{size_of(done.kept)} kept",
                file=out,
            )
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
            for where in found.stray:
                why = "not named by a digest, so no blob; gc removes it"
                print(f"stray   {_printable(where)}: {why}", file=out)
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
