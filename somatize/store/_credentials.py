"""A bucket's credentials, held so that no file a store is written into carries them.

A bucket store is pickled with what holds it: ``torch.save`` of a model holding a row
cache of it, a Lightning checkpoint of the hyperparameters a module was given, a graph
pickled to disk, Lightning's ``hparams.yaml``. Those files are shared, uploaded and kept
for years, so a secret key in them is a leak. Each credential the store is opened with is
held as a :class:`Credential` (:class:`CredentialBytes`, :class:`CredentialInfo` where it is
given as bytes or as a dict of fields), the value itself to the client, which a plain
pickle (or a YAML dump) writes as None: loaded, the store reaches the bucket with the credentials of
the process that loads it (its environment, its role), as a signed store signs with the
key of its own environment.

A copy in this process (``copy.deepcopy``: an EMA of a model) keeps them, and so does what
``multiprocessing`` sends a process it starts (a spawned DataLoader worker, a rank of
``ddp_spawn``), through its pipe to that child, as the store handed to it was opened here.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any

CREDENTIALS = frozenset(
    {
        # s3fs, and the same for the botocore client it makes
        "key",
        "secret",
        "token",  # gcsfs's too, given as text or as a service account's key, a dict
        "username",
        "password",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        # adlfs (Azure)
        "account_key",
        "sas_token",
        "connection_string",
        "client_secret",
        "credential",  # an account key or a SAS token, where it is given as text
        # s3fs's `s3_additional_kwargs`: a customer-provided encryption key (SSE-C), which
        # reads every object it wrote
        "SSECustomerKey",
        "CopySourceSSECustomerKey",
    }
)
"""The options, at the top, in one of :data:`NESTED` or under a layer's protocol, whose
text is a credential."""

NESTED = ("client_kwargs", "s3_additional_kwargs")
"""The options that are dicts of options in turn, which may hold credentials: s3fs's
keyword arguments for its client, and those it adds to each request."""


_PASSWORD_IN_URL = re.compile(r"((?:^|://)[^/\s:@'\"]*):[^/\s'\"]*@")
"""The password of a URL written with one (``http://user:password@host``, or with no scheme,
``user:password@host``), up to the last ``@`` before its path: a password holding ``@``
unescaped is masked whole."""


def masked(text: str) -> str:
    """``text`` with the password of each URL in it shown as ``***``: an endpoint may be
    given as ``http://user:password@host:9000``, and what names it (an error, a log, the
    file binding a cache folder) is shown, kept and shared."""
    return _PASSWORD_IN_URL.sub(r"\1:***@", text)


_LOGGING_LIBRARIES = frozenset(
    {"botocore", "aiobotocore", "s3fs", "fsspec", "aiohttp", "urllib3", "gcsfs", "adlfs", "azure"}
)
"""The libraries a bucket is reached through whose records may name an endpoint, password
and all (aiobotocore's and botocore's DEBUG records show the endpoint of each request)."""

_masking_logs = threading.Lock()
_masks_logs = False


def mask_passwords_in_logs() -> None:
    """Has each record the libraries of :data:`_LOGGING_LIBRARIES` log show the password of
    each URL in it as ``***`` (:func:`masked`), from now on in this process: a store opened
    with a password in its endpoint masks it in what it says, and a user who turns DEBUG
    logging on would see it in theirs. It is done where records are made (the record
    factory, the one before it kept), since a filter on a logger does not see its
    children's records (``botocore.endpoint``); only records of those loggers are touched,
    and only made at all where their level is on."""
    global _masks_logs
    with _masking_logs:
        if _masks_logs:
            return
        made = logging.getLogRecordFactory()

        def record(*args: Any, **kwargs: Any) -> logging.LogRecord:
            out = made(*args, **kwargs)
            if str(out.name).split(".", 1)[0] in _LOGGING_LIBRARIES:
                _mask_record(out)
            return out

        logging.setLogRecordFactory(record)
        _masks_logs = True


def _mask_record(record: logging.LogRecord) -> None:
    """``record`` with the password of each URL its message holds masked: the message is
    formatted here where it holds one (its arguments may be the dict of a request)."""
    try:
        message = record.getMessage()
    except Exception:
        return  # formatting fails where a handler formats it, as it would have
    shown = masked(message)
    if shown != message:
        record.msg, record.args = shown, None


def without_passwords(error: BaseException) -> BaseException:
    """``error``, the password of each URL its message holds masked (:func:`masked`), in
    place: a client's error names the URL it could not reach (botocore's "Could not connect
    to the endpoint URL"), endpoint and all, and is said in the store's errors, chained
    below them in a traceback, and logged."""
    error.args = tuple(masked(arg) if isinstance(arg, str) else arg for arg in error.args)
    details = getattr(error, "kwargs", None)  # botocore's, which it formats its message from
    if isinstance(details, dict):
        for name, value in details.items():
            if isinstance(value, str):
                details[name] = masked(value)
    return error


def _absent() -> None:
    """What a credential is loaded as from a plain pickle: none given."""
    return None


class _Held:
    """What makes a value a credential held: a plain pickle writes it as None, a copy in
    this process is the same value (see the module's doc)."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return _absent, ()

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Any:
        return self


class Credential(_Held, str):
    """A credential's text, which a plain pickle writes as None (see the module's doc)."""

    __slots__ = ()


class CredentialBytes(_Held, bytes):
    """A credential given as bytes (an SSE-C key, ``os.urandom(32)``), held as the text of
    one is."""

    __slots__ = ()


class CredentialInfo(_Held, dict[str, Any]):
    """A credential given as a dict of its fields (gcsfs's ``token``, a service account's
    key as read from its JSON file), held as the text of one is."""

    __slots__ = ()


class CredentialURL(_Held, str):
    """A URL holding a password (``ftp://user:password@host/…``, which the filesystem reads
    it from), which a plain pickle writes without its password: loaded, the store reaches
    the server as that user, with the credentials of the process that loads it."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return str, (_PASSWORD_IN_URL.sub(r"\1@", self),)


def held_url(url: str) -> str:
    """``url``, held as a :class:`CredentialURL` where it holds a password."""
    return CredentialURL(url) if _PASSWORD_IN_URL.search(url) else url


def _url_as_given(url: CredentialURL) -> tuple[type, tuple[str]]:
    """How a URL holding a password travels to a process ``multiprocessing`` starts."""
    return CredentialURL, (str(url),)


ForkingPickler.register(CredentialURL, _url_as_given)


_HELD_AS: dict[type, type] = {str: Credential, bytes: CredentialBytes, dict: CredentialInfo}
"""The kind of value a credential is given as, and what holds it."""


def kind_given(value: object) -> type:
    """The kind ``value`` was given as: ``str`` for a :class:`Credential`, and so on."""
    for given, holder in _HELD_AS.items():
        if isinstance(value, holder):
            return given
    return type(value)


def _as_given(held: Any) -> tuple[type, tuple[Any]]:
    """How a credential travels to a process ``multiprocessing`` starts from this one."""
    return type(held), (_unguard(held),)


for _holder in _HELD_AS.values():
    ForkingPickler.register(_holder, _as_given)


def guarded(options: Mapping[str, Any], protocols: Iterable[str] = ()) -> dict[str, Any]:
    """``options`` with each credential's text held as a :class:`Credential`: at the top, in
    each of :data:`NESTED`, and in the options under each of ``protocols`` (the layers of a
    chained URL: ``s3={"secret": …}`` for ``simplecache::s3://…``), which fsspec hands to
    that layer's filesystem."""
    return _at_each_level(options, protocols, _guard)


def plain(options: Mapping[str, Any], protocols: Iterable[str] = ()) -> dict[str, Any]:
    """``options`` with each credential as plain text again, where :func:`guarded` held it:
    what an address carries to a worker that opens the store from it (said in its docs), as
    canonical values."""
    return _at_each_level(options, protocols, lambda _name, value: _unguard(value))


def _at_each_level(
    options: Mapping[str, Any], protocols: Iterable[str], change: Callable[[str, Any], Any]
) -> dict[str, Any]:
    """``options`` with ``change`` made to each value where a credential may be given."""
    changed = _at_one_level(options, change)
    for protocol in protocols:
        inner = changed.get(protocol)
        if isinstance(inner, Mapping):
            changed[protocol] = _at_one_level(inner, change)
    return changed


def _at_one_level(options: Mapping[str, Any], change: Callable[[str, Any], Any]) -> dict[str, Any]:
    changed = {name: change(name, value) for name, value in options.items()}
    for nested in NESTED:
        inner = changed.get(nested)
        if isinstance(inner, Mapping):
            changed[nested] = {name: change(name, value) for name, value in inner.items()}
    return changed


def _guard(name: str, value: Any) -> Any:
    holder = _HELD_AS.get(type(value)) if name in CREDENTIALS else None
    return value if holder is None else holder(value)


def _unguard(value: Any) -> Any:
    for given, holder in _HELD_AS.items():
        if isinstance(value, holder):
            return given(value)
    return value
