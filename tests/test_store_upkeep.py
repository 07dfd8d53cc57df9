"""Upkeep under pressure: gc and verify run with the wrong key, or while writers work,
never take what is wanted; and the newest answer for a key is the one served."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import shutil
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import blake3
import pytest

from somatize.cli import main
from somatize.store import (
    Answer,
    Corrupt,
    KeyMismatch,
    LocalStore,
    Missing,
    NameNotFound,
    NewerFormat,
    Store,
    StoreError,
    Unsigned,
)
from somatize.store._packed import hash_bytes
from somatize.store.records import NameSignedAlone, Signer
from somatize.store.upkeep import Entry, contents, listing
from tests.conftest_s3 import s3_options, s3_url


def key_of(number: int) -> str:
    return f"blake3:{number:064x}"


def _kept(root: Path, signing_key: str | None) -> tuple[LocalStore, str]:
    """A store holding one answer, one pack and one named blob, signed with ``signing_key``."""
    store = LocalStore(root, signing_key=signing_key)
    store.keep(key_of(1), b"an answer", "plain")
    store.keep_many([(key_of(2), b"item two"), (key_of(3), b"item three")], "plain")
    named = store.put(b"the training set")
    store.bind("data/v1", named)
    return store, named


@pytest.mark.parametrize(("written", "run"), [(None, "other"), ("one", "other"), ("one", None)])
def test_upkeep_with_the_wrong_key_takes_nothing(
    tmp_path: Path, written: str | None, run: str | None
) -> None:
    """gc and verify --quarantine run with a key the store was not signed with are refused
    (KeyMismatch, saying so) and leave every answer, pack and name where it was; run without
    a key they work, since a store read without one trusts what it finds."""
    _, named = _kept(tmp_path / "store", written)
    wrong = LocalStore(tmp_path / "store", signing_key=run)
    if run is not None:
        with pytest.raises(KeyMismatch, match="not this store's key"):
            wrong.gc(0, grace=0)
        with pytest.raises(KeyMismatch, match="not this store's key"):
            wrong.verify(quarantine=True)
    else:
        assert wrong.verify(quarantine=True).ok
        wrong.gc(grace=0)
    right = LocalStore(tmp_path / "store", signing_key=written)
    assert right.have([key_of(1), key_of(2), key_of(3)]) == {key_of(1), key_of(2), key_of(3)}
    assert bytes(right.get(right.resolve("data/v1"))) == b"the training set"
    assert named in {f"blake3:{e.name[3:]}" for e in right._entries("blobs")}


def test_the_command_line_refuses_upkeep_with_another_stores_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`somatize store gc` in a shell whose SOMATIZE_STORE_KEY belongs to another store
    exits 2 with a message, and the store keeps its named dataset and answers."""
    _kept(tmp_path / "store", None)
    monkeypatch.setenv("SOMATIZE_STORE_KEY", "some other secret")
    where = str(tmp_path / "store")
    assert main(["store", "gc", "--store", where, "--grace", "0", "--max-bytes", "0"]) == 2
    assert "not this store's key" in capsys.readouterr().err
    assert main(["store", "verify", "--store", where, "--quarantine"]) == 2
    monkeypatch.delenv("SOMATIZE_STORE_KEY")
    fresh = LocalStore(where)
    assert fresh.have([key_of(1), key_of(2)]) == {key_of(1), key_of(2)}
    assert bytes(fresh.get(fresh.resolve("data/v1"))) == b"the training set"


def test_names_pin_their_blobs_whatever_their_signature(tmp_path: Path) -> None:
    """In a signed store, a name written without the key still pins its blob: names, and
    what they point at, are never collected; an unsigned record pins its blob while kept."""
    signed = LocalStore(tmp_path / "store", signing_key="team")
    signed.keep(key_of(1), b"signed answer", "plain")
    plain = LocalStore(tmp_path / "store", signing_key=None)
    plain.signer = None
    named = plain.put(b"dataset bound without the key")
    plain.bind("data/plain", named)
    planted = plain.keep(key_of(2), b"planted answer", "plain")
    done = signed.gc(grace=0)
    assert done.blobs == 0
    assert plain.has_blob(named) and plain.has_blob(planted.value)


def test_gc_spares_a_blob_put_again_while_it_ran(tmp_path: Path) -> None:
    """A blob gc found unreferenced and old, but which a writer put again (and referred to)
    after gc listed the store, is not swept: gc looks again before it removes."""
    collector, writer = LocalStore(tmp_path / "store"), LocalStore(tmp_path / "store")
    content = b"an answer whose blob was here already"
    old = collector.put(content)
    path = collector.blob_path(old)
    os.utime(path, (time.time() - 3600,) * 2)
    listed = collector._entries

    def entries(section: str) -> list[Entry]:
        found = listed(section)
        if section == "answers":  # gc has listed blobs and answers: a writer keeps now
            writer.keep(key_of(9), content, "plain")
        return found

    collector._entries = entries  # type: ignore[method-assign]
    collector.gc()
    fresh = LocalStore(tmp_path / "store")
    assert path.exists() and fresh.have([key_of(9)]) == {key_of(9)}


def _gc_on_a_clock_apart(root: str, ahead: float, grace: float) -> tuple[int, int]:
    """A gc in a process whose clock runs ``ahead`` seconds apart from the one that stamps
    the store's files (a machine sharing the directory over NFS, whose server stamps them):
    the blobs and abandoned writes it removed."""
    real = time.time
    time.time = lambda: real() + ahead
    done = LocalStore(root).gc(grace=grace)
    return done.blobs, done.abandoned


@pytest.mark.parametrize("ahead", [300.0, -300.0])
def test_a_gc_whose_clock_runs_apart_from_the_files_spares_writes_of_a_moment_ago(
    tmp_path: Path, ahead: float
) -> None:
    """The grace a gc keeps is measured on the clock that stamps the store's files, not the
    machine's own: a gc on a machine whose clock runs minutes ahead of a shared directory's
    (an NFS server stamps the files its clients write) took a blob another process put a
    moment ago, before it bound it, and a pack that process was writing in tmp/, for ones
    written minutes ago, and removed them, so the bind was refused and the rows lost."""
    root = tmp_path / "store"
    writer = LocalStore(root)
    data = b"a dataset, bound once it is all written"
    digest = writer.put(data)
    rows = writer.open_joined("plain")
    rows.add([key_of(1), key_of(2)], b"row onerow two", [7, 7])
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as elsewhere:
        assert elsewhere.submit(_gc_on_a_clock_apart, str(root), ahead, 60).result() == (0, 0)
        rows.close()
        writer.bind("data/v1", digest)
        fresh = LocalStore(root)
        assert bytes(fresh.get(fresh.resolve("data/v1"))) == data
        got = fresh.recall_many([key_of(1), key_of(2)])
        assert [bytes(got[key][1]) for key in (key_of(1), key_of(2))] == [b"row one", b"row two"]  # type: ignore[index]
        # Once older than the grace by the files' clock, it goes, whichever way the
        # machine's runs apart.
        stray = writer.put(b"put, and never bound")
        time.sleep(1.5)
        assert elsewhere.submit(_gc_on_a_clock_apart, str(root), ahead, 1).result() == (1, 0)
    assert not writer.has_blob(stray)
    assert os.listdir(root / "tmp") == []


def test_a_gc_whose_clock_runs_ahead_spares_the_first_write_of_a_store_holding_no_blob(
    tmp_path: Path,
) -> None:
    """A store holding no blob yet, whose first pack another process is writing in tmp/, has
    that write's age measured on the files' clock too, by a gc whose clock runs ahead."""
    root = tmp_path / "store"
    writer = LocalStore(root)
    rows = writer.open_joined("plain")
    rows.add([key_of(1), key_of(2)], b"row onerow two", [7, 7])
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as elsewhere:
        assert elsewhere.submit(_gc_on_a_clock_apart, str(root), 300.0, 60).result() == (0, 0)
    rows.close()
    got = LocalStore(root).recall_many([key_of(1), key_of(2)])
    assert [bytes(got[key][1]) for key in (key_of(1), key_of(2))] == [b"row one", b"row two"]  # type: ignore[index]


class _Recalled:
    """A dataset whose samples are answers it recalls from a store it holds, as a DataLoader
    worker's copy of it does."""

    def __init__(self, root: Path, keys: list[str]) -> None:
        self.store = LocalStore(root)
        self.keys = keys

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, at: int) -> bytes:
        return bytes(self.store.recall(self.keys[at])[1])


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_dataloader_worker_writes_down_what_it_recalled_for_a_gc_elsewhere(
    tmp_path: Path, start: str
) -> None:
    """A DataLoader worker that recalls answers through a store its dataset holds writes down
    when it used them as it ends: it ends with os._exit where forked, which runs no atexit
    handler, and a store it unpickled was never handed to one, so what it recalled every
    epoch kept the time it was last written, and a gc elsewhere dropped it first."""
    from torch.utils.data import DataLoader

    root = tmp_path / "store"
    store = LocalStore(root)
    used, unused = key_of(1), key_of(2)
    costs = []
    for key, hours in ((used, 2), (unused, 1)):  # the one the workers use is the older
        kept = store.keep(key, f"the answer to {key[-1]}".encode(), "plain")
        os.utime(store.answer_path(key), (time.time() - 3600 * hours,) * 2)
        costs.append(store.answer_path(key).stat().st_size + kept.size)
    loader = DataLoader(_Recalled(root, [used]), num_workers=1, multiprocessing_context=start)
    assert list(loader) == [[b"the answer to 1"]]
    one = max(costs)  # room for one answer, record and blob
    assert LocalStore(root).gc(max_bytes=one, grace=0).answers == 1
    assert LocalStore(root).have([used, unused]) == {used}


@pytest.mark.parametrize("packed", [False, True])
def test_a_use_stamped_ahead_of_the_clock_in_a_directory_ages_from_a_gc(
    tmp_path: Path, packed: bool
) -> None:
    """A local store copied with its files' times (`rsync -a`, `cp -a`, tar) from a machine
    whose clock ran years fast holds a record or pack index stamped then: a gc took it for
    the most recently used at every run until that time came, so a gc with max_bytes
    dropped an answer just used to keep one nobody used since. A time later than the gc's
    clock is taken as a use at that gc, and ages from there."""
    root = tmp_path / "store"
    store = LocalStore(root)
    stamped, fresh = key_of(1), key_of(2)
    if packed:
        store.keep_many([(stamped, b"o" * 5_000), (key_of(3), b"p" * 5_000)], "plain")
        (index,) = (root / "packs").iterdir()
    else:
        store.keep(stamped, b"o" * 10_000, "plain")
        index = store.answer_path(stamped)
    store.keep(fresh, b"n" * 10_000, "plain")
    os.utime(index, (1e11, 1e11))  # the year 5138
    assert store.gc(grace=0).answers == 0
    assert index.stat().st_mtime <= time.time()
    store.recall(fresh)
    store.close()
    done = LocalStore(root).gc(max_bytes=15_000, grace=0)
    assert (done.answers, done.packs) == ((0, 1) if packed else (1, 0))
    assert LocalStore(root).have([stamped, fresh]) == {fresh}


def _stamped_ahead(root: Path, section: str) -> Path:
    """A blob no record names, or a write left in ``tmp/``, of 1,000 bytes in the store at
    ``root``, stamped years ahead (a store copied with its files' times from a machine whose
    clock ran fast)."""
    if section == "blobs":
        path = LocalStore(root).blob_path(LocalStore(root).put(b"b" * 1_000))
    else:
        path = LocalStore(root).root / "tmp" / "4242-writing.part"
        path.write_bytes(b"b" * 1_000)
    os.utime(path, (1e11, 1e11))  # the year 5138
    return path


@pytest.mark.parametrize("section", ["blobs", "tmp"])
def test_a_blob_or_write_stamped_ahead_of_the_clock_in_a_directory_ages_from_a_gc(
    tmp_path: Path, section: str
) -> None:
    """The copy that stamps records ahead leaves a blob no record names, or a write left in
    ``tmp/``, stamped so too: it looked younger than any grace at every gc, and no gc
    removed it. A time later than the gc's clock is taken as made at that gc, and set to
    it, so that it ages from there."""
    root = tmp_path / "store"
    path = _stamped_ahead(root, section)
    before = time.time()
    done = LocalStore(root).gc(grace=60)
    assert (done.blobs, done.abandoned, path.exists()) == (0, 0, True)
    assert done.young == (1_000 if section == "blobs" else 0)
    assert before - 1 <= path.stat().st_mtime <= time.time()


@pytest.mark.parametrize("section", ["blobs", "tmp"])
def test_gc_with_no_grace_removes_a_blob_or_write_stamped_ahead_of_the_clock(
    tmp_path: Path, section: str
) -> None:
    """``grace=0`` spares no blob nothing refers to and no write in ``tmp/``: one stamped
    years ahead neither, which counts as made at that gc."""
    root = tmp_path / "store"
    path = _stamped_ahead(root, section)
    done = LocalStore(root).gc(grace=0)
    assert (done.blobs, done.abandoned) == ((1, 0) if section == "blobs" else (0, 1))
    assert not path.exists()


@pytest.mark.parametrize("when", ["after its last look", "as it removes the blob"])
def test_gc_spares_a_blob_put_again_and_referred_to_after_its_last_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A writer that puts an old unreferenced blob again (touching it) and publishes a record
    referring to it after gc's last look, or in the instant gc removes it, keeps it: gc sets
    each blob aside before it removes it and puts back one touched since its last look, and
    a writer touching it once it is aside finds it gone and writes it afresh."""
    collector, writer = LocalStore(tmp_path / "store"), LocalStore(tmp_path / "store")
    content = b"the same deterministic answer" * 100
    evicted = collector.keep(key_of(1), content, "plain")
    path = collector.blob_path(evicted.value)
    for old in (path, collector.answer_path(key_of(1))):
        os.utime(old, (time.time() - 3600,) * 2)
    kept: list[str] = []

    def keep_again() -> None:
        if not kept:
            kept.append(writer.keep(key_of(2), content, "plain").value)

    if when == "after its last look":
        listed, looks = collector._entries, []

        def entries(section: str) -> list[Entry]:
            found = listed(section)
            if section == "blobs":
                looks.append(section)
                if len(looks) == 2:
                    keep_again()
            return found

        collector._entries = entries  # type: ignore[method-assign]
    else:
        rename, unlink = os.rename, os.unlink

        def renaming(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
            rename(source, target, *args, **kwargs)
            if os.fspath(source) == str(path):
                keep_again()  # the blob is aside now

        def unlinking(target: Any, *args: Any, **kwargs: Any) -> None:
            if os.fspath(target) == str(path):
                keep_again()
            unlink(target, *args, **kwargs)

        monkeypatch.setattr(os, "rename", renaming)
        monkeypatch.setattr(os, "unlink", unlinking)
    done = collector.gc(max_bytes=0, grace=60)
    monkeypatch.undo()
    assert kept == [evicted.value] and done.answers == 1
    fresh = LocalStore(tmp_path / "store")
    assert fresh.have([key_of(2)]) == {key_of(2)}
    assert bytes(fresh.recall(key_of(2))[1]) == content
    assert LocalStore(tmp_path / "store").verify().ok


@pytest.mark.parametrize("writer", ["keeps it again", "does not"])
def test_verify_while_gc_evicts_and_a_writer_keeps_again_finds_no_damage(
    tmp_path: Path, writer: str
) -> None:
    """verify --quarantine that read a record before a gc elsewhere evicted it (record and
    blob), and while a writer kept that answer again, finds the store whole: what it judged
    damaged is read again before it is told, gone (no damage) or kept anew (whole), and the
    writer's fresh record is never moved aside."""
    root = tmp_path / "store"
    keeper, collector, checker = LocalStore(root), LocalStore(root), LocalStore(root)
    content = b"answer bytes" * 10
    evicted = keeper.keep(key_of(1), content, "plain")
    keeper.keep(key_of(2), b"another answer, used lately", "plain")
    for old in (keeper.blob_path(evicted.value), keeper.answer_path(key_of(1))):
        os.utime(old, (time.time() - 3600,) * 2)
    listed, rehash = checker._entries, checker._rehash
    ran: list[str] = []

    def entries(section: str) -> list[Entry]:
        if section == "blobs" and not ran:  # verify has read the records: a gc evicts one
            ran.append("gc")
            assert collector.gc(max_bytes=200, grace=60).answers == 2
        return listed(section)

    def rehashing(digest: str, size: int | None = None) -> str | None:
        if writer == "keeps it again" and ran == ["gc"]:  # while verify hashes the blobs
            ran.append("kept")
            keeper.keep(key_of(1), content, "plain")
        return rehash(digest, size)

    checker._entries = entries  # type: ignore[method-assign]
    checker._rehash = rehashing  # type: ignore[method-assign]
    found = checker.verify(quarantine=True)
    assert ran == (["gc", "kept"] if writer == "keeps it again" else ["gc"])
    assert found.ok and found.damaged == [] and found.quarantined == []
    fresh = LocalStore(root)
    kept = {key_of(1)} if writer == "keeps it again" else set()
    assert fresh.have([key_of(1)]) == kept and fresh.verify().ok


def test_verify_puts_back_a_record_kept_anew_as_it_moves_it_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record verify found damaged (its blob gone) that a writer keeps anew in the instant
    verify moves it to quarantine/ is put back: verify moves a record aside, compares it
    with what it judged, and leaves one that changed."""
    root = tmp_path / "store"
    store = LocalStore(root)
    content = b"an answer whose blob was lost"
    answer = store.keep(key_of(1), content, "plain")
    store.blob_path(answer.value).unlink()
    record = str(store.answer_path(key_of(1)))
    replace, kept = os.replace, []

    def replacing(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(source) == record and "quarantine" in os.fspath(target) and not kept:
            kept.append("anew")  # a writer recomputes it and keeps it, at this instant
            time.sleep(0.01)  # a record written later: its time differs
            LocalStore(root).keep(key_of(1), content, "plain")
        replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replacing)
    found = LocalStore(root).verify(quarantine=True)
    monkeypatch.undo()
    assert kept == ["anew"]
    assert found.quarantined == [] and found.damaged == []
    fresh = LocalStore(root)
    assert bytes(fresh.recall(key_of(1))[1]) == content and fresh.verify().ok


def test_a_shard_folder_symlinked_elsewhere_is_walked_as_readers_follow_it(
    tmp_path: Path,
) -> None:
    """A folder of blobs/ that is a symlink to a folder elsewhere on the disk (moved to make
    room) is walked by upkeep as readers follow it: verify counts and hashes its blobs and
    finds the store whole, gc keeps what is referred to and removes what is not; a link
    back to a folder already walked is passed over, never walked in a loop."""
    root = tmp_path / "store"
    store = LocalStore(root)
    answer = store.keep(key_of(1), b"kept in a shard moved elsewhere", "plain")
    shard = store.blob_path(answer.value).parent
    number = 0  # bytes whose blob lies in that shard too, referred to by nothing
    while hash_bytes(b"%d" % number)[7:9] != answer.value[7:9]:
        number += 1
    unreferenced = store.put(b"%d" % number)
    elsewhere = tmp_path / "elsewhere"
    shard.rename(elsewhere)
    shard.symlink_to(elsewhere, target_is_directory=True)
    (elsewhere / "loop").symlink_to(root / "blobs", target_is_directory=True)
    found = LocalStore(root).verify(quarantine=True)
    assert found.ok and found.blobs == 2 and found.records == 1 and found.quarantined == []
    done = LocalStore(root).gc(grace=0)
    assert done.blobs == 1 and not LocalStore(root).has_blob(unreferenced)
    fresh = LocalStore(root)
    assert fresh.have([key_of(1)]) == {key_of(1)}
    assert bytes(fresh.recall(key_of(1))[1]) == b"kept in a shard moved elsewhere"


@pytest.mark.parametrize("link", ["blobs/zz", "blobs/{shard}/evil", "tmp/evil"])
def test_gc_removes_no_file_outside_the_store_through_a_symlinked_folder(
    tmp_path: Path, link: str
) -> None:
    """A folder symlinked into blobs/ or tmp/ (a shard's name, a link inside a shard, one in
    tmp/) that leads out of the store, to a folder of other files: gc removed every old
    file there, and in the folders under it, as a stray of blobs/ or an abandoned write.
    Only blobs laid out as blobs are taken from a folder a link leads out to; what else is
    there, and anything tmp/ links to, is none of the store's and is left."""
    root = tmp_path / "store"
    store = LocalStore(root)
    answer = store.keep(key_of(1), b"an answer", "plain")
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    mine = [outside / "precious.txt", outside / "sub" / "deep.txt"]
    long_ago = time.time() - 30 * 86400
    for path in mine:
        path.write_text("a user's file")
        os.utime(path, (long_ago, long_ago))
    (root / "tmp").mkdir(exist_ok=True)
    shard = store.blob_path(answer.value).parent.name
    (root / link.format(shard=shard)).symlink_to(outside, target_is_directory=True)
    LocalStore(root).gc(grace=0, max_bytes=0)
    assert [path.read_text() for path in mine] == ["a user's file"] * 2
    assert main(["store", "gc", "--store", str(root), "--grace", "0", "--max-bytes", "0"]) == 0
    assert [path.read_text() for path in mine] == ["a user's file"] * 2


@pytest.mark.parametrize("home", ["local", "file"])
@pytest.mark.parametrize("section", ["blobs", "tmp"])
def test_gc_removes_no_file_outside_the_store_where_a_section_is_a_symlink(
    tmp_path: Path, section: str, home: str
) -> None:
    """blobs/ or tmp/ itself a symlink leading out of the store, to a folder holding other
    files: gc removed every old file there, and in the folders under it, as a stray of
    blobs/ or an abandoned write. The store's own files there are still its own: the blobs
    (an answer recalled after the gc) and a write it left in tmp/ (removed)."""
    root = tmp_path / "store"
    where = str(root) if home == "local" else root.as_uri()
    store = Store(where) if home == "local" else Store.on_bucket(where)
    store.keep(key_of(1), b"an answer", "plain")
    outside = tmp_path / "outside"
    shutil.copytree(root / section, outside)
    shutil.rmtree(root / section)
    (root / section).symlink_to(outside, target_is_directory=True)
    (outside / "sub").mkdir()
    mine = [outside / "precious.txt", outside / "sub" / "deep.txt", outside / "ab" / "notes"]
    mine[2].parent.mkdir(exist_ok=True)
    abandoned = outside / f"{os.getpid()}-{uuid.uuid4().hex}.part"  # a write a crash left
    long_ago = time.time() - 30 * 86400
    for path in [*mine, abandoned]:
        path.write_text("a user's file")
        os.utime(path, (long_ago, long_ago))
    (Store(where) if home == "local" else Store.on_bucket(where)).gc(grace=0)
    assert [path.read_text() for path in mine] == ["a user's file"] * 3
    assert main(["store", "gc", "--store", where, "--grace", "0"]) == 0
    assert [path.read_text() for path in mine] == ["a user's file"] * 3
    assert bytes(LocalStore(root).recall(key_of(1))[1]) == b"an answer"
    assert section == "blobs" or not abandoned.exists()


@pytest.mark.parametrize("home", ["local", "file"])
@pytest.mark.parametrize("link", ["names/team", "names"])
def test_verify_moves_no_file_out_of_a_folder_a_link_in_names_leads_to(
    tmp_path: Path, home: str, link: str
) -> None:
    """A folder symlinked into names/ that leads out of the store, to a folder of a user's
    files: every file there, in the folders under it too, was read as a name that holds no
    digest, and `verify --quarantine` moved them all into the store's quarantine/ (and
    removed the folders it left empty). They are reported, and left where they are."""
    root = tmp_path / "store"
    where = str(root) if home == "local" else root.as_uri()
    store = Store(where) if home == "local" else Store.on_bucket(where)
    digest = store.put(b"a dataset")
    store.bind("data/v1", digest)
    outside = tmp_path / "outside"
    if link == "names":  # the section itself moved out, its names with it
        shutil.move(root / "names", outside)
    (outside / "sub").mkdir(parents=True)
    mine = [outside / "notes.txt", outside / "sub" / "deep.txt"]
    for path in mine:
        path.write_text("a user's file")
    (root / link).symlink_to(outside, target_is_directory=True)
    found = (Store(where) if home == "local" else Store.on_bucket(where)).verify(quarantine=True)
    under = link.removeprefix("names").lstrip("/")
    told = sorted(f"names/{under}/{n}".replace("//", "/") for n in ("notes.txt", "sub/deep.txt"))
    assert sorted(found.unmoved) == told
    assert found.quarantined == []
    assert [path.read_text() for path in mine] == ["a user's file"] * 2
    assert main(["store", "verify", "--quarantine", "--store", where]) == 1
    assert [path.read_text() for path in mine] == ["a user's file"] * 2
    assert LocalStore(root).resolve("data/v1") == digest


def _unreadable_under(monkeypatch: pytest.MonkeyPatch, folders: list[Path]) -> None:
    """Makes every folder of ``folders`` one this process may not list, as another user's
    is (this may run as root, who reads them all)."""
    hidden = {str(folder) for folder in folders}
    scandir = os.scandir

    def refusing(path: Any = ".") -> Any:
        if os.path.realpath(os.fspath(path)) in hidden:
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)


@pytest.mark.parametrize("home", ["local", "file"])
@pytest.mark.parametrize("section", ["answers", "packs"])
def test_upkeep_walks_no_folder_of_others_a_linked_section_leads_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: str, section: str
) -> None:
    """answers/ or packs/ a symlink leading out of the store (moved to another disk, or
    linked to `/` by mistake): ls, verify and gc walked every folder there, to any depth,
    and stopped with a StoreError at the first one they could not read. Only the folders
    the store writes there are walked now, and only its files taken; its answers are read
    through the link as before."""
    root = tmp_path / "store"
    where = str(root) if home == "local" else root.as_uri()
    store = Store(where) if home == "local" else Store.on_bucket(where)
    store.keep(key_of(1), b"an answer", "plain")
    store.keep_many([(key_of(2), b"item two"), (key_of(3), b"item three")], "plain")
    outside = tmp_path / "disk"
    shutil.move(root / section, outside)
    (root / section).symlink_to(outside, target_is_directory=True)
    shard = f"{key_of(1)[7:9]}"
    private = [outside / "private", outside / shard / "private"]
    for folder in private:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "mine.txt").write_text("a user's file")
    (outside / "notes.txt").write_text("a user's file")
    _unreadable_under(monkeypatch, [path.resolve() for path in private])
    fresh = Store(where) if home == "local" else Store.on_bucket(where)
    found = fresh.verify(quarantine=True)
    assert found.ok and (found.records, found.packs) == (1, 1)
    assert found.stray == [] and found.quarantined == []
    assert fresh.gc(grace=0).unread_names == []
    for command in ("ls", "verify", "gc"):
        assert main(["store", command, "--store", where]) == 0
    again = Store(where) if home == "local" else Store.on_bucket(where)
    assert bytes(again.recall(key_of(1))[1]) == b"an answer"
    assert bytes(again.recall(key_of(3))[1]) == b"item three"
    assert (outside / "notes.txt").read_text() == "a user's file"


@pytest.mark.parametrize("home", ["local", "file"])
def test_gc_says_which_link_in_names_holds_it_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], home: str
) -> None:
    """A folder of a user's files linked into names/: each file reads as a name that
    cannot be read, so gc keeps every blob nothing refers to. It says which link holds it
    back, where it leads, and to remove it, rather than to move aside with verify
    --quarantine the files it leaves in place."""
    root = tmp_path / "store"
    where = str(root) if home == "local" else root.as_uri()
    store = Store(where) if home == "local" else Store.on_bucket(where)
    store.bind("data/v1", store.put(b"a dataset"))
    unreferenced = store.put(b"put, and never bound")
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "notes.txt").write_text("a user's file")
    (outside / "sub" / "deep.txt").write_text("a user's file")
    (root / "names" / "team").symlink_to(outside, target_is_directory=True)
    done = (Store(where) if home == "local" else Store.on_bucket(where)).gc(grace=0)
    assert done.names_led_out == {"names/team": str(outside.resolve())}
    assert LocalStore(root).has_blob(unreferenced)
    assert main(["store", "gc", "--store", where, "--grace", "0"]) == 0
    said = capsys.readouterr().out
    assert f"names/team leads out of the store, to {outside.resolve()}" in said
    assert "remove the link" in said
    (root / "names" / "team").unlink()
    assert main(["store", "gc", "--store", where, "--grace", "0"]) == 0
    assert not LocalStore(root).has_blob(unreferenced)


def _at(where: str, home: str) -> Store:
    """A fresh store object for the store at ``where``, a directory or a ``file://`` URL."""
    return Store(where) if home == "local" else Store.on_bucket(where)


@pytest.mark.parametrize("home", ["local", "file"])
@pytest.mark.parametrize("section", ["answers", "blobs"])
def test_upkeep_at_a_file_url_follows_a_shard_linked_inside_a_section(
    tmp_path: Path, home: str, section: str
) -> None:
    """A shard of answers/ or blobs/ moved to another disk and linked (answers/ab -> there),
    which readers follow: at a file:// URL upkeep listed the link as no folder, so gc took
    the blob its record refers to for unreferenced and removed it (the answer lost), or
    stopped, and verify hashed none of its blobs. It is walked as a directory store walks
    it: what is referred to is kept, and what is not removed."""
    root = tmp_path / "store"
    where = str(root) if home == "local" else root.as_uri()
    store = _at(where, home)
    answer = store.keep(key_of(1), b"kept in a shard moved elsewhere", "plain")
    shard = root / section / (key_of(1) if section == "answers" else answer.value)[7:9]
    unreferenced = store.put(b"put, and never referred to")
    elsewhere = tmp_path / "disk"
    shard.rename(elsewhere)
    shard.symlink_to(elsewhere, target_is_directory=True)
    found = _at(where, home).verify()
    assert found.ok and (found.blobs, found.records) == (2, 1) and found.stray == []
    done = _at(where, home).gc(grace=0)
    assert done.blobs == 1 and not LocalStore(root).has_blob(unreferenced)
    assert shard.is_symlink()
    assert bytes(LocalStore(root).recall(key_of(1))[1]) == b"kept in a shard moved elsewhere"


@pytest.mark.parametrize("home", ["local", "file"])
@pytest.mark.parametrize("leads_to", ["the store", "a folder holding it"])
def test_a_link_in_names_to_the_store_or_above_it_is_not_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: str, leads_to: str
) -> None:
    """A link in names/ to the store's own folder or one holding it (`/`) was walked to any
    depth: the whole filesystem, stopping at the first folder it could not read, or the
    store itself again, its blobs then removed under names nothing read. It is not walked:
    gc keeps every blob nothing else refers to and names the link, verify tells it as
    damage and leaves it, and once it is removed gc collects as before."""
    root = tmp_path / "store"
    where = str(root) if home == "local" else root.as_uri()
    store = _at(where, home)
    store.bind("data/v1", store.put(b"a dataset"))
    unreferenced = store.put(b"put, and never bound")
    target = root if leads_to == "the store" else tmp_path
    (tmp_path / "private").mkdir()
    _unreadable_under(monkeypatch, [(tmp_path / "private").resolve()])
    link = root / "names" / "up"
    link.symlink_to(target, target_is_directory=True)
    done = _at(where, home).gc(grace=0)
    assert done.names_led_out == {"names/up": str(target.resolve())}
    assert LocalStore(root).has_blob(unreferenced)
    found = _at(where, home).verify(quarantine=True)
    assert [(d.section, d.name) for d in found.damaged] == [("names", "up")]
    assert found.names == 1 and found.quarantined == [] and link.is_symlink()
    link.unlink()
    assert _at(where, home).gc(grace=0).blobs == 1
    assert not LocalStore(root).has_blob(unreferenced)
    assert LocalStore(root).resolve("data/v1") == hash_bytes(b"a dataset")


@pytest.mark.parametrize(
    ("home", "linked"),
    [
        ("local", "names/team"),
        ("local", "answers"),
        ("file", "names/team"),
        ("file", "answers"),
        ("file", "names"),  # a directory store refuses to open over it at all
    ],
)
def test_upkeep_refuses_a_link_that_leads_nowhere_in_a_section_that_refers_to_blobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], home: str, linked: str
) -> None:
    """names/ or a folder of answers/ moved to another disk and linked, that disk not
    mounted: the link leads nowhere, and what it holds was listed as nothing, so gc took
    the blobs it refers to for unused and removed them. gc and verify refuse, naming the
    link and saying to mount its disk or remove it; nothing is removed, and once the disk
    is back gc keeps what it refers to."""
    root = tmp_path / "store"
    where = str(root) if home == "local" else root.as_uri()
    store = _at(where, home)
    name = "team/data/v1" if linked == "names/team" else "data/v1"
    (root / "names").mkdir(exist_ok=True)
    disk = tmp_path / "disk"
    if linked == "names/team":
        (disk / "team").mkdir(parents=True)
        (root / "names" / "team").symlink_to(disk / "team", target_is_directory=True)
    bound = store.put(b"a dataset")
    store.bind(name, bound)
    answer = store.keep(key_of(1), b"an answer", "plain")
    link = root / (linked if linked != "answers" else f"answers/{key_of(1)[7:9]}")
    if linked != "names/team":
        disk.mkdir()
        link.rename(disk / link.name)
        link.symlink_to(disk / link.name, target_is_directory=True)
    disk.rename(tmp_path / "unmounted")
    for upkeep in (lambda: _at(where, home).gc(grace=0), lambda: _at(where, home).verify()):
        with pytest.raises(StoreError, match=rf"{linked}.* leads nowhere.* mount"):
            upkeep()
    assert main(["store", "gc", "--store", where, "--grace", "0"]) == 2
    assert "leads nowhere" in capsys.readouterr().err
    (tmp_path / "unmounted").rename(disk)
    assert _at(where, home).gc(grace=0).blobs == 0
    assert LocalStore(root).has_blob(bound) and LocalStore(root).has_blob(answer.value)
    assert LocalStore(root).resolve(name) == bound


def test_a_store_whose_blobs_are_on_another_filesystem_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """blobs/ symlinked to another disk cannot take a file renamed from tmp/ (EXDEV): a keep
    fails with a StoreError saying the store's folders must be on one filesystem, and leaves
    nothing in tmp/."""
    store = LocalStore(tmp_path / "store")
    replace = os.replace

    def across(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        if f"{os.sep}blobs{os.sep}" in os.fspath(target):
            raise OSError(errno.EXDEV, "Invalid cross-device link", os.fspath(source))
        replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", across)
    with pytest.raises(StoreError, match=r"on different filesystems.*must all be on one"):
        store.keep(key_of(1), b"an answer", "plain")
    monkeypatch.undo()
    assert list((tmp_path / "store" / "tmp").iterdir()) == []


HOMES = [
    ("local", lambda where: LocalStore(where / "local")),
    ("s3", lambda where: Store.on_bucket(s3_url(), **s3_options())),
    ("s3-cached", lambda where: Store.on_bucket(s3_url(), cache=where / "c", **s3_options())),
]


def _reopen(home: Store) -> Store:
    if isinstance(home, LocalStore):
        return LocalStore(home.root)
    from somatize.store import BucketStore

    assert isinstance(home, BucketStore)
    cache = home.cache.root if home.cache is not None else None
    return Store.on_bucket(home.url, cache=cache, **home.storage_options)


@pytest.fixture(params=[factory for _, factory in HOMES], ids=[name for name, _ in HOMES])
def home(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return request.param(tmp_path)  # type: ignore[no-any-return]


def test_an_item_kept_again_alone_supersedes_its_pack(home: Store) -> None:
    """An item packed under one fingerprint and kept again alone under another (what a
    strict run does when the code changed) is recalled as the newer answer: in the same
    process, and in a fresh one whether it asks have() first or not."""
    items = [(key_of(i), b"old %d" % i) for i in range(4)]
    home.keep_many(items, "plain", fingerprint="code-v1")
    home.have([key for key, _ in items])
    home.keep(key_of(0), b"new 0", "plain", fingerprint="code-v2")
    for store in (home, _reopen(home), _reopen(home)):
        if store is not home:
            assert store.have([key for key, _ in items]) == {key for key, _ in items}
        answer, data = store.recall(key_of(0))
        assert (answer.fingerprint, bytes(data)) == ("code-v2", b"new 0")
        got = store.recall_many([key_of(0), key_of(1)])
        assert bytes(got[key_of(0)][1]) == b"new 0"  # type: ignore[index]
        assert bytes(got[key_of(1)][1]) == b"old 1"  # type: ignore[index]
    fresh = _reopen(home)
    assert fresh.recall(key_of(0))[0].fingerprint == "code-v2"


def test_a_pack_kept_after_a_record_supersedes_it(home: Store) -> None:
    """An answer kept alone and then packed again under a new fingerprint is recalled as
    the packed, newer answer, by a fresh process too."""
    home.keep(key_of(0), b"old 0", "plain", fingerprint="code-v1")
    home.keep_many([(key_of(0), b"new 0"), (key_of(1), b"new 1")], "plain", "code-v2")
    for store in (home, _reopen(home)):
        answer, data = store.recall(key_of(0))
        assert (answer.fingerprint, bytes(data)) == ("code-v2", b"new 0")


@pytest.mark.parametrize("later", ["kept alone", "packed"])
def test_an_answer_kept_after_one_stamped_ahead_by_a_skewed_clock_supersedes_it(
    home: Store, later: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer written by a machine whose clock runs ahead carries a `created` in the
    future; one kept after it, by a store object that has read it (the engine reads it,
    finds the code changed, and recomputes), is still the one recalled from then on, not
    the older answer stamped later."""
    ahead = time.time() + 600
    with monkeypatch.context() as clock:
        clock.setattr(time, "time", lambda: ahead)
        if later == "kept alone":
            home.keep_many([(key_of(0), b"old 0"), (key_of(1), b"old 1")], "plain", "code-v1")
        else:
            home.keep(key_of(0), b"old 0", "plain", fingerprint="code-v1")
    writer = _reopen(home)
    assert writer.have([key_of(0)]) == {key_of(0)}
    assert writer.recall(key_of(0))[0].fingerprint == "code-v1"
    if later == "kept alone":
        writer.keep(key_of(0), b"new 0", "plain", fingerprint="code-v2")
    else:
        writer.keep_many([(key_of(0), b"new 0"), (key_of(2), b"new 2")], "plain", "code-v2")
    for store in (writer, _reopen(home)):
        store.have([key_of(0)])
        answer, data = store.recall(key_of(0))
        assert (answer.fingerprint, bytes(data)) == ("code-v2", b"new 0")


def _fresh_stores_recall_the_new_answer(root: Path) -> None:
    """Asserts that a store opened afresh at ``root`` recalls the code-v2 answer of key 0,
    whether it asks have() first or not."""
    for ask in ("have", "recall"):
        fresh = LocalStore(root)
        if ask == "have":
            assert fresh.have([key_of(0)]) == {key_of(0)}
        answer, data = fresh.recall(key_of(0))
        assert (answer.fingerprint, bytes(data)) == ("code-v2", b"new 0")


def test_a_pack_kept_after_a_record_stamped_ahead_still_supersedes_it_once_the_clock_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record stamped ahead by a machine whose clock runs fast, then packed anew by a store
    object that read it (its pack stamped just after it), is answered by the pack also once
    this machine's clock has passed both stamps: the pack's file went into packs/ before
    then, and no time of the folder says which is newer."""
    ahead = time.time() + 600
    with monkeypatch.context() as clock:
        clock.setattr(time, "time", lambda: ahead)
        LocalStore(tmp_path / "store").keep(key_of(0), b"old 0", "plain", fingerprint="code-v1")
    writer = LocalStore(tmp_path / "store")
    assert writer.recall(key_of(0))[0].fingerprint == "code-v1"
    writer.keep_many([(key_of(0), b"new 0"), (key_of(1), b"new 1")], "plain", "code-v2")
    later = (ahead + 60) * 10**9
    monkeypatch.setattr(time, "time_ns", lambda: int(later))
    monkeypatch.setattr(time, "time", lambda: later / 10**9)
    _fresh_stores_recall_the_new_answer(tmp_path / "store")


def test_a_pack_kept_after_a_record_supersedes_it_where_the_folder_clock_runs_behind(
    tmp_path: Path,
) -> None:
    """A store on a network filesystem has its files stamped by the server's clock, which may
    run behind the writers': a pack kept after a record still answers its key, though
    packs/ was stamped before the record was created."""
    store = LocalStore(tmp_path / "store")
    store.keep(key_of(0), b"old 0", "plain", fingerprint="code-v1")
    store.keep_many([(key_of(0), b"new 0"), (key_of(1), b"new 1")], "plain", "code-v2")
    behind = time.time_ns() - 3600 * 10**9  # the server's clock, an hour behind
    os.utime(tmp_path / "store" / "packs", ns=(behind, behind))
    _fresh_stores_recall_the_new_answer(tmp_path / "store")


@pytest.mark.parametrize("newest_listed", ["first", "last"])
def test_of_two_packs_holding_a_key_the_newer_wins(tmp_path: Path, newest_listed: str) -> None:
    """When two packs hold one key, the newer pack's answer is recalled, whatever order the
    directory lists them in."""
    store = LocalStore(tmp_path / "store")
    items = [(key_of(i), b"old %d" % i) for i in range(3)]
    store.keep_many(items, "plain", fingerprint="code-v1")
    store.keep_many([(k, b"new %d" % i) for i, (k, _) in enumerate(items)], "plain", "code-v2")
    fresh = LocalStore(tmp_path / "store")
    listed = fresh._listed_packs

    def ordered() -> dict[str, str] | None:
        found = listed()
        if found is None:
            return None
        packs = {
            p: LocalStore(tmp_path / "store")._read_indexes({p: w})[p] for p, w in found.items()
        }
        old = [p for p, data in packs.items() if data is not None and b"code-v1" in data]
        order = sorted(found, key=lambda p: (p in old) == (newest_listed == "first"))
        return {p: found[p] for p in order}

    fresh._listed_packs = ordered  # type: ignore[method-assign]
    answer, data = fresh.recall(key_of(1))
    assert (answer.fingerprint, bytes(data)) == ("code-v2", b"new 1")


def _counting_index_reads(store: LocalStore) -> list[str]:
    """The ids of the pack indexes ``store`` reads from now on, in the order read."""
    read: list[str] = []
    reading = store._read_indexes

    def counted(wanted: dict[str, str]) -> dict[str, bytes | None]:
        read.extend(wanted)
        return reading(wanted)

    store._read_indexes = counted  # type: ignore[method-assign]
    return read


def test_a_record_kept_after_every_pack_is_answered_reading_no_index(tmp_path: Path) -> None:
    """A key kept as a record after every pack (a wrapped model's answer in a store of
    rows) is looked up and recalled by a store opened afresh without reading any pack
    index; a packed key is then found as ever, and a record older than a pack is looked
    up against the packs."""
    store = LocalStore(tmp_path / "store")
    rows = [(key_of(i), b"row %d" % i) for i in range(3)]
    store.keep_many(rows, "plain")
    old = time.time_ns() - 3600 * 10**9  # the packs were written an hour ago
    os.utime(tmp_path / "store" / "packs", ns=(old, old))
    store.keep(key_of(10), b"the model's answer", "plain")
    for ask in ("have", "recall"):
        fresh = LocalStore(tmp_path / "store")
        read = _counting_index_reads(fresh)
        if ask == "have":
            assert fresh.have([key_of(10)]) == {key_of(10)}
        assert bytes(fresh.recall(key_of(10))[1]) == b"the model's answer"
        assert read == []
        assert bytes(fresh.recall(key_of(1))[1]) == b"row 1"
        assert len(read) == 1
    store.keep_many([(key_of(20), b"row 20"), (key_of(21), b"row 21")], "plain")  # after it
    fresh = LocalStore(tmp_path / "store")
    read = _counting_index_reads(fresh)
    assert bytes(fresh.recall(key_of(10))[1]) == b"the model's answer"
    assert len(read) == 2


def test_a_store_that_forgot_what_it_held_reads_no_pack_index_head_again(
    tmp_path: Path,
) -> None:
    """What a pack index's first line says (its ``created``) is read once: the name of an
    index is the digest of its bytes. A store that let go of what it held (after a gc, a
    verify, or a file moved aside) lists packs/ again, but reads no head it read before."""
    store = LocalStore(tmp_path / "store")
    for i in range(3):
        store.keep_many([(key_of(i), b"row"), (key_of(i + 3), b"row")], "plain")
    old = time.time_ns() - 3600 * 10**9  # the packs were written an hour ago
    os.utime(tmp_path / "store" / "packs", ns=(old, old))
    store.keep(key_of(10), b"the model's answer", "plain")
    fresh = LocalStore(tmp_path / "store")
    heads: list[str] = []
    reading = fresh._pack_created

    def counted(name: str) -> float:
        heads.append(name)
        return reading(name)

    fresh._pack_created = counted  # type: ignore[method-assign]
    assert bytes(fresh.recall(key_of(10))[1]) == b"the model's answer"
    assert len(heads) == 3
    fresh._forget_all()
    assert bytes(fresh.recall(key_of(10))[1]) == b"the model's answer"
    assert len(heads) == 3


def test_names_signed_before_names_covered_themselves_are_reported_not_refused(
    tmp_path: Path,
) -> None:
    """A signed store whose only names were signed over their digest alone, as somatize once
    signed them: verify and gc run with the store's key, report each such name and keep its
    blob; the name is refused until it is bound again, and then resolves."""
    store = LocalStore(tmp_path / "store", signing_key="team")
    digest = store.put(b"the training set")
    signer = Signer("team")
    old = digest.encode() + b"\nmac:" + signer.mac(digest.encode()).hex().encode()
    (tmp_path / "store" / "names" / "data").mkdir(parents=True)
    (tmp_path / "store" / "names" / "data" / "v1").write_bytes(old)
    fresh = LocalStore(tmp_path / "store", signing_key="team")
    with pytest.raises(NameSignedAlone, match=r"bound again .*store\.bind\('data/v1', digest\)"):
        fresh.resolve("data/v1")
    report = fresh.verify()
    assert [(d.section, d.name) for d in report.damaged] == [("names", "data/v1")]
    fresh.gc(grace=0)
    assert fresh.get(digest) == b"the training set"
    fresh.bind("data/v1", digest)
    assert LocalStore(tmp_path / "store", signing_key="team").resolve("data/v1") == digest


def _plant(home: Store, relative: str, data: bytes) -> None:
    """Writes ``relative`` (``blobs/.DS_Store``) into the home behind the store's back."""
    if isinstance(home, LocalStore):
        (home.root / relative).parent.mkdir(parents=True, exist_ok=True)
        (home.root / relative).write_bytes(data)
        return
    from somatize.store import BucketStore

    assert isinstance(home, BucketStore)
    home.fs.pipe_file(f"{home.root}/{relative}", data)


def _held(home: Store, relative: str) -> bytes:
    """The bytes of the file at ``relative`` (``names/data/v1``) in the home."""
    if isinstance(home, LocalStore):
        return (home.root / relative).read_bytes()
    from somatize.store import BucketStore

    assert isinstance(home, BucketStore)
    return bytes(home.fs.cat_file(f"{home.root}/{relative}"))


def test_a_stray_file_in_blobs_is_listed_not_fatal(home: Store) -> None:
    """Files in blobs/ not laid out as blobs are (a .DS_Store, an NFS .nfs file, a digest in
    another's folder) do not stop verify: they are listed as stray, not as damage; gc removes
    them from a local store as it removes any file there nothing refers to, and leaves them
    under a bucket's prefix, where they are a user's."""
    blob = home.keep(key_of(1), b"an answer", "plain").value
    strays = ["blobs/.DS_Store", "blobs/ab/.nfs0000000000001234", f"blobs/ab/{'cd' * 32}"]
    for stray in strays:
        _plant(home, stray, b"not a blob")
    found = _reopen(home).verify(quarantine=True)
    assert found.ok and found.blobs == 1 and found.quarantined == []
    assert sorted(found.stray) == sorted(strays)
    _reopen(home).gc(grace=0)
    fresh = _reopen(home)
    listed = [e.name for e in fresh._entries("blobs")]  # type: ignore[attr-defined]
    left = [] if isinstance(home, LocalStore) else [s.removeprefix("blobs/") for s in strays]
    assert sorted(listed) == sorted([f"{blob[7:9]}/{blob[7:]}", *left])
    assert bytes(fresh.recall(key_of(1))[1]) == b"an answer"


def _keeping_again_after_listing(collector: Store, writer: Store, data: bytes) -> None:
    """Makes ``writer`` keep ``key_of(1)`` anew (``data``) right after ``collector``'s gc
    has read the records it decides by: what a writer in another process may do then."""
    read = collector._read_many  # type: ignore[attr-defined]
    done: list[bool] = []

    def reading(section: str, names: list[str]) -> dict[str, bytes | None]:
        found: dict[str, bytes | None] = read(section, names)
        if section == "answers" and not done:
            done.append(True)
            writer.keep(key_of(1), data, "plain")
        return found

    collector._read_many = reading  # type: ignore[attr-defined]


def test_gc_keeps_an_answer_kept_again_after_it_listed_the_store(home: Store) -> None:
    """gc --max-bytes drops the answers it listed, as it read them: a record a writer
    publishes again under one of their keys after that (a fresh answer) is the writer's,
    and stays, whole and recalled."""
    home.keep(key_of(1), b"an old answer", "plain")
    home.keep(key_of(2), b"another old answer", "plain")
    collector = _reopen(home)
    _keeping_again_after_listing(collector, _reopen(home), b"a fresh answer")
    done = collector.gc(0, grace=0)
    assert done.answers == 1
    fresh = _reopen(home)
    assert fresh.have([key_of(1), key_of(2)]) == {key_of(1)}
    assert bytes(fresh.recall(key_of(1))[1]) == b"a fresh answer"
    assert fresh.verify().ok


def test_gc_puts_back_a_record_kept_again_never_over_a_newer_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record gc set aside to drop, which turned out to be kept again since it was listed,
    is put back only where no record was published meanwhile: the newest stays."""
    store = LocalStore(tmp_path / "store")
    store.keep(key_of(1), b"an old answer", "plain")
    collector = LocalStore(tmp_path / "store")
    _keeping_again_after_listing(collector, LocalStore(tmp_path / "store"), b"a fresh answer")
    link = os.link

    def newer_first(source: Any, target: Any) -> None:
        LocalStore(tmp_path / "store").keep(key_of(1), b"the newest answer", "plain")
        link(source, target)

    monkeypatch.setattr(os, "link", newer_first)
    collector.gc(0, grace=0)
    monkeypatch.undo()
    fresh = LocalStore(tmp_path / "store")
    assert bytes(fresh.recall(key_of(1))[1]) == b"the newest answer"
    assert fresh.verify().ok
    assert not list((tmp_path / "store" / "tmp").iterdir())


def test_a_name_file_holding_another_names_binding_is_told_and_pins_its_blob(
    home: Store,
) -> None:
    """A name's file copied from another name's (bound without a key) is reported by verify
    as holding another name's binding, and its blob is kept by gc all the same, though the
    name it was bound for now points elsewhere: a name is never collected. It says which
    blob it was bound to (one the store holds), so verify --quarantine leaves it, and gc
    keeps that blob alone."""
    named = home.put(b"the training set")
    home.bind("data/v1", named)
    _plant(home, "names/data/v2", _held(home, "names/data/v1"))
    home.bind("data/v1", home.put(b"the training set, again"))
    found = _reopen(home).verify()
    assert [(d.section, d.name) for d in found.damaged] == [("names", "data/v2")]
    assert "holds another name's binding" in found.damaged[0].why
    assert found.names == 2 and found.quarantined == []
    assert _reopen(home).gc(0, grace=0).unread_names == []
    assert bytes(_reopen(home).get(named)) == b"the training set"
    assert _reopen(home).verify(quarantine=True).quarantined == []


def _damaged_name(data: bytes, damage: str) -> bytes:
    """The bytes of a name's file ``data`` with ``damage`` done to them."""
    if damage == "a digit flipped":
        at = len("blake3:") + 10
        return data[:at] + (b"0" if data[at : at + 1] != b"0" else b"1") + data[at + 1 :]
    if damage == "cut short":
        return data[:30]
    return b"\xff\xfe\x00 not a name"


def _with_a_damaged_name(home: Store, damage: str) -> tuple[str, str, str]:
    """Binds `data/v1`, keeps an answer and puts a blob no one refers to, then damages the
    name's file: the named blob, the answer's, and the loose one."""
    named = home.put(b"the training set")
    home.bind("data/v1", named)
    answered = home.keep(key_of(1), b"an answer", "plain").value
    loose = home.put(b"put, and never bound")
    _plant(home, "names/data/v1", _damaged_name(_held(home, "names/data/v1"), damage))
    return named, answered, loose


@pytest.mark.parametrize("damage", ["a digit flipped", "cut short", "unreadable"])
def test_gc_meeting_a_name_it_cannot_read_keeps_every_blob_a_name_may_point_at(
    home: Store, damage: str
) -> None:
    """A name whose file is damaged (a digit of its digest flipped, cut short, garbled) may
    point at any blob: gc keeps every blob that no record and no readable name refers to
    (the named one, an answer's it dropped, one put and never bound), says which name it
    could not read and how much it kept for it, and drops answers by budget as ever."""
    named, answered, loose = _with_a_damaged_name(home, damage)
    done = _reopen(home).gc(0, grace=0)
    assert done.answers == 1 and done.blobs == 0
    assert done.unread_names == ["data/v1"]
    assert done.held_for_names == len(b"the training setan answerput, and never bound")
    fresh = _reopen(home)
    assert fresh.have([key_of(1)]) == set()
    assert all(fresh.has_blob(blob) for blob in (named, answered, loose))
    found = fresh.verify()
    assert [(d.section, d.name) for d in found.damaged] == [("names", "data/v1")]


@pytest.mark.parametrize(
    ("damage", "mended"), [("a digit flipped", "quarantined"), ("cut short", "bound again")]
)
def test_a_name_quarantined_or_bound_again_lets_gc_collect_as_before(
    home: Store, damage: str, mended: str
) -> None:
    """Once the damaged name is moved aside by verify --quarantine (it can still be looked
    at in quarantine/) or bound again, gc removes the blobs nothing refers to as before."""
    named, answered, loose = _with_a_damaged_name(home, damage)
    if mended == "quarantined":
        found = _reopen(home).verify(quarantine=True)
        assert found.quarantined == ["names/data/v1"]
        with pytest.raises(NameNotFound):
            _reopen(home).resolve("data/v1")
    else:
        _reopen(home).bind("data/v1", named)
    done = _reopen(home).gc(0, grace=0)
    assert done.unread_names == [] and done.held_for_names == 0
    fresh = _reopen(home)
    assert not fresh.has_blob(answered) and not fresh.has_blob(loose)
    assert fresh.has_blob(named) == (mended == "bound again")
    assert fresh.verify().ok


def test_a_signed_name_failing_its_signature_keeps_every_blob_a_name_may_point_at(
    tmp_path: Path,
) -> None:
    """In a signed store, a name whose digest had a digit flipped fails its signature: gc
    keeps what it may point at, until the name is bound again with the key; a name signed
    over its digest alone (as an earlier somatize signed names) holds a good digest, and
    stops nothing."""
    store = LocalStore(tmp_path / "store", signing_key="team")
    named = store.put(b"the training set")
    store.bind("data/v1", named)
    loose = store.put(b"put, and never bound")
    name_file = tmp_path / "store" / "names" / "data" / "v1"
    name_file.write_bytes(_damaged_name(name_file.read_bytes(), "a digit flipped"))
    alone = named.encode() + b"\nmac:" + Signer("team").mac(named.encode()).hex().encode()
    (tmp_path / "store" / "names" / "data" / "old").write_bytes(alone)
    done = LocalStore(tmp_path / "store", signing_key="team").gc(grace=0)
    assert done.unread_names == ["data/v1"] and done.blobs == 0
    assert store.has_blob(named) and store.has_blob(loose)
    LocalStore(tmp_path / "store", signing_key="team").bind("data/v1", named)
    found = LocalStore(tmp_path / "store", signing_key="team").verify(quarantine=True)
    assert [d.name for d in found.damaged] == ["data/old"] and found.quarantined == []
    done = LocalStore(tmp_path / "store", signing_key="team").gc(grace=0)
    assert done.unread_names == [] and done.blobs == 1
    assert store.has_blob(named) and not store.has_blob(loose)


@pytest.mark.parametrize("bound_with", ["another key", "no key"])
def test_a_name_signed_otherwise_is_told_and_keeps_its_blob_alone(
    tmp_path: Path, bound_with: str
) -> None:
    """In a signed store, a name bound with another key or without one, whole and pointing
    at a blob the store holds, is told by verify (not trusted here), yet verify --quarantine
    leaves it in place and gc keeps its blob, and only its blob: it says which blob it was
    bound to. It was moved aside as a damaged one, and the next gc removed its dataset."""
    signed = LocalStore(tmp_path / "store", signing_key="team")
    signed.keep(key_of(1), b"an answer", "plain")
    other = LocalStore(
        tmp_path / "store", **({"signing_key": "B"} if bound_with != "no key" else {})
    )
    named = other.put(b"their training set")
    other.bind("data/theirs", named)
    loose = signed.put(b"put, and never bound")
    found = LocalStore(tmp_path / "store", signing_key="team").verify(quarantine=True)
    assert [(d.section, d.name) for d in found.damaged] == [("names", "data/theirs")]
    assert found.quarantined == []
    done = LocalStore(tmp_path / "store", signing_key="team").gc(grace=0)
    assert done.unread_names == [] and done.blobs == 1
    assert not signed.has_blob(loose)
    assert bytes(other.get(other.resolve("data/theirs"))) == b"their training set"


def test_a_stray_file_in_names_is_listed_not_damage(home: Store) -> None:
    """Files in names/ that are no name (a .DS_Store Finder left, one in a folder of names,
    one whose name is not UTF-8) are listed as stray by verify, not as damage it reports at
    every run; gc goes on and leaves them, and a blob such a file points at is kept all the
    same: nothing under names/ is collected."""
    named = home.put(b"the training set")
    home.bind("data/v1", named)
    pointed = home.put(b"what an old file in names/ points at")
    strays = ["names/.DS_Store", "names/data/.DS_Store", "names/_old"]
    for stray in strays[:2]:
        _plant(home, stray, b"\0\0\0\1Bud1")
    _plant(home, strays[2], pointed.encode())
    if isinstance(home, LocalStore):
        with open(os.path.join(os.fsencode(home.root / "names"), b"x\xffy"), "wb") as f:
            f.write(b"junk")
        strays.append("names/x\udcffy")
    found = _reopen(home).verify(quarantine=True)
    assert found.ok and found.names == 1 and found.quarantined == []
    assert sorted(found.stray) == sorted(strays)
    _reopen(home).gc(0, grace=0)
    fresh = _reopen(home)
    listed = {e.name for e in fresh._entries("names")}  # type: ignore[attr-defined]
    assert listed == {"data/v1"} | {s.removeprefix("names/") for s in strays}
    assert bytes(fresh.get(fresh.resolve("data/v1"))) == b"the training set"
    assert fresh.has_blob(pointed)


def test_a_stray_file_in_answers_or_packs_is_listed_not_damage(home: Store) -> None:
    """Files in answers/ and packs/ named by no digest (a .DS_Store Finder left, an NFS
    .nfs… file), in a shard's folder or beside the shards, are listed as stray by verify,
    not as damage it reports (and quarantines) at every run; gc leaves them, and the
    answers beside them stay whole."""
    key = "blake3:" + "ab" * 32
    home.keep(key, b"kept whole", "plain")
    home.keep_many([(f"blake3:{i:064x}", [b"item"]) for i in range(3)], "plain")
    strays = ["answers/ab/.DS_Store", "answers/.DS_Store", "packs/.nfs0000000000a1b2c300000001"]
    for stray in strays:
        _plant(home, stray, b"\0\0\0\1Bud1")
    found = _reopen(home).verify(quarantine=True)
    assert found.ok and found.records == 1 and found.packs == 1 and found.quarantined == []
    assert sorted(found.stray) == sorted(strays)
    _reopen(home).gc(10**9, grace=0)
    assert _reopen(home).verify().ok
    assert bytes(_reopen(home).recall(key)[1]) == b"kept whole"


def test_a_stray_copy_of_a_record_or_index_is_never_collected(home: Store) -> None:
    """A record copied by hand where no record lies (another shard's folder, a folder of
    its own) and a pack index copied into a folder are stray, and gc leaves them as it
    leaves every stray, even one dropping every answer, with the blob each refers to;
    the answers they are copies of are dropped as ever."""
    key = "blake3:" + "ab" * 32
    home.keep(key, b"kept whole", "plain")
    home.keep_many([(f"blake3:{i:064x}", [b"item"]) for i in range(3)], "plain")
    blob = home.recall(key)[0].value
    shelf: Any = home
    record = shelf._read_many("answers", [f"ab/{key[7:]}"])[f"ab/{key[7:]}"]
    strays = [("answers", f"cd/{key[7:]}", record)]
    if isinstance(home, LocalStore):
        (index,) = shelf._entries("packs")
        data = shelf._read_many("packs", [index.name])[index.name]
        strays += [("answers", f"old/ab/{key[7:]}", record), ("packs", f"old/{index.name}", data)]
    for section, name, data in strays:
        _plant(home, f"{section}/{name}", data)
    found = _reopen(home).verify()
    assert found.ok and sorted(found.stray) == sorted(f"{s}/{n}" for s, n, _ in strays)
    done = _reopen(home).gc(0, grace=0)
    assert (done.answers, done.packs) == (1, 1)
    again: Any = _reopen(home)
    for section, name, data in strays:
        assert again._read_many(section, [name])[name] == data
    assert again.answer(key) is None
    assert again.has_blob(blob)


def _as_newer(home: Store) -> tuple[str, str, list[str]]:
    """Keeps an answer and a pack, and writes their record and index over as a newer
    somatize would (a later format version, and a field this one does not know): the
    record's file, the index's file and the blobs they refer to."""
    key = "blake3:" + "ab" * 32
    blobs = [home.keep(key, b"kept whole", "plain").value]
    items = [(f"blake3:{i:064x}", [b"item"]) for i in range(3)]
    blobs.append(home.keep_many(items, "plain")[0].value)
    shelf: Any = home
    record = f"ab/{key[7:]}"
    fields = json.loads(shelf._read_many("answers", [record])[record])
    shelf._remove("answers", [record])
    _plant(home, f"answers/{record}", json.dumps({**fields, "somatize": 2, "more": 1}).encode())
    (index,) = shelf._entries("packs")
    header, _, table = shelf._read_many("packs", [index.name])[index.name].partition(b"\n")
    header = json.dumps({**json.loads(header), "pack": 2}).encode()
    data = header + b"\n" + table
    shelf._remove("packs", [index.name])
    _plant(home, f"packs/{blake3.blake3(data).hexdigest()}", data)
    return f"answers/{record}", f"packs/{blake3.blake3(data).hexdigest()}", blobs


def test_what_a_newer_somatize_wrote_is_neither_damage_nor_collected(home: Store) -> None:
    """A record and a pack index a newer somatize wrote, in a format version this one does
    not read, are misses here, said as such (NewerFormat), not damage: verify lists them
    apart and moves nothing aside, and gc, which cannot tell which blobs they refer to,
    removes nothing, rather than remove them from under the somatize that reads them."""
    record, index, blobs = _as_newer(home)
    fresh: Any = _reopen(home)
    if not isinstance(home, LocalStore):  # a cache holds the copies this somatize wrote
        fresh = Store.on_bucket(fresh.url, **fresh.storage_options)
    assert fresh.have(["blake3:" + "ab" * 32, f"blake3:{0:064x}"]) == set()
    with pytest.raises(NewerFormat, match=r"newer somatize, in format version 2"):
        fresh.recall("blake3:" + "ab" * 32)
    found = _reopen(home).verify(quarantine=True)
    assert found.ok and found.quarantined == [] and found.unmoved == {}
    assert sorted(f"{n.section}/{n.name}" for n in found.newer) == sorted([record, index])
    with pytest.raises(StoreError, match=r"nothing was collected.*2 of its records"):
        _reopen(home).gc(0, grace=0)
    again: Any = _reopen(home)
    for relative in (record, index):
        section, name = relative.split("/", 1)
        assert again._read_many(section, [name])[name] is not None
    assert all(again.has_blob(blob) for blob in blobs)


def test_the_command_line_says_what_a_newer_somatize_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verify --quarantine` lists a record and an index a newer somatize wrote as newer, not
    damaged, and exits 0; `show` says it is newer (not damage to move aside); `gc` exits 2,
    saying why and what to do where no newer somatize writes (the version garbled), and the
    store keeps them with their blobs."""
    store = LocalStore(tmp_path / "store")
    record, index, blobs = _as_newer(store)
    where = str(store.root)
    assert main(["store", "verify", "--store", where, "--quarantine"]) == 0
    printed = capsys.readouterr().out
    assert f"newer   {record}: " in printed and f"newer   {index}: " in printed
    assert "DAMAGED" not in printed
    assert main(["store", "show", "blake3:" + "ab" * 32, "--store", where]) == 1
    said = capsys.readouterr().err
    assert "NEWER" in said and "format version 2" in said and "quarantine" not in said
    assert main(["store", "gc", "--store", where, "--grace", "0", "--max-bytes", "0"]) == 2
    said = capsys.readouterr().err
    assert "written by a newer somatize" in said and "out of the store by hand" in said
    assert (store.root / record).exists() and (store.root / index).exists()
    assert all(LocalStore(where).has_blob(blob) for blob in blobs)


def test_a_signed_record_whose_version_was_garbled_is_damage_not_newer(tmp_path: Path) -> None:
    """In a signed store, a record whose version digit was garbled after it was signed (read
    as a later version) fails its signature: verify tells it as damage and moves it aside,
    and gc collects the store. It was listed as a newer somatize's, no damage, never moved,
    and gc refused to run for good. One a newer somatize signed with the key is newer."""
    store = LocalStore(tmp_path / "store", signing_key="team")
    keys = [key_of(1), key_of(2)]
    for key in keys:
        store.keep(key, key.encode(), "plain")
    garbled, newer = (tmp_path / "store" / "answers" / k[7:9] / k[7:] for k in keys)
    garbled.write_bytes(garbled.read_bytes().replace(b'"somatize":1', b'"somatize":9'))
    body = newer.read_bytes().partition(b"\nmac:")[0].replace(b'"somatize":1', b'"somatize":2')
    newer.write_bytes(body + b"\nmac:" + Signer("team").mac(body).hex().encode())
    found = LocalStore(tmp_path / "store", signing_key="team").verify(quarantine=True)
    names = [f"{key[7:9]}/{key[7:]}" for key in keys]
    assert [d.name for d in found.damaged] == names[:1] and "signature" in found.damaged[0].why
    assert found.quarantined == [f"answers/{names[0]}"]
    assert [n.name for n in found.newer] == names[1:]
    newer.unlink()  # the newer somatize's, which this one leaves to it
    assert LocalStore(tmp_path / "store", signing_key="team").gc(grace=0).blobs == 2


def test_names_laid_out_as_a_store_are_names(home: Store) -> None:
    """Names bound under a folder as a store lays out its files (``mirror/blobs/ab/<hex>``,
    ``mirror/names/latest``) are this store's names: verify counts them, and gc, even one
    dropping every answer, keeps the blobs they point at."""
    datasets = [home.put(b"weights"), home.put(b"an index")]
    hexed = datasets[0].removeprefix("blake3:")
    names = [f"mirror/blobs/{hexed[:2]}/{hexed}", "mirror/names/latest"]
    for name, digest in zip(names, datasets, strict=True):
        home.bind(name, digest)
    found = _reopen(home).verify()
    assert found.ok and (found.names, found.stray) == (2, [])
    assert _reopen(home).gc(0, grace=0).blobs == 0
    again = _reopen(home)
    for name, data in zip(names, [b"weights", b"an index"], strict=True):
        assert bytes(again.get(again.resolve(name))) == data


def test_a_fifo_in_a_local_store_is_passed_over(tmp_path: Path) -> None:
    """A FIFO (or a link to a device) in a local store's folders is no file of the store:
    listing, verify and gc pass it over, where opening it waited for a writer for good; a
    FIFO where a record is looked for is read as a damaged record, not waited on."""
    store = LocalStore(tmp_path / "s")
    key = "blake3:" + "ab" * 32
    store.keep(key, b"kept", "plain")
    root = tmp_path / "s"
    os.mkfifo(root / "blobs" / "fifo")
    (root / "answers" / "cd").mkdir()
    os.mkfifo(root / "answers" / "cd" / ("cd" * 32))  # where that key's record would be
    (root / "packs").mkdir(exist_ok=True)
    os.symlink("/dev/zero", root / "packs" / "zero")
    found = _reopen(store).verify()
    assert found.ok and found.records == 1
    _reopen(store).gc(10**9, grace=0)
    fresh = _reopen(store)
    assert bytes(fresh.recall(key)[1]) == b"kept"
    assert fresh.have(["blake3:" + "cd" * 32]) == set()


def test_a_bind_whose_blob_a_gc_removes_meanwhile_says_so(
    home: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blob removed (by a gc in another process) while a name is being bound to it makes
    the bind fail loudly, saying the name points at nothing until the bytes are put again;
    putting them again restores it."""
    digest = home.put(b"the training set")
    write = "_publish" if isinstance(home, LocalStore) else "_write"
    real = getattr(home, write)

    def removing_first(target: Any, pieces: Any) -> Any:
        if "names" in str(target):  # the blob was looked for; a gc elsewhere removes it now
            if isinstance(home, LocalStore):
                home.blob_path(digest).unlink()
            else:
                home.fs.rm(home._blob_path(digest))  # type: ignore[attr-defined]
        return real(target, pieces)

    monkeypatch.setattr(home, write, removing_first)
    with pytest.raises(Missing, match=r"removed meanwhile .* until its bytes are put again"):
        home.bind("data/v1", digest)
    monkeypatch.undo()
    fresh = _reopen(home)
    assert fresh.put(b"the training set") == digest
    assert bytes(fresh.get(fresh.resolve("data/v1"))) == b"the training set"


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_bind_while_gc_has_its_blob_set_aside_waits_for_it_to_come_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A gc sets an old blob aside in tmp/ to look at before removing it, and puts it back
    when it was touched since (put again by whoever is about to bind it). A bind that
    looks for the blob in that moment — before writing the name, or after — finds it
    back, rather than saying it is missing."""
    store = LocalStore(tmp_path / "store")
    digest = store.put(b"the training set")
    blob = store.blob_path(digest)
    aside = tmp_path / "aside"

    def set_aside() -> None:
        os.rename(blob, aside)
        threading.Timer(0.03, os.rename, (aside, blob)).start()

    if when == "before":
        set_aside()
    else:
        real = store._publish

        def setting_aside(target: Any, pieces: Any) -> Any:
            done = real(target, pieces)
            if "names" in str(target):
                set_aside()
            return done

        monkeypatch.setattr(store, "_publish", setting_aside)
    store.bind("data/v1", digest)
    monkeypatch.undo()
    assert bytes(store.get(store.resolve("data/v1"))) == b"the training set"


@pytest.mark.parametrize("grace", [-1.0, float("nan"), float("inf"), "60", True])
def test_a_grace_that_is_not_finite_seconds_is_refused(tmp_path: Path, grace: object) -> None:
    """gc's grace is finite seconds ≥ 0: a negative one (which would remove writes in flight
    in tmp/), NaN, infinity or a non-number is refused and nothing is removed."""
    store = LocalStore(tmp_path / "store")
    in_flight = tmp_path / "store" / "tmp" / "4242-writing.part"
    in_flight.write_bytes(b"being written")
    with pytest.raises(ValueError, match="grace is finite seconds ≥ 0"):
        store.gc(grace=grace)  # type: ignore[arg-type]
    assert in_flight.exists()


@pytest.mark.parametrize("max_bytes", [-1, float("nan"), float("inf"), "100", [1], True])
def test_a_max_bytes_that_is_not_a_number_of_bytes_is_refused(
    tmp_path: Path, max_bytes: object
) -> None:
    """gc's max_bytes is a finite number ≥ 0 (or None): a negative one, NaN (which compared
    as no limit), infinity, text, a list or True (which counted as one byte) is refused
    saying so, and no answer is dropped."""
    store = LocalStore(tmp_path / "store")
    keys = [f"blake3:{i:064x}" for i in range(3)]
    for key in keys:
        store.keep(key, bytes(1000), "plain")
    with pytest.raises(ValueError, match="max_bytes is a finite number of bytes ≥ 0"):
        store.gc(max_bytes=max_bytes, grace=0)  # type: ignore[arg-type]
    assert LocalStore(tmp_path / "store").have(keys) == set(keys)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("folder", ["answers/00", "names/data", "packs"])
@pytest.mark.parametrize("home", ["local", "file"])
def test_upkeep_that_cannot_read_a_folder_stops_and_removes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    folder: str,
    home: str,
) -> None:
    """A folder of a shared store this process may not read (made by another user with
    umask 077) is not taken for empty: gc and verify stop with StoreError naming it, the
    command line exits 2 with that one line, and nothing is removed — the blobs of the
    answers, packs and names it holds were not unused."""
    root = tmp_path / "store"
    where = str(root) if home == "local" else f"file://{root}"
    store = Store(root) if home == "local" else Store.on_bucket(where)
    for i in range(3):
        store.keep(key_of(i), bytes(1000 + i), "plain")
    store.keep_many([(key_of(100 + i), b"item %d" % i) for i in range(3)], "plain")
    store.bind("data/v1", store.put(b"the training set"))
    store.close()
    before = _files(root)
    hidden = str(root / folder)
    scandir = os.scandir

    def refusing(path: Any = ".") -> Any:
        if os.fspath(path).rstrip("/") == hidden:
            raise PermissionError(errno.EACCES, "Permission denied", hidden)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    fresh = Store(root) if home == "local" else Store.on_bucket(where)
    with pytest.raises(StoreError, match=folder):
        fresh.gc(0, grace=0)
    with pytest.raises(StoreError, match=folder):
        fresh.verify()
    command = ["store", "gc", "--store", where, "--grace", "0", "--max-bytes", "0"]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert folder in err and len(err.strip().splitlines()) == 1
    monkeypatch.undo()
    assert _files(root) == before
    assert Store(root).verify().ok


RACING = [
    ("local", lambda where: LocalStore(where / "local")),
    ("memory", lambda where: Store.on_bucket(f"memory://somatize/{uuid.uuid4().hex}")),
    ("file", lambda where: Store.on_bucket(f"file://{where}/file")),
]


@pytest.mark.parametrize("meanwhile", ["packs", "blobs"])
@pytest.mark.parametrize("make", [make for _, make in RACING], ids=[n for n, _ in RACING])
def test_two_gcs_at_once_both_finish(tmp_path: Path, make: Any, meanwhile: str) -> None:
    """Two gcs of one store at once (two threads, or two processes) both finish: what the
    other removed while one ran (a pack, a record, a blob, on a bucket the used/ logs of
    when answers were used) is gone, as both meant it to be — not an error."""
    first = make(tmp_path)
    for i in range(3):  # clients that each leave a note of when their answers were used
        other = _reopen(first)
        other.keep(key_of(10 + i), b"answer %d" % i, "plain")
        other.keep_many([(key_of(20 + 2 * i), b"item"), (key_of(21 + 2 * i), b"%d" % i)], "plain")
        other.recall(key_of(10 + i))
        other.recall(key_of(20 + 2 * i))
        other.close()
    second = _reopen(first)
    removing, sweeping = first._remove, first._sweep
    ran: list[str] = []

    def remove(section: str, names: list[str]) -> None:
        if section == meanwhile and not ran:  # the first is about to remove: the other runs
            ran.append(section)
            second.gc(0, grace=0)
        removing(section, names)

    def sweep(entries: list[Entry], referred: Any) -> list[Entry]:
        if not ran:  # the first is about to remove blobs: the other runs
            ran.append("blobs")
            second.gc(0, grace=0)
        return sweeping(entries, referred)  # type: ignore[no-any-return]

    first._remove = remove
    if meanwhile == "blobs":
        first._sweep = sweep
    first.gc(0, grace=0)
    assert ran == [meanwhile]
    fresh = _reopen(first)
    assert fresh.have([key_of(n) for n in range(10, 26)]) == set()
    assert fresh.verify().ok


def test_a_record_set_aside_that_another_gc_removed_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record a local gc set aside in tmp/ to compare before dropping it, which a gc in
    another process (grace 0) removed from tmp/ meanwhile, is gone as the first meant it
    to be: the first gc finishes, and says it dropped it."""
    store = LocalStore(tmp_path / "store")
    store.keep(key_of(1), b"an answer", "plain")
    collector = LocalStore(tmp_path / "store")
    rename = os.rename

    def renaming(source: Any, target: Any) -> None:
        rename(source, target)
        if str(target).endswith(".dropped"):  # set aside: a gc elsewhere runs now
            LocalStore(tmp_path / "store").gc(grace=0)

    monkeypatch.setattr(os, "rename", renaming)
    done = collector.gc(0, grace=0)
    monkeypatch.undo()
    assert done.answers == 1
    fresh = LocalStore(tmp_path / "store")
    assert fresh.have([key_of(1)]) == set()
    assert fresh.verify().ok
    assert not list((tmp_path / "store" / "tmp").iterdir())


OWN_WRITES = [
    (home, make, when)
    for home, make in RACING
    for when in ("written", "put", "packed")
    if (home, when) != ("memory", "written")  # an object store writes no file in tmp/
]


@pytest.mark.parametrize(
    ("make", "when"),
    [(make, when) for _, make, when in OWN_WRITES],
    ids=[f"{home}-{when}" for home, _, when in OWN_WRITES],
)
def test_gc_with_no_grace_leaves_the_writes_of_its_own_store_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any, when: str
) -> None:
    """A gc with grace 0 run in one thread while another thread of the same store object
    keeps an answer leaves that keep's writes alone: its file in tmp/ about to be renamed
    (the keep raised StoreError), and its blob put but not yet referred to by the record
    or pack index about to be published (the answer was kept, and missing)."""
    store = make(tmp_path)
    ran: list[str] = []

    def collecting(real: Any) -> Any:
        def hooked(*args: Any, **kwargs: Any) -> Any:
            if not ran:
                ran.append(when)
                store.gc(grace=0)  # what another thread does at this instant
            return real(*args, **kwargs)

        return hooked

    if when == "written" and isinstance(store, LocalStore):
        monkeypatch.setattr(store, "_place", collecting(store._place))
    elif when == "written":
        monkeypatch.setattr(store.fs, "mv", collecting(store.fs.mv))  # type: ignore[attr-defined]
    elif when == "put":
        monkeypatch.setattr(store, "_publish_record", collecting(store._publish_record))  # type: ignore[attr-defined]
    else:
        monkeypatch.setattr(store, "_publish_index", collecting(store._publish_index))  # type: ignore[attr-defined]
    items = [(key_of(1), b"an answer kept while gc ran")]
    if when == "packed":
        items.append((key_of(2), b"and another item"))
        store.keep_many(items, "plain")
    else:
        store.keep(*items[0], "plain")
    monkeypatch.undo()
    assert ran == [when]
    fresh = _reopen(store)
    assert {key: bytes(fresh.recall(key)[1]) for key, _ in items} == dict(items)
    assert fresh.verify().ok


def test_a_keep_of_a_blob_its_gc_is_removing_waits_and_writes_it_afresh(
    tmp_path: Path,
) -> None:
    """A keep in one thread whose blob a gc of the same store object, in another thread, is
    removing at that instant waits until it is removed, then writes it afresh: the answer
    kept has its blob."""
    store = LocalStore(tmp_path / "store")
    content = b"bytes put long ago, referred to by nothing"
    os.utime(store.blob_path(store.put(content)), (time.time() - 3600,) * 2)
    removing, kept = threading.Event(), threading.Event()
    real = store._sweep

    def sweep(entries: list[Entry], referred: Any) -> list[Entry]:
        if entries:
            removing.set()
            kept.wait(0.5)  # a keep that does not wait for this removal is done by now
        return real(entries, referred)

    store._sweep = sweep  # type: ignore[method-assign]
    collector = threading.Thread(target=store.gc, kwargs={"grace": 0})
    collector.start()
    assert removing.wait(10)
    store.keep(key_of(1), content, "plain")
    kept.set()
    collector.join(10)
    fresh = LocalStore(tmp_path / "store")
    assert fresh.have([key_of(1)]) == {key_of(1)}
    assert bytes(fresh.recall(key_of(1))[1]) == content


def _hot_and_cold(reader: LocalStore) -> tuple[Answer, Answer]:
    """Two answers of 1,000 bytes kept in ``reader``: one an hour ago (hot, the one its
    reader goes on to use), one a minute ago (cold)."""
    hot = reader.keep(key_of(1), b"h" * 1000, "plain")
    cold = reader.keep(key_of(2), b"c" * 1000, "plain")
    for path, age in ((reader.answer_path(key_of(1)), 3600), (reader.answer_path(key_of(2)), 60)):
        os.utime(path, (time.time() - age,) * 2)
    return hot, cold


def test_a_long_running_reader_writes_down_what_it_uses_for_a_gc_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that recalls a few answers over and over, and never closes its store (a
    notebook, a server), writes down when it used them as it goes, not only after 1,024
    recalls: a gc in another process then drops what it does not use, never the answer
    it uses all along."""
    monkeypatch.setattr("somatize.store._packed.FLUSH_EVERY", 0.0, raising=False)
    root = tmp_path / "store"
    reader = LocalStore(root)
    hot, cold = _hot_and_cold(reader)
    for _ in range(3):
        assert bytes(reader.recall(key_of(1))[1]) == b"h" * 1000
    done = LocalStore(root).gc(max_bytes=1500, grace=60)  # room for one answer
    assert done.answers == 1
    fresh = LocalStore(root)
    assert fresh.have([hot.key, cold.key]) == {hot.key}
    assert bytes(fresh.recall(hot.key)[1]) == b"h" * 1000


def test_a_reader_whose_clock_is_set_back_still_writes_down_its_uses_each_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process whose clock ran an hour ahead until NTP set it back, and that recalls a
    few answers over and over, still writes down when it used them a minute on: the
    minute is measured on a clock no one sets. Else it waited for its clock to pass the
    time it noted its first use at, an hour, and a gc elsewhere took the answer it used
    all along for the least recently used."""
    root = tmp_path / "store"
    reader = LocalStore(root)
    hot, cold = _hot_and_cold(reader)
    real_time, real_monotonic = time.time, time.monotonic
    clock = {"wall": 3600.0, "since_boot": 0.0}  # the wall clock an hour ahead
    monkeypatch.setattr(time, "time", lambda: real_time() + clock["wall"])
    monkeypatch.setattr(time, "monotonic", lambda: real_monotonic() + clock["since_boot"])
    assert bytes(reader.recall(hot.key)[1]) == b"h" * 1000  # its first use noted
    clock.update(wall=0.0, since_boot=120.0)  # set back to the right time; two minutes on
    assert bytes(reader.recall(hot.key)[1]) == b"h" * 1000
    monkeypatch.undo()
    done = LocalStore(root).gc(max_bytes=1500, grace=60)  # room for one answer
    assert done.answers == 1
    fresh = LocalStore(root)
    assert fresh.have([hot.key, cold.key]) == {hot.key}


@pytest.mark.parametrize("keeps", ["keep", "keep_many"])
def test_a_gc_with_no_grace_spares_what_a_keep_of_its_object_published_meanwhile(
    tmp_path: Path, keeps: str
) -> None:
    """A gc with no grace, running in one thread while another thread keeps through the
    same store object, never removes a blob that keep has referred to by then: one the
    keep put again and published the record or index of after the gc read the records
    (and before it looked at the blobs again) stays, and the answer is recalled."""
    store = LocalStore(tmp_path / "store")
    items = [(key_of(1), b"first item "), (key_of(2), b"second item")]
    blob = store.put(b"".join(value for _, value in items) if keeps == "keep_many" else b"x" * 99)
    os.utime(store.blob_path(blob), (time.time() - 3600,) * 2)  # unreferenced, and old
    listed = store._entries
    looks: list[str] = []

    def entries(section: str) -> list[Entry]:
        found = listed(section)
        if section == "names":
            looks.append(section)
            if len(looks) == 2:  # the gc looked at the records again: another thread keeps
                if keeps == "keep":
                    store.keep(key_of(1), b"x" * 99, "plain")
                else:
                    store.keep_many(items, "plain")
        return found

    store._entries = entries  # type: ignore[method-assign]
    done = store.gc(grace=0)
    assert looks == ["names", "names"] and done.blobs == 0
    fresh = LocalStore(tmp_path / "store")
    assert os.path.exists(fresh.blob_path(blob))
    assert fresh.have([key_of(1)]) == {key_of(1)}
    assert fresh.verify().ok


def test_verify_never_quarantines_a_blob_written_afresh_after_it_was_hashed(
    tmp_path: Path,
) -> None:
    """verify --quarantine that hashed a damaged blob, while a reader elsewhere found it
    damaged and moved it aside and a writer kept the answer again (the blob written afresh,
    whole), leaves the fresh blob and its record where they are and tells no damage."""
    root = tmp_path / "store"
    content = b"good bytes" * 20
    kept = LocalStore(root).keep(key_of(1), content, "plain")
    path = LocalStore(root).blob_path(kept.value)
    damaged = bytearray(path.read_bytes())
    damaged[0] ^= 1
    path.write_bytes(bytes(damaged))
    checker = LocalStore(root)
    rehash = checker._rehash
    ran: list[str] = []

    def rehashing(digest: str, size: int | None = None) -> str | None:
        found = rehash(digest, size)
        if not ran:  # hashed damaged: a reader moves it aside, a writer keeps it again
            ran.append(digest)
            with pytest.raises(Corrupt, match="moved to quarantine"):
                LocalStore(root).recall(key_of(1))
            LocalStore(root).keep(key_of(1), content, "plain")
        return found

    checker._rehash = rehashing  # type: ignore[method-assign]
    found = checker.verify(quarantine=True)
    assert ran == [kept.value]
    assert found.damaged == [] and found.quarantined == []
    fresh = LocalStore(root)
    assert fresh.have([key_of(1)]) == {key_of(1)}
    assert bytes(fresh.recall(key_of(1))[1]) == content


def test_a_rotated_key_leaves_old_names_in_place_and_old_answers_to_recompute(
    tmp_path: Path,
) -> None:
    """After the signing key is rotated, upkeep with the new key refuses to run until
    something is signed with it; then verify --quarantine moves the records the old key
    signed aside (misses, recomputed) and leaves its names in place, reported, the blob each
    names kept by gc; a name bound again with the new key resolves and is no longer reported."""
    root = tmp_path / "store"
    old = LocalStore(root, signing_key="old secret")
    old.keep(key_of(1), b"an old answer", "plain")
    digest = old.put(b"a dataset")
    old.bind("data/v1", digest)
    new = LocalStore(root, signing_key="new secret")
    with pytest.raises(KeyMismatch):
        new.verify(quarantine=True)
    new.keep(key_of(2), b"a new answer", "plain")
    found = new.verify(quarantine=True)
    assert sorted(d.section for d in found.damaged) == ["answers", "names"]
    assert found.quarantined == [f"answers/{key_of(1)[7:9]}/{key_of(1)[7:]}"]
    assert new.answer(key_of(1)) is None
    with pytest.raises(Unsigned):
        new.resolve("data/v1")
    assert new.gc(max_bytes=0, grace=0).unread_names == []  # it says which blob it names
    assert bytes(new.get(digest)) == b"a dataset"
    new.bind("data/v1", LocalStore(root, signing_key="old secret").resolve("data/v1"))
    assert new.resolve("data/v1") == digest and new.verify().damaged == []


def test_a_lookup_of_keys_kept_nowhere_looks_at_answers_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup of keys a store of packs alone does not hold (every lookup of a first epoch
    of rows) looks at whether ``answers/`` holds any record once, not once per step."""
    store = LocalStore(tmp_path / "store")
    store.keep_many([(key_of(i), b"row %d" % i) for i in range(3)], "plain")
    looks = []
    shards = LocalStore._record_shards

    def counted(self: LocalStore) -> frozenset[str] | None:
        looks.append(self)
        return shards(self)

    monkeypatch.setattr(LocalStore, "_record_shards", counted)
    assert store.have([key_of(i) for i in range(10, 20)]) == set()
    assert len(looks) == 1
    assert store.have([key_of(1), key_of(10)]) == {key_of(1)}


def test_a_lookup_of_packed_keys_reads_no_record_per_key_beside_one_loose_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store of packed rows holding one loose answer beside them, opened afresh (another
    process's recall), opens no record file for a key whose shard folder ``answers/`` does
    not hold: only those of the loose answer's shard are read."""
    root = tmp_path / "store"

    def spread(number: int) -> str:  # keys in every shard folder, as row keys fall
        return "blake3:" + blake3.blake3(b"%d" % number).hexdigest()

    keys = [spread(i) for i in range(512)]
    LocalStore(root).keep_many([(key, key.encode()) for key in keys], "plain")
    loose = spread(10_000)
    LocalStore(root).keep(loose, b"loose", "plain")
    opened = []
    read = LocalStore._read_record

    def counted(self: LocalStore, key: str) -> Answer | None:  # a record file opened
        opened.append(key)
        return read(self, key)

    monkeypatch.setattr(LocalStore, "_read_record", counted)
    assert LocalStore(root).have([*keys, loose, spread(20_000)]) == {*keys, loose}
    shard = loose[7:9]
    assert opened and all(key[7:9] == shard for key in opened)
    assert len(opened) < 20


def test_a_lookup_tells_answers_lost_elsewhere_and_kept_anew_as_a_fresh_store_does(
    tmp_path: Path,
) -> None:
    """A store that looked keys up before finds, at each lookup, what a store opened afresh
    finds: a pack whose blob went, a record whose blob and file a collection elsewhere took,
    both kept anew since, and keys asked twice."""
    root = tmp_path / "store"
    LocalStore(root).keep(key_of(1), b"one", "plain")
    LocalStore(root).keep_many([(key_of(2), b"two"), (key_of(3), b"three")], "plain")
    looking = LocalStore(root)
    asked = [key_of(1), key_of(2), key_of(1), key_of(3), key_of(4), key_of(3)]

    def agrees(expected: set[str]) -> None:
        assert LocalStore(root).have(asked) == expected
        assert looking.have(asked) == expected

    agrees({key_of(1), key_of(2), key_of(3)})
    blob = LocalStore(root).answer(key_of(1)).value[7:]  # type: ignore[union-attr]
    (root / "blobs" / blob[:2] / blob).unlink()
    (root / "answers" / key_of(1)[7:9] / key_of(1)[7:]).unlink()
    agrees({key_of(2), key_of(3)})
    pack = LocalStore(root).answer(key_of(2)).value[7:]  # type: ignore[union-attr]
    (root / "blobs" / pack[:2] / pack).unlink()
    agrees(set())
    LocalStore(root).keep(key_of(1), b"one again", "plain")
    LocalStore(root).keep(key_of(3), b"three again", "plain")
    agrees({key_of(1), key_of(3)})
    LocalStore(root).keep_many([(key_of(2), b"two again")], "plain")
    agrees({key_of(1), key_of(2), key_of(3)})


def test_a_record_kept_elsewhere_during_a_lookup_is_found_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record another process keeps while a lookup of a store of packs alone runs (after
    it looked at ``answers/``) is found by the next lookup, and no key is found twice over
    or wrongly before it is kept."""
    root = tmp_path / "store"
    looking = LocalStore(root)
    looking.keep_many([(key_of(1), b"packed")], "plain")
    assert looking.have([key_of(1), key_of(2)]) == {key_of(1)}
    packed_after_a_look = LocalStore._packed_after_a_look
    kept: list[str] = []

    def kept_meanwhile(self: LocalStore, keys: list[str]) -> Any:
        if not kept:
            kept.append(LocalStore(root).keep(key_of(2), b"kept meanwhile", "plain").key)
        return packed_after_a_look(self, keys)

    monkeypatch.setattr(LocalStore, "_packed_after_a_look", kept_meanwhile)
    assert looking.have([key_of(1), key_of(2), key_of(3)]) <= {key_of(1), key_of(2)}
    assert kept == [key_of(2)]
    assert looking.have([key_of(1), key_of(2), key_of(3)]) == {key_of(1), key_of(2)}


def test_a_folder_opened_as_a_file_url_lists_the_strays_a_local_store_lists(
    tmp_path: Path,
) -> None:
    """Files at a depth the store writes none at (``answers/ab/cd/x``, a folder no shard
    names, a store's copy inside ``answers/``): a local store's verify lists each as stray,
    and the same folder opened as ``file://`` listed none of those deeper than a shard's
    file. Both list the same, and gc leaves the stray records to both."""
    local = LocalStore(tmp_path / "store")
    key = "blake3:" + "ab" * 32
    local.keep(key, b"kept whole", "plain")
    strays = [
        "answers/.DS_Store",
        "answers/ab/cd/deep",
        "answers/zz/not-a-shard",
        "answers/old/ab/" + "cd" * 32,
        "packs/old/" + "ef" * 32,
    ]
    for stray in strays:
        _plant(local, stray, b"junk")
    on_file = Store.on_bucket(f"file://{local.root}", retries=0)
    for store in (local, on_file):
        found = store.verify()
        assert found.ok and sorted(found.stray) == sorted(strays), store
    on_file.gc(10**9, grace=0)
    assert sorted(LocalStore(local.root).verify().stray) == sorted(strays)


def test_contents_and_listing_refuse_a_section_they_cannot_tell(store: Store) -> None:
    """contents() reads the records of answers, the indexes of packs and the bindings of
    names: asked for blobs it says to list them, rather than telling each blob as a damaged
    pack index, and a misspelt section is refused rather than told as empty; listing()
    refuses a section the store does not keep."""
    store.put(b"a blob")
    for section in ("blobs", "tmp", "Answers"):
        with pytest.raises(ValueError, match=r"listing\(store, "):
            contents(store, section)
    with pytest.raises(ValueError, match="`blobs`"):
        listing(store, "Blobs")
    assert [entry.size for entry in listing(store, "blobs")] == [6]


def test_gc_goes_past_a_record_it_may_not_remove_oldest_first_to_meet_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record gc may not remove (in another user's folder) stopped it with the newer of
    the answers it dropped removed and the oldest left. It now goes on past it, oldest
    first, drops the newest in its stead so the budget is met, and says which it left."""
    root = tmp_path / "store"
    store = LocalStore(root)
    old, stuck, new = key_of(1), key_of(2), key_of(3)
    for age, key in ((300, old), (200, stuck), (100, new)):
        store.keep(key, bytes([age % 251]) * 1000, "plain")
        record = root / "answers" / key[7:9] / key[7:]
        os.utime(record, (time.time() - age, time.time() - age))
    store.close()
    held = root / "answers" / stuck[7:9] / stuck[7:]
    rename = os.rename

    def refusing(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(source) == str(held):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(source))
        rename(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "rename", refusing)
    done = LocalStore(root).gc(1500, grace=0)
    assert list(done.unremoved) == [f"answers/{stuck[7:9]}/{stuck[7:]}"]
    assert done.answers == 2 and done.kept <= 1500
    assert LocalStore(root).have([old, stuck, new]) == {stuck}
    store = LocalStore(root)
    store.keep(old, b"kept again", "plain")
    store.close()
    assert main(["store", "gc", "--store", str(root), "--max-bytes", "0", "--grace", "0"]) == 2
    assert "could not remove 1 files" in capsys.readouterr().err
    assert LocalStore(root).have([old, stuck]) == {stuck}


@pytest.mark.parametrize("then", ["gc", "compact"])
def test_a_gc_stopped_part_way_hands_the_next_no_file_it_went_past(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """A gc that went past a record it may not remove, then stopped (Ctrl-C), left that
    record noted on the store object: the next gc of the object, which removed it, still
    named it as left (the command line exited 2), and a compaction refused for it. Each
    names only what it left itself."""
    root = tmp_path / "store"
    store = LocalStore(root)
    stuck, later = key_of(1), key_of(2)
    for age, key in ((300, stuck), (200, later)):
        store.keep(key, bytes([age % 251]) * 1000, "plain")
        os.utime(store.answer_path(key), (time.time() - age,) * 2)
    held, stopped = (str(store.answer_path(key)) for key in (stuck, later))
    rename = os.rename

    def refusing(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(source) == held:
            raise PermissionError(errno.EACCES, "Permission denied", held)
        if os.fspath(source) == stopped:
            raise KeyboardInterrupt
        rename(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "rename", refusing)
    with pytest.raises(KeyboardInterrupt):
        store.gc(0, grace=0)
    monkeypatch.undo()
    if then == "compact":
        assert store.compact(grace=0).removed == 0
    done = store.gc(0, grace=0)
    assert done.answers == 2
    assert done.unremoved == {}
