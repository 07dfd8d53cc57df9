"""The store contract, for every home of the store.

Each implementation in STORES must pass every test here; a new home (another
bucket protocol, another cache in front of one) joins by adding a factory to the
list. The S3 home talks to a real S3-compatible server on loopback.
"""

from __future__ import annotations

import abc
import copy
import itertools
import os
import pickle
import re
import struct
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import blake3
import numpy
import pytest

from somatize import Answer, BadName, Corrupt, Graph, Missing, NameNotFound, Store
from somatize.store import BucketStore, JoinedWrite, LocalStore, records
from somatize.store.base import StoreFull
from tests.conftest_s3 import s3_options, s3_url
from tests.nodes import Square

Factory = Callable[[Path], Store]

STORES: list[tuple[str, Factory]] = [
    ("local", lambda where: Store(where / "local")),
    ("local-durable", lambda where: LocalStore(where / "durable", durable=True)),
    ("memory", lambda where: Store.on_bucket(f"memory://somatize/{uuid.uuid4().hex}")),
    ("file", lambda where: Store.on_bucket(f"file://{where}/file")),
    ("s3", lambda where: Store.on_bucket(s3_url(), **s3_options())),
    (
        "s3-cached",
        lambda where: Store.on_bucket(s3_url(), cache=where / "cache", **s3_options()),
    ),
]


def reopen(home: Store) -> Store:
    """The same store as a fresh process would open it (nothing held in memory)."""
    if isinstance(home, LocalStore):
        return type(home)(home.root, durable=home.durable)
    assert isinstance(home, BucketStore)
    cache = home.cache.root if home.cache is not None else None
    return Store.on_bucket(home.url, cache=cache, **home.storage_options)


def overwrite(home: Store, relative: str, data: bytes) -> None:
    """Replaces the file at ``relative`` (``blobs/ab/<hex>``) behind the store's back,
    in the home and in any cache in front of it."""
    if isinstance(home, LocalStore):
        (home.root / relative).write_bytes(data)
        return
    assert isinstance(home, BucketStore)
    home.fs.pipe_file(f"{home.root}/{relative}", data)
    if home.cache is not None and (home.cache.root / relative).exists():
        (home.cache.root / relative).write_bytes(data)


def read(home: Store, relative: str) -> bytes:
    """The bytes of the file at ``relative`` (``names/sms/train``) in the home."""
    if isinstance(home, LocalStore):
        return (home.root / relative).read_bytes()
    assert isinstance(home, BucketStore)
    return bytes(home.fs.cat_file(f"{home.root}/{relative}"))


def shard(digest: str) -> str:
    return f"{digest[7:9]}/{digest[7:]}"


@pytest.fixture(params=[factory for _, factory in STORES], ids=[name for name, _ in STORES])
def home(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    factory: Factory = request.param
    return factory(tmp_path)


KEY = "blake3:" + "ab" * 32


def test_put_get_roundtrip(home: Store) -> None:
    """A blob comes back as it was put, named by the BLAKE3 of its bytes."""
    digest = home.put(b"hello")
    assert digest == "blake3:ea8f163db38682925e4491c5e58d4bb3506ef8c14eb78a86e908c5624a67200f"
    assert bytes(home.get(digest)) == b"hello"
    assert home.has_blob(digest)


def test_a_store_copied_or_pickled_carries_nothing_it_read(
    home: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that read answers — a pack's blob mapped for a per-row cache, small blobs,
    records and the indexes of its packs held in memory — is pickled (with a model that
    holds it) and copied as the store alone: a mapped blob made both raise `TypeError`, and
    what it held was carried whole, growing the pickle with every answer read. The copy
    reads what it is asked afresh."""
    # A bucket store pickled carries no credentials: the copy reads with this process's.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    # A filesystem an earlier test made with the same options but no credentials in the
    # environment would be handed to the copy again by fsspec: it looked for them then.
    clear = getattr(getattr(home, "fs", None), "clear_instance_cache", None)
    if clear is not None:
        clear()
    keys = [f"blake3:{i:064x}" for i in range(1000)]
    items = {key: key.encode() * 2 for key in keys}  # a pack of 142 KB: mapped as it is read
    home.keep_many(list(items.items()), "plain")
    home.keep(KEY, b"whole", "plain")
    store = reopen(home)
    unread = len(pickle.dumps(store))
    mapped = store.recall_many(keys, borrow=True)
    assert all(bytes(mapped[key][1]) == items[key] for key in keys)  # type: ignore[index]
    assert bytes(store.recall(KEY)[1]) == b"whole"
    pickled = pickle.dumps(store)
    assert len(pickled) < unread + 1000  # what it found out of the packs' versions at most
    for copied in (pickle.loads(pickled), copy.deepcopy(store)):
        got = copied.recall_many(keys, borrow=True)
        assert all(bytes(got[key][1]) == items[key] for key in keys)  # type: ignore[index]
        assert bytes(copied.recall(KEY)[1]) == b"whole"


def test_put_is_idempotent(home: Store) -> None:
    """Putting the same bytes twice gives one digest and changes nothing."""
    assert home.put(b"x" * 100_000) == home.put([b"x" * 50_000, b"x" * 50_000])


def test_bind_and_resolve(home: Store) -> None:
    """A name points at a digest, and rebinding moves it."""
    one, two = home.put(b"one"), home.put(b"two")
    home.bind("sms/train", one)
    assert home.resolve("sms/train") == one
    home.bind("sms/train", two)
    assert home.resolve("sms/train") == two


def test_a_name_with_a_letter_outside_ascii_is_refused_saying_names_are_ascii(
    tmp_path: Path,
) -> None:
    """`données/train` is refused saying names are ASCII: `é` is a letter, so an error
    that says only "letters" leaves whoever bound it guessing what is wrong."""
    store = Store(tmp_path / "store")
    digest = store.put(b"rows")
    with pytest.raises(BadName, match=r"ASCII letters, digits and `\._=\+@-`") as refused:
        store.bind("données/train", digest)
    assert "'données'" in str(refused.value)
    assert not [path for path in (tmp_path / "store").rglob("*") if "donn" in path.name]


def test_a_name_differing_only_in_case_from_a_bound_one_or_its_folder_is_refused(
    home: Store,
) -> None:
    """A name that differs only in case from a bound name, or whose folder differs so from a
    folder of bound names, is refused in every home, naming the store's spelling, and nothing
    is bound: where the filesystem does not tell case apart (macOS, Windows), `data/v2` would
    be written as `Data/v2`, and `Data/V1` over the binding of `Data/v1`."""
    one, two = home.put(b"Data/v1"), home.put(b"data/v2")
    home.bind("Data/v1", one)
    with pytest.raises(BadName, match=r"names are bound under `Data/`.*\(`Data/v2`\)"):
        home.bind("data/v2", two)
    with pytest.raises(BadName, match=r"`Data/v1` is bound, which differs from it only in case"):
        home.bind("Data/V1", two)
    with pytest.raises(BadName, match=r"names are bound under `Data/`, which differs from it only"):
        home.bind("DATA", two)
    with pytest.raises(NameNotFound):
        reopen(home).resolve("data/v2")
    home.bind("Data/v2", two)
    assert (reopen(home).resolve("Data/v1"), reopen(home).resolve("Data/v2")) == (one, two)


def test_a_name_file_copied_over_another_is_refused(home: Store) -> None:
    """The file of one name copied over another's (by hand; or bound for a name differing
    only in case, where the filesystem does not tell case apart) is refused, not followed
    to the other name's digest; the name it was bound for still resolves."""
    trusted, other = home.put(b"trusted"), home.put(b"another name's")
    home.bind("model/prod", trusted)
    home.bind("scratch/other", other)
    overwrite(home, "names/model/prod", read(home, "names/scratch/other"))
    with pytest.raises(Corrupt, match=r"`model/prod` holds another name's binding"):
        reopen(home).resolve("model/prod")
    assert reopen(home).resolve("scratch/other") == other


def test_a_name_file_holds_its_digest_first_as_earlier_readers_read_it(home: Store) -> None:
    """A name's file is its digest, then what ties it to the name after the mark a
    signature follows: a reader that knows only the digest and signatures (an earlier
    somatize, read without a key) takes the part before the mark, and finds the digest."""
    digest = home.put(b"rows")
    home.bind("sms/train", digest)
    data = read(home, "names/sms/train")
    assert data.partition(b"\nmac:")[0] == digest.encode()
    assert data.partition(b"\nmac:")[2].startswith(b"unkeyed:")


def test_a_name_file_holding_its_digest_alone_resolves(home: Store) -> None:
    """A name bound by an earlier somatize without a key, its file the digest alone (a line
    break after it or not), still resolves."""
    digest = home.put(b"rows")
    home.bind("sms/train", digest)
    for old in (digest.encode(), digest.encode() + b"\n"):
        overwrite(home, "names/sms/train", old)
        assert reopen(home).resolve("sms/train") == digest


def test_a_bind_of_bytes_a_gc_removed_since_they_were_put_says_a_gc_may_have(
    home: Store,
) -> None:
    """Bytes put and bound only after a gc removed them (nothing referred to them, and they
    were older than its grace) are refused saying a gc may have removed them since, and to
    put them again: the caller did put them, so "put them first" alone would send them to
    do what they did."""
    digest = home.put(b"a dataset put, bound later")
    home.gc(grace=0)
    with pytest.raises(Missing, match=r"Put them first.*gc.*grace.*put them again"):
        home.bind("sms/train", digest)
    home.bind("sms/train", home.put(b"a dataset put, bound later"))
    assert reopen(home).resolve("sms/train") == digest


def test_a_name_for_a_blob_not_kept_is_refused(home: Store) -> None:
    """Binding a digest no blob is kept under is Missing, saying to put the bytes first, and
    binds nothing: a name never points at nothing from the start."""
    with pytest.raises(Missing, match=r"no blob .* is kept in .*Put them first"):
        home.bind("sms/train", "blake3:" + "cd" * 32)
    with pytest.raises(NameNotFound):
        reopen(home).resolve("sms/train")


@pytest.mark.parametrize("order", ["shorter first", "longer first"])
def test_a_name_cannot_also_hold_names(home: Store, order: str) -> None:
    """`sms/train` and `sms/train/x` are refused together, in every home alike (a name is
    one file), whichever comes first, with a message saying what to do; nothing of the
    refused one is bound, and the other can still be bound again."""
    digest = home.put(b"rows")
    first, second = (
        ("sms/train", "sms/train/x")
        if order == "shorter first"
        else (
            "sms/train/x",
            "sms/train",
        )
    )
    home.bind(first, digest)
    with pytest.raises(BadName, match="cannot also hold names under it"):
        home.bind(second, digest)
    again = reopen(home)
    with pytest.raises(NameNotFound):
        again.resolve(second)
    again.bind(first, digest)
    assert again.resolve(first) == digest
    again.bind("sms/train-x", digest)  # beside it, as the message says


def test_a_name_refused_for_the_names_under_it_is_told_one_that_can_be_bound(
    home: Store,
) -> None:
    """A name refused because names are bound under it is told another it can take (in
    that folder, beside them), never itself again; one refused because it would lie under
    a name is told one beside that name."""
    digest = home.put(b"rows")
    home.bind("sms/train", digest)
    with pytest.raises(BadName, match="cannot also hold names under it") as refused:
        home.bind("sms", digest)
    assert "(`sms`)" not in str(refused.value) and "(`sms/all`)" in str(refused.value)
    home.bind("sms/all", digest)
    with pytest.raises(BadName, match=r"\(`sms/train-x`\)"):
        home.bind("sms/train/x", digest)


def test_names_side_by_side_and_a_folder_of_names(home: Store) -> None:
    """Two names in one folder are both bound; a folder of names resolves to nothing
    (NameNotFound), and a name two levels under a name is refused (BadName)."""
    digest = home.put(b"rows")
    home.bind("sms/train", digest)
    home.bind("sms/test", digest)
    assert home.resolve("sms/test") == home.resolve("sms/train") == digest
    with pytest.raises(NameNotFound):
        home.resolve("sms")
    home.bind("a", digest)
    with pytest.raises(BadName, match="cannot also hold names under it"):
        home.bind("a/b/c", digest)


def test_a_folder_a_quarantine_emptied_of_names_may_be_bound_as_a_name(home: Store) -> None:
    """Damaged names moved aside by verify --quarantine leave no empty folder of names
    behind them, in every home alike: a name is bound at the path of a folder that held
    only them (`data` once `data/v1` is aside, `a` once `a/b/c` is), while a folder still
    holding a name stays, and refuses one at its path."""
    digest = home.put(b"rows")
    for name in ("data/v1", "a/b/c", "keep/v1", "keep/v2"):
        home.bind(name, digest)
    for name in ("data/v1", "a/b/c", "keep/v1"):
        overwrite(home, f"names/{name}", b"garbled")
    found = reopen(home).verify(quarantine=True)
    assert sorted(found.quarantined) == ["names/a/b/c", "names/data/v1", "names/keep/v1"]
    again = reopen(home)
    again.bind("data", digest)
    again.bind("a", digest)
    with pytest.raises(BadName, match="cannot also hold names under it"):
        again.bind("keep", digest)
    fresh = reopen(home)
    assert [fresh.resolve(name) for name in ("data", "a", "keep/v2")] == [digest] * 3
    assert fresh.verify().ok


@pytest.mark.parametrize("kind", ["local", "file"])
def test_a_bind_whose_folder_a_quarantine_removes_as_it_renames_is_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A verify --quarantine elsewhere that moves the last name of `data/` aside removes the
    folder, which may happen just after a bind of `data/v2` made it for its name and before
    it renames the name into it: the bind makes it again, and the name is bound."""
    store = dict(STORES)[kind](tmp_path)
    digest = store.put(b"rows")
    removed: list[str] = []

    def removed_once(folder: str) -> None:
        if folder.rstrip("/").endswith("/names/data") and not removed:
            os.rmdir(folder)  # as the folder's last name is moved aside elsewhere
            removed.append(folder)

    if isinstance(store, LocalStore):
        make_folder = LocalStore._make_folder

        def made(self: LocalStore, folder: str) -> None:
            make_folder(self, folder)
            removed_once(folder)

        monkeypatch.setattr(LocalStore, "_make_folder", made)
    else:
        assert isinstance(store, BucketStore)
        makedirs = store.fs.makedirs

        def made_dirs(path: str, exist_ok: bool = False) -> None:
            makedirs(path, exist_ok=exist_ok)
            removed_once(path)

        monkeypatch.setattr(store.fs, "makedirs", made_dirs)
    store.bind("data/v2", digest)
    assert removed and reopen(store).resolve("data/v2") == digest


@pytest.mark.parametrize("kind", ["local", "file"])
def test_a_name_at_the_path_of_an_empty_folder_of_names_is_refused_leaving_nothing(
    tmp_path: Path, kind: str
) -> None:
    """A name bound where an empty folder of names lies (one made by hand) is refused as a
    folder of names, and nothing of it is left in that folder: no file written for it,
    which verify would report as a damaged name and gc keep every blob for."""
    store = dict(STORES)[kind](tmp_path)
    digest = store.put(b"rows")
    root = store.root if isinstance(store, LocalStore) else Path(cast(BucketStore, store).root)
    (root / "names" / "data").mkdir(parents=True)
    with pytest.raises(BadName, match="cannot also hold names under it"):
        store.bind("data", digest)
    assert not any((root / "names" / "data").iterdir())
    fresh = reopen(store)
    assert fresh.verify().ok
    fresh.bind("data/v1", digest)
    assert reopen(store).resolve("data/v1") == digest


def test_a_name_too_long_for_a_file_is_refused_alike(home: Store) -> None:
    """A name with a segment over 255 bytes, or over 1024 bytes in all, is BadName in
    every home (a file name cannot be longer), saying so; one at the limit is bound."""
    digest = home.put(b"rows")
    for name in ("sms/" + "x" * 256, "/".join(["y" * 200] * 6)):
        with pytest.raises(BadName, match="too long"):
            home.bind(name, digest)
    home.bind("sms/" + "z" * 255, digest)
    assert home.resolve("sms/" + "z" * 255) == digest


def test_put_takes_any_contiguous_buffer(home: Store) -> None:
    """A typed or shaped memoryview (float64 values, a 2-D view) is kept as its bytes."""
    import array

    values = memoryview(array.array("d", [1.0, 2.0, 3.0]))
    digest = home.put(values)
    assert bytes(home.get(digest)) == values.tobytes()
    grid = memoryview(bytearray(range(12))).cast("B", (3, 4))
    assert bytes(home.get(home.put([grid, values]))) == bytes(range(12)) + values.tobytes()


def test_any_buffer_is_one_piece_never_iterated(home: Store) -> None:
    """An object with the buffer protocol that is not bytes (an ``array.array``, an
    ``mmap``) is kept as the one run of bytes it holds, by put, keep and keep_many alike,
    not taken for an iterable of pieces; a buffer that is not contiguous, or a piece that
    is no buffer, is a TypeError saying so."""
    import array
    import mmap

    octets = array.array("B", b"abcdef")
    values = array.array("d", [1.0, 2.0])
    mapped = mmap.mmap(-1, 1 << 20)
    mapped.write(b"z" * (1 << 20))
    for data in (octets, values, mapped):
        digest = home.put(data)  # type: ignore[arg-type]
        assert bytes(home.get(digest)) == bytes(data)
    home.keep(KEY, values, "plain")  # type: ignore[arg-type]
    assert bytes(reopen(home).recall(KEY)[1]) == values.tobytes()
    keys = [f"blake3:{i:064x}" for i in range(2)]
    home.keep_many([(keys[0], octets), (keys[1], values)], "plain")  # type: ignore[list-item]
    fresh = reopen(home)
    assert [bytes(fresh.recall(key)[1]) for key in keys] == [b"abcdef", values.tobytes()]
    strided = memoryview(bytearray(range(12)))[::2]
    with pytest.raises(TypeError, match="not contiguous"):
        home.put(strided)
    with pytest.raises(TypeError, match="got a piece that is a `str`"):
        home.put([b"ab", "cd"])  # type: ignore[list-item]


def test_pieces_of_a_generator_filling_one_buffer_are_kept_as_each_was_handed(
    home: Store,
) -> None:
    """A generator that reads a file into one buffer again for each piece
    (``f.readinto(buf)``, the way to stream a file) hands over views of that buffer:
    put, keep and keep_many keep each piece as it held when it was handed over, not
    what the buffer holds once the generator has ended (the last piece's bytes, over
    and over)."""
    import io

    data = bytes(range(256)) * 40 + b"tail"

    def chunks() -> Iterator[memoryview]:
        source, buffer = io.BytesIO(data), bytearray(1000)
        while count := source.readinto(buffer):
            yield memoryview(buffer)[:count]

    assert bytes(home.get(home.put(chunks()))) == data
    home.keep(KEY, chunks(), "plain")
    other = "blake3:" + "cd" * 32
    home.keep_many([(other, chunks())], "plain")
    fresh = reopen(home)
    assert bytes(fresh.recall(KEY)[1]) == data
    assert bytes(fresh.recall(other)[1]) == data


def test_items_of_a_generator_filling_one_buffer_are_kept_each_under_its_key(
    home: Store,
) -> None:
    """keep_many handed a generator of items that fills one buffer again for each item
    keeps each item as its buffer held when it was handed over: never the last item's
    bytes under every key."""
    keys = [f"blake3:{i:064x}" for i in range(5)]

    def items() -> Iterator[tuple[str, bytearray]]:
        buffer = bytearray(8)
        for index, key in enumerate(keys):
            buffer[:] = f"item {index:03d}".encode()
            yield key, buffer

    home.keep_many(items(), "plain")  # type: ignore[arg-type]
    fresh = reopen(home)
    assert [bytes(fresh.recall(key)[1]) for key in keys] == [
        f"item {index:03d}".encode() for index in range(5)
    ]


def on_disk(where: Path, kind: str) -> Store:
    """A store of ``kind`` kept on this disk: one of STORES, or ``file-cached``, a
    ``file://`` bucket with a cache in front."""
    if kind == "file-cached":
        return Store.on_bucket(f"file://{where}/file", cache=where / "cache")
    return dict(STORES)[kind](where)


@pytest.mark.parametrize("kind", ["local", "local-durable", "file", "file-cached"])
def test_a_generator_streamed_into_a_store_is_never_held_whole(tmp_path: Path, kind: str) -> None:
    """A put, keep or keep_many handed a generator of 64 MiB, 1 MiB at a time over one
    buffer filled again for each piece (streaming a file larger than memory), holds about
    a piece of it in memory at once, never the whole: each piece was copied as it was
    taken, and every copy held until the write began. Each is kept as it was handed over.
    (A `memory://` bucket, and moto's S3 in this process, hold the blob in memory.)"""
    import tracemalloc

    store = on_disk(tmp_path, kind)
    piece, count = 1 << 20, 64
    whole = blake3.blake3()
    for index in range(count):
        whole.update(bytes([index]) * piece)
    digest = "blake3:" + whole.hexdigest()

    def chunks() -> Iterator[memoryview]:
        buffer = bytearray(piece)
        for index in range(count):
            buffer[:] = bytes([index]) * piece
            yield memoryview(buffer)

    other = "blake3:" + "cd" * 32
    tracemalloc.start()
    try:
        assert store.put(chunks()) == digest
        assert store.keep(KEY, chunks(), "plain").value == digest
        store.keep_many((item for item in [(other, chunks())]), "plain")  # type: ignore[misc]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB held at once"
    fresh = reopen(store)
    assert fresh.verify().ok
    assert {fresh.answer(KEY).value, fresh.answer(other).value} == {digest}  # type: ignore[union-attr]
    assert len(fresh.get(digest)) == piece * count


@pytest.mark.parametrize("kind", ["local", "local-durable"])
def test_a_generator_kept_in_a_local_store_is_written_once(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put, keep or keep_many handed a generator of more than a MiB, over one buffer
    filled again for each piece, writes its bytes once, straight into `tmp/`, and renames
    the file to its digest's name: no file holds them first (they were written to one,
    then again to the blob). Each is kept as it was handed over, named by the digest of
    its bytes, and `tmp/` is left empty."""
    store = on_disk(tmp_path, kind)
    assert isinstance(store, LocalStore)

    def no_spill() -> None:
        raise AssertionError("the bytes were held in a file before the blob was written")

    monkeypatch.setattr(store, "_spill_file", no_spill)
    piece, count = (1 << 20) + 7, 3
    data = b"".join(bytes([index]) * piece for index in range(count))
    digest = "blake3:" + blake3.blake3(data).hexdigest()

    def chunks() -> Iterator[bytearray]:
        buffer = bytearray(piece)
        for index in range(count):
            buffer[:] = bytes([index]) * piece
            yield buffer

    other = "blake3:" + "cd" * 32
    assert store.put(chunks()) == digest
    assert store.keep(KEY, chunks(), "plain").size == len(data)
    store.keep_many((item for item in [(other, chunks())]), "plain")  # type: ignore[misc]
    fresh = reopen(store)
    assert fresh.verify().ok
    assert {fresh.answer(KEY).value, fresh.answer(other).value} == {digest}  # type: ignore[union-attr]
    assert bytes(fresh.get(digest)) == data
    assert os.listdir(store.root / "tmp") == []


def test_a_generator_that_raises_as_it_streams_leaves_nothing_in_a_local_store(
    tmp_path: Path,
) -> None:
    """A generator that raises after handing a local store more than a MiB is raised as it
    was, and leaves neither a blob nor a file in `tmp/`."""
    store = Store(tmp_path / "store")

    def chunks() -> Iterator[bytes]:
        yield b"a" * (1 << 20)
        yield b"b" * (1 << 20)
        raise RuntimeError("the file was cut short")

    with pytest.raises(RuntimeError, match="cut short"):
        store.put(chunks())
    with pytest.raises(RuntimeError, match="cut short"):
        store.keep(KEY, chunks(), "plain")
    assert os.listdir(tmp_path / "store" / "tmp") == []
    assert [p for p in (tmp_path / "store" / "blobs").rglob("*") if p.is_file()] == []
    assert store.answer(KEY) is None


def test_an_os_error_of_a_streaming_generator_is_raised_as_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OSError a generator raises after handing a local store more than a MiB (the file
    it reads is unreadable or gone) reaches the caller as it was raised, not as the store's
    failed write ('the store is read-only'); a write of the store that fails is still told
    as one, and neither leaves anything in `tmp/`."""
    store = Store(tmp_path / "store")

    def chunks(why: OSError) -> Iterator[bytes]:
        yield b"a" * (1 << 20)
        yield b"b" * (1 << 20)
        raise why

    denied = PermissionError(13, "Permission denied", "/data/input.bin")
    with pytest.raises(PermissionError) as raised:
        store.put(chunks(denied))
    assert raised.value is denied
    with pytest.raises(FileNotFoundError, match=r"input\.bin"):
        store.keep(KEY, chunks(FileNotFoundError(2, "No such file", "/data/input.bin")), "plain")
    with pytest.raises(PermissionError) as raised:
        store.keep_many(((k, chunks(denied)) for k in [KEY]), "plain")  # type: ignore[misc]
    assert raised.value is denied
    assert os.listdir(tmp_path / "store" / "tmp") == []
    if not os.path.exists("/dev/full"):
        return
    monkeypatch.setattr(store, "_created", lambda temporary: open("/dev/full", "wb"))  # noqa: SIM115
    with pytest.raises(StoreFull, match="no space left"):
        store.put(chunks(denied))
    assert os.listdir(tmp_path / "store" / "tmp") == []
    assert store.answer(KEY) is None


def test_small_items_of_a_generator_are_kept_a_pack_at_a_time(
    home: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """keep_many handed a generator of many small items holds them only until they fill a
    pack, which is kept before the next item is asked for: what is held stays bounded
    however many items there are (all were held until the generator ended). Each is kept
    under its key, in packs."""
    monkeypatch.setattr("somatize.store.records.PACK_BYTES", 16 << 10)
    keys = [f"blake3:{i:064x}" for i in range(40)]
    seen: list[set[str]] = []

    def items() -> Iterator[tuple[str, bytearray]]:
        buffer = bytearray(1 << 10)
        for index, key in enumerate(keys):
            if index == 30:
                seen.append(home.have(keys[:16]))
            buffer[:] = bytes([index]) * len(buffer)
            yield key, buffer

    answers = home.keep_many(items(), "plain")  # type: ignore[arg-type]
    assert seen == [set(keys[:16])]
    assert [a.key for a in answers] == keys
    assert len({a.value for a in answers}) == 3
    fresh = reopen(home)
    got = fresh.recall_many(keys)
    assert [bytes(got[key][1]) for key in keys] == [bytes([i]) * (1 << 10) for i in range(40)]


@pytest.mark.parametrize("fails", ["bad key", "generator", "pieces"])
def test_items_a_generator_handed_before_it_failed_are_kept(home: Store, fails: str) -> None:
    """keep_many handed a generator keeps the items it handed before a key that is no
    digest, or before it (or an item's own pieces) raised, as its docs say: those held for a
    pack were dropped, while an item of a MiB or more before them was kept. The failure is
    raised as it was."""
    keys = [f"blake3:{i:064x}" for i in range(4)]

    def pieces() -> Iterator[bytes]:
        yield b"p" * (1 << 20)
        raise RuntimeError("the file was cut short")

    def items() -> Iterator[tuple[str, Any]]:
        yield keys[0], b"a" * (2 << 20)  # kept on its own
        for key in keys[1:]:
            yield key, bytearray(key[-1].encode()) * 100
        if fails == "bad key":
            yield "not a digest", b"x"
        elif fails == "pieces":
            yield "blake3:" + "ef" * 32, pieces()
        raise RuntimeError("the file was cut short")

    with pytest.raises(BadName if fails == "bad key" else RuntimeError):
        home.keep_many(items(), "plain")  # type: ignore[arg-type]
    fresh = reopen(home)
    assert fresh.have(keys) == set(keys)
    assert [bytes(fresh.recall(key)[1]) for key in keys[1:]] == [b"1" * 100, b"2" * 100, b"3" * 100]
    assert fresh.answer("blake3:" + "ef" * 32) is None


@pytest.mark.parametrize("kind", ["local", "file", "file-cached"])
def test_a_generator_of_many_large_items_holds_one_file_open(tmp_path: Path, kind: str) -> None:
    """keep_many handed a generator of items of more than a MiB each holds what it streams
    in one file, open once: not a file (and a descriptor) per item, which ran a process
    allowed 1,024 open files out of them at the thousandth item (Too many open files)."""
    import resource

    store = on_disk(tmp_path, kind)
    keys = [f"blake3:{i:064x}" for i in range(40)]

    def items() -> Iterator[tuple[str, bytearray]]:
        for index, key in enumerate(keys):
            yield key, bytearray([index]) * ((1 << 20) + 16)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 24, hard))
    try:
        store.keep_many(items(), "plain")  # type: ignore[arg-type]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    fresh = reopen(store)
    assert [bytes(fresh.recall(key)[1][:1]) for key in keys] == [bytes([i]) for i in range(40)]
    assert all(len(fresh.recall(key)[1]) == (1 << 20) + 16 for key in keys)


def test_a_buffer_of_object_references_is_refused(home: Store) -> None:
    """A buffer whose items are references to Python objects (a numpy array of dtype
    object, a ctypes array of ``py_object``) holds addresses in this process, not the
    values: put, keep and keep_many of it, whole or as a piece, are a TypeError saying
    so, and nothing is kept (the addresses would be recalled for the values)."""
    import ctypes

    references = (ctypes.py_object * 2)(1, "a")
    for data in (references, [b"ab", references]):
        with pytest.raises(TypeError, match="references to Python objects"):
            home.put(data)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="references to Python objects"):
            home.keep(KEY, data, "plain")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="references to Python objects"):
            home.keep_many([(KEY, data)], "plain")  # type: ignore[list-item]
    assert reopen(home).have([KEY]) == set()


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (None, "got a `NoneType`"),
        (5, "got a `int`"),
        ("text", r"text\.encode\(\)"),
        ({b"a": b"b"}, "as a list or tuple"),
        ({b"a", b"b"}, "as a list or tuple"),
    ],
    ids=["none", "int", "str", "dict", "set"],
)
def test_what_is_no_bytes_nor_pieces_is_refused_saying_what_to_pass(
    home: Store, data: object, said: str
) -> None:
    """put and keep of what is neither bytes nor a sequence of pieces (None, a number, a
    str, a dict or set, whose order is no order of bytes) are a TypeError saying what to
    pass, and nothing is kept."""
    with pytest.raises(TypeError, match=said):
        home.put(data)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=said):
        home.keep(KEY, data, "plain")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=said):
        home.keep_many([(KEY, data)], "plain")  # type: ignore[list-item]
    assert reopen(home).have([KEY]) == set()


def _released() -> memoryview:
    view = memoryview(b"gone")
    view.release()
    return view


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(lambda: numpy.array(["2020-01-01"], "datetime64[ns]"), id="numpy-times"),
        pytest.param(lambda: [b"ab", numpy.array([1], "timedelta64[s]")], id="numpy-times-piece"),
        pytest.param(_released, id="released-memoryview"),
        pytest.param(lambda: [b"ab", _released()], id="released-memoryview-piece"),
    ],
)
def test_a_buffer_that_hands_over_no_bytes_is_refused_saying_what_to_pass(
    home: Store, data: Callable[[], object]
) -> None:
    """put and keep of a buffer that will not hand over its bytes (a numpy array of times,
    a released memoryview), alone or as a piece, are a TypeError saying what to pass, and
    nothing is kept."""
    said = r"hands over no bytes .*array\.view\('int64'\)"
    with pytest.raises(TypeError, match=said):
        home.put(data())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=said):
        home.keep(KEY, data(), "plain")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=said):
        home.keep_many([(KEY, data())], "plain")  # type: ignore[list-item]
    assert reopen(home).have([KEY]) == set()


def test_have_of_one_key_not_in_a_list_says_so(home: Store) -> None:
    """have() takes keys; a single key string passed bare is a TypeError saying to wrap
    it, not a complaint about its characters, and None one saying what it takes, not
    Python's `'NoneType' object is not iterable`; so does recall_many, which took each
    character of a key for a key and answered a BadName for each."""
    with pytest.raises(TypeError, match=r"have\(\[key\]\)"):
        home.have(KEY)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"have\(\) takes an iterable of keys .*`NoneType`"):
        home.have(None)  # type: ignore[arg-type]
    home.keep(KEY, b"answer", "plain")
    with pytest.raises(TypeError, match=r"recall_many\(\[key\]\)"):
        home.recall_many(KEY)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"recall_many\(\) takes an iterable .*`NoneType`"):
        home.recall_many(None)  # type: ignore[arg-type]
    assert bytes(home.recall_many([KEY])[KEY][1]) == b"answer"  # type: ignore[index]


@pytest.mark.parametrize("count", [1, 40])
def test_have_refuses_a_key_that_is_not_a_digest(home: Store, count: int) -> None:
    """A key that is not a digest is BadName from have(), however many keys are asked (a
    bucket answers many from one listing, by name)."""
    with pytest.raises(BadName, match="is not a digest"):
        home.have([KEY] + ["blake3:" + "AB" * 32] * count)


def test_unknown_name(home: Store) -> None:
    """Resolving a name nobody bound says how to bind it."""
    with pytest.raises(NameNotFound, match="nothing is bound to `sms/test`"):
        home.resolve("sms/test")


@pytest.mark.parametrize(
    "name", ["", "/etc/passwd", "../up", "a/../b", "a//b", ".hidden", "a b", "tab\there", "x\x00"]
)
def test_bad_names_refused(home: Store, name: str) -> None:
    """Names that could escape the store or hide in it are refused."""
    digest = home.put(b"x")
    with pytest.raises(BadName):
        home.bind(name, digest)


@pytest.mark.parametrize("name", ["con", "data/NUL", "aux.json", "sms/Com1.tar.gz", "lpt9/train"])
def test_a_name_windows_keeps_for_a_device_is_refused_and_bound_otherwise(
    home: Store, name: str
) -> None:
    """A name with a segment Windows keeps for a device (`con`, `nul.txt`, `LPT1`, any
    case) is refused, saying what to do, since a store moves between homes and no such
    file is made on Windows; a name merely beginning so (`console`, `com10`) binds."""
    digest = home.put(b"rows")
    with pytest.raises(BadName, match="Windows keeps for a device"):
        home.bind(name, digest)
    with pytest.raises(NameNotFound):
        home.resolve(name)
    for fine in ("console", "nulls/com10", "lpt", "aux-data"):
        home.bind(fine, digest)
        assert home.resolve(fine) == digest


def test_bad_digest_refused(home: Store) -> None:
    """A digest that is not blake3:<64 hex> is refused before any path is built."""
    with pytest.raises(BadName, match="is not a digest"):
        home.get("blake3:../../etc")


def test_keep_recall_have(home: Store) -> None:
    """A kept answer is had and recalled with its record."""
    assert home.have([KEY]) == set()
    answer = home.keep(KEY, [b"ab", b"cd"], "plain", "sha256:f")
    assert (answer.size, answer.codec, answer.fingerprint) == (4, "plain", "sha256:f")
    assert home.have([KEY, "blake3:" + "cd" * 32]) == {KEY}
    record, data = home.recall(KEY)
    assert bytes(data) == b"abcd" and record.value == answer.value


def test_a_blob_held_in_memory_is_had_as_recall_finds_it(tmp_path: Path) -> None:
    """A small answer this store has read is recalled from memory; `have` says what
    recall would do: had, even once its file is gone, and the bytes are the kept ones. A
    store that holds nothing sees the file gone."""
    home = LocalStore(tmp_path)
    answer = home.keep(KEY, b"abcd", "plain")
    assert bytes(home.recall(KEY)[1]) == b"abcd"
    (tmp_path / "blobs" / shard(answer.value)).unlink()
    assert home.have([KEY]) == {KEY}
    assert bytes(home.recall(KEY)[1]) == b"abcd"
    assert LocalStore(tmp_path).have([KEY]) == set()


@pytest.mark.parametrize("size", [1000, 256 * 1024], ids=["held", "mapped"])
def test_what_a_read_hands_out_is_the_callers_own(home: Store, size: int) -> None:
    """Writing into a recalled value (as a tensor written in place does) changes that value
    only: a later recall, or a read of the blob, returns the bytes kept."""
    data = bytes(range(256)) * (size // 256)
    answer = home.keep(KEY, data, "plain")
    for _ in range(2):  # the first read fills what the store holds; the second reads it
        written = home.recall(KEY)[1]
        written[:4] = b"\xff\xff\xff\xff"
        assert bytes(home.recall(KEY)[1]) == data
        assert bytes(home.get(answer.value)) == data


class _ChangingAsHashed:
    """A BLAKE3 hasher that, each time it has read some bytes, changes every 4096th byte
    of ``changed`` (adds one to it): a buffer another thread writes into while it is kept."""

    changed = bytearray()
    first_changed = threading.Event()

    def __init__(self, data: Any = b"", **options: Any) -> None:
        self._hasher = _real_blake3(**options)
        if len(data):
            self.update(data)

    def update(self, data: Any) -> _ChangingAsHashed:
        self._hasher.update(data)
        changed = self.changed
        for at in range(0, len(changed), 4096):
            changed[at] = (changed[at] + 1) % 256
        self.first_changed.set()
        return self

    def hexdigest(self) -> str:
        return str(self._hasher.hexdigest())


_real_blake3 = blake3.blake3


def _late(created: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    """``created`` (a local store's file in ``tmp/``) whose first write waits for the
    buffer to have changed once it was hashed, as a blob hashed on another thread while it
    is written would see it; the wait is bounded, for a store that hashes nothing first."""

    def late_created(store: Any, temporary: str) -> Any:
        out = created(store, temporary)
        write = out.write

        def late_write(data: Any) -> int:
            _ChangingAsHashed.first_changed.wait(10)
            return int(write(data))

        out.write = late_write
        return out

    return late_created


@pytest.mark.parametrize("size", [1000, 17 << 20], ids=["small", "large"])
@pytest.mark.parametrize("how", ["put", "keep", "keep_many", "view"])
def test_a_buffer_changed_while_it_is_kept_is_kept_as_its_digest_names(
    home: Store, monkeypatch: pytest.MonkeyPatch, size: int, how: str
) -> None:
    """A bytearray (or a view of one) that changes while it is put or kept, written into by
    another thread, is kept as bytes that hash to the digest it is kept under: the store
    that kept it hands back those bytes, and a fresh one finds them whole."""
    from somatize.store import _packed

    buffer = bytearray(range(256)) * (size // 256)
    data: Any = memoryview(buffer) if how == "view" else buffer
    keys = [f"blake3:{i:064x}" for i in range(3)]
    with monkeypatch.context() as patched:
        patched.setattr(_ChangingAsHashed, "changed", buffer)
        patched.setattr(_ChangingAsHashed, "first_changed", threading.Event())
        if isinstance(home, LocalStore):  # its first write waits for a hash to change it
            patched.setattr(LocalStore, "_created", _late(LocalStore._created))
        patched.setattr(_packed, "blake3", SimpleNamespace(blake3=_ChangingAsHashed))
        if how == "put":
            digest = home.put(data)
        elif how == "keep_many":  # small items packed together, a large one on its own
            answers = home.keep_many([(keys[0], data), (keys[1], b"x" * 10)], "plain")
            digest = answers[0].value
        else:
            digest = home.keep(KEY, data, "plain").value
    assert buffer != bytearray(range(256)) * (size // 256)  # it did change as it was hashed
    kept = bytes(home.get(digest))
    assert "blake3:" + blake3.blake3(kept).hexdigest() == digest
    assert bytes(reopen(home).get(digest)) == kept
    if how == "keep_many":
        assert bytes(home.recall(keys[0])[1]) == bytes(reopen(home).recall(keys[0])[1])
    elif how != "put":
        assert bytes(home.recall(KEY)[1]) == kept == bytes(reopen(home).recall(KEY)[1])


def test_recall_missing(home: Store) -> None:
    """Recalling what was never kept is Missing."""
    with pytest.raises(Missing):
        home.recall(KEY)


def test_large_blob_roundtrip(home: Store) -> None:
    """A blob above the memory-map threshold comes back intact."""
    data = bytes(range(256)) * 4096
    digest = home.put(data)
    assert bytes(home.get(digest)) == data


def test_truncated_blob_is_never_returned(home: Store) -> None:
    """An answer whose blob lost bytes is not recalled short: recalling it is Corrupt."""
    answer = home.keep(KEY, b"x" * 1000, "plain")
    overwrite(home, f"blobs/{shard(answer.value)}", b"x" * 10)
    fresh = reopen(home)
    if isinstance(fresh, LocalStore):
        assert fresh.have([KEY]) == set()
    with pytest.raises(Corrupt, match="holds 10 bytes"):
        fresh.recall(KEY)


def test_flipped_blob_is_never_returned(home: Store) -> None:
    """A blob whose bytes changed (same size) is caught by its digest before first use."""
    answer = home.keep(KEY, b"abcdef" * 100, "plain")
    overwrite(home, f"blobs/{shard(answer.value)}", b"abcdeF" + b"abcdef" * 99)
    with pytest.raises(Corrupt, match="hashes to"):
        reopen(home).recall(KEY)


def test_a_damaged_blob_is_written_afresh_by_a_recompute(home: Store) -> None:
    """A blob damaged in place (same size) is moved aside when a read catches it, so the
    recompute that follows writes it afresh and a fresh reader recalls it whole."""
    answer = home.keep(KEY, b"abcdef" * 100, "plain")
    overwrite(home, f"blobs/{shard(answer.value)}", b"abcdeF" + b"abcdef" * 99)
    reader = reopen(home)
    with pytest.raises(Corrupt, match="hashes to"):
        reader.recall(KEY)
    reader.keep(KEY, b"abcdef" * 100, "plain")
    assert bytes(reopen(home).recall(KEY)[1]) == b"abcdef" * 100


@pytest.mark.parametrize("damage", ["cut short", "no size", "nested deep"])
def test_damaged_record_is_not_had(home: Store, damage: str) -> None:
    """An answer record that cannot be read is not had, and recalling it is Corrupt: one
    cut short, one whole but for a size no count can be (``1e999``, which crashed reading
    it), one nested deeper than a parser follows."""
    answer = home.keep(KEY, b"abc", "plain")
    whole = f'{{"somatize": 1, "key": "{KEY}", "value": "{answer.value}", "codec": "plain"'
    record = {
        "cut short": b'{"somatize": 1, "key": ',
        "no size": f'{whole}, "bytes": 1e999}}'.encode(),
        "nested deep": b"[" * 100_000 + b"]" * 100_000,
    }[damage]
    overwrite(home, f"answers/{shard(KEY)}", record)
    assert reopen(home).have([KEY]) == set()
    with pytest.raises(Corrupt, match="cannot be read"):
        reopen(home).recall(KEY)


def test_have_is_one_batch_over_many(home: Store) -> None:
    """have() over many keys, some kept whole and some packed, says yes for exactly those."""
    whole = [f"blake3:{i:064x}" for i in range(40)]
    items = [f"blake3:{i + 1000:064x}" for i in range(60)]
    for key in whole[:20]:
        home.keep(key, key.encode(), "plain")
    home.keep_many([(key, [key.encode()]) for key in items[:30]], "plain")
    fresh = reopen(home)
    assert fresh.have(whole + items) == set(whole[:20] + items[:30])


def test_packed_items_recall(home: Store) -> None:
    """Items kept together come back one by one and all at once, each with its own bytes."""
    items = [(f"blake3:{i:064x}", [b"item", str(i).encode()]) for i in range(50)]
    answers = home.keep_many(items, "plain", "fp")
    assert [a.key for a in answers] == [key for key, _ in items]
    assert len({a.value for a in answers}) == 1  # one blob for all of them
    fresh = reopen(home)
    got = fresh.recall_many([key for key, _ in items] + [KEY])
    assert isinstance(got[KEY], Missing)
    for index, (key, _) in enumerate(items):
        answer, data = got[key]  # type: ignore[misc]
        assert bytes(data) == f"item{index}".encode() and answer.fingerprint == "fp"
    assert bytes(fresh.recall(items[7][0])[1]) == b"item7"


def test_packed_answers_are_the_records_as_made_field_by_field(home: Store) -> None:
    """The answers keep_many hands back for packed items, and those a store opened afresh
    reads, are each the record its ``Answer(...)`` makes: every field, equality and hash."""
    items = [(f"blake3:{i:064x}", [b"item", str(i).encode()]) for i in range(20)]
    answers = home.keep_many(items, "plain", "fp")
    fresh = reopen(home)
    offset = 0
    for (key, pieces), answer in zip(items, answers, strict=True):
        size = sum(len(piece) for piece in pieces)
        made = Answer(key, answer.value, "plain", size, "fp", answer.created, offset)
        for found in (answer, fresh.answer(key)):
            assert found is not None and vars(found) == vars(made)
            assert found == made and hash(found) == hash(made)
        offset += size


def test_keep_many_refuses_a_bad_key_before_it_keeps_any_item(home: Store) -> None:
    """A key that is not a digest, wherever it is among the items, is refused before any
    item is kept: a large item before it (kept on its own) and the small ones alike."""
    large = "blake3:" + "1" * 64
    small = [f"blake3:{i:064x}" for i in range(2, 40)]
    bad = "blake3:" + "AB" * 32
    items = [(large, bytes(1 << 20))] + [(key, b"item") for key in small] + [(bad, b"x")]
    with pytest.raises(BadName, match=re.escape(repr(bad))):
        home.keep_many(items, "plain")
    assert reopen(home).have([large, *small]) == set()


_GOOD = "blake3:" + "0f" * 32


@pytest.mark.parametrize(
    "bad",
    [
        "blake3:" + "0F" * 32,  # uppercase
        _GOOD[:-1],
        _GOOD + "0",
        _GOOD + "\n" + _GOOD,  # two run together (and an empty key after, see below)
        "",
        _GOOD[:-1] + "\u00e9",
        _GOOD[:-1] + ":",
        _GOOD[:-1] + " ",
        "blake2:" + "0f" * 32,
        "blake3:" + "0f" * 28 + "blake3:",
        b"blake3:" + b"0f" * 32,
    ],
)
def test_keep_many_refuses_each_key_that_is_not_a_digest(tmp_path: Path, bad: object) -> None:
    """Among many good keys, one that is not ``blake3:`` and 64 lowercase hex digits is
    BadName naming it, however it is malformed: keys of a pack are checked all at once."""
    keys: list[object] = [f"blake3:{i:064x}" for i in range(40)]
    keys[17] = bad
    if isinstance(bad, str) and "\n" in bad:
        keys[30] = ""  # so that the keys, joined, are as long as 40 good ones
    items = [(key, b"item") for key in keys]
    with pytest.raises(BadName, match=re.escape(repr(bad))):
        Store(tmp_path / "store").keep_many(items, "plain")  # type: ignore[arg-type]


def test_a_pack_index_is_its_header_and_a_fixed_entry_per_item(tmp_path: Path) -> None:
    """A pack's index is its header line, then for each item in the order kept (a key kept
    twice, twice) its key's 32 bytes and its offset and length, 8 big-endian bytes each; its
    name is the BLAKE3 of its bytes."""
    store = LocalStore(tmp_path / "store")
    keys = [f"blake3:{i * 7919:064x}" for i in range(30)] + ["blake3:" + "0" * 64]  # 0th again
    values = [b"v" * (i % 5 + 1) for i in range(len(keys))]
    store.keep_many(list(zip(keys, values, strict=True)), "plain", "fp")
    (index,) = (tmp_path / "store" / "packs").iterdir()
    data = index.read_bytes()
    assert index.name == blake3.blake3(data).hexdigest()
    header, _, table = data.partition(b"\n")
    assert b'"count":31' in header
    offsets = [sum(len(value) for value in values[:at]) for at in range(len(keys))]
    assert table == b"".join(
        struct.pack(">32sQQ", bytes.fromhex(key[7:]), offset, len(value))
        for key, offset, value in zip(keys, offsets, values, strict=True)
    )


def test_keep_many_takes_iterators_of_items_and_of_pieces(home: Store) -> None:
    """Items given by a generator, each with its pieces given by a generator (alone,
    packed, or large enough to be kept on its own), are kept with all their bytes."""

    def pieces(i: int) -> Iterator[bytes]:
        return (piece for piece in [f"item {i} ".encode(), b"payload" * (1 + (i == 3) * 200_000)])

    keys = [f"blake3:{i:064x}" for i in range(4)]
    answers = home.keep_many(((keys[0], pieces(0)) for _ in [0]), "plain")
    answers += home.keep_many(((key, pieces(i)) for i, key in enumerate(keys) if i), "plain")
    assert [answer.key for answer in answers] == keys
    fresh = reopen(home)
    for i, key in enumerate(keys):
        assert bytes(fresh.recall(key)[1]) == b"".join(pieces(i))


def _joined(count: int, large: int | None = None) -> tuple[list[str], list[bytes], list[int]]:
    """Keys, the pieces and the lengths of ``count`` items of 0 to 9 bytes given end to end
    (the item at ``large`` of 1 MiB and 3 bytes), cut into pieces at other places than
    where items begin: a piece ends inside one item, one piece holds several."""
    values = [bytes([65 + i % 26]) * (i % 10) for i in range(count)]
    if large is not None:
        values[large] = b"L" * ((1 << 20) + 3)
    whole = b"".join(values)
    cuts = [0, 7, 8, len(whole) // 2 + 1, len(whole)]
    pieces = [whole[a:b] for a, b in itertools.pairwise(cuts)]
    keys = [f"blake3:{i + 5000:064x}" for i in range(count)]
    return keys, pieces, [len(value) for value in values]


@pytest.mark.parametrize("large", [None, 33], ids=["packed", "one kept on its own"])
def test_items_kept_joined_are_recalled_each_with_its_own_bytes(
    home: Store, large: int | None
) -> None:
    """keep_joined keeps the items whose bytes lie end to end, across pieces cut anywhere,
    as keep_many keeps them: small ones in one pack, one of 1 MiB or more on its own, and
    each recalled with its own bytes (an empty one too) by a store opened afresh."""
    keys, pieces, lengths = _joined(60, large)
    home.keep_joined(keys, pieces, lengths, "plain", "fp")
    whole = b"".join(pieces)
    fresh = reopen(home)
    got = fresh.recall_many(keys)
    offsets = [sum(lengths[:at]) for at in range(len(keys))]
    for key, offset, length in zip(keys, offsets, lengths, strict=True):
        answer, data = got[key]  # type: ignore[misc]
        assert bytes(data) == whole[offset : offset + length]
        assert (answer.codec, answer.fingerprint, answer.size) == ("plain", "fp", length)
    blobs = {fresh.answer(key).value for key in keys}  # type: ignore[union-attr]
    assert len(blobs) == (1 if large is None else 2)


def test_items_kept_joined_fill_packs_of_pack_bytes(
    home: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items given end to end are cut into packs where a pack's bytes would pass
    ``PACK_BYTES`` (an item left alone kept on its own), as keep_many cuts them."""
    monkeypatch.setattr(records, "PACK_BYTES", 20)
    keys, pieces, lengths = _joined(40)
    home.keep_joined(keys, b"".join(pieces), lengths, "plain")
    apart = [f"blake3:{i + 9000:064x}" for i in range(40)]
    values = [b"".join(pieces)[sum(lengths[:at]) :][:length] for at, length in enumerate(lengths)]
    home.keep_many(list(zip(apart, values, strict=True)), "plain")
    _laid_out_alike(home, keys, apart)


def _laid_out_alike(home: Store, keys: list[str], apart: list[str]) -> None:
    """Asserts that a store opened afresh finds the items under ``keys`` where it finds the
    same bytes kept another way under ``apart``: in the same blobs at the same offsets,
    cut into more than five packs."""
    fresh = reopen(home)
    found = [fresh.answer(key) for key in keys]
    other = [fresh.answer(key) for key in apart]
    assert [(a.value, a.offset, a.size) for a in found] == [  # type: ignore[union-attr]
        (a.value, a.offset, a.size)
        for a in other  # type: ignore[union-attr]
    ]
    assert len({a.value for a in found}) > 5  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ("one byte short", ValueError, "add up to 135 bytes; the data holds 134"),
        ("a length too few", ValueError, "30 keys for 29 item lengths"),
        ("a negative length", ValueError, "a count of bytes, got -1"),
        ("a length that is no int", TypeError, "ints from 0"),
        ("a bad key", BadName, "is not a digest"),
    ],
)
def test_keep_joined_refuses_items_that_do_not_add_up_keeping_none(
    home: Store, change: str, error: type[Exception], match: str
) -> None:
    """Lengths that do not add up to the data's bytes, one missing, negative or no int, or
    a key that is no digest: refused before any item is kept, by a home that packs items
    and by the default that hands them to keep_many alike."""
    keys, pieces, lengths = _joined(30)
    data: list[Any] = list(pieces)
    sizes: list[Any] = list(lengths)
    if change == "one byte short":
        data[-1] = data[-1][:-1]
    elif change == "a length too few":
        sizes.pop()
    elif change == "a negative length":
        sizes[3:5] = [-1, sizes[3] + sizes[4] + 1]
    elif change == "a length that is no int":
        sizes[2] = 2.0
    else:
        keys[20] = keys[20].upper()
    for keep in (home.keep_joined, lambda *args: Store.keep_joined(home, *args)):
        with pytest.raises(error, match=match):
            keep(keys, data, sizes, "plain")
    assert reopen(home).have([key.lower() for key in keys]) == set()


def test_the_default_keep_joined_hands_keep_many_the_items(home: Store) -> None:
    """Store's own keep_joined, which a home that does not pack keeps, gives keep_many each
    item as its pieces, cut where the items begin and end."""
    keys, pieces, lengths = _joined(25, large=4)
    Store.keep_joined(home, keys, pieces, lengths, "plain", "fp")
    whole = b"".join(pieces)
    fresh = reopen(home)
    for at, key in enumerate(keys):
        offset = sum(lengths[:at])
        assert bytes(fresh.recall(key)[1]) == whole[offset : offset + lengths[at]]


def _added(
    joined: JoinedWrite, keys: list[str], pieces: list[bytes], lengths: list[int], cuts: list[int]
) -> None:
    """Adds the items of ``_joined`` to ``joined`` in adds that begin at the items ``cuts``
    names, each add's bytes given as two pieces cut inside it."""
    whole = b"".join(pieces)
    offsets = list(itertools.accumulate(lengths, initial=0))
    for first, last in itertools.pairwise([*cuts, len(keys)]):
        data = whole[offsets[first] : offsets[last]]
        middle = len(data) // 3
        joined.add(keys[first:last], [data[:middle], data[middle:]], lengths[first:last])


@pytest.mark.parametrize("large", [None, 33], ids=["packed", "one kept on its own"])
def test_a_joined_write_keeps_what_was_added_at_its_close_and_not_before(
    home: Store, large: int | None
) -> None:
    """Items added over several calls to a joined write are found by no lookup until it
    closes; then each is recalled with its own bytes by a store opened afresh, the small
    ones packed together, as keep_joined keeps them."""
    keys, pieces, lengths = _joined(60, large)
    joined = home.open_joined("plain", "fp")
    _added(joined, keys, pieces, lengths, [0, 20, 45])
    assert home.have(keys) == set()
    assert reopen(home).have(keys) == set()
    joined.close()
    whole = b"".join(pieces)
    fresh = reopen(home)
    got = fresh.recall_many(keys)
    offsets = itertools.accumulate(lengths, initial=0)
    for key, offset, length in zip(keys, offsets, lengths, strict=False):
        answer, data = got[key]  # type: ignore[misc]
        assert bytes(data) == whole[offset : offset + length]
        assert (answer.codec, answer.fingerprint, answer.size) == ("plain", "fp", length)
    if large is None:
        assert len({fresh.answer(key).value for key in keys}) == 1  # type: ignore[union-attr]
    else:
        assert fresh.answer(keys[large]).offset is None  # type: ignore[union-attr]  # its own blob
    joined.close()  # closing again does nothing
    with pytest.raises(ValueError, match="is closed"):
        joined.add(keys[:1], b"", [0])


def test_a_joined_write_cuts_packs_as_keep_joined_cuts_them(
    home: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items added over several calls are cut into packs where keep_joined of all of them
    at once would cut them (an item left alone kept on its own)."""
    monkeypatch.setattr(records, "PACK_BYTES", 20)
    keys, pieces, lengths = _joined(40)
    with home.open_joined("plain") as joined:
        _added(joined, keys, pieces, lengths, [0, 3, 4, 17, 30])
    apart = [f"blake3:{i + 9000:064x}" for i in range(40)]
    home.keep_joined(apart, pieces, lengths, "plain")
    _laid_out_alike(home, keys, apart)


def test_a_joined_write_refuses_an_add_as_keep_joined_does_and_goes_on(home: Store) -> None:
    """An add whose lengths do not add up, or whose keys are no digests, is refused with
    none of its items taken; the write goes on, and keeps what was added besides."""
    keys, pieces, lengths = _joined(30)
    whole = b"".join(pieces)
    with home.open_joined("plain") as joined:
        with pytest.raises(ValueError, match="add up to 135 bytes; the data holds 134"):
            joined.add(keys, whole[:-1], lengths)
        with pytest.raises(BadName, match="is not a digest"):
            joined.add([*keys[:20], keys[20].upper(), *keys[21:]], whole, lengths)
        joined.add(keys[:10], whole[: sum(lengths[:10])], lengths[:10])
    assert reopen(home).have(keys) == set(keys[:10])


@pytest.mark.parametrize("how", ["abort", "a block that raised"])
def test_an_aborted_joined_write_keeps_nothing_it_was_given(home: Store, how: str) -> None:
    """A joined write aborted, or left by a block that raised, keeps none of what was added
    and leaves nothing in ``tmp/``; a store opened afresh finds none of it."""
    keys, pieces, lengths = _joined(60)
    if how == "abort":
        joined = home.open_joined("plain")
        _added(joined, keys, pieces, lengths, [0, 30])
        joined.abort()
    else:
        with pytest.raises(RuntimeError, match="made to fail"), home.open_joined("plain") as joined:
            _added(joined, keys, pieces, lengths, [0, 30])
            raise RuntimeError("made to fail")
    joined.close()  # kept nothing: it is aborted
    assert reopen(home).have(keys) == set()
    if isinstance(home, LocalStore):
        assert not list((home.root / "tmp").iterdir())


@pytest.mark.parametrize(
    ("codec", "fingerprint", "match"),
    [
        (None, None, r"codec is named by a str .* got None that is a NoneType"),
        (5, None, r"codec is named by a str .* got 5 that is a int"),
        ("plain", 5, r"code fingerprint is a str, or None for none, got 5 that is a int"),
        ("plain", b"fp", r"code fingerprint is a str, .* got b'fp' that is a bytes"),
    ],
    ids=["codec-none", "codec-int", "fingerprint-int", "fingerprint-bytes"],
)
def test_a_codec_or_fingerprint_that_is_not_text_is_refused_before_a_write(
    home: Store, codec: object, fingerprint: object, match: str
) -> None:
    """keep and keep_many (alone or packed) refuse a codec or code fingerprint that is not
    text with a TypeError, and keep nothing, where a record holding one would be taken
    for damage by every reader."""
    keys = [f"blake3:{i:064x}" for i in range(3)]
    for keeping in (
        lambda: home.keep(keys[0], b"answer", codec, fingerprint),  # type: ignore[arg-type]
        lambda: home.keep_many([(keys[0], b"a")], codec, fingerprint),  # type: ignore[arg-type]
        lambda: home.keep_many([(keys[1], b"a"), (keys[2], b"b")], codec, fingerprint),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError, match=match):
            keeping()
    assert reopen(home).have(keys) == set()
    assert not home.have(keys)


def test_recalling_a_record_again_lists_no_packs(
    home: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch holding an answer kept alone (a row recomputed by itself) lists the store's
    packs when it is first asked, not at every recall: on a bucket a listing is a
    request."""
    items = [(f"blake3:{i:064x}", [b"item"]) for i in range(3)]
    home.keep_many(items, "plain")
    home.keep(KEY, b"alone", "plain")
    fresh = reopen(home)
    listings: list[int] = []
    listed = type(fresh)._listed_packs
    monkeypatch.setattr(
        type(fresh), "_listed_packs", lambda self: listings.append(1) or listed(self)
    )
    keys = [KEY, *(key for key, _ in items)]
    counted = []
    for _ in range(4):
        got = fresh.recall_many(keys)
        assert bytes(got[KEY][1]) == b"alone"  # type: ignore[index]
        counted.append(len(listings))
    assert counted[0] >= 1 and counted[1:] == counted[:1] * 3


@pytest.mark.parametrize("size", [40, 300 << 10])  # a small pack, and one memory-mapped
def test_borrowed_reads_are_the_same_bytes_and_leave_private_ones_private(
    home: Store, size: int
) -> None:
    """Items read by a caller that only borrows them are the bytes kept, as often as they
    are read; a private read taken after a borrowed one (or before) is still its own."""
    items = [(f"blake3:{i:064x}", [bytes([i]) * size]) for i in range(3)]
    home.keep_many(items, "plain")
    fresh = reopen(home)
    keys = [key for key, _ in items]
    for _ in range(2):
        borrowed = fresh.recall_many(keys, borrow=True)
        for index, key in enumerate(keys):
            assert bytes(borrowed[key][1]) == bytes([index]) * size  # type: ignore[index]
        mine = fresh.recall_many(keys)[keys[1]][1]  # type: ignore[index]
        mine[:4] = b"\xff\xff\xff\xff"
        again = fresh.recall_many(keys, borrow=True)[keys[1]][1]  # type: ignore[index]
        assert bytes(again) == bytes([1]) * size


def test_open_blob_reads_ranges(home: Store) -> None:
    """open_blob gives a seekable file: a reader can take the tail without the head."""
    data = bytes(range(256)) * 1024
    digest = home.put(data)
    with home.open_blob(digest) as handle:
        handle.seek(-100, 2)
        assert handle.read() == data[-100:]
        handle.seek(1000)
        assert handle.read(10) == data[1000:1010]


def test_verify_and_gc(home: Store) -> None:
    """verify finds nothing wrong in a healthy store; gc to zero keeps named blobs only."""
    home.keep(KEY, b"answer", "plain")
    named = home.put(b"dataset")
    home.bind("sms/train", named)
    assert home.verify().ok
    home.gc(0, grace=0)
    fresh = reopen(home)
    assert fresh.have([KEY]) == set()
    assert bytes(fresh.get(fresh.resolve("sms/train"))) == b"dataset"


def test_verify_refuses_a_quarantine_that_is_no_bool(home: Store) -> None:
    """verify(quarantine="no") was taken as true, and would move what is damaged aside; a
    quarantine= that is no bool is refused before anything is read or moved."""
    home.keep(KEY, b"answer", "plain")
    with pytest.raises(TypeError, match=r"quarantine= is True or False, got 'no'"):
        home.verify(quarantine="no")  # type: ignore[arg-type]
    assert home.verify().ok


def test_gc_within_the_grace_counts_the_blobs_it_leaves_as_kept(home: Store) -> None:
    """A gc to zero within the grace drops the records but leaves their young blobs: it
    counts them as kept, and as young, in every home."""
    home.keep(KEY, bytes(5000), "plain")
    done = reopen(home).gc(0)
    assert done.answers == 1 and done.blobs == 0
    assert done.kept == 5000 and done.young == 5000
    done = reopen(home).gc(0, grace=0)
    assert done.blobs == 1 and done.kept == 0 and done.young == 0


class _RecallsKeyError(Store):
    """A store of a user's own whose ``recall`` raises a plain KeyError for a key it lacks
    (a dict's lookup), where the contract says Missing."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[Answer, memoryview]] = {}

    def recall(self, key: str) -> tuple[Answer, memoryview]:
        return self.answers[key]


def _unwritten(self: Store, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


for _name in sorted(Store.__abstractmethods__):
    if _name not in _RecallsKeyError.__dict__:
        setattr(_RecallsKeyError, _name, _unwritten)
abc.update_abstractmethods(_RecallsKeyError)


class _RecallsMissing(_RecallsKeyError):
    """The same store, raising Missing for a key it lacks, as the contract says."""

    def recall(self, key: str) -> tuple[Answer, memoryview]:
        if key not in self.answers:
            raise Missing(f"no answer {key}")
        return self.answers[key]


def test_a_plain_key_error_from_a_stores_recall_is_refused_naming_missing() -> None:
    """``recall_many``, as a store of a user's own inherits it, takes a plain KeyError
    from its ``recall`` for no miss (it may be a bug in the store): it is refused, naming
    the class and saying that ``recall`` raises Missing for a key it lacks. Missing is a
    miss, as ever."""
    store = _RecallsKeyError()
    with pytest.raises(TypeError, match=r"`_RecallsKeyError\.recall` raised a KeyError.*Missing"):
        store.recall_many([KEY])
    assert isinstance(_RecallsMissing().recall_many([KEY])[KEY], Missing)


class _LocalRecallsKeyError(LocalStore):
    """A directory's store whose ``recall`` raises a plain KeyError."""

    def recall(self, key: str) -> tuple[Answer, memoryview]:
        raise KeyError(key)


def test_a_graph_refuses_a_plain_key_error_from_a_stores_recall(tmp_path: Path) -> None:
    """A graph recalling one answer from a store whose ``recall`` raises a plain KeyError
    refuses it, naming the class and Missing, rather than crashing with a bare KeyError."""
    store = _LocalRecallsKeyError(tmp_path / "store")
    graph = Graph.somatize(Square().named("square").frozen().mapped().cached())
    assert graph.forward([3], store=store) == [9]  # kept
    with pytest.raises(TypeError, match=r"`_LocalRecallsKeyError\.recall` raised a KeyError"):
        graph.forward([3], store=store)
