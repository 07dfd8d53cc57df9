"""A store's address: what another process opens the same store from — canonical values,
never a signing key, and a store opened from it reaches the same answers."""

from __future__ import annotations

import copy
import os
import pickle
import shutil
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import blake3
import pytest

from somatize import Graph, canonical
from somatize.store import BadAddress, BucketStore, KeyMismatch, LocalStore, Store
from tests.conftest_s3 import s3_options, s3_url
from tests.nodes import Echo

KEY = "SOMATIZE_STORE_KEY"


def key_of(label: str) -> str:
    return "blake3:" + blake3.blake3(label.encode()).hexdigest()


def _meet(one: Store, other: Store) -> None:
    """What ``one`` keeps ``other`` recalls, and the other way round."""
    there, back = key_of("there"), key_of("back")
    one.keep(there, b"kept by one", "plain", "fp")
    other.keep(back, b"kept by the other", "plain")
    assert bytes(other.recall(there)[1]) == b"kept by one"
    assert other.answer(there).fingerprint == "fp"  # type: ignore[union-attr]
    assert bytes(one.recall(back)[1]) == b"kept by the other"


def test_a_local_store_round_trips(tmp_path: Path) -> None:
    """A local store's address is its resolved directory and `durable`; the store opened
    from it is the same store, with the same address."""
    store = LocalStore(tmp_path / "a" / ".." / "store", durable=True)
    address = store.address()
    assert address == {
        "home": "local",
        "root": str((tmp_path / "store").resolve()),
        "durable": True,
        "signed": None,
    }
    assert canonical.is_canonical(address)
    reopened = Store.from_address(address)
    assert isinstance(reopened, LocalStore) and reopened.durable
    assert reopened.address() == address
    _meet(store, reopened)


def test_a_bucket_round_trips_without_its_cache(tmp_path: Path) -> None:
    """A bucket's address is its URL, storage options and retrying — not the client's cache
    directory; the store opened from it (S3 on loopback) reaches the same answers."""
    url = s3_url()
    store = Store.on_bucket(url, cache=tmp_path / "cache", retries=3, **s3_options())
    address = store.address()
    assert address == {
        "home": "bucket",
        "url": url,
        "options": s3_options(),
        "retries": 3,
        "backoff": 0.05,
        "signed": None,
    }
    assert str(tmp_path) not in repr(address)
    reopened = Store.from_address(address)  # type: ignore[arg-type]
    assert isinstance(reopened, BucketStore) and reopened.cache is None
    assert reopened.retries == 3 and reopened.address() == address
    _meet(store, reopened)


def test_a_file_bucket_round_trips(tmp_path: Path) -> None:
    """A `file://` bucket reopens from its address as well."""
    store = Store.on_bucket(f"file://{tmp_path / 'bucket'}")
    reopened = Store.from_address(store.address())  # type: ignore[arg-type]
    assert isinstance(reopened, BucketStore)
    _meet(store, reopened)


def test_what_cannot_be_described_has_no_address(tmp_path: Path) -> None:
    """Options that are live objects, or a `memory://` bucket (it lives in this process
    alone), leave a store with no address."""
    assert Store.on_bucket(f"file://{tmp_path / 'bucket'}", session=object()).address() is None
    assert Store.on_bucket("memory://somatize/address").address() is None


def test_a_signed_address_carries_a_fingerprint_never_the_key(tmp_path: Path) -> None:
    """The address of a signed store names its key by a fingerprint that does not contain
    the key and differs from another key's."""
    secret = "the-signing-secret-1234"
    address = LocalStore(tmp_path / "store", signing_key=secret).address()
    encoded = canonical.encode(address)
    assert secret.encode() not in encoded and secret.encode().hex().encode() not in encoded
    assert isinstance(address["signed"], str) and len(address["signed"]) == 64
    other = LocalStore(tmp_path / "other", signing_key="another-secret").address()
    assert other["signed"] != address["signed"]
    again = LocalStore(tmp_path / "again", signing_key=secret.encode()).address()
    assert again["signed"] == address["signed"]


@pytest.mark.parametrize("key", [5, True, 1.5, ["s3cret"]])
def test_a_signing_key_that_is_no_str_or_bytes_is_refused(tmp_path: Path, key: Any) -> None:
    """A signing key is a secret's text or bytes: an int read from a config file unquoted
    is refused, naming its type, not taken as that many zero bytes (``bytes(5)``)."""
    kind = type(key).__name__
    with pytest.raises(TypeError, match=rf"signing key is a str or bytes, got {kind}"):
        LocalStore(tmp_path / "store", signing_key=key)
    with pytest.raises(TypeError, match=rf"signing key is a str or bytes, got {kind}"):
        Store.on_bucket("memory://somatize/keyed", signing_key=key)
    raw = LocalStore(tmp_path / "raw", signing_key=bytearray(b"s3cret")).address()
    assert raw is not None and raw == LocalStore(tmp_path / "raw", signing_key="s3cret").address()


def test_a_signing_key_of_bytes_no_text_spells_is_the_bytes_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key of random bytes set in the environment (``head -c 32 /dev/urandom``), which
    Python holds as text with lone surrogates, raised a raw UnicodeEncodeError at every
    store opened. It is the bytes set, as the same bytes passed as ``signing_key=`` are;
    text no bytes spell is refused, saying so."""
    raw = b"ab\xff\xfecd"
    monkeypatch.setenv(KEY, os.fsdecode(raw))
    store = LocalStore(tmp_path / "store")
    assert store.address() == LocalStore(tmp_path / "store", signing_key=raw).address()
    assert store.address()["signed"] is not None
    _meet(store, Store.from_address(store.address()))
    with pytest.raises(ValueError, match=r"signing key .* lone surrogate"):
        LocalStore(tmp_path / "store", signing_key="ab\ud800")


def test_a_signed_store_opens_only_with_its_key(tmp_path: Path) -> None:
    """Opened from its address, a signed store signs with the key of the environment, only
    when it is the store's key: what it keeps the signed store accepts. Without the key,
    or with another, it is not opened, saying what to set."""
    store = LocalStore(tmp_path / "store", signing_key="s3cret")
    address = store.address()
    reopened = Store.from_address(address, environ={KEY: "s3cret"})
    assert reopened.signer is not None  # type: ignore[attr-defined]
    _meet(store, reopened)
    with pytest.raises(KeyMismatch, match=r"signs its records, and SOMATIZE_STORE_KEY is not set"):
        Store.from_address(address, environ={})
    with pytest.raises(KeyMismatch, match=r"with another key than SOMATIZE_STORE_KEY holds"):
        Store.from_address(address, environ={KEY: "not-it"})


def test_a_signed_store_pickled_carries_a_fingerprint_never_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signed store pickled (``torch.save`` of a model holding a row cache of it) carried
    its signing key into the file, for whoever reads the checkpoint. It carries the key's
    fingerprint: loaded, it signs with the environment's key where that is the store's,
    and is refused without it. A copy in this process, and one handed to a process that
    ``multiprocessing`` starts from it (a spawned DataLoader worker), keep the key."""
    secret = "the-signing-secret-1234"
    monkeypatch.delenv(KEY, raising=False)
    store = LocalStore(tmp_path / "store", signing_key=secret)
    bucket = Store.on_bucket(
        f"file://{tmp_path / 'bucket'}", cache=tmp_path / "cache", signing_key=secret
    )
    for kept in (store, bucket):
        pickled = pickle.dumps(kept)
        assert secret.encode() not in pickled
        with pytest.raises(KeyMismatch, match=r"pickled .* with the fingerprint of its signing"):
            pickle.loads(pickled)
        monkeypatch.setenv(KEY, "not-it")
        with pytest.raises(KeyMismatch, match=r"with another key than SOMATIZE_STORE_KEY holds"):
            pickle.loads(pickled)
        monkeypatch.setenv(KEY, secret)
        _meet(kept, pickle.loads(pickled))
        monkeypatch.delenv(KEY)
        _meet(kept, copy.deepcopy(kept))
        _meet(kept, pickle.loads(ForkingPickler.dumps(kept)))


def test_an_unsigned_store_opens_unsigned_whatever_the_environment(tmp_path: Path) -> None:
    """An unsigned store opened where a key is set does not sign: it is the same store."""
    store = LocalStore(tmp_path / "store", signing_key=None)
    assert store.signer is None
    reopened = Store.from_address(store.address(), environ={KEY: "s3cret"})
    assert isinstance(reopened, LocalStore) and reopened.signer is None
    reopened.keep(key_of("plain"), b"v", "plain")
    assert b"mac:" not in reopened.answer_path(key_of("plain")).read_bytes()


@pytest.mark.parametrize(
    ("address", "match"),
    [
        ("/some/dir", r"dict of canonical values, as `store.address\(\)` returns"),
        ({"home": "local", "root": object()}, r"dict of canonical values"),
        (
            {"home": "tape", "signed": None},
            r"names its home, `local`, `bucket`, `read-only local` or `read-only bucket`, "
            r"got 'tape'",
        ),
        ({"home": "local", "root": "relative/dir"}, r"directory as an absolute path"),
        ({"home": "bucket", "url": "no-scheme"}, r"its `url` \(with a `://`\)"),
        ({"home": "local", "root": "/x", "signed": 7}, r"`signed` .* is a key fingerprint"),
    ],
)
def test_a_bad_address_is_refused(address: object, match: str) -> None:
    """What does not describe a store is refused, saying what an address holds."""
    with pytest.raises(BadAddress, match=match):
        Store.from_address(address, environ={})  # type: ignore[arg-type]


def test_a_store_argument_names_a_store_a_directory_or_a_bucket(tmp_path: Path) -> None:
    """``Store.of`` is how every ``store=`` argument is read: a Store as it is, a directory,
    a bucket URL, None; anything else is refused, saying what is taken."""
    local = Store.of(tmp_path / "here")
    assert isinstance(local, LocalStore) and local.root == tmp_path / "here"
    assert Store.of(local) is local
    assert Store.of(None) is None
    assert isinstance(Store.of(f"file://{tmp_path / 'bucket'}"), BucketStore)
    with pytest.raises(TypeError, match="a bucket URL"):
        Store.of(42)  # type: ignore[arg-type]


def test_an_empty_store_path_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty path names no directory (``Path("")`` is the current one): ``store=""``,
    ``Store("")`` and ``Store.of("")`` are refused, saying what to pass, and nothing is made
    in the current directory."""
    monkeypatch.chdir(tmp_path)
    g = Graph.somatize(Echo().named("e").frozen().cached())
    for opened in (lambda: g.forward(1, store=""), lambda: Store(""), lambda: Store.of("")):
        with pytest.raises(BadAddress, match=r"non-empty path, got ''.*current directory"):
            opened()
    assert list(tmp_path.iterdir()) == []
    assert Store.of(".") is not None and (tmp_path / "blobs").is_dir()  # said, it is taken


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("~nosuchuser-somatize/features", r"`~nosuchuser-somatize` names no home directory"),
        ("features\x00old", r"holds a NUL character"),
    ],
)
def test_a_store_path_no_directory_can_have_is_refused(
    path: str, match: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path in the home of a user this system does not know, or one holding a NUL (no
    file name can), is refused with `BadAddress` naming it, not a bare `RuntimeError` or
    `ValueError`, and nothing is made."""
    monkeypatch.chdir(tmp_path)
    for opened in (lambda: Store(path), lambda: Store.of(path)):
        with pytest.raises(BadAddress, match=match):
            opened()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["file://{tmp}/features\x00old", "memory://team/a\x00b"])
def test_a_bucket_url_holding_a_nul_is_refused(url: str, tmp_path: Path) -> None:
    """A URL holding a NUL names no file nor object a store could write (a `file://` one
    failed at the first keep with a bare `ValueError`): it is refused when the store is
    opened, with `BadAddress`, and nothing is made."""
    with pytest.raises(BadAddress, match=r"holds a NUL character"):
        Store.on_bucket(url.format(tmp=tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_bucket_opened_at_no_str_says_what_it_takes(tmp_path: Path) -> None:
    """``Store.on_bucket(None)`` (a URL read from an unset setting) is a TypeError saying it
    takes the URL as a str, not an AttributeError from inside (`'NoneType' object has no
    attribute 'split'`)."""
    for url in (None, tmp_path):
        with pytest.raises(TypeError, match=r"opened at its URL, a str .*`Store\(path\)`"):
            Store.on_bucket(url)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("opened", "match"),
    [
        (lambda: Store.on_bucket("s3:/bucket/features"), r"'s3:/bucket/features' has no `://`"),
        (lambda: Store.on_bucket("bucket/features"), r"'bucket/features' has no `://`"),
        (lambda: Store("s3:/bucket/features"), r"'s3:/bucket/features' reads as a bucket URL"),
        (lambda: Store.of("gs:/bucket/x"), r"'gs:/bucket/x' reads as a bucket URL"),
        (lambda: LocalStore("memory:/features"), r"'memory:/features' reads as a bucket URL"),
        (
            lambda: Graph.somatize(Echo().named("e").frozen().cached()).forward(
                1, store="s3:/bucket/features"
            ),
            r"reads as a bucket URL",
        ),
    ],
    ids=["on-bucket-one-slash", "on-bucket-no-protocol", "store", "of", "local", "forward"],
)
def test_a_bucket_url_missing_its_slashes_is_refused(
    opened: Any, match: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bucket URL spelled without its ``://`` (``s3:/bucket``) is a relative path to the
    filesystem: opened so, the answers meant for a shared bucket would be kept in a folder
    named ``s3:`` under the working directory. It is refused, saying how to spell either, and
    nothing is made."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadAddress, match=match):
        opened()
    assert list(tmp_path.iterdir()) == []


def test_a_local_path_like_a_drive_or_a_folder_with_a_colon_later_is_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a first segment that reads as a URL's scheme is refused: a folder with a colon
    further on, or one after ``./``, is a directory as named."""
    monkeypatch.chdir(tmp_path)
    assert isinstance(Store("runs/s3:/x"), LocalStore)
    assert isinstance(Store("./s3:/x"), LocalStore)
    assert isinstance(Store(tmp_path / "s3:" / "x"), LocalStore)


def test_a_store_opened_by_a_relative_path_stays_where_it_was_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store opened by a relative path is the directory that path named when it was
    opened: a later change of the working directory moves none of its reads or writes."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    store = LocalStore("st")
    key = key_of("kept")
    store.keep(key, b"kept before", "plain")
    monkeypatch.chdir(tmp_path / "b")
    assert store.have([key]) == {key}
    store.keep(key_of("after"), b"kept after", "plain")
    assert store.root == tmp_path / "a" / "st"
    assert store.address()["root"] == str((tmp_path / "a" / "st").resolve())
    assert list((tmp_path / "b").iterdir()) == []
    assert LocalStore(tmp_path / "a" / "st").have([key, key_of("after")]) == {
        key,
        key_of("after"),
    }


@pytest.mark.parametrize(
    "url",
    ["file://st", "file://./st", "local://st"],
    ids=["file", "dotted", "local"],
)
def test_a_bucket_opened_by_a_relative_file_url_is_addressed_where_it_was_opened(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `file://` bucket opened by a relative path lies under the working directory it was
    opened in, and its address says so: another process (a worker, a writer opening the
    store by its address) opens it there from whatever directory it runs in, and reaches
    the same answers, rather than an empty store of the same name in its own directory."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    store = Store.on_bucket(url)
    key = key_of("kept")
    store.keep(key, b"kept before", "plain")
    address = store.address()
    monkeypatch.chdir(tmp_path / "b")
    reopened = Store.from_address(address)  # type: ignore[arg-type]
    assert reopened.have([key]) == {key}
    assert reopened.address() == address
    _meet(store, reopened)
    assert list((tmp_path / "b").iterdir()) == []


@pytest.mark.parametrize("url", ["zip://store::file://packed.zip", "zip://store::packed.zip"])
def test_a_store_in_an_archive_named_by_a_relative_path_is_addressed_where_it_was_opened(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store read in an archive named by a relative path (after `file://`, or bare after
    `::`) is addressed by the archive where it was opened: opened by that address from
    another directory, it is the same archive, not one missing there."""
    key = key_of("kept")
    LocalStore(tmp_path / "store").keep(key, b"kept", "plain")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.make_archive(str(tmp_path / "a" / "packed"), "zip", tmp_path, "store")
    monkeypatch.chdir(tmp_path / "a")
    address = Store.on_bucket(url).address()
    monkeypatch.chdir(tmp_path / "b")
    reopened = Store.from_address(address)  # type: ignore[arg-type]
    assert bytes(reopened.recall(key)[1]) == b"kept"


def test_a_file_bucket_in_the_home_of_no_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `file://` URL in the home of a user this system does not know is refused with
    `BadAddress`, as the same directory given as a path is, rather than opened as a folder
    named `~nosuchuser` under the working directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadAddress, match=r"`~nosuchuser-somatize` names no home directory"):
        Store.on_bucket("file://~nosuchuser-somatize/features")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("opened", "match"),
    [
        (lambda: Store(None), r"str or an os\.PathLike.* got a `NoneType`; to keep and recall"),
        (lambda: Store(123), r"str or an os\.PathLike.* got a `int`"),
        (lambda: Store(path=b"features"), r"str or an os\.PathLike.* got a `bytes`"),
        (lambda: LocalStore(None), r"str or an os\.PathLike.* got a `NoneType`"),
        (lambda: Store(), r"was given neither: pass one"),
        (lambda: Store(durable=True), r"was given neither: pass one"),
    ],
    ids=["none", "int", "bytes", "local-none", "nothing", "options-only"],
)
def test_a_store_opened_at_no_path_is_refused_saying_what_it_takes(
    opened: Any, match: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store opened at something that is no str or os.PathLike, or at nothing, is refused
    with a TypeError saying what it takes, as ``store=`` is, and nothing is made."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match=match):
        opened()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("retrying", "match"),
    [
        ({"retries": -1}, r"retries is a count ≥ 0 .* got -1"),
        ({"retries": 2.5}, r"retries is a count ≥ 0 .* got 2\.5"),
        ({"retries": "3"}, r"retries is a count ≥ 0 .* got '3'"),
        ({"retries": True}, r"retries is a count ≥ 0 .* got True"),
        ({"backoff": -0.5}, r"backoff is finite seconds ≥ 0 .* got -0\.5"),
        ({"backoff": float("nan")}, r"backoff is finite seconds ≥ 0 .* got nan"),
        ({"backoff": float("inf")}, r"backoff is finite seconds ≥ 0 .* got inf"),
        ({"backoff": "0.1"}, r"backoff is finite seconds ≥ 0 .* got '0\.1'"),
    ],
)
def test_retrying_that_means_nothing_is_refused(retrying: dict[str, object], match: str) -> None:
    """A bucket store is opened only with a count of retries and finite seconds of backoff:
    anything else is BadAddress saying what is taken, not a failure at the first request."""
    with pytest.raises(BadAddress, match=match):
        Store.on_bucket("memory://somatize/retrying", **retrying)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("option", "value"),
    [("retries", 3), ("backoff", 0.1), ("signing_key", "s3cret"), ("cache", "cache")],
)
def test_an_address_with_what_lies_outside_options_in_them_is_refused(
    tmp_path: Path, option: str, value: object
) -> None:
    """An address whose storage options hold retries, backoff, a signing key or a cache is
    refused, saying where each belongs; no cache is opened from one."""
    address = {
        "home": "bucket",
        "url": f"file://{tmp_path / 'bucket'}",
        "options": {option: str(tmp_path / "cache") if option == "cache" else value},
        "retries": 5,
        "backoff": 0.05,
        "signed": None,
    }
    with pytest.raises(
        BadAddress, match=rf"storage `options` for the filesystem only, got \['{option}'\]"
    ):
        Store.from_address(address, environ={})
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("section", ["blobs", "blobs/ab", "tmp", "tmp/mine", "names", "names/x"])
def test_a_local_store_inside_another_stores_blobs_tmp_or_names_is_refused_at_open(
    tmp_path: Path, section: str
) -> None:
    """A store whose directory lies inside another store's blobs/, tmp/ or names/ is
    refused when it is opened, naming that store and the section, and makes nothing
    there: the other's gc would remove its files (they lie where that store keeps blobs
    and writes in progress) and its verify take them for its own names. Inside
    answers/ or packs/, or beside the store, it opens."""
    outer = Store(tmp_path / "outer")
    outer.keep("blake3:" + "1" * 64, b"the outer store's answer", "plain")
    top = section.split("/")[0]
    with pytest.raises(BadAddress, match=rf"inside the `{top}/` of the store at \S*outer"):
        Store(tmp_path / "outer" / section)
    assert not (tmp_path / "outer" / section / "answers").exists()
    for fine in ("outer/answers/mine", "outer/packs/mine", "beside"):
        Store(tmp_path / fine).keep("blake3:" + "2" * 64, b"an answer", "plain")
    assert Store(tmp_path / "outer").verify().ok


def test_a_local_store_is_refused_or_opened_by_where_its_path_leads(tmp_path: Path) -> None:
    """Whether a store lies inside another's blobs/, tmp/ or names/ is told by where its
    path leads, `..` and links followed, not by the folders it names: one reached through
    a link into another's names/ is refused, naming the folder it is, and one whose path
    passes through another's section on its way out of it opens."""
    outer = Store(tmp_path / "outer")
    outer.keep("blake3:" + "1" * 64, b"the outer store's answer", "plain")
    (tmp_path / "link").symlink_to(tmp_path / "outer" / "names")
    with pytest.raises(
        BadAddress,
        match=r"link/inner \(which is \S*outer/names/inner\): it lies inside the `names/`",
    ):
        Store(tmp_path / "link" / "inner")
    assert not (tmp_path / "outer" / "names" / "inner").exists()
    for fine in ("outer/blobs/../beside", "outer/names/../../elsewhere"):
        Store(tmp_path / fine).keep("blake3:" + "2" * 64, b"an answer", "plain")
    assert (tmp_path / "outer" / "beside" / "answers").is_dir()
    assert (tmp_path / "elsewhere" / "answers").is_dir()
    assert Store(tmp_path / "outer").verify().ok


@pytest.mark.parametrize("section", ["blobs/ab", "tmp/mine"])
def test_a_local_store_made_before_another_was_opened_above_it_outlives_its_gc(
    tmp_path: Path, section: str
) -> None:
    """A store made first, in what becomes another store's blobs/ or tmp/ once that one
    is opened above it, is none of that store's: its gc leaves it whole, and opening it
    there again is refused (move it beside the other to use it)."""
    root = tmp_path / "outer" / section
    inner = Store(root)
    inner.keep("blake3:" + "1" * 64, b"the inner store's answer", "plain")
    inner.bind("ds", inner.put(b"the inner store's dataset"))
    inner.close()
    held = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    with pytest.raises(BadAddress, match="holds files but no store"):
        Store(tmp_path / "outer")  # unmarked, holding another's files: no store of its own
    (tmp_path / "outer" / "somatize-store").touch()  # marked by hand, as the refusal says
    outer = Store(tmp_path / "outer")
    outer.keep("blake3:" + "2" * 64, b"the outer store's answer", "plain")
    outer.put(b"nothing refers to this")
    assert outer.gc(grace=0).blobs == 1
    assert sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file()) == held
    with pytest.raises(BadAddress, match="Open it beside that store"):
        Store(root)
    moved = Store(root.rename(tmp_path / "moved"))
    assert bytes(moved.recall("blake3:" + "1" * 64)[1]) == b"the inner store's answer"
    assert bytes(moved.get(moved.resolve("ds"))) == b"the inner store's dataset"


@pytest.mark.parametrize("section", ["names/proj", "names/a/b", "answers/old", "packs/old"])
def test_a_local_store_made_before_another_was_opened_above_it_is_no_name_record_or_pack(
    tmp_path: Path, section: str
) -> None:
    """A store made first in what becomes another store's names/, answers/ or packs/ once
    that one is opened above it is none of that store's: its verify lists the folder as
    stray, not its files as damaged names, records or packs, and its gc (even one dropping
    every answer) leaves every file of it whole."""
    root = tmp_path / "outer" / section
    inner = Store(root)
    inner.keep("blake3:" + "1" * 64, b"the inner store's answer", "plain")
    inner.keep_many([("blake3:" + "3" * 64, [b"an item"])], "plain")
    inner.bind("ds", inner.put(b"the inner store's dataset"))
    inner.close()
    held = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    with pytest.raises(BadAddress, match="holds files but no store"):
        Store(tmp_path / "outer")  # unmarked, holding another's files: no store of its own
    (tmp_path / "outer" / "somatize-store").touch()  # marked by hand, as the refusal says
    outer = Store(tmp_path / "outer")
    outer.keep("blake3:" + "2" * 64, b"the outer store's answer", "plain")
    outer.bind("mine", outer.put(b"the outer store's dataset"))
    beside = []  # a name bound under the folder's name since, beside its store's sections
    if section.startswith("names/"):
        beside.append(f"{section.removeprefix('names/')}/v1")
        outer.bind(beside[0], outer.put(b"a dataset named beside it"))
    found = outer.verify()
    assert found.ok and found.damaged == []
    assert (found.records, found.names) == (1, 1 + len(beside))
    assert found.stray == [f"{section}/"]
    assert outer.gc(0, grace=0).answers == 1
    held += [Path(name).relative_to(section.removeprefix("names/")) for name in beside]
    assert sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file()) == sorted(held)
    for name in beside:
        assert bytes(outer.get(outer.resolve(name))) == b"a dataset named beside it"
    again = Store(root.rename(tmp_path / "moved"))
    assert bytes(again.recall("blake3:" + "1" * 64)[1]) == b"the inner store's answer"
    assert bytes(again.get(again.resolve("ds"))) == b"the inner store's dataset"


def test_a_file_url_with_percent_escapes_names_the_folder_it_encodes(tmp_path: Path) -> None:
    """A `file://` URL as `Path.as_uri()` writes it (a space as `%20`, a non-ASCII letter
    as its escaped bytes) opens the folder it names, not one named by the escapes; the store's
    address, and a pickled copy, reach that same folder."""
    folder = tmp_path / "my store" / "café"
    store = Store(folder.as_uri())
    assert store.address() == Store.on_bucket(folder.as_uri()).address()
    _meet(store, LocalStore(folder))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my store"]
    _meet(Store.from_address(store.address()), store)  # type: ignore[arg-type]
    _meet(pickle.loads(pickle.dumps(store)), LocalStore(folder))


def test_a_file_url_opened_again_by_its_address_is_not_decoded_twice(tmp_path: Path) -> None:
    """A folder whose name holds `%` is written `%25` in its URL: the address names it so
    again, and a store opened from it reaches that folder, not the one its escape decodes to."""
    folder = tmp_path / "100%41"
    store = Store.on_bucket(folder.as_uri())
    _meet(store, LocalStore(folder))
    _meet(Store.from_address(store.address()), LocalStore(folder))  # type: ignore[arg-type]
    assert not (tmp_path / "100A").exists()


@pytest.mark.parametrize("name", ["a::b", "a%3A%3Ab"])
def test_a_file_url_whose_path_holds_a_double_colon_is_refused(tmp_path: Path, name: str) -> None:
    """fsspec reads `::` as joining filesystems, so a `file://` path holding it would open
    another folder: it is refused, saying how to open such a directory, and nothing is made."""
    with pytest.raises(BadAddress, match=r"holds `::`.*as a local store"):
        Store(f"file://{tmp_path}/{name}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["file://{}/a%00b", "simplecache::file://{}/a%00b"])
def test_a_file_url_whose_escapes_decode_to_nul_is_refused(tmp_path: Path, url: str) -> None:
    """A `file://` path whose escapes decode to a NUL character (`%00`), which no folder's
    name can hold, is refused as a bad address (not the OS's ValueError), and
    nothing is made."""
    with pytest.raises(BadAddress, match="NUL character"):
        Store(url.format(tmp_path))
    with pytest.raises(BadAddress, match="NUL character"):
        Store.on_bucket(url.format(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_store_kept_under_a_file_url_s_escapes_as_written_is_not_left_for_an_empty_one(
    tmp_path: Path,
) -> None:
    """A store kept in the folder a `file://` URL's escapes name as written (`my%20store`,
    made before such a path was decoded) is not silently left for an empty store in the
    folder they decode to: the URL is refused, saying how to reach it, nothing is made, and
    the URL that writes its `%` as `%25` reaches it."""
    kept = LocalStore(tmp_path / "my%20store")
    key = "blake3:" + "ab" * 32
    kept.keep(key, b"kept before", "plain")
    url = f"file://{tmp_path}/my%20store"
    with pytest.raises(BadAddress, match=r"my%20store.*write each `%` of its name as `%25`"):
        Store(url)
    with pytest.raises(BadAddress, match="decoded"):
        Store.on_bucket(url)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my%20store"]
    again = Store.on_bucket(f"file://{tmp_path}/my%2520store")
    assert bytes(again.recall(key)[1]) == b"kept before"


class _BytesPath:
    """An os.PathLike whose path is bytes (`os.fsencode`d), as some path libraries hand."""

    def __fspath__(self) -> bytes:
        return b"features"


def test_a_path_like_of_bytes_is_refused_saying_what_to_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path-like object whose path is bytes is refused with a `TypeError` that says a
    store's directory is a str path — not Python's bare "a bytes-like object is required"
    from deep inside — and nothing is made."""
    monkeypatch.chdir(tmp_path)
    g = Graph.somatize(Echo().named("e").frozen().cached())
    for opened in (
        lambda: Store(_BytesPath()),  # type: ignore[arg-type]
        lambda: Store.of(_BytesPath()),  # type: ignore[arg-type]
        lambda: g.forward(1, store=_BytesPath()),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError, match=r"path as bytes.*os\.fsdecode"):
            opened()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("$HOME/features", r"`\$HOME`.*not expanded.*os\.path\.expandvars"),
        ("${SCRATCH}/features", r"`\$\{SCRATCH\}`.*not expanded"),
        ("features\n", r"control character.*strip"),
        ("feat\tures", r"control character"),
    ],
)
def test_a_new_store_path_holding_a_variable_or_a_line_end_is_refused(
    path: str, match: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path that names `$HOME` (a variable left unexpanded, from a config file or an
    env file) or ends in a line end (read from a file) would make a folder named so under
    the working directory, where no run that spells the path as meant finds its answers:
    a store to be made there is refused, naming what to do, and nothing is made. A
    directory of that very name made first is opened, as asked."""
    monkeypatch.chdir(tmp_path)
    g = Graph.somatize(Echo().named("e").frozen().cached())
    for opened in (lambda: Store(path), lambda: Store.of(path), lambda: g.forward(1, store=path)):
        with pytest.raises(BadAddress, match=match):
            opened()
    assert list(tmp_path.iterdir()) == []
    (tmp_path / path).mkdir(parents=True)
    store = Store(path)
    assert isinstance(store, LocalStore) and store.root == tmp_path / path
    assert (tmp_path / path / "blobs").is_dir()


@pytest.mark.parametrize("folder", ["a$b", "run${1}", "tab\there"])
def test_a_new_store_under_a_folder_whose_name_holds_a_dollar_or_a_tab_is_made(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the folders a new store makes are looked at for an unexpanded variable or a
    control character: a folder of such a name that is there already (one the user made,
    a home named so) is what the path means, and a store under it is made."""
    (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path)
    for path in (tmp_path / folder / "store", f"{folder}/relative"):
        store = Store(path)
        assert isinstance(store, LocalStore) and store.root == tmp_path / path
        assert store.root.joinpath("blobs").is_dir()
    with pytest.raises(BadAddress, match=r"`\$HOME`.*not expanded"):
        Store(tmp_path / folder / "$HOME" / "store")


def test_a_store_opened_by_a_link_repointed_since_gives_the_address_it_writes_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store opened by a link (`current` → one store) keeps answers where the link leads
    now; its address, asked again after the link is repointed to another store, names
    that one — so workers opened from it reach the answers this process keeps, not the
    store the link led to when the address was first asked."""
    monkeypatch.chdir(tmp_path)
    LocalStore("first"), LocalStore("second")
    os.symlink("first", "current")
    store = LocalStore("current")
    assert store.address()["root"] == str((tmp_path / "first").resolve())
    os.unlink("current")
    os.symlink("second", "current")
    kept = key_of("kept after the link moved")
    store.keep(kept, b"answer", "plain")
    assert store.address()["root"] == str((tmp_path / "second").resolve())
    worker = Store.from_address(store.address())
    assert bytes(worker.recall(kept)[1]) == b"answer"


def test_a_store_pickled_after_its_address_was_asked_is_addressed_by_either_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store pickled once its address was asked (a model holding it saved, a job sent to
    a worker) carries no root resolved here: the release before this one (f43888e), loading
    it, gave what it carried as the root itself, a pair it then refused to open. Loaded
    here, a store that release pickled (its root resolved as a path) is resolved again, to
    where a link repointed since leads."""
    monkeypatch.chdir(tmp_path)
    LocalStore("first"), LocalStore("second")
    os.symlink("first", "current")
    store = LocalStore("current")
    store.address()
    carried = store.__reduce_ex__(pickle.HIGHEST_PROTOCOL)[2]
    resolved = carried["_resolved"]  # f43888e's address() gives it as the root, if not None
    root = str(store.root.resolve()) if resolved is None else resolved
    assert Store.from_address({**store.address(), "root": root}).address() == store.address()

    before = {**carried, "_resolved": str((tmp_path / "first").resolve())}
    os.unlink("current")
    os.symlink("second", "current")
    loaded = LocalStore.__new__(LocalStore)
    loaded.__setstate__(before)
    assert loaded.address()["root"] == str((tmp_path / "second").resolve())


def test_a_relative_store_path_from_a_removed_current_directory_is_refused_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative path is taken from the current directory; where that was removed since
    the program moved into it (a run's output folder cleaned up), opening a store there is
    refused with `BadAddress` saying so — as `store=` of a graph is — not a bare
    `FileNotFoundError` naming no file."""
    gone = tmp_path / "run"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    for opened in (
        lambda: Store("features"),
        lambda: Store.of("features"),
        lambda: Store.on_bucket("file://features"),
        lambda: Store.on_bucket("memory://team/features", cache="blobs-cache"),
    ):
        with pytest.raises(BadAddress, match=r"current directory, which is gone.*absolute"):
            opened()


@pytest.mark.parametrize("path", ["current", "current/features"])
@pytest.mark.parametrize("read_only", [False, True])
def test_a_store_through_a_link_that_leads_nowhere_is_refused_naming_the_link(
    path: str, read_only: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store's directory reached through a link that leads nowhere (to a disk not
    mounted, a folder moved) or to itself is refused naming the link and where it leads —
    not a bare "File exists", nor "holds files but no store" — and nothing is made."""
    monkeypatch.chdir(tmp_path)
    os.symlink(tmp_path / "unmounted" / "stores", "current")
    with pytest.raises(BadAddress, match=r"`.*current` is a link to .*unmounted/stores.*no"):
        LocalStore(path, read_only=read_only)
    os.unlink("current")
    os.symlink("current", "current")
    with pytest.raises(BadAddress, match=r"`.*current` is a link .*loop"):
        LocalStore(path, read_only=read_only)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current"]
