"""The bucket store's own promises: batched have(), retries, a read-through cache, and
downloads checked against their digest — against S3 on loopback where it matters."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import errno
import io
import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from http import HTTPStatus
from pathlib import Path
from typing import Any

import blake3
import pytest
from moto.core.authorization import enable_iam_authentication

from somatize import Corrupt, Graph, Store
from somatize.cli import main
from somatize.store import (
    BadAddress,
    BadName,
    BucketStore,
    LocalStore,
    Missing,
    NameNotFound,
    StoreError,
)
from somatize.store.records import encode_record
from somatize.store.upkeep import survey
from tests.conftest_s3 import READS, s3_options, s3_url, user
from tests.forked import in_forked_child
from tests.nodes import Largest, Rows, Scale, Square
from tests.web_server import served_over_http


def key_of(label: str) -> str:
    return "blake3:" + blake3.blake3(label.encode()).hexdigest()


def key_of_bytes(data: bytes) -> str:
    """The digest a store keeps ``data`` under."""
    return "blake3:" + blake3.blake3(data).hexdigest()


def objects(store: Store) -> dict[str, bytes]:
    """Every object under ``store``'s prefix and what it holds, read afresh."""
    assert isinstance(store, BucketStore)
    store.fs.invalidate_cache()
    return {path: store.fs.cat_file(path) for path in store.fs.find(store.root)}


class Counting:
    """Wraps a filesystem method, counting calls and failing the first ``fail`` of them."""

    def __init__(self, real: Any, fail: int = 0, error: BaseException | None = None) -> None:
        self.real, self.fail, self.error, self.calls = real, fail, error, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls <= self.fail:
            assert self.error is not None
            raise self.error
        return self.real(*args, **kwargs)


def test_have_on_many_keys_lists_instead_of_asking_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """have() over 168 unknown keys costs two listings, not a request per key."""
    store = Store.on_bucket(s3_url(), **s3_options())
    kept = [key_of(f"k{i}") for i in range(8)]
    for key in kept:
        store.keep(key, b"v", "plain")
    fresh = Store.on_bucket(store.url, **s3_options())
    assert isinstance(fresh, BucketStore)
    finds, cats = Counting(fresh.fs.find), Counting(fresh.fs._cat_file)
    monkeypatch.setattr(fresh.fs, "find", finds)
    monkeypatch.setattr(fresh.fs, "_cat_file", cats)
    asked = kept + [key_of(f"absent{i}") for i in range(160)]
    assert fresh.have(asked) == set(kept)
    assert finds.calls <= 2 and cats.calls == 0


def test_transient_failures_are_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two connection failures in a row are retried away; the answer comes back."""
    store = Store.on_bucket("memory://somatize/retry", backoff=0.0)
    assert isinstance(store, BucketStore)
    key = key_of("retry")
    store.keep(key, b"value", "plain")
    fresh = Store.on_bucket("memory://somatize/retry", backoff=0.0)
    assert isinstance(fresh, BucketStore)
    flaky = Counting(fresh.fs.cat_file, fail=2, error=ConnectionResetError("reset by peer"))
    monkeypatch.setattr(fresh.fs, "cat_file", flaky)
    assert bytes(fresh.recall(key)[1]) == b"value"
    assert flaky.calls >= 3


def _cut_short_by_aiohttp() -> BaseException:
    import aiohttp

    return aiohttp.ClientPayloadError("Response payload is not completed")


def _cut_short_by_botocore() -> BaseException:
    from botocore.exceptions import IncompleteReadError

    return IncompleteReadError(actual_bytes=74, expected_bytes=148)


@pytest.mark.parametrize("cut_short", [_cut_short_by_aiohttp, _cut_short_by_botocore])
def test_a_body_cut_short_is_retried_as_s3fs_would(
    monkeypatch: pytest.MonkeyPatch, cut_short: Any
) -> None:
    """A response whose body ended before its length (the connection dropped mid-body),
    which s3fs would retry itself and a bucket store has it make once, is made again by
    the store: the answer and the name come back, never the client's own error."""
    store = Store.on_bucket(s3_url(), backoff=0.0, **s3_options())
    key = key_of("cut short")
    store.keep(key, b"value" * 100, "plain")
    store.bind("cut/short", store.put(b"dataset"))
    fresh = Store.on_bucket(store.url, backoff=0.0, **s3_options())
    assert isinstance(fresh, BucketStore)
    flaky = Counting(fresh.fs.cat_file, fail=2, error=cut_short())
    monkeypatch.setattr(fresh.fs, "cat_file", flaky)
    assert bytes(fresh.recall(key)[1]) == b"value" * 100
    assert fresh.resolve("cut/short") == key_of_bytes(b"dataset")
    assert flaky.calls >= 5


def test_persistent_failure_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that keeps failing becomes a StoreError that says how often and why."""
    store = Store.on_bucket("memory://somatize/down", retries=2, backoff=0.0)
    assert isinstance(store, BucketStore)
    monkeypatch.setattr(store.fs, "cat_file", Counting(None, fail=99, error=TimeoutError("slow")))
    with pytest.raises(StoreError, match="failed 3 times"):
        store.resolve("some/name")


def test_a_request_s3_refuses_as_made_is_said_at_once_not_taken_for_an_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request S3 refuses as it was made (a key longer than it holds, which s3fs says as
    an OSError of ENAMETOOLONG; a bucket in another region, EREMCHG) is made once and said
    to be refused, not made again and again and said to find the bucket unreachable."""
    store = Store.on_bucket("memory://somatize/refused", backoff=0.0)
    assert isinstance(store, BucketStore)
    for number in (errno.ENAMETOOLONG, errno.EREMCHG):
        refused = Counting(None, fail=99, error=OSError(number, "refused as made"))
        monkeypatch.setattr(store.fs, "cat_file", refused)
        with pytest.raises(StoreError, match=r"was refused .* asking again will not change"):
            store.resolve("some/name")
        assert refused.calls == 1


def test_refused_credentials_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Permission refused is said at once, pointing at the credentials."""
    store = Store.on_bucket("memory://somatize/denied", backoff=0.0)
    assert isinstance(store, BucketStore)
    denied = Counting(None, fail=99, error=PermissionError("403 Forbidden"))
    monkeypatch.setattr(store.fs, "cat_file", denied)
    with pytest.raises(StoreError, match="check the credentials"):
        store.resolve("some/name")
    assert denied.calls == 1


def test_cache_in_front_serves_repeat_reads(tmp_path: Path) -> None:
    """With a cache, a second process recalls from local disk even when the bucket's copy
    of the blob is gone; the cached copy was verified when it was downloaded."""
    url = s3_url()
    writer = Store.on_bucket(url, **s3_options())
    key = key_of("cached")
    answer = writer.keep(key, b"v" * 5000, "plain")
    first = Store.on_bucket(url, cache=tmp_path / "cache", **s3_options())
    assert bytes(first.recall(key)[1]) == b"v" * 5000
    assert isinstance(writer, BucketStore)
    writer.fs.rm(writer._blob_path(answer.value))
    second = Store.on_bucket(url, cache=tmp_path / "cache", **s3_options())
    assert second.have([key]) == {key}
    assert bytes(second.recall(key)[1]) == b"v" * 5000


def test_a_cache_folder_removed_while_in_use_is_made_again_and_bound(tmp_path: Path) -> None:
    """A cache folder removed while its bucket store is open (a user clearing it) is made
    again by the next copy into it, bound to that store as when it was opened: the cache
    goes on saving requests, and another bucket store is still refused it."""
    url = s3_url()
    cache = tmp_path / "cache"
    store = Store.on_bucket(url, cache=cache, **s3_options())
    shutil.rmtree(cache)
    digest = store.put(b"a dataset")
    key = key_of("kept after the cache was cleared")
    store.keep(key, b"an answer", "plain")
    assert (cache / "bucket").is_file()
    assert store.local_blob(digest) is not None
    assert Store(cache).have([key]) == {key}
    with pytest.raises(BadAddress, match="its own cache folder"):
        Store.on_bucket(s3_url(), cache=cache, **s3_options())


def test_a_cache_folder_serves_one_bucket_store(tmp_path: Path) -> None:
    """A cache folder is bound to the bucket and prefix that first use it: a store of
    another prefix is refused it, naming both, instead of being handed an answer only the
    first one kept; another store object of the same bucket and prefix shares it."""
    cache = tmp_path / "cache"
    first = Store.on_bucket(s3_url(), cache=cache, **s3_options())
    key = key_of("kept by the first")
    first.keep(key, b"the first's answer", "plain")
    other = s3_url()
    with pytest.raises(BadAddress, match="its own cache folder") as refused:
        Store.on_bucket(other, cache=cache, **s3_options())
    assert first.url in str(refused.value) and other in str(refused.value)
    assert Store.on_bucket(other, **s3_options()).have([key]) == set()
    again = Store.on_bucket(f"{first.url}/", cache=cache, **s3_options())
    assert again.have([key]) == {key}
    assert bytes(again.recall(key)[1]) == b"the first's answer"


def test_a_cache_folder_serves_one_endpoint(tmp_path: Path) -> None:
    """A cache folder is bound to the server too: the same bucket and prefix reached
    through another endpoint (another S3-compatible server, for all the cache can tell) is
    refused it, naming both endpoints, instead of being handed answers it never kept."""
    cache = tmp_path / "cache"
    url = s3_url()
    first = Store.on_bucket(url, cache=cache, **s3_options())
    first.keep(key_of("kept on the first server"), b"an answer", "plain")
    endpoint = s3_options()["client_kwargs"]["endpoint_url"]
    elsewhere = endpoint.replace("127.0.0.1", "localhost")
    with pytest.raises(BadAddress, match="its own cache folder") as refused:
        Store.on_bucket(url, cache=cache, key="x", secret="x", endpoint_url=elsewhere)
    assert endpoint in str(refused.value) and elsewhere in str(refused.value)
    again = Store.on_bucket(url, cache=cache, key="x", secret="x", endpoint_url=endpoint)
    assert again.have([key_of("kept on the first server")]) == {key_of("kept on the first server")}


def test_a_cache_folder_made_before_binding_is_bound_to_its_first_store(tmp_path: Path) -> None:
    """A cache folder that names no bucket store yet (made before folders were bound) keeps
    serving: the first bucket store to use it takes it, and it is then refused to others."""
    cache = tmp_path / "cache"
    url = s3_url()
    key = key_of("cached before binding")
    Store.on_bucket(url, cache=cache, **s3_options()).keep(key, b"cached", "plain")
    (cache / "bucket").unlink()  # as a folder made before folders were bound
    reader = Store.on_bucket(url, cache=cache, **s3_options())
    assert isinstance(reader, BucketStore) and reader.cache is not None
    assert reader.cache.have([key]) == {key}
    assert bytes(reader.recall(key)[1]) == b"cached"
    endpoint = s3_options()["client_kwargs"]["endpoint_url"]
    assert (cache / "bucket").read_text() == f"{url} at {endpoint}\n"
    with pytest.raises(BadAddress, match=url):
        Store.on_bucket(s3_url(), cache=cache, **s3_options())


def test_a_cache_folder_whose_binding_was_cut_short_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache folder whose file naming its bucket store was left part written (a process
    stopped while writing it, where there are no hard links) binds it to no store: it is
    refused, saying which file to remove, rather than taken by whichever store comes."""
    monkeypatch.setattr("somatize.store.bucket._MARK_WAIT", 0.05)
    url = f"memory://somatize/{key_of('cut short')[7:19]}"
    LocalStore(tmp_path / "cache")
    (tmp_path / "cache" / "bucket").write_bytes(b"memory:///somatize/")
    with pytest.raises(BadAddress, match="names no bucket store whole"):
        Store.on_bucket(url, cache=tmp_path / "cache")


@pytest.mark.parametrize("links", [True, False])
def test_stores_opening_a_new_cache_folder_at_once_bind_it_to_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, links: bool
) -> None:
    """Stores of several prefixes opening one new cache folder at the same moment: one binds
    it and the others are refused; stores of that one prefix all share it. Without hard
    links (a filesystem that has none) the folder is bound all the same."""
    if not links:

        def link(*args: Any) -> None:
            raise PermissionError("no hard links here")

        monkeypatch.setattr(os, "link", link)
    base = f"memory://somatize/{key_of(f'binding {links}')[7:19]}"
    urls = [f"{base}/p{i % 3}" for i in range(9)]
    start = threading.Barrier(len(urls))
    opened: dict[int, str] = {}

    def open_one(i: int) -> None:
        start.wait()
        try:
            Store.on_bucket(urls[i], cache=tmp_path / "cache")
            opened[i] = "opened"
        except BadAddress:
            opened[i] = "refused"

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(len(urls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    bound = (tmp_path / "cache" / "bucket").read_text()
    winner = next(u for u in urls if bound == f"memory:///{u.removeprefix('memory://')}\n")
    assert opened == {i: "opened" if urls[i] == winner else "refused" for i in range(len(urls))}
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.endswith(".part")] == []


def _full_fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
    """``os.fdopen`` on a full disk: the file was made, and nothing can be written into it."""
    os.close(fd)
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_cache_folder_opened_on_a_full_disk_is_bound_once_it_has_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new cache folder whose file naming its bucket store could not be written as the
    store was opened (its disk full) is bound by that store's first copy into it once there
    is room, and then refused to a store of another prefix: left unbound, the next store to
    come would take it and be handed the first one's answers, which it never kept. While it
    cannot be bound, nothing is copied into it, and keeping goes on."""
    base = f"memory://somatize/{key_of('full as opened')[7:19]}"
    cache = tmp_path / "cache"

    with monkeypatch.context() as disk:
        disk.setattr(os, "fdopen", _full_fdopen)
        first = Store.on_bucket(f"{base}/first", cache=cache)
        early = key_of("kept while the disk was full")
        first.keep(early, b"an early answer", "plain")
    assert isinstance(first, BucketStore) and first.cache is not None
    assert first.cache.have([early]) == set()
    key = key_of("kept once there was room")
    first.keep(key, b"the first's answer", "plain")
    assert first.cache.have([key]) == {key}
    assert (cache / "bucket").read_text() == f"memory:///{base.removeprefix('memory://')}/first\n"
    with pytest.raises(BadAddress, match="its own cache folder"):
        Store.on_bucket(f"{base}/other", cache=cache)
    assert bytes(first.recall(early)[1]) == b"an early answer"


def test_a_store_whose_cache_folder_another_bound_meanwhile_recalls_none_of_its_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache folder left unbound as a store was opened (its disk full), then bound by a
    store of another prefix once there was room, holds that store's answers, found by key
    alone: the first store recalls none of them, never an answer its bucket did not keep,
    and still recalls its own from its bucket."""
    base = f"memory://somatize/{key_of('bound meanwhile')[7:19]}"
    cache = tmp_path / "cache"

    with monkeypatch.context() as disk:
        disk.setattr(os, "fdopen", _full_fdopen)
        first = Store.on_bucket(f"{base}/first", cache=cache)
    other = Store.on_bucket(f"{base}/other", cache=cache)
    theirs = key_of("the other's")
    other.keep(theirs, b"the other's answer", "plain")
    own = key_of("the first's own")
    first.keep(own, b"the first's answer", "plain")
    assert first.have([theirs, own]) == {own}
    with pytest.raises(Missing):
        first.recall(theirs)
    assert bytes(first.recall(own)[1]) == b"the first's answer"


def test_damaged_download_is_refused() -> None:
    """A blob whose bytes in the bucket no longer match its digest is Corrupt, not returned."""
    store = Store.on_bucket("memory://somatize/damaged")
    assert isinstance(store, BucketStore)
    digest = store.put(b"genuine bytes")
    store.fs.pipe_file(store._blob_path(digest), b"forged! bytes")
    with pytest.raises(Corrupt, match="hashes to"):
        Store.on_bucket("memory://somatize/damaged").get(digest)


@pytest.mark.parametrize("kept", ["packed", "alone"])
def test_a_blob_cut_short_in_the_bucket_is_moved_to_quarantine(kept: str) -> None:
    """A blob in the bucket cut short (fewer bytes than its pack index or record says) is
    Corrupt when read and moved to quarantine/, as a blob damaged at its full size is: a
    store object opened afterwards finds it gone (Missing, recomputed) rather than
    downloading it again."""
    url = s3_url()
    writer = Store.on_bucket(url, **s3_options())
    assert isinstance(writer, BucketStore)
    items = [(key_of(f"cut {i}"), f"row {i} of the pack".encode()) for i in range(3)]
    if kept == "packed":
        writer.keep_many(items, "plain")
    else:
        writer.keep(*items[0], "plain")
    [blob] = [path for path in objects(writer) if "/blobs/" in path]
    writer.fs.pipe_file(blob, writer.fs.cat_file(blob)[:-2])
    reader = Store.on_bucket(url, **s3_options(), skip_instance_cache=True)
    with pytest.raises(Corrupt, match="where its answer says"):
        reader.recall(items[0][0])
    found = objects(writer)
    assert blob not in found
    assert [path for path in found if "/quarantine/blobs/" in path] != []
    later = Store.on_bucket(url, **s3_options(), skip_instance_cache=True)
    with pytest.raises(Missing):
        later.recall(items[0][0])


def test_a_whole_blob_whose_record_says_another_size_is_left_in_place() -> None:
    """A blob that hashes to its digest, under a record that says another size (the record
    is wrong, not the blob), is Corrupt when recalled and stays where it is: no answer that
    shares the blob loses it."""
    store = Store.on_bucket("memory://somatize/sized")
    assert isinstance(store, BucketStore)
    key = key_of("sized wrong")
    answer = store.keep(key, b"hello world", "plain")
    wrong = dataclasses.replace(answer, size=answer.size + 4)
    store.fs.pipe_file(store._answer_path(key), encode_record(wrong, None))
    with pytest.raises(Corrupt, match="the answer's record or pack index is damaged"):
        Store.on_bucket("memory://somatize/sized").recall(key)
    assert store.fs.cat_file(store._blob_path(answer.value)) == b"hello world"


def test_a_blob_damaged_on_its_way_is_read_again_and_left_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A download whose bytes do not hash to the blob's digest, though the blob in the
    bucket is whole (damaged on its way), is read once more: the genuine bytes come back
    and the blob stays where it is, not moved aside, which would lose a blob bound to a
    name that no recompute writes again."""
    store = Store.on_bucket("memory://somatize/flipped")
    assert isinstance(store, BucketStore)
    digest = store.put(b"genuine bytes")
    store.bind("data/set", digest)
    fresh = Store.on_bucket("memory://somatize/flipped")
    assert isinstance(fresh, BucketStore)
    real = fresh.fs.cat_file
    flipped = [0]

    def on_its_way(path: str, *args: Any, **kwargs: Any) -> bytes:
        data: bytes = real(path, *args, **kwargs)
        if "/blobs/" in path and not flipped[0]:
            flipped[0] += 1
            return b"forged! bytes"
        return data

    monkeypatch.setattr(fresh.fs, "cat_file", on_its_way)
    assert bytes(fresh.get(fresh.resolve("data/set"))) == b"genuine bytes"
    assert flipped[0] == 1
    assert store.fs.exists(store._blob_path(digest))


def test_graph_runs_against_a_bucket() -> None:
    """A forward keeps into S3 and the next forward, in a fresh store object, recalls."""
    url = s3_url()
    x = {"at": 0, "take": 8}

    def graph() -> Graph:
        return Graph.somatize(
            Rows().named("rows").frozen()
            >> Scale().named("scale").frozen()
            >> Largest().named("top").frozen().cached()
        )

    first = graph()
    value = first.forward(x, store=Store.on_bucket(url, **s3_options()))
    second = graph()
    assert second.forward(x, store=Store.on_bucket(url, **s3_options())) == value
    assert second.record.outcome["top"] == "recalled"
    assert second.record.outcome["rows"] == "spared"


def test_a_bucket_opened_asynchronous_is_refused_saying_what_to_do() -> None:
    """A store's calls are made and answered on the calling thread, so a filesystem opened
    for awaiting (``asynchronous=True``, what an asyncio server might pass) would fail at
    its first request with fsspec's "Loop is not running". It is refused as it is opened,
    given for the URL's own layer by its protocol too, saying to drop the option and run
    the forward off the event loop."""
    x = {"at": 0, "take": 4}
    refusal = r"asynchronous=True.*drop it.*asyncio\.to_thread"
    for where, options in (
        (s3_url(), {**s3_options(), "asynchronous": True}),
        (f"simplecache::{s3_url()}", {"s3": {**s3_options(), "asynchronous": True}}),
        (s3_url(), {"s3": {**s3_options(), "asynchronous": True}}),  # by its protocol
    ):
        with pytest.raises(BadAddress, match=refusal):
            Store.on_bucket(where, **options)

    async def served() -> float:
        g = Graph.somatize(
            Rows().named("rows").frozen() >> Largest().named("top").frozen().cached()
        )
        store = Store.on_bucket(s3_url(), **s3_options())
        return await asyncio.wait_for(asyncio.to_thread(g.forward, x, store=store), 60)

    assert asyncio.run(served()) == 3.0


def _use_in_child(store: Store, kept: str, new: str) -> tuple[set[str], bytes, bool]:
    found = store.have([kept])
    value = bytes(store.recall(kept)[1])
    store.keep(new, b"kept by the child", "plain")
    return found, value, store.have([new]) == {new}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_uses_the_bucket_store_its_parent_used() -> None:
    """A child forked from a process that used a bucket store (a DataLoader worker) uses it
    too: it opens the filesystem afresh, since the parent's async client refuses every
    request made in another process."""
    store = Store.on_bucket(s3_url(), **s3_options())
    kept, new = key_of("kept by the parent"), key_of("kept by the child")
    store.keep(kept, b"kept by the parent", "plain")
    found, value, seen = in_forked_child(_use_in_child, store, kept, new, timeout=60)
    assert (found, value, seen) == ({kept}, b"kept by the parent", True)
    assert bytes(store.recall(new)[1]) == b"kept by the child"


@pytest.mark.parametrize("home", ["s3", "memory", "file"])
def test_a_prefix_holding_pattern_characters_is_a_plain_path(home: str, tmp_path: Path) -> None:
    """A store under ``exp[lr=0.1]*?/`` (legal in a bucket's keys) reads, checks and
    collects what it keeps: its paths are read and removed as they are, never expanded as
    patterns (which matched nothing, and failed every batched read)."""
    where = f"{uuid.uuid4().hex[:8]}/exp[lr=0.1]*?"
    homes = {"memory": f"memory://b/{where}", "file": f"file://{tmp_path}/{where}"}
    url, options = (f"{s3_url()}/{where}", s3_options()) if home == "s3" else (homes[home], {})
    one, two = key_of("one"), key_of("two")
    store = Store.on_bucket(url, **options)
    store.keep(one, b"one", "plain")
    store.keep(two, b"two", "plain")
    assert Store.on_bucket(url, **options).have([one, two]) == {one, two}
    assert Store.on_bucket(url, **options).verify().ok
    done = Store.on_bucket(url, **options).gc(max_bytes=0, grace=0)
    assert (done.answers, done.blobs) == (2, 2)
    assert Store.on_bucket(url, **options).have([one, two]) == set()


def test_a_signed_gc_empties_a_cache_holding_what_another_key_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signed bucket store's gc, whose cache folder holds only records a process without
    the key copied there, collects the bucket and then the cache (copies only), not
    refusing it for its key after the bucket's gc is done; and so does the next gc."""
    monkeypatch.delenv("SOMATIZE_STORE_KEY", raising=False)
    url, cache = s3_url(), tmp_path / "cache"
    Store.on_bucket(url, signing_key="team", **s3_options()).keep(key_of("a"), b"a", "plain")
    unsigned = Store.on_bucket(url, cache=cache, **s3_options())
    unsigned.keep(key_of("b"), b"b", "plain")
    unsigned.close()
    for _ in range(2):
        done = Store.on_bucket(url, cache=cache, signing_key="team", **s3_options()).gc(grace=0)
        assert done.answers == 0
    assert not LocalStore(cache).have([key_of("a")])


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("s3://My_Bucket!/features", "names the bucket `My_Bucket!`, which S3 cannot have"),
        ("s3://a+b/features", "names the bucket `a+b`, which S3 cannot have"),
        ("s3://", "names no bucket"),
    ],
)
def test_an_s3_url_naming_no_bucket_s3_can_have_is_refused_at_open(
    url: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An S3 URL whose bucket's name S3 cannot have is refused when the store is opened,
    not by every request after; the command line says so in one line and exits 2."""
    with pytest.raises(BadAddress, match=re.escape(said)):
        Store.on_bucket(url, **s3_options())
    assert main(["store", "gc", "--store", url]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1


def test_recalling_from_a_bucket_that_does_not_exist_says_so() -> None:
    """A recall, or a blob fetched, from a bucket nobody made is Missing, and says the
    bucket does not exist rather than only that nothing is kept in it; from a bucket that
    exists, a miss says nothing of buckets."""
    store = Store.on_bucket(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x", **s3_options())
    said = "the bucket `no-such-bucket-"
    with pytest.raises(Missing, match=re.escape(said)):
        store.recall(key_of("a"))
    with pytest.raises(Missing, match=re.escape(said)):
        store.get("blake3:" + "0" * 64)
    with pytest.raises(Missing) as missed:
        Store.on_bucket(s3_url(), **s3_options()).recall(key_of("a"))
    assert "bucket" not in str(missed.value)


def test_a_bucket_of_an_older_naming_is_reached_as_it_is() -> None:
    """A bucket named as buckets made now cannot be (capitals, underscores: older buckets,
    S3-compatible servers) is reached: the client sends its name, and it was refused at
    open with the rules for new buckets."""
    import s3fs

    s3fs.S3FileSystem(**s3_options()).mkdir("Legacy_Bucket")
    store = Store.on_bucket("s3://Legacy_Bucket/features", **s3_options())
    store.bind("data/v1", store.put(b"rows"))
    assert store.get(store.resolve("data/v1")) == b"rows"


def test_a_mistyped_storage_option_is_a_bad_address() -> None:
    """A storage option the client does not take (``endpoint=`` for ``endpoint_url``)
    fails the first request with a BadAddress naming the URL, not the client's TypeError."""
    options = {**s3_options(), "endpoint": "http://127.0.0.1:1"}
    store = Store.on_bucket(s3_url(), **options)
    for call in (lambda: store.have([key_of("a"), key_of("b")]), lambda: store.put(b"x")):
        with pytest.raises(BadAddress, match=rf"on {re.escape(store.url)} could not be asked"):
            call()


@pytest.mark.parametrize(("mine", "theirs"), [("d", "d/small"), ("d/small", "d")])
def test_a_name_and_a_name_under_it_bound_at_once_are_never_both_bound(
    monkeypatch: pytest.MonkeyPatch, mine: str, theirs: str
) -> None:
    """Another process binding a name above or under this bind's, after this bind looked
    and before it wrote, makes it take its own name back and refuse: the bucket never holds
    a name with names under it."""
    url = s3_url()
    store, other = Store.on_bucket(url, **s3_options()), Store.on_bucket(url, **s3_options())
    assert isinstance(store, BucketStore)
    digest = store.put(b"a dataset's bytes")
    write = store._write

    def meanwhile(path: str, pieces: Any) -> None:
        other.bind(theirs, digest)  # it looks before this bind writes: it finds nothing
        write(path, pieces)

    monkeypatch.setattr(store, "_write", meanwhile)
    with pytest.raises(BadName, match=r"would lie under it|names are bound under"):
        store.bind(mine, digest)
    fresh = Store.on_bucket(url, **s3_options())
    assert fresh.resolve(theirs) == digest
    with pytest.raises(NameNotFound):
        fresh.resolve(mine)


def _logged(store: BucketStore) -> set[str]:
    """The keys and pack ids ``store``'s ``used/`` logs hold times of."""
    store.fs.invalidate_cache()
    out: set[str] = set()
    for path in store.fs.find(f"{store.root}/used"):
        log = json.loads(store.fs.cat_file(path))
        out |= set(log.get("answers", {})) | set(log.get("packs", {}))
    return out


def test_a_gc_keeps_the_use_times_of_what_it_kept_alone() -> None:
    """The ``used/`` log a gc writes in place of those it merged holds the times of the
    answers it kept, not of those it dropped: the logs do not grow with every key ever
    recalled."""
    url = s3_url()
    dropped, kept = key_of("dropped"), key_of("kept")
    store = Store.on_bucket(url, **s3_options())
    store.keep(dropped, b"dropped", "plain")
    store.recall(dropped)
    store.close()
    gc = Store.on_bucket(url, **s3_options())
    assert isinstance(gc, BucketStore)
    assert gc.gc(max_bytes=0, grace=0).answers == 1
    assert _logged(gc) == set()
    store.keep(kept, b"kept", "plain")
    store.recall(kept)
    store.close()
    assert gc.gc(grace=0).answers == 0
    assert _logged(gc) == {kept}


def _two_kept(older: str, newer: str) -> BucketStore:
    """A fresh bucket store keeping answers of 10,000 bytes under ``older``, then ``newer``."""
    store = Store.on_bucket(s3_url(), **s3_options())
    assert isinstance(store, BucketStore)
    store.keep(older, b"o" * 10_000, "plain")
    store.keep(newer, b"n" * 10_000, "plain")
    return store


def _left_after_gc(store: BucketStore, keys: list[str]) -> set[str]:
    """Which of ``keys`` a gc of ``store`` with room for one answer leaves, as a store opened
    afresh finds them."""
    assert store.gc(max_bytes=15_000, grace=0).answers == 1
    return Store.on_bucket(store.url, **s3_options()).have(keys)


def _log_use(store: BucketStore, body: bytes) -> None:
    """Puts ``body`` in ``store``'s ``used/`` as a log of when answers were used."""
    store.fs.pipe_file(f"{store.root}/used/{uuid.uuid4().hex}.json", body)


@pytest.mark.parametrize("ahead", [b"1e11", b"Infinity"])
def test_a_use_stamped_ahead_of_the_clock_is_taken_as_a_use_then(ahead: bytes) -> None:
    """A ``used/`` log stamped far ahead (a machine whose clock ran years fast, or a time
    of Infinity) kept its answer the most recently used at every gc, the merged log
    carrying the time on: a later gc dropped an answer just used to keep one nobody used
    since. A use stamped later than the gc's clock is taken as a use at that gc, and
    ages from there; Infinity is no time, and passed over."""
    stamped, fresh = key_of("stamped ahead"), key_of("used since")
    store = _two_kept(stamped, fresh)
    _log_use(store, b'{"answers": {"%s": %s}, "packs": {}}' % (stamped.encode(), ahead))
    assert store.gc(grace=0).answers == 0  # the logs merged, nothing dropped
    store.recall(fresh)
    store.close()
    assert _left_after_gc(store, [stamped, fresh]) == {fresh}


def test_a_file_stamped_ahead_of_the_clock_in_a_file_url_store_ages_from_a_gc(
    tmp_path: Path,
) -> None:
    """A store at a ``file://`` URL has its files stamped as a directory does, so one copied
    with their times (``rsync -a``, tar) from a machine whose clock ran years fast held a
    record, a blob no record names and a write left in ``tmp/`` stamped then: the record
    was the most recently used at every gc, and the others younger than any grace, never
    removed. Each is set to the gc's time, and ages from there; an object store's are
    stamped by its server."""
    store = Store(f"file://{tmp_path / 'store'}")
    assert isinstance(store, BucketStore)
    key, blob = key_of("stamped ahead"), store.put(b"b" * 1_000)
    store.keep(key, b"o" * 1_000, "plain")
    root = tmp_path / "store"
    left = root / "tmp" / "4242-writing.part"
    left.write_bytes(b"w" * 1_000)
    ahead = [root / "answers" / key[7:9] / key[7:], root / "blobs" / blob[7:9] / blob[7:], left]
    for path in ahead:
        os.utime(path, (1e11, 1e11))  # the year 5138
    before = time.time()
    done = Store(store.url).gc(grace=60)
    assert (done.answers, done.blobs, done.abandoned, done.young) == (0, 0, 0, 1_000)
    assert all(before - 1 <= path.stat().st_mtime <= time.time() for path in ahead)


@pytest.mark.parametrize("damaged", [b'"soon"', b"null", b"[1]"])
def test_a_damaged_time_in_a_use_log_loses_that_time_alone(damaged: bytes) -> None:
    """A ``used/`` log holding one time that is no time (text, null, a list) lost every
    time after it in the log: an answer just used was taken for one unused since it was
    kept, and a gc dropped it. Only the damaged time is passed over."""
    fresh, newer = key_of("used just now"), key_of("kept later, never used")
    store = _two_kept(fresh, newer)
    used = b'{"answers": {"%s": %s, "%s": %r}, "packs": {}}'
    _log_use(store, used % (key_of("gone").encode(), damaged, fresh.encode(), time.time()))
    assert _left_after_gc(store, [fresh, newer]) == {fresh}


def test_store_of_a_url_is_a_bucket() -> None:
    """Store("memory://…") opens a bucket store, as Store(path) opens a directory."""
    assert isinstance(Store("memory://somatize/plain"), BucketStore)


class _Interrupted:
    """A file being uploaded whose second write is interrupted (a Ctrl-C mid-upload)."""

    def __init__(self, real: Any) -> None:
        self.real, self.writes = real, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def __enter__(self) -> _Interrupted:
        self.real.__enter__()
        return self

    def __exit__(self, *args: Any) -> Any:
        return self.real.__exit__(*args)

    def write(self, data: Any) -> Any:
        self.writes += 1
        if self.writes == 2:
            raise KeyboardInterrupt("interrupted while uploading")
        return self.real.write(data)


@pytest.mark.parametrize("url", ["s3", "memory"])
def test_an_interrupted_upload_publishes_nothing(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """A blob streamed piece by piece whose upload is interrupted leaves nothing under its
    name: no half-written object is ever visible, and the next put uploads it whole."""
    monkeypatch.setattr("somatize.store._bucket_requests._STREAM_ABOVE", 1000)
    store = (
        Store.on_bucket(s3_url(), **s3_options())
        if url == "s3"
        else Store.on_bucket(f"memory://somatize/{key_of('interrupted')[7:19]}")
    )
    assert isinstance(store, BucketStore)
    pieces = [b"a" * 100_000, b"b" * 100_000]  # large enough to be written one by one
    real_open = store.fs.open
    monkeypatch.setattr(store.fs, "open", lambda *a, **k: _Interrupted(real_open(*a, **k)))
    with pytest.raises(KeyboardInterrupt):
        store.put(pieces)
    monkeypatch.setattr(store.fs, "open", real_open)
    fresh = Store.on_bucket(store.url, **store.storage_options)
    assert isinstance(fresh, BucketStore)
    assert fresh._entries("blobs") == []
    digest = fresh.put(pieces)
    assert bytes(Store.on_bucket(store.url, **store.storage_options).get(digest)) == b"".join(
        pieces
    )


def test_gc_leaves_the_writes_in_flight_in_a_shared_cache(tmp_path: Path) -> None:
    """A bucket's gc empties its cache, but not the young files in its tmp/: another process
    sharing the cache may be writing them right now."""
    store = Store.on_bucket(s3_url(), cache=tmp_path / "cache", **s3_options())
    store.keep(key_of("a"), b"answer", "plain")
    in_flight = tmp_path / "cache" / "tmp" / "4242-elsewhere.part"
    in_flight.write_bytes(b"being written by another process")
    store.gc(0, grace=0)
    assert in_flight.exists()


def test_a_cache_that_cannot_be_filled_fails_nothing(tmp_path: Path) -> None:
    """When the cache in front cannot take a copy (its tmp/ gone, its disk full), the
    bucket's own write or read still succeeds: the cache only saves requests."""
    store = Store.on_bucket(s3_url(), cache=tmp_path / "cache", **s3_options())
    (tmp_path / "cache" / "tmp").rmdir()
    answer = store.keep(key_of("b"), b"kept in the bucket", "plain")
    fresh = Store.on_bucket(store.url, cache=tmp_path / "cache", **s3_options())
    assert bytes(fresh.recall(key_of("b"))[1]) == b"kept in the bucket"
    assert bytes(fresh.get(answer.value)) == b"kept in the bucket"


@pytest.mark.parametrize("url", ["s3", "memory"])
def test_quarantine_of_what_vanished_meanwhile_is_no_error(url: str) -> None:
    """verify --quarantine of a bucket whose damaged record is removed (a gc elsewhere)
    after it was read moves nothing and reports nothing, as a local store does: read again
    before it is told, it is gone, which is no damage; nothing fails on the missing file."""
    store = (
        Store.on_bucket(s3_url(), **s3_options())
        if url == "s3"
        else Store.on_bucket(f"memory://somatize/{key_of('vanished')[7:19]}")
    )
    assert isinstance(store, BucketStore)
    key = key_of("vanished")
    answer = store.keep(key, b"soon dangling", "plain")
    store.fs.rm(store._blob_path(answer.value))
    checker = Store.on_bucket(store.url, **store.storage_options)
    assert isinstance(checker, BucketStore)
    listed = checker._entries

    def entries(section: str) -> list[Any]:
        found = listed(section)
        if section == "blobs":  # verify has read the records; another process drops one
            store.fs.rm(store._answer_path(key))
        return found

    checker._entries = entries  # type: ignore[method-assign]
    found = checker.verify(quarantine=True)
    assert found.damaged == [] and found.quarantined == [] and found.unmoved == {}


def test_a_reader_that_may_not_write_recalls_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A reader whose writes are refused recalls past the point where it writes down when
    answers were used: that is advice, dropped and said once at debug level."""
    monkeypatch.setattr("somatize.store._packed.FLUSH_USES", 4)
    url = f"memory://somatize/{key_of('read-only reader')[7:19]}"
    writer = Store.on_bucket(url)
    keys = [key_of(f"kept {i}") for i in range(10)]
    for key in keys:
        writer.keep(key, key.encode(), "plain")
    reader = Store.on_bucket(url, backoff=0.0)
    assert isinstance(reader, BucketStore)
    denied = Counting(None, fail=99, error=PermissionError("AccessDenied: read-only"))
    monkeypatch.setattr(reader.fs, "pipe_file", denied)
    with caplog.at_level("DEBUG", logger="somatize.store.bucket"):
        for key in keys:
            assert bytes(reader.recall(key)[1]) == key.encode()
        reader.close()
    assert denied.calls >= 2
    said = [r for r in caplog.records if "cannot be written down" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "DEBUG"


def test_writing_to_a_bucket_that_does_not_exist_names_it() -> None:
    """A keep, put or bind into a bucket that does not exist is a StoreError naming the
    bucket, not a raw FileNotFoundError; reading it finds nothing."""
    store = Store.on_bucket("s3://no-such-bucket-somatize/prefix", backoff=0.0, **s3_options())
    key = key_of("nowhere")
    assert store.have([key]) == set()
    for write in (
        lambda: store.keep(key, b"value", "plain"),
        lambda: store.put(b"value"),
        lambda: store.bind("data/v1", key),
    ):
        with pytest.raises(StoreError, match="the bucket `no-such-bucket-somatize` does not exist"):
            write()


def test_a_bucket_that_does_not_exist_is_not_writable() -> None:
    """A store on a bucket that does not exist says it is not writable, as a local store
    whose directory is gone does; one on a bucket that exists says it is."""
    missing = Store.on_bucket(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x", **s3_options())
    assert missing.writable() is False
    assert Store.on_bucket(s3_url(), **s3_options()).writable() is True


def test_a_forward_into_a_bucket_that_does_not_exist_runs_nothing() -> None:
    """A forward that would keep what it computes in a bucket that does not exist is a
    StoreError naming the bucket before any node runs, not after its work, which would be
    lost; nothing is said to have run."""
    largest = Largest().named("largest").frozen().cached()
    g = Graph.somatize(Scale().named("scale").frozen() >> largest)
    store = Store.on_bucket(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x", **s3_options())
    with pytest.raises(StoreError, match=r"the bucket `no-such-bucket-\w+` does not exist"):
        g.forward([1.0, 2.0], store=store)
    assert largest.calls == 0
    assert g.record is not None and g.record.facts == []


def test_the_bucket_is_looked_for_once_per_store_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket that exists is looked for once, before the first answer computed is kept,
    not at every forward; a forward that recalls all it needs does not look for it."""
    largest = Largest().named("largest").frozen().cached()
    g = Graph.somatize(Scale().named("scale").frozen() >> largest)
    store = Store.on_bucket(s3_url(), **s3_options())
    assert isinstance(store, BucketStore)
    looked = Counting(store._missing_bucket)
    monkeypatch.setattr(store, "_missing_bucket", looked)
    assert g.forward([1.0, 2.0], store=store) == 4.0
    assert g.forward([1.0, 3.0], store=store) == 6.0
    assert g.forward([1.0, 2.0], store=store) == 4.0
    assert (looked.calls, largest.calls) == (1, 2)
    fresh = Store.on_bucket(store.url, **s3_options())
    assert isinstance(fresh, BucketStore)
    monkeypatch.setattr(fresh, "_missing_bucket", looked)
    assert g.forward([1.0, 3.0], store=fresh) == 6.0
    assert (looked.calls, largest.calls) == (1, 2)


def test_a_forward_with_a_writer_that_may_not_look_for_the_bucket_keeps() -> None:
    """Credentials that may write and list a bucket but not ask for it (no ``HeadBucket``)
    run and keep as before: the bucket that cannot be looked for is not taken for missing."""
    writer = user(["s3:GetObject", "s3:PutObject", "s3:ListBucket"])
    url = s3_url()
    largest = Largest().named("largest").frozen().cached()
    g = Graph.somatize(Scale().named("scale").frozen() >> largest)
    with enable_iam_authentication():
        assert g.forward([1.0, 2.0], store=Store.on_bucket(url, **writer)) == 4.0
    assert g.forward([1.0, 2.0], store=Store.on_bucket(url, **s3_options())) == 4.0
    assert largest.calls == 1


def kept_by(store: Store) -> tuple[Graph, Largest]:
    """A graph whose cached node takes the largest of its scaled input, with its answer to
    ``[1.0, 2.0]`` kept in ``store``, and that node (whose calls it counts)."""
    largest = Largest().named("largest").frozen().cached()
    g = Graph.somatize(Scale().named("scale").frozen() >> largest)
    assert g.forward([1.0, 2.0], store=store) == 4.0
    return g, largest


def test_a_bucket_that_refused_a_write_refuses_forwards_before_any_node_runs() -> None:
    """With credentials that may only read, the first write the bucket refuses makes the
    store object read-only: it says so (``writable()`` False), and a later forward that
    would keep an answer is a StoreError saying the bucket refused writes before any node
    runs, as a read-only local store's is, while a forward it answers is recalled."""
    admin, reader = user(["s3:*"]), user(READS)
    url = s3_url()
    with enable_iam_authentication():
        g, largest = kept_by(Store.on_bucket(url, **admin))
        store = Store.on_bucket(url, **reader, backoff=0.0)
        assert store.writable() is True  # nothing tells before a write
        with pytest.raises(StoreError, match="the bucket refused writes with these credentials"):
            store.put(b"refused")
        assert store.writable() is False
        with pytest.raises(StoreError, match=r"refused writes.*it can still be read") as refused:
            g.forward([1.0, 3.0], store=store)
        assert "Access Denied" in str(refused.value)
        assert largest.calls == 1
        assert g.forward([1.0, 2.0], store=store) == 4.0
        assert largest.calls == 1
        assert Store.on_bucket(url, **admin).writable() is True


def test_a_bucket_opened_read_only_refuses_a_forward_before_its_first_node_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Opened ``read_only=True`` (credentials that may only read), a fresh store object
    refuses a forward that would keep an answer before any node runs — not after computing
    the first miss, as one learning it from a refused write does — and makes no request to
    learn it; a forward it answers is recalled, and nothing else is written or removed."""
    admin, reader = user(["s3:*"]), user(READS)
    url = s3_url()
    with enable_iam_authentication():
        g, largest = kept_by(Store.on_bucket(url, **admin))
        store = Store.on_bucket(url, **reader, read_only=True)
        assert isinstance(store, BucketStore)
        assert store.writable() is False
        looked, written = Counting(store._missing_bucket), Counting(store.fs.pipe_file)
        monkeypatch.setattr(store, "_missing_bucket", looked)
        monkeypatch.setattr(store.fs, "pipe_file", written)
        with pytest.raises(StoreError, match=r"opened with read_only=True.*can still be read"):
            g.forward([1.0, 3.0], store=store)
        assert largest.calls == 1
        with pytest.raises(StoreError, match="read_only=True"):
            store.put(b"refused")
        with pytest.raises(StoreError, match="read_only=True"):
            store.gc()
        assert (looked.calls, written.calls) == (0, 0)
        assert g.forward([1.0, 2.0], store=store) == 4.0
        assert largest.calls == 1


def test_a_read_only_bucket_serves_a_mapped_node_reading_a_computed_list() -> None:
    """A mapped cached node reading what another node computed has its items keyed only
    once that answers. Over a bucket opened ``read_only=True`` that holds all its items, a
    forward asking for it is served, not refused; one with an item the bucket lacks is
    refused before the mapped node runs."""
    url = s3_url()
    square = Square().named("square").frozen().mapped().cached()
    g = Graph.somatize(Rows().named("rows").frozen() >> square)
    span = {"at": 0, "take": 4}
    assert g.forward(span, store=Store.on_bucket(url, **s3_options())) == [0, 1, 4, 9]
    store = Store.on_bucket(url, **s3_options(), read_only=True)
    seen: list[dict[str, Any]] = []
    assert g.forward(span, store=store, watching=seen.append) == [0, 1, 4, 9]
    assert {"fact": "recalled", "node": "square", "items": 4, "of": 4} in seen
    with pytest.raises(StoreError, match="opened with read_only=True"):
        g.forward({"at": 0, "take": 5}, store=store)
    assert square.calls == [[0, 1, 2, 3]]


def test_a_store_served_over_http_says_a_missing_blob_without_naming_a_bucket(
    tmp_path: Path,
) -> None:
    """A store read from a web server (``http://host/store``, opened ``read_only=True``) is
    read as any other; a blob it lacks is Missing, said as not there, never as a bucket
    ``http:`` that does not exist: a web server's paths hold no bucket."""
    local = Store(tmp_path)
    kept = local.put(b"served")
    with served_over_http(tmp_path) as url:
        store = Store.on_bucket(url, read_only=True, retries=0)
        assert bytes(store.get(kept)) == b"served"
        with pytest.raises(Missing) as missing:
            store.get(key_of_bytes(b"never put"))
        assert "bucket" not in str(missing.value)


def test_a_store_on_a_web_server_taking_no_writes_says_so_and_holds_it(tmp_path: Path) -> None:
    """A store on a web server that takes no writes (a PUT answered 501), opened without
    ``read_only``: the first forward that would keep an answer raises a StoreError saying
    the server takes no writes and to open it read_only=True; the store object holds that,
    so a later forward is refused before any node runs, and it still recalls."""
    square = Square().named("square").frozen().mapped().cached()
    g = Graph.somatize(Rows().named("rows").frozen() >> square)
    assert g.forward({"at": 0, "take": 2}, store=Store(tmp_path)) == [0, 1]
    with served_over_http(tmp_path) as url:
        store = Store.on_bucket(url, retries=0)
        with pytest.raises(StoreError, match="server takes no writes") as refused:
            g.forward({"at": 0, "take": 3}, store=store)
        assert "read_only=True" in str(refused.value)
        assert square.calls == [[0, 1], [0, 1, 2]]
        assert store.writable() is False
        with pytest.raises(StoreError, match="server takes no writes"):
            g.forward({"at": 0, "take": 4}, store=store)
        assert square.calls == [[0, 1], [0, 1, 2]]
        assert g.forward({"at": 0, "take": 2}, store=store) == [0, 1]


@pytest.mark.parametrize("status", [HTTPStatus.FORBIDDEN, HTTPStatus.UNAUTHORIZED])
def test_a_store_on_a_web_server_forbidding_writes_says_so_and_holds_it(
    tmp_path: Path, status: HTTPStatus
) -> None:
    """A store on a web server that refuses the client's writes (a PUT answered 403 or
    401), opened without ``read_only``: the forward failed with aiohttp's bare
    ClientResponseError, and every later forward computed again before failing so. It
    raises a StoreError saying the server refused writes with these credentials and to
    open it read_only=True; the store object holds that, and it still recalls."""
    square = Square().named("square").frozen().mapped().cached()
    g = Graph.somatize(Rows().named("rows").frozen() >> square)
    assert g.forward({"at": 0, "take": 2}, store=Store(tmp_path)) == [0, 1]
    with served_over_http(tmp_path, put_status=status) as url:
        store = Store.on_bucket(url, retries=0)
        with pytest.raises(StoreError, match="server refused writes") as refused:
            g.forward({"at": 0, "take": 3}, store=store)
        assert f"{status.value}" in str(refused.value) and "read_only=True" in str(refused.value)
        assert store.writable() is False
        with pytest.raises(StoreError, match="server refused writes"):
            g.forward({"at": 0, "take": 4}, store=store)
        assert square.calls == [[0, 1], [0, 1, 2]]
        assert g.forward({"at": 0, "take": 2}, store=store) == [0, 1]


def test_a_read_a_web_server_forbids_is_said_so_and_leaves_the_store_writable(
    tmp_path: Path,
) -> None:
    """A blob a web server refuses to be read (a GET answered 403): it was aiohttp's bare
    ClientResponseError. It is a StoreError saying the server refused reading it, and
    never taken for a refused write: the store stays writable."""
    kept = Store(tmp_path).put(b"served")
    with served_over_http(tmp_path, forbidden_reads=("/blobs/",)) as url:
        store = Store.on_bucket(url, retries=0)
        with pytest.raises(StoreError, match=r"reading .* refused by the server \(403") as said:
            store.get(kept)
        assert "write" not in str(said.value)
        assert store.writable() is True


@pytest.mark.parametrize("status", [HTTPStatus.BAD_REQUEST, HTTPStatus.GONE])
def test_a_read_a_web_server_refuses_otherwise_is_a_store_error_naming_the_status(
    tmp_path: Path, status: HTTPStatus
) -> None:
    """A blob a web server refuses to be read with a status other than those of a missing
    file or forbidden credentials (400, 410): it was aiohttp's bare ClientResponseError. It
    is a StoreError naming the server, the status and what was being read."""
    kept = Store(tmp_path).put(b"served")
    with served_over_http(tmp_path, forbidden_reads=("/blobs/",), read_status=status) as url:
        store = Store.on_bucket(url, read_only=True, retries=2, backoff=0)
        with pytest.raises(StoreError, match=r"reading blob .* refused by the server") as said:
            store.get(kept)
        assert url in str(said.value) and f"({status.value} " in str(said.value)


@pytest.mark.parametrize(
    "status", [HTTPStatus.SERVICE_UNAVAILABLE, HTTPStatus.TOO_MANY_REQUESTS, HTTPStatus.BAD_GATEWAY]
)
def test_a_web_server_busy_or_failing_is_asked_again(tmp_path: Path, status: HTTPStatus) -> None:
    """A web server answering a read 503, 429 or 502 is asked again, as a bucket store asks
    again after any transient failure: answering twice so, then the blob, it is read. One
    answering so every time fails as a StoreError naming the status and how often it was
    asked; it was aiohttp's bare ClientResponseError, asked once."""
    kept = Store(tmp_path).put(b"served")
    blobs = ("/blobs/",)
    with served_over_http(tmp_path, forbidden_reads=blobs, read_status=status, refusals=2) as url:
        store = Store.on_bucket(url, read_only=True, retries=2, backoff=0)
        assert bytes(store.get(kept)) == b"served"
    with served_over_http(tmp_path, forbidden_reads=blobs, read_status=status) as url:
        store = Store.on_bucket(url, read_only=True, retries=1, backoff=0)
        with pytest.raises(
            StoreError, match=rf"failed 2 times: the server answered {status.value}"
        ):
            store.get(kept)


def test_a_large_blob_on_a_web_server_taking_no_writes_is_refused_as_a_small_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blob too large to upload in one piece elsewhere, put in a store on a web server
    that takes no writes (its marker there, so the blob is the first write): it raised a
    bare NotImplementedError, fsspec opening no web file to write, and the store stayed
    writable. It is sent in one request, refused as a small one is, and held so."""
    monkeypatch.setattr("somatize.store._bucket_requests._STREAM_ABOVE", 1000)
    Store(tmp_path).put(b"small")
    with served_over_http(tmp_path) as url:
        store = Store.on_bucket(url, retries=0)
        with pytest.raises(StoreError, match=r"server takes no writes.*read_only=True"):
            store.put(b"x" * 5000)
        assert store.writable() is False


def test_a_store_on_a_web_server_verifies_with_its_empty_folders_no_strays(
    tmp_path: Path,
) -> None:
    """A store served by a web server whose ``packs/`` and ``names/`` hold nothing: fsspec
    finds each folder's page as a file of its own, which verify reported as a stray file
    of each (``packs/``, ``names/``). It finds the blob it holds, and nothing stray."""
    Store(tmp_path).put(b"served")
    with served_over_http(tmp_path) as url:
        found = Store.on_bucket(url, read_only=True, retries=0).verify()
    assert found.ok and found.blobs == 1 and found.names == 0
    assert found.stray == []


SECTIONS = ("blobs", "answers", "names")


def test_a_store_on_a_web_server_verifies_and_sizes_its_files_as_they_are(
    tmp_path: Path,
) -> None:
    """A web server's folder page names its files but not their sizes, which fsspec lists
    as none: verify took each blob for 0 bytes, said every whole answer's record damaged
    (its blob holding 0 bytes where it says 3000), and verify and du counted 0 bytes in
    all. Each file's size is asked of the server, as a directory store's listing has it."""
    local = Store(tmp_path)
    local.keep("blake3:" + "ab" * 32, b"x" * 3000, "plain")
    local.bind("sms/train", local.put(b"rows"))
    held = local.verify()
    with served_over_http(tmp_path) as url:
        store = Store.on_bucket(url, read_only=True, retries=0)
        found = store.verify()
        sized = survey(store).bytes
    assert found.ok and found.damaged == [] and found.records == 1 and found.names == 1
    assert found.bytes == held.bytes == 3004
    kept = survey(local).bytes
    assert [sized[s] for s in SECTIONS] == [kept[s] for s in SECTIONS] != [0, 0, 0]


def test_a_gc_on_a_web_server_says_its_files_cannot_be_removed_there(tmp_path: Path) -> None:
    """A gc of a store on a web server, opened without ``read_only``, with a blob to remove:
    fsspec's http filesystem removes nothing, and the gc failed with a bare, empty
    NotImplementedError. It is a StoreError saying so and where to run it; the blob stays."""
    stray = Store(tmp_path).put(b"no record names it")
    with served_over_http(tmp_path) as url:
        store = Store.on_bucket(url, retries=0)
        with pytest.raises(StoreError, match=r"cannot be done: its filesystem \(HTTPFileSystem"):
            store.gc(max_bytes=0, grace=0)
    assert Store(tmp_path).has_blob(stray)


def test_a_read_only_bucket_stays_read_only_in_another_process() -> None:
    """``read_only`` travels with the store: in its address, which another process opens it
    from, and in its pickle; a store opened without it is not read-only."""
    store = Store.on_bucket(s3_url(), **s3_options(), read_only=True)
    address = store.address()
    assert address is not None and address["home"] == "read-only bucket"
    assert Store.from_address(address).writable() is False
    assert pickle.loads(pickle.dumps(store)).writable() is False
    assert copy.deepcopy(store).writable() is False
    plain = Store.on_bucket(store.url, **s3_options())
    assert repr(store) == f"Store.on_bucket({store.url!r}, read_only=True)"
    assert repr(plain) == f"Store.on_bucket({store.url!r})"
    assert (plain.address() or {})["home"] == "bucket"
    assert Store.from_address(plain.address() or {}).writable() is True
    assert pickle.loads(pickle.dumps(plain)).writable() is True
    with pytest.raises(BadAddress, match="read_only is True or False"):
        Store.on_bucket(store.url, **s3_options(), read_only="yes")  # type: ignore[arg-type]


# What somatize 0.1.0 (before `read_only`) opens an address's home as.
_HOMES_BEFORE_READ_ONLY = ("local", "bucket")


def test_a_read_only_bucket_address_is_refused_by_a_somatize_without_read_only() -> None:
    """A somatize from before ``read_only`` opened a bucket store's address as its own,
    dropping what it did not know, and wrote through a store meant to be read-only: the
    address of a read-only store names a home that somatize refuses."""
    store = Store.on_bucket(s3_url(), **s3_options(), read_only=True)
    address = store.address()
    assert address is not None
    assert address["home"] not in _HOMES_BEFORE_READ_ONLY
    assert Store.from_address(address).writable() is False
    flagged = {**address, "home": "bucket", "read_only": True}  # as an address was once written
    assert Store.from_address(flagged).writable() is False
    with pytest.raises(BadAddress, match="`backoff` in seconds"):
        Store.from_address({**flagged, "read_only": "yes"})


class _BeforeReadOnly(pickle.Unpickler):
    """Loads a pickle as a somatize from before ``read_only`` does: it finds only the names
    the pickle of a store opened without it needs (a class, copyreg's constructor)."""

    def __init__(self, data: bytes, known: set[tuple[str, str]]) -> None:
        super().__init__(io.BytesIO(data))
        self.known = known

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("somatize") and (module, name) not in self.known:
            raise AttributeError(f"Can't get attribute {name!r} on <module {module!r}>")
        return super().find_class(module, name)


class _Names(pickle.Unpickler):
    """Notes every name a pickle loads."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.names: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.names.add((module, name))
        return super().find_class(module, name)


def test_a_read_only_bucket_pickle_is_refused_by_a_somatize_without_read_only() -> None:
    """A somatize from before ``read_only`` loaded a read-only store's pickle as its own,
    its flag unread, and wrote through it with the credentials of the process (a worker's
    role): the pickle names what that somatize lacks, so it refuses it."""
    plain = pickle.dumps(Store.on_bucket(s3_url(), **s3_options()))
    noted = _Names(plain)
    noted.load()
    read_only = pickle.dumps(Store.on_bucket(s3_url(), **s3_options(), read_only=True))
    with pytest.raises(AttributeError, match="read_only"):
        _BeforeReadOnly(read_only, noted.names).load()
    assert _BeforeReadOnly(plain, noted.names).load().writable() is True


@pytest.mark.parametrize(
    "failure",
    [ConnectionResetError("reset by peer"), OSError(errno.ENOSPC, "No space left on device")],
)
def test_a_write_that_fails_otherwise_leaves_the_bucket_writable(
    monkeypatch: pytest.MonkeyPatch, failure: OSError
) -> None:
    """A write that fails for another reason than permission (the bucket unreachable for a
    while, a full disk) does not make the store read-only: the next forward runs."""
    store = Store.on_bucket(f"memory://somatize/{uuid.uuid4().hex[:12]}", retries=1, backoff=0.0)
    assert isinstance(store, BucketStore)
    monkeypatch.setattr(store.fs, "pipe_file", Counting(None, fail=99, error=failure))
    with pytest.raises(OSError):
        store.put(b"not written")
    monkeypatch.undo()
    assert store.writable() is True
    largest = Largest().named("largest").frozen().cached()
    g = Graph.somatize(Scale().named("scale").frozen() >> largest)
    assert g.forward([1.0, 2.0], store=store) == 4.0


def refusing(store: Store, under: str = "") -> Any:
    """A ``pipe_file`` for ``store`` that refuses, as a bucket refusing these credentials
    does, every write of a path holding ``under`` (every write where empty)."""
    assert isinstance(store, BucketStore)
    real = store.fs.pipe_file

    def pipe_file(path: str, *args: Any, **kwargs: Any) -> Any:
        if under in path:
            raise PermissionError("Access Denied")
        return real(path, *args, **kwargs)

    return pipe_file


def assert_keeps(store: Store) -> None:
    """Asserts that a forward over ``store`` keeps its answer: the same forward again is
    recalled, not computed."""
    largest = Largest().named("largest").frozen().cached()
    g = Graph.somatize(Scale().named("scale").frozen() >> largest)
    assert g.forward([1.0, 2.0], store=store) == 4.0
    assert g.forward([1.0, 2.0], store=store) == 4.0
    assert largest.calls == 1


def test_a_refused_binding_leaves_the_bucket_writable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket whose policy refuses these credentials names alone (bound by whoever
    publishes them) refuses the binding, and still keeps the answers a forward computes:
    writing a name keeps no answer."""
    store = Store.on_bucket(f"memory://somatize/{uuid.uuid4().hex[:12]}", backoff=0.0)
    assert isinstance(store, BucketStore)
    digest = store.put(b"bound by a publisher")
    monkeypatch.setattr(store.fs, "pipe_file", refusing(store, "/names/"))
    with pytest.raises(StoreError, match="the bucket refused writes"):
        store.bind("release/v1", digest)
    assert store.writable() is True
    assert_keeps(store)


def test_a_copy_of_a_bucket_that_refused_a_write_finds_out_for_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A copy of a store whose bucket refused this process a write (a model pickled to a
    worker, whose credentials are its own: its role, its environment) is not read-only
    for that: its forwards run and keep their answers."""
    store = Store.on_bucket(f"memory://somatize/{uuid.uuid4().hex[:12]}", backoff=0.0)
    monkeypatch.setattr(store.fs, "pipe_file", refusing(store))
    with pytest.raises(StoreError, match="the bucket refused writes"):
        store.put(b"refused here")
    monkeypatch.undo()
    assert store.writable() is False
    copy = pickle.loads(pickle.dumps(store))
    assert copy.writable() is True
    assert_keeps(copy)
    assert store.writable() is False


CREDENTIALS = {"secret": "a-secret-no-file-holds", "token": "a-token-no-file-holds"}
"""Credentials the loopback server takes as any others, spelled so a leak is found."""


def assert_reaches(store: Store) -> None:
    """Asserts that ``store`` writes to its bucket and reads back what it wrote."""
    data = uuid.uuid4().bytes
    assert bytes(store.get(store.put(data))) == data


def _without_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(variable, raising=False)


def options_of_its_own() -> dict[str, Any]:
    """Options reaching the loopback server with :data:`CREDENTIALS`, which no other store
    or filesystem of this process is opened with, so that fsspec hands it a filesystem of
    its own (one opened by another test holds the credentials it found then)."""
    agent = {"user_agent_extra": f"somatize-tests/{uuid.uuid4().hex}"}
    return {**s3_options(), **CREDENTIALS, "config_kwargs": agent}


def assert_reaches_once_loaded_here(pickled: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asserts that the store ``pickled`` reaches its bucket, loaded in a process holding
    credentials of its own (any: the loopback server takes them all)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    assert_reaches(pickle.loads(pickled))


def test_a_bucket_store_pickled_or_dumped_carries_none_of_its_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bucket store pickled (``torch.save`` of a model holding a row cache of it, a
    Lightning checkpoint of hyperparameters holding it) or dumped as YAML (Lightning's
    ``hparams.yaml``) holds none of the credentials it was opened with; loaded, it reaches
    the bucket with the credentials of the process that loads it."""
    _without_aws_environment(monkeypatch)
    store = Store.on_bucket(s3_url(), **{**s3_options(), **CREDENTIALS})
    assert_reaches(store)  # its filesystem opened, as in a model that ran
    import yaml

    pickled = pickle.dumps(store)
    dumped = yaml.dump({"store": store})
    for secret in CREDENTIALS.values():
        assert secret.encode() not in pickled
        assert secret not in dumped
    assert_reaches_once_loaded_here(pickled, monkeypatch)


@pytest.mark.parametrize("layer", ["simplecache", "filecache"])
def test_a_store_at_a_chained_url_pickled_carries_none_of_its_credentials(
    layer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store at a chained URL (``simplecache::s3://…``), its credentials given under the
    bucket's protocol (``s3={"secret": …}``), pickled holds none of them either; loaded, it
    reaches the bucket with the credentials of the process that loads it. Its address
    holds them still."""
    _without_aws_environment(monkeypatch)
    store = Store.on_bucket(f"{layer}::{s3_url()}", s3={**s3_options(), **CREDENTIALS})
    assert_reaches(store)
    address = store.address()
    assert address is not None
    assert_reaches(Store.from_address(address))  # which holds them, for a worker
    pickled = pickle.dumps(store)
    for secret in CREDENTIALS.values():
        assert secret.encode() not in pickled
    assert_reaches_once_loaded_here(pickled, monkeypatch)


def test_a_bucket_store_copied_or_sent_to_a_child_process_keeps_its_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A copy made in the process (``copy.deepcopy``: an EMA of a model) and one
    ``multiprocessing`` sends a child it starts (a spawned DataLoader worker) reach the
    bucket with the credentials the store was opened with, and so does its address."""
    import copy
    from multiprocessing.reduction import ForkingPickler

    _without_aws_environment(monkeypatch)
    store = Store.on_bucket(s3_url(), **{**s3_options(), **CREDENTIALS})
    assert_reaches(store)
    address = store.address()
    assert address is not None and address["options"]["secret"] == CREDENTIALS["secret"]
    for copied in (
        copy.deepcopy(store),
        pickle.loads(ForkingPickler.dumps(store)),
        Store.from_address(address),
    ):
        assert_reaches(copied)


def test_a_bucket_store_loaded_where_no_credentials_are_says_a_pickle_carries_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bucket store loaded from a pickle (``torch.load`` of a model holding it, a Ray
    worker) in a process with no credentials of its own says, at its first request, that
    a pickled store carries none of those it was opened with, and where to give them."""
    _without_aws_environment(monkeypatch)
    store = Store.on_bucket(s3_url(), **options_of_its_own())
    digest = store.put(b"kept")
    loaded = pickle.loads(pickle.dumps(store))
    with pytest.raises(StoreError, match="found no credentials") as raised:
        loaded.get(digest)
    said = str(raised.value)
    assert "pickled" in said and "carries none" in said and "AWS_ACCESS_KEY_ID" in said


def test_a_bucket_store_pickled_carries_no_filesystem_holding_its_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fsspec hands out one filesystem for the same options in a process: one the process
    made before the store, with the credentials as plain text, is the store's too. The
    store pickled carries no filesystem (a copy opens its own from the options), so not
    that one's credentials either."""
    import s3fs

    from somatize.store.bucket import _opened_with

    _without_aws_environment(monkeypatch)
    url, options = s3_url(), options_of_its_own()
    made_before = s3fs.S3FileSystem(**_opened_with(url, options))
    store = Store.on_bucket(url, **options)
    assert_reaches(store)
    assert store.fs is made_before  # what makes the leak possible at all
    pickled = pickle.dumps(store)
    for secret in CREDENTIALS.values():
        assert secret.encode() not in pickled
    assert_reaches_once_loaded_here(pickled, monkeypatch)


def test_a_gcs_token_given_as_a_dict_is_held_as_a_credential() -> None:
    """gcsfs's ``token`` given as a dict (a service account's key, as read from its JSON
    file) is held as a credential: the options a bucket store holds pickle without it, and
    as YAML, while a copy ``multiprocessing`` sends a child and its address keep it."""
    from multiprocessing.reduction import ForkingPickler

    import yaml

    from somatize.store._credentials import guarded, plain

    info = {"type": "service_account", "private_key": CREDENTIALS["secret"]}
    given = {"project": "proj", "token": info}
    held = guarded(given)
    assert CREDENTIALS["secret"].encode() not in pickle.dumps(held)
    assert CREDENTIALS["secret"] not in yaml.dump(held)
    assert pickle.loads(pickle.dumps(held)) == {"project": "proj", "token": None}
    assert pickle.loads(ForkingPickler.dumps(held)) == given
    assert plain(held) == given and type(plain(held)["token"]) is dict


def test_azure_s_credential_option_is_held_as_a_credential() -> None:
    """Azure's ``credential`` option, given as text, is an account key or a SAS token: the
    options a bucket store holds pickle without it, as without its other credentials, while
    its address keeps it."""
    from somatize.store._credentials import guarded, plain

    given = {"account_name": "acct", "credential": CREDENTIALS["secret"]}
    held = guarded(given)
    assert CREDENTIALS["secret"].encode() not in pickle.dumps(held)
    assert pickle.loads(pickle.dumps(held)) == {"account_name": "acct", "credential": None}
    assert plain(held) == given


SSE_C_KEY = "an-sse-c-key-no-pickle-holds-32b"
"""A customer-provided encryption key (32 bytes), spelled so a leak is found."""


@pytest.mark.parametrize("given", [str, bytes])
def test_a_bucket_store_pickled_carries_no_sse_c_key(
    given: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A customer-provided encryption key (``s3_additional_kwargs={"SSECustomerKey": …}``),
    as text or as bytes, is held as the other credentials are: a copy ``multiprocessing``
    sends a child keeps it and reaches the bucket, a store pickled carries none, and,
    loaded, says so at its first request, where the client would refuse a key that is
    None."""
    from multiprocessing.reduction import ForkingPickler

    key = SSE_C_KEY if given is str else SSE_C_KEY.encode()
    encrypted = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": key}
    store = Store.on_bucket(s3_url(), **s3_options(), s3_additional_kwargs=encrypted)
    digest = store.put(b"encrypted")
    assert_reaches(pickle.loads(ForkingPickler.dumps(store)))
    pickled = pickle.dumps(store)
    assert SSE_C_KEY.encode() not in pickled
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    with pytest.raises(StoreError, match=r"holds no SSE-C key .*store.address\(\)"):
        pickle.loads(pickled).get(digest)


PASSWORD = "a-password-no-message-holds"
"""A password written into an endpoint's URL, spelled so a leak is found."""


def _closed_endpoint() -> str:
    """An endpoint on loopback that nothing listens at, its URL holding :data:`PASSWORD`."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://user:{PASSWORD}@127.0.0.1:{port}"


def test_a_password_in_an_endpoint_s_url_is_in_no_error_it_causes() -> None:
    """An endpoint's URL written with a password (``http://user:password@host``) that cannot
    be reached is said without the password: neither the store's error nor the client's,
    chained below it in the traceback, holds it."""
    import traceback

    store = Store.on_bucket(
        s3_url(), anon=True, client_kwargs={"endpoint_url": _closed_endpoint()}, retries=0
    )
    with pytest.raises(StoreError, match=r"user:\*\*\*@127\.0\.0\.1") as raised:
        store.put(b"data")
    assert PASSWORD not in "".join(traceback.format_exception(raised.value))


def test_a_password_in_an_endpoint_refused_as_no_url_is_masked() -> None:
    """An endpoint refused as no http(s) URL is named in the error with its password
    masked."""
    with pytest.raises(BadAddress, match=r"'user:\*\*\*@minio:9000', which is no endpoint"):
        Store.on_bucket(s3_url(), client_kwargs={"endpoint_url": f"user:{PASSWORD}@minio:9000"})


def test_an_endpoint_holding_a_password_for_a_signing_client_is_refused_at_open() -> None:
    """An endpoint's URL holding a user and password, for a client that signs its requests,
    is refused at open, its password masked: the HTTP client would refuse every request,
    which the store would retry and say as the bucket unreachable."""
    endpoint = {"endpoint_url": _closed_endpoint()}
    with pytest.raises(BadAddress, match=r"user:\*\*\*@.*holds a user and password") as refused:
        Store.on_bucket(s3_url(), key="x", secret="x", client_kwargs=endpoint, retries=0)
    assert PASSWORD not in str(refused.value)


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_an_endpoint_from_the_environment_holding_a_password_for_a_signing_client_is_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """An endpoint the client takes from the environment, its URL holding a user and
    password, is refused at open as one given as an option is, naming the variable, its
    password masked: the HTTP client would refuse every request."""
    monkeypatch.setenv(variable, _closed_endpoint())
    with pytest.raises(
        BadAddress, match=rf"{variable} is 'http://user:\*\*\*@.*holds a user"
    ) as refused:
        Store.on_bucket(s3_url(), key="x", secret="x", retries=0)
    assert PASSWORD not in str(refused.value)
    with pytest.raises(BadAddress, match=rf"{variable} is .*holds a user"):
        Store.on_bucket(f"simplecache::{s3_url()}", s3={"key": "x", "secret": "x"}, retries=0)
    store = Store.on_bucket(s3_url(), anon=True, retries=0)  # the server may take it alone
    assert isinstance(store, BucketStore)


def test_a_password_in_an_endpoint_is_in_no_record_the_s3_client_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store whose endpoint holds a user and password (opened ``anon=True``, the server
    taking the password alone), with DEBUG logging on: aiobotocore's and botocore's own
    records named the endpoint, password and all (the parameters of each request). They
    show it masked, as the store's own messages do."""
    endpoint = s3_options()["client_kwargs"]["endpoint_url"]
    credentialed = endpoint.replace("http://", f"http://user:{PASSWORD}@")
    caplog.set_level(logging.DEBUG)
    store = Store.on_bucket(s3_url(), anon=True, client_kwargs={"endpoint_url": credentialed})
    assert bytes(store.get(store.put(b"logged"))) == b"logged"
    client = [r for r in caplog.records if r.name.startswith(("botocore", "aiobotocore"))]
    assert any("user:***@127.0.0.1" in record.getMessage() for record in client)
    assert not any(PASSWORD in record.getMessage() for record in caplog.records)
    assert PASSWORD not in caplog.text


_LOGS_IN_A_CHILD = """
import logging, pickle, sys
store = pickle.loads(sys.stdin.buffer.read())
logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(message)s")
logging.getLogger("botocore.endpoint").debug("sending to %s", sys.argv[1])
"""
"""A fresh process (as a spawned DataLoader worker or a Ray worker starts) that loads the
store it is sent, then has the S3 client log the endpoint it names."""


def test_a_password_in_an_endpoint_is_in_no_record_a_process_sent_the_store_logs() -> None:
    """A store sent to a process it did not open in (``multiprocessing`` spawning a
    DataLoader worker: the pickle keeps the password) masks the password in the S3
    client's records there too, as it does in the process that opened it."""
    from multiprocessing.reduction import ForkingPickler

    endpoint = s3_options()["client_kwargs"]["endpoint_url"]
    credentialed = endpoint.replace("http://", f"http://user:{PASSWORD}@")
    store = Store.on_bucket(s3_url(), anon=True, client_kwargs={"endpoint_url": credentialed})
    logged = subprocess.run(
        [sys.executable, "-c", _LOGS_IN_A_CHILD, credentialed],
        input=bytes(ForkingPickler.dumps(store)),
        capture_output=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    ).stdout.decode()
    assert "user:***@127.0.0.1" in logged
    assert PASSWORD not in logged


def test_a_password_in_a_store_s_own_url_is_in_no_error_and_not_in_its_repr() -> None:
    """A store whose URL holds a user and password (``http://user:password@host/…``,
    ``ftp://…``: the filesystem reads them from it) is shown with its password masked: in
    its repr, in the errors of requests that failed, and in the refusal to open it."""
    import traceback

    store = Store.on_bucket(f"{_closed_endpoint()}/store", retries=0)
    assert PASSWORD not in repr(store) and "user:***@127.0.0.1" in repr(store)
    with pytest.raises(StoreError, match=r"user:\*\*\*@127\.0\.0\.1") as raised:
        store.have([key_of("absent")])
    assert PASSWORD not in "".join(traceback.format_exception(raised.value))
    ftp = _closed_endpoint().replace("http://", "ftp://")
    with pytest.raises(StoreError, match=r"user:\*\*\*@127\.0\.0\.1") as refused:
        Store.on_bucket(f"{ftp}/store", retries=0)
    assert PASSWORD not in "".join(traceback.format_exception(refused.value))


def test_a_store_pickled_carries_no_password_of_its_own_url() -> None:
    """A store whose URL holds a password pickles without it, as it pickles no other
    credential; a copy in this process, and one multiprocessing makes (a spawned DataLoader
    worker), keep it, and so does its address."""
    import copy
    import pickle
    from multiprocessing.reduction import ForkingPickler

    store = Store.on_bucket(f"{_closed_endpoint()}/store", retries=0)
    assert isinstance(store, BucketStore)
    with pytest.raises(StoreError):
        store.have([key_of("absent")])
    saved = pickle.dumps(store)
    assert PASSWORD.encode() not in saved
    loaded = pickle.loads(saved)
    assert loaded.url == store.url.replace(f":{PASSWORD}@", "@")
    address = store.address()
    assert address is not None and address["url"] == store.url
    for kept in (copy.deepcopy(store), pickle.loads(bytes(ForkingPickler.dumps(store)))):
        assert (kept.url, kept.root, kept.address()) == (store.url, store.root, address)


def test_a_cache_folder_names_its_server_without_the_endpoint_s_password(
    tmp_path: Path,
) -> None:
    """The file binding a cache folder to its store names the server with its password
    masked, and so does the refusal of another store opened with that folder."""
    endpoint = {"endpoint_url": _closed_endpoint()}
    Store.on_bucket(s3_url(), anon=True, client_kwargs=endpoint, cache=tmp_path)
    bound = (tmp_path / "bucket").read_text()
    assert PASSWORD not in bound and "user:***@127.0.0.1" in bound
    with pytest.raises(BadAddress, match="is bound to the bucket store") as raised:
        Store.on_bucket(s3_url(), anon=True, client_kwargs=endpoint, cache=tmp_path)
    assert PASSWORD not in str(raised.value)


def test_a_cache_folder_bound_with_the_endpoint_s_password_opens_and_loses_it(
    tmp_path: Path,
) -> None:
    """A cache folder whose file names its store's server with the password (bound before
    passwords were masked) opens for that same store, and names the server masked from
    then on; another store is still refused it."""
    endpoint = {"endpoint_url": _closed_endpoint()}
    url = s3_url()
    Store.on_bucket(url, anon=True, client_kwargs=endpoint, cache=tmp_path)
    mark = tmp_path / "bucket"
    masked = mark.read_text()
    mark.write_text(masked.replace("user:***@", f"user:{PASSWORD}@"))
    store = Store.on_bucket(url, anon=True, client_kwargs=endpoint, cache=tmp_path)
    assert isinstance(store, BucketStore) and store.cache is not None
    assert mark.read_text() == masked
    with pytest.raises(BadAddress, match="is bound to the bucket store"):
        Store.on_bucket(s3_url(), anon=True, client_kwargs=endpoint, cache=tmp_path)


@pytest.mark.parametrize("collector", ["cache", "bucket"])
@pytest.mark.parametrize("when", ["kept", "packed"])
def test_a_gc_of_the_cache_leaves_the_blob_a_keep_is_copying_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str, collector: str
) -> None:
    """A gc with no grace of the cache in front (its own, or the bucket's, which empties it)
    run the instant a keep has copied its blob there but not yet the record or pack index
    that refers to it leaves that blob, so the cache answers without the bucket."""
    url = s3_url()
    store = Store.on_bucket(url, cache=tmp_path / "cache", **s3_options())
    assert isinstance(store, BucketStore) and store.cache is not None
    cache = store.cache
    ran: list[str] = []
    fill = "_take_record" if when == "kept" else "_publish_index"
    real = getattr(cache, fill)

    def filling(*args: Any) -> None:
        if not ran:
            ran.append(fill)
            (cache if collector == "cache" else store).gc(grace=0)  # another thread, now
        real(*args)

    monkeypatch.setattr(cache, fill, filling)
    items = [(key_of("copied"), b"copied into the cache")]
    if when == "packed":
        items.append((key_of("beside"), b"packed beside it"))
        answers = store.keep_many(items, "plain")
    else:
        answers = [store.keep(*items[0], "plain")]
    monkeypatch.undo()
    assert ran == [fill]
    store.fs.rm(store._blob_path(answers[0].value))  # only the cache holds the blob now
    fresh = Store.on_bucket(url, cache=tmp_path / "cache", **s3_options())
    assert {key: bytes(fresh.recall(key)[1]) for key, _ in items} == dict(items)
    assert LocalStore(tmp_path / "cache").verify().ok


def test_a_keep_that_fails_lets_go_of_its_blob_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keep whose record cannot be written lets go of the blob it copied into the cache:
    a gc of the cache with no grace removes it, as nothing refers to it."""
    store = Store.on_bucket(s3_url(), cache=tmp_path / "cache", **s3_options())
    assert isinstance(store, BucketStore) and store.cache is not None
    real = store._write

    def write(path: str, pieces: Any) -> None:
        if "/answers/" in path:
            raise StoreError("the record could not be written")
        real(path, pieces)

    monkeypatch.setattr(store, "_write", write)
    with pytest.raises(StoreError, match="could not be written"):
        store.keep(key_of("unrecorded"), b"copied, never referred to", "plain")
    assert store.cache.gc(grace=0).blobs == 1


def test_a_copy_into_the_cache_of_a_blob_already_there_keeps_it_from_another_gc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keep that finds its blob in the cache already (old, referred to by nothing) touches
    it, so a gc of the cache folder by another store object, with the default grace, run
    before the record is copied there leaves it, as it leaves a blob just written."""
    store = Store.on_bucket(s3_url(), cache=tmp_path / "cache", **s3_options())
    assert isinstance(store, BucketStore) and store.cache is not None
    content = b"left in the cache long ago"
    old = store.cache.blob_path(store.cache.put(content))
    os.utime(old, (time.time() - 3600,) * 2)
    real = store.cache._take_record

    def filling(*args: Any) -> None:
        LocalStore(tmp_path / "cache").gc()  # another process, at this instant
        real(*args)

    monkeypatch.setattr(store.cache, "_take_record", filling)
    store.keep(key_of("found there"), content, "plain")
    monkeypatch.undo()
    assert bytes(LocalStore(tmp_path / "cache").recall(key_of("found there"))[1]) == content


def test_a_gc_whose_deletes_are_refused_says_so() -> None:
    """A gc with credentials that may read but not delete removes nothing and says so,
    instead of counting as removed what is still there; one that may delete removes what
    it counts."""
    admin, reader = user(["s3:*"]), user(READS)
    url = s3_url()
    with enable_iam_authentication():
        writer = Store.on_bucket(url, **admin)
        writer.keep(key_of("kept"), b"an answer", "plain")
        writer.put(b"referred to by nothing")
        before = objects(writer)
        with pytest.raises(StoreError, match="may not delete") as refused:
            Store.on_bucket(url, **reader, retries=1, backoff=0.0).gc(0, grace=0)
        assert "could not be removed" in str(refused.value)
        assert objects(writer) == before
        done = Store.on_bucket(url, **admin).gc(0, grace=0)
        assert (done.answers, done.blobs) == (1, 2)
        assert not [p for p in objects(writer) if "/answers/" in p or "/blobs/" in p]


def test_the_command_line_says_a_gc_whose_deletes_are_refused_removed_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`somatize store gc` with credentials that may not delete exits 2 with one line saying
    so, and prints no count of what it removed."""
    import s3fs

    admin, reader = user(["s3:*"]), user(READS)
    url = s3_url()
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", admin["client_kwargs"]["endpoint_url"])
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", reader["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", reader["secret"])
    monkeypatch.setattr(s3fs.S3FileSystem, "_cache", {})  # a client of its own, not cached
    with enable_iam_authentication():
        writer = Store.on_bucket(url, **admin)
        writer.keep(key_of("kept"), b"an answer", "plain")
        before = objects(writer)
        assert main(["store", "gc", "--store", url, "--max-bytes", "0", "--grace", "0"]) == 2
        assert objects(writer) == before
    out, err = capsys.readouterr()
    assert "dropped" not in out and "freed" not in out
    assert "could not be removed" in err and len(err.strip().splitlines()) == 1


WRITES = ["s3:GetObject", "s3:PutObject", "s3:ListBucket", "s3:HeadBucket"]
"""What a user who may read and write a bucket, but not delete, may do."""


def damaged_in_place(url: str, admin: dict[str, Any], key: str) -> str:
    """Keeps an answer under ``key`` at ``url``, then damages its blob there at its full
    size; the blob's name in ``blobs/``."""
    answer = Store.on_bucket(url, **admin).keep(key, b"hello world", "plain")
    bucket = Store.on_bucket(url, **admin)
    assert isinstance(bucket, BucketStore)
    bucket.fs.pipe_file(bucket._blob_path(answer.value), b"HELLO WORLD")
    return f"{answer.value[7:9]}/{answer.value[7:]}"


@pytest.mark.parametrize("found_by", ["recall", "verify"])
def test_a_damaged_blob_that_cannot_be_moved_aside_is_written_over(found_by: str) -> None:
    """With credentials that may write but not delete, a damaged blob cannot be moved to
    quarantine/ (a copy, then a delete): a recall that finds it says it is still in place,
    never that it moved, and a keep of its bytes again through the store object that found
    it (the recompute) writes over it, so the next recall is whole."""
    admin, writes = user(["s3:*"]), user(WRITES)
    url = s3_url()
    key = key_of("damaged in place")
    with enable_iam_authentication():
        damaged_in_place(url, admin, key)
        finder = Store.on_bucket(url, **writes)
        if found_by == "recall":
            with pytest.raises(Corrupt, match="still in place") as damaged:
                finder.recall(key)
            assert "was moved to quarantine" not in str(damaged.value)
        else:
            assert not finder.verify(quarantine=True).ok
        finder.keep(key, b"hello world", "plain")
        assert bytes(Store.on_bucket(url, **writes).recall(key)[1]) == b"hello world"
        assert Store.on_bucket(url, **admin).verify().ok


def test_verify_lists_a_damaged_blob_it_could_not_move_as_unmoved() -> None:
    """verify --quarantine with credentials that may not delete reports a damaged blob as
    not moved, with why, never as moved to quarantine/."""
    admin, writes = user(["s3:*"]), user(WRITES)
    url = s3_url()
    with enable_iam_authentication():
        name = damaged_in_place(url, admin, key_of("damaged in place"))
        found = Store.on_bucket(url, **writes).verify(quarantine=True)
    assert ("blobs", name) in [(d.section, d.name) for d in found.damaged]
    assert found.quarantined == []
    assert "may not delete there, so it is still in place" in found.unmoved[f"blobs/{name}"]


def test_gc_aborts_the_uploads_of_its_blobs_left_incomplete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An upload of a blob left incomplete (its abort could not reach the server) is aborted
    by a gc of the store once nothing was added to it for a day, and counted as an abandoned
    write; one given a part more recently (it may be going on) is left, and so is another
    prefix's."""
    store, other = (Store.on_bucket(s3_url(), **s3_options()) for _ in range(2))
    assert isinstance(store, BucketStore) and isinstance(other, BucketStore)
    client = store.fs

    def begun(at: BucketStore, label: str) -> Any:
        upload = at.fs.open(
            at._blob_path(key_of(label)), "wb", block_size=5 << 20, autocommit=False
        )
        upload.write(b"p" * (5 << 20))
        upload.flush()  # one part given; never completed, never aborted
        return upload

    def uploads() -> list[str]:
        listed = client.call_s3("list_multipart_uploads", Bucket="somatize-tests")
        return sorted(u["Key"] for u in listed.get("Uploads") or [] if "/blobs/" in u["Key"])

    files = [begun(store, "left"), begun(other, "elsewhere")]  # held open, as left
    ours = store._blob_path(key_of("left")).split("/", 1)[1]
    theirs = other._blob_path(key_of("elsewhere")).split("/", 1)[1]
    assert {ours, theirs} <= set(uploads())
    assert store.gc(grace=0).abandoned == 0  # a part given a moment ago: perhaps going on
    assert ours in uploads()
    monkeypatch.setattr("somatize.store._bucket_upkeep._UPLOADS_GRACE", 0.0, raising=False)
    done = store.gc(grace=0)
    assert (done.abandoned, done.freed) == (1, 5 << 20)
    assert ours not in uploads() and theirs in uploads()
    files[1].discard()  # the other prefix's, tidied


def _planted(url: str, keys: list[str]) -> Any:
    """The filesystem of the test bucket, with a user's file at each of ``keys`` under
    ``url``."""
    import s3fs

    fs = s3fs.S3FileSystem(**s3_options())
    for key in keys:
        fs.pipe_file(f"{url[5:]}/{key}", b"a user's file " + key.encode())
    return fs


USERS_FILES = [
    "tmp/report.csv",
    "tmp/run1/model.pt",
    "blobs/README.txt",
    "blobs/images/cat.png",
    f"blobs/ab/{'cd' * 32}",  # named by a digest, in the folder of another
    "data/keep.me",
]
"""Files a user may keep under a bucket prefix, where a store's sections would lie."""


def test_gc_of_a_bucket_store_removes_only_files_laid_out_as_its_own() -> None:
    """On an object store gc leaves tmp/ alone (the store writes nothing there) and, in
    blobs/, every file not laid out as a blob is (blobs/<2 hex>/<64 hex>): a user's files
    under the prefix, and a whole store under its tmp/, are left whole."""
    url = s3_url()
    fs = _planted(url, USERS_FILES)
    inner = Store.on_bucket(f"{url}/tmp/scratch", **s3_options())
    inner.keep(key_of("inner"), b"the inner store's answer", "plain")
    inner.bind("ds", inner.put(b"the inner store's dataset"))
    outer = Store.on_bucket(url, **s3_options())
    outer.keep(key_of("outer"), b"the outer store's answer", "plain")
    outer.put(b"nothing refers to this")
    done = outer.gc(grace=0)
    assert (done.blobs, done.abandoned) == (1, 0)
    for key in USERS_FILES:
        assert fs.cat_file(f"{url[5:]}/{key}") == b"a user's file " + key.encode()
    again = Store.on_bucket(f"{url}/tmp/scratch", **s3_options())
    assert bytes(again.recall(key_of("inner"))[1]) == b"the inner store's answer"
    assert bytes(again.get(again.resolve("ds"))) == b"the inner store's dataset"


def _cli_s3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An environment whose S3 client (the command line's) reaches the loopback server."""
    import s3fs

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_options()["client_kwargs"]["endpoint_url"])
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setattr(s3fs.S3FileSystem, "_cache", {})  # a client of its own, not cached


@pytest.mark.parametrize("command", [["gc", "--grace", "0", "--max-bytes", "0"], ["verify"]])
def test_the_command_line_refuses_a_bucket_prefix_holding_no_store(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
) -> None:
    """A bucket prefix that holds no store (no blobs/ beside answers/, packs/ or names/) is
    refused with status 2, as a directory holding none is, and a user's files there are
    left whole; a prefix holding a store is taken."""
    url = s3_url()
    fs = _planted(url, USERS_FILES)
    _cli_s3(monkeypatch, tmp_path)
    assert main(["store", *command, "--store", url]) == 2
    err = capsys.readouterr().err
    assert "holds no store" in err and len(err.strip().splitlines()) == 1
    assert len(fs.find(url[5:])) == len(USERS_FILES)
    store = Store.on_bucket(url, **s3_options())
    store.keep(key_of("kept"), b"an answer", "plain")
    assert main(["store", *command, "--store", url]) == 0


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["ls"], "so nothing is listed"),
        (["du"], "so nothing is measured"),
        (["gc"], "not a store's to collect"),
        (["verify"], "so nothing is checked"),
        (["show", "a-name"], "so nothing is shown"),
    ],
)
def test_a_refusal_of_a_bucket_prefix_holding_no_store_says_what_its_command_did_not_do(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
    said: str,
) -> None:
    """Each command refusing an empty bucket prefix says what it left undone: only gc
    speaks of collecting."""
    url = s3_url()
    _planted(url, [])
    _cli_s3(monkeypatch, tmp_path)
    assert main(["store", *command, "--store", url]) == 2
    err = capsys.readouterr().err
    assert said in err and ("collect" in err) == (command == ["gc"])


def test_a_store_inside_another_stores_section_is_none_of_its_own() -> None:
    """A store whose prefix lies inside another's answers/, packs/ or used/ is none of the
    other's: not counted by its have, checked by its verify, nor collected by its gc."""
    url = s3_url()
    outer = Store.on_bucket(url, **s3_options())
    outer.keep(key_of("outer"), b"the outer store's answer", "plain")
    inner_keys = {}
    for section in ("answers", "packs/old", "used/x"):
        inner = Store.on_bucket(f"{url}/{section}", **s3_options())
        inner_keys[section] = key_of(section)
        inner.keep(inner_keys[section], f"kept in {section}".encode(), "plain")
        inner.keep_many([(key_of(f"{section} item"), b"an item")], "plain")
        inner.bind("ds", inner.put(b"a dataset"))
        inner.recall(inner_keys[section])
        inner.close()  # its used/ log written
    asked = [key_of("outer"), *inner_keys.values()] + [key_of(f"no {i}") for i in range(40)]
    fresh = Store.on_bucket(url, **s3_options())
    assert fresh.have(asked) == {key_of("outer")}
    found = Store.on_bucket(url, **s3_options()).verify()
    assert found.ok and (found.records, found.packs, found.names) == (1, 0, 0)
    assert found.stray == []
    Store.on_bucket(url, **s3_options()).gc(grace=0)
    for section, key in inner_keys.items():
        again = Store.on_bucket(f"{url}/{section}", **s3_options())
        assert bytes(again.recall(key)[1]) == f"kept in {section}".encode()
        assert again.have([key_of(f"{section} item")]) == {key_of(f"{section} item")}
        assert bytes(again.get(again.resolve("ds"))) == b"a dataset"
        assert len(again._list("used")) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("section", ["names", "names/x"])
def test_a_store_inside_another_stores_names_is_refused_at_open(section: str) -> None:
    """A store whose prefix lies inside another's names/, every file under which the
    other reads as a name (its verify reporting them as damage), is refused when it is
    opened, naming that store and the section, as a local store is; a prefix that merely
    ends in such a word, with no store above it, opens."""
    url = s3_url()
    outer = Store.on_bucket(url, **s3_options())
    outer.keep(key_of("outer"), b"the outer store's answer", "plain")
    top = section.split("/")[0]
    with pytest.raises(BadAddress, match=rf"inside the `{top}/` of the store at {url}"):
        Store.on_bucket(f"{url}/{section}", **s3_options())
    lone = Store.on_bucket(f"{s3_url()}/{section}", **s3_options())
    lone.bind("ds", lone.put(b"a dataset"))
    found = Store.on_bucket(url, **s3_options()).verify()
    assert found.ok and found.names == 0


def test_a_store_made_in_another_stores_names_before_it_is_none_of_its_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store made first under what becomes another store's names/ once that one is
    opened above it is none of that store's: its verify lists the prefix as stray, not
    its files as damaged names, `store verify` says so and exits 0, and its gc leaves
    every file of it whole."""
    url = s3_url()
    inner = Store.on_bucket(f"{url}/names/proj", **s3_options())
    inner.keep(key_of("inner"), b"the inner store's answer", "plain")
    inner.bind("ds", inner.put(b"the inner store's dataset"))
    inner.close()
    fs = inner.fs  # type: ignore[attr-defined]
    held = sorted(fs.find(f"{url[5:]}/names/proj"))
    outer = Store.on_bucket(url, **s3_options())
    outer.keep(key_of("outer"), b"the outer store's answer", "plain")
    outer.bind("mine", outer.put(b"the outer store's dataset"))
    found = Store.on_bucket(url, **s3_options()).verify()
    assert found.ok and (found.records, found.names) == (1, 1)
    assert found.stray == ["names/proj/"]
    Store.on_bucket(url, **s3_options()).gc(0, grace=0)
    assert sorted(fs.find(f"{url[5:]}/names/proj")) == held
    _cli_s3(monkeypatch, tmp_path)
    assert main(["store", "verify", "--store", url]) == 0
    said = capsys.readouterr().out
    assert "stray   names/proj/: holds another store" in said and "DAMAGED" not in said
    assert main(["store", "ls", "--store", url]) == 0
    assert "proj/" not in capsys.readouterr().out


def _dropping_server() -> tuple[str, list[int], Any]:
    """An endpoint that takes each connection and closes it unanswered, counting them."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    taken = [0]

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            taken[0] += 1
            connection.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", taken, listener


@pytest.mark.parametrize("layer", ["", "simplecache::"])
@pytest.mark.parametrize("retries", [0, 2])
def test_a_request_to_s3_is_made_as_often_as_retries_says(retries: int, layer: str) -> None:
    """A request that keeps failing is made 1 + `retries` times: the store's retrying is
    the only one, not multiplied by the retries of s3fs and botocore (five each), so a
    refused endpoint is said at once. So it is through a chained URL's S3 layer, its
    options given under its protocol."""
    endpoint, taken, listener = _dropping_server()
    options = {"key": "x", "secret": "x", "client_kwargs": {"endpoint_url": endpoint}}
    given = {"s3": options} if layer else options
    try:
        store = Store.on_bucket(
            f"{layer}s3://somatize-tests/{uuid.uuid4().hex[:12]}",
            **given,
            retries=retries,
            backoff=0.0,
        )
        with pytest.raises(StoreError, match=f"failed {retries + 1} times"):
            store.resolve("anything")
    finally:
        listener.close()
    # The HTTP client opens a second connection to send a request whose connection was
    # closed unanswered once more (as HTTP/1.1 allows for one that may be repeated).
    assert retries + 1 <= taken[0] <= 2 * (retries + 1)


def test_folder_markers_in_a_bucket_are_no_files_of_the_store() -> None:
    """Zero-byte keys ending in "/" (what the S3 console's "Create folder" writes) are no
    files of the store: a marker `names/ds/` does not stop `ds` from being bound, and
    verify lists none of them as stray."""
    url = s3_url()
    store = Store.on_bucket(url, **s3_options())
    assert isinstance(store, BucketStore)
    store.keep(key_of("kept"), b"an answer", "plain")
    bucket, prefix = store.fs.split_path(store.root)[:2]
    for folder in ("", "answers/", "answers/00/", "blobs/", "blobs/ab/", "names/", "names/ds/"):
        store.fs.call_s3("put_object", Bucket=bucket, Key=f"{prefix}/{folder}", Body=b"")
    fresh = Store.on_bucket(url, **s3_options())
    fresh.bind("ds", fresh.put(b"a dataset"))
    assert bytes(fresh.get(fresh.resolve("ds"))) == b"a dataset"
    found = Store.on_bucket(url, **s3_options()).verify()
    assert found.ok and found.stray == [] and (found.records, found.names) == (1, 1)


@pytest.mark.parametrize(
    "options",
    [
        {"client_kwargs": {"endpoint_url": "notaurl"}},
        {"endpoint_url": "localhost:9000"},
        {"client_kwargs": {"endpoint_url": "http://"}},
    ],
)
def test_an_endpoint_that_is_no_url_is_refused_at_open(options: dict[str, Any]) -> None:
    """An endpoint that is no http(s) URL with a host is refused when the store is opened,
    naming the option, not by a ValueError from the client at the first request."""
    with pytest.raises(BadAddress, match="endpoint_url"):
        Store.on_bucket(s3_url(), key="x", secret="x", **options).have([key_of("any")])


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"client_kwargs": "http://127.0.0.1:9000"}, "client_kwargs is a `str` of 21 characters"),
        ({"config_kwargs": "s3v4"}, "config_kwargs is a `str` of 4 characters"),
        ({"s3_additional_kwargs": b"SSECustomerKey"}, "s3_additional_kwargs is a `bytes` of 14"),
        ({"client_kwargs": ["aws_secret_access_key"]}, "client_kwargs is a `list` of 1 item:"),
        ({"config_kwargs": 5}, "config_kwargs is 5, a `int`: it is a dict of"),
        ({"key": 5}, "key is a `int`: the S3 client takes it as text"),
        ({"secret": 5}, "secret is a `int`"),
        ({"token": b"t"}, "token is a `bytes`"),
        ({"client_kwargs": {"region_name": 1}}, r"client_kwargs\['region_name'\] is 1, a `int`"),
    ],
)
def test_an_s3_option_of_another_kind_than_it_takes_is_refused_at_open(
    options: dict[str, Any], said: str
) -> None:
    """An S3 option given as another kind of value than the client takes (client_kwargs as
    a str, not a dict; a key as an int, not text) is refused when the store is opened,
    naming the option and what it takes (never a credential's value, nor the text or
    items of a dict given otherwise, which may hold one), not by a bare AttributeError or
    TypeError from the client at the first request."""
    given = {**s3_options(), **options}
    with pytest.raises(BadAddress, match=said) as refused:
        Store.on_bucket(s3_url(), **given).put(b"x")
    for value in options.values():
        if isinstance(value, (str, bytes, list)):
            assert repr(value) not in str(refused.value)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"secret": 5}, r"s3\['secret'\] is a `int`"),
        ({"client_kwargs": "{'secret': 's'}"}, r"s3\['client_kwargs'\] is a `str` of"),
        (
            {"client_kwargs": {"endpoint_url": "minio:9000"}},
            r"s3\['client_kwargs'\]\['endpoint_url'\] is 'minio:9000', which is no endpoint",
        ),
    ],
)
def test_an_s3_option_under_its_protocol_in_a_chained_url_is_checked_at_open(
    options: dict[str, Any], said: str
) -> None:
    """The S3 options of a chained URL, given under its protocol (``simplecache::s3://…``
    with ``s3={…}``), are checked as those of a plain S3 URL are, and refused naming where
    they were given, not by a bare error of the client, or not at all."""
    layer = {**s3_options(), **options}
    with pytest.raises(BadAddress, match=said):
        Store.on_bucket(f"simplecache::{s3_url()}", s3=layer).put(b"x")


@pytest.mark.parametrize("bare", [{"endpont_url": "http://127.0.0.1:9"}, {"key": "k"}])
def test_an_option_a_chained_url_s_outer_layer_would_drop_is_refused(
    bare: dict[str, Any],
) -> None:
    """An option given bare for a chained URL whose outer layer keeps copies (misspelled,
    or the bucket's own) is refused naming it and the protocol to give it under: that
    layer would drop it unused, and the store would reach the bucket without it."""
    name = next(iter(bare))
    with pytest.raises(BadAddress, match=re.escape(f"[{name!r}] given bare")) as refused:
        Store.on_bucket(f"simplecache::{s3_url()}", s3=s3_options(), **bare)
    assert re.search(r"`s3=\{'\w+': …\}`", str(refused.value))


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("s3:///features", "names no bucket"),
        ("s3://somatize-tests//features", "empty, `.` or `..`"),
        ("s3://somatize-tests/./features", "empty, `.` or `..`"),
        ("s3://somatize-tests/features/..", "empty, `.` or `..`"),
    ],
)
def test_an_s3_url_whose_path_is_not_plain_is_refused_at_open(url: str, said: str) -> None:
    """An S3 URL naming no bucket before its prefix, or whose prefix holds an empty, `.` or
    `..` segment, is refused when the store is opened: the client would write into
    another bucket or another prefix than the URL seems to say."""
    with pytest.raises(BadAddress, match=re.escape(said)):
        Store.on_bucket(url, **s3_options()).put(b"where")


@pytest.mark.parametrize("upkeep", ["verify", "gc", "have"])
def test_a_store_object_that_listed_the_bucket_reads_what_others_keep_later(upkeep: str) -> None:
    """A store object that listed the bucket (its verify or gc, a have of many keys) reads
    the records, blobs and names another process writes there later, in the folders it
    listed, as they are now: it recalls and resolves them, its verify finds them whole and
    moves none aside, and its gc keeps the blobs a record and a name refer to."""
    url = s3_url()
    mine = Store.on_bucket(url, **s3_options())
    later_value = b"kept later by another process"
    shard = key_of_bytes(later_value)[7:9]
    filler = next(  # a blob in the folder the later blob will be in, so that it is listed
        data for i in range(10_000) if key_of_bytes(data := f"filler {i}".encode())[7:9] == shard
    )
    first, later = "blake3:ab" + "0" * 62, "blake3:ab" + "1" * 62  # one folder of answers/
    mine.keep(first, filler, "plain")
    mine.bind("ds/a", mine.put(b"a dataset"))
    if upkeep == "verify":
        assert mine.verify().ok
    elif upkeep == "gc":
        mine.gc()
    else:
        assert mine.have([f"blake3:{i:064x}" for i in range(100)] + [first]) == {first}
    # Another process: a client of its own, which shares nothing this one holds.
    theirs = Store.on_bucket(url, **s3_options(), skip_instance_cache=True)
    theirs.keep(later, later_value, "plain")
    theirs.bind("ds/b", theirs.put(b"another dataset"))
    assert bytes(mine.recall(later)[1]) == later_value
    assert bytes(mine.get(mine.resolve("ds/b"))) == b"another dataset"
    found = mine.verify(quarantine=True)
    assert (found.damaged, found.quarantined) == ([], [])
    mine.gc(grace=0)
    fresh = Store.on_bucket(url, **s3_options(), skip_instance_cache=True)
    assert bytes(fresh.recall(later)[1]) == later_value
    assert bytes(fresh.get(fresh.resolve("ds/b"))) == b"another dataset"


def test_a_store_at_a_chained_url_that_listed_the_bucket_reads_what_others_keep_later() -> None:
    """A store at a chained URL (``simplecache::s3://…``, the bucket's options under
    ``s3=``) holds no listing either: one that listed ``answers/`` (a verify, a have of
    many keys) recalls what another process kept there later."""
    url = s3_url()
    mine = Store.on_bucket(f"simplecache::{url}", s3=s3_options())
    first, later = "blake3:ab" + "0" * 62, "blake3:ab" + "1" * 62  # one folder of answers/
    mine.keep(first, b"kept first", "plain")
    assert mine.verify().ok
    assert mine.have([f"blake3:{i:064x}" for i in range(100)] + [first]) == {first}
    Store.on_bucket(url, **s3_options(), skip_instance_cache=True).keep(
        later, b"kept later", "plain"
    )
    assert mine.have([later]) == {later}
    assert bytes(mine.recall(later)[1]) == b"kept later"


def test_a_store_at_a_caching_chained_url_reads_what_others_write_later() -> None:
    """A store at a chained URL through a caching layer (``simplecache::s3://…``) reads
    its files from the bucket, not from the layer's copies of them: a name another
    process bound again resolves to the new digest, in that store object and in another
    opened in the same process (which fsspec hands the same layer), rather than to the
    dataset it named before; and a blob whose copy the layer took damaged is read from
    the bucket again, not quarantined there whole."""
    url = s3_url()
    mine = Store.on_bucket(f"simplecache::{url}", s3=s3_options())
    theirs = Store.on_bucket(url, **s3_options(), skip_instance_cache=True)
    theirs.bind("ds", theirs.put(b"the first dataset"))
    assert bytes(mine.get(mine.resolve("ds"))) == b"the first dataset"
    theirs.bind("ds", theirs.put(b"the second dataset"))
    assert bytes(mine.get(mine.resolve("ds"))) == b"the second dataset"
    again = Store.on_bucket(f"simplecache::{url}", s3=s3_options())
    assert bytes(again.get(again.resolve("ds"))) == b"the second dataset"
    # A copy the layer took whole of a blob, then damaged on this machine: the bucket's
    # blob is whole, and is what a fresh store object reads.
    digest = theirs.put(b"a blob read through the layer")
    assert bytes(Store.on_bucket(f"simplecache::{url}", s3=s3_options()).get(digest))
    layer = mine.fs
    copy = Path(layer.storage[-1]) / layer._mapper(layer._strip_protocol(mine._blob_path(digest)))
    copy.write_bytes(b"a blob read through the lay3r")
    fresh = Store.on_bucket(f"simplecache::{url}", s3=s3_options())
    assert bytes(fresh.get(digest)) == b"a blob read through the layer"
    with fresh.open_blob(digest) as handle:  # in ranges, as a Parquet source reads it
        assert handle.read() == b"a blob read through the layer"
    assert theirs.verify().ok


def s3_requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the S3 requests made from now on (``get_object``, ``head_object``…),
    in order, by every s3fs client of this process."""
    import s3fs

    asked: list[str] = []
    call_s3 = s3fs.S3FileSystem._call_s3

    async def counted(fs: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(method)
        return await call_s3(fs, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    return asked


def test_records_and_names_are_read_in_one_request_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gc, a verify, a recall and a resolve read each record and name in one request,
    never asking its size first (s3fs does, to read a large file in ranges, where it holds
    no listing): a gc or verify would otherwise ask the bucket twice for every record."""
    url = s3_url()
    writer = Store.on_bucket(url, **s3_options())
    keys = [f"blake3:{i:064x}" for i in range(30)]
    for key in keys:
        writer.keep(key, b"v", "plain")
    writer.bind("ds/a", writer.put(b"a dataset"))
    asked = s3_requests(monkeypatch)
    store = Store.on_bucket(url, **s3_options(), skip_instance_cache=True)
    store.gc()
    assert store.verify().ok
    store.recall(keys[0])
    store.resolve("ds/a")
    assert asked.count("get_object") >= 2 * len(keys)  # each record by gc and by verify
    assert asked.count("head_object") < len(keys), asked  # the bucket, the blobs hashed


def test_a_recall_reads_a_small_answer_in_one_request_for_its_record_and_one_for_its_blob(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A recall reads the record, then the blob in one request, never asking its size
    first: the record says it, and one no larger than what s3fs reads in ranges is read
    whole."""
    url = s3_url()
    writer = Store.on_bucket(url, **s3_options())
    first, second = key_of("first"), key_of("second")
    writer.keep(first, b"the first answer", "plain")
    writer.keep(second, b"the second answer", "plain")
    store = Store.on_bucket(url, **s3_options(), skip_instance_cache=True)
    assert bytes(store.recall(first)[1]) == b"the first answer"  # packs looked at once
    asked = s3_requests(monkeypatch)
    assert bytes(store.recall(second)[1]) == b"the second answer"
    assert asked == ["get_object", "get_object"]


def test_a_verify_reads_each_blob_it_listed_small_in_one_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A verify reads each blob its listing found smaller than what s3fs reads in ranges
    in one request, never asking its size first: the listing said it."""
    url = s3_url()
    writer = Store.on_bucket(url, **s3_options())
    for i in range(30):
        writer.put(f"blob {i}".encode())
    asked = s3_requests(monkeypatch)
    found = Store.on_bucket(url, **s3_options(), skip_instance_cache=True).verify()
    assert (found.ok, found.blobs) == (True, 30)
    assert asked.count("get_object") == 30
    assert asked.count("head_object") < 30, asked


def test_a_name_whose_key_the_prefix_makes_too_long_is_refused_naming_the_room_left() -> None:
    """An object key holds at most 1024 bytes, and a name may be that long by itself: on a
    bucket, a name whose file's key (prefix, ``names/``, name) is longer is BadName saying
    how long a name may be under this prefix, before anything is written — not a write S3
    refuses (which the loopback server does not), nor a bind that cannot be resolved."""
    store = Store.on_bucket(s3_url(), **s3_options())
    room = 1024 - len(f"{store.url.split('/', 3)[3]}/names/")
    digest = store.put(b"rows")
    longest = "/".join(["a" * 200] * 5)[: room - 1] + "b"
    store.bind(longest, digest)
    assert store.resolve(longest) == digest
    too_long = longest + "c"
    for call in (lambda: store.bind(too_long, digest), lambda: store.resolve(too_long)):
        with pytest.raises(BadName, match=rf"at most {room} bytes here"):
            call()
    assert not any("/names/" in path and path.endswith("bc") for path in objects(store))


def s3_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of the objects read (``get_object``) from now on, in order, by every s3fs
    client of this process."""
    import s3fs

    read: list[str] = []
    call_s3 = s3fs.S3FileSystem._call_s3

    async def counted(fs: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "get_object":
            read.append(str(kwargs.get("Key")))
        return await call_s3(fs, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    return read


def test_a_damaged_pack_index_is_read_again_only_once_it_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pack index with a byte changed in the bucket is read at the first miss and not at
    the next (its items are misses all the same); written back whole, the same size, it is
    read at the next lookup and its items found. A verify still reports it damaged."""
    url = s3_url()
    writer = Store.on_bucket(url, **s3_options())
    items = [(key_of(f"item {i}"), f"row {i}".encode()) for i in range(3)]
    writer.keep_many(items, "plain")
    assert isinstance(writer, BucketStore)
    [index] = [path for path in objects(writer) if "/packs/" in path]
    whole = writer.fs.cat_file(index)
    damaged = whole[:-1] + bytes([whole[-1] ^ 1])
    writer.fs.pipe_file(index, damaged)
    reads = s3_reads(monkeypatch)
    store = Store.on_bucket(url, **s3_options(), skip_instance_cache=True)
    assert store.have([items[0][0]]) == set()
    with pytest.raises(Missing):
        store.recall(items[1][0])
    assert sum(index.endswith(key) for key in reads) == 1
    writer.fs.pipe_file(index, whole)
    assert store.have([key for key, _ in items]) == {key for key, _ in items}
    assert bytes(store.recall(items[1][0])[1]) == b"row 1"
    assert sum(index.endswith(key) for key in reads) == 2

    writer.fs.pipe_file(index, damaged)
    other = Store.on_bucket(url, **s3_options(), skip_instance_cache=True)
    assert other.have([items[0][0]]) == set()
    found = other.verify()
    name = index.rsplit("/", 1)[-1]
    assert ("packs", name) in [(d.section, d.name) for d in found.damaged]
    assert other.have([items[0][0]]) == set()


@pytest.mark.parametrize("url", ["reference://somatize/store", "dbfs://somatize/store"])
def test_a_url_whose_filesystem_cannot_be_made_from_it_is_refused_at_open(url: str) -> None:
    """A URL of a filesystem that needs what a URL cannot hold (a reference file, an
    instance and its token) is refused with StoreError naming the URL and what is missing,
    not fsspec's TypeError from the filesystem's making."""
    with pytest.raises(StoreError, match=f"cannot open {re.escape(url)} as a bucket store"):
        Store.on_bucket(url)


@pytest.mark.parametrize("ahead", [300.0, -300.0])
def test_a_gc_whose_clock_runs_apart_from_the_servers_spares_a_blob_put_a_moment_ago(
    monkeypatch: pytest.MonkeyPatch, ahead: float
) -> None:
    """The grace a gc keeps is measured on the clock that stamps the bucket's objects (the
    server's), not the machine's own: a gc on a machine whose clock runs minutes ahead
    (which S3 takes, up to fifteen) took a blob another process put a moment ago, before it
    bound it, for one put minutes ago, and removed it."""
    url = s3_url()
    writer = Store.on_bucket(url, **s3_options())
    collector = Store.on_bucket(url, **s3_options())
    data = b"a dataset, bound once it is all written"
    digest = writer.put(data)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + ahead)
    done = collector.gc(grace=60)
    monkeypatch.undo()
    assert done.blobs == 0
    writer.bind("data/v1", digest)
    assert bytes(writer.get(writer.resolve("data/v1"))) == data
    # Once older than the grace by the server's clock, it goes, whichever way the
    # machine's runs apart (S3 stamps whole seconds, so it waits out more than one).
    stray = writer.put(b"put, and never bound")
    time.sleep(3.0)
    monkeypatch.setattr(time, "time", lambda: real() + ahead)
    assert collector.gc(grace=1).blobs == 1
    monkeypatch.undo()
    assert not writer.has_blob(stray)
    assert not [path for path in objects(collector) if "/used/" in path]  # nothing left


def test_a_gc_with_credentials_that_may_not_write_measures_its_grace_on_its_own_clock() -> None:
    """A gc whose credentials may read and delete but not write cannot ask the server's
    clock through a log of its own: it collects as it did, measuring ages on this
    machine's clock, rather than failing."""
    url = s3_url()
    writer = Store.on_bucket(url, **s3_options())
    writer.bind("data/v1", writer.put(b"pinned"))
    stray = writer.put(b"put, and never bound")
    may_delete = user([*READS, "s3:DeleteObject"])
    time.sleep(2.0)
    with enable_iam_authentication():
        collector = Store.on_bucket(url, **may_delete)
        assert collector.gc(grace=1).blobs == 1
    assert not writer.has_blob(stray)
    assert bytes(writer.get(writer.resolve("data/v1"))) == b"pinned"


@pytest.mark.parametrize("archive", ["zip", "tar"])
def test_a_store_in_an_archive_is_read_only_and_says_so(tmp_path: Path, archive: str) -> None:
    """A store packed into a zip or tar archive and opened there (`zip://::file://…`) is
    read: a forward recalls what it keeps. fsspec reads such archives only, so a forward
    that would keep an answer is a StoreError saying the store is in an archive before any
    node runs, and a put says so too, not fsspec's "write() requires mode 'w'"; writable()
    is False."""
    largest = Largest().named("largest").frozen().cached()
    g = Graph.somatize(Scale().named("scale").frozen() >> largest)
    assert g.forward([1.0, 2.0], store=Store(f"file://{tmp_path / 'store'}")) == 4.0
    packed = shutil.make_archive(str(tmp_path / "packed"), archive, tmp_path, "store")
    store = Store(f"{archive}://store::file://{packed}")
    assert g.forward([1.0, 2.0], store=store) == 4.0
    assert largest.calls == 1
    assert store.writable() is False
    said = rf"the store is in a {archive} archive, which is only read here"
    with pytest.raises(StoreError, match=said):
        g.forward([1.0, 3.0], store=store)
    assert largest.calls == 1
    with pytest.raises(StoreError, match=said):
        store.put(b"features")


@pytest.mark.parametrize("grace", [0.0, 60.0])
def test_a_gc_of_a_store_in_an_archive_says_it_is_only_read(tmp_path: Path, grace: float) -> None:
    """A gc of a store opened inside an archive is a StoreError saying the store is in an
    archive, which is only read, before it removes or writes anything: it failed with an
    empty NotImplementedError from fsspec as it removed what it found, or, with a grace,
    with the error of the file it writes to read the store's clock."""
    key = key_of("features")
    Store(f"file://{tmp_path / 'store'}").keep(key, b"features", "plain")
    packed = shutil.make_archive(str(tmp_path / "packed"), "zip", tmp_path, "store")
    store = Store(f"zip://store::file://{packed}")
    said = "cannot collect garbage in zip://store::file://.*: the store is in a zip archive"
    with pytest.raises(StoreError, match=said):
        store.gc(max_bytes=0, grace=grace)
    assert bytes(store.recall(key)[1]) == b"features"


@pytest.mark.parametrize("archive", ["zip", "tar"])
def test_a_verify_that_would_quarantine_in_an_archive_says_it_is_only_read(
    tmp_path: Path, archive: str
) -> None:
    """verify(quarantine=True) of a store in an archive with a damaged blob reports the
    damage and says of each file it would move aside that the archive is only read, as of
    a read-only store, and changes nothing: it failed with an empty NotImplementedError from
    fsspec as it began to move the first aside."""
    local = Store(tmp_path / "store")
    digest = local.put(b"features " * 100)
    local.bind("data/v1", digest)
    blob = tmp_path / "store" / "blobs" / digest[7:9] / digest[7:]
    blob.write_bytes(b"X" + blob.read_bytes()[1:])
    packed = shutil.make_archive(str(tmp_path / "packed"), archive, tmp_path, "store")
    store = Store(f"{archive}://store::file://{packed}")
    found = store.verify(quarantine=True)
    assert [damage.section for damage in found.damaged] == ["blobs", "names"]  # names stay
    assert not found.quarantined
    assert list(found.unmoved) == [f"blobs/{digest[7:9]}/{digest[7:]}"]
    assert f"the store is in a {archive} archive" in next(iter(found.unmoved.values()))
    assert store.resolve("data/v1") == digest


def _finishes(call: Any, fifos: list[Path]) -> Any:
    """What ``call()`` answers or raises, within seconds: a reader waiting for a writer of
    one of ``fifos`` for good is let go (a writer opened and closed) and the test fails."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as why:
            out.append(why)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    for fifo in fifos:
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    thread.join(10)
    assert out, "it waited on a FIFO for good"
    return out[0]


@pytest.mark.parametrize("at", ["record", "blob", "name"])
def test_a_fifo_in_a_store_opened_by_a_file_url_is_no_file_and_never_waited_on(
    tmp_path: Path, at: str
) -> None:
    """A FIFO planted where a record, blob or name lies in a store opened at a `file://`
    URL (a `store=` URL) was opened to be read, which waits for a writer for good: have,
    recall and resolve hung. It is no file of the store, as a local store takes it: the
    answer is a miss, the name bound to nothing."""
    local = LocalStore(tmp_path / "store")
    key = key_of("features")
    answer = local.keep(key, b"features", "plain")
    local.bind("data/v1", local.put(b"dataset"))
    path = {
        "record": local.answer_path(key),
        "blob": local.blob_path(answer.value),
        "name": tmp_path / "store" / "names" / "data" / "v1",
    }[at]
    path.unlink()
    os.mkfifo(path)
    store = Store(f"file://{tmp_path / 'store'}")
    had = _finishes(lambda: store.have([key]), [path])
    recalled = _finishes(lambda: bytes(store.recall(key)[1]), [path])
    resolved = _finishes(lambda: store.resolve("data/v1"), [path])
    if at == "name":
        assert had == {key} and recalled == b"features" and isinstance(resolved, NameNotFound)
    else:
        assert isinstance(recalled, Missing) and resolved == local.resolve("data/v1")


@pytest.mark.parametrize("member", ["fifo", "link"])
def test_a_member_of_a_tar_store_that_is_no_regular_file_is_a_miss(
    tmp_path: Path, member: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store packed by tar, where a blob or a name is a FIFO or a symlink to a file
    outside the archive (tar keeps a link as a link): a forward failed with fsspec's
    AttributeError ('NoneType' object has no attribute 'size') or KeyError (linkname not
    found), resolve too, and `somatize store verify` printed a traceback. Such a member is
    no file of the store, as in a local store: the answer is a miss (here a StoreError
    saying the archive is only read), the name bound to nothing, and verify says so."""
    largest = Largest().named("largest").frozen().cached()
    g = Graph.somatize(Scale().named("scale").frozen() >> largest)
    root = tmp_path / "store"
    local = LocalStore(root)
    assert g.forward([1.0, 2.0], store=local) == 4.0
    local.bind("data/v1", local.put(b"dataset"))
    (key,) = [f"blake3:{p.name}" for p in (root / "answers").rglob("*") if p.is_file()]
    odd = [local.blob_path(local.answer(key).value), root / "names" / "data" / "v1"]
    packed = tmp_path / "packed.tar"
    with tarfile.open(packed, "w") as tar:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            name = f"store/{path.relative_to(root)}"
            if path not in odd:
                tar.add(path, name)
                continue
            info = tarfile.TarInfo(name)
            info.type = tarfile.FIFOTYPE if member == "fifo" else tarfile.SYMTYPE
            info.linkname = str(path) if member == "link" else ""
            tar.addfile(info)
    url = f"tar://store::file://{packed}"
    with pytest.raises(StoreError, match="the store is in a tar archive, which is only read"):
        g.forward([1.0, 2.0], store=url)
    with pytest.raises(Missing):
        Store(url).recall(key)
    with pytest.raises(NameNotFound):
        Store(url).resolve("data/v1")
    assert main(["store", "verify", "--store", url]) in (0, 1)
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("name", ["missing.zip", ""])
def test_an_archive_that_cannot_be_opened_is_a_store_error(tmp_path: Path, name: str) -> None:
    """A store opened in an archive that is not there, or at a folder, is a StoreError
    naming the URL and saying nothing was opened, not the OSError fsspec met opening
    it."""
    url = f"zip://store::file://{tmp_path / name}"
    with pytest.raises(StoreError, match=rf"cannot open {re.escape(url)} as a store: .*"):
        Store(url)


def _packed_store(tmp_path: Path) -> tuple[str, str]:
    """A store in ``tmp_path / "store"`` keeping one answer and naming a dataset; its key."""
    local = LocalStore(tmp_path / "store")
    key = key_of("features")
    local.keep(key, b"features", "plain")
    local.bind("data/v1", local.put(b"dataset"))
    return key, str(tmp_path / "store")


@pytest.mark.parametrize(
    ("packed", "named"),
    [(["-C", "store", "."], ""), (["-C", "store", "."], "."), (["./store"], "store")],
)
def test_a_store_tarred_with_dot_names_is_read_at_the_prefix_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], packed: list[str], named: str
) -> None:
    """A store packed with tar from its own folder (`tar czf store.tar.gz -C store .`), whose
    files tar names `./blobs/…`, opened at the archive's root (`tar://::file://…`), read as
    an empty store: every answer a miss, the dataset bound to nothing, and verify found all
    well, having checked nothing; so did `./store` opened as `store`. It is read where the
    prefix named, or the same under `.`, holds it."""
    key, _ = _packed_store(tmp_path)
    archive = tmp_path / "packed.tar.gz"
    subprocess.run(["tar", "czf", str(archive), *packed], cwd=tmp_path, check=True)
    url = f"tar://{named}::file://{archive}"
    store = Store(url)
    assert bytes(store.recall(key)[1]) == b"features"
    assert bytes(store.get(store.resolve("data/v1"))) == b"dataset"
    found = store.verify()
    assert found.ok and found.records == 1 and found.names == 1
    assert main(["store", "ls", "--store", url]) == 0
    assert "data/v1" in capsys.readouterr().out


@pytest.mark.parametrize("suffix", [".tgz", ".tar", ".zip"])
def test_an_archive_cut_short_or_of_another_kind_is_a_store_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    """A store in a tar archive compressed under a name fsspec does not read as such
    (`store.tgz`), or in a tar or zip archive cut short (copied while tar or zip still wrote
    it), raised tarfile's ReadError or zipfile's BadZipFile as the store was opened, and
    every command of `somatize store` printed its traceback. It is a StoreError naming the
    URL, saying what to do for a compressed tar, and status 2 on the command line."""
    _packed_store(tmp_path)
    kind = "zip" if suffix == ".zip" else "tar"
    whole = shutil.make_archive(
        str(tmp_path / "packed"), "gztar" if suffix == ".tgz" else kind, tmp_path, "store"
    )
    archive = tmp_path / f"store{suffix}"
    data = Path(whole).read_bytes()
    if suffix == ".tar":  # cut before its last member: tar reads up to a whole header
        with tarfile.open(whole) as tar:
            data = data[: tar.getmembers()[-1].offset - 100]
    archive.write_bytes(data[: len(data) // 2] if suffix == ".zip" else data)
    url = f"{kind}://store::file://{archive}"
    said = rf"cannot open {re.escape(url)} as a store: its archive cannot be read"
    with pytest.raises(StoreError, match=said):
        Store(url)
    assert main(["store", "ls", "--store", url]) == 2
    err = capsys.readouterr().err
    assert "cannot open" in err and "Traceback" not in err
    if suffix == ".tgz":
        assert "tar={'compression': 'gzip'}" in err
        opened = Store.on_bucket(url, tar={"compression": "gzip"})
        assert bytes(opened.recall(key_of("features"))[1]) == b"features"


@pytest.mark.parametrize("named_by", ["AWS_CA_BUNDLE", "verify"])
def test_a_ca_bundle_that_is_no_file_is_said_at_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named_by: str
) -> None:
    """A CA bundle named (by AWS_CA_BUNDLE, or `client_kwargs={"verify": path}`) that is no
    file is a StoreError naming it when the store is opened, not the bucket said unreachable
    after every retry of the first request."""
    bundle = tmp_path / "missing-ca.pem"
    options = s3_options()
    if named_by == "AWS_CA_BUNDLE":
        monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
    else:
        options = {**options, "client_kwargs": {**options["client_kwargs"], "verify": str(bundle)}}
    with pytest.raises(StoreError, match=rf"{named_by}.*{re.escape(str(bundle))}.* no file"):
        Store.on_bucket(s3_url(), **options, skip_instance_cache=True)


def test_a_ca_bundle_its_config_file_names_that_is_no_file_is_said_at_the_first_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CA bundle that the client's config file names, and that is no file, is a
    StoreError at the first request, made once, saying a file the client reads is missing,
    not the bucket said unreachable after every retry."""
    _cli_s3(monkeypatch, tmp_path)
    config = tmp_path / "config"
    config.write_text(f"[default]\nca_bundle = {tmp_path / 'missing-ca.pem'}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    store = Store.on_bucket(s3_url(), backoff=0.0)
    with pytest.raises(StoreError, match="CA bundle") as raised:
        store.have([key_of("any")])
    assert "missing" in str(raised.value) and "unreachable" not in str(raised.value)


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("AWS_PROFILE", "nowhere"),
        ("AWS_CONFIG_FILE", "Unable to parse"),
        ("AWS_RETRY_MODE", "bogus"),
        ("AWS_DEFAULTS_MODE", "bogus"),
    ],
)
def test_a_client_that_cannot_be_made_from_its_settings_is_said_plainly(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    setting: str,
    said: str,
) -> None:
    """An S3 client the environment sets up wrongly (a profile the config file lacks, a
    config file it cannot parse, a setting it takes no such value of) is a StoreError
    saying so, made once, and the command line exits 2 with one line, not a traceback."""
    url = s3_url()
    Store.on_bucket(url, **s3_options()).keep(key_of("kept"), b"an answer", "plain")
    _cli_s3(monkeypatch, tmp_path)
    config = tmp_path / "unparsable-config"
    config.write_text("[default]\nregion = us-east-1\n= no setting\n")
    values = {"AWS_PROFILE": "nowhere", "AWS_CONFIG_FILE": str(config)}
    monkeypatch.setenv(setting, values.get(setting, "bogus"))
    with pytest.raises(StoreError, match=said) as raised:
        Store.on_bucket(url, retries=0).have([key_of("kept")])
    assert "settings" in str(raised.value)
    assert main(["store", "ls", "--store", url]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1


def _old_to(collector: Store) -> None:
    """Makes ``collector``'s gc take every blob in the bucket for one put an hour ago (its
    machine's clock as if it ran an hour behind the server's), so a grace of seconds does
    not spare a blob put a moment ago."""
    collector._clock_ahead = lambda: -3600.0  # type: ignore[attr-defined]


def _keep_held(
    writer: Store, keeps: str, content: bytes
) -> tuple[threading.Thread, threading.Event, list[BaseException]]:
    """Starts a keep of ``content`` through ``writer`` (one answer, or two items packed)
    and returns once it has put its blob and stopped before it publishes its record or
    index: the thread, the event that lets it go on, and what it raised."""
    found, go = threading.Event(), threading.Event()
    raised: list[BaseException] = []
    publishing = "_publish_record" if keeps == "keep" else "_publish_index"
    publish = getattr(writer, publishing)

    def held(*args: Any) -> None:
        found.set()
        assert go.wait(10)
        publish(*args)

    setattr(writer, publishing, held)

    def keep() -> None:
        try:
            if keeps == "keep":
                writer.keep(key_of("answer"), content, "plain")
            else:
                half = len(content) // 2
                items = [(key_of("one"), content[:half]), (key_of("two"), content[half:])]
                writer.keep_many(items, "plain")
        except BaseException as why:
            raised.append(why)

    thread = threading.Thread(target=keep)
    thread.start()
    assert found.wait(10)
    return thread, go, raised


def _racing(url: str, content: bytes, looks_again: bool = True) -> tuple[Store, Store]:
    """A writer and a collector of ``url``, where ``content`` was put by another and is
    referred to by nothing; the collector takes it for old (:func:`_old_to`). A writer that
    does not look again for a blob once it has published stands for one that does not know
    to (an earlier somatize)."""
    Store.on_bucket(url, **s3_options()).put(content)
    writer, collector = Store.on_bucket(url, **s3_options()), Store.on_bucket(url, **s3_options())
    if not looks_again:
        writer._published = lambda claims: None  # type: ignore[attr-defined]
    _old_to(collector)
    return writer, collector


def _go_on_after_the_delete(
    collector: Store, thread: threading.Thread, go: threading.Event, stop: bool
) -> None:
    """Lets the keep ``thread`` stopped by :func:`_keep_held` publish once ``collector``'s gc
    has deleted the blobs, before it reads the records again; with ``stop``, the gc then
    stops there (as one killed)."""
    removing = collector._rm  # type: ignore[attr-defined]

    def rm(what: str, paths: list[str]) -> None:
        removing(what, paths)
        if what == "removing blobs":
            go.set()
            thread.join(10)
            if stop:
                raise KeyboardInterrupt

    collector._rm = rm  # type: ignore[attr-defined]


def _recalled(url: str, keeps: str, content: bytes) -> bytes:
    """What a store opened afresh at ``url`` recalls of the answer ``_keep_held`` kept."""
    fresh = Store.on_bucket(url, **s3_options())
    keys = [key_of("answer")] if keeps == "keep" else [key_of("one"), key_of("two")]
    return b"".join(bytes(fresh.recall(key)[1]) for key in keys)


@pytest.mark.parametrize("keeps", ["keep", "keep_many"])
def test_a_keep_whose_blob_a_gc_removed_after_its_put_found_it_puts_it_again(keeps: str) -> None:
    """A keep whose put found its blob in the bucket (old, referred to by nothing) and so
    did not upload it, while a gc in another process removed that blob and read the
    records before the keep published its record or index, looks for the blob again once
    it has published and uploads it: the answer is recalled, and verify finds it whole. The
    record pointed at nothing (a miss, told as damage by verify)."""
    url = s3_url()
    content = b"an answer whose bytes were put long ago, referred to by nothing"
    writer, collector = _racing(url, content)
    thread, go, raised = _keep_held(writer, keeps, content)
    assert collector.gc(max_bytes=0, grace=5).blobs == 1  # done before the keep publishes
    go.set()
    thread.join(10)
    assert not raised
    assert _recalled(url, keeps, content) == content
    assert Store.on_bucket(url, **s3_options()).verify().ok


@pytest.mark.parametrize("keeps", ["keep", "keep_many"])
def test_a_gc_puts_back_a_blob_a_record_published_after_its_delete_refers_to(keeps: str) -> None:
    """A record or index published between a gc's delete of its blob and the gc's second
    read of the records (by a writer whose put found the blob and did not upload it, and
    that does not look for it again) has its blob put back by that gc from the copy it set
    aside: the answer is recalled, the copy is gone, and the gc says it removed nothing."""
    url = s3_url()
    content = b"an answer whose bytes were put long ago, referred to by nothing"
    writer, collector = _racing(url, content, looks_again=False)
    thread, go, raised = _keep_held(writer, keeps, content)
    _go_on_after_the_delete(collector, thread, go, stop=False)
    assert collector.gc(max_bytes=0, grace=5).blobs == 0
    assert not raised
    assert _recalled(url, keeps, content) == content
    assert not [path for path in objects(collector) if "/tmp/" in path]


def test_a_gc_stopped_before_it_put_a_blob_back_leaves_a_copy_the_next_gc_puts_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gc stopped (killed, failing) between its delete of a blob and its second read of
    the records leaves the copy it set aside in tmp/aside/: a record published meanwhile is
    a miss until the next gc, which puts the blob back from that copy, and the answer is
    recalled again. The copy, no longer needed, goes with it."""
    url = s3_url()
    content = b"an answer whose bytes were put long ago, referred to by nothing"
    writer, collector = _racing(url, content, looks_again=False)
    thread, go, raised = _keep_held(writer, "keep", content)
    _go_on_after_the_delete(collector, thread, go, stop=True)
    with pytest.raises(KeyboardInterrupt):
        collector.gc(max_bytes=0, grace=5)
    assert not raised
    assert [path for path in objects(collector) if "/tmp/aside/" in path]
    with pytest.raises(Missing):
        _recalled(url, "keep", content)
    done = Store.on_bucket(url, **s3_options()).gc(grace=5)
    assert (done.blobs, done.abandoned) == (0, 1)
    assert _recalled(url, "keep", content) == content
    assert Store.on_bucket(url, **s3_options()).verify().ok
    assert not [path for path in objects(collector) if "/tmp/" in path]
    assert _recalled(url, "keep", content) == content


def _stopped_after_its_delete(collector: Store) -> None:
    """Runs a gc of ``collector`` that stops (as one killed) once it has deleted the blobs,
    before it reads the records again and removes its copies."""
    removing = collector._rm  # type: ignore[attr-defined]

    def rm(what: str, paths: list[str]) -> None:
        removing(what, paths)
        if what == "removing blobs":
            raise KeyboardInterrupt

    collector._rm = rm  # type: ignore[attr-defined]
    with pytest.raises(KeyboardInterrupt):
        collector.gc(grace=5)


def test_a_blob_nothing_refers_to_is_not_put_back_from_a_copy_a_stopped_gc_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A blob nothing refers to, removed by a gc stopped before it removed its copy in
    tmp/aside/, stays removed at the gcs after (nothing is uploaded again); the copy is
    kept until it is a day old (it may be a gc's still running), when a gc removes it. It
    was put back at every gc that found it missing and removed at the gc after, for a
    day, and a recall of its record lost meanwhile was still a miss."""
    url = s3_url()
    writer = Store.on_bucket(url, **s3_options())
    writer.keep(key_of("kept"), b"an answer a record refers to", "plain")
    stray = writer.put(b"put long ago, and referred to by nothing")
    collector = Store.on_bucket(url, **s3_options())
    _old_to(collector)
    _stopped_after_its_delete(collector)
    assert not writer.has_blob(stray)
    for _ in range(2):
        done = Store.on_bucket(url, **s3_options()).gc(grace=0)
        assert (done.blobs, done.abandoned) == (0, 0)
        assert not Store.on_bucket(url, **s3_options()).has_blob(stray)
        assert len([path for path in objects(writer) if "/tmp/aside/" in path]) == 1
    monkeypatch.setattr("somatize.store._bucket_upkeep._ASIDE_GRACE", -1.0)
    done = Store.on_bucket(url, **s3_options()).gc(grace=0)
    assert (done.blobs, done.abandoned) == (0, 1)
    assert not [path for path in objects(writer) if "/tmp/" in path]
    assert bytes(Store.on_bucket(url, **s3_options()).recall(key_of("kept"))[1]) == (
        b"an answer a record refers to"
    )


def _bucket_of(kind: str, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A fresh store's URL of ``kind`` (``s3``, ``file``, ``memory``) and its options."""
    if kind == "s3":
        return s3_url(), s3_options()
    if kind == "file":
        return f"file://{tmp_path / 'store'}", {}
    return f"memory://somatize/{uuid.uuid4().hex[:12]}", {}


def _left_aside(store: Store, content: bytes, holds: bytes) -> None:
    """Leaves in ``store``'s tmp/aside/ what a gc stopped after its delete leaves: a copy
    named after the blob of ``content``, holding ``holds``."""
    assert isinstance(store, BucketStore)
    aside = f"{store.root}/tmp/aside"
    store.fs.makedirs(aside, exist_ok=True)
    store.fs.pipe_file(f"{aside}/{key_of_bytes(content)[7:]}.{uuid.uuid4().hex}", holds)


@pytest.mark.parametrize("kind", ["s3", "file", "memory"])
def test_a_copy_left_aside_that_is_not_its_blob_is_not_put_back(kind: str, tmp_path: Path) -> None:
    """A copy in tmp/aside/ whose bytes do not hash to the digest it is named after (cut
    short as a gc was stopped while it copied, or written there by another) is not put
    back as that blob by the next gc: verify finds the store whole, and a keep of the
    blob's true bytes uploads them and is recalled. It was put back unchecked: verify
    reported the blob damaged, and a keep of bytes of the same size took it for theirs
    and was recalled as Corrupt."""
    url, options = _bucket_of(kind, tmp_path)
    store = Store.on_bucket(url, **options)
    store.put(b"what makes the prefix a store")
    content = b"an answer a later keep will want, put back from a copy"
    _left_aside(store, content, b"x" * len(content))
    Store.on_bucket(url, **options).gc(grace=3600)
    fresh = Store.on_bucket(url, **options)
    assert not fresh.has_blob(key_of_bytes(content))
    assert fresh.verify().ok
    fresh.keep(key_of("answer"), content, "plain")
    assert bytes(Store.on_bucket(url, **options).recall(key_of("answer"))[1]) == content


@pytest.mark.parametrize("kind", ["s3", "file", "memory"])
def test_a_copy_left_aside_that_is_its_blob_is_put_back(kind: str, tmp_path: Path) -> None:
    """A copy in tmp/aside/ that hashes to its name is put back where the blob is missing,
    and a record referring to it is recalled."""
    url, options = _bucket_of(kind, tmp_path)
    store = Store.on_bucket(url, **options)
    content = b"an answer whose blob a gc removed before its record was out"
    store.keep(key_of("answer"), content, "plain")
    assert isinstance(store, BucketStore)
    _left_aside(store, content, content)
    store.fs.rm_file(store._blob_path(key_of_bytes(content)))
    Store.on_bucket(url, **options).gc(grace=3600)
    assert bytes(Store.on_bucket(url, **options).recall(key_of("answer"))[1]) == content
    assert Store.on_bucket(url, **options).verify().ok


def test_a_gc_that_may_delete_but_not_write_collects_beside_copies_left_aside() -> None:
    """A gc whose credentials may read and delete but not write, run while a gc stopped
    after its delete has left a copy in tmp/aside/, collects as it did (it cannot put the
    blob back): it failed, refused the put-back, and removed nothing."""
    url = s3_url()
    writer = Store.on_bucket(url, **s3_options())
    strays = [writer.put(f"put, and never bound: {n}".encode()) for n in range(3)]
    content = b"a blob a stopped gc removed, and left a copy of"
    writer.keep(key_of("answer"), content, "plain")  # a record it must be put back for
    assert isinstance(writer, BucketStore)
    _left_aside(writer, content, content)
    writer.fs.rm_file(writer._blob_path(key_of_bytes(content)))
    may_delete = user([*READS, "s3:DeleteObject"])
    time.sleep(2.0)
    with enable_iam_authentication():
        assert Store.on_bucket(url, **may_delete).gc(grace=1).blobs == 3
    assert not any(writer.has_blob(stray) for stray in strays)
    assert not writer.has_blob(key_of_bytes(content))  # not put back: it may not write


def test_a_recall_while_a_gc_on_file_puts_a_blob_back_never_sees_part_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On ``file://``, a gc that puts a blob back (a record published after its delete
    refers to it) copies it into tmp/ and renames it into place, as every write there
    goes: a recall while the copy is half done reads the blob whole, the one the keep
    wrote again. The copy went straight into blobs/, over that blob: the recall read it
    cut short, moved it to quarantine as damaged (Corrupt), and the answer was lost."""
    url = f"file://{tmp_path / 'store'}"
    content = b"an answer whose bytes were put long ago, referred to by nothing" * 64
    Store.on_bucket(url).put(content)
    collector = Store.on_bucket(url)
    _old_to(collector)
    removing = collector._rm  # type: ignore[attr-defined]

    def rm(what: str, paths: list[str]) -> None:
        removing(what, paths)
        if what == "removing blobs":  # a keep after the delete: it writes the blob again
            Store.on_bucket(url).keep(key_of("answer"), content, "plain")

    collector._rm = rm  # type: ignore[attr-defined]
    seen: list[bytes | BaseException] = []

    def copyfile(source: str, target: str, **_: Any) -> str:
        data = Path(source).read_bytes()
        with open(target, "wb") as out:
            out.write(data[: len(data) // 2])
            out.flush()
            reader = Store.on_bucket(url)
            try:  # once the keep is out (not as the gc sets the blob aside)
                if reader.answer(key_of("answer")) is not None:
                    seen.append(bytes(reader.recall(key_of("answer"))[1]))
            except (Corrupt, Missing) as why:
                seen.append(why)
            out.write(data[len(data) // 2 :])
        return target

    monkeypatch.setattr(shutil, "copyfile", copyfile)
    assert collector.gc(max_bytes=0, grace=5).blobs == 0
    monkeypatch.undo()
    assert seen and all(got == content for got in seen)
    assert bytes(Store.on_bucket(url).recall(key_of("answer"))[1]) == content
    assert Store.on_bucket(url).verify().ok


def test_a_gc_on_s3_sets_the_blobs_it_removes_aside_at_once() -> None:
    """A gc on S3 copies the blobs it removes aside in tmp/aside/ (and back) many at once,
    one request each, as it reads: a gc of 10,000 small blobs on the loopback server took
    235 s where it took 15 s before it made copies, one copy (and a look at its size) after
    another."""
    url = s3_url()
    writer = Store.on_bucket(url, **s3_options())
    strays = [writer.put(f"put, and never bound: {n}".encode()) for n in range(6)]
    collector = Store.on_bucket(url, **s3_options())
    assert isinstance(collector, BucketStore)
    fs = collector.fs
    real, at_once, most = fs._copy_basic, [0], [0]

    async def copy_basic(source: str, target: str, **kwargs: Any) -> None:
        at_once[0] += 1
        most[0] = max(most[0], at_once[0])
        try:
            await asyncio.sleep(0.05)  # each copy a round trip still in flight as the next begins
            await real(source, target, **kwargs)
        finally:
            at_once[0] -= 1

    fs._copy_basic = copy_basic
    try:
        assert collector.gc(grace=0).blobs == len(strays)
    finally:
        del fs._copy_basic
    assert most[0] == len(strays)
    assert not any(writer.has_blob(stray) for stray in strays)
    assert not [path for path in objects(collector) if "/tmp/" in path]


def test_a_gc_of_a_prefix_that_is_no_store_puts_nothing_back_from_tmp_aside() -> None:
    """A gc of a prefix that bears no store's marker and holds no store, though it holds a
    file named as a gc's copy in tmp/aside/, is refused before it changes anything there:
    it put the blob back into blobs/ (and marked the prefix a store) before it was."""
    url = s3_url()
    fs = BucketStore(url, **s3_options()).fs
    root = url[len("s3://") :]
    content = b"a user's bytes"
    fs.pipe_file(f"{root}/tmp/aside/{key_of_bytes(content)[7:]}.{uuid.uuid4().hex}", content)
    fs.pipe_file(f"{root}/notes.txt", b"a user's file")
    fs.invalidate_cache()
    before = sorted(fs.find(root))
    with pytest.raises(StoreError, match="it holds no store"):
        Store.on_bucket(url, **s3_options()).gc()
    fs.invalidate_cache()
    assert sorted(fs.find(root)) == before


def test_a_read_only_bucket_names_the_section_a_write_is_refused_in() -> None:
    """A write refused by ``read_only=True`` names the store's section it was for
    (``blobs/``), not the shard folder inside it (``3a/``)."""
    url = f"memory://somatize/{uuid.uuid4().hex[:12]}"
    Store.on_bucket(url).put(b"there")
    store = Store.on_bucket(url, read_only=True)
    with pytest.raises(StoreError, match=r"cannot write blobs/ of memory://"):
        store.put(b"refused")
    with pytest.raises(StoreError, match=r"cannot write blobs/ of memory://"):
        store.keep(f"blake3:{1:064x}", b"refused", "plain")  # its blob is written first
