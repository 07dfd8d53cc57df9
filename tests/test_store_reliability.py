"""The local store under stress: killed writers, racing writers, damaged files, a full
disk, hostile names and unsigned answers — never a wrong answer, never a half one."""

from __future__ import annotations

import copy
import errno
import gc
import multiprocessing
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import blake3
import pytest

from somatize import BadName, Corrupt, Graph, Missing, NameNotFound, Store
from somatize.store import (
    LocalStore,
    StoreError,
    StoreFull,
    Unsigned,
    _local_files,
    local,
    records,
)
from somatize.store._packed import hash_bytes
from tests.forked import answer_of, cut_short_when_hashed, forked, in_forked_child, needs_fork
from tests.nodes import Largest, Rows, Scale


def key_of(label: str) -> str:
    return "blake3:" + blake3.blake3(label.encode()).hexdigest()


def value_of(key: str, size: int) -> bytes:
    return (key.encode() * (size // len(key) + 1))[:size]


# -- crash consistency -------------------------------------------------------------------------


def _writer(root: Path, trial: int, report: int) -> None:
    """Writes answers and packs forever, telling ``report`` each key once it is published."""
    store = LocalStore(root)
    rng = random.Random(trial)
    for step in range(10**6):
        if step % 4 == 3:
            keys = [key_of(f"{trial}/{step}/{i}") for i in range(20)]
            store.keep_many([(k, value_of(k, rng.randrange(1, 3000))) for k in keys], "plain")
        else:
            keys = [key_of(f"{trial}/{step}")]
            store.keep(keys[0], value_of(keys[0], rng.choice([7, 5000, 70_000, 300_000])), "plain")
        os.write(report, "".join(f"{k}\n" for k in keys).encode())


def _crash_trials(root: str, trials: int, log: str) -> None:
    """Forks ``trials`` writers, killing each at a random moment; appends every key they
    reported published to ``log``. Run in a fresh interpreter: a process that has hashed
    with threads (blake3's pool) cannot safely fork a writer that hashes again."""
    LocalStore(root)
    rng = random.Random(7)
    with open(log, "w") as out:
        for trial in range(trials):
            read, write = os.pipe()
            child = os.fork()
            if child == 0:  # pragma: no cover - runs in the child
                os.close(read)
                try:
                    _writer(Path(root), trial, write)
                finally:
                    os._exit(0)
            os.close(write)
            time.sleep(rng.uniform(0.001, 0.03))
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            with os.fdopen(read, "rb") as pipe:
                out.write(pipe.read().decode())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="kills forked writers; needs os.fork")
def test_killed_writers_leave_a_clean_store(tmp_path: Path) -> None:
    """200 writers killed at random moments leave a store that verifies clean, shows
    nothing partial, and gives back every answer that was published."""
    root, log = tmp_path / "store", tmp_path / "published"
    code = (
        "from tests.test_store_reliability import _crash_trials; "
        f"_crash_trials({str(root)!r}, 200, {str(log)!r})"
    )
    repo = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", code], cwd=repo, check=True, timeout=240)
    published = [line for line in log.read_text().splitlines() if line]
    store = LocalStore(root)
    found = store.verify()
    assert found.ok, found.damaged
    assert len(published) > 200
    assert store.have(published) == set(published)
    got = store.recall_many(published)
    for key in published:
        answer, data = got[key]  # type: ignore[misc]
        assert bytes(data) == value_of(key, answer.size)
    assert not list((root / "answers").rglob("*.part"))


def test_a_durable_write_into_a_new_folder_syncs_the_folders_above_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A durable keep that makes the folder it publishes into (the first blob and record of
    a shard, a name in a new folder of names) syncs each folder above it too: the folder
    made is an entry of the one above, and a rename synced in a folder whose own entry is
    not may be lost with it at a power cut, leaving the record without its blob."""
    store = LocalStore(tmp_path / "store", durable=True)
    synced: list[Path] = []
    sync = LocalStore._sync_directory
    monkeypatch.setattr(
        LocalStore, "_sync_directory", staticmethod(lambda at: (synced.append(Path(at)), sync(at)))
    )
    key = key_of("durable")
    answer = store.keep(key, b"kept for good", "plain")
    store.bind("sets/train", answer.value)
    root = tmp_path / "store"
    blob, record = store.blob_path(answer.value), store.answer_path(key)
    for folder in (blob.parent, root / "blobs", record.parent, root / "answers"):
        assert folder in synced, folder
    assert root / "names" / "sets" in synced and root / "names" in synced
    assert synced.index(root / "blobs") < synced.index(record.parent)


@pytest.mark.parametrize("size", [100, 1 << 20], ids=["small", "large"])
def test_a_durable_put_of_a_blob_already_there_syncs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A durable keep that finds its blob already there, written by a store that does not
    sync, syncs that blob and the folders above it before the record that refers to it is
    published: trusted as it was, it could be lost at a power cut the record survives."""
    root = tmp_path / "store"
    key = key_of("durable")
    blob = LocalStore(root).put(value_of(key, size))
    store = LocalStore(root, durable=True)
    synced: list[Path] = []
    sync, fsync = LocalStore._sync_directory, os.fsync
    monkeypatch.setattr(
        LocalStore, "_sync_directory", staticmethod(lambda at: (synced.append(Path(at)), sync(at)))
    )

    def recorded(handle: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{handle}")))
        fsync(handle)

    monkeypatch.setattr(os, "fsync", recorded)
    answer = store.keep(key, value_of(key, size), "plain")
    assert answer.value == blob
    path = store.blob_path(blob)
    record = synced.index(store.answer_path(key).parent)
    for synced_first in (path, path.parent, root / "blobs"):
        assert synced_first in synced and synced.index(synced_first) < record, synced_first


def test_a_durable_store_remembers_syncing_a_bounded_number_of_blobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A durable store that finds many blobs already written by a store that does not sync
    remembers having synced at most ``_VERIFIED_HELD`` of them; one it let go of is synced
    again when it is found again."""
    monkeypatch.setattr(_local_files, "_VERIFIED_HELD", 8)
    root = tmp_path / "store"
    plain, store = LocalStore(root), LocalStore(root, durable=True)
    keys = [key_of(f"found/{i}") for i in range(40)]
    for key in keys:
        plain.put(value_of(key, 100))
        store.keep(key, value_of(key, 100), "plain")
    assert len(store._synced) <= 8
    synced: list[int] = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda handle: (synced.append(handle), fsync(handle)))
    store.put(value_of(keys[0], 100))  # let go of long since
    assert synced
    assert len(store._synced) <= 8


# -- concurrency -------------------------------------------------------------------------------


def _racer(root: str, start: int) -> None:
    store = LocalStore(root)
    keys = [key_of(f"whole/{i}") for i in range(start, start + 500)]
    for key in keys:
        store.keep(key, value_of(key, 100 + int(key[7:11], 16) % 5000), "plain")
    items = [key_of(f"item/{i}") for i in range(start, start + 500)]
    for at in range(0, 500, 100):
        chunk = items[at : at + 100]
        store.keep_many([(k, value_of(k, 50)) for k in chunk], "plain")
    store.bind("shared/latest", store.put(b"the same dataset"))


def test_racing_writers_end_where_a_serial_run_does(tmp_path: Path) -> None:
    """4 processes × 500 overlapping keys: no error, nothing damaged, and the same answers
    (and blobs for whole answers) as the same writes made one after another."""
    racing, serial = tmp_path / "racing", tmp_path / "serial"
    starts = [0, 250, 500, 750]
    # Spawned, not forked: this process may hold a hashing thread pool a fork would break.
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_racer, args=(str(racing), s)) for s in starts]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    for start in starts:
        _racer(str(serial), start)
    one, two = LocalStore(racing), LocalStore(serial)
    assert one.verify().ok and two.verify().ok
    keys = [key_of(f"whole/{i}") for i in range(1250)] + [key_of(f"item/{i}") for i in range(1250)]
    assert one.have(keys) == two.have(keys) == set(keys)
    mine, theirs = one.recall_many(keys), two.recall_many(keys)
    for key in keys:
        assert bytes(mine[key][1]) == bytes(theirs[key][1])  # type: ignore[index]
    for key in keys[:1250]:
        assert one.answer(key).value == two.answer(key).value  # type: ignore[union-attr]
    assert one.resolve("shared/latest") == two.resolve("shared/latest")


def test_a_store_copied_or_pickled_works_apart(tmp_path: Path) -> None:
    """A store pickled (with a model that holds it) or copied reads what was kept, and
    keeps apart from the original, with a lock of its own."""
    store = LocalStore(tmp_path / "store")
    digest = store.put(b"kept before the copy")
    for copied in (pickle.loads(pickle.dumps(store)), copy.deepcopy(store)):
        assert bytes(copied.get(digest)) == b"kept before the copy"
        assert copied._lock is not store._lock
        assert bytes(store.get(copied.put(b"kept by the copy"))) == b"kept by the copy"


def test_one_store_object_shared_by_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads recalling one by one and in batches, keeping, asking have() and collecting
    through one store object at once: no error, and every answer is the one kept."""
    monkeypatch.setattr("somatize.store._packed.FLUSH_USES", 32)  # written down often
    store = LocalStore(tmp_path / "store")
    whole = {key_of(f"whole/{i}"): value_of(key_of(f"whole/{i}"), 50 + i) for i in range(100)}
    items = {key_of(f"item/{i}"): value_of(key_of(f"item/{i}"), 20 + i) for i in range(120)}
    for key, value in whole.items():
        store.keep(key, value, "plain")
    packed = list(items)
    for at in range(0, 120, 30):
        store.keep_many([(key, items[key]) for key in packed[at : at + 30]], "plain")
    kept = {**whole, **items}
    errors: list[str] = []

    def hammer(work: Any, rounds: int) -> Any:
        def run() -> None:
            for turn in range(rounds):
                try:
                    work(turn)
                except Exception as why:  # every failure is the test's finding
                    errors.append(f"{work.__name__}: {type(why).__name__}: {why}")
                    return

        return run

    def recall(turn: int) -> None:
        for key in list(whole)[turn % 10 :: 10]:
            if bytes(store.recall(key)[1]) != whole[key]:
                errors.append(f"recall: wrong bytes for {key}")

    def batch(turn: int) -> None:
        got = store.recall_many(packed + list(whole)[:10], borrow=turn % 2 == 0)
        for key, found in got.items():
            if isinstance(found, Exception) or bytes(found[1]) != kept[key]:
                errors.append(f"recall_many: {key}: {found!r}")

    def keep(turn: int) -> None:
        key = list(whole)[turn % 100]
        store.keep(key, whole[key], "plain")
        chunk = packed[(turn % 4) * 30 : (turn % 4) * 30 + 30]
        store.keep_many([(key, items[key]) for key in chunk], "plain")

    def have(turn: int) -> None:
        if store.have(list(kept)) != set(kept):
            errors.append("have: not every kept answer is had")

    def collect(turn: int) -> None:
        store.gc(grace=60)  # removes nothing young; lets go of all that is held in memory

    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns as often as they can
    try:
        workers = [
            threading.Thread(target=hammer(recall, 60)),
            threading.Thread(target=hammer(recall, 60)),
            threading.Thread(target=hammer(batch, 40)),
            threading.Thread(target=hammer(keep, 20)),
            threading.Thread(target=hammer(have, 20)),
            threading.Thread(target=hammer(collect, 10)),
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)
    finally:
        sys.setswitchinterval(switching)
    assert errors == []
    assert LocalStore(tmp_path / "store").verify().ok


def test_recalling_packed_items_keeps_no_record_per_item(tmp_path: Path) -> None:
    """A store holds its table of packed items, and nothing more for each item it looks
    up or recalls: a process reading a million rows of eight floats from a store held a
    record of each, about 370 bytes a row beyond the table, for as long as the store was
    open."""
    keys = [f"blake3:{i:064x}" for i in range(2000)]
    Store(tmp_path / "store").keep_many([(key, key.encode()[-16:]) for key in keys], "plain")
    (index,) = (tmp_path / "store" / "packs").iterdir()
    data = index.read_bytes()
    tracemalloc.start()
    try:
        table = records.decode_pack(f"blake3:{index.name}", data, None)
        gc.collect()
        table_bytes, _ = tracemalloc.get_traced_memory()
        del table
        gc.collect()
        before, _ = tracemalloc.get_traced_memory()
        fresh = Store(tmp_path / "store")
        assert fresh.have(keys) == set(keys)
        got = fresh.recall_many(keys)
        assert all(bytes(got[key][1]) == key.encode()[-16:] for key in keys)  # type: ignore[index]
        assert all(fresh.answer(key) is not None for key in keys)
        del got
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The table, the dict that finds each key's pack, the pack's blob (32 KB, held as a
    # small blob) and a little more; a record of each item is 370 bytes more an item.
    assert held - before < table_bytes + 200 * len(keys), (held - before, table_bytes)


def test_a_pack_published_while_another_thread_looks_at_the_packs_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look at ``packs/`` lists them, then takes in what it listed: a pack another thread
    publishes in between is not in the listing, and must not be dropped as gone."""
    store = LocalStore(tmp_path / "store")
    store.keep_many([(key_of(f"old/{i}"), b"old %d" % i) for i in range(3)], "plain")
    fresh = [(key_of(f"new/{i}"), b"new %d" % i) for i in range(3)]
    listed = store._listed_packs

    def listing_then_a_keep() -> Any:
        found = listed()
        store.keep_many(fresh, "plain")  # another thread, between the listing and its use
        return found

    monkeypatch.setattr(store, "_listed_packs", listing_then_a_keep)
    assert store.have([key_of("never kept")]) == set()  # a look
    monkeypatch.setattr(store, "_listed_packs", lambda: None)  # nothing changed since
    assert store.have([key for key, _ in fresh]) == {key for key, _ in fresh}
    assert [bytes(store.recall(key)[1]) for key, _ in fresh] == [data for _, data in fresh]


@pytest.mark.parametrize(
    ("age_ns", "fine", "lists"),
    [(200_000_000, True, 1), (200_000_000, False, 3), (3 * 10**9, False, 1)],
)
def test_packs_are_listed_again_while_their_folder_may_still_change_unseen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, age_ns: int, fine: bool, lists: int
) -> None:
    """Lookups of keys no pack answers list ``packs/`` while its time is within a tick of
    the filesystem's clock (an entry made later in that tick would leave it as it was):
    once for a time a fifth of a second old that says it is kept finer than a second,
    at every lookup for one of whole seconds (a coarse filesystem's: FAT's tick is two),
    until it is over two seconds old."""
    LocalStore(tmp_path / "store").keep_many([(key_of("item"), b"item")], "plain")
    when = time.time_ns() - age_ns
    when = when | 1 if fine else when - when % 10**9  # whole seconds: up to a second older
    os.utime(tmp_path / "store" / "packs", ns=(when, when))
    store = LocalStore(tmp_path / "store")
    listed: list[str] = []
    listdir = os.listdir

    def counted(path: Any) -> list[str]:
        listed.append(os.fspath(path))
        return listdir(path)

    monkeypatch.setattr(os, "listdir", counted)
    for i in range(3):
        assert store.have([key_of(f"never kept {i}")]) == set()
    assert sum(path.rstrip(os.sep).endswith("packs") for path in listed) == lists


def test_a_thread_asking_while_another_takes_in_the_packs_waits_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that finds a key in no pack it knows looks at ``packs/``; one that does so
    while another thread's look is still reading what it listed finds the packs that look
    takes in, rather than a listing that has not changed and a miss."""
    LocalStore(tmp_path / "store").keep_many(
        [(key_of(f"item/{i}"), b"item %d" % i) for i in range(3)], "plain"
    )
    long_ago = time.time_ns() - 60 * 10**9  # a listing whose time says it cannot have changed
    os.utime(tmp_path / "store" / "packs", ns=(long_ago, long_ago))
    store = LocalStore(tmp_path / "store")  # knows no pack yet
    reading, go = threading.Event(), threading.Event()
    read = store._read_indexes

    def slow_read(wanted: dict[str, str]) -> dict[str, bytes | None]:
        reading.set()
        go.wait(30)
        return read(wanted)

    monkeypatch.setattr(store, "_read_indexes", slow_read)
    found: dict[str, set[str]] = {}
    key = key_of("item/1")
    first = threading.Thread(target=lambda: found.update(first=store.have([key])))
    second = threading.Thread(target=lambda: found.update(second=store.have([key])))
    first.start()
    assert reading.wait(30)
    second.start()
    second.join(0.5)  # what it answers while the first look is still reading, if it does
    go.set()
    first.join(30)
    second.join(30)
    assert found == {"first": {key}, "second": {key}}


def _opened(where: str, tmp_path: Path, url: str) -> Any:
    """A store object of the local store at ``tmp_path`` or the bucket at ``url``."""
    if where == "local":
        return LocalStore(tmp_path / "store")
    return Store.on_bucket(url, backoff=0.0)


def _a_gc_ends_after_the_first_look(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Has a gc of ``store`` end right after its next look at ``packs/``, as one of
    another thread would; the list returned holds True once it has."""
    look = store._refresh_packs
    ended: list[bool] = []

    def look_then_a_gc_ends() -> bool:
        changed = look()
        if not ended:
            ended.append(True)
            store.gc()  # another thread's, ending right after this look
        return bool(changed)

    monkeypatch.setattr(store, "_refresh_packs", look_then_a_gc_ends)
    return ended


@pytest.mark.parametrize("where", ["local", "bucket"])
@pytest.mark.parametrize("ask", ["have", "recall"])
def test_a_pack_let_go_of_by_a_gc_just_after_a_look_is_looked_for_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, ask: str
) -> None:
    """A gc or verify of a store object lets go of its table of packs as it ends: one of
    another thread ending just after a thread's look at ``packs/`` took the packs in, and
    before that thread found its keys there, must not make kept keys misses."""
    url = f"memory://somatize/{uuid.uuid4().hex}"
    items = [(key_of(f"packed/{i}"), b"packed %d" % i) for i in range(3)]
    keys = [key for key, _ in items]
    _opened(where, tmp_path, url).keep_many(items, "plain")
    store = _opened(where, tmp_path, url)  # knows no pack yet
    ended = _a_gc_ends_after_the_first_look(store, monkeypatch)
    if ask == "have":
        assert store.have(keys) == set(keys)
    else:
        assert [bytes(store.recall(key)[1]) for key in keys] == [data for _, data in items]
    assert ended


def test_a_bucket_asked_while_another_thread_takes_in_the_packs_finds_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bucket store asked for keys it knows nowhere looks at ``packs/`` again: a look of
    another thread that took their pack in meanwhile leaves this one nothing new to take
    in, and the keys are found all the same."""
    url = f"memory://somatize/{uuid.uuid4().hex}"
    store = Store.on_bucket(url, backoff=0.0)
    assert store.have([key_of("never kept")]) == set()  # its first look, at no pack
    items = [(key_of(f"packed/{i}"), b"packed %d" % i) for i in range(3)]
    Store.on_bucket(url, backoff=0.0).keep_many(items, "plain")
    read = store._read_paths

    looked: list[bool] = []

    def read_while_another_looks(paths: list[str]) -> Any:
        got = read(paths)
        if not looked:  # the records of the keys asked, read while another thread looks
            looked.append(True)
            store._refresh_packs()
        return got

    monkeypatch.setattr(store, "_read_paths", read_while_another_looks)
    keys = [key for key, _ in items]
    assert store.have(keys) == set(keys)
    assert looked


def test_a_bucket_whose_first_look_a_gc_let_go_of_believes_no_older_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bucket store looks at its packs once before it believes a record (a newer pack
    answers the record's key): a gc of another thread ending just after that look, which
    lets go of the packs it took in, has it look again, never answer with the record."""
    url = f"memory://somatize/{uuid.uuid4().hex}"
    key = key_of("kept alone, then packed")
    writer = Store.on_bucket(url, backoff=0.0)
    writer.keep(key, b"older", "plain")
    time.sleep(0.01)
    writer.keep_many([(key, b"newer"), (key_of("beside it"), b"beside")], "plain")
    store = Store.on_bucket(url, backoff=0.0)
    ended = _a_gc_ends_after_the_first_look(store, monkeypatch)
    assert bytes(store.recall(key)[1]) == b"newer"
    assert ended


def test_a_batch_read_while_a_gc_lets_go_of_the_packs_is_whole(tmp_path: Path) -> None:
    """recall_many reads every pack it found, even when a gc in another thread lets go of
    the store's table of packs while the batch is being read."""
    store = LocalStore(tmp_path / "store")
    first = [(key_of(f"first/{i}"), b"first %d" % i) for i in range(3)]
    second = [(key_of(f"second/{i}"), b"second %d" % i) for i in range(3)]
    store.keep_many(first, "plain")
    store.keep_many(second, "plain")
    reader = LocalStore(tmp_path / "store")
    reading = reader._read_blob

    def read_while_collected(digest: str, size: int | None, borrow: bool = False) -> memoryview:
        reader._forget_all()  # what a gc running in another thread does when it is done
        return reading(digest, size, borrow)

    reader._read_blob = read_while_collected  # type: ignore[method-assign]
    got = reader.recall_many([key for key, _ in first + second])
    assert {key: bytes(got[key][1]) for key, _ in first + second} == dict(first + second)  # type: ignore[index]


# -- damage ------------------------------------------------------------------------------------


def _graph() -> Graph:
    return Graph.somatize(
        Rows().named("rows").frozen()
        >> Scale().named("scale").frozen()
        >> Largest().named("top").frozen().cached()
    )


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "record", "fingerprint"])
def test_damaged_answer_is_recomputed_and_said(tmp_path: Path, damage: str) -> None:
    """A flipped, truncated or deleted blob, or a broken record (one whose code fingerprint
    is not text included), under a kept answer: the next forward recomputes the right value
    and says so; the one after recalls it again."""
    root = tmp_path / "store"
    x = {"at": 10, "take": 5}
    g = _graph()
    right = g.forward(x, store=LocalStore(root))
    key = next(f["key"] for f in g.record.facts if f["fact"] == "kept")
    store = LocalStore(root)
    answer = store.answer(key)
    assert answer is not None
    blob = store.blob_path(answer.value)
    if damage == "flip":
        data = bytearray(blob.read_bytes())
        data[-1] ^= 1
        blob.write_bytes(bytes(data))
    elif damage == "truncate":
        blob.write_bytes(blob.read_bytes()[:-1])
    elif damage == "delete":
        blob.unlink()
    elif damage == "fingerprint":
        path = store.answer_path(key)
        text = re.sub(r'"fingerprint":"[^"]*"', '"fingerprint":{"a":1}', path.read_text())
        assert text != path.read_text()
        path.write_text(text)
    else:
        store.answer_path(key).write_bytes(b'{"somatize": 1, "key"')
    again = _graph()
    assert again.forward(x, store=LocalStore(root)) == right
    outcome = again.record.outcome["top"]
    assert outcome == "ran"
    if damage == "flip":
        assert again.record.count("corrupt") == 1
    third = _graph()
    assert third.forward(x, store=LocalStore(root)) == right
    assert third.record.outcome["top"] == "recalled"


@pytest.mark.parametrize("created", ["1e20", "-1", "NaN", "Infinity", "1e400"])
@pytest.mark.parametrize("kind", ["record", "pack"])
def test_a_time_no_writer_could_have_written_is_damage(
    tmp_path: Path, created: str, kind: str
) -> None:
    """A record or pack index whose `created` is no time a clock can show (1e20, negative,
    NaN, infinite) is damaged, as any record that cannot be read: not had, never recalled,
    and reported by verify."""

    store = LocalStore(tmp_path / "store")
    key = key_of("when")
    if kind == "record":
        store.keep(key, b"an answer", "plain")
        path = store.answer_path(key)
        text = path.read_text().replace('"created":', '"created":' + created + ',"was":')
        path.write_text(text)
    else:
        store.keep_many([(key, b"item one"), (key_of("other"), b"item two")], "plain")
        _rewrite_pack_header(tmp_path / "store", "created", float(created))
    _refused_as_damaged(tmp_path / "store", key, kind)


def test_a_damaged_pack_index_is_read_again_only_once_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack index with a byte changed is read at the first look that lists it and not at
    the looks after, though ``packs/`` changes between them (another writer's packs: the
    first epoch of a training); written back whole, the same size, it is read at the next
    look and its items found. A verify still reports it damaged."""
    root = tmp_path / "store"
    writer = LocalStore(root)
    items = [(key_of(f"item {i}"), f"row {i}".encode()) for i in range(3)]
    writer.keep_many(items, "plain")
    (index,) = (root / "packs").iterdir()
    whole = index.read_bytes()
    damaged = whole[:-1] + bytes([whole[-1] ^ 1])

    def write_over(data: bytes) -> None:  # as a repair does: a new file, renamed over
        (root / "tmp" / "index").write_bytes(data)
        os.replace(root / "tmp" / "index", index)

    write_over(damaged)
    reads: list[str] = []
    read_file = local._read_file

    def counted(path: str, *args: Any) -> Any:
        reads.append(os.path.basename(path))
        return read_file(path, *args)

    monkeypatch.setattr(local, "_read_file", counted)
    store = LocalStore(root)
    for turn in range(3):
        assert store.have([items[0][0]]) == set()
        with pytest.raises(Missing):
            store.recall(items[1][0])
        writer.keep_many([(key_of(f"other {turn} {i}"), b"other") for i in range(2)], "plain")
    assert reads.count(index.name) == 1
    write_over(whole)
    assert store.have([key for key, _ in items]) == {key for key, _ in items}
    assert bytes(store.recall(items[1][0])[1]) == b"row 1"
    assert reads.count(index.name) == 2

    write_over(damaged)
    other = LocalStore(root)
    assert other.have([items[0][0]]) == set()
    assert ("packs", index.name) in [(d.section, d.name) for d in other.verify().damaged]
    assert other.have([items[0][0]]) == set()


def _refused_as_damaged(root: Path, key: str, kind: str) -> list[Any]:
    """Checks that a store at ``root`` opened afresh does not have ``key``, whose record
    (or, for ``kind`` "pack", pack index) is damaged, never recalls it, and that verify
    reports that record or index damaged; answers what verify found damaged."""
    fresh = LocalStore(root)
    assert fresh.have([key]) == set()
    with pytest.raises(Corrupt if kind == "record" else Missing):
        fresh.recall(key)
    found = fresh.verify()
    assert [d.section for d in found.damaged] == ["answers" if kind == "record" else "packs"]
    return found.damaged


def _rewrite_pack_header(root: Path, field: str, value: Any) -> None:
    """Rewrites the one pack index in store ``root`` with ``field`` of its header set to
    ``value``, under the name of its new bytes (as a writer that wrote it so would)."""
    import json

    (path,) = (root / "packs").iterdir()
    line, _, table = path.read_bytes().partition(b"\n")
    header = json.loads(line)
    header[field] = value
    index = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    data = index + b"\n" + table
    path.unlink()
    (path.parent / hash_bytes(data)[7:]).write_bytes(data)


@pytest.mark.parametrize("fingerprint", ['{"a":1}', "[1]", "7", "true", "NaN"])
@pytest.mark.parametrize("kind", ["record", "pack"])
def test_a_code_fingerprint_that_is_not_text_is_damage(
    tmp_path: Path, fingerprint: str, kind: str
) -> None:
    """A record or pack index whose code fingerprint is not text (nor null) is damaged, as
    any record that cannot be read: not had, never recalled (a forward would compare it,
    and keep it as a key, as the text it is not), and reported by verify."""
    import json

    store = LocalStore(tmp_path / "store")
    key = key_of("which code")
    if kind == "record":
        store.keep(key, b"an answer", "plain", fingerprint="sha256:f")
        path = store.answer_path(key)
        path.write_text(path.read_text().replace('"sha256:f"', fingerprint))
    else:
        items = [(key, b"item one"), (key_of("other"), b"item two")]
        store.keep_many(items, "plain", fingerprint="sha256:f")
        _rewrite_pack_header(tmp_path / "store", "fingerprint", json.loads(fingerprint))
    damaged = _refused_as_damaged(tmp_path / "store", key, kind)
    assert "code fingerprint is a" in damaged[0].why


def test_verify_reports_and_quarantines(tmp_path: Path) -> None:
    """verify names a damaged blob and a dangling record; quarantined, they become misses."""
    store = LocalStore(tmp_path / "store")
    good, bad = key_of("good"), key_of("bad")
    store.keep(good, b"fine" * 100, "plain")
    answer = store.keep(bad, b"soon broken" * 100, "plain")
    store.blob_path(answer.value).write_bytes(b"X" * answer.size)
    found = LocalStore(store.root).verify(quarantine=True)
    assert {d.section for d in found.damaged} == {"blobs", "answers"}
    assert any("hashes to" in d.why for d in found.damaged)
    fresh = LocalStore(store.root)
    assert fresh.have([good, bad]) == {good}
    assert fresh.verify().ok
    assert len(list((store.root / "quarantine").rglob("*"))) >= 2


# -- a full disk -------------------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Any:
    where = tmp_path / "tiny"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(
            f"mounting a 1 MiB tmpfs is not permitted here ({done.stderr.strip()}); "
            "the simulated ENOSPC test covers the same path"
        )
    yield where
    subprocess.run(["umount", str(where)], check=False)


def test_full_disk_is_a_clear_error(tiny_disk: Path) -> None:
    """On a 1 MiB disk, a 2 MiB answer fails with StoreFull; what was kept before is intact
    and nothing half-written is left behind."""
    store = LocalStore(tiny_disk / "store")
    small = key_of("small")
    store.keep(small, b"s" * 1000, "plain")
    with pytest.raises(StoreFull, match="no space left"):
        store.keep(key_of("big"), b"b" * (2 << 20), "plain")
    assert not list((tiny_disk / "store" / "tmp").iterdir())
    fresh = LocalStore(tiny_disk / "store")
    assert fresh.verify().ok
    assert fresh.have([small, key_of("big")]) == {small}


@pytest.mark.parametrize("size", [5000, 17 << 20], ids=["small", "hashed-while-written"])
def test_simulated_full_disk_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A write that fails with ENOSPC midway raises StoreFull and leaves the store as it was
    (a large blob, hashed while it is written, too)."""
    store = LocalStore(tmp_path / "store")
    small = key_of("small")
    store.keep(small, b"s" * 1000, "plain")
    real = os.replace

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(StoreFull, match="store is as it was"):
        store.keep(key_of("big"), b"b" * size, "plain")
    monkeypatch.setattr(os, "replace", real)
    assert not list((tmp_path / "store" / "tmp").iterdir())
    assert LocalStore(tmp_path / "store").have([small, key_of("big")]) == {small}


def test_a_joined_write_that_fills_the_disk_says_so_and_leaves_nothing(tiny_disk: Path) -> None:
    """On a 1 MiB disk, a joined write of rows that outgrow it fails with StoreFull, at the
    add that does not fit or at the close; nothing of it is kept or left in ``tmp/``, and
    it takes no more."""
    store = LocalStore(tiny_disk / "store")
    keys = [key_of(f"row {i}") for i in range(1200)]
    joined = store.open_joined("plain")
    with pytest.raises(StoreFull, match="no space left"):
        joined.add(keys[:600], b"r" * (600 * 1000), [1000] * 600)
        joined.add(keys[600:], b"s" * (600 * 1000), [1000] * 600)
        joined.close()
    with pytest.raises(ValueError, match="is closed"):
        joined.add(keys[:1], b"r", [1])
    assert not list((tiny_disk / "store" / "tmp").iterdir())
    assert LocalStore(tiny_disk / "store").have(keys) == set()


def test_a_joined_write_writes_each_add_to_tmp_as_it_comes(tmp_path: Path) -> None:
    """A directory's joined write writes each add's bytes (of more than a file's buffer)
    into one file of ``tmp/`` as the add is made, found by no lookup, and publishes it as
    one pack at the close."""
    store = LocalStore(tmp_path / "store")
    keys = [key_of(f"row {i}") for i in range(100)]
    with store.open_joined("plain") as joined:
        joined.add(keys[:40], b"a" * 80_000, [2000] * 40)
        (part,) = (tmp_path / "store" / "tmp").iterdir()
        assert part.stat().st_size == 80_000
        joined.add(keys[40:], [b"b" * 20_000, b"c" * 100_000], [2000] * 60)
        assert part.stat().st_size == 200_000
        assert LocalStore(store.root).have(keys) == set()
    assert not list((tmp_path / "store" / "tmp").iterdir())
    fresh = LocalStore(store.root)
    assert bytes(fresh.recall(keys[-1])[1]) == b"c" * 2000
    assert len({fresh.answer(key).value for key in keys}) == 1  # type: ignore[union-attr]


class _KeepsJoinedItsWay(LocalStore):
    """A store that does something of its own as it keeps items joined (counts them)."""

    counted = 0

    def keep_joined(self, keys: Any, *args: Any, **kwargs: Any) -> None:
        self.counted += len(keys)
        super().keep_joined(keys, *args, **kwargs)


@pytest.mark.parametrize("how", ["a subclass", "set on the store"])
def test_a_joined_write_hands_a_keep_joined_of_the_stores_own_everything(
    tmp_path: Path, how: str
) -> None:
    """A store whose ``keep_joined`` is its own (a subclass's, or one set on the object)
    has it called with everything added, at the close, rather than written as it comes."""
    keys = [key_of(f"row {i}") for i in range(30)]
    if how == "a subclass":
        store: LocalStore = _KeepsJoinedItsWay(tmp_path / "store")
    else:
        store = LocalStore(tmp_path / "store")
        counts: list[int] = []
        keep_joined = store.keep_joined

        def counting(keys: Any, *args: Any, **kwargs: Any) -> None:
            counts.append(len(keys))
            keep_joined(keys, *args, **kwargs)

        store.keep_joined = counting  # type: ignore[method-assign]
    with store.open_joined("plain") as joined:
        joined.add(keys[:10], b"a" * 100, [10] * 10)
        joined.add(keys[10:], b"b" * 200, [10] * 20)
        assert not list((tmp_path / "store" / "tmp").iterdir())
    assert (store.counted if how == "a subclass" else sum(counts)) == 30  # type: ignore[attr-defined]
    assert LocalStore(store.root).have(keys) == set(keys)


def _read_only(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.EROFS, "Read-only file system")


def _full(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device")


def _mount_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes every write, rename, removal and touch fail as on a read-only filesystem (as
    root, permissions would not stop a write, so the refusal is simulated)."""
    _refuse_writes(monkeypatch, _read_only)
    for name in ("utime", "unlink", "replace", "rename"):
        monkeypatch.setattr(os, name, _read_only)


def _refuse_writes(monkeypatch: pytest.MonkeyPatch, refuse: Callable[..., Any]) -> None:
    """Makes every file opened for writing by the local store, and every folder made,
    fail with what ``refuse`` raises: on a full disk, only that fails."""
    real_open = open

    def opened(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if set(mode) & set("wax+"):
            refuse()
        return real_open(file, mode, *args, **kwargs)

    for module in ("local", "_local_files", "_local_upkeep"):  # the modules of the local store
        for name in ("open", "open_file"):
            monkeypatch.setattr(f"somatize.store.{module}.{name}", opened, raising=False)
    monkeypatch.setattr(os, "mkdir", refuse)


def test_a_read_only_store_refuses_writes_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a read-only filesystem, a keep or put of new bytes raises StoreError saying the
    store is read-only; a put of bytes already there answers their digest, and what was
    kept is still recalled."""
    store = LocalStore(tmp_path / "store")
    kept = store.keep(key_of("kept"), b"kept before", "plain")
    _mount_read_only(monkeypatch)
    with pytest.raises(StoreError, match="the store is read-only for this process"):
        store.keep(key_of("new"), b"new bytes", "plain")
    with pytest.raises(StoreError, match="the store is read-only for this process"):
        store.put(b"new bytes")
    with pytest.raises(StoreError, match="the store is read-only for this process"):
        store.bind("data/v1", kept.value)
    assert store.put(b"kept before") == kept.value
    assert bytes(LocalStore(tmp_path / "store").recall(key_of("kept"))[1]) == b"kept before"
    monkeypatch.undo()
    assert LocalStore(tmp_path / "store").verify().ok


@pytest.mark.parametrize("how", ["read-only", "removed"])
def test_a_forward_into_a_store_it_cannot_write_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A forward that would keep what it computes in a store on a read-only filesystem, or
    whose directory was removed since the store object was opened, is a StoreError saying
    so before any node runs, not after its work, which would be lost; what the store holds
    is still recalled."""
    largest = Largest().named("largest").frozen().cached()
    g = Graph.somatize(Scale().named("scale").frozen() >> largest)
    store = LocalStore(tmp_path / "store")
    assert g.forward([1.0, 2.0], store=store) == 4.0
    if how == "read-only":
        _mount_read_only(monkeypatch)
        store = LocalStore(tmp_path / "store")
        said = "the store is read-only for this process"
    else:
        shutil.rmtree(tmp_path / "store")
        said = "the store's directory is gone"
    with pytest.raises(StoreError, match=said):
        g.forward([1.0, 3.0], store=store)
    assert largest.calls == 1
    if how == "read-only":
        assert g.forward([1.0, 2.0], store=store) == 4.0


@pytest.mark.parametrize("disk", ["read-only", "full"])
def test_a_store_without_its_empty_folders_that_cannot_be_written_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], disk: str
) -> None:
    """A store this process may not write, or on a disk too full to make a folder on, that
    lacks its empty packs/ and tmp/ (copied by a tool that drops empty folders: `aws s3
    sync`, git) is opened and read, by the library and by every command of the command
    line; a write to it says the store is read-only, or that no space is left. Once it may
    be written, the folders are made when a write needs them."""
    from somatize.cli import main

    root = tmp_path / "store"
    store = LocalStore(root)
    kept = store.keep(key_of("kept"), b"kept before", "plain")
    store.bind("data/v1", store.put(b"rows"))
    store.close()
    (root / "packs").rmdir()
    (root / "tmp").rmdir()
    if disk == "read-only":
        _mount_read_only(monkeypatch)
    else:
        _refuse_writes(monkeypatch, _full)
    fresh = LocalStore(root)
    assert fresh.have([kept.key]) == {kept.key}
    assert bytes(fresh.recall(kept.key)[1]) == b"kept before"
    assert bytes(fresh.get(fresh.resolve("data/v1"))) == b"rows"
    for command in (["ls"], ["du"], ["verify"], ["show", kept.key], ["show", "data/v1"]):
        assert main(["store", *command, "--store", str(root)]) == 0, capsys.readouterr().err
    said = "the store is read-only for this process" if disk == "read-only" else "no space left"
    with pytest.raises(StoreError, match=said):
        fresh.keep(key_of("new"), b"new bytes", "plain")
    monkeypatch.undo()
    assert not (root / "packs").exists() and not (root / "tmp").exists()
    fresh.keep(key_of("new"), b"new bytes", "plain")
    fresh.keep_many([(key_of(f"item {i}"), b"item %d" % i) for i in range(3)], "plain")
    again = LocalStore(root)
    assert again.have([key_of("new"), key_of("item 1")]) == {key_of("new"), key_of("item 1")}
    assert again.verify().ok


def test_gc_of_a_full_store_without_its_tmp_folder_removes_what_it_drops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc of a store on a disk too full to make a folder on, that lacks its empty tmp/
    (copied by a tool that drops empty folders), removes the answers it drops and the
    blobs nothing refers to: it failed, saying no space was left, for want of tmp/ to
    move them through, which is what a full disk needs gc for. It leaves nothing behind,
    and what it keeps reads back whole."""
    root = tmp_path / "store"
    store = LocalStore(root)
    old = store.keep(key_of("old"), b"used long ago", "plain")
    os.utime(root / "answers" / old.key[7:9] / old.key[7:], (1, 1))
    new = store.keep(key_of("new"), b"used just now", "plain")
    stray = store.put(b"referred to by nothing")
    store.close()
    (root / "tmp").rmdir()
    _refuse_writes(monkeypatch, _full)
    fresh = LocalStore(root)
    record = root / "answers" / new.key[7:9] / new.key[7:]
    done = fresh.gc(record.stat().st_size + new.size, grace=0)  # the newer answer is kept
    monkeypatch.undo()
    assert (done.answers, done.blobs) == (1, 2)
    assert not (root / "tmp").exists()
    again = LocalStore(root)
    assert again.have([old.key, new.key]) == {new.key}
    assert bytes(again.recall(new.key)[1]) == b"used just now"
    assert stray not in {"blake3:" + path.name for path in (root / "blobs").glob("*/*")}
    assert sorted(path.name for path in (root / "blobs").glob("*/*")) == [new.value[7:]]
    assert again.verify().ok


def test_a_read_only_store_says_so_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``writable()`` tells a store on a read-only filesystem from one this process may
    write, leaving nothing behind either way."""
    store = LocalStore(tmp_path / "store")
    assert store.writable()
    _mount_read_only(monkeypatch)
    assert not store.writable()
    monkeypatch.undo()
    assert not list((tmp_path / "store" / "tmp").iterdir())


def test_a_read_only_store_without_tmp_is_not_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only store copied without its empty tmp/ is not writable: the file cannot be
    made for want of tmp/, and tmp/ cannot be made."""
    store = LocalStore(tmp_path / "store")
    (tmp_path / "store" / "tmp").rmdir()
    monkeypatch.setattr(os, "mkdir", _read_only)
    assert not store.writable()
    monkeypatch.undo()
    assert store.writable()


def test_a_large_blob_hashed_while_written_is_named_by_its_content(tmp_path: Path) -> None:
    """A blob large enough to be hashed while it is written gets the digest of its bytes,
    reads back whole, and kept again leaves nothing behind in ``tmp/``."""
    data = os.urandom(1 << 10) * (17 << 10)  # 17 MiB
    store = LocalStore(tmp_path / "store")
    digest = store.put(data)
    assert digest == "blake3:" + blake3.blake3(data).hexdigest()
    assert store.put([data[:5], data[5:]]) == digest  # here already: the write is dropped
    assert not list((tmp_path / "store" / "tmp").iterdir())
    assert bytes(LocalStore(tmp_path / "store").get(digest)) == data


def test_a_large_blob_whose_hash_fails_raises_that_and_leaves_nothing_in_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large blob whose hash, on the hash thread, raises (out of memory) raises that error
    where it was put, leaves no written copy in ``tmp/``, and the next large blob is put."""
    real = _local_files.digest_of
    failing = [True]

    def hash_once_failing(pieces: Any, *hasher: Any) -> str:
        if failing.pop() if failing else False:
            raise MemoryError("no memory left to hash")
        return real(pieces, *hasher)

    monkeypatch.setattr(_local_files, "digest_of", hash_once_failing)
    data = os.urandom(1 << 10) * (17 << 10)  # 17 MiB
    store = LocalStore(tmp_path / "store")
    with pytest.raises(MemoryError, match="no memory left to hash"):
        store.put(data)
    assert not list((tmp_path / "store" / "tmp").iterdir())
    assert store.put(data) == "blake3:" + blake3.blake3(data).hexdigest()
    assert not list((tmp_path / "store" / "tmp").iterdir())


def test_a_large_blob_kept_once_the_pools_are_shut_down_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At interpreter exit the thread pools take no more work: a blob large enough to be
    hashed while it is written is then hashed on the calling thread, and kept whole."""
    closed = ThreadPoolExecutor(1)
    closed.shutdown()
    monkeypatch.setattr(_local_files, "_hashers", lambda: closed)
    data = os.urandom(1 << 10) * (17 << 10)  # 17 MiB
    store = LocalStore(tmp_path / "store")
    digest = store.put(data)
    assert digest == "blake3:" + blake3.blake3(data).hexdigest()
    assert not list((tmp_path / "store" / "tmp").iterdir())
    assert bytes(LocalStore(tmp_path / "store").get(digest)) == data


_LARGE_BLOB_AS_THE_INTERPRETER_FINALIZES = """
import gc, sys
from somatize.store import LocalStore
store = LocalStore(sys.argv[1])
data = bytes(17 << 20)
class Later:
    def __del__(self):
        print("finalizing", sys.is_finalizing(), flush=True)
        try:
            store.put(data)
        except BaseException:
            pass
        print("returned", flush=True)
gc.disable()  # collected as the interpreter finalizes
later = Later()
later.me = later
del later
"""


def test_a_large_blob_put_as_the_interpreter_finalizes_lets_the_process_exit(
    tmp_path: Path,
) -> None:
    """A large blob put by code a collection runs as the interpreter finalizes, in a process
    whose hash thread has not started, returns (the interpreter starts no thread then),
    and the process exits, rather than wait for ever on a thread that was to start the
    hash thread."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _LARGE_BLOB_AS_THE_INTERPRETER_FINALIZES, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as hung:
        said = hung.stdout.decode() if isinstance(hung.stdout, bytes) else hung.stdout
        pytest.fail(f"the process did not exit after a put as it finalized: {said}")
    assert done.stdout.splitlines() == ["finalizing True", "returned"], done.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]


def _put_interrupted(
    store: LocalStore,
    data: bytes,
    below: Callable[[Any], bool],
    landed: list[str],
    when: Callable[[], bool] = lambda: True,
    first: Callable[[], None] = lambda: None,
    at: Callable[[Any], bool] = lambda code: (
        code.co_filename == threading.__file__ and code.co_name == "__enter__"
    ),
) -> None:
    """``data`` put in ``store``, a Ctrl-C landing as the first call ``at`` says is the one
    (by default a lock ``threading``'s Python code takes) below a call ``below`` says is
    the one, once ``when`` holds, returns (after ``first``); the name of the call that
    returned noted in ``landed``."""

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if event != "call" or landed or not at(code) or not when():
            return None
        up = frame.f_back
        while up is not None and not below(up.f_code):
            up = up.f_back
        if up is None:
            return None

        def returning(frame: Any, event: str, arg: Any) -> Any:
            if event == "return" and not landed:
                landed.append(code.co_name)
                first()
                raise KeyboardInterrupt  # the Ctrl-C, the lock just taken
            return returning

        return returning

    sys.settrace(tracer)
    try:
        store.put(data)
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)


def _next_put_returns(store: LocalStore, data: bytes, landed: list[str]) -> None:
    """``data``, put in ``store`` on a thread of its own after a Ctrl-C ``landed``, is put
    under its digest rather than waiting for ever."""
    out: dict[str, str] = {}
    after = threading.Thread(target=lambda: out.update(digest=store.put(data)), daemon=True)
    after.start()
    after.join(60)
    assert not after.is_alive(), f"the next large blob waits for ever ({landed})"
    assert out["digest"] == "blake3:" + blake3.blake3(data).hexdigest()


_KEPT_AND_READ_AS_THE_INTERPRETER_FINALIZES = """
import gc, sys
from somatize.store import LocalStore
store = LocalStore(sys.argv[1])
kept = store.put(b"kept before")
class Later:
    def __del__(self):
        for data in (b"small" * 10, bytes(17 << 20)):
            try:
                print("put", store.put(data), flush=True)
            except BaseException as error:
                print("raised", type(error).__name__, error, flush=True)
        try:
            print("read", bytes(store.get(kept)).decode(), flush=True)
        except BaseException as error:
            print("raised", type(error).__name__, error, flush=True)
gc.disable()  # collected as the interpreter finalizes
later = Later()
later.me = later
del later
"""


def test_blobs_put_and_read_as_the_interpreter_finalizes_are_kept_and_read(
    tmp_path: Path,
) -> None:
    """Blobs put by code a collection runs as the interpreter finalizes — once builtins
    are put back as they were before ``io`` added ``open`` — are kept, small or large
    (hashed on the calling thread then), and a blob is read, rather than fail with
    NameError."""
    done = subprocess.run(
        [sys.executable, "-c", _KEPT_AND_READ_AS_THE_INTERPRETER_FINALIZES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    small, large = b"small" * 10, bytes(17 << 20)
    assert done.stdout.splitlines() == [
        f"put blake3:{blake3.blake3(small).hexdigest()}",
        f"put blake3:{blake3.blake3(large).hexdigest()}",
        "read kept before",
    ], done.stdout + done.stderr[-2000:]
    store = LocalStore(tmp_path)
    assert bytes(store.get(hash_bytes(small))) == small
    assert bytes(store.get(hash_bytes(large))) == large
    assert not list((tmp_path / "tmp").iterdir())


@pytest.mark.parametrize("pool", ["first", "running"])
def test_a_ctrl_c_as_a_large_blob_is_handed_to_the_hash_thread_leaves_the_next_put_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: str
) -> None:
    """A Ctrl-C landing as a large blob is handed to the thread that hashes it — in
    ``threading``'s Python code that takes a lock, once it is taken (the pool's count of
    idle threads, the start of its thread) — leaves no lock held: the next large blob is
    put, rather than wait for ever on that lock (and the process at exit)."""
    import concurrent.futures.thread as pool_module

    from somatize import _threads

    monkeypatch.setattr(_threads, "_pools", {})  # a pool of this test's own
    data = os.urandom(1 << 10) * (17 << 10)  # 17 MiB
    store = LocalStore(tmp_path / "store")
    if pool == "running":
        store.put(data[:-1])
    landed: list[str] = []

    _put_interrupted(
        store,
        data,
        lambda code: code.co_name == "submit" and code.co_filename == pool_module.__file__,
        landed,
    )
    _next_put_returns(store, data[1:], landed)


def test_a_ctrl_c_as_a_large_blob_waits_for_its_hash_leaves_the_next_put_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C landing as a large blob, written, waits for the hash thread still hashing
    it — in ``threading``'s Python code that takes a lock, once it is taken — leaves no
    lock held that the hash thread needs to hand its digest over: the next large blob is
    put, rather than wait for ever behind a hash thread that waits for ever."""
    from somatize import _threads

    monkeypatch.setattr(_threads, "_pools", {})  # a pool of this test's own
    hashing, let_go = threading.Event(), threading.Event()
    real = _local_files.digest_of

    def slow(pieces: Any, *hasher: Any) -> str:
        if not hashing.is_set():
            hashing.set()
            let_go.wait(5)  # still hashing as the writer waits for it
        return real(pieces, *hasher)

    monkeypatch.setattr(_local_files, "digest_of", slow)
    data = os.urandom(1 << 10) * (17 << 10)  # 17 MiB
    store = LocalStore(tmp_path / "store")
    landed: list[str] = []
    try:
        _put_interrupted(
            store,
            data,
            lambda code: code.co_name == "_put_large",
            landed,
            when=hashing.is_set,
            first=let_go.set,
        )
    finally:
        let_go.set()
    _next_put_returns(store, data[1:], landed)


def test_a_ctrl_c_as_a_large_blob_is_queued_for_its_hash_leaves_the_next_put_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C landing as a large blob is handed to the thread that hashes it, once its
    hash is queued there (as the pool's submit returns), leaves that thread free: it
    takes no runs of a write that never began, and the next large blob is put, rather
    than wait for ever behind it."""
    import concurrent.futures.thread as pool_module

    from somatize import _threads

    monkeypatch.setattr(_threads, "_pools", {})  # a pool of this test's own
    data = os.urandom(_local_files._OVERLAP + 1)
    store = LocalStore(tmp_path / "store")
    landed: list[str] = []
    _put_interrupted(
        store,
        data,
        lambda code: code.co_name == "_put_large",
        landed,
        at=lambda code: code.co_name == "submit" and code.co_filename == pool_module.__file__,
    )
    assert landed == ["submit"]
    _next_put_returns(store, data[1:], landed)


# -- names and signatures ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../../etc/passwd", "/abs", "a/./b", "bell\x07", "x/"])
def test_hostile_names_refused_on_resolve(tmp_path: Path, name: str) -> None:
    """A name that could escape the store is refused before any file is touched."""
    with pytest.raises(BadName, match="name"):
        Store(tmp_path / "store").resolve(name)


def test_missing_name_says_how_to_bind(tmp_path: Path) -> None:
    """Resolving a name nobody bound is NameNotFound, naming the call that binds it."""
    with pytest.raises(NameNotFound, match=r"store\.bind\('sms/v2'"):
        Store(tmp_path / "store").resolve("sms/v2")


def test_unsigned_answer_refused_in_signed_store(tmp_path: Path) -> None:
    """A signed store does not have, and will not recall, an answer written without its key,
    and says the key is given as `signing_key=` or in the environment."""
    key = key_of("answer")
    LocalStore(tmp_path / "store").keep(key, b"planted", "plain")
    signed = LocalStore(tmp_path / "store", signing_key="s3cret")
    assert signed.have([key]) == set()
    with pytest.raises(Unsigned, match="carries no signature") as refused:
        signed.recall(key)
    assert "`signing_key=` or in SOMATIZE_STORE_KEY" in str(refused.value)
    signed.keep(key, b"honest", "plain")
    assert bytes(LocalStore(tmp_path / "store", signing_key="s3cret").recall(key)[1]) == b"honest"


def test_other_key_refused(tmp_path: Path) -> None:
    """An answer, pack or name signed with another key is refused, as if absent."""
    store = LocalStore(tmp_path / "store", signing_key="one")
    whole, item = key_of("whole"), key_of("item")
    store.keep(whole, b"w", "plain")
    store.keep_many([(item, b"i"), (key_of("other"), b"o")], "plain")
    store.bind("data/x", store.put(b"x"))
    other = LocalStore(tmp_path / "store", signing_key="two")
    assert other.have([whole, item]) == set()
    with pytest.raises(Unsigned, match="does not match this store's key"):
        other.recall(whole)
    with pytest.raises(Unsigned, match="does not match"):
        other.resolve("data/x")
    assert LocalStore(tmp_path / "store", signing_key="one").have([whole, item]) == {whole, item}


def test_a_signed_name_copied_over_another_is_refused(tmp_path: Path) -> None:
    """A name's signature covers the name: the signed file of one name copied over another's
    (by someone who can write the store but holds no key) is refused, not followed."""
    store = LocalStore(tmp_path / "store", signing_key="team")
    store.bind("model/prod", store.put(b"trusted"))
    store.bind("scratch/untrusted", store.put(b"anything"))
    names = tmp_path / "store" / "names"
    (names / "model" / "prod").write_bytes((names / "scratch" / "untrusted").read_bytes())
    with pytest.raises(Unsigned, match="does not match"):
        LocalStore(tmp_path / "store", signing_key="team").resolve("model/prod")
    assert store.get(store.resolve("scratch/untrusted")) == b"anything"


@pytest.mark.parametrize("signing_key", [None, "team"])
def test_a_name_differing_only_in_case_from_a_bound_one_is_refused(
    tmp_path: Path, signing_key: str | None
) -> None:
    """Where the filesystem does not tell case apart (macOS, Windows), `sms/train` is the
    file of `sms/Train`: it is not resolved to that name's digest, and binding it is
    refused, naming both, rather than replacing that name's binding; signed or not. (This
    filesystem tells case apart: the file is copied where the other would find it.)"""
    store = LocalStore(tmp_path / "store", signing_key=signing_key)
    mixed, lower = store.put(b"bound as sms/Train"), store.put(b"meant for sms/train")
    store.bind("sms/Train", mixed)
    names = tmp_path / "store" / "names" / "sms"
    shutil.copy(names / "Train", names / "train")
    with pytest.raises(Corrupt, match=r"`sms/train` (holds another name's|has a signature that)"):
        store.resolve("sms/train")
    with pytest.raises(BadName, match=r"`sms/Train` is bound, which differs from it only in case"):
        store.bind("sms/train", lower)
    assert (names / "train").read_bytes() == (names / "Train").read_bytes()
    assert LocalStore(tmp_path / "store", signing_key=signing_key).resolve("sms/Train") == mixed


def test_names_differing_only_in_case_both_bound_before_stay_bound(tmp_path: Path) -> None:
    """A store an earlier somatize made on a filesystem that tells case apart, holding
    `Data/v1` and `data/v1` both, resolves and binds each again as before: only a spelling
    the store lacks is refused."""
    store = LocalStore(tmp_path / "store")
    one, two = store.put(b"Data/v1"), store.put(b"data/v1")
    store.bind("Data/v1", one)
    names = tmp_path / "store" / "names"
    (names / "data").mkdir()
    (names / "data" / "v1").write_bytes(records.encode_name("data/v1", two, None))
    store.bind("data/v1", two)
    store.bind("Data/v1", one)
    assert (store.resolve("Data/v1"), store.resolve("data/v1")) == (one, two)
    with pytest.raises(BadName, match=r"`data/v1` is bound, which differs from it only in case"):
        store.bind("data/V1", one)


def test_a_name_over_which_another_names_file_was_copied_is_bound_once_it_is_removed(
    tmp_path: Path,
) -> None:
    """Binding a name whose file holds another name's binding (copied over it by hand) is
    refused, saying to remove the file; once removed, the name is bound."""
    store = LocalStore(tmp_path / "store")
    store.bind("data/v1", store.put(b"one"))
    two = store.put(b"two")
    copied = tmp_path / "store" / "names" / "data" / "v2"
    shutil.copy(tmp_path / "store" / "names" / "data" / "v1", copied)
    with pytest.raises(BadName, match=r"names/data/v2 holds another name's binding.*Remove"):
        store.bind("data/v2", two)
    copied.unlink()
    store.bind("data/v2", two)
    assert LocalStore(tmp_path / "store").resolve("data/v2") == two


def test_a_signed_name_over_which_another_names_file_was_copied_is_bound_again(
    tmp_path: Path,
) -> None:
    """In a store that signs, binding a name again replaces a file it does not trust (the
    signed file of another name, copied over it, which names no name its folder holds
    in another case): binding again is how such a name is made good."""
    store = LocalStore(tmp_path / "store", signing_key="team")
    store.bind("model/prod", store.put(b"trusted"))
    store.bind("scratch/other", store.put(b"anything"))
    names = tmp_path / "store" / "names"
    shutil.copy(names / "scratch" / "other", names / "model" / "prod")
    trusted = store.put(b"trusted")
    store.bind("model/prod", trusted)
    assert LocalStore(tmp_path / "store", signing_key="team").resolve("model/prod") == trusted


def test_names_read_across_signed_and_unsigned_stores(tmp_path: Path) -> None:
    """A name signed with a key resolves in the same store opened without one (its signature
    cannot be checked there, and is passed over); a name bound without a key is refused by
    a store that signs, as carrying no signature: its check is no signature."""
    signed = LocalStore(tmp_path / "store", signing_key="team")
    digest = signed.put(b"rows")
    signed.bind("data/signed", digest)
    plain = LocalStore(tmp_path / "store")
    assert plain.resolve("data/signed") == digest
    plain.bind("data/plain", digest)
    with pytest.raises(Unsigned, match="carries no signature"):
        LocalStore(tmp_path / "store", signing_key="team").resolve("data/plain")


def test_key_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SOMATIZE_STORE_KEY makes a store sign; a reader without it still reads, a reader
    with another key refuses."""
    monkeypatch.setenv("SOMATIZE_STORE_KEY", "from-env")
    key = key_of("env")
    LocalStore(tmp_path / "store").keep(key, b"v", "plain")
    monkeypatch.setenv("SOMATIZE_STORE_KEY", "different")
    assert LocalStore(tmp_path / "store").have([key]) == set()
    monkeypatch.delenv("SOMATIZE_STORE_KEY")
    assert LocalStore(tmp_path / "store").have([key]) == {key}


def test_unwritable_store_is_a_clear_error(tmp_path: Path) -> None:
    """A store whose directory cannot be made, or is a file, says where and why: the file
    in its way, not the folder under it that could not be made."""
    file = tmp_path / "file"
    file.write_bytes(b"")
    for where in (file, file / "store"):
        with pytest.raises(
            StoreError, match=f"cannot use .*: {re.escape(str(file))} is a file, not a directory"
        ):
            LocalStore(where)


def test_nothing_is_unpickled(tmp_path: Path) -> None:
    """A pickle planted as a record is refused as unreadable, never loaded."""
    import pickle

    key = key_of("pickle")
    store = LocalStore(tmp_path / "store")
    store.keep(key, b"v", "plain")
    store.answer_path(key).write_bytes(pickle.dumps({"key": key, "exec": uuid.uuid4()}))
    assert LocalStore(store.root).have([key]) == set()


def test_a_large_blob_changed_in_place_is_caught(tmp_path: Path) -> None:
    """A large blob is read afresh for each read, and hashed once; bytes changed in its
    file afterwards (same inode, same size, a later time) are caught by its digest at the
    next read, not returned."""
    from somatize.store import Corrupt

    store = LocalStore(tmp_path)
    data = bytes(range(256)) * 1024  # 256 KiB: read into page-aligned memory
    digest = store.put(data)
    assert bytes(store.get(digest)) == data
    assert store.get(digest).obj is not store.get(digest).obj  # memory of its own per read
    path = tmp_path / "blobs" / digest[7:9] / digest[7:]
    with open(path, "r+b") as handle:
        handle.seek(1000)
        handle.write(b"\xff")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    with pytest.raises(Corrupt, match="hashes to"):
        store.get(digest)


def test_a_large_value_read_is_not_changed_through_its_file(tmp_path: Path) -> None:
    """What a read of a large blob hands out is memory of the reader's own, not a map of
    the file: the file rewritten in place after the read, its mtime put back as it was,
    leaves what was read as it was; and the next read in the same process, which knew the
    file as hashed, sees the write (its ctime moved) and refuses it."""
    store = LocalStore(tmp_path)
    data = bytes(range(256)) * 1024
    digest = store.put(data)
    read = store.get(digest)
    path = tmp_path / "blobs" / digest[7:9] / digest[7:]
    stat = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(4096)
        handle.write(b"\xff" * 4096)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_mtime_ns == stat.st_mtime_ns
    assert bytes(read) == data
    with pytest.raises(Corrupt, match="hashes to"):
        store.get(digest)


_TRUNCATED_AFTER_READ = """
import os, sys
from somatize.store import LocalStore
store = LocalStore(sys.argv[1])
data = bytes(range(256)) * 1024
digest = store.put(data)
read = store.get(digest)
os.truncate(os.path.join(sys.argv[1], "blobs", digest[7:9], digest[7:]), 0)
print(bytes(read) == data)
"""


def test_a_large_value_read_outlives_its_file_truncated(tmp_path: Path) -> None:
    """A large blob's file truncated after it was read leaves what was read whole (a map
    of the file would fault when read, ending the process)."""
    done = subprocess.run(
        [sys.executable, "-c", _TRUNCATED_AFTER_READ, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr[-2000:]


def _get_in_child(root: str, digest: str) -> str:
    data = Store(root).get(digest)  # verified: hashed again in this process
    return hash_bytes(data)


def test_a_forked_child_reads_what_its_parent_hashed(tmp_path: Path) -> None:
    """A child forked after its parent hashed on several threads (a DataLoader worker of a
    loop that read a store) hashes too, rather than waiting on threads it does not have."""
    store = Store(tmp_path)
    digest = store.put(os.urandom(4 << 20))
    assert hash_bytes(store.get(digest)) == digest
    assert in_forked_child(_get_in_child, str(tmp_path), digest, timeout=60) == digest


def _keep_and_recall_in_child(store: Store, data: bytes) -> bool:
    key = key_of("kept by a forked child")
    store.keep(key, data, "plain")
    packed = [(key_of(f"packed by a forked child {i}"), data[:100]) for i in range(3)]
    store.keep_many(packed, "plain")
    fresh = Store(store.root)
    found = [bytes(fresh.recall(k)[1]) for k in [key] + [k for k, _ in packed]]
    return found == [data] + [data[:100]] * 3


@pytest.mark.parametrize("held", ["lock", "removal"])
def test_a_child_forked_while_another_thread_holds_the_store_uses_it(
    tmp_path: Path, held: str
) -> None:
    """A child forked while another thread of its parent holds the store object's lock (a
    writer adopting the pack it published) or is removing a blob (a gc) keeps, packs and
    recalls through that object: it waits for no thread it does not have."""
    store = Store(tmp_path)
    data = os.urandom(5000)
    store.keep_many([(key_of("packed by the parent"), b"in a pack")], "plain")  # a pack held
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        if held == "lock":
            with store._lock:
                holding.set()
                done.wait(timeout=120)
        else:
            with store._removing_blobs({hash_bytes(data)}):
                holding.set()
                done.wait(timeout=120)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert holding.wait(timeout=30)
    try:
        assert in_forked_child(_keep_and_recall_in_child, store, data, timeout=60)
    finally:
        done.set()
        thread.join(timeout=30)
    assert Store(tmp_path).recall(key_of("kept by a forked child"))[1] == data


# -- files planted where a store keeps its own ------------------------------------------------


def _read_what_was_planted(root: str, key: str, digest: str, pack: str) -> list[str]:
    """What each reader of the signed store at ``root`` says of the devices and FIFOs
    planted there, read in a child that may not grow past a GiB more: a read to the end of
    ``/dev/zero`` fails it (MemoryError) rather than fill the machine."""
    import resource

    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) << 10 for line in status if line.startswith("VmSize"))
    resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))

    def said(call: Any) -> str:
        try:
            return repr(call())
        except Exception as why:  # what a reader says: the test compares it
            return type(why).__name__

    def fresh() -> LocalStore:
        return LocalStore(root, signing_key="team secret")

    return [
        said(lambda: fresh().have([key])),
        said(lambda: fresh().recall(key)),
        said(lambda: fresh().resolve("zero")),
        said(lambda: fresh().resolve("fifo")),
        said(lambda: fresh().get(digest)),
        said(lambda: fresh().get(pack)),
        said(lambda: fresh().have([key_of("looked for among the packs")])),
        said(lambda: fresh().verify().records),
        said(lambda: fresh().gc(10**9, grace=0).answers),
    ]


def test_a_device_or_fifo_planted_in_a_store_is_damage_never_read(tmp_path: Path) -> None:
    """A symlink to ``/dev/zero`` or a FIFO planted where a record, name, blob or pack index
    is looked for, in a signed store, is no file a store writes: readers take it as
    damage or absence (the record a miss, the name unbound, the blob Corrupt), never wait
    on it or read it to no end; verify and gc pass it over."""
    root = tmp_path / "store"
    store = LocalStore(root, signing_key="team secret")
    store.keep(key_of("whole"), b"a whole answer", "plain")
    key = "blake3:" + "ab" * 32
    (root / "answers" / "ab").mkdir()
    os.symlink("/dev/zero", root / "answers" / "ab" / ("ab" * 32))
    os.symlink("/dev/zero", root / "names" / "zero")
    os.mkfifo(root / "names" / "fifo")
    digest, pack = "blake3:" + "cd" * 32, "blake3:" + "ef" * 32
    (root / "blobs" / "cd").mkdir()
    os.symlink("/dev/zero", root / "blobs" / "cd" / ("cd" * 32))
    (root / "blobs" / "ef").mkdir()
    os.mkfifo(root / "blobs" / "ef" / ("ef" * 32))
    os.symlink("/dev/zero", root / "packs" / ("01" * 32))
    said = in_forked_child(_read_what_was_planted, str(root), key, digest, pack, timeout=30)
    assert said == [
        "set()",
        "Corrupt",
        "NameNotFound",
        "NameNotFound",
        "Corrupt",
        "Corrupt",
        "set()",
        "1",
        "0",
    ]
    assert bytes(LocalStore(root, signing_key="team secret").recall(key_of("whole"))[1]) == (
        b"a whole answer"
    )


@needs_fork
def test_a_pack_cut_short_while_a_borrowed_read_first_verifies_it_is_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack a per-row cache borrows (read by a map it keeps), cut short while its first
    read in a process hashes it, is Corrupt for each item in it, not a crash (SIGBUS):
    it is hashed through reads before it is mapped."""
    store = LocalStore(tmp_path / "s")
    items = [(f"blake3:{i:064x}", [bytes([i]) * (300 << 10)]) for i in range(3)]
    store.keep_many(items, "plain")
    keys = [key for key, _ in items]
    pack = max((tmp_path / "s" / "blobs").rglob("*"), key=lambda p: p.stat().st_size)
    assert pack.stat().st_size >= 3 * (300 << 10)

    def borrow() -> str:
        cut_short_when_hashed(monkeypatch, pack)
        got = LocalStore(tmp_path / "s").recall_many(keys, borrow=True)
        return " ".join(type(got[key]).__name__ for key in keys)

    assert answer_of(*forked(borrow)) == "Corrupt Corrupt Corrupt"


@pytest.mark.parametrize(("binding", "meanwhile"), [("sms", "sms/train"), ("sms/train", "sms")])
def test_a_name_bound_meanwhile_above_or_under_is_refused_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, binding: str, meanwhile: str
) -> None:
    """A bind that another process races, binding a name above or under it after the bind
    looked for one, is refused as a name that would hold names (BadName, saying what to
    do), not a StoreError about a rename into a folder; the other name stays bound."""
    store, other = LocalStore(tmp_path / "store"), LocalStore(tmp_path / "store")
    digest = store.put(b"rows")
    soon = _local_files._soon
    raced: list[str] = []

    def racing(found: Any) -> bool:
        if not raced:  # after the bind looked for names above and under it
            raced.append(meanwhile)
            other.bind(meanwhile, digest)
        return soon(found)

    monkeypatch.setattr(_local_files, "_soon", racing)
    with pytest.raises(BadName, match="cannot also hold names under it"):
        store.bind(binding, digest)
    monkeypatch.undo()
    assert raced == [meanwhile]
    assert LocalStore(tmp_path / "store").resolve(meanwhile) == digest
    assert os.listdir(tmp_path / "store" / "tmp") == []


# -- answers kept anew elsewhere ---------------------------------------------------------------


def _collected_elsewhere(root: Path, keys: list[str]) -> None:
    """Removes what ``keys`` are answered by from ``root`` as a gc of another process evicts
    them: each record or pack index, then its blob."""
    other = LocalStore(root)
    for key in keys:
        answer = other.answer(key)
        assert answer is not None
        for index in (root / "packs").iterdir():
            if answer.value[7:].encode() in index.read_bytes():
                index.unlink()
        other.answer_path(key).unlink(missing_ok=True)
        other.blob_path(answer.value).unlink(missing_ok=True)


def test_an_answer_collected_and_kept_anew_elsewhere_is_found_by_a_reader_that_knew_it(
    tmp_path: Path,
) -> None:
    """A reader that read an answer, whose answer another process's gc evicted and another
    writer kept anew since (as a pack, where it was whole), finds the answer kept anew:
    ``have`` says yes and ``recall``/``recall_many`` give it, not Missing for what it
    remembered."""
    root = tmp_path / "store"
    keys = [key_of(f"row/{i}") for i in range(3)]
    rows = {key: value_of(key, 300 << 10) for key in keys}
    reader, writer = LocalStore(root), LocalStore(root)
    for key in keys:
        writer.keep(key, rows[key], "plain")
    assert reader.have(keys) == set(keys)
    assert bytes(reader.recall(keys[0])[1]) == rows[keys[0]]
    got = reader.recall_many(keys[1:])
    assert all(bytes(got[key][1]) == rows[key] for key in keys[1:])  # type: ignore[index]

    _collected_elsewhere(root, keys)
    LocalStore(root).keep_many([(key, rows[key]) for key in keys], "plain")
    assert reader.recall(keys[0])[1] == rows[keys[0]]
    assert reader.have(keys[1:2]) == {keys[1]}
    got = reader.recall_many(keys[1:])
    assert {key: bytes(got[key][1]) for key in keys[1:]} == {key: rows[key] for key in keys[1:]}  # type: ignore[index]

    _collected_elsewhere(root, keys)
    for key in keys:
        LocalStore(root).keep(key, rows[key], "plain")
    got = reader.recall_many(keys[1:])
    assert {key: bytes(got[key][1]) for key in keys[1:]} == {key: rows[key] for key in keys[1:]}  # type: ignore[index]
    assert bytes(reader.recall(keys[0])[1]) == rows[keys[0]]


def _gc_elsewhere_takes_writes(
    monkeypatch: pytest.MonkeyPatch, root: Path, times: int
) -> list[str]:
    """Has a gc with no grace, of another store object (as of another process), run just
    after each of the next ``times`` writes to ``tmp/`` is written, before it is renamed;
    the list of what it took grows as it does."""
    write = LocalStore._write_temporary
    taken: list[str] = []

    def written_then_collected(self: LocalStore, *args: Any) -> os.stat_result:
        stat = write(self, *args)
        if len(taken) < times:
            taken.append(args[-1])
            LocalStore(root).gc(grace=0)
        return stat

    monkeypatch.setattr(LocalStore, "_write_temporary", written_then_collected)
    return taken


def test_a_write_a_gc_elsewhere_takes_from_tmp_is_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer whose write a gc of another process with no grace removes from ``tmp/``
    before it is renamed is written again and kept, not a StoreError about a file not
    found."""
    root = tmp_path / "store"
    store = LocalStore(root)
    key = key_of("taken")
    taken = _gc_elsewhere_takes_writes(monkeypatch, root, 1)
    store.keep(key, b"an answer", "plain")
    assert len(taken) == 1 and not os.path.exists(taken[0])
    assert bytes(LocalStore(root).recall(key)[1]) == b"an answer"
    assert os.listdir(root / "tmp") == []


@pytest.mark.parametrize("size", [10, 16 << 20])
def test_a_write_a_gc_elsewhere_keeps_taking_from_tmp_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A write taken from ``tmp/`` each time it is written (a large blob's, written once)
    says a gc with no grace took it, and what to do; nothing is published or left."""
    root = tmp_path / "store"
    store = LocalStore(root)
    _gc_elsewhere_takes_writes(monkeypatch, root, 10)
    with pytest.raises(StoreError, match=r"removed from tmp/ .* no grace \(`--grace 0`\)"):
        store.put(b"x" * size)
    assert os.listdir(root / "tmp") == []
    assert [path for path in (root / "blobs").rglob("*") if path.is_file()] == []


def _run_on_store(script: str, root: Path) -> subprocess.CompletedProcess[str]:
    """``script`` run by another Python, handed the store's ``root``: for limits (as
    ``setrlimit`` sets) this process must not take on."""
    return subprocess.run(
        [sys.executable, "-c", script, str(root)],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


_KEPT_UNDER_A_FILE_SIZE_LIMIT = """
import os, resource, signal, sys
from somatize.store import LocalStore, StoreError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
store = LocalStore(sys.argv[1])
for size in (60_000, 20 << 20):
    try:
        store.put(b"x" * size)
    except StoreError as why:
        print(why)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="sets RLIMIT_FSIZE")
def test_a_file_larger_than_may_be_written_is_a_clear_error(tmp_path: Path) -> None:
    """A blob larger than the process may write (``ulimit -f``; a FAT32 disk says the same)
    is a StoreError saying why and what to do, small or large; nothing is left behind."""
    root = tmp_path / "store"
    done = _run_on_store(_KEPT_UNDER_A_FILE_SIZE_LIMIT, root)
    said = done.stdout.splitlines()
    assert len(said) == 2, done
    for line in said:
        assert "larger than this process may write or the filesystem holds" in line
        assert "ulimit -f" in line and "Nothing half-written was left" in line
    assert os.listdir(root / "tmp") == []
    assert [path for path in (root / "blobs").rglob("*") if path.is_file()] == []


_USED_WITH_NO_FILE_LEFT_TO_OPEN = """
import os, resource, sys
from somatize.store import LocalStore, StoreError
kept = LocalStore(sys.argv[1]).put(b"kept " * 100)
store = LocalStore(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
for use in (lambda: store.put(b"new " * 100), lambda: store.get(kept)):
    try:
        use()
    except StoreError as why:
        print(why)
for fd in held:
    os.close(fd)
print(bytes(store.get(kept)) == b"kept " * 100)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="sets RLIMIT_NOFILE")
def test_a_process_with_no_file_left_to_open_is_told_to_raise_its_limit(tmp_path: Path) -> None:
    """A write or a read in a process holding as many files open as it may (a loader's
    workers sharing tensors through files, a low ``ulimit -n``) is a StoreError saying so
    and what to do, not a raw error taken for the store's fault; nothing is left behind,
    nothing set aside, and once files are closed the store reads as before."""
    root = tmp_path / "store"
    done = _run_on_store(_USED_WITH_NO_FILE_LEFT_TO_OPEN, root)
    said = done.stdout.splitlines()
    assert len(said) == 3 and said[-1] == "True", done
    for line in said[:2]:
        assert "as many files open as it may" in line and "ulimit -n" in line
    assert os.listdir(root / "tmp") == []
    assert not (root / "quarantine").exists() or not any((root / "quarantine").rglob("*"))


def test_a_pack_published_in_the_tick_its_folder_was_listed_in_is_found_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack another process publishes just after a reader listed ``packs/``, within the
    same tick of the filesystem's clock (which leaves the folder's time as it was), is
    found by that reader later on, not taken for absent for as long as nothing else is
    published."""
    root = tmp_path / "store"
    writer, reader = LocalStore(root), LocalStore(root)
    first = [(key_of(f"first/{i}"), b"first") for i in range(2)]
    second = [(key_of(f"second/{i}"), b"second") for i in range(2)]
    writer.keep_many(first, "plain")
    packs = root / "packs"
    tick = packs.stat().st_mtime_ns
    now = [tick + 1_000_000]  # the reader lists packs/ in the tick of its last change
    monkeypatch.setattr(local, "time", SimpleNamespace(time_ns=lambda: now[0]))
    assert reader.have([first[0][0]]) == {first[0][0]}
    writer.keep_many(second, "plain")
    os.utime(packs, ns=(packs.stat().st_atime_ns, tick))  # in that same tick
    now[0] = tick + 3_000_000_000
    keys = [key for key, _ in second]
    assert reader.have(keys) == set(keys)
    got = reader.recall_many(keys)
    assert [bytes(got[key][1]) for key in keys] == [b"second", b"second"]  # type: ignore[index]


@pytest.mark.parametrize("when", ["a tick later", "in the same tick", "beside another record"])
def test_a_record_kept_after_a_reader_looked_for_it_is_found_by_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A reader that looked for a key in ``answers/`` (found empty, it reads no record file
    per key it does not have) finds the record another process keeps after that: in a
    later tick of the filesystem's clock, in the very tick it listed the folder in, or in
    a shard folder that was there already, which leaves the folder's time as it was."""
    root = tmp_path / "store"
    writer, reader = LocalStore(root), LocalStore(root)
    key = key_of("kept/later")
    if when == "beside another record":
        other = next(
            label for i in range(10_000) if (label := key_of(f"other/{i}"))[7:9] == key[7:9]
        )
        writer.keep(other, b"other", "plain")
    answers = root / "answers"
    stamp = answers.stat().st_mtime_ns
    now = [stamp + (1_000_000 if when == "in the same tick" else 3_000_000_000)]
    monkeypatch.setattr(local, "time", SimpleNamespace(time_ns=lambda: now[0]))
    assert reader.have([key]) == set()
    assert reader.have([key]) == set()  # looked at again: still nothing there
    writer.keep(key, b"kept", "plain")
    if when == "in the same tick":
        os.utime(answers, ns=(answers.stat().st_atime_ns, stamp))
    elif when == "beside another record":
        assert answers.stat().st_mtime_ns == stamp
    now[0] = stamp + 6_000_000_000
    assert reader.have([key]) == {key}
    assert bytes(reader.recall(key)[1]) == b"kept"


def test_a_local_store_remembers_hashing_a_bounded_number_of_blobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local store that keeps and reads many blobs over a long run (an answer each)
    remembers having hashed at most ``_VERIFIED_HELD`` of them, not each one for as long as it
    lives; a blob it let go of is hashed again as it is read, and read whole, and one damaged
    since is refused."""
    monkeypatch.setattr(_local_files, "_VERIFIED_HELD", 8)
    store = LocalStore(tmp_path / "store")
    blobs = {store.put(b"%d" % i * 70_000): b"%d" % i * 70_000 for i in range(40)}
    assert len(store._verified) <= 8
    for digest, data in blobs.items():
        assert bytes(store.get(digest)) == data
    assert len(store._verified) <= 8
    first = next(iter(blobs))
    assert store.verified_stamp(first) is None
    path = store.blob_path(first)
    damaged = bytearray(path.read_bytes())
    damaged[0] ^= 1
    path.write_bytes(bytes(damaged))
    with pytest.raises(Corrupt, match="hashes to"):
        store.get(first)
