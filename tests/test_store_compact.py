"""Compaction merges many small packs into a few large ones and removes the small ones
only once that is safe: every row is recalled, and never a wrong one, whenever it stops."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from somatize.cli import main
from somatize.store import (
    BucketStore,
    KeyMismatch,
    LocalStore,
    Missing,
    Store,
    StoreError,
)
from somatize.store.records import PackIndex
from tests.conftest_s3 import s3_options, s3_url

BATCHES = 8
ROWS = 5


def key_of(number: int) -> str:
    return f"blake3:{number:064x}"


def row_of(number: int) -> bytes:
    return f"row {number} ".encode() * 3


def _kept_in_batches(store: Store, batches: int = BATCHES, first: int = 0) -> dict[str, bytes]:
    """Keeps ``batches`` batches of rows, one pack each, as a row cache in a worker does."""
    kept: dict[str, bytes] = {}
    for batch in range(batches):
        numbers = range(first + batch * ROWS, first + (batch + 1) * ROWS)
        rows = [(key_of(n), row_of(n)) for n in numbers]
        store.keep_many(rows, "plain")
        kept.update(rows)
    return kept


def _packs(root: Path) -> list[str]:
    return sorted(path.name for path in (root / "packs").iterdir())


def _recalled(store: Store, kept: dict[str, bytes]) -> dict[str, bytes]:
    return {key: bytes(store.recall(key)[1]) for key in kept}


def test_compaction_merges_packs_and_every_row_is_recalled(tmp_path: Path) -> None:
    """Eight packs become one: a fresh store recalls every row, alone and many at once."""
    store = LocalStore(tmp_path)
    kept = _kept_in_batches(store)
    assert len(_packs(tmp_path)) == BATCHES
    done = store.compact(grace=0)
    assert (done.merged, done.written, done.removed) == (BATCHES, 1, BATCHES)
    assert len(_packs(tmp_path)) == 1
    store.gc(grace=0)  # the small packs' blobs, which nothing refers to now
    fresh = LocalStore(tmp_path)
    assert _recalled(fresh, kept) == kept
    many = LocalStore(tmp_path).recall_many(list(kept))
    assert {key: bytes(found[1]) for key, found in many.items()} == kept  # type: ignore[index]
    assert LocalStore(tmp_path).verify().ok


def test_small_packs_stay_until_their_replacement_is_older_than_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replaced pack is removed only at a compaction once the new one is ``grace`` old."""
    store = LocalStore(tmp_path)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 7200)  # kept two hours ago
    kept = _kept_in_batches(store)
    monkeypatch.undo()
    done = store.compact(grace=3600)
    assert (done.written, done.removed, done.waiting) == (1, 0, BATCHES)
    assert len(_packs(tmp_path)) == BATCHES + 1
    assert _recalled(LocalStore(tmp_path), kept) == kept
    again = store.compact(grace=3600)  # nothing merged twice meanwhile
    assert (again.written, again.removed, again.waiting) == (0, 0, BATCHES)
    merged = max(_packs(tmp_path), key=lambda name: (tmp_path / "packs" / name).stat().st_size)
    os.utime(tmp_path / "packs" / merged, (1, 1))  # as if published long ago
    late = store.compact(grace=3600)
    assert (late.removed, late.waiting) == (BATCHES, 0)
    assert _packs(tmp_path) == [merged]
    assert _recalled(LocalStore(tmp_path), kept) == kept


def test_a_reader_holding_old_indexes_finds_rows_in_the_new_pack(tmp_path: Path) -> None:
    """A store object that adopted the small packs before they and their blobs were removed
    reads each row from the merged pack: no miss, no wrong answer."""
    kept = _kept_in_batches(LocalStore(tmp_path))
    reader = LocalStore(tmp_path)
    first = next(iter(kept))
    assert bytes(reader.recall(first)[1]) == kept[first]  # adopts every small pack
    LocalStore(tmp_path).compact(grace=0)
    LocalStore(tmp_path).gc(grace=0)
    assert _recalled(reader, kept) == kept
    other = LocalStore(tmp_path)
    other.recall(first)
    LocalStore(tmp_path).keep_many([(key_of(999), b"later")], "plain")
    many = other.recall_many(list(kept))
    assert {key: bytes(found[1]) for key, found in many.items()} == kept  # type: ignore[index]


def test_the_newest_answer_still_wins(tmp_path: Path) -> None:
    """A key kept again (a record, or a newer pack outside what is merged) keeps its newest
    answer through a compaction; the packs holding it are left as they are."""
    store = LocalStore(tmp_path)
    kept = _kept_in_batches(store, BATCHES // 2)
    # Kept again before the last packs: a merged pack stamped after those would win, were
    # the packs holding these keys merged.
    store.keep(key_of(0), b"x" * 10, "plain", "code-v2")  # a record, newer than its pack
    store.keep_many([(key_of(ROWS), b"newer"), (key_of(500), b"apart")], "plain", "code-v2")
    kept.update(_kept_in_batches(store, BATCHES // 2, first=ROWS * BATCHES // 2))
    store.compact(grace=0)
    store.gc(grace=0)
    fresh = LocalStore(tmp_path)
    assert bytes(fresh.recall(key_of(0))[1]) == b"x" * 10
    assert bytes(fresh.recall(key_of(ROWS))[1]) == b"newer"
    rest = {key: row for key, row in kept.items() if key not in (key_of(0), key_of(ROWS))}
    assert _recalled(fresh, rest) == rest
    assert len(_packs(tmp_path)) == 4  # the merged one, the two with a kept-again key, the newer


def test_a_writer_adding_packs_during_compaction_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packs published while a compaction merges (after it listed the store) stay, and
    their rows are recalled, new keys and keys kept again alike."""
    store = LocalStore(tmp_path)
    kept = _kept_in_batches(store)
    writer = LocalStore(tmp_path)
    put = LocalStore._put
    late: dict[str, bytes] = {}

    def put_while_writing(self: LocalStore, data: Any, claims: list[str]) -> str:
        if self is store and not late:
            late.update(_kept_in_batches(writer, 2, first=1000))
            late[key_of(1)] = b"kept again"
            writer.keep_many([(key_of(1), b"kept again"), (key_of(2000), b"z")], "plain")
            late[key_of(2000)] = b"z"
        return put(self, data, claims)

    monkeypatch.setattr(LocalStore, "_put", put_while_writing)
    store.compact(grace=0)
    monkeypatch.undo()
    store.compact(grace=0)
    store.gc(grace=0)
    expected = {**kept, **late}
    assert _recalled(LocalStore(tmp_path), expected) == expected


@pytest.mark.parametrize("stop", ["put", "index", "remove"])
def test_an_interrupted_compaction_leaves_every_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    """Stopped after the merged blob is written, after its index is published, or after the
    first small pack is removed: a fresh store reads every row, and compacting again ends
    the work."""
    kept = _kept_in_batches(LocalStore(tmp_path))
    publish, remove = LocalStore._publish_index, LocalStore._remove

    def publish_then_stop(self: LocalStore, pack: PackIndex, data: bytes) -> None:
        if stop == "index":
            publish(self, pack, data)
        raise KeyboardInterrupt

    def remove_one_then_stop(self: LocalStore, section: str, names: list[str]) -> None:
        if section == "packs" and names:
            remove(self, section, names[:1])
            raise KeyboardInterrupt
        remove(self, section, names)

    if stop == "remove":
        monkeypatch.setattr(LocalStore, "_remove", remove_one_then_stop)
    else:
        monkeypatch.setattr(LocalStore, "_publish_index", publish_then_stop)
    with pytest.raises(KeyboardInterrupt):
        LocalStore(tmp_path).compact(grace=0)
    monkeypatch.undo()
    assert _recalled(LocalStore(tmp_path), kept) == kept
    LocalStore(tmp_path).gc(grace=0)
    assert _recalled(LocalStore(tmp_path), kept) == kept
    LocalStore(tmp_path).compact(grace=0)
    LocalStore(tmp_path).gc(grace=0)
    assert len(_packs(tmp_path)) == 1
    assert _recalled(LocalStore(tmp_path), kept) == kept


def test_a_compaction_killed_outright_leaves_every_row(tmp_path: Path) -> None:
    """A process killed (SIGKILL) as it publishes the merged index leaves a store that reads
    every row, and a later compaction finishes."""
    kept = _kept_in_batches(LocalStore(tmp_path))
    script = textwrap.dedent(
        f"""
        import os, signal
        from somatize.store import LocalStore
        publish = LocalStore._publish_index
        def publish_then_die(self, pack, data):
            publish(self, pack, data)
            os.kill(os.getpid(), signal.SIGKILL)
        LocalStore._publish_index = publish_then_die
        LocalStore({str(tmp_path)!r}).compact(grace=0)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    died = subprocess.run([sys.executable, "-c", script], env=env, check=False)
    assert died.returncode == -9
    assert len(_packs(tmp_path)) == BATCHES + 1
    assert _recalled(LocalStore(tmp_path), kept) == kept
    LocalStore(tmp_path).compact(grace=0)
    assert len(_packs(tmp_path)) == 1
    assert _recalled(LocalStore(tmp_path), kept) == kept


def test_a_pack_whose_blob_is_gone_is_not_merged(tmp_path: Path) -> None:
    """A small pack whose blob is missing is left as it is (its rows are misses, as before),
    and the others are merged."""
    store = LocalStore(tmp_path)
    kept = _kept_in_batches(store)
    lost = store.recall(key_of(0))[0].value
    (tmp_path / "blobs" / lost[7:9] / lost[7:]).unlink()
    done = LocalStore(tmp_path).compact(grace=0)
    assert (done.merged, done.removed) == (BATCHES - 1, BATCHES - 1)
    fresh = LocalStore(tmp_path)
    with pytest.raises(Missing):
        fresh.recall(key_of(0))
    rest = {key: row for key, row in kept.items() if int(key[7:], 16) >= ROWS}
    assert _recalled(fresh, rest) == rest


def test_a_signed_store_compacts_into_a_signed_pack(tmp_path: Path) -> None:
    """The merged pack's index is signed with the store's key: a store opened with the
    key recalls every row from it, and verify finds nothing wrong."""
    store = LocalStore(tmp_path, signing_key="the key")
    kept = _kept_in_batches(store)
    assert store.compact(grace=0).written == 1
    store.gc(grace=0)
    assert len(_packs(tmp_path)) == 1
    assert _recalled(LocalStore(tmp_path, signing_key="the key"), kept) == kept
    assert LocalStore(tmp_path, signing_key="the key").verify().ok


def test_a_signed_store_is_not_compacted_without_its_key(tmp_path: Path) -> None:
    """Opened without the key, a signed store refuses to compact (its merged pack would be
    unsigned, which readers with the key refuse) and changes nothing."""
    _kept_in_batches(LocalStore(tmp_path, signing_key="the key"))
    before = _packs(tmp_path)
    with pytest.raises(KeyMismatch, match="Compact with the store's key"):
        LocalStore(tmp_path).compact(grace=0)
    assert _packs(tmp_path) == before


def test_a_pack_compaction_may_not_remove_is_said_not_counted_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replaced pack index compaction may not remove (in another user's folder) stops it
    with a StoreError naming the file, as the command line's exit status 2 says; it is not
    counted removed, nor handed to a later gc as one gc could not remove."""
    store = LocalStore(tmp_path)
    _kept_in_batches(store)
    held = sorted(_packs(tmp_path))[0]
    unlink = Path.unlink

    def refusing(path: Path, *args: Any, **kwargs: Any) -> None:
        if path.name == held:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", refusing)
    with pytest.raises(StoreError, match=f"could not remove packs/{held}"):
        store.compact(grace=0)
    assert held in _packs(tmp_path)
    monkeypatch.undo()
    assert store.gc(grace=0).unremoved == {}


def test_compaction_refuses_a_negative_grace(tmp_path: Path) -> None:
    """A grace that is not finite seconds from 0 is refused, saying what it is for."""
    store = LocalStore(tmp_path)
    _kept_in_batches(store, 2)
    with pytest.raises(ValueError, match="grace is finite seconds"):
        store.compact(grace=-1)
    assert len(_packs(tmp_path)) == 2


def test_the_command_line_compacts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`somatize store compact` merges the packs and says what it did."""
    kept = _kept_in_batches(LocalStore(tmp_path))
    assert main(["store", "compact", "--store", str(tmp_path), "--grace", "0"]) == 0
    said = capsys.readouterr().out
    assert f"merged {BATCHES} packs into 1, removed {BATCHES} packs" in said
    assert len(_packs(tmp_path)) == 1
    assert _recalled(LocalStore(tmp_path), kept) == kept


def test_a_bucket_store_compacts() -> None:
    """A bucket store merges its packs the same way, and a fresh one recalls every row."""
    url = s3_url()
    store = BucketStore(url, **s3_options())
    kept = _kept_in_batches(store, 4)
    done = store.compact(grace=0)
    assert (done.merged, done.written, done.removed) == (4, 1, 4)
    store.gc(grace=0)
    fresh = BucketStore(url, **s3_options())
    assert _recalled(fresh, kept) == kept


def test_a_read_only_bucket_store_is_not_compacted() -> None:
    """A bucket store opened read-only refuses to compact."""
    url = s3_url()
    _kept_in_batches(BucketStore(url, **s3_options()), 2)
    reader = BucketStore(url, read_only=True, **s3_options())
    with pytest.raises(StoreError, match="compact"):
        reader.compact(grace=0)


def test_a_record_kept_while_merging_wins_over_the_merged_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merged pack is stamped after its newest member. A key of an older member kept
    again while the compaction merges, stamped between the two (a write in flight as the
    store was listed, or a writer whose clock runs behind), is newer than the pack that held
    it: its answer is still the one served, and that merge is left undone."""
    real = time.time
    for hours in (3, 1):  # a pack kept three hours ago, one an hour ago
        monkeypatch.setattr(time, "time", lambda hours=hours: real() - hours * 3600)
        _kept_in_batches(LocalStore(tmp_path), 1, first=hours * 100)
    monkeypatch.undo()
    kept = {key_of(n): row_of(n) for n in [*range(100, 100 + ROWS), *range(300, 300 + ROWS)]}
    store, writer = LocalStore(tmp_path), LocalStore(tmp_path)
    writer.recall(key_of(300))  # knows the pack of key 300, kept three hours ago
    put = LocalStore._put

    def put_while_writing(self: LocalStore, data: Any, claims: list[str]) -> str:
        if self is store and kept[key_of(300)] != b"kept again":
            kept[key_of(300)] = b"kept again"
            with monkeypatch.context() as clock:
                clock.setattr(time, "time", lambda: real() - 2 * 3600)  # stamped 2 h ago
                writer.keep(key_of(300), b"kept again", "plain")
        return put(self, data, claims)

    monkeypatch.setattr(LocalStore, "_put", put_while_writing)
    store.compact(grace=0)
    monkeypatch.undo()
    store.gc(grace=0)
    assert _recalled(LocalStore(tmp_path), kept) == kept


_READER = """
import json, sys
from somatize.store import BucketStore, LocalStore

where, keys = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if "url" in where:
    store = BucketStore(where["url"], cache=where["cache"], **where["options"])
else:
    store = LocalStore(where["root"])
store.recall_many(keys[:{rows}], borrow=True)  # a batch of the epoch: every pack adopted
store.recall(keys[0])  # and one row alone: the packs are taken for looked at
print("ready", flush=True)
sys.stdin.readline()  # the small packs and their blobs are removed meanwhile
alone = {{key: bytes(store.recall(key)[1]).decode() for key in keys[{rows}::2]}}
many = store.recall_many(keys[{rows} + 1::2], borrow=True)
print(json.dumps({{
    "have": sorted(store.have(keys)),
    "alone": alone,
    "many": {{key: bytes(found[1]).decode() for key, found in many.items()}},
}}))
"""


@pytest.mark.parametrize("home", ["local", "bucket", "bucket with a cache"])
def test_a_reader_in_another_process_mid_epoch_recalls_every_row(tmp_path: Path, home: str) -> None:
    """A process that read the small packs' indexes (a row cache mid-epoch) goes on after
    another process compacts and collects the store: every row is recalled, alone and many
    at once, from the merged pack, and none is wrong or missing."""
    if home == "local":
        where: dict[str, Any] = {"root": str(tmp_path)}
        opened: Any = lambda: LocalStore(tmp_path)  # noqa: E731
    else:
        cache = str(tmp_path / "cache") if home.endswith("cache") else None
        where = {"url": s3_url(), "options": s3_options(), "cache": cache}
        opened = lambda: BucketStore(where["url"], **s3_options())  # noqa: E731
    kept = _kept_in_batches(opened())
    keys = list(kept)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    script = _READER.format(rows=ROWS)
    with subprocess.Popen(
        [sys.executable, "-c", script, json.dumps(where), json.dumps(keys)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    ) as reader:
        assert reader.stdout is not None and reader.stdin is not None
        assert reader.stdout.readline() == "ready\n"
        assert opened().compact(grace=0).removed == BATCHES
        collected = opened().gc(grace=0)
        assert collected.blobs == BATCHES  # the small packs' blobs are gone
        found, _ = reader.communicate("go\n")
    assert reader.returncode == 0
    said = json.loads(found)
    assert said["have"] == sorted(keys)
    rest = {key: row.decode() for key, row in kept.items() if key not in keys[:ROWS]}
    assert {**said["alone"], **said["many"]} == rest


def test_a_key_kept_again_after_compaction_by_a_clock_behind_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that read the small packs before the compaction keeps a key of an old pack
    again after it, on a clock a few seconds behind: its answer wins, as it did over the
    small pack. A pack stamped within the grace is not merged, so the merged pack is stamped
    no later than that, and a clock less than the grace behind stamps after it."""
    real = time.time
    hour_ago = real() - 3600
    monkeypatch.setattr(time, "time", lambda: hour_ago)
    kept = _kept_in_batches(LocalStore(tmp_path), 2)  # kept an hour ago
    monkeypatch.undo()
    kept.update(_kept_in_batches(LocalStore(tmp_path), 1, first=100))  # kept just now
    writer = LocalStore(tmp_path)
    writer.recall(key_of(0))  # knows the small pack of key 0, not what merges it
    done = LocalStore(tmp_path).compact(grace=60)
    monkeypatch.setattr(time, "time", lambda: real() - 5)  # a clock 5 s behind
    writer.keep(key_of(0), b"kept again", "plain")
    monkeypatch.undo()
    kept[key_of(0)] = b"kept again"
    assert _recalled(LocalStore(tmp_path), kept) == kept
    assert (done.merged, done.written, done.young) == (2, 1, 1)  # the pack kept just now


def test_the_command_line_says_young_packs_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Packs kept within the grace are not merged, and the command line says so."""
    kept = _kept_in_batches(LocalStore(tmp_path), 3)
    assert main(["store", "compact", "--store", str(tmp_path), "--grace", "3600"]) == 0
    said = capsys.readouterr().out
    assert "merged 0 packs into 0" in said
    assert "3 packs kept within --grace 3600s are not merged yet" in said
    assert len(_packs(tmp_path)) == 3
    assert _recalled(LocalStore(tmp_path), kept) == kept
