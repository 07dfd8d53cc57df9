"""The bucket store: the same layout and contracts as the local store, in a bucket,
through fsspec (``s3://``, ``gs://``, ``az://``, ``memory://``, ``file://``).

A bucket is shaped by what a request costs — tens of milliseconds, where a local
``stat`` costs a microsecond — so:

- ``have(keys)`` is one batched query: a few keys are fetched concurrently (their
  records, which ``recall`` then needs anyway); many keys are answered from one
  listing of ``answers/`` and one of ``packs/``, never a request per key. A record
  listed but not yet read is believed; should its blob be gone, ``recall`` says
  Missing and the engine recomputes — never a wrong answer.
- packed item answers are found through the pack indexes (a listing and one read
  per new pack), so 100,000 items are a handful of requests. An index found damaged,
  or one whose blob was found damaged, is read again only once a listing shows another
  object there (a repair): its items are misses, and a miss costs no request for it or
  its blob.
- records and small verified blobs read once are held in memory (a read hands out
  a copy, so a recalled value written in place changes no later recall); a ``cache=``
  directory in front (a :class:`LocalStore`) holds blobs, records and indexes
  across processes, so a repeated run asks the bucket nothing it already has. A
  blob copied there is claimed in it, as the store's own writes are, until the
  record or index that refers to it is copied too: a gc of the cache leaves it.

Every blob downloaded is hashed against its digest before use. Object stores
publish an object whole when its upload completes, so writes go straight to their
place; on ``file://`` they go through ``tmp/`` and a rename as in the local store.
Transient failures (connection resets, timeouts, throttling) are retried with
exponential backoff and jitter; a request that keeps failing becomes a
:class:`StoreError` that says so. When answers were used is written as small
``used/`` logs (a bucket cannot touch an object's time), on :meth:`close` and every
1,024 recalls; ``gc`` merges them. That is advice: a log that cannot be written (a
reader without write permission) is dropped, said once at debug level, and never
fails a recall.

This module holds the store itself: how it is opened and addressed, and how it writes
and reads answers, through the cache in front. Its parts are the requests it makes,
retried, and how it publishes a file whole, in :mod:`somatize.store._bucket_requests`,
and what upkeep asks of it, with the ``used/`` logs, in
:mod:`somatize.store._bucket_upkeep`.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from pathlib import Path
from typing import IO, Any, cast
from urllib.parse import unquote, urlsplit

from somatize import canonical
from somatize._numbers import finite
from somatize.store._bucket_requests import _ABSENT, BucketNotes, _open_file, _under_copies
from somatize.store._bucket_upkeep import BucketShelf, version_of
from somatize.store._credentials import (
    guarded,
    held_url,
    kind_given,
    mask_passwords_in_logs,
    masked,
    plain,
)
from somatize.store._local_files import new_file, open_file
from somatize.store._packed import Claims, digest_of, frozen, hash_bytes, nbytes, pieces_of
from somatize.store.base import (
    READ_ONLY_BUCKET,
    Answer,
    BadAddress,
    BadName,
    Buffer,
    Corrupt,
    Missing,
    NameNotFound,
    StoreError,
    case_clash,
    check_bindable,
    check_digest,
    check_name,
    current_directory,
    inside_a_section,
    keys_of,
    names_above,
    nested,
    no_directory_to_read,
    section_above,
    spelled_otherwise,
    unbacked,
    unbound,
    unmarked,
)
from somatize.store.local import LocalStore, no_home
from somatize.store.records import (
    PackIndex,
    Signer,
    decode_name,
    decode_record,
    encode_name,
    signer_from,
)
from somatize.store.upkeep import SECTIONS

__all__ = ["BucketStore"]

KEY_BYTES = 1024
"""The longest key an object store (S3, Google Cloud Storage, Azure) holds, in bytes of
UTF-8: a name's file, under the store's prefix, must fit."""
_FETCH_BELOW = 32
"""Up to this many unknown keys, ``have`` fetches their records; beyond, it lists."""

_HOLD_BELOW = 1 << 16
"""Blobs up to this size are held in memory once downloaded."""

_CACHE_MARK = "bucket"
"""The file in a cache folder naming the bucket store it caches: its bucket and prefix, and
the server, when the options name one (``s3://bkt/pre at http://host:9000``)."""

_MARK_WAIT = 1.0
"""Seconds a cache's mark found incomplete is waited on: another process is writing it."""


_S3_BUCKET = re.compile(r"[a-zA-Z0-9._-]{1,255}")
"""What an S3 client sends as a bucket's name: letters, digits, dots, hyphens and
underscores. Buckets made now take fewer (3 to 63 lowercase letters, digits, dots and
hyphens), but older buckets and S3-compatible servers hold others (`Legacy_Bucket`), and
those are reached as they are."""


def _check_bucket(url: str, bucket: str) -> None:
    """Refuses an S3 URL that names no bucket an S3 client can ask for, before any
    request: the client would refuse every one of them, as a parameter it cannot send."""
    if bucket.startswith("arn:"):  # an access point, named by its ARN
        return
    if not bucket:
        raise BadAddress(
            f"{url!r} names no bucket: an S3 store lies in one, as `s3://bucket/prefix`"
        )
    if not _S3_BUCKET.fullmatch(bucket):
        raise BadAddress(
            f"{url!r} names the bucket `{bucket}`, which S3 cannot have: a bucket's name is "
            "letters, digits, dots, hyphens and underscores (one made now: 3 to 63 lowercase "
            "letters, digits, dots and hyphens)"
        )


def _on_s3(url: str) -> bool:
    """Whether ``url`` names a store on S3 (``s3://``, ``s3a://``)."""
    return url.split("://", 1)[0] in ("s3", "s3a")


def _opened_with(url: str, storage_options: Mapping[str, Any]) -> dict[str, Any]:
    """The options the filesystem of ``url`` is opened with: ``storage_options``, and on S3
    the client's own retrying of a request turned off unless they (or ``AWS_MAX_ATTEMPTS``)
    set it. A store's ``retries`` and ``backoff`` then say alone how often a request that
    keeps failing is made: botocore's retries, and s3fs's around them, would each make it
    five times for every one of the store's (a refused endpoint took half a minute).

    In every home, the filesystem's cache of listings is turned off, whatever the options
    say: s3fs keeps the listing of each folder a listing walked (a gc's, a verify's, a
    ``have`` of many keys) and takes a file missing from it for absent from then on,
    without asking the bucket, so a record, blob or name another process wrote there
    later would be a miss to this store object, damage to its verify, and nothing to keep
    to its gc. Of a chained URL (``simplecache::s3://…``) each filesystem is opened so,
    the inner ones with the options fsspec hands them (those under their protocol), and
    an inner S3 layer's client retries nothing either."""
    options = {**storage_options, "use_listings_cache": False}
    protocols = _protocols_of(url)
    for protocol in protocols[1:]:
        inner = options.get(protocol)
        options[protocol] = {
            **(inner if isinstance(inner, Mapping) else {}),
            "use_listings_cache": False,
        }
    for at, protocol in enumerate(protocols):
        if protocol in ("s3", "s3a"):
            _one_attempt(options if at == 0 else options[protocol])
    return options


def _one_attempt(options: dict[str, Any]) -> None:
    """Turns the S3 client's own retrying off in ``options``, unless they (or
    ``AWS_MAX_ATTEMPTS``) set it; see :func:`_opened_with`."""
    config = options.get("config_kwargs")
    if isinstance(config, Mapping) and "retries" in config:
        return
    chosen = "AWS_MAX_ATTEMPTS" in os.environ
    if not chosen and (config is None or isinstance(config, Mapping)):
        options["config_kwargs"] = {**(config or {}), "retries": {"total_max_attempts": 1}}


def _protocols_of(url: str) -> list[str]:
    """The protocol of each layer of ``url``, outermost first (``simplecache::s3://…``:
    ``simplecache``, ``s3``): the options under one's name are that layer's."""
    return [layer.split("://", 1)[0] for layer in url.split("::")]


def _server_of(url: str, storage_options: Mapping[str, Any]) -> str | None:
    """The server the bucket is reached at, where the options name one (an S3-compatible
    server's ``endpoint_url``, given as an option or in ``client_kwargs``; an Azure
    ``account_name``) or, on S3, the environment does (``AWS_ENDPOINT_URL_S3``,
    ``AWS_ENDPOINT_URL``); None for the default one. A password in it is masked: the
    cache folder's file names the server, and an error names what that file holds."""
    client = storage_options.get("client_kwargs")
    for option in ("endpoint_url", "account_name"):
        for given in (storage_options, client if isinstance(client, Mapping) else {}):
            value = given.get(option)
            if value:
                return masked(str(value))
    if _on_s3(url):
        named = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return None if named is None else masked(named)
    return None


def _check_s3_path(url: str) -> None:
    """Refuses an S3 URL that names no bucket before its prefix (``s3:///pre``, which the
    client reads as the bucket ``pre``), or whose prefix holds an empty, ``.`` or ``..``
    segment (``s3://bkt//pre``): S3 takes such a key as it is, so the store would lie
    elsewhere than the URL seems to say. One ``/`` at the end is the same prefix."""
    bucket, _, prefix = url.split("://", 1)[1].partition("/")
    _check_bucket(url, bucket)
    if not prefix:
        return
    segments = prefix.removesuffix("/").split("/")
    odd = next((s for s in segments if s in ("", ".", "..")), None)
    if odd is not None:
        raise BadAddress(
            f"{url!r} holds a segment that is empty, `.` or `..` ({odd!r}) in its prefix: S3 "
            "keeps such a key as it is, in another prefix than the URL seems to say. Spell "
            "the prefix plainly (`s3://bucket/a/b`)"
        )


_S3_MAPPINGS = {
    "client_kwargs": "keyword arguments for the S3 client, as "
    '`client_kwargs={"endpoint_url": "http://localhost:9000"}`',
    "config_kwargs": "settings of the client's botocore Config, as "
    '`config_kwargs={"signature_version": "s3v4"}`',
    "s3_additional_kwargs": "arguments added to each request, as "
    '`s3_additional_kwargs={"ServerSideEncryption": "AES256"}`',
}
"""The S3 options that are dicts, and what each holds."""

_S3_TEXTS = ("key", "secret", "token", "username", "password", "profile")
"""The S3 options that are text (or None): credentials, and the profile that names them."""

_S3_CLIENT_TEXTS = (
    "region_name",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
)
"""What ``client_kwargs`` holds that is text (or None)."""

_SHOWN = ("profile", "region_name")
"""The text options whose value an error shows: the others are credentials."""


def _s3_layers(url: str, storage_options: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The options each S3 layer of ``url`` is opened with, and the protocol an error names
    them under: the first layer's are those given bare over those under its protocol, as
    fsspec hands them, named bare; an inner layer's (``simplecache::s3://…``) are those
    under its protocol (``s3={…}``), named so."""
    layers: list[tuple[str, Mapping[str, Any]]] = []
    for at, protocol in enumerate(_protocols_of(url)):
        if protocol not in ("s3", "s3a"):
            continue
        inner = storage_options.get(protocol)
        inner = inner if isinstance(inner, Mapping) else {}
        if at > 0:
            layers.append((protocol, inner))
            continue
        bare = {name: value for name, value in storage_options.items() if name != protocol}
        layers.append(("", {**inner, **bare}))
    return layers


def _named(under: str, option: str) -> str:
    """What an error calls ``option``, given bare (``under`` empty) or under a layer's
    protocol (``s3['secret']``)."""
    return f"{under}[{option!r}]" if under else option


def _check_s3_kinds(options: Mapping[str, Any], under: str = "") -> None:
    """Refuses an S3 option that is another kind of value than the client takes (a dict
    given as a str, a key as an int), naming it, before any request: the client would fail
    at the first one with a bare AttributeError or TypeError, or sign with it as it is. A
    credential's value is never said."""
    for option, holds in _S3_MAPPINGS.items():
        value = options.get(option)
        if value is not None and not isinstance(value, Mapping):
            said = _named(under, option)
            raise BadAddress(f"{said} is {_described(value)}: it is a dict of {holds}")
    client = options.get("client_kwargs") or {}
    in_client = _named(under, "client_kwargs")
    given = [(_named(under, option), option, options.get(option)) for option in _S3_TEXTS]
    given += [
        (f"{in_client}[{option!r}]", option, client.get(option)) for option in _S3_CLIENT_TEXTS
    ]
    for said, option, value in given:
        if value is not None and not isinstance(value, str):
            shown = f"{value!r}, " if option in _SHOWN else ""
            raise BadAddress(
                f"{said} is {shown}a `{kind_given(value).__name__}`: the S3 client takes it as "
                "text; pass it as a str"
            )


_SSE_C_KEYS = ("SSECustomerKey", "CopySourceSSECustomerKey")
"""The options of ``s3_additional_kwargs`` that are a customer-provided encryption key."""


def _refuse_lost_encryption_key(url: str, storage_options: Mapping[str, Any]) -> None:
    """Refuses to open the filesystem of a store loaded from a pickle, which carries no
    SSE-C key (``s3_additional_kwargs={"SSECustomerKey": …}``), saying how to give it: no
    process reads one from its environment, so every request would fail with the client's
    "Invalid type for parameter SSECustomerKey"."""
    for under, options in _s3_layers(url, storage_options):
        added = options.get("s3_additional_kwargs")
        if not isinstance(added, Mapping):
            continue
        lost = [name for name in _SSE_C_KEYS if name in added and added[name] is None]
        if lost:
            said = f"{_named(under, 's3_additional_kwargs')}[{lost[0]!r}]"
            raise StoreError(
                f"{url} holds no SSE-C key ({said} is None): a store pickled (a model saved "
                "with it, one sent to a Ray worker) carries none, as it carries no other "
                "credential. Open the store in this process with the key, "
                f"`Store.on_bucket({url!r}, s3_additional_kwargs={{{lost[0]!r}: …}})`, or "
                "from `store.address()`, which holds it"
            )


def _described(value: object) -> str:
    """What an error says ``value`` is: a number as it is, anything else by its kind and
    size alone, as its text or items may hold a credential (a dict of options given as
    text, ``"{'secret': …}"``)."""
    kind = f"a `{type(value).__name__}`"
    if isinstance(value, (int, float)):
        return f"{value!r}, {kind}"
    if not isinstance(value, Sized):
        return kind
    size = len(value)
    unit = "character" if isinstance(value, str) else "byte" if isinstance(value, bytes) else "item"
    return f"{kind} of {size} {unit}{'' if size == 1 else 's'}"


def _check_ca_bundle(options: Mapping[str, Any], under: str = "") -> None:
    """Refuses a CA bundle named for the S3 client (``client_kwargs={"verify": path}``, else
    ``AWS_CA_BUNDLE``) that is no file, naming it, before any request: the client reads it
    before it connects, and its bare "No such file or directory" would be taken for the
    bucket unreachable. One its config file names is said at the first request."""
    client = options.get("client_kwargs") or {}
    named, bundle = f"{_named(under, 'client_kwargs')}['verify']", client.get("verify")
    if bundle is None:  # the client reads AWS_CA_BUNDLE only then
        named, bundle = "AWS_CA_BUNDLE", os.environ.get("AWS_CA_BUNDLE")
    if isinstance(bundle, str) and bundle and not os.path.isfile(bundle):
        raise StoreError(
            f"{named} names {bundle!r}, which is no file: the S3 client reads the "
            "certificates it trusts from it before any request. Point it at a CA bundle (a "
            "PEM file), or leave it unset to trust the default ones"
        )


def _check_endpoint(options: Mapping[str, Any], under: str = "") -> None:
    """Refuses an S3 endpoint that is no http(s) URL with a host, naming the option, before
    any request: the client would raise a bare ValueError at the first one. One the
    client takes from the environment, where no option names one, is refused where it
    holds a password for a client that signs (:func:`_refuse_password`)."""
    client = options.get("client_kwargs")
    given = [(_named(under, "endpoint_url"), options.get("endpoint_url"))]
    if isinstance(client, Mapping):
        in_client = _named(under, "client_kwargs")
        given.append((f"{in_client}['endpoint_url']", client.get("endpoint_url")))
    if all(value is None for _, value in given):
        _refuse_password(*_endpoint_from_environment(), options)
    for option, value in given:
        if value is None:
            continue
        parts = urlsplit(value) if isinstance(value, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadAddress(
                f"{option} is {_shown(value)}, which is no endpoint: an S3-compatible server is "
                "reached at an http(s) URL with a host, as `http://localhost:9000` or "
                "`https://s3.example.com`"
            )
        _refuse_password(option, value, options)


def _mask_logs_naming(url: str, storage_options: Mapping[str, Any]) -> None:
    """Has the S3 client's records mask a password (:func:`mask_passwords_in_logs`) where
    the store's URL, its options (an endpoint given in ``client_kwargs``) or the endpoint
    the environment names hold one (``http://user:password@host``): its own DEBUG records
    name the endpoint, password and all."""
    texts = [str(url), repr(storage_options), _endpoint_from_environment()[1] or ""]
    if any(masked(text) != text for text in texts):
        mask_passwords_in_logs()


def _endpoint_from_environment() -> tuple[str, str | None]:
    """The variable the S3 client takes its endpoint from where no option names one, and
    its value (None where neither is set): ``AWS_ENDPOINT_URL_S3`` over
    ``AWS_ENDPOINT_URL``; neither where the client is told to ignore them."""
    if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
        return "AWS_ENDPOINT_URL", None
    for variable in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(variable):
            return variable, os.environ[variable]
    return "AWS_ENDPOINT_URL", None


def _refuse_password(option: str, value: str | None, options: Mapping[str, Any]) -> None:
    """Refuses endpoint ``value`` (named ``option``) where its URL holds a user and
    password and the client opened with ``options`` signs its requests."""
    try:
        parts = urlsplit(value) if isinstance(value, str) else None
    except ValueError:  # no URL: the client says so as it is made
        return
    if parts is None or not (parts.username or parts.password) or not _signs(options):
        return
    raise BadAddress(
        f"{option} is {_shown(value)}, which holds a user and password: the S3 "
        "client signs each request with its key and secret, and its HTTP client "
        "refuses to send a password in the URL beside that signature, every time. "
        "Drop the `user:password@` from the endpoint and give the key and secret "
        "as `key=` and `secret=`, or open the bucket with `anon=True` where the "
        "server takes the password alone"
    )


def _signs(options: Mapping[str, Any]) -> bool:
    """Whether an S3 client opened with ``options`` signs its requests: unless it is
    anonymous (``anon=True``, or ``config_kwargs={"signature_version": UNSIGNED}``)."""
    botocore = sys.modules.get("botocore")  # loaded with s3fs, which the S3 layer is
    marker = getattr(botocore, "UNSIGNED", None)
    config = options.get("config_kwargs")
    unsigned = isinstance(config, Mapping) and config.get("signature_version") is marker
    unsigned = unsigned and marker is not None
    return not (options.get("anon") or unsigned)


def _shown(value: object) -> str:
    """How an error shows an endpoint given: as it is, a password in it masked."""
    return repr(masked(value)) if isinstance(value, str) else repr(value)


_PROTOCOL_LIKE = re.compile(r"[a-z]*")
"""A layer of a chained URL that fsspec takes as a protocol's name (``simplecache``), not
as a path on this machine."""


def _on_this_machine(layers: Sequence[str], at: int) -> tuple[str | None, str] | None:
    """The protocol (None for a bare path) and the path of layer ``at`` of a chained URL
    where it names a path on this machine (a ``file://`` or ``local://`` layer, or a bare
    path after ``::``, as in ``zip://::store.zip``); None for any other layer."""
    from fsspec.core import split_protocol
    from fsspec.registry import available_protocols

    layer = layers[at]
    protocol, path = split_protocol(layer)
    if protocol is None:
        if at == 0 or _PROTOCOL_LIKE.fullmatch(layer) or layer in available_protocols():
            return None
    elif protocol not in ("file", "local"):
        return None
    return protocol, path


def file_path(path: str) -> str:
    """The path on this machine that the path of a ``file://`` or ``local://`` URL names:
    its percent escapes decoded, as a URL means them (``Path.as_uri()`` writes a space as
    ``%20``, and each byte of a non-ASCII letter so), to the bytes this system names files
    by. fsspec takes them as they are, and would keep the store in a folder named
    ``my%20store``."""
    return unquote(path, errors="surrogateescape")


def _anchored(url: str) -> str:
    """``url`` with each path on this machine it names (a ``file://`` or ``local://`` layer,
    or a bare path after ``::``, as in ``zip://::store.zip``) made absolute where fsspec
    takes it from now, ``~`` expanded: a relative one would otherwise be taken from the
    working directory of each process that opens the store by its address (a worker, a
    writer), or of this one after an ``os.chdir``, and reach another folder. A home this
    system does not know is refused, as a local store's is.

    A ``file://`` or ``local://`` layer is decoded (:func:`file_path`) and written again as
    ``Path.as_uri()`` writes it, so the URL kept, and carried in the store's address, names
    the same folder however often it is opened again. Such a path is the last layer of a
    chain, since fsspec reads ``::`` as joining filesystems: a path holding ``::`` is refused,
    as it would name another folder than it seems to."""
    from fsspec.implementations.local import make_path_posix

    layers = url.split("::")
    for at in range(len(layers)):
        local = _on_this_machine(layers, at)
        if local is None:
            continue
        protocol, path = local
        named = path if protocol is None else file_path(path)
        if at < len(layers) - 1 or "::" in named:
            raise BadAddress(
                f"{url!r} names a path on this machine that holds `::`, which fsspec reads as "
                "joining filesystems (`simplecache::file:///data/store`): it would open "
                "another folder than the one named, or none. Open a directory whose name "
                "holds `::` as a local store, `Store('/data/a::b')`; a file:// layer is the "
                "last of a chained URL"
            )
        if "\x00" in named:  # an escape, `%00`, decoded: no file's name holds it
            raise BadAddress(
                f"{url!r} names a path on this machine holding a NUL character (`%00`), which "
                "no file or folder name can hold: name the folder without it"
            )
        if not os.path.isabs(named) and not named.startswith("~"):
            current_directory(url)  # refused, saying so, where it is gone
        anchored = make_path_posix(named)
        if not os.path.isabs(anchored):  # `~user` of no user this system knows
            raise no_home(url, path)
        if named != path:
            _not_kept_as_written(url, anchored, make_path_posix(path))
        if protocol is None:
            layers[at] = anchored
        else:
            layers[at] = f"{protocol}://{Path(anchored).as_uri().removeprefix('file://')}"
    return "::".join(layers)


def _not_kept_as_written(url: str, decoded: str, written: str) -> None:
    """Refuses ``url`` where the folder its escapes decode to (``decoded``) is not there
    while the one its escapes, taken as they are written, name (``written``) is: a store
    kept there before a ``file://`` path was decoded would be left for an empty one."""
    if os.path.lexists(decoded) or not os.path.lexists(written):
        return
    raise BadAddress(
        f"{url!r} names {decoded!r} (its percent escapes decoded, as a URL means them), "
        f"which is not there, while {written!r}, which its escapes name taken as written, "
        "is (a store kept there before file:// paths were decoded would be left for an "
        f"empty one). Open that one as a local store, `Store({written!r})`, or write each "
        "`%` of its name as `%25` in the URL; or rename the folder to the name decoded"
    )


def _refuse_asynchronous(url: str, storage_options: Mapping[str, Any]) -> None:
    """Refuses options that open a filesystem (or a layer of a chained URL) for awaiting.
    A store calls it from the calling thread and waits for each answer there, which such a
    filesystem cannot give: every request would fail with fsspec's "Loop is not running"."""
    # fsspec hands each layer the options given by its protocol, the first layer too
    # (`s3={...}` for `s3://`), and the first the options given bare besides.
    layers = [storage_options, *(storage_options.get(p) for p in _protocols_of(url))]
    if any(isinstance(options, Mapping) and options.get("asynchronous") for options in layers):
        raise BadAddress(
            f"{url} is opened with asynchronous=True, but a store makes its requests and "
            "waits for their answers on the thread that calls it, which a filesystem made "
            "for awaiting cannot serve: drop it. Inside an event loop (an async server, a "
            "notebook), run the forward on another thread, `await asyncio.to_thread("
            "g.forward, x, store=store)`, to keep the loop free"
        )


_EVERY_FILESYSTEM_TAKES = frozenset(
    {"use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache"}
)
"""The options fsspec's base filesystem reads itself, whatever the filesystem."""


def _refuse_dropped(url: str, storage_options: Mapping[str, Any]) -> None:
    """Refuses an option given bare for a chained URL whose outer layer keeps copies
    (``simplecache::s3://…``) and takes no such option, naming where it belongs: fsspec
    hands the bare options to that layer, which drops those it does not take, so a
    misspelled option, or the bucket's own (``key=``, ``client_kwargs=``), would be lost
    without a word, and the store opened with the environment's credentials and endpoint."""
    import inspect

    from fsspec.implementations.cached import CachingFileSystem
    from fsspec.registry import get_filesystem_class

    protocols = _protocols_of(url)
    if len(protocols) < 2:
        return
    try:
        outer = get_filesystem_class(protocols[0])
    except (ImportError, ValueError):
        return  # said as the filesystem is made
    if not issubclass(outer, CachingFileSystem):
        return
    takes = set(_EVERY_FILESYSTEM_TAKES).union(protocols)
    for kind in outer.__mro__:
        if "__init__" in vars(kind):
            named = inspect.signature(kind.__init__).parameters.values()
            takes.update(
                p.name for p in named if p.kind is p.KEYWORD_ONLY or p.default is not p.empty
            )
    dropped = sorted(set(storage_options) - takes)
    if dropped:
        raise BadAddress(
            f"{url} is opened with {dropped} given bare, which fsspec hands to its outer "
            f"layer, `{protocols[0]}`, which takes no such option and would drop it "
            f"unused: give the options of the layer they are for under its protocol, as "
            f"`{protocols[-1]}={{{dropped[0]!r}: …}}`, and check their spelling"
        )


def _for_fsspec(url: str) -> str:
    """``url`` (as :func:`_anchored` wrote it) as fsspec takes it: each ``file://`` or
    ``local://`` path decoded, since fsspec does not decode one."""
    layers = url.split("::")
    for at in range(len(layers)):
        local = _on_this_machine(layers, at)
        if local is not None and local[0] is not None:
            layers[at] = f"{local[0]}://{file_path(local[1])}"
    return "::".join(layers)


def _read_mark(mark: str) -> str | None:
    """What the cache mark at ``mark`` holds; None when there is none. One being written by
    another process (no line end yet) is read again until it is whole, for a moment."""
    until = time.monotonic() + _MARK_WAIT
    while True:
        try:
            with open_file(mark, "rb") as handle:
                data = handle.read(1 << 16)
        except FileNotFoundError:
            return None
        except OSError as why:
            raise StoreError(f"cannot read {mark}, which binds its cache folder: {why}") from why
        if data.endswith(b"\n") or time.monotonic() > until:
            return data.decode("utf-8", "replace")
        time.sleep(0.01)


def _mask_mark(mark: str, address: str) -> None:
    """Puts ``address``, the one the cache mark at ``mark`` names with a password, in its
    place whole; left as it is where the folder cannot be written (a read-only cache)."""
    part = _mark_beside(mark, f"{address}\n".encode())
    if part is None:
        return
    try:
        os.replace(part, mark)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(part)


def _mark_beside(mark: str, data: bytes) -> str | None:
    """A file of its own beside the cache mark at ``mark``, holding ``data``, to be put in
    its place; None where the folder cannot be written."""
    try:
        fd, part = new_file(os.path.dirname(mark), f".{_CACHE_MARK}.", ".part")
    except OSError:
        return None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(part)
        return None
    return part


def _write_mark(mark: str, address: str) -> bool:
    """Writes the cache mark at ``mark`` naming ``address``, whole, unless one is there
    already (written by another process meanwhile); False when the folder cannot be
    written (a read-only cache)."""
    data = f"{address}\n".encode()
    part = _mark_beside(mark, data)
    if part is None:
        return False
    try:
        try:
            os.link(part, mark)  # published whole, and never over another's
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links: made only if absent
            try:
                made = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return True
            try:
                with os.fdopen(made, "wb") as handle:
                    handle.write(data)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(mark)  # this process's own, never whole
                raise
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(part)
    return True


def _with_urls_as(kind: Callable[[str], str], state: dict[str, Any]) -> dict[str, Any]:
    """``state``, a bucket store's, its URL and root (which may hold a password) made
    ``kind``."""
    for name in ("url", "root"):
        if isinstance(state.get(name), str):
            state[name] = kind(state[name])
    return state


def _bind_cache(cache: LocalStore, address: str) -> bool:
    """Binds the cache folder of ``cache`` to the bucket store at ``address``: a folder not
    yet bound (new, or made before folders were bound) is bound now; one bound to another
    address is refused with :class:`BadAddress`, since its answers are another store's.
    False where the folder is left unbound, its file not written (a read-only or full
    disk): nothing is copied into it until it is bound."""
    mark = os.path.join(cache.root, _CACHE_MARK)
    bound = _read_mark(mark)
    if bound is None and _write_mark(mark, address):
        bound = _read_mark(mark)
    if bound is None:
        return False
    if bound == f"{address}\n":
        return True
    if bound.endswith("\n") and masked(bound[:-1]) == address:
        # Bound to this store before a password in its endpoint was masked: that file
        # names it with the password, which is taken off the disk.
        _mask_mark(mark, address)
        return True
    if not bound.endswith("\n"):
        raise BadAddress(
            f"the cache folder {cache.root} names no bucket store whole in {mark} (a process "
            f"was stopped while writing it): remove that file if the folder caches "
            f"{address!r} alone, or give this store a cache folder of its own"
        )
    raise BadAddress(
        f"the cache folder {cache.root} is bound to the bucket store {bound[:-1]!r} (it holds "
        f"that store's answers, found by key alone), not to {address!r}: give each bucket "
        "store (each bucket and prefix, on each server) its own cache folder"
    )


def _unread_archive(error: Exception) -> bool:
    """Whether ``error``, raised as a URL's filesystem was made, is what reading a zip or
    tar archive's table of files raises where the file is cut short or is no such archive
    (a gzip stream ending early raises EOFError, a damaged one zlib's or lzma's error),
    which fsspec lets through as it opens the archive."""
    import lzma
    import tarfile
    import zipfile
    import zlib

    return isinstance(
        error, tarfile.TarError | zipfile.BadZipFile | EOFError | zlib.error | lzma.LZMAError
    )


def _made_without(error: TypeError) -> bool:
    """Whether ``error``, raised as a URL's filesystem was made, says it was made without
    an argument it needs (``reference://`` without ``fo=``: "missing 1 required positional
    argument") or with one it does not take (a mistyped storage option): what the store was
    opened with, not a fault of code."""
    said = str(error)
    return (
        "required positional argument" in said
        or "required keyword-only argument" in said
        or "unexpected keyword argument" in said
    )


class BucketStore(BucketShelf):
    """A store under ``url`` in a bucket; see the module docstring.

    ``cache`` is a local directory kept in front as a read-through cache; ``signing_key``
    (default ``$SOMATIZE_STORE_KEY``) signs records, names and indexes; ``retries`` and
    ``backoff`` (seconds, doubled each time) shape the retrying of transient failures;
    ``read_only=True`` (for credentials that may only read) writes and removes nothing,
    and refuses a forward that would keep an answer before it computes one, with no
    request made to learn that writes are refused; the rest goes to the fsspec
    filesystem."""

    _sections: tuple[str, ...] = (*SECTIONS, "used")
    _cache_bound = False
    """Whether the cache folder in front is bound to this store (see :meth:`_fill_cache`)."""

    def __init__(
        self,
        url: str,
        *,
        cache: str | os.PathLike[str] | None = None,
        signing_key: str | bytes | Signer | None = None,
        retries: int = 5,
        backoff: float = 0.05,
        read_only: bool = False,
        **storage_options: Any,
    ) -> None:
        self._open_read_only(read_only)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise BadAddress(f"retries is a count ≥ 0 of requests made again, got {retries!r}")
        if not (finite(backoff) and backoff >= 0):
            raise BadAddress(
                f"backoff is finite seconds ≥ 0 (waited before a retry, doubled each time), "
                f"got {backoff!r}"
            )
        try:
            from fsspec.core import url_to_fs
        except ImportError:  # pragma: no cover - depends on the environment
            raise StoreError(
                "a bucket store needs fsspec (and s3fs for s3://): pip install 'somatize[s3]'"
            ) from None
        if not isinstance(url, str):
            raise TypeError(
                f"a bucket is opened at its URL, a str such as `s3://bucket/prefix`, got a "
                f"`{type(url).__name__}`; for a directory use `Store(path)`"
            )
        if "://" not in url:
            raise BadAddress(
                f"a bucket is opened at a URL with its protocol, as `s3://bucket/prefix`, and "
                f"{url!r} has no `://`: fsspec would take it as a path on this machine, "
                "relative to the working directory, and keep there what was meant for the "
                "bucket. Spell the URL whole; for a directory use `Store(path)`"
            )
        if isinstance(url, str) and "\x00" in url:
            raise BadAddress(
                f"{url!r} holds a NUL character, which no file or object name can: pass the "
                "URL as it is written"
            )
        if isinstance(url, str):
            url = _anchored(url)
        _refuse_asynchronous(url, storage_options)
        _refuse_dropped(url, storage_options)
        _mask_logs_naming(url, storage_options)
        self.url = url
        storage_options = guarded(storage_options, _protocols_of(url))
        self.storage_options = storage_options
        """What the filesystem was opened with (to open the same store again), its
        credentials held so that a plain pickle carries none (see ``_credentials``)."""
        try:
            fs, root = url_to_fs(_for_fsspec(url), **_opened_with(url, storage_options))
            self.fs = self._without_own_retries(fs)
        except (ImportError, ValueError) as why:
            raise StoreError(
                f"cannot open {url} as a bucket store: {why}. For s3:// install s3fs "
                "(pip install 'somatize[s3]'); gs:// needs gcsfs, az:// adlfs"
            ) from why
        except OSError as why:  # an archive (zip://, tar://) its file cannot be read of
            raise StoreError(
                f"cannot open {url} as a store: its filesystem could not be opened ({why}); "
                "nothing was opened. Check the URL: a store in an archive names the archive "
                "after `::`, as `zip://store::file:///data/store.zip`"
            ) from why
        except TypeError as why:
            if not _made_without(why):
                raise  # a fault of code, not of what the store is opened with
            raise StoreError(
                f"cannot open {url} as a bucket store: its filesystem cannot be made from "
                f"the URL and the storage options given ({why}); nothing was opened. Pass "
                "what it needs as storage options to `Store.on_bucket` (the `somatize` "
                "command passes none), or name an s3://, gs:// or az:// bucket"
            ) from why
        except Exception as why:
            if not _unread_archive(why):
                raise
            compressed = (
                ": a compressed tar is read where its name says how (`.tar.gz`, `.tar.bz2`, "
                "`.tar.xz`), or opened with `Store.on_bucket(url, tar={'compression': 'gzip'})`"
                if str(url).startswith("tar:")
                else ""
            )
            raise StoreError(
                f"cannot open {url} as a store: its archive cannot be read "
                f"({type(why).__name__}: {why}); nothing was opened. It is cut short (copied "
                "or packed while it was written), or no archive of the kind the URL names"
                f"{compressed}"
            ) from why
        self.root = str(root).rstrip("/")
        # What the store lies in is the filesystem under a layer of copies: a directory
        # named through `simplecache::file://` is a directory still, renamed into and
        # written through tmp/, in no bucket.
        protocol = _under_copies(self.fs).protocol
        self._protocols = set((protocol,) if isinstance(protocol, str) else protocol)
        if self._protocols & {"s3", "s3a"}:
            if "://" in url and "::" not in url:
                _check_s3_path(url)
            _check_bucket(url, self.root.lstrip("/").split("/", 1)[0])
            for under, options in _s3_layers(url, storage_options):
                _check_s3_kinds(options, under)
                _check_endpoint(options, under)
                _check_ca_bundle(options, under)
        self.signer: Signer | None = signer_from(signing_key)
        self.retries = retries
        self.backoff = backoff
        if self._in_archive("read") is not None:
            self.root = self._packed_root()
        # A prefix inside another store's names/, each file under which that store reads as
        # a name (one listing per part of the prefix so named, none for another). Its other
        # sections are listed at the depth it writes in, and what lies deeper left alone.
        found = section_above(self.root.split("/"), ("names",), self._may_hold_store, "/".join)
        if found is not None:
            raise inside_a_section(url, (self.fs.unstrip_protocol(found[0]), found[1]))
        if not self._atomic:  # writes go through tmp/, which a fresh directory lacks
            if self.read_only and not self._call(f"looking for {url}", self.fs.isdir, self.root):
                raise no_directory_to_read(url)
            # Looked at again where it is no fresh folder: what made it none may be a store
            # that another process opening it at once (a worker, a rank) made since.
            if self._store_kind() is None and not self._fresh() and self._store_kind() is None:
                # A directory holding files but no store, which may be a user's: nothing is
                # made there, as a local store's open refuses it.
                raise unmarked(url, "it holds files but no store", "open a store at", BadAddress)
            try:
                if not self.read_only:
                    self.fs.makedirs(self._path("tmp", ""), exist_ok=True)
            except OSError as why:
                raise StoreError(f"cannot use {url} as a store: {why}") from why
        self.cache: LocalStore | None = self._cache_at(cache) if cache is not None else None
        self._hold_nothing()
        self._noted = BucketNotes()
        if not self._atomic:  # a directory is made a store as it is opened, as a local one
            if self._store_kind() in (None, "clear") and not self.read_only:
                self._mark()
            self._noted.marked = True

    _read_so_far = (*BucketShelf._read_so_far, "_packs_seen")

    def _hold_nothing(self) -> None:
        self._packs_seen = False
        """Whether the pack indexes were loaded once (see :meth:`_look_at_packs`)."""
        super()._hold_nothing()

    def __repr__(self) -> str:
        read_only = ", read_only=True" if self.read_only else ""
        return f"Store.on_bucket({self._where!r}{read_only})"

    def __getstate__(self) -> dict[str, Any]:
        # A password in the URL (`ftp://user:password@host/…`) is a credential: a plain
        # pickle writes the URL without it, a copy in this process or one multiprocessing
        # makes keeps it (see _credentials).
        state = super().__getstate__()
        return _with_urls_as(held_url, state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(_with_urls_as(str, state))
        # A process the store is sent to (a spawned DataLoader worker, its password kept)
        # logs through a client of its own, which names the endpoint as the opener's did.
        _mask_logs_naming(self.url, plain(self.storage_options, _protocols_of(self.url)))

    @property
    def _where(self) -> str:
        """The URL as the store names it: a password in it masked."""
        return masked(self.url)

    @property
    def _sweeps_strays(self) -> bool:
        return not self._atomic  # under a bucket's prefix they are a user's

    def _packed_root(self) -> str:
        """Where the store in an archive lies: at the prefix named, or, where that holds no
        store, at the same prefix under ``.`` where that holds one. ``tar -C store .`` (as
        a store is packed from its own folder) names its files ``./blobs/…``, so the
        archive's root holds ``.`` alone, and ``tar cf store.tar ./store`` names them
        ``./store/blobs/…``."""
        dotted = f"./{self.root}".rstrip("/")
        if self._holds_store() or not self._holds_store(dotted):
            return self.root
        return dotted

    def _may_hold_store(self, root: str) -> bool:
        """Whether ``root`` holds a store, as far as these credentials may list it: one
        allowed only this store's prefix opens it."""
        try:
            return self._holds_store(root)
        except (PermissionError, StoreError):
            return False

    def _open_fs(self) -> Any:
        from fsspec.core import url_to_fs

        _refuse_lost_encryption_key(self.url, self.storage_options)
        fs = url_to_fs(_for_fsspec(self.url), **_opened_with(self.url, self.storage_options))[0]
        return self._without_own_retries(fs)

    def _without_own_retries(self, fs: Any) -> Any:
        """``fs``, making each request once where it would retry it itself (s3fs: five
        times), so that ``retries`` says how often it is made; see :func:`_opened_with`."""
        inner = _under_copies(fs)  # a chained URL's S3 layer
        if {"s3", "s3a"} & set(_protocols_of(self.url)) and hasattr(inner, "retries"):
            inner.retries = 1
        return fs

    # -- address ------------------------------------------------------------------------------

    def address(self) -> dict[str, Any] | None:
        """The URL, the storage options, how requests are retried, and the fingerprint of the
        signing key — not the ``cache``, a directory of this process. None when the options
        are not canonical values (a live filesystem or session object) or the bucket is
        ``memory://``, which lives in this process alone."""
        if "memory" in self._protocols:
            return None
        options = plain(self.storage_options, _protocols_of(self.url))
        if not canonical.is_canonical(options):
            return None
        return {
            "home": READ_ONLY_BUCKET if self.read_only else "bucket",
            "url": self.url,
            "options": options,
            "retries": self.retries,
            "backoff": self.backoff,
            "signed": None if self.signer is None else self.signer.fingerprint,
        }

    @classmethod
    def _reopen(cls, address: Mapping[str, Any], signer: Signer | None) -> BucketStore:
        """The bucket store at ``address``, with no cache in front, signing with ``signer``
        (None: unsigned)."""
        url, options = address.get("url"), address.get("options", {})
        retries, backoff = address.get("retries", 5), address.get("backoff", 0.05)
        # Read-only by its home; a flag beside `bucket` is honoured too, as it was once written.
        read_only = address.get("read_only", False)
        if (
            not isinstance(read_only, bool)
            or not isinstance(url, str)
            or "://" not in url
            or not isinstance(options, dict)
            or not isinstance(retries, int)
            or not isinstance(backoff, (int, float))
        ):
            raise BadAddress(
                "a bucket store's address holds its `url` (with a `://`), its storage "
                "`options` as a dict, `retries` as an int and `backoff` in seconds; make it "
                "with `store.address()`"
            )
        apart = sorted(set(options) & {"cache", "signing_key", "retries", "backoff", "read_only"})
        if apart:
            raise BadAddress(
                f"a bucket store's address holds storage `options` for the filesystem only, got "
                f"{apart}: `retries` and `backoff` lie beside them, a read-only store's "
                f"`home` is {READ_ONLY_BUCKET!r}, and a cache or a signing key is never in an "
                "address (each process has its own); make it with `store.address()`"
            )
        store = cls(
            url,
            signing_key=signer,
            retries=retries,
            backoff=backoff,
            read_only=read_only or address.get("home") == READ_ONLY_BUCKET,
            **options,
        )
        store.signer = signer  # None means unsigned here, not the environment's key
        return store

    # -- writing ------------------------------------------------------------------------------

    def _cache_at(self, cache: str | os.PathLike[str]) -> LocalStore:
        """The cache folder ``cache``, opened (made where it is missing) and bound to this
        store: its bucket and prefix, and the server — the same bucket's name on another
        S3-compatible server is another bucket, whose answers the cache must not hand."""
        opened = LocalStore(cache, signing_key=self.signer)
        self._cache_bound = _bind_cache(opened, self._cache_address())
        return opened

    def _cache_address(self) -> str:
        """What the cache folder's file names this store by: its bucket and prefix, and the
        server where the options or the environment name one."""
        address = self.fs.unstrip_protocol(self.root)
        server = _server_of(self.url, self.storage_options)
        return address if server is None else f"{address} at {server}"

    def _fill_cache(self, fill: Callable[..., None], *args: Any) -> None:
        """Copies something into the cache in front; a copy that cannot be made (a full
        disk, a tmp/ removed by another process) is skipped, never an error: the bucket
        holds it, and the cache only saves requests. A cache folder removed meanwhile (a
        user clearing it), which its store object refuses to write into, is made again
        and bound to this store, as when it was opened, and the copy made there. One left
        unbound as it was opened (its disk full then) is bound before the first copy into
        it, and nothing is copied while it cannot be, nor once another store bound it
        meanwhile: left to the next store to come, the copies would be answers handed to a
        store that never kept them."""
        if self.cache is None:
            return
        try:
            if not self._cache_bound:
                self._cache_bound = _bind_cache(self.cache, self._cache_address())
            if self._cache_bound:
                fill(*args)
                return
        except StoreError:
            pass
        if self.cache.root.is_dir():
            return
        with contextlib.suppress(StoreError):
            self._cache_at(self.cache.root)
            if self._cache_bound:
                fill(*args)

    def _claim(self, digest: str, claims: list[str]) -> None:
        """Claims blob ``digest`` in the cache in front as well: a keep copies the blob there
        before the record or index that refers to it, and a gc of the cache, which keeps no
        grace, leaves it alone until the keep lets go of both claims (:meth:`_unclaim`)."""
        if self.cache is None:
            super()._claim(digest, claims)
            return
        cached: list[str] = []
        self.cache._claim(digest, cached)
        try:
            super()._claim(digest, claims)
        except BaseException:  # interrupted while waiting on a gc of the bucket: not claimed
            self.cache._unclaim(cached)
            raise

    def _unclaim(self, claims: list[str]) -> None:
        super()._unclaim(claims)
        if self.cache is not None:
            self.cache._unclaim(claims)

    def _spill_file(self) -> IO[bytes]:
        """In the cache in front, on a local disk the user chose, where it can be made there
        (the system's temporary folder may be held in memory)."""
        if self.cache is not None:
            with contextlib.suppress(OSError):
                return self.cache._spill_file()
        return super()._spill_file()

    def _put(self, data: Buffer | Sequence[Buffer], claims: list[str]) -> str:
        pieces = frozen(pieces_of(data, self))  # what is hashed is what is uploaded
        digest = digest_of(pieces)
        self._claim(digest, claims)
        size = nbytes(pieces)
        path = self._blob_path(digest)
        self.fs.invalidate_cache(path)
        # One found damaged is written over, whatever its size.
        if digest not in self._noted.damaged:
            try:
                there = self._call(f"looking for blob {digest}", self.fs.info, path)
                if int(there.get("size", -1)) == size:
                    if isinstance(claims, Claims):  # looked for again once referred to
                        claims.found[digest] = pieces
                    return digest
            except FileNotFoundError:
                pass
        self._write(path, pieces)
        self._noted.damaged.discard(digest)
        if self.cache is not None:
            self._fill_cache(self.cache._take_blob, digest, pieces)
        return digest

    def _published(self, claims: list[str]) -> None:
        """A put that found its blob here neither wrote nor touched it (an object's time
        cannot be changed without writing it again), so a gc elsewhere that found it
        unreferenced and old may have removed it since, and read the records before this
        one was published. Each such blob is looked for once more (one request, only for
        blobs found there), and written again from the bytes kept if it is gone. Together
        with a gc's set-aside copies (:meth:`~BucketShelf._sweep`) no interleaving leaves
        the record pointing at nothing: a gc that read the records after this record was
        published puts the blob back itself, and one that read them before removed the
        blob before this look, which finds it gone."""
        found = claims.found if isinstance(claims, Claims) else {}
        for digest, pieces in found.items():
            path = self._blob_path(digest)
            if not self._there(path, f"looking for blob {digest} again"):
                self._write(path, pieces)
        found.clear()

    def bind(self, name: str, digest: str) -> None:
        """The blob is looked for in the bucket (not the cache) before the name is written,
        and again after: a gc that removed it meanwhile is said, not left as a name pointing
        at nothing. Names above it and under it are looked for before too, and again after:
        a bucket cannot write a name only if no such name is there, so one bound by another
        process meanwhile (``sms/train/small`` while this binds ``sms/train``) makes this
        bind take its name back and refuse (both may be refused; never both bound)."""
        check_bindable(name)
        self._check_name(name)
        blob = self._blob_path(digest)
        clash = self._nesting(name)
        if clash is not None:
            raise clash
        other = spelled_otherwise(
            name, lambda at: self._names_in(self._path("names", at).rstrip("/"))
        )
        if other is not None:
            raise case_clash(name, other, self.url, self._names_under(other))
        if not self._there(blob, f"looking for blob {digest}"):
            bucket = self._missing_bucket()
            raise unbacked(name, digest, self.url) if bucket is None else self._no_bucket(bucket)
        data = encode_name(name, digest, self.signer)
        try:
            self._write(self._path("names", name), [data])
        except IsADirectoryError:
            # On a plain filesystem, a folder at its path: names bound under it meanwhile,
            # or a folder of names left empty (as a local store refuses it too).
            raise nested(name, None) from None
        clash = self._nesting(name)
        if clash is not None:
            self._drop("names", {name: data})  # its own, unless bound again meanwhile
            raise clash
        if not self._there(blob, f"looking for blob {digest}"):
            raise unbound(name, digest, self.url)

    def _check_name(self, name: str) -> None:
        """BadName unless ``name`` is a name (:func:`check_name`) whose file's key, under
        the store's prefix, is one the bucket holds: an object key is at most
        :data:`KEY_BYTES` long, and a name may be that long by itself."""
        check_name(name)
        bucket = self._bucket_name()
        if bucket is None:
            return
        key = self._path("names", name).lstrip("/")[len(bucket) + 1 :]
        size = len(key.encode("utf-8"))
        if size > KEY_BYTES:
            room = size - len(name.encode("utf-8"))
            raise BadName(
                f"name {name[:60]!r}… is too long for {self.url}: its file's key would be "
                f"{size} bytes, of which the store's prefix and `names/` take {room}, and an "
                f"object key holds at most {KEY_BYTES}; use a name of at most "
                f"{KEY_BYTES - room} bytes here, or a digest of the long one"
            )

    def _nesting(self, name: str) -> BadName | None:
        """The refusal of ``name`` when a name above it, or names under it, are bound now;
        None when there are none."""
        upper = {self._path("names", n): n for n in names_above(name)}
        found = self._read_paths(list(upper)) if upper else {}
        above = next((n for path, n in upper.items() if found.get(path)), None)
        if above is not None or self._names_under(name):
            return nested(name, above)
        return None

    def _names_under(self, name: str) -> bool:
        """Whether names are bound under ``name`` (a folder of names), from a fresh listing."""
        inside = f"/names/{name}/"  # listings name paths with or without the protocol
        return any(inside in f"/{p}" for p in self._list(f"names/{name}"))

    def _there(self, path: str, what: str) -> bool:
        """Whether the object at ``path`` is in the bucket now (not as a listing cached)."""
        self.fs.invalidate_cache(path)
        return bool(self._call(what, self.fs.exists, path))

    def _publish_record(self, answer: Answer, data: bytes) -> None:
        self._write(self._answer_path(answer.key), [data])
        if self.cache is not None:
            self._fill_cache(self.cache._take_record, answer, data)

    def _publish_index(self, pack: PackIndex, data: bytes) -> None:
        self._write(self._pack_path(pack.id), [data])
        self._noted.damaged_indexes.pop(pack.id, None)  # written afresh, whole
        self._copy_index(pack, data)
        self._adopt(pack)

    def _copy_index(self, pack: PackIndex, data: bytes) -> None:
        if self.cache is not None:
            self._fill_cache(self.cache._publish_index, pack, data)

    # -- reading ------------------------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        if self.cache is not None and self.cache.has_blob(digest):
            return True
        path = self._blob_path(digest)
        self.fs.invalidate_cache(path)
        return bool(self._call(f"looking for blob {digest}", self.fs.exists, path))

    def open_blob(self, digest: str) -> io.RawIOBase | io.BufferedIOBase:
        """A seekable file of the blob whose reads are ranged requests (or the cached copy)."""
        if self.cache is not None and self.cache.has_blob(digest):
            return self.cache.open_blob(digest)
        path = self._blob_path(digest)
        try:
            handle = self._call(f"opening blob {digest}", _open_file, _under_copies(self.fs), path)
        except _ABSENT:
            raise self._not_kept(f"blob {digest} is not in {self.url}") from None
        return cast(io.BufferedIOBase, handle)

    def get(self, digest: str) -> memoryview:
        return self._read_blob(digest, None)

    def local_blob(self, digest: str) -> memoryview | None:
        """From the cache in front, when it holds the blob whole and undamaged (a damaged
        copy is moved aside there); None otherwise."""
        if self.cache is None or not self.cache.has_blob(digest):
            return None
        try:
            return self.cache.local_blob(digest)
        except (Missing, Corrupt):
            return None  # gone meanwhile, or damaged and set aside: read from the bucket

    def _read_blob(self, digest: str, size: int | None, borrow: bool = False) -> memoryview:
        """Blob ``digest`` from memory, the cache or the bucket, verified; at ``size``."""
        held = self._held(digest, size, borrow)
        if held is not None:
            return held
        if self.cache is not None:
            try:
                return self.cache._read_blob(digest, size, borrow)
            except (Missing, Corrupt):
                pass  # not cached (or the copy was damaged and set aside): fetch it
        data = self._download(digest, size)
        if data is None:
            raise self._not_kept(f"blob {digest} is not in {self.url}")
        found = hash_bytes(data)
        if found != digest:
            # Read once more before the blob is taken for damaged and moved aside: bytes
            # damaged or cut short on their way (a link or proxy that flips them, with no
            # TLS to tell) are not the blob's, and a blob bound to a name is computed again
            # by no one.
            again = self._download(digest, size)
            if again is not None and hash_bytes(again) == digest:
                found, data = digest, again
        if found != digest:
            # Damaged at its full size or cut short, alike: moved aside, so that no store
            # object opened later downloads it again, and the recompute writes it afresh.
            said = f"blob {digest} downloaded from {self.url} hashes to {found}"
            if size is not None and len(data) != size:
                said += f" and holds {len(data)} bytes where its answer says {size}"
            unmoved = self._set_aside(digest)
            if unmoved is None:
                raise Corrupt(
                    f"{said}: it is damaged, and was moved to quarantine/ so that it is "
                    "written afresh"
                )
            raise Corrupt(
                f"{said}: it is damaged, and {unmoved}. This store object writes it afresh "
                "when these bytes are kept again"
            )
        if size is not None and len(data) != size:
            # The blob is whole (it hashes to its name): what says its size is wrong.
            raise Corrupt(
                f"blob {digest} in {self.url} holds {len(data)} bytes where its answer says "
                f"{size}, though it hashes to its digest: the answer's record or pack index "
                "is damaged, not the blob, which is left in place"
            )
        if self.cache is not None:
            with self.cache._keeping() as claims:  # a gc of the cache now waits, or spares it
                self.cache._claim(digest, claims)
                self._fill_cache(self.cache._take_blob, digest, [data])
        if len(data) <= _HOLD_BELOW:
            self._hold(digest, data)
        # The caller's own to write into, not what is held (unless it only borrows).
        return memoryview(data) if borrow else memoryview(bytearray(data))

    def _set_aside(self, digest: str) -> str | None:
        """Moves damaged blob ``digest`` to ``quarantine/blobs/``, so a recompute's put finds
        it absent and uploads it afresh; None when it is gone from its place (moved, or
        moved or removed by another reader), or why it could not be moved (credentials that
        may not delete): then it is still there, and this store object's next put of it
        writes over it."""
        self._noted.damaged.add(digest)
        aside = self._path("quarantine", f"blobs/{digest[7:]}.{time.time_ns()}")
        try:
            self._move(self._blob_path(digest), aside, f"moving blob {digest} aside")
        except FileNotFoundError:
            pass  # already moved or removed by another reader: either way it is gone
        except StoreError as why:
            return str(why)
        finally:
            self.fs.invalidate_cache(self._blob_path(digest))
        return None

    def resolve(self, name: str) -> str:
        self._check_name(name)
        data = self._read(self._path("names", name), f"name `{name}`")
        if data is None:
            raise NameNotFound(
                f"nothing is bound to `{name}` in {self.url}; bind it first with "
                f"`store.bind({name!r}, store.put(data))`"
            )
        return decode_name(name, data, self.signer)

    def _look_at_packs(self) -> None:
        """Loads the pack indexes once, before the first record is believed: a pack newer
        than a record answers its keys (later packs are loaded on a miss). A look that a gc
        or verify of this object let go of as it ended is made again."""
        while not self._packs_seen:
            forgets = self._forgets
            self._refresh_packs()
            with self._lock:  # what _forget_all counts under it, and then says unseen
                if self._forgets == forgets:
                    self._packs_seen = True

    def _list_again(self) -> None:
        """The next answer looks at ``packs/`` before the cache in front: a pack this object
        adopted may be gone with its blob (merged into a larger one by a compaction), and
        the cache, which holds a copy of its index, would answer from it again."""
        with self._lock:
            self._packs_seen = False

    def answer(self, key: str) -> Answer | None:
        while True:
            forgets = self._forgets
            self._look_at_packs()
            known = self._known_answer(key)
            if known is not None:
                return known
            cache = self._answering_cache()
            if cache is not None:
                cached = self._cached_answer(cache, key)
                if cached is not None:
                    return cached
            data = self._read(self._answer_path(key), f"the answer record of {key}")
            if data is None:
                pack = self._packed_after_a_look([key]).get(key)
                return pack.answer(key) if pack is not None else None
            # Believed only while the packs looked at are still held: a gc or verify that
            # let go of them meanwhile may have let go of a newer pack of the key.
            if self._forgets == forgets:
                return self._learn(key, data)

    def _answering_cache(self) -> LocalStore | None:
        """The cache in front, to be asked for answers: bound to this store, or to none yet (a
        folder whose file naming its store could not be written, read as it is). None once
        another store bound it meanwhile: what it holds are that store's answers, found by
        key alone, which this one never kept."""
        cache = self.cache
        if cache is None or self._cache_bound:
            return cache
        try:
            bound = _read_mark(os.path.join(cache.root, _CACHE_MARK))
        except StoreError:
            return None
        return cache if bound is None or bound == f"{self._cache_address()}\n" else None

    def _cached_answer(self, cache: LocalStore, key: str) -> Answer | None:
        try:
            found = cache.answer(key)
        except Corrupt:
            return None
        if found is not None and found.offset is None:
            self._remember(found)
        return found

    def reread(self, key: str) -> None:
        with contextlib.suppress(StoreError):  # unread: the next recall says why
            data = self._read(self._answer_path(key), f"the answer record of {key}")
            if data is not None:
                self._learn(key, data)

    def _learn(self, key: str, data: bytes) -> Answer:
        answer = decode_record(key, data, self.signer)
        self._supersede(answer)
        if self.cache is not None:
            self._fill_cache(self.cache._take_record, answer, data)
        return answer

    def have(self, keys: Iterable[str]) -> set[str]:
        """One batched query; see the module docstring for what a yes means on a bucket."""
        asked = keys_of(keys)
        forgets = self._forgets
        looked = not self._packs_seen  # the packs are loaded now, as they are
        self._look_at_packs()
        found = {key for key in asked if key in self._items or key in self._records}
        unknown = [key for key in asked if key not in found]
        cache = self._answering_cache() if unknown else None
        if cache is not None:
            local = cache.have(unknown)
            for key in local:
                self._cached_answer(cache, key)
            found |= local
            unknown = [key for key in unknown if key not in local]
        if not unknown:
            return found
        if len(unknown) <= _FETCH_BELOW:
            paths = {self._answer_path(key): key for key in unknown}
            for path, data in self._read_paths(list(paths)).items():
                if data is None:
                    continue
                key = paths[path]
                try:
                    self._learn(key, data)
                except Corrupt:
                    continue
                found.add(key)
        else:
            for key in unknown:  # answered by name from a listing: checked as a fetch would be
                check_digest(key)
            listed = {name.rsplit("/", 1)[-1] for name in self._listed("answers")}
            found.update(key for key in unknown if key[7:] in listed)
        left = [key for key in unknown if key not in found]
        # Looked at again unless this call looked just now, and nothing let go of what it
        # took in since; found in the table even when another thread's look took them in.
        if left and (not looked or self._forgets != forgets):
            found.update(self._packed_after_a_look(left))
        return found

    def _listed_packs(self) -> dict[str, str]:
        """One listing, never None: a bucket has no cheap sign that nothing changed. The
        version of each index listed is noted, and an index found damaged is forgotten as
        such once it is listed no more at the version found damaged."""
        listed = self._listed("packs")
        noted = self._noted
        noted.indexes = {"blake3:" + name: version_of(info) for name, info in listed.items()}
        noted.damaged_indexes = {
            pack_id: version
            for pack_id, version in list(noted.damaged_indexes.items())  # a keep may pop one
            if noted.indexes.get(pack_id) == version
        }
        return {"blake3:" + name: self._path("packs", name) for name in listed}

    def _records_among(self, keys: Sequence[str]) -> dict[str, bytes]:
        """A few keys' records are read at once; for many, one listing of ``answers/`` says
        which to read."""
        wanted = list(keys)
        if len(wanted) > _FETCH_BELOW:
            listed = {name.rsplit("/", 1)[-1] for name in self._listed("answers")}
            wanted = [key for key in wanted if key[7:] in listed]
        paths = {self._answer_path(key): key for key in wanted}
        got = self._read_paths(list(paths)) if paths else {}
        return {paths[path]: data for path, data in got.items() if data is not None}

    def _read_indexes(self, wanted: dict[str, str]) -> dict[str, bytes | None]:
        """An index found damaged, listed still at the version found so, is not read again
        (None): a miss would otherwise cost a request for it, every time."""
        damaged = self._noted.damaged_indexes
        paths = [path for pack_id, path in wanted.items() if pack_id not in damaged]
        got = self._read_paths(paths) if paths else {}
        return {pack_id: got.get(path) for pack_id, path in wanted.items()}

    def _index_damaged(self, pack_id: str) -> None:
        version = self._noted.indexes.get(pack_id)
        if version is not None:  # a listing that tells no versions apart: read each time
            self._noted.damaged_indexes[pack_id] = version

    def _blob_damaged(self, pack: PackIndex) -> None:
        # Not adopted again while its index is listed as it was read: each miss would
        # otherwise look at the blob (download it, where it could not be moved aside).
        self._index_damaged(pack.id)

    # -- upkeep -------------------------------------------------------------------------------

    def close(self) -> None:
        super().close()
        if self.cache is not None:
            self.cache.close()

    def _forget_all(self) -> None:
        super()._forget_all()
        self._packs_seen = False
        self._noted.damaged_indexes.clear()
        if self.cache is not None:
            self.cache._forget_all()
