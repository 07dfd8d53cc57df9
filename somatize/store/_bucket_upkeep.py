"""What upkeep asks of a bucket store: its files listed, read, removed and moved aside,
section by section — and the ``used/`` logs that say when answers were used.

Collecting and checking are written once for every home (:mod:`somatize.store.upkeep`),
over the primitives of a :class:`~somatize.store.upkeep.Shelf`; on a bucket each is a
request or a batch of them. A bucket has no atomic rename, so a record is dropped only
if it still holds what was listed when it is read again just before; what race is left,
and why it costs at worst a miss, :meth:`BucketShelf._drop` says. A gc collects the
cache in front too, which holds copies only.

A put of a blob already in a bucket neither writes nor touches it (an object's time
cannot be changed without writing it again), so a gc cannot tell, as a local store's can, a
blob a writer is about to refer to from one nothing wants. A gc therefore copies each blob it
removes aside in ``tmp/aside/`` first (on the server: no bytes travel), reads the records,
pack indexes and names again once the blobs are deleted, puts back each blob one published
meanwhile refers to, and only then removes the copies; the writer looks for such a blob
again once its record is published (:meth:`BucketStore._published`). A gc stopped between
its delete and its put-back leaves the copies: the next gc, once it has read the store,
puts back each missing blob something refers to and removes its copies; the others go a
day later.

On S3 a gc also aborts the uploads of its blobs left incomplete (an upload whose own
abort could not reach the server), once nothing was added to one for a day.

A bucket cannot touch an object's time, so when answers were used is written as small
``used/`` logs, which ``gc`` merges and replaces with one, of the answers and packs it
kept. That is advice: a log that cannot be written is dropped, said once at debug
level, and never fails a recall; a damaged one only loses recency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from somatize.store._bucket_requests import _READ_AT_ONCE, BucketRequests, _under_copies
from somatize.store._local_upkeep import (
    _LAID_OUT,
    _SHARDED,
    _set_times,
    _within,
    holding_the_store,
    links_led_out,
    only_ours_led_out,
    refuse_name_led_out,
)
from somatize.store._packed import hash_bytes
from somatize.store.base import (
    MARKER,
    MARKER_PART,
    PASSED_OVER,
    StoreError,
    check_digest,
    moment,
    prune_above,
    store_kind,
)
from somatize.store.local import LocalStore
from somatize.store.upkeep import Collected, Entry, Progress, blob_digest, collect

_log = logging.getLogger("somatize.store.bucket")
"""The bucket store's logger, named after its public module."""

_CACHE_WRITES_GRACE = 60.0
"""Files in the cache's ``tmp/`` younger than this (seconds) are left by a bucket's gc: another
process sharing the cache may be writing them."""

_UPLOADS_GRACE = 24 * 3600.0
"""Seconds since an incomplete upload to S3 was begun or last given a part before a gc
aborts it (gc's grace, when longer): until then it may be another process's upload,
still going, slowly."""


_ASIDE = "aside"
"""The folder of ``tmp/`` a gc copies each blob it removes into first, as
``<64 hex>.<32 hex>`` (the blob's digest, and what tells one gc's copy from another's)."""
_ASIDE_NAME = re.compile(r"([0-9a-f]{64})\.[0-9a-f]{32}")

_ASIDE_GRACE = 24 * 3600.0
"""Seconds a blob's copy left in ``tmp/aside/`` (by a gc stopped before it removed it) is
kept before a gc removes it: until then it may be the copy of a gc still running, which
puts the blob back from it should a record published meanwhile refer to it."""

_DEPTHS = {"blobs": 1, "answers": 1, "packs": 0, "used": 0, "quarantine": 1}
"""How many folders down its section each file a bucket store writes lies
(``answers/ab/<hex>``, ``packs/<hex>``); names lie at any depth. A file deeper is none of
the store's: a store whose prefix lies inside this one's section (``…/answers/old``), or a
user's folder under the prefix. A blob's or answer's folder may also hold a file at the
top (a ``.DS_Store``), listed as stray (:func:`_stray_shallow`)."""

_HEX2 = re.compile(r"[0-9a-f]{2}/")


def _stray_shallow(section: str, name: str, upkeep: bool) -> bool:
    """Whether the file ``name`` of ``section`` lying above the depth the store writes its
    files at (``answers/.DS_Store``, beside the shards) is listed: always in ``blobs/``; in
    ``answers/`` only for upkeep, which lists it as stray as a local store's does, unless it
    is the marker of a store whose prefix is that section (none of this one's). A reader's
    listing leaves it out, since none of its names is a record's."""
    return section == "blobs" or (upkeep and section == "answers" and name != MARKER)


def _mtime(info: dict[str, Any]) -> float:
    """When the file ``info`` tells of was last written, in seconds since the epoch; 0 when
    it does not say."""
    stamped = info.get("date_time")  # a zip archive's: its fields, in local time
    if isinstance(stamped, tuple) and len(stamped) == 6:
        try:
            return time.mktime((*stamped, 0, 0, -1))
        except (OverflowError, ValueError, TypeError):
            return 0.0
    for field in ("LastModified", "last_modified", "mtime", "created", "updated"):
        value = info.get(field)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


def version_of(info: dict[str, Any]) -> tuple[Any, ...] | None:
    """What tells the object a listing gave ``info`` of from another written at its path
    later: its ETag, size and time; None where the listing says neither ETag nor time."""
    etag = info.get("ETag") or info.get("etag")
    mtime = _mtime(info)
    if etag is None and not mtime:
        return None
    return (etag, info.get("size"), mtime)


class BucketShelf(BucketRequests):
    """The files of a bucket store as upkeep sees them (a
    :class:`~somatize.store.upkeep.Shelf`), and its ``used/`` logs; see the module
    docstring."""

    cache: LocalStore | None
    """The local store in front, if any: a gc collects it too."""

    def gc(
        self,
        max_bytes: int | None = None,
        *,
        grace: float = 60.0,
        progress: Progress | None = None,
    ) -> Collected:
        # Refused before anything is listed, removed or written (the file that reads the
        # store's clock): an archive's files are not removed, nor a read-only store's.
        self._refuse_writing("collect garbage in")
        # Refused, too, before a blob is put back from tmp/aside/: a prefix that bears no
        # store's marker may be a user's folder, left as it is.
        self._refuse_unmarked("collect")
        done = super().gc(max_bytes, grace=grace, progress=progress)
        aborted, freed = self._abort_uploads(max(grace, _UPLOADS_GRACE))
        done.abandoned += aborted
        done.freed += freed
        return done

    def _put_back_left(self, referred: set[str] | None) -> tuple[int, int]:
        """Puts back each blob ``referred`` to (None: any may be) that a gc stopped between
        its delete and its put-back (killed, or failing) removed and left a copy of in
        ``tmp/aside/``: a record published meanwhile refers to it. One nothing refers to
        stays removed (a writer that refers to it later finds it gone and writes it again),
        where it was put back at every other gc for a day. A copy is put back only when its
        bytes hash to the digest it is named after (:meth:`_put_back_copy`); credentials
        that may not write put none back. Removes the copies of each blob put back, no
        longer needed, and those older than :data:`_ASIDE_GRACE` (until then the others may
        be a running gc's); how many, and the bytes of those not put back."""
        removed: list[str] = []
        freed = 0
        now = time.time()
        writable = True
        back: set[str] = set()
        base = f"{self.root}/tmp/{_ASIDE}/".lstrip("/")
        for path, info in sorted(self._list(f"tmp/{_ASIDE}").items()):
            name = path.lstrip("/")[len(base) :]
            found = _ASIDE_NAME.fullmatch(name)
            if found is None:
                continue  # none of a gc's: a user's, or another store's under this prefix
            digest = f"blake3:{found.group(1)}"
            if writable and digest not in back and (referred is None or digest in referred):
                put = self._put_back_missing(path, digest)
                writable = put is not None
                if put:
                    back.add(digest)
            if digest in back:
                removed.append(self._path("tmp", f"{_ASIDE}/{name}"))
            elif now - _mtime(info) > _ASIDE_GRACE:
                removed.append(self._path("tmp", f"{_ASIDE}/{name}"))
                freed += int(info.get("size") or 0)
        self._rm(f"removing blobs set aside in tmp/{_ASIDE}/", removed)
        return len(removed), freed

    def _put_back_missing(self, copy: str, digest: str) -> bool | None:
        """Puts blob ``digest`` back from ``copy`` where the bucket lacks it; whether it
        did. A blob there is left, and its copies with it: one may be the copy of a gc
        still running, about to delete the blob and put it back. None when these
        credentials may not write."""
        blob = self._blob_path(digest)
        self.fs.invalidate_cache(blob)
        if self._call(f"looking for blob {digest}", self.fs.exists, blob):
            return False
        return self._put_back_copy(copy, blob, digest)

    def _put_back_copy(self, copy: str, blob: str, digest: str) -> bool | None:
        """Writes blob ``digest`` at ``blob`` from the bytes of ``copy``, left in
        ``tmp/aside/``, when they hash to the digest (what is written is what was hashed);
        whether it did. One that does not (cut short, or written there by another than a
        gc) is not the blob's and is left, to go at the grace with the rest. None when these
        credentials may not write (said at debug level): a gc that may delete but not write
        collects as it did before it made copies."""
        data = self._read(copy, f"blob {digest} set aside in tmp/{_ASIDE}/", large=True)
        if data is None:
            return False  # removed meanwhile, by the gc that made it or another
        if hash_bytes(data) != digest:
            _log.debug("%s: %s does not hash to %s: not put back", self._where, copy, digest)
            return False
        try:
            self._write(blob, [data])
        except StoreError as why:
            if not isinstance(why.__cause__, PermissionError):
                raise
            _log.debug("%s: blobs set aside cannot be put back (%s)", self._where, why)
            return None
        return True

    def _sweep(self, entries: list[Entry], referred: Callable[[], set[str] | None]) -> list[Entry]:
        """Each blob is copied aside in ``tmp/aside/`` first, then all are deleted; then
        ``referred()`` reads again what was published since the gc read the store, each
        blob that refers to is put back from its copy, and the copies are removed. A record
        a writer publishes (its put found the blob and did not write it) before that read
        puts its blob back here; one published after it was published after the delete, and
        its writer, looking for the blob once more, finds it gone and writes it again. A
        blob gone before it is copied (a gc elsewhere) is not this gc's to remove.
        Credentials that may delete but not write cannot copy: the blobs are then removed
        without copies, as the listings found them, and a record published in that instant
        may point at nothing (a miss, recomputed)."""
        if not entries:
            return []
        paths = {entry.name: self._path("blobs", entry.name) for entry in entries}
        aside = self._copy_aside(paths)
        if aside is None:
            self._rm("removing blobs", list(paths.values()))
            return entries
        try:
            self._rm("removing blobs", [paths[name] for name in aside])
        except StoreError:
            # Refused (credentials that may write but not delete): the copies would only
            # pile up, gc after gc. Those of blobs it did remove go too: such a blob is
            # gone as a gc without copies removes it.
            with contextlib.suppress(OSError, StoreError):
                self._rm(f"removing blobs set aside in tmp/{_ASIDE}/", list(aside.values()))
            raise
        wanted = referred()
        back = {
            paths[name]: name for name in aside if wanted is None or blob_digest(name) in wanted
        }
        pairs = [(aside[name], path) for path, name in sorted(back.items())]
        for copy, path in self._copy_all(pairs):
            with contextlib.suppress(FileNotFoundError):  # put back by a gc elsewhere
                self._copy(copy, path, f"putting blob {back[path]} back")
        self._rm(f"removing blobs set aside in tmp/{_ASIDE}/", list(aside.values()))
        return [e for e in entries if e.name in aside and paths[e.name] not in back]

    def _copy_aside(self, paths: dict[str, str]) -> dict[str, str] | None:
        """Copies each blob of ``paths`` (its name in ``blobs/`` → its path) into
        ``tmp/aside/``: name → where its copy is, for those still there; None when these
        credentials may not write (no copy made is left)."""
        copies = {
            name: self._path("tmp", f"{_ASIDE}/{name.rsplit('/', 1)[-1]}.{uuid.uuid4().hex}")
            for name in paths
        }
        left = set(self._copy_all([(paths[name], copy) for name, copy in copies.items()]))
        out: dict[str, str] = {}
        for name, path in paths.items():
            copy = copies[name]
            try:
                if (path, copy) in left:
                    self._copy(path, copy, f"setting blob {name} aside")
            except FileNotFoundError:
                continue  # removed meanwhile by a gc elsewhere: not this one's to remove
            except StoreError as why:
                if not isinstance(why.__cause__, PermissionError):
                    raise
                _log.debug(
                    "%s: blobs cannot be set aside before they are removed (%s)", self._where, why
                )
                made = [copies[n] for n in paths if n in out or (paths[n], copies[n]) not in left]
                self._rm(f"removing blobs set aside in tmp/{_ASIDE}/", made)
                return None
            out[name] = copy
        return out

    def _copy_all(self, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Copies each ``(source, target)`` of ``pairs`` on the server, concurrently on an
        async object store (s3fs), a batch at a time as reads go (:meth:`_cat_each`): a gc
        of thousands of blobs waits on a round trip a batch, not two a blob. The pairs not
        copied, whatever the reason (a source gone, a refusal, a moment's failure), which the
        caller copies again one at a time (:meth:`_copy`) to be told why; elsewhere, all."""
        fs = _under_copies(self.fs)
        if not (self._atomic and len(pairs) > 1 and getattr(fs, "async_impl", False)):
            return list(pairs)
        from fsspec.asyn import sync

        # On S3 one request a copy: s3fs's cp_file asks each object's size first, to copy
        # one over 5 GB in parts; such a one fails here, and is copied again so.
        copy = getattr(fs, "_copy_basic", fs._cp_file)

        async def each(source: str, target: str) -> bool:
            try:
                await copy(source, target)
            except Exception:
                return False
            return True

        async def all_of(batch: list[tuple[str, str]]) -> list[bool]:
            return list(await asyncio.gather(*(each(*pair) for pair in batch)))

        left: list[tuple[str, str]] = []
        for start in range(0, len(pairs), _READ_AT_ONCE):
            batch = pairs[start : start + _READ_AT_ONCE]
            copied = sync(fs.loop, all_of, batch)
            left += [pair for pair, done in zip(batch, copied, strict=True) if not done]
        for _, target in pairs:
            self.fs.invalidate_cache(target)
        return left

    def _copy(self, source: str, target: str, what: str) -> None:
        """Copies the object at ``source`` to ``target`` on the server, whole: a plain
        filesystem copies into ``tmp/`` and renames, as every write there goes (a copy made
        in place shows a reader a blob cut short); FileNotFoundError when there is none."""
        if self._atomic:
            self._call(what, self.fs.cp_file, source, target)
        else:
            with self._in_tmp(".part") as name:
                part = self._path("tmp", name)
                self.fs.makedirs(part.rsplit("/", 1)[0], exist_ok=True)
                try:
                    self._call(what, self.fs.cp_file, source, part)
                    self._rename(part, target)
                except BaseException:
                    with contextlib.suppress(OSError):  # none made, or tidied by a gc
                        self._rm_one(part)
                    raise
        self.fs.invalidate_cache(target)

    def _abort_uploads(self, after: float) -> tuple[int, int]:
        """Aborts the uploads to S3 of this store's blobs left incomplete (one interrupted
        when the server could not be reached, not even to abort it) that were begun or
        last given a part more than ``after`` seconds ago; how many, and the bytes of their
        parts. Best effort: credentials that may not list or abort uploads leave them
        (said at debug level) to a lifecycle rule of the bucket."""
        if not ("s3" in self._protocols and hasattr(self.fs, "call_s3")):
            return 0, 0
        bucket, prefix = self.fs.split_path(self.root)[:2]
        where = f"{prefix}/blobs/" if prefix else "blobs/"
        aborted = freed = 0
        try:
            for upload in self._uploads(bucket, where):
                try:
                    sizes, last = self._parts(bucket, upload)
                    begun = _mtime({"LastModified": upload.get("Initiated")})
                    if time.time() - max(last, begun) < after:
                        continue
                    self._call(
                        "aborting an upload left incomplete",
                        self.fs.call_s3,
                        "abort_multipart_upload",
                        Bucket=bucket,
                        Key=upload["Key"],
                        UploadId=upload["UploadId"],
                    )
                except FileNotFoundError:
                    continue  # completed or aborted meanwhile
                aborted += 1
                freed += sizes
        except (OSError, KeyError) as why:
            _log.debug(
                "uploads to %s left incomplete were not all aborted (%s: %s); a lifecycle "
                "rule of the bucket for incomplete multipart uploads removes them",
                self._where,
                type(why).__name__,
                why,
            )
        return aborted, freed

    def _uploads(self, bucket: str, where: str) -> list[dict[str, Any]]:
        """The incomplete uploads to S3 of keys under ``where`` in ``bucket``."""
        pages = self._pages(
            "listing uploads left incomplete",
            "list_multipart_uploads",
            ("KeyMarker", "UploadIdMarker"),
            Bucket=bucket,
            Prefix=where,
        )
        return [upload for page in pages for upload in page.get("Uploads") or []]

    def _parts(self, bucket: str, upload: dict[str, Any]) -> tuple[int, float]:
        """The bytes of the parts ``upload`` was given, and when the last was given."""
        size, last = 0, 0.0
        for page in self._pages(
            "listing the parts of an upload left incomplete",
            "list_parts",
            ("PartNumberMarker",),
            Bucket=bucket,
            Key=upload["Key"],
            UploadId=upload["UploadId"],
        ):
            for part in page.get("Parts") or []:
                size += int(part.get("Size") or 0)
                last = max(last, _mtime(part))
        return size, last

    def _pages(
        self, what: str, operation: str, markers: tuple[str, ...], **asked: Any
    ) -> Iterator[dict[str, Any]]:
        """Each page S3 answers a listing ``operation`` with, asked again from where the
        page before ended (its ``Next…`` of each of ``markers``) while it says there is
        more."""
        going_on: dict[str, Any] = {}
        while True:
            page: dict[str, Any] = self._call(what, self.fs.call_s3, operation, **asked, **going_on)
            yield page
            if not page.get("IsTruncated"):
                return
            going_on = {marker: page[f"Next{marker}"] for marker in markers}

    def _collected(self, grace: float) -> None:
        if self.cache is not None:
            # A cache holds copies only: what was dropped goes too. The blobs this store's
            # keeps are copying there are claimed in it, and left; its tmp/ keeps a grace:
            # another process sharing the cache may be writing there now (a blob it copied
            # whose record is not there yet goes, and it downloads that blob again). Its
            # key is not checked: the bucket's gc is done by now, and what the cache holds
            # signed with another key (a process without this key sharing the folder) is
            # no answer of this store's, refused when read, never a reason to stop.
            collect(
                self.cache,
                0,
                0.0,
                abandoned_after=max(grace, _CACHE_WRITES_GRACE),
                check_key=False,
            )
        with self._lock:
            merging, self._noted.merging = self._noted.merging, None
        if merging is not None and merging[0]:
            # One log of the merged times replaces the many that were read: the times of
            # what this gc kept, not of what it dropped (or found gone).
            logs, times, kept = merging
            merged = {where: t for where, t in times.items() if where in kept}
            self._used.update(
                {
                    f"blake3:{n.rsplit('/', 1)[-1]}": t
                    for (s, n), t in merged.items()
                    if s == "answers"
                }
            )
            self._used_packs.update(
                {f"blake3:{n}": t for (s, n), t in merged.items() if s == "packs"}
            )
            self._write_use()  # written before the logs it replaces are removed
            self._rm("removing used/ logs", logs)

    def _entries(self, section: str) -> list[Entry]:
        """The files of ``section`` the store could have written there, at their depth (see
        :data:`_DEPTHS`). On an object store ``tmp/`` holds none: writes go straight to
        their place, and what lies there is a user's (or another store's, under this
        one's prefix)."""
        if section == "tmp" and self._atomic:
            return []
        out = [
            Entry(name, int(info.get("size") or 0), _mtime(info))
            for name, info in self._sized(section, self._listed(section, upkeep=True)).items()
            if not (section == "tmp" and name.startswith(f"{_ASIDE}/"))  # a gc's copies
        ]
        if not self._atomic and section in _LAID_OUT:  # a directory: links lead out
            root = self.fs._strip_protocol(self.root)
            ours = set(only_ours_led_out(root, section, [entry.name for entry in out]))
            out = [entry for entry in out if entry.name in ours]
        merging = self._noted.merging
        if merging is not None and section in ("answers", "packs"):
            merging[2].update((section, entry.name) for entry in out)
        return out

    def _links_out(self, section: str, names: list[str]) -> dict[str, str]:
        """On a plain filesystem, as in a local store; an object store holds no link."""
        if self._atomic:
            return {}
        return links_led_out(self.fs._strip_protocol(self.root), section, names)

    def _stamp(self, names: dict[str, list[str]], when: float) -> None:
        """An object store stamps its objects by its server's clock, and a log of uses is
        taken at the gc's time as it is merged, so nothing is set there. A plain filesystem
        (``file://``) stamps them as a directory does, and keeps the times a copy made with
        them (``rsync -a``, tar) says: they are set, as in a local store."""
        if not self._atomic:
            stamped = {section: dict.fromkeys(listed, when) for section, listed in names.items()}
            _set_times(self.fs._strip_protocol(self.root), stamped)

    def _clock_ahead(self) -> float:
        """How far this machine's clock runs ahead of the server's, which stamps the time of
        every object a gc weighs against its grace: a gc on a machine minutes ahead (S3
        takes up to fifteen) would take a blob put a moment ago, not yet bound or referred
        to, for one put minutes ago. Found from a log of no use written to ``used/`` (which
        a gc merges, should one be left) and removed: the server stamped it before this
        clock is read, so what is found is never less than the lead, nor the grace shorter
        than asked. 0 where the filesystem tells no object's time, or where these
        credentials may not write (said at debug level): the ages are then this machine's."""
        for _ in range(self.retries + 1):
            path = self._path("used", f"{uuid.uuid4().hex}.json")
            try:
                self._write(path, [json.dumps({"answers": {}, "packs": {}}).encode()])
            except StoreError as why:
                if not isinstance(why.__cause__, PermissionError):
                    raise
                _log.debug(
                    "%s cannot be written to (%s), so a gc measures its grace on this "
                    "machine's clock, not the server's",
                    self._where,
                    why,
                )
                return 0.0
            now = time.time()
            try:
                stamped = _mtime(self._call("reading the server's clock", self.fs.info, path))
            except FileNotFoundError:
                continue  # merged and removed by a gc elsewhere that listed it meanwhile
            self._rm("removing a log of no use", [path])
            return now - stamped if stamped else 0.0
        raise StoreError(
            f"the time of a log written to {self.url} could not be read: each was removed "
            "at once (by gc elsewhere); a gc measures its grace on the server's clock, so "
            "run it again"
        )

    def _sized(self, section: str, listed: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """``listed`` (name in ``section`` → info), each file's size asked of the server
        where the listing lacks it: a web server's folder page names its files, not their
        sizes, and a blob taken for 0 bytes makes its answer's record look damaged. One gone
        since it was listed (a gc elsewhere) is left out."""
        if not self._on_web_server:
            return listed
        out: dict[str, dict[str, Any]] = {}
        for name, info in listed.items():
            if info.get("size") is None:
                path = self._path(section, name)
                try:
                    info = {**info, **self._call(f"looking at {path}", self.fs.info, path)}
                except FileNotFoundError:
                    continue
            out[name] = info
        return out

    def _listed(self, section: str, *, upkeep: bool = False) -> dict[str, dict[str, Any]]:
        """Name in ``section`` → info of each file listed there at the depth the store
        writes its files (see :data:`_DEPTHS`); one fresh listing, for ``upkeep`` refusing
        a link there that leads nowhere. Upkeep on a plain filesystem (``file://``) lists
        what lies deeper in ``answers/`` and ``packs/`` too, as a local store's does of the
        same folder (as stray): a directory, not a prefix under which the rest is a user's."""
        base = f"{self.root}/{section}/".lstrip("/")
        depth = _DEPTHS.get(section)
        # Every file of a section a local store's upkeep lists whole, as it lists them: of
        # answers/ and packs/, whose strays gc leaves and where another store's folder is
        # told apart (`upkeep._stores_among`); not of blobs/, whose strays gc removes.
        whole = upkeep and not self._atomic and section in ("answers", "packs")
        home = "" if self._atomic else os.path.realpath(self.fs._strip_protocol(self.root))
        looping: dict[str, str] = {}

        def walked(folder: str) -> bool:
            """Whether the folder ``folder`` of the section may hold a file listed here: on a
            plain filesystem, a section linked to `/` is not walked to any depth, nor a link
            in tmp/ leading out of the store, nor one in names/ to a folder holding it."""
            if home and section in ("tmp", "names"):
                at = os.path.join(home, section, folder)
                if section == "tmp":
                    return _within(os.path.realpath(at), (home,))
                return not holding_the_store(home, at, looping, folder)
            if depth is None:
                return True
            if whole and _within(os.path.realpath(os.path.join(home, section, folder)), (home,)):
                return True  # not where a link leads out of the store: a local store's walk
            sharded = section not in _SHARDED or _HEX2.fullmatch(f"{folder}/") is not None
            return folder.count("/") < depth and sharded

        out: dict[str, dict[str, Any]] = {}
        if section == "names" and home:
            self._names_looping = looping
            if holding_the_store(home, os.path.join(home, section), looping, ""):
                return out
        for path, info in self._list(section, walked, upkeep=upkeep).items():
            name = path.lstrip("/")[len(base) :]
            if depth is not None and name.count("/") > depth and not whole:
                continue  # another store's, inside this one's section, or a user's folder
            if (
                depth is not None
                and name.count("/") < depth
                and not _stray_shallow(section, name, upkeep)
            ):
                continue
            if section in _SHARDED and "/" in name and not _HEX2.fullmatch(name[:3]) and not whole:
                continue  # a folder no digest's first two name: another store's section
            out[name] = info
        return out

    def _holds_store(self, root: str | None = None) -> bool:
        """Whether the prefix (or ``root``, another in the bucket) holds a store, marked or of
        an earlier layout, as a local store's directory does."""
        return self._store_kind(root) is not None

    def _fresh(self) -> bool:
        """Whether the prefix holds nothing but empty folders a store makes (on an object
        store, which keeps no empty folder: nothing), where a new store may be made: a
        ``tmp/`` that holds the marker another process is writing, and the files a file
        browser or git keeps in such a folder, are passed over, as a local store's
        directory's are."""
        for name in self._names_in(self.root) - PASSED_OVER:
            if name not in self._sections:
                return False
            inside = self._names_in(f"{self.root}/{name}")
            if name != "tmp" and inside:
                return False
            if any(not found.endswith(MARKER_PART) for found in inside):
                return False
        return True

    def _names_in(self, at: str) -> set[str]:
        """The names of what lies in the folder ``at`` (one fresh listing; none if absent)."""
        self.fs.invalidate_cache(at)
        try:
            found = self._call(f"listing {at}", self.fs.ls, at, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            found = []
        return {str(path).rstrip("/").rsplit("/", 1)[-1] for path in found}

    def _store_kind(self, root: str | None = None) -> str | None:
        """What the prefix (or ``root``, another in the bucket) holds, as a local store's
        directory does (:func:`~somatize.store.base.store_kind`): one listing of the prefix,
        and of its ``quarantine/`` where only that tells."""
        root = self.root if root is None else root
        listed: dict[str, set[str]] = {}

        def holds(folder: str) -> bool:
            above, _, name = f"/{folder}".rpartition("/")
            if above not in listed:
                at = f"{root}{above}"
                self.fs.invalidate_cache(at)
                try:
                    found = self._call(f"listing {at}", self.fs.ls, at, detail=False)
                except FileNotFoundError:
                    found = []
                listed[above] = {str(path).rstrip("/").rsplit("/", 1)[-1] for path in found}
            return name in listed[above]

        return store_kind(holds)

    def _removed(self, section: str, names: Iterable[str]) -> None:
        """Notes that a gc removed ``names`` from ``section``: their times are not kept."""
        merging = self._noted.merging
        if merging is not None:
            merging[2].difference_update((section, name) for name in names)

    def _read_many(self, section: str, names: list[str]) -> dict[str, bytes | None]:
        paths = {self._path(section, name): name for name in names}
        return {paths[p]: data for p, data in self._read_paths(list(paths)).items()}

    def _remove(self, section: str, names: list[str]) -> None:
        self._rm(f"removing from {section}", [self._path(section, name) for name in names])
        self._removed(section, names)

    def _drop(self, section: str, listed: dict[str, bytes]) -> set[str]:
        """Each file is read again and removed only if it still holds what was listed. A
        bucket has no atomic rename, nor (on every object store) a removal that holds only
        if the object is unchanged, so this narrows the race to one it cannot close: a
        writer that publishes a record again between this read and the removal loses it,
        and that answer is a miss, computed and kept again — never a wrong answer."""
        if not listed:
            return set()
        paths = {self._path(section, name): name for name in listed}
        now = self._read_paths(list(paths))
        same = [path for path, name in paths.items() if now.get(path) == listed[name]]
        self._rm(f"removing from {section}", same)
        gone = {paths[path] for path in same}
        self._removed(section, gone)
        if section == "names":
            for name in gone:
                self._prune_names(name)
        return gone

    def _prune_names(self, name: str) -> None:
        """On a plain filesystem (``file://``), removes the folders of ``names/`` above
        ``name`` left empty, as a local store does (:func:`prune_above`); a bind that finds
        one gone as it renames its name into it makes it again (:meth:`_rename`). An object
        store keeps no folder."""
        if not self._atomic:
            prune_above(name, lambda folder: self.fs.rmdir(self._path("names", folder)))

    def _quarantine(self, section: str, name: str, was: bytes | None = None) -> bool | None:
        """Given ``was``, the file is read again first and left if it changed: a bucket has
        no atomic rename, so a writer that publishes it anew between that read and the
        move still loses it to quarantine/ (a miss, recomputed). In an archive, which is
        only read, nothing is moved: a StoreError says so, as of a read-only store."""
        refused = self._only_read(f"move {section}/{name} aside in")
        if refused is not None:
            raise refused
        if section == "names" and not self._atomic:
            refuse_name_led_out(self.fs._strip_protocol(self.root), name)
        if was is not None:
            now = self._read_many(section, [name]).get(name)
            if now is None:
                return False
            if now != was:
                return None
        aside = self._path("quarantine", f"{section}/{name.replace('/', '_')}.{time.time_ns()}")
        if section == "blobs":  # a keep of it through this store object writes it afresh
            self._noted.damaged.add(f"blake3:{name.rsplit('/', 1)[-1]}")
        try:
            self._move(self._path(section, name), aside, f"moving {section}/{name} aside")
        except FileNotFoundError:
            return False  # removed meanwhile (a gc elsewhere): nothing is left to move
        finally:
            self._forget_all()
        if section == "names":
            self._prune_names(name)
        return True

    def _move(self, source: str, target: str, what: str) -> None:
        """Moves the file at ``source`` to ``target``: FileNotFoundError when there is none;
        :class:`StoreError` when it could not be moved, saying that it is still in place.
        An object store has no rename: the object is copied, then deleted where it was,
        and only a delete that succeeded makes it moved (one refused, by credentials that
        may write but not delete, leaves it in place, and the copy is taken back when it
        can be)."""
        only_read = self._only_read("move files aside in")
        if only_read is not None:
            raise StoreError(f"{only_read}; it is still in place")
        try:
            if not self._atomic:  # a plain filesystem renames, into a folder that exists
                self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
                self._call(what, self.fs.mv, source, target)
                return
            self._call(what, self.fs.cp_file, source, target)
        except FileNotFoundError:
            raise
        except StoreError as why:
            raise StoreError(f"{why}; it is still in place") from why
        except OSError as why:
            raise StoreError(f"{what} on {self.url} failed ({why}): it is still in place") from why
        try:
            self._call(what, self._rm_one, source)
        except FileNotFoundError:
            pass  # removed meanwhile (a gc elsewhere): gone all the same
        except (OSError, StoreError) as why:
            cause = why.__cause__ if isinstance(why, StoreError) and why.__cause__ else why
            refused = isinstance(cause, PermissionError)
            try:
                self._rm_one(target)
                copy = ""
            except Exception:
                copy = f"; a copy of it is left at {target}"
            raise StoreError(
                f"{what} on {self.url} failed: it was copied, but deleting it where it is "
                + (
                    f"was refused ({cause}): these credentials may not delete there"
                    if refused
                    else f"failed ({cause})"
                )
                + f", so it is still in place{copy}"
            ) from why

    def _rehash(self, digest: str, size: int | None = None) -> str | None:
        data = self._download(digest, size)
        return None if data is None else hash_bytes(data)

    def _flush_use(self) -> None:
        """Writes a ``used/`` log; one that cannot be written only loses advice, so it is
        dropped rather than failing the recall that wrote it."""
        try:
            self._write_use()
        except Exception as why:
            if not self._noted.use_said:
                self._noted.use_said = True
                _log.debug(
                    "when answers of %s were used cannot be written down (%s: %s); gc will "
                    "not know it, and recalls go on",
                    self._where,
                    type(why).__name__,
                    why,
                )

    def _write_use(self) -> None:
        """Writes when the answers recalled since the last time were used as a ``used/``
        log (dropped from memory whether or not the write succeeds)."""
        answers, packs = self._take_uses()
        if not answers and not packs:
            return
        log = json.dumps({"answers": answers, "packs": packs}).encode()
        self._write(self._path("used", f"{uuid.uuid4().hex}.json"), [log])

    def _uses(self, merge: bool = True) -> dict[tuple[str, str], float]:
        """When each answer and pack the ``used/`` logs name was last used; with ``merge``,
        the logs read are replaced by one once the gc reading them is done
        (:meth:`_collected`). A damaged log,
        or a damaged entry in one (a time no clock shows: text, negative, Infinity), only
        loses its own recency, which is advice; a time later than now (a clock that ran
        years ahead) is taken as a use now, and ages from here on, rather than keeping its
        answer the newest at every gc until that time comes."""
        out: dict[tuple[str, str], float] = {}
        listed = [self._path("used", name) for name in self._listed("used")]
        now = time.time()
        for data in self._read_paths(listed).values():
            try:
                log = json.loads(data or b"{}")
                sections = [(section, log.get(section)) for section in ("answers", "packs")]
            except (ValueError, TypeError, AttributeError, RecursionError):
                continue
            for section, times in sections:
                for digest, when in times.items() if isinstance(times, dict) else ():
                    try:
                        hexed = check_digest(digest)[7:]
                        used = min(moment(when), now)
                    except (ValueError, TypeError, OverflowError):
                        continue
                    where = (section, f"{hexed[:2]}/{hexed}" if section == "answers" else hexed)
                    out[where] = max(out.get(where, 0.0), used)
        if merge:
            with self._lock:
                self._noted.merging = (listed, out, set())
        return out
