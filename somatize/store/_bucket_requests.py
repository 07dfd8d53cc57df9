"""Requests to a bucket: each made again while it fails for a moment, and said plainly
when it keeps failing; and how a file is published whole.

A bucket store (:mod:`somatize.store.bucket`) reaches its files through fsspec, where
a request costs tens of milliseconds and can fail on its own for a while: a
connection reset, a timeout, throttling. Such a failure (:func:`_transient`) is
retried with exponential backoff and jitter, and one that keeps failing becomes a
:class:`~somatize.store.base.StoreError` that says so. What cannot go away is not
retried: a file that is not there is absent (None, or nothing listed), a refusal
says to check the credentials and the bucket's permissions, credentials not found
say where the client looks for them, settings the client cannot be made from say so,
and a write to a bucket that does not exist says so.

Reads of many files are made at once (a batch at a time), and every listing is
fresh: a bucket has no cheap sign that nothing changed. Object stores publish an
object whole when its upload completes, so a write goes straight to its place (a
large one streamed from its pieces, and committed only once every piece is
written); on ``file://`` it goes through ``tmp/`` and a rename, as in the local
store.

:class:`BucketRequests` holds this for :class:`~somatize.store.bucket.BucketStore`,
which opens the filesystem and sets what it declares.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import inspect
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from stat import S_ISDIR, S_ISREG
from typing import Any, TypeVar, cast

from somatize.store._credentials import without_passwords
from somatize.store._local_files import (
    LedNowhere,
    NotAFile,
    _open_regular,
    _read_file,
    refuse_led_nowhere,
)
from somatize.store._packed import PackedHome, nbytes
from somatize.store.base import (
    MARKER,
    MARKER_DATA,
    MARKER_PART,
    BadAddress,
    Buffer,
    Missing,
    StoreError,
    check_digest,
)

T = TypeVar("T")

_STREAM_ABOVE = 16 << 20
"""Blobs larger than this are uploaded through a file, piece by piece, not joined first."""

_READ_AT_ONCE = 128
"""The most files read at once (as fsspec batches its own reads)."""

_DELETE_AT_ONCE = 1000
"""The most keys one bulk delete of S3 takes."""

_RENAMES = 4
"""How many times a write on a plain filesystem renames its file into a folder that is
removed each time before the rename (see :meth:`BucketRequests._rename`)."""

_DELETE_AGAIN = {"InternalError", "SlowDown", "ServiceUnavailable", "RequestTimeout"}
"""Why S3 did not delete a key in a bulk delete, when asking again may do it."""

_DEFINITE = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    NotAFile,
    LedNowhere,
)
_ABSENT = (FileNotFoundError, IsADirectoryError, NotADirectoryError, NotAFile)
"""What reading a file that is not there raises: on a plain filesystem (``file://``) a
folder of names, or a path under a name, is not a file either, nor is what is no regular
file there or in an archive (:func:`_cat_file`)."""
_GLOB = set("*?[")
"""What fsspec takes a path holding for a pattern, where it expands paths (``rm``, ``cat``
of a list): a store's prefix may hold them (``exp[lr=0.1]``); its names and digests never."""
_REFUSED = {
    errno.EINVAL,  # a request S3 takes for malformed: an argument, a bucket's name, XML
    errno.ENAMETOOLONG,  # a key longer than S3 holds (KeyTooLongError)
    errno.EMSGSIZE,  # an object larger or smaller than S3 takes (EntityTooLarge)
    errno.ENOSYS,  # what the server does not implement
    errno.EPERM,  # what S3 does not allow (MethodNotAllowed)
    errno.EREMCHG,  # a bucket in another region, or behind another endpoint (a redirect)
    errno.ENOTEMPTY,
    errno.EEXIST,
}
"""The error numbers s3fs says an S3 refusal with (``s3fs.errors``) that asking again will
not change, which :func:`_transient` tells from a failing server's (``EREMOTEIO``, ``EBUSY``)."""
_TRANSIENT_WORDS = (
    "Connection",
    "Timeout",
    "Throttl",
    "SlowDown",
    "ServiceUnavailable",
    "Payload",  # aiohttp's ClientPayloadError: a body that ended before its length
    "IncompleteRead",  # botocore's IncompleteReadError: the same, said by botocore
)


def _transient(error: BaseException) -> bool:
    """Whether ``error`` may go away if the request is made again."""
    if isinstance(error, _DEFINITE) or _refused(error):
        return False
    said = _server_said(error, raised_from=False)  # not one a store's error was raised from
    if said is not None:
        return _busy_or_failing(said[0])
    if isinstance(error, (OSError, ConnectionError, TimeoutError)):
        return True
    # What s3fs retries itself, which a bucket store has it make once (see
    # ``bucket._opened_with``): a body cut short, a response that could not be parsed.
    s3fs = sys.modules.get("s3fs.core")
    if isinstance(error, getattr(s3fs, "S3_RETRYABLE_ERRORS", ())):
        return True
    module = type(error).__module__
    name = type(error).__name__
    return module.startswith(("botocore", "aiohttp", "urllib3", "requests")) and any(
        word in name for word in _TRANSIENT_WORDS
    )


def _refused(error: BaseException) -> bool:
    """Whether ``error`` is a refusal of the request as it was made (:data:`_REFUSED`)."""
    return (
        isinstance(error, OSError) and error.errno in _REFUSED and not isinstance(error, NotAFile)
    )


_DENIED = {"AccessDenied", "AllAccessDisabled", "403"}
"""What S3 says of a request these credentials may not make, which stays so for them;
not an expired token or a clock out of step, which refuse every request alike and pass."""


def _denied(error: BaseException) -> PermissionError | None:
    """The refusal ``error`` is (or was raised from, as :meth:`BucketRequests._call` raises
    it) when the bucket refuses these credentials the request: a PermissionError that S3
    says with :data:`_DENIED`, or that another filesystem says (``file://``); None for any
    other failure (unreachable, a full disk)."""
    denied = error if isinstance(error, PermissionError) else error.__cause__
    if not isinstance(denied, PermissionError):
        return None
    response = getattr(denied.__cause__, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return denied if code is None or code in _DENIED else None


_NO_WRITES = {405, 501}
"""The HTTP statuses a web server answers a write with where it takes none: method not
allowed, not implemented (a plain file server, ``python -m http.server``, answers a PUT
so). Asking again, with any credentials, will not change it."""

_FORBIDDEN = {401, 403}
"""The HTTP statuses a web server answers a request with that these credentials (or none)
may not make: unauthorized, forbidden. Asking again with them will not change it."""


def _server_said(error: BaseException, *, raised_from: bool = True) -> tuple[int, str] | None:
    """The status and what a web server said where ``error`` is its answer (aiohttp's
    ``ClientResponseError``, as fsspec's http filesystem raises it), or, if ``raised_from``,
    was raised from it (as :meth:`BucketRequests._call` raises a refusal); None for any
    other failure."""
    for said in (error, error.__cause__) if raised_from else (error,):
        status = getattr(said, "status", None)
        if type(said).__module__.startswith("aiohttp") and isinstance(status, int):
            return status, f"{status} {getattr(said, 'message', '')}".strip()
    return None


_BUSY = {408, 429}
"""The HTTP statuses below 500 a web server answers with that asking later may change:
request timeout, too many requests."""


def _busy_or_failing(status: int) -> bool:
    """Whether a web server answering ``status`` may answer otherwise if asked again: it is
    busy or failing (:data:`_BUSY`, a 5xx), not refusing the request as it was made (a 4xx,
    or a 5xx of :data:`_NO_WRITES`)."""
    return status in _BUSY or (status >= 500 and status not in _NO_WRITES)


def _refused_writing(error: BaseException) -> tuple[int, str] | None:
    """The status and what a web server said refusing a write, with one of
    :data:`_NO_WRITES` or :data:`_FORBIDDEN`; None for any other failure."""
    said = _server_said(error)
    return said if said is not None and said[0] in _NO_WRITES | _FORBIDDEN else None


def _no_credentials(error: BaseException) -> bool:
    """Whether ``error`` says no credentials were found (botocore's ``NoCredentialsError``,
    google-auth's ``DefaultCredentialsError``, …): asking again will not find them."""
    module = type(error).__module__
    return "Credential" in type(error).__name__ and module.startswith(
        ("botocore", "google", "azure")
    )


_MISCONFIGURED = (
    "ProfileNotFound",  # AWS_PROFILE (or `profile=`) names a profile the config file lacks
    "ConfigNotFound",
    "ConfigParseError",  # AWS_CONFIG_FILE (or ~/.aws/config) that cannot be parsed
    "InvalidConfigError",
    "InvalidRegionError",  # a region such as `us_east_1`
    "InvalidRetryConfigurationError",  # AWS_RETRY_MODE, AWS_MAX_ATTEMPTS
    "InvalidDefaultsMode",
    "InvalidChecksumConfigError",
    "InvalidS3AddressingStyleError",
    "InvalidEndpointConfigurationError",
    "UnknownSignatureVersionError",
    "UnsupportedSignatureVersionError",
    "UnsupportedS3ConfigurationError",
)
"""What botocore says of settings it cannot make a client from: the storage options, or
the client's settings in the environment and its config file (``AWS_PROFILE``, ``AWS_*``)."""


def _misconfigured(error: BaseException) -> bool:
    """Whether ``error`` says the client cannot be made from its settings (botocore's
    :data:`_MISCONFIGURED`, or a file they name missing: :func:`_file_missing`): every
    request would fail alike, whatever is asked again."""
    exceptions = sys.modules.get("botocore.exceptions")
    kinds = tuple(getattr(exceptions, name, None) for name in _MISCONFIGURED)
    return isinstance(error, tuple(kind for kind in kinds if isinstance(kind, type))) or (
        _file_missing(error)
    )


def _file_missing(error: BaseException) -> bool:
    """Whether ``error`` says the HTTP client could not read a file its settings name, which
    it reads before it connects (botocore's ``HTTPClientError`` of a FileNotFoundError: a CA
    bundle or client certificate that is no file). It is an OSError of no network, so
    :func:`_transient` would take it for the bucket unreachable."""
    if type(error).__name__ != "HTTPClientError":
        return False
    cause = getattr(error, "kwargs", {}).get("error")
    return isinstance(cause, (FileNotFoundError, IsADirectoryError, NotADirectoryError))


def _misaddressed(error: BaseException) -> bool:
    """Whether ``error`` says the request could not be made as asked, whatever is asked
    again: botocore's ``ParamValidationError`` (a bucket's name S3 cannot have), or the
    TypeError of a client made from a mistyped storage option (``endpoint=``: "got an
    unexpected keyword argument"); no other TypeError, which is a fault of code."""
    if isinstance(error, TypeError):
        return "unexpected keyword argument" in str(error)
    return type(error).__name__ == "ParamValidationError" and type(error).__module__.startswith(
        "botocore"
    )


def _under_copies(fs: Any) -> Any:
    """The filesystem under ``fs``'s layers that keep copies of the files read through them
    (``simplecache::``, ``filecache::``, ``blockcache::`` in a chained URL), which a file is
    read from: a layer hands its copy of a path for as long as it keeps it, and a store's
    names and records are written again at their paths (a name bound again, an answer kept
    anew), so the name would resolve to the dataset it named before; and a blob whose copy
    was damaged on its way would be read damaged again, and the bucket's whole one moved
    to quarantine."""
    from fsspec.implementations.cached import CachingFileSystem

    while isinstance(fs, CachingFileSystem):
        fs = fs.fs
    return fs


def _cat_file(fs: Any, path: str, **at_once: Any) -> bytes:
    """The bytes of the file at ``path`` on ``fs`` (under its copies), read only where it is
    a regular file: NotAFile otherwise, as a local store reads its files. On a plain
    filesystem (``file://``) it is opened without waiting, where a FIFO planted there would
    wait for a writer for good; a member of an archive that is no regular file (a FIFO, a
    device, a link to what the archive does not hold, which tar keeps as a link) fails in
    fsspec with what a file that cannot be read does not raise (AttributeError, KeyError,
    ValueError)."""
    from fsspec.archive import AbstractArchiveFileSystem
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem):
        return _read_file(fs._strip_protocol(path), None)
    try:
        return cast(bytes, fs.cat_file(path, **at_once))
    except (AttributeError, KeyError, ValueError) as why:
        if not isinstance(fs, AbstractArchiveFileSystem):
            raise
        raise NotAFile(errno.EINVAL, f"no regular file of the archive ({why})", path) from why


def _open_file(fs: Any, path: str) -> Any:
    """The file at ``path`` on ``fs`` (under its copies) opened to be read, as
    :func:`_cat_file` reads it: NotAFile where it is no regular file."""
    from fsspec.archive import AbstractArchiveFileSystem
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem):
        handle, _ = _open_regular(fs._strip_protocol(path))
        return open(handle, "rb")
    try:
        return fs.open(path, "rb")
    except (AttributeError, KeyError, ValueError) as why:
        if not isinstance(fs, AbstractArchiveFileSystem):
            raise
        raise NotAFile(errno.EINVAL, f"no regular file of the archive ({why})", path) from why


@functools.cache
def _in_one_request(kind: type) -> dict[str, Any]:
    """What a small file (a record, a name, a log, an index) is read whole with on a
    filesystem of ``kind``, so that it takes one request. s3fs asks a file's size first (a
    request of its own) to read a large one in ranges at once, unless it holds a listing
    of the folder, and a bucket store holds none (see ``bucket._opened_with``): a gc or
    verify would ask twice for every record. A blob is read so too where its size is
    known to be small (see ``_download``)."""
    read = getattr(kind, "_cat_file", None)
    if read is None:
        return {}
    try:
        accepts = "max_concurrency" in inspect.signature(read).parameters
    except (TypeError, ValueError):  # pragma: no cover - a read without a signature
        return {}
    return {"max_concurrency": 1} if accepts else {}


_Merging = tuple[list[str], dict[tuple[str, str], float], set[tuple[str, str]]]
"""What a gc merges: the ``used/`` logs it read, the times merged from them, and the
answers and packs it found listed and has not removed (whose times it keeps)."""


@dataclasses.dataclass
class BucketNotes:
    """What a bucket store object found out as it went, and the merge of a gc going on: read
    only where a keep, a put, a gc, a look at ``packs/`` or a log it could not write asks,
    so held in one
    attribute. A store is asked a dozen things on every recalled forward, and CPython (3.11
    on) makes those calls fast only on an object of fewer than 30 attributes, whose keys
    its class's objects share (tests/test_engine.py counts them)."""

    marked: bool = False
    """Whether the store's marker was found, or written, before this object's first write
    (see :meth:`BucketRequests._ensure_marked`)."""
    bucket_seen: bool = False
    """Whether the bucket was once looked for and not found missing (see
    :meth:`BucketRequests._refused_keeping`)."""
    refused: str | None = None
    """What the bucket said refusing this object's write for want of permission
    (credentials that may only read), held so that a forward is refused before it computes
    what it could not keep (see :meth:`BucketRequests._refused_keeping`); None while no
    write was refused so. Never cleared by a later write, as of a ``used/`` log that a
    policy may let readers write."""
    refused_by_server: int | None = None
    """The HTTP status a web server refused the write of :attr:`refused` with (see
    :func:`_refused_writing`): one of :data:`_NO_WRITES` where it takes no writes at all,
    of :data:`_FORBIDDEN` where it takes none of these credentials; None where a bucket
    refused it."""
    damaged: set[str] = dataclasses.field(default_factory=set)
    """The blobs this store object found damaged: a put of one writes it afresh, not
    trusting the object of the right size there (which a move aside may have left)."""
    indexes: dict[str, tuple[Any, ...] | None] = dataclasses.field(default_factory=dict)
    """Pack id → the version of its index (:func:`~somatize.store._bucket_upkeep.version_of`)
    as the last look at ``packs/`` listed it."""
    damaged_indexes: dict[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)
    """Pack id → the version of its index found damaged or unsigned, or read as it was when
    its blob was found damaged: not read again while it is listed so, since its items are
    misses all the same; one written over it later (a repair) is listed as another version,
    and read."""
    merging: _Merging | None = None
    """The ``used/`` logs a gc read, the times merged from them, and the answers and packs
    it kept, until it replaces the logs with one (together, so that one gc never removes
    logs another gc read)."""
    use_said: bool = False
    """Whether a ``used/`` log that could not be written was said (once, at debug level)."""


def _followed(info: dict[str, Any]) -> dict[str, Any] | None:
    """``info`` of what fsspec lists on a plain filesystem as neither file nor folder (a link,
    a FIFO), as what it leads to, links followed: a folder, or a file of its size and time;
    None for a link that leads nowhere, and for what is no regular file (reading a FIFO
    would wait for good)."""
    if info.get("type") != "other":
        return info
    try:
        stat = os.stat(info["name"])
    except FileNotFoundError:
        return None
    if S_ISDIR(stat.st_mode):
        return {**info, "type": "directory"}
    if not S_ISREG(stat.st_mode):
        return None
    return {**info, "type": "file", "size": stat.st_size, "mtime": stat.st_mtime}


class BucketRequests(PackedHome):
    """The requests of a bucket store, retried, and where its files are; see the module
    docstring."""

    url: str
    root: str
    """The store's path in ``fs``, with no ``/`` at the end."""
    retries: int
    backoff: float
    _protocols: set[str]
    _noted: BucketNotes
    _opened: tuple[Any, int] = (None, -1)
    """The filesystem :attr:`fs` is, and the process it was opened in."""
    _may_write_as = ", with credentials that may write,"

    @property
    def fs(self) -> Any:
        """The fsspec filesystem the bucket is reached through; opened afresh in a process
        forked from the one that opened it (a DataLoader worker): an async client (s3fs's)
        serves only the process that made it, and refuses every request in a child."""
        fs, opened_in = self._opened
        if opened_in != os.getpid():
            fs = self.fs = self._open_fs()
        return fs

    @fs.setter
    def fs(self, fs: Any) -> None:
        self._opened = (fs, os.getpid())

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a model pickled to a worker) may reach the bucket with credentials of its
        # own (the worker's role, its environment): it finds out for itself whether the
        # bucket refuses it writes.
        state = super().__getstate__()
        state["_noted"] = dataclasses.replace(self._noted, refused=None, refused_by_server=None)
        # Nor does it carry the filesystem, which it opens from its options: fsspec hands
        # one filesystem to all who open it with the same options, so the store's may be
        # one made with the credentials as plain text, which its pickle would hold.
        state.pop("_opened", None)
        return state

    @property
    def _atomic(self) -> bool:
        """Whether an upload publishes a file whole by itself (an object store); if not (a
        plain filesystem), a write goes through ``tmp/`` and a rename."""
        return not self._protocols & {"file", "local"}

    @property
    def _on_web_server(self) -> bool:
        """Whether the store is on a web server (``http://host/store``): fsspec opens its
        files only to read (a large file is written in one request, not piece by piece, see
        :meth:`_stream`), removes none, and finds a folder's page as a file of its own."""
        return bool(self._protocols & {"http", "https"})

    def _open_fs(self) -> Any:
        """The filesystem of the store's URL, opened as :attr:`fs` was."""
        raise NotImplementedError

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, retried with backoff while it fails transiently."""
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                return fn(*args, **kwargs)
            except Exception as why:
                without_passwords(why)  # it may name the endpoint, password and all
                if _no_credentials(why):
                    raise self._uncredentialed(what, why) from why
                if _misaddressed(why):
                    raise self._misaddressed(what, why) from why
                if _misconfigured(why):
                    raise self._misconfigured(what, why) from why
                if not _transient(why):
                    if isinstance(why, NotImplementedError):  # fsspec's: never done there
                        raise self._not_done(what, why) from why
                    if isinstance(why, PermissionError):
                        raise StoreError(
                            f"{what} on {self.url} was refused ({why}): check the credentials "
                            "and the bucket's permissions"
                        ) from why
                    refused = self._server_refused(what, why)
                    if refused is not None:
                        raise refused from why
                    if _refused(why):
                        raise StoreError(
                            f"{what} on {self.url} was refused ({why}), which asking again "
                            "will not change: check the URL, the endpoint and the bucket's "
                            "region, and that the name or value is one the bucket takes"
                        ) from why
                    raise
                if attempt == self.retries:
                    failing = self._server_failing(what, why, attempt + 1)
                    if failing is not None:
                        raise failing from why
                    raise StoreError(
                        f"{what} on {self.url} failed {attempt + 1} times ({type(why).__name__}: "
                        f"{why}); the bucket seems unreachable — nothing half-written is "
                        "visible; try again later or check the endpoint"
                    ) from why
                time.sleep(delay * (1 + random.random()))
                delay *= 2
        raise AssertionError("unreachable")

    def _forbidden(self, what: str, why: BaseException) -> StoreError | None:
        """The error for a request a web server refused these credentials (one of
        :data:`_FORBIDDEN`); None for any other failure. A write refused so is said again
        by :meth:`_upload`, as a store read-only for them."""
        said = _server_said(why)
        if said is None or said[0] not in _FORBIDDEN:
            return None
        return StoreError(
            f"{what} on {self.url} was refused by the server ({said[1]}): these credentials "
            "(or none) may not do that there. Check the credentials the store is opened with "
            "(storage options such as `headers=` or `client_kwargs={'auth': ...}`) and the "
            "server's permissions"
        )

    def _server_refused(self, what: str, why: BaseException) -> StoreError | None:
        """The error for a request a web server refused as it was made: these credentials
        (:meth:`_forbidden`), or any other status but those :meth:`_server_failing` says;
        None for any other failure, and for fsspec's FileNotFoundError raised from a 404: a
        file not there."""
        forbidden = self._forbidden(what, why)
        if forbidden is not None:
            return forbidden
        said = _server_said(why, raised_from=False)
        if said is None:
            return None
        return StoreError(
            f"{what} on {self.url} was refused by the server ({said[1]}), which asking again "
            "will not change: check the URL, and the server's log for why it refused"
        )

    def _server_failing(self, what: str, why: BaseException, tries: int) -> StoreError | None:
        """The error for a request a web server kept answering busy or failing (a 5xx, a
        429) ``tries`` times; None for any other failure."""
        said = _server_said(why, raised_from=False)
        if said is None:
            return None
        return StoreError(
            f"{what} on {self.url} failed {tries} times: the server answered {said[1]}, busy "
            "or failing. Nothing half-written is visible; try again later (or open the store "
            "with more `retries=`), or check the server"
        )

    def _not_done(self, what: str, why: NotImplementedError) -> StoreError:
        """The error for what the store's filesystem does not do at all (fsspec's http
        filesystem removes nothing): asked again, or with other credentials, it is not."""
        said = f" ({why})" if str(why) else ""
        return StoreError(
            f"{what} on {self.url} cannot be done: its filesystem "
            f"({type(_under_copies(self.fs)).__name__}) does not do that{said}. Do it where "
            "the store's files can be changed (open its folder, or its bucket, there)"
        )

    def _uncredentialed(self, what: str, why: BaseException) -> StoreError:
        return StoreError(
            f"{what} on {self.url} found no credentials ({type(why).__name__}: {why}): pass "
            "them to `Store.on_bucket` as storage options (`key=`, `secret=` for s3) or set "
            "them where the client looks, the only place the `somatize` command reads them "
            "(for s3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE). A store "
            "pickled (a model saved with it, one sent to a Ray worker) carries none of the "
            "credentials it was opened with: loaded, it reads those of its process"
        )

    def _misaddressed(self, what: str, why: BaseException) -> BadAddress:
        return BadAddress(
            f"{what} on {self.url} could not be asked ({type(why).__name__}: {why}): the "
            "client takes neither this URL nor these storage options; check the bucket's name "
            "and the options' names (for s3 an endpoint is "
            "`client_kwargs={'endpoint_url': ...}`)"
        )

    def _misconfigured(self, what: str, why: BaseException) -> StoreError:
        if _file_missing(why):
            return StoreError(
                f"{what} on {self.url} could not be asked: a file the client reads before it "
                f"connects is missing ({why}). It is the CA bundle the client trusts (named by "
                "AWS_CA_BUNDLE, `ca_bundle` in its config file, or "
                "`client_kwargs={'verify': ...}`) or its client certificate (`client_cert`): "
                "point that setting at the file, or unset it"
            )
        return StoreError(
            f"{what} on {self.url} could not be asked: the client cannot be made from its "
            f"settings ({type(why).__name__}: {why}). Check the storage options given to "
            "`Store.on_bucket` and the client's settings where it reads them, the only place "
            "the `somatize` command does (for s3: AWS_PROFILE, AWS_CONFIG_FILE and the other "
            "AWS_ variables)"
        )

    def _bucket_name(self) -> str | None:
        """The bucket the store lies in, on an object store (``s3://bucket/…``); None on a
        filesystem (``file://``, ``memory://``) or a web server (``https://host/…``, whose
        paths stay whole URLs), which have none."""
        if self._protocols & {"file", "local", "memory", "http", "https"}:
            return None
        return self.root.lstrip("/").split("/", 1)[0] or None

    def _missing_bucket(self) -> str | None:
        """The name of the store's bucket when it does not exist (one request); None when it
        does, or the home has no bucket."""
        bucket = self._bucket_name()
        if bucket is None:
            return None
        self.fs.invalidate_cache(bucket)
        try:
            self._call(f"looking for the bucket `{bucket}`", self.fs.info, bucket)
        except FileNotFoundError:
            return bucket
        return None

    def writable(self) -> bool:
        """False where the bucket does not exist, the store is in an archive, or the bucket
        refused this object a write for want of permission (see :meth:`_refused_keeping`);
        whether its permissions allow a write shows only when something is written."""
        return self._refused_keeping() is None

    def _refused_keeping(self) -> StoreError | None:
        """The error a keep would raise where the bucket refused this object a write for
        want of permission (held from then on: the credentials may only read), the store
        is in an archive, or the bucket does not exist. The bucket is looked for once per
        store object (one request), before its first answer computed is kept; one that may
        not be asked for (no ``HeadBucket``) may still be written: its keeps say what they
        find."""
        refused = self._noted.refused
        if refused is not None:
            return self._read_only("keep answers in", refused)
        if self.read_only:
            return self._only_read("keep answers in")
        if self._noted.bucket_seen:
            return None
        archived = self._in_archive("keep answers in")
        if archived is not None:
            return archived
        try:
            bucket = self._missing_bucket()
        except StoreError:
            bucket = None
        if bucket is not None:
            return self._no_bucket(bucket)
        self._noted.bucket_seen = True
        return None

    def _not_kept(self, said: str) -> Missing:
        """Says too that the bucket does not exist, when that is why (one request, made
        only once the answer or blob was not found)."""
        bucket = self._missing_bucket()
        if bucket is None:
            return Missing(said)
        return Missing(
            f"{said}: the bucket `{bucket}` does not exist, so nothing is kept there. Check "
            "the URL, or create the bucket"
        )

    def _cannot_write(self, doing: str) -> StoreError | None:
        return self._in_archive(doing)

    def _in_archive(self, doing: str) -> StoreError | None:
        """The error for a write (``doing``: what it would do) to a store opened inside a zip
        or tar archive (``zip://::file://store.zip``); None for any other filesystem. A
        store there is read, as one packed to be handed on; fsspec reads a tar only, and a
        zip's files cannot be replaced or removed once written, which names, records and a
        gc do, so none is written, rather than failing with what fsspec says of a mode."""
        from fsspec.archive import AbstractArchiveFileSystem

        if not isinstance(self.fs, AbstractArchiveFileSystem):
            return None
        protocol = self.fs.protocol
        kind = protocol if isinstance(protocol, str) else protocol[0]
        return StoreError(
            f"cannot {doing} {self.url}: the store is in a {kind} archive, which is only read "
            "here. Nothing was changed; it can still be read. Keep answers in a store this "
            "process may write (unpack the archive and open its folder)"
        )

    def _read_only(self, doing: str, refused: str, status: int | None = None) -> StoreError:
        """The error for a write (``doing``: what it would do) to a bucket that refused a
        write for want of permission, or a web server that refused it (``refused``: which,
        and what it said; ``status``: the server's, else the one held)."""
        status = self._noted.refused_by_server if status is None else status
        if status in _FORBIDDEN:
            return StoreError(
                f"cannot {doing} {self.url}: the server refused writes with these credentials "
                f"({refused}), so the store is read-only for them. Nothing was changed; it "
                "can still be read. Open it with read_only=True, which refuses a forward that "
                "would keep an answer before it computes one, or with credentials the server "
                "lets write, or keep answers in a store this process may write"
            )
        if status is not None:
            return StoreError(
                f"cannot {doing} {self.url}: the server takes no writes ({refused}), so the "
                "store is read-only there. Nothing was changed; it can still be read. Open "
                "it with read_only=True, which refuses a forward that would keep an answer "
                "before it computes one, or keep answers in a store this process may write"
            )
        return StoreError(
            f"cannot {doing} {self.url}: the bucket refused writes with these credentials "
            f"({refused}), so the store is read-only for them. Nothing was "
            "changed; it can still be read. Keep answers in a store these credentials may "
            "write, or open this one with credentials that may write there"
        )

    def _no_bucket(self, bucket: str) -> StoreError:
        return StoreError(
            f"cannot write to {self.url}: the bucket `{bucket}` does not exist. Create it "
            "first, or check the URL"
        )

    def _path(self, section: str, name: str) -> str:
        return f"{self.root}/{section}/{name}"

    def _blob_path(self, digest: str) -> str:
        hexed = check_digest(digest)[7:]
        return f"{self.root}/blobs/{hexed[:2]}/{hexed}"

    def _answer_path(self, key: str) -> str:
        hexed = check_digest(key)[7:]
        return f"{self.root}/answers/{hexed[:2]}/{hexed}"

    def _pack_path(self, pack_id: str) -> str:
        return f"{self.root}/packs/{check_digest(pack_id)[7:]}"

    def _write(self, path: str, pieces: Sequence[Buffer]) -> None:
        """Publishes ``pieces`` at ``path`` whole: an object store's upload does that by
        itself; a plain filesystem goes through ``tmp/`` and a rename."""
        section = path[len(self.root) + 1 :].split("/", 1)[0]  # blobs/, not a shard of it
        refused = self._only_read(f"write {section}/ of")
        if refused is not None:
            raise refused
        if not self._noted.marked:
            self._ensure_marked()
        self._publish(path, pieces)

    def _ensure_marked(self) -> None:
        """Before this object's first write: writes the store's marker where the prefix bears
        none (one request to look, one to write it, whole, as every upload is). A bucket has
        no folders to make, so a store is made by its first write, whatever else its prefix
        holds (a user's files there are left alone by its upkeep), and one an earlier
        somatize made is marked so, and kept a store once its upkeep empties it."""
        marker = f"{self.root}/{MARKER}"
        self.fs.invalidate_cache(marker)
        try:
            self._call(f"looking for {marker}", self.fs.info, marker)
        except FileNotFoundError:
            self._publish(marker, [MARKER_DATA], MARKER_PART)
        self._noted.marked = True

    def _mark(self) -> bool:
        try:
            self._publish(f"{self.root}/{MARKER}", [MARKER_DATA], MARKER_PART)
        except OSError:  # not written (credentials that may only read): left as it was
            return False
        return True

    def _publish(self, path: str, pieces: Sequence[Buffer], suffix: str = ".part") -> None:
        """Writes ``pieces`` at ``path`` whole (see :meth:`_write`), on a plain filesystem
        through a file in ``tmp/`` named to end in ``suffix``."""
        if self._atomic:
            self._upload(path, path, pieces)
            return
        with self._in_tmp(suffix) as name:
            self._upload(self._path("tmp", name), path, pieces)

    def _upload(self, path: str, target: str, pieces: Sequence[Buffer]) -> None:
        """Writes ``pieces`` at ``path``, then (on a plain filesystem, where ``path`` is in
        ``tmp/``) renames it to ``target``."""
        size = nbytes(pieces)

        def upload() -> None:
            if size <= _STREAM_ABOVE or self._on_web_server:
                self.fs.pipe_file(path, b"".join(pieces))
            else:
                self._stream(path, pieces, size)

        try:
            self._call(f"writing {target}", upload)
            if not self._atomic:
                self._rename(path, target)
        except BaseException as why:
            if not self._atomic:
                with contextlib.suppress(OSError):  # gone already, or tidied by a gc
                    self._rm_one(path)
            if isinstance(why, FileNotFoundError):  # on an object store: no bucket
                bucket = self._missing_bucket()
                if bucket is not None:
                    raise self._no_bucket(bucket) from why
                raise StoreError(f"writing {target} on {self.url} failed: {why}") from why
            where = target[len(self.root) + 1 :]
            said = _refused_writing(why)
            if said is not None:
                self._refused_by_server(where, *said)
                raise self._read_only("write to", f"writing {where}: {said[1]}", said[0]) from why
            denied = _denied(why)
            if denied is None:
                raise
            refused = f"writing {where}: {denied}"
            # A `used/` log is advice, and a name is bound by hand (by whoever publishes
            # names): a policy may refuse either alone. Any other file refused means
            # answers cannot be kept.
            if not where.startswith(("used/", "names/")):
                self._noted.refused = refused
            raise self._read_only("write to", refused) from denied

    def _refused_by_server(self, where: str, status: int, said: str) -> None:
        """Holds a web server's refusal (``status``, what it ``said``) to write ``where``:
        one that takes no writes refuses every file alike; one that refuses these
        credentials may refuse a ``used/`` log or a name alone, as a bucket's policy may
        (see :meth:`_upload`)."""
        if status in _FORBIDDEN and where.startswith(("used/", "names/")):
            return
        self._noted.refused = f"writing {where}: {said}"
        self._noted.refused_by_server = status

    def _rename(self, path: str, target: str) -> None:
        """Renames ``path`` (in ``tmp/``) to ``target`` on a plain filesystem, into its
        folder, made first: made again when it is gone as the file is renamed, removed by a
        ``verify`` elsewhere moving the last name out of it aside (a folder of ``names/``
        left empty refuses a name bound at its path), up to :data:`_RENAMES` times. A
        folder at ``target`` (names bound under a name's path) is IsADirectoryError: a move
        puts a file into a folder named as its target."""
        for attempt in range(_RENAMES):
            try:
                self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
                if self.fs.isdir(target):
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), target)
                self.fs.mv(path, target)
                return
            except FileNotFoundError:
                if attempt == _RENAMES - 1 or not self.fs.exists(path):
                    raise

    def _stream(self, path: str, pieces: Sequence[Buffer], size: int) -> None:
        """Uploads ``pieces`` to ``path`` through a file, committed only once every piece is
        written: an upload interrupted part way is discarded (an object store's multipart
        upload is aborted), and whatever a filesystem made visible early (``memory://``
        shows a file as it is written) is removed, so no half-written object remains."""
        out = self.fs.open(path, "wb", autocommit=False)
        try:
            for piece in pieces:
                out.write(piece)
            out.close()
            out.commit()
        except BaseException:
            try:
                out.discard()
                self.fs.invalidate_cache(path)
                if self.fs.exists(path) and int(self.fs.info(path).get("size", -1)) != size:
                    self._rm_one(path)
            except Exception:
                pass  # tidying up must not hide why the upload failed
            raise

    def _read(self, path: str, what: str, *, large: bool = False) -> bytes | None:
        """The bytes at ``path``; None if it is absent. A file that may be ``large`` is
        read as the filesystem chooses; any other in one request."""
        fs = _under_copies(self.fs)
        at_once = {} if large else _in_one_request(fs.__class__)
        try:
            return self._call(f"reading {what}", _cat_file, fs, path, **at_once)
        except _ABSENT:
            return None

    def _download(self, digest: str, size: int | None) -> bytes | None:
        """Blob ``digest``, read whole; None if it is absent. One a record or a listing
        says is ``size`` bytes, no more than s3fs reads in one piece, is read in one
        request; another (larger, or of a size not known) as s3fs chooses: it asks the
        size first, to read a large blob in ranges at once."""
        small = size is not None and size <= getattr(self.fs, "default_block_size", 0)
        return self._read(self._blob_path(digest), f"blob {digest}", large=not small)

    def _read_paths(self, paths: list[str]) -> dict[str, bytes | None]:
        """Reads ``paths`` concurrently (a batch at a time); None for each that is absent."""
        out: dict[str, bytes | None] = {}
        left = list(paths)
        delay = self.backoff
        for attempt in range(self.retries + 1):
            if not left:
                break
            got = self._cat_each(left)
            retry = []
            for path in left:
                value = got.get(path)
                if isinstance(value, bytes):
                    out[path] = value
                elif value is None or isinstance(value, _ABSENT):
                    out[path] = None
                elif isinstance(value, BaseException) and _no_credentials(value):
                    raise self._uncredentialed(f"reading {path}", value) from value
                elif isinstance(value, BaseException) and _misaddressed(value):
                    raise self._misaddressed(f"reading {path}", value) from value
                elif isinstance(value, BaseException) and _misconfigured(value):
                    raise self._misconfigured(f"reading {path}", value) from value
                elif isinstance(value, BaseException) and _transient(value):
                    retry.append(path)
                elif isinstance(value, BaseException):
                    what = f"reading {path}"
                    refused = self._server_refused(what, value)
                    if refused is not None:
                        raise refused from value
                    raise StoreError(f"{what} from {self.url} failed: {value}") from value
                else:
                    out[path] = None
            if retry and attempt == self.retries:
                value = got[retry[0]]
                assert isinstance(value, BaseException)
                failing = self._server_failing(f"reading {retry[0]}", value, attempt + 1)
                if failing is not None:
                    raise failing from value
                raise StoreError(
                    f"reading {len(retry)} files from {self.url} kept failing; the bucket "
                    "seems unreachable — try again later or check the endpoint"
                )
            if retry:
                time.sleep(delay * (1 + random.random()))
                delay *= 2
            left = retry
        return out

    def _cat_each(self, paths: list[str]) -> dict[str, bytes | BaseException]:
        """Each of ``paths`` read, or why it could not be: concurrently on an async
        filesystem (s3fs), a batch at a time. Each path is read as it is, never taken for a
        pattern, as ``fs.cat`` of a list takes one: a store under ``exp[lr=0.1]/`` has
        ``[``, ``*`` or ``?`` in every path."""
        fs = _under_copies(self.fs)
        at_once = _in_one_request(fs.__class__)
        if len(paths) > 1 and getattr(fs, "async_impl", False) and hasattr(fs, "_cat_file"):
            from fsspec.asyn import sync

            async def each(path: str) -> bytes | BaseException:
                try:
                    return cast(bytes, await fs._cat_file(path, **at_once))
                except Exception as why:
                    return without_passwords(why)

            async def all_of(batch: list[str]) -> list[bytes | BaseException]:
                return list(await asyncio.gather(*(each(path) for path in batch)))

            got: list[bytes | BaseException] = []
            for start in range(0, len(paths), _READ_AT_ONCE):
                got += sync(fs.loop, all_of, paths[start : start + _READ_AT_ONCE])
            return dict(zip(paths, got, strict=True))
        out: dict[str, bytes | BaseException] = {}
        for path in paths:
            try:
                out[path] = _cat_file(fs, path, **at_once)
            except Exception as why:
                out[path] = without_passwords(why)
        return out

    def _list(
        self,
        section: str,
        walked: Callable[[str], bool] = lambda folder: True,
        *,
        upkeep: bool = False,
    ) -> dict[str, dict[str, Any]]:
        """Path → info of every object under ``section``, from a fresh listing; on a plain
        filesystem, in the folders ``walked`` says yes to (given the folder's path in the
        section, ``ab`` or ``ab/cd``) only; for ``upkeep``, a link there leading nowhere is
        refused (:func:`~somatize.store._local_files.refuse_led_nowhere`). A folder marker
        (a zero-byte key ending in ``/``, what the S3 console's "Create folder" writes) is
        no file: it is left out."""
        where = f"{self.root}/{section}"
        self.fs.invalidate_cache(where)
        try:
            if self._atomic:
                found = self._call(f"listing {section}", self.fs.find, where, detail=True)
            else:
                # A reader takes what such a link holds for absent: a miss, never wrong.
                led = section if upkeep else ""
                walk = functools.partial(self._walk, where, walked, section=led)
                found = dict(sorted(self._call(f"listing {section}", walk).items()))
        except _ABSENT:
            return {}
        # A web server's folder is a page (its index), which fsspec finds as a file where
        # the folder holds none: the section itself, not a file in it.
        paged = where if self._on_web_server else None
        return {
            path: info
            for path, info in cast(dict[str, dict[str, Any]], found).items()
            if not path.endswith("/") and info.get("type") != "directory" and path != paged
        }

    def _walk(
        self,
        where: str,
        walked: Callable[[str], bool],
        inside: str = "",
        seen: set[tuple[int, int]] | None = None,
        section: str = "",
    ) -> dict[str, dict[str, Any]]:
        """Path → info of every file under ``where`` on a plain filesystem, in the folders
        ``walked`` says yes to (given the path of each under the first ``where``). Links are
        followed, as a directory store's walk and its readers follow them (a shard moved to
        another disk and linked); a folder reached twice (``seen``: a link back to one walked
        already) is walked once. A folder that cannot be read fails the listing
        (PermissionError), where ``find`` would leave it out, and gc take what it holds for
        unused; one gone meanwhile holds nothing."""
        seen = set() if seen is None else seen
        out: dict[str, dict[str, Any]] = {}
        try:
            here = os.stat(where)
            listed = self.fs.ls(where, detail=True)
        except FileNotFoundError:
            refuse_led_nowhere(section, where, f"{section}/{inside}".rstrip("/"))
            return out
        if (here.st_dev, here.st_ino) in seen:
            return out
        seen.add((here.st_dev, here.st_ino))
        for info in listed:
            followed = _followed(info)
            folder = f"{inside}{info['name'].rsplit('/', 1)[-1]}"
            if followed is None:
                refuse_led_nowhere(section, info["name"], f"{section}/{folder}")
                continue
            if followed.get("type") == "directory":
                if walked(folder):
                    out.update(self._walk(info["name"], walked, f"{folder}/", seen, section))
            else:
                out[info["name"]] = followed
        return out

    def _rm(self, what: str, paths: list[str]) -> None:
        """Removes ``paths``. One already gone (a gc in another thread or process removed
        it meanwhile) is gone, as asked: not an error. One that could not be removed (a
        delete refused) is a :class:`StoreError` saying so, never taken as removed."""
        if not paths:
            return
        if "s3" in self._protocols and hasattr(self.fs, "call_s3"):
            self._delete_objects(what, paths)
            return
        if any(_GLOB & set(path) for path in paths):  # fs.rm would take them for patterns
            for path in paths:
                with contextlib.suppress(*_ABSENT):
                    self._call(what, self._rm_one, path)
            return
        try:
            self._call(what, self.fs.rm, paths)
        except _ABSENT:
            for path in paths:  # some were gone; the rest one by one
                with contextlib.suppress(*_ABSENT):
                    self._call(what, self._rm_one, path)

    def _delete_objects(self, what: str, paths: list[str]) -> None:
        """Removes ``paths`` from S3 a thousand at a time. A bulk delete answers for each key
        (s3fs's ``rm`` drops what it says): a key that could not be deleted for a moment is
        asked again; one refused (``AccessDenied``: credentials that may read or write but
        not delete) or failing otherwise is said, never taken as removed."""
        delay = self.backoff
        left = list(paths)
        for attempt in range(self.retries + 1):
            failed: dict[str, tuple[str, str]] = {}
            for start in range(0, len(left), _DELETE_AT_ONCE):
                failed.update(self._delete_some(what, left[start : start + _DELETE_AT_ONCE]))
            again = [path for path, (code, _) in failed.items() if code in _DELETE_AGAIN]
            if len(again) < len(failed) or (again and attempt == self.retries):
                raise self._undeleted(what, failed, len(paths))
            if not again:
                return
            time.sleep(delay * (1 + random.random()))
            delay *= 2
            left = again

    def _delete_some(self, what: str, paths: list[str]) -> dict[str, tuple[str, str]]:
        """One bulk delete of ``paths`` (in one bucket, at most a thousand); path → (code,
        message) of each key the bucket did not delete. A key already gone is deleted."""
        failed: dict[str, tuple[str, str]] = {}
        by_bucket: dict[str, dict[str, str]] = {}
        for path in paths:
            bucket, key = self.fs.split_path(path)[:2]
            by_bucket.setdefault(bucket, {})[key] = path
        for bucket, keys in by_bucket.items():
            asked = {"Objects": [{"Key": key} for key in keys], "Quiet": True}
            try:
                answer = self._call(
                    what, self.fs.call_s3, "delete_objects", Bucket=bucket, Delete=asked
                )
            finally:
                for path in keys.values():
                    self.fs.invalidate_cache(path)
            for error in answer.get("Errors") or []:
                code = str(error.get("Code", ""))
                path = keys.get(str(error.get("Key")), f"{bucket}/{error.get('Key')}")
                if code != "NoSuchKey":
                    failed[path] = (code, str(error.get("Message", "")))
        return failed

    def _undeleted(self, what: str, failed: dict[str, tuple[str, str]], asked: int) -> StoreError:
        path, (code, message) = next(iter(failed.items()))
        refused = code == "AccessDenied"
        return StoreError(
            f"{what} on {self.url}: {len(failed)} of {asked} files could not be removed "
            f"({path}: {code} {message})"
            + (": these credentials may not delete there" if refused else "")
            + ". What was removed before is gone, the rest is as it was; run it again"
            + (" with credentials that may delete" if refused else " later")
        )

    def _rm_one(self, path: str) -> None:
        """Removes the file at ``path``; FileNotFoundError if there is none."""
        self.fs.invalidate_cache(path)
        self.fs.rm_file(path)
