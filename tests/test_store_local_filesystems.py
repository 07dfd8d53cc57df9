"""A local store on a filesystem with odd semantics: one that maps no files (FUSE with
``direct_io``, some network mounts: ``mmap`` raises ENODEV), or syncs no directories
(``fsync`` of a folder raises EINVAL). Such a filesystem is simulated by making the ``os``
or ``mmap`` call fail as it does there, so that the tests need no special mount.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from somatize import Graph, Store
from somatize.store import BadAddress, Corrupt, LocalStore, StoreError
from tests.nodes import Largest, Scale

LARGE = bytes(range(256)) * 1000
"""A blob large enough (over 64 KiB) that a store would map it."""
KEY = "blake3:" + "ab" * 32
OTHER = "blake3:" + "cd" * 32


def _maps_nothing(*_: Any, **__: Any) -> mmap.mmap:
    raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))


def test_a_filesystem_that_maps_no_files_is_read_and_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = LocalStore(tmp_path / "s").put(LARGE)
    monkeypatch.setattr(mmap, "mmap", _maps_nothing)
    store = LocalStore(tmp_path / "s")
    assert bytes(store.local_blob(digest)) == LARGE
    assert bytes(store.local_blob(digest)) == LARGE  # again, from what it holds
    found = store.verify()
    assert (found.blobs, found.damaged) == (1, [])


def test_a_blob_damaged_on_a_filesystem_that_maps_no_files_is_found_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "s")
    digest = store.put(LARGE)
    store.blob_path(digest).write_bytes(LARGE[:-1] + b"!")
    monkeypatch.setattr(mmap, "mmap", _maps_nothing)
    found = LocalStore(tmp_path / "s").verify()
    assert [(damage.section, damage.name) for damage in found.damaged] == [
        ("blobs", f"{digest[7:9]}/{digest[7:]}")
    ]
    with pytest.raises(Corrupt):
        LocalStore(tmp_path / "s").local_blob(digest)


def _fsync_fails_on(monkeypatch: pytest.MonkeyPatch, kind: Callable[[int], bool]) -> None:
    """Makes ``fsync`` of what ``kind`` says of its mode (a folder, a file) fail with EINVAL,
    as it does on a filesystem that syncs none of them."""
    real = os.fsync

    def fsync(fd: int) -> None:
        if kind(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_a_durable_store_on_a_filesystem_that_syncs_no_folders_keeps_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fsync_fails_on(monkeypatch, stat.S_ISDIR)
    store = LocalStore(tmp_path / "s", durable=True)
    store.keep(KEY, LARGE, "plain")
    store.keep(OTHER, LARGE, "plain")  # its blob found there, synced with its folders
    store.bind("data/v1", store.put(b"named"))
    fresh = LocalStore(tmp_path / "s")
    assert fresh.have([KEY, OTHER]) == {KEY, OTHER}
    assert bytes(fresh.recall(OTHER)[1]) == LARGE
    assert bytes(fresh.get(fresh.resolve("data/v1"))) == b"named"


def _streamed(store: LocalStore) -> None:
    store.put(iter([LARGE] * 40))  # past what is held, so written to tmp/ as it comes


def _joined(store: LocalStore) -> None:
    with store.open_joined("plain") as joined:
        joined.add([KEY, OTHER], LARGE + LARGE, [len(LARGE), len(LARGE)])


def _found_there(store: LocalStore) -> None:
    LocalStore(store.root).put(LARGE)  # written by a store that does not sync
    store.keep(KEY, LARGE, "plain")


@pytest.mark.parametrize(
    "keeps",
    [lambda s: s.keep(KEY, LARGE, "plain"), _streamed, _joined, _found_there],
    ids=["keep", "streamed", "joined", "found-there"],
)
def test_a_durable_store_on_a_filesystem_that_syncs_no_files_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keeps: Any
) -> None:
    store = LocalStore(tmp_path / "s", durable=True)
    _fsync_fails_on(monkeypatch, stat.S_ISREG)
    with pytest.raises(StoreError, match=r"cannot sync files.*without durable=True") as said:
        keeps(store)
    assert "filesystem that syncs files" in str(said.value)
    monkeypatch.undo()
    fresh = LocalStore(tmp_path / "s")
    assert fresh.have([KEY, OTHER]) == set()
    assert list((tmp_path / "s" / "tmp").iterdir()) == []


def _on_another_disk(monkeypatch: pytest.MonkeyPatch, disk: Path) -> None:
    """Makes the folder ``disk`` (and all under it) seem on another filesystem: its
    ``st_dev`` is another, and a rename out of it or into it fails with EXDEV."""
    real_stat, real_replace = os.stat, os.replace

    def on_disk(path: Any) -> bool:
        return Path(os.path.realpath(path)).is_relative_to(disk)

    class _Elsewhere:
        def __init__(self, found: os.stat_result) -> None:
            self._found = found
            self.st_dev = found.st_dev + 1

        def __getattr__(self, name: str) -> Any:
            return getattr(self._found, name)

    def stat_of(path: Any, *args: Any, **kwargs: Any) -> Any:
        found = real_stat(path, *args, **kwargs)
        return _Elsewhere(found) if isinstance(path, (str, Path)) and on_disk(path) else found

    def replace(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        if on_disk(source) != on_disk(os.path.dirname(target)):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), os.fspath(source))
        real_replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat_of)
    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("section", ["tmp", "blobs", "answers", "packs"])
def test_a_store_with_a_folder_on_another_filesystem_refuses_keeping_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, section: str
) -> None:
    """A folder of the store a symlink to another disk: no keep could succeed, so the store
    says it is not writable, and a forward is refused before its node runs, naming that
    folder. What the store holds is still read."""
    root = tmp_path / "store"
    largest = Largest().named("largest").frozen().cached()
    g = Graph.somatize(Scale().named("scale").frozen() >> largest)
    assert g.forward([1.0, 2.0], store=Store(root)) == 4.0
    disk = tmp_path / "disk"
    (root / section).rename(disk)
    (root / section).symlink_to(disk)
    _on_another_disk(monkeypatch, disk)
    store = Store(root)
    assert store.writable() is False
    with pytest.raises(StoreError, match=rf"its {section}/ is on another filesystem"):
        g.forward([1.0, 3.0], store=store)
    assert largest.calls == 1
    # A write through that folder says so too (a pack's index goes to packs/).
    with pytest.raises(StoreError, match=r"must all be on one filesystem"):
        if section == "packs":
            store.keep_many([(KEY, b"an answer"), (OTHER, b"another")], "plain")
        else:
            store.keep(KEY, b"an answer", "plain")
    assert store.have([KEY, OTHER]) == set()
    assert g.forward([1.0, 2.0], store=store) == 4.0
    assert largest.calls == 1


def _path_of_length(base: Path, length: int) -> Path:
    """A path under ``base`` exactly ``length`` bytes long, in folders of at most 200."""
    path = str(base)
    while len(path) < length - 201:
        path = os.path.join(path, "d" * 199)
    return Path(path, "e" * (length - len(path) - 1))


def _longest_root() -> int:
    """The longest store directory this system leaves room under: PATH_MAX, less its NUL,
    less the longest path a store makes below its directory, a record set aside (counted
    here, as `quarantine/answers/ab_<64 hex>.<19 digits of time_ns>`)."""
    below = len("/quarantine/answers/ab_") + 64 + len(".") + 19
    return os.pathconf("/", "PC_PATH_MAX") - 1 - below


def test_a_store_at_the_longest_path_there_is_room_under_works_fully(tmp_path: Path) -> None:
    root = _path_of_length(tmp_path, _longest_root())
    store = LocalStore(root)
    store.keep(KEY, LARGE, "plain")
    store.keep_many([(OTHER, b"packed"), ("blake3:" + "ef" * 32, b"also")], "plain")
    store.bind("v1", store.put(b"named"))
    store.answer_path(KEY).write_bytes(b"damaged")
    found = LocalStore(root).verify(quarantine=True)
    assert [(damage.section, damage.name) for damage in found.damaged] == [
        ("answers", f"{KEY[7:9]}/{KEY[7:]}")
    ]
    assert len(list((root / "quarantine" / "answers").iterdir())) == 1
    fresh = LocalStore(root)
    assert fresh.have([KEY, OTHER]) == {OTHER}
    assert bytes(fresh.recall(OTHER)[1]) == b"packed"
    assert fresh.gc(grace=0).blobs == 1  # KEY's blob, its record set aside


def _longest_read_root() -> int:
    """The longest store directory a store opened only to read leaves room under: PATH_MAX,
    less its NUL, less the longest path a read opens below it (a record,
    `answers/<2 hex>/<64 hex>`)."""
    below = len("/answers/ab/") + 64
    return os.pathconf("/", "PC_PATH_MAX") - 1 - below


@pytest.mark.parametrize("read_only", [False, True])
def test_a_store_whose_path_leaves_no_room_for_its_files_is_refused_at_open(
    tmp_path: Path, read_only: bool
) -> None:
    longest = _longest_read_root() if read_only else _longest_root()
    root = _path_of_length(tmp_path, longest + 1)
    root.mkdir(parents=True)
    limit = os.pathconf("/", "PC_PATH_MAX")
    with pytest.raises(BadAddress, match=r"too long for the files the store makes") as said:
        LocalStore(root, read_only=read_only)
    assert f"at most {limit - 1} bytes" in str(said.value)
    assert f"at most {longest} bytes long; this one is {longest + 1}" in str(said.value)
    assert "shorter path" in str(said.value)


def test_a_store_only_read_at_a_path_with_room_for_its_records_reads_them(tmp_path: Path) -> None:
    """A store opened read-only writes nothing, not even a record set aside: where its
    records fit under the system's limit, it reads them, though a writable store's files
    would not all fit there. It was refused at open, as a writable one is."""
    root = _path_of_length(tmp_path / "deep", _longest_read_root())
    root.mkdir(parents=True)
    (tmp_path / "short").symlink_to(root)
    kept = LocalStore(tmp_path / "short")  # kept through a shorter path to the same folder
    kept.keep(KEY, LARGE, "plain")
    kept.keep_many([(OTHER, b"packed")], "plain")
    with pytest.raises(BadAddress, match=r"too long for the files the store makes"):
        LocalStore(root)
    read = LocalStore(root, read_only=True)
    assert read.have([KEY, OTHER]) == {KEY, OTHER}
    assert bytes(read.recall(KEY)[1]) == LARGE
    assert bytes(read.recall(OTHER)[1]) == b"packed"


def _full_syncs_recorded(monkeypatch: pytest.MonkeyPatch, refused: bool) -> list[int]:
    """Gives ``fcntl`` macOS's ``F_FULLFSYNC``, which flushes the drive's own cache where
    ``fsync`` does not; the modes of what it is asked to sync. ``refused``: it fails with
    ENOTSUP, as on a network mount, and syncs nothing."""
    import fcntl

    full_sync = 51  # its number on macOS
    synced: list[int] = []

    def full(fd: int, cmd: int, *args: Any) -> int:
        assert cmd == full_sync
        if refused:
            raise OSError(errno.ENOTSUP, os.strerror(errno.ENOTSUP))
        synced.append(os.fstat(fd).st_mode)
        return 0

    monkeypatch.setattr(fcntl, "F_FULLFSYNC", full_sync, raising=False)
    monkeypatch.setattr(fcntl, "fcntl", full)
    return synced


def test_a_durable_store_on_macos_flushes_the_drive_cache_of_files_and_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = _full_syncs_recorded(monkeypatch, refused=False)
    store = LocalStore(tmp_path / "s", durable=True)
    store.keep(KEY, LARGE, "plain")
    _joined(store)
    assert any(stat.S_ISREG(mode) for mode in synced)
    assert any(stat.S_ISDIR(mode) for mode in synced)
    assert bytes(LocalStore(tmp_path / "s").recall(OTHER)[1]) == LARGE


def test_a_durable_store_where_the_full_sync_is_refused_falls_back_to_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _full_syncs_recorded(monkeypatch, refused=True)
    fsynced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsynced.append(fd), real(fd))[1])
    store = LocalStore(tmp_path / "s", durable=True)
    store.keep(KEY, LARGE, "plain")
    assert fsynced
    assert bytes(LocalStore(tmp_path / "s").recall(KEY)[1]) == LARGE


def test_a_durable_store_on_windows_which_opens_no_folder_keeps_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def open_as_windows(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.path.isdir(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    store = LocalStore(tmp_path / "s", durable=True)
    monkeypatch.setattr("sys.platform", "win32")
    monkeypatch.setattr(os, "open", open_as_windows)
    store.keep(KEY, LARGE, "plain")
    _joined(store)
    store.bind("data/v1", store.put(b"named"))
    monkeypatch.undo()
    fresh = LocalStore(tmp_path / "s")
    assert fresh.have([KEY, OTHER]) == {KEY, OTHER}
    assert bytes(fresh.get(fresh.resolve("data/v1"))) == b"named"
